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
//! - Plan votes (managed mode, [`PlanVoter`]): when every rank has a voter, each rank sends rank 0
//!   its [`PlanProposal`] (or an abstention) before rank 0's control header, and rank 0 applies
//!   [`agree`] to all of them: the winner takes effect from the next training step, announced by
//!   the control header like any other plan, so every rank still switches at the same collective.
//!   Rank 0 does not wait for the votes before its header: it takes them during the collective
//!   (a rank's vote is the first frame of the collective from it on channel 0) and agrees at the
//!   collective's end, and a promise its header gave is kept as for any plan polled meanwhile, so
//!   an agreed plan takes effect one collective later than if the votes came first. Before
//!   2026-11-30 rank 0 received every vote before its header: a gather on the critical path of
//!   every collective.

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

/// The initial-plan flags shared by `ringside-rank` and `ringside-ipu` (`#[command(flatten)]`):
/// the plan a job starts with, and how many connections per peer pair its mesh opens.
#[derive(clap::Args, Clone, Debug)]
pub struct PlanArgs {
    /// Allreduce algorithm (the initial plan; hints may change it): ring, tree or rhd.
    #[arg(long, default_value = "ring")]
    pub algorithm: Algorithm,
    /// Chunk (frame and pipeline unit) size in bytes.
    #[arg(long, default_value = "1MiB", value_parser = crate::job::parse_size)]
    pub chunk_bytes: usize,
    /// Parallel connections per peer pair used by the plan (TCP connections, or RDMA queue pairs).
    #[arg(long, default_value_t = 1)]
    pub channels: u8,
    /// Connections per peer pair opened at setup, so a plan change may raise --channels up to it;
    /// defaults to --channels.
    #[arg(long)]
    pub max_channels: Option<u8>,
    /// Wire compression: none, fp16, bf16, int8 or topk:RATIO.
    #[arg(long, default_value = "none")]
    pub compression: CodecKind,
    /// Carry compression residuals to the next step.
    #[arg(long)]
    pub error_feedback: bool,
}

/// Initial-plan flags that do not make a plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanArgsError {
    #[error("--chunk-bytes {0} does not fit in 32 bits; use at most {MAX_CHUNK_BYTES}")]
    ChunkTooLarge(usize),
    #[error(transparent)]
    Plan(#[from] PlanError),
}

impl PlanArgs {
    /// Connections per peer pair the mesh opens: --max-channels, at least --channels.
    pub fn max_channels(&self) -> u8 {
        self.max_channels.unwrap_or(self.channels).max(self.channels)
    }

    /// The initial plan (from step 0), checked against [`Self::max_channels`].
    pub fn plan(&self) -> Result<Plan, PlanArgsError> {
        let plan = Plan {
            step_from: 0,
            algorithm: self.algorithm,
            chunk_bytes: u32::try_from(self.chunk_bytes).map_err(|_| PlanArgsError::ChunkTooLarge(self.chunk_bytes))?,
            channels: self.channels,
            compression: Compression { codec: self.compression, error_feedback: self.error_feedback },
        };
        plan.validate(self.max_channels())?;
        Ok(plan)
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
    /// Whether both plans run collectives the same way (`step_from` aside).
    pub fn same_as(&self, other: &Plan) -> bool {
        Plan { step_from: 0, ..*self } == Plan { step_from: 0, ..*other }
    }

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

    /// Schedules `plan` from its `step_from` (as if the source had returned it); an invalid plan is
    /// logged and dropped. Returns whether it was scheduled.
    pub fn add(&mut self, plan: Plan) -> bool {
        match plan.validate(self.available_channels) {
            Ok(()) => {
                self.pending.push(plan);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, ?plan, "dropping invalid plan");
                false
            }
        }
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

/// One rank's proposal for the plan of the next steps: its local agent's latest advice, in managed
/// mode (every IPU service has an agent; see [`crate::managed`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanProposal {
    pub plan: Plan,
    /// The version of the hint behind the plan (its agent's counter; versions of different agents
    /// are not comparable, they only break ties deterministically).
    pub version: u64,
    /// How drastic the plan is ([`severity`]): the most drastic proposal wins.
    pub severity: u8,
}

/// How drastic `plan` is compared with the job's `baseline` (its initial plan): 0 if it is the
/// baseline (a "healthy" hint), else 1 + the codec's compression level (none 0, fp16 / bf16 1,
/// int8 2, top-k 3). A plan that compresses more is the more conservative answer to a network
/// fault, so it outranks one that only changes the algorithm or the chunking.
pub fn severity(plan: &Plan, baseline: &Plan) -> u8 {
    if plan.same_as(baseline) {
        return 0;
    }
    1 + match plan.compression.codec {
        CodecKind::None => 0,
        CodecKind::Fp16 | CodecKind::Bf16 => 1,
        CodecKind::Int8 => 2,
        CodecKind::TopK { .. } => 3,
    }
}

/// The agreement rule of plan votes: among the ranks' proposals (`None` = abstain: no advice, or
/// an agent that cannot be reached), the one with the highest `(severity, version)`, ties to the
/// lowest rank; `None` when every rank abstains (the plan in force stays). Deterministic: the
/// same proposals give the same winner whatever order they arrived in.
pub fn agree(proposals: &[Option<PlanProposal>]) -> Option<(usize, PlanProposal)> {
    let mut best: Option<(usize, PlanProposal)> = None;
    for (rank, p) in proposals.iter().enumerate() {
        let Some(p) = p else { continue };
        if best.is_none_or(|(_, b)| (p.severity, p.version) > (b.severity, b.version)) {
            best = Some((rank, *p));
        }
    }
    best
}

/// Where a rank's proposal comes from, in managed mode. Polled by every rank once per collective,
/// before the control exchange; must not block (a slow or unreachable agent means abstaining).
pub trait PlanVoter: Send {
    /// This rank's proposal at training step `step`, or `None` to abstain.
    fn propose(&mut self, step: u64) -> Option<PlanProposal>;
    /// Rank 0 only: whether another rank's proposal may run here (the tenant's constraints as
    /// this rank knows them). A proposal that may not is treated as an abstention.
    fn admits(&mut self, _plan: &Plan) -> bool {
        true
    }
}

/// A rank's vote as it travels to rank 0 in a [`crate::wire::FrameKind::Control`] frame: a
/// [`ControlHeader`] (this rank's call, and the proposed plan) followed by the hint version (u64
/// LE), the severity, and 1 if a plan is proposed (0 = abstain; then the plan bytes are
/// meaningless), padded with zeros to [`VOTE_LEN`] bytes.
pub const VOTE_LEN: usize = ControlHeader::LEN + 16;

/// Encodes this rank's vote (`call` describes the collective; its plan is replaced by the
/// proposal's).
pub fn encode_vote(call: &ControlHeader, proposal: Option<&PlanProposal>) -> [u8; VOTE_LEN] {
    let mut out = [0u8; VOTE_LEN];
    let h = ControlHeader { plan: proposal.map_or(call.plan, |p| p.plan), ..*call };
    out[..ControlHeader::LEN].copy_from_slice(&h.encode());
    if let Some(p) = proposal {
        out[ControlHeader::LEN..ControlHeader::LEN + 8].copy_from_slice(&p.version.to_le_bytes());
        out[ControlHeader::LEN + 8] = p.severity;
        out[ControlHeader::LEN + 9] = 1;
    }
    out
}

/// Parses a vote: the sender's call and its proposal.
pub fn parse_vote(b: &[u8]) -> Result<(ControlHeader, Option<PlanProposal>), FrameError> {
    if b.len() != VOTE_LEN {
        return Err(FrameError::PayloadLength { what: "plan vote", expected: VOTE_LEN, got: b.len() });
    }
    let h = ControlHeader::parse(&b[..ControlHeader::LEN])?;
    let version = u64::from_le_bytes(b[ControlHeader::LEN..ControlHeader::LEN + 8].try_into().expect("8 bytes"));
    let proposal = match b[ControlHeader::LEN + 9] {
        0 => None,
        1 => Some(PlanProposal { plan: h.plan, version, severity: b[ControlHeader::LEN + 8] }),
        _ => return Err(FrameError::MalformedPayload { what: "plan vote flag is not 0 or 1" }),
    };
    Ok((h, proposal))
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

    fn proposal(codec: CodecKind, version: u64) -> PlanProposal {
        let plan = Plan { step_from: 0, compression: Compression { codec, error_feedback: true }, ..Plan::default() };
        PlanProposal { plan, version, severity: severity(&plan, &Plan::default()) }
    }

    #[test]
    fn severity_ranks_plans_by_how_much_they_compress() {
        let base = Plan::default();
        assert_eq!(severity(&Plan { step_from: 9, ..base }, &base), 0, "the baseline from a later step is still the baseline");
        assert_eq!(severity(&Plan { algorithm: Algorithm::Tree, ..base }, &base), 1);
        let sev = |codec| proposal(codec, 1).severity;
        assert_eq!([sev(CodecKind::Fp16), sev(CodecKind::Bf16), sev(CodecKind::Int8), sev(CodecKind::TopK { ratio: 0.1 })], [2, 2, 3, 4]);
    }

    #[test]
    fn agreement_takes_the_most_severe_proposal_and_abstentions_keep_the_plan() {
        assert_eq!(agree(&[None, None, None, None]), None, "every rank abstains: the plan in force stays");
        assert_eq!(agree(&[]), None);
        // A fault only rank 2's agent sees: its compressing proposal beats the others' baseline.
        let base = PlanProposal { plan: Plan::default(), version: 1, severity: 0 };
        let int8 = proposal(CodecKind::Int8, 2);
        assert_eq!(agree(&[Some(base), Some(base), Some(int8), Some(base)]), Some((2, int8)));
        // A rank that abstains (agent unreachable) does not block the others.
        assert_eq!(agree(&[None, Some(int8), None, None]), Some((1, int8)));
        // Severity first, then version, then the lowest rank.
        let fp16_v9 = proposal(CodecKind::Fp16, 9);
        assert_eq!(agree(&[Some(fp16_v9), Some(int8)]), Some((1, int8)));
        let int8_v3 = proposal(CodecKind::Int8, 3);
        assert_eq!(agree(&[Some(int8), Some(int8_v3)]), Some((1, int8_v3)));
        assert_eq!(agree(&[Some(base), Some(int8_v3), Some(int8_v3)]), Some((1, int8_v3)));
        // Fault cleared: the agent that saw it proposes the baseline again (a newer version); the
        // others still propose their first baseline hint: the result is the baseline.
        let back = PlanProposal { version: 3, ..base };
        assert!(agree(&[Some(base), Some(base), Some(back), Some(base)]).unwrap().1.plan.same_as(&Plan::default()));
        // Order-independent: every permutation of the same proposals picks the same plan.
        let set = [Some(base), None, Some(fp16_v9), Some(int8), Some(int8_v3)];
        let want = agree(&set).unwrap().1;
        let mut perm = set;
        for i in 0..perm.len() {
            perm.rotate_left(1);
            assert_eq!(agree(&perm).unwrap().1, want, "rotation {i}");
        }
    }

    #[test]
    fn votes_round_trip() {
        let call = ControlHeader { training_step: 7, op_kind: OpKind::Allreduce, dtype: Dtype::F32, elems: 1000, root: 0, plan: Plan::default(), plan_held_until: 0 };
        let p = PlanProposal { version: u64::MAX - 1, ..proposal(CodecKind::TopK { ratio: 0.25 }, 0) };
        let (h, got) = parse_vote(&encode_vote(&call, Some(&p))).unwrap();
        assert_eq!((h.training_step, h.elems, got), (7, 1000, Some(p)));
        let (h, got) = parse_vote(&encode_vote(&call, None)).unwrap();
        assert_eq!((h, got), (call, None));
        let mut b = encode_vote(&call, Some(&p));
        b[ControlHeader::LEN + 9] = 2;
        assert!(parse_vote(&b).is_err());
        assert!(parse_vote(&b[..VOTE_LEN - 1]).is_err());
    }

    #[test]
    fn plan_args_make_the_initial_plan() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            plan: PlanArgs,
        }
        let a = Cli::parse_from(["x"]).plan;
        assert_eq!((a.plan().unwrap(), a.max_channels()), (Plan::default(), 1));
        let a = Cli::parse_from(["x", "--algorithm", "rhd", "--chunk-bytes", "64KiB", "--channels", "2", "--max-channels", "4", "--compression", "topk:0.5", "--error-feedback"]).plan;
        let want = Plan { step_from: 0, algorithm: Algorithm::Rhd, chunk_bytes: 65536, channels: 2, compression: Compression { codec: CodecKind::TopK { ratio: 0.5 }, error_feedback: true } };
        assert_eq!((a.plan().unwrap(), a.max_channels()), (want, 4));
        // --max-channels below --channels opens --channels.
        assert_eq!(Cli::parse_from(["x", "--channels", "3", "--max-channels", "1"]).plan.max_channels(), 3);
        assert!(matches!(Cli::parse_from(["x", "--chunk-bytes", "2"]).plan.plan(), Err(PlanArgsError::Plan(PlanError::ChunkBytes { .. }))));
    }

    #[test]
    fn names_parse() {
        for a in Algorithm::ALL {
            assert_eq!(a.to_string().parse::<Algorithm>().unwrap(), a);
        }
        assert!("butterfly".parse::<Algorithm>().is_err());
    }
}
