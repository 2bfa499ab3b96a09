//! Per-peer features of one window, and the cross-peer statistics the detectors compare them with.
//!
//! - in-burst goodput: bytes / time inside the peer's communication phases (phases below
//!   `min_phase_bytes` excluded), so idle compute time between steps does not dilute it;
//! - loss rate: loss packets / data packets;
//! - silence: the longest gap between the peer's phases that ends in this window (the gap from
//!   the previous window's last phase counts), i.e. how long the peer went quiet;
//! - phase-start lateness: for each phase, its start minus the median start of the other peers'
//!   nearest phases (same step); the peer's lateness is the median over its phases;
//! - step-start lateness: how long after the other peers a peer breaks a compute-like idle gap.
//!   Phase matching alone misses a compute straggler in a ring allreduce: every other rank sends
//!   its first chunk(s) when its own compute ends, then stalls until the straggler's data has
//!   gone round the ring, so its step splits into two phases and the straggler's single late
//!   phase lines up with (and looks early against) the others' *second* phases. So: a peer's
//!   *step starts* are its phases after an own idle gap of at least `min_idle_gap_ns` and half its
//!   longest gap in the window (a compute gap, or a stall behind a straggler); for each step start
//!   `s` after a gap from `g`, every other active peer contributes `s - (its first step start in
//!   (max(g, s - max_start_offset_ns), s])`, or 0 if it broke no idle while this peer waited; the
//!   sample is the median contribution. A compute straggler is the last to break its idle at
//!   *every* step (all others started their step while it computed), while the ranks stalled
//!   behind it are late only at their second phase of the step (the ring's chain), never at their
//!   first; so the peer's step-start lateness is the lower quartile of its samples.
//! - job silence: neither statistic assumes a ring any more. A compute straggler keeps the whole
//!   job waiting: once the others have done what they can without it, nobody sends, and its
//!   late send is what ends that silence. A peer that starts late because of its *role* in the
//!   algorithm (the root of a reduce then broadcast, the ranks folded in by recursive doubling on
//!   a non-power-of-two world, a DDP bucket that waits for its inputs) starts right after other
//!   peers' data, which it was waiting for. So every lateness sample (phase-matched or step
//!   start) is capped by the job's silence just before it: how long no other peer had sent
//!   anything (`job_silence_before`). Late-by-role samples shrink to ~0; a straggler's stay.
//!   And a silence that two peers break together (another peer starts sending *to this one*
//!   within `co_start_ns` after) is ambiguous: with a rendezvous protocol (OpenMPI's TCP BTL
//!   above its eager limit) the straggler's predecessor can only send once the straggler asks for
//!   the data, so both start at once and the wire cannot say which was late. Such a sample
//!   counts as 0. (A peer that starts sending elsewhere right after is forwarding this one's data;
//!   one that had already sent to it earlier in the step and stalled is resuming as its TCP
//!   receive window opens: neither makes the start ambiguous.)
//!   So does a late start whose receivers told it to go ahead just before (a small send with
//!   payload from the receiver to this peer in the `go_ahead_ns` before its data,
//!   [`PeerWindow::pokes`]; pure ACKs are not pokes, or a straggler whose receiver acknowledges
//!   its previous data as it reads it would be excused at every step): it was
//!   waiting for that receiver, not computing (recursive doubling's folded ranks send to their
//!   partner, the straggler, only once it asks). With an eager protocol nothing comes back
//!   before the data, and the late sender keeps the blame. Nor is a start *fed* by fresh data
//!   that another peer began sending to this one in the `go_ahead_ns` before it (and had not
//!   sent it earlier in the step): that is the next hop passing the late data on. With small
//!   chunks (256 KiB over 6 ranks, 43 KiB each) on a CPU-starved machine the straggler's ring
//!   successor forwarded within a few ms and showed the straggler's own step lateness (28-32 ms
//!   against 27-31), and was named a straggler too (`t2_detect`'s rig at load 13, session 31).

use std::net::IpAddr;

use super::config::DetectorConfig;
use super::input::{merge_phases, PeerWindow, Phase};
use super::robust::{leave_one_out, Robust};

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PeerFeatures {
    pub peer: IpAddr,
    pub link: String,
    pub goodput_bps: Option<f64>,
    pub loss_rate: Option<f64>,
    pub loss_packets: u64,
    pub data_packets: u64,
    pub ce_marks: u64,
    pub cnps: u64,
    pub silence_ns: Option<f64>,
    /// Starts of the phases with at least `min_phase_bytes`, sorted.
    pub phase_starts: Vec<u64>,
    /// End of the peer's last phase before this window, if any.
    pub prev_phase_end_ns: Option<u64>,
    /// (start, end, destination) of every burst of the window: whom the peer sent to, when.
    pub sends: Vec<(u64, u64, Option<IpAddr>)>,
    /// (start, destination) of the peer's small sends (ACKs, control messages).
    pub pokes: Vec<(u64, Option<IpAddr>)>,
    /// End of the last phase seen so far (this window or earlier).
    pub last_phase_end_ns: Option<u64>,
    /// Filled by [`fill_lateness`].
    pub lateness_ns: Option<f64>,
    /// Sends after idle: candidate step starts (see the module docs).
    pub steps: StepStarts,
    /// Filled by [`fill_step_lateness`].
    pub step_lateness_ns: Option<f64>,
    /// [`PeerWindow::explained_by`].
    pub explained_by: Option<IpAddr>,
    /// [`PeerWindow::shared_links`].
    pub shared_links: Vec<String>,
}

#[cfg(test)]
impl PeerFeatures {
    /// A peer for detector unit tests: 30,000 data packets in the window at `goodput`, `loss` of
    /// them lost (loss packets derived from it), no ECN marks, CNPs, silence or phases.
    pub(crate) fn for_test(peer: &str, link: &str, goodput: f64, loss: f64) -> Self {
        PeerFeatures {
            peer: peer.parse().unwrap(),
            link: link.into(),
            goodput_bps: Some(goodput),
            loss_rate: Some(loss),
            loss_packets: (loss * 30_000.0) as u64,
            data_packets: 30_000,
            ce_marks: 0,
            cnps: 0,
            silence_ns: None,
            phase_starts: vec![],
            prev_phase_end_ns: None,
            sends: vec![],
            pokes: vec![],
            last_phase_end_ns: None,
            lateness_ns: None,
            steps: Default::default(),
            step_lateness_ns: None,
            explained_by: None,
            shared_links: Vec::new(),
        }
    }
}

/// A peer's sends after a compute-like idle gap, from its phases of at least `min_phase_bytes`.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct StepStarts {
    /// (start of the idle gap, start of the phase that ended it), sorted by phase start.
    pub starts: Vec<(u64, u64)>,
    /// End of the peer's last phase with at least `min_phase_bytes` so far (this window or earlier).
    pub last_end_ns: Option<u64>,
}

/// Step starts of one peer's phases (`phases` sorted by start), given the end of its last
/// counted phase before them.
fn step_starts(cfg: &DetectorConfig, phases: &[Phase], prev_end_ns: Option<u64>) -> StepStarts {
    let mut end = prev_end_ns;
    let mut gaps = Vec::new();
    for p in phases.iter().filter(|p| p.bytes >= cfg.min_phase_bytes) {
        if let Some(e) = end {
            // A gap longer than a window is an absent peer coming back, not a step.
            if p.start_ns > e && p.start_ns - e <= cfg.window_ns {
                gaps.push((e, p.start_ns));
            }
        }
        end = Some(end.map_or(p.end_ns, |e| e.max(p.end_ns)));
    }
    let longest = gaps.iter().map(|(g, s)| s - g).max().unwrap_or(0);
    let min_gap = cfg.straggler.min_idle_gap_ns.max(longest / 2);
    gaps.retain(|(g, s)| s - g >= min_gap);
    StepStarts { starts: gaps, last_end_ns: end }
}

/// Features of one active peer. `prev_last_end_ns` is the end of its last phase before this
/// window, if any; `prev_step_end_ns` the end of its last phase of at least `min_phase_bytes`.
pub(crate) fn peer_features(
    cfg: &DetectorConfig,
    w: &PeerWindow,
    window_start_ns: u64,
    prev_last_end_ns: Option<u64>,
    prev_step_end_ns: Option<u64>,
) -> PeerFeatures {
    let phases = merge_phases(&w.bursts, cfg.phase_merge_gap_ns, cfg.max_phases_per_window);
    let steps = step_starts(cfg, &phases, prev_step_end_ns);
    let (mut bytes, mut dur) = (0u64, 0u64);
    let mut phase_starts = Vec::new();
    for p in phases.iter().filter(|p| p.bytes >= cfg.min_phase_bytes) {
        bytes = bytes.saturating_add(p.bytes);
        dur = dur.saturating_add(p.end_ns - p.start_ns);
        phase_starts.push(p.start_ns);
    }
    let goodput_bps = (dur > 0).then(|| bytes as f64 * 1e9 / dur as f64);
    let loss_packets = w.loss_packets();
    let loss_rate = (w.data_packets >= cfg.min_data_packets.max(1))
        .then(|| loss_packets as f64 / w.data_packets as f64);

    // Only gaps that end in this window; a previous phase older than one window means the peer
    // was idle or absent, not silent among active peers.
    let recent = window_start_ns.saturating_sub(cfg.window_ns);
    let mut prev_end = prev_last_end_ns.filter(|&e| e >= recent);
    let mut silence: Option<u64> = None;
    for p in &phases {
        if let Some(e) = prev_end {
            let gap = p.start_ns.saturating_sub(e);
            silence = Some(silence.map_or(gap, |s| s.max(gap)));
        }
        prev_end = Some(prev_end.map_or(p.end_ns, |e| e.max(p.end_ns)));
    }
    let last_phase_end_ns = match (prev_last_end_ns, phases.iter().map(|p| p.end_ns).max()) {
        (a, None) => a,
        (None, b) => b,
        (Some(a), Some(b)) => Some(a.max(b)),
    };
    PeerFeatures {
        peer: w.peer,
        link: w.link.clone(),
        goodput_bps,
        loss_rate,
        loss_packets,
        data_packets: w.data_packets,
        ce_marks: w.ce_marks,
        cnps: w.cnps,
        silence_ns: silence.map(|s| s as f64),
        phase_starts,
        prev_phase_end_ns: prev_last_end_ns,
        sends: w.bursts.iter().map(|b| (b.start_ns, b.end_ns, b.to)).collect(),
        pokes: w.pokes.iter().map(|b| (b.start_ns, b.to)).collect(),
        last_phase_end_ns,
        lateness_ns: None,
        steps,
        step_lateness_ns: None,
        explained_by: w.explained_by,
        shared_links: w.shared_links.clone(),
    }
}

fn nearest(sorted: &[u64], t: u64, max_offset: u64) -> Option<u64> {
    let i = sorted.partition_point(|&x| x < t);
    let below = i.checked_sub(1).map(|j| sorted[j]);
    let above = sorted.get(i).copied();
    let best = match (below, above) {
        (Some(b), Some(a)) => {
            if t - b <= a - t {
                b
            } else {
                a
            }
        }
        (Some(b), None) => b,
        (None, Some(a)) => a,
        (None, None) => return None,
    };
    (best.abs_diff(t) <= max_offset).then_some(best)
}

/// How long before `t` the rest of the job had been quiet: `t` minus the latest end of the other
/// peers' bursts that started before `t - co_start_ns` (0 if one is still running at `t`);
/// `None` if none of them had sent anything before in this window or the previous one. Not
/// counted: a burst *to* `peers[me]` still running at `t` (input waiting for it to read, as a
/// peer that is not reading stalls its senders), and bursts starting within `co_start_ns` of `t`
/// (reactions to its own first packets, within the timestamps' jitter).
fn job_silence_before(cfg: &DetectorConfig, peers: &[PeerFeatures], me: usize, t: u64) -> Option<f64> {
    let me_addr = peers[me].peer;
    let before = t.saturating_sub(cfg.straggler.co_start_ns);
    let mut latest: Option<u64> = None;
    for (j, p) in peers.iter().enumerate() {
        if j == me {
            continue;
        }
        for &(_, end, to) in p.sends.iter().filter(|(start, _, _)| *start < before) {
            if end >= t {
                if to == Some(me_addr) {
                    continue;
                }
                return Some(0.0);
            }
            latest = Some(latest.map_or(end, |l| l.max(end)));
        }
        if let Some(e) = p.prev_phase_end_ns.filter(|&e| e < t) {
            latest = Some(latest.map_or(e, |l| l.max(e)));
        }
    }
    latest.map(|l| (t - l) as f64)
}

/// Whether a peer other than `peers[me]` starts sending *to it* (or to an unknown destination)
/// in `(t, t + within]` without having sent to it in `(since, t)`: it was waiting for `me`'s
/// go-ahead, so the two started together. A peer that starts sending elsewhere right after `me` is
/// forwarding `me`'s data (an eager ring's next hop), and one that had already begun sending to
/// `me` and stalled is resuming as `me`'s receive window opens (TCP flow control on a peer that
/// was not reading): both were on time, and `me` was what they waited for.
fn another_starts_within(peers: &[PeerFeatures], me: usize, t: u64, within: u64, since: u64) -> bool {
    let me_addr = peers[me].peer;
    let to_me = |to: Option<IpAddr>| to.is_none_or(|a| a == me_addr);
    peers.iter().enumerate().any(|(j, p)| {
        j != me
            && p.sends.iter().any(|&(start, _, to)| start > t && start - t <= within && to_me(to))
            && !sent_to_between(p, me_addr, since, t)
    })
}

/// Whether `p` began a send to `to` (a known destination) strictly between `after` and `before`:
/// a sender that had already sent to a peer in the step resumes, it does not start.
fn sent_to_between(p: &PeerFeatures, to: IpAddr, after: u64, before: u64) -> bool {
    p.sends.iter().any(|&(start, _, dst)| start > after && start < before && dst == Some(to))
}

/// Whether every peer `peers[me]` starts sending data to at `t` had just told it to go ahead:
/// a small send with payload (a poke) from that receiver to `me` in `[t - go_ahead_ns, t)`.
fn waited_for_go_ahead(cfg: &DetectorConfig, peers: &[PeerFeatures], me: usize, t: u64) -> bool {
    let me_addr = peers[me].peer;
    let window = cfg.straggler.co_start_ns;
    let from = t.saturating_sub(cfg.straggler.go_ahead_ns);
    let mut dests = peers[me].sends.iter().filter(|(start, _, _)| (t..=t + window).contains(start)).map(|(_, _, to)| *to).peekable();
    if dests.peek().is_none() {
        return false;
    }
    dests.all(|to| {
        let Some(r) = to.and_then(|a| peers.iter().position(|p| p.peer == a)) else { return false };
        r != me && peers[r].pokes.iter().any(|&(start, to)| to == Some(me_addr) && (from..t).contains(&start))
    })
}

/// Whether another peer began sending *to* `peers[me]` in the `go_ahead_ns` before `t`, without
/// having sent to it in `(since, that start)`: `me` starts right behind fresh data from that
/// peer, so it is passing on or answering what just arrived (the next hop of an eager ring behind
/// a straggler, whose chunks are small enough to forward at once, looks exactly as late as the
/// straggler otherwise). A peer that had already sent to `me` earlier in the step is resuming a
/// stalled send, which says nothing about `me`.
fn fed_just_before(cfg: &DetectorConfig, peers: &[PeerFeatures], me: usize, t: u64, since: u64) -> bool {
    let me_addr = peers[me].peer;
    let from = t.saturating_sub(cfg.straggler.go_ahead_ns);
    // Known destinations only: a burst of unknown destination may have gone anywhere, and
    // counting it would excuse any start that follows another peer's by a few ms.
    peers.iter().enumerate().any(|(j, p)| {
        j != me
            && p.sends.iter().any(|&(start, _, to)| {
                (from..t).contains(&start) && to == Some(me_addr) && !sent_to_between(p, me_addr, since, start)
            })
    })
}

/// A lateness sample capped by the job's silence before the start it was measured at, and 0 when
/// another peer breaks the same silence at once, the receivers had just told this peer to go
/// ahead, or another peer's data had just reached it (see the module docs): lateness that
/// followed other peers' data is waiting, not computing, and a shared, go-ahead-gated or fed
/// start names no one. `since`: from when an earlier send to this peer makes a co-starter's (or
/// feeder's) send a resumption (the start of this peer's idle gap, or one matching offset back).
fn gated(cfg: &DetectorConfig, late: f64, peers: &[PeerFeatures], me: usize, t: u64, since: u64) -> f64 {
    if late <= 0.0 {
        return late;
    }
    match job_silence_before(cfg, peers, me, t) {
        Some(_) if another_starts_within(peers, me, t, cfg.straggler.co_start_ns, since) => 0.0,
        Some(_) if waited_for_go_ahead(cfg, peers, me, t) => 0.0,
        Some(_) if fed_just_before(cfg, peers, me, t, since) => 0.0,
        Some(silent) => late.min(silent),
        None => late,
    }
}

/// Fills `lateness_ns` for every peer. `prev_starts[i]` are peer `i`'s phase starts of the
/// previous window, so a step straddling the window boundary still finds its peers.
pub(crate) fn fill_lateness(cfg: &DetectorConfig, peers: &mut [PeerFeatures], prev_starts: &[Vec<u64>]) {
    let sc = &cfg.straggler;
    let candidates: Vec<Vec<u64>> = peers
        .iter()
        .zip(prev_starts)
        .map(|(f, prev)| {
            let mut c: Vec<u64> = prev.iter().chain(&f.phase_starts).copied().collect();
            c.sort_unstable();
            c
        })
        .collect();
    let min_others = sc.min_peers.saturating_sub(1).max(1);
    let lateness: Vec<Option<f64>> = peers
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut samples = Vec::new();
            for &s in &f.phase_starts {
                let refs: Vec<f64> = candidates
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .filter_map(|(_, c)| nearest(c, s, sc.max_start_offset_ns))
                    .map(|x| x as f64)
                    .collect();
                if refs.len() >= min_others {
                    let r = Robust::of(refs)?;
                    samples.push(gated(cfg, s as f64 - r.median, peers, i, s, s.saturating_sub(sc.max_start_offset_ns)));
                }
            }
            if samples.len() < sc.min_matched_phases.max(1) {
                return None;
            }
            Robust::of(samples).map(|r| r.median)
        })
        .collect();
    for (f, l) in peers.iter_mut().zip(lateness) {
        f.lateness_ns = l;
    }
}

/// Fills `step_lateness_ns` for every peer (see the module docs). `prev_starts[i]` are peer `i`'s
/// step starts of the previous window, so a gap straddling the window boundary still finds the
/// peers that broke their idle during it.
pub(crate) fn fill_step_lateness(cfg: &DetectorConfig, peers: &mut [PeerFeatures], prev_starts: &[Vec<u64>]) {
    let sc = &cfg.straggler;
    let refs: Vec<Vec<u64>> = peers
        .iter()
        .zip(prev_starts)
        .map(|(f, prev)| {
            let mut r: Vec<u64> = prev.iter().copied().chain(f.steps.starts.iter().map(|&(_, s)| s)).collect();
            r.sort_unstable();
            r.dedup();
            r
        })
        .collect();
    let others = peers.len().saturating_sub(1);
    if others < sc.min_peers.saturating_sub(1).max(1) {
        return;
    }
    let lateness: Vec<Option<f64>> = peers
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let samples: Vec<f64> = f
                .steps
                .starts
                .iter()
                .map(|&(gap_start, s)| {
                    let lo = gap_start.max(s.saturating_sub(sc.max_start_offset_ns));
                    let contributions = refs.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, r)| {
                        // The other peer's first step start while this one was still idle.
                        let k = r.partition_point(|&x| x <= lo);
                        r.get(k).filter(|&&x| x <= s).map_or(0.0, |&x| (s - x) as f64)
                    });
                    let late = Robust::of(contributions).map_or(0.0, |r| r.median);
                    gated(cfg, late, peers, i, s, gap_start)
                })
                .collect();
            if samples.len() < sc.min_matched_phases.max(1) {
                return None;
            }
            // The lower quartile: at least three quarters of the matched phases show this much
            // lateness (ringside-stats' one quantile definition).
            ringside_stats::quantile(&samples, 0.25)
        })
        .collect();
    for (f, l) in peers.iter_mut().zip(lateness) {
        f.step_lateness_ns = l;
    }
}

/// Leave-one-out statistics of the job's other peers, per peer.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct PeerStats {
    pub goodput: Option<Robust>,
    pub loss_rate: Option<Robust>,
    pub loss_packets: Option<Robust>,
    pub silence: Option<Robust>,
    pub lateness: Option<Robust>,
    pub step_lateness: Option<Robust>,
}

pub(crate) fn peer_stats(cfg: &DetectorConfig, peers: &[PeerFeatures]) -> Vec<PeerStats> {
    let gray_others = cfg.gray.min_peers.saturating_sub(1).max(1);
    let straggler_others = cfg.straggler.min_peers.saturating_sub(1).max(1);
    let col = |get: &dyn Fn(&PeerFeatures) -> Option<f64>, min: usize| {
        leave_one_out(&peers.iter().map(get).collect::<Vec<_>>(), min)
    };
    // Loss is compared with the peers that are not this peer's own collateral: a peer that
    // attribution explained by this one lost *its* packets on this one's path (a ring
    // neighbour, a folded partner that talks only to it), and counting it would lift the
    // reference towards the culprit's own rate (recursive doubling: three of five others at half
    // the culprit's loss). A peer that explains others is the structural culprit of their bad
    // connections, so one clean other is reference enough.
    let loss_col = |get: &dyn Fn(&PeerFeatures) -> Option<f64>| -> Vec<Option<Robust>> {
        peers
            .iter()
            .enumerate()
            .map(|(i, me)| {
                get(me)?;
                let culprit = peers.iter().any(|f| f.explained_by == Some(me.peer));
                let others: Vec<f64> = peers
                    .iter()
                    .enumerate()
                    .filter(|&(j, f)| j != i && f.explained_by != Some(me.peer))
                    .filter_map(|(_, f)| get(f))
                    .collect();
                if others.len() < if culprit { 1 } else { gray_others } {
                    return None;
                }
                Robust::of(others)
            })
            .collect()
    };
    let goodput = col(&|f| f.goodput_bps, gray_others);
    let loss_rate = loss_col(&|f| f.loss_rate);
    let loss_packets = loss_col(&|f| f.loss_rate.map(|_| f.loss_packets as f64));
    let silence = col(&|f| f.silence_ns, gray_others);
    let lateness = col(&|f| f.lateness_ns, straggler_others);
    let step_lateness = col(&|f| f.step_lateness_ns, straggler_others);
    (0..peers.len())
        .map(|i| PeerStats {
            goodput: goodput[i],
            loss_rate: loss_rate[i],
            loss_packets: loss_packets[i],
            silence: silence[i],
            lateness: lateness[i],
            step_lateness: step_lateness[i],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::input::BurstSummary;

    const MS: u64 = 1_000_000;

    fn window(bursts: Vec<BurstSummary>) -> PeerWindow {
        PeerWindow {
            peer: "10.0.0.1".parse().unwrap(),
            link: "eth0".into(),
            bytes: 30_000_000,
            data_packets: 20_000,
            retrans: 20,
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

    fn b(start_ms: u64, end_ms: u64, bytes: u64) -> BurstSummary {
        BurstSummary { start_ns: start_ms * MS, end_ns: end_ms * MS, bytes, to: None }
    }

    #[test]
    fn goodput_counts_only_time_inside_phases() {
        let cfg = DetectorConfig::default();
        // Two kernel bursts 2 ms apart form one 100 ms phase; 10 MB each phase; one tiny phase.
        let w = window(vec![b(0, 49, 5_000_000), b(51, 100, 5_000_000), b(300, 400, 10_000_000), b(600, 601, 100)]);
        let f = peer_features(&cfg, &w, 0, None, None);
        assert_eq!(f.goodput_bps, Some(20_000_000.0 / 0.2));
        assert_eq!(f.loss_rate, Some(0.001));
        assert_eq!(f.phase_starts, vec![0, 300 * MS]);
        assert_eq!(f.silence_ns, Some(200.0 * MS as f64), "gap 400→600 ms");
        assert_eq!(f.last_phase_end_ns, Some(601 * MS));
    }

    #[test]
    fn silence_includes_the_gap_from_the_previous_window() {
        let cfg = DetectorConfig::default();
        let w = window(vec![b(1_350, 1_400, 10_000_000)]);
        let f = peer_features(&cfg, &w, 1_000 * MS, Some(950 * MS), None);
        assert_eq!(f.silence_ns, Some(400.0 * MS as f64));
        // A last phase older than one window is idleness, not silence.
        let w = window(vec![b(3_350, 3_400, 10_000_000)]);
        let f = peer_features(&cfg, &w, 3_000 * MS, Some(1_950 * MS), None);
        assert_eq!(f.silence_ns, None);
    }

    #[test]
    fn lateness_is_relative_to_the_other_peers_same_step_and_capped_by_the_jobs_silence() {
        let cfg = DetectorConfig::default();
        let mk = |offset_ms: u64, len_ms: u64| {
            let w = window((0..5).map(|k| b(k * 200 + offset_ms, k * 200 + offset_ms + len_ms, 10_000_000)).collect());
            peer_features(&cfg, &w, 0, None, None)
        };
        // The others send 10-30 ms; the late peer starts at 60 ms, after 30 ms of silence.
        let mut peers = vec![mk(10, 20), mk(11, 20), mk(9, 20), mk(60, 20)];
        fill_lateness(&cfg, &mut peers, &vec![Vec::new(); 4]);
        assert_eq!(peers[3].lateness_ns, Some(29.0 * MS as f64), "50 ms late, capped by 60 - 31 ms of silence");
        assert_eq!(peers[0].lateness_ns, Some(-1.0 * MS as f64), "median of 11, 9, 60 ms is 11 ms");
        assert_eq!(peers[1].lateness_ns, Some(1.0 * MS as f64), "starts 1 ms apart are simultaneous: nothing to cap");
        // The same start while the others are still sending (10-90 ms) is waiting on them: 0.
        let mut peers = vec![mk(10, 80), mk(11, 80), mk(9, 80), mk(60, 20)];
        fill_lateness(&cfg, &mut peers, &vec![Vec::new(); 4]);
        assert_eq!(peers[3].lateness_ns, Some(0.0));
    }

    #[test]
    fn a_silence_two_peers_break_together_names_no_one() {
        // Rendezvous: peer 2 sends to the late peer 3 only once peer 3 asks, 1 ms after it wakes.
        let cfg = DetectorConfig::default();
        let mk = |starts: &[(u64, u64)]| {
            let w = window((0..5).flat_map(|k| starts.iter().map(move |&(a, l)| b(k * 200 + a, k * 200 + a + l, 5_000_000))).collect());
            peer_features(&cfg, &w, 0, None, None)
        };
        let mut peers = vec![mk(&[(10, 20)]), mk(&[(11, 20)]), mk(&[(9, 5), (61, 20)]), mk(&[(60, 20)])];
        fill_lateness(&cfg, &mut peers, &vec![Vec::new(); 4]);
        assert_eq!(peers[3].lateness_ns, Some(0.0), "peer 2 started 1 ms after peer 3");
        // The same timing where peer 2 sends on to another peer (an eager ring's next hop,
        // forwarding peer 3's data) names peer 3.
        let mut forwarding = vec![mk(&[(10, 20)]), mk(&[(11, 20)]), mk(&[(9, 5), (61, 20)]), mk(&[(60, 20)])];
        for (i, p) in forwarding.iter_mut().enumerate() {
            p.peer = format!("10.0.0.{}", i + 1).parse().unwrap();
        }
        forwarding[2].sends.iter_mut().for_each(|s| s.2 = Some("10.0.0.1".parse().unwrap()));
        fill_lateness(&cfg, &mut forwarding, &vec![Vec::new(); 4]);
        assert!(forwarding[3].lateness_ns.unwrap() >= 20.0 * MS as f64, "{:?}", forwarding[3].lateness_ns);
        // A late send to a peer that had just told it to go ahead (a small send 2 ms before:
        // a rendezvous CTS) names no one: it waited for that receiver. Without the go-ahead (an
        // eager protocol, the receiver idle and waiting for this data) the sender is named.
        let to = |mut f: PeerFeatures, dst: &str| {
            let a: IpAddr = dst.parse().unwrap();
            f.sends.iter_mut().for_each(|s| s.2 = Some(a));
            f
        };
        let mut base = vec![mk(&[(10, 20)]), mk(&[(11, 20)]), mk(&[(9, 5), (65, 20)]), mk(&[(60, 20)])];
        for (i, p) in base.iter_mut().enumerate() {
            p.peer = format!("10.0.0.{}", i + 1).parse().unwrap();
        }
        base[3] = to(base[3].clone(), "10.0.0.1");
        let mut eager = base.clone();
        fill_lateness(&cfg, &mut eager, &vec![Vec::new(); 4]);
        assert!(eager[3].lateness_ns.unwrap() >= 20.0 * MS as f64, "{:?}", eager[3].lateness_ns);
        let mut rendezvous = eager.clone();
        let me: IpAddr = "10.0.0.4".parse().unwrap();
        rendezvous[0].pokes = (0..5).map(|k| ((k * 200 + 58) * MS, Some(me))).collect();
        fill_lateness(&cfg, &mut rendezvous, &vec![Vec::new(); 4]);
        assert_eq!(rendezvous[3].lateness_ns, Some(0.0), "its receiver told it to go ahead");
        // 5 ms apart (an eager protocol: peer 3's first chunk reached peer 2) names peer 3.
        let mut peers = vec![mk(&[(10, 20)]), mk(&[(11, 20)]), mk(&[(9, 5), (65, 20)]), mk(&[(60, 20)])];
        fill_lateness(&cfg, &mut peers, &vec![Vec::new(); 4]);
        assert!(peers[3].lateness_ns.unwrap() >= 20.0 * MS as f64, "{:?}", peers[3].lateness_ns);
    }

    #[test]
    fn the_next_hop_that_forwards_a_stragglers_data_at_once_is_not_late() {
        // An eager ring 1 → 2 → 3 → 4 → 1 with small chunks on a loaded machine: peers 1 and 2
        // send on time (10, 11 ms), peer 3 computes 50 ms longer and sends at 60 ms, and peer 4,
        // which had nothing to send before peer 3's chunk arrived, passes it on 1 ms later. Both
        // break the same silence; only the one that was not fed is late.
        let cfg = DetectorConfig::default();
        let addr = |i: usize| -> IpAddr { format!("10.0.0.{i}").parse().unwrap() };
        let mk = |me: usize, at: u64| {
            let to = Some(addr(me % 4 + 1));
            let mut w = window((0..5).map(|k| b(k * 200 + at, k * 200 + at + 20, 5_000_000)).collect());
            w.bursts.iter_mut().for_each(|b| b.to = to);
            w.peer = addr(me);
            peer_features(&cfg, &w, 0, None, None)
        };
        let ring = vec![mk(1, 10), mk(2, 11), mk(3, 60), mk(4, 61)];
        let mut phase = ring.clone();
        fill_lateness(&cfg, &mut phase, &vec![Vec::new(); 4]);
        let mut step = ring.clone();
        fill_step_lateness(&cfg, &mut step, &vec![Vec::new(); 4]);
        for (what, peers) in [("phase", &phase), ("step", &step)] {
            let late = |i: usize| if what == "phase" { peers[i].lateness_ns } else { peers[i].step_lateness_ns };
            assert!(late(2).unwrap() >= 20.0 * MS as f64, "{what}: the straggler keeps its lateness: {:?}", late(2));
            assert_eq!(late(3), Some(0.0), "{what}: the next hop was fed just before it sent");
        }
        // The same timing without the feed (peer 3 sends elsewhere) leaves peer 4 as late as any
        // peer that broke the silence on its own.
        let mut unfed = ring.clone();
        unfed[2].sends.iter_mut().for_each(|s| s.2 = Some(addr(1)));
        fill_step_lateness(&cfg, &mut unfed, &vec![Vec::new(); 4]);
        assert!(unfed[3].step_lateness_ns.unwrap() >= 20.0 * MS as f64, "{:?}", unfed[3].step_lateness_ns);
    }
}
