//! Where the policy publishes each job's current [`Hint`] and what the tenant API reads.
//!
//! One [`HintBoard`] lives in the agent state. The detection thread (policy) calls
//! [`HintBoard::publish`] when a job's plan changes (or to renew `expires_at`) and
//! [`HintBoard::set_insight`] every window; API handlers read [`HintBoard::latest`] /
//! [`HintBoard::insight`] and subscribe to changes with [`HintBoard::subscribe`] (a
//! `tokio::sync::watch` channel, so a slow SSE client only ever sees the newest hint and never
//! holds memory for missed ones).
//!
//! Invariants: at most one channel per registered job (created by [`HintBoard::ensure_job`],
//! dropped by [`HintBoard::remove_job`], which ends every stream of that job); `version`s of a
//! job's published hints strictly increase; the plan history is bounded by [`HISTORY_LEN`].
use std::collections::{BTreeMap, VecDeque};

use ringside_client::Hint;
use tokio::sync::watch;

use crate::policy::JobInsight;

/// Plan changes remembered per job (for verification and the operator's view).
pub const HISTORY_LEN: usize = 32;

#[derive(Debug)]
struct JobChannel {
    tx: watch::Sender<Option<Hint>>,
    history: VecDeque<Hint>,
    insight: Option<JobInsight>,
}

/// Current hints of every registered job.
#[derive(Debug, Default)]
pub struct HintBoard {
    jobs: BTreeMap<String, JobChannel>,
}

/// Publishing for a job the board does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job {job} is not registered on the hint board: call ensure_job when the job is registered")]
pub struct UnknownJob {
    pub job: String,
}

impl HintBoard {
    /// Creates the job's channel (no hint yet) if it does not exist.
    pub fn ensure_job(&mut self, job: &str) {
        self.jobs.entry(job.to_owned()).or_insert_with(|| JobChannel {
            tx: watch::channel(None).0,
            history: VecDeque::new(),
            insight: None,
        });
    }

    /// Forgets the job; its subscribers see the channel close.
    pub fn remove_job(&mut self, job: &str) {
        self.jobs.remove(job);
    }

    pub fn jobs(&self) -> impl Iterator<Item = &str> {
        self.jobs.keys().map(String::as_str)
    }

    /// Publishes `hint` as the job's current one. A hint whose `version` equals the current one
    /// renews it (new `expires_at`) without entering the history.
    pub fn publish(&mut self, hint: Hint) -> Result<(), UnknownJob> {
        let ch = self.jobs.get_mut(&hint.job).ok_or_else(|| UnknownJob { job: hint.job.clone() })?;
        let renew = ch.history.back().is_some_and(|h| h.version == hint.version);
        if renew {
            ch.history.pop_back();
        } else if ch.history.len() == HISTORY_LEN {
            ch.history.pop_front();
        }
        ch.history.push_back(hint.clone());
        ch.tx.send_replace(Some(hint));
        Ok(())
    }

    pub fn latest(&self, job: &str) -> Option<Hint> {
        self.jobs.get(job).and_then(|c| c.tx.borrow().clone())
    }

    /// The job's last [`HISTORY_LEN`] plans, oldest first.
    pub fn history(&self, job: &str) -> Vec<Hint> {
        self.jobs.get(job).map(|c| c.history.iter().cloned().collect()).unwrap_or_default()
    }

    /// A receiver that wakes on every publish (including renewals); `None` for an unknown job.
    pub fn subscribe(&self, job: &str) -> Option<watch::Receiver<Option<Hint>>> {
        self.jobs.get(job).map(|c| c.tx.subscribe())
    }

    pub fn set_insight(&mut self, job: &str, insight: JobInsight) -> Result<(), UnknownJob> {
        let ch = self.jobs.get_mut(job).ok_or_else(|| UnknownJob { job: job.to_owned() })?;
        ch.insight = Some(insight);
        Ok(())
    }

    pub fn insight(&self, job: &str) -> Option<JobInsight> {
        self.jobs.get(job).and_then(|c| c.insight.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(job: &str, version: u64, expires_at: u64) -> Hint {
        Hint { version, expires_at, ..crate::policy::baseline_hint(job, 0) }
    }

    #[test]
    fn publish_renew_subscribe_and_remove() {
        let mut b = HintBoard::default();
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
}
