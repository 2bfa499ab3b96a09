//! Jobs and their hints: `POST`/`GET /v1/jobs` and `DELETE /v1/jobs/{id}` (operator; onboarding
//! and removal go through the [`JobCatalog`](crate::jobs::JobCatalog)), and each job's hints, hint
//! stream and metrics, and its report of the plan it runs (its tenant or the operator).
use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use axum::{
    extract::{rejection::JsonRejection, Path, State},
    http::{header, StatusCode},
    response::{
        sse::{Event as SseEvent, KeepAlive, Sse},
        IntoResponse, Response,
    },
    Json,
};
use ringside_client::{operator::JobsResponse, AppliedPlan, Hint, JobCreated, JobRegistration};

use super::{error, json_rejection, MAX_HINT_STREAMS, SSE_KEEP_ALIVE};
use crate::{
    auth::{JobAccess, Operator},
    jobs::RegisterError,
    metrics,
    policy::PlanChoice,
    view::AgentView,
};

pub(super) async fn create_job(_: Operator, State(state): State<AgentView>, body: Result<Json<JobRegistration>, JsonRejection>) -> Response {
    let reg = match body {
        Ok(Json(r)) => r,
        Err(rej) => return json_rejection(rej),
    };
    let now = crate::clock::unix_ms();
    // The catalog's lock is held across the (microsecond) bpf syscalls so that the catalog and
    // the kernel trie change together; registrations are rare, and no stage waits on it for more
    // than reading the job set.
    let onboarded = state.catalog().onboard(&reg, now, state.attach.live_pin_dir(), &state.hints);
    let (id, token) = match onboarded {
        Ok(r) => r,
        Err(e) => {
            let status = match &e {
                RegisterError::Invalid { .. } => StatusCode::BAD_REQUEST,
                RegisterError::NameTaken { .. } => StatusCode::CONFLICT,
                RegisterError::Full { .. } => StatusCode::TOO_MANY_REQUESTS,
                RegisterError::Randomness(_) => StatusCode::INTERNAL_SERVER_ERROR,
                RegisterError::Kernel(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            if status == StatusCode::INTERNAL_SERVER_ERROR {
                tracing::error!("{e}");
            }
            return error(status, e.to_string());
        }
    };
    tracing::info!(job = %id, name = %reg.name, members = reg.members.len(), "job registered");
    (StatusCode::CREATED, Json(JobCreated { id, name: reg.name, tenant_token: token })).into_response()
}

pub(super) async fn list_jobs(_: Operator, State(state): State<AgentView>) -> Response {
    let catalog = state.catalog();
    let jobs = catalog.views();
    let config_jobs = state.hints.jobs().into_iter().filter(|j| !catalog.contains(j)).collect();
    drop(catalog);
    Json(JobsResponse { jobs, config_jobs }).into_response()
}

pub(super) async fn delete_job(_: Operator, State(state): State<AgentView>, Path(id): Path<String>) -> Response {
    let removed = state.catalog().remove(&id, state.attach.live_pin_dir(), &state.hints);
    match removed {
        Ok(released) => {
            tracing::info!(job = %id, released_prefixes = released, "job unregistered");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => error(StatusCode::NOT_FOUND, e.to_string()),
    }
}

pub(super) async fn job_hints(access: JobAccess, State(state): State<AgentView>) -> Response {
    match state.hints.latest(&access.job_id) {
        Some(h) => Json(h).into_response(),
        None => error(StatusCode::NOT_FOUND, "no hint yet for this job: the policy has not planned it; retry after the next detection window"),
    }
}

/// `PUT /v1/jobs/{id}/plan`: the job's runtime says which plan its collectives run now. The policy
/// attributes each window to the plan that ran ([`crate::policy::PlanInForce`]); 204 on success.
pub(super) async fn put_job_plan(access: JobAccess, State(state): State<AgentView>, body: Result<Json<AppliedPlan>, JsonRejection>) -> Response {
    let plan = match body {
        Ok(Json(p)) => p,
        Err(rej) => return json_rejection(rej),
    };
    if let Err(e) = plan.validate() {
        return error(StatusCode::BAD_REQUEST, e);
    }
    let choice = PlanChoice::from_applied(&plan);
    match state.hints.report_applied(&access.job_id, choice, plan.step_time_ms, crate::clock::unix_ms()) {
        Ok(changed) => {
            if changed {
                tracing::info!(job = %access.job_id, plan = %choice.label(), step = plan.step, "the job reports a new plan in force");
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Err(_) => error(StatusCode::NOT_FOUND, "the job has no hint channel; it may have just been deleted"),
    }
}

pub(super) async fn job_metrics(access: JobAccess, State(state): State<AgentView>) -> Response {
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], metrics::render_job(&state.hints, &access.job_id)).into_response()
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

pub(super) async fn job_hints_stream(access: JobAccess, State(state): State<AgentView>) -> Response {
    let (rx, count) = (state.hints.subscribe(&access.job_id), state.hint_streams.clone());
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

