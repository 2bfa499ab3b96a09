//! The agent's flow table: a pure function of successive map snapshots.
//!
//! The collector reads the kernel maps into a [`PollSnapshot`] (the only side effect) and hands it
//! to [`FlowTable::apply`], which takes each flow's counters as its totals, turns the growth since the
//! previous snapshot into rates and EWMAs, folds it into monotonic per-peer and per-interface
//! counters, records ended bursts, and decides which flows to forget. Nothing here touches the
//! kernel, so every rule is tested with hand-made snapshots.
//!
//! Invariants:
//! - Peer and interface counters only grow: they accumulate per-poll *deltas*, so a flow that is
//!   forgotten (idle or over capacity) keeps its contribution.
//! - A forgotten flow is also deleted from `FLOWS` (the caller deletes the keys `apply` returns); if
//!   it comes back, the kernel starts it from zero and only new packets are counted.
//! - A flow whose kernel counters went backwards (the LRU map evicted and re-created it) counts its
//!   new totals as the delta.
//! - Memory is bounded: at most `max_flows` flows, `max_peers` distinct peer addresses (the rest
//!   share `peer="other"`), and `burst_history` bursts per flow.
use std::{
    collections::{hash_map::Entry, HashMap, HashSet, VecDeque},
    net::{IpAddr, Ipv6Addr},
    time::Duration,
};

use dataplane_common::{direction, event_kind, flow_kind, stats, Event, FlowKey, FlowStats};

/// The hasher of the table's maps: every poll hashes each moved flow's 44-byte key several times
/// (flow, window delta, peer and interface), and SipHash (std's default) was a fifth of the agent's
/// CPU at 10k flows. foldhash (already in the tree through hashbrown) is seeded per map from the
/// process's random state, so keys an attacker picks cannot be aimed at fixed collisions; the maps
/// are bounded (`max_flows`, `max_peers`) whatever happens.
pub type FastState = foldhash::fast::RandomState;
/// A `HashMap` with [`FastState`].
pub type FastMap<K, V> = HashMap<K, V, FastState>;

/// Number of `STATS` entries.
pub const STATS_COUNT: usize = stats::COUNT as usize;

/// What one poll read from the kernel.
#[derive(Debug, Clone, Default)]
pub struct PollSnapshot {
    /// CLOCK_MONOTONIC when the maps were read (the clock of `bpf_ktime_get_ns`).
    pub mono_ns: u64,
    /// Every `FLOWS` entry (one value per flow, shared by all CPUs in the kernel).
    pub flows: Vec<(FlowKey, FlowStats)>,
    /// `STATS`, summed over CPUs.
    pub stats: [u64; STATS_COUNT],
    /// Records drained from `EVENTS` since the previous poll.
    pub events: Vec<Event>,
    /// How full the kernel's flow table is (`None` for sources without one).
    pub slots: Option<SlotCounts>,
    /// `false` (the default): `flows` is every flow in the kernel, and a flow of the table missing
    /// from it has left the kernel. `true`: `flows` holds only the flows that are new or whose
    /// counters moved since the previous poll, `vanished` the flows that left the kernel since
    /// then, and every other flow of the table is unchanged and still there. The collector reads
    /// `FLOWS` this way so that an idle flow costs no hash lookup per poll.
    pub partial: bool,
    /// With `partial`: flows gone from the kernel since the previous poll.
    pub vanished: Vec<FlowKey>,
}

/// `FLOWS`' slots by state (see `dataplane_common::slot_state`); the rest are empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotCounts {
    pub capacity: u64,
    pub live: u64,
    pub claiming: u64,
    pub tombstones: u64,
}

macro_rules! counters {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* $f:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
        pub struct $name { $($(#[$fm])* pub $f: u64),* }
        impl $name {
            /// Field-wise sum.
            pub fn add(&mut self, o: &Self) { $(self.$f = self.$f.wrapping_add(o.$f);)* }
            /// Field-wise growth since `prev`, or `None` if any counter went backwards.
            pub fn growth_since(&self, prev: &Self) -> Option<Self> {
                Some(Self { $($f: self.$f.checked_sub(prev.$f)?),* })
            }
            fn from_stats(s: &FlowStats) -> Self { Self { $($f: s.$f),* } }
        }
    };
}

counters! {
    /// The counter fields of `FlowStats` (timestamps, the open burst and the tracking words excluded).
    pub struct Counters {
        packets, bytes, payload_bytes, ce_marks,
        tcp_retrans, tcp_pure_acks, tcp_dsacks, tcp_ece, tcp_cwr, tcp_rst, tcp_fin, tcp_syn,
        roce_psn_gap_events, roce_psn_gap_packets, roce_psn_out_of_order, roce_naks, roce_cnps,
    }
}

/// A flow's totals as the kernel counted them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowTotals {
    pub counters: Counters,
    /// The flow's first packet (0 = never).
    pub first_seen_ns: u64,
    /// The flow's latest packet.
    pub last_seen_ns: u64,
}

impl FlowTotals {
    /// The counters and timestamps of one `FLOWS` entry; the open burst (`burst_*`) and the
    /// tracking words mean nothing outside the kernel and are ignored.
    pub fn from_value(v: &FlowStats) -> Self {
        FlowTotals { counters: Counters::from_stats(v), first_seen_ns: v.first_seen_ns, last_seen_ns: v.last_seen_ns }
    }
}

/// Per-second rate of `delta` over `dt_ns`; 0 when no time passed.
pub fn rate_per_sec(delta: u64, dt_ns: u64) -> f64 {
    if dt_ns == 0 {
        0.0
    } else {
        delta as f64 * 1e9 / dt_ns as f64
    }
}

/// Weight of a new sample in an EWMA with time constant `tau` after `dt` (irregular sampling:
/// `1 - e^(-dt/tau)`, so two 50 ms polls decay the average as much as one 100 ms poll).
pub fn ewma_alpha(dt_ns: u64, tau: Duration) -> f64 {
    let tau_ns = tau.as_nanos() as f64;
    if tau_ns <= 0.0 {
        return 1.0;
    }
    1.0 - (-(dt_ns as f64) / tau_ns).exp()
}

/// One EWMA step; the first sample seeds the average.
pub fn ewma_update(prev: Option<f64>, sample: f64, alpha: f64) -> f64 {
    match prev {
        None => sample,
        Some(p) => p + alpha * (sample - p),
    }
}

/// Rates of one flow.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Rates {
    /// Over the last poll interval.
    pub bytes_per_second: f64,
    pub packets_per_second: f64,
    /// Exponentially weighted (time constant `ewma_tau_ms`).
    pub ewma_bytes_per_second: f64,
    pub ewma_packets_per_second: f64,
    #[serde(skip)]
    seeded: bool,
}

impl Rates {
    /// `dt_ns` of polls in which the flow did not move: what [`Rates::update`] with no growth at
    /// each of those polls gives (the rates over an interval 0, the EWMAs decayed by
    /// `e^(-dt/tau)`: the product of each poll's `1 - alpha`), in one step.
    fn idle_for(&mut self, dt_ns: u64, tau: Duration) {
        if dt_ns == 0 {
            return;
        }
        let keep = 1.0 - ewma_alpha(dt_ns, tau);
        self.bytes_per_second = 0.0;
        self.packets_per_second = 0.0;
        self.ewma_bytes_per_second *= keep;
        self.ewma_packets_per_second *= keep;
    }

    /// One poll: `a` is [`ewma_alpha`] of `dt_ns`, the same for every flow of the poll.
    fn update(&mut self, delta: &Counters, dt_ns: u64, a: f64) {
        self.bytes_per_second = rate_per_sec(delta.bytes, dt_ns);
        self.packets_per_second = rate_per_sec(delta.packets, dt_ns);
        let prev = |v: f64| self.seeded.then_some(v);
        self.ewma_bytes_per_second = ewma_update(prev(self.ewma_bytes_per_second), self.bytes_per_second, a);
        self.ewma_packets_per_second = ewma_update(prev(self.ewma_packets_per_second), self.packets_per_second, a);
        self.seeded = true;
    }
}

/// One ended burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BurstRecord {
    /// `bpf_ktime_get_ns()` of its first packet.
    pub start_ns: u64,
    pub duration_ns: u64,
    pub bytes: u64,
    pub packets: u64,
}

/// A flow's bursts: lifetime sums and the most recent ones.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BurstHistory {
    pub count: u64,
    pub total_duration_ns: u64,
    pub total_bytes: u64,
    /// Newest last, at most `burst_history` entries.
    pub recent: VecDeque<BurstRecord>,
}

/// A flow in the agent's table.
#[derive(Debug, Clone)]
pub struct FlowEntry {
    pub key: FlowKey,
    pub totals: FlowTotals,
    pub rates: Rates,
    pub bursts: BurstHistory,
    /// Whether the flow is in the kernel's map as of the last snapshot.
    pub in_kernel: bool,
    /// The poll (`FlowTable`'s count) that last folded this flow's counters in.
    pub(crate) updated_poll: u64,
    /// CLOCK_MONOTONIC of that poll: `rates` are as of then. A flow that does not move is not
    /// touched by later polls; its rates are brought up to date when it moves again or is read
    /// ([`FlowTable::top_flows`]), with the same result as decaying them at every poll.
    pub(crate) rates_ns: u64,
    /// Where its growth in the detection window went: (`WindowAccumulator::id`, row of
    /// `deltas`); (0, 0) before it first moved in a window.
    pub(crate) window_row: (u64, u32),
}

impl FlowEntry {
    /// The remote end: the source of an ingress packet, the destination of an egress one.
    pub fn peer(&self) -> [u8; 16] {
        peer_of(&self.key)
    }
}

/// The remote end of a flow (see [`FlowEntry::peer`]).
pub fn peer_of(key: &FlowKey) -> [u8; 16] {
    if key.direction == direction::INGRESS {
        key.src_addr
    } else {
        key.dst_addr
    }
}

/// Sentinel peer address for peers beyond `max_peers` (rendered as `other`).
pub const OTHER_PEER: [u8; 16] = [0xff; 16];

/// Formats a 16-byte address: IPv4-mapped addresses as dotted quads.
pub fn format_addr(a: &[u8; 16]) -> String {
    if *a == OTHER_PEER {
        return "other".to_owned();
    }
    let v6 = Ipv6Addr::from(*a);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4).to_string(),
        None => v6.to_string(),
    }
}

/// `flow_kind` as a label value.
pub fn kind_name(kind: u8) -> &'static str {
    match kind {
        flow_kind::TCP => "tcp",
        flow_kind::UDP => "udp",
        flow_kind::ROCEV2 => "rocev2",
        _ => "unknown",
    }
}

/// `direction` as a label value.
pub fn direction_name(d: u8) -> &'static str {
    if d == direction::INGRESS {
        "ingress"
    } else {
        "egress"
    }
}

/// Key of the per-peer counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerKey {
    pub ifindex: u32,
    pub direction: u8,
    pub kind: u8,
    pub peer: [u8; 16],
}

/// Key of the per-interface counters and burst aggregates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InterfaceKey {
    pub ifindex: u32,
    pub direction: u8,
    pub kind: u8,
}

/// Upper bounds (seconds) of the burst-duration histogram buckets; the last bucket is +Inf.
pub const BURST_DURATION_BUCKETS: [f64; 8] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 1.0];

/// Bursts ended on one interface/direction/kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BurstAggregate {
    pub count: u64,
    pub bytes: u64,
    pub duration_sum_seconds: f64,
    /// Non-cumulative counts per `BURST_DURATION_BUCKETS` bucket, plus one for +Inf.
    pub buckets: [u64; BURST_DURATION_BUCKETS.len() + 1],
}

impl BurstAggregate {
    fn observe(&mut self, b: &BurstRecord) {
        let secs = b.duration_ns as f64 / 1e9;
        self.count += 1;
        self.bytes += b.bytes;
        self.duration_sum_seconds += secs;
        let i = BURST_DURATION_BUCKETS.iter().position(|ub| secs <= *ub).unwrap_or(BURST_DURATION_BUCKETS.len());
        self.buckets[i] += 1;
    }
}

/// Events received from the ring buffer, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EventCounts {
    pub flow_start: u64,
    pub burst_end: u64,
    pub map_full: u64,
    pub unknown: u64,
}

/// Flows forgotten by the agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evictions {
    pub idle: u64,
    pub capacity: u64,
}

/// Limits of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSettings {
    pub idle_timeout: Duration,
    pub max_flows: usize,
    pub max_peers: usize,
    pub burst_history: usize,
    pub ewma_tau: Duration,
}

impl Default for TableSettings {
    fn default() -> Self {
        use crate::config::*;
        TableSettings {
            idle_timeout: Duration::from_secs(DEFAULT_FLOW_IDLE_TIMEOUT_SECS),
            max_flows: DEFAULT_MAX_FLOWS,
            max_peers: DEFAULT_MAX_PEERS,
            burst_history: DEFAULT_BURST_HISTORY,
            ewma_tau: Duration::from_millis(DEFAULT_EWMA_TAU_MS),
        }
    }
}

/// The agent's view of all flows, peers and interfaces.
#[derive(Debug, Default)]
pub struct FlowTable {
    settings: TableSettings,
    flows: FastMap<FlowKey, FlowEntry>,
    /// Flows per interface index (a handful of interfaces), kept as flows come and go.
    per_interface: Vec<(u32, u64)>,
    peer_addrs: HashSet<[u8; 16], FastState>,
    peers: FastMap<PeerKey, Counters>,
    interfaces: FastMap<InterfaceKey, Counters>,
    bursts: FastMap<InterfaceKey, BurstAggregate>,
    dataplane: [u64; STATS_COUNT],
    slots: Option<SlotCounts>,
    events: EventCounts,
    evictions: Evictions,
    last_mono_ns: Option<u64>,
    /// When [`FlowTable::evict`] last looked for idle flows (it does so at most every
    /// [`IDLE_SCAN_EVERY`], not at every poll: a pass over every flow).
    last_idle_scan_ns: Option<u64>,
    /// Snapshots applied.
    polls: u64,
    /// Per-flow deltas and ended bursts since the last [`FlowTable::take_window`]; `None` until
    /// [`FlowTable::enable_windows`] (nothing drains them otherwise).
    window: Option<WindowAccumulator>,
    /// The next snapshot's counters were (partly) counted while a predecessor agent ran: see
    /// [`FlowTable::adopt_kernel_flows`].
    adopting: bool,
}

/// Longest time between two looks for idle flows (shorter when `idle_timeout` is: half of it): an
/// idle flow is forgotten at most this long after its timeout.
pub const IDLE_SCAN_EVERY: Duration = Duration::from_secs(1);

/// Most ended bursts held for one detection window; further ones are counted and dropped.
pub const MAX_WINDOW_BURSTS: usize = 65_536;

/// What happened between two [`FlowTable::take_window`] calls: the input of the detectors.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowAccumulator {
    /// CLOCK_MONOTONIC of the poll that started the window (the previous take, or the first poll).
    pub start_ns: Option<u64>,
    /// CLOCK_MONOTONIC of the last poll folded in.
    pub end_ns: u64,
    /// Counter growth per flow over the window, one row per flow in the order flows first moved
    /// in it (bounded by the flows seen in it, ≤ `FLOWS`' size). A flow forgotten and seen again
    /// within one window can have two rows: readers sum them. A row, not a map entry: each flow's
    /// entry remembers its row ([`FlowEntry::window_row`]), so a moved flow costs no second hash
    /// lookup per poll.
    pub deltas: Vec<(FlowKey, Counters)>,
    /// This window among those the table cut (1, 2, ...), so a row remembered from an earlier
    /// window is not taken for one of this window.
    id: u64,
    /// `BURST_END` events drained in the window, with their flow key.
    pub bursts: Vec<(FlowKey, BurstRecord)>,
    /// Bursts dropped because the window already held [`MAX_WINDOW_BURSTS`].
    pub bursts_dropped: u64,
}

impl WindowAccumulator {
    /// Adds `delta` to `key`'s row, `row` being where the flow's entry remembers it
    /// ([`FlowEntry::window_row`]): the same row again within this window, a new one otherwise.
    fn add(&mut self, key: &FlowKey, delta: &Counters, row: &mut (u64, u32)) {
        // The key check keeps a stale or default `row` from ever adding to another flow's row.
        if let Some((_, c)) = self.deltas.get_mut(row.1 as usize).filter(|(k, _)| row.0 == self.id && k == key) {
            c.add(delta);
        } else {
            *row = (self.id, self.deltas.len() as u32);
            self.deltas.push((*key, *delta));
        }
    }
}

impl FlowTable {
    pub fn new(settings: TableSettings) -> Self {
        FlowTable { settings, ..Default::default() }
    }

    /// The agent took over the maps of a previous agent: the next snapshot's flow totals go into
    /// the peer and interface counters whole (so those continue from the kernel's values instead
    /// of restarting from zero), but not into the detection window, because most of that traffic
    /// happened before this agent started and is not this window's.
    pub fn adopt_kernel_flows(&mut self) {
        self.adopting = true;
    }

    /// Folds one snapshot into the table. Returns the keys of flows the table forgot, which the
    /// caller deletes from `FLOWS` so a returning flow is counted from zero.
    pub fn apply(&mut self, snap: &PollSnapshot) -> Vec<FlowKey> {
        let prev_ns = self.last_mono_ns;
        let dt_ns = prev_ns.map(|t| snap.mono_ns.saturating_sub(t));
        self.last_mono_ns = Some(snap.mono_ns);
        let tau = self.settings.ewma_tau;
        self.dataplane = snap.stats;
        if snap.slots.is_some() {
            self.slots = snap.slots;
        }
        let adopting = std::mem::take(&mut self.adopting);
        // Every flow's EWMA decays by the same weight this poll: one exp() per poll, not per flow.
        let alpha = ewma_alpha(dt_ns.unwrap_or(0), self.settings.ewma_tau);

        self.polls += 1;
        let poll = self.polls;
        if snap.partial {
            for k in &snap.vanished {
                if let Some(e) = self.flows.get_mut(k) {
                    e.in_kernel = false;
                }
            }
        } else {
            // Every flow is in the snapshot: `in_kernel` is cleared in a plain pass and set again
            // by each flow's lookup, instead of collecting a set of the keys seen.
            for e in self.flows.values_mut() {
                e.in_kernel = false;
            }
        }
        for (key, value) in &snap.flows {
            let totals = FlowTotals::from_value(value);
            let (e, delta, new) = match self.flows.entry(*key) {
                Entry::Occupied(o) => {
                    let e = o.into_mut();
                    // Re-created by the kernel (LRU eviction) if it started later or any counter shrank.
                    let delta = if totals.first_seen_ns <= e.totals.first_seen_ns || e.totals.first_seen_ns == 0 {
                        totals.counters.growth_since(&e.totals.counters).unwrap_or(totals.counters)
                    } else {
                        totals.counters
                    };
                    e.totals = totals;
                    e.in_kernel = true;
                    e.updated_poll = poll;
                    // The polls it sat out since its rates were last updated, then this one.
                    if let Some(p) = prev_ns {
                        e.rates.idle_for(p.saturating_sub(e.rates_ns), tau);
                    }
                    e.rates.update(&delta, dt_ns.unwrap_or(0), alpha);
                    e.rates_ns = snap.mono_ns;
                    (e, delta, false)
                }
                Entry::Vacant(v) => {
                    match self.per_interface.iter_mut().find(|(i, _)| *i == key.ifindex) {
                        Some((_, n)) => *n += 1,
                        None => self.per_interface.push((key.ifindex, 1)),
                    }
                    let e = v.insert(FlowEntry {
                        key: *key,
                        totals,
                        rates: Rates::default(),
                        bursts: BurstHistory::default(),
                        in_kernel: true,
                        updated_poll: poll,
                        rates_ns: snap.mono_ns,
                        window_row: (0, 0),
                    });
                    // A new flow's first delta spans at most one interval: a lower bound of its rate.
                    e.rates.update(&totals.counters, dt_ns.unwrap_or(0), alpha);
                    (e, totals.counters, true)
                }
            };
            if let Some(w) = self.window.as_mut().filter(|_| !adopting && delta != Counters::default()) {
                w.add(key, &delta, &mut e.window_row);
            }
            // An idle flow adds nothing; a new one is accounted even with zero counters so that
            // its peer takes a label slot in the order flows appear.
            if new || delta != Counters::default() {
                self.account(key, &delta);
            }
        }
        // Flows this poll did not touch (gone, or unchanged in a partial snapshot) are left as
        // they are: their rates are 0 and their EWMAs decay from `rates_ns` on, which is applied
        // when they move again or are read (no pass over every flow at every poll).

        for ev in &snap.events {
            self.apply_event(ev);
        }
        if let Some(w) = &mut self.window {
            w.start_ns.get_or_insert(snap.mono_ns);
            w.end_ns = snap.mono_ns;
        }
        self.evict(snap.mono_ns)
    }

    /// Starts accumulating per-window deltas and bursts for the detectors (the agent calls it
    /// once when detection is on). The first window starts at the next applied snapshot.
    pub fn enable_windows(&mut self) {
        self.window.get_or_insert_with(|| WindowAccumulator { id: 1, ..Default::default() });
    }

    /// How much time the current window spans so far (0 when windows are off or no poll came).
    pub fn pending_window_ns(&self) -> u64 {
        self.window.as_ref().and_then(|w| w.start_ns.map(|s| w.end_ns.saturating_sub(s))).unwrap_or(0)
    }

    /// Returns what accumulated since the previous call and starts a new window at the last
    /// applied poll. `None` when windows are not enabled or no poll was applied since.
    pub fn take_window(&mut self) -> Option<WindowAccumulator> {
        let w = self.window.as_mut()?;
        let start = w.start_ns?;
        if w.end_ns <= start {
            return None;
        }
        // Sized like the window before: the rows are not grown again, copying, in every window.
        let deltas = Vec::with_capacity(w.deltas.len());
        let next = WindowAccumulator { start_ns: Some(w.end_ns), end_ns: w.end_ns, deltas, id: w.id + 1, ..Default::default() };
        Some(std::mem::replace(w, next))
    }

    fn account(&mut self, key: &FlowKey, delta: &Counters) {
        let mut peer = peer_of(key);
        if !self.peer_addrs.contains(&peer) {
            if self.peer_addrs.len() < self.settings.max_peers {
                self.peer_addrs.insert(peer);
            } else {
                peer = OTHER_PEER;
            }
        }
        let pk = PeerKey { ifindex: key.ifindex, direction: key.direction, kind: key.kind, peer };
        self.peers.entry(pk).or_default().add(delta);
        let ik = InterfaceKey { ifindex: key.ifindex, direction: key.direction, kind: key.kind };
        self.interfaces.entry(ik).or_default().add(delta);
    }

    fn apply_event(&mut self, ev: &Event) {
        match ev.kind {
            event_kind::FLOW_START => self.events.flow_start += 1,
            event_kind::MAP_FULL => self.events.map_full += 1,
            event_kind::BURST_END => {
                self.events.burst_end += 1;
                let rec = BurstRecord {
                    start_ns: ev.burst.start_ns,
                    duration_ns: ev.burst.last_ns.saturating_sub(ev.burst.start_ns),
                    bytes: ev.burst.bytes,
                    packets: ev.burst.packets,
                };
                let k = &ev.key;
                let ik = InterfaceKey { ifindex: k.ifindex, direction: k.direction, kind: k.kind };
                self.bursts.entry(ik).or_default().observe(&rec);
                if let Some(w) = &mut self.window {
                    if w.bursts.len() < MAX_WINDOW_BURSTS {
                        w.bursts.push((*k, rec));
                    } else {
                        w.bursts_dropped += 1;
                    }
                }
                if let Some(e) = self.flows.get_mut(k) {
                    let h = &mut e.bursts;
                    h.count += 1;
                    h.total_duration_ns += rec.duration_ns;
                    h.total_bytes += rec.bytes;
                    if h.recent.len() == self.settings.burst_history {
                        h.recent.pop_front();
                    }
                    h.recent.push_back(rec);
                }
            }
            _ => self.events.unknown += 1,
        }
    }

    /// Forgets idle flows and, past `max_flows`, the least recent ones; returns their keys (the
    /// collector evicts them from the kernel). A flow read with `last_seen_ns == 0` in this
    /// poll's snapshot was caught between its slot's claim and its first packet's stamp (a
    /// nanosecond window): it is neither idle nor the least recent, and is judged at a later
    /// poll, by which time the stamp is there (the collector reads a flow that moved once
    /// more at the next poll, and reports it again if the stamp or any counter landed since).
    /// One still unstamped after a poll that did not report it again is treated as idle since
    /// 0, so a slot that never got its stamp does not stay forever.
    /// Idle flows are looked for at most every [`IDLE_SCAN_EVERY`]; capacity is enforced at
    /// every poll.
    fn evict(&mut self, now_ns: u64) -> Vec<FlowKey> {
        let idle_ns = u64::try_from(self.settings.idle_timeout.as_nanos()).unwrap_or(u64::MAX);
        let poll = self.polls;
        let unstamped = |e: &FlowEntry| e.totals.last_seen_ns == 0 && e.updated_poll == poll;
        let scan_every = (IDLE_SCAN_EVERY.as_nanos() as u64).min(idle_ns / 2);
        let scan = self.last_idle_scan_ns.is_none_or(|t| now_ns.saturating_sub(t) >= scan_every);
        let mut gone: Vec<FlowKey> = Vec::new();
        if scan {
            self.last_idle_scan_ns = Some(now_ns);
            gone = self
                .flows
                .values()
                .filter(|e| !unstamped(e) && now_ns.saturating_sub(e.totals.last_seen_ns) > idle_ns)
                .map(|e| e.key)
                .collect();
        }
        self.evictions.idle += gone.len() as u64;
        for k in &gone {
            self.forget(k);
        }
        let excess = self.flows.len().saturating_sub(self.settings.max_flows);
        if excess > 0 {
            let mut by_age: Vec<(u64, FlowKey)> =
                self.flows.values().map(|e| (if unstamped(e) { u64::MAX } else { e.totals.last_seen_ns }, e.key)).collect();
            by_age.select_nth_unstable_by_key(excess - 1, |(t, k)| (*t, key_order(k)));
            for (_, k) in &by_age[..excess] {
                self.forget(k);
                gone.push(*k);
            }
            self.evictions.capacity += excess as u64;
        }
        gone
    }

    fn forget(&mut self, key: &FlowKey) {
        if self.flows.remove(key).is_some() {
            if let Some((_, n)) = self.per_interface.iter_mut().find(|(i, _)| *i == key.ifindex) {
                *n -= 1;
            }
        }
    }

    /// The `n` flows with the most bytes, largest first (ties broken by key, so output is stable).
    pub fn top_by_bytes(&self, n: usize) -> Vec<&FlowEntry> {
        let mut v: Vec<&FlowEntry> = self.flows.values().collect();
        let cmp = |a: &&FlowEntry, b: &&FlowEntry| {
            b.totals.counters.bytes.cmp(&a.totals.counters.bytes).then_with(|| key_order(&a.key).cmp(&key_order(&b.key)))
        };
        if n < v.len() {
            if n == 0 {
                return Vec::new();
            }
            v.select_nth_unstable_by(n - 1, cmp);
            v.truncate(n);
        }
        v.sort_unstable_by(cmp);
        v
    }

    /// Copies of the `n` flows with the most bytes ([`FlowTable::top_by_bytes`]), their rates as
    /// of the last poll.
    pub fn top_flows(&self, n: usize) -> Vec<FlowEntry> {
        self.top_by_bytes(n).into_iter().map(|e| self.current(e)).collect()
    }

    /// A copy of `e` with its rates brought up to the last poll.
    fn current(&self, e: &FlowEntry) -> FlowEntry {
        let mut c = e.clone();
        let now = self.last_mono_ns.unwrap_or(0);
        c.rates.idle_for(now.saturating_sub(c.rates_ns), self.settings.ewma_tau);
        c.rates_ns = c.rates_ns.max(now);
        c
    }

    pub fn len(&self) -> usize {
        self.flows.len()
    }
    /// A flow as [`FlowTable::top_flows`] would copy it.
    #[cfg(test)]
    pub fn get(&self, key: &FlowKey) -> Option<FlowEntry> {
        self.flows.get(key).map(|e| self.current(e))
    }
    /// Flows per interface index.
    pub fn flows_per_interface(&self) -> HashMap<u32, u64> {
        // Kept as flows are added and forgotten: no pass over the flows.
        self.per_interface.iter().filter(|(_, n)| *n > 0).copied().collect()
    }
    pub fn peers(&self) -> &FastMap<PeerKey, Counters> {
        &self.peers
    }
    pub fn interfaces(&self) -> &FastMap<InterfaceKey, Counters> {
        &self.interfaces
    }
    pub fn bursts(&self) -> &FastMap<InterfaceKey, BurstAggregate> {
        &self.bursts
    }
    /// The latest `STATS` values (summed over CPUs).
    pub fn dataplane_stats(&self) -> &[u64; STATS_COUNT] {
        &self.dataplane
    }
    pub fn events(&self) -> EventCounts {
        self.events
    }
    /// `FLOWS`' occupancy at the last poll that read it.
    pub fn slots(&self) -> Option<SlotCounts> {
        self.slots
    }
    pub fn evictions(&self) -> Evictions {
        self.evictions
    }
    /// CLOCK_MONOTONIC of the last applied snapshot (0 before the first).
    pub fn last_poll_mono_ns(&self) -> u64 {
        self.last_mono_ns.unwrap_or(0)
    }
}

/// A total order on keys for deterministic tie-breaking.
fn key_order(k: &FlowKey) -> ([u8; 16], [u8; 16], u16, u16, u32, u8, u8, u8) {
    (k.src_addr, k.dst_addr, k.src_port, k.dst_port, k.ifindex, k.protocol, k.direction, k.kind)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use dataplane_common::{ipv4_mapped, BurstState};

    pub fn key(src: u8, dst: u8, dport: u16, dir: u8, kind: u8) -> FlowKey {
        FlowKey {
            src_addr: ipv4_mapped([10, 77, 0, src]),
            dst_addr: ipv4_mapped([10, 77, 0, dst]),
            src_port: 40000,
            dst_port: dport,
            ifindex: 2,
            protocol: if kind == flow_kind::TCP { 6 } else { 17 },
            direction: dir,
            kind,
            _pad: 0,
        }
    }

    pub fn stats(packets: u64, bytes: u64, first: u64, last: u64) -> FlowStats {
        FlowStats { packets, bytes, first_seen_ns: first, last_seen_ns: last, ..Default::default() }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn totals_take_counters_and_timestamps_and_ignore_kernel_state() {
        let v = FlowStats {
            tcp_retrans: 2,
            roce_cnps: 1,
            roce_psn_gap_packets: 4,
            burst_start_ns: 600,
            burst_start_bytes: 1000,
            burst_start_packets: 7,
            tcp_seq_end: dataplane_common::track::VALID | 1000,
            roce_psn: dataplane_common::track::psn_word(5, 6, true),
            ..stats(10, 1500, 50, 900)
        };
        let t = FlowTotals::from_value(&v);
        assert_eq!(t.counters, Counters { packets: 10, bytes: 1500, tcp_retrans: 2, roce_cnps: 1, roce_psn_gap_packets: 4, ..Counters::default() });
        assert_eq!((t.first_seen_ns, t.last_seen_ns), (50, 900));
        assert_eq!(FlowTotals::from_value(&FlowStats::default()), FlowTotals::default());
    }

    #[test]
    fn rate_and_ewma_math() {
        assert_eq!(rate_per_sec(1_000, 100 * MS), 10_000.0);
        assert_eq!(rate_per_sec(5, 0), 0.0);
        let tau = Duration::from_secs(1);
        assert!((ewma_alpha(1_000_000_000, tau) - (1.0 - (-1.0f64).exp())).abs() < 1e-12);
        assert_eq!(ewma_alpha(0, tau), 0.0);
        // Two half steps equal one full step.
        let a_half = ewma_alpha(50 * MS, tau);
        let a_full = ewma_alpha(100 * MS, tau);
        let two = ewma_update(Some(ewma_update(Some(0.0), 100.0, a_half)), 100.0, a_half);
        let one = ewma_update(Some(0.0), 100.0, a_full);
        assert!((two - one).abs() < 1e-9, "{two} vs {one}");
        assert_eq!(ewma_update(None, 42.0, 0.1), 42.0);
        assert_eq!(ewma_update(Some(10.0), 20.0, 0.5), 15.0);
    }

    fn snap(mono_ns: u64, flows: Vec<(FlowKey, FlowStats)>) -> PollSnapshot {
        PollSnapshot { mono_ns, flows, ..Default::default() }
    }

    #[test]
    fn rates_from_successive_snapshots() {
        let k = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let mut t = FlowTable::new(TableSettings::default());
        t.apply(&snap(1000 * MS, vec![(k, stats(10, 10_000, 990 * MS, 999 * MS))]));
        t.apply(&snap(1100 * MS, vec![(k, stats(20, 110_000, 990 * MS, 1099 * MS))]));
        let e = t.get(&k).unwrap();
        assert_eq!(e.rates.bytes_per_second, 1_000_000.0);
        assert_eq!(e.rates.packets_per_second, 100.0);
        // First poll had no interval: the EWMA was seeded with 0 and moved towards 1 MB/s.
        let a = ewma_alpha(100 * MS, Duration::from_secs(1));
        assert!((e.rates.ewma_bytes_per_second - a * 1_000_000.0).abs() < 1e-6);
        // Missing from the next snapshot: instant rate 0, EWMA decays.
        t.apply(&snap(1200 * MS, vec![]));
        let e = t.get(&k).unwrap();
        assert_eq!(e.rates.bytes_per_second, 0.0);
        assert!(!e.in_kernel);
        assert!(e.rates.ewma_bytes_per_second < a * 1_000_000.0);
    }

    #[test]
    fn peer_and_interface_counters_accumulate_deltas() {
        let out = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let out2 = FlowKey { src_port: 40001, ..out };
        let inb = key(2, 1, 29500, direction::INGRESS, flow_kind::TCP);
        let mut t = FlowTable::new(TableSettings::default());
        t.apply(&snap(MS, vec![(out, stats(1, 100, 1, 1)), (out2, stats(2, 200, 1, 1))]));
        t.apply(&snap(
            2 * MS,
            vec![
                (out, FlowStats { tcp_retrans: 1, ..stats(3, 300, 1, 2 * MS) }),
                (out2, stats(2, 200, 1, 1)),
                (inb, stats(4, 400, 1, 2 * MS)),
            ],
        ));
        let peer2 = PeerKey { ifindex: 2, direction: direction::EGRESS, kind: flow_kind::TCP, peer: ipv4_mapped([10, 77, 0, 2]) };
        let c = t.peers()[&peer2];
        assert_eq!((c.packets, c.bytes, c.tcp_retrans), (5, 500, 1));
        // Ingress peer is the source.
        let peer_in = PeerKey { direction: direction::INGRESS, ..peer2 };
        assert_eq!(t.peers()[&peer_in].bytes, 400);
        let ik = InterfaceKey { ifindex: 2, direction: direction::EGRESS, kind: flow_kind::TCP };
        assert_eq!(t.interfaces()[&ik].bytes, 500);
    }

    #[test]
    fn unchanged_flows_stay_in_kernel_and_add_nothing() {
        let busy = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let idle = key(1, 3, 29500, direction::EGRESS, flow_kind::TCP);
        // A flow the kernel created but never counted yet still takes its peer's label slot.
        let empty = FlowKey { ifindex: 7, ..key(1, 4, 29500, direction::EGRESS, flow_kind::TCP) };
        let mut t = FlowTable::new(TableSettings { max_peers: 3, ..TableSettings::default() });
        t.enable_windows();
        t.apply(&snap(MS, vec![(busy, stats(1, 100, 1, MS)), (idle, stats(1, 100, 1, MS)), (empty, FlowStats::default())]));
        let empty_peer = PeerKey { ifindex: 7, direction: direction::EGRESS, kind: flow_kind::TCP, peer: ipv4_mapped([10, 77, 0, 4]) };
        assert_eq!(t.peers().get(&empty_peer), Some(&Counters::default()), "{:?}", t.peers());
        let _ = t.take_window();
        t.apply(&snap(2 * MS, vec![(busy, stats(2, 250, 1, 2 * MS)), (idle, stats(1, 100, 1, MS)), (empty, FlowStats::default())]));
        assert!([busy, idle, empty].iter().all(|k| t.get(k).unwrap().in_kernel));
        let ik = InterfaceKey { ifindex: 2, direction: direction::EGRESS, kind: flow_kind::TCP };
        assert_eq!((t.interfaces()[&ik].packets, t.interfaces()[&ik].bytes), (3, 350));
        assert_eq!(t.get(&idle).unwrap().rates.bytes_per_second, 0.0);
        // The first window still holds every flow's first counters; the next only what moved.
        assert_eq!(t.take_window().expect("a window").deltas.len(), 2);
        t.apply(&snap(3 * MS, vec![(busy, stats(3, 300, 1, 3 * MS)), (idle, stats(1, 100, 1, MS)), (empty, FlowStats::default())]));
        let w = t.take_window().expect("a window");
        assert_eq!(w.deltas.iter().map(|(k, _)| k).collect::<Vec<_>>(), vec![&busy], "only flows that moved");
        assert_eq!(t.flows_per_interface(), HashMap::from([(2, 2), (7, 1)]));
        t.apply(&snap(4 * MS, vec![(busy, stats(3, 300, 1, 3 * MS))]));
        assert!(t.get(&busy).unwrap().in_kernel && !t.get(&idle).unwrap().in_kernel && !t.get(&empty).unwrap().in_kernel);
    }

    #[test]
    fn partial_snapshots_fold_like_complete_ones() {
        let a = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let b = key(1, 3, 29500, direction::EGRESS, flow_kind::TCP);
        let c = key(2, 1, 29500, direction::INGRESS, flow_kind::TCP);
        // (complete list, changed flows, vanished) per poll.
        let polls: Vec<(u64, Vec<(FlowKey, FlowStats)>, Vec<(FlowKey, FlowStats)>, Vec<FlowKey>)> = vec![
            (MS, vec![(a, stats(1, 100, 1, MS)), (b, stats(2, 200, 1, MS))], vec![(a, stats(1, 100, 1, MS)), (b, stats(2, 200, 1, MS))], vec![]),
            // a moves, b idle, c new.
            (2 * MS, vec![(a, stats(3, 300, 1, 2 * MS)), (b, stats(2, 200, 1, MS)), (c, stats(1, 50, 2 * MS, 2 * MS))], vec![(a, stats(3, 300, 1, 2 * MS)), (c, stats(1, 50, 2 * MS, 2 * MS))], vec![]),
            // b leaves the kernel; nothing else moves.
            (3 * MS, vec![(a, stats(3, 300, 1, 2 * MS)), (c, stats(1, 50, 2 * MS, 2 * MS))], vec![], vec![b]),
            (4 * MS, vec![(a, stats(4, 400, 1, 4 * MS)), (c, stats(1, 50, 2 * MS, 2 * MS))], vec![(a, stats(4, 400, 1, 4 * MS))], vec![]),
        ];
        let mut full = FlowTable::new(TableSettings::default());
        let mut part = FlowTable::new(TableSettings::default());
        full.enable_windows();
        part.enable_windows();
        for (t, all, changed, vanished) in polls {
            full.apply(&snap(t, all));
            part.apply(&PollSnapshot { mono_ns: t, flows: changed, partial: true, vanished, ..Default::default() });
            assert_eq!(full.interfaces(), part.interfaces(), "at {t}");
            assert_eq!(full.peers(), part.peers(), "at {t}");
            for k in [a, b, c] {
                let (f, p) = (full.get(&k), part.get(&k));
                assert_eq!(f.as_ref().map(|e| (e.in_kernel, e.totals)), p.as_ref().map(|e| (e.in_kernel, e.totals)), "flow {k:?} at {t}");
                // The partial table decays an unmoved flow's EWMA in one step, the complete one
                // at every poll: equal up to rounding.
                if let (Some(f), Some(p)) = (f, p) {
                    let (f, p) = (f.rates, p.rates);
                    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(1.0);
                    assert!(
                        f.bytes_per_second == p.bytes_per_second
                            && f.packets_per_second == p.packets_per_second
                            && close(f.ewma_bytes_per_second, p.ewma_bytes_per_second)
                            && close(f.ewma_packets_per_second, p.ewma_packets_per_second),
                        "flow {k:?} at {t}: {f:?} vs {p:?}"
                    );
                }
            }
        }
        assert_eq!(full.take_window().map(|w| w.deltas), part.take_window().map(|w| w.deltas));
        assert!(!part.get(&b).unwrap().in_kernel && part.get(&c).unwrap().in_kernel);
    }

    #[test]
    fn a_window_has_one_row_per_flow_summed_over_its_polls() {
        let a = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let b = key(1, 3, 29500, direction::EGRESS, flow_kind::TCP);
        let mut t = FlowTable::new(TableSettings::default());
        t.enable_windows();
        t.apply(&snap(MS, vec![(a, stats(1, 100, 1, MS))]));
        t.apply(&snap(2 * MS, vec![(b, stats(1, 10, 1, 2 * MS)), (a, stats(3, 300, 1, 2 * MS))]));
        t.apply(&snap(3 * MS, vec![(b, stats(4, 40, 1, 3 * MS)), (a, stats(3, 300, 1, 2 * MS))]));
        let rows = |w: &WindowAccumulator| w.deltas.iter().map(|(k, c)| (k.dst_addr[15], c.packets, c.bytes)).collect::<Vec<_>>();
        let w = t.take_window().expect("a window");
        assert_eq!(rows(&w), vec![(2, 3, 300), (3, 4, 40)], "in the order flows first moved");
        // The next window starts empty: the rows remembered by the entries are the old window's.
        t.apply(&snap(4 * MS, vec![(b, stats(5, 50, 1, 4 * MS))]));
        t.apply(&snap(5 * MS, vec![(a, stats(4, 400, 1, 5 * MS)), (b, stats(6, 60, 1, 5 * MS))]));
        let w = t.take_window().expect("a window");
        assert_eq!(rows(&w), vec![(3, 2, 20), (2, 1, 100)]);
    }

    #[test]
    fn recreated_flow_counts_new_totals() {
        let k = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let mut t = FlowTable::new(TableSettings::default());
        t.apply(&snap(MS, vec![(k, stats(100, 10_000, 1, MS))]));
        // The kernel evicted and re-created it: fewer packets, later first_seen.
        t.apply(&snap(2 * MS, vec![(k, stats(3, 300, 2 * MS - 10, 2 * MS))]));
        let ik = InterfaceKey { ifindex: 2, direction: direction::EGRESS, kind: flow_kind::TCP };
        assert_eq!(t.interfaces()[&ik].bytes, 10_300);
        assert_eq!(t.interfaces()[&ik].packets, 103);
    }

    #[test]
    fn adopted_flows_continue_counters_but_stay_out_of_the_first_window() {
        let k = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let mut t = FlowTable::new(TableSettings::default());
        t.enable_windows();
        t.adopt_kernel_flows();
        // A predecessor counted 100 packets before this agent's first poll.
        t.apply(&snap(MS, vec![(k, stats(100, 10_000, 1, MS))]));
        let ik = InterfaceKey { ifindex: 2, direction: direction::EGRESS, kind: flow_kind::TCP };
        assert_eq!(t.interfaces()[&ik].packets, 100, "the interface counter continues from the kernel's value");
        t.apply(&snap(2 * MS, vec![(k, stats(103, 10_300, 1, 2 * MS))]));
        assert_eq!(t.interfaces()[&ik].packets, 103);
        let w = t.take_window().expect("a window over two polls");
        assert_eq!(w.deltas.iter().map(|(k, c)| (*k, c.packets)).collect::<Vec<_>>(), vec![(k, 3)], "only the growth seen by this agent is the window's traffic");
    }

    #[test]
    fn idle_flows_are_evicted_and_counters_kept() {
        let settings = TableSettings { idle_timeout: Duration::from_secs(1), ..Default::default() };
        let a = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let b = key(1, 3, 29500, direction::EGRESS, flow_kind::TCP);
        let mut t = FlowTable::new(settings);
        let s = 1_000 * MS;
        assert!(t.apply(&snap(s, vec![(a, stats(1, 100, s, s)), (b, stats(1, 100, s, s))])).is_empty());
        let gone = t.apply(&snap(
            s + 1_500 * MS,
            vec![(a, stats(1, 100, s, s)), (b, stats(2, 200, s, s + 1_400 * MS))],
        ));
        assert_eq!(gone, vec![a]);
        assert_eq!(t.len(), 1);
        assert_eq!(t.evictions().idle, 1);
        let ik = InterfaceKey { ifindex: 2, direction: direction::EGRESS, kind: flow_kind::TCP };
        assert_eq!(t.interfaces()[&ik].bytes, 300, "evicted flow keeps its contribution");
    }

    #[test]
    fn a_flow_read_before_its_first_stamp_is_not_evicted_at_once() {
        // A slot caught between its claim and its first packet's stamp: zeroed counters,
        // last_seen_ns 0. Far past the idle timeout measured from 0, yet not idle.
        let settings = TableSettings { idle_timeout: Duration::from_secs(1), max_flows: 1, ..Default::default() };
        let a = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        let b = key(1, 3, 29500, direction::EGRESS, flow_kind::TCP);
        let mut t = FlowTable::new(settings);
        let s = 100_000 * MS;
        let partial = |mono_ns, flows| PollSnapshot { mono_ns, flows, partial: true, ..Default::default() };
        // Over capacity too: the unstamped flow counts as the newest, so b (stamped) goes.
        let gone = t.apply(&partial(s, vec![(a, stats(0, 0, 0, 0)), (b, stats(1, 100, s - MS, s - MS))]));
        assert_eq!(gone, vec![b], "the unstamped flow is neither idle nor the least recent");
        assert_eq!((t.evictions().idle, t.evictions().capacity), (0, 1));
        // Re-read at the next poll, stamped now: an ordinary live flow.
        assert!(t.apply(&partial(s + 10 * MS, vec![(a, stats(1, 100, s + MS, s + MS))])).is_empty());
        assert_eq!(t.get(&a).map(|e| e.totals.last_seen_ns), Some(s + MS));
        // A flow that stays unstamped past a poll that did not re-read it is judged idle from 0.
        let c = key(1, 4, 29500, direction::EGRESS, flow_kind::TCP);
        let mut t = FlowTable::new(TableSettings { idle_timeout: Duration::from_secs(1), ..Default::default() });
        assert!(t.apply(&partial(s, vec![(c, stats(0, 0, 0, 0))])).is_empty());
        // Idle flows are looked for at most every IDLE_SCAN_EVERY (here half the 1 s timeout).
        assert!(t.apply(&partial(s + 10 * MS, vec![])).is_empty(), "no look for idle flows 10 ms after the last");
        assert_eq!(t.apply(&partial(s + 500 * MS, vec![])), vec![c]);
    }

    #[test]
    fn capacity_evicts_least_recent() {
        let settings = TableSettings { max_flows: 2, ..Default::default() };
        let mut t = FlowTable::new(settings);
        let keys: Vec<FlowKey> = (0..4).map(|i| key(1, 10 + i, 29500, direction::EGRESS, flow_kind::TCP)).collect();
        let flows = keys.iter().enumerate().map(|(i, k)| (*k, stats(1, 100, 1, 10 + i as u64))).collect();
        let mut gone = t.apply(&snap(100, flows));
        gone.sort_by_key(key_order);
        assert_eq!(gone, vec![keys[0], keys[1]]);
        assert_eq!(t.len(), 2);
        assert_eq!(t.evictions().capacity, 2);
    }

    #[test]
    fn peers_beyond_cap_share_other() {
        let settings = TableSettings { max_peers: 2, ..Default::default() };
        let mut t = FlowTable::new(settings);
        let flows = (0..5).map(|i| (key(1, 10 + i, 29500, direction::EGRESS, flow_kind::TCP), stats(1, 100, 1, 1))).collect();
        t.apply(&snap(1, flows));
        let distinct: HashSet<[u8; 16]> = t.peers().keys().map(|k| k.peer).collect();
        assert_eq!(distinct.len(), 3);
        let other: u64 = t.peers().iter().filter(|(k, _)| k.peer == OTHER_PEER).map(|(_, c)| c.bytes).sum();
        assert_eq!(other, 300);
        assert_eq!(format_addr(&OTHER_PEER), "other");
    }

    #[test]
    fn burst_end_events_build_bounded_history() {
        let settings = TableSettings { burst_history: 3, ..Default::default() };
        let k = key(1, 2, 4791, direction::EGRESS, flow_kind::ROCEV2);
        let mut t = FlowTable::new(settings);
        let events = (0..5u64)
            .map(|i| Event {
                kind: event_kind::BURST_END,
                key: k,
                burst: BurstState { start_ns: i * 10 * MS, last_ns: i * 10 * MS + 2 * MS, bytes: 1000 + i, packets: 1 },
                ..Default::default()
            })
            .chain([Event { kind: event_kind::FLOW_START, key: k, ..Default::default() }])
            .collect();
        t.apply(&PollSnapshot { mono_ns: 50 * MS, flows: vec![(k, stats(5, 5010, 1, 45 * MS))], events, ..Default::default() });
        let h = &t.get(&k).unwrap().bursts;
        assert_eq!(h.count, 5);
        assert_eq!(h.total_duration_ns, 10 * MS);
        assert_eq!(h.recent.len(), 3);
        assert_eq!(h.recent.front().unwrap().bytes, 1002);
        assert_eq!(h.recent.back().unwrap().bytes, 1004);
        let agg = &t.bursts()[&InterfaceKey { ifindex: 2, direction: direction::EGRESS, kind: flow_kind::ROCEV2 }];
        assert_eq!(agg.count, 5);
        // 2 ms falls in the (1 ms, 5 ms] bucket.
        assert_eq!(agg.buckets[3], 5);
        assert_eq!(t.events(), EventCounts { flow_start: 1, burst_end: 5, map_full: 0, unknown: 0 });
    }

    #[test]
    fn top_n_by_bytes() {
        let mut t = FlowTable::new(TableSettings::default());
        let flows = (0..50u64)
            .map(|i| (key(1, i as u8, 29500, direction::EGRESS, flow_kind::TCP), stats(1, (i * 37) % 50 * 100, 1, 1)))
            .collect();
        t.apply(&snap(1, flows));
        let top = t.top_by_bytes(5);
        let bytes: Vec<u64> = top.iter().map(|e| e.totals.counters.bytes).collect();
        assert_eq!(bytes, vec![4900, 4800, 4700, 4600, 4500]);
        assert_eq!(t.top_by_bytes(0).len(), 0);
        assert_eq!(t.top_by_bytes(500).len(), 50);
        let all: Vec<u64> = t.top_by_bytes(500).iter().map(|e| e.totals.counters.bytes).collect();
        assert!(all.windows(2).all(|w| w[0] >= w[1]));
    }

    #[test]
    fn addresses_format() {
        assert_eq!(format_addr(&ipv4_mapped([10, 77, 0, 1])), "10.77.0.1");
        let mut v6 = [0u8; 16];
        v6[0] = 0xfd;
        v6[15] = 1;
        assert_eq!(format_addr(&v6), "fd00::1");
    }
}
