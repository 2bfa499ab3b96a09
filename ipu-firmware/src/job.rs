//! The emulated training job: each step is a compute phase (sleep or busy loop for `compute_ms`, plus
//! optional jitter and straggler delay) followed by an allreduce of a gradient buffer. This is what
//! the `ringside-rank` binary runs, one process per rank; [`run_job_in_process`] runs the same thing
//! with ranks as threads over loopback.
//!
//! Invariants:
//! - Inputs are deterministic ([`rank_input`]): small integers, so the exact sum is representable in
//!   f32 and (for worlds up to 32) in bf16, which makes `verify` exact for lossless plans.
//! - Every step's record carries the plan that step actually ran with (rank 0's announcement) and,
//!   on rank 0 following ringside's hints, the version of the hint that plan came from.
//! - A failed step ends the job: the report keeps the steps done so far plus the error.
//! - With a [`TcpRtoFloor`] ([`run_rank_on`]), every TCP connection of the rank's mesh takes the
//!   transport advice of ringside's hints (see [`crate::rto`]); the report lists each time the
//!   floor changed ([`JobReport::record_rto_floor`]), by wall-clock time, which places it among
//!   the steps' `end_unix_ms`.

use crate::codec::{Bf16, CodecKind};
use crate::engine::{Communicator, CommunicatorConfig};
use crate::error::{CollectiveError, Result};
use crate::managed::ManagedClient;
use crate::mesh::{MeshOptions, MeshTransport, TransportKind};
use crate::plan::{AppliedHint, Dtype, Plan, PlanSource};
use crate::rto::{AppliedRtoFloor, TcpRtoFloor};
use crate::transport::{TcpOptions, TcpTransport, Transport};
use rand::{Rng, SeedableRng};
use serde::{Serialize, Serializer};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the compute phase spends its time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeMode {
    Sleep,
    Busy,
}

/// One rank's job description (the `ringside-rank` flags).
#[derive(Clone, Debug, Serialize)]
pub struct JobConfig {
    pub rank: usize,
    pub world: usize,
    pub peers: Vec<SocketAddr>,
    /// Gradient buffer size in bytes of `dtype`.
    pub size_bytes: usize,
    pub dtype: Dtype,
    pub steps: u64,
    pub compute_ms: f64,
    pub compute_jitter_ms: f64,
    pub straggler_extra_ms: f64,
    pub compute_mode: ComputeMode,
    /// Plan in force from step 0.
    pub plan: Plan,
    /// Connections per peer pair built at setup (plans may use up to this many).
    pub max_channels: u8,
    pub timeout_ms: u64,
    pub verify: bool,
    /// Before every step's allreduce, an untimed [`Communicator::barrier`], as MPI benchmarks put
    /// `MPI_Barrier` before each timed call: the step's `comm_ms` then starts when every rank has
    /// arrived and leaves out the wait for a rank whose compute phase ended later (`bench
    /// collectives` sets it so that ringside and OpenMPI are timed the same way). Engine mode only:
    /// a managed job with it fails at its first step.
    pub barrier: bool,
    /// Appends each step's record to this file as one JSON line when the step ends (the report
    /// comes only at the end): a harness can follow a job that runs until it is killed.
    pub progress: Option<std::path::PathBuf>,
}

impl JobConfig {
    pub fn elems(&self) -> usize {
        self.size_bytes / self.dtype.size()
    }
}

/// Rank r's input element i at step s: an integer in [-8, 8].
pub fn rank_input(rank: usize, step: u64, i: usize) -> f32 {
    let v = (i as u64).wrapping_mul(7).wrapping_add(rank as u64 * 13).wrapping_add(step.wrapping_mul(5)) % 17;
    v as f32 - 8.0
}

/// Fills `out[i] = f(rank_input(rank, step, i))`. The inputs repeat with period 17 in `i` (as long as
/// the index arithmetic does not wrap), so this copies one period instead of taking a u64 modulo per
/// element: the fill of a 16 MiB buffer went from ~10 ms to a memcpy, which matters when 4 ranks
/// share 2 cores and one rank's fill delays the others' allreduce.
pub fn fill_rank_input<T: Copy>(rank: usize, step: u64, out: &mut [T], f: impl Fn(f32) -> T) {
    let c = (rank as u64 * 13).wrapping_add(step.wrapping_mul(5));
    let periodic = (out.len() as u64).checked_mul(7).and_then(|x| x.checked_add(c)).is_some();
    if !periodic || out.len() < 17 {
        out.iter_mut().enumerate().for_each(|(i, x)| *x = f(rank_input(rank, step, i)));
        return;
    }
    let period: Vec<T> = (0..17).map(|i| f(rank_input(rank, step, i))).collect();
    for ch in out.chunks_mut(17) {
        ch.copy_from_slice(&period[..ch.len()]);
    }
}

/// The exact allreduce result for element i at step s.
pub fn expected_sum(world: usize, step: u64, i: usize) -> f32 {
    (0..world).map(|r| rank_input(r, step, i)).sum()
}

/// Largest |error| `verify` accepts for a plan: 0 for lossless wires; otherwise the per-hop codec
/// bound at the largest possible partial sum (8·world), times 2·world hops, doubled under error
/// feedback (the residual carried in from the previous step).
pub fn verify_tolerance(wire: CodecKind, error_feedback: bool, world: usize) -> f32 {
    let a = 8.0 * world as f32;
    let per_hop = match wire {
        CodecKind::None => 0.0,
        CodecKind::TopK { ratio } if ratio >= 1.0 => 0.0,
        CodecKind::Fp16 => a * 2f32.powi(-11),
        CodecKind::Bf16 => a * 2f32.powi(-8),
        CodecKind::Int8 => a / 254.0,
        CodecKind::TopK { .. } => a,
    };
    per_hop * 2.0 * world as f32 * if error_feedback { 2.0 } else { 1.0 }
}

/// One step of the job.
#[derive(Clone, Debug, Serialize)]
pub struct StepRecord {
    pub step: u64,
    pub compute_ms: f64,
    /// The allreduce's time (after the barrier with [`JobConfig::barrier`]).
    pub comm_ms: f64,
    /// Compute, barrier and allreduce.
    pub step_ms: f64,
    /// Wall-clock end of the step (Unix ms), to place steps on a harness's fault timeline.
    pub end_unix_ms: u64,
    pub plan: Plan,
    pub bytes_sent: u64,
    /// `None` unless `verify` is on.
    pub verified: Option<bool>,
    /// Rank 0 following hints: the version of the hint whose plan this step ran with (absent for
    /// the initial plan and when not following; see [`JobReport::record_hints`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint_version: Option<u64>,
    /// Managed mode, rank 0: the rank whose IPU agent's hint won the plan vote for this step's
    /// plan (see [`crate::managed`]); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint_rank: Option<usize>,
    /// Managed mode: the time this rank's IPU service spent inside the engine on the step's
    /// collective, ms ([`crate::managed::ManagedReport::service_ms`]); the rest of `comm_ms` is the
    /// host link both ways. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_ms: Option<f64>,
}

/// Mean and percentiles (nearest rank) of a series, in ms.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Distribution {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

impl Distribution {
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        // The project's one quantile definition (ringside-stats: linear interpolation, type 7).
        let v = ringside_stats::sorted_finite(values);
        let pct = |q: f64| ringside_stats::quantile_sorted(&v, q).unwrap_or(0.0);
        Self { mean: values.iter().sum::<f64>() / values.len() as f64, p50: pct(0.50), p99: pct(0.99) }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct JobSummary {
    pub steps_completed: usize,
    pub step_ms: Distribution,
    pub comm_ms: Distribution,
    pub compute_ms: Distribution,
    pub bytes_sent_total: u64,
    /// `None` unless `verify` is on; else whether every completed step verified.
    pub all_verified: Option<bool>,
}

fn error_as_string<S: Serializer>(e: &Option<CollectiveError>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match e {
        Some(e) => s.serialize_some(&e.to_string()),
        None => s.serialize_none(),
    }
}

/// What `ringside-rank` writes to `--out`.
#[derive(Clone, Debug, Serialize)]
pub struct JobReport {
    pub config: JobConfig,
    pub steps: Vec<StepRecord>,
    pub summary: JobSummary,
    #[serde(serialize_with = "error_as_string")]
    pub error: Option<CollectiveError>,
    /// Rank 0 following hints: every hint handed to the plan schedule (absent otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<AppliedHint>,
    /// The transport the mesh actually ran on (`tcp` or `rdma`; `--transport auto` resolves to
    /// one of them). Absent for runs on a transport handed in by the caller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<TransportKind>,
    /// Following hints: each change of this rank's TCP retransmission floor (transport advice)
    /// and what the kernel took (absent when the advice never changed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tcp_rto_floor: Vec<AppliedRtoFloor>,
}

impl JobReport {
    /// Fills each step's `hint_version` (the hint whose plan that step ran with: the newest
    /// applied hint whose plan, `step_from` included, equals the step's) and the report's `hints`.
    /// Steps that ran the initial plan, or a hint the schedule rejected, keep `None`.
    pub fn record_hints(&mut self, applied: &[AppliedHint]) {
        for s in &mut self.steps {
            s.hint_version = applied.iter().rev().find(|h| h.plan == s.plan).map(|h| h.version);
        }
        self.hints = applied.to_vec();
    }

    /// Fills the report's `tcp_rto_floor` (from [`TcpRtoFloor::applied`]).
    pub fn record_rto_floor(&mut self, applied: &[AppliedRtoFloor]) {
        self.tcp_rto_floor = applied.to_vec();
    }
}


fn compute_phase(mode: ComputeMode, until: Instant) {
    match mode {
        ComputeMode::Sleep => {
            let now = Instant::now();
            if until > now {
                std::thread::sleep(until - now);
            }
        }
        ComputeMode::Busy => {
            let mut x = 1u64;
            while Instant::now() < until {
                for _ in 0..1000 {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            }
        }
    }
}

enum Gradients {
    F32(Vec<f32>),
    Bf16(Vec<Bf16>),
}

/// What one step's allreduce reports back to the step loop.
struct StepComm {
    /// When the barrier before the allreduce returned ([`JobConfig::barrier`]): the step's
    /// communication time starts there.
    synced_at: Option<Instant>,
    plan: Plan,
    bytes_sent: u64,
    hint_version: Option<u64>,
    hint_rank: Option<usize>,
    service_ms: Option<f64>,
}

/// Runs the job on an established transport. Returns the report even when a step fails (with
/// `error` set).
pub fn run_job<T: Transport>(cfg: &JobConfig, transport: T, plan_source: Option<Box<dyn PlanSource>>) -> Result<JobReport> {
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let mut comm = Communicator::new(transport, CommunicatorConfig { initial_plan: cfg.plan, timeout })?;
    if let Some(src) = plan_source {
        comm.set_plan_source(src);
    }
    let report = run_steps(cfg, |step, grads| {
        comm.begin_step(step);
        let synced_at = if cfg.barrier {
            comm.barrier()?;
            Some(Instant::now())
        } else {
            None
        };
        let rep = match grads {
            Gradients::F32(g) => comm.allreduce_f32(g)?,
            Gradients::Bf16(g) => comm.allreduce_bf16(g)?,
        };
        Ok(StepComm { synced_at, plan: rep.plan, bytes_sent: rep.bytes_sent, hint_version: None, hint_rank: None, service_ms: None })
    });
    if report.error.is_none() {
        comm.close();
    } else {
        comm.abort();
    }
    Ok(report)
}

/// Runs the job in managed mode: the same compute phase and report, but each step's buffer goes
/// to this host's IPU service (`ringside-ipu`) over the host link, which runs the allreduce with
/// the other ranks' services and applies ringside's plans itself. The rank follows no hints:
/// each step's record carries the plan (and hint version) the service reports.
pub fn run_job_managed(cfg: &JobConfig, client: &mut ManagedClient) -> JobReport {
    run_steps(cfg, |step, grads| {
        if cfg.barrier {
            let reason = "a managed job has no barrier (the IPU services run the collective)".to_string();
            return Err(CollectiveError::InvalidArgument { name: "barrier", reason });
        }
        let rep = match grads {
            Gradients::F32(g) => client.allreduce_f32(step, g)?,
            Gradients::Bf16(g) => client.allreduce_bf16(step, g)?,
        };
        Ok(StepComm {
            synced_at: None,
            plan: rep.plan,
            bytes_sent: rep.bytes_sent,
            hint_version: rep.hint_version,
            hint_rank: rep.hint_rank,
            service_ms: Some(rep.service_ms),
        })
    })
}

/// The step loop shared by both modes: compute, `allreduce`, verify, record.
fn run_steps(cfg: &JobConfig, mut allreduce: impl FnMut(u64, &mut Gradients) -> Result<StepComm>) -> JobReport {
    let n = cfg.elems();
    let mut grads = match cfg.dtype {
        Dtype::F32 => Gradients::F32(vec![0.0; n]),
        Dtype::Bf16 => Gradients::Bf16(vec![Bf16::default(); n]),
    };
    let mut steps = Vec::with_capacity(cfg.steps as usize);
    let mut error = None;
    let mut progress = cfg.progress.as_ref().and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| tracing::warn!(path = %path.display(), error = %e, "cannot open the progress file; steps are not recorded there"))
            .ok()
    });
    for step in 0..cfg.steps {
        let t0 = Instant::now();
        let mut rng = rand::rngs::StdRng::seed_from_u64((cfg.rank as u64) << 32 ^ step);
        let jitter = if cfg.compute_jitter_ms > 0.0 { rng.gen_range(0.0..=cfg.compute_jitter_ms) } else { 0.0 };
        let compute = Duration::from_secs_f64((cfg.compute_ms + jitter + cfg.straggler_extra_ms).max(0.0) / 1e3);
        // "Backward pass": produce this step's gradients, then spend the rest of the compute budget.
        match &mut grads {
            Gradients::F32(g) => fill_rank_input(cfg.rank, step, g, |x| x),
            Gradients::Bf16(g) => fill_rank_input(cfg.rank, step, g, Bf16::from_f32),
        }
        compute_phase(cfg.compute_mode, t0 + compute);
        let t1 = Instant::now();
        let res = allreduce(step, &mut grads);
        let t2 = Instant::now();
        let rep = match res {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(rank = cfg.rank, step, error = %e, "allreduce failed");
                error = Some(e);
                break;
            }
        };
        let verified = cfg.verify.then(|| {
            let wire = match (rep.plan.compression.codec, cfg.dtype) {
                (CodecKind::None, Dtype::Bf16) => CodecKind::Bf16,
                (k, _) => k,
            };
            let tol = verify_tolerance(wire, rep.plan.compression.error_feedback, cfg.world);
            let ok = |i: usize, got: f32| (got - expected_sum(cfg.world, step, i)).abs() <= tol;
            match &grads {
                Gradients::F32(g) => g.iter().enumerate().all(|(i, &x)| ok(i, x)),
                Gradients::Bf16(g) => g.iter().enumerate().all(|(i, x)| ok(i, x.to_f32())),
            }
        });
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        steps.push(StepRecord {
            step,
            compute_ms: ms(t1 - t0),
            comm_ms: ms(t2 - rep.synced_at.unwrap_or(t1)),
            step_ms: ms(t2 - t0),
            end_unix_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            plan: rep.plan,
            bytes_sent: rep.bytes_sent,
            verified,
            hint_version: rep.hint_version,
            hint_rank: rep.hint_rank,
            service_ms: rep.service_ms,
        });
        if let (Some(f), Some(record)) = (progress.as_mut(), steps.last()) {
            use std::io::Write as _;
            let line = serde_json::to_string(record).map(|l| l + "\n");
            if let Err(e) = line.map_err(std::io::Error::from).and_then(|l| f.write_all(l.as_bytes())) {
                tracing::warn!(error = %e, "writing the progress file failed; steps are no longer recorded there");
                progress = None;
            }
        }
    }
    let col = |f: fn(&StepRecord) -> f64| steps.iter().map(f).collect::<Vec<_>>();
    let summary = JobSummary {
        steps_completed: steps.len(),
        step_ms: Distribution::of(&col(|s| s.step_ms)),
        comm_ms: Distribution::of(&col(|s| s.comm_ms)),
        compute_ms: Distribution::of(&col(|s| s.compute_ms)),
        bytes_sent_total: steps.iter().map(|s| s.bytes_sent).sum(),
        all_verified: cfg.verify.then(|| steps.iter().all(|s| s.verified == Some(true))),
    };
    JobReport { config: cfg.clone(), steps, summary, error, hints: Vec::new(), transport: None, tcp_rto_floor: Vec::new() }
}

/// Runs one rank as its own process would: binds its `peers` entry's port on all addresses, builds
/// the mesh (retrying until the timeout while peers start), then runs the job.
pub fn run_rank(cfg: &JobConfig, plan_source: Option<Box<dyn PlanSource>>) -> Result<JobReport> {
    let options = TcpOptions { channels: cfg.max_channels, timeout: Duration::from_millis(cfg.timeout_ms) };
    let t = TcpTransport::bind_and_connect(cfg.rank, &cfg.peers, options)?;
    run_job(cfg, t, plan_source)
}

/// [`run_rank`] on the transport `--transport` asks for (see [`crate::mesh`] for the fallback
/// rule); the report names the transport actually used. With `rto_floor`, the mesh's TCP
/// connections take its transport advice from the moment the mesh is up (the floor in force
/// then, every change after), and the report lists its changes.
pub fn run_rank_on(
    cfg: &JobConfig,
    transport: TransportKind,
    rdma_device: Option<String>,
    plan_source: Option<Box<dyn PlanSource>>,
    rto_floor: Option<&TcpRtoFloor>,
) -> Result<JobReport> {
    let options = MeshOptions {
        transport,
        tcp: TcpOptions { channels: cfg.max_channels, timeout: Duration::from_millis(cfg.timeout_ms) },
        rdma_device,
    };
    let mut t = MeshTransport::bind_and_connect(cfg.rank, &cfg.peers, &options)?;
    let used = t.kind();
    tracing::info!(transport = %used, requested = %transport, "collective mesh up");
    if let Some(floor) = rto_floor {
        t.set_rto_floor(floor);
    }
    let mut report = run_job(cfg, t, plan_source)?;
    report.transport = Some(used);
    if let Some(floor) = rto_floor {
        report.record_rto_floor(&floor.applied());
    }
    Ok(report)
}

/// Binds `world` loopback listeners on ephemeral ports.
pub fn loopback_listeners(world: usize) -> std::io::Result<(Vec<TcpListener>, Vec<SocketAddr>)> {
    let ls: Vec<TcpListener> = (0..world).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    let addrs = ls.iter().map(TcpListener::local_addr).collect::<std::io::Result<_>>()?;
    Ok((ls, addrs))
}

/// Runs `body(rank, transport)` on `world` threads connected by a loopback TCP mesh; results in rank
/// order. Every thread is joined before returning.
pub fn run_ranks_in_process<R, F>(world: usize, options: TcpOptions, body: F) -> Vec<Result<R>>
where
    R: Send + 'static,
    F: Fn(usize, TcpTransport) -> Result<R> + Send + Sync + 'static,
{
    run_ranks_in_process_with(world, move |l, rank, addrs| TcpTransport::connect(l, rank, addrs, options), body)
}

/// [`run_ranks_in_process`] on the transport `options.transport` resolves to (every rank thread
/// resolves it; the fallback warning is logged once per process).
pub fn run_mesh_ranks_in_process<R, F>(world: usize, options: MeshOptions, body: F) -> Vec<Result<R>>
where
    R: Send + 'static,
    F: Fn(usize, MeshTransport) -> Result<R> + Send + Sync + 'static,
{
    run_ranks_in_process_with(world, move |l, rank, addrs| MeshTransport::connect(l, rank, addrs, &options), body)
}

/// Runs `body(rank, connect(listener, rank, addrs))` on `world` threads over loopback listeners.
fn run_ranks_in_process_with<T, R, C, F>(world: usize, connect: C, body: F) -> Vec<Result<R>>
where
    T: Transport,
    R: Send + 'static,
    C: Fn(TcpListener, usize, &[SocketAddr]) -> Result<T> + Send + Sync + 'static,
    F: Fn(usize, T) -> Result<R> + Send + Sync + 'static,
{
    let (listeners, addrs) = match loopback_listeners(world) {
        Ok(x) => x,
        Err(e) => {
            let addr: SocketAddr = ([127, 0, 0, 1], 0).into();
            return (0..world).map(|_| Err(CollectiveError::Listen { addr, source: Arc::new(std::io::Error::new(e.kind(), e.to_string())) })).collect();
        }
    };
    let body = Arc::new(body);
    let connect = Arc::new(connect);
    let handles: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(rank, l)| {
            let (addrs, body, connect) = (addrs.clone(), body.clone(), connect.clone());
            std::thread::Builder::new()
                .name(format!("rank{rank}"))
                .spawn(move || body(rank, connect(l, rank, &addrs)?))
                .expect("spawn rank thread")
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        .collect()
}

/// Runs the emulated job with `template.world` ranks as threads over loopback. `template.rank` and
/// `template.peers` are ignored; `plan_source` (if any) is installed on rank 0.
pub fn run_job_in_process(template: &JobConfig, plan_source: Option<Box<dyn PlanSource>>) -> Vec<Result<JobReport>> {
    let template = template.clone();
    let options = TcpOptions { channels: template.max_channels, timeout: Duration::from_millis(template.timeout_ms) };
    let source = std::sync::Mutex::new(plan_source);
    run_ranks_in_process(template.world, options, move |rank, t| {
        let cfg = JobConfig { rank, peers: Vec::new(), ..template.clone() };
        let src = if rank == 0 { source.lock().unwrap_or_else(|p| p.into_inner()).take() } else { None };
        run_job(&cfg, t, src)
    })
}

/// Parses sizes like `16MiB`, `64KiB`, `1GiB`, `4MB`, `1000`, `1k`.
pub fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: usize = num.parse().map_err(|_| format!("invalid size {s:?}: expected e.g. 16MiB"))?;
    let mult: usize = match unit.trim() {
        "" | "B" => 1,
        "k" | "K" | "KB" | "kB" => 1_000,
        "KiB" | "Ki" => 1 << 10,
        "M" | "MB" => 1_000_000,
        "MiB" | "Mi" => 1 << 20,
        "G" | "GB" => 1_000_000_000,
        "GiB" | "Gi" => 1 << 30,
        u => return Err(format!("invalid size unit {u:?} in {s:?}: use B, KiB, MiB, GiB, KB, MB or GB")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("4MB"), Ok(4_000_000));
        assert_eq!(parse_size("123"), Ok(123));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("3 parsecs").is_err());
    }

    #[test]
    fn distribution_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let d = Distribution::of(&v);
        // Type 7: p50 halfway between 50 and 51, p99 at 99 + 0.01.
        assert_eq!(d.p50, 50.5);
        assert!((d.p99 - 99.01).abs() < 1e-9, "{}", d.p99);
        assert!((d.mean - 50.5).abs() < 1e-9);
    }

    #[test]
    fn fill_matches_rank_input() {
        for (rank, step) in [(0usize, 0u64), (3, 7), (5, 1 << 40), (1, u64::MAX - 3)] {
            for n in [0usize, 1, 16, 17, 18, 100, 1001] {
                let mut v = vec![0f32; n];
                fill_rank_input(rank, step, &mut v, |x| x);
                assert!(v.iter().enumerate().all(|(i, &x)| x == rank_input(rank, step, i)), "rank {rank} step {step} n {n}");
            }
        }
    }

    #[test]
    fn inputs_are_small_integers() {
        for r in 0..8 {
            for i in 0..50 {
                let x = rank_input(r, 3, i);
                assert!(x.fract() == 0.0 && x.abs() <= 8.0);
            }
        }
    }
}
