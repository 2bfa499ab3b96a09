//! Builders for the frames the T1 tests and the benchmark feed to the flow monitor.
//!
//! Pure functions from header parameters to bytes, one per header, composed by the caller
//! (`ethernet(.., ipv4(.., tcp(..)))`). The Ethernet, IPv4, IPv6, TCP and UDP headers are laid
//! out by `smoltcp::wire`'s packet types, and every checksum is real: the IPv4 header checksum,
//! and the TCP and UDP checksums over the IPv4/IPv6 pseudo-header. A transport header does not
//! know its addresses, so [`tcp`] and [`udp`] leave the checksum 0 and the IP builder that wraps
//! them ([`ipv4`], [`ipv6`]) fills it in: when the protocol (after any IPv6 hop-by-hop,
//! routing or destination options headers) is TCP or UDP, the packet is not an IPv4 fragment,
//! and the payload holds a whole header of that protocol. Anything else (ICMP, fragments, the
//! truncated or inconsistent segments the T1 tests build on purpose) is left as given.
//!
//! What smoltcp does not build stays hand-written on `dataplane_common::wire`'s field constants:
//! 802.1Q/802.1ad tags, the InfiniBand BTH and AETH of RoCEv2, and IPv4 options (smoltcp emits
//! option-less IPv4 headers; the builder writes the options and smoltcp checksums the header).
//! The unit tests below pin the bytes to fixtures whose checksums were computed independently
//! (RFC 1071 in Python, and a header from the literature).
use std::net::{Ipv4Addr, Ipv6Addr};

use dataplane_common::wire;
use smoltcp::wire::{
    EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpAddress, IpProtocol, Ipv4Packet, Ipv6Packet,
    Ipv6Repr, TcpPacket, TcpSeqNumber, UdpPacket,
};

/// An 802.1Q / 802.1ad tag: TPID and TCI (PCP, DEI, VLAN id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VlanTag {
    pub tpid: u16,
    pub tci: u16,
}

impl VlanTag {
    /// A customer tag (802.1Q, TPID 0x8100).
    pub fn c_tag(vid: u16) -> Self {
        Self { tpid: wire::ETH_P_8021Q, tci: vid & 0x0fff }
    }
    /// A service tag (802.1ad, TPID 0x88a8), the outer tag of a QinQ frame.
    pub fn s_tag(vid: u16) -> Self {
        Self { tpid: wire::ETH_P_8021AD, tci: vid & 0x0fff }
    }
}

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

/// Ethernet II frame: dst, src, tags (outermost first), EtherType, payload. No FCS (the kernel
/// never shows it to TC programs).
///
/// smoltcp writes the 14-byte header with the outermost TPID as its EtherType (that is what a tag
/// is on the wire); the tags' TCIs, the inner TPIDs and the real EtherType follow by hand.
pub fn ethernet(dst: [u8; 6], src: [u8; 6], tags: &[VlanTag], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let outer = tags.first().map_or(ethertype, |t| t.tpid);
    let mut rest = Vec::with_capacity(wire::VLAN_HLEN * tags.len() + payload.len());
    for (i, t) in tags.iter().enumerate() {
        rest.extend_from_slice(&t.tci.to_be_bytes());
        let next = tags.get(i + 1).map_or(ethertype, |n| n.tpid);
        rest.extend_from_slice(&next.to_be_bytes());
    }
    rest.extend_from_slice(payload);
    let repr = EthernetRepr {
        src_addr: EthernetAddress(src),
        dst_addr: EthernetAddress(dst),
        ethertype: EthernetProtocol::from(outer),
    };
    let mut f = vec![0u8; repr.buffer_len() + rest.len()];
    let mut frame = EthernetFrame::new_unchecked(&mut f[..]);
    repr.emit(&mut frame);
    frame.payload_mut().copy_from_slice(&rest);
    f
}

/// Parameters of an IPv4 header beyond addresses and protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4Opts {
    /// DSCP and ECN byte.
    pub tos: u8,
    /// Flags + fragment offset field in host order (DF = 0x4000, MF = 0x2000, offset in 8-byte
    /// units; the reserved bit 0x8000 is not written).
    pub flags_frag: u16,
    pub ttl: u8,
    pub id: u16,
    /// IP options (padded to a multiple of 4 by the builder).
    pub options: Vec<u8>,
}

impl Default for Ipv4Opts {
    fn default() -> Self {
        Self { tos: 0, flags_frag: 0x4000, ttl: 64, id: 0, options: Vec::new() }
    }
}

/// IPv4 packet with a correct total length and header checksum; a TCP or UDP payload gets its
/// checksum over the pseudo-header (see the module docs).
pub fn ipv4(src: [u8; 4], dst: [u8; 4], protocol: u8, opts: &Ipv4Opts, payload: &[u8]) -> Vec<u8> {
    let mut options = opts.options.clone();
    while options.len() % 4 != 0 {
        options.push(0); // End of Option List
    }
    let hlen = wire::IPV4_MIN_HLEN + options.len();
    assert!(hlen <= 60, "IPv4 options longer than 40 bytes");
    let total = hlen + payload.len();
    let mut p = vec![0u8; total];
    p[wire::IPV4_MIN_HLEN..hlen].copy_from_slice(&options);
    let mut packet = Ipv4Packet::new_unchecked(&mut p[..]);
    packet.set_version(4);
    packet.set_header_len(hlen as u8);
    packet.set_dscp(opts.tos >> 2);
    packet.set_ecn(opts.tos & wire::ECN_MASK);
    packet.set_total_len(total as u16);
    packet.set_ident(opts.id);
    packet.set_dont_frag(opts.flags_frag & 0x4000 != 0);
    packet.set_more_frags(opts.flags_frag & wire::IPV4_MF != 0);
    packet.set_frag_offset((opts.flags_frag & wire::IPV4_FRAG_MASK) << 3);
    packet.set_hop_limit(opts.ttl);
    packet.set_next_header(IpProtocol::from(protocol));
    packet.set_src_addr(Ipv4Addr::from(src));
    packet.set_dst_addr(Ipv4Addr::from(dst));
    packet.payload_mut().copy_from_slice(payload);
    let fragment = opts.flags_frag & (wire::IPV4_MF | wire::IPV4_FRAG_MASK) != 0;
    if !fragment {
        let (s, d) = (IpAddress::from(Ipv4Addr::from(src)), IpAddress::from(Ipv4Addr::from(dst)));
        fill_transport_checksum(protocol, packet.payload_mut(), &s, &d);
    }
    packet.fill_checksum();
    p
}

/// IPv6 packet: traffic class (DSCP + ECN), flow label 0, hop limit 64; a TCP or UDP payload
/// (possibly behind options/routing headers) gets its checksum over the pseudo-header.
pub fn ipv6(src: [u8; 16], dst: [u8; 16], next_header: u8, traffic_class: u8, payload: &[u8]) -> Vec<u8> {
    let repr = Ipv6Repr {
        src_addr: Ipv6Addr::from(src),
        dst_addr: Ipv6Addr::from(dst),
        next_header: IpProtocol::from(next_header),
        payload_len: payload.len(),
        hop_limit: 64,
    };
    let mut p = vec![0u8; repr.buffer_len() + payload.len()];
    let mut packet = Ipv6Packet::new_unchecked(&mut p[..]);
    repr.emit(&mut packet);
    packet.set_traffic_class(traffic_class);
    packet.payload_mut().copy_from_slice(payload);
    // Walk the extension headers of the generic form (next header, length in 8-octet units
    // beyond the first 8) to the upper-layer header, which the pseudo-header checksum covers.
    let (mut proto, mut off) = (next_header, 0usize);
    let body = packet.payload_mut();
    while matches!(proto, IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTS) && off + 8 <= body.len() {
        let next = body[off];
        off += (usize::from(body[off + 1]) + 1) * 8;
        proto = next;
    }
    if off <= body.len() {
        let (s, d) = (IpAddress::from(Ipv6Addr::from(src)), IpAddress::from(Ipv6Addr::from(dst)));
        fill_transport_checksum(proto, &mut body[off..], &s, &d);
    }
    p
}

/// IPv6 extension headers of the generic form (RFC 8200 §4): hop-by-hop options, routing,
/// destination options.
const IPV6_HOP_BY_HOP: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_DEST_OPTS: u8 = 60;

/// Fills the TCP or UDP checksum of `segment` (the whole transport segment) over the pseudo-header
/// of `src` → `dst`; leaves anything that is not a whole TCP/UDP header alone.
fn fill_transport_checksum(protocol: u8, segment: &mut [u8], src: &IpAddress, dst: &IpAddress) {
    match protocol {
        wire::IPPROTO_TCP => {
            if let Ok(mut seg) = TcpPacket::new_checked(segment) {
                seg.fill_checksum(src, dst);
            }
        }
        wire::IPPROTO_UDP => {
            // The checksum covers the datagram as its length field says (RFC 768).
            if let Ok(mut dgram) = UdpPacket::new_checked(segment) {
                dgram.fill_checksum(src, dst);
            }
        }
        _ => {}
    }
}

/// An IPv6 extension header of the generic form (next header, length in 8-octet units beyond the
/// first 8, data): hop-by-hop or destination options padded with PadN.
pub fn ipv6_options_header(next_header: u8) -> Vec<u8> {
    // Next Header, Hdr Ext Len = 0 (8 bytes total), PadN option (type 1) with 4 bytes of padding.
    vec![next_header, 0, 1, 4, 0, 0, 0, 0]
}

/// TCP segment without options (data offset 5), window 65535, checksum 0 until an IP builder
/// fills it.
pub fn tcp(src_port: u16, dst_port: u16, seq: u32, ack: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    tcp_with_options(src_port, dst_port, seq, ack, flags, &[], payload)
}

/// TCP segment with `options` (padded with NOPs to a multiple of 4 bytes).
pub fn tcp_with_options(
    src_port: u16,
    dst_port: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    options: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let mut opts = options.to_vec();
    while opts.len() % 4 != 0 {
        opts.push(1); // NOP
    }
    let hlen = wire::TCP_MIN_HLEN + opts.len();
    assert!(hlen <= 60, "TCP options longer than 40 bytes");
    let mut s = vec![0u8; hlen + payload.len()];
    let mut seg = TcpPacket::new_unchecked(&mut s[..]);
    seg.set_src_port(src_port);
    seg.set_dst_port(dst_port);
    seg.set_seq_number(TcpSeqNumber(seq as i32));
    seg.set_ack_number(TcpSeqNumber(ack as i32));
    seg.set_header_len(hlen as u8);
    seg.clear_flags();
    seg.set_fin(flags & wire::TCP_FIN != 0);
    seg.set_syn(flags & wire::TCP_SYN != 0);
    seg.set_rst(flags & wire::TCP_RST != 0);
    seg.set_psh(flags & wire::TCP_PSH != 0);
    seg.set_ack(flags & wire::TCP_ACK != 0);
    seg.set_urg(flags & wire::TCP_URG != 0);
    seg.set_ece(flags & wire::TCP_ECE != 0);
    seg.set_cwr(flags & wire::TCP_CWR != 0);
    seg.set_window_len(0xffff);
    seg.set_checksum(0);
    seg.set_urgent_at(0);
    seg.options_mut().copy_from_slice(&opts);
    seg.payload_mut().copy_from_slice(payload);
    s
}

/// UDP datagram, checksum 0 until an IP builder fills it.
pub fn udp(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; wire::UDP_HLEN + payload.len()];
    let mut dgram = UdpPacket::new_unchecked(&mut d[..]);
    dgram.set_src_port(src_port);
    dgram.set_dst_port(dst_port);
    dgram.set_len((wire::UDP_HLEN + payload.len()) as u16);
    dgram.set_checksum(0);
    dgram.payload_mut().copy_from_slice(payload);
    d
}

/// InfiniBand Base Transport Header: opcode, P_Key 0xffff, destination QP, AckReq, PSN (both
/// 24-bit; higher bits are dropped).
pub fn bth(opcode: u8, dest_qp: u32, psn: u32, ack_req: bool) -> [u8; wire::BTH_LEN] {
    let mut h = [0u8; wire::BTH_LEN];
    h[wire::BTH_OPCODE_OFF] = opcode;
    h[1] = 0; // SE, M, Pad, TVer
    h[2..4].copy_from_slice(&0xffffu16.to_be_bytes()); // P_Key
    // Byte 4 is reserved; the QP is the 24 bits after it.
    h[wire::BTH_DEST_QP_OFF..wire::BTH_DEST_QP_OFF + 3].copy_from_slice(&(dest_qp & wire::PSN_MASK).to_be_bytes()[1..]);
    // Byte 8 holds AckReq (top bit) and reserved bits; the PSN is the 24 bits after it.
    h[wire::BTH_PSN_OFF - 1] = if ack_req { 0x80 } else { 0 };
    h[wire::BTH_PSN_OFF..wire::BTH_PSN_OFF + 3].copy_from_slice(&(psn & wire::PSN_MASK).to_be_bytes()[1..]);
    h
}

/// ACK Extended Transport Header: syndrome, MSN (24 bits).
pub fn aeth(syndrome: u8, msn: u32) -> [u8; wire::AETH_LEN] {
    let v = (u32::from(syndrome) << 24) | (msn & wire::PSN_MASK);
    v.to_be_bytes()
}

/// RoCEv2 payload of a UDP datagram: BTH, optional extension headers, payload and the 4-byte ICRC
/// (zero: nothing between the NICs checks it here).
pub fn rocev2_payload(bth: &[u8; wire::BTH_LEN], ext: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(wire::BTH_LEN + ext.len() + payload.len() + 4);
    p.extend_from_slice(bth);
    p.extend_from_slice(ext);
    p.extend_from_slice(payload);
    p.extend_from_slice(&[0, 0, 0, 0]);
    p
}

/// Convenience: untagged Ethernet + IPv4 (DF, given TOS) + TCP.
#[allow(clippy::too_many_arguments)]
pub fn tcp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, seq: u32, ack: u32, flags: u8, tos: u8, payload: &[u8]) -> Vec<u8> {
    let opts = Ipv4Opts { tos, ..Ipv4Opts::default() };
    ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IP, &ipv4(src, dst, wire::IPPROTO_TCP, &opts, &tcp(sport, dport, seq, ack, flags, payload)))
}

/// TCP options as Linux lays them out on an ACK: NOP, NOP, timestamp (when `ts` is given), then
/// NOP, NOP, SACK with `blocks` (when any).
pub fn linux_ack_options(ts: Option<(u32, u32)>, blocks: &[(u32, u32)]) -> Vec<u8> {
    let mut o = Vec::new();
    if let Some((tsval, tsecr)) = ts {
        o.extend([1, 1, 8, 10]);
        o.extend(tsval.to_be_bytes());
        o.extend(tsecr.to_be_bytes());
    }
    if !blocks.is_empty() {
        o.extend([1, 1, wire::TCP_OPT_SACK, 2 + 8 * blocks.len() as u8]);
        for (l, r) in blocks {
            o.extend(l.to_be_bytes());
            o.extend(r.to_be_bytes());
        }
    }
    o
}

/// Convenience: untagged Ethernet + IPv4 + TCP with `options`.
#[allow(clippy::too_many_arguments)]
pub fn tcp4_with_options(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, seq: u32, ack: u32, flags: u8, options: &[u8], payload: &[u8]) -> Vec<u8> {
    let seg = tcp_with_options(sport, dport, seq, ack, flags, options, payload);
    ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IP, &ipv4(src, dst, wire::IPPROTO_TCP, &Ipv4Opts::default(), &seg))
}

/// Convenience: untagged Ethernet + IPv4 + UDP.
pub fn udp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    ethernet(MAC_B, MAC_A, &[], wire::ETH_P_IP, &ipv4(src, dst, wire::IPPROTO_UDP, &Ipv4Opts::default(), &udp(sport, dport, payload)))
}

/// Convenience: untagged Ethernet + IPv4 + UDP to 4791 + BTH (+ `ext`) + payload + ICRC.
#[allow(clippy::too_many_arguments)]
pub fn rocev2_4(src: [u8; 4], dst: [u8; 4], sport: u16, opcode: u8, dest_qp: u32, psn: u32, ext: &[u8], payload: &[u8]) -> Vec<u8> {
    let roce = rocev2_payload(&bth(opcode, dest_qp, psn, false), ext, payload);
    udp4(src, dst, sport, dataplane_common::ROCEV2_UDP_PORT, &roce)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6(last: u8) -> [u8; 16] {
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = last;
        a
    }

    fn addr4(a: [u8; 4]) -> IpAddress {
        IpAddress::from(Ipv4Addr::from(a))
    }

    fn addr6(a: [u8; 16]) -> IpAddress {
        IpAddress::from(Ipv6Addr::from(a))
    }

    #[test]
    fn ipv4_header_checksum_matches_known_header() {
        // The classic example header (192.168.0.1 -> 192.168.0.199, UDP, total length 0x73,
        // DF): its checksum is 0xb861. The zero payload is not a whole UDP datagram (length
        // field 0), so it is left alone.
        let payload = vec![0u8; 0x73 - 20];
        let p = ipv4([192, 168, 0, 1], [192, 168, 0, 199], 17, &Ipv4Opts { ttl: 64, ..Ipv4Opts::default() }, &payload);
        assert_eq!(
            &p[..20],
            &[0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7]
        );
        assert!(Ipv4Packet::new_checked(&p[..]).unwrap().verify_checksum());
        assert_eq!(&p[20..], &payload[..]);
    }

    #[test]
    fn tcp4_frame_bytes() {
        let f = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 40000, 29500, 0x01020304, 0x0a0b0c0d, wire::TCP_ACK | wire::TCP_PSH, 0x03, b"hi");
        // Checksums computed independently with an RFC 1071 sum in Python: IPv4 header 0x26c9,
        // TCP over the pseudo-header 0x09c4.
        let expected: Vec<u8> = [
            // Ethernet: dst, src, IPv4
            &[0x02, 0, 0, 0, 0, 0x0b, 0x02, 0, 0, 0, 0, 0x0a, 0x08, 0x00][..],
            // IPv4: v4 ihl5, tos CE, len 42, id 0, DF, ttl 64, TCP, checksum, 10.0.0.1 -> 10.0.0.2
            &[0x45, 0x03, 0x00, 0x2a, 0x00, 0x00, 0x40, 0x00, 0x40, 0x06, 0x26, 0xc9],
            &[10, 0, 0, 1, 10, 0, 0, 2],
            // TCP: 40000 -> 29500, seq, ack, doff 5, ACK|PSH, window 65535, checksum, urg 0
            &[0x9c, 0x40, 0x73, 0x3c, 1, 2, 3, 4, 0x0a, 0x0b, 0x0c, 0x0d, 0x50, 0x18, 0xff, 0xff, 0x09, 0xc4, 0, 0],
            b"hi",
        ]
        .concat();
        assert_eq!(f, expected);
        assert_eq!(f.len(), 14 + 20 + 20 + 2);
        let tcp = TcpPacket::new_checked(&f[34..]).unwrap();
        assert!(tcp.verify_checksum(&addr4([10, 0, 0, 1]), &addr4([10, 0, 0, 2])));
    }

    #[test]
    fn udp4_checksum_over_pseudo_header() {
        let f = udp4([10, 0, 0, 1], [10, 0, 0, 2], 1, 29500, &[0; 3]);
        // UDP: 1 -> 29500, length 11, checksum 0x7898 (RFC 1071 in Python), payload.
        assert_eq!(&f[34..], &[0x00, 0x01, 0x73, 0x3c, 0x00, 0x0b, 0x78, 0x98, 0, 0, 0]);
    }

    #[test]
    fn ipv6_transport_checksums() {
        // Computed independently with an RFC 1071 sum in Python over the IPv6 pseudo-header.
        let p = ipv6(v6(1), v6(2), 6, 0, &tcp(40000, 29500, 5, 1, wire::TCP_ACK, &[0xaa; 4]));
        assert_eq!(&p[40 + 16..40 + 18], &[0x50, 0xf4]);
        let d = ipv6(v6(1), v6(2), 17, 0, &udp(49152, 4791, &[1, 2, 3, 4]));
        assert_eq!(&d[40 + 6..40 + 8], &[0x2f, 0x14]);
        // Behind a hop-by-hop options header the TCP checksum is the same (the pseudo-header
        // names the upper-layer protocol and length, not the extension headers).
        let mut ext = ipv6_options_header(6);
        ext.extend_from_slice(&tcp(40000, 29500, 5, 1, wire::TCP_ACK, &[0xaa; 4]));
        let h = ipv6(v6(1), v6(2), 0, 0, &ext);
        assert_eq!(&h[40 + 8 + 16..40 + 8 + 18], &[0x50, 0xf4]);
        let seg = TcpPacket::new_checked(&h[48..]).unwrap();
        assert!(seg.verify_checksum(&addr6(v6(1)), &addr6(v6(2))));
    }

    #[test]
    fn fragments_and_partial_segments_are_left_alone() {
        let seg = tcp(1, 2, 0, 0, wire::TCP_ACK, &[0; 8]);
        let frag = ipv4([10, 0, 0, 1], [10, 0, 0, 2], 6, &Ipv4Opts { flags_frag: wire::IPV4_MF, ..Ipv4Opts::default() }, &seg);
        assert_eq!(&frag[20..], &seg[..], "a fragment's payload is not a whole segment");
        let short = ipv4([10, 0, 0, 1], [10, 0, 0, 2], 6, &Ipv4Opts::default(), &seg[..12]);
        assert_eq!(&short[20..], &seg[..12]);
        assert!(Ipv4Packet::new_checked(&short[..]).unwrap().verify_checksum());
    }

    #[test]
    fn ipv4_options_flags_and_offset() {
        let opts = Ipv4Opts { tos: 0xb8, flags_frag: wire::IPV4_MF | 100, ttl: 3, id: 0x1234, options: vec![0x94, 0x04, 0, 0, 1] };
        let p = ipv4([10, 0, 0, 1], [10, 0, 0, 2], 6, &opts, &[]);
        // IHL 7 (options padded to 8 bytes with End of Option List), MF + offset 100 (units of 8).
        assert_eq!(&p[..10], &[0x47, 0xb8, 0x00, 0x1c, 0x12, 0x34, 0x20, 0x64, 0x03, 0x06]);
        assert_eq!(&p[20..28], &[0x94, 0x04, 0, 0, 1, 0, 0, 0]);
        assert!(Ipv4Packet::new_checked(&p[..]).unwrap().verify_checksum());
    }

    #[test]
    fn qinq_tags_are_outermost_first() {
        let f = ethernet(MAC_B, MAC_A, &[VlanTag::s_tag(100), VlanTag::c_tag(200)], wire::ETH_P_IPV6, &[]);
        assert_eq!(&f[12..], &[0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x00, 0xc8, 0x86, 0xdd]);
        let one = ethernet(MAC_B, MAC_A, &[VlanTag::c_tag(5)], wire::ETH_P_IP, &[0xee]);
        assert_eq!(&one[..], &[&MAC_B[..], &MAC_A[..], &[0x81, 0x00, 0x00, 0x05, 0x08, 0x00, 0xee]].concat());
    }

    #[test]
    fn ipv6_header_bytes() {
        let (src, dst) = (v6(1), v6(2));
        let p = ipv6(src, dst, 59, 0x03, &[0xaa; 4]);
        // version 6, traffic class 0x03 (ECN CE) straddling the first two bytes, flow label 0,
        // payload length 4, next header 59 (none), hop limit 64.
        assert_eq!(&p[..8], &[0x60, 0x30, 0x00, 0x00, 0x00, 0x04, 0x3b, 0x40]);
        assert_eq!(&p[8..24], &src);
        assert_eq!(&p[24..40], &dst);
        assert_eq!(&p[40..], &[0xaa; 4]);
    }

    #[test]
    fn udp_and_bth_bytes() {
        let b = bth(wire::bth_opcode::RC_RDMA_WRITE_MIDDLE, 0x00_12_34_56, 0x01_ff_ff_fe, true);
        // opcode, flags, P_Key, resv, QP 0x123456, AckReq|resv, PSN 0xfffffe (bit 24 dropped)
        assert_eq!(b, [0x07, 0x00, 0xff, 0xff, 0x00, 0x12, 0x34, 0x56, 0x80, 0xff, 0xff, 0xfe]);
        assert_eq!(aeth(0x60, 0x000102), [0x60, 0x00, 0x01, 0x02]);
        let d = udp(49152, 4791, &b);
        assert_eq!(&d[..8], &[0xc0, 0x00, 0x12, 0xb7, 0x00, 0x14, 0x00, 0x00]);
    }

    #[test]
    fn tcp_options_set_data_offset() {
        let s = tcp_with_options(1, 2, 0, 0, wire::TCP_SYN, &[2, 4, 0x05, 0xb4], &[]);
        assert_eq!(s[12], 6 << 4);
        assert_eq!(s[13], wire::TCP_SYN);
        assert_eq!(&s[20..24], &[2, 4, 0x05, 0xb4]);
        let all = tcp(1, 2, 0, 0, 0xff, &[]);
        assert_eq!(&all[12..14], &[0x50, 0xff], "every flag bit lands where the monitor reads it");
    }
}
