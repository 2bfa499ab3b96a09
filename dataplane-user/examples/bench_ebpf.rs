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
//! Flows resident: before measuring, `FLOWS` (sized `--map-entries` at load time; and
//! `FLOW_STATE` in objects from before the two maps were merged, so they can be compared with
//! `--object`) are filled from user space with other flows, to each level of `--resident` in turn (default
//! 1k, 10k, 100k); every level is measured in its own interleaved rounds. The hash lookups then
//! walk a map whose buckets and elements no longer all sit in the cache, as on a busy host.
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
    maps::{Array, HashMap, Map, MapData, PerCpuHashMap, PerCpuValues},
    programs::SchedClassifier,
    EbpfLoader,
};
use clap::Parser;
use dataplane_common::{
    direction, flow_hash, flow_kind, maps, programs, slot_state, wire, Config, FlowKey, FlowSlot, FlowStats, PortRange, FLOW_PROBES,
};
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
    /// Other flows resident in `FLOWS` (and `FLOW_STATE` of older objects) while measuring, comma-separated levels
    /// (each measured in turn, maps filled incrementally).
    #[arg(long, value_delimiter = ',', default_values_t = [1_000u32, 10_000, 100_000])]
    resident: Vec<u32>,
    /// Capacity of `FLOWS` (and `FLOW_STATE` of older objects) set at load time: at least twice the
    /// largest level (the operator guide's sizing; an open-addressing `FLOWS` fills its probe
    /// windows above that load) and a power of two.
    #[arg(long, default_value_t = 262_144)]
    map_entries: u32,
}

struct Case {
    name: &'static str,
    frame: Vec<u8>,
    /// Target for the delta over noop (from the issue).
    target_ns: f64,
}

#[derive(Serialize, Clone)]
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
    /// Capacity of the flow maps in this run.
    map_entries: u32,
    /// The kernel's memory accounting (`memlock` in /proc/self/fdinfo) of the loaded objects' flow
    /// maps at that capacity (one row per map type and value size): what an operator sizing the
    /// maps pays.
    map_memory: Vec<MapMemory>,
    /// One entry per `--resident` level: every object's results with that many other flows in
    /// the maps (`cases` / `variants` above are the first level's).
    levels: Vec<LevelReport>,
}

#[derive(Serialize, Clone)]
struct MapMemory {
    /// BPF_MAP_TYPE_* number (9 LRU hash, 10 LRU per-CPU hash).
    map_type: u32,
    max_entries: u32,
    value_size: u32,
    memlock_bytes: u64,
}

/// The hash maps of this process with `max_entries` entries, as the kernel accounts them.
fn map_memory(max_entries: u32) -> Vec<MapMemory> {
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir("/proc/self/fdinfo") else { return out };
    for e in dir.flatten() {
        let Ok(text) = fs::read_to_string(e.path()) else { continue };
        let field = |name: &str| {
            text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<u64>().ok()))
        };
        if let (Some(t), Some(n), Some(v), Some(m)) = (field("map_type:"), field("max_entries:"), field("value_size:"), field("memlock:")) {
            if n == u64::from(max_entries) && (t == 9 || t == 10 || t == 2) {
                out.push(MapMemory { map_type: t as u32, max_entries: n as u32, value_size: v as u32, memlock_bytes: m });
            }
        }
    }
    out.sort_by_key(|m| (m.map_type, m.value_size));
    out.dedup_by_key(|m| (m.map_type, m.value_size));
    out
}

#[derive(Serialize)]
struct LevelReport {
    flows_resident: u32,
    variants: Vec<VariantReport>,
}

#[derive(Serialize, Clone)]
struct VariantReport {
    object: String,
    cases: Vec<CaseReport>,
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string()
}

/// Loads an object (or the embedded one), loads both programs and writes the benchmark config.
fn load(object: Option<&PathBuf>, config: Config, map_entries: u32) -> Result<aya::Ebpf> {
    let mut loader = EbpfLoader::new();
    loader.map_max_entries(maps::FLOWS, map_entries).map_max_entries(OLD_FLOW_STATE, map_entries);
    let mut ebpf = match object {
        Some(path) => loader.load_file(path).with_context(|| format!("load {}", path.display()))?,
        None => {
            let object = dataplane_user::object::flowmon_object()
                .context("set RINGSIDE_EBPF_OBJECT to the built flowmon object")?;
            loader.load(object).context("load the flowmon object")?
        }
    };
    for name in [programs::FLOWMON, programs::NOOP] {
        let prog: &mut SchedClassifier = ebpf.program_mut(name).context("program missing")?.try_into()?;
        prog.load().with_context(|| format!("verifier rejected {name}"))?;
    }
    let cfg_map = ebpf.map_mut(maps::CONFIG).context("CONFIG")?;
    if cfg_map_value_size(cfg_map) == OLD_CONFIG_SIZE as u32 {
        // An object from before `flow_slot_mask` / `hash_seed` (layout 2): the same fields
        // without those 8 bytes before the port ranges.
        let new = zerocopy::IntoBytes::as_bytes(&config);
        let mut old = [0u8; OLD_CONFIG_SIZE];
        old[..24].copy_from_slice(&new[..24]);
        old[24..].copy_from_slice(&new[32..]);
        let mut cfg: Array<&mut MapData, [u8; OLD_CONFIG_SIZE]> = Array::try_from(cfg_map)?;
        cfg.set(0, old, 0)?;
    } else {
        let mut cfg: Array<&mut MapData, Config> = Array::try_from(cfg_map)?;
        cfg.set(0, config, 0)?;
    }
    Ok(ebpf)
}

const NCCL_PORT: u16 = 29500;

/// `Config` of objects from before layout 3 (no `flow_slot_mask`, `hash_seed`).
const OLD_CONFIG_SIZE: usize = 152;

fn cfg_map_value_size(map: &Map) -> u32 {
    let data = match map {
        Map::Array(m) => m,
        _ => return 0,
    };
    data.info().map(|i| i.value_size()).unwrap_or(0)
}

/// The `i`-th resident flow: 10.200.0.0/16 → 10.201.0.0/16 on ports 30000+, disjoint from the
/// measured cases' flows (10.0.0.1 ↔ 10.0.0.2), with the ifindex the cases run with.
fn resident_key(i: u32, ifindex: u32) -> FlowKey {
    let mapped = |net: u8, i: u32| {
        let mut a = [0u8; 16];
        a[10] = 0xff;
        a[11] = 0xff;
        a[12] = 10;
        a[13] = net;
        a[14] = (i >> 8) as u8;
        a[15] = i as u8;
        a
    };
    FlowKey {
        src_addr: mapped(200, i & 0xffff),
        dst_addr: mapped(201, i & 0xffff),
        src_port: 30_000 + (i >> 16) as u16,
        dst_port: NCCL_PORT,
        ifindex,
        protocol: 6,
        direction: direction::INGRESS,
        kind: flow_kind::TCP,
        _pad: 0,
    }
}

/// `FLOW_STATE`: the shared map of objects from before `FLOW_STATE` was merged into `FLOWS`.
const OLD_FLOW_STATE: &str = "FLOW_STATE";
/// Value sizes of those objects: per-CPU `FLOWS` 176 bytes, `FLOW_STATE` 56 bytes.
const OLD_FLOWS_VALUE: usize = 176;
const OLD_FLOW_STATE_VALUE: usize = 56;

/// The first `N` bytes of `words` (native endian), the rest zero: a value for an older object's
/// layout, whose leading fields are the same counters.
fn value_bytes<const N: usize>(words: &[u64]) -> [u8; N] {
    let mut v = [0u8; N];
    for (i, w) in words.iter().enumerate().take(N / 8) {
        v[i * 8..i * 8 + 8].copy_from_slice(&w.to_ne_bytes());
    }
    v
}

/// Inserts resident flows `from..to` into every object's flow maps, with values a live flow would
/// have: `FLOWS` (shared; or every CPU's copy in an older object's per-CPU `FLOWS`) and an older
/// object's `FLOW_STATE`.
fn fill(ebpf: &mut aya::Ebpf, from: u32, to: u32, ifindex: u32) -> Result<()> {
    let ncpus = aya::util::nr_cpus().map_err(|(_, e)| e).context("count CPUs")?;
    let stats = FlowStats {
        packets: 10,
        bytes: 15_000,
        payload_bytes: 14_480,
        last_seen_ns: 2,
        burst_start_ns: 1,
        first_seen_ns: 1,
        ..Default::default()
    };
    let flows = ebpf.map_mut(maps::FLOWS).context("FLOWS")?;
    if matches!(flows, Map::Array(_)) {
        // Layout 3: the open-addressing array. Put each flow where the program would: its home
        // slot or the first free one after it (seed 0, the benchmark's config).
        let mut table: Array<&mut MapData, FlowSlot> = Array::try_from(flows)?;
        let mask = table.len() - 1;
        for i in from..to {
            let key = resident_key(i, ifindex);
            let h = flow_hash(&key, 0);
            let mut placed = false;
            for p in 0..FLOW_PROBES {
                let idx = (h as u32).wrapping_add(p) & mask;
                if table.get(&idx, 0)?.state != slot_state::EMPTY {
                    continue;
                }
                let slot = FlowSlot { state: slot_state::with_fp(slot_state::LIVE, h), key, _pad: 0, stats };
                table.set(idx, slot, 0).with_context(|| format!("write resident flow {i} into FLOWS"))?;
                placed = true;
                break;
            }
            if !placed {
                bail!("resident flow {i}: {FLOW_PROBES} slots from its home are taken; give a larger --map-entries");
            }
        }
    } else if matches!(flows, Map::PerCpuLruHashMap(_) | Map::PerCpuHashMap(_)) {
        // Older layout: packets, bytes, payload_bytes, first_seen_ns, last_seen_ns, ...
        let old: [u8; OLD_FLOWS_VALUE] = value_bytes(&[10, 15_000, 14_480, 1, 2]);
        let mut flows: PerCpuHashMap<&mut MapData, FlowKey, [u8; OLD_FLOWS_VALUE]> = PerCpuHashMap::try_from(flows)?;
        for i in from..to {
            let values = PerCpuValues::try_from(vec![old; ncpus])?;
            flows.insert(resident_key(i, ifindex), values, 0).with_context(|| format!("insert resident flow {i} into FLOWS"))?;
        }
    } else {
        let mut flows: HashMap<&mut MapData, FlowKey, FlowStats> = HashMap::try_from(flows)?;
        for i in from..to {
            flows.insert(resident_key(i, ifindex), stats, 0).with_context(|| format!("insert resident flow {i} into FLOWS"))?;
        }
    }
    if let Some(map) = ebpf.map_mut(OLD_FLOW_STATE) {
        // Older layout: the burst (start, last, bytes, packets), then the tracking words.
        let state: [u8; OLD_FLOW_STATE_VALUE] = value_bytes(&[1, 2, 15_000, 10]);
        let mut st: HashMap<&mut MapData, FlowKey, [u8; OLD_FLOW_STATE_VALUE]> = HashMap::try_from(map)?;
        for i in from..to {
            st.insert(resident_key(i, ifindex), state, 0).with_context(|| format!("insert resident flow {i} into FLOW_STATE"))?;
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.rounds == 0 || args.repeat == 0 {
        bail!("--rounds and --repeat must be at least 1");
    }
    let mut levels = args.resident.clone();
    levels.sort_unstable();
    levels.dedup();
    match levels.last() {
        None => bail!("--resident needs at least one level (e.g. --resident 0)"),
        Some(&top) if top > 0x7f_ffff || 2 * top > args.map_entries => {
            bail!("--resident {top} does not fit: give --map-entries of at least {} (and at most 8388607 flows)", (2 * top).next_power_of_two())
        }
        _ => {}
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("bench_ebpf loads eBPF programs and runs BPF_PROG_TEST_RUN: run it as root (e.g. `cargo xtask bench`)");
    }
    let loadavg_before = loadavg();
    if !args.map_entries.is_power_of_two() {
        bail!("--map-entries must be a power of two (FLOWS is an open-addressing table since layout 3)");
    }
    let mut config = Config::default();
    config.flow_slot_mask = args.map_entries - 1;
    config.n_port_ranges = 1;
    config.port_ranges[0] = PortRange { lo: NCCL_PORT, hi: NCCL_PORT + 10, protocol: 0, _pad: [0; 3] };
    let objects: Vec<Option<&PathBuf>> =
        if args.object.is_empty() { vec![None] } else { args.object.iter().map(Some).collect() };
    let mut loaded = Vec::new();
    for o in &objects {
        let label = o.map_or_else(|| "embedded".to_string(), |p| p.display().to_string());
        loaded.push((label, load(*o, config, args.map_entries)?));
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
            target_ns: 50.0,
        },
        Case {
            name: "rocev2_matched",
            frame: frames::rocev2_4(a, b, 50000, wire::bth_opcode::RC_RDMA_WRITE_MIDDLE, 0x11, 7, &[], &[0xab; 1024]),
            target_ns: 50.0,
        },
        Case {
            name: "unmatched",
            frame: frames::tcp4(a, b, 22, 40000, 1, 1, wire::TCP_ACK | wire::TCP_PSH, 0, &[0x5a; 1448]),
            target_ns: 10.0,
        },
    ];

    let ctx = SkbContext::ingress();
    let nv = loaded.len();
    let mut level_reports = Vec::new();
    let mut filled = 0u32;
    for &level in &levels {
        for (_, ebpf) in loaded.iter_mut() {
            fill(ebpf, filled, level, testrun::LOOPBACK_IFINDEX)?;
        }
        filled = level;
        let mut progs: Vec<(&SchedClassifier, &SchedClassifier)> = Vec::new();
        for (_, ebpf) in &loaded {
            let flowmon: &SchedClassifier = ebpf.program(programs::FLOWMON).unwrap().try_into()?;
            let noop: &SchedClassifier = ebpf.program(programs::NOOP).unwrap().try_into()?;
            progs.push((flowmon, noop));
        }
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
        let variants: Vec<VariantReport> = loaded
            .iter()
            .enumerate()
            .map(|(v, (label, _))| VariantReport { object: label.clone(), cases: case_reports(&cases, &noop_ns[v], &flowmon_ns[v]) })
            .collect();
        level_reports.push(LevelReport { flows_resident: level, variants });
    }

    println!(
        "flowmon vs noop, BPF_PROG_TEST_RUN, repeat {} x {} rounds, CPU {cpu}, maps sized {} (median ns/packet)",
        args.repeat, args.rounds, args.map_entries
    );
    println!("loadavg before: {loadavg_before}");
    for l in &level_reports {
        for v in &l.variants {
            println!("{} other flows resident{}", l.flows_resident, if nv > 1 { format!(", object {}", v.object) } else { String::new() });
            print_table(&v.cases);
        }
    }
    let loadavg_after = loadavg();
    println!("loadavg after:  {loadavg_after}");
    let map_memory = map_memory(args.map_entries);
    for m in &map_memory {
        let name = match (m.map_type, m.value_size as usize) {
            (10, _) => "FLOWS of an older object (LRU per-CPU hash)",
            (2, _) => "FLOWS (mmapable array of slots)",
            (9, OLD_FLOW_STATE_VALUE) => "FLOW_STATE of an older object (LRU hash)",
            _ => "FLOWS (LRU hash)",
        };
        println!(
            "{name}: {} entries, value {} bytes: {:.1} MiB ({:.0} bytes per entry) on {} CPUs",
            m.max_entries,
            m.value_size,
            m.memlock_bytes as f64 / (1 << 20) as f64,
            m.memlock_bytes as f64 / f64::from(m.max_entries),
            aya::util::nr_cpus().unwrap_or(0)
        );
    }

    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let variants = level_reports.first().context("no level measured")?.variants.clone();
    let cases_first = variants[0].cases.clone();
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
        map_entries: args.map_entries,
        map_memory,
        levels: level_reports,
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
