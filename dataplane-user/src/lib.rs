//! The ringside agent: loads the eBPF flow monitor, collects its maps, and serves metrics and hints.
pub mod config;
pub mod object;
pub mod frames;
pub mod testrun;
