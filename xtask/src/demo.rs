//! `cargo xtask demo`: see ringside work in one command.
//!
//! Brings up a 4-host star (network namespaces around a bridge), starts the agent in the switch
//! namespace attached to every bridge port (the view a DPU or ToR tap has), runs the emulated
//! training job (4 ranks, ring allreduce over TCP) plus a RoCEv2 stream with deliberate PSN gaps and
//! CNPs, shows the agent's live flow table, its status and detection events, then a sample of
//! /metrics, and tears everything down (also on Ctrl-C: the rig is dropped, the agent gets SIGINT
//! and detaches).
use std::{
    sync::atomic::Ordering,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use testbed::{JobConfig, RoceSpec, Star, StarConfig};

use crate::{
    agent::{Agent, AgentSpec},
    build, setup,
    util::{cargo, sh},
};

const AGENT_ADDR: &str = "127.0.0.1:9464";
const JOB_PORT: u16 = 29500;

pub fn run(seconds: u64) -> Result<()> {
    testbed::require_root().context("the demo creates network namespaces and loads eBPF programs")?;
    setup::run()?;
    build::all(false)?;
    // The rank does the reductions: a debug build would make the job compute-bound on additions.
    sh(cargo().args(["build", "--release", "-p", "ipu-firmware", "--bin", "ringside-rank"]))?;
    let ringside = build::bin_path("ringside", false);
    let rank_bin = build::bin_path("ringside-rank", true);
    let stop = testbed::signals::stop_flag();

    println!("\n==> bringing up a 4-host star testbed (network namespaces + bridge)");
    let star = Star::new(StarConfig { hosts: 4, ..Default::default() })?;
    for (i, h) in star.hosts.iter().enumerate() {
        println!("    h{i}  {:<15} netns {}  (bridge port {})", h.addr, h.ns.name(), h.switch_port);
    }

    println!("\n==> starting the agent in the switch namespace on p0..p3 (ingress + egress)");
    let mut agent = Agent::start(
        &star.switch,
        &AgentSpec {
            bin: &ringside,
            ifaces: star.hosts.iter().map(|h| h.switch_port.clone()).collect(),
            listen: AGENT_ADDR.into(),
            config_toml: "# demo: count the job's TCP ports inside the testbed prefix; RoCEv2 always counts\n\
                          [match]\ntcp_ports = [\"29500-29599\"]\nprefixes = [\"10.77.0.0/24\"]\n"
                .into(),
            tag: "demo".into(),
            log: None,
        },
    )?;
    agent.wait_ready(Duration::from_secs(20))?;
    println!("    agent ready: http://{AGENT_ADDR} inside netns {}", star.switch.name());

    println!("\n==> emulated training job: 4 ranks, 4 MiB ring allreduce per step, 60 ms compute");
    let job = testbed::spawn_job(
        &star,
        &JobConfig {
            ranks: 4,
            size: testbed::ByteSize(4 << 20),
            steps: (seconds * 1000 / 150).max(10) as u32,
            compute_ms: 60,
            algorithm: Some("ring".into()),
            rank_bin: Some(rank_bin),
            port: JOB_PORT,
            timeout: Duration::from_secs(seconds + 120),
            ..Default::default()
        },
    )?;
    println!("==> RoCEv2 stream h3 -> h1: 20000 packets, PSNs 100-102 and 7000 skipped, 25 CNPs, 40 CE marks");
    let (h3, h1_addr) = (&star.hosts[3].ns, star.hosts[1].addr);
    let roce = h3.try_run(move || {
        testbed::roce_send(&RoceSpec {
            to: (h1_addr, testbed::ROCEV2_UDP_PORT).into(),
            src_port: 49152,
            packets: 20_000,
            skip_psns: vec![100, 101, 102, 7000],
            cnps: 25,
            ce_marks: 40,
            pps: Some(20_000 / seconds.max(1)),
            ..Default::default()
        })
    });

    let started = Instant::now();
    for tick in 1..=seconds {
        if stop.load(Ordering::SeqCst) {
            bail!("interrupted; the testbed is torn down");
        }
        thread::sleep((started + Duration::from_secs(tick)).saturating_duration_since(Instant::now()));
        println!("\n--- t = {tick} s: `ringside flows --limit 8` ---");
        let out = star.switch.command(&ringside).args(["flows", "--limit", "8"]).arg("--state-dir").arg(agent.state_dir()).output()?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }

    let roce = roce.context("cannot enter h3's namespace")??;
    println!(
        "\n==> the RoCEv2 sender counted: {} data packets, {} PSN gaps ({} PSNs skipped), {} CNPs, {} CE",
        roce.data_packets, roce.psn_gaps, roce.skipped_psns, roce.cnps, roce.ce_marked
    );
    let report = job.wait(Some(stop))?;
    println!(
        "==> job: {} ranks, step time mean {:.1} ms (p99 {:.1}), communication mean {:.1} ms",
        report.ranks.len(),
        report.step_ms.mean,
        report.step_ms.p99,
        report.comm_ms.mean
    );

    for (title, args) in [
        ("`ringside status`", &["status"][..]),
        // The RoCEv2 stream's skipped PSNs are losses on h3's path, so a gray failure names h3.
        ("`ringside events --all` (detection verdicts)", &["events", "--all"][..]),
    ] {
        println!("\n--- {title} ---");
        let out = star.switch.command(&ringside).args(args).arg("--state-dir").arg(agent.state_dir()).output()?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }

    println!("\n--- a sample of GET /metrics ---");
    let metrics = agent.get("/metrics")?;
    let wanted = ["ringside_dataplane_packets_total", "ringside_peer_", "ringside_flows"];
    for line in metrics.lines().filter(|l| wanted.iter().any(|w| l.starts_with(w))).take(30) {
        println!("{line}");
    }

    println!("\n==> tearing down (agent detaches, namespaces deleted)");
    drop(agent);
    drop(star);
    println!("done. Next: `cargo xtask test`, docs/operator-guide.md");
    Ok(())
}
