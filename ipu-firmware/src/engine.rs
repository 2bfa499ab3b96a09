//! The collective engine: [`Communicator`] runs allreduce (ring, binary tree, recursive
//! halving-doubling), reduce-scatter, allgather and broadcast over a [`Transport`], chunked and
//! pipelined, with per-chunk wire compression and optional error feedback.
//!
//! Invariants:
//! - Every collective starts with rank 0's [`ControlHeader`] (see [`crate::plan`]); the plan in it is
//!   the only plan used for that collective on every rank. A rank holding rank 0's promise from the
//!   previous header ([`ControlHeader::plan_held_until`]) starts with the promised plan without
//!   waiting for the header, and receives and checks the header before it receives anything else in
//!   that collective (or at its end, if it receives nothing): so no data is applied before the
//!   header has been checked, and the header's plan must be the promised one.
//!   With plan votes ([`Communicator::set_plan_voter`], on every rank), each rank first sends rank 0
//!   its vote on channel 0 (promised or not). Rank 0 sends its header without waiting for them,
//!   takes each vote right before its first receive from that rank on channel 0 (the vote is next
//!   in line there) or at the collective's end, and then schedules the agreed plan
//!   ([`crate::plan::agree`]) from the next step at the earliest. A promise already given is kept
//!   ([`PlanSchedule::hold_active`]): a vote never changes the plan of a promised collective; it
//!   takes effect one collective later instead.
//! - The engine reduces in f32. A bf16 buffer is widened to f32, reduced, and rounded back; with
//!   compression `none` its wire format is bf16 (partial sums rounded to bf16 per hop, like NCCL).
//! - Every rank ends with bit-identical results: the final value of every element is encoded once by
//!   the rank that owns it, and those exact bytes are forwarded (never re-encoded) to all other
//!   ranks; the owner overwrites its own copy with the decoded bytes too. The one exception is small
//!   rhd on the raw f32 wire, which runs as recursive doubling ([`rhd_uses_doubling`]): there both
//!   partners of every exchange compute the same f32 sum, and a NaN sum becomes the canonical NaN.
//! - A data frame is applied only after its kind, op number, codec, element offset and element count
//!   match what this rank expects next on that (peer, channel), and its payload decodes for exactly
//!   that many elements. Otherwise the collective fails; garbage is never reduced into a result.
//! - Any error poisons the communicator and aborts the transport, so the other ranks fail fast too.
//! - Error feedback keeps two residual vectors per rank, indexed by element position: one for the
//!   partial sums this rank sends in the reduce phase, one for the final values it encodes as owner.
//!   Each algorithm sends each position at most once per phase, so each residual is well defined; a
//!   residual whose position this rank stops sending after a plan change waits until it sends it again.
//! - Chunk `i` of a transfer travels on channel `i % plan.channels`; within a channel, frames are
//!   sent and received in the same deterministic order by both ends.

use crate::codec::{self, encode_with_feedback, Bf16, ChunkCodec, CodecKind, DecodeMode};
use crate::error::{CollectiveError, Result};
use crate::plan::{agree, encode_vote, parse_vote, Algorithm, ControlHeader, Dtype, OpKind, Plan, PlanSchedule, PlanSource, PlanVoter};
use std::collections::VecDeque;
use crate::transport::{InFrame, Transport};
use crate::wire::{FrameError, FrameHeader, FrameKind, HEADER_LEN};
use std::ops::Range;
use std::time::Duration;

/// Elements `[i·n/parts, (i+1)·n/parts)`: segment `i` of `parts` near-equal segments.
pub fn segment(n: usize, parts: usize, i: usize) -> Range<usize> {
    let at = |j: usize| ((j as u128 * n as u128) / parts as u128) as usize;
    at(i)..at(i + 1)
}

/// Appends the little-endian bytes of `src` (the raw f32 wire payload) to `out`.
fn extend_le_bytes(out: &mut Vec<u8>, src: &[f32]) {
    // On little-endian targets the in-memory bytes are what `to_le_bytes` yields: a plain memcpy
    // through zerocopy's checked byte view of `[f32]`.
    #[cfg(target_endian = "little")]
    out.extend_from_slice(zerocopy::IntoBytes::as_bytes(src));
    #[cfg(not(target_endian = "little"))]
    out.extend(src.iter().flat_map(|x| x.to_le_bytes()));
}

/// Bus bandwidth as nccl-tests defines it for allreduce: `algbw · 2(n−1)/n`.
pub fn allreduce_busbw(bytes: usize, world: usize, seconds: f64) -> f64 {
    let algbw = bytes as f64 / seconds;
    algbw * 2.0 * (world as f64 - 1.0) / world as f64
}

/// What one collective did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpReport {
    pub op: u64,
    pub plan: Plan,
    /// Bytes this rank put on the wire for this collective (frame headers included).
    pub bytes_sent: u64,
    /// This rank started the collective on rank 0's plan promise, without waiting for its control
    /// header (always false on rank 0, which sends it).
    pub on_promise: bool,
}

/// Per-collective settings derived from the plan.
struct OpContext {
    op: u64,
    algorithm: Algorithm,
    codec: Box<dyn ChunkCodec + Send + Sync>,
    codec_id: u8,
    lossless: bool,
    /// The wire payload is the chunk's f32 values, little endian ([`CodecKind::None`]).
    raw_f32: bool,
    chunk_elems: usize,
    channels: usize,
    error_feedback: bool,
    timeout: Duration,
    /// Rank 0's previous header promised this collective's plan, so ranks 1..n−1 may have sent data
    /// before checking their call against the header (see [`Exchange::recv_frame`]).
    promised: bool,
}

/// Mutable state a collective works with, split from [`Communicator`] to keep borrows disjoint.
struct Exchange<'a, T: Transport> {
    t: &'a mut T,
    cx: &'a OpContext,
    residual_reduce: &'a mut Vec<f32>,
    residual_gather: &'a mut Vec<f32>,
    scratch: &'a mut Vec<f32>,
    /// Rank 0's control header for this collective, when this rank started on a promise and has not
    /// received it yet.
    pending_control: Option<PendingControl>,
    /// Where a settled pending header's promise for the next collective goes.
    plan_held_until: &'a mut u64,
    /// Rank 0 with plan votes: this collective's votes, taken as they come (see [`VoteIntake`]).
    votes: Option<&'a mut VoteIntake>,
}

/// Rank 0's intake of one collective's plan votes. Each rank sends its vote on channel 0 before
/// anything else of that collective, so rank 0 takes a peer's vote right before its first receive
/// from that peer on channel 0 (where the vote is next in line anyway), and the votes of peers it
/// received nothing from there at the collective's end. Rank 0 never waits for votes before its
/// control header: a gather on the critical path of every collective otherwise.
struct VoteIntake {
    /// Per rank: its proposal (rank 0's own from the start), once taken.
    proposals: Vec<Option<crate::plan::PlanProposal>>,
    taken: Vec<bool>,
}

impl VoteIntake {
    /// Rank 0's intake in a mesh of `world` ranks (at least rank 0 itself), its own vote `mine`.
    fn new(world: usize, mine: Option<crate::plan::PlanProposal>) -> Self {
        let mut proposals = vec![None; world];
        let mut taken = vec![false; world];
        proposals[0] = mine;
        taken[0] = true;
        VoteIntake { proposals, taken }
    }
}

/// What this rank called, checked against rank 0's [`ControlHeader`].
#[derive(Clone, Copy)]
struct OpCall {
    op_kind: OpKind,
    dtype: Dtype,
    elems: usize,
    root: usize,
    step: u64,
}

/// A control header not yet received: this rank's call and the plan it started with on rank 0's
/// promise.
struct PendingControl {
    call: OpCall,
    plan: Plan,
}

/// How long a rank still waits for rank 0's control header after another peer failed (see
/// [`receive_control`]). Only the failure path waits.
const CONTROL_GRACE: Duration = Duration::from_secs(1);

/// Checks that `f`, received from `peer` on channel 0, is a control frame (rank 0's header or a
/// rank's plan vote) of collective `op`.
fn expect_control(f: &InFrame, peer: usize, op: u64) -> Result<()> {
    let mismatch = |field, expected: u64, got: u64| CollectiveError::UnexpectedFrame { peer, channel: 0, field, expected, got };
    if f.header.kind != FrameKind::Control {
        return Err(mismatch("kind", FrameKind::Control as u64, f.header.kind as u64));
    }
    if f.header.op != op {
        return Err(mismatch("op", op, f.header.op));
    }
    Ok(())
}

/// Receives rank 0's control header for collective `op` on `t` and checks it against this rank's
/// own call and the mesh. A header that has already arrived is taken before the shared failure
/// state is consulted ([`Transport::recv_next`]): on a promised collective a mismatched rank has
/// sent data before this check, its peers may already have aborted over that data, and it must still
/// report its own [`CollectiveError::CollectiveMismatch`] rather than their disconnect. If another
/// peer's failure comes first, the header is still waited for a moment ([`CONTROL_GRACE`]): rank 0
/// sends it before anything else, so unless rank 0's own connection ends without it, it is on its way.
fn receive_control<T: Transport>(t: &mut T, timeout: Duration, op: u64, call: &OpCall) -> Result<ControlHeader> {
    let f = match t.recv_next(0, 0, timeout, op) {
        Ok(f) => f,
        Err(e) => {
            let deadline = std::time::Instant::now() + CONTROL_GRACE.min(timeout);
            loop {
                match t.recv_queued(0, 0) {
                    Ok(Some(f)) => break f,
                    Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                    _ => return Err(e),
                }
            }
        }
    };
    expect_control(&f, 0, op)?;
    let c = ControlHeader::parse(f.payload()).map_err(|error| CollectiveError::BadFrame { peer: 0, channel: 0, error })?;
    t.recycle(f.frame);
    let checks = [
        ("op kind", call.op_kind as u64, c.op_kind as u64),
        ("dtype", call.dtype as u64, c.dtype as u64),
        ("element count", call.elems as u64, c.elems),
        ("root", call.root as u64, u64::from(c.root)),
        ("training step", call.step, c.training_step),
    ];
    for (field, local, announced) in checks {
        if local != announced {
            return Err(CollectiveError::CollectiveMismatch { field, local, announced });
        }
    }
    let channels = u8::try_from(t.channels()).unwrap_or(u8::MAX);
    c.plan.validate(channels)?;
    Ok(c)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Residual {
    None,
    Reduce,
    Gather,
}

impl<'a, T: Transport> Exchange<'a, T> {
    fn chunks(&self, r: Range<usize>) -> impl Iterator<Item = (usize, Range<usize>)> {
        let c = self.cx.chunk_elems;
        let start = r.start;
        let n = r.len();
        (0..n.div_ceil(c)).map(move |i| (i, start + i * c..start + ((i + 1) * c).min(n)))
    }

    fn channel(&self, ci: usize) -> usize {
        ci % self.cx.channels
    }

    fn header(&self, sub: &Range<usize>) -> FrameHeader {
        let mut h = FrameHeader::new(FrameKind::Data);
        h.codec = self.cx.codec_id;
        h.op = self.cx.op;
        h.elem_offset = sub.start as u64;
        h.elem_count = sub.len() as u32;
        h
    }

    /// Encodes `buf[sub]` (plus residual under error feedback) into a frame buffer.
    fn encode(&mut self, buf: &[f32], sub: &Range<usize>, residual: Residual) -> Vec<u8> {
        let mut frame = self.t.frame_buffer(self.cx.codec.max_encoded_len(sub.len()));
        debug_assert_eq!(frame.len(), HEADER_LEN);
        if self.cx.raw_f32 {
            // Same bytes as the raw codec's encode, without zero-filling the payload first.
            extend_le_bytes(&mut frame, &buf[sub.clone()]);
            return frame;
        }
        let res = match residual {
            _ if !self.cx.error_feedback || self.cx.lossless => None,
            Residual::None => None,
            Residual::Reduce => Some(&mut self.residual_reduce[sub.clone()]),
            Residual::Gather => Some(&mut self.residual_gather[sub.clone()]),
        };
        match res {
            Some(res) => encode_with_feedback(self.cx.codec.as_ref(), &buf[sub.clone()], res, self.scratch, &mut frame),
            None => self.cx.codec.encode(&buf[sub.clone()], &mut frame),
        }
        frame
    }

    fn send_chunk(&mut self, peer: usize, ci: usize, sub: Range<usize>, buf: &[f32], residual: Residual) -> Result<()> {
        let frame = self.encode(buf, &sub, residual);
        let h = self.header(&sub);
        self.t.send(peer, self.channel(ci), h, frame)
    }

    fn send_range(&mut self, peer: usize, r: Range<usize>, buf: &[f32], residual: Residual) -> Result<()> {
        for (ci, sub) in self.chunks(r).collect::<Vec<_>>() {
            self.send_chunk(peer, ci, sub, buf, residual)?;
        }
        Ok(())
    }

    /// Owner side of a final value: encode once, make the owner's copy what everybody will decode,
    /// and return the frame (header room + payload) for forwarding.
    fn finalize_chunk(&mut self, sub: Range<usize>, buf: &mut [f32], residual: Residual) -> Vec<u8> {
        let frame = self.encode(buf, &sub, residual);
        if !self.cx.lossless {
            // Cannot fail: every codec's decoder accepts its own encoder's payload, for any values
            // (an inf or NaN sum, perhaps from a peer's int8 chunk with a huge scale, encodes as
            // int8's NaN scale and decodes as NaN: codec.rs's module docs).
            self.cx
                .codec
                .decode(&frame[HEADER_LEN..], &mut buf[sub], DecodeMode::Overwrite)
                .expect("a payload we just encoded decodes");
        }
        frame
    }

    /// Sends a frame whose payload is final bytes for `sub` (the transport rewrites the header).
    fn forward(&mut self, peer: usize, ci: usize, sub: Range<usize>, frame: Vec<u8>) -> Result<()> {
        let h = self.header(&sub);
        self.t.send(peer, self.channel(ci), h, frame)
    }

    /// Like [`Self::forward`] for a frame that is kept: sends a copy.
    fn forward_copy(&mut self, peer: usize, ci: usize, sub: Range<usize>, frame: &[u8]) -> Result<()> {
        let payload = &frame[HEADER_LEN..];
        let mut copy = self.t.frame_buffer(payload.len());
        copy.extend_from_slice(payload);
        self.forward(peer, ci, sub, copy)
    }

    /// Receives chunk `ci` = `sub` from `peer`, validates it and applies it to `buf[sub]`.
    fn recv_chunk(&mut self, peer: usize, ci: usize, sub: Range<usize>, buf: &mut [f32], mode: DecodeMode) -> Result<InFrame> {
        let f = self.recv_frame(peer, ci, &sub)?;
        let channel = self.channel(ci);
        self.cx
            .codec
            .decode(f.payload(), &mut buf[sub], mode)
            .map_err(|error| CollectiveError::BadFrame { peer, channel, error })?;
        Ok(f)
    }

    /// Receives a reduce-phase chunk from `peer`, adds it into `buf[sub]` and passes the partial sum
    /// on to `next`. With the raw f32 wire this is one pass: the sum is written both into `buf` and
    /// over the received payload, whose frame is then sent on (same bytes as decode + re-encode).
    fn recv_reduce_send(&mut self, peer: usize, next: usize, ci: usize, sub: Range<usize>, buf: &mut [f32]) -> Result<()> {
        if !self.cx.raw_f32 {
            let f = self.recv_chunk(peer, ci, sub.clone(), buf, DecodeMode::Accumulate)?;
            self.t.recycle(f.frame);
            return self.send_chunk(next, ci, sub, buf, Residual::Reduce);
        }
        let mut f = self.recv_frame(peer, ci, &sub)?;
        let channel = self.channel(ci);
        let dst = &mut buf[sub.clone()];
        if f.payload().len() != dst.len() * 4 {
            let error = FrameError::PayloadLength { what: "f32 chunk", expected: dst.len() * 4, got: f.payload().len() };
            return Err(CollectiveError::BadFrame { peer, channel, error });
        }
        for (d, c) in dst.iter_mut().zip(f.payload_mut().chunks_exact_mut(4)) {
            let v = *d + f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            *d = v;
            c.copy_from_slice(&v.to_le_bytes());
        }
        let h = self.header(&sub);
        self.t.send(next, self.channel(ci), h, f.frame)
    }

    /// Receives and checks the control header this rank started without (see [`PendingControl`]);
    /// a no-op once it has been received or when there was none to wait for.
    fn settle_control(&mut self) -> Result<()> {
        let Some(p) = self.pending_control.take() else { return Ok(()) };
        let c = receive_control(self.t, self.cx.timeout, self.cx.op, &p.call)?;
        if c.plan != p.plan {
            return Err(CollectiveError::PlanPromiseBroken { op: self.cx.op });
        }
        *self.plan_held_until = c.plan_held_until;
        Ok(())
    }

    /// Rank 0 with plan votes: takes `peer`'s vote for this collective if not taken yet (it is the
    /// first frame of the collective from `peer` on channel 0).
    fn take_vote(&mut self, peer: usize) -> Result<()> {
        let Some(v) = self.votes.as_deref_mut() else { return Ok(()) };
        if v.taken[peer] {
            return Ok(());
        }
        let op = self.cx.op;
        let f = self.t.recv_next(peer, 0, self.cx.timeout, op)?;
        expect_control(&f, peer, op)?;
        let (_, proposal) = parse_vote(f.payload()).map_err(|error| CollectiveError::BadFrame { peer, channel: 0, error })?;
        self.t.recycle(f.frame);
        v.proposals[peer] = proposal;
        v.taken[peer] = true;
        Ok(())
    }

    /// Rank 0 with plan votes: takes the votes of the peers this collective received nothing from
    /// on channel 0 (sent at its start, so normally already here).
    fn take_remaining_votes(&mut self) -> Result<()> {
        let world = self.votes.as_deref().map_or(0, |v| v.taken.len());
        for peer in 1..world {
            self.take_vote(peer)?;
        }
        Ok(())
    }

    /// Receives chunk `ci` = `sub` from `peer` and validates its header (not yet its payload).
    fn recv_frame(&mut self, peer: usize, ci: usize, sub: &Range<usize>) -> Result<InFrame> {
        // Every data receive goes through here: the header is checked before any data is applied.
        self.settle_control()?;
        let channel = self.channel(ci);
        if channel == 0 {
            self.take_vote(peer)?;
        }
        let f = self.t.recv_next(peer, channel, self.cx.timeout, self.cx.op)?;
        let h = &f.header;
        let mismatch = |field, expected: u64, got: u64| CollectiveError::UnexpectedFrame { peer, channel, field, expected, got };
        // On a promised collective ranks 1..n−1 send before they check their call against rank 0's
        // header, so a frame shaped for another call (codec from the dtype, element range from the
        // element count) means that peer called a different collective; it reports
        // `CollectiveMismatch` itself. Without a promise this cannot happen and stays a protocol error.
        let shape_mismatch = |field, expected: u64, got: u64| {
            if self.cx.promised && peer != 0 {
                CollectiveError::PeerCallMismatch { peer, op: self.cx.op, field, expected, got }
            } else {
                mismatch(field, expected, got)
            }
        };
        if h.kind != FrameKind::Data {
            return Err(mismatch("kind", FrameKind::Data as u64, h.kind as u64));
        }
        if h.op != self.cx.op {
            return Err(mismatch("op", self.cx.op, h.op));
        }
        if h.codec != self.cx.codec_id {
            return Err(shape_mismatch("codec", u64::from(self.cx.codec_id), u64::from(h.codec)));
        }
        if h.elem_offset != sub.start as u64 {
            return Err(shape_mismatch("elem_offset", sub.start as u64, h.elem_offset));
        }
        if h.elem_count as usize != sub.len() {
            return Err(shape_mismatch("elem_count", sub.len() as u64, u64::from(h.elem_count)));
        }
        Ok(f)
    }

    fn recv_range(&mut self, peer: usize, r: Range<usize>, buf: &mut [f32], mode: DecodeMode) -> Result<()> {
        for (ci, sub) in self.chunks(r).collect::<Vec<_>>() {
            let f = self.recv_chunk(peer, ci, sub, buf, mode)?;
            self.t.recycle(f.frame);
        }
        Ok(())
    }

    // ------------------------------------------------------------ ring

    /// Ring reduce-scatter: step s sends segment r−s−1 and reduces segment r−s−2, so rank r ends
    /// owning the fully reduced segment r. Pipelined per chunk: a chunk is forwarded as soon as it has
    /// been reduced.
    fn ring_reduce_scatter(&mut self, buf: &mut [f32]) -> Result<()> {
        let (r, n) = (self.t.rank(), self.t.world());
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let len = buf.len();
        let seg = |i: usize| segment(len, n, i % n);
        self.send_range(right, seg(r + n - 1), buf, Residual::Reduce)?;
        for s in 0..n - 1 {
            let recv_seg = seg(r + 2 * n - s - 2);
            for (ci, sub) in self.chunks(recv_seg).collect::<Vec<_>>() {
                if s < n - 2 {
                    self.recv_reduce_send(left, right, ci, sub, buf)?;
                } else {
                    let f = self.recv_chunk(left, ci, sub, buf, DecodeMode::Accumulate)?;
                    self.t.recycle(f.frame);
                }
            }
        }
        Ok(())
    }

    /// Ring allgather: rank r contributes segment r; encoded once by its owner, forwarded verbatim.
    fn ring_allgather(&mut self, buf: &mut [f32], residual: Residual) -> Result<()> {
        let (r, n) = (self.t.rank(), self.t.world());
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let len = buf.len();
        let seg = |i: usize| segment(len, n, i % n);
        for (ci, sub) in self.chunks(seg(r)).collect::<Vec<_>>() {
            let frame = self.finalize_chunk(sub.clone(), buf, residual);
            self.forward(right, ci, sub, frame)?;
        }
        for s in 0..n - 1 {
            let recv_seg = seg(r + 2 * n - s - 1);
            for (ci, sub) in self.chunks(recv_seg).collect::<Vec<_>>() {
                let f = self.recv_chunk(left, ci, sub.clone(), buf, DecodeMode::Overwrite)?;
                if s < n - 2 {
                    self.forward(right, ci, sub, f.frame)?;
                } else {
                    self.t.recycle(f.frame);
                }
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------ tree

    /// Real ranks of the binary-tree parent and children of this rank in a tree rooted at `root`.
    fn tree_links(&self, root: usize) -> (Option<usize>, Vec<usize>) {
        let (r, n) = (self.t.rank(), self.t.world());
        let v = (r + n - root) % n;
        let real = |x: usize| (x + root) % n;
        let parent = (v > 0).then(|| real((v - 1) / 2));
        let children = [2 * v + 1, 2 * v + 2].into_iter().filter(|&c| c < n).map(real).collect();
        (parent, children)
    }

    fn tree_reduce(&mut self, buf: &mut [f32]) -> Result<()> {
        let (parent, children) = self.tree_links(0);
        for (ci, sub) in self.chunks(0..buf.len()).collect::<Vec<_>>() {
            for &c in &children {
                let f = self.recv_chunk(c, ci, sub.clone(), buf, DecodeMode::Accumulate)?;
                self.t.recycle(f.frame);
            }
            if let Some(p) = parent {
                self.send_chunk(p, ci, sub, buf, Residual::Reduce)?;
            }
        }
        Ok(())
    }

    fn tree_broadcast(&mut self, buf: &mut [f32], root: usize, residual: Residual) -> Result<()> {
        let (parent, children) = self.tree_links(root);
        for (ci, sub) in self.chunks(0..buf.len()).collect::<Vec<_>>() {
            let frame = match parent {
                None => self.finalize_chunk(sub.clone(), buf, residual),
                Some(p) => self.recv_chunk(p, ci, sub.clone(), buf, DecodeMode::Overwrite)?.frame,
            };
            match children.split_last() {
                None => self.t.recycle(frame),
                Some((&last, rest)) => {
                    for &c in rest {
                        self.forward_copy(c, ci, sub.clone(), &frame)?;
                    }
                    self.forward(last, ci, sub, frame)?;
                }
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------ recursive doubling (small rhd)

    /// Recursive doubling of the whole buffer: `log2(p)` exchanges with partners `r ^ 1, r ^ 2, …`,
    /// each adding the partner's partial sum, instead of rhd's `2·log2(p)` half-size exchanges; the
    /// latency-optimal allreduce, used for small [`Algorithm::Rhd`] collectives on the raw f32 wire
    /// (see [`rhd_uses_doubling`]). Ranks beyond the largest power of two `p` fold into partner
    /// `r − p` first and receive the result from it last, as in rhd.
    ///
    /// Every rank ends bit-identical without the owner-encodes-once rule: both partners of a step
    /// add the same two partial sums (IEEE addition is commutative, and the wire is lossless), so
    /// they agree on both sides after every step by induction. The exception would be NaN: the
    /// payload of a NaN that `a + b` produces is unspecified in Rust (LLVM may swap the operands), so
    /// a NaN sum is replaced by the canonical quiet NaN on every rank.
    fn rd_allreduce(&mut self, buf: &mut [f32]) -> Result<()> {
        debug_assert!(self.cx.raw_f32);
        let (r, n, len) = (self.t.rank(), self.t.world(), buf.len());
        let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let extra = n - p;
        if r >= p {
            let partner = r - p;
            self.send_range(partner, 0..len, buf, Residual::None)?;
            return self.recv_range(partner, 0..len, buf, DecodeMode::Overwrite);
        }
        if r < extra {
            // Only this rank forms `own + folded partner's`; the result is forwarded verbatim.
            self.recv_range(r + p, 0..len, buf, DecodeMode::Accumulate)?;
        }
        let mut mask = 1;
        while mask < p {
            let partner = r ^ mask;
            self.send_range(partner, 0..len, buf, Residual::None)?;
            for (ci, sub) in self.chunks(0..len).collect::<Vec<_>>() {
                let f = self.recv_frame(partner, ci, &sub)?;
                let dst = &mut buf[sub];
                if f.payload().len() != dst.len() * 4 {
                    let (channel, expected, got) = (self.channel(ci), dst.len() * 4, f.payload().len());
                    let error = FrameError::PayloadLength { what: "f32 chunk", expected, got };
                    return Err(CollectiveError::BadFrame { peer: partner, channel, error });
                }
                for (d, c) in dst.iter_mut().zip(f.payload().chunks_exact(4)) {
                    let theirs = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    let v = *d + theirs;
                    *d = if v.is_nan() { f32::NAN } else { v };
                }
                self.t.recycle(f.frame);
            }
            mask *= 2;
        }
        if r < extra {
            self.send_range(r + p, 0..len, buf, Residual::None)?;
        }
        Ok(())
    }

    // ------------------------------------------------------------ recursive halving-doubling

    /// The range rank `q < p` owns after recursive halving of `0..n` among `p` (a power of two) ranks.
    fn rhd_final_range(n: usize, p: usize, q: usize) -> Range<usize> {
        let (mut lo, mut hi) = (0, n);
        let mut mask = p / 2;
        while mask >= 1 {
            let mid = lo + (hi - lo) / 2;
            if q & mask == 0 {
                hi = mid
            } else {
                lo = mid
            }
            mask /= 2;
        }
        lo..hi
    }

    fn rhd_allreduce(&mut self, buf: &mut [f32]) -> Result<()> {
        let (r, n, len) = (self.t.rank(), self.t.world(), buf.len());
        let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let extra = n - p;
        if r >= p {
            // Folded rank: contribute everything to the partner, then receive every final segment.
            let partner = r - p;
            self.send_range(partner, 0..len, buf, Residual::Reduce)?;
            for q in 0..p {
                self.recv_range(partner, Self::rhd_final_range(len, p, q), buf, DecodeMode::Overwrite)?;
            }
            return Ok(());
        }
        if r < extra {
            self.recv_range(r + p, 0..len, buf, DecodeMode::Accumulate)?;
        }
        // Recursive halving.
        let (mut lo, mut hi) = (0, len);
        let mut mask = p / 2;
        while mask >= 1 {
            let partner = r ^ mask;
            let mid = lo + (hi - lo) / 2;
            let (keep, give) = if r & mask == 0 { (lo..mid, mid..hi) } else { (mid..hi, lo..mid) };
            self.send_range(partner, give, buf, Residual::Reduce)?;
            self.recv_range(partner, keep.clone(), buf, DecodeMode::Accumulate)?;
            (lo, hi) = (keep.start, keep.end);
            mask /= 2;
        }
        debug_assert_eq!(lo..hi, Self::rhd_final_range(len, p, r));
        // Recursive doubling with the owners' encoded chunks, forwarded verbatim.
        let mut payloads: Vec<Vec<Vec<u8>>> = vec![Vec::new(); p];
        for (_, sub) in self.chunks(lo..hi).collect::<Vec<_>>() {
            let pl = self.finalize_chunk(sub, buf, Residual::Gather);
            payloads[r].push(pl);
        }
        let mut mask = 1;
        while mask < p {
            let partner = r ^ mask;
            let group = |x: usize| (0..p).filter(move |q| q & !(mask - 1) == x & !(mask - 1));
            for q in group(r) {
                let chunks: Vec<_> = self.chunks(Self::rhd_final_range(len, p, q)).collect();
                for (ci, sub) in chunks {
                    let pl = std::mem::take(&mut payloads[q][ci]);
                    let sent = self.forward_copy(partner, ci, sub, &pl);
                    payloads[q][ci] = pl;
                    sent?;
                }
            }
            for q in group(partner) {
                for (ci, sub) in self.chunks(Self::rhd_final_range(len, p, q)).collect::<Vec<_>>() {
                    let f = self.recv_chunk(partner, ci, sub, buf, DecodeMode::Overwrite)?;
                    payloads[q].push(f.frame);
                }
            }
            mask *= 2;
        }
        if r < extra {
            for (q, chunks) in payloads.iter().enumerate() {
                let subs: Vec<_> = self.chunks(Self::rhd_final_range(len, p, q)).collect();
                for ((ci, sub), pl) in subs.into_iter().zip(chunks) {
                    self.forward_copy(r + p, ci, sub, pl)?;
                }
            }
        }
        for frame in payloads.into_iter().flatten() {
            self.t.recycle(frame);
        }
        Ok(())
    }
}

/// Largest allreduce (bytes of f32) that [`Algorithm::Rhd`] runs as recursive doubling of the whole
/// buffer rather than recursive halving then doubling. Up to here the collective is latency-bound:
/// halving-doubling's `2·log2(p)` hops cost more than doubling's `log2(p)` full-size exchanges save
/// in bytes. Measured on loopback, 4 ranks on 2 busy cores (`ringside-collective-bench busbw
/// --algorithms rhd`): doubling was 2× faster at 16 KiB, about 10% faster at 64 KiB, and 5× slower
/// at 256 KiB, where it moves a third more bytes on a CPU-bound rig.
pub const RHD_DOUBLING_MAX_BYTES: usize = 64 << 10;

/// Whether an rhd allreduce of `elems` f32 elements runs as recursive doubling: only on the raw f32
/// wire (with a lossy codec both partners would add differently rounded sums and the ranks would
/// end with different bits), and only at or below [`RHD_DOUBLING_MAX_BYTES`]. A pure function of
/// what every rank knows (the plan's codec and the element count), so all ranks agree.
pub fn rhd_uses_doubling(raw_f32: bool, elems: usize) -> bool {
    raw_f32 && elems.saturating_mul(4) <= RHD_DOUBLING_MAX_BYTES
}

/// Largest collective (bytes of f32) whose frames the engine reads from the sockets itself
/// ([`Transport::set_direct_reads`]); larger ones keep the reader threads, which read the next chunk
/// while this thread reduces the current one.
pub const DIRECT_READ_MAX_BYTES: usize = 1 << 20;

/// Smallest chunk (bytes of the buffer's dtype) a collective is cut into below the plan's chunk size:
/// see [`chunk_elems`].
pub const SMALL_CHUNK_MIN_BYTES: usize = 32 << 10;

/// Elements per chunk of a collective of `elems` elements under a plan with `chunk_bytes`: the plan's
/// chunk, but no more than an eighth of the buffer when the plan sends it uncompressed (`compressed`
/// false: codec `none`) or a quarter when a codec compresses it, and no less than
/// [`SMALL_CHUNK_MIN_BYTES`]. So a small collective is still cut into several chunks that pipeline (a
/// tree hop forwards one chunk while the next arrives; a doubling exchange reads one while the other
/// is copied; a 4-rank 4 MiB ring's segment is two chunks, so one is reduced while the next is read)
/// instead of travelling as one frame per hop, and a large one keeps the plan's chunks. On the
/// 4-host star (4 ranks on 2 vCPUs) 32 KiB chunks raised 64 KiB tree and rhd by 10-60 % over one
/// 64 KiB frame, 16 KiB chunks did not; an eighth instead of a quarter raised uncompressed 256 KiB
/// collectives by about 18 %, but made int8 collectives under 2 % loss slower (managed mode's
/// static/adaptive ratio fell from 1.38-1.45 to 0.94-1.32), whose frames are already a quarter of
/// the size on the wire, so compressed collectives keep the quarter (docs/benchmarks.md,
/// docs/eval-adaptation.md, issue 12). A pure function of the plan and the call, so every rank cuts
/// alike.
pub fn chunk_elems(chunk_bytes: u32, dtype: Dtype, elems: usize, compressed: bool) -> usize {
    let plan = (chunk_bytes as usize / dtype.size()).max(1);
    let floor = SMALL_CHUNK_MIN_BYTES / dtype.size();
    let parts = if compressed { 4 } else { 8 };
    plan.min(floor.max(elems.div_ceil(parts)))
}

/// Settings of a [`Communicator`].
#[derive(Clone, Copy, Debug)]
pub struct CommunicatorConfig {
    /// Plan until rank 0's [`PlanSource`] supplies another one.
    pub initial_plan: Plan,
    /// Longest wait for any single frame.
    pub timeout: Duration,
}

impl Default for CommunicatorConfig {
    fn default() -> Self {
        Self { initial_plan: Plan::default(), timeout: Duration::from_secs(30) }
    }
}

/// Where an agreed plan came from (rank 0, plan votes): the rank whose proposal won and the
/// version of the hint behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanOrigin {
    pub rank: usize,
    pub version: u64,
}

/// Most agreed plans rank 0 remembers the origin of (plan changes are rare).
const MAX_ORIGINS: usize = 256;

/// Plan votes: this rank's voter; on rank 0, what was agreed.
struct Votes {
    voter: Box<dyn PlanVoter>,
    /// Rank 0: the last plan agreed (`step_from` aside), so an unchanged winner is not rescheduled
    /// at every collective.
    last: Option<Plan>,
    /// Rank 0: the plans scheduled from votes and their origins, newest last.
    origins: VecDeque<(Plan, PlanOrigin)>,
}

/// One rank's handle on a job's collectives.
pub struct Communicator<T: Transport> {
    transport: T,
    timeout: Duration,
    op: u64,
    step: u64,
    schedule: PlanSchedule,
    votes: Option<Votes>,
    last_plan: Plan,
    poisoned: Option<CollectiveError>,
    residual_reduce: Vec<f32>,
    residual_gather: Vec<f32>,
    scratch: Vec<f32>,
    widened: Vec<f32>,
    /// The promise of the last control header this rank sent (rank 0) or checked (other ranks):
    /// the next collective runs with `last_plan` if its training step is below this.
    plan_held_until: u64,
}

impl<T: Transport> Communicator<T> {
    pub fn new(transport: T, config: CommunicatorConfig) -> Result<Self> {
        let channels = u8::try_from(transport.channels()).unwrap_or(u8::MAX);
        config.initial_plan.validate(channels)?;
        Ok(Self {
            schedule: PlanSchedule::new(config.initial_plan, channels),
            votes: None,
            last_plan: config.initial_plan,
            transport,
            timeout: config.timeout,
            op: 0,
            step: 0,
            poisoned: None,
            residual_reduce: Vec::new(),
            residual_gather: Vec::new(),
            scratch: Vec::new(),
            widened: Vec::new(),
            plan_held_until: 0,
        })
    }

    pub fn rank(&self) -> usize {
        self.transport.rank()
    }
    pub fn world(&self) -> usize {
        self.transport.world()
    }
    /// Number of collectives completed or attempted.
    pub fn ops(&self) -> u64 {
        self.op
    }
    /// The plan of the most recent collective (on rank 0 before the first collective: the initial one).
    pub fn current_plan(&self) -> Plan {
        self.last_plan
    }
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Installs rank 0's plan-change hook (ignored on other ranks, whose plans come from rank 0).
    pub fn set_plan_source(&mut self, source: Box<dyn PlanSource>) {
        self.schedule.set_source(source);
    }

    /// Turns on plan votes (managed mode): before every collective this rank's `voter` is polled
    /// and its proposal sent to rank 0, which schedules the agreed plan
    /// ([`crate::plan::agree`]) from the next training step. Every rank of the job must call this
    /// before its first collective, or none: a rank without votes breaks the control exchange
    /// (the collective fails with an unexpected frame or a timeout, never with mixed plans).
    pub fn set_plan_voter(&mut self, voter: Box<dyn PlanVoter>) {
        self.votes = Some(Votes { voter, last: None, origins: VecDeque::new() });
    }

    /// Rank 0 with plan votes: where `plan` (as reported for a collective) came from.
    pub fn plan_origin(&self, plan: &Plan) -> Option<PlanOrigin> {
        self.votes.as_ref()?.origins.iter().rev().find(|(p, _)| p == plan).map(|(_, o)| *o)
    }

    /// Ranks 1..n−1 with plan votes: sends this rank's vote for collective `op` to rank 0 (see
    /// [`Self::set_plan_voter`]), the first frame of the collective on channel 0.
    fn send_vote(&mut self, votes: &mut Votes, op: u64, call: &ControlHeader) -> Result<()> {
        let mine = votes.voter.propose(self.step);
        let mut frame = vec![0u8; HEADER_LEN];
        frame.extend_from_slice(&encode_vote(call, mine.as_ref()));
        let mut h = FrameHeader::new(FrameKind::Control);
        h.op = op;
        self.transport.send(0, 0, h, frame).map_err(|e| self.fail(e))
    }

    /// Rank 0: agrees on one collective's votes ([`crate::plan::agree`]) and schedules the winner
    /// from the next step at the earliest. The collective's header has gone out already, so a
    /// promise it gave is kept by the schedule ([`PlanSchedule::hold_active`]): the plan then takes
    /// effect one collective later.
    fn apply_votes(&mut self, votes: &mut Votes, intake: VoteIntake) {
        let all: Vec<_> = intake
            .proposals
            .into_iter()
            .enumerate()
            .map(|(peer, p)| {
                p.filter(|p| {
                    let ok = peer == 0 || votes.voter.admits(&p.plan);
                    if !ok {
                        tracing::warn!(peer, plan = ?p.plan, "rank {peer} proposed a plan this rank does not admit; counted as an abstention");
                    }
                    ok
                })
            })
            .collect();
        let Some((from, p)) = agree(&all) else { return };
        if votes.last.is_some_and(|l| l.same_as(&p.plan)) {
            return;
        }
        // From the next step: the collective under way may belong to a step already started.
        let plan = Plan { step_from: p.plan.step_from.max(self.step + 1), ..p.plan };
        if self.schedule.add(plan) {
            tracing::info!(
                from_rank = from,
                version = p.version,
                severity = p.severity,
                step_from = plan.step_from,
                algorithm = %plan.algorithm,
                compression = %plan.compression.codec,
                votes = all.iter().filter(|v| v.is_some()).count(),
                "plan agreed by vote"
            );
            votes.last = Some(p.plan);
            if votes.origins.len() == MAX_ORIGINS {
                votes.origins.pop_front();
            }
            votes.origins.push_back((plan, PlanOrigin { rank: from, version: p.version }));
        }
    }

    /// Declares the training step the next collectives belong to; plans switch at step boundaries.
    pub fn begin_step(&mut self, step: u64) {
        self.step = step;
    }

    /// Ends the communicator gracefully (peers see a goodbye, not a failure).
    pub fn close(mut self) {
        self.transport.close();
    }

    /// Ends the communicator abruptly, as a crash would (tests and fatal errors).
    pub fn abort(mut self) {
        self.transport.abort();
    }

    fn fail(&mut self, e: CollectiveError) -> CollectiveError {
        self.poisoned = Some(e.clone());
        self.transport.abort();
        e
    }

    /// Agrees on the plan for the next collective (rank 0 announces, others check). On a rank that
    /// starts on rank 0's promise, also returns the control header still to be received.
    fn begin_op(
        &mut self,
        op_kind: OpKind,
        dtype: Dtype,
        elems: usize,
        root: usize,
    ) -> Result<(Plan, OpContext, Option<PendingControl>, Option<VoteIntake>)> {
        if let Some(cause) = &self.poisoned {
            return Err(CollectiveError::Poisoned { cause: Box::new(cause.clone()) });
        }
        let (rank, world) = (self.rank(), self.world());
        if root >= world {
            return Err(CollectiveError::InvalidArgument { name: "root", reason: format!("{root} >= world {world}") });
        }
        let op = self.op;
        self.op += 1;
        let call = OpCall { op_kind, dtype, elems, root, step: self.step };
        // The previous header promised this collective's plan (same rule on every rank).
        let promised = self.step < self.plan_held_until;
        let mut pending = None;
        let mut intake = None;
        if let Some(mut votes) = self.votes.take() {
            // Ranks 1..n−1 send their vote first; rank 0 takes the votes during and after the
            // collective ([`VoteIntake`]) and agrees on them at its end.
            let r = if rank == 0 {
                intake = Some(VoteIntake::new(world, votes.voter.propose(self.step)));
                Ok(())
            } else {
                let call = ControlHeader {
                    training_step: self.step,
                    op_kind,
                    dtype,
                    elems: elems as u64,
                    root: root as u32,
                    plan: self.last_plan,
                    plan_held_until: 0,
                };
                self.send_vote(&mut votes, op, &call)
            };
            self.votes = Some(votes);
            r?;
        }
        let plan = if rank == 0 {
            let plan =
                if promised { self.schedule.hold_active(self.step) } else { self.schedule.plan_for_step(self.step) };
            self.plan_held_until = self.schedule.held_until();
            let control = ControlHeader {
                training_step: self.step,
                op_kind,
                dtype,
                elems: elems as u64,
                root: root as u32,
                plan,
                plan_held_until: self.plan_held_until,
            };
            let payload = control.encode();
            for peer in 1..world {
                let mut frame = self.transport.frame_buffer(payload.len());
                frame.extend_from_slice(&payload);
                let mut h = FrameHeader::new(FrameKind::Control);
                h.op = op;
                self.transport.send(peer, 0, h, frame).map_err(|e| self.fail(e))?;
            }
            plan
        } else if promised {
            // Start now; the header is received before this rank's first receive (Exchange).
            self.plan_held_until = 0;
            pending = Some(PendingControl { call, plan: self.last_plan });
            self.last_plan
        } else {
            let c = receive_control(&mut self.transport, self.timeout, op, &call).map_err(|e| self.fail(e))?;
            self.plan_held_until = c.plan_held_until;
            c.plan
        };
        self.last_plan = plan;
        // With compression `none`, a bf16 buffer travels as bf16.
        let codec_kind = match (plan.compression.codec, dtype) {
            (CodecKind::None, Dtype::Bf16) => CodecKind::Bf16,
            (k, _) => k,
        };
        let cx = OpContext {
            op,
            algorithm: plan.algorithm,
            codec: codec::for_kind(codec_kind),
            codec_id: codec::wire_id(codec_kind),
            lossless: codec_kind.is_lossless(),
            raw_f32: codec_kind == CodecKind::None,
            chunk_elems: chunk_elems(plan.chunk_bytes, dtype, elems, plan.compression.codec != CodecKind::None),
            channels: usize::from(plan.channels),
            error_feedback: plan.compression.error_feedback && op_kind == OpKind::Allreduce,
            timeout: self.timeout,
            promised,
        };
        if cx.error_feedback && self.residual_reduce.len() != elems {
            self.residual_reduce = vec![0.0; elems];
            self.residual_gather = vec![0.0; elems];
        }
        Ok((plan, cx, pending, intake))
    }

    fn run<F>(&mut self, kind: OpKind, dtype: Dtype, buf: &mut [f32], root: usize, body: F) -> Result<OpReport>
    where
        F: FnOnce(&mut Exchange<'_, T>, &mut [f32]) -> Result<()>,
    {
        let before = self.transport.bytes_sent();
        // Small collectives read the network on this thread: no hand-off per frame.
        self.transport.set_direct_reads(buf.len().saturating_mul(4) <= DIRECT_READ_MAX_BYTES);
        let (plan, cx, pending_control, mut intake) = self.begin_op(kind, dtype, buf.len(), root)?;
        let on_promise = pending_control.is_some();
        if self.world() > 1 {
            let mut ex = Exchange {
                t: &mut self.transport,
                cx: &cx,
                residual_reduce: &mut self.residual_reduce,
                residual_gather: &mut self.residual_gather,
                scratch: &mut self.scratch,
                pending_control,
                plan_held_until: &mut self.plan_held_until,
                votes: intake.as_mut(),
            };
            // A rank that received nothing (a broadcast's root) still takes rank 0's header, and
            // rank 0 every vote.
            if let Err(e) = body(&mut ex, buf).and_then(|()| ex.settle_control()).and_then(|()| ex.take_remaining_votes()) {
                return Err(self.fail(e));
            }
        }
        if let Some(intake) = intake {
            if let Some(mut votes) = self.votes.take() {
                self.apply_votes(&mut votes, intake);
                self.votes = Some(votes);
            }
        }
        Ok(OpReport { op: cx.op, plan, bytes_sent: self.transport.bytes_sent() - before, on_promise })
    }

    fn allreduce_inner(&mut self, dtype: Dtype, buf: &mut [f32]) -> Result<OpReport> {
        self.run(OpKind::Allreduce, dtype, buf, 0, |ex, buf| {
            match ex.cx.algorithm {
                Algorithm::Ring => {
                    ex.ring_reduce_scatter(buf)?;
                    ex.ring_allgather(buf, Residual::Gather)
                }
                Algorithm::Tree => {
                    ex.tree_reduce(buf)?;
                    ex.tree_broadcast(buf, 0, Residual::Gather)
                }
                Algorithm::Rhd if rhd_uses_doubling(ex.cx.raw_f32, buf.len()) => ex.rd_allreduce(buf),
                Algorithm::Rhd => ex.rhd_allreduce(buf),
            }
        })
    }

    /// In-place sum allreduce of an f32 buffer.
    pub fn allreduce_f32(&mut self, buf: &mut [f32]) -> Result<OpReport> {
        self.allreduce_inner(Dtype::F32, buf)
    }

    /// Returns on every rank only after every rank has called it: an allreduce of one zero per rank
    /// with the current plan. Whatever the algorithm, every rank's result depends on every rank's
    /// input, so no rank finishes before the last one has started. A collective like any other (op
    /// number, rank 0's control header, plan changes at its boundary).
    pub fn barrier(&mut self) -> Result<OpReport> {
        let mut token = vec![0.0f32; self.world()];
        self.allreduce_f32(&mut token)
    }

    /// In-place sum allreduce of a bf16 buffer (reduced in f32, rounded back to bf16).
    pub fn allreduce_bf16(&mut self, buf: &mut [Bf16]) -> Result<OpReport> {
        let mut w = std::mem::take(&mut self.widened);
        w.clear();
        w.extend(buf.iter().map(|b| b.to_f32()));
        let r = self.allreduce_inner(Dtype::Bf16, &mut w);
        if r.is_ok() {
            for (b, &x) in buf.iter_mut().zip(&w) {
                *b = Bf16::from_f32(x);
            }
        }
        self.widened = w;
        r
    }

    /// In-place ring reduce-scatter: afterwards `buf[segment(len, world, rank)]` (the returned range)
    /// holds the sum over ranks; the rest of `buf` holds partial sums.
    pub fn reduce_scatter_f32(&mut self, buf: &mut [f32]) -> Result<(Range<usize>, OpReport)> {
        let own = segment(buf.len(), self.world(), self.rank());
        let rep = self.run(OpKind::ReduceScatter, Dtype::F32, buf, 0, |ex, buf| ex.ring_reduce_scatter(buf))?;
        Ok((own, rep))
    }

    /// In-place ring allgather: rank r contributes `buf[segment(len, world, r)]`; afterwards every rank
    /// holds every segment.
    pub fn allgather_f32(&mut self, buf: &mut [f32]) -> Result<OpReport> {
        self.run(OpKind::Allgather, Dtype::F32, buf, 0, |ex, buf| ex.ring_allgather(buf, Residual::None))
    }

    /// In-place pipelined binary-tree broadcast of `root`'s buffer.
    pub fn broadcast_f32(&mut self, buf: &mut [f32], root: usize) -> Result<OpReport> {
        self.run(OpKind::Broadcast, Dtype::F32, buf, root, |ex, buf| ex.tree_broadcast(buf, root, Residual::None))
    }
}

impl<T: Transport> Drop for Communicator<T> {
    fn drop(&mut self) {
        if self.poisoned.is_some() {
            self.transport.abort();
        } else {
            self.transport.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_without_overlap() {
        for n in [0usize, 1, 2, 7, 100, 1001] {
            for parts in 1..10 {
                let mut next = 0;
                for i in 0..parts {
                    let s = segment(n, parts, i);
                    assert_eq!(s.start, next);
                    next = s.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn rhd_final_ranges_partition_the_buffer() {
        for n in [0usize, 1, 5, 64, 1003] {
            for p in [1usize, 2, 4, 8] {
                let mut rs: Vec<_> = (0..p).map(|q| Exchange::<crate::transport::TcpTransport>::rhd_final_range(n, p, q)).collect();
                rs.sort_by_key(|r| r.start);
                let mut next = 0;
                for r in rs {
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn small_collectives_are_cut_into_a_few_chunks_of_at_least_32_kib() {
        const KIB: usize = 1 << 10;
        let f32_chunk =
            |chunk_bytes: u32, bytes: usize, compressed: bool| chunk_elems(chunk_bytes, Dtype::F32, bytes / 4, compressed) * 4;
        // 64 KiB: two 32 KiB chunks, not one 1 MiB-plan frame nor four 16 KiB ones.
        assert_eq!(f32_chunk(1 << 20, 64 * KIB, false), 32 * KIB);
        assert_eq!(f32_chunk(1 << 20, 64 * KIB, true), 32 * KIB);
        // Uncompressed, below 8 MiB: an eighth of the buffer.
        assert_eq!(f32_chunk(1 << 20, 256 * KIB, false), 32 * KIB);
        assert_eq!(f32_chunk(1 << 20, 1024 * KIB, false), 128 * KIB);
        assert_eq!(f32_chunk(1 << 20, 4096 * KIB, false), 512 * KIB);
        // Compressed, below 4 MiB: a quarter.
        assert_eq!(f32_chunk(1 << 20, 256 * KIB, true), 64 * KIB);
        assert_eq!(f32_chunk(1 << 20, 1024 * KIB, true), 256 * KIB);
        // From there on the plan's chunk stands; a smaller plan chunk always stands.
        assert_eq!(f32_chunk(1 << 20, 4096 * KIB, true), 1024 * KIB);
        assert_eq!(f32_chunk(1 << 20, 8 << 20, false), 1024 * KIB);
        assert_eq!(f32_chunk(1 << 20, 64 << 20, false), 1024 * KIB);
        assert_eq!(f32_chunk(8 * KIB as u32, 64 * KIB, false), 8 * KIB);
        // Tiny collectives: one chunk (the floor exceeds the buffer).
        assert!(chunk_elems(1 << 20, Dtype::F32, 5, false) >= 5);
        // bf16 chunks are counted in bf16 bytes, like the plan's.
        assert_eq!(chunk_elems(1 << 20, Dtype::Bf16, 128 * KIB, false), 16 * KIB);
        assert_eq!(chunk_elems(1, Dtype::Bf16, 1000, false), 1);
    }

    #[test]
    fn busbw_matches_nccl_tests_definition() {
        // 1 GB in 1 s on 8 ranks: algbw 1 GB/s, busbw 1.75 GB/s.
        assert!((allreduce_busbw(1_000_000_000, 8, 1.0) - 1.75e9).abs() < 1.0);
    }
}
