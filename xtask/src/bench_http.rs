//! `cargo xtask bench http`: the agent's HTTP API under load, on loopback.
//!
//! The release `ringside` agent runs in a 1-host testbed namespace (attached to its `eth0`,
//! listening on that namespace's `127.0.0.1:9464`, as in production apart from the namespace). A
//! job is registered through `POST /v1/jobs`; then, from inside the namespace:
//!
//! 1. warm-up: a short round of each of the phases below (`--warmup-seconds` each, unmeasured),
//!    so every kind of allocation the agent makes has happened once (500 idle connections take
//!    about 9 KiB each of read buffers, which the allocator keeps after they close); then a 1 s
//!    pause and the reference RSS;
//! 2. `hints`: `--clients` keep-alive clients on `GET /v1/jobs/{id}/hints` (tenant token);
//! 3. `metrics`: the same on `GET /metrics`;
//! 4. `metrics+idle`: `--idle` connections are opened and left silent, and phase 3 is run again
//!    while they are held (shorter than the agent's 10 s header-read timeout, which closes them:
//!    how many were still open at the end is reported, and fewer than all fails the run);
//! 5. a quiet pause, then the agent's RSS once more.
//!
//! Each client is one thread with its own `ureq` agent keeping one connection alive (the
//! agent's `ringside_http_connections_accepted_total` before and after each phase says how many
//! connections the phase opened). Per phase: requests/s, p50/p99/max latency, errors. The agent's
//! RSS (`VmRSS` of `/proc/PID/status`) is sampled every 250 ms throughout; "flat" means the RSS
//! after the last phase is within `--rss-bound-pct` of the RSS after the warm-up. Writes
//! `target/bench/http.json`.
//!
//! The load generator shares the machine's cores with the agent: the numbers are what this
//! machine did in this run (load average recorded), not a capacity of the agent alone.
use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use testbed::{NetnsHandle, Star, StarConfig};

use crate::{
    agent::{Agent, AgentSpec},
    eval::{loadavg, machine, release_binaries},
};

/// Options of `cargo xtask bench http`.
#[derive(Args, Clone, Debug)]
pub struct Opts {
    /// Concurrent keep-alive clients (one thread and one connection each).
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Seconds of each measured phase (hints, metrics).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Seconds of warm-up (hints endpoint) before the RSS reference is taken.
    #[arg(long, default_value_t = 3)]
    pub warmup_seconds: u64,
    /// Idle connections held open during the last phase.
    #[arg(long, default_value_t = 500)]
    pub idle: usize,
    /// Seconds of the `/metrics` phase with the idle connections held; below the agent's 10 s
    /// header-read timeout, which closes idle connections.
    #[arg(long, default_value_t = 6)]
    pub idle_seconds: u64,
    /// "Flat" RSS: the RSS after the last phase is at most this many percent above the RSS after
    /// the warm-up.
    #[arg(long, default_value_t = 10.0)]
    pub rss_bound_pct: f64,
    /// The `ringside` binary to run (default: build the release binaries and use
    /// target/release/ringside).
    #[arg(long, value_name = "PATH")]
    pub ringside: Option<PathBuf>,
    /// Use the release binaries already built (skip `cargo xtask build --release`).
    #[arg(long)]
    pub no_build: bool,
}

const AGENT_LISTEN: &str = "127.0.0.1:9464";
/// The agent's `Limits::header_read_timeout` (dataplane-user/src/api/server.rs).
const AGENT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Per-request bound of the load clients.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// RSS sampling period.
const RSS_EVERY: Duration = Duration::from_millis(250);

pub fn run(o: Opts) -> Result<()> {
    if o.clients == 0 || o.seconds == 0 {
        bail!("--clients and --seconds must be at least 1");
    }
    if Duration::from_secs(o.idle_seconds) >= AGENT_HEADER_READ_TIMEOUT {
        bail!("--idle-seconds must stay below the agent's {} s header-read timeout, which closes idle connections", AGENT_HEADER_READ_TIMEOUT.as_secs());
    }
    testbed::require_root().context("bench http runs the agent in a network namespace")?;
    let ringside = match &o.ringside {
        Some(p) => p.clone(),
        None => release_binaries(o.no_build)?.0,
    };
    let stop = testbed::signals::stop_flag();
    let load_before = loadavg();
    let started = Instant::now();
    let out_dir = crate::util::workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;

    let star = Star::new(StarConfig { hosts: 1, ..Default::default() })?;
    let ns = star.hosts[0].ns.handle();
    let mut agent = Agent::start(
        &star.hosts[0].ns,
        &AgentSpec {
            bin: &ringside,
            ifaces: vec!["eth0".into()],
            listen: AGENT_LISTEN.into(),
            config_toml: String::new(),
            tag: "bench-http".into(),
            log: Some(out_dir.join("http-agent.log")),
        },
    )?;
    agent.wait_ready(Duration::from_secs(30))?;
    let pid = agent.pid().context("the agent has no process id")?;
    let job = agent.register(&ringside_client::JobRegistration {
        name: "bench-http".into(),
        members: vec![star.hosts[0].addr.to_string()],
        tcp_ports: vec!["29500".parse().expect("a port")],
        udp_ports: vec![],
        gradient_bytes: Some(64 << 20),
        constraints: Default::default(),
    })?;
    let base = format!("http://{AGENT_LISTEN}");
    let hints = Target { name: "hints", url: format!("{base}/v1/jobs/{}/hints", job.id), token: Some(job.tenant_token.clone()) };
    let metrics = Target { name: "metrics", url: format!("{base}/metrics"), token: None };

    let rss = RssSampler::start(pid);
    rss.phase("start");
    thread::sleep(RSS_EVERY * 2);
    let rss_start = rss.latest()?;

    rss.phase("warm-up");
    let warm = Duration::from_secs(o.warmup_seconds);
    let mut warm_requests = load(&agent, &ns, &hints, o.clients, warm, stop)?.ok;
    warm_requests += load(&agent, &ns, &metrics, o.clients, warm, stop)?.ok;
    warm_requests += idle_round(&agent, &ns, &metrics, &o, warm.min(Duration::from_secs(o.idle_seconds)), stop)?.0.ok;
    thread::sleep(Duration::from_secs(1));
    let rss_after_warmup = rss.sample_now()?;
    println!("warm-up: {warm_requests} requests (hints, metrics, metrics beside {} idle connections), RSS {rss_after_warmup} KiB", o.idle);

    let mut phases = Vec::new();
    for target in [&hints, &metrics] {
        check_stop(stop)?;
        rss.phase(target.name);
        let r = load(&agent, &ns, target, o.clients, Duration::from_secs(o.seconds), stop)?;
        r.print(target.name);
        phases.push(r.json(target.name, &o, None));
    }

    // Idle connections, opened inside the agent's namespace and left silent.
    check_stop(stop)?;
    rss.phase("metrics+idle");
    let (r, idle) = idle_round(&agent, &ns, &metrics, &o, Duration::from_secs(o.idle_seconds), stop)?;
    r.print("metrics+idle");
    println!("  {idle}");
    phases.push(r.json("metrics+idle", &o, Some(idle.json())));

    rss.phase("after");
    thread::sleep(Duration::from_secs(2));
    let rss_end = rss.sample_now()?;
    let samples = rss.stop();
    let rss_max = samples.iter().map(|s| s.kib).max().unwrap_or(0);
    let by_phase = rss_by_phase(&samples);
    let limit = rss_after_warmup as f64 * (1.0 + o.rss_bound_pct / 100.0);
    let flat = rss_end as f64 <= limit;
    drop(agent);
    drop(star);
    let load_after = loadavg();
    println!(
        "agent RSS: start {rss_start} KiB, after warm-up {rss_after_warmup} KiB, max {rss_max} KiB, end {rss_end} KiB ({:+.1} % of after warm-up; bound {:.0} %: {})",
        (rss_end as f64 / rss_after_warmup as f64 - 1.0) * 100.0,
        o.rss_bound_pct,
        if flat { "flat" } else { "NOT FLAT" }
    );
    println!("loadavg before {load_before}, after {load_after}; {:.0} s", started.elapsed().as_secs_f64());
    let report = json!({
        "tool": "cargo xtask bench http",
        "machine": machine(),
        "clients": o.clients,
        "seconds": o.seconds,
        "warmup_seconds": o.warmup_seconds,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "phases": phases,
        "rss_kib": {
            "start": rss_start,
            "after_warmup": rss_after_warmup,
            "max": rss_max,
            "end": rss_end,
            "bound_pct": o.rss_bound_pct,
            "flat": flat,
            "max_by_phase": by_phase,
            "samples": samples.iter().map(|s| json!([s.t_ms, s.phase, s.kib])).collect::<Vec<_>>(),
        },
    });
    let out = out_dir.join("http.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n").with_context(|| format!("write {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

/// The idle connections of a `metrics+idle` round.
struct IdleReport {
    idle_connections: usize,
    still_open_at_end: usize,
    held_s: f64,
    /// `ringside_http_connections_open` scraped at the end, idle connections still held.
    agent_open_connections_gauge: f64,
}

impl IdleReport {
    fn json(&self) -> Value {
        json!({
            "idle_connections": self.idle_connections,
            "still_open_at_end": self.still_open_at_end,
            "held_s": self.held_s,
            "agent_open_connections_gauge": self.agent_open_connections_gauge,
        })
    }
}

impl std::fmt::Display for IdleReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} idle connections still open after {:.1} s (agent's open-connections gauge {:.0})",
            self.still_open_at_end, self.idle_connections, self.held_s, self.agent_open_connections_gauge
        )
    }
}

/// Opens `--idle` connections inside `ns`, leaves them silent, loads `target` for `dur`, checks
/// they are all still open, and closes them.
fn idle_round(agent: &Agent, ns: &NetnsHandle, target: &Target, o: &Opts, dur: Duration, stop: &AtomicBool) -> Result<(PhaseResult, IdleReport)> {
    let idle = ns.try_run(|| -> Result<Vec<std::net::TcpStream>> {
        let addr: std::net::SocketAddr = AGENT_LISTEN.parse()?;
        (0..o.idle).map(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).context("opening an idle connection")).collect()
    })??;
    let opened = Instant::now();
    let r = load(agent, ns, target, o.clients, dur, stop)?;
    let gauge = metric(&agent.get("/metrics")?, "ringside_http_connections_open");
    let still_open = idle.iter().filter(|s| !closed_by_peer(s)).count();
    let report = IdleReport { idle_connections: o.idle, still_open_at_end: still_open, held_s: opened.elapsed().as_secs_f64(), agent_open_connections_gauge: gauge };
    drop(idle);
    if still_open < o.idle {
        bail!("{report}: the /metrics numbers were not measured beside {} idle connections", o.idle);
    }
    Ok((r, report))
}

/// One endpoint under load.
struct Target {
    name: &'static str,
    url: String,
    token: Option<String>,
}

/// What one phase measured.
struct PhaseResult {
    ok: u64,
    /// Errors by kind: `status NNN`, or the transport error's kind.
    errors: BTreeMap<String, u64>,
    elapsed: Duration,
    /// Latency of every successful request, milliseconds, sorted.
    latencies_ms: Vec<f64>,
    /// Connections the agent accepted during the phase (its own counter; one is our scrape).
    connections_opened: f64,
}

impl PhaseResult {
    fn rps(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    fn q(&self, q: f64) -> f64 {
        ringside_stats::quantile_sorted(&self.latencies_ms, q).unwrap_or(f64::NAN)
    }

    fn errors_total(&self) -> u64 {
        self.errors.values().sum()
    }

    fn print(&self, name: &str) {
        println!(
            "{name:<13} {:>8.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  max {:>8.3} ms  ok {:>7}  errors {} {:?}  connections opened {:.0}",
            self.rps(),
            self.q(0.5),
            self.q(0.99),
            self.latencies_ms.last().copied().unwrap_or(f64::NAN),
            self.ok,
            self.errors_total(),
            self.errors,
            self.connections_opened
        );
    }

    fn json(&self, name: &str, o: &Opts, extra: Option<Value>) -> Value {
        json!({
            "phase": name,
            "clients": o.clients,
            "seconds": self.elapsed.as_secs_f64(),
            "requests_ok": self.ok,
            "requests_per_s": self.rps(),
            "p50_ms": self.q(0.5),
            "p99_ms": self.q(0.99),
            "max_ms": self.latencies_ms.last().copied(),
            "errors": self.errors_total(),
            "errors_by_kind": self.errors,
            "connections_opened": self.connections_opened,
            "idle": extra,
        })
    }
}

/// `clients` threads (inside `ns`), each with one keep-alive connection, requesting `target` for
/// `dur`.
fn load(agent: &Agent, ns: &NetnsHandle, target: &Target, clients: usize, dur: Duration, stop: &AtomicBool) -> Result<PhaseResult> {
    let accepted_before = metric(&agent.get("/metrics")?, "ringside_http_connections_accepted");
    let started = Instant::now();
    let deadline = started + dur;
    let per_client = ns.try_run(|| {
        thread::scope(|s| {
            let handles: Vec<_> = (0..clients).map(|_| s.spawn(|| client(target, deadline, stop))).collect();
            handles.into_iter().map(|h| h.join().expect("a load client panicked")).collect::<Vec<_>>()
        })
    })?;
    let elapsed = started.elapsed();
    let accepted_after = metric(&agent.get("/metrics")?, "ringside_http_connections_accepted");
    let mut r = PhaseResult { ok: 0, errors: BTreeMap::new(), elapsed, latencies_ms: Vec::new(), connections_opened: accepted_after - accepted_before };
    for (lat, errors) in per_client {
        r.ok += lat.len() as u64;
        r.latencies_ms.extend(lat);
        for (k, n) in errors {
            *r.errors.entry(k).or_default() += n;
        }
    }
    ringside_stats::sort(&mut r.latencies_ms);
    check_stop(stop)?;
    Ok(r)
}

/// One load client: requests back to back on one kept-alive connection until `deadline`.
fn client(target: &Target, deadline: Instant, stop: &AtomicBool) -> (Vec<f64>, BTreeMap<String, u64>) {
    let http: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .max_idle_connections(1)
        .max_idle_connections_per_host(1)
        .build()
        .into();
    let auth = target.token.as_ref().map(|t| format!("Bearer {t}"));
    let mut lat = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let mut req = http.get(&target.url);
        if let Some(a) = &auth {
            req = req.header("Authorization", a);
        }
        // The whole body is read: the connection is reused only after it.
        let outcome = req.call().and_then(|mut resp| {
            let status = resp.status().as_u16();
            resp.body_mut().with_config().limit(16 << 20).read_to_vec().map(|_| status)
        });
        match outcome {
            Ok(200) => lat.push(t0.elapsed().as_secs_f64() * 1e3),
            Ok(status) => *errors.entry(format!("status {status}")).or_default() += 1,
            Err(e) => {
                *errors.entry(error_kind(&e)).or_default() += 1;
                // A refused or reset connection: do not spin.
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
    (lat, errors)
}

fn error_kind(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Io(io) => format!("io {:?}", io.kind()),
        ureq::Error::Timeout(_) => "timeout".into(),
        other => other.to_string().split(':').next().unwrap_or("error").to_owned(),
    }
}

/// Whether the agent has closed `s` (EOF, reset or any data: an idle connection gets nothing
/// unless it is being closed, e.g. a 408 head).
fn closed_by_peer(s: &std::net::TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return true;
    }
    let mut b = [0u8; 1];
    !matches!(s.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// The value of the unlabelled sample `name` (or, for a counter, `name_total`) in a Prometheus
/// text; NaN if absent.
fn metric(text: &str, name: &str) -> f64 {
    let sample = |n: &str| {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.strip_prefix(n).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
    };
    sample(name).or_else(|| sample(&format!("{name}_total"))).unwrap_or(f64::NAN)
}

#[derive(Clone)]
struct RssSample {
    t_ms: u64,
    phase: &'static str,
    kib: u64,
}

/// Samples the agent's `VmRSS` every [`RSS_EVERY`] on a thread of its own.
struct RssSampler {
    pid: u32,
    started: Instant,
    phase: Arc<Mutex<&'static str>>,
    samples: Arc<Mutex<Vec<RssSample>>>,
    done: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let (phase, samples, done) = (Arc::new(Mutex::new("start")), Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let started = Instant::now();
        let thread = {
            let (phase, samples, done) = (phase.clone(), samples.clone(), done.clone());
            thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if let Ok(kib) = vm_rss_kib(pid) {
                        let p = *phase.lock().unwrap();
                        samples.lock().unwrap().push(RssSample { t_ms: started.elapsed().as_millis() as u64, phase: p, kib });
                    }
                    thread::sleep(RSS_EVERY);
                }
            })
        };
        RssSampler { pid, started, phase, samples, done, thread: Some(thread) }
    }

    fn phase(&self, p: &'static str) {
        *self.phase.lock().unwrap() = p;
    }

    fn latest(&self) -> Result<u64> {
        self.samples.lock().unwrap().last().map(|s| s.kib).context("no RSS sample of the agent yet")
    }

    /// A sample taken now (and recorded).
    fn sample_now(&self) -> Result<u64> {
        let kib = vm_rss_kib(self.pid)?;
        let p = *self.phase.lock().unwrap();
        self.samples.lock().unwrap().push(RssSample { t_ms: self.started.elapsed().as_millis() as u64, phase: p, kib });
        Ok(kib)
    }

    fn stop(mut self) -> Vec<RssSample> {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut v = self.samples.lock().unwrap().clone();
        v.sort_by_key(|s| s.t_ms);
        v
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
    }
}

fn vm_rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS in {path}"))
}

/// Highest RSS seen in each phase, in phase order.
fn rss_by_phase(samples: &[RssSample]) -> Vec<Value> {
    let mut out: Vec<(&str, u64)> = Vec::new();
    for s in samples {
        match out.iter_mut().find(|(p, _)| *p == s.phase) {
            Some((_, max)) => *max = (*max).max(s.kib),
            None => out.push((s.phase, s.kib)),
        }
    }
    out.into_iter().map(|(p, k)| json!({ "phase": p, "max_kib": k })).collect()
}

fn check_stop(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted; tearing down");
    }
    Ok(())
}
