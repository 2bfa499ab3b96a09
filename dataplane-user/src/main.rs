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
    }
}
