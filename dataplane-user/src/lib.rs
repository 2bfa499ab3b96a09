//! The ringside agent: loads the eBPF flow monitor, collects its maps, and serves metrics and hints.
pub mod agent;
pub mod api;
pub mod client;
pub mod collector;
pub mod config;
pub mod detection;
pub mod events;
pub mod flow_table;
pub mod frames;
pub mod hints;
pub mod jobs;
pub mod loader;
pub mod metrics;
pub mod object;
pub mod state;
pub mod testrun;
pub mod detect;
