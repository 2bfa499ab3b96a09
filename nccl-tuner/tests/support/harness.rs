//! Driving `tests/harness.c`: builds the plugin and the harness, loads the plugin from a private
//! directory under NCCL's file name, and reads the harness's decisions. Shared by
//! `nccl-tuner/tests/harness.rs` (T0) and `dataplane-user/tests/t2_nccl_tuner.rs` (T2, through
//! `#[path]`), so it uses nothing but std.
//!
//! Every wait is bounded: a harness that does not answer within the given time is killed (on
//! drop) and the test fails saying what it waited for.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The nccl-tuner crate directory, from either crate's tests.
fn crate_dir() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if here.ends_with("nccl-tuner") { here } else { here.join("../nccl-tuner") }
}

/// `target/<profile>` of the running test binary (`target/<profile>/deps/<test>`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent().and_then(Path::parent).expect("the test binary lives in target/<profile>/deps").to_path_buf()
}

/// A unique scratch directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!("rs-{}-{}-nccl-{tag}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds the plugin (`cargo build -p ringside-nccl-tuner`, same profile and target directory as
/// this test, so it is never stale) and returns the cdylib's path.
pub fn build_plugin() -> PathBuf {
    let profile = profile_dir();
    let target = profile.parent().expect("target dir").to_path_buf();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "ringside-nccl-tuner", "--target-dir"]).arg(&target).current_dir(crate_dir());
    if profile.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("running cargo to build the plugin");
    assert!(status.success(), "`cargo build -p ringside-nccl-tuner` failed ({status}); its errors are above");
    let lib = profile.join("libnccl_tuner_ringside.so");
    assert!(lib.is_file(), "the plugin was built but {} is missing", lib.display());
    lib
}

/// The plugin copied under NCCL's name (`libnccl-tuner-ringside.so`) into `dir`, which the
/// harness then finds through `LD_LIBRARY_PATH`, as NCCL finds it with `NCCL_TUNER_PLUGIN=ringside`.
pub fn install_plugin(lib: &Path, dir: &Path) {
    let to = dir.join("libnccl-tuner-ringside.so");
    std::fs::copy(lib, &to).unwrap_or_else(|e| panic!("copying {} to {}: {e}", lib.display(), to.display()));
}

/// Compiles tests/harness.c into `dir` with `$CC` (default `cc`), warnings as errors.
pub fn compile_harness(dir: &Path) -> PathBuf {
    let src = crate_dir();
    let out = dir.join("nccl-tuner-harness");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let output = Command::new(&cc)
        .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(src.join("include"))
        .arg(src.join("tests/harness.c"))
        .arg("-o")
        .arg(&out)
        .arg("-ldl")
        .output()
        .unwrap_or_else(|e| panic!("running the C compiler {cc:?} (gcc: `apt-get install gcc`, or set CC): {e}"));
    assert!(output.status.success(), "compiling tests/harness.c failed:\n{}", String::from_utf8_lossy(&output.stderr));
    out
}

/// One decision the harness printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pick {
    pub version: u32,
    pub coll: String,
    pub bytes: u64,
    pub default_algo: String,
    pub default_proto: String,
    pub algo: String,
    pub proto: String,
    pub channels: i32,
    pub chunk: u64,
    pub rc: i32,
    pub chunk_rc: i32,
}

/// The chunk size the harness's "NCCL" uses when the plugin leaves it.
pub const DEFAULT_CHUNK: u64 = 131072;

impl Pick {
    fn parse(line: &str) -> Pick {
        let field = |k: &str| -> &str {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
                .unwrap_or_else(|| panic!("harness line without {k}=: {line}"))
        };
        let pair = |k: &str| -> (String, String) {
            let (a, p) = field(k).split_once('/').unwrap_or_else(|| panic!("{k} is not algo/proto: {line}"));
            (a.to_owned(), p.to_owned())
        };
        let num = |k: &str| -> i64 { field(k).parse().unwrap_or_else(|_| panic!("{k} is not a number: {line}")) };
        let (default_algo, default_proto) = pair("default");
        let (algo, proto) = pair("chosen");
        Pick {
            version: num("v") as u32,
            coll: field("coll").to_owned(),
            bytes: num("bytes") as u64,
            default_algo,
            default_proto,
            algo,
            proto,
            channels: num("channels") as i32,
            chunk: num("chunk") as u64,
            rc: num("rc") as i32,
            chunk_rc: num("chunk_rc") as i32,
        }
    }

    /// The plugin changed nothing in this decision.
    pub fn is_default(&self) -> bool {
        self.algo == self.default_algo && self.proto == self.default_proto && self.channels == 0 && self.chunk == DEFAULT_CHUNK
    }
}

/// A running harness; killed on drop.
pub struct Harness {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Every `log ...` line so far (the plugin's messages through NCCL's logger).
    pub log: Vec<String>,
    pub version: u32,
}

impl Harness {
    /// Starts `cmd` (the compiled harness, maybe inside a namespace) for tuner `version` with the
    /// plugin in `plugin_dir` and exactly the `RINGSIDE_*` variables in `env`; waits (bounded) for
    /// init and asserts it succeeded.
    pub fn start(mut cmd: Command, plugin_dir: &Path, version: u32, env: &[(&str, &str)]) -> Harness {
        cmd.arg("ringside").arg(version.to_string()).env("LD_LIBRARY_PATH", plugin_dir);
        for var in ["RINGSIDE_JOB_URL", "RINGSIDE_TOKEN"] {
            cmd.env_remove(var);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("starting the harness");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut h = Harness { child, stdin, lines, log: Vec::new(), version };
        let init = h.until(|l| l.starts_with("init "), Duration::from_secs(20), "init");
        assert_eq!(init, "init rc=0 ctx=set", "v{version}: init");
        h
    }

    fn send(&mut self, cmd: &str) {
        let stdin = self.stdin.as_mut().expect("harness stdin open");
        writeln!(stdin, "{cmd}").and_then(|_| stdin.flush()).unwrap_or_else(|e| panic!("v{}: writing {cmd:?} to the harness: {e}", self.version));
    }

    /// Reads lines (keeping log lines) until one satisfies `done`, for at most `within`.
    fn until(&mut self, mut done: impl FnMut(&str) -> bool, within: Duration, what: &str) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if line.starts_with("log ") {
                        self.log.push(line.clone());
                    }
                    if done(&line) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("v{}: the harness hung: no {what} within {within:?}", self.version),
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    panic!("v{}: the harness exited ({status:?}) before {what}; log: {:#?}", self.version, self.log)
                }
            }
        }
    }

    /// One round of decisions (every collective x size).
    pub fn round(&mut self) -> Vec<Pick> {
        self.send("round");
        let mut picks = Vec::new();
        self.until(
            |l| {
                if l.starts_with("pick ") {
                    picks.push(Pick::parse(l));
                }
                l == "end"
            },
            Duration::from_secs(20),
            "end of round",
        );
        assert_eq!(picks.len(), 5 * 9, "v{}: 5 collectives x 9 sizes", self.version);
        for p in &picks {
            assert_eq!((p.rc, p.chunk_rc), (0, 0), "v{}: the plugin must never fail a decision: {p:?}", self.version);
        }
        picks
    }

    /// Collects the log lines printed so far.
    pub fn sync(&mut self) {
        self.send("sync");
        self.until(|l| l == "synced", Duration::from_secs(20), "synced");
    }

    /// Rounds until `ok` holds for one (every 200 ms, at most `within`); returns that round.
    pub fn round_until(&mut self, within: Duration, what: &str, ok: impl Fn(&[Pick]) -> bool) -> Vec<Pick> {
        let deadline = Instant::now() + within;
        loop {
            let picks = self.round();
            if ok(&picks) {
                return picks;
            }
            if Instant::now() > deadline {
                panic!("v{}: {what} not seen within {within:?}; last round: {picks:#?}\nlog: {:#?}", self.version, self.log);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits (bounded) until a log line contains `needle`.
    pub fn wait_log(&mut self, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            self.sync();
            if self.logged(needle) {
                return;
            }
            if Instant::now() > deadline {
                panic!("v{}: no log line with {needle:?} within {within:?}; log: {:#?}", self.version, self.log);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether a log line so far contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log.iter().any(|l| l.contains(needle))
    }

    /// destroy/finalize and dlclose; asserts a clean exit (bounded).
    pub fn quit(mut self) {
        self.send("quit");
        let destroyed = self.until(|l| l.starts_with("destroyed "), Duration::from_secs(20), "destroy");
        assert_eq!(destroyed, "destroyed rc=0", "v{}", self.version);
        self.until(|l| l == "bye", Duration::from_secs(20), "bye after dlclose");
        self.stdin = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the harness") {
                assert!(status.success(), "v{}: harness exit {status}", self.version);
                return;
            }
            assert!(Instant::now() < deadline, "v{}: the harness did not exit after bye", self.version);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Asserts the plugin changed nothing in any decision of a round.
pub fn assert_all_default(picks: &[Pick], when: &str) {
    for p in picks {
        assert!(p.is_default(), "{when}: the plugin changed NCCL's decision: {p:?}");
    }
}

/// Allreduce at every size runs `algo` with `channels` (and, v6+, the hinted `chunk` on Simple);
/// every other collective is exactly NCCL's.
pub fn steered(picks: &[Pick], algo: &str, channels: i32, chunk: u64) -> bool {
    picks.iter().all(|p| {
        if p.coll != "allreduce" {
            return p.is_default();
        }
        let want_chunk = if p.version >= 6 && p.proto == "simple" { chunk } else { DEFAULT_CHUNK };
        p.algo == algo && p.channels == channels && p.chunk == want_chunk
    })
}

/// Every ABI version the plugin exports.
pub const VERSIONS: std::ops::RangeInclusive<u32> = 2..=7;
