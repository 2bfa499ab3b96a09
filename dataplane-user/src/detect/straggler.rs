//! Network or worker: a compute straggler starts its communication phases late against the
//! other peers of the same step, then moves its bytes at normal in-burst goodput. That is the
//! worker (slow GPU, CPU contention, data loading), and blaming the fabric for it would send
//! operators after the wrong thing, so it is its own verdict kind, which is never a network fault.
//! A peer that is late *and* slow, or late and lossy, is left to the network detectors.

use super::config::StragglerConfig;
use super::features::{PeerFeatures, PeerStats};
use super::gray::evidence;
use super::lifecycle::Assessment;
use super::robust::Robust;
use super::verdict::{Metric, Reference, Severity};

/// `network_anomalous`: the gray-failure assessment of the same peer and window is anomalous.
///
/// Two lateness statistics (see `features`): phase-matched lateness (every phase of the peer
/// starts late) and step-start lateness (the peer ends its compute-like idle after the others at
/// nearly every step, as a ring allreduce shows it). The window is as anomalous as the worse of
/// the two; both are reported as [`Metric::PhaseStartLatenessNs`].
pub(crate) fn assess(
    cfg: &StragglerConfig,
    f: &PeerFeatures,
    s: &PeerStats,
    network_anomalous: bool,
) -> Option<Assessment> {
    let phase = lateness(cfg, f.lateness_ns, s.lateness);
    let step = lateness(cfg, f.step_lateness_ns, s.step_lateness);
    let worst = match (phase, step) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { b } else { a }),
        (a, b) => a.or(b),
    };
    let (level, late, r) = worst?;
    match level {
        Level::Clean => return Some(Assessment::clean()),
        Level::Ambiguous => return Some(Assessment::ambiguous()),
        Level::Anomalous => {}
    }
    let goodput = match (f.goodput_bps, s.goodput) {
        (Some(g), Some(rg)) if rg.median > 0.0 && g >= cfg.normal_goodput_ratio * rg.median => Some((g, rg)),
        _ => None,
    };
    let Some((g, rg)) = goodput.filter(|_| !network_anomalous) else {
        return Some(Assessment::ambiguous());
    };
    let excess = late - r.median;
    let severity = if excess >= cfg.warning_lateness_ns as f64 { Severity::Warning } else { Severity::Info };
    Some(Assessment::anomalous(
        false,
        severity,
        vec![
            evidence(Metric::PhaseStartLatenessNs, late, &r, Reference::PeerMedian),
            evidence(Metric::InBurstGoodputBps, g, &rg, Reference::PeerMedian),
        ],
        false,
    ))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Clean,
    Ambiguous,
    Anomalous,
}

/// One lateness statistic against the other peers' (leave-one-out) median.
fn lateness(cfg: &StragglerConfig, late: Option<f64>, r: Option<Robust>) -> Option<(Level, f64, Robust)> {
    let (late, r) = (late?, r?);
    let excess = late - r.median;
    let z = excess / r.scale(0.0, cfg.scale_floor_ns as f64);
    let level = if excess >= cfg.open_lateness_ns as f64 && z >= cfg.z_open {
        Level::Anomalous
    } else if excess < cfg.clear_lateness_ns as f64 || z < cfg.z_clear {
        Level::Clean
    } else {
        Level::Ambiguous
    };
    Some((level, late, r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::lifecycle::WindowState;

    const MS: f64 = 1e6;

    fn f(late_ms: f64, goodput: f64) -> PeerFeatures {
        PeerFeatures { lateness_ns: Some(late_ms * MS), ..PeerFeatures::for_test("10.0.0.5", "eth0", goodput, 0.0) }
    }

    fn s() -> PeerStats {
        PeerStats {
            goodput: Robust::of([100e6, 101e6, 99e6]),
            lateness: Robust::of([0.5 * MS, -1.0 * MS, 0.0, 1.0 * MS]),
            ..Default::default()
        }
    }

    #[test]
    fn late_at_normal_goodput_is_a_straggler() {
        let a = assess(&StragglerConfig::default(), &f(50.0, 98e6), &s(), false).unwrap();
        assert_eq!(a.state, WindowState::Anomalous { severe: false });
        assert_eq!(a.severity, Severity::Info);
        assert_eq!(a.evidence[0].metric, Metric::PhaseStartLatenessNs);
    }

    #[test]
    fn late_and_slow_or_lossy_is_not_a_straggler() {
        let cfg = StragglerConfig::default();
        assert_eq!(assess(&cfg, &f(50.0, 40e6), &s(), false).unwrap().state, WindowState::Ambiguous);
        assert_eq!(assess(&cfg, &f(50.0, 98e6), &s(), true).unwrap().state, WindowState::Ambiguous);
    }

    #[test]
    fn jitter_is_clean() {
        let a = assess(&StragglerConfig::default(), &f(4.0, 98e6), &s(), false).unwrap();
        assert_eq!(a.state, WindowState::Clean);
    }
}
