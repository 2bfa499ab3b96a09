//! Header sizes, field offsets and protocol constants used by the eBPF parser and by the user-space
//! tools that craft or check frames. Offsets are relative to the start of their own header.
//! References: IEEE 802.1Q, RFC 791, RFC 8200, RFC 9293, RFC 768, InfiniBand Architecture Spec
//! Vol. 1 Rel. 1.4 §9.2 (BTH), §9.3.5 (AETH), Annex A17 (RoCEv2, CNP).

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
pub const ETH_P_8021Q: u16 = 0x8100;
pub const ETH_P_8021AD: u16 = 0x88A8;
/// Offset of the EtherType in an untagged Ethernet header.
pub const ETH_TYPE_OFF: usize = 12;
pub const VLAN_HLEN: usize = 4;

pub const IPV4_MIN_HLEN: usize = 20;
pub const IPV4_TOS_OFF: usize = 1;
pub const IPV4_TOTLEN_OFF: usize = 2;
pub const IPV4_FRAG_OFF: usize = 6;
pub const IPV4_PROTO_OFF: usize = 9;
pub const IPV4_SRC_OFF: usize = 12;
pub const IPV4_DST_OFF: usize = 16;
/// More-fragments flag and fragment-offset mask in the (host order) flags/fragment field.
pub const IPV4_MF: u16 = 0x2000;
pub const IPV4_FRAG_MASK: u16 = 0x1FFF;

pub const IPV6_HLEN: usize = 40;
pub const IPV6_PAYLOAD_LEN_OFF: usize = 4;
pub const IPV6_NEXT_HDR_OFF: usize = 6;
pub const IPV6_SRC_OFF: usize = 8;
pub const IPV6_DST_OFF: usize = 24;

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// ECN codepoint "Congestion Experienced" (low two bits of TOS / traffic class).
pub const ECN_CE: u8 = 0b11;
pub const ECN_MASK: u8 = 0b11;

pub const TCP_MIN_HLEN: usize = 20;
pub const TCP_SEQ_OFF: usize = 4;
pub const TCP_ACK_OFF: usize = 8;
pub const TCP_DOFF_OFF: usize = 12;
pub const TCP_FLAGS_OFF: usize = 13;
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_URG: u8 = 0x20;
pub const TCP_ECE: u8 = 0x40;
pub const TCP_CWR: u8 = 0x80;
/// TCP option kinds (RFC 9293 §3.2, RFC 2018).
pub const TCP_OPT_EOL: u8 = 0;
pub const TCP_OPT_NOP: u8 = 1;
pub const TCP_OPT_SACK: u8 = 5;

pub const UDP_HLEN: usize = 8;

/// InfiniBand Base Transport Header, 12 bytes: opcode(8) | SE M Pad TVer(8) | P_Key(16) |
/// FECN BECN resv(8) | DestQP(24) | AckReq resv(8) | PSN(24).
pub const BTH_LEN: usize = 12;
pub const BTH_OPCODE_OFF: usize = 0;
pub const BTH_DEST_QP_OFF: usize = 5;
pub const BTH_PSN_OFF: usize = 9;
/// ACK Extended Transport Header, 4 bytes: Syndrome(8) | MSN(24).
pub const AETH_LEN: usize = 4;
/// PSNs are 24-bit and wrap.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// RC opcodes (transport 000, IBA Table 38) used by the monitor and the traffic tool.
pub mod bth_opcode {
    pub const RC_SEND_FIRST: u8 = 0x00;
    pub const RC_SEND_MIDDLE: u8 = 0x01;
    pub const RC_SEND_LAST: u8 = 0x02;
    pub const RC_SEND_ONLY: u8 = 0x04;
    pub const RC_RDMA_WRITE_FIRST: u8 = 0x06;
    pub const RC_RDMA_WRITE_MIDDLE: u8 = 0x07;
    pub const RC_RDMA_WRITE_LAST: u8 = 0x08;
    pub const RC_RDMA_WRITE_ONLY: u8 = 0x0A;
    /// Acknowledge: BTH + AETH.
    pub const RC_ACK: u8 = 0x11;
    /// RoCEv2 Congestion Notification Packet (Annex A17.9.3).
    pub const CNP: u8 = 0x81;
}

/// AETH syndrome: bits 7..5 select ACK (000), RNR NAK (001), NAK (011).
pub const AETH_SYNDROME_KIND_MASK: u8 = 0b1110_0000;
pub const AETH_SYNDROME_NAK: u8 = 0b0110_0000;
pub const AETH_SYNDROME_RNR_NAK: u8 = 0b0010_0000;
