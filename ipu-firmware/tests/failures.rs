//! T0: failure behaviour over loopback — disconnects, stalls, garbage and disagreements end in a
//! clear error on every rank within the timeout, never a hang and never a corrupted result.

use ipu_firmware::job::{loopback_listeners, run_ranks_in_process};
use ipu_firmware::wire::{FrameError, FrameHeader, FrameKind, Hello, HEADER_LEN};
use ipu_firmware::{
    segment, Algorithm, CodecKind, CollectiveError, Communicator, CommunicatorConfig, Compression, Plan, TcpOptions,
    TcpTransport, Transport,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn config(timeout: Duration) -> CommunicatorConfig {
    CommunicatorConfig { initial_plan: Plan::default(), timeout }
}

#[test]
fn crashed_peer_fails_every_rank_quickly() {
    let timeout = Duration::from_secs(10);
    // Everyone finishes the first allreduce before rank 2 "dies" (a crash earlier than that may
    // legitimately fail the first allreduce on the others instead).
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
    let res = run_ranks_in_process(4, TcpOptions { channels: 2, timeout }, move |rank, t| {
        let mut c = Communicator::new(t, config(timeout))?;
        let mut b = vec![1.0f32; 1000];
        c.allreduce_f32(&mut b)?;
        assert_eq!(b, vec![4.0; 1000]);
        barrier.wait();
        if rank == 2 {
            c.abort(); // as if the process died
            return Ok(Duration::ZERO);
        }
        let start = Instant::now();
        let mut b = vec![1.0f32; 1000];
        match c.allreduce_f32(&mut b) {
            Ok(_) => panic!("rank {rank}: allreduce succeeded without rank 2"),
            Err(e) => {
                assert!(
                    matches!(e, CollectiveError::PeerDisconnected { .. } | CollectiveError::PeerClosed { .. }),
                    "rank {rank}: {e}"
                );
                Ok(start.elapsed())
            }
        }
    });
    for (rank, r) in res.into_iter().enumerate() {
        let waited = r.unwrap();
        // Far below the 10 s timeout: a disconnect is reported as soon as it is seen.
        assert!(waited < Duration::from_secs(2), "rank {rank} took {waited:?}");
    }
}

#[test]
fn stalled_peer_times_out_on_every_rank() {
    let timeout = Duration::from_millis(600);
    let res = run_ranks_in_process(3, TcpOptions { channels: 1, timeout }, move |rank, t| {
        let mut c = Communicator::new(t, config(timeout))?;
        let mut b = vec![1.0f32; 100];
        c.allreduce_f32(&mut b)?;
        if rank == 1 {
            std::thread::sleep(Duration::from_millis(1500)); // stalls, connections stay open
        }
        let start = Instant::now();
        let mut b = vec![1.0f32; 100];
        let e = c.allreduce_f32(&mut b).expect_err("allreduce with a stalled rank must fail");
        Ok((e, start.elapsed()))
    });
    for (rank, r) in res.into_iter().enumerate() {
        let (e, waited) = r.unwrap();
        if rank == 1 {
            // By the time it wakes up, the others have given up on it.
            assert!(
                matches!(e, CollectiveError::PeerDisconnected { .. } | CollectiveError::Poisoned { .. }),
                "rank 1: {e}"
            );
        } else {
            assert!(
                matches!(e, CollectiveError::Timeout { .. } | CollectiveError::PeerDisconnected { .. }),
                "rank {rank}: {e}"
            );
            assert!(waited >= Duration::from_millis(500), "rank {rank} gave up early: {waited:?}");
            assert!(waited < Duration::from_millis(1200), "rank {rank} took {waited:?}");
        }
    }
}

#[test]
fn disagreeing_collectives_are_reported_not_run() {
    let timeout = Duration::from_secs(5);
    let res = run_ranks_in_process(3, TcpOptions { channels: 1, timeout }, move |rank, t| {
        let mut c = Communicator::new(t, config(timeout))?;
        let mut b = vec![1.0f32; if rank == 2 { 10 } else { 11 }];
        let start = Instant::now();
        let e = c.allreduce_f32(&mut b).expect_err("mismatched allreduce must fail");
        Ok((e, start.elapsed()))
    });
    for (rank, r) in res.into_iter().enumerate() {
        let (e, waited) = r.unwrap();
        if rank == 2 {
            assert!(
                matches!(e, CollectiveError::CollectiveMismatch { field: "element count", local: 10, announced: 11 }),
                "rank 2: {e}"
            );
        }
        assert!(waited < Duration::from_secs(2), "rank {rank} took {waited:?}: {e}");
    }
}

/// A rank that starts a collective on rank 0's promise (ranks 1..n−1 from the second collective on)
/// still checks rank 0's control header before it receives anything, and reports a disagreement as
/// `CollectiveMismatch`. The mismatch here (training step) leaves the frames well-formed, so nothing
/// else fails first; the peers then fail fast instead of hanging.
#[test]
fn disagreement_on_a_promised_collective_is_reported() {
    let timeout = Duration::from_secs(5);
    let res = run_ranks_in_process(3, TcpOptions { channels: 1, timeout }, move |rank, t| {
        let mut c = Communicator::new(t, config(timeout))?;
        let mut b = vec![1.0f32; 11];
        assert!(!c.allreduce_f32(&mut b)?.on_promise);
        c.begin_step(if rank == 2 { 5 } else { 1 });
        let start = Instant::now();
        let r = c.allreduce_f32(&mut b);
        Ok((r, start.elapsed()))
    });
    for (rank, r) in res.into_iter().enumerate() {
        let (r, waited) = r.unwrap();
        if rank == 2 {
            let e = r.expect_err("the mismatched rank must fail");
            assert!(
                matches!(e, CollectiveError::CollectiveMismatch { field: "training step", local: 5, announced: 1 }),
                "rank 2: {e}"
            );
        } else if let Err(e) = r {
            assert!(
                matches!(e, CollectiveError::PeerDisconnected { .. } | CollectiveError::PeerClosed { .. }),
                "rank {rank}: {e}"
            );
        }
        assert!(waited < Duration::from_secs(2), "rank {rank} took {waited:?}");
    }
}

/// The element-count version of `disagreeing_collectives_are_reported_not_run` on a promised
/// collective: the ranks agree on the first allreduce, then rank 2 calls the second (which ranks 1
/// and 2 start on rank 0's promise, sending before they have rank 0's header) with 10 elements
/// instead of 11. Its frames are shaped for 10 elements and have already left when it checks the
/// header. Pinned, on ring and tree:
/// - rank 2 reports `CollectiveMismatch` (element count, 10 against 11), even when a peer has
///   already aborted over its frames: the header it checks was queued before the peer's abort
///   ([`ipu_firmware::Transport::recv_queued`]);
/// - a peer that reads one of rank 2's frames reports `PeerCallMismatch` naming rank 2 (not an
///   `UnexpectedFrame`, which would read like a protocol bug);
/// - a peer that sees an abort first (rank 2's, or the first peer's) reports `PeerDisconnected`
///   (or `PeerClosed`) and nothing more specific: which peer gets which is a race.
///
/// No rank completes: every rank needs a frame from rank 2 or from a rank that gave up.
///
/// The ranks (threads of this process) meet at a barrier between the two allreduces. Without it a
/// rank still finishing the first one could see the second one's abort first and fail the first
/// one (4 of 150 runs beside a release build; the engine now takes frames that had already arrived,
/// `Transport::recv_next`, 1 of 300 after, but a frame still in the socket when another
/// connection reports the abort is not waited for). With the barrier, rank 2 could miss rank 0's
/// header when a peer's abort came first (3 of 400); it now waits for it a moment (the engine's
/// `CONTROL_GRACE`): 0 of 400 beside a release build.
#[test]
fn element_count_disagreement_on_a_promised_collective() {
    let timeout = Duration::from_secs(5);
    for algorithm in [Algorithm::Ring, Algorithm::Tree] {
        let first_done = std::sync::Arc::new(std::sync::Barrier::new(3));
        let res = run_ranks_in_process(3, TcpOptions { channels: 1, timeout }, move |rank, t| {
            let initial_plan = Plan { algorithm, ..Plan::default() };
            let mut c = Communicator::new(t, CommunicatorConfig { initial_plan, timeout })?;
            let mut b = vec![1.0f32; 11];
            assert!(!c.allreduce_f32(&mut b)?.on_promise);
            first_done.wait();
            let mut b = vec![1.0f32; if rank == 2 { 10 } else { 11 }];
            let start = Instant::now();
            let e = c.allreduce_f32(&mut b).expect_err("no rank can complete the mismatched allreduce");
            Ok((e, start.elapsed()))
        });
        for (rank, r) in res.into_iter().enumerate() {
            let (e, waited) = r.unwrap();
            if rank == 2 {
                assert!(
                    matches!(e, CollectiveError::CollectiveMismatch { field: "element count", local: 10, announced: 11 }),
                    "{algorithm:?} rank 2: {e}"
                );
            } else {
                assert!(
                    matches!(
                        e,
                        CollectiveError::PeerCallMismatch { peer: 2, op: 1, field: "elem_count", .. }
                            | CollectiveError::PeerDisconnected { .. }
                            | CollectiveError::PeerClosed { .. }
                    ),
                    "{algorithm:?} rank {rank}: {e}"
                );
            }
            assert!(waited < Duration::from_secs(2), "{algorithm:?} rank {rank} took {waited:?}: {e}");
        }
    }
}

/// What lets the mismatched rank above report its own mismatch after a peer's abort: a frame that
/// arrived before the peer failed is still handed out by `recv_queued`, while `recv` reports the
/// failure first (and leaves the frame queued); after the frame, `recv_queued` reports the failure.
#[test]
fn a_frame_queued_before_a_peer_aborted_is_still_received() {
    let timeout = Duration::from_secs(5);
    let res = run_ranks_in_process(2, TcpOptions { channels: 1, timeout }, move |rank, mut t| {
        if rank == 0 {
            let mut frame = t.frame_buffer(8);
            frame.extend_from_slice(&[7u8; 8]);
            t.send(1, 0, FrameHeader::new(FrameKind::Control), frame)?;
            std::thread::sleep(Duration::from_millis(100));
            t.abort();
            return Ok(());
        }
        // Long enough for rank 1's reader to see the abort after the frame.
        std::thread::sleep(Duration::from_millis(600));
        let e = t.recv(0, 0, Duration::from_millis(100), 0).expect_err("the abort is reported first");
        assert!(matches!(e, CollectiveError::PeerDisconnected { peer: 0, channel: 0 }), "{e}");
        let f = t.recv_queued(0, 0)?.expect("the frame read before the abort");
        assert_eq!((f.header.kind, f.payload()), (FrameKind::Control, &[7u8; 8][..]));
        // Then the failure that ended the stream.
        let e = t.recv_queued(0, 0).expect_err("the abort after the frame");
        assert!(matches!(e, CollectiveError::PeerDisconnected { peer: 0, channel: 0 }), "{e}");
        Ok(())
    });
    for (rank, r) in res.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    }
}

#[test]
fn connect_and_accept_time_out() {
    let timeout = Duration::from_millis(300);
    // Nobody listens on rank 0's address.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (mut ls, addrs) = loopback_listeners(2).unwrap();
    let start = Instant::now();
    let e = TcpTransport::connect(ls.pop().unwrap(), 1, &[dead, addrs[1]], TcpOptions { channels: 1, timeout })
        .err()
        .expect("connect must fail");
    assert!(matches!(e, CollectiveError::ConnectTimeout { peer: 0, .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(2));
    // Rank 0 waiting for a rank 1 that never comes.
    let start = Instant::now();
    let e = TcpTransport::connect(ls.pop().unwrap(), 0, &addrs, TcpOptions { channels: 1, timeout }).err().unwrap();
    assert!(matches!(e, CollectiveError::AcceptTimeout { connected: 0, expected: 1, .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(2));
}

// ---------------------------------------------------------------- a hand-written fake rank 1

const N: usize = 10;

fn data_header(op: u64, seq: u32, range: std::ops::Range<usize>) -> FrameHeader {
    FrameHeader {
        kind: FrameKind::Data,
        codec: 0,
        channel: 0,
        op,
        seq,
        payload_len: (range.len() * 4) as u32,
        elem_offset: range.start as u64,
        elem_count: range.len() as u32,
    }
}

fn data_frame(h: FrameHeader, values: &[f32]) -> Vec<u8> {
    let mut v = h.to_bytes().to_vec();
    values.iter().for_each(|x| v.extend_from_slice(&x.to_le_bytes()));
    v
}

/// Real rank 0 (ring, world 2) against a fake rank 1 that completes the handshake and then writes
/// `bytes`. Returns rank 0's allreduce outcome, its buffer afterwards, and how long it took.
fn against_fake_rank1(frames: Vec<Vec<u8>>) -> (Result<(), CollectiveError>, Vec<f32>, Duration) {
    against_fake_rank1_with(Plan::default(), frames)
}

/// [`against_fake_rank1`] with rank 0 running `plan`.
fn against_fake_rank1_with(plan: Plan, frames: Vec<Vec<u8>>) -> (Result<(), CollectiveError>, Vec<f32>, Duration) {
    let timeout = Duration::from_millis(800);
    let (mut ls, addrs) = loopback_listeners(2).unwrap();
    drop(ls.pop()); // the fake does not listen
    let l0 = ls.pop().unwrap();
    let addr0 = addrs[0];
    let fake = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr0).unwrap();
        s.write_all(&Hello { world: 2, rank: 1, channels: 1 }.frame(0)).unwrap();
        let mut reply = [0u8; HEADER_LEN + Hello::LEN];
        s.read_exact(&mut reply).unwrap();
        for f in frames {
            s.write_all(&f).unwrap();
        }
        // Keep the connection open (a stall, not a disconnect) until rank 0 is done with it.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    let t = TcpTransport::connect(l0, 0, &addrs, TcpOptions { channels: 1, timeout }).unwrap();
    let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout }).unwrap();
    let mut buf: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let start = Instant::now();
    let r = c.allreduce_f32(&mut buf).map(|_| ());
    let took = start.elapsed();
    drop(c);
    fake.join().unwrap();
    (r, buf, took)
}

fn original() -> Vec<f32> {
    (0..N).map(|i| i as f32).collect()
}

#[test]
fn fake_peer_speaking_the_protocol_completes() {
    // Positive control for the fake: correct frames give the correct sum.
    let (s0, s1) = (segment(N, 2, 0), segment(N, 2, 1));
    let frames = vec![
        data_frame(data_header(0, 1, s0.clone()), &vec![100.0; s0.len()]),
        data_frame(data_header(0, 2, s1.clone()), &vec![7.0; s1.len()]),
    ];
    let (r, buf, _) = against_fake_rank1(frames);
    r.unwrap();
    let mut want: Vec<f32> = s0.map(|i| i as f32 + 100.0).collect();
    want.extend(std::iter::repeat_n(7.0, s1.len()));
    assert_eq!(buf, want);
}

/// An int8 data frame: header for `range`, then `scale` and the bytes `q`.
fn int8_frame(op: u64, seq: u32, range: std::ops::Range<usize>, scale: f32, q: &[i8]) -> Vec<u8> {
    let mut h = data_header(op, seq, range);
    h.codec = ipu_firmware::codec::wire_id(CodecKind::Int8);
    h.payload_len = 4 + q.len() as u32;
    let mut v = h.to_bytes().to_vec();
    v.extend_from_slice(&scale.to_le_bytes());
    v.extend(q.iter().map(|&b| b as u8));
    v
}

/// A peer's well-formed int8 chunk whose values overflow f32 (scale f32::MAX, q = ±127) makes rank 0's
/// partial sum infinite; re-encoding it as the segment's owner gives int8's NaN scale, so rank 0 ends
/// the allreduce with NaN there instead of panicking (docs/fuzzing.md, finding 3: `finalize_chunk`'s
/// "a payload we just encoded decodes"). A NaN scale from the peer reads as NaN for its chunk.
#[test]
fn a_peer_int8_chunk_that_overflows_becomes_nan_not_a_panic() {
    let (s0, s1) = (segment(N, 2, 0), segment(N, 2, 1));
    for error_feedback in [false, true] {
        let plan = Plan { compression: Compression { codec: CodecKind::Int8, error_feedback }, ..Plan::default() };
        let q: Vec<i8> = (0..s0.len()).map(|i| if i % 2 == 0 { 127 } else { -127 }).collect();
        let frames = vec![
            int8_frame(0, 1, s0.clone(), f32::MAX, &q),
            int8_frame(0, 2, s1.clone(), 0.5, &vec![14i8; s1.len()]),
        ];
        let (r, buf, _) = against_fake_rank1_with(plan, frames);
        r.unwrap_or_else(|e| panic!("feedback {error_feedback}: {e}"));
        assert!(buf[s0.clone()].iter().all(|x| x.is_nan()), "feedback {error_feedback}: {buf:?}");
        assert!(buf[s1.clone()].iter().all(|&x| x == 7.0), "feedback {error_feedback}: {buf:?}");

        let frames = vec![
            int8_frame(0, 1, s0.clone(), 1.0, &vec![1i8; s0.len()]),
            int8_frame(0, 2, s1.clone(), f32::NAN, &vec![3i8; s1.len()]),
        ];
        let (r, buf, _) = against_fake_rank1_with(plan, frames);
        r.unwrap_or_else(|e| panic!("feedback {error_feedback}: {e}"));
        assert!(buf[s0.clone()].iter().all(|x| x.is_finite()), "feedback {error_feedback}: {buf:?}");
        assert!(buf[s1.clone()].iter().all(|x| x.is_nan()), "feedback {error_feedback}: {buf:?}");
    }
}

/// A negative int8 scale is malformed: the collective fails with a bad frame and the buffer keeps
/// its values.
#[test]
fn a_negative_int8_scale_is_rejected() {
    let s0 = segment(N, 2, 0);
    let plan = Plan { compression: Compression { codec: CodecKind::Int8, error_feedback: false }, ..Plan::default() };
    let (r, buf, _) = against_fake_rank1_with(plan, vec![int8_frame(0, 1, s0.clone(), -1.0, &vec![1i8; s0.len()])]);
    let e = r.expect_err("a negative scale must fail the allreduce");
    assert!(matches!(e, CollectiveError::BadFrame { peer: 1, error: FrameError::MalformedPayload { .. }, .. }), "{e}");
    assert_eq!(buf, original());
}

fn assert_garbage_rejected(frames: Vec<Vec<u8>>, check: impl Fn(&CollectiveError) -> bool) {
    let (r, buf, took) = against_fake_rank1(frames);
    let e = r.expect_err("garbage must fail the allreduce");
    assert!(check(&e), "unexpected error: {e}");
    assert_eq!(buf, original(), "garbage leaked into the result");
    assert!(took < Duration::from_millis(700), "took {took:?}: detected by timeout, not by validation");
}

#[test]
fn bad_magic_is_rejected() {
    let mut f = data_frame(data_header(0, 1, segment(N, 2, 0)), &[1.0; 5]);
    f[0..4].copy_from_slice(b"HTTP");
    assert_garbage_rejected(vec![f], |e| {
        matches!(e, CollectiveError::BadFrame { peer: 1, error: FrameError::BadMagic { .. }, .. })
    });
}

#[test]
fn corrupted_header_is_rejected() {
    let mut f = data_frame(data_header(0, 1, segment(N, 2, 0)), &[1.0; 5]);
    f[26] ^= 0x10; // elem_offset bit, checksum no longer matches
    assert_garbage_rejected(vec![f], |e| {
        matches!(e, CollectiveError::BadFrame { error: FrameError::HeaderChecksum { .. }, .. })
    });
}

#[test]
fn wrong_op_is_rejected() {
    let f = data_frame(data_header(7, 1, segment(N, 2, 0)), &[1.0; 5]);
    assert_garbage_rejected(vec![f], |e| {
        matches!(e, CollectiveError::UnexpectedFrame { field: "op", expected: 0, got: 7, .. })
    });
}

#[test]
fn wrong_sequence_is_rejected() {
    let f = data_frame(data_header(0, 5, segment(N, 2, 0)), &[1.0; 5]);
    assert_garbage_rejected(vec![f], |e| {
        matches!(e, CollectiveError::UnexpectedFrame { field: "seq", expected: 1, got: 5, .. })
    });
}

#[test]
fn wrong_range_is_rejected() {
    let f = data_frame(data_header(0, 1, 0..4), &[1.0; 4]);
    assert_garbage_rejected(vec![f], |e| matches!(e, CollectiveError::UnexpectedFrame { field: "elem_count", .. }));
}

#[test]
fn wrong_payload_length_is_rejected() {
    let mut h = data_header(0, 1, segment(N, 2, 0));
    h.payload_len = 3;
    let mut f = h.to_bytes().to_vec();
    f.extend_from_slice(&[1, 2, 3]);
    assert_garbage_rejected(vec![f], |e| {
        matches!(e, CollectiveError::BadFrame { error: FrameError::PayloadLength { .. }, .. })
    });
}

#[test]
fn oversized_length_is_rejected_without_allocating() {
    let mut h = data_header(0, 1, segment(N, 2, 0));
    h.payload_len = u32::MAX;
    assert_garbage_rejected(vec![h.to_bytes().to_vec()], |e| {
        matches!(e, CollectiveError::BadFrame { error: FrameError::PayloadTooLong { .. }, .. })
    });
}

#[test]
fn silent_peer_times_out() {
    let (r, buf, took) = against_fake_rank1(vec![]);
    assert!(matches!(r, Err(CollectiveError::Timeout { peer: 1, .. })), "{r:?}");
    assert_eq!(buf, original());
    assert!(took >= Duration::from_millis(700) && took < Duration::from_millis(1500), "{took:?}");
}

/// A rank that dies between two small rhd allreduces (the recursive-doubling path, where each rank
/// talks to only log2(p) partners) still fails every other rank fast, including ranks that never
/// exchange data with it in that collective: the mesh is complete, so every rank sees its
/// connections to the dead rank close.
#[test]
fn crashed_peer_fails_every_rank_quickly_in_recursive_doubling() {
    let timeout = Duration::from_secs(10);
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(5));
    let plan = Plan { algorithm: ipu_firmware::Algorithm::Rhd, ..Plan::default() };
    let res = run_ranks_in_process(5, TcpOptions { channels: 1, timeout }, move |rank, t| {
        let mut c = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout })?;
        let mut b = vec![1.0f32; 1000];
        c.allreduce_f32(&mut b)?;
        assert_eq!(b, vec![5.0; 1000]);
        barrier.wait();
        if rank == 3 {
            c.abort();
            return Ok(Duration::ZERO);
        }
        let start = Instant::now();
        let mut b = vec![1.0f32; 1000];
        match c.allreduce_f32(&mut b) {
            Ok(_) => panic!("rank {rank}: allreduce succeeded without rank 3"),
            Err(e) => {
                assert!(
                    matches!(e, CollectiveError::PeerDisconnected { .. } | CollectiveError::PeerClosed { .. }),
                    "rank {rank}: {e}"
                );
                Ok(start.elapsed())
            }
        }
    });
    for (rank, r) in res.into_iter().enumerate() {
        let waited = r.unwrap();
        assert!(waited < Duration::from_secs(2), "rank {rank} took {waited:?}");
    }
}
