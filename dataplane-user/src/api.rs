//! The agent's HTTP API (axum). `docs/openapi.json` (served at `/v1/openapi.json`) is the
//! reference; a test keeps its paths and the router's routes the same set.
//!
//! - open: `/metrics`, `/healthz`, `/readyz`, `/v1/openapi.json` (bind the listener to the
//!   provider network);
//! - operator token: `/v1/flows`, `/v1/status`, `/v1/events`, `POST`/`GET /v1/jobs`,
//!   `DELETE /v1/jobs/{id}`;
//! - the job's tenant token or the operator token: `/v1/jobs/{id}/hints`, `.../hints/stream`
//!   (server-sent events), `.../metrics`. A tenant response names only its own job and peers.
//!
//! Who may call what is decided by the extractors in [`crate::auth`]. Handlers copy what they need
//! out of [`SharedState`] under a short lock and render outside it. Every error is JSON
//! `{"error": "..."}` with a status code that says whose fault it is. The response types here are
//! also what the CLI (`ringside flows`, `ringside status`) decodes.
use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use axum::{
    extract::{
        rejection::{JsonRejection, QueryRejection},
        DefaultBodyLimit, Path, Query, State,
    },
    http::{header, StatusCode},
    response::{
        sse::{Event as SseEvent, KeepAlive, Sse},
        IntoResponse, Response,
    },
    routing::get,
    Json, Router,
};
use serde::{Deserialize, Serialize};

use crate::{
    auth::{JobAccess, Operator},
    events::Event,
    flow_table::{direction_name, format_addr, kind_name, BurstRecord, FlowEntry, Rates},
    match_map, metrics,
    registry::{self, RegisterError},
    state::{AgentState, AttachedInterface, SharedState},
};
use dataplane_common::{flow_kind, stats};
use ringside_client::{Hint, JobCreated, JobRegistration, JobView};

/// Largest request body (a registration is well under 1 KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most concurrent hint streams (each holds a connection and a task).
pub const MAX_HINT_STREAMS: usize = 64;
/// Interval of the SSE keep-alive comments (below common proxy idle timeouts).
pub const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The OpenAPI document served at `/v1/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("../../docs/openapi.json");

/// Default and maximum `limit` of `/v1/events`.
pub const DEFAULT_EVENTS_LIMIT: usize = 100;
pub const MAX_EVENTS_LIMIT: usize = 1000;

/// `/v1/events` response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EventsResponse {
    /// `open` or `all` (the query's `state`).
    pub state: String,
    pub limit: usize,
    /// Open events in total (the list may be cut by `limit`).
    pub open_count: usize,
    /// Closed events retained (`detect.recent_events` at most).
    pub closed_retained: usize,
    /// Detection windows run since start.
    pub windows: u64,
    /// Configured jobs.
    pub jobs: Vec<String>,
    /// Open events (oldest first), then, with `state=all`, closed ones (newest first); at most
    /// `limit`.
    pub events: Vec<Event>,
}

/// Default and maximum `limit` of `/v1/flows`.
pub const DEFAULT_FLOWS_LIMIT: usize = 20;
pub const MAX_FLOWS_LIMIT: usize = 1000;

/// `{"error": "..."}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ApiError {
    pub error: String,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(ApiError { error: message.into() })).into_response()
}

/// One flow in `/v1/flows`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FlowView {
    pub interface: String,
    /// `ingress` or `egress`.
    pub direction: String,
    /// `tcp`, `udp` or `rocev2`.
    pub kind: String,
    pub src_addr: String,
    pub dst_addr: String,
    pub src_port: u16,
    pub dst_port: u16,
    /// The remote end (source for ingress, destination for egress).
    pub peer: String,
    pub packets: u64,
    /// L3 bytes.
    pub bytes: u64,
    pub payload_bytes: u64,
    pub ce_marks: u64,
    pub rates: RatesView,
    /// Seconds since the flow's last packet (relative to the last poll).
    pub idle_seconds: f64,
    /// TCP counters (TCP flows only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tcp: Option<TcpView>,
    /// RoCEv2 counters (RoCEv2 flows only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub roce: Option<RoceView>,
    pub bursts: BurstsView,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RatesView {
    pub bytes_per_second: f64,
    pub packets_per_second: f64,
    pub ewma_bytes_per_second: f64,
    pub ewma_packets_per_second: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TcpView {
    pub retransmissions: u64,
    pub pure_acks: u64,
    pub dup_acks: u64,
    pub ece: u64,
    pub cwr: u64,
    pub rst: u64,
    pub fin: u64,
    pub syn: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RoceView {
    pub psn_gap_events: u64,
    pub psn_gap_packets: u64,
    pub psn_out_of_order: u64,
    pub naks: u64,
    pub cnps: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BurstsView {
    /// Ended bursts since the flow was first tracked.
    pub count: u64,
    pub mean_duration_seconds: f64,
    pub mean_bytes: f64,
    /// The most recent ended bursts, oldest first (bounded by `burst_history`).
    pub recent: Vec<BurstView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BurstView {
    pub duration_seconds: f64,
    pub bytes: u64,
    pub packets: u64,
}

/// `/v1/flows` response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FlowsResponse {
    /// Flows in the agent's table.
    pub total_flows: usize,
    pub limit: usize,
    /// Top flows by bytes, largest first.
    pub flows: Vec<FlowView>,
}

/// `/v1/status` response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StatusResponse {
    pub ready: bool,
    /// Why not ready (absent when ready).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub not_ready_reason: Option<String>,
    pub interfaces: Vec<AttachedInterface>,
    pub pin_dir: Option<String>,
    pub poll_interval_seconds: f64,
    pub polls: u64,
    pub poll_errors: u64,
    pub last_poll_age_seconds: Option<f64>,
    pub flows_tracked: usize,
    /// `STATS`, summed over CPUs, by name.
    pub dataplane: Vec<(String, u64)>,
}

/// Names of the `STATS` entries, in index order.
pub const STATS_NAMES: [(&str, u32); 9] = [
    ("seen", stats::SEEN),
    ("parsed", stats::PARSED),
    ("matched", stats::MATCHED),
    ("malformed", stats::MALFORMED),
    ("unsupported", stats::UNSUPPORTED),
    ("map_full", stats::MAP_FULL),
    ("ringbuf_full", stats::RINGBUF_FULL),
    ("events", stats::EVENTS),
    ("unreadable", stats::UNREADABLE),
];

const _: () = assert!(STATS_NAMES.len() == stats::COUNT as usize, "name every STATS entry");

impl FlowView {
    pub fn new(e: &FlowEntry, state: &AgentState, now_ns: u64) -> Self {
        let c = &e.totals.counters;
        let k = &e.key;
        let Rates { bytes_per_second, packets_per_second, ewma_bytes_per_second, ewma_packets_per_second, .. } = e.rates;
        let b = &e.bursts;
        let mean = |total: u64| if b.count == 0 { 0.0 } else { total as f64 / b.count as f64 };
        FlowView {
            interface: state.ifname(k.ifindex),
            direction: direction_name(k.direction).to_owned(),
            kind: kind_name(k.kind).to_owned(),
            src_addr: format_addr(&k.src_addr),
            dst_addr: format_addr(&k.dst_addr),
            src_port: k.src_port,
            dst_port: k.dst_port,
            peer: format_addr(&e.peer()),
            packets: c.packets,
            bytes: c.bytes,
            payload_bytes: c.payload_bytes,
            ce_marks: c.ce_marks,
            rates: RatesView { bytes_per_second, packets_per_second, ewma_bytes_per_second, ewma_packets_per_second },
            idle_seconds: now_ns.saturating_sub(e.totals.last_seen_ns) as f64 / 1e9,
            tcp: (k.kind == flow_kind::TCP).then(|| TcpView {
                retransmissions: c.tcp_retrans,
                pure_acks: c.tcp_pure_acks,
                dup_acks: c.tcp_dup_acks,
                ece: c.tcp_ece,
                cwr: c.tcp_cwr,
                rst: c.tcp_rst,
                fin: c.tcp_fin,
                syn: c.tcp_syn,
            }),
            roce: (k.kind == flow_kind::ROCEV2).then(|| RoceView {
                psn_gap_events: c.roce_psn_gap_events,
                psn_gap_packets: c.roce_psn_gap_packets,
                psn_out_of_order: c.roce_psn_out_of_order,
                naks: c.roce_naks,
                cnps: c.roce_cnps,
            }),
            bursts: BurstsView {
                count: b.count,
                mean_duration_seconds: mean(b.total_duration_ns) / 1e9,
                mean_bytes: mean(b.total_bytes),
                recent: b
                    .recent
                    .iter()
                    .map(|r: &BurstRecord| BurstView { duration_seconds: r.duration_ns as f64 / 1e9, bytes: r.bytes, packets: r.packets })
                    .collect(),
            },
        }
    }
}

/// Every route: (path, methods). The OpenAPI test compares this with `docs/openapi.json`.
pub const ROUTES: &[(&str, &[&str])] = &[
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
];

/// The router over a shared state.
pub fn router(state: SharedState) -> Router {
    Router::new()
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
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn write(state: &SharedState) -> std::sync::RwLockWriteGuard<'_, AgentState> {
    state.write().unwrap_or_else(|p| p.into_inner())
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

async fn create_job(_: Operator, State(state): State<SharedState>, body: Result<Json<JobRegistration>, JsonRejection>) -> Response {
    let reg = match body {
        Ok(Json(r)) => r,
        Err(rej) => return json_rejection(rej),
    };
    let now = unix_ms();
    // The write lock is held across the (microsecond) bpf syscalls so that the registry and the
    // kernel trie change together; registrations are rare.
    let mut s = write(&state);
    let (id, token) = match s.registry.register(&reg, now) {
        Ok(r) => r,
        Err(e) => {
            let status = match &e {
                RegisterError::Invalid { .. } => StatusCode::BAD_REQUEST,
                RegisterError::NameTaken { .. } => StatusCode::CONFLICT,
                RegisterError::Full { .. } => StatusCode::TOO_MANY_REQUESTS,
                RegisterError::Randomness(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            if status.is_server_error() {
                tracing::error!("{e}");
            }
            return error(status, e.to_string());
        }
    };
    let keys = s.registry.prefix_keys(&id);
    match s.pin_dir.clone().filter(|_| s.attached) {
        Some(dir) => match match_map::add(&dir, &keys) {
            Ok(match_map::Added::AllAddressesMatched) => {
                tracing::debug!(job = %id, "no [match] prefixes configured: every address is already monitored");
            }
            Ok(match_map::Added::Inserted { total }) => {
                tracing::debug!(job = %id, added = keys.len(), total, "job prefixes added to MATCH_PREFIXES");
            }
            Err(e) => {
                s.registry.unregister(&id);
                tracing::warn!(job = %id, "registration rolled back: {e}");
                return error(StatusCode::SERVICE_UNAVAILABLE, format!("cannot monitor the job's members: {e}"));
            }
        },
        None => tracing::info!(job = %id, "job registered while no eBPF program is loaded: its prefixes are not written to the kernel"),
    }
    s.hints.ensure_job(&id);
    if let Err(e) = s.hints.publish(registry::baseline_hint(&id, now)) {
        tracing::warn!("{e}");
    }
    drop(s);
    tracing::info!(job = %id, name = %reg.name, members = reg.members.len(), "job registered");
    (StatusCode::CREATED, Json(JobCreated { id, name: reg.name, tenant_token: token })).into_response()
}

/// `GET /v1/jobs` response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobsResponse {
    /// Registered jobs, in registration order.
    pub jobs: Vec<JobView>,
    /// Jobs from the config file's `[[job]]` (no tenant token; the operator reads their hints).
    pub config_jobs: Vec<String>,
}

async fn list_jobs(_: Operator, State(state): State<SharedState>) -> Response {
    let s = read(&state);
    let jobs = s.registry.views();
    let config_jobs = s.hints.jobs().filter(|j| !s.registry.contains(j)).map(str::to_owned).collect();
    drop(s);
    Json(JobsResponse { jobs, config_jobs }).into_response()
}

async fn delete_job(_: Operator, State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    let mut s = write(&state);
    let keys = s.registry.prefix_keys(&id);
    if s.registry.unregister(&id).is_none() {
        let msg = if s.hints.jobs().any(|j| j == id) {
            format!("job `{id}` comes from the config file ([[job]]); remove it there and restart the agent")
        } else {
            format!("no registered job with id `{id}`; list them with GET /v1/jobs")
        };
        return error(StatusCode::NOT_FOUND, msg);
    }
    // Ends every hint stream of the job.
    s.hints.remove_job(&id);
    let unneeded = s.registry.unneeded(&keys);
    if let Some(dir) = s.pin_dir.clone().filter(|_| s.attached) {
        if let Err(e) = match_map::remove(&dir, &unneeded) {
            // The job is gone either way; a stale prefix only keeps counting traffic nobody reads.
            tracing::warn!(job = %id, "cannot remove the job's prefixes from MATCH_PREFIXES: {e}");
        }
    }
    drop(s);
    tracing::info!(job = %id, released_prefixes = unneeded.len(), "job unregistered");
    StatusCode::NO_CONTENT.into_response()
}

async fn job_hints(access: JobAccess, State(state): State<SharedState>) -> Response {
    match read(&state).hints.latest(&access.job_id) {
        Some(h) => Json(h).into_response(),
        None => error(StatusCode::NOT_FOUND, "no hint yet for this job: the policy has not planned it; retry after the next detection window"),
    }
}

async fn job_metrics(access: JobAccess, State(state): State<SharedState>) -> Response {
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], metrics::render_job(&state, &access.job_id)).into_response()
}

/// Decrements the open-stream count when the response body (the stream) is dropped.
struct StreamSlot(Arc<AtomicUsize>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn hint_event(h: &Hint) -> Option<SseEvent> {
    SseEvent::default().event("hint").id(h.version.to_string()).json_data(h).ok()
}

async fn job_hints_stream(access: JobAccess, State(state): State<SharedState>) -> Response {
    let (rx, count) = {
        let s = read(&state);
        (s.hints.subscribe(&access.job_id), s.hint_streams.clone())
    };
    let Some(rx) = rx else {
        return error(StatusCode::NOT_FOUND, "the job has no hint channel; it may have just been deleted");
    };
    if count.fetch_add(1, Ordering::Relaxed) >= MAX_HINT_STREAMS {
        count.fetch_sub(1, Ordering::Relaxed);
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{MAX_HINT_STREAMS} hint streams are open, the most this agent serves; close one or poll GET /v1/jobs/{{id}}/hints"),
        );
    }
    let slot = StreamSlot(count);
    // The current hint first, then one event per publish. The watch channel keeps only the newest
    // hint, so a slow client skips superseded plans instead of queueing them. When the job is
    // deleted the sender is dropped, `changed()` fails, and the stream (and the response) ends.
    let stream = futures_util::stream::unfold((rx, slot, true), |(mut rx, slot, first)| async move {
        if first {
            let current = rx.borrow_and_update().clone();
            if let Some(ev) = current.as_ref().and_then(hint_event) {
                return Some((Ok::<_, Infallible>(ev), (rx, slot, false)));
            }
        }
        loop {
            rx.changed().await.ok()?;
            let h = rx.borrow_and_update().clone();
            if let Some(ev) = h.as_ref().and_then(hint_event) {
                return Some((Ok(ev), (rx, slot, false)));
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(SSE_KEEP_ALIVE)).into_response()
}

async fn get_metrics(State(state): State<SharedState>) -> Response {
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], metrics::render(&state)).into_response()
}

async fn healthz() -> Response {
    Json(serde_json::json!({"status": "ok"})).into_response()
}

async fn readyz(State(state): State<SharedState>) -> Response {
    let r = read(&state).readiness();
    match r {
        Ok(()) => Json(serde_json::json!({"status": "ready"})).into_response(),
        Err(reason) => error(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}")),
    }
}

#[derive(Debug, Deserialize)]
pub struct FlowsQuery {
    limit: Option<String>,
}

/// Parses `limit`: absent → default; otherwise 1..=MAX.
pub fn parse_limit(raw: Option<&str>) -> Result<usize, String> {
    let Some(raw) = raw else { return Ok(DEFAULT_FLOWS_LIMIT) };
    match raw.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_FLOWS_LIMIT).contains(&n) => Ok(n),
        _ => Err(format!("invalid limit `{raw}`: give a whole number from 1 to {MAX_FLOWS_LIMIT} (default {DEFAULT_FLOWS_LIMIT})")),
    }
}

async fn flows(_: Operator, State(state): State<SharedState>, q: Result<Query<FlowsQuery>, QueryRejection>) -> Response {
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid query string: {e}")),
    };
    let limit = match parse_limit(q.limit.as_deref()) {
        Ok(l) => l,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    let resp = {
        let s = read(&state);
        let now = s.table.last_poll_mono_ns();
        FlowsResponse {
            total_flows: s.table.len(),
            limit,
            flows: s.table.top_by_bytes(limit).into_iter().map(|e| FlowView::new(e, &s, now)).collect(),
        }
    };
    Json(resp).into_response()
}

#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    state: Option<String>,
    limit: Option<String>,
}

/// Builds the `/v1/events` body; `all` adds the retained closed events.
pub fn events_of(s: &AgentState, all: bool, limit: usize) -> EventsResponse {
    let log = &s.events;
    let open = log.open_events().cloned();
    let events: Vec<Event> =
        if all { open.chain(log.recent_closed().cloned()).take(limit).collect() } else { open.take(limit).collect() };
    EventsResponse {
        state: if all { "all" } else { "open" }.to_owned(),
        limit,
        open_count: log.open_events().count(),
        closed_retained: log.recent_closed().count(),
        windows: log.counters.windows,
        jobs: s.jobs.clone(),
        events,
    }
}

async fn events(_: Operator, State(state): State<SharedState>, q: Result<Query<EventsQuery>, QueryRejection>) -> Response {
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid query string: {e}")),
    };
    let all = match q.state.as_deref().map(str::trim) {
        None | Some("all") => true,
        Some("open") => false,
        Some(other) => return error(StatusCode::BAD_REQUEST, format!("invalid state `{other}`: give `open` or `all` (default all)")),
    };
    let limit = match q.limit.as_deref() {
        None => DEFAULT_EVENTS_LIMIT,
        Some(raw) => match raw.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_EVENTS_LIMIT).contains(&n) => n,
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("invalid limit `{raw}`: give a whole number from 1 to {MAX_EVENTS_LIMIT} (default {DEFAULT_EVENTS_LIMIT})"),
                )
            }
        },
    };
    let body = events_of(&read(&state), all, limit);
    Json(body).into_response()
}

/// Builds the `/v1/status` body.
pub fn status_of(s: &AgentState) -> StatusResponse {
    let ready = s.readiness();
    let ds = s.table.dataplane_stats();
    StatusResponse {
        ready: ready.is_ok(),
        not_ready_reason: ready.err(),
        interfaces: s.interfaces.clone(),
        pin_dir: s.pin_dir.as_ref().map(|p| p.display().to_string()),
        poll_interval_seconds: s.poll_interval.as_secs_f64(),
        polls: s.polls,
        poll_errors: s.poll_errors,
        last_poll_age_seconds: s.poll_age().map(|d| d.as_secs_f64()),
        flows_tracked: s.table.len(),
        dataplane: STATS_NAMES.iter().map(|(n, i)| ((*n).to_owned(), ds.get(*i as usize).copied().unwrap_or(0))).collect(),
    }
}

async fn status(_: Operator, State(state): State<SharedState>) -> Response {
    let body = status_of(&read(&state));
    Json(body).into_response()
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

fn read(state: &SharedState) -> std::sync::RwLockReadGuard<'_, AgentState> {
    // A panic in the collector must not take the API down with it: read the last state anyway.
    state.read().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{flow_table::TableSettings, metrics::tests::sample_state, state::AgentState};
    use axum::{body::Body, http::Request};
    use http_body_util::BodyExt;
    use std::time::Duration;
    use tower::ServiceExt;

    async fn get(state: SharedState, uri: &str) -> (StatusCode, String, String) {
        let resp = router(state).oneshot(Request::get(uri).body(Body::empty()).unwrap()).await.unwrap();
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

        let fresh = AgentState::new(TableSettings::default(), Duration::from_millis(100)).shared();
        let (st, _, body) = get(fresh.clone(), "/readyz").await;
        assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("not attached"), "{body}");
        fresh.write().unwrap().attached = true;
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
        use crate::events::{tests::verdict, Clock, EventState};
        let state = sample_state();
        {
            let clock = Clock { mono_ns: 20_000_000_000, unix_ms: 1_700_000_020_000 };
            let mut s = state.write().unwrap();
            let mut v = verdict(2, VerdictKind::Straggler, "10.77.0.4");
            s.events.apply(&[VerdictChange::Opened(v.clone())], &clock);
            v.end_reason = Some(EndReason::Cleared);
            s.events.apply(&[VerdictChange::Closed(v)], &clock);
            s.jobs = vec!["train".into()];
        }
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
}
