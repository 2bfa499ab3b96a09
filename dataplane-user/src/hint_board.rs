//! Where the policy publishes each job's current [`Hint`] and what the tenant API reads.
//!
//! A [`HintBoard`] is a cheap handle (clones share one board). The job catalog creates and drops
//! a job's channel when it onboards or removes the job; the analysis stage (policy) calls
//! [`HintBoard::publish_window`] once per window with the plan changes, renewals and insights;
//! API handlers read [`HintBoard::latest`] / [`HintBoard::insight`] and subscribe to changes with
//! [`HintBoard::subscribe`] (a `tokio::sync::watch` channel, so a slow SSE client only ever sees
//! the newest hint and never holds memory for missed ones).
//!
//! The board's own mutex guards only the job → channel map; it is held for map lookups and
//! `send_replace`, never across I/O or an `.await`, so neither the analysis stage nor a handler
//! waits on the other for longer than that.
//!
//! Invariants: at most one channel per registered job (created by [`HintBoard::ensure_job`],
//! dropped by [`HintBoard::remove_job`], which ends every stream of that job); `version`s of a
//! job's published hints strictly increase; the plan history is bounded by [`HISTORY_LEN`].
use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use ringside_client::{Hint, APPLIED_PLAN_TTL_MS};
use tokio::sync::watch;

use crate::policy::{JobInsight, PlanChoice, PlanInForce};

/// Plan changes remembered per job (for verification and the operator's view).
pub const HISTORY_LEN: usize = 32;

#[derive(Debug)]
struct JobChannel {
    tx: watch::Sender<Option<Hint>>,
    history: VecDeque<Hint>,
    insight: Option<JobInsight>,
    /// The job's last report of the plan it runs.
    applied: Option<PlanInForce>,
}

/// Current hints of every registered job (a shared handle: clones see the same board).
#[derive(Debug, Clone, Default)]
pub struct HintBoard {
    jobs: Arc<Mutex<BTreeMap<String, JobChannel>>>,
}

/// One window's output of a job's policy: a new or renewed hint, and the job's insight.
pub type JobUpdate = (String, Option<Hint>, Option<JobInsight>);

/// Publishing for a job the board does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job {job} is not registered on the hint board: call ensure_job when the job is registered")]
pub struct UnknownJob {
    pub job: String,
}

impl HintBoard {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, JobChannel>> {
        // A panic elsewhere must not take the hints down: the map is consistent after every call.
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates the job's channel (no hint yet) if it does not exist.
    pub fn ensure_job(&self, job: &str) {
        self.lock().entry(job.to_owned()).or_insert_with(|| JobChannel {
            tx: watch::channel(None).0,
            history: VecDeque::new(),
            insight: None,
            applied: None,
        });
    }

    /// Forgets the job; its subscribers see the channel close.
    pub fn remove_job(&self, job: &str) {
        self.lock().remove(job);
    }

    /// The jobs on the board, in name order.
    pub fn jobs(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    pub fn contains(&self, job: &str) -> bool {
        self.lock().contains_key(job)
    }

    /// Publishes one window's updates under one lock. A job that left the board since the window
    /// was taken (deleted through the API meanwhile) is skipped: that is not an error.
    pub fn publish_window(&self, updates: Vec<JobUpdate>) {
        let mut jobs = self.lock();
        for (job, hint, insight) in updates {
            let Some(ch) = jobs.get_mut(&job) else { continue };
            if let Some(h) = hint {
                ch.publish(h);
            }
            if let Some(i) = insight {
                ch.insight = Some(i);
            }
        }
    }

    /// Publishes `hint` as the job's current one. A hint whose `version` equals the current one
    /// renews it (new `expires_at`) without entering the history.
    pub fn publish(&self, hint: Hint) -> Result<(), UnknownJob> {
        let mut jobs = self.lock();
        let ch = jobs.get_mut(&hint.job).ok_or_else(|| UnknownJob { job: hint.job.clone() })?;
        ch.publish(hint);
        Ok(())
    }

    pub fn latest(&self, job: &str) -> Option<Hint> {
        self.lock().get(job).and_then(|c| c.tx.borrow().clone())
    }

    /// The job's last [`HISTORY_LEN`] plans, oldest first.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn history(&self, job: &str) -> Vec<Hint> {
        self.lock().get(job).map(|c| c.history.iter().cloned().collect()).unwrap_or_default()
    }

    /// A receiver that wakes on every publish (including renewals); `None` for an unknown job.
    pub fn subscribe(&self, job: &str) -> Option<watch::Receiver<Option<Hint>>> {
        self.lock().get(job).map(|c| c.tx.subscribe())
    }

    pub fn set_insight(&self, job: &str, insight: JobInsight) -> Result<(), UnknownJob> {
        let mut jobs = self.lock();
        let ch = jobs.get_mut(job).ok_or_else(|| UnknownJob { job: job.to_owned() })?;
        ch.insight = Some(insight);
        Ok(())
    }

    pub fn insight(&self, job: &str) -> Option<JobInsight> {
        self.lock().get(job).and_then(|c| c.insight.clone())
    }

    /// Records the job's report that it runs `plan` (`PUT /v1/jobs/{id}/plan`) at `now_unix_ms`,
    /// with the job's own mean step time since its previous report if it sent one. Returns
    /// whether the plan differs from the last fresh report (then it counts from now).
    pub fn report_applied(&self, job: &str, plan: PlanChoice, step_time_ms: Option<f64>, now_unix_ms: u64) -> Result<bool, UnknownJob> {
        let mut jobs = self.lock();
        let ch = jobs.get_mut(job).ok_or_else(|| UnknownJob { job: job.to_owned() })?;
        let since = ch.applied.filter(|f| f.plan == plan && report_is_fresh(f.reported_unix_ms, now_unix_ms)).map(|f| f.since_unix_ms);
        ch.applied = Some(PlanInForce { plan, since_unix_ms: since.unwrap_or(now_unix_ms), reported_unix_ms: now_unix_ms, step_time_ms });
        Ok(since.is_none())
    }

    /// The plan the job last reported it runs, unless that report is older than
    /// [`APPLIED_PLAN_TTL_MS`] at `now_unix_ms`.
    pub fn applied(&self, job: &str, now_unix_ms: u64) -> Option<PlanInForce> {
        let jobs = self.lock();
        let f = jobs.get(job)?.applied?;
        report_is_fresh(f.reported_unix_ms, now_unix_ms).then_some(f)
    }
}

/// Whether a plan report received at `at` (unix ms) still counts at `now`.
fn report_is_fresh(at: u64, now: u64) -> bool {
    now.saturating_sub(at) <= APPLIED_PLAN_TTL_MS
}

impl JobChannel {
    fn publish(&mut self, hint: Hint) {
        let renew = self.history.back().is_some_and(|h| h.version == hint.version);
        if renew {
            self.history.pop_back();
        } else if self.history.len() == HISTORY_LEN {
            self.history.pop_front();
        }
        self.history.push_back(hint.clone());
        self.tx.send_replace(Some(hint));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(job: &str, version: u64, expires_at: u64) -> Hint {
        Hint { version, expires_at, ..crate::policy::baseline_hint(job, version, 0) }
    }

    #[test]
    fn publish_renew_subscribe_and_remove() {
        let b = HintBoard::default();
        assert!(b.publish(hint("j1", 1, 10)).is_err());
        b.ensure_job("j1");
        let mut rx = b.subscribe("j1").unwrap();
        assert!(b.latest("j1").is_none());
        b.publish(hint("j1", 1, 10)).unwrap();
        assert!(rx.has_changed().unwrap());
        assert_eq!(rx.borrow_and_update().as_ref().unwrap().version, 1);
        b.publish(hint("j1", 1, 20)).unwrap(); // renewal
        b.publish(hint("j1", 2, 30)).unwrap();
        assert_eq!(b.history("j1").iter().map(|h| (h.version, h.expires_at)).collect::<Vec<_>>(), vec![(1, 20), (2, 30)]);
        for v in 3..3 + HISTORY_LEN as u64 {
            b.publish(hint("j1", v, v)).unwrap();
        }
        assert_eq!(b.history("j1").len(), HISTORY_LEN);
        b.remove_job("j1");
        assert!(rx.has_changed().is_err(), "the stream ends when the job goes");
        assert!(b.subscribe("j1").is_none());
    }

    #[test]
    fn a_reported_plan_counts_from_its_first_report_until_it_goes_stale() {
        let b = HintBoard::default();
        let none = PlanChoice::from_hint(&hint("j1", 1, 0));
        let int8 = PlanChoice { compression: ringside_client::Codec::Int8, ..none };
        let f = |plan, since_unix_ms, reported_unix_ms, step_time_ms| Some(PlanInForce { plan, since_unix_ms, reported_unix_ms, step_time_ms });
        assert!(b.report_applied("j1", none, None, 1_000).is_err(), "unknown job");
        b.ensure_job("j1");
        assert_eq!(b.applied("j1", 1_000), None);
        assert!(b.report_applied("j1", none, None, 1_000).unwrap());
        assert!(!b.report_applied("j1", none, Some(120.0), 6_000).unwrap(), "the same plan again is a refresh");
        assert_eq!(b.applied("j1", 7_000), f(none, 1_000, 6_000, Some(120.0)), "the newest report's step time");
        assert!(b.report_applied("j1", int8, None, 8_000).unwrap());
        assert_eq!(b.applied("j1", 8_000), f(int8, 8_000, 8_000, None), "a new plan comes without the old one's step time");
        assert_eq!(b.applied("j1", 8_000 + APPLIED_PLAN_TTL_MS), f(int8, 8_000, 8_000, None));
        assert_eq!(b.applied("j1", 8_001 + APPLIED_PLAN_TTL_MS), None, "stale");
        assert!(b.report_applied("j1", int8, None, 9_000 + APPLIED_PLAN_TTL_MS).unwrap(), "after a gap the plan counts anew");
        b.remove_job("j1");
        assert_eq!(b.applied("j1", 1_000), None);
    }
}
