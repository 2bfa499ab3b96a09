//! Policy parameters, all defaulted (`[policy]` in the TOML config can set them).
//!
//! Windows are detection windows (1 s by default). Rationale for the defaults: a change needs
//! evidence in `trigger_windows` (3) consecutive windows and a predicted gain of at least
//! `min_improvement` (20 %), so ±15 % noise on a healthy job never changes its plan; after a
//! change nothing else changes for `min_dwell_windows` (5); the change is judged on
//! `verify_windows` (3) windows after `settle_windows` (1) for the job to pick it up, and undone
//! if it gained less than `verify_min_gain` (10 %); an undone plan is not retried for
//! `cooldown_windows` (60); a compressed job returns to its baseline plan after
//! `recover_windows` (10) healthy windows.

use serde::{Deserialize, Serialize};

use super::cost::CostConstants;
use crate::bounds::{at_least, at_least_f64, at_most, below, in_range, in_range_from, positive};

/// A bad value: (its key path under `[policy]`, what is wrong). `ConfigFile::validate` adds
/// `policy.` and finds the line.
pub type Invalid = (&'static [&'static str], String);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Windows whose medians are the job's current step/comm time and bottleneck goodput (3).
    pub recent_windows: usize,
    /// Healthy windows under the baseline plan kept as its baseline (30).
    pub baseline_windows: usize,
    /// Baseline windows needed before "communication time over its baseline" can trigger (5).
    pub min_baseline_windows: usize,
    /// Communication time at or over this multiple of its healthy baseline is degraded (1.3);
    /// under it, the window counts towards recovery.
    pub degrade_ratio: f64,
    /// ... but only when the job's slowest path also runs at or under this fraction of its
    /// healthy in-burst goodput (0.8), when that is known: a compute straggler makes the others
    /// wait (longer communication phases) at normal goodput, and compression cannot help it.
    pub path_slow_ratio: f64,
    /// Communication time at or over this multiple of its healthy baseline (3.0), with the
    /// slowest path at or under `severe_path_ratio` of its healthy goodput, acts at once instead
    /// of after `trigger_windows`, as an open verdict does: a slowdown that large is not noise.
    /// It is read on the recent median, so two of the `recent_windows` must show it.
    pub severe_degrade_ratio: f64,
    /// ... with the slowest path's in-burst goodput at or under this fraction of healthy (0.5;
    /// unknown goodput never counts as severe).
    pub severe_path_ratio: f64,
    /// Consecutive degraded (or target-missing) windows before the policy acts (3). An open
    /// congestion/gray verdict counts at once: the detectors already required persistence.
    pub trigger_windows: u32,
    /// A new plan must predict at least this much less communication time than the current (0.2).
    pub min_improvement: f64,
    /// Among plans within this fraction of the best prediction, the least lossy wins (0.3): a
    /// lossier codec costs model quality, and the cost model knows it least (on the testbed top-k
    /// at 10 % was predicted 20-25 % faster than int8 under uplink congestion and was not faster).
    pub lossy_slack: f64,
    /// Windows after a change before the next adapt/restore (5).
    pub min_dwell_windows: u64,
    /// Windows after a change ignored by verification: the job applies hints at a step boundary (1).
    pub settle_windows: u64,
    /// Windows of observed communication time that verify a change (3).
    pub verify_windows: usize,
    /// A change is kept only if communication time fell by at least this fraction (0.1).
    pub verify_min_gain: f64,
    /// Windows during which a reverted plan is not chosen again (60).
    pub cooldown_windows: u64,
    /// Consecutive healthy windows before a compressed job returns to its baseline (10).
    pub recover_windows: u32,
    /// Loss ratio (loss packets / data packets) from which a path is lossy (0.01).
    pub lossy_ratio: f64,
    /// Transport advice for jobs that allow it (`constraints.transport_tuning`): after
    /// `trigger_windows` windows in a row with a lossy path, hints carry this minimum TCP
    /// retransmission timeout, ms, until `recover_windows` windows in a row without one (5).
    /// 0: never advise. At most 200, Linux's own floor.
    pub loss_rto_min_ms: u32,
    /// Top-k ratio the policy proposes (raised to the tenant's `min_topk_ratio`) (0.1).
    pub topk_ratio: f32,
    /// Most channels the policy proposes, whatever the tenant allows (8).
    pub max_channels: u8,
    /// Renew the current hint this often, ms (10 000).
    pub renew_ms: u64,
    /// A published hint expires this long after publication, ms (60 000).
    pub hint_ttl_ms: u64,
    /// Decisions remembered per job (32).
    pub history_len: usize,
    /// Jobs with a policy (1024); further jobs get none until one leaves.
    pub max_jobs: usize,
    /// Cost model constants (see [`super::cost`]).
    pub cost: CostConstants,
}

/// The largest `loss_rto_min_ms`: Linux's default minimum retransmission timeout (`TCP_RTO_MIN`).
pub const MAX_LOSS_RTO_MIN_MS: u32 = 200;

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            recent_windows: 3,
            baseline_windows: 30,
            min_baseline_windows: 5,
            degrade_ratio: 1.3,
            path_slow_ratio: 0.8,
            severe_degrade_ratio: 3.0,
            severe_path_ratio: 0.5,
            trigger_windows: 3,
            min_improvement: 0.2,
            lossy_slack: 0.3,
            min_dwell_windows: 5,
            settle_windows: 1,
            verify_windows: 3,
            verify_min_gain: 0.1,
            cooldown_windows: 60,
            recover_windows: 10,
            lossy_ratio: 0.01,
            loss_rto_min_ms: 5,
            topk_ratio: 0.1,
            max_channels: 8,
            renew_ms: 10_000,
            hint_ttl_ms: 60_000,
            history_len: 32,
            max_jobs: 1024,
            cost: CostConstants::default(),
        }
    }
}

impl PolicyConfig {
    /// Each value in range: see the field docs.
    pub fn validate(&self) -> Result<(), Invalid> {
        fn key(k: &'static [&'static str]) -> impl Fn(String) -> Invalid {
            move |m| (k, m)
        }
        at_least(self.recent_windows as u64, 1).map_err(key(&["recent_windows"]))?;
        at_least(self.baseline_windows as u64, 1).map_err(key(&["baseline_windows"]))?;
        at_least(self.min_baseline_windows as u64, 1).map_err(key(&["min_baseline_windows"]))?;
        at_most("min_baseline_windows", self.min_baseline_windows, "baseline_windows", self.baseline_windows).map_err(key(&["min_baseline_windows"]))?;
        if !(self.degrade_ratio.is_finite() && self.degrade_ratio > 1.0) {
            return Err((&["degrade_ratio"], format!("{} must be a number above 1 (communication time over its healthy baseline)", self.degrade_ratio)));
        }
        in_range(self.path_slow_ratio, 0.0, 1.0).map_err(key(&["path_slow_ratio"]))?;
        if !(self.severe_degrade_ratio.is_finite() && self.severe_degrade_ratio >= self.degrade_ratio) {
            return Err((
                &["severe_degrade_ratio"],
                format!("{} must be a number at or above degrade_ratio ({})", self.severe_degrade_ratio, self.degrade_ratio),
            ));
        }
        in_range(self.severe_path_ratio, 0.0, self.path_slow_ratio)
            .map_err(|m| format!("{m}, path_slow_ratio"))
            .map_err(key(&["severe_path_ratio"]))?;
        at_least(u64::from(self.trigger_windows), 1).map_err(key(&["trigger_windows"]))?;
        in_range_from(self.min_improvement, 0.0, 1.0).map_err(key(&["min_improvement"]))?;
        at_least_f64(self.lossy_slack, 0.0).map_err(key(&["lossy_slack"]))?;
        at_least(self.verify_windows as u64, 1).map_err(key(&["verify_windows"]))?;
        in_range_from(self.verify_min_gain, 0.0, 1.0).map_err(key(&["verify_min_gain"]))?;
        at_least(u64::from(self.recover_windows), 1).map_err(key(&["recover_windows"]))?;
        in_range(self.lossy_ratio, 0.0, 1.0).map_err(key(&["lossy_ratio"]))?;
        if self.loss_rto_min_ms > MAX_LOSS_RTO_MIN_MS {
            return Err((
                &["loss_rto_min_ms"],
                format!("{} must be 0 (no transport advice) to {MAX_LOSS_RTO_MIN_MS} ms (Linux's own minimum retransmission timeout)", self.loss_rto_min_ms),
            ));
        }
        in_range(f64::from(self.topk_ratio), 0.0, 1.0).map_err(key(&["topk_ratio"]))?;
        at_least(u64::from(self.max_channels), 1).map_err(key(&["max_channels"]))?;
        at_least(self.renew_ms, 1).map_err(key(&["renew_ms"]))?;
        below("renew_ms", self.renew_ms, "hint_ttl_ms", self.hint_ttl_ms)
            .map_err(|m| format!("{m}: a hint would expire before it is renewed"))
            .map_err(key(&["hint_ttl_ms"]))?;
        at_least(self.history_len as u64, 1).map_err(key(&["history_len"]))?;
        at_least(self.max_jobs as u64, 1).map_err(key(&["max_jobs"]))?;
        let c = &self.cost;
        at_least_f64(c.alpha_s, 0.0).map_err(key(&["cost", "alpha_s"]))?;
        at_least_f64(c.channel_exponent, 0.0).map_err(key(&["cost", "channel_exponent"]))?;
        at_least_f64(c.lossy_channel_exponent, 0.0).map_err(key(&["cost", "lossy_channel_exponent"]))?;
        positive(c.fp16_bps).map_err(key(&["cost", "fp16_bps"]))?;
        positive(c.bf16_bps).map_err(key(&["cost", "bf16_bps"]))?;
        positive(c.int8_bps).map_err(key(&["cost", "int8_bps"]))?;
        positive(c.topk_bps).map_err(key(&["cost", "topk_bps"]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_overrides_some_fields_and_rejects_typos() {
        let c: PolicyConfig = toml::from_str("degrade_ratio = 1.5\n[cost]\nalpha_s = 0.0002\n").unwrap();
        assert_eq!(c.degrade_ratio, 1.5);
        assert_eq!(c.cost.alpha_s, 0.0002);
        assert_eq!(c.cost.int8_bps, CostConstants::default().int8_bps);
        assert_eq!(c.recent_windows, 3);
        assert!(toml::from_str::<PolicyConfig>("degrade_ration = 1.5\n").is_err());
    }

    #[test]
    fn defaults_are_valid() {
        PolicyConfig::default().validate().unwrap();
    }
}
