//! Detectors: turn windows of per-peer counters into verdicts (congestion, gray failure,
//! straggler), as pure, deterministic functions of their input. No I/O, no clock: time is what the
//! windows say, so the collector can feed recorded windows and get the same verdicts.
//!
//! Pipeline per [`JobWindow`] (see [`DetectorSet::observe`]):
//! 1. features per peer ([`PeerWindow`] → in-burst goodput, loss rate, silence, phase-start
//!    lateness against the other peers of the same step, step-start lateness: how long after the
//!    other peers it ends a compute-like idle gap); when the window carries the job's connections,
//!    attribution ([`crate::attribution`], with the job's last 3 windows of structural blame)
//!    sets which peer explains which;
//! 2. leave-one-out median/MAD of the job's *other* peers, per peer (for loss, without the peers
//!    it explains);
//! 3. per link: congestion (several peers degrading together, CE/CNP growth, loss spread) and
//!    a flap (its interface lost its carrier: a gray failure of the link, raised at once);
//! 4. per peer: gray failure (outlier against the other peers, unless its link is congested in
//!    that window, its traffic lost upstream together with other traffic, attribution explained
//!    it by another peer, or, at one host's end of the wire, a congestion or flap verdict on that
//!    host's own cable is open; a peer blamed only by attribution's guess is not raised on one severe
//!    window) and straggler (late start at normal goodput; never while the
//!    peer's own network metrics are anomalous);
//! 5. each (scope, detector) has a [`lifecycle`] track: raise on k of n anomalous windows (or one
//!    severe one), clear after m clean windows, classify gray failures.
//!
//! Invariants: memory per job is bounded by `max_peers_per_job` × (fixed history per peer) plus
//! one entry per link; scopes not seen for `forget_after_ns` are dropped; the same input sequence
//! always gives the same output (ordered maps, no randomness).

mod config;
mod congestion;
mod features;
mod gray;
mod input;
mod lifecycle;
mod outage;
mod port;
mod robust;
mod straggler;
mod verdict;

#[cfg(test)]
mod scenarios;
#[cfg(test)]
pub(crate) mod sim;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

pub use config::{CongestionConfig, DetectorConfig, GrayConfig, PersistenceConfig, StragglerConfig};
pub use input::{BurstSummary, JobWindow, LinkWindow, LocalSends, PeerWindow};
pub use port::{PortWindow, PORT_JOB};
pub(crate) use input::{merge_phases, Phase};
pub use verdict::{
    Classification, EndReason, Evidence, Metric, PeerCount, Reference, Scope, Severity, Verdict,
    VerdictChange, VerdictKind, WindowCount,
};

use crate::attribution;
use congestion::{LinkInput, LinkPeer};
use features::{fill_lateness, fill_step_lateness, peer_features, peer_stats, PeerFeatures};
use lifecycle::{Assessment, Track, TrackCtx};
use robust::{Robust, Ring};

/// A link that lost its carrier is named until it has kept it for this many windows (at least
/// `persistence.clear_windows`): a flapping link goes down again within seconds (the evaluation's
/// flap: 400 ms every 3 s), and one event per flapping episode is what an operator acts on, not
/// one per outage.
const FLAP_CLEAR_WINDOWS: u32 = 10;

/// Why a window was rejected. Every variant is a collector bug or a capacity limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DetectError {
    #[error("window of job {job} ends at {end_ns} ns, not after its start at {start_ns} ns: emit non-empty windows")]
    EmptyWindow { job: String, start_ns: u64, end_ns: u64 },
    #[error("window of job {job} lasts {len_ns} ns, outside [{min_ns}, {max_ns}] ns: emit windows of about `window_ns` or change it")]
    WindowLength { job: String, len_ns: u64, min_ns: u64, max_ns: u64 },
    #[error("window of job {job} starts at {start_ns} ns, before the previous one ended at {last_end_ns} ns: feed each job's windows in time order")]
    OutOfOrder { job: String, start_ns: u64, last_end_ns: u64 },
    #[error("peer {peer} appears twice in a window of job {job}: aggregate all of a peer's flows into one PeerWindow")]
    DuplicatePeer { job: String, peer: IpAddr },
    #[error("{max} jobs are already tracked: raise `max_jobs` or let finished jobs expire")]
    TooManyJobs { max: usize },
}

#[derive(Debug)]
struct PeerState {
    link: String,
    last_seen_ns: u64,
    goodput_baseline: Ring,
    prev_phase_starts: Vec<u64>,
    last_phase_end_ns: Option<u64>,
    prev_step_starts: Vec<u64>,
    last_step_end_ns: Option<u64>,
    /// The peer whose path explained this one's degradation in its last active window
    /// (`PeerFeatures::explained_by`).
    explained_by_last: Option<IpAddr>,
    gray: Track,
    straggler: Track,
}

#[derive(Debug)]
struct LinkState {
    last_seen_ns: u64,
    ce_baseline: Ring,
    cnp_baseline: Ring,
    /// The job's in-burst goodput on the link's egress, in windows not judged congested.
    egress_goodput_baseline: Ring,
    /// The egress queue's drop ratio, in windows not judged congested.
    queue_drop_baseline: Ring,
    /// The egress queue's throttles per packet sent, in windows not judged congested.
    queue_throttle_baseline: Ring,
    /// Seen as the host's own cable (`JobWindow::local`'s link) in some window.
    own_cable: bool,
    congestion: Track,
    /// Gray failure of the link itself: its carrier lost ([`gray::link_flap`]).
    flap: Track,
}

#[derive(Debug)]
struct JobState {
    /// Per active peer of the last window: (peer, phase lateness, step lateness) in ns, for the
    /// replay tool (`scenarios::replay_recorded_windows`).
    #[cfg(test)]
    last_lateness: Vec<(IpAddr, Option<f64>, Option<f64>)>,
    /// Per active peer of the last window, for the replay tool: how gray judged it (goodput and
    /// own baseline median in Mbit/s, loss rate, the state before an explanation makes it
    /// ambiguous, the peer attribution explained it by, a congested link).
    #[cfg(test)]
    last_gray: Vec<String>,
    last_end_ns: u64,
    peers: BTreeMap<IpAddr, PeerState>,
    links: BTreeMap<String, LinkState>,
    /// Who the job's last windows blamed structurally ([`crate::attribution`]).
    blame: attribution::BlameMemory,
    /// The job's recent stalls ([`outage`]).
    outages: outage::OutageMemory,
}

/// The evidence of an [`outage::Outage`]: the job's silence in the window against its usual one.
fn outage_evidence(o: &outage::Outage) -> Evidence {
    Evidence {
        metric: Metric::SilenceNs,
        value: o.silence_ns,
        reference: o.usual.median,
        reference_kind: Reference::OwnBaseline,
        mad: o.usual.mad,
        peers: None,
        windows: WindowCount::default(),
    }
}

fn warm(ring: &Ring, cfg: &DetectorConfig) -> Option<Robust> {
    (ring.len() >= cfg.congestion.baseline_min_windows.max(1)).then(|| ring.robust()).flatten()
}

impl JobState {
    fn new(cfg: &DetectorConfig) -> Self {
        Self {
            #[cfg(test)]
            last_lateness: Vec::new(),
            #[cfg(test)]
            last_gray: Vec::new(),
            last_end_ns: 0,
            peers: BTreeMap::new(),
            links: BTreeMap::new(),
            blame: attribution::BlameMemory::default(),
            outages: outage::OutageMemory::new(cfg.congestion.baseline_windows),
        }
    }

    fn observe(
        &mut self,
        cfg: &DetectorConfig,
        w: &JobWindow,
        next_id: &mut u64,
        ignored_peers: &mut u64,
    ) -> Vec<VerdictChange> {
        let mut changes = Vec::new();
        self.last_end_ns = w.window_end_ns;
        let mut order: Vec<&PeerWindow> = w.peers.iter().collect();
        order.sort_by_key(|p| p.peer);

        // 1. Features of the active peers.
        let mut feats = Vec::new();
        let mut prev_starts = Vec::new();
        let mut prev_step_starts = Vec::new();
        for pw in order {
            if pw.bytes < cfg.min_window_bytes {
                if let Some(ps) = self.peers.get_mut(&pw.peer) {
                    ps.last_seen_ns = w.window_end_ns;
                }
                continue;
            }
            if !self.peers.contains_key(&pw.peer) && self.peers.len() >= cfg.max_peers_per_job {
                *ignored_peers += 1;
                continue;
            }
            let ps = self.peers.entry(pw.peer).or_insert_with(|| PeerState {
                link: pw.link.clone(),
                last_seen_ns: w.window_end_ns,
                goodput_baseline: Ring::new(cfg.congestion.baseline_windows),
                prev_phase_starts: Vec::new(),
                last_phase_end_ns: None,
                prev_step_starts: Vec::new(),
                last_step_end_ns: None,
                explained_by_last: None,
                gray: Track::default(),
                straggler: Track::default(),
            });
            if ps.link != pw.link {
                // The peer moved to another path: its goodput history describes the old one.
                ps.link = pw.link.clone();
                ps.goodput_baseline = Ring::new(cfg.congestion.baseline_windows);
            }
            ps.last_seen_ns = w.window_end_ns;
            feats.push(peer_features(cfg, pw, w.window_start_ns, ps.last_phase_end_ns, ps.last_step_end_ns));
            prev_starts.push(std::mem::take(&mut ps.prev_phase_starts));
            prev_step_starts.push(std::mem::take(&mut ps.prev_step_starts));
        }
        // Peers blamed in this window only by attribution's lone-connection guess.
        let mut guessed: BTreeSet<IpAddr> = BTreeSet::new();
        if !w.conns.is_empty() {
            // Every peer of the window is a candidate, idle ones too (as the connections are).
            let candidates: BTreeSet<IpAddr> = w.peers.iter().map(|p| p.peer).collect();
            // A fault lasts: a lone bad connection goes to the end whose gray failure is open
            // (a flapping host's sends lost on its next flap) as to one blamed structurally of
            // late.
            let mut recent = self.blame.recent();
            recent.extend(self.peers.iter().filter(|(_, p)| p.gray.open_verdict().is_some()).map(|(a, _)| *a));
            let blame = attribution::attribute(&w.conns, &candidates, &recent);
            self.blame.push(&blame);
            for f in &mut feats {
                f.explained_by = blame.explained_by.get(&f.peer).copied();
            }
            guessed = blame.blamed.difference(&blame.structural).copied().collect();
        }
        fill_lateness(cfg, &mut feats, &prev_starts);
        fill_step_lateness(cfg, &mut feats, &prev_step_starts);
        #[cfg(test)]
        {
            self.last_lateness = feats.iter().map(|f| (f.peer, f.lateness_ns, f.step_lateness_ns)).collect();
        }
        let stats = peer_stats(cfg, &feats);

        // 2. Links.
        let mut by_link: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, f) in feats.iter().enumerate() {
            by_link.entry(f.link.as_str()).or_default().push(i);
        }
        // Links with shared-loss evidence but no active peer of their own, and links whose
        // congestion or flap verdict is open (so it can clear), are assessed too.
        for l in &w.links {
            by_link.entry(l.link.as_str()).or_default();
        }
        let open_links: Vec<String> = self
            .links
            .iter()
            .filter(|(_, l)| l.congestion.open_verdict().is_some() || l.flap.open_verdict().is_some())
            .map(|(n, _)| n.clone())
            .collect();
        for name in &open_links {
            by_link.entry(name.as_str()).or_default();
        }
        let window_s = (w.window_end_ns - w.window_start_ns) as f64 / 1e9;
        // Links whose inbound traffic lost upstream together with other traffic: the peers that
        // come in by them are evidence of that upstream path (which the agent there, on its
        // egress, reports), neither of this link nor of their own.
        let upstream_lossy: BTreeSet<&str> = w
            .links
            .iter()
            .filter(|l| l.upstream_shared_loss(cfg.congestion.min_shared_loss_flows))
            .map(|l| l.link.as_str())
            .collect();
        // On a switch, links whose inbound traffic shares its way in with other traffic: several
        // of their peers slowing down together is then a queue on that shared path, which this
        // vantage cannot place (this link's far end or a link before it). Not this link's
        // congestion, and not those peers' gray failures: say nothing (the agent whose egress
        // holds the queue sees the competition there). At a host's own end of the wire every
        // peer crosses the host's cable, whose congestion is named as before (below).
        let upstream_competed: BTreeSet<&str> = w
            .links
            .iter()
            .filter(|l| w.local.is_none() && l.upstream_competition(cfg.congestion.competition_min_other))
            .map(|l| l.link.as_str())
            .collect();
        let mut shared_upstream: BTreeSet<&str> = BTreeSet::new();
        let mut congested: BTreeSet<&str> = BTreeSet::new();
        let flap_persistence =
            PersistenceConfig { clear_windows: cfg.persistence.clear_windows.max(FLAP_CLEAR_WINDOWS), ..cfg.persistence.clone() };
        for (link, idxs) in &by_link {
            let ls = self.links.entry((*link).to_owned()).or_insert_with(|| LinkState {
                last_seen_ns: w.window_end_ns,
                ce_baseline: Ring::new(cfg.congestion.baseline_windows),
                cnp_baseline: Ring::new(cfg.congestion.baseline_windows),
                egress_goodput_baseline: Ring::new(cfg.congestion.baseline_windows),
                queue_drop_baseline: Ring::new(cfg.congestion.baseline_windows),
                queue_throttle_baseline: Ring::new(cfg.congestion.baseline_windows),
                own_cable: false,
                congestion: Track::default(),
                flap: Track::default(),
            });
            ls.last_seen_ns = w.window_end_ns;
            // `local` is inferred from a window's own bursts, and a window of few or mixed
            // bursts has none: once a host's own cable, always (a switch port never is one).
            ls.own_cable |= w.local.as_ref().is_some_and(|l| l.link == *link);
            let scope = Scope::Link { link: (*link).to_owned() };
            let shared: Vec<&LinkWindow> = w.links.iter().filter(|l| l.link == *link).collect();
            let ctx = TrackCtx {
                job: &w.job,
                kind: VerdictKind::GrayFailure,
                scope: &scope,
                window_start_ns: w.window_start_ns,
                window_end_ns: w.window_end_ns,
            };
            changes.extend(ls.flap.observe(&flap_persistence, &ctx, gray::link_flap(&shared), true, true, next_id));
            let mut input = LinkInput {
                // A peer explained by another peer's path is that path's evidence, not the link's.
                peers: idxs
                    .iter()
                    .filter(|&&i| feats[i].explained_by.is_none() && !upstream_lossy.contains(feats[i].link.as_str()))
                    .map(|&i| LinkPeer {
                        f: &feats[i],
                        stats: &stats[i],
                        baseline: self.peers.get(&feats[i].peer).and_then(|p| warm(&p.goodput_baseline, cfg)),
                    })
                    .collect(),
                ce_baseline: warm(&ls.ce_baseline, cfg),
                cnp_baseline: warm(&ls.cnp_baseline, cfg),
                window_s,
                shared,
                egress_goodput_baseline: warm(&ls.egress_goodput_baseline, cfg),
                queue_drop_baseline: warm(&ls.queue_drop_baseline, cfg),
                queue_throttle_baseline: warm(&ls.queue_throttle_baseline, cfg),
                own_cable: ls.own_cable,
            };
            let egress_goodput = input.egress().and_then(LinkWindow::job_goodput_bps);
            let (mut assessment, mut rates) =
                congestion::assess(&cfg.congestion, &cfg.gray, cfg.min_data_packets, &input);
            if upstream_competed.contains(link) && assessment.as_ref().is_some_and(Assessment::is_anomalous) {
                // Congested with the peers, and without them? Only the link's own evidence (its
                // egress, its marks) may name it.
                input.peers.clear();
                let (own, own_rates) = congestion::assess(&cfg.congestion, &cfg.gray, cfg.min_data_packets, &input);
                if !own.as_ref().is_some_and(Assessment::is_anomalous) {
                    shared_upstream.insert(link);
                    assessment = Some(Assessment::ambiguous());
                    rates = own_rates;
                }
            }
            let Some(a) = assessment else { continue };
            if a.is_anomalous() {
                congested.insert(link);
            } else {
                rates.ce_rate.inspect(|&x| ls.ce_baseline.push(x));
                rates.cnp_per_s.inspect(|&x| ls.cnp_baseline.push(x));
                rates.queue_drop_ratio.inspect(|&x| ls.queue_drop_baseline.push(x));
                rates.queue_throttle_ratio.inspect(|&x| ls.queue_throttle_baseline.push(x));
                egress_goodput.inspect(|&x| ls.egress_goodput_baseline.push(x));
            }
            let ctx = TrackCtx {
                job: &w.job,
                kind: VerdictKind::Congestion,
                scope: &scope,
                window_start_ns: w.window_start_ns,
                window_end_ns: w.window_end_ns,
            };
            changes.extend(ls.congestion.observe(&cfg.persistence, &ctx, a, false, true, next_id));
        }

        // 3. Peers. Gray failure first for every peer: a severe window raises at once only when
        // it names one peer. Two unexplained peers severe together are usually the two ends of one
        // bad connection in a window attribution could not settle yet (a fault's first, partial
        // window): neither is raised on that window alone; k of n windows still decide.
        let clear_min = clear_minimum(&feats);
        let mut gray_all: Vec<Option<Assessment>> = feats
            .iter()
            .zip(&stats)
            .map(|(f, s)| {
                let baseline = self.peers.get(&f.peer).and_then(|ps| warm(&ps.goodput_baseline, cfg));
                gray::assess(&cfg.gray, f, s, baseline, clear_min == Some(f.peer))
            })
            .collect();
        // Attribution that contradicts the goodputs: a peer explained by another that moved its
        // bytes far slower than that other (at most `CLEAR_MINIMUM` of its goodput, or none at
        // all: a trickle with no whole phase). Seen at a rate cap's two ends, when attribution
        // reads the capped host's partner's slow sends as the fault and explains the capped host
        // by it. The partner's slowness alone then names nobody: unsure, say nothing.
        let goodput_of = |p: IpAddr| feats.iter().find(|f| f.peer == p).and_then(|f| f.goodput_bps);
        let contradicted: BTreeSet<IpAddr> = feats
            .iter()
            .filter_map(|e| {
                let p = e.explained_by?;
                let pg = goodput_of(p)?;
                e.goodput_bps.is_none_or(|g| g <= CLEAR_MINIMUM * pg).then_some(p)
            })
            .collect();
        for (f, a) in feats.iter().zip(gray_all.iter_mut()) {
            let goodput_only = |a: &Assessment| a.is_anomalous() && a.evidence.iter().all(|e| e.metric == Metric::InBurstGoodputBps);
            if contradicted.contains(&f.peer) && a.as_ref().is_some_and(goodput_only) {
                *a = Some(Assessment::ambiguous());
            }
        }
        let severe = |a: &Option<Assessment>| matches!(a, Some(a) if a.state == lifecycle::WindowState::Anomalous { severe: true });
        let severe_unexplained = feats.iter().zip(&gray_all).filter(|(f, a)| f.explained_by.is_none() && severe(a)).count();
        // Nor is a peer whose blame is only attribution's guess at one end of a lone bad
        // connection (after a flap, the resent burst of the flapped host to one neighbour can
        // land on that neighbour): a lasting fault shows again in the next windows.
        // Nor is a peer that the last window explained by a peer whose gray failure is still
        // open: its stall or loss right after is most likely that fault's tail (a segment lost
        // to the faulted host just before the fault ended waits out TCP's retransmission
        // timeout in the next window, when attribution no longer sees the fault).
        let tail_of_open_fault = |peer: &IpAddr| {
            self.peers.get(peer).and_then(|p| p.explained_by_last).is_some_and(|x| {
                self.peers.get(&x).is_some_and(|xp| xp.gray.open_verdict().is_some())
            })
        };
        for (f, a) in feats.iter().zip(gray_all.iter_mut()) {
            let Some(a) = a else { continue };
            if a.state == (lifecycle::WindowState::Anomalous { severe: true })
                && (severe_unexplained >= 2 || guessed.contains(&f.peer) || tail_of_open_fault(&f.peer))
            {
                a.state = lifecycle::WindowState::Anomalous { severe: false };
            }
        }
        // At one host's end of the wire (its NIC, its IPU's fabric port) every peer's traffic
        // crosses that host's own cable. While a congestion verdict on that cable is open (its
        // peers degraded together: the cable itself), or a flap verdict (its carrier lost), one
        // peer's loss or slowness is more likely the same fault's tail (a flap's resent data
        // lands on one neighbour a window later) than a second fault on that peer's side: say
        // nothing about the peer.
        // (`own_cable` is sticky: `local` is missing in windows of few bursts.)
        let own_cable_open = |link: &str| {
            self.links.get(link).is_some_and(|l| {
                l.own_cable && (l.congestion.open_verdict().is_some() || l.flap.open_verdict().is_some())
            })
        };
        // A host whose outages stall the whole job again and again (`outage`): the other
        // peers stall with it, so no per-peer comparison sees it. Raised on this window: the
        // rule already asked for several stalls.
        let outage = self.outages.observe(
            cfg.gray.stall_open_ns,
            cfg.congestion.baseline_min_windows,
            &feats,
            &w.conns,
            w.local.as_ref().map(|l| l.addr),
        );
        if let Some(o) = outage {
            if let Some(i) = feats.iter().position(|f| f.peer == o.peer) {
                if !gray_all[i].as_ref().is_some_and(Assessment::is_anomalous) {
                    gray_all[i] = Some(Assessment::anomalous(true, Severity::Critical, vec![outage_evidence(&o)], false));
                }
            }
        }
        let own_cable: Vec<bool> = feats.iter().map(|f| own_cable_open(&f.link)).collect();
        #[cfg(test)]
        {
            let mbit = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.0}", v / 1e6));
            self.last_gray = feats
                .iter()
                .zip(&gray_all)
                .map(|(f, a)| {
                    let base = self.peers.get(&f.peer).and_then(|p| warm(&p.goodput_baseline, cfg)).map(|r| r.median * 8.0);
                    let state = a.as_ref().map_or("-".into(), |a| format!("{:?}", a.state));
                    let expl = f.explained_by.map_or(String::new(), |p| format!(" expl_by={p}"));
                    format!(
                        "{} g={} base={} loss={:.4} {state}{expl}{}",
                        f.peer,
                        mbit(f.goodput_bps.map(|g| g * 8.0)),
                        mbit(base),
                        f.loss_rate.unwrap_or(0.0),
                        if congested.contains(f.link.as_str()) { " link-congested" } else { "" }
                    )
                })
                .collect();
        }
        for (i, ((f, s), gray_a)) in feats.iter().zip(&stats).zip(gray_all).enumerate() {
            let Some(ps) = self.peers.get_mut(&f.peer) else { continue };
            let link_congested = congested.contains(f.link.as_str());
            let gray_anomalous = gray_a.as_ref().is_some_and(Assessment::is_anomalous);
            let straggler_a = straggler::assess(&cfg.straggler, f, s, gray_anomalous);
            let scope = Scope::Peer { peer: f.peer, link: f.link.clone() };
            let ctx = |kind| TrackCtx {
                job: &w.job,
                kind,
                scope: &scope,
                window_start_ns: w.window_start_ns,
                window_end_ns: w.window_end_ns,
            };
            if let Some(a) = gray_a {
                // A congested link explains its peers' degradation: not a gray failure. So does
                // loss shared with other traffic upstream of the link the peer's traffic comes in
                // by (another switch's congested uplink), and another peer's bad path when all of
                // this peer's bad connections run to it (`crate::attribution`): the gray failure
                // is that peer's. At one host's end of the wire, so does an open congestion
                // verdict on the host's own cable (above).
                let via_congested = f.shared_links.iter().any(|l| congested.contains(l.as_str()));
                let upstream = upstream_lossy.contains(f.link.as_str()) || shared_upstream.contains(f.link.as_str());
                let explained =
                    link_congested || via_congested || upstream || f.explained_by.is_some() || own_cable[i];
                let a = if explained && a.is_anomalous() { Assessment::ambiguous() } else { a };
                let ctx = ctx(VerdictKind::GrayFailure);
                changes.extend(ps.gray.observe(&cfg.persistence, &ctx, a, true, true, next_id));
            }
            if let Some(a) = straggler_a {
                let ctx = ctx(VerdictKind::Straggler);
                let persistence = PersistenceConfig { raise_k: cfg.straggler.raise_k, raise_n: cfg.straggler.raise_n, ..cfg.persistence.clone() };
                changes.extend(ps.straggler.observe(&persistence, &ctx, a, false, false, next_id));
            }
            if !link_congested && !gray_anomalous && !shared_upstream.contains(f.link.as_str()) {
                f.goodput_bps.inspect(|&g| ps.goodput_baseline.push(g));
            }
            ps.last_phase_end_ns = f.last_phase_end_ns;
            ps.prev_phase_starts.clone_from(&f.phase_starts);
            ps.last_step_end_ns = f.steps.last_end_ns;
            ps.explained_by_last = f.explained_by;
            ps.prev_step_starts = f.steps.starts.iter().map(|&(_, s)| s).collect();
        }
        changes
    }

    /// Drops peers and links not seen since `now_ns - forget_after_ns`, closing their verdicts.
    fn expire_members(&mut self, now_ns: u64, forget_after_ns: u64) -> Vec<VerdictChange> {
        let stale = |last: u64| last.saturating_add(forget_after_ns) < now_ns;
        let mut changes = Vec::new();
        self.links.retain(|_, l| {
            if !stale(l.last_seen_ns) {
                return true;
            }
            changes.extend(l.congestion.expire(l.last_seen_ns));
            changes.extend(l.flap.expire(l.last_seen_ns));
            false
        });
        self.peers.retain(|_, p| {
            if !stale(p.last_seen_ns) {
                return true;
            }
            changes.extend(p.gray.expire(p.last_seen_ns));
            changes.extend(p.straggler.expire(p.last_seen_ns));
            false
        });
        changes
    }

    fn tracks(&self) -> impl Iterator<Item = &Track> {
        self.links
            .values()
            .flat_map(|l| [&l.congestion, &l.flap])
            .chain(self.peers.values().flat_map(|p| [&p.gray, &p.straggler]))
    }
}

/// See [`clear_minimum`].
const CLEAR_MINIMUM: f64 = 0.6;

/// The peer whose in-burst goodput is the window's clear minimum (at most `CLEAR_MINIMUM` × the
/// next lowest): the only one a drop far below both the peers and its own history may name when
/// the z test cannot (other peers slowed with it; [`gray::assess`]). The next lowest skips the
/// peers that attribution explains by the minimum's own path: they are slow because of it (a
/// capped host's ring successor forwards only as fast as the capped host feeds it). The minimum
/// itself is the lowest of all peers, explained or not, so attribution's occasional wrong end of
/// a bad connection cannot make the second-slowest peer the minimum.
fn clear_minimum(feats: &[PeerFeatures]) -> Option<IpAddr> {
    let mut g: Vec<(f64, &PeerFeatures)> = feats.iter().filter_map(|f| f.goodput_bps.map(|g| (g, f))).collect();
    g.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (&(low, f), rest) = g.split_first()?;
    let &(next, _) = rest.iter().find(|(_, o)| o.explained_by != Some(f.peer))?;
    (low <= CLEAR_MINIMUM * next).then_some(f.peer)
}

/// All detectors for all jobs of this host.
#[derive(Debug)]
pub struct DetectorSet {
    cfg: DetectorConfig,
    jobs: BTreeMap<String, JobState>,
    /// RDMA ports judged from their own counters ([`port`]): here so verdict ids stay unique.
    ports: port::PortDetectors,
    next_id: u64,
    ignored_peers_total: u64,
}

impl DetectorSet {
    pub fn new(cfg: DetectorConfig) -> Self {
        Self { cfg, jobs: BTreeMap::new(), ports: port::PortDetectors::default(), next_id: 1, ignored_peers_total: 0 }
    }

    pub fn config(&self) -> &DetectorConfig {
        &self.cfg
    }

    /// Feeds one window of one job; returns the verdicts opened, updated and closed by it
    /// (including those of any job, peer or link that expired by `window_end_ns`), ordered:
    /// expiries, then links by id, then peers by address (gray failure before straggler).
    pub fn observe(&mut self, w: &JobWindow) -> Result<Vec<VerdictChange>, DetectError> {
        let (start, end) = (w.window_start_ns, w.window_end_ns);
        if end <= start {
            return Err(DetectError::EmptyWindow { job: w.job.clone(), start_ns: start, end_ns: end });
        }
        let (min_ns, max_ns) = (self.cfg.window_ns / 2, self.cfg.window_ns.saturating_mul(2));
        if !(min_ns..=max_ns).contains(&(end - start)) {
            return Err(DetectError::WindowLength { job: w.job.clone(), len_ns: end - start, min_ns, max_ns });
        }
        let mut seen = BTreeSet::new();
        if let Some(p) = w.peers.iter().find(|p| !seen.insert(p.peer)) {
            return Err(DetectError::DuplicatePeer { job: w.job.clone(), peer: p.peer });
        }
        let forget = self.cfg.forget_after_ns;
        match self.jobs.get(&w.job) {
            Some(j) if start < j.last_end_ns => {
                return Err(DetectError::OutOfOrder { job: w.job.clone(), start_ns: start, last_end_ns: j.last_end_ns });
            }
            None => {
                let live = self.jobs.values().filter(|j| j.last_end_ns.saturating_add(forget) >= end).count();
                if live >= self.cfg.max_jobs {
                    return Err(DetectError::TooManyJobs { max: self.cfg.max_jobs });
                }
            }
            _ => {}
        }
        let mut changes = self.expire(end);
        let job = self.jobs.entry(w.job.clone()).or_insert_with(|| JobState::new(&self.cfg));
        changes.extend(job.observe(&self.cfg, w, &mut self.next_id, &mut self.ignored_peers_total));
        Ok(changes)
    }

    /// Forgets jobs, peers and links not seen since `now_ns - forget_after_ns`, closing their
    /// open verdicts with `end_reason = expired`. `observe` calls it; call it directly to expire
    /// a job whose windows stopped coming.
    pub fn expire(&mut self, now_ns: u64) -> Vec<VerdictChange> {
        let forget = self.cfg.forget_after_ns;
        let mut changes = Vec::new();
        self.jobs.retain(|_, j| {
            changes.extend(j.expire_members(now_ns, forget));
            j.last_end_ns.saturating_add(forget) >= now_ns || {
                changes.extend(j.expire_members(u64::MAX, 0));
                false
            }
        });
        changes
    }

    /// Feeds one read of the RDMA ports' counters (`crate::rdma_counters`), judged as the
    /// detection window `[start_ns, end_ns]`; returns the port verdicts opened, updated and
    /// closed (scope [`Scope::RdmaPort`], job [`PORT_JOB`]), expiries of vanished ports first.
    pub fn observe_ports(&mut self, windows: &[PortWindow], start_ns: u64, end_ns: u64) -> Vec<VerdictChange> {
        self.ports.observe(&self.cfg, windows, start_ns, end_ns, &mut self.next_id)
    }

    /// The open verdicts, with the evidence of their latest anomalous window.
    pub fn open_verdicts(&self) -> impl Iterator<Item = &Verdict> {
        self.jobs.values().flat_map(|j| j.tracks()).chain(self.ports.tracks()).filter_map(Track::open_verdict)
    }

    /// The replay tool's view of `job`'s last window: (peer, phase lateness, step lateness).
    #[cfg(test)]
    pub(crate) fn last_lateness(&self, job: &str) -> Vec<(IpAddr, Option<f64>, Option<f64>)> {
        self.jobs.get(job).map(|j| j.last_lateness.clone()).unwrap_or_default()
    }

    /// The replay tool's view of how gray judged each peer of `job`'s last window.
    #[cfg(test)]
    pub(crate) fn last_gray(&self, job: &str) -> Vec<String> {
        self.jobs.get(job).map(|j| j.last_gray.clone()).unwrap_or_default()
    }

    /// Peers ignored because a job already had `max_peers_per_job` (for a metric).
    pub fn ignored_peers_total(&self) -> u64 {
        self.ignored_peers_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(addr: &str, mbit: f64, explained_by: Option<&str>) -> PeerFeatures {
        let mut f = PeerFeatures::for_test(addr, "p", mbit * 1e6 / 8.0, 0.0);
        f.explained_by = explained_by.map(|a| a.parse().unwrap());
        f
    }

    #[test]
    fn a_clear_minimum_ignores_the_peers_it_slows_down() {
        // A rate cap recorded on PyTorch DDP (target/eval-dsack-rt, torch ratecap #0): the capped
        // host at 213 Mbit/s, its ring successor (explained by it) at 266, the others 1.3-3.6
        // Gbit/s. Compared with the successor the capped host is not a clear minimum (0.8×).
        let capped = "10.77.0.4";
        let mut feats = vec![
            peer("10.77.0.1", 2436.0, None),
            peer("10.77.0.2", 3062.0, None),
            peer("10.77.0.3", 3579.0, Some(capped)),
            peer(capped, 213.0, None),
            peer("10.77.0.5", 266.0, Some(capped)),
            peer("10.77.0.6", 1348.0, None),
        ];
        assert_eq!(clear_minimum(&feats), Some(capped.parse().unwrap()));
        // Without that explanation the successor's slowness is its own: no clear minimum.
        feats[4].explained_by = None;
        assert_eq!(clear_minimum(&feats), None);
        // A successor explained by some other peer still counts.
        feats[4].explained_by = Some("10.77.0.1".parse().unwrap());
        assert_eq!(clear_minimum(&feats), None);
    }

    #[test]
    fn attribution_naming_the_wrong_end_does_not_make_the_second_slowest_the_minimum() {
        // Recorded on OpenMPI (target/eval-dsack-rc, ratecap #5): the capped host at 74 Mbit/s,
        // explained (wrongly) by its neighbour at 186. The minimum is still the capped host,
        // never the neighbour; explained, it is not blamed (gray's explanation rule).
        let feats = vec![
            peer("10.77.0.1", 2862.0, None),
            peer("10.77.0.2", 4244.0, None),
            peer("10.77.0.3", 186.0, None),
            peer("10.77.0.4", 74.0, Some("10.77.0.3")),
            peer("10.77.0.5", 4651.0, None),
        ];
        assert_eq!(clear_minimum(&feats), Some("10.77.0.4".parse().unwrap()));
        assert_eq!(clear_minimum(&feats[..1]), None, "one peer has nothing to be the minimum of");
    }
}
