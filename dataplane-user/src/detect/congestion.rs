//! Congestion: a link (shared bottleneck) whose peers degrade together.
//!
//! Any of these makes a link's window anomalous:
//! - own baseline: at least `min_degraded_peers` and `min_degraded_fraction` of its peers run
//!   below `goodput_open_ratio` of their *own* recent in-burst goodput (on a host's own cable a
//!   dip above `goodput_severe_ratio` is mild evidence, which must last `mild_raise_k` of
//!   `mild_raise_n` windows: there it is also what a busy host looks like);
//! - co-outliers: as many of its peers are gray-failure goodput outliers against the job in the
//!   same window (works before the baselines have warmed up, and when the whole link carries a
//!   minority of the job);
//! - ECN CE rate or RoCE CNP rate above a floor and several times the link's own baseline;
//! - loss spread: as many of its peers lose packets above the gray-failure loss floor;
//! - shared loss: several flows with no host in common, the job's and other traffic's, lose
//!   packets on the link's egress ([`LinkWindow::shared_loss`]);
//! - competition: the job's in-burst goodput on the link's egress falls to
//!   `competition_open_ratio` of its own baseline while other traffic on that egress carries at
//!   least `competition_min_other` of that baseline (deep queues slow everyone without loss);
//! - queue drops, at one host's end of the wire only (its NIC, its IPU's `fabric` port): the
//!   host's own cable's egress queue (its interface's root qdisc) drops a share of what it is
//!   offered, several times its own baseline ([`queue_drop_condition`]). On a switch a port
//!   whose queue drops is a peer's slow or capped path, which the gray-failure detector names;
//! - queue throttles, at one host's end of the wire only, likewise: the own cable's egress queue
//!   is a shaper (`tbf`, `htb`) that holds packets back for lack of rate several times more often
//!   per packet than its baseline ([`queue_throttle_condition`]): the cable has become the
//!   bottleneck of what this end sends, though nothing need be dropped (a rate cap whose queue
//!   absorbs what a ring forwards: recorded, 0.9-1.7 throttles per packet on the capped host's
//!   IPU, 0 on every other IPU).
//!
//! The last three see a shared uplink that carries only one or two of the job's peers, where the
//! per-peer conditions cannot count. Shared loss and competition need other traffic on the link,
//! so a job alone on a link is not "congested" by them (its own slowness is a gray failure or the
//! job itself). Queue drops do not: they are this interface's own count of packets its link could
//! not carry, so where one connection crosses two hosts' cables (a ring's neighbours, each end
//! seen by its own IPU) they say which cable; against the link's own warm baseline only, because
//! a link that is a bottleneck by design drops from the start (TCP probes it).
//! One degraded peer is never congestion: that is the gray-failure detector's case.

use super::config::{CongestionConfig, GrayConfig};
use super::input::LinkWindow;
use super::features::{PeerFeatures, PeerStats};
use super::gray::{evidence, Fold};
use super::lifecycle::Assessment;
use super::robust::Robust;
use super::verdict::{Evidence, Metric, PeerCount, Reference, Severity};
use crate::queue_stats::QueueDelta;
use ringside_stats::median;

/// One peer of the link, with its statistics.
pub(crate) struct LinkPeer<'a> {
    pub f: &'a PeerFeatures,
    pub stats: &'a PeerStats,
    /// The peer's own goodput baseline, once warmed up.
    pub baseline: Option<Robust>,
}

pub(crate) struct LinkInput<'a> {
    pub peers: Vec<LinkPeer<'a>>,
    /// The link's CE-rate and CNP-rate baselines, once warmed up.
    pub ce_baseline: Option<Robust>,
    pub cnp_baseline: Option<Robust>,
    pub window_s: f64,
    /// The link's directions that carried the job's data.
    pub shared: Vec<&'a LinkWindow>,
    /// The job's in-burst goodput on the link's egress, own baseline once warmed up.
    pub egress_goodput_baseline: Option<Robust>,
    /// The egress queue's drop ratio, own baseline once warmed up.
    pub queue_drop_baseline: Option<Robust>,
    /// The egress queue's throttles per packet sent, own baseline once warmed up.
    pub queue_throttle_baseline: Option<Robust>,
    /// The link is the host's own cable (the agent sits at one host's end of the wire:
    /// `JobWindow::local`'s link, in this window or an earlier one): only there are queue drops
    /// and throttles judged, and is a mild dip of every peer against its own history mild
    /// evidence.
    pub own_cable: bool,
}

impl LinkInput<'_> {
    pub fn egress(&self) -> Option<&LinkWindow> {
        self.shared.iter().copied().find(|l| l.direction == "egress")
    }
}

/// The link-wide rates of a window, for its baselines.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LinkRates {
    pub ce_rate: Option<f64>,
    pub cnp_per_s: Option<f64>,
    pub queue_drop_ratio: Option<f64>,
    pub queue_throttle_ratio: Option<f64>,
}

fn required(cfg: &CongestionConfig, n: usize) -> usize {
    cfg.min_degraded_peers
        .max((cfg.min_degraded_fraction * n as f64).ceil() as usize)
        .max(1)
}

/// One "several peers at once" condition: `peers` are (value, reference stats, degraded, severe,
/// not yet recovered). `mild_unless_severe`: a window degraded but not severe is evidence a busy
/// host's CPU can fake (raised only on `mild_raise_k` of `mild_raise_n` windows).
fn peers_condition(
    cfg: &CongestionConfig,
    fold: &mut Fold,
    metric: Metric,
    reference_kind: Reference,
    peers: &[(f64, Robust, bool, bool, bool)],
    mild_unless_severe: bool,
) {
    let n = peers.len();
    if n < cfg.min_degraded_peers.max(1) {
        return;
    }
    let need = required(cfg, n);
    let degraded: Vec<_> = peers.iter().filter(|p| p.2).collect();
    if degraded.len() >= need {
        let severe = peers.iter().filter(|p| p.3).count() >= need;
        let e = Evidence {
            metric,
            value: median(degraded.iter().map(|p| p.0)).unwrap_or(0.0),
            reference: median(degraded.iter().map(|p| p.1.median)).unwrap_or(0.0),
            reference_kind,
            mad: median(degraded.iter().map(|p| p.1.mad)).unwrap_or(0.0),
            peers: Some(PeerCount { affected: degraded.len() as u32, of: n as u32 }),
            windows: Default::default(),
        };
        if mild_unless_severe && !severe {
            fold.anomalous_not_at_once(false, e);
        } else {
            fold.anomalous(severe, e);
        }
    } else if peers.iter().filter(|p| p.4).count() < need {
        fold.clean();
    } else {
        fold.ambiguous();
    }
}

/// A link-wide (or RDMA port's) rate against the scope's own baseline.
pub(crate) fn rate_condition(
    fold: &mut Fold,
    metric: Metric,
    value: f64,
    baseline: Option<Robust>,
    floor: f64,
    growth: f64,
    severe_at: f64,
) {
    let base = baseline.map_or(0.0, |b| b.median);
    if value >= floor && value >= growth * base {
        let r = baseline.unwrap_or(Robust { median: 0.0, mad: 0.0 });
        fold.anomalous(value >= severe_at, evidence(metric, value, &r, Reference::OwnBaseline));
    } else if value < (floor / 2.0).max(2.0 * base) {
        fold.clean();
    } else {
        fold.ambiguous();
    }
}

/// Shared loss (module docs): evaluated on every link, clean when no direction shows it.
fn shared_loss_condition(cfg: &CongestionConfig, gray: &GrayConfig, fold: &mut Fold, shared: &[&LinkWindow]) {
    let worst = shared.iter().filter(|l| l.shared_loss(cfg.min_shared_loss_flows)).max_by_key(|l| l.lossy_flows);
    let Some(l) = worst else {
        fold.clean();
        return;
    };
    let loss_rate = l.loss_packets as f64 / l.data_packets.max(1) as f64;
    let e = Evidence {
        metric: Metric::LossyFlows,
        value: l.lossy_flows as f64,
        reference: cfg.min_shared_loss_flows as f64,
        reference_kind: Reference::Threshold,
        mad: 0.0,
        peers: Some(PeerCount { affected: l.lossy_flows, of: l.flows }),
        windows: Default::default(),
    };
    fold.anomalous(loss_rate >= gray.loss_severe, e);
}

/// Drops that make a window's queue judged however few packets it was offered: a fault that
/// starts late in a window (a cap installed, a port renegotiated) drops this many before the
/// window ends, and the flows' loss in that window is then judged against it. A healthy queue
/// drops none.
const QUEUE_MIN_DROPS: u64 = 10;

/// Queue drops (module docs), on the host's own cable only: judged on `min_data_packets` offered
/// to the queue or [`QUEUE_MIN_DROPS`] dropped, against the link's own baseline only once it is
/// warm. A window without drops is a 0 whatever the queue sent (veth's `noqueue` counts nothing),
/// so a queue that appears with a fault (a rate cap's `tbf`) meets a warm baseline. Returns the
/// window's drop ratio, for that baseline (on every link: the baseline is warm by the time a link
/// is known as the host's own cable).
fn queue_drop_condition(cfg: &CongestionConfig, min_data_packets: u64, fold: &mut Fold, link: &LinkInput<'_>) -> Option<f64> {
    let ratio = |q: QueueDelta| {
        if q.drops == 0 {
            Some(0.0)
        } else if q.packets + q.drops < min_data_packets.max(1) && q.drops < QUEUE_MIN_DROPS {
            None
        } else {
            q.drop_ratio()
        }
    };
    let (floor, growth, severe) = (cfg.queue_drop_open_floor, cfg.queue_drop_growth, cfg.queue_drop_severe);
    own_queue_condition(fold, link, Metric::QueueDropRate, ratio, link.queue_drop_baseline, (floor, growth, severe))
}

/// Queue throttles (module docs), on the host's own cable only, like [`queue_drop_condition`]:
/// judged on `min_data_packets` sent, against the link's own warm baseline; a window without
/// throttles is a 0 whatever the queue sent (`noqueue` counts nothing), so a shaper that appears
/// with a fault meets a warm baseline. Never severe. Returns the window's ratio, for the baseline.
fn queue_throttle_condition(cfg: &CongestionConfig, min_data_packets: u64, fold: &mut Fold, link: &LinkInput<'_>) -> Option<f64> {
    let ratio = |q: QueueDelta| {
        if q.overlimits == 0 {
            Some(0.0)
        } else if q.packets < min_data_packets.max(1) {
            None
        } else {
            q.throttle_ratio()
        }
    };
    let thresholds = (cfg.queue_throttle_open_floor, cfg.queue_throttle_growth, f64::INFINITY);
    own_queue_condition(fold, link, Metric::QueueThrottleRate, ratio, link.queue_throttle_baseline, thresholds)
}

/// The shared part of the queue conditions: `ratio` of the link's egress queue counters in the
/// window (`None`: too little to judge), a [`rate_condition`] against the link's `baseline`
/// (`thresholds`: open floor, growth, severe) only on the host's own cable and once the baseline
/// is warm. Returns the window's ratio, for the baseline (kept on every link: it is warm by the
/// time a link is known as the host's own cable).
fn own_queue_condition(
    fold: &mut Fold,
    link: &LinkInput<'_>,
    metric: Metric,
    ratio: impl FnOnce(QueueDelta) -> Option<f64>,
    baseline: Option<Robust>,
    (floor, growth, severe_at): (f64, f64, f64),
) -> Option<f64> {
    let value = ratio(link.egress()?.queue?)?;
    if link.own_cable && baseline.is_some() {
        rate_condition(fold, metric, value, baseline, floor, growth, severe_at);
    }
    Some(value)
}

/// Competition (module docs).
fn competition_condition(cfg: &CongestionConfig, fold: &mut Fold, link: &LinkInput<'_>) {
    let Some(eg) = link.egress() else { return };
    let (Some(g), Some(b)) = (eg.job_goodput_bps(), link.egress_goodput_baseline.filter(|b| b.median > 0.0)) else {
        return;
    };
    let ratio = g / b.median;
    let other_bps = eg.other_bytes as f64 / link.window_s.max(1e-3);
    let others = other_bps / b.median;
    if ratio <= cfg.competition_open_ratio && others >= cfg.competition_min_other {
        let severe = ratio <= cfg.goodput_severe_ratio;
        fold.anomalous(severe, evidence(Metric::InBurstGoodputBps, g, &b, Reference::OwnBaseline));
        fold.anomalous(severe, evidence(Metric::OtherTrafficBps, other_bps, &b, Reference::OwnBaseline));
    } else if ratio >= cfg.goodput_clear_ratio || others < cfg.competition_min_other / 2.0 {
        fold.clean();
    } else {
        fold.ambiguous();
    }
}

pub(crate) fn assess(
    cfg: &CongestionConfig,
    gray: &GrayConfig,
    min_data_packets: u64,
    link: &LinkInput<'_>,
) -> (Option<Assessment>, LinkRates) {
    let mut fold = Fold::default();

    let own: Vec<_> = link
        .peers
        .iter()
        .filter_map(|p| {
            let (g, b) = (p.f.goodput_bps?, p.baseline.filter(|b| b.median > 0.0)?);
            let ratio = g / b.median;
            Some((
                g,
                b,
                ratio <= cfg.goodput_open_ratio,
                ratio <= cfg.goodput_severe_ratio,
                ratio < cfg.goodput_clear_ratio,
            ))
        })
        .collect();
    // At a host's own cable every peer is a connection of that one host, so all of them slower
    // than their own history together is also what the host itself looks like when its CPU is
    // busy (OpenMPI's rank 0 beside `mpirun`, seen by its own IPU: its peers at 0.55-0.6 of their
    // baselines for 2-3 windows in 10, three false congestion verdicts in a ten-minute healthy
    // run): a mild dip there must last, as a gray failure's must. A severe one (a rate cap on the
    // cable) still raises at once.
    peers_condition(cfg, &mut fold, Metric::InBurstGoodputBps, Reference::OwnBaseline, &own, link.own_cable);

    let co: Vec<_> = link
        .peers
        .iter()
        .filter_map(|p| {
            let (g, r) = (p.f.goodput_bps?, p.stats.goodput.filter(|r| r.median > 0.0)?);
            let ratio = g / r.median;
            let z = (r.median - g) / r.scale(gray.rel_scale_floor, 0.0);
            let outlier = ratio <= gray.goodput_open_ratio && z >= gray.z_open;
            Some((g, r, outlier, outlier && ratio <= gray.goodput_severe_ratio, ratio < gray.goodput_clear_ratio))
        })
        .collect();
    peers_condition(cfg, &mut fold, Metric::InBurstGoodputBps, Reference::PeerMedian, &co, false);

    let lossy: Vec<_> = link
        .peers
        .iter()
        .filter_map(|p| {
            let l = p.f.loss_rate?;
            let r = p.stats.loss_rate.unwrap_or(Robust { median: 0.0, mad: 0.0 });
            Some((l, r, l >= gray.loss_open_floor, l >= gray.loss_severe, l >= gray.loss_clear_floor))
        })
        .collect();
    peers_condition(cfg, &mut fold, Metric::LossRate, Reference::PeerMedian, &lossy, false);

    let data: u64 = link.peers.iter().map(|p| p.f.data_packets).sum();
    let mut rates = LinkRates::default();
    if data >= min_data_packets.max(1) {
        let ce: u64 = link.peers.iter().map(|p| p.f.ce_marks).sum();
        let ce_rate = ce as f64 / data as f64;
        rates.ce_rate = Some(ce_rate);
        rate_condition(&mut fold, Metric::CeRate, ce_rate, link.ce_baseline, cfg.ce_open_floor, cfg.ce_growth, cfg.ce_severe);
    }
    if link.window_s > 0.0 && !link.peers.is_empty() {
        let cnps: u64 = link.peers.iter().map(|p| p.f.cnps).sum();
        let cnp_per_s = cnps as f64 / link.window_s;
        rates.cnp_per_s = Some(cnp_per_s);
        // No severe level for CNPs: DCQCN reacts to them by design.
        rate_condition(&mut fold, Metric::CnpPerS, cnp_per_s, link.cnp_baseline, cfg.cnp_open_per_s, cfg.cnp_growth, f64::INFINITY);
    }
    shared_loss_condition(cfg, gray, &mut fold, &link.shared);
    competition_condition(cfg, &mut fold, link);
    rates.queue_drop_ratio = queue_drop_condition(cfg, min_data_packets, &mut fold, link);
    rates.queue_throttle_ratio = queue_throttle_condition(cfg, min_data_packets, &mut fold, link);
    let a = fold.finish(|severe| if severe { Severity::Critical } else { Severity::Warning });
    (a, rates)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::lifecycle::WindowState;

    fn peer(i: u8, goodput: f64, loss: f64, ce: u64) -> PeerFeatures {
        PeerFeatures { ce_marks: ce, ..PeerFeatures::for_test(&format!("10.0.2.{i}"), "leaf2", goodput, loss) }
    }

    fn assess_link(peers: &[PeerFeatures], baseline: f64) -> Option<Assessment> {
        let stats = PeerStats::default();
        let b = Robust { median: baseline, mad: baseline * 0.02 };
        let input = LinkInput {
            peers: peers.iter().map(|f| LinkPeer { f, stats: &stats, baseline: Some(b) }).collect(),
            ce_baseline: Some(Robust { median: 0.0, mad: 0.0 }),
            cnp_baseline: Some(Robust { median: 0.0, mad: 0.0 }),
            window_s: 1.0,
            shared: Vec::new(),
            egress_goodput_baseline: None,
            queue_drop_baseline: None,
            queue_throttle_baseline: None,
            own_cable: false,
        };
        assess(&CongestionConfig::default(), &GrayConfig::default(), 1000, &input).0
    }

    #[test]
    fn one_degraded_peer_is_not_congestion() {
        let peers = [peer(1, 25e6, 1e-4, 0), peer(2, 100e6, 1e-4, 0), peer(3, 99e6, 0.0, 0)];
        assert_eq!(assess_link(&peers, 100e6).unwrap().state, WindowState::Clean);
    }

    #[test]
    fn most_peers_degraded_is_congestion() {
        let peers = [peer(1, 45e6, 1e-4, 0), peer(2, 48e6, 1e-4, 0), peer(3, 99e6, 0.0, 0)];
        let a = assess_link(&peers, 100e6).unwrap();
        assert_eq!(a.state, WindowState::Anomalous { severe: true });
        assert_eq!(a.evidence[0].peers, Some(PeerCount { affected: 2, of: 3 }));
        assert_eq!(a.evidence[0].reference, 100e6);
    }

    #[test]
    fn ce_growth_alone_is_congestion_even_on_a_one_peer_link() {
        let a = assess_link(&[peer(1, 100e6, 0.0, 600)], 100e6).unwrap();
        assert_eq!(a.state, WindowState::Anomalous { severe: false });
        assert_eq!(a.evidence[0].metric, Metric::CeRate);
        assert_eq!(a.evidence[0].value, 0.02);
    }

    #[test]
    fn cnp_growth_is_congestion() {
        let mut p = peer(1, 100e6, 0.0, 0);
        p.cnps = 500;
        let a = assess_link(&[p.clone()], 100e6).unwrap();
        assert_eq!(a.state, WindowState::Anomalous { severe: false });
        assert_eq!(a.evidence[0].metric, Metric::CnpPerS);
        assert_eq!(a.evidence[0].value, 500.0);
        p.cnps = 20;
        assert_eq!(assess_link(&[p], 100e6).unwrap().state, WindowState::Clean);
    }

    #[test]
    fn few_ce_marks_are_clean() {
        let a = assess_link(&[peer(1, 100e6, 0.0, 3), peer(2, 100e6, 0.0, 0)], 100e6).unwrap();
        assert_eq!(a.state, WindowState::Clean);
    }
}
