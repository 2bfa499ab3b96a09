//! `ringside`: the agent and its command-line client.
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use dataplane_user::{
    agent::{self, AgentArgs, AgentSettings},
    api::{EventsResponse, FlowsResponse, StatusResponse},
    client,
    config::{ConfigFile, DEFAULT_PIN_DIR, DEFAULT_STATE_DIR},
    loader,
};

/// ringside watches collective-communication traffic (TCP and RoCEv2) on the provider's side of
/// the wire and reports per-flow, per-peer and per-interface counters.
///
/// Quick start (as root):
///   ringside agent --iface eth0          # attach and serve on 127.0.0.1:9464
///   ringside flows --limit 10            # top flows by bytes
///   ringside status                      # attached interfaces, data-plane counters, poll age
///   ringside events --all                # detection events (congestion, gray failure, straggler)
///   curl -s 127.0.0.1:9464/metrics       # Prometheus / OpenMetrics text
///
/// flows, status and events need the operator token: --token, RINGSIDE_TOKEN, or the file the
/// agent writes, /var/lib/ringside/operator.token (readable by root only).
///
/// Logging: RUST_LOG=info (default), RUST_LOG=debug for more.
#[derive(Debug, Parser)]
#[command(name = "ringside", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(verbatim_doc_comment)]
    Agent(AgentArgs),
    /// Print the agent's top flows by bytes.
    ///
    /// Examples:
    ///   ringside flows
    ///   ringside flows --limit 50 --agent http://10.0.0.5:9464
    ///   ringside flows --json | jq '.flows[] | select(.kind == "rocev2")'
    #[command(verbatim_doc_comment)]
    Flows {
        /// How many flows (1-1000).
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// The agent's base URL.
        #[arg(long, default_value_t = client::default_agent_url())]
        agent: String,
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        auth: TokenArgs,
    },
    /// Print the agent's attached interfaces, data-plane counters, flows tracked and poll age.
    ///
    /// Example:
    ///   ringside status --agent http://127.0.0.1:9464
    #[command(verbatim_doc_comment)]
    Status {
        /// The agent's base URL.
        #[arg(long, default_value_t = client::default_agent_url())]
        agent: String,
        /// Print the raw JSON instead of a report.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        auth: TokenArgs,
    },
    /// Print the agent's detection events: open ones, and with --all the recently closed ones.
    ///
    /// Examples:
    ///   ringside events
    ///   ringside events --all --agent http://10.0.0.5:9464
    ///   ringside events --json | jq '.events[] | select(.kind == "gray_failure") | .scope'
    #[command(verbatim_doc_comment)]
    Events {
        /// The agent's base URL.
        #[arg(long, default_value_t = client::default_agent_url())]
        agent: String,
        /// Also list recently closed events.
        #[arg(long)]
        all: bool,
        /// How many events at most (1-1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        auth: TokenArgs,
    },
    /// Register, list and delete jobs (operator token). A registered job's tenant gets hints at
    /// /v1/jobs/ID/hints with the tenant token printed once by `register`.
    ///
    /// Examples:
    ///   ringside jobs register --name llama-7 --member 10.77.0.0/24 --tcp-ports 29500-29510
    ///   ringside jobs register --name j2 --member 10.0.0.2 --member 10.0.0.3 --constraints '{"codecs":["fp16"],"max_channels":4}'
    ///   ringside jobs list
    ///   ringside jobs delete j-3f9a0c1b2d4e
    #[command(verbatim_doc_comment)]
    Jobs {
        #[command(subcommand)]
        action: JobsCommand,
    },
    /// Remove a leftover attachment (after the agent was killed with SIGKILL in clsact mode).
    ///
    /// Removes the `flowmon` tc filters from ingress and egress of the interface and the map pins.
    /// The clsact qdisc stays unless --remove-qdisc is given (deleting it also deletes any other
    /// tc filter on that interface's clsact hook).
    ///
    /// Examples:
    ///   ringside detach --iface eth0
    ///   ringside detach --iface eth0 --pin-dir /sys/fs/bpf/ringside-test --remove-qdisc
    #[command(verbatim_doc_comment)]
    Detach {
        /// Interface to clean up.
        #[arg(long = "iface", value_name = "IF", required = true)]
        interfaces: Vec<String>,
        /// Pin directory the agent used.
        #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR)]
        pin_dir: PathBuf,
        /// Also delete the clsact qdisc.
        #[arg(long)]
        remove_qdisc: bool,
    },
}

#[derive(Debug, Subcommand)]
enum JobsCommand {
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
        tcp_ports: Vec<ringside_client::PortRange>,
        /// UDP / RoCEv2 port range; repeatable.
        #[arg(long = "udp-ports", value_name = "RANGE")]
        udp_ports: Vec<ringside_client::PortRange>,
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
        conn: Conn,
    },
    /// List registered jobs (never tokens).
    List {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        conn: Conn,
    },
    /// Delete a registered job: its hint streams end and its tenant token stops working.
    Delete {
        /// The job id (`j-...`).
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

/// The agent to talk to and the operator token.
#[derive(Debug, Clone, clap::Args)]
struct Conn {
    /// The agent's base URL.
    #[arg(long, default_value_t = client::default_agent_url())]
    agent: String,
    #[command(flatten)]
    auth: TokenArgs,
}

impl Conn {
    fn call(&self, method: &str, path: &str, body: Option<&str>, expect: u16) -> Result<String, client::ClientError> {
        let token = client::resolve_token(self.auth.token.as_deref(), &self.auth.state_dir)?;
        client::call_expecting(&self.agent, Some(&token), method, path, body, expect)
    }
}

/// How the CLI authenticates to the agent.
#[derive(Debug, Clone, clap::Args)]
struct TokenArgs {
    /// Operator token [default: read from <state-dir>/operator.token].
    #[arg(long, env = "RINGSIDE_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    token: Option<String>,
    /// The agent's state directory, where it wrote operator.token.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
}

impl TokenArgs {
    /// GETs `path` with the operator token. Without a token the request is still made, so an
    /// unreachable agent is reported as such; a 401 then explains where the token comes from.
    fn get<T: serde::de::DeserializeOwned>(&self, agent: &str, path: &str) -> Result<T, client::ClientError> {
        let token = client::resolve_token(self.token.as_deref(), &self.state_dir);
        client::get_json(agent, token.as_deref().ok(), path).map_err(|e| match (e, token) {
            (client::ClientError::Status { status: 401, .. }, Err(missing)) => missing,
            (e, _) => e,
        })
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Agent(args) => {
            let file = match &args.config {
                Some(path) => ConfigFile::load(path)?,
                None => ConfigFile::default(),
            };
            let settings = AgentSettings::resolve(&file, &args)?;
            agent::run(settings)?;
        }
        Command::Flows { limit, agent, json, auth } => {
            let r: FlowsResponse = auth.get(&agent, &format!("/v1/flows?limit={limit}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", client::render_flows(&r));
            }
        }
        Command::Status { agent, json, auth } => {
            let r: StatusResponse = auth.get(&agent, "/v1/status")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", client::render_status(&r));
            }
        }
        Command::Events { agent, all, limit, json, auth } => {
            let state = if all { "all" } else { "open" };
            let r: EventsResponse = auth.get(&agent, &format!("/v1/events?state={state}&limit={limit}"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", client::render_events(&r));
            }
        }
        Command::Jobs { action } => jobs(action)?,
        Command::Detach { interfaces, pin_dir, remove_qdisc } => {
            for iface in &interfaces {
                let r = loader::detach_leftover(iface, &pin_dir, remove_qdisc)
                    .with_context(|| format!("detaching from {iface}"))?;
                if r.filters_removed.is_empty() && r.pins_removed.is_empty() && !r.qdisc_removed {
                    println!("{iface}: nothing of ringside's was attached");
                } else {
                    println!(
                        "{iface}: removed flowmon from [{}], {} pins from {}{}",
                        r.filters_removed.join(", "),
                        r.pins_removed.len(),
                        pin_dir.display(),
                        if r.qdisc_removed { ", and the clsact qdisc" } else { "" }
                    );
                }
            }
        }
    }
    Ok(())
}

fn jobs(action: JobsCommand) -> anyhow::Result<()> {
    match action {
        JobsCommand::Register { name, members, tcp_ports, udp_ports, gradient_bytes, constraints, json, conn } => {
            let constraints = match constraints {
                Some(c) => serde_json::from_str(&c).context("--constraints is not valid constraints JSON (see docs/openapi.json, Constraints)")?,
                None => Default::default(),
            };
            let reg = ringside_client::JobRegistration { name, members, tcp_ports, udp_ports, gradient_bytes, constraints };
            let body = conn.call("POST", "/v1/jobs", Some(&serde_json::to_string(&reg)?), 201)?;
            let created: ringside_client::JobCreated = serde_json::from_str(&body).context("decoding the agent's answer")?;
            if json {
                println!("{body}");
            } else {
                println!("registered job {} ({})", created.id, created.name);
                println!("tenant token: {}", created.tenant_token);
                println!("give the tenant the id and the token; the token is shown only now (the agent keeps its hash)");
            }
        }
        JobsCommand::List { json, conn } => {
            let body = conn.call("GET", "/v1/jobs", None, 200)?;
            let r: dataplane_user::api::JobsResponse = serde_json::from_str(&body).context("decoding the agent's answer")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", client::render_jobs(&r));
            }
        }
        JobsCommand::Delete { id, conn } => {
            conn.call("DELETE", &format!("/v1/jobs/{id}"), None, 204)?;
            println!("deleted job {id}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
        let c = Cli::try_parse_from(["ringside", "agent", "--iface", "a", "--iface", "b", "--listen", "127.0.0.1:1"]).unwrap();
        match c.command {
            Command::Agent(a) => assert_eq!(a.interfaces, vec!["a", "b"]),
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["ringside", "detach"]).is_err(), "--iface is required");
        let c = Cli::try_parse_from(["ringside", "jobs", "register", "--name", "a", "--member", "10.0.0.1", "--tcp-ports", "1-2", "--token", "t"]).unwrap();
        match c.command {
            Command::Jobs { action: JobsCommand::Register { tcp_ports, conn, .. } } => {
                assert_eq!(tcp_ports, vec![ringside_client::PortRange { lo: 1, hi: 2 }]);
                assert_eq!(conn.auth.token.as_deref(), Some("t"));
            }
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["ringside", "jobs", "register", "--name", "a"]).is_err(), "--member is required");
    }
}
