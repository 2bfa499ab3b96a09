//! The baseline plan: what a job does without ringside, the hint every job starts from when the
//! job catalog onboards it (version 1, confidence 0).
use ringside_client::{Algorithm, Codec, Hint};

/// How long the baseline hint of a new job is valid before the policy must renew it.
pub const BASELINE_HINT_TTL_MS: u64 = 60_000;

/// The hint a job gets at registration: what a job does without ringside, at confidence 0.
pub fn baseline_hint(job: &str, now_unix_ms: u64) -> Hint {
    Hint {
        job: job.to_owned(),
        version: 1,
        step_from: 0,
        algorithm: Algorithm::Ring,
        chunk_bytes: 1 << 20,
        channels: 1,
        compression: Codec::None,
        error_feedback: false,
        reasons: vec!["initial plan: no measurements yet".to_owned()],
        confidence: 0.0,
        expires_at: now_unix_ms + BASELINE_HINT_TTL_MS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_hint_is_the_plain_plan() {
        let h = baseline_hint("j-1", 1_000);
        assert_eq!((h.version, h.algorithm, h.chunk_bytes, h.channels, h.compression), (1, Algorithm::Ring, 1 << 20, 1, Codec::None));
        assert_eq!((h.confidence, h.expires_at), (0.0, 61_000));
        assert_eq!(h.reasons, vec!["initial plan: no measurements yet"]);
    }
}
