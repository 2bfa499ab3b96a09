//! `cargo xtask bench agent`: what the agent itself costs (CPU, memory, `/metrics`) while it tracks
//! 1k, 10k and 100k flows.
//!
//! Method, per level of `--flows`:
//! - a 2-host namespace star (h0, h1 on one bridge, in a switch namespace); the release `ringside`
//!   agent runs in the switch namespace, attached to h0's bridge port, polling every 100 ms
//!   (`poll_interval_ms = 100`), `[match] udp_ports` covering the flows, `kernel_max_flows` sized
//!   as docs/operator-guide.md says (next power of two ≥ 2 × flows, at least the default 16,384),
//!   and so is `kernel_event_ring_kib` (two polls' burst-end events, at least the default 256);
//!   detection stays on, as in production;
//! - a sender thread of this process, inside h0, sends real UDP datagrams through the classifier:
//!   `flows` distinct 5-tuples (sockets bound to source ports 50000.., each sending to up to
//!   25,000 destination ports 20000..) with `sendmmsg`, every flow once per round, rounds paced to
//!   `--rate-per-flow` per second. h1 drops them in nftables' prerouting hook (no socket, no ICMP);
//!   the classifier sees them on the bridge port before that;
//! - once the agent reports every flow in `ringside_flows_tracked`, `--warmup` seconds pass, then a
//!   window of `--seconds`: agent CPU is the utime+stime delta of `/proc/PID/stat` (all threads)
//!   divided by wall time (% of one core), the sender thread's likewise (its CPU includes the
//!   kernel's veth and bridge work done in its context, so it shows how busy the machine was).
//!   No scrape happens inside the window; `/metrics` is read just before and just after it for
//!   the counters (flows tracked, map-full, ring-buffer-full, evictions, dropped windows, polls);
//! - then VmRSS / VmHWM of the agent, and `--scrapes` timed `GET /metrics` (median and max, and
//!   the body's size), made from inside the switch namespace, 100 ms apart.
//!
//! - where it runs (`--cpus`, default `isolated`): the agent's threads on the first CPU this
//!   command may use, the sender thread and the rig's receive processing (RPS on every link end)
//!   on the others. Packets are processed in softirq context on whatever CPU raised or received
//!   them, and this kernel (no `CONFIG_IRQ_TIME_ACCOUNTING`) charges that time to the task that
//!   was running: at 100k flows, with everything shared, `perf` found 29 % of the agent's samples
//!   in `handle_softirqs`, the sender's datagrams crossing veth, bridge and nftables. Kept apart,
//!   the agent's figure is its own work (its classifier runs are the traffic's, measured per
//!   packet by `bench ebpf`). `--cpus shared` measures as before (nothing pinned, RPS over all
//!   CPUs), for comparison.
//!
//! Nothing is subtracted. Output: a table and `target/bench/agent.json`. Targets (issue 11):
//! ≤ 2 % of a core and ≤ 64 MiB RSS at 10k flows, and 100k flows costing at most 10× the 10k CPU
//! and RSS (linear or better).
use std::{
    net::{Ipv4Addr, UdpSocket},
    os::fd::AsRawFd,
    path::Path,
    process::Stdio,
    sync::{
        atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use testbed::{NetnsHandle, Star, StarConfig};

use crate::{
    agent::{http_get, Agent, AgentSpec},
    eval::{loadavg, machine, release_binaries},
};

/// Options of `cargo xtask bench agent`.
#[derive(Args, Clone, Debug)]
pub struct Opts {
    /// Flow levels to measure (distinct UDP 5-tuples, all active), comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000u32, 10_000, 100_000])]
    pub flows: Vec<u32>,
    /// Seconds of the measurement window per level.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// Seconds between "every flow is tracked" and the window.
    #[arg(long, default_value_t = 5)]
    pub warmup: u64,
    /// Packets per flow per second the sender aims for (every flow is touched this often).
    #[arg(long, default_value_t = 1)]
    pub rate_per_flow: u32,
    /// Timed `GET /metrics` requests per level, after the window.
    #[arg(long, default_value_t = 20)]
    pub scrapes: u32,
    /// `kernel_max_flows` for every level (default: per level, the next power of two ≥ 2 × flows,
    /// at least 16,384).
    #[arg(long)]
    pub kernel_max_flows: Option<u32>,
    /// `kernel_event_ring_kib` for every level (default: per level, two polls' events at one
    /// burst end per packet, as the operator guide sizes it, at least the default 256; the key is
    /// written only when it differs from 256, so older agents can be measured with `--agent-bin`).
    #[arg(long)]
    pub event_ring_kib: Option<u32>,
    /// Use the release binaries already built (skip `cargo xtask build --release`).
    #[arg(long)]
    pub no_build: bool,
    /// Niceness of the agent and of the sender thread (setpriority after they start). Default 0:
    /// run as `nice -n 15 cargo xtask ...` on a shared machine, both would otherwise inherit 15
    /// and be starved by the other niced work, so polls fall behind and the ring buffer
    /// overflows for reasons that are not the agent's.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub nice: i32,
    /// Measure this `ringside` binary instead of the workspace's release build (nothing is
    /// built): to compare builds, or when target/ is shared with other builds.
    #[arg(long, value_name = "PATH")]
    pub agent_bin: Option<std::path::PathBuf>,
    /// Where the agent and the traffic run: `isolated` pins the agent to the first CPU this
    /// command may use and keeps the sender and the rig's packet processing (RPS) on the others,
    /// so that softirq work is not charged to the agent; `shared` pins nothing (the method before
    /// 2026-12-07).
    #[arg(long, value_enum, default_value_t = CpuLayout::Isolated)]
    pub cpus: CpuLayout,
}

/// `--cpus`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuLayout {
    Isolated,
    Shared,
}

/// The CPUs of `--cpus isolated`.
#[derive(Clone, Debug)]
struct Isolation {
    agent: usize,
    traffic: Vec<usize>,
}

impl Isolation {
    /// From the CPUs this process may run on: the first for the agent, the rest for the traffic.
    fn of_this_process() -> Result<Isolation> {
        let allowed = affinity(0).context("reading this process's CPU affinity")?;
        match allowed.split_first() {
            Some((&agent, rest)) if !rest.is_empty() => Ok(Isolation { agent, traffic: rest.to_vec() }),
            _ => bail!(
                "--cpus isolated needs at least two CPUs this command may run on (it has {allowed:?}): one for the agent, one for the traffic; use --cpus shared"
            ),
        }
    }
    fn describe(&self) -> String {
        format!("agent on CPU {}; sender and receive processing (RPS) on CPU {:?}", self.agent, self.traffic)
    }
}

/// The CPUs thread `tid` may run on (0: the calling thread).
fn affinity(tid: i32) -> Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(tid))?;
    Ok((0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect())
}

/// Restricts thread `tid` to `cpus`.
fn pin(tid: i32, cpus: &[usize]) -> Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c)?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set)?;
    Ok(())
}

/// Pins every thread of process `pid` to `cpus` (threads it starts later inherit it).
fn pin_process(pid: u32, cpus: &[usize]) -> Result<()> {
    let dir = format!("/proc/{pid}/task");
    for e in std::fs::read_dir(&dir).with_context(|| format!("read {dir}"))? {
        if let Some(tid) = e?.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) {
            pin(tid, cpus).with_context(|| format!("pinning the agent's thread {tid} to CPU {cpus:?}"))?;
        }
    }
    Ok(())
}

/// `cargo xtask bench agent --help`: the method, for whoever reads the numbers.
pub const METHOD: &str = "\
Agent CPU, memory and /metrics cost while it tracks 1k, 10k and 100k flows (issue 11).

Per level: a 2-host namespace star; the release agent in the switch namespace, attached to h0's \
bridge port, poll_interval_ms = 100, [match] udp_ports covering the flows, kernel_max_flows = the \
next power of two >= 2 x flows (at least 16384; --kernel-max-flows overrides), \
kernel_event_ring_kib = two polls' events at one burst end per packet, 96 bytes each, as a power of \
two (at least 256; --event-ring-kib overrides), detection on. A \
sender thread inside h0 sends real UDP datagrams (sendmmsg) on FLOWS distinct 5-tuples (source \
ports 50000.., up to 25000 destination ports 20000.. each), every flow --rate-per-flow times a \
second; h1 drops them in nftables prerouting. Once /metrics reports every flow tracked, --warmup \
seconds pass, then a window of --seconds with no scrape in it: agent CPU = utime+stime delta of \
/proc/PID/stat (all threads) / wall time, in % of one core; the sender thread's CPU likewise \
(it includes kernel veth/bridge/classifier work done in its context). Then VmRSS and VmHWM, and \
--scrapes timed GET /metrics from inside the switch namespace (median, max, body size). Counters \
over the window: flows tracked, map-full, ring-buffer-full, evictions (idle, capacity), dropped \
detection windows, polls and mean poll time. If the sender cannot keep up, the achieved \
datagrams/s and late rounds are reported, not hidden. Nothing is subtracted. The agent and the \
sender run at niceness --nice (default 0) even when this command is niced, so that other niced \
work on a shared machine does not starve what is measured. --cpus isolated (the default) pins the \
agent's threads to the first CPU this command may use and keeps the sender thread and the rig's \
receive processing (RPS on every link end) on the others: softirq work is charged by this kernel \
to whatever task was running, and at 100k flows it was 29 % of the agent's samples when shared. \
--cpus shared pins nothing (the method before 2026-12-07).

Output: a table and target/bench/agent.json. Targets: at 10k flows <= 2 % of a core and <= 64 MiB \
RSS; 100k flows cost at most 10x the 10k CPU and RSS.";

const AGENT_LISTEN: &str = "127.0.0.1:9464";
/// Destination ports of the flows start here; source ports at [`SRC_PORT_BASE`].
const DST_PORT_BASE: u16 = 20_000;
const MAX_PORTS_PER_SOCKET: u32 = 25_000;
const SRC_PORT_BASE: u16 = 50_000;
/// Datagrams per `sendmmsg` call.
const BATCH: usize = 256;
/// UDP payload bytes per datagram.
const PAYLOAD: usize = 32;
const POLL_INTERVAL_MS: u64 = 100;
/// Issue 11's targets at 10k flows.
const TARGET_CPU_PERCENT: f64 = 2.0;
const TARGET_RSS_MIB: f64 = 64.0;

/// How `flows` 5-tuples are laid out over sockets (source ports) and destination ports.
#[derive(Debug, Clone, Copy, PartialEq)]
struct FlowPlan {
    flows: u32,
    sockets: u32,
    ports_per_socket: u32,
}

impl FlowPlan {
    fn new(flows: u32) -> FlowPlan {
        let sockets = flows.div_ceil(MAX_PORTS_PER_SOCKET).max(1);
        FlowPlan { flows, sockets, ports_per_socket: flows.div_ceil(sockets) }
    }
    /// Flows of socket `s` (the last one may carry fewer).
    fn flows_of(&self, s: u32) -> u32 {
        self.flows.saturating_sub(s * self.ports_per_socket).min(self.ports_per_socket)
    }
    /// The `[match] udp_ports` range, as the config spells it.
    fn dst_range(&self) -> String {
        format!("{}-{}", DST_PORT_BASE, u32::from(DST_PORT_BASE) + self.ports_per_socket - 1)
    }
}

/// `kernel_event_ring_kib` as the operator guide sizes it: two polls' events, every packet of
/// every flow ending a burst (one packet per round), 96 bytes an event.
fn event_ring_kib(flows: u32, rate_per_flow: u32) -> u32 {
    let per_poll = u64::from(flows) * u64::from(rate_per_flow) * POLL_INTERVAL_MS / 1000;
    let kib = (per_poll * 2 * 96).div_ceil(1024).max(256);
    u32::try_from(kib.next_power_of_two()).unwrap_or(u32::MAX)
}

/// `kernel_max_flows` as the operator guide sizes it for `flows` active flows.
fn kernel_capacity(flows: u32) -> u32 {
    (2 * flows).next_power_of_two().max(16_384)
}

pub fn run(o: Opts) -> Result<()> {
    if o.flows.is_empty() || o.flows.contains(&0) || o.seconds == 0 || o.rate_per_flow == 0 || o.scrapes == 0 {
        bail!("--flows (each ≥ 1), --seconds, --rate-per-flow and --scrapes must be at least 1");
    }
    if let Some(&f) = o.flows.iter().find(|&&f| u64::from(f) > u64::from(MAX_PORTS_PER_SOCKET) * u64::from(u16::MAX - SRC_PORT_BASE)) {
        bail!("--flows {f} is more than this rig can address; stay below 1,000,000");
    }
    testbed::require_root().context("bench agent runs network namespaces and attaches eBPF programs")?;
    let built = match &o.agent_bin {
        Some(bin) => bin.clone(),
        None => release_binaries(o.no_build)?.0,
    };
    let out_dir = crate::util::workspace_root().join("target/bench");
    std::fs::create_dir_all(&out_dir)?;
    // target/ may be shared with concurrent builds: measure a private copy of the binary.
    let ringside = out_dir.join(format!("ringside-bench-agent-{}", std::process::id()));
    std::fs::copy(&built, &ringside).with_context(|| format!("copy {}", built.display()))?;
    let _bin_guard = RemoveOnDrop(ringside.clone());
    let stop = testbed::signals::stop_flag();
    let started = Instant::now();
    let load_before = loadavg();
    let isolation = match o.cpus {
        CpuLayout::Isolated => Some(Isolation::of_this_process()?),
        CpuLayout::Shared => None,
    };
    let star = Star::new(StarConfig { hosts: 2, ..Default::default() })?;
    if let Some(iso) = &isolation {
        let mask = testbed::tuning::cpu_set_mask(iso.traffic.iter().copied());
        let ports: Vec<&str> = star.hosts.iter().map(|h| h.switch_port.as_str()).collect();
        testbed::tuning::set_rps(&star.switch.handle(), &ports, &mask)?;
        for h in &star.hosts {
            testbed::tuning::set_rps(&h.ns.handle(), &[h.iface], &mask)?;
        }
        println!("CPUs: {}", iso.describe());
    } else {
        println!("CPUs: shared (nothing pinned, RPS over every CPU)");
    }
    let max_plan = FlowPlan::new(*o.flows.iter().max().expect("non-empty"));
    drop_at_receiver(&star, &max_plan)?;

    let mut levels = Vec::new();
    for &flows in &o.flows {
        check_stop(stop)?;
        let level = measure_level(&star, &ringside, &out_dir, flows, &o, isolation.as_ref(), stop)?;
        print_row(&level);
        levels.push(level);
    }
    drop(star);
    let load_after = loadavg();
    println!("loadavg before {load_before}, after {load_after}; {:.0} s", started.elapsed().as_secs_f64());

    let at = |n: u64| levels.iter().find(|l| l["flows"].as_u64() == Some(n));
    let mut verdicts = serde_json::Map::new();
    if let Some(l) = at(10_000) {
        let cpu = l["agent_cpu_percent"].as_f64().unwrap_or(f64::NAN);
        let rss = l["agent_rss_mib"].as_f64().unwrap_or(f64::NAN);
        println!(
            "10k flows: agent CPU {cpu:.2} % (target ≤ {TARGET_CPU_PERCENT} %: {}), RSS {rss:.1} MiB (target ≤ {TARGET_RSS_MIB} MiB: {})",
            met(cpu <= TARGET_CPU_PERCENT),
            met(rss <= TARGET_RSS_MIB)
        );
        verdicts.insert("cpu_10k_met".into(), json!(cpu <= TARGET_CPU_PERCENT));
        verdicts.insert("rss_10k_met".into(), json!(rss <= TARGET_RSS_MIB));
    }
    if let (Some(a), Some(b)) = (at(10_000), at(100_000)) {
        let cpu_ratio = b["agent_cpu_percent"].as_f64().unwrap_or(f64::NAN) / a["agent_cpu_percent"].as_f64().unwrap_or(f64::NAN);
        let rss_ratio = b["agent_rss_mib"].as_f64().unwrap_or(f64::NAN) / a["agent_rss_mib"].as_f64().unwrap_or(f64::NAN);
        println!(
            "100k / 10k flows: CPU × {cpu_ratio:.2}, RSS × {rss_ratio:.2} (linear or better: ≤ 10: {} / {})",
            met(cpu_ratio <= 10.0),
            met(rss_ratio <= 10.0)
        );
        verdicts.insert("cpu_100k_over_10k".into(), json!(cpu_ratio));
        verdicts.insert("rss_100k_over_10k".into(), json!(rss_ratio));
        verdicts.insert("linear_met".into(), json!(cpu_ratio <= 10.0 && rss_ratio <= 10.0));
    }
    let report = json!({
        "tool": "cargo xtask bench agent",
        "machine": machine(),
        "agent_bin": built.display().to_string(),
        "method": "real UDP flows through the classifier on a namespace star; agent CPU from /proc/PID/stat over the window (no scrape inside it), RSS from /proc/PID/status, /metrics timed after the window",
        "poll_interval_ms": POLL_INTERVAL_MS,
        "seconds": o.seconds,
        "warmup_seconds": o.warmup,
        "rate_per_flow": o.rate_per_flow,
        "scrapes": o.scrapes,
        "cpus": isolation.as_ref().map_or_else(|| "shared (nothing pinned, RPS over every CPU)".to_string(), Isolation::describe),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "targets": { "cpu_percent_at_10k": TARGET_CPU_PERCENT, "rss_mib_at_10k": TARGET_RSS_MIB, "max_ratio_100k_over_10k": 10.0 },
        "verdicts": verdicts,
        "levels": levels,
    });
    let out = out_dir.join("agent.json");
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n").with_context(|| format!("write {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT MET"
    }
}

/// h1 drops the flows' datagrams before the socket lookup: without it, every datagram to a closed
/// port would cost an ICMP port-unreachable. The classifier sees them on h0's bridge port first.
fn drop_at_receiver(star: &Star, plan: &FlowPlan) -> Result<()> {
    let script = format!(
        "table inet ringside_bench {{\n  chain pre {{\n    type filter hook prerouting priority -300; policy accept;\n    udp dport {} drop\n  }}\n}}\n",
        plan.dst_range()
    );
    let mut c = star.hosts[1].ns.command("nft");
    c.args(["-f", "-"]).stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().context("starting nft in h1")?;
    std::io::Write::write_all(child.stdin.as_mut().expect("piped"), script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("nft -f - in h1 failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn measure_level(star: &Star, ringside: &Path, out_dir: &Path, flows: u32, o: &Opts, isolation: Option<&Isolation>, stop: &AtomicBool) -> Result<Value> {
    let plan = FlowPlan::new(flows);
    let capacity = o.kernel_max_flows.unwrap_or_else(|| kernel_capacity(flows));
    let ring_kib = o.event_ring_kib.unwrap_or_else(|| event_ring_kib(flows, o.rate_per_flow));
    let ring_line = if ring_kib == 256 { String::new() } else { format!("kernel_event_ring_kib = {ring_kib}\n") };
    let config = format!(
        "poll_interval_ms = {POLL_INTERVAL_MS}\nkernel_max_flows = {capacity}\n{ring_line}[match]\nudp_ports = [\"{}\"]\n",
        plan.dst_range()
    );
    let load_before = loadavg();
    let mut agent = Agent::start(
        &star.switch,
        &AgentSpec {
            bin: ringside,
            ifaces: vec![star.hosts[0].switch_port.clone()],
            listen: AGENT_LISTEN.into(),
            config_toml: config,
            tag: format!("bench-agent-{flows}"),
            log: Some(out_dir.join(format!("agent-{flows}.log"))),
        },
    )?;
    agent.wait_ready(Duration::from_secs(30))?;
    let pid = agent.pid().context("the agent has no process id")?;
    renice_process(pid, o.nice)?;
    let sender = Sender::start(star.hosts[0].ns.handle(), star.hosts[0].addr, star.hosts[1].addr, plan, o.rate_per_flow)?;
    set_nice(sender.tid(), o.nice).context("renicing the sender thread")?;
    if let Some(iso) = isolation {
        pin_process(pid, &[iso.agent])?;
        pin(sender.tid(), &iso.traffic).context("pinning the sender thread")?;
    }

    // Every flow must be tracked before the window: bounded by the time to send one round at the
    // target rate plus generous slack for a loaded machine.
    let waiting = Instant::now();
    let deadline = waiting + Duration::from_secs(30 + u64::from(flows / 5_000));
    let mut tracked = 0;
    while Instant::now() < deadline {
        check_stop(stop)?;
        sender.check()?;
        tracked = Scrape::of(&agent.get("/metrics")?).value("ringside_flows_tracked", None).unwrap_or(0.0) as u64;
        if tracked >= u64::from(flows) {
            break;
        }
        thread::sleep(Duration::from_millis(500));
    }
    if tracked < u64::from(flows) {
        bail!(
            "the agent tracks {tracked} of {flows} flows after {:?}: the sender could not reach every flow (it sent {} datagrams) or the kernel map evicted; see {}",
            waiting.elapsed(),
            sender.sent(),
            out_dir.join(format!("agent-{flows}.log")).display()
        );
    }
    sleep_checked(Duration::from_secs(o.warmup), stop)?;

    let before = Scrape::of(&agent.get("/metrics")?);
    let (agent0, sender0, sent0, rounds0, late0) = (cpu_ticks(pid, None)?, cpu_ticks(std::process::id(), Some(sender.tid()))?, sender.sent(), sender.rounds(), sender.late_rounds());
    let t0 = Instant::now();
    sleep_checked(Duration::from_secs(o.seconds), stop)?;
    sender.check()?;
    let (agent1, sender1, sent1, rounds1, late1) = (cpu_ticks(pid, None)?, cpu_ticks(std::process::id(), Some(sender.tid()))?, sender.sent(), sender.rounds(), sender.late_rounds());
    let wall = t0.elapsed().as_secs_f64();
    let (rss_kib, _) = memory_kib(pid)?;
    let after = Scrape::of(&agent.get("/metrics")?);

    // Timed scrapes, made inside the switch namespace (the timer excludes entering it).
    let token = agent.operator_token();
    let scrapes: Vec<(f64, usize)> = star.switch.try_run(|| -> Result<Vec<(f64, usize)>> {
        let mut v = Vec::new();
        for _ in 0..o.scrapes {
            let t = Instant::now();
            let body = http_get(AGENT_LISTEN, "/metrics", token.as_deref())?;
            v.push((t.elapsed().as_secs_f64() * 1e3, body.len()));
            thread::sleep(Duration::from_millis(100));
        }
        Ok(v)
    })??;
    let (_, hwm_kib) = memory_kib(pid)?;
    drop(sender);
    drop(agent);

    let hz = clock_ticks_per_second();
    let agent_cpu = (agent1 - agent0) as f64 / hz / wall * 100.0;
    let sender_cpu = (sender1 - sender0) as f64 / hz / wall * 100.0;
    let mut times: Vec<f64> = scrapes.iter().map(|s| s.0).collect();
    times.sort_by(f64::total_cmp);
    let delta = |name: &str, label: Option<(&str, &str)>| after.value(name, label).unwrap_or(0.0) - before.value(name, label).unwrap_or(0.0);
    let polls = delta("ringside_agent_polls_total", None);
    let poll_ms = delta("ringside_agent_poll_duration_seconds_sum", None) / polls.max(1.0) * 1e3;
    Ok(json!({
        "flows": flows,
        "kernel_max_flows": capacity,
        "kernel_event_ring_kib": ring_kib,
        "sockets": plan.sockets,
        "dst_ports": plan.dst_range(),
        "flows_tracked_before": before.value("ringside_flows_tracked", None),
        "flows_tracked_after": after.value("ringside_flows_tracked", None),
        "window_seconds": wall,
        "agent_cpu_percent": agent_cpu,
        "agent_rss_mib": rss_kib as f64 / 1024.0,
        "agent_hwm_mib": hwm_kib as f64 / 1024.0,
        "sender_cpu_percent": sender_cpu,
        "sender_datagrams_per_second": (sent1 - sent0) as f64 / wall,
        "sender_target_datagrams_per_second": f64::from(flows) * f64::from(o.rate_per_flow),
        "sender_rounds": rounds1 - rounds0,
        "sender_late_rounds": late1 - late0,
        "matched_packets": delta("ringside_dataplane_packets_total", Some(("result", "matched"))),
        "polls": polls,
        "polls_per_second": polls / wall,
        "agent_cpu_ms_per_poll": (agent1 - agent0) as f64 / hz * 1e3 / polls.max(1.0),
        "nice": o.nice,
        "poll_mean_ms": poll_ms,
        "map_full": delta("ringside_dataplane_map_full_total", None),
        "ringbuf_full": delta("ringside_dataplane_ringbuf_full_total", None),
        "events": delta("ringside_dataplane_events_total", None),
        "evicted_idle": delta("ringside_agent_flows_evicted_total", Some(("reason", "idle"))),
        "evicted_capacity": delta("ringside_agent_flows_evicted_total", Some(("reason", "capacity"))),
        "windows_dropped": delta("ringside_detect_windows_dropped_total", None),
        "scrape_ms_median": ringside_stats::median_sorted(&times),
        "scrape_ms_max": times.last(),
        "scrape_bytes": scrapes.last().map(|s| s.1),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }))
}

fn print_row(l: &Value) {
    let f = |k: &str| l[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "flows {:>7} (tracked {:>7}): agent CPU {:6.2} %  RSS {:6.1} MiB (HWM {:6.1})  {:4.1} polls/s, {:6.2} ms each ({:5.2} ms CPU)  /metrics {:6.2} ms median {:6.2} max {:>6} B  | sender {:6.2} % CPU, {:>8.0}/{:.0} datagrams/s, {} of {} rounds late | map_full {} ringbuf_full {} evicted idle {} capacity {} windows dropped {}  (load {} → {})",
        l["flows"],
        l["flows_tracked_after"],
        f("agent_cpu_percent"),
        f("agent_rss_mib"),
        f("agent_hwm_mib"),
        f("polls_per_second"),
        f("poll_mean_ms"),
        f("agent_cpu_ms_per_poll"),
        f("scrape_ms_median"),
        f("scrape_ms_max"),
        l["scrape_bytes"],
        f("sender_cpu_percent"),
        f("sender_datagrams_per_second"),
        f("sender_target_datagrams_per_second"),
        l["sender_late_rounds"],
        l["sender_rounds"],
        l["map_full"],
        l["ringbuf_full"],
        l["evicted_idle"],
        l["evicted_capacity"],
        l["windows_dropped"],
        l["loadavg_before"].as_str().unwrap_or(""),
        l["loadavg_after"].as_str().unwrap_or(""),
    );
}

/// One `/metrics` text, for sample lookups.
struct Scrape(String);

impl Scrape {
    fn of(text: &str) -> Scrape {
        Scrape(text.to_owned())
    }
    /// The sum of the samples of `name` (exact metric name, any labels), restricted to those with
    /// `label` = value when given; `None` when no sample matched.
    fn value(&self, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
        let mut sum = None;
        for line in self.0.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let (metric, labels) = series.split_once('{').unwrap_or((series, ""));
            if metric != name {
                continue;
            }
            if let Some((k, v)) = label {
                if !labels.contains(&format!("{k}=\"{v}\"")) {
                    continue;
                }
            }
            if let Ok(v) = value.parse::<f64>() {
                *sum.get_or_insert(0.0) += v;
            }
        }
        sum
    }
}

/// utime + stime (clock ticks) of process `pid`, or of its thread `tid`.
fn cpu_ticks(pid: u32, tid: Option<i32>) -> Result<u64> {
    let path = match tid {
        Some(t) => format!("/proc/{pid}/task/{t}/stat"),
        None => format!("/proc/{pid}/stat"),
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    parse_cpu_ticks(&text).with_context(|| format!("unexpected {path}: {text:?}"))
}

/// Fields 14 and 15 (utime, stime) of a `stat` line; the command name (field 2) may hold spaces
/// and parentheses, so fields are counted after its last `)`.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// (VmRSS, VmHWM) of `pid` in KiB.
fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |k: &str| -> Result<u64> {
        let line = text.lines().find(|l| l.starts_with(k)).with_context(|| format!("no {k} in /proc/{pid}/status"))?;
        line[k.len()..].trim().trim_end_matches("kB").trim().parse().with_context(|| format!("bad {line:?}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Sets the niceness of every thread of `pid` (a process's threads each carry their own).
fn renice_process(pid: u32, nice: i32) -> Result<()> {
    let dir = format!("/proc/{pid}/task");
    for e in std::fs::read_dir(&dir).with_context(|| format!("read {dir}"))? {
        if let Some(tid) = e?.file_name().to_str().and_then(|t| t.parse::<i32>().ok()) {
            set_nice(tid, nice).with_context(|| format!("renicing the agent's thread {tid}"))?;
        }
    }
    Ok(())
}

/// setpriority(PRIO_PROCESS, tid): on Linux it sets one thread's niceness.
fn set_nice(tid: i32, nice: i32) -> Result<()> {
    // SAFETY: plain syscall on an id; no memory is passed.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

fn sleep_checked(d: Duration, stop: &AtomicBool) -> Result<()> {
    if !crate::eval::sleep_checked(d, stop) {
        bail!("interrupted; tearing down");
    }
    Ok(())
}

fn check_stop(stop: &AtomicBool) -> Result<()> {
    if stop.load(Ordering::SeqCst) {
        bail!("interrupted; tearing down");
    }
    Ok(())
}

/// What the sender thread shares with the measuring thread.
#[derive(Default)]
struct SenderShared {
    stop: AtomicBool,
    /// The sending thread's kernel thread id (0 until it runs).
    tid: AtomicI32,
    sent: AtomicU64,
    rounds: AtomicU64,
    /// Rounds that took longer than their period: some flows were touched less often than asked.
    late_rounds: AtomicU64,
}

/// The UDP sender in h0; stopped and joined on drop.
struct Sender {
    shared: Arc<SenderShared>,
    thread: Option<thread::JoinHandle<Result<()>>>,
}

impl Sender {
    fn start(ns: NetnsHandle, src: Ipv4Addr, dst: Ipv4Addr, plan: FlowPlan, rate_per_flow: u32) -> Result<Sender> {
        let shared = Arc::new(SenderShared::default());
        let s = shared.clone();
        let thread = thread::Builder::new()
            .name("bench-agent-sender".into())
            .spawn(move || -> Result<()> { ns.try_run(|| send_loop(src, dst, plan, rate_per_flow, &s))? })?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while shared.tid.load(Ordering::SeqCst) == 0 {
            if thread.is_finished() {
                return match thread.join() {
                    Ok(Err(e)) => Err(e.context("the sender failed")),
                    _ => Err(anyhow::anyhow!("the sender stopped before it started sending")),
                };
            }
            if Instant::now() > deadline {
                bail!("the sender thread did not start within 10 s");
            }
            thread::sleep(Duration::from_millis(10));
        }
        Ok(Sender { shared, thread: Some(thread) })
    }
    fn tid(&self) -> i32 {
        self.shared.tid.load(Ordering::SeqCst)
    }
    fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::SeqCst)
    }
    fn rounds(&self) -> u64 {
        self.shared.rounds.load(Ordering::SeqCst)
    }
    fn late_rounds(&self) -> u64 {
        self.shared.late_rounds.load(Ordering::SeqCst)
    }
    /// Err if the sender thread ended (it only ends on error while running).
    fn check(&self) -> Result<()> {
        if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
            bail!("the sender thread stopped early; see the error when the rig is torn down");
        }
        Ok(())
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Err(e)) => eprintln!("bench agent: the sender failed: {e:#}"),
                Err(_) => eprintln!("bench agent: the sender panicked"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// Sends one datagram per flow per round, `rate_per_flow` rounds per second, spreading each
/// round's batches evenly over its period. Runs until `shared.stop`.
fn send_loop(src: Ipv4Addr, dst: Ipv4Addr, plan: FlowPlan, rate_per_flow: u32, shared: &SenderShared) -> Result<()> {
    let sockets: Vec<UdpSocket> = (0..plan.sockets)
        .map(|s| UdpSocket::bind((src, SRC_PORT_BASE + s as u16)).with_context(|| format!("bind {src}:{}", SRC_PORT_BASE + s as u16)))
        .collect::<Result<_>>()?;
    let addrs: Vec<libc::sockaddr_in> = (0..plan.ports_per_socket)
        .map(|i| libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: (DST_PORT_BASE + i as u16).to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(dst).to_be() },
            sin_zero: [0; 8],
        })
        .collect();
    let mut payload = [0u8; PAYLOAD];
    payload[..16].copy_from_slice(b"ringside-bench-a");
    let mut iov = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: PAYLOAD };
    // SAFETY: gettid has no preconditions.
    shared.tid.store(unsafe { libc::gettid() }, Ordering::SeqCst);

    let period = Duration::from_secs_f64(1.0 / f64::from(rate_per_flow));
    let per_datagram = period.as_secs_f64() / f64::from(plan.flows);
    let mut round_start = Instant::now();
    // SAFETY: mmsghdr is plain data; all-zero is a valid (empty) value.
    let mut msgs: Vec<libc::mmsghdr> = vec![unsafe { std::mem::zeroed() }; BATCH];
    while !shared.stop.load(Ordering::Relaxed) {
        let mut done_in_round = 0u64;
        for (s, sock) in sockets.iter().enumerate() {
            let n = plan.flows_of(s as u32) as usize;
            let mut i = 0;
            while i < n {
                if shared.stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                // Pace: this batch is due once the round's clock reaches its share of the period.
                let due = round_start + Duration::from_secs_f64(done_in_round as f64 * per_datagram);
                let now = Instant::now();
                if due > now {
                    thread::sleep(due - now);
                }
                let k = (n - i).min(BATCH);
                for (m, a) in msgs.iter_mut().zip(&addrs[i..i + k]) {
                    m.msg_hdr.msg_name = (a as *const libc::sockaddr_in).cast_mut().cast();
                    m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
                    m.msg_hdr.msg_iov = &mut iov;
                    m.msg_hdr.msg_iovlen = 1;
                    m.msg_len = 0;
                }
                let mut off = 0;
                // Bounded: each try either sends at least one datagram or counts a failure.
                for _ in 0..(2 * k + 8) {
                    if off >= k {
                        break;
                    }
                    // SAFETY: msgs[off..k] point at `addrs` entries, `iov` and `payload`, all alive
                    // for the call; the kernel only reads them (and writes msg_len).
                    let r = unsafe { libc::sendmmsg(sock.as_raw_fd(), msgs[off..].as_mut_ptr(), (k - off) as u32, 0) };
                    if r > 0 {
                        off += r as usize;
                        shared.sent.fetch_add(r as u64, Ordering::Relaxed);
                    } else {
                        let e = std::io::Error::last_os_error();
                        match e.raw_os_error() {
                            // The qdisc or socket buffer is full: the datagram is skipped this round.
                            Some(libc::ENOBUFS) | Some(libc::EAGAIN) => {
                                off += 1;
                                thread::yield_now();
                            }
                            Some(libc::EINTR) => {}
                            _ => return Err(e).context("sendmmsg"),
                        }
                    }
                }
                i += k;
                done_in_round += k as u64;
            }
        }
        shared.rounds.fetch_add(1, Ordering::Relaxed);
        let next = round_start + period;
        let now = Instant::now();
        if now > next {
            shared.late_rounds.fetch_add(1, Ordering::Relaxed);
            round_start = now;
        } else {
            thread::sleep(next - now);
            round_start = next;
        }
    }
    Ok(())
}

/// Removes a file when dropped.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_exactly_the_flows() {
        for flows in [1, 999, 1_000, 10_000, 25_000, 25_001, 100_000, 123_457] {
            let p = FlowPlan::new(flows);
            assert!(p.ports_per_socket <= MAX_PORTS_PER_SOCKET, "{p:?}");
            assert_eq!((0..p.sockets).map(|s| p.flows_of(s)).sum::<u32>(), flows, "{p:?}");
            assert!(p.flows_of(p.sockets - 1) > 0, "no empty socket: {p:?}");
        }
        assert_eq!(FlowPlan::new(100_000).dst_range(), "20000-44999");
        assert_eq!(FlowPlan::new(1_000).dst_range(), "20000-20999");
    }

    #[test]
    fn kernel_capacity_follows_the_operator_guide() {
        assert_eq!(kernel_capacity(1_000), 16_384);
        assert_eq!(kernel_capacity(10_000), 32_768);
        assert_eq!(kernel_capacity(100_000), 262_144);
    }

    #[test]
    fn reads_cpu_ticks_after_the_command_name() {
        let stat = "4242 (ring side) (x)) S 1 2 3 4 5 6 7 8 9 10 123 45 0 0 20 0 5 0 100 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(168));
        assert_eq!(parse_cpu_ticks("4242 (x) S 1"), None);
    }

    #[test]
    fn sums_metric_samples_by_exact_name_and_label() {
        let s = Scrape::of(
            "# HELP x\nringside_flows_tracked 7\nringside_flows_tracked_other 9\nringside_agent_flows_evicted_total{reason=\"idle\"} 2\nringside_agent_flows_evicted_total{reason=\"capacity\"} 5\n",
        );
        assert_eq!(s.value("ringside_flows_tracked", None), Some(7.0));
        assert_eq!(s.value("ringside_agent_flows_evicted_total", None), Some(7.0));
        assert_eq!(s.value("ringside_agent_flows_evicted_total", Some(("reason", "capacity"))), Some(5.0));
        assert_eq!(s.value("ringside_missing", None), None);
    }
}
