use super::*;
use ringside_test_support::frames::{self, MAC_A, MAC_B};
use testbed::roce::{self, PlannedPacket};

const H0: [u8; 4] = [10, 77, 0, 1];
const H2: [u8; 4] = [10, 77, 0, 3];
const MS: u64 = 1_000_000;

/// The frame the testbed generator's packet `p` of `spec` becomes on the wire (IPv4, no tags).
fn wire_frame(spec: &testbed::RoceSpec, p: &PlannedPacket) -> Vec<u8> {
    let mut payload = Vec::new();
    roce::encode(spec, p, &mut payload);
    let udp = frames::udp(spec.src_port, testbed::ROCEV2_UDP_PORT, &payload);
    let ecn = if p.ce { wire::ECN_CE } else { 0b10 };
    let ip = frames::ipv4(H0, H2, wire::IPPROTO_UDP, &frames::Ipv4Opts { tos: (spec.dscp << 2) | ecn, ..Default::default() }, &udp);
    frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IP, &ip)
}

fn settings() -> MirrorSettings {
    MirrorSettings { local_prefixes: vec!["10.77.0.1/32".parse::<crate::config::PrefixSpec>().unwrap().to_key()], ..MirrorSettings::new("mir0".into()) }
}

fn table() -> MirrorTable {
    MirrorTable::new(42, &settings(), FlowMatch::new(Config { flags: config_flags::BURST_EVENTS, ..Config::default() }, Vec::new()))
}

fn only_flow(t: &MirrorTable) -> (FlowKey, FlowStats) {
    assert_eq!(t.len(), 1, "{:?}", t.flows);
    t.flows.iter().map(|(k, v)| (*k, *v)).next().unwrap()
}

#[test]
fn the_generators_scenario_yields_its_own_numbers() {
    // The T2 scenario of t2_agent / t2_mirror: gaps, CE marks, CNPs and NAKs at known places.
    let spec = testbed::RoceSpec {
        to: "10.77.0.3:4791".parse().unwrap(),
        src_port: 49152,
        packets: 3000,
        payload_len: 1024,
        skip_psns: vec![100, 101, 102, 1500, 2999],
        ce_marks: 9,
        cnps: 7,
        naks: 3,
        ..Default::default()
    };
    let plan = roce::plan(&spec).unwrap();
    let report = roce::summarize(&spec, &plan);
    let mut t = table();
    for (i, p) in plan.iter().enumerate() {
        let f = wire_frame(&spec, p);
        t.ingest(&f, f.len(), 1_000 * MS + i as u64 * 20_000);
    }
    let (k, s) = only_flow(&t);
    assert_eq!((k.ifindex, k.direction, k.kind, k.src_port, k.dst_port), (42, direction::EGRESS, flow_kind::ROCEV2, 49152, 4791));
    assert_eq!(s.packets, report.packets_sent);
    assert_eq!(s.bytes, report.l3_bytes);
    assert_eq!(s.payload_bytes, report.udp_payload_bytes);
    assert_eq!((s.roce_psn_gap_events, s.roce_psn_gap_packets), (report.psn_gaps, report.skipped_psns));
    assert_eq!((s.roce_cnps, s.roce_naks, s.ce_marks), (report.cnps, report.naks, report.ce_marked));
    assert_eq!(s.roce_psn_out_of_order, 0);
    assert_eq!(t.counters, MirrorCounters { seen: report.packets_sent, parsed: report.packets_sent, matched: report.packets_sent, ..Default::default() });
    // 20 µs apart, all one burst: no burst ended yet.
    let mut snap = PollSnapshot::default();
    t.merge_into(&mut snap);
    assert_eq!((snap.flows.len(), snap.events.len()), (1, 0));
}

fn bth_frame(opcode: u8, qp: u32, psn: u32, ext: &[u8]) -> Vec<u8> {
    frames::rocev2_4(H2, H0, 50000, opcode, qp, psn, ext, &[0; 16])
}

#[test]
fn psn_rules_are_the_classifiers() {
    let mut t = table();
    let mut at = 0u64;
    let mut feed = |t: &mut MirrorTable, f: Vec<u8>| {
        at += 1000;
        t.ingest(&f, f.len(), 5_000 * MS + at);
    };
    // 10, 11, 14 (gap of 2), 12 (behind: out of order, expectation stays at 15), 15, then a new
    // QP resynchronises without a gap, a read request leaves the expectation invalid, and after
    // it any PSN is taken as the reference.
    for psn in [10, 11, 14, 12, 15] {
        feed(&mut t, bth_frame(0x0a, 7, psn, &[]));
    }
    feed(&mut t, bth_frame(0x0a, 8, 500, &[]));
    feed(&mut t, bth_frame(RC_RDMA_READ_REQUEST, 8, 501, &[]));
    feed(&mut t, bth_frame(0x0a, 8, 900, &[]));
    // PSN wrap on a third QP: 0xffffff then 0 is in order.
    feed(&mut t, bth_frame(0x0a, 9, 0xff_ffff, &[]));
    feed(&mut t, bth_frame(0x0a, 9, 0, &[]));
    // CNP and ACKs are outside the sequence; a NAK counts, an RNR NAK and a plain ACK do not.
    feed(&mut t, bth_frame(wire::bth_opcode::CNP, 8, 77, &[]));
    feed(&mut t, bth_frame(wire::bth_opcode::RC_ACK, 8, 3, &frames::aeth(wire::AETH_SYNDROME_NAK | 1, 0)));
    feed(&mut t, bth_frame(wire::bth_opcode::RC_ACK, 8, 3, &frames::aeth(wire::AETH_SYNDROME_RNR_NAK, 0)));
    feed(&mut t, bth_frame(wire::bth_opcode::RC_ACK, 8, 3, &frames::aeth(0, 0)));
    feed(&mut t, bth_frame(RC_ATOMIC_ACK, 8, 3, &frames::aeth(0, 0)));
    let (k, s) = only_flow(&t);
    assert_eq!(k.direction, direction::INGRESS, "the source 10.77.0.3 is not local");
    // One gap (14 after 11): 900 after the read request resynchronised instead of counting 398.
    assert_eq!((s.roce_psn_gap_events, s.roce_psn_gap_packets), (1, 2));
    assert_eq!(s.roce_psn_out_of_order, 1, "12 after 14");
    assert_eq!((s.roce_cnps, s.roce_naks), (1, 1));
    assert_eq!(track::psn(s.roce_psn), Some((1, 9)), "0 after 0xffffff was in order");
}

#[test]
fn bursts_end_after_the_gap_and_become_events() {
    let mut t = table();
    let f = bth_frame(0x0a, 1, 1, &[]);
    let l3 = frame::parse(&f, f.len()).unwrap().l3_bytes as u64;
    for (i, now) in [10 * MS, 10 * MS + 500_000, 12 * MS, 12 * MS + 100, 12 * MS + 50].into_iter().enumerate() {
        let f = bth_frame(0x0a, 1, 1 + i as u32, &[]);
        t.ingest(&f, f.len(), now);
    }
    let (_, s) = only_flow(&t);
    assert_eq!((s.first_seen_ns, s.burst_start_ns, s.last_seen_ns), (10 * MS, 12 * MS, 12 * MS + 100), "a timestamp going back does not move last_seen");
    assert_eq!((s.burst_start_packets, s.burst_start_bytes), (2, 2 * l3));
    let mut snap = PollSnapshot::default();
    t.merge_into(&mut snap);
    assert_eq!(snap.events.len(), 1);
    let e = snap.events[0];
    assert_eq!((e.kind, e.key.ifindex, e.burst), (event_kind::BURST_END, 42, BurstState { start_ns: 10 * MS, last_ns: 10 * MS + 500_000, bytes: 2 * l3, packets: 2 }));
    let mut again = PollSnapshot::default();
    t.merge_into(&mut again);
    assert!(again.events.is_empty(), "events are handed over once");
}

#[test]
fn tcp_rules_and_the_match_rule() {
    let tcp = |seq: u32, ack: u32, flags: u8, len: usize| {
        frames::tcp4(H0, H2, 40000, 29500, seq, ack, flags, 0, &vec![0; len])
    };
    let ranges = crate::config::MatchSettings {
        tcp_ports: vec!["29500".parse().unwrap()],
        ..crate::config::MatchSettings::from_file(None)
    };
    let cfg = ranges.kernel_config(Duration::from_millis(1)).unwrap();
    let mut t = MirrorTable::new(42, &settings(), FlowMatch::new(cfg, Vec::new()));
    for (i, f) in [
        tcp(1000, 0, wire::TCP_SYN, 0),
        tcp(1001, 5, wire::TCP_ACK, 100),
        tcp(1101, 5, wire::TCP_ACK, 100),
        tcp(1001, 5, wire::TCP_ACK, 100), // retransmission
        tcp(1201, 9, wire::TCP_ACK, 0),   // pure ACK
        // Pure ACKs with SACK blocks, Linux's layout: a D-SACK (below the ACK), and a hole.
        frames::tcp4_with_options(H0, H2, 40000, 29500, 1201, 9, wire::TCP_ACK, &frames::linux_ack_options(Some((1, 2)), &[(3, 7)]), &[]),
        frames::tcp4_with_options(H0, H2, 40000, 29500, 1201, 9, wire::TCP_ACK, &frames::linux_ack_options(Some((1, 2)), &[(20, 30)]), &[]),
        tcp(1201, 9, wire::TCP_ACK | wire::TCP_FIN, 0),
    ]
    .into_iter()
    .enumerate()
    {
        t.ingest(&f, f.len(), MS + i as u64);
    }
    let (k, s) = only_flow(&t);
    assert_eq!((k.kind, k.direction), (flow_kind::TCP, direction::EGRESS));
    assert_eq!((s.tcp_syn, s.tcp_fin, s.tcp_retrans, s.tcp_pure_acks, s.tcp_dsacks), (1, 1, 1, 3, 1));
    assert_eq!(s.payload_bytes, 300);
    // Another port is parsed but not matched; with no config at all only RoCEv2 matches.
    let other = frames::tcp4(H0, H2, 40000, 80, 1, 0, wire::TCP_ACK, 0, &[]);
    t.ingest(&other, other.len(), 2 * MS);
    assert_eq!((t.len(), t.counters.parsed, t.counters.matched), (1, 9, 8));
    let mut bare = MirrorTable::new(42, &settings(), FlowMatch::default());
    let f = tcp(1, 0, wire::TCP_SYN, 0);
    bare.ingest(&f, f.len(), MS);
    let r = bth_frame(0x0a, 1, 1, &[]);
    bare.ingest(&r, r.len(), MS);
    assert_eq!((bare.counters.parsed, bare.counters.matched), (2, 1));
    // Prefixes: a flow with neither end in them is not matched.
    let prefixes = vec!["10.99.0.0/16".parse::<crate::config::PrefixSpec>().unwrap().to_key()];
    let mut p = MirrorTable::new(42, &settings(), FlowMatch::new(Config { n_prefixes: 1, ..cfg }, prefixes));
    let f = tcp(1, 0, wire::TCP_SYN, 0);
    p.ingest(&f, f.len(), MS);
    assert_eq!(p.counters.matched, 0);
}

#[test]
fn bounded_table_counts_what_it_refuses_and_forgets_on_request() {
    let mut t = MirrorTable::new(42, &MirrorSettings { max_flows: 2, ..settings() }, FlowMatch::default());
    for port in [1u16, 2, 3, 3] {
        let f = frames::rocev2_4(H0, H2, port, 0x0a, 1, 1, &[], &[]);
        t.ingest(&f, f.len(), MS);
    }
    assert_eq!((t.len(), t.counters.matched, t.counters.table_full), (2, 2, 2));
    let mut snap = PollSnapshot::default();
    t.merge_into(&mut snap);
    let gone: Vec<FlowKey> = snap.flows.iter().map(|(k, _)| *k).take(1).collect();
    // A key of another interface is not the mirror's.
    t.forget(&[FlowKey { ifindex: 7, ..gone[0] }]);
    assert_eq!(t.len(), 2);
    t.forget(&gone);
    assert_eq!(t.len(), 1);
    let f = frames::rocev2_4(H0, H2, 3, 0x0a, 1, 1, &[], &[]);
    t.ingest(&f, f.len(), MS);
    assert_eq!(t.len(), 2, "room again after the forget");
    // Skips are counted by reason.
    t.ingest(&f[..20], f.len(), MS);
    t.ingest(&f[..20], 20, MS);
    t.ingest(&[0u8; 60], 60, MS);
    assert_eq!((t.counters.unreadable, t.counters.malformed, t.counters.unsupported), (1, 1, 1));
}

#[test]
fn pending_events_are_bounded() {
    let cfg = Config { flags: config_flags::FLOW_START_EVENTS, ..Config::default() };
    let mut t = MirrorTable::new(42, &settings(), FlowMatch::new(cfg, Vec::new()));
    for port in 0..(MAX_PENDING_EVENTS as u16 + 5) {
        let f = frames::rocev2_4(H0, H2, port, 0x0a, 1, 1, &[], &[]);
        t.ingest(&f, f.len(), MS);
    }
    assert_eq!((t.events.len(), t.counters.events_dropped), (MAX_PENDING_EVENTS, 5));
}

#[test]
fn prefixes_match_by_bits() {
    let key = |s: &str| s.parse::<crate::config::PrefixSpec>().unwrap().to_key();
    let a = dataplane_common::ipv4_mapped([10, 77, 0, 129]);
    assert!(in_prefixes(&[key("10.77.0.128/25")], &a));
    assert!(!in_prefixes(&[key("10.77.0.0/25")], &a));
    assert!(in_prefixes(&[key("10.0.0.0/8")], &a));
    assert!(!in_prefixes(&[key("fd77::/16")], &a));
    assert!(!in_prefixes(&[], &a));
}

#[test]
fn missing_interface_and_double_attachment_are_refused_with_advice() {
    let stop = Arc::new(AtomicBool::new(false));
    let e = start(&MirrorSettings::new("no-such-if0".into()), FlowMatch::default(), &[], stop.clone()).unwrap_err().to_string();
    assert!(e.contains("no-such-if0") && e.contains("ip link show"), "{e}");
    let e = start(&MirrorSettings::new("eth0".into()), FlowMatch::default(), &["eth0".into()], stop).unwrap_err().to_string();
    assert!(e.contains("counted twice"), "{e}");
}
