//! Crafted RoCEv2 traffic: ordinary UDP datagrams to port 4791 whose payload is a real InfiniBand
//! Base Transport Header (there is no RDMA hardware or Soft-RoCE on the CI kernels).
//!
//! [`plan`] decides, as a pure function, which packets a [`RoceSpec`] produces (PSNs, gaps, CE
//! marks, CNPs, NAKs); [`encode`] lays one out; [`roce_send`] sends them and reports exactly what
//! went out. [`RoceSink`] counts what arrives, parsing the BTH and the IP ECN field.
//!
//! Layout (IBA Vol. 1 §9.2, Annex A17): BTH = opcode(1) flags(1: SE M PadCnt TVer) P_Key(2)
//! FECN/BECN(1) DestQP(3) AckReq(1) PSN(3), big-endian; then AETH (ACK/NAK only), payload, pad to
//! 4 bytes, optional 4-byte ICRC. The ICRC we append is a zero placeholder, not a valid CRC (it
//! covers IP header fields the kernel fills in); nothing in ringside checks it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use dataplane_common::wire::{self, bth_opcode};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// IANA port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// A NAK "PSN sequence error" AETH syndrome (NAK kind 011, code 00000).
pub const AETH_NAK_PSN_SEQ_ERR: u8 = wire::AETH_SYNDROME_NAK;
/// Reserved bytes after the BTH of a CNP (Annex A17.9.3).
pub const CNP_PAYLOAD_LEN: usize = 16;
/// ICRC trailer length.
pub const ICRC_LEN: usize = 4;

/// What to send. `RoceSpec { to, packets: 100, ..Default::default() }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoceSpec {
    /// Destination, normally `<peer>:4791`.
    pub to: SocketAddr,
    /// UDP source port; 0 picks an ephemeral one. RoCE NICs use it as flow entropy.
    pub src_port: u16,
    /// Destination queue pair (24 bits).
    pub dest_qp: u32,
    /// PSN of the first data packet (24 bits, wraps).
    pub start_psn: u32,
    /// Data packets actually sent. PSNs listed in `skip_psns` are stepped over, so the PSN range
    /// covered is `packets` plus the skipped PSNs met on the way.
    pub packets: usize,
    /// Payload bytes per data packet (after the BTH).
    pub payload_len: usize,
    /// PSNs deliberately not sent, creating gaps a monitor should see.
    pub skip_psns: Vec<u32>,
    /// Number of data packets sent with IP ECN = CE (0b11), spread evenly over the data packets.
    pub ce_marks: usize,
    /// Number of CNPs (BTH opcode 0x81) sent, interleaved with the data.
    pub cnps: usize,
    /// Number of NAKs (opcode 0x11 with AETH syndrome 0x60) sent, interleaved with the data.
    pub naks: usize,
    /// BTH opcode of data packets. Default RC RDMA WRITE Only (0x0a).
    pub data_opcode: u8,
    /// Mark non-CE packets ECN-capable (ECT(0)), as DCQCN senders do. Default true.
    pub ect: bool,
    /// DSCP of every packet. Default 26 (AF31, a common RoCE class).
    pub dscp: u8,
    /// P_Key. Default 0xffff.
    pub p_key: u16,
    /// Append a (placeholder) 4-byte ICRC. Default true.
    pub icrc: bool,
    /// Pace to this many packets per second; `None` sends as fast as possible.
    pub pps: Option<u64>,
}

impl Default for RoceSpec {
    fn default() -> Self {
        RoceSpec {
            to: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), ROCEV2_UDP_PORT),
            src_port: 0,
            dest_qp: 0x11,
            start_psn: 0,
            packets: 0,
            payload_len: 1024,
            skip_psns: Vec::new(),
            ce_marks: 0,
            cnps: 0,
            naks: 0,
            data_opcode: bth_opcode::RC_RDMA_WRITE_ONLY,
            ect: true,
            dscp: 26,
            p_key: 0xffff,
            icrc: true,
            pps: None,
        }
    }
}

/// What kind of packet a planned packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketKind {
    Data,
    Cnp,
    Nak,
}

/// One packet of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedPacket {
    pub kind: PacketKind,
    pub opcode: u8,
    pub psn: u32,
    /// IP ECN = CE.
    pub ce: bool,
    /// BTH AckReq bit (set on the last data packet).
    pub ack_req: bool,
}

/// `true` for `n` of `total` indices, spread evenly: index `i` is chosen when
/// `floor((i+1)·n/total) > floor(i·n/total)`.
fn spread(i: usize, n: usize, total: usize) -> bool {
    total > 0 && ((i + 1) * n / total) > (i * n / total)
}

/// Decides every packet a spec produces, in sending order.
pub fn plan(spec: &RoceSpec) -> Result<Vec<PlannedPacket>> {
    let bad = |field: &'static str, reason: String| Err(Error::InvalidArgument { field, reason });
    if spec.to.ip().is_unspecified() || spec.to.port() == 0 {
        return bad("to", format!("{} (give the peer's address, e.g. 10.77.0.2:4791)", spec.to));
    }
    if spec.ce_marks > spec.packets {
        return bad("ce_marks", format!("{} is more than the {} data packets", spec.ce_marks, spec.packets));
    }
    if spec.dest_qp > wire::PSN_MASK {
        return bad("dest_qp", format!("{:#x} does not fit 24 bits", spec.dest_qp));
    }
    if spec.start_psn > wire::PSN_MASK {
        return bad("start_psn", format!("{:#x} does not fit 24 bits", spec.start_psn));
    }
    if spec.dscp > 63 {
        return bad("dscp", format!("{} (must be 0..=63)", spec.dscp));
    }
    let total = spec.packets + spec.cnps + spec.naks;
    if total > 100_000_000 {
        return bad("packets", format!("{total} packets in one call is too many (limit 100000000)"));
    }
    if spec.skip_psns.len() > wire::PSN_MASK as usize / 2 {
        return bad("skip_psns", "would skip most of the PSN space".into());
    }
    let skip: BTreeSet<u32> = spec.skip_psns.iter().map(|p| p & wire::PSN_MASK).collect();

    let mut data = Vec::with_capacity(spec.packets);
    let mut psn = spec.start_psn;
    let mut first_gap_psn = None;
    for i in 0..spec.packets {
        while skip.contains(&psn) {
            if i > 0 && first_gap_psn.is_none() {
                first_gap_psn = Some(psn);
            }
            psn = (psn + 1) & wire::PSN_MASK;
        }
        data.push(PlannedPacket {
            kind: PacketKind::Data,
            opcode: spec.data_opcode,
            psn,
            ce: spread(i, spec.ce_marks, spec.packets),
            ack_req: i + 1 == spec.packets,
        });
        psn = (psn + 1) & wire::PSN_MASK;
    }
    // A NAK names the PSN the receiver expected: the first one missing.
    let nak_psn = first_gap_psn.unwrap_or(spec.start_psn);
    let control: Vec<PlannedPacket> = (0..spec.cnps)
        .map(|_| PlannedPacket { kind: PacketKind::Cnp, opcode: bth_opcode::CNP, psn: 0, ce: false, ack_req: false })
        .chain((0..spec.naks).map(|_| PlannedPacket { kind: PacketKind::Nak, opcode: bth_opcode::RC_ACK, psn: nak_psn, ce: false, ack_req: false }))
        .collect();

    // Control packet j goes after data packet floor((j+1)·packets/(m+1)) - 1 (or first if 0).
    let m = control.len();
    let mut out = Vec::with_capacity(total);
    let mut ctl = control.into_iter().enumerate().peekable();
    let slot = |j: usize| (j + 1) * spec.packets / (m + 1);
    while let Some((_, c)) = ctl.next_if(|(j, _)| slot(*j) == 0) {
        out.push(c);
    }
    for (i, d) in data.into_iter().enumerate() {
        out.push(d);
        while let Some((_, c)) = ctl.next_if(|(j, _)| slot(*j) <= i + 1) {
            out.push(c);
        }
    }
    out.extend(ctl.map(|(_, c)| c));
    Ok(out)
}

/// Lays out the UDP payload of `p` (BTH, AETH, payload, pad, ICRC) into `buf`.
pub fn encode(spec: &RoceSpec, p: &PlannedPacket, buf: &mut Vec<u8>) {
    buf.clear();
    let (body_len, becn) = match p.kind {
        PacketKind::Data => (spec.payload_len, false),
        PacketKind::Cnp => (CNP_PAYLOAD_LEN, true),
        PacketKind::Nak => (0, false),
    };
    let pad = (4 - body_len % 4) % 4;
    buf.push(p.opcode);
    // SE=0, M=1 (migrated, as NICs send), PadCnt, TVer=0.
    buf.push(0x40 | ((pad as u8) << 4));
    buf.extend_from_slice(&spec.p_key.to_be_bytes());
    buf.push(if becn { 0x40 } else { 0x00 });
    buf.extend_from_slice(&spec.dest_qp.to_be_bytes()[1..]);
    buf.push(if p.ack_req { 0x80 } else { 0x00 });
    buf.extend_from_slice(&(p.psn & wire::PSN_MASK).to_be_bytes()[1..]);
    debug_assert_eq!(buf.len(), wire::BTH_LEN);
    if p.kind == PacketKind::Nak {
        buf.push(AETH_NAK_PSN_SEQ_ERR);
        buf.extend_from_slice(&[0, 0, 0]); // MSN
    }
    match p.kind {
        PacketKind::Data => buf.extend((0..body_len).map(|i| (i % 251) as u8)),
        _ => buf.resize(buf.len() + body_len, 0),
    }
    buf.resize(buf.len() + pad, 0);
    if spec.icrc {
        buf.extend_from_slice(&[0; ICRC_LEN]);
    }
}

/// Parsed BTH fields of a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    pub dest_qp: u32,
    pub psn: u32,
    pub ack_req: bool,
    pub becn: bool,
    /// AETH syndrome, for ACK/NAK opcodes.
    pub aeth_syndrome: Option<u8>,
}

/// Parses the BTH (and AETH for acknowledges) at the start of a UDP payload.
pub fn parse_bth(b: &[u8]) -> Option<Bth> {
    let bth = b.get(..wire::BTH_LEN)?;
    let u24 = |o: usize| u32::from_be_bytes([0, bth[o], bth[o + 1], bth[o + 2]]);
    let opcode = bth[wire::BTH_OPCODE_OFF];
    let aeth_syndrome = if opcode == bth_opcode::RC_ACK { b.get(wire::BTH_LEN).copied() } else { None };
    Some(Bth {
        opcode,
        dest_qp: u24(wire::BTH_DEST_QP_OFF),
        psn: u24(wire::BTH_PSN_OFF),
        ack_req: bth[8] & 0x80 != 0,
        becn: bth[4] & 0x40 != 0,
        aeth_syndrome,
    })
}

/// Exactly what [`roce_send`] sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RoceSendReport {
    pub to: String,
    pub from: String,
    pub dest_qp: u32,
    /// All datagrams sent.
    pub packets_sent: u64,
    /// Datagrams per BTH opcode, keyed `0x0a`, `0x11`, `0x81`...
    pub by_opcode: BTreeMap<String, u64>,
    pub data_packets: u64,
    pub first_psn: Option<u32>,
    pub last_psn: Option<u32>,
    /// Jumps between consecutive data PSNs (a monitor sees one gap per jump).
    pub psn_gaps: u64,
    /// PSNs missing inside those jumps.
    pub skipped_psns: u64,
    pub ce_marked: u64,
    pub cnps: u64,
    pub naks: u64,
    /// Application payload of data packets (no BTH, pad or ICRC).
    pub payload_bytes: u64,
    /// UDP payload bytes of all datagrams (BTH and everything after it).
    pub udp_payload_bytes: u64,
    /// IP + UDP + UDP payload bytes of all datagrams, as an L3 counter would count them.
    pub l3_bytes: u64,
    pub duration_ms: f64,
}

/// The report of a plan, before sending (pure).
pub fn summarize(spec: &RoceSpec, plan: &[PlannedPacket]) -> RoceSendReport {
    let ip_hdr = if spec.to.is_ipv4() { wire::IPV4_MIN_HLEN } else { wire::IPV6_HLEN } as u64;
    let mut r = RoceSendReport { to: spec.to.to_string(), dest_qp: spec.dest_qp, ..Default::default() };
    let mut buf = Vec::new();
    let mut prev: Option<u32> = None;
    for p in plan {
        encode(spec, p, &mut buf);
        r.packets_sent += 1;
        *r.by_opcode.entry(format!("{:#04x}", p.opcode)).or_default() += 1;
        r.udp_payload_bytes += buf.len() as u64;
        r.l3_bytes += ip_hdr + wire::UDP_HLEN as u64 + buf.len() as u64;
        r.ce_marked += p.ce as u64;
        match p.kind {
            PacketKind::Data => {
                r.data_packets += 1;
                r.payload_bytes += spec.payload_len as u64;
                r.first_psn.get_or_insert(p.psn);
                r.last_psn = Some(p.psn);
                if let Some(q) = prev {
                    let step = p.psn.wrapping_sub(q) & wire::PSN_MASK;
                    if step > 1 {
                        r.psn_gaps += 1;
                        r.skipped_psns += (step - 1) as u64;
                    }
                }
                prev = Some(p.psn);
            }
            PacketKind::Cnp => r.cnps += 1,
            PacketKind::Nak => r.naks += 1,
        }
    }
    r
}

fn set_tos(sock: &UdpSocket, v6: bool, tos: u8) -> std::io::Result<()> {
    let v: libc::c_int = tos as libc::c_int;
    let (level, name) = if v6 { (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) } else { (libc::IPPROTO_IP, libc::IP_TOS) };
    // SAFETY: setsockopt with an int option value.
    let rc = unsafe {
        libc::setsockopt(sock.as_raw_fd(), level, name, (&v as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sends the packets of `spec` from the calling thread's namespace (call it inside
/// [`crate::Netns::run`]) and reports exactly what was sent. Uses an unconnected socket, so a
/// missing receiver (ICMP port unreachable) does not abort the run.
pub fn roce_send(spec: &RoceSpec) -> Result<RoceSendReport> {
    let packets = plan(spec)?;
    let v6 = spec.to.is_ipv6();
    let bind: SocketAddr = if v6 {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), spec.src_port)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), spec.src_port)
    };
    let sock_err = |op: &'static str| move |source| Error::Socket { op, addr: spec.to.to_string(), source };
    let sock = UdpSocket::bind(bind).map_err(|source| Error::Socket { op: "bind", addr: bind.to_string(), source })?;
    let ecn_normal = if spec.ect { 0b10 } else { 0 };
    let tos_normal = (spec.dscp << 2) | ecn_normal;
    let tos_ce = (spec.dscp << 2) | wire::ECN_CE;
    set_tos(&sock, v6, tos_normal).map_err(sock_err("set TOS for"))?;
    let mut current_tos = tos_normal;
    let start = Instant::now();
    let mut buf = Vec::with_capacity(spec.payload_len + 64);
    for (k, p) in packets.iter().enumerate() {
        if let Some(pps) = spec.pps.filter(|&r| r > 0) {
            let due = Duration::from_secs_f64(k as f64 / pps as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let want = if p.ce { tos_ce } else { tos_normal };
        if want != current_tos {
            set_tos(&sock, v6, want).map_err(sock_err("set TOS for"))?;
            current_tos = want;
        }
        encode(spec, p, &mut buf);
        let mut sent = false;
        // ENOBUFS can happen on a saturated queue: retry a bounded number of times.
        for attempt in 0..100 {
            match sock.send_to(&buf, spec.to) {
                Ok(_) => {
                    sent = true;
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) || e.kind() == std::io::ErrorKind::Interrupted => {
                    std::thread::sleep(Duration::from_micros(100 * (attempt + 1)));
                }
                Err(e) => return Err(sock_err("send to")(e)),
            }
        }
        if !sent {
            return Err(Error::Timeout { what: format!("sending packet {k} to {}", spec.to), waited: start.elapsed(), detail: "ENOBUFS".into() });
        }
    }
    let mut report = summarize(spec, &packets);
    report.from = sock.local_addr().map(|a| a.to_string()).unwrap_or_default();
    report.duration_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(report)
}

/// What a [`RoceSink`] received.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RoceRecvReport {
    pub listen: String,
    pub datagrams: u64,
    /// UDP payload bytes.
    pub bytes: u64,
    pub by_opcode: BTreeMap<String, u64>,
    /// Datagrams whose IP ECN field was CE.
    pub ce_marked: u64,
    pub naks: u64,
    pub cnps: u64,
    /// Datagrams too short to hold a BTH.
    pub not_roce: u64,
    /// Gaps in the data packets' PSNs as received (CNPs and ACK/NAKs left out): how many times a
    /// data packet's PSN was more than one past the furthest one so far (24 bits, wrapping), as
    /// an in-order monitor counts them. The sender's skipped PSNs show up here, so does each run
    /// of datagrams lost together, and so does each packet reordered on the way (veth and bridge
    /// links reorder under load: one gap and one skipped PSN per late packet).
    pub psn_gaps: u64,
    /// PSNs missing in those gaps.
    pub skipped_psns: u64,
    /// Data packets that arrived late, with a PSN skipped before: reordered, not lost.
    pub reordered: u64,
    /// Data packets at or behind the furthest PSN whose PSN was not missing: duplicates.
    pub duplicates: u64,
    /// Data packets behind the first one received, each PSN once: the stream's head overtaken, not
    /// duplicates (CI saw 3 of 2000 arrive behind a later one on a fresh veth pair; the likely
    /// cause: packets the kernel queued while it resolved the neighbour leave after ones sent once
    /// it was resolved).
    /// Neither gaps nor skipped PSNs, as an in-order monitor starting at the first packet sees them.
    pub overtaken: u64,
    /// Skipped PSNs that never arrived (`skipped_psns - reordered`).
    pub unreceived_psns: u64,
    /// Runs of consecutive PSNs that never arrived: the gaps left once late packets are in.
    pub unreceived_runs: u64,
    pub duration_ms: f64,
}

/// The data PSNs of one stream as a receiver sees them ([`RoceRecvReport`]'s PSN fields): gaps as
/// they arrive, and which skipped PSNs arrived late, so that loss can be told from reordering.
/// PSNs are extended past the 24-bit wrap into a 64-bit position; at most [`Self::MAX_MISSING`]
/// missing PSNs are remembered (beyond that they count as never received).
#[derive(Debug, Default)]
struct PsnTracker {
    /// The furthest PSN so far and its extended position.
    last: Option<(u32, u64)>,
    missing: BTreeSet<u64>,
    /// Positions behind the first PSN received that arrived (at most [`Self::MAX_MISSING`]; past
    /// that, such packets count as duplicates).
    before_first: BTreeSet<u64>,
    /// Missing PSNs not remembered (the set was full), and the gaps they were in.
    forgotten_psns: u64,
    forgotten_runs: u64,
}

impl PsnTracker {
    const MAX_MISSING: usize = 1 << 16;
    /// The first PSN's extended position: far from 0, so that a late packet's is not negative.
    const ORIGIN: u64 = 1 << 32;

    fn see(&mut self, psn: u32, r: &mut RoceRecvReport) {
        let Some((last, pos)) = self.last else {
            self.last = Some((psn, Self::ORIGIN));
            return;
        };
        // Forward by 1..2^23 (mod 2^24) is the stream going on; anything else is behind.
        let step = psn.wrapping_sub(last) & wire::PSN_MASK;
        if (1..1 << 23).contains(&step) {
            if step > 1 {
                r.psn_gaps += 1;
                r.skipped_psns += u64::from(step - 1);
                let room = Self::MAX_MISSING.saturating_sub(self.missing.len()) as u64;
                let keep = room.min(u64::from(step - 1));
                self.missing.extend(pos + 1..pos + 1 + keep);
                self.forgotten_psns += u64::from(step - 1) - keep;
                self.forgotten_runs += u64::from(keep == 0);
            }
            self.last = Some((psn, pos + u64::from(step)));
        } else {
            let back = last.wrapping_sub(psn) & wire::PSN_MASK;
            let at = pos - u64::from(back);
            if self.missing.remove(&at) {
                r.reordered += 1;
            } else if at < Self::ORIGIN && self.before_first.len() < Self::MAX_MISSING && self.before_first.insert(at) {
                r.overtaken += 1;
            } else {
                r.duplicates += 1;
            }
        }
    }

    /// Fills in the report's `unreceived_*` fields.
    fn finish(&self, r: &mut RoceRecvReport) {
        r.unreceived_psns = self.missing.len() as u64 + self.forgotten_psns;
        r.unreceived_runs = self.missing.iter().filter(|&&p| !self.missing.contains(&(p - 1))).count() as u64 + self.forgotten_runs;
    }
}

/// A UDP receiver for RoCEv2 datagrams that counts them and reads their ECN bits.
#[derive(Debug)]
pub struct RoceSink {
    sock: UdpSocket,
    v6: bool,
}

impl RoceSink {
    /// Binds `listen` (inside a namespace: `ns.run(|| RoceSink::bind(addr))`) with a large receive
    /// buffer so a fast sender does not overflow it.
    pub fn bind(listen: SocketAddr) -> Result<RoceSink> {
        let err = |op: &'static str| move |source| Error::Socket { op, addr: listen.to_string(), source };
        let sock = UdpSocket::bind(listen).map_err(err("bind"))?;
        let v6 = listen.is_ipv6();
        let one: libc::c_int = 1;
        let big: libc::c_int = 64 << 20;
        let (level, name) = if v6 { (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS) } else { (libc::IPPROTO_IP, libc::IP_RECVTOS) };
        // SAFETY: setsockopt with int values on a socket we own.
        unsafe {
            let sz = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            if libc::setsockopt(sock.as_raw_fd(), level, name, (&one as *const libc::c_int).cast(), sz) != 0 {
                return Err(err("enable TOS reporting on")(std::io::Error::last_os_error()));
            }
            // SO_RCVBUFFORCE (root) goes past net.core.rmem_max; fall back to SO_RCVBUF.
            if libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, (&big as *const libc::c_int).cast(), sz) != 0 {
                libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, (&big as *const libc::c_int).cast(), sz);
            }
        }
        Ok(RoceSink { sock, v6 })
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.sock.local_addr().map_err(|source| Error::Socket { op: "query", addr: "udp socket".into(), source })
    }

    /// Receives until `expected` datagrams arrived (if given), or nothing arrived for `idle`
    /// after the first datagram, or `timeout` passed overall.
    pub fn receive(&self, expected: Option<u64>, idle: Duration, timeout: Duration) -> Result<RoceRecvReport> {
        let listen = self.local_addr()?;
        let mut r = RoceRecvReport { listen: listen.to_string(), ..Default::default() };
        let start = Instant::now();
        let mut buf = vec![0u8; 65536];
        let mut first: Option<Instant> = None;
        let mut last = Instant::now();
        let mut psns = PsnTracker::default();
        // Bounded: at most one iteration per datagram or per 20 ms timeout tick.
        for _ in 0..u64::MAX {
            if expected.is_some_and(|e| r.datagrams >= e) || start.elapsed() >= timeout {
                break;
            }
            if first.is_some() && last.elapsed() >= idle {
                break;
            }
            self.sock
                .set_read_timeout(Some(Duration::from_millis(20)))
                .map_err(|source| Error::Socket { op: "configure", addr: listen.to_string(), source })?;
            match recv_with_tos(&self.sock, self.v6, &mut buf) {
                Ok((n, tos)) => {
                    last = Instant::now();
                    first.get_or_insert(last);
                    r.datagrams += 1;
                    r.bytes += n as u64;
                    if tos.is_some_and(|t| t & wire::ECN_MASK == wire::ECN_CE) {
                        r.ce_marked += 1;
                    }
                    match parse_bth(&buf[..n]) {
                        Some(b) => {
                            *r.by_opcode.entry(format!("{:#04x}", b.opcode)).or_default() += 1;
                            if b.opcode == bth_opcode::CNP {
                                r.cnps += 1;
                            }
                            if b.aeth_syndrome.is_some_and(|s| s & wire::AETH_SYNDROME_KIND_MASK == wire::AETH_SYNDROME_NAK) {
                                r.naks += 1;
                            }
                            if b.opcode != bth_opcode::CNP && b.opcode != bth_opcode::RC_ACK {
                                psns.see(b.psn, &mut r);
                            }
                        }
                        None => r.not_roce += 1,
                    }
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {}
                Err(source) => return Err(Error::Socket { op: "receive on", addr: listen.to_string(), source }),
            }
        }
        r.duration_ms = first.map(|f| (last - f).as_secs_f64() * 1e3).unwrap_or(0.0);
        psns.finish(&mut r);
        Ok(r)
    }
}

/// `recvmsg` returning the datagram length and the IP TOS / IPv6 traffic class if reported.
fn recv_with_tos(sock: &UdpSocket, v6: bool, buf: &mut [u8]) -> std::io::Result<(usize, Option<u8>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut cmsg_buf = [0u64; 16]; // 128 bytes, 8-aligned
    // SAFETY: msghdr points at live buffers of the given lengths; CMSG_* walk only within them.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg_buf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cmsg_buf) as _;
        let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, 0);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut tos = None;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            if !v6 && (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TOS {
                tos = Some(*data);
            } else if v6 && (*c).cmsg_level == libc::IPPROTO_IPV6 && (*c).cmsg_type == libc::IPV6_TCLASS {
                tos = Some(std::ptr::read_unaligned(data.cast::<libc::c_int>()) as u8);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        Ok((n as usize, tos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RoceSpec {
        RoceSpec { to: "10.77.0.2:4791".parse().unwrap(), packets: 10, payload_len: 100, ..Default::default() }
    }

    #[test]
    fn bth_round_trip() {
        let s = RoceSpec { dest_qp: 0xabcdef, ..spec() };
        let p = PlannedPacket { kind: PacketKind::Data, opcode: 0x0a, psn: 0x123456, ce: false, ack_req: true };
        let mut buf = Vec::new();
        encode(&s, &p, &mut buf);
        assert_eq!(buf.len(), 12 + 100 + 4);
        assert_eq!(&buf[..12], &[0x0a, 0x40, 0xff, 0xff, 0x00, 0xab, 0xcd, 0xef, 0x80, 0x12, 0x34, 0x56]);
        let b = parse_bth(&buf).unwrap();
        assert_eq!((b.opcode, b.dest_qp, b.psn, b.ack_req, b.becn), (0x0a, 0xabcdef, 0x123456, true, false));
    }

    #[test]
    fn pad_count_and_nak_layout() {
        let s = RoceSpec { payload_len: 5, icrc: false, ..spec() };
        let mut buf = Vec::new();
        encode(&s, &PlannedPacket { kind: PacketKind::Data, opcode: 0x0a, psn: 1, ce: false, ack_req: false }, &mut buf);
        assert_eq!(buf.len(), 12 + 8);
        assert_eq!((buf[1] >> 4) & 0b11, 3);
        encode(&s, &PlannedPacket { kind: PacketKind::Nak, opcode: 0x11, psn: 7, ce: false, ack_req: false }, &mut buf);
        assert_eq!(buf.len(), 16);
        let b = parse_bth(&buf).unwrap();
        assert_eq!(b.aeth_syndrome, Some(0x60));
        encode(&s, &PlannedPacket { kind: PacketKind::Cnp, opcode: 0x81, psn: 0, ce: false, ack_req: false }, &mut buf);
        assert_eq!(buf.len(), 12 + 16);
        assert!(parse_bth(&buf).unwrap().becn);
    }

    #[test]
    fn plan_counts_gaps_marks_and_control() {
        let s = RoceSpec { start_psn: 100, skip_psns: vec![103, 104, 110, 100], ce_marks: 3, cnps: 2, naks: 1, ..spec() };
        let p = plan(&s).unwrap();
        let data: Vec<u32> = p.iter().filter(|x| x.kind == PacketKind::Data).map(|x| x.psn).collect();
        assert_eq!(data, vec![101, 102, 105, 106, 107, 108, 109, 111, 112, 113]);
        let r = summarize(&s, &p);
        assert_eq!(r.packets_sent, 13);
        assert_eq!(r.data_packets, 10);
        assert_eq!((r.psn_gaps, r.skipped_psns), (2, 3));
        assert_eq!((r.ce_marked, r.cnps, r.naks), (3, 2, 1));
        assert_eq!(r.by_opcode["0x0a"], 10);
        assert_eq!(r.by_opcode["0x81"], 2);
        assert_eq!(r.by_opcode["0x11"], 1);
        assert_eq!(r.payload_bytes, 1000);
        // data: 20+8+12+100+4; cnp: 20+8+12+16+4; nak: 20+8+12+4+4
        assert_eq!(r.l3_bytes, 10 * 144 + 2 * 60 + 48);
        // the NAK names the first missing PSN
        assert_eq!(p.iter().find(|x| x.kind == PacketKind::Nak).unwrap().psn, 103);
        // the last data packet asks for an ACK
        assert!(p.iter().rev().find(|x| x.kind == PacketKind::Data).unwrap().ack_req);
    }

    #[test]
    fn psn_wraps() {
        let s = RoceSpec { start_psn: 0xFF_FFFE, packets: 4, skip_psns: vec![0], ..spec() };
        let p = plan(&s).unwrap();
        let data: Vec<u32> = p.iter().map(|x| x.psn).collect();
        assert_eq!(data, vec![0xFF_FFFE, 0xFF_FFFF, 1, 2]);
        let r = summarize(&s, &p);
        assert_eq!((r.psn_gaps, r.skipped_psns), (1, 1));
    }

    #[test]
    fn ce_spread_is_exact() {
        for n in 0..=10 {
            assert_eq!((0..10).filter(|&i| spread(i, n, 10)).count(), n);
        }
        assert!(plan(&RoceSpec { ce_marks: 11, ..spec() }).is_err());
        assert!(plan(&RoceSpec { to: "0.0.0.0:4791".parse().unwrap(), ..spec() }).is_err());
    }

    #[test]
    fn the_sink_counts_the_psn_gaps_it_receives_across_the_wrap_and_leaves_cnps_out() {
        let sink = RoceSink::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let to = sink.local_addr().unwrap();
        // PSNs 0xfffffd, 0xfffffe, [0xffffff skipped], 0, [1, 2 skipped], 3, 4, 5: two gaps of 1 and
        // 2 PSNs, one of them across the 24-bit wrap; the CNPs carry PSN 0 and are not data.
        let spec = RoceSpec { to, start_psn: 0xfffffd, packets: 6, payload_len: 16, skip_psns: vec![0xffffff, 1, 2], cnps: 2, ..Default::default() };
        let sent = roce_send(&spec).unwrap();
        assert_eq!((sent.data_packets, sent.cnps, sent.psn_gaps, sent.skipped_psns), (6, 2, 2, 3));
        let got = sink.receive(Some(sent.packets_sent), Duration::from_secs(1), Duration::from_secs(10)).unwrap();
        assert_eq!(got.datagrams, sent.packets_sent, "{got:?}");
        assert_eq!((got.cnps, got.psn_gaps, got.skipped_psns), (2, 2, 3), "{got:?}");
        assert_eq!((got.reordered, got.duplicates, got.unreceived_psns, got.unreceived_runs), (0, 0, 3, 2), "{got:?}");
    }

    /// The tracker on PSN sequences as a reordering, lossy, duplicating link delivers them.
    fn track(psns: &[u32]) -> RoceRecvReport {
        let mut t = PsnTracker::default();
        let mut r = RoceRecvReport::default();
        for &p in psns {
            t.see(p, &mut r);
        }
        t.finish(&mut r);
        r
    }

    fn psn_fields(r: &RoceRecvReport) -> [u64; 7] {
        [r.psn_gaps, r.skipped_psns, r.reordered, r.duplicates, r.unreceived_psns, r.unreceived_runs, r.overtaken]
    }

    #[test]
    fn late_packets_are_reordered_not_lost_and_the_runs_never_received_remain() {
        // In order, no loss.
        assert_eq!(psn_fields(&track(&[5, 6, 7, 8])), [0, 0, 0, 0, 0, 0, 0]);
        // 7 arrives after 8: one gap as received, nothing unreceived.
        assert_eq!(psn_fields(&track(&[5, 6, 8, 7, 9])), [1, 1, 1, 0, 0, 0, 0]);
        // 11 and 12 skipped by the sender, 14 arrives after 15: two gaps as received (3 PSNs), one
        // left (2 PSNs).
        assert_eq!(psn_fields(&track(&[10, 13, 15, 14, 16])), [2, 3, 1, 0, 2, 1, 0]);
        // A late packet inside a real gap splits it: 21..24 missing, 22 comes late -> runs 21 and 23-24.
        assert_eq!(psn_fields(&track(&[20, 25, 22, 26])), [1, 4, 1, 0, 3, 2, 0]);
        // Duplicates: the furthest PSN again, and one behind that was never missing.
        assert_eq!(psn_fields(&track(&[1, 2, 3, 3, 2, 4])), [0, 0, 0, 2, 0, 0, 0]);
        // Across the 24-bit wrap: 0xffffff comes after 0 and 1 (skipped by the sender).
        assert_eq!(psn_fields(&track(&[0xfffffd, 0xfffffe, 0, 0xffffff, 2])), [2, 2, 1, 0, 1, 1, 0]);
    }

    #[test]
    fn packets_behind_the_first_one_received_are_overtaken_once_and_duplicates_after() {
        // CI's t2_rig (stop 44): three data packets arrived behind the first one received; they
        // were counted as duplicates, and a stream that lost nothing looked duplicated.
        assert_eq!(psn_fields(&track(&[1003, 1000, 1001, 1002, 1004, 1005])), [0, 0, 0, 0, 0, 0, 3]);
        // The same PSN behind the first again is a duplicate; so is the first one again.
        assert_eq!(psn_fields(&track(&[1003, 1001, 1001, 1003, 1004])), [0, 0, 0, 2, 0, 0, 1]);
        // Across the wrap, with a gap after the first packet.
        assert_eq!(psn_fields(&track(&[1, 0xffffff, 0, 3])), [1, 1, 0, 0, 1, 1, 2]);
    }

    #[test]
    fn a_huge_gap_is_remembered_up_to_the_bound_and_counted_whole() {
        let max = PsnTracker::MAX_MISSING as u32;
        // A gap larger than the bound, then another once the set is full.
        let r = track(&[0, max + 10, max + 20]);
        assert_eq!((r.psn_gaps, r.skipped_psns), (2, u64::from(max) + 9 + 9));
        assert_eq!((r.unreceived_psns, r.unreceived_runs), (u64::from(max) + 18, 2));
    }
}
