//! `cargo xtask bench ...`: benchmarks measured side by side with their baselines in one run.
use anyhow::Result;
use clap::Subcommand;

use crate::{build, setup, util::{cargo, sh}};

#[derive(Subcommand, Clone, Copy)]
pub enum Which {
    /// ns per packet of the flow monitor vs an empty classifier (BPF_PROG_TEST_RUN, many repeats).
    Ebpf,
}

pub fn run(which: Which) -> Result<()> {
    setup::run()?;
    match which {
        Which::Ebpf => {
            let object = build::ebpf()?;
            let mut cmd = cargo();
            cmd.args(["run", "--release", "-p", "dataplane-user", "--example", "bench_ebpf", "--"])
                .args(["--out", "target/bench/ebpf.json"])
                .env(build::OBJECT_ENV, object);
            sh(&mut cmd)
        }
    }
}
