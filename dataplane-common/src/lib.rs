//! Types shared by the eBPF flow monitor (kernel) and the ringside agent (user space).
//!
//! Every type that crosses the kernel/user boundary lives here and follows the same rules:
//! `#[repr(C)]`, `Copy`, explicit padding fields (so no byte of a key is ever uninitialised, which
//! would make two equal flows hash differently), no `bool`/`enum`/`Option` inside a map value, and
//! a compile-time size assertion beside each type. Layout tests on the user side (`tests` below and
//! the agent's loader) check field offsets too.
//!
//! Each of these types derives zerocopy's `FromBytes`, `IntoBytes`, `Immutable` and `KnownLayout`,
//! so the compiler checks (in the eBPF build and the agent's alike) what used to be argued in
//! comments: the type has no implicit padding (`IntoBytes`: every byte is a field's, so a key never
//! carries an uninitialised byte into the kernel's hash) and every bit pattern is a valid value
//! (`FromBytes`: the agent may view any bytes the kernel hands back as one). A field that broke
//! either rule (a `bool`, an enum, a gap left by alignment) fails the build. The agent reads and
//! writes these types as bytes only through those traits, never with pointer casts.
//!
//! Addresses are stored as 16 bytes: IPv6 as is, IPv4 as an IPv4-mapped IPv6 address
//! (`::ffff:a.b.c.d`, RFC 4291 §2.5.5.2), so one key type and one LPM trie serve both families.
//! Ports, PSNs and sequence numbers are stored in host byte order.
#![no_std]

pub mod wire;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Names of the maps in the eBPF object; the agent finds and pins them by these names.
pub mod maps {
    /// Per-flow counters, open burst and sequence tracking state, one entry shared by all CPUs.
    pub const FLOWS: &str = "FLOWS";
    pub const CONFIG: &str = "CONFIG";
    pub const MATCH_PREFIXES: &str = "MATCH_PREFIXES";
    pub const EVENTS: &str = "EVENTS";
    pub const STATS: &str = "STATS";
}

/// Names of the programs in the eBPF object.
pub mod programs {
    /// The TC classifier attached to clsact ingress and egress.
    pub const FLOWMON: &str = "flowmon";
    /// An empty classifier with the same attach type, used as the baseline by `cargo xtask bench ebpf`.
    pub const NOOP: &str = "noop";
}

/// Capacity of `FLOWS` (entries) compiled into the object: the default. The
/// loader may set another capacity at load time (`kernel_max_flows`, `EbpfLoader::map_max_entries`),
/// up to [`KERNEL_MAX_FLOWS_LIMIT`]. LRU maps evict the least recently used flow when full; an
/// eviction of a live flow is counted in `STATS[MAP_FULL]` when the update itself fails.
pub const MAX_FLOWS: u32 = 16_384;
/// Largest capacity a loader may give `FLOWS`; also the bound of user-space walks
/// over `FLOWS`. An entry takes about 300 bytes of kernel memory whatever the CPU count (200-byte
/// value, key and element header; `cargo xtask bench ebpf` prints the kernel's accounting).
pub const KERNEL_MAX_FLOWS_LIMIT: u32 = 1 << 20;
/// Capacity of the `MATCH_PREFIXES` LPM trie.
pub const MAX_PREFIXES: u32 = 256;
/// Size of the `EVENTS` ring buffer in bytes (a power of two and a multiple of the page size).
pub const EVENTS_RING_BYTES: u32 = 256 * 1024;
/// Number of port ranges the configuration can carry.
pub const MAX_PORT_RANGES: usize = 16;
/// Default idle gap that ends a burst: 1 ms.
pub const DEFAULT_BURST_GAP_NS: u64 = 1_000_000;

/// UDP destination port of RoCEv2 (IANA).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Direction of a packet relative to the interface the program is attached to.
pub mod direction {
    pub const INGRESS: u8 = 0;
    pub const EGRESS: u8 = 1;
}

/// What kind of flow a key describes (`FlowKey::kind`).
pub mod flow_kind {
    pub const TCP: u8 = 1;
    pub const UDP: u8 = 2;
    /// UDP to or from port 4791 carrying an InfiniBand Base Transport Header.
    pub const ROCEV2: u8 = 3;
}

/// Indices into the per-CPU `STATS` array.
pub mod stats {
    /// Packets the program ran on.
    pub const SEEN: u32 = 0;
    /// Packets parsed down to a transport header (TCP, UDP or RoCEv2).
    pub const PARSED: u32 = 1;
    /// Packets that matched the collective-flow configuration (RoCEv2 always matches). Includes the
    /// packets that then could not be counted in `FLOWS` (`MAP_FULL`, `CONTENDED`): the packets
    /// in flows are `MATCHED - MAP_FULL - CONTENDED`.
    pub const MATCHED: u32 = 2;
    /// Packets whose headers were truncated or inconsistent (bad IHL, length shorter than a header).
    pub const MALFORMED: u32 = 3;
    /// Packets the parser skips by design: non-IP, IPv6 extension headers, IP fragments, other L4.
    pub const UNSUPPORTED: u32 = 4;
    /// Matched packets of a flow that has no slot in `FLOWS` and found every slot of its window
    /// taken by other flows: passed uncounted (a subset of `MATCHED`).
    pub const MAP_FULL: u32 = 5;
    /// A ring-buffer reservation failed (consumer too slow): the event is lost, the packet is not.
    pub const RINGBUF_FULL: u32 = 6;
    /// Events written to the ring buffer.
    pub const EVENTS: u32 = 7;
    /// Packets whose headers lay beyond the linear part of the skb and could not be pulled into it
    /// (`bpf_skb_pull_data` failed, e.g. out of memory): the packet passes uncounted.
    pub const UNREADABLE: u32 = 8;
    /// Matched packets of a flow whose `FLOWS` slot another CPU was claiming at that moment (the
    /// flow's first packets arriving on two CPUs at once), or whose slot the agent evicted or
    /// another flow re-claimed between two reads of it: passed uncounted rather than waiting (a
    /// subset of `MATCHED`).
    pub const CONTENDED: u32 = 9;
    /// Number of entries in `STATS`.
    pub const COUNT: u32 = 10;
}

/// Kinds of records on the `EVENTS` ring buffer.
pub mod event_kind {
    /// First packet of a flow seen by this program instance.
    pub const FLOW_START: u32 = 1;
    /// A burst ended: the idle gap elapsed and a new packet started the next burst.
    pub const BURST_END: u32 = 2;
    /// A matched flow found no free slot in its `FLOWS` window; the key is the flow that could not
    /// be tracked. At most [`MAP_FULL_EVENTS_PER_SEC`](super::MAP_FULL_EVENTS_PER_SEC) per second
    /// per CPU (every packet of such a flow would qualify); `STATS[MAP_FULL]` counts them all.
    pub const MAP_FULL: u32 = 3;
}

/// Key of `FLOWS`: 5-tuple + interface + direction. 44 bytes, no implicit padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FlowKey {
    /// Source address, IPv4-mapped for IPv4.
    pub src_addr: [u8; 16],
    /// Destination address, IPv4-mapped for IPv4.
    pub dst_addr: [u8; 16],
    pub src_port: u16,
    pub dst_port: u16,
    /// Interface index the program is attached to.
    pub ifindex: u32,
    /// IP protocol number (6 TCP, 17 UDP).
    pub protocol: u8,
    /// `direction::INGRESS` or `direction::EGRESS`.
    pub direction: u8,
    /// `flow_kind::*`.
    pub kind: u8,
    pub _pad: u8,
}
const _: () = assert!(core::mem::size_of::<FlowKey>() == 44);

/// The value of `FLOWS` (a shared LRU hash, key [`FlowKey`]): a flow's counters, its open burst
/// and the tracking state of the retransmission, duplicate-ACK and PSN detections, in one entry so
/// a matched packet costs one map lookup. One copy shared by all CPUs (not per CPU): counters are
/// added with atomic adds, so two CPUs handling one flow never lose a count, and a retransmission
/// is seen whichever CPU handled the original. The agent reads the entry as is (no sum over CPUs).
///
/// The fields one packet touches come first (counters, last packet, open burst, tracking words:
/// 64 bytes). Each tracking word holds a value *and* its [`track::VALID`] bit, written with a single
/// store, so a reader on another CPU never sees a half-written state. See [`track`] for the
/// encodings. 200 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FlowStats {
    /// Wire packets (a GSO skb counts its `gso_segs`).
    pub packets: u64,
    /// L3 bytes (IP header included, once per wire packet), so rates match what the IP layer carried.
    pub bytes: u64,
    /// Transport payload bytes (TCP/UDP payload; for RoCEv2 the UDP payload).
    pub payload_bytes: u64,
    /// `bpf_ktime_get_ns()` of the latest packet (0 = none yet); also the end of the open burst.
    pub last_seen_ns: u64,
    /// `bpf_ktime_get_ns()` of the open burst's first packet.
    pub burst_start_ns: u64,
    /// TCP: highest `seq + payload_len` seen (wrapping), low 32 bits; `track::VALID`.
    pub tcp_seq_end: u64,
    /// Unused, zero (layout 3 kept the last pure ACK's number here, for duplicate ACKs).
    pub _reserved: u64,
    /// RoCEv2: next expected PSN (bits 0..24), destination QP it belongs to (bits 24..48);
    /// `track::VALID`.
    pub roce_psn: u64,

    /// `packets` and `bytes` before the open burst's first packet: the open burst holds
    /// `packets - burst_start_packets` packets (the kernel adds nothing per packet for a burst).
    pub burst_start_packets: u64,
    pub burst_start_bytes: u64,
    /// `bpf_ktime_get_ns()` of the flow's first packet (0 = never).
    pub first_seen_ns: u64,
    /// Packets with IP ECN = CE (0b11).
    pub ce_marks: u64,

    // --- TCP ---
    /// Data segments sent again: wire segments whose sequence range starts below the highest
    /// sequence end already seen (retransmission or reordering). A GSO skb counts the segments
    /// that lie below that end.
    pub tcp_retrans: u64,
    /// Segments without payload carrying ACK and no SYN/FIN/RST.
    pub tcp_pure_acks: u64,
    /// Pure ACKs carrying a D-SACK (RFC 2883: a SACK option whose first block starts below the
    /// ACK number): the receiver got data it already had, so a retransmission of the reverse
    /// flow was spurious. Subtracted from that flow's `tcp_retrans` as loss evidence.
    pub tcp_dsacks: u64,
    pub tcp_ece: u64,
    pub tcp_cwr: u64,
    pub tcp_rst: u64,
    pub tcp_fin: u64,
    pub tcp_syn: u64,

    // --- RoCEv2 ---
    /// Times the PSN jumped ahead of the expected one.
    pub roce_psn_gap_events: u64,
    /// Sum of the PSNs skipped by those jumps (packets presumed lost).
    pub roce_psn_gap_packets: u64,
    /// Packets whose PSN was behind the expected one (retransmission / reorder).
    pub roce_psn_out_of_order: u64,
    /// ACK packets whose AETH syndrome says NAK.
    pub roce_naks: u64,
    /// Congestion Notification Packets (BTH opcode 0x81).
    pub roce_cnps: u64,
}
const _: () = assert!(core::mem::size_of::<FlowStats>() == 200);

/// One slot of `FLOWS`, a `BPF_F_MMAPABLE` array used as an open-addressing hash table: the
/// program finds a flow at `flow_hash(key) & flow_slot_mask` or one of the next
/// [`FLOW_PROBES`] - 1 slots, and the agent reads the whole array in place through `mmap` (no
/// syscall per poll). `state` says who owns the rest of the slot (see [`slot_state`]). 256 bytes,
/// so a slot never straddles more cache lines than it must and slot `i` sits at `256 * i`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct FlowSlot {
    /// [`slot_state`] tag in the top two bits, the key's fingerprint (high 32 bits of its
    /// [`flow_hash`]) in the low 32 bits for `CLAIMING` and `LIVE`.
    pub state: u64,
    /// Valid while `state` is `LIVE`.
    pub key: FlowKey,
    pub _pad: u32,
    pub stats: FlowStats,
}
const _: () = assert!(core::mem::size_of::<FlowSlot>() == 256);

/// Slots the program probes for one flow, from its home slot on. A flow whose home slot and the
/// next `FLOW_PROBES - 1` are all taken by other flows is not counted (`STATS[MAP_FULL]`).
/// Linear probing clusters, so the window must be long: simulated (random keys, 2^15 slots), a new
/// flow finds its whole window taken with probability 3 % at load 0.5 with 8 probes, 0.5 % with
/// 16, and none in 20,000 tries with 32 (2 % at load 0.7, 8 % at 0.8). An existing flow is found
/// after about 1.5 probes on average at load 0.5, so the long window costs only the rare miss.
pub const FLOW_PROBES: u32 = 32;

/// The `state` word of a [`FlowSlot`]. Transitions (CAS = one compare-and-exchange):
/// - `EMPTY`/`TOMBSTONE` → `CLAIMING|fp` (program, CAS), then key and zeroed stats written, then
///   `LIVE|fp` (program, BPF_XCHG: fully ordered, so the key is visible first on arm64 too): a
///   flow's first packet;
/// - `LIVE|fp` → `TOMBSTONE` (agent, CAS): an idle flow evicted. Lookups go on past a tombstone
///   (a flow further along may have probed over it); inserts may reuse it.
/// - `TOMBSTONE` → `EMPTY` (agent, CAS per slot): right after an eviction, the run of tombstones
///   holding the evicted slot, when the slot after the run is `EMPTY` (no flow beyond an `EMPTY`
///   has its home before it, so none needs the run to be probed over), emptied from its end
///   backwards. A slot the program claimed meanwhile fails the CAS and ends the walk.
///
/// A packet that finds `CLAIMING` with its own fingerprint is counted `STATS[CONTENDED]` and
/// passes uncounted (fail open: the program never waits for another CPU).
pub mod slot_state {
    pub const EMPTY: u64 = 0;
    pub const CLAIMING: u64 = 1 << 62;
    pub const LIVE: u64 = 2 << 62;
    pub const TOMBSTONE: u64 = 3 << 62;
    pub const TAG_MASK: u64 = 3 << 62;
    /// `tag | fingerprint of hash`.
    pub const fn with_fp(tag: u64, hash: u64) -> u64 {
        tag | (hash >> 32)
    }
}

/// The hash of a flow key used by `FLOWS`' open addressing: an NH-style sum of products of the
/// key's eleven 32-bit words plus per-word constants (independent multiplies, so the BPF JIT's
/// code is short and parallel), then the 64-bit finaliser of MurmurHash3 so that both the low
/// bits (the home slot) and the high bits (the fingerprint) depend on every key bit. Shared by the
/// program and the agent (tests, the benchmark's fill).
#[inline(always)]
pub fn flow_hash(key: &FlowKey, seed: u32) -> u64 {
    const K: [u32; 12] = [
        0x9e37_79b9, 0x7f4a_7c15, 0xf39c_c060, 0x5ced_c834, 0x2b7e_1516, 0x28ae_d2a6, 0xabf7_1588, 0x09cf_4f3c,
        0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344,
    ];
    // SAFETY: FlowKey is 44 bytes, 4-aligned, with no padding (IntoBytes): eleven u32 words.
    let w = unsafe { &*(key as *const FlowKey).cast::<[u32; 11]>() };
    let m = |i: usize| if i < 11 { w[i] } else { 0 };
    let mut h: u64 = 0;
    let mut i = 0;
    while i < 12 {
        let a = m(i).wrapping_add(K[i] ^ seed) as u64;
        let b = m(i + 1).wrapping_add(K[i + 1] ^ seed) as u64;
        h = h.wrapping_add(a.wrapping_mul(b));
        i += 2;
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// A burst as the `BURST_END` event reports it: first and last packet, bytes and packets. 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BurstState {
    pub start_ns: u64,
    pub last_ns: u64,
    pub bytes: u64,
    pub packets: u64,
}
const _: () = assert!(core::mem::size_of::<BurstState>() == 32);

/// Encodings of the tracking words of [`FlowStats`].
pub mod track {
    /// The word holds an observed value (0 = nothing observed yet, or resynchronising).
    pub const VALID: u64 = 1 << 63;
    /// `FlowStats::roce_psn`: the destination QP starts at this bit.
    pub const QP_SHIFT: u32 = 24;
    /// 24-bit mask of a PSN or QP number.
    pub const MASK24: u64 = 0xff_ffff;

    /// The 32-bit value of a TCP word, if valid.
    pub const fn tcp(word: u64) -> Option<u32> {
        if word & VALID != 0 { Some(word as u32) } else { None }
    }

    /// `(next expected PSN, destination QP)` of a RoCEv2 word, if valid.
    pub const fn psn(word: u64) -> Option<(u32, u32)> {
        if word & VALID != 0 {
            Some(((word & MASK24) as u32, ((word >> QP_SHIFT) & MASK24) as u32))
        } else {
            None
        }
    }

    /// The RoCEv2 word for `next_psn` on `dest_qp` (both 24 bits), valid or not.
    pub const fn psn_word(next_psn: u32, dest_qp: u32, valid: bool) -> u64 {
        (next_psn as u64 & MASK24)
            | ((dest_qp as u64 & MASK24) << QP_SHIFT)
            | if valid { VALID } else { 0 }
    }
}

/// A record on the `EVENTS` ring buffer. For `BURST_END` the burst fields describe the burst that
/// ended; for `FLOW_START` and `MAP_FULL` they are zero except `start_ns`. 88 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Event {
    /// `event_kind::*`.
    pub kind: u32,
    pub _pad: u32,
    pub key: FlowKey,
    pub _pad2: u32,
    pub burst: BurstState,
}
const _: () = assert!(core::mem::size_of::<Event>() == 88);

/// One TCP/UDP port range; a packet matches if its source or destination port is in `[lo, hi]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct PortRange {
    pub lo: u16,
    pub hi: u16,
    /// 6 (TCP), 17 (UDP), or 0 for both.
    pub protocol: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<PortRange>() == 8);

/// Version of the layout of the pinned maps: their names, types, keys and values (`FlowKey`,
/// `FlowStats`, `Config`, `PrefixKey`/`PrefixValue`, `Event`, the `STATS` indices).
///
/// BUMP IT whenever any of those changes, even when the sizes stay the same (a field renamed to
/// mean something else, a `STATS` index moved): a restarted agent reuses the maps pinned by its
/// predecessor only when the version in the pinned `CONFIG` equals its own, and otherwise refuses
/// them and tells the operator to `ringside detach` first (counters then restart from zero). The
/// loader also compares each pinned map's type, key size, value size and capacity with the object,
/// which catches most forgotten bumps, but not a change that keeps the sizes.
///
/// History: 1 = first versioned layout (0 is a `CONFIG` pinned before the version existed);
/// 2 = `FLOW_STATE` merged into `FLOWS`, now one shared LRU hash of 200-byte `FlowStats` (issue 11);
/// 3 = `FLOWS` is a mmapable array of 256-byte [`FlowSlot`]s with open addressing, `Config` gained
/// `flow_slot_mask` and `hash_seed`, `STATS[CONTENDED]` added (issue 11);
/// 4 = `FlowStats::tcp_dup_acks` became `tcp_dsacks` and `tcp_last_ack` unused (same sizes).
pub const LAYOUT_VERSION: u32 = 4;

/// The single entry of the `CONFIG` array, written by the agent.
///
/// Match rule: RoCEv2 (UDP port 4791) always matches. Other TCP/UDP packets match when
/// (no port range configured OR a port is in a range) AND (no prefix configured OR the source or
/// destination address is in `MATCH_PREFIXES`), and at least one range or prefix is configured.
/// With an all-zero config (the kernel's initial value) only RoCEv2 is tracked. 144 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Config {
    /// Idle gap that ends a burst; 0 means `DEFAULT_BURST_GAP_NS`.
    pub burst_gap_ns: u64,
    /// Number of valid entries in `port_ranges`.
    pub n_port_ranges: u32,
    /// Number of prefixes in `MATCH_PREFIXES` (0 skips the trie lookup).
    pub n_prefixes: u32,
    /// `config_flags::*`.
    pub flags: u32,
    /// [`LAYOUT_VERSION`] of the agent that wrote this config. The program ignores it; a restarted
    /// agent reads it from the pinned `CONFIG` to decide whether it may reuse the pinned maps.
    /// (It took the place of a padding field, so a `CONFIG` pinned before it existed reads 0.)
    pub layout_version: u32,
    /// Capacity of `FLOWS` minus one (the capacity is a power of two): the mask that turns a
    /// [`flow_hash`] into a home slot. 0 (an agent that never set it) means `MAX_FLOWS - 1`.
    pub flow_slot_mask: u32,
    /// Seed of [`flow_hash`], chosen by the agent that created the pinned maps, so a tenant who
    /// knows the hash cannot aim flows at one chain of slots of every host.
    pub hash_seed: u32,
    pub port_ranges: [PortRange; MAX_PORT_RANGES],
}
const _: () = assert!(core::mem::size_of::<Config>() == 32 + 8 * MAX_PORT_RANGES);

impl Default for Config {
    fn default() -> Self {
        Self {
            burst_gap_ns: DEFAULT_BURST_GAP_NS,
            n_port_ranges: 0,
            n_prefixes: 0,
            flags: 0,
            layout_version: LAYOUT_VERSION,
            flow_slot_mask: MAX_FLOWS - 1,
            hash_seed: 0,
            port_ranges: [PortRange::default(); MAX_PORT_RANGES],
        }
    }
}

/// `Config::flags` bits.
pub mod config_flags {
    /// Emit `FLOW_START` events.
    pub const FLOW_START_EVENTS: u32 = 1;
    /// Emit `BURST_END` events.
    pub const BURST_EVENTS: u32 = 2;
    /// Write debug records (aya-log, `AYA_LOGS` ring buffer) about skipped packets and new flows,
    /// at most [`DEBUG_LOG_PER_SEC`](super::DEBUG_LOG_PER_SEC) per second per CPU. Off by
    /// default: without it the monitor never touches the log ring buffer.
    pub const DEBUG_LOG: u32 = 4;
}

/// Rate limit of the monitor's debug log (`config_flags::DEBUG_LOG`): records per second per CPU,
/// also the burst a CPU may write at once after a quiet second (a token bucket per CPU).
pub const DEBUG_LOG_PER_SEC: u64 = 10;

/// Rate limit of `event_kind::MAP_FULL` records: per second per CPU, also the burst a CPU may
/// write after a quiet second (a token bucket per CPU). Small next to the ring's capacity, so a
/// full table cannot crowd out burst ends; `STATS[MAP_FULL]` counts every packet regardless.
pub const MAP_FULL_EVENTS_PER_SEC: u64 = 10;

/// Key of the `MATCH_PREFIXES` LPM trie (the layout the kernel expects: prefix length first).
/// An IPv4 prefix `a.b.c.d/n` is stored as `::ffff:a.b.c.d/(96+n)`. 20 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct PrefixKey {
    pub prefix_len: u32,
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<PrefixKey>() == 20);

/// Value of the `MATCH_PREFIXES` LPM trie. The monitor only tests for presence; the agent may store
/// an identifier of its own (for example the job the prefix belongs to).
pub type PrefixValue = u32;

/// Maps an IPv4 address (network byte order octets) to its IPv4-mapped IPv6 form.
pub const fn ipv4_mapped(octets: [u8; 4]) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, octets[0], octets[1], octets[2], octets[3]]
}

#[cfg(feature = "user")]
mod pod {
    use zerocopy::{FromBytes, Immutable, IntoBytes};

    /// `unsafe impl aya::Pod` for types whose zerocopy derives prove what `Pod` requires. The bound
    /// check makes the `impl` fail to compile if a type ever loses a derive.
    macro_rules! pod {
        ($($t:ty),* $(,)?) => {$(
            const _: () = {
                const fn proven<T: FromBytes + IntoBytes + Immutable + Copy + 'static>() {}
                proven::<$t>();
            };
            // SAFETY: aya::Pod needs a `Copy` type with no padding (aya copies it byte for byte into
            // and out of the kernel) for which every bit pattern is valid (aya builds values from the
            // kernel's bytes). The derives checked above prove both at compile time: `IntoBytes`
            // (no padding, every byte initialised) and `FromBytes` (every bit pattern valid).
            unsafe impl aya::Pod for $t {}
        )*};
    }

    pod!(
        super::FlowKey,
        super::FlowStats,
        super::FlowSlot,
        super::BurstState,
        super::Event,
        super::PortRange,
        super::Config,
        super::PrefixKey,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn flow_key_layout() {
        assert_eq!(offset_of!(FlowKey, src_addr), 0);
        assert_eq!(offset_of!(FlowKey, dst_addr), 16);
        assert_eq!(offset_of!(FlowKey, src_port), 32);
        assert_eq!(offset_of!(FlowKey, dst_port), 34);
        assert_eq!(offset_of!(FlowKey, ifindex), 36);
        assert_eq!(offset_of!(FlowKey, protocol), 40);
        assert_eq!(offset_of!(FlowKey, direction), 41);
        assert_eq!(offset_of!(FlowKey, kind), 42);
        assert_eq!(core::mem::align_of::<FlowKey>(), 4);
    }

    #[test]
    fn event_layout() {
        assert_eq!(offset_of!(Event, key), 8);
        assert_eq!(offset_of!(Event, burst), 56);
        assert_eq!(core::mem::align_of::<Event>(), 8);
    }

    #[test]
    fn config_layout() {
        assert_eq!(offset_of!(Config, port_ranges), 32);
        assert_eq!(offset_of!(Config, layout_version), 20);
        assert_eq!(Config::default().layout_version, LAYOUT_VERSION);
        assert_eq!(offset_of!(PrefixKey, addr), 4);
    }

    #[test]
    fn flow_stats_layout() {
        // The fields a packet touches share the first 64 bytes.
        assert_eq!(offset_of!(FlowStats, packets), 0);
        assert_eq!(offset_of!(FlowStats, last_seen_ns), 24);
        assert_eq!(offset_of!(FlowStats, burst_start_ns), 32);
        assert_eq!(offset_of!(FlowStats, tcp_seq_end), 40);
        assert_eq!(offset_of!(FlowStats, _reserved), 48);
        assert_eq!(offset_of!(FlowStats, roce_psn), 56);
        assert_eq!(offset_of!(FlowStats, burst_start_packets), 64);
        assert_eq!(offset_of!(FlowStats, first_seen_ns), 80);
        assert_eq!(offset_of!(FlowStats, roce_cnps), 192);
        assert_eq!(core::mem::align_of::<FlowStats>(), 8);
    }

    #[test]
    fn byte_views_round_trip() {
        use zerocopy::{FromBytes, IntoBytes};
        let ev = Event {
            kind: event_kind::BURST_END,
            key: FlowKey { src_port: 0x0102, kind: flow_kind::ROCEV2, ..FlowKey::default() },
            burst: BurstState { bytes: 3, ..BurstState::default() },
            ..Event::default()
        };
        let bytes = ev.as_bytes();
        assert_eq!(bytes.len(), core::mem::size_of::<Event>());
        assert_eq!(bytes[8 + 32..8 + 34], 0x0102u16.to_ne_bytes());
        assert_eq!(Event::read_from_bytes(bytes).ok(), Some(ev));
        assert!(Event::read_from_bytes(&bytes[1..]).is_err(), "a short record is refused");
        let cfg = Config::default();
        assert_eq!(Config::read_from_bytes(cfg.as_bytes()).ok(), Some(cfg));
    }

    #[test]
    fn tracking_words() {
        assert_eq!(track::tcp(0), None);
        assert_eq!(track::tcp(track::VALID | 0xffff_ffff), Some(0xffff_ffff));
        let w = track::psn_word(0xff_ffff, 0x12_3456, true);
        assert_eq!(track::psn(w), Some((0xff_ffff, 0x12_3456)));
        assert_eq!(track::psn(track::psn_word(1, 2, false)), None);
        // Out-of-range inputs are masked to 24 bits, never spill into the other field.
        assert_eq!(track::psn(track::psn_word(0x100_0001, 0x100_0002, true)), Some((1, 2)));
    }

    #[test]
    fn ipv4_mapping() {
        assert_eq!(ipv4_mapped([10, 0, 0, 1])[10..], [0xff, 0xff, 10, 0, 0, 1]);
    }
}
