//! The JSON types of the hints API (`POST /v1/jobs`, `GET /v1/jobs/{id}/hints`, the SSE stream).
//!
//! Invariants:
//! - Every enum serialises as the same lowercase string its `Display` prints and its `FromStr`
//!   parses (`ring`, `int8`, `topk:0.1`), so JSON, CLI flags and Prometheus labels agree.
//! - Unknown JSON fields are rejected on requests (`deny_unknown_fields`), so a typo in a
//!   registration is a 400, not a silently ignored constraint.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value that does not parse, with what would.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} {given:?} is not valid: {expected}")]
pub struct ParseError {
    pub what: &'static str,
    pub given: String,
    pub expected: &'static str,
}

/// Allreduce algorithm. The one definition: the agent's policy, the hints API and ipu-firmware's
/// engine (`ipu_firmware::Algorithm`) all use this type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Algorithm {
    /// Ring reduce-scatter + allgather: bandwidth-optimal, latency grows with the rank count.
    Ring,
    /// Binary tree reduce + broadcast: fewer latency terms, about twice the bytes of a ring.
    Tree,
    /// Recursive halving-doubling: log2(n) latency terms, bandwidth-optimal for powers of two.
    Rhd,
}

impl Algorithm {
    pub const ALL: [Algorithm; 3] = [Algorithm::Ring, Algorithm::Tree, Algorithm::Rhd];
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Rhd => "rhd",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        Self::ALL.into_iter().find(|a| a.as_str() == s).ok_or_else(|| ParseError {
            what: "algorithm",
            given: s.to_owned(),
            expected: "use ring, tree or rhd",
        })
    }
}

/// Wire compression of gradients, from exact to most lossy:
/// `none` < `fp16` < `bf16` < `int8` < `topk:R` (smaller `R` is lossier).
/// The one definition: ipu-firmware's engine uses it as `ipu_firmware::CodecKind`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Codec {
    None,
    /// IEEE half precision: 2 bytes per f32, ~3 decimal digits.
    Fp16,
    /// bfloat16: 2 bytes per f32, f32's range, ~2 decimal digits.
    Bf16,
    /// 8-bit integers with one scale per chunk: 1 byte per f32.
    Int8,
    /// The largest `ratio` of values by magnitude (index + value): `ratio` in (0, 1].
    TopK { ratio: f32 },
}

impl Codec {
    /// The codec family name without parameters: `none`, `fp16`, `bf16`, `int8`, `topk`.
    pub fn family(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Fp16 => "fp16",
            Codec::Bf16 => "bf16",
            Codec::Int8 => "int8",
            Codec::TopK { .. } => "topk",
        }
    }

    /// Rank in the lossiness order (0 = exact). Top-k ranks above int8 whatever its ratio; compare
    /// ratios separately (see [`Constraints::allows_codec`]).
    pub fn lossiness(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Fp16 => 1,
            Codec::Bf16 => 2,
            Codec::Int8 => 3,
            Codec::TopK { .. } => 4,
        }
    }

    /// Whether decoding gives back exactly what was encoded: `none`, and top-k keeping everything.
    pub fn is_lossless(self) -> bool {
        matches!(self, Codec::None) || matches!(self, Codec::TopK { ratio } if ratio >= 1.0)
    }

    /// Checks the codec's parameter: a top-k ratio must be in (0, 1] (NaN is not).
    pub fn validate(self) -> Result<(), &'static str> {
        match self {
            Codec::TopK { ratio } if !(ratio > 0.0 && ratio <= 1.0) => Err("top-k ratio must be in (0, 1]"),
            _ => Ok(()),
        }
    }

    /// Bytes on the wire per f32 element, approximately (top-k sends index + value per kept one).
    pub fn wire_bytes_per_f32(self) -> f64 {
        match self {
            Codec::None => 4.0,
            Codec::Fp16 | Codec::Bf16 => 2.0,
            Codec::Int8 => 1.0,
            Codec::TopK { ratio } => 8.0 * ratio as f64,
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::TopK { ratio } => write!(f, "topk:{ratio}"),
            c => f.write_str(c.family()),
        }
    }
}

impl FromStr for Codec {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let err = || ParseError {
            what: "codec",
            given: s.to_owned(),
            expected: "use none, fp16, bf16, int8 or topk:RATIO with RATIO in (0, 1]",
        };
        Ok(match s {
            "none" => Codec::None,
            "fp16" => Codec::Fp16,
            "bf16" => Codec::Bf16,
            "int8" => Codec::Int8,
            _ => {
                let ratio: f32 = s.strip_prefix("topk:").ok_or_else(err)?.parse().map_err(|_| err())?;
                let c = Codec::TopK { ratio };
                c.validate().map_err(|_| err())?;
                c
            }
        })
    }
}

macro_rules! serde_via_str {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
serde_via_str!(Algorithm);
serde_via_str!(Codec);
serde_via_str!(PortRange);

/// An inclusive port range, written `"29500"` or `"29500-29510"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub lo: u16,
    pub hi: u16,
}

impl PortRange {
    pub fn contains(self, port: u16) -> bool {
        (self.lo..=self.hi).contains(&port)
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

impl FromStr for PortRange {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let err = || ParseError { what: "port range", given: s.to_owned(), expected: "write \"29500\" or \"29500-29510\" (lo <= hi)" };
        let (lo, hi) = s.split_once('-').unwrap_or((s, s));
        let lo: u16 = lo.trim().parse().map_err(|_| err())?;
        let hi: u16 = hi.trim().parse().map_err(|_| err())?;
        if lo > hi {
            return Err(err());
        }
        Ok(PortRange { lo, hi })
    }
}

/// What the tenant allows ringside to change. Defaults allow everything down to top-k 10 %.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Constraints {
    /// Algorithms ringside may choose. Default: all.
    pub algorithms: Vec<Algorithm>,
    /// Codec families ringside may choose (`none`, `fp16`, `bf16`, `int8`, `topk`). Default: all.
    /// `none` is always allowed (it is what the job runs without hints).
    pub codecs: Vec<String>,
    /// Smallest top-k ratio acceptable ("top-k keeping at least 10 %" = 0.1).
    pub min_topk_ratio: f32,
    /// Most channels (parallel connections per peer pair) the job opened; hints never exceed it.
    pub max_channels: u8,
    /// Whether the job can carry compression residuals to the next step (error feedback).
    pub error_feedback: bool,
    /// The step time the tenant wants, in ms; compression is considered when the predicted
    /// communication time alone would miss it. `None`: only when a path is degraded.
    pub step_time_target_ms: Option<f64>,
    /// Whether the job may take transport advice ([`Hint::tcp_rto_min_ms`]): its runtime can
    /// change the retransmission timer of its own TCP connections (the Python follower does it
    /// with per-peer routes, which needs `CAP_NET_ADMIN` in the job's network namespace).
    /// Default `false`: hints then never carry transport advice.
    pub transport_tuning: bool,
}

impl Default for Constraints {
    fn default() -> Self {
        Constraints {
            algorithms: Algorithm::ALL.to_vec(),
            codecs: ["none", "fp16", "bf16", "int8", "topk"].map(String::from).to_vec(),
            min_topk_ratio: 0.1,
            max_channels: 1,
            error_feedback: true,
            step_time_target_ms: None,
            transport_tuning: false,
        }
    }
}

impl Constraints {
    /// Checks the constraints themselves; the message says what to fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.algorithms.is_empty() {
            return Err("constraints.algorithms is empty: allow at least one of ring, tree, rhd".into());
        }
        for c in &self.codecs {
            if !["none", "fp16", "bf16", "int8", "topk"].contains(&c.as_str()) {
                return Err(format!("constraints.codecs: unknown codec {c:?}: use none, fp16, bf16, int8 or topk"));
            }
        }
        if !(self.min_topk_ratio > 0.0 && self.min_topk_ratio <= 1.0) {
            return Err(format!("constraints.min_topk_ratio {} must be in (0, 1]", self.min_topk_ratio));
        }
        if self.max_channels == 0 {
            return Err("constraints.max_channels must be at least 1".into());
        }
        if let Some(t) = self.step_time_target_ms {
            if !(t.is_finite() && t > 0.0) {
                return Err(format!("constraints.step_time_target_ms {t} must be a positive number of ms"));
            }
        }
        Ok(())
    }

    pub fn allows_algorithm(&self, a: Algorithm) -> bool {
        self.algorithms.contains(&a)
    }

    /// `none` always; others when their family is listed (top-k also needs `ratio >= min_topk_ratio`).
    pub fn allows_codec(&self, c: Codec) -> bool {
        if c == Codec::None {
            return true;
        }
        let listed = self.codecs.iter().any(|f| f == c.family());
        match c {
            Codec::TopK { ratio } => listed && ratio >= self.min_topk_ratio,
            _ => listed,
        }
    }
}

/// `POST /v1/jobs` body (operator token).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRegistration {
    /// Human-readable name, 1-64 characters of `[A-Za-z0-9._-]`.
    pub name: String,
    /// The job's hosts: addresses or CIDR prefixes ("10.77.0.2", "10.77.0.0/24", "fd00::/64").
    pub members: Vec<String>,
    /// TCP port ranges of the job's collective traffic (either end). Empty with `udp_ports` empty:
    /// every port.
    #[serde(default)]
    pub tcp_ports: Vec<PortRange>,
    /// UDP / RoCEv2 port ranges.
    #[serde(default)]
    pub udp_ports: Vec<PortRange>,
    /// Bytes reduced per step (the gradient buffer); lets the cost model predict communication
    /// time. `None`: estimated from the traffic seen per step.
    #[serde(default)]
    pub gradient_bytes: Option<u64>,
    #[serde(default)]
    pub constraints: Constraints,
}

/// `POST /v1/jobs` response (201). The tenant token is shown once; ringside keeps only its hash.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobCreated {
    pub id: String,
    pub name: String,
    pub tenant_token: String,
}

/// A registered job as the operator sees it (`GET /v1/jobs`); never includes tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    pub id: String,
    pub name: String,
    pub members: Vec<String>,
    pub tcp_ports: Vec<PortRange>,
    pub udp_ports: Vec<PortRange>,
    pub gradient_bytes: Option<u64>,
    pub constraints: Constraints,
    pub registered_unix_ms: u64,
}

/// The plan ringside recommends for a job (`GET /v1/jobs/{id}/hints`, one SSE `hint` event per
/// change).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hint {
    /// The job id.
    pub job: String,
    /// Increases by one with every plan change; SSE event ids carry it. A newly registered job's
    /// first hint is 1; after an agent restart a job's baseline hint comes back at the restart
    /// time in unix ms, above every earlier version, so "newer than the last applied" still holds.
    pub version: u64,
    /// Training step from which to apply the plan. 0 = "at your next step": ringside does not see
    /// the job's step counter; the job picks the step and applies it on all ranks at once.
    pub step_from: u64,
    pub algorithm: Algorithm,
    /// Pipeline chunk (frame) size in bytes.
    pub chunk_bytes: u32,
    /// Parallel connections per peer pair (at most `constraints.max_channels`).
    pub channels: u8,
    pub compression: Codec,
    /// Carry compression residuals to the next step (only when the constraints allow it).
    pub error_feedback: bool,
    /// Why, coarse and privacy-safe ("path to peer 10.0.0.3 lossy", "shared uplink congested").
    pub reasons: Vec<String>,
    /// 0..=1: how sure the policy is that this plan beats the previous one.
    pub confidence: f64,
    /// Unix time (ms) after which the hint is stale unless renewed (the stream renews it).
    pub expires_at: u64,
    /// Transport advice, only for a job whose constraints allow it (`transport_tuning`): the
    /// minimum TCP retransmission timeout (RTO) to use on the job's connections to its peers, ms.
    /// Sent while the job's paths lose packets: a lost tail segment then waits this long plus the
    /// round trip instead of Linux's 200 ms floor. Absent: the system's own (drop any advice
    /// applied before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_rto_min_ms: Option<u32>,
}

/// The plan a job's collectives run now, as the job's runtime reports it
/// (`PUT /v1/jobs/{id}/plan`): in managed mode each IPU's `ringside-ipu` reports the plan the
/// services agreed on, which may be another IPU's advice rather than this agent's hint. The policy
/// then attributes each window's measurements to the plan that actually ran (docs/policy.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppliedPlan {
    pub algorithm: Algorithm,
    /// Pipeline chunk (frame) size in bytes, at least 1.
    pub chunk_bytes: u32,
    /// Parallel connections per peer pair, at least 1.
    pub channels: u8,
    pub compression: Codec,
    #[serde(default)]
    pub error_feedback: bool,
    /// The job's step from which it runs (informational: ringside does not see the job's steps).
    #[serde(default)]
    pub step: u64,
    /// The job's own mean step time, ms, over the steps it completed since its previous report,
    /// every one of them under this plan (optional). The network shows when bytes move, not what
    /// a codec costs the job's CPU or the overlap it gives up; with this the policy keeps a
    /// change only if the job's steps got faster (docs/policy.md, rule 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time_ms: Option<f64>,
}

/// How long the agent trusts an [`AppliedPlan`] report without a new one, ms.
pub const APPLIED_PLAN_TTL_MS: u64 = 30_000;
/// How often a runtime repeats an unchanged report, ms (well inside [`APPLIED_PLAN_TTL_MS`]).
pub const APPLIED_PLAN_REFRESH_MS: u64 = 5_000;
/// The longest step time a report may carry, ms (an hour: anything longer is a unit mistake).
pub const MAX_REPORTED_STEP_TIME_MS: f64 = 3_600_000.0;

impl AppliedPlan {
    /// The values the agent refuses (a 400 with this message).
    pub fn validate(&self) -> Result<(), String> {
        if self.chunk_bytes == 0 {
            return Err("chunk_bytes must be at least 1".into());
        }
        if self.channels == 0 {
            return Err("channels must be at least 1".into());
        }
        if let Some(t) = self.step_time_ms {
            if !(t.is_finite() && t > 0.0 && t <= MAX_REPORTED_STEP_TIME_MS) {
                return Err(format!("step_time_ms {t} must be a number of milliseconds above 0 and at most {MAX_REPORTED_STEP_TIME_MS}"));
            }
        }
        self.compression.validate().map_err(str::to_owned)
    }
}

/// Every API error: `{"error": "..."}` with a 4xx/5xx status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_round_trip_as_strings() {
        for a in Algorithm::ALL {
            assert_eq!(a.to_string().parse::<Algorithm>().unwrap(), a);
            assert_eq!(serde_json::to_string(&a).unwrap(), format!("\"{a}\""));
        }
        for c in [Codec::None, Codec::Fp16, Codec::Bf16, Codec::Int8, Codec::TopK { ratio: 0.25 }] {
            let j = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<Codec>(&j).unwrap(), c);
        }
        assert!("topk:0".parse::<Codec>().is_err());
        assert!("topk:1.5".parse::<Codec>().is_err());
        assert!("zstd".parse::<Codec>().unwrap_err().to_string().contains("use none, fp16"));
        assert_eq!("29500-29510".parse::<PortRange>().unwrap(), PortRange { lo: 29500, hi: 29510 });
        assert!("9-1".parse::<PortRange>().is_err());
    }

    #[test]
    fn registration_defaults_and_unknown_fields() {
        let r: JobRegistration = serde_json::from_str(r#"{"name":"j","members":["10.77.0.0/24"],"tcp_ports":["29500"]}"#).unwrap();
        assert_eq!(r.constraints, Constraints::default());
        assert_eq!(r.tcp_ports, vec![PortRange { lo: 29500, hi: 29500 }]);
        let e = serde_json::from_str::<JobRegistration>(r#"{"name":"j","members":[],"constrains":{}}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `constrains`"), "{e}");
        let c: Constraints = serde_json::from_str(r#"{"codecs":["fp16","int8","topk"],"min_topk_ratio":0.1}"#).unwrap();
        assert!(c.allows_codec(Codec::None) && c.allows_codec(Codec::Int8));
        assert!(!c.allows_codec(Codec::Bf16));
        assert!(c.allows_codec(Codec::TopK { ratio: 0.1 }) && !c.allows_codec(Codec::TopK { ratio: 0.05 }));
        assert!(Constraints { max_channels: 0, ..Default::default() }.validate().is_err());
    }
}
