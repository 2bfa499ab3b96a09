//! T0: `https://` agents, as reached through a TLS-terminating proxy: a real rustls server on
//! loopback with a certificate made for this run, trusted through `ClientConfig::ca_file`
//! (`$RINGSIDE_CA_FILE`), refused without it.
mod support;

use std::{
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    sync::{Arc, Mutex},
    time::Duration,
};

use ringside_client::{Algorithm, ClientConfig, ClientError, JobClient};
use support::canned::{hint_json, within};

/// A one-connection-per-reply HTTPS server answering every request with `body` (JSON, 200);
/// returns its base URL, the CA file that trusts it, and the request lines it saw.
fn serve_tls(body: String, connections: usize) -> (String, std::path::PathBuf, Arc<Mutex<Vec<String>>>) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).expect("a self-signed certificate");
    // One directory per server: tests run in parallel, and a shared ca.pem would be overwritten by
    // another test's certificate.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("ringside-client-tls-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, cert.cert.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .expect("server certificate");
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("https://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let rec = seen.clone();
    std::thread::spawn(move || {
        for _ in 0..connections {
            let Ok((tcp, _)) = listener.accept() else { return };
            let _ = tcp.set_read_timeout(Some(Duration::from_secs(5)));
            let conn = rustls::ServerConnection::new(config.clone()).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut lines = Vec::new();
            {
                let mut r = BufReader::new(&mut tls);
                loop {
                    let mut line = String::new();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) if line == "\r\n" => break,
                        Ok(_) => lines.push(line.trim_end().to_owned()),
                    }
                }
            }
            if lines.is_empty() {
                continue; // the client refused the handshake
            }
            rec.lock().unwrap().push(lines[0].clone());
            let _ = write!(tls, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = tls.flush();
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
    });
    (base, ca, seen)
}

fn config(ca_file: Option<std::path::PathBuf>) -> ClientConfig {
    ClientConfig { connect_timeout: Duration::from_secs(2), request_timeout: Duration::from_secs(5), ca_file, ..ClientConfig::default() }
}

#[test]
fn https_with_the_providers_ca_reads_hints() {
    within(20, || {
        let (base, ca, seen) = serve_tls(hint_json(4), 1);
        let c = JobClient::with_config(&format!("{base}/v1/jobs/j1"), "tenant-secret", config(Some(ca.clone()))).unwrap();
        // The client read the CA file when it was built.
        let _ = std::fs::remove_dir_all(ca.parent().unwrap());
        let h = c.hint().unwrap();
        assert_eq!((h.version, h.algorithm), (4, Algorithm::Tree));
        assert_eq!(seen.lock().unwrap().as_slice(), ["GET /v1/jobs/j1/hints HTTP/1.1"]);
    });
}

#[test]
fn https_with_an_untrusted_certificate_is_refused() {
    within(20, || {
        // The Mozilla roots do not trust this run's self-signed certificate.
        let (base, ca, seen) = serve_tls(hint_json(4), 1);
        let _ = std::fs::remove_dir_all(ca.parent().unwrap());
        let c = JobClient::with_config(&format!("{base}/v1/jobs/j1"), "tenant-secret", config(None)).unwrap();
        let e = c.hint().unwrap_err();
        assert!(matches!(e, ClientError::Transport { .. }), "{e}");
        assert!(e.to_string().to_lowercase().contains("certificate") || format!("{e:?}").contains("UnknownIssuer"), "{e:?}");
        assert!(seen.lock().unwrap().is_empty(), "no request may be sent over an untrusted connection");
    });
}

#[test]
fn a_ca_file_without_certificates_is_named() {
    let bad = std::env::temp_dir().join(format!("ringside-client-not-a-ca-{}.pem", std::process::id()));
    std::fs::write(&bad, "not a certificate\n").unwrap();
    let e = JobClient::with_config("https://127.0.0.1:1/v1/jobs/j1", "t", config(Some(bad.clone()))).unwrap_err();
    assert!(matches!(e, ClientError::CaFile { .. }) && e.to_string().contains(&bad.display().to_string()) && e.to_string().contains("RINGSIDE_CA_FILE"), "{e}");
    let missing = config(Some("/nonexistent/ca.pem".into()));
    let e = JobClient::with_config("https://127.0.0.1:1/v1/jobs/j1", "t", missing).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    let _ = std::fs::remove_file(&bad);
}
