//! Outages that stall the whole job: one host's path down for a moment, again and again (a flap).
//!
//! While a host's link is down, a collective stalls everywhere: every rank waits for data that
//! cannot come, so every peer is silent together and none stands out against the others (the
//! gray detector's stall signal compares a peer with the other peers of the same window). What
//! the outage leaves behind is small: each connection that had data in flight to or from the
//! host resends it after a retransmission timeout, a handful of packets on a connection that moved
//! tens of thousands in the window, far below any loss *rate* threshold. Seen on OpenMPI's
//! allreduce (every algorithm) with a 400 ms outage every 3 s: 5-10 resends on each connection of
//! the flapped host, 0-2 on most others (but one ring connection that resent 2-20 packets in
//! nearly every window of four runs, fault or not), in windows where every peer was silent for
//! 500-1130 ms against 80-160 ms in the windows before.
//!
//! The rule, per job and window (pure; state: the job's recent windows):
//! - the window is a *stall* when the median over the active peers of their longest silence (at
//!   least [`MIN_PEERS`] of them) exceeds the job's usual silence by at least `gray.stall_open_ns`
//!   and by [`STALL_FACTOR`] times the usual silence. The usual silence is the median of that
//!   figure over the job's recent windows (`congestion.baseline_windows`, once warm), or over its
//!   last [`LATELY_WINDOWS`] windows that were not stalls when that is longer: a job that slows
//!   down as the machine gets busier is not stalling;
//! - a stall's *suspects* are the hosts that are an end of more than half of the connections with
//!   at least [`MIN_RESENDS`] loss packets in the window or the one before it (a silence is
//!   counted in the window it ends in, and the resends of the outage behind it often fall in the
//!   window before; more than half, not all, so that one stray connection resending a few packets
//!   does not hide the host the others share); none when no connection resent that much (a
//!   stall without loss is the job pausing, not the network), when no host has that majority
//!   (loss spread over the fabric is not one host's path), or when one of those connections
//!   resends away from stalls too (in [`CHRONIC_WINDOWS`] of the remembered windows that were
//!   neither a stall nor just before one: the job keeps losing packets, which is the loss
//!   detectors' business, and the stall's other resends prove nothing);
//! - consecutive stall windows are one *episode* (one outage that spans a window boundary); an
//!   episode longer than [`MAX_EPISODE_WINDOWS`] is the job slowing down, not an outage, and none
//!   of its windows counts;
//! - a host is named when the stall windows of at least [`MIN_STALLS`] episodes among the job's
//!   last [`MEMORY_WINDOWS`] windows (this one included, and this one a stall with suspects)
//!   have that host, and no other, in common among their suspects, and at most half of those
//!   windows were stalls (more is the job's pace). One episode names no one: its resends may all
//!   be on one connection, whose two ends are equally suspect, and a single stall with a few
//!   resends can be a busy machine's hiccup; a flap repeats, and its other episodes may show the
//!   host's other connections. When every episode shows the same single connection, its two ends
//!   stay equally suspect and no one is named.
//!
//! The caller raises a gray failure on the named peer unless something else explains it (its
//! link congested, upstream loss, attribution naming another peer), like any other gray evidence.
//! Only an active peer of the window is named, never the vantage's own host.
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;

use super::features::PeerFeatures;
use super::robust::{Robust, Ring};
use crate::attribution::DirectedConn;

/// Fewest active peers with a silence for the job's median silence to mean anything.
pub const MIN_PEERS: usize = 3;
/// Loss packets on one connection in a stall that count as the outage's resends (healthy
/// connections show 0-2 per window: tail-loss probes, reordering).
pub const MIN_RESENDS: u64 = 4;
/// Stalls whose suspects must agree before a host is named.
pub const MIN_STALLS: usize = 2;
/// Windows over which those stalls are looked for (a flap every few seconds fits several).
pub const MEMORY_WINDOWS: usize = 10;
/// A stall's silence exceeds the usual one by at least this many times the usual one (and by
/// `gray.stall_open_ns`): recorded flaps stalled OpenMPI for 500-1130 ms against a usual 80-160
/// ms, while PyTorch on a busy machine drifts between 200 and 650 ms with no fault at all.
pub const STALL_FACTOR: f64 = 2.0;
/// The longest episode that can be one outage: a flap's outage (400 ms in the evaluation) ends
/// within two windows; a longer run of stall windows is the job slowing down.
pub const MAX_EPISODE_WINDOWS: usize = 2;
/// The short memory of the job's silence: a stall must stand out against it too (a job whose
/// silences grew from 150 to 450 ms over a minute as the machine got busier is not stalling;
/// a flap every 3 s leaves at most 2 of 5 windows stalled, so their median stays the usual one).
pub const LATELY_WINDOWS: usize = 5;
/// Quiet windows (no stall in them or just after) in which a connection resent before a stall
/// it resends in is explained by ongoing loss: seen on OpenMPI's ring and segmented ring, one
/// connection resending 4-20 packets in nearly every window, fault or not, which outvoted the
/// flapped host's connection in every stall of one run; and with 5 % loss on one host of
/// ringside-rank's ring, its two connections resending in every window, beside which a stray
/// resend on another host's connections in two stalls named that healthy host.
pub const CHRONIC_WINDOWS: usize = 2;

/// A connection by its two ends (source, destination).
type Ends = [Option<IpAddr>; 2];

/// One job's recent windows, for the rule of the module docs.
#[derive(Debug)]
pub(crate) struct OutageMemory {
    /// The job's median peer silence in its recent windows.
    usual_silence: Ring,
    /// The same over the last [`LATELY_WINDOWS`] windows that were not stalls.
    lately: Ring,
    /// The last [`MEMORY_WINDOWS`] windows.
    recent: VecDeque<Recent>,
    /// The episode the previous window's stall belonged to, and how many windows it has lasted.
    prev_stall: Option<(u64, usize)>,
    episodes: u64,
}

/// What the memory keeps of one window.
#[derive(Debug)]
struct Recent {
    stall: bool,
    /// The ends of its connections with at least [`MIN_RESENDS`] loss packets.
    resending: Vec<Ends>,
    /// For a stall with suspects in an episode still short enough to be an outage: the episode
    /// and the suspects.
    suspects: Option<(u64, BTreeSet<IpAddr>)>,
}

/// A host named by the rule, with the window's evidence.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outage {
    pub peer: IpAddr,
    /// The job's median peer silence in this window, ns.
    pub silence_ns: f64,
    /// The job's usual silence (median and MAD of its recent windows), ns.
    pub usual: Robust,
    /// Stall episodes in the memory whose suspects include the peer (this one included).
    pub stalls: u32,
}

impl OutageMemory {
    /// `baseline_windows`: how many windows the usual silence remembers.
    pub fn new(baseline_windows: usize) -> Self {
        OutageMemory {
            usual_silence: Ring::new(baseline_windows),
            lately: Ring::new(LATELY_WINDOWS),
            recent: VecDeque::with_capacity(MEMORY_WINDOWS),
            prev_stall: None,
            episodes: 0,
        }
    }

    /// Judges one window (module docs). `stall_open_ns`: `gray.stall_open_ns`; `warm_windows`:
    /// windows needed before the usual silence is trusted; `local`: the vantage's own host,
    /// never named.
    pub fn observe(
        &mut self,
        stall_open_ns: u64,
        warm_windows: usize,
        feats: &[PeerFeatures],
        conns: &[DirectedConn],
        local: Option<IpAddr>,
    ) -> Option<Outage> {
        let silences: Vec<f64> = feats.iter().filter_map(|f| f.silence_ns).collect();
        let job_silence = (silences.len() >= MIN_PEERS).then(|| Robust::of(silences)).flatten().map(|r| r.median);
        // The job's usual silence, and its last few windows' when they were longer (the job
        // slowed down lately: a busy machine moves it faster than the long memory follows).
        let usual = (self.usual_silence.len() >= warm_windows.max(1))
            .then(|| self.usual_silence.robust())
            .flatten()
            .map(|u| match self.lately.robust() {
                Some(l) if l.median > u.median => l,
                _ => u,
            });
        let stall = matches!((job_silence, &usual), (Some(s), Some(u)) if s - u.median >= (stall_open_ns as f64).max(STALL_FACTOR * u.median));
        let resending: Vec<Ends> = conns.iter().filter(|c| c.loss_packets >= MIN_RESENDS).map(|c| [c.src, c.dst]).collect();
        let episode = stall.then(|| match self.prev_stall {
            Some((e, len)) => (e, len + 1),
            None => {
                self.episodes += 1;
                (self.episodes, 1)
            }
        });
        self.prev_stall = episode;
        job_silence.inspect(|&s| {
            self.usual_silence.push(s);
            if !stall {
                self.lately.push(s);
            }
        });
        // A silence is counted in the window it ends in, the resends of the outage behind it in
        // that window or the one before: both windows' resends are the stall's.
        let suspects = if stall {
            let before = self.recent.back().map_or(&[][..], |p| &p.resending[..]);
            let stall_resends = || resending.iter().chain(before);
            // Connections that keep resending resend in this stall too: the job already loses
            // packets (the loss detectors' business), and whatever else resent is no evidence of
            // an outage.
            let chronic = self.chronic();
            if stall_resends().any(|c| chronic.contains(c)) {
                None
            } else {
                majority_ends(stall_resends())
            }
        } else {
            None
        };
        if self.recent.len() == MEMORY_WINDOWS {
            self.recent.pop_front();
        }
        let mut this = Recent { stall, suspects: None, resending };
        match episode {
            // Longer than an outage: the job slowed down (a busy machine), and none of the
            // episode's windows counts.
            Some((e, len)) if len > MAX_EPISODE_WINDOWS => {
                for r in &mut self.recent {
                    if r.suspects.as_ref().is_some_and(|(re, _)| *re == e) {
                        r.suspects = None;
                    }
                }
            }
            Some((e, _)) => this.suspects = suspects.map(|s| (e, s)),
            None => {}
        }
        self.recent.push_back(this);
        let (_, now) = self.recent.back()?.suspects.clone()?;
        // Stalls in most recent windows: the job's pace, not outages.
        if 2 * self.recent.iter().filter(|r| r.stall).count() > MEMORY_WINDOWS {
            return None;
        }
        let agreeing: Vec<&(u64, BTreeSet<IpAddr>)> =
            self.recent.iter().filter_map(|r| r.suspects.as_ref()).filter(|(_, s)| !s.is_disjoint(&now)).collect();
        let episodes: BTreeSet<u64> = agreeing.iter().map(|(e, _)| *e).collect();
        if episodes.len() < MIN_STALLS {
            return None;
        }
        let common: BTreeSet<IpAddr> = agreeing.iter().fold(now.clone(), |acc, (_, s)| acc.intersection(s).copied().collect());
        let [peer] = <[IpAddr; 1]>::try_from(common.into_iter().collect::<Vec<_>>()).ok()?;
        if Some(peer) == local || !feats.iter().any(|f| f.peer == peer) {
            return None;
        }
        Some(Outage { peer, silence_ns: job_silence?, usual: usual?, stalls: episodes.len() as u32 })
    }

    /// The connections that resent in at least [`CHRONIC_WINDOWS`] of the remembered windows
    /// that were neither a stall nor just before one: resends that come without outages.
    fn chronic(&self) -> BTreeSet<Ends> {
        let mut count: BTreeMap<Ends, usize> = BTreeMap::new();
        for (r, next) in self.recent.iter().zip(self.recent.iter().skip(1)) {
            if !r.stall && !next.stall {
                for c in &r.resending {
                    *count.entry(*c).or_default() += 1;
                }
            }
        }
        count.into_iter().filter(|&(_, n)| n >= CHRONIC_WINDOWS).map(|(c, _)| c).collect()
    }
}

/// The hosts that are an end of more than half of the connections given by their two ends
/// (`None` when there is no connection or no such host). More than half, not all: a stray
/// connection resending a few packets for its own reasons (a tail-loss probe on a busy machine)
/// must not hide the host the outage's connections share; loss spread over hosts names no one.
fn majority_ends<'a>(conns: impl IntoIterator<Item = &'a [Option<IpAddr>; 2]>) -> Option<BTreeSet<IpAddr>> {
    let mut count: BTreeMap<IpAddr, usize> = BTreeMap::new();
    let mut n = 0;
    for ends in conns {
        n += 1;
        let ends: BTreeSet<IpAddr> = ends.iter().flatten().copied().collect();
        for e in ends {
            *count.entry(e).or_default() += 1;
        }
    }
    let hosts: BTreeSet<IpAddr> = count.into_iter().filter(|&(_, c)| 2 * c > n).map(|(h, _)| h).collect();
    (!hosts.is_empty()).then_some(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: f64 = 1e6;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 77, 0, last])
    }

    fn peers(silence_ms: f64) -> Vec<PeerFeatures> {
        (1..=6)
            .map(|i| {
                let mut f = PeerFeatures::for_test(&format!("10.77.0.{i}"), &format!("p{i}"), 100e6, 0.0);
                f.silence_ns = Some(silence_ms * MS);
                f
            })
            .collect()
    }

    fn conn(src: u8, dst: u8, loss: u64) -> DirectedConn {
        DirectedConn { src: Some(ip(src)), dst: Some(ip(dst)), loss_packets: loss, data_packets: 25_000, ..Default::default() }
    }

    /// Six windows of usual traffic (70 ms silences, a stray resend or two), as a job's warm-up.
    fn warm() -> OutageMemory {
        let mut m = OutageMemory::new(30);
        for _ in 0..6 {
            assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[conn(3, 4, 2)], None), None);
        }
        m
    }

    #[test]
    fn repeated_stalls_with_resends_on_one_hosts_connections_name_that_host() {
        // Recorded shape (OpenMPI ring, host .6 flapped): the first stalls show only the
        // connection .5 -> .6 resending (either end could be at fault), a later one .6's others.
        let mut m = warm();
        assert_eq!(m.observe(100_000_000, 5, &peers(560.0), &[conn(5, 6, 6), conn(6, 1, 2)], None), None, "one stall: no one");
        assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(290.0), &[conn(5, 6, 6)], None), None, "both ends still suspect");
        assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[], None), None);
        let o = m.observe(100_000_000, 5, &peers(480.0), &[conn(2, 6, 6), conn(5, 6, 6), conn(6, 1, 6)], None).expect("named");
        assert_eq!((o.peer, o.stalls, o.silence_ns), (ip(6), 3, 480.0 * MS));
        assert_eq!(o.usual.median, 70.0 * MS);
    }

    #[test]
    fn two_connections_with_different_counterparts_settle_it_in_two_episodes() {
        let mut m = warm();
        assert_eq!(m.observe(100_000_000, 5, &peers(500.0), &[conn(2, 4, 6), conn(3, 4, 8)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[conn(6, 5, 2)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(3, 4, 6)], None).map(|o| o.peer), Some(ip(4)));
    }

    #[test]
    fn one_outage_over_two_windows_is_one_episode() {
        let mut m = warm();
        assert_eq!(m.observe(100_000_000, 5, &peers(500.0), &[conn(2, 4, 6), conn(3, 4, 8)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(900.0), &[conn(3, 4, 6)], None), None);
    }

    #[test]
    fn the_resends_of_the_window_before_a_stall_are_its_own() {
        // The outage's resends land in one window, the silence it caused ends in the next.
        let mut m = warm();
        for _ in 0..2 {
            assert_eq!(m.observe(100_000_000, 5, &peers(120.0), &[conn(2, 4, 6), conn(3, 4, 8)], None), None);
            let named = m.observe(100_000_000, 5, &peers(900.0), &[conn(3, 4, 2)], None).map(|o| o.peer);
            assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[], None), None);
            if named.is_some() {
                assert_eq!(named, Some(ip(4)));
                return;
            }
        }
        panic!("the second episode names .4");
    }

    #[test]
    fn a_stray_resending_connection_does_not_hide_the_host() {
        // Recorded (OpenMPI default decision, .4 flapped): a connection between two healthy hosts
        // resent 4 packets in the window before the first stall, and in another window beside
        // the flapped host's two.
        let mut m = warm();
        assert_eq!(m.observe(100_000_000, 5, &peers(100.0), &[conn(1, 3, 4)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(500.0), &[conn(2, 4, 6), conn(3, 4, 8)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(100.0), &[conn(2, 4, 5), conn(3, 4, 5), conn(3, 1, 4)], None), None);
        // Two episodes, each with .3 and .4 as suspects (.3 is the stray connections' end too):
        // no one yet.
        assert_eq!(m.observe(100_000_000, 5, &peers(525.0), &[], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(100.0), &[conn(2, 4, 5), conn(3, 4, 6)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(1200.0), &[], None).map(|o| (o.peer, o.stalls)), Some((ip(4), 3)));
    }

    #[test]
    fn stalls_without_resends_or_with_loss_everywhere_name_no_one() {
        let mut m = warm();
        for _ in 0..4 {
            // The job pausing (a busy machine): silence, no resends.
            assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(5, 6, 2)], None), None);
            // Loss on connections with no common host: the fabric, not one host's path.
            assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(1, 2, 6), conn(3, 4, 6)], None), None);
        }
    }

    #[test]
    fn resends_without_a_stall_are_the_loss_detectors_business() {
        let mut m = warm();
        for _ in 0..4 {
            assert_eq!(m.observe(100_000_000, 5, &peers(120.0), &[conn(2, 4, 9), conn(3, 4, 9)], None), None);
        }
    }

    #[test]
    fn nothing_is_judged_before_the_usual_silence_is_known() {
        let mut m = OutageMemory::new(30);
        for _ in 0..4 {
            assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(2, 4, 9), conn(3, 4, 9)], None), None);
        }
    }

    #[test]
    fn the_vantages_own_host_and_idle_hosts_are_never_named() {
        // At a host's NIC or IPU every connection has the local host (here .6) as an end.
        let named = |local: Option<IpAddr>| {
            let mut m = warm();
            m.observe(100_000_000, 5, &peers(600.0), &[conn(2, 6, 6), conn(3, 6, 6)], local);
            m.observe(100_000_000, 5, &peers(70.0), &[], local);
            m.observe(100_000_000, 5, &peers(600.0), &[conn(2, 6, 6), conn(4, 6, 6)], local).map(|o| o.peer)
        };
        assert_eq!(named(None), Some(ip(6)), "a peer like any other at a switch");
        assert_eq!(named(Some(ip(6))), None, "the vantage's own host");
        // .9 is not an active peer of the window.
        let mut m = warm();
        m.observe(100_000_000, 5, &peers(600.0), &[conn(2, 9, 6), conn(3, 9, 6)], None);
        m.observe(100_000_000, 5, &peers(70.0), &[], None);
        assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(2, 9, 6), conn(4, 9, 6)], None), None);
    }

    #[test]
    fn a_job_that_slows_down_is_not_stalling() {
        // Recorded (OpenMPI, 10 minutes healthy, the machine getting busier): the job's silence
        // went from ~150 to ~450 ms within a minute, with a resend now and then on .1's
        // connections.
        let mut m = warm();
        for i in 0..40 {
            let silence = 70.0 + 10.0 * f64::from(i.min(30));
            let conns = if i % 4 == 0 { vec![conn(3, 1, 5)] } else { vec![] };
            assert_eq!(m.observe(100_000_000, 5, &peers(silence), &conns, None), None, "window {i}");
        }
        // The same job, now at ~370 ms, and a jump to 600 ms with .1's resends: not 3x its pace.
        for _ in 0..3 {
            assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(3, 1, 5), conn(2, 1, 5)], None), None);
            assert_eq!(m.observe(100_000_000, 5, &peers(370.0), &[], None), None);
        }
    }

    #[test]
    fn stalls_longer_than_an_outage_or_in_most_windows_name_no_one() {
        let mut m = warm();
        // Three windows in a row: the job slowed down, whatever the resends say.
        for _ in 0..3 {
            for _ in 0..3 {
                assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(2, 4, 6), conn(3, 4, 6)], None), None);
            }
            assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[], None), None);
        }
        // Short stalls, but in most windows (recorded: PyTorch on a busy machine), first with
        // resends all over, then with resends that point at .4.
        let mut m = warm();
        for _ in 0..4 {
            assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(1, 2, 6), conn(5, 6, 6)], None), None);
            assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[], None), None);
            assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[], None), None);
        }
        for _ in 0..4 {
            assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(2, 4, 6), conn(3, 4, 6)], None), None);
            assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(2, 4, 6), conn(3, 4, 6)], None), None);
            assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[], None), None);
        }
    }

    #[test]
    fn a_connection_that_resends_in_quiet_windows_is_not_an_outages() {
        // Recorded (OpenMPI ring and segmented ring): .6 -> .1 resent 4-20 packets in nearly
        // every window, healthy or not; .3 flapped.
        let mut m = OutageMemory::new(30);
        for _ in 0..6 {
            assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[conn(6, 1, 8)], None), None);
        }
        // Stalls whose only resends are that connection's: no one (.1 and .6 are healthy).
        for _ in 0..3 {
            assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[conn(6, 1, 8)], None), None);
            assert_eq!(m.observe(100_000_000, 5, &peers(700.0), &[conn(6, 1, 8)], None), None);
            assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[conn(6, 1, 8)], None), None);
        }
        // Stalls with .3's connections resending beside it: the job keeps losing packets on
        // .6 -> .1, and .3's resends are no evidence of an outage (silence, not blame).
        assert_eq!(m.observe(100_000_000, 5, &peers(700.0), &[conn(2, 3, 9), conn(6, 1, 8)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[conn(6, 1, 8)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(700.0), &[conn(3, 4, 9), conn(6, 1, 8)], None), None);
        // Once .6 -> .1 has stopped resending for the memory's length, .3's stalls count again.
        for _ in 0..MEMORY_WINDOWS {
            assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[], None), None);
        }
        assert_eq!(m.observe(100_000_000, 5, &peers(700.0), &[conn(2, 3, 9)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[], None), None);
        let named = m.observe(100_000_000, 5, &peers(700.0), &[conn(3, 4, 9)], None);
        assert_eq!(named.map(|o| o.peer), Some(ip(3)));
    }

    #[test]
    fn stalls_beside_ongoing_loss_name_no_one() {
        // Recorded (ringside-rank, 5 % loss on .4): .4's connections resend in every window, the
        // loss stalls the ring now and then, and a stray resend on .1's connections in two
        // stalls named .1.
        let mut m = warm();
        for _ in 0..6 {
            assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[conn(3, 4, 6), conn(4, 5, 6)], None), None);
        }
        assert_eq!(m.observe(100_000_000, 5, &peers(620.0), &[conn(1, 2, 4), conn(3, 4, 6), conn(4, 5, 6)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(70.0), &[conn(3, 4, 6), conn(4, 5, 6), conn(6, 1, 4)], None), None);
        assert_eq!(m.observe(100_000_000, 5, &peers(400.0), &[conn(3, 4, 6), conn(4, 5, 6)], None), None);
    }

    #[test]
    fn stalls_that_point_at_different_hosts_name_no_one() {
        let mut m = warm();
        m.observe(100_000_000, 5, &peers(600.0), &[conn(1, 2, 6), conn(3, 2, 6)], None);
        m.observe(100_000_000, 5, &peers(70.0), &[], None);
        assert_eq!(m.observe(100_000_000, 5, &peers(600.0), &[conn(4, 5, 6), conn(6, 5, 6)], None), None);
    }
}
