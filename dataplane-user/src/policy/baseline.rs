//! The baseline plan: what a job does without ringside, the hint every job starts from when the
//! job catalog onboards it (confidence 0), and the version that first hint carries.
//!
//! Versions: a job registered while this agent runs starts at [`FIRST_VERSION`]. A job onboarded
//! at start that a previous run may already have published hints for (a restored registered job,
//! a config-file `[[job]]`) starts at [`restart_first_version`], the start time in unix ms, so its
//! versions exceed the previous run's and tenant followers — which ignore a version not newer
//! than the last they applied — take the new plans at once (issue 11).
use ringside_client::{Algorithm, Codec, Hint};

/// How long the baseline hint of a new job is valid before the policy must renew it.
pub const BASELINE_HINT_TTL_MS: u64 = 60_000;

/// The version of a newly registered job's first hint.
pub const FIRST_VERSION: u64 = 1;

/// The first version of a job onboarded at an agent start at `start_unix_ms` that an earlier run
/// may have published for: the start time itself, in unix ms (at least [`FIRST_VERSION`]).
///
/// Guarantee, with no write per plan change: a previous run that started at `T0` onboarded the
/// job at version `≤ T0` (restored or config job) or 1 (registered during that run), and each
/// plan change adds 1, so its last version is at most `T0 + k` for `k` plan changes. This start
/// at `T1` publishes above it whenever `k < T1 − T0` by the wall clock: the previous run changed
/// the job's plan fewer times than the milliseconds between the two starts. The policy changes a
/// plan at most once per window, and a window lasts at least 1 ms (`[detect] window_ms` ≥
/// `poll_interval_ms` ≥ 1, checked by the config), so `k` ≤ the previous run's uptime in ms
/// < `T1 − T0`: only a wall clock stepped backwards between the two starts can break it. Values stay far below 2^53
/// (≈ 1.8·10^12 in 2027), so JSON readers that hold numbers as doubles, the `ringside_job_plan_version`
/// gauge and the Python follower's float64 broadcast keep them exact.
pub fn restart_first_version(start_unix_ms: u64) -> u64 {
    start_unix_ms.max(FIRST_VERSION)
}

/// The hint a job gets when onboarded: what a job does without ringside, at confidence 0, with
/// version `version` ([`FIRST_VERSION`] or [`restart_first_version`]).
pub fn baseline_hint(job: &str, version: u64, now_unix_ms: u64) -> Hint {
    Hint {
        job: job.to_owned(),
        version,
        step_from: 0,
        algorithm: Algorithm::Ring,
        chunk_bytes: 1 << 20,
        channels: 1,
        compression: Codec::None,
        error_feedback: false,
        reasons: vec!["initial plan: no measurements yet".to_owned()],
        confidence: 0.0,
        expires_at: now_unix_ms + BASELINE_HINT_TTL_MS,
        tcp_rto_min_ms: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_hint_is_the_plain_plan() {
        let h = baseline_hint("j-1", FIRST_VERSION, 1_000);
        assert_eq!((h.version, h.algorithm, h.chunk_bytes, h.channels, h.compression), (1, Algorithm::Ring, 1 << 20, 1, Codec::None));
        assert_eq!((h.confidence, h.expires_at), (0.0, 61_000));
        assert_eq!(h.reasons, vec!["initial plan: no measurements yet"]);
    }

    #[test]
    fn a_restart_starts_above_every_version_of_the_previous_run() {
        // Previous run: started at t0 (restored job at version t0), then one plan change per
        // 1 s window for its whole uptime, the most the policy can publish.
        let t0 = 1_790_000_000_000;
        let t1 = t0 + 3_600_000;
        let last_before = restart_first_version(t0) + (t1 - t0) / 1_000;
        assert!(restart_first_version(t1) > last_before);
        // A job registered during the previous run started at 1: also below.
        assert!(restart_first_version(t1) > FIRST_VERSION + (t1 - t0) / 1_000);
        // Even at one change per ms, k < t1 − t0 changes stay below.
        assert!(restart_first_version(t1) > restart_first_version(t0) + (t1 - t0 - 1));
        // A clock at 0 (no RTC) still gives a valid first version.
        assert_eq!(restart_first_version(0), FIRST_VERSION);
        // Exact as a double (JSON numbers in JavaScript, the f64 metrics gauge, float64 tensors).
        assert!(restart_first_version(t1) < 1 << 53);
        assert_eq!(restart_first_version(t1) as f64 as u64, restart_first_version(t1));
    }
}
