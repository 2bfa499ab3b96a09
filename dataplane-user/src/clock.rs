//! The agent's two clocks, in one place.
//!
//! - CLOCK_MONOTONIC nanoseconds ([`monotonic_ns`]): the clock of `bpf_ktime_get_ns()`, so the
//!   kernel's timestamps (flow `last_seen_ns`, burst starts and ends) and the agent's polls and
//!   detection windows are on one time line;
//! - wall-clock Unix time ([`unix_ms`], [`unix_seconds`]): what the API, events and hints show,
//!   and what means the same thing after a restart.
//!
//! [`Clock`] converts the first into the second from one pair of readings. This module imports
//! nothing from the crate: every layer may use it.
use std::time::{SystemTime, UNIX_EPOCH};

/// CLOCK_MONOTONIC in ns, the clock of `bpf_ktime_get_ns()`.
pub fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is always available");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// Wall-clock Unix time in milliseconds (0 if the clock is before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Wall-clock Unix time in seconds (0.0 if the clock is before 1970).
pub fn unix_seconds() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Converts the detectors' CLOCK_MONOTONIC nanoseconds to Unix milliseconds, from one pair of
/// readings of both clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    pub mono_ns: u64,
    pub unix_ms: u64,
}

impl Clock {
    pub fn now() -> Self {
        let unix_ms = unix_ms();
        Clock { mono_ns: monotonic_ns(), unix_ms }
    }

    pub fn unix_ms(&self, mono_ns: u64) -> u64 {
        if mono_ns >= self.mono_ns {
            self.unix_ms + (mono_ns - self.mono_ns) / 1_000_000
        } else {
            self.unix_ms.saturating_sub((self.mono_ns - mono_ns) / 1_000_000)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_moves() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(b >= a && a > 0);
    }

    #[test]
    fn converts_monotonic_to_unix_both_ways() {
        let c = Clock { mono_ns: 5_000_000_000, unix_ms: 1_700_000_000_000 };
        assert_eq!(c.unix_ms(6_000_000_000), 1_700_000_001_000);
        assert_eq!(c.unix_ms(4_000_000_000), 1_699_999_999_000);
    }
}
