//! `cargo xtask bench ...`: benchmarks measured side by side with their baselines in one run.
use anyhow::Result;
use clap::Subcommand;

use crate::{build, setup, util::{cargo, sh}};

#[derive(Subcommand, Clone)]
pub enum Which {
    /// ns per packet of the flow monitor vs an empty classifier (BPF_PROG_TEST_RUN, many repeats).
    Ebpf,
    /// Allreduce busbw (nccl-tests definition) of ring/tree/rhd on a 4-host star, 1 KiB..64 MiB,
    /// next to iperf3 point-to-point and OpenMPI's MPI_Allreduce on the same rig; codec GB/s.
    Collectives(crate::bench_collectives::Opts),
    /// iperf3 throughput between two namespaces with the agent's monitor attached vs detached,
    /// alternated in one run; share of throughput lost (target ≤ 2 %).
    Overhead(crate::bench_overhead::Opts),
    /// The agent's HTTP API on loopback: keep-alive clients on the hints endpoint and /metrics
    /// (requests/s, p50/p99/max, errors), /metrics again beside 500 idle connections, and the
    /// agent's RSS before, during and after (flat within a bound).
    Http(crate::bench_http::Opts),
    /// Agent CPU (% of one core), RSS and /metrics scrape time and size while it tracks 1k, 10k and
    /// 100k real UDP flows through the classifier, polling every 100 ms (targets at 10k: ≤ 2 %
    /// of a core, ≤ 64 MiB; linear or better to 100k). Method: `cargo xtask bench agent --help`.
    #[command(long_about = crate::bench_agent::METHOD)]
    Agent(crate::bench_agent::Opts),
    /// iperf3 host-to-host throughput through two emulated IPUs (ipuwire redirect) vs a direct
    /// veth pair and the plain bridge star, alternated in one run.
    Ipuwire(crate::bench_ipuwire::Opts),
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
        Which::Collectives(opts) => crate::bench_collectives::run(opts),
        Which::Overhead(opts) => crate::bench_overhead::run(opts),
        Which::Http(opts) => crate::bench_http::run(opts),
        Which::Agent(opts) => crate::bench_agent::run(opts),
        Which::Ipuwire(opts) => crate::bench_ipuwire::run(opts),
    }
}
