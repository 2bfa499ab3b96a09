//! The analysis stage, the detection loop: for every window the collector cuts (counter deltas and
//! bursts, see [`crate::flow_table::WindowAccumulator`]), build each job's
//! [`JobWindow`](crate::detect::JobWindow) ([`crate::jobs::windows`]) for the job set of the
//! [`JobCatalog`](crate::jobs::JobCatalog), run the detectors, fold their verdicts into the
//! [`EventLog`], persist the open events when they change, run each job's policy, and publish.
//!
//! [`Analysis`] owns the detectors, the event log, each job's policy and plan choice: nobody else
//! writes them. It runs on its own thread, fed by the collector's bounded window queue
//! ([`crate::collector::WINDOW_QUEUE`]), and per window takes one short lock of the catalog (to
//! read the job set) and one of the hint board (to publish hints and insights), then swaps an
//! [`EventsSnapshot`] into a `tokio::sync::watch` channel for the API and `/metrics`.
use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, RecvTimeoutError},
        Arc,
    },
    thread,
    time::Duration,
};

use crate::{
    config::{self, ConfigFile},
    detect::{DetectorConfig, DetectorSet, JobWindow, VerdictChange},
    clock::Clock,
    events::{self, EventLog},
    flow_table::WindowAccumulator,
    hint_board::{HintBoard, JobUpdate},
    jobs::{self, JobSet, SharedCatalog},
    queue_stats::{QueueReader, QueueSnapshot},
    rdma_counters::{self, RdmaPortReader, RdmaSnapshot},
    policy::{baseline_hint, JobContext, FIRST_VERSION, JobPolicies, PhaseParams, PlanChoice, PolicyConfig, VerdictSummary},
};
use ringside_client::{Constraints, Hint};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tokio::sync::watch;

/// Resolved detection settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectSettings {
    pub enabled: bool,
    pub window: Duration,
    pub recent_events: usize,
    pub carry_over_windows: u32,
    pub detectors: DetectorConfig,
    pub state_dir: PathBuf,
    /// `[policy]`.
    pub policy: PolicyConfig,
    /// `[rdma]`: read the RDMA port counters every window, and from where.
    pub rdma: Option<PathBuf>,
}

impl DetectSettings {
    /// Defaults, overridden by the file's `[detect]`, `[policy]` and `state_dir`.
    pub fn from_file(file: &ConfigFile) -> Self {
        let d = file.detect.clone().unwrap_or_default();
        let window = Duration::from_millis(d.window_ms.unwrap_or(config::DEFAULT_DETECT_WINDOW_MS));
        let mut detectors = DetectorConfig { window_ns: window.as_nanos() as u64, ..DetectorConfig::default() };
        if let Some(v) = d.min_window_bytes {
            detectors.min_window_bytes = v;
        }
        if let Some(v) = d.min_data_packets {
            detectors.min_data_packets = v;
        }
        if let Some(v) = d.persistence {
            detectors.persistence = v;
        }
        if let Some(v) = d.gray {
            detectors.gray = v;
        }
        if let Some(v) = d.congestion {
            detectors.congestion = v;
        }
        if let Some(v) = d.straggler {
            detectors.straggler = v;
        }
        DetectSettings {
            enabled: d.enabled.unwrap_or(true),
            window,
            recent_events: d.recent_events.unwrap_or(config::DEFAULT_RECENT_EVENTS),
            carry_over_windows: d.carry_over_windows.unwrap_or(config::DEFAULT_CARRY_OVER_WINDOWS),
            detectors,
            state_dir: file.state_dir.clone().unwrap_or_else(|| config::DEFAULT_STATE_DIR.into()),
            policy: file.policy.clone().unwrap_or_default(),
            // Read by the analysis stage, so only with detection on.
            rdma: {
                let r = file.rdma.clone().unwrap_or_default();
                (d.enabled.unwrap_or(true) && r.enabled.unwrap_or(true))
                    .then(|| r.counters_root.unwrap_or_else(|| rdma_counters::DEFAULT_COUNTERS_ROOT.into()))
            },
        }
    }
}

/// The event log to start with: the open events of the previous run carried over from the state
/// file. Never fails: a bad state file is logged and counted.
pub fn prepare(settings: &DetectSettings) -> EventLog {
    let mut log = EventLog::new(settings.recent_events, settings.carry_over_windows);
    match events::load(&settings.state_dir) {
        Ok(Some(saved)) => {
            tracing::info!(open = saved.open.len(), file = %events::state_path(&settings.state_dir).display(), "carrying over open events from the previous run");
            log.carry_over(saved);
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!("{e}");
            log.counters.state_load_errors += 1;
        }
    }
    log
}

/// What the analysis stage publishes after every window: the event log (open events, recently
/// closed ones, counters) and the names of the jobs of that window.
#[derive(Debug, Clone)]
pub struct EventsSnapshot {
    pub log: EventLog,
    pub jobs: Vec<String>,
    /// The RDMA port counters as of the window (`None`: `[rdma] enabled = false`).
    pub rdma: Option<RdmaSnapshot>,
    /// The attached interfaces' egress queue counters (`None` before the first window).
    pub queues: Option<QueueSnapshot>,
}

/// What the analysis stage owns: the detectors, the event log, each planned job's policy and the
/// hint it last published. Per window it reads the catalog's job set once and publishes once
/// (events, hints, insights); it reads a hint back from the board only once per job, the
/// baseline the catalog published when it onboarded the job (its first version).
pub struct Analysis {
    settings: DetectSettings,
    detectors: DetectorSet,
    policies: JobPolicies,
    /// The hint each policy last published (its baseline until its first change or renewal).
    published: BTreeMap<String, Hint>,
    log: EventLog,
    /// The job names of the last window (the config-file jobs before the first).
    jobs: Vec<String>,
    catalog: SharedCatalog,
    board: HintBoard,
    /// Interface names by index (for job-window labels).
    ifnames: HashMap<u32, String>,
    /// The RDMA port counters, read once per window (`[rdma]`): a second source of evidence,
    /// judged per port by the same detector set ([`DetectorSet::observe_ports`]).
    rdma: Option<RdmaPortReader>,
    /// The interfaces' egress queue counters, read once per window: the queue-drop evidence of
    /// the congestion detector (`crate::queue_stats`).
    queues: QueueReader,
    events: watch::Sender<Arc<EventsSnapshot>>,
}

impl Analysis {
    /// The stage, starting from `log` ([`prepare`]), and the receiver of its event snapshots
    /// (`log` itself until the first window).
    pub fn new(
        settings: DetectSettings,
        log: EventLog,
        catalog: SharedCatalog,
        board: HintBoard,
        ifnames: HashMap<u32, String>,
    ) -> (Self, watch::Receiver<Arc<EventsSnapshot>>) {
        let detectors = DetectorSet::new(settings.detectors.clone());
        let policies = JobPolicies::new(settings.policy.clone(), PhaseParams::from(&settings.detectors));
        let jobs = jobs::lock(&catalog).config_job_names();
        let rdma = settings.rdma.clone().map(RdmaPortReader::new);
        let snapshot = EventsSnapshot { log: log.clone(), jobs: jobs.clone(), rdma: rdma.as_ref().map(|r| r.snapshot().clone()), queues: None };
        let (events, rx) = watch::channel(Arc::new(snapshot));
        (Analysis { settings, detectors, policies, published: BTreeMap::new(), log, jobs, catalog, board, ifnames, rdma, queues: QueueReader::default(), events }, rx)
    }

    fn publish(&self) {
        let rdma = self.rdma.as_ref().map(|r| r.snapshot().clone());
        let queues = Some(self.queues.snapshot().clone());
        self.events.send_replace(Arc::new(EventsSnapshot { log: self.log.clone(), jobs: self.jobs.clone(), rdma, queues }));
    }

    /// Runs one detection window, with the catalog's job set as of now (config-file jobs, then
    /// the jobs registered through the API), and publishes what it produced.
    pub fn run_window(&mut self, window: WindowAccumulator) {
        let (jobs, planned) = {
            let c = jobs::lock(&self.catalog);
            (c.job_set(), c.planned_jobs())
        };
        self.jobs = jobs.names();
        let clock = Clock::now();
        let ifnames = &self.ifnames;
        let mut job_windows = jobs.windows(&window, |i| ifnames.get(&i).cloned().unwrap_or_else(|| format!("if{i}")));
        // Each egress link's own queue over (about) the window: read now, at the window's end.
        let queues = self.queues.poll(ifnames);
        if !queues.is_empty() {
            for l in job_windows.iter_mut().flat_map(|jw| jw.links.iter_mut()).filter(|l| l.direction == "egress") {
                l.queue = queues.get(&l.link).copied();
            }
        }
        let mut changes: Vec<VerdictChange> = Vec::new();
        let mut errors = 0u64;
        for jw in &job_windows {
            // The detectors' exact input, for replaying a testbed run offline
            // (`RUST_LOG=info,ringside::detect::input=debug`); one line per job and window.
            if tracing::enabled!(target: "ringside::detect::input", tracing::Level::DEBUG) {
                if let Ok(json) = serde_json::to_string(jw) {
                    tracing::debug!(target: "ringside::detect::input", "{json}");
                }
            }
            match self.detectors.observe(jw) {
                Ok(c) => changes.extend(c),
                Err(e) => {
                    errors += 1;
                    tracing::warn!("detectors rejected a window: {e}");
                }
            }
        }
        if job_windows.is_empty() {
            changes.extend(self.detectors.expire(window.end_ns));
        }
        if let Some(reader) = &mut self.rdma {
            // Read at the window's end (the collector's last poll), so the ports' intervals line
            // up with the windows and a replayed or test window gives the same verdicts.
            let ports = reader.poll(window.end_ns);
            // The port detector's exact input (`RUST_LOG=info,ringside::detect::ports=debug`);
            // a target of its own, so the job-window replay tool never sees these lines.
            if !ports.is_empty() && tracing::enabled!(target: "ringside::detect::ports", tracing::Level::DEBUG) {
                if let Ok(json) = serde_json::to_string(&ports) {
                    tracing::debug!(target: "ringside::detect::ports", "{json}");
                }
            }
            let start = window.start_ns.unwrap_or(window.end_ns);
            changes.extend(self.detectors.observe_ports(&ports, start, window.end_ns));
        }
        for c in &changes {
            let v = c.verdict();
            let what = match c {
                VerdictChange::Opened(_) => "opened",
                VerdictChange::Updated(_) => "updated",
                VerdictChange::Closed(_) => "closed",
            };
            tracing::info!(job = %v.job, kind = ?v.kind, scope = ?v.scope, severity = ?v.severity, "verdict {what}");
        }
        let updates = self.run_policy(&planned, &jobs, &job_windows, &clock);
        self.board.publish_window(updates);
        self.log.counters.windows += 1;
        self.log.counters.input_errors += errors;
        let mut dirty = self.log.apply(&changes, &clock);
        self.log.refresh(self.detectors.open_verdicts());
        dirty |= self.log.end_window(&clock);
        if dirty {
            if let Err(e) = events::save(&self.settings.state_dir, &self.log.persisted(clock.unix_ms)) {
                tracing::warn!("{e}");
                self.log.counters.state_write_errors += 1;
            }
        }
        self.publish();
    }

    /// The policy ([`crate::policy`]) of every planned job (`planned`: the catalog's config-file
    /// and registered jobs) with a window: updates its plan and returns plan changes (version + 1),
    /// renewals and the job's insight, to publish. Pure computation on the stage's own state: a
    /// job's policy starts from the baseline plan the catalog published when it onboarded the job
    /// ([`baseline_hint`]), and each publish is remembered here.
    fn run_policy(
        &mut self,
        planned: &BTreeSet<String>,
        jobs: &JobSet,
        job_windows: &[JobWindow],
        clock: &Clock,
    ) -> Vec<JobUpdate> {
        self.policies.retain(planned);
        self.published.retain(|j, _| planned.contains(j));
        let no_constraints = Constraints::default();
        let mut updates = Vec::new();
        for jw in job_windows {
            if !planned.contains(&jw.job) {
                continue;
            }
            // The window's job set: config-file jobs and registered ones with their constraints.
            let spec = jobs.spec(&jw.job);
            let ctx = JobContext {
                constraints: spec.map_or(&no_constraints, |s| &s.constraints),
                gradient_bytes: spec.and_then(|s| s.gradient_bytes),
            };
            let verdicts = VerdictSummary::of_job(&jw.job, self.detectors.open_verdicts());
            // A job's first window: start from the hint the catalog published when it onboarded
            // the job, whose version may be a restart's ([`crate::policy::restart_first_version`])
            // rather than 1, so the next change goes above it. Read once per job, not per window.
            let board = &self.board;
            let latest = self
                .published
                .entry(jw.job.clone())
                .or_insert_with(|| board.latest(&jw.job).unwrap_or_else(|| baseline_hint(&jw.job, FIRST_VERSION, 0)));
            let Some(policy) = self.policies.policy(&jw.job, || PlanChoice::from_hint(latest)) else { continue };
            let now = clock.unix_ms(jw.window_end_ns);
            let in_force = board.applied(&jw.job, clock.unix_ms);
            let out = policy.observe(jw, verdicts, &ctx, in_force.as_ref(), now);
            tracing::debug!(
                target: "ringside::policy",
                job = %jw.job,
                advised = %policy.current().label(),
                step_ms = ?out.insight.step_ms,
                comm_ms = ?out.insight.comm_ms,
                "job window"
            );
            if let Some(d) = &out.verified {
                tracing::info!(job = %jw.job, plan = %d.to.label(), reasons = ?d.reasons, "plan verified");
            }
            if let Some(d) = &out.change {
                tracing::info!(job = %jw.job, kind = ?d.kind, from = %d.from.label(), to = %d.to.label(), reasons = ?d.reasons, confidence = d.confidence, "plan changed");
            }
            let hint = policy.hint(&jw.job, &out, Some(latest), now);
            if let Some(h) = &hint {
                if h.tcp_rto_min_ms != latest.tcp_rto_min_ms {
                    tracing::info!(job = %jw.job, tcp_rto_min_ms = ?h.tcp_rto_min_ms, version = h.version, "transport advice changed");
                }
                *latest = h.clone();
            }
            updates.push((jw.job.clone(), hint, Some(out.insight)));
        }
        // Jobs without traffic in this window keep their plan alive.
        for (job, latest) in self.published.iter_mut() {
            let Some(policy) = self.policies.get_mut(job) else { continue };
            if !job_windows.iter().any(|jw| &jw.job == job) {
                let hint = policy.renewal(latest, clock.unix_ms);
                if let Some(h) = &hint {
                    *latest = h.clone();
                }
                updates.push((job.clone(), hint, None));
            }
        }
        updates.retain(|(_, h, i)| h.is_some() || i.is_some());
        updates
    }
}

/// Runs the detection loop on a thread until `stop` is set or the collector (the queue's sender)
/// is gone: one [`Analysis::run_window`] per window received.
pub fn spawn(mut analysis: Analysis, windows: Receiver<WindowAccumulator>, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::Builder::new()
        .name("ringside-detect".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Wake at least every 50 ms to see a stop request.
                match windows.recv_timeout(Duration::from_millis(50)) {
                    Ok(w) => analysis.run_window(w),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        })
        .expect("spawning the detection thread")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        collector::Collector,
        events::{tests::tempdir, EventState},
        flow_table::{
            tests::{key, stats},
            PollSnapshot, TableSettings,
        },
        jobs::JobCatalog,
    };
    use std::sync::{mpsc::Receiver, Mutex};
    use dataplane_common::{direction, event_kind, flow_kind, BurstState, Event, FlowStats};
    use std::path::Path;

    const MS: u64 = 1_000_000;

    /// One second of a 5-peer job seen from host 10.77.0.1: peer 10.77.0.3 loses 5 %.
    fn second(t: u64, sec: u64, n: u64, lossy: Option<u8>) -> PollSnapshot {
        let mut flows = Vec::new();
        let mut events = Vec::new();
        for p in 2..(2 + n as u8) {
            let k = key(1, p, 29500, direction::EGRESS, flow_kind::TCP);
            let retrans = if Some(p) == lossy { 100 * sec } else { 0 };
            flows.push((k, FlowStats { tcp_retrans: retrans, ..stats(2000 * sec, 3_000_000 * sec, 1, t) }));
            for step in 0..5u64 {
                let s = t - 1000 * MS + step * 200 * MS;
                events.push(Event {
                    kind: event_kind::BURST_END,
                    key: k,
                    burst: BurstState { start_ns: s, last_ns: s + 100 * MS, bytes: 600_000, packets: 400 },
                    ..Default::default()
                });
            }
        }
        PollSnapshot { mono_ns: t, flows, events, ..Default::default() }
    }

    /// The collector and analysis stages wired as in the agent, without the kernel.
    struct Stages {
        collector: Collector,
        windows: Receiver<WindowAccumulator>,
        analysis: Analysis,
        events: watch::Receiver<Arc<EventsSnapshot>>,
        catalog: SharedCatalog,
        board: HintBoard,
    }

    impl Stages {
        fn new(settings: &DetectSettings) -> Self {
            let (mut collector, _snapshots) = Collector::new(TableSettings::default());
            let windows = collector.feed_windows(settings.window);
            let catalog: SharedCatalog = Arc::new(Mutex::new(JobCatalog::default()));
            let board = HintBoard::default();
            let (analysis, events) = Analysis::new(settings.clone(), prepare(settings), catalog.clone(), board.clone(), HashMap::new());
            Stages { collector, windows, analysis, events, catalog, board }
        }

        /// One poll; runs the window it cut, if any. Returns whether a window ran.
        fn poll(&mut self, snap: &PollSnapshot) -> bool {
            self.collector.fold(snap);
            self.collector.poll_done(Duration::from_micros(100));
            match self.windows.try_recv() {
                Ok(w) => {
                    self.analysis.run_window(w);
                    true
                }
                Err(_) => false,
            }
        }
    }

    #[test]
    fn settings_from_file() {
        let f = ConfigFile::parse(
            "state_dir = \"/tmp/x\"\n[detect]\nwindow_ms = 500\nrecent_events = 3\n[detect.gray]\nz_open = 6.0\n\
             [[job]]\nname = \"a\"\nmembers = [\"10.0.0.1\"]\n[policy]\nmin_dwell_windows = 8\n",
            Path::new("t.toml"),
        )
        .unwrap();
        let s = DetectSettings::from_file(&f);
        assert_eq!((s.window, s.recent_events, s.carry_over_windows), (Duration::from_millis(500), 3, config::DEFAULT_CARRY_OVER_WINDOWS));
        assert_eq!(s.detectors.window_ns, 500 * MS);
        assert_eq!(s.detectors.gray.z_open, 6.0);
        assert_eq!(s.detectors.gray.z_clear, crate::detect::GrayConfig::default().z_clear);
        assert_eq!(s.state_dir, PathBuf::from("/tmp/x"));
        assert_eq!(JobSet::from_config(f.jobs.as_deref()).names(), vec!["a"]);
        assert_eq!(s.policy, PolicyConfig { min_dwell_windows: 8, ..Default::default() });
        let d = DetectSettings::from_file(&ConfigFile::default());
        assert!(d.enabled);
        assert_eq!(d.detectors, DetectorConfig::default());
        assert_eq!(d.state_dir, PathBuf::from(config::DEFAULT_STATE_DIR));
    }

    #[test]
    fn lossy_peer_becomes_a_persisted_event() {
        let dir = tempdir("detect");
        let f = ConfigFile::parse(&format!("state_dir = \"{}\"\n", dir.display()), Path::new("t.toml")).unwrap();
        let settings = DetectSettings::from_file(&f);
        let mut st = Stages::new(&settings);
        let t0 = 100_000 * MS;
        assert!(!st.poll(&second(t0, 0, 5, None)), "no window accumulated yet");
        for sec in 1..=6u64 {
            let lossy = (sec >= 3).then_some(3u8);
            assert!(st.poll(&second(t0 + sec * 1000 * MS, sec, 5, lossy)));
        }
        let s = st.events.borrow().clone();
        assert_eq!(s.log.counters.windows, 6);
        assert_eq!(s.log.counters.input_errors, 0);
        assert_eq!(s.jobs, vec![crate::jobs::windows::DEFAULT_JOB]);
        let open: Vec<_> = s.log.open_events().collect();
        assert!(!open.is_empty(), "a 5 % loss peer raises a verdict");
        assert!(open.iter().all(|e| e.kind.is_network_fault()), "{open:?}");
        assert!(
            open.iter().any(|e| matches!(&e.scope, crate::detect::Scope::Peer { peer, .. } if peer.to_string() == "10.77.0.3")),
            "{open:?}"
        );
        let saved = events::load(&dir).unwrap().unwrap();
        assert_eq!(saved.open.len(), open.len());
        assert!(saved.open.iter().all(|e| e.state == EventState::Open));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn policy_publishes_insight_and_renewals_for_catalog_jobs_only() {
        let dir = tempdir("detect-policy");
        let f = ConfigFile::parse(&format!("state_dir = \"{}\"\n", dir.display()), Path::new("t.toml")).unwrap();
        let settings = DetectSettings::from_file(&f);
        let mut st = Stages::new(&settings);
        let t0 = 100_000 * MS;
        assert!(!st.poll(&second(t0, 0, 5, None)));
        assert!(st.poll(&second(t0 + 1000 * MS, 1, 5, None)));
        assert!(st.analysis.policies.is_empty(), "no policy for a job the catalog does not plan (the implicit default)");
        let reg = crate::jobs::catalog::tests::registration("a", &["10.77.0.0/24"]);
        let job = jobs::lock(&st.catalog).onboard(&reg, 0, None, &st.board).unwrap().0;
        for sec in 2..=4u64 {
            assert!(st.poll(&second(t0 + sec * 1000 * MS, sec, 5, None)));
        }
        assert_eq!(st.events.borrow().jobs, vec![job.clone(), crate::jobs::windows::DEFAULT_JOB.to_owned()], "the window's job set is the catalog's");
        let h = st.board.latest(&job).unwrap();
        assert_eq!(h.version, 1, "a healthy job keeps its baseline plan");
        assert!(h.expires_at > crate::policy::baseline::BASELINE_HINT_TTL_MS, "renewed");
        let insight = st.board.insight(&job).expect("insight");
        assert_eq!(insight.peers.len(), 5);
        assert!(insight.peers.iter().all(|p| p.health == "healthy"), "{insight:?}");
        jobs::lock(&st.catalog).remove(&job, None, &st.board).unwrap();
        assert!(st.poll(&second(t0 + 5000 * MS, 5, 5, None)));
        assert!(st.analysis.policies.is_empty(), "forgotten with the job");
        assert!(st.analysis.published.is_empty(), "forgotten with the job");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue 11: a job restored at a restart starts at the restart's version, and the policy
    /// continues from it (renewals keep it, a change would be +1) instead of from 1, which every
    /// tenant that followed the job before the restart would ignore.
    #[test]
    fn a_restored_job_keeps_its_restart_version() {
        let dir = tempdir("detect-restored-version");
        let f = ConfigFile::parse(&format!("state_dir = \"{}\"\n", dir.display()), Path::new("t.toml")).unwrap();
        let settings = DetectSettings::from_file(&f);
        let mut st = Stages::new(&settings);
        // The previous run registered the job (version 1 there) and saved it in state_dir.
        let reg = crate::jobs::catalog::tests::registration("a", &["10.77.0.0/24"]);
        let mut previous = JobCatalog::default().with_state_dir(dir.clone());
        let job = previous.onboard(&reg, 0, None, &HintBoard::default()).unwrap().0;
        let restart_ms = 50_000;
        {
            let mut catalog = jobs::lock(&st.catalog);
            *catalog = JobCatalog::default().with_state_dir(dir.clone());
            assert_eq!(catalog.restore(restart_ms, None, &st.board), 1);
        }
        let t0 = 100_000 * MS;
        assert!(!st.poll(&second(t0, 0, 5, None)));
        for sec in 1..=4u64 {
            assert!(st.poll(&second(t0 + sec * 1000 * MS, sec, 5, None)));
        }
        assert_eq!(st.analysis.published.get(&job).map(|h| h.version), Some(restart_ms), "the policy starts from the board's baseline");
        let versions: Vec<u64> = st.board.history(&job).iter().map(|h| h.version).collect();
        assert_eq!(versions, vec![restart_ms], "healthy: renewals of the restart version, never back to 1");
        assert_eq!(st.board.latest(&job).map(|h| h.version), Some(restart_ms));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// RoCE the kernel never sees: a fixture tree laid out like /sys/class/infiniband, whose
    /// counters the test advances between polls, next to a healthy TCP job seen by TC. Through
    /// the real collector → analysis pipeline: the congested port and the lossy port get their
    /// verdicts (scope `rdma_port`, job `@rdma-ports`), the healthy ports and the job none, and
    /// the verdicts and counters reach `/metrics`.
    #[test]
    fn rdma_port_counters_become_port_verdicts_and_metrics() {
        use crate::detect::{Metric, Scope, VerdictKind, PORT_JOB};
        use crate::rdma_counters::tests::TreeCopy;
        let dir = tempdir("detect-rdma");
        let tree = TreeCopy::of("hosts");
        let f = ConfigFile::parse(
            &format!("state_dir = \"{}\"\n[rdma]\ncounters_root = \"{}\"\n", dir.display(), tree.0.display()),
            Path::new("t.toml"),
        )
        .unwrap();
        let settings = DetectSettings::from_file(&f);
        assert_eq!(settings.rdma.as_deref(), Some(tree.0.as_path()));
        let mut st = Stages::new(&settings);
        // One second of every port: half a million packets each way; `fault` adds 5,000 CNPs
        // sent and 2 % ECN-marked packets on mlx5_0/1, and 2 % loss signals on mlx5_0/2.
        let advance = |fault: bool| {
            for port in ["mlx5_0/ports/1", "mlx5_0/ports/2", "qib0/ports/1"] {
                tree.add(&format!("{port}/counters/port_xmit_packets"), 500_000);
                tree.add(&format!("{port}/counters/port_rcv_packets"), 500_000);
                tree.add(&format!("{port}/counters/port_xmit_data"), 500_000 * 1024);
            }
            for port in ["mlx5_0/ports/1", "mlx5_0/ports/2"] {
                tree.add(&format!("{port}/hw_counters/np_cnp_sent"), 10);
                tree.add(&format!("{port}/hw_counters/np_ecn_marked_roce_packets"), 50);
                tree.add(&format!("{port}/hw_counters/out_of_sequence"), 5);
            }
            if fault {
                tree.add("mlx5_0/ports/1/hw_counters/np_cnp_sent", 5_000);
                tree.add("mlx5_0/ports/1/hw_counters/np_ecn_marked_roce_packets", 10_000);
                tree.add("mlx5_0/ports/2/hw_counters/out_of_sequence", 12_000);
                tree.add("mlx5_0/ports/2/hw_counters/packet_seq_err", 8_000);
            }
        };
        let t0 = 100_000 * MS;
        assert!(!st.poll(&second(t0, 0, 5, None)));
        for sec in 1..=9u64 {
            advance(sec >= 7);
            assert!(st.poll(&second(t0 + sec * 1000 * MS, sec, 5, None)));
        }
        let s = st.events.borrow().clone();
        let open: Vec<_> = s.log.open_events().collect();
        let port = |device: &str, n: u32| Scope::RdmaPort { device: device.into(), port: n };
        assert_eq!(open.len(), 2, "{open:#?}");
        let congested = open.iter().find(|e| e.scope == port("mlx5_0", 1)).expect("mlx5_0/1 congested");
        assert_eq!((congested.kind, congested.job.as_str()), (VerdictKind::Congestion, PORT_JOB));
        assert!(congested.evidence.iter().any(|e| e.metric == Metric::CnpSentPerS && e.value > 4_000.0), "{congested:?}");
        assert!(congested.evidence.iter().any(|e| e.metric == Metric::CeRate), "{congested:?}");
        let lossy = open.iter().find(|e| e.scope == port("mlx5_0", 2)).expect("mlx5_0/2 lossy");
        assert_eq!(lossy.kind, VerdictKind::GrayFailure);
        assert!(lossy.evidence.iter().any(|e| e.metric == Metric::LossRate && e.value >= 0.01), "{lossy:?}");
        // The healthy TCP job is judged as before, and no tenant policy saw the port verdicts.
        assert_eq!(s.jobs, vec![crate::jobs::windows::DEFAULT_JOB]);
        let r = s.rdma.as_ref().unwrap();
        assert_eq!(r.polls, 9);
        // Only the broken device's bad files, read at every poll.
        assert_eq!(r.problems.not_numeric, 9 * 3, "{:?}", r.problems);
        assert_eq!(r.problems.resets, 0);

        let text = crate::metrics::render(&crate::metrics::tests::sample_state().with_events((*s).clone()));
        for line in [
            "ringside_verdicts_open{kind=\"congestion\",severity=\"warning\"} 1",
            "ringside_verdicts_open{kind=\"gray_failure\",severity=\"critical\"} 1",
            "ringside_verdicts_total{kind=\"congestion\"} 1",
            "ringside_rdma_port_cnps_total{device=\"mlx5_0\",port=\"1\",role=\"sent\"} 15080",
            "ringside_rdma_port_packets_total{device=\"qib0\",port=\"1\",direction=\"ingress\"} 4000000",
            "ringside_rdma_port_bytes_total{device=\"qib0\",port=\"1\",direction=\"egress\"} 16384000000",
            "ringside_rdma_port_loss_signals_total{device=\"mlx5_0\",port=\"2\",counter=\"packet_seq_err\"} 24000",
            "ringside_rdma_ports_read 4",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rdma_disabled_reads_nothing() {
        let f = ConfigFile::parse("[rdma]\nenabled = false\ncounters_root = \"/nonexistent\"\n", Path::new("t.toml")).unwrap();
        let settings = DetectSettings::from_file(&f);
        assert_eq!(settings.rdma, None);
        let off = ConfigFile::parse("[detect]\nenabled = false\n", Path::new("t.toml")).unwrap();
        assert_eq!(DetectSettings::from_file(&off).rdma, None, "read by the analysis stage: not without detection");
        assert_eq!(DetectSettings::from_file(&ConfigFile::default()).rdma.as_deref(), Some(Path::new(rdma_counters::DEFAULT_COUNTERS_ROOT)));
        let st = Stages::new(&settings);
        assert!(st.events.borrow().rdma.is_none());
        assert!(!crate::metrics::render(&crate::metrics::tests::sample_state().with_events((**st.events.borrow()).clone())).contains("ringside_rdma_port_polls"));
    }

    #[test]
    fn corrupt_state_file_is_counted_and_the_agent_starts_fresh() {
        let dir = tempdir("detect-corrupt");
        std::fs::write(events::state_path(&dir), "not json").unwrap();
        let f = ConfigFile::parse(&format!("state_dir = \"{}\"\n", dir.display()), Path::new("t.toml")).unwrap();
        let log = prepare(&DetectSettings::from_file(&f));
        assert_eq!(log.counters.state_load_errors, 1);
        assert_eq!(log.open_events().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
