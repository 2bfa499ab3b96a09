//! Point-to-point frame transport between the ranks of a job ([`Transport`]) and its TCP
//! implementation ([`TcpTransport`]).
//!
//! ## Why std sockets and threads, not tokio
//! A collective engine does little besides moving large buffers over a handful of long-lived
//! connections (`(world − 1) × channels` per rank) and reducing them; it needs no per-request task
//! scheduling. Blocking `write_all`/`read_exact` on dedicated threads go straight to the kernel with one
//! copy into a frame buffer and no reactor wake-ups, keep the hot loop synchronous and easy to bound
//! (every wait has a deadline), and let the engine be called from plain threads (the emulated training
//! job and tests run ranks as threads). No head-to-head tokio measurement was made (time box); the
//! loopback numbers of `ringside-collective-bench busbw` are the baseline a tokio transport behind the
//! same trait would have to beat. An RDMA transport will implement the same trait behind a cargo
//! feature later.
//!
//! ## Structure and invariants
//! - The mesh is complete: for every pair (i < j) rank j opens `channels` connections to rank i. Each
//!   connection starts with a [`Hello`] in both directions (world, rank, channel count); mismatches
//!   reject the connection. Setup retries connects until the timeout, so ranks may start in any order.
//! - Per connection, a reader thread always drains the socket and parses frames into an unbounded
//!   queue (so reading the next chunk overlaps reducing the current one), and a writer thread drains
//!   an unbounded queue of ready frames, so `send` never waits for the network and ring/tree
//!   exchanges cannot deadlock on full socket buffers.
//! - `send` of a frame of at most [`DIRECT_WRITE_MAX`] bytes on a connection whose writer is idle with
//!   nothing queued first writes what the socket takes right now from the calling thread (`send(2)`
//!   with `MSG_DONTWAIT`, which never blocks) and queues only the rest: waking the writer thread for
//!   every frame was a large part of each hop at small messages (issue 12). Order is preserved: only
//!   the engine's thread enqueues, and it writes directly only when the queue is empty and the writer
//!   is not mid-write. Larger frames go to the writer, so a pipelined transfer keeps reducing while
//!   its chunks are written. The writer's socket writes time out after the configured timeout.
//! - Any connection failure (EOF without [`FrameKind::Goodbye`], I/O error, garbage) is recorded once
//!   in state shared by all connections of the rank; every later or pending `send`/`recv` on any
//!   connection returns it within [`POLL_SLICE`]. So a failure anywhere reaches every waiting call fast,
//!   and a stalled peer surfaces as [`CollectiveError::Timeout`] after at most the timeout.
//! - `seq` is assigned on send and checked on receive per directed (peer, channel) stream.
//! - [`TcpTransport::close`] is graceful (goodbye, flush, wait for the peer's goodbye up to the
//!   timeout); [`TcpTransport::abort`] shuts every socket down at once so peers learn of the failure.
//!
//! ## Transport advice
//! [`TcpTransport::set_rto_floor`] registers every connection of the mesh (all peers, all
//! channels) with a rank's [`TcpRtoFloor`]: the connections get the retransmission floor in force
//! at once and every later change of a hint's `tcp_rto_min_ms` (set by the hint follower's thread,
//! on the floor's duplicates of the sockets; see [`crate::rto`]). Nothing changes on the wire and
//! no peer is asked: the floor only shortens how long this rank's own TCP waits before it
//! retransmits. The mesh opens no connection after setup (no reconnects, no new channels), so
//! registering once after setup covers all of them; a transport that did open one later would
//! register it the same way and get the floor in force. The registration ends when the transport
//! closes or aborts.

use crate::error::{CollectiveError, Result};
use crate::rto::{RtoFloorRegistration, TcpRtoFloor};
use crate::wire::{FrameHeader, FrameKind, Hello, HEADER_LEN};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often a waiting `recv` re-checks the shared failure state.
pub const POLL_SLICE: Duration = Duration::from_millis(20);

/// How long a direct read ([`Transport::set_direct_reads`]) keeps retrying a socket with nothing to
/// read, yielding the CPU between tries, before it sleeps in poll(2). Small collectives wait tens of
/// microseconds per hop; sleeping costs a wake-up on top of that (an inter-processor interrupt to a
/// halted vCPU, then the scheduler), and a yield instead of a plain spin lets a rank sharing the core
/// (the one this rank may be waiting for) run. At 64 KiB on the 4-host star with 4 ranks on 2 vCPUs,
/// yielding for 100-400 µs raised busbw by about a quarter (docs/benchmarks.md, issue 12); a bound
/// keeps the CPU an idle wait burns small.
pub const DIRECT_READ_SPIN: Duration = Duration::from_micros(100);

/// Largest frame `send` writes from the calling thread when the connection's writer is idle: a
/// 256 KiB payload plus its header. Above it the write is left to the writer thread so that the
/// engine can go on reducing while the bytes drain (what pipelining at 1 MiB chunks needs). The
/// header is included on purpose: a 1 MiB ring allreduce on 4 ranks sends 256 KiB segments, and
/// with a limit of exactly 256 KiB every one of its frames missed the direct path by the header's
/// bytes and paid a writer wake-up per hop.
pub const DIRECT_WRITE_MAX: usize = (256 << 10) + HEADER_LEN;

/// A received frame.
#[derive(Debug)]
pub struct InFrame {
    pub header: FrameHeader,
    /// The whole frame as received: `HEADER_LEN` header bytes followed by the payload. Kept whole so
    /// that a frame can be forwarded (or reduced into and forwarded) without copying its payload:
    /// [`Transport::send`] rewrites the header in place.
    pub frame: Vec<u8>,
}

impl InFrame {
    pub fn payload(&self) -> &[u8] {
        &self.frame[HEADER_LEN..]
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.frame[HEADER_LEN..]
    }
}

/// Idle frame buffers shared by a rank's engine, reader and writer threads. Large frames are
/// recycled instead of freed: a fresh 1 MiB allocation per frame costs a page fault per 4 KiB page
/// (glibc serves it from fresh mmap or trimmed heap), which dominated the reader's CPU time.
#[derive(Default)]
pub struct BufferPool {
    idle: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// At most this many idle buffers are kept.
    const MAX_IDLE: usize = 64;
    /// Buffers smaller than this are not worth keeping.
    const MIN_KEEP: usize = 4096;

    /// A buffer with capacity for at least `cap` bytes, with unspecified length and contents.
    pub fn take(&self, cap: usize) -> Vec<u8> {
        let mut v = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
        if v.capacity() < cap {
            v.reserve_exact(cap - v.len());
        }
        v
    }

    /// A buffer for an inbound frame: `hdr`, then `payload_len` bytes for the payload to be read
    /// into. A recycled buffer keeps its old length: only bytes never initialised before get zeroed.
    fn frame_for(&self, hdr: &[u8; HEADER_LEN], payload_len: usize) -> Vec<u8> {
        let total = HEADER_LEN + payload_len;
        let mut frame = self.take(total);
        if frame.len() < total {
            frame.resize(total, 0);
        } else {
            frame.truncate(total);
        }
        frame[..HEADER_LEN].copy_from_slice(hdr);
        frame
    }

    pub fn put(&self, v: Vec<u8>) {
        if v.capacity() < Self::MIN_KEEP {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < Self::MAX_IDLE {
            idle.push(v);
        }
    }
}

/// Reliable, ordered frame delivery per (peer, channel).
pub trait Transport: Send {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// Connections per peer pair.
    fn channels(&self) -> usize;
    /// Queues a frame for `(peer, channel)`. `frame` is `HEADER_LEN` reserved bytes followed by the
    /// payload; the transport fills in seq, channel, payload length and checksum. Never blocks on the
    /// network.
    fn send(&mut self, peer: usize, channel: usize, header: FrameHeader, frame: Vec<u8>) -> Result<()>;
    /// An empty frame buffer (length `HEADER_LEN`, capacity for `HEADER_LEN + payload_capacity`
    /// bytes), possibly recycled; fill the payload after the first `HEADER_LEN` bytes.
    fn frame_buffer(&mut self, payload_capacity: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER_LEN + payload_capacity);
        v.resize(HEADER_LEN, 0);
        v
    }
    /// Hands a frame buffer that is no longer needed back for reuse.
    fn recycle(&mut self, frame: Vec<u8>) {
        drop(frame);
    }
    /// The next frame from `(peer, channel)`, waiting at most `timeout`. `op` is only used in errors.
    fn recv(&mut self, peer: usize, channel: usize, timeout: Duration, op: u64) -> Result<InFrame>;
    /// A frame from `(peer, channel)` that has already arrived, without waiting and without first
    /// consulting the shared failure state as [`Transport::recv`] does: a frame read before a peer
    /// failed is still a valid frame (the engine uses this for rank 0's control header, so that a
    /// mismatched call is reported as such even when a peer has already aborted). `None` when nothing
    /// is queued, or when the transport does not implement it (the default); the connection's own
    /// failure once the frames queued before it have been taken.
    fn recv_queued(&mut self, peer: usize, channel: usize) -> Result<Option<InFrame>> {
        let _ = (peer, channel);
        Ok(None)
    }
    /// The next frame from `(peer, channel)`: one that has already arrived even if a peer has failed
    /// since ([`Transport::recv_queued`]), else [`Transport::recv`]. What the engine receives with: a
    /// frame sent before its peer (or another) gave up is still that peer's valid data, so a rank
    /// whose last frames of a collective have all arrived completes it even when a faster peer has
    /// already aborted the *next* collective; the failure is reported at the first frame that had
    /// not arrived.
    fn recv_next(&mut self, peer: usize, channel: usize, timeout: Duration, op: u64) -> Result<InFrame> {
        match self.recv_queued(peer, channel)? {
            Some(f) => Ok(f),
            None => self.recv(peer, channel, timeout, op),
        }
    }
    /// Whether the next receives may read the network on the caller's thread instead of taking
    /// frames a receiving thread read (small collectives: no hand-off per frame). A hint; the
    /// default ignores it.
    fn set_direct_reads(&mut self, on: bool) {
        let _ = on;
    }
    /// Bytes queued for sending so far (headers included).
    fn bytes_sent(&self) -> u64;
    /// Graceful close.
    fn close(&mut self);
    /// Immediate close after a failure, so that peers notice.
    fn abort(&mut self);
}

/// Setup options of a [`TcpTransport`].
#[derive(Clone, Copy, Debug)]
pub struct TcpOptions {
    /// Connections per peer pair (plans may use 1..=channels).
    pub channels: u8,
    /// Bound on connection setup, on each wait for a frame, and on each blocked socket write.
    pub timeout: Duration,
}

impl Default for TcpOptions {
    fn default() -> Self {
        Self { channels: 1, timeout: Duration::from_secs(30) }
    }
}

/// Frames waiting for a connection's writer thread.
#[derive(Default)]
struct WriteQueue {
    state: Mutex<WriteState>,
    ready: Condvar,
}

#[derive(Default)]
struct WriteState {
    /// Frames and the offset of their first unwritten byte (non-zero after a partial direct write).
    frames: VecDeque<(Vec<u8>, usize)>,
    /// The writer thread has popped a frame and is writing it.
    writing: bool,
    /// No more frames will be queued: the writer exits once the queue is empty.
    closed: bool,
    /// The writer thread has exited (after a write error or after `closed`).
    exited: bool,
}

impl WriteQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, WriteState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `frame[from..]`; false if the writer is gone.
    fn push(&self, frame: Vec<u8>, from: usize) -> bool {
        let mut st = self.lock();
        if st.exited || st.closed {
            return false;
        }
        st.frames.push_back((frame, from));
        drop(st);
        self.ready.notify_one();
        true
    }

    /// Whether the caller may write a frame itself: nothing queued or being written.
    fn idle(&self) -> bool {
        let st = self.lock();
        !st.writing && st.frames.is_empty() && !st.closed && !st.exited
    }

    /// Lets the writer drain what is queued and exit.
    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

/// What a connection's receiving side (a TCP reader thread, or the RDMA progress thread) hands
/// the engine, one message per frame.
pub(crate) enum Inbound {
    Frame(InFrame),
    Goodbye,
    Failed(CollectiveError),
}

/// The mesh-wide failure both transports share between the engine and their threads: the first
/// failure anywhere is kept and returned by every later call.
#[derive(Default)]
pub(crate) struct SharedState {
    failure: Mutex<Option<CollectiveError>>,
    /// Set when this rank shuts its own connections down: errors after that are not peer failures.
    pub(crate) closing: AtomicBool,
}

impl SharedState {
    pub(crate) fn fail(&self, e: CollectiveError) {
        if self.closing.load(Ordering::Acquire) {
            return;
        }
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            tracing::debug!(error = %e, "transport failure");
            *f = Some(e);
        }
    }
    pub(crate) fn failure(&self) -> Option<CollectiveError> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Who reads a connection's socket: its reader thread while `armed`, the engine's thread (direct
/// reads) once the reader has `parked`. A disarmed reader finishes the read it is blocked in
/// (delivering that frame through the queue), then parks; so the engine reads the socket itself
/// only when `parked` is set, after taking what the reader queued.
struct ReadCtl {
    state: Mutex<ReadState>,
    cv: Condvar,
}

#[derive(Default)]
struct ReadState {
    armed: bool,
    parked: bool,
    stop: bool,
}

impl ReadCtl {
    fn armed() -> Self {
        ReadCtl { state: Mutex::new(ReadState { armed: true, ..ReadState::default() }), cv: Condvar::new() }
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, ReadState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn set_armed(&self, armed: bool) {
        self.lock().armed = armed;
        self.cv.notify_all();
    }
    fn stop(&self) {
        self.lock().stop = true;
        self.cv.notify_all();
    }
    /// Reader side: parks while disarmed; `false` when told to stop.
    fn wait_armed(&self) -> bool {
        let mut st = self.lock();
        if st.armed {
            return !st.stop;
        }
        st.parked = true;
        self.cv.notify_all();
        while !st.armed && !st.stop {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.parked = false;
        st.armed
    }
    /// Engine side: whether the reader is parked, waiting up to `wait` for it.
    fn parked_within(&self, wait: Duration) -> bool {
        let st = self.lock();
        if st.parked || st.armed {
            return st.parked;
        }
        let (st, _) = self.cv.wait_timeout_while(st, wait, |s| !s.parked && !s.armed).unwrap_or_else(|p| p.into_inner());
        st.parked
    }
}

/// The engine's end of one connection's inbound frames: the queue its receiving side fills, the
/// sequence number the next frame must carry, and whether the peer said goodbye. Both transports
/// deliver frames through it, so the ordering rule and the failure paths are the same for TCP and
/// RDMA.
pub(crate) struct InboundFrames {
    rx: Receiver<Inbound>,
    next_seq: u32,
    peer_said_goodbye: bool,
}

impl InboundFrames {
    /// Sequence numbers start at 1 on every connection (the hello exchange is not numbered).
    pub(crate) fn new(rx: Receiver<Inbound>) -> Self {
        Self { rx, next_seq: 1, peer_said_goodbye: false }
    }

    /// The next frame from `peer` on `channel`, in the order the peer sent it. Waits at most
    /// `timeout`, in slices of [`POLL_SLICE`] so that a failure elsewhere in the mesh (kept in
    /// `shared`) ends the wait within one slice. A frame out of sequence fails the whole mesh:
    /// the byte stream (or message order) can no longer be trusted, and every rank must stop.
    pub(crate) fn recv_in_order(
        &mut self,
        shared: &SharedState,
        peer: usize,
        channel: usize,
        timeout: Duration,
        op: u64,
    ) -> Result<InFrame> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = shared.failure() {
                return Err(e);
            }
            if self.peer_said_goodbye {
                return Err(CollectiveError::PeerClosed { peer, channel, op });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CollectiveError::Timeout { peer, channel, op, waited_ms: timeout.as_millis() as u64 });
            }
            match self.rx.recv_timeout((deadline - now).min(POLL_SLICE)) {
                Ok(Inbound::Frame(f)) => return self.in_order(shared, peer, channel, f),
                Ok(Inbound::Goodbye) => self.peer_said_goodbye = true,
                Ok(Inbound::Failed(e)) => return Err(e),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(shared.failure().unwrap_or(CollectiveError::PeerDisconnected { peer, channel }))
                }
            }
        }
    }

    /// A frame that has already arrived, without waiting and without consulting `shared` first (see
    /// [`Transport::recv_queued`]): `None` when nothing is queued; the connection's own failure once
    /// the frames before it have been taken.
    pub(crate) fn try_recv_in_order(&mut self, shared: &SharedState, peer: usize, channel: usize) -> Result<Option<InFrame>> {
        loop {
            match self.rx.try_recv() {
                Ok(Inbound::Frame(f)) => return self.in_order(shared, peer, channel, f).map(Some),
                Ok(Inbound::Goodbye) => self.peer_said_goodbye = true,
                Ok(Inbound::Failed(e)) => return Err(e),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return Ok(None),
            }
        }
    }

    /// Checks `f`'s sequence number. A frame out of sequence fails the whole mesh (see
    /// [`Self::recv_in_order`]).
    fn in_order(&mut self, shared: &SharedState, peer: usize, channel: usize, f: InFrame) -> Result<InFrame> {
        if f.header.seq != self.next_seq {
            let e = CollectiveError::UnexpectedFrame {
                peer,
                channel,
                field: "seq",
                expected: u64::from(self.next_seq),
                got: u64::from(f.header.seq),
            };
            shared.fail(e.clone());
            return Err(e);
        }
        self.next_seq = self.next_seq.wrapping_add(1);
        Ok(f)
    }

    /// At close: waits until the peer's goodbye, a failure on this connection, `deadline`, or
    /// `give_up()` (checked every [`POLL_SLICE`]). Frames still arriving were never asked for:
    /// they are logged and dropped.
    pub(crate) fn await_goodbye(&mut self, deadline: Instant, peer: usize, channel: usize, give_up: impl Fn() -> bool) {
        while !self.peer_said_goodbye && Instant::now() < deadline && !give_up() {
            match self.rx.recv_timeout(remaining(deadline).min(POLL_SLICE)) {
                Ok(Inbound::Goodbye) => self.peer_said_goodbye = true,
                Ok(Inbound::Frame(f)) => tracing::warn!(peer, channel, op = f.header.op, "unconsumed frame at close"),
                Ok(Inbound::Failed(_)) | Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

struct Connection {
    peer: usize,
    channel: usize,
    stream: TcpStream,
    read_ctl: Arc<ReadCtl>,
    out: Arc<WriteQueue>,
    inbound: InboundFrames,
    writer: Option<JoinHandle<()>>,
    reader: Option<JoinHandle<()>>,
    send_seq: u32,
}

impl Connection {
    /// One frame read on the caller's thread (the reader is parked).
    fn read_frame_direct(&mut self, shared: &SharedState, pool: &BufferPool, deadline: Instant, op: u64, timeout: Duration) -> Result<InFrame> {
        let (peer, channel) = (self.peer, self.channel);
        let what = (peer, channel, op, timeout);
        let fail = |e: CollectiveError| {
            if !matches!(e, CollectiveError::Timeout { .. }) {
                shared.fail(e.clone());
            }
            e
        };
        let mut hdr = [0u8; HEADER_LEN];
        if !read_polled(&self.stream, &mut hdr, deadline, shared, what).map_err(fail)? {
            return Err(fail(CollectiveError::PeerDisconnected { peer, channel }));
        }
        let header = FrameHeader::parse(&hdr).map_err(|error| fail(CollectiveError::BadFrame { peer, channel, error }))?;
        if header.kind == FrameKind::Goodbye {
            self.inbound.peer_said_goodbye = true;
            return Err(CollectiveError::PeerClosed { peer, channel, op });
        }
        let mut frame = pool.frame_for(&hdr, header.payload_len as usize);
        // An empty payload reads as complete, so `false` here is EOF before a non-empty payload.
        if !read_polled(&self.stream, &mut frame[HEADER_LEN..], deadline, shared, what).map_err(fail)? {
            return Err(fail(CollectiveError::PeerDisconnected { peer, channel }));
        }
        self.inbound.in_order(shared, peer, channel, InFrame { header, frame })
    }

    /// [`Transport::recv`] with direct reads: what the reader queued before it parked, then the
    /// socket.
    fn recv_direct(&mut self, shared: &SharedState, pool: &BufferPool, timeout: Duration, op: u64) -> Result<InFrame> {
        let (peer, channel) = (self.peer, self.channel);
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = shared.failure() {
                return Err(e);
            }
            if let Some(f) = self.inbound.try_recv_in_order(shared, peer, channel)? {
                return Ok(f);
            }
            if self.inbound.peer_said_goodbye {
                return Err(CollectiveError::PeerClosed { peer, channel, op });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CollectiveError::Timeout { peer, channel, op, waited_ms: timeout.as_millis() as u64 });
            }
            match self.after_park(shared, (deadline - now).min(POLL_SLICE))? {
                Parked::No => {}
                Parked::Queued(f) => return Ok(f),
                Parked::Socket => return self.read_frame_direct(shared, pool, deadline, op, timeout),
            }
        }
    }

    /// Direct reads: whether the reader has parked (waiting up to `wait`) and, if it has, the
    /// frame it queued last. The queue has to be looked at again once `parked` is seen, however
    /// recently it was found empty: the reader queues the frame it was reading, then parks, and
    /// that can fall between the caller's look and the `parked` check. Reading the socket then
    /// would take the frame after it, and fail the mesh on a sequence gap (seen under qemu-user in
    /// CI: "seq is 2, expected 1" in `recv_queued`, which lacked this second look).
    fn after_park(&mut self, shared: &SharedState, wait: Duration) -> Result<Parked> {
        if !self.read_ctl.parked_within(wait) {
            return Ok(Parked::No);
        }
        Ok(match self.inbound.try_recv_in_order(shared, self.peer, self.channel)? {
            Some(f) => Parked::Queued(f),
            None => Parked::Socket,
        })
    }
}

/// What [`Connection::after_park`] found.
enum Parked {
    /// The reader is still reading: its frame reaches the queue.
    No,
    /// The reader parked after queueing this frame.
    Queued(InFrame),
    /// The reader parked with nothing queued: the socket is the engine's to read.
    Socket,
}

/// A full TCP mesh among the ranks of one job.
pub struct TcpTransport {
    rank: usize,
    world: usize,
    options: TcpOptions,
    /// `conns[peer][channel]`; `None` for `peer == rank`.
    conns: Vec<Vec<Option<Connection>>>,
    shared: Arc<SharedState>,
    pool: Arc<BufferPool>,
    bytes_sent: u64,
    finished: bool,
    /// Receives read the sockets on the caller's thread ([`Transport::set_direct_reads`]).
    direct: bool,
    /// The connections' registration with the rank's retransmission floor, if any
    /// ([`Self::set_rto_floor`]).
    rto_floor: Option<RtoFloorRegistration>,
}

/// Fills `buf` from `s` on the caller's thread without ever blocking in read(2): `MSG_DONTWAIT`
/// reads, between them [`sched_yield(2)`](libc::sched_yield) for the first [`DIRECT_READ_SPIN`] of
/// the wait, then poll(2) in slices of [`POLL_SLICE`] (so a failure elsewhere or the deadline ends
/// the wait). `Ok(false)` on EOF before the first byte.
fn read_polled(s: &TcpStream, buf: &mut [u8], deadline: Instant, shared: &SharedState, what: (usize, usize, u64, Duration)) -> Result<bool> {
    let (peer, channel, op, timeout) = what;
    let mut got = 0;
    let mut spin_until = None;
    while got < buf.len() {
        // SAFETY: the pointer and length come from a live slice; the fd is owned by `s`.
        let n = unsafe { libc::recv(s.as_raw_fd(), buf[got..].as_mut_ptr().cast(), buf.len() - got, libc::MSG_DONTWAIT) };
        if n > 0 {
            got += n as usize;
            continue;
        }
        if n == 0 {
            if got == 0 {
                return Ok(false);
            }
            return Err(io_to_peer_error(peer, channel, ErrorKind::UnexpectedEof.into()));
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            ErrorKind::Interrupted => continue,
            ErrorKind::WouldBlock => {}
            _ => return Err(io_to_peer_error(peer, channel, e)),
        }
        if let Some(e) = shared.failure() {
            return Err(e);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(CollectiveError::Timeout { peer, channel, op, waited_ms: timeout.as_millis() as u64 });
        }
        if now < *spin_until.get_or_insert(now + DIRECT_READ_SPIN) {
            // SAFETY: no arguments; it only gives up the CPU to other runnable threads.
            unsafe { libc::sched_yield() };
            continue;
        }
        poll_readable(s, (deadline - now).min(POLL_SLICE).as_millis().max(1) as libc::c_int);
    }
    Ok(true)
}

/// poll(2) for `s` to become readable (or hung up), at most `ms` milliseconds; whether it did.
fn poll_readable(s: &TcpStream, ms: libc::c_int) -> bool {
    let mut pfd = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

fn io_to_peer_error(peer: usize, channel: usize, e: std::io::Error) -> CollectiveError {
    match e.kind() {
        ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => {
            CollectiveError::PeerDisconnected { peer, channel }
        }
        _ => CollectiveError::io(peer, channel, e),
    }
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on EOF before the first byte.
fn read_full_or_eof(s: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn reader_loop(
    mut s: TcpStream,
    peer: usize,
    channel: usize,
    tx: Sender<Inbound>,
    shared: Arc<SharedState>,
    pool: Arc<BufferPool>,
    ctl: Arc<ReadCtl>,
) {
    let mut hdr = [0u8; HEADER_LEN];
    let fail = |e: CollectiveError| {
        shared.fail(e.clone());
        let _ = tx.send(Inbound::Failed(e));
    };
    loop {
        if !ctl.wait_armed() {
            return;
        }
        match read_full_or_eof(&mut s, &mut hdr) {
            Ok(true) => {}
            Ok(false) => return fail(CollectiveError::PeerDisconnected { peer, channel }),
            Err(e) => return fail(io_to_peer_error(peer, channel, e)),
        }
        let header = match FrameHeader::parse(&hdr) {
            Ok(h) => h,
            Err(error) => return fail(CollectiveError::BadFrame { peer, channel, error }),
        };
        if header.kind == FrameKind::Goodbye {
            let _ = tx.send(Inbound::Goodbye);
            return;
        }
        let mut frame = pool.frame_for(&hdr, header.payload_len as usize);
        if let Err(e) = s.read_exact(&mut frame[HEADER_LEN..]) {
            return fail(io_to_peer_error(peer, channel, e));
        }
        if tx.send(Inbound::Frame(InFrame { header, frame })).is_err() {
            return; // transport dropped
        }
    }
}

/// The error a failed socket write stands for (a write that hit the socket's write timeout is a
/// stalled peer).
fn write_error(s: &TcpStream, peer: usize, channel: usize, e: std::io::Error) -> CollectiveError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => CollectiveError::Timeout {
            peer,
            channel,
            op: u64::MAX,
            waited_ms: s.write_timeout().ok().flatten().map_or(0, |d| d.as_millis() as u64),
        },
        _ => io_to_peer_error(peer, channel, e),
    }
}

/// One `send(2)` with `MSG_DONTWAIT`: writes what the socket buffer takes now and never waits (the
/// socket itself stays blocking for the writer thread). `WouldBlock` when it takes nothing.
fn send_nonblocking(s: &TcpStream, buf: &[u8]) -> std::io::Result<usize> {
    // SAFETY: the pointer and length come from a live slice that outlives the call, and the fd is
    // owned by `s`, which is borrowed for the call. MSG_NOSIGNAL: a closed peer is an EPIPE error,
    // not a SIGPIPE.
    let n = unsafe { libc::send(s.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn writer_loop(
    mut s: TcpStream,
    peer: usize,
    channel: usize,
    q: Arc<WriteQueue>,
    shared: Arc<SharedState>,
    pool: Arc<BufferPool>,
) {
    loop {
        let frame = {
            let mut st = q.lock();
            loop {
                if let Some(f) = st.frames.pop_front() {
                    st.writing = true;
                    break f;
                }
                if st.closed {
                    st.exited = true;
                    return;
                }
                st = q.ready.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let (frame, from) = frame;
        let written = s.write_all(&frame[from..]);
        let mut st = q.lock();
        st.writing = false;
        if let Err(e) = written {
            st.exited = true;
            st.frames.clear();
            drop(st);
            shared.fail(write_error(&s, peer, channel, e));
            return;
        }
        drop(st);
        pool.put(frame);
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))
}

/// Reads one hello frame (blocking with the stream's read timeout).
fn read_hello(s: &mut TcpStream) -> std::result::Result<(FrameHeader, Hello), String> {
    let mut hdr = [0u8; HEADER_LEN];
    s.read_exact(&mut hdr).map_err(|e| format!("reading hello header: {e}"))?;
    let h = FrameHeader::parse(&hdr).map_err(|e| e.to_string())?;
    if h.kind != FrameKind::Hello || h.seq != 0 || h.payload_len as usize != Hello::LEN {
        return Err(format!("expected a hello frame, got {:?} seq {} len {}", h.kind, h.seq, h.payload_len));
    }
    let mut p = [0u8; Hello::LEN];
    s.read_exact(&mut p).map_err(|e| format!("reading hello payload: {e}"))?;
    Ok((h, Hello::parse(&p).map_err(|e| e.to_string())?))
}

impl TcpTransport {
    /// Binds `0.0.0.0:<port of peers[rank]>` and builds the mesh.
    pub fn bind_and_connect(rank: usize, peers: &[SocketAddr], options: TcpOptions) -> Result<Self> {
        let own = *peers.get(rank).ok_or_else(|| CollectiveError::InvalidArgument {
            name: "rank",
            reason: format!("rank {rank} is outside a world of {}", peers.len()),
        })?;
        let bind: SocketAddr = match own {
            SocketAddr::V4(a) => (std::net::Ipv4Addr::UNSPECIFIED, a.port()).into(),
            SocketAddr::V6(a) => (std::net::Ipv6Addr::UNSPECIFIED, a.port()).into(),
        };
        let listener =
            TcpListener::bind(bind).map_err(|e| CollectiveError::Listen { addr: bind, source: Arc::new(e) })?;
        Self::connect(listener, rank, peers, options)
    }

    /// Builds the mesh using an already bound `listener` for this rank (tests bind port 0 first).
    /// `peers[i]` is where rank i accepts connections.
    pub fn connect(listener: TcpListener, rank: usize, peers: &[SocketAddr], options: TcpOptions) -> Result<Self> {
        let world = peers.len();
        if rank >= world {
            return Err(CollectiveError::InvalidArgument {
                name: "rank",
                reason: format!("rank {rank} is outside a world of {world}"),
            });
        }
        if options.channels == 0 {
            return Err(CollectiveError::InvalidArgument { name: "channels", reason: "must be at least 1".into() });
        }
        let k = usize::from(options.channels);
        let deadline = Instant::now() + options.timeout;
        let hello = Hello { world: world as u32, rank: rank as u32, channels: u32::from(options.channels) };
        let mut streams: Vec<Vec<Option<TcpStream>>> = (0..world).map(|_| (0..k).map(|_| None).collect()).collect();

        // Outbound: to every lower rank, k connections, retrying while the peer starts up.
        for (peer, &addr) in peers.iter().enumerate().take(rank) {
            for (ch, slot) in streams[peer].iter_mut().enumerate() {
                *slot = Some(Self::dial(peer, addr, ch, hello, deadline, options.timeout)?);
            }
        }
        // Inbound: from every higher rank.
        let expected = (world - rank - 1) * k;
        let mut connected = 0;
        listener.set_nonblocking(true).map_err(|e| CollectiveError::io(rank, 0, e))?;
        while connected < expected {
            if Instant::now() >= deadline {
                return Err(CollectiveError::AcceptTimeout {
                    connected,
                    expected,
                    waited_ms: options.timeout.as_millis() as u64,
                });
            }
            let (mut s, addr) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(e) => return Err(CollectiveError::io(rank, 0, e)),
            };
            let setup = (|| -> std::result::Result<(usize, usize), String> {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                s.set_nodelay(true).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(remaining(deadline))).map_err(|e| e.to_string())?;
                let (h, their) = read_hello(&mut s)?;
                let (peer, ch) = (their.rank as usize, usize::from(h.channel));
                if their.world as usize != world || their.channels != u32::from(options.channels) {
                    return Err(format!(
                        "peer expects world {} with {} channels, this rank has world {world} with {k}",
                        their.world, their.channels
                    ));
                }
                if peer <= rank || peer >= world || ch >= k {
                    return Err(format!("unexpected caller rank {peer} channel {ch}"));
                }
                if streams[peer][ch].is_some() {
                    return Err(format!("duplicate connection from rank {peer} channel {ch}"));
                }
                s.write_all(&hello.frame(ch as u8)).map_err(|e| e.to_string())?;
                Ok((peer, ch))
            })();
            match setup {
                Ok((peer, ch)) => {
                    streams[peer][ch] = Some(s);
                    connected += 1;
                }
                // A stranger (port scan, stale rank of another job) must not break setup.
                Err(reason) => tracing::warn!(%addr, %reason, "rejected inbound connection"),
            }
        }

        let shared = Arc::new(SharedState::default());
        let pool = Arc::new(BufferPool::default());
        let mut conns: Vec<Vec<Option<Connection>>> = Vec::with_capacity(world);
        for (peer, per_peer) in streams.into_iter().enumerate() {
            let mut row = Vec::with_capacity(k);
            for (ch, s) in per_peer.into_iter().enumerate() {
                row.push(match s {
                    None => None,
                    Some(s) => Some(Self::start_connection(peer, ch, s, &shared, &pool, options.timeout)?),
                });
            }
            conns.push(row);
        }
        Ok(Self { rank, world, options, conns, shared, pool, bytes_sent: 0, finished: false, direct: false, rto_floor: None })
    }

    fn dial(
        peer: usize,
        addr: SocketAddr,
        ch: usize,
        hello: Hello,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<TcpStream> {
        let mut last_error = String::from("no attempt made");
        let mut backoff = Duration::from_millis(10);
        while Instant::now() < deadline {
            let attempt = (|| -> std::result::Result<TcpStream, String> {
                let mut s = TcpStream::connect_timeout(&addr, remaining(deadline).min(Duration::from_secs(2)))
                    .map_err(|e| e.to_string())?;
                s.set_nodelay(true).map_err(|e| e.to_string())?;
                s.set_read_timeout(Some(remaining(deadline))).map_err(|e| e.to_string())?;
                s.write_all(&hello.frame(ch as u8)).map_err(|e| e.to_string())?;
                let (h, their) = read_hello(&mut s)?;
                if their.rank as usize != peer || usize::from(h.channel) != ch || their.world != hello.world {
                    return Err(format!(
                        "{addr} answered as rank {} of world {} on channel {}; expected rank {peer} of world {} on channel {ch}",
                        their.rank, their.world, h.channel, hello.world
                    ));
                }
                Ok(s)
            })();
            match attempt {
                Ok(s) => return Ok(s),
                Err(e) => last_error = e,
            }
            std::thread::sleep(backoff.min(remaining(deadline)));
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
        Err(CollectiveError::ConnectTimeout { peer, addr, waited_ms: timeout.as_millis() as u64, last_error })
    }

    fn start_connection(
        peer: usize,
        channel: usize,
        stream: TcpStream,
        shared: &Arc<SharedState>,
        pool: &Arc<BufferPool>,
        timeout: Duration,
    ) -> Result<Connection> {
        let err = |e| CollectiveError::io(peer, channel, e);
        stream.set_read_timeout(None).map_err(err)?;
        stream.set_write_timeout(Some(timeout)).map_err(err)?;
        let out = Arc::new(WriteQueue::default());
        let wq = out.clone();
        let (rtx, rrx) = mpsc::channel::<Inbound>();
        let read_ctl = Arc::new(ReadCtl::armed());
        let rc = read_ctl.clone();
        let ws = stream.try_clone().map_err(err)?;
        let rs = stream.try_clone().map_err(err)?;
        let (sw, sr) = (shared.clone(), shared.clone());
        let (pw, pr) = (pool.clone(), pool.clone());
        let writer = std::thread::Builder::new()
            .name(format!("tx-r{peer}c{channel}"))
            .spawn(move || writer_loop(ws, peer, channel, wq, sw, pw))
            .map_err(err)?;
        let reader = std::thread::Builder::new()
            .name(format!("rx-r{peer}c{channel}"))
            .spawn(move || reader_loop(rs, peer, channel, rtx, sr, pr, rc))
            .map_err(err)?;
        Ok(Connection {
            peer,
            channel,
            stream,
            read_ctl,
            out,
            inbound: InboundFrames::new(rrx),
            writer: Some(writer),
            reader: Some(reader),
            send_seq: 1,
        })
    }

    /// Puts every connection of the mesh (all peers, all channels) under `floor`: they get the
    /// floor in force now and every later change ([`TcpRtoFloor::advise`]), until the transport
    /// closes. Replaces an earlier registration. Never fails (see [`crate::rto`]: fail open).
    pub fn set_rto_floor(&mut self, floor: &TcpRtoFloor) {
        self.rto_floor = None;
        let reg = floor.register(self.conns.iter().flatten().flatten().map(|c| &c.stream));
        tracing::debug!(rank = self.rank, sockets = reg.sockets(), "connections registered with the TCP retransmission floor");
        self.rto_floor = Some(reg);
    }

    /// The retransmission floor the kernel holds for each connection, µs, in (peer, channel)
    /// order (`getsockopt(TCP_RTO_MIN_US)` on the transport's own sockets; an error on kernels
    /// before 6.15). For diagnostics and tests.
    pub fn connection_rto_min_us(&self) -> Vec<((usize, usize), std::io::Result<u32>)> {
        self.conns.iter().flatten().flatten().map(|c| ((c.peer, c.channel), crate::rto::rto_min_us(&c.stream))).collect()
    }

    fn conn(&mut self, peer: usize, channel: usize) -> Result<&mut Connection> {
        let (world, k) = (self.world, self.conns.first().map_or(0, Vec::len));
        self.conns
            .get_mut(peer)
            .and_then(|row| row.get_mut(channel))
            .and_then(Option::as_mut)
            .ok_or_else(|| CollectiveError::InvalidArgument {
                name: "peer/channel",
                reason: format!("no connection to rank {peer} channel {channel} (world {world}, {k} channels)"),
            })
    }

    fn all_conns(&mut self) -> impl Iterator<Item = &mut Connection> {
        self.conns.iter_mut().flatten().flatten()
    }

    fn join_threads(&mut self) {
        for c in self.all_conns() {
            c.out.close();
            if let Some(w) = c.writer.take() {
                let _ = w.join();
            }
            if let Some(r) = c.reader.take() {
                let _ = r.join();
            }
        }
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn channels(&self) -> usize {
        usize::from(self.options.channels)
    }

    fn send(&mut self, peer: usize, channel: usize, mut header: FrameHeader, mut frame: Vec<u8>) -> Result<()> {
        if let Some(e) = self.shared.failure() {
            return Err(e);
        }
        let len = frame.len();
        let c = self.conn(peer, channel)?;
        header.seq = c.send_seq;
        header.channel = channel as u8;
        header.payload_len = (len - HEADER_LEN) as u32;
        header.write(&mut frame[..HEADER_LEN]);
        c.send_seq = c.send_seq.wrapping_add(1);
        let mut from = 0;
        if len <= DIRECT_WRITE_MAX && c.out.idle() {
            // Only this thread enqueues, so the writer stays idle while we write.
            while from < len {
                match send_nonblocking(&c.stream, &frame[from..]) {
                    Ok(n) => from += n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => {
                        let e = io_to_peer_error(peer, channel, e);
                        self.shared.fail(e.clone());
                        return Err(self.shared.failure().unwrap_or(e));
                    }
                }
            }
        }
        if from == len {
            self.pool.put(frame);
        } else if !c.out.push(frame, from) {
            return Err(self.shared.failure().unwrap_or(CollectiveError::PeerDisconnected { peer, channel }));
        }
        self.bytes_sent += len as u64;
        Ok(())
    }

    fn frame_buffer(&mut self, payload_capacity: usize) -> Vec<u8> {
        let mut v = self.pool.take(HEADER_LEN + payload_capacity);
        v.truncate(HEADER_LEN);
        if v.len() < HEADER_LEN {
            v.resize(HEADER_LEN, 0);
        }
        v
    }

    fn recycle(&mut self, frame: Vec<u8>) {
        self.pool.put(frame);
    }

    fn recv(&mut self, peer: usize, channel: usize, timeout: Duration, op: u64) -> Result<InFrame> {
        let (shared, pool, direct) = (self.shared.clone(), self.pool.clone(), self.direct);
        let c = self.conn(peer, channel)?;
        if direct {
            return c.recv_direct(&shared, &pool, timeout, op);
        }
        c.inbound.recv_in_order(&shared, peer, channel, timeout, op)
    }

    fn recv_queued(&mut self, peer: usize, channel: usize) -> Result<Option<InFrame>> {
        let (shared, pool, direct, timeout) = (self.shared.clone(), self.pool.clone(), self.direct, self.options.timeout);
        let c = self.conn(peer, channel)?;
        if let Some(f) = c.inbound.try_recv_in_order(&shared, peer, channel)? {
            return Ok(Some(f));
        }
        if !direct || c.inbound.peer_said_goodbye {
            return Ok(None);
        }
        match c.after_park(&shared, Duration::ZERO)? {
            Parked::No => Ok(None),
            Parked::Queued(f) => Ok(Some(f)),
            // Direct reads: a frame that has started to arrive counts as arrived.
            Parked::Socket if !poll_readable(&c.stream, 0) => Ok(None),
            Parked::Socket => c.read_frame_direct(&shared, &pool, Instant::now() + timeout, u64::MAX, timeout).map(Some),
        }
    }

    fn set_direct_reads(&mut self, on: bool) {
        if on == self.direct {
            return;
        }
        self.direct = on;
        for c in self.all_conns() {
            c.read_ctl.set_armed(!on);
        }
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    fn close(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        // The readers take the goodbyes.
        self.set_direct_reads(false);
        let timeout = self.options.timeout;
        for c in self.all_conns() {
            let mut h = FrameHeader::new(FrameKind::Goodbye);
            h.seq = c.send_seq;
            h.channel = c.channel as u8;
            c.out.push(h.to_bytes().to_vec(), 0);
            c.out.close();
        }
        // Flush: writers exit once their queue is drained and closed.
        for c in self.all_conns() {
            if let Some(w) = c.writer.take() {
                let _ = w.join();
            }
        }
        // Wait for each peer's goodbye (or failure) so that no unread bytes make the kernel reset the
        // connection while the peer may still be reading what we sent.
        let deadline = Instant::now() + timeout;
        for c in self.all_conns() {
            c.inbound.await_goodbye(deadline, c.peer, c.channel, || false);
        }
        self.shared.closing.store(true, Ordering::Release);
        for c in self.all_conns() {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        self.rto_floor = None;
        self.join_threads();
    }

    fn abort(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.shared.closing.store(true, Ordering::Release);
        for c in self.all_conns() {
            c.read_ctl.stop();
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        self.rto_floor = None;
        self.join_threads();
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        if self.shared.failure().is_some() {
            self.abort();
        } else {
            self.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loopback mesh of two ranks, one channel.
    fn pair() -> (TcpTransport, TcpTransport) {
        let ls = [TcpListener::bind("127.0.0.1:0").unwrap(), TcpListener::bind("127.0.0.1:0").unwrap()];
        let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
        let options = TcpOptions { channels: 1, timeout: Duration::from_secs(10) };
        let [l0, l1] = ls;
        let a = addrs.clone();
        let rank0 = std::thread::spawn(move || TcpTransport::connect(l0, 0, &a, options).unwrap());
        let t1 = TcpTransport::connect(l1, 1, &addrs, options).unwrap();
        (rank0.join().unwrap(), t1)
    }

    fn send_op(t: &mut TcpTransport, op: u64) {
        let mut h = FrameHeader::new(FrameKind::Control);
        h.op = op;
        let frame = t.frame_buffer(0);
        t.send(1, 0, h, frame).unwrap();
    }

    /// `ioctl(2)` with an int result on `s` (FIONREAD: bytes waiting to be read; TIOCOUTQ: bytes
    /// sent and not yet acknowledged by the peer).
    fn ioctl_int(s: &TcpStream, request: libc::Ioctl) -> i32 {
        let mut n: libc::c_int = 0;
        // SAFETY: both requests write one int through the pointer; the fd is owned by `s`.
        assert_eq!(unsafe { libc::ioctl(s.as_raw_fd(), request, &mut n) }, 0, "{}", std::io::Error::last_os_error());
        n
    }

    /// Waits (bounded) until `cond` holds.
    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "{what}: not within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn once_the_reader_parked_a_direct_receive_takes_what_it_queued_before_the_socket() {
        let (mut t0, mut t1) = pair();
        let shared = t1.shared.clone();
        // Frame 1 while rank 1's reader is armed: wait until it has left rank 0's socket and the
        // reader has read it from rank 1's, so the reader queues it before it next looks at
        // `armed`.
        send_op(&mut t0, 1);
        let out = t0.conn(1, 0).unwrap().stream.try_clone().unwrap();
        wait_until("frame 1 acknowledged", || ioctl_int(&out, libc::TIOCOUTQ) == 0);
        let c = t1.conn(0, 0).unwrap();
        wait_until("the reader read frame 1", || ioctl_int(&c.stream, libc::FIONREAD) == 0);
        // Disarmed, the reader parks (after reading frame 2 if it was already back in read(2));
        // frame 3 stays on the socket. Frame 1 was queued before the reader parked: this is the
        // state a receive can find when the reader queued a frame and parked right after the
        // receive saw the queue empty, and the queued frame has to come before the socket's.
        t1.set_direct_reads(true);
        send_op(&mut t0, 2);
        let c = t1.conn(0, 0).unwrap();
        assert!(c.read_ctl.parked_within(Duration::from_secs(10)), "the disarmed reader did not park");
        send_op(&mut t0, 3);
        wait_until("frame 3 acknowledged", || ioctl_int(&out, libc::TIOCOUTQ) == 0);
        match c.after_park(&shared, Duration::ZERO).unwrap() {
            Parked::Queued(f) => assert_eq!((f.header.seq, f.header.op), (1, 1)),
            Parked::No => panic!("the reader parked, after_park says it did not"),
            Parked::Socket => panic!("after_park would read the socket with frame 1 queued"),
        }
        // Frame 2 from the queue or the socket, then frame 3 from the socket, in order.
        for op in [2, 3] {
            let f = t1.recv_queued(0, 0).unwrap().unwrap_or_else(|| panic!("frame {op}"));
            assert_eq!((f.header.seq, f.header.op), (op as u32, op));
        }
        assert!(t1.recv_queued(0, 0).unwrap().is_none());
        assert!(shared.failure().is_none());
        // Graceful close on both sides at once (each waits for the other's goodbye).
        let closing = std::thread::spawn(move || drop(t0));
        drop(t1);
        closing.join().unwrap();
    }
}
