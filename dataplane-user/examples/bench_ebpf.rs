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
//! A/B comparisons of builds: give `--object PATH` several times; every object's `flowmon` and
//! `noop` then run interleaved in the same rounds, and each object's delta is reported (the
//! machine is shared and noisy: only deltas measured in the same run are comparable).
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
use ringside_test_support::{
    frames,
    testrun::{self, SkbContext},
};
use ringside_stats::median;
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
    /// Load this flowmon object file instead of the embedded one; repeat the option to compare
    /// several builds in the same interleaved rounds.
    #[arg(long)]
    object: Vec<PathBuf>,
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
    /// `/proc/loadavg` before and after the run.
    loadavg_before: String,
    loadavg_after: String,
    /// The first (or only) object's results.
    cases: Vec<CaseReport>,
    /// With several `--object`s: every object's results, in the order given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    variants: Vec<VariantReport>,
}

#[derive(Serialize)]
struct VariantReport {
    object: String,
    cases: Vec<CaseReport>,
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string()
}

/// Loads an object (or the embedded one), loads both programs and writes the benchmark config.
fn load(object: Option<&PathBuf>, config: Config) -> Result<aya::Ebpf> {
    let mut ebpf = match object {
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
    let mut cfg: Array<&mut MapData, Config> = Array::try_from(ebpf.map_mut(maps::CONFIG).context("CONFIG")?)?;
    cfg.set(0, config, 0)?;
    Ok(ebpf)
}

const NCCL_PORT: u16 = 29500;

fn main() -> Result<()> {
    let args = Args::parse();
    if args.rounds == 0 || args.repeat == 0 {
        bail!("--rounds and --repeat must be at least 1");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench_ebpf loads eBPF programs and runs BPF_PROG_TEST_RUN: run it as root (e.g. `cargo xtask bench`)");
    }
    let loadavg_before = loadavg();
    let mut config = Config::default();
    config.n_port_ranges = 1;
    config.port_ranges[0] = PortRange { lo: NCCL_PORT, hi: NCCL_PORT + 10, protocol: 0, _pad: [0; 3] };
    let objects: Vec<Option<&PathBuf>> =
        if args.object.is_empty() { vec![None] } else { args.object.iter().map(Some).collect() };
    let mut loaded = Vec::new();
    for o in &objects {
        let label = o.map_or_else(|| "embedded".to_string(), |p| p.display().to_string());
        loaded.push((label, load(*o, config)?));
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

    let mut progs: Vec<(&SchedClassifier, &SchedClassifier)> = Vec::new();
    for (_, ebpf) in &loaded {
        let flowmon: &SchedClassifier = ebpf.program(programs::FLOWMON).unwrap().try_into()?;
        let noop: &SchedClassifier = ebpf.program(programs::NOOP).unwrap().try_into()?;
        progs.push((flowmon, noop));
    }
    let ctx = SkbContext::ingress();
    let measure = |prog: &SchedClassifier, frame: &[u8]| -> Result<u32> {
        let out = testrun::run(prog, frame, Some(&ctx), args.repeat)?;
        Ok(out.duration.as_nanos() as u32)
    };
    // Warm up: create the flows, fault in the maps, settle the CPU frequency.
    for &(flowmon, noop) in &progs {
        for c in &cases {
            measure(flowmon, &c.frame)?;
            measure(noop, &c.frame)?;
        }
    }

    let nv = progs.len();
    // [variant][case] -> one sample per round
    let mut noop_ns = vec![vec![Vec::new(); cases.len()]; nv];
    let mut flowmon_ns = vec![vec![Vec::new(); cases.len()]; nv];
    for round in 0..args.rounds {
        for (i, c) in cases.iter().enumerate() {
            for k in 0..nv {
                // Rotate the variants and alternate the program order each round, so no variant
                // and neither program always runs on a warmer cache.
                let v = (k + round) % nv;
                let (flowmon, noop) = progs[v];
                if round % 2 == 0 {
                    noop_ns[v][i].push(measure(noop, &c.frame)?);
                    flowmon_ns[v][i].push(measure(flowmon, &c.frame)?);
                } else {
                    flowmon_ns[v][i].push(measure(flowmon, &c.frame)?);
                    noop_ns[v][i].push(measure(noop, &c.frame)?);
                }
            }
        }
    }

    let mut variants = Vec::new();
    for (v, (label, _)) in loaded.iter().enumerate() {
        variants.push(VariantReport { object: label.clone(), cases: case_reports(&cases, &noop_ns[v], &flowmon_ns[v]) });
    }

    println!("flowmon vs noop, BPF_PROG_TEST_RUN, repeat {} x {} rounds, CPU {cpu} (median ns/packet)", args.repeat, args.rounds);
    println!("loadavg before: {loadavg_before}");
    for v in &variants {
        if nv > 1 {
            println!("object {}", v.object);
        }
        print_table(&v.cases);
    }
    let loadavg_after = loadavg();
    println!("loadavg after:  {loadavg_after}");

    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let cases_first = case_reports(&cases, &noop_ns[0], &flowmon_ns[0]);
    let report = Report {
        tool: "bench_ebpf",
        kernel,
        cpu,
        repeat: args.repeat,
        rounds: args.rounds,
        loadavg_before,
        loadavg_after,
        cases: cases_first,
        variants: if nv > 1 { variants } else { Vec::new() },
    };
    if let Some(dir) = args.out.parent() {
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    fs::write(&args.out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("write {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}

fn case_reports(cases: &[Case], noop_ns: &[Vec<u32>], flowmon_ns: &[Vec<u32>]) -> Vec<CaseReport> {
    let mut reports = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let n: Vec<f64> = noop_ns[i].iter().map(|&x| f64::from(x)).collect();
        let f: Vec<f64> = flowmon_ns[i].iter().map(|&x| f64::from(x)).collect();
        let d: Vec<f64> = f.iter().zip(&n).map(|(f, n)| f - n).collect();
        // Samples are never empty: `--rounds` is at least 1.
        let delta = median(&d).unwrap_or(f64::NAN);
        reports.push(CaseReport {
            case: c.name,
            frame_bytes: c.frame.len(),
            noop_ns_median: median(&n).unwrap_or(f64::NAN),
            flowmon_ns_median: median(&f).unwrap_or(f64::NAN),
            delta_ns_median: delta,
            target_delta_ns: c.target_ns,
            within_target: delta <= c.target_ns,
            noop_ns_rounds: noop_ns[i].clone(),
            flowmon_ns_rounds: flowmon_ns[i].clone(),
            delta_ns_rounds: d.iter().map(|&x| x as i64).collect(),
        });
    }
    reports
}

fn print_table(reports: &[CaseReport]) {
    println!("{:<16} {:>7} {:>9} {:>11} {:>10} {:>8}", "case", "bytes", "noop", "flowmon", "delta", "target");
    for r in reports {
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
}
