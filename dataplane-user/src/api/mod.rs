//! The agent's HTTP API (axum). `docs/openapi.json` (served at `/v1/openapi.json`) is the
//! reference; a test keeps its paths and the router's routes the same set.
//!
//! - open: `/metrics`, `/healthz`, `/readyz`, `/v1/openapi.json`, and `/`, the status page (static:
//!   its script reads the operator endpoints below with the token the viewer enters; bind the
//!   listener to the provider network);
//! - operator token: `/v1/flows`, `/v1/status`, `/v1/events`, `POST`/`GET /v1/jobs`,
//!   `DELETE /v1/jobs/{id}`;
//! - the job's tenant token or the operator token: `/v1/jobs/{id}/hints`, `.../hints/stream`
//!   (server-sent events), `.../metrics`, and `PUT .../plan` (the job's report of the plan it runs).
//!   A tenant response names only its own job and peers.
//!
//! Who may call what is decided by the extractors in [`crate::auth`]. Handlers read the stages'
//! published snapshots through [`AgentView`] (never a stage's working state) and write jobs only
//! through the job catalog. Every error is JSON
//! `{"error": "..."}` with a status code that says whose fault it is. The response types are
//! `ringside_client::operator`'s, which the CLI (`ringside flows`, `status`, `events`, `jobs`)
//! decodes with `ringside_client::OperatorClient`.
//!
//! - [`views`]: how each response is built from the snapshots;
//! - [`operator_handlers`]: `/v1/flows`, `/v1/status`, `/v1/events`;
//! - [`job_handlers`]: `/v1/jobs` (onboard, list, remove through the job catalog) and each job's
//!   hints, hint stream, metrics and plan report;
//! - this module: the router, the open endpoints, errors and the shared helpers.
mod job_handlers;
mod operator_handlers;
pub(crate) mod server;
mod views;

use std::time::Duration;

use axum::{
    extract::{rejection::JsonRejection, DefaultBodyLimit, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Json, Router,
};
use ringside_client::ApiError;

use crate::{metrics, view::AgentView};
use job_handlers::{create_job, delete_job, job_hints, job_hints_stream, job_metrics, list_jobs, put_job_plan};
use operator_handlers::{events, flows, status};
pub use operator_handlers::{parse_limit, EventsQuery, FlowsQuery, DEFAULT_EVENTS_LIMIT, DEFAULT_FLOWS_LIMIT, MAX_EVENTS_LIMIT, MAX_FLOWS_LIMIT};
pub use views::{events_of, flow_view, status_of, STATS_NAMES};

/// Largest request body (a registration is well under 1 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most concurrent hint streams (each holds a connection and a task).
pub const MAX_HINT_STREAMS: usize = 64;
/// Interval of the SSE keep-alive comments (below common proxy idle timeouts).
pub const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The OpenAPI document served at `/v1/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("../../../docs/openapi.json");

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(ApiError { error: message.into() })).into_response()
}

/// Every route: (path, methods). The OpenAPI test compares this with `docs/openapi.json`.
pub const ROUTES: &[(&str, &[&str])] = &[
    ("/", &["get"]),
    ("/metrics", &["get"]),
    ("/healthz", &["get"]),
    ("/readyz", &["get"]),
    ("/v1/openapi.json", &["get"]),
    ("/v1/flows", &["get"]),
    ("/v1/status", &["get"]),
    ("/v1/events", &["get"]),
    ("/v1/jobs", &["get", "post"]),
    ("/v1/jobs/{id}", &["delete"]),
    ("/v1/jobs/{id}/hints", &["get"]),
    ("/v1/jobs/{id}/hints/stream", &["get"]),
    ("/v1/jobs/{id}/metrics", &["get"]),
    ("/v1/jobs/{id}/plan", &["put"]),
];

/// The router over the agent's published state.
pub fn router(state: AgentView) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/metrics", get(get_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/flows", get(flows))
        .route("/v1/status", get(status))
        .route("/v1/events", get(events))
        .route("/v1/jobs", get(list_jobs).post(create_job))
        .route("/v1/jobs/{id}", axum::routing::delete(delete_job))
        .route("/v1/jobs/{id}/hints", get(job_hints))
        .route("/v1/jobs/{id}/hints/stream", get(job_hints_stream))
        .route("/v1/jobs/{id}/metrics", get(job_metrics))
        .route("/v1/jobs/{id}/plan", axum::routing::put(put_job_plan))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// The status page (`GET /`): static HTML with an inline script and styles, no external assets.
pub const STATUS_PAGE: &str = include_str!("status_page.html");

/// The status page, with headers that keep it self-contained: its script and styles are inline,
/// it may only call this agent (`connect-src 'self'`), and it is never framed, cached or sent as a
/// referrer.
async fn status_page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        STATUS_PAGE,
    )
        .into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

async fn get_metrics(State(state): State<AgentView>) -> Response {
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], metrics::render(&state)).into_response()
}

async fn healthz() -> Response {
    Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn readyz(State(state): State<AgentView>) -> Response {
    let r = state.readiness();
    match r {
        Ok(()) => Json(serde_json::json!({"status": "ready"})).into_response(),
        Err(reason) => error(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}")),
    }
}

async fn not_found(uri: axum::http::Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no such endpoint `{}`; GET /v1/openapi.json lists every endpoint", uri.path()),
    )
}

async fn method_not_allowed() -> Response {
    error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed: GET /v1/openapi.json lists each endpoint's methods")
}

/// A JSON body rejection as `{"error"}`: 413 too large, 415 not `application/json`, 400 otherwise
/// (axum's 422 for a well-formed body of the wrong shape is a client error like any other here).
fn json_rejection(rej: JsonRejection) -> Response {
    let status = match rej.status() {
        StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
        s => s,
    };
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => format!("request body is larger than {MAX_BODY_BYTES} bytes"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "send the body as JSON with `Content-Type: application/json`".to_owned(),
        _ => format!("invalid JSON body: {}", rej.body_text()),
    };
    error(status, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringside_client::{
        operator::{EventsResponse, FlowsResponse, JobsResponse, StatusResponse},
        Hint, JobCreated,
    };
    use std::sync::atomic::Ordering;
    use crate::{metrics::tests::sample_state, view::AttachInfo};
    use axum::{body::Body, http::Request};
    use http_body_util::BodyExt;
    use std::time::Duration;
    use tower::ServiceExt;

    use crate::metrics::tests::TEST_OPERATOR_TOKEN as OP;

    /// GET with the operator token.
    async fn get(state: AgentView, uri: &str) -> (StatusCode, String, String) {
        call(state, "GET", uri, Some(OP), None).await
    }

    /// Any request; `body` is sent as `application/json`.
    async fn call(state: AgentView, method: &str, uri: &str, token: Option<&str>, body: Option<&str>) -> (StatusCode, String, String) {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req.body(body.map(|b| Body::from(b.to_owned())).unwrap_or_else(Body::empty)).unwrap();
        let resp = router(state).oneshot(req).await.unwrap();
        let status = resp.status();
        let ct = resp.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, ct, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn flows_top_n_json() {
        let (st, ct, body) = get(sample_state(), "/v1/flows?limit=1").await;
        assert_eq!(st, StatusCode::OK, "{body}");
        assert!(ct.starts_with("application/json"));
        let r: FlowsResponse = serde_json::from_str(&body).unwrap();
        assert_eq!((r.total_flows, r.limit, r.flows.len()), (2, 1, 1));
        let f = &r.flows[0];
        assert_eq!((f.kind.as_str(), f.bytes, f.packets), ("rocev2", 40_000, 20));
        assert_eq!((f.src_addr.as_str(), f.dst_addr.as_str(), f.peer.as_str()), ("10.77.0.1", "10.77.0.3", "10.77.0.3"));
        assert_eq!((f.interface.as_str(), f.direction.as_str(), f.dst_port), ("eth0", "egress", 4791));
        let roce = f.roce.as_ref().unwrap();
        assert_eq!((roce.psn_gap_packets, roce.cnps), (5, 7));
        assert!(f.tcp.is_none());
        assert_eq!(f.bursts.count, 1);
        assert!((f.bursts.mean_duration_seconds - 0.003).abs() < 1e-12);

        let (st, _, body) = get(sample_state(), "/v1/flows").await;
        assert_eq!(st, StatusCode::OK);
        let r: FlowsResponse = serde_json::from_str(&body).unwrap();
        assert_eq!(r.limit, DEFAULT_FLOWS_LIMIT);
        assert_eq!(r.flows.len(), 2);
        assert_eq!(r.flows[1].tcp.as_ref().unwrap().retransmissions, 3);
    }

    #[tokio::test]
    async fn bad_limit_is_400_json() {
        for q in ["limit=0", "limit=abc", "limit=-1", "limit=1001", "limit="] {
            let (st, ct, body) = get(sample_state(), &format!("/v1/flows?{q}")).await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{q}: {body}");
            assert!(ct.starts_with("application/json"), "{q}");
            let e: ApiError = serde_json::from_str(&body).unwrap();
            assert!(e.error.contains("limit") && e.error.contains("1000"), "{q}: {}", e.error);
        }
        let (st, _, _) = get(sample_state(), "/v1/flows?limit=1000").await;
        assert_eq!(st, StatusCode::OK);
    }

    #[tokio::test]
    async fn unknown_path_is_404_json() {
        let (st, ct, body) = get(sample_state(), "/v1/nope").await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        assert!(ct.starts_with("application/json"));
        let e: ApiError = serde_json::from_str(&body).unwrap();
        assert!(e.error.contains("/v1/nope"), "{}", e.error);
        let resp = router(sample_state())
            .oneshot(Request::post("/v1/flows").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn health_and_readiness() {
        let (st, _, _) = get(sample_state(), "/healthz").await;
        assert_eq!(st, StatusCode::OK);
        let (st, _, body) = get(sample_state(), "/readyz").await;
        assert_eq!(st, StatusCode::OK, "{body}");

        // Not attached, then attached but before the collector's first poll.
        let s = sample_state();
        let fresh = |attached: bool| {
            let (_, snapshots) = crate::collector::Collector::new(Default::default());
            let attach = AttachInfo { attached, poll_interval: Duration::from_millis(100), ..AttachInfo::default() };
            AgentView::new(attach, snapshots, s.events_receiver(), s.catalog.clone(), s.hints.clone())
        };
        let (st, _, body) = get(fresh(false), "/readyz").await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("not attached"), "{body}");
        let fresh = fresh(true);
        let (st, _, body) = get(fresh.clone(), "/readyz").await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("no map poll"), "{body}");
        // /healthz is about the process only.
        let (st, _, _) = get(fresh, "/healthz").await;
        assert_eq!(st, StatusCode::OK);
    }

    #[tokio::test]
    async fn metrics_endpoint() {
        let (st, ct, body) = get(sample_state(), "/metrics").await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(ct, metrics::CONTENT_TYPE);
        assert!(body.contains("ringside_dataplane_packets_total{result=\"matched\"} 80"), "{body}");
    }

    #[tokio::test]
    async fn events_endpoint_filters_and_limits() {
        use crate::detect::{EndReason, VerdictChange, VerdictKind};
        use crate::{
            clock::Clock,
            events::{tests::verdict, EventState},
        };
        let state = {
            let clock = Clock { mono_ns: 20_000_000_000, unix_ms: 1_700_000_020_000 };
            let mut log = crate::metrics::tests::sample_events();
            let mut v = verdict(2, VerdictKind::Straggler, "10.77.0.4");
            log.apply(&[VerdictChange::Opened(v.clone())], &clock);
            v.end_reason = Some(EndReason::Cleared);
            log.apply(&[VerdictChange::Closed(v)], &clock);
            sample_state().with_events(crate::analysis::EventsSnapshot { log, jobs: vec!["train".into()], rdma: None, queues: None })
        };
        let (st, ct, body) = get(state.clone(), "/v1/events").await;
        assert_eq!(st, StatusCode::OK, "{body}");
        assert!(ct.starts_with("application/json"));
        let r: EventsResponse = serde_json::from_str(&body).unwrap();
        assert_eq!((r.state.as_str(), r.open_count, r.closed_retained, r.events.len()), ("all", 1, 1, 2));
        assert_eq!(r.jobs, vec!["train"]);
        let open = &r.events[0];
        assert_eq!((open.kind, open.state, open.job.as_str()), (VerdictKind::GrayFailure, EventState::Open, "train"));
        assert_eq!(r.events[1].state, EventState::Closed);
        // The JSON names the peer in the scope, with the evidence.
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["events"][0]["scope"]["type"], "peer");
        assert_eq!(v["events"][0]["scope"]["peer"], "10.77.0.3");
        assert_eq!(v["events"][0]["kind"], "gray_failure");
        assert_eq!(v["events"][0]["evidence"][0]["metric"], "loss_rate");
        assert_eq!(v["events"][1]["end_reason"], "cleared");

        let (_, _, body) = get(state.clone(), "/v1/events?state=open").await;
        let r: EventsResponse = serde_json::from_str(&body).unwrap();
        assert_eq!((r.state.as_str(), r.events.len()), ("open", 1));
        let (_, _, body) = get(state.clone(), "/v1/events?state=all&limit=1").await;
        let r: EventsResponse = serde_json::from_str(&body).unwrap();
        assert_eq!((r.limit, r.events.len()), (1, 1));

        for q in ["state=closed", "limit=0", "limit=x", "limit=1001", "state="] {
            let (st, ct, body) = get(state.clone(), &format!("/v1/events?{q}")).await;
            assert_eq!(st, StatusCode::BAD_REQUEST, "{q}: {body}");
            assert!(ct.starts_with("application/json"), "{q}");
            let e: ApiError = serde_json::from_str(&body).unwrap();
            assert!(e.error.contains("state") || e.error.contains("limit"), "{q}: {}", e.error);
        }
    }

    #[tokio::test]
    async fn status_endpoint() {
        let (st, _, body) = get(sample_state(), "/v1/status").await;
        assert_eq!(st, StatusCode::OK);
        let s: StatusResponse = serde_json::from_str(&body).unwrap();
        assert!(s.ready);
        assert_eq!(s.flows_tracked, 2);
        assert_eq!(s.interfaces[0].name, "eth0");
        assert!(s.dataplane.contains(&("matched".to_owned(), 80)));
        assert_eq!(s.polls, 1);
        assert!(s.last_poll_age_seconds.unwrap() < 60.0);
    }

    // --- jobs, tokens and the tenant boundary ---

    const REG_A: &str = r#"{"name":"alpha-train","members":["10.77.0.0/24"],"tcp_ports":["29500"]}"#;
    const REG_B: &str = r#"{"name":"bravo-secret","members":["10.88.0.1","10.88.0.2"],"constraints":{"max_channels":2}}"#;

    async fn register(state: &AgentView, body: &str) -> JobCreated {
        let (st, ct, text) = call(state.clone(), "POST", "/v1/jobs", Some(OP), Some(body)).await;
        assert_eq!(st, StatusCode::CREATED, "{text}");
        assert!(ct.starts_with("application/json"));
        serde_json::from_str(&text).unwrap()
    }

    fn assert_json_error(st: StatusCode, want: StatusCode, ct: &str, body: &str, context: &str) -> String {
        assert_eq!(st, want, "{context}: {body}");
        assert!(ct.starts_with("application/json"), "{context}: {ct}");
        serde_json::from_str::<ApiError>(body).unwrap_or_else(|e| panic!("{context}: {e}: {body}")).error
    }

    #[tokio::test]
    async fn operator_endpoints_need_the_operator_token() {
        let state = sample_state();
        let a = register(&state, REG_A).await;
        for path in ["/v1/flows", "/v1/status", "/v1/events", "/v1/jobs"] {
            let resp = router(state.clone()).oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
            assert!(resp.headers().get(header::WWW_AUTHENTICATE).unwrap().to_str().unwrap().starts_with("Bearer"), "{path}");
            let (st, ct, body) = call(state.clone(), "GET", path, Some("rso_not-a-known-token"), None).await;
            let e = assert_json_error(st, StatusCode::UNAUTHORIZED, &ct, &body, path);
            assert!(e.contains("token"), "{e}");
            let (st, ct, body) = call(state.clone(), "GET", path, Some(&a.tenant_token), None).await;
            let e = assert_json_error(st, StatusCode::FORBIDDEN, &ct, &body, path);
            assert!(e.contains("operator token"), "{e}");
            let (st, _, body) = get(state.clone(), path).await;
            assert_eq!(st, StatusCode::OK, "{path}: {body}");
        }
        // Malformed Authorization headers are 401 too.
        for h in ["Basic abc", "Bearer", "Bearer   ", "token"] {
            let req = Request::get("/v1/status").header(header::AUTHORIZATION, h).body(Body::empty()).unwrap();
            assert_eq!(router(state.clone()).oneshot(req).await.unwrap().status(), StatusCode::UNAUTHORIZED, "{h}");
        }
        // Open endpoints.
        for path in ["/metrics", "/healthz", "/readyz", "/v1/openapi.json"] {
            let (st, _, body) = call(state.clone(), "GET", path, None, None).await;
            assert_eq!(st, StatusCode::OK, "{path}: {body}");
        }
    }

    #[tokio::test]
    async fn register_list_hint_delete() {
        let state = sample_state();
        let a = register(&state, REG_A).await;
        assert_eq!(a.name, "alpha-train");
        assert!(a.id.starts_with("j-") && a.tenant_token.starts_with("rst_"), "{a:?}");
        // Only the hash is kept.
        assert!(!format!("{:?}", *state.catalog()).contains(&a.tenant_token));

        let (st, _, body) = get(state.clone(), "/v1/jobs").await;
        assert_eq!(st, StatusCode::OK, "{body}");
        assert!(!body.contains(&a.tenant_token), "GET /v1/jobs never shows tokens");
        let list: JobsResponse = serde_json::from_str(&body).unwrap();
        assert_eq!(list.jobs.len(), 1);
        assert_eq!((list.jobs[0].id.as_str(), list.jobs[0].members.as_slice()), (a.id.as_str(), &["10.77.0.0/24".to_owned()][..]));

        // The baseline plan, for the tenant and for the operator.
        for token in [a.tenant_token.as_str(), OP] {
            let (st, _, body) = call(state.clone(), "GET", &format!("/v1/jobs/{}/hints", a.id), Some(token), None).await;
            assert_eq!(st, StatusCode::OK, "{body}");
            let h: Hint = serde_json::from_str(&body).unwrap();
            assert_eq!((h.job.as_str(), h.version, h.channels, h.confidence), (a.id.as_str(), 1, 1, 0.0));
            assert_eq!(h.reasons, vec!["initial plan: no measurements yet"]);
        }
        // The analysis stage's job set now includes it.
        let set = state.catalog().job_set();
        assert!(set.spec(&a.id).is_some());

        let (st, _, body) = call(state.clone(), "DELETE", &format!("/v1/jobs/{}", a.id), Some(OP), None).await;
        assert_eq!(st, StatusCode::NO_CONTENT, "{body}");
        assert!(state.hints.subscribe(&a.id).is_none(), "board entry removed");
        let (st, ct, body) = call(state.clone(), "DELETE", &format!("/v1/jobs/{}", a.id), Some(OP), None).await;
        assert_json_error(st, StatusCode::NOT_FOUND, &ct, &body, "second delete");
        let (st, ct, body) = call(state.clone(), "GET", &format!("/v1/jobs/{}/hints", a.id), Some(OP), None).await;
        assert_json_error(st, StatusCode::NOT_FOUND, &ct, &body, "operator, unknown id");
        // A deleted job's token is no token at all.
        let (st, _, _) = call(state.clone(), "GET", &format!("/v1/jobs/{}/hints", a.id), Some(&a.tenant_token), None).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        // Tenants cannot delete.
        let b = register(&state, REG_B).await;
        let (st, _, _) = call(state.clone(), "DELETE", &format!("/v1/jobs/{}", b.id), Some(&b.tenant_token), None).await;
        assert_eq!(st, StatusCode::FORBIDDEN);
    }

    #[tokio::test]
    async fn registration_errors_have_their_status_and_name_the_field() {
        let state = sample_state();
        let post = |body: &'static str| call(state.clone(), "POST", "/v1/jobs", Some(OP), Some(body));
        for (body, field) in [
            (r#"{"name":"a","members":["10.0.0.1"]"#, "JSON"),
            (r#"{"name":"a","members":["10.0.0.1"],"constrains":{}}"#, "constrains"),
            (r#"{"name":"a"}"#, "members"),
            (r#"{"name":"a b","members":["10.0.0.1"]}"#, "name"),
            (r#"{"name":"a","members":["10.0.0.256"]}"#, "members"),
            (r#"{"name":"a","members":["10.0.0.1"],"tcp_ports":["9-1"]}"#, "port range"),
            (r#"{"name":"a","members":["10.0.0.1"],"constraints":{"max_channels":0}}"#, "max_channels"),
            (r#"{"name":"a","members":["10.0.0.1"],"constraints":{"codecs":["zstd"]}}"#, "codecs"),
        ] {
            let (st, ct, text) = post(body).await;
            let e = assert_json_error(st, StatusCode::BAD_REQUEST, &ct, &text, body);
            assert!(e.contains(field), "{body}: {e}");
        }
        // Wrong content type: 415.
        let req = Request::post("/v1/jobs")
            .header(header::AUTHORIZATION, format!("Bearer {OP}"))
            .header(header::CONTENT_TYPE, "text/plain")
            .body(Body::from(REG_A))
            .unwrap();
        let resp = router(state.clone()).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        // Over 64 KiB: 413.
        let big = format!(r#"{{"name":"a","members":["{}"]}}"#, "1".repeat(MAX_BODY_BYTES));
        let (st, ct, text) = call(state.clone(), "POST", "/v1/jobs", Some(OP), Some(&big)).await;
        let e = assert_json_error(st, StatusCode::PAYLOAD_TOO_LARGE, &ct, &text, "big body");
        assert!(e.contains("65536"), "{e}");
        // No token: 401 before the body is looked at.
        let (st, _, _) = call(state.clone(), "POST", "/v1/jobs", None, Some("not json")).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        // Duplicate name: 409; the cap: 429.
        register(&state, REG_A).await;
        let (st, ct, text) = post(REG_A).await;
        let e = assert_json_error(st, StatusCode::CONFLICT, &ct, &text, "duplicate");
        assert!(e.contains("alpha-train"), "{e}");
        {
            let ops = vec![crate::jobs::TokenHash::of(OP)];
            let mut r = crate::jobs::JobCatalog::new(ops, vec![]).with_max_jobs(1);
            r.register(&crate::jobs::catalog::tests::registration("x", &["10.1.1.1"]), 0).unwrap();
            *state.catalog() = r;
        }
        let (st, ct, text) = post(REG_B).await;
        let e = assert_json_error(st, StatusCode::TOO_MANY_REQUESTS, &ct, &text, "cap");
        assert!(e.contains("delete"), "{e}");
    }

    #[tokio::test]
    async fn a_tenant_sees_only_its_own_job() {
        let state = sample_state();
        let a = register(&state, REG_A).await;
        let b = register(&state, REG_B).await;
        for suffix in ["hints", "hints/stream", "metrics"] {
            // Status only: a stream's body never ends.
            let req = Request::get(format!("/v1/jobs/{}/{suffix}", a.id))
                .header(header::AUTHORIZATION, format!("Bearer {}", a.tenant_token))
                .body(Body::empty())
                .unwrap();
            assert_eq!(router(state.clone()).oneshot(req).await.unwrap().status(), StatusCode::OK, "{suffix}");
            // B's job, and a job that does not exist, answer the same to A.
            let mut answers = Vec::new();
            for id in [b.id.as_str(), "j-000000000000", "nope"] {
                let (st, ct, body) = call(state.clone(), "GET", &format!("/v1/jobs/{id}/{suffix}"), Some(&a.tenant_token), None).await;
                let e = assert_json_error(st, StatusCode::FORBIDDEN, &ct, &body, suffix);
                assert!(!body.contains("bravo") && !body.contains(&b.id) && !body.contains(&b.tenant_token), "{suffix}: {body}");
                answers.push(e);
            }
            assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
            // Anonymous: 401, whatever the id.
            let (st, _, _) = call(state.clone(), "GET", &format!("/v1/jobs/{}/{suffix}", b.id), None, None).await;
            assert_eq!(st, StatusCode::UNAUTHORIZED);
        }
        // A tenant response holds nothing of other tenants or of the provider.
        for suffix in ["hints", "metrics"] {
            let (_, _, body) = call(state.clone(), "GET", &format!("/v1/jobs/{}/{suffix}", a.id), Some(&a.tenant_token), None).await;
            for leak in ["bravo", b.id.as_str(), "eth0", "interface", "link", "10.88."] {
                assert!(!body.contains(leak), "{suffix} leaks {leak}: {body}");
            }
        }
    }

    #[tokio::test]
    async fn a_job_reports_the_plan_it_runs_and_bad_reports_are_400() {
        let state = sample_state();
        let a = register(&state, REG_A).await;
        let b = register(&state, REG_B).await;
        let url = format!("/v1/jobs/{}/plan", a.id);
        let int8 = r#"{"algorithm":"ring","chunk_bytes":1048576,"channels":1,"compression":"int8","error_feedback":true,"step":42}"#;
        let (st, _, body) = call(state.clone(), "PUT", &url, Some(&a.tenant_token), Some(int8)).await;
        assert_eq!(st, StatusCode::NO_CONTENT, "{body}");
        let f = state.hints.applied(&a.id, crate::clock::unix_ms()).expect("recorded");
        assert_eq!((f.plan.compression, f.plan.channels, f.plan.error_feedback), (ringside_client::Codec::Int8, 1, true));
        // The operator may report too; the same plan again keeps its start.
        let (st, _, _) = call(state.clone(), "PUT", &url, Some(OP), Some(int8)).await;
        assert_eq!(st, StatusCode::NO_CONTENT);
        assert_eq!(state.hints.applied(&a.id, crate::clock::unix_ms()).unwrap().since_unix_ms, f.since_unix_ms);
        // With the job's own step time.
        let timed = r#"{"algorithm":"ring","chunk_bytes":1048576,"channels":1,"compression":"int8","error_feedback":true,"step":50,"step_time_ms":207.5}"#;
        let (st, _, body) = call(state.clone(), "PUT", &url, Some(&a.tenant_token), Some(timed)).await;
        assert_eq!(st, StatusCode::NO_CONTENT, "{body}");
        let g = state.hints.applied(&a.id, crate::clock::unix_ms()).unwrap();
        assert_eq!((g.since_unix_ms, g.step_time_ms), (f.since_unix_ms, Some(207.5)));
        for (bad, says) in [
            (r#"{"algorithm":"ring","chunk_bytes":1,"channels":1,"compression":"none","step_time_ms":0}"#, "step_time_ms"),
            (r#"{"algorithm":"ring","chunk_bytes":1,"channels":1,"compression":"none","step_time_ms":-3}"#, "step_time_ms"),
            (r#"{"algorithm":"ring","chunk_bytes":1,"channels":1,"compression":"none","step_time_ms":4e6}"#, "step_time_ms"),
            (r#"{"algorithm":"ring","chunk_bytes":1,"channels":1,"compression":"none","step_time_ms":"fast"}"#, "step_time_ms"),
            (r#"{"algorithm":"ring","chunk_bytes":0,"channels":1,"compression":"none"}"#, "chunk_bytes"),
            (r#"{"algorithm":"ring","chunk_bytes":1,"channels":0,"compression":"none"}"#, "channels"),
            (r#"{"algorithm":"ring","chunk_bytes":1,"channels":1,"compression":"topk:1.5"}"#, "topk"),
            (r#"{"algorithm":"star","chunk_bytes":1,"channels":1,"compression":"none"}"#, "algorithm"),
            (r#"{"algorithm":"ring","chunk_bytes":1,"channels":1,"compression":"none","extra":1}"#, "extra"),
            (r#"{"algorithm":"ring""#, "JSON"),
        ] {
            let (st, ct, body) = call(state.clone(), "PUT", &url, Some(&a.tenant_token), Some(bad)).await;
            let e = assert_json_error(st, StatusCode::BAD_REQUEST, &ct, &body, bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert_eq!(state.hints.applied(&a.id, crate::clock::unix_ms()).unwrap(), g, "a refused report changes nothing");
        // Another tenant's job: 403; nobody: 401.
        let (st, _, _) = call(state.clone(), "PUT", &format!("/v1/jobs/{}/plan", b.id), Some(&a.tenant_token), Some(int8)).await;
        assert_eq!(st, StatusCode::FORBIDDEN);
        let (st, _, _) = call(state.clone(), "PUT", &url, None, Some(int8)).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        assert!(state.hints.applied(&b.id, crate::clock::unix_ms()).is_none());
        // The tenant sees what it reported next to the hint.
        let (_, _, text) = call(state.clone(), "GET", &format!("/v1/jobs/{}/metrics", a.id), Some(&a.tenant_token), None).await;
        let want = format!("ringside_job_plan_reported_info{{job=\"{}\",algorithm=\"ring\",compression=\"int8\"}} 1", a.id);
        assert!(text.contains(&want), "{text}");
        let (_, _, text) = call(state.clone(), "GET", &format!("/v1/jobs/{}/metrics", b.id), Some(&b.tenant_token), None).await;
        assert!(!text.contains("ringside_job_plan_reported_info{"), "no report, no series: {text}");
    }

    #[tokio::test]
    async fn job_metrics_are_scoped_to_the_job() {
        use crate::policy::{JobInsight, PeerHealth};
        let state = sample_state();
        let a = register(&state, REG_A).await;
        let b = register(&state, REG_B).await;
        let insight = |peer: &str| JobInsight {
            updated_unix_ms: 1,
            step_ms: Some(250.0),
            comm_ms: Some(100.0),
            predicted_comm_ms: Some(80.0),
            peers: vec![PeerHealth { peer: peer.parse().unwrap(), health: "degraded".into(), goodput_bytes_per_second: Some(1e9), loss_ratio: Some(0.01) }],
        };
        state.hints.set_insight(&a.id, insight("10.77.0.3")).unwrap();
        state.hints.set_insight(&b.id, insight("10.88.0.2")).unwrap();
        let (st, ct, body) = call(state.clone(), "GET", &format!("/v1/jobs/{}/metrics", a.id), Some(&a.tenant_token), None).await;
        assert_eq!(st, StatusCode::OK, "{body}");
        assert_eq!(ct, metrics::CONTENT_TYPE);
        let job = format!("job=\"{}\"", a.id);
        for want in [
            format!("ringside_job_plan_info{{{job},algorithm=\"ring\",compression=\"none\"}} 1"),
            format!("ringside_job_plan_chunk_bytes{{{job}}} 1048576"),
            format!("ringside_job_plan_channels{{{job}}} 1"),
            format!("ringside_job_plan_version{{{job}}} 1"),
            format!("ringside_job_step_seconds{{{job}}} 0.25"),
            format!("ringside_job_comm_seconds{{{job}}} 0.1"),
            format!("ringside_job_predicted_comm_seconds{{{job}}} 0.08"),
            format!("ringside_job_peer_health{{{job},peer=\"10.77.0.3\",health=\"degraded\"}} 1"),
            format!("ringside_job_peer_loss_ratio{{{job},peer=\"10.77.0.3\"}} 0.01"),
        ] {
            assert!(body.contains(&want), "missing {want}:\n{body}");
        }
        for m in metrics::JOB_ALL {
            assert!(body.contains(&format!("# HELP {} ", m.name)), "{} not rendered", m.name);
        }
        assert!(!body.contains(&b.id) && !body.contains("10.88.0.2") && !body.contains("ringside_peer_"), "{body}");
        assert!(!body.contains("ringside_job_plan_tcp_rto_min_seconds{"), "no transport advice, no series: {body}");
        // Transport advice shows in seconds while a hint carries it.
        let latest = state.hints.latest(&a.id).unwrap();
        state.hints.publish(ringside_client::Hint { version: latest.version + 1, tcp_rto_min_ms: Some(5), ..latest }).unwrap();
        let (_, _, body) = call(state.clone(), "GET", &format!("/v1/jobs/{}/metrics", a.id), Some(&a.tenant_token), None).await;
        assert!(body.contains(&format!("ringside_job_plan_tcp_rto_min_seconds{{{job}}} 0.005")), "{body}");
    }

    /// Reads the body until one whole SSE event (ending in a blank line) arrived, skipping
    /// keep-alive comments; `None` when the stream ended. Bounded by 5 s.
    async fn next_event(body: &mut Body) -> Option<String> {
        let mut text = String::new();
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(5), body.frame()).await.expect("an SSE event within 5 s");
            let data = frame?.unwrap().into_data().unwrap();
            text.push_str(std::str::from_utf8(&data).unwrap());
            if text.contains("\n\n") && text.lines().any(|l| l.starts_with("data:")) {
                return Some(text);
            }
        }
    }

    #[tokio::test]
    async fn hint_stream_sends_the_current_hint_then_each_publish_and_ends_with_the_job() {
        let state = sample_state();
        let a = register(&state, REG_A).await;
        let req = Request::get(format!("/v1/jobs/{}/hints/stream", a.id))
            .header(header::AUTHORIZATION, format!("Bearer {}", a.tenant_token))
            .body(Body::empty())
            .unwrap();
        let resp = router(state.clone()).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers()[header::CONTENT_TYPE].to_str().unwrap().starts_with("text/event-stream"));
        assert_eq!(state.hint_streams.load(Ordering::Relaxed), 1);
        let mut body = resp.into_body();
        let first = next_event(&mut body).await.unwrap();
        assert!(first.contains("event: hint\n") && first.contains("id: 1\n"), "{first}");
        let data = first.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
        assert_eq!(serde_json::from_str::<Hint>(data).unwrap().version, 1);

        let mut next = crate::policy::baseline_hint(&a.id, 1, 0);
        next.version = 2;
        next.compression = ringside_client::Codec::Int8;
        state.hints.publish(next).unwrap();
        let second = next_event(&mut body).await.unwrap();
        assert!(second.contains("id: 2\n") && second.contains("\"compression\":\"int8\""), "{second}");

        let (st, _, _) = call(state.clone(), "DELETE", &format!("/v1/jobs/{}", a.id), Some(OP), None).await;
        assert_eq!(st, StatusCode::NO_CONTENT);
        assert!(next_event(&mut body).await.is_none(), "the stream ends when the job is deleted");
        drop(body);
        assert_eq!(state.hint_streams.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn hint_streams_are_capped() {
        let state = sample_state();
        let a = register(&state, REG_A).await;
        state.hint_streams.store(MAX_HINT_STREAMS, Ordering::Relaxed);
        let (st, ct, body) = call(state.clone(), "GET", &format!("/v1/jobs/{}/hints/stream", a.id), Some(&a.tenant_token), None).await;
        let e = assert_json_error(st, StatusCode::TOO_MANY_REQUESTS, &ct, &body, "stream cap");
        assert!(e.contains("hint streams"), "{e}");
        assert_eq!(state.hint_streams.load(Ordering::Relaxed), MAX_HINT_STREAMS);
    }

    #[tokio::test]
    async fn config_jobs_are_readable_by_the_operator_only() {
        let state = sample_state();
        state.hints.ensure_job("cfg-job");
        state.hints.publish(crate::policy::baseline_hint("cfg-job", 1, 0)).unwrap();
        let a = register(&state, REG_A).await;
        let (st, _, body) = get(state.clone(), "/v1/jobs/cfg-job/hints").await;
        assert_eq!(st, StatusCode::OK, "{body}");
        let (st, _, _) = call(state.clone(), "GET", "/v1/jobs/cfg-job/hints", Some(&a.tenant_token), None).await;
        assert_eq!(st, StatusCode::FORBIDDEN);
        let (_, _, body) = get(state.clone(), "/v1/jobs").await;
        let list: JobsResponse = serde_json::from_str(&body).unwrap();
        assert_eq!(list.config_jobs, vec!["cfg-job"]);
        let (st, _, body) = call(state.clone(), "DELETE", "/v1/jobs/cfg-job", Some(OP), None).await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        assert!(body.contains("config file"), "{body}");
    }

    /// docs/openapi.json and the router describe the same routes and methods.
    #[tokio::test]
    async fn openapi_document_matches_the_router() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI_JSON).expect("docs/openapi.json is JSON");
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.0"));
        let methods = ["get", "post", "put", "delete", "patch"];
        let mut documented: Vec<(String, Vec<String>)> = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(p, item)| (p.clone(), methods.iter().filter(|m| item.get(**m).is_some()).map(|m| m.to_string()).collect()))
            .collect();
        documented.sort();
        let mut routed: Vec<(String, Vec<String>)> =
            ROUTES.iter().map(|(p, ms)| (p.to_string(), ms.iter().map(|m| m.to_string()).collect())).collect();
        routed.sort();
        assert_eq!(documented, routed, "docs/openapi.json paths differ from api::ROUTES");
        // ROUTES is what the router serves: each method reaches a handler (not the 404/405
        // fallbacks), and the other methods are 405.
        let state = sample_state();
        for (path, ms) in ROUTES {
            let uri = path.replace("{id}", "j-000000000000");
            for m in methods {
                let (st, _, body) = call(state.clone(), &m.to_uppercase(), &uri, None, None).await;
                if ms.contains(&m) {
                    assert!(st != StatusCode::METHOD_NOT_ALLOWED && !body.contains("no such endpoint"), "{m} {path}: {st} {body}");
                } else {
                    assert_eq!(st, StatusCode::METHOD_NOT_ALLOWED, "{m} {path}");
                }
            }
        }
        // Every operation declares its security (or none) and its responses.
        for (p, item) in doc["paths"].as_object().unwrap() {
            for (m, op) in item.as_object().unwrap() {
                assert!(op.get("responses").is_some(), "{m} {p}: no responses");
                assert!(op.get("security").is_some(), "{m} {p}: say which token (or [] for none)");
            }
        }
    }
}
