//! The collective engine that runs in the provider's trusted domain (DPU/IPU), also used in-process by
//! the testbed's emulated training job.
//!
//! - [`wire`]: frame header and payload layouts (pure parsing).
//! - [`codec`]: per-chunk wire compression (none, fp16, bf16, int8, top-k) and error feedback.
//! - [`plan`]: [`Plan`], the [`PlanSource`] hook, and the control header rank 0 sends per collective.
//! - [`transport`]: the [`Transport`] trait and the TCP mesh ([`TcpTransport`]).
//! - `rdma` (cargo feature `rdma`): the RDMA mesh on `ibverbs` (`RdmaTransport`).
//! - [`mesh`]: `--transport tcp|rdma|auto`: [`TransportKind`], [`MeshTransport`] and the TCP fallback.
//! - [`rto`]: transport advice on the engine's own TCP connections ([`TcpRtoFloor`]: the
//!   retransmission-timeout floor a hint's `tcp_rto_min_ms` asks for, set per socket).
//! - [`engine`]: [`Communicator`]: ring / tree / recursive halving-doubling allreduce, reduce-scatter,
//!   allgather, broadcast.
//! - [`hints`]: ringside's hints as a [`PlanSource`] ([`HintFollower`]): the closed loop.
//! - [`managed`]: managed collectives: the host ↔ IPU protocol, the `ringside-ipu` service and
//!   its tenant client.
//! - [`job`]: the emulated training job behind the `ringside-rank` binary, runnable in-process.
//!
//! Invariants shared by all modules: every wait is bounded by a timeout; every frame is validated
//! before it touches a result; every rank runs each collective with the plan rank 0 announced for it.

pub mod codec;
pub mod engine;
pub mod error;
pub mod hints;
pub mod job;
pub mod mesh;
pub mod managed;
pub mod plan;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod rto;
pub mod transport;
pub mod wire;

pub use codec::{Bf16, CodecKind};
pub use engine::{allreduce_busbw, segment, Communicator, CommunicatorConfig, OpReport, PlanOrigin};
pub use error::CollectiveError;
pub use hints::{applied_plan, plan_from_hint, HintFollower, PlanReporter};
pub use plan::{AppliedHint, Algorithm, Compression, Dtype, Plan, PlanProposal, PlanSource, PlanVoter, ScriptedPlans};
pub use mesh::{MeshOptions, MeshTransport, TransportKind};
#[cfg(feature = "rdma")]
pub use rdma::{RdmaOptions, RdmaTransport};
pub use rto::{AppliedRtoFloor, TcpRtoFloor};
pub use transport::{TcpOptions, TcpTransport, Transport};
