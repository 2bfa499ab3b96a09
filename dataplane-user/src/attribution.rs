//! Which peer's path explains a degraded connection, when the agent sees both ends of it.
//!
//! On a switch (the agent on every bridge port, or a DPU that sees several hosts), one TCP
//! connection crosses two monitored ports: its sender's and its receiver's. A lossy or slow link
//! to host X degrades every connection *to and from X*, and each of them also shows up at the
//! port of X's counterpart: in a ring allreduce, X's two neighbours look as bad as X on the one
//! connection they share with it. Per-peer statistics alone then blame three hosts for one link.
//!
//! Network tomography in its simplest form (as in 007's voting or NetBouncer's path
//! inference) resolves this: a connection has two endpoints and the fault is on one of them, so
//! the endpoint shared by *several* bad connections with *different* counterparts is the likely
//! culprit, and the other endpoints of those connections are explained by it.
//!
//! Rules (pure; the input is one window of one job):
//! - a *directed connection* is one flow's 5-tuple without interface or direction (data from
//!   `src` to `dst`); its loss is the loss evidence seen for it at any port, its goodput is bytes /
//!   time inside the data bursts its sender sent;
//! - it is *bad* when lossy (at least [`MIN_LOSS_PACKETS`] loss packets and a loss ratio of at
//!   least [`MIN_LOSS_RATIO`] and [`LOSS_OUTLIER_FACTOR`] × the lower quartile of the job's
//!   connections' ratios, on at least [`MIN_LOSS_DATA_PACKETS`] data packets unless the loss
//!   itself is at least [`MIN_LOSS_PACKETS_FEW_DATA`]) or, when no connection of the window is
//!   lossy (slowness also follows from loss elsewhere: a sender busy resending is slower to
//!   everyone), slow (in-burst goodput at most [`SLOW_FACTOR`] × the upper quartile
//!   of the job's connections with goodput, when at least [`MIN_CONNS_FOR_MEDIAN`] have one).
//!   Quartiles, not medians, so that two faulty hosts, whose four bad connections are most of a
//!   six-rank ring, still stand out;
//! - greedily, the peer with the most distinct counterparts over its not yet explained bad
//!   connections is *blamed* when that count is at least 2 (ties: more loss, then lower address);
//!   its bad connections become explained; repeat;
//! - then, for a bad connection still unexplained between two peers, the end *every* active
//!   connection of which is bad (at least [`MIN_ACTIVE_DATA_PACKETS`] data packets), when the
//!   other end also has a good one, is blamed: pairwise algorithms (recursive doubling,
//!   Rabenseifner's folded ranks) give a faulty host a single counterpart in a window;
//! - then a bad connection still unexplained whose two ends are both peers (a lone bad
//!   connection: one direction of one link degraded) is blamed on its *receiver*: from a switch,
//!   the queue toward the receiver is where a single flow is shaped or dropped, and a sender's
//!   own queue drops are resent by its stack without a visible retransmission (so a rate cap or
//!   loss on a host's link shows as its inbound connection only). A fault on the sender's uplink
//!   alone is then mislocated; both ends would otherwise be blamed, which is no better. Except
//!   when exactly one of the two ends was blamed by one of the first two rules (the structural
//!   ones) in the last [`BLAME_MEMORY_WINDOWS`] windows: a fault lasts, and a window that shows
//!   only one of its connections (a flapped host's first window back, when only what it had
//!   queued is resent; a lull in a ring's phases) is that fault's, not a new one at the other end.
//!   Only blame that rests on loss is remembered: a window without a lossy connection blames by
//!   slowness alone, which a healthy job's uneven phases produce too (recorded on OpenMPI: a
//!   healthy host blamed that way just before a rate cap took the blame for the capped host's
//!   first lossy connection);
//! - a peer that is not blamed and whose bad connections are all explained is *explained by* the
//!   blamed endpoint of the first of them.
//!
//! Only peers can be blamed. On a host NIC every connection has the local host as one end and a
//! peer as the other, so no peer reaches two counterparts and nothing is explained away: the rule
//! changes nothing there. It never hides the culprit: a blamed peer is never explained.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use ringside_stats::quantile;

/// Fewest loss packets for a connection to count as lossy (healthy veth reorders a few).
pub const MIN_LOSS_PACKETS: u64 = 4;
/// Smallest loss ratio (loss packets / data packets) for a lossy connection.
pub const MIN_LOSS_RATIO: f64 = 0.002;
/// A lossy connection's ratio is also at least this many times the job's lower quartile.
pub const LOSS_OUTLIER_FACTOR: f64 = 4.0;
/// A slow connection's in-burst goodput is at most this fraction of the job's upper quartile.
pub const SLOW_FACTOR: f64 = 0.5;
/// Connections with goodput needed before "slow" is judged.
pub const MIN_CONNS_FOR_MEDIAN: usize = 3;
/// A connection with at least this many data packets in the window counts as an active one of
/// its ends (for "every active connection of this peer is bad").
pub const MIN_ACTIVE_DATA_PACKETS: u64 = 100;
/// Fewest data packets on which a connection's loss ratio is judged (the detectors' own
/// `min_data_packets` for a peer's). A low-volume direction (a collective library's small
/// control messages, 100-200 a second) shows a few retransmissions per second on a healthy busy
/// machine: tail-loss probes fire when the reply's ACK is late, and 6 of 128 packets is a 5 %
/// "loss ratio". Seen on PyTorch/gloo: up to 14 such packets per connection and window, never on
/// a connection with 1,000 data packets or more.
pub const MIN_LOSS_DATA_PACKETS: u64 = 1000;
/// Loss packets that make a connection with fewer than [`MIN_LOSS_DATA_PACKETS`] data packets
/// lossy anyway (a link that went down mid-window leaves few packets, most of them resent).
pub const MIN_LOSS_PACKETS_FEW_DATA: u64 = 32;
/// Windows for which a structurally blamed peer (see the module docs) settles a lone bad
/// connection in its favour.
pub const BLAME_MEMORY_WINDOWS: usize = 3;

/// One direction of one connection in one window.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DirectedConn {
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    /// Loss evidence packets seen for it (all ports).
    pub loss_packets: u64,
    /// Data packets seen for it (all ports).
    pub data_packets: u64,
    /// Bytes and time inside its sender's communication phases (data bursts merged as the
    /// detectors merge them).
    pub burst_bytes: u64,
    pub burst_ns: u64,
}

/// Whether a connection with these counts is lossy (the first half of "bad" in the module docs,
/// without the comparison with the job's other connections).
pub fn is_lossy(loss_packets: u64, data_packets: u64) -> bool {
    loss_packets >= MIN_LOSS_PACKETS
        && data_packets > 0
        && loss_packets as f64 >= MIN_LOSS_RATIO * data_packets as f64
        && (data_packets >= MIN_LOSS_DATA_PACKETS || loss_packets >= MIN_LOSS_PACKETS_FEW_DATA)
}

impl DirectedConn {
    fn loss_ratio(&self) -> Option<f64> {
        (self.data_packets > 0).then(|| self.loss_packets as f64 / self.data_packets as f64)
    }
    fn goodput(&self) -> Option<f64> {
        (self.burst_ns > 0).then(|| self.burst_bytes as f64 * 1e9 / self.burst_ns as f64)
    }
}

/// The outcome for one window: blamed peers and, per explained peer, the peer that explains it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attribution {
    pub blamed: BTreeSet<IpAddr>,
    /// Those of `blamed` the structural rules blamed (several counterparts, or every active
    /// connection bad), as opposed to the lone-connection rule's guess.
    pub structural: BTreeSet<IpAddr>,
    pub explained_by: BTreeMap<IpAddr, IpAddr>,
    /// Whether a connection of the window was lossy, so the blame rests on loss and not on
    /// slowness alone (only such blame is remembered, [`BlameMemory::push`]).
    pub loss_based: bool,
}

/// The peers one job's last [`BLAME_MEMORY_WINDOWS`] windows blamed structurally.
#[derive(Clone, Debug, Default)]
pub struct BlameMemory {
    windows: std::collections::VecDeque<BTreeSet<IpAddr>>,
}

impl BlameMemory {
    /// Peers blamed structurally in any remembered window.
    pub fn recent(&self) -> BTreeSet<IpAddr> {
        self.windows.iter().flatten().copied().collect()
    }

    /// Remembers one window's outcome (its structural blame if it rests on loss, else nothing),
    /// forgetting the oldest beyond [`BLAME_MEMORY_WINDOWS`].
    pub fn push(&mut self, a: &Attribution) {
        if self.windows.len() == BLAME_MEMORY_WINDOWS {
            self.windows.pop_front();
        }
        self.windows.push_back(if a.loss_based { a.structural.clone() } else { BTreeSet::new() });
    }
}

/// Applies the rules of the module docs to one job's connections. `peers` are the job's peers
/// in the window (the candidates for blame); `recent` the peers blamed structurally in the job's
/// last windows ([`BlameMemory::recent`]), and those the caller knows to be faulty of late (the
/// detectors add the peers whose gray failure is open).
pub fn attribute(conns: &[DirectedConn], peers: &BTreeSet<IpAddr>, recent: &BTreeSet<IpAddr>) -> Attribution {
    let loss_ref = quantile(conns.iter().filter_map(DirectedConn::loss_ratio), 0.25).unwrap_or(0.0);
    let goodputs: Vec<f64> = conns.iter().filter_map(DirectedConn::goodput).collect();
    let goodput_ref = (goodputs.len() >= MIN_CONNS_FOR_MEDIAN).then(|| quantile(goodputs, 0.75)).flatten();
    let lossy = |c: &DirectedConn| {
        is_lossy(c.loss_packets, c.data_packets) && c.loss_ratio().is_some_and(|r| r >= LOSS_OUTLIER_FACTOR * loss_ref)
    };
    let slow = |c: &DirectedConn| matches!((c.goodput(), goodput_ref), (Some(g), Some(m)) if g <= SLOW_FACTOR * m);
    // Loss is the network's own signature; slowness also follows from it (a sender busy resending
    // to a lossy peer is slower to everyone, a rank waiting on it sends late): when any connection
    // is lossy, the slow ones are not evidence of their own. They may only confirm loss's guess
    // (a rate cap's onset: the capped host's burst of drops on one connection, its slowness on
    // the others makes it the structural culprit), never move the blame elsewhere (after a
    // flap, everyone's slowness would).
    let pick = |with_slow: bool| -> Vec<(IpAddr, IpAddr, u64)> {
        conns
            .iter()
            .filter(|c| lossy(c) || (with_slow && slow(c)))
            .filter_map(|c| Some((c.src?, c.dst?, c.loss_packets)))
            .filter(|(s, d, _)| s != d)
            .collect()
    };
    if !conns.iter().any(lossy) {
        return blame(conns, &pick(true), peers, recent, loss_ref, goodput_ref);
    }
    let by_loss = Attribution { loss_based: true, ..blame(conns, &pick(false), peers, recent, loss_ref, goodput_ref) };
    if !by_loss.structural.is_empty() {
        return by_loss;
    }
    let with_slow = blame(conns, &pick(true), peers, recent, loss_ref, goodput_ref);
    let structural: BTreeSet<IpAddr> = with_slow.structural.intersection(&by_loss.blamed).copied().collect();
    Attribution { structural, ..by_loss }
}

/// The rules after the choice of bad connections (see [`attribute`]).
fn blame(
    conns: &[DirectedConn],
    bad: &[(IpAddr, IpAddr, u64)],
    peers: &BTreeSet<IpAddr>,
    recent: &BTreeSet<IpAddr>,
    loss_ref: f64,
    goodput_ref: Option<f64>,
) -> Attribution {
    let mut explained = vec![false; bad.len()];
    let mut out = Attribution::default();
    loop {
        // (distinct counterparts, loss) per candidate over unexplained bad connections.
        let mut score: BTreeMap<IpAddr, (BTreeSet<IpAddr>, u64)> = BTreeMap::new();
        for (i, &(s, d, loss)) in bad.iter().enumerate() {
            if explained[i] {
                continue;
            }
            for (me, other) in [(s, d), (d, s)] {
                if peers.contains(&me) && !out.blamed.contains(&me) {
                    let e = score.entry(me).or_default();
                    e.0.insert(other);
                    e.1 += loss;
                }
            }
        }
        // BTreeMap order makes the lowest address win ties after count and loss.
        let best = score
            .iter()
            .map(|(p, (others, loss))| (others.len(), *loss, std::cmp::Reverse(*p)))
            .max();
        let Some((count, _, std::cmp::Reverse(culprit))) = best else { break };
        if count < 2 {
            break;
        }
        out.blamed.insert(culprit);
        out.structural.insert(culprit);
        for (i, &(s, d, _)) in bad.iter().enumerate() {
            if s == culprit || d == culprit {
                explained[i] = true;
            }
        }
    }
    // A peer all of whose active connections are bad, against a counterpart that also has good
    // ones: the fault is on its path. (Pairwise algorithms, recursive doubling's folded ranks, a
    // flapped host with one partner in the window: one counterpart, so the rule above cannot see
    // it, and the receiver rule below would blame whichever end received.)
    let has_good: BTreeSet<IpAddr> = conns
        .iter()
        .filter(|c| c.data_packets >= MIN_ACTIVE_DATA_PACKETS && !bad.iter().any(|&(s, d, _)| Some(s) == c.src && Some(d) == c.dst))
        .flat_map(|c| [c.src, c.dst])
        .flatten()
        .collect();
    for i in 0..bad.len() {
        let (s, d, _) = bad[i];
        if explained[i] || !peers.contains(&s) || !peers.contains(&d) {
            continue;
        }
        let culprit = match (has_good.contains(&s), has_good.contains(&d)) {
            (false, true) => s,
            (true, false) => d,
            _ => continue,
        };
        out.blamed.insert(culprit);
        out.structural.insert(culprit);
        for (j, &(s2, d2, _)) in bad.iter().enumerate() {
            if s2 == culprit || d2 == culprit {
                explained[j] = true;
            }
        }
    }
    // Lone bad connections between two peers: the receiver's link, unless only the sender was
    // blamed structurally of late.
    for (i, &(s, d, _)) in bad.iter().enumerate() {
        if explained[i] || !peers.contains(&s) || !peers.contains(&d) || out.blamed.contains(&s) {
            continue;
        }
        let culprit = if recent.contains(&s) && !recent.contains(&d) { s } else { d };
        out.blamed.insert(culprit);
        explained[i] = true;
    }
    // Explained peers: every bad connection of theirs has a blamed other end.
    let mut by_peer: BTreeMap<IpAddr, Vec<Option<IpAddr>>> = BTreeMap::new();
    for &(s, d, _) in bad {
        for (me, other) in [(s, d), (d, s)] {
            if peers.contains(&me) && !out.blamed.contains(&me) {
                by_peer.entry(me).or_default().push(out.blamed.contains(&other).then_some(other));
            }
        }
    }
    for (peer, others) in by_peer {
        if let Some(Some(first)) = others.first().copied().filter(|_| others.iter().all(Option::is_some)) {
            out.explained_by.insert(peer, first);
        }
    }
    if !bad.is_empty() {
        // What each window's blame rests on, for `RUST_LOG=ringside::detect::attribution=debug`
        // (never per packet: one line per job window with a bad connection).
        let active: Vec<String> = conns
            .iter()
            .filter(|c| c.data_packets >= MIN_ACTIVE_DATA_PACKETS)
            .filter_map(|c| {
                let g = c.goodput().map_or(-1.0, |g| g / 1e6);
                Some(format!("{}>{}:{}/{}@{g:.0}", c.src?, c.dst?, c.loss_packets, c.data_packets))
            })
            .collect();
        tracing::debug!(
            target: "ringside::detect::attribution",
            bad = ?bad.iter().map(|(s, d, l)| format!("{s}>{d}:{l}")).collect::<Vec<_>>(),
            blamed = ?out.blamed,
            explained = ?out.explained_by,
            loss_ref, goodput_ref_mbps = goodput_ref.map_or(-1.0, |g| g / 1e6),
            conns = ?active,
            "attribution"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_whose_only_connections_are_bad_is_blamed_not_its_partner() {
        // Host 5 talks to host 1 only (a folded rank), both ways lossy; host 1 also talks to 2 and 3.
        let c = |s: u8, d: u8, loss: u64| DirectedConn { src: Some(ip(s)), dst: Some(ip(d)), loss_packets: loss, data_packets: 10_000, ..Default::default() };
        let conns = vec![c(5, 1, 300), c(1, 5, 280), c(1, 2, 1), c(2, 1, 0), c(1, 3, 2), c(3, 1, 1), c(2, 3, 0)];
        let peers: BTreeSet<IpAddr> = [1, 2, 3, 5].map(ip).into();
        let a = attribute(&conns, &peers, &BTreeSet::new());
        assert_eq!(a.blamed, [ip(5)].into());
        assert_eq!(a.explained_by.get(&ip(1)), Some(&ip(5)));
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 77, 0, last])
    }

    /// A ring of `n` hosts 1..=n, each sending to the next: `loss[i]` packets lost of 10,000 on the
    /// connection from host i+1, goodput `gbps[i]` GB/s.
    fn ring(n: u8, loss: &[u64], gbps: &[f64]) -> Vec<DirectedConn> {
        (0..n)
            .map(|i| DirectedConn {
                src: Some(ip(i + 1)),
                dst: Some(ip((i + 1) % n + 1)),
                loss_packets: loss[i as usize],
                data_packets: 10_000,
                burst_bytes: (gbps[i as usize] * 1e8) as u64,
                burst_ns: 100_000_000,
            })
            .collect()
    }

    /// `src -> dst` with `loss` of 20,000 data packets, at `gbps` GB/s inside its bursts.
    fn conn(src: u8, dst: u8, loss: u64, gbps: f64) -> DirectedConn {
        DirectedConn {
            src: Some(ip(src)),
            dst: Some(ip(dst)),
            loss_packets: loss,
            data_packets: 20_000,
            burst_bytes: (gbps * 1e8) as u64,
            burst_ns: 100_000_000,
        }
    }

    fn all_peers(n: u8) -> BTreeSet<IpAddr> {
        (1..=n).map(ip).collect()
    }

    #[test]
    fn lossy_host_link_blames_the_host_and_explains_both_neighbours() {
        // Host 4's link drops both ways: 3 -> 4 and 4 -> 5 lose; 1 spurious retrans elsewhere.
        let c = ring(6, &[1, 0, 60, 45, 0, 2], &[1.0; 6]);
        let a = attribute(&c, &all_peers(6), &BTreeSet::new());
        assert_eq!(a.blamed, BTreeSet::from([ip(4)]));
        assert_eq!(a.explained_by, BTreeMap::from([(ip(3), ip(4)), (ip(5), ip(4))]));
    }

    #[test]
    fn rate_capped_host_is_blamed_from_goodput() {
        let c = ring(6, &[0; 6], &[1.0, 1.1, 0.25, 0.24, 0.9, 1.0]);
        let a = attribute(&c, &all_peers(6), &BTreeSet::new());
        assert_eq!(a.blamed, BTreeSet::from([ip(4)]));
        assert_eq!(a.explained_by.keys().copied().collect::<Vec<_>>(), vec![ip(3), ip(5)]);
    }

    #[test]
    fn a_lone_bad_connection_is_blamed_on_its_receiver() {
        // Only 3 -> 4 is bad (one direction of one link): host 4's link, whose switch queue it is.
        let c = ring(6, &[0, 0, 60, 0, 0, 0], &[1.0; 6]);
        let a = attribute(&c, &all_peers(6), &BTreeSet::new());
        assert_eq!(a.blamed, BTreeSet::from([ip(4)]));
        assert_eq!(a.explained_by, BTreeMap::from([(ip(3), ip(4))]));
        // Seen from a host (the sender is not a peer), nothing changes.
        let a = attribute(&c, &BTreeSet::from([ip(4)]), &BTreeSet::new());
        assert_eq!((a.blamed, a.explained_by), Default::default());
    }

    #[test]
    fn only_blame_that_rests_on_loss_is_remembered() {
        // Recorded on OpenMPI (target/eval-far-rc, ratecap #5): a healthy host's uneven phases
        // got it blamed by slowness alone just before a rate cap; remembered, that blame took the
        // capped host's first lossy connection (into the capped host, from the healthy one).
        let mut memory = BlameMemory::default();
        let slow = attribute(&ring(6, &[0; 6], &[1.0, 1.1, 0.25, 0.24, 0.9, 1.0]), &all_peers(6), &BTreeSet::new());
        assert_eq!((slow.structural.clone(), slow.loss_based), (BTreeSet::from([ip(4)]), false));
        memory.push(&slow);
        assert_eq!(memory.recent(), BTreeSet::new());
        let lossy = attribute(&ring(6, &[0, 0, 60, 60, 0, 0], &[1.0; 6]), &all_peers(6), &BTreeSet::new());
        assert_eq!((lossy.structural.clone(), lossy.loss_based), (BTreeSet::from([ip(4)]), true));
        memory.push(&lossy);
        assert_eq!(memory.recent(), BTreeSet::from([ip(4)]));
    }

    #[test]
    fn healthy_noise_changes_nothing() {
        let c = ring(6, &[3, 2, 1, 0, 3, 2], &[1.0, 0.8, 1.2, 0.9, 1.1, 0.7]);
        assert_eq!(attribute(&c, &all_peers(6), &BTreeSet::new()), Attribution::default());
    }

    #[test]
    fn host_vantage_never_explains_a_peer_away() {
        // The agent on host 1 sees only its own connections: to 2 and from 6, both bad (its own
        // NIC is lossy). Host 1 is not a peer, so nobody is blamed and nothing is explained.
        let c = vec![
            DirectedConn { src: Some(ip(1)), dst: Some(ip(2)), loss_packets: 80, data_packets: 10_000, ..Default::default() },
            DirectedConn { src: Some(ip(6)), dst: Some(ip(1)), loss_packets: 70, data_packets: 10_000, ..Default::default() },
        ];
        let a = attribute(&c, &BTreeSet::from([ip(2), ip(6)]), &BTreeSet::new());
        assert_eq!(a, Attribution::default());
    }

    #[test]
    fn a_few_resends_on_a_low_volume_direction_are_not_loss() {
        // Ring 1 -> 2 -> 3 -> 4 healthy; 2 -> 1 carries a collective library's small control
        // messages, 6 of 128 of them resent (tail-loss probes on a busy machine).
        let mut c = ring(4, &[1, 2, 0, 1], &[1.0; 4]);
        c.push(DirectedConn { src: Some(ip(2)), dst: Some(ip(1)), loss_packets: 6, data_packets: 128, ..Default::default() });
        assert_eq!(attribute(&c, &all_peers(4), &BTreeSet::new()), Attribution::default());
        // A link that went down mid-window: few packets, most of them resent.
        c.last_mut().unwrap().loss_packets = 80;
        assert_eq!(attribute(&c, &all_peers(4), &BTreeSet::new()).blamed, BTreeSet::from([ip(1)]));
    }

    #[test]
    fn a_lone_bad_connection_from_a_recently_blamed_peer_is_its_sender_s() {
        // Host 2's link flapped: a window blamed it from both of its connections; the next shows
        // only what it resent to host 3.
        let mut memory = BlameMemory::default();
        let first = attribute(&ring(6, &[60, 70, 0, 0, 0, 0], &[1.0; 6]), &all_peers(6), &memory.recent());
        assert_eq!(first.structural, BTreeSet::from([ip(2)]));
        memory.push(&first);
        let c = ring(6, &[0, 300, 0, 0, 0, 0], &[1.0; 6]);
        let a = attribute(&c, &all_peers(6), &memory.recent());
        assert_eq!(a.blamed, BTreeSet::from([ip(2)]));
        assert_eq!(a.explained_by, BTreeMap::from([(ip(3), ip(2))]));
        assert!(a.structural.is_empty(), "a guess is not remembered as structural blame");
        // Without the memory the receiver is blamed; and the memory fades.
        assert_eq!(attribute(&c, &all_peers(6), &BTreeSet::new()).blamed, BTreeSet::from([ip(3)]));
        for _ in 0..BLAME_MEMORY_WINDOWS {
            memory.push(&a);
        }
        assert_eq!(attribute(&c, &all_peers(6), &memory.recent()).blamed, BTreeSet::from([ip(3)]));
    }

    #[test]
    fn slow_connections_are_no_evidence_when_another_is_lossy() {
        // Rabenseifner's fold: host 4 talks only to host 3, both ways lossy; host 3, busy
        // resending, is slow to host 6 as well. Host 4 is blamed (its every connection is bad),
        // not host 3 for having two bad counterparts.
        let c = conn;
        let conns = vec![c(3, 4, 1258, 1.0), c(4, 3, 821, 1.0), c(3, 6, 0, 0.3), c(6, 3, 0, 1.0), c(1, 2, 0, 1.0), c(2, 1, 0, 1.1), c(3, 1, 0, 0.9)];
        let a = attribute(&conns, &all_peers(6), &BTreeSet::new());
        assert_eq!(a.blamed, BTreeSet::from([ip(4)]));
        assert_eq!(a.explained_by, BTreeMap::from([(ip(3), ip(4))]));
    }

    #[test]
    fn a_rate_cap_s_onset_is_blamed_on_the_capped_host_from_loss_confirmed_by_slowness() {
        // Host 5's link is capped: its inbound connection from host 6 drops a burst as the queue
        // fills, its outbound one to host 4 slows. Loss alone is one connection (a guess at its
        // receiver); with the slow one, host 5 has two bad counterparts: the guess is confirmed.
        let c = conn;
        let conns = vec![c(6, 5, 1820, 1.0), c(5, 4, 2, 0.05), c(4, 3, 4, 1.1), c(3, 2, 2, 0.9), c(2, 1, 2, 1.0), c(1, 6, 2, 1.0)];
        let a = attribute(&conns, &all_peers(6), &BTreeSet::new());
        assert_eq!(a.structural, BTreeSet::from([ip(5)]));
        assert_eq!(a.explained_by, BTreeMap::from([(ip(6), ip(5))]));
        // Slowness confirms loss's guess, never moves it: if the lossy connection ran 6 -> 1,
        // host 1 stays a guess however slow host 5 is.
        let moved: Vec<DirectedConn> = conns.iter().map(|x| if x.src == Some(ip(6)) { DirectedConn { loss_packets: 2, ..x.clone() } } else { x.clone() }).chain([c(6, 1, 1820, 1.0)]).collect();
        let a = attribute(&moved, &all_peers(6), &BTreeSet::new());
        assert_eq!((a.blamed, a.structural), (BTreeSet::from([ip(1)]), BTreeSet::new()));
    }

    #[test]
    fn two_faulty_hosts_are_both_blamed() {
        // Links of hosts 2 and 5 lossy both ways in a ring of 6.
        let c = ring(6, &[50, 50, 0, 50, 50, 0], &[1.0; 6]);
        let a = attribute(&c, &all_peers(6), &BTreeSet::new());
        assert_eq!(a.blamed, BTreeSet::from([ip(2), ip(5)]));
        assert_eq!(a.explained_by, BTreeMap::from([(ip(1), ip(2)), (ip(3), ip(2)), (ip(4), ip(5)), (ip(6), ip(5))]));
    }
}
