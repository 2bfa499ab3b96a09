//! Managed collectives: the tenant hands its buffer and an operation to the IPU over the host ↔
//! IPU link (the stand-in for PCIe), and the IPU services of all ranks run the collective among
//! themselves with the engine ([`crate::Communicator`]). Plans come from the agents' hints and
//! are applied inline: the tenant never sees a hint. `ringside-ipu` is the service;
//! `ringside-rank --managed` is a tenant.
//!
//! Every IPU steers: each service follows its own IPU's agent ([`HintVoter`]: the agent's latest
//! hint for the job, as a [`PlanProposal`]) and votes with it in every collective's control
//! exchange (the engine's plan votes, [`crate::Communicator::set_plan_voter`]). Rank 0 applies
//! [`crate::plan::agree`] (the most severe proposal: the most compressive, then the newest) and
//! announces the winner from the next step (or the collective after, when its header had already
//! promised the next one's plan), so every rank switches at the same collective. A
//! service without an agent, or whose agent stayed unreachable, abstains (the plan in force
//! stays unless another service proposes one): a fault any one IPU sees changes the plan.
//!
//! The host link protocol (TCP on the link's address; one request, one reply, in order):
//!
//! ```text
//! header (HEADER_LEN = 40 bytes, little endian)
//!   0..4   magic "RSM1"          4  version (1)     5  kind (1 request, 2 reply, 3 error)
//!   6      op (1 allreduce, 2 broadcast, 3 allgather)        7  dtype (0 f32, 1 bf16)
//!   8..12  arg: request: broadcast root; reply: report length; error: ErrorCode
//!   12..16 reserved, 0
//!   16..24 elems   24..32 step (the tenant's training step)   32..40 payload length
//! request payload: the buffer (elems × dtype size bytes, little endian)
//! reply payload:   report (JSON [`ManagedReport`], `arg` bytes), then the result buffer
//! error payload:   a UTF-8 message (at most MAX_ERROR_MESSAGE bytes)
//! ```
//!
//! Invariants:
//! - Every request is validated before its payload is read: a bad header, an unsupported op or
//!   dtype, a payload length that does not match `elems`, or a buffer above the service's limit is
//!   answered with an error frame (counted in [`ServiceStats`]) and the connection is closed (the
//!   framing cannot be trusted after it). Nothing malformed reaches the engine.
//! - One tenant session at a time (one rank per IPU); a second connection gets a `Busy` error
//!   frame and is closed.
//! - Every read and write on the host link is bounded by the session's timeout.
//! - A plan is applied only if it lies within the tenant's constraints: a hint outside them is
//!   refused by the service that received it (never proposed), a proposal outside rank 0's copy of
//!   the constraints counts as an abstention; both are logged and counted, and the plan in force
//!   stays. The agent already clamps hints to the constraints; this is the check at the point of
//!   use.
//! - A failed collective poisons the communicator (the engine's rule): the tenant gets an error
//!   frame for that request and for every later one.
//!
//! Transport advice ([`ringside_client::Hint::tcp_rto_min_ms`]) is not voted on: it only sets how
//! long this service's own TCP waits before it retransmits, which no other service needs to agree
//! with. `ringside-ipu` gives its hint follower a [`crate::TcpRtoFloor`] when the tenant's
//! constraints allow transport advice (`transport_tuning`) and registers the mesh's connections
//! with it ([`crate::TcpTransport::set_rto_floor`]); the follower's thread applies each change as
//! the hint arrives, whatever becomes of the hint's plan in the vote.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringside_client::Constraints;
use serde::{Deserialize, Serialize};

use crate::codec::Bf16;
use crate::engine::{Communicator, OpReport};
use crate::error::CollectiveError;
use crate::hints::HintFollower;
use crate::plan::{severity, Dtype, Plan, PlanProposal, PlanSource, PlanVoter};
use crate::transport::Transport;
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// "RSM1", little endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"RSM1");
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 40;
/// Longest error message a frame carries.
pub const MAX_ERROR_MESSAGE: usize = 4096;
/// Longest reply report a tenant accepts.
pub const MAX_REPORT: usize = 64 << 10;
/// Default largest buffer the service accepts (`ringside-ipu --max-buffer`).
pub const DEFAULT_MAX_BUFFER: u64 = 256 << 20;

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Request = 1,
    Reply = 2,
    Error = 3,
}

/// The collectives a tenant can ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Op {
    Allreduce = 1,
    /// f32 only; `arg` is the root rank.
    Broadcast = 2,
    /// f32 only; rank r contributes `segment(elems, world, r)`.
    Allgather = 3,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        [Op::Allreduce, Op::Broadcast, Op::Allgather].into_iter().find(|o| *o as u8 == v)
    }
}

fn dtype_id(d: Dtype) -> u8 {
    match d {
        Dtype::F32 => 0,
        Dtype::Bf16 => 1,
    }
}

fn dtype_from_id(v: u8) -> Option<Dtype> {
    match v {
        0 => Some(Dtype::F32),
        1 => Some(Dtype::Bf16),
        _ => None,
    }
}

/// Why a request was refused, carried in an error frame's `arg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u32)]
pub enum ErrorCode {
    /// Magic, version, kind or reserved bytes wrong: not a managed-collective request.
    Malformed = 1,
    UnsupportedOp = 2,
    UnsupportedDtype = 3,
    /// Payload length is not `elems × dtype size`, or a broadcast root is not a rank.
    BadLength = 4,
    /// Buffer above the service's `--max-buffer`.
    TooLarge = 5,
    /// Another tenant session is active on this IPU.
    Busy = 6,
    /// The collective among the IPU services failed (a peer died, a timeout).
    CollectiveFailed = 7,
    /// The tenant stalled mid-request or stayed idle past the session timeout.
    Timeout = 8,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 8] = [
        ErrorCode::Malformed,
        ErrorCode::UnsupportedOp,
        ErrorCode::UnsupportedDtype,
        ErrorCode::BadLength,
        ErrorCode::TooLarge,
        ErrorCode::Busy,
        ErrorCode::CollectiveFailed,
        ErrorCode::Timeout,
    ];

    fn from_u32(v: u32) -> Option<ErrorCode> {
        Self::ALL.into_iter().find(|c| *c as u32 == v)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::UnsupportedOp => "unsupported_op",
            ErrorCode::UnsupportedDtype => "unsupported_dtype",
            ErrorCode::BadLength => "bad_length",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Busy => "busy",
            ErrorCode::CollectiveFailed => "collective_failed",
            ErrorCode::Timeout => "timeout",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A frame header (all kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub op: u8,
    pub dtype: u8,
    pub arg: u32,
    pub elems: u64,
    pub step: u64,
    pub payload_len: u64,
}

/// A header that is not one of ours.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("bad magic {got:#010x}: the peer does not speak the managed-collective protocol (is this ringside-ipu's --listen address?)")]
    Magic { got: u32 },
    #[error("protocol version {got}, this build speaks {VERSION}: run matching ringside-ipu and ringside-rank builds")]
    Version { got: u8 },
    #[error("unknown frame kind {got}")]
    Kind { got: u8 },
    #[error("reserved header bytes are not zero")]
    Reserved,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = VERSION;
        b[5] = self.kind as u8;
        b[6] = self.op;
        b[7] = self.dtype;
        b[8..12].copy_from_slice(&self.arg.to_le_bytes());
        b[16..24].copy_from_slice(&self.elems.to_le_bytes());
        b[24..32].copy_from_slice(&self.step.to_le_bytes());
        b[32..40].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    pub fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, HeaderError> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if u32_at(0) != MAGIC {
            return Err(HeaderError::Magic { got: u32_at(0) });
        }
        if b[4] != VERSION {
            return Err(HeaderError::Version { got: b[4] });
        }
        let kind = match b[5] {
            1 => Kind::Request,
            2 => Kind::Reply,
            3 => Kind::Error,
            got => return Err(HeaderError::Kind { got }),
        };
        if u32_at(12) != 0 {
            return Err(HeaderError::Reserved);
        }
        Ok(Header { kind, op: b[6], dtype: b[7], arg: u32_at(8), elems: u64_at(16), step: u64_at(24), payload_len: u64_at(32) })
    }
}

/// A request that passed every check: what to run and how many payload bytes follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub dtype: Dtype,
    pub root: usize,
    pub elems: usize,
    pub step: u64,
}

impl Request {
    pub fn payload_len(&self) -> usize {
        self.elems * self.dtype.size()
    }
}

/// A refused request: the code and message the tenant gets back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl Refusal {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Refusal { code, message: message.into() }
    }
}

/// Checks a request header against the protocol and the service's limits (`world` for a
/// broadcast root, `max_buffer` in bytes). Pure: the T0 tests drive it with crafted headers.
pub fn validate_request(b: &[u8; HEADER_LEN], world: usize, max_buffer: u64) -> Result<Request, Refusal> {
    let h = Header::parse(b).map_err(|e| Refusal::new(ErrorCode::Malformed, e.to_string()))?;
    if h.kind != Kind::Request {
        return Err(Refusal::new(ErrorCode::Malformed, format!("expected a request frame, got {:?}", h.kind)));
    }
    let op = Op::from_u8(h.op).ok_or_else(|| Refusal::new(ErrorCode::UnsupportedOp, format!("unknown op {}: use 1 allreduce, 2 broadcast or 3 allgather", h.op)))?;
    let dtype = dtype_from_id(h.dtype).ok_or_else(|| Refusal::new(ErrorCode::UnsupportedDtype, format!("unknown dtype {}: use 0 f32 or 1 bf16", h.dtype)))?;
    if dtype == Dtype::Bf16 && op != Op::Allreduce {
        return Err(Refusal::new(ErrorCode::UnsupportedDtype, format!("{op:?} supports f32 only; bf16 is for allreduce")));
    }
    let expected = h.elems.checked_mul(dtype.size() as u64);
    if expected != Some(h.payload_len) {
        return Err(Refusal::new(
            ErrorCode::BadLength,
            format!("payload length {} does not match {} elements of {} bytes", h.payload_len, h.elems, dtype.size()),
        ));
    }
    if h.payload_len > max_buffer {
        return Err(Refusal::new(
            ErrorCode::TooLarge,
            format!("buffer of {} bytes is above this IPU's limit of {max_buffer} bytes; split the buffer or ask the provider to raise --max-buffer", h.payload_len),
        ));
    }
    let root = h.arg as usize;
    if op == Op::Broadcast && root >= world {
        return Err(Refusal::new(ErrorCode::BadLength, format!("broadcast root {root} is not a rank of this job (world {world})")));
    }
    let elems = usize::try_from(h.elems).map_err(|_| Refusal::new(ErrorCode::TooLarge, "element count does not fit this machine"))?;
    Ok(Request { op, dtype, root, elems, step: h.step })
}

/// What the service tells the tenant about one collective.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManagedReport {
    /// The service's collective count (0-based).
    pub op: u64,
    /// The plan the collective ran with (rank 0's announcement).
    pub plan: Plan,
    /// Rank 0's service: the rank whose agent's hint won the vote for this plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_rank: Option<usize>,
    /// Bytes this IPU put on the fabric for it.
    pub bytes_sent: u64,
    /// Time inside the engine, ms (the tenant's round trip adds the host link).
    pub service_ms: f64,
    /// Rank 0's service: the version of that hint (of its agent's counter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint_version: Option<u64>,
}

/// What the service counted since it started.
#[derive(Debug, Default)]
pub struct ServiceStats {
    pub sessions: AtomicU64,
    pub requests: AtomicU64,
    /// Error frames sent, indexed by `ErrorCode as usize - 1`.
    pub errors: [AtomicU64; ErrorCode::ALL.len()],
    /// Hints refused because their plan is outside the tenant's constraints.
    pub plans_refused: AtomicU64,
}

impl ServiceStats {
    pub fn errors(&self, code: ErrorCode) -> u64 {
        self.errors[code as usize - 1].load(Ordering::Relaxed)
    }
    fn count_error(&self, code: ErrorCode) {
        self.errors[code as usize - 1].fetch_add(1, Ordering::Relaxed);
    }
    /// One JSON object, for the log line at exit.
    pub fn to_json(&self) -> serde_json::Value {
        let mut errors = serde_json::Map::new();
        for c in ErrorCode::ALL {
            errors.insert(c.as_str().into(), self.errors(c).into());
        }
        serde_json::json!({
            "sessions": self.sessions.load(Ordering::Relaxed),
            "requests": self.requests.load(Ordering::Relaxed),
            "errors": errors,
            "plans_refused": self.plans_refused.load(Ordering::Relaxed),
        })
    }
}

/// Why a plan is outside the tenant's constraints.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConstraintViolation {
    #[error("algorithm {0} is not in the tenant's constraints.algorithms")]
    Algorithm(String),
    #[error("codec {0} is not allowed by the tenant's constraints.codecs / min_topk_ratio")]
    Codec(String),
    #[error("{got} channels exceed the tenant's constraints.max_channels {max}")]
    Channels { got: u8, max: u8 },
    #[error("error feedback is off in the tenant's constraints")]
    ErrorFeedback,
}

/// Whether `plan` lies within `c`: algorithm and codec allowed, channels at most `max_channels`,
/// error feedback only when allowed (for a lossless plan the flag does nothing and is accepted).
pub fn check_plan(plan: &Plan, c: &Constraints) -> Result<(), ConstraintViolation> {
    if !c.allows_algorithm(plan.algorithm) {
        return Err(ConstraintViolation::Algorithm(plan.algorithm.to_string()));
    }
    if !c.allows_codec(plan.compression.codec) {
        return Err(ConstraintViolation::Codec(plan.compression.codec.to_string()));
    }
    if plan.channels > c.max_channels {
        return Err(ConstraintViolation::Channels { got: plan.channels, max: c.max_channels });
    }
    if plan.compression.error_feedback && !c.error_feedback && plan.compression.codec != crate::CodecKind::None {
        return Err(ConstraintViolation::ErrorFeedback);
    }
    Ok(())
}

/// A [`PlanSource`] that passes on only the plans within the tenant's constraints; the others are
/// logged and counted in `refused`, and the plan in force stays.
pub struct ConstrainedPlans {
    pub inner: Box<dyn PlanSource>,
    pub constraints: Constraints,
    pub refused: Arc<ServiceStats>,
}

impl PlanSource for ConstrainedPlans {
    fn poll(&mut self, step: u64) -> Vec<Plan> {
        let mut plans = self.inner.poll(step);
        plans.retain(|p| match check_plan(p, &self.constraints) {
            Ok(()) => true,
            Err(e) => {
                self.refused.plans_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, plan = ?p, "refusing a plan outside the tenant's constraints; the plan in force stays");
                false
            }
        });
        plans
    }
}

/// A service's vote (a [`PlanVoter`]): its local agent's latest hint for the job, as a plan within
/// the tenant's constraints, ranked by [`severity`] against the job's initial plan.
///
/// - A hint outside the constraints is refused (logged, counted in `plans_refused`) and the
///   previous proposal stands.
/// - Fail open: without an agent, before the first hint, and after the follower gave up on the
///   agent, the service abstains; `propose` never blocks (the follower's thread does the waiting).
/// - On rank 0, another service's proposal outside `constraints` counts as an abstention (with or
///   without an agent of its own); without constraints every proposal is admitted.
pub struct HintVoter {
    follower: Option<HintFollower>,
    constraints: Option<Constraints>,
    baseline: Plan,
    stats: Arc<ServiceStats>,
    latest: Option<PlanProposal>,
    gave_up_logged: bool,
}

impl HintVoter {
    /// Follows `follower` (its hints checked against `constraints`); `baseline` is the job's
    /// initial plan (the same on every service).
    pub fn new(follower: HintFollower, constraints: Constraints, baseline: Plan, stats: Arc<ServiceStats>) -> Self {
        HintVoter { follower: Some(follower), constraints: Some(constraints), baseline, stats, latest: None, gave_up_logged: false }
    }

    /// A service without an agent: always abstains; on rank 0 it still checks the others'
    /// proposals against `constraints`, if given.
    pub fn abstaining(constraints: Option<Constraints>, baseline: Plan, stats: Arc<ServiceStats>) -> Self {
        HintVoter { follower: None, constraints, baseline, stats, latest: None, gave_up_logged: false }
    }

    fn check(&self, plan: &Plan) -> Result<(), ConstraintViolation> {
        self.constraints.as_ref().map_or(Ok(()), |c| check_plan(plan, c))
    }
}

impl PlanVoter for HintVoter {
    fn propose(&mut self, step: u64) -> Option<PlanProposal> {
        let follower = self.follower.as_mut()?;
        let hints = follower.poll_hints(step);
        let gave_up = follower.gave_up();
        for h in hints {
            match self.check(&h.plan) {
                Ok(()) => {
                    let severity = severity(&h.plan, &self.baseline);
                    tracing::info!(version = h.version, severity, plan = ?h.plan, "proposing the local agent's hint");
                    self.latest = Some(PlanProposal { plan: h.plan, version: h.version, severity });
                }
                Err(e) => {
                    self.stats.plans_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, version = h.version, plan = ?h.plan, "refusing a hint outside the tenant's constraints; the previous proposal stands");
                }
            }
        }
        if gave_up {
            if !std::mem::replace(&mut self.gave_up_logged, true) {
                tracing::warn!("the local agent stayed unreachable; this service abstains from plan votes (the other IPUs' agents still steer)");
            }
            return None;
        }
        self.latest
    }

    fn admits(&mut self, plan: &Plan) -> bool {
        match self.check(plan) {
            Ok(()) => true,
            Err(e) => {
                self.stats.plans_refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, ?plan, "refusing another service's proposal outside the tenant's constraints");
                false
            }
        }
    }
}

/// Session settings of the service.
#[derive(Clone, Copy, Debug)]
pub struct ServiceConfig {
    /// Largest buffer accepted, bytes.
    pub max_buffer: u64,
    /// Bound on every read and write on the host link, and on the idle time between requests.
    pub tenant_timeout: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig { max_buffer: DEFAULT_MAX_BUFFER, tenant_timeout: Duration::from_secs(60) }
    }
}

fn write_error(s: &mut impl Write, code: ErrorCode, message: &str) -> std::io::Result<()> {
    let mut m = message.as_bytes();
    if m.len() > MAX_ERROR_MESSAGE {
        m = &m[..MAX_ERROR_MESSAGE];
    }
    let h = Header { kind: Kind::Error, op: 0, dtype: 0, arg: code as u32, elems: 0, step: 0, payload_len: m.len() as u64 };
    s.write_all(&h.encode())?;
    s.write_all(m)?;
    s.flush()
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream before the first byte.
fn read_frame_start(s: &mut impl Read, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The engine side of a session: runs one validated request on the buffer. Implemented by the
/// service over a [`Communicator`]; the T0 tests use a local stand-in to drive the framing.
pub trait CollectiveRunner {
    fn run(&mut self, req: &Request, buf: &mut Buffer) -> Result<ManagedReport, CollectiveError>;
}

/// The request's buffer: the payload is read straight into it and the result written straight
/// from it ([`WireElem`]).
pub enum Buffer {
    F32(Vec<f32>),
    Bf16(Vec<Bf16>),
}

impl Buffer {
    /// A buffer of `elems` elements of `dtype`, reusing `spare`'s allocations (the service keeps
    /// one per dtype across requests, so a step's buffer is not faulted in afresh).
    fn take(dtype: Dtype, elems: usize, spare: &mut (Vec<f32>, Vec<Bf16>)) -> Buffer {
        match dtype {
            Dtype::F32 => {
                let mut v = std::mem::take(&mut spare.0);
                v.resize(elems, 0.0);
                Buffer::F32(v)
            }
            Dtype::Bf16 => {
                let mut v = std::mem::take(&mut spare.1);
                v.resize(elems, Bf16::default());
                Buffer::Bf16(v)
            }
        }
    }
    /// Gives the allocation back to `spare`.
    fn give_back(self, spare: &mut (Vec<f32>, Vec<Bf16>)) {
        match self {
            Buffer::F32(v) => spare.0 = v,
            Buffer::Bf16(v) => spare.1 = v,
        }
    }
    fn as_mut_bytes(&mut self) -> &mut [u8] {
        match self {
            Buffer::F32(v) => v.as_mut_bytes(),
            Buffer::Bf16(v) => v.as_mut_bytes(),
        }
    }
    fn as_bytes(&self) -> &[u8] {
        match self {
            Buffer::F32(v) => v.as_bytes(),
            Buffer::Bf16(v) => v.as_bytes(),
        }
    }
    /// Little endian ↔ native, in place (nothing on little-endian targets).
    fn swap_le(&mut self) {
        match self {
            Buffer::F32(v) => f32::swap_le(v),
            Buffer::Bf16(v) => Bf16::swap_le(v),
        }
    }
}

/// An element type whose buffers cross the host link as their own memory: the protocol is little
/// endian, which is the memory order of every target ringside ships (x86_64, aarch64), so a
/// buffer is written from and read into in place, without a conversion pass or a staging copy (the
/// host link stands in for DMA). On a big-endian target each element is byte-swapped in place
/// before sending and after receiving.
pub trait WireElem: IntoBytes + FromBytes + Immutable + Copy {
    fn swap_le(v: &mut [Self]);
}

impl WireElem for f32 {
    fn swap_le(v: &mut [f32]) {
        if cfg!(target_endian = "big") {
            v.iter_mut().for_each(|x| *x = f32::from_bits(x.to_bits().swap_bytes()));
        }
    }
}

impl WireElem for Bf16 {
    fn swap_le(v: &mut [Bf16]) {
        if cfg!(target_endian = "big") {
            v.iter_mut().for_each(|x| x.0 = x.0.swap_bytes());
        }
    }
}

/// [`CollectiveRunner`] over the engine; on rank 0 each report names the vote behind its plan.
pub struct EngineRunner<T: Transport> {
    pub comm: Communicator<T>,
    /// Tells this IPU's agent which plan each collective ran (the agreed one), if following one.
    pub reporter: Option<crate::PlanReporter>,
}

impl<T: Transport> CollectiveRunner for EngineRunner<T> {
    fn run(&mut self, req: &Request, buf: &mut Buffer) -> Result<ManagedReport, CollectiveError> {
        let t0 = Instant::now();
        self.comm.begin_step(req.step);
        let rep: OpReport = match (req.op, buf) {
            (Op::Allreduce, Buffer::F32(b)) => self.comm.allreduce_f32(b)?,
            (Op::Allreduce, Buffer::Bf16(b)) => self.comm.allreduce_bf16(b)?,
            (Op::Broadcast, Buffer::F32(b)) => self.comm.broadcast_f32(b, req.root)?,
            (Op::Allgather, Buffer::F32(b)) => self.comm.allgather_f32(b)?,
            // validate_request admits bf16 for allreduce only.
            (op, _) => return Err(CollectiveError::InvalidArgument { name: "dtype", reason: format!("{op:?} supports f32 only") }),
        };
        let origin = self.comm.plan_origin(&rep.plan);
        if let Some(r) = &self.reporter {
            r.ran(&rep.plan, req.step);
        }
        Ok(ManagedReport {
            op: rep.op,
            plan: rep.plan,
            bytes_sent: rep.bytes_sent,
            service_ms: t0.elapsed().as_secs_f64() * 1e3,
            hint_rank: origin.map(|o| o.rank),
            hint_version: origin.map(|o| o.version),
        })
    }
}

/// How a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionEnd {
    /// The tenant closed the connection between requests.
    Closed,
    /// A request was refused (error frame sent, connection closed).
    Refused(ErrorCode),
    /// The host link failed (no frame could be sent).
    LinkFailed,
}

/// Serves one tenant connection until it closes or a request is refused.
pub fn serve_session<R: CollectiveRunner>(stream: &mut TcpStream, runner: &mut R, world: usize, cfg: &ServiceConfig, stats: &ServiceStats) -> SessionEnd {
    // Bounded reads and writes; Nagle off so the small header of a reply is not held back.
    let _ = stream.set_read_timeout(Some(cfg.tenant_timeout));
    let _ = stream.set_write_timeout(Some(cfg.tenant_timeout));
    let _ = stream.set_nodelay(true);
    serve_stream(stream, runner, world, cfg, stats)
}

/// [`serve_session`] over any byte stream (timeouts are the caller's).
pub fn serve_stream<S: Read + Write, R: CollectiveRunner>(s: &mut S, runner: &mut R, world: usize, cfg: &ServiceConfig, stats: &ServiceStats) -> SessionEnd {
    let mut spare = (Vec::new(), Vec::new());
    let mut out = Vec::new();
    loop {
        let mut hb = [0u8; HEADER_LEN];
        let refuse = |s: &mut S, code: ErrorCode, message: String| {
            stats.count_error(code);
            tracing::warn!(code = %code, %message, "refusing a tenant request");
            match write_error(s, code, &message) {
                Ok(()) => SessionEnd::Refused(code),
                Err(_) => SessionEnd::LinkFailed,
            }
        };
        match read_frame_start(s, &mut hb) {
            Ok(true) => {}
            Ok(false) => return SessionEnd::Closed,
            Err(e) if is_timeout(&e) => return refuse(s, ErrorCode::Timeout, format!("no complete request header within {} ms", cfg.tenant_timeout.as_millis())),
            Err(_) => return SessionEnd::LinkFailed,
        }
        let req = match validate_request(&hb, world, cfg.max_buffer) {
            Ok(r) => r,
            Err(r) => return refuse(s, r.code, r.message),
        };
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let mut buf = Buffer::take(req.dtype, req.elems, &mut spare);
        match s.read_exact(buf.as_mut_bytes()) {
            Ok(()) => {}
            Err(e) if is_timeout(&e) => return refuse(s, ErrorCode::Timeout, format!("request payload incomplete after {} ms", cfg.tenant_timeout.as_millis())),
            Err(_) => return SessionEnd::LinkFailed,
        }
        buf.swap_le();
        let report = match runner.run(&req, &mut buf) {
            Ok(r) => r,
            Err(e) => return refuse(s, ErrorCode::CollectiveFailed, format!("the collective among the IPU services failed: {e}")),
        };
        let json = serde_json::to_vec(&report).expect("report serialises");
        out.clear();
        let h = Header {
            kind: Kind::Reply,
            op: req.op as u8,
            dtype: dtype_id(req.dtype),
            arg: json.len() as u32,
            elems: req.elems as u64,
            step: req.step,
            payload_len: (json.len() + req.payload_len()) as u64,
        };
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(&json);
        buf.swap_le();
        if s.write_all(&out).and_then(|()| s.write_all(buf.as_bytes())).and_then(|()| s.flush()).is_err() {
            return SessionEnd::LinkFailed;
        }
        buf.give_back(&mut spare);
    }
}

/// Most bytes [`close_gracefully`] reads and discards.
const DRAIN_BYTES: usize = 1 << 20;
/// Longest [`close_gracefully`] waits for them.
const DRAIN_TIME: Duration = Duration::from_millis(200);

/// Closes after an error frame without resetting it away: closing a socket with unread request
/// bytes makes the kernel send a RST, which can reach the tenant before it read the error frame.
/// So: end our side, then read and discard what the tenant still sends (bounded in bytes and
/// time), then close.
fn close_gracefully(stream: &mut TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(DRAIN_TIME));
    let deadline = Instant::now() + DRAIN_TIME;
    let mut sink = [0u8; 16 << 10];
    let mut drained = 0;
    while drained < DRAIN_BYTES && Instant::now() < deadline {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// How long a new tenant connection waits for the current session to end before it is refused
/// as `Busy`.
pub const BUSY_GRACE: Duration = Duration::from_millis(500);

/// The service: accepts tenant connections on the host link and hands one at a time to the
/// session thread that owns the runner. Returns when the listener fails or `stop` is set.
pub fn serve<R: CollectiveRunner + Send + 'static>(listener: TcpListener, runner: R, world: usize, cfg: ServiceConfig, stats: Arc<ServiceStats>, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    let busy = Arc::new(AtomicBool::new(false));
    let (tx, rx): (SyncSender<TcpStream>, Receiver<TcpStream>) = std::sync::mpsc::sync_channel(1);
    let runner = Arc::new(Mutex::new(runner));
    {
        let (busy, stats, runner) = (busy.clone(), stats.clone(), runner.clone());
        std::thread::Builder::new().name("tenant-session".into()).spawn(move || {
            for mut stream in rx {
                let peer = stream.peer_addr().ok();
                stats.sessions.fetch_add(1, Ordering::Relaxed);
                tracing::info!(?peer, "tenant session started");
                let mut r = runner.lock().unwrap_or_else(|p| p.into_inner());
                let end = serve_session(&mut stream, &mut *r, world, &cfg, &stats);
                drop(r);
                close_gracefully(&mut stream);
                tracing::info!(?peer, ?end, stats = %stats.to_json(), "tenant session ended");
                busy.store(false, Ordering::Release);
            }
        })?;
    }
    listener.set_nonblocking(true)?;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut stream, peer)) => {
                stream.set_nonblocking(false)?;
                // A session that is ending (its tenant closed, the session thread has not yet
                // seen EOF) must not make the next tenant fail: a rank that restarts, or a
                // reachability probe accepted from the backlog just before the rank's own
                // connection, ends within microseconds. Wait up to BUSY_GRACE before refusing.
                let grace_end = std::time::Instant::now() + BUSY_GRACE;
                while busy.load(Ordering::Acquire) && std::time::Instant::now() < grace_end {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if busy.swap(true, Ordering::AcqRel) {
                    stats.count_error(ErrorCode::Busy);
                    tracing::warn!(%peer, "refusing a second tenant session");
                    let _ = stream.set_write_timeout(Some(cfg.tenant_timeout));
                    let _ = write_error(&mut stream, ErrorCode::Busy, "another tenant session is active on this IPU; one rank per IPU");
                    close_gracefully(&mut stream);
                    continue;
                }
                if tx.send(stream).is_err() {
                    return Err(std::io::Error::other("the session thread ended"));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What a tenant's call can fail with.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ManagedError {
    #[error("cannot reach ringside-ipu at {addr}: {source}; is the service running in this host's IPU and is --managed its --listen address?")]
    Connect { addr: SocketAddr, source: Arc<std::io::Error> },
    #[error("host link to ringside-ipu failed: {0}; the service stopped or the link went down")]
    Io(Arc<std::io::Error>),
    #[error("ringside-ipu refused the request ({code}): {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("ringside-ipu sent an error frame with unknown code {code}: {message}")]
    UnknownError { code: u32, message: String },
    #[error("bad reply from ringside-ipu: {0}; run matching ringside-ipu and ringside-rank builds")]
    BadReply(String),
}

impl From<std::io::Error> for ManagedError {
    fn from(e: std::io::Error) -> Self {
        ManagedError::Io(Arc::new(e))
    }
}

/// The tenant's handle on its IPU's managed collectives. Each call sends the buffer from its own
/// memory and reads the result straight back into it ([`WireElem`]); if the host link fails while
/// the result arrives, the buffer may hold part of it (the call returns the error).
pub struct ManagedClient {
    stream: TcpStream,
    /// The reply's report (JSON).
    report: Vec<u8>,
}

impl ManagedClient {
    /// Connects to the service, retrying until `timeout` (the service may still be building its
    /// mesh); every later read and write is bounded by `timeout` too.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<ManagedClient, ManagedError> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(2).min(timeout)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(ManagedError::Connect { addr, source: Arc::new(e) }),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(ManagedClient { stream, report: Vec::new() })
    }

    /// In-place sum allreduce of `buf` for training step `step`.
    pub fn allreduce_f32(&mut self, step: u64, buf: &mut [f32]) -> Result<ManagedReport, ManagedError> {
        self.call(Op::Allreduce, Dtype::F32, 0, step, buf)
    }

    /// In-place sum allreduce of a bf16 buffer.
    pub fn allreduce_bf16(&mut self, step: u64, buf: &mut [Bf16]) -> Result<ManagedReport, ManagedError> {
        self.call(Op::Allreduce, Dtype::Bf16, 0, step, buf)
    }

    /// In-place broadcast of `root`'s buffer.
    pub fn broadcast_f32(&mut self, step: u64, buf: &mut [f32], root: usize) -> Result<ManagedReport, ManagedError> {
        let root = u32::try_from(root).map_err(|_| ManagedError::BadReply("root does not fit".into()))?;
        self.call(Op::Broadcast, Dtype::F32, root, step, buf)
    }

    /// One request on `buf` (sent from it, answered into it).
    fn call<T: WireElem>(&mut self, op: Op, dtype: Dtype, arg: u32, step: u64, buf: &mut [T]) -> Result<ManagedReport, ManagedError> {
        let h = Header { kind: Kind::Request, op: op as u8, dtype: dtype_id(dtype), arg, elems: buf.len() as u64, step, payload_len: buf.as_bytes().len() as u64 };
        T::swap_le(buf);
        let res = self.exchange(&h, buf.as_mut_bytes());
        T::swap_le(buf);
        res
    }

    /// Sends request `h` with `data` as its payload and reads the answer: the report, and the
    /// result into `data`.
    fn exchange(&mut self, h: &Header, data: &mut [u8]) -> Result<ManagedReport, ManagedError> {
        let sent = self.stream.write_all(&h.encode()).and_then(|()| self.stream.write_all(data));
        let mut hb = [0u8; HEADER_LEN];
        match (sent, self.stream.read_exact(&mut hb)) {
            (_, Ok(())) => {}
            // A refused request may be cut off mid-write; the error frame, if any, says why.
            (Err(e), Err(_)) | (Ok(()), Err(e)) => return Err(e.into()),
        }
        let r = Header::parse(&hb).map_err(|e| ManagedError::BadReply(e.to_string()))?;
        match r.kind {
            Kind::Error => {
                let n = (r.payload_len as usize).min(MAX_ERROR_MESSAGE);
                let mut m = vec![0u8; n];
                self.stream.read_exact(&mut m)?;
                let message = String::from_utf8_lossy(&m).into_owned();
                Err(match ErrorCode::from_u32(r.arg) {
                    Some(code) => ManagedError::Refused { code, message },
                    None => ManagedError::UnknownError { code: r.arg, message },
                })
            }
            Kind::Reply => {
                let report_len = r.arg as usize;
                if report_len > MAX_REPORT || r.payload_len != report_len as u64 + h.payload_len || r.elems != h.elems || r.step != h.step {
                    return Err(ManagedError::BadReply(format!("reply header {r:?} does not answer request {h:?}")));
                }
                self.report.resize(report_len, 0);
                self.stream.read_exact(&mut self.report)?;
                self.stream.read_exact(data)?;
                serde_json::from_slice(&self.report).map_err(|e| ManagedError::BadReply(format!("report: {e}")))
            }
            Kind::Request => Err(ManagedError::BadReply("got a request frame".into())),
        }
    }
}

#[cfg(test)]
#[path = "../../ringside-client/tests/support/canned.rs"]
mod canned;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Algorithm, CodecKind, Compression};

    /// Stand-in for the engine with world 1: the "allreduce" of one rank is the identity, plus a
    /// marker so the test sees the buffer made the round trip through the runner.
    struct Doubler;
    impl CollectiveRunner for Doubler {
        fn run(&mut self, req: &Request, buf: &mut Buffer) -> Result<ManagedReport, CollectiveError> {
            if let Buffer::F32(v) = buf {
                v.iter_mut().for_each(|x| *x *= 2.0);
            }
            Ok(ManagedReport { op: req.step, plan: Plan::default(), bytes_sent: 0, service_ms: 0.0, hint_rank: None, hint_version: None })
        }
    }

    fn header(op: u8, dtype: u8, elems: u64, payload_len: u64) -> [u8; HEADER_LEN] {
        Header { kind: Kind::Request, op, dtype, arg: 0, elems, step: 3, payload_len }.encode()
    }

    /// A service on loopback with the stand-in runner; returns its address and stats.
    fn service(cfg: ServiceConfig) -> (SocketAddr, Arc<ServiceStats>, Arc<AtomicBool>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let stats = Arc::new(ServiceStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (stats.clone(), stop.clone());
        std::thread::spawn(move || serve(l, Doubler, 4, cfg, st, sp));
        (addr, stats, stop)
    }

    /// Sends raw bytes and reads back one frame: (header, payload).
    fn raw(addr: SocketAddr, bytes: &[u8]) -> (Header, Vec<u8>) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(bytes).unwrap();
        let mut hb = [0u8; HEADER_LEN];
        s.read_exact(&mut hb).unwrap();
        let h = Header::parse(&hb).unwrap();
        let mut p = vec![0u8; h.payload_len as usize];
        s.read_exact(&mut p).unwrap();
        // The service closes after an error frame.
        if h.kind == Kind::Error {
            let mut rest = [0u8; 1];
            assert_eq!(s.read(&mut rest).unwrap(), 0, "connection closed after the error frame");
        }
        (h, p)
    }

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let h = Header { kind: Kind::Reply, op: 1, dtype: 1, arg: 77, elems: 1 << 40, step: u64::MAX, payload_len: 9 };
        assert_eq!(Header::parse(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[0] = b'X';
        assert!(matches!(Header::parse(&b), Err(HeaderError::Magic { .. })));
        let mut b = h.encode();
        b[4] = 9;
        assert_eq!(Header::parse(&b), Err(HeaderError::Version { got: 9 }));
        let mut b = h.encode();
        b[5] = 0;
        assert_eq!(Header::parse(&b), Err(HeaderError::Kind { got: 0 }));
        let mut b = h.encode();
        b[13] = 1;
        assert_eq!(Header::parse(&b), Err(HeaderError::Reserved));
    }

    #[test]
    fn requests_are_validated_before_the_payload() {
        let max = 1 << 20;
        assert_eq!(validate_request(&header(1, 0, 4, 16), 4, max).map(|r| (r.op, r.dtype, r.elems)), Ok((Op::Allreduce, Dtype::F32, 4)));
        assert_eq!(validate_request(&header(1, 1, 4, 8), 4, max).map(|r| r.dtype), Ok(Dtype::Bf16));
        let code = |b: [u8; HEADER_LEN]| validate_request(&b, 4, max).unwrap_err().code;
        assert_eq!(code(header(9, 0, 4, 16)), ErrorCode::UnsupportedOp);
        assert_eq!(code(header(1, 7, 4, 16)), ErrorCode::UnsupportedDtype);
        assert_eq!(code(header(2, 1, 4, 8)), ErrorCode::UnsupportedDtype, "bf16 broadcast");
        assert_eq!(code(header(1, 0, 4, 15)), ErrorCode::BadLength);
        assert_eq!(code(header(1, 0, u64::MAX, 0)), ErrorCode::BadLength, "elems × 4 overflows");
        assert_eq!(code(header(1, 0, (max / 4) + 1, max + 4)), ErrorCode::TooLarge);
        let mut b = Header { kind: Kind::Request, op: 2, dtype: 0, arg: 4, elems: 1, step: 0, payload_len: 4 }.encode();
        assert_eq!(code(b), ErrorCode::BadLength, "broadcast root = world");
        b[0] = 0;
        assert_eq!(code(b), ErrorCode::Malformed);
        let reply = Header { kind: Kind::Reply, op: 1, dtype: 0, arg: 0, elems: 1, step: 0, payload_len: 4 }.encode();
        assert_eq!(code(reply), ErrorCode::Malformed);
    }

    #[test]
    fn malformed_and_oversize_requests_get_error_frames_and_are_counted() {
        let (addr, stats, stop) = service(ServiceConfig { max_buffer: 1024, tenant_timeout: Duration::from_secs(5) });
        // Garbage: 40 bytes of text.
        let (h, msg) = raw(addr, &[b'G'; HEADER_LEN]);
        assert_eq!((h.kind, ErrorCode::from_u32(h.arg)), (Kind::Error, Some(ErrorCode::Malformed)));
        assert!(String::from_utf8_lossy(&msg).contains("bad magic"), "{}", String::from_utf8_lossy(&msg));
        // Oversize: refused from the header alone (no payload sent).
        let (h, msg) = raw(addr, &header(1, 0, 1024, 4096));
        assert_eq!(ErrorCode::from_u32(h.arg), Some(ErrorCode::TooLarge));
        assert!(String::from_utf8_lossy(&msg).contains("--max-buffer"));
        // Length mismatch.
        let (h, _) = raw(addr, &header(1, 0, 4, 12));
        assert_eq!(ErrorCode::from_u32(h.arg), Some(ErrorCode::BadLength));
        // Each connection is served after the previous one closed; the counters say what happened.
        let deadline = Instant::now() + Duration::from_secs(5);
        while stats.errors(ErrorCode::BadLength) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!((stats.errors(ErrorCode::Malformed), stats.errors(ErrorCode::TooLarge), stats.errors(ErrorCode::BadLength)), (1, 1, 1));
        assert_eq!(stats.requests.load(Ordering::Relaxed), 0, "no refused request counts as served");
        stop.store(true, Ordering::Relaxed);
    }

    #[test]
    fn a_tenant_right_behind_a_closed_probe_is_served_not_refused() {
        // CI saw this: a reachability probe and the rank's connection both waited in the backlog;
        // the probe's session had not yet seen EOF when the rank's connection was accepted.
        let (addr, stats, stop) = service(ServiceConfig { max_buffer: 1 << 20, tenant_timeout: Duration::from_secs(5) });
        for _ in 0..20 {
            drop(TcpStream::connect(addr).unwrap());
            let mut c = ManagedClient::connect(addr, Duration::from_secs(5)).unwrap();
            let mut v = vec![1.0f32; 10];
            c.allreduce_f32(0, &mut v).unwrap();
        }
        assert_eq!(stats.errors(ErrorCode::Busy), 0);
        stop.store(true, Ordering::Relaxed);
    }

    #[test]
    fn a_good_session_round_trips_buffers_and_a_second_session_is_busy() {
        let (addr, stats, stop) = service(ServiceConfig { max_buffer: 1 << 20, tenant_timeout: Duration::from_secs(5) });
        let mut c = ManagedClient::connect(addr, Duration::from_secs(5)).unwrap();
        for step in 0..3u64 {
            let mut v: Vec<f32> = (0..1000).map(|i| i as f32 + step as f32).collect();
            let rep = c.allreduce_f32(step, &mut v).unwrap();
            assert_eq!(rep.op, step);
            assert!(v.iter().enumerate().all(|(i, &x)| x == 2.0 * (i as f32 + step as f32)));
        }
        // One session per IPU: a second tenant is refused while the first is connected.
        let mut c2 = ManagedClient::connect(addr, Duration::from_secs(5)).unwrap();
        let e = c2.allreduce_f32(0, &mut [1.0]).unwrap_err();
        assert!(matches!(e, ManagedError::Refused { code: ErrorCode::Busy, .. }), "{e}");
        assert_eq!(stats.errors(ErrorCode::Busy), 1);
        assert_eq!(stats.requests.load(Ordering::Relaxed), 3);
        // The first session still works.
        let mut v = vec![1.5f32; 8];
        c.allreduce_f32(9, &mut v).unwrap();
        assert_eq!(v, vec![3.0; 8]);
        stop.store(true, Ordering::Relaxed);
    }

    #[test]
    fn a_stalled_tenant_gets_a_timeout_frame() {
        let (addr, stats, stop) = service(ServiceConfig { max_buffer: 1 << 20, tenant_timeout: Duration::from_millis(300) });
        // Header announces 16 bytes; only 4 arrive.
        let mut bytes = header(1, 0, 4, 16).to_vec();
        bytes.extend_from_slice(&[0; 4]);
        let (h, _) = raw(addr, &bytes);
        assert_eq!(ErrorCode::from_u32(h.arg), Some(ErrorCode::Timeout));
        assert_eq!(stats.errors(ErrorCode::Timeout), 1);
        stop.store(true, Ordering::Relaxed);
    }

    #[test]
    fn plans_outside_the_constraints_are_refused() {
        let c = Constraints { algorithms: vec![Algorithm::Ring], codecs: vec!["fp16".into()], max_channels: 2, error_feedback: false, ..Constraints::default() };
        let plan = |algorithm, codec, channels, error_feedback| Plan { step_from: 5, algorithm, chunk_bytes: 1 << 16, channels, compression: Compression { codec, error_feedback } };
        assert_eq!(check_plan(&plan(Algorithm::Ring, CodecKind::Fp16, 2, false), &c), Ok(()));
        assert_eq!(check_plan(&plan(Algorithm::Ring, CodecKind::None, 1, true), &c), Ok(()), "error feedback is moot without a codec");
        assert!(matches!(check_plan(&plan(Algorithm::Tree, CodecKind::None, 1, false), &c), Err(ConstraintViolation::Algorithm(_))));
        assert!(matches!(check_plan(&plan(Algorithm::Ring, CodecKind::Int8, 1, false), &c), Err(ConstraintViolation::Codec(_))));
        assert!(matches!(check_plan(&plan(Algorithm::Ring, CodecKind::Fp16, 3, false), &c), Err(ConstraintViolation::Channels { got: 3, max: 2 })));
        assert_eq!(check_plan(&plan(Algorithm::Ring, CodecKind::Fp16, 1, true), &c), Err(ConstraintViolation::ErrorFeedback));

        let stats = Arc::new(ServiceStats::default());
        let inner = crate::ScriptedPlans(vec![plan(Algorithm::Ring, CodecKind::Int8, 1, false), plan(Algorithm::Ring, CodecKind::Fp16, 1, false)]);
        let mut src = ConstrainedPlans { inner: Box::new(inner), constraints: c, refused: stats.clone() };
        let got = src.poll(0);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].compression.codec, CodecKind::Fp16);
        assert_eq!(stats.plans_refused.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_voter_proposes_its_agents_latest_hint_within_the_constraints_then_abstains_when_the_agent_is_gone() {
        use super::canned::{hint_event, serve as serve_canned, within, Reply};
        use ringside_client::{Backoff, ClientConfig, JobClient};
        within(60, || {
            let hint = |v: u64, codec: &str| {
                format!(r#"{{"job":"j1","version":{v},"step_from":0,"algorithm":"ring","chunk_bytes":1048576,"channels":1,"compression":"{codec}","error_feedback":false,"reasons":[],"confidence":0.7,"expires_at":1}}"#)
            };
            // One connection: the baseline, a compressing hint, then one outside the constraints;
            // then the server is gone (reconnects are refused).
            let srv = serve_canned(vec![Reply::sse(&[&hint_event(1, &hint(1, "none")), &hint_event(2, &hint(2, "int8")), &hint_event(3, &hint(3, "topk:0.5"))])]);
            let cfg = ClientConfig {
                connect_timeout: Duration::from_secs(2),
                request_timeout: Duration::from_secs(5),
                stream_read_timeout: Duration::from_secs(5),
                reconnect: Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(100), max_attempts: 3 },
                ..ClientConfig::default()
            };
            let client = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", cfg).unwrap();
            let follower = HintFollower::start(client, 1).unwrap();
            let constraints = Constraints { codecs: vec!["none".into(), "int8".into()], ..Constraints::default() };
            let stats = Arc::new(ServiceStats::default());
            let mut voter = HintVoter::new(follower, constraints.clone(), Plan::default(), stats.clone());
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut seen = Vec::new();
            while stats.plans_refused.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
                seen.push(voter.propose(5));
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(stats.plans_refused.load(Ordering::Relaxed), 1, "the top-k hint was not refused");
            let int8 = Plan { compression: Compression { codec: CodecKind::Int8, error_feedback: false }, ..Plan::default() };
            let last = seen.iter().rev().flatten().next().copied().expect("a proposal");
            assert!(last.plan.same_as(&int8) && last.version == 2 && last.severity == 3, "{last:?}");
            assert!(last.plan.step_from >= 6, "a proposal never takes effect in the step under way");
            assert!(voter.admits(&int8));
            let topk = Plan { compression: Compression { codec: CodecKind::TopK { ratio: 0.5 }, error_feedback: false }, ..Plan::default() };
            assert!(!voter.admits(&topk), "rank 0 admits a proposal outside its constraints");
            // The agent is gone: after the client's retries the service abstains (fails open).
            while voter.propose(6).is_some() {
                assert!(Instant::now() < deadline, "still proposing 20 s after the agent went away");
                std::thread::sleep(Duration::from_millis(20));
            }
            // Without an agent: always abstains, still checks others' proposals.
            let mut none = HintVoter::abstaining(Some(constraints), Plan::default(), stats.clone());
            assert_eq!(none.propose(0), None);
            assert!(!none.admits(&topk));
            assert!(HintVoter::abstaining(None, Plan::default(), stats).admits(&topk));
        });
    }

    #[test]
    fn the_engine_runs_managed_requests_among_services() {
        // Two services over a loopback mesh, two tenants: the sums are exact.
        use crate::job::{expected_sum, rank_input};
        use crate::transport::TcpOptions;
        let (listeners, addrs) = crate::job::loopback_listeners(2).unwrap();
        let mut svc = Vec::new();
        for (rank, l) in listeners.into_iter().enumerate() {
            let addrs = addrs.clone();
            let host = TcpListener::bind("127.0.0.1:0").unwrap();
            svc.push(host.local_addr().unwrap());
            std::thread::spawn(move || {
                let t = crate::TcpTransport::connect(l, rank, &addrs, TcpOptions::default()).unwrap();
                let comm = Communicator::new(t, crate::CommunicatorConfig::default()).unwrap();
                let stop = Arc::new(AtomicBool::new(false));
                serve(host, EngineRunner { comm, reporter: None }, 2, ServiceConfig::default(), Arc::new(ServiceStats::default()), stop)
            });
        }
        let tenants: Vec<_> = svc
            .into_iter()
            .enumerate()
            .map(|(rank, addr)| {
                std::thread::spawn(move || {
                    let mut c = ManagedClient::connect(addr, Duration::from_secs(10)).unwrap();
                    for step in 0..3u64 {
                        let mut v: Vec<f32> = (0..5000).map(|i| rank_input(rank, step, i)).collect();
                        c.allreduce_f32(step, &mut v).unwrap();
                        assert!(v.iter().enumerate().all(|(i, &x)| x == expected_sum(2, step, i)), "rank {rank} step {step}");
                    }
                    let mut b = vec![rank as f32; 100];
                    c.broadcast_f32(3, &mut b, 1).unwrap();
                    assert_eq!(b, vec![1.0; 100]);
                    // bf16 (small integers: exact), and an f32 size after it, so the service's
                    // reused buffers change dtype and length between requests.
                    let mut h: Vec<Bf16> = (0..3001).map(|i| Bf16::from_f32(rank_input(rank, 4, i))).collect();
                    c.allreduce_bf16(4, &mut h).unwrap();
                    assert!(h.iter().enumerate().all(|(i, x)| x.to_f32() == expected_sum(2, 4, i)), "rank {rank} bf16");
                    let mut v: Vec<f32> = (0..7).map(|i| rank_input(rank, 5, i)).collect();
                    c.allreduce_f32(5, &mut v).unwrap();
                    assert!(v.iter().enumerate().all(|(i, &x)| x == expected_sum(2, 5, i)), "rank {rank} after bf16");
                })
            })
            .collect();
        for t in tenants {
            t.join().unwrap();
        }
    }
}
