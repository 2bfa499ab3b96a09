//! `cargo xtask bench overhead`: what the monitor costs tenant traffic end to end.
//!
//! A 2-host namespace star (h0, h1 on one bridge); iperf3 runs h0 → h1 with several parallel
//! streams for a few seconds per trial. Trials alternate between "monitor attached" (the release
//! `ringside` agent in the switch namespace, attached to both bridge ports, matching the iperf3
//! port: every data segment and ACK passes `flowmon` twice, once per port, and the agent polls the
//! maps as in production) and "detached" (no agent, no program). The order inside a round
//! alternates too, so neither side always runs second. Reports the median throughput of each side
//! and the share lost, with the load average before and after, and writes
//! `target/bench/overhead.json`.
//!
//! Only the ratio of medians measured in the same run means anything on a shared machine.
use std::{
    process::Stdio,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use testbed::{Star, StarConfig};

use crate::{
    agent::{Agent, AgentSpec},
    eval::{loadavg, machine, release_binaries},
};

/// Options of `cargo xtask bench overhead`.
#[derive(Args, Clone, Copy, Debug)]
pub struct Opts {
    /// Trials per side (attached / detached); the medians are compared.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// Seconds of iperf3 traffic per trial.
    #[arg(long, default_value_t = 4)]
    pub seconds: u32,
    /// iperf3 parallel streams (-P).
    #[arg(long, default_value_t = 4)]
    pub streams: u32,
    /// Turn TSO/GSO/GRO off on the rig's veths: the monitor then sees MTU-sized segments, the
    /// worst case per byte (with offloads on, it sees 64 KiB super-packets).
    #[arg(long)]
    pub no_offloads: bool,
    /// Use the release binaries already built (skip `cargo xtask build --release`).
    #[arg(long)]
    pub no_build: bool,
}

/// The iperf3 server port; the agent's `[match] tcp_ports` covers it.
const PORT: u16 = 5301;
const AGENT_LISTEN: &str = "127.0.0.1:9464";
/// The target: at most this share of throughput lost with the monitor attached.
const TARGET_LOSS: f64 = 0.02;

pub fn run(o: Opts) -> Result<()> {
    if o.rounds == 0 || o.seconds == 0 || o.streams == 0 {
        bail!("--rounds, --seconds and --streams must be at least 1");
    }
    testbed::require_root().context("bench overhead runs network namespaces and attaches eBPF programs")?;
    let (ringside, _) = release_binaries(o.no_build)?;
    let stop = testbed::signals::stop_flag();
    let load_before = loadavg();
    let started = Instant::now();
    let star = Star::new(StarConfig { hosts: 2, offloads: !o.no_offloads, ..Default::default() })?;
    let server_addr = star.hosts[1].addr.to_string();
    let mut srv = star.hosts[1].ns.command("iperf3");
    srv.args(["-s", "-B", &server_addr, "-p", &PORT.to_string()]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let _server = ChildGuard(Some(srv.spawn().context("starting iperf3 -s in h1")?));
    let logs = crate::util::workspace_root().join("target/bench");
    std::fs::create_dir_all(&logs)?;
    let config = format!("[match]\ntcp_ports = [{PORT}]\n");

    let mut attached = Vec::new();
    let mut detached = Vec::new();
    let mut trials = Vec::new();
    for round in 0..o.rounds {
        // ABBA: attached first on even rounds, detached first on odd ones.
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for with_monitor in order {
            check_stop(stop)?;
            let agent = if with_monitor {
                let mut a = Agent::start(
                    &star.switch,
                    &AgentSpec {
                        bin: &ringside,
                        ifaces: star.hosts.iter().map(|h| h.switch_port.clone()).collect(),
                        listen: AGENT_LISTEN.into(),
                        config_toml: config.clone(),
                        tag: "bench-overhead".into(),
                        log: Some(logs.join("overhead-agent.log")),
                    },
                )?;
                a.wait_ready(Duration::from_secs(30))?;
                Some(a)
            } else {
                None
            };
            let (gbit, retrans) = iperf(&star, &server_addr, o, stop)?;
            let matched = match &agent {
                // Proof the monitor was really in the path: it counted the iperf3 flows.
                Some(a) => Some(matched_packets(a)?),
                None => None,
            };
            drop(agent);
            println!(
                "  round {round} monitor {:<8} {gbit:7.3} Gbit/s  retransmits {retrans:>6}{}",
                if with_monitor { "attached" } else { "detached" },
                matched.map_or(String::new(), |m| format!("  flowmon matched {m} packets"))
            );
            if let Some(0) = matched {
                bail!("the agent was attached but matched no packet: the monitor was not in the path; see target/bench/overhead-agent.log");
            }
            if with_monitor { attached.push(gbit) } else { detached.push(gbit) }
            trials.push(json!({ "round": round, "monitor": with_monitor, "gbit_s": gbit, "retransmits": retrans, "matched_packets": matched }));
        }
    }
    drop(_server);
    drop(star);
    let load_after = loadavg();
    let with = ringside_stats::median(&attached).context("no attached trial")?;
    let without = ringside_stats::median(&detached).context("no detached trial")?;
    let loss = 1.0 - with / without;
    let met = loss <= TARGET_LOSS;
    println!(
        "iperf3 h0→h1, {} streams × {} s, {} offloads, {} rounds: detached {without:.3} Gbit/s, attached {with:.3} Gbit/s (median), ratio {:.4}, lost {:.2} % (target ≤ {:.0} %: {})",
        o.streams,
        o.seconds,
        if o.no_offloads { "without" } else { "with" },
        o.rounds,
        with / without,
        loss * 100.0,
        TARGET_LOSS * 100.0,
        if met { "met" } else { "NOT MET" }
    );
    println!("loadavg before {load_before}, after {load_after}; {:.0} s", started.elapsed().as_secs_f64());
    let report = json!({
        "tool": "cargo xtask bench overhead",
        "machine": machine(),
        "streams": o.streams,
        "seconds": o.seconds,
        "offloads": !o.no_offloads,
        "rounds": o.rounds,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "detached_gbit_s_median": without,
        "attached_gbit_s_median": with,
        "ratio": with / without,
        "lost_fraction": loss,
        "target_lost_fraction": TARGET_LOSS,
        "within_target": met,
        "trials": trials,
    });
    let out = logs.join("overhead.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n").with_context(|| format!("write {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

/// One iperf3 trial: receiver-side Gbit/s and sender retransmissions. Retries (bounded) while the
/// server is still starting.
fn iperf(star: &Star, server: &str, o: Opts, stop: &AtomicBool) -> Result<(f64, u64)> {
    let mut last_err = String::new();
    for _attempt in 0..20 {
        check_stop(stop)?;
        let mut c = star.hosts[0].ns.command("timeout");
        let limit = (o.seconds + 15).to_string();
        c.args([&limit, "iperf3", "-c", server, "-p", &PORT.to_string(), "-J"])
            .args(["-t", &o.seconds.to_string(), "-P", &o.streams.to_string()]);
        let out = c.output().context("starting iperf3 -c in h0")?;
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
    bail!("iperf3 -c {server} failed 20 times: {last_err}")
}

/// `ringside_dataplane_packets_total{result="matched"}` summed over the agent's interfaces.
fn matched_packets(agent: &Agent) -> Result<u64> {
    let text = agent.get("/metrics")?;
    let mut sum = 0u64;
    let mut found = false;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else { continue };
        if name.starts_with("ringside_dataplane_packets_total{") && name.contains("result=\"matched\"") {
            sum += value.parse::<f64>().with_context(|| format!("bad sample {line:?}"))? as u64;
            found = true;
        }
    }
    if !found {
        bail!("the agent's /metrics has no ringside_dataplane_packets_total{{result=\"matched\"}} sample");
    }
    Ok(sum)
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
