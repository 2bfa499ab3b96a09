//! The alpha-beta cost model of one allreduce, per algorithm × codec × channels.
//!
//! With `n` ranks, `S` bytes of f32 gradient per step, `B` the bottleneck bandwidth of the job
//! (bytes/s; the slowest measured path) and `α` the per-message latency:
//!
//! | algorithm | latency term | bandwidth term |
//! |---|---|---|
//! | ring | `2(n−1)·α` | `2(n−1)/n · S'/B'` |
//! | rhd  | `2⌈log2 n⌉·α` (+ `2α` fold when `n` is not a power of two) | `2(n−1)/n · S'/B'` (+ `2·S'/B'` fold) |
//! | tree | `2⌈log2 n⌉·α` | `2 · S'/B'` (pipelined reduce + broadcast) |
//!
//! - compression: `S' = S · wire_bytes_per_f32 / 4`, plus codec CPU time
//!   `2(n−1)/n · S / codec_throughput` (every rank encodes what it sends and decodes what it
//!   receives, per core);
//! - channels: `B' = B · c^γ`, with `γ = 0.25` on a clean path (measured: 2 channels gave
//!   0.514 / 0.431 = 1.19 = 2^0.25 on the 4-rank testbed) and `γ = 1` on a lossy path (Mathis:
//!   a TCP flow's rate is ∝ MSS / (RTT·√p), so `c` loss-limited flows carry about `c` times one).
//!
//! Loss itself is *not* a term: `B` is the job's measured in-burst goodput, which already shows
//! what loss (and congestion, and CPU) does to the path; deriving a rate from the loss ratio
//! with Mathis would count the same slowdown twice and needs an RTT the agent does not measure.
//!
//! Constants ([`CostConstants::default`]) come from `docs/benchmarks-collectives.md` (4 ranks,
//! TCP over veth): α = 100 µs (1 KiB allreduce: ring 0.77 ms for 6 messages, tree 0.38 ms for
//! 4), codec encode+decode per core fp16 5.14, bf16 6.93, int8 5.88, top-k 2.52 GB/s. Check:
//! 16 MiB ring at 0.431 GB/s is 58 ms; the model predicts fp16 29 + 4.9 = 34 ms (measured 32.6)
//! and int8 14.6 + 4.3 = 19 ms (measured 24.8). Absolute times are only as good as those
//! numbers, so the policy uses the model *relatively*: [`Calibrated`] scales it so that the
//! current plan predicts exactly the observed communication time.
//!
//! Invariants: every prediction is finite and positive for finite positive inputs; more wire
//! bytes or less bandwidth never predicts less time.

use ringside_client::{Algorithm, Codec, Hint};
use serde::{Deserialize, Serialize};

/// A plan the policy can recommend: the hint without its bookkeeping (version, reasons, expiry).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanChoice {
    pub algorithm: Algorithm,
    pub chunk_bytes: u32,
    pub channels: u8,
    pub compression: Codec,
    pub error_feedback: bool,
}

impl PlanChoice {
    pub fn from_hint(h: &Hint) -> Self {
        PlanChoice {
            algorithm: h.algorithm,
            chunk_bytes: h.chunk_bytes,
            channels: h.channels.max(1),
            compression: h.compression,
            error_feedback: h.error_feedback,
        }
    }

    /// The plan a job reports it runs (validated: `channels` ≥ 1).
    pub fn from_applied(p: &ringside_client::AppliedPlan) -> Self {
        PlanChoice {
            algorithm: p.algorithm,
            chunk_bytes: p.chunk_bytes,
            channels: p.channels.max(1),
            compression: p.compression,
            error_feedback: p.error_feedback,
        }
    }

    /// The hint that carries this plan.
    pub fn to_hint(&self, job: &str, version: u64, reasons: Vec<String>, confidence: f64, expires_at: u64) -> Hint {
        Hint {
            job: job.to_owned(),
            version,
            step_from: 0,
            algorithm: self.algorithm,
            chunk_bytes: self.chunk_bytes,
            channels: self.channels,
            compression: self.compression,
            error_feedback: self.error_feedback,
            reasons,
            confidence: confidence.clamp(0.0, 1.0),
            expires_at,
            tcp_rto_min_ms: None,
        }
    }

    /// Short, privacy-safe label for logs and reasons: `ring/int8/2ch`.
    pub fn label(&self) -> String {
        format!("{}/{}/{}ch", self.algorithm, self.compression, self.channels)
    }
}

/// Model constants, with their source in the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostConstants {
    /// Per-message latency α, seconds (100 µs).
    pub alpha_s: f64,
    /// Channel gain exponent γ on a clean path (0.25).
    pub channel_exponent: f64,
    /// Channel gain exponent on a lossy path (1.0, Mathis).
    pub lossy_channel_exponent: f64,
    /// Codec encode+decode throughput per core, bytes of f32 input per second.
    pub fp16_bps: f64,
    pub bf16_bps: f64,
    pub int8_bps: f64,
    pub topk_bps: f64,
}

impl Default for CostConstants {
    fn default() -> Self {
        CostConstants {
            alpha_s: 100e-6,
            channel_exponent: 0.25,
            lossy_channel_exponent: 1.0,
            fp16_bps: 5.14e9,
            bf16_bps: 6.93e9,
            int8_bps: 5.88e9,
            topk_bps: 2.52e9,
        }
    }
}

/// What the model needs to know about the job and its paths.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PathModel {
    /// Ranks in the job (≥ 2).
    pub ranks: usize,
    /// f32 bytes reduced per step.
    pub bytes: f64,
    /// Bottleneck bandwidth, bytes/s.
    pub bandwidth_bps: f64,
    /// Whether the bottleneck path loses packets (channels then scale linearly).
    pub lossy: bool,
}

/// The alpha-beta model; see the module docs for the formulas.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostModel {
    pub constants: CostConstants,
}

fn ceil_log2(n: usize) -> u32 {
    usize::BITS - (n.max(1) - 1).leading_zeros()
}

impl CostModel {
    pub fn new(constants: CostConstants) -> Self {
        CostModel { constants }
    }

    fn codec_bps(&self, c: Codec) -> Option<f64> {
        let k = &self.constants;
        match c {
            Codec::None => None,
            Codec::Fp16 => Some(k.fp16_bps),
            Codec::Bf16 => Some(k.bf16_bps),
            Codec::Int8 => Some(k.int8_bps),
            Codec::TopK { .. } => Some(k.topk_bps),
        }
    }

    /// Predicted seconds of one allreduce under `plan`.
    pub fn seconds(&self, plan: &PlanChoice, path: &PathModel) -> f64 {
        let k = &self.constants;
        let n = path.ranks.max(2);
        let nf = n as f64;
        let s = path.bytes.max(0.0);
        let wire = s * plan.compression.wire_bytes_per_f32() / 4.0;
        let gamma = if path.lossy { k.lossy_channel_exponent } else { k.channel_exponent };
        let b = path.bandwidth_bps.max(1.0) * (plan.channels.max(1) as f64).powf(gamma);
        let share = 2.0 * (nf - 1.0) / nf;
        let logn = ceil_log2(n) as f64;
        let (lat_msgs, volume) = match plan.algorithm {
            Algorithm::Ring => (2.0 * (nf - 1.0), share * wire),
            Algorithm::Rhd => {
                let fold = !n.is_power_of_two();
                let extra = if fold { 2.0 } else { 0.0 };
                (2.0 * logn + extra, share * wire + extra * wire)
            }
            Algorithm::Tree => (2.0 * logn, 2.0 * wire),
        };
        let codec = self.codec_bps(plan.compression).map_or(0.0, |t| share * s / t);
        lat_msgs * k.alpha_s + volume / b + codec
    }
}

/// The model scaled to the job: `scale = observed / model(current plan)`, so the current plan
/// predicts the observed communication time and other plans are predicted *relative* to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibrated {
    pub model: CostModel,
    pub path: PathModel,
    /// Clamped to [0.1, 10]: a model off by more than 10× is not trusted further.
    pub scale: f64,
}

impl Calibrated {
    pub fn new(model: CostModel, path: PathModel, current: &PlanChoice, observed_s: f64) -> Self {
        let raw = model.seconds(current, &path);
        let scale = if raw > 0.0 && observed_s.is_finite() && observed_s > 0.0 { (observed_s / raw).clamp(0.1, 10.0) } else { 1.0 };
        Calibrated { model, path, scale }
    }

    pub fn predict(&self, plan: &PlanChoice) -> f64 {
        self.scale * self.model.seconds(plan, &self.path)
    }

    /// Whether the raw model was within 2× of what was observed (used for confidence).
    pub fn trusted(&self) -> bool {
        (0.5..=2.0).contains(&self.scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn plan(algorithm: Algorithm, compression: Codec, channels: u8) -> PlanChoice {
        PlanChoice { algorithm, chunk_bytes: 1 << 20, channels, compression, error_feedback: false }
    }

    const MIB16: f64 = 16.0 * 1048576.0;

    #[test]
    fn reproduces_the_testbed_benchmarks_roughly() {
        let m = CostModel::default();
        let path = PathModel { ranks: 4, bytes: MIB16, bandwidth_bps: 0.431e9, lossy: false };
        let ring = m.seconds(&plan(Algorithm::Ring, Codec::None, 1), &path);
        assert!((ring - 0.0584).abs() < 0.002, "{ring}");
        let fp16 = m.seconds(&plan(Algorithm::Ring, Codec::Fp16, 1), &path);
        assert!((fp16 - 0.0326).abs() < 0.004, "{fp16} vs measured 32.6 ms");
        let int8 = m.seconds(&plan(Algorithm::Ring, Codec::Int8, 1), &path);
        assert!(int8 < fp16 && (0.015..0.026).contains(&int8), "{int8} vs measured 24.8 ms");
        let two = m.seconds(&plan(Algorithm::Ring, Codec::None, 2), &path);
        assert!((ring / two - 1.19).abs() < 0.02, "2 channels: {}", ring / two);
    }

    #[test]
    fn formulas_per_algorithm() {
        let m = CostModel::new(CostConstants { alpha_s: 1.0, ..Default::default() });
        let p = |n| PathModel { ranks: n, bytes: 0.0, bandwidth_bps: 1e9, lossy: false };
        // Latency only (S = 0): message counts.
        assert_eq!(m.seconds(&plan(Algorithm::Ring, Codec::None, 1), &p(8)), 14.0);
        assert_eq!(m.seconds(&plan(Algorithm::Rhd, Codec::None, 1), &p(8)), 6.0);
        assert_eq!(m.seconds(&plan(Algorithm::Rhd, Codec::None, 1), &p(6)), 8.0, "fold for 6 ranks");
        assert_eq!(m.seconds(&plan(Algorithm::Tree, Codec::None, 1), &p(8)), 6.0);
        // Bandwidth only (α = 0): tree moves about twice a ring's bytes.
        let m = CostModel::new(CostConstants { alpha_s: 0.0, ..Default::default() });
        let q = PathModel { ranks: 4, bytes: 1e9, bandwidth_bps: 1e9, lossy: false };
        assert_eq!(m.seconds(&plan(Algorithm::Ring, Codec::None, 1), &q), 1.5);
        assert_eq!(m.seconds(&plan(Algorithm::Tree, Codec::None, 1), &q), 2.0);
        assert_eq!(m.seconds(&plan(Algorithm::Rhd, Codec::None, 1), &q), 1.5);
    }

    #[test]
    fn lossy_paths_gain_more_from_channels_and_calibration_is_relative() {
        let m = CostModel::default();
        let clean = PathModel { ranks: 4, bytes: MIB16, bandwidth_bps: 1e8, lossy: false };
        let lossy = PathModel { lossy: true, ..clean };
        let one = plan(Algorithm::Ring, Codec::None, 1);
        let four = plan(Algorithm::Ring, Codec::None, 4);
        assert!(m.seconds(&four, &lossy) < m.seconds(&four, &clean));
        assert_eq!(m.seconds(&one, &lossy), m.seconds(&one, &clean));
        let c = Calibrated::new(m.clone(), clean, &one, 2.0 * m.seconds(&one, &clean));
        assert!((c.predict(&one) - 2.0 * m.seconds(&one, &clean)).abs() < 1e-12);
        assert!(c.trusted());
        let int8 = plan(Algorithm::Ring, Codec::Int8, 1);
        assert!((c.predict(&int8) / c.predict(&one) - m.seconds(&int8, &clean) / m.seconds(&one, &clean)).abs() < 1e-12);
    }
}
