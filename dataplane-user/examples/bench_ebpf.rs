//! Cost of the flow monitor per packet, measured in the kernel with `BPF_PROG_TEST_RUN`.
//!
//! For each case, `flowmon` and the empty `noop` classifier run on the same frame `--repeat` times
//! per round; rounds interleave the programs and the cases so drift (frequency scaling, other
//! load) hits all of them alike. The kernel reports the mean ns per run (net/bpf/test_run.c,
//! bpf_test_timer), which includes the test loop's own overhead: subtracting `noop` leaves what the
//! monitor adds. Reports the median over rounds, prints a table and writes JSON.
//!
//! Cases: a matched TCP data segment, a matched RoCEv2 RDMA WRITE, and an unmatched TCP segment
//! (the config's port range does not cover it). The same frame repeats, so the matched cases take
//! the "existing flow, same burst" path that dominates real traffic (for TCP the repeated sequence
//! number also exercises the retransmission branch, for RoCEv2 the out-of-order branch).
//!
//! Needs root. Run: `RINGSIDE_EBPF_OBJECT=target/ebpf/bpfel-unknown-none/release/flowmon
//! cargo run --release -p dataplane-user --example bench_ebpf -- --out target/bench/ebpf.json`
use std::{fs, path::PathBuf};

use anyhow::{bail, Context, Result};
use aya::{
    maps::{Array, MapData},
    programs::SchedClassifier,
    EbpfLoader,
};
use clap::Parser;
use dataplane_common::{maps, programs, wire, Config, PortRange};
use dataplane_user::{
    frames,
    testrun::{self, SkbContext},
};
use serde::Serialize;

/// Per-packet cost of the ringside eBPF flow monitor vs an empty classifier.
#[derive(Parser, Debug)]
struct Args {
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/bench/ebpf.json")]
    out: PathBuf,
    /// Runs per measurement (one BPF_PROG_TEST_RUN call).
    #[arg(long, default_value_t = 1_000_000)]
    repeat: u32,
    /// Interleaved rounds; the median is reported.
    #[arg(long, default_value_t = 9)]
    rounds: usize,
    /// Load this flowmon object file instead of the embedded one (A/B comparisons of builds).
    #[arg(long)]
    object: Option<PathBuf>,
}

struct Case {
    name: &'static str,
    frame: Vec<u8>,
    /// Target for the delta over noop (from the issue).
    target_ns: f64,
}

#[derive(Serialize)]
struct CaseReport {
    case: &'static str,
    frame_bytes: usize,
    noop_ns_median: f64,
    flowmon_ns_median: f64,
    delta_ns_median: f64,
    target_delta_ns: f64,
    within_target: bool,
    noop_ns_rounds: Vec<u32>,
    flowmon_ns_rounds: Vec<u32>,
    delta_ns_rounds: Vec<i64>,
}

#[derive(Serialize)]
struct Report {
    tool: &'static str,
    kernel: String,
    cpu: usize,
    repeat: u32,
    rounds: usize,
    cases: Vec<CaseReport>,
}

const NCCL_PORT: u16 = 29500;

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.rounds == 0 || args.repeat == 0 {
        bail!("--rounds and --repeat must be at least 1");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench_ebpf loads eBPF programs and runs BPF_PROG_TEST_RUN: run it as root (e.g. `cargo xtask bench`)");
    }
    let mut ebpf = match &args.object {
        Some(path) => EbpfLoader::new().load_file(path).with_context(|| format!("load {}", path.display()))?,
        None => {
            let object = dataplane_user::object::flowmon_object()
                .context("set RINGSIDE_EBPF_OBJECT to the built flowmon object")?;
            EbpfLoader::new().load(object).context("load the flowmon object")?
        }
    };
    for name in [programs::FLOWMON, programs::NOOP] {
        let prog: &mut SchedClassifier = ebpf.program_mut(name).context("program missing")?.try_into()?;
        prog.load().with_context(|| format!("verifier rejected {name}"))?;
    }
    let mut config = Config::default();
    config.n_port_ranges = 1;
    config.port_ranges[0] = PortRange { lo: NCCL_PORT, hi: NCCL_PORT + 10, protocol: 0, _pad: [0; 3] };
    {
        let mut cfg: Array<&mut MapData, Config> = Array::try_from(ebpf.map_mut(maps::CONFIG).context("CONFIG")?)?;
        cfg.set(0, config, 0)?;
    }

    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() }.max(0) as usize;
    testrun::pin_current_thread(cpu)?;

    let a = [10, 0, 0, 1];
    let b = [10, 0, 0, 2];
    let cases = [
        Case {
            name: "tcp_matched",
            frame: frames::tcp4(a, b, 40000, NCCL_PORT, 1, 1, wire::TCP_ACK | wire::TCP_PSH, 0x02, &[0x5a; 1448]),
            target_ns: 100.0,
        },
        Case {
            name: "rocev2_matched",
            frame: frames::rocev2_4(a, b, 50000, wire::bth_opcode::RC_RDMA_WRITE_MIDDLE, 0x11, 7, &[], &[0xab; 1024]),
            target_ns: 100.0,
        },
        Case {
            name: "unmatched",
            frame: frames::tcp4(a, b, 22, 40000, 1, 1, wire::TCP_ACK | wire::TCP_PSH, 0, &[0x5a; 1448]),
            target_ns: 20.0,
        },
    ];

    let flowmon: &SchedClassifier = ebpf.program(programs::FLOWMON).unwrap().try_into()?;
    let noop: &SchedClassifier = ebpf.program(programs::NOOP).unwrap().try_into()?;
    let ctx = SkbContext::ingress();
    let measure = |prog: &SchedClassifier, frame: &[u8]| -> Result<u32> {
        let out = testrun::run(prog, frame, Some(&ctx), args.repeat)?;
        Ok(out.duration.as_nanos() as u32)
    };
    // Warm up: create the flows, fault in the maps, settle the CPU frequency.
    for c in &cases {
        measure(flowmon, &c.frame)?;
        measure(noop, &c.frame)?;
    }

    let mut noop_ns = vec![Vec::new(); cases.len()];
    let mut flowmon_ns = vec![Vec::new(); cases.len()];
    for round in 0..args.rounds {
        for (i, c) in cases.iter().enumerate() {
            // Alternate the order each round so neither program always runs on a warmer cache.
            if round % 2 == 0 {
                noop_ns[i].push(measure(noop, &c.frame)?);
                flowmon_ns[i].push(measure(flowmon, &c.frame)?);
            } else {
                flowmon_ns[i].push(measure(flowmon, &c.frame)?);
                noop_ns[i].push(measure(noop, &c.frame)?);
            }
        }
    }

    let mut reports = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let n: Vec<f64> = noop_ns[i].iter().map(|&x| f64::from(x)).collect();
        let f: Vec<f64> = flowmon_ns[i].iter().map(|&x| f64::from(x)).collect();
        let d: Vec<f64> = f.iter().zip(&n).map(|(f, n)| f - n).collect();
        let delta = median(&d);
        reports.push(CaseReport {
            case: c.name,
            frame_bytes: c.frame.len(),
            noop_ns_median: median(&n),
            flowmon_ns_median: median(&f),
            delta_ns_median: delta,
            target_delta_ns: c.target_ns,
            within_target: delta <= c.target_ns,
            noop_ns_rounds: noop_ns[i].clone(),
            flowmon_ns_rounds: flowmon_ns[i].clone(),
            delta_ns_rounds: d.iter().map(|&x| x as i64).collect(),
        });
    }

    println!("flowmon vs noop, BPF_PROG_TEST_RUN, repeat {} x {} rounds, CPU {cpu} (median ns/packet)", args.repeat, args.rounds);
    println!("{:<16} {:>7} {:>9} {:>11} {:>10} {:>8}", "case", "bytes", "noop", "flowmon", "delta", "target");
    for r in &reports {
        println!(
            "{:<16} {:>7} {:>9.1} {:>11.1} {:>10.1} {:>6}{}",
            r.case,
            r.frame_bytes,
            r.noop_ns_median,
            r.flowmon_ns_median,
            r.delta_ns_median,
            format!("≤{}", r.target_delta_ns),
            if r.within_target { "" } else { "  OVER" }
        );
    }

    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let report = Report { tool: "bench_ebpf", kernel, cpu, repeat: args.repeat, rounds: args.rounds, cases: reports };
    if let Some(dir) = args.out.parent() {
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("write {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}
