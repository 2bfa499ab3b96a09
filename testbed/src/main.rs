//! `ringside-testbed`: network-namespace rigs, traffic with exact ground truth, and the emulated
//! training job, for trying ringside on one machine.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use testbed::job::JobConfig;
use testbed::{ByteSize, RoceSpec, Star, StarConfig};

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

    /// Delete namespaces left behind by testbed runs that died (rs-<pid>-... whose pid is gone),
    /// and restore net.core.netdev_max_backlog if a dead run left it raised.
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

    /// Run an emulated training job: build a star of --ranks hosts, start one `ringside-rank` per
    /// host namespace, wait, and summarize step and communication times (JSON on stdout).
    Job(JobArgs),
}

#[derive(Debug, Args)]
struct StarArgs {
    /// Number of host namespaces (1..=250).
    #[arg(long, default_value_t = 4)]
    hosts: usize,
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
    /// Add random loss (percent, both directions) on host 0's link, e.g. 1.5.
    #[arg(long, value_name = "PERCENT")]
    loss: Option<f64>,
    /// Cap host 0's link at this many Mbit/s in both directions.
    #[arg(long, value_name = "MBIT")]
    rate_cap: Option<u64>,
    /// Tear down after this many seconds even without Ctrl-C.
    #[arg(long, default_value_t = 12 * 3600)]
    max_seconds: u64,
    /// Print the rig description as JSON instead of text.
    #[arg(long)]
    json: bool,
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
    /// Add random loss (percent) on this rank's link while the job runs: RANK:PERCENT.
    #[arg(long, value_parser = parse_loss)]
    loss: Option<(usize, f64)>,
    /// Turn TSO/GSO/GRO off on every link.
    #[arg(long)]
    no_offloads: bool,
    /// Extra arguments for every ringside-rank, after `--`, e.g. `-- --channels 2 --chunk-bytes 4MiB`.
    #[arg(last = true, value_name = "RANK_ARGS")]
    rank_args: Vec<String>,
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

fn parse_loss(s: &str) -> Result<(usize, f64), String> {
    let (r, p) = s.split_once(':').ok_or_else(|| format!("{s:?}: expected RANK:PERCENT, e.g. 1:2.5"))?;
    Ok((r.parse().map_err(|e| format!("rank {r:?}: {e}"))?, p.parse().map_err(|e| format!("percent {p:?}: {e}"))?))
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

fn cmd_star(a: StarArgs) -> anyhow::Result<()> {
    // Install the handlers before building the rig, so Ctrl-C during setup also tears down.
    testbed::signals::stop_flag();
    let star = Star::new(star_config(a.hosts, a.no_rps, a.no_backlog, a.no_offloads, a.mtu))?;
    let _loss = a.loss.map(|p| star.add_loss(0, p)).transpose()?;
    let _cap = a.rate_cap.map(|r| star.rate_cap(0, r)).transpose()?;
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
    if a.json {
        print_json(&serde_json::json!({ "switch": star.switch.name(), "bridge": testbed::star::BRIDGE, "hosts": hosts, "faults": star.fault_log() }))?;
    } else {
        println!("star {} is up: {} hosts on bridge {} in namespace {}", star.prefix(), hosts.len(), testbed::star::BRIDGE, star.switch.name());
        println!();
        println!("  {:<22} {:<6} {:<12} {:<12} switch port", "namespace", "iface", "ipv4", "ipv6");
        for h in &hosts {
            println!("  {:<22} {:<6} {:<12} {:<12} {}", h.netns, h.iface, h.addr, h.addr6, h.switch_port);
        }
        for f in star.fault_log() {
            println!("  fault on host {}: {:?}", f.host, f.kind);
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
    let start = Instant::now();
    let max = Duration::from_secs(a.max_seconds);
    while !testbed::signals::stop_requested() && start.elapsed() < max {
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("tearing down {}", star.prefix());
    Ok(())
}

fn cmd_job(a: JobArgs) -> anyhow::Result<()> {
    let stop = testbed::signals::stop_flag();
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
    };
    // Find the binary before building a rig for it.
    let bin = testbed::job::find_rank_binary(cfg.rank_bin.as_deref())?;
    let cfg = JobConfig { rank_bin: Some(bin), ..cfg };
    let star = Star::new(star_config(cfg.ranks, false, false, a.no_offloads, 1500))?;
    let _loss = match a.loss {
        Some((rank, p)) => Some(star.add_loss(rank, p)?),
        None => None,
    };
    eprintln!("job on star {}: {} ranks, {} per collective, {} steps", star.prefix(), cfg.ranks, cfg.size, cfg.steps);
    let report = testbed::run_job(&star, &cfg, Some(stop))?;
    print_json(&serde_json::json!({ "job": report, "faults": star.fault_log() }))?;
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
    }
}
