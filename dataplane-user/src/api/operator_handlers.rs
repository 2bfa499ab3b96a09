//! The operator's view: `/v1/flows`, `/v1/status`, `/v1/events` (operator token).
use axum::{
    extract::{rejection::QueryRejection, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use ringside_client::operator::FlowsResponse;
use serde::Deserialize;

use super::{error, views::{events_of, flow_view, status_of}};
use crate::{auth::Operator, collector::TOP_FLOWS, view::AgentView};

/// Default and maximum `limit` of `/v1/events`.
pub const DEFAULT_EVENTS_LIMIT: usize = 100;
pub const MAX_EVENTS_LIMIT: usize = 1000;

/// Default and maximum `limit` of `/v1/flows`.
pub const DEFAULT_FLOWS_LIMIT: usize = 20;
pub const MAX_FLOWS_LIMIT: usize = TOP_FLOWS;

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

pub(super) async fn flows(_: Operator, State(state): State<AgentView>, q: Result<Query<FlowsQuery>, QueryRejection>) -> Response {
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid query string: {e}")),
    };
    let limit = match parse_limit(q.limit.as_deref()) {
        Ok(l) => l,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    let t = state.fresh_top_flows().await;
    let resp = FlowsResponse {
        total_flows: t.flows_tracked,
        limit,
        flows: t.top_flows.iter().take(limit).map(|e| flow_view(e, &state.attach, t.last_poll_mono_ns)).collect(),
    };
    Json(resp).into_response()
}

#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    state: Option<String>,
    limit: Option<String>,
}

pub(super) async fn events(_: Operator, State(state): State<AgentView>, q: Result<Query<EventsQuery>, QueryRejection>) -> Response {
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
    let body = events_of(&state.events(), all, limit);
    Json(body).into_response()
}

pub(super) async fn status(_: Operator, State(state): State<AgentView>) -> Response {
    let body = status_of(&state);
    Json(body).into_response()
}

