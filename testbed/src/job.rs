//! The emulated training job: one `ringside-rank` process per host of a rig ([`crate::Star`],
//! [`crate::LeafSpine`], anything that implements [`Rig`]), each talking to its peers over the
//! rig's links, then a summary of their step and communication times. A straggler is recorded in
//! the rig's fault log (kind `straggler`, start = job start, end = job end).
//!
//! `ringside-rank` (built in ipu-firmware) is started as
//! `ringside-rank --rank R --world N --peers IP:PORT,... --size 16MiB --steps S --compute-ms C
//! [--straggler-extra-ms E] [--algorithm A] [--compression C] [--verify] --out FILE.json`
//! inside host R's namespace, with stdout and stderr in `rank-R.log` next to `rank-R.json`.
//!
//! The summary reads each rank's JSON tolerantly: per-step records under `"steps"` (objects with
//! a step time `step_ms` / `total_ms` / `duration_ms` and a communication time `comm_ms` /
//! `communication_ms` / `collective_ms`), or top-level arrays `"step_ms"` and `"comm_ms"`.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::size::ByteSize;
use crate::fault::{self, FaultKind, FaultLog};
use crate::rig::Rig;

/// Name of the rank binary.
pub const RANK_BINARY: &str = "ringside-rank";

/// A job to run on a star.
#[derive(Debug, Clone)]
pub struct JobConfig {
    /// Ranks; the star must have at least this many hosts (rank r runs on host r).
    pub ranks: usize,
    /// Bytes per collective (passed through as `--size`).
    pub size: ByteSize,
    pub steps: u32,
    pub compute_ms: u64,
    pub algorithm: Option<String>,
    pub compression: Option<String>,
    /// (rank, extra compute milliseconds per step).
    pub straggler: Option<(usize, u64)>,
    /// Pass `--verify` to the ranks.
    pub verify: bool,
    /// The `ringside-rank` binary; [`find_rank_binary`] when `None`.
    pub rank_bin: Option<PathBuf>,
    /// TCP port every rank listens on (on its own host address). Default 29500.
    pub port: u16,
    /// Kill the job if it has not finished by then.
    pub timeout: Duration,
    /// Where rank JSON and logs go; a fresh directory under the temp dir when `None`.
    pub out_dir: Option<PathBuf>,
    /// Extra arguments appended to every rank's command line.
    pub extra_args: Vec<String>,
    /// Host index of each rank (`hosts[r]` runs rank r); `None` = rank r on host r. Lets a job
    /// leave hosts free for cross traffic, e.g. ranks on hosts 0,1,3,4 of a 2×3 leaf-spine.
    pub hosts: Option<Vec<usize>>,
    /// Managed mode (an [`crate::IpuStar`] after [`crate::managed::enable_managed`]): the port of
    /// the `ringside-ipu` services; rank r runs with `--managed 10.78.<host>.1:PORT` (its IPU's
    /// host-link address) and hands every allreduce to its service.
    pub managed: Option<u16>,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            ranks: 4,
            size: ByteSize(16 << 20),
            steps: 10,
            compute_ms: 50,
            algorithm: None,
            compression: None,
            straggler: None,
            verify: false,
            rank_bin: None,
            port: 29500,
            timeout: Duration::from_secs(300),
            out_dir: None,
            extra_args: Vec::new(),
            hosts: None,
            managed: None,
        }
    }
}

/// `ringside-rank` next to the current executable (and, for test binaries in
/// `target/<profile>/deps`, one directory up), unless `explicit` is given.
pub fn find_rank_binary(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return if p.is_file() { Ok(p.to_path_buf()) } else { Err(Error::RankBinaryMissing { binary: p.to_path_buf() }) };
    }
    let exe = std::env::current_exe().map_err(|e| Error::file("/proc/self/exe", e))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [dir.join(RANK_BINARY), dir.join("..").join(RANK_BINARY)];
    candidates
        .iter()
        .find(|c| c.is_file())
        .cloned()
        .ok_or_else(|| Error::RankBinaryMissing { binary: candidates[0].clone() })
}

static JOB_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A running job. Dropping it kills every rank still running.
#[derive(Debug)]
pub struct RunningJob {
    ranks: Vec<RankProcess>,
    out_dir: PathBuf,
    started: Instant,
    started_unix_ms: u64,
    timeout: Duration,
    /// The straggler's record in the rig's fault log, ended when the job ends.
    straggler_fault: Option<(FaultLog, u64)>,
    /// Processes to kill on drop that are not our children: (namespaces, command names). mpirun's
    /// daemons and ranks are started through `nsenter` and can outlive a killed mpirun.
    sweep: Option<(Vec<String>, Vec<String>)>,
    /// `out_dir` was made by [`RunningJob::prepare`] under the temp dir (no directory was given):
    /// removed on drop unless [`RunningJob::wait`] ran (its report or error points into it),
    /// [`RunningJob::keep_output_dir`] was called, or the thread is panicking (a failing test's
    /// logs stay). `cargo xtask testbed clean` removes those left by processes that are gone
    /// ([`stale_job_dirs`]).
    own_dir: bool,
    keep_dir: std::sync::atomic::AtomicBool,
}

/// Prefixes of the output directories [`RunningJob::prepare`] makes under the temp dir, named
/// `PREFIX-PID-N`: the emulated job, OpenMPI, PyTorch.
pub(crate) const JOB_DIR_PREFIXES: [&str; 3] = ["ringside-job", "ringside-mpi", "ringside-torch"];

/// Output directories under `tmp` that a job launcher of a process now gone made and left (a
/// killed run, or a failed one whose logs were read): `PREFIX-PID-N` with a dead PID.
pub fn stale_job_dirs(tmp: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(tmp) else { return Vec::new() };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            JOB_DIR_PREFIXES.iter().any(|p| {
                let Some(rest) = name.strip_prefix(p).and_then(|r| r.strip_prefix('-')) else { return false };
                let Some((pid, n)) = rest.split_once('-') else { return false };
                match (pid.parse::<i32>(), n.parse::<u64>()) {
                    (Ok(pid), Ok(_)) => !crate::netns::pid_alive(pid),
                    _ => false,
                }
            })
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

#[derive(Debug)]
struct RankProcess {
    rank: usize,
    child: Option<Child>,
    out: PathBuf,
    log: PathBuf,
    status: Option<std::process::ExitStatus>,
}

/// The ranks' peer list: `10.77.0.1:29500,10.77.0.2:29500,...` (index = rank, rank r on host r).
pub fn peer_list<R: Rig + ?Sized>(rig: &R, ranks: usize, port: u16) -> String {
    (0..ranks.min(rig.host_count())).filter_map(|i| rig.host_ipv4(i).ok()).map(|a| format!("{a}:{port}")).collect::<Vec<_>>().join(",")
}

/// Host of each rank under `cfg` on `rig`, validated.
pub fn rank_hosts<R: Rig + ?Sized>(rig: &R, cfg: &JobConfig) -> Result<Vec<usize>> {
    rank_hosts_of(rig, cfg.ranks, cfg.hosts.as_deref())
}

/// Host of each of `ranks` ranks on `rig` (`hosts[r]`, or host r when `None`), validated.
pub fn rank_hosts_of<R: Rig + ?Sized>(rig: &R, ranks: usize, hosts: Option<&[usize]>) -> Result<Vec<usize>> {
    let n = rig.host_count();
    if ranks < 2 || ranks > n {
        return Err(Error::InvalidArgument { field: "ranks", reason: format!("{ranks} (need 2..={n} for this rig)") });
    }
    let hosts = hosts.map(<[usize]>::to_vec).unwrap_or_else(|| (0..ranks).collect());
    if hosts.len() != ranks {
        return Err(Error::InvalidArgument { field: "hosts", reason: format!("{} hosts for {ranks} ranks", hosts.len()) });
    }
    for (k, &h) in hosts.iter().enumerate() {
        if h >= n || hosts[..k].contains(&h) {
            return Err(Error::InvalidArgument { field: "hosts", reason: format!("{hosts:?}: each must be a distinct host below {n}") });
        }
    }
    Ok(hosts)
}

/// Starts one rank per host (rank r in the namespace of host r, or of `cfg.hosts[r]`).
pub fn spawn_job<R: Rig + ?Sized>(rig: &R, cfg: &JobConfig) -> Result<RunningJob> {
    let hosts = rank_hosts(rig, cfg)?;
    let bin = find_rank_binary(cfg.rank_bin.as_deref())?;
    let mut job = RunningJob::prepare(cfg.out_dir.as_deref(), "ringside-job", cfg.timeout)?;
    let out_dir = job.out_dir.clone();
    let peers = hosts.iter().map(|&h| rig.host_ipv4(h).map(|a| format!("{a}:{}", cfg.port))).collect::<Result<Vec<_>>>()?.join(",");
    job.record_straggler(rig, &hosts, cfg.straggler)?;
    for (r, &host) in hosts.iter().enumerate() {
        let ns = rig.host_netns(host)?;
        let out = out_dir.join(format!("rank-{r}.json"));
        let log = out_dir.join(format!("rank-{r}.log"));
        let _ = std::fs::remove_file(&out);
        let logf = std::fs::File::create(&log).map_err(|e| Error::file(&log, e))?;
        let logf2 = logf.try_clone().map_err(|e| Error::file(&log, e))?;
        let mut cmd = ns.command(&bin);
        cmd.arg("--rank").arg(r.to_string())
            .arg("--world").arg(cfg.ranks.to_string())
            .arg("--peers").arg(&peers)
            .arg("--size").arg(cfg.size.to_string())
            .arg("--steps").arg(cfg.steps.to_string())
            .arg("--compute-ms").arg(cfg.compute_ms.to_string());
        if let Some((sr, extra)) = cfg.straggler {
            if sr == r {
                cmd.arg("--straggler-extra-ms").arg(extra.to_string());
            }
        }
        if let Some(a) = &cfg.algorithm {
            cmd.arg("--algorithm").arg(a);
        }
        if let Some(c) = &cfg.compression {
            cmd.arg("--compression").arg(c);
        }
        if cfg.verify {
            cmd.arg("--verify");
        }
        if let Some(port) = cfg.managed {
            cmd.arg("--managed").arg(crate::managed::service_addr(host, port).to_string());
        }
        cmd.arg("--out").arg(&out).args(&cfg.extra_args);
        cmd.stdin(Stdio::null()).stdout(logf).stderr(logf2);
        let command = crate::cmd::describe(&cmd);
        tracing::info!(rank = r, netns = ns.name(), %command, "starting rank");
        // On error `job` is dropped here, killing the ranks already started.
        let child = cmd.spawn().map_err(|source| Error::Spawn { command, source })?;
        job.add_rank(r, Some(child), out, log);
    }
    Ok(job)
}

impl RunningJob {
    /// A job with no rank yet, its output directory created (`out_dir`, or a fresh one under the
    /// temp dir named `<prefix>-<pid>-<n>`). For the launchers of this crate: the emulated job,
    /// OpenMPI ([`crate::mpi`]) and PyTorch ([`crate::torch`]).
    pub(crate) fn prepare(out_dir: Option<&Path>, prefix: &str, timeout: Duration) -> Result<Self> {
        debug_assert!(JOB_DIR_PREFIXES.contains(&prefix), "{prefix} is not in JOB_DIR_PREFIXES (testbed clean would not find its leftovers)");
        let own_dir = out_dir.is_none();
        let out_dir = match out_dir {
            Some(d) => d.to_path_buf(),
            None => std::env::temp_dir().join(format!("{prefix}-{}-{}", std::process::id(), JOB_COUNTER.fetch_add(1, Ordering::Relaxed))),
        };
        std::fs::create_dir_all(&out_dir).map_err(|e| Error::file(&out_dir, e))?;
        // Absolute: ranks may run from another working directory (PyTorch's from this one).
        let out_dir = std::fs::canonicalize(&out_dir).map_err(|e| Error::file(&out_dir, e))?;
        Ok(RunningJob {
            ranks: Vec::new(),
            out_dir,
            started: Instant::now(),
            started_unix_ms: crate::fault::unix_ms(std::time::SystemTime::now()),
            timeout,
            straggler_fault: None,
            sweep: None,
            own_dir,
            keep_dir: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Records a compute straggler `(rank, extra_ms)` in the rig's fault log (kind `straggler`,
    /// on the rank's host), ended when the job ends. `hosts[r]` is rank r's host.
    pub(crate) fn record_straggler<R: Rig + ?Sized>(&mut self, rig: &R, hosts: &[usize], straggler: Option<(usize, u64)>) -> Result<()> {
        let Some((r, extra_ms)) = straggler else { return Ok(()) };
        let Some(&host) = hosts.get(r) else {
            return Err(Error::InvalidArgument { field: "straggler", reason: format!("rank {r} does not exist in a job of {}", hosts.len()) });
        };
        let log = rig.fault_log_handle();
        let ns = rig.host_netns(host)?.name().to_string();
        let id = fault::record_fault(&log, Some(host), &ns, FaultKind::Straggler { rank: r, extra_ms });
        self.straggler_fault = Some((log, id));
        Ok(())
    }

    /// Adds rank `rank`, whose JSON result will be `out` and whose output goes to `log`. `child`
    /// is the rank's own process, or `None` when another process writes its result (mpirun
    /// launches every MPI rank: it is rank 0's `child`, and the job waits for it).
    /// On drop, also kill every process in `namespaces` whose command name (`/proc/PID/comm`, at
    /// most 15 bytes) starts with one of `comms`.
    pub(crate) fn sweep_on_drop(&mut self, namespaces: Vec<String>, comms: &[&str]) {
        self.sweep = Some((namespaces, comms.iter().map(|c| c.to_string()).collect()));
    }

    pub(crate) fn add_rank(&mut self, rank: usize, child: Option<Child>, out: PathBuf, log: PathBuf) {
        self.ranks.push(RankProcess { rank, child, out, log, status: None });
    }
}

/// Distribution summary in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Dist {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Dist {
    pub fn of(values: &[f64]) -> Dist {
        if values.is_empty() {
            return Dist::default();
        }
        let mut v = values.to_vec();
        ringside_stats::sort(&mut v);
        let pct = |q: f64| ringside_stats::quantile_sorted(&v, q).unwrap_or(f64::NAN);
        Dist { count: v.len(), mean: v.iter().sum::<f64>() / v.len() as f64, p50: pct(0.5), p99: pct(0.99), max: v[v.len() - 1] }
    }
}

/// One rank's result.
#[derive(Debug, Clone, Serialize)]
pub struct RankSummary {
    pub rank: usize,
    pub exit: String,
    pub out: PathBuf,
    pub log: PathBuf,
    pub step_ms: Dist,
    pub comm_ms: Dist,
    /// Sum of per-step `bytes_sent`, when the rank reports it.
    pub bytes_sent: Option<u64>,
    /// Whether every step reported `"verified": true` (`None` when no step says either way).
    pub verified: Option<bool>,
    /// The rank's top-level `error`, if it reported one.
    pub error: Option<String>,
}

/// What the job did.
#[derive(Debug, Clone, Serialize)]
pub struct JobReport {
    pub ranks: Vec<RankSummary>,
    /// Over all ranks and steps.
    pub step_ms: Dist,
    pub comm_ms: Dist,
    pub wall_ms: f64,
    pub started_unix_ms: u64,
    pub out_dir: PathBuf,
}

/// Pulls per-step (step_ms, comm_ms) out of a rank's JSON (see the module docs for the shapes).
pub fn step_times(v: &serde_json::Value) -> (Vec<f64>, Vec<f64>) {
    const STEP_KEYS: [&str; 5] = ["step_ms", "total_ms", "duration_ms", "wall_ms", "time_ms"];
    const COMM_KEYS: [&str; 4] = ["comm_ms", "communication_ms", "collective_ms", "allreduce_ms"];
    let first = |o: &serde_json::Value, keys: &[&str]| keys.iter().find_map(|k| o.get(*k).and_then(|x| x.as_f64()));
    let (mut step, mut comm) = (Vec::new(), Vec::new());
    if let Some(steps) = v.get("steps").and_then(|s| s.as_array()) {
        for s in steps {
            if let Some(x) = first(s, &STEP_KEYS) {
                step.push(x);
            }
            if let Some(x) = first(s, &COMM_KEYS) {
                comm.push(x);
            }
        }
    }
    let arr = |keys: &[&str]| -> Vec<f64> {
        keys.iter()
            .find_map(|k| v.get(*k).and_then(|x| x.as_array()))
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default()
    };
    if step.is_empty() {
        step = arr(&STEP_KEYS);
    }
    if comm.is_empty() {
        comm = arr(&COMM_KEYS);
    }
    (step, comm)
}

impl RunningJob {
    pub fn out_dir(&self) -> &Path {
        &self.out_dir
    }

    /// Keeps the output directory when the job is dropped (an error about to name a log in it).
    pub fn keep_output_dir(&self) {
        self.keep_dir.store(true, Ordering::Relaxed);
    }

    /// Process ids of the ranks (index = rank).
    pub fn pids(&self) -> Vec<Option<u32>> {
        self.ranks.iter().map(|r| r.child.as_ref().map(|c| c.id())).collect()
    }

    /// Waits (bounded by the job's timeout and `stop`) for every rank to exit, then reads their
    /// JSON. A rank that fails or the timeout kills the whole job.
    pub fn wait(mut self, stop: Option<&std::sync::atomic::AtomicBool>) -> Result<JobReport> {
        // The report, or the error naming a rank's log, points into the directory.
        self.keep_output_dir();
        let deadline = self.started + self.timeout;
        let poll = Duration::from_millis(50);
        for _ in 0..(self.timeout.as_millis() / poll.as_millis() + 2) {
            let mut running = 0;
            for r in &mut self.ranks {
                if r.status.is_some() {
                    continue;
                }
                let Some(c) = r.child.as_mut() else { continue };
                match c.try_wait() {
                    Ok(Some(st)) => {
                        r.status = Some(st);
                        if !st.success() {
                            let detail = format!("exited with {st}: {}", log_tail(&r.log));
                            return Err(Error::RankFailed { rank: r.rank, detail, log: r.log.clone() });
                        }
                    }
                    Ok(None) => running += 1,
                    Err(e) => return Err(Error::RankFailed { rank: r.rank, detail: e.to_string(), log: r.log.clone() }),
                }
            }
            if running == 0 {
                break;
            }
            if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                return Err(Error::Timeout { what: "job".into(), waited: self.started.elapsed(), detail: "interrupted".into() });
            }
            if Instant::now() >= deadline {
                let left: Vec<usize> = self.ranks.iter().filter(|r| r.status.is_none()).map(|r| r.rank).collect();
                return Err(Error::Timeout { what: "job to finish".into(), waited: self.timeout, detail: format!("ranks {left:?} still running (logs in {})", self.out_dir.display()) });
            }
            std::thread::sleep(poll);
        }
        let wall_ms = self.started.elapsed().as_secs_f64() * 1e3;
        self.end_straggler();
        let mut ranks = Vec::new();
        let (mut all_step, mut all_comm) = (Vec::new(), Vec::new());
        for r in &self.ranks {
            let text = std::fs::read_to_string(&r.out).map_err(|e| Error::RankFailed {
                rank: r.rank,
                detail: format!("no result file {}: {e}", r.out.display()),
                log: r.log.clone(),
            })?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::RankFailed {
                rank: r.rank,
                detail: format!("{} is not JSON: {e}", r.out.display()),
                log: r.log.clone(),
            })?;
            let (step, comm) = step_times(&v);
            all_step.extend_from_slice(&step);
            all_comm.extend_from_slice(&comm);
            ranks.push(RankSummary {
                rank: r.rank,
                exit: r.status.map(|s| s.to_string()).unwrap_or_default(),
                out: r.out.clone(),
                log: r.log.clone(),
                step_ms: Dist::of(&step),
                comm_ms: Dist::of(&comm),
                bytes_sent: sum_steps_u64(&v, "bytes_sent"),
                verified: all_steps_bool(&v, "verified"),
                error: v.get("error").filter(|e| !e.is_null()).map(|e| e.as_str().map(str::to_string).unwrap_or_else(|| e.to_string())),
            });
        }
        Ok(JobReport {
            ranks,
            step_ms: Dist::of(&all_step),
            comm_ms: Dist::of(&all_comm),
            wall_ms,
            started_unix_ms: self.started_unix_ms,
            out_dir: self.out_dir.clone(),
        })
    }
}

fn sum_steps_u64(v: &serde_json::Value, key: &str) -> Option<u64> {
    let steps = v.get("steps")?.as_array()?;
    let vals: Vec<u64> = steps.iter().filter_map(|s| s.get(key)?.as_u64()).collect();
    (!vals.is_empty()).then(|| vals.iter().sum())
}

fn all_steps_bool(v: &serde_json::Value, key: &str) -> Option<bool> {
    let steps = v.get("steps")?.as_array()?;
    let vals: Vec<bool> = steps.iter().filter_map(|s| s.get(key)?.as_bool()).collect();
    (!vals.is_empty()).then(|| vals.iter().all(|&b| b))
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

impl RunningJob {
    fn end_straggler(&mut self) {
        if let Some((log, id)) = self.straggler_fault.take() {
            fault::end_fault(&log, id);
        }
    }
}

impl Drop for RunningJob {
    fn drop(&mut self) {
        self.end_straggler();
        for r in &mut self.ranks {
            if let Some(mut c) = r.child.take() {
                if r.status.is_none() && matches!(c.try_wait(), Ok(None)) {
                    let _ = c.kill();
                }
                let _ = c.wait();
            }
        }
        if let Some((namespaces, comms)) = self.sweep.take() {
            for ns in namespaces {
                for pid in crate::netns::pids_in(&ns) {
                    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                    if comms.iter().any(|c| comm.trim_end().starts_with(c.as_str())) {
                        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                    }
                }
            }
        }
        if self.own_dir && !self.keep_dir.load(Ordering::Relaxed) && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.out_dir);
        }
    }
}

/// Builds nothing: runs `cfg` on an existing rig and waits for it.
pub fn run_job<R: Rig + ?Sized>(rig: &R, cfg: &JobConfig, stop: Option<&std::sync::atomic::AtomicBool>) -> Result<JobReport> {
    spawn_job(rig, cfg)?.wait(stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dist() {
        let d = Dist::of(&(1..=100).map(f64::from).collect::<Vec<_>>());
        // Quantiles interpolate between the closest ranks (ringside-stats): p50 of 1..=100 is 50.5,
        // p99 is 99 + 0.01.
        assert_eq!((d.count, d.mean, d.p50, d.max), (100, 50.5, 50.5, 100.0));
        assert!((d.p99 - 99.01).abs() < 1e-9, "p99 {}", d.p99);
        assert_eq!(Dist::of(&[]), Dist::default());
    }

    #[test]
    fn stale_job_dirs_are_those_of_processes_that_are_gone() {
        let tmp = std::env::temp_dir().join(format!("ringside-stale-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        // Above any pid_max (at most 2^22): never a live process.
        let gone = i32::MAX - 1;
        let me = std::process::id();
        for name in [
            format!("ringside-job-{gone}-0"),
            format!("ringside-torch-{gone}-12"),
            format!("ringside-job-{me}-0"),
            format!("ringside-mpi-{gone}-x"),
            format!("ringside-other-{gone}-0"),
            format!("ringside-job-{gone}"),
        ] {
            std::fs::create_dir_all(tmp.join(name)).unwrap();
        }
        std::fs::write(tmp.join(format!("ringside-mpi-{gone}-3")), b"a file, not a directory").unwrap();
        let found: Vec<String> = stale_job_dirs(&tmp).iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(found, vec![format!("ringside-job-{gone}-0"), format!("ringside-torch-{gone}-12")]);
    }

    #[test]
    fn step_times_shapes() {
        let a = serde_json::json!({"steps": [{"step": 0, "step_ms": 10.0, "comm_ms": 4.0}, {"total_ms": 12, "communication_ms": 5}]});
        assert_eq!(step_times(&a), (vec![10.0, 12.0], vec![4.0, 5.0]));
        let c = serde_json::json!({"steps": [{"bytes_sent": 3, "verified": true}, {"bytes_sent": 4, "verified": false}]});
        assert_eq!((sum_steps_u64(&c, "bytes_sent"), all_steps_bool(&c, "verified")), (Some(7), Some(false)));
        let b = serde_json::json!({"step_ms": [1, 2, 3], "comm_ms": [0.5]});
        assert_eq!(step_times(&b), (vec![1.0, 2.0, 3.0], vec![0.5]));
    }
}
