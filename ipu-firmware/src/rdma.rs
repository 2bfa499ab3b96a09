//! The RDMA transport ([`RdmaTransport`], cargo feature `rdma`): the engine's [`Transport`] over
//! reliable-connected (RC) queue pairs on the `ibverbs` crate, with two-sided SEND/RECV into a
//! fixed pool of registered buffers.
//!
//! ## Setup
//! 1. Open the device ([`probe`] runs the same steps without keeping anything): the named device,
//!    or the first one in `ibv_get_device_list` whose port 1 is ACTIVE (the `ibverbs` crate
//!    queries port 1 only). Pick a GID: the configured index, else the first RoCE v2 entry with an
//!    IPv4-mapped address, else the first RoCE v2 entry, else entry 0; no GID table means LID
//!    routing (InfiniBand without GRH).
//! 2. On a dedicated progress thread: one protection domain, one send and one receive completion
//!    queue, one registered send region (`send_slots × slot_bytes`), one registered receive region
//!    (`recv_slots × slot_bytes` per connection) and one RC queue pair per (peer, channel).
//! 3. Bootstrap over TCP at the same addresses the TCP transport uses (rank j dials every rank
//!    i < j, `channels` times, and retries until the timeout while ranks start): each side sends a
//!    [`BootstrapRecord`] (world, rank, channel, QP number, PSN, LID, GID, slot size, receive
//!    slots) and checks the other's. Then each QP goes INIT → RTR → RTS against the peer's
//!    record, every receive buffer is posted, and both sides exchange one `READY` byte, so no
//!    SEND reaches a QP that is not yet ready to receive. No rkey is exchanged: SEND/RECV needs
//!    none, and the QPs are created with local-write access only, so a peer cannot read or write
//!    this rank's memory even though `ibverbs` registers regions with remote access bits.
//! 4. The bootstrap sockets stay open as a liveness signal: EOF from a peer that has not said
//!    goodbye (its process died) fails the mesh within [`LIVENESS_GRACE`], without waiting for the
//!    RC retry timeout of a send that may never be posted.
//!
//! ## Data path and invariants
//! - A frame (the engine's `HEADER_LEN` header + payload) travels as one or more messages of at
//!   most `slot_bytes`; each message starts with an 8-byte `Prefix` (kind, and the absolute
//!   count of the peer's messages this rank has consumed: the credit return). RC delivers messages
//!   of one QP reliably and in order, so the receiver reassembles by the length in the frame
//!   header, which is validated ([`FrameHeader::parse`]) before a byte is kept.
//! - Registered memory is bounded and allocated once: nothing is registered on the data path.
//!   `send` copies the frame into free send slots (one copy, like the TCP transport's socket
//!   write) on the progress thread; a slot is reused only after its send completion.
//! - Flow control is credit based (`Credits`): a sender keeps at most `window = min(own, peer
//!   recv_slots) − 2` data messages unconsumed by the peer; the receiver reposts a buffer as soon
//!   as it copied the message out (independently of the engine) and returns credits in every
//!   message, or in a credit-only message once `window / 2` were consumed since the last return
//!   (at most one credit-only message in flight per connection). Credit-only messages bypass the
//!   window, so credits can always flow; window + 1 in-flight credit message stays below the
//!   receive pool, so a message always finds a posted buffer (the two-end simulation in the tests
//!   checks this). The QPs also retry RNR NAKs without limit (`rnr_retry = 7`) as a safety net: a
//!   message that found no buffer would wait for one instead of failing the QP.
//! - Frames received but not yet taken by the engine queue up unbounded, as in the TCP transport;
//!   the collectives' lock-step exchange bounds them in practice.
//! - `seq` is assigned on send and checked on receive per (peer, channel), as in TCP.
//! - Failures (an error work completion, a failed post, garbage, a peer's EOF) are recorded once
//!   and returned by every later or pending call within [`POLL_SLICE`](crate::transport::POLL_SLICE). Every wait has a
//!   deadline: setup within the timeout, each `recv` within its timeout, close's flush and goodbye
//!   wait within the timeout.
//! - Closing mirrors TCP: a goodbye frame per connection, flush, wait for each peer's goodbye,
//!   then the progress thread stops and the verbs objects are destroyed in dependency order (QPs,
//!   memory regions, CQs, PD, device context: the reverse of their declaration in
//!   `progress_main`). [`RdmaTransport::abort`] shuts the bootstrap sockets at once.
//!
//! ## What runs where
//! The machines that build and test ringside have no RDMA device and no Soft-RoCE, so CI builds
//! this module against Debian's rdma-core, runs its pure parts (bootstrap record, prefix, GID
//! choice) and the device probe, and checks that `auto` falls back to TCP. Queue-pair setup and
//! the data path need a device and are not exercised there (docs/testing.md).
//!
//! ## Unsafe
//! Only the two posting calls: `ibverbs` marks `post_send`/`post_receive` unsafe because the
//! device reads/writes the posted range after the call returns. Each call site says why the range
//! is not touched (or freed) until its completion is polled.

use crate::error::{CollectiveError, Result};
use crate::transport::{BufferPool, InFrame, Inbound, InboundFrames, SharedState, TcpOptions, Transport};
use crate::wire::{header_checksum, FrameError, FrameHeader, FrameKind, HEADER_LEN, MAGIC as FRAME_MAGIC};
use ibverbs::{ibv_qp_type, CompletionQueue, Context, MemoryRegion, QueuePair, QueuePairEndpoint};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// How long a peer's bootstrap socket may be at EOF before its goodbye arrives: the goodbye's
/// completion and the socket close race (the peer closes once its goodbye was acknowledged).
pub const LIVENESS_GRACE: Duration = Duration::from_millis(200);

/// How often the progress thread checks the bootstrap sockets.
const LIVENESS_EVERY: Duration = Duration::from_millis(20);

/// Setup options of an [`RdmaTransport`].
#[derive(Clone, Debug)]
pub struct RdmaOptions {
    /// QPs per peer pair (plans may use 1..=channels).
    pub channels: u8,
    /// Bound on setup, on each wait for a frame, and on close.
    pub timeout: Duration,
    /// Device name as `ibv_devices` prints it; `None` takes the first device that opens.
    pub device: Option<String>,
    /// GID table index; `None` chooses one (see the module docs).
    pub gid_index: Option<u32>,
    /// Size of one registered buffer, i.e. the largest message (prefix included).
    pub slot_bytes: usize,
    /// Receive buffers posted per connection.
    pub recv_slots: usize,
    /// Send buffers shared by all connections of the rank.
    pub send_slots: usize,
}

impl RdmaOptions {
    /// Registered memory per rank: `(send_slots + connections × recv_slots) × slot_bytes`; with
    /// these defaults 8 MiB plus 2 MiB per connection.
    pub const DEFAULT_SLOT_BYTES: usize = 128 << 10;
    pub const DEFAULT_RECV_SLOTS: usize = 16;
    pub const DEFAULT_SEND_SLOTS: usize = 64;

    pub fn from_tcp(o: TcpOptions) -> Self {
        Self {
            channels: o.channels,
            timeout: o.timeout,
            device: None,
            gid_index: None,
            slot_bytes: Self::DEFAULT_SLOT_BYTES,
            recv_slots: Self::DEFAULT_RECV_SLOTS,
            send_slots: Self::DEFAULT_SEND_SLOTS,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |name, reason: &str| Err(CollectiveError::InvalidArgument { name, reason: reason.into() });
        if self.channels == 0 {
            return bad("channels", "must be at least 1");
        }
        // The first message of a frame must hold the whole frame header.
        if self.slot_bytes < Prefix::LEN + HEADER_LEN || self.slot_bytes > u32::MAX as usize {
            return bad("slot_bytes", "must hold an 8-byte prefix and a 40-byte frame header, and fit in u32");
        }
        // Two receive buffers are headroom for credit-only messages (see the module docs).
        if self.recv_slots < 4 || self.recv_slots > 4096 {
            return bad("recv_slots", "must be in 4..=4096");
        }
        if self.send_slots == 0 || self.send_slots > 1 << 16 {
            return bad("send_slots", "must be in 1..=65536");
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Pure parts: bootstrap record, message prefix, GID choice.

/// `b"RSRD"` read as a little-endian u32: an RDMA bootstrap record (the TCP transport's frames
/// start with [`FRAME_MAGIC`], `b"RSG1"`).
pub const BOOTSTRAP_MAGIC: u32 = u32::from_le_bytes(*b"RSRD");
/// Bootstrap record version; bump on any incompatible change of the record or the data path.
pub const BOOTSTRAP_VERSION: u8 = 1;
/// The byte each side sends once its QP is ready to receive.
const READY: u8 = 0x52;

/// What one side tells the other about one (peer, channel) connection, as it is on the wire.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct WireBootstrap {
    pub magic: U32,
    pub version: u8,
    pub channel: u8,
    /// Bit 0: `gid` is valid (global routing).
    pub flags: u8,
    pub reserved0: u8,
    pub world: U32,
    pub rank: U32,
    pub channels: U32,
    pub qp_num: U32,
    pub psn: U32,
    pub lid: U16,
    pub reserved1: U16,
    pub gid: [u8; 16],
    pub slot_bytes: U32,
    pub recv_slots: U32,
    pub reserved2: U32,
    /// FNV-1a ([`header_checksum`]) over every byte before it.
    pub checksum: U32,
}

const _: () = assert!(std::mem::size_of::<WireBootstrap>() == BootstrapRecord::LEN);
const BOOTSTRAP_CHECKSUM_AT: usize = std::mem::offset_of!(WireBootstrap, checksum);

/// One side's description of one connection: who it is, which mesh it expects, and how to reach
/// its queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootstrapRecord {
    pub world: u32,
    pub rank: u32,
    pub channels: u32,
    pub channel: u8,
    pub qp_num: u32,
    /// The first packet sequence number of the sender's send queue (its peer's receive PSN).
    pub psn: u32,
    pub lid: u16,
    pub gid: Option<[u8; 16]>,
    pub slot_bytes: u32,
    pub recv_slots: u32,
}

/// Why bootstrap bytes are not a record this build accepts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapError {
    #[error("the peer speaks the TCP transport (its first bytes are a TCP hello); every rank of a job needs the same --transport, and `auto` picked RDMA here: use --transport tcp on every rank, or give every host an RDMA device")]
    PeerUsesTcp,
    #[error("bad bootstrap magic {got:#010x} (expected {BOOTSTRAP_MAGIC:#010x}); the peer is not a ringside RDMA rank")]
    BadMagic { got: u32 },
    #[error("bootstrap version {got} (this build speaks {BOOTSTRAP_VERSION}); run the same ringside build on every rank")]
    UnsupportedVersion { got: u8 },
    #[error("bootstrap checksum {got:#010x} does not match computed {computed:#010x}")]
    Checksum { got: u32, computed: u32 },
    #[error("truncated bootstrap record: {got} of {} bytes", BootstrapRecord::LEN)]
    Truncated { got: usize },
}

impl BootstrapRecord {
    pub const LEN: usize = 64;

    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut w = WireBootstrap {
            magic: BOOTSTRAP_MAGIC.into(),
            version: BOOTSTRAP_VERSION,
            channel: self.channel,
            flags: u8::from(self.gid.is_some()),
            reserved0: 0,
            world: self.world.into(),
            rank: self.rank.into(),
            channels: self.channels.into(),
            qp_num: self.qp_num.into(),
            psn: self.psn.into(),
            lid: self.lid.into(),
            reserved1: 0.into(),
            gid: self.gid.unwrap_or_default(),
            slot_bytes: self.slot_bytes.into(),
            recv_slots: self.recv_slots.into(),
            reserved2: 0.into(),
            checksum: 0.into(),
        };
        w.checksum = header_checksum(&w.as_bytes()[..BOOTSTRAP_CHECKSUM_AT]).into();
        zerocopy::transmute!(w)
    }

    pub fn parse(b: &[u8]) -> std::result::Result<Self, BootstrapError> {
        let (w, _) = WireBootstrap::ref_from_prefix(b).map_err(|_| BootstrapError::Truncated { got: b.len() })?;
        let magic = w.magic.get();
        if magic == FRAME_MAGIC {
            return Err(BootstrapError::PeerUsesTcp);
        }
        if magic != BOOTSTRAP_MAGIC {
            return Err(BootstrapError::BadMagic { got: magic });
        }
        if w.version != BOOTSTRAP_VERSION {
            return Err(BootstrapError::UnsupportedVersion { got: w.version });
        }
        let (got, computed) = (w.checksum.get(), header_checksum(&w.as_bytes()[..BOOTSTRAP_CHECKSUM_AT]));
        if got != computed {
            return Err(BootstrapError::Checksum { got, computed });
        }
        Ok(Self {
            world: w.world.get(),
            rank: w.rank.get(),
            channels: w.channels.get(),
            channel: w.channel,
            qp_num: w.qp_num.get(),
            psn: w.psn.get(),
            lid: w.lid.get(),
            gid: (w.flags & 1 != 0).then_some(w.gid),
            slot_bytes: w.slot_bytes.get(),
            recv_slots: w.recv_slots.get(),
        })
    }

    /// Checks a peer's record against what this side expects; the reason says what differs.
    fn check(&self, expect_rank: usize, expect_channel: usize, mine: &BootstrapRecord) -> std::result::Result<(), String> {
        if self.world != mine.world || self.channels != mine.channels {
            return Err(format!(
                "peer expects world {} with {} channels, this rank has world {} with {}",
                self.world, self.channels, mine.world, mine.channels
            ));
        }
        if self.rank as usize != expect_rank || usize::from(self.channel) != expect_channel {
            return Err(format!(
                "answered as rank {} channel {}; expected rank {expect_rank} channel {expect_channel}",
                self.rank, self.channel
            ));
        }
        if self.gid.is_some() != mine.gid.is_some() {
            return Err("one side routes by GID (RoCE or IB with GRH), the other by LID only; use the same kind of device on every rank".into());
        }
        if (self.slot_bytes as usize) < Prefix::LEN + HEADER_LEN || self.recv_slots < 4 {
            return Err(format!("peer's buffers are unusable: {} slots of {} bytes", self.recv_slots, self.slot_bytes));
        }
        // `ibverbs` 0.9 starts every send queue at PSN 0 and every receive queue expects 0 (it
        // has no way to set them per peer after the QP is built); a peer starting elsewhere would
        // have every packet dropped as out of sequence.
        if self.psn != mine.psn {
            return Err(format!("peer's first packet sequence number is {}, this rank expects {}", self.psn, mine.psn));
        }
        Ok(())
    }
}

/// The 8 bytes in front of every RDMA message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Prefix {
    kind: MessageKind,
    /// How many of the receiver's messages the sender has consumed so far (wrapping): the
    /// receiver's credit return.
    consumed: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum MessageKind {
    /// A piece of a frame.
    Fragment = 1,
    /// Only the credit return.
    Credit = 2,
}

impl Prefix {
    const LEN: usize = 8;

    fn write(&self, out: &mut [u8]) {
        out[0] = self.kind as u8;
        out[1..4].fill(0);
        out[4..8].copy_from_slice(&self.consumed.to_le_bytes());
    }

    fn parse(b: &[u8]) -> Option<Self> {
        let kind = match *b.first()? {
            1 => MessageKind::Fragment,
            2 => MessageKind::Credit,
            _ => return None,
        };
        let consumed = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?);
        Some(Self { kind, consumed })
    }
}

/// One entry of a device's GID table, as far as choosing one goes.
#[derive(Clone, Copy, Debug)]
struct GidChoice {
    /// Position in `Context::gid_table()` (must equal `index` for `ibverbs` to accept it).
    position: usize,
    index: u32,
    roce_v2: bool,
    ipv4_mapped: bool,
}

/// Picks the GID table position to use: the configured index if present in the table, else the
/// first RoCE v2 IPv4-mapped entry, else the first RoCE v2 entry, else the first entry.
/// `Ok(None)`: the table is empty (LID routing).
fn choose_gid(table: &[GidChoice], configured: Option<u32>) -> std::result::Result<Option<usize>, String> {
    // `ibverbs` indexes its (compacted) table by the GID index: only entries where the two agree
    // are usable.
    let usable = || table.iter().filter(|g| g.position == g.index as usize);
    if let Some(want) = configured {
        return usable()
            .find(|g| g.index == want)
            .map(|g| Some(g.position))
            .ok_or_else(|| format!("GID index {want} is not in the device's GID table (see `show_gids` or /sys/class/infiniband/*/ports/1/gids)"));
    }
    Ok(usable()
        .find(|g| g.roce_v2 && g.ipv4_mapped)
        .or_else(|| usable().find(|g| g.roce_v2))
        .or_else(|| usable().next())
        .map(|g| g.position))
}

fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

fn gid_bytes(g: &ibverbs::Gid) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&g.subnet_prefix().to_be_bytes());
    b[8..].copy_from_slice(&g.interface_id().to_be_bytes());
    b
}

fn gid_from_bytes(raw: [u8; 16]) -> ibverbs::Gid {
    // Writing a union field is safe; `Gid: From<ibv_gid>` copies the 16 bytes.
    ibverbs::Gid::from(ibverbs_sys::ibv_gid { raw })
}

fn wc_status_name(status: u32) -> &'static str {
    use ibverbs_sys::ibv_wc_status::*;
    match status {
        IBV_WC_LOC_LEN_ERR => "local length error",
        IBV_WC_LOC_QP_OP_ERR => "local QP operation error",
        IBV_WC_LOC_PROT_ERR => "local protection error",
        IBV_WC_WR_FLUSH_ERR => "work request flushed (QP in error state)",
        IBV_WC_REM_INV_REQ_ERR => "remote invalid request",
        IBV_WC_REM_ACCESS_ERR => "remote access error",
        IBV_WC_REM_OP_ERR => "remote operation error",
        IBV_WC_RETRY_EXC_ERR => "transport retry count exceeded (peer gone or unreachable)",
        IBV_WC_RNR_RETRY_EXC_ERR => "RNR retry count exceeded",
        IBV_WC_FATAL_ERR => "fatal error",
        IBV_WC_GENERAL_ERR => "general error",
        _ => "error",
    }
}

/// Frames waiting to leave on one connection, cut into messages of at most `frag_bytes`.
struct Outbound {
    frames: VecDeque<Vec<u8>>,
    /// Bytes of the first frame already cut.
    off: usize,
    frag_bytes: usize,
}

impl Outbound {
    fn new(frag_bytes: usize) -> Self {
        Self { frames: VecDeque::new(), off: 0, frag_bytes }
    }

    fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Copies the next fragment into `out` (at least `frag_bytes` long) and returns its length,
    /// plus the frame itself once its last fragment is out (for recycling). Nothing queued: 0.
    fn next_fragment(&mut self, out: &mut [u8]) -> (usize, Option<Vec<u8>>) {
        let Some(frame) = self.frames.front() else { return (0, None) };
        let n = (frame.len() - self.off).min(self.frag_bytes);
        out[..n].copy_from_slice(&frame[self.off..self.off + n]);
        self.off += n;
        if self.off < frame.len() {
            return (n, None);
        }
        self.off = 0;
        (n, self.frames.pop_front())
    }
}

/// Fragments from one connection → frames. The first fragment of a frame holds its whole header
/// (the sender's fragments are at least `HEADER_LEN` long), which is validated before any byte is
/// kept, and fixes the frame's length: a fragment that would overrun it is garbage.
#[derive(Default)]
struct Reassembly {
    partial: Option<(Vec<u8>, usize)>,
}

impl Reassembly {
    /// Adds one fragment; returns the frame it completes, if any.
    fn push(&mut self, bytes: &[u8], pool: &BufferPool) -> std::result::Result<Option<(FrameHeader, Vec<u8>)>, FrameError> {
        if self.partial.is_none() {
            if bytes.len() < HEADER_LEN {
                return Err(FrameError::MalformedPayload { what: "first RDMA fragment shorter than a frame header" });
            }
            let header = FrameHeader::parse(&bytes[..HEADER_LEN])?;
            let total = HEADER_LEN + header.payload_len as usize;
            let mut v = pool.take(total);
            v.clear();
            self.partial = Some((v, total));
        }
        let (buf, total) = self.partial.as_mut().expect("set above");
        if buf.len() + bytes.len() > *total {
            return Err(FrameError::MalformedPayload { what: "RDMA fragments longer than the frame header says" });
        }
        buf.extend_from_slice(bytes);
        if buf.len() < *total {
            return Ok(None);
        }
        let (frame, _) = self.partial.take().expect("set above");
        let header = FrameHeader::parse(&frame[..HEADER_LEN])?;
        Ok(Some((header, frame)))
    }
}

/// Credit accounting of one connection, both directions. Counters are absolute and wrap.
#[derive(Clone, Copy, Debug)]
struct Credits {
    /// Data messages that may be unconsumed by the peer at once.
    window: u32,
    /// Owed credits that trigger a credit-only message.
    threshold: u32,
    /// Messages posted to the peer, and how many of them the peer has consumed.
    sent: u32,
    peer_consumed: u32,
    /// Peer messages consumed here, and the count last sent back.
    consumed: u32,
    advertised: u32,
}

impl Credits {
    /// Both sides derive the same window and threshold from the smaller receive pool, so a
    /// sender's window is always at least twice the receiver's threshold and a stalled sender
    /// always gets credits back.
    fn new(own_recv_slots: u32, peer_recv_slots: u32) -> Self {
        let window = own_recv_slots.min(peer_recv_slots) - 2;
        Self { window, threshold: (window / 2).max(1), sent: 0, peer_consumed: 0, consumed: 0, advertised: 0 }
    }
    fn may_send_data(&self) -> bool {
        self.sent.wrapping_sub(self.peer_consumed) < self.window
    }
    fn owes_credit(&self) -> bool {
        self.consumed.wrapping_sub(self.advertised) >= self.threshold
    }
    /// A message (data or credit-only) goes out: returns the consumed count it carries.
    fn on_send(&mut self) -> u32 {
        self.sent = self.sent.wrapping_add(1);
        self.advertised = self.consumed;
        self.consumed
    }
    /// A message arrived carrying the peer's consumed count; its buffer was reposted.
    fn on_receive(&mut self, peer_consumed: u32) {
        self.peer_consumed = peer_consumed;
        self.consumed = self.consumed.wrapping_add(1);
    }
}

// ---------------------------------------------------------------------------------------------
// Device.

/// Opens the device to use: `name`, or the first in the list that opens (port 1 ACTIVE or
/// ARMED). The error is the reason there is none, for "no RDMA device (<reason>)".
fn open_device(name: Option<&str>) -> std::result::Result<(Context, String), String> {
    let list = ibverbs::devices().map_err(|e| format!("ibv_get_device_list failed: {e}"))?;
    if list.is_empty() {
        return Err("ibv_get_device_list found none".into());
    }
    let names: Vec<String> = list
        .iter()
        .map(|d| d.name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "?".into()))
        .collect();
    let mut failures = Vec::new();
    for (i, dev) in list.iter().enumerate() {
        if name.is_some_and(|n| n != names[i]) {
            continue;
        }
        match dev.open() {
            Ok(ctx) => return Ok((ctx, names[i].clone())),
            Err(e) => failures.push(format!("{}: {e}", names[i])),
        }
    }
    match name {
        Some(n) if !names.iter().any(|x| x == n) => Err(format!("no device named {n} among {}", names.join(", "))),
        _ => Err(format!("no device opened with port 1 active ({})", failures.join("; "))),
    }
}

/// The name of the device an [`RdmaTransport`] would use, or why there is none (the device list
/// is empty, the named device is missing, or no device opens with port 1 active).
pub fn probe(device: Option<&str>) -> std::result::Result<String, String> {
    open_device(device).map(|(_ctx, name)| name)
}

// ---------------------------------------------------------------------------------------------
// The engine's side.

enum Command {
    Send { conn: usize, frame: Vec<u8> },
    /// Reply once every queued frame is sent and acknowledged (or the mesh failed).
    Flush(Sender<()>),
    /// Stop after close: both sides said goodbye.
    Stop,
    /// Stop now and shut the bootstrap sockets so peers notice.
    Abort,
}

struct EngineConn {
    inbound: InboundFrames,
    send_seq: u32,
}

/// A full mesh of RC queue pairs among the ranks of one job (see the module docs).
pub struct RdmaTransport {
    rank: usize,
    world: usize,
    channels: usize,
    timeout: Duration,
    device: String,
    /// Indexed by [`conn_index`].
    conns: Vec<EngineConn>,
    cmd: Sender<Command>,
    shared: Arc<SharedState>,
    pool: Arc<BufferPool>,
    progress: Option<JoinHandle<()>>,
    bytes_sent: u64,
    finished: bool,
}

/// Connections are numbered peer-major, skipping this rank.
fn conn_index(rank: usize, channels: usize, peer: usize, channel: usize) -> usize {
    let slot = if peer < rank { peer } else { peer - 1 };
    slot * channels + channel
}

fn conn_peer(rank: usize, channels: usize, idx: usize) -> (usize, usize) {
    let slot = idx / channels;
    (if slot < rank { slot } else { slot + 1 }, idx % channels)
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

impl RdmaTransport {
    /// Binds `0.0.0.0:<port of peers[rank]>` for the bootstrap and builds the mesh.
    pub fn bind_and_connect(rank: usize, peers: &[SocketAddr], options: RdmaOptions) -> Result<Self> {
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

    /// Opens the device and builds the mesh, bootstrapping through `listener` (this rank's
    /// `peers` entry) and the other ranks' `peers` entries.
    pub fn connect(listener: TcpListener, rank: usize, peers: &[SocketAddr], options: RdmaOptions) -> Result<Self> {
        let world = peers.len();
        if rank >= world {
            return Err(CollectiveError::InvalidArgument {
                name: "rank",
                reason: format!("rank {rank} is outside a world of {world}"),
            });
        }
        options.validate()?;
        let (ctx, device) =
            open_device(options.device.as_deref()).map_err(|reason| CollectiveError::NoRdmaDevice { reason })?;
        let k = usize::from(options.channels);
        let n_conns = (world - 1) * k;
        let shared = Arc::new(SharedState::default());
        let pool = Arc::new(BufferPool::default());
        let (cmd_tx, cmd_rx) = mpsc::channel();
        let (setup_tx, setup_rx) = mpsc::channel();
        let mut inbound_tx = Vec::with_capacity(n_conns);
        let mut conns = Vec::with_capacity(n_conns);
        for _ in 0..n_conns {
            let (tx, rx) = mpsc::channel();
            inbound_tx.push(tx);
            conns.push(EngineConn { inbound: InboundFrames::new(rx), send_seq: 1 });
        }
        let job = ProgressJob {
            rank,
            world,
            peers: peers.to_vec(),
            options: options.clone(),
            listener,
            inbound: inbound_tx,
            commands: cmd_rx,
            shared: shared.clone(),
            pool: pool.clone(),
            setup: setup_tx,
        };
        let progress = std::thread::Builder::new()
            .name(format!("rdma-r{rank}"))
            .spawn(move || progress_main(ctx, job))
            .map_err(|e| CollectiveError::RdmaSetup { what: "starting the progress thread", source: Arc::new(e) })?;
        // The thread bounds its own setup by the timeout; the margin only covers a thread that
        // died without answering (its sender is then dropped and this returns at once).
        let outcome = match setup_rx.recv_timeout(options.timeout + Duration::from_secs(5)) {
            Ok(r) => r,
            Err(_) => Err(CollectiveError::RdmaSetup {
                what: "mesh setup",
                source: Arc::new(std::io::Error::other("the progress thread ended without reporting")),
            }),
        };
        if let Err(e) = outcome {
            let _ = cmd_tx.send(Command::Abort);
            let _ = progress.join();
            return Err(e);
        }
        tracing::info!(%device, rank, world, channels = k, "RDMA mesh up");
        Ok(Self {
            rank,
            world,
            channels: k,
            timeout: options.timeout,
            device,
            conns,
            cmd: cmd_tx,
            shared,
            pool,
            progress: Some(progress),
            bytes_sent: 0,
            finished: false,
        })
    }

    /// The device in use.
    pub fn device(&self) -> &str {
        &self.device
    }

    fn index(&self, peer: usize, channel: usize) -> Result<usize> {
        if peer >= self.world || peer == self.rank || channel >= self.channels {
            return Err(CollectiveError::InvalidArgument {
                name: "peer/channel",
                reason: format!(
                    "no connection to rank {peer} channel {channel} (rank {} of world {}, {} channels)",
                    self.rank, self.world, self.channels
                ),
            });
        }
        Ok(conn_index(self.rank, self.channels, peer, channel))
    }

    fn stop(&mut self, command: Command) {
        let _ = self.cmd.send(command);
        if let Some(p) = self.progress.take() {
            let _ = p.join();
        }
    }
}

impl Transport for RdmaTransport {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn channels(&self) -> usize {
        self.channels
    }

    fn send(&mut self, peer: usize, channel: usize, mut header: FrameHeader, mut frame: Vec<u8>) -> Result<()> {
        if let Some(e) = self.shared.failure() {
            return Err(e);
        }
        let idx = self.index(peer, channel)?;
        let len = frame.len();
        let c = &mut self.conns[idx];
        header.seq = c.send_seq;
        header.channel = channel as u8;
        header.payload_len = (len - HEADER_LEN) as u32;
        header.write(&mut frame[..HEADER_LEN]);
        c.send_seq = c.send_seq.wrapping_add(1);
        if self.cmd.send(Command::Send { conn: idx, frame }).is_err() {
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
        let idx = self.index(peer, channel)?;
        self.conns[idx].inbound.recv_in_order(&self.shared, peer, channel, timeout, op)
    }

    fn recv_queued(&mut self, peer: usize, channel: usize) -> Result<Option<InFrame>> {
        let idx = self.index(peer, channel)?;
        self.conns[idx].inbound.try_recv_in_order(&self.shared, peer, channel)
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    fn close(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let deadline = Instant::now() + self.timeout;
        for idx in 0..self.conns.len() {
            let (_, channel) = conn_peer(self.rank, self.channels, idx);
            let mut h = FrameHeader::new(FrameKind::Goodbye);
            h.seq = self.conns[idx].send_seq;
            h.channel = channel as u8;
            let _ = self.cmd.send(Command::Send { conn: idx, frame: h.to_bytes().to_vec() });
        }
        // Flush: every frame, goodbyes included, acknowledged by the peers' devices.
        let (tx, rx) = mpsc::channel();
        if self.cmd.send(Command::Flush(tx)).is_ok() {
            let _ = rx.recv_timeout(remaining(deadline));
        }
        // Wait for each peer's goodbye (or a failure), so that this rank's QPs outlive every
        // message a peer still sends to them.
        let shared = &self.shared;
        for (idx, c) in self.conns.iter_mut().enumerate() {
            let (peer, channel) = conn_peer(self.rank, self.channels, idx);
            c.inbound.await_goodbye(deadline, peer, channel, || shared.failure().is_some());
        }
        self.shared.closing.store(true, Ordering::Release);
        self.stop(Command::Stop);
    }

    fn abort(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.shared.closing.store(true, Ordering::Release);
        self.stop(Command::Abort);
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        if self.shared.failure().is_some() {
            self.abort();
        } else {
            self.close();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The progress thread: owns every verbs object (they borrow each other, so they live on this
// thread's stack in dependency order) and runs the data path.

struct ProgressJob {
    rank: usize,
    world: usize,
    peers: Vec<SocketAddr>,
    options: RdmaOptions,
    listener: TcpListener,
    inbound: Vec<Sender<Inbound>>,
    commands: Receiver<Command>,
    shared: Arc<SharedState>,
    pool: Arc<BufferPool>,
    setup: Sender<Result<()>>,
}

/// `wr_id` of a credit-only send: this bit plus the connection index. Data sends use the send
/// slot index.
const CREDIT_WR: u64 = 1 << 63;

/// Per-connection state of the data path.
struct Link<'q> {
    peer: usize,
    channel: usize,
    /// This side's QP number: send completions name their QP by it.
    qp_num: u32,
    qp: QueuePair<'q>,
    socket: TcpStream,
    inbound: Sender<Inbound>,
    /// Frames waiting to be cut into messages of (the smaller slot of the two sides − prefix).
    out: Outbound,
    credits: Credits,
    credit_in_flight: bool,
    inbound_frame: Reassembly,
    peer_said_goodbye: bool,
    eof_since: Option<Instant>,
}

fn setup_err(what: &'static str) -> impl Fn(std::io::Error) -> CollectiveError {
    move |e| CollectiveError::RdmaSetup { what, source: Arc::new(e) }
}

fn progress_main(ctx: Context, job: ProgressJob) {
    let setup = job.setup.clone();
    // Declaration order is destruction order reversed: QPs (in `links`) go before the memory
    // regions, which go before the CQs and the PD; `ctx` (a parameter) is dropped last. `ibverbs`
    // panics if a PD or CQ is destroyed while still in use, so this order is load-bearing.
    let o = &job.options;
    let k = usize::from(o.channels);
    let n_conns = (job.world - 1) * k;
    let outcome = (|| -> Result<()> {
        let pd = ctx.alloc_pd().map_err(setup_err("allocating a protection domain"))?;
        let send_cq = ctx
            .create_cq((o.send_slots + n_conns) as i32, 0)
            .map_err(setup_err("creating the send completion queue"))?;
        let recv_cq =
            // At least one entry: a world of one rank has no connection but CQs cannot be empty.
            ctx.create_cq((n_conns * o.recv_slots).max(1) as i32, 1).map_err(setup_err("creating the receive completion queue"))?;
        let mut send_mr: MemoryRegion<u8> =
            pd.allocate(o.send_slots * o.slot_bytes).map_err(setup_err("registering the send buffers"))?;
        let mut recv_mr: MemoryRegion<u8> =
            pd.allocate(n_conns.max(1) * o.recv_slots * o.slot_bytes).map_err(setup_err("registering the receive buffers"))?;
        let mut credit_mr: MemoryRegion<u8> =
            pd.allocate(n_conns.max(1) * Prefix::LEN).map_err(setup_err("registering the credit buffers"))?;

        let gids: Vec<GidChoice> = ctx
            .gid_table()
            .iter()
            .enumerate()
            .map(|(position, g)| GidChoice {
                position,
                index: g.gid_index,
                roce_v2: g.gid_type == ibverbs_sys::IBV_GID_TYPE_ROCE_V2,
                ipv4_mapped: is_ipv4_mapped(&gid_bytes(&g.gid)),
            })
            .collect();
        let gid_pos = choose_gid(&gids, o.gid_index).map_err(|reason| CollectiveError::NoRdmaDevice { reason })?;
        let local_gid = gid_pos.map(|p| gid_bytes(&ctx.gid_table()[p].gid));

        // One RC QP per connection. Send queue: the data window plus one credit-only message;
        // receive queue: every receive buffer of the connection.
        let mut prepared = Vec::with_capacity(n_conns);
        for _ in 0..n_conns {
            let mut b = pd.create_qp(&send_cq, &recv_cq, ibv_qp_type::IBV_QPT_RC);
            b.set_max_send_wr(o.recv_slots as u32 + 2)
                .set_max_recv_wr(o.recv_slots as u32)
                // 4.096 µs × 2^14 ≈ 67 ms per try, 7 tries: a dead peer fails a send in ~0.5 s.
                .set_timeout(14)
                .set_retry_count(7)
                // 7 = retry RNR NAKs without limit (see the module docs); 12 = 0.64 ms between.
                .set_rnr_retry(7)
                .set_min_rnr_timer(12);
            if let Some(p) = gid_pos {
                b.set_gid_index(p as u32);
            }
            prepared.push(Some(b.build().map_err(setup_err("creating a queue pair"))?));
        }

        let mine = |peer: usize, ch: usize, prepared: &[Option<ibverbs::PreparedQueuePair<'_>>]| {
            let ep = prepared[conn_index(job.rank, k, peer, ch)].as_ref().expect("prepared").endpoint();
            BootstrapRecord {
                world: job.world as u32,
                rank: job.rank as u32,
                channels: u32::from(o.channels),
                channel: ch as u8,
                qp_num: ep.num,
                // `ibverbs` starts every send queue at PSN 0 (its handshake sets sq_psn = 0).
                psn: 0,
                lid: ep.lid,
                gid: local_gid,
                slot_bytes: o.slot_bytes as u32,
                recv_slots: o.recv_slots as u32,
            }
        };
        let deadline = Instant::now() + o.timeout;
        let mut streams: Vec<Option<(TcpStream, BootstrapRecord)>> = (0..n_conns).map(|_| None).collect();
        for (peer, &addr) in job.peers.iter().enumerate().take(job.rank) {
            for ch in 0..k {
                let me = mine(peer, ch, &prepared);
                streams[conn_index(job.rank, k, peer, ch)] = Some(dial(peer, ch, addr, &me, deadline, o.timeout)?);
            }
        }
        accept_all(&job, k, deadline, &mut streams, |peer, ch| mine(peer, ch, &prepared))?;

        // Every record is in: bring each QP up against its peer, post its receives, and tell the
        // peer it may send.
        let mut links = Vec::with_capacity(n_conns);
        for (idx, entry) in streams.into_iter().enumerate() {
            let (peer, ch) = conn_peer(job.rank, k, idx);
            let (socket, theirs) = entry.expect("every connection was set up");
            let remote = QueuePairEndpoint { num: theirs.qp_num, lid: theirs.lid, gid: theirs.gid.map(gid_from_bytes) };
            let pqp = prepared[idx].take().expect("prepared once");
            let qp_num = pqp.endpoint().num;
            // The receive PSN is the builder's default 0, which `check` matched against the
            // peer's first send PSN.
            let qp = pqp.handshake(remote).map_err(|e| CollectiveError::Io { peer, channel: ch, source: Arc::new(e) })?;
            let peer_slot = (theirs.slot_bytes as usize).min(o.slot_bytes);
            links.push(Link {
                peer,
                channel: ch,
                qp_num,
                qp,
                socket,
                inbound: job.inbound[idx].clone(),
                out: Outbound::new(peer_slot - Prefix::LEN),
                credits: Credits::new(o.recv_slots as u32, theirs.recv_slots),
                credit_in_flight: false,
                inbound_frame: Reassembly::default(),
                peer_said_goodbye: false,
                eof_since: None,
            });
        }
        for (idx, l) in links.iter_mut().enumerate() {
            for s in 0..o.recv_slots {
                post_recv(l, &mut recv_mr, o, idx, s)?;
            }
        }
        for l in links.iter_mut() {
            let (peer, channel) = (l.peer, l.channel);
            let io = |e| CollectiveError::Io { peer, channel, source: Arc::new(e) };
            l.socket.write_all(&[READY]).map_err(io)?;
        }
        for l in links.iter_mut() {
            let (peer, channel) = (l.peer, l.channel);
            l.socket.set_read_timeout(Some(remaining(deadline).max(Duration::from_millis(1)))).map_err(|e| CollectiveError::Io { peer, channel, source: Arc::new(e) })?;
            let mut b = [0u8; 1];
            match l.socket.read_exact(&mut b) {
                Ok(()) if b[0] == READY => {}
                Ok(()) => return Err(CollectiveError::Handshake { addr: job.peers[peer], reason: format!("expected READY, got byte {:#04x}", b[0]) }),
                Err(e) => return Err(CollectiveError::Io { peer, channel, source: Arc::new(e) }),
            }
            l.socket.set_nonblocking(true).map_err(|e| CollectiveError::Io { peer, channel, source: Arc::new(e) })?;
        }
        let _ = setup.send(Ok(()));
        run_data_path(&job, &mut links, &send_cq, &recv_cq, &mut send_mr, &mut recv_mr, &mut credit_mr);
        for l in &links {
            let _ = l.socket.shutdown(Shutdown::Both);
        }
        Ok(())
    })();
    if let Err(e) = outcome {
        // Only reached before setup answered (the data path records its failures itself).
        let _ = setup.send(Err(e));
    }
}

fn dial(
    peer: usize,
    ch: usize,
    addr: SocketAddr,
    me: &BootstrapRecord,
    deadline: Instant,
    timeout: Duration,
) -> Result<(TcpStream, BootstrapRecord)> {
    let mut last_error = String::from("no attempt made");
    let mut backoff = Duration::from_millis(10);
    while Instant::now() < deadline {
        let attempt = (|| -> std::result::Result<(TcpStream, BootstrapRecord), String> {
            let mut s = TcpStream::connect_timeout(&addr, remaining(deadline).clamp(Duration::from_millis(1), Duration::from_secs(2)))
                .map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(remaining(deadline).max(Duration::from_millis(1)))).map_err(|e| e.to_string())?;
            s.write_all(&me.encode()).map_err(|e| e.to_string())?;
            let mut b = [0u8; BootstrapRecord::LEN];
            s.read_exact(&mut b).map_err(|e| match e.kind() {
                // A rank on the TCP transport rejects the record as garbage and hangs up.
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => "the peer closed the connection after this rank's RDMA bootstrap record (is it on the TCP transport? every rank needs the same --transport)".to_string(),
                _ => format!("reading the bootstrap record: {e}"),
            })?;
            let theirs = BootstrapRecord::parse(&b).map_err(|e| e.to_string())?;
            theirs.check(peer, ch, me)?;
            Ok((s, theirs))
        })();
        match attempt {
            Ok(x) => return Ok(x),
            Err(e) => last_error = e,
        }
        std::thread::sleep(backoff.min(remaining(deadline)));
        backoff = (backoff * 2).min(Duration::from_millis(200));
    }
    Err(CollectiveError::ConnectTimeout { peer, addr, waited_ms: timeout.as_millis() as u64, last_error })
}

fn accept_all(
    job: &ProgressJob,
    k: usize,
    deadline: Instant,
    streams: &mut [Option<(TcpStream, BootstrapRecord)>],
    mine: impl Fn(usize, usize) -> BootstrapRecord,
) -> Result<()> {
    let expected = (job.world - job.rank - 1) * k;
    let mut connected = 0;
    job.listener.set_nonblocking(true).map_err(|e| CollectiveError::io(job.rank, 0, e))?;
    while connected < expected {
        if Instant::now() >= deadline {
            return Err(CollectiveError::AcceptTimeout { connected, expected, waited_ms: job.options.timeout.as_millis() as u64 });
        }
        let (mut s, addr) = match job.listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => return Err(CollectiveError::io(job.rank, 0, e)),
        };
        let mut speaks_tcp = false;
        let setup = (|| -> std::result::Result<(usize, usize, BootstrapRecord), String> {
            s.set_nonblocking(false).map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(remaining(deadline).max(Duration::from_millis(1)))).map_err(|e| e.to_string())?;
            let mut b = [0u8; BootstrapRecord::LEN];
            // A TCP hello frame is 52 bytes: read its header first so that a TCP rank is
            // recognised instead of waiting for 64 bytes it will never send.
            s.read_exact(&mut b[..HEADER_LEN]).map_err(|e| format!("reading the bootstrap record: {e}"))?;
            if b[..4] == FRAME_MAGIC.to_le_bytes() {
                speaks_tcp = true;
                return Err(BootstrapError::PeerUsesTcp.to_string());
            }
            s.read_exact(&mut b[HEADER_LEN..]).map_err(|e| format!("reading the bootstrap record: {e}"))?;
            let theirs = BootstrapRecord::parse(&b).map_err(|e| e.to_string())?;
            let (peer, ch) = (theirs.rank as usize, usize::from(theirs.channel));
            if peer <= job.rank || peer >= job.world || ch >= k {
                return Err(format!("unexpected caller rank {peer} channel {ch}"));
            }
            let me = mine(peer, ch);
            theirs.check(peer, ch, &me)?;
            if streams[conn_index(job.rank, k, peer, ch)].is_some() {
                return Err(format!("duplicate connection from rank {peer} channel {ch}"));
            }
            s.write_all(&me.encode()).map_err(|e| e.to_string())?;
            Ok((peer, ch, theirs))
        })();
        match setup {
            Ok((peer, ch, theirs)) => {
                streams[conn_index(job.rank, k, peer, ch)] = Some((s, theirs));
                connected += 1;
            }
            // A ringside rank on the TCP transport: this job's ranks disagree on the transport,
            // and waiting cannot fix that.
            Err(reason) if speaks_tcp => return Err(CollectiveError::Handshake { addr, reason }),
            // A stranger (port scan, stale rank of another job) must not break setup.
            Err(reason) => tracing::warn!(%addr, %reason, "rejected inbound RDMA bootstrap connection"),
        }
    }
    Ok(())
}

fn post_recv(l: &mut Link<'_>, recv_mr: &mut MemoryRegion<u8>, o: &RdmaOptions, idx: usize, slot: usize) -> Result<()> {
    let wr = (idx * o.recv_slots + slot) as u64;
    let base = wr as usize * o.slot_bytes;
    // SAFETY: receive slot `wr` is owned by this posted request until its completion is polled
    // (`handle_recv` reads it and then reposts it through here); nothing else reads or writes
    // `recv_mr[base..base + slot_bytes]`, and `recv_mr` outlives every QP (declared before them
    // in `progress_main`), so the device never writes into freed memory.
    unsafe { l.qp.post_receive(recv_mr, base..base + o.slot_bytes, wr) }
        .map_err(|e| CollectiveError::Io { peer: l.peer, channel: l.channel, source: Arc::new(e) })
}

/// The data path until Stop or Abort. Failures are recorded in `job.shared` and sent to the
/// engine; the loop keeps running (and stops posting) until the engine stops it.
fn run_data_path(
    job: &ProgressJob,
    links: &mut [Link<'_>],
    send_cq: &CompletionQueue<'_>,
    recv_cq: &CompletionQueue<'_>,
    send_mr: &mut MemoryRegion<u8>,
    recv_mr: &mut MemoryRegion<u8>,
    credit_mr: &mut MemoryRegion<u8>,
) {
    let o = &job.options;
    let mut free_send: Vec<usize> = (0..o.send_slots).rev().collect();
    let mut wcs = vec![ibverbs::ibv_wc::default(); 64];
    let mut flush_waiters: Vec<Sender<()>> = Vec::new();
    let mut last_liveness = Instant::now();
    let mut idle_rounds = 0u32;
    let mut failed = false;
    let fail = |links: &mut [Link<'_>], e: CollectiveError| {
        job.shared.fail(e.clone());
        for l in links.iter() {
            let _ = l.inbound.send(Inbound::Failed(e.clone()));
        }
    };
    loop {
        let mut work = false;
        // 1. Commands from the engine.
        loop {
            match job.commands.try_recv() {
                Ok(Command::Send { conn, frame }) => {
                    work = true;
                    links[conn].out.frames.push_back(frame);
                }
                Ok(Command::Flush(reply)) => flush_waiters.push(reply),
                Ok(Command::Stop) => return,
                Ok(Command::Abort) | Err(TryRecvError::Disconnected) => {
                    for l in links.iter() {
                        let _ = l.socket.shutdown(Shutdown::Both);
                    }
                    return;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        // 2. Receive completions: copy out, repost, deliver.
        match recv_cq.poll(&mut wcs) {
            Ok(done) => {
                for wc in done.iter() {
                    work = true;
                    let wr = wc.wr_id() as usize;
                    let (idx, slot) = (wr / o.recv_slots, wr % o.recv_slots);
                    if let Some((status, vendor)) = wc.error() {
                        if !failed && !job.shared.closing.load(Ordering::Acquire) {
                            let l = &links[idx];
                            let e = CollectiveError::Io {
                                peer: l.peer,
                                channel: l.channel,
                                source: Arc::new(std::io::Error::other(format!(
                                    "receive completion: {} (status {status}, vendor error {vendor:#x})",
                                    wc_status_name(status)
                                ))),
                            };
                            failed = true;
                            fail(links, e);
                        }
                        continue;
                    }
                    let base = wr * o.slot_bytes;
                    let msg = &recv_mr[base..base + wc.len().min(o.slot_bytes)];
                    if let Err(e) = handle_message(&mut links[idx], msg, &job.pool) {
                        if !failed {
                            failed = true;
                            fail(links, e);
                        }
                        continue;
                    }
                    if !failed {
                        if let Err(e) = post_recv(&mut links[idx], recv_mr, o, idx, slot) {
                            failed = true;
                            fail(links, e);
                        }
                    }
                }
            }
            Err(e) => {
                if !failed {
                    failed = true;
                    fail(links, CollectiveError::RdmaSetup { what: "polling the receive completion queue", source: Arc::new(e) });
                }
            }
        }
        // 3. Send completions: free slots.
        match send_cq.poll(&mut wcs) {
            Ok(done) => {
                for wc in done.iter() {
                    work = true;
                    let wr = wc.wr_id();
                    if wr & CREDIT_WR != 0 {
                        links[(wr & !CREDIT_WR) as usize].credit_in_flight = false;
                    } else {
                        free_send.push(wr as usize);
                    }
                    if let Some((status, vendor)) = wc.error() {
                        if !failed && !job.shared.closing.load(Ordering::Acquire) {
                            let e = CollectiveError::Io {
                                peer: usize::MAX,
                                channel: 0,
                                source: Arc::new(std::io::Error::other(format!(
                                    "send completion: {} (status {status}, vendor error {vendor:#x})",
                                    wc_status_name(status)
                                ))),
                            };
                            // Name the peer when the QP number tells it.
                            let e = match links.iter().find(|l| l.qp_num == wc.qp_num) {
                                Some(l) => match e {
                                    CollectiveError::Io { source, .. } => CollectiveError::Io { peer: l.peer, channel: l.channel, source },
                                    other => other,
                                },
                                None => e,
                            };
                            failed = true;
                            fail(links, e);
                        }
                    }
                }
            }
            Err(e) => {
                if !failed {
                    failed = true;
                    fail(links, CollectiveError::RdmaSetup { what: "polling the send completion queue", source: Arc::new(e) });
                }
            }
        }
        // 4. Post fragments within each window, then credit-only messages where needed.
        if !failed {
            for (idx, l) in links.iter_mut().enumerate() {
                while !l.out.is_empty() && l.credits.may_send_data() {
                    let Some(slot) = free_send.pop() else { break };
                    work = true;
                    if let Err(e) = post_fragment(l, send_mr, o.slot_bytes, slot, &job.pool) {
                        free_send.push(slot);
                        failed = true;
                        job.shared.fail(e.clone());
                        let _ = l.inbound.send(Inbound::Failed(e));
                        break;
                    }
                }
                if failed {
                    break;
                }
                if l.credits.owes_credit() && !l.credit_in_flight && !l.peer_said_goodbye {
                    work = true;
                    if let Err(e) = post_credit(l, credit_mr, idx) {
                        failed = true;
                        job.shared.fail(e.clone());
                        let _ = l.inbound.send(Inbound::Failed(e));
                        break;
                    }
                }
            }
        }
        // 5. Flush waiters: every queued frame posted and every data send completed.
        if !flush_waiters.is_empty()
            && (failed || (links.iter().all(|l| l.out.is_empty()) && free_send.len() == o.send_slots))
        {
            for w in flush_waiters.drain(..) {
                let _ = w.send(());
            }
        }
        // 6. Liveness of the peers through their bootstrap sockets.
        if last_liveness.elapsed() >= LIVENESS_EVERY {
            last_liveness = Instant::now();
            if !failed {
                if let Some(e) = check_liveness(links) {
                    failed = true;
                    fail(links, e);
                }
            }
        }
        // 7. Back off when idle: spin briefly (latency), then yield, then sleep up to 1 ms (a
        // 2-core machine cannot afford a spinning thread per rank; with no completion channel in
        // `ibverbs` 0.9 this is the only way to wait).
        if work {
            idle_rounds = 0;
        } else {
            idle_rounds = idle_rounds.saturating_add(1);
            if idle_rounds < 64 {
                std::hint::spin_loop();
            } else if idle_rounds < 256 {
                std::thread::yield_now();
            } else {
                let exp = (idle_rounds - 256).min(5);
                std::thread::sleep(Duration::from_micros(32 << exp));
            }
        }
    }
}

/// Copies the next fragment of `l`'s first queued frame into send slot `slot` and posts it.
fn post_fragment(l: &mut Link<'_>, send_mr: &mut MemoryRegion<u8>, slot_bytes: usize, slot: usize, pool: &BufferPool) -> Result<()> {
    let base = slot * slot_bytes;
    let (n, done) = l.out.next_fragment(&mut send_mr[base + Prefix::LEN..base + slot_bytes]);
    let consumed = l.credits.on_send();
    Prefix { kind: MessageKind::Fragment, consumed }.write(&mut send_mr[base..base + Prefix::LEN]);
    if let Some(frame) = done {
        pool.put(frame);
    }
    // SAFETY: send slot `slot` was taken from the free list and returns to it only when its send
    // completion is polled, so the device reads `send_mr[base..base + PREFIX + n]` while nothing
    // writes it; `send_mr` outlives every QP (declared before them in `progress_main`).
    unsafe { l.qp.post_send(send_mr, base..base + Prefix::LEN + n, slot as u64) }
        .map_err(|e| CollectiveError::Io { peer: l.peer, channel: l.channel, source: Arc::new(e) })
}

fn post_credit(l: &mut Link<'_>, credit_mr: &mut MemoryRegion<u8>, idx: usize) -> Result<()> {
    let base = idx * Prefix::LEN;
    let consumed = l.credits.on_send();
    Prefix { kind: MessageKind::Credit, consumed }.write(&mut credit_mr[base..base + Prefix::LEN]);
    // SAFETY: connection `idx`'s credit buffer is written only while `credit_in_flight` is false
    // and that flag stays set until this send's completion is polled; `credit_mr` outlives every
    // QP (declared before them in `progress_main`).
    unsafe { l.qp.post_send(credit_mr, base..base + Prefix::LEN, CREDIT_WR | idx as u64) }
        .map_err(|e| CollectiveError::Io { peer: l.peer, channel: l.channel, source: Arc::new(e) })?;
    l.credit_in_flight = true;
    Ok(())
}

/// Handles one received message of `l` (whose buffer the caller reposts): credit return, then
/// reassembly of frame bytes.
fn handle_message(l: &mut Link<'_>, msg: &[u8], pool: &BufferPool) -> Result<()> {
    let (peer, channel) = (l.peer, l.channel);
    let prefix = Prefix::parse(msg).ok_or(CollectiveError::BadFrame {
        peer,
        channel,
        error: FrameError::MalformedPayload { what: "RDMA message without a valid prefix" },
    })?;
    l.credits.on_receive(prefix.consumed);
    if prefix.kind == MessageKind::Credit {
        return Ok(());
    }
    let Some((header, frame)) = l
        .inbound_frame
        .push(&msg[Prefix::LEN..], pool)
        .map_err(|error| CollectiveError::BadFrame { peer, channel, error })?
    else {
        return Ok(());
    };
    let inbound = if header.kind == FrameKind::Goodbye {
        l.peer_said_goodbye = true;
        pool.put(frame);
        Inbound::Goodbye
    } else {
        Inbound::Frame(InFrame { header, frame })
    };
    // The engine dropped its side only when the transport is going away: nothing to deliver to.
    let _ = l.inbound.send(inbound);
    Ok(())
}

/// A peer whose bootstrap socket is at EOF (or broken) for longer than [`LIVENESS_GRACE`]
/// without having said goodbye is gone.
fn check_liveness(links: &mut [Link<'_>]) -> Option<CollectiveError> {
    for l in links.iter_mut() {
        if l.peer_said_goodbye {
            continue;
        }
        if l.eof_since.is_none() {
            let mut b = [0u8; 16];
            match l.socket.read(&mut b) {
                Ok(0) => l.eof_since = Some(Instant::now()),
                Ok(_) => {
                    return Some(CollectiveError::BadFrame {
                        peer: l.peer,
                        channel: l.channel,
                        error: FrameError::MalformedPayload { what: "bytes on the RDMA bootstrap socket after setup" },
                    })
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {}
                Err(_) => l.eof_since = Some(Instant::now()),
            }
        }
        if l.eof_since.is_some_and(|t| t.elapsed() >= LIVENESS_GRACE) {
            return Some(CollectiveError::PeerDisconnected { peer: l.peer, channel: l.channel });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> BootstrapRecord {
        BootstrapRecord {
            world: 4,
            rank: 2,
            channels: 2,
            channel: 1,
            qp_num: 0x00ab_cdef,
            psn: 0,
            lid: 7,
            gid: Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 3]),
            slot_bytes: 128 << 10,
            recv_slots: 16,
        }
    }

    #[test]
    fn bootstrap_record_round_trips_and_rejects_garbage() {
        let r = record();
        let b = r.encode();
        assert_eq!(BootstrapRecord::parse(&b), Ok(r));
        let no_gid = BootstrapRecord { gid: None, ..r };
        assert_eq!(BootstrapRecord::parse(&no_gid.encode()), Ok(no_gid));
        let mut bad = b;
        bad[20] ^= 1; // qp_num
        assert!(matches!(BootstrapRecord::parse(&bad), Err(BootstrapError::Checksum { .. })));
        assert!(matches!(BootstrapRecord::parse(&b[..63]), Err(BootstrapError::Truncated { got: 63 })));
        let mut v = b;
        v[4] = 9;
        assert!(matches!(BootstrapRecord::parse(&v), Err(BootstrapError::UnsupportedVersion { got: 9 })));
    }

    #[test]
    fn a_tcp_hello_is_named_as_such() {
        // What a TCP-transport rank sends first when it dials an RDMA rank.
        let mut hello = crate::wire::Hello { world: 4, rank: 3, channels: 1 }.frame(0);
        hello.resize(BootstrapRecord::LEN, 0);
        let e = BootstrapRecord::parse(&hello).unwrap_err();
        assert_eq!(e, BootstrapError::PeerUsesTcp);
        assert!(e.to_string().contains("--transport"), "{e}");
        let e = BootstrapRecord::parse(&[0x47; 64]).unwrap_err();
        assert!(matches!(e, BootstrapError::BadMagic { .. }));
    }

    #[test]
    fn records_are_checked_against_the_expected_peer() {
        let mine = BootstrapRecord { rank: 1, ..record() };
        let theirs = record();
        assert!(theirs.check(2, 1, &mine).is_ok());
        assert!(theirs.check(3, 1, &mine).unwrap_err().contains("expected rank 3"));
        assert!(theirs.check(2, 0, &mine).unwrap_err().contains("channel"));
        let other_world = BootstrapRecord { world: 8, ..theirs };
        assert!(other_world.check(2, 1, &mine).unwrap_err().contains("world 8"));
        let lid_only = BootstrapRecord { gid: None, ..theirs };
        assert!(lid_only.check(2, 1, &mine).unwrap_err().contains("LID"));
        let tiny = BootstrapRecord { slot_bytes: 16, ..theirs };
        assert!(tiny.check(2, 1, &mine).is_err());
    }

    #[test]
    fn prefix_round_trips() {
        let mut b = [0u8; 8];
        let p = Prefix { kind: MessageKind::Credit, consumed: 0xdead_beef };
        p.write(&mut b);
        assert_eq!(Prefix::parse(&b), Some(p));
        assert_eq!(Prefix::parse(&b[..7]), None);
        b[0] = 3;
        assert_eq!(Prefix::parse(&b), None);
    }

    #[test]
    fn gid_choice_prefers_roce_v2_ipv4() {
        let g = |position, index, roce_v2, ipv4_mapped| GidChoice { position, index, roce_v2, ipv4_mapped };
        // IB / RoCE v1 at 0, RoCE v2 link-local at 1, RoCE v2 IPv4 at 3 (index 2 missing, so
        // positions and indices disagree from there on and entry 3 is unusable).
        let table = [g(0, 0, false, false), g(1, 1, true, false), g(2, 3, true, true)];
        assert_eq!(choose_gid(&table, None), Ok(Some(1)));
        let table2 = [g(0, 0, false, false), g(1, 1, true, false), g(2, 2, true, true)];
        assert_eq!(choose_gid(&table2, None), Ok(Some(2)));
        assert_eq!(choose_gid(&table2, Some(0)), Ok(Some(0)));
        assert!(choose_gid(&table, Some(3)).unwrap_err().contains("GID index 3"));
        assert_eq!(choose_gid(&[g(0, 0, false, false)], None), Ok(Some(0)));
        assert_eq!(choose_gid(&[], None), Ok(None));
        assert!(is_ipv4_mapped(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]));
        assert!(!is_ipv4_mapped(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]));
    }

    #[test]
    fn gid_bytes_round_trip_through_ibverbs() {
        let raw = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(gid_bytes(&gid_from_bytes(raw)), raw);
    }

    #[test]
    fn connections_are_numbered_without_self() {
        for rank in 0..4 {
            let mut seen = Vec::new();
            for peer in (0..4).filter(|&p| p != rank) {
                for ch in 0..2 {
                    let i = conn_index(rank, 2, peer, ch);
                    assert_eq!(conn_peer(rank, 2, i), (peer, ch));
                    seen.push(i);
                }
            }
            seen.sort();
            assert_eq!(seen, (0..6).collect::<Vec<_>>());
        }
    }

    fn data_frame(seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut h = FrameHeader::new(FrameKind::Data);
        h.seq = seq;
        h.payload_len = payload.len() as u32;
        let mut f = h.to_bytes().to_vec();
        f.extend_from_slice(payload);
        f
    }

    /// One end of a simulated connection: the same `Outbound`, `Credits` and `Reassembly` the
    /// progress thread drives, with the QP replaced by an in-order message queue and a count of
    /// posted receive buffers.
    struct SimSide {
        out: Outbound,
        credits: Credits,
        credit_in_flight: bool,
        rx: Reassembly,
        posted: u32,
        /// Messages the device placed into receive buffers, not yet handled by the progress
        /// thread (their buffers are not reposted yet).
        completed: VecDeque<Vec<u8>>,
        delivered: Vec<Vec<u8>>,
    }

    /// Random interleavings of sending, credit returns and delivery between two ends with
    /// different slot sizes and receive pools: every frame arrives whole and in order, a message
    /// never finds its receiver without a posted buffer (so RNR retries are a safety net only),
    /// and some action is always possible until everything is delivered (no credit deadlock).
    #[test]
    fn fragments_and_credits_deliver_every_frame_without_overrunning_or_deadlock() {
        use rand::{Rng, SeedableRng};
        let pool = BufferPool::default();
        for seed in 0..60u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let recv = [rng.gen_range(4u32..=9), rng.gen_range(4u32..=9)];
            let slot = [rng.gen_range(48usize..=200), rng.gen_range(48usize..=200)];
            let frag = slot[0].min(slot[1]) - Prefix::LEN;
            let mut sent_frames: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
            let mut sides: Vec<SimSide> = (0..2)
                .map(|me| SimSide {
                    out: Outbound::new(frag),
                    credits: Credits::new(recv[me], recv[1 - me]),
                    credit_in_flight: false,
                    rx: Reassembly::default(),
                    posted: recv[me],
                    completed: VecDeque::new(),
                    delivered: Vec::new(),
                })
                .collect();
            for (me, side) in sides.iter_mut().enumerate() {
                // Side 1 sends only a few frames, so side 0's data mostly depends on
                // credit-only returns.
                let frames = if me == 0 { rng.gen_range(5..40) } else { rng.gen_range(0..4) };
                for i in 0..frames {
                    let len = if rng.gen_bool(0.2) { 0 } else { rng.gen_range(1..1500) };
                    let payload: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                    let f = data_frame(i + 1, &payload);
                    sent_frames[me].push(f.clone());
                    side.out.frames.push_back(f);
                }
            }
            // wire[d]: messages from side d to side 1 - d, in order; (is_credit, bytes).
            let mut wire: [VecDeque<(bool, Vec<u8>)>; 2] = [VecDeque::new(), VecDeque::new()];
            let mut steps = 0;
            loop {
                let done = (0..2).all(|d| {
                    sides[1 - d].delivered.len() == sent_frames[d].len() && wire[d].is_empty() && sides[d].completed.is_empty()
                });
                if done {
                    break;
                }
                steps += 1;
                assert!(steps < 200_000, "seed {seed}: no progress");
                // Enabled actions: (side, 0 = post data, 1 = post a credit, 2 = the head of its wire
                // arrives at the peer's device, 3 = its progress thread handles a completion).
                let mut enabled = Vec::new();
                for d in 0..2 {
                    if !sides[d].out.is_empty() && sides[d].credits.may_send_data() {
                        enabled.push((d, 0));
                    }
                    if sides[d].credits.owes_credit() && !sides[d].credit_in_flight {
                        enabled.push((d, 1));
                    }
                    if !wire[d].is_empty() {
                        enabled.push((d, 2));
                    }
                    if !sides[d].completed.is_empty() {
                        enabled.push((d, 3));
                    }
                }
                assert!(!enabled.is_empty(), "seed {seed}: credit deadlock (recv {recv:?}, slot {slot:?})");
                let (d, action) = enabled[rng.gen_range(0..enabled.len())];
                match action {
                    0 => {
                        let mut msg = vec![0u8; slot[0].max(slot[1])];
                        let (n, _) = sides[d].out.next_fragment(&mut msg[Prefix::LEN..]);
                        let consumed = sides[d].credits.on_send();
                        Prefix { kind: MessageKind::Fragment, consumed }.write(&mut msg);
                        msg.truncate(Prefix::LEN + n);
                        assert!(msg.len() <= slot[1 - d], "seed {seed}: message longer than the receiver's slot");
                        wire[d].push_back((false, msg));
                    }
                    1 => {
                        let mut msg = vec![0u8; Prefix::LEN];
                        let consumed = sides[d].credits.on_send();
                        Prefix { kind: MessageKind::Credit, consumed }.write(&mut msg);
                        sides[d].credit_in_flight = true;
                        wire[d].push_back((true, msg));
                    }
                    2 => {
                        let r = 1 - d;
                        assert!(sides[r].posted > 0, "seed {seed}: a message found no posted receive buffer (recv {recv:?})");
                        let (is_credit, msg) = wire[d].pop_front().expect("enabled");
                        // The sender's completion (the ack) frees its credit buffer.
                        if is_credit {
                            sides[d].credit_in_flight = false;
                        }
                        sides[r].posted -= 1;
                        sides[r].completed.push_back(msg);
                    }
                    _ => {
                        let msg = sides[d].completed.pop_front().expect("enabled");
                        let p = Prefix::parse(&msg).expect("valid prefix");
                        sides[d].credits.on_receive(p.consumed);
                        if p.kind == MessageKind::Fragment {
                            if let Some((h, frame)) = sides[d].rx.push(&msg[Prefix::LEN..], &pool).expect("valid fragments") {
                                assert_eq!(h.payload_len as usize, frame.len() - HEADER_LEN);
                                sides[d].delivered.push(frame);
                            }
                        }
                        sides[d].posted += 1; // reposted right after, as the progress thread does
                    }
                }
            }
            for d in 0..2 {
                assert_eq!(sides[1 - d].delivered, sent_frames[d], "seed {seed}: frames from side {d}");
            }
        }
    }

    #[test]
    fn reassembly_rejects_garbage_and_overruns() {
        let pool = BufferPool::default();
        let mut r = Reassembly::default();
        assert!(r.push(&[0u8; 10], &pool).is_err(), "shorter than a header");
        assert!(matches!(r.push(&[0u8; 60], &pool), Err(FrameError::BadMagic { .. })));
        let f = data_frame(1, &[7u8; 30]);
        let mut r = Reassembly::default();
        assert_eq!(r.push(&f[..50], &pool).unwrap(), None);
        let mut too_long = f[50..].to_vec();
        too_long.push(0);
        assert!(r.push(&too_long, &pool).is_err(), "more bytes than the header announced");
        let mut r = Reassembly::default();
        let (h, frame) = r.push(&f, &pool).unwrap().expect("whole frame in one fragment");
        assert_eq!((h.seq, frame), (1, f));
    }

    #[test]
    fn credits_wrap() {
        let mut c = Credits::new(16, 8);
        assert_eq!((c.window, c.threshold), (6, 3));
        c.sent = u32::MAX - 1;
        c.peer_consumed = u32::MAX - 3;
        assert!(c.may_send_data());
        for _ in 0..4 {
            c.on_send();
        }
        assert_eq!(c.sent, 2);
        assert!(!c.may_send_data(), "6 unconsumed across the wrap");
        c.on_receive(u32::MAX);
        assert!(c.may_send_data());
    }

    fn bootstrap_job(rank: usize, world: usize, listener: TcpListener, peers: Vec<SocketAddr>, timeout: Duration) -> ProgressJob {
        let (_cmd_tx, commands) = mpsc::channel();
        let (setup, _setup_rx) = mpsc::channel();
        ProgressJob {
            rank,
            world,
            peers,
            options: RdmaOptions { timeout, ..RdmaOptions::from_tcp(TcpOptions::default()) },
            listener,
            inbound: Vec::new(),
            commands,
            shared: Arc::new(SharedState::default()),
            pool: Arc::new(BufferPool::default()),
            setup,
        }
    }

    fn record_of(rank: usize, world: usize, channel: usize, qp_num: u32) -> BootstrapRecord {
        BootstrapRecord {
            world: world as u32,
            rank: rank as u32,
            channels: 1,
            channel: channel as u8,
            qp_num,
            psn: 0,
            lid: 0,
            gid: Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1 + rank as u8]),
            slot_bytes: RdmaOptions::DEFAULT_SLOT_BYTES as u32,
            recv_slots: RdmaOptions::DEFAULT_RECV_SLOTS as u32,
        }
    }

    /// The bootstrap exchange over loopback, with made-up QP numbers (no device needed for it):
    /// rank 1 dials rank 0, each side ends up with the other's record, and the connection stays
    /// open for the READY byte.
    #[test]
    fn bootstrap_exchanges_records_over_loopback() {
        let l0 = TcpListener::bind("127.0.0.1:0").unwrap();
        let peers = vec![l0.local_addr().unwrap(), "127.0.0.1:9".parse().unwrap()];
        let timeout = Duration::from_secs(10);
        let job0 = bootstrap_job(0, 2, l0, peers.clone(), timeout);
        let acceptor = std::thread::spawn(move || {
            let mut streams: Vec<Option<(TcpStream, BootstrapRecord)>> = vec![None];
            accept_all(&job0, 1, Instant::now() + timeout, &mut streams, |peer, ch| {
                assert_eq!((peer, ch), (1, 0));
                record_of(0, 2, ch, 0x100)
            })
            .map(|()| streams.pop().unwrap().unwrap())
        });
        let me = record_of(1, 2, 0, 0x201);
        let (mut s1, theirs) = dial(0, 0, peers[0], &me, Instant::now() + timeout, timeout).expect("dial");
        assert_eq!(theirs, record_of(0, 2, 0, 0x100));
        let (mut s0, got) = acceptor.join().unwrap().expect("accept");
        assert_eq!(got, me);
        s0.write_all(&[READY]).unwrap();
        let mut b = [0u8; 1];
        s1.read_exact(&mut b).unwrap();
        assert_eq!(b[0], READY);
    }

    /// A rank on the TCP transport dialing an RDMA rank: the RDMA side fails at once, naming the
    /// mismatch, instead of waiting out its timeout.
    #[test]
    fn a_tcp_rank_dialing_is_a_handshake_error_at_once() {
        let l0 = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l0.local_addr().unwrap();
        let timeout = Duration::from_secs(20);
        let job0 = bootstrap_job(0, 2, l0, vec![addr, "127.0.0.1:9".parse().unwrap()], timeout);
        let started = Instant::now();
        let acceptor = std::thread::spawn(move || {
            let mut streams: Vec<Option<(TcpStream, BootstrapRecord)>> = vec![None];
            accept_all(&job0, 1, Instant::now() + timeout, &mut streams, |_, ch| record_of(0, 2, ch, 1))
        });
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&crate::wire::Hello { world: 2, rank: 1, channels: 1 }.frame(0)).unwrap();
        let e = acceptor.join().unwrap().unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
        assert!(matches!(e, CollectiveError::Handshake { .. }), "{e:?}");
        assert!(e.to_string().contains("TCP transport"), "{e}");
    }

    /// An RDMA rank dialing a rank on the TCP transport: the TCP side hangs up on the record, and
    /// the timeout error says what that probably means.
    #[test]
    fn dialing_a_tcp_rank_times_out_naming_the_likely_cause() {
        let l0 = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l0.local_addr().unwrap();
        let peers = vec![addr, "127.0.0.1:9".parse().unwrap()];
        let tcp_rank = std::thread::spawn(move || {
            crate::transport::TcpTransport::connect(l0, 0, &peers, TcpOptions { channels: 1, timeout: Duration::from_secs(3) })
                .map(|_| ())
        });
        let me = record_of(1, 2, 0, 7);
        let e = dial(0, 0, addr, &me, Instant::now() + Duration::from_secs(2), Duration::from_secs(2)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, CollectiveError::ConnectTimeout { .. }), "{e:?}");
        assert!(msg.contains("TCP transport"), "{msg}");
        assert!(tcp_rank.join().unwrap().is_err(), "the TCP rank cannot have completed its mesh");
    }

    #[test]
    fn options_reject_unusable_buffers() {
        let o = RdmaOptions::from_tcp(TcpOptions::default());
        assert!(o.validate().is_ok());
        assert!(RdmaOptions { slot_bytes: 47, ..o.clone() }.validate().is_err());
        assert!(RdmaOptions { recv_slots: 3, ..o.clone() }.validate().is_err());
        assert!(RdmaOptions { channels: 0, ..o }.validate().is_err());
    }
}
