//! A tiny HTTP/1.1 server on a real loopback socket that answers each accepted connection with the
//! next canned [`Reply`] and records every request head (and body). Used to test the hints client
//! against real sockets without the agent. Shared with ipu-firmware's tests through `#[path]`.
//!
//! Every wait is bounded: reads on accepted connections time out after 5 s, and the accept loop
//! stops after the last reply (the thread is detached; the test harness ends the process).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How one connection is answered.
pub enum Reply {
    /// A complete response with `Content-Length` and `Connection: close`.
    Full { status: u16, content_type: &'static str, body: String },
    /// A chunked `text/event-stream` response: each part is written as one chunk with `pause`
    /// before it; then the stream ends cleanly (`end`), or the socket is dropped (`!end`), or it is
    /// held silent for `hold` before dropping.
    Sse { parts: Vec<String>, pause: Duration, end: bool, hold: Duration },
}

impl Reply {
    pub fn json(status: u16, body: &str) -> Reply {
        Reply::Full { status, content_type: "application/json", body: body.to_owned() }
    }
    pub fn sse(parts: &[&str]) -> Reply {
        Reply::Sse { parts: parts.iter().map(|s| s.to_string()).collect(), pause: Duration::from_millis(20), end: false, hold: Duration::ZERO }
    }
}

/// One recorded request: the head (request line + headers, lowercased header names) and body.
#[derive(Clone, Debug)]
pub struct Request {
    pub head: String,
    pub body: String,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
    pub fn request_line(&self) -> &str {
        self.head.lines().next().unwrap_or("")
    }
}

pub struct Canned {
    pub base: String,
    pub requests: Arc<Mutex<Vec<Request>>>,
}

/// The SSE event text for one hint line of JSON.
pub fn hint_event(version: u64, json: &str) -> String {
    format!("event: hint\nid: {version}\ndata: {json}\n\n")
}

/// A valid hint JSON with the given version.
pub fn hint_json(version: u64) -> String {
    format!(
        r#"{{"job":"j1","version":{version},"step_from":0,"algorithm":"tree","chunk_bytes":262144,"channels":2,"compression":"bf16","error_feedback":false,"reasons":["path to peer 10.0.0.3 lossy"],"confidence":0.8,"expires_at":1790000000000}}"#
    )
}

pub fn serve(replies: Vec<Reply>) -> Canned {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let base = format!("http://{}", listener.local_addr().expect("local addr"));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let rec = requests.clone();
    std::thread::spawn(move || {
        for reply in replies {
            let Ok((mut conn, _)) = listener.accept() else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            match read_request(&conn) {
                Some(r) => rec.lock().unwrap().push(r),
                None => continue,
            }
            // Answer on its own thread so a held (silent) connection does not delay the next one.
            std::thread::spawn(move || answer(&mut conn, reply));
        }
    });
    Canned { base, requests }
}

fn read_request(conn: &TcpStream) -> Option<Request> {
    let mut r = BufReader::new(conn);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" || line == "\n" {
            break;
        }
        head.push_str(&line);
    }
    let mut req = Request { head, body: String::new() };
    let len: usize = req.header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    req.body = String::from_utf8_lossy(&body).into_owned();
    Some(req)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        _ => "Whatever",
    }
}

fn answer(conn: &mut TcpStream, reply: Reply) -> std::io::Result<()> {
    match reply {
        Reply::Full { status, content_type, body } => {
            let len = if status == 204 { String::new() } else { format!("Content-Length: {}\r\n", body.len()) };
            write!(conn, "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\n{len}Connection: close\r\n\r\n{body}", reason(status))?;
            conn.flush()
        }
        Reply::Sse { parts, pause, end, hold } => {
            write!(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")?;
            conn.flush()?;
            for p in parts {
                std::thread::sleep(pause);
                write!(conn, "{:x}\r\n{p}\r\n", p.len())?;
                conn.flush()?;
            }
            if end {
                conn.write_all(b"0\r\n\r\n")?;
                conn.flush()?;
            }
            std::thread::sleep(hold);
            Ok(())
        }
    }
}

/// Runs `f` on a thread and fails the test if it takes longer than `secs`.
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("test did not finish within {secs} s"),
    }
}
