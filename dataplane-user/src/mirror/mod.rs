//! Mirrored-frame ingest: flows the host kernel never sees, counted from copies of their frames.
//!
//! RoCE that a NIC or DPU carries in hardware bypasses the host's network stack, so the TC
//! classifier never runs on it. A switch or DPU can mirror those frames (`tc ... action mirred
//! egress mirror`, a SPAN/ERSPAN port) to an interface the agent reads. This module reads that
//! interface with an `AF_PACKET` `TPACKET_V3` ring ([`ring`]), parses each frame with the
//! classifier's rules ([`crate::frame`]), applies the classifier's match rule and per-flow
//! accounting to a table of the same [`FlowStats`] records, and hands those records to the
//! collector with every poll ([`MirrorFeed::merge_into`]): from there on a mirrored flow is a flow
//! like any other (flow table, peers, detectors, `/v1/flows`, `/metrics`).
//!
//! Invariants:
//! - The accounting is the classifier's, transcribed ([`account`]): the same burst rule, the same
//!   counters, the same TCP retransmission / duplicate-ACK and RoCEv2 PSN rules (24-bit serial
//!   arithmetic, per destination QP, CNPs and ACKs outside the sequence, resynchronisation after a
//!   read request). One thread updates the table, so the kernel's compare-and-exchange guards
//!   have no counterpart and no detection is ever dropped for a race.
//! - Flow keys carry the mirror interface's index, so a mirrored flow never shares a key with a
//!   flow the classifier counts (the agent refuses a mirror interface it also attaches to). The
//!   direction is relative to the watched hosts: a frame whose source is in `local_prefixes` is
//!   `egress`, any other `ingress`, so the peer of a mirrored flow is the remote end, as on TC.
//! - Bounded: at most `max_flows` flows (a new flow beyond that is not tracked and is counted,
//!   like the kernel's map-full), a ring of `ring_blocks × ring_block_kib`, one ring block (at
//!   most `block_size / 64` frames) handled per hold of the table's lock and at most one ring's
//!   worth of blocks per wake-up, at most [`MAX_PENDING_EVENTS`] events between two polls (more
//!   are dropped and counted, like the kernel's ring buffer).
//!   Frames the ring had no room for are dropped by the kernel and counted (`tp_drops`).
//! - Timestamps: each frame's socket receive timestamp (CLOCK_REALTIME) is moved to
//!   CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns` that the flow table compares with, by the
//!   offset between the two clocks read at the batch. A timestamp more than
//!   [`TIMESTAMP_TOLERANCE`] away from now is replaced by now (counted).
pub mod ring;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    thread,
    time::{Duration, Instant},
};

use dataplane_common::{
    config_flags, direction, event_kind, flow_kind, track, wire, BurstState, Config, Event, FlowKey, FlowStats, PrefixKey,
    DEFAULT_BURST_GAP_NS,
};

use crate::{
    flow_table::PollSnapshot,
    frame::{self, Bth, Packet, Skip, TcpInfo},
};
use ring::{PacketRing, RingGeometry, RingStep};

/// Default cap on flows the mirror tracks.
pub const DEFAULT_MAX_FLOWS: usize = 16_384;
/// Default ring: 16 blocks of 256 KiB (4 MiB). A frame of 256 bytes or more takes 352 bytes of a
/// block (the 48-byte `tpacket3_hdr` and a `sockaddr_ll` before the MAC header at offset 82, the
/// whole aligned to 16: net/packet/af_packet.c, tpacket_rcv), so a block holds 744 of them and the
/// ring about 11 900 while the ingest thread is not scheduled.
pub const DEFAULT_RING_BLOCKS: u32 = 16;
pub const DEFAULT_RING_BLOCK_KIB: u32 = 256;
/// Bytes of each frame kept: the longest header chain the classifier reads is 106 bytes
/// (Ethernet, two VLAN tags, IPv4 with options, UDP, BTH, AETH).
pub const SNAP_LEN: u32 = 256;
/// A block that is not full is handed over this long after its first frame.
pub const RING_RETIRE: Duration = Duration::from_millis(10);
/// Events (burst ends, flow starts) held between two collector polls.
pub const MAX_PENDING_EVENTS: usize = 4096;
/// How far a frame's timestamp may be from the clock before it is replaced by the clock.
pub const TIMESTAMP_TOLERANCE: Duration = Duration::from_secs(10);

/// The `[mirror]` settings, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct MirrorSettings {
    /// The interface mirrored frames arrive on.
    pub interface: String,
    /// Sources in these prefixes make a flow `egress`, others `ingress`.
    pub local_prefixes: Vec<PrefixKey>,
    pub max_flows: usize,
    pub ring_blocks: u32,
    pub ring_block_kib: u32,
}

impl MirrorSettings {
    pub fn new(interface: String) -> Self {
        MirrorSettings {
            interface,
            local_prefixes: Vec::new(),
            max_flows: DEFAULT_MAX_FLOWS,
            ring_blocks: DEFAULT_RING_BLOCKS,
            ring_block_kib: DEFAULT_RING_BLOCK_KIB,
        }
    }
}

/// Errors starting the mirror ingest.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error("mirror interface `{interface}` does not exist in this network namespace; check [mirror] interface (`ip link show`) and that the agent runs in the namespace of the mirror port")]
    NoInterface { interface: String },
    #[error("mirror interface `{interface}` is also in `interfaces`: its frames would be counted twice; give the mirror port its own interface")]
    AlsoAttached { interface: String },
    #[error("reading mirrored frames on `{interface}` needs CAP_NET_RAW ({step} failed: {source}); run the agent as root or grant it CAP_NET_RAW")]
    Permission { interface: String, step: RingStep, source: std::io::Error },
    #[error("cannot open the mirror ring on `{interface}`: {step} failed: {source}; check [mirror] ring_blocks and ring_block_kib (a power of two of at least 4 KiB)")]
    Ring { interface: String, step: RingStep, source: std::io::Error },
}

/// What became of the frames, and the table's bounds at work. Totals since the agent started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MirrorCounters {
    /// Frames taken from the ring.
    pub seen: u64,
    /// Parsed down to TCP/UDP/RoCEv2.
    pub parsed: u64,
    /// Parsed and counted in a flow.
    pub matched: u64,
    pub malformed: u64,
    pub unsupported: u64,
    /// Headers beyond the snap length.
    pub unreadable: u64,
    /// Matched frames of new flows not tracked because the table held `max_flows`.
    pub table_full: u64,
    /// Events dropped because [`MAX_PENDING_EVENTS`] were waiting for the collector.
    pub events_dropped: u64,
    /// Frames whose timestamp was replaced by the clock.
    pub timestamp_fallbacks: u64,
    /// Frames the kernel delivered to the socket (PACKET_STATISTICS `tp_packets`, drops included).
    pub socket_packets: u64,
    /// Frames the kernel dropped because the ring was full (PACKET_STATISTICS `tp_drops`).
    pub ring_drops: u64,
}

/// The match rule of the kernel's `CONFIG` (see `dataplane_common::Config`): its port ranges, and
/// when its `n_prefixes` is not 0 the agent's `[match]` prefixes (the kernel's `MATCH_PREFIXES`).
#[derive(Debug, Clone, Default)]
pub struct FlowMatch {
    config: Option<Config>,
    prefixes: Vec<PrefixKey>,
}

impl FlowMatch {
    pub fn new(config: Config, prefixes: Vec<PrefixKey>) -> Self {
        FlowMatch { config: Some(config), prefixes }
    }

    fn collective(&self, p: &Packet) -> bool {
        if p.key.kind == flow_kind::ROCEV2 {
            return true;
        }
        let Some(cfg) = &self.config else { return false };
        let n_ranges = cfg.n_port_ranges as usize;
        // As in the kernel, `n_prefixes` (not the list) decides whether prefixes are looked at.
        let n_prefixes = cfg.n_prefixes;
        if n_ranges == 0 && n_prefixes == 0 {
            return false;
        }
        let k = &p.key;
        if n_ranges != 0
            && !cfg.port_ranges[..n_ranges.min(cfg.port_ranges.len())].iter().any(|r| {
                (r.protocol == 0 || r.protocol == k.protocol)
                    && ((k.src_port >= r.lo && k.src_port <= r.hi) || (k.dst_port >= r.lo && k.dst_port <= r.hi))
            })
        {
            return false;
        }
        n_prefixes == 0 || in_prefixes(&self.prefixes, &k.src_addr) || in_prefixes(&self.prefixes, &k.dst_addr)
    }

    fn burst_gap_ns(&self) -> u64 {
        match self.config.map(|c| c.burst_gap_ns) {
            Some(0) | None => DEFAULT_BURST_GAP_NS,
            Some(g) => g,
        }
    }

    fn flags(&self) -> u32 {
        self.config.map_or(0, |c| c.flags)
    }
}

/// Whether `addr` (16 bytes, IPv4-mapped for IPv4) is in one of `prefixes` (LPM keys).
fn in_prefixes(prefixes: &[PrefixKey], addr: &[u8; 16]) -> bool {
    prefixes.iter().any(|p| {
        let bits = p.prefix_len.min(128) as usize;
        let (whole, rest) = (bits / 8, bits % 8);
        addr[..whole] == p.addr[..whole] && (rest == 0 || (addr[whole] ^ p.addr[whole]) & (0xff << (8 - rest)) == 0)
    })
}

/// Accounts one packet to its flow at `now` (CLOCK_MONOTONIC ns), as the classifier's
/// `update_flow`, `tcp_track` and `rocev2_track` do. Returns the burst that this packet ended, if
/// any (not for the flow's first packet).
pub fn account(s: &mut FlowStats, p: &Packet, now: u64, burst_gap_ns: u64) -> Option<BurstState> {
    let last = s.last_seen_ns;
    let since = now.wrapping_sub(last) as i64;
    let mut ended = None;
    if last == 0 || since > burst_gap_ns as i64 {
        if last == 0 {
            s.first_seen_ns = now;
        } else {
            ended = Some(BurstState {
                start_ns: s.burst_start_ns,
                last_ns: last,
                bytes: s.bytes.wrapping_sub(s.burst_start_bytes),
                packets: s.packets.wrapping_sub(s.burst_start_packets),
            });
        }
        s.last_seen_ns = now;
        s.burst_start_ns = now;
        s.burst_start_packets = s.packets;
        s.burst_start_bytes = s.bytes;
    } else if since > 0 {
        s.last_seen_ns = now;
    }
    s.packets += 1;
    s.bytes += u64::from(p.l3_bytes);
    s.payload_bytes += u64::from(p.payload_bytes);
    if p.ecn == wire::ECN_CE {
        s.ce_marks += 1;
    }
    match p.key.kind {
        flow_kind::TCP => tcp_track(s, &p.tcp, p.payload_bytes),
        flow_kind::ROCEV2 => rocev2_track(s, &p.bth),
        _ => {}
    }
    ended
}

fn tcp_track(s: &mut FlowStats, t: &TcpInfo, payload: u32) {
    let f = t.flags;
    s.tcp_syn += u64::from(f & wire::TCP_SYN != 0);
    s.tcp_fin += u64::from(f & wire::TCP_FIN != 0);
    s.tcp_rst += u64::from(f & wire::TCP_RST != 0);
    s.tcp_ece += u64::from(f & wire::TCP_ECE != 0);
    s.tcp_cwr += u64::from(f & wire::TCP_CWR != 0);
    if payload > 0 {
        let end = t.seq.wrapping_add(payload);
        let Some(high) = track::tcp(s.tcp_seq_end) else {
            s.tcp_seq_end = track::VALID | u64::from(end);
            return;
        };
        // Serial-number comparison (RFC 1982): negative i32 difference means "before".
        if (t.seq.wrapping_sub(high) as i32) < 0 {
            // A wire frame is one segment (the classifier's GSO split does not apply).
            s.tcp_retrans += 1;
        }
        if (end.wrapping_sub(high) as i32) > 0 {
            s.tcp_seq_end = track::VALID | u64::from(end);
        }
    } else if f & wire::TCP_ACK != 0 && f & (wire::TCP_SYN | wire::TCP_FIN | wire::TCP_RST) == 0 {
        s.tcp_pure_acks += 1;
        s.tcp_dsacks += u64::from(t.dsack);
    }
}

/// RC RDMA READ Request and RC ATOMIC Acknowledge (IBA Table 38), as in the classifier.
const RC_RDMA_READ_REQUEST: u8 = 0x0C;
const RC_ATOMIC_ACK: u8 = 0x12;
const PSN_HALF: u32 = 1 << 23;

fn rocev2_track(s: &mut FlowStats, b: &Bth) {
    if b.opcode == wire::bth_opcode::CNP {
        s.roce_cnps += 1;
        return;
    }
    if b.opcode == wire::bth_opcode::RC_ACK {
        if b.syndrome & wire::AETH_SYNDROME_KIND_MASK == wire::AETH_SYNDROME_NAK {
            s.roce_naks += 1;
        }
        return;
    }
    if b.opcode == RC_ATOMIC_ACK {
        return;
    }
    let mut gap = 0;
    if let Some((expected, qp)) = track::psn(s.roce_psn) {
        if qp == b.dest_qp {
            let delta = b.psn.wrapping_sub(expected) & wire::PSN_MASK;
            if delta >= PSN_HALF {
                // Behind: retransmission or reordering; the expectation stays.
                s.roce_psn_out_of_order += 1;
                return;
            }
            gap = delta;
        }
    }
    s.roce_psn = track::psn_word(b.psn.wrapping_add(1), b.dest_qp, b.opcode != RC_RDMA_READ_REQUEST);
    if gap != 0 {
        s.roce_psn_gap_events += 1;
        s.roce_psn_gap_packets += u64::from(gap);
    }
}

/// The mirror's flows and counters: what the ingest thread writes and the collector reads.
#[derive(Debug)]
pub struct MirrorTable {
    ifindex: u32,
    local_prefixes: Vec<PrefixKey>,
    matching: FlowMatch,
    max_flows: usize,
    flows: HashMap<FlowKey, FlowStats>,
    events: Vec<Event>,
    pub counters: MirrorCounters,
}

impl MirrorTable {
    pub fn new(ifindex: u32, settings: &MirrorSettings, matching: FlowMatch) -> Self {
        MirrorTable {
            ifindex,
            local_prefixes: settings.local_prefixes.clone(),
            matching,
            max_flows: settings.max_flows,
            flows: HashMap::new(),
            events: Vec::new(),
            counters: MirrorCounters::default(),
        }
    }

    /// Counts one frame (`bytes` captured of `wire_len`) received at `now` (CLOCK_MONOTONIC ns).
    pub fn ingest(&mut self, bytes: &[u8], wire_len: usize, now: u64) {
        self.counters.seen += 1;
        let mut p = match frame::parse(bytes, wire_len) {
            Ok(p) => p,
            Err(Skip::Malformed) => return self.counters.malformed += 1,
            Err(Skip::Unsupported) => return self.counters.unsupported += 1,
            Err(Skip::Unreadable) => return self.counters.unreadable += 1,
        };
        self.counters.parsed += 1;
        if !self.matching.collective(&p) {
            return;
        }
        p.key.ifindex = self.ifindex;
        p.key.direction =
            if in_prefixes(&self.local_prefixes, &p.key.src_addr) { direction::EGRESS } else { direction::INGRESS };
        let flags = self.matching.flags();
        let full = self.flows.len() >= self.max_flows;
        let s = match self.flows.get_mut(&p.key) {
            Some(s) => s,
            None if full => return self.counters.table_full += 1,
            None => {
                if flags & config_flags::FLOW_START_EVENTS != 0 {
                    push_event(&mut self.events, &mut self.counters, event_kind::FLOW_START, p.key, BurstState { start_ns: now, ..Default::default() });
                }
                self.flows.entry(p.key).or_default()
            }
        };
        self.counters.matched += 1;
        if let Some(ended) = account(s, &p, now, self.matching.burst_gap_ns()) {
            if flags & config_flags::BURST_EVENTS != 0 {
                push_event(&mut self.events, &mut self.counters, event_kind::BURST_END, p.key, ended);
            }
        }
    }

    /// Adds every flow and the pending events to a poll of the kernel maps.
    pub fn merge_into(&mut self, snap: &mut PollSnapshot) {
        snap.flows.extend(self.flows.iter().map(|(k, v)| (*k, *v)));
        snap.events.append(&mut self.events);
    }

    /// Forgets flows the flow table dropped (keys of other interfaces are not here: ignored).
    pub fn forget(&mut self, keys: &[FlowKey]) {
        for k in keys.iter().filter(|k| k.ifindex == self.ifindex) {
            self.flows.remove(k);
        }
    }

    pub fn len(&self) -> usize {
        self.flows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    pub fn get(&self, key: &FlowKey) -> Option<&FlowStats> {
        self.flows.get(key)
    }

    /// Every flow and its record (what `merge_into` hands the collector).
    pub fn flows(&self) -> impl Iterator<Item = (FlowKey, FlowStats)> + '_ {
        self.flows.iter().map(|(k, v)| (*k, *v))
    }
}

fn push_event(events: &mut Vec<Event>, c: &mut MirrorCounters, kind: u32, key: FlowKey, burst: BurstState) {
    if events.len() >= MAX_PENDING_EVENTS {
        c.events_dropped += 1;
    } else {
        events.push(Event { kind, _pad: 0, key, _pad2: 0, burst });
    }
}

/// A snapshot of the mirror for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MirrorStatus {
    pub interface: String,
    pub ifindex: u32,
    pub flows: usize,
    pub counters: MirrorCounters,
}

/// The collector's and the API's handle on a running mirror ingest.
#[derive(Debug, Clone)]
pub struct MirrorFeed {
    interface: String,
    ifindex: u32,
    table: Arc<Mutex<MirrorTable>>,
}

impl MirrorFeed {
    pub fn new(interface: String, table: MirrorTable) -> Self {
        MirrorFeed { interface, ifindex: table.ifindex, table: Arc::new(Mutex::new(table)) }
    }

    fn lock(&self) -> MutexGuard<'_, MirrorTable> {
        // A panic in the ingest thread leaves counters, never a half-updated invariant that
        // matters more than losing the mirror: keep serving what is there.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds the mirror's flows and events to a poll (the collector's hook).
    pub fn merge_into(&self, snap: &mut PollSnapshot) {
        self.lock().merge_into(snap);
    }

    /// Forgets flows the flow table dropped (the collector's hook).
    pub fn forget(&self, keys: &[FlowKey]) {
        self.lock().forget(keys);
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    pub fn interface(&self) -> &str {
        &self.interface
    }

    pub fn status(&self) -> MirrorStatus {
        let t = self.lock();
        MirrorStatus { interface: self.interface.clone(), ifindex: self.ifindex, flows: t.len(), counters: t.counters }
    }
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC, in ns, read now.
fn realtime_offset_ns() -> i128 {
    let real = crate::clock::unix_seconds();
    let mono = crate::clock::monotonic_ns();
    (real * 1e9) as i128 - mono as i128
}

/// Opens the ring on `settings.interface` and starts the ingest thread, which runs until `stop`.
/// `attached` are the interfaces the classifier is attached to (the mirror must not be one).
pub fn start(
    settings: &MirrorSettings,
    matching: FlowMatch,
    attached: &[String],
    stop: Arc<AtomicBool>,
) -> Result<(MirrorFeed, thread::JoinHandle<()>), MirrorError> {
    let interface = settings.interface.clone();
    if attached.contains(&interface) {
        return Err(MirrorError::AlsoAttached { interface });
    }
    let ifindex = ring::ifindex(&interface).ok_or_else(|| MirrorError::NoInterface { interface: interface.clone() })?;
    let geometry = RingGeometry {
        block_size: settings.ring_block_kib * 1024,
        blocks: settings.ring_blocks,
        snap_len: SNAP_LEN,
        retire: RING_RETIRE,
    };
    let mut ring = PacketRing::open(ifindex, geometry).map_err(|(step, source)| {
        if matches!(source.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
            MirrorError::Permission { interface: interface.clone(), step, source }
        } else {
            MirrorError::Ring { interface: interface.clone(), step, source }
        }
    })?;
    let feed = MirrorFeed::new(interface.clone(), MirrorTable::new(ifindex, settings, matching));
    let shared = feed.clone();
    let blocks = settings.ring_blocks;
    let handle = thread::Builder::new()
        .name("ringside-mirror".into())
        .spawn(move || ingest_loop(&mut ring, &shared, blocks, &stop))
        .expect("spawning the mirror thread");
    tracing::info!(interface = %interface, ifindex, ring_kib = settings.ring_blocks * settings.ring_block_kib, "reading mirrored frames");
    Ok((feed, handle))
}

fn ingest_loop(ring: &mut PacketRing, feed: &MirrorFeed, blocks: u32, stop: &AtomicBool) {
    let tolerance = TIMESTAMP_TOLERANCE.as_nanos() as i128;
    let mut last_stats = Instant::now();
    let mut warned_clock = false;
    let mut wait_errors = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = ring.wait(Duration::from_millis(50)) {
            // Logged the first time and then every 1000th, not every 50 ms.
            if wait_errors.is_multiple_of(1000) {
                tracing::warn!(errors = wait_errors + 1, "waiting on the mirror ring failed: {e}");
            }
            wait_errors += 1;
            thread::sleep(Duration::from_millis(50));
        }
        // Drain the ready blocks, at most one ring's worth per wake-up so the stop flag and the
        // socket statistics are looked at even under a flood. The table's lock is held for one
        // block at a time (at most `block_size / 64` frames), so a poll never waits behind a
        // long backlog.
        for _ in 0..blocks {
            let offset = realtime_offset_ns();
            let now_mono = crate::clock::monotonic_ns() as i128;
            let mut table = feed.lock();
            let mut fallbacks = 0u64;
            let got = ring.next_block(|f| {
                let mut mono = f.realtime_ns as i128 - offset;
                if (mono - now_mono).abs() > tolerance {
                    mono = now_mono;
                    fallbacks += 1;
                }
                table.ingest(f.bytes, f.wire_len, mono as u64);
            });
            table.counters.timestamp_fallbacks += fallbacks;
            drop(table);
            if fallbacks > 0 && !warned_clock {
                warned_clock = true;
                tracing::warn!(fallbacks, "mirrored frames carry timestamps far from the clock; their receive time is used instead (counted in ringside_mirror_timestamp_fallbacks_total)");
            }
            if got.is_none() || stop.load(Ordering::Relaxed) {
                break;
            }
        }
        if last_stats.elapsed() >= Duration::from_millis(100) {
            last_stats = Instant::now();
            match ring.statistics() {
                Ok((packets, drops)) => {
                    let mut t = feed.lock();
                    t.counters.socket_packets += packets;
                    t.counters.ring_drops += drops;
                }
                Err(e) => tracing::debug!("PACKET_STATISTICS on the mirror socket failed: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests;
