//! `cargo xtask eval detection`: the detection scenario matrix of issue 4, measured end to end on
//! the testbed with the real agent and the emulated training job, scored against the testbed's
//! fault log.
//!
//! Vantage (the same as the T2 detection tests): the agent runs in the switch namespace of a
//! 6-host star, attached to every bridge port, so each port's flows have the host cabled to it as
//! their peer; the job is 6 ranks (ring allreduce, 4 MiB, 50 ms compute) on the 6 hosts. Uplink
//! congestion needs a shared link: a 2×3 leaf-spine, job ranks on hosts 0,1 (leaf 0) and 3,4
//! (leaf 1), one agent per leaf namespace attached to its host ports and its uplink, the faulted
//! leaf's uplink capped from the start (the fabric's bottleneck), and the fault is unbounded cross
//! traffic (4 TCP streams, port not in the job's match) from the faulted leaf's spare host to the
//! other leaf's spare host.
//!
//! IPU vantage (`--vantage ipu`, issue 12): the star becomes a `testbed::IpuStar` (each host
//! behind its own IPU namespace running the eBPF redirect forwarder) and an agent runs in every
//! IPU on its `fabric` port, seeing only its own host's traffic; faults go on the IPUs' fabric
//! cables (`h<i>`); the agents' events are judged together before scoring, by the provider's
//! fleet view ([`fleet_ipu_events`], `ringside fleet`'s code, stragglers included). The
//! leaf-spine has no IPUs, so `uplink-congestion` runs at the switch vantage only.
//!
//! One run: rig up → agent(s) ready → job starts → healthy warm-up (+ 0–2 s jitter) → fault
//! injected (its start is the testbed's record) → fault held → fault cleared (end recorded) →
//! cool-down → `GET /v1/events?state=all` → everything torn down (RAII, also on Ctrl-C).
//! The compute straggler is a job parameter, so it is active from the job's start (recorded so).
//!
//! Scoring (per scenario, over its runs): an event *matches* a fault when it is a network-fault
//! event (congestion, gray_failure) raised in [fault start, fault end + grace]; the straggler
//! "fault" is matched by straggler events only. Detection latency = first matching event's
//! `raised_unix_ms` − fault start. Precision = network events that match a fault in time and name
//! the faulted place / all network events (events raised in warm-ups, after the grace, on a
//! straggler run, or blaming a healthy neighbour are false); also reported in time only. Recall = faults
//! with a matching event / faults. Localization = detected faults with a matching event that names
//! the faulted place (peer = the faulted host's address or link = its bridge port `p<i>`; for the
//! uplink a link-scoped event on the faulted leaf's `uplink`), plus the per-event share. False
//! alarms per hour: network events raised in healthy time (healthy runs and all warm-ups) per hour
//! of healthy time.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use ringside_stats::quantile;
use serde_json::{json, Value};
use testbed::{
    ByteSize, CrossTrafficSpec, FaultRecord, FlapSpec, IpuStar, IpuStarConfig, JobConfig, LeafSpine, LeafSpineConfig, MpiAlgorithm, MpiConfig, Rig, RunningJob, Star,
    StarConfig, TorchConfig, IPU_FABRIC_PORT,
};

use crate::{
    agent::{Agent, AgentSpec},
    eval::{loadavg, machine, measure_capacity, now_ms, pick, release_binaries, send_rate_mbit, sleep_checked, RATE_SAMPLES},
    util::workspace_root,
};

const STAR_HOSTS: usize = 6;
const JOB_PORT: u16 = 29500;
const AGENT_LISTEN: &str = "127.0.0.1:9464";
/// An event raised up to this long after the fault ended still counts as detecting it.
const GRACE_MS: u64 = 3000;
const STRAGGLER_EXTRA_MS: u64 = 60;
const LEAF_HOSTS: usize = 3;

/// Options of `cargo xtask eval detection`.
#[derive(clap::Args, Clone, Debug)]
pub struct Opts {
    /// Runs per scenario (each with its own target host/link/rank and injection time).
    #[arg(long, default_value_t = 2)]
    pub repeats: u32,
    /// Smoke run (~3 minutes): one run per scenario, shorter phases.
    #[arg(long)]
    pub quick: bool,
    /// Run only this scenario (see the list in `--help` of `eval`; repeatable).
    #[arg(long = "scenario")]
    pub scenarios: Vec<String>,
    /// Traffic source (repeatable; default: all three): `rank` (ringside's emulated job),
    /// `openmpi` (OpenMPI's MPI_Allreduce; run i of a scenario uses its i-th coll_tuned algorithm
    /// of default, ring, segmented_ring, recursive_doubling, rabenseifner, so --repeats 5 covers
    /// each), `openmpi-ALGORITHM` (one algorithm only, its name with hyphens:
    /// `openmpi-recursive-doubling`), `torch` (PyTorch DDP over gloo).
    #[arg(long = "source", value_name = "SOURCE")]
    pub sources: Vec<String>,
    /// Where the agents watch from (repeatable; default `switch`): `switch` (one agent in the
    /// star's switch namespace on every bridge port), `ipu` (an `IpuStar`: one agent in every
    /// host's IPU namespace on its `fabric` port, each seeing only its own host's traffic; their
    /// events are merged for scoring). Several vantages run interleaved, scenario by scenario,
    /// so they share the machine's load. `uplink-congestion` has no IPU rig and runs only at the
    /// switch vantage.
    #[arg(long = "vantage", value_name = "VANTAGE")]
    pub vantages: Vec<String>,
    /// Seed of the target and injection-time choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Healthy warm-up before the fault, seconds (default 12, --quick 6).
    #[arg(long)]
    pub warmup_s: Option<u64>,
    /// How long each fault is held, seconds (default 15, --quick 8).
    #[arg(long)]
    pub fault_s: Option<u64>,
    /// Length of each healthy run, seconds (default 60, --quick 15). 600 checks the
    /// "no false alarm in a 10-minute healthy run" target in one run.
    #[arg(long)]
    pub healthy_s: Option<u64>,
    /// Write docs/eval-detection.md even for a --quick or --scenario run (default: only for the
    /// full matrix).
    #[arg(long)]
    pub write_docs: bool,
    /// Skip `cargo xtask setup` and the builds (binaries must exist).
    #[arg(long)]
    pub no_build: bool,
    /// Where the report, plots and logs go (default target/eval); give each of several
    /// evaluations run at once its own.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// The scenario matrix.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    Healthy,
    Loss(f64),
    RateCapQuarter,
    Flap,
    UplinkCongestion,
    Straggler,
}

const ALL: [Scenario; 9] = [
    Scenario::Healthy,
    Scenario::Loss(0.5),
    Scenario::Loss(1.0),
    Scenario::Loss(2.0),
    Scenario::Loss(5.0),
    Scenario::RateCapQuarter,
    Scenario::Flap,
    Scenario::UplinkCongestion,
    Scenario::Straggler,
];

impl Scenario {
    fn name(self) -> String {
        match self {
            Scenario::Healthy => "healthy".into(),
            Scenario::Loss(p) => format!("loss-{p}"),
            Scenario::RateCapQuarter => "ratecap-quarter".into(),
            Scenario::Flap => "flap".into(),
            Scenario::UplinkCongestion => "uplink-congestion".into(),
            Scenario::Straggler => "straggler".into(),
        }
    }
    fn describe(self) -> String {
        match self {
            Scenario::Healthy => "no fault (star, 6 ranks)".into(),
            Scenario::Loss(p) => format!("{p} % random loss both directions on one host link (star)"),
            Scenario::RateCapQuarter => "tbf cap to 1/4 of the rate the job sends at on one host link (star)".into(),
            Scenario::Flap => "host link down 400 ms every 3 s (star)".into(),
            Scenario::UplinkCongestion => "cross traffic through a capped uplink (leaf-spine 2x3)".into(),
            Scenario::Straggler => format!("one rank computes +{STRAGGLER_EXTRA_MS} ms per step (star)"),
        }
    }
    fn is_network_fault(self) -> bool {
        !matches!(self, Scenario::Healthy | Scenario::Straggler)
    }
}

/// Who makes the traffic the agent watches.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Source {
    /// ringside's emulated job (`ringside-rank`, ring allreduce).
    Rank,
    /// OpenMPI; `None`: the algorithm cycles over [`MPI_ALGORITHMS`] with the run's repeat index.
    OpenMpi(Option<MpiAlgorithm>),
    /// PyTorch DDP over gloo.
    Torch,
}

/// The OpenMPI algorithms the `openmpi` source cycles through (basic_linear and nonoverlapping,
/// a reduce then a broadcast through rank 0, are left to `openmpi-ALGORITHM`).
const MPI_ALGORITHMS: [MpiAlgorithm; 5] = [
    MpiAlgorithm::Default,
    MpiAlgorithm::Ring,
    MpiAlgorithm::SegmentedRing,
    MpiAlgorithm::RecursiveDoubling,
    MpiAlgorithm::Rabenseifner,
];

/// First TCP port of OpenMPI's BTL in the evaluation (the agent's job matches its range).
const MPI_PORT_MIN: u16 = 30000;
/// PyTorch's store port; gloo's connections use the range above it (`TorchConfig::port_range`).
const TORCH_PORT: u16 = 29500;

impl Source {
    fn name(self) -> String {
        match self {
            Source::Rank => "rank".into(),
            Source::OpenMpi(None) => "openmpi".into(),
            Source::OpenMpi(Some(a)) => format!("openmpi-{}", a.name().replace('_', "-")),
            Source::Torch => "torch".into(),
        }
    }

    fn all() -> Vec<Source> {
        let mut v = vec![Source::Rank, Source::OpenMpi(None)];
        v.extend(MpiAlgorithm::ALL.map(|a| Source::OpenMpi(Some(a))));
        v.push(Source::Torch);
        v
    }

    /// The OpenMPI algorithm of repeat `rep` of scenario number `sc_index`.
    fn mpi_algorithm(self, sc_index: usize, rep: u32) -> Option<MpiAlgorithm> {
        match self {
            Source::OpenMpi(Some(a)) => Some(a),
            Source::OpenMpi(None) => Some(MPI_ALGORITHMS[(sc_index + rep as usize) % MPI_ALGORITHMS.len()]),
            _ => None,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Source::Rank => "ringside-rank: ringside's own ring allreduce, 4 MiB, 50 ms compute",
            Source::OpenMpi(_) => "OpenMPI 4.1 MPI_Allreduce (TCP BTL, ports 30000-30063), 4 MiB, 50 ms compute sleep",
            Source::Torch => "PyTorch DDP over gloo (CPU), one rank per host, a real model and optimizer",
        }
    }
}

/// Where the agents watch the traffic from.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Vantage {
    /// One agent in the switch namespace on every bridge port: it sees every host's traffic.
    Switch,
    /// One agent in each host's IPU namespace on its `fabric` port (`testbed::IpuStar`): each
    /// sees only its own host's traffic; the agents' events are judged by the fleet view
    /// ([`fleet_ipu_events`]).
    Ipu,
}

impl Vantage {
    const ALL: [Vantage; 2] = [Vantage::Switch, Vantage::Ipu];

    fn name(self) -> &'static str {
        match self {
            Vantage::Switch => "switch",
            Vantage::Ipu => "ipu",
        }
    }

    /// Whether scenario `sc` has a rig at this vantage: the IPU star has no shared uplink, and
    /// the leaf-spine has no IPUs.
    fn runs(self, sc: Scenario) -> bool {
        !(self == Vantage::Ipu && sc == Scenario::UplinkCongestion)
    }
}

/// Phase lengths of one run.
#[derive(Clone, Copy, Debug)]
struct Phases {
    warmup: Duration,
    fault: Duration,
    cooldown: Duration,
    healthy: Duration,
}

/// splitmix64: reproducible choices without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Where the ground truth says the fault is.
#[derive(Clone, Debug)]
enum Place {
    /// Host access link: (the agent that sees it, host address, bridge port name).
    HostLink { agent: usize, addr: String, port: String },
    /// IPU `host`'s fabric cable, at the IPU vantage: named by an event whose merged named host
    /// ([`fleet_ipu_events`], [`merge_ipu_events`]: a peer's address, or the own host of an IPU
    /// whose link-scoped event it is) is the faulted host's address.
    IpuLink { addr: String },
    /// Leaf uplink: the faulted leaf's agent and the uplink's interface name there.
    Uplink { agent: usize, iface: String },
    /// A straggler rank's host.
    Host { addr: String },
    None,
}

/// What one run produced.
struct RunResult {
    scenario: Scenario,
    source: Source,
    vantage: Vantage,
    /// The OpenMPI algorithm of this run, if any.
    algorithm: Option<MpiAlgorithm>,
    repeat: u32,
    target: String,
    place: Place,
    /// The scored fault (None for healthy runs).
    fault: Option<FaultRecord>,
    /// Every record of the rig's fault log (including setup conditions like the uplink cap).
    fault_log: Vec<FaultRecord>,
    /// (agent index, event JSON): what is scored. At the IPU vantage, the fleet view's verdicts
    /// over all IPU agents ([`fleet_ipu_events`]; the agent index is the first witness's).
    events: Vec<(usize, Value)>,
    /// At the IPU vantage, every agent's own events before the merge (empty otherwise).
    raw_events: Vec<(usize, Value)>,
    /// At the IPU vantage, the blames the fleet view held back ([`ringside_client::fleet::Withheld`]).
    fleet_withheld: Vec<Value>,
    /// At the IPU vantage, the plain merge of the same events, network kinds together
    /// ([`merge_ipu_events`]: every agent's blame repeated, one event per host as the fleet
    /// counts), scored beside the fleet's for comparison.
    merged_events: Vec<(usize, Value)>,
    /// Healthy observation: [from, to) unix ms.
    healthy_from_ms: u64,
    healthy_to_ms: u64,
    windows: Vec<u64>,
    job: Value,
    error: Option<String>,
}

pub fn run(opts: Opts) -> Result<()> {
    testbed::require_root().context("the evaluation creates network namespaces and loads eBPF programs")?;
    let stop = testbed::signals::stop_flag();
    let phases = if opts.quick {
        Phases { warmup: secs(opts.warmup_s.unwrap_or(6)), fault: secs(opts.fault_s.unwrap_or(8)), cooldown: secs(2), healthy: secs(opts.healthy_s.unwrap_or(15)) }
    } else {
        Phases { warmup: secs(opts.warmup_s.unwrap_or(12)), fault: secs(opts.fault_s.unwrap_or(15)), cooldown: secs(4), healthy: secs(opts.healthy_s.unwrap_or(60)) }
    };
    let repeats = if opts.quick { 1 } else { opts.repeats.max(1) };
    let scenarios = pick("scenario", &ALL, &opts.scenarios, |s| s.name())?;
    let sources = if opts.sources.is_empty() {
        vec![Source::Rank, Source::OpenMpi(None), Source::Torch]
    } else {
        pick("source", &Source::all(), &opts.sources, |s| s.name())?
    };
    let vantages = if opts.vantages.is_empty() { vec![Vantage::Switch] } else { pick("vantage", &Vantage::ALL, &opts.vantages, |v| v.name().to_string())? };

    let (ringside, rank_bin) = release_binaries(opts.no_build)?;
    let out_dir = opts.out_dir.clone().unwrap_or_else(|| workspace_root().join("target/eval"));
    std::fs::create_dir_all(&out_dir)?;
    let logs = out_dir.join("detection-logs");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;

    let load_before = loadavg();
    let started = Instant::now();
    println!("\n==> measuring the veth link capacity (1 TCP stream, 2-host star, offloads off)");
    let capacity_mbit = measure_capacity().context("link capacity measurement")?;
    let cap_mbit = (capacity_mbit / 4.0).round().max(10.0) as u64;
    println!("    {capacity_mbit:.0} Mbit/s → rate caps at 1/4: {cap_mbit} Mbit/s");

    // One generator per vantage, all seeded alike, so every vantage draws the same targets and
    // injection times for the same run (a switch-only evaluation draws exactly what it did
    // before vantages existed).
    let mut rngs: Vec<Rng> = vantages.iter().map(|_| Rng(opts.seed)).collect();
    let mut results = Vec::new();
    let runs_per_rep: u32 = scenarios.iter().map(|&sc| vantages.iter().filter(|v| v.runs(sc)).count() as u32).sum();
    let total = sources.len() as u32 * runs_per_rep * repeats;
    let mut n = 0;
    for &src in &sources {
        for (si, &sc) in scenarios.iter().enumerate() {
            for rep in 0..repeats {
                // The vantages of one run follow each other, so they see the same machine load.
                for (vi, &vantage) in vantages.iter().enumerate() {
                    let rng = &mut rngs[vi];
                    if !vantage.runs(sc) {
                        // What `run_leaf_spine` draws (a leaf, a jitter): burnt so that this
                        // vantage's later runs keep the other vantages' targets.
                        rng.below(2);
                        rng.below(2000);
                        continue;
                    }
                    n += 1;
                    if stop.load(Ordering::SeqCst) {
                        bail!("interrupted; the testbed is torn down");
                    }
                    let algorithm = src.mpi_algorithm(si, rep);
                    let alg = algorithm.map(|a| format!(", {}", a.name())).unwrap_or_default();
                    println!(
                        "\n==> [{n}/{total}] {} {} #{rep}{alg} at the {} vantage ({:.0} s elapsed)",
                        src.name(),
                        sc.name(),
                        vantage.name(),
                        started.elapsed().as_secs_f64()
                    );
                    let ctx = RunCtx { source: src, vantage, algorithm, ringside: &ringside, rank_bin: &rank_bin, phases, cap_mbit, logs: &logs, stop };
                    let r = run_one(&ctx, sc, rep, rng);
                    if let Some(e) = &r.error {
                        println!("    run failed: {e}");
                    } else {
                        let net = r.events.iter().filter(|(_, e)| is_network(e)).count();
                        let strag = r.events.iter().filter(|(_, e)| kind(e) == "straggler").count();
                        println!("    target {}: {} events ({net} network, {strag} straggler)", r.target, r.events.len());
                        for (a, e) in &r.events {
                            println!("      {} {}", agents_of(*a, e), brief(e, r.fault.as_ref()));
                        }
                    }
                    results.push(r);
                    if stop.load(Ordering::SeqCst) {
                        bail!("interrupted; the testbed is torn down");
                    }
                }
            }
        }
    }
    let elapsed = started.elapsed();
    let load_after = loadavg();

    let mut per_source = Vec::new();
    for &src in &sources {
        for &vantage in &vantages {
            let runs: Vec<&RunResult> = results.iter().filter(|r| r.source == src && r.vantage == vantage).collect();
            let mine: Vec<Scenario> = scenarios.iter().copied().filter(|&sc| vantage.runs(sc)).collect();
            let rep = SourceReport::of(src, vantage, &mine, &runs);
            println!("\n## {} at the {} vantage ({})\n\n{}", src.name(), vantage.name(), src.describe(), rep.table);
            if !rep.by_algorithm.is_empty() {
                println!("{}", rep.by_algorithm);
            }
            for (name, value, ok) in &rep.targets {
                println!("  {:<64} {:<28} {}", name, value, if *ok == Some(true) { "met" } else if *ok == Some(false) { "NOT MET" } else { "not measured" });
            }
            per_source.push(rep);
        }
    }
    let comparison = vantage_comparison(&per_source);
    if !comparison.is_empty() {
        println!("\n## Vantages side by side\n\n{comparison}");
    }

    let machine = machine();
    let command = command_line(&opts);
    let report = json!({
        "command": command,
        "machine": machine,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "run_seconds": elapsed.as_secs_f64(),
        "phases_s": {"warmup": phases.warmup.as_secs(), "fault": phases.fault.as_secs(), "cooldown": phases.cooldown.as_secs(), "healthy": phases.healthy.as_secs()},
        "repeats": repeats,
        "seed": opts.seed,
        "vantages": vantages.iter().map(|v| v.name()).collect::<Vec<_>>(),
        "link_capacity_mbit": capacity_mbit,
        "rate_cap_mbit": cap_mbit,
        "grace_ms": GRACE_MS,
        "sources": per_source.iter().map(SourceReport::to_json).collect::<Vec<_>>(),
        "runs": results.iter().map(run_json).collect::<Vec<_>>(),
    });
    let json_path = out_dir.join("detection.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)?;
    println!("\nwrote {}", json_path.display());
    for rep in &per_source {
        let png_path = out_dir.join(format!("detection-{}{}.png", rep.source.name(), rep.vantage_suffix()));
        match plot(&rep.summaries, &png_path) {
            Ok(()) => println!("wrote {}", png_path.display()),
            Err(e) => println!("no plot: {e:#}"),
        }
    }
    let md = render_markdown(&command, &machine, &load_before, &load_after, elapsed, phases, repeats, capacity_mbit, cap_mbit, &per_source, &comparison, &results);
    std::fs::write(out_dir.join("detection.md"), &md)?;
    let full = opts.scenarios.is_empty() && opts.sources.is_empty() && opts.vantages.is_empty() && !opts.quick;
    if full || opts.write_docs {
        let doc = workspace_root().join("docs/eval-detection.md");
        std::fs::write(&doc, &md)?;
        println!("wrote {}", doc.display());
    } else {
        println!("wrote {} (docs/eval-detection.md is only written by a full run or with --write-docs)", out_dir.join("detection.md").display());
    }
    println!("agent logs and job outputs: {}", logs.display());
    println!("run time {:.0} s, load average before {} after {}", elapsed.as_secs_f64(), load_before, load_after);
    Ok(())
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

struct RunCtx<'a> {
    source: Source,
    vantage: Vantage,
    /// The OpenMPI algorithm of this run (OpenMPI sources only).
    algorithm: Option<MpiAlgorithm>,
    ringside: &'a Path,
    rank_bin: &'a Path,
    phases: Phases,
    cap_mbit: u64,
    logs: &'a Path,
    stop: &'static AtomicBool,
}

/// The agent watches all traffic of the rig's prefix (so it sees what shares a link with the job,
/// as congestion detection needs); the job is its members and its ports. PyTorch's gloo picks
/// ephemeral ports, which the testbed confines to a range on the ranks' hosts.
fn agent_config(source: Source, prefix: &str, job_members: &[String]) -> String {
    let members = job_members.iter().map(|m| format!("\"{m}\"")).collect::<Vec<_>>().join(", ");
    let ports = match source {
        Source::Rank => format!("tcp_ports = [{JOB_PORT}]\n"),
        Source::OpenMpi(_) => format!("tcp_ports = [\"{}-{}\"]\n", MPI_PORT_MIN, MPI_PORT_MIN + testbed::mpi::PORT_RANGE - 1),
        Source::Torch => {
            let range = TorchConfig { port: TORCH_PORT, ..Default::default() }.port_range();
            format!("tcp_ports = [\"{range}\"]\n")
        }
    };
    format!("[match]\nprefixes = [\"{prefix}\"]\n[[job]]\nname = \"eval\"\nmembers = [{members}]\n{ports}")
}

/// Starts the run's workload on `rig`: `ranks` ranks (rank r on `hosts[r]`, or host r), with the
/// compute straggler if any. `run_len` is how long the harness observes it: a job that ends by
/// itself (OpenMPI) is told to run that long, plus a margin.
fn spawn_workload(ctx: &RunCtx, rig: &dyn Rig, ranks: usize, hosts: Option<Vec<usize>>, straggler: Option<(usize, u64)>, out: PathBuf, run_len: Duration) -> Result<RunningJob> {
    Ok(match ctx.source {
        Source::Rank => testbed::spawn_job(rig, &job_config(ctx, ranks, hosts, straggler, out))?,
        Source::OpenMpi(_) => {
            let duration = run_len + Duration::from_secs(3);
            let cfg = MpiConfig {
                ranks,
                hosts,
                algorithm: ctx.algorithm.unwrap_or_default(),
                size: ByteSize(4 << 20),
                compute_ms: 50,
                steps: 0,
                duration: Some(duration),
                straggler,
                port_min: MPI_PORT_MIN,
                timeout: duration + Duration::from_secs(60),
                out_dir: Some(out),
                mca: Vec::new(),
            };
            testbed::spawn_mpi(rig, &cfg)?
        }
        Source::Torch => {
            let duration = run_len + Duration::from_secs(3);
            let cfg = TorchConfig {
                ranks,
                hosts,
                steps: 0,
                duration: Some(duration),
                straggler,
                python: Some(crate::setup::venv_python()),
                port: TORCH_PORT,
                timeout: duration + Duration::from_secs(120),
                out_dir: Some(out),
                ..Default::default()
            };
            let job = testbed::spawn_torch(rig, &cfg)?;
            // Importing torch and building DDP takes each rank seconds of CPU: the run's clock
            // (warm-up, fault) starts when every rank is training.
            testbed::torch::wait_training_started(&job, Duration::from_secs(120), Some(ctx.stop))?;
            job
        }
    })
}

fn job_config(ctx: &RunCtx, ranks: usize, hosts: Option<Vec<usize>>, straggler: Option<(usize, u64)>, out: PathBuf) -> JobConfig {
    let p = ctx.phases;
    let budget = p.warmup + p.fault + p.cooldown + p.healthy + Duration::from_secs(60);
    JobConfig {
        ranks,
        size: ByteSize(4 << 20),
        steps: 1_000_000,
        compute_ms: 50,
        straggler,
        rank_bin: Some(ctx.rank_bin.to_path_buf()),
        port: JOB_PORT,
        timeout: budget,
        out_dir: Some(out),
        hosts,
        ..Default::default()
    }
}

fn run_one(ctx: &RunCtx, sc: Scenario, rep: u32, rng: &mut Rng) -> RunResult {
    let mut r = RunResult {
        scenario: sc,
        source: ctx.source,
        vantage: ctx.vantage,
        algorithm: ctx.algorithm,
        repeat: rep,
        target: String::new(),
        place: Place::None,
        fault: None,
        fault_log: Vec::new(),
        events: Vec::new(),
        raw_events: Vec::new(),
        fleet_withheld: Vec::new(),
        merged_events: Vec::new(),
        healthy_from_ms: 0,
        healthy_to_ms: 0,
        windows: Vec::new(),
        job: Value::Null,
        error: None,
    };
    let res = if sc == Scenario::UplinkCongestion { run_leaf_spine(ctx, rep, rng, &mut r) } else { run_star(ctx, sc, rep, rng, &mut r) };
    if let Err(e) = res {
        r.error = Some(format!("{e:#}"));
    }
    r
}

/// What the IPU vantage's agents add to the star's configuration. Each IPU sees two peers of a
/// ring (its host's successor and predecessor), so the gray-failure detector must compare a peer
/// with one other (`min_peers = 2`, as the operator guide prescribes for IPU mode); everything
/// else stays the star's defaults, so the two vantages differ only in where they watch from.
const IPU_DETECT_CONFIG: &str = "[detect.gray]\nmin_peers = 2\n";

/// The star of one run at its vantage: the switch's star, or the IPU star (host ↔ IPU ↔ switch).
enum StarRig {
    Switch(Star),
    Ipu(IpuStar),
}

impl StarRig {
    fn rig(&self) -> &dyn Rig {
        match self {
            StarRig::Switch(s) => s,
            StarRig::Ipu(s) => s,
        }
    }

    fn addr(&self, host: usize) -> std::net::Ipv4Addr {
        match self {
            StarRig::Switch(s) => s.hosts[host].addr,
            StarRig::Ipu(s) => s.hosts[host].addr,
        }
    }

    /// The faulted place of a fault on link `h<host>` (the star's host link; the IPU star's IPU
    /// fabric cable, see `testbed::ipu`).
    fn place(&self, host: usize) -> Place {
        match self {
            StarRig::Switch(s) => Place::HostLink { agent: 0, addr: s.hosts[host].addr.to_string(), port: s.hosts[host].switch_port.clone() },
            StarRig::Ipu(s) => Place::IpuLink { addr: s.hosts[host].addr.to_string() },
        }
    }

    fn describe_link(&self, host: usize) -> String {
        match self {
            StarRig::Switch(s) => format!("h{host} ({}, port {})", s.hosts[host].addr, s.hosts[host].switch_port),
            StarRig::Ipu(s) => format!("h{host} ({}, IPU {host}'s fabric cable)", s.hosts[host].addr),
        }
    }

    /// The rate at which `host` sends, from the agent that sees its own link: the switch port's
    /// ingress, or its IPU's fabric port's egress.
    fn send_rate_mbit(&self, agents: &[Agent], host: usize, stop: &AtomicBool) -> Result<f64> {
        match self {
            StarRig::Switch(s) => send_rate_mbit(&agents[0], &s.hosts[host].switch_port, "ingress", stop),
            StarRig::Ipu(_) => send_rate_mbit(&agents[host], IPU_FABRIC_PORT, "egress", stop),
        }
    }
}

/// Builds the star of `ctx`'s vantage and starts its agents (one in the switch, or one per IPU),
/// ready. The agents come second in the tuple so that a caller's `let` drops them first.
fn star_and_agents(ctx: &RunCtx, tag: &str) -> Result<(StarRig, Vec<Agent>)> {
    let config = agent_config(ctx.source, "10.77.0.0/24", &["10.77.0.0/24".to_string()]);
    let mut agents = Vec::new();
    let star = match ctx.vantage {
        Vantage::Switch => {
            let star = Star::new(StarConfig { hosts: STAR_HOSTS, offloads: false, ..Default::default() })?;
            agents.push(Agent::start(
                &star.switch,
                &AgentSpec {
                    bin: ctx.ringside,
                    ifaces: star.hosts.iter().map(|h| h.switch_port.clone()).collect(),
                    listen: AGENT_LISTEN.into(),
                    config_toml: config,
                    tag: format!("eval-{tag}"),
                    log: Some(ctx.logs.join(format!("{tag}-agent.log"))),
                },
            )?);
            StarRig::Switch(star)
        }
        Vantage::Ipu => {
            let star = IpuStar::new(IpuStarConfig { hosts: STAR_HOSTS, offloads: false, ringside_bin: ctx.ringside.to_path_buf(), ..Default::default() })?;
            // Each agent listens on the same address in its own IPU namespace.
            for (i, h) in star.hosts.iter().enumerate() {
                agents.push(Agent::start(
                    &h.ipu,
                    &AgentSpec {
                        bin: ctx.ringside,
                        ifaces: vec![IPU_FABRIC_PORT.into()],
                        listen: AGENT_LISTEN.into(),
                        config_toml: format!("{config}{IPU_DETECT_CONFIG}"),
                        tag: format!("eval-{tag}-ipu{i}"),
                        log: Some(ctx.logs.join(format!("{tag}-ipu{i}-agent.log"))),
                    },
                )?);
            }
            StarRig::Ipu(star)
        }
    };
    for a in &mut agents {
        a.wait_ready(Duration::from_secs(30))?;
    }
    Ok((star, agents))
}

fn run_star(ctx: &RunCtx, sc: Scenario, rep: u32, rng: &mut Rng, r: &mut RunResult) -> Result<()> {
    let tag = match ctx.vantage {
        Vantage::Switch => format!("{}-{}-{rep}", ctx.source.name(), sc.name()),
        Vantage::Ipu => format!("{}-ipu-{}-{rep}", ctx.source.name(), sc.name()),
    };
    let (star, mut agents) = star_and_agents(ctx, &tag)?;
    let target = rng.below(STAR_HOSTS as u64) as usize;
    let jitter = Duration::from_millis(rng.below(2000));
    let addr = star.addr(target);
    let straggler = (sc == Scenario::Straggler).then_some((target, STRAGGLER_EXTRA_MS));
    let p = ctx.phases;
    let run_len = if sc == Scenario::Healthy { p.healthy } else { p.warmup + jitter + p.fault } + p.cooldown;
    let job = spawn_workload(ctx, star.rig(), STAR_HOSTS, None, straggler, ctx.logs.join(format!("{tag}-job")), run_len)?;
    let job_start = now_ms();
    r.healthy_from_ms = job_start;
    let stop = ctx.stop;
    match sc {
        Scenario::Healthy => {
            r.target = "-".into();
            if !sleep_checked(p.healthy, stop) {
                bail!("interrupted");
            }
            r.healthy_to_ms = now_ms();
        }
        Scenario::Straggler => {
            r.target = format!("rank {target} on h{target} ({addr})");
            r.place = Place::Host { addr: addr.to_string() };
            r.healthy_to_ms = job_start; // active from the job's start: no healthy time
            if !sleep_checked(p.warmup + jitter + p.fault, stop) {
                bail!("interrupted");
            }
            // The straggler's record ends when the job does; score it up to now.
            let mut f = star.rig().faults().into_iter().find(|f| matches!(f.kind, testbed::FaultKind::Straggler { .. })).context("no straggler record")?;
            f.ended_unix_ms = Some(now_ms());
            r.fault = Some(f);
        }
        _ => {
            let link = format!("h{target}");
            r.target = star.describe_link(target);
            r.place = star.place(target);
            // The rate cap is relative to what the job sends on the link (sampled in the last
            // RATE_SAMPLES × 100 ms of the warm-up), not to the raw veth capacity: the CPU-bound
            // job runs far below the latter, where a cap barely touches it.
            let sampling = Duration::from_millis(100 * RATE_SAMPLES as u64);
            if !sleep_checked((p.warmup + jitter).saturating_sub(sampling), stop) {
                bail!("interrupted");
            }
            let cap_mbit = if sc == Scenario::RateCapQuarter {
                let rate = star.send_rate_mbit(&agents, target, stop)?;
                let cap = (rate / 4.0).round().max(10.0) as u64;
                r.target = format!("{} capped to {cap} Mbit/s = 1/4 of the {rate:.0} Mbit/s it sent at", r.target);
                cap
            } else {
                sleep_checked(sampling, stop);
                ctx.cap_mbit
            };
            r.healthy_to_ms = now_ms();
            // The guard clears the fault when dropped (also on an early return).
            let guard: Box<dyn std::any::Any> = match sc {
                Scenario::Loss(pct) => Box::new(star.rig().link_loss(&link, pct)?),
                Scenario::RateCapQuarter => Box::new(star.rig().link_rate_cap(&link, cap_mbit)?),
                Scenario::Flap => Box::new(star.rig().link_flap(&link, FlapSpec::periodic(Duration::from_millis(400), Duration::from_secs(3)))?),
                _ => unreachable!(),
            };
            let held = sleep_checked(p.fault, stop);
            drop(guard);
            if !held {
                bail!("interrupted");
            }
            r.fault = star.rig().faults().into_iter().last();
        }
    }
    if !sleep_checked(p.cooldown, stop) {
        bail!("interrupted");
    }
    collect(&mut agents, r)?;
    if let StarRig::Ipu(s) = &star {
        let own: Vec<String> = s.hosts.iter().map(|h| h.addr.to_string()).collect();
        r.raw_events = std::mem::take(&mut r.events);
        r.events = fleet_ipu_events(&r.raw_events, &own, &mut r.fleet_withheld)?;
        r.merged_events = merge_ipu_events(&r.raw_events, &own);
    }
    r.fault_log = star.rig().faults();
    r.job = job_summary(job, &ctx.logs.join(format!("{tag}-job")), job_start, r.fault.as_ref());
    drop(agents);
    Ok(())
}

fn run_leaf_spine(ctx: &RunCtx, rep: u32, rng: &mut Rng, r: &mut RunResult) -> Result<()> {
    let tag = format!("{}-uplink-congestion-{rep}", ctx.source.name());
    let hosts = vec![0, 1, LEAF_HOSTS, LEAF_HOSTS + 1];
    let ls = LeafSpine::new(LeafSpineConfig { leaves: 2, hosts_per_leaf: LEAF_HOSTS, offloads: false, ..Default::default() })?;
    let job_members: Vec<String> = hosts.iter().map(|&h| ls.host_ipv4(h).map(|a| a.to_string())).collect::<testbed::Result<_>>()?;
    let mut agents = Vec::new();
    for (l, leaf) in ls.leaves.iter().enumerate() {
        let mut ifaces: Vec<String> = leaf.hosts.iter().map(|&h| ls.hosts[h].leaf_port.clone()).collect();
        ifaces.push(leaf.uplink_iface.to_string());
        let mut a = Agent::start(
            &leaf.ns,
            &AgentSpec {
                bin: ctx.ringside,
                ifaces,
                listen: AGENT_LISTEN.into(),
                config_toml: agent_config(ctx.source, "10.77.0.0/16", &job_members),
                tag: format!("eval-{tag}-leaf{l}"),
                log: Some(ctx.logs.join(format!("{tag}-leaf{l}-agent.log"))),
            },
        )?;
        a.wait_ready(Duration::from_secs(30))?;
        agents.push(a);
    }
    let leaf = rng.below(2) as usize;
    let other = 1 - leaf;
    let jitter = Duration::from_millis(rng.below(2000));
    // Capped from the start: the bottleneck of this fabric, not the fault.
    let _cap = ls.link_rate_cap(&format!("up{leaf}"), ctx.cap_mbit)?;
    let (cross_from, cross_to) = (leaf * LEAF_HOSTS + 2, other * LEAF_HOSTS + 2);
    // The cross traffic's path keeps TSO/GSO, so the fault loads the uplink and not the CPUs the
    // ranks run on; the job's hosts keep sending MTU-sized segments.
    ls.segmentation_offloads_between(cross_from, cross_to)?;
    r.target = format!("up{leaf} (capped {} Mbit/s; cross traffic h{cross_from} -> h{cross_to}, TSO/GSO on along its path)", ctx.cap_mbit);
    r.place = Place::Uplink { agent: leaf, iface: ls.leaves[leaf].uplink_iface.to_string() };
    let p = ctx.phases;
    let run_len = p.warmup + jitter + p.fault + p.cooldown;
    let job = spawn_workload(ctx, &ls, 4, Some(hosts), None, ctx.logs.join(format!("{tag}-job")), run_len)?;
    let job_start = now_ms();
    r.healthy_from_ms = job_start;
    if !sleep_checked(p.warmup + jitter, ctx.stop) {
        bail!("interrupted");
    }
    r.healthy_to_ms = now_ms();
    let ct = ls.cross_traffic(CrossTrafficSpec { from: cross_from, to: cross_to, streams: 4, ..Default::default() })?;
    let half = p.fault / 2;
    let mut held = sleep_checked(half, ctx.stop);
    // What each leaf agent saw mid-fault (every flow, with its counters), for whoever wants to
    // know why a detector did or did not fire.
    for (l, a) in agents.iter().enumerate() {
        if let Ok(body) = a.get("/v1/flows?limit=1000") {
            let _ = std::fs::write(ctx.logs.join(format!("{tag}-leaf{l}-flows-mid-fault.json")), body);
        }
    }
    held = held && sleep_checked(p.fault - half, ctx.stop);
    let report = ct.stop();
    if !held {
        bail!("interrupted");
    }
    let mut f = report.record.clone();
    f.link = Some(format!("up{leaf}"));
    r.fault = Some(f);
    if !sleep_checked(p.cooldown, ctx.stop) {
        bail!("interrupted");
    }
    collect(&mut agents, r)?;
    r.fault_log = ls.faults();
    r.job = job_summary(job, &ctx.logs.join(format!("{tag}-job")), job_start, r.fault.as_ref());
    r.job["cross_traffic_goodput_mbit"] = json!(report.goodput_mbit);
    drop(agents);
    Ok(())
}

fn collect(agents: &mut [Agent], r: &mut RunResult) -> Result<()> {
    for (i, a) in agents.iter_mut().enumerate() {
        if !a.running() {
            bail!("agent {i} exited during the run (see its log under the evaluation's detection-logs)");
        }
        let body = a.get("/v1/events?state=all&limit=1000")?;
        let v: Value = serde_json::from_str(&body).context("/v1/events is not JSON")?;
        r.windows.push(v["windows"].as_u64().unwrap_or(0));
        for e in v["events"].as_array().cloned().unwrap_or_default() {
            r.events.push((i, e));
        }
    }
    Ok(())
}

/// Stops the job (it runs until killed) and reads what the ranks wrote: the median communication
/// time per step before the fault and while it was held, so the report shows whether the fault
/// hurt the job at all. Step times are placed on the clock by summing `step_ms` from the job's
/// start (rank start-up delay ignored); ranks killed before writing their file are skipped.
fn job_summary(job: testbed::RunningJob, out: &Path, job_start_ms: u64, fault: Option<&FaultRecord>) -> Value {
    // OpenMPI's and PyTorch's ranks write their reports when the job ends by itself, a few
    // seconds from now (it was told to run a little longer than the harness watches); the
    // emulated job runs until killed.
    if out.join("mpirun.log").exists() || out.join("rank-0.started").exists() {
        if let Err(e) = job.wait(None) {
            println!("    OpenMPI job: {e}");
        }
    } else {
        drop(job);
    }
    let (mut pre, mut during, mut ranks) = (Vec::new(), Vec::new(), 0);
    for entry in std::fs::read_dir(out).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let Some(v) = std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok()) else { continue };
        ranks += 1;
        let mut t = job_start_ms as f64;
        for step in v["steps"].as_array().into_iter().flatten() {
            let (st, comm) = (step["step_ms"].as_f64().unwrap_or(0.0), step["comm_ms"].as_f64().unwrap_or(0.0));
            let (from, to) = (t, t + st);
            t = to;
            match fault {
                Some(f) if from >= f.started_unix_ms as f64 && to <= f.ended_unix_ms.unwrap_or(u64::MAX) as f64 => during.push(comm),
                Some(f) if to < f.started_unix_ms as f64 => pre.push(comm),
                None => pre.push(comm),
                _ => {}
            }
        }
    }
    json!({"ranks_with_results": ranks, "comm_ms_median_before_fault": quantile(&pre, 0.5), "comm_ms_median_during_fault": quantile(&during, 0.5),
           "steps_before_fault": pre.len(), "steps_during_fault": during.len()})
}

/// "a2", or for a merged IPU event every agent that raised it: "ipu0+ipu2".
fn agents_of(agent: usize, e: &Value) -> String {
    match e["ipu_agents"].as_array() {
        Some(a) => a.iter().map(|x| format!("ipu{}", x.as_u64().unwrap_or(0))).collect::<Vec<_>>().join("+"),
        None => format!("a{agent}"),
    }
}

fn kind(e: &Value) -> &str {
    e["kind"].as_str().unwrap_or("")
}

fn is_network(e: &Value) -> bool {
    matches!(kind(e), "congestion" | "gray_failure")
}

fn raised(e: &Value) -> u64 {
    e["raised_unix_ms"].as_u64().unwrap_or(0)
}

fn scope_str(e: &Value) -> String {
    let s = &e["scope"];
    match s["type"].as_str() {
        Some("peer") => format!("peer {} via {}", s["peer"].as_str().unwrap_or("?"), s["link"].as_str().unwrap_or("?")),
        Some("link") => format!("link {}", s["link"].as_str().unwrap_or("?")),
        Some(t) => t.to_string(),
        None => "?".into(),
    }
}

fn brief(e: &Value, fault: Option<&FaultRecord>) -> String {
    let rel = match fault {
        Some(f) => format!("{:+.1} s from fault start", (raised(e) as f64 - f.started_unix_ms as f64) / 1e3),
        None => String::new(),
    };
    format!(
        "{} {} [{}{}] raised {rel}",
        kind(e),
        scope_str(e),
        e["severity"].as_str().unwrap_or("?"),
        e["classification"].as_str().map(|c| format!(", {c}")).unwrap_or_default()
    )
}

/// Whether the event matches the fault in time (and kind class).
fn matches_fault(e: &Value, f: &FaultRecord, straggler: bool) -> bool {
    let ok_kind = if straggler { kind(e) == "straggler" } else { is_network(e) };
    let end = f.ended_unix_ms.unwrap_or(u64::MAX).saturating_add(GRACE_MS);
    ok_kind && raised(e) >= f.started_unix_ms && raised(e) <= end
}

/// The IPU vantage's verdicts as one fabric-wide list, the way an operator reading every IPU's
/// `/v1/events` without the fleet view would count them (the plain merge, scored beside the
/// fleet's):
/// 1. union of every IPU agent's events;
/// 2. each names a host (`ipu_named_host`): a peer-scoped event its peer; a link-scoped event
///    the agent's own host (the agent watches one port, its IPU's fabric cable, so a verdict on
///    that link is about the path of the host behind it); other scopes name nothing across agents
///    and are kept per agent;
/// 3. dedup: network events (of any network kind; stragglers only with stragglers) naming the same
///    host whose lifetimes overlap (from `raised_unix_ms` to `ended_unix_ms`, or to the end of the
///    run while open) are one event (the fleet view's unit, so that the two count alike), raised
///    when the first was, ended when the last ended, with every agent that raised one in
///    `ipu_agents`. Two ring neighbours of a lossy host both naming it are one detection.
///
/// Localization is then judged on the host a merged event names (`Place::IpuLink`).
fn merge_ipu_events(raw: &[(usize, Value)], own_hosts: &[String]) -> Vec<(usize, Value)> {
    let named = |a: usize, e: &Value| -> String {
        let s = &e["scope"];
        match s["type"].as_str() {
            Some("peer") => s["peer"].as_str().unwrap_or("?").to_string(),
            Some("link") => own_hosts.get(a).cloned().unwrap_or_else(|| format!("ipu{a}")),
            _ => format!("ipu{a} {}", scope_str(e)),
        }
    };
    let mut items: Vec<(usize, &Value)> = raw.iter().map(|(a, e)| (*a, e)).collect();
    items.sort_by_key(|(a, e)| (raised(e), *a));
    let mut out: Vec<(usize, Value)> = Vec::new();
    for (a, e) in items {
        let host = named(a, e);
        let end = e["ended_unix_ms"].as_u64();
        let same = out.iter_mut().find(|(_, m)| {
            (kind(m) == kind(e) || is_network(m) && is_network(e)) && m["ipu_named_host"] == host.as_str() && m["ended_unix_ms"].as_u64().is_none_or(|end| raised(e) <= end)
        });
        match same {
            Some((_, m)) => {
                m["ended_unix_ms"] = match (m["ended_unix_ms"].as_u64(), end) {
                    (Some(x), Some(y)) => json!(x.max(y)),
                    _ => Value::Null,
                };
                if let Some(agents) = m["ipu_agents"].as_array_mut() {
                    if !agents.contains(&json!(a)) {
                        agents.push(json!(a));
                    }
                }
            }
            None => {
                let mut m = e.clone();
                m["ipu_named_host"] = json!(host);
                m["ipu_agents"] = json!([a]);
                out.push((a, m));
            }
        }
    }
    out
}

/// The IPU vantage's verdicts as the provider's fleet view gives them
/// ([`ringside_client::fleet::judge`], the code of `ringside fleet`): the network-fault events of
/// all IPU agents judged together (see its module: a blame is repeated unless the accused host's
/// agent blames the accuser back with at least as many agents behind the accuser, and once
/// corroborated or after the hold alone), one event per host and run of blames agreeing in time,
/// raised when the fleet first repeated one (`fleet_witnesses`: every agent event behind it). The
/// fields are those of the first event behind it, plus `ipu_named_host` and `ipu_agents` as in
/// [`merge_ipu_events`]. Straggler events are judged by the fleet too (repeated once two agents
/// name the same host a straggler in agreeing time). The blames held back go to `withheld`.
fn fleet_ipu_events(raw: &[(usize, Value)], own_hosts: &[String], withheld: &mut Vec<Value>) -> Result<Vec<(usize, Value)>> {
    use ringside_client::{fleet, operator::Event};
    let mut agents = Vec::new();
    for (i, h) in own_hosts.iter().enumerate() {
        let events = raw
            .iter()
            .filter(|(a, _)| *a == i)
            .map(|(_, e)| serde_json::from_value::<Event>(e.clone()).with_context(|| format!("ipu{i}'s event {e} is not an /v1/events event")))
            .collect::<Result<Vec<_>>>()?;
        agents.push(fleet::AgentEvents { agent: format!("ipu{i}"), host: h.parse().with_context(|| format!("host address {h}"))?, events });
    }
    // As of the end of time: a lone blame raised in the run's last seconds is repeated once its
    // hold passes, as a live fleet would (judged at collection time, it would be held back only
    // because the run ended first).
    let view = fleet::judge(&agents, u64::MAX, &fleet::Rules::default());
    // An agent's index is its place in `agents` (= in `own_hosts`).
    let index = |name: &str| agents.iter().position(|a| a.agent == name).unwrap_or_default();
    let mut out = Vec::new();
    for v in &view.verdicts {
        let first = v.witnesses.first().context("a fleet verdict without a witness")?;
        let a = index(&first.agent);
        let (_, e) = raw.iter().find(|(x, e)| *x == a && e["id"].as_u64() == Some(first.event_id)).context("the first witness's event")?;
        let mut m = e.clone();
        m["raised_unix_ms"] = json!(v.raised_unix_ms);
        m["started_unix_ms"] = json!(v.started_unix_ms);
        m["ended_unix_ms"] = json!(v.ended_unix_ms);
        m["ipu_named_host"] = json!(v.host.to_string());
        m["ipu_agents"] = json!(v.agents().into_iter().map(index).collect::<Vec<_>>());
        m["fleet_kinds"] = json!(v.kinds);
        m["fleet_witnesses"] = json!(v.witnesses);
        out.push((a, m));
    }
    out.sort_by_key(|(a, e)| (raised(e), *a));
    *withheld = view.withheld.iter().map(|w| json!(w)).collect();
    Ok(out)
}

fn names_place(agent: usize, e: &Value, place: &Place) -> bool {
    let s = &e["scope"];
    let (ty, peer, link) = (s["type"].as_str().unwrap_or(""), s["peer"].as_str().unwrap_or(""), s["link"].as_str().unwrap_or(""));
    match place {
        Place::HostLink { agent: a, addr, port } => agent == *a && (peer == addr || (ty == "link" && link == port)),
        Place::Uplink { agent: a, iface } => agent == *a && ty == "link" && link == iface,
        Place::IpuLink { addr } => e["ipu_named_host"] == addr.as_str(),
        Place::Host { addr } => peer == addr,
        Place::None => false,
    }
}

/// The score of one scenario.
#[derive(Default)]
struct Summary {
    name: String,
    describe: String,
    runs: usize,
    failed_runs: usize,
    faults: usize,
    detected: usize,
    latencies_ms: Vec<f64>,
    network_events: usize,
    /// Network events matching a fault in time and naming the faulted place.
    matched_network_events: usize,
    /// Network events matching a fault in time only.
    timely_network_events: usize,
    localized: usize,
    matched_events_naming: usize,
    matched_events: usize,
    healthy_s: f64,
    healthy_false_alarms: usize,
    straggler_as_network: usize,
    straggler_events: usize,
    /// Events of any kind (network, straggler) in the scenario's runs.
    events_any: usize,
    /// Straggler events naming a host that is not the run's straggler (every straggler event of
    /// a run without one): a healthy host blamed.
    straggler_wrong_host: usize,
    network_fault: bool,
    /// Per run: the job's median communication time per step before the fault and during it.
    comm_before_ms: Vec<f64>,
    comm_during_ms: Vec<f64>,
}

impl Summary {
    fn recall(&self) -> Option<f64> {
        (self.faults > 0).then(|| self.detected as f64 / self.faults as f64)
    }
    fn precision(&self) -> Option<f64> {
        (self.network_events > 0).then(|| self.matched_network_events as f64 / self.network_events as f64)
    }
    fn precision_time_only(&self) -> Option<f64> {
        (self.network_events > 0).then(|| self.timely_network_events as f64 / self.network_events as f64)
    }
    fn localization(&self) -> Option<f64> {
        (self.detected > 0).then(|| self.localized as f64 / self.detected as f64)
    }
    fn event_localization(&self) -> Option<f64> {
        (self.matched_events > 0).then(|| self.matched_events_naming as f64 / self.matched_events as f64)
    }
    fn fa_per_hour(&self) -> Option<f64> {
        (self.healthy_s > 0.0).then(|| self.healthy_false_alarms as f64 * 3600.0 / self.healthy_s)
    }
    fn to_json(&self) -> Value {
        json!({
            "scenario": self.name, "description": self.describe, "runs": self.runs, "failed_runs": self.failed_runs,
            "faults": self.faults, "detected": self.detected, "recall": self.recall(),
            "latency_ms": {"median": quantile(&self.latencies_ms, 0.5), "p90": quantile(&self.latencies_ms, 0.9), "all": self.latencies_ms},
            "network_events": self.network_events, "matched_network_events": self.matched_network_events, "precision": self.precision(),
            "timely_network_events": self.timely_network_events, "precision_time_only": self.precision_time_only(),
            "localized_faults": self.localized, "localization": self.localization(),
            "matched_events": self.matched_events, "matched_events_naming_the_place": self.matched_events_naming, "event_localization": self.event_localization(),
            "healthy_seconds": self.healthy_s, "healthy_false_alarms": self.healthy_false_alarms, "false_alarms_per_hour": self.fa_per_hour(),
            "straggler_reported_as_network_fault": self.straggler_as_network, "straggler_events": self.straggler_events,
            "straggler_events_naming_a_healthy_host": self.straggler_wrong_host, "events_any_kind": self.events_any,
            "job_comm_ms_before_fault": quantile(&self.comm_before_ms, 0.5), "job_comm_ms_during_fault": quantile(&self.comm_during_ms, 0.5),
        })
    }
}

fn summarize(sc: Scenario, results: &[&RunResult]) -> Summary {
    summarize_events(sc, results, |r| &r.events)
}

/// [`summarize`] over the events `of` each run gives (the IPU vantage's plain merge, say).
fn summarize_events(sc: Scenario, results: &[&RunResult], of: impl Fn(&RunResult) -> &[(usize, Value)]) -> Summary {
    let mut s = Summary { name: sc.name(), describe: sc.describe(), network_fault: sc.is_network_fault(), ..Default::default() };
    let straggler = sc == Scenario::Straggler;
    for r in results.iter().filter(|r| r.scenario == sc) {
        s.runs += 1;
        if r.error.is_some() {
            s.failed_runs += 1;
            continue;
        }
        s.healthy_s += r.healthy_to_ms.saturating_sub(r.healthy_from_ms) as f64 / 1e3;
        s.comm_before_ms.extend(r.job["comm_ms_median_before_fault"].as_f64());
        s.comm_during_ms.extend(r.job["comm_ms_median_during_fault"].as_f64());
        let events = of(r);
        s.events_any += events.len();
        for (_, e) in events {
            if is_network(e) {
                s.network_events += 1;
                let in_healthy = raised(e) >= r.healthy_from_ms && raised(e) < r.healthy_to_ms;
                // Events already open when the job started (carried over) count as healthy-time alarms too.
                if in_healthy || raised(e) < r.healthy_from_ms {
                    s.healthy_false_alarms += 1;
                }
            }
            if kind(e) == "straggler" {
                s.straggler_events += 1;
                if !(straggler && matches!(r.place, Place::Host { .. }) && names_place(0, e, &r.place)) {
                    s.straggler_wrong_host += 1;
                }
            }
        }
        let Some(f) = &r.fault else { continue };
        s.faults += 1;
        let mut matching: Vec<&(usize, Value)> = events.iter().filter(|(_, e)| matches_fault(e, f, straggler)).collect();
        matching.sort_by_key(|(_, e)| raised(e));
        if straggler {
            let end = f.ended_unix_ms.unwrap_or(u64::MAX).saturating_add(GRACE_MS);
            s.straggler_as_network += events.iter().filter(|(_, e)| is_network(e) && raised(e) >= f.started_unix_ms && raised(e) <= end).count();
        } else {
            s.timely_network_events += matching.len();
            s.matched_network_events += matching.iter().filter(|(a, e)| names_place(*a, e, &r.place)).count();
        }
        s.matched_events += matching.len();
        s.matched_events_naming += matching.iter().filter(|(a, e)| names_place(*a, e, &r.place)).count();
        if let Some((_, first)) = matching.first() {
            s.detected += 1;
            s.latencies_ms.push(raised(first) as f64 - f.started_unix_ms as f64);
            if matching.iter().any(|(a, e)| names_place(*a, e, &r.place)) {
                s.localized += 1;
            }
        }
    }
    s
}

/// Everything reported for one traffic source.
struct SourceReport {
    source: Source,
    vantage: Vantage,
    summaries: Vec<Summary>,
    overall: Summary,
    table: String,
    /// OpenMPI cycling its algorithms: one row per algorithm over all scenarios ("" otherwise).
    by_algorithm: String,
    targets: Vec<Target>,
    /// At the IPU vantage: the same runs scored on the plain merge instead of the fleet view
    /// (one summary per scenario).
    plain_merge: Option<Vec<Summary>>,
}

impl SourceReport {
    fn of(source: Source, vantage: Vantage, scenarios: &[Scenario], runs: &[&RunResult]) -> SourceReport {
        let summaries: Vec<Summary> = scenarios.iter().map(|&sc| summarize(sc, runs)).collect();
        let total = overall(&summaries);
        let table = render_table(&summaries);
        let targets = targets(&summaries, &total);
        let mut by_algorithm = String::new();
        if source == Source::OpenMpi(None) {
            let _ = writeln!(by_algorithm, "| OpenMPI algorithm | runs | faults | detected | precision | recall | localization | events in healthy runs | straggler found (its host) | healthy hosts named straggler |");
            let _ = writeln!(by_algorithm, "|---|---|---|---|---|---|---|---|---|---|");
            for alg in MPI_ALGORITHMS {
                let mine: Vec<&RunResult> = runs.iter().copied().filter(|r| r.algorithm == Some(alg)).collect();
                if mine.is_empty() {
                    continue;
                }
                let sums: Vec<Summary> = scenarios.iter().map(|&sc| summarize(sc, &mine)).collect();
                let o = overall(&sums);
                let healthy_events: usize = sums.iter().filter(|s| s.name == "healthy").map(|s| s.events_any).sum();
                let strag: Vec<String> = sums.iter().filter(|s| s.name == "straggler" && s.faults > 0).map(|s| format!("{}/{}", s.localized, s.faults)).collect();
                let _ = writeln!(
                    by_algorithm,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    alg.name(),
                    mine.len(),
                    o.faults,
                    o.detected,
                    f2(o.precision()),
                    f2(o.recall()),
                    f2(o.localization()),
                    healthy_events,
                    if strag.is_empty() { "-".into() } else { strag.join(", ") },
                    o.straggler_wrong_host
                );
            }
        }
        let plain_merge = (vantage == Vantage::Ipu).then(|| scenarios.iter().map(|&sc| summarize_events(sc, runs, |r| &r.merged_events)).collect::<Vec<_>>());
        SourceReport { source, vantage, summaries, overall: total, table, by_algorithm, targets, plain_merge }
    }

    /// "" at the switch vantage (the report's names before vantages existed), "-ipu" otherwise.
    fn vantage_suffix(&self) -> String {
        match self.vantage {
            Vantage::Switch => String::new(),
            v => format!("-{}", v.name()),
        }
    }

    /// "rank" at the switch vantage, "rank, IPU vantage" otherwise.
    fn title(&self) -> String {
        match self.vantage {
            Vantage::Switch => self.source.name(),
            Vantage::Ipu => format!("{}, IPU vantage", self.source.name()),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "source": self.source.name(),
            "vantage": self.vantage.name(),
            "description": self.source.describe(),
            "scenarios": self.summaries.iter().map(Summary::to_json).collect::<Vec<_>>(),
            "overall": self.overall.to_json(),
            "targets": self.targets.iter().map(|(n, v, ok)| json!({"target": n, "measured": v, "met": ok})).collect::<Vec<_>>(),
            "plain_merge_scenarios": self.plain_merge.as_ref().map(|v| v.iter().map(Summary::to_json).collect::<Vec<_>>()),
        })
    }
}

/// Totals over the network-fault scenarios (latency, precision, recall, localization) and over
/// every healthy period (false alarms).
fn overall(sums: &[Summary]) -> Summary {
    let mut o = Summary { name: "all network faults".into(), ..Default::default() };
    for s in sums {
        o.runs += s.runs;
        o.failed_runs += s.failed_runs;
        o.healthy_s += s.healthy_s;
        o.healthy_false_alarms += s.healthy_false_alarms;
        o.straggler_as_network += s.straggler_as_network;
        o.straggler_wrong_host += s.straggler_wrong_host;
        o.network_events += s.network_events;
        if s.network_fault {
            o.faults += s.faults;
            o.detected += s.detected;
            o.latencies_ms.extend_from_slice(&s.latencies_ms);
            o.matched_network_events += s.matched_network_events;
            o.timely_network_events += s.timely_network_events;
            o.localized += s.localized;
            o.matched_events += s.matched_events;
            o.matched_events_naming += s.matched_events_naming;
        }
    }
    o
}

/// The vantages of each source side by side, one row per scenario: detected/faults, median
/// latency, precision and localization (faults) per vantage, then the overall row. Empty when
/// only one vantage ran.
fn vantage_comparison(reports: &[SourceReport]) -> String {
    let vantages: Vec<Vantage> = Vantage::ALL.into_iter().filter(|v| reports.iter().any(|r| r.vantage == *v)).collect();
    if vantages.len() < 2 {
        return String::new();
    }
    let mut t = String::new();
    let mut sources: Vec<Source> = Vec::new();
    for r in reports {
        if !sources.contains(&r.source) {
            sources.push(r.source);
        }
    }
    for src in sources {
        let mine: Vec<&SourceReport> = vantages.iter().filter_map(|v| reports.iter().find(|r| r.source == src && r.vantage == *v)).collect();
        let _ = writeln!(t, "#### {}\n", src.name());
        let mut head = "| scenario |".to_string();
        let mut rule = "|---|".to_string();
        for r in &mine {
            let v = r.vantage.name();
            let _ = write!(head, " {v}: detected | {v}: latency median s | {v}: precision | {v}: localization | {v}: events |");
            rule.push_str("---|---|---|---|---|");
        }
        let _ = writeln!(t, "{head}\n{rule}");
        let mut names: Vec<String> = Vec::new();
        for r in &mine {
            for s in &r.summaries {
                if !names.contains(&s.name) {
                    names.push(s.name.clone());
                }
            }
        }
        let cell = |s: Option<&Summary>| -> String {
            match s {
                None => " n/a (no rig) | - | - | - | - |".into(),
                Some(s) => {
                    let det = if s.faults > 0 { format!("{}/{}", s.detected, s.faults) } else { "-".into() };
                    let failed = if s.failed_runs > 0 { format!(" ({} runs failed)", s.failed_runs) } else { String::new() };
                    let ev = if s.network_fault { s.network_events.to_string() } else { format!("{} (network {}, straggler {})", s.events_any, s.network_events, s.straggler_events) };
                    format!(
                        " {det}{failed} | {} | {} | {} | {ev} |",
                        secs_opt(quantile(&s.latencies_ms, 0.5)),
                        f2(s.precision()),
                        f2(s.localization())
                    )
                }
            }
        };
        for name in &names {
            let mut row = format!("| {name} |");
            for r in &mine {
                row.push_str(&cell(r.summaries.iter().find(|s| &s.name == name)));
            }
            let _ = writeln!(t, "{row}");
        }
        let mut row = "| **all network faults** |".to_string();
        for r in &mine {
            let o = &r.overall;
            let net: usize = r.summaries.iter().filter(|s| s.network_fault).map(|s| s.network_events).sum();
            let p = (net > 0).then(|| o.matched_network_events as f64 / net as f64);
            let _ = write!(
                row,
                " {}/{} | {} | {} | {} | {net} |",
                o.detected,
                o.faults,
                secs_opt(quantile(&o.latencies_ms, 0.5)),
                f2(p),
                f2(o.localization())
            );
        }
        let _ = writeln!(t, "{row}\n");
        let _ = writeln!(t, "| target |{} \n|---|{}", mine.iter().map(|r| format!(" {} |", r.vantage.name())).collect::<String>(), "---|".repeat(mine.len()));
        let goals: Vec<String> = mine[0].targets.iter().map(|(n, _, _)| n.clone()).collect();
        for g in goals {
            let mut row = format!("| {g} |");
            for r in &mine {
                let c = match r.targets.iter().find(|(n, _, _)| *n == g) {
                    Some((_, v, Some(true))) => format!("met ({v})"),
                    Some((_, v, Some(false))) => format!("**NOT MET** ({v})"),
                    Some((_, v, None)) => format!("not measured ({v})"),
                    None => "-".into(),
                };
                let _ = write!(row, " {} |", c.replace('|', "/"));
            }
            let _ = writeln!(t, "{row}");
        }
        let _ = writeln!(t);
    }
    t
}

fn f2(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into())
}

fn secs_opt(v: Option<f64>) -> String {
    v.map(|x| format!("{:.1}", x / 1e3)).unwrap_or_else(|| "-".into())
}

fn render_table(sums: &[Summary]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| scenario | runs | faults | detected | latency median s | latency p90 s | precision | precision (time only) | recall | localization (faults) | localization (events) | net events | false alarms (healthy time) | FA/h | straggler as network | straggler events | job comm ms/step before → during |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let row = |t: &mut String, s: &Summary| {
        let failed = if s.failed_runs > 0 { format!(" ({} failed)", s.failed_runs) } else { String::new() };
        let _ = writeln!(
            t,
            "| {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} in {:.0} s | {} | {} | {} | {} |",
            s.name,
            s.runs,
            failed,
            s.faults,
            s.detected,
            secs_opt(quantile(&s.latencies_ms, 0.5)),
            secs_opt(quantile(&s.latencies_ms, 0.9)),
            f2(s.precision()),
            f2(s.precision_time_only()),
            f2(s.recall()),
            f2(s.localization()),
            f2(s.event_localization()),
            s.network_events,
            s.healthy_false_alarms,
            s.healthy_s,
            s.fa_per_hour().map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into()),
            if s.name == "straggler" { s.straggler_as_network.to_string() } else { "-".into() },
            s.straggler_events,
            match (quantile(&s.comm_before_ms, 0.5), quantile(&s.comm_during_ms, 0.5)) {
                (Some(b), Some(d)) => format!("{b:.0} → {d:.0}"),
                (Some(b), None) => format!("{b:.0}"),
                _ => "-".into(),
            },
        );
    };
    for s in sums {
        row(&mut t, s);
    }
    t
}

type Target = (String, String, Option<bool>);

fn targets(sums: &[Summary], o: &Summary) -> Vec<Target> {
    let mut v = Vec::new();
    let med = quantile(&o.latencies_ms, 0.5);
    v.push(("median detection latency <= 2 s (all network faults)".into(), secs_opt(med) + " s", med.map(|m| m <= 2000.0)));
    // Issue 9: loss >= 1 % and rate caps, median and p90.
    let hard: Vec<f64> = sums
        .iter()
        .filter(|s| matches!(s.name.as_str(), "loss-1" | "loss-2" | "loss-5" | "ratecap-quarter"))
        .flat_map(|s| s.latencies_ms.iter().copied())
        .collect();
    let (hm, h90) = (quantile(&hard, 0.5), quantile(&hard, 0.9));
    v.push(("median latency <= 2 s, loss >= 1 % and rate caps".into(), secs_opt(hm) + " s", hm.map(|m| m <= 2000.0)));
    v.push(("p90 latency <= 5 s, loss >= 1 % and rate caps".into(), secs_opt(h90) + " s", h90.map(|m| m <= 5000.0)));
    // Precision over the network-fault scenarios only (false alarms of healthy and straggler runs are scored below).
    let net_events: usize = sums.iter().filter(|s| s.network_fault).map(|s| s.network_events).sum();
    let p = (net_events > 0).then(|| o.matched_network_events as f64 / net_events as f64);
    let pt = (net_events > 0).then(|| o.timely_network_events as f64 / net_events as f64);
    v.push(("precision >= 0.95 (network-fault runs)".into(), format!("{} (time only: {})", f2(p), f2(pt)), p.map(|x| x >= 0.95)));
    v.push(("recall >= 0.9".into(), f2(o.recall()), o.recall().map(|x| x >= 0.9)));
    v.push(("localization correct in >= 90% of detected faults".into(), f2(o.localization()), o.localization().map(|x| x >= 0.9)));
    let healthy_runs: Vec<&Summary> = sums.iter().filter(|s| s.name == "healthy").collect();
    let (hs, hfa) = healthy_runs.iter().fold((0.0, 0), |(a, b), s| (a + s.healthy_s, b + s.healthy_false_alarms));
    let ten_min = if hfa > 0 { Some(false) } else if hs >= 600.0 { Some(true) } else { None };
    v.push((
        "zero false alarms in a 10-minute healthy run".into(),
        format!("{hfa} in {hs:.0} s of healthy runs; {} in {:.0} s incl. warm-ups", o.healthy_false_alarms, o.healthy_s),
        ten_min,
    ));
    let any: usize = healthy_runs.iter().map(|s| s.events_any).sum();
    let quiet = if any > 0 { Some(false) } else if hs >= 600.0 { Some(true) } else { None };
    v.push(("zero events of any kind (stragglers too) in 10 minutes healthy".into(), format!("{any} in {hs:.0} s of healthy runs"), quiet));
    v.push((
        "no healthy host named a straggler (any scenario)".into(),
        format!("{} straggler events naming a host that is not the straggler", o.straggler_wrong_host),
        Some(o.straggler_wrong_host == 0),
    ));
    let st: Vec<&Summary> = sums.iter().filter(|s| s.name == "straggler" && s.runs > s.failed_runs).collect();
    let n: usize = st.iter().map(|s| s.straggler_as_network).sum();
    v.push(("compute straggler never reported as a network fault".into(), format!("{n} network events"), (!st.is_empty()).then_some(n == 0)));
    let sr: Vec<String> = st.iter().map(|s| format!("{}/{}", s.localized, s.faults)).collect();
    v.push((
        "(straggler detected as straggler naming its host)".into(),
        sr.join(", "),
        st.first().filter(|s| s.faults > 0).map(|s| s.localized as f64 / s.faults as f64 >= 0.9),
    ));
    v
}

fn run_json(r: &RunResult) -> Value {
    let scored = |events: &[(usize, Value)]| -> Vec<Value> {
        events
            .iter()
            .map(|(a, e)| json!({"agent": a, "event": e, "matches_fault": r.fault.as_ref().is_some_and(|f| matches_fault(e, f, r.scenario == Scenario::Straggler)), "names_place": names_place(*a, e, &r.place)}))
            .collect()
    };
    json!({
        "source": r.source.name(), "vantage": r.vantage.name(), "mpi_algorithm": r.algorithm.map(MpiAlgorithm::name),
        "scenario": r.scenario.name(), "repeat": r.repeat, "target": r.target, "error": r.error,
        "fault": r.fault, "fault_log": r.fault_log, "healthy_from_unix_ms": r.healthy_from_ms, "healthy_to_unix_ms": r.healthy_to_ms,
        "windows": r.windows,
        "events": scored(&r.events),
        "raw_events": r.raw_events.iter().map(|(a, e)| json!({"agent": a, "event": e})).collect::<Vec<_>>(),
        "fleet_withheld": r.fleet_withheld,
        // The plain merge of the same events (every agent's blame repeated), to compare with the fleet's.
        "merged_events": scored(&r.merged_events),
        "job": r.job,
    })
}

fn command_line(o: &Opts) -> String {
    let mut c = "cargo xtask eval detection".to_string();
    if o.quick {
        c += " --quick";
    } else if o.repeats != 2 {
        let _ = write!(c, " --repeats {}", o.repeats);
    }
    for s in &o.sources {
        let _ = write!(c, " --source {s}");
    }
    for s in &o.scenarios {
        let _ = write!(c, " --scenario {s}");
    }
    for v in &o.vantages {
        let _ = write!(c, " --vantage {v}");
    }
    if o.seed != 1 {
        let _ = write!(c, " --seed {}", o.seed);
    }
    for (flag, v) in [("--warmup-s", o.warmup_s), ("--fault-s", o.fault_s), ("--healthy-s", o.healthy_s)] {
        if let Some(v) = v {
            let _ = write!(c, " {flag} {v}");
        }
    }
    c
}

#[allow(clippy::too_many_arguments)]
fn render_markdown(
    command: &str,
    machine: &str,
    load_before: &str,
    load_after: &str,
    elapsed: Duration,
    p: Phases,
    repeats: u32,
    capacity: f64,
    cap: u64,
    per_source: &[SourceReport],
    comparison: &str,
    results: &[RunResult],
) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "# Detection evaluation\n");
    let _ = writeln!(m, "Generated by `{command}` (xtask/src/eval_detection.rs); raw runs and events in `target/eval/detection.json`, plots in `target/eval/detection-SOURCE.png`.\n");
    let _ = writeln!(m, "- Machine: {machine}; load average {load_before} before, {load_after} after (other work shares this machine).");
    let _ = writeln!(
        m,
        "- Run time {:.0} s; {repeats} run(s) per scenario; phases: warm-up {} s (+0–2 s jitter), fault {} s, cool-down {} s, healthy runs {} s.",
        elapsed.as_secs_f64(),
        p.warmup.as_secs(),
        p.fault.as_secs(),
        p.cooldown.as_secs(),
        p.healthy.as_secs()
    );
    let _ = writeln!(m, "- Measured link capacity (1 TCP stream, veth, offloads off): {capacity:.0} Mbit/s; the uplink cap is 1/4 of it = {cap} Mbit/s; the star's rate cap is 1/4 of the rate the faulted host sent at during its warm-up (see each run's target).\n");
    let _ = writeln!(m, "## Setup\n");
    let _ = writeln!(
        m,
        "- Star scenarios: 6 hosts, offloads off, the release agent in the switch namespace on every bridge port (the T2 tests' vantage), \
         `[match]` on the whole rig prefix (all traffic, so what shares a link with the job is seen), one `[[job]]` per traffic source (below), 6 ranks.\n\
         - Traffic sources (`--source`): `rank` is ringside's own emulated job (`ringside-rank`, ring allreduce of 4 MiB, 50 ms compute per step; job = members 10.77.0.0/24, TCP 29500); \
         `openmpi` is OpenMPI 4.1's `MPI_Allreduce` of 4 MiB after a 50 ms compute sleep per step (`ringside-testbed mpi`: mpirun across the host namespaces, TCP BTL on ports 30000-30063; job = those ports), \
         run i of each scenario with the ((i + scenario index) mod 5)-th of OpenMPI's default decision, ring, segmented ring, recursive doubling and Rabenseifner; \
         `torch` is PyTorch DDP over gloo on CPU (`ringside-testbed torch`: a real model and optimizer, one rank per host; gloo picks its own ports, so the job is the ranks' addresses with no port filter). \
         The agent's configuration is the same for every source but the `[[job]]` lines: no tuning per source.\n\
         - Uplink congestion: leaf-spine 2 leaves × 3 hosts; job ranks on h0, h1 (leaf 0) and h3, h4 (leaf 1); one agent per leaf namespace \
         on its host ports and its `uplink`; the faulted leaf's uplink is capped at {cap} Mbit/s from the start (the fabric's bottleneck, not \
         scored as a fault); the fault is 4 unbounded TCP streams from that leaf's spare host to the other leaf's spare host, whose path \
         (the two spare hosts' links and both uplinks) keeps TSO/GSO so the streams load the uplink rather than the CPUs the ranks share.\n\
         - Targets (host, link, rank) and the injection time are drawn from a seeded generator (`--seed`); nftables' random drop itself is not seedable.\n\
         - The compute straggler ({STRAGGLER_EXTRA_MS} ms extra per step) is a job parameter: it is active from the job's start, so its runs have no healthy warm-up.\n"
    );
    if per_source.iter().any(|r| r.vantage == Vantage::Ipu) {
        let _ = writeln!(
            m,
            "- IPU vantage (`--vantage ipu`): `testbed::IpuStar`, the same 6 hosts and addresses, each host cabled to its own IPU namespace \
             (`ringside ipu-wire`, the eBPF redirect forwarder) and the IPU to the switch's bridge; one release agent in **every** IPU namespace, \
             attached to its `fabric` port only, so each sees its own host's traffic and nothing else; the same configuration as the switch's agent \
             plus `[detect.gray] min_peers = 2` (an IPU sees two peers of a ring; the operator guide's IPU setting). Faults go on link `h<i>`, \
             IPU i's fabric cable (loss at the switch port, rate cap on both ends, flap of the switch port), as on the star's host links; the rate \
             cap is 1/4 of what the faulted host sent (its IPU's `fabric` egress). Same seed, same targets and injection times as the switch vantage \
             (one generator per vantage); the vantages of a run follow each other, so they share the machine's load. `uplink-congestion` \
             has no IPU rig (the leaf-spine has no IPUs) and runs only at the switch vantage.\n"
        );
    }
    let _ = writeln!(m, "## Scoring\n");
    let _ = writeln!(
        m,
        "- An event *matches* a fault if it is a network-fault event (congestion, gray_failure) raised between the fault's recorded start and \
         its end + {} s; for the straggler, a straggler event in the same window.\n\
         - Latency: first matching event's `raised_unix_ms` − the fault's recorded start. Precision: network events that match a fault in time \
         *and* name the faulted place / all network events of the scenario (warm-up, late, or blaming a healthy neighbour are false); \
         \"precision (time only)\" drops the place condition. Recall: faults with a matching event / faults.\n\
         - Localization (faults): detected faults with at least one matching event that names the faulted host's address or its bridge port \
         (uplink: a link-scoped event on the faulted leaf agent's `uplink`; a straggler: its host's address). Localization (events): the share \
         of matching events that name it (neighbours blamed too lower it).\n\
         - False alarms: network events raised while the job was healthy (whole healthy runs, every warm-up), per hour of that time.\n",
        GRACE_MS / 1000
    );
    if per_source.iter().any(|r| r.vantage == Vantage::Ipu) {
        let _ = writeln!(
            m,
            "- IPU vantage: the six agents' events are judged together before scoring, by the provider's fleet view (`ringside fleet`, \
             `ringside_client::fleet`, docs/operator-guide.md \"Fleet view\"): each network event is a blame of one host (a peer-scoped event its \
             peer, a link-scoped event the agent's own host, since the agent's one port is its host's fabric cable) claiming the fault's \
             estimated time (started..ended, ±{slack} ms), decided as a live fleet would from what had been raised by then: repeated unless the \
             blamed host's agent blames the accuser back in that time while the accuser is named by at least as many agents, and only once \
             a second agent (or the host's own link verdict) agrees or after {hold} ms alone; a blame on in-burst goodput alone (its event's \
             `signals`: what a busy host looks like too) only once two agents besides the host's own name it, or a blame with other evidence \
             agrees. Blames of one host agreeing in time are one event, \
             raised when the fleet first repeated one (`ipu_named_host`, `ipu_agents`, `fleet_witnesses` in the JSON; `raw_events` keeps each \
             agent's own, `fleet_withheld` the blames never repeated and why, `merged_events` the plain merge scored in the line under each \
             IPU table). Straggler events are judged by the fleet too: repeated only once a second agent names the same host a straggler \
             in that time (a slow worker is late to every peer it sends to; one agent alone is one connection's schedule). Localization is \
             judged on the named host: the faulted host's address is correct, a healthy host is not.\n",
            hold = ringside_client::fleet::Rules::default().lone_blame_hold_ms,
            slack = ringside_client::fleet::Rules::default().overlap_slack_ms
        );
    }
    let _ = writeln!(m, "## Results per traffic source\n");
    for rep in per_source {
        let _ = writeln!(m, "### {}\n\n{}.\n", rep.title(), rep.source.describe());
        m.push_str(&rep.table);
        if let Some(sums) = &rep.plain_merge {
            // As the table's "all network faults" row: events of the network-fault runs.
            let p = overall(sums);
            let net: usize = sums.iter().filter(|s| s.network_fault).map(|s| s.network_events).sum();
            let _ = writeln!(
                m,
                "\nThe same runs scored on the plain merge (every agent's blame repeated, no fleet view; network events naming one host with \
                 overlapping lifetimes counted once, as the fleet counts): all network faults {}/{} detected, \
                 median latency {} s, precision {} ({net} network events, {} naming the faulted host), localization {}.",
                p.detected,
                p.faults,
                secs_opt(quantile(&p.latencies_ms, 0.5)),
                f2((net > 0).then(|| p.matched_network_events as f64 / net as f64)),
                p.matched_network_events,
                f2(p.localization())
            );
        }
        if !rep.by_algorithm.is_empty() {
            let _ = writeln!(m, "\nBy OpenMPI algorithm (run i of each scenario uses the i-th algorithm, shifted by the scenario's index):\n");
            m.push_str(&rep.by_algorithm);
        }
        let _ = writeln!(m, "\nTargets ({}):\n", rep.title());
        let _ = writeln!(m, "| target | measured | status |\n|---|---|---|");
        for (n, v, ok) in &rep.targets {
            let st = match ok {
                Some(true) => "met",
                Some(false) => "**NOT MET**",
                None => "not measured",
            };
            let _ = writeln!(m, "| {n} | {v} | {st} |");
        }
        let _ = writeln!(m);
    }
    if !comparison.is_empty() {
        let _ = writeln!(m, "## Vantages side by side\n\nThe same scenarios, seed and machine load at each vantage (runs interleaved). \"events\": network events (healthy and straggler rows: events of any kind).\n\n{comparison}");
    }
    let _ = writeln!(m, "\nAnchor: Minder (ByteDance) reports 3.6 s mean reaction with precision 0.904.\n");
    let _ = writeln!(m, "## Caveats of the harness\n");
    let _ = writeln!(
        m,
        "- The star's rate cap is 1/4 of the rate the job sent at on that link (90th percentile of 100 ms samples from the agent's \
         `/v1/flows` at the end of the warm-up), not of the raw veth capacity: with 6 ranks sharing 2 vCPUs the job runs far below \
         the latter, where a cap at 1/4 of it barely changes the job's traffic.\n\
         - The 10-minute false-alarm target needs `--healthy-s 600` (one long healthy run); the default matrix observes less healthy \
         time (healthy runs plus warm-ups) and the target shows \"not measured\" unless an alarm was seen.\n\
         - The straggler is active from the job's first step (no healthy warm-up), so its latency is from the job's start.\n\
         - A single run per scenario (`--quick`) or two (default) give coarse numbers: one missed fault moves recall by 0.5 or 1.\n\
         - The machine is shared (see the load average): CPU contention changes goodput and burst timing, which the detectors measure; \
         the measured link capacity (and so the 1/4 cap) varies from run to run for the same reason.\n\
         - \"job comm ms/step\" comes only from ranks that wrote their report: the job runs until the harness kills it, and a rank \
         writes its JSON only when it ends by itself (here: when a peer was killed first), so it is sometimes missing (\"-\").\n"
    );
    let _ = writeln!(m, "## Runs\n");
    let _ = writeln!(m, "| source | scenario | # | target | events (agent: kind scope, raised relative to the fault start) |\n|---|---|---|---|---|");
    for r in results {
        let ev = if let Some(e) = &r.error {
            format!("run failed: {e}")
        } else if r.events.is_empty() {
            "none".into()
        } else {
            r.events.iter().map(|(a, e)| format!("{}: {}", agents_of(*a, e), brief(e, r.fault.as_ref()))).collect::<Vec<_>>().join("<br>")
        };
        let mut src = r.source.name() + &r.algorithm.map(|a| format!(" ({})", a.name())).unwrap_or_default();
        if r.vantage != Vantage::Switch {
            src = format!("{src} @{}", r.vantage.name());
        }
        let _ = writeln!(m, "| {src} | {} | {} | {} | {} |", r.scenario.name(), r.repeat, r.target, ev.replace('|', "/"));
    }
    m
}

/// Latency (median, p90) per scenario on the left, precision / recall / localization on the right.
fn plot(sums: &[Summary], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    crate::eval::register_font()?;

    let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(650);
    // Short labels fit horizontally under the bars.
    let names: Vec<String> = sums
        .iter()
        .map(|s| s.name.replace("loss-", "loss ").replace("ratecap-quarter", "cap 1/4").replace("uplink-congestion", "uplink"))
        .collect();
    let n = names.len();
    let max_lat = sums.iter().filter_map(|s| quantile(&s.latencies_ms, 0.9)).fold(2500.0f64, f64::max) / 1e3 * 1.15;

    let label = |names: &[String], x: &f64| -> String {
        let i = x.round() as isize;
        if (x - x.round()).abs() < 0.01 && i >= 0 && (i as usize) < names.len() {
            names[i as usize].clone()
        } else {
            String::new()
        }
    };

    let mut c = ChartBuilder::on(&left)
        .caption("Detection latency from fault start (s)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(45)
        .build_cartesian_2d(-0.6f64..(n as f64 - 0.4), 0f64..max_lat)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| label(&names, x))
        .x_label_style(("sans-serif", 13))
        .y_desc("seconds")
        .draw()?;
    for (i, s) in sums.iter().enumerate() {
        let x = i as f64;
        if let Some(p90) = quantile(&s.latencies_ms, 0.9) {
            c.draw_series(std::iter::once(Rectangle::new([(x - 0.35, 0.0), (x + 0.35, p90 / 1e3)], BLUE.mix(0.25).filled())))?;
        }
        if let Some(med) = quantile(&s.latencies_ms, 0.5) {
            c.draw_series(std::iter::once(Rectangle::new([(x - 0.25, 0.0), (x + 0.25, med / 1e3)], BLUE.filled())))?;
        }
        if s.detected == 0 && s.faults > 0 {
            c.draw_series(std::iter::once(Text::new("none", (x - 0.3, max_lat * 0.03), ("sans-serif", 12).into_font().color(&RED))))?;
        }
    }
    c.draw_series(LineSeries::new(vec![(-0.6, 2.0), (n as f64 - 0.4, 2.0)], RED.stroke_width(1)))?
        .label("target 2 s")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], RED));
    c.draw_series(std::iter::once(Rectangle::new([(-10.0, -1.0), (-9.0, -1.0)], BLUE.filled())))?
        .label("median")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], BLUE.filled()));
    c.draw_series(std::iter::once(Rectangle::new([(-10.0, -1.0), (-9.0, -1.0)], BLUE.mix(0.25).filled())))?
        .label("p90")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], BLUE.mix(0.25).filled()));
    c.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).label_font(("sans-serif", 12)).draw()?;

    let mut c = ChartBuilder::on(&right)
        .caption("Precision / recall / localization per scenario", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(45)
        .build_cartesian_2d(-0.6f64..(n as f64 - 0.4), 0f64..1.1f64)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| label(&names, x))
        .x_label_style(("sans-serif", 13))
        .draw()?;
    type Metric = (&'static str, RGBColor, fn(&Summary) -> Option<f64>);
    let series: [Metric; 3] = [
        ("precision", RGBColor(31, 119, 180), Summary::precision),
        ("recall", RGBColor(44, 160, 44), Summary::recall),
        ("localization", RGBColor(255, 127, 14), Summary::localization),
    ];
    for (k, (name, color, f)) in series.iter().enumerate() {
        let w = 0.25;
        let bars: Vec<Rectangle<(f64, f64)>> = sums
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let v = f(s)?;
                let x0 = i as f64 - 0.375 + k as f64 * w;
                Some(Rectangle::new([(x0, 0.0), (x0 + w * 0.9, v.max(0.01))], color.filled()))
            })
            .collect();
        let color = *color;
        c.draw_series(bars)?.label(*name).legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    c.draw_series(LineSeries::new(vec![(-0.6, 0.9), (n as f64 - 0.4, 0.9)], RED.stroke_width(1)))?
        .label("recall/localization target 0.9")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], RED));
    c.configure_series_labels().position(SeriesLabelPosition::UpperRight).background_style(WHITE.mix(0.8)).border_style(BLACK).label_font(("sans-serif", 12)).draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: &str, scope: Value, raised: u64, ended: Option<u64>) -> Value {
        json!({"kind": kind, "scope": scope, "raised_unix_ms": raised, "ended_unix_ms": ended, "severity": "critical"})
    }

    fn peer(addr: &str) -> Value {
        json!({"type": "peer", "peer": addr, "link": "fabric"})
    }

    fn hosts() -> Vec<String> {
        (1..=6).map(|i| format!("10.77.0.{i}")).collect()
    }

    #[test]
    fn two_neighbours_naming_one_host_merge_into_one_event() {
        // IPUs 0 and 2 (host 1's ring neighbours) both name host 1 (10.77.0.2), overlapping.
        let raw = vec![(2, ev("gray_failure", peer("10.77.0.2"), 1_500, None)), (0, ev("gray_failure", peer("10.77.0.2"), 1_000, Some(2_000)))];
        let m = merge_ipu_events(&raw, &hosts());
        assert_eq!(m.len(), 1, "{m:?}");
        let (a, e) = &m[0];
        assert_eq!((*a, raised(e)), (0, 1_000), "the first raise wins");
        assert_eq!(e["ipu_agents"], json!([0, 2]));
        assert!(e["ended_unix_ms"].is_null(), "one of them is still open: so is the merged event");
        assert!(names_place(*a, e, &Place::IpuLink { addr: "10.77.0.2".into() }));
        assert!(!names_place(*a, e, &Place::IpuLink { addr: "10.77.0.3".into() }));
    }

    #[test]
    fn events_apart_in_time_or_kind_or_host_stay_apart() {
        let raw = vec![
            (0, ev("gray_failure", peer("10.77.0.2"), 1_000, Some(2_000))),
            // Raised after the first ended: a second detection.
            (2, ev("gray_failure", peer("10.77.0.2"), 2_500, Some(3_000))),
            (2, ev("straggler", peer("10.77.0.2"), 1_100, None)),
            (1, ev("gray_failure", peer("10.77.0.3"), 1_200, None)),
        ];
        let m = merge_ipu_events(&raw, &hosts());
        assert_eq!(m.len(), 4, "{m:?}");
    }

    #[test]
    fn a_hosts_congestion_and_gray_failure_are_one_event() {
        let raw = vec![(2, ev("congestion", json!({"type": "link", "link": "fabric"}), 1_000, None)), (1, ev("gray_failure", peer("10.77.0.3"), 1_200, Some(3_000)))];
        let m = merge_ipu_events(&raw, &hosts());
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!((m[0].1["ipu_named_host"].as_str(), raised(&m[0].1)), (Some("10.77.0.3"), 1_000));
        assert_eq!(m[0].1["ipu_agents"], json!([2, 1]));
    }

    #[test]
    fn a_link_scoped_event_names_the_ipus_own_host() {
        // IPU 3's verdict on its own fabric cable is about host 3 (10.77.0.4); a neighbour naming
        // host 3 at the same time is the same detection.
        let raw = vec![
            (3, ev("congestion", json!({"type": "link", "link": "fabric"}), 1_000, None)),
            (4, ev("congestion", peer("10.77.0.4"), 1_200, None)),
        ];
        let m = merge_ipu_events(&raw, &hosts());
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(m[0].1["ipu_named_host"], "10.77.0.4");
        assert!(names_place(m[0].0, &m[0].1, &Place::IpuLink { addr: "10.77.0.4".into() }));
    }

    #[test]
    fn the_faulted_ipu_blaming_its_peers_is_wrong() {
        // Host 1's own IPU sees both its ring peers lossy and names them: neither is host 1.
        let raw = vec![(1, ev("gray_failure", peer("10.77.0.1"), 1_000, None)), (1, ev("gray_failure", peer("10.77.0.3"), 1_000, None))];
        let m = merge_ipu_events(&raw, &hosts());
        assert_eq!(m.len(), 2);
        assert!(m.iter().all(|(a, e)| !names_place(*a, e, &Place::IpuLink { addr: "10.77.0.2".into() })));
    }

    /// A whole `/v1/events` event, as an agent serves it.
    fn full_ev(id: u64, kind: &str, scope: Value, raised: u64, ended: Option<u64>) -> Value {
        json!({"id": id, "job": "eval", "kind": kind, "scope": scope, "severity": "critical", "state": if ended.is_some() { "closed" } else { "open" },
               "started_unix_ms": raised, "raised_unix_ms": raised, "ended_unix_ms": ended, "observed_windows": 3, "anomalous_windows": 3, "evidence": []})
    }

    #[test]
    fn the_fleet_drops_the_faulted_ipus_blame_of_a_neighbour_that_names_it_back() {
        // Host 3 (10.77.0.3, ipu2) capped: its IPU names neighbour 10.77.0.4 (ipu3) first; ipu3 and
        // ipu1 name 10.77.0.3. Stragglers: 10.77.0.6 named by ipu4 and ipu0, 10.77.0.1 by ipu2 alone.
        let raw = vec![
            (2, full_ev(1, "gray_failure", peer("10.77.0.4"), 1_000, None)),
            (3, full_ev(5, "gray_failure", peer("10.77.0.3"), 1_100, None)),
            (1, full_ev(8, "gray_failure", peer("10.77.0.3"), 1_300, Some(5_000))),
            (4, full_ev(9, "straggler", peer("10.77.0.6"), 2_000, None)),
            (0, full_ev(3, "straggler", peer("10.77.0.6"), 2_400, None)),
            (2, full_ev(4, "straggler", peer("10.77.0.1"), 2_500, None)),
        ];
        let mut withheld = Vec::new();
        let m = fleet_ipu_events(&raw, &hosts(), &mut withheld).unwrap();
        let named: Vec<(&str, &str, u64)> = m.iter().map(|(_, e)| (kind(e), e["ipu_named_host"].as_str().unwrap(), raised(e))).collect();
        // 10.77.0.4 is never named (alone, then contested); 10.77.0.3 once two agents name it;
        // the straggler 10.77.0.6 once the second IPU sees it late; 10.77.0.1 never.
        assert_eq!(named, vec![("gray_failure", "10.77.0.3", 1_300), ("straggler", "10.77.0.6", 2_400)]);
        assert_eq!(m[0].1["ipu_agents"], json!([3, 1]));
        assert_eq!(m[1].1["ipu_agents"], json!([4, 0]));
        // ipu3's blame is still open: so is the verdict; ipu2's blame of 10.77.0.4 is held back.
        assert_eq!(m[0].1["ended_unix_ms"], Value::Null);
        let held: Vec<(Option<&str>, Option<&str>, Option<bool>)> =
            withheld.iter().map(|w| (w["witness"]["agent"].as_str(), w["witness"]["kind"].as_str(), w["contested"].as_bool())).collect();
        assert_eq!(held, vec![(Some("ipu2"), Some("gray_failure"), Some(true)), (Some("ipu2"), Some("straggler"), Some(false))], "{withheld:?}");
        assert!(names_place(m[0].0, &m[0].1, &Place::IpuLink { addr: "10.77.0.3".into() }));
        // An event that is not an agent's event is an error, not a silent drop.
        assert!(fleet_ipu_events(&[(0, json!({"kind": "congestion"}))], &hosts(), &mut withheld).is_err());
    }

    #[test]
    fn a_vantage_without_a_rig_for_a_scenario_skips_it() {
        assert!(Vantage::Switch.runs(Scenario::UplinkCongestion));
        assert!(!Vantage::Ipu.runs(Scenario::UplinkCongestion));
        assert!(ALL.iter().filter(|&&sc| sc != Scenario::UplinkCongestion).all(|&sc| Vantage::Ipu.runs(sc)));
    }
}
