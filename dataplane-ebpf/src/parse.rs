//! Header parsing with direct packet access.
//!
//! Every read goes through [`ptr_at`], which checks `data + offset + size <= data_end`: the
//! comparison the verifier needs to see before any packet load (kernel/bpf/verifier.c,
//! find_good_pkt_pointers). Offsets are compile-time constants per path (VLAN tags are unrolled)
//! or bounded by a mask (IPv4 IHL: `(b & 0xf) * 4` is at most 60), so the verifier can prove them.
//!
//! Direct access only reaches the linear part of the skb. On TC the skb may be non-linear (GRO,
//! header split, drivers that build skbs from pages); [`parse`] first asks `bpf_skb_pull_data` to
//! make the headers linear when they are not, which costs nothing for the usual linear skb.

use aya_ebpf::programs::TcContext;
use dataplane_common::{flow_kind, wire, FlowKey, ROCEV2_UDP_PORT};

/// Why the parser stopped (each maps to one `STATS` counter, or none).
pub enum Skip {
    /// Headers truncated or inconsistent: `STATS[MALFORMED]`.
    Malformed,
    /// Skipped by design (non-IP, fragments, IPv6 extension headers, other L4): `STATS[UNSUPPORTED]`.
    Unsupported,
    /// Headers outside the linear area and `bpf_skb_pull_data` failed: `STATS[UNREADABLE]`.
    Unreadable,
    /// Parsed but not a collective flow: counted only as PARSED.
    NotMatched,
    /// Matched but the flow could not be inserted: `STATS[MAP_FULL]`.
    MapFull,
    /// Matched, but another CPU was creating the flow's slot: `STATS[CONTENDED]`.
    Contended,
}

/// The longest header chain the monitor reads: Ethernet + two VLAN tags + IPv4 with options +
/// UDP + BTH + AETH = 14 + 8 + 60 + 8 + 12 + 4 = 106 bytes (TCP needs only its fixed 20 bytes,
/// 102). Pulled into the linear area when the skb holds less than this linearly.
const PULL_LEN: u32 = 128;

/// The TCP header fields the monitor uses.
pub struct TcpInfo {
    pub seq: u32,
    pub flags: u8,
    /// A segment without payload whose SACK option reports a D-SACK ([`dsack`]). Decided here,
    /// not after the flow lookup: the header's offset and length are exact per parse path, and
    /// carried through the lookup's probe loop they kept the verifier from merging states (it
    /// walked 572,486 instructions; deciding here, 275,140; without D-SACKs it was 197,872).
    pub dsack: bool,
}

impl TcpInfo {
    const NONE: TcpInfo = TcpInfo { seq: 0, flags: 0, dsack: false };
}

/// The fields of the InfiniBand BTH (and AETH) the monitor uses.
pub struct Bth {
    pub opcode: u8,
    /// AETH syndrome for opcodes that carry an AETH (ACK), else 0.
    pub syndrome: u8,
    pub dest_qp: u32,
    pub psn: u32,
}

impl Bth {
    const NONE: Bth = Bth { opcode: 0, syndrome: 0, dest_qp: 0, psn: 0 };
}

pub struct Packet {
    /// The flow key, complete except `ifindex` and `direction`, which the caller fills in.
    pub key: FlowKey,
    /// ECN codepoint (two bits) of the IP header.
    pub ecn: u8,
    /// Wire packets this skb stands for (`gso_segs`, at least 1).
    pub segments: u32,
    /// Payload bytes per segment of a GSO skb (`gso_size`); 0 when `segments` is 1.
    pub gso_size: u32,
    /// L3 bytes of all those packets (headers counted once per segment).
    pub l3_bytes: u32,
    /// Transport payload bytes.
    pub payload_bytes: u32,
    // The transport fields are two structs, both always written (zero when `key.kind` is not
    // theirs), not an enum with a payload per variant: a variant leaves the bytes of the others
    // undefined, LLVM may then store *any* register into them when it lays the packet out on the
    // stack (a packet pointer included, depending on register allocation), and the verifier
    // rejects that as "invalid size of register spill". Seen when unrelated code changed the
    // register allocation of the hot path.
    /// TCP fields when `key.kind == flow_kind::TCP`, else zero.
    pub tcp: TcpInfo,
    /// BTH fields when `key.kind == flow_kind::ROCEV2`, else zero.
    pub bth: Bth,
}

/// The one bounds-checked access to packet memory.
#[inline(always)]
fn ptr_at<T>(data: usize, data_end: usize, offset: usize) -> Result<*const T, Skip> {
    if data + offset + core::mem::size_of::<T>() > data_end {
        return Err(Skip::Malformed);
    }
    Ok((data + offset) as *const T)
}

// Field readers over a header pointer that `ptr_at` has already checked for the whole header.
// They use one load of the field's width: packet data carries no alignment guarantee (an Ethernet
// header, possibly VLAN tags, then IP), but BPF loads from packet memory need none on the
// architectures ringside targets (x86_64, arm64 select HAVE_EFFICIENT_UNALIGNED_ACCESS, so the
// verifier does not enforce alignment: kernel/bpf/verifier.c, check_pkt_ptr_alignment), and
// byte-wise reads (what `read_unaligned` lowers to on BPF) cost several times the instructions.

#[inline(always)]
fn rd8(p: *const u8, at: usize) -> u8 {
    unsafe { *p.add(at) }
}

#[inline(always)]
fn rd16(p: *const u8, at: usize) -> u16 {
    #[allow(clippy::cast_ptr_alignment)]
    u16::from_be(unsafe { p.add(at).cast::<u16>().read() })
}

#[inline(always)]
fn rd32(p: *const u8, at: usize) -> u32 {
    #[allow(clippy::cast_ptr_alignment)]
    u32::from_be(unsafe { p.add(at).cast::<u32>().read() })
}

/// A 16-byte address as four 32-bit words in memory order (no byte order change). Addresses
/// travel in registers as words and are stored into the key once, when the packet is complete.
type Addr = [u32; 4];

#[inline(always)]
fn read_addr6(p: *const u8, at: usize) -> Addr {
    let s = unsafe { p.add(at) }.cast::<u32>();
    unsafe { [s.read(), s.add(1).read(), s.add(2).read(), s.add(3).read()] }
}

/// An IPv4 address as IPv4-mapped IPv6 (`::ffff:a.b.c.d`).
#[inline(always)]
fn read_addr4(p: *const u8, at: usize) -> Addr {
    [0, 0, u32::from_be(0x0000_ffff), unsafe { p.add(at).cast::<u32>().read() }]
}

#[inline(always)]
fn addr_bytes(a: Addr) -> [u8; 16] {
    // SAFETY: same size, every bit pattern valid for both.
    unsafe { core::mem::transmute::<Addr, [u8; 16]>(a) }
}

#[inline(always)]
fn is_vlan(ethertype: u16) -> bool {
    ethertype == wire::ETH_P_8021Q || ethertype == wire::ETH_P_8021AD
}

/// Parses the packet. The returned key has `ifindex` and `direction` 0; the caller fills them in.
///
/// The packet is assembled from registers at the end, field by field: no zero-initialised
/// `Packet` up front, whose 44-byte key LLVM turns into a call to a byte-loop `memset` on BPF.
#[inline(always)]
pub fn parse(ctx: &TcContext) -> Result<Packet, Skip> {
    let skb_len = ctx.len();
    // Headers in page fragments: pull (at most) PULL_LEN bytes into the linear area. This does
    // not change the packet's bytes; it may reallocate the head (net/core/filter.c,
    // bpf_skb_pull_data -> skb_ensure_writable). Packet pointers are re-read afterwards because
    // the helper invalidates them.
    let linear = (ctx.data_end() - ctx.data()) as u32;
    if linear < skb_len && linear < PULL_LEN {
        let want = if skb_len < PULL_LEN { skb_len } else { PULL_LEN };
        if ctx.pull_data(want).is_err() {
            return Err(Skip::Unreadable);
        }
    }
    let data = ctx.data();
    let end = ctx.data_end();

    // --- Ethernet, up to two VLAN tags (802.1Q, or 802.1ad outer + 802.1Q inner) ---
    let eth: *const u8 = ptr_at::<[u8; wire::ETH_HLEN]>(data, end, 0)?.cast();
    let mut ethertype = rd16(eth, wire::ETH_TYPE_OFF);
    let mut l3_off = wire::ETH_HLEN;
    if is_vlan(ethertype) {
        let tag: *const u8 = ptr_at::<[u8; wire::VLAN_HLEN]>(data, end, l3_off)?.cast();
        ethertype = rd16(tag, 2);
        l3_off += wire::VLAN_HLEN;
        if is_vlan(ethertype) {
            let tag: *const u8 = ptr_at::<[u8; wire::VLAN_HLEN]>(data, end, l3_off)?.cast();
            ethertype = rd16(tag, 2);
            l3_off += wire::VLAN_HLEN;
        }
    }
    // Length of everything from the L3 header on, as the skb knows it (covers GSO super-packets).
    let l3_avail = skb_len.wrapping_sub(l3_off as u32);

    // --- IPv4 / IPv6 ---
    let (protocol, l3_hlen, l3_len, l4_off, src, dst, ecn) = if ethertype == wire::ETH_P_IP {
        let ip: *const u8 = ptr_at::<[u8; wire::IPV4_MIN_HLEN]>(data, end, l3_off)?.cast();
        let vhl = rd8(ip, 0);
        if vhl >> 4 != 4 {
            return Err(Skip::Malformed);
        }
        // IHL in 32-bit words; the mask bounds it to 60 for the verifier.
        let ihl = ((vhl & 0x0f) as usize) << 2;
        if ihl < wire::IPV4_MIN_HLEN {
            return Err(Skip::Malformed);
        }
        if rd16(ip, wire::IPV4_FRAG_OFF) & (wire::IPV4_MF | wire::IPV4_FRAG_MASK) != 0 {
            // Any fragment, the first included: later fragments have no ports, and the first
            // one's lengths describe only part of the datagram.
            return Err(Skip::Unsupported);
        }
        let proto = rd8(ip, wire::IPV4_PROTO_OFF);
        if proto != wire::IPPROTO_TCP && proto != wire::IPPROTO_UDP {
            return Err(Skip::Unsupported);
        }
        let tot_len = rd16(ip, wire::IPV4_TOTLEN_OFF) as u32;
        // tot_len 0: IPv4 BIG TCP GSO packet larger than 64 KiB (include/net/ip.h,
        // iph_set_totlen); the skb length is the truth then.
        let l3_len = if tot_len == 0 { l3_avail } else { tot_len };
        if l3_len < ihl as u32 || l3_len > l3_avail {
            return Err(Skip::Malformed);
        }
        let src = read_addr4(ip, wire::IPV4_SRC_OFF);
        let dst = read_addr4(ip, wire::IPV4_DST_OFF);
        let ecn = rd8(ip, wire::IPV4_TOS_OFF) & wire::ECN_MASK;
        (proto, ihl as u32, l3_len, l3_off + ihl, src, dst, ecn)
    } else if ethertype == wire::ETH_P_IPV6 {
        let ip: *const u8 = ptr_at::<[u8; wire::IPV6_HLEN]>(data, end, l3_off)?.cast();
        let b0 = rd8(ip, 0);
        if b0 >> 4 != 6 {
            return Err(Skip::Malformed);
        }
        let next = rd8(ip, wire::IPV6_NEXT_HDR_OFF);
        if next != wire::IPPROTO_TCP && next != wire::IPPROTO_UDP {
            // Extension headers (hop-by-hop, routing, fragment, destination options, AH, ...)
            // are not walked: a chain of unknown length is a loop the verifier must bound, and
            // collective traffic does not carry them.
            return Err(Skip::Unsupported);
        }
        let payload = rd16(ip, wire::IPV6_PAYLOAD_LEN_OFF) as u32;
        // Payload length 0 without a jumbo option: IPv6 BIG TCP GSO packet (net/ipv6/ip6_output.c).
        let l3_len = if payload == 0 { l3_avail } else { wire::IPV6_HLEN as u32 + payload };
        if l3_len < wire::IPV6_HLEN as u32 || l3_len > l3_avail {
            return Err(Skip::Malformed);
        }
        let src = read_addr6(ip, wire::IPV6_SRC_OFF);
        let dst = read_addr6(ip, wire::IPV6_DST_OFF);
        // Traffic class straddles bytes 0 and 1; ECN is its low two bits (RFC 8200 §7, RFC 3168).
        let ecn = (rd8(ip, 1) >> 4) & wire::ECN_MASK;
        (next, wire::IPV6_HLEN as u32, l3_len, l3_off + wire::IPV6_HLEN, src, dst, ecn)
    } else {
        return Err(Skip::Unsupported);
    };
    let l4_len = l3_len - l3_hlen;

    let gso_segs = unsafe { (*ctx.skb.skb).gso_segs };
    let (segments, gso_size) =
        if gso_segs > 1 { (gso_segs, unsafe { (*ctx.skb.skb).gso_size }) } else { (1, 0) };

    // --- TCP / UDP / RoCEv2 ---
    let (src_port, dst_port, kind, l3_bytes, payload_bytes, tcp, bth) = if protocol == wire::IPPROTO_TCP {
        let tcp: *const u8 = ptr_at::<[u8; wire::TCP_MIN_HLEN]>(data, end, l4_off)?.cast();
        let doff = ((rd8(tcp, wire::TCP_DOFF_OFF) >> 4) as u32) << 2;
        if doff < wire::TCP_MIN_HLEN as u32 || doff > l4_len {
            return Err(Skip::Malformed);
        }
        (
            rd16(tcp, 0),
            rd16(tcp, 2),
            flow_kind::TCP,
            l3_len + (segments - 1) * (l3_hlen + doff),
            l4_len - doff,
            {
                let ack = rd32(tcp, wire::TCP_ACK_OFF);
                TcpInfo {
                    seq: rd32(tcp, wire::TCP_SEQ_OFF),
                    flags: rd8(tcp, wire::TCP_FLAGS_OFF),
                    // Only segments without payload, with more than the fixed header.
                    dsack: l4_len == doff && doff > wire::TCP_MIN_HLEN as u32 && dsack(data, end, l4_off as u32, doff, ack),
                }
            },
            Bth::NONE,
        )
    } else {
        let udp: *const u8 = ptr_at::<[u8; wire::UDP_HLEN]>(data, end, l4_off)?.cast();
        let ulen = rd16(udp, 4) as u32;
        if ulen < wire::UDP_HLEN as u32 || ulen > l4_len {
            return Err(Skip::Malformed);
        }
        let dst_port = rd16(udp, 2);
        let l3_bytes = l3_len + (segments - 1) * (l3_hlen + wire::UDP_HLEN as u32);
        let payload = ulen - wire::UDP_HLEN as u32;
        let (kind, bth) = if dst_port == ROCEV2_UDP_PORT {
            let bth: *const u8 =
                ptr_at::<[u8; wire::BTH_LEN]>(data, end, l4_off + wire::UDP_HLEN)?.cast();
            let opcode = rd8(bth, wire::BTH_OPCODE_OFF);
            let syndrome = if opcode == wire::bth_opcode::RC_ACK {
                let aeth: *const u8 = ptr_at::<[u8; wire::AETH_LEN]>(
                    data,
                    end,
                    l4_off + wire::UDP_HLEN + wire::BTH_LEN,
                )?
                .cast();
                rd8(aeth, 0)
            } else {
                0
            };
            let bth = Bth {
                opcode,
                syndrome,
                dest_qp: rd32(bth, 4) & wire::PSN_MASK,
                psn: rd32(bth, 8) & wire::PSN_MASK,
            };
            (flow_kind::ROCEV2, bth)
        } else {
            (flow_kind::UDP, Bth::NONE)
        };
        (rd16(udp, 0), dst_port, kind, l3_bytes, payload, TcpInfo::NONE, bth)
    };
    Ok(Packet {
        key: FlowKey {
            src_addr: addr_bytes(src),
            dst_addr: addr_bytes(dst),
            src_port,
            dst_port,
            ifindex: 0,
            protocol,
            direction: 0,
            kind,
            _pad: 0,
        },
        ecn,
        segments,
        gso_size,
        l3_bytes,
        payload_bytes,
        tcp,
        bth,
    })
}

/// The option bytes of Linux's timestamp option as every Linux segment carries it first
/// (NOP, NOP, kind 8, length 10).
const TCP_TS_LEAD: u32 = 0x0101_080a;

/// NOP, NOP, then the SACK option's kind: how Linux (and the BSDs) align a SACK option.
const TCP_SACK_LEAD: u32 = 0x0101_0500;

/// Whether a pure ACK carries a D-SACK (RFC 2883): a SACK option whose first block starts before
/// the ACK number, i.e. reports data that arrived again after it had been acknowledged. The
/// receiver's word that a retransmission was spurious (a tail loss probe fired before a late
/// ACK, an early timeout): Linux's sender counts the same blocks (TCPDSACKRecv) to undo its
/// congestion response. Only the first-block-below-ACK form is recognised; a D-SACK for data
/// above the ACK (first block inside the second) is not.
///
/// The SACK option is looked for where Linux and the BSDs put it, after two NOPs, either first or
/// right after the timestamp option (itself after two NOPs): a fixed place, not a walk over the
/// options, which cost the verifier more states (616,729 instructions walked with the walk, from
/// the flow lookup). A SACK elsewhere is not read, and its retransmissions count as before.
/// Reads nothing outside the packet's linear data and the header's length; anything malformed
/// is "no".
///
/// `data` and `end` are the packet's bounds as the caller read them (`ctx.data()`,
/// `ctx.data_end()`): passed as packet pointers, not re-read from the context here, which LLVM
/// would turn into a 32-bit truncation of a pointer that the verifier refuses.
#[inline(never)]
pub fn dsack(data: usize, end: usize, off: u32, hlen: u32, ack: u32) -> bool {
    // Masks bound both for the verifier: the header starts within 82 bytes, and is at most 60.
    let off = (off & 0x7f) as usize;
    let hlen = (hlen & 0x3f) as usize;
    // The SACK's first block is 4 bytes (NOP, NOP, kind, length) after `at`, 8 bytes long.
    let at = if hlen >= wire::TCP_MIN_HLEN + 12 + 12 {
        let Ok(lead) = ptr_at::<[u8; 4]>(data, end, off + wire::TCP_MIN_HLEN) else { return false };
        if rd32(lead.cast(), 0) == TCP_TS_LEAD { wire::TCP_MIN_HLEN + 12 } else { wire::TCP_MIN_HLEN }
    } else if hlen >= wire::TCP_MIN_HLEN + 12 {
        wire::TCP_MIN_HLEN
    } else {
        return false;
    };
    let Ok(o) = ptr_at::<[u8; 12]>(data, end, off + at) else { return false };
    let o: *const u8 = o.cast();
    // NOP, NOP, SACK, and a length of at least one block.
    if rd32(o, 0) & 0xffff_ff00 != TCP_SACK_LEAD || rd8(o, 3) < 10 {
        return false;
    }
    (ack.wrapping_sub(rd32(o, 4)) as i32) > 0
}
