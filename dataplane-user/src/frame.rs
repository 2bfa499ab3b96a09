//! The flow monitor's header parser, in user space: one captured Ethernet frame → one outcome.
//!
//! The mirror ingest ([`crate::mirror`]) reads frames the host kernel never classified (RoCE that a
//! NIC or DPU handled in hardware, mirrored to a port the agent reads) and must count exactly what
//! the eBPF classifier counts on the TC path. So this module is a transcription of
//! `dataplane-ebpf/src/parse.rs`, rule for rule, over a byte slice instead of an skb:
//!
//! - Ethernet, then at most two VLAN tags (802.1Q, or 802.1ad outer + 802.1Q inner); a third tag
//!   leaves a VLAN EtherType, which is not IP: unsupported.
//! - IPv4: version 4 or malformed; IHL ≥ 5 or malformed; any fragment (MF set or an offset) is
//!   unsupported; TCP and UDP only, else unsupported; total length 0 means "the frame's length"
//!   (BIG TCP); a total length below the header or above what the frame holds is malformed.
//! - IPv6: version 6 or malformed; the next header must be TCP or UDP (extension headers are not
//!   walked: unsupported); payload length 0 means "the frame's length"; beyond the frame: malformed.
//! - TCP: data offset ≥ 5 words and within the IP payload, else malformed.
//! - UDP: length ≥ 8 and within the IP payload, else malformed. Destination port 4791 is RoCEv2:
//!   the 12-byte BTH must be there (else malformed), and for an RC ACK (opcode 0x11) the 4-byte
//!   AETH too. PSN and destination QP are the low 24 bits of their words.
//!
//! Every frame gets exactly one [`Outcome`], and no input panics (proptested below). Field reads go
//! through `smoltcp::wire`'s packet types (`EthernetFrame`, `Ipv4Packet`, `Ipv6Packet`,
//! `TcpPacket`, `UdpPacket`), built with `new_unchecked` *after* the bounds check of this module,
//! because the eBPF rules differ from smoltcp's `check_len` in two places the two paths must
//! agree on: a length field of 0 (BIG TCP) and a capture cut short by the snap length (the
//! kernel's rule compares lengths with the packet's length, not with the bytes at hand). smoltcp has
//! no VLAN, BTH or AETH types; those are read here with `dataplane_common::wire`'s offsets.
//!
//! Captured vs wire length: a mirror socket may keep only the first bytes of a frame (the snap
//! length) while the socket reports the frame's real length. Lengths are checked against the
//! real length, as the kernel checks them against the skb's; a header that lies past the captured
//! bytes but inside the frame is [`Skip::Unreadable`] (the capture cut it: the kernel's analogue
//! is a failed `bpf_skb_pull_data`), past the frame itself it is [`Skip::Malformed`].
use dataplane_common::{flow_kind, wire, FlowKey, ROCEV2_UDP_PORT};
use smoltcp::wire::{EthernetFrame, Ipv4Packet, Ipv6Packet, TcpPacket, UdpPacket};

/// Why a frame was not parsed down to a transport header (each is one counter, as in `STATS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Skip {
    /// Headers truncated or inconsistent.
    Malformed,
    /// Skipped by design: non-IP, fragments, IPv6 extension headers, other L4.
    Unsupported,
    /// The headers lie beyond the captured bytes (snap length too short for this frame).
    Unreadable,
}

/// Whether a TCP header (`h`, options included) without payload carries a D-SACK, by the
/// classifier's rule (`dataplane-ebpf` `parse::dsack`): a SACK option after two NOPs, first or
/// right after Linux's NOP NOP timestamp, whose first block starts before the ACK number. Not
/// smoltcp's option walk: a SACK elsewhere would then count here and not in the kernel.
fn dsack(h: &[u8], ack: u32) -> bool {
    const TS_LEAD: [u8; 4] = [wire::TCP_OPT_NOP, wire::TCP_OPT_NOP, 8, 10];
    let min = wire::TCP_MIN_HLEN;
    let at = if h.len() >= min + 24 && h[min..min + 4] == TS_LEAD {
        min + 12
    } else if h.len() >= min + 12 {
        min
    } else {
        return false;
    };
    let o = &h[at..at + 12];
    if o[..3] != [wire::TCP_OPT_NOP, wire::TCP_OPT_NOP, wire::TCP_OPT_SACK] || o[3] < 10 {
        return false;
    }
    let left = u32::from_be_bytes([o[4], o[5], o[6], o[7]]);
    (ack.wrapping_sub(left) as i32) > 0
}

/// The TCP fields the monitor uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpInfo {
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// A segment without payload whose SACK option's first block starts before `ack`: a D-SACK
    /// (RFC 2883), read as the classifier reads it ([`dsack`]).
    pub dsack: bool,
}

/// The BTH (and AETH) fields the monitor uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bth {
    pub opcode: u8,
    /// AETH syndrome for RC ACK (opcode 0x11), else 0.
    pub syndrome: u8,
    pub dest_qp: u32,
    pub psn: u32,
}

/// A parsed frame: what the classifier's `Packet` holds, for one wire frame (a mirror sees wire
/// frames, never GSO super-packets, so there is no segment count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// The flow key; `ifindex` and `direction` are 0 (the caller's to fill in).
    pub key: FlowKey,
    /// ECN codepoint (two bits) of the IP header.
    pub ecn: u8,
    /// L3 bytes: the IP header's length field (or the frame's length from L3 on when it is 0).
    pub l3_bytes: u32,
    /// Transport payload bytes (TCP payload, or UDP length minus 8).
    pub payload_bytes: u32,
    /// TCP fields when `key.kind == flow_kind::TCP`, else zero.
    pub tcp: TcpInfo,
    /// BTH fields when `key.kind == flow_kind::ROCEV2`, else zero.
    pub bth: Bth,
}

/// What became of one frame.
pub type Outcome = Result<Packet, Skip>;

/// The bytes at hand and the frame's real length.
struct Frame<'a> {
    bytes: &'a [u8],
    wire_len: usize,
}

impl<'a> Frame<'a> {
    /// `len` bytes at `off`, checked as the classifier's `ptr_at` checks them.
    fn need(&self, off: usize, len: usize) -> Result<&'a [u8], Skip> {
        let end = off.checked_add(len).ok_or(Skip::Malformed)?;
        if end <= self.bytes.len() {
            Ok(&self.bytes[off..])
        } else if end <= self.wire_len {
            Err(Skip::Unreadable)
        } else {
            Err(Skip::Malformed)
        }
    }
}

fn is_vlan(ethertype: u16) -> bool {
    ethertype == wire::ETH_P_8021Q || ethertype == wire::ETH_P_8021AD
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

/// Parses one frame. `bytes` are the captured bytes, `wire_len` the frame's length on the wire
/// (at least `bytes.len()`; a smaller value is taken as `bytes.len()`).
pub fn parse(bytes: &[u8], wire_len: usize) -> Outcome {
    let f = Frame { bytes, wire_len: wire_len.max(bytes.len()) };

    // --- Ethernet, up to two VLAN tags ---
    let eth = EthernetFrame::new_unchecked(f.need(0, wire::ETH_HLEN)?);
    let mut ethertype = u16::from(eth.ethertype());
    let mut l3_off = wire::ETH_HLEN;
    for _ in 0..2 {
        if !is_vlan(ethertype) {
            break;
        }
        let tag = f.need(l3_off, wire::VLAN_HLEN)?;
        ethertype = be16(tag, 2);
        l3_off += wire::VLAN_HLEN;
    }
    let l3_avail = f.wire_len - l3_off;

    // --- IPv4 / IPv6 ---
    let (protocol, l3_hlen, l3_len, l4_off, src, dst, ecn) = if ethertype == wire::ETH_P_IP {
        let ip = Ipv4Packet::new_unchecked(f.need(l3_off, wire::IPV4_MIN_HLEN)?);
        if ip.version() != 4 {
            return Err(Skip::Malformed);
        }
        let ihl = usize::from(ip.header_len());
        if ihl < wire::IPV4_MIN_HLEN {
            return Err(Skip::Malformed);
        }
        if ip.more_frags() || ip.frag_offset() != 0 {
            return Err(Skip::Unsupported);
        }
        let proto = u8::from(ip.next_header());
        if proto != wire::IPPROTO_TCP && proto != wire::IPPROTO_UDP {
            return Err(Skip::Unsupported);
        }
        let tot_len = usize::from(ip.total_len());
        let l3_len = if tot_len == 0 { l3_avail } else { tot_len };
        if l3_len < ihl || l3_len > l3_avail {
            return Err(Skip::Malformed);
        }
        let src = dataplane_common::ipv4_mapped(ip.src_addr().octets());
        let dst = dataplane_common::ipv4_mapped(ip.dst_addr().octets());
        (proto, ihl, l3_len, l3_off + ihl, src, dst, ip.ecn() & wire::ECN_MASK)
    } else if ethertype == wire::ETH_P_IPV6 {
        let ip = Ipv6Packet::new_unchecked(f.need(l3_off, wire::IPV6_HLEN)?);
        if ip.version() != 6 {
            return Err(Skip::Malformed);
        }
        let next = u8::from(ip.next_header());
        if next != wire::IPPROTO_TCP && next != wire::IPPROTO_UDP {
            return Err(Skip::Unsupported);
        }
        let payload = usize::from(ip.payload_len());
        let l3_len = if payload == 0 { l3_avail } else { wire::IPV6_HLEN + payload };
        if l3_len < wire::IPV6_HLEN || l3_len > l3_avail {
            return Err(Skip::Malformed);
        }
        let ecn = ip.traffic_class() & wire::ECN_MASK;
        (next, wire::IPV6_HLEN, l3_len, l3_off + wire::IPV6_HLEN, ip.src_addr().octets(), ip.dst_addr().octets(), ecn)
    } else {
        return Err(Skip::Unsupported);
    };
    let l4_len = l3_len - l3_hlen;

    // --- TCP / UDP / RoCEv2 ---
    let (src_port, dst_port, kind, payload_bytes, tcp, bth) = if protocol == wire::IPPROTO_TCP {
        let t = TcpPacket::new_unchecked(f.need(l4_off, wire::TCP_MIN_HLEN)?);
        let doff = usize::from(t.header_len());
        if doff < wire::TCP_MIN_HLEN || doff > l4_len {
            return Err(Skip::Malformed);
        }
        let raw = f.need(l4_off, wire::TCP_MIN_HLEN)?;
        let ack = t.ack_number().0 as u32;
        // Options beyond the captured bytes (a short snap length) are not read: no D-SACK then.
        let dsack = l4_len == doff && f.need(l4_off, doff).ok().is_some_and(|h| dsack(h, ack));
        let info = TcpInfo { seq: t.seq_number().0 as u32, ack, flags: raw[wire::TCP_FLAGS_OFF], dsack };
        (t.src_port(), t.dst_port(), flow_kind::TCP, l4_len - doff, info, Bth::default())
    } else {
        let u = UdpPacket::new_unchecked(f.need(l4_off, wire::UDP_HLEN)?);
        let ulen = usize::from(u.len());
        if ulen < wire::UDP_HLEN || ulen > l4_len {
            return Err(Skip::Malformed);
        }
        let dst_port = u.dst_port();
        let (kind, bth) = if dst_port == ROCEV2_UDP_PORT {
            let b = f.need(l4_off + wire::UDP_HLEN, wire::BTH_LEN)?;
            let opcode = b[wire::BTH_OPCODE_OFF];
            let syndrome = if opcode == wire::bth_opcode::RC_ACK {
                f.need(l4_off + wire::UDP_HLEN + wire::BTH_LEN, wire::AETH_LEN)?[0]
            } else {
                0
            };
            let bth = Bth { opcode, syndrome, dest_qp: be24(b, wire::BTH_DEST_QP_OFF), psn: be24(b, wire::BTH_PSN_OFF) };
            (flow_kind::ROCEV2, bth)
        } else {
            (flow_kind::UDP, Bth::default())
        };
        (u.src_port(), dst_port, kind, ulen - wire::UDP_HLEN, TcpInfo::default(), bth)
    };
    Ok(Packet {
        key: FlowKey { src_addr: src, dst_addr: dst, src_port, dst_port, ifindex: 0, protocol, direction: 0, kind, _pad: 0 },
        ecn,
        l3_bytes: l3_len as u32,
        payload_bytes: payload_bytes as u32,
        tcp,
        bth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringside_test_support::frames::{self, VlanTag, MAC_A, MAC_B};
    use std::net::Ipv6Addr;

    const A: [u8; 4] = [10, 77, 0, 1];
    const B: [u8; 4] = [10, 77, 0, 3];

    fn whole(f: &[u8]) -> Outcome {
        parse(f, f.len())
    }

    /// A RoCEv2 frame as the testbed generator lays out its UDP payload.
    fn roce_frame(kind: testbed::roce::PacketKind, opcode: u8, psn: u32, tags: &[VlanTag]) -> Vec<u8> {
        let spec = testbed::RoceSpec { to: "10.77.0.3:4791".parse().unwrap(), dest_qp: 0x12_3456, payload_len: 64, ..Default::default() };
        let p = testbed::roce::PlannedPacket { kind, opcode, psn, ce: false, ack_req: false };
        let mut payload = Vec::new();
        testbed::roce::encode(&spec, &p, &mut payload);
        let udp = frames::udp(49152, ROCEV2_UDP_PORT, &payload);
        let ip = frames::ipv4(A, B, wire::IPPROTO_UDP, &frames::Ipv4Opts { tos: (26 << 2) | wire::ECN_CE, ..Default::default() }, &udp);
        frames::ethernet(MAC_B, MAC_A, tags, wire::ETH_P_IP, &ip)
    }

    #[test]
    fn generator_frames_parse_to_what_the_generator_sent() {
        use testbed::roce::PacketKind;
        let data = whole(&roce_frame(PacketKind::Data, wire::bth_opcode::RC_RDMA_WRITE_ONLY, 0xab_cdef, &[])).unwrap();
        assert_eq!((data.key.kind, data.key.protocol, data.key.src_port, data.key.dst_port), (flow_kind::ROCEV2, 17, 49152, 4791));
        assert_eq!(data.key.src_addr, dataplane_common::ipv4_mapped(A));
        assert_eq!(data.key.dst_addr, dataplane_common::ipv4_mapped(B));
        assert_eq!(data.bth, Bth { opcode: 0x0a, syndrome: 0, dest_qp: 0x12_3456, psn: 0xab_cdef });
        assert_eq!(data.ecn, wire::ECN_CE);
        // 20 IP + 8 UDP + 12 BTH + 64 payload + 4 ICRC.
        assert_eq!((data.l3_bytes, data.payload_bytes), (108, 80));

        let nak = whole(&roce_frame(PacketKind::Nak, wire::bth_opcode::RC_ACK, 7, &[VlanTag::s_tag(5), VlanTag::c_tag(6)])).unwrap();
        assert_eq!((nak.bth.opcode, nak.bth.syndrome, nak.bth.psn), (0x11, wire::AETH_SYNDROME_NAK, 7));
        let cnp = whole(&roce_frame(PacketKind::Cnp, wire::bth_opcode::CNP, 0, &[VlanTag::c_tag(9)])).unwrap();
        assert_eq!(cnp.bth.opcode, 0x81);
    }

    #[test]
    fn tcp_and_ipv6() {
        let seg = frames::tcp(40000, 29500, 0xdead_beef, 0x0102_0304, wire::TCP_ACK | wire::TCP_PSH, &[7u8; 100]);
        let ip = frames::ipv6(Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1).octets(), Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2).octets(), wire::IPPROTO_TCP, 0b01, &seg);
        let p = whole(&frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &ip)).unwrap();
        assert_eq!((p.key.kind, p.key.protocol, p.key.src_port, p.key.dst_port), (flow_kind::TCP, 6, 40000, 29500));
        assert_eq!(p.tcp, TcpInfo { seq: 0xdead_beef, ack: 0x0102_0304, flags: wire::TCP_ACK | wire::TCP_PSH, dsack: false });
        assert_eq!((p.l3_bytes, p.payload_bytes, p.ecn), (40 + 20 + 100, 100, 0b01));
    }

    #[test]
    fn outcomes_follow_the_classifier_rules() {
        use testbed::roce::PacketKind;
        let good = roce_frame(PacketKind::Data, 0x0a, 1, &[]);
        // Too short for Ethernet, for IPv4, for the BTH.
        assert_eq!(whole(&good[..13]), Err(Skip::Malformed));
        assert_eq!(whole(&good[..30]), Err(Skip::Malformed));
        let mut short_bth = good.clone();
        // UDP length and IP total length say "8 bytes of BTH": the BTH does not fit the frame.
        short_bth.truncate(14 + 20 + 8 + 8);
        short_bth[14 + 2..14 + 4].copy_from_slice(&(20u16 + 16).to_be_bytes());
        short_bth[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&16u16.to_be_bytes());
        assert_eq!(whole(&short_bth), Err(Skip::Malformed));
        // The same bytes cut by a snap length: unreadable, not malformed.
        assert_eq!(parse(&good[..40], good.len()), Err(Skip::Unreadable));
        // ARP, a third VLAN tag, an IPv4 fragment, ICMP: unsupported.
        assert_eq!(whole(&frames::ethernet(MAC_B, MAC_A, &[], 0x0806, &[0; 28])), Err(Skip::Unsupported));
        let three = [VlanTag::s_tag(1), VlanTag::c_tag(2), VlanTag::c_tag(3)];
        assert_eq!(whole(&roce_frame(PacketKind::Data, 0x0a, 1, &three)), Err(Skip::Unsupported));
        let mut frag = good.clone();
        frag[14 + 6] |= 0x20; // MF
        assert_eq!(whole(&frag), Err(Skip::Unsupported));
        let mut icmp = good.clone();
        icmp[14 + 9] = 1;
        assert_eq!(whole(&icmp), Err(Skip::Unsupported));
        // IPv4 version 5, IHL 4, total length beyond the frame: malformed.
        let mut v = good.clone();
        v[14] = 0x55;
        assert_eq!(whole(&v), Err(Skip::Malformed));
        let mut ihl = good.clone();
        ihl[14] = 0x44;
        assert_eq!(whole(&ihl), Err(Skip::Malformed));
        let mut long = good.clone();
        long[14 + 2..14 + 4].copy_from_slice(&2000u16.to_be_bytes());
        assert_eq!(whole(&long), Err(Skip::Malformed));
        // Total length 0 (BIG TCP): the frame's length is taken.
        let mut zero = good.clone();
        zero[14 + 2..14 + 4].copy_from_slice(&0u16.to_be_bytes());
        assert_eq!(whole(&zero).unwrap().l3_bytes as usize, good.len() - 14);
        // Ethernet padding after the IP packet is not counted.
        let mut padded = good.clone();
        padded.extend_from_slice(&[0; 10]);
        assert_eq!(whole(&padded).unwrap().l3_bytes, 108);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn seeds() -> Vec<Vec<u8>> {
            use testbed::roce::PacketKind;
            let seg = frames::tcp(1, 2, 3, 4, wire::TCP_SYN, &[1; 20]);
            let v6 = frames::ipv6(Ipv6Addr::LOCALHOST.octets(), Ipv6Addr::LOCALHOST.octets(), wire::IPPROTO_TCP, 0, &seg);
            vec![
                roce_frame(PacketKind::Data, 0x0a, 5, &[]),
                roce_frame(PacketKind::Nak, 0x11, 5, &[VlanTag::c_tag(1)]),
                roce_frame(PacketKind::Cnp, 0x81, 0, &[VlanTag::s_tag(1), VlanTag::c_tag(2)]),
                frames::ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IPV6, &v6),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

            /// Random bytes with any claimed wire length: one outcome, no panic, and a parsed
            /// packet never claims more L3 bytes than the frame has.
            #[test]
            fn random_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), extra in 0usize..3000) {
                if let Ok(p) = parse(&bytes, bytes.len() + extra) {
                    prop_assert!(p.l3_bytes as usize <= bytes.len() + extra);
                    prop_assert!(p.payload_bytes <= p.l3_bytes);
                }
            }

            /// Generator frames with bytes flipped, the frame cut or extended: one outcome, no panic;
            /// cut inside the captured headers with the real length kept, never `Malformed` for a
            /// frame that parses whole.
            #[test]
            fn mutated_frames_never_panic(which in 0usize..4, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6), cut in any::<usize>(), grow in 0usize..40) {
                let mut f = seeds()[which].clone();
                for (at, x) in flips {
                    let i = at % f.len();
                    f[i] ^= x;
                }
                let whole_outcome = parse(&f, f.len());
                let cut = cut % (f.len() + 1);
                let snapped = parse(&f[..cut], f.len());
                if whole_outcome.is_ok() {
                    prop_assert!(snapped.is_ok() || snapped == Err(Skip::Unreadable), "{snapped:?}");
                }
                f.extend(std::iter::repeat_n(0u8, grow));
                let _ = parse(&f, f.len());
            }
        }
    }
}
