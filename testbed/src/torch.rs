//! PyTorch on a rig: one `python ringside_ddp_train.py` per rank, each in its host's network
//! namespace, training an MLP with DistributedDataParallel over gloo (CPU). DDP all-reduces the
//! gradients in buckets during every backward pass, with PyTorch's and gloo's own code: real
//! third-party collective traffic for ringside's detectors, beside OpenMPI ([`crate::mpi`]).
//!
//! The training script (`testbed/python/ringside_ddp_train.py`) is embedded in this crate and
//! written into the job's output directory when the job starts, so no path lookup can fail. Its
//! module docs say what each timing in `rank-R.json` means; [`RunningJob::wait`] summarizes them
//! like the emulated job's.
//!
//! The Python: [`TorchConfig::python`], else `$RINGSIDE_PYTHON`, else the venv that
//! `cargo xtask setup` installs at `<workspace>/target/venv` (found next to the running
//! executable, as [`crate::job::find_rank_binary`] finds `ringside-rank`).
//!
//! Where the traffic goes: rank 0 listens for the rendezvous (PyTorch's TCP store) on
//! [`TorchConfig::port`] of its `eth0` address. gloo's own connections use ports the kernel picks
//! (bind to port 0, connect), and no PyTorch setting fixes them. So that a ringside job or
//! `[match]` can still name the job's traffic by port, the launcher narrows each rank host's
//! ephemeral port range (`net.ipv4.ip_local_port_range`, a per-namespace sysctl) to the
//! [`PORT_RANGE`] ports after `port`: every TCP connection of the job then has both ends in
//! `port ..= port + PORT_RANGE - 1` ([`TorchConfig::port_range`]). The setting stays with the
//! namespace (it dies with the rig); other programs started later in those namespaces get their
//! ephemeral ports from the same range.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::job::{rank_hosts_of, RunningJob};
use crate::rig::Rig;

/// The training script, embedded.
pub const SCRIPT: &str = include_str!("../python/ringside_ddp_train.py");

/// The file name the script gets in the job's output directory.
pub const SCRIPT_NAME: &str = "ringside_ddp_train.py";

/// Environment variable naming the Python to use when [`TorchConfig::python`] is `None`.
pub const PYTHON_ENV: &str = "RINGSIDE_PYTHON";

/// How many TCP ports the job uses, from [`TorchConfig::port`]: the store's port, then the rank
/// hosts' ephemeral range. A rank needs a listener and one connection per peer plus a few to the
/// store; the margin covers connections in TIME_WAIT when jobs follow each other on one rig.
pub const PORT_RANGE: u16 = 256;

/// Classes of the synthetic task (the script's output layer).
const CLASSES: u64 = 10;

/// The network interface gloo binds to in every rig host (`GLOO_SOCKET_IFNAME`).
const RIG_IFACE: &str = "eth0";

/// The static DDP communication hook: PyTorch's `default_hooks.allreduce_hook`,
/// `fp16_compress_hook` or `bf16_compress_hook`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TorchCompression {
    /// Full-precision (fp32) gradients.
    #[default]
    None,
    /// Gradients cast to float16 for the allreduce (half the bytes).
    Fp16,
    /// Gradients cast to bfloat16 for the allreduce (half the bytes).
    Bf16,
}

impl TorchCompression {
    /// The script's `--compression` value.
    pub fn name(self) -> &'static str {
        match self {
            TorchCompression::None => "none",
            TorchCompression::Fp16 => "fp16",
            TorchCompression::Bf16 => "bf16",
        }
    }
}

/// A PyTorch DDP job (see the module docs).
#[derive(Clone, Debug)]
pub struct TorchConfig {
    pub ranks: usize,
    /// Host index of each rank; `None` = rank r on host r.
    pub hosts: Option<Vec<usize>>,
    /// Stop after this many steps (0: no limit; then `duration` must be set).
    pub steps: u64,
    /// Stop after the first step that ends this long after training began (rank 0 decides and
    /// broadcasts the decision, so every rank ends after the same step and writes its JSON).
    pub duration: Option<Duration>,
    /// MLP width (input and hidden layers); gradient bytes per step ≈ 4 · layers · hidden².
    pub hidden: u64,
    /// Hidden layers.
    pub layers: u64,
    /// Samples per rank per step.
    pub batch: u64,
    /// DDP's gradient bucket size in MiB (PyTorch's default is 25; smaller buckets mean more,
    /// smaller allreduces overlapping the backward pass).
    pub bucket_cap_mb: f64,
    /// (rank, extra milliseconds of sleep per step): a compute straggler.
    pub straggler: Option<(usize, u64)>,
    pub compression: TorchCompression,
    /// (agent URL, tenant token): `ringside.torch.follow_hints` drives the comm hook instead of
    /// `compression` (the `ringside` Python package must be installed in the venv).
    pub follow_hints: Option<(String, String)>,
    /// The constraints `follow_hints` keeps, as JSON (`ringside.Constraints`, e.g. the job's
    /// registered ones: with `transport_tuning` the ranks also apply transport advice); `None`:
    /// the package's defaults.
    pub follow_constraints: Option<String>,
    /// The TCP store's port on rank 0's host, and the first of [`PORT_RANGE`] job ports.
    pub port: u16,
    /// The Python to run; see [`find_python`] when `None`.
    pub python: Option<PathBuf>,
    /// Bound on the rendezvous and on each collective inside the ranks (their `--timeout-s`).
    pub collective_timeout: Duration,
    /// The whole job is killed after this long.
    pub timeout: Duration,
    /// Where the script, `rank-R.json` and `rank-R.log` go; a fresh temp dir when `None`.
    pub out_dir: Option<PathBuf>,
    /// Extra environment for every rank, e.g. `("TORCH_DISTRIBUTED_DEBUG", "DETAIL")`.
    pub env: Vec<(String, String)>,
}

impl Default for TorchConfig {
    fn default() -> Self {
        TorchConfig {
            ranks: 4,
            hosts: None,
            steps: 50,
            duration: None,
            hidden: 1024,
            layers: 2,
            batch: 128,
            bucket_cap_mb: 4.0,
            straggler: None,
            compression: TorchCompression::None,
            follow_hints: None,
            follow_constraints: None,
            port: 29500,
            python: None,
            collective_timeout: Duration::from_secs(60),
            timeout: Duration::from_secs(600),
            out_dir: None,
            env: Vec::new(),
        }
    }
}

impl TorchConfig {
    /// The job's TCP ports as `"lo-hi"` (for a ringside `[[job]]` or `[match]`).
    pub fn port_range(&self) -> String {
        format!("{}-{}", self.port, self.port + PORT_RANGE - 1)
    }

    /// The model's parameter count: `layers` hidden layers of `hidden`×`hidden` (+ bias), then
    /// the output layer.
    pub fn params(&self) -> u64 {
        self.layers * (self.hidden * self.hidden + self.hidden) + self.hidden * CLASSES + CLASSES
    }

    /// Gradient bytes each rank hands to the allreduce per step (fp32, before any compression).
    pub fn grad_bytes(&self) -> u64 {
        self.params() * 4
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |field, reason: String| Err(Error::InvalidArgument { field, reason });
        if self.steps == 0 && self.duration.is_none() {
            return bad("steps", "0 steps and no duration: the job would never stop".into());
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            return bad("duration", "0: give a positive duration or none".into());
        }
        if !(16..=8192).contains(&self.hidden) {
            return bad("hidden", format!("{} (need 16..=8192)", self.hidden));
        }
        if !(1..=64).contains(&self.layers) {
            return bad("layers", format!("{} (need 1..=64)", self.layers));
        }
        if !(1..=65536).contains(&self.batch) {
            return bad("batch", format!("{} (need 1..=65536)", self.batch));
        }
        // Every rank holds the model, its gradients and the optimizer's momentum: 3 copies.
        if self.grad_bytes() > 1 << 30 {
            return bad("hidden", format!("{} layers of {} is {} MiB of gradients per rank (limit 1024 MiB)", self.layers, self.hidden, self.grad_bytes() >> 20));
        }
        if !(self.bucket_cap_mb > 0.0 && self.bucket_cap_mb <= 1024.0) {
            return bad("bucket_cap_mb", format!("{} (need > 0 and <= 1024)", self.bucket_cap_mb));
        }
        if self.port < 1024 || self.port > u16::MAX - PORT_RANGE {
            return bad("port", format!("{} (need 1024..={} so the job's {PORT_RANGE} ports fit)", self.port, u16::MAX - PORT_RANGE));
        }
        if self.collective_timeout < Duration::from_secs(1) {
            return bad("collective_timeout", format!("{:?} (need at least 1 s)", self.collective_timeout));
        }
        if let Some((url, token)) = &self.follow_hints {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return bad("follow_hints", format!("{url:?} is not an http(s) URL of a ringside agent"));
            }
            if token.is_empty() {
                return bad("follow_hints", "an empty tenant token".into());
            }
            if self.compression != TorchCompression::None {
                return bad("compression", "a static compression and follow_hints exclude each other: with hints, ringside chooses".into());
            }
        }
        if self.follow_constraints.is_some() && self.follow_hints.is_none() {
            return bad("follow_constraints", "constraints for follow_hints without follow_hints".into());
        }
        if let Some((r, _)) = self.straggler {
            if r >= self.ranks {
                return bad("straggler", format!("rank {r} does not exist in a job of {} ranks", self.ranks));
            }
        }
        Ok(())
    }

    /// The script's arguments for `rank` (after the script's path). The tenant token is not
    /// among them: it goes through the environment (`RINGSIDE_TOKEN`), out of `ps`'s sight.
    pub fn rank_args(&self, rank: usize, master: &str, out: &Path) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--rank".into(),
            rank.to_string(),
            "--world".into(),
            self.ranks.to_string(),
            "--master".into(),
            master.to_string(),
            "--out".into(),
            out.display().to_string(),
            "--hidden".into(),
            self.hidden.to_string(),
            "--layers".into(),
            self.layers.to_string(),
            "--batch".into(),
            self.batch.to_string(),
            "--bucket-cap-mb".into(),
            self.bucket_cap_mb.to_string(),
            "--timeout-s".into(),
            self.collective_timeout.as_secs_f64().to_string(),
        ];
        if self.steps > 0 {
            a.extend(["--steps".into(), self.steps.to_string()]);
        }
        if let Some(d) = self.duration {
            a.extend(["--duration-ms".into(), d.as_millis().to_string()]);
        }
        if let Some((r, extra)) = self.straggler {
            if r == rank {
                a.extend(["--straggler-extra-ms".into(), extra.to_string()]);
            }
        }
        match &self.follow_hints {
            Some((url, _)) => a.extend(["--follow-hints".into(), url.clone()]),
            None => a.extend(["--compression".into(), self.compression.name().into()]),
        }
        if let Some(c) = &self.follow_constraints {
            a.extend(["--follow-constraints".into(), c.clone()]);
        }
        a
    }
}

/// The Python that runs the ranks: `explicit`, else `$RINGSIDE_PYTHON`, else the venv of
/// `cargo xtask setup` (`<target>/venv/bin/python`, found from the current executable: binaries
/// live in `target/<profile>/`, test binaries in `target/<profile>/deps/`).
pub fn find_python(explicit: Option<&Path>) -> Result<PathBuf> {
    let given = explicit.map(Path::to_path_buf).or_else(|| std::env::var_os(PYTHON_ENV).map(PathBuf::from));
    if let Some(p) = given {
        return if p.is_file() { Ok(p) } else { Err(Error::PythonMissing { python: p }) };
    }
    let exe = std::env::current_exe().map_err(|e| Error::file("/proc/self/exe", e))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let venv_python = |target: &Path| target.join("venv").join("bin").join("python");
    let candidates: Vec<PathBuf> = dir.ancestors().skip(1).take(2).map(venv_python).collect();
    candidates
        .iter()
        .find(|c| c.is_file())
        .cloned()
        .ok_or_else(|| Error::PythonMissing { python: candidates.first().cloned().unwrap_or_else(|| venv_python(dir)) })
}

/// Starts one rank per host (see the module docs). The returned [`RunningJob`] waits for every
/// rank and reads its JSON; dropping it kills the ranks still running.
pub fn spawn_torch<R: Rig + ?Sized>(rig: &R, cfg: &TorchConfig) -> Result<RunningJob> {
    cfg.validate()?;
    let hosts = rank_hosts_of(rig, cfg.ranks, cfg.hosts.as_deref())?;
    let python = find_python(cfg.python.as_deref())?;
    let mut job = RunningJob::prepare(cfg.out_dir.as_deref(), "ringside-torch", cfg.timeout)?;
    let out_dir = job.out_dir().to_path_buf();
    let script = out_dir.join(SCRIPT_NAME);
    std::fs::write(&script, SCRIPT).map_err(|e| Error::file(&script, e))?;
    job.record_straggler(rig, &hosts, cfg.straggler)?;
    let master = format!("{}:{}", rig.host_ipv4(hosts[0])?, cfg.port);
    let ephemeral = format!("{} {}", u32::from(cfg.port) + 1, u32::from(cfg.port) + u32::from(PORT_RANGE) - 1);
    for &h in &hosts {
        rig.host_netns(h)?.handle().sysctl_write("net/ipv4/ip_local_port_range", &ephemeral)?;
    }
    for (r, &host) in hosts.iter().enumerate() {
        let ns = rig.host_netns(host)?;
        let out = out_dir.join(format!("rank-{r}.json"));
        let log = out_dir.join(format!("rank-{r}.log"));
        let _ = std::fs::remove_file(&out);
        let _ = std::fs::remove_file(started_file(&out_dir, r));
        let logf = std::fs::File::create(&log).map_err(|e| Error::file(&log, e))?;
        let logf2 = logf.try_clone().map_err(|e| Error::file(&log, e))?;
        let mut cmd = ns.command(&python);
        cmd.arg(&script)
            .args(cfg.rank_args(r, &master, &out))
            .env("GLOO_SOCKET_IFNAME", RIG_IFACE)
            // One compute thread per rank (the script also sets torch's): the ranks share the
            // machine's cores, and per-rank thread pools sized to all of them would thrash.
            .env("OMP_NUM_THREADS", "1")
            .env("PYTHONUNBUFFERED", "1")
            .envs(cfg.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&out_dir)
            .stdin(Stdio::null())
            .stdout(logf)
            .stderr(logf2);
        if let Some((_, token)) = &cfg.follow_hints {
            cmd.env("RINGSIDE_TOKEN", token);
        }
        let command = crate::cmd::describe(&cmd);
        tracing::info!(rank = r, netns = ns.name(), %command, "starting PyTorch rank");
        // On error `job` is dropped here, killing the ranks already started.
        let child = cmd.spawn().map_err(|source| Error::Spawn { command, source })?;
        job.add_rank(r, Some(child), out, log);
    }
    Ok(job)
}

/// `rank-R.started`, which the script writes when rank R begins its first step.
fn started_file(out_dir: &Path, rank: usize) -> PathBuf {
    out_dir.join(format!("rank-{rank}.started"))
}

/// Waits until every rank of `job` (started by [`spawn_torch`]) has begun training, and returns
/// when the last one did (Unix ms). Starting a rank costs seconds of CPU (importing torch,
/// rendezvous, DDP setup: 5-15 s on 2 shared cores), so a fault meant to hit training is timed
/// from here, not from the spawn. Polls every 100 ms; fails when a rank exits first (its log
/// says why), when `stop` is set, or after `timeout`.
pub fn wait_training_started(job: &RunningJob, timeout: Duration, stop: Option<&AtomicBool>) -> Result<u64> {
    let started = Instant::now();
    let poll = Duration::from_millis(100);
    let pids = job.pids();
    for _ in 0..=(timeout.as_millis() / poll.as_millis()) {
        let mut latest = Some(0u64);
        for (rank, pid) in pids.iter().enumerate() {
            let path = started_file(job.out_dir(), rank);
            match std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok()) {
                Some(v) => latest = latest.map(|l| l.max(v["started_unix_ms"].as_u64().unwrap_or(0))),
                None => {
                    latest = None;
                    if pid.is_some_and(|p| !process_alive(p)) {
                        job.keep_output_dir();
                        let log = job.out_dir().join(format!("rank-{rank}.log"));
                        return Err(Error::RankFailed { rank, detail: "exited before training began".into(), log });
                    }
                }
            }
        }
        if let Some(t) = latest {
            return Ok(t);
        }
        if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
            break;
        }
        if started.elapsed() >= timeout {
            break;
        }
        std::thread::sleep(poll);
    }
    job.keep_output_dir();
    Err(Error::Timeout {
        what: "every PyTorch rank to begin training".into(),
        waited: started.elapsed(),
        detail: format!("see the rank logs in {}", job.out_dir().display()),
    })
}

/// Whether `pid` is running: present in /proc and not a zombie (an exited child nobody reaped
/// yet; [`RunningJob::wait`] reaps the ranks).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        // The state follows the command name, which is in parentheses and may contain spaces.
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with(|c| c != 'Z' && c != 'X')))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_sized_for_visible_traffic() {
        let c = TorchConfig::default();
        c.validate().unwrap();
        assert_eq!(c.port_range(), "29500-29755");
        // 2 · (1024² + 1024) + 1024 · 10 + 10 = 2,109,450 parameters: the script reports this count.
        assert_eq!(c.params(), 2_109_450);
        let mib = c.grad_bytes() as f64 / f64::from(1 << 20);
        assert!((4.0..=16.0).contains(&mib), "{mib} MiB of gradients per step");
    }

    #[test]
    fn bad_configs_are_refused_with_the_field_named() {
        let err = |c: TorchConfig| c.validate().unwrap_err().to_string();
        assert!(err(TorchConfig { steps: 0, ..Default::default() }).contains("never stop"));
        assert!(err(TorchConfig { steps: 0, duration: Some(Duration::ZERO), ..Default::default() }).contains("duration"));
        assert!(err(TorchConfig { hidden: 8, ..Default::default() }).contains("hidden"));
        assert!(err(TorchConfig { layers: 0, ..Default::default() }).contains("layers"));
        assert!(err(TorchConfig { batch: 0, ..Default::default() }).contains("batch"));
        assert!(err(TorchConfig { hidden: 8192, layers: 8, ..Default::default() }).contains("MiB of gradients"));
        assert!(err(TorchConfig { bucket_cap_mb: 0.0, ..Default::default() }).contains("bucket_cap_mb"));
        assert!(err(TorchConfig { bucket_cap_mb: f64::NAN, ..Default::default() }).contains("bucket_cap_mb"));
        assert!(err(TorchConfig { port: 80, ..Default::default() }).contains("port"));
        assert!(err(TorchConfig { port: 65500, ..Default::default() }).contains("port"));
        assert!(err(TorchConfig { straggler: Some((4, 10)), ..Default::default() }).contains("rank 4"));
        let hints = |url: &str, token: &str| Some((url.to_string(), token.to_string()));
        assert!(err(TorchConfig { follow_hints: hints("127.0.0.1:9464", "t"), ..Default::default() }).contains("URL"));
        assert!(err(TorchConfig { follow_hints: hints("http://127.0.0.1:9464", ""), ..Default::default() }).contains("token"));
        let both = TorchConfig { follow_hints: hints("http://127.0.0.1:9464", "t"), compression: TorchCompression::Fp16, ..Default::default() };
        assert!(err(both).contains("exclude"));
        TorchConfig { steps: 0, duration: Some(Duration::from_secs(5)), ..Default::default() }.validate().unwrap();
    }

    #[test]
    fn rank_args_carry_the_straggler_the_stop_rule_and_no_token() {
        let c = TorchConfig {
            ranks: 3,
            steps: 0,
            duration: Some(Duration::from_millis(2500)),
            straggler: Some((1, 40)),
            compression: TorchCompression::Bf16,
            ..Default::default()
        };
        let a = |r| c.rank_args(r, "10.77.0.1:29500", Path::new("/tmp/o/rank.json")).join(" ");
        assert_eq!(
            a(0),
            "--rank 0 --world 3 --master 10.77.0.1:29500 --out /tmp/o/rank.json --hidden 1024 --layers 2 --batch 128 \
             --bucket-cap-mb 4 --timeout-s 60 --duration-ms 2500 --compression bf16"
        );
        assert!(a(1).contains("--straggler-extra-ms 40"));
        assert!(!a(2).contains("straggler"));
        let h = TorchConfig { follow_hints: Some(("http://127.0.0.1:9464".into(), "secret".into())), ..c };
        let a = h.rank_args(0, "10.77.0.1:29500", Path::new("x")).join(" ");
        assert!(a.contains("--follow-hints http://127.0.0.1:9464") && !a.contains("secret") && !a.contains("--compression"), "{a}");
    }

    /// The script's own argument parser (stdlib argparse, `--dry-run` stops before torch is
    /// imported) accepts exactly what [`TorchConfig::rank_args`] builds, and refuses bad input
    /// with a message. Needs a `python3` on PATH (any CPython 3); fails saying so otherwise.
    #[test]
    fn the_script_accepts_the_launchers_arguments() {
        let dir = std::env::temp_dir().join(format!("ringside-torch-t0-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join(SCRIPT_NAME);
        std::fs::write(&script, SCRIPT).unwrap();
        let run = |args: &[String], env: &[(&str, &str)]| {
            let out = std::process::Command::new("python3")
                .arg(&script)
                .args(args)
                .envs(env.iter().copied())
                .output()
                .unwrap_or_else(|e| panic!("this test runs the training script's argument parser with python3: {e}"));
            (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
        };
        let c = TorchConfig {
            ranks: 3,
            steps: 7,
            duration: Some(Duration::from_secs(2)),
            straggler: Some((2, 30)),
            follow_hints: Some(("http://10.77.0.253:9464".into(), "tok".into())),
            ..Default::default()
        };
        let mut args = c.rank_args(2, "10.77.0.1:29500", &dir.join("rank-2.json"));
        args.push("--dry-run".into());
        let (code, stdout, stderr) = run(&args, &[("RINGSIDE_TOKEN", "tok")]);
        assert_eq!(code, Some(0), "{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["rank"], 2);
        assert_eq!(v["world"], 3);
        assert_eq!(v["steps"], 7);
        assert_eq!(v["duration_ms"], 2000);
        assert_eq!(v["straggler_extra_ms"], 30.0);
        assert_eq!(v["follow_hints"], "http://10.77.0.253:9464");
        assert_eq!(v["token"], "tok");
        assert_eq!(v["bucket_cap_mb"], 4.0);

        // Without the token in the environment, --follow-hints is refused.
        let (code, _, stderr) = run(&args, &[]);
        assert_eq!(code, Some(2));
        assert!(stderr.contains("--follow-hints needs --token"), "{stderr}");
        let bad: Vec<String> = ["--rank", "5", "--world", "2", "--master", "nowhere", "--out", "x"].map(String::from).to_vec();
        let (code, _, stderr) = run(&bad, &[]);
        assert_eq!(code, Some(2));
        for want in ["--rank 5", "ADDR:PORT", "never stop"] {
            assert!(stderr.contains(want), "{want:?} missing from {stderr}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn process_liveness_reads_proc() {
        assert!(process_alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Until reaped, the exited child is a zombie: not alive.
        for _ in 0..100 {
            if !process_alive(pid) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!process_alive(pid));
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }

    #[test]
    fn a_missing_python_says_how_to_get_one() {
        let e = find_python(Some(Path::new("/nonexistent/python"))).unwrap_err().to_string();
        assert!(e.contains("cargo xtask setup") && e.contains(PYTHON_ENV), "{e}");
    }

    #[test]
    fn compression_names_are_the_scripts() {
        for c in [TorchCompression::None, TorchCompression::Fp16, TorchCompression::Bf16] {
            assert!(SCRIPT.contains(&format!("\"{}\"", c.name())), "{}", c.name());
        }
    }
}
