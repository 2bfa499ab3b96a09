//! Scenario tests: synthetic series through the whole `DetectorSet`, asserting the exact kind,
//! scope, timing and classification of every verdict.

use std::net::IpAddr;

use super::sim::{Fault, RingJob, Scenario, MS, S, SPIKE_EVERY};
use super::*;

/// Runs the series; returns (window index, change) for every change.
fn run_with(cfg: DetectorConfig, windows: &[JobWindow]) -> Vec<(usize, VerdictChange)> {
    let mut set = DetectorSet::new(cfg);
    let mut out = Vec::new();
    for (i, w) in windows.iter().enumerate() {
        for c in set.observe(w).expect("valid window") {
            out.push((i, c));
        }
    }
    out
}

/// The scopes of the verdicts opened over `windows` with the default configuration, in order.
fn opened_scopes(windows: &[JobWindow]) -> Vec<Scope> {
    run_with(DetectorConfig::default(), windows)
        .into_iter()
        .filter(|(_, c)| matches!(c, VerdictChange::Opened(_)))
        .map(|(_, c)| c.verdict().scope.clone())
        .collect()
}

fn run(s: &Scenario, n: usize) -> Vec<(usize, VerdictChange)> {
    run_with(DetectorConfig::default(), &s.windows(n))
}

fn peer_scope(s: &Scenario, i: usize) -> Scope {
    Scope::Peer { peer: s.peer(i), link: s.peers[i].1.clone() }
}

/// Asserts that every change is about one verdict of `kind` on `scope`: opened at or before
/// `latest_open`, closed (cleared) at or before `latest_close`. Returns (opened window, closed
/// window, closed verdict).
fn single_verdict(
    changes: &[(usize, VerdictChange)],
    kind: VerdictKind,
    scope: &Scope,
    latest_open: usize,
    latest_close: usize,
) -> (usize, usize, Verdict) {
    for (i, c) in changes {
        let v = c.verdict();
        assert_eq!((v.kind, &v.scope), (kind, scope), "unexpected change at window {i}: {c:?}");
    }
    let ids: std::collections::BTreeSet<u64> = changes.iter().map(|(_, c)| c.verdict().id).collect();
    assert_eq!(ids.len(), 1, "expected one verdict, got {changes:#?}");
    let (opened_at, VerdictChange::Opened(_)) = &changes[0] else { panic!("first change is not an opening: {changes:#?}") };
    let (closed_at, VerdictChange::Closed(closed)) = changes.last().unwrap() else {
        panic!("verdict never closed: {changes:#?}")
    };
    assert!(*opened_at <= latest_open, "opened at window {opened_at}, expected ≤ {latest_open}");
    assert!(*closed_at <= latest_close, "closed at window {closed_at}, expected ≤ {latest_close}");
    assert_eq!(closed.end_reason, Some(EndReason::Cleared));
    (*opened_at, *closed_at, closed.clone())
}

fn has_metric(v: &Verdict, m: Metric) -> bool {
    v.evidence.iter().any(|e| e.metric == m)
}

const SEEDS: [u64; 6] = [1, 2, 3, 42, 1234, 99_999];

#[test]
fn healthy_noise_never_alarms() {
    for seed in SEEDS {
        for s in [Scenario::two_leaves(seed), Scenario::star(seed)] {
            let changes = run(&s, 600);
            assert!(changes.is_empty(), "seed {seed}: {changes:#?}");
        }
    }
}

#[test]
fn loss_on_one_peer_is_a_persistent_gray_failure_on_that_peer() {
    for (rate, seed) in [(0.01, 1), (0.02, 2), (0.05, 3)] {
        let s = Scenario::two_leaves(seed).with(Fault::Loss { peer: 2, rate }, 20, 40);
        let changes = run(&s, 60);
        let (opened, closed, v) =
            single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 2), 21, 43);
        assert!(opened >= 20, "rate {rate}: raised before the fault at {opened}");
        assert!(closed >= 40, "rate {rate}: cleared while the fault lasted");
        assert_eq!(v.classification, Some(Classification::Persistent), "rate {rate}");
        assert_eq!(v.started_ns, 20 * S, "rate {rate}");
        assert_eq!(v.ended_ns, Some(40 * S), "rate {rate}");
        assert!(has_metric(&v, Metric::LossRate), "rate {rate}: {v:?}");
        let loss = v.evidence.iter().find(|e| e.metric == Metric::LossRate).unwrap();
        assert!((loss.value - rate).abs() < rate * 0.5, "rate {rate}: evidence {loss:?}");
    }
}

#[test]
fn a_peer_explained_by_another_peers_path_is_not_a_gray_failure() {
    // Peers 2 and 3 both lose 2 % (3 shares its connection with 2, seen from a switch), and the
    // collector attributed 3's loss to 2: only 2 gets a verdict, in the same windows as alone.
    let s = Scenario::two_leaves(4).with(Fault::Loss { peer: 2, rate: 0.02 }, 20, 40).with(Fault::Loss { peer: 3, rate: 0.02 }, 20, 40);
    let mut windows = s.windows(60);
    let (culprit, neighbour) = (s.peer(2), s.peer(3));
    for w in &mut windows[20..40] {
        for p in w.peers.iter_mut().filter(|p| p.peer == neighbour) {
            p.explained_by = Some(culprit);
        }
    }
    let changes = run_with(DetectorConfig::default(), &windows);
    let (opened, closed, _) = single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 2), 21, 43);
    assert!(opened >= 20 && closed >= 40);
}

#[test]
fn shared_loss_on_an_uplink_is_congestion_and_excuses_the_peers_behind_it() {
    // A leaf's view: peer 2 sends through the uplink, which drops 2 % of everyone's packets (the
    // job's one connection and three cross-traffic flows with no host in common). Peer 2 alone
    // looks like a gray failure; the shared loss says the uplink is congested.
    let s = Scenario::two_leaves(6).with(Fault::Loss { peer: 2, rate: 0.02 }, 20, 40);
    let mut windows = s.windows(60);
    let uplink = "uplink".to_string();
    for w in &mut windows[20..40] {
        w.links.push(LinkWindow {
            link: uplink.clone(),
            direction: "egress".into(),
            flows: 4,
            lossy_flows: 4,
            lossy_job_flows: 1,
            loss_packets: 800,
            data_packets: 40_000,
            ..Default::default()
        });
        for p in w.peers.iter_mut().filter(|p| p.peer == s.peer(2)) {
            p.shared_links = vec![uplink.clone()];
        }
    }
    let changes = run_with(DetectorConfig::default(), &windows);
    let scope = Scope::Link { link: uplink.clone() };
    let (opened, closed, v) = single_verdict(&changes, VerdictKind::Congestion, &scope, 21, 44);
    assert!(opened >= 20 && closed >= 40);
    assert!(has_metric(&v, Metric::LossyFlows), "{v:?}");

    // The same loss seen on ingress (upstream), or with one host common to all lossy flows (that
    // host's path), is not shared loss: peer 2 is then a gray failure.
    for (direction, common) in [("ingress", None), ("egress", Some(s.peer(2)))] {
        let mut windows = s.windows(60);
        for w in &mut windows[20..40] {
            w.links.push(lossy_uplink(direction, common));
        }
        let changes = run_with(DetectorConfig::default(), &windows);
        single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 2), 21, 43);
    }
}

/// `uplink` in `direction` with four lossy connections (one of them the job's) of 2 %, `common`
/// the host common to all of them if any.
fn lossy_uplink(direction: &str, common: Option<IpAddr>) -> LinkWindow {
    LinkWindow {
        link: "uplink".into(),
        direction: direction.into(),
        flows: 4,
        lossy_flows: 4,
        lossy_job_flows: 1,
        common_endpoint: common,
        loss_packets: 800,
        data_packets: 40_000,
        ..Default::default()
    }
}

#[test]
fn loss_shared_upstream_excuses_the_peers_that_come_in_by_that_link() {
    // A leaf's view of hosts behind the uplink (peers 2 and 3 come in by it): another switch's
    // congested uplink drops the job's connections from them and two cross-traffic flows on their
    // way in. That agent reports the congestion (on its egress); here neither peer is a gray
    // failure, nor is this uplink congested. With one host common to every lossy flow (peer 2's
    // own path, peer 3 healthy), peer 2 is a gray failure.
    for (common, expect_verdict) in [(None, false), (Some(2), true)] {
        let mut s = Scenario::two_leaves(6).with(Fault::Loss { peer: 2, rate: 0.02 }, 20, 40);
        if common.is_none() {
            s = s.with(Fault::Loss { peer: 3, rate: 0.02 }, 20, 40);
        }
        let common = common.map(|i| s.peer(i));
        let mut windows = s.windows(60);
        for w in &mut windows {
            for p in w.peers.iter_mut().filter(|p| p.peer == s.peer(2) || p.peer == s.peer(3)) {
                p.link = "uplink".into();
            }
        }
        for w in &mut windows[20..40] {
            w.links.push(lossy_uplink("ingress", common));
        }
        let changes = run_with(DetectorConfig::default(), &windows);
        if expect_verdict {
            single_verdict(&changes, VerdictKind::GrayFailure, &Scope::Peer { peer: s.peer(2), link: "uplink".into() }, 21, 43);
        } else {
            assert!(changes.is_empty(), "{changes:#?}");
        }
    }
}

/// Peer 2's sends cross `uplink`, whose egress the job shares with `other` bytes of other
/// traffic per window from window 20 to 40, when peer 2's goodput (and the job's on the
/// uplink) falls to 1/4.
fn competing_windows(s: &Scenario, other: u64) -> Vec<JobWindow> {
    let mut windows = s.windows(60);
    for (i, w) in windows.iter_mut().enumerate() {
        w.links.push(competing_egress("uplink", (20..40).contains(&i), other));
        for p in w.peers.iter_mut().filter(|p| p.peer == s.peer(2)) {
            p.shared_links = vec!["uplink".into()];
        }
    }
    windows
}

/// `link`'s egress in one window: the job's 40 MB alone, or (`during`) beside `other` bytes of
/// other traffic with the job's in-burst goodput cut to 1/4.
fn competing_egress(link: &str, during: bool, other: u64) -> LinkWindow {
    LinkWindow {
        link: link.into(),
        direction: "egress".into(),
        flows: if during { 5 } else { 1 },
        job_bytes: 40_000_000,
        other_bytes: if during { other } else { 0 },
        job_burst_bytes: 40_000_000,
        job_burst_ns: if during { 1_600_000_000 } else { 400_000_000 },
        ..Default::default()
    }
}

#[test]
fn other_traffic_taking_a_links_bandwidth_is_congestion_not_a_gray_failure() {
    let s = Scenario::two_leaves(8).with(Fault::GoodputCut { peer: 2, factor: 0.25 }, 20, 40);
    let changes = run_with(DetectorConfig::default(), &competing_windows(&s, 300_000_000));
    let (opened, closed, v) = single_verdict(&changes, VerdictKind::Congestion, &Scope::Link { link: "uplink".into() }, 21, 44);
    assert!(opened >= 20 && closed >= 40);
    assert!(has_metric(&v, Metric::OtherTrafficBps), "{v:?}");

    // The same slowdown with the job alone on the link is the peer's gray failure.
    let changes = run_with(DetectorConfig::default(), &competing_windows(&s, 0));
    single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 2), 21, 43);
}

#[test]
fn severe_loss_is_raised_in_the_first_window_and_critical() {
    let s = Scenario::two_leaves(5).with(Fault::Loss { peer: 6, rate: 0.05 }, 20, 40);
    let changes = run(&s, 50);
    let (opened, _, v) = single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 6), 20, 43);
    assert_eq!(opened, 20);
    assert_eq!(v.severity, Severity::Critical);
}

#[test]
fn two_peers_severe_in_one_window_are_not_raised_on_it_alone() {
    // The first, partial window of a fault: both ends of the bad connection look severe before
    // attribution can tell them apart. One such window raises nothing ...
    let s = Scenario::star(5).with(Fault::Loss { peer: 1, rate: 0.05 }, 20, 21).with(Fault::Loss { peer: 2, rate: 0.05 }, 20, 21);
    let changes = run(&s, 30);
    assert!(changes.is_empty(), "{changes:#?}");
    // ... while a lasting fault still raises by k of n windows (the second one).
    let s = Scenario::star(5).with(Fault::Loss { peer: 1, rate: 0.05 }, 20, 40).with(Fault::Loss { peer: 2, rate: 0.05 }, 20, 40);
    let opened: Vec<usize> = run(&s, 45).iter().filter(|(_, c)| matches!(c, VerdictChange::Opened(_))).map(|(i, _)| *i).collect();
    assert_eq!(opened, vec![21, 21]);
}

#[test]
fn a_culprit_is_compared_with_the_peers_that_are_not_its_collateral() {
    // Recursive doubling seen from a switch: host 3's link loses 1 %; three of the five others
    // exchange with it and show half its loss, explained by it. Against all others the median is
    // their 0.5 % and host 3 would not stand out; against the two clean ones it does.
    let mut s = Scenario::star(6).with(Fault::Loss { peer: 3, rate: 0.01 }, 20, 40);
    for p in [1, 2, 5] {
        s = s.with(Fault::Loss { peer: p, rate: 0.005 }, 20, 40);
    }
    let mut windows = s.windows(50);
    for w in &mut windows[20..40] {
        for p in w.peers.iter_mut().filter(|p| [1, 2, 5].map(|i| s.peer(i)).contains(&p.peer)) {
            p.explained_by = Some(s.peer(3));
        }
    }
    let changes = run_with(DetectorConfig::default(), &windows);
    let (opened, closed, _) = single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 3), 21, 43);
    assert!(opened >= 20 && closed >= 40);
}

#[test]
fn a_peer_blamed_only_by_attribution_s_guess_is_not_raised_on_one_window() {
    // Seen from a switch: the windows carry the job's connections, a ring over the peers. Only the
    // connection into peer 6 loses (5 %): both ends have good connections too, so attribution can
    // only guess (the receiver). One such window raises nothing; a lasting fault raises on the
    // second window.
    let conns = |s: &Scenario, w: &JobWindow, lossy: bool| -> Vec<crate::attribution::DirectedConn> {
        let n = s.peers.len();
        (0..n)
            .map(|i| crate::attribution::DirectedConn {
                src: Some(s.peer(i)),
                dst: Some(s.peer((i + 1) % n)),
                loss_packets: if lossy && (i + 1) % n == 6 { 500 } else { 1 },
                data_packets: 10_000,
                ..Default::default()
            })
            .filter(|_| !w.peers.is_empty())
            .collect()
    };
    for (end, expect) in [(21, vec![]), (40, vec![21])] {
        let s = Scenario::two_leaves(5).with(Fault::Loss { peer: 6, rate: 0.05 }, 20, end);
        let mut windows = s.windows(50);
        for (i, w) in windows.iter_mut().enumerate() {
            w.conns = conns(&s, w, (20..end).contains(&i));
        }
        let opened: Vec<usize> =
            run_with(DetectorConfig::default(), &windows).iter().filter(|(_, c)| matches!(c, VerdictChange::Opened(_))).map(|(i, _)| *i).collect();
        assert_eq!(opened, expect, "fault in windows 20..{end}");
    }
}

#[test]
fn attribution_contradicted_by_the_goodputs_names_nobody() {
    // Recorded on OpenMPI (target/eval ratecap #0, target/eval-far-rc ratecap #5): a rate cap
    // on one host; its partner, slowed by it, moves its bytes at a fifth of the others', the
    // capped host at a twentieth or in a trickle with no whole phase; attribution, reading the
    // partner's slow sends as the fault, explains the capped host by the partner. Blaming the
    // partner would name a healthy host; the capped host is explained: nobody is named rather
    // than the wrong one. (Here the explanation lasts to the end: the simulated cap's queue
    // drains for a few windows after it.)
    let named = |explain: bool| -> Vec<Scope> {
        let s = Scenario::star(7)
            .with(Fault::GoodputCut { peer: 3, factor: 0.01 }, 20, 40)
            .with(Fault::GoodputCut { peer: 2, factor: 0.3 }, 20, 40);
        let mut windows = s.windows(50);
        for w in &mut windows[20..] {
            for p in w.peers.iter_mut().filter(|p| explain && p.peer == s.peer(3)) {
                p.explained_by = Some(s.peer(2));
            }
        }
        opened_scopes(&windows)
    };
    let s = Scenario::star(7);
    assert!(named(false).contains(&peer_scope(&s, 3)), "without the explanation the capped host is named");
    assert_eq!(named(true), Vec::<Scope>::new());
}

#[test]
fn a_neighbours_stall_right_after_an_open_fault_is_that_faults_tail() {
    // Recorded on PyTorch DDP (target/eval-dsack-rt, torch loss-2 #1): 2 % loss on host 0's link
    // for 15 s; its ring neighbour's sends to it lose half that, explained by host 0. In the
    // window the loss stopped, the neighbour waited 470 ms for a retransmission timeout (a
    // segment lost just before), with excess loss: a severe stall, no longer explained because
    // host 0's loss had gone. It is the fault's tail, not a second fault.
    for seed in [1, 2, 3] {
        let tail = Fault::Flap { peer: 5, at_ns: 40 * S + 100 * MS, duration_ns: 450 * MS };
        let s = Scenario::star(seed)
            .with(Fault::Loss { peer: 0, rate: 0.02 }, 20, 40)
            .with(Fault::Loss { peer: 5, rate: 0.01 }, 20, 40)
            .with(tail, 40, 41);
        let mut windows = s.windows(50);
        let explain = |windows: &mut [JobWindow]| {
            for w in &mut windows[20..40] {
                for p in w.peers.iter_mut().filter(|p| p.peer == s.peer(5)) {
                    p.explained_by = Some(s.peer(0));
                }
            }
        };
        // Without the explanation the neighbour's loss and stall are its own: it is named.
        let named: Vec<Scope> = opened_scopes(&windows);
        assert!(named.contains(&peer_scope(&s, 5)), "seed {seed}: {named:?}");
        explain(&mut windows);
        let changes = run_with(DetectorConfig::default(), &windows);
        single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 0), 21, 44);
    }
}

#[test]
fn a_lone_bad_connection_from_a_host_whose_gray_failure_is_open_is_that_hosts() {
    // Recorded on OpenMPI (target/eval-flap2, flap #3): a host whose link flaps every 3 s, its
    // gray failure open on the first flap's silence; on a later flap only its sends to one
    // neighbour were lost. Attribution's lone-connection rule blamed the receiver (the healthy
    // neighbour), which was then raised. The flapping host's open verdict now counts as recent
    // blame: the sender is blamed and the neighbour is explained by it.
    let run_once = |tail: bool| -> Vec<Scope> {
        let flap = Fault::Flap { peer: 1, at_ns: 30 * S + 100 * MS, duration_ns: 400 * MS };
        let mut s = Scenario::star(3).with(flap, 30, 31);
        if tail {
            s = s.with(Fault::Loss { peer: 2, rate: 0.05 }, 32, 34);
        }
        let mut windows = s.windows(40);
        let n = s.peers.len();
        for (i, w) in windows.iter_mut().enumerate() {
            w.conns = (0..n)
                .map(|p| crate::attribution::DirectedConn {
                    src: Some(s.peer(p)),
                    dst: Some(s.peer((p + 1) % n)),
                    loss_packets: if tail && (32..34).contains(&i) && p == 1 { 500 } else { 1 },
                    data_packets: 10_000,
                    ..Default::default()
                })
                .collect();
        }
        opened_scopes(&windows)
    };
    let s = Scenario::star(3);
    assert_eq!(run_once(false), vec![peer_scope(&s, 1)], "the flap alone");
    assert_eq!(run_once(true), vec![peer_scope(&s, 1)], "its sends lost to peer 2 are the flapping host's");
}

#[test]
fn rate_cap_on_one_peers_link_is_a_gray_failure_not_congestion() {
    // A pure rate cap: no loss at all, only goodput.
    let s = Scenario::star(7).with(Fault::GoodputCut { peer: 3, factor: 0.25 }, 20, 40);
    let changes = run(&s, 60);
    let (opened, _, v) = single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 3), 21, 43);
    assert!(opened >= 20);
    assert!(has_metric(&v, Metric::InBurstGoodputBps), "{v:?}");
    assert!(!has_metric(&v, Metric::LossRate), "{v:?}");
}

/// `s`'s windows as the agent at one host's end of the wire sees them (`JobWindow::local` set),
/// judged with the IPU's `[detect.gray] min_peers = 2`.
fn run_at_own_cable(s: &Scenario, n: usize) -> Vec<(usize, VerdictChange)> {
    let mut windows = s.windows(n);
    for w in &mut windows {
        let addr = "10.0.0.9".parse().unwrap();
        w.local = Some(LocalSends { addr, link: "fabric".into(), bursts: Vec::new(), pokes: Vec::new() });
    }
    let mut cfg = DetectorConfig::default();
    cfg.gray.min_peers = 2;
    run_with(cfg, &windows)
}

#[test]
fn the_tail_of_a_fault_on_the_hosts_own_cable_names_no_neighbour() {
    // The host's own cable loses packets to and from both neighbours (congestion on `fabric`:
    // the cable itself), then, as after a flap, one more window of resent data lands on one
    // neighbour only. From the host's own end that tail is the same fault, not the neighbour's.
    let own = Fault::Uplink { link: "fabric", goodput_factor: 0.5, ce_rate: 0.0, loss_rate: 0.02 };
    let fabric = Scope::Link { link: "fabric".into() };
    for seed in [1, 2, 3] {
        let s = Scenario::own_cable(seed).with(own.clone(), 20, 26).with(Fault::Loss { peer: 0, rate: 0.02 }, 26, 27);
        let changes = run_at_own_cable(&s, 50);
        let (opened, _, _) = single_verdict(&changes, VerdictKind::Congestion, &fabric, 20, 30);
        assert_eq!(opened, 20, "seed {seed}");
        // The same windows seen without `local` (a switch's port): the tail names the neighbour.
        let mut cfg = DetectorConfig::default();
        cfg.gray.min_peers = 2;
        let elsewhere = run_with(cfg, &s.windows(50));
        assert!(
            elsewhere.iter().any(|(i, c)| *i == 26 && c.verdict().kind == VerdictKind::GrayFailure && c.verdict().scope == peer_scope(&s, 0)),
            "seed {seed}: the own-cable rule is what keeps it silent: {elsewhere:#?}"
        );
    }
}

#[test]
fn a_mild_dip_of_every_peer_at_the_own_cable_must_last() {
    // Both neighbours at 0.6 of their own history together: from the host's own end of the wire
    // that is also the host itself running slow (a busy CPU), so it must last 4 windows of 5, as a
    // gray failure's mild dip must. 3 windows of 5, then 2 of 3: nothing. A severe dip (0.3, a rate
    // cap) raises at once. On a switch's port the same mild dip keeps the 2-of-3 rule.
    let mild = |factor| Fault::Uplink { link: "fabric", goodput_factor: factor, ce_rate: 0.0, loss_rate: 0.0 };
    let fabric = Scope::Link { link: "fabric".into() };
    for seed in [1, 2, 3] {
        let bursts = Scenario::own_cable(seed).with(mild(0.6), 20, 22).with(mild(0.6), 23, 24).with(mild(0.6), 30, 32);
        let changes = run_at_own_cable(&bursts, 50);
        assert!(changes.is_empty(), "seed {seed}: {changes:#?}");
        let lasting = Scenario::own_cable(seed).with(mild(0.6), 20, 30);
        let (opened, _, v) = single_verdict(&run_at_own_cable(&lasting, 50), VerdictKind::Congestion, &fabric, 23, 36);
        assert_eq!(opened, 23, "seed {seed}: the fourth window of five");
        assert_eq!(v.severity, Severity::Warning, "seed {seed}");
        let severe = Scenario::own_cable(seed).with(mild(0.3), 20, 30);
        let (opened, _, _) = single_verdict(&run_at_own_cable(&severe, 50), VerdictKind::Congestion, &fabric, 20, 36);
        assert_eq!(opened, 20, "seed {seed}: severe raises at once");
        let mut cfg = DetectorConfig::default();
        cfg.gray.min_peers = 2;
        let at_switch = run_with(cfg, &bursts.windows(50));
        assert!(
            at_switch.iter().any(|(i, c)| *i == 21 && matches!(c, VerdictChange::Opened(v) if v.scope == fabric)),
            "seed {seed}: away from the own cable two windows of three raise: {at_switch:#?}"
        );
    }
}

/// `windows` as seen at one host's end of the wire (`JobWindow::local`, its cable `fabric`).
fn at_own_cable(mut windows: Vec<JobWindow>) -> Vec<JobWindow> {
    for w in &mut windows {
        w.local = Some(LocalSends { addr: "10.0.0.9".parse().unwrap(), link: "fabric".into(), bursts: Vec::new(), pokes: Vec::new() });
    }
    windows
}

/// `windows` with the own cable's egress queue (`fabric`) sending 10,000 packets a window and
/// dropping `drops` of them in `during` (none before and after).
fn with_fabric_queue(windows: Vec<JobWindow>, during: std::ops::Range<usize>, drops: u64) -> Vec<JobWindow> {
    with_fabric_queue_counts(windows, during, drops, 0)
}

/// [`with_fabric_queue`], also throttling `overlimits` times in `during`.
fn with_fabric_queue_counts(windows: Vec<JobWindow>, during: std::ops::Range<usize>, drops: u64, overlimits: u64) -> Vec<JobWindow> {
    with_egress_queue(windows, "fabric", |i| {
        let (drops, overlimits) = if during.contains(&i) { (drops, overlimits) } else { (0, 0) };
        crate::queue_stats::QueueDelta { packets: 10_000, drops, overlimits, ..Default::default() }
    })
}

/// `windows` with `link`'s egress queue counters of window `i` set to `queue(i)` (an egress
/// `LinkWindow` of two flows added where the window has none).
fn with_egress_queue(mut windows: Vec<JobWindow>, link: &str, queue: impl Fn(usize) -> crate::queue_stats::QueueDelta) -> Vec<JobWindow> {
    for (i, w) in windows.iter_mut().enumerate() {
        let queue = Some(queue(i));
        match w.links.iter_mut().find(|l| l.link == link && l.direction == "egress") {
            Some(l) => l.queue = queue,
            None => w.links.push(LinkWindow { link: link.into(), direction: "egress".into(), flows: 2, queue, ..Default::default() }),
        }
    }
    windows
}

#[test]
fn drops_in_the_own_cables_queue_name_the_cable_not_the_neighbour() {
    // One connection crosses both hosts' cables: the host's own cable is rate-capped, and the
    // loss it causes shows on the connection to neighbour 0 only (the other neighbour's data
    // comes in, unharmed). From the flows alone that is neighbour 0's gray failure (the peer at
    // the far end of a lossy connection); the own egress queue's drops say the cable is here.
    let mut cfg = DetectorConfig::default();
    cfg.gray.min_peers = 2;
    let fabric = Scope::Link { link: "fabric".into() };
    for seed in [1, 2, 3] {
        let s = Scenario::own_cable(seed).with(Fault::Loss { peer: 0, rate: 0.05 }, 20, 40);
        let changes = run_with(cfg.clone(), &with_fabric_queue(at_own_cable(s.windows(60)), 20..40, 600));
        let (opened, _, v) = single_verdict(&changes, VerdictKind::Congestion, &fabric, 20, 44);
        assert_eq!(opened, 20, "seed {seed}: severe (6 % of the queue) raises at once");
        assert!(has_metric(&v, Metric::QueueDropRate), "seed {seed}: {v:?}");
        assert_eq!(v.severity, Severity::Critical, "seed {seed}");
        // Without the queue's counters (or with a queue that drops nothing) it is the neighbour.
        // On a switch's port (no `local`) a dropping queue is that peer's path: not judged here.
        for windows in [
            at_own_cable(s.windows(60)),
            with_fabric_queue(at_own_cable(s.windows(60)), 20..40, 0),
            with_fabric_queue(s.windows(60), 20..40, 600),
        ] {
            let changes = run_with(cfg.clone(), &windows);
            single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 0), 21, 44);
        }
    }
}

#[test]
fn a_shaper_that_starts_holding_back_the_own_cables_sends_names_the_cable_not_the_neighbour() {
    // The host's own cable is rate-capped by a shaper whose queue absorbs what the host sends (a
    // ring forwards what it got): nothing is dropped, but the connection to neighbour 0 slows,
    // which from the flows alone is neighbour 0's gray failure. The queue held packets back
    // 1.5 times per packet sent (recorded on a capped IPU: 0.9-1.7): the cable is here.
    let mut cfg = DetectorConfig::default();
    cfg.gray.min_peers = 2;
    let fabric = Scope::Link { link: "fabric".into() };
    for seed in [1, 2, 3] {
        let s = Scenario::own_cable(seed).with(Fault::GoodputCut { peer: 0, factor: 0.25 }, 20, 40);
        let changes = run_with(cfg.clone(), &with_fabric_queue_counts(at_own_cable(s.windows(60)), 20..40, 0, 15_000));
        let (opened, _, v) = single_verdict(&changes, VerdictKind::Congestion, &fabric, 21, 44);
        assert_eq!(opened, 21, "seed {seed}: two windows of three (never severe)");
        assert!(has_metric(&v, Metric::QueueThrottleRate), "seed {seed}: {v:?}");
        assert_eq!(v.severity, Severity::Warning, "seed {seed}");
        // A shaper that held packets back all along (a provider's rate limit) is its baseline.
        let always = with_fabric_queue_counts(at_own_cable(Scenario::own_cable(seed).windows(60)), 0..60, 0, 15_000);
        assert!(run_with(cfg.clone(), &always).is_empty(), "seed {seed}");
        // Without the counters, or on a switch's port: the neighbour.
        for windows in [at_own_cable(s.windows(60)), with_fabric_queue_counts(s.windows(60), 20..40, 0, 15_000)] {
            single_verdict(&run_with(cfg.clone(), &windows), VerdictKind::GrayFailure, &peer_scope(&s, 0), 21, 44);
        }
    }
}

/// `windows` with `link`'s egress interface losing its carrier once in each window of `at`.
fn with_carrier_downs(windows: Vec<JobWindow>, link: &str, at: &[usize]) -> Vec<JobWindow> {
    with_egress_queue(windows, link, |i| crate::queue_stats::QueueDelta {
        packets: 10_000,
        carrier_downs: u64::from(at.contains(&i)),
        ..Default::default()
    })
}

#[test]
fn a_flap_of_the_own_cable_names_the_cable_not_the_neighbour_that_resent() {
    // The host's own cable goes down for a moment every three windows. The data in flight when it
    // went down is resent in the next window, and from this end that loss shows on the one
    // connection that had data in flight: neighbour 0's (recorded at an IPU in a PyTorch ring:
    // 1.4-3.1 % loss on one neighbour's connection, 0 on the other). From the flows alone that is
    // neighbour 0's gray failure; the carrier count says the cable went down, here.
    let mut cfg = DetectorConfig::default();
    cfg.gray.min_peers = 2;
    let fabric = Scope::Link { link: "fabric".into() };
    let downs = [20, 23, 26, 29];
    for seed in [1, 2, 3] {
        let mut s = Scenario::own_cable(seed);
        for &d in &downs {
            s = s.with(Fault::Loss { peer: 0, rate: 0.03 }, d + 1, d + 2);
        }
        let changes = run_with(cfg.clone(), &with_carrier_downs(at_own_cable(s.windows(60)), "fabric", &downs));
        let (opened, closed, v) = single_verdict(&changes, VerdictKind::GrayFailure, &fabric, 20, 40);
        assert_eq!(opened, 20, "seed {seed}: a carrier loss raises at once");
        assert_eq!(closed, 39, "seed {seed}: one event for the whole episode, closed after 10 windows up");
        assert!(has_metric(&v, Metric::CarrierDowns), "seed {seed}: {v:?}");
        // Without the carrier count the resends name the neighbour.
        let blind = run_with(cfg.clone(), &with_carrier_downs(at_own_cable(s.windows(60)), "fabric", &[]));
        assert!(
            blind.iter().any(|(_, c)| matches!(c, VerdictChange::Opened(v) if v.scope == peer_scope(&s, 0))),
            "seed {seed}: the carrier is what keeps the neighbour out: {blind:#?}"
        );
        // On a switch's port (no `local`) the port's flap is named as well, and the peers are
        // judged as before (the flapping host behind the port is the peer, not a bystander).
        let at_switch = run_with(cfg.clone(), &with_carrier_downs(s.windows(60), "fabric", &downs));
        assert!(at_switch.iter().any(|(i, c)| *i == 20 && matches!(c, VerdictChange::Opened(v) if v.scope == fabric)), "seed {seed}");
        let peers = |c: &[(usize, VerdictChange)]| -> Vec<Scope> {
            c.iter().filter(|(_, c)| matches!(c.verdict().scope, Scope::Peer { .. })).map(|(_, c)| c.verdict().scope.clone()).collect()
        };
        assert_eq!(peers(&at_switch), peers(&blind), "seed {seed}");
    }
    // A healthy link whose carrier never drops: nothing.
    let healthy = with_carrier_downs(at_own_cable(Scenario::own_cable(7).windows(60)), "fabric", &[]);
    assert!(run_with(cfg, &healthy).is_empty());
}

#[test]
fn a_queue_that_drops_from_the_start_is_judged_against_its_own_baseline() {
    // A link that is the path's bottleneck by design: its queue drops 2 % from the first window
    // (TCP probing it), which is its normal. Not judged before the baseline is warm, so the
    // first windows raise nothing; later, 2 % stays quiet and 12 % (6x) is congestion.
    let s = Scenario::own_cable(5);
    let mut windows = with_fabric_queue(at_own_cable(s.windows(60)), 0..60, 200);
    assert!(opened_scopes(&windows).is_empty(), "{:?}", opened_scopes(&windows));
    for w in &mut windows[30..40] {
        w.links.iter_mut().find(|l| l.link == "fabric").unwrap().queue = Some(crate::queue_stats::QueueDelta { packets: 8_800, drops: 1_200, ..Default::default() });
    }
    let changes = run_with(DetectorConfig::default(), &windows);
    let (opened, _, v) = single_verdict(&changes, VerdictKind::Congestion, &Scope::Link { link: "fabric".into() }, 30, 44);
    assert_eq!(opened, 30);
    assert!(has_metric(&v, Metric::QueueDropRate), "{v:?}");
    // Dropping 6 % in the very first windows, before any baseline: nothing said.
    let early = with_fabric_queue(at_own_cable(s.windows(60)), 0..4, 600);
    assert!(opened_scopes(&early).is_empty(), "{:?}", opened_scopes(&early));
}

#[test]
fn a_fault_on_a_neighbours_cable_is_still_named_from_the_own_cable() {
    // Only the path to neighbour 0 is capped (its own cable): the other neighbour is as it was,
    // so neighbour 0 is an outlier and is named.
    for seed in [1, 2, 3] {
        let s = Scenario::own_cable(seed).with(Fault::GoodputCut { peer: 0, factor: 0.25 }, 20, 40);
        let changes = run_at_own_cable(&s, 60);
        let (opened, _, v) = single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 0), 22, 44);
        assert!(opened >= 20, "seed {seed}");
        assert!(has_metric(&v, Metric::InBurstGoodputBps), "seed {seed}: {v:?}");
        let s = Scenario::own_cable(seed).with(Fault::Loss { peer: 1, rate: 0.02 }, 20, 40);
        let changes = run_at_own_cable(&s, 60);
        single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 1), 21, 44);
    }
}

#[test]
fn shared_uplink_congestion_names_the_link_and_no_peer() {
    let uplink = Fault::Uplink { link: "leaf2", goodput_factor: 0.45, ce_rate: 0.04, loss_rate: 0.002 };
    for seed in [1, 2, 3] {
        let s = Scenario::two_leaves(seed).with(uplink.clone(), 20, 40);
        let changes = run(&s, 60);
        let scope = Scope::Link { link: "leaf2".into() };
        let (opened, closed, v) = single_verdict(&changes, VerdictKind::Congestion, &scope, 21, 43);
        assert!(opened >= 20 && closed >= 40, "seed {seed}");
        assert_eq!(v.classification, None);
        assert!(has_metric(&v, Metric::CeRate), "{v:?}");
        assert!(has_metric(&v, Metric::InBurstGoodputBps), "{v:?}");
    }
}

#[test]
fn uplink_congestion_without_ecn_is_still_congestion() {
    // Goodput only (e.g. a policer on the uplink): found from several peers degrading together.
    let uplink = Fault::Uplink { link: "leaf1", goodput_factor: 0.5, ce_rate: 0.0, loss_rate: 0.0 };
    let s = Scenario::two_leaves(11).with(uplink, 20, 40);
    let changes = run(&s, 60);
    let scope = Scope::Link { link: "leaf1".into() };
    let (_, _, v) = single_verdict(&changes, VerdictKind::Congestion, &scope, 21, 43);
    let e = v.evidence.iter().find(|e| e.metric == Metric::InBurstGoodputBps).unwrap();
    assert_eq!(e.peers.map(|p| p.of), Some(4));
}

#[test]
fn peers_slowed_on_a_way_in_shared_with_other_traffic_name_nobody() {
    // A leaf's view of an upstream queue: the four peers behind `leaf2` slow down together while
    // other traffic comes in by the same link (the cross traffic that fills another switch's
    // uplink). Their slowdown could be this link's far end or that uplink: nobody is named here
    // (the agent at that uplink sees the competition on its egress). Without the other traffic,
    // or with a little of it, it is this link's congestion, as before.
    let uplink = Fault::Uplink { link: "leaf2", goodput_factor: 0.45, ce_rate: 0.0, loss_rate: 0.0 };
    let s = Scenario::two_leaves(11).with(uplink, 20, 40);
    let scope = Scope::Link { link: "leaf2".into() };
    for (other, named) in [(30_000_000u64, false), (2_000_000, true)] {
        let mut windows = s.windows(60);
        for (i, w) in windows.iter_mut().enumerate() {
            let during = (20..40).contains(&i);
            w.links.push(LinkWindow {
                link: "leaf2".into(),
                direction: "ingress".into(),
                flows: if during { 8 } else { 4 },
                job_bytes: 40_000_000,
                other_bytes: if during { other } else { 0 },
                ..Default::default()
            });
        }
        let changes = run_with(DetectorConfig::default(), &windows);
        if named {
            single_verdict(&changes, VerdictKind::Congestion, &scope, 21, 43);
        } else {
            assert!(changes.is_empty(), "other traffic {other} B per window: {changes:#?}");
        }
    }
    // The link's own evidence still names it: the same with competition on its egress.
    let mut windows = s.windows(60);
    for (i, w) in windows.iter_mut().enumerate() {
        let during = (20..40).contains(&i);
        w.links.push(LinkWindow { link: "leaf2".into(), direction: "ingress".into(), flows: 8, job_bytes: 40_000_000, other_bytes: if during { 30_000_000 } else { 0 }, ..Default::default() });
        w.links.push(competing_egress("leaf2", during, 300_000_000));
    }
    let changes = run_with(DetectorConfig::default(), &windows);
    let (_, _, v) = single_verdict(&changes, VerdictKind::Congestion, &scope, 21, 44);
    assert!(has_metric(&v, Metric::OtherTrafficBps), "{v:?}");
}

#[test]
fn compute_straggler_is_a_straggler_and_never_a_network_fault() {
    for seed in [1, 2, 3, 4] {
        let s = Scenario::two_leaves(seed).with(Fault::Straggler { peer: 5, delay_ns: 50 * MS }, 20, 40);
        let changes = run(&s, 60);
        assert!(
            changes.iter().all(|(_, c)| !c.verdict().kind.is_network_fault()),
            "seed {seed}: {changes:#?}"
        );
        // 4 of 5 windows: raised by window 23 (the fault starts at 20).
        let (opened, closed, v) = single_verdict(&changes, VerdictKind::Straggler, &peer_scope(&s, 5), 23, 43);
        assert!(opened >= 20 && closed >= 40, "seed {seed}");
        // The evidence is how long the job waited in silence for the late start: the 50 ms delay
        // less the 8 ms the others send before they stall behind it.
        let late = &v.evidence[0];
        assert_eq!(late.metric, Metric::PhaseStartLatenessNs);
        assert!((34e6..=46e6).contains(&late.value), "seed {seed}: {late:?}");
        assert_eq!(v.severity, Severity::Info);
    }
}

#[test]
fn flap_is_a_transient_gray_failure() {
    for seed in [1, 2, 3] {
        let flap = Fault::Flap { peer: 1, at_ns: 30 * S + 100 * MS, duration_ns: 300 * MS };
        let s = Scenario::two_leaves(seed).with(flap, 30, 31);
        let changes = run(&s, 50);
        let (opened, closed, v) = single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 1), 31, 35);
        assert_eq!(opened, 30, "seed {seed}");
        assert!(closed <= 34, "seed {seed}");
        assert_eq!(v.classification, Some(Classification::Transient), "seed {seed}");
        assert!(has_metric(&v, Metric::SilenceNs), "seed {seed}: {v:?}");
    }
}

#[test]
fn worker_pause_without_loss_is_not_a_network_fault() {
    // The flap's silence without its retransmissions: the worker stopped, not the network.
    for seed in [1, 2, 3] {
        let pause = Fault::Pause { peer: 1, at_ns: 30 * S + 100 * MS, duration_ns: 300 * MS };
        let s = Scenario::two_leaves(seed).with(pause, 30, 31);
        let changes = run(&s, 50);
        assert!(changes.is_empty(), "seed {seed}: {changes:#?}");
    }
}

#[test]
fn recurring_loss_is_intermittent() {
    let mut s = Scenario::two_leaves(8);
    for start in [20, 24, 28, 32] {
        s = s.with(Fault::Loss { peer: 4, rate: 0.02 }, start, start + 2);
    }
    let changes = run(&s, 50);
    let (_, _, v) = single_verdict(&changes, VerdictKind::GrayFailure, &peer_scope(&s, 4), 21, 37);
    assert_eq!(v.classification, Some(Classification::Intermittent));
    let classes: Vec<_> = changes.iter().map(|(_, c)| c.verdict().classification.unwrap()).collect();
    assert_eq!(classes[0], Classification::Transient, "unknown at first");
}

#[test]
fn a_vanished_peer_is_forgotten_and_its_verdict_expires() {
    let s = Scenario::two_leaves(9).with(Fault::Loss { peer: 0, rate: 0.02 }, 5, 100);
    let mut windows = s.windows(80);
    let gone = s.peer(0);
    for w in windows.iter_mut().skip(10) {
        w.peers.retain(|p| p.peer != gone);
    }
    let mut set = DetectorSet::new(DetectorConfig::default());
    let mut changes = Vec::new();
    for (i, w) in windows.iter().enumerate() {
        changes.extend(set.observe(w).unwrap().into_iter().map(|c| (i, c)));
    }
    assert_eq!(changes.len(), 3, "{changes:#?}"); // opened, updated (persistent), closed
    let (at, VerdictChange::Closed(v)) = changes.last().unwrap() else { panic!() };
    assert_eq!(v.end_reason, Some(EndReason::Expired));
    assert_eq!(v.ended_ns, Some(10 * S));
    assert_eq!(*at, 40, "window 40 ends at 41 s, more than 30 s after 10 s");
    assert!(!set.jobs["job-1"].peers.contains_key(&gone));
    assert_eq!(set.jobs["job-1"].peers.len(), 7);
}

#[test]
fn a_finished_job_is_forgotten() {
    let ws = Scenario::two_leaves(1).windows(3);
    let mut set = DetectorSet::new(DetectorConfig::default());
    set.observe(&ws[0]).unwrap();
    assert_eq!(set.jobs.len(), 1);
    assert!(set.expire(100 * S).is_empty());
    assert!(set.jobs.is_empty());
}

#[test]
fn peers_beyond_the_cap_are_ignored_and_counted() {
    let cfg = DetectorConfig { max_peers_per_job: 5, ..Default::default() };
    let ws = Scenario::two_leaves(1).windows(2);
    let mut set = DetectorSet::new(cfg);
    for w in &ws {
        set.observe(w).unwrap();
    }
    assert_eq!(set.jobs["job-1"].peers.len(), 5);
    assert_eq!(set.ignored_peers_total(), 6);
}

#[test]
fn same_input_same_verdicts() {
    let s = Scenario::two_leaves(3)
        .with(Fault::Loss { peer: 1, rate: 0.02 }, 10, 20)
        .with(Fault::Straggler { peer: 6, delay_ns: 50 * MS }, 15, 25);
    let a = run(&s, 40);
    assert_eq!(a, run(&s, 40));
    // Both faults found, each on its own peer, and nothing else.
    let opened: Vec<(VerdictKind, IpAddr)> = a
        .iter()
        .filter_map(|(_, c)| match c {
            VerdictChange::Opened(Verdict { kind, scope: Scope::Peer { peer, .. }, .. }) => Some((*kind, *peer)),
            _ => None,
        })
        .collect();
    assert_eq!(opened, vec![(VerdictKind::GrayFailure, s.peer(1)), (VerdictKind::Straggler, s.peer(6))]);
    assert_eq!(a.iter().filter(|(_, c)| matches!(c, VerdictChange::Opened(_))).count(), 2);
}

#[test]
fn open_verdicts_carry_current_evidence() {
    let s = Scenario::two_leaves(4).with(Fault::Loss { peer: 3, rate: 0.02 }, 0, 10);
    let mut set = DetectorSet::new(DetectorConfig::default());
    for w in s.windows(5) {
        set.observe(&w).unwrap();
    }
    let open: Vec<&Verdict> = set.open_verdicts().collect();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].scope, peer_scope(&s, 3));
    // 2 % loss is severe: raised in the first window, so all 5 are observed.
    assert_eq!(open[0].observed_windows, 5);
    assert_eq!(open[0].evidence[0].windows, WindowCount { anomalous: 5, of: 5 });
}

#[test]
fn verdict_change_serializes_for_the_events_api() {
    let s = Scenario::two_leaves(1).with(Fault::Loss { peer: 2, rate: 0.05 }, 0, 10);
    let changes = run(&s, 1);
    let json = serde_json::to_value(&changes[0].1).unwrap();
    assert_eq!(json["change"], "opened");
    let v = &json["verdict"];
    assert_eq!(v["kind"], "gray_failure");
    assert_eq!(v["scope"], serde_json::json!({"type": "peer", "peer": "10.0.1.3", "link": "leaf1"}));
    assert_eq!(v["classification"], "transient");
    assert_eq!(v["severity"], "critical");
    assert_eq!(v["evidence"][0]["reference_kind"], "peer_median");
    assert!(v["ended_ns"].is_null());
}

#[test]
fn invalid_windows_are_rejected() {
    let ws = Scenario::two_leaves(1).windows(3);
    let mut set = DetectorSet::new(DetectorConfig::default());
    set.observe(&ws[1]).unwrap();
    assert!(matches!(set.observe(&ws[0]), Err(DetectError::OutOfOrder { .. })));
    let mut dup = ws[2].clone();
    dup.peers.push(dup.peers[0].clone());
    assert!(matches!(set.observe(&dup), Err(DetectError::DuplicatePeer { .. })));
    let mut short = ws[2].clone();
    short.window_end_ns = short.window_start_ns + 100 * MS;
    assert!(matches!(set.observe(&short), Err(DetectError::WindowLength { .. })));
    let mut empty = ws[2].clone();
    empty.window_end_ns = empty.window_start_ns;
    assert!(matches!(set.observe(&empty), Err(DetectError::EmptyWindow { .. })));
    let cfg = DetectorConfig { max_jobs: 1, ..Default::default() };
    let mut set = DetectorSet::new(cfg);
    set.observe(&ws[0]).unwrap();
    let mut other = ws[1].clone();
    other.job = "job-2".into();
    assert_eq!(set.observe(&other), Err(DetectError::TooManyJobs { max: 1 }));
}

#[test]
fn healthy_spikes_are_seen_but_filtered() {
    // With k = n = 1 and no severe shortcut, every isolated spike of the healthy series raises:
    // proof that the zero-verdict test above is filtering real single-window anomalies, not
    // looking at a series too clean to trip anything.
    let mut cfg = DetectorConfig::default();
    cfg.persistence.raise_k = 1;
    cfg.persistence.raise_n = 1;
    cfg.straggler.raise_k = 1;
    cfg.straggler.raise_n = 1;
    let mut kinds = std::collections::BTreeSet::new();
    for seed in SEEDS {
        let s = Scenario::two_leaves(seed);
        let opened: Vec<(usize, VerdictKind)> = run_with(cfg.clone(), &s.windows(600))
            .into_iter()
            .filter(|(_, c)| matches!(c, VerdictChange::Opened(_)))
            .map(|(i, c)| (i, c.verdict().kind))
            .collect();
        assert!(opened.len() >= 600 / SPIKE_EVERY / 2, "seed {seed}: only {opened:?}");
        assert!(opened.iter().all(|(i, _)| i % SPIKE_EVERY == SPIKE_EVERY / 2), "seed {seed}: {opened:?}");
        kinds.extend(opened.iter().map(|(_, k)| *k));
    }
    assert_eq!(kinds.len(), 3, "spikes trip every detector: {kinds:?}");
}

#[test]
fn ring_compute_straggler_is_a_straggler_and_never_a_network_fault() {
    // The other ranks' steps split in two (first chunks on time, the rest behind the straggler):
    // the straggler is found from its late *first* send of each step.
    for seed in [1, 2, 3, 4] {
        let job = RingJob { straggler: Some((3, 60 * MS, 10, 30)), ..RingJob::testbed(seed) };
        let changes = run_with(DetectorConfig::default(), &job.windows(45));
        assert!(changes.iter().all(|(_, c)| !c.verdict().kind.is_network_fault()), "seed {seed}: {changes:#?}");
        let scope = Scope::Peer { peer: job.peer(3), link: RingJob::link(3) };
        let (opened, closed, v) = single_verdict(&changes, VerdictKind::Straggler, &scope, 14, 33);
        assert!(opened >= 10 && closed >= 30, "seed {seed}: {opened}..{closed}");
        // The job's silence before the straggler's send: 60 ms less what the ring moved without it.
        let late = &v.evidence[0];
        assert_eq!(late.metric, Metric::PhaseStartLatenessNs);
        assert!((30e6..=60e6).contains(&late.value), "seed {seed}: {late:?}");
    }
}

#[test]
fn healthy_ring_never_alarms() {
    for seed in SEEDS {
        let changes = run_with(DetectorConfig::default(), &RingJob::testbed(seed).windows(300));
        assert!(changes.is_empty(), "seed {seed}: {changes:#?}");
    }
}

#[test]
fn ring_straggler_is_invisible_to_phase_matching_alone() {
    // Why step-start lateness exists: without it (no gap is compute-like), the same series raises
    // nothing, because the straggler's one late phase lines up with the others' second phases.
    let mut cfg = DetectorConfig::default();
    cfg.straggler.min_idle_gap_ns = 10 * S;
    let job = RingJob { straggler: Some((3, 60 * MS, 5, 30)), ..RingJob::testbed(1) };
    let changes = run_with(cfg, &job.windows(30));
    assert!(changes.is_empty(), "{changes:#?}");
}

/// A reduce-then-broadcast job (OpenMPI's `nonoverlapping`, a DDP bucket waiting for its
/// inputs): at every step the five workers send to the root at once, and the root sends only
/// once their data is in. The root is late at every step by its role, never by its compute.
fn root_job(seed: u64, straggler: Option<(usize, u64)>, n: usize) -> Vec<JobWindow> {
    let mut rng = super::sim::Rng::new(seed);
    let peer = |r: usize| -> IpAddr { format!("10.77.0.{}", r + 1).parse().unwrap() };
    let mut bursts: Vec<Vec<Vec<BurstSummary>>> = vec![vec![Vec::new(); 6]; n];
    let step = 200 * MS;
    for k in 0..(n as u64 * S / step) {
        let t0 = k * step;
        let mut inputs_done = 0;
        for r in 1..6 {
            let mut start = t0 + 50 * MS + rng.range(0, 4 * MS);
            if let Some((sr, extra)) = straggler {
                if sr == r {
                    start += extra;
                }
            }
            let end = start + 20 * MS + rng.range(0, 2 * MS);
            inputs_done = inputs_done.max(end);
            if let Some(w) = bursts.get_mut((end / S) as usize) {
                w[r].push(BurstSummary { start_ns: start, end_ns: end, bytes: 2_000_000, to: None });
            }
        }
        let start = inputs_done + MS + rng.range(0, MS);
        let end = start + 60 * MS;
        if let Some(w) = bursts.get_mut((end / S) as usize) {
            w[0].push(BurstSummary { start_ns: start, end_ns: end, bytes: 6_000_000, to: None });
        }
    }
    bursts
        .into_iter()
        .enumerate()
        .map(|(w, per)| JobWindow {
            job: "root".into(),
            window_start_ns: w as u64 * S,
            window_end_ns: (w as u64 + 1) * S,
            peers: per
                .into_iter()
                .enumerate()
                .map(|(r, b)| super::sim::peer_of_bursts(peer(r), format!("p{r}"), b, 0))
                .collect(),
            links: Vec::new(),
            conns: Vec::new(),
            local: None,
        })
        .collect()
}

#[test]
fn a_peer_late_by_its_role_is_not_a_straggler() {
    // Without the job-silence cap, the root's sends start ~25 ms after everyone else's at every
    // step: a straggler by the old rule, on a perfectly healthy job.
    for seed in SEEDS {
        let changes = run_with(DetectorConfig::default(), &root_job(seed, None, 60));
        assert!(changes.is_empty(), "seed {seed}: {changes:#?}");
    }
}

#[test]
fn a_compute_straggler_is_found_whatever_the_algorithm() {
    // Worker 3 computes 60 ms longer: the others' inputs are in, the job waits in silence, and
    // worker 3's send ends that silence. The root, late again by its role, is not named.
    for seed in [1, 2, 3] {
        let changes = run_with(DetectorConfig::default(), &root_job(seed, Some((3, 60 * MS)), 30));
        let scope = Scope::Peer { peer: "10.77.0.4".parse().unwrap(), link: "p3".into() };
        assert!(changes.iter().all(|(_, c)| c.verdict().kind == VerdictKind::Straggler && c.verdict().scope == scope), "seed {seed}: {changes:#?}");
        let (opened, c) = changes.iter().find(|(_, c)| matches!(c, VerdictChange::Opened(_))).expect("a straggler verdict");
        assert!(*opened <= 3, "seed {seed}: opened in window {opened}");
        let late = &c.verdict().evidence[0];
        assert!((25e6..=60e6).contains(&late.value), "seed {seed}: {late:?}");
    }
}

/// A tool, not a check: replays the windows an agent recorded (run it with
/// `RUST_LOG=info,ringside::detect::input=debug`: one JSON `JobWindow` per log line) through the
/// detectors and prints, per window, each peer's straggler lateness and every verdict change.
/// `RINGSIDE_REPLAY=agent.log cargo test -p dataplane-user --lib replay_recorded_windows -- --ignored --nocapture`
/// (`RINGSIDE_REPLAY_GRAY_MIN_PEERS=2` for an IPU agent's log; `RINGSIDE_REPLAY_MILD_RAISE=2/3`
/// replays with another `[detect.persistence] mild_raise_k/mild_raise_n`, 2/3 being the rule
/// before mild evidence had its own).
#[test]
#[ignore = "a tool: set RINGSIDE_REPLAY to an agent log with recorded windows"]
fn replay_recorded_windows() {
    let path = std::env::var("RINGSIDE_REPLAY").expect("RINGSIDE_REPLAY=<agent log recorded with ringside::detect::input=debug>");
    let text = std::fs::read_to_string(&path).expect("reading the log");
    let windows: Vec<JobWindow> =
        text.lines().filter_map(|l| l.find("{\"job\"").and_then(|i| serde_json::from_str(&l[i..]).ok())).collect();
    assert!(!windows.is_empty(), "no recorded window in {path}");
    let mut cfg = DetectorConfig::default();
    if let Ok(v) = std::env::var("RINGSIDE_REPLAY_CO_START_NS") {
        cfg.straggler.co_start_ns = v.parse().expect("a number of ns");
    }
    // An IPU's agent runs with `[detect.gray] min_peers = 2` (the operator guide's IPU setting).
    if let Ok(v) = std::env::var("RINGSIDE_REPLAY_GRAY_MIN_PEERS") {
        cfg.gray.min_peers = v.parse().expect("a number of peers");
    }
    if let Ok(v) = std::env::var("RINGSIDE_REPLAY_MILD_RAISE") {
        let (k, n) = v.split_once('/').expect("K/N");
        (cfg.persistence.mild_raise_k, cfg.persistence.mild_raise_n) = (k.parse().expect("K"), n.parse().expect("N"));
    }
    let mut set = DetectorSet::new(cfg);
    let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.0}", v / 1e6));
    for (i, w) in windows.iter().enumerate() {
        let changes = set.observe(w).expect("valid window");
        let late: Vec<String> = set.last_lateness(&w.job).iter().map(|(p, a, b)| format!("{p}:{}/{}", ms(*a), ms(*b))).collect();
        println!("w{i} {} late ms (phase/step): {}", w.job, late.join(" "));
        if std::env::var_os("RINGSIDE_REPLAY_GRAY").is_some() {
            for g in set.last_gray(&w.job) {
                println!("    gray {g}");
            }
        }
        for c in changes {
            let v = c.verdict();
            let what = match c {
                VerdictChange::Opened(_) => "opened",
                VerdictChange::Updated(_) => "updated",
                VerdictChange::Closed(_) => "closed",
            };
            println!("    {what} {:?} {:?} {:?} {:?}", v.kind, v.scope, v.severity, v.evidence.first().map(|e| (e.metric, e.value)));
        }
    }
}
