//! The provider's fleet view: one verdict list from the agents of many single-host vantages (an
//! agent on each host's IPU/DPU, or on each host NIC), each of which sees only its own host's
//! traffic.
//!
//! One such agent cannot tell a fault on its own host's cable from a fault on a peer's: both slow
//! the one connection between them. When its own cable is rate-capped, an IPU may blame the peer
//! it compares worst (docs/eval-detection.md "IPU vantage": every wrong event of that column was
//! the faulted host's own IPU naming a healthy ring neighbour), while that neighbour's IPU names
//! the faulted host. The fleet breaks the tie with the other agents: a host is named when
//! agents name it and no stronger evidence names its accuser.
//!
//! The rule ([`judge`]), applied at every instant over the network-fault events (congestion, gray
//! failure) open at that instant:
//! - every event names a host: a peer-scoped one its peer, a link-scoped one the agent's own host
//!   (the agent watches that host's path only);
//! - `namers(h)`: the agents with an open event naming `h`;
//! - `h` is named by the fleet unless an accuser `a` in `namers(h)` (not `h`'s own agent) is
//!   named back by `h`'s agent (the two blame each other) while `namers(host of a)` is at least as
//!   large as `namers(h)`. Two hosts blaming only each other: neither is named (say nothing when
//!   unsure); a ring's faulted host named by both its neighbours beats its own IPU's blame of one
//!   of them;
//! - a host named by one other agent alone is named only once that blame has stood uncontested
//!   for [`Rules::lone_blame_hold_ms`] (the blame back often comes a little later); a host named
//!   by two agents, or whose own agent flags its own link, is named at once.
//!
//! A verdict is one run of instants in which its host is named: raised when that run began (at
//! the earliest the first event's raise; later if it had to wait for a second witness), ended
//! when the last event naming it ended. Blames the rule held back are listed as [`Withheld`], so
//! an operator sees what each agent said and why the fleet did not repeat it. Straggler events
//! are not judged here (they are about compute, and name the straggler from every vantage alike).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use serde::{Deserialize, Serialize};

use crate::operator::{Event, Scope, VerdictKind};

/// One agent's events and the host it watches.
#[derive(Debug, Clone)]
pub struct AgentEvents {
    /// How the agent is called in the output (its URL, or a name).
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
    /// When the fleet began naming it, Unix ms.
    pub raised_unix_ms: u64,
    /// When it stopped (every event naming it ended, or the rule held it back); `None`: open.
    pub ended_unix_ms: Option<u64>,
    /// The kinds of the events naming it (congestion, gray failure).
    pub kinds: Vec<VerdictKind>,
    /// Every agent event that named it during the verdict.
    pub witnesses: Vec<Witness>,
}

/// A blame the fleet did not repeat, and for how long.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Withheld {
    /// The host the agent named.
    pub host: IpAddr,
    pub witness: Witness,
    /// Milliseconds of the event's lifetime in which the fleet did not name `host`.
    pub withheld_ms: u64,
    /// Whether the fleet named `host` at some other time of the event's lifetime.
    pub partly_named: bool,
    pub reason: String,
}

/// What [`judge`] returns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetView {
    /// Oldest first.
    pub verdicts: Vec<FleetVerdict>,
    pub withheld: Vec<Withheld>,
}

/// An event's interval and the host it names.
struct Blame<'a> {
    agent: usize,
    host: IpAddr,
    from: u64,
    /// Exclusive; `u64::MAX` while open.
    to: u64,
    event: &'a Event,
}

fn blames(agents: &[AgentEvents]) -> Vec<Blame<'_>> {
    let mut out = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        for e in a.events.iter().filter(|e| e.kind.is_network_fault()) {
            let host = match &e.scope {
                Scope::Peer { peer, .. } => *peer,
                Scope::Link { .. } => a.host,
                Scope::Job | Scope::RdmaPort { .. } => continue,
            };
            let from = e.raised_unix_ms;
            // An event closed in the millisecond it was raised still counts for that millisecond.
            let to = e.ended_unix_ms.map_or(u64::MAX, |end| end.max(from + 1));
            out.push(Blame { agent: i, host, from, to, event: e });
        }
    }
    out
}

/// How the fleet weighs its agents' blames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    /// A host named by one other agent alone is named only once that blame has stood this long
    /// without being contested (ms). The faulted host's own IPU often blames a neighbour a few
    /// hundred ms before that neighbour's IPU blames it back; without the wait the fleet would
    /// repeat the wrong blame until then. Two or more agents naming a host, or a host's own
    /// agent flagging its own link, are named at once.
    pub lone_blame_hold_ms: u64,
}

impl Default for Rules {
    fn default() -> Self {
        Rules { lone_blame_hold_ms: 2_000 }
    }
}

/// Where a named host stands at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Named,
    /// One other agent alone names it, for less than the hold so far.
    Alone,
    /// Its agent blames an accuser back, and the accuser is named by at least as many agents.
    Contested,
}

/// Where each host named by an `open` blame stands at `t`.
fn standings(agents: &[AgentEvents], open: &[&Blame<'_>], t: u64, rules: &Rules) -> BTreeMap<IpAddr, Standing> {
    let mut namers: BTreeMap<IpAddr, BTreeSet<usize>> = BTreeMap::new();
    for b in open {
        namers.entry(b.host).or_default().insert(b.agent);
    }
    let count = |h: &IpAddr| namers.get(h).map_or(0, BTreeSet::len);
    namers
        .iter()
        .map(|(h, by)| {
            let contested = by.iter().any(|&a| {
                let accuser = agents[a].host;
                accuser != *h && open.iter().any(|b| agents[b.agent].host == *h && b.host == accuser) && count(&accuser) >= by.len()
            });
            let lone = by.len() == 1 && by.iter().all(|&a| agents[a].host != *h);
            let first = open.iter().filter(|b| b.host == *h).map(|b| b.from).min().unwrap_or(t);
            let standing = if contested {
                Standing::Contested
            } else if lone && t < first.saturating_add(rules.lone_blame_hold_ms) {
                Standing::Alone
            } else {
                Standing::Named
            };
            (*h, standing)
        })
        .collect()
}

/// The fleet's verdicts over `agents`' events (see the module's documentation). Events still
/// open are open at `now_unix_ms` and after; `now_unix_ms` only bounds the time withheld.
pub fn judge(agents: &[AgentEvents], now_unix_ms: u64, rules: &Rules) -> FleetView {
    let mut all = blames(agents);
    all.sort_by_key(|b| b.from);
    // The instants where the answer can change: raises, ends, and the end of each lone hold.
    let mut cuts: Vec<u64> = all.iter().flat_map(|b| [b.from, b.to, b.from.saturating_add(rules.lone_blame_hold_ms).min(b.to)]).filter(|&t| t != u64::MAX).collect();
    cuts.sort_unstable();
    cuts.dedup();
    // Per blame: how long its host was named, held alone, and contested.
    let mut named_ms = vec![0u64; all.len()];
    let mut alone_ms = vec![0u64; all.len()];
    let mut contested_ms = vec![0u64; all.len()];
    let mut verdicts: Vec<FleetVerdict> = Vec::new();
    // host -> index of its verdict while it is open
    let mut current: BTreeMap<IpAddr, usize> = BTreeMap::new();
    // The blames open at the cut (indices into `all`), kept as the sweep goes.
    let mut open_ix: Vec<usize> = Vec::new();
    let mut next_from = 0;
    for (k, &t) in cuts.iter().enumerate() {
        let next = cuts.get(k + 1).copied().unwrap_or(u64::MAX);
        open_ix.retain(|&i| all[i].to > t);
        while next_from < all.len() && all[next_from].from <= t {
            open_ix.push(next_from);
            next_from += 1;
        }
        let open: Vec<&Blame<'_>> = open_ix.iter().map(|&i| &all[i]).collect();
        let stand = standings(agents, &open, t, rules);
        let named: BTreeSet<IpAddr> = stand.iter().filter(|(_, s)| **s == Standing::Named).map(|(h, _)| *h).collect();
        let span = next.min(now_unix_ms.max(t)).saturating_sub(t);
        for &i in &open_ix {
            match stand[&all[i].host] {
                Standing::Named => named_ms[i] += span.max(1),
                Standing::Alone => alone_ms[i] += span,
                Standing::Contested => contested_ms[i] += span,
            }
        }
        // Close verdicts whose host is no longer named; open or extend the others.
        let ended: Vec<IpAddr> = current.keys().filter(|h| !named.contains(h)).copied().collect();
        for h in ended {
            let v = current.remove(&h).expect("listed");
            verdicts[v].ended_unix_ms = Some(t);
        }
        for h in &named {
            let v = *current.entry(*h).or_insert_with(|| {
                verdicts.push(FleetVerdict { host: *h, raised_unix_ms: t, ended_unix_ms: None, kinds: Vec::new(), witnesses: Vec::new() });
                verdicts.len() - 1
            });
            for b in open.iter().filter(|b| b.host == *h) {
                let w = Witness { agent: agents[b.agent].agent.clone(), event_id: b.event.id, kind: b.event.kind };
                if !verdicts[v].witnesses.contains(&w) {
                    verdicts[v].witnesses.push(w);
                }
                if !verdicts[v].kinds.contains(&b.event.kind) {
                    verdicts[v].kinds.push(b.event.kind);
                }
            }
        }
    }
    let withheld = all
        .iter()
        .enumerate()
        .filter(|&(i, _)| alone_ms[i] + contested_ms[i] > 0 || named_ms[i] == 0)
        .map(|(i, b)| {
            let (who, accuser) = (&agents[b.agent].agent, agents[b.agent].host);
            let mut why = Vec::new();
            if contested_ms[i] > 0 {
                why.push(format!("contested for {} ms: the agent of {} named {accuser} back, and {accuser} was named by at least as many agents", contested_ms[i], b.host));
            }
            if alone_ms[i] > 0 || why.is_empty() {
                why.push(format!("the agent {who} alone named {} for {} ms, under the hold of {} ms", b.host, alone_ms[i], rules.lone_blame_hold_ms));
            }
            Withheld {
                host: b.host,
                witness: Witness { agent: who.clone(), event_id: b.event.id, kind: b.event.kind },
                withheld_ms: alone_ms[i] + contested_ms[i],
                partly_named: named_ms[i] > 0,
                reason: why.join("; "),
            }
        })
        .collect();
    FleetView { verdicts, withheld }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::{EventState, Severity};

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
        }
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

    fn hosts_named(v: &FleetView) -> Vec<IpAddr> {
        v.verdicts.iter().map(|v| v.host).collect()
    }

    fn judge(agents: &[AgentEvents], now: u64) -> FleetView {
        super::judge(agents, now, &Rules::default())
    }

    #[test]
    fn a_lone_uncontested_blame_is_named_once_it_has_stood_the_hold() {
        let v = judge(&fleet(&[(2, gray(1, 3, 1_000, Some(5_000)))]), 10_000);
        assert_eq!(hosts_named(&v), vec![host(3)]);
        assert_eq!((v.verdicts[0].raised_unix_ms, v.verdicts[0].ended_unix_ms), (3_000, Some(5_000)));
        assert_eq!(v.withheld.len(), 1);
        assert_eq!((v.withheld[0].withheld_ms, v.withheld[0].partly_named), (2_000, true));
        // Without the hold, at once; a blame shorter than the hold is never repeated.
        let now = super::judge(&fleet(&[(2, gray(1, 3, 1_000, Some(5_000)))]), 10_000, &Rules { lone_blame_hold_ms: 0 });
        assert_eq!(now.verdicts[0].raised_unix_ms, 1_000);
        assert!(judge(&fleet(&[(2, gray(1, 3, 1_000, Some(2_500)))]), 10_000).verdicts.is_empty());
    }

    #[test]
    fn the_faulted_hosts_own_blame_of_a_neighbour_loses_to_both_neighbours_naming_it() {
        // Host 3's cable is capped: its IPU names neighbour 4 at 1.0 s; IPU 4 names 3 at 1.2 s,
        // IPU 2 names 3 at 1.5 s.
        let events = [(3, gray(1, 4, 1_000, None)), (4, gray(7, 3, 1_200, None)), (2, gray(9, 3, 1_500, None))];
        let v = judge(&fleet(&events), 10_000);
        assert_eq!(hosts_named(&v), vec![host(3)], "{v:?}");
        assert_eq!((v.verdicts[0].raised_unix_ms, v.verdicts[0].ended_unix_ms), (1_500, None));
        let w: Vec<_> = v.withheld.iter().map(|w| (w.witness.agent.as_str(), w.host, w.partly_named, w.withheld_ms)).collect();
        assert_eq!(w, vec![("ipu3", host(4), false, 9_000), ("ipu4", host(3), true, 300)]);
        // Without the hold, host 4 is named for the 0.2 s before IPU 4 blames back; then the two
        // are a tie (neither named) until IPU 2 names 3.
        let v = super::judge(&fleet(&events), 10_000, &Rules { lone_blame_hold_ms: 0 });
        assert_eq!(hosts_named(&v), vec![host(4), host(3)], "{v:?}");
        assert_eq!((v.verdicts[0].raised_unix_ms, v.verdicts[0].ended_unix_ms), (1_000, Some(1_200)));
        assert_eq!((v.verdicts[1].raised_unix_ms, v.verdicts[1].ended_unix_ms), (1_500, None));
    }

    #[test]
    fn when_both_neighbours_name_it_first_the_faulted_hosts_blame_is_never_repeated() {
        let v = judge(&fleet(&[(4, gray(7, 3, 1_000, None)), (2, gray(9, 3, 1_100, None)), (3, gray(1, 4, 1_400, Some(3_000)))]), 10_000);
        assert_eq!(hosts_named(&v), vec![host(3)], "{v:?}");
        // Named once the second neighbour agreed (the first was alone and held).
        assert_eq!((v.verdicts[0].raised_unix_ms, v.verdicts[0].ended_unix_ms), (1_100, None));
        assert_eq!(v.verdicts[0].witnesses.len(), 2);
        let w: Vec<_> = v.withheld.iter().map(|w| (w.witness.agent.as_str(), w.host, w.partly_named, w.withheld_ms)).collect();
        assert_eq!(w, vec![("ipu4", host(3), true, 100), ("ipu3", host(4), false, 1_600)]);
    }

    #[test]
    fn two_hosts_blaming_only_each_other_are_a_tie_and_neither_is_named() {
        let v = judge(&fleet(&[(1, gray(1, 2, 1_000, Some(9_000))), (2, gray(2, 1, 1_000, Some(9_000)))]), 10_000);
        assert!(v.verdicts.is_empty(), "{v:?}");
        assert_eq!(v.withheld.len(), 2);
    }

    #[test]
    fn a_link_verdict_names_the_agents_own_host_at_once_and_counts_as_a_witness() {
        // Loss on host 5's cable: its IPU flags its own link; neighbours 4 and 6 name 5.
        let link = ev(3, VerdictKind::Congestion, Scope::Link { link: "fabric".into() }, 900, Some(9_000));
        let v = judge(&fleet(&[(5, link), (4, gray(1, 5, 1_000, Some(9_000))), (6, gray(2, 5, 1_300, Some(8_000)))]), 10_000);
        assert_eq!(hosts_named(&v), vec![host(5)]);
        let f = &v.verdicts[0];
        assert_eq!((f.raised_unix_ms, f.ended_unix_ms, f.witnesses.len()), (900, Some(9_000), 3));
        assert_eq!(f.kinds, vec![VerdictKind::Congestion, VerdictKind::GrayFailure]);
        assert!(v.withheld.is_empty(), "{v:?}");
        // Host 5's own link verdict also outweighs its blame of a neighbour that blames it back.
        let link = ev(3, VerdictKind::Congestion, Scope::Link { link: "fabric".into() }, 900, None);
        let v = judge(&fleet(&[(5, link), (5, gray(4, 6, 950, None)), (6, gray(2, 5, 1_000, None))]), 10_000);
        assert_eq!(hosts_named(&v), vec![host(5)], "{v:?}");
    }

    #[test]
    fn stragglers_and_other_scopes_are_not_judged() {
        let s = ev(1, VerdictKind::Straggler, Scope::Peer { peer: host(2), link: "fabric".into() }, 1_000, None);
        let r = ev(2, VerdictKind::GrayFailure, Scope::RdmaPort { device: "mlx5_0".into(), port: 1 }, 1_000, None);
        assert_eq!(judge(&fleet(&[(1, s), (1, r)]), 10_000), FleetView::default());
    }

    #[test]
    fn a_verdict_that_ends_and_comes_back_is_two_verdicts() {
        let v = judge(&fleet(&[(2, gray(1, 3, 1_000, Some(4_000))), (2, gray(2, 3, 6_000, Some(9_000)))]), 10_000);
        let spans: Vec<_> = v.verdicts.iter().map(|v| (v.raised_unix_ms, v.ended_unix_ms)).collect();
        assert_eq!(spans, vec![(3_000, Some(4_000)), (8_000, Some(9_000))]);
    }
}
