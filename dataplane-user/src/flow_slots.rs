//! `FLOWS` read in place. Since layout 3 the flow monitor keeps its flows in a `BPF_F_MMAPABLE`
//! array of [`FlowSlot`]s used as an open-addressing hash table (see `dataplane_common::FlowSlot`
//! and `slot_state` for who may change a slot and how). The agent maps the array into its address
//! space once; a poll is then a walk over memory with no syscall, and evicting an idle flow is one
//! compare-and-exchange of its slot's state word.
//!
//! Invariants:
//! - The agent changes only `state`: `LIVE|fp` → `TOMBSTONE` (evicting a flow, with a CAS, so a
//!   slot another writer changed in between is left alone), then `TOMBSTONE` → `EMPTY` for the
//!   run of tombstones around an evicted slot when an `EMPTY` follows it (with a CAS per slot, so
//!   a slot the program just claimed is left alone; see `SlotTable::reclaim_with`). Without the
//!   second step, tombstones would only ever be reused, never emptied: on a host where flows
//!   come and go, live + tombstone slots would approach capacity and every new flow's first
//!   packet would probe its whole window. It never writes keys or counters.
//! - A slot is reported only if its state word read the same `LIVE|fp` value before and after the
//!   key and counters were copied (Acquire load, copy, Acquire fence, load: a seqlock read, which
//!   holds on arm64 too, where the copy's loads could otherwise be done after the second load): a
//!   slot re-claimed for another flow during the copy is skipped this poll, never reported with a
//!   mixed key. The program publishes a slot with a fully ordered BPF_XCHG after writing its key,
//!   so a `LIVE` read with Acquire sees that key ("Memory order on FLOWS" in the eBPF crate).
//! - Counters are read with plain loads while CPUs add to them: each aligned u64 is read whole
//!   (x86-64 and arm64), so a counter may be one packet older than another, never torn.
//! - A flow can, very rarely, be live in two slots of its window (see the eBPF crate's "Memory
//!   order on FLOWS": an eviction racing two CPUs' first packets of a new flow, or a new flow's
//!   claim racing `reclaim`); `evict` tombstones every copy, so the stray one does not outlive
//!   the flow.
use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU64, Ordering},
};

use dataplane_common::{flow_hash, slot_state, FlowKey, FlowSlot, FlowStats, FLOW_PROBES};

use crate::flow_table::SlotCounts;

/// Where the slots live.
enum Backing {
    /// The kernel's array, mapped `len` bytes long.
    Mmap { len: usize },
    /// A heap copy standing in for the kernel in tests (held only to keep the memory alive).
    #[cfg(test)]
    Heap(#[allow(dead_code)] Box<[FlowSlot]>),
}

/// The slots of `FLOWS`, read in place.
pub struct SlotTable {
    base: NonNull<FlowSlot>,
    slots: u32,
    seed: u32,
    backing: Backing,
}

// SAFETY: the table is plain memory shared with the kernel; every access goes through atomic or
// volatile operations, so moving the handle to the collector thread is sound.
unsafe impl Send for SlotTable {}

impl SlotTable {
    /// Maps the array behind `fd` (`slots` entries of 256 bytes, read and write: eviction writes
    /// state words). `seed` is `Config::hash_seed` of the maps, to find a flow by key.
    pub fn map(fd: BorrowedFd<'_>, slots: u32, seed: u32) -> io::Result<Self> {
        if !slots.is_power_of_two() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("FLOWS has {slots} slots, not a power of two")));
        }
        let len = slots as usize * std::mem::size_of::<FlowSlot>();
        // SAFETY: a fresh shared mapping of the map's data (offset 0 of a BPF_F_MMAPABLE array
        // map, kernel/bpf/arraymap.c array_map_mmap); `len` is the array's size, a multiple of
        // the page size for 16+ slots (and rounded up by the kernel otherwise).
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<FlowSlot>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(SlotTable { base, slots, seed, backing: Backing::Mmap { len } })
    }

    /// A table in heap memory (tests: stands in for the kernel's array).
    #[cfg(test)]
    pub fn in_memory(slots: Vec<FlowSlot>, seed: u32) -> Self {
        assert!(slots.len().is_power_of_two(), "a power of two of slots");
        let mut boxed = slots.into_boxed_slice();
        let n = boxed.len() as u32;
        let base = NonNull::new(boxed.as_mut_ptr()).expect("a boxed slice is non-null");
        SlotTable { base, slots: n, seed, backing: Backing::Heap(boxed) }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> u32 {
        self.slots
    }

    fn slot_ptr(&self, i: u32) -> *mut FlowSlot {
        assert!(i < self.slots);
        // SAFETY: in bounds (asserted).
        unsafe { self.base.as_ptr().add(i as usize) }
    }

    fn state_word(&self, i: u32) -> &AtomicU64 {
        // SAFETY: the state word is an aligned u64 inside the mapping, which lives as long as
        // `self`; the kernel side changes it only with atomic instructions or aligned stores.
        unsafe { AtomicU64::from_ptr(std::ptr::addr_of_mut!((*self.slot_ptr(i)).state)) }
    }

    pub fn state(&self, i: u32) -> u64 {
        self.state_word(i).load(Ordering::Acquire)
    }

    /// Sets a slot's state word (tests standing in for the program).
    #[cfg(test)]
    pub fn set_state(&self, i: u32, v: u64) {
        self.state_word(i).store(v, Ordering::Release);
    }

    /// A copy of slot `i` (see the module invariants for what a copy under concurrent updates is).
    pub fn read(&self, i: u32) -> FlowSlot {
        // SAFETY: in bounds, aligned; FlowSlot is FromBytes, so any bytes are a valid value.
        unsafe { std::ptr::read_volatile(self.slot_ptr(i)) }
    }

    /// A copy of slot `i` if its state word was `st` (read with Acquire by the caller) before and
    /// after the copy; None if the slot changed meanwhile.
    fn read_stable(&self, i: u32, st: u64) -> Option<FlowSlot> {
        let s = self.read(i);
        // The copy's loads must not be performed after the re-check's load (arm64 may reorder
        // loads; an Acquire load only holds back the loads after it).
        std::sync::atomic::fence(Ordering::Acquire);
        (self.state_word(i).load(Ordering::Relaxed) == st).then_some(s)
    }

    /// Writes slot `i` whole (tests standing in for the program).
    #[cfg(test)]
    pub fn write(&self, i: u32, s: FlowSlot) {
        // SAFETY: in bounds, aligned.
        unsafe { std::ptr::write_volatile(self.slot_ptr(i), s) }
    }

    /// The live slot of `key`, probing as the program does (tests; `evict` probes on its own,
    /// since it must visit every copy).
    #[cfg(test)]
    pub fn find(&self, key: &FlowKey) -> Option<u32> {
        let h = flow_hash(key, self.seed);
        let live = slot_state::with_fp(slot_state::LIVE, h);
        for p in 0..FLOW_PROBES {
            let i = (h as u32).wrapping_add(p) & (self.slots - 1);
            let st = self.state(i);
            if st == slot_state::EMPTY {
                return None;
            }
            if st == live && self.read_stable(i, live).is_some_and(|s| s.key == *key) {
                return Some(i);
            }
        }
        None
    }

    /// Evicts `key`: every slot of its window that holds it goes `LIVE|fp` → `TOMBSTONE` with a
    /// compare-and-exchange (normally one; two after the rare race in the module docs), then each
    /// such slot's run of tombstones is turned back into `EMPTY` when an `EMPTY` follows it
    /// (`reclaim_with`). False when the flow is not live (already gone) or its slot
    /// changed under us.
    pub fn evict(&self, key: &FlowKey) -> bool {
        self.evict_with(key, &mut |_, _| {})
    }

    /// `evict`, calling `before_cas(self, slot)` just before each compare-and-exchange (tests:
    /// another writer changing the slot at that instant).
    fn evict_with(&self, key: &FlowKey, before_cas: &mut dyn FnMut(&Self, u32)) -> bool {
        let h = flow_hash(key, self.seed);
        let live = slot_state::with_fp(slot_state::LIVE, h);
        let mut evicted: Option<u32> = None;
        for p in 0..FLOW_PROBES {
            let i = (h as u32).wrapping_add(p) & (self.slots - 1);
            let st = self.state(i);
            if st == slot_state::EMPTY {
                break;
            }
            if st == live && self.read_stable(i, live).is_some_and(|s| s.key == *key) {
                before_cas(self, i);
                if self.state_word(i).compare_exchange(live, slot_state::TOMBSTONE, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    // A second copy lies further along; reclaiming from the last one covers both
                    // when only tombstones lie between them.
                    evicted = Some(i);
                }
            }
        }
        if let Some(i) = evicted {
            self.reclaim_with(i, before_cas);
        }
        evicted.is_some()
    }

    /// `reclaim_with` without a hook (tests).
    #[cfg(test)]
    pub fn reclaim(&self, i: u32) -> u32 {
        self.reclaim_with(i, &mut |_, _| {})
    }

    /// Turns the run of tombstones that holds slot `i` back into `EMPTY` if the slot after the
    /// run is `EMPTY`; returns how many slots it emptied. Sound for linear probing: a flow lies
    /// at most `FLOW_PROBES - 1` slots past its home with no `EMPTY` in between (the program
    /// claims the first free slot of the window and stops at an `EMPTY`), so when slot `j + 1` is
    /// `EMPTY` no flow past `j` has its home at or before `j`, and a tombstone at `j` can become
    /// `EMPTY` without hiding any flow from its lookups. The run is emptied from its end
    /// backwards, each slot with a CAS `TOMBSTONE` → `EMPTY` after the slot behind it was emptied,
    /// so the argument holds at each step; a CAS that fails (the program claimed the slot
    /// meanwhile) ends the walk and the slots before it stay tombstones.
    ///
    /// The forward search for the run's end looks at most `FLOW_PROBES` slots past `i`: since
    /// every eviction reclaims, a tombstone run followed by an `EMPTY` is left only by an older
    /// agent or by a search cut short here, and bounding the search keeps an eviction O(window)
    /// however many tombstones a table holds (the backward walk empties each slot it visits).
    ///
    /// Race left (no lock is shared with the program): a CPU that read a slot of the run as live
    /// an instant before it was evicted, and the `EMPTY` after the run as free, can claim that
    /// `EMPTY` for a new flow while this walk empties the run in front of it. The flow's next
    /// packet then stops at the emptied slot and claims it too: the flow is live in two slots,
    /// the case of the module docs (later packets count into the first; `evict` tombstones both
    /// copies); the packet or two counted into the stray copy are reported under the same key.
    ///
    /// `before_cas(self, slot)` runs just before each compare-and-exchange (tests).
    fn reclaim_with(&self, i: u32, before_cas: &mut dyn FnMut(&Self, u32)) -> u32 {
        let mask = self.slots - 1;
        if self.state(i) != slot_state::TOMBSTONE {
            return 0;
        }
        // The run's end: the first slot after `i` that is not a tombstone.
        let mut end = None;
        for p in 1..=FLOW_PROBES.min(self.slots) {
            let j = i.wrapping_add(p) & mask;
            let st = self.state(j);
            if st != slot_state::TOMBSTONE {
                end = (st == slot_state::EMPTY).then_some(j);
                break;
            }
        }
        let Some(end) = end else { return 0 };
        let mut emptied = 0;
        let mut j = end;
        while emptied < self.slots {
            j = j.wrapping_sub(1) & mask;
            if self.state(j) != slot_state::TOMBSTONE {
                break;
            }
            before_cas(self, j);
            if self.state_word(j).compare_exchange(slot_state::TOMBSTONE, slot_state::EMPTY, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                break;
            }
            emptied += 1;
        }
        emptied
    }
}

/// What the previous poll saw in each slot, so that a poll reports only the flows that changed
/// (`PollSnapshot::partial`): an idle flow then costs two loads from the slot's first cache line
/// per poll (its state word and `packets`) and no hash lookup in the agent's table. The per-slot
/// words the walk reads every poll (`prev`, 16 bytes a slot) are kept apart from the keys (44
/// bytes a slot) and digests (8 bytes), which only a reported or vanished flow touches.
///
/// `packets` alone tells whether a live flow moved: the program adds at least one to it for every
/// packet it accounts, after the packet's `last_seen_ns` and burst stores. The stores after it
/// (`bytes`, `payload_bytes`, ECN, the TCP/RoCE tracking) may land just after this poll's copy,
/// so a flow that moved is read once more at the next poll (`MOVED`) and reported again only if
/// its counters differ from the copy reported (a digest of them, [`stats_digest`]): a flow that
/// moved once costs one report, not two.
#[derive(Default)]
pub struct SlotDiff {
    prev: Vec<SlotSeen>,
    /// The key of each slot's flow as last reported (valid while `prev`'s state is `LIVE`).
    keys: Vec<FlowKey>,
    /// [`stats_digest`] of each slot's counters as last reported (same validity as `keys`).
    digests: Vec<u64>,
}

/// A 64-bit digest of a flow's counters and tracking words: two copies that differ in any word
/// differ in their digest but for a 2^-64 chance (a missed re-report then leaves a counter
/// behind only until the flow's next packet).
fn stats_digest(s: &FlowStats) -> u64 {
    use std::hash::BuildHasher as _;
    foldhash::fast::FixedState::default().hash_one(zerocopy::IntoBytes::as_bytes(s))
}

#[derive(Clone, Copy, Default)]
struct SlotSeen {
    /// The state word; [`MOVED`] set when the slot was reported last poll because it moved: it
    /// is read once more (and reported if its digest changed), so counters a CPU added just
    /// after `packets` (`bytes`, the TCP/RoCE counters of the same packet) are not left behind.
    /// The program never sets that bit.
    state: u64,
    packets: u64,
}

/// The bit of [`SlotSeen::state`] that says "moved last poll" (bits 32..62 of a state word are
/// always 0: the tag is in the top two bits, the fingerprint in the low 32).
const MOVED: u64 = 1 << 32;
const _: () = assert!(slot_state::TAG_MASK & MOVED == 0 && (MOVED as u32) == 0);

/// A poll of the table read against the previous one.
#[derive(Debug, Default)]
pub struct SlotChanges {
    /// Flows that are new or moved (and those that moved last poll).
    pub changed: Vec<(FlowKey, FlowStats)>,
    /// Flows that were live at the previous poll and are not any more (evicted, or their slot
    /// taken by another flow).
    pub vanished: Vec<FlowKey>,
    pub counts: SlotCounts,
}

impl SlotTable {
    /// Reads the table against `diff` (the previous poll's view) and updates it.
    pub fn changes(&self, diff: &mut SlotDiff) -> SlotChanges {
        let n = self.slots as usize;
        diff.prev.resize(n, SlotSeen::default());
        diff.keys.resize(n, FlowKey::default());
        diff.digests.resize(n, 0);
        let mut out = SlotChanges { counts: SlotCounts { capacity: u64::from(self.slots), ..SlotCounts::default() }, ..SlotChanges::default() };
        for i in 0..self.slots {
            self.prefetch(i.wrapping_add(PREFETCH_SLOTS) & (self.slots - 1));
            let st = self.state(i);
            let seen = &mut diff.prev[i as usize];
            match st & slot_state::TAG_MASK {
                slot_state::LIVE => out.counts.live += 1,
                slot_state::CLAIMING => out.counts.claiming += 1,
                slot_state::TOMBSTONE => out.counts.tombstones += 1,
                _ => {}
            }
            let seen_state = seen.state & !MOVED;
            let was_live = seen_state & slot_state::TAG_MASK == slot_state::LIVE;
            if st & slot_state::TAG_MASK != slot_state::LIVE {
                if was_live {
                    out.vanished.push(diff.keys[i as usize]);
                }
                if seen.state != st {
                    *seen = SlotSeen { state: st, ..SlotSeen::default() };
                }
                continue;
            }
            let p = self.slot_ptr(i);
            // SAFETY: in bounds; an aligned u64 read whole.
            let packets = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*p).stats.packets)) };
            let moved = st != seen_state || packets != seen.packets;
            if !moved && seen.state & MOVED == 0 {
                continue;
            }
            let Some(s) = self.read_stable(i, st) else {
                // Re-claimed during the copy: look again next poll.
                continue;
            };
            if was_live && seen_state != st {
                out.vanished.push(diff.keys[i as usize]);
            }
            let digest = stats_digest(&s.stats);
            if !moved && diff.digests[i as usize] == digest {
                // Read again because it moved last poll, and nothing was stored after that copy.
                seen.state = st;
                continue;
            }
            out.changed.push((s.key, s.stats));
            diff.keys[i as usize] = s.key;
            diff.digests[i as usize] = digest;
            *seen = SlotSeen { state: if moved { st | MOVED } else { st }, packets: s.stats.packets };
        }
        out
    }

    /// Asks the CPU to start loading slot `i`'s first cache line (state word and `packets`): the
    /// walk is bound by the latency of those loads otherwise (half of its time at 32,768 slots).
    #[inline(always)]
    fn prefetch(&self, i: u32) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch never faults, and the address is in bounds anyway.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(self.slot_ptr(i).cast::<i8>());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = i;
    }
}

/// How far ahead of the walk [`SlotTable::prefetch`] asks for a slot (slots of 256 bytes).
const PREFETCH_SLOTS: u32 = 16;

impl Drop for SlotTable {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: the mapping made in `map`, unmapped once.
            Backing::Mmap { len } => unsafe {
                libc::munmap(self.base.as_ptr().cast(), len);
            },
            #[cfg(test)]
            Backing::Heap(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_common::{direction, flow_kind, ipv4_mapped};

    fn key(port: u16) -> FlowKey {
        FlowKey {
            src_addr: ipv4_mapped([10, 0, 0, 1]),
            dst_addr: ipv4_mapped([10, 0, 0, 2]),
            src_port: port,
            dst_port: 29500,
            ifindex: 2,
            protocol: 17,
            direction: direction::EGRESS,
            kind: flow_kind::UDP,
            _pad: 0,
        }
    }

    /// Puts `key` where the program would (first EMPTY/TOMBSTONE of its window).
    fn insert(t: &SlotTable, key: FlowKey, packets: u64) -> u32 {
        let h = flow_hash(&key, t.seed);
        for p in 0..FLOW_PROBES {
            let i = (h as u32).wrapping_add(p) & (t.len() - 1);
            let st = t.state(i);
            if st == slot_state::EMPTY || st == slot_state::TOMBSTONE {
                t.write(i, FlowSlot { state: slot_state::with_fp(slot_state::LIVE, h), key, _pad: 0, stats: FlowStats { packets, ..Default::default() } });
                return i;
            }
        }
        panic!("window full");
    }

    #[test]
    fn changes_list_live_slots_only_and_find_finds_each() {
        let t = SlotTable::in_memory(vec![FlowSlot::default(); 16], 7);
        let slots: Vec<u32> = (0..10).map(|p| insert(&t, key(p), p as u64 + 1)).collect();
        let live = t.changes(&mut SlotDiff::default()).changed;
        assert_eq!(live.len(), 10);
        for (k, s) in &live {
            let p = k.src_port;
            assert_eq!(s.packets, p as u64 + 1);
            assert_eq!(t.find(k), Some(slots[p as usize]));
        }
        // A claim in progress is not listed.
        t.set_state(slots[3], slot_state::with_fp(slot_state::CLAIMING, 1));
        let c = t.changes(&mut SlotDiff::default());
        assert_eq!(c.changed.len(), 9);
        assert_eq!(c.counts, SlotCounts { capacity: 16, live: 9, claiming: 1, tombstones: 0 });
    }

    #[test]
    fn changes_report_new_moved_and_vanished_flows_only() {
        let t = SlotTable::in_memory(vec![FlowSlot::default(); 16], 3);
        let mut diff = SlotDiff::default();
        let i1 = insert(&t, key(1), 1);
        let i2 = insert(&t, key(2), 1);
        let c = t.changes(&mut diff);
        assert_eq!((c.changed.len(), c.vanished.len(), c.counts.live), (2, 0, 2));
        // Moved last poll: read once more, reported again only for what was stored after the
        // first copy (key(2)'s bytes, added after its `packets`), then quiet.
        let mut s2 = t.read(i2);
        s2.stats.bytes += 100;
        t.write(i2, s2);
        let c = t.changes(&mut diff);
        assert_eq!(c.changed.iter().map(|(k, s)| (k.src_port, s.bytes)).collect::<Vec<_>>(), vec![(2, 100)]);
        let c = t.changes(&mut diff);
        assert_eq!((c.changed.len(), c.vanished.len()), (0, 0));
        // key(1) gets a packet; key(2) is evicted and its slot reused by key(3).
        let mut s1 = t.read(i1);
        s1.stats.packets += 1;
        t.write(i1, s1);
        assert!(t.evict(&key(2)));
        let i3 = insert(&t, key(3), 1);
        let c = t.changes(&mut diff);
        let mut changed: Vec<u16> = c.changed.iter().map(|(k, _)| k.src_port).collect();
        changed.sort();
        assert_eq!(c.vanished, vec![key(2)]);
        assert_eq!(changed, vec![1, 3], "key(3) took slot {i3} (key(2) had {i2})");
        assert_eq!(c.counts.live, 2);
    }

    #[test]
    fn evict_tombstones_the_flow_and_others_stay_findable() {
        let t = SlotTable::in_memory(vec![FlowSlot::default(); 16], 0);
        for p in 0..12 {
            insert(&t, key(p), 1);
        }
        assert!(t.evict(&key(5)));
        assert!(!t.evict(&key(5)), "already gone");
        assert_eq!(t.find(&key(5)), None);
        for p in (0..12).filter(|&p| p != 5) {
            assert!(t.find(&key(p)).is_some(), "flow {p} still found past the tombstone");
        }
        // Its slot is a tombstone, or EMPTY again if an EMPTY followed it.
        let c = t.changes(&mut SlotDiff::default()).counts;
        assert_eq!((c.live, c.claiming), (11, 0));
        assert!(c.tombstones <= 1);
        // The program may reuse the tombstone; evicting the old key then changes nothing.
        let reused = insert(&t, key(100), 1);
        assert!(!t.evict(&key(5)));
        assert_eq!(t.find(&key(100)), Some(reused));
    }

    #[test]
    fn evict_removes_every_copy_of_a_flow_in_its_window() {
        let t = SlotTable::in_memory(vec![FlowSlot::default(); 16], 0);
        let first = insert(&t, key(1), 5);
        // The race in the module docs left a second copy further along the window.
        let second = insert(&t, key(1), 1);
        assert_ne!(first, second);
        assert!(t.evict(&key(1)));
        // Tombstones, or EMPTY again where the run they end reaches an EMPTY.
        for i in [first, second] {
            assert_ne!(t.state(i) & slot_state::TAG_MASK, slot_state::LIVE);
        }
        assert_eq!(t.find(&key(1)), None);
    }

    #[test]
    fn a_slot_changed_between_the_key_check_and_the_cas_is_left_alone() {
        let t = SlotTable::in_memory(vec![FlowSlot::default(); 16], 0);
        let i = insert(&t, key(1), 1);
        // The program never moves a LIVE slot, so only another writer (a second agent) can do
        // this; the CAS must still refuse it. The hook runs after the key check passed.
        let other = slot_state::with_fp(slot_state::LIVE, !flow_hash(&key(1), 0));
        let mut reached = false;
        let evicted = t.evict_with(&key(1), &mut |t, j| {
            assert_eq!(j, i);
            t.set_state(j, other);
            reached = true;
        });
        assert!(reached, "the CAS was reached");
        assert!(!evicted);
        assert_eq!(t.state(i), other);
    }

    const T: u64 = slot_state::TOMBSTONE;
    const E: u64 = slot_state::EMPTY;

    fn states(t: &SlotTable) -> Vec<u64> {
        (0..t.len()).map(|i| t.state(i)).collect()
    }

    #[test]
    fn a_tombstone_run_is_emptied_only_when_an_empty_follows_it() {
        let t = SlotTable::in_memory(vec![FlowSlot::default(); 16], 0);
        let live = slot_state::with_fp(slot_state::LIVE, 42 << 32);
        for (i, st) in [(2, T), (3, T), (4, T), (5, live), (6, T), (15, T), (0, T)] {
            t.set_state(i, st);
        }
        // 2..=4 end at a live slot: a flow at 5 may have its home in the run.
        assert_eq!(t.reclaim(3), 0);
        assert_eq!(&states(&t)[2..7], &[T, T, T, live, T]);
        // 6 ends at the EMPTY 7.
        assert_eq!(t.reclaim(6), 1);
        assert_eq!(t.state(6), E);
        // 5 evicted: 2..=5 now end at the EMPTY 6 and all go, from the end backwards.
        t.set_state(5, T);
        assert_eq!(t.reclaim(4), 4);
        // Across the wrap: 15 and 0 end at the EMPTY 1.
        assert_eq!(t.reclaim(15), 2);
        assert!(states(&t).iter().all(|&s| s == E));
        // Not a tombstone: nothing to do.
        assert_eq!(t.reclaim(9), 0);
    }

    #[test]
    fn evict_empties_the_run_its_slot_ends_and_leaves_one_a_live_flow_ends() {
        let t = SlotTable::in_memory(vec![FlowSlot::default(); 16], 0);
        let i = insert(&t, key(1), 1);
        let m = t.len() - 1;
        let (before, after) = (i.wrapping_sub(1) & m, (i + 1) & m);
        // An earlier eviction left a tombstone in front; the slot after is EMPTY.
        t.set_state(before, T);
        assert!(t.evict(&key(1)));
        assert_eq!((t.state(before), t.state(i), t.state(after)), (E, E, E));
        assert_eq!(t.changes(&mut SlotDiff::default()).counts, SlotCounts { capacity: 16, live: 0, claiming: 0, tombstones: 0 });
        // Again with a live flow after it (one that may have probed over this slot): the
        // tombstone stays, and that flow is still found.
        let i = insert(&t, key(1), 1);
        let (before, after) = (i.wrapping_sub(1) & m, (i + 1) & m);
        t.set_state(before, T);
        let live = slot_state::with_fp(slot_state::LIVE, 7 << 32);
        t.set_state(after, live);
        assert!(t.evict(&key(1)));
        assert_eq!((t.state(before), t.state(i), t.state(after)), (T, T, live));
    }

    #[test]
    fn a_slot_claimed_during_the_reclaim_walk_is_left_alone_and_ends_it() {
        let t = SlotTable::in_memory(vec![FlowSlot::default(); 16], 0);
        for i in 2..=5 {
            t.set_state(i, T);
        }
        let claiming = slot_state::with_fp(slot_state::CLAIMING, 9 << 32);
        let mut tried = Vec::new();
        let emptied = t.reclaim_with(2, &mut |t, j| {
            tried.push(j);
            if j == 4 {
                // The program claims slot 4 between the walk's check and its CAS.
                t.set_state(j, claiming);
            }
        });
        assert_eq!(tried, vec![5, 4], "from the run's end backwards, stopping at the failed CAS");
        assert_eq!(emptied, 1);
        assert_eq!(&states(&t)[1..7], &[E, T, T, claiming, E, E]);
    }
}
