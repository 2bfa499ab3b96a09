//! Which plans a job may run, which one to pick, and how to say why.
//!
//! - Candidates ([`candidates`]): every algorithm the tenant allows × every codec it allows
//!   (top-k at `max(policy topk_ratio, constraints.min_topk_ratio)`, and only when the job can
//!   carry error feedback: top-k without it loses most of the gradient) × channels
//!   `1..=min(max_channels, policy cap)`. The baseline's algorithm is always a candidate (the
//!   job runs it without hints). Error feedback is on for every compressed plan when allowed.
//! - Choice ([`choose`]): with a communication budget (step time target − compute), the *least
//!   lossy* candidate whose prediction fits it; without one, or when none fits, the least lossy
//!   candidate within `lossy_slack` of the best prediction. "Least lossy" orders by codec
//!   lossiness, then larger top-k ratio, then fewer channels, then the baseline's algorithm.
//! - Reasons ([`Trigger`]): coarse and privacy-safe: peers of the job by address, never link or
//!   interface names, never another job.
//!
//! Invariants: every candidate satisfies the constraints (`allows_algorithm` except for the
//! baseline's own algorithm, `allows_codec`, channels ≤ `max_channels`); the choice is
//! deterministic (ties broken by the preference order, then candidate order).

use std::cmp::Ordering;
use std::fmt;
use std::net::IpAddr;

use ringside_client::{Algorithm, Codec, Constraints};

use super::cost::PlanChoice;

/// Every plan the tenant's constraints allow, in a fixed order.
pub fn candidates(c: &Constraints, base: &PlanChoice, topk_ratio: f32, channel_cap: u8) -> Vec<PlanChoice> {
    let mut algorithms: Vec<Algorithm> = Algorithm::ALL.into_iter().filter(|&a| c.allows_algorithm(a) || a == base.algorithm).collect();
    algorithms.sort_by_key(|&a| (a != base.algorithm, a));
    let ratio = topk_ratio.max(c.min_topk_ratio).min(1.0);
    let codecs: Vec<Codec> = [Codec::None, Codec::Fp16, Codec::Bf16, Codec::Int8, Codec::TopK { ratio }]
        .into_iter()
        .filter(|&k| c.allows_codec(k))
        .filter(|k| !matches!(k, Codec::TopK { .. }) || c.error_feedback)
        .collect();
    let max_ch = c.max_channels.min(channel_cap).max(1);
    let mut out = Vec::new();
    for &algorithm in &algorithms {
        for &compression in &codecs {
            for channels in 1..=max_ch {
                out.push(PlanChoice {
                    algorithm,
                    chunk_bytes: base.chunk_bytes,
                    channels,
                    compression,
                    error_feedback: c.error_feedback && compression != Codec::None,
                });
            }
        }
    }
    out
}

/// Preference among plans that predict about the same: less lossy first.
fn preference(a: &PlanChoice, b: &PlanChoice, base: &PlanChoice) -> Ordering {
    let ratio = |p: &PlanChoice| match p.compression {
        Codec::TopK { ratio } => -(ratio as f64),
        _ => 0.0,
    };
    a.compression
        .lossiness()
        .cmp(&b.compression.lossiness())
        .then(ratio(a).total_cmp(&ratio(b)))
        .then(a.channels.cmp(&b.channels))
        .then((a.algorithm != base.algorithm).cmp(&(b.algorithm != base.algorithm)))
}

/// A plan and its predicted communication time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Choice {
    pub plan: PlanChoice,
    pub predicted_s: f64,
}

/// Picks a plan; see the module docs. `None` only for no candidates.
pub fn choose(
    cands: &[PlanChoice],
    predict: impl Fn(&PlanChoice) -> f64,
    budget_s: Option<f64>,
    lossy_slack: f64,
    base: &PlanChoice,
) -> Option<Choice> {
    let scored: Vec<Choice> = cands.iter().map(|p| Choice { plan: *p, predicted_s: predict(p) }).filter(|c| c.predicted_s.is_finite()).collect();
    let best = scored.iter().map(|c| c.predicted_s).min_by(f64::total_cmp)?;
    let pick = |ok: &dyn Fn(&Choice) -> bool| {
        scored.iter().filter(|c| ok(c)).min_by(|a, b| preference(&a.plan, &b.plan, base).then(a.predicted_s.total_cmp(&b.predicted_s))).copied()
    };
    budget_s
        .and_then(|b| pick(&|c: &Choice| c.predicted_s <= b))
        .or_else(|| pick(&|c: &Choice| c.predicted_s <= best * (1.0 + lossy_slack)))
}

/// Why a plan change was considered; `Display` is the tenant-facing reason.
#[derive(Clone, Debug, PartialEq)]
pub enum Trigger {
    /// The path to a peer loses packets (ratio of its data packets).
    LossyPeer { peer: IpAddr, loss: f64 },
    /// A gray-failure verdict names the path to the peer.
    DegradedPeer { peer: IpAddr },
    /// A link the job's traffic crosses is congested (its name stays with the provider).
    UplinkCongested,
    /// Communication time per step over its healthy baseline.
    CommInflated { ratio: f64 },
    /// Step time over the tenant's target.
    TargetMissed { target_ms: f64, observed_ms: f64 },
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::LossyPeer { peer, loss } => write!(f, "path to peer {peer} lossy ({:.1}% loss)", loss * 100.0),
            Trigger::DegradedPeer { peer } => write!(f, "path to peer {peer} degraded"),
            Trigger::UplinkCongested => f.write_str("shared uplink congested"),
            Trigger::CommInflated { ratio } => write!(f, "communication time {ratio:.1}x its healthy baseline"),
            Trigger::TargetMissed { target_ms, observed_ms } => {
                write!(f, "step time target {target_ms:.0} ms missed (observed {observed_ms:.0} ms)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> PlanChoice {
        PlanChoice { algorithm: Algorithm::Ring, chunk_bytes: 1 << 20, channels: 1, compression: Codec::None, error_feedback: false }
    }

    #[test]
    fn candidates_respect_constraints() {
        let c = Constraints { codecs: vec!["none".into(), "fp16".into(), "topk".into()], min_topk_ratio: 0.3, max_channels: 4, algorithms: vec![Algorithm::Tree], ..Default::default() };
        let cs = candidates(&c, &base(), 0.1, 2);
        assert!(cs.iter().all(|p| c.allows_codec(p.compression) && p.channels <= 2));
        assert!(cs.iter().all(|p| p.algorithm != Algorithm::Rhd), "rhd is not allowed");
        assert!(cs.iter().any(|p| p.algorithm == Algorithm::Ring), "the baseline's own algorithm stays");
        assert!(cs.iter().any(|p| p.compression == Codec::TopK { ratio: 0.3 }));
        assert!(cs.iter().all(|p| p.error_feedback == (p.compression != Codec::None)));
        let no_ef = Constraints { error_feedback: false, ..Default::default() };
        assert!(candidates(&no_ef, &base(), 0.1, 8).iter().all(|p| !matches!(p.compression, Codec::TopK { .. }) && !p.error_feedback));
        let only_none = Constraints { codecs: vec!["none".into()], ..Default::default() };
        assert!(candidates(&only_none, &base(), 0.1, 8).iter().all(|p| p.compression == Codec::None));
    }

    #[test]
    fn prefers_the_least_lossy_plan_that_is_good_enough() {
        let c = Constraints::default();
        let cs = candidates(&c, &base(), 0.1, 8);
        // Wire-proportional times: none 100, fp16/bf16 50, int8 25, topk 20.
        let predict = |p: &PlanChoice| 100.0 * p.compression.wire_bytes_per_f32() / 4.0;
        let pick = choose(&cs, predict, None, 0.15, &base()).unwrap();
        assert_eq!(pick.plan.compression, Codec::TopK { ratio: 0.1 }, "int8 is 25 % worse than top-k");
        let pick = choose(&cs, predict, None, 0.3, &base()).unwrap();
        assert_eq!(pick.plan.compression, Codec::Int8);
        let pick = choose(&cs, predict, Some(60.0), 0.15, &base()).unwrap();
        assert_eq!(pick.plan.compression, Codec::Fp16, "fp16 meets the budget");
        assert_eq!((pick.plan.algorithm, pick.plan.channels), (Algorithm::Ring, 1));
        assert!(choose(&[], predict, None, 0.1, &base()).is_none());
    }

    #[test]
    fn reasons_are_coarse() {
        let peer: IpAddr = "10.0.0.3".parse().unwrap();
        assert_eq!(Trigger::LossyPeer { peer, loss: 0.021 }.to_string(), "path to peer 10.0.0.3 lossy (2.1% loss)");
        assert_eq!(Trigger::UplinkCongested.to_string(), "shared uplink congested");
        assert_eq!(Trigger::CommInflated { ratio: 2.06 }.to_string(), "communication time 2.1x its healthy baseline");
        assert_eq!(
            Trigger::TargetMissed { target_ms: 120.0, observed_ms: 151.2 }.to_string(),
            "step time target 120 ms missed (observed 151 ms)"
        );
    }
}
