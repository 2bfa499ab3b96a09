//! T0: the blocking client against real HTTP on loopback sockets (a canned server thread), no root.

mod support;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ringside_client::operator::Scope;
use ringside_client::{Algorithm, Backoff, ClientConfig, ClientError, Codec, Constraints, JobClient, JobRegistration, OperatorClient};
use support::canned::{hint_event, hint_json, serve, within, Reply};

/// Short timeouts and fast reconnects so failures show up in milliseconds.
fn fast() -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        stream_read_timeout: Duration::from_secs(5),
        reconnect: Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(100), max_attempts: 4 },
        ..ClientConfig::default()
    }
}

#[test]
fn get_hint_sends_the_token_and_parses() {
    within(20, || {
        let srv = serve(vec![Reply::json(200, &hint_json(3))]);
        let c = JobClient::with_config(&format!("{}/v1/jobs/j1/", srv.base), "tenant-secret", fast()).unwrap();
        let h = c.hint().unwrap();
        assert_eq!((h.version, h.algorithm, h.compression, h.channels), (3, Algorithm::Tree, Codec::Bf16, 2));
        let reqs = srv.requests.lock().unwrap();
        assert_eq!(reqs[0].request_line(), "GET /v1/jobs/j1/hints HTTP/1.1");
        assert_eq!(reqs[0].header("authorization").as_deref(), Some("Bearer tenant-secret"));
    });
}

#[test]
fn unauthorized_surfaces_the_servers_message_and_not_the_token() {
    within(20, || {
        let srv = serve(vec![Reply::json(401, r#"{"error":"invalid tenant token: ask the operator for this job's token"}"#)]);
        let c = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "wrong-secret", fast()).unwrap();
        let e = c.hint().unwrap_err();
        let text = e.to_string();
        assert_eq!(e.status(), Some(401));
        assert!(text.contains("401") && text.contains("invalid tenant token: ask the operator"), "{text}");
        assert!(!text.contains("wrong-secret"), "{text}");
        assert!(!format!("{c:?}").contains("wrong-secret"));
    });
}

#[test]
fn metrics_are_returned_as_text() {
    within(20, || {
        let body = "# TYPE ringside_job_step_seconds gauge\nringside_job_step_seconds{job=\"j1\"} 0.25\n";
        let srv = serve(vec![Reply::Full { status: 200, content_type: "text/plain; version=0.0.4", body: body.into() }]);
        let c = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
        assert_eq!(c.metrics().unwrap(), body);
        assert_eq!(srv.requests.lock().unwrap()[0].request_line(), "GET /v1/jobs/j1/metrics HTTP/1.1");
    });
}

#[test]
fn stream_skips_keep_alives_and_yields_two_hints() {
    within(20, || {
        // The second event uses CRLF line ends and splits its JSON over two data lines.
        let j2 = hint_json(2);
        let (a, b) = j2.split_at(j2.find("\"step_from\"").unwrap());
        let second = format!("event: hint\r\nid: 2\r\ndata: {a}\r\ndata: {b}\r\n\r\n");
        let srv = serve(vec![Reply::sse(&[": keep-alive\n\n", &hint_event(1, &hint_json(1)), ": keep-alive\n\n", "retry: 1000\n\n", &second])]);
        let c = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
        let mut s = c.stream().unwrap();
        assert_eq!(s.next().unwrap().unwrap().version, 1);
        let h2 = s.next().unwrap().unwrap();
        assert_eq!((h2.version, &h2.reasons[..]), (2, &["path to peer 10.0.0.3 lossy".to_string()][..]));
        let req = &srv.requests.lock().unwrap()[0];
        assert_eq!(req.request_line(), "GET /v1/jobs/j1/hints/stream HTTP/1.1");
        assert_eq!(req.header("accept").as_deref(), Some("text/event-stream"));
        assert_eq!(req.header("last-event-id"), None);
    });
}

#[test]
fn reconnects_with_last_event_id_after_a_drop_and_never_repeats() {
    within(20, || {
        let srv = serve(vec![
            // Two hints, then the connection is cut in the middle of the third event.
            Reply::sse(&[&hint_event(1, &hint_json(1)), &hint_event(2, &hint_json(2)), "event: hint\nid: 3\ndata: {\"jo"]),
            // On reconnect the server replays its current hint (2) first, then the next one.
            Reply::sse(&[&hint_event(2, &hint_json(2)), &hint_event(3, &hint_json(3))]),
        ]);
        let c = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
        let versions: Vec<u64> = c.stream().unwrap().take(3).map(|h| h.unwrap().version).collect();
        assert_eq!(versions, [1, 2, 3]);
        let reqs = srv.requests.lock().unwrap();
        assert_eq!(reqs.len(), 2);
        assert_eq!(reqs[1].header("last-event-id").as_deref(), Some("2"));
        assert_eq!(reqs[1].header("authorization").as_deref(), Some("Bearer t"));
    });
}

#[test]
fn a_silent_connection_is_declared_dead_and_replaced() {
    within(20, || {
        let silent = Reply::Sse { parts: vec![hint_event(1, &hint_json(1))], pause: Duration::ZERO, end: false, hold: Duration::from_secs(10) };
        let srv = serve(vec![silent, Reply::sse(&[&hint_event(2, &hint_json(2))])]);
        let cfg = ClientConfig { stream_read_timeout: Duration::from_millis(300), ..fast() };
        let c = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", cfg).unwrap();
        let t0 = std::time::Instant::now();
        let versions: Vec<u64> = c.stream().unwrap().take(2).map(|h| h.unwrap().version).collect();
        assert_eq!(versions, [1, 2]);
        assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    });
}

#[test]
fn malformed_data_is_an_error_item_and_the_stream_goes_on() {
    within(20, || {
        let srv = serve(vec![Reply::sse(&[
            "event: hint\nid: 1\ndata: {not json\n\n",
            "event: stats\ndata: {}\n\n", // unknown event type: ignored
            &hint_event(1, &hint_json(1)),
        ])]);
        let c = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
        let mut s = c.stream().unwrap();
        let e = s.next().unwrap().unwrap_err();
        assert!(matches!(e, ClientError::Json { .. }), "{e}");
        assert_eq!(s.next().unwrap().unwrap().version, 1);
    });
}

#[test]
fn the_stream_ends_when_the_job_is_deleted() {
    within(20, || {
        let srv = serve(vec![
            Reply::Sse { parts: vec![hint_event(1, &hint_json(1))], pause: Duration::ZERO, end: true, hold: Duration::ZERO },
            Reply::json(404, r#"{"error":"job j1 is not registered"}"#),
        ]);
        let c = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
        let items: Vec<_> = c.stream().unwrap().collect();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].as_ref().unwrap().version, 1);
    });
}

#[test]
fn an_unreachable_agent_gives_up_after_the_attempt_cap() {
    within(20, || {
        // A port that was just free: connections are refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let c = JobClient::with_config(&format!("http://127.0.0.1:{port}/v1/jobs/j1"), "t", fast()).unwrap();
        assert!(matches!(c.stream(), Err(ClientError::Transport { .. })));
        let items: Vec<_> = c.stream_retrying().collect();
        assert_eq!(items.len(), 1);
        let e = items.into_iter().next().unwrap().unwrap_err();
        assert!(matches!(e, ClientError::GaveUp { attempts: 4, .. }), "{e}");
        assert!(e.to_string().contains("check that the ringside agent is running"), "{e}");
    });
}

#[test]
fn cancel_ends_a_reconnecting_stream() {
    within(20, || {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cfg = ClientConfig { reconnect: Backoff { initial: Duration::from_secs(30), max: Duration::from_secs(30), max_attempts: 100 }, ..fast() };
        let c = JobClient::with_config(&format!("http://127.0.0.1:{port}/v1/jobs/j1"), "t", cfg).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = c.stream_retrying().with_cancel(stop.clone());
        let h = std::thread::spawn(move || s.count());
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(h.join().unwrap(), 0);
    });
}

#[test]
fn refused_stream_is_returned_at_once() {
    within(20, || {
        let srv = serve(vec![Reply::json(403, r#"{"error":"this token belongs to another job"}"#)]);
        let c = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
        let e = c.stream().unwrap_err();
        assert_eq!(e.status(), Some(403));
        assert!(e.to_string().contains("another job"), "{e}");
    });
}

#[test]
fn a_url_that_is_not_a_stream_is_refused_at_once() {
    within(20, || {
        let srv = serve(vec![Reply::Full { status: 200, content_type: "text/html", body: "<html></html>".into() }]);
        let c = JobClient::with_config(&format!("{}/v1/jobs/j1", srv.base), "t", fast()).unwrap();
        let items: Vec<_> = c.stream_retrying().collect();
        assert_eq!(items.len(), 1);
        assert!(matches!(items[0], Err(ClientError::NotAStream { .. })), "{:?}", items[0]);
    });
}

#[test]
fn operator_registers_lists_and_deletes() {
    within(20, || {
        let view = r#"{"jobs":[{"id":"j1","name":"llama","members":["10.77.0.0/24"],"tcp_ports":["29500-29510"],"udp_ports":[],"gradient_bytes":null,"constraints":{"algorithms":["ring","tree"],"codecs":["none","fp16"],"min_topk_ratio":0.1,"max_channels":2,"error_feedback":true,"step_time_target_ms":null},"registered_unix_ms":1}],"config_jobs":["cfg-job"]}"#;
        let srv = serve(vec![
            Reply::json(201, r#"{"id":"j1","name":"llama","tenant_token":"tt"}"#),
            Reply::json(200, view),
            Reply::Full { status: 204, content_type: "application/json", body: String::new() },
            Reply::json(404, r#"{"error":"no job j2"}"#),
        ]);
        let op = OperatorClient::with_config(&srv.base, "op", fast()).unwrap();
        let reg = JobRegistration {
            name: "llama".into(),
            members: vec!["10.77.0.0/24".into()],
            tcp_ports: vec!["29500-29510".parse().unwrap()],
            udp_ports: vec![],
            gradient_bytes: None,
            constraints: Constraints { max_channels: 2, ..Default::default() },
        };
        let created = op.register(&reg).unwrap();
        assert_eq!((created.id.as_str(), created.tenant_token.as_str()), ("j1", "tt"));
        let jobs = op.jobs().unwrap();
        assert_eq!(jobs.jobs[0].constraints.max_channels, 2);
        assert_eq!(jobs.config_jobs, vec!["cfg-job"]);
        op.delete("j1").unwrap();
        assert_eq!(op.delete("j2").unwrap_err().status(), Some(404));
        assert!(matches!(op.delete("../metrics"), Err(ClientError::BadJobId { .. })));
        let reqs = srv.requests.lock().unwrap();
        assert_eq!(reqs[0].request_line(), "POST /v1/jobs HTTP/1.1");
        assert_eq!(serde_json::from_str::<JobRegistration>(&reqs[0].body).unwrap(), reg);
        assert_eq!(reqs[1].request_line(), "GET /v1/jobs HTTP/1.1");
        assert_eq!(reqs[2].request_line(), "DELETE /v1/jobs/j1 HTTP/1.1");
        assert_eq!(reqs[2].header("authorization").as_deref(), Some("Bearer op"));
    });
}

/// Bodies as the agent writes them (compact JSON, its field order, absent optionals omitted).
const FLOWS: &str = r#"{"total_flows":2,"limit":1,"flows":[{"interface":"eth0","direction":"egress","kind":"tcp","src_addr":"10.77.0.1","dst_addr":"10.77.0.2","src_port":40000,"dst_port":29500,"peer":"10.77.0.2","packets":10,"bytes":15000,"payload_bytes":14000,"ce_marks":0,"rates":{"bytes_per_second":1000.0,"packets_per_second":1.0,"ewma_bytes_per_second":900.0,"ewma_packets_per_second":0.9},"idle_seconds":0.5,"tcp":{"retransmissions":3,"pure_acks":1,"dsacks":0,"ece":0,"cwr":0,"rst":0,"fin":0,"syn":1},"bursts":{"count":1,"mean_duration_seconds":0.01,"mean_bytes":15000.0,"recent":[{"duration_seconds":0.01,"bytes":15000,"packets":10}]}}]}"#;
const STATUS: &str = r#"{"ready":false,"not_ready_reason":"no poll yet","interfaces":[{"name":"eth0","ifindex":2,"mode":"clsact","qdisc_added":true}],"pin_dir":null,"poll_interval_seconds":0.1,"polls":0,"poll_errors":0,"last_poll_age_seconds":null,"flows_tracked":0,"dataplane":[["seen",5],["parsed",4]]}"#;
const EVENTS: &str = r#"{"state":"all","limit":10,"open_count":1,"closed_retained":0,"windows":7,"jobs":["default"],"events":[{"id":1,"job":"default","kind":"gray_failure","scope":{"type":"peer","peer":"10.77.0.3","link":"p1"},"severity":"critical","classification":"transient","state":"open","carried_over":false,"confirmed":false,"started_unix_ms":1700000000000,"raised_unix_ms":1700000001000,"observed_windows":2,"anomalous_windows":2,"evidence":[{"metric":"loss_rate","value":0.05,"reference":0.0,"reference_kind":"peer_median","mad":0.0,"windows":{"anomalous":2,"of":2}}]}]}"#;

#[test]
fn operator_reads_flows_status_and_events() {
    within(20, || {
        let srv = serve(vec![Reply::json(200, FLOWS), Reply::json(200, STATUS), Reply::json(200, EVENTS), Reply::json(400, r#"{"error":"invalid limit `0`"}"#)]);
        let op = OperatorClient::with_config(&format!("{}/", srv.base), "op", fast()).unwrap();
        let flows = op.flows(1).unwrap();
        assert_eq!(flows.flows[0].tcp.as_ref().map(|t| t.retransmissions), Some(3));
        let status = op.status().unwrap();
        assert_eq!(status.not_ready_reason.as_deref(), Some("no poll yet"));
        let events = op.events(true, 10).unwrap();
        assert_eq!(events.events[0].scope, Scope::Peer { peer: "10.77.0.3".parse().unwrap(), link: "p1".into() });
        let e = op.events(false, 0).unwrap_err();
        assert!(e.status() == Some(400) && e.to_string().contains("invalid limit"), "{e}");
        // What the client decodes serializes back to the same bytes: the types are the wire.
        assert_eq!(serde_json::to_string(&flows).unwrap(), FLOWS);
        assert_eq!(serde_json::to_string(&status).unwrap(), STATUS);
        assert_eq!(serde_json::to_string(&events).unwrap(), EVENTS);
        let reqs = srv.requests.lock().unwrap();
        let lines: Vec<&str> = reqs.iter().map(|r| r.request_line()).collect();
        assert_eq!(
            lines,
            [
                "GET /v1/flows?limit=1 HTTP/1.1",
                "GET /v1/status HTTP/1.1",
                "GET /v1/events?state=all&limit=10 HTTP/1.1",
                "GET /v1/events?state=open&limit=0 HTTP/1.1"
            ]
        );
        assert!(reqs.iter().all(|r| r.header("authorization").as_deref() == Some("Bearer op")));
    });
}

#[test]
fn urls_are_checked() {
    assert_eq!(JobClient::new("https://h:1/v1/jobs/j", "t").unwrap().job_url(), "https://h:1/v1/jobs/j");
    assert!(matches!(JobClient::new("ftp://h:1/v1/jobs/j", "t"), Err(ClientError::BadUrl { .. })));
    assert!(matches!(JobClient::new("h:1/v1/jobs/j", "t"), Err(ClientError::BadUrl { .. })));
    assert!(matches!(JobClient::new("http:///v1/jobs/j", "t"), Err(ClientError::BadUrl { .. })));
    assert_eq!(JobClient::new("http://h:1/v1/jobs/j//", "t").unwrap().job_url(), "http://h:1/v1/jobs/j");
}
