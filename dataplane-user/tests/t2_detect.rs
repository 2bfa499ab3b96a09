//! T2: detection end to end. A 6-host testbed star, the `ringside` agent in the switch namespace
//! on every bridge port (so each port's flows have the host cabled to it as their peer), the
//! emulated training job (`ringside-rank`, ring allreduce over TCP port 29500), and a fault:
//! (a) 5 % random loss on one host's link → a gray-failure event naming that host;
//! (b) a compute straggler → a straggler event naming its host and no network-fault event.
//!
//! Needs root, an agent built with its eBPF object (`cargo xtask test` does both) and the rank
//! binary (`cargo build -p ipu-firmware --bin ringside-rank`, or `RINGSIDE_RANK_BIN`). Without
//! any of them it FAILS with the reason; it never skips. Every wait is bounded.
use std::{
    net::IpAddr,
    path::PathBuf,
    process::{Child, Command},
    time::{Duration, Instant},
};

use dataplane_user::{api::EventsResponse, client, detect::Scope, detect::VerdictKind, events::Event};
use testbed::{ByteSize, JobConfig, Star, StarConfig};

const HOSTS: usize = 6;

fn preconditions() -> PathBuf {
    if let Err(e) = testbed::require_root() {
        panic!("t2_detect attaches eBPF programs in network namespaces and needs root: {e}");
    }
    if let Err(e) = dataplane_user::object::flowmon_object() {
        panic!("t2_detect runs the real agent: {e}");
    }
    rank_binary()
}

/// `RINGSIDE_RANK_BIN`, else target/{release,debug}/ringside-rank.
fn rank_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("RINGSIDE_RANK_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "RINGSIDE_RANK_BIN={} is not a file", p.display());
        return p;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    for profile in ["release", "debug"] {
        let p = target.join(profile).join("ringside-rank");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "t2_detect runs the emulated job and needs the ringside-rank binary, not found in {}/{{release,debug}}; \
         run `cargo build -p ipu-firmware --bin ringside-rank` (or set RINGSIDE_RANK_BIN)",
        target.display()
    );
}

/// The agent in the switch namespace; SIGTERM + bounded wait (then SIGKILL) on drop, and its
/// pins, config and state directory removed.
struct Agent {
    child: Option<Child>,
    port: u16,
    pin_dir: PathBuf,
    config: PathBuf,
    state_dir: PathBuf,
}

impl Agent {
    fn start(star: &Star, tag: &str, port: u16) -> Agent {
        let id = format!("{}-{tag}", std::process::id());
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/ringside-t2d-{id}"));
        let state_dir = std::env::temp_dir().join(format!("ringside-t2d-state-{id}"));
        let config = std::env::temp_dir().join(format!("ringside-t2d-{id}.toml"));
        let _ = std::fs::remove_dir_all(&state_dir);
        std::fs::write(
            &config,
            format!(
                "state_dir = \"{}\"\n[match]\ntcp_ports = [29500]\n\
                 [[job]]\nname = \"t2\"\nmembers = [\"10.77.0.0/24\"]\ntcp_ports = [29500]\n",
                state_dir.display()
            ),
        )
        .unwrap();
        let mut cmd = star.switch.command(env!("CARGO_BIN_EXE_ringside"));
        cmd.args(["agent", "--listen", &format!("127.0.0.1:{port}"), "--config"]).arg(&config).arg("--pin-dir").arg(&pin_dir);
        for h in &star.hosts {
            cmd.args(["--iface", &h.switch_port]);
        }
        cmd.env("RUST_LOG", "info");
        let child = cmd.spawn().expect("spawning the ringside binary");
        let agent = Agent { child: Some(child), port, pin_dir, config, state_dir };
        wait_for(Duration::from_secs(15), "the agent to become ready", || {
            star.switch
                .run(|| client::get_json::<dataplane_user::api::StatusResponse>(&agent.url(), "/v1/status"))
                .ok()
                .filter(|s| s.ready)
        });
        agent
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn events(&self, star: &Star) -> EventsResponse {
        let url = self.url();
        star.switch.run(|| client::get_json::<EventsResponse>(&url, "/v1/events?state=all&limit=1000")).expect("GET /v1/events")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && !matches!(child.try_wait(), Ok(Some(_))) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        for name in dataplane_user::loader::PINNED_MAPS {
            let _ = std::fs::remove_file(self.pin_dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

fn wait_for<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn names_peer(e: &Event, addr: IpAddr) -> bool {
    matches!(&e.scope, Scope::Peer { peer, .. } if *peer == addr)
}

fn summary(r: &EventsResponse) -> String {
    r.events.iter().map(|e| format!("\n  {}", serde_json::to_string(e).unwrap())).collect()
}

fn job(rank_bin: PathBuf, straggler: Option<(usize, u64)>) -> JobConfig {
    JobConfig {
        ranks: HOSTS,
        size: ByteSize(4 << 20),
        steps: 100_000,
        compute_ms: 50,
        straggler,
        rank_bin: Some(rank_bin),
        timeout: Duration::from_secs(120),
        ..Default::default()
    }
}

/// Runs the job healthy for `warmup`, asserting no network-fault event appears; returns the job.
fn warm_up(star: &Star, agent: &Agent, cfg: &JobConfig, warmup: Duration) -> testbed::RunningJob {
    let running = testbed::spawn_job(star, cfg).expect("starting the emulated job");
    std::thread::sleep(warmup);
    let r = agent.events(star);
    eprintln!("after {warmup:?} of the job: {} windows, events:{}", r.windows, summary(&r));
    assert!(r.windows >= 3, "the detectors ran only {} windows", r.windows);
    running
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn loss_on_one_host_link_is_a_gray_failure_naming_it() {
    let rank_bin = preconditions();
    let star = Star::new(StarConfig { hosts: HOSTS, offloads: false, ..Default::default() }).unwrap();
    let agent = Agent::start(&star, "loss", 9471);
    let _job = warm_up(&star, &agent, &job(rank_bin, None), Duration::from_secs(10));
    let healthy = agent.events(&star);
    assert!(
        !healthy.events.iter().any(|e| e.kind.is_network_fault()),
        "network-fault events on a healthy job:{}",
        summary(&healthy)
    );

    let target = 2usize;
    let addr: IpAddr = star.hosts[target].addr.into();
    let _loss = star.add_loss(target, 5.0).unwrap();
    let started = Instant::now();
    let found = wait_for(Duration::from_secs(20), "a gray-failure event naming the lossy host", || {
        let r = agent.events(&star);
        r.events.iter().find(|e| e.kind == VerdictKind::GrayFailure && names_peer(e, addr)).cloned()
    });
    let latency = started.elapsed();
    let r = agent.events(&star);
    eprintln!("gray failure on {addr} detected {:.1} s after the loss started:{}", latency.as_secs_f64(), summary(&r));
    assert!(!found.evidence.is_empty(), "the event carries its evidence");
    // The lossy host is the one blamed hardest. Known gap: from the switch vantage a ring
    // neighbour's port carries the retransmissions of the flows to and from the lossy host, so
    // the neighbours get gray failures too (seen: 5.6 % on the lossy host, about 3 % on both
    // neighbours, sometimes `critical`); telling them apart needs per-flow correlation across
    // ports. Until then the test asserts the lossy host carries the highest loss.
    let loss_of = |e: &Event| e.evidence.iter().filter(|x| x.metric == dataplane_user::detect::Metric::LossRate).map(|x| x.value).fold(0.0, f64::max);
    let worst = r.events.iter().filter(|e| e.kind == VerdictKind::GrayFailure).max_by(|a, b| loss_of(a).total_cmp(&loss_of(b))).unwrap();
    assert!(names_peer(worst, addr), "the highest loss is not on the lossy host:{}", summary(&r));
    // And /metrics counts it, with bounded labels only.
    let text = star.switch.run(|| {
        Command::new("curl").args(["-sf", &format!("{}/metrics", agent.url())]).output().expect("curl")
    });
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.lines().any(|l| l.starts_with("ringside_verdicts_total{kind=\"gray_failure\"}") && !l.ends_with(" 0")), "{text}");
    assert!(!text.lines().filter(|l| l.starts_with("ringside_verdicts")).any(|l| l.contains("10.77.")), "peer in verdict labels");
    // The CLI shows it.
    let out = star.switch.command(env!("CARGO_BIN_EXE_ringside")).args(["events", "--agent", &agent.url()]).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && table.contains("gray_failure") && table.contains(&addr.to_string()), "{table}");
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn compute_straggler_is_a_straggler_not_a_network_fault() {
    let rank_bin = preconditions();
    let star = Star::new(StarConfig { hosts: HOSTS, offloads: false, ..Default::default() }).unwrap();
    let agent = Agent::start(&star, "straggler", 9472);
    let target = 3usize;
    let addr: IpAddr = star.hosts[target].addr.into();
    let started = Instant::now();
    let _job = testbed::spawn_job(&star, &job(rank_bin, Some((target, 60)))).expect("starting the emulated job");
    let mut network_seen = Vec::new();
    let found = wait_for(Duration::from_secs(30), "a straggler event naming the slow rank's host", || {
        let r = agent.events(&star);
        network_seen.extend(r.events.iter().filter(|e| e.kind.is_network_fault()).map(|e| e.id));
        if !network_seen.is_empty() {
            panic!("a compute straggler was reported as a network fault:{}", summary(&r));
        }
        r.events.iter().find(|e| e.kind == VerdictKind::Straggler && names_peer(e, addr)).cloned()
    });
    eprintln!("straggler on {addr} detected {:.1} s after the job started", started.elapsed().as_secs_f64());
    // Keep watching a little: the fabric must not be blamed.
    std::thread::sleep(Duration::from_secs(5));
    let r = agent.events(&star);
    eprintln!("events:{}", summary(&r));
    assert!(found.kind == VerdictKind::Straggler);
    let network: Vec<&Event> = r.events.iter().filter(|e| e.kind.is_network_fault()).collect();
    assert!(network.is_empty(), "a compute straggler was reported as a network fault: {network:?}");
    let wrong: Vec<&Event> = r.events.iter().filter(|e| e.kind == VerdictKind::Straggler && !names_peer(e, addr)).collect();
    assert!(wrong.is_empty(), "stragglers named on other hosts: {wrong:?}");
}
