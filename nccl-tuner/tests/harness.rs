//! T0: the plugin loaded by `tests/harness.c` exactly as NCCL loads it (dlopen of
//! `libnccl-tuner-ringside.so`, dlsym of `ncclTunerPlugin_vN`, that version's init, getCollInfo,
//! getChunkSize, destroy/finalize), for every ABI version, without an agent or against an HTTP
//! server on loopback that serves the hints API's JSON. The same against the real agent is
//! `dataplane-user/tests/t2_nccl_tuner.rs` (T2).
//!
//! The harness is compiled with the system C compiler through `std::process::Command` (`$CC`,
//! default `cc`): it is a standalone executable, not a library linked into Rust, which is what
//! the `cc` crate is for.
mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use ringside_client::{Algorithm, Codec, Hint};
use support::harness::{assert_all_default, build_plugin, compile_harness, install_plugin, steered, Harness, Pick, Scratch, VERSIONS};

const WAIT: Duration = Duration::from_secs(15);

/// The plugin (under NCCL's file name) and the compiled harness in a scratch directory that the
/// test owns, removed when it ends (a `static` would never be dropped).
struct Rig {
    dir: Scratch,
    harness: std::path::PathBuf,
}

impl Rig {
    fn new() -> Rig {
        let dir = Scratch::new("harness");
        install_plugin(&build_plugin(), &dir.0);
        let harness = compile_harness(&dir.0);
        Rig { dir, harness }
    }

    fn start(&self, version: u32, env: &[(&str, &str)]) -> Harness {
        Harness::start(std::process::Command::new(&self.harness), &self.dir.0, version, env)
    }
}

/// A URL on loopback where nothing listens: bind a port, then close it.
fn closed_port_url() -> String {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    format!("http://127.0.0.1:{port}/v1/jobs/j-closed")
}

#[test]
fn no_agent_reachable_leaves_defaults_in_every_version() {
    let rig = Rig::new();
    let url = closed_port_url();
    for v in VERSIONS {
        let mut h = rig.start(v, &[("RINGSIDE_JOB_URL", &url), ("RINGSIDE_TOKEN", "rst_test")]);
        assert!(h.logged(&format!("tuner v{v} for 8 ranks on 2 nodes follows the hints of {url}")), "{:#?}", h.log);
        assert_all_default(&h.round(), "before the first poll");
        h.wait_log("cannot reach", WAIT);
        assert_all_default(&h.round(), "after a failed poll");
        h.quit();
    }
}

#[test]
fn missing_or_bad_settings_are_logged_and_leave_defaults() {
    let rig = Rig::new();
    let cases: [(&[(&str, &str)], &str); 5] = [
        (&[], "RINGSIDE_JOB_URL is not set: NCCL's defaults apply"),
        (&[("RINGSIDE_JOB_URL", "http://127.0.0.1:9/v1/jobs/j-1")], "RINGSIDE_JOB_URL is set but RINGSIDE_TOKEN is not: set RINGSIDE_TOKEN"),
        (&[("RINGSIDE_JOB_URL", "ftp://agent:9464/v1/jobs/j-1"), ("RINGSIDE_TOKEN", "t")], "set it to the job's url"),
        (
            &[("RINGSIDE_JOB_URL", "https://agent:9464/v1/jobs/j-1"), ("RINGSIDE_TOKEN", "t"), ("RINGSIDE_CA_FILE", "/nonexistent/ringside-ca.pem")],
            "cannot use the CA file \"/nonexistent/ringside-ca.pem\"",
        ),
        (&[("RINGSIDE_JOB_URL", "agent:9464/v1/jobs/j-1"), ("RINGSIDE_TOKEN", "t")], "set it to the job's url, http://HOST:PORT/v1/jobs/ID"),
    ];
    for (env, says) in cases {
        let mut h = rig.start(4, env);
        assert!(h.logged(says), "{env:?}: expected a log line with {says:?}: {:#?}", h.log);
        assert_all_default(&h.round(), &format!("{env:?}"));
        h.quit();
    }
}

/// What the loopback server answers `GET /v1/jobs/j-1/hints` with.
#[derive(Clone)]
enum Answer {
    Hint(String),
    /// The job was deleted.
    Gone,
}

/// An HTTP/1.1 server on loopback standing in for the agent's hints endpoint (one request per
/// connection). Checks the bearer token like the agent does. Stopped and joined on drop.
struct HintServer {
    url: String,
    answer: Arc<Mutex<Answer>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

const TOKEN: &str = "rst_loopback-tenant";

impl HintServer {
    fn start(answer: Answer) -> HintServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}/v1/jobs/j-1", listener.local_addr().unwrap());
        let answer = Arc::new(Mutex::new(answer));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (answer, stop) = (answer.clone(), stop.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => serve(conn, &answer.lock().unwrap().clone()),
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            }
        });
        HintServer { url, answer, stop, thread: Some(thread) }
    }

    fn set(&self, a: Answer) {
        *self.answer.lock().unwrap() = a;
    }
}

impl Drop for HintServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(conn: TcpStream, answer: &Answer) {
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request_line = String::new();
    let _ = reader.read_line(&mut request_line);
    let mut authorized = false;
    // Headers, bounded in count.
    for _ in 0..100 {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        if line.to_ascii_lowercase().starts_with("authorization:") && line.trim_end().ends_with(&format!("Bearer {TOKEN}")) {
            authorized = true;
        }
    }
    let (status, body) = if !request_line.starts_with("GET /v1/jobs/j-1/hints ") {
        ("404 Not Found", r#"{"error":"no such route"}"#.to_owned())
    } else if !authorized {
        ("401 Unauthorized", r#"{"error":"missing or unknown bearer token"}"#.to_owned())
    } else {
        match answer {
            Answer::Hint(json) => ("200 OK", json.clone()),
            Answer::Gone => ("404 Not Found", r#"{"error":"no such job"}"#.to_owned()),
        }
    };
    let mut conn = conn;
    let _ = write!(conn, "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis() as u64
}

fn hint_json(version: u64, algorithm: Algorithm, channels: u8, chunk_bytes: u32, expires_at: u64) -> String {
    serde_json::to_string(&Hint {
        job: "j-1".into(),
        version,
        step_from: 0,
        algorithm,
        chunk_bytes,
        channels,
        compression: Codec::Int8,
        error_feedback: true,
        reasons: vec!["path to peer 10.0.0.3 lossy".into()],
        confidence: 0.8,
        expires_at,
        tcp_rto_min_ms: None,
    })
    .unwrap()
}

#[test]
fn loopback_hints_steer_allreduce_only_then_defaults_when_the_job_is_gone() {
    let rig = Rig::new();
    for (v, algorithm, nccl) in VERSIONS.map(|v| if v % 2 == 0 { (v, Algorithm::Tree, "tree") } else { (v, Algorithm::Ring, "ring") }) {
        let server = HintServer::start(Answer::Hint(hint_json(7, algorithm, 2, 65536, unix_ms() + 600_000)));
        let mut h = rig.start(v, &[("RINGSIDE_JOB_URL", &server.url), ("RINGSIDE_TOKEN", TOKEN)]);
        let picks = h.round_until(WAIT, &format!("allreduce steered to {nccl}"), |p| steered(p, nccl, 2, 65536));
        // The hinted algorithm wins where NCCL's own choice was the other one.
        assert!(picks.iter().any(|p| p.coll == "allreduce" && p.default_algo != nccl), "the model table has sizes where {nccl} does not win by itself");
        for p in picks.iter().filter(|p| p.coll == "allreduce") {
            // v2 must name a protocol: Simple. v3+ leave the protocol to NCCL, within the hinted
            // algorithm (tree LL128 is unsupported in the model table and must stay unpicked).
            if v == 2 {
                assert_eq!(p.proto, "simple", "{p:?}");
            } else {
                assert!(!(p.algo == "tree" && p.proto == "ll128"), "an unsupported entry was picked: {p:?}");
            }
        }
        assert!(h.logged("hint v7 from"), "{:#?}", h.log);
        server.set(Answer::Gone);
        h.round_until(WAIT, "NCCL's defaults after the job was deleted", |p| p.iter().all(Pick::is_default));
        h.wait_log("no such job", WAIT);
        h.quit();
    }
}

#[test]
fn expired_hint_and_refused_token_leave_defaults() {
    let rig = Rig::new();
    let server = HintServer::start(Answer::Hint(hint_json(3, Algorithm::Ring, 4, 65536, unix_ms().saturating_sub(1000))));
    let mut h = rig.start(6, &[("RINGSIDE_JOB_URL", &server.url), ("RINGSIDE_TOKEN", TOKEN)]);
    h.wait_log("hint v3 from", WAIT);
    assert_all_default(&h.round(), "an expired hint");
    h.quit();

    let server = HintServer::start(Answer::Hint(hint_json(3, Algorithm::Ring, 4, 65536, unix_ms() + 600_000)));
    let mut h = rig.start(5, &[("RINGSIDE_JOB_URL", &server.url), ("RINGSIDE_TOKEN", "rst_wrong")]);
    h.wait_log("RINGSIDE_TOKEN is wrong: NCCL's defaults apply, polling stops", WAIT);
    assert_all_default(&h.round(), "a refused token");
    let started = Instant::now();
    h.quit();
    eprintln!("quit after a refused token took {:?}", started.elapsed());
}
