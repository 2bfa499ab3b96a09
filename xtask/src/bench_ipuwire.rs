//! `cargo xtask bench ipuwire`: what the emulated IPUs' forwarding costs host-to-host traffic.
//!
//! Three paths exist at once and iperf3 runs host 0 → host 1 over each in turn, in a rotated
//! order every round (so no path always runs first or last):
//! - `direct`: two namespaces joined by one veth pair (the shortest software path);
//! - `bridge`: the testbed star, host ↔ bridge ↔ host (two veth pairs and a Linux bridge);
//! - `ipu`: the IPU star, host ↔ IPU (`ipuwire` redirect) ↔ bridge ↔ IPU ↔ host (four veth
//!   pairs, two eBPF redirects, the bridge).
//!
//! Every link gets the same treatment (RPS on, offloads as chosen). No agent runs. Reports the
//! median throughput per path, the ratios ipu/direct (what the issue asks) and ipu/bridge (the
//! IPUs' own share, since the bridge is in both), the load average before and after, and writes
//! `target/bench/ipuwire.json`. Only ratios measured in the same run mean anything on a shared
//! machine.
use std::{
    net::Ipv4Addr,
    path::PathBuf,
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use testbed::{IpuStar, IpuStarConfig, Netns, Star, StarConfig};

use crate::eval::{loadavg, machine, release_binaries};

/// Options of `cargo xtask bench ipuwire`.
#[derive(Args, Clone, Debug)]
pub struct Opts {
    /// Trials per path; the medians are compared.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// Seconds of iperf3 traffic per trial.
    #[arg(long, default_value_t = 4)]
    pub seconds: u32,
    /// iperf3 parallel streams (-P).
    #[arg(long, default_value_t = 4)]
    pub streams: u32,
    /// Turn TSO/GSO/GRO off on every veth (MTU-sized frames: the forwarder's per-frame cost
    /// weighs most).
    #[arg(long)]
    pub no_offloads: bool,
    /// Use the release binaries already built (skip `cargo xtask build --release`).
    #[arg(long)]
    pub no_build: bool,
    /// The `ringside` binary that runs the forwarders (`ringside ipu-wire`); implies --no-build.
    /// Its build profile does not matter: the data path is the eBPF program.
    #[arg(long, value_name = "PATH")]
    pub ringside: Option<PathBuf>,
}

const PORT: u16 = 5311;
/// The direct pair's subnet, distinct from the stars' 10.77.0.0/24 (separate namespaces anyway).
const DIRECT_A: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
const DIRECT_B: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);

/// Two namespaces joined by one veth pair; dropped with its namespaces.
struct DirectPair {
    a: Netns,
    b: Netns,
}

fn ip(ns: Option<&Netns>, script: &str) -> Result<()> {
    let mut c = Command::new("ip");
    if let Some(ns) = ns {
        c.args(["-n", ns.name()]);
    }
    c.args(["-batch", "-"]).stdin(Stdio::piped());
    let mut child = c.spawn().context("running ip")?;
    std::io::Write::write_all(child.stdin.as_mut().context("ip stdin")?, script.as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        bail!("ip -batch failed ({status}): {script}");
    }
    Ok(())
}

impl DirectPair {
    fn new(offloads: bool) -> Result<DirectPair> {
        let pair = DirectPair { a: Netns::new("direct-a")?, b: Netns::new("direct-b")? };
        ip(None, &format!("link add eth0 netns {} type veth peer name eth0 netns {}\n", pair.a.name(), pair.b.name()))?;
        for (ns, addr) in [(&pair.a, DIRECT_A), (&pair.b, DIRECT_B)] {
            ip(Some(ns), &format!("link set lo up\naddr add {addr}/24 dev eth0\nlink set eth0 up\n"))?;
            if !offloads {
                let s = ns.command("ethtool").args(["-K", "eth0", "tso", "off", "gso", "off", "gro", "off"]).status()?;
                if !s.success() {
                    bail!("ethtool -K eth0 in {} failed", ns.name());
                }
            }
            testbed::tuning::enable_rps(&ns.handle(), &["eth0"])?;
        }
        Ok(pair)
    }
}

/// One path under test: the client's namespace, the server's namespace and address.
struct Path<'a> {
    name: &'static str,
    client: &'a Netns,
    server: &'a Netns,
    addr: Ipv4Addr,
}

pub fn run(o: Opts) -> Result<()> {
    if o.rounds == 0 || o.seconds == 0 || o.streams == 0 {
        bail!("--rounds, --seconds and --streams must be at least 1");
    }
    testbed::require_root().context("bench ipuwire runs network namespaces and attaches eBPF programs")?;
    let ringside = match &o.ringside {
        Some(p) if p.is_file() => p.clone(),
        Some(p) => bail!("--ringside {} is not a file", p.display()),
        None => release_binaries(o.no_build)?.0,
    };
    let stop = testbed::signals::stop_flag();
    let load_before = loadavg();
    let started = Instant::now();
    let offloads = !o.no_offloads;
    let direct = DirectPair::new(offloads)?;
    let star = Star::new(StarConfig { hosts: 2, offloads, ..Default::default() })?;
    let ipu = IpuStar::new(IpuStarConfig { hosts: 2, offloads, ringside_bin: ringside.clone(), ..Default::default() })?;
    let paths = [
        Path { name: "direct", client: &direct.a, server: &direct.b, addr: DIRECT_B },
        Path { name: "bridge", client: &star.hosts[0].ns, server: &star.hosts[1].ns, addr: star.hosts[1].addr },
        Path { name: "ipu", client: &ipu.hosts[0].ns, server: &ipu.hosts[1].ns, addr: ipu.hosts[1].addr },
    ];
    let mut servers = Vec::new();
    for p in &paths {
        let mut srv = p.server.command("iperf3");
        srv.args(["-s", "-B", &p.addr.to_string(), "-p", &PORT.to_string()]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        servers.push(ChildGuard(Some(srv.spawn().with_context(|| format!("starting iperf3 -s for {}", p.name))?)));
    }

    let mut results: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    let mut trials = Vec::new();
    for round in 0..o.rounds {
        for k in 0..paths.len() {
            let i = (k + round as usize) % paths.len();
            let p = &paths[i];
            check_stop(stop)?;
            let (gbit, retrans) = iperf(p, &o, stop)?;
            println!("  round {round} {:<6} {gbit:7.3} Gbit/s  retransmits {retrans:>6}", p.name);
            results[i].push(gbit);
            trials.push(json!({ "round": round, "path": p.name, "gbit_s": gbit, "retransmits": retrans }));
        }
    }
    drop(servers);
    let mut ipu = ipu;
    let wires = ipu.stop_wires();
    drop(ipu);
    drop(star);
    drop(direct);
    let load_after = loadavg();
    let med = |i: usize| ringside_stats::median(&results[i]).context("no trial");
    let (d, b, w) = (med(0)?, med(1)?, med(2)?);
    if wires.iter().any(|r| r.is_none_or(|r| r.to_fabric == 0 || r.to_host == 0)) {
        bail!("an IPU forwarder did not report forwarding in both directions: {wires:?}; the ipu path did not cross it");
    }
    println!(
        "iperf3 host0→host1, {} streams × {} s, {} offloads, {} rounds (median Gbit/s): direct {d:.3}, bridge {b:.3}, ipu {w:.3}; ipu/direct {:.3}, ipu/bridge {:.3}",
        o.streams,
        o.seconds,
        if offloads { "with" } else { "without" },
        o.rounds,
        w / d,
        w / b
    );
    println!("forwarders: {wires:?}");
    println!("loadavg before {load_before}, after {load_after}; {:.0} s", started.elapsed().as_secs_f64());
    let report = json!({
        "tool": "cargo xtask bench ipuwire",
        "machine": machine(),
        "streams": o.streams,
        "seconds": o.seconds,
        "offloads": offloads,
        "rounds": o.rounds,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "direct_gbit_s_median": d,
        "bridge_gbit_s_median": b,
        "ipu_gbit_s_median": w,
        "ipu_over_direct": w / d,
        "ipu_over_bridge": w / b,
        "forwarders": wires,
        "trials": trials,
    });
    let dir = crate::util::workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("ipuwire.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n").with_context(|| format!("write {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

/// One iperf3 trial: receiver-side Gbit/s and sender retransmissions. Retries (bounded) while the
/// server is still starting.
fn iperf(p: &Path<'_>, o: &Opts, stop: &AtomicBool) -> Result<(f64, u64)> {
    let mut last_err = String::new();
    for _attempt in 0..20 {
        check_stop(stop)?;
        let mut c = p.client.command("timeout");
        let limit = (o.seconds + 15).to_string();
        c.args([&limit, "iperf3", "-c", &p.addr.to_string(), "-p", &PORT.to_string(), "-J"])
            .args(["-t", &o.seconds.to_string(), "-P", &o.streams.to_string()]);
        let out = c.output().with_context(|| format!("starting iperf3 -c on the {} path", p.name))?;
        match serde_json::from_slice::<Value>(&out.stdout) {
            Ok(v) if v.get("error").is_none() && out.status.success() => {
                let bps = v["end"]["sum_received"]["bits_per_second"].as_f64().context("iperf3 JSON without end.sum_received")?;
                let retrans = v["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
                return Ok((bps / 1e9, retrans));
            }
            Ok(v) => last_err = v.get("error").map_or(out.status.to_string(), Value::to_string),
            Err(_) => last_err = format!("{} {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        }
        thread::sleep(Duration::from_millis(250));
    }
    bail!("iperf3 -c {} ({} path) failed 20 times: {last_err}", p.addr, p.name)
}

fn check_stop(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted; tearing down");
    }
    Ok(())
}

/// Kills the child (and reaps it) when dropped.
struct ChildGuard(Option<std::process::Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
