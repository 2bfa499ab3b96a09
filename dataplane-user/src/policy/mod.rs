//! Policy: turns what the detectors and the flow windows say about a job into the plan ringside
//! recommends for its collectives (algorithm, channels, gradient compression), within the
//! tenant's [`Constraints`](ringside_client::Constraints). See `docs/policy.md`.
//!
//! - [`observe`]: per window, per-peer in-burst goodput and loss ratio, the job's step and
//!   communication time, and which peers open verdicts name;
//! - [`cost`]: the alpha-beta model of one allreduce per algorithm × codec × channels, calibrated
//!   to the job's observed communication time;
//! - [`decide`]: the candidate plans the constraints allow, the choice among them, the reasons;
//! - [`job_policy`]: [`JobPolicy`], the per-job state machine (triggers, hysteresis, dwell,
//!   verification and revert, return to baseline);
//! - [`config`]: [`PolicyConfig`], every parameter with its default;
//! - [`baseline`]: the plan every job starts from; [`insight`]: what a tenant sees of its job.
//!
//! Invariants: pure and deterministic (no I/O, no clock: window times and `now_unix_ms` come in
//! as arguments); bounded memory per job and at most [`PolicyConfig::max_jobs`] jobs in
//! [`JobPolicies`]; reasons never name links, interfaces or other jobs.

pub mod baseline;
pub mod config;
pub mod cost;
pub mod decide;
pub mod insight;
pub mod job_policy;
pub mod observe;

#[cfg(test)]
mod scenarios;

use std::collections::{BTreeMap, BTreeSet};

pub use config::PolicyConfig;
pub use cost::PlanChoice;
pub use baseline::{baseline_hint, restart_first_version, FIRST_VERSION};
pub use insight::{JobInsight, PeerHealth};
pub use job_policy::{JobContext, JobPolicy, PlanInForce};
pub use observe::{PhaseParams, VerdictSummary};

/// The policies of the jobs on the hint board, keyed by job id.
#[derive(Debug, Default)]
pub struct JobPolicies {
    cfg: PolicyConfig,
    phases: PhaseParams,
    jobs: BTreeMap<String, JobPolicy>,
}

impl JobPolicies {
    pub fn new(cfg: PolicyConfig, phases: PhaseParams) -> Self {
        JobPolicies { cfg, phases, jobs: BTreeMap::new() }
    }

    /// Forgets the policies of jobs not in `live` (jobs that left the board).
    pub fn retain(&mut self, live: &BTreeSet<String>) {
        self.jobs.retain(|j, _| live.contains(j));
    }

    /// The job's policy, created with `baseline` (its registered hint's plan) on first use;
    /// `None` when `max_jobs` policies exist already.
    pub fn policy(&mut self, job: &str, baseline: impl FnOnce() -> PlanChoice) -> Option<&mut JobPolicy> {
        if !self.jobs.contains_key(job) {
            if self.jobs.len() >= self.cfg.max_jobs {
                return None;
            }
            self.jobs.insert(job.to_owned(), JobPolicy::new(self.cfg.clone(), self.phases.clone(), baseline()));
        }
        self.jobs.get_mut(job)
    }

    /// The existing policy of `job`, if any.
    pub fn get_mut(&mut self, job: &str) -> Option<&mut JobPolicy> {
        self.jobs.get_mut(job)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringside_client::{Algorithm, Codec};

    #[test]
    fn policies_are_bounded_and_forgotten_with_their_job() {
        let base = PlanChoice { algorithm: Algorithm::Ring, chunk_bytes: 1 << 20, channels: 1, compression: Codec::None, error_feedback: false };
        let mut ps = JobPolicies::new(PolicyConfig { max_jobs: 2, ..Default::default() }, PhaseParams::default());
        assert!(ps.policy("a", || base).is_some());
        assert!(ps.policy("b", || base).is_some());
        assert!(ps.policy("c", || base).is_none(), "bounded");
        assert!(ps.policy("a", || unreachable!()).is_some(), "existing policies are kept");
        ps.retain(&["b".to_owned()].into());
        assert_eq!(ps.len(), 1);
        assert!(ps.policy("c", || base).is_some());
    }
}
