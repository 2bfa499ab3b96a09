//! T2 tests of the leaf-spine rig and the link faults (flap, cross traffic, uplink loss and rate
//! cap). They need root and fail (never skip) without it. Traffic only flows between addresses of
//! namespaces the tests create; every loop and wait is bounded.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use testbed::{CrossTrafficSpec, FaultKind, FlapSpec, LeafSpine, LeafSpineConfig, Rig, Star, StarConfig, TcpSink};

fn root() {
    if let Err(e) = testbed::require_root() {
        panic!("testbed tests create network namespaces: {e}");
    }
}

fn our_namespaces(prefix: &str) -> Vec<String> {
    testbed::netns::list_rig_namespaces().unwrap().into_iter().filter(|n| n.starts_with(prefix)).collect()
}

/// Sends `bytes` from host `from` to `to_addr` (inside host `to`) on any rig; both ends must agree.
fn transfer(rig: &dyn Rig, from: usize, to: usize, to_addr: IpAddr, bytes: u64, streams: usize) -> testbed::TcpSendReport {
    let sink = rig.host_netns(to).unwrap().run(|| TcpSink::bind(SocketAddr::new(to_addr, 0))).unwrap();
    let port = sink.local_addr().unwrap().port();
    let recv = std::thread::spawn(move || sink.receive(streams, Duration::from_secs(60)));
    let sent = rig
        .host_netns(from)
        .unwrap()
        .run(|| testbed::tcp_send_with_timeout(SocketAddr::new(to_addr, port), bytes, streams, Duration::from_secs(60)))
        .unwrap();
    let got = recv.join().unwrap().unwrap();
    assert_eq!(sent.total_payload_bytes, bytes * streams as u64);
    assert_eq!(got.total_bytes, bytes * streams as u64, "sink got {got:?}");
    sent
}

fn operstate(ns: &testbed::netns::NetnsHandle, iface: &str) -> String {
    let out = ns.command("ip").args(["-j", "link", "show", "dev", iface]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v[0]["operstate"].as_str().unwrap_or("?").to_string()
}

fn link_is_up(rig: &dyn Rig, link: &str) -> bool {
    let l = rig.link(link).unwrap();
    operstate(&l.near.ns, &l.near.iface) == "UP" && operstate(&l.far.ns, &l.far.iface) == "UP"
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn leaf_spine_connects_every_pair_across_leaves_and_tears_down() {
    root();
    let ls = LeafSpine::new(LeafSpineConfig::default()).unwrap();
    let prefix = ls.prefix().to_string();
    // 4 hosts + 2 leaves + spine.
    assert_eq!(our_namespaces(&format!("{prefix}-")).len(), 7);
    assert_eq!(ls.hosts.iter().map(|h| h.leaf).collect::<Vec<_>>(), vec![0, 0, 1, 1]);
    assert_eq!(ls.hosts[2].addr.to_string(), "10.77.1.1");
    let names: Vec<String> = ls.links().into_iter().map(|l| l.name).collect();
    assert_eq!(names, vec!["h0", "h1", "h2", "h3", "up0", "up1"]);
    let up0 = ls.uplink(0).unwrap();
    assert_eq!((up0.near.iface.as_str(), up0.far.iface.as_str()), ("uplink", "l0"));
    assert_eq!(testbed::tuning::read_rps(&up0.far.ns, "l0").unwrap(), testbed::tuning::all_cpus_mask());
    let root_links = std::process::Command::new("ip").args(["-o", "link"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&root_links.stdout).contains(&prefix));
    for i in 0..4 {
        for j in 0..4 {
            if i != j {
                transfer(&ls, i, j, ls.hosts[j].addr.into(), 64 * 1024, 1);
                transfer(&ls, i, j, ls.hosts[j].addr6.into(), 64 * 1024, 1);
            }
        }
    }
    // Cross-leaf packets are routed: one hop through the spine.
    let out = ls.hosts[0].ns.command("ip").args(["route", "get", &ls.hosts[3].addr.to_string()]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("via 10.77.0.254"), "{}", String::from_utf8_lossy(&out.stdout));
    drop(ls);
    assert!(our_namespaces(&format!("{prefix}-")).is_empty());
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn uplink_flap_stalls_a_transfer_which_then_completes() {
    root();
    let ls = LeafSpine::new(LeafSpineConfig::default()).unwrap();
    let to = SocketAddr::new(ls.hosts[2].addr.into(), 0);
    let sink = ls.hosts[2].ns.run(|| TcpSink::bind(to)).unwrap();
    let port = sink.local_addr().unwrap().port();
    let recv = std::thread::spawn(move || sink.receive(1, Duration::from_secs(60)));
    let mut s = ls.hosts[0].ns.run(|| TcpStream::connect_timeout(&SocketAddr::new(to.ip(), port), Duration::from_secs(5))).unwrap();
    s.write_all(&[1u8; 64 * 1024]).unwrap();

    let down = Duration::from_millis(1000);
    let flap = ls.link_flap("up0", FlapSpec::once(down)).unwrap();
    let t0 = Instant::now();
    assert!(!link_is_up(&ls, "up0"), "the uplink should be down right after the flap started");
    let bytes = 16u64 << 20;
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let chunk = vec![2u8; 256 * 1024];
    for _ in 0..(bytes / chunk.len() as u64) {
        s.write_all(&chunk).unwrap();
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(s.read(&mut b).unwrap(), 0, "sink closes after reading everything");
    let took = t0.elapsed();
    eprintln!("16 MiB across a 1 s uplink outage took {took:?}");
    let got = recv.join().unwrap().unwrap();
    assert_eq!(got.total_bytes, 64 * 1024 + bytes);
    // Nothing can be delivered while the uplink is down: the transfer stalled at least that long
    // (minus scheduling slack), and TCP recovered well within the bound.
    assert!(took >= down * 8 / 10, "transfer finished in {took:?} although the uplink was down {down:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    let rec = flap.wait(Duration::from_secs(10)).unwrap();
    assert!(rec.ended_unix_ms.unwrap() >= rec.started_unix_ms + 900, "{rec:?}");
    assert!(matches!(rec.kind, FaultKind::Flap { down_ms: 1000, period_ms: None }));
    assert!(link_is_up(&ls, "up0"));
    assert_eq!(ls.fault_log().len(), 1);
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn dropping_a_flap_guard_mid_outage_leaves_the_link_up() {
    root();
    let star = Star::new(StarConfig { hosts: 2, ..Default::default() }).unwrap();
    let flap = star.link_flap("h0", FlapSpec::periodic(Duration::from_millis(300), Duration::from_millis(400))).unwrap();
    assert!(!link_is_up(&star, "h0"));
    std::thread::sleep(Duration::from_millis(100));
    drop(flap); // while the link is down
    assert!(link_is_up(&star, "h0"));
    assert!(star.fault_log()[0].ended_unix_ms.is_some());
    transfer(&star, 0, 1, star.hosts[1].addr.into(), 1 << 20, 1);

    // A panic while a flap guard lives still brings the link up (the guard drops on unwind).
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _f = star.link_down_for("h1", Duration::from_secs(20)).unwrap();
        panic!("test panic with a flap in progress");
    }));
    assert!(r.is_err());
    assert!(link_is_up(&star, "h1"));
    // Bad specs are refused before anything changes.
    assert!(star.link_flap("h0", FlapSpec::periodic(Duration::from_millis(300), Duration::from_millis(200))).is_err());
    assert!(star.link_flap("up0", FlapSpec::once(Duration::from_millis(10))).is_err());
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn cross_traffic_on_a_shared_uplink_cuts_cross_leaf_goodput() {
    root();
    let ls = LeafSpine::new(LeafSpineConfig::default()).unwrap();
    // The uplink is the bottleneck (as in a fabric with finite uplinks); h1 → h3 shares it with
    // the measured transfer h0 → h2, and neither end of that transfer is involved.
    let _cap = ls.link_rate_cap("up0", 200).unwrap();
    let bytes = 6u64 << 20;
    let base = transfer(&ls, 0, 2, ls.hosts[2].addr.into(), bytes, 1);
    let cross = ls.cross_traffic(CrossTrafficSpec { from: 1, to: 3, streams: 4, ..Default::default() }).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let loaded = transfer(&ls, 0, 2, ls.hosts[2].addr.into(), bytes, 1);
    let report = cross.stop();
    let ratio = loaded.goodput_mbit / base.goodput_mbit;
    eprintln!("cross-leaf goodput alone {:.1} Mbit/s, with cross traffic {:.1} Mbit/s (ratio {ratio:.2}); cross traffic {:.1} Mbit/s", base.goodput_mbit, loaded.goodput_mbit, report.goodput_mbit);
    assert!(ratio < 0.75, "cross traffic did not slow the transfer: {ratio:.2}");
    assert!(report.bytes_received > 0 && report.bytes_sent >= report.bytes_received, "{report:?}");
    assert!(report.record.ended_unix_ms.is_some());
    assert!(matches!(report.record.kind, FaultKind::CrossTraffic { from: 1, to: 3, streams: 4, rate_mbit: None }));

    // A paced run stays near its rate and ends by itself after its duration.
    let paced = ls.cross_traffic(CrossTrafficSpec { from: 1, to: 3, streams: 2, rate_mbit: Some(40), duration: Some(Duration::from_millis(1500)), port: 0 }).unwrap();
    let t0 = Instant::now();
    while !paced.finished() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(paced.finished());
    let r = paced.stop();
    let mbit = r.bytes_sent as f64 * 8.0 / 1.5 / 1e6;
    assert!(mbit < 60.0 && mbit > 10.0, "paced at 40 Mbit/s but sent {mbit:.1} Mbit/s: {r:?}");
    // The record ends when the traffic did (its duration), not when we collected the report.
    let span = r.record.ended_unix_ms.unwrap() - r.record.started_unix_ms;
    assert!((1400..=2500).contains(&span), "{:?}", r.record);
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn uplink_rate_cap_caps_cross_leaf_goodput_only() {
    root();
    let ls = LeafSpine::new(LeafSpineConfig::default()).unwrap();
    let cap = ls.link_rate_cap("up0", 100).unwrap();
    let cross = transfer(&ls, 0, 2, ls.hosts[2].addr.into(), 2 << 20, 1);
    let local = transfer(&ls, 0, 1, ls.hosts[1].addr.into(), 8 << 20, 1);
    eprintln!("capped uplink: cross-leaf {:.1} Mbit/s, same leaf {:.1} Mbit/s", cross.goodput_mbit, local.goodput_mbit);
    assert!(cross.goodput_mbit < 120.0, "{cross:?}");
    assert!(local.goodput_mbit > 2.0 * cross.goodput_mbit, "same-leaf traffic should not cross the capped uplink");
    let rec = cap.remove().unwrap();
    assert_eq!(rec.link.as_deref(), Some("up0"));
    assert_eq!(rec.host, None);
    let up0 = ls.uplink(0).unwrap();
    for e in [&up0.near, &up0.far] {
        let out = e.ns.command("tc").args(["qdisc", "show", "dev", &e.iface]).output().unwrap();
        assert!(!String::from_utf8_lossy(&out.stdout).contains("tbf"));
    }

    // Loss on an uplink: cross-leaf transfers retransmit, the rule counts its drops.
    let loss = ls.link_loss("uplink1", 5.0).unwrap();
    let sent = transfer(&ls, 3, 0, ls.hosts[0].addr.into(), 16 << 20, 1);
    assert!(sent.total_retrans > 0, "{sent:?}");
    let d = loss.dropped().unwrap();
    assert!(d.from_host_packets > 0, "{d:?}");
    drop(loss);
    assert!(ls.fault_log().iter().all(|r| r.ended_unix_ms.is_some()));
}

/// Mean size of the frames leaf 0's uplink transmits while `from` sends 16 MiB to `to`.
fn mean_uplink_frame(ls: &LeafSpine, from: usize, to: usize) -> f64 {
    let leaf = &ls.leaves[0];
    let before = testbed::link::link_counters(&leaf.ns.handle(), leaf.uplink_iface).unwrap();
    transfer(ls, from, to, ls.hosts[to].addr.into(), 16 << 20, 1);
    let after = testbed::link::link_counters(&leaf.ns.handle(), leaf.uplink_iface).unwrap();
    (after.tx_bytes - before.tx_bytes) as f64 / (after.tx_packets - before.tx_packets).max(1) as f64
}

#[test]
#[ignore = "needs root (T2): run with cargo xtask test"]
fn segmentation_offloads_turn_back_on_along_one_path_only() {
    root();
    // As `cargo xtask eval adaptation` and `eval detection` build their uplink scenario: no
    // offloads, then TSO/GSO back on for h2 -> h5 (the cross traffic's hosts) and both uplinks.
    let ls = LeafSpine::new(LeafSpineConfig { hosts_per_leaf: 3, offloads: false, ..Default::default() }).unwrap();
    let before = mean_uplink_frame(&ls, 2, 5);
    assert!(before <= 1514.0, "offloads are off, yet up0 sent {before:.0}-byte frames");
    assert_eq!(ls.segmentation_offloads_between(2, 5).unwrap(), ["h2", "up0", "up1", "h5"]);
    let h2 = ls.link("h2").unwrap();
    let k = h2.near.ns.command("ethtool").args(["-k", &h2.near.iface]).output().unwrap();
    let k = String::from_utf8_lossy(&k.stdout);
    assert!(k.contains("tcp-segmentation-offload: on") && k.contains("generic-receive-offload: off"), "{k}");
    let cross = mean_uplink_frame(&ls, 2, 5);
    let job = mean_uplink_frame(&ls, 1, 4);
    eprintln!("mean frame on up0: h2 -> h5 {before:.0} bytes without offloads, {cross:.0} with; h1 -> h4 {job:.0}");
    // The cross traffic's path carries super-packets; a host that kept offloads off still sends
    // MTU-sized segments through the same uplink.
    assert!(cross > 3000.0, "h2 -> h5 still crosses up0 in {cross:.0}-byte frames");
    assert!(job <= 1514.0, "h1 kept offloads off, yet up0 sent {job:.0}-byte frames for it");
    assert!(ls.link_segmentation_offloads("h9", true).is_err());
    assert!(ls.segmentation_offloads_between(2, 9).is_err());
    // Two hosts of one leaf: their links and that leaf's uplink only.
    assert_eq!(ls.segmentation_offloads_between(0, 1).unwrap(), ["h0", "up0", "h1"]);
}
