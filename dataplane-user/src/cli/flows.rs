//! `ringside flows`: the agent's top flows by bytes (`GET /v1/flows`).
use ringside_client::FlowsResponse;

use super::{default_agent_url, human_bytes, print_json, table, CliError, TokenArgs};

#[derive(Debug, Clone, clap::Args)]
pub struct FlowsArgs {
    /// How many flows (1-1000).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// The agent's base URL.
    #[arg(long, default_value_t = default_agent_url())]
    pub agent: String,
    /// Print the raw JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub auth: TokenArgs,
}

pub fn run(args: FlowsArgs) -> Result<(), CliError> {
    let r = args.auth.read(&args.agent, |c| c.flows(args.limit))?;
    if args.json {
        print_json(&r)
    } else {
        print!("{}", render_flows(&r));
        Ok(())
    }
}

/// The `ringside flows` table.
pub fn render_flows(r: &FlowsResponse) -> String {
    let rows: Vec<Vec<String>> = r
        .flows
        .iter()
        .map(|f| {
            let anomalies = match (&f.tcp, &f.roce) {
                (Some(t), _) => format!("retrans={}", t.retransmissions),
                (_, Some(x)) => format!("psn_gaps={} cnps={} naks={}", x.psn_gap_packets, x.cnps, x.naks),
                _ => String::new(),
            };
            vec![
                f.interface.clone(),
                f.direction.clone(),
                f.kind.clone(),
                format!("{}:{}", f.src_addr, f.src_port),
                format!("{}:{}", f.dst_addr, f.dst_port),
                f.packets.to_string(),
                f.bytes.to_string(),
                format!("{}/s", human_bytes(f.rates.ewma_bytes_per_second)),
                f.bursts.count.to_string(),
                if f.ce_marks > 0 { format!("ce={} {anomalies}", f.ce_marks) } else { anomalies },
            ]
        })
        .collect();
    let mut out = table(&["IFACE", "DIR", "KIND", "SOURCE", "DESTINATION", "PACKETS", "BYTES", "RATE(EWMA)", "BURSTS", "ANOMALIES"], &rows);
    out.push_str(&format!("{} of {} flows (top by bytes)\n", r.flows.len(), r.total_flows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{api, metrics::tests::sample_state};

    #[test]
    fn renders_flows() {
        let state = sample_state();
        let t = state.collector();
        let flows = FlowsResponse {
            total_flows: 2,
            limit: 20,
            flows: t.top_flows.iter().take(20).map(|e| api::flow_view(e, &state.attach, t.last_poll_mono_ns)).collect(),
        };
        let text = render_flows(&flows);
        assert!(text.contains("10.77.0.1:40000") && text.contains("psn_gaps=5 cnps=7") && text.contains("retrans=3"), "{text}");
        assert!(text.contains("2 of 2 flows"));
    }
}
