//! `cargo xtask fuzz`: coverage-guided fuzzing of the parsers that take untrusted bytes, with
//! cargo-fuzz (libFuzzer) on the nightly toolchain, bounded in time per target (docs/fuzzing.md).
//!
//! The fuzz crate (`fuzz/`) is its own workspace, so plain `cargo build` / `cargo test` at the root
//! never build it. One `cargo +nightly fuzz build` builds every target (AddressSanitizer, debug
//! assertions: an integer overflow is a crash too); then each target runs for its time, one after
//! another, starting from its committed seeds (`fuzz/corpus/TARGET/`) and the corpus earlier runs
//! grew (`fuzz/corpus-run/TARGET/`, gitignored, where a run writes what it finds). A target fails
//! when libFuzzer stops on a panic, a crash, a hang (one input over [`INPUT_TIMEOUT_SECS`]) or
//! memory above [`RSS_LIMIT_MB`]: the input is in `fuzz/artifacts/TARGET/` (gitignored), and
//! every target still runs. libFuzzer's output goes to `fuzz/target/fuzz-logs/TARGET.log`.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

use crate::{setup, util::workspace_root};

/// Every target, with what it fuzzes (the `[[bin]]`s of fuzz/Cargo.toml; each file's module docs
/// say what it checks).
pub const TARGETS: &[(&str, &str)] = &[
    ("mirror_frame", "mirrored frames: Ethernet/VLAN/IPv4/IPv6/TCP/UDP/RoCEv2 BTH+AETH (dataplane-user frame::parse) and the mirror table counting each one"),
    ("ipu_frame", "frames between IPU services: the 40-byte header, hello, control header, plan vote and data chunks (ipu-firmware wire, plan)"),
    ("ipu_codec", "the engine's chunk codecs both ways: payloads from a peer, and encoding with error feedback (ipu-firmware codec)"),
    ("ipu_engine", "the collective engine consuming a peer's control headers, votes and data chunks over a scripted 2-rank transport (ipu-firmware engine)"),
    ("managed_link", "the host <-> IPU link: a tenant's byte stream through the managed service's session loop (ipu-firmware managed)"),
    ("agent_config", "the agent's TOML config: parse, validation, line/key of errors, resolved settings and kernel config (dataplane-user config)"),
    ("api_bodies", "API bodies and values: job registration, plan report, hint, limit, codec/algorithm/port names, the IPU's reply report"),
];

/// Default seconds per target: a bounded pass of all seven takes under three minutes after the build.
pub const DEFAULT_SECONDS: u64 = 20;
/// libFuzzer's memory limit per target process.
pub const RSS_LIMIT_MB: u64 = 2048;
/// One input running longer than this is a hang (libFuzzer's `-timeout`).
pub const INPUT_TIMEOUT_SECS: u64 = 10;

/// Fuzz the parsers of untrusted bytes with cargo-fuzz (nightly), each target for a bounded time.
///
/// Builds every target once, then runs each for `--seconds`, one after another. Fails, naming the
/// target and its reproducer, if any target panics, crashes, hangs or runs out of memory.
///
/// Targets (`--list`; each file in fuzz/fuzz_targets/ says what it checks):
///   mirror_frame  mirrored frames (Ethernet, VLAN, IPv4/IPv6, TCP, UDP, RoCEv2 BTH/AETH) and the
///                 mirror table that counts them
///   ipu_frame     frames between IPU services: header, hello, control header, plan vote, data
///   ipu_codec     the engine's chunk codecs, decoding a peer's payload and encoding with feedback
///   ipu_engine    the engine running collectives on a peer's frames (2 ranks, scripted transport)
///   managed_link  a tenant's byte stream through the managed service's host-link session loop
///   agent_config  the agent's TOML config file
///   api_bodies    API request bodies and values, and the IPU's reply report
///
/// Longer runs: `cargo xtask fuzz --seconds 600 ipu_frame`, or cargo-fuzz itself from the
/// workspace root: `cargo +nightly fuzz run -a TARGET fuzz/corpus-run/TARGET fuzz/corpus/TARGET
/// -- -max_total_time=3600` (`-jobs=2` for both cores). New inputs that reach new code go to
/// fuzz/corpus-run/TARGET/ (not committed); `cargo +nightly fuzz cmin -a TARGET
/// fuzz/corpus-run/TARGET` shrinks it.
///
/// A failure's input is written to fuzz/artifacts/TARGET/ (crash-*, timeout-*, oom-*; not
/// committed), and libFuzzer's output to fuzz/target/fuzz-logs/TARGET.log. Reproduce it with
/// `cargo +nightly fuzz run -a TARGET fuzz/artifacts/TARGET/crash-...` (runs that one input and
/// prints the panic and its stack), shrink it with `cargo +nightly fuzz tmin -a TARGET
/// fuzz/artifacts/TARGET/crash-...`, and print it as hex with `xxd -p`.
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct Opts {
    /// Seconds of fuzzing per target (after the build).
    #[arg(long, default_value_t = DEFAULT_SECONDS, value_name = "N")]
    pub seconds: u64,
    /// Run only these targets (default: all), in the order given.
    #[arg(value_name = "TARGET", value_parser = clap::builder::PossibleValuesParser::new(TARGETS.iter().map(|(n, _)| *n)))]
    pub targets: Vec<String>,
    /// List the targets and what each fuzzes, then exit.
    #[arg(long)]
    pub list: bool,
}

/// What one target's run came to.
#[derive(Debug, Clone)]
pub struct TargetRun {
    pub target: String,
    pub passed: bool,
    /// Inputs executed and their rate, from libFuzzer's final stats (absent if it printed none).
    pub execs: Option<u64>,
    pub execs_per_sec: Option<u64>,
    /// Files in `fuzz/corpus-run/TARGET/` after the run.
    pub corpus_files: usize,
    /// New files in `fuzz/artifacts/TARGET/`: the inputs that failed.
    pub artifacts: Vec<PathBuf>,
    pub log: PathBuf,
}

/// `cargo xtask fuzz`.
pub fn run(opts: Opts) -> Result<()> {
    if opts.list {
        for (name, what) in TARGETS {
            println!("{name:<14} {what}");
        }
        return Ok(());
    }
    let names: Vec<&str> = if opts.targets.is_empty() { TARGETS.iter().map(|(n, _)| *n).collect() } else { opts.targets.iter().map(String::as_str).collect() };
    let runs = run_targets(&names, opts.seconds)?;
    let failed: Vec<String> = runs
        .iter()
        .filter(|r| !r.passed)
        .map(|r| match r.artifacts.first() {
            Some(a) => format!("{} (input {}; reproduce: cargo +nightly fuzz run -a {} {})", r.target, a.display(), r.target, a.display()),
            None => format!("{} (no input written; see {})", r.target, r.log.display()),
        })
        .collect();
    if !failed.is_empty() {
        bail!("fuzzing failed: {}", failed.join("; "));
    }
    Ok(())
}

/// Every target for `seconds` each (the T0 tier's bounded pass): its name and whether it passed,
/// in [`TARGETS`] order. A failing target does not stop the others. `Err` only when the fuzz
/// targets could not be run at all (cargo-fuzz missing and not installable, the build failing).
pub fn run_bounded(seconds: u64) -> Result<Vec<(String, bool)>> {
    let names: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
    Ok(run_targets(&names, seconds)?.into_iter().map(|r| (r.target, r.passed)).collect())
}

/// The fuzz workspace.
pub fn fuzz_dir() -> PathBuf {
    workspace_root().join("fuzz")
}

/// `cargo +nightly fuzz SUBCOMMAND --fuzz-dir fuzz/ -a`, run from the workspace root.
fn cargo_fuzz(subcommand: &str) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root()).args(["+nightly", "fuzz", subcommand, "--fuzz-dir"]).arg(fuzz_dir()).arg("--debug-assertions");
    // `cargo xtask` runs under the stable toolchain; these would make the nightly cargo use stable
    // pieces (as in `build::ebpf`). The agent's eBPF object is not needed by any parser.
    for var in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER", "RUSTUP_TOOLCHAIN", "CARGO", crate::build::OBJECT_ENV] {
        cmd.env_remove(var);
    }
    cmd
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect()).unwrap_or_default();
    v.sort();
    v
}

/// libFuzzer's `stat::NAME: VALUE` line (`-print_final_stats=1`).
fn final_stat(log: &str, name: &str) -> Option<u64> {
    log.lines().rev().find_map(|l| l.strip_prefix(&format!("stat::{name}:"))).and_then(|v| v.trim().parse().ok())
}

/// Builds every target once, then runs `names` for `seconds` each.
fn run_targets(names: &[&str], seconds: u64) -> Result<Vec<TargetRun>> {
    if let Some(done) = setup::ensure_cargo_fuzz()? {
        println!("fuzz: {done}");
    }
    let started = Instant::now();
    println!("fuzz: building the fuzz targets (nightly, AddressSanitizer, debug assertions)");
    crate::util::sh(&mut cargo_fuzz("build"))
        .context("building the fuzz targets needs the nightly toolchain and cargo-fuzz: run `cargo xtask setup`")?;
    println!("fuzz: built in {:.0} s", started.elapsed().as_secs_f64());

    let fuzz = fuzz_dir();
    let logs = fuzz.join("target/fuzz-logs");
    fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let mut runs = Vec::new();
    for &target in names {
        let seeds = fuzz.join("corpus").join(target);
        let grown = fuzz.join("corpus-run").join(target);
        let artifacts = fuzz.join("artifacts").join(target);
        fs::create_dir_all(&grown).with_context(|| format!("creating {}", grown.display()))?;
        let before = files_in(&artifacts);
        let log = logs.join(format!("{target}.log"));
        let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        println!("fuzz: {target} for {seconds} s");
        let mut cmd = cargo_fuzz("run");
        cmd.arg(target).arg(&grown).arg(&seeds).arg("--");
        cmd.arg(format!("-max_total_time={seconds}"))
            .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
            .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
            .arg("-print_final_stats=1");
        let status = cmd.stdout(Stdio::from(out)).stderr(Stdio::from(err)).status().with_context(|| format!("cannot start cargo fuzz run {target}"))?;
        let text = fs::read_to_string(&log).unwrap_or_default();
        let new: Vec<PathBuf> = files_in(&artifacts).into_iter().filter(|a| !before.contains(a)).collect();
        let run = TargetRun {
            target: target.to_owned(),
            passed: status.success() && new.is_empty(),
            execs: final_stat(&text, "number_of_executed_units"),
            execs_per_sec: final_stat(&text, "average_exec_per_sec"),
            corpus_files: files_in(&grown).len(),
            artifacts: new,
            log,
        };
        let count = |v: Option<u64>| v.map_or("?".to_owned(), |n| n.to_string());
        if run.passed {
            println!("fuzz: {target} passed: {} inputs ({}/s), corpus {} files", count(run.execs), count(run.execs_per_sec), run.corpus_files);
        } else {
            // The panic message and the top of its stack, as libFuzzer printed them.
            let tail = (text.len().saturating_sub(2000)..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            let at = text.find("panicked at").or_else(|| text.find("==ERROR")).or_else(|| text.find("ERROR:")).unwrap_or(tail);
            let excerpt: String = text[at..].lines().take(20).collect::<Vec<_>>().join("\n");
            println!("fuzz: {target} FAILED ({status}); input: {}; log: {}\n{excerpt}", run.artifacts.iter().map(|a| a.display().to_string()).collect::<Vec<_>>().join(", "), run.log.display());
        }
        runs.push(run);
    }
    let failed = runs.iter().filter(|r| !r.passed).count();
    println!("fuzz: {} passed, {failed} failed ({:.0} s with the build)", runs.len() - failed, started.elapsed().as_secs_f64());
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list here, fuzz/Cargo.toml's `[[bin]]`s and the seed directories name the same targets.
    #[test]
    fn targets_match_the_fuzz_crate() {
        let manifest = fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
        let bins: Vec<&str> = manifest.lines().filter_map(|l| l.strip_prefix("name = \"")?.strip_suffix('"')).filter(|n| *n != "ringside-fuzz").collect();
        let listed: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
        assert_eq!(bins, listed);
        for name in listed {
            assert!(!files_in(&fuzz_dir().join("corpus").join(name)).is_empty(), "no seeds for {name}");
        }
    }

    #[test]
    fn final_stats_are_read() {
        let log = "#1234\tDONE cov: 10\nstat::number_of_executed_units: 413084\nstat::average_exec_per_sec:     25817\n";
        assert_eq!(final_stat(log, "number_of_executed_units"), Some(413_084));
        assert_eq!(final_stat(log, "average_exec_per_sec"), Some(25_817));
        assert_eq!(final_stat(log, "peak_rss_mb"), None);
    }
}
