//! `ringside-rank`: one rank of the emulated training job (compute phase + allreduce per step).
//! Spawned once per network namespace by the testbed; writes a JSON report to `--out`. With
//! `--follow-hints`, rank 0 applies ringside's hints for the job (see docs/tenant-guide.md) and
//! every rank applies their transport advice to its own connections; with
//! `--managed`, the host's IPU service (`ringside-ipu`) runs each step's allreduce and applies them.

use anyhow::{bail, Context};
use clap::Parser;
use ipu_firmware::job::{parse_size, run_job_managed, run_rank_on, ComputeMode, JobConfig};
use ipu_firmware::managed::ManagedClient;
use ipu_firmware::plan::{Dtype, Plan, PlanArgs, ScriptedPlans};
use ipu_firmware::hints::AppliedHints;
use ipu_firmware::{HintFollower, PlanSource, TcpRtoFloor, TransportKind};
use ringside_client::{ClientConfig, JobClient};
use std::time::Duration;
use std::net::SocketAddr;
use std::path::PathBuf;

/// One rank of ringside's emulated training job.
#[derive(Parser, Debug)]
#[command(name = "ringside-rank", version)]
struct Args {
    /// This process's rank, 0-based.
    #[arg(long)]
    rank: usize,
    /// Number of ranks.
    #[arg(long)]
    world: usize,
    /// IP:PORT of every rank, comma separated, index = rank. This rank listens on 0.0.0.0 at its own
    /// entry's port.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<SocketAddr>,
    /// Gradient buffer size, e.g. 16MiB.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    size: usize,
    /// Element type of the gradient buffer: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: Dtype,
    /// Training steps to run.
    #[arg(long)]
    steps: u64,
    /// Compute phase per step, in ms.
    #[arg(long)]
    compute_ms: f64,
    /// Uniform random extra compute per step, 0..=J ms.
    #[arg(long, default_value_t = 0.0)]
    compute_jitter_ms: f64,
    /// Extra compute on this rank every step (makes it a straggler), in ms.
    #[arg(long, default_value_t = 0.0)]
    straggler_extra_ms: f64,
    /// Spin the CPU during the compute phase instead of sleeping.
    #[arg(long)]
    busy_compute: bool,
    /// The initial plan (rank 0's; hints or --plan-schedule may change it).
    #[command(flatten)]
    plan: PlanArgs,
    /// Bound on connection setup and on every wait for a peer, in ms. Must exceed the slowest rank's
    /// compute phase.
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    /// Check every step's allreduce result against the expected sum of the deterministic inputs.
    #[arg(long)]
    verify: bool,
    /// Before every step's allreduce, an untimed barrier (an allreduce of one float per rank), as
    /// MPI benchmarks put MPI_Barrier before each timed call: the recorded comm time then starts
    /// when every rank has arrived, not when this rank's compute phase ended. For benchmarks
    /// (`cargo xtask bench collectives` sets it); not with --managed.
    #[arg(long, conflicts_with = "managed")]
    barrier: bool,
    /// Rank 0 only: JSON array of plans ({step_from, algorithm, chunk_bytes, channels, compression})
    /// to switch to during the run.
    #[arg(long, conflicts_with = "follow_hints")]
    plan_schedule: Option<PathBuf>,
    /// Follow ringside's hints for this job, from the job URL http://HOST:PORT/v1/jobs/ID (the
    /// agent's hint stream). Rank 0 applies each new hint's plan from the next step on all ranks
    /// (through its control header). Every rank given the flag also applies the hints' transport
    /// advice (tcp_rto_min_ms: a floor for TCP's retransmission timeout) to its own connections
    /// as soon as it arrives; give it to all ranks. If the agent is unreachable the job trains on
    /// with its current plan.
    #[arg(long, value_name = "JOB_URL", requires = "token")]
    follow_hints: Option<String>,
    /// Bearer token for --follow-hints (the job's tenant token). Prefer the environment variable,
    /// so the token does not appear in `ps`.
    #[arg(long, env = "RINGSIDE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Transport between the ranks: `tcp`; `rdma` (needs a build with the `rdma` feature and an
    /// RDMA device, an error otherwise); or `auto` (RDMA if a device is usable, else TCP with one
    /// warning "no RDMA device (...); falling back to TCP"). Every rank of a job must end up on
    /// the same transport, so use `auto` only when all hosts are alike.
    #[arg(long, value_enum, default_value_t = TransportKind::Tcp)]
    transport: TransportKind,
    /// RDMA device for --transport rdma|auto, as `ibv_devices` names it; default: the first one
    /// whose port 1 is active.
    #[arg(long)]
    rdma_device: Option<String>,
    /// Managed mode: hand each step's buffer to this host's IPU service (`ringside-ipu`) at
    /// IP:PORT (its address on the host link) instead of running the collective here. The service
    /// runs it with the other ranks' services and applies ringside's plans itself; this rank
    /// follows no hints and needs no --peers. The plan flags above are ignored (the service's own
    /// flags set its initial plan); each step's record carries the plan the service used.
    #[arg(long, value_name = "IP:PORT", conflicts_with_all = ["follow_hints", "plan_schedule"])]
    managed: Option<SocketAddr>,
    /// Where to write the JSON report.
    #[arg(long)]
    out: PathBuf,
    /// Also append each step's record to this file as one JSON line when the step ends (the
    /// report at --out is written only when the job ends); `{rank}` in it is replaced by the rank.
    #[arg(long, value_name = "PATH")]
    progress: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    if a.managed.is_none() && a.peers.len() != a.world {
        bail!("--peers has {} entries but --world is {}", a.peers.len(), a.world);
    }
    if a.rank >= a.world {
        bail!("--rank {} is not below --world {}", a.rank, a.world);
    }
    let plan = a.plan.plan()?;
    let max_channels = a.plan.max_channels();
    let progress = a.progress.as_ref().map(|p| PathBuf::from(p.to_string_lossy().replace("{rank}", &a.rank.to_string())));
    if let Some(path) = &progress {
        // Fail now, not steps later: the job itself would only warn and run on without it.
        std::fs::OpenOptions::new().create(true).append(true).open(path).with_context(|| format!("--progress {}: cannot open it for appending", path.display()))?;
    }
    // The follower's log of applied hints, read back after the run for the report.
    let mut applied_hints: Option<AppliedHints> = None;
    // This rank's TCP retransmission floor (transport advice), and on ranks other than 0 the
    // follower that feeds it (kept until the job ends).
    let rto_floor = a.follow_hints.is_some().then(TcpRtoFloor::new);
    let mut _advice_follower: Option<HintFollower> = None;
    let source: Option<Box<dyn PlanSource>> = match (&a.plan_schedule, &a.follow_hints, a.rank) {
        (Some(path), _, 0) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let plans: Vec<Plan> = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
            Some(Box::new(ScriptedPlans(plans)))
        }
        (None, Some(url), 0) => {
            // A bad URL is a configuration error (fail now); an unreachable agent is not: the
            // follower retries in the background and training never waits for it.
            let token = a.token.as_deref().context("--follow-hints needs --token or RINGSIDE_TOKEN")?;
            let client = JobClient::new(url, token).context("--follow-hints")?;
            // One quick probe, only to say in the log whether hints will flow; short timeouts so a
            // black-holed agent delays the start by seconds at most.
            let probe_cfg = ClientConfig { connect_timeout: Duration::from_secs(2), request_timeout: Duration::from_secs(3), ..ClientConfig::default() };
            match JobClient::with_config(url, token, probe_cfg).and_then(|c| c.hint()) {
                Ok(h) => tracing::info!(version = h.version, algorithm = %h.algorithm, compression = %h.compression, "ringside agent reachable; following hints"),
                Err(e) => tracing::warn!(error = %e, "ringside hints unavailable at start; training with the initial plan and retrying in the background"),
            }
            let floor = rto_floor.clone().expect("made when following hints");
            let follower = HintFollower::start_with_rto_floor(client, max_channels, floor).context("starting the hint follower thread")?;
            applied_hints = Some(follower.applied());
            Some(Box::new(follower))
        }
        (None, Some(url), _) => {
            // Plans come from rank 0; this rank follows the stream for its transport advice only.
            let token = a.token.as_deref().context("--follow-hints needs --token or RINGSIDE_TOKEN")?;
            let client = JobClient::new(url, token).context("--follow-hints")?;
            let floor = rto_floor.clone().expect("made when following hints");
            _advice_follower = Some(HintFollower::start_rto_floor_only(client, floor).context("starting the hint follower thread")?);
            None
        }
        _ => None,
    };
    let cfg = JobConfig {
        rank: a.rank,
        world: a.world,
        peers: a.peers,
        size_bytes: a.size,
        dtype: a.dtype,
        steps: a.steps,
        compute_ms: a.compute_ms,
        compute_jitter_ms: a.compute_jitter_ms,
        straggler_extra_ms: a.straggler_extra_ms,
        compute_mode: if a.busy_compute { ComputeMode::Busy } else { ComputeMode::Sleep },
        plan,
        max_channels,
        timeout_ms: a.timeout_ms,
        verify: a.verify,
        barrier: a.barrier,
        progress,
    };
    let mut report = match a.managed {
        Some(addr) => {
            let mut client = ManagedClient::connect(addr, Duration::from_millis(a.timeout_ms)).context("--managed")?;
            run_job_managed(&cfg, &mut client)
        }
        None => run_rank_on(&cfg, a.transport, a.rdma_device.clone(), source, rto_floor.as_ref())
            .context("setting up the collective mesh")?,
    };
    if let Some(applied) = &applied_hints {
        report.record_hints(&applied.snapshot());
    }
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(&a.out, json).with_context(|| format!("writing {}", a.out.display()))?;
    let s = &report.summary;
    eprintln!(
        "rank {}: {} steps, step mean {:.2} ms p99 {:.2} ms, comm mean {:.2} ms p99 {:.2} ms, verified {:?}",
        a.rank, s.steps_completed, s.step_ms.mean, s.step_ms.p99, s.comm_ms.mean, s.comm_ms.p99, s.all_verified
    );
    if let Some(e) = &report.error {
        bail!("rank {} failed at step {}: {e}", a.rank, report.steps.len());
    }
    if s.all_verified == Some(false) {
        bail!("rank {}: allreduce result did not verify", a.rank);
    }
    Ok(())
}
