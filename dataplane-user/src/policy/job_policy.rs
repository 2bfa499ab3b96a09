//! One job's policy: a small state machine fed one window at a time.
//!
//! Each window ([`JobPolicy::observe`]):
//! 1. observe ([`super::observe`]) and update the recent medians; a window under the baseline
//!    plan with no open verdict, no lossy path and communication time under `degrade_ratio` ×
//!    its baseline extends the healthy baseline (communication time and bottleneck goodput);
//! 2. classify: *degraded* = an open congestion/gray verdict, a lossy path, or communication
//!    time ≥ `degrade_ratio` × what the healthy baseline predicts for the current plan (the
//!    latter never while a straggler verdict is open and no network verdict: a straggler's
//!    wait is compute); *target missed* = observed step time over the tenant's target (not
//!    while a straggler verdict is open);
//! 3. while a change is being verified: after `settle_windows`, collect `verify_windows`
//!    windows of communication time; if it fell by less than `verify_min_gain` against the
//!    previous plan's, revert, and put the reverted plan in cooldown; when the job reports its
//!    own step times and the old plan's under the current conditions are known, the
//!    verification waits for two of them too, and they must have fallen as well;
//! 4. otherwise, at least `min_dwell_windows` after the last change: when degraded for
//!    `trigger_windows` (at once on a verdict, or on communication time at `severe_degrade_ratio`
//!    with the slowest path at `severe_path_ratio`) or missing the target for `trigger_windows`,
//!    choose a plan ([`super::decide`]) and adopt it if it predicts ≥ `min_improvement` less
//!    communication time than the current one (on degraded windows, a job that reports step
//!    times waits until it has reported one under the fault, at most
//!    `STEP_BASELINE_WAIT_WINDOWS`); when not at the baseline and healthy for
//!    `recover_windows` (and the baseline is predicted to meet the target, if any), return to
//!    the baseline plan; each return in a row that the fault outlasts (an adaptation within
//!    twice the wait before it) doubles that wait, up to 8×;
//! 5. apart from the plan, for a job that takes transport advice: advise a floor for TCP's
//!    retransmission timeout after `trigger_windows` lossy windows, withdraw it after
//!    `recover_windows` clean ones ([`JobPolicy::advise_transport`]); until the advice has stood
//!    `settle_windows` + `verify_windows` windows, loss moves the plan only through the
//!    communication time it costs.
//!
//! Invariants: a healthy job without a step-time target miss never leaves its baseline plan;
//! every plan satisfies the job's constraints; at most one change per window; the decision
//! history and the cooldown list are bounded; no clock is read (time comes in as arguments).

use std::{collections::VecDeque, net::IpAddr};

use ringside_client::{Codec, Constraints, Hint};
use serde::Serialize;

use super::config::PolicyConfig;
use super::cost::{Calibrated, CostModel, PathModel, PlanChoice};
use super::decide::{candidates, choose, Trigger};
use super::observe::{median, ObservationHistory, PhaseParams, StepTracker, VerdictSummary, WindowObservation, WindowSummary};
use crate::detect::JobWindow;
use super::insight::{JobInsight, PeerHealth};

/// What the policy knows of the job from its registration.
#[derive(Clone, Copy, Debug)]
pub struct JobContext<'a> {
    pub constraints: &'a Constraints,
    /// f32 bytes reduced per step, if the tenant said.
    pub gradient_bytes: Option<u64>,
}

/// What a decision did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// Left the current plan for a better predicted one.
    Adapt,
    /// A change did not help and was undone.
    Revert,
    /// Back to the baseline plan after recovery.
    Restore,
    /// A change was checked and kept (no plan change).
    Verified,
}

/// One entry of the decision history (logs, insight).
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub unix_ms: u64,
    pub kind: DecisionKind,
    pub from: PlanChoice,
    pub to: PlanChoice,
    pub reasons: Vec<String>,
    pub confidence: f64,
    /// Communication time per step observed under `from` (for `verified`: under `to`), ms.
    pub observed_comm_ms: Option<f64>,
    /// Communication time expected under `to`, ms: the model's prediction (adapt, restore,
    /// verified: the prediction that was verified), for a revert what `to` had before.
    pub predicted_comm_ms: Option<f64>,
}

/// The result of one window.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyOutput {
    /// A plan change to publish (never of kind `Verified`).
    pub change: Option<Decision>,
    /// The current hint is due for renewal.
    pub renew: bool,
    pub insight: JobInsight,
    /// The verification that concluded in this window and kept the change (for the log).
    pub verified: Option<Decision>,
}

/// The plan a job reports it runs (`PUT /v1/jobs/{id}/plan`, kept by the hint board while fresh).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanInForce {
    pub plan: PlanChoice,
    /// When the job first reported this plan (a different plan resets it), unix ms.
    pub since_unix_ms: u64,
    /// When its latest report came, unix ms.
    pub reported_unix_ms: u64,
    /// The job's own mean step time in that report (steps since its previous report, all under
    /// this plan), ms, if it sent one.
    pub step_time_ms: Option<f64>,
}

#[derive(Clone, Debug, PartialEq)]
struct Verification {
    from: PlanChoice,
    from_comm_s: f64,
    predicted_s: f64,
    samples: Vec<f64>,
    /// The job's own step time under the previous plan, seconds, when the job reports it.
    from_step_s: Option<f64>,
    /// The job's reported step times under the plan under test (one per window at most).
    step_samples: Vec<f64>,
    /// Windows after settling in which the plan under test ran (with or without a step).
    ran_windows: u64,
    /// Verifying a revert: undone only if the plan it left was clearly faster (see `decide`).
    revert: bool,
}

impl Verification {
    fn new(from: PlanChoice, from_comm_s: f64, predicted_s: f64, revert: bool) -> Self {
        Verification { from, from_comm_s, predicted_s, samples: Vec::new(), from_step_s: None, step_samples: Vec::new(), ran_windows: 0, revert }
    }
}

/// The window's start in unix ms, from its end (`now_unix_ms`) and its length.
fn window_start_ms(w: &JobWindow, now_unix_ms: u64) -> u64 {
    now_unix_ms.saturating_sub(w.window_end_ns.saturating_sub(w.window_start_ns) / 1_000_000)
}

/// The larger of two measurements, or the one that is known.
fn larger_known(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Appends `v`, dropping the oldest so that at most `cap` (at least 1) are kept.
fn push_bounded(q: &mut VecDeque<f64>, v: f64, cap: usize) {
    while q.len() >= cap.max(1) {
        q.pop_front();
    }
    q.push_back(v);
}

/// How long a reported step time stands for the job's step time in its insight, ms (the Python
/// follower reports every second).
const REPORTED_STEP_FRESH_MS: u64 = ringside_client::APPLIED_PLAN_REFRESH_MS;

/// Reported step times needed in a verification before the job's own step time judges it.
const MIN_STEP_SAMPLES: usize = 2;

/// Degraded windows a change waits at most for the job's first step time under the fault, when
/// the job reports step times (see `from_step` in `JobPolicy::decide`): the Python follower
/// reports every second, and under a cap its first steps take one to two.
const STEP_BASELINE_WAIT_WINDOWS: u32 = 5;

/// Healthy-baseline samples (communication time, bottleneck goodput) under the baseline plan.
#[derive(Clone, Debug, Default, PartialEq)]
struct Baseline {
    comm_s: VecDeque<f64>,
    bottleneck_bps: VecDeque<f64>,
    /// f32 bytes per step (given or estimated) in those windows.
    bytes: VecDeque<f64>,
}

/// The policy of one job.
#[derive(Clone, Debug)]
pub struct JobPolicy {
    cfg: PolicyConfig,
    phases: PhaseParams,
    model: CostModel,
    baseline_plan: PlanChoice,
    current: PlanChoice,
    reasons: Vec<String>,
    confidence: f64,
    /// Prediction made when the current plan was adopted.
    predicted_s: Option<f64>,
    window: u64,
    last_change_window: Option<u64>,
    verifying: Option<Verification>,
    /// A revert was itself undone since the last adaptation (at most once, so two plans of
    /// similar speed cannot alternate).
    reverted_a_revert: bool,
    /// Reverted plans not to choose again before a window: (plan, what else it keeps out, until).
    cooldown: Vec<(PlanChoice, Cooling, u64)>,
    history: VecDeque<Decision>,
    recent: ObservationHistory,
    /// The job's own step times (`PlanInForce::step_time_ms`) in the recent windows in which the
    /// advised plan ran, seconds: cleared with `recent`.
    reported_steps: VecDeque<f64>,
    /// The same reports from the windows of the current degraded streak but its first, seconds:
    /// what the job's steps take under the fault before a change (a report covers the steps since
    /// the job's previous one, about a second, so in the fault's first window it still describes
    /// the healthy steps). Cleared with `recent` and when the streak ends.
    degraded_steps: VecDeque<f64>,
    steps: StepTracker,
    baseline: Baseline,
    degraded_streak: u32,
    target_streak: u32,
    healthy_streak: u32,
    last_publish_ms: Option<u64>,
    /// Returns to the baseline in a row that the network sent back (an adaptation came within
    /// twice the wait before them): each doubles the healthy windows the next return waits for.
    restore_backoff: u32,
    /// The window of the last return to the baseline, until it has stood long enough to count
    /// as a recovery.
    last_restore_window: Option<u64>,
    /// The transport advice in force ([`Hint::tcp_rto_min_ms`]): the minimum TCP retransmission
    /// timeout advised while the job's paths lose packets (see [`JobPolicy::advise_transport`]).
    rto_advice: Option<u32>,
    /// The window the advice in force started.
    rto_advice_window: Option<u64>,
    /// Windows in a row with a lossy path.
    loss_streak: u32,
    /// Windows in a row whose paths' loss was measured and none was lossy (windows without a
    /// measurement leave it as it is).
    clean_streak: u32,
}

const MAX_COOLDOWN: usize = 16;

/// At most `recover_windows` × 2^this healthy windows before a return to the baseline: under a
/// fault that lasts, the job probes its original plan every 80 windows at the defaults, instead
/// of every 15 or so (10 healthy windows, then the dwell and trigger windows back).
const MAX_RESTORE_BACKOFF: u32 = 3;

/// What a reverted plan keeps out of the candidates during its cooldown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cooling {
    /// That plan only.
    Plan,
    /// Every plan with its codec (whatever the algorithm and channels): the codec cut the wire
    /// time but cost the job's steps more.
    Codec,
    /// That plan and every compressed plan: compression did not cut the wire time, the job is
    /// not bound by its wire bytes now.
    EveryCodec,
}

impl JobPolicy {
    /// A policy whose baseline (and current) plan is `baseline`: the hint the job registered with.
    pub fn new(cfg: PolicyConfig, phases: PhaseParams, baseline: PlanChoice) -> Self {
        let model = CostModel::new(cfg.cost.clone());
        let recent = ObservationHistory::new(cfg.recent_windows);
        JobPolicy {
            cfg,
            phases,
            model,
            baseline_plan: baseline,
            current: baseline,
            reasons: Vec::new(),
            confidence: 0.5,
            predicted_s: None,
            window: 0,
            last_change_window: None,
            verifying: None,
            reverted_a_revert: false,
            cooldown: Vec::new(),
            history: VecDeque::new(),
            recent,
            reported_steps: VecDeque::new(),
            degraded_steps: VecDeque::new(),
            steps: StepTracker::default(),
            baseline: Baseline::default(),
            degraded_streak: 0,
            target_streak: 0,
            healthy_streak: 0,
            last_publish_ms: None,
            restore_backoff: 0,
            last_restore_window: None,
            rto_advice: None,
            rto_advice_window: None,
            loss_streak: 0,
            clean_streak: 0,
        }
    }

    /// The transport advice in force: the minimum TCP retransmission timeout, ms.
    #[cfg(test)]
    pub fn rto_advice(&self) -> Option<u32> {
        self.rto_advice
    }

    /// Transport advice, apart from the plan: a lost segment at the tail of a message (or its
    /// retransmission) waits for TCP's retransmission timeout, at least 200 ms on Linux, while a
    /// collective's round trip is well under a millisecond; so under random loss a job's steps
    /// stall on timeouts that no codec removes (docs/eval-adaptation.md: half the bytes left the
    /// stalls as frequent). For a job whose constraints allow it, `trigger_windows` windows in a
    /// row with a lossy path start advising `loss_rto_min_ms`, and `recover_windows` windows in
    /// a row with measured, loss-free paths end it. Linux's timeout stays at least the smoothed
    /// round trip plus this floor, so a path whose round trip grows (a queue) keeps a longer
    /// timeout. `lossy`: a path of this window is lossy. Returns whether the advice changed.
    fn advise_transport(&mut self, ctx: &JobContext, obs: &WindowObservation, lossy: bool) -> bool {
        let measured = obs.peers.iter().any(|p| p.loss_ratio.is_some());
        self.loss_streak = if lossy { self.loss_streak.saturating_add(1) } else { 0 };
        if lossy {
            self.clean_streak = 0;
        } else if measured {
            self.clean_streak = self.clean_streak.saturating_add(1);
        }
        let allowed = ctx.constraints.transport_tuning && self.cfg.loss_rto_min_ms > 0;
        let next = match self.rto_advice {
            _ if !allowed => None,
            None if self.loss_streak >= self.cfg.trigger_windows.max(1) => Some(self.cfg.loss_rto_min_ms),
            Some(_) if self.clean_streak >= self.cfg.recover_windows.max(1) => None,
            advice => advice,
        };
        let changed = next != self.rto_advice;
        if changed {
            self.rto_advice_window = next.map(|_| self.window);
        }
        self.rto_advice = next;
        changed
    }

    /// The reasons a new hint carries: the plan's, and the transport advice's.
    fn hint_reasons(&self) -> Vec<String> {
        let mut r = self.reasons.clone();
        if let Some(ms) = self.rto_advice {
            r.push(format!("paths lossy: a {ms} ms floor for TCP retransmission timeouts advised"));
        }
        r
    }

    /// Healthy windows needed before a return to the baseline: `recover_windows`, doubled for
    /// each return in a row that did not last.
    fn recover_needed(&self) -> u32 {
        self.cfg.recover_windows.max(1).saturating_mul(1 << self.restore_backoff.min(MAX_RESTORE_BACKOFF))
    }

    /// The plan this policy advises now.
    pub fn current(&self) -> &PlanChoice {
        &self.current
    }

    /// The last `history_len` decisions, oldest first.
    #[cfg(test)]
    pub fn history(&self) -> impl Iterator<Item = &Decision> {
        self.history.iter()
    }

    /// The hint to publish after `out`, given the job's last published hint: a new version
    /// for a change of plan or of transport advice, the latest one with a new expiry for a
    /// renewal, else `None`.
    pub fn hint(&self, job: &str, out: &PolicyOutput, latest: Option<&Hint>, now_unix_ms: u64) -> Option<Hint> {
        let expires_at = now_unix_ms.saturating_add(self.cfg.hint_ttl_ms);
        let transport_changed = latest.is_some_and(|h| h.tcp_rto_min_ms != self.rto_advice);
        if out.change.is_some() || transport_changed {
            let version = latest.map_or(1, |h| h.version + 1);
            let hint = self.current.to_hint(job, version, self.hint_reasons(), self.confidence, expires_at);
            return Some(Hint { tcp_rto_min_ms: self.rto_advice, ..hint });
        }
        if out.renew {
            return latest.map(|h| Hint { expires_at, ..h.clone() });
        }
        None
    }

    /// Whether the hint is due for renewal at `now_unix_ms`; if so, counts it as renewed (the
    /// caller publishes).
    fn renew_due(&mut self, now_unix_ms: u64) -> bool {
        let due = self.last_publish_ms.is_none_or(|t| now_unix_ms >= t.saturating_add(self.cfg.renew_ms));
        if due {
            self.last_publish_ms = Some(now_unix_ms);
        }
        due
    }

    /// For a job on the board without traffic in this window: its latest hint with a new expiry
    /// when a renewal is due, so an idle job's plan does not go stale.
    pub fn renewal(&mut self, latest: &Hint, now_unix_ms: u64) -> Option<Hint> {
        self.renew_due(now_unix_ms)
            .then(|| Hint { expires_at: now_unix_ms.saturating_add(self.cfg.hint_ttl_ms), ..latest.clone() })
    }

    fn bytes_per_step(&self, ctx: &JobContext, ranks: usize) -> Option<f64> {
        if let Some(b) = ctx.gradient_bytes.filter(|&b| b > 0) {
            return Some(b as f64);
        }
        // What this host receives per step is about the algorithm's per-rank share of the
        // (compressed) buffer: 2(n−1)/n·S' for ring and rhd, 2·S' for a tree.
        let n = ranks.max(2) as f64;
        let share = match self.current.algorithm {
            ringside_client::Algorithm::Tree => 2.0,
            _ => 2.0 * (n - 1.0) / n,
        };
        let wire = self.current.compression.wire_bytes_per_f32() / 4.0;
        self.recent.bytes_per_step().map(|b| b / share / wire)
    }

    fn calibrated(&self, ctx: &JobContext) -> Option<Calibrated> {
        let ranks = self.recent.ranks();
        // No step completed lately (each outlasts the windows): the model is used relatively,
        // so the open step's communication time so far calibrates it as well; the gradient
        // size, unless registered, is the healthy baseline's.
        let comm = self.recent.comm_or_open_s()?;
        let bandwidth_bps = self.recent.bottleneck_bps()?;
        let bytes = self.bytes_per_step(ctx, ranks).or_else(|| median(self.baseline.bytes.iter().copied()))?;
        let lossy = self.recent.max_loss().is_some_and(|l| l >= self.cfg.lossy_ratio);
        let path = PathModel { ranks, bytes, bandwidth_bps, lossy };
        Some(Calibrated::new(self.model.clone(), path, &self.current, comm))
    }

    /// Communication time the healthy baseline predicts for the current plan and gradient size,
    /// seconds: the baseline's median, scaled by the model from (baseline plan, baseline bytes)
    /// to (current plan, current bytes) at the baseline's bottleneck goodput. So a compressed
    /// plan, or a job whose gradient grew, is compared with what it should take when healthy.
    fn healthy_comm_s(&self, cal: Option<&Calibrated>) -> Option<f64> {
        if self.baseline.comm_s.len() < self.cfg.min_baseline_windows.max(1) {
            return None;
        }
        let base = median(self.baseline.comm_s.iter().copied())?;
        let Some(cal) = cal else { return (self.current == self.baseline_plan).then_some(base) };
        let now = PathModel {
            bandwidth_bps: median(self.baseline.bottleneck_bps.iter().copied()).unwrap_or(cal.path.bandwidth_bps),
            lossy: false,
            ..cal.path
        };
        let then = PathModel { bytes: median(self.baseline.bytes.iter().copied()).unwrap_or(now.bytes), ..now };
        let (cur, b) = (self.model.seconds(&self.current, &now), self.model.seconds(&self.baseline_plan, &then));
        (b > 0.0).then(|| base * cur / b)
    }

    fn record(&mut self, d: Decision) {
        if self.history.len() >= self.cfg.history_len.max(1) {
            self.history.pop_front();
        }
        self.history.push_back(d);
    }

    #[allow(clippy::too_many_arguments)]
    fn change(&mut self, kind: DecisionKind, to: PlanChoice, reasons: Vec<String>, confidence: f64, predicted_s: Option<f64>, observed_s: Option<f64>, now: u64) -> Decision {
        let from = self.current;
        if kind == DecisionKind::Adapt {
            self.reverted_a_revert = false;
        }
        let d = Decision {
            unix_ms: now,
            kind,
            from,
            to,
            reasons: reasons.clone(),
            confidence,
            observed_comm_ms: observed_s.map(|s| s * 1e3),
            predicted_comm_ms: predicted_s.map(|s| s * 1e3),
        };
        self.record(d.clone());
        self.current = to;
        self.reasons = reasons;
        self.confidence = confidence;
        self.predicted_s = predicted_s;
        self.last_change_window = Some(self.window);
        self.recent.clear();
        self.reported_steps.clear();
        self.degraded_steps.clear();
        self.degraded_streak = 0;
        self.target_streak = 0;
        self.healthy_streak = 0;
        self.verifying = match (kind, observed_s, predicted_s) {
            (DecisionKind::Adapt, Some(o), Some(p)) => {
                Some(Verification::new(from, o, p, false))
            }
            // A revert is checked too: the time it was judged against may predate the fault (a
            // verdict acts before the old plan was ever observed degraded), so reverting is
            // itself the measurement of the old plan under current conditions.
            (DecisionKind::Revert, Some(o), Some(p)) if !self.reverted_a_revert => {
                Some(Verification::new(from, o, p, true))
            }
            _ => None,
        };
        d
    }

    fn in_cooldown(&self, p: &PlanChoice) -> bool {
        let compressed = p.compression != Codec::None;
        self.cooldown.iter().any(|(c, scope, until)| {
            self.window < *until
                && match scope {
                    Cooling::Plan => c == p,
                    Cooling::Codec => c.compression == p.compression,
                    Cooling::EveryCodec => c == p || compressed,
                }
        })
    }

    /// Whether the plan this policy advises ran throughout the window ending at `now_unix_ms`:
    /// without a report from the job ([`PlanInForce`]) it is assumed to; with one, only when the
    /// reported plan is the advised one and was already running at the window's start. In managed
    /// mode the job runs the services' agreed plan, which can be another agent's advice. The chunk
    /// size is not compared: the policy never changes it, and a job may run its own.
    fn ran_advised_plan(&self, w: &JobWindow, in_force: Option<&PlanInForce>, now_unix_ms: u64) -> bool {
        let start_ms = window_start_ms(w, now_unix_ms);
        in_force.is_none_or(|f| PlanChoice { chunk_bytes: self.current.chunk_bytes, ..f.plan } == self.current && f.since_unix_ms <= start_ms)
    }

    /// Feeds one window of the job with its open verdicts and the plan it reports it runs
    /// (`in_force`, if fresh); `now_unix_ms` is the window's end.
    ///
    /// A window in which the advised plan did not run (another plan was in force, or the plan
    /// changed during it) is attributed to no plan: it does not enter the recent history (which
    /// is cleared), the healthy baseline or a verification, and starts no change or return.
    pub fn observe(&mut self, w: &JobWindow, verdicts: VerdictSummary, ctx: &JobContext, in_force: Option<&PlanInForce>, now_unix_ms: u64) -> PolicyOutput {
        self.window += 1;
        self.cooldown.retain(|(_, _, until)| *until > self.window);
        let obs = WindowObservation::from_window(&self.phases, w, verdicts, &mut self.steps);
        let summary = WindowSummary::of(&obs);
        let ran = self.ran_advised_plan(w, in_force, now_unix_ms);
        // The job's own step time, from a report that came during this window (each report is
        // used once), of steps that all ran the advised plan.
        let start_ms = window_start_ms(w, now_unix_ms);
        let reported_step_s = in_force
            .filter(|f| ran && f.reported_unix_ms > start_ms && f.reported_unix_ms <= now_unix_ms)
            .and_then(|f| f.step_time_ms)
            .map(|ms| ms / 1e3);
        if ran {
            self.recent.push(summary);
            if let Some(s) = reported_step_s {
                push_bounded(&mut self.reported_steps, s, self.cfg.recent_windows);
            }
        } else {
            self.recent.clear();
            self.reported_steps.clear();
            self.degraded_steps.clear();
        }
        let cal = self.calibrated(ctx);
        let comm = self.recent.comm_s();
        let healthy_comm = self.healthy_comm_s(cal.as_ref());
        let ratio = comm.zip(healthy_comm).filter(|(_, h)| *h > 0.0).map(|(c, h)| c / h);

        // Triggers of this window. For a job that takes transport advice, loss is first the
        // advice's to handle (rule 8): until the advice has stood `settle_windows` +
        // `verify_windows` windows, a lossy path, or a gray-failure verdict on one, changes the
        // plan only through what it does to the communication time (CommInflated below), so that
        // a codec is not credited with what a shorter retransmission timeout did; after that, loss
        // that remains is a trigger again, and the codec it brings is judged under the advice.
        let advice_settled = self
            .rto_advice_window
            .is_some_and(|w| self.window.saturating_sub(w) >= self.cfg.settle_windows + self.cfg.verify_windows as u64);
        let transport_handles_loss = ctx.constraints.transport_tuning && self.cfg.loss_rto_min_ms > 0 && !advice_settled;
        let lossy_peers: Vec<IpAddr> = obs.peers.iter().filter(|p| p.loss_ratio.is_some_and(|l| l >= self.cfg.lossy_ratio)).map(|p| p.peer).collect();
        let mut triggers: Vec<Trigger> = Vec::new();
        if obs.uplink_congested {
            triggers.push(Trigger::UplinkCongested);
        }
        for p in &obs.peers {
            match p.loss_ratio {
                Some(loss) if loss >= self.cfg.lossy_ratio => {
                    if !transport_handles_loss {
                        triggers.push(Trigger::LossyPeer { peer: p.peer, loss });
                    }
                }
                _ if obs.verdicts.gray_peers.contains(&p.peer) => triggers.push(Trigger::DegradedPeer { peer: p.peer }),
                _ => {}
            }
        }
        let network = !triggers.is_empty();
        let verdict = !obs.verdicts.congested_links.is_empty()
            || obs.verdicts.gray_peers.iter().any(|g| !(transport_handles_loss && lossy_peers.contains(g)));
        let straggler_only = obs.verdicts.straggler && !network;
        // Longer communication at normal path goodput is waiting for a rank (a straggler the
        // detectors may not have named yet), not the network.
        let path_ratio = match (self.recent.bottleneck_bps(), median(self.baseline.bottleneck_bps.iter().copied())) {
            (Some(now), Some(base)) if base > 0.0 => Some(now / base),
            _ => None,
        };
        let path_slower = path_ratio.is_none_or(|r| r <= self.cfg.path_slow_ratio);
        let inflated = !straggler_only && path_slower && ratio.is_some_and(|r| r >= self.cfg.degrade_ratio);
        if inflated {
            triggers.push(Trigger::CommInflated { ratio: ratio.unwrap_or(0.0) });
        }
        // A slowdown far beyond noise on a path that lost most of its goodput acts at once, as a
        // verdict does (a rate cap the detectors of one host's end of the wire do not name: the
        // IPUs' agents under managed mode took 5.2-5.5 s by the trigger windows).
        let severe = inflated && ratio.is_some_and(|r| r >= self.cfg.severe_degrade_ratio) && path_ratio.is_some_and(|r| r <= self.cfg.severe_path_ratio);
        let degraded = network || inflated;
        self.degraded_streak = if degraded { self.degraded_streak.saturating_add(1) } else { 0 };
        match reported_step_s {
            _ if !degraded => self.degraded_steps.clear(),
            Some(s) if self.degraded_streak >= 2 => push_bounded(&mut self.degraded_steps, s, self.cfg.recent_windows),
            _ => {}
        }
        self.healthy_streak = if ran && !degraded && ratio.is_none_or(|r| r < self.cfg.degrade_ratio) { self.healthy_streak.saturating_add(1) } else { 0 };
        let target_s = ctx.constraints.step_time_target_ms.map(|t| t / 1e3);
        let step = self.recent.step_s();
        let target_missed = !obs.verdicts.straggler && target_s.zip(step).is_some_and(|(t, s)| s > t);
        self.target_streak = if target_missed { self.target_streak.saturating_add(1) } else { 0 };
        // The communication budget the target leaves after compute.
        let budget_s = target_s.zip(step).zip(comm).map(|((t, s), c)| t - (s - c).max(0.0)).filter(|b| *b > 0.0);

        // Healthy baseline under the baseline plan.
        if ran && self.current == self.baseline_plan && self.verifying.is_none() && !degraded && lossy_peers.is_empty() && !obs.verdicts.straggler {
            let bytes = cal.as_ref().map(|c| c.path.bytes);
            if let (Some(c), Some(b), Some(s)) = (summary.comm_s, summary.bottleneck_bps, bytes) {
                let q = &mut self.baseline;
                for (q, v) in [(&mut q.comm_s, c), (&mut q.bottleneck_bps, b), (&mut q.bytes, s)] {
                    push_bounded(q, v, self.cfg.baseline_windows);
                }
            }
        }

        let change = self.decide(ctx, &obs, ran, reported_step_s, cal.as_ref(), &triggers, (verdict || severe, network), target_s, budget_s, step, now_unix_ms);
        let transport_changed = self.advise_transport(ctx, &obs, !lossy_peers.is_empty());

        let renew = change.is_some() || transport_changed || self.renew_due(now_unix_ms);
        let predicted = self.predicted_s.or_else(|| cal.as_ref().map(|c| c.predict(&self.current)));
        // What the tenant sees is the job's time whatever plan ran: this window's own when the
        // window was attributed to no plan (the recent history was cleared).
        let (step_s, comm_s) = if ran { (self.recent.step_s(), self.recent.comm_s()) } else { (summary.step_s, summary.comm_s) };
        // The job's own step time when it reported one lately: packets cannot tell a step whose
        // communication runs in pieces inside it (a synchronous codec) from two steps.
        let step_s = in_force
            .filter(|f| now_unix_ms.saturating_sub(f.reported_unix_ms) <= REPORTED_STEP_FRESH_MS)
            .and_then(|f| f.step_time_ms)
            .map(|ms| ms / 1e3)
            .or(step_s);
        let insight = JobInsight {
            updated_unix_ms: now_unix_ms,
            step_ms: step_s.map(|s| s * 1e3),
            comm_ms: comm_s.map(|s| s * 1e3),
            predicted_comm_ms: predicted.map(|s| s * 1e3),
            peers: obs
                .peers
                .iter()
                .map(|p| PeerHealth {
                    peer: p.peer,
                    health: if p.idle {
                        "idle"
                    } else if p.degraded || p.loss_ratio.is_some_and(|l| l >= self.cfg.lossy_ratio) {
                        "degraded"
                    } else {
                        "healthy"
                    }
                    .into(),
                    goodput_bytes_per_second: p.goodput_bps,
                    loss_ratio: p.loss_ratio,
                })
                .collect(),
        };
        let verified = self.history.back().filter(|d| d.kind == DecisionKind::Verified && d.unix_ms == now_unix_ms).cloned();
        PolicyOutput { change, renew, insight, verified }
    }

    #[allow(clippy::too_many_arguments)]
    fn decide(
        &mut self,
        ctx: &JobContext,
        obs: &WindowObservation,
        ran: bool,
        reported_step_s: Option<f64>,
        cal: Option<&Calibrated>,
        triggers: &[Trigger],
        (act_now, network): (bool, bool),
        target_s: Option<f64>,
        budget_s: Option<f64>,
        step_s: Option<f64>,
        now: u64,
    ) -> Option<Decision> {
        let since_change = self.last_change_window.map_or(u64::MAX, |w| self.window - w);

        // Verification of the last change.
        if let Some(v) = self.verifying.as_mut() {
            // Only windows in which the plan under test ran are measurements of it.
            if since_change > self.cfg.settle_windows && ran {
                v.ran_windows += 1;
                // An open step's communication time so far is a lower bound: a measurement only
                // when it already exceeds the time the plan is judged against (no step of a plan
                // completes on a path too slow for it).
                if let Some(c) = obs.comm_s().or(obs.open_comm_s.filter(|&c| c > v.from_comm_s)) {
                    v.samples.push(c);
                }
                v.step_samples.extend(reported_step_s);
            }
            // With the old plan's step time known, the job's own step times judge the change: wait
            // for `MIN_STEP_SAMPLES` of them too (until the time-out), or a job whose steps
            // outlast the windows would be judged on communication time alone (a PyTorch job's
            // int8 under uplink congestion: 2.3 s steps, one report in the 3 windows).
            let steps_pending = v.from_step_s.is_some() && v.step_samples.len() < MIN_STEP_SAMPLES;
            let enough = v.samples.len() >= self.cfg.verify_windows.max(1) && !steps_pending;
            let timed_out = v.ran_windows > 3 * self.cfg.verify_windows.max(1) as u64;
            if !enough && !timed_out {
                // A plan the job never ran (another was in force the whole time) cannot be
                // judged: after a cooldown's length the change stands unverified.
                if since_change > self.cfg.settle_windows + self.cfg.cooldown_windows {
                    self.verifying = None;
                }
                return None;
            }
            let v = self.verifying.take()?;
            let after = median(v.samples.iter().copied()).unwrap_or(f64::INFINITY);
            let g = self.cfg.verify_min_gain;
            // The job's own step times, when it reports them (before the change and in enough of
            // the windows since): what the job lives by, including what the network cannot show
            // (a codec's CPU time, the overlap with computation it gives up).
            let after_step = (v.step_samples.len() >= MIN_STEP_SAMPLES).then(|| median(v.step_samples.iter().copied())).flatten();
            let steps = v.from_step_s.zip(after_step);
            let to = self.current;
            if v.revert {
                // Undo the revert only when the plan it left was clearly faster than the one it
                // went back to (within `verify_min_gain`, the original plan is preferred): by the
                // job's step times when known, else by communication time. No step completed at
                // all in the verification windows counts as slower: on a capped path the original
                // plan's steps can outlast the windows.
                let slower = match steps {
                    Some((left, now_step)) => now_step * (1.0 - g) >= left,
                    None => after * (1.0 - g) >= v.from_comm_s,
                };
                if slower {
                    self.cooldown.retain(|(p, _, _)| *p != v.from);
                    if v.from.compression != Codec::None {
                        self.cooldown.retain(|(_, scope, _)| *scope != Cooling::EveryCodec);
                    }
                    let reason = match steps {
                        Some((left, now_step)) => format!(
                            "back to {}: the job's steps are slower with {} under the current conditions ({:.0} ms vs {:.0} ms, as the job reports)",
                            v.from.label(),
                            to.label(),
                            now_step * 1e3,
                            left * 1e3
                        ),
                        None if after.is_finite() => format!(
                            "back to {}: {} is slower under the current conditions ({:.0} ms vs {:.0} ms)",
                            v.from.label(),
                            to.label(),
                            after * 1e3,
                            v.from_comm_s * 1e3
                        ),
                        None => format!("back to {}: no step of {} completed under the current conditions", v.from.label(), to.label()),
                    };
                    self.reverted_a_revert = true;
                    let d = self.change(DecisionKind::Revert, v.from, vec![reason], 0.9, Some(v.from_comm_s), after.is_finite().then_some(after), now);
                    // Judged against what was just measured, like an adaptation.
                    self.verifying = Some(Verification { from_step_s: after_step, ..Verification::new(to, after, v.from_comm_s, false) });
                    return Some(d);
                }
                return None;
            }
            let comm_cut = after <= v.from_comm_s * (1.0 - g);
            // With the job's step times: kept when its steps got `verify_min_gain` faster, or
            // communication fell that much and the steps got faster at all.
            let kept = match steps {
                Some((before, now_step)) => now_step <= before * (1.0 - g) || (comm_cut && now_step < before),
                None => comm_cut,
            };
            if kept {
                let comm = if after.is_finite() {
                    format!(
                        "{} cut communication time from {:.0} ms to {:.0} ms (predicted {:.0} ms)",
                        to.compression,
                        v.from_comm_s * 1e3,
                        after * 1e3,
                        v.predicted_s * 1e3
                    )
                } else {
                    format!("{}: communication time not measured (no step seen in the windows)", to.compression)
                };
                let reason = match steps {
                    Some((before, now_step)) => format!("{comm}; the job's steps went from {:.0} ms to {:.0} ms", before * 1e3, now_step * 1e3),
                    None => comm,
                };
                let d = Decision {
                    unix_ms: now,
                    kind: DecisionKind::Verified,
                    from: v.from,
                    to,
                    reasons: vec![reason],
                    confidence: self.confidence,
                    observed_comm_ms: after.is_finite().then_some(after * 1e3),
                    predicted_comm_ms: Some(v.predicted_s * 1e3),
                };
                if after.is_finite() {
                    self.predicted_s = Some(after);
                }
                self.record(d);
                return None;
            }
            let what = if to.compression != v.from.compression { to.compression.to_string() } else { to.label() };
            let reason = match steps {
                Some((before, now_step)) if comm_cut => format!(
                    "reverted: {what} cut communication time ({:.0} ms vs {:.0} ms) but not the job's step time ({:.0} ms vs {:.0} ms, as the job reports)",
                    after * 1e3,
                    v.from_comm_s * 1e3,
                    now_step * 1e3,
                    before * 1e3
                ),
                Some((before, now_step)) => format!(
                    "reverted: {what} did not reduce the job's step time ({:.0} ms vs {:.0} ms, as the job reports)",
                    now_step * 1e3,
                    before * 1e3
                ),
                None if v.samples.is_empty() => format!("reverted: {what} could not be verified (no training steps observed)"),
                None => format!("reverted: {what} did not reduce communication time ({:.0} ms vs {:.0} ms)", after * 1e3, v.from_comm_s * 1e3),
            };
            if self.cooldown.len() >= MAX_COOLDOWN {
                self.cooldown.remove(0);
            }
            // Compression that did not cut communication time means the job is not bound by
            // its wire bytes now: no codec is retried during the cooldown, not only this one.
            // One that cut it but cost the job's steps more is this codec's cost: another codec
            // may still pay off.
            let scope = if comm_cut && to.compression != Codec::None {
                Cooling::Codec
            } else if to.compression != Codec::None && v.from.compression == Codec::None {
                Cooling::EveryCodec
            } else {
                Cooling::Plan
            };
            self.cooldown.push((to, scope, self.window + self.cfg.cooldown_windows));
            let observed = after.is_finite().then_some(after);
            let d = self.change(DecisionKind::Revert, v.from, vec![reason], 0.9, Some(v.from_comm_s), observed, now);
            if let Some(rv) = self.verifying.as_mut() {
                rv.from_step_s = after_step;
            }
            return Some(d);
        }
        // A return to the baseline that stood for twice the wait before it was a recovery.
        if self.current == self.baseline_plan && self.last_restore_window.is_some_and(|w| self.window - w > 2 * u64::from(self.recover_needed())) {
            self.last_restore_window = None;
            self.restore_backoff = 0;
        }
        if since_change < self.cfg.min_dwell_windows || !ran {
            return None;
        }

        let act_degraded = act_now || self.degraded_streak >= self.cfg.trigger_windows.max(1);
        let act_target = self.target_streak >= self.cfg.trigger_windows.max(1);
        if act_degraded || act_target {
            let cal = cal?;
            // What the change is verified against: the degraded time. A severe verdict acts in the
            // fault's first window, when the recent median is still the healthy time, so take the
            // larger of it and this window's (the open step's so far when none completed: the
            // first step under a rate cap can outlast the window).
            let observed = larger_known(obs.comm_or_open_s(), self.recent.comm_or_open_s());
            // The same for the job's own step time, when it reports it. For a degraded job: the
            // reports of the degraded streak after its first window that are no shorter than the
            // degraded communication time (a report covers the second before it, so in the
            // fault's first window it still describes the healthy steps, and no step of the old
            // plan under the fault is shorter than its communication). Against the healthy step
            // time no plan could win (session 26: int8 reverted for "829 ms vs 150 ms"); on
            // communication time alone a codec whose CPU time or lost overlap costs the job more
            // than the wire time it saves would stay (int8 kept at 890 ms steps against 381 ms
            // uncompressed, the agent seeing communication cut from 73 to 21 ms). So a job that
            // reports step times is changed once it has reported one under the fault, or after
            // `STEP_BASELINE_WAIT_WINDOWS` degraded windows without one (its steps outlast them),
            // and then verified on communication time alone.
            let from_step = if act_degraded {
                median(self.degraded_steps.iter().copied().filter(|&s| observed.is_none_or(|c| s >= c)))
            } else {
                larger_known(reported_step_s, median(self.reported_steps.iter().copied()))
            };
            if act_degraded && from_step.is_none() && !self.reported_steps.is_empty() && self.degraded_streak < STEP_BASELINE_WAIT_WINDOWS {
                return None;
            }
            let cands: Vec<PlanChoice> = candidates(ctx.constraints, &self.baseline_plan, self.cfg.topk_ratio, self.cfg.max_channels)
                .into_iter()
                .filter(|p| !self.in_cooldown(p))
                .collect();
            let choice = choose(&cands, |p| cal.predict(p), if act_target { budget_s } else { None }, self.cfg.lossy_slack, &self.baseline_plan)?;
            let now_s = cal.predict(&self.current);
            if choice.plan == self.current || choice.predicted_s > now_s * (1.0 - self.cfg.min_improvement) {
                return None;
            }
            let mut reasons: Vec<String> = triggers.iter().map(ToString::to_string).collect();
            if act_target {
                if let (Some(t), Some(s)) = (target_s, step_s) {
                    reasons.push(Trigger::TargetMissed { target_ms: t * 1e3, observed_ms: s * 1e3 }.to_string());
                }
            }
            reasons.push(format!(
                "{} predicted to cut communication time from {:.0} ms to {:.0} ms",
                choice.plan.label(),
                now_s * 1e3,
                choice.predicted_s * 1e3
            ));
            let gain = 1.0 - choice.predicted_s / now_s;
            let mut confidence = (0.3 + gain).min(0.9);
            if !cal.trusted() {
                confidence *= 0.7;
            }
            if !network {
                confidence *= 0.9;
            }
            // Leaving a baseline the policy returned to lately: that return was a probe the
            // fault outlasted (a rate cap the compressed job fitted under shows no evidence), so
            // the next one waits twice as long.
            if self.current == self.baseline_plan && self.last_restore_window.take().is_some() {
                self.restore_backoff = (self.restore_backoff + 1).min(MAX_RESTORE_BACKOFF);
            }
            let d = self.change(DecisionKind::Adapt, choice.plan, reasons, confidence, Some(choice.predicted_s), observed, now);
            if let Some(v) = self.verifying.as_mut() {
                v.from_step_s = from_step;
            }
            return Some(d);
        }

        if self.current != self.baseline_plan && !network && self.healthy_streak >= self.recover_needed() {
            let baseline_s = cal.map(|c| c.predict(&self.baseline_plan));
            // With a target, only when the baseline is predicted to meet it with a margin (no
            // flapping on a borderline target).
            let margin = 1.0 - self.cfg.verify_min_gain;
            if target_s.is_some() && baseline_s.zip(budget_s).is_none_or(|(p, b)| p > b * margin) {
                return None;
            }
            let mut reason = if target_s.is_some() {
                format!("healthy for {} windows and the original plan meets the step time target: back to it", self.healthy_streak)
            } else {
                format!("network healthy again for {} windows: back to the original plan", self.healthy_streak)
            };
            if self.restore_backoff > 0 {
                reason.push_str(&format!(
                    " (waited {}x as long: the last {} did not last)",
                    1u32 << self.restore_backoff.min(MAX_RESTORE_BACKOFF),
                    if self.restore_backoff == 1 { "return".to_string() } else { format!("{} returns", self.restore_backoff) }
                ));
            }
            self.last_restore_window = Some(self.window);
            let baseline = self.baseline_plan;
            let observed = self.recent.comm_s();
            let d = self.change(DecisionKind::Restore, baseline, vec![reason], 0.8, baseline_s, observed, now);
            // The baseline's own history predicts it better than a model calibrated on another plan.
            self.predicted_s = None;
            return Some(d);
        }
        None
    }
}
