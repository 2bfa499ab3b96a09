//! The `ringside` command line, one module per subcommand: [`agent`] runs the agent; [`flows`],
//! [`status`], [`events`] and [`jobs`] read or change a running agent through
//! [`ringside_client::OperatorClient`] and print aligned tables (or, with `--json`, the response);
//! [`fleet`] reads the agents of many hosts and judges their verdicts together; [`detach`]
//! removes a leftover attachment; [`ipu_wire`] runs the emulated IPU's forwarder; [`check_config`] validates a config file the way the
//! agent reads it; [`completions`] and [`man`] generate shell completions and man pages from the
//! clap definition. `main.rs` parses the arguments, sets up logging ([`init_logging`]) and calls
//! the subcommand's `run`.
//!
//! This module holds what the subcommands share: how to reach the agent ([`AgentConn`]), the
//! operator token ([`resolve_token`]: `--token`, else `RINGSIDE_TOKEN`, else the file the agent
//! writes, `<state_dir>/operator.token`), the errors an operator sees ([`CliError`], each saying
//! what to do), and the table printer.
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use ringside_client::{ClientConfig, ClientError, OperatorClient};

use crate::config::{DEFAULT_LISTEN, DEFAULT_STATE_DIR};

pub mod agent;
pub mod check_config;
pub mod completions;
pub mod detach;
pub mod events;
pub mod fleet;
pub mod flows;
pub mod ipu_wire;
pub mod jobs;
pub mod man;
pub mod status;

/// `--log-format` / `RINGSIDE_LOG_FORMAT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colours on a terminal).
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields), for journald/Fluent Bit/Loki.
    Json,
}

/// Logs to stderr in `format`, filtered by `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        // Flattened: a record's fields sit beside `message`, not under `fields`.
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).with_span_list(false).init(),
    }
}

/// Default agent URL for the CLI.
pub fn default_agent_url() -> String {
    format!("http://{DEFAULT_LISTEN}")
}

/// One request per command: a short bound on the whole request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// What can go wrong running a subcommand. The messages tell the operator what to do.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach the agent at {url}: {message}; is the agent running? start it with `ringside agent --iface IF` (or pass --agent URL)")]
    Unreachable { url: String, message: String },
    #[error("the agent at {url} answered {status}: {message}{hint}", hint = status_hint(*status))]
    Status { url: String, status: u16, message: String },
    #[error("no operator token: pass --token TOKEN, set RINGSIDE_TOKEN, or run where the agent's {path} is readable (as root on the agent's host, or --state-dir DIR); with [api] operator_tokens_file, use a token from that file")]
    NoToken { path: PathBuf },
    #[error("cannot read the operator token from {path}: {source}; pass --token or set RINGSIDE_TOKEN")]
    TokenFile { path: PathBuf, source: std::io::Error },
    #[error("the agent at {url} sent a response this ringside does not understand ({message}); are the CLI and agent the same version?")]
    Decode { url: String, message: String },
    /// A bad `--agent` URL or job id, as the client library words it.
    #[error(transparent)]
    Client(ClientError),
    #[error("--constraints is not valid constraints JSON (see docs/openapi.json, Constraints)")]
    Constraints(#[source] serde_json::Error),
    #[error("detaching from {iface}")]
    Detach {
        iface: String,
        #[source]
        source: crate::loader::LoaderError,
    },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Agent(#[from] crate::agent::AgentError),
    #[error(transparent)]
    Privileges(#[from] crate::privileges::PrivilegeError),
    #[error("cannot write {path}: {source}; check that the directory exists and is writable")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Wire(#[from] crate::ipuwire::WireError),
    #[error("cannot start the async runtime or signal handlers: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("printing JSON")]
    Json(#[from] serde_json::Error),
    /// `ringside fleet`'s arguments or reads.
    #[error("{0}")]
    Fleet(String),
}

fn status_hint(status: u16) -> &'static str {
    match status {
        401 => " (check the token: --token, RINGSIDE_TOKEN or <state_dir>/operator.token)",
        403 => " (this token may not read that; the operator token reads everything)",
        _ => "",
    }
}

impl From<ClientError> for CliError {
    /// The client library's transport, status and decoding errors in the CLI's words (which name
    /// the CLI's own flags); the rest as the library says them.
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Transport { url, source } => CliError::Unreachable { url, message: source.to_string() },
            ClientError::Status { url, status, message } => CliError::Status { url, status, message },
            ClientError::Json { url, source } => CliError::Decode { url, message: source.to_string() },
            other => CliError::Client(other),
        }
    }
}

/// The operator token: `explicit` (`--token` / `RINGSIDE_TOKEN`, already merged by clap), else the
/// first token line of `<state_dir>/operator.token`.
pub fn resolve_token(explicit: Option<&str>, state_dir: &Path) -> Result<String, CliError> {
    if let Some(t) = explicit.map(str::trim).filter(|t| !t.is_empty()) {
        return Ok(t.to_owned());
    }
    let path = state_dir.join(crate::auth::OPERATOR_TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .ok_or(CliError::NoToken { path }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CliError::NoToken { path }),
        Err(source) => Err(CliError::TokenFile { path, source }),
    }
}

/// An [`OperatorClient`] for `agent` with the CLI's timeouts (5 s per request).
pub fn operator_client(agent: &str, token: &str) -> Result<OperatorClient, CliError> {
    let config = ClientConfig { connect_timeout: REQUEST_TIMEOUT, request_timeout: REQUEST_TIMEOUT, ..ClientConfig::default() };
    Ok(OperatorClient::with_config(agent, token, config)?)
}

/// How the CLI authenticates to the agent.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// Operator token [default: read from <state-dir>/operator.token].
    #[arg(long, env = "RINGSIDE_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    pub token: Option<String>,
    /// The agent's state directory, where it wrote operator.token.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

impl TokenArgs {
    /// Runs `read` (one request) with the operator token. Without a token the request is still
    /// made, so an unreachable agent is reported as such; a 401 then explains where the token
    /// comes from.
    pub fn read<T>(&self, agent: &str, read: impl FnOnce(&OperatorClient) -> Result<T, ClientError>) -> Result<T, CliError> {
        let token = resolve_token(self.token.as_deref(), &self.state_dir);
        let client = operator_client(agent, token.as_deref().unwrap_or(""))?;
        read(&client).map_err(|e| match (CliError::from(e), token) {
            (CliError::Status { status: 401, .. }, Err(missing)) => missing,
            (e, _) => e,
        })
    }
}

/// The agent to talk to and the operator token (the `jobs` subcommands).
#[derive(Debug, Clone, clap::Args)]
pub struct AgentConn {
    /// The agent's base URL.
    #[arg(long, default_value_t = default_agent_url())]
    pub agent: String,
    #[command(flatten)]
    pub auth: TokenArgs,
}

impl AgentConn {
    /// An operator client; a missing token is an error before any request.
    pub fn client(&self) -> Result<OperatorClient, CliError> {
        let token = resolve_token(self.auth.token.as_deref(), &self.auth.state_dir)?;
        operator_client(&self.agent, &token)
    }
}

/// How a unit enum variant is spelled on the wire (`gray_failure`, `critical`): its serde name;
/// "-" for a value that does not serialize to a string.
pub fn wire_name(value: impl serde::Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_else(|| "-".to_owned())
}

/// Prints `value` as indented JSON (the `--json` output).
pub fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Renders rows as a table: columns padded to their widest cell, numbers right-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..header.len())
        .map(|i| !rows.is_empty() && rows.iter().all(|r| r.get(i).is_some_and(|c| c.parse::<f64>().is_ok() || c == "-")))
        .collect();
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| if numeric[i] { format!("{c:>w$}", w = widths[i]) } else { format!("{c:<w$}", w = widths[i]) })
            .collect();
        parts.join("  ").trim_end().to_owned()
    };
    let mut out = line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

/// Human-readable byte count (SI, as network rates are).
pub fn human_bytes(v: f64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = v;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0}{}", UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align() {
        let t = table(&["A", "NUM"], &[vec!["long-name".into(), "5".into()], vec!["x".into(), "12345".into()]]);
        // Numeric columns, header included, are right-aligned.
        assert_eq!(t, "A            NUM\nlong-name      5\nx          12345\n");
    }

    #[test]
    fn unreachable_agent_says_what_to_do() {
        // A port nothing listens on: bind, read the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}");
        let auth = TokenArgs { token: None, state_dir: crate::events::tests::tempdir("cli-unreachable") };
        let e = auth.read(&url, OperatorClient::status).unwrap_err().to_string();
        assert!(e.contains(&url) && e.contains("is the agent running") && e.contains("ringside agent --iface"), "{e}");
        let _ = std::fs::remove_dir_all(&auth.state_dir);
    }

    #[test]
    fn token_resolution_order_and_missing_token() {
        let dir = crate::events::tests::tempdir("client-token");
        let e = resolve_token(None, &dir).unwrap_err().to_string();
        assert!(e.contains("--token") && e.contains("RINGSIDE_TOKEN") && e.contains("operator.token"), "{e}");
        std::fs::write(dir.join(crate::auth::OPERATOR_TOKEN_FILE), "# generated\nrso_abc\n").unwrap();
        assert_eq!(resolve_token(None, &dir).unwrap(), "rso_abc");
        assert_eq!(resolve_token(Some(" rso_flag "), &dir).unwrap(), "rso_flag");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(999.0), "999B");
        assert_eq!(human_bytes(1_500_000.0), "1.5MB");
    }
}
