//! The ringside agent: loads the eBPF flow monitor, collects its maps, and serves metrics and hints.
//!
//! The crate's face is what the `ringside` binary, the tests and the benches use: the agent
//! ([`agent`]: settings, `run`), the API and how it builds its responses ([`api`]; the response
//! types are `ringside_client::operator`'s), the CLI ([`cli`]), the config file ([`config`]),
//! detection events and verdicts ([`events`], [`detect`]), the loader's pins ([`loader`]) and the
//! embedded eBPF object ([`object`]), with the most used re-exported below. Everything else
//! (the collector and analysis stages, flow table, job catalog, policy, hint board, the API's view
//! of the stages, metrics, auth) is
//! `pub(crate)`: see docs/architecture.md for the layers.
pub mod agent;
pub(crate) mod analysis;
pub mod api;
pub mod attribution;
pub(crate) mod auth;
pub(crate) mod bounds;
pub mod cli;
pub(crate) mod clock;
pub(crate) mod collector;
pub mod config;
pub mod events;
pub(crate) mod flow_slots;
pub(crate) mod flow_table;
pub mod frame;
pub(crate) mod hint_board;
pub mod ipuwire;
pub(crate) mod jobs;
pub mod loader;
pub(crate) mod match_map;
pub(crate) mod metrics;
pub mod mirror;
pub(crate) mod mount_ns;
pub mod object;
pub(crate) mod policy;
pub mod privileges;
pub(crate) mod process_metrics;
pub mod queue_stats;
pub(crate) mod rdma_counters;
pub mod detect;
pub(crate) mod view;

pub use agent::{AgentArgs, AgentError, AgentSettings};
pub use events::Event;
pub use loader::PINNED_MAPS;
pub use object::flowmon_object;

/// The agent's view of `FLOWS` (mmap, CAS eviction), public only for the T1 test that runs it
/// against the loaded program (`tests/t1_flowmon.rs`); not part of the crate's face.
#[doc(hidden)]
pub use flow_slots::SlotTable;
