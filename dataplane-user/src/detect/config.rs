//! Detector configuration: TOML through serde, every field defaulted.
//!
//! Rationale for the defaults: a verdict needs evidence in 2 of the last 3 windows (1 s each), so a
//! clear fault is raised at the end of its second window (≤ 2 s; the median detection latency
//! target); evidence a busy host's CPU can fake (a mild goodput dip alone) needs 4 of the last 5
//! (`PersistenceConfig::mild_raise_k`). Only *severe* evidence (goodput ≤ 40 % of the peers, ≥ 3 % loss, a stall of
//! ≥ 150 ms with loss) raises on the first window. Thresholds are relative (to the job's other
//! peers, or to the link's own history) *and* floored by absolute values, because on 2 vCPUs veth
//! reorders packets: a healthy TCP collective shows a few spurious retransmissions per window,
//! which a purely relative test on a near-zero median would call a 100× increase.
//! The values are starting points, to be calibrated against the testbed (T3 scenario evaluations).

use serde::{Deserialize, Serialize};

use crate::bounds::{at_least, at_least_f64, at_most, below, between, in_range, in_range_from, positive};

/// A bad value of a section: (its key, what is wrong). `ConfigFile::validate` adds the section's
/// path and finds the line.
pub type Invalid = (&'static str, String);

/// Tags a check's message with its key.
fn key(k: &'static str) -> impl Fn(String) -> Invalid {
    move |m| (k, m)
}

/// `raise_k` of `raise_n` windows: 1 ≤ k ≤ n ≤ 32 (the window history is a 32-bit mask).
fn k_of_n(k: u32, n: u32) -> Result<(), Invalid> {
    k_of_n_keys(("raise_k", k), ("raise_n", n))
}

/// As [`k_of_n`], for a pair of keys with other names.
fn k_of_n_keys((k_key, k): (&'static str, u32), (n_key, n): (&'static str, u32)) -> Result<(), Invalid> {
    at_least(u64::from(k), 1).map_err(key(k_key))?;
    if n > 32 {
        return Err((n_key, format!("{n} is too large: at most 32 windows are remembered")));
    }
    at_most(k_key, k, n_key, n).map_err(key(k_key))
}

/// A ratio `open` that must sit strictly between `severe` below and `clear` above, all in (0, 1].
fn ratio_ladder(severe: (&'static str, f64), open: (&'static str, f64), clear: (&'static str, f64)) -> Result<(), Invalid> {
    for (k, v) in [severe, open, clear] {
        in_range(v, 0.0, 1.0).map_err(key(k))?;
    }
    below(severe.0, severe.1, open.0, open.1).map_err(key(severe.0))?;
    below(open.0, open.1, clear.0, clear.1).map_err(key(open.0))
}

/// Everything the detectors can be tuned with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DetectorConfig {
    /// Expected window length: 1 s. Windows shorter than half or longer than twice this are
    /// rejected, because persistence is counted in windows and the latency target assumes them.
    pub window_ns: u64,
    /// Bursts of one peer separated by less than this (10 ms) form one communication phase. Must
    /// exceed the kernel's burst gap (1 ms) and stay below the compute gap between steps.
    pub phase_merge_gap_ns: u64,
    /// Phases of one peer kept per window (256); the rest are ignored. Bounds memory and CPU.
    pub max_phases_per_window: usize,
    /// A phase with fewer bytes (64 KiB) does not count towards in-burst goodput: tiny phases are
    /// latency-bound, not bandwidth-bound.
    pub min_phase_bytes: u64,
    /// A peer with fewer bytes in a window (64 KiB) is idle: nothing is assessed.
    pub min_window_bytes: u64,
    /// Loss and CE rates need this many data packets in the window (1000).
    pub min_data_packets: u64,
    /// A peer (or link) not seen for this long (30 s) is forgotten; its open verdicts close with
    /// `end_reason = expired`. Jobs are forgotten the same way.
    pub forget_after_ns: u64,
    /// Peers tracked per job (4096); further peers are ignored and counted.
    pub max_peers_per_job: usize,
    /// Jobs tracked (1024); windows of further jobs are rejected.
    pub max_jobs: usize,
    pub persistence: PersistenceConfig,
    pub gray: GrayConfig,
    pub congestion: CongestionConfig,
    pub straggler: StragglerConfig,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        Self {
            window_ns: 1_000_000_000,
            phase_merge_gap_ns: 10_000_000,
            max_phases_per_window: 256,
            min_phase_bytes: 64 * 1024,
            min_window_bytes: 64 * 1024,
            min_data_packets: 1000,
            forget_after_ns: 30_000_000_000,
            max_peers_per_job: 4096,
            max_jobs: 1024,
            persistence: PersistenceConfig::default(),
            gray: GrayConfig::default(),
            congestion: CongestionConfig::default(),
            straggler: StragglerConfig::default(),
        }
    }
}

/// When a verdict opens, changes class, and closes. Counts are in observed windows (windows where
/// the scope had enough traffic to be assessed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PersistenceConfig {
    /// Raise when at least `raise_k` (2) of the last `raise_n` (3) windows are anomalous ...
    pub raise_k: u32,
    /// ... (at most 32).
    pub raise_n: u32,
    /// ... or at once on one severe window (gray failure and congestion only; never straggler).
    pub raise_on_severe: bool,
    /// Evidence a busy host's CPU can fake — a gray failure from in-burst goodput alone, between
    /// the severe and open ratios (no loss, no stall) — raises only on `mild_raise_k` (4) of the
    /// last `mild_raise_n` (5) windows, unless stronger evidence is in the last `raise_n`: a rank
    /// starved of CPU on a shared 2-vCPU host moved its bytes at 0.54-0.60 of the others for 2
    /// windows in 3 in ten-minute healthy OpenMPI runs beside a build; a real fault persists.
    pub mild_raise_k: u32,
    pub mild_raise_n: u32,
    /// Close after this many (3) consecutive clean windows. Windows between the raise and clear
    /// thresholds are neither, so a verdict does not flap on a metric hovering at the threshold.
    pub clear_windows: u32,
    /// Gray failure: a single run of this many (5) anomalous windows makes it `persistent`.
    pub persistent_windows: u32,
    /// Gray failure: a verdict on a peer whose previous gray verdict closed less than this (60 s)
    /// before the new one started, or with two anomalous runs while open, is `intermittent`.
    pub recurrence_ns: u64,
}

impl PersistenceConfig {
    /// Each value in range: see the field docs.
    pub fn validate(&self) -> Result<(), Invalid> {
        k_of_n(self.raise_k, self.raise_n)?;
        k_of_n_keys(("mild_raise_k", self.mild_raise_k), ("mild_raise_n", self.mild_raise_n))?;
        at_least(u64::from(self.clear_windows), 1).map_err(key("clear_windows"))?;
        at_least(u64::from(self.persistent_windows), 1).map_err(key("persistent_windows"))?;
        at_least(self.recurrence_ns, 1).map_err(key("recurrence_ns"))
    }
}

impl Default for PersistenceConfig {
    fn default() -> Self {
        Self {
            raise_k: 2,
            raise_n: 3,
            raise_on_severe: true,
            mild_raise_k: 4,
            mild_raise_n: 5,
            clear_windows: 3,
            persistent_windows: 5,
            recurrence_ns: 60_000_000_000,
        }
    }
}

/// Gray failure: a peer that is an outlier against the job's other peers in the same window.
/// Statistics are leave-one-out: median and MAD of the *other* peers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrayConfig {
    /// Peers (this one included) with the metric needed for a comparison (4).
    pub min_peers: usize,
    /// Robust z-score (deviation / (1.4826 × MAD)) to raise (4) and to count as clean (below 2).
    pub z_open: f64,
    pub z_clear: f64,
    /// The MAD-based scale is at least this fraction of the median (5 %), so identical peers
    /// (MAD = 0) do not turn a 1 % difference into an infinite z.
    pub rel_scale_floor: f64,
    /// In-burst goodput anomalous at ≤ 70 % of the other peers' median, severe at ≤ 40 %,
    /// clean at ≥ 85 %. Severe raises on one window, so it stays below what a CPU stall on a
    /// shared 2-vCPU host does to one window (≈ 60 %).
    pub goodput_open_ratio: f64,
    pub goodput_severe_ratio: f64,
    pub goodput_clear_ratio: f64,
    /// Loss rate (loss packets / data packets) anomalous at ≥ 0.2 % and ≥ 5× the others' median;
    /// severe at ≥ 1 % (healthy windows on the testbed stay below 0.01 %; a flap's one window of
    /// resent data after a 400 ms outage reaches 1-5 %); clean below 0.15 % (above what veth
    /// reordering reaches in a window, so a
    /// reorder burst on a healthy peer does not hold a verdict open).
    pub loss_open_floor: f64,
    pub loss_open_ratio: f64,
    pub loss_severe: f64,
    pub loss_clear_floor: f64,
    /// Absolute floor of the loss-rate scale (0.05 %).
    pub loss_scale_floor: f64,
    /// Stall: the peer's longest silence exceeds the others' median by ≥ 100 ms (severe: 150 ms;
    /// clean below 50 ms) *and* the peer shows at least `stall_min_loss_packets` (10) more loss
    /// packets than the others' median. Without loss a silence is a pause of the worker, not the
    /// network, and is not reported.
    pub stall_open_ns: u64,
    pub stall_severe_ns: u64,
    pub stall_clear_ns: u64,
    pub stall_min_loss_packets: u64,
    /// Absolute floor of the silence scale (5 ms).
    pub stall_scale_floor_ns: u64,
}

impl GrayConfig {
    /// Each value in range, and each open threshold beyond its clear threshold: see the field docs.
    pub fn validate(&self) -> Result<(), Invalid> {
        at_least(self.min_peers as u64, 2).map_err(key("min_peers"))?;
        positive(self.z_clear).map_err(key("z_clear"))?;
        positive(self.z_open).map_err(key("z_open"))?;
        below("z_clear", self.z_clear, "z_open", self.z_open).map_err(key("z_clear"))?;
        in_range(self.rel_scale_floor, 0.0, 1.0).map_err(key("rel_scale_floor"))?;
        ratio_ladder(
            ("goodput_severe_ratio", self.goodput_severe_ratio),
            ("goodput_open_ratio", self.goodput_open_ratio),
            ("goodput_clear_ratio", self.goodput_clear_ratio),
        )?;
        in_range(self.loss_open_floor, 0.0, 1.0).map_err(key("loss_open_floor"))?;
        at_least_f64(self.loss_open_ratio, 1.0).map_err(key("loss_open_ratio"))?;
        in_range(self.loss_severe, 0.0, 1.0).map_err(key("loss_severe"))?;
        below("loss_open_floor", self.loss_open_floor, "loss_severe", self.loss_severe).map_err(key("loss_open_floor"))?;
        in_range_from(self.loss_clear_floor, 0.0, 1.0).map_err(key("loss_clear_floor"))?;
        below("loss_clear_floor", self.loss_clear_floor, "loss_open_floor", self.loss_open_floor).map_err(key("loss_clear_floor"))?;
        in_range(self.loss_scale_floor, 0.0, 1.0).map_err(key("loss_scale_floor"))?;
        at_least(self.stall_clear_ns, 1).map_err(key("stall_clear_ns"))?;
        below("stall_clear_ns", self.stall_clear_ns, "stall_open_ns", self.stall_open_ns).map_err(key("stall_clear_ns"))?;
        at_most("stall_open_ns", self.stall_open_ns, "stall_severe_ns", self.stall_severe_ns).map_err(key("stall_severe_ns"))?;
        at_least(self.stall_scale_floor_ns, 1).map_err(key("stall_scale_floor_ns"))
    }
}

impl Default for GrayConfig {
    fn default() -> Self {
        Self {
            min_peers: 4,
            z_open: 4.0,
            z_clear: 2.0,
            rel_scale_floor: 0.05,
            goodput_open_ratio: 0.70,
            goodput_severe_ratio: 0.40,
            goodput_clear_ratio: 0.85,
            loss_open_floor: 0.002,
            loss_open_ratio: 5.0,
            loss_severe: 0.01,
            loss_clear_floor: 0.0015,
            loss_scale_floor: 0.0005,
            stall_open_ns: 100_000_000,
            stall_severe_ns: 150_000_000,
            stall_clear_ns: 50_000_000,
            stall_min_loss_packets: 10,
            stall_scale_floor_ns: 5_000_000,
        }
    }
}

/// Congestion on a link: several of its peers degrade together (against their own history or as
/// co-outliers against the job), or its CE / CNP rate grows, or loss spreads over its peers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CongestionConfig {
    /// History per peer and link used as baseline (30 windows); only windows not judged
    /// anomalous enter it, so a long fault does not become the new normal.
    pub baseline_windows: usize,
    /// Windows of history before the baseline is used (5).
    pub baseline_min_windows: usize,
    /// A peer is degraded at ≤ 70 % of its own baseline in-burst goodput (severe ≤ 50 %) and
    /// recovered at ≥ 85 %.
    pub goodput_open_ratio: f64,
    pub goodput_severe_ratio: f64,
    pub goodput_clear_ratio: f64,
    /// The link is congested when at least `min_degraded_peers` (2) peers *and* at least
    /// `min_degraded_fraction` (50 %) of its assessed peers are degraded (or lossy, for loss).
    pub min_degraded_peers: usize,
    pub min_degraded_fraction: f64,
    /// CE rate (CE marks / data packets) anomalous at ≥ 0.5 % and ≥ 4× the link's baseline;
    /// severe at ≥ 5 %; clean below max(0.25 %, 2× baseline).
    pub ce_open_floor: f64,
    pub ce_growth: f64,
    pub ce_severe: f64,
    /// CNPs per second anomalous at ≥ 100/s and ≥ 4× the link's baseline; clean below
    /// max(50/s, 2× baseline).
    pub cnp_open_per_s: f64,
    pub cnp_growth: f64,
    /// Shared loss: the link is congested in a window when at least `min_shared_loss_flows` (3)
    /// directed connections with no host common to all lose packets on the egress of a link the
    /// job's data crosses ([`crate::detect::LinkWindow::shared_loss`]).
    pub min_shared_loss_flows: u32,
    /// Competition: the job's in-burst goodput on a link's egress at ≤ 70 % of its own baseline
    /// while other traffic there carries ≥ 25 % of that baseline (severe at ≤ 50 %, like
    /// `goodput_severe_ratio`; healthy windows vary by ±15 % on the testbed).
    pub competition_open_ratio: f64,
    pub competition_min_other: f64,
    /// Queue drops: the link's own egress queue (its interface's root qdisc, all traffic) drops
    /// at least `queue_drop_open_floor` (1 %) of the packets it is offered *and*
    /// `queue_drop_growth` (4×) its own baseline, judged only once that baseline is warm (a link
    /// that is a bottleneck by design drops from the start, and TCP probes every bottleneck);
    /// severe at `queue_drop_severe` (5 %); clean below max(0.5 %, 2× baseline). Loss at this end
    /// of the link, which the flows alone cannot tell from the far end's.
    pub queue_drop_open_floor: f64,
    pub queue_drop_growth: f64,
    pub queue_drop_severe: f64,
    /// Queue throttles: the link's own egress queue, a shaper (`tbf`, `htb`), holds packets back
    /// for lack of rate at least `queue_throttle_open_floor` (0.05) times per packet it sends
    /// *and* `queue_throttle_growth` (4×) its own baseline: the link has become the bottleneck of
    /// what this end offers it (a rate cap applied, a shaper lowered), even where nothing is
    /// dropped. Never severe (a shaper doing its job loses nothing), so raised on `raise_k` of
    /// `raise_n` windows; judged only once the baseline is warm, like queue drops (a job that
    /// starts on a link shaped below its rate is shaped from its first window, and that is its
    /// normal); clean below max(0.025, 2× baseline).
    pub queue_throttle_open_floor: f64,
    pub queue_throttle_growth: f64,
}

impl CongestionConfig {
    /// Each value in range: see the field docs.
    pub fn validate(&self) -> Result<(), Invalid> {
        at_least(self.baseline_windows as u64, 1).map_err(key("baseline_windows"))?;
        at_least(self.baseline_min_windows as u64, 1).map_err(key("baseline_min_windows"))?;
        at_most("baseline_min_windows", self.baseline_min_windows, "baseline_windows", self.baseline_windows).map_err(key("baseline_min_windows"))?;
        ratio_ladder(
            ("goodput_severe_ratio", self.goodput_severe_ratio),
            ("goodput_open_ratio", self.goodput_open_ratio),
            ("goodput_clear_ratio", self.goodput_clear_ratio),
        )?;
        at_least(self.min_degraded_peers as u64, 1).map_err(key("min_degraded_peers"))?;
        in_range(self.min_degraded_fraction, 0.0, 1.0).map_err(key("min_degraded_fraction"))?;
        in_range(self.ce_open_floor, 0.0, 1.0).map_err(key("ce_open_floor"))?;
        at_least_f64(self.ce_growth, 1.0).map_err(key("ce_growth"))?;
        in_range(self.ce_severe, 0.0, 1.0).map_err(key("ce_severe"))?;
        below("ce_open_floor", self.ce_open_floor, "ce_severe", self.ce_severe).map_err(key("ce_open_floor"))?;
        positive(self.cnp_open_per_s).map_err(key("cnp_open_per_s"))?;
        at_least_f64(self.cnp_growth, 1.0).map_err(key("cnp_growth"))?;
        at_least(u64::from(self.min_shared_loss_flows), 2).map_err(key("min_shared_loss_flows"))?;
        between(self.competition_open_ratio, 0.0, 1.0).map_err(key("competition_open_ratio"))?;
        in_range(self.competition_min_other, 0.0, 1.0).map_err(key("competition_min_other"))?;
        in_range(self.queue_drop_open_floor, 0.0, 1.0).map_err(key("queue_drop_open_floor"))?;
        at_least_f64(self.queue_drop_growth, 1.0).map_err(key("queue_drop_growth"))?;
        in_range(self.queue_drop_severe, 0.0, 1.0).map_err(key("queue_drop_severe"))?;
        below("queue_drop_open_floor", self.queue_drop_open_floor, "queue_drop_severe", self.queue_drop_severe)
            .map_err(key("queue_drop_open_floor"))?;
        positive(self.queue_throttle_open_floor).map_err(key("queue_throttle_open_floor"))?;
        at_least_f64(self.queue_throttle_growth, 1.0).map_err(key("queue_throttle_growth"))
    }
}

impl Default for CongestionConfig {
    fn default() -> Self {
        Self {
            baseline_windows: 30,
            baseline_min_windows: 5,
            goodput_open_ratio: 0.70,
            goodput_severe_ratio: 0.50,
            goodput_clear_ratio: 0.85,
            min_degraded_peers: 2,
            min_degraded_fraction: 0.5,
            ce_open_floor: 0.005,
            ce_growth: 4.0,
            ce_severe: 0.05,
            cnp_open_per_s: 100.0,
            cnp_growth: 4.0,
            min_shared_loss_flows: 3,
            competition_open_ratio: 0.7,
            competition_min_other: 0.25,
            queue_drop_open_floor: 0.01,
            queue_drop_growth: 4.0,
            queue_drop_severe: 0.05,
            queue_throttle_open_floor: 0.05,
            queue_throttle_growth: 4.0,
        }
    }
}

/// Compute straggler: a peer whose phases start late against the other peers' phases of the same
/// step, or whose first send of a step comes after the other peers' first sends at nearly every
/// step, at normal in-burst goodput and loss. Reported as `straggler`, never as a network fault.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StragglerConfig {
    /// Peers (this one included) with matched phases needed (3).
    pub min_peers: usize,
    /// A phase is matched to another peer's phase starting within ±100 ms; steps shorter than
    /// twice this cannot be told apart (lateness is then measured modulo the step).
    pub max_start_offset_ns: u64,
    /// Phases of this peer matched in the window (2) before its lateness is assessed (both
    /// statistics: phase-matched and step-start lateness).
    pub min_matched_phases: usize,
    /// Step-start lateness (see `features`): a phase that follows at least this much of the peer's
    /// own idle time (20 ms), and at least half of its longest idle gap in the window, is the first
    /// send of a step. Must exceed `phase_merge_gap_ns` and stay below the compute time of a step.
    pub min_idle_gap_ns: u64,
    /// Median lateness beyond the others' median: anomalous at ≥ 20 ms (and z ≥ `z_open`),
    /// clean below 10 ms (or z < `z_clear`); `warning` severity from 100 ms, `info` below.
    pub open_lateness_ns: u64,
    pub clear_lateness_ns: u64,
    pub warning_lateness_ns: u64,
    pub z_open: f64,
    pub z_clear: f64,
    /// Absolute floor of the lateness scale (2 ms): start jitter below this is noise.
    pub scale_floor_ns: u64,
    /// In-burst goodput must be at least 80 % of the others' median to call it a straggler; a
    /// late *and* slow peer is left to the network detectors.
    pub normal_goodput_ratio: f64,
    /// A late start that another peer's start follows within this (3 ms) names no one: with a
    /// rendezvous protocol the straggler's predecessor sends only once the straggler asks.
    pub co_start_ns: u64,
    /// A late start whose receiver sent this peer a small message with payload (a go-ahead; pure
    /// ACKs are not one) in the 10 ms before names no one: it was waiting for that receiver. Nor
    /// does one that fresh data from another peer reached in the 10 ms before (it is passing
    /// that data on).
    pub go_ahead_ns: u64,
    /// Raise a straggler on `raise_k` (4) of the last `raise_n` (5) windows, stricter than
    /// network faults: a rank of a busy host runs late for a window or two without being one.
    pub raise_k: u32,
    pub raise_n: u32,
}

impl StragglerConfig {
    /// Each value in range; `phase_merge_gap_ns` is the detectors' (`min_idle_gap_ns` must exceed it).
    pub fn validate(&self, phase_merge_gap_ns: u64) -> Result<(), Invalid> {
        at_least(self.min_peers as u64, 2).map_err(key("min_peers"))?;
        at_least(self.max_start_offset_ns, 1).map_err(key("max_start_offset_ns"))?;
        at_least(self.min_matched_phases as u64, 1).map_err(key("min_matched_phases"))?;
        if self.min_idle_gap_ns <= phase_merge_gap_ns {
            return Err(("min_idle_gap_ns", format!("{} must exceed the phase merge gap ({phase_merge_gap_ns} ns)", self.min_idle_gap_ns)));
        }
        at_least(self.clear_lateness_ns, 1).map_err(key("clear_lateness_ns"))?;
        below("clear_lateness_ns", self.clear_lateness_ns, "open_lateness_ns", self.open_lateness_ns).map_err(key("clear_lateness_ns"))?;
        at_most("open_lateness_ns", self.open_lateness_ns, "warning_lateness_ns", self.warning_lateness_ns).map_err(key("warning_lateness_ns"))?;
        positive(self.z_clear).map_err(key("z_clear"))?;
        positive(self.z_open).map_err(key("z_open"))?;
        below("z_clear", self.z_clear, "z_open", self.z_open).map_err(key("z_clear"))?;
        at_least(self.scale_floor_ns, 1).map_err(key("scale_floor_ns"))?;
        in_range(self.normal_goodput_ratio, 0.0, 1.0).map_err(key("normal_goodput_ratio"))?;
        k_of_n(self.raise_k, self.raise_n)
    }
}

impl Default for StragglerConfig {
    fn default() -> Self {
        Self {
            min_peers: 3,
            max_start_offset_ns: 100_000_000,
            min_matched_phases: 2,
            min_idle_gap_ns: 20_000_000,
            open_lateness_ns: 20_000_000,
            clear_lateness_ns: 10_000_000,
            warning_lateness_ns: 100_000_000,
            z_open: 4.0,
            z_clear: 2.0,
            scale_floor_ns: 2_000_000,
            normal_goodput_ratio: 0.8,
            co_start_ns: 3_000_000,
            go_ahead_ns: 10_000_000,
            raise_k: 4,
            raise_n: 5,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_overrides_one_field_and_defaults_the_rest() {
        let cfg: DetectorConfig = toml::from_str("[gray]\nz_open = 5.0\n").unwrap();
        assert_eq!(cfg.gray.z_open, 5.0);
        assert_eq!(cfg.gray.z_clear, GrayConfig::default().z_clear);
        assert_eq!(cfg.persistence, PersistenceConfig::default());
    }

    #[test]
    fn defaults_are_valid() {
        let d = DetectorConfig::default();
        d.persistence.validate().unwrap();
        d.gray.validate().unwrap();
        d.congestion.validate().unwrap();
        d.straggler.validate(d.phase_merge_gap_ns).unwrap();
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(toml::from_str::<DetectorConfig>("[gray]\nz_opn = 5.0\n").is_err());
    }
}
