//! T2 tests: real namespaces, links and sockets. They need root and fail (never skip) without it.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use testbed::{Netns, Star, StarConfig, TcpSink};

fn root() {
    if let Err(e) = testbed::require_root() {
        panic!("testbed tests create network namespaces: {e}");
    }
}

fn our_namespaces(prefix: &str) -> Vec<String> {
    testbed::netns::list_rig_namespaces().unwrap().into_iter().filter(|n| n.starts_with(prefix)).collect()
}

/// Sends `bytes` from host `from` to `to_addr` (inside host `to`) and checks both ends agree.
fn transfer(star: &Star, from: usize, to: usize, to_addr: IpAddr, bytes: u64, streams: usize) -> testbed::TcpSendReport {
    let dst = SocketAddr::new(to_addr, 0);
    let sink = star.hosts[to].ns.run(|| TcpSink::bind(dst)).unwrap();
    let port = sink.local_addr().unwrap().port();
    let recv = std::thread::spawn(move || sink.receive(streams, Duration::from_secs(60)));
    let sent = star.hosts[from].ns.run(|| testbed::tcp_send(SocketAddr::new(to_addr, port), bytes, streams)).unwrap();
    let got = recv.join().unwrap().unwrap();
    assert_eq!(sent.total_payload_bytes, bytes * streams as u64);
    assert_eq!(got.total_bytes, bytes * streams as u64, "sink got {got:?}");
    assert_eq!(got.connections.len(), streams);
    assert!(got.connections.iter().all(|c| c.bytes == bytes));
    sent
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn netns_command_and_run_enter_the_namespace() {
    root();
    let ns = Netns::new("t-enter").unwrap();
    assert!(ns.name().starts_with(&format!("rs-{}-", std::process::id())));
    // A fresh namespace has only lo.
    let out = ns.command("ip").args(["-o", "link"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("lo:"));
    // The mount namespace is the caller's: /sys/fs/bpf is visible as it is to us.
    let out = ns.command("sh").args(["-c", "stat -f -c %T /sys/fs/bpf 2>/dev/null || echo none"]).output().unwrap();
    let here = std::process::Command::new("sh").args(["-c", "stat -f -c %T /sys/fs/bpf 2>/dev/null || echo none"]).output().unwrap();
    assert_eq!(out.stdout, here.stdout);
    // A socket bound in run() lives in the namespace: 127.0.0.1 there is not ours.
    let inside = ns.run(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let port = inside.local_addr().unwrap().port();
    assert!(std::net::TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_millis(300)).is_err());
    let name = ns.name().to_string();
    drop(ns);
    assert!(!testbed::netns::list_rig_namespaces().unwrap().contains(&name));
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn star_of_four_connects_every_pair_and_tears_down() {
    root();
    let star = Star::new(StarConfig { hosts: 4, ..Default::default() }).unwrap();
    let prefix = star.prefix().to_string();
    assert_eq!(our_namespaces(&format!("{prefix}-")).len(), 5);
    for h in &star.hosts {
        assert_eq!(testbed::tuning::read_rps(&h.ns.handle(), "eth0").unwrap(), testbed::tuning::all_cpus_mask());
    }
    assert!(testbed::tuning::read_backlog().unwrap() >= testbed::tuning::RAISED_NETDEV_MAX_BACKLOG);
    // No interface of the rig appears in the root namespace.
    let root_links = std::process::Command::new("ip").args(["-o", "link"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&root_links.stdout).contains(&prefix));
    for i in 0..4 {
        for j in 0..4 {
            if i == j {
                continue;
            }
            transfer(&star, i, j, star.hosts[j].addr.into(), 64 * 1024, 1);
            transfer(&star, i, j, star.hosts[j].addr6.into(), 64 * 1024, 1);
        }
    }
    drop(star);
    assert!(our_namespaces(&format!("{prefix}-")).is_empty());
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn tcp_send_is_received_exactly() {
    root();
    let star = Star::new(StarConfig { hosts: 2, ..Default::default() }).unwrap();
    let n = 10 * 1024 * 1024 + 7;
    let sent = transfer(&star, 0, 1, star.hosts[1].addr.into(), n, 3);
    assert_eq!(sent.streams.len(), 3);
    for s in &sent.streams {
        assert_eq!(s.payload_bytes, n);
        assert!(s.bytes_acked >= n, "{s:?}");
        assert!(s.data_segs_out as u64 >= n / s.snd_mss as u64, "{s:?}");
        assert!(s.segs_out >= s.data_segs_out);
    }
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn roce_send_reports_what_the_peer_receives() {
    root();
    let star = Star::new(StarConfig { hosts: 2, ..Default::default() }).unwrap();
    let listen = SocketAddr::new(star.hosts[1].addr.into(), testbed::ROCEV2_UDP_PORT);
    let sink = star.hosts[1].ns.run(|| testbed::RoceSink::bind(listen)).unwrap();
    let spec = testbed::RoceSpec {
        to: listen,
        src_port: 49152,
        dest_qp: 0x1234,
        start_psn: 1000,
        packets: 2000,
        payload_len: 1024,
        skip_psns: vec![1010, 1011, 1500],
        ce_marks: 25,
        cnps: 4,
        naks: 2,
        ..Default::default()
    };
    let sent = star.hosts[0].ns.run(|| testbed::roce_send(&spec)).unwrap();
    assert_eq!(sent.packets_sent, 2006);
    assert_eq!(sent.data_packets, 2000);
    assert_eq!((sent.psn_gaps, sent.skipped_psns), (2, 3));
    assert_eq!((sent.ce_marked, sent.cnps, sent.naks), (25, 4, 2));
    assert_eq!(sent.l3_bytes, 2000 * (20 + 8 + 12 + 1024 + 4) + 4 * (20 + 8 + 12 + 16 + 4) + 2 * (20 + 8 + 12 + 4 + 4));
    assert!(sent.from.ends_with(":49152"));
    let got = sink.receive(Some(sent.packets_sent), Duration::from_secs(1), Duration::from_secs(10)).unwrap();
    assert_eq!(got.datagrams, sent.packets_sent, "{got:?}");
    assert_eq!(got.by_opcode, sent.by_opcode);
    assert_eq!((got.ce_marked, got.cnps, got.naks), (25, 4, 2));
    // The sender's gaps are what never arrived. The link may reorder under load (session 34: one
    // packet in a round beside a build, seen as (3, 4)): each late packet adds one gap as received
    // and one skipped PSN, and is counted as reordered. The stream's first packets can arrive
    // behind a later one (CI, stop 44: 3 of them, then counted as duplicates): `overtaken`.
    assert_eq!((got.unreceived_runs, got.unreceived_psns, got.duplicates), (2, 3, 0), "the sink sees the sender's gaps: {got:?}");
    assert_eq!(got.skipped_psns, 3 + got.reordered, "{got:?}");
    assert!(got.psn_gaps >= 2 && got.psn_gaps <= 2 + got.reordered, "{got:?}");
    assert_eq!(got.bytes, sent.udp_payload_bytes);

    // IPv6: CE goes in the traffic class, headers are 40 bytes.
    let listen6 = SocketAddr::new(star.hosts[1].addr6.into(), testbed::ROCEV2_UDP_PORT);
    let sink6 = star.hosts[1].ns.run(|| testbed::RoceSink::bind(listen6)).unwrap();
    let spec6 = testbed::RoceSpec { to: listen6, packets: 100, payload_len: 64, ce_marks: 10, icrc: false, ..Default::default() };
    let sent6 = star.hosts[0].ns.run(|| testbed::roce_send(&spec6)).unwrap();
    assert_eq!(sent6.l3_bytes, 100 * (40 + 8 + 12 + 64));
    let got6 = sink6.receive(Some(100), Duration::from_secs(1), Duration::from_secs(10)).unwrap();
    assert_eq!((got6.datagrams, got6.ce_marked), (100, 10));
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn loss_rule_causes_retransmits_and_guard_removes_it() {
    root();
    let star = Star::new(StarConfig { hosts: 2, ..Default::default() }).unwrap();
    let loss = star.add_loss(0, 5.0).unwrap();
    assert_eq!(star.fault_log().len(), 1);
    // 16 MiB: even as 64 KiB GSO frames that is >250 packets, so P(no data packet dropped) < 1e-5.
    let sent = transfer(&star, 0, 1, star.hosts[1].addr.into(), 16 * 1024 * 1024, 1);
    assert!(sent.total_retrans > 0, "5% loss but no retransmissions: {sent:?}");
    let dropped = loss.dropped().unwrap();
    assert!(dropped.from_host_packets > 0, "{dropped:?}");
    let table = loss.table().to_string();
    let loss_ns = loss.netns().clone();
    let rec = loss.remove().unwrap();
    assert!(rec.ended_unix_ms.unwrap() >= rec.started_unix_ms);
    let out = loss_ns.command("nft").args(["list", "tables"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&table));
    // Dropping a guard removes the rule as well.
    let loss = star.add_loss(0, 100.0).unwrap();
    let table = loss.table().to_string();
    let loss_ns = loss.netns().clone();
    drop(loss);
    let out = loss_ns.command("nft").args(["list", "tables"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&table));
    assert!(star.fault_log().iter().all(|r| r.ended_unix_ms.is_some()));
    // And traffic flows cleanly again.
    transfer(&star, 0, 1, star.hosts[1].addr.into(), 1024 * 1024, 1);
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn rate_cap_limits_goodput_and_guard_removes_it() {
    root();
    let star = Star::new(StarConfig { hosts: 2, ..Default::default() }).unwrap();
    let cap = star.rate_cap(0, 40).unwrap();
    let sent = transfer(&star, 0, 1, star.hosts[1].addr.into(), 2 * 1024 * 1024, 1);
    assert!(sent.goodput_mbit < 48.0, "{sent:?}");
    let rec = cap.remove().unwrap();
    assert!(rec.ended_unix_ms.is_some());
    let out = star.hosts[0].ns.command("tc").args(["qdisc", "show", "dev", "eth0"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("tbf"));
    let sent = transfer(&star, 0, 1, star.hosts[1].addr.into(), 8 * 1024 * 1024, 1);
    assert!(sent.goodput_mbit > 100.0, "{sent:?}");
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn clean_removes_leaked_namespaces_of_dead_processes_only() {
    root();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let leaked = format!("rs-{dead}-0-leak");
    let ok = std::process::Command::new("ip").args(["netns", "add", &leaked]).status().unwrap();
    assert!(ok.success());
    let mine = Netns::new("t-keep").unwrap();
    let report = testbed::clean(false).unwrap();
    // A concurrent test process may have cleaned it first; either way it must be gone.
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(!report.removed.iter().any(|n| n == mine.name()));
    let left = testbed::netns::list_rig_namespaces().unwrap();
    assert!(!left.contains(&leaked));
    assert!(left.iter().any(|n| n == mine.name()));
}
