//! OpenMPI on a rig: `mpirun` in the first rank's namespace launches one process per rank host
//! through a generated rsh agent that `nsenter`s each host's network namespace, so OpenMPI's own
//! TCP BTL carries its own collective algorithms over the rig's links. ringside wrote none of that
//! traffic: this is the third-party workload the detectors are judged on.
//!
//! Two programs use it: the training-like job [`spawn_mpi`] (`ringside-testbed mpi`, a compute
//! sleep then one `MPI_Allreduce` per step, `testbed/mpi/ringside_mpi_job.c`, compiled with
//! `mpicc` on first use) and `cargo xtask bench collectives`' timing program, both through
//! [`MpiLaunch`].
//!
//! Where the traffic goes: the TCP BTL listens on ports `port_min .. port_min + PORT_RANGE` of
//! each host's `eth0` (so a ringside `[match]`/job on that port range sees exactly the collective
//! traffic); mpirun's own out-of-band wiring (ORTE) uses other ports on the same interface.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::job::{rank_hosts_of, RunningJob};
use crate::rig::Rig;
use crate::size::ByteSize;

/// How many TCP ports the BTL may listen on, from [`MpiConfig::port_min`]; one per rank would
/// do, a margin keeps a port still in TIME_WAIT from failing a quick relaunch.
pub const PORT_RANGE: u16 = 64;

/// The source of the job program, compiled with `mpicc` into a cache directory on first use.
const JOB_SOURCE: &str = include_str!("../mpi/ringside_mpi_job.c");

/// OpenMPI 4.1 `coll_tuned_allreduce_algorithm` values; `Default` (0) is OpenMPI's own decision
/// rules (by size and communicator size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MpiAlgorithm {
    #[default]
    Default,
    #[value(alias = "basic_linear")]
    BasicLinear,
    Nonoverlapping,
    #[value(alias = "recursive_doubling")]
    RecursiveDoubling,
    Ring,
    #[value(alias = "segmented_ring")]
    SegmentedRing,
    Rabenseifner,
}

impl MpiAlgorithm {
    /// Every algorithm, OpenMPI's decision first.
    pub const ALL: [MpiAlgorithm; 7] = [
        MpiAlgorithm::Default,
        MpiAlgorithm::BasicLinear,
        MpiAlgorithm::Nonoverlapping,
        MpiAlgorithm::RecursiveDoubling,
        MpiAlgorithm::Ring,
        MpiAlgorithm::SegmentedRing,
        MpiAlgorithm::Rabenseifner,
    ];

    /// The `coll_tuned_allreduce_algorithm` value.
    pub fn id(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        match self {
            MpiAlgorithm::Default => "default",
            MpiAlgorithm::BasicLinear => "basic_linear",
            MpiAlgorithm::Nonoverlapping => "nonoverlapping",
            MpiAlgorithm::RecursiveDoubling => "recursive_doubling",
            MpiAlgorithm::Ring => "ring",
            MpiAlgorithm::SegmentedRing => "segmented_ring",
            MpiAlgorithm::Rabenseifner => "rabenseifner",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name.replace('-', "_"))
    }
}

/// One `mpirun` across some of a rig's hosts: everything but the program and its arguments.
#[derive(Clone, Debug)]
pub struct MpiLaunch {
    /// Host index of each rank (rank r on `hosts[r]`); mpirun runs in `hosts[0]`'s namespace.
    pub hosts: Vec<usize>,
    pub algorithm: MpiAlgorithm,
    /// First TCP port of the BTL's listening range ([`PORT_RANGE`] ports).
    pub port_min: u16,
    /// mpirun is killed (`timeout -k 5`) after this long.
    pub timeout: Duration,
    /// Where the generated launch agent and hostfile go.
    pub dir: PathBuf,
    /// Extra `--mca KEY VALUE` pairs.
    pub mca: Vec<(String, String)>,
}

impl MpiLaunch {
    /// The `mpirun` command (in host 0's namespace) that runs `program args...` on every rank.
    /// Writes the launch agent and the hostfile into `self.dir`.
    pub fn command<R: Rig + ?Sized>(&self, rig: &R, program: &Path, args: &[String]) -> Result<Command> {
        for tool in ["mpirun", "nsenter", "timeout"] {
            require_tool(tool)?;
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::file(&self.dir, e))?;
        let agent = write_launch_agent(rig, &self.hosts, &self.dir)?;
        let hostfile = self.dir.join("mpi-hosts");
        let mut hosts = String::new();
        for &h in &self.hosts {
            hosts.push_str(&format!("{} slots=1\n", rig.host_ipv4(h)?));
        }
        std::fs::write(&hostfile, hosts).map_err(|e| Error::file(&hostfile, e))?;
        let first = *self.hosts.first().ok_or_else(|| Error::InvalidArgument { field: "hosts", reason: "no rank".into() })?;
        let mut cmd = rig.host_netns(first)?.command("timeout");
        let secs = self.timeout.as_secs().max(1).to_string();
        cmd.args(["-k", "5", &secs, "mpirun", "--allow-run-as-root", "-np", &self.hosts.len().to_string()])
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["--map-by", "node", "--bind-to", "none"])
            .args(["--mca", "plm_rsh_agent"])
            .arg(&agent)
            .args(["--mca", "plm_rsh_no_tree_spawn", "1"])
            .args(["--mca", "btl", "tcp,self"])
            .args(["--mca", "btl_tcp_if_include", "eth0"])
            .args(["--mca", "oob_tcp_if_include", "eth0"])
            .args(["--mca", "btl_tcp_port_min_v4", &self.port_min.to_string()])
            .args(["--mca", "btl_tcp_port_range_v4", &PORT_RANGE.to_string()])
            .args(["--mca", "pml", "ob1"])
            // Each "node" has one slot, so OpenMPI believes it is not oversubscribed and busy-polls;
            // several spinning ranks on two shared cores are then an order of magnitude slower.
            .args(["--mca", "mpi_yield_when_idle", "1"]);
        if self.algorithm != MpiAlgorithm::Default {
            cmd.args(["--mca", "coll_tuned_use_dynamic_rules", "1"])
                .args(["--mca", "coll_tuned_allreduce_algorithm", &self.algorithm.id().to_string()]);
        }
        for (k, v) in &self.mca {
            cmd.args(["--mca", k, v]);
        }
        cmd.arg(program).args(args);
        cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("OMPI_MCA_btl_base_warn_component_unused", "0")
            .stdin(Stdio::null());
        Ok(cmd)
    }
}

fn require_tool(tool: &'static str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    if found {
        return Ok(());
    }
    let package = match tool {
        "mpirun" => "openmpi-bin",
        "mpicc" => "libopenmpi-dev",
        _ => "util-linux coreutils",
    };
    Err(Error::ToolMissing { tool, package })
}

/// Writes the agent OpenMPI's rsh launcher calls as `AGENT [ssh options] HOST CMD...`: it runs
/// CMD in the network namespace of the rig host that owns address HOST (only the network
/// namespace: the mount namespace stays, as with [`crate::Netns::command`]), with its own OpenMPI
/// session directory under `dir` (`orte_tmpdir_base`): daemons sharing one, as they do when every
/// "node" is this machine, race to create it and one of them dies (about 1 launch in 6 at load 15).
fn write_launch_agent<R: Rig + ?Sized>(rig: &R, hosts: &[usize], dir: &Path) -> Result<PathBuf> {
    let mut cases = String::new();
    for &h in hosts {
        let ns = rig.host_netns(h)?;
        if !ns.path().exists() {
            return Err(Error::InvalidArgument {
                field: "hosts",
                reason: format!("namespace {} is not under /run/netns, so nsenter cannot enter it", ns.name()),
            });
        }
        let session = dir.join(format!("session-h{h}"));
        cases.push_str(&format!("  {}) ns={} session={} ;;\n", rig.host_ipv4(h)?, ns.path().display(), session.display()));
    }
    let script = format!(
        "#!/bin/sh\n\
         # Generated by ringside's testbed: OpenMPI launch agent (plm_rsh_agent).\n\
         # Called as: agent [ssh-style options] HOST COMMAND...; runs COMMAND in HOST's netns.\n\
         while [ $# -gt 0 ]; do case \"$1\" in -*) shift ;; *) break ;; esac; done\n\
         host=\"$1\"; shift\n\
         case \"$host\" in\n{cases}  *) echo \"launch agent: unknown host $host\" >&2; exit 1 ;;\nesac\n\
         # Every emulated host is the same machine (same hostname, same /tmp): orted daemons started\n\
         # together race to create one session directory, and the loser dies silently (\"File\n\
         # exists\" in orte_session_dir), leaving mpirun waiting for it. One session base per host.\n\
         mkdir -p \"$session\" || exit 1\n\
         exec nsenter --net=\"$ns\" env OMPI_MCA_orte_tmpdir_base=\"$session\" sh -c \"$*\"\n"
    );
    let path = dir.join("mpi-launch-agent.sh");
    std::fs::write(&path, script).map_err(|e| Error::file(&path, e))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).map_err(|e| Error::file(&path, e))?;
    Ok(path)
}

/// Compiles `source` with `mpicc -O2` into `<temp>/ringside-mpi-<hash>/<name>` unless that binary
/// is already there (the hash covers the source, so an edited source gets a new binary).
pub fn compile(name: &str, source: &str) -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    require_tool("mpicc")?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    let dir = std::env::temp_dir().join(format!("ringside-mpi-{:016x}", h.finish()));
    let bin = dir.join(name);
    if bin.is_file() {
        return Ok(bin);
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::file(&dir, e))?;
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).map_err(|e| Error::file(&src, e))?;
    // Build under a temporary name and rename, so a concurrent or interrupted compile never
    // leaves a half-written binary that a later run would trust.
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let mut cmd = Command::new("mpicc");
    cmd.arg("-O2").arg("-o").arg(&tmp).arg(&src);
    crate::cmd::run(crate::cmd::Tool::Mpicc, &mut cmd, None)?;
    std::fs::rename(&tmp, &bin).map_err(|e| Error::file(&bin, e))?;
    Ok(bin)
}

/// A training-like OpenMPI job (see the module docs).
#[derive(Clone, Debug)]
pub struct MpiConfig {
    pub ranks: usize,
    /// Host index of each rank; `None` = rank r on host r.
    pub hosts: Option<Vec<usize>>,
    pub algorithm: MpiAlgorithm,
    /// Bytes per `MPI_Allreduce` (f32 elements).
    pub size: ByteSize,
    pub compute_ms: u64,
    /// Stop after this many steps (0: no limit; then `duration` must be set).
    pub steps: u64,
    /// Stop after the first step that ends this long after the job started.
    pub duration: Option<Duration>,
    /// (rank, extra compute milliseconds per step).
    pub straggler: Option<(usize, u64)>,
    /// First port of the TCP BTL's range (see [`PORT_RANGE`]).
    pub port_min: u16,
    /// mpirun is killed after this long.
    pub timeout: Duration,
    /// Where `rank-R.json`, `mpirun.log` and the launch files go; a fresh temp dir when `None`.
    pub out_dir: Option<PathBuf>,
    /// Extra `--mca KEY VALUE` pairs.
    pub mca: Vec<(String, String)>,
}

impl Default for MpiConfig {
    fn default() -> Self {
        MpiConfig {
            ranks: 4,
            hosts: None,
            algorithm: MpiAlgorithm::Default,
            size: ByteSize(4 << 20),
            compute_ms: 50,
            steps: 100,
            duration: None,
            straggler: None,
            port_min: 30000,
            timeout: Duration::from_secs(300),
            out_dir: None,
            mca: Vec::new(),
        }
    }
}

impl MpiConfig {
    /// The job's TCP port range as `"lo-hi"` (for a ringside `[[job]]` or `[match]`).
    pub fn port_range(&self) -> String {
        format!("{}-{}", self.port_min, self.port_min + PORT_RANGE - 1)
    }

    fn validate(&self) -> Result<()> {
        if self.size.0 < 4 || self.size.0 > (1 << 30) {
            return Err(Error::InvalidArgument { field: "size", reason: format!("{} (need 4 B .. 1 GiB)", self.size) });
        }
        if self.steps == 0 && self.duration.is_none() {
            return Err(Error::InvalidArgument { field: "steps", reason: "0 steps and no duration: the job would never stop".into() });
        }
        if self.port_min < 1024 || self.port_min > u16::MAX - PORT_RANGE {
            return Err(Error::InvalidArgument { field: "port_min", reason: format!("{} (need 1024..={})", self.port_min, u16::MAX - PORT_RANGE) });
        }
        Ok(())
    }

    /// The job program's arguments.
    fn program_args(&self, out_dir: &Path) -> Vec<String> {
        let mut a = vec![
            "--out-dir".to_string(),
            out_dir.display().to_string(),
            "--size".into(),
            self.size.0.to_string(),
            "--compute-ms".into(),
            self.compute_ms.to_string(),
        ];
        if self.steps > 0 {
            a.extend(["--steps".into(), self.steps.to_string()]);
        }
        if let Some(d) = self.duration {
            a.extend(["--duration-ms".into(), d.as_millis().to_string()]);
        }
        if let Some((r, extra)) = self.straggler {
            a.extend(["--straggler-rank".into(), r.to_string(), "--straggler-extra-ms".into(), extra.to_string()]);
        }
        a
    }
}

/// Starts the job: compiles the program if needed, runs mpirun across the ranks' hosts. The
/// returned [`RunningJob`] waits for mpirun and reads every rank's JSON; dropping it kills
/// mpirun and any OpenMPI process left in the ranks' namespaces.
pub fn spawn_mpi<R: Rig + ?Sized>(rig: &R, cfg: &MpiConfig) -> Result<RunningJob> {
    cfg.validate()?;
    let hosts = rank_hosts_of(rig, cfg.ranks, cfg.hosts.as_deref())?;
    let bin = compile("ringside_mpi_job", JOB_SOURCE)?;
    let mut job = RunningJob::prepare(cfg.out_dir.as_deref(), "ringside-mpi", cfg.timeout)?;
    let out_dir = job.out_dir().to_path_buf();
    job.record_straggler(rig, &hosts, cfg.straggler)?;
    let launch = MpiLaunch {
        hosts: hosts.clone(),
        algorithm: cfg.algorithm,
        port_min: cfg.port_min,
        timeout: cfg.timeout,
        dir: out_dir.clone(),
        mca: cfg.mca.clone(),
    };
    let mut cmd = launch.command(rig, &bin, &cfg.program_args(&out_dir))?;
    let log = out_dir.join("mpirun.log");
    let logf = std::fs::File::create(&log).map_err(|e| Error::file(&log, e))?;
    let logf2 = logf.try_clone().map_err(|e| Error::file(&log, e))?;
    cmd.stdout(logf).stderr(logf2);
    for r in 0..cfg.ranks {
        let _ = std::fs::remove_file(out_dir.join(format!("rank-{r}.json")));
    }
    let namespaces: Vec<String> = hosts.iter().map(|&h| rig.host_netns(h).map(|n| n.name().to_string())).collect::<Result<_>>()?;
    job.sweep_on_drop(namespaces, &["orted", "ringside_mpi_j", "mpirun"]);
    let command = crate::cmd::describe(&cmd);
    tracing::info!(algorithm = cfg.algorithm.name(), %command, "starting mpirun");
    let child = cmd.spawn().map_err(|source| Error::Spawn { command, source })?;
    // mpirun writes every rank's result: it is rank 0's process; the others have none of their own.
    job.add_rank(0, Some(child), out_dir.join("rank-0.json"), log.clone());
    for r in 1..cfg.ranks {
        job.add_rank(r, None, out_dir.join(format!("rank-{r}.json")), log.clone());
    }
    Ok(job)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_names_round_trip_and_ids_are_openmpis() {
        for a in MpiAlgorithm::ALL {
            assert_eq!(MpiAlgorithm::from_name(a.name()), Some(a));
        }
        assert_eq!(MpiAlgorithm::from_name("segmented-ring"), Some(MpiAlgorithm::SegmentedRing));
        assert_eq!(MpiAlgorithm::Ring.id(), 4);
        assert_eq!(MpiAlgorithm::Rabenseifner.id(), 6);
        assert_eq!(MpiAlgorithm::from_name("bogus"), None);
    }

    #[test]
    fn config_is_validated() {
        let ok = MpiConfig::default();
        assert!(ok.validate().is_ok());
        assert_eq!(ok.port_range(), "30000-30063");
        let never = MpiConfig { steps: 0, duration: None, ..Default::default() };
        assert!(never.validate().unwrap_err().to_string().contains("never stop"));
        let tiny = MpiConfig { size: ByteSize(2), ..Default::default() };
        assert!(tiny.validate().is_err());
        let low_port = MpiConfig { port_min: 80, ..Default::default() };
        assert!(low_port.validate().is_err());
    }

    #[test]
    fn program_args_carry_the_straggler_and_the_stop_rule() {
        let c = MpiConfig { straggler: Some((2, 60)), duration: Some(Duration::from_secs(3)), steps: 0, ..Default::default() };
        let a = c.program_args(Path::new("/tmp/x")).join(" ");
        assert_eq!(a, "--out-dir /tmp/x --size 4194304 --compute-ms 50 --duration-ms 3000 --straggler-rank 2 --straggler-extra-ms 60");
    }
}
