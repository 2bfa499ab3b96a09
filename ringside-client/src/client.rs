//! A small blocking client for ringside's hints API, for any Rust trainer to embed.
//!
//! - [`JobClient`] (tenant token of one job): [`JobClient::hint`] (`GET {job}/hints`),
//!   [`JobClient::metrics`] (`GET {job}/metrics`, Prometheus text) and [`JobClient::stream`]
//!   (`GET {job}/hints/stream`, server-sent events) which yields a [`HintStream`].
//! - [`OperatorClient`] (operator token): register, list and delete jobs, and read the agent's
//!   flows, status and detection events ([`crate::operator`]); the `ringside` CLI is built on it.
//!
//! Invariants:
//! - Every wait is bounded: connecting, sending and each read have timeouts ([`ClientConfig`]);
//!   a stream that receives nothing (not even a `: keep-alive` comment, sent every 15 s) for
//!   [`ClientConfig::stream_read_timeout`] is treated as dead and reconnected.
//! - Reconnects use bounded exponential backoff ([`Backoff`]): at most `max_attempts` consecutive
//!   failures, after which the stream yields [`ClientError::GaveUp`] and ends. The failure count
//!   resets whenever a valid hint event arrives, so a healthy long-lived stream never runs out.
//! - Every reconnect sends `Last-Event-ID` (the `id` of the last complete event), and a [`HintStream`] yields
//!   only hints whose `version` is strictly newer than the last one it yielded: no duplicates, no
//!   going back, whatever the server replays. Renewals (same version, later `expires_at`) are
//!   therefore not yielded.
//! - Memory is bounded: a response body is read up to [`MAX_JSON_BYTES`] / [`MAX_METRICS_BYTES`];
//!   an SSE line longer than [`MAX_SSE_LINE`] or an event larger than [`MAX_SSE_EVENT`] is an
//!   error and the connection is dropped (it cannot be resynchronised).
//! - A malformed event (bad JSON, bad framing) is an `Err` item, never a panic; the stream goes
//!   on. An `Err` that ends the stream (401/403, a 404 before any hint, giving up) is always the
//!   last item: the next call to `next()` returns `None`.
//! - The token only travels in the `Authorization` header; it never appears in errors or logs.
//! - `http://` and `https://` (rustls; the Mozilla roots, or only the CA certificates of
//!   `RINGSIDE_CA_FILE` / [`ClientConfig::ca_file`]): an untrusted certificate fails before anything is sent.
//!
//! SSE framing assumed (the agent's): `event: hint`, `id: <version>`, `data: <Hint JSON>` and a
//! blank line per event; lines starting with `:` are comments. Multi-line `data` is joined with
//! `\n` as the SSE spec says; `\r\n` line ends are accepted; `retry:` and unknown fields are
//! ignored; events whose type is neither `hint` nor the default (`message`) are skipped.

use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::de::DeserializeOwned;
use ureq::http::Response;
use ureq::{Agent, Body};

use crate::operator::{EventsResponse, FlowsResponse, JobsResponse, StatusResponse};
use crate::types::{ApiError, AppliedPlan, Hint, JobCreated, JobRegistration};

/// Largest JSON response body read (a hint, a job list, flows or events), in bytes.
pub const MAX_JSON_BYTES: u64 = 4 << 20;
/// Largest Prometheus response read, in bytes.
pub const MAX_METRICS_BYTES: u64 = 16 << 20;
/// Longest SSE line accepted, in bytes.
pub const MAX_SSE_LINE: usize = 256 << 10;
/// Largest SSE event (all its `data` lines) accepted, in bytes.
pub const MAX_SSE_EVENT: usize = 1 << 20;

/// Everything that can go wrong talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid url {url:?}: {reason}")]
    BadUrl { url: String, reason: &'static str },
    #[error("invalid job id {id:?}: ids are made of [A-Za-z0-9._-]; copy the id returned by registration")]
    BadJobId { id: String },
    #[error("cannot reach {url}: {source}; check that the ringside agent is running and the url is right")]
    Transport {
        url: String,
        #[source]
        source: ureq::Error,
    },
    #[error("{url} answered {status}: {message}{}", status_advice(*status))]
    Status { url: String, status: u16, message: String },
    #[error("bad json from {url}: {source}; client and agent versions may differ")]
    Json {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("bad server-sent event from {url}: {reason}")]
    Sse { url: String, reason: String },
    #[error("{url} answered with content type {content_type:?}, not text/event-stream: use the job's base url (http://HOST:PORT/v1/jobs/ID)")]
    NotAStream { url: String, content_type: String },
    #[error("gave up on {url} after {attempts} failed attempts in a row; last error: {last}")]
    GaveUp { url: String, attempts: u32, last: Box<ClientError> },
    #[error("cannot use the CA file {path:?} (${}): {reason}; it must hold PEM `-----BEGIN CERTIFICATE-----` blocks", CA_FILE_ENV)]
    CaFile { path: std::path::PathBuf, reason: String },
}

fn status_advice(status: u16) -> &'static str {
    match status {
        401 => " (check the bearer token: the job's tenant token or the operator token)",
        403 => " (this token does not grant access to this job or endpoint)",
        404 => " (the job is not registered, or was deleted)",
        413 => " (the request body is too large)",
        _ => "",
    }
}

impl ClientError {
    /// The HTTP status the server answered with, if that is what this error is.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            ClientError::GaveUp { last, .. } => last.status(),
            _ => None,
        }
    }

    /// Whether retrying the same request can help (transport trouble, 5xx, 429) as opposed to a
    /// request the server will refuse again (bad token, unknown job, bad url).
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport { .. } | ClientError::Sse { .. } | ClientError::Json { .. } => true,
            ClientError::Status { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            ClientError::BadUrl { .. }
            | ClientError::BadJobId { .. }
            | ClientError::NotAStream { .. }
            | ClientError::GaveUp { .. }
            | ClientError::CaFile { .. } => false,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Bounded exponential backoff between reconnect attempts: `initial`, `2·initial`, ... capped at
/// `max`, each with up to 25 % random jitter (so many clients do not reconnect in lockstep after
/// an agent restart); at most `max_attempts` failures in a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub max_attempts: u32,
}

impl Default for Backoff {
    /// 0.5 s doubling to 30 s, 12 attempts: about 4 minutes of agent outage before giving up.
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(30), max_attempts: 12 }
    }
}

impl Backoff {
    /// Delay before retry number `attempt` (1-based), jitter included.
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.initial.saturating_mul(1u32 << attempt.saturating_sub(1).min(20)).min(self.max);
        // Cheap jitter without a rand dependency: the clock's sub-second nanoseconds.
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        base + base.mul_f64(f64::from(nanos % 1000) / 4000.0)
    }
}

/// Environment variable naming a PEM file of CA certificates to trust for `https://` agents
/// (instead of the Mozilla roots): the provider's private CA behind a TLS-terminating proxy.
pub const CA_FILE_ENV: &str = "RINGSIDE_CA_FILE";

/// Timeouts, reconnect policy and TLS trust. Defaults suit a trainer on the same network as the
/// agent.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientConfig {
    /// TCP connect (and name resolution) bound.
    pub connect_timeout: Duration,
    /// Whole-request bound for plain requests (hint, metrics, operator calls).
    pub request_timeout: Duration,
    /// A stream with no bytes for this long is dead. Must exceed the server's keep-alive period
    /// (15 s) with margin for a busy agent.
    pub stream_read_timeout: Duration,
    pub reconnect: Backoff,
    /// For `https://` agents: a PEM file of the CA certificates to trust instead of the Mozilla
    /// roots. Default: `$RINGSIDE_CA_FILE` if set.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(15),
            stream_read_timeout: Duration::from_secs(45),
            reconnect: Backoff::default(),
            ca_file: std::env::var_os(CA_FILE_ENV).map(Into::into),
        }
    }
}

/// The TLS trust for `https://`: the Mozilla roots (webpki-roots), or only the certificates of
/// `ca_file`.
fn tls_config(ca_file: Option<&std::path::Path>) -> Result<ureq::tls::TlsConfig> {
    use ureq::tls::{PemItem, RootCerts, TlsConfig};
    let Some(path) = ca_file else { return Ok(TlsConfig::builder().build()) };
    let bad = |reason: String| ClientError::CaFile { path: path.to_owned(), reason };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item.map_err(|e| bad(e.to_string()))? {
            PemItem::Certificate(c) => certs.push(c.to_owned()),
            _ => continue,
        }
    }
    if certs.is_empty() {
        return Err(bad("no `-----BEGIN CERTIFICATE-----` block in it".into()));
    }
    Ok(TlsConfig::builder().root_certs(RootCerts::Specific(std::sync::Arc::new(certs))).build())
}

/// `http://` or `https://` with a host, no query or fragment; trailing slashes removed.
fn normalise_url(url: &str) -> Result<String> {
    let bad = |reason| ClientError::BadUrl { url: url.to_owned(), reason };
    let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        return Err(bad("use http://HOST:PORT/... (or https:// behind a TLS-terminating proxy)"));
    };
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("the host is missing: use http://HOST:PORT/..."));
    }
    if rest.contains(['?', '#', ' ']) {
        return Err(bad("remove the query, fragment or spaces"));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

fn check_job_id(id: &str) -> Result<()> {
    let ok = !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ClientError::BadJobId { id: id.to_owned() })
    }
}

/// The shared HTTP part: one agent (connection pool), the bearer header, status handling.
#[derive(Clone)]
struct Http {
    agent: Agent,
    stream_agent: Agent,
    auth: String,
    config: ClientConfig,
}

impl Http {
    fn new(token: &str, config: ClientConfig) -> Result<Self> {
        let tls = tls_config(config.ca_file.as_deref())?;
        let base = |b: ureq::config::ConfigBuilder<ureq::typestate::AgentScope>| {
            // Statuses are handled here so that the server's `{"error": ...}` message reaches the
            // caller instead of ureq's generic "status 401".
            b.http_status_as_error(false)
                .timeout_connect(Some(config.connect_timeout))
                .timeout_resolve(Some(config.connect_timeout))
                .tls_config(tls.clone())
        };
        let agent = Agent::new_with_config(base(Agent::config_builder()).timeout_global(Some(config.request_timeout)).build());
        // A stream lives as long as the job: bound each read, not the whole response.
        let stream_agent = Agent::new_with_config(
            base(Agent::config_builder())
                .timeout_recv_response(Some(config.request_timeout))
                .timeout_per_read(Some(config.stream_read_timeout))
                .build(),
        );
        Ok(Http { agent, stream_agent, auth: format!("Bearer {token}"), config })
    }

    fn transport(url: &str) -> impl FnOnce(ureq::Error) -> ClientError + '_ {
        move |source| ClientError::Transport { url: url.to_owned(), source }
    }

    /// Turns a non-2xx response into [`ClientError::Status`] with the server's message.
    fn check(url: &str, mut resp: Response<Body>) -> Result<Response<Body>> {
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(resp);
        }
        let text = resp.body_mut().with_config().limit(64 << 10).read_to_string().unwrap_or_default();
        let message = match serde_json::from_str::<ApiError>(&text) {
            Ok(e) => e.error,
            Err(_) if text.trim().is_empty() => resp.status().canonical_reason().unwrap_or("no message").to_owned(),
            Err(_) => text.trim().chars().take(200).collect(),
        };
        Err(ClientError::Status { url: url.to_owned(), status, message })
    }

    fn read_json<T: DeserializeOwned>(url: &str, mut resp: Response<Body>) -> Result<T> {
        let text = resp.body_mut().with_config().limit(MAX_JSON_BYTES).read_to_string().map_err(Self::transport(url))?;
        serde_json::from_str(&text).map_err(|source| ClientError::Json { url: url.to_owned(), source })
    }

    fn get(&self, url: &str) -> Result<Response<Body>> {
        let resp = self.agent.get(url).header("Authorization", &self.auth).call().map_err(Self::transport(url))?;
        Self::check(url, resp)
    }
}

/// A tenant's view of one job: `http://HOST:PORT/v1/jobs/{id}` plus its token.
#[derive(Clone)]
pub struct JobClient {
    http: Http,
    job_url: String,
}

impl std::fmt::Debug for JobClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("JobClient").field("job_url", &self.job_url).finish_non_exhaustive()
    }
}

impl JobClient {
    /// `job_url` is the job's base URL, `http://HOST:PORT/v1/jobs/{id}`; `token` is the job's
    /// tenant token (or the operator token).
    pub fn new(job_url: &str, token: &str) -> Result<Self> {
        Self::with_config(job_url, token, ClientConfig::default())
    }

    pub fn with_config(job_url: &str, token: &str, config: ClientConfig) -> Result<Self> {
        Ok(JobClient { http: Http::new(token, config)?, job_url: normalise_url(job_url)? })
    }

    pub fn job_url(&self) -> &str {
        &self.job_url
    }

    /// The current hint (`GET {job}/hints`).
    pub fn hint(&self) -> Result<Hint> {
        let url = format!("{}/hints", self.job_url);
        Http::read_json(&url, self.http.get(&url)?)
    }

    /// The job's Prometheus text (`GET {job}/metrics`).
    pub fn metrics(&self) -> Result<String> {
        let url = format!("{}/metrics", self.job_url);
        let mut resp = self.http.get(&url)?;
        resp.body_mut().with_config().limit(MAX_METRICS_BYTES).read_to_string().map_err(Http::transport(&url))
    }

    /// `PUT {job}/plan`: tells the agent which plan the job's collectives run now (see
    /// [`AppliedPlan`]). Report when the plan changes and again every
    /// [`APPLIED_PLAN_REFRESH_MS`](crate::types::APPLIED_PLAN_REFRESH_MS): the agent forgets a
    /// report after [`APPLIED_PLAN_TTL_MS`](crate::types::APPLIED_PLAN_TTL_MS).
    pub fn report_plan(&self, plan: &AppliedPlan) -> Result<()> {
        let url = format!("{}/plan", self.job_url);
        let resp = self.http.agent.put(&url).header("Authorization", &self.http.auth).send_json(plan).map_err(Http::transport(&url))?;
        Http::check(&url, resp).map(drop)
    }

    /// Opens the hint stream now: a connection failure or refusal is returned here, and only
    /// later losses are retried by the stream.
    pub fn stream(&self) -> Result<HintStream> {
        let mut s = self.stream_retrying();
        s.connect()?;
        Ok(s)
    }

    /// A hint stream that connects on the first `next()`, treating a first failure like any later
    /// one (retried with backoff). For callers that must not fail when the agent is down at start.
    pub fn stream_retrying(&self) -> HintStream {
        HintStream {
            http: self.http.clone(),
            url: format!("{}/hints/stream", self.job_url),
            reader: None,
            last_version: None,
            last_event_id: None,
            failures: 0,
            ever_connected: false,
            done: false,
            cancel: None,
        }
    }
}

/// One parsed SSE event.
#[derive(Debug, Default)]
struct SseEvent {
    event: Option<String>,
    data: Option<String>,
    /// Becomes the stream's last event id only when the event is complete (as in the SSE spec),
    /// so a reconnect after a cut never claims an event that was not received whole.
    id: Option<String>,
}

/// What reading the next event from the connection produced.
enum EventRead {
    Event(SseEvent),
    /// The connection ended or failed; reconnect.
    Lost(ClientError),
    /// A framing error that loses sync with the server: report it, then reconnect.
    Desync(ClientError),
    Cancelled,
}

/// Iterator over a job's hints from the SSE stream, reconnecting as needed (see the module docs
/// for the guarantees). `Err` items are either a malformed event (the stream goes on) or the last
/// item.
pub struct HintStream {
    http: Http,
    url: String,
    reader: Option<BufReader<Box<dyn Read + Send>>>,
    last_version: Option<u64>,
    last_event_id: Option<String>,
    /// Failed connection attempts (or connections lost before a valid hint) in a row.
    failures: u32,
    ever_connected: bool,
    done: bool,
    cancel: Option<Arc<AtomicBool>>,
}

impl std::fmt::Debug for HintStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HintStream")
            .field("url", &self.url)
            .field("connected", &self.reader.is_some())
            .field("last_version", &self.last_version)
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

impl HintStream {
    /// Ends the stream (`next()` returns `None`) soon after `flag` becomes true: checked before
    /// each connect, during backoff sleeps and after each line. A blocked read still waits for
    /// its next byte or the read timeout.
    pub fn with_cancel(mut self, flag: Arc<AtomicBool>) -> Self {
        self.cancel = Some(flag);
        self
    }

    /// Version of the last hint yielded.
    pub fn last_version(&self) -> Option<u64> {
        self.last_version
    }

    fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed))
    }

    /// Sleeps `d` unless cancelled first; returns whether it was cancelled.
    fn sleep_cancellable(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        loop {
            if self.cancelled() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(50)));
        }
    }

    fn connect(&mut self) -> Result<()> {
        let mut req = self
            .http
            .stream_agent
            .get(&self.url)
            .header("Authorization", &self.http.auth)
            .header("Accept", "text/event-stream")
            .header("Cache-Control", "no-cache");
        if let Some(id) = &self.last_event_id {
            req = req.header("Last-Event-ID", id);
        }
        let resp = Http::check(&self.url, req.call().map_err(Http::transport(&self.url))?)?;
        let ctype = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
        if !ctype.trim_start().starts_with("text/event-stream") {
            return Err(ClientError::NotAStream { url: self.url.clone(), content_type: ctype.to_owned() });
        }
        let reader: Box<dyn Read + Send> = Box::new(resp.into_body().into_reader());
        self.reader = Some(BufReader::new(reader));
        self.ever_connected = true;
        tracing::debug!(url = %self.url, last_event_id = ?self.last_event_id, "hint stream connected");
        Ok(())
    }

    fn sse_error(&self, reason: impl Into<String>) -> ClientError {
        ClientError::Sse { url: self.url.clone(), reason: reason.into() }
    }

    /// Reads lines until an event is complete.
    fn read_event(&mut self) -> EventRead {
        let mut ev = SseEvent::default();
        let mut size = 0usize;
        let mut line = Vec::with_capacity(256);
        loop {
            if self.cancelled() {
                return EventRead::Cancelled;
            }
            let Some(reader) = self.reader.as_mut() else {
                return EventRead::Lost(self.sse_error("not connected"));
            };
            line.clear();
            let n = match reader.by_ref().take(MAX_SSE_LINE as u64 + 1).read_until(b'\n', &mut line) {
                Ok(n) => n,
                Err(e) => {
                    let reason = if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) {
                        format!("nothing received for {:?} (not even a keep-alive): connection presumed dead", self.http.config.stream_read_timeout)
                    } else {
                        format!("connection lost: {e}")
                    };
                    return EventRead::Lost(self.sse_error(reason));
                }
            };
            if n == 0 {
                return EventRead::Lost(self.sse_error("the server closed the stream"));
            }
            if line.last() != Some(&b'\n') {
                if line.len() > MAX_SSE_LINE {
                    return EventRead::Desync(self.sse_error(format!("a line is longer than {MAX_SSE_LINE} bytes")));
                }
                // A partial line at EOF: the connection was cut mid-event.
                return EventRead::Lost(self.sse_error("the server closed the stream mid-line"));
            }
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.is_empty() {
                if let Some(id) = ev.id.take() {
                    self.last_event_id = Some(id);
                }
                if ev.event.is_some() || ev.data.is_some() {
                    return EventRead::Event(ev);
                }
                continue;
            }
            if line[0] == b':' {
                continue; // comment, e.g. `: keep-alive`
            }
            let Ok(text) = std::str::from_utf8(&line) else {
                return EventRead::Desync(self.sse_error("a line is not valid utf-8"));
            };
            let (field, value) = match text.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (text, ""),
            };
            size += value.len();
            if size > MAX_SSE_EVENT {
                return EventRead::Desync(self.sse_error(format!("an event is larger than {MAX_SSE_EVENT} bytes")));
            }
            match field {
                "event" => ev.event = Some(value.to_owned()),
                "data" => match &mut ev.data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => ev.data = Some(value.to_owned()),
                },
                // The SSE spec ignores ids containing NUL.
                "id" if !value.contains('\0') => ev.id = Some(value.to_owned()),
                _ => {} // `retry` and unknown fields
            }
        }
    }

    /// Records a failure and either sleeps before the next attempt or gives up.
    fn fail(&mut self, err: ClientError) -> Option<ClientError> {
        self.reader = None;
        self.failures += 1;
        let backoff = self.http.config.reconnect;
        if self.failures >= backoff.max_attempts {
            self.done = true;
            return Some(ClientError::GaveUp { url: self.url.clone(), attempts: self.failures, last: Box::new(err) });
        }
        let delay = backoff.delay(self.failures);
        tracing::warn!(url = %self.url, error = %err, attempt = self.failures, retry_in = ?delay, "hint stream unavailable; retrying");
        if self.sleep_cancellable(delay) {
            self.done = true;
        }
        None
    }
}

impl Iterator for HintStream {
    type Item = Result<Hint>;

    fn next(&mut self) -> Option<Result<Hint>> {
        // Each turn either returns, or counts one failure towards `max_attempts` (which ends the
        // stream), or reads one event; a server can make it spin only by sending events.
        loop {
            if self.done || self.cancelled() {
                self.done = true;
                return None;
            }
            if self.reader.is_none() {
                match self.connect() {
                    Ok(()) => {}
                    Err(e) if e.status() == Some(404) && self.last_version.is_some() => {
                        // The stream ends when the job is deleted; a reconnect then finds no job.
                        tracing::info!(url = %self.url, "job no longer registered; hint stream ends");
                        self.done = true;
                        return None;
                    }
                    Err(e) if !e.is_transient() => {
                        self.done = true;
                        return Some(Err(e));
                    }
                    Err(e) => {
                        if let Some(gave_up) = self.fail(e) {
                            return Some(Err(gave_up));
                        }
                        continue;
                    }
                }
            }
            match self.read_event() {
                EventRead::Cancelled => {
                    self.done = true;
                    return None;
                }
                EventRead::Lost(e) => {
                    if let Some(gave_up) = self.fail(e) {
                        return Some(Err(gave_up));
                    }
                }
                EventRead::Desync(e) => {
                    // Report the framing error, then reconnect on the next call.
                    self.reader = None;
                    self.failures += 1;
                    if self.failures >= self.http.config.reconnect.max_attempts {
                        self.done = true;
                        return Some(Err(ClientError::GaveUp { url: self.url.clone(), attempts: self.failures, last: Box::new(e) }));
                    }
                    return Some(Err(e));
                }
                EventRead::Event(ev) => {
                    let kind = ev.event.as_deref().unwrap_or("message");
                    if kind != "hint" && kind != "message" {
                        tracing::debug!(url = %self.url, event = kind, "ignoring unknown event type");
                        continue;
                    }
                    let data = ev.data.unwrap_or_default();
                    let hint: Hint = match serde_json::from_str(&data) {
                        Ok(h) => h,
                        Err(source) => return Some(Err(ClientError::Json { url: self.url.clone(), source })),
                    };
                    // A well-formed hint proves the connection healthy.
                    self.failures = 0;
                    if self.last_version.is_some_and(|v| hint.version <= v) {
                        tracing::debug!(version = hint.version, "skipping a hint not newer than the last one");
                        continue;
                    }
                    self.last_version = Some(hint.version);
                    return Some(Ok(hint));
                }
            }
        }
    }
}

/// The operator's client: `http://HOST:PORT` plus the operator token.
#[derive(Clone)]
pub struct OperatorClient {
    http: Http,
    base_url: String,
}

impl std::fmt::Debug for OperatorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorClient").field("base_url", &self.base_url).finish_non_exhaustive()
    }
}

impl OperatorClient {
    /// `base_url` is the agent's address, `http://HOST:PORT`.
    pub fn new(base_url: &str, token: &str) -> Result<Self> {
        Self::with_config(base_url, token, ClientConfig::default())
    }

    pub fn with_config(base_url: &str, token: &str, config: ClientConfig) -> Result<Self> {
        Ok(OperatorClient { http: Http::new(token, config)?, base_url: normalise_url(base_url)? })
    }

    /// `POST /v1/jobs`: registers a job; the returned tenant token is shown only once.
    pub fn register(&self, job: &JobRegistration) -> Result<JobCreated> {
        let url = format!("{}/v1/jobs", self.base_url);
        let resp = self.http.agent.post(&url).header("Authorization", &self.http.auth).send_json(job).map_err(Http::transport(&url))?;
        Http::read_json(&url, Http::check(&url, resp)?)
    }

    /// The agent's address, `http://HOST:PORT`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `GET {path}` on the agent, decoded as JSON.
    fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let url = format!("{}{path}", self.base_url);
        Http::read_json(&url, self.http.get(&url)?)
    }

    /// `GET /v1/jobs`: registered jobs (never tokens) and the config file's job names.
    pub fn jobs(&self) -> Result<JobsResponse> {
        self.get_json("/v1/jobs")
    }

    /// `GET /v1/flows?limit=N`: the top `limit` flows by bytes (the agent accepts 1-1000).
    pub fn flows(&self, limit: usize) -> Result<FlowsResponse> {
        self.get_json(&format!("/v1/flows?limit={limit}"))
    }

    /// `GET /v1/status`: readiness, attached interfaces, data-plane counters, poll age.
    pub fn status(&self) -> Result<StatusResponse> {
        self.get_json("/v1/status")
    }

    /// `GET /v1/events?state=open|all&limit=N`: open detection events, and with
    /// `include_closed` the recently closed ones too (the agent accepts a `limit` of 1-1000).
    pub fn events(&self, include_closed: bool, limit: usize) -> Result<EventsResponse> {
        let state = if include_closed { "all" } else { "open" };
        self.get_json(&format!("/v1/events?state={state}&limit={limit}"))
    }

    /// `DELETE /v1/jobs/{id}`: ends the job's hint streams.
    pub fn delete(&self, id: &str) -> Result<()> {
        check_job_id(id)?;
        let url = format!("{}/v1/jobs/{id}", self.base_url);
        let resp = self.http.agent.delete(&url).header("Authorization", &self.http.auth).call().map_err(Http::transport(&url))?;
        Http::check(&url, resp).map(drop)
    }

    /// A [`JobClient`] for job `id` on the same agent with `token`.
    pub fn job(&self, id: &str, token: &str) -> Result<JobClient> {
        check_job_id(id)?;
        Ok(JobClient { http: Http::new(token, self.http.config.clone())?, job_url: format!("{}/v1/jobs/{id}", self.base_url) })
    }
}
