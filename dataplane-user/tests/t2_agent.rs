//! T2: the `ringside` binary on a 4-host testbed star, checked against what the senders counted.
//!
//! Needs root and an agent built with its eBPF object (`cargo xtask build`, or
//! `RINGSIDE_EBPF_OBJECT=... cargo test -p dataplane-user --test t2_agent`). Without either it
//! FAILS with the reason; it never skips. Every wait is bounded.
mod support;

use support::{
    agent::{pin_to_cpu0, scrape_metrics, write_token_file, AgentFiles, AgentProcess},
    wait_for,
};
use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use ringside_client::{operator::FlowView, ClientError, FlowsResponse, JobClient, JobRegistration, OperatorClient, StatusResponse};
use testbed::{RoceSink, RoceSpec, Star, StarConfig, TcpSink};

const AGENT_PORT: u16 = 9464;

fn preconditions() {
    if let Err(e) = testbed::require_root() {
        panic!("t2_agent attaches eBPF programs in network namespaces and needs root: {e}");
    }
    if let Err(e) = dataplane_user::object::flowmon_object() {
        panic!("t2_agent runs the real agent: {e}");
    }
}

/// The operator token of the test agent (written to its `[api] operator_tokens_file`).
const OPERATOR_TOKEN: &str = "rso_t2-agent-operator-token";

/// One request of the operator client (`token`), made from inside host `host`'s namespace.
fn as_operator<T: Send>(star: &Star, host: usize, token: &str, call: impl FnOnce(&OperatorClient) -> Result<T, ClientError> + Send) -> Result<T, ClientError> {
    let url = format!("http://127.0.0.1:{AGENT_PORT}");
    star.hosts[host].ns.run(|| OperatorClient::new(&url, token).and_then(|c| call(&c)))
}

fn get_status(star: &Star, host: usize) -> Result<StatusResponse, ClientError> {
    as_operator(star, host, OPERATOR_TOKEN, OperatorClient::status)
}

fn get_flows(star: &Star, host: usize, limit: usize) -> Result<FlowsResponse, ClientError> {
    as_operator(star, host, OPERATOR_TOKEN, |c| c.flows(limit))
}

fn get_metrics(star: &Star, host: usize) -> String {
    scrape_metrics(&star.hosts[host].ns, AGENT_PORT).unwrap_or_else(|e| panic!("{e}"))
}

/// `/metrics`, or `None` while the agent is not answering yet (just started, on a busy machine).
fn try_metrics(star: &Star, host: usize) -> Option<String> {
    scrape_metrics(&star.hosts[host].ns, AGENT_PORT).ok()
}

/// Value of the series with exactly this name and label text, or 0 if absent.
fn metric(text: &str, series: &str) -> u64 {
    support::agent::metric(text, series).unwrap_or(0)
}

/// How often the waits below poll the agent.
const POLL: Duration = Duration::from_millis(100);

fn within_1pct(got: u64, want: u64) -> bool {
    (got as f64 - want as f64).abs() <= want as f64 * 0.01
}

fn tcp_flows<'a>(flows: &'a [FlowView], dst: &str, port: u16) -> Vec<&'a FlowView> {
    flows.iter().filter(|f| f.kind == "tcp" && f.direction == "egress" && f.dst_addr == dst && f.dst_port == port).collect()
}

#[test]
#[ignore = "needs root and the eBPF object (T2): run with cargo xtask test"]
fn agent_reports_what_senders_sent() {
    preconditions();
    // Offloads off: the classifier then sees MTU-sized segments, so a retransmitted segment is a
    // packet of its own (with GSO a retransmission can ride inside a 64 KiB super-packet and the
    // monitor counted 1 retransmission for the sender's 45 in one run).
    let star = Star::new(StarConfig { hosts: 4, offloads: false, ..Default::default() }).unwrap();
    let files = AgentFiles::write(&format!("t2-{}", std::process::id()), &format!("# operator\n{OPERATOR_TOKEN}\n"), "[match]\nprefixes = [\"10.77.0.0/24\"]");
    let pin_dir = files.pin_dir.clone();
    let mut cmd = star.hosts[0].ns.command(env!("CARGO_BIN_EXE_ringside"));
    cmd.args(files.agent_args(AGENT_PORT)).env("RUST_LOG", "info");
    let mut agent = files.start(cmd);

    // Ready: attached and polled.
    let status: StatusResponse = wait_for(Duration::from_secs(15), POLL, "the agent to become ready", || {
        get_status(&star, 0).ok().filter(|s| s.ready)
    });
    assert_eq!(status.interfaces.len(), 1);
    assert_eq!(status.interfaces[0].name, "eth0");
    for name in dataplane_user::loader::PINNED_MAPS {
        assert!(pin_dir.join(name).exists(), "map {name} not pinned under {}", pin_dir.display());
    }

    // --- TCP host0 → host1, 2 streams × 8 MB, clean link ---
    let h1: IpAddr = star.hosts[1].addr.into();
    let sink = star.hosts[1].ns.run(|| TcpSink::bind(SocketAddr::new(h1, 0))).unwrap();
    let port = sink.local_addr().unwrap().port();
    let recv = std::thread::spawn(move || sink.receive(2, Duration::from_secs(60)));
    let sent = star.hosts[0].ns.run(|| testbed::tcp_send(SocketAddr::new(h1, port), 8_000_000, 2)).unwrap();
    recv.join().unwrap().unwrap();
    let payload_sent: u64 = sent.streams.iter().map(|s| s.bytes_sent).sum();
    let l3_sent: u64 = sent.streams.iter().map(|s| s.l3_bytes_estimate).sum();

    let flows = wait_for(Duration::from_secs(5), POLL, "TCP payload in /v1/flows to reach what was sent", || {
        let r = get_flows(&star, 0, 100).ok()?;
        let f = tcp_flows(&r.flows, "10.77.0.2", port);
        let payload: u64 = f.iter().map(|f| f.payload_bytes).sum();
        (f.len() == 2 && within_1pct(payload, payload_sent)).then_some(r)
    });
    let f = tcp_flows(&flows.flows, "10.77.0.2", port);
    let payload: u64 = f.iter().map(|f| f.payload_bytes).sum();
    eprintln!("tcp: sender bytes_sent={payload_sent} l3≈{l3_sent}; agent payload={payload}");
    assert!(f.iter().all(|f| f.interface == "eth0" && f.peer == "10.77.0.2" && f.src_addr == "10.77.0.1"));

    let text = get_metrics(&star, 0);
    let tcp_series = "{interface=\"eth0\",direction=\"egress\",kind=\"tcp\",peer=\"10.77.0.2\"}";
    let l3 = metric(&text, &format!("ringside_peer_bytes_total{tcp_series}"));
    eprintln!("tcp: metrics peer bytes={l3}");
    assert!(within_1pct(l3, l3_sent), "peer bytes {l3} vs sender L3 estimate {l3_sent}");
    assert!(metric(&text, "ringside_dataplane_packets_total{result=\"matched\"}") > 0);
    let retrans_clean = metric(&text, &format!("ringside_peer_tcp_retransmissions_total{tcp_series}"));

    // --- RoCEv2 host0 → host2 with known gaps, CNPs, NAKs and CE marks ---
    let h2: IpAddr = star.hosts[2].addr.into();
    let rsink = star.hosts[2].ns.run(|| RoceSink::bind(SocketAddr::new(h2, testbed::ROCEV2_UDP_PORT))).unwrap();
    // Resolve host2's neighbour entry first. Otherwise the first RoCE packets wait in the ARP
    // queue and are transmitted from the ARP reply's softirq, possibly on the other CPU, while the
    // sender's next packets go out directly: the monitor (whose PSN state is shared by all CPUs)
    // then sees a real reordering at TC egress, a gap plus an out-of-order, that the sender's
    // report cannot know about. UDP port 9 (discard) is not a collective flow.
    star.hosts[0].ns.run(|| {
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        s.send_to(b"arp", SocketAddr::new(h2, 9)).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    let spec = RoceSpec {
        to: SocketAddr::new(h2, testbed::ROCEV2_UDP_PORT),
        src_port: 49152,
        packets: 3000,
        payload_len: 1024,
        skip_psns: vec![100, 101, 102, 1500, 2999],
        ce_marks: 9,
        cnps: 7,
        naks: 3,
        pps: Some(50_000),
        ..Default::default()
    };
    let rrecv = std::thread::spawn(move || rsink.receive(None, Duration::from_millis(500), Duration::from_secs(20)));
    let report = star.hosts[0].ns.run(|| {
        pin_to_cpu0();
        testbed::roce_send(&spec)
    })
    .unwrap();
    rrecv.join().unwrap().unwrap();
    eprintln!("roce: sent {report:?}");
    let roce_series = "{interface=\"eth0\",direction=\"egress\",kind=\"rocev2\",peer=\"10.77.0.3\"}";
    let text = wait_for(Duration::from_secs(5), POLL, "RoCE bytes in /metrics to reach what was sent", || {
        let t = get_metrics(&star, 0);
        within_1pct(metric(&t, &format!("ringside_peer_bytes_total{roce_series}")), report.l3_bytes).then_some(t)
    });
    assert_eq!(metric(&text, &format!("ringside_peer_packets_total{roce_series}")), report.packets_sent);
    assert_eq!(metric(&text, &format!("ringside_peer_roce_psn_gaps_total{roce_series}")), report.psn_gaps, "{text}");
    assert_eq!(metric(&text, &format!("ringside_peer_roce_psn_gap_packets_total{roce_series}")), report.skipped_psns);
    assert_eq!(metric(&text, &format!("ringside_peer_roce_cnps_total{roce_series}")), report.cnps);
    assert_eq!(metric(&text, &format!("ringside_peer_roce_naks_total{roce_series}")), report.naks);
    assert_eq!(metric(&text, &format!("ringside_peer_ce_marks_total{roce_series}")), report.ce_marked);
    let r = get_flows(&star, 0, 100).unwrap();
    let rf = r.flows.iter().find(|f| f.kind == "rocev2" && f.dst_addr == "10.77.0.3" && f.direction == "egress").expect("RoCE flow listed");
    let roce = rf.roce.as_ref().unwrap();
    assert_eq!((roce.psn_gap_events, roce.psn_gap_packets, roce.cnps, roce.naks), (report.psn_gaps, report.skipped_psns, report.cnps, report.naks));
    assert!(within_1pct(rf.bytes, report.l3_bytes), "flow bytes {} vs {}", rf.bytes, report.l3_bytes);

    // --- TCP host0 → host1 again, with 3 % random drop on host1's link ---
    let loss = star.add_loss(1, 3.0).unwrap();
    let sink = star.hosts[1].ns.run(|| TcpSink::bind(SocketAddr::new(h1, 0))).unwrap();
    let port2 = sink.local_addr().unwrap().port();
    let recv = std::thread::spawn(move || sink.receive(1, Duration::from_secs(90)));
    let lossy = star.hosts[0].ns.run(|| testbed::tcp_send_with_timeout(SocketAddr::new(h1, port2), 4_000_000, 1, Duration::from_secs(90))).unwrap();
    recv.join().unwrap().unwrap();
    drop(loss);
    eprintln!("lossy tcp: sender total_retrans={}", lossy.total_retrans);
    let retrans = wait_for(Duration::from_secs(5), POLL, "TCP retransmissions after the drop rule", || {
        let t = get_metrics(&star, 0);
        let v = metric(&t, &format!("ringside_peer_tcp_retransmissions_total{tcp_series}"));
        (v > retrans_clean).then_some(v)
    });
    eprintln!("lossy tcp: agent retransmissions {retrans_clean} → {retrans}");

    // `ringside flows` / `ringside status` against the live agent.
    let out = star.hosts[0].ns.command(env!("CARGO_BIN_EXE_ringside")).args(["status", "--agent", &format!("http://127.0.0.1:{AGENT_PORT}")]).env("RINGSIDE_TOKEN", OPERATOR_TOKEN).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("agent: ready") && text.contains("eth0"), "{text}");
    let out = star.hosts[0].ns.command(env!("CARGO_BIN_EXE_ringside")).args(["flows", "--limit", "3", "--token", OPERATOR_TOKEN, "--agent", &format!("http://127.0.0.1:{AGENT_PORT}")]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("10.77.0.1:") && text.contains("3 of "), "{text}");

    // --- job registration: the tenant boundary and MATCH_PREFIXES ---
    check_job_registration(&star, &pin_dir);

    // --- clean exit: detached, qdisc and pins removed ---
    assert!(agent.stop(), "agent did not exit cleanly on SIGTERM");
    assert!(!pin_dir.exists(), "pins left in {}", pin_dir.display());
    let out = star.hosts[0].ns.command("tc").args(["qdisc", "show", "dev", "eth0"]).output().unwrap();
    let qdiscs = String::from_utf8_lossy(&out.stdout);
    assert!(!qdiscs.contains("clsact"), "clsact left behind: {qdiscs}");
}

/// Whether the pinned `MATCH_PREFIXES` holds `10.99.0.0/16`.
fn trie_holds_10_99(pin_dir: &Path) -> bool {
    use aya::maps::{lpm_trie::Key, LpmTrie, Map, MapData};
    let data = MapData::from_pin(pin_dir.join("MATCH_PREFIXES")).expect("open the pinned MATCH_PREFIXES");
    let trie: LpmTrie<MapData, [u8; 16], u32> = LpmTrie::try_from(Map::from_map_data(data).unwrap()).unwrap();
    let addr = dataplane_common::ipv4_mapped([10, 99, 0, 0]);
    trie.keys().filter_map(Result::ok).any(|k: Key<[u8; 16]>| k.prefix_len() == 96 + 16 && k.data() == addr)
}

/// Registers a job through the live agent: 201 with a tenant token, its members in the kernel
/// trie, the tenant reads its hint but not `/v1/flows`, and DELETE removes the prefix again.
fn check_job_registration(star: &Star, pin_dir: &Path) {
    let url = format!("http://127.0.0.1:{AGENT_PORT}");
    let reg: JobRegistration = serde_json::from_str(r#"{"name":"t2-job","members":["10.77.0.2","10.99.0.0/16"],"tcp_ports":["29500"]}"#).unwrap();
    let e = as_operator(star, 0, "", |c| c.register(&reg)).unwrap_err();
    assert_eq!(e.status(), Some(401), "{e}");
    let created = as_operator(star, 0, OPERATOR_TOKEN, |c| c.register(&reg)).unwrap();
    assert!(trie_holds_10_99(pin_dir), "the job's prefix is not in MATCH_PREFIXES");
    let job_url = format!("{url}/v1/jobs/{}", created.id);
    let tenant_hint = || star.hosts[0].ns.run(|| JobClient::new(&job_url, &created.tenant_token)?.hint());
    let hint = tenant_hint().unwrap();
    assert_eq!(hint.job, created.id);
    let e = as_operator(star, 0, &created.tenant_token, |c| c.flows(20)).unwrap_err();
    assert_eq!(e.status(), Some(403), "a tenant token does not read the provider's flows: {e}");
    as_operator(star, 0, OPERATOR_TOKEN, |c| c.delete(&created.id)).unwrap();
    assert!(!trie_holds_10_99(pin_dir), "the job's prefix stayed in MATCH_PREFIXES");
    // 10.77.0.0/24 is the config's [match] prefix: it stays whatever jobs come and go.
    let e = tenant_hint().unwrap_err();
    assert_eq!(e.status(), Some(401), "a deleted job's token is no longer valid: {e}");
}

#[test]
#[ignore = "needs root and the eBPF object (T2): run with cargo xtask test"]
fn agent_errors_are_actionable() {
    preconditions();
    let star = Star::new(StarConfig { hosts: 1, ..Default::default() }).unwrap();
    let bin = env!("CARGO_BIN_EXE_ringside");
    let run = |args: &[&str]| {
        let out = star.hosts[0].ns.command(bin).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let pin = format!("/sys/fs/bpf/ringside-t2e-{}", std::process::id());
    let e = run(&["agent", "--iface", "nosuch0", "--pin-dir", &pin]);
    assert!(e.contains("`nosuch0`") && e.contains("ip link"), "{e}");
    let e = run(&["agent", "--iface", "eth0", "--pin-dir", "/tmp/ringside-not-bpffs/x"]);
    assert!(e.contains("mount -t bpf bpf /sys/fs/bpf"), "{e}");
    // Listen address in use inside that namespace.
    let held = star.hosts[0].ns.run(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let addr = held.local_addr().unwrap().to_string();
    let e = run(&["agent", "--iface", "eth0", "--pin-dir", &pin, "--listen", &addr]);
    assert!(e.contains(&addr) && e.contains("--listen"), "{e}");
    let e = run(&["flows", "--agent", "http://127.0.0.1:1"]);
    assert!(e.contains("is the agent running"), "{e}");
    assert!(!Path::new(&pin).exists(), "a failed start left pins");
}

/// `ip netns exec NS ringside agent`, as operators start it: `ip` remounts /sys in a private mount
/// namespace, hiding the host's bpffs. The agent must find it (in its parent's mount namespace),
/// pin there where `ringside detach` and a restarted agent see the pins, and remove them on exit.
#[test]
#[ignore = "needs root and the eBPF object (T2): run with cargo xtask test"]
fn agent_starts_under_ip_netns_exec() {
    preconditions();
    let star = Star::new(StarConfig { hosts: 1, ..Default::default() }).unwrap();
    let files = AgentFiles::write(&format!("t2-{}-x", std::process::id()), &format!("{OPERATOR_TOKEN}\n"), "");
    let pin_dir = files.pin_dir.clone();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", star.hosts[0].ns.name(), env!("CARGO_BIN_EXE_ringside")]).args(files.agent_args(AGENT_PORT)).env("RUST_LOG", "info");
    let mut agent = files.start(cmd);
    let status = wait_for(Duration::from_secs(15), POLL, "the agent started by `ip netns exec` to become ready", || {
        get_status(&star, 0).ok().filter(|s| s.ready)
    });
    assert_eq!(status.interfaces[0].name, "eth0", "attached in the namespace ip netns exec entered");
    for name in dataplane_user::loader::PINNED_MAPS {
        assert!(pin_dir.join(name).exists(), "map {name} not pinned on the host's bpffs under {}", pin_dir.display());
    }
    assert!(agent.stop(), "the agent did not exit cleanly on SIGTERM");
    assert!(!pin_dir.exists(), "the agent left its pins in {}", pin_dir.display());
}

/// Copies a directory tree (the RDMA fixture) so the test can rewrite its counters.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Adds `by` to the counter file `rel` under `root`.
fn bump(root: &Path, rel: &str, by: u64) {
    let p = root.join(rel);
    let v: u64 = std::fs::read_to_string(&p).unwrap().trim().parse().unwrap();
    std::fs::write(&p, format!("{}\n", v + by)).unwrap();
}

/// Removes the test's scratch directory on drop, even when an assertion fails.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The RDMA port counters through the real agent: with no device it says so once (info) and
/// serves `ringside_rdma_ports_read 0`; with a tree laid out like /sys/class/infiniband whose
/// counters the test advances every 200 ms (a CNP storm on mlx5_0/1 from some point on), the
/// agent's own windows raise a congestion event scoped to that port, served by `/v1/events` and
/// counted in `/metrics`, and nothing on the healthy ports.
#[test]
#[ignore = "needs root and the eBPF object (T2): run with cargo xtask test"]
fn rdma_port_counters_reach_events_and_metrics() {
    use ringside_client::operator::{Scope, VerdictKind};
    preconditions();
    let star = Star::new(StarConfig { hosts: 1, ..Default::default() }).unwrap();
    let id = format!("{}-rdma", std::process::id());
    let scratch = Scratch(std::env::temp_dir().join(format!("ringside-t2-{id}")));
    let dir = &scratch.0;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("state")).unwrap();
    let tokens = dir.join("tokens");
    write_token_file(&tokens, OPERATOR_TOKEN);
    let root = dir.join("infiniband");
    let start = |name: &str, counters_root: &Path| {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                "state_dir = \"{}\"\n[api]\noperator_tokens_file = \"{}\"\n[rdma]\ncounters_root = \"{}\"\n",
                dir.join("state").display(),
                tokens.display(),
                counters_root.display()
            ),
        )
        .unwrap();
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/ringside-t2-{id}-{name}"));
        let log = dir.join(format!("{name}.log"));
        let mut cmd = star.hosts[0].ns.command(env!("CARGO_BIN_EXE_ringside"));
        cmd.args(["agent", "--iface", "eth0", "--listen", &format!("127.0.0.1:{AGENT_PORT}"), "--config"])
            .arg(&config)
            .arg("--pin-dir")
            .arg(&pin_dir)
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).unwrap());
        (AgentProcess::start(cmd, pin_dir, Vec::new()), log)
    };

    // No device: one info line, an empty gauge, reads that keep going.
    let (mut agent, log) = start("absent", &root);
    let text = wait_for(Duration::from_secs(20), POLL, "three reads of a missing counters_root", || {
        try_metrics(&star, 0).filter(|t| metric(t, "ringside_rdma_port_polls_total") >= 3)
    });
    assert!(text.lines().any(|l| l == "ringside_rdma_ports_read 0"), "{text}");
    assert_eq!(metric(&text, "ringside_rdma_port_read_problems_total{reason=\"unreadable\"}"), 0);
    assert!(agent.stop(), "the agent did not exit cleanly");
    let log = std::fs::read_to_string(log).unwrap();
    let said = log.lines().filter(|l| l.contains("no RDMA device")).collect::<Vec<_>>();
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].contains("INFO"), "{log}");

    // A device: mlx5_0 with two ports, qib0 with counters/ only, broken0 with bad files.
    copy_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rdma/hosts"), &root);
    let (mut agent, log) = start("present", &root);
    wait_for(Duration::from_secs(20), POLL, "the agent to read 4 RDMA ports", || {
        try_metrics(&star, 0).filter(|t| metric(t, "ringside_rdma_ports_read") == 4)
    });
    // 100,000 packets each way per 200 ms on every port (at least 1,000 per 1 s window however the
    // ticks fall); after 3 s, 1,000 CNPs per tick from mlx5_0/1 (5,000/s: the threshold is 100/s).
    let ticks = std::time::Instant::now();
    let event = wait_for(Duration::from_secs(30), Duration::from_millis(200), "a congestion event on RDMA port mlx5_0/1", || {
        for port in ["mlx5_0/ports/1", "mlx5_0/ports/2", "qib0/ports/1"] {
            bump(&root, &format!("{port}/counters/port_xmit_packets"), 100_000);
            bump(&root, &format!("{port}/counters/port_rcv_packets"), 100_000);
        }
        if ticks.elapsed() > Duration::from_secs(3) {
            bump(&root, "mlx5_0/ports/1/hw_counters/np_cnp_sent", 1_000);
        }
        let events = as_operator(&star, 0, OPERATOR_TOKEN, |c| c.events(false, 100)).ok()?;
        events.events.into_iter().find(|e| e.scope == Scope::RdmaPort { device: "mlx5_0".into(), port: 1 })
    });
    assert_eq!((event.kind, event.job.as_str()), (VerdictKind::Congestion, "@rdma-ports"), "{event:?}");
    let all = as_operator(&star, 0, OPERATOR_TOKEN, |c| c.events(true, 100)).unwrap();
    assert!(
        all.events.iter().all(|e| e.scope == Scope::RdmaPort { device: "mlx5_0".into(), port: 1 }),
        "only the CNP storm raised anything: {:?}",
        all.events
    );
    let text = get_metrics(&star, 0);
    assert!(metric(&text, "ringside_verdicts_open{kind=\"congestion\",severity=\"warning\"}") >= 1, "{text}");
    assert!(metric(&text, "ringside_rdma_port_cnps_total{device=\"mlx5_0\",port=\"1\",role=\"sent\"}") >= 2_000, "{text}");
    assert!(metric(&text, "ringside_rdma_port_read_problems_total{reason=\"not_numeric\"}") >= 3, "broken0's files: {text}");
    assert!(agent.stop(), "the agent did not exit cleanly");
    let log = std::fs::read_to_string(log).unwrap();
    assert_eq!(log.lines().filter(|l| l.contains("reading RDMA port counters")).count(), 1, "{log}");
    assert!(!log.contains("no RDMA device"), "{log}");
}
