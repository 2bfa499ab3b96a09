//! The error every collective and transport operation returns.

use crate::plan::PlanError;
use crate::wire::FrameError;
use std::net::SocketAddr;
use std::sync::Arc;

/// A failed collective or connection setup. Cloneable so one transport failure can be reported to
/// every pending and later call on the same communicator.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CollectiveError {
    #[error("cannot listen on {addr}: {source}; is the port free and the address local?")]
    Listen { addr: SocketAddr, source: Arc<std::io::Error> },

    #[error("could not connect to rank {peer} at {addr} within {waited_ms} ms (last error: {last_error}); check that the rank is running and that --peers is identical on every rank")]
    ConnectTimeout { peer: usize, addr: SocketAddr, waited_ms: u64, last_error: String },

    #[error("only {connected} of {expected} inbound connections arrived within {waited_ms} ms; ranks above this one did not start or cannot reach it")]
    AcceptTimeout { connected: usize, expected: usize, waited_ms: u64 },

    #[error("handshake with {addr} rejected: {reason}")]
    Handshake { addr: SocketAddr, reason: String },

    #[error("rank {peer} disconnected on channel {channel} without closing; the peer process probably died or its link went down")]
    PeerDisconnected { peer: usize, channel: usize },

    #[error("rank {peer} closed channel {channel} while this rank still expected data in collective {op}; ranks ran different sequences of collectives")]
    PeerClosed { peer: usize, channel: usize, op: u64 },

    #[error("no frame from rank {peer} on channel {channel} for {waited_ms} ms in collective {op}; the peer is stalled, or --timeout-ms is shorter than the slowest rank's compute phase")]
    Timeout { peer: usize, channel: usize, op: u64, waited_ms: u64 },

    #[error("i/o error with rank {peer} on channel {channel}: {source}")]
    Io { peer: usize, channel: usize, source: Arc<std::io::Error> },

    #[error("garbage from rank {peer} on channel {channel}: {error}")]
    BadFrame { peer: usize, channel: usize, error: FrameError },

    #[error("unexpected frame from rank {peer} on channel {channel}: {field} is {got}, expected {expected}")]
    UnexpectedFrame { peer: usize, channel: usize, field: &'static str, expected: u64, got: u64 },

    #[error("this rank called a collective with {field} = {local} but rank 0 announced {announced}; every rank must issue the same collectives in the same order")]
    CollectiveMismatch { field: &'static str, local: u64, announced: u64 },

    #[error("rank {peer} sent data for collective {op} with {field} = {got} where this rank's call expects {expected}: rank {peer} started that collective on rank 0's plan promise with a different call and reports the mismatch itself; every rank must issue the same collectives in the same order")]
    PeerCallMismatch { peer: usize, op: u64, field: &'static str, expected: u64, got: u64 },

    #[error("rank 0's control header for collective {op} carries a different plan than the one it promised with the previous collective; every rank must run the same ringside build")]
    PlanPromiseBroken { op: u64 },

    #[error("invalid plan: {0}")]
    InvalidPlan(#[from] PlanError),

    #[error("invalid argument {name}: {reason}")]
    InvalidArgument { name: &'static str, reason: String },

    #[error("--transport rdma needs a build with the `rdma` cargo feature (`cargo xtask setup`, then `cargo build --release -p ipu-firmware --features rdma`); or use --transport tcp")]
    RdmaNotBuilt,

    #[error("no RDMA device ({reason}); use --transport auto to fall back to TCP, or --transport tcp")]
    NoRdmaDevice { reason: String },

    #[error("RDMA {what} failed: {source}; check the device with `ibv_devinfo` and the memlock limit (`ulimit -l`)")]
    RdmaSetup { what: &'static str, source: Arc<std::io::Error> },

    /// Managed mode (`ringside-rank --managed`): the call to this host's IPU service failed.
    #[error(transparent)]
    Managed(#[from] crate::managed::ManagedError),

    #[error("communicator is unusable after an earlier failure: {cause}")]
    Poisoned { cause: Box<CollectiveError> },
}

impl CollectiveError {
    pub(crate) fn io(peer: usize, channel: usize, e: std::io::Error) -> Self {
        CollectiveError::Io { peer, channel, source: Arc::new(e) }
    }
}

pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;
