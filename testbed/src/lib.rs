//! Network-namespace rigs for ringside's tests, `cargo xtask demo` and evaluations.
//!
//! - [`Netns`]: an RAII network namespace (`rs-<pid>-<n>-<label>`), entered with `setns` only.
//! - [`Star`]: N host namespaces cabled to a bridge in a switch namespace, 10.77.0.(i+1)/24 and
//!   fd77::(i+1)/64, tuned against reordering (RPS, raised backlog).
//! - [`LeafSpine`]: leaves of k hosts (bridges) joined by a routing spine, so cross-leaf traffic
//!   shares an uplink per leaf.
//! - [`IpuStar`]: a star with an IPU namespace (a two-port bump in the wire forwarding with the
//!   `ipuwire` eBPF redirect, run by `ringside ipu-wire`) between each host and the switch.
//! - [`managed`]: the host ↔ IPU links and IPU fabric addresses of managed collectives, and the
//!   `ringside-ipu` services ([`managed::ManagedServices`]).
//! - [`Rig`]: what all have in common (hosts, named links, fault log); faults on any link:
//!   [`Rig::link_loss`] (nftables random drop), [`Rig::link_rate_cap`] (tc tbf),
//!   [`Rig::link_flap`] (link down/up), [`Rig::cross_traffic`] (bulk TCP between two hosts);
//!   the star's older [`Star::add_loss`] / [`Star::rate_cap`] take a host index.
//! - Traffic with exact ground truth: [`tcp_send`] / [`TcpSink`], [`roce_send`] / [`RoceSink`].
//! - [`job`]: launches one emulated training rank (`ringside-rank`) per host; [`mpi`] and
//!   [`torch`] run OpenMPI and PyTorch DDP jobs on a rig through the same [`RunningJob`].
//! - [`clean()`]: removes namespaces left behind by crashed runs.
//!
//! Everything here needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN); calls fail with
//! [`Error::NotRoot`] otherwise. Traffic only ever flows between addresses inside namespaces the
//! testbed created.

pub mod clean;
pub mod cmd;
pub mod error;
pub mod fault;
pub mod ipu;
pub mod job;
pub mod leaf_spine;
pub mod link;
pub mod managed;
pub mod mirror;
pub mod mpi;
pub mod netns;
pub mod rig;
pub mod roce;
pub mod signals;
pub mod size;
pub mod star;
pub mod tcp;
pub mod torch;
pub mod tuning;

pub use cmd::require_root;
pub use error::{Error, Result};
pub use job::{run_job, spawn_job, JobConfig, JobReport, RunningJob};
pub use fault::{
    CrossTraffic, CrossTrafficReport, CrossTrafficSpec, DropCounters, FaultKind, FaultRecord, FlapGuard, FlapSpec, LossGuard, LossSite,
    RateCapGuard,
};
pub use mpi::{spawn_mpi, MpiAlgorithm, MpiConfig, MpiLaunch};
pub use ipu::{IpuHost, IpuStar, IpuStarConfig, WireReport, IPU_FABRIC_PORT, IPU_HOST_PORT};
pub use mirror::MirrorPort;
pub use leaf_spine::{LeafSpine, LeafSpineConfig, LeafSpineHost};
pub use rig::{Link, Rig};
pub use clean::{clean, CleanReport};
pub use netns::{Netns, NetnsHandle};
pub use roce::{roce_send, RoceRecvReport, RoceSendReport, RoceSink, RoceSpec, ROCEV2_UDP_PORT};
pub use size::ByteSize;
pub use star::{Star, StarConfig, StarHost};
pub use torch::{spawn_torch, TorchCompression, TorchConfig};
pub use tcp::{tcp_send, tcp_send_with_timeout, tcp_sink, TcpSendReport, TcpSink, TcpSinkReport};
