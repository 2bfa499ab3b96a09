//! How collectives run ([`Plan`]), how plans change ([`PlanSource`], [`PlanSchedule`]), and the
//! per-collective [`ControlHeader`] through which rank 0 imposes the plan on every rank.
//!
//! Invariants:
//! - Only rank 0 consults a [`PlanSource`]. Before every collective, rank 0 sends a control header
//!   (op number, training step, op kind, dtype, element count, root, active plan) to every other rank,
//!   and every rank runs that collective with exactly that plan. Ranks therefore cannot disagree on the
//!   plan, and a plan change takes effect on all ranks at the same collective: the first collective of
//!   the first training step `>= step_from` (as seen by rank 0).
//! - A rank whose own call (op kind, dtype, element count, root, training step) differs from rank 0's
//!   header fails with [`crate::CollectiveError::CollectiveMismatch`] before it applies any data.
//! - Plan hold ([`ControlHeader::plan_held_until`]): each control header also promises that rank 0
//!   runs the *next* collective with the same plan if that collective's training step is below
//!   `plan_held_until` (the earliest `step_from` among plans waiting in rank 0's schedule; 0 = no
//!   promise). A rank holding such a promise starts the next collective at once with that plan and
//!   checks the control header when it first receives (see [`crate::engine`]): waiting for the header
//!   before the first send cost every collective one latency hop on ranks 1..n−1 (issue 12). Rank 0
//!   keeps the promise by not activating plans for that collective; a plan it polls from its source
//!   meanwhile takes effect one collective later than it would have without the promise. A mismatched
//!   call on a promised collective still fails with `CollectiveMismatch` on the mismatched rank (it
//!   takes a header already queued before it looks at its peers' failures), but its first frames may
//!   already have reached its peers. A peer that reads a frame shaped for another call (codec, element
//!   range) fails with [`crate::CollectiveError::PeerCallMismatch`] naming that rank; one that sees an
//!   abort first fails with `PeerDisconnected`/`PeerClosed`. A mismatch that leaves the frames' shape
//!   alone (only the training step) can let peers that got everything they needed from the mismatched
//!   rank first complete with its contribution.
//! - An invalid plan from a source (zero chunk size, more channels than the mesh has, bad top-k
//!   ratio) is logged and dropped; the active plan stays in force.

use crate::codec::{self, CodecKind};
use crate::wire::FrameError;
use serde::{Deserialize, Serialize};
use std::str::FromStr;
use zerocopy::little_endian::{F32, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Allreduce algorithm: the tenant wire type [`ringside_client::Algorithm`] itself (one
/// definition: a hint's algorithm is a plan's algorithm without conversion). Ring is ring
/// reduce-scatter then ring allgather, pipelined per chunk ([`crate::engine`]); tree a binary tree
/// rooted at rank 0 (pipelined reduce to the root, then pipelined broadcast); rhd recursive halving
/// then recursive doubling, where ranks beyond the largest power of two fold into a partner first and
/// receive the result last. An rhd allreduce of at most
/// [`crate::engine::RHD_DOUBLING_MAX_BYTES`] on the raw f32 wire runs as plain recursive doubling
/// of the whole buffer (log2 p exchanges instead of 2·log2 p; see
/// [`crate::engine::rhd_uses_doubling`]): the same on every rank, since it depends only on the plan and
/// the element count.
pub use ringside_client::Algorithm;

/// The id of `a` in the control header.
fn algorithm_id(a: Algorithm) -> u8 {
    match a {
        Algorithm::Ring => 1,
        Algorithm::Tree => 2,
        Algorithm::Rhd => 3,
    }
}

fn algorithm_from_id(v: u8) -> Option<Algorithm> {
    Algorithm::ALL.into_iter().find(|&a| algorithm_id(a) == v)
}

/// Wire compression of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Compression {
    pub codec: CodecKind,
    /// Carry each rank's compression residual to its next send of the same element positions.
    pub error_feedback: bool,
}

impl Compression {
    pub const NONE: Compression = Compression { codec: CodecKind::None, error_feedback: false };
}

/// How collectives run from training step `step_from` on.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub step_from: u64,
    pub algorithm: Algorithm,
    /// Chunk size in bytes of the buffer's dtype; each chunk is one frame (and one pipeline unit).
    pub chunk_bytes: u32,
    /// Parallel TCP connections used per peer pair (chunk `i` travels on channel `i % channels`).
    pub channels: u8,
    pub compression: Compression,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            step_from: 0,
            algorithm: Algorithm::Ring,
            chunk_bytes: 1 << 20,
            channels: 1,
            compression: Compression::NONE,
        }
    }
}

/// Why a plan cannot be used on this mesh.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("chunk_bytes must be between 4 and {max}, got {got}")]
    ChunkBytes { got: u32, max: u32 },
    #[error("plan asks for {got} channels but the mesh was built with {available}; use 1..={available}")]
    Channels { got: u8, available: u8 },
    #[error("invalid compression: {reason}")]
    Compression { reason: &'static str },
}

/// Largest chunk a plan may ask for (the frame payload limit leaves room for top-k overhead).
pub const MAX_CHUNK_BYTES: u32 = 64 << 20;

impl Plan {
    pub fn validate(&self, available_channels: u8) -> Result<(), PlanError> {
        if !(4..=MAX_CHUNK_BYTES).contains(&self.chunk_bytes) {
            return Err(PlanError::ChunkBytes { got: self.chunk_bytes, max: MAX_CHUNK_BYTES });
        }
        if self.channels == 0 || self.channels > available_channels {
            return Err(PlanError::Channels { got: self.channels, available: available_channels });
        }
        self.compression.codec.validate().map_err(|reason| PlanError::Compression { reason })
    }
}

/// Where rank 0 gets plan changes from. Polled once per collective, before the control header is
/// sent; must not block. A later issue feeds ringside's hints through this.
pub trait PlanSource: Send {
    /// New plans known at training step `step` (may have `step_from` in the future).
    fn poll(&mut self, step: u64) -> Vec<Plan>;
}

/// A fixed list of plans, handed over all at once (tests, scripted experiments).
#[derive(Clone, Debug, Default)]
pub struct ScriptedPlans(pub Vec<Plan>);

impl PlanSource for ScriptedPlans {
    fn poll(&mut self, _step: u64) -> Vec<Plan> {
        std::mem::take(&mut self.0)
    }
}

/// Plans pushed from another thread (e.g. a hint client).
impl PlanSource for std::sync::mpsc::Receiver<Plan> {
    fn poll(&mut self, _step: u64) -> Vec<Plan> {
        self.try_iter().take(1024).collect()
    }
}

/// A hint rank 0's hint follower ([`crate::hints::HintFollower`]) handed to the plan schedule. It
/// lives here, below both the follower and the job report that records it
/// ([`crate::job::JobReport::record_hints`]), so that neither imports the other.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AppliedHint {
    pub version: u64,
    /// Rank 0's training step when the hint was polled.
    pub received_at_step: u64,
    /// The plan handed to the schedule (its `step_from` is the step it takes effect).
    pub plan: Plan,
    pub reasons: Vec<String>,
    pub confidence: f64,
}

/// Rank 0's view: the active plan, plans waiting for their `step_from`, and the source.
pub struct PlanSchedule {
    active: Plan,
    pending: Vec<Plan>,
    source: Option<Box<dyn PlanSource>>,
    available_channels: u8,
}

impl PlanSchedule {
    pub fn new(initial: Plan, available_channels: u8) -> Self {
        Self { active: initial, pending: Vec::new(), source: None, available_channels }
    }

    pub fn set_source(&mut self, source: Box<dyn PlanSource>) {
        self.source = Some(source);
    }

    pub fn active(&self) -> &Plan {
        &self.active
    }

    /// Moves new plans from the source into the pending list (invalid ones are logged and dropped).
    fn poll_source(&mut self, step: u64) {
        if let Some(src) = self.source.as_mut() {
            for p in src.poll(step) {
                match p.validate(self.available_channels) {
                    Ok(()) => self.pending.push(p),
                    Err(e) => tracing::warn!(error = %e, ?p, "dropping invalid plan"),
                }
            }
        }
    }

    /// The active plan for a collective whose plan was promised by the previous control header:
    /// polls the source (so that [`Self::held_until`] sees new plans) but activates nothing.
    pub fn hold_active(&mut self, step: u64) -> Plan {
        self.poll_source(step);
        self.active
    }

    /// The active plan stays in force for every training step below this, as far as the plans
    /// received so far go: the earliest pending `step_from`, `u64::MAX` with none pending.
    pub fn held_until(&self) -> u64 {
        self.pending.iter().map(|p| p.step_from).min().unwrap_or(u64::MAX)
    }

    /// Polls the source and returns the plan for a collective at training step `step`: the pending
    /// plan with the largest `step_from <= step`, if any, else the current one.
    pub fn plan_for_step(&mut self, step: u64) -> Plan {
        self.poll_source(step);
        // Stable sort: among equal step_from the later-received plan wins.
        self.pending.sort_by_key(|p| p.step_from);
        let due = self.pending.iter().rposition(|p| p.step_from <= step);
        if let Some(i) = due {
            self.active = self.pending[i];
            self.pending.drain(..=i);
        }
        self.active
    }
}

/// What a collective is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Allreduce = 1,
    ReduceScatter = 2,
    Allgather = 3,
    Broadcast = 4,
}

/// Element type of the user's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    F32 = 1,
    Bf16 = 2,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
}

impl FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(Dtype::F32),
            "bf16" => Ok(Dtype::Bf16),
            _ => Err(format!("unknown dtype {s:?}: use f32 or bf16")),
        }
    }
}

/// Payload of a [`crate::wire::FrameKind::Control`] frame.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ControlHeader {
    pub training_step: u64,
    pub op_kind: OpKind,
    pub dtype: Dtype,
    pub elems: u64,
    pub root: u32,
    pub plan: Plan,
    /// Rank 0 runs the next collective with `plan` too if its training step is below this (0: no
    /// promise); see the module docs.
    pub plan_held_until: u64,
}

/// A [`ControlHeader`] as it is on the wire: ids and flags in the first six bytes, then
/// little-endian integers at their natural offsets; the padding is written as zeros and ignored on
/// receipt.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
struct WireControlHeader {
    op_kind: u8,
    dtype: u8,
    algorithm: u8,
    codec: u8,
    error_feedback: u8,
    channels: u8,
    _pad0: [u8; 2],
    chunk_bytes: U32,
    /// The top-k ratio; 0 for the other codecs.
    topk_ratio: F32,
    root: U32,
    _pad1: [u8; 4],
    training_step: U64,
    elems: U64,
    step_from: U64,
    plan_held_until: U64,
}

const _: () = assert!(std::mem::size_of::<WireControlHeader>() == ControlHeader::LEN);

impl ControlHeader {
    pub const LEN: usize = 56;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let ratio = match self.plan.compression.codec {
            CodecKind::TopK { ratio } => ratio,
            _ => 0.0,
        };
        zerocopy::transmute!(WireControlHeader {
            op_kind: self.op_kind as u8,
            dtype: self.dtype as u8,
            algorithm: algorithm_id(self.plan.algorithm),
            codec: codec::wire_id(self.plan.compression.codec),
            error_feedback: u8::from(self.plan.compression.error_feedback),
            channels: self.plan.channels,
            _pad0: [0; 2],
            chunk_bytes: self.plan.chunk_bytes.into(),
            topk_ratio: ratio.into(),
            root: self.root.into(),
            _pad1: [0; 4],
            training_step: self.training_step.into(),
            elems: self.elems.into(),
            step_from: self.plan.step_from.into(),
            plan_held_until: self.plan_held_until.into(),
        })
    }

    pub fn parse(b: &[u8]) -> Result<Self, FrameError> {
        let w = WireControlHeader::read_from_bytes(b)
            .map_err(|_| FrameError::PayloadLength { what: "control header", expected: Self::LEN, got: b.len() })?;
        let bad = |what| FrameError::MalformedPayload { what };
        let op_kind = match w.op_kind {
            1 => OpKind::Allreduce,
            2 => OpKind::ReduceScatter,
            3 => OpKind::Allgather,
            4 => OpKind::Broadcast,
            _ => return Err(bad("unknown op kind")),
        };
        let dtype = match w.dtype {
            1 => Dtype::F32,
            2 => Dtype::Bf16,
            _ => return Err(bad("unknown dtype")),
        };
        let algorithm = algorithm_from_id(w.algorithm).ok_or(bad("unknown algorithm"))?;
        let codec = codec::from_wire_id(w.codec, w.topk_ratio.get()).ok_or(bad("unknown codec"))?;
        codec.validate().map_err(|_| bad("invalid top-k ratio"))?;
        if w.error_feedback > 1 {
            return Err(bad("error feedback flag is not 0 or 1"));
        }
        Ok(Self {
            op_kind,
            dtype,
            root: w.root.get(),
            training_step: w.training_step.get(),
            elems: w.elems.get(),
            plan: Plan {
                step_from: w.step_from.get(),
                algorithm,
                chunk_bytes: w.chunk_bytes.get(),
                channels: w.channels,
                compression: Compression { codec, error_feedback: w.error_feedback == 1 },
            },
            plan_held_until: w.plan_held_until.get(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_header_roundtrips() {
        let h = ControlHeader {
            training_step: 42,
            op_kind: OpKind::Allreduce,
            dtype: Dtype::Bf16,
            elems: 1 << 33,
            root: 3,
            plan: Plan {
                step_from: 40,
                algorithm: Algorithm::Rhd,
                chunk_bytes: 65536,
                channels: 4,
                compression: Compression { codec: CodecKind::TopK { ratio: 0.25 }, error_feedback: true },
            },
            plan_held_until: 45,
        };
        assert_eq!(ControlHeader::parse(&h.encode()), Ok(h));
        // The bytes on the wire, pinned (computed from the layout, not from this code).
        let hex: String = h.encode().iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(hex, "0102030401040000000001000000803e03000000000000002a00000000000000000000000200000028000000000000002d00000000000000");
        let mut b = h.encode();
        b[2] = 9;
        assert!(ControlHeader::parse(&b).is_err());
        assert!(ControlHeader::parse(&b[..ControlHeader::LEN - 1]).is_err());
    }

    #[test]
    fn schedule_switches_at_step_from_and_rejects_invalid_plans() {
        let base = Plan::default();
        let later = Plan { step_from: 5, algorithm: Algorithm::Tree, ..base };
        let bad = Plan { step_from: 2, channels: 9, ..base };
        let mut s = PlanSchedule::new(base, 4);
        s.set_source(Box::new(ScriptedPlans(vec![later, bad])));
        for step in 0..5 {
            assert_eq!(s.plan_for_step(step), base, "step {step}");
        }
        assert_eq!(s.plan_for_step(5), later);
        assert_eq!(s.plan_for_step(6), later);
    }

    #[test]
    fn held_plan_lasts_until_the_earliest_pending_step_from() {
        let base = Plan::default();
        let later = Plan { step_from: 5, algorithm: Algorithm::Tree, ..base };
        let mut s = PlanSchedule::new(base, 4);
        assert_eq!(s.held_until(), u64::MAX, "no source, nothing pending: the plan holds for ever");
        s.set_source(Box::new(ScriptedPlans(vec![later])));
        // Holding polls the source but activates nothing, even at a step where `later` is due.
        assert_eq!(s.hold_active(7), base);
        assert_eq!(s.held_until(), 5);
        assert_eq!(s.plan_for_step(7), later);
        assert_eq!(s.held_until(), u64::MAX);
    }

    #[test]
    fn channel_source_delivers() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut s = PlanSchedule::new(Plan::default(), 2);
        s.set_source(Box::new(rx));
        let p = Plan { step_from: 0, channels: 2, ..Plan::default() };
        tx.send(p).unwrap();
        assert_eq!(s.plan_for_step(3), p);
    }

    #[test]
    fn names_parse() {
        for a in Algorithm::ALL {
            assert_eq!(a.to_string().parse::<Algorithm>().unwrap(), a);
        }
        assert!("butterfly".parse::<Algorithm>().is_err());
    }
}
