//! Choosing the transport of a rank's mesh at run time (`--transport tcp|rdma|auto`): [`TransportKind`],
//! [`MeshTransport`] (the TCP mesh or, with the `rdma` cargo feature, the RDMA mesh behind one
//! [`Transport`]), and the fallback rule.
//!
//! ## The rule
//! - `tcp` (the default): [`TcpTransport`]; no RDMA code runs.
//! - `rdma`: the RDMA transport or an error. Built without the `rdma` feature:
//!   [`CollectiveError::RdmaNotBuilt`]. Built with it but no usable device (the device list is
//!   empty, or no device opens with port 1 ACTIVE): [`CollectiveError::NoRdmaDevice`]. An explicit
//!   request is never silently downgraded: a job that asked for RDMA and ran over TCP would
//!   report numbers that mean something else.
//! - `auto`: RDMA when a device is usable, else TCP, with one warning per process:
//!   `no RDMA device (<reason>); falling back to TCP`.
//!
//! `auto` is not the default because every rank of a job must end up on the same transport and the
//! decision is local: a rank that finds a device would wait for RDMA bootstrap records from ranks
//! that fell back to TCP. The RDMA bootstrap recognises a TCP hello and fails with a message naming
//! the mismatch (see [`crate::rdma`]), but only homogeneous hosts make `auto` safe.

use crate::error::{CollectiveError, Result};
use crate::transport::{InFrame, TcpOptions, TcpTransport, Transport};
use crate::wire::FrameHeader;
use serde::Serialize;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// What `--transport` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// The TCP mesh.
    #[default]
    Tcp,
    /// RDMA (RC queue pairs over ibverbs); an error if it cannot be used.
    Rdma,
    /// RDMA if a device is usable, else TCP (one warning per process).
    Auto,
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::Rdma => "rdma",
            Self::Auto => "auto",
        })
    }
}

/// Setup options of a mesh on either transport.
#[derive(Clone, Debug)]
pub struct MeshOptions {
    pub transport: TransportKind,
    /// Channels and timeout; the RDMA transport uses the same two.
    pub tcp: TcpOptions,
    /// RDMA device to use (as `ibv_devices` names it); `None` takes the first one that opens.
    pub rdma_device: Option<String>,
}

impl MeshOptions {
    pub fn tcp(channels: u8, timeout: Duration) -> Self {
        Self { transport: TransportKind::Tcp, tcp: TcpOptions { channels, timeout }, rdma_device: None }
    }
}

/// Set once the `auto` fallback warning was logged, so a process with many ranks (threads) or
/// meshes says it once.
static FALLBACK_WARNED: AtomicBool = AtomicBool::new(false);

/// The transport `kind` resolves to on this machine: [`TransportKind::Tcp`] or
/// [`TransportKind::Rdma`], never `Auto`. Runs the device probe for `rdma` and `auto`.
pub fn resolve(kind: TransportKind, rdma_device: Option<&str>) -> Result<TransportKind> {
    match kind {
        TransportKind::Tcp => Ok(TransportKind::Tcp),
        TransportKind::Rdma => probe(rdma_device).map(|_| TransportKind::Rdma),
        TransportKind::Auto => match probe(rdma_device) {
            Ok(device) => {
                tracing::info!(%device, "RDMA device found; --transport auto uses RDMA");
                Ok(TransportKind::Rdma)
            }
            Err(e) => {
                if !FALLBACK_WARNED.swap(true, Ordering::Relaxed) {
                    match &e {
                        CollectiveError::NoRdmaDevice { reason } => {
                            tracing::warn!("no RDMA device ({reason}); falling back to TCP")
                        }
                        other => tracing::warn!("RDMA unavailable ({other}); falling back to TCP"),
                    }
                }
                Ok(TransportKind::Tcp)
            }
        },
    }
}

/// Names the RDMA device this process would use, or says why there is none.
#[cfg(feature = "rdma")]
pub fn probe(rdma_device: Option<&str>) -> Result<String> {
    crate::rdma::probe(rdma_device).map_err(|reason| CollectiveError::NoRdmaDevice { reason })
}

/// Without the `rdma` feature there is never a device to use.
#[cfg(not(feature = "rdma"))]
pub fn probe(_rdma_device: Option<&str>) -> Result<String> {
    Err(CollectiveError::RdmaNotBuilt)
}

/// A rank's mesh on the transport [`resolve`] chose.
pub enum MeshTransport {
    Tcp(TcpTransport),
    #[cfg(feature = "rdma")]
    Rdma(crate::rdma::RdmaTransport),
}

impl MeshTransport {
    /// The transport actually in use ([`TransportKind::Tcp`] or [`TransportKind::Rdma`]).
    pub fn kind(&self) -> TransportKind {
        match self {
            Self::Tcp(_) => TransportKind::Tcp,
            #[cfg(feature = "rdma")]
            Self::Rdma(_) => TransportKind::Rdma,
        }
    }

    /// Puts the mesh's TCP connections under a rank's retransmission floor
    /// ([`TcpTransport::set_rto_floor`]). The RDMA mesh has no TCP data connection (its RC queue
    /// pairs retransmit in the NIC), so there it does nothing.
    pub fn set_rto_floor(&mut self, floor: &crate::rto::TcpRtoFloor) {
        match self {
            Self::Tcp(t) => t.set_rto_floor(floor),
            #[cfg(feature = "rdma")]
            Self::Rdma(_) => {
                let _ = floor;
                tracing::debug!("the RDMA mesh has no TCP data connections; transport advice (tcp_rto_min_ms) does not apply to it");
            }
        }
    }

    /// Resolves `options.transport` and builds the mesh with an already bound `listener` (the
    /// TCP transport's listener, or the RDMA transport's bootstrap listener: same addresses).
    pub fn connect(listener: TcpListener, rank: usize, peers: &[SocketAddr], options: &MeshOptions) -> Result<Self> {
        match resolve(options.transport, options.rdma_device.as_deref())? {
            #[cfg(feature = "rdma")]
            TransportKind::Rdma => {
                let o = crate::rdma::RdmaOptions { device: options.rdma_device.clone(), ..crate::rdma::RdmaOptions::from_tcp(options.tcp) };
                Ok(Self::Rdma(crate::rdma::RdmaTransport::connect(listener, rank, peers, o)?))
            }
            _ => Ok(Self::Tcp(TcpTransport::connect(listener, rank, peers, options.tcp)?)),
        }
    }

    /// Binds `0.0.0.0:<port of peers[rank]>` and builds the mesh (see [`TcpTransport::bind_and_connect`]).
    pub fn bind_and_connect(rank: usize, peers: &[SocketAddr], options: &MeshOptions) -> Result<Self> {
        let own = *peers.get(rank).ok_or_else(|| CollectiveError::InvalidArgument {
            name: "rank",
            reason: format!("rank {rank} is outside a world of {}", peers.len()),
        })?;
        let bind: SocketAddr = match own {
            SocketAddr::V4(a) => (std::net::Ipv4Addr::UNSPECIFIED, a.port()).into(),
            SocketAddr::V6(a) => (std::net::Ipv6Addr::UNSPECIFIED, a.port()).into(),
        };
        let listener = TcpListener::bind(bind)
            .map_err(|e| CollectiveError::Listen { addr: bind, source: std::sync::Arc::new(e) })?;
        Self::connect(listener, rank, peers, options)
    }
}

/// Forwards a [`Transport`] method to whichever transport is in use.
macro_rules! each {
    ($self:ident, $t:ident => $e:expr) => {
        match $self {
            MeshTransport::Tcp($t) => $e,
            #[cfg(feature = "rdma")]
            MeshTransport::Rdma($t) => $e,
        }
    };
}

impl Transport for MeshTransport {
    fn rank(&self) -> usize {
        each!(self, t => t.rank())
    }
    fn world(&self) -> usize {
        each!(self, t => t.world())
    }
    fn channels(&self) -> usize {
        each!(self, t => t.channels())
    }
    fn send(&mut self, peer: usize, channel: usize, header: FrameHeader, frame: Vec<u8>) -> Result<()> {
        each!(self, t => t.send(peer, channel, header, frame))
    }
    fn frame_buffer(&mut self, payload_capacity: usize) -> Vec<u8> {
        each!(self, t => t.frame_buffer(payload_capacity))
    }
    fn recycle(&mut self, frame: Vec<u8>) {
        each!(self, t => t.recycle(frame))
    }
    fn recv(&mut self, peer: usize, channel: usize, timeout: Duration, op: u64) -> Result<InFrame> {
        each!(self, t => t.recv(peer, channel, timeout, op))
    }
    fn recv_queued(&mut self, peer: usize, channel: usize) -> Result<Option<InFrame>> {
        each!(self, t => t.recv_queued(peer, channel))
    }
    fn set_direct_reads(&mut self, on: bool) {
        each!(self, t => t.set_direct_reads(on))
    }
    fn bytes_sent(&self) -> u64 {
        each!(self, t => t.bytes_sent())
    }
    fn close(&mut self) {
        each!(self, t => t.close())
    }
    fn abort(&mut self) {
        each!(self, t => t.abort())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_never_probes_and_explicit_rdma_is_never_downgraded() {
        assert_eq!(resolve(TransportKind::Tcp, Some("no-such-device")).unwrap(), TransportKind::Tcp);
        // A device name that cannot exist: explicit rdma must fail with an error that names
        // the cause (feature missing, or no such device), auto must fall back.
        let e = resolve(TransportKind::Rdma, Some("ringside-no-such-device")).unwrap_err();
        assert!(
            matches!(e, CollectiveError::RdmaNotBuilt | CollectiveError::NoRdmaDevice { .. }),
            "unexpected error {e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains("--transport"), "the error must say what to do: {msg}");
        assert_eq!(resolve(TransportKind::Auto, Some("ringside-no-such-device")).unwrap(), TransportKind::Tcp);
    }

    #[cfg(not(feature = "rdma"))]
    #[test]
    fn without_the_feature_rdma_names_the_feature() {
        let e = resolve(TransportKind::Rdma, None).unwrap_err();
        assert!(matches!(e, CollectiveError::RdmaNotBuilt));
        assert!(e.to_string().contains("--features rdma"), "{e}");
    }

    #[test]
    fn transport_kind_parses_from_the_command_line() {
        use clap::ValueEnum;
        assert_eq!(TransportKind::from_str("auto", false).unwrap(), TransportKind::Auto);
        assert_eq!(TransportKind::from_str("rdma", false).unwrap(), TransportKind::Rdma);
        assert!(TransportKind::from_str("udp", false).is_err());
        assert_eq!(TransportKind::default().to_string(), "tcp");
    }
}
