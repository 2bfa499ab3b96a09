//! `ringside`: the agent and its command-line client. This file only parses the arguments and
//! dispatches; each subcommand lives in `dataplane_user::cli`.
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use dataplane_user::{
    agent::AgentArgs,
    cli::{
        self, check_config::CheckConfigArgs, completions::CompletionsArgs, detach::DetachArgs, events::EventsArgs, fleet::FleetArgs,
        flows::FlowsArgs, ipu_wire::IpuWireArgs, jobs::JobsCommand, man::ManArgs, status::StatusArgs, LogFormat,
    },
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
/// Logging: RUST_LOG=info (default), RUST_LOG=debug for more; --log-format json for one JSON
/// object per line.
#[derive(Debug, Parser)]
#[command(name = "ringside", version, verbatim_doc_comment)]
struct Cli {
    /// Log format on stderr: text (for people) or json (one object per line, for log shippers).
    #[arg(long, global = true, value_enum, env = "RINGSIDE_LOG_FORMAT", default_value_t = LogFormat::Text)]
    log_format: LogFormat,
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
    Flows(FlowsArgs),
    /// Print the agent's attached interfaces, data-plane counters, flows tracked and poll age.
    ///
    /// Example:
    ///   ringside status --agent http://127.0.0.1:9464
    #[command(verbatim_doc_comment)]
    Status(StatusArgs),
    /// Print the agent's detection events: open ones, and with --all the recently closed ones.
    ///
    /// Examples:
    ///   ringside events
    ///   ringside events --all --agent http://10.0.0.5:9464
    ///   ringside events --json | jq '.events[] | select(.kind == "gray_failure") | .scope'
    #[command(verbatim_doc_comment)]
    Events(EventsArgs),
    /// The provider's fleet view: read the events of the agents of many hosts (one agent per
    /// host's IPU/DPU or NIC, each seeing only its own host) and name the hosts they blame
    /// together.
    ///
    /// An agent that sees one host cannot tell a fault on its own host's cable from one on a
    /// peer's: both slow the connection between them. A blame of a host is repeated unless that
    /// host's agent blames the accuser back in the same fault time while the accuser is named by
    /// at least as many agents, and only once a second agent agrees (or the host's own agent
    /// flags its own link), or after it stood --lone-blame-hold-ms alone; a blame on in-burst
    /// goodput alone (what a busy host looks like too) only once two agents besides the
    /// host's own name it, or a blame with loss, stall or queue evidence agrees. A straggler (a slow
    /// worker, not the network) is named only once two agents see the same host late: a slow
    /// worker is late to every peer it sends to. docs/operator-guide.md, "Fleet view".
    ///
    /// Examples:
    ///   ringside fleet --agent 10.0.0.1=http://10.1.0.1:9464 --agent 10.0.0.2=http://10.1.0.2:9464 --agent 10.0.0.3=http://10.1.0.3:9464
    ///   ringside fleet --withheld ...          # also the blames held back, and why
    ///   ringside fleet --json ... | jq '.verdicts[] | select(.ended_unix_ms == null) | .host'
    #[command(verbatim_doc_comment)]
    Fleet(FleetArgs),
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
    Detach(DetachArgs),
    /// Forward between two ports as an IPU's data path (a bump in the wire, no bridge).
    ///
    /// Attaches the `ipuwire` TC program on the ingress of both ports of this network namespace:
    /// every frame arriving on one leaves by the other. Start it before the agent, then attach the
    /// agent to the fabric port (`ringside agent --iface FABRIC`): its flow monitor runs before the
    /// forwarder on that port and sees both directions. Runs until SIGINT/SIGTERM, then detaches
    /// (frames are then dropped: an IPU without its data path passes nothing) and prints the
    /// counters as one JSON line.
    ///
    /// Example:
    ///   ip netns exec ipu0 ringside ipu-wire --host-port host0 --fabric-port fab0
    #[command(verbatim_doc_comment)]
    IpuWire(IpuWireArgs),
    /// Check a config file the way `ringside agent --config FILE` reads it, without root.
    ///
    /// Prints OK and a summary of the resolved settings, or the error naming the file, line and
    /// key; exits 0 or 1.
    ///
    /// Example:
    ///   ringside check-config /etc/ringside/ringside.toml
    #[command(verbatim_doc_comment)]
    CheckConfig(CheckConfigArgs),
    /// Print a shell completion script on stdout.
    ///
    /// Examples:
    ///   ringside completions bash > /usr/share/bash-completion/completions/ringside
    ///   ringside completions zsh > /usr/share/zsh/vendor-completions/_ringside
    ///   ringside completions fish > /usr/share/fish/vendor_completions.d/ringside.fish
    #[command(verbatim_doc_comment)]
    Completions(CompletionsArgs),
    /// Write the man pages (ringside.1 and one per subcommand, ringside-agent.1, ...).
    ///
    /// Without --out-dir, prints ringside.1 on stdout.
    ///
    /// Examples:
    ///   ringside man --out-dir /usr/share/man/man1
    ///   ringside man | man -l -
    #[command(verbatim_doc_comment)]
    Man(ManArgs),
}

fn main() -> ExitCode {
    let parsed = Cli::parse();
    let log_format = parsed.log_format;
    cli::init_logging(log_format);
    match run(parsed) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match log_format {
                LogFormat::Text => eprintln!("error: {e:#}"),
                // One JSON record like every other line, so a log shipper keeps why it stopped.
                LogFormat::Json => tracing::error!(error = %format!("{e:#}"), "ringside failed"),
            }
            ExitCode::FAILURE
        }
    }
}

fn run(parsed: Cli) -> anyhow::Result<()> {
    match parsed.command {
        Command::Agent(args) => cli::agent::run(args)?,
        Command::Flows(args) => cli::flows::run(args)?,
        Command::Status(args) => cli::status::run(args)?,
        Command::Events(args) => cli::events::run(args)?,
        Command::Fleet(args) => cli::fleet::run(args)?,
        Command::Jobs { action } => cli::jobs::run(action)?,
        Command::Detach(args) => cli::detach::run(args)?,
        Command::IpuWire(args) => cli::ipu_wire::run(args)?,
        Command::CheckConfig(args) => cli::check_config::run(args)?,
        Command::Completions(args) => cli::completions::run(args, Cli::command())?,
        Command::Man(args) => cli::man::run(args, Cli::command())?,
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
