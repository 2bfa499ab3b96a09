//! `ringside flows`, `ringside status` and `ringside events`: read the agent's API and print aligned tables.
//!
//! ureq (blocking, no async runtime, a few small dependencies) is enough for one request per command.
//!
//! The operator token comes from `--token`, else `RINGSIDE_TOKEN`, else the file the agent writes,
//! `<state_dir>/operator.token` ([`resolve_token`]).
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::de::DeserializeOwned;

use crate::{
    api::{ApiError, EventsResponse, FlowsResponse, StatusResponse},
    detect::Scope,
    events::{Event, EventState},
    config::DEFAULT_LISTEN,
};

/// Default agent URL for the CLI.
pub fn default_agent_url() -> String {
    format!("http://{DEFAULT_LISTEN}")
}

/// Errors talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the agent at {url}: {message}; is the agent running? start it with `ringside agent --iface IF` (or pass --agent URL)")]
    Unreachable { url: String, message: String },
    #[error("the agent at {url} answered {status}: {message}{hint}", hint = status_hint(*status))]
    Status { url: String, status: u16, message: String },
    #[error("no operator token: pass --token TOKEN, set RINGSIDE_TOKEN, or run where the agent's {path} is readable (as root on the agent's host, or --state-dir DIR); with [api] operator_tokens_file, use a token from that file")]
    NoToken { path: PathBuf },
    #[error("cannot read the operator token from {path}: {source}; pass --token or set RINGSIDE_TOKEN")]
    TokenFile { path: PathBuf, source: std::io::Error },
    #[error("the agent at {url} sent a response this ringside does not understand ({message}); are the CLI and agent the same version?")]
    Decode { url: String, message: String },
}

fn status_hint(status: u16) -> &'static str {
    match status {
        401 => " (check the token: --token, RINGSIDE_TOKEN or <state_dir>/operator.token)",
        403 => " (this token may not read that; the operator token reads everything)",
        _ => "",
    }
}

/// The operator token: `explicit` (`--token` / `RINGSIDE_TOKEN`, already merged by clap), else the
/// first token line of `<state_dir>/operator.token`.
pub fn resolve_token(explicit: Option<&str>, state_dir: &Path) -> Result<String, ClientError> {
    if let Some(t) = explicit.map(str::trim).filter(|t| !t.is_empty()) {
        return Ok(t.to_owned());
    }
    let path = state_dir.join(crate::auth::OPERATOR_TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .ok_or(ClientError::NoToken { path }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ClientError::NoToken { path }),
        Err(source) => Err(ClientError::TokenFile { path, source }),
    }
}

/// One `GET`, `POST` (JSON body) or `DELETE` to the agent: (status, body). Only transport problems
/// are errors; the caller judges the status.
pub fn request(agent: &str, token: Option<&str>, method: &str, path: &str, json_body: Option<&str>) -> Result<(u16, String), ClientError> {
    let url = format!("{}{path}", agent.trim_end_matches('/'));
    let http: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(5))).http_status_as_error(false).build().into();
    let auth = token.map(|t| format!("Bearer {t}"));
    let unreachable = |e: ureq::Error| ClientError::Unreachable { url: url.clone(), message: e.to_string() };
    let resp = match method {
        "POST" => {
            let mut r = http.post(&url).header("Content-Type", "application/json");
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.send(json_body.unwrap_or("{}")).map_err(unreachable)?
        }
        "DELETE" => {
            let mut r = http.delete(&url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call().map_err(unreachable)?
        }
        _ => {
            let mut r = http.get(&url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call().map_err(unreachable)?
        }
    };
    let status = resp.status().as_u16();
    let body = resp.into_body().read_to_string().map_err(unreachable)?;
    Ok((status, body))
}

/// A request whose success is `expect`: the body on success, else the agent's `{"error"}` as
/// [`ClientError::Status`].
pub fn call_expecting(agent: &str, token: Option<&str>, method: &str, path: &str, json_body: Option<&str>, expect: u16) -> Result<String, ClientError> {
    let (status, body) = request(agent, token, method, path, json_body)?;
    if status != expect {
        let url = format!("{}{path}", agent.trim_end_matches('/'));
        let message = serde_json::from_str::<ApiError>(&body).map(|e| e.error).unwrap_or(body);
        return Err(ClientError::Status { url, status, message });
    }
    Ok(body)
}

/// Renders `GET /v1/jobs`.
pub fn render_jobs(r: &crate::api::JobsResponse) -> String {
    let rows: Vec<Vec<String>> = r
        .jobs
        .iter()
        .map(|j| {
            let ports: Vec<String> = j.tcp_ports.iter().map(|p| format!("tcp/{p}")).chain(j.udp_ports.iter().map(|p| format!("udp/{p}"))).collect();
            vec![j.id.clone(), j.name.clone(), j.members.join(","), if ports.is_empty() { "any".into() } else { ports.join(",") }]
        })
        .collect();
    let mut out = table(&["ID", "NAME", "MEMBERS", "PORTS"], &rows);
    out.push_str(&format!("{} registered", r.jobs.len()));
    if !r.config_jobs.is_empty() {
        out.push_str(&format!("; from the config file: {}", r.config_jobs.join(", ")));
    }
    out.push('\n');
    out
}

/// GETs `path` from the agent (with `Authorization: Bearer token` if given) and decodes JSON.
pub fn get_json<T: DeserializeOwned>(agent: &str, token: Option<&str>, path: &str) -> Result<T, ClientError> {
    let url = format!("{}{path}", agent.trim_end_matches('/'));
    let agent_cfg = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build();
    let agent_http: ureq::Agent = agent_cfg.into();
    let mut req = agent_http.get(&url);
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let mut resp = req.call().map_err(|e| ClientError::Unreachable { url: url.clone(), message: e.to_string() })?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| ClientError::Unreachable { url: url.clone(), message: e.to_string() })?;
    if status >= 400 {
        let message = serde_json::from_str::<ApiError>(&body).map(|e| e.error).unwrap_or(body);
        return Err(ClientError::Status { url, status, message });
    }
    serde_json::from_str(&body).map_err(|e| ClientError::Decode { url, message: e.to_string() })
}

/// Renders rows as a table: columns padded to their widest cell, numbers right-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..header.len())
        .map(|i| !rows.is_empty() && rows.iter().all(|r| r.get(i).is_some_and(|c| c.parse::<f64>().is_ok() || c == "-")))
        .collect();
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| if numeric[i] { format!("{c:>w$}", w = widths[i]) } else { format!("{c:<w$}", w = widths[i]) })
            .collect();
        parts.join("  ").trim_end().to_owned()
    };
    let mut out = line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

/// Human-readable byte count (SI, as network rates are).
pub fn human_bytes(v: f64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = v;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0}{}", UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// The `ringside flows` table.
pub fn render_flows(r: &FlowsResponse) -> String {
    let rows: Vec<Vec<String>> = r
        .flows
        .iter()
        .map(|f| {
            let anomalies = match (&f.tcp, &f.roce) {
                (Some(t), _) => format!("retrans={}", t.retransmissions),
                (_, Some(x)) => format!("psn_gaps={} cnps={} naks={}", x.psn_gap_packets, x.cnps, x.naks),
                _ => String::new(),
            };
            vec![
                f.interface.clone(),
                f.direction.clone(),
                f.kind.clone(),
                format!("{}:{}", f.src_addr, f.src_port),
                format!("{}:{}", f.dst_addr, f.dst_port),
                f.packets.to_string(),
                f.bytes.to_string(),
                format!("{}/s", human_bytes(f.rates.ewma_bytes_per_second)),
                f.bursts.count.to_string(),
                if f.ce_marks > 0 { format!("ce={} {anomalies}", f.ce_marks) } else { anomalies },
            ]
        })
        .collect();
    let mut out = table(&["IFACE", "DIR", "KIND", "SOURCE", "DESTINATION", "PACKETS", "BYTES", "RATE(EWMA)", "BURSTS", "ANOMALIES"], &rows);
    out.push_str(&format!("{} of {} flows (top by bytes)\n", r.flows.len(), r.total_flows));
    out
}

fn scope_text(s: &Scope) -> String {
    match s {
        Scope::Peer { peer, link } => format!("peer {peer} via {link}"),
        Scope::Link { link } => format!("link {link}"),
        Scope::Job => "job".to_owned(),
    }
}

fn unix_ms_text(ms: u64) -> String {
    // UTC clock time is enough to line events up; the JSON carries the full timestamp.
    let secs = ms / 1000;
    format!("{:02}:{:02}:{:02}.{:03}Z", (secs / 3600) % 24, (secs / 60) % 60, secs % 60, ms % 1000)
}

fn evidence_text(e: &Event) -> String {
    use crate::detect::Metric;
    e.evidence
        .iter()
        .map(|x| {
            let (name, v, r) = match x.metric {
                Metric::InBurstGoodputBps => ("goodput", format!("{}/s", human_bytes(x.value)), format!("{}/s", human_bytes(x.reference))),
                Metric::LossRate => ("loss", format!("{:.2}%", x.value * 100.0), format!("{:.2}%", x.reference * 100.0)),
                Metric::SilenceNs => ("silence", format!("{:.0}ms", x.value / 1e6), format!("{:.0}ms", x.reference / 1e6)),
                Metric::CeRate => ("ce", format!("{:.2}%", x.value * 100.0), format!("{:.2}%", x.reference * 100.0)),
                Metric::CnpPerS => ("cnp", format!("{:.0}/s", x.value), format!("{:.0}/s", x.reference)),
                Metric::PhaseStartLatenessNs => ("late", format!("{:.0}ms", x.value / 1e6), format!("{:.0}ms", x.reference / 1e6)),
                Metric::LossyFlows => ("lossy-flows", format!("{:.0}", x.value), format!("{:.0}", x.reference)),
                Metric::OtherTrafficBps => ("other-traffic", format!("{}/s", human_bytes(x.value)), format!("{}/s", human_bytes(x.reference))),
            };
            format!("{name}={v} (ref {r})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `ringside events` table.
pub fn render_events(r: &EventsResponse) -> String {
    let rows: Vec<Vec<String>> = r
        .events
        .iter()
        .map(|e| {
            let state = match (e.state, e.carried_over, e.confirmed) {
                (EventState::Open, true, false) => "open (carried over)".to_owned(),
                (EventState::Open, _, _) => "open".to_owned(),
                (EventState::Closed, _, _) => {
                    format!("closed ({})", e.end_reason.map(|r| serde_json::to_value(r).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()).unwrap_or_default())
                }
            };
            let enum_text = |v: serde_json::Value| v.as_str().unwrap_or("-").to_owned();
            vec![
                e.id.to_string(),
                e.job.clone(),
                enum_text(serde_json::to_value(e.kind).unwrap_or_default()),
                scope_text(&e.scope),
                enum_text(serde_json::to_value(e.severity).unwrap_or_default()),
                e.classification.map_or("-".to_owned(), |c| enum_text(serde_json::to_value(c).unwrap_or_default())),
                state,
                unix_ms_text(e.started_unix_ms),
                e.ended_unix_ms.map_or("-".to_owned(), unix_ms_text),
                evidence_text(e),
            ]
        })
        .collect();
    let mut out = table(&["ID", "JOB", "KIND", "SCOPE", "SEVERITY", "CLASS", "STATE", "STARTED", "ENDED", "EVIDENCE"], &rows);
    out.push_str(&format!(
        "{} open, {} closed retained; {} shown ({}); {} detection windows; jobs: {}\n",
        r.open_count,
        r.closed_retained,
        r.events.len(),
        if r.state == "all" { "open and closed" } else { "open only, --all for closed" },
        r.windows,
        if r.jobs.is_empty() { "-".to_owned() } else { r.jobs.join(", ") },
    ));
    out
}

/// The `ringside status` report.
pub fn render_status(s: &StatusResponse) -> String {
    let mut out = String::new();
    match &s.not_ready_reason {
        None => out.push_str("agent: ready\n"),
        Some(r) => out.push_str(&format!("agent: NOT READY ({r})\n")),
    }
    let age = s.last_poll_age_seconds.map_or("never".to_owned(), |a| format!("{a:.2} s ago"));
    out.push_str(&format!(
        "polls: {} ({} errors), last {age}, every {:.0} ms\nflows tracked: {}\npin dir: {}\n\n",
        s.polls,
        s.poll_errors,
        s.poll_interval_seconds * 1000.0,
        s.flows_tracked,
        s.pin_dir.as_deref().unwrap_or("-"),
    ));
    let rows: Vec<Vec<String>> = s
        .interfaces
        .iter()
        .map(|i| vec![i.name.clone(), i.ifindex.to_string(), i.mode.clone(), if i.qdisc_added { "yes" } else { "no" }.to_owned()])
        .collect();
    out.push_str(&table(&["INTERFACE", "IFINDEX", "MODE", "QDISC ADDED"], &rows));
    out.push('\n');
    let rows: Vec<Vec<String>> = s.dataplane.iter().map(|(n, v)| vec![n.clone(), v.to_string()]).collect();
    out.push_str(&table(&["DATAPLANE", "PACKETS/EVENTS"], &rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{api, metrics::tests::sample_state};

    #[test]
    fn tables_align() {
        let t = table(&["A", "NUM"], &[vec!["long-name".into(), "5".into()], vec!["x".into(), "12345".into()]]);
        // Numeric columns, header included, are right-aligned.
        assert_eq!(t, "A            NUM\nlong-name      5\nx          12345\n");
    }

    #[test]
    fn renders_flows_and_status() {
        let state = sample_state();
        let s = state.read().unwrap();
        let now = s.table.last_poll_mono_ns();
        let flows = FlowsResponse {
            total_flows: 2,
            limit: 20,
            flows: s.table.top_by_bytes(20).into_iter().map(|e| api::FlowView::new(e, &s, now)).collect(),
        };
        let text = render_flows(&flows);
        assert!(text.contains("10.77.0.1:40000") && text.contains("psn_gaps=5 cnps=7") && text.contains("retrans=3"), "{text}");
        assert!(text.contains("2 of 2 flows"));
        let st = render_status(&api::status_of(&s));
        assert!(st.contains("agent: ready") && st.contains("eth0") && st.contains("matched"), "{st}");
    }

    #[test]
    fn renders_events() {
        let state = sample_state();
        let s = state.read().unwrap();
        let text = render_events(&api::events_of(&s, true, 10));
        assert!(text.contains("gray_failure") && text.contains("peer 10.77.0.3 via p1") && text.contains("critical"), "{text}");
        assert!(text.contains("loss=5.00%") && text.contains("1 open"), "{text}");
    }

    #[test]
    fn unreachable_agent_says_what_to_do() {
        // A port nothing listens on: bind, read the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}");
        let e = get_json::<StatusResponse>(&url, None, "/v1/status").unwrap_err().to_string();
        assert!(e.contains(&url) && e.contains("is the agent running") && e.contains("ringside agent --iface"), "{e}");
    }

    #[test]
    fn token_resolution_order_and_missing_token() {
        let dir = crate::events::tests::tempdir("client-token");
        let e = resolve_token(None, &dir).unwrap_err().to_string();
        assert!(e.contains("--token") && e.contains("RINGSIDE_TOKEN") && e.contains("operator.token"), "{e}");
        std::fs::write(dir.join(crate::auth::OPERATOR_TOKEN_FILE), "# generated\nrso_abc\n").unwrap();
        assert_eq!(resolve_token(None, &dir).unwrap(), "rso_abc");
        assert_eq!(resolve_token(Some(" rso_flag "), &dir).unwrap(), "rso_flag");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(999.0), "999B");
        assert_eq!(human_bytes(1_500_000.0), "1.5MB");
    }
}
