//! `ringside-testbed`: network-namespace rigs, traffic with exact ground truth, and the emulated
//! training job, for trying ringside on one machine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use testbed::job::JobConfig;
use testbed::{MpiAlgorithm, MpiConfig};
use testbed::{TorchCompression, TorchConfig};
use testbed::{ByteSize, CrossTrafficSpec, FlapSpec, LeafSpine, LeafSpineConfig, Rig, RoceSpec, Star, StarConfig};

/// Network-namespace rigs for ringside: a star of hosts on a bridge, TCP and RoCEv2 traffic that
/// reports exactly what it sent, and an emulated training job.
///
/// Everything runs in network namespaces named `rs-<pid>-<n>-...`, never on the machine's own
/// interfaces. Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN). Logs go to stderr (RUST_LOG=debug for
/// more); results go to stdout as JSON.
///
/// A first session:
///
///   ringside-testbed star --hosts 4                     # terminal 1, keep it running
///
///   ringside-testbed --netns rs-<pid>-0-h1 tcp-sink     # terminal 2
///
///   ringside-testbed --netns rs-<pid>-0-h0 tcp-send --to 10.77.0.2:5201 --bytes 1GiB
///
/// Faults (on `star`, `leaf-spine` and `job`; each recorded with its start time, printed as
/// "faults", and removed when the command ends):
///
///   --loss h1:2.5           random loss on host 1's link      (leaf-spine: also up0, up1)
///   --rate-cap up0:200      tbf cap on leaf 0's uplink
///   --flap h2:500:5000      host 2's link down 500 ms every 5 s (no period: once)
///   --cross-traffic         bulk TCP between two hosts outside the job, across the uplinks
///   --faults-after 10       start all of them 10 s after the rig (or job) is up
///
///   ringside-testbed leaf-spine --hosts-per-leaf 3 --rate-cap up0:500 --cross-traffic
///   ringside-testbed job --topology leaf-spine --ranks 4 --rate-cap up0:300 --cross-traffic --faults-after 5
#[derive(Debug, Parser)]
#[command(name = "ringside-testbed", version, verbatim_doc_comment)]
struct Cli {
    /// Enter this network namespace (a name from `ip netns list`, or a path like
    /// /run/netns/NAME) before running the command. Same as starting the command under
    /// `nsenter --net=/run/netns/NAME`; the mount namespace (and /sys/fs/bpf) stays yours.
    #[arg(long, global = true, value_name = "NAME")]
    netns: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bring up a star (N host namespaces on one bridge), print how to use it, keep it until
    /// Ctrl-C, then tear it down.
    ///
    /// Host i (0-based) is namespace `rs-<pid>-<n>-h<i>` with eth0 = 10.77.0.(i+1)/24 and
    /// fd77::(i+1)/64; its cable ends in port p<i> of bridge br0 in namespace `rs-<pid>-<n>-sw`.
    Star(StarArgs),

    /// Bring up a leaf-spine fabric, print how to use it, keep it until Ctrl-C, then tear it down.
    ///
    /// Leaf L is a bridge in namespace `rs-<pid>-<n>-leafL`; its hosts (global index i = L*k + j)
    /// are `rs-<pid>-<n>-h<i>` with eth0 = 10.77.L.(j+1)/24 and fd77:0:0:L::(j+1)/64. Each leaf's
    /// bridge port `uplink` is cabled to `l<L>` (10.77.L.254, the hosts' gateway) in the routing
    /// spine `rs-<pid>-<n>-spine`: cross-leaf traffic shares the uplinks `up0`, `up1`, ...
    LeafSpine(LeafSpineArgs),

    /// Delete namespaces left behind by testbed runs that died (rs-<pid>-... whose pid is gone),
    /// restore net.core.netdev_max_backlog if a dead run left it raised, and remove the job
    /// output directories of processes that are gone (ringside-{job,mpi,torch}-<pid>-<n> under
    /// the temp dir: logs of killed or failed jobs) and the pin directories of test and eval
    /// agents that were killed (/sys/fs/bpf/ringside-...-<pid>-... holding ringside's pins, whose
    /// pid is gone; an operator's /sys/fs/bpf/ringside is never touched), with their config and
    /// state files under the temp dir (ringside-...-<pid>-...).
    Clean {
        /// Delete every rs-* namespace, including those of runs still in progress.
        #[arg(long)]
        all: bool,
    },

    /// Accept TCP connections, read each to EOF, print what was received (JSON).
    TcpSink {
        /// Address to listen on (inside the current namespace).
        #[arg(long, default_value = "0.0.0.0:5201")]
        listen: SocketAddr,
        /// Connections to receive before reporting.
        #[arg(long, default_value_t = 1)]
        connections: usize,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },

    /// Send exactly --bytes on each of --streams TCP connections; print payload bytes and the
    /// kernel's TCP_INFO counts (segments out, retransmissions, RTT) as JSON.
    TcpSend {
        /// Where a tcp-sink listens, e.g. 10.77.0.2:5201.
        #[arg(long)]
        to: SocketAddr,
        /// Payload bytes per stream: 4096, 64KiB, 16MiB, 1GB...
        #[arg(long, default_value = "16MiB")]
        bytes: ByteSize,
        /// Parallel connections.
        #[arg(long, default_value_t = 1)]
        streams: usize,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },

    /// Send crafted RoCEv2 packets (UDP to port 4791 carrying a real InfiniBand BTH) and print
    /// exactly what was sent: per-opcode counts, PSN gaps, CE marks, CNPs, NAKs, L3 bytes.
    RoceSend(RoceArgs),

    /// Receive RoCEv2 datagrams and count them per opcode, with ECN CE marks (JSON).
    RoceSink {
        /// Address to listen on.
        #[arg(long, default_value = "0.0.0.0:4791")]
        listen: SocketAddr,
        /// Stop after this many datagrams.
        #[arg(long)]
        expect: Option<u64>,
        /// Stop when nothing arrived for this many milliseconds after the first datagram.
        #[arg(long, default_value_t = 2000)]
        idle_ms: u64,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
    },

    /// Run an emulated training job: build a rig (a star of --ranks hosts, or with --topology
    /// leaf-spine two leaves with the ranks split between them), start one `ringside-rank` per
    /// host namespace, inject the faults, wait, and summarize step and communication times and the
    /// fault log (JSON on stdout). With --cross-traffic the rig gets spare hosts for it (one per
    /// leaf, or two on the star) that take no part in the job.
    Job(JobArgs),

    /// Run OpenMPI's MPI_Allreduce as a training-like job: build a rig as `job` does, run
    /// `mpirun` in the first rank's namespace (one process per rank host, OpenMPI's TCP BTL on
    /// each host's eth0), every step a compute sleep then one allreduce by the chosen
    /// `coll_tuned` algorithm; inject the faults; print every rank's step and communication
    /// times and the fault log (JSON on stdout).
    ///
    /// The collective traffic is OpenMPI's (ringside wrote none of it); it runs on TCP ports
    /// PORT_MIN..PORT_MIN+63, so an agent matches it with e.g. `tcp_ports = ["30000-30063"]`.
    /// Needs `mpirun` and `mpicc` (Debian openmpi-bin, libopenmpi-dev: `cargo xtask setup`); the
    /// job program is compiled on first use into /tmp/ringside-mpi-<hash>/.
    ///
    ///   ringside-testbed mpi --ranks 4 --algorithm ring --size 4MiB --duration-s 60 --loss 1:2 --faults-after 20
    #[command(verbatim_doc_comment)]
    Mpi(MpiArgs),

    /// Run a real PyTorch DistributedDataParallel training job (gloo backend, CPU): build a rig as
    /// `job` does, start one Python process per rank in its host's namespace, inject the faults,
    /// wait, and print every rank's step and communication times and the fault log (JSON).
    ///
    /// What runs where: rank r runs `ringside_ddp_train.py` (embedded in this binary, written to
    /// the out dir) in host r's namespace with GLOO_SOCKET_IFNAME=eth0. Rank 0 serves the
    /// rendezvous (PyTorch's TCP store) on --port of its address; gloo then connects every pair
    /// of ranks. Each step trains an MLP (--hidden, --layers: about 4·layers·hidden² bytes of
    /// gradients, 8 MiB by default) on fresh synthetic data, and DDP all-reduces the gradients in
    /// --bucket-cap-mb buckets during the backward pass: that is the traffic an agent sees.
    ///
    /// Faults: the same flags as `job`; --faults-after counts from the moment every rank began
    /// training (importing torch and setting up DDP takes each rank 5-15 s first).
    ///
    /// Ports: every TCP connection of the job has both ends in PORT..PORT+255 (the store on PORT;
    /// the rank hosts' ephemeral port range is narrowed to the rest, since gloo's own ports cannot
    /// be set), so an agent matches the job with e.g. `tcp_ports = ["29500-29755"]`.
    ///
    /// The JSON: "job" (per rank: step_ms and comm_ms distributions, exit, paths of rank-R.json
    /// and rank-R.log; rank-R.json holds every step's step_ms, compute_ms, comm_ms (first bucket
    /// handed to gloo → last bucket reduced), exposed_comm_ms, loss, compression), "faults",
    /// "cross_traffic", "tcp_ports", "grad_bytes_per_step", "compression".
    ///
    /// Needs the venv of `cargo xtask setup` (PyTorch in <workspace>/target/venv), or --python /
    /// RINGSIDE_PYTHON naming a Python with torch; --follow-hints also needs the `ringside`
    /// package (ringside-client/python) in it.
    ///
    ///   ringside-testbed torch --ranks 4 --steps 100
    ///   ringside-testbed torch --ranks 6 --duration-s 60 --compression fp16 --straggler 2:80
    ///   ringside-testbed torch --ranks 4 --duration-s 90 --loss 1:2 --faults-after 30
    #[command(verbatim_doc_comment)]
    Torch(TorchArgs),
}

#[derive(Debug, Args)]
struct StarArgs {
    /// Number of host namespaces (1..=250).
    #[arg(long, default_value_t = 4)]
    hosts: usize,
    #[command(flatten)]
    run: RigRunArgs,
    #[command(flatten)]
    faults: FaultArgs,
}

/// How the rig's links are tuned and how long it stays up; shared by `star` and `leaf-spine`.
#[derive(Debug, Args)]
struct RigRunArgs {
    /// Tear down after this many seconds even without Ctrl-C.
    #[arg(long, default_value_t = 12 * 3600)]
    max_seconds: u64,
    /// Print the rig description as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Leave receive packet steering (RPS) off on the links. Without RPS, veth and bridge
    /// links on a small VM reorder packets under load and TCP shows spurious retransmissions.
    #[arg(long)]
    no_rps: bool,
    /// Do not raise net.core.netdev_max_backlog while the rig is up.
    #[arg(long)]
    no_backlog: bool,
    /// Turn TSO/GSO/GRO off on every link, so TC programs see MTU-sized packets that match TCP
    /// segment counts (slower).
    #[arg(long)]
    no_offloads: bool,
    /// Link MTU.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
}

#[derive(Debug, Args)]
struct LeafSpineArgs {
    /// Number of leaves (2..=8).
    #[arg(long, default_value_t = 2)]
    leaves: usize,
    /// Hosts per leaf (1..=200).
    #[arg(long, default_value_t = 2)]
    hosts_per_leaf: usize,
    #[command(flatten)]
    run: RigRunArgs,
    #[command(flatten)]
    faults: FaultArgs,
}

/// Fault flags shared by `star`, `leaf-spine` and `job`. LINK is `h<i>` (host i's access link),
/// `up<L>` (leaf L's uplink, leaf-spine only), or a bare number: host i (in `job`: rank i's host).
#[derive(Debug, Args, Default)]
struct FaultArgs {
    /// Random loss on a link, both directions: LINK:PERCENT, e.g. h1:2.5 or up0:1 (repeatable).
    /// A bare PERCENT means host 0 (with a job: rank 0's host).
    #[arg(long, value_name = "LINK:PCT", value_parser = parse_link_f64)]
    loss: Vec<(Option<String>, f64)>,
    /// tbf rate cap on a link, both directions: LINK:MBIT, e.g. up0:200 (repeatable). A bare
    /// MBIT means host 0 (with a job: rank 0's host).
    #[arg(long, value_name = "LINK:MBIT", value_parser = parse_link_u64)]
    rate_cap: Vec<(Option<String>, u64)>,
    /// Link flap: LINK:DOWN_MS[:PERIOD_MS]: the link goes down for DOWN_MS, then up; again every
    /// PERIOD_MS if given (repeatable). The link is brought up when the command ends.
    #[arg(long, value_name = "LINK:DOWN_MS[:PERIOD_MS]", value_parser = parse_flap)]
    flap: Vec<(String, u64, Option<u64>)>,
    /// Cross traffic: bulk TCP from host FROM to host TO at MBIT (0 or absent: unbounded). Bare
    /// --cross-traffic picks two hosts on different leaves that are not in the job (star: the
    /// last two hosts).
    #[arg(long, value_name = "FROM:TO[:MBIT]", num_args = 0..=1, default_missing_value = "auto", value_parser = parse_cross)]
    cross_traffic: Option<CrossArg>,
    /// Parallel TCP connections of the cross traffic.
    #[arg(long, default_value_t = 4, value_name = "N")]
    cross_streams: usize,
    /// Stop the cross traffic after this many seconds (default: while the command runs).
    #[arg(long, value_name = "S")]
    cross_seconds: Option<u64>,
    /// Inject every fault this many seconds after the rig (job: the ranks) started, so the
    /// first part of a run is a fault-free baseline.
    #[arg(long, default_value_t = 0, value_name = "S")]
    faults_after: u64,
}

impl FaultArgs {
    fn any(&self) -> bool {
        !self.loss.is_empty() || !self.rate_cap.is_empty() || !self.flap.is_empty() || self.cross_traffic.is_some()
    }
}

/// The guards of the faults a command injected; dropping it removes them all.
#[derive(Default)]
struct ActiveFaults {
    _loss: Vec<testbed::LossGuard>,
    _caps: Vec<testbed::RateCapGuard>,
    _flaps: Vec<testbed::FlapGuard>,
    cross: Option<testbed::CrossTraffic>,
}

/// Injects `f` on `rig`. `rank_hosts` maps a bare-number LINK to a rank's host (job); `auto_cross`
/// is the (from, to) a bare --cross-traffic uses.
fn inject_faults(rig: &dyn Rig, f: &FaultArgs, rank_hosts: Option<&[usize]>, auto_cross: Option<(usize, usize)>) -> anyhow::Result<ActiveFaults> {
    let link = |l: &Option<String>| -> anyhow::Result<String> {
        let l = l.clone().unwrap_or_else(|| "0".into());
        match (l.parse::<usize>(), rank_hosts) {
            (Ok(r), Some(hosts)) => Ok(format!("h{}", hosts.get(r).with_context(|| format!("rank {r} does not exist"))?)),
            _ => Ok(l),
        }
    };
    let mut out = ActiveFaults::default();
    for (l, p) in &f.loss {
        out._loss.push(rig.link_loss(&link(l)?, *p)?);
    }
    for (l, m) in &f.rate_cap {
        out._caps.push(rig.link_rate_cap(&link(l)?, *m)?);
    }
    for (l, down, period) in &f.flap {
        let spec = match period {
            Some(p) => FlapSpec::periodic(Duration::from_millis(*down), Duration::from_millis(*p)),
            None => FlapSpec::once(Duration::from_millis(*down)),
        };
        out._flaps.push(rig.link_flap(&link(&Some(l.clone()))?, spec)?);
    }
    if let Some(c) = &f.cross_traffic {
        let (from, to, rate) = match c {
            CrossArg::Hosts(a, b, r) => (*a, *b, *r),
            CrossArg::Auto => {
                let (a, b) = auto_cross.context("--cross-traffic without FROM:TO needs at least two hosts outside the job")?;
                (a, b, None)
            }
        };
        let spec = CrossTrafficSpec { from, to, streams: f.cross_streams, rate_mbit: rate, duration: f.cross_seconds.map(Duration::from_secs), port: 0 };
        out.cross = Some(rig.cross_traffic(spec)?);
    }
    Ok(out)
}

/// Sleeps `secs` unless a stop is requested first; false if stopped.
fn interruptible_sleep(secs: u64) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    for _ in 0..(secs * 10 + 1) {
        if testbed::signals::stop_requested() {
            return false;
        }
        let Some(left) = end.checked_duration_since(Instant::now()) else { break };
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
    !testbed::signals::stop_requested()
}

#[derive(Debug, Args)]
struct RoceArgs {
    /// Destination, e.g. 10.77.0.2:4791 (port defaults to 4791 if you give only an address).
    #[arg(long, value_parser = parse_roce_dest)]
    to: SocketAddr,
    /// UDP source port (0: ephemeral).
    #[arg(long, default_value_t = 0)]
    src_port: u16,
    /// Destination queue pair number (24 bits; decimal or 0x hex).
    #[arg(long, default_value = "0x11", value_parser = parse_u32)]
    dest_qp: u32,
    /// PSN of the first data packet (24 bits).
    #[arg(long, default_value = "0", value_parser = parse_u32)]
    start_psn: u32,
    /// Data packets to send (skipped PSNs do not count).
    #[arg(long, default_value_t = 1000)]
    packets: usize,
    /// Payload bytes per data packet.
    #[arg(long, default_value_t = 1024)]
    payload_len: usize,
    /// PSNs not to send, creating gaps: e.g. --skip-psn 10,11,500.
    #[arg(long, value_delimiter = ',', value_parser = parse_u32)]
    skip_psn: Vec<u32>,
    /// Data packets sent with IP ECN = CE, spread evenly.
    #[arg(long, default_value_t = 0)]
    ce_marks: usize,
    /// CNPs (BTH opcode 0x81) to send, interleaved with the data.
    #[arg(long, default_value_t = 0)]
    cnps: usize,
    /// NAKs (opcode 0x11, AETH syndrome 0x60) to send, interleaved with the data.
    #[arg(long, default_value_t = 0)]
    naks: usize,
    /// BTH opcode of data packets (0x0a RDMA WRITE Only, 0x04 SEND Only, ...).
    #[arg(long, default_value = "0x0a", value_parser = parse_u8)]
    opcode: u8,
    /// DSCP of every packet.
    #[arg(long, default_value_t = 26)]
    dscp: u8,
    /// Send non-CE packets as not-ECT (default: ECT(0), as DCQCN senders do).
    #[arg(long)]
    no_ect: bool,
    /// Do not append the 4-byte (placeholder) ICRC.
    #[arg(long)]
    no_icrc: bool,
    /// Pace to this many packets per second (default: as fast as possible).
    #[arg(long)]
    pps: Option<u64>,
}

#[derive(Debug, Args)]
struct JobArgs {
    /// Number of ranks (one host namespace each).
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Bytes per collective, e.g. 16MiB.
    #[arg(long, default_value = "16MiB")]
    size: ByteSize,
    /// Training steps.
    #[arg(long, default_value_t = 10)]
    steps: u32,
    /// Compute time per step in milliseconds.
    #[arg(long, default_value_t = 50)]
    compute_ms: u64,
    /// Collective algorithm passed to the ranks: ring, tree or rhd.
    #[arg(long)]
    algorithm: Option<String>,
    /// Gradient compression passed to the ranks.
    #[arg(long)]
    compression: Option<String>,
    /// Make one rank slow: RANK:EXTRA_MS adds EXTRA_MS of compute per step on RANK.
    #[arg(long, value_parser = parse_straggler)]
    straggler: Option<(usize, u64)>,
    /// Ask the ranks to verify collective results.
    #[arg(long)]
    verify: bool,
    /// Path of ringside-rank (default: next to this executable).
    #[arg(long)]
    rank_bin: Option<PathBuf>,
    /// TCP port each rank listens on.
    #[arg(long, default_value_t = 29500)]
    port: u16,
    /// Kill the job after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Directory for rank-R.json and rank-R.log (default: a new directory under /tmp).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    #[command(flatten)]
    rig: JobRigArgs,
    /// Extra arguments for every ringside-rank, after `--`, e.g. `-- --channels 2 --chunk-bytes 4MiB`.
    #[arg(last = true, value_name = "RANK_ARGS")]
    rank_args: Vec<String>,
}

/// Where a job runs and what goes wrong there; shared by `job`, `mpi` and `torch`.
#[derive(Debug, Args)]
struct JobRigArgs {
    /// Rig to run on: `star` (one bridge) or `leaf-spine` (ranks split over two leaves, so
    /// traffic between the halves crosses the uplinks).
    #[arg(long, value_enum, default_value_t = Topology::Star)]
    topology: Topology,
    /// Leaf-spine only: hosts per leaf (default: enough for the ranks, plus one for cross traffic).
    #[arg(long)]
    hosts_per_leaf: Option<usize>,
    #[command(flatten)]
    faults: FaultArgs,
    /// Turn TSO/GSO/GRO off on every link.
    #[arg(long)]
    no_offloads: bool,
    /// With --no-offloads: turn TSO/GSO back on at both ends of this link (repeatable), e.g.
    /// the cross traffic's path on a leaf-spine with 3 hosts per leaf: `--offloads-on h2
    /// --offloads-on up0 --offloads-on up1 --offloads-on h5`. The bulk traffic then crosses as
    /// 64 KiB super-packets and loads the uplink, not the machine's CPUs, while the job's hosts
    /// still send MTU-sized segments.
    #[arg(long, value_name = "LINK", requires = "no_offloads")]
    offloads_on: Vec<String>,
}

#[derive(Debug, Args)]
struct MpiArgs {
    /// Number of ranks (one host namespace each).
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// OpenMPI's allreduce algorithm (coll_tuned_allreduce_algorithm); `default` leaves the
    /// choice to OpenMPI's decision rules.
    #[arg(long, value_enum, default_value_t = MpiAlgorithm::Default)]
    algorithm: MpiAlgorithm,
    /// Bytes per allreduce, e.g. 64KiB .. 16MiB.
    #[arg(long, default_value = "4MiB")]
    size: ByteSize,
    /// Steps (0: until --duration-s).
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// Stop after the first step that ends this many seconds after the start.
    #[arg(long)]
    duration_s: Option<u64>,
    /// Compute time per step (a sleep) in milliseconds.
    #[arg(long, default_value_t = 50)]
    compute_ms: u64,
    /// Make one rank slow: RANK:EXTRA_MS adds EXTRA_MS of compute per step on RANK.
    #[arg(long, value_parser = parse_straggler)]
    straggler: Option<(usize, u64)>,
    /// First TCP port of OpenMPI's BTL (it uses this and the next 63).
    #[arg(long, default_value_t = 30000)]
    port_min: u16,
    /// Extra OpenMPI parameter KEY=VALUE, passed as `--mca KEY VALUE` (repeatable).
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_mca)]
    mca: Vec<(String, String)>,
    /// Kill mpirun after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Directory for rank-R.json and mpirun.log (default: a new directory under /tmp).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    #[command(flatten)]
    rig: JobRigArgs,
}

#[derive(Debug, Args)]
struct TorchArgs {
    /// Number of ranks (one host namespace each).
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Steps [default: 50, or no limit with --duration-s; with both, whichever ends first].
    #[arg(long)]
    steps: Option<u64>,
    /// Stop after the first step that ends this many seconds after training began (rank 0
    /// decides and tells the others, so every rank stops after the same step).
    #[arg(long)]
    duration_s: Option<u64>,
    /// MLP width (input and hidden layers).
    #[arg(long, default_value_t = 1024)]
    hidden: u64,
    /// Hidden layers (gradient bytes per step ~ 4 * layers * hidden^2).
    #[arg(long, default_value_t = 2)]
    layers: u64,
    /// Samples per rank per step (compute per step grows with it).
    #[arg(long, default_value_t = 128)]
    batch: u64,
    /// DDP gradient bucket size in MiB (PyTorch's default is 25).
    #[arg(long, default_value_t = 4.0)]
    bucket_cap_mb: f64,
    /// DDP communication hook: PyTorch's plain allreduce, or its fp16 / bf16 compression hook.
    #[arg(long, value_enum, default_value_t = TorchCompression::None)]
    compression: TorchCompression,
    /// Make one rank slow: RANK:EXTRA_MS sleeps EXTRA_MS more per step on RANK.
    #[arg(long, value_parser = parse_straggler)]
    straggler: Option<(usize, u64)>,
    /// Let ringside steer the job: the ranks call ringside.torch.follow_hints(model, URL) with
    /// the tenant token of --token (URL: the agent as seen from the rank hosts, e.g.
    /// http://10.77.0.253:9464).
    #[arg(long, value_name = "URL", requires = "token", conflicts_with = "compression")]
    follow_hints: Option<String>,
    /// The constraints follow_hints keeps, as JSON (ringside.Constraints; e.g. the job's
    /// registered constraints, so that `"transport_tuning": true` lets the ranks apply transport
    /// advice). Default: the Python package's defaults.
    #[arg(long, value_name = "JSON", requires = "follow_hints")]
    follow_constraints: Option<String>,
    /// Tenant token for --follow-hints (from `POST /v1/jobs`); passed to the ranks in their
    /// environment, not on their command line.
    #[arg(long, env = "RINGSIDE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Rank 0's rendezvous port, and the first of the job's 256 TCP ports.
    #[arg(long, default_value_t = 29500)]
    port: u16,
    /// The Python with torch (default: $RINGSIDE_PYTHON, else target/venv/bin/python next to
    /// this binary, installed by `cargo xtask setup`).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Bound, in seconds, on the rendezvous and on each collective inside the ranks.
    #[arg(long, default_value_t = 60)]
    collective_timeout: u64,
    /// Kill the job after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Directory for the script, rank-R.json and rank-R.log (default: a new directory under /tmp).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    #[command(flatten)]
    rig: JobRigArgs,
}

fn parse_mca(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("{s:?}: want KEY=VALUE, e.g. btl_tcp_eager_limit=65536"))?;
    if k.is_empty() || k.contains(char::is_whitespace) {
        return Err(format!("{s:?}: the key must be a non-empty OpenMPI parameter name"));
    }
    Ok((k.to_string(), v.to_string()))
}

fn parse_u32(s: &str) -> Result<u32, String> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?}: {e}"))
}

fn parse_u8(s: &str) -> Result<u8, String> {
    let v = parse_u32(s)?;
    u8::try_from(v).map_err(|_| format!("{s:?} does not fit a byte"))
}

fn parse_roce_dest(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, testbed::ROCEV2_UDP_PORT))
        .map_err(|_| format!("{s:?}: expected ADDR or ADDR:PORT, e.g. 10.77.0.2 or [fd77::2]:4791"))
}

fn parse_straggler(s: &str) -> Result<(usize, u64), String> {
    let (r, ms) = s.split_once(':').ok_or_else(|| format!("{s:?}: expected RANK:EXTRA_MS, e.g. 2:30"))?;
    Ok((r.parse().map_err(|e| format!("rank {r:?}: {e}"))?, ms.parse().map_err(|e| format!("extra ms {ms:?}: {e}"))?))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Topology {
    Star,
    LeafSpine,
}

/// `LINK:VALUE` or a bare `VALUE` (link None).
fn split_link(s: &str) -> (Option<String>, &str) {
    match s.rsplit_once(':') {
        Some((l, v)) => (Some(l.to_string()), v),
        None => (None, s),
    }
}

fn parse_link_f64(s: &str) -> Result<(Option<String>, f64), String> {
    let (l, v) = split_link(s);
    Ok((l, v.parse().map_err(|e| format!("{s:?}: expected LINK:PERCENT, e.g. h1:2.5 ({e})"))?))
}

fn parse_link_u64(s: &str) -> Result<(Option<String>, u64), String> {
    let (l, v) = split_link(s);
    Ok((l, v.parse().map_err(|e| format!("{s:?}: expected LINK:MBIT, e.g. up0:200 ({e})"))?))
}

fn parse_flap(s: &str) -> Result<(String, u64, Option<u64>), String> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = |e: String| format!("{s:?}: expected LINK:DOWN_MS[:PERIOD_MS], e.g. up0:500 or h1:200:2000 ({e})");
    match parts.as_slice() {
        [l, d] => Ok((l.to_string(), d.parse().map_err(|e| bad(format!("{e}")))?, None)),
        [l, d, p] => Ok((l.to_string(), d.parse().map_err(|e| bad(format!("{e}")))?, Some(p.parse().map_err(|e| bad(format!("{e}")))?))),
        _ => Err(bad("wrong number of fields".into())),
    }
}

/// `--cross-traffic` value: `Auto` (bare flag) or explicit hosts and rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CrossArg {
    Auto,
    Hosts(usize, usize, Option<u64>),
}

fn parse_cross(s: &str) -> Result<CrossArg, String> {
    parse_cross_inner(s).map(|c| match c {
        None => CrossArg::Auto,
        Some((a, b, r)) => CrossArg::Hosts(a, b, r),
    })
}

fn parse_cross_inner(s: &str) -> Result<Option<(usize, usize, Option<u64>)>, String> {
    if s == "auto" {
        return Ok(None);
    }
    let parts: Vec<&str> = s.split(':').collect();
    let bad = |e: String| format!("{s:?}: expected FROM:TO[:MBIT] host indices, e.g. 1:3 or 1:3:500 ({e})");
    let num = |x: &str| x.parse::<u64>().map_err(|e| bad(e.to_string()));
    match parts.as_slice() {
        [a, b] => Ok(Some((num(a)? as usize, num(b)? as usize, None))),
        [a, b, r] => {
            let r = num(r)?;
            Ok(Some((num(a)? as usize, num(b)? as usize, (r > 0).then_some(r))))
        }
        _ => Err(bad("wrong number of fields".into())),
    }
}

fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Moves the whole (still single-threaded) process into a network namespace.
fn enter_netns(name: &str) -> anyhow::Result<()> {
    let path = if name.contains('/') { PathBuf::from(name) } else { PathBuf::from(testbed::netns::NETNS_RUN_DIR).join(name) };
    let f = std::fs::File::open(&path).with_context(|| format!("opening {} (see `ip netns list`)", path.display()))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).with_context(|| format!("entering {}", path.display()))?;
    Ok(())
}

fn star_config(hosts: usize, no_rps: bool, no_backlog: bool, no_offloads: bool, mtu: u32) -> StarConfig {
    StarConfig { hosts, rps: !no_rps, raise_backlog: !no_backlog, offloads: !no_offloads, mtu, ..Default::default() }
}

#[derive(Serialize)]
struct HostView<'a> {
    index: usize,
    netns: &'a str,
    iface: &'a str,
    addr: String,
    addr6: String,
    mac: &'a str,
    switch_port: &'a str,
}

/// Waits until Ctrl-C or `max_seconds`, injecting the faults after `faults.faults_after` seconds.
fn hold(rig: &dyn Rig, faults: &FaultArgs, auto_cross: Option<(usize, usize)>, max_seconds: u64) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut active = None;
    if faults.any() {
        if faults.faults_after > 0 {
            eprintln!("injecting faults in {} s", faults.faults_after);
        }
        if interruptible_sleep(faults.faults_after.min(max_seconds)) {
            active = Some(inject_faults(rig, faults, None, auto_cross)?);
            for f in rig.faults() {
                eprintln!("fault started: {}", serde_json::to_string(&f)?);
            }
        }
    }
    let max = Duration::from_secs(max_seconds);
    while !testbed::signals::stop_requested() && start.elapsed() < max {
        std::thread::sleep(Duration::from_millis(200));
    }
    if let Some(c) = active.as_mut().and_then(|a| a.cross.take()) {
        eprintln!("cross traffic: {}", serde_json::to_string(&c.stop())?);
    }
    drop(active);
    eprintln!("tearing down {}; faults: {}", rig.rig_prefix(), serde_json::to_string(&rig.faults())?);
    Ok(())
}

#[derive(Serialize)]
struct LinkView {
    name: String,
    near: String,
    far: String,
}

fn link_views(rig: &dyn Rig) -> Vec<LinkView> {
    rig.links()
        .into_iter()
        .map(|l| LinkView { name: l.name, near: format!("{} {}", l.near.ns.name(), l.near.iface), far: format!("{} {}", l.far.ns.name(), l.far.iface) })
        .collect()
}

fn cmd_star(a: StarArgs) -> anyhow::Result<()> {
    // Install the handlers before building the rig, so Ctrl-C during setup also tears down.
    testbed::signals::stop_flag();
    let star = Star::new(star_config(a.hosts, a.run.no_rps, a.run.no_backlog, a.run.no_offloads, a.run.mtu))?;
    let hosts: Vec<HostView> = star
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| HostView {
            index: i,
            netns: h.ns.name(),
            iface: h.iface,
            addr: h.addr.to_string(),
            addr6: h.addr6.to_string(),
            mac: &h.mac,
            switch_port: &h.switch_port,
        })
        .collect();
    if a.run.json {
        print_json(&serde_json::json!({ "switch": star.switch.name(), "bridge": testbed::star::BRIDGE, "hosts": hosts, "links": link_views(&star) }))?;
    } else {
        println!("star {} is up: {} hosts on bridge {} in namespace {}", star.prefix(), hosts.len(), testbed::star::BRIDGE, star.switch.name());
        println!();
        println!("  {:<22} {:<6} {:<12} {:<12} switch port", "namespace", "iface", "ipv4", "ipv6");
        for h in &hosts {
            println!("  {:<22} {:<6} {:<12} {:<12} {}", h.netns, h.iface, h.addr, h.addr6, h.switch_port);
        }
        let h0 = &hosts[0];
        let peer = hosts.get(1).map(|h| h.addr.clone()).unwrap_or_else(|| h0.addr.clone());
        let peer_ns = hosts.get(1).map(|h| h.netns).unwrap_or(h0.netns);
        println!();
        println!("enter a host (keeps /sys/fs/bpf visible):  nsenter --net=/run/netns/{} bash", h0.netns);
        println!("run one command there:                     ip -n {} addr", h0.netns);
        println!("traffic:  ringside-testbed --netns {peer_ns} tcp-sink &");
        println!("          ringside-testbed --netns {} tcp-send --to {peer}:5201 --bytes 1GiB", h0.netns);
        println!("          ringside-testbed --netns {} roce-send --to {peer} --packets 10000 --ce-marks 100", h0.netns);
        println!("counters of host 0's bridge port:          ip -n {} -s link show dev {}", star.switch.name(), h0.switch_port);
        println!();
        println!("Ctrl-C tears the rig down.");
    }
    let n = star.hosts.len();
    let auto = (n >= 2).then(|| (n - 2, n - 1));
    hold(&star, &a.faults, auto, a.run.max_seconds)
}

fn cmd_leaf_spine(a: LeafSpineArgs) -> anyhow::Result<()> {
    testbed::signals::stop_flag();
    let ls = LeafSpine::new(LeafSpineConfig {
        leaves: a.leaves,
        hosts_per_leaf: a.hosts_per_leaf,
        rps: !a.run.no_rps,
        raise_backlog: !a.run.no_backlog,
        offloads: !a.run.no_offloads,
        mtu: a.run.mtu,
        ..Default::default()
    })?;
    let hosts: Vec<serde_json::Value> = ls
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| serde_json::json!({"index": i, "netns": h.ns.name(), "iface": h.iface, "addr": h.addr.to_string(), "addr6": h.addr6.to_string(), "leaf": h.leaf, "leaf_port": h.leaf_port, "mac": h.mac}))
        .collect();
    let leaves: Vec<serde_json::Value> = ls
        .leaves
        .iter()
        .map(|l| serde_json::json!({"netns": l.ns.name(), "hosts": l.hosts, "uplink_iface": l.uplink_iface, "spine_iface": l.spine_iface, "gateway": l.gateway.to_string()}))
        .collect();
    if a.run.json {
        print_json(&serde_json::json!({ "spine": ls.spine.name(), "leaves": leaves, "hosts": hosts, "links": link_views(&ls) }))?;
    } else {
        println!("leaf-spine {} is up: {} leaves x {} hosts, spine (router) in namespace {}", ls.prefix(), ls.leaves.len(), a.hosts_per_leaf, ls.spine.name());
        println!();
        println!("  {:<22} {:<5} {:<12} {:<16} leaf port", "namespace", "leaf", "ipv4", "ipv6");
        for h in &ls.hosts {
            println!("  {:<22} {:<5} {:<12} {:<16} {}", h.ns.name(), h.leaf, h.addr, h.addr6, h.leaf_port);
        }
        println!();
        println!("  links (use these names with --loss/--rate-cap/--flap):");
        for l in link_views(&ls) {
            println!("    {:<5} {}  <->  {}", l.name, l.near, l.far);
        }
        let (a0, b0) = (&ls.hosts[0], &ls.hosts[ls.leaves[1].hosts[0]]);
        println!();
        println!("cross-leaf traffic:  ringside-testbed --netns {} tcp-sink &", b0.ns.name());
        println!("                     ringside-testbed --netns {} tcp-send --to {}:5201 --bytes 1GiB", a0.ns.name(), b0.addr);
        println!("uplink counters:     ip -n {} -s link show dev {}", ls.spine.name(), ls.leaves[0].spine_iface);
        println!();
        println!("Ctrl-C tears the rig down.");
    }
    let auto = Some((ls.leaves[0].hosts[ls.leaves[0].hosts.len() - 1], ls.leaves[1].hosts[ls.leaves[1].hosts.len() - 1]));
    hold(&ls, &a.faults, auto, a.run.max_seconds)
}

fn cmd_job(a: JobArgs) -> anyhow::Result<()> {
    let cfg = JobConfig {
        ranks: a.ranks,
        size: a.size,
        steps: a.steps,
        compute_ms: a.compute_ms,
        algorithm: a.algorithm,
        compression: a.compression,
        straggler: a.straggler,
        verify: a.verify,
        rank_bin: a.rank_bin,
        port: a.port,
        timeout: Duration::from_secs(a.timeout),
        out_dir: a.out_dir,
        extra_args: a.rank_args,
        hosts: None,
        managed: None,
    };
    // Find the binary before building a rig for it.
    let bin = testbed::job::find_rank_binary(cfg.rank_bin.as_deref())?;
    let jr = JobRig::build(&a.rig, cfg.ranks)?;
    let cfg = JobConfig { rank_bin: Some(bin), hosts: Some(jr.hosts.clone()), ..cfg };
    eprintln!("job on {:?} {}: {} ranks on hosts {:?}, {} per collective, {} steps", a.rig.topology, jr.rig.rig_prefix(), cfg.ranks, jr.hosts, cfg.size, cfg.steps);
    let job = testbed::spawn_job(jr.rig.as_ref(), &cfg)?;
    jr.run(job, &a.rig.faults, serde_json::json!({}))
}

/// Where a job's ranks run: the rig, the host of each rank, and the (from, to) hosts of a bare
/// --cross-traffic. Shared by `job` and `mpi`.
struct JobRig {
    rig: Box<dyn Rig>,
    hosts: Vec<usize>,
    auto_cross: Option<(usize, usize)>,
}

impl JobRig {
    /// A star of `ranks` hosts (two more for a bare --cross-traffic), or two leaves with the ranks
    /// split between them (one more host per leaf for a bare --cross-traffic).
    fn build(a: &JobRigArgs, ranks: usize) -> anyhow::Result<JobRig> {
        let jr = Self::build_rig(a, ranks)?;
        for link in &a.offloads_on {
            jr.rig.link_segmentation_offloads(link, true).with_context(|| format!("--offloads-on {link}"))?;
        }
        Ok(jr)
    }

    fn build_rig(a: &JobRigArgs, ranks: usize) -> anyhow::Result<JobRig> {
        let (topology, hosts_per_leaf, faults, no_offloads) = (a.topology, a.hosts_per_leaf, &a.faults, a.no_offloads);
        // Ctrl-C from here on tears the rig down (the handlers only set a flag).
        testbed::signals::stop_flag();
        let auto_cross = faults.cross_traffic == Some(CrossArg::Auto);
        Ok(match topology {
            Topology::Star => {
                let extra = if auto_cross { 2 } else { 0 };
                let star = Star::new(star_config(ranks + extra, false, false, no_offloads, 1500))?;
                JobRig { rig: Box::new(star), hosts: (0..ranks).collect(), auto_cross: auto_cross.then_some((ranks, ranks + 1)) }
            }
            Topology::LeafSpine => {
                let (r0, r1) = (ranks.div_ceil(2), ranks / 2);
                let k = hosts_per_leaf.unwrap_or(r0 + usize::from(auto_cross));
                if k < r0 {
                    bail!("--hosts-per-leaf {k} is too small for {ranks} ranks on two leaves");
                }
                let ls = LeafSpine::new(LeafSpineConfig { hosts_per_leaf: k, offloads: !no_offloads, ..Default::default() })?;
                let hosts: Vec<usize> = (0..r0).chain(k..k + r1).collect();
                JobRig { rig: Box::new(ls), hosts, auto_cross: (k > r0).then_some((k - 1, 2 * k - 1)) }
            }
        })
    }

    /// Injects the faults after --faults-after, waits for the job, prints the JSON report (the
    /// job, the fault log, cross traffic, plus `extra`'s fields) and a one-line summary.
    fn run(&self, job: testbed::RunningJob, faults: &FaultArgs, extra: serde_json::Value) -> anyhow::Result<()> {
        let stop = testbed::signals::stop_flag();
        let mut active = None;
        if faults.any() && interruptible_sleep(faults.faults_after) {
            active = Some(inject_faults(self.rig.as_ref(), faults, Some(&self.hosts), self.auto_cross)?);
        }
        let result = job.wait(Some(stop));
        let cross = active.as_mut().and_then(|f| f.cross.take()).map(|c| c.stop());
        drop(active);
        let report = result?;
        let mut out = serde_json::json!({ "job": report, "faults": self.rig.faults(), "cross_traffic": cross });
        if let (Some(o), serde_json::Value::Object(e)) = (out.as_object_mut(), extra) {
            o.extend(e);
        }
        print_json(&out)?;
        eprintln!(
            "step ms: mean {:.1} p50 {:.1} p99 {:.1} | comm ms: mean {:.1} p50 {:.1} p99 {:.1} | logs in {}",
            report.step_ms.mean,
            report.step_ms.p50,
            report.step_ms.p99,
            report.comm_ms.mean,
            report.comm_ms.p50,
            report.comm_ms.p99,
            report.out_dir.display()
        );
        Ok(())
    }
}

fn cmd_mpi(a: MpiArgs) -> anyhow::Result<()> {
    if a.steps == 0 && a.duration_s.is_none() {
        bail!("--steps 0 needs --duration-s: the job would never stop");
    }
    let jr = JobRig::build(&a.rig, a.ranks)?;
    let cfg = MpiConfig {
        ranks: a.ranks,
        hosts: Some(jr.hosts.clone()),
        algorithm: a.algorithm,
        size: a.size,
        compute_ms: a.compute_ms,
        steps: a.steps,
        duration: a.duration_s.map(Duration::from_secs),
        straggler: a.straggler,
        port_min: a.port_min,
        timeout: Duration::from_secs(a.timeout),
        out_dir: a.out_dir,
        mca: a.mca,
    };
    eprintln!(
        "OpenMPI allreduce ({}) on {:?} {}: {} ranks on hosts {:?}, {} per step, TCP ports {} (mpirun log and rank-R.json under the out dir)",
        cfg.algorithm.name(),
        a.rig.topology,
        jr.rig.rig_prefix(),
        cfg.ranks,
        jr.hosts,
        cfg.size,
        cfg.port_range()
    );
    let job = testbed::spawn_mpi(jr.rig.as_ref(), &cfg)?;
    jr.run(job, &a.rig.faults, serde_json::json!({ "algorithm": cfg.algorithm.name(), "tcp_ports": cfg.port_range() }))
}

fn cmd_torch(a: TorchArgs) -> anyhow::Result<()> {
    let cfg = TorchConfig {
        ranks: a.ranks,
        hosts: None,
        steps: a.steps.unwrap_or(if a.duration_s.is_some() { 0 } else { 50 }),
        duration: a.duration_s.map(Duration::from_secs),
        hidden: a.hidden,
        layers: a.layers,
        batch: a.batch,
        bucket_cap_mb: a.bucket_cap_mb,
        straggler: a.straggler,
        compression: a.compression,
        follow_hints: a.follow_hints.zip(a.token),
        follow_constraints: a.follow_constraints,
        port: a.port,
        python: a.python,
        collective_timeout: Duration::from_secs(a.collective_timeout),
        timeout: Duration::from_secs(a.timeout),
        out_dir: a.out_dir,
        env: Vec::new(),
    };
    // Refuse bad input and a missing Python before building a rig for them.
    cfg.validate()?;
    let python = testbed::torch::find_python(cfg.python.as_deref())?;
    let jr = JobRig::build(&a.rig, cfg.ranks)?;
    let cfg = TorchConfig { python: Some(python), hosts: Some(jr.hosts.clone()), ..cfg };
    let mode = match &cfg.follow_hints {
        Some((url, _)) => format!("following hints from {url}"),
        None => format!("compression {}", cfg.compression.name()),
    };
    eprintln!(
        "PyTorch DDP (gloo) on {:?} {}: {} ranks on hosts {:?}, {:.1} MiB of gradients per step, {mode}, TCP ports {} (rank-R.log and rank-R.json under the out dir)",
        a.rig.topology,
        jr.rig.rig_prefix(),
        cfg.ranks,
        jr.hosts,
        cfg.grad_bytes() as f64 / f64::from(1 << 20),
        cfg.port_range()
    );
    let job = testbed::spawn_torch(jr.rig.as_ref(), &cfg)?;
    // Importing torch and setting up DDP takes each rank seconds of CPU: time --faults-after
    // from the first training step, so the faults hit training.
    let t = testbed::torch::wait_training_started(&job, cfg.timeout, Some(testbed::signals::stop_flag()))?;
    eprintln!("every rank is training (since {t} ms after the Unix epoch)");
    jr.run(
        job,
        &a.rig.faults,
        serde_json::json!({
            "tcp_ports": cfg.port_range(),
            "grad_bytes_per_step": cfg.grad_bytes(),
            "compression": if cfg.follow_hints.is_some() { "hints" } else { cfg.compression.name() },
        }),
    )
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    if let Some(ns) = &cli.netns {
        enter_netns(ns)?;
    }
    match cli.command {
        Command::Star(a) => cmd_star(a)?,
        Command::LeafSpine(a) => cmd_leaf_spine(a)?,
        Command::Clean { all } => {
            let r = testbed::clean(all)?;
            for n in &r.removed {
                eprintln!("removed {n}");
            }
            for n in &r.kept {
                eprintln!("kept {n} (its creator is still running; --all removes it too)");
            }
            if let Some(v) = r.backlog_restored {
                eprintln!("restored net.core.netdev_max_backlog = {v}");
            }
            for d in &r.job_dirs_removed {
                eprintln!("removed {} (job output of a process that is gone)", d.display());
            }
            for d in &r.pin_dirs_removed {
                eprintln!("removed {} (pins of an agent that is gone)", d.display());
            }
            for d in &r.scratch_removed {
                eprintln!("removed {} (files of an agent that is gone)", d.display());
            }
            print_json(&r)?;
            if !r.failed.is_empty() {
                bail!("{} namespaces could not be removed", r.failed.len());
            }
        }
        Command::TcpSink { listen, connections, timeout } => {
            let sink = testbed::TcpSink::bind(listen)?;
            eprintln!("listening on {}", sink.local_addr()?);
            print_json(&sink.receive(connections, Duration::from_secs(timeout))?)?;
        }
        Command::TcpSend { to, bytes, streams, timeout } => {
            print_json(&testbed::tcp_send_with_timeout(to, bytes.0, streams, Duration::from_secs(timeout))?)?;
        }
        Command::RoceSend(a) => {
            let spec = RoceSpec {
                to: a.to,
                src_port: a.src_port,
                dest_qp: a.dest_qp,
                start_psn: a.start_psn,
                packets: a.packets,
                payload_len: a.payload_len,
                skip_psns: a.skip_psn,
                ce_marks: a.ce_marks,
                cnps: a.cnps,
                naks: a.naks,
                data_opcode: a.opcode,
                ect: !a.no_ect,
                dscp: a.dscp,
                icrc: !a.no_icrc,
                pps: a.pps,
                ..Default::default()
            };
            print_json(&testbed::roce_send(&spec)?)?;
        }
        Command::RoceSink { listen, expect, idle_ms, timeout } => {
            let sink = testbed::RoceSink::bind(listen)?;
            eprintln!("listening on {}", sink.local_addr()?);
            print_json(&sink.receive(expect, Duration::from_millis(idle_ms), Duration::from_secs(timeout))?)?;
        }
        Command::Job(a) => cmd_job(a)?,
        Command::Mpi(a) => cmd_mpi(a)?,
        Command::Torch(a) => cmd_torch(a)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parsers() {
        assert_eq!(parse_u32("0x11").unwrap(), 17);
        assert_eq!(parse_straggler("2:30").unwrap(), (2, 30));
        assert!(parse_straggler("2").is_err());
        assert_eq!(parse_roce_dest("10.77.0.2").unwrap().port(), 4791);
        assert_eq!(parse_roce_dest("[fd77::2]:5000").unwrap().port(), 5000);
        assert_eq!(parse_link_f64("h1:2.5").unwrap(), (Some("h1".into()), 2.5));
        assert_eq!(parse_link_f64("1.5").unwrap(), (None, 1.5));
        assert_eq!(parse_link_u64("up0:200").unwrap(), (Some("up0".into()), 200));
        assert_eq!(parse_flap("up1:500").unwrap(), ("up1".into(), 500, None));
        assert_eq!(parse_flap("h2:200:2000").unwrap(), ("h2".into(), 200, Some(2000)));
        assert!(parse_flap("h2").is_err());
        assert_eq!(parse_cross("auto").unwrap(), CrossArg::Auto);
        assert_eq!(parse_cross("1:3").unwrap(), CrossArg::Hosts(1, 3, None));
        assert_eq!(parse_cross("1:3:0").unwrap(), CrossArg::Hosts(1, 3, None));
        assert_eq!(parse_cross("1:3:500").unwrap(), CrossArg::Hosts(1, 3, Some(500)));
    }

    #[test]
    fn fault_flags_parse() {
        let cli = Cli::try_parse_from(["ringside-testbed", "job", "--topology", "leaf-spine", "--loss", "1:2", "--rate-cap", "up0:100", "--flap", "up1:300:3000", "--cross-traffic"]).unwrap();
        let Command::Job(j) = cli.command else { panic!() };
        assert_eq!(j.rig.topology, Topology::LeafSpine);
        assert_eq!(j.rig.faults.cross_traffic, Some(CrossArg::Auto));
        assert_eq!(j.rig.faults.flap, vec![("up1".to_string(), 300, Some(3000))]);
        let cli = Cli::try_parse_from(["ringside-testbed", "star", "--cross-traffic", "0:1:50"]).unwrap();
        let Command::Star(s) = cli.command else { panic!() };
        assert_eq!(s.faults.cross_traffic, Some(CrossArg::Hosts(0, 1, Some(50))));
    }

    #[test]
    fn torch_flags_parse() {
        let cli = Cli::try_parse_from(["ringside-testbed", "torch", "--ranks", "6", "--duration-s", "30", "--compression", "bf16", "--straggler", "2:80", "--loss", "1:2", "--faults-after", "10"]).unwrap();
        let Command::Torch(t) = cli.command else { panic!() };
        assert_eq!((t.ranks, t.duration_s, t.compression, t.straggler), (6, Some(30), TorchCompression::Bf16, Some((2, 80))));
        assert_eq!((t.rig.faults.loss.clone(), t.rig.faults.faults_after), (vec![(Some("1".to_string()), 2.0)], 10));
        // A hint URL needs a token, and excludes a static compression.
        assert!(Cli::try_parse_from(["ringside-testbed", "torch", "--follow-hints", "http://10.77.0.253:9464"]).is_err());
        assert!(Cli::try_parse_from(["ringside-testbed", "torch", "--follow-hints", "http://x:1", "--token", "t", "--compression", "fp16"]).is_err());
        let cli = Cli::try_parse_from(["ringside-testbed", "torch", "--follow-hints", "http://10.77.0.253:9464", "--token", "t"]).unwrap();
        let Command::Torch(t) = cli.command else { panic!() };
        assert_eq!((t.follow_hints.as_deref(), t.token.as_deref()), (Some("http://10.77.0.253:9464"), Some("t")));
    }
}
