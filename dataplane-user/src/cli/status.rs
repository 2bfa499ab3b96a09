//! `ringside status`: the agent's attached interfaces, data-plane counters, flows tracked and poll
//! age (`GET /v1/status`).
use ringside_client::StatusResponse;

use super::{default_agent_url, print_json, table, CliError, TokenArgs};

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The agent's base URL.
    #[arg(long, default_value_t = default_agent_url())]
    pub agent: String,
    /// Print the raw JSON instead of a report.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub auth: TokenArgs,
}

pub fn run(args: StatusArgs) -> Result<(), CliError> {
    let r = args.auth.read(&args.agent, |c| c.status())?;
    if args.json {
        print_json(&r)
    } else {
        print!("{}", render_status(&r));
        Ok(())
    }
}

/// The `ringside status` report.
pub fn render_status(s: &StatusResponse) -> String {
    let mut out = String::new();
    match &s.not_ready_reason {
        None => out.push_str("agent: ready\n"),
        Some(r) => out.push_str(&format!("agent: NOT READY ({r})\n")),
    }
    let age = s.last_poll_age_seconds.map_or("never".to_owned(), |a| format!("{a:.2} s ago"));
    out.push_str(&format!(
        "polls: {} ({} errors), last {age}, every {:.0} ms\nflows tracked: {}\npin dir: {}\n\n",
        s.polls,
        s.poll_errors,
        s.poll_interval_seconds * 1000.0,
        s.flows_tracked,
        s.pin_dir.as_deref().unwrap_or("-"),
    ));
    let rows: Vec<Vec<String>> = s
        .interfaces
        .iter()
        .map(|i| vec![i.name.clone(), i.ifindex.to_string(), i.mode.clone(), if i.qdisc_added { "yes" } else { "no" }.to_owned()])
        .collect();
    out.push_str(&table(&["INTERFACE", "IFINDEX", "MODE", "QDISC ADDED"], &rows));
    out.push('\n');
    let rows: Vec<Vec<String>> = s.dataplane.iter().map(|(n, v)| vec![n.clone(), v.to_string()]).collect();
    out.push_str(&table(&["DATAPLANE", "PACKETS/EVENTS"], &rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{api, metrics::tests::sample_state};

    #[test]
    fn renders_status() {
        let st = render_status(&api::status_of(&sample_state()));
        assert!(st.contains("agent: ready") && st.contains("eth0") && st.contains("matched"), "{st}");
    }
}
