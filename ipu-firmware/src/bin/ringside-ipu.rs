//! `ringside-ipu`: the managed collective service, one per IPU (see `ipu_firmware::managed` and
//! docs/operator-guide.md, "Managed collectives"). It listens for its tenant on the host link
//! (`--listen`, the IPU's end of the host ↔ IPU link), builds the engine's mesh with the other
//! ranks' services over the fabric (`--peers`), and runs each collective the tenant hands it.
//! With `--agent`, the service follows its own IPU's agent's hints for the job and votes with them
//! in every collective's control exchange; all services run the agreed plan from the same step,
//! never outside the tenant's `--constraints` (see `ipu_firmware::managed`). When the constraints
//! allow transport advice (`transport_tuning`), the service also sets each hint's `tcp_rto_min_ms`
//! on its own connections to the other services (`ipu_firmware::rto`): local, no vote.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use ipu_firmware::job::parse_size;
use ipu_firmware::managed::{check_plan, serve, EngineRunner, HintVoter, ServiceConfig, ServiceStats, DEFAULT_MAX_BUFFER};
use ipu_firmware::plan::PlanArgs;
use ipu_firmware::{Communicator, CommunicatorConfig, HintFollower, PlanReporter, PlanVoter, TcpOptions, TcpRtoFloor, TcpTransport};
use ringside_client::{Constraints, JobClient};

/// ringside's managed collective service (runs in the IPU, serves the tenant on the host link).
#[derive(Parser, Debug)]
#[command(name = "ringside-ipu", version)]
struct Args {
    /// This service's rank (the rank of the tenant process on this host), 0-based.
    #[arg(long)]
    rank: usize,
    /// Number of ranks (one service per rank).
    #[arg(long)]
    world: usize,
    /// IP:PORT of every rank's service on the fabric, comma separated, index = rank. This service
    /// listens on 0.0.0.0 at its own entry's port.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<SocketAddr>,
    /// Where the tenant connects: the IPU's address on the host link, and a port.
    #[arg(long)]
    listen: SocketAddr,
    /// Largest buffer a tenant may hand over, e.g. 256MiB.
    #[arg(long, default_value_t = DEFAULT_MAX_BUFFER as usize, value_parser = parse_size)]
    max_buffer: usize,
    /// Bound on every read and write on the host link and on the tenant's idle time between
    /// requests (its compute phase), in ms.
    #[arg(long, default_value_t = 60_000)]
    tenant_timeout_ms: u64,
    /// The job's initial plan (the same on every service: it is also the baseline a hint's
    /// severity is judged against).
    #[command(flatten)]
    plan: PlanArgs,
    /// Bound on mesh setup and on every wait for a peer service, in ms. Must exceed the slowest
    /// tenant's compute phase.
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    /// Follow this IPU's agent's hints for the job (http://HOST:PORT/v1/jobs/ID: the job as
    /// registered with this IPU's agent) and vote with them: every collective runs the plan agreed
    /// from all services' votes (the most severe wins). The service also reports the agreed plan
    /// to that agent (PUT .../plan), so its policy judges the plan that ran. Without it the
    /// service abstains. With `"transport_tuning": true` in --constraints, the hints' transport
    /// advice (tcp_rto_min_ms) is set on this service's connections to the others as it arrives.
    #[arg(long, value_name = "JOB_URL", requires_all = ["token", "constraints"])]
    agent: Option<String>,
    /// The job's tenant token for --agent. Prefer the environment variable (not visible in `ps`).
    #[arg(long, env = "RINGSIDE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// JSON file with the tenant's constraints as registered (the `constraints` object of
    /// `POST /v1/jobs`). Every plan is checked against them before it is applied; one outside
    /// them is refused.
    #[arg(long)]
    constraints: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Plain text when stderr is a log file (the testbed and the evaluations read it).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let a = Args::parse();
    if a.peers.len() != a.world {
        bail!("--peers has {} entries but --world is {}", a.peers.len(), a.world);
    }
    if a.rank >= a.world {
        bail!("--rank {} is not below --world {}", a.rank, a.world);
    }
    let plan = a.plan.plan()?;
    let max_channels = a.plan.max_channels();
    let constraints: Option<Constraints> = match &a.constraints {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading --constraints {}", p.display()))?;
            let c: Constraints = serde_json::from_str(&text).with_context(|| format!("parsing --constraints {}", p.display()))?;
            c.validate().map_err(anyhow::Error::msg).context("--constraints")?;
            if let Err(e) = check_plan(&plan, &c) {
                bail!("the initial plan is outside the tenant's constraints: {e}");
            }
            Some(c)
        }
        None => None,
    };
    let stats = Arc::new(ServiceStats::default());
    // Bound before the mesh is built, so a tenant that starts first is queued, not refused.
    let listener = TcpListener::bind(a.listen).with_context(|| format!("binding the host link --listen {}; is it this IPU's address on the host link?", a.listen))?;
    // This service's TCP retransmission floor: the hints' transport advice, on its connections to
    // the other services (a change is local: no vote, nothing on the wire).
    let rto_floor = TcpRtoFloor::new();
    let (voter, reporter): (Box<dyn PlanVoter>, _) = match &a.agent {
        Some(url) => {
            let token = a.token.as_deref().context("--agent needs --token or RINGSIDE_TOKEN")?;
            let client = JobClient::new(url, token).context("--agent")?;
            let constraints = constraints.clone().context("--agent needs --constraints")?;
            let reporter = PlanReporter::start(client.clone()).context("starting the plan reporter thread")?;
            // Checked at the point of use, like plans: the agent sends advice only to jobs
            // registered with transport_tuning, and the constraints are the registered ones.
            let follower = if constraints.transport_tuning {
                HintFollower::start_with_rto_floor(client, max_channels, rto_floor.clone())
            } else {
                tracing::info!("the tenant's constraints leave transport_tuning off: hints' transport advice (tcp_rto_min_ms) is not applied");
                HintFollower::start(client, max_channels)
            }
            .context("starting the hint follower thread")?;
            (Box::new(HintVoter::new(follower, constraints, plan, stats.clone())), Some(reporter))
        }
        None => (Box::new(HintVoter::abstaining(constraints.clone(), plan, stats.clone())), None),
    };
    tracing::info!(rank = a.rank, world = a.world, listen = %a.listen, following = a.agent.is_some(), "building the service mesh");
    let timeout = Duration::from_millis(a.timeout_ms);
    let mut t = TcpTransport::bind_and_connect(a.rank, &a.peers, TcpOptions { channels: max_channels, timeout }).context("building the mesh among the IPU services")?;
    t.set_rto_floor(&rto_floor);
    let mut comm = Communicator::new(t, CommunicatorConfig { initial_plan: plan, timeout })?;
    // Every service votes (abstaining without an agent): the control exchange must be the same
    // on all of them.
    comm.set_plan_voter(voter);
    tracing::info!(listen = %a.listen, "mesh up; serving the tenant");
    let cfg = ServiceConfig { max_buffer: a.max_buffer as u64, tenant_timeout: Duration::from_millis(a.tenant_timeout_ms) };
    // Runs until killed (the provider's supervisor owns the lifetime); each session's end logs the
    // counters.
    serve(listener, EngineRunner { comm, reporter }, a.world, cfg, stats.clone(), Arc::new(AtomicBool::new(false))).context("serving the host link")?;
    Ok(())
}
