//! ringside's flow monitor: a TC (clsact) classifier that aggregates collective-communication flows
//! in the kernel.
//!
//! Invariants (what the agent and the tests rely on):
//! - The packet is never modified and always passed: every program returns `TC_ACT_PIPE`
//!   (fail open: whatever goes wrong in here, tenant traffic is untouched). The only helper that can
//!   touch the skb is `bpf_skb_pull_data`, which moves bytes into the linear area without changing
//!   them, and only when headers are not already linear.
//! - Work is bounded: no loop depends on packet contents (VLAN tags: at most two, unrolled; port
//!   ranges: at most `MAX_PORT_RANGES`; IPv6 extension headers: not walked, counted as unsupported).
//! - Nothing is emitted per packet. Counters are aggregated in `FLOWS` (per-CPU) and `BURSTS`
//!   (shared); `EVENTS` carries only flow starts (opt-in), burst ends and map-full records.
//! - Every outcome is counted once in `STATS`: SEEN always, then exactly one of MALFORMED,
//!   UNSUPPORTED, UNREADABLE, or PARSED (and MATCHED when the packet was counted in `FLOWS`).
//!
//! Header layouts and constants come from `dataplane_common::wire`.
#![no_std]
#![no_main]
// `atomic_xadd`: the BPF target has no compare-and-swap in its baseline, so core does not offer
// `AtomicU64::fetch_add` there; the intrinsic lowers to BPF_ATOMIC|BPF_ADD.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod parse;

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    bindings::{BPF_NOEXIST, TC_ACT_PIPE},
    helpers::bpf_ktime_get_ns,
    macros::{classifier, map},
    maps::{lpm_trie::Key, Array, LpmTrie, LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
    programs::TcContext,
};
use dataplane_common::{
    config_flags, direction, event_kind, state_flags, stats, wire, BurstState, Config, Event,
    FlowKey, FlowStats, PrefixKey, PrefixValue, DEFAULT_BURST_GAP_NS, EVENTS_RING_BYTES, MAX_FLOWS,
    MAX_PORT_RANGES, MAX_PREFIXES,
};

use crate::parse::{Bth, Packet, Skip, TcpInfo, Transport};

/// Per-flow counters, one copy per CPU: the hot path never contends on a cache line.
#[map(name = "FLOWS")]
static FLOWS: LruPerCpuHashMap<FlowKey, FlowStats> = LruPerCpuHashMap::with_max_entries(MAX_FLOWS, 0);

/// The open burst of each flow, shared across CPUs so a burst spread over CPUs is one burst.
#[map(name = "BURSTS")]
static BURSTS: LruHashMap<FlowKey, BurstState> = LruHashMap::with_max_entries(MAX_FLOWS, 0);

/// The agent's match configuration (one entry).
#[map(name = "CONFIG")]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// Address prefixes of collective traffic (IPv4 stored IPv4-mapped). Looked up only when
/// `Config::n_prefixes > 0`, because a trie lookup is the most expensive step of the match.
#[map(name = "MATCH_PREFIXES")]
static MATCH_PREFIXES: LpmTrie<[u8; 16], PrefixValue> = LpmTrie::with_max_entries(MAX_PREFIXES, 0);

/// Rare events only (see `event_kind`).
#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// Outcome counters (see `stats`).
#[map(name = "STATS")]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stats::COUNT, 0);

/// The monitor. Fail-open policy: `try_flowmon` reports *why* it stopped only through `STATS`;
/// the packet verdict is `TC_ACT_PIPE` on every path, so ringside can never drop, redirect or
/// reorder tenant traffic, and another classifier after this one still runs.
#[classifier]
pub fn flowmon(ctx: TcContext) -> i32 {
    let _ = try_flowmon(&ctx);
    TC_ACT_PIPE
}

/// An empty classifier with the same program type: the baseline the benchmark subtracts.
#[classifier]
pub fn noop(_ctx: TcContext) -> i32 {
    TC_ACT_PIPE
}

#[inline(always)]
fn count(index: u32, n: u64) {
    // Per-CPU array lookups are inlined by the verifier into a few instructions
    // (kernel/bpf/arraymap.c: percpu_array_map_gen_lookup), and BH is disabled around TC programs,
    // so a plain add cannot be interleaved with another update of the same CPU's slot.
    if let Some(p) = STATS.get_ptr_mut(index) {
        unsafe { *p += n };
    }
}

#[inline(always)]
fn try_flowmon(ctx: &TcContext) -> Result<(), ()> {
    count(stats::SEEN, 1);
    let result = monitor(ctx);
    let index = match result {
        Ok(()) => return Ok(()),
        Err(Skip::Malformed) => stats::MALFORMED,
        Err(Skip::Unsupported) => stats::UNSUPPORTED,
        Err(Skip::Unreadable) => stats::UNREADABLE,
        Err(Skip::MapFull) => stats::MAP_FULL,
        Err(Skip::NotMatched) => return Err(()),
    };
    count(index, 1);
    Err(())
}

#[inline(always)]
fn monitor(ctx: &TcContext) -> Result<(), Skip> {
    let mut pkt = Packet {
        key: FlowKey::default(),
        ecn: 0,
        segments: 1,
        l3_bytes: 0,
        payload_bytes: 0,
        transport: Transport::Udp,
    };
    parse::parse(ctx, &mut pkt)?;
    count(stats::PARSED, 1);

    // Safety: `CONFIG` is an array map with one entry; index 0 always exists.
    let cfg = match CONFIG.get_ptr(0) {
        Some(c) => c,
        None => return Err(Skip::NotMatched),
    };
    if !matches!(pkt.transport, Transport::Rocev2(_)) && !collective(&pkt, unsafe { &*cfg }) {
        return Err(Skip::NotMatched);
    }
    let cfg = unsafe { &*cfg };
    count(stats::MATCHED, 1);

    set_interface(ctx, &mut pkt.key);
    let now = unsafe { bpf_ktime_get_ns() };
    update_flow(&pkt.key, &pkt, now, cfg.flags)?;
    update_burst(&pkt.key, &pkt, now, cfg);
    Ok(())
}

/// The match rule documented on `Config`, for non-RoCEv2 packets.
#[inline(always)]
fn collective(pkt: &Packet, cfg: &Config) -> bool {
    let n_ranges = cfg.n_port_ranges;
    let n_prefixes = cfg.n_prefixes;
    if n_ranges == 0 && n_prefixes == 0 {
        return false;
    }
    if n_ranges != 0 {
        let mut hit = false;
        // Bounded by a constant; `n_ranges` only shortens it. Unrolled by LLVM.
        for i in 0..MAX_PORT_RANGES {
            if i as u32 >= n_ranges {
                break;
            }
            let r = &cfg.port_ranges[i];
            let k = &pkt.key;
            if (r.protocol == 0 || r.protocol == k.protocol)
                && ((k.src_port >= r.lo && k.src_port <= r.hi)
                    || (k.dst_port >= r.lo && k.dst_port <= r.hi))
            {
                hit = true;
                break;
            }
        }
        if !hit {
            return false;
        }
    }
    if n_prefixes != 0 {
        let src = PrefixKey { prefix_len: 128, addr: pkt.key.src_addr };
        if MATCH_PREFIXES.get(as_trie_key(&src)).is_none() {
            let dst = PrefixKey { prefix_len: 128, addr: pkt.key.dst_addr };
            if MATCH_PREFIXES.get(as_trie_key(&dst)).is_none() {
                return false;
            }
        }
    }
    true
}

/// `PrefixKey` (4-byte aligned, copied with word stores) seen as aya's packed trie key type; the
/// layouts are identical: `u32` prefix length, then the 16 address bytes.
#[inline(always)]
fn as_trie_key(k: &PrefixKey) -> &Key<[u8; 16]> {
    // SAFETY: same size and field order; the target type is packed (align 1), so any alignment is fine.
    unsafe { &*(k as *const PrefixKey).cast::<Key<[u8; 16]>>() }
}

#[inline(always)]
fn set_interface(ctx: &TcContext, key: &mut FlowKey) {
    let skb = unsafe { &*ctx.skb.skb };
    let ifindex = skb.ifindex;
    // TC does not tell a program which hook it runs on. On ingress the stack has already set
    // skb->skb_iif (exposed as ingress_ifindex) to the receiving device (net/core/dev.c,
    // __netif_receive_skb_core); on egress it is 0 for locally generated packets and the input
    // device for forwarded ones. So "ingress_ifindex == ifindex" means ingress; a packet forwarded
    // back out of the interface it came in on (hairpin) is the one case this reads as ingress.
    key.direction = if skb.ingress_ifindex == ifindex { direction::INGRESS } else { direction::EGRESS };
    key.ifindex = ifindex;
}

#[inline(always)]
fn update_flow(key: &FlowKey, pkt: &Packet, now: u64, flags: u32) -> Result<(), Skip> {
    let stats = match FLOWS.get_ptr_mut(key) {
        Some(s) => s,
        None => new_flow(key, now, flags).ok_or(Skip::MapFull)?,
    };
    let s = unsafe { &mut *stats };
    s.packets += pkt.segments as u64;
    s.bytes += pkt.l3_bytes as u64;
    s.payload_bytes += pkt.payload_bytes as u64;
    if s.first_seen_ns == 0 {
        s.first_seen_ns = now;
    }
    s.last_seen_ns = now;
    if pkt.ecn == wire::ECN_CE {
        s.ce_marks += 1;
    }
    match pkt.transport {
        Transport::Tcp(ref t) => tcp_update(s, t, pkt.payload_bytes),
        Transport::Udp => {}
        Transport::Rocev2(ref b) => rocev2_update(s, b),
    }
    Ok(())
}

/// The initial value of a flow, in .rodata: a map value may be read from global data, which keeps
/// 176 bytes off the 512-byte stack and saves zeroing them on every new flow.
// SAFETY: FlowStats is plain integers; all-zero is its Default.
static ZERO_FLOW: FlowStats = unsafe { core::mem::zeroed() };

/// First packet of a flow (on any CPU of this program instance). Out of line: it is rare.
#[inline(never)]
fn new_flow(key: &FlowKey, now: u64, flags: u32) -> Option<*mut FlowStats> {
    let fresh = &ZERO_FLOW;
    // BPF_NOEXIST: another CPU may have created the entry since our lookup; then our insert fails
    // with EEXIST and the lookup below finds the entry it made.
    let inserted = FLOWS.insert(key, fresh, BPF_NOEXIST as u64).is_ok();
    match FLOWS.get_ptr_mut(key) {
        Some(s) => {
            if inserted && flags & config_flags::FLOW_START_EVENTS != 0 {
                emit(event_kind::FLOW_START, key, now, None);
            }
            Some(s)
        }
        None => {
            emit(event_kind::MAP_FULL, key, now, None);
            None
        }
    }
}

#[inline(always)]
fn tcp_update(s: &mut FlowStats, t: &TcpInfo, payload: u32) {
    let f = t.flags;
    if f & wire::TCP_SYN != 0 {
        s.tcp_syn += 1;
    }
    if f & wire::TCP_FIN != 0 {
        s.tcp_fin += 1;
    }
    if f & wire::TCP_RST != 0 {
        s.tcp_rst += 1;
    }
    if f & wire::TCP_ECE != 0 {
        s.tcp_ece += 1;
    }
    if f & wire::TCP_CWR != 0 {
        s.tcp_cwr += 1;
    }
    if payload > 0 {
        let end = t.seq.wrapping_add(payload);
        if s.state_flags & state_flags::TCP_SEQ_VALID == 0 {
            s.tcp_seq_end_state = end;
            s.state_flags |= state_flags::TCP_SEQ_VALID;
        } else {
            // Serial-number comparison (RFC 1982 / RFC 9293 §3.4): a difference whose i32 value is
            // negative means "before", across the 2^32 wrap.
            if (t.seq.wrapping_sub(s.tcp_seq_end_state) as i32) < 0 {
                s.tcp_retrans += 1;
            }
            if (end.wrapping_sub(s.tcp_seq_end_state) as i32) > 0 {
                s.tcp_seq_end_state = end;
            }
        }
    } else if f & wire::TCP_ACK != 0 && f & (wire::TCP_SYN | wire::TCP_FIN | wire::TCP_RST) == 0 {
        s.tcp_pure_acks += 1;
        if s.state_flags & state_flags::TCP_ACK_VALID != 0 && s.tcp_last_ack_state == t.ack {
            s.tcp_dup_acks += 1;
        }
        s.tcp_last_ack_state = t.ack;
        s.state_flags |= state_flags::TCP_ACK_VALID;
    }
}

/// RoCEv2 reliability signals. PSNs are 24-bit serial numbers (IBA §9.7.2): the distance
/// `(psn - expected) mod 2^24` is "ahead" below 2^23 and "behind" above it.
#[inline(always)]
fn rocev2_update(s: &mut FlowStats, b: &Bth) {
    use wire::bth_opcode;
    if b.opcode == bth_opcode::CNP {
        // CNPs carry no meaningful PSN (Annex A17.9.3).
        s.roce_cnps += 1;
        return;
    }
    if b.opcode == bth_opcode::RC_ACK {
        // ACK PSNs acknowledge request PSNs and are coalesced, so they are not a sequence.
        if b.syndrome & wire::AETH_SYNDROME_KIND_MASK == wire::AETH_SYNDROME_NAK {
            s.roce_naks += 1;
        }
        return;
    }
    if b.opcode == RC_ATOMIC_ACK {
        return;
    }
    let valid = s.state_flags & state_flags::PSN_VALID != 0;
    if !valid || s.roce_dest_qp_state != b.dest_qp {
        // First packet, or a new queue pair reusing the 5-tuple: PSN spaces are per QP.
        s.roce_dest_qp_state = b.dest_qp;
    } else {
        let delta = b.psn.wrapping_sub(s.roce_next_psn_state) & wire::PSN_MASK;
        if delta != 0 {
            if delta < PSN_HALF {
                s.roce_psn_gap_events += 1;
                s.roce_psn_gap_packets += delta as u64;
            } else {
                // Behind the expected PSN: retransmission (go-back-N) or reordering. The
                // expectation is not moved back, so the rest of a go-back-N replay counts too.
                s.roce_psn_out_of_order += 1;
                return;
            }
        }
    }
    s.roce_next_psn_state = b.psn.wrapping_add(1) & wire::PSN_MASK;
    if b.opcode == RC_RDMA_READ_REQUEST {
        // A read request consumes one PSN per response packet, a count the BTH does not carry
        // (RETH length / path MTU): resynchronise on the next request instead of guessing.
        s.state_flags &= !state_flags::PSN_VALID;
    } else {
        s.state_flags |= state_flags::PSN_VALID;
    }
}

/// RC RDMA READ Request (IBA Table 38).
const RC_RDMA_READ_REQUEST: u8 = 0x0C;
/// RC ATOMIC Acknowledge (IBA Table 38): carries AETH, PSN of the atomic request.
const RC_ATOMIC_ACK: u8 = 0x12;
const PSN_HALF: u32 = 1 << 23;

#[inline(always)]
fn update_burst(key: &FlowKey, pkt: &Packet, now: u64, cfg: &Config) {
    let gap = if cfg.burst_gap_ns == 0 { DEFAULT_BURST_GAP_NS } else { cfg.burst_gap_ns };
    let bytes = pkt.l3_bytes as u64;
    let packets = pkt.segments as u64;
    match BURSTS.get_ptr_mut(key) {
        Some(b) => {
            let b = unsafe { &mut *b };
            let last = b.last_ns;
            // Signed difference: another CPU may have stored a `last_ns` a few ns after our `now`.
            if (now.wrapping_sub(last) as i64) > gap as i64 {
                if cfg.flags & config_flags::BURST_EVENTS != 0 {
                    emit(event_kind::BURST_END, key, now, Some(b));
                }
                // Not atomic as a whole: a packet another CPU adds between these stores can land
                // in either burst. It cannot be lost, and the burst boundary stays within the gap.
                b.start_ns = now;
                b.last_ns = now;
                b.bytes = bytes;
                b.packets = packets;
            } else {
                // Shared entry: atomic adds (BPF_ATOMIC | BPF_ADD, no fetch) so CPUs never lose counts.
                atomic_add(&mut b.bytes, bytes);
                atomic_add(&mut b.packets, packets);
                if (now.wrapping_sub(last) as i64) > 0 {
                    b.last_ns = now;
                }
            }
        }
        None => {
            let fresh = BurstState { start_ns: now, last_ns: now, bytes, packets };
            if BURSTS.insert(key, &fresh, BPF_NOEXIST as u64).is_err() && BURSTS.get_ptr(key).is_none() {
                count(stats::MAP_FULL, 1);
            }
        }
    }
}

/// `*dst += v` as one BPF_ATOMIC | BPF_ADD instruction (the result is unused, so LLVM emits the
/// non-fetching form every kernel since 4.x accepts on map values).
#[inline(always)]
fn atomic_add(dst: &mut u64, v: u64) {
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(dst, v) };
}

/// Writes one record to `EVENTS`. Out of line to keep the 88-byte record off the hot path's stack.
/// `burst` is the burst that ended (BURST_END); other kinds carry only `start_ns = now`.
#[inline(never)]
fn emit(kind: u32, key: &FlowKey, now: u64, burst: Option<&BurstState>) {
    match EVENTS.reserve::<Event>(0) {
        Some(mut entry) => {
            let burst = match burst {
                Some(b) => *b,
                None => BurstState { start_ns: now, ..BurstState::default() },
            };
            entry.write(Event { kind, _pad: 0, key: *key, _pad2: 0, burst });
            entry.submit(0);
            count(stats::EVENTS, 1);
        }
        None => count(stats::RINGBUF_FULL, 1),
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
