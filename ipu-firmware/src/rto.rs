//! Transport advice on the engine's own TCP connections: a floor for TCP's retransmission timeout
//! ([`ringside_client::Hint::tcp_rto_min_ms`]), set per socket with `TCP_RTO_MIN_US`.
//!
//! Why: under random loss a lost segment at the tail of a frame, or a lost retransmission, is
//! recovered only by the retransmission timeout, which Linux keeps at least 200 ms while a
//! collective's round trip is well under a millisecond. ringside advises a lower floor (5 ms by
//! default) while the job's paths lose packets and withdraws the advice when they are clean again.
//! Linux keeps the timeout at least the smoothed round trip plus the floor, so a path whose round
//! trip grows keeps a longer one. The Python follower sets the same floor as a route attribute
//! (`ip route ... rto_min`, needs `CAP_NET_ADMIN`); the engine owns its sockets and sets it on each
//! of them, which needs no privilege.
//!
//! How: [`TcpRtoFloor`] is one rank's (or one service's) floor in force plus the sockets it applies
//! to. Transports register their connections ([`TcpRtoFloor::register`], see
//! [`crate::TcpTransport::set_rto_floor`]); the hint follower's thread calls
//! [`TcpRtoFloor::advise`] when a hint's advice differs from the one in force. `advise` and
//! `register` hold one lock, so a socket registered at any time gets the floor in force and every
//! registered socket gets every change. The floor keeps its own duplicate of each socket
//! (`dup(2)`), so a `setsockopt` from the follower's thread can never reach an unrelated file that
//! reused a closed descriptor; the duplicates are closed when the registration is dropped (the
//! transport drops it when it closes). Setting a socket option while another thread sends or
//! receives on the socket is safe: the kernel takes the socket lock.
//!
//! Kernel facts (include/uapi/linux/tcp.h, net/ipv4/tcp.c `do_tcp_setsockopt`):
//! - `TCP_RTO_MIN_US` (45) exists from Linux 6.15. Older kernels answer `ENOPROTOOPT`: logged once
//!   at warn, recorded in the log of applications, and the job goes on with the system's floor.
//! - The kernel stores the floor in jiffies and accepts 2 jiffies ..= 200 ms; anything outside is
//!   `EINVAL`. With HZ=250, 5000 µs becomes 2 jiffies and reads back as 8000 µs; 1-4 ms are
//!   refused, and with HZ=100 so is 5 ms. An advice below the kernel's smallest floor is raised
//!   (doubled until accepted, at most to 200 ms) and the value read back is recorded.
//! - A new socket starts with `net.ipv4.tcp_rto_min_us` (6.11+, per network namespace); no advice
//!   ([`None`]) restores that value, or 200 ms when the sysctl is absent.
//! - A route with a locked `rto_min` (what the Python follower adds) overrides the socket's floor.
//!
//! Invariants:
//! - Fail open: nothing here returns an error to a collective or blocks it. Failures are logged
//!   and recorded ([`AppliedRtoFloor::error`]); the sockets keep what they had.
//! - Sockets are touched only when the floor changes or a socket is registered while a floor is
//!   set: with no advice ever given, no `setsockopt` is made (so an old kernel logs nothing).
//! - Advice outside 1..=[`MAX_RTO_MIN_MS`] ms is refused; the floor in force stays.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

/// `TCP_RTO_MIN_US` from include/uapi/linux/tcp.h (Linux 6.15+): the socket's minimum
/// retransmission timeout in microseconds (an `int`). Not in the `libc` crate yet.
pub const TCP_RTO_MIN_US: libc::c_int = 45;

/// Largest advice, ms: Linux's own floor (`TCP_RTO_MIN`, HZ/5); the kernel refuses more.
pub const MAX_RTO_MIN_MS: u32 = 200;

/// The system floor when `/proc/sys/net/ipv4/tcp_rto_min_us` is absent, µs.
pub const DEFAULT_RTO_MIN_US: u32 = 200_000;

/// Most entries an [`AppliedRtoFloor`] log keeps (one per change of advice or registration).
pub const MAX_APPLIED: usize = 4096;

/// Set once the "kernel too old" warning was logged: a process with several ranks (threads) or
/// meshes says it once.
static UNSUPPORTED_WARNED: AtomicBool = AtomicBool::new(false);

/// Why advice did not reach a socket.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RtoFloorError {
    #[error("tcp_rto_min_ms {ms} is outside 1..={MAX_RTO_MIN_MS}; the floor in force stays (the agent's [policy] loss_rto_min_ms sets it)")]
    OutOfRange { ms: u32 },
    #[error("this kernel ({kernel}) has no per-socket TCP_RTO_MIN_US, which needs Linux 6.15 or newer; the engine's connections keep the system's retransmission floor (on older kernels a route's rto_min does the same: ip route replace PEER/32 dev DEV rto_min 5ms)")]
    Unsupported { kernel: String },
    #[error("setsockopt(TCP_RTO_MIN_US, {us} µs) failed on {failed} of {sockets} sockets: {source}")]
    Socket {
        us: u32,
        failed: usize,
        sockets: usize,
        #[source]
        source: Arc<io::Error>,
    },
}

/// One application of the floor: a change of advice, or sockets registered while a floor was set.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AppliedRtoFloor {
    /// Wall-clock time (Unix ms), to place it on a job's step timeline (`end_unix_ms`).
    pub unix_ms: u64,
    /// The hint that carried the advice; `None` for sockets registered later (they get the floor
    /// in force).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint_version: Option<u64>,
    /// The advice now in force, ms; `None`: the system's own floor.
    pub tcp_rto_min_ms: Option<u32>,
    /// What the kernel reports for the first socket afterwards (`getsockopt`), µs; `None` when no
    /// socket was touched.
    pub rto_min_us: Option<u32>,
    /// Sockets set without an error.
    pub sockets: usize,
    /// Why the advice (or part of it) did not take effect.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Sets `s`'s floor to `us` microseconds.
pub fn set_rto_min_us(s: &impl AsRawFd, us: u32) -> io::Result<()> {
    let v = libc::c_int::try_from(us).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid fd borrowed for the call, and a pointer to an int with its exact size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            TCP_RTO_MIN_US,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `s`'s floor as the kernel reports it, µs (whole jiffies).
pub fn rto_min_us(s: &impl AsRawFd) -> io::Result<u32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid fd borrowed for the call; `v` and `len` are live and sized for an int.
    let r = unsafe { libc::getsockopt(s.as_raw_fd(), libc::IPPROTO_TCP, TCP_RTO_MIN_US, (&mut v as *mut libc::c_int).cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(v).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// The floor a new socket gets in this network namespace: `net.ipv4.tcp_rto_min_us`, or
/// [`DEFAULT_RTO_MIN_US`] when the sysctl is absent (before 6.11) or unreadable.
pub fn system_rto_min_us() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rto_min_us")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(DEFAULT_RTO_MIN_US)
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(|_| "unknown release".into(), |s| format!("Linux {}", s.trim()))
}

/// Sets `want_us` on `s`, doubling it while the kernel refuses it as too small (below two
/// jiffies), at most to 200 ms. The value the kernel took.
fn set_raising(s: &TcpStream, want_us: u32) -> Result<u32, io::Error> {
    let cap = MAX_RTO_MIN_MS * 1000;
    let mut us = want_us.min(cap);
    loop {
        match set_rto_min_us(s, us) {
            Ok(()) => return Ok(us),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && us < cap => us = us.saturating_mul(2).min(cap),
            Err(e) => return Err(e),
        }
    }
}

/// What setting a floor on a set of sockets did.
struct Outcome {
    /// The value the kernel took (after raising), if any socket took it.
    took_us: Option<u32>,
    read_back_us: Option<u32>,
    set: usize,
    error: Option<RtoFloorError>,
}

/// Sets `want_us` on every socket: the first one finds the value the kernel takes
/// ([`set_raising`]), the others get that value. An unsupported option stops at the first socket.
fn set_all(sockets: &[&TcpStream], want_us: u32) -> Outcome {
    let Some(first) = sockets.first() else {
        return Outcome { took_us: None, read_back_us: None, set: 0, error: None };
    };
    let us = match set_raising(first, want_us) {
        Ok(us) => us,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOPROTOOPT | libc::EINVAL)) => {
            return Outcome { took_us: None, read_back_us: None, set: 0, error: Some(RtoFloorError::Unsupported { kernel: kernel_release() }) };
        }
        Err(e) => {
            let error = RtoFloorError::Socket { us: want_us, failed: sockets.len(), sockets: sockets.len(), source: Arc::new(e) };
            return Outcome { took_us: None, read_back_us: None, set: 0, error: Some(error) };
        }
    };
    let mut set = 1;
    let mut first_error = None;
    for s in &sockets[1..] {
        match set_rto_min_us(*s, us) {
            Ok(()) => set += 1,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let error = first_error.map(|e| RtoFloorError::Socket { us, failed: sockets.len() - set, sockets: sockets.len(), source: Arc::new(e) });
    Outcome { took_us: Some(us), read_back_us: rto_min_us(*first).ok(), set, error }
}

#[derive(Default)]
struct FloorState {
    /// The advice in force, ms.
    advice: Option<u32>,
    /// The value the kernel took for that advice, µs: `Some` while the sockets carry a floor of
    /// ours, `None` while they have the system's own (never set, restored, or refused).
    set_us: Option<u32>,
    /// Duplicates of the registered sockets, by registration.
    sockets: Vec<(u64, TcpStream)>,
    next_registration: u64,
    log: Vec<AppliedRtoFloor>,
}

impl FloorState {
    fn record(&mut self, hint_version: Option<u64>, o: &Outcome) {
        if let Some(e @ RtoFloorError::Unsupported { .. }) = &o.error {
            if !UNSUPPORTED_WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!("{e}");
            }
        } else if let Some(e @ RtoFloorError::OutOfRange { .. }) = &o.error {
            tracing::warn!(version = ?hint_version, "{e}");
        } else if let Some(e) = &o.error {
            tracing::warn!(error = %e, "the TCP retransmission floor did not reach every connection; they keep what they had");
        }
        if self.log.len() < MAX_APPLIED {
            self.log.push(AppliedRtoFloor {
                unix_ms: unix_ms(),
                hint_version,
                tcp_rto_min_ms: self.advice,
                rto_min_us: o.read_back_us,
                sockets: o.set,
                error: o.error.as_ref().map(ToString::to_string),
            });
        }
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// One rank's TCP retransmission floor: the advice in force and the sockets it applies to.
/// Cheap to clone (one shared state); see the module docs.
#[derive(Clone, Default)]
pub struct TcpRtoFloor(Arc<Mutex<FloorState>>);

impl std::fmt::Debug for TcpRtoFloor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("TcpRtoFloor").field("advice_ms", &st.advice).field("set_us", &st.set_us).field("sockets", &st.sockets.len()).finish()
    }
}

impl TcpRtoFloor {
    /// No advice, no sockets.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, FloorState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The advice in force, ms (`None`: the system's own floor).
    pub fn advice(&self) -> Option<u32> {
        self.lock().advice
    }

    /// How many sockets are registered now.
    pub fn sockets(&self) -> usize {
        self.lock().sockets.len()
    }

    /// Every application so far, oldest first (at most [`MAX_APPLIED`]).
    pub fn applied(&self) -> Vec<AppliedRtoFloor> {
        self.lock().log.clone()
    }

    /// Puts `advice_ms` in force on every registered socket (and on sockets registered later),
    /// if it differs from the advice in force; `None` restores the system's floor
    /// ([`system_rto_min_us`]). `hint_version` is recorded with it. Whether the advice in force
    /// changed (`false` for the same advice and for advice out of range). Never fails: see
    /// [`AppliedRtoFloor::error`].
    pub fn advise(&self, advice_ms: Option<u32>, hint_version: Option<u64>) -> bool {
        let mut st = self.lock();
        if advice_ms == st.advice {
            return false;
        }
        if let Some(ms) = advice_ms.filter(|ms| !(1..=MAX_RTO_MIN_MS).contains(ms)) {
            // Recorded with the advice that stays in force.
            let o = Outcome { took_us: None, read_back_us: None, set: 0, error: Some(RtoFloorError::OutOfRange { ms }) };
            st.record(hint_version, &o);
            return false;
        }
        st.advice = advice_ms;
        let sockets: Vec<&TcpStream> = st.sockets.iter().map(|(_, s)| s).collect();
        let o = match advice_ms {
            Some(ms) => set_all(&sockets, ms * 1000),
            // Restore only what this floor changed: a socket that never got ours has the
            // system's floor already.
            None if st.set_us.is_some() => set_all(&sockets, system_rto_min_us()),
            None => Outcome { took_us: None, read_back_us: None, set: 0, error: None },
        };
        drop(sockets);
        st.set_us = if advice_ms.is_some() { o.took_us } else { None };
        tracing::info!(
            tcp_rto_min_ms = ?advice_ms,
            kernel_rto_min_us = ?o.read_back_us,
            sockets = o.set,
            version = ?hint_version,
            "TCP retransmission floor of the engine's connections changed"
        );
        st.record(hint_version, &o);
        true
    }

    /// Registers `streams` (a duplicate of each is kept) and gives them the floor in force. The
    /// sockets stay registered until the returned registration is dropped. A socket that cannot
    /// be duplicated (out of file descriptors) is left out and logged.
    pub fn register<'a>(&self, streams: impl IntoIterator<Item = &'a TcpStream>) -> RtoFloorRegistration {
        let dups: Vec<TcpStream> = streams
            .into_iter()
            .filter_map(|s| {
                s.try_clone().map_err(|e| tracing::warn!(error = %e, "cannot duplicate a connection for the TCP retransmission floor; it keeps the system's floor")).ok()
            })
            .collect();
        let mut st = self.lock();
        let id = st.next_registration;
        st.next_registration += 1;
        if let Some(ms) = st.advice {
            let refs: Vec<&TcpStream> = dups.iter().collect();
            // The value the kernel took before, if it took one; else find it now.
            let o = set_all(&refs, st.set_us.unwrap_or(ms * 1000));
            drop(refs);
            if o.took_us.is_some() {
                st.set_us = o.took_us;
            }
            if !dups.is_empty() {
                tracing::info!(tcp_rto_min_ms = ms, kernel_rto_min_us = ?o.read_back_us, sockets = o.set, "TCP retransmission floor in force applied to new connections");
                st.record(None, &o);
            }
        }
        let count = dups.len();
        st.sockets.extend(dups.into_iter().map(|s| (id, s)));
        RtoFloorRegistration { floor: self.clone(), id, count }
    }
}

/// Sockets registered with a [`TcpRtoFloor`]; dropping it unregisters them (and closes the
/// floor's duplicates). It does not restore their floor: it is dropped when they close.
#[must_use = "the sockets are unregistered when this is dropped"]
pub struct RtoFloorRegistration {
    floor: TcpRtoFloor,
    id: u64,
    count: usize,
}

impl RtoFloorRegistration {
    /// How many sockets this registration holds.
    pub fn sockets(&self) -> usize {
        self.count
    }
}

impl std::fmt::Debug for RtoFloorRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RtoFloorRegistration").field("id", &self.id).field("sockets", &self.count).finish()
    }
}

impl Drop for RtoFloorRegistration {
    fn drop(&mut self) {
        self.floor.lock().sockets.retain(|(id, _)| *id != self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Both ends of a loopback connection.
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    /// The floor of a socket nobody touched, or `None` when this kernel has no `TCP_RTO_MIN_US`
    /// (then the test checks the fail-open path instead, and fails on a kernel that should have it).
    fn fresh_default() -> Option<u32> {
        let (c, _s) = pair();
        match rto_min_us(&c) {
            Ok(us) => Some(us),
            Err(e) => {
                let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
                let mut v = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
                let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
                assert!((major, minor) < (6, 15), "Linux {release} should have TCP_RTO_MIN_US, getsockopt says {e}");
                eprintln!("Linux {} has no TCP_RTO_MIN_US ({e}): checking that the floor fails open", release.trim());
                None
            }
        }
    }

    #[test]
    fn the_advised_floor_reaches_both_ends_of_a_loopback_connection_and_none_restores_the_default() {
        let (c, s) = pair();
        let floor = TcpRtoFloor::new();
        let reg = floor.register([&c, &s]);
        assert_eq!((reg.sockets(), floor.sockets()), (2, 2));
        let Some(default) = fresh_default() else {
            assert!(floor.advise(Some(5), Some(2)), "the advice is in force even where the kernel cannot apply it");
            let log = floor.applied();
            assert_eq!(log.len(), 1);
            assert!(log[0].error.as_deref().unwrap_or("").contains("Linux 6.15"), "{log:?}");
            assert_eq!((log[0].sockets, log[0].rto_min_us), (0, None));
            assert!(floor.advise(None, Some(3)));
            return;
        };
        assert_eq!(default, system_rto_min_us(), "a fresh socket has the sysctl's floor");
        assert!(floor.advise(Some(5), Some(2)));
        for (end, sock) in [("client", &c), ("server", &s)] {
            let us = rto_min_us(sock).unwrap();
            assert!((5000..200_000).contains(&us), "{end}: {us} µs after advising 5 ms");
        }
        assert!(!floor.advise(Some(5), Some(3)), "the same advice is no change");
        assert!(floor.advise(None, Some(4)));
        assert_eq!((rto_min_us(&c).unwrap(), rto_min_us(&s).unwrap()), (default, default), "None restores the system's floor");
        let log = floor.applied();
        assert_eq!(log.iter().map(|a| (a.hint_version, a.tcp_rto_min_ms, a.sockets, a.error.clone())).collect::<Vec<_>>(), [(Some(2), Some(5), 2, None), (Some(4), None, 2, None)]);
        assert!(log[0].rto_min_us.is_some_and(|us| (5000..200_000).contains(&us)), "{log:?}");
        assert_eq!(log[1].rto_min_us, Some(default));
        drop(reg);
        assert_eq!(floor.sockets(), 0, "dropping the registration unregisters its sockets");
    }

    #[test]
    fn sockets_registered_later_get_the_floor_in_force_and_advice_below_two_jiffies_is_raised() {
        let Some(default) = fresh_default() else { return };
        let floor = TcpRtoFloor::new();
        // Advice with no socket yet (the follower runs before the mesh is up).
        assert!(floor.advise(Some(1), Some(7)));
        assert_eq!(floor.applied()[0].sockets, 0);
        let (c, s) = pair();
        let _reg = floor.register([&c, &s]);
        for sock in [&c, &s] {
            let us = rto_min_us(sock).unwrap();
            // 1 ms is below two jiffies at any HZ up to 1000: raised to the smallest the kernel takes.
            assert!((1000..200_000).contains(&us) && us < default, "{us} µs");
        }
        let log = floor.applied();
        assert_eq!((log[1].hint_version, log[1].tcp_rto_min_ms, log[1].sockets, log[1].error.as_deref()), (None, Some(1), 2, None));
        // A later connection gets the value the kernel took for the first ones.
        let (c2, _s2) = pair();
        let _reg2 = floor.register([&c2]);
        assert_eq!(rto_min_us(&c2).unwrap(), rto_min_us(&c).unwrap());
    }

    #[test]
    fn advice_out_of_range_is_refused_and_the_floor_in_force_stays() {
        let (c, _s) = pair();
        let floor = TcpRtoFloor::new();
        let _reg = floor.register([&c]);
        let before = rto_min_us(&c).ok();
        assert!(!floor.advise(Some(0), Some(1)));
        assert!(!floor.advise(Some(201), Some(2)));
        assert_eq!(floor.advice(), None);
        assert_eq!(rto_min_us(&c).ok(), before, "a refused advice touches no socket");
        let log = floor.applied();
        assert_eq!(log.len(), 2);
        assert!(log.iter().all(|a| a.sockets == 0 && a.error.as_deref().is_some_and(|e| e.contains("outside 1..=200"))), "{log:?}");
    }

    #[test]
    fn no_advice_touches_no_socket() {
        let (c, _s) = pair();
        let floor = TcpRtoFloor::new();
        let _reg = floor.register([&c]);
        assert!(!floor.advise(None, Some(1)), "None while None is in force is no change");
        assert!(floor.applied().is_empty());
    }
}
