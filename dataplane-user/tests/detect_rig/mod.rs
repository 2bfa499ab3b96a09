//! The rig shared by the detection end-to-end tests (`t2_detect.rs`): a
//! 6-host testbed star, the `ringside` agent in the switch namespace on every bridge port, and the
//! emulated training job (`ringside-rank`, ring allreduce over TCP port 29500).
#![allow(dead_code)]
use std::{
    net::IpAddr,
    path::PathBuf,
    process::Child,
    time::{Duration, Instant},
};

pub use crate::support::wait_for;
use dataplane_user::{cli, detect::Scope, events::Event};
use ringside_client::{EventsResponse, OperatorClient};
use testbed::{ByteSize, JobConfig, Star};

pub const HOSTS: usize = 6;

pub fn preconditions() -> PathBuf {
    if let Err(e) = testbed::require_root() {
        panic!("the detection tests attach eBPF programs in network namespaces and needs root: {e}");
    }
    if let Err(e) = dataplane_user::object::flowmon_object() {
        panic!("the detection tests run the real agent: {e}");
    }
    rank_binary()
}

/// `RINGSIDE_RANK_BIN`, else target/{release,debug}/ringside-rank.
pub fn rank_binary() -> PathBuf {
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
pub struct Agent {
    child: Option<Child>,
    port: u16,
    pin_dir: PathBuf,
    config: PathBuf,
    state_dir: PathBuf,
}

impl Agent {
    /// The agent of the detection tests: on 127.0.0.1, the job declared in its config file.
    pub fn start(star: &Star, tag: &str, port: u16) -> Agent {
        let config = "[match]\ntcp_ports = [29500]\n\
                      [[job]]\nname = \"t2\"\nmembers = [\"10.77.0.0/24\"]\ntcp_ports = [29500]\n";
        Agent::start_with(star, tag, IpAddr::from([127, 0, 0, 1]), port, config)
    }

    /// The agent listening on `listen:port` in the switch namespace (`0.0.0.0` lets the hosts
    /// reach it at the star's management address), with `config` as its config file after the
    /// `state_dir` line.
    pub fn start_with(star: &Star, tag: &str, listen: IpAddr, port: u16, config_body: &str) -> Agent {
        let id = format!("{}-{tag}", std::process::id());
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/ringside-t2d-{id}"));
        let state_dir = std::env::temp_dir().join(format!("ringside-t2d-state-{id}"));
        let config = std::env::temp_dir().join(format!("ringside-t2d-{id}.toml"));
        let _ = std::fs::remove_dir_all(&state_dir);
        std::fs::write(&config, format!("state_dir = \"{}\"\n{config_body}", state_dir.display())).unwrap();
        let mut cmd = star.switch.command(env!("CARGO_BIN_EXE_ringside"));
        cmd.args(["agent", "--listen", &std::net::SocketAddr::new(listen, port).to_string(), "--config"]).arg(&config).arg("--pin-dir").arg(&pin_dir);
        for h in &star.hosts {
            cmd.args(["--iface", &h.switch_port]);
        }
        // `RINGSIDE_AGENT_LOG=info,ringside::detect::input=debug` dumps the detectors' input windows.
        cmd.env("RUST_LOG", std::env::var("RINGSIDE_AGENT_LOG").unwrap_or_else(|_| "info".into()));
        let child = cmd.spawn().expect("spawning the ringside binary");
        let agent = Agent { child: Some(child), port, pin_dir, config, state_dir };
        wait_for(Duration::from_secs(15), POLL, "the agent to become ready", || {
            star.switch
                .run(|| OperatorClient::new(&agent.url(), &agent.token().unwrap_or_default())?.status())
                .ok()
                .filter(|s| s.ready)
        });
        agent
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn state_dir(&self) -> &std::path::Path {
        &self.state_dir
    }

    /// The operator token the agent generated in its state directory (once written).
    pub fn token(&self) -> Option<String> {
        cli::resolve_token(None, &self.state_dir).ok()
    }

    pub fn events(&self, star: &Star) -> EventsResponse {
        let url = self.url();
        let token = self.token();
        star.switch
            .run(|| OperatorClient::new(&url, &token.unwrap_or_default())?.events(true, 1000))
            .expect("GET /v1/events")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::support::stop_child(&mut child, Duration::from_secs(10));
        }
        for name in dataplane_user::loader::PINNED_MAPS {
            let _ = std::fs::remove_file(self.pin_dir.join(name));
        }
        let _ = std::fs::remove_dir(&self.pin_dir);
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// How often the detection tests poll the agent.
pub const POLL: Duration = Duration::from_millis(200);

pub fn names_peer(e: &Event, addr: IpAddr) -> bool {
    matches!(&e.scope, Scope::Peer { peer, .. } if *peer == addr)
}

pub fn summary(r: &EventsResponse) -> String {
    r.events.iter().map(|e| format!("\n  {}", serde_json::to_string(e).unwrap())).collect()
}

pub fn job(rank_bin: PathBuf, straggler: Option<(usize, u64)>) -> JobConfig {
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
pub fn warm_up(star: &Star, agent: &Agent, cfg: &JobConfig, warmup: Duration) -> testbed::RunningJob {
    let running = testbed::spawn_job(star, cfg).expect("starting the emulated job");
    std::thread::sleep(warmup);
    let r = agent.events(star);
    eprintln!("after {warmup:?} of the job: {} windows, events:{}", r.windows, summary(&r));
    assert!(r.windows >= 3, "the detectors ran only {} windows", r.windows);
    running
}


/// What headless Chromium rendered of the agent's status page (`GET /`).
pub struct StatusPage {
    /// The DOM after the page's script ran.
    pub dom: String,
    /// Pixels of the banner's "healthy" green (#2e7d32) and "fault" red (#c62828) in the screenshot.
    pub green_pixels: usize,
    pub red_pixels: usize,
    pub screenshot: PathBuf,
}

/// Runs Debian's `chromium` headless in the switch namespace on the agent's status page, with the
/// operator token in the address fragment (or none), and returns the rendered DOM and a
/// screenshot (kept in the test's target tmp dir as `status-page-NAME.png`). Bounded: each browser
/// run is killed after 60 s.
pub fn status_page(star: &Star, agent: &Agent, name: &str, with_token: bool) -> StatusPage {
    let mut url = format!("{}/", agent.url());
    if with_token {
        url += &format!("#token={}", agent.token().expect("the agent wrote its operator token"));
    }
    let profile = std::env::temp_dir().join(format!("ringside-t2-chromium-{}-{name}", std::process::id()));
    let screenshot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("status-page-{name}.png"));
    let chromium = |extra: &[String]| -> Vec<u8> {
        let mut cmd = star.switch.command("chromium");
        cmd.args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,900"])
            .arg("--virtual-time-budget=6000")
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(extra)
            .arg(&url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run chromium ({e}): `cargo xtask setup` installs Debian's chromium"));
        let mut out = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut out, &mut buf).map(|_| buf)
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "chromium {extra:?} exited with {status}");
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium {extra:?} did not finish in 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        reader.join().unwrap().unwrap()
    };
    let dom = String::from_utf8_lossy(&chromium(&["--dump-dom".into()])).into_owned();
    let _ = std::fs::remove_file(&screenshot);
    chromium(&[format!("--screenshot={}", screenshot.display())]);
    let _ = std::fs::remove_dir_all(&profile);
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&screenshot).expect("chromium wrote the screenshot")));
    let mut reader = decoder.read_info().expect("a PNG screenshot");
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).expect("PNG pixels");
    let step = match info.color_type {
        png::ColorType::Rgba => 4,
        png::ColorType::Rgb => 3,
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    let count = |rgb: [u8; 3]| pixels[..info.buffer_size()].chunks_exact(step).filter(|p| p[..3] == rgb).count();
    StatusPage { dom, green_pixels: count([0x2e, 0x7d, 0x32]), red_pixels: count([0xc6, 0x28, 0x28]), screenshot }
}
