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
