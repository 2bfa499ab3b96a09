//! The collector stage: every poll interval, read the kernel maps into a [`PollSnapshot`], fold it
//! into the [`FlowTable`] it owns, delete the flows the table forgot, cut a detection window when
//! one is due and hand it to the analysis stage, and publish a [`CollectorSnapshot`].
//!
//! This is the only code that reads maps, and [`Collector`] is the only owner of the flow table:
//! nobody else locks or reads it. It runs on its own thread so a slow syscall never delays an HTTP
//! response. Its two outputs never block it:
//! - windows go to the analysis stage over a bounded `std::sync::mpsc::sync_channel` of
//!   [`WINDOW_QUEUE`] windows; when the queue is full (analysis is that far behind) the new window
//!   is dropped and counted (`ringside_detect_windows_dropped_total`), the poll loop never waits;
//! - the snapshot is swapped into a `tokio::sync::watch` channel (`send_replace`: a pointer swap
//!   under the channel's short lock), which the API and `/metrics` read without waiting for a poll.
//!
//! The data path is never blocked: map reads are lookups, and `EVENTS` is drained without waiting.
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{sync_channel, Receiver, SyncSender, TrySendError},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use aya::maps::{Map, MapData, MapError, PerCpuArray, RingBuf};
use dataplane_common::{maps, Event, FlowKey};
use tokio::sync::watch;
use zerocopy::FromBytes as _;

use crate::flow_slots::{SlotDiff, SlotTable};
use crate::flow_table::{
    BurstAggregate, Counters, EventCounts, Evictions, FlowEntry, FlowTable, InterfaceKey, PeerKey, PollSnapshot, SlotCounts, TableSettings,
    WindowAccumulator, STATS_COUNT,
};

/// Most flows a [`CollectorSnapshot`] carries (the largest by bytes): the most `/v1/flows` lists.
pub const TOP_FLOWS: usize = 1000;

/// After a reader asks for the top flows ([`FlowsDemand::request`]), the collector selects them
/// again at every poll for this long; then it stops until the next request. Selecting and copying
/// the top [`TOP_FLOWS`] of 10,000 flows was a fifth of the agent's CPU when done every poll.
pub const TOP_FLOWS_DEMAND: Duration = Duration::from_secs(5);

/// The readers' side of the top flows: the mono time of the latest request (0 = none). Shared by
/// the collector and every snapshot it publishes.
#[derive(Debug, Clone, Default)]
pub struct FlowsDemand(Arc<AtomicU64>);

impl FlowsDemand {
    /// A reader wants the top flows: the next polls select them (see [`TOP_FLOWS_DEMAND`]).
    pub fn request(&self) {
        self.0.store(crate::clock::monotonic_ns().max(1), Ordering::Relaxed);
    }

    fn active(&self, now_ns: u64) -> bool {
        let t = self.0.load(Ordering::Relaxed);
        t != 0 && now_ns.saturating_sub(t) < TOP_FLOWS_DEMAND.as_nanos() as u64
    }
}

/// Detection windows queued between the collector and the analysis stage (four windows: seconds
/// of slack at the default 1 s window). A full queue drops the newest window and counts it.
pub const WINDOW_QUEUE: usize = 4;

/// Upper bounds (seconds) of the poll-duration histogram buckets; the last bucket is +Inf.
pub const POLL_DURATION_BUCKETS: [f64; 8] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1];

/// Durations of the collector's polls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PollTimes {
    pub count: u64,
    pub sum_seconds: f64,
    /// Non-cumulative counts per `POLL_DURATION_BUCKETS` bucket, plus one for +Inf.
    pub buckets: [u64; POLL_DURATION_BUCKETS.len() + 1],
}

impl PollTimes {
    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        self.count += 1;
        self.sum_seconds += s;
        let i = POLL_DURATION_BUCKETS.iter().position(|ub| s <= *ub).unwrap_or(POLL_DURATION_BUCKETS.len());
        self.buckets[i] += 1;
    }
}

/// How the polls went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PollRecord {
    /// Successful polls.
    pub polls: u64,
    pub errors: u64,
    /// The last poll's error; `None` once a poll succeeds again.
    pub last_error: Option<String>,
    /// When the last successful poll finished.
    pub last_poll: Option<Instant>,
    pub last_poll_unix_seconds: f64,
    pub times: PollTimes,
}

impl PollRecord {
    fn succeeded(&mut self, took: Duration) {
        self.polls += 1;
        self.last_poll = Some(Instant::now());
        self.last_poll_unix_seconds = crate::clock::unix_seconds();
        self.times.observe(took);
        self.last_error = None;
    }

    /// Time since the last successful poll.
    pub fn age(&self) -> Option<Duration> {
        self.last_poll.map(|t| t.elapsed())
    }
}

/// What the collector publishes after every poll: the parts of the flow table that the API and
/// `/metrics` read, copied out (aggregates are bounded by `max_peers` and the interfaces; flows by
/// [`TOP_FLOWS`]), and how the polls went.
#[derive(Debug, Clone, Default)]
pub struct CollectorSnapshot {
    /// The latest `STATS` values (summed over CPUs).
    pub dataplane: [u64; STATS_COUNT],
    /// `FLOWS`' occupancy at the last poll.
    pub slots: Option<SlotCounts>,
    pub flows_tracked: usize,
    pub flows_per_interface: HashMap<u32, u64>,
    /// Sorted by key.
    pub peers: Vec<(PeerKey, Counters)>,
    /// Sorted by key.
    pub interfaces: Vec<(InterfaceKey, Counters)>,
    /// Sorted by key.
    pub bursts: Vec<(InterfaceKey, BurstAggregate)>,
    pub events: EventCounts,
    pub evictions: Evictions,
    /// The [`TOP_FLOWS`] flows with the most bytes, largest first, as of poll `top_flows_poll`:
    /// selected at the first poll and then only while readers ask for them ([`FlowsDemand`]), so
    /// they can be older than the rest of the snapshot; [`crate::view::AgentView::fresh_top_flows`]
    /// asks and waits for a list of the latest poll.
    pub top_flows: Arc<[FlowEntry]>,
    /// The poll (`poll.polls`) `top_flows` was selected at.
    pub top_flows_poll: u64,
    /// Where readers ask for the top flows.
    pub flows_demand: FlowsDemand,
    /// CLOCK_MONOTONIC of the last applied poll (0 before the first).
    pub last_poll_mono_ns: u64,
    pub poll: PollRecord,
    /// Detection windows dropped because the analysis stage's queue was full.
    pub windows_dropped: u64,
}

impl CollectorSnapshot {
    fn of(table: &FlowTable, poll: &PollRecord, windows_dropped: u64, top: &TopFlows) -> Self {
        fn sorted<K: Ord + Copy, V: Clone, S>(m: &HashMap<K, V, S>) -> Vec<(K, V)> {
            let mut v: Vec<(K, V)> = m.iter().map(|(k, v)| (*k, v.clone())).collect();
            v.sort_by_key(|(k, _)| *k);
            v
        }
        CollectorSnapshot {
            dataplane: *table.dataplane_stats(),
            slots: table.slots(),
            flows_tracked: table.len(),
            flows_per_interface: table.flows_per_interface(),
            peers: sorted(table.peers()),
            interfaces: sorted(table.interfaces()),
            bursts: sorted(table.bursts()),
            events: table.events(),
            evictions: table.evictions(),
            top_flows: top.flows.clone(),
            top_flows_poll: top.poll,
            flows_demand: top.demand.clone(),
            last_poll_mono_ns: table.last_poll_mono_ns(),
            poll: poll.clone(),
            windows_dropped,
        }
    }
}

/// Where due windows go.
struct WindowFeed {
    tx: SyncSender<WindowAccumulator>,
    /// A window is due once it spans 90 % of `detect.window_ms` (polls do not land exactly on it).
    min_ns: u64,
}

/// The top flows as last selected, and the readers' demand for them.
#[derive(Debug, Default)]
struct TopFlows {
    flows: Arc<[FlowEntry]>,
    /// The poll they were selected at (0 = never).
    poll: u64,
    demand: FlowsDemand,
}

/// The collector stage's state: the flow table, the poll record and its two outputs.
pub struct Collector {
    table: FlowTable,
    poll: PollRecord,
    feed: Option<WindowFeed>,
    windows_dropped: u64,
    top: TopFlows,
    published: watch::Sender<Arc<CollectorSnapshot>>,
}

impl Collector {
    /// A collector over an empty table, and the receiver of its snapshots (an empty snapshot until
    /// the first poll).
    pub fn new(settings: TableSettings) -> (Self, watch::Receiver<Arc<CollectorSnapshot>>) {
        let top = TopFlows::default();
        let (published, rx) = watch::channel(Arc::new(CollectorSnapshot { flows_demand: top.demand.clone(), ..Default::default() }));
        (Collector { table: FlowTable::new(settings), poll: PollRecord::default(), feed: None, windows_dropped: 0, top, published }, rx)
    }

    /// Starts cutting detection windows of `window` (the first starts at the next poll) and
    /// returns the analysis stage's end of the bounded window queue.
    pub fn feed_windows(&mut self, window: Duration) -> Receiver<WindowAccumulator> {
        self.table.enable_windows();
        let (tx, rx) = sync_channel(WINDOW_QUEUE);
        self.feed = Some(WindowFeed { tx, min_ns: (window.as_nanos() as u64) * 9 / 10 });
        rx
    }

    /// The maps were taken over from a previous agent (see [`FlowTable::adopt_kernel_flows`]).
    pub fn adopt_kernel_flows(&mut self) {
        self.table.adopt_kernel_flows();
    }

    /// Folds one poll into the table; returns the flows to delete from `FLOWS`.
    pub fn fold(&mut self, snap: &PollSnapshot) -> Vec<FlowKey> {
        self.table.apply(snap)
    }

    /// Ends a successful poll that took `took`: records it, hands a due window to the analysis
    /// stage and publishes the snapshot.
    pub fn poll_done(&mut self, took: Duration) {
        self.poll.succeeded(took);
        self.feed_window();
        self.publish();
    }

    /// Records a failed poll and publishes it (readiness reports the error).
    pub fn poll_failed(&mut self, message: String) {
        self.poll.errors += 1;
        self.poll.last_error = Some(message);
        self.publish();
    }

    pub fn polls(&self) -> u64 {
        self.poll.polls
    }

    fn feed_window(&mut self) {
        let Some(feed) = &self.feed else { return };
        if self.table.pending_window_ns() < feed.min_ns {
            return;
        }
        let Some(window) = self.table.take_window() else { return };
        match feed.tx.try_send(window) {
            Ok(()) => {}
            // Never wait for the analysis stage: the poll loop must keep draining the ring buffer.
            Err(TrySendError::Full(_)) => {
                self.windows_dropped += 1;
                tracing::warn!(dropped = self.windows_dropped, "detection is {WINDOW_QUEUE} windows behind: a window was dropped");
            }
            Err(TrySendError::Disconnected(_)) => {
                tracing::warn!("the analysis stage stopped: no more detection windows are cut");
                self.feed = None;
            }
        }
    }

    fn publish(&mut self) {
        if self.poll.polls > self.top.poll && (self.top.poll == 0 || self.top.demand.active(crate::clock::monotonic_ns())) {
            self.top.flows = self.table.top_flows(TOP_FLOWS).into();
            self.top.poll = self.poll.polls;
        }
        self.published.send_replace(Arc::new(CollectorSnapshot::of(&self.table, &self.poll, self.windows_dropped, &self.top)));
    }
}

/// Errors reading the maps.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("map `{name}` has an unexpected type or layout: {source}; the agent and the eBPF object are from different builds, rebuild with `cargo xtask build`")]
    MapType { name: &'static str, source: MapError },
    #[error("reading map `{name}` failed: {source}")]
    Read { name: &'static str, source: MapError },
    #[error("mapping `{name}` into memory failed: {source}; the kernel must be 5.5 or newer (BPF_F_MMAPABLE arrays) and the agent needs CAP_BPF")]
    Mmap { name: &'static str, source: std::io::Error },
}

/// The maps the collector reads, taken out of the loaded object.
pub struct KernelMaps {
    /// `FLOWS`, mapped into this process (see [`crate::flow_slots`]): a poll reads it in place.
    flows: SlotTable,
    /// The previous poll's view of `FLOWS`: polls report only what changed.
    diff: SlotDiff,
    /// Keeps the map (and so the mapping's object) open as long as the mapping is used.
    _flows_map: MapData,
    stats: PerCpuArray<MapData, u64>,
    events: RingBuf<MapData>,
}

impl KernelMaps {
    /// `hash_seed`: `Config::hash_seed` of these maps (`Attachment::hash_seed`).
    pub fn new(flows: Map, stats: Map, events: Map, hash_seed: u32) -> Result<Self, CollectError> {
        use std::os::fd::AsFd as _;
        let Map::Array(data) = flows else {
            return Err(CollectError::MapType { name: maps::FLOWS, source: MapError::InvalidMapType { map_type: 0 } });
        };
        let slots = data.info().map_err(|source| CollectError::Read { name: maps::FLOWS, source })?.max_entries();
        let table = SlotTable::map(data.fd().as_fd(), slots, hash_seed).map_err(|source| CollectError::Mmap { name: maps::FLOWS, source })?;
        Ok(KernelMaps {
            flows: table,
            diff: SlotDiff::default(),
            _flows_map: data,
            stats: PerCpuArray::try_from(stats).map_err(|source| CollectError::MapType { name: maps::STATS, source })?,
            events: RingBuf::try_from(events).map_err(|source| CollectError::MapType { name: maps::EVENTS, source })?,
        })
    }

    /// Reads everything into a snapshot: `FLOWS` by walking the mapped slots (no syscall; only
    /// new, moved and vanished flows are reported, see `PollSnapshot::partial`),
    /// `STATS` with one lookup per index, `EVENTS` drained.
    pub fn snapshot(&mut self) -> Result<PollSnapshot, CollectError> {
        let mono_ns = crate::clock::monotonic_ns();
        let changes = self.flows.changes(&mut self.diff);
        let mut stats = [0u64; STATS_COUNT];
        for (i, slot) in stats.iter_mut().enumerate() {
            let per_cpu = self.stats.get(&(i as u32), 0).map_err(|source| CollectError::Read { name: maps::STATS, source })?;
            *slot = per_cpu.iter().copied().fold(0u64, u64::wrapping_add);
        }
        let mut events = Vec::new();
        while let Some(item) = self.events.next() {
            if let Some(ev) = decode_event(&item) {
                events.push(ev);
            }
        }
        Ok(PollSnapshot {
            mono_ns,
            flows: changes.changed,
            stats,
            events,
            slots: Some(changes.counts),
            partial: true,
            vanished: changes.vanished,
        })
    }

    /// Evicts forgotten flows from `FLOWS` (their slots become tombstones the program reuses; a
    /// flow already gone is fine).
    pub fn forget(&mut self, keys: &[FlowKey]) -> usize {
        keys.iter().filter(|k| self.flows.evict(k)).count()
    }
}

/// Decodes one ring-buffer record; records shorter than an `Event` are ignored. A copy, so any
/// alignment of the record is fine; `Event: FromBytes` makes every byte pattern a valid value.
pub fn decode_event(bytes: &[u8]) -> Option<Event> {
    Event::read_from_prefix(bytes).ok().map(|(event, _rest)| event)
}

/// Runs the poll loop on a thread until `stop` is set. Returns the thread's handle; the window
/// queue's sender is dropped with the collector when the thread ends. `mirror`: flows counted
/// from mirrored frames (`crate::mirror`), added to every poll as if the kernel held them.
pub fn spawn(
    mut maps: KernelMaps,
    mut collector: Collector,
    interval: Duration,
    stop: Arc<AtomicBool>,
    mirror: Option<crate::mirror::MirrorFeed>,
) -> thread::JoinHandle<()> {
    thread::Builder::new()
        .name("ringside-collector".into())
        .spawn(move || {
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                match maps.snapshot() {
                    Ok(mut snap) => {
                        if let Some(m) = &mirror {
                            m.merge_into(&mut snap);
                        }
                        let forget = collector.fold(&snap);
                        let deleted = if forget.is_empty() { 0 } else { maps.forget(&forget) };
                        if let (Some(m), false) = (&mirror, forget.is_empty()) {
                            m.forget(&forget);
                        }
                        let took = started.elapsed();
                        collector.poll_done(took);
                        if collector.polls() == 1 {
                            tracing::info!(flows = snap.flows.len(), took_us = took.as_micros() as u64, "first poll done");
                        }
                        if !forget.is_empty() {
                            tracing::debug!(forgotten = forget.len(), deleted, "flows forgotten");
                        }
                    }
                    Err(e) => {
                        tracing::warn!("poll failed: {e}");
                        collector.poll_failed(e.to_string());
                    }
                }
                next += interval;
                let now = Instant::now();
                if next < now {
                    // Overran: skip missed ticks rather than bursting to catch up.
                    next = now + interval;
                }
                // Sleep in small steps so a stop request is seen within 50 ms.
                while !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now >= next {
                        break;
                    }
                    thread::sleep((next - now).min(Duration::from_millis(50)));
                }
            }
        })
        .expect("spawning the collector thread")
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane_common::{event_kind, BurstState};

    #[test]
    fn decodes_events() {
        let ev = Event { kind: event_kind::BURST_END, burst: BurstState { start_ns: 1, last_ns: 2, bytes: 3, packets: 4 }, ..Default::default() };
        let mut bytes = vec![0u8; 1];
        bytes.extend_from_slice(zerocopy::IntoBytes::as_bytes(&ev));
        assert_eq!(decode_event(&bytes[1..]), Some(ev), "unaligned input");
        assert_eq!(decode_event(&bytes[1..50]), None);
    }

    fn second(t: u64) -> PollSnapshot {
        use crate::flow_table::tests::{key, stats};
        use dataplane_common::{direction, flow_kind};
        let k = key(1, 2, 29500, direction::EGRESS, flow_kind::TCP);
        PollSnapshot { mono_ns: t, flows: vec![(k, stats(t / 1_000_000, t / 1000, 1, t))], ..Default::default() }
    }

    #[test]
    fn top_flows_are_selected_at_the_first_poll_and_then_only_while_asked_for() {
        use crate::flow_table::tests::{key, stats};
        use dataplane_common::{direction, flow_kind};
        const MS: u64 = 1_000_000;
        let (a, b) = (key(1, 2, 29500, direction::EGRESS, flow_kind::TCP), key(1, 3, 29500, direction::EGRESS, flow_kind::TCP));
        let (mut c, snaps) = Collector::new(TableSettings::default());
        let poll = |c: &mut Collector, t: u64, flows: Vec<(FlowKey, dataplane_common::FlowStats)>| {
            c.fold(&PollSnapshot { mono_ns: t, flows, partial: true, ..Default::default() });
            c.poll_done(Duration::from_micros(100));
        };
        poll(&mut c, 100 * MS, vec![(a, stats(1, 100, 100 * MS, 100 * MS))]);
        let s = snaps.borrow().clone();
        assert_eq!((s.top_flows.len(), s.top_flows_poll, s.poll.polls), (1, 1, 1), "the first poll selects them");
        // No reader: b is tracked but the list stays as it was.
        poll(&mut c, 200 * MS, vec![(b, stats(1, 500, 200 * MS, 200 * MS))]);
        let s = snaps.borrow().clone();
        assert_eq!((s.flows_tracked, s.top_flows.len(), s.top_flows_poll), (2, 1, 1));
        // A reader asks (through any snapshot): the next poll selects them, largest first, with
        // rates as of that poll (b sent 500 bytes in its first 100 ms, then nothing for 100 ms:
        // rate 0 now, its EWMA decayed by e^(-0.1) with the default 1 s time constant).
        s.flows_demand.request();
        poll(&mut c, 300 * MS, vec![]);
        let s = snaps.borrow().clone();
        assert_eq!(s.top_flows_poll, 3);
        assert_eq!(s.top_flows.iter().map(|e| e.key).collect::<Vec<_>>(), vec![b, a]);
        let r = s.top_flows[0].rates;
        assert_eq!(r.bytes_per_second, 0.0);
        assert!((r.ewma_bytes_per_second - 5000.0 * (-0.1f64).exp()).abs() < 1e-6, "{r:?}");
    }

    #[test]
    fn publishes_every_poll_and_feeds_due_windows_without_blocking() {
        const S: u64 = 1_000_000_000;
        let (mut c, snaps) = Collector::new(TableSettings::default());
        assert_eq!(snaps.borrow().poll.polls, 0, "an empty snapshot before the first poll");
        let windows = c.feed_windows(Duration::from_secs(1));
        c.fold(&second(100 * S));
        c.poll_done(Duration::from_micros(300));
        assert!(windows.try_recv().is_err(), "no window spans 0.9 s yet");
        let snap = snaps.borrow().clone();
        assert_eq!((snap.poll.polls, snap.flows_tracked, snap.top_flows.len(), snap.last_poll_mono_ns), (1, 1, 1, 100 * S));
        assert!(snap.poll.age().is_some());
        // Nobody drains the queue: WINDOW_QUEUE windows wait, the next ones are dropped and counted.
        for i in 1..=(WINDOW_QUEUE as u64 + 2) {
            c.fold(&second((100 + i) * S));
            c.poll_done(Duration::from_micros(300));
        }
        assert_eq!(snaps.borrow().windows_dropped, 2);
        assert_eq!(snaps.borrow().poll.polls, WINDOW_QUEUE as u64 + 3);
        let w = windows.try_recv().expect("the first due window");
        assert_eq!((w.start_ns, w.end_ns), (Some(100 * S), 101 * S));
        assert_eq!(windows.try_iter().count(), WINDOW_QUEUE - 1);
        c.poll_failed("boom".into());
        let snap = snaps.borrow().clone();
        assert_eq!((snap.poll.errors, snap.poll.last_error.as_deref()), (1, Some("boom")));
    }
}
