//! `cargo xtask test`: every test tier, in order, failing if any fails.
//!
//! Tiers (docs/testing.md):
//! - T0 unit: `cargo test` over the workspace; no root, no kernel.
//! - T1 in-kernel: `tests/t1_*.rs`, the real eBPF program run with BPF_PROG_TEST_RUN on crafted frames.
//! - T2 testbed: `tests/t2_*.rs`, network namespaces, real traffic, the agent attached.
//!
//! Tests that need root are marked `#[ignore = "needs root ..."]` so plain `cargo test` reports
//! them as ignored (with the reason) instead of failing on a developer's machine; here they run with
//! `--ignored`, and fail loudly if they cannot do their job.
use std::time::Instant;

use anyhow::{bail, Result};
use clap::ValueEnum;

use crate::{
    build, setup,
    util::{cargo, is_root, sh},
};

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum Tier {
    T0,
    T1,
    T2,
}

impl Tier {
    fn describe(self) -> &'static str {
        match self {
            Tier::T0 => "T0 unit (no root)",
            Tier::T1 => "T1 in-kernel test_run",
            Tier::T2 => "T2 namespace testbed",
        }
    }
}

pub fn run(tiers: &[Tier], no_setup: bool) -> Result<()> {
    let tiers: Vec<Tier> = if tiers.is_empty() { vec![Tier::T0, Tier::T1, Tier::T2] } else { tiers.to_vec() };
    if tiers.iter().any(|t| *t != Tier::T0) && !is_root() {
        bail!("tiers T1 and T2 load eBPF programs and create network namespaces, so they need root: run `sudo -E cargo xtask test` (or `cargo xtask test --tier t0` for the unit tier alone)");
    }
    if !no_setup {
        setup::run()?;
    }
    let object = build::ebpf()?;

    let mut results = Vec::new();
    for tier in tiers {
        println!("\n==> {}", tier.describe());
        let started = Instant::now();
        let mut cmd = cargo();
        cmd.arg("test").env(build::OBJECT_ENV, &object);
        match tier {
            Tier::T0 => {
                cmd.args(["--workspace", "--exclude", "dataplane-ebpf"]);
            }
            Tier::T1 => {
                cmd.args(["--workspace", "--exclude", "dataplane-ebpf", "--test", "t1_*", "--", "--ignored"]);
            }
            Tier::T2 => {
                // Namespaced traffic tests share 2 cores; two at a time keeps them from starving.
                cmd.args(["--workspace", "--exclude", "dataplane-ebpf", "--test", "t2_*", "--"])
                    .args(["--ignored", "--test-threads=2"]);
            }
        }
        let ok = sh(&mut cmd).is_ok();
        results.push((tier, ok, started.elapsed()));
    }

    println!("\n==> summary");
    for (tier, ok, took) in &results {
        println!("{:<28} {:<6} {:>6.0} s", tier.describe(), if *ok { "ok" } else { "FAILED" }, took.as_secs_f64());
    }
    let failed: Vec<_> = results.iter().filter(|r| !r.1).map(|r| r.0.describe()).collect();
    if !failed.is_empty() {
        bail!("failed tiers: {}", failed.join(", "));
    }
    Ok(())
}

