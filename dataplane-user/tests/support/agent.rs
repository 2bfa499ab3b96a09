//! The real agent as the T2 tests start it, and its `/metrics` read back from inside a namespace.
//! Shared so every test starts, stops and cleans up after the agent the same way (state directory
//! of its own, SIGTERM then SIGKILL, pins and files removed even when an assertion fails).
use std::{
    ffi::OsString,
    path::PathBuf,
    process::{Child, Command},
    time::Duration,
};

use testbed::Netns;

/// The agent process of one test and the files it owns; SIGTERM + bounded wait (then SIGKILL) on
/// drop, then its pins, its files and its state directory are removed.
pub struct AgentProcess {
    child: Option<Child>,
    pin_dir: PathBuf,
    files: Vec<PathBuf>,
    state_dir: PathBuf,
}

impl AgentProcess {
    /// Starts `cmd` (a `ringside agent ... --pin-dir PIN_DIR` command) with `--state-dir` set to a
    /// directory of this test's own, named after `pin_dir` (removed on drop): the default,
    /// /var/lib/ringside, would keep the jobs a test registers for the next agent started on the
    /// machine. `files` (config, token file) are removed on drop.
    pub fn start(mut cmd: Command, pin_dir: PathBuf, files: Vec<PathBuf>) -> AgentProcess {
        let state_dir = std::env::temp_dir().join(format!("ringside-t2-state-{}", pin_dir.file_name().unwrap().to_string_lossy()));
        let _ = std::fs::remove_dir_all(&state_dir);
        let child = cmd.arg("--state-dir").arg(&state_dir).spawn().expect("spawning the ringside binary");
        AgentProcess { child: Some(child), pin_dir, files, state_dir }
    }

    /// SIGTERM, then wait up to 10 s (then SIGKILL); returns whether it exited successfully.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else { return false };
        super::stop_child(&mut child, Duration::from_secs(10))
    }

    /// Hands the process to the caller (to wait for an agent expected to exit by itself); the
    /// files, pins and state directory are still removed on drop.
    pub fn take_child(&mut self) -> Option<Child> {
        self.child.take()
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
        // Last resort so a failed test leaves no pins (the netns, and with it the filters, goes
        // away with the testbed).
        for name in dataplane_user::loader::PINNED_MAPS {
            let _ = std::fs::remove_file(self.pin_dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// The files of one agent: its pin directory, a config file ending in `[api]` with the operator
/// token file, and that token file. `name` must be unique per test and process (it carries the
/// pid), so tests running at the same time never share a file or a pin.
pub struct AgentFiles {
    pub pin_dir: PathBuf,
    pub config: PathBuf,
    pub tokens: PathBuf,
}

impl AgentFiles {
    /// Writes `token_file` (the whole file: tokens, comments) with mode 0600 and the config
    /// `config_body` followed by the `[api]` table naming that file.
    pub fn write(name: &str, token_file: &str, config_body: &str) -> AgentFiles {
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/ringside-{name}"));
        let config = std::env::temp_dir().join(format!("ringside-{name}.toml"));
        let tokens = std::env::temp_dir().join(format!("ringside-{name}.tokens"));
        std::fs::write(&tokens, token_file).unwrap();
        std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        std::fs::write(&config, format!("{config_body}\n[api]\noperator_tokens_file = \"{}\"\n", tokens.display())).unwrap();
        AgentFiles { pin_dir, config, tokens }
    }

    /// `agent --iface eth0 --listen 127.0.0.1:PORT --config CONFIG --pin-dir PIN_DIR`: the
    /// arguments after the `ringside` binary.
    pub fn agent_args(&self, port: u16) -> Vec<OsString> {
        let mut args: Vec<OsString> = ["agent", "--iface", "eth0", "--listen", &format!("127.0.0.1:{port}"), "--config"].map(OsString::from).into();
        args.extend([self.config.clone().into(), "--pin-dir".into(), self.pin_dir.clone().into()]);
        args
    }

    /// Starts `cmd` (made with [`AgentFiles::agent_args`]); the process owns the files from then on.
    pub fn start(self, cmd: Command) -> AgentProcess {
        AgentProcess::start(cmd, self.pin_dir, vec![self.config, self.tokens])
    }
}

/// Writes `token` into a token file only its owner may read (the agent refuses anything wider).
pub fn write_token_file(path: &std::path::Path, token: &str) {
    std::fs::write(path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

/// The agent's `/metrics` on `127.0.0.1:port` inside `ns`, or why it could not be read (the agent
/// not listening yet, curl missing).
pub fn scrape_metrics(ns: &Netns, port: u16) -> Result<String, String> {
    ns.run(|| {
        let out = Command::new("curl")
            .args(["-sS", "-f", &format!("http://127.0.0.1:{port}/metrics")])
            .output()
            .map_err(|e| format!("running curl (install it: apt-get install curl): {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!("curl /metrics failed: {}", String::from_utf8_lossy(&out.stderr).trim()))
        }
    })
}

/// Value of the series with exactly this name and label text, or `None` if absent.
pub fn metric(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' '))).map(|v| v.parse::<f64>().unwrap() as u64)
}

/// Pins the calling thread to CPU 0, so a sender's packets reach the monitor in the order they
/// were sent (the PSN state in the kernel is shared by all CPUs; see `FlowStats` docs).
pub fn pin_to_cpu0() {
    let mut set = nix::sched::CpuSet::new();
    set.set(0).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}
