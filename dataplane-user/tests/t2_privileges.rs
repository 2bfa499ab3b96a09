//! T2: `ringside agent` with least privilege. Started through `setpriv` (util-linux) as the
//! unprivileged uid 65534 holding only CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON (bounding,
//! inheritable and ambient sets: what deploy/systemd/ringside.service grants), it attaches to a
//! veth in a namespace of its own, pins its maps and serves `/metrics`; with any one of the three
//! missing it exits non-zero before touching the kernel, naming the capability and how to grant it.
//!
//! Needs root (to create the namespace and drop to the three capabilities) and an agent built
//! with its eBPF object (`cargo xtask build`). Without either it FAILS with the reason; it never
//! skips. Every wait is bounded.
mod support;

use std::{
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpStream},
    os::unix::fs::{chown, PermissionsExt},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use dataplane_user::privileges::{AGENT_CAPABILITIES, CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON};
use support::wait_for;
use testbed::{Star, StarConfig, TcpSink};

const PORT: u16 = 9464;
/// `nobody`: the agent runs as a uid that owns nothing but what the test gives it.
const UID: u32 = 65534;
/// setpriv's names of the three capabilities.
const SETPRIV_NAMES: [(&str, &str); 3] = [("CAP_BPF", "bpf"), ("CAP_NET_ADMIN", "net_admin"), ("CAP_PERFMON", "perfmon")];

fn preconditions() {
    if let Err(e) = testbed::require_root() {
        panic!("t2_privileges creates network namespaces and drops an agent to three capabilities, so it needs root: {e}");
    }
    if let Err(e) = dataplane_user::object::flowmon_object() {
        panic!("t2_privileges runs the real agent: {e}");
    }
    match Command::new("setpriv").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => panic!("t2_privileges starts the agent through `setpriv`: install util-linux (`cargo xtask setup`)"),
    }
}

/// What the test owns on the host: a copy of the binary that uid 65534 can execute (the build
/// directory may not be reachable for it), its state directory and its pin directory (created
/// for it, as the systemd unit's `ExecStartPre=+install -d` does). Removed on drop.
struct Scratch {
    dir: PathBuf,
    pin_dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("rs-{}-{tag}", std::process::id()));
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/rs-{}-{tag}", std::process::id()));
        let s = Scratch { dir, pin_dir };
        std::fs::create_dir_all(s.state_dir()).unwrap();
        std::fs::set_permissions(&s.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Copied by a child process, not by this one: a file this process held open for writing
        // would be inherited by any child the other test's thread forks meanwhile, and executing
        // the copy while such a child still held it failed with ETXTBSY ("Text file busy", 1 of
        // 20 rounds next to a build loop).
        let out = Command::new("install")
            .args(["-m", "0755", env!("CARGO_BIN_EXE_ringside")])
            .arg(s.bin())
            .output()
            .expect("running install(1) to copy the ringside binary");
        assert!(out.status.success(), "copying the ringside binary: {}", String::from_utf8_lossy(&out.stderr));
        // Count the testbed's TCP traffic (with neither ports nor prefixes only RoCEv2 matches).
        std::fs::write(s.config(), "[match]\nprefixes = [\"10.77.0.0/24\"]\n").unwrap();
        std::fs::set_permissions(s.config(), std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::create_dir(&s.pin_dir).expect("creating the pin directory on bpffs (is /sys/fs/bpf mounted?)");
        for d in [s.state_dir(), s.pin_dir.clone()] {
            chown(&d, Some(UID), Some(UID)).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        s
    }

    fn bin(&self) -> PathBuf {
        self.dir.join("ringside")
    }

    fn config(&self) -> PathBuf {
        self.dir.join("ringside.toml")
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// `setpriv ... ringside agent` in host 0's namespace, as uid 65534 with exactly `caps`
    /// (setpriv names) in the bounding, inheritable and ambient sets.
    fn agent(&self, star: &Star, caps: &[&str]) -> Command {
        let set = std::iter::once("-all".to_owned()).chain(caps.iter().map(|c| format!("+{c}"))).collect::<Vec<_>>().join(",");
        let mut cmd = star.hosts[0].ns.command("setpriv");
        cmd.args([format!("--reuid={UID}"), format!("--regid={UID}"), "--clear-groups".to_owned()])
            .args([format!("--bounding-set={set}"), format!("--inh-caps={set}"), format!("--ambient-caps={set}"), "--".to_owned()])
            .arg(self.bin())
            .args(["agent", "--iface", "eth0", "--listen", &format!("127.0.0.1:{PORT}"), "--pin-dir"])
            .arg(&self.pin_dir)
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--config")
            .arg(self.config())
            .env("RUST_LOG", "info");
        cmd
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for name in dataplane_user::PINNED_MAPS {
            let _ = std::fs::remove_file(self.pin_dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The agent process: SIGTERM and a bounded wait (then SIGKILL) on drop.
struct Agent(Option<Child>);

impl Agent {
    /// SIGTERM, then up to 10 s; whether it exited successfully.
    fn stop(&mut self) -> bool {
        let Some(mut child) = self.0.take() else { return false };
        support::stop_child(&mut child, Duration::from_secs(10))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `cmd` to completion, for at most 30 s (then kills it and fails).
fn run_bounded(mut cmd: Command) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning setpriv");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("the agent did not exit within 30 s: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// `GET path` on the agent from inside host 0's namespace: (status, body), or None if it does not
/// answer yet.
fn get(star: &Star, path: &str) -> Option<(u16, String)> {
    star.hosts[0].ns.run(|| {
        let mut s = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], PORT)), Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let status = text.split(' ').nth(1)?.parse().ok()?;
        Some((status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default()))
    })
}

fn metric(text: &str, series: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' '))).map_or(0, |v| v.parse::<f64>().unwrap() as u64)
}

/// The `Cap*:` and `Uid:` lines of a process's status.
fn proc_status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix(field)).unwrap_or_default().trim().to_owned()
}

fn star() -> Star {
    // No machine-wide tuning: this test moves a few hundred kB.
    Star::new(StarConfig { hosts: 2, rps: false, raise_backlog: false, ..Default::default() }).unwrap()
}

fn no_clsact(star: &Star) -> bool {
    let out = star.hosts[0].ns.command("tc").args(["qdisc", "show", "dev", "eth0"]).output().unwrap();
    !String::from_utf8_lossy(&out.stdout).contains("clsact")
}

#[test]
#[ignore = "needs root and the eBPF object (T2): run with cargo xtask test"]
fn agent_runs_as_nobody_with_exactly_three_capabilities() {
    preconditions();
    let star = star();
    let scratch = Scratch::new("privileges-ok");
    let caps: Vec<&str> = SETPRIV_NAMES.iter().map(|(_, n)| *n).collect();
    let child = scratch.agent(&star, &caps).spawn().expect("spawning setpriv");
    let pid = child.id();
    let mut agent = Agent(Some(child));

    let (status, body) = wait_for(Duration::from_secs(20), Duration::from_millis(100), "the agent to become ready", || {
        get(&star, "/readyz").filter(|(s, _)| *s == 200)
    });
    assert_eq!(status, 200, "{body}");
    // setpriv exec'd the agent in place: this is the agent's own view of itself.
    let want = AGENT_CAPABILITIES.iter().fold(0u64, |m, c| m | 1 << c.bit);
    for field in ["CapEff:", "CapPrm:", "CapBnd:", "CapAmb:"] {
        let got = u64::from_str_radix(&proc_status_field(pid, field), 16).unwrap();
        assert_eq!(got, want, "{field} of the agent is {got:#x}, want exactly CAP_BPF|CAP_NET_ADMIN|CAP_PERFMON ({want:#x})");
    }
    assert!(proc_status_field(pid, "Uid:").split_whitespace().all(|u| u == UID.to_string()), "the agent is not running as uid {UID}");
    for name in dataplane_user::PINNED_MAPS {
        let pin = scratch.pin_dir.join(name);
        let meta = std::fs::metadata(&pin).unwrap_or_else(|e| panic!("map {name} not pinned at {}: {e}", pin.display()));
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), UID, "{} not created by the agent's uid", pin.display());
    }
    assert!(scratch.state_dir().join("operator.token").exists(), "the agent did not write its operator token");

    // Traffic host0 → host1 is counted and shows in /metrics.
    let h1: IpAddr = star.hosts[1].addr.into();
    let sink = star.hosts[1].ns.run(|| TcpSink::bind(SocketAddr::new(h1, 0))).unwrap();
    let port = sink.local_addr().unwrap().port();
    let recv = std::thread::spawn(move || sink.receive(1, Duration::from_secs(30)));
    star.hosts[0].ns.run(|| testbed::tcp_send(SocketAddr::new(h1, port), 500_000, 1)).unwrap();
    recv.join().unwrap().unwrap();
    let text = wait_for(Duration::from_secs(10), Duration::from_millis(100), "matched packets in /metrics", || {
        get(&star, "/metrics").map(|(_, t)| t).filter(|t| metric(t, "ringside_dataplane_packets_total{result=\"matched\"}") > 0)
    });
    assert!(metric(&text, "ringside_dataplane_packets_total{result=\"seen\"}") > 0, "{text}");

    assert!(agent.stop(), "the agent did not exit cleanly on SIGTERM");
    assert!(no_clsact(&star), "clsact left on eth0 after a clean exit");
    for name in dataplane_user::PINNED_MAPS {
        assert!(!scratch.pin_dir.join(name).exists(), "pin {name} left after a clean exit");
    }
}

#[test]
#[ignore = "needs root and the eBPF object (T2): run with cargo xtask test"]
fn agent_without_a_capability_names_it_and_touches_nothing() {
    preconditions();
    let star = star();
    let scratch = Scratch::new("privileges-missing");
    let named = [CAP_BPF, CAP_NET_ADMIN, CAP_PERFMON];
    for (missing, _) in SETPRIV_NAMES {
        let caps: Vec<&str> = SETPRIV_NAMES.iter().filter(|(c, _)| *c != missing).map(|(_, n)| *n).collect();
        let out = run_bounded(scratch.agent(&star, &caps));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the agent started without {missing}: {stderr}");
        assert!(stderr.contains(&format!("lacks {missing} (")), "the error does not name {missing}: {stderr}");
        for other in named.iter().filter(|c| c.name != missing) {
            assert!(!stderr.contains(&format!("lacks {} (", other.name)) && !stderr.contains(&format!(", {} (", other.name)), "{stderr}");
        }
        assert!(stderr.contains("AmbientCapabilities=") && stderr.contains("setcap") && stderr.contains("securityContext"), "{stderr}");
        assert!(no_clsact(&star), "the agent touched eth0 without {missing}");
        assert!(std::fs::read_dir(&scratch.pin_dir).unwrap().next().is_none(), "the agent pinned maps without {missing}");
    }
    // None at all: all three named.
    let out = run_bounded(scratch.agent(&star, &[]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(named.iter().all(|c| stderr.contains(c.name)), "{stderr}");
    assert!(!Path::new(&scratch.state_dir().join("operator.token")).exists(), "the agent wrote state before checking its capabilities");
}
