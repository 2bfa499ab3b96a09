//! TCP traffic with exact accounting: [`tcp_send`] sends exactly N payload bytes on each of S
//! streams and reports the kernel's own counts from `TCP_INFO` (segments out, retransmissions),
//! [`TcpSink`] receives and reports per-connection byte counts.
//!
//! Ground truth for the eBPF monitor: payload bytes are exact; `segs_out` / `data_segs_out` count
//! MSS-sized segments (GSO segments counted individually), so with offloads on a TC program sees
//! fewer, larger packets than `segs_out`. [`TcpStreamReport::l3_bytes_estimate`] assumes every
//! segment carries a 20-byte IPv4 (40 IPv6) header and a TCP header with the timestamp option.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, Result};

/// The kernel's `struct tcp_info` (include/uapi/linux/tcp.h) up to `tcpi_rcv_wnd`; the kernel
/// copies min(len, its size), and we zero-fill, so fields unknown to an older kernel read 0.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct RawTcpInfo {
    pub state: u8,
    pub ca_state: u8,
    pub retransmits: u8,
    pub probes: u8,
    pub backoff: u8,
    pub options: u8,
    pub wscale: u8,
    pub flags: u8,
    pub rto: u32,
    pub ato: u32,
    pub snd_mss: u32,
    pub rcv_mss: u32,
    pub unacked: u32,
    pub sacked: u32,
    pub lost: u32,
    pub retrans: u32,
    pub fackets: u32,
    pub last_data_sent: u32,
    pub last_ack_sent: u32,
    pub last_data_recv: u32,
    pub last_ack_recv: u32,
    pub pmtu: u32,
    pub rcv_ssthresh: u32,
    pub rtt: u32,
    pub rttvar: u32,
    pub snd_ssthresh: u32,
    pub snd_cwnd: u32,
    pub advmss: u32,
    pub reordering: u32,
    pub rcv_rtt: u32,
    pub rcv_space: u32,
    pub total_retrans: u32,
    pub pacing_rate: u64,
    pub max_pacing_rate: u64,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    pub segs_out: u32,
    pub segs_in: u32,
    pub notsent_bytes: u32,
    pub min_rtt: u32,
    pub data_segs_in: u32,
    pub data_segs_out: u32,
    pub delivery_rate: u64,
    pub busy_time: u64,
    pub rwnd_limited: u64,
    pub sndbuf_limited: u64,
    pub delivered: u32,
    pub delivered_ce: u32,
    pub bytes_sent: u64,
    pub bytes_retrans: u64,
    pub dsack_dups: u32,
    pub reord_seen: u32,
    pub rcv_ooopack: u32,
    pub snd_wnd: u32,
    pub rcv_wnd: u32,
    pub rehash: u32,
}

// Same size as the kernel's struct up to and including tcpi_rehash (Linux 6.2+).
const _: () = assert!(std::mem::size_of::<RawTcpInfo>() == 240);

/// Reads `TCP_INFO` for a connected socket.
pub fn tcp_info(stream: &TcpStream) -> std::io::Result<RawTcpInfo> {
    let mut info = RawTcpInfo::default();
    let mut len = std::mem::size_of::<RawTcpInfo>() as libc::socklen_t;
    // SAFETY: `info` is a plain repr(C) struct of `len` bytes; the kernel writes at most `len`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut RawTcpInfo).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info)
}

/// The sender side of one stream, as the sender's kernel saw it.
#[derive(Debug, Clone, Serialize)]
pub struct TcpStreamReport {
    pub local: String,
    pub peer: String,
    /// Payload bytes written (always the requested count on success).
    pub payload_bytes: u64,
    /// Payload bytes the peer acknowledged (tcpi_bytes_acked).
    pub bytes_acked: u64,
    /// Segments sent including pure ACKs, SYN and FIN (tcpi_segs_out).
    pub segs_out: u32,
    /// Segments with data sent, retransmissions included (tcpi_data_segs_out).
    pub data_segs_out: u32,
    /// Segments received (tcpi_segs_in).
    pub segs_in: u32,
    /// Retransmitted segments over the connection's life (tcpi_total_retrans).
    pub total_retrans: u32,
    /// Retransmitted payload bytes (tcpi_bytes_retrans).
    pub bytes_retrans: u64,
    /// Payload bytes sent including retransmissions (tcpi_bytes_sent).
    pub bytes_sent: u64,
    /// Duplicate SACKs received: retransmissions that were spurious (tcpi_dsack_dups).
    pub dsack_dups: u32,
    /// Reordering events seen (tcpi_reord_seen).
    pub reord_seen: u32,
    pub snd_mss: u32,
    /// Smoothed RTT in microseconds.
    pub rtt_us: u32,
    pub min_rtt_us: u32,
    /// Estimated L3 bytes of the sender's segments: bytes_sent + segs_out × (IP + TCP headers).
    pub l3_bytes_estimate: u64,
    pub duration_ms: f64,
    pub goodput_mbit: f64,
}

/// What [`tcp_send`] did.
#[derive(Debug, Clone, Serialize)]
pub struct TcpSendReport {
    pub to: String,
    pub streams: Vec<TcpStreamReport>,
    pub total_payload_bytes: u64,
    pub total_segs_out: u64,
    pub total_data_segs_out: u64,
    pub total_retrans: u64,
    pub duration_ms: f64,
    pub goodput_mbit: f64,
}

/// One connection the sink accepted.
#[derive(Debug, Clone, Serialize)]
pub struct TcpConnReport {
    pub peer: String,
    pub bytes: u64,
    pub duration_ms: f64,
    /// Data segments received (tcpi_data_segs_in).
    pub data_segs_in: u32,
    /// Out-of-order packets received (tcpi_rcv_ooopack).
    pub rcv_ooopack: u32,
}

/// What a [`TcpSink`] received.
#[derive(Debug, Clone, Serialize)]
pub struct TcpSinkReport {
    pub listen: String,
    pub connections: Vec<TcpConnReport>,
    pub total_bytes: u64,
}

/// Per-stream write size.
const CHUNK: usize = 256 * 1024;

/// Connects `streams` connections to `to` and sends exactly `bytes` payload bytes on each, in
/// parallel; then half-closes, waits for the peer to close (so every byte is acknowledged) and
/// reads `TCP_INFO`. Sockets are created on the calling thread: call it inside
/// [`crate::Netns::run`] to send from a namespace. Fails after `timeout`.
pub fn tcp_send(to: SocketAddr, bytes: u64, streams: usize) -> Result<TcpSendReport> {
    tcp_send_with_timeout(to, bytes, streams, Duration::from_secs(120))
}

/// [`tcp_send`] with an explicit overall timeout.
pub fn tcp_send_with_timeout(to: SocketAddr, bytes: u64, streams: usize, timeout: Duration) -> Result<TcpSendReport> {
    if streams == 0 || streams > 1024 {
        return Err(Error::InvalidArgument { field: "streams", reason: format!("{streams} (must be 1..=1024)") });
    }
    let start = Instant::now();
    let deadline = start + timeout;
    let mut conns = Vec::with_capacity(streams);
    for _ in 0..streams {
        let s = TcpStream::connect_timeout(&to, Duration::from_secs(5))
            .map_err(|source| Error::Socket { op: "connect to", addr: to.to_string(), source })?;
        conns.push(s);
    }
    let results: Vec<Result<TcpStreamReport>> = std::thread::scope(|scope| {
        let handles: Vec<_> = conns
            .into_iter()
            .map(|s| scope.spawn(move || send_one(s, to, bytes, deadline)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let streams = results.into_iter().collect::<Result<Vec<_>>>()?;
    let duration = start.elapsed();
    let total: u64 = streams.iter().map(|s| s.payload_bytes).sum();
    Ok(TcpSendReport {
        to: to.to_string(),
        total_payload_bytes: total,
        total_segs_out: streams.iter().map(|s| s.segs_out as u64).sum(),
        total_data_segs_out: streams.iter().map(|s| s.data_segs_out as u64).sum(),
        total_retrans: streams.iter().map(|s| s.total_retrans as u64).sum(),
        duration_ms: duration.as_secs_f64() * 1e3,
        goodput_mbit: mbit(total, duration),
        streams,
    })
}

fn mbit(bytes: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 {
        bytes as f64 * 8.0 / s / 1e6
    } else {
        0.0
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
}

fn send_one(mut s: TcpStream, to: SocketAddr, bytes: u64, deadline: Instant) -> Result<TcpStreamReport> {
    let sock_err = |op: &'static str| move |source| Error::Socket { op, addr: to.to_string(), source };
    let timed_out = || Error::Timeout { what: format!("sending {bytes} bytes to {to}"), waited: Duration::ZERO, detail: "deadline passed".into() };
    let local = s.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let start = Instant::now();
    // A recognisable pattern so a capture shows which bytes are ours.
    let buf: Vec<u8> = (0..CHUNK).map(|i| (i % 251) as u8).collect();
    let mut left = bytes;
    while left > 0 {
        let Some(rem) = remaining(deadline) else { return Err(timed_out()) };
        s.set_write_timeout(Some(rem)).map_err(sock_err("set timeout on"))?;
        let n = left.min(CHUNK as u64) as usize;
        s.write_all(&buf[..n]).map_err(sock_err("send to"))?;
        left -= n as u64;
    }
    s.shutdown(std::net::Shutdown::Write).map_err(sock_err("shut down"))?;
    // Wait for the sink to close: then every byte we sent has been acknowledged.
    let mut sink = [0u8; 512];
    for _ in 0..1_000_000 {
        let Some(rem) = remaining(deadline) else { return Err(timed_out()) };
        s.set_read_timeout(Some(rem)).map_err(sock_err("set timeout on"))?;
        match s.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(sock_err("wait for close from")(e)),
        }
    }
    let duration = start.elapsed();
    let i = tcp_info(&s).map_err(sock_err("read TCP_INFO of"))?;
    let hdr = if to.is_ipv4() { 20 } else { 40 } + 32;
    Ok(TcpStreamReport {
        local,
        peer: to.to_string(),
        payload_bytes: bytes,
        bytes_acked: i.bytes_acked,
        segs_out: i.segs_out,
        data_segs_out: i.data_segs_out,
        segs_in: i.segs_in,
        total_retrans: i.total_retrans,
        bytes_retrans: i.bytes_retrans,
        bytes_sent: i.bytes_sent,
        dsack_dups: i.dsack_dups,
        reord_seen: i.reord_seen,
        snd_mss: i.snd_mss,
        rtt_us: i.rtt,
        min_rtt_us: i.min_rtt,
        l3_bytes_estimate: i.bytes_sent + i.segs_out as u64 * hdr,
        duration_ms: duration.as_secs_f64() * 1e3,
        goodput_mbit: mbit(bytes, duration),
    })
}

/// A bound TCP listener. Bind it inside a namespace (`ns.run(|| TcpSink::bind(addr))`); it can
/// then be served from any thread, because the socket belongs to the namespace it was made in.
#[derive(Debug)]
pub struct TcpSink {
    listener: TcpListener,
}

impl TcpSink {
    pub fn bind(listen: SocketAddr) -> Result<TcpSink> {
        let listener = TcpListener::bind(listen).map_err(|source| Error::Socket { op: "listen on", addr: listen.to_string(), source })?;
        Ok(TcpSink { listener })
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener.local_addr().map_err(|source| Error::Socket { op: "query", addr: "listener".into(), source })
    }

    /// Accepts `connections` connections, reads each to EOF in parallel, closes them, and reports.
    /// Fails if they have not all finished within `timeout`.
    pub fn receive(self, connections: usize, timeout: Duration) -> Result<TcpSinkReport> {
        let listen = self.local_addr()?;
        let deadline = Instant::now() + timeout;
        self.listener.set_nonblocking(true).map_err(|source| Error::Socket { op: "configure", addr: listen.to_string(), source })?;
        let reports = std::thread::scope(|scope| -> Result<Vec<TcpConnReport>> {
            let mut handles = Vec::with_capacity(connections);
            while handles.len() < connections {
                if remaining(deadline).is_none() {
                    return Err(Error::Timeout {
                        what: format!("{connections} connections on {listen}"),
                        waited: timeout,
                        detail: format!("{} accepted", handles.len()),
                    });
                }
                match self.listener.accept() {
                    Ok((s, peer)) => handles.push(scope.spawn(move || recv_one(s, peer, deadline))),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(source) => return Err(Error::Socket { op: "accept on", addr: listen.to_string(), source }),
                }
            }
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        })?;
        Ok(TcpSinkReport { listen: listen.to_string(), total_bytes: reports.iter().map(|r| r.bytes).sum(), connections: reports })
    }
}

fn recv_one(mut s: TcpStream, peer: SocketAddr, deadline: Instant) -> Result<TcpConnReport> {
    let err = |op: &'static str| move |source| Error::Socket { op, addr: peer.to_string(), source };
    s.set_nonblocking(false).map_err(err("configure"))?;
    let start = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0u64;
    loop {
        let Some(rem) = remaining(deadline) else {
            return Err(Error::Timeout { what: format!("EOF from {peer}"), waited: start.elapsed(), detail: format!("{total} bytes received") });
        };
        s.set_read_timeout(Some(rem)).map_err(err("set timeout on"))?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(err("receive from")(e)),
        }
    }
    let info = tcp_info(&s).unwrap_or_default();
    let duration = start.elapsed();
    Ok(TcpConnReport {
        peer: peer.to_string(),
        bytes: total,
        duration_ms: duration.as_secs_f64() * 1e3,
        data_segs_in: info.data_segs_in,
        rcv_ooopack: info.rcv_ooopack,
    })
}

/// Binds `listen`, receives `connections` connections to EOF and reports (see [`TcpSink`]).
pub fn tcp_sink(listen: SocketAddr, connections: usize, timeout: Duration) -> Result<TcpSinkReport> {
    TcpSink::bind(listen)?.receive(connections, timeout)
}
