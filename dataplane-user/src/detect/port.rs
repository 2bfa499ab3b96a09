//! RDMA ports: congestion and loss judged from a NIC port's own counters, for RoCE the host
//! kernel never sees (the reader is `crate::rdma_counters`; this module is pure).
//!
//! The same thresholds as the TC-derived evidence, applied to one port instead of one job's link:
//! - congestion ([`VerdictKind::Congestion`]): CNPs the port sent (`np_cnp_sent`, the path *into*
//!   the port marks ECN) or handled (`rp_cnp_handled`, what it sends meets congestion) per second
//!   at or above `congestion.cnp_open_per_s` and `cnp_growth` × the port's own baseline, or the
//!   ECN-marked share of the received packets at `ce_open_floor` and `ce_growth` × baseline
//!   (critical at `ce_severe`); the same [`rate_condition`] the link detector uses;
//! - loss ([`VerdictKind::GrayFailure`]): loss signals per packet sent and received at or above
//!   `gray.loss_open_floor` and `loss_open_ratio` × the port's own baseline, critical at
//!   `loss_severe`, clean below `loss_clear_floor`; judged only on `min_data_packets` packets.
//!
//! What port counters cannot say: which peer or which job. A port carries every QP of every
//! tenant behind it, so there is no peer-relative comparison (median/MAD across peers) and no
//! attribution here: the reference is the port's own recent clean windows (or the threshold
//! until that baseline is warm), and every verdict is scoped [`Scope::RdmaPort`] under the
//! pseudo-job [`PORT_JOB`], so it never feeds a tenant job's policy. The lifecycle (k of n
//! windows, clear after m clean, gray classification) is the shared [`Track`].
//!
//! Memory: one fixed-size state per port, ports capped by the reader; a port not seen for
//! `forget_after_ns` is dropped and its open verdicts close as expired.

use std::collections::BTreeMap;

use serde::Serialize;

use super::config::DetectorConfig;
use super::congestion::rate_condition;
use super::gray::{evidence, Fold};
use super::lifecycle::{Track, TrackCtx};
use super::robust::{Robust, Ring};
use super::verdict::{Metric, Reference, Scope, Severity, VerdictChange, VerdictKind};
use super::warm;

/// The `job` of every RDMA-port verdict: not a valid job name (`@`), so it never collides with a
/// tenant's job, and no job's policy ever reads it.
pub const PORT_JOB: &str = "@rdma-ports";

/// One port's counter growth over one read interval. `None`: the port does not provide that
/// counter (another driver, or no `hw_counters/`), or it could not be read or reset in the
/// interval; each `None` only removes the condition that needs it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PortWindow {
    pub device: String,
    pub port: u32,
    /// Time between the two reads, ns.
    pub interval_ns: u64,
    /// Packets sent and received (`port_xmit_packets`, `port_rcv_packets`).
    pub xmit_packets: Option<u64>,
    pub rcv_packets: Option<u64>,
    pub cnp_sent: Option<u64>,
    pub cnp_handled: Option<u64>,
    /// ECN-marked RoCE packets received.
    pub ecn_marked: Option<u64>,
    /// Sum of the loss signals the port provides (see `crate::rdma_counters::LOSS_SIGNALS`).
    pub loss_signals: Option<u64>,
}

impl PortWindow {
    fn scope(&self) -> Scope {
        Scope::RdmaPort { device: self.device.clone(), port: self.port }
    }

    fn per_s(&self, n: Option<u64>) -> Option<f64> {
        (self.interval_ns > 0).then_some(())?;
        Some(n? as f64 * 1e9 / self.interval_ns as f64)
    }

    fn packets(&self) -> Option<u64> {
        Some(self.xmit_packets? + self.rcv_packets?)
    }
}

#[derive(Debug)]
struct PortState {
    last_seen_ns: u64,
    cnp_sent_baseline: Ring,
    cnp_handled_baseline: Ring,
    ce_baseline: Ring,
    loss_baseline: Ring,
    congestion: Track,
    loss: Track,
}

impl PortState {
    fn new(cfg: &DetectorConfig, now_ns: u64) -> Self {
        let n = cfg.congestion.baseline_windows;
        Self {
            last_seen_ns: now_ns,
            cnp_sent_baseline: Ring::new(n),
            cnp_handled_baseline: Ring::new(n),
            ce_baseline: Ring::new(n),
            loss_baseline: Ring::new(n),
            congestion: Track::default(),
            loss: Track::default(),
        }
    }
}

/// The rates of one window, pushed into the baselines when the window was not anomalous.
#[derive(Default)]
struct PortRates {
    cnp_sent: Option<f64>,
    cnp_handled: Option<f64>,
    ce_rate: Option<f64>,
    loss_rate: Option<f64>,
}

/// Every port's detectors; owned by [`super::DetectorSet`] so verdict ids stay unique.
#[derive(Debug, Default)]
pub(crate) struct PortDetectors {
    ports: BTreeMap<(String, u32), PortState>,
}

impl PortDetectors {
    /// One read of every port: `windows` from one poll, judged as the detection window
    /// `[start_ns, end_ns]` (the verdicts' times). Ports absent longer than `forget_after_ns`
    /// close their verdicts as expired.
    pub fn observe(
        &mut self,
        cfg: &DetectorConfig,
        windows: &[PortWindow],
        start_ns: u64,
        end_ns: u64,
        next_id: &mut u64,
    ) -> Vec<VerdictChange> {
        let mut changes = self.expire(end_ns, cfg.forget_after_ns);
        for w in windows {
            let st = self.ports.entry((w.device.clone(), w.port)).or_insert_with(|| PortState::new(cfg, end_ns));
            st.last_seen_ns = end_ns;
            let scope = w.scope();
            let ctx = |kind| TrackCtx { job: PORT_JOB, kind, scope: &scope, window_start_ns: start_ns, window_end_ns: end_ns };
            let mut rates = PortRates::default();

            let mut fold = Fold::default();
            let cc = &cfg.congestion;
            if let Some(v) = w.per_s(w.cnp_sent) {
                rates.cnp_sent = Some(v);
                // No severe level for CNPs: DCQCN reacts to them by design (as on links).
                rate_condition(&mut fold, Metric::CnpSentPerS, v, warm(&st.cnp_sent_baseline, cfg), cc.cnp_open_per_s, cc.cnp_growth, f64::INFINITY);
            }
            if let Some(v) = w.per_s(w.cnp_handled) {
                rates.cnp_handled = Some(v);
                rate_condition(&mut fold, Metric::CnpHandledPerS, v, warm(&st.cnp_handled_baseline, cfg), cc.cnp_open_per_s, cc.cnp_growth, f64::INFINITY);
            }
            if let (Some(ecn), Some(rcv)) = (w.ecn_marked, w.rcv_packets) {
                if rcv >= cfg.min_data_packets.max(1) {
                    let v = ecn as f64 / rcv as f64;
                    rates.ce_rate = Some(v);
                    rate_condition(&mut fold, Metric::CeRate, v, warm(&st.ce_baseline, cfg), cc.ce_open_floor, cc.ce_growth, cc.ce_severe);
                }
            }
            let congested = fold.finish(|severe| if severe { Severity::Critical } else { Severity::Warning });

            let mut fold = Fold::default();
            let g = &cfg.gray;
            if let (Some(loss), Some(packets)) = (w.loss_signals, w.packets()) {
                if packets >= cfg.min_data_packets.max(1) {
                    let v = loss as f64 / packets as f64;
                    rates.loss_rate = Some(v);
                    let base = warm(&st.loss_baseline, cfg);
                    let reference = base.unwrap_or(Robust { median: g.loss_open_floor, mad: 0.0 });
                    let kind = if base.is_some() { Reference::OwnBaseline } else { Reference::Threshold };
                    if v >= g.loss_open_floor && v >= g.loss_open_ratio * base.map_or(0.0, |b| b.median) {
                        fold.anomalous(v >= g.loss_severe, evidence(Metric::LossRate, v, &reference, kind));
                    } else if v < g.loss_clear_floor {
                        fold.clean();
                    } else {
                        fold.ambiguous();
                    }
                }
            }
            let lossy = fold.finish(|severe| if severe { Severity::Critical } else { Severity::Warning });

            if let Some(a) = congested {
                if !a.is_anomalous() {
                    rates.cnp_sent.inspect(|&x| st.cnp_sent_baseline.push(x));
                    rates.cnp_handled.inspect(|&x| st.cnp_handled_baseline.push(x));
                    rates.ce_rate.inspect(|&x| st.ce_baseline.push(x));
                }
                changes.extend(st.congestion.observe(&cfg.persistence, &ctx(VerdictKind::Congestion), a, false, true, next_id));
            }
            if let Some(a) = lossy {
                if !a.is_anomalous() {
                    rates.loss_rate.inspect(|&x| st.loss_baseline.push(x));
                }
                changes.extend(st.loss.observe(&cfg.persistence, &ctx(VerdictKind::GrayFailure), a, true, true, next_id));
            }
        }
        changes
    }

    fn expire(&mut self, now_ns: u64, forget_after_ns: u64) -> Vec<VerdictChange> {
        let mut changes = Vec::new();
        self.ports.retain(|_, p| {
            if p.last_seen_ns.saturating_add(forget_after_ns) >= now_ns {
                return true;
            }
            changes.extend(p.congestion.expire(p.last_seen_ns));
            changes.extend(p.loss.expire(p.last_seen_ns));
            false
        });
        changes
    }

    pub fn tracks(&self) -> impl Iterator<Item = &Track> {
        self.ports.values().flat_map(|p| [&p.congestion, &p.loss])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn window(cnp_sent: u64, ecn: u64, loss: u64) -> PortWindow {
        PortWindow {
            device: "mlx5_0".into(),
            port: 1,
            interval_ns: S,
            xmit_packets: Some(500_000),
            rcv_packets: Some(500_000),
            cnp_sent: Some(cnp_sent),
            cnp_handled: Some(0),
            ecn_marked: Some(ecn),
            loss_signals: Some(loss),
        }
    }

    fn run(d: &mut PortDetectors, cfg: &DetectorConfig, from: u64, windows: &[PortWindow], id: &mut u64) -> Vec<VerdictChange> {
        let mut out = Vec::new();
        for (i, w) in windows.iter().enumerate() {
            let t = (from + i as u64) * S;
            out.extend(d.observe(cfg, std::slice::from_ref(w), t, t + S, id));
        }
        out
    }

    fn opened(changes: &[VerdictChange]) -> Vec<(VerdictKind, Severity, Vec<Metric>)> {
        changes
            .iter()
            .filter_map(|c| match c {
                VerdictChange::Opened(v) => Some((v.kind, v.severity, v.evidence.iter().map(|e| e.metric).collect())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn healthy_port_raises_nothing_and_warms_its_baselines() {
        let cfg = DetectorConfig::default();
        let mut d = PortDetectors::default();
        let mut id = 1;
        let quiet: Vec<_> = (0..20).map(|i| window(10 + i % 3, 50, 20)).collect();
        assert!(run(&mut d, &cfg, 0, &quiet, &mut id).is_empty());
        let st = d.ports.values().next().unwrap();
        assert_eq!(st.cnp_sent_baseline.len(), 20);
        assert_eq!(st.loss_baseline.len(), 20);
        assert_eq!(d.tracks().filter_map(Track::open_verdict).count(), 0);
    }

    #[test]
    fn cnp_and_ecn_growth_is_congestion_on_the_port_and_clears() {
        let cfg = DetectorConfig::default();
        let mut d = PortDetectors::default();
        let mut id = 1;
        let quiet: Vec<_> = (0..10).map(|_| window(10, 50, 20)).collect();
        assert!(run(&mut d, &cfg, 0, &quiet, &mut id).is_empty());
        // 5,000 CNPs/s and 2 % of received packets ECN-marked: 2 of 3 windows raise.
        let hot = [window(5_000, 10_000, 20), window(5_000, 10_000, 20)];
        let changes = run(&mut d, &cfg, 10, &hot, &mut id);
        let o = opened(&changes);
        assert_eq!(o.len(), 1, "{changes:?}");
        assert_eq!(o[0].0, VerdictKind::Congestion);
        assert_eq!(o[0].2, vec![Metric::CnpSentPerS, Metric::CeRate]);
        let v = changes[0].verdict();
        assert_eq!((v.job.as_str(), &v.scope), (PORT_JOB, &Scope::RdmaPort { device: "mlx5_0".into(), port: 1 }));
        assert_eq!(v.evidence[0].value, 5_000.0);
        assert_eq!(v.evidence[0].reference_kind, Reference::OwnBaseline);
        let changes = run(&mut d, &cfg, 12, &[window(10, 50, 20), window(10, 50, 20), window(10, 50, 20)], &mut id);
        assert!(matches!(changes.as_slice(), [VerdictChange::Closed(v)] if v.kind == VerdictKind::Congestion), "{changes:?}");
    }

    #[test]
    fn loss_signals_are_a_gray_failure_of_the_port() {
        let cfg = DetectorConfig::default();
        let mut d = PortDetectors::default();
        let mut id = 1;
        // 2 % loss signals per packet from the first window: against the threshold (no baseline
        // yet), severe, so one window raises, as a peer's severe loss does.
        let changes = run(&mut d, &cfg, 0, &[window(10, 50, 20_000)], &mut id);
        let o = opened(&changes);
        assert_eq!(o, vec![(VerdictKind::GrayFailure, Severity::Critical, vec![Metric::LossRate])]);
        let v = changes[0].verdict();
        assert_eq!(v.evidence[0].reference_kind, Reference::Threshold);
        assert_eq!(v.classification, Some(crate::detect::Classification::Transient));
    }

    #[test]
    fn too_few_packets_or_missing_counters_judge_nothing() {
        let cfg = DetectorConfig::default();
        let mut d = PortDetectors::default();
        let mut id = 1;
        let small = PortWindow { xmit_packets: Some(100), rcv_packets: Some(100), ..window(10, 100, 100) };
        let bare = PortWindow { device: "hfi1_0".into(), cnp_sent: None, cnp_handled: None, ecn_marked: None, loss_signals: None, ..window(0, 0, 0) };
        assert!(run(&mut d, &cfg, 0, &[small.clone(), small.clone(), small], &mut id).is_empty());
        assert!(run(&mut d, &cfg, 3, &[bare.clone(), bare.clone(), bare], &mut id).is_empty());
    }

    #[test]
    fn a_vanished_port_expires_its_verdicts() {
        let cfg = DetectorConfig::default();
        let mut d = PortDetectors::default();
        let mut id = 1;
        assert_eq!(opened(&run(&mut d, &cfg, 0, &[window(10, 50, 20_000)], &mut id)).len(), 1);
        let later = cfg.forget_after_ns + 5 * S;
        let changes = d.observe(&cfg, &[], later, later + S, &mut id);
        assert!(matches!(changes.as_slice(), [VerdictChange::Closed(v)] if v.end_reason == Some(crate::detect::EndReason::Expired)), "{changes:?}");
        assert!(d.ports.is_empty());
    }
}
