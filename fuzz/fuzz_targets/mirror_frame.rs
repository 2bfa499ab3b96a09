//! The agent's mirrored-frame ingest: `dataplane_user::frame::parse` (Ethernet, up to two VLAN
//! tags, IPv4/IPv6, TCP/UDP, RoCEv2 BTH/AETH; the user-space twin of the classifier's parser, over
//! `dataplane_common::wire`'s offsets) and `mirror::MirrorTable::ingest`, which counts every frame.
//!
//! Input: frames, each `len (u16 LE) | extra (u8) | len bytes` (a short last frame takes what is
//! left). `extra * 8` bytes are added to the frame's wire length: the capture was cut by a snap
//! length. `extra` also advances the clock, by `extra * 20 µs`, so frames fall into one burst or
//! end one.
//!
//! Checked, per frame (module docs of `frame.rs`):
//! - one outcome, no panic; `Unreadable` only for a frame longer than its capture;
//! - a parsed packet's lengths lie in the frame: Ethernet + L3 bytes within the wire length,
//!   payload within L3 bytes minus the smallest IP and transport headers;
//! - fields in their ranges: 24-bit PSN and QP, 2-bit ECN, a syndrome only on an RC ACK, D-SACK
//!   only without payload, the kind matches protocol and port, TCP/BTH fields zero for the other
//!   kinds, `ifindex`/`direction`/`_pad` zero;
//! - the same frame cut shorter by a snap length (real length kept) gives the same packet (a
//!   D-SACK in options past the cut aside) or `Unreadable`, never `Malformed`/`Unsupported`.
//! Over all frames, through a `MirrorTable` that matches every port: every frame counted once
//! (`seen` = parsed + malformed + unsupported + unreadable), every parsed frame either counted in
//! its flow or as `table_full`, and each flow's packets and bytes are the sums of its frames.
#![no_main]

use std::collections::HashMap;

use dataplane_common::{direction, flow_kind, wire, Config, FlowKey, PortRange, ROCEV2_UDP_PORT};
use dataplane_user::frame::{parse, Bth, Packet, Skip, TcpInfo};
use dataplane_user::mirror::{FlowMatch, MirrorSettings, MirrorTable};
use libfuzzer_sys::fuzz_target;

/// Small, so that the fuzzer reaches a full table.
const MAX_FLOWS: usize = 4;
const IFINDEX: u32 = 7;
/// Smallest IPv4 header + UDP header: the least a parsed UDP/RoCEv2 packet's L3 bytes hold
/// besides its payload (TCP needs 40).
const MIN_UDP_OVERHEAD: u32 = (wire::IPV4_MIN_HLEN + wire::UDP_HLEN) as u32;
const MIN_TCP_OVERHEAD: u32 = (wire::IPV4_MIN_HLEN + wire::TCP_MIN_HLEN) as u32;

fn check_packet(p: &Packet, wire_len: usize) {
    assert!(wire::ETH_HLEN + p.l3_bytes as usize <= wire_len, "{p:?} in {wire_len} bytes");
    assert!(p.ecn <= wire::ECN_MASK);
    let k = &p.key;
    assert_eq!((k.ifindex, k.direction, k._pad), (0, 0, 0));
    match k.kind {
        flow_kind::TCP => {
            assert_eq!(k.protocol, wire::IPPROTO_TCP);
            assert_eq!(p.bth, Bth::default());
            assert!(p.payload_bytes + MIN_TCP_OVERHEAD <= p.l3_bytes, "{p:?}");
            assert!(!p.tcp.dsack || p.payload_bytes == 0, "a D-SACK is read only from a segment without payload: {p:?}");
        }
        flow_kind::UDP | flow_kind::ROCEV2 => {
            assert_eq!(k.protocol, wire::IPPROTO_UDP);
            assert_eq!(p.tcp, TcpInfo::default());
            assert!(p.payload_bytes + MIN_UDP_OVERHEAD <= p.l3_bytes, "{p:?}");
            if k.kind == flow_kind::ROCEV2 {
                assert_eq!(k.dst_port, ROCEV2_UDP_PORT);
                // Not checked: that the BTH lies inside the UDP length. As the classifier, the
                // parser only asks for it inside the frame (an empty datagram to 4791 followed by
                // Ethernet padding reads its BTH from the padding).
                assert!(p.bth.psn <= wire::PSN_MASK && p.bth.dest_qp <= wire::PSN_MASK, "{p:?}");
                assert!(p.bth.syndrome == 0 || p.bth.opcode == wire::bth_opcode::RC_ACK, "{p:?}");
            } else {
                assert_ne!(k.dst_port, ROCEV2_UDP_PORT);
                assert_eq!(p.bth, Bth::default());
            }
        }
        other => panic!("kind {other} out of range: {p:?}"),
    }
}

/// A snap length cutting the capture at `cut` keeps the outcome, or makes it `Unreadable`.
fn check_cut(bytes: &[u8], wire_len: usize, whole: &Result<Packet, Skip>, cut: usize) {
    let cut = cut.min(bytes.len());
    let snapped = parse(&bytes[..cut], wire_len);
    match (whole, &snapped) {
        (_, Err(Skip::Unreadable)) => {}
        (Ok(p), Ok(q)) => {
            // Options past the cut are not read: a D-SACK may go, never appear.
            assert!(!q.tcp.dsack || p.tcp.dsack, "cut at {cut}: {p:?} became {q:?}");
            let q = Packet { tcp: TcpInfo { dsack: p.tcp.dsack, ..q.tcp }, ..*q };
            assert_eq!(*p, q, "cut at {cut} of {} ({wire_len} on the wire)", bytes.len());
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "cut at {cut} of {} ({wire_len} on the wire)", bytes.len()),
        _ => panic!("cut at {cut} of {} ({wire_len} on the wire): {whole:?} became {snapped:?}", bytes.len()),
    }
}

/// What the table must hold for one flow.
#[derive(Default)]
struct Expected {
    packets: u64,
    bytes: u64,
    payload_bytes: u64,
}

fuzz_target!(|data: &[u8]| {
    // Port range 0-65535 for both protocols: every parsed frame matches, as a config that
    // tracks all traffic would.
    let mut config = Config { n_port_ranges: 1, flags: 3, ..Config::default() };
    config.port_ranges[0] = PortRange { lo: 0, hi: u16::MAX, protocol: 0, _pad: [0; 3] };
    let settings = MirrorSettings { max_flows: MAX_FLOWS, ..MirrorSettings::new("fuzz0".into()) };
    let mut table = MirrorTable::new(IFINDEX, &settings, FlowMatch::new(config, Vec::new()));
    let mut want: HashMap<FlowKey, Expected> = HashMap::new();
    let (mut frames, mut parsed, mut table_full) = (0u64, 0u64, 0u64);
    let mut now = 1_000_000_000u64;

    let mut rest = data;
    while rest.len() >= 3 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 3);
        let extra = rest[2];
        let bytes = &rest[3..3 + len];
        rest = &rest[3 + len..];
        let wire_len = len + usize::from(extra) * 8;
        now += u64::from(extra) * 20_000;
        frames += 1;

        let outcome = parse(bytes, wire_len);
        match &outcome {
            Ok(p) => check_packet(p, wire_len),
            Err(Skip::Unreadable) => assert!(bytes.len() < wire_len, "unreadable yet the whole frame is at hand"),
            Err(_) => {}
        }
        for cut in [usize::from(extra), len / 2, len.saturating_sub(1), 54] {
            check_cut(bytes, wire_len, &outcome, cut);
        }

        table.ingest(bytes, wire_len, now);
        if let Ok(p) = outcome {
            parsed += 1;
            let key = FlowKey { ifindex: IFINDEX, direction: direction::INGRESS, ..p.key };
            if want.len() >= MAX_FLOWS && !want.contains_key(&key) {
                table_full += 1;
                continue;
            }
            let e = want.entry(key).or_default();
            e.packets += 1;
            e.bytes += u64::from(p.l3_bytes);
            e.payload_bytes += u64::from(p.payload_bytes);
        }
    }

    let c = table.counters;
    assert_eq!(c.seen, frames);
    assert_eq!(c.seen, c.parsed + c.malformed + c.unsupported + c.unreadable, "{c:?}");
    assert_eq!((c.parsed, c.table_full), (parsed, table_full), "{c:?}");
    assert_eq!(c.matched + c.table_full, c.parsed, "{c:?}");
    assert_eq!(table.len(), want.len());
    for (key, s) in table.flows() {
        let e = want.get(&key).unwrap_or_else(|| panic!("a flow no frame made: {key:?}"));
        assert_eq!((s.packets, s.bytes, s.payload_bytes), (e.packets, e.bytes, e.payload_bytes), "{key:?}");
        assert!(s.ce_marks <= s.packets && s.tcp_retrans <= s.packets && s.tcp_dsacks <= s.tcp_pure_acks, "{s:?}");
        assert!(s.first_seen_ns <= s.last_seen_ns && s.burst_start_ns <= s.last_seen_ns, "{s:?}");
    }
});
