//! The collective engine consuming a peer's frames (`ipu_firmware::Communicator` over a scripted
//! [`Transport`]): rank 0's control headers, plan votes and data chunks as a 2-rank job receives
//! them, through ring, tree and halving-doubling allreduce, broadcast, allgather and
//! reduce-scatter, each codec, plan promises and plan votes. Every frame is validated before it
//! touches a result (the crate's invariants); this target holds the engine to that.
//!
//! Input: `flags | call | elems | plan | chunk`, then frames, each `channel (u8) | 40-byte header
//! | payload` (the payload as long as the header says). Flags bit 0: this rank is 1 (else 0), bit
//! 1: two channels per peer, bit 2: plan votes. `call % 5`: allreduce f32, allreduce bf16,
//! broadcast (root `call / 5 % 2`), allgather, reduce-scatter; two collectives run, at training
//! steps 0 and 1. `elems + 1` elements. Rank 0's plan: algorithm `plan % 3`, codec `plan / 3 % 5`,
//! error feedback bit 7, `4 << (chunk % 16)` bytes a chunk. Headers get their checksum written
//! (the transport's check is `ipu_frame`'s); a header that does not parse ends the peer's stream
//! there, as the transport fails the connection.
//!
//! Checked: no panic and no send to a peer or channel that does not exist; a collective that
//! succeeds on rank 1 took a control header from rank 0 for it that announces exactly this call
//! and the plan it reports; a collective that fails poisons the communicator.
#![no_main]

use std::collections::VecDeque;
use std::time::Duration;

use ipu_firmware::codec::{from_wire_id, Bf16};
use ipu_firmware::error::Result;
use ipu_firmware::plan::{ControlHeader, OpKind, PlanProposal, PlanVoter};
use ipu_firmware::transport::InFrame;
use ipu_firmware::wire::{header_checksum, FrameHeader, FrameKind, HEADER_LEN};
use ipu_firmware::{Algorithm, CollectiveError, Communicator, CommunicatorConfig, Compression, Dtype, OpReport, Plan, Transport};
use libfuzzer_sys::fuzz_target;

const WORLD: usize = 2;

/// One rank's view of a 2-rank mesh whose peer is the fuzz input.
struct Scripted {
    rank: usize,
    channels: usize,
    inbound: Vec<VecDeque<InFrame>>,
    /// Control frames handed to the engine: (op, payload).
    controls: Vec<(u64, Vec<u8>)>,
    sent: u64,
}

impl Scripted {
    fn take(&mut self, peer: usize, channel: usize, op: u64) -> Result<InFrame> {
        assert!(peer < WORLD && peer != self.rank && channel < self.channels, "receive from peer {peer} channel {channel}");
        let f = self.inbound[channel].pop_front().ok_or(CollectiveError::PeerClosed { peer, channel, op })?;
        if f.header.kind == FrameKind::Control {
            self.controls.push((f.header.op, f.payload().to_vec()));
        }
        Ok(f)
    }
}

impl Transport for Scripted {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        WORLD
    }
    fn channels(&self) -> usize {
        self.channels
    }
    fn send(&mut self, peer: usize, channel: usize, _header: FrameHeader, frame: Vec<u8>) -> Result<()> {
        assert!(peer < WORLD && peer != self.rank && channel < self.channels, "send to peer {peer} channel {channel}");
        assert!(frame.len() >= HEADER_LEN);
        self.sent += frame.len() as u64;
        Ok(())
    }
    fn recv(&mut self, peer: usize, channel: usize, _timeout: Duration, op: u64) -> Result<InFrame> {
        self.take(peer, channel, op)
    }
    // Nothing more will arrive: a frame not queued is the connection's end, at once (the engine's
    // grace period for a late control header would otherwise sleep for a second).
    fn recv_queued(&mut self, peer: usize, channel: usize) -> Result<Option<InFrame>> {
        self.take(peer, channel, u64::MAX).map(Some)
    }
    fn bytes_sent(&self) -> u64 {
        self.sent
    }
    fn close(&mut self) {}
    fn abort(&mut self) {}
}

/// Rank 0's voter: abstains (the peer's vote is what is fuzzed).
struct Abstain;

impl PlanVoter for Abstain {
    fn propose(&mut self, _step: u64) -> Option<PlanProposal> {
        None
    }
}

#[derive(Clone, Copy, Debug)]
enum Call {
    Allreduce,
    AllreduceBf16,
    Broadcast(usize),
    Allgather,
    ReduceScatter,
}

impl Call {
    fn kind(self) -> (OpKind, Dtype, usize) {
        match self {
            Call::Allreduce => (OpKind::Allreduce, Dtype::F32, 0),
            Call::AllreduceBf16 => (OpKind::Allreduce, Dtype::Bf16, 0),
            Call::Broadcast(root) => (OpKind::Broadcast, Dtype::F32, root),
            Call::Allgather => (OpKind::Allgather, Dtype::F32, 0),
            Call::ReduceScatter => (OpKind::ReduceScatter, Dtype::F32, 0),
        }
    }

    fn run<T: Transport>(self, comm: &mut Communicator<T>, elems: usize) -> Result<OpReport> {
        let mut buf: Vec<f32> = (0..elems).map(|i| i as f32 * 0.5 - 3.0).collect();
        match self {
            Call::Allreduce => comm.allreduce_f32(&mut buf),
            Call::AllreduceBf16 => {
                let mut b: Vec<Bf16> = buf.iter().map(|&x| Bf16::from_f32(x)).collect();
                comm.allreduce_bf16(&mut b)
            }
            Call::Broadcast(root) => comm.broadcast_f32(&mut buf, root),
            Call::Allgather => comm.allgather_f32(&mut buf),
            Call::ReduceScatter => comm.reduce_scatter_f32(&mut buf).map(|(_, r)| r),
        }
    }
}

/// The frames of the input, per channel, up to the first header that does not parse.
fn frames(mut rest: &[u8], channels: usize) -> Vec<VecDeque<InFrame>> {
    let mut inbound: Vec<VecDeque<InFrame>> = (0..channels).map(|_| VecDeque::new()).collect();
    while rest.len() > HEADER_LEN {
        let channel = usize::from(rest[0]) % channels;
        let mut frame = rest[1..1 + HEADER_LEN].to_vec();
        let sum = header_checksum(&frame[..HEADER_LEN - 4]);
        frame[HEADER_LEN - 4..].copy_from_slice(&sum.to_le_bytes());
        let Ok(header) = FrameHeader::parse(&frame) else { break };
        let body = &rest[1 + HEADER_LEN..];
        let Some(payload) = body.get(..header.payload_len as usize) else { break };
        frame.extend_from_slice(payload);
        rest = &body[payload.len()..];
        inbound[channel].push_back(InFrame { header, frame });
    }
    inbound
}

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<5>() else { return };
    let [flags, call, elems, plan, chunk] = *head;
    let rank = usize::from(flags & 1);
    let channels = if flags & 2 != 0 { 2 } else { 1 };
    let call = match call % 5 {
        0 => Call::Allreduce,
        1 => Call::AllreduceBf16,
        2 => Call::Broadcast(usize::from(call / 5 % 2)),
        3 => Call::Allgather,
        _ => Call::ReduceScatter,
    };
    let elems = usize::from(elems) + 1;
    let initial = Plan {
        step_from: 0,
        algorithm: Algorithm::ALL[usize::from(plan & 0x7f) % 3],
        chunk_bytes: 4 << (chunk % 16),
        channels: 1 + (chunk >> 7) % channels as u8,
        compression: Compression { codec: from_wire_id(plan / 3 % 5, 0.25).expect("ids 0..5"), error_feedback: plan & 0x80 != 0 },
    };
    let inbound = frames(rest, channels);
    let transport = Scripted { rank, channels, inbound, controls: Vec::new(), sent: 0 };
    let config = CommunicatorConfig { initial_plan: if rank == 0 { initial } else { Plan::default() }, timeout: Duration::from_millis(1) };
    let mut comm = Communicator::new(transport, config).expect("a valid initial plan");
    if flags & 4 != 0 {
        comm.set_plan_voter(Box::new(Abstain));
    }
    let (op_kind, dtype, root) = call.kind();
    for step in 0..2u64 {
        comm.begin_step(step);
        match call.run(&mut comm, elems) {
            Ok(report) => {
                assert_eq!(report.op, step);
                if rank == 1 {
                    let (_, payload) = comm.transport().controls.iter().rev().find(|(op, _)| *op == step).expect("a control header for the collective");
                    let c = ControlHeader::parse(payload).expect("the control header it took parses");
                    assert_eq!((c.op_kind, c.dtype, c.elems, c.root as usize, c.training_step), (op_kind, dtype, elems as u64, root, step));
                    assert_eq!(c.plan, report.plan);
                }
            }
            Err(_) => {
                let again = call.run(&mut comm, elems);
                assert!(matches!(again, Err(CollectiveError::Poisoned { .. })), "a failed communicator ran again: {again:?}");
                return;
            }
        }
    }
});
