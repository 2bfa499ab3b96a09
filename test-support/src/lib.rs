//! Test support for ringside: what the T1 tests (`dataplane-user/tests/t1_*.rs`) and the eBPF
//! benchmark (`dataplane-user/examples/bench_ebpf.rs`) need, kept out of the agent library (like
//! aya's `test/integration-*` crates).
//!
//! - [`frames`]: builders for the frames fed to the flow monitor, on `smoltcp::wire`, with real
//!   checksums.
//! - [`testrun`]: running a loaded TC classifier on a frame with `BPF_PROG_TEST_RUN`.
//!
//! Builds on stable without root; only running [`testrun::run`] needs root.
pub mod frames;
pub mod testrun;
