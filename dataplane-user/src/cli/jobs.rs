//! `ringside jobs register|list|delete`: jobs registered through the agent's API
//! (`POST /v1/jobs`, `GET /v1/jobs`, `DELETE /v1/jobs/{id}`, operator token).
use ringside_client::{JobRegistration, JobsResponse, PortRange};

use super::{print_json, table, AgentConn, CliError};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum JobsCommand {
    /// Register a job; prints its id and tenant token (shown only once).
    Register {
        /// Job name, 1-64 characters of A-Z a-z 0-9 . _ - (unique).
        #[arg(long)]
        name: String,
        /// A member host or prefix ("10.77.0.2", "10.77.0.0/24"); repeat for several.
        #[arg(long = "member", value_name = "ADDR_OR_CIDR", required = true)]
        members: Vec<String>,
        /// TCP port range of the collective traffic ("29500" or "29500-29510"); repeatable.
        #[arg(long = "tcp-ports", value_name = "RANGE")]
        tcp_ports: Vec<PortRange>,
        /// UDP / RoCEv2 port range; repeatable.
        #[arg(long = "udp-ports", value_name = "RANGE")]
        udp_ports: Vec<PortRange>,
        /// Bytes reduced per step (the gradient buffer).
        #[arg(long)]
        gradient_bytes: Option<u64>,
        /// Constraints as JSON, e.g. '{"codecs":["fp16","int8"],"max_channels":4}' [default: allow all].
        #[arg(long, value_name = "JSON")]
        constraints: Option<String>,
        /// Print the raw JSON answer.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: AgentConn,
    },
    /// List registered jobs (never tokens).
    List {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: AgentConn,
    },
    /// Delete a registered job: its hint streams end and its tenant token stops working.
    Delete {
        /// The job id (`j-...`).
        id: String,
        #[command(flatten)]
        conn: AgentConn,
    },
}

pub fn run(action: JobsCommand) -> Result<(), CliError> {
    match action {
        JobsCommand::Register { name, members, tcp_ports, udp_ports, gradient_bytes, constraints, json, conn } => {
            let constraints = match constraints {
                Some(c) => serde_json::from_str(&c).map_err(CliError::Constraints)?,
                None => Default::default(),
            };
            let reg = JobRegistration { name, members, tcp_ports, udp_ports, gradient_bytes, constraints };
            let created = conn.client()?.register(&reg)?;
            if json {
                // The answer as the agent sent it: compact, as `JobCreated` serializes.
                println!("{}", serde_json::to_string(&created)?);
            } else {
                println!("registered job {} ({})", created.id, created.name);
                println!("tenant token: {}", created.tenant_token);
                println!("give the tenant the id and the token; the token is shown only now (the agent keeps its hash)");
            }
        }
        JobsCommand::List { json, conn } => {
            let r = conn.client()?.jobs()?;
            if json {
                print_json(&r)?;
            } else {
                print!("{}", render_jobs(&r));
            }
        }
        JobsCommand::Delete { id, conn } => {
            conn.client()?.delete(&id)?;
            println!("deleted job {id}");
        }
    }
    Ok(())
}

/// Renders `GET /v1/jobs`.
pub fn render_jobs(r: &JobsResponse) -> String {
    let rows: Vec<Vec<String>> = r
        .jobs
        .iter()
        .map(|j| {
            let ports: Vec<String> = j.tcp_ports.iter().map(|p| format!("tcp/{p}")).chain(j.udp_ports.iter().map(|p| format!("udp/{p}"))).collect();
            vec![j.id.clone(), j.name.clone(), j.members.join(","), if ports.is_empty() { "any".into() } else { ports.join(",") }]
        })
        .collect();
    let mut out = table(&["ID", "NAME", "MEMBERS", "PORTS"], &rows);
    out.push_str(&format!("{} registered", r.jobs.len()));
    if !r.config_jobs.is_empty() {
        out.push_str(&format!("; from the config file: {}", r.config_jobs.join(", ")));
    }
    out.push('\n');
    out
}
