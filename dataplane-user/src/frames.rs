//! Builders for the frames the T1 tests and the benchmark feed to the flow monitor.
//!
//! Pure functions from header parameters to bytes, one per header, composed by the caller
//! (`ethernet(.., ipv4(.., tcp(..)))`). Lengths and the IPv4 header checksum are filled in; TCP and
//! UDP checksums are left 0 because the monitor never reads them (and UDP checksum 0 is valid on
//! IPv4, RFC 768). Field layouts follow `dataplane_common::wire`; the unit tests below pin them to
//! hand-checked byte fixtures.
use dataplane_common::wire;

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
pub fn ethernet(dst: [u8; 6], src: [u8; 6], tags: &[VlanTag], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(wire::ETH_HLEN + 4 * tags.len() + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    for t in tags {
        f.extend_from_slice(&t.tpid.to_be_bytes());
        f.extend_from_slice(&t.tci.to_be_bytes());
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Parameters of an IPv4 header beyond addresses and protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4Opts {
    /// DSCP and ECN byte.
    pub tos: u8,
    /// Flags + fragment offset field in host order (DF = 0x4000, MF = 0x2000, offset in 8-byte units).
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

/// RFC 1071 Internet checksum of `bytes`.
pub fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in bytes.chunks(2) {
        let word = if chunk.len() == 2 { u16::from_be_bytes([chunk[0], chunk[1]]) } else { u16::from(chunk[0]) << 8 };
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// IPv4 packet with a correct total length and header checksum.
pub fn ipv4(src: [u8; 4], dst: [u8; 4], protocol: u8, opts: &Ipv4Opts, payload: &[u8]) -> Vec<u8> {
    let mut options = opts.options.clone();
    while options.len() % 4 != 0 {
        options.push(0); // End of Option List
    }
    let hlen = wire::IPV4_MIN_HLEN + options.len();
    assert!(hlen <= 60, "IPv4 options longer than 40 bytes");
    let total = hlen + payload.len();
    let mut p = Vec::with_capacity(total);
    p.push(0x40 | (hlen / 4) as u8);
    p.push(opts.tos);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&opts.id.to_be_bytes());
    p.extend_from_slice(&opts.flags_frag.to_be_bytes());
    p.push(opts.ttl);
    p.push(protocol);
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(&options);
    let csum = internet_checksum(&p[..hlen]);
    p[10..12].copy_from_slice(&csum.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// IPv6 packet: traffic class (DSCP + ECN), flow label 0, hop limit 64.
pub fn ipv6(src: [u8; 16], dst: [u8; 16], next_header: u8, traffic_class: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(wire::IPV6_HLEN + payload.len());
    let first = (6u32 << 28) | (u32::from(traffic_class) << 20);
    p.extend_from_slice(&first.to_be_bytes());
    p.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    p.push(next_header);
    p.push(64);
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(payload);
    p
}

/// An IPv6 extension header of the generic form (next header, length in 8-octet units beyond the
/// first 8, data): hop-by-hop or destination options padded with PadN.
pub fn ipv6_options_header(next_header: u8) -> Vec<u8> {
    // Next Header, Hdr Ext Len = 0 (8 bytes total), PadN option with 4 bytes of padding.
    vec![next_header, 0, 1, 4, 0, 0, 0, 0]
}

/// TCP segment without options (data offset 5), window 65535, checksum 0.
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
    let mut s = Vec::with_capacity(hlen + payload.len());
    s.extend_from_slice(&src_port.to_be_bytes());
    s.extend_from_slice(&dst_port.to_be_bytes());
    s.extend_from_slice(&seq.to_be_bytes());
    s.extend_from_slice(&ack.to_be_bytes());
    s.push(((hlen / 4) as u8) << 4);
    s.push(flags);
    s.extend_from_slice(&0xffffu16.to_be_bytes());
    s.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
    s.extend_from_slice(&opts);
    s.extend_from_slice(payload);
    s
}

/// UDP datagram with checksum 0.
pub fn udp(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(wire::UDP_HLEN + payload.len());
    d.extend_from_slice(&src_port.to_be_bytes());
    d.extend_from_slice(&dst_port.to_be_bytes());
    d.extend_from_slice(&((wire::UDP_HLEN + payload.len()) as u16).to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(payload);
    d
}

/// InfiniBand Base Transport Header: opcode, P_Key 0xffff, destination QP, AckReq, PSN (both
/// 24-bit; higher bits are dropped).
pub fn bth(opcode: u8, dest_qp: u32, psn: u32, ack_req: bool) -> [u8; wire::BTH_LEN] {
    let mut h = [0u8; wire::BTH_LEN];
    h[0] = opcode;
    h[1] = 0; // SE, M, Pad, TVer
    h[2..4].copy_from_slice(&0xffffu16.to_be_bytes());
    h[4..8].copy_from_slice(&(dest_qp & wire::PSN_MASK).to_be_bytes());
    h[8..12].copy_from_slice(&(psn & wire::PSN_MASK).to_be_bytes());
    if ack_req {
        h[8] |= 0x80;
    }
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

    #[test]
    fn ipv4_header_checksum_matches_known_header() {
        // The classic example header (192.168.0.1 -> 192.168.0.199, UDP, total length 0x73,
        // DF): its checksum is 0xb861.
        let payload = vec![0u8; 0x73 - 20];
        let p = ipv4([192, 168, 0, 1], [192, 168, 0, 199], 17, &Ipv4Opts { ttl: 64, ..Ipv4Opts::default() }, &payload);
        assert_eq!(
            &p[..20],
            &[0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7]
        );
        assert_eq!(internet_checksum(&p[..20]), 0, "a header with its checksum sums to zero");
    }

    #[test]
    fn tcp4_frame_bytes() {
        let f = tcp4([10, 0, 0, 1], [10, 0, 0, 2], 40000, 29500, 0x01020304, 0x0a0b0c0d, wire::TCP_ACK | wire::TCP_PSH, 0x03, b"hi");
        let expected: Vec<u8> = [
            // Ethernet: dst, src, IPv4
            &[0x02, 0, 0, 0, 0, 0x0b, 0x02, 0, 0, 0, 0, 0x0a, 0x08, 0x00][..],
            // IPv4: v4 ihl5, tos CE, len 42, id 0, DF, ttl 64, TCP, checksum, 10.0.0.1 -> 10.0.0.2
            &[0x45, 0x03, 0x00, 0x2a, 0x00, 0x00, 0x40, 0x00, 0x40, 0x06],
            &internet_checksum(&[0x45, 0x03, 0x00, 0x2a, 0, 0, 0x40, 0, 0x40, 0x06, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]).to_be_bytes(),
            &[10, 0, 0, 1, 10, 0, 0, 2],
            // TCP: 40000 -> 29500, seq, ack, doff 5, ACK|PSH, window 65535, csum 0, urg 0
            &[0x9c, 0x40, 0x73, 0x3c, 1, 2, 3, 4, 0x0a, 0x0b, 0x0c, 0x0d, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0],
            b"hi",
        ]
        .concat();
        assert_eq!(f, expected);
        assert_eq!(f.len(), 14 + 20 + 20 + 2);
    }

    #[test]
    fn qinq_tags_are_outermost_first() {
        let f = ethernet(MAC_B, MAC_A, &[VlanTag::s_tag(100), VlanTag::c_tag(200)], wire::ETH_P_IPV6, &[]);
        assert_eq!(&f[12..], &[0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x00, 0xc8, 0x86, 0xdd]);
    }

    #[test]
    fn ipv6_header_bytes() {
        let mut src = [0u8; 16];
        src[0] = 0xfd;
        src[15] = 1;
        let mut dst = src;
        dst[15] = 2;
        let p = ipv6(src, dst, 6, 0x03, &[0xaa; 4]);
        // version 6, traffic class 0x03 (ECN CE) straddling the first two bytes, flow label 0.
        assert_eq!(&p[..8], &[0x60, 0x30, 0x00, 0x00, 0x00, 0x04, 0x06, 0x40]);
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
        assert_eq!(&s[20..24], &[2, 4, 0x05, 0xb4]);
    }
}
