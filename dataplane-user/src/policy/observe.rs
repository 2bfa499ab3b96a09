//! What the policy measures of one job in one window, and the short history it keeps of it.
//!
//! Per window ([`WindowObservation::from_window`]):
//! - per peer: in-burst goodput (bytes / time inside the peer's merged phases of at least
//!   `min_phase_bytes`, the detectors' definition, [`crate::detect::merge_phases`]) and loss ratio
//!   (loss packets / data packets, when there are at least `min_data_packets`);
//! - the job's steps: all peers' bursts merged into job-wide phases; a phase that starts after an
//!   idle gap of at least `max(min_idle_gap_ns, half the median of the window's gaps of at least
//!   min_idle_gap_ns)` starts a step (the compute phase is the common long gap; a stall behind a
//!   slow rank inside the allreduce is shorter). The median, not the longest gap: one TCP
//!   retransmission timeout (200 ms or more) in a window would otherwise hide every compute gap
//!   and merge several steps into one (seen under 2 % loss as 308 ms "steps" of a 40 ms
//!   allreduce). A stall longer than the compute gap splits a step instead. Step time =
//!   interval between step starts; communication time = last phase end of the step − step start.
//!   A step is sampled in the window in which the next one starts ([`StepTracker`] carries the
//!   open step across windows; a gap longer than a window resets it);
//! - which peers are named by open network verdicts (gray failure on the peer, congestion on the
//!   link it crosses) and whether a straggler verdict is open (compute, never network).
//!
//! [`ObservationHistory`] keeps the last `recent_windows` summaries and answers with medians, so
//! one odd window does not move the policy.
//!
//! Invariants: memory is bounded (phases per window by `max_phases`, history by its capacity);
//! the same windows always give the same observations (no clock, ordered collections).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;

use crate::detect::{merge_phases, BurstSummary, DetectorConfig, JobWindow, Phase, Scope, Verdict, VerdictKind};

/// The detectors' phase parameters the policy reuses, so both see the same phases.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseParams {
    pub window_ns: u64,
    pub merge_gap_ns: u64,
    pub max_phases: usize,
    pub min_phase_bytes: u64,
    pub min_idle_gap_ns: u64,
    pub min_data_packets: u64,
    pub min_window_bytes: u64,
}

impl From<&DetectorConfig> for PhaseParams {
    fn from(c: &DetectorConfig) -> Self {
        PhaseParams {
            window_ns: c.window_ns,
            merge_gap_ns: c.phase_merge_gap_ns,
            max_phases: c.max_phases_per_window,
            min_phase_bytes: c.min_phase_bytes,
            min_idle_gap_ns: c.straggler.min_idle_gap_ns,
            min_data_packets: c.min_data_packets,
            min_window_bytes: c.min_window_bytes,
        }
    }
}

impl Default for PhaseParams {
    fn default() -> Self {
        PhaseParams::from(&DetectorConfig::default())
    }
}

/// One peer of the job in one window.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerObservation {
    pub peer: IpAddr,
    /// Below `min_window_bytes`: nothing is assessed.
    pub idle: bool,
    pub goodput_bps: Option<f64>,
    pub loss_ratio: Option<f64>,
    /// Named by an open gray-failure verdict, or behind a link with open congestion or an open
    /// gray failure (a cable that loses its carrier).
    pub degraded: bool,
}

/// One complete training step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepSample {
    pub step_ns: u64,
    pub comm_ns: u64,
}

/// Open verdicts of the job, reduced to what the policy acts on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VerdictSummary {
    /// Peers with an open gray-failure verdict.
    pub gray_peers: BTreeSet<IpAddr>,
    /// Links with open congestion (never shown to the tenant).
    pub congested_links: BTreeSet<String>,
    /// Links with an open gray-failure verdict: a cable that loses its carrier (never shown to
    /// the tenant). Only the health of the peers behind it reads them: what a flap does to the
    /// job reaches the plan through its loss and communication time, as before.
    pub gray_links: BTreeSet<String>,
    /// A straggler verdict is open: a compute problem, never a reason to compress.
    pub straggler: bool,
}

impl VerdictSummary {
    /// From the detectors' open verdicts; verdicts of other jobs are ignored.
    pub fn of_job<'a>(job: &str, open: impl IntoIterator<Item = &'a Verdict>) -> Self {
        let mut s = VerdictSummary::default();
        for v in open.into_iter().filter(|v| v.job == job && v.ended_ns.is_none()) {
            match (v.kind, &v.scope) {
                (VerdictKind::GrayFailure, Scope::Peer { peer, .. }) => {
                    s.gray_peers.insert(*peer);
                }
                (VerdictKind::Congestion, Scope::Link { link }) => {
                    s.congested_links.insert(link.clone());
                }
                (VerdictKind::GrayFailure, Scope::Link { link }) => {
                    s.gray_links.insert(link.clone());
                }
                (VerdictKind::Straggler, _) => s.straggler = true,
                _ => {}
            }
        }
        s
    }
}

/// Everything the policy takes from one window.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowObservation {
    pub window_end_ns: u64,
    /// Sorted by address.
    pub peers: Vec<PeerObservation>,
    pub steps: Vec<StepSample>,
    /// No step completed in the window but the job's traffic went on: the communication time
    /// so far of the step still open ([`StepTracker::open_comm_ns`]), seconds. A lower bound: a
    /// path so slow that a step outlasts the windows (a rate cap whose queue never drains in
    /// the compute phase) shows here and in no completed step.
    pub open_comm_s: Option<f64>,
    /// Bytes the peers sent to this host per step (window bytes / steps in the window).
    pub bytes_per_step: Option<f64>,
    pub verdicts: VerdictSummary,
    /// Whether a link the job's traffic crosses is congested (for the reason string only).
    pub uplink_congested: bool,
    /// At one host's end of the wire: the slowest in-burst goodput of that host's own sends to
    /// one peer (with at least `min_window_bytes` to it). A slow link on its send path (a
    /// capped cable at the receiver's end) shows here and in no peer's receive goodput.
    pub local_goodput_bps: Option<f64>,
}

impl WindowObservation {
    /// Observes `w`; `tracker` carries the job's open step from the previous window.
    pub fn from_window(p: &PhaseParams, w: &JobWindow, verdicts: VerdictSummary, tracker: &mut StepTracker) -> Self {
        let mut order: Vec<_> = w.peers.iter().collect();
        order.sort_by_key(|pw| pw.peer);
        let mut peers = Vec::with_capacity(order.len());
        let mut all_bursts: Vec<BurstSummary> = Vec::new();
        let mut total_bytes = 0u64;
        for pw in order {
            let idle = pw.bytes < p.min_window_bytes;
            let (mut bytes, mut dur) = (0u64, 0u64);
            for ph in merge_phases(&pw.bursts, p.merge_gap_ns, p.max_phases).iter().filter(|ph| ph.bytes >= p.min_phase_bytes) {
                bytes = bytes.saturating_add(ph.bytes);
                dur = dur.saturating_add(ph.end_ns - ph.start_ns);
            }
            let goodput_bps = (!idle && dur > 0).then(|| bytes as f64 * 1e9 / dur as f64);
            let loss_ratio = (!idle && pw.data_packets >= p.min_data_packets.max(1))
                .then(|| pw.loss_packets() as f64 / pw.data_packets as f64);
            let degraded =
                verdicts.gray_peers.contains(&pw.peer) || verdicts.congested_links.contains(&pw.link) || verdicts.gray_links.contains(&pw.link);
            peers.push(PeerObservation { peer: pw.peer, idle, goodput_bps, loss_ratio, degraded });
            if !idle {
                total_bytes = total_bytes.saturating_add(pw.bytes);
                all_bursts.extend(pw.bursts.iter().copied());
            }
            if all_bursts.len() > p.max_phases.saturating_mul(64) {
                break;
            }
        }
        // At one host's end of the wire (its NIC, its IPU) the host's own sends are part of its
        // communication too: with a slow link further down a ring, what it receives comes in
        // short bursts with long waits between them (each waiting on the slow hop), which alone
        // look like compute gaps; its own sends, paced by that slow hop, fill the waits.
        let mut local_goodput_bps = None;
        if let Some(local) = &w.local {
            let room = p.max_phases.saturating_mul(64).saturating_sub(all_bursts.len());
            all_bursts.extend(local.bursts.iter().take(room).copied());
            let mut by_dest: BTreeMap<Option<IpAddr>, Vec<BurstSummary>> = BTreeMap::new();
            for b in local.bursts.iter().take(p.max_phases.saturating_mul(64)) {
                by_dest.entry(b.to).or_default().push(*b);
            }
            local_goodput_bps = by_dest
                .values()
                .filter_map(|bursts| {
                    let phases = merge_phases(bursts, p.merge_gap_ns, p.max_phases);
                    let kept = phases.iter().filter(|ph| ph.bytes >= p.min_phase_bytes);
                    let (bytes, dur) = kept.fold((0u64, 0u64), |(b, d), ph| (b.saturating_add(ph.bytes), d.saturating_add(ph.end_ns - ph.start_ns)));
                    (bytes >= p.min_window_bytes && dur > 0).then(|| bytes as f64 * 1e9 / dur as f64)
                })
                .min_by(f64::total_cmp);
        }
        let phases = merge_phases(&all_bursts, p.merge_gap_ns, p.max_phases);
        let steps = tracker.feed(p, &phases);
        let open_comm_s = if steps.is_empty() && !phases.is_empty() { tracker.open_comm_ns(w.window_start_ns).map(|ns| ns as f64 / 1e9) } else { None };
        let window_ns = w.window_end_ns.saturating_sub(w.window_start_ns);
        let bytes_per_step = median(steps.iter().map(|s| s.step_ns as f64))
            .filter(|&st| st > 0.0 && window_ns > 0)
            .map(|st| total_bytes as f64 / (window_ns as f64 / st));
        let uplink_congested = !verdicts.congested_links.is_empty();
        WindowObservation { window_end_ns: w.window_end_ns, peers, steps, open_comm_s, bytes_per_step, verdicts, uplink_congested, local_goodput_bps }
    }

    /// Slowest in-burst goodput among active peers and the local host's sends: the job's
    /// bottleneck path.
    pub fn bottleneck_bps(&self) -> Option<f64> {
        self.peers.iter().filter_map(|p| p.goodput_bps).chain(self.local_goodput_bps).min_by(f64::total_cmp)
    }

    pub fn active_peers(&self) -> usize {
        self.peers.iter().filter(|p| !p.idle).count()
    }

    pub fn comm_s(&self) -> Option<f64> {
        median(self.steps.iter().map(|s| s.comm_ns as f64 / 1e9))
    }

    /// The completed steps' communication time, else the open step's so far (a lower bound).
    pub fn comm_or_open_s(&self) -> Option<f64> {
        self.comm_s().or(self.open_comm_s)
    }

    pub fn step_s(&self) -> Option<f64> {
        median(self.steps.iter().map(|s| s.step_ns as f64 / 1e9))
    }
}

/// The job's open step across windows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTracker {
    step_start_ns: Option<u64>,
    last_end_ns: Option<u64>,
}

impl StepTracker {
    /// Feeds the job-wide phases of one window (sorted by start); returns the steps completed.
    pub(crate) fn feed(&mut self, p: &PhaseParams, phases: &[Phase]) -> Vec<StepSample> {
        let mut prev = self.last_end_ns;
        let mut gaps = Vec::new();
        for ph in phases {
            if let Some(e) = prev {
                if ph.start_ns > e && ph.start_ns - e <= p.window_ns && ph.start_ns - e >= p.min_idle_gap_ns {
                    gaps.push(ph.start_ns - e);
                }
            }
            prev = Some(prev.map_or(ph.end_ns, |x| x.max(ph.end_ns)));
        }
        gaps.sort_unstable();
        let typical = gaps.get(gaps.len() / 2).copied().unwrap_or(0);
        let min_gap = p.min_idle_gap_ns.max(typical / 2).max(p.merge_gap_ns + 1);
        let mut out = Vec::new();
        for ph in phases {
            match self.last_end_ns {
                Some(e) if ph.start_ns > e && ph.start_ns - e > p.window_ns => {
                    // The job was quiet for more than a window: not a step boundary we trust.
                    self.step_start_ns = Some(ph.start_ns);
                }
                Some(e) if ph.start_ns >= e.saturating_add(min_gap) => {
                    if let Some(s) = self.step_start_ns {
                        out.push(StepSample { step_ns: ph.start_ns - s, comm_ns: e.saturating_sub(s) });
                    }
                    self.step_start_ns = Some(ph.start_ns);
                }
                None => self.step_start_ns = Some(ph.start_ns),
                _ => {}
            }
            self.last_end_ns = Some(self.last_end_ns.map_or(ph.end_ns, |x| x.max(ph.end_ns)));
        }
        out
    }

    /// Communication time so far of the open step, when its traffic reached into the window that
    /// starts at `window_start_ns` (a step still running, not a job gone quiet): a lower bound
    /// on that step's communication time.
    pub(crate) fn open_comm_ns(&self, window_start_ns: u64) -> Option<u64> {
        let (s, e) = (self.step_start_ns?, self.last_end_ns?);
        (e > window_start_ns && e > s).then(|| e - s)
    }
}

/// Median of finite values; `None` for none (the definition shared with the evaluations).
pub use ringside_stats::median;

/// One window, summarised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowSummary {
    pub comm_s: Option<f64>,
    /// [`WindowObservation::open_comm_s`].
    pub open_comm_s: Option<f64>,
    pub step_s: Option<f64>,
    pub bottleneck_bps: Option<f64>,
    pub bytes_per_step: Option<f64>,
    pub ranks: usize,
    /// Highest loss ratio among the job's peers.
    pub max_loss: Option<f64>,
}

impl WindowSummary {
    pub fn of(o: &WindowObservation) -> Self {
        WindowSummary {
            comm_s: o.comm_s(),
            open_comm_s: o.open_comm_s,
            step_s: o.step_s(),
            bottleneck_bps: o.bottleneck_bps(),
            bytes_per_step: o.bytes_per_step,
            ranks: o.active_peers() + 1,
            max_loss: o.peers.iter().filter_map(|p| p.loss_ratio).max_by(f64::total_cmp),
        }
    }
}

/// The last few windows, answered with medians.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservationHistory {
    cap: usize,
    windows: VecDeque<WindowSummary>,
}

impl ObservationHistory {
    pub fn new(cap: usize) -> Self {
        ObservationHistory { cap: cap.max(1), windows: VecDeque::new() }
    }

    pub fn push(&mut self, s: WindowSummary) {
        if self.windows.len() == self.cap {
            self.windows.pop_front();
        }
        self.windows.push_back(s);
    }

    /// Forgets everything (after a plan change the old samples describe another plan).
    pub fn clear(&mut self) {
        self.windows.clear();
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    fn med(&self, f: impl Fn(&WindowSummary) -> Option<f64>) -> Option<f64> {
        median(self.windows.iter().filter_map(f))
    }

    pub fn comm_s(&self) -> Option<f64> {
        self.med(|w| w.comm_s)
    }
    /// [`Self::comm_s`], or when no recent window completed a step, the longest communication
    /// time so far of an open step in them (a lower bound on the job's communication time now).
    pub fn comm_or_open_s(&self) -> Option<f64> {
        self.comm_s().or_else(|| self.windows.iter().filter_map(|w| w.open_comm_s).max_by(f64::total_cmp))
    }
    pub fn step_s(&self) -> Option<f64> {
        self.med(|w| w.step_s)
    }
    pub fn bottleneck_bps(&self) -> Option<f64> {
        self.med(|w| w.bottleneck_bps)
    }
    pub fn bytes_per_step(&self) -> Option<f64> {
        self.med(|w| w.bytes_per_step)
    }
    pub fn max_loss(&self) -> Option<f64> {
        self.med(|w| w.max_loss)
    }
    pub fn ranks(&self) -> usize {
        self.med(|w| Some(w.ranks as f64)).map_or(2, |r| r.round() as usize).max(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::{LocalSends, PeerWindow};

    const MS: u64 = 1_000_000;

    fn params() -> PhaseParams {
        PhaseParams::default()
    }

    fn ph(s: u64, e: u64) -> Phase {
        Phase { start_ns: s * MS, end_ns: e * MS, bytes: 1 << 20 }
    }

    #[test]
    fn steps_are_phases_after_compute_gaps_across_windows() {
        let mut t = StepTracker::default();
        // Step: 40 ms of communication (with a 12 ms stall inside), then 60 ms compute.
        let w1 = [ph(0, 20), ph(32, 40), ph(100, 120), ph(132, 140)];
        let s1 = t.feed(&params(), &w1);
        assert_eq!(s1, vec![StepSample { step_ns: 100 * MS, comm_ns: 40 * MS }]);
        let s2 = t.feed(&params(), &[ph(200, 220), ph(232, 240)]);
        assert_eq!(s2, vec![StepSample { step_ns: 100 * MS, comm_ns: 40 * MS }]);
        // A 250 ms retransmission timeout inside one step's communication does not hide the
        // other steps' compute gaps (it splits its own step instead).
        let mut r = StepTracker::default();
        let w = [ph(0, 40), ph(100, 140), ph(200, 220), ph(470, 480), ph(540, 580), ph(640, 680)];
        let comm: Vec<u64> = r.feed(&params(), &w).iter().map(|s| s.comm_ns / MS).collect();
        assert_eq!(comm, vec![40, 40, 20, 10, 40]);
        // Quiet for more than a window: no step spans the hole.
        assert!(t.feed(&params(), &[ph(5000, 5040)]).is_empty());
        assert_eq!(t.feed(&params(), &[ph(5100, 5140)]).len(), 1);
    }

    fn pw(peer: &str, link: &str, bursts: Vec<BurstSummary>, data: u64, retrans: u64) -> PeerWindow {
        PeerWindow {
            peer: peer.parse().unwrap(),
            link: link.into(),
            bytes: bursts.iter().map(|b| b.bytes).sum(),
            data_packets: data,
            retrans,
            ce_marks: 0,
            cnps: 0,
            psn_gap_packets: 0,
            naks: 0,
            bursts,
            explained_by: None,
            shared_links: Vec::new(),
            pokes: Vec::new(),
        }
    }

    /// Ten 1 MB bursts, one every 100 ms, each `len_ms` long.
    fn ten_bursts(len_ms: u64) -> Vec<BurstSummary> {
        (0..10).map(|i| BurstSummary { start_ns: i * 100 * MS, end_ns: (i * 100 + len_ms) * MS, bytes: 1_000_000, to: None }).collect()
    }

    /// Job `j`'s window of one second with `peers`, and nothing else.
    fn one_second_window(peers: Vec<PeerWindow>) -> JobWindow {
        JobWindow {
            job: "j".into(),
            window_start_ns: 0,
            window_end_ns: 1000 * MS,
            peers,
            links: Vec::new(),
            conns: Vec::new(),
            local: None,
        }
    }

    #[test]
    fn goodput_loss_and_verdict_attribution() {
        let w = one_second_window(vec![
            pw("10.0.0.3", "l2", ten_bursts(40), 10_000, 200),
            pw("10.0.0.2", "l1", ten_bursts(10), 10_000, 1),
        ]);
        let v = VerdictSummary { gray_peers: ["10.0.0.3".parse().unwrap()].into(), ..Default::default() };
        let o = WindowObservation::from_window(&params(), &w, v, &mut StepTracker::default());
        assert_eq!(o.peers[0].peer.to_string(), "10.0.0.2");
        assert!((o.peers[0].goodput_bps.unwrap() - 1e8).abs() < 1.0);
        assert!((o.peers[1].goodput_bps.unwrap() - 2.5e7).abs() < 1.0);
        assert_eq!(o.peers[1].loss_ratio, Some(0.02));
        assert!(o.peers[1].degraded && !o.peers[0].degraded);
        assert_eq!(o.bottleneck_bps(), Some(2.5e7));
        assert_eq!(o.steps.len(), 9);
        assert_eq!(o.comm_s(), Some(0.04));
        assert_eq!(o.step_s(), Some(0.1));
        assert!((o.bytes_per_step.unwrap() - 2e6).abs() < 1.0);
    }

    /// A gray failure on a link (a flapping cable) marks the peers whose traffic comes in over it
    /// as degraded, and only them; it is not a congested uplink.
    #[test]
    fn a_gray_failure_on_a_link_degrades_the_peers_behind_it() {
        let w = one_second_window(vec![pw("10.0.0.2", "p1", ten_bursts(10), 10_000, 1), pw("10.0.0.3", "p2", ten_bursts(10), 10_000, 1)]);
        let verdict = |kind, link: &str| Verdict {
            job: "j".into(),
            scope: Scope::Link { link: link.into() },
            ..crate::events::tests::verdict(1, kind, "10.0.0.3")
        };
        let open = [verdict(VerdictKind::GrayFailure, "p2")];
        let v = VerdictSummary::of_job("j", open.iter());
        assert_eq!(v.gray_links, ["p2".to_string()].into());
        assert!(v.congested_links.is_empty() && v.gray_peers.is_empty());
        let o = WindowObservation::from_window(&params(), &w, v, &mut StepTracker::default());
        let degraded: Vec<(String, bool)> = o.peers.iter().map(|p| (p.peer.to_string(), p.degraded)).collect();
        assert_eq!(degraded, vec![("10.0.0.2".into(), false), ("10.0.0.3".into(), true)]);
        assert!(!o.uplink_congested);
        // Another job's verdict on the same link is not this job's.
        let other = [Verdict { job: "k".into(), ..verdict(VerdictKind::GrayFailure, "p2") }];
        assert!(VerdictSummary::of_job("j", other.iter()).gray_links.is_empty());
    }

    /// From an IPU (or a host NIC), with host 1's link capped further down a 4-rank ring: host 0
    /// receives each 1 MiB segment in 3 ms and then waits ~55 ms for the next (every hop waits
    /// on the capped one), while its own sends to host 1 trickle through the whole 330 ms of
    /// communication. Its receives alone look like 58 ms steps of 3 ms communication (what the
    /// agent in IPU 0 reported when t2_ipu's rate cap got no hint); with its sends, one step is
    /// 380 ms with 330 ms of communication.
    #[test]
    fn the_local_hosts_sends_fill_the_waits_of_a_paced_ring() {
        let b = |s: u64, e: u64| BurstSummary { start_ns: s * MS, end_ns: e * MS, bytes: 1 << 20, to: None };
        let step_ms = 380;
        let mut received = Vec::new();
        let mut sent = Vec::new();
        for k in 0..3u64 {
            let t0 = k * step_ms;
            received.extend((0..6).map(|i| b(t0 + i * 55, t0 + i * 55 + 3)));
            // Paced sends: a 2 ms burst every 5 ms (gaps below the merge gap) for 330 ms.
            sent.extend((0..66).map(|i| b(t0 + i * 5, t0 + i * 5 + 2)));
        }
        let window = |local: Option<LocalSends>| JobWindow {
            job: "j".into(),
            window_start_ns: 0,
            window_end_ns: 3 * step_ms * MS,
            peers: vec![pw("10.0.0.4", "fabric", received.clone(), 10_000, 0)],
            links: Vec::new(),
            conns: Vec::new(),
            local,
        };
        let alone = WindowObservation::from_window(&params(), &window(None), VerdictSummary::default(), &mut StepTracker::default());
        assert!(alone.comm_s().unwrap() < 0.01, "receives alone: comm {:?}, step {:?}", alone.comm_s(), alone.step_s());
        let local = LocalSends { addr: "10.0.0.1".parse().unwrap(), link: "fabric".into(), bursts: sent.clone(), pokes: Vec::new() };
        let with = WindowObservation::from_window(&params(), &window(Some(local)), VerdictSummary::default(), &mut StepTracker::default());
        assert_eq!(with.steps.len(), 2, "{:?}", with.steps);
        assert_eq!(with.step_s(), Some(0.38));
        assert_eq!(with.comm_s(), Some(0.327));
        // The peers' goodput stays what this host received; the bottleneck is the paced sends':
        // 66 × 1 MiB in 327 ms per step.
        assert_eq!(with.peers, alone.peers);
        assert_eq!(alone.bottleneck_bps(), alone.peers[0].goodput_bps);
        let paced = 66.0 * (1u64 << 20) as f64 / 0.327;
        assert!((with.bottleneck_bps().unwrap() - paced).abs() < 1.0, "{:?} vs {paced}", with.bottleneck_bps());
    }

    #[test]
    fn history_medians_ignore_one_odd_window() {
        let mut h = ObservationHistory::new(3);
        for c in [0.04, 0.5, 0.041, 0.039] {
            h.push(WindowSummary { comm_s: Some(c), open_comm_s: None, step_s: None, bottleneck_bps: None, bytes_per_step: None, ranks: 4, max_loss: None });
        }
        assert_eq!(h.len(), 3);
        assert_eq!(h.comm_s(), Some(0.041));
        assert_eq!(h.ranks(), 4);
        assert_eq!(median([1.0, 2.0].into_iter()), Some(1.5));
        assert_eq!(median(std::iter::empty::<f64>()), None);
    }
}
