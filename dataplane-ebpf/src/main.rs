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
//! - Nothing is emitted per packet. Counters, the open burst and the sequence tracking state of a
//!   flow live in one `FLOWS` entry shared by all CPUs (counters added atomically); `EVENTS`
//!   carries only flow starts (opt-in), burst ends and map-full records (at most
//!   `MAP_FULL_EVENTS_PER_SEC` per second per CPU, so a full table cannot flood the ring).
//! - A matched packet costs one `bpf_ktime_get_ns`, one `flow_hash` and a probe of the flow's
//!   `FLOWS` window (plain loads of slot states from its home slot on, usually one or two, then
//!   one CMPXCHG re-read of the flow's slot; the first packet of a flow claims a free slot with a
//!   CMPXCHG and an XCHG instead; a flow whose window is full probes all `FLOW_PROBES` slots);
//!   an unmatched one no hash and no clock read.
//! - Every outcome is counted once in `STATS`: SEEN always, then exactly one of MALFORMED,
//!   UNSUPPORTED, UNREADABLE, or PARSED; a PARSED packet that matched the configuration is also
//!   MATCHED, and a MATCHED packet that could not be counted in `FLOWS` is also exactly one of
//!   MAP_FULL or CONTENDED (so the packets counted in flows are MATCHED - MAP_FULL - CONTENDED).
//! - Debug logging (aya-log) is off unless the agent sets `config_flags::DEBUG_LOG`; then the
//!   skipped packets and new flows are logged, at most `DEBUG_LOG_PER_SEC` records per second per
//!   CPU (a token bucket in `LOG_BUDGET`). Off, it costs a call and a flag test per skipped
//!   packet, a flag test per new flow, and nothing on the matched path. A record that does not fit
//!   the budget or the ring buffer is dropped; the packet passes either way.
//!
//! Header layouts and constants come from `dataplane_common::wire`.
#![no_std]
#![no_main]
// `atomic_xadd`, `atomic_cxchg`, `atomic_xchg`: the BPF target has no compare-and-swap in its
// baseline, so core does not offer `AtomicU64` there; the intrinsics lower to BPF_ATOMIC with
// BPF_ADD, BPF_CMPXCHG and BPF_XCHG.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod parse;

use core::intrinsics::{atomic_cxchg, atomic_xadd, atomic_xchg, AtomicOrdering};

use aya_ebpf::{
    bindings::{__sk_buff, BPF_F_MMAPABLE, TC_ACT_PIPE},
    helpers::bpf_ktime_get_ns,
    macros::{classifier, map},
    maps::{lpm_trie::Key, Array, LpmTrie, PerCpuArray, RingBuf},
    programs::TcContext,
};
use aya_log_ebpf::debug;
use dataplane_common::{
    config_flags, direction, event_kind, flow_hash, flow_kind, slot_state, stats, track, wire, BurstState,
    Config, Event, FlowKey, FlowSlot, FlowStats, PrefixKey, PrefixValue, DEBUG_LOG_PER_SEC,
    DEFAULT_BURST_GAP_NS, EVENTS_RING_BYTES, FLOW_PROBES, MAP_FULL_EVENTS_PER_SEC, MAX_FLOWS, MAX_PORT_RANGES,
    MAX_PREFIXES,
};

use crate::parse::{Bth, Packet, Skip, TcpInfo};

/// Per-flow counters, open burst and tracking state, one entry per flow shared by all CPUs: one
/// hash lookup per matched packet. Shared, not per CPU, because the burst (a burst spread over
/// CPUs is one burst) and the retransmission / D-SACK / PSN tracking (a retransmission is
/// seen whichever CPU handled the original) must be; the counters then ride in the same entry
/// with atomic adds instead of costing a second lookup in a per-CPU map. See "Races on FLOWS".
///
/// An open-addressing hash table in a `BPF_F_MMAPABLE` array (see `FlowSlot`, `slot_state`):
/// the verifier inlines array lookups (kernel/bpf/arraymap.c, array_map_gen_lookup), so a probe
/// costs a few instructions instead of a helper call and a hash-bucket walk, and the agent reads
/// the table in place through mmap. Eviction of idle flows is the agent's job.
#[map(name = "FLOWS")]
static FLOWS: Array<FlowSlot> = Array::with_max_entries(MAX_FLOWS, BPF_F_MMAPABLE);

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

/// Token buckets, one set per CPU (see [`budget`]): entry `BUDGET_LOG` for the debug log,
/// `BUDGET_MAP_FULL` for `MAP_FULL` events. Kernel-only state (not pinned).
#[map(name = "LOG_BUDGET")]
static LOG_BUDGET: PerCpuArray<LogBudget> = PerCpuArray::with_max_entries(2, 0);

/// A token bucket counted in nanoseconds of credit: a record costs `cost_ns`, credit grows with
/// elapsed time and is capped at one second's worth (a burst of one second's records).
#[repr(C)]
struct LogBudget {
    credit_ns: u64,
    last_ns: u64,
}

const BUDGET_LOG: u32 = 0;
const BUDGET_MAP_FULL: u32 = 1;
const BUDGET_CAP_NS: u64 = 1_000_000_000;
const LOG_COST_NS: u64 = BUDGET_CAP_NS / DEBUG_LOG_PER_SEC;
const MAP_FULL_COST_NS: u64 = BUDGET_CAP_NS / MAP_FULL_EVENTS_PER_SEC;

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
        Err(Skip::Contended) => stats::CONTENDED,
        Err(Skip::NotMatched) => return Err(()),
    };
    count(index, 1);
    log_skip(ctx.skb.skb, index);
    Err(())
}

/// Whether the agent turned the debug log on (`config_flags::DEBUG_LOG`).
#[inline(always)]
fn debug_log_on() -> bool {
    match CONFIG.get_ptr(0) {
        // SAFETY: a map value pointer stays valid for the rest of this program run.
        Some(c) => (unsafe { (*c).flags } & config_flags::DEBUG_LOG) != 0,
        None => false,
    }
}

/// Takes one debug record's worth of this CPU's log budget; false when it is spent.
#[inline(always)]
fn log_budget() -> bool {
    // SAFETY: helper with no arguments.
    budget(BUDGET_LOG, LOG_COST_NS, unsafe { bpf_ktime_get_ns() })
}

/// Takes `cost_ns` of credit from this CPU's bucket `which`; false when it is spent. Per-CPU and
/// BH is disabled around TC programs, so the read-modify-write cannot interleave with another
/// update. `now` is the caller's clock read (the map-full path has one already).
#[inline(always)]
fn budget(which: u32, cost_ns: u64, now: u64) -> bool {
    let b = match LOG_BUDGET.get_ptr_mut(which) {
        // SAFETY: as in `count`; this CPU's slot is written only by this CPU.
        Some(b) => unsafe { &mut *b },
        None => return false,
    };
    // The first call finds last_ns = 0 and starts with a full bucket.
    let mut credit = b.credit_ns.saturating_add(now.wrapping_sub(b.last_ns));
    if credit > BUDGET_CAP_NS {
        credit = BUDGET_CAP_NS;
    }
    b.last_ns = now;
    if credit < cost_ns {
        b.credit_ns = credit;
        return false;
    }
    b.credit_ns = credit - cost_ns;
    true
}

/// Debug record for a packet that was skipped (`reason` is its `STATS` index), if the log is on.
/// Out of line, flag test included: the record is built on this function's stack, and the hot
/// function's code (and register allocation) stays as it was without a log.
#[inline(never)]
fn log_skip(skb: *mut __sk_buff, reason: u32) {
    if !debug_log_on() || !log_budget() {
        return;
    }
    // SAFETY: the program's context, valid for the whole run.
    let (len, ifindex) = unsafe { ((*skb).len, (*skb).ifindex) };
    match reason {
        stats::MALFORMED => debug!(&(), "skipped malformed packet: len {} ifindex {}", len, ifindex),
        stats::UNSUPPORTED => debug!(&(), "skipped unsupported packet: len {} ifindex {}", len, ifindex),
        stats::UNREADABLE => debug!(&(), "skipped unreadable packet: len {} ifindex {}", len, ifindex),
        _ => debug!(&(), "flow not tracked, map full: len {} ifindex {}", len, ifindex),
    }
}

/// Debug record for a flow's first packet (on this program instance).
#[inline(never)]
fn log_new_flow(key: &FlowKey) {
    if !log_budget() {
        return;
    }
    debug!(
        &(),
        "new flow [{:i}]:{} -> [{:i}]:{} proto {} kind {} ifindex {} direction {}",
        key.src_addr,
        key.src_port,
        key.dst_addr,
        key.dst_port,
        key.protocol,
        key.kind,
        key.ifindex,
        key.direction
    );
}

#[inline(always)]
fn monitor(ctx: &TcContext) -> Result<(), Skip> {
    let mut pkt = parse::parse(ctx)?;
    count(stats::PARSED, 1);

    // Safety: `CONFIG` is an array map with one entry; index 0 always exists.
    let cfg = match CONFIG.get_ptr(0) {
        Some(c) => c,
        None => return Err(Skip::NotMatched),
    };
    if pkt.key.kind != flow_kind::ROCEV2 && !collective(&pkt, unsafe { &*cfg }) {
        return Err(Skip::NotMatched);
    }
    let cfg = unsafe { &*cfg };
    count(stats::MATCHED, 1);

    set_interface(ctx, &mut pkt.key);
    let now = unsafe { bpf_ktime_get_ns() };
    let s = update_flow(&pkt.key, &pkt, now, cfg)?;
    match pkt.key.kind {
        flow_kind::TCP => tcp_track(s, &pkt.tcp, &pkt),
        flow_kind::ROCEV2 => rocev2_track(s, &pkt.bth),
        _ => {}
    }
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

/// Finds (or creates) the flow's entry, accounts the packet to its counters and its open burst,
/// and ends the burst when the idle gap has elapsed.
#[inline(always)]
fn update_flow(key: &FlowKey, pkt: &Packet, now: u64, cfg: &Config) -> Result<&'static mut FlowStats, Skip> {
    let s = find_or_claim(key, now, cfg)?;
    let last = load(&s.last_seen_ns);
    let since = now.wrapping_sub(last) as i64;
    let gap = if cfg.burst_gap_ns == 0 { DEFAULT_BURST_GAP_NS } else { cfg.burst_gap_ns };
    // Signed difference: another CPU may have stored a `last_seen_ns` a few ns after our `now`.
    // `last == 0` on its own: right after boot `now` itself can be below a long configured gap.
    if last == 0 || since > gap as i64 {
        // The first packet, or the idle gap elapsed: a burst starts with this packet.
        new_burst(s, key, last, now, cfg.flags);
    } else if since > 0 {
        store(&mut s.last_seen_ns, now);
    }
    atomic_add(&mut s.packets, pkt.segments as u64);
    atomic_add(&mut s.bytes, pkt.l3_bytes as u64);
    atomic_add(&mut s.payload_bytes, pkt.payload_bytes as u64);
    if pkt.ecn == wire::ECN_CE {
        atomic_add(&mut s.ce_marks, 1);
    }
    Ok(s)
}

/// The flow's slot in `FLOWS`: its home slot `flow_hash & mask` or one of the next
/// `FLOW_PROBES - 1`. A slot holds the flow when its state is `LIVE` with the key's fingerprint
/// and the keys are equal; an `EMPTY` slot ends the search (the flow would have been put there or
/// earlier); a `TOMBSTONE` does not (a flow further along may have probed over it while it was
/// live). Not found: the first `EMPTY` or `TOMBSTONE` seen is claimed (`claim`).
#[inline(always)]
fn find_or_claim(key: &FlowKey, now: u64, cfg: &Config) -> Result<&'static mut FlowStats, Skip> {
    let h = flow_hash(key, cfg.hash_seed);
    let mask = if cfg.flow_slot_mask == 0 { MAX_FLOWS - 1 } else { cfg.flow_slot_mask };
    let live = slot_state::with_fp(slot_state::LIVE, h);
    let claiming = slot_state::with_fp(slot_state::CLAIMING, h);
    let mut free: Option<*mut FlowSlot> = None;
    for i in 0..FLOW_PROBES {
        let idx = (h as u32).wrapping_add(i) & mask;
        // None only when the mask exceeds the array (a config written for another capacity).
        let Some(slot) = FLOWS.get_ptr_mut(idx) else { break };
        // SAFETY: a map value pointer stays valid for the rest of this program run; the array is
        // never freed while the program holds it.
        let st = load(unsafe { &(*slot).state });
        if st == live {
            // The plain load only chose the slot; the fully ordered re-read makes the key and
            // counters read below at least as new as the claim that published them (see
            // "Memory order on FLOWS"). It fails only if the agent evicted the slot or another
            // flow re-claimed it since the load: rare, counted, the packet passes.
            if !cas(unsafe { &mut (*slot).state }, live, live) {
                return Err(Skip::Contended);
            }
            if same_key(unsafe { &(*slot).key }, key) {
                return Ok(unsafe { &mut (*slot).stats });
            }
        } else if st == slot_state::EMPTY {
            if free.is_none() {
                free = Some(slot);
            }
            break;
        } else if st == slot_state::TOMBSTONE {
            if free.is_none() {
                free = Some(slot);
            }
        } else if st == claiming {
            // Probably this flow, being created by another CPU right now (or another flow with
            // the same fingerprint): do not wait, do not create it twice.
            return Err(Skip::Contended);
        }
    }
    match free {
        Some(slot) => {
            let s = claim(slot, key, now, h, cfg.flags);
            if s.is_null() {
                Err(Skip::Contended)
            } else {
                // SAFETY: `claim` returned the stats of the slot it made live (valid, see above).
                Ok(unsafe { &mut *s })
            }
        }
        None => {
            map_full(key, now);
            Err(Skip::MapFull)
        }
    }
}

/// A flow whose window is full: a `MAP_FULL` event, at most `MAP_FULL_EVENTS_PER_SEC` per
/// second per CPU. Every packet of such a flow lands here, so without the bucket one busy
/// untracked flow would fill the ring and crowd out the burst ends; `STATS[MAP_FULL]` still
/// counts every packet. Out of line: rare.
#[inline(never)]
fn map_full(key: &FlowKey, now: u64) {
    if budget(BUDGET_MAP_FULL, MAP_FULL_COST_NS, now) {
        emit(event_kind::MAP_FULL, key, now, None);
    }
}

/// Key equality as eleven 32-bit compares folded into one test (no early exit: fewer branches
/// for the verifier and the CPU, and the keys of a fingerprint match are nearly always equal).
#[inline(always)]
fn same_key(a: &FlowKey, b: &FlowKey) -> bool {
    // SAFETY: FlowKey is 44 bytes, 4-aligned, no padding: eleven u32 words.
    let (a, b) = unsafe { (&*(a as *const FlowKey).cast::<[u32; 11]>(), &*(b as *const FlowKey).cast::<[u32; 11]>()) };
    let mut diff = 0u32;
    for i in 0..11 {
        diff |= a[i] ^ b[i];
    }
    diff == 0
}

/// First packet of a flow: takes `slot` (`EMPTY` or `TOMBSTONE` when it was read) with a
/// compare-and-exchange to `CLAIMING|fp`, writes the key and zeroed counters, then publishes it as
/// `LIVE|fp`. Out of line: it is rare. If another CPU changed the slot first: when it is now this
/// flow (`CLAIMING`/`LIVE` with our fingerprint) the packet is `Contended` (counting it into a
/// slot whose key may not be written yet could attribute it wrongly), otherwise the table moved
/// under us and the packet is `Contended` too: both are rare and counted. Returns null then.
/// (Five arguments and a plain pointer result: BPF calls pass at most five registers, no stack.)
#[inline(never)]
fn claim(slot: *mut FlowSlot, key: &FlowKey, now: u64, h: u64, flags: u32) -> *mut FlowStats {
    // SAFETY: as in `find_or_claim`.
    let slot = unsafe { &mut *slot };
    let st = load(&slot.state);
    if (st != slot_state::EMPTY && st != slot_state::TOMBSTONE)
        || !cas(&mut slot.state, st, slot_state::with_fp(slot_state::CLAIMING, h))
    {
        return core::ptr::null_mut();
    }
    // Volatile, like the state store below, so the compiler keeps them before it.
    // SAFETY: plain stores into the slot this CPU just claimed; FlowStats is FromBytes (all-zero
    // is a valid value).
    unsafe {
        core::ptr::write_volatile(&mut slot.key, *key);
        core::intrinsics::volatile_set_memory(&mut slot.stats as *mut FlowStats, 0, 1);
    }
    // Publish with a fully ordered exchange (BPF_XCHG), not a plain store: on arm64 a plain store
    // may become visible before the key and zeroed counters above; the exchange orders them
    // first on every JIT (see "Memory order on FLOWS").
    swap(&mut slot.state, slot_state::with_fp(slot_state::LIVE, h));
    if flags & config_flags::FLOW_START_EVENTS != 0 {
        emit(event_kind::FLOW_START, key, now, None);
    }
    if flags & config_flags::DEBUG_LOG != 0 {
        log_new_flow(key);
    }
    &mut slot.stats
}

/// Ends the open burst (if any) and starts the next one with this packet. Out of line: once per
/// burst. The CPU whose compare-and-exchange moves `last_seen_ns` from the value it read wins and
/// does the rest; a CPU that lost finds the burst already restarted and only adds its packet.
#[inline(never)]
fn new_burst(s: &mut FlowStats, key: &FlowKey, last: u64, now: u64, flags: u32) {
    if !cas(&mut s.last_seen_ns, last, now) {
        return;
    }
    // Totals before this packet (it is added after we return): what the ended burst holds.
    let packets = load(&s.packets);
    let bytes = load(&s.bytes);
    if last == 0 {
        store(&mut s.first_seen_ns, now);
    } else if flags & config_flags::BURST_EVENTS != 0 {
        let ended = BurstState {
            start_ns: s.burst_start_ns,
            last_ns: last,
            bytes: bytes.wrapping_sub(s.burst_start_bytes),
            packets: packets.wrapping_sub(s.burst_start_packets),
        };
        emit(event_kind::BURST_END, key, now, Some(&ended));
    }
    // Not atomic as a whole: a packet another CPU adds between these stores can land in either
    // burst. It is never lost or counted twice: a burst's size is the difference of totals.
    store(&mut s.burst_start_ns, now);
    store(&mut s.burst_start_packets, packets);
    store(&mut s.burst_start_bytes, bytes);
}

// Races on FLOWS. Several CPUs may handle packets of one flow at the same time and update its
// entry without a lock. Counters are only ever changed by atomic adds (BPF_ATOMIC | BPF_ADD), so
// none is lost. The burst restarts under a compare-and-exchange of `last_seen_ns` (`new_burst`), so
// one CPU ends a burst and one BURST_END is emitted. The tracking state is built so a race can only
// *lose* a detection, never invent one:
// - Each tracking word (`FlowStats::tcp_seq_end`, `roce_psn`) is read once and
//   written with one aligned 64-bit store of a value *and* its VALID bit, so every word a reader
//   sees is exactly what some earlier packet of the flow wrote: only observed values are stored.
// - TCP retransmission: counted when `seq` is before the stored end. The stored end is the end of
//   a segment that was seen, so it is at most the true highest end: the segment really starts
//   below data already seen. Two CPUs raising the end at once may leave the smaller of the two
//   (a lost update): later retransmissions between the two ends are then missed, none are added.
// - D-SACK: read from the pure ACK itself (`parse::dsack`), no state: nothing to race on.
// - RoCEv2 PSN: here a stale expectation *would* invent a gap (the next in-order PSN would look
//   ahead of it), so the word is advanced with compare-and-exchange from the value the decision
//   was made on; if another CPU changed it in between, this packet's detection is dropped and the
//   other CPU's state stands. "Behind" needs no store: the stored expectation came from a PSN that
//   was seen, so a PSN behind it really arrived after a later one.
// Sharing costs a cache line moving between CPUs when two of them handle one flow at once; the
// per-CPU counters of earlier versions avoided that for the counters but paid a second hash lookup
// on every packet for the shared state, whose line moved anyway.

// Memory order on FLOWS. The slot protocol must hold on arm64 (the DPU), whose CPUs may make
// plain stores visible, and perform plain loads, out of program order; x86 keeps stores in order
// and loads in order, so there it held by accident. BPF has release stores and acquire loads only
// since 6.15 (BPF_STORE_REL, BPF_LOAD_ACQ), but its read-modify-write atomics with a result
// (BPF_XCHG, BPF_CMPXCHG, BPF_ADD|BPF_FETCH; 5.12+) are fully ordered on every JIT: x86 `lock`
// instructions; arm64 LSE `swpal`/`casal`/`ldaddal`, or without LSE an exclusive loop with
// `dmb ish` (arch/arm64/net/bpf_jit_comp.c, emit_lse_atomic / emit_ll_sc_atomic; the kernel's
// memory model calls them fully ordered, Documentation/bpf/standardization/instruction-set.rst).
// Non-fetching BPF_ADD (`stadd`, the counters) is not ordered and need not be.
// - Claim (`claim`): CAS EMPTY/TOMBSTONE → CLAIMING|fp, plain stores of the key and zeroed
//   counters, then XCHG → LIVE|fp. The CAS orders the stores after the claim (a reader that sees
//   the new key also sees CLAIMING or later); the XCHG orders them before LIVE (a reader that
//   orders its reads after seeing LIVE sees the key and zeros, not the previous tenant's).
// - Lookup (`find_or_claim`): the window is scanned with plain loads of `state`; when one reads
//   LIVE with the flow's fingerprint the program re-reads the word with a CAS(live, live) before
//   it reads the key or any counter. The CAS is the acquire: on arm64 the key compare could
//   otherwise be served from before the claim and miss (the packet would probe on and could claim
//   a second slot for the flow), and the tracking words (`tcp_seq_end`, ...) could be the
//   previous flow's and invent a retransmission. Counters written after the CAS are ordered after
//   the claim's zeroing by the same CAS (and on arm64 also by the control dependency).
// - What a plain scan load can get wrong is bounded: a stale EMPTY/TOMBSTONE leads to `claim`,
//   whose CAS fails on the real value (CONTENDED, one packet); a stale CLAIMING is CONTENDED; a
//   stale LIVE is caught by the CAS re-read (CONTENDED). None of these counts into the wrong
//   flow.
// - Not prevented: an eviction that lands after a packet's CAS re-read succeeded. The packet
//   goes on adding to the slot it found; in that window (from the re-read to the packet's last
//   counter add, about a nanosecond to tens of nanoseconds) its counts are lost with the evicted
//   flow if the slot stays a tombstone or EMPTY, or land in the slot's next flow if a new flow
//   claims and zeroes it first (they are then added after, or wiped by, the zeroing). The agent
//   evicts only flows idle for `flow_idle_timeout`, so a packet in that window is one arriving
//   at the very moment its flow is judged idle.
// - The agent reads `state` with Acquire, copies the slot, then an Acquire fence and `state`
//   again (a seqlock read: a slot re-claimed during the copy reads another word); it evicts with
//   an AcqRel CAS LIVE|fp → TOMBSTONE, then turns the run of tombstones holding that slot back
//   into EMPTY (AcqRel CAS TOMBSTONE → EMPTY per slot, from the run's end backwards) when an EMPTY
//   follows the run. Counters are aligned u64s, read whole on x86-64 and arm64.
// - Not prevented, on any architecture: the agent evicting a flow at the instant two CPUs handle
//   the first packets of another flow whose window holds the evicted slot can leave that new
//   flow in two slots (each CPU saw a different first free slot). Later packets find the first
//   one; the other stays idle and is evicted like any idle flow. The same can happen when a CPU
//   claims the EMPTY after a run of tombstones (having read a slot of the run as live an instant
//   before its eviction) while the agent empties that run: the flow's next packet stops at the
//   emptied slot and claims it as well.
// Cost: one CMPXCHG on the flow's slot per matched packet (a line the counter adds write anyway)
// and one XCHG per new flow; measured in docs/benchmarks.md ("Flow table memory order").

/// TCP flag counters, the retransmission detection and the D-SACKs of pure ACKs.
#[inline(always)]
fn tcp_track(s: &mut FlowStats, t: &TcpInfo, pkt: &Packet) {
    let f = t.flags;
    // Rare flags behind one test: data segments and ACKs usually carry none of them.
    if f & (wire::TCP_SYN | wire::TCP_FIN | wire::TCP_RST | wire::TCP_ECE | wire::TCP_CWR) != 0 {
        tcp_rare_flags(s, f);
    }
    let payload = pkt.payload_bytes;
    if payload > 0 {
        let end = t.seq.wrapping_add(payload);
        let cur = load(&s.tcp_seq_end);
        if cur & track::VALID == 0 {
            store(&mut s.tcp_seq_end, track::VALID | end as u64);
            return;
        }
        let high = cur as u32;
        // Serial-number comparison (RFC 1982 / RFC 9293 §3.4): a difference whose i32 value is
        // negative means "before", across the 2^32 wrap.
        if (t.seq.wrapping_sub(high) as i32) < 0 {
            atomic_add(&mut s.tcp_retrans, retransmitted_segments(t.seq, end, high, pkt) as u64);
        }
        if (end.wrapping_sub(high) as i32) > 0 {
            store(&mut s.tcp_seq_end, track::VALID | end as u64);
        }
    } else if f & wire::TCP_ACK != 0 && f & (wire::TCP_SYN | wire::TCP_FIN | wire::TCP_RST) == 0 {
        atomic_add(&mut s.tcp_pure_acks, 1);
        if t.dsack {
            atomic_add(&mut s.tcp_dsacks, 1);
        }
    }
}

/// Wire segments of a data skb `[seq, end)` that lie below `high` (`seq` is before `high`). A
/// plain segment is 1; a GSO super-packet counts the `gso_size` segments that start below `high`
/// (a retransmission the stack batched, or one overlapping new data), as the sender's
/// RetransSegs does (tcp_skb_pcount of the retransmitted skb).
#[inline(always)]
fn retransmitted_segments(seq: u32, end: u32, high: u32, pkt: &Packet) -> u32 {
    let segs = pkt.segments;
    if segs <= 1 || (end.wrapping_sub(high) as i32) <= 0 {
        return segs;
    }
    let mss = pkt.gso_size;
    if mss == 0 {
        return 1;
    }
    let below = high.wrapping_sub(seq);
    let n = (below + mss - 1) / mss;
    if n > segs { segs } else { n }
}

/// SYN, FIN, RST, ECE and CWR counters. Out of the common path's way.
#[inline(always)]
fn tcp_rare_flags(s: &mut FlowStats, f: u8) {
    if f & wire::TCP_SYN != 0 {
        atomic_add(&mut s.tcp_syn, 1);
    }
    if f & wire::TCP_FIN != 0 {
        atomic_add(&mut s.tcp_fin, 1);
    }
    if f & wire::TCP_RST != 0 {
        atomic_add(&mut s.tcp_rst, 1);
    }
    if f & wire::TCP_ECE != 0 {
        atomic_add(&mut s.tcp_ece, 1);
    }
    if f & wire::TCP_CWR != 0 {
        atomic_add(&mut s.tcp_cwr, 1);
    }
}

/// RoCEv2 reliability signals. PSNs are 24-bit serial numbers (IBA §9.7.2): the distance
/// `(psn - expected) mod 2^24` is "ahead" below 2^23 and "behind" above it.
#[inline(always)]
fn rocev2_track(s: &mut FlowStats, b: &Bth) {
    use wire::bth_opcode;
    if b.opcode == bth_opcode::CNP {
        // CNPs carry no meaningful PSN (Annex A17.9.3).
        atomic_add(&mut s.roce_cnps, 1);
        return;
    }
    if b.opcode == bth_opcode::RC_ACK {
        // ACK PSNs acknowledge request PSNs and are coalesced, so they are not a sequence.
        if b.syndrome & wire::AETH_SYNDROME_KIND_MASK == wire::AETH_SYNDROME_NAK {
            atomic_add(&mut s.roce_naks, 1);
        }
        return;
    }
    if b.opcode == RC_ATOMIC_ACK {
        return;
    }
    let cur = load(&s.roce_psn);
    let mut gap = 0;
    let expected = cur as u32 & wire::PSN_MASK;
    let qp = (cur >> track::QP_SHIFT) as u32 & wire::PSN_MASK;
    if cur & track::VALID != 0 && qp == b.dest_qp {
        let delta = b.psn.wrapping_sub(expected) & wire::PSN_MASK;
        if delta >= PSN_HALF {
            // Behind the expected PSN: retransmission (go-back-N) or reordering. The
            // expectation is not moved back, so the rest of a go-back-N replay counts too.
            atomic_add(&mut s.roce_psn_out_of_order, 1);
            return;
        }
        gap = delta;
    }
    // Otherwise: first packet, resynchronisation, or a new queue pair reusing the 5-tuple (PSN
    // spaces are per QP): take this PSN as the reference.
    //
    // A read request consumes one PSN per response packet, a count the BTH does not carry (RETH
    // length / path MTU): resynchronise on the next request instead of guessing.
    let valid = b.opcode != RC_RDMA_READ_REQUEST;
    let next = track::psn_word(b.psn.wrapping_add(1), b.dest_qp, valid);
    if next != cur && !cas(&mut s.roce_psn, cur, next) {
        // Another CPU moved the expectation since we read it: drop this packet's detection.
        return;
    }
    if gap != 0 {
        atomic_add(&mut s.roce_psn_gap_events, 1);
        atomic_add(&mut s.roce_psn_gap_packets, gap as u64);
    }
}

/// RC RDMA READ Request (IBA Table 38).
const RC_RDMA_READ_REQUEST: u8 = 0x0C;
/// RC ATOMIC Acknowledge (IBA Table 38): carries AETH, PSN of the atomic request.
const RC_ATOMIC_ACK: u8 = 0x12;
const PSN_HALF: u32 = 1 << 23;

/// One 64-bit load the compiler may not split, repeat or move: the value a decision is made on.
#[inline(always)]
fn load(src: &u64) -> u64 {
    unsafe { core::ptr::read_volatile(src) }
}

/// One 64-bit store (a single BPF_STX | BPF_DW), so another CPU sees the old or the new word.
#[inline(always)]
fn store(dst: &mut u64, v: u64) {
    unsafe { core::ptr::write_volatile(dst, v) };
}

/// `*dst = new` if `*dst == old`, as one BPF_ATOMIC | BPF_CMPXCHG; true if it was written.
/// The kernel makes BPF_CMPXCHG fully ordered on every JIT; SeqCst here keeps the compiler from
/// moving other memory accesses across it, so the instruction order is the one written.
#[inline(always)]
fn cas(dst: &mut u64, old: u64, new: u64) -> bool {
    unsafe { atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(dst, old, new).1 }
}

/// `*dst = v` as one BPF_ATOMIC | BPF_XCHG (kernel 5.12+, like BPF_CMPXCHG): fully ordered on
/// every JIT, so every earlier store is visible before `v` is. Returns the old word.
#[inline(always)]
fn swap(dst: &mut u64, v: u64) -> u64 {
    unsafe { atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(dst, v) }
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
