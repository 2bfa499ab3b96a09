//! The one error type of the testbed library. Messages are lowercase and say what to do.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while building a rig, injecting a fault or moving traffic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("run as root (CAP_NET_ADMIN and CAP_SYS_ADMIN are needed to create network namespaces); effective uid is {euid}")]
    NotRoot { euid: u32 },

    #[error("`{tool}` was not found on PATH: install it with `apt-get install -y {package}`")]
    ToolMissing { tool: &'static str, package: &'static str },

    #[error("`{command}` failed with {status}: {stderr}")]
    CommandFailed { command: String, status: String, stderr: String },

    #[error("could not start `{command}`: {source}")]
    Spawn { command: String, #[source] source: std::io::Error },

    #[error("entering network namespace {netns}: {source} (is it still there? see `ip netns list`)")]
    Setns { netns: String, #[source] source: std::io::Error },

    #[error("{what} did not happen within {waited:?}: {detail}")]
    Timeout { what: String, waited: Duration, detail: String },

    #[error("host index {index} is out of range: the star has {hosts} hosts")]
    NoSuchHost { index: usize, hosts: usize },

    #[error("invalid {field}: {reason}")]
    InvalidArgument { field: &'static str, reason: String },

    #[error("{op} {addr}: {source}")]
    Socket { op: &'static str, addr: String, #[source] source: std::io::Error },

    #[error("reading or writing {path}: {source}")]
    File { path: PathBuf, #[source] source: std::io::Error },

    #[error("unexpected output from `{command}`: {detail}")]
    BadOutput { command: String, detail: String },

    #[error("{binary} not found: build it (`cargo build -p ipu-firmware`) or pass --rank-bin PATH")]
    RankBinaryMissing { binary: PathBuf },

    #[error("python {python} not found: run `cargo xtask setup` (it installs PyTorch into <workspace>/target/venv), or point RINGSIDE_PYTHON (or --python) at a Python that has torch")]
    PythonMissing { python: PathBuf },

    #[error("rank {rank} failed: {detail} (see its log {log})")]
    RankFailed { rank: usize, detail: String, log: PathBuf },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn file(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::File { path: path.into(), source }
    }
}
