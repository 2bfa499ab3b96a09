//! RDMA port counters: the NIC's own view of RoCE that bypasses the host kernel (TC never sees
//! it), read from sysfs and turned into per-port [`PortWindow`]s for the detectors
//! ([`crate::detect::DetectorSet::observe_ports`]).
//!
//! Layout read (the kernel's `Documentation/ABI/stable/sysfs-class-infiniband`):
//! `<root>/<device>/ports/<port>/counters/<name>` (the InfiniBand port counters every RDMA driver
//! provides) and `<root>/<device>/ports/<port>/hw_counters/<name>` (driver-specific; the names
//! below are mlx5's, `drivers/infiniband/hw/mlx5/counters.c`: `cong_cnts`, `out_of_seq_q_cnts`,
//! `retrans_q_cnts`, `roce_accl_cnts`). Each file holds one decimal number and a newline.
//! `<root>` is `/sys/class/infiniband` by default; a DPU that exposes representors, or a test,
//! points it elsewhere (`[rdma] counters_root`).
//!
//! Invariants:
//! - bounded work per poll: at most [`MAX_DEVICES`] devices (in name order) × [`MAX_PORTS`] ports
//!   × the fixed list [`COUNTERS`] of files, each read into a 64-byte buffer; devices and ports
//!   beyond the caps are counted (`capped`), never read;
//! - never a panic on what the files hold: a missing root is "no RDMA device"; a file that
//!   disappears, cannot be read or does not hold a number, and a counter that goes backwards (a
//!   driver reset or a device re-probe) is counted in [`ReadProblems`] and yields no delta for
//!   that counter in that interval (the next one starts from the new value);
//! - a counter a port never had (another driver, no `hw_counters/`) is not a problem: its
//!   conditions are simply not judged.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    io::{ErrorKind, Read},
    path::{Path, PathBuf},
};

use crate::detect::PortWindow;

/// Default root of the RDMA devices.
pub const DEFAULT_COUNTERS_ROOT: &str = "/sys/class/infiniband";
/// Devices read per poll, in name order.
pub const MAX_DEVICES: usize = 32;
/// Ports read per device, in number order.
pub const MAX_PORTS: usize = 8;
/// Longest counter file content read (a u64 is at most 20 digits).
const MAX_FILE_BYTES: usize = 64;

/// Which directory of a port a counter lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Counters,
    HwCounters,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::Counters => "counters",
            Dir::HwCounters => "hw_counters",
        }
    }
}

/// One counter file the reader knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counter {
    pub dir: Dir,
    pub name: &'static str,
    /// Multiplier to base units (`port_*_data` count 4-byte words).
    pub scale: u64,
}

const fn c(dir: Dir, name: &'static str) -> Counter {
    Counter { dir, name, scale: 1 }
}

/// Every file read, in this order (indexes below refer to it).
pub const COUNTERS: &[Counter] = &[
    Counter { dir: Dir::Counters, name: "port_xmit_data", scale: 4 },
    Counter { dir: Dir::Counters, name: "port_rcv_data", scale: 4 },
    c(Dir::Counters, "port_xmit_packets"),
    c(Dir::Counters, "port_rcv_packets"),
    c(Dir::Counters, "port_rcv_errors"),
    c(Dir::Counters, "port_xmit_discards"),
    c(Dir::Counters, "link_downed"),
    c(Dir::Counters, "symbol_error"),
    c(Dir::HwCounters, "np_cnp_sent"),
    c(Dir::HwCounters, "rp_cnp_handled"),
    c(Dir::HwCounters, "np_ecn_marked_roce_packets"),
    c(Dir::HwCounters, "out_of_sequence"),
    c(Dir::HwCounters, "packet_seq_err"),
    c(Dir::HwCounters, "implied_nak_seq_err"),
    c(Dir::HwCounters, "local_ack_timeout_err"),
    c(Dir::HwCounters, "duplicate_request"),
    c(Dir::HwCounters, "roce_adp_retrans"),
    c(Dir::HwCounters, "rnr_nak_retry_err"),
];
const N: usize = 18;
const _: () = assert!(COUNTERS.len() == N);

pub const XMIT_BYTES: usize = 0;
pub const RCV_BYTES: usize = 1;
pub const XMIT_PACKETS: usize = 2;
pub const RCV_PACKETS: usize = 3;
pub const RCV_ERRORS: usize = 4;
pub const XMIT_DISCARDS: usize = 5;
pub const LINK_DOWNED: usize = 6;
pub const SYMBOL_ERRORS: usize = 7;
pub const CNP_SENT: usize = 8;
pub const CNP_HANDLED: usize = 9;
pub const ECN_MARKED: usize = 10;
/// The counters whose growth means packets were lost or had to be resent on the port's paths:
/// the responder saw a PSN gap (`out_of_sequence`), the requester got a sequence-error NAK
/// (`packet_seq_err`) or inferred one (`implied_nak_seq_err`), an ACK never came
/// (`local_ack_timeout_err`), the responder got a request again (`duplicate_request`, its ACK
/// was lost), the adaptive retransmission fired (`roce_adp_retrans`). Not `rnr_nak_retry_err`:
/// receiver-not-ready is the application not posting receives, not the network.
pub const LOSS_SIGNALS: &[usize] = &[11, 12, 13, 14, 15, 16];
/// Port errors that are not loss evidence for the detectors but belong on a dashboard: receive
/// errors, transmit discards, link-down events, symbol errors, receiver-not-ready retries
/// exhausted.
pub const ERRORS: &[usize] = &[RCV_ERRORS, XMIT_DISCARDS, LINK_DOWNED, SYMBOL_ERRORS, 17];

/// Per-port values, one slot per entry of [`COUNTERS`].
pub type Values = [Option<u64>; N];

/// A port: device name and port number.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortId {
    pub device: String,
    pub port: u32,
}

/// What went wrong reading, counted since the agent started (`ringside_rdma_port_read_problems`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadProblems {
    /// A counter file the port had at the previous read is gone.
    pub vanished: u64,
    /// A file or directory that exists could not be read (permissions, I/O error).
    pub unreadable: u64,
    /// A file that does not hold one decimal u64, or a port directory not named by a number.
    pub not_numeric: u64,
    /// A counter lower than at the previous read (driver reset, device re-probe).
    pub resets: u64,
    /// Devices or ports beyond [`MAX_DEVICES`] / [`MAX_PORTS`], skipped.
    pub capped: u64,
}

/// Counter growth accumulated per port since the agent started reading it (the first read is
/// the reference; a reset contributes nothing for that interval), for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RdmaSnapshot {
    pub root: PathBuf,
    pub polls: u64,
    pub problems: ReadProblems,
    /// Ports read at the last poll, with their accumulated growth in base units (`None`: the
    /// port does not provide that counter).
    pub ports: BTreeMap<PortId, Values>,
}

/// Reads the port counters under a root, remembers the previous read, and turns two reads into
/// deltas. Owned by the analysis stage; one [`RdmaPortReader::poll`] per detection window.
#[derive(Debug)]
pub struct RdmaPortReader {
    root: PathBuf,
    /// The previous read per port: (time, values).
    prev: BTreeMap<PortId, (u64, Values)>,
    snapshot: RdmaSnapshot,
    /// Whether the "no RDMA device" / "reading N ports" line was logged for the current state.
    said_absent: bool,
    said_present: bool,
}

impl RdmaPortReader {
    pub fn new(root: PathBuf) -> Self {
        Self {
            snapshot: RdmaSnapshot { root: root.clone(), ..Default::default() },
            root,
            prev: BTreeMap::new(),
            said_absent: false,
            said_present: false,
        }
    }

    pub fn snapshot(&self) -> &RdmaSnapshot {
        &self.snapshot
    }

    /// Reads every port at `now_ns` (CLOCK_MONOTONIC) and returns one window per port read
    /// both now and at the previous poll. Never fails: problems are counted in the snapshot.
    pub fn poll(&mut self, now_ns: u64) -> Vec<PortWindow> {
        self.snapshot.polls += 1;
        let reads = self.read_all();
        if reads.is_empty() {
            if !self.said_absent {
                tracing::info!(root = %self.root.display(), "no RDMA device: RDMA port counters not read (RoCE that bypasses the kernel is judged only where a device is present; set [rdma] counters_root for a DPU's representors)");
                self.said_absent = true;
                self.said_present = false;
            }
        } else if !self.said_present {
            let names: BTreeSet<&str> = reads.iter().map(|(id, _, _)| id.device.as_str()).collect();
            tracing::info!(root = %self.root.display(), ports = reads.len(), devices = ?names, "reading RDMA port counters");
            self.said_present = true;
            self.said_absent = false;
        }
        let mut windows = Vec::with_capacity(reads.len());
        let mut prev = BTreeMap::new();
        let mut ports = BTreeMap::new();
        for (id, values, absent) in reads {
            if let Some((_, before)) = self.prev.get(&id) {
                // Present at the previous read, gone now.
                self.snapshot.problems.vanished += (0..N).filter(|&i| before[i].is_some() && absent[i]).count() as u64;
            }
            let mut totals = self.snapshot.ports.get(&id).copied().unwrap_or([None; N]);
            if let Some((then, before)) = self.prev.get(&id) {
                let mut delta: Values = [None; N];
                for i in 0..N {
                    match (before[i], values[i]) {
                        (Some(b), Some(v)) if v >= b => delta[i] = Some((v - b).saturating_mul(COUNTERS[i].scale)),
                        (Some(_), Some(_)) => self.snapshot.problems.resets += 1,
                        (Some(_), None) => {} // counted as vanished, unreadable or not numeric
                        (None, _) => {}
                    }
                    if let Some(d) = delta[i] {
                        totals[i] = Some(totals[i].unwrap_or(0).saturating_add(d));
                    } else if values[i].is_some() && totals[i].is_none() {
                        totals[i] = Some(0);
                    }
                }
                windows.push(window(&id, now_ns.saturating_sub(*then), &delta));
            } else {
                for i in 0..N {
                    if values[i].is_some() && totals[i].is_none() {
                        totals[i] = Some(0);
                    }
                }
            }
            ports.insert(id.clone(), totals);
            prev.insert(id, (now_ns, values));
        }
        self.prev = prev;
        self.snapshot.ports = ports;
        windows
    }

    /// One read of every port, in (device, port) order, at most the caps.
    fn read_all(&mut self) -> Vec<(PortId, Values, [bool; N])> {
        let mut out = Vec::new();
        let Some(devices) = self.sorted_entries(&self.root.clone()) else { return out };
        self.snapshot.problems.capped += devices.len().saturating_sub(MAX_DEVICES) as u64;
        for (device, dir) in devices.into_iter().take(MAX_DEVICES) {
            let ports_dir = dir.join("ports");
            let Some(entries) = self.sorted_entries(&ports_dir) else { continue };
            let mut ports: Vec<(u32, PathBuf)> = Vec::new();
            for (name, path) in entries {
                match name.parse::<u32>() {
                    Ok(n) => ports.push((n, path)),
                    Err(_) => self.snapshot.problems.not_numeric += 1,
                }
            }
            ports.sort_by_key(|(n, _)| *n);
            self.snapshot.problems.capped += ports.len().saturating_sub(MAX_PORTS) as u64;
            for (port, path) in ports.into_iter().take(MAX_PORTS) {
                let (values, absent) = self.read_port(&path);
                out.push((PortId { device: device.clone(), port }, values, absent));
            }
        }
        out
    }

    /// The entries of a directory, sorted by name; `None` when it does not exist (a missing
    /// root is no device; a device without `ports/` has nothing to read) or cannot be listed
    /// (counted as unreadable).
    fn sorted_entries(&mut self, dir: &Path) -> Option<Vec<(String, PathBuf)>> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), "cannot list an RDMA counters directory: {e}");
                self.snapshot.problems.unreadable += 1;
                return None;
            }
        };
        let mut v: Vec<(String, PathBuf)> = Vec::new();
        for entry in rd {
            let Ok(entry) = entry else {
                self.snapshot.problems.unreadable += 1;
                continue;
            };
            // Device names are ASCII in practice; a name that is not UTF-8 cannot be a label.
            let Ok(name) = entry.file_name().into_string() else {
                self.snapshot.problems.not_numeric += 1;
                continue;
            };
            v.push((name, entry.path()));
        }
        v.sort();
        Some(v)
    }

    /// The port's values, and which files do not exist (only those count as `vanished` when
    /// the previous read had them: an unreadable or non-numeric file is counted as such).
    fn read_port(&mut self, port_dir: &Path) -> (Values, [bool; N]) {
        let mut values: Values = [None; N];
        let mut absent = [false; N];
        for (i, c) in COUNTERS.iter().enumerate() {
            let path = port_dir.join(c.dir.name()).join(c.name);
            match read_counter(&path) {
                Ok(v) => {
                    values[i] = v;
                    absent[i] = v.is_none();
                }
                Err(CounterReadError::Unreadable) => self.snapshot.problems.unreadable += 1,
                Err(CounterReadError::NotNumeric) => self.snapshot.problems.not_numeric += 1,
            }
        }
        (values, absent)
    }
}

fn window(id: &PortId, interval_ns: u64, d: &Values) -> PortWindow {
    // A sum over loss signals is known when at least one of them is (drivers provide subsets).
    let loss: Vec<u64> = LOSS_SIGNALS.iter().filter_map(|&i| d[i]).collect();
    PortWindow {
        device: id.device.clone(),
        port: id.port,
        interval_ns,
        xmit_packets: d[XMIT_PACKETS],
        rcv_packets: d[RCV_PACKETS],
        cnp_sent: d[CNP_SENT],
        cnp_handled: d[CNP_HANDLED],
        ecn_marked: d[ECN_MARKED],
        loss_signals: (!loss.is_empty()).then(|| loss.iter().fold(0u64, |a, b| a.saturating_add(*b))),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum CounterReadError {
    Unreadable,
    NotNumeric,
}

/// One counter file: `Ok(None)` when it does not exist, its number otherwise.
fn read_counter(path: &Path) -> Result<Option<u64>, CounterReadError> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(_) => return Err(CounterReadError::Unreadable),
    };
    let mut buf = [0u8; MAX_FILE_BYTES];
    let mut len = 0;
    // sysfs answers in one read; loop for regular files (fixtures), bounded by the buffer.
    while len < buf.len() {
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(CounterReadError::Unreadable),
        }
    }
    parse_counter(&buf[..len]).map(Some)
}

/// One decimal u64, surrounding ASCII whitespace allowed; a file longer than the buffer (no
/// sysfs counter is) is not a number.
fn parse_counter(bytes: &[u8]) -> Result<u64, CounterReadError> {
    if bytes.len() >= MAX_FILE_BYTES {
        return Err(CounterReadError::NotNumeric);
    }
    let s = std::str::from_utf8(bytes).map_err(|_| CounterReadError::NotNumeric)?.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CounterReadError::NotNumeric);
    }
    s.parse().map_err(|_| CounterReadError::NotNumeric)
}

/// The name of counter slot `i` (for metrics).
pub fn counter_name(i: usize) -> &'static str {
    COUNTERS[i].name
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::Path;

    const S: u64 = 1_000_000_000;

    pub(crate) fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rdma")
    }

    /// A copy of a fixture tree in a fresh temporary directory, removed on drop, whose files a
    /// test rewrites between polls.
    pub(crate) struct TreeCopy(pub PathBuf);

    impl TreeCopy {
        pub fn of(fixture: &str) -> Self {
            let dir = crate::events::tests::tempdir(&format!("rdma-{fixture}"));
            copy_dir(&fixtures().join(fixture), &dir);
            TreeCopy(dir)
        }

        pub fn set(&self, rel: &str, value: &str) {
            std::fs::write(self.0.join(rel), value).unwrap();
        }

        /// Adds `by` to a counter file.
        pub fn add(&self, rel: &str, by: u64) {
            let p = self.0.join(rel);
            let v: u64 = std::fs::read_to_string(&p).unwrap().trim().parse().unwrap();
            std::fs::write(p, format!("{}\n", v + by)).unwrap();
        }
    }

    impl Drop for TreeCopy {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let target = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy_dir(&e.path(), &target);
            } else {
                std::fs::copy(e.path(), target).unwrap();
            }
        }
    }

    fn idx(name: &str) -> usize {
        COUNTERS.iter().position(|c| c.name == name).unwrap()
    }

    #[test]
    fn parses_numbers_and_rejects_the_rest() {
        assert_eq!(parse_counter(b"12345\n"), Ok(12345));
        assert_eq!(parse_counter(b"  7 \n"), Ok(7));
        assert_eq!(parse_counter(b"18446744073709551615\n"), Ok(u64::MAX));
        for bad in [&b""[..], b"\n", b"-1\n", b"12 34", b"0x10", b"N/A\n", b"18446744073709551616", b"\xff\xfe", &[b'1'; 64]] {
            assert_eq!(parse_counter(bad), Err(CounterReadError::NotNumeric), "{bad:?}");
        }
    }

    #[test]
    fn reads_the_fixture_tree() {
        let mut r = RdmaPortReader::new(fixtures().join("hosts"));
        assert!(r.poll(S).is_empty(), "the first read is the reference");
        let s = r.snapshot();
        let ids: Vec<String> = s.ports.keys().map(|p| format!("{}/{}", p.device, p.port)).collect();
        // `broken0` has a port named `x` (not numeric) and a port with bad files; `mlx5_0` two
        // ports; `qib0` only counters/.
        assert_eq!(ids, vec!["broken0/1", "mlx5_0/1", "mlx5_0/2", "qib0/1"]);
        let mlx = &s.ports[&PortId { device: "mlx5_0".into(), port: 1 }];
        assert!(mlx.iter().all(Option::is_some), "mlx5_0/1 has every counter: {mlx:?}");
        let qib = &s.ports[&PortId { device: "qib0".into(), port: 1 }];
        assert!(qib[XMIT_PACKETS].is_some() && qib[CNP_SENT].is_none() && qib[idx("out_of_sequence")].is_none(), "{qib:?}");
        // broken0/1: port_rcv_packets "N/A", np_cnp_sent "-5", a port dir "x".
        assert_eq!(s.problems, ReadProblems { not_numeric: 3, ..Default::default() }, "{:?}", s.problems);
        assert_eq!(s.ports[&PortId { device: "broken0".into(), port: 1 }][RCV_PACKETS], None);
    }

    #[test]
    fn missing_root_is_no_device_not_an_error() {
        let mut r = RdmaPortReader::new(PathBuf::from("/nonexistent/ringside/infiniband"));
        assert!(r.poll(S).is_empty());
        assert!(r.poll(2 * S).is_empty());
        assert_eq!(r.snapshot().problems, ReadProblems::default());
        assert!(r.snapshot().ports.is_empty());
        assert_eq!(r.snapshot().polls, 2);
    }

    #[test]
    fn deltas_resets_and_vanished_files() {
        let t = TreeCopy::of("hosts");
        let mut r = RdmaPortReader::new(t.0.clone());
        r.poll(S);
        let p1 = "mlx5_0/ports/1";
        t.add(&format!("{p1}/counters/port_xmit_data"), 1000);
        t.add(&format!("{p1}/counters/port_xmit_packets"), 600);
        t.add(&format!("{p1}/hw_counters/np_cnp_sent"), 40);
        t.add(&format!("{p1}/hw_counters/out_of_sequence"), 3);
        t.add(&format!("{p1}/hw_counters/roce_adp_retrans"), 2);
        let w = r.poll(3 * S);
        let w1 = w.iter().find(|w| w.device == "mlx5_0" && w.port == 1).unwrap();
        assert_eq!(w1.interval_ns, 2 * S);
        assert_eq!((w1.xmit_packets, w1.rcv_packets, w1.cnp_sent, w1.cnp_handled), (Some(600), Some(0), Some(40), Some(0)));
        assert_eq!(w1.loss_signals, Some(5));
        let qib = w.iter().find(|w| w.device == "qib0").unwrap();
        assert_eq!((qib.cnp_sent, qib.loss_signals), (None, None), "a counters-only device has no hw signals");
        let id = PortId { device: "mlx5_0".into(), port: 1 };
        assert_eq!(r.snapshot().ports[&id][XMIT_BYTES], Some(4000), "port_xmit_data counts 4-byte words");
        // A reset: the counter goes back; no delta, counted, and the next interval starts there.
        t.set(&format!("{p1}/hw_counters/np_cnp_sent"), "5\n");
        std::fs::remove_file(t.0.join(format!("{p1}/hw_counters/duplicate_request"))).unwrap();
        let w = r.poll(4 * S);
        let w1 = w.iter().find(|w| w.device == "mlx5_0" && w.port == 1).unwrap();
        assert_eq!(w1.cnp_sent, None);
        assert_eq!(r.snapshot().problems.resets, 1);
        assert_eq!(r.snapshot().problems.vanished, 1);
        t.set(&format!("{p1}/hw_counters/np_cnp_sent"), "9\n");
        let w = r.poll(5 * S);
        assert_eq!(w.iter().find(|w| w.device == "mlx5_0" && w.port == 1).unwrap().cnp_sent, Some(4));
        assert_eq!(r.snapshot().ports[&id][CNP_SENT], Some(44));
        assert_eq!(r.snapshot().problems.vanished, 1, "counted once, when it disappeared");
        // A file that turns into garbage is not_numeric, not vanished.
        let before = r.snapshot().problems;
        t.set(&format!("{p1}/hw_counters/out_of_sequence"), "garbage\n");
        r.poll(6 * S);
        let after = r.snapshot().problems;
        assert_eq!((after.vanished, after.not_numeric - before.not_numeric), (1, 1 + 3), "{after:?}");
    }

    #[test]
    fn unreadable_file_is_counted() {
        // Root bypasses file permissions; a directory where a file should be fails the read
        // the same way an I/O error does.
        let t = TreeCopy::of("hosts");
        let f = t.0.join("mlx5_0/ports/2/hw_counters/rp_cnp_handled");
        std::fs::remove_file(&f).unwrap();
        std::fs::create_dir(&f).unwrap();
        let mut r = RdmaPortReader::new(t.0.clone());
        r.poll(S);
        assert_eq!(r.snapshot().problems.unreadable, 1);
        assert_eq!(r.snapshot().ports[&PortId { device: "mlx5_0".into(), port: 2 }][CNP_HANDLED], None);
    }

    #[test]
    fn devices_and_ports_beyond_the_caps_are_counted_not_read() {
        let dir = crate::events::tests::tempdir("rdma-caps");
        let _cleanup = TreeCopy(dir.clone());
        for d in 0..MAX_DEVICES + 2 {
            for p in 1..=MAX_PORTS as u32 + 1 {
                let c = dir.join(format!("dev{d:02}/ports/{p}/counters"));
                std::fs::create_dir_all(&c).unwrap();
                std::fs::write(c.join("port_xmit_packets"), "1\n").unwrap();
            }
        }
        let mut r = RdmaPortReader::new(dir.clone());
        r.poll(S);
        let s = r.snapshot();
        assert_eq!(s.ports.len(), MAX_DEVICES * MAX_PORTS);
        assert_eq!(s.problems.capped, 2 + MAX_DEVICES as u64, "2 devices, then one port of each device read");
        assert!(!s.ports.contains_key(&PortId { device: format!("dev{:02}", MAX_DEVICES), port: 1 }));
    }
}
