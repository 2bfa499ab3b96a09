//! `ringside events`: the agent's detection events, open ones and with `--all` the recently closed
//! ones (`GET /v1/events`).
use ringside_client::{
    operator::{Event, EventState, Metric, Scope},
    EventsResponse,
};

use super::{default_agent_url, human_bytes, print_json, table, wire_name, CliError, TokenArgs};

#[derive(Debug, Clone, clap::Args)]
pub struct EventsArgs {
    /// The agent's base URL.
    #[arg(long, default_value_t = default_agent_url())]
    pub agent: String,
    /// Also list recently closed events.
    #[arg(long)]
    pub all: bool,
    /// How many events at most (1-1000).
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Print the raw JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub auth: TokenArgs,
}

pub fn run(args: EventsArgs) -> Result<(), CliError> {
    let r = args.auth.read(&args.agent, |c| c.events(args.all, args.limit))?;
    if args.json {
        print_json(&r)
    } else {
        print!("{}", render_events(&r));
        Ok(())
    }
}

fn scope_text(s: &Scope) -> String {
    match s {
        Scope::Peer { peer, link } => format!("peer {peer} via {link}"),
        Scope::Link { link } => format!("link {link}"),
        Scope::Job => "job".to_owned(),
        Scope::RdmaPort { device, port } => format!("rdma port {device}/{port}"),
    }
}

pub(crate) fn unix_ms_text(ms: u64) -> String {
    // UTC clock time is enough to line events up; the JSON carries the full timestamp.
    let secs = ms / 1000;
    format!("{:02}:{:02}:{:02}.{:03}Z", (secs / 3600) % 24, (secs / 60) % 60, secs % 60, ms % 1000)
}

fn evidence_text(e: &Event) -> String {
    e.evidence
        .iter()
        .map(|x| {
            let (name, v, r) = match x.metric {
                Metric::InBurstGoodputBps => ("goodput", format!("{}/s", human_bytes(x.value)), format!("{}/s", human_bytes(x.reference))),
                Metric::LossRate => ("loss", format!("{:.2}%", x.value * 100.0), format!("{:.2}%", x.reference * 100.0)),
                Metric::SilenceNs => ("silence", format!("{:.0}ms", x.value / 1e6), format!("{:.0}ms", x.reference / 1e6)),
                Metric::CeRate => ("ce", format!("{:.2}%", x.value * 100.0), format!("{:.2}%", x.reference * 100.0)),
                Metric::CnpPerS => ("cnp", format!("{:.0}/s", x.value), format!("{:.0}/s", x.reference)),
                Metric::PhaseStartLatenessNs => ("late", format!("{:.0}ms", x.value / 1e6), format!("{:.0}ms", x.reference / 1e6)),
                Metric::LossyFlows => ("lossy-flows", format!("{:.0}", x.value), format!("{:.0}", x.reference)),
                Metric::QueueDropRate => ("queue-drops", format!("{:.2}%", x.value * 100.0), format!("{:.2}%", x.reference * 100.0)),
                Metric::QueueThrottleRate => ("queue-throttled", format!("{:.2}", x.value), format!("{:.2}", x.reference)),
                Metric::CarrierDowns => ("carrier-downs", format!("{:.0}", x.value), format!("{:.0}", x.reference)),
                Metric::OtherTrafficBps => ("other-traffic", format!("{}/s", human_bytes(x.value)), format!("{}/s", human_bytes(x.reference))),
                Metric::CnpSentPerS => ("cnp-sent", format!("{:.0}/s", x.value), format!("{:.0}/s", x.reference)),
                Metric::CnpHandledPerS => ("cnp-handled", format!("{:.0}/s", x.value), format!("{:.0}/s", x.reference)),
            };
            format!("{name}={v} (ref {r})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `ringside events` table.
pub fn render_events(r: &EventsResponse) -> String {
    let rows: Vec<Vec<String>> = r
        .events
        .iter()
        .map(|e| {
            let state = match (e.state, e.carried_over, e.confirmed) {
                (EventState::Open, true, false) => "open (carried over)".to_owned(),
                (EventState::Open, _, _) => "open".to_owned(),
                (EventState::Closed, _, _) => {
                    format!("closed ({})", e.end_reason.map(|r| serde_json::to_value(r).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()).unwrap_or_default())
                }
            };
            vec![
                e.id.to_string(),
                e.job.clone(),
                wire_name(e.kind),
                scope_text(&e.scope),
                wire_name(e.severity),
                e.classification.map_or("-".to_owned(), wire_name),
                state,
                unix_ms_text(e.started_unix_ms),
                e.ended_unix_ms.map_or("-".to_owned(), unix_ms_text),
                evidence_text(e),
            ]
        })
        .collect();
    let mut out = table(&["ID", "JOB", "KIND", "SCOPE", "SEVERITY", "CLASS", "STATE", "STARTED", "ENDED", "EVIDENCE"], &rows);
    out.push_str(&format!(
        "{} open, {} closed retained; {} shown ({}); {} detection windows; jobs: {}\n",
        r.open_count,
        r.closed_retained,
        r.events.len(),
        if r.state == "all" { "open and closed" } else { "open only, --all for closed" },
        r.windows,
        if r.jobs.is_empty() { "-".to_owned() } else { r.jobs.join(", ") },
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{api, metrics::tests::sample_state};

    #[test]
    fn renders_events() {
        let text = render_events(&api::events_of(&sample_state().events(), true, 10));
        assert!(text.contains("gray_failure") && text.contains("peer 10.77.0.3 via p1") && text.contains("critical"), "{text}");
        assert!(text.contains("loss=5.00%") && text.contains("1 open"), "{text}");
    }

    #[test]
    fn renders_an_rdma_port_event() {
        use crate::detect::{Evidence, Metric, Reference, Scope, VerdictChange, VerdictKind, PORT_JOB};
        let mut v = crate::events::tests::verdict(1, VerdictKind::Congestion, "10.77.0.3");
        v.job = PORT_JOB.into();
        v.scope = Scope::RdmaPort { device: "mlx5_0".into(), port: 1 };
        v.evidence = vec![Evidence {
            metric: Metric::CnpSentPerS,
            value: 5000.0,
            reference: 10.0,
            reference_kind: Reference::OwnBaseline,
            mad: 0.0,
            peers: None,
            windows: Default::default(),
        }];
        let mut log = crate::events::EventLog::new(8, 8);
        log.apply(&[VerdictChange::Opened(v)], &crate::clock::Clock { mono_ns: 1, unix_ms: 1_700_000_000_000 });
        let state = sample_state().with_events(crate::analysis::EventsSnapshot { log, jobs: Vec::new(), rdma: None, queues: None });
        let text = render_events(&api::events_of(&state.events(), true, 10));
        assert!(text.contains("rdma port mlx5_0/1") && text.contains("@rdma-ports") && text.contains("cnp-sent=5000/s (ref 10/s)"), "{text}");
    }
}
