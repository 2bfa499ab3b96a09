//! The provider's fleet view: one verdict list from the agents of many single-host vantages (an
//! agent on each host's IPU/DPU, or on each host NIC), each of which sees only its own host's
//! traffic.
//!
//! One such agent cannot tell a fault on its own host's cable from a fault on a peer's: both slow
//! the one connection between them. When its own cable is rate-capped, an IPU may blame the peer
//! it compares worst (docs/eval-detection.md "IPU vantage": every wrong event of that column was
//! the faulted host's own IPU naming a healthy ring neighbour), while that neighbour's IPU names
//! the faulted host. The fleet breaks the tie with the other agents.
//!
//! Every network-fault event (congestion, gray failure) is a *blame*: a peer-scoped one names its
//! peer, a link-scoped one the agent's own host (the agent watches that host's path only). A
//! blame *claims* the fault's time, from its `started_unix_ms` to its `ended_unix_ms` (the
//! detectors' estimate: the first and last anomalous windows; open while the event is), widened
//! by [`Rules::overlap_slack_ms`] on each side; two blames *agree in time* when their claims
//! overlap. The fleet decides as it would live, knowing at each instant only the blames raised by
//! then (an end is known once it has passed). A blame of host `h` by agent `a` is repeated once:
//! - no blame of `a`'s host by `h`'s own agent that agrees in time contests it, unless `h` is
//!   named by more agents than `a`'s host in that time (a ring's faulted host named by both its
//!   neighbours beats its own IPU's blame of one of them; two hosts blaming only each other are
//!   a tie, and neither is named: the fleet stays silent when unsure), and
//! - it is corroborated (a second agent names `h` in that time, or `h`'s own agent flags its own
//!   link), or it is `h`'s own agent's verdict on its own link, or it has stood alone for
//!   [`Rules::lone_blame_hold_ms`] since it was raised (the blame back usually comes within a
//!   second).
//!
//! A blame on in-burst goodput alone ([`Event::goodput_only`]: no loss, stall, ECN, CNP or queue
//! drops in any of its windows) is evidence a busy host fakes as well as a slow path: a host
//! whose CPU is starved looks, from its own agent, like every peer slower (congestion on its own
//! link) and, from a neighbour's, like a slow peer. Unless a blame of the same host with other
//! evidence agrees in time, it is repeated only once two agents besides the host's own name that
//! host, never after the hold (recorded before the rule, in the IPU runs of sessions 36-37: 12 of
//! the fleet's 13 wrong verdicts were goodput-only, named by at most one agent besides the host's
//! own; 1 of its 52 right ones was, named by two).
//!
//! Nor is a goodput-only blame repeated while another host's own agent flags that host's own link
//! with other evidence in agreeing time (its carrier lost, its queue dropping or throttling, its
//! loss): a host whose link fails holds up every host that waits for its data, and those then
//! send slower too. Recorded before the rule (`target/eval-s39-flap`, PyTorch at the IPU vantage):
//! while 10.77.0.4's cable flapped, its IPU named its own link on the carrier at once, and IPUs 0,
//! 1 and 2 named 10.77.0.5, the next host of the job, slow on goodput alone 3-4 s later, in both
//! runs on that host; three agents, so the rule above repeated it.
//!
//! Blames of one host that agree in time are one [`FleetVerdict`], raised when the fleet first
//! repeated one of them. Blames never repeated are listed as [`Withheld`], with the reason, so an
//! operator sees what each agent said and why the fleet did not repeat it.
//!
//! A straggler event (a peer's worker starts its phases late: compute, not network) names a host
//! too, and a slow worker is late to every peer it sends to, so every such peer's agent sees it.
//! One agent alone naming it is one connection's schedule (OpenMPI's rank 0, seen late by one
//! IPU only, ten times in a ten-minute healthy run; none of its other peers' IPUs saw it), so the
//! fleet repeats a straggler only once a second agent names the same host a straggler in that
//! time (no hold: a lone straggler is never repeated). Straggler verdicts are their own
//! [`FleetVerdict`]s (kind `straggler`), never merged with a network verdict of the same host.
use std::{collections::BTreeSet, net::IpAddr};

use serde::{Deserialize, Serialize};

use crate::operator::{Event, Scope, VerdictKind};

/// One agent's events and the host it watches.
#[derive(Debug, Clone)]
pub struct AgentEvents {
    /// How the agent is called in the output (its host's address, or a name).
    pub agent: String,
    /// The host whose traffic the agent sees: its link-scoped verdicts are about this host.
    pub host: IpAddr,
    /// Its `/v1/events` (open and closed).
    pub events: Vec<Event>,
}

/// One event of one agent, as the fleet cites it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Witness {
    pub agent: String,
    pub event_id: u64,
    pub kind: VerdictKind,
}

/// A host the fleet names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetVerdict {
    pub host: IpAddr,
    /// When the fleet first repeated a blame of it, Unix ms: the fleet's detection time.
    pub raised_unix_ms: u64,
    /// The fault's estimated start and end (the earliest start and the latest end of the blames
    /// behind it); `None`: one of them is still open.
    pub started_unix_ms: u64,
    pub ended_unix_ms: Option<u64>,
    /// The kinds of the blames behind it (congestion, gray failure).
    pub kinds: Vec<VerdictKind>,
    /// Every agent event that named it in this time, repeated or not.
    pub witnesses: Vec<Witness>,
}

impl FleetVerdict {
    /// The agents behind it, each once, in the order of its witnesses.
    pub fn agents(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for w in &self.witnesses {
            if !out.contains(&w.agent.as_str()) {
                out.push(&w.agent);
            }
        }
        out
    }
}

/// A blame the fleet did not repeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Withheld {
    /// The host the agent named.
    pub host: IpAddr,
    pub witness: Witness,
    /// Whether another agent's blame contested it (else it stood alone for less than the hold,
    /// or the hold has not passed yet).
    pub contested: bool,
    pub reason: String,
}

/// What [`judge`] returns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetView {
    /// By the time the fleet raised them.
    pub verdicts: Vec<FleetVerdict>,
    pub withheld: Vec<Withheld>,
}

/// How the fleet weighs its agents' blames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    /// A blame no other agent corroborates is repeated only after it has stood this long since
    /// it was raised without being contested (ms). The faulted host's own IPU often blames a
    /// neighbour a few hundred ms before that neighbour's IPU blames it back; without the wait
    /// the fleet would repeat the wrong blame.
    pub lone_blame_hold_ms: u64,
    /// How far apart two blames' estimated fault times may be and still agree (ms, on each
    /// side): the detectors estimate a fault's start and end to a detection window (1 s by
    /// default), and two agents' windows are not aligned.
    pub overlap_slack_ms: u64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules { lone_blame_hold_ms: 2_000, overlap_slack_ms: 1_000 }
    }
}

/// One network event as a blame.
struct Blame<'a> {
    agent: usize,
    host: IpAddr,
    raised: u64,
    /// The estimated fault start (never after the raise).
    start: u64,
    /// The claim, slack included: `[from, to)`; `to` is `u64::MAX` while the event is open.
    from: u64,
    to: u64,
    /// The agent's own host, on a link-scoped event.
    own_link: bool,
    /// A straggler event (judged only with other straggler events).
    straggler: bool,
    /// A network blame on in-burst goodput alone ([`Event::goodput_only`]).
    weak: bool,
    event: &'a Event,
}

impl Blame<'_> {
    /// The claim's end as known at `t`: an end not passed yet is not known (the event may still
    /// have been open then).
    fn to_at(&self, t: u64) -> u64 {
        if self.to <= t {
            self.to
        } else {
            u64::MAX
        }
    }

    /// Whether the two claims overlap, as known at `t`.
    fn agrees(&self, other: &Blame<'_>, t: u64) -> bool {
        self.from < other.to_at(t) && other.from < self.to_at(t)
    }
}

fn blames<'a>(agents: &'a [AgentEvents], rules: &Rules) -> Vec<Blame<'a>> {
    let mut out = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        for e in &a.events {
            let straggler = e.kind == VerdictKind::Straggler;
            let (host, own_link) = match &e.scope {
                Scope::Peer { peer, .. } => (*peer, *peer == a.host),
                Scope::Link { .. } if !straggler => (a.host, true),
                Scope::Link { .. } | Scope::Job | Scope::RdmaPort { .. } => continue,
            };
            let start = e.started_unix_ms.min(e.raised_unix_ms);
            let to = e.ended_unix_ms.map_or(u64::MAX, |end| end.max(start).saturating_add(rules.overlap_slack_ms + 1));
            out.push(Blame { agent: i, host, raised: e.raised_unix_ms, start, from: start.saturating_sub(rules.overlap_slack_ms), to, own_link, straggler, weak: !straggler && e.goodput_only(), event: e });
        }
    }
    out.sort_by_key(|b| b.raised);
    out
}

/// The fleet's answer on blame `b` at `t` (every blame in `all` raised by then is known).
enum Answer {
    Repeat,
    Contested(String),
    Alone,
    /// A straggler no second agent names (never repeated by waiting).
    LoneStraggler,
    /// A goodput-only blame that fewer than two agents besides the host's own back, and no blame
    /// with other evidence (never repeated by waiting); how many do.
    WeakAlone(usize),
    /// A goodput-only blame in the time of another host's own agent flagging its own link with
    /// other evidence (never repeated by waiting): that host's event.
    WeakEcho(u64, IpAddr),
}

/// `near`: the blames naming `b`'s host or its accuser, and for a goodput-only blame every host's
/// own-link blame (the only ones the answer reads).
fn answer(agents: &[AgentEvents], near: &[&Blame<'_>], b: &Blame<'_>, t: u64, rules: &Rules) -> Answer {
    let known = || near.iter().copied().filter(move |c| c.raised <= t);
    // Distinct agents naming `host` in the time of `reference`.
    let namers = |host: IpAddr, reference: &Blame<'_>| -> BTreeSet<usize> { known().filter(|c| c.host == host && c.agrees(reference, t)).map(|c| c.agent).collect() };
    let accuser = agents[b.agent].host;
    let mine = namers(b.host, b);
    if b.straggler {
        return if mine.len() >= 2 { Answer::Repeat } else { Answer::LoneStraggler };
    }
    if b.weak && !known().any(|c| c.host == b.host && !c.weak && c.agrees(b, t)) {
        // A host whose own link is down or slow (its agent says so first-hand: carrier, queue,
        // loss) holds up every host that waits for its data, and they in turn send slower: goodput
        // alone cannot tell that echo from a second fault.
        if let Some(c) = known().find(|c| c.own_link && !c.weak && c.host != b.host && c.agrees(b, t)) {
            return Answer::WeakEcho(c.event.id, c.host);
        }
        // Goodput alone is what a busy host looks like from its own agent (every peer slower)
        // and from a neighbour's (that host slower): two agents besides its own must see it.
        let others = mine.iter().filter(|&&a| agents[a].host != b.host).count();
        if others < 2 {
            return Answer::WeakAlone(others);
        }
    }
    if !b.own_link {
        for c in known().filter(|c| agents[c.agent].host == b.host && c.host == accuser && !c.own_link && c.agrees(b, t)) {
            let theirs = namers(accuser, c);
            if theirs.len() >= mine.len() {
                return Answer::Contested(format!(
                    "contested: the agent of {} named {accuser} back (event {}), and {accuser} was named by {} agents in that time against {} for {}",
                    b.host,
                    c.event.id,
                    theirs.len(),
                    mine.len(),
                    b.host
                ));
            }
        }
    }
    if b.own_link || mine.len() >= 2 || t >= b.raised.saturating_add(rules.lone_blame_hold_ms) {
        Answer::Repeat
    } else {
        Answer::Alone
    }
}

/// The fleet's verdicts over `agents`' events (see the module's documentation), as known at
/// `now_unix_ms`: a blame raised less than the hold before it and still alone is not repeated yet.
pub fn judge(agents: &[AgentEvents], now_unix_ms: u64, rules: &Rules) -> FleetView {
    let all = blames(agents, rules);
    // When each blame was first repeated, and the last answer otherwise.
    let mut repeated: Vec<Option<u64>> = vec![None; all.len()];
    let mut last: Vec<Option<Answer>> = (0..all.len()).map(|_| None).collect();
    for (i, b) in all.iter().enumerate() {
        let accuser = agents[b.agent].host;
        // A straggler is judged on the other stragglers of its host; a network blame on the
        // network blames of its host and its accuser, and a goodput-only one also on every
        // host's own-link blames.
        let near: Vec<&Blame<'_>> = all
            .iter()
            .filter(|c| {
                c.straggler == b.straggler && (c.host == b.host || !b.straggler && (c.host == accuser || b.weak && c.own_link))
            })
            .collect();
        // The instants at which the answer on `b` can change: its raise, the end of its hold,
        // and the raises and (known) ends of the blames it reads.
        let mut at: Vec<u64> = vec![b.raised, b.raised.saturating_add(rules.lone_blame_hold_ms)];
        for c in &near {
            at.push(c.raised);
            if c.to != u64::MAX {
                at.push(c.to);
            }
        }
        at.retain(|&t| t >= b.raised && t <= now_unix_ms);
        at.sort_unstable();
        at.dedup();
        for t in at {
            match answer(agents, &near, b, t, rules) {
                Answer::Repeat => {
                    repeated[i] = Some(t);
                    break;
                }
                a => last[i] = Some(a),
            }
        }
    }
    // One verdict per host and run of agreeing blames, built from the repeated ones.
    let mut order: Vec<usize> = (0..all.len()).filter(|&i| repeated[i].is_some()).collect();
    order.sort_by_key(|&i| repeated[i]);
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in order {
        let same = |g: &Vec<usize>| all[g[0]].host == all[i].host && all[g[0]].straggler == all[i].straggler;
        match groups.iter_mut().find(|g| same(g) && g.iter().any(|&j| all[j].agrees(&all[i], u64::MAX))) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    let witness = |b: &Blame<'_>| Witness { agent: agents[b.agent].agent.clone(), event_id: b.event.id, kind: b.event.kind };
    let verdicts = groups
        .iter()
        .map(|g| {
            // Every blame of the host that agrees with the group's, repeated or not.
            let first = &all[g[0]];
            let members: Vec<&Blame<'_>> =
                all.iter().filter(|c| c.host == first.host && c.straggler == first.straggler && g.iter().any(|&j| all[j].agrees(c, u64::MAX))).collect();
            let mut kinds = Vec::new();
            for c in &members {
                if !kinds.contains(&c.event.kind) {
                    kinds.push(c.event.kind);
                }
            }
            FleetVerdict {
                host: all[g[0]].host,
                raised_unix_ms: repeated[g[0]].expect("repeated"),
                started_unix_ms: members.iter().map(|c| c.start).min().unwrap_or_default(),
                ended_unix_ms: members.iter().map(|c| c.event.ended_unix_ms).try_fold(0, |m, e| e.map(|e| m.max(e))),
                kinds,
                witnesses: members.iter().map(|c| witness(c)).collect(),
            }
        })
        .collect();
    let withheld = all
        .iter()
        .enumerate()
        .filter(|&(i, _)| repeated[i].is_none())
        .map(|(i, b)| {
            let (contested, reason) = match &last[i] {
                Some(Answer::Contested(why)) => (true, why.clone()),
                Some(Answer::WeakAlone(n)) => (
                    false,
                    format!(
                        "goodput only (what a busy host looks like as well as a slow path), and {n} agent(s) besides {}'s own named it in that time: the fleet needs two, or a blame with other evidence (loss, stall, ECN, queue drops)",
                        b.host
                    ),
                ),
                Some(Answer::WeakEcho(id, source)) => (
                    false,
                    format!(
                        "goodput only, in the time of {source}'s own agent flagging its own link with other evidence (event {id}): a host whose link fails holds up every host waiting for its data, so goodput alone cannot tell that echo from a fault of {}",
                        b.host
                    ),
                ),
                Some(Answer::LoneStraggler) => (
                    false,
                    format!(
                        "a straggler seen by this agent only: a slow worker is late to every peer it sends to, and no other agent named {} a straggler in that time",
                        b.host
                    ),
                ),
                // Never contested and not repeated: its hold has not passed yet.
                _ => (false, format!("alone so far: raised {} ms ago, the hold is {} ms", now_unix_ms.saturating_sub(b.raised), rules.lone_blame_hold_ms)),
            };
            Withheld { host: b.host, witness: witness(b), contested, reason }
        })
        .collect();
    FleetView { verdicts, withheld }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::{EventState, Metric, Severity};

    fn ev(id: u64, kind: VerdictKind, scope: Scope, raised: u64, ended: Option<u64>) -> Event {
        Event {
            id,
            job: "j".into(),
            kind,
            scope,
            severity: Severity::Critical,
            classification: None,
            state: if ended.is_some() { EventState::Closed } else { EventState::Open },
            carried_over: false,
            confirmed: false,
            started_unix_ms: raised,
            raised_unix_ms: raised,
            ended_unix_ms: ended,
            end_reason: None,
            observed_windows: 1,
            anomalous_windows: 1,
            evidence: Vec::new(),
            signals: Vec::new(),
        }
    }

    /// `e` raised and kept on these signals only.
    fn on(mut e: Event, signals: &[Metric]) -> Event {
        e.signals = signals.to_vec();
        e
    }

    fn host(i: u8) -> IpAddr {
        IpAddr::from([10, 77, 0, i])
    }

    fn gray(id: u64, peer: u8, raised: u64, ended: Option<u64>) -> Event {
        ev(id, VerdictKind::GrayFailure, Scope::Peer { peer: host(peer), link: "fabric".into() }, raised, ended)
    }

    /// Six IPU agents, `ipu{i}` watching host i (1..=6), with the given events.
    fn fleet(events: &[(u8, Event)]) -> Vec<AgentEvents> {
        (1..=6u8)
            .map(|i| AgentEvents { agent: format!("ipu{i}"), host: host(i), events: events.iter().filter(|(a, _)| *a == i).map(|(_, e)| e.clone()).collect() })
            .collect()
    }

    fn judge(agents: &[AgentEvents], now: u64) -> FleetView {
        super::judge(agents, now, &Rules::default())
    }

    fn spans(v: &FleetView) -> Vec<(IpAddr, u64, u64, Option<u64>)> {
        v.verdicts.iter().map(|v| (v.host, v.raised_unix_ms, v.started_unix_ms, v.ended_unix_ms)).collect()
    }

    fn held(v: &FleetView) -> Vec<(&str, IpAddr, bool)> {
        v.withheld.iter().map(|w| (w.witness.agent.as_str(), w.host, w.contested)).collect()
    }

    #[test]
    fn a_lone_uncontested_blame_is_repeated_once_it_has_stood_the_hold() {
        let events = [(2, gray(1, 3, 1_000, Some(5_000)))];
        assert_eq!(spans(&judge(&fleet(&events), 10_000)), vec![(host(3), 3_000, 1_000, Some(5_000))]);
        // Asked before the hold has passed: not yet, and it says so.
        let early = judge(&fleet(&events), 2_500);
        assert!(early.verdicts.is_empty());
        assert_eq!(held(&early), vec![("ipu2", host(3), false)]);
        assert!(early.withheld[0].reason.contains("alone so far: raised 1500 ms ago"), "{early:?}");
        // Without the hold, at once.
        let now = super::judge(&fleet(&events), 10_000, &Rules { lone_blame_hold_ms: 0, ..Rules::default() });
        assert_eq!(spans(&now), vec![(host(3), 1_000, 1_000, Some(5_000))]);
    }

    #[test]
    fn the_faulted_hosts_own_blame_of_a_neighbour_loses_to_both_neighbours_naming_it() {
        // Host 3's cable is capped: its IPU names neighbour 4 at 1.0 s; IPU 4 names 3 at 1.2 s,
        // IPU 2 names 3 at 1.5 s.
        let events = [(3, gray(1, 4, 1_000, None)), (4, gray(7, 3, 1_200, None)), (2, gray(9, 3, 1_500, None))];
        let v = judge(&fleet(&events), 10_000);
        assert_eq!(spans(&v), vec![(host(3), 1_500, 1_200, None)], "{v:?}");
        assert_eq!(v.verdicts[0].witnesses.len(), 2);
        assert_eq!(held(&v), vec![("ipu3", host(4), true)]);
        assert!(v.withheld[0].reason.contains("the agent of 10.77.0.4 named 10.77.0.3 back (event 7), and 10.77.0.3 was named by 2 agents"), "{v:?}");
        // Without the hold, host 4 is named at once, before IPU 4 blames back.
        let v = super::judge(&fleet(&events), 10_000, &Rules { lone_blame_hold_ms: 0, ..Rules::default() });
        assert_eq!(v.verdicts.iter().map(|v| (v.host, v.raised_unix_ms)).collect::<Vec<_>>(), vec![(host(4), 1_000), (host(3), 1_500)]);
    }

    #[test]
    fn when_both_neighbours_name_it_first_the_faulted_hosts_blame_is_never_repeated() {
        let v = judge(&fleet(&[(4, gray(7, 3, 1_000, None)), (2, gray(9, 3, 1_100, None)), (3, gray(1, 4, 1_400, Some(3_000)))]), 10_000);
        assert_eq!(spans(&v), vec![(host(3), 1_100, 1_000, None)], "named once the second neighbour agreed: {v:?}");
        assert_eq!(held(&v), vec![("ipu3", host(4), true)]);
    }

    #[test]
    fn a_contest_that_comes_after_the_hold_does_not_unsay_what_the_fleet_said() {
        // The fleet decides as it would live: host 4 was repeated at 3.0 s, alone; the blame
        // back at 3.5 s stops only what comes after.
        let v = judge(&fleet(&[(3, gray(1, 4, 1_000, None)), (4, gray(7, 3, 3_500, None))]), 10_000);
        assert_eq!(spans(&v), vec![(host(4), 3_000, 1_000, None)], "{v:?}");
        assert_eq!(held(&v), vec![("ipu4", host(3), true)]);
    }

    #[test]
    fn two_hosts_blaming_only_each_other_are_a_tie_and_neither_is_named() {
        let v = judge(&fleet(&[(1, gray(1, 2, 1_000, Some(9_000))), (2, gray(2, 1, 1_000, Some(9_000)))]), 10_000);
        assert!(v.verdicts.is_empty(), "{v:?}");
        assert_eq!(held(&v), vec![("ipu1", host(2), true), ("ipu2", host(1), true)]);
        // So are two one-window blames, raised and over in the same window (the detectors' end is
        // the last anomalous window's, here the raise): their times agree within the slack.
        let v = judge(&fleet(&[(3, gray(1, 4, 1_000, Some(1_000))), (4, gray(2, 3, 1_100, Some(1_100)))]), 10_000);
        assert!(v.verdicts.is_empty(), "{v:?}");
    }

    #[test]
    fn a_link_verdict_names_the_agents_own_host_at_once_and_counts_as_a_witness() {
        // Loss on host 5's cable: its IPU flags its own link; neighbours 4 and 6 name 5.
        let link = ev(3, VerdictKind::Congestion, Scope::Link { link: "fabric".into() }, 900, Some(9_000));
        let v = judge(&fleet(&[(5, link), (4, gray(1, 5, 1_000, Some(9_000))), (6, gray(2, 5, 1_300, Some(8_000)))]), 10_000);
        assert_eq!(spans(&v), vec![(host(5), 900, 900, Some(9_000))]);
        assert_eq!(v.verdicts[0].witnesses.len(), 3);
        assert_eq!(v.verdicts[0].kinds, vec![VerdictKind::Congestion, VerdictKind::GrayFailure]);
        assert!(v.withheld.is_empty(), "{v:?}");
        // Host 5's own link verdict also outweighs its blame of a neighbour that blames it back.
        let link = ev(3, VerdictKind::Congestion, Scope::Link { link: "fabric".into() }, 900, None);
        let v = judge(&fleet(&[(5, link), (5, gray(4, 6, 950, None)), (6, gray(2, 5, 1_000, None))]), 10_000);
        assert_eq!(v.verdicts.iter().map(|v| v.host).collect::<Vec<_>>(), vec![host(5)], "{v:?}");
        assert_eq!(held(&v), vec![("ipu5", host(6), true)]);
    }

    #[test]
    fn other_scopes_are_not_judged() {
        let r = ev(2, VerdictKind::GrayFailure, Scope::RdmaPort { device: "mlx5_0".into(), port: 1 }, 1_000, None);
        let j = ev(3, VerdictKind::Straggler, Scope::Job, 1_000, None);
        assert_eq!(judge(&fleet(&[(1, r), (1, j)]), 10_000), FleetView::default());
    }

    fn straggler(id: u64, peer: u8, raised: u64, ended: Option<u64>) -> Event {
        ev(id, VerdictKind::Straggler, Scope::Peer { peer: host(peer), link: "fabric".into() }, raised, ended)
    }

    #[test]
    fn a_straggler_is_repeated_only_once_a_second_agent_names_it() {
        // One IPU alone, however long: withheld, and it says why.
        let v = judge(&fleet(&[(3, straggler(1, 1, 1_000, Some(60_000)))]), 100_000);
        assert!(v.verdicts.is_empty(), "{v:?}");
        assert_eq!(held(&v), vec![("ipu3", host(1), false)]);
        assert!(v.withheld[0].reason.contains("a straggler seen by this agent only"), "{v:?}");
        // Two IPUs see host 4 late: named when the second one does, as a straggler of its own,
        // not merged with a network verdict on the same host at the same time.
        let v = judge(&fleet(&[(3, straggler(1, 4, 1_000, None)), (5, straggler(2, 4, 4_000, None)), (6, gray(3, 4, 2_000, None))]), 100_000);
        let named: Vec<_> = v.verdicts.iter().map(|v| (v.host, v.raised_unix_ms, v.kinds.clone(), v.witnesses.len())).collect();
        assert_eq!(named, vec![(host(4), 4_000, vec![VerdictKind::Straggler], 2), (host(4), 4_000, vec![VerdictKind::GrayFailure], 1)], "{v:?}");
        // Apart in time, two agents do not corroborate each other.
        let v = judge(&fleet(&[(3, straggler(1, 4, 1_000, Some(2_000))), (5, straggler(2, 4, 9_000, Some(10_000)))]), 100_000);
        assert!(v.verdicts.is_empty(), "{v:?}");
        // A straggler never contests a network blame, nor counts as its witness.
        let v = judge(&fleet(&[(3, gray(1, 4, 1_000, None)), (4, straggler(2, 3, 1_100, None)), (2, straggler(3, 4, 1_200, None))]), 100_000);
        assert_eq!(v.verdicts.iter().map(|v| (v.host, v.raised_unix_ms)).collect::<Vec<_>>(), vec![(host(4), 3_000)], "{v:?}");
    }

    #[test]
    fn goodput_alone_needs_two_agents_besides_the_hosts_own() {
        const G: &[Metric] = &[Metric::InBurstGoodputBps];
        let link = |id, raised| on(ev(id, VerdictKind::Congestion, Scope::Link { link: "fabric".into() }, raised, Some(9_000)), G);
        // Host 6 busy: its own agent sees every peer slower, one neighbour sees it slower. Never
        // repeated, however long, and it says why.
        let v = judge(&fleet(&[(6, link(1, 1_000)), (5, on(gray(2, 6, 1_500, Some(9_000)), G))]), 100_000);
        assert!(v.verdicts.is_empty(), "{v:?}");
        assert_eq!(held(&v), vec![("ipu6", host(6), false), ("ipu5", host(6), false)]);
        assert!(v.withheld[1].reason.contains("goodput only") && v.withheld[1].reason.contains("1 agent(s) besides 10.77.0.6's own"), "{v:?}");
        // Both neighbours see it: named when the second does (the host's own link verdict joins).
        let v = judge(&fleet(&[(6, link(1, 1_000)), (5, on(gray(2, 6, 1_500, None), G)), (1, on(gray(3, 6, 2_500, None), G))]), 100_000);
        assert_eq!(v.verdicts.iter().map(|v| (v.host, v.raised_unix_ms, v.witnesses.len())).collect::<Vec<_>>(), vec![(host(6), 2_500, 3)], "{v:?}");
        // One neighbour's blame with loss in any of its windows backs the others: the usual rules.
        let lossy = on(gray(2, 6, 1_500, Some(9_000)), &[Metric::LossRate, Metric::InBurstGoodputBps]);
        let v = judge(&fleet(&[(6, link(1, 1_000)), (5, lossy)]), 100_000);
        assert_eq!(spans(&v), vec![(host(6), 1_500, 1_000, Some(9_000))], "{v:?}");
        // An event from an agent without `signals` is judged on its evidence; none at all is not
        // goodput-only.
        assert!(!gray(1, 2, 0, None).goodput_only());
    }

    #[test]
    fn goodput_alone_in_the_time_of_another_hosts_own_link_fault_is_its_echo() {
        const G: &[Metric] = &[Metric::InBurstGoodputBps];
        // Host 4's cable flaps: its IPU flags its own link on the carrier at 500 ms; IPUs 1, 2 and
        // 3 see host 5 slow on goodput alone from 3 s (the recorded PyTorch run).
        let flap = on(ev(1, VerdictKind::GrayFailure, Scope::Link { link: "fabric".into() }, 500, Some(12_000)), &[Metric::CarrierDowns]);
        let echoes = [(1, on(gray(1, 5, 3_100, None), G)), (2, on(gray(1, 5, 3_400, None), G)), (3, on(gray(2, 5, 3_700, None), G))];
        let mut events = vec![(4, flap.clone())];
        events.extend(echoes.iter().cloned());
        let v = judge(&fleet(&events), 100_000);
        assert_eq!(v.verdicts.iter().map(|v| v.host).collect::<Vec<_>>(), vec![host(4)], "{v:?}");
        assert_eq!(held(&v), vec![("ipu1", host(5), false), ("ipu2", host(5), false), ("ipu3", host(5), false)]);
        assert!(v.withheld[0].reason.contains("10.77.0.4's own agent flagging its own link with other evidence (event 1)"), "{v:?}");
        // Without the flap the three agents name host 5; with a flap that ended before (its time
        // and the slack) they do too; a goodput-only own-link verdict is no such evidence.
        for other in [None, Some(on(ev(1, VerdictKind::GrayFailure, Scope::Link { link: "fabric".into() }, 500, Some(1_000)), &[Metric::CarrierDowns])), Some(on(flap.clone(), G))] {
            let mut events: Vec<(u8, Event)> = other.into_iter().map(|e| (4, e)).collect();
            events.extend(echoes.iter().cloned());
            let v = judge(&fleet(&events), 100_000);
            assert!(v.verdicts.iter().any(|v| v.host == host(5) && v.raised_unix_ms == 3_400), "{v:?}");
        }
        // A blame of host 5 with loss is judged as before, flap or not.
        let v = judge(&fleet(&[(4, flap), (1, on(gray(1, 5, 3_100, None), &[Metric::LossRate])), (6, on(gray(2, 5, 3_200, None), G))]), 100_000);
        assert!(v.verdicts.iter().any(|v| v.host == host(5)), "{v:?}");
    }

    #[test]
    fn blames_apart_in_time_are_two_verdicts() {
        let v = judge(&fleet(&[(2, gray(1, 3, 1_000, Some(3_000))), (2, gray(2, 3, 7_000, Some(9_000)))]), 20_000);
        assert_eq!(spans(&v), vec![(host(3), 3_000, 1_000, Some(3_000)), (host(3), 9_000, 7_000, Some(9_000))]);
    }
}
