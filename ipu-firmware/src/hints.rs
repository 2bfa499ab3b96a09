//! Closing the loop: ringside's hints ([`ringside_client::Hint`]) become [`Plan`]s that rank 0's
//! [`crate::plan::PlanSchedule`] applies.
//!
//! - [`plan_from_hint`]: the conversion. A hint's algorithm and codec are the engine's own
//!   [`crate::Algorithm`] and [`crate::CodecKind`] (both defined once, in `ringside-client`).
//! - [`HintFollower`]: a [`PlanSource`] fed by a background thread that runs a
//!   [`ringside_client::HintStream`].
//! - Transport advice ([`Hint::tcp_rto_min_ms`]): a follower started with a [`TcpRtoFloor`]
//!   ([`HintFollower::start_with_rto_floor`], or [`HintFollower::start_rto_floor_only`] on ranks
//!   that take no plans) hands each new hint's advice to the floor from its own thread, as soon as
//!   the hint arrives and before the hint is queued for `poll`; the floor sets it on every
//!   registered connection when it differs from the advice in force (see [`crate::rto`]). The
//!   advice is local to the rank: no step boundary, no vote, nothing on the wire; it does not
//!   depend on whether the hint's plan can run here. A follower without a floor leaves the advice
//!   (logged once at info). After the follower gives up on the agent, the advice in force stays,
//!   like the plan in force.
//! - [`PlanReporter`]: the other direction, the plan the job runs, reported to the agent
//!   (`PUT {job}/plan`) from a background thread, so the agent's policy judges each window by the
//!   plan that actually ran (in managed mode the services' agreed plan, not always its own hint).
//!
//! Invariants:
//! - Fail open: nothing the hint service does can stop training. The follower starts without
//!   contacting the agent; connection failures are retried in the background (bounded, see
//!   [`ringside_client::Backoff`]) and only logged; after giving up, the job keeps its current plan.
//! - [`HintFollower::poll`] never blocks: it drains what the thread has already received.
//! - A hint received while rank 0 is at step `s` takes effect at step `max(hint.step_from, s + 1)`:
//!   a step boundary no rank has reached yet, so the control header switches all ranks together.
//! - Versions only increase: a hint not newer than the last one accepted is ignored.
//! - A hint that cannot run on this mesh (more channels than were opened, bad chunk size) is
//!   logged and skipped; the plan in force stays. An unknown algorithm or codec never gets this far:
//!   the hint does not deserialise, and the client reports it as a stream error.
//! - The thread ends after the follower is dropped: dropping sets a stop flag (checked between
//!   lines and during reconnect backoff) and closes the channel (the next send fails). A read that
//!   is blocked waits at most for the next keep-alive or the stream's read timeout. The thread is
//!   detached, so it never holds the process open.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use ringside_client::{AppliedPlan, Hint, JobClient, APPLIED_PLAN_REFRESH_MS};

use crate::plan::{AppliedHint, Compression, Plan, PlanError, PlanSource};
use crate::rto::TcpRtoFloor;

/// Why a hint cannot become a plan for this engine.
#[derive(Debug, thiserror::Error)]
pub enum HintPlanError {
    #[error("hint v{version} cannot run on this mesh: {source}; register the job with constraints that match it (e.g. max_channels)")]
    Plan {
        version: u64,
        #[source]
        source: PlanError,
    },
}

/// The plan a hint describes, `step_from` as in the hint (0 = "your next step"). The hint's
/// algorithm and codec are the engine's own types, so this cannot fail; whether the plan runs on
/// this mesh is [`Plan::validate`]'s question.
pub fn plan_from_hint(h: &Hint) -> Plan {
    Plan {
        step_from: h.step_from,
        algorithm: h.algorithm,
        chunk_bytes: h.chunk_bytes,
        channels: h.channels,
        compression: Compression { codec: h.compression, error_feedback: h.error_feedback },
    }
}

/// What the agent is told a job runs: `plan` without its `step_from`, and the step it ran at.
pub fn applied_plan(plan: &Plan, step: u64) -> AppliedPlan {
    AppliedPlan {
        algorithm: plan.algorithm,
        chunk_bytes: plan.chunk_bytes,
        channels: plan.channels,
        compression: plan.compression.codec,
        error_feedback: plan.compression.error_feedback,
        step,
        step_time_ms: None,
    }
}

#[derive(Default)]
struct ReportState {
    /// The plan to report, and whether it changed since the last report.
    latest: Option<AppliedPlan>,
    changed: bool,
    stop: bool,
}

/// Reports the plan the job runs to its agent (`PUT {job}/plan`): at once when it changes, and
/// again every [`APPLIED_PLAN_REFRESH_MS`] while it does not (the agent forgets a report after
/// [`ringside_client::APPLIED_PLAN_TTL_MS`]).
///
/// Fail open like the follower: [`PlanReporter::ran`] only stores the plan and wakes the thread,
/// so a slow or absent agent never delays a collective; failed reports are logged (once per
/// outage) and retried at the next change or refresh. Dropping the reporter ends its thread.
pub struct PlanReporter {
    shared: Arc<(Mutex<ReportState>, Condvar)>,
}

impl PlanReporter {
    /// Starts the reporting thread for `client`'s job (no request until the first [`Self::ran`]).
    pub fn start(client: JobClient) -> std::io::Result<Self> {
        Self::start_every(client, Duration::from_millis(APPLIED_PLAN_REFRESH_MS))
    }

    fn start_every(client: JobClient, refresh: Duration) -> std::io::Result<Self> {
        let shared = Arc::new((Mutex::new(ReportState::default()), Condvar::new()));
        let theirs = shared.clone();
        std::thread::Builder::new().name("plan-reporter".into()).spawn(move || report(client, &theirs, refresh))?;
        Ok(PlanReporter { shared })
    }

    /// The job ran `plan` at `step`. Cheap: a lock and, when the plan changed, a wake-up.
    pub fn ran(&self, plan: &Plan, step: u64) {
        let applied = applied_plan(plan, step);
        let (lock, wake) = &*self.shared;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        let same = st.latest.as_ref().is_some_and(|l| AppliedPlan { step: l.step, ..applied.clone() } == *l);
        if !same {
            st.latest = Some(applied);
            st.changed = true;
            wake.notify_one();
        }
    }
}

impl Drop for PlanReporter {
    fn drop(&mut self) {
        let (lock, wake) = &*self.shared;
        lock.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        wake.notify_one();
    }
}

fn report(client: JobClient, shared: &(Mutex<ReportState>, Condvar), refresh: Duration) {
    let (lock, wake) = shared;
    let mut failing = false;
    loop {
        let plan = {
            let st = lock.lock().unwrap_or_else(|p| p.into_inner());
            let (mut st, _) = wake.wait_timeout_while(st, refresh, |s| !s.changed && !s.stop).unwrap_or_else(|p| p.into_inner());
            if st.stop {
                return;
            }
            st.changed = false;
            st.latest.clone()
        };
        let Some(plan) = plan else { continue };
        match client.report_plan(&plan) {
            Ok(()) if failing => {
                failing = false;
                tracing::info!(job = %client.job_url(), "reporting the plan in force to the agent again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(job = %client.job_url(), error = %e, "cannot report the plan in force to the agent; retrying at the next change or refresh");
            }
            Err(_) => {}
        }
    }
}

/// Most hints an [`AppliedHints`] log keeps (hints are rare: one per plan change).
pub const MAX_APPLIED_HINTS: usize = 4096;

/// The follower's log of applied hints, shared so it can be read after the follower was handed to
/// the job (and dropped with it).
#[derive(Clone, Debug, Default)]
pub struct AppliedHints(Arc<Mutex<Vec<AppliedHint>>>);

impl AppliedHints {
    pub fn snapshot(&self) -> Vec<AppliedHint> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn push(&self, h: AppliedHint) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < MAX_APPLIED_HINTS {
            v.push(h);
        }
    }
}

/// How many received hints the channel holds before the thread waits for `poll`.
const CHANNEL_DEPTH: usize = 16;

/// A [`PlanSource`] that follows a job's hint stream (rank 0, or every service in managed mode),
/// and optionally feeds the hints' transport advice to a [`TcpRtoFloor`] (every rank).
pub struct HintFollower {
    rx: Receiver<Hint>,
    stop: Arc<AtomicBool>,
    /// Set when the background thread ended (it gave up on the agent, or was stopped).
    ended: Arc<AtomicBool>,
    applied: AppliedHints,
    last_version: Option<u64>,
    available_channels: u8,
}

impl HintFollower {
    /// Starts following `client`'s hint stream on a background thread. `available_channels` is the
    /// mesh's connection count per peer pair (hints asking for more are skipped). Fails only if
    /// the thread cannot be spawned; an unreachable agent is retried in the background. Transport
    /// advice is left alone (see [`Self::start_with_rto_floor`]).
    pub fn start(client: JobClient, available_channels: u8) -> std::io::Result<Self> {
        Self::spawn(client, available_channels, true, None)
    }

    /// [`Self::start`], and each new hint's transport advice ([`Hint::tcp_rto_min_ms`]) goes to
    /// `floor` from the follower's thread as soon as the hint arrives (see the module docs).
    pub fn start_with_rto_floor(client: JobClient, available_channels: u8, floor: TcpRtoFloor) -> std::io::Result<Self> {
        Self::spawn(client, available_channels, true, Some(floor))
    }

    /// Follows `client`'s hints only for their transport advice, applied to `floor`: for the
    /// ranks whose plans come from rank 0 (`poll` never returns a plan). Each rank sets the floor
    /// on its own connections, since a retransmission timer runs at the sender.
    pub fn start_rto_floor_only(client: JobClient, floor: TcpRtoFloor) -> std::io::Result<Self> {
        Self::spawn(client, 1, false, Some(floor))
    }

    fn spawn(client: JobClient, available_channels: u8, plans: bool, floor: Option<TcpRtoFloor>) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_DEPTH);
        let tx = plans.then_some(tx);
        let stop = Arc::new(AtomicBool::new(false));
        let ended = Arc::new(AtomicBool::new(false));
        let (flag, done) = (stop.clone(), ended.clone());
        let advice = TransportAdvice { floor, last_version: None, left_logged: false };
        std::thread::Builder::new().name("hint-follower".into()).spawn(move || {
            follow(client, tx, advice, flag);
            done.store(true, Ordering::Release);
        })?;
        Ok(HintFollower { rx, stop, ended, applied: AppliedHints::default(), last_version: None, available_channels })
    }

    /// Whether the follower stopped following: the agent stayed unreachable past the client's
    /// retries (or the stream ended for good). Hints already received are still returned by
    /// `poll`; none will follow.
    pub fn gave_up(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The log of hints this follower applied (readable after the follower is dropped).
    pub fn applied(&self) -> AppliedHints {
        self.applied.clone()
    }
}

/// What the follower's thread does with each hint's transport advice.
struct TransportAdvice {
    /// Where the advice goes; `None`: it is left (logged once).
    floor: Option<TcpRtoFloor>,
    /// The newest hint version taken (versions only increase).
    last_version: Option<u64>,
    left_logged: bool,
}

impl TransportAdvice {
    fn take(&mut self, h: &Hint) {
        if self.last_version.is_some_and(|v| h.version <= v) {
            return;
        }
        self.last_version = Some(h.version);
        match &self.floor {
            // A no-op unless the advice differs from the one in force.
            Some(floor) => {
                floor.advise(h.tcp_rto_min_ms, Some(h.version));
            }
            None if h.tcp_rto_min_ms.is_some() && !self.left_logged => {
                self.left_logged = true;
                tracing::info!(version = h.version, tcp_rto_min_ms = h.tcp_rto_min_ms, "ringside hint carries transport advice; not applied here (no TCP retransmission floor given to this follower)");
            }
            None => {}
        }
    }
}

fn follow(client: JobClient, tx: Option<SyncSender<Hint>>, mut advice: TransportAdvice, stop: Arc<AtomicBool>) {
    let url = client.job_url().to_owned();
    tracing::info!(job = %url, plans = tx.is_some(), transport_advice = advice.floor.is_some(), "following ringside hints");
    for item in client.stream_retrying().with_cancel(stop.clone()) {
        match item {
            Ok(h) => {
                // First, and from this thread: the advice must not wait for rank 0's next poll
                // (nor for a stalled job, below).
                advice.take(&h);
                // Waits only when rank 0 has not polled for CHANNEL_DEPTH hints (a stalled job);
                // dropping the follower drops the receiver, which ends the wait with an error.
                if tx.as_ref().is_some_and(|tx| tx.send(h).is_err()) {
                    return;
                }
            }
            Err(e) => tracing::warn!(job = %url, error = %e, "ringside hints unavailable; training continues with the plan in force"),
        }
    }
    tracing::info!(job = %url, "stopped following ringside hints");
}

impl Drop for HintFollower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl HintFollower {
    /// [`PlanSource::poll`] with each plan's hint (version, reasons, confidence): the hints
    /// received since the last call, in order, each also appended to [`Self::applied`].
    pub fn poll_hints(&mut self, step: u64) -> Vec<AppliedHint> {
        let mut plans = Vec::new();
        for h in self.rx.try_iter().take(CHANNEL_DEPTH) {
            if self.last_version.is_some_and(|v| h.version <= v) {
                continue;
            }
            self.last_version = Some(h.version);
            let mut p = plan_from_hint(&h);
            // Never the step already under way: all ranks must switch at the same collective.
            p.step_from = p.step_from.max(step + 1);
            let plan = p.validate(self.available_channels).map(|()| p).map_err(|source| HintPlanError::Plan { version: h.version, source });
            match plan {
                Ok(p) => {
                    tracing::info!(
                        version = h.version,
                        step_from = p.step_from,
                        algorithm = %p.algorithm,
                        chunk_bytes = p.chunk_bytes,
                        channels = p.channels,
                        compression = %p.compression.codec,
                        error_feedback = p.compression.error_feedback,
                        confidence = h.confidence,
                        reasons = ?h.reasons,
                        "applying ringside hint"
                    );
                    let a = AppliedHint { version: h.version, received_at_step: step, plan: p, reasons: h.reasons, confidence: h.confidence };
                    self.applied.push(a.clone());
                    plans.push(a);
                }
                Err(e) => tracing::warn!(error = %e, "skipping ringside hint; the plan in force stays"),
            }
        }
        plans
    }
}

impl PlanSource for HintFollower {
    fn poll(&mut self, step: u64) -> Vec<Plan> {
        self.poll_hints(step).into_iter().map(|h| h.plan).collect()
    }
}

#[cfg(test)]
#[path = "../../ringside-client/tests/support/canned.rs"]
mod canned;

#[cfg(test)]
mod tests {
    use super::canned::{hint_event, serve, within, Reply};
    use super::*;
    use crate::{Algorithm, CodecKind};
    use ringside_client::{Backoff, ClientConfig, Codec};
    use std::time::{Duration, Instant};

    fn hint(version: u64, step_from: u64, algorithm: &str, compression: &str, channels: u8) -> String {
        format!(
            r#"{{"job":"j1","version":{version},"step_from":{step_from},"algorithm":"{algorithm}","chunk_bytes":65536,"channels":{channels},"compression":"{compression}","error_feedback":true,"reasons":["shared uplink congested"],"confidence":0.7,"expires_at":1}}"#
        )
    }

    fn fast() -> ClientConfig {
        ClientConfig {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            stream_read_timeout: Duration::from_secs(5),
            reconnect: Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(100), max_attempts: 3 },
            ..ClientConfig::default()
        }
    }

    /// Polls like rank 0 would, at `step`, until `n` plans came or 10 s passed.
    fn poll_until(f: &mut HintFollower, step: u64, n: usize) -> Vec<Plan> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < n && Instant::now() < deadline {
            got.extend(f.poll(step));
            std::thread::sleep(Duration::from_millis(10));
        }
        got
    }

    #[test]
    fn hints_become_plans() {
        for codec in [Codec::None, Codec::Fp16, Codec::Bf16, Codec::Int8, Codec::TopK { ratio: 0.25 }] {
            for a in Algorithm::ALL {
                let h: Hint = serde_json::from_str(&hint(4, 9, a.as_str(), &codec.to_string(), 3)).unwrap();
                let p = plan_from_hint(&h);
                assert_eq!(p.algorithm, a);
                assert_eq!(p.compression, Compression { codec, error_feedback: true });
                assert_eq!((p.step_from, p.chunk_bytes, p.channels), (9, 65536, 3));
            }
        }
    }

    #[test]
    fn follower_switches_at_a_future_step_and_skips_what_cannot_run() {
        within(30, || {
            let srv = serve(vec![Reply::sse(&[
                &hint_event(1, &hint(1, 0, "tree", "fp16", 1)),
                &hint_event(2, &hint(2, 0, "ring", "int8", 8)), // 8 channels: more than the mesh has
                &hint_event(3, &hint(3, 40, "rhd", "topk:0.5", 2)),
            ])]);
            let client = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
            let mut f = HintFollower::start(client, 2).unwrap();
            let log = f.applied();
            let plans = poll_until(&mut f, 7, 2);
            assert_eq!(plans.len(), 2, "{plans:?}");
            assert_eq!((plans[0].algorithm, plans[0].step_from), (Algorithm::Tree, 8));
            assert_eq!((plans[1].algorithm, plans[1].step_from), (Algorithm::Rhd, 40));
            assert_eq!(plans[1].compression.codec, CodecKind::TopK { ratio: 0.5 });
            drop(f);
            let log = log.snapshot();
            assert_eq!(log.iter().map(|h| h.version).collect::<Vec<_>>(), [1, 3]);
            assert_eq!(log[0].received_at_step, 7);
            assert_eq!(log[0].reasons, ["shared uplink congested"]);
        });
    }

    /// `json` (a hint) with transport advice.
    fn with_rto(json: &str, ms: u32) -> String {
        format!("{},\"tcp_rto_min_ms\":{ms}}}", json.strip_suffix('}').unwrap())
    }

    #[test]
    fn transport_advice_reaches_the_floors_sockets_from_the_followers_thread_and_is_withdrawn() {
        use crate::rto::{rto_min_us, system_rto_min_us};
        within(30, || {
            let srv = serve(vec![Reply::sse(&[
                &hint_event(1, &hint(1, 0, "ring", "none", 1)),
                &hint_event(2, &with_rto(&hint(2, 0, "ring", "int8", 1), 5)),
                // A plan this mesh cannot run (8 channels) with the same advice: skipped as a
                // plan, and the advice in force is no change.
                &hint_event(3, &with_rto(&hint(3, 0, "tree", "int8", 8), 5)),
                &hint_event(4, &hint(4, 0, "ring", "int8", 1)),
            ])]);
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            let supported = rto_min_us(&c).is_ok();
            let floor = TcpRtoFloor::new();
            let _reg = floor.register([&c, &s]);
            let client = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
            let mut f = HintFollower::start_with_rto_floor(client, 1, floor.clone()).unwrap();
            // Nobody polls yet: the advice must not wait for rank 0's next step.
            let deadline = Instant::now() + Duration::from_secs(10);
            while floor.applied().len() < 2 {
                assert!(Instant::now() < deadline, "advice applied: {:?}", floor.applied());
                std::thread::sleep(Duration::from_millis(10));
            }
            let log = floor.applied();
            assert_eq!(log.iter().map(|a| (a.hint_version, a.tcp_rto_min_ms)).collect::<Vec<_>>(), [(Some(2), Some(5)), (Some(4), None)]);
            if supported {
                assert!(log[0].rto_min_us.is_some_and(|us| (5000..200_000).contains(&us)) && log[0].sockets == 2, "{log:?}");
                let default = system_rto_min_us();
                assert_eq!((log[1].rto_min_us, log[1].sockets), (Some(default), 2), "{log:?}");
                assert_eq!((rto_min_us(&c).unwrap(), rto_min_us(&s).unwrap()), (default, default), "withdrawn advice restores the system's floor");
            } else {
                assert!(log[0].error.as_deref().is_some_and(|e| e.contains("Linux 6.15")), "{log:?}");
            }
            // The plans still flow, the one that cannot run skipped.
            let plans = poll_until(&mut f, 3, 3);
            assert_eq!(plans.iter().map(|p| p.compression.codec).collect::<Vec<_>>(), [CodecKind::None, CodecKind::Int8, CodecKind::Int8]);
            assert_eq!(f.applied().snapshot().iter().map(|h| h.version).collect::<Vec<_>>(), [1, 2, 4]);
        });
    }

    #[test]
    fn an_advice_only_follower_applies_the_advice_and_yields_no_plans() {
        within(30, || {
            let srv = serve(vec![Reply::sse(&[&hint_event(1, &with_rto(&hint(1, 0, "tree", "fp16", 1), 5))])]);
            let floor = TcpRtoFloor::new();
            let client = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
            let mut f = HintFollower::start_rto_floor_only(client, floor.clone()).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while floor.advice().is_none() {
                assert!(Instant::now() < deadline, "the advice never arrived");
                assert!(f.poll(0).is_empty(), "an advice-only follower returned a plan");
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(floor.advice(), Some(5));
            assert!(f.poll(1).is_empty() && f.applied().snapshot().is_empty());
        });
    }

    #[test]
    fn an_unreachable_agent_never_blocks_poll() {
        within(30, || {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let client = JobClient::with_config(&format!("http://127.0.0.1:{port}/v1/jobs/j1"), "t", fast()).unwrap();
            let mut f = HintFollower::start(client, 1).unwrap();
            let t0 = Instant::now();
            for step in 0..100 {
                assert!(f.poll(step).is_empty());
            }
            assert!(t0.elapsed() < Duration::from_millis(500), "poll blocked for {:?}", t0.elapsed());
        });
    }

    #[test]
    fn the_reporter_puts_each_new_plan_at_once_refreshes_it_and_survives_a_refusal() {
        within(30, || {
            let srv = serve(vec![Reply::json(500, r#"{"error":"busy"}"#), Reply::json(204, ""), Reply::json(204, ""), Reply::json(204, ""), Reply::json(204, "")]);
            let client = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "tok", fast()).unwrap();
            let r = PlanReporter::start_every(client, Duration::from_millis(1000)).unwrap();
            let none = Plan::default();
            let int8 = Plan { step_from: 9, compression: Compression { codec: CodecKind::Int8, error_feedback: true }, ..none };
            let wait_for = |n: usize| {
                let t0 = Instant::now();
                while srv.requests.lock().unwrap().len() < n {
                    assert!(t0.elapsed() < Duration::from_secs(10), "{} of {n} reports", srv.requests.lock().unwrap().len());
                    std::thread::sleep(Duration::from_millis(10));
                }
                srv.requests.lock().unwrap().clone()
            };
            for step in 1..=3 {
                r.ran(&none, step);
            }
            wait_for(1);
            r.ran(&int8, 9);
            let reqs = wait_for(4);
            let bodies: Vec<AppliedPlan> = reqs.iter().map(|q| serde_json::from_str(&q.body).unwrap()).collect();
            assert_eq!(reqs[0].request_line(), "PUT /v1/jobs/j1/plan HTTP/1.1");
            assert_eq!(reqs[0].header("authorization").as_deref(), Some("Bearer tok"));
            assert_eq!(bodies[0], applied_plan(&none, 1), "one report for three collectives of one plan");
            // The refused one is not retried at once: the next report is the change.
            assert_eq!(bodies[1], applied_plan(&int8, 9));
            assert_eq!((bodies[1].compression, bodies[1].error_feedback), (CodecKind::Int8, true));
            assert!(bodies[2..].iter().all(|b| *b == bodies[1]), "refreshed while unchanged: {bodies:?}");
            drop(r);
        });
    }

    #[test]
    fn reporting_to_an_unreachable_agent_never_blocks_a_collective() {
        within(30, || {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let client = JobClient::with_config(&format!("http://127.0.0.1:{port}/v1/jobs/j1"), "t", fast()).unwrap();
            let r = PlanReporter::start_every(client, Duration::from_millis(1)).unwrap();
            let t0 = Instant::now();
            for step in 0..1000u64 {
                let p = Plan { channels: 1 + (step % 2) as u8, ..Plan::default() };
                r.ran(&p, step);
            }
            assert!(t0.elapsed() < Duration::from_millis(500), "ran blocked for {:?}", t0.elapsed());
        });
    }
}
