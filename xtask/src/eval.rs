//! Pieces shared by the testbed evaluations (`cargo xtask eval ...`).
use std::{
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use ringside_stats::quantile;
use serde_json::Value;
use testbed::{Star, StarConfig};

use crate::{
    agent::Agent,
    build, setup,
    util::{cargo, output, sh, workspace_root},
};

/// The items (`what`: scenario, source, vantage) named on the command line (all when none), in
/// the order of the names given.
pub fn pick<S: Copy>(what: &str, all: &[S], names: &[String], name: impl Fn(S) -> String) -> Result<Vec<S>> {
    if names.is_empty() {
        return Ok(all.to_vec());
    }
    names
        .iter()
        .map(|n| {
            all.iter().copied().find(|s| name(*s) == *n).with_context(|| {
                format!("unknown {what} {n:?}; known: {}", all.iter().map(|s| name(*s)).collect::<Vec<_>>().join(", "))
            })
        })
        .collect()
}

/// Runs `cargo xtask setup` and builds the release agent (with its eBPF object) and
/// `ringside-rank`, unless `no_build`; returns their paths, checked to exist.
pub fn release_binaries(no_build: bool) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    if !no_build {
        setup::run()?;
        build::all(true)?;
        sh(cargo().args(["build", "--release", "-p", "ipu-firmware", "--bin", "ringside-rank"]))?;
    }
    let ringside = build::bin_path("ringside", true);
    let rank_bin = build::bin_path("ringside-rank", true);
    for b in [&ringside, &rank_bin] {
        if !b.is_file() {
            bail!("{} is missing (run without --no-build)", b.display());
        }
    }
    Ok((ringside, rank_bin))
}

pub fn now_ms() -> u64 {
    testbed::fault::unix_ms(std::time::SystemTime::now())
}

/// Sleeps `d` in small steps; false when a stop was requested.
pub fn sleep_checked(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        thread::sleep((end - Instant::now()).min(Duration::from_millis(100)));
    }
    !stop.load(Ordering::SeqCst)
}

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

/// CPU, kernel and source revision, for a report's header.
pub fn machine() -> String {
    let cpus = thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, m)| m.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = output(std::process::Command::new("uname").arg("-r")).map(|s| s.trim().to_string()).unwrap_or_default();
    let rev = output(std::process::Command::new("git").current_dir(workspace_root()).args(["describe", "--always", "--dirty"]))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{cpus} vCPU ({model}), Linux {kernel}; source {rev} (a dirty tree includes other engineers' uncommitted work)")
}

/// 100 ms samples of a host's send rate taken before a rate cap.
pub const RATE_SAMPLES: usize = 20;

/// The rate (Mbit/s, L3) at which the host behind switch `port` sends: the 90th percentile over
/// [`RATE_SAMPLES`] polls of `/v1/flows`, summing its ingress flows on that port (each flow's
/// rate is over the agent's last 100 ms poll, so this is close to the job's in-phase rate).
pub fn job_send_rate_mbit(agent: &Agent, port: &str, stop: &AtomicBool) -> Result<f64> {
    send_rate_mbit(agent, port, "ingress", stop)
}

/// As [`job_send_rate_mbit`], for a vantage where the host's own traffic leaves through `iface`
/// in `direction`: `ingress` on a switch port (the host sends into the switch), `egress` on an
/// IPU's fabric port (the IPU sends its host's traffic out to the fabric).
pub fn send_rate_mbit(agent: &Agent, iface: &str, direction: &str, stop: &AtomicBool) -> Result<f64> {
    let port = iface;
    let mut samples = Vec::new();
    for _ in 0..RATE_SAMPLES {
        let body = agent.get("/v1/flows?limit=1000")?;
        let v: Value = serde_json::from_str(&body).context("/v1/flows is not JSON")?;
        let rate: f64 = v["flows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["interface"] == port && f["direction"] == direction)
            .filter_map(|f| f["rates"]["bytes_per_second"].as_f64())
            .sum();
        samples.push(rate * 8.0 / 1e6);
        if !sleep_checked(Duration::from_millis(100), stop) {
            bail!("interrupted");
        }
    }
    let p90 = quantile(&samples, 0.9).unwrap_or(0.0);
    if p90 <= 0.0 {
        bail!("the agent saw no traffic from {port} during the warm-up: the job is not running");
    }
    Ok(p90)
}

/// Goodput of one TCP stream between two hosts of a fresh 2-host star (offloads off, as the runs).
pub fn measure_capacity() -> Result<f64> {
    let star = Star::new(StarConfig { hosts: 2, offloads: false, ..Default::default() })?;
    let to = (star.hosts[1].addr, 5201).into();
    let sink = star.hosts[1].ns.try_run(|| testbed::TcpSink::bind(to))??;
    let rx = thread::spawn(move || sink.receive(1, Duration::from_secs(30)));
    let tx = star.hosts[0].ns.try_run(|| testbed::tcp_send_with_timeout(to, 256 << 20, 1, Duration::from_secs(30)))??;
    let _ = rx.join();
    Ok(tx.goodput_mbit)
}


/// Loads a system TTF as plotters' "sans-serif" (the bitmap backend has no font of its own);
/// fonts-dejavu-core is installed by `cargo xtask setup`.
pub fn register_font() -> Result<()> {
    use plotters::style::FontStyle;
    let font = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf"]
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .context("no TTF font found (DejaVuSans or LiberationSans) for the plot's labels")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font).map_err(|_| anyhow::anyhow!("cannot load the font"))?;
    Ok(())
}
