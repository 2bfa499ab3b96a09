//! What the HTTP API and `/metrics` read: [`AgentView`], a cheap clone of handles to the stages'
//! published snapshots, the job catalog and the hint board. Nothing here is a stage's working
//! state: the collector owns the flow table, the analysis stage owns the event log, the detectors
//! and the policies, and each publishes an `Arc` snapshot into a `tokio::sync::watch` channel.
//!
//! Reading a snapshot clones an `Arc` under the channel's read lock (nanoseconds), so a handler
//! never waits for a poll or a detection window, and a stage never waits for a handler. The only
//! state the API writes (jobs and their tokens) lives in the catalog, behind its own mutex.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{atomic::AtomicUsize, Arc, MutexGuard},
    time::Duration,
};

use tokio::sync::watch;

use crate::{
    analysis::EventsSnapshot,
    collector::CollectorSnapshot,
    hint_board::HintBoard,
    jobs::{self, JobCatalog, SharedCatalog},
    loader::AttachedInterface,
};

/// What the agent attached to; fixed once the programs are attached.
#[derive(Debug, Clone, Default)]
pub struct AttachInfo {
    pub interfaces: Vec<AttachedInterface>,
    /// Interface names by index (for labels).
    pub ifnames: HashMap<u32, String>,
    /// The programs are attached to every interface.
    pub attached: bool,
    pub poll_interval: Duration,
    pub pin_dir: Option<PathBuf>,
}

impl AttachInfo {
    /// Attached to `interfaces`, with the maps pinned under `pin_dir`.
    pub fn attached(interfaces: Vec<AttachedInterface>, pin_dir: PathBuf, poll_interval: Duration) -> Self {
        let ifnames = interfaces.iter().map(|i| (i.ifindex, i.name.clone())).collect();
        AttachInfo { interfaces, ifnames, attached: true, poll_interval, pin_dir: Some(pin_dir) }
    }

    /// Label value for an interface index.
    pub fn ifname(&self, ifindex: u32) -> String {
        self.ifnames.get(&ifindex).cloned().unwrap_or_else(|| format!("if{ifindex}"))
    }

    /// The pin directory while the programs are attached (where the job catalog writes prefixes).
    pub fn live_pin_dir(&self) -> Option<&Path> {
        self.pin_dir.as_deref().filter(|_| self.attached)
    }
}

/// Longest a `/v1/flows` request waits for the collector to select the top flows at its next poll
/// (one poll interval in practice).
pub const FRESH_TOP_FLOWS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The API's state: read-only handles to what the stages publish, plus the catalog and the hint
/// board (each with its own short lock).
#[derive(Debug, Clone)]
pub struct AgentView {
    pub attach: Arc<AttachInfo>,
    collector: watch::Receiver<Arc<CollectorSnapshot>>,
    events: watch::Receiver<Arc<EventsSnapshot>>,
    pub catalog: SharedCatalog,
    pub hints: HintBoard,
    /// Open `/v1/jobs/{id}/hints/stream` responses (each holds a guard that decrements it).
    pub hint_streams: Arc<AtomicUsize>,
    /// The mirrored-frame ingest, when `[mirror]` is set (its counters for `/metrics`).
    pub mirror: Option<crate::mirror::MirrorFeed>,
}

impl AgentView {
    pub fn new(
        attach: AttachInfo,
        collector: watch::Receiver<Arc<CollectorSnapshot>>,
        events: watch::Receiver<Arc<EventsSnapshot>>,
        catalog: SharedCatalog,
        hints: HintBoard,
    ) -> Self {
        AgentView { attach: Arc::new(attach), collector, events, catalog, hints, hint_streams: Arc::new(AtomicUsize::new(0)), mirror: None }
    }

    /// The same view with the mirror ingest's handle.
    pub fn with_mirror(mut self, mirror: Option<crate::mirror::MirrorFeed>) -> Self {
        self.mirror = mirror;
        self
    }

    /// The collector's latest snapshot.
    pub fn collector(&self) -> Arc<CollectorSnapshot> {
        self.collector.borrow().clone()
    }

    /// The collector's latest snapshot with top flows of its latest poll: asks the collector for
    /// them ([`crate::collector::FlowsDemand`]) and, when the latest snapshot's are older, waits
    /// for the next poll's (at most [`FRESH_TOP_FLOWS_WAIT`]; past it, the older list is returned:
    /// a stuck collector shows in `/v1/status`, not as a hung request).
    pub async fn fresh_top_flows(&self) -> Arc<CollectorSnapshot> {
        let snap = self.collector();
        snap.flows_demand.request();
        if snap.top_flows_poll >= snap.poll.polls {
            return snap;
        }
        let mut rx = self.collector.clone();
        let after = snap.poll.polls;
        let fresh = tokio::time::timeout(FRESH_TOP_FLOWS_WAIT, async move {
            rx.wait_for(|s| s.top_flows_poll > after).await.map(|s| s.clone())
        })
        .await;
        match fresh {
            Ok(Ok(s)) => s,
            _ => self.collector(),
        }
    }

    /// The analysis stage's latest snapshot.
    pub fn events(&self) -> Arc<EventsSnapshot> {
        self.events.borrow().clone()
    }

    /// The job catalog, locked (keep it short; never across an `.await`).
    pub fn catalog(&self) -> MutexGuard<'_, JobCatalog> {
        jobs::lock(&self.catalog)
    }

    /// `Ok` when ready, else why not (for `/readyz`).
    pub fn readiness(&self) -> Result<(), String> {
        if !self.attach.attached {
            return Err("programs are not attached yet".to_owned());
        }
        let snap = self.collector();
        let Some(age) = snap.poll.age() else {
            return Err("no map poll has completed yet".to_owned());
        };
        // Stale if ten intervals (at least 5 s) passed without a successful poll.
        let limit = (self.attach.poll_interval * 10).max(Duration::from_secs(5));
        if age > limit {
            let why = snap.poll.last_error.as_deref().unwrap_or("the collector is stuck");
            return Err(format!("last successful poll was {:.1} s ago: {why}", age.as_secs_f64()));
        }
        Ok(())
    }

    /// Another handle on the analysis stage's snapshots (tests).
    #[cfg(test)]
    pub fn events_receiver(&self) -> watch::Receiver<Arc<EventsSnapshot>> {
        self.events.clone()
    }

    /// The same view with `events` as the analysis stage's snapshot (tests).
    #[cfg(test)]
    pub fn with_events(mut self, events: EventsSnapshot) -> Self {
        self.events = watch::channel(Arc::new(events)).1;
        self
    }
}
