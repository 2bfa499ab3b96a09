//! `cargo xtask`: the only entry points a person needs.
//!
//! Everything privileged or nightly-only lives here, so plain `cargo build` / `cargo test` at the
//! workspace root stay on stable and need no root.
mod agent;
mod bench;
mod bench_agent;
mod bench_collectives;
mod bench_http;
mod bench_ipuwire;
mod bench_overhead;
mod build;
mod demo;
mod dist;
mod eval;
mod eval_adaptation;
mod eval_detection;
// `pub`: `fuzz::run_bounded` is the entry of the T0 tier's bounded pass, not yet called.
pub mod fuzz;
mod kernel;
mod setup;
mod test;
mod util;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Build, test, demo and benchmark ringside.
///
/// On a fresh machine `cargo xtask demo` and `cargo xtask test` install what they need first
/// (the same steps as `cargo xtask setup`), so nothing has to be installed by hand.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what a fresh machine lacks (Debian packages, nightly rust-src, bpf-linker built
    /// against LLVM 22, cargo-fuzz; QEMU and the bookworm-backports apt source for the kernel
    /// matrix) and mount bpffs. Idempotent: fast and quiet when nothing is missing.
    Setup,
    /// Build the eBPF object (nightly, bpfel-unknown-none) and the workspace with it embedded.
    Build {
        /// Build user space in release mode.
        #[arg(long)]
        release: bool,
    },
    /// Run every test tier: T0 unit (no root), T1 in-kernel BPF_PROG_TEST_RUN, T1 on Debian's
    /// 6.1 and 6.12 kernels booted under QEMU, T2 testbed namespaces. Fails if any tier fails.
    /// Needs root for T1/T2.
    Test {
        /// Run only these tiers (t0, t1, t1-kernels, t2); default: all.
        #[arg(long = "tier", value_enum)]
        tiers: Vec<test::Tier>,
        /// Skip `cargo xtask setup` (for quick re-runs on a machine already set up).
        #[arg(long)]
        no_setup: bool,
        /// Run the selected tiers this many times in a row and report every round (a stability
        /// check: run it alongside a build to load the machine); fails if any round failed.
        #[arg(long, default_value_t = 1, value_name = "N")]
        repeat: u32,
        /// Run the T1 tests on this Debian kernel (MAJOR.MINOR: 6.1 from bookworm, 6.12 from
        /// bookworm-backports), booted under QEMU; repeatable or a comma-separated list. Alone it
        /// runs only that matrix; with --tier, those tiers too.
        #[arg(long = "kernel", value_name = "VERSION", value_delimiter = ',', value_parser = kernel::parse_version)]
        kernels: Vec<String>,
    },
    /// Bring up a 4-host namespace testbed, run collective-like traffic, start the agent, and show
    /// its live flow table and a sample of /metrics; tears everything down at the end or on Ctrl-C.
    Demo {
        /// How long to show the live table, in seconds.
        #[arg(long, default_value_t = 8)]
        seconds: u64,
    },
    /// Benchmarks; results are printed and written under target/bench/.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
    },
    /// Evaluations on the testbed with the real agent; results are printed and written under
    /// target/eval/ (and docs/).
    Eval {
        #[command(subcommand)]
        which: EvalWhich,
    },
    /// Release binaries (ringside, ringside-rank) under target/dist/TRIPLE/, for the host or the
    /// DPU's Arm cores (`--target aarch64-unknown-linux-gnu`); `--check` runs them and the
    /// target's unit tests (under qemu-user when foreign).
    Dist(dist::Opts),
    // The help (what each target fuzzes, longer runs, crashes, reproducing one) is `fuzz::Opts`'s.
    Fuzz(fuzz::Opts),
    /// Run the testbed tool (`ringside-testbed`), e.g. `cargo xtask testbed clean`.
    Testbed {
        /// Arguments passed to ringside-testbed (try `cargo xtask testbed --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum EvalWhich {
    /// The detection scenario matrix (issue 4): healthy, loss-0.5/1/2/5, ratecap-quarter, flap,
    /// uplink-congestion, straggler; latency, precision, recall, localization, false alarms.
    /// target/eval/detection.{json,png,md}; docs/eval-detection.md for a full run.
    Detection(eval_detection::Opts),
    /// Static plan vs following hints (issue 5): healthy, uplink-congestion, loss-2,
    /// ratecap-quarter, straggler; mean/p99 step time, mean communication time and their ratio.
    /// target/eval/adaptation.{json,png,md}; docs/eval-adaptation.md for all scenarios.
    Adaptation(eval_adaptation::Opts),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Setup => setup::run(),
        Command::Build { release } => build::all(release).map(|_| ()),
        Command::Test { tiers, no_setup, repeat, kernels } => test::run_repeated(&tiers, no_setup, repeat, &kernels),
        Command::Demo { seconds } => demo::run(seconds),
        Command::Bench { which } => bench::run(which),
        Command::Eval { which: EvalWhich::Detection(opts) } => eval_detection::run(opts),
        Command::Eval { which: EvalWhich::Adaptation(opts) } => eval_adaptation::run(opts),
        Command::Dist(opts) => dist::run(opts),
        Command::Fuzz(opts) => fuzz::run(opts),
        Command::Testbed { args } => build::testbed(&args),
    }
}
