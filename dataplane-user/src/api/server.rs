//! The HTTP server loop: hyper's HTTP/1.1 connections with limits an agent on a production host
//! needs, around the axum router.
//!
//! - **Connections**: at most [`Limits::max_connections`] open at once. One over the limit is
//!   closed at once and counted (`ringside_http_connections_refused_total`), never queued, so a
//!   flood cannot make a scrape wait behind it.
//! - **Slow or idle clients**: a connection must deliver a request's whole head within
//!   [`Limits::header_read_timeout`] (hyper's header-read timer; this also closes keep-alive
//!   connections idle that long), and a handler, body read included, must answer within
//!   [`Limits::request_timeout`] (408). A hint stream's body is not bounded by it: the handler
//!   answers at once and the stream's own keep-alives and limit (`MAX_HINT_STREAMS`) govern it.
//! - **Sizes**: request heads over [`Limits::max_head_bytes`] are refused by hyper (431), URLs over
//!   [`MAX_URI_BYTES`] get a 414 with a message, bodies over `MAX_BODY_BYTES` a 413 (the router).
//!
//! - **File descriptors**: [`serve`] raises the process's soft `RLIMIT_NOFILE` to make room for
//!   [`Limits::max_connections`] plus [`FD_RESERVE`] (systemd's default soft limit is 1024). Below
//!   that, `accept` fails with EMFILE before the connection limit is reached, and a scrape then
//!   waits in the kernel's backlog behind idle connections until their header-read timer fires.
//!
//! Graceful shutdown: on the signal the listener closes, open connections finish their current
//! request (hyper's graceful shutdown) for at most [`SHUTDOWN_GRACE`], then everything is dropped.
use std::{
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{
    extract::Request,
    http::StatusCode,
    middleware::Next,
    response::IntoResponse,
    Router,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

/// Longest request URL (path and query) accepted.
pub const MAX_URI_BYTES: usize = 4096;
/// How long open connections get to finish on shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// File descriptors kept free beside the connections: maps, pins, netlink, the state files,
/// `/proc` reads.
pub const FD_RESERVE: u64 = 256;

/// Raises the soft `RLIMIT_NOFILE` to at least `want` (never above the hard limit, never
/// lowered). Returns the soft limit now in force.
pub fn raise_fd_limit(want: u64) -> std::io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct passed by pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur >= want {
        return Ok(lim.rlim_cur);
    }
    let raised = libc::rlimit { rlim_cur: want.min(lim.rlim_max), rlim_max: lim.rlim_max };
    // SAFETY: setrlimit only reads the struct passed by reference.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(raised.rlim_cur)
}

/// The server's bounds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub request_timeout: Duration,
    /// hyper's read buffer, which bounds a request's head (at least 8 KiB).
    pub max_head_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(15),
            max_head_bytes: 16 * 1024,
        }
    }
}

/// Connection counters, rendered into `/metrics`.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
    pub open: AtomicU64,
}

/// The agent's one server's counters.
pub static STATS: ConnectionStats = ConnectionStats { accepted: AtomicU64::new(0), refused: AtomicU64::new(0), open: AtomicU64::new(0) };

/// Applies [`Limits::request_timeout`] and [`MAX_URI_BYTES`] to every route of `router`.
pub fn bounded(router: Router, limits: Limits) -> Router {
    let timeout = limits.request_timeout;
    router.layer(axum::middleware::from_fn(move |req: Request, next: Next| async move {
        let len = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
        if len > MAX_URI_BYTES {
            return super::error(StatusCode::URI_TOO_LONG, format!("the URL is {len} bytes; at most {MAX_URI_BYTES} are accepted"));
        }
        match tokio::time::timeout(timeout, next.run(req)).await {
            Ok(resp) => resp,
            Err(_) => super::error(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request was not answered within {} s (a body sent too slowly?)", timeout.as_secs()),
            )
            .into_response(),
        }
    }))
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes.
pub async fn serve(listener: tokio::net::TcpListener, router: Router, limits: Limits, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    let router = bounded(router, limits);
    let want = limits.max_connections as u64 + FD_RESERVE;
    match raise_fd_limit(want) {
        Ok(n) if n < want => tracing::warn!(
            soft_limit = n,
            wanted = want,
            "the open-files limit leaves room for fewer than {} HTTP connections: idle clients could hold every descriptor and stall /metrics; raise the hard limit (systemd LimitNOFILE={want}, ulimit -Hn)",
            limits.max_connections
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot read or raise the open-files limit ({e}); idle clients could stall /metrics before the connection limit is reached"),
    }
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).max_buf_size(limits.max_head_bytes.max(8192));
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE/ENFILE and friends: back off instead of spinning; the listener stays.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            STATS.refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        STATS.accepted.fetch_add(1, Ordering::Relaxed);
        STATS.open.fetch_add(1, Ordering::Relaxed);
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // Errors here are the client's (reset, timeout, malformed head): nothing to report.
            let _ = conn.await;
            STATS.open.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(SHUTDOWN_GRACE) => tracing::info!("connections still open after {} s: closing them", SHUTDOWN_GRACE.as_secs()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A server with a tiny router and small limits on a loopback port; the runtime lives on its
    /// own thread for the test's duration.
    fn start(limits: Limits) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                let router = Router::new()
                    .route("/metrics", axum::routing::get(|| async { "ok\n" }))
                    .route("/slow", axum::routing::post(|body: String| async move { body }));
                serve(listener, router, limits, async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
            });
        });
        (addr, tx)
    }

    fn request(addr: std::net::SocketAddr, raw: &[u8]) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(raw).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn idle_connections_do_not_stall_a_scrape_and_are_closed() {
        let limits = Limits { max_connections: 400, header_read_timeout: Duration::from_millis(500), ..Limits::default() };
        let (addr, _stop) = start(limits);
        let idle: Vec<std::net::TcpStream> = (0..300).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let resp = request(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert!(resp.starts_with("HTTP/1.1 200") && resp.ends_with("ok\n"), "{resp}");
        // The idle ones are closed by the header-read timer: reads end (EOF or a 408 head).
        for mut s in idle.into_iter().take(5) {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = Vec::new();
            let n = s.read_to_end(&mut buf);
            assert!(n.is_ok(), "an idle connection was not closed: {n:?}");
        }
    }

    #[test]
    fn connections_over_the_limit_are_refused_not_queued() {
        let limits = Limits { max_connections: 2, header_read_timeout: Duration::from_secs(30), ..Limits::default() };
        let (addr, _stop) = start(limits);
        let held: Vec<std::net::TcpStream> = (0..2).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(200)); // both accepted
        let before = STATS.refused.load(Ordering::Relaxed);
        let resp = request(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert_eq!(resp, "", "a connection over the limit is closed without an answer");
        assert!(STATS.refused.load(Ordering::Relaxed) > before);
        drop(held);
    }

    /// Whether the server has closed `s` (EOF or reset) rather than keeping it open and silent.
    fn closed_by_server(s: &std::net::TcpStream) -> bool {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let closed = !matches!(s.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        s.set_nonblocking(false).unwrap();
        closed
    }

    /// With the production limits: 500 idle connections do not stop a scrape; 1024 held connections
    /// are all kept, the 1025th is closed unanswered, and a scrape succeeds again once one is freed.
    /// Functional, not timed: the bounds are generous (10 s per answer).
    #[test]
    fn default_limits_hold_1024_connections_and_refuse_the_1025th() {
        // Client and server ends share this process: 2 × 1025 descriptors and the reserve.
        let need = 2 * 1025 + FD_RESERVE;
        let got = raise_fd_limit(need).unwrap();
        assert!(got >= need, "this test holds {need} file descriptors but the hard RLIMIT_NOFILE allows {got}; raise it (ulimit -Hn {need})");
        // The header-read timer far away, so none of the held connections is closed by it during
        // the test; everything else as in production.
        let limits = Limits { header_read_timeout: Duration::from_secs(120), ..Limits::default() };
        assert_eq!(limits.max_connections, 1024);
        let (addr, _stop) = start(limits);
        let scrape = || request(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");

        let mut held: Vec<std::net::TcpStream> = (0..500).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let resp = scrape();
        assert!(resp.starts_with("HTTP/1.1 200") && resp.ends_with("ok\n"), "with 500 idle connections: {resp:?}");

        held.extend((0..524).map(|_| std::net::TcpStream::connect(addr).unwrap()));
        // Each `connect` returned once its connection was in the listener's queue, and the server
        // accepts in queue order: the next one is the 1025th it sees. (`STATS` is shared with the
        // other tests of this binary, so it cannot say how many of these were accepted.)
        let refused_before = STATS.refused.load(Ordering::Relaxed);
        assert_eq!(scrape(), "", "the 1025th connection is closed without an answer");
        assert!(STATS.refused.load(Ordering::Relaxed) > refused_before);
        assert!(held.iter().all(|s| !closed_by_server(s)), "a held connection was closed to make room");

        // One freed: a scrape gets through again (the freed slot is released asynchronously).
        drop(held.pop());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let resp = loop {
            let r = scrape();
            if r.starts_with("HTTP/1.1 200") || std::time::Instant::now() > deadline {
                break r;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(resp.starts_with("HTTP/1.1 200"), "after one connection closed: {resp:?}");
    }

    #[test]
    fn long_urls_large_heads_and_slow_bodies_are_refused() {
        let limits = Limits { request_timeout: Duration::from_millis(500), ..Limits::default() };
        let (addr, _stop) = start(limits);
        let long = format!("GET /metrics?{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "a".repeat(MAX_URI_BYTES + 10));
        let resp = request(addr, long.as_bytes());
        assert!(resp.starts_with("HTTP/1.1 414") && resp.contains("at most 4096"), "{resp}");
        let big_head = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "b".repeat(40 * 1024));
        let resp = request(addr, big_head.as_bytes());
        assert!(resp.starts_with("HTTP/1.1 431") || resp.is_empty(), "{resp}");
        // A body announced but never sent: 408 after the request timeout, not a hung handler.
        let resp = request(addr, b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nConnection: close\r\n\r\nabc");
        assert!(resp.starts_with("HTTP/1.1 408"), "{resp}");
    }
}
