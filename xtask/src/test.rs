//! `cargo xtask test`: every test tier, in order, failing if any fails.
//!
//! Tiers (docs/testing.md):
//! - T0 unit: `cargo test` over the workspace, then the Python client's pytest suite
//!   (`ringside-client/python/tests`) with the venv `cargo xtask setup` makes (`target/venv`:
//!   torch, pytest); then the Prometheus rules (`deploy/prometheus`): `promtool check rules` on
//!   every rule file and `promtool test rules` on every unit-test file; then the aarch64 build
//!   (`cargo xtask dist --target aarch64-unknown-linux-gnu --check`: the binaries and three crates'
//!   unit tests under qemu-user); then ipu-firmware with the `rdma` feature (built against Debian's
//!   rdma-core, its unit tests and `tests/transport_choice.rs`, which runs the real device probe
//!   and checks the TCP fallback); no root, no kernel.
//! - T1 in-kernel: `tests/t1_*.rs`, the real eBPF program run with BPF_PROG_TEST_RUN on crafted frames.
//! - T1 kernels: the same T1 binaries on other kernels (Debian's 6.1 and 6.12, or the `--kernel`
//!   list), each booted under QEMU ([`kernel`]); one summary line per kernel.
//! - T2 testbed: `tests/t2_*.rs`, network namespaces, real traffic, the agent attached.
//!
//! Tests that need root are marked `#[ignore = "needs root ..."]` so plain `cargo test` reports
//! them as ignored (with the reason) instead of failing on a developer's machine; here they run with
//! `--ignored`, and fail loudly if they cannot do their job.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;

use crate::{
    build, kernel, setup,
    util::{cargo, is_root, output, sh, workspace_root},
};

/// The Python package's tests, relative to the workspace root.
const PY_TESTS: &str = "ringside-client/python/tests";

/// The Prometheus rules (`*.rules.yml`) and their promtool unit tests (`tests/*.yml`).
const PROMETHEUS_RULES: &str = "deploy/prometheus";

/// ipu-firmware's cargo feature for the RDMA transport (off in the workspace build).
const RDMA_FEATURE: &str = "rdma";

/// promtool, from Debian's `prometheus` package (`cargo xtask setup` installs it).
const PROMTOOL: &str = "promtool";

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum Tier {
    T0,
    T1,
    /// T1 on other kernels under QEMU (`t1-kernels`).
    T1Kernels,
    T2,
}

impl Tier {
    fn describe(self) -> &'static str {
        match self {
            Tier::T0 => "T0 unit (no root)",
            Tier::T1 => "T1 in-kernel test_run",
            Tier::T1Kernels => "T1 kernels (QEMU)",
            Tier::T2 => "T2 namespace testbed",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Tier::T0 => "T0",
            Tier::T1 => "T1",
            Tier::T1Kernels => "T1k",
            Tier::T2 => "T2",
        }
    }
}


/// One line of the summary: a tier, or one kernel of the T1 kernel matrix.
struct TierResult {
    label: String,
    tag: String,
    ok: bool,
    counts: Counts,
    took: std::time::Duration,
}

/// The tiers to run: `tiers` as given, plus the kernel matrix when `kernels` names any; with
/// neither, every tier (the kernel matrix on [`kernel::DEFAULT_KERNELS`]: about 3 minutes for both
/// under QEMU's TCG on 2 cores, downloads included; docs/testing.md).
fn selected_tiers(tiers: &[Tier], kernels: &[String]) -> Vec<Tier> {
    let mut t: Vec<Tier> = if tiers.is_empty() && kernels.is_empty() {
        vec![Tier::T0, Tier::T1, Tier::T1Kernels, Tier::T2]
    } else {
        tiers.to_vec()
    };
    if !kernels.is_empty() && !t.contains(&Tier::T1Kernels) {
        t.push(Tier::T1Kernels);
    }
    t
}

pub fn run(tiers: &[Tier], no_setup: bool, kernels: &[String]) -> Result<()> {
    let tiers = selected_tiers(tiers, kernels);
    if tiers.iter().any(|t| *t != Tier::T0) && !is_root() {
        bail!("tiers T1 and T2 load eBPF programs and create network namespaces, so they need root: run `sudo -E cargo xtask test` (or `cargo xtask test --tier t0` for the unit tier alone)");
    }
    if !no_setup {
        setup::run()?;
    }
    // Checked before anything runs, so a machine without the venv fails at once and says why.
    let python = if tiers.contains(&Tier::T0) { Some(venv_python()?) } else { None };
    if tiers.contains(&Tier::T0) {
        check_promtool()?;
    }
    let object = build::ebpf()?;

    let mut results = Vec::new();
    for tier in tiers {
        if tier == Tier::T1Kernels {
            let versions: Vec<String> =
                if kernels.is_empty() { kernel::DEFAULT_KERNELS.iter().map(|v| v.to_string()).collect() } else { kernels.to_vec() };
            results.extend(run_kernels(&versions, &object));
            continue;
        }
        println!("\n==> {}", tier.describe());
        let started = Instant::now();
        let mut cmd = cargo();
        // Every test binary runs even after one fails, so one failure does not hide the others.
        cmd.args(["test", "--no-fail-fast"]).env(build::OBJECT_ENV, &object);
        // What fails before the tier's tests run (a build they need) is a failure of the tier,
        // named in the summary; its tests still run and say what they miss.
        let mut before = Counts::default();
        match tier {
            Tier::T0 => {
                cmd.args(["--workspace", "--exclude", "dataplane-ebpf"]);
            }
            Tier::T1 => {
                cmd.args(["--workspace", "--exclude", "dataplane-ebpf", "--test", "t1_*", "--", "--ignored"]);
            }
            Tier::T2 => {
                // The emulated training job's rank process, in release: a debug rank is
                // compute-bound on its reductions, which would distort step timing in detection tests.
                // ringside-ipu: the managed collective service of t2_managed, also in release.
                if let Err(e) = sh(cargo().args(["build", "--release", "-p", "ipu-firmware", "--bin", "ringside-rank", "--bin", "ringside-ipu"])) {
                    println!("{e:#}");
                    before.failed += 1;
                    before.failures.push(format!("(release ringside-rank and ringside-ipu not built: {e:#})"));
                }
                cmd.env("RINGSIDE_RANK_BIN", build::bin_path("ringside-rank", true));
                cmd.env("RINGSIDE_IPU_BIN", build::bin_path("ringside-ipu", true));
                // Namespaced traffic tests share 2 cores; two at a time keeps them from starving.
                cmd.args(["--workspace", "--exclude", "dataplane-ebpf", "--test", "t2_*", "--"])
                    .args(["--ignored", "--test-threads=2"]);
            }
            Tier::T1Kernels => unreachable!("run above"),
        }
        let (mut ok, mut counts) = run_counting(&mut cmd, Counts::add_line)?;
        ok &= before.failed == 0;
        counts.add(&before);
        if let (Tier::T0, Some(python)) = (tier, &python) {
            println!("\n==> T0 Python client (pytest {PY_TESTS})");
            let (py_ok, py_counts) = run_pytest(python)?;
            ok &= py_ok;
            counts.add(&py_counts);
        }
        if tier == Tier::T0 {
            println!("\n==> T0 Prometheus rules (promtool, {PROMETHEUS_RULES})");
            let (rules_ok, rules_counts) = run_promtool()?;
            ok &= rules_ok;
            counts.add(&rules_counts);
            // The DPU's Arm build: cross-compiled, then run under qemu-user (issue 12). In the dev
            // profile: it compiles the same code (nothing here depends on `debug_assertions`)
            // in 524 s from scratch against 822 s in release, the unit tests under qemu included
            // (session 32, beside a T2 loop; docs/testing.md), the largest compile step of CI.
            println!("\n==> T0 aarch64 build (cargo xtask dist --target {} --debug --check)", crate::dist::AARCH64);
            let opts = crate::dist::Opts { target: Some(crate::dist::AARCH64.into()), debug: true, check: true };
            match crate::dist::run(opts) {
                Ok(()) => counts.passed += 1,
                Err(e) => {
                    println!("aarch64 build check failed: {e:#}");
                    ok = false;
                    counts.failed += 1;
                    counts.failures.push(format!("cargo xtask dist --target {} --check", crate::dist::AARCH64));
                }
            }
            // The RDMA transport is behind a feature the workspace build leaves off: build it
            // here against Debian's rdma-core so it cannot rot, and run the device probe and the
            // fallback on this machine (issue 12). The device-only paths cannot run here
            // (docs/testing.md).
            println!("\n==> T0 RDMA feature (cargo test -p ipu-firmware --features {RDMA_FEATURE} --lib --test transport_choice)");
            let (rdma_ok, rdma_counts) = run_counting(
                cargo()
                    .args(["test", "--no-fail-fast", "-p", "ipu-firmware", "--features", RDMA_FEATURE])
                    .args(["--lib", "--test", "transport_choice"]),
                Counts::add_line,
            )?;
            ok &= rdma_ok;
            counts.add(&rdma_counts);
        }
        // A tier that ran nothing proves nothing (e.g. root-only tests that lost their #[ignore]
        // marker run in T0 and leave T1 empty): that is a failure, not a pass.
        let ok = ok && counts.passed > 0;
        results.push(TierResult { label: tier.describe().into(), tag: tier.tag().into(), ok, counts, took: started.elapsed() });
    }

    println!("\n==> summary");
    let mut total = Counts::default();
    for r in &results {
        let c = &r.counts;
        let verdict = if r.ok { "ok" } else if c.passed == 0 && c.failed == 0 { "FAILED (ran no test)" } else { "FAILED" };
        println!(
            "{:<24} {:<22} {:>4} passed {:>3} failed {:>3} ignored {:>6.0} s",
            r.label, verdict, c.passed, c.failed, c.ignored, r.took.as_secs_f64()
        );
        total.add(c);
    }
    println!("xtask: {} passed, {} failed", total.passed, total.failed);
    for r in &results {
        for name in &r.counts.failures {
            println!("  FAILED {:<8} {name}", r.tag);
        }
        let silent = r.counts.silent_failed_targets();
        for target in &silent {
            println!("  FAILED {:<8} cargo test {target} (no failing test named: it did not build, crashed or was killed; see its output above)", r.tag);
        }
        if !r.ok && r.counts.failures.is_empty() && silent.is_empty() && r.counts.passed > 0 {
            println!("  FAILED {:<8} (no failing test named: a test binary did not build or crashed; see its output above)", r.tag);
        }
    }
    let failed: Vec<_> = results.iter().filter(|r| !r.ok).map(|r| r.label.as_str()).collect();
    if !failed.is_empty() {
        bail!("failed tiers: {}", failed.join(", "));
    }
    Ok(())
}

/// The T1 test binaries, built on the host with the object embedded (the guest runs them from the
/// host's filesystem).
fn t1_binaries(object: &Path) -> Result<Vec<PathBuf>> {
    let out = output(
        cargo()
            .args(["test", "--no-run", "--message-format=json", "--workspace", "--exclude", "dataplane-ebpf", "--test", "t1_*"])
            .env(build::OBJECT_ENV, object),
    )?;
    let mut bins = Vec::new();
    for line in out.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let is_t1 = v["reason"] == "compiler-artifact"
            && v["profile"]["test"] == true
            && v["target"]["name"].as_str().is_some_and(|n| n.starts_with("t1_"));
        if let (true, Some(exe)) = (is_t1, v["executable"].as_str()) {
            bins.push(PathBuf::from(exe));
        }
    }
    if bins.is_empty() {
        bail!("cargo built no tests/t1_*.rs binary, so the kernel matrix has nothing to run");
    }
    Ok(bins)
}

/// The T1 binaries on each kernel of `versions`, one summary line per kernel. A kernel that
/// cannot be fetched or booted fails its line and the others still run. The kernels are fetched
/// one after another, then booted side by side: a TCG guest keeps about one host core busy (the
/// tests in it run one at a time), so on two cores the matrix takes as long as its slowest kernel.
/// What cannot be prepared for all kernels (QEMU and its tools, the T1 binaries) fails the matrix's
/// one line and returns, so the tiers after it still run.
fn run_kernels(versions: &[String], object: &Path) -> Vec<TierResult> {
    println!("\n==> {} on {}", Tier::T1Kernels.describe(), versions.join(", "));
    let started = Instant::now();
    let tests = match setup::kernel_matrix_tools().and_then(|_| t1_binaries(object)) {
        Ok(tests) => tests,
        Err(e) => {
            println!("the kernel matrix cannot run: {e:#}");
            let mut counts = Counts::default();
            counts.failures.push(format!("(kernel matrix not prepared: {e:#})"));
            let label = format!("T1 on Linux {}", versions.join(", "));
            return vec![TierResult { label, tag: Tier::T1Kernels.tag().into(), ok: false, counts, took: started.elapsed() }];
        }
    };
    let mut env = vec![(build::OBJECT_ENV.to_owned(), object.to_string_lossy().into_owned())];
    for var in ["RINGSIDE_FUZZ_FRAMES", "RINGSIDE_FUZZ_SEED"] {
        if let Ok(v) = std::env::var(var) {
            env.push((var.to_owned(), v));
        }
    }
    // Everything the guests share is fetched here, before they start side by side: the kernels
    // and busybox (two first fetches at once raced on its scratch directory in a fresh clone,
    // and one guest's init was a partial file).
    let prepared: Vec<(&String, Result<kernel::GuestKernel>)> =
        versions.iter().map(|v| (v, kernel::prepare(v).and_then(|k| kernel::busybox().map(|_| k)))).collect();
    println!("\n==> T1 on Linux {} (QEMU, side by side; each console line is prefixed with its kernel)", versions.join(", "));
    let results = std::thread::scope(|scope| {
        let runs: Vec<_> = prepared
            .into_iter()
            .map(|(v, k)| {
                let (tests, env) = (&tests, &env);
                scope.spawn(move || guest_result(v, k, tests, env, started))
            })
            .collect();
        runs.into_iter().map(|h| h.join().expect("a kernel's guest thread panicked")).collect()
    });
    results
}

/// One kernel's summary line: boots `kernel` (or reports why it could not be prepared) and checks
/// what its guest reported.
fn guest_result(v: &str, kernel: Result<kernel::GuestKernel>, tests: &[PathBuf], env: &[(String, String)], started: Instant) -> TierResult {
    let mut counts = Counts::default();
    let mut label = format!("T1 on Linux {v}");
    let ok = match kernel {
        Err(e) => {
            counts.failures.push(format!("(kernel {v} not prepared: {e:#})"));
            false
        }
        Ok(k) => {
            label = format!("T1 on {}", k.release);
            match kernel::boot(&k, tests, env, |l| counts.add_line(l)) {
                Err(e) => {
                    counts.failures.push(format!("(guest: {e:#})"));
                    false
                }
                Ok(run) => {
                    let mut problems = Vec::new();
                    if run.uname.as_deref() != Some(k.release.as_str()) {
                        problems.push(format!("the guest ran kernel {:?}, not {}", run.uname, k.release));
                    }
                    if run.btf != Some(true) {
                        problems.push("the guest kernel has no /sys/kernel/btf/vmlinux".to_owned());
                    }
                    if let Some(e) = &run.error {
                        problems.push(format!("guest error: {e}"));
                    }
                    for t in tests {
                        let name = t.file_name().unwrap().to_string_lossy();
                        match run.exits.iter().find(|(n, _)| *n == name) {
                            Some((_, 0)) => {}
                            Some((_, code)) => problems.push(format!("{name} exited with {code}")),
                            None => problems.push(format!("{name} did not finish in the guest")),
                        }
                    }
                    if !run.done {
                        problems.push("the guest's /init did not reach its end".to_owned());
                    }
                    let ok = problems.is_empty() && counts.failed == 0 && counts.passed > 0;
                    for p in problems {
                        counts.failures.push(format!("({p})"));
                    }
                    ok
                }
            }
        }
    };
    TierResult { label, tag: format!("T1@{v}"), ok, counts, took: started.elapsed() }
}

#[derive(Default, Clone)]
struct Counts {
    passed: u64,
    failed: u64,
    ignored: u64,
    /// The failed tests by name (libtest's `test NAME ... FAILED` as `BINARY: NAME`, pytest's
    /// `FAILED PATH::NAME`), and what failed around them, for the summary.
    failures: Vec<String>,
    /// The libtest binary whose output is being read (cargo's `Running ... (target/.../NAME-HASH)`).
    binary: Option<String>,
    /// cargo's failed targets (`-p dataplane-user --test t2_detect`): a binary that crashed, hung
    /// or exited non-zero shows up here even when it named no failed test.
    failed_targets: Vec<String>,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.passed += o.passed;
        self.failed += o.failed;
        self.ignored += o.ignored;
        self.failures.extend(o.failures.iter().cloned());
        self.failed_targets.extend(o.failed_targets.iter().cloned());
    }

    /// Notes a failed test named on a libtest progress line (`test a::b ... FAILED`) or in
    /// pytest's short summary (`FAILED tests/test_x.py::test_y - AssertionError`).
    fn note_failure(&mut self, line: &str) {
        let line = line.trim();
        let name = if let Some(rest) = line.strip_prefix("test ") {
            rest.strip_suffix(" ... FAILED").map(|t| match &self.binary {
                Some(b) => format!("{b}: {t}"),
                None => t.to_owned(),
            })
        } else {
            line.strip_prefix("FAILED ").or_else(|| line.strip_prefix("ERROR ")).map(|r| r.split(" - ").next().unwrap_or(r).to_owned())
        };
        if let Some(name) = name {
            if !self.failures.contains(&name) {
                self.failures.push(name);
            }
        }
    }

    /// Follows cargo's lines around the test binaries' output: which binary runs now, and which
    /// targets failed (`error: test failed, to rerun pass `-p x --test y``, and with
    /// `--no-fail-fast` the closing list of `error: N targets failed:`). True if the line was one.
    fn note_cargo_line(&mut self, line: &str) -> bool {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("Running ") {
            // `Running tests/t2_detect.rs (target/debug/deps/t2_detect-0123456789abcdef)`
            let exe = rest.rsplit_once(" (").map_or(rest, |(_, p)| p.trim_end_matches(')'));
            let file = exe.rsplit('/').next().unwrap_or(exe);
            self.binary = Some(file.rsplit_once('-').map_or(file, |(stem, _)| stem).to_owned());
            return true;
        }
        if let Some(krate) = t.strip_prefix("Doc-tests ") {
            self.binary = Some(format!("{krate} (doc)"));
            return true;
        }
        let quoted = if let Some(rest) = t.strip_prefix("error: test failed, to rerun pass `") {
            rest.strip_suffix('`')
        } else {
            t.strip_prefix('`').and_then(|r| r.strip_suffix('`')).filter(|r| r.starts_with("-p ") || r.starts_with("--"))
        };
        if let Some(target) = quoted {
            if !self.failed_targets.iter().any(|f| f == target) {
                self.failed_targets.push(target.to_owned());
            }
            return true;
        }
        false
    }

    /// The failed targets that named no failed test: they did not build, crashed, or were
    /// killed (their output above says which).
    fn silent_failed_targets(&self) -> Vec<&str> {
        self.failed_targets
            .iter()
            .filter(|t| {
                let bin = target_binary(t);
                !self.failures.iter().any(|f| f.strip_prefix(bin.as_str()).is_some_and(|r| r.starts_with(": ")))
            })
            .map(String::as_str)
            .collect()
    }

    /// Adds the counts of pytest's summary line, `=== 1 failed, 52 passed, 1 skipped in 30.0s ===`
    /// (errors count as failures, skips as ignored).
    fn add_pytest_line(&mut self, line: &str) {
        self.note_failure(line);
        let line = line.trim();
        if !(line.starts_with('=') && line.ends_with('=')) {
            return;
        }
        let body = line.trim_matches(|c| c == '=' || c == ' ');
        let Some((counts, took)) = body.rsplit_once(" in ") else { return };
        // "in 12.34s", or past a minute "in 89.79s (0:01:29)".
        if !took.split_whitespace().next().is_some_and(|t| t.ends_with('s')) {
            return;
        }
        for part in counts.split(", ") {
            let Some((n, what)) = part.split_once(' ') else { continue };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" | "error" | "errors" => self.failed += n,
                "skipped" => self.ignored += n,
                _ => {}
            }
        }
    }

    /// Adds the counts of a libtest line `test result: ok. 3 passed; 0 failed; 1 ignored; ...`
    /// (and follows cargo's own lines: [`Counts::note_cargo_line`]).
    fn add_line(&mut self, line: &str) {
        if self.note_cargo_line(line) {
            return;
        }
        self.note_failure(line);
        let Some(rest) = line.trim().strip_prefix("test result: ") else { return };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else { continue };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// The name of the test binary a cargo target runs, as [`Counts::note_cargo_line`] records it:
/// `-p testbed --test t2_torch` is `t2_torch`, `-p dataplane-user --lib` is `dataplane_user`,
/// `--bin ringside` is `ringside`, `-p x --doc` is `x (doc)`.
fn target_binary(target: &str) -> String {
    let words: Vec<&str> = target.split_whitespace().collect();
    let after = |flag: &str| words.iter().position(|w| *w == flag).and_then(|i| words.get(i + 1)).copied();
    let package = after("-p").unwrap_or_default().replace('-', "_");
    if let Some(name) = after("--test").or_else(|| after("--bin")).or_else(|| after("--example")).or_else(|| after("--bench")) {
        name.to_owned()
    } else if words.contains(&"--doc") {
        format!("{package} (doc)")
    } else {
        package
    }
}

/// Runs a test command, echoing its output line by line while `count` sums its result lines.
/// stdout and stderr share one pipe, so cargo's `Running` lines (stderr) arrive in order with
/// the test binaries' results (stdout) and each failure is named with its binary.
fn run_counting(cmd: &mut Command, count: fn(&mut Counts, &str)) -> Result<(bool, Counts)> {
    use std::io::{BufRead, BufReader};
    let (reader, writer) = std::io::pipe()?;
    let mut child = cmd.stdout(writer.try_clone()?).stderr(writer).spawn()?;
    // The command keeps its copies of the pipe's write end until they are replaced: without
    // this the read below would never see the end of the output.
    cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let mut counts = Counts::default();
    for line in BufReader::new(reader).lines() {
        let line = line?;
        println!("{line}");
        count(&mut counts, &line);
    }
    Ok((child.wait()?.success(), counts))
}

/// The venv's interpreter (`cargo xtask setup` creates `target/venv` with torch and pytest).
fn venv_python() -> Result<PathBuf> {
    let python = workspace_root().join("target/venv/bin/python");
    if !python.is_file() {
        bail!(
            "{} is missing: the Python client's tests (tier T0) run in the venv that `cargo xtask setup` creates (torch, pytest); run `cargo xtask setup`",
            python.display()
        );
    }
    Ok(python)
}

/// Runs the Python suite. Passes only if pytest exits 0 having run at least one test and skipped
/// none: exit code 5 ("no tests collected") proves nothing, and a test that cannot run must fail
/// and say why rather than be skipped.
fn run_pytest(python: &Path) -> Result<(bool, Counts)> {
    let mut cmd = Command::new(python);
    // no:cacheprovider: nothing written into the source tree.
    cmd.current_dir(workspace_root()).args(["-m", "pytest", PY_TESTS, "-p", "no:cacheprovider"]);
    let (ok, counts) = run_counting(&mut cmd, Counts::add_pytest_line)
        .with_context(|| format!("cannot run {} -m pytest; run `cargo xtask setup`", python.display()))?;
    if counts.passed == 0 {
        println!("pytest ran no test from {PY_TESTS} (exit code 5 is \"no tests collected\"): that is a failure");
    }
    if counts.ignored > 0 {
        println!("pytest skipped {} test(s): a test that cannot run here must fail and say why", counts.ignored);
    }
    Ok((ok && counts.passed > 0 && counts.ignored == 0, counts))
}

/// Fails at once, saying what to do, when promtool is not installed.
fn check_promtool() -> Result<()> {
    match Command::new(PROMTOOL).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => bail!(
            "{PROMTOOL} is missing: tier T0 checks and unit-tests the Prometheus rules in {PROMETHEUS_RULES} with it; \
             run `cargo xtask setup` (Debian package prometheus)"
        ),
    }
}

/// The files of `dir` whose names end in `suffix`, sorted.
fn files_ending(dir: &Path, suffix: &str) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n.to_string_lossy().ends_with(suffix)))
        .collect();
    files.sort();
    Ok(files)
}

/// `promtool check rules` on every rule file and `promtool test rules` on every unit-test file,
/// one run per file so that each counts as one test (passed when promtool exits 0). Finding no
/// rule file or no unit-test file is a failure.
fn run_promtool() -> Result<(bool, Counts)> {
    let root = workspace_root();
    let dir = root.join(PROMETHEUS_RULES);
    let rules = files_ending(&dir, ".rules.yml")?;
    let tests = files_ending(&dir.join("tests"), ".yml")?;
    let mut counts = Counts::default();
    if rules.is_empty() || tests.is_empty() {
        println!("no rule files (*.rules.yml) or no unit tests (tests/*.yml) in {}: that is a failure", dir.display());
        counts.failed += 1;
        counts.failures.push(format!("{PROMETHEUS_RULES}: no rules or no tests"));
    }
    for (action, files) in [("check", &rules), ("test", &tests)] {
        for file in files {
            let rel = file.strip_prefix(&root).unwrap_or(file).display().to_string();
            let out = Command::new(PROMTOOL)
                .current_dir(&root)
                .args([action, "rules"])
                .arg(&rel)
                .output()
                .with_context(|| format!("running {PROMTOOL}; run `cargo xtask setup`"))?;
            print!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            let name = format!("promtool {action} rules {rel}");
            if out.status.success() {
                counts.passed += 1;
                println!("{name} ... ok");
            } else {
                counts.failed += 1;
                println!("{name} ... FAILED");
                counts.failures.push(name);
            }
        }
    }
    Ok((counts.failed == 0, counts))
}

#[cfg(test)]
mod tests {
    use super::Counts;

    /// The rules and their unit tests are where `run_promtool` looks, so T0 never passes vacuously.
    #[test]
    fn prometheus_rules_and_tests_are_found() {
        let dir = crate::util::workspace_root().join(super::PROMETHEUS_RULES);
        assert!(super::files_ending(&dir, ".rules.yml").unwrap().len() >= 2);
        assert!(!super::files_ending(&dir.join("tests"), ".yml").unwrap().is_empty());
    }

    #[test]
    fn sums_libtest_result_lines() {
        let mut c = Counts::default();
        c.add_line("test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s");
        c.add_line("test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 5 filtered out; finished in 1s");
        c.add_line("running 3 tests");
        c.add_line("test detect::tests::healthy_is_silent ... FAILED");
        c.add_line("test detect::tests::loss_is_seen ... ok");
        assert_eq!((c.passed, c.failed, c.ignored), (4, 2, 1));
        assert_eq!(c.failures, vec!["detect::tests::healthy_is_silent".to_string()]);
    }

    /// cargo's lines (stderr, read in order with the binaries' stdout) name each failure's binary
    /// and the binaries that failed without naming a test. The lines are cargo 1.95's, with
    /// `--no-fail-fast`.
    #[test]
    fn failures_are_named_with_their_binary_and_silent_crashes_are_listed() {
        let mut c = Counts::default();
        for line in [
            "     Running unittests src/lib.rs (target/debug/deps/dataplane_user-682c7c66d8d3d6c3)",
            "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s",
            "     Running tests/t2_detect.rs (target/debug/deps/t2_detect-8c23f8bc1200b1ec)",
            "test healthy_is_silent ... FAILED",
            "test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.26s",
            "error: test failed, to rerun pass `-p dataplane-user --test t2_detect`",
            "     Running tests/t2_torch.rs (target/debug/deps/t2_torch-03bc32fc75fee1ec)",
            "running 1 test",
            "error: test failed, to rerun pass `-p testbed --test t2_torch`",
            "  process didn't exit successfully: `/x/target/debug/deps/t2_torch-03bc32fc75fee1ec --ignored` (signal: 6, SIGABRT: process abort signal)",
            "   Doc-tests ringside_client",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.5s",
            "error: 2 targets failed:",
            "    `-p dataplane-user --test t2_detect`",
            "    `-p testbed --test t2_torch`",
        ] {
            c.add_line(line);
        }
        assert_eq!((c.passed, c.failed), (5, 1));
        assert_eq!(c.failures, vec!["t2_detect: healthy_is_silent".to_string()]);
        assert_eq!(c.failed_targets, vec!["-p dataplane-user --test t2_detect", "-p testbed --test t2_torch"]);
        assert_eq!(c.silent_failed_targets(), vec!["-p testbed --test t2_torch"]);
        assert_eq!(super::target_binary("-p dataplane-user --lib"), "dataplane_user");
        assert_eq!(super::target_binary("-p ringside-client --doc"), "ringside_client (doc)");
        assert_eq!(super::target_binary("-p dataplane-user --bin ringside"), "ringside");
    }

    /// A real `cargo test --no-fail-fast` through [`super::run_counting`]: a failing and an
    /// aborting test binary in a throwaway crate, both reported with their binary, and the read
    /// ends (the command's copies of the pipe are closed).
    #[test]
    fn run_counting_reads_cargo_and_its_binaries_in_one_stream() {
        let dir = std::env::temp_dir().join(format!("xtask-run-counting-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src")).unwrap();
        std::fs::create_dir_all(dir.join("tests")).unwrap();
        std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"rc\"\nversion = \"0.1.0\"\nedition = \"2021\"\n[workspace]\n").unwrap();
        std::fs::write(dir.join("src/lib.rs"), "").unwrap();
        std::fs::write(dir.join("tests/t_fail.rs"), "#[test] fn a() { assert!(false) }\n#[test] fn b() {}\n").unwrap();
        std::fs::write(dir.join("tests/t_abort.rs"), "#[test] fn c() { std::process::abort() }\n").unwrap();
        let mut cmd = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.current_dir(&dir).env("CARGO_TARGET_DIR", dir.join("target")).args(["test", "--no-fail-fast", "--tests"]);
        let (ok, c) = super::run_counting(&mut cmd, Counts::add_line).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!ok);
        assert_eq!(c.failures, vec!["t_fail: a".to_string()]);
        assert_eq!(c.silent_failed_targets(), vec!["--test t_abort"]);
    }

    #[test]
    fn sums_pytest_summary_lines() {
        let mut c = Counts::default();
        c.add_pytest_line("======================= 1 failed, 52 passed, 2 skipped, 1 warning in 30.12s =======================");
        c.add_pytest_line("==================== 2 errors in 0.50s ====================");
        c.add_pytest_line("tests/test_client.py::test_x PASSED in 3 passed ways");
        c.add_pytest_line("========================= no tests ran in 0.01s =========================");
        c.add_pytest_line("3 passed in 1.0s"); // not a summary line without the rule
        c.add_pytest_line("FAILED ringside-client/python/tests/test_hints.py::test_reconnect - AssertionError: x");
        assert_eq!((c.passed, c.failed, c.ignored), (52, 3, 2));
        assert_eq!(c.failures, vec!["ringside-client/python/tests/test_hints.py::test_reconnect".to_string()]);
        // Past a minute pytest adds the duration as h:mm:ss.
        let mut c = Counts::default();
        c.add_pytest_line("======================== 59 passed in 89.79s (0:01:29) =========================");
        assert_eq!(c.passed, 59);
    }
}


/// [`run`] `repeat` times in a row (setup only before the first round), one line per round and
/// a closing count; fails if any round failed.
pub fn run_repeated(tiers: &[Tier], no_setup: bool, repeat: u32, kernels: &[String]) -> Result<()> {
    if repeat <= 1 {
        return run(tiers, no_setup, kernels);
    }
    let mut rounds = Vec::new();
    for i in 0..repeat {
        println!("\n==> round {}/{repeat}", i + 1);
        let started = Instant::now();
        let r = run(tiers, no_setup || i > 0, kernels);
        let took = started.elapsed().as_secs_f64();
        match &r {
            Ok(()) => println!("==> round {}/{repeat}: ok ({took:.0} s, load average {})", i + 1, crate::eval::loadavg()),
            Err(e) => println!("==> round {}/{repeat}: FAILED ({took:.0} s, load average {}): {e:#}", i + 1, crate::eval::loadavg()),
        }
        rounds.push(r.is_ok());
    }
    let failed = rounds.iter().filter(|ok| !**ok).count();
    let list: Vec<String> = rounds.iter().enumerate().map(|(i, ok)| format!("{}:{}", i + 1, if *ok { "ok" } else { "FAILED" })).collect();
    println!("\n==> {repeat} rounds: {} ok, {failed} failed ({})", repeat as usize - failed, list.join(" "));
    if failed > 0 {
        bail!("{failed} of {repeat} rounds failed");
    }
    Ok(())
}
