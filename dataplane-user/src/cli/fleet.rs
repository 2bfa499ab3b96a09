//! `ringside fleet`: the provider's fleet view. Reads the events of every agent of single-host
//! vantages (one agent per host's IPU/DPU, or per host NIC) and names the hosts the fleet as a
//! whole blames ([`ringside_client::fleet::judge`]): an agent that sees only its own host cannot
//! tell a fault on its own cable from one on its peer's, and the other agents break the tie.
use std::{collections::BTreeSet, net::IpAddr};

use ringside_client::fleet::{self, AgentEvents, FleetView, Rules};
use serde::Serialize;

use super::{events::unix_ms_text, print_json, table, wire_name, CliError, TokenArgs};

#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// One agent of the fleet, as HOST=URL: HOST is the address of the host whose traffic the
    /// agent sees (on an IPU/DPU, the host behind it: the agent's link verdicts are about that
    /// host), URL the agent's API. Repeat for every agent (at least two; one per host).
    #[arg(long = "agent", value_name = "HOST=URL", required = true, value_parser = parse_agent)]
    pub agents: Vec<FleetAgent>,
    /// How long a blame no other agent corroborates must stand, uncontested, before the fleet
    /// repeats it (ms). Two agents naming a host, or a host's own agent flagging its own link,
    /// name it at once.
    #[arg(long, value_name = "MS", default_value_t = Rules::default().lone_blame_hold_ms)]
    pub lone_blame_hold_ms: u64,
    /// How far apart (ms, on each side) two agents' estimates of a fault's time may be and still
    /// count as the same time: the detectors estimate to a detection window.
    #[arg(long, value_name = "MS", default_value_t = Rules::default().overlap_slack_ms)]
    pub overlap_slack_ms: u64,
    /// Also list the blames the fleet held back, and why.
    #[arg(long)]
    pub withheld: bool,
    /// Print the fleet view as JSON (every verdict, every blame held back, each agent's read).
    #[arg(long)]
    pub json: bool,
    /// The operator token, the same for every agent (`[api] operator_tokens_file` lets a
    /// provider give its agents a shared one).
    #[command(flatten)]
    pub auth: TokenArgs,
}

/// `--agent HOST=URL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetAgent {
    pub host: IpAddr,
    pub url: String,
}

fn parse_agent(s: &str) -> Result<FleetAgent, String> {
    let (host, url) = s.split_once('=').ok_or_else(|| format!("`{s}` is not HOST=URL (e.g. 10.0.0.5=http://10.1.0.5:9464)"))?;
    let host = host
        .trim()
        .parse()
        .map_err(|e| format!("`{}` is not an IP address ({e}); HOST is the address of the host whose traffic the agent sees", host.trim()))?;
    let url = url.trim();
    if url.is_empty() {
        return Err(format!("`{s}` has no URL after `=`"));
    }
    Ok(FleetAgent { host, url: url.to_owned() })
}

/// How one agent's events were read.
#[derive(Debug, Clone, Serialize)]
pub struct AgentRead {
    pub host: IpAddr,
    pub url: String,
    /// Events read (open and recently closed), when the read succeeded.
    pub events: Option<usize>,
    /// Why the read failed: the fleet view then lacks this agent's events.
    pub error: Option<String>,
}

/// `ringside fleet --json`.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    pub now_unix_ms: u64,
    pub rules: Rules,
    pub agents: Vec<AgentRead>,
    #[serde(flatten)]
    pub view: FleetView,
}

/// Most events one agent returns (`/v1/events`' limit).
const EVENTS_LIMIT: usize = 1000;

/// Reads every agent's events (at most 16 requests at a time) and judges them. An agent that
/// cannot be read is listed with its error; if none can, the first error is returned.
pub fn gather(args: &FleetArgs) -> Result<FleetReport, CliError> {
    let mut seen = BTreeSet::new();
    if let Some(dup) = args.agents.iter().find(|a| !seen.insert(a.host)) {
        return Err(CliError::Fleet(format!("two agents for host {}: give each host's agent once (HOST is the host the agent watches)", dup.host)));
    }
    if args.agents.len() < 2 {
        return Err(CliError::Fleet("a fleet view needs the agents of at least two hosts (--agent HOST=URL, repeated)".into()));
    }
    let mut reads: Vec<Result<Vec<ringside_client::operator::Event>, CliError>> = Vec::new();
    for chunk in args.agents.chunks(16) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk.iter().map(|a| s.spawn(|| args.auth.read(&a.url, |c| c.events(true, EVENTS_LIMIT)).map(|r| r.events))).collect();
            reads.extend(handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(CliError::Fleet("a reader thread panicked".into())))));
        });
    }
    if reads.iter().all(Result::is_err) {
        return Err(reads.into_iter().find_map(Result::err).expect("at least two agents"));
    }
    let mut agents = Vec::new();
    let mut fleet_agents = Vec::new();
    for (a, read) in args.agents.iter().zip(reads) {
        match read {
            Ok(events) => {
                agents.push(AgentRead { host: a.host, url: a.url.clone(), events: Some(events.len()), error: None });
                fleet_agents.push(AgentEvents { agent: a.host.to_string(), host: a.host, events });
            }
            Err(e) => agents.push(AgentRead { host: a.host, url: a.url.clone(), events: None, error: Some(e.to_string()) }),
        }
    }
    let now_unix_ms = crate::clock::unix_ms();
    let rules = Rules { lone_blame_hold_ms: args.lone_blame_hold_ms, overlap_slack_ms: args.overlap_slack_ms };
    Ok(FleetReport { now_unix_ms, rules, agents, view: fleet::judge(&fleet_agents, now_unix_ms, &rules) })
}

pub fn run(args: FleetArgs) -> Result<(), CliError> {
    let report = gather(&args)?;
    for a in report.agents.iter().filter(|a| a.error.is_some()) {
        eprintln!("warning: host {}'s agent ({}) was not read: {}; the fleet view lacks its events", a.host, a.url, a.error.as_deref().unwrap_or(""));
    }
    if args.json {
        print_json(&report)
    } else {
        print!("{}", render(&report, args.withheld));
        Ok(())
    }
}

/// The `ringside fleet` tables.
pub fn render(r: &FleetReport, withheld: bool) -> String {
    let rows: Vec<Vec<String>> = r
        .view
        .verdicts
        .iter()
        .map(|v| {
            vec![
                v.host.to_string(),
                if v.ended_unix_ms.is_none() { "open".into() } else { "over".into() },
                v.kinds.iter().map(|&k| wire_name(k)).collect::<Vec<_>>().join("+"),
                unix_ms_text(v.raised_unix_ms),
                unix_ms_text(v.started_unix_ms),
                v.ended_unix_ms.map_or("-".to_owned(), unix_ms_text),
                v.agents().join(", "),
            ]
        })
        .collect();
    let mut out = table(&["HOST", "STATE", "KINDS", "RAISED", "FAULT FROM", "TO", "NAMED BY THE AGENTS OF"], &rows);
    let read = r.agents.iter().filter(|a| a.error.is_none()).count();
    let unread: Vec<String> = r.agents.iter().filter(|a| a.error.is_some()).map(|a| a.host.to_string()).collect();
    out.push_str(&format!(
        "{} hosts named ({} open) from the events of {read} of {} agents{}; {} blames held back{}\n",
        r.view.verdicts.len(),
        r.view.verdicts.iter().filter(|v| v.ended_unix_ms.is_none()).count(),
        r.agents.len(),
        if unread.is_empty() { String::new() } else { format!(" (not read: {})", unread.join(", ")) },
        r.view.withheld.len(),
        if withheld || r.view.withheld.is_empty() { "" } else { " (--withheld lists them)" },
    ));
    if withheld && !r.view.withheld.is_empty() {
        let rows: Vec<Vec<String>> = r
            .view
            .withheld
            .iter()
            .map(|w| {
                vec![
                    w.witness.agent.clone(),
                    w.witness.event_id.to_string(),
                    wire_name(w.witness.kind),
                    w.host.to_string(),
                    w.reason.clone(),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["AGENT OF", "EVENT", "KIND", "NAMED", "WHY NOT REPEATED"], &rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        analysis::EventsSnapshot,
        api,
        clock::Clock,
        detect::{VerdictChange, VerdictKind as Kind},
        events::{tests::verdict, EventLog},
        metrics::tests::{sample_state, TEST_OPERATOR_TOKEN},
    };

    /// A real agent API (the agent's router and server) on a loopback port whose event log holds
    /// one gray failure per `(peer, raised_ms)`; the runtime lives on its own thread.
    fn agent_api(blames: &[(&str, u64)]) -> String {
        let mut log = EventLog::new(16, 16);
        for (i, (peer, raised_ms)) in blames.iter().enumerate() {
            let mut v = verdict(i as u64 + 1, Kind::GrayFailure, peer);
            v.raised_ns = raised_ms * 1_000_000;
            v.started_ns = v.raised_ns;
            log.apply(&[VerdictChange::Opened(v)], &Clock { mono_ns: 20_000_000_000, unix_ms: 1_700_000_020_000 });
        }
        let view = sample_state().with_events(EventsSnapshot { log, jobs: Vec::new(), rdma: None, queues: None });
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", std_listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                api::server::serve(listener, api::router(view), Default::default(), std::future::pending()).await.unwrap();
            });
        });
        url
    }

    fn args(agents: Vec<(&str, String)>) -> FleetArgs {
        FleetArgs {
            agents: agents.into_iter().map(|(h, url)| FleetAgent { host: h.parse().unwrap(), url }).collect(),
            lone_blame_hold_ms: Rules::default().lone_blame_hold_ms,
            overlap_slack_ms: Rules::default().overlap_slack_ms,
            withheld: true,
            json: false,
            auth: TokenArgs { token: Some(TEST_OPERATOR_TOKEN.into()), state_dir: "/nonexistent".into() },
        }
    }

    #[test]
    fn the_fleet_names_the_host_two_agents_blame_and_holds_back_its_blame_of_a_neighbour() {
        // Host .3's cable is capped: its agent blames .4 at 11.0 s; .4's and .2's agents blame .3
        // at 11.2 s and 11.5 s. Host .9's agent is not running.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let a = args(vec![
            ("10.77.0.2", agent_api(&[("10.77.0.3", 11_500)])),
            ("10.77.0.3", agent_api(&[("10.77.0.4", 11_000)])),
            ("10.77.0.4", agent_api(&[("10.77.0.3", 11_200)])),
            ("10.77.0.9", format!("http://{dead}")),
        ]);
        let r = gather(&a).unwrap();
        let named: Vec<(String, u64)> = r.view.verdicts.iter().map(|v| (v.host.to_string(), v.raised_unix_ms)).collect();
        assert_eq!(named, vec![("10.77.0.3".to_owned(), 1_700_000_011_500)], "{r:?}");
        assert_eq!(r.view.withheld.len(), 1, "{r:?}");
        assert!(r.view.withheld[0].contested && r.view.withheld[0].host.to_string() == "10.77.0.4", "{r:?}");
        assert!(r.agents[3].error.as_deref().is_some_and(|e| e.contains("cannot reach")), "{:?}", r.agents[3]);
        let text = render(&r, true);
        assert!(text.contains("1 hosts named (1 open) from the events of 3 of 4 agents (not read: 10.77.0.9); 1 blames held back"), "{text}");
        assert!(text.contains("10.77.0.4, 10.77.0.2") && text.contains("contested"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["verdicts"][0]["host"], "10.77.0.3");
        assert_eq!(json["rules"]["lone_blame_hold_ms"], 2_000);
    }

    #[test]
    fn bad_fleets_are_refused_with_what_to_do() {
        assert!(parse_agent("10.0.0.1").unwrap_err().contains("HOST=URL"));
        assert!(parse_agent("host1=http://x").unwrap_err().contains("not an IP address"));
        assert!(parse_agent("10.0.0.1=").unwrap_err().contains("no URL"));
        assert_eq!(parse_agent(" 10.0.0.1 = http://a:1 ").unwrap(), FleetAgent { host: "10.0.0.1".parse().unwrap(), url: "http://a:1".into() });
        let e = gather(&args(vec![("10.0.0.1", "http://a".into()), ("10.0.0.1", "http://b".into())])).unwrap_err();
        assert!(e.to_string().contains("two agents for host 10.0.0.1"), "{e}");
        let e = gather(&args(vec![("10.0.0.1", "http://a".into())])).unwrap_err();
        assert!(e.to_string().contains("at least two hosts"), "{e}");
        // Nobody answers: the error says so, no empty view.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let e = gather(&args(vec![("10.0.0.1", format!("http://{dead}")), ("10.0.0.2", format!("http://{dead}"))])).unwrap_err();
        assert!(e.to_string().contains("cannot reach the agent"), "{e}");
    }
}
