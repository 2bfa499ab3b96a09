//! State shared by the collector (writer) and the HTTP API (readers).
//!
//! One `std::sync::RwLock`: the collector holds the write lock only while folding a snapshot that
//! was read from the kernel *before* taking it; handlers hold the read lock only while copying out
//! what they render, never across an `.await`.
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{atomic::AtomicUsize, Arc, RwLock},
    time::{Duration, Instant},
};

use crate::{
    loader::AttachedInterface,
    events::EventLog,
    hint_board::HintBoard,
    jobs::JobCatalog,
    flow_table::{FlowTable, TableSettings},
};

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

/// Everything the API reports.
#[derive(Debug)]
pub struct AgentState {
    pub table: FlowTable,
    pub interfaces: Vec<AttachedInterface>,
    /// Interface names by index (for labels).
    pub ifnames: HashMap<u32, String>,
    /// The programs are attached to every interface.
    pub attached: bool,
    pub poll_interval: Duration,
    pub pin_dir: Option<PathBuf>,
    pub polls: u64,
    pub poll_errors: u64,
    pub last_error: Option<String>,
    /// When the last successful poll finished.
    pub last_poll: Option<Instant>,
    pub last_poll_unix_seconds: f64,
    pub poll_times: PollTimes,
    /// Detection events (open, recently closed) and detection counters.
    pub events: EventLog,
    /// Names of the configured jobs.
    pub jobs: Vec<String>,
    /// Each registered job's current hint and insight (written by the policy, read by the API).
    pub hints: HintBoard,
    /// Config-file and registered jobs and the (hashed) operator and tenant tokens.
    pub catalog: JobCatalog,
    /// Open `/v1/jobs/{id}/hints/stream` responses (each holds a guard that decrements it).
    pub hint_streams: Arc<AtomicUsize>,
}

pub type SharedState = Arc<RwLock<AgentState>>;

impl AgentState {
    pub fn new(settings: TableSettings, poll_interval: Duration) -> Self {
        AgentState {
            table: FlowTable::new(settings),
            interfaces: Vec::new(),
            ifnames: HashMap::new(),
            attached: false,
            poll_interval,
            pin_dir: None,
            polls: 0,
            poll_errors: 0,
            last_error: None,
            last_poll: None,
            last_poll_unix_seconds: 0.0,
            poll_times: PollTimes::default(),
            events: EventLog::new(crate::config::DEFAULT_RECENT_EVENTS, crate::config::DEFAULT_CARRY_OVER_WINDOWS),
            jobs: Vec::new(),
            hints: HintBoard::default(),
            catalog: JobCatalog::default(),
            hint_streams: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn shared(self) -> SharedState {
        Arc::new(RwLock::new(self))
    }

    /// Records a successful poll that took `took` and finished now.
    pub fn record_poll(&mut self, took: Duration) {
        self.polls += 1;
        self.last_poll = Some(Instant::now());
        self.last_poll_unix_seconds = crate::clock::unix_seconds();
        self.poll_times.observe(took);
        self.last_error = None;
    }

    pub fn record_poll_error(&mut self, message: String) {
        self.poll_errors += 1;
        self.last_error = Some(message);
    }

    /// Label value for an interface index.
    pub fn ifname(&self, ifindex: u32) -> String {
        self.ifnames.get(&ifindex).cloned().unwrap_or_else(|| format!("if{ifindex}"))
    }

    /// Seconds since the last successful poll.
    pub fn poll_age(&self) -> Option<Duration> {
        self.last_poll.map(|t| t.elapsed())
    }

    /// `Ok` when ready, else why not (for `/readyz`).
    pub fn readiness(&self) -> Result<(), String> {
        if !self.attached {
            return Err("programs are not attached yet".to_owned());
        }
        let Some(age) = self.poll_age() else {
            return Err("no map poll has completed yet".to_owned());
        };
        // Stale if ten intervals (at least 5 s) passed without a successful poll.
        let limit = (self.poll_interval * 10).max(Duration::from_secs(5));
        if age > limit {
            let why = self.last_error.as_deref().unwrap_or("the collector is stuck");
            return Err(format!("last successful poll was {:.1} s ago: {why}", age.as_secs_f64()));
        }
        Ok(())
    }
}
