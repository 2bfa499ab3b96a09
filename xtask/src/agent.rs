//! The `ringside` agent as a child process inside a testbed namespace, shared by `cargo xtask demo`
//! and `cargo xtask eval detection`: start it with its own config file, state directory and pin
//! directory, wait (bounded) for `/readyz`, make tiny HTTP GETs from inside its namespace, and tear
//! it all down on drop (SIGINT, so it detaches and removes its pins; SIGKILL if it lingers).
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use testbed::{Netns, NetnsHandle};

/// What to start.
pub struct AgentSpec<'a> {
    /// The `ringside` binary.
    pub bin: &'a Path,
    /// Interfaces (in `ns`) to attach to.
    pub ifaces: Vec<String>,
    /// `--listen` address, inside `ns`.
    pub listen: String,
    /// The config file's contents.
    pub config_toml: String,
    /// Names the temporary directories (`ringside-<tag>-<pid>`), unique per live agent.
    pub tag: String,
    /// Where stdout and stderr go (`None`: discarded stdout, inherited stderr).
    pub log: Option<PathBuf>,
}

/// A running agent; everything it created is removed on drop.
pub struct Agent {
    child: Option<Child>,
    ns: NetnsHandle,
    listen: String,
    work: PathBuf,
    pin_dir: PathBuf,
}

impl Agent {
    /// Starts the agent in `ns` (no waiting: see [`Agent::wait_ready`]).
    pub fn start(ns: &Netns, spec: &AgentSpec) -> Result<Agent> {
        // bpffs refuses names with dots (e.g. "loss-0.5"): keep [A-Za-z0-9_-].
        let tag: String = spec.tag.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        let id = format!("{tag}-{}", std::process::id());
        let work = std::env::temp_dir().join(format!("ringside-{id}"));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(work.join("state")).with_context(|| format!("cannot create {}", work.display()))?;
        let config = work.join("ringside.toml");
        std::fs::write(&config, &spec.config_toml)?;
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/ringside-{id}"));
        let mut cmd = ns.command(spec.bin);
        cmd.arg("agent").arg("--config").arg(&config).args(["--listen", &spec.listen]);
        cmd.arg("--pin-dir").arg(&pin_dir).arg("--state-dir").arg(work.join("state"));
        for i in &spec.ifaces {
            cmd.args(["--iface", i]);
        }
        cmd.stdin(Stdio::null());
        match &spec.log {
            Some(path) => {
                let f = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
                cmd.stdout(f.try_clone()?).stderr(f);
            }
            None => {
                cmd.stdout(Stdio::null());
            }
        }
        let child = cmd.spawn().context("cannot start the agent")?;
        Ok(Agent { child: Some(child), ns: ns.handle(), listen: spec.listen.clone(), work, pin_dir })
    }

    /// Waits up to `limit` for `/readyz`; fails early if the agent exits.
    pub fn wait_ready(&mut self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.get("/readyz").is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!("the agent exited ({status}) before it became ready; see its log");
                }
            }
            thread::sleep(Duration::from_millis(200));
        }
        bail!("the agent did not become ready within {limit:?} (see its log)")
    }

    /// `GET path` against the agent, from inside its namespace, with the operator token the agent
    /// wrote to its state directory (once it exists); Err on non-200.
    pub fn get(&self, path: &str) -> Result<String> {
        let addr = self.listen.clone();
        let token = self.operator_token();
        self.ns.try_run(|| http_get(&addr, path, token.as_deref()))?
    }

    /// Registers a job through `POST /v1/jobs` (from inside the agent's namespace, with the
    /// operator token).
    pub fn register(&self, job: &ringside_client::JobRegistration) -> Result<ringside_client::JobCreated> {
        let base = format!("http://{}", self.listen);
        let token = self.operator_token().context("the agent has not written its operator token yet")?;
        let created = self.ns.try_run(|| ringside_client::OperatorClient::new(&base, &token).and_then(|c| c.register(job)))?;
        created.with_context(|| format!("registering job {}", job.name))
    }

    /// The agent's state directory (holds `operator.token`; the CLI's `--state-dir`).
    pub fn state_dir(&self) -> PathBuf {
        self.work.join("state")
    }

    /// The operator token the agent generated, if it has started far enough to write it.
    pub fn operator_token(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.state_dir().join("operator.token")).ok()?;
        text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned)
    }

    /// The agent's process id (it is our direct child: `Netns::command` enters the namespace
    /// before exec), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the agent process is still running.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
                thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // The agent removes its pins on a clean exit; after a SIGKILL they are ours to remove.
        if let Ok(entries) = std::fs::read_dir(&self.pin_dir) {
            for e in entries.flatten() {
                // Map and link pins are files; the agent's markers are directories.
                let _ = std::fs::remove_file(e.path()).or_else(|_| std::fs::remove_dir(e.path()));
            }
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// A minimal HTTP/1.0 GET (run inside the agent's namespace), with `Authorization: Bearer` when a
/// token is given; Err on non-200. Bounded: 2 s to connect, 10 s per read.
pub fn http_get(addr: &str, path: &str, token: Option<&str>) -> Result<String> {
    let sock: std::net::SocketAddr = addr.parse().with_context(|| format!("bad agent address {addr}"))?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let (head, rest) = body.split_once("\r\n\r\n").unwrap_or((&body, ""));
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or("no response"));
    }
    Ok(rest.to_string())
}
