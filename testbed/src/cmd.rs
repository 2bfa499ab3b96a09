//! Running the iproute2 / nftables tools. Every rig change goes through here so a missing tool or a
//! failed command becomes a structured [`Error`] that says what to install or what failed.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// The external programs the testbed shells out to, with the Debian package that provides each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Ip,
    Nft,
    Tc,
    Ethtool,
    Sh,
    Mpicc,
}

impl Tool {
    pub fn program(self) -> &'static str {
        match self {
            Tool::Ip => "ip",
            Tool::Nft => "nft",
            Tool::Tc => "tc",
            Tool::Ethtool => "ethtool",
            Tool::Sh => "sh",
            Tool::Mpicc => "mpicc",
        }
    }

    pub fn package(self) -> &'static str {
        match self {
            Tool::Ip | Tool::Tc => "iproute2",
            Tool::Nft => "nftables",
            Tool::Ethtool => "ethtool",
            Tool::Sh => "dash",
            Tool::Mpicc => "libopenmpi-dev",
        }
    }
}

/// Fails with [`Error::NotRoot`] unless the effective uid is 0.
pub fn require_root() -> Result<()> {
    let euid = nix::unistd::geteuid().as_raw();
    if euid != 0 {
        return Err(Error::NotRoot { euid });
    }
    Ok(())
}

pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` (a `tool` invocation) to completion, feeding it `stdin` if given, and returns stdout.
pub(crate) fn run(tool: Tool, cmd: &mut Command, stdin: Option<&str>) -> Result<String> {
    let command = describe(cmd);
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    tracing::debug!(%command, "run");
    let mut child = cmd.spawn().map_err(|source| spawn_error(tool, &command, source))?;
    if let Some(input) = stdin {
        // Take the pipe so it is closed (EOF) before we wait.
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(input.as_bytes())
            .map_err(|source| Error::Spawn { command: command.clone(), source })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| Error::Spawn { command: command.clone(), source })?;
    if !out.status.success() {
        let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if let Some(input) = stdin {
            stderr.push_str(&format!(" [input: {}]", input.trim()));
        }
        return Err(Error::CommandFailed { command, status: out.status.to_string(), stderr });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn spawn_error(tool: Tool, command: &str, source: std::io::Error) -> Error {
    if source.kind() == std::io::ErrorKind::NotFound {
        Error::ToolMissing { tool: tool.program(), package: tool.package() }
    } else {
        Error::Spawn { command: command.to_string(), source }
    }
}

/// `ip` in the root namespace (used for commands that name namespaces explicitly, like
/// `ip link add eth0 netns A type veth peer name p0 netns S`).
pub(crate) fn ip(args: &[&str]) -> Result<String> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    run(Tool::Ip, &mut cmd, None)
}

/// `ip -batch -`: many commands, one process.
pub(crate) fn ip_batch(netns: Option<&str>, script: &str) -> Result<String> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    cmd.args(["-batch", "-"]);
    run(Tool::Ip, &mut cmd, Some(script))
}

/// Polls `not_ready` every 20 ms until it reports readiness (`Ok(None)`), at most `timeout` (and at
/// most 1000 attempts); the timeout error carries the last reason it was not ready.
pub(crate) fn wait_until_ready(
    what: &str,
    timeout: std::time::Duration,
    mut not_ready: impl FnMut() -> Result<Option<String>>,
) -> Result<()> {
    let start = std::time::Instant::now();
    let mut detail = String::new();
    for _attempt in 0..1000 {
        match not_ready() {
            Ok(None) => return Ok(()),
            Ok(Some(why)) => detail = why,
            Err(e) => detail = e.to_string(),
        }
        if start.elapsed() >= timeout {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(Error::Timeout { what: what.into(), waited: start.elapsed(), detail })
}

/// Parses the JSON output of `command` (`ip -j`, `nft -j`, `tc -j`).
pub(crate) fn parse_json(command: &str, out: &str) -> Result<serde_json::Value> {
    serde_json::from_str(out).map_err(|e| Error::BadOutput { command: command.into(), detail: e.to_string() })
}
