//! Turns and runs (SPEC §7): `POST /api/turn` starts one (idempotent on `clientTurnId`); a
//! bot's runtime claims runs with `POST /api/runs/claim` (a long poll, answering a lease it
//! renews with `POST …/lease`), posts `partial` and `activity` events and ends the run with
//! `POST …/finish`. `GET /api/runs/:id` reads the state; `GET /api/runs/:id/events` answers the
//! events as JSON or, with `Accept: text/event-stream`, as SSE that resumes after
//! `Last-Event-ID` (each event's id is its seq in the run, the same on every node). A member
//! cancels a run, or decides one that needs it. The records and their rules are in the store
//! (`computerd_raft::sm::runs`).

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::Path;
use axum::extract::Query;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::response::sse::Event as SseEvent;
use axum::response::sse::KeepAlive;
use axum::response::sse::Sse;
use computerd_proto::ErrorKind;
use computerd_raft::sm::AfterRun;
use computerd_raft::sm::Attachment;
use computerd_raft::sm::Caller;
use computerd_raft::sm::Command;
use computerd_raft::sm::DEFAULT_LEASE_MS;
use computerd_raft::sm::Run;
use computerd_raft::sm::RunEvent;
use computerd_raft::sm::RunState;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::Body;
use super::util::check_id;
use super::util::propose;
use crate::ids::new_id;
use crate::owner::forward::SERVED_BY;

/// The longest a claim waits for a run, ms.
const MAX_CLAIM_WAIT_MS: u64 = 25_000;

/// `POST /api/turn` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TurnIn {
    /// What the person asks.
    text: String,
    /// The caller's idempotency id: the same id answers the same run.
    client_turn_id: String,
    /// Files, uploaded first as blobs: `[{"name", "mimeType", "size", "blobId"}]`.
    #[serde(default)]
    #[schema(value_type = Vec<Object>)]
    attachments: Vec<Attachment>,
    /// The bot that works the run.
    bot_id: String,
    /// `keepWarm` (the default) or `pause`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    after_run: Option<AfterRun>,
}

/// `POST /api/runs/claim` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClaimIn {
    /// The bot whose runs to take (a bot's own token may leave it out).
    #[serde(default)]
    bot_id: Option<String>,
    /// How long to wait for a run, ms (at most 25,000; default 20,000).
    #[serde(default)]
    wait_ms: Option<u64>,
    /// The lease, ms (2,000 to 600,000; default 30,000).
    #[serde(default)]
    lease_ms: Option<u64>,
}

/// `POST /api/runs/:id/lease` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaseIn {
    /// The claim the run was taken with.
    claim: String,
    /// The lease from now, ms (default 30,000).
    #[serde(default)]
    lease_ms: Option<u64>,
}

/// `POST /api/runs/:id/events` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EventIn {
    /// The claim the run was taken with.
    claim: String,
    /// `partial` or `activity`.
    kind: String,
    /// The event's data (at most 64 KiB of JSON).
    #[schema(value_type = Object)]
    data: Value,
}

/// `POST /api/runs/:id/finish` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FinishIn {
    /// The claim the run was taken with.
    claim: String,
    /// `succeeded` or `failed`.
    outcome: String,
    /// The result (a succeeded run).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    result: Option<Value>,
    /// Why it failed.
    #[serde(default)]
    error: Option<String>,
    /// The Computer it worked on: with `afterRun: pause`, it is paused now (with the
    /// runtime's rights); with `keepWarm`, the idle plan decides.
    #[serde(default)]
    computer_id: Option<String>,
}

/// `POST /api/runs/:id/decision` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunDecisionIn {
    /// `requeue` (its undecided actions decided first) or `fail`.
    decision: String,
}

/// `GET /api/runs/:id/events` query.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// The last seq seen (as `Last-Event-ID`).
    after: Option<u64>,
}

/// A run as the API shows it (without its events).
pub fn view(r: &Run) -> Value {
    json!({
        "runId": r.id,
        "botId": r.bot_id,
        "memberId": r.member_id,
        "clientTurnId": r.client_turn_id,
        "text": r.text,
        "attachments": r.attachments,
        "afterRun": r.after_run,
        "state": r.state.name(),
        "attempts": r.attempts,
        "leaseExpiresAt": r.lease.as_ref().map(|l| l.expires_at),
        "createdAt": r.created_at,
        "updatedAt": r.updated_at,
        "finishedAt": r.finished_at,
        "result": r.result,
        "error": r.error,
        "undecidedActions": r.undecided_actions,
        "lastEventId": r.last_seq(),
    })
}

/// The run after a write: read once this node applied what the leader committed.
async fn visible_after_write(state: &AppState, caller: &Caller, id: &str) -> Result<Run, ApiError> {
    state.cluster.read_barrier().await?;
    visible(state, caller, id)
}

fn visible(state: &AppState, caller: &Caller, id: &str) -> Result<Run, ApiError> {
    state.cluster.state().read(|s| {
        s.runs
            .runs
            .get(id)
            .filter(|r| s.may_see_run(caller, r))
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, "no such run"))
    })
}

fn lease_ms(ms: Option<u64>) -> u64 {
    ms.unwrap_or(DEFAULT_LEASE_MS)
}

/// `POST /api/turn`
#[utoipa::path(post, path = "/api/turn", operation_id = "runs_turn", tag = "runs", request_body = TurnIn, responses((status = 201, description = "The new run (`state: queued`)", body = Object), (status = 200, description = "The run this `clientTurnId` already started", body = Object), (status = 404, description = "no such bot or blob", body = ErrorBody), (status = 422, description = "`IdempotencyKeyReused`: the id started another turn", body = ErrorBody)), security(("bearer" = [])))]
pub async fn turn(State(state): State<AppState>, auth: Auth, body: Body<TurnIn>) -> Result<Response, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(t) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    check_id(&t.bot_id, "bot", "botId")?;
    if t.client_turn_id.is_empty() || t.client_turn_id.len() > 200 || t.client_turn_id.chars().any(char::is_control) {
        return Err(ApiError::invalid("clientTurnId is 1 to 200 printable characters"));
    }
    for a in &t.attachments {
        check_id(&a.blob_id, "blb", "blobId")?;
        super::util::check_name(&a.name)?;
    }
    let run = Run {
        id: new_id("run"),
        member_id: caller.member.id.clone(),
        bot_id: t.bot_id,
        started_by_bot: caller.bot.is_some(),
        client_turn_id: t.client_turn_id,
        text: t.text,
        attachments: t.attachments,
        after_run: t.after_run.unwrap_or_default(),
        state: RunState::Queued,
        lease: None,
        attempts: 0,
        created_at: 0,
        updated_at: 0,
        finished_at: None,
        result: None,
        error: None,
        undecided_actions: vec![],
        events: vec![],
        event_bytes: 0,
    };
    let asked = run.id.clone();
    let id = propose(&state, Command::RunStart { by: caller.token.id.clone(), run }).await?.unwrap_or_default();
    let r = visible_after_write(&state, &caller, &id).await?;
    let status = if id == asked { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(view(&r))).into_response())
}

/// `GET /api/runs/:id`
#[utoipa::path(get, path = "/api/runs/{id}", operation_id = "runs_get", tag = "runs", params(("id" = String, Path)), responses((status = 200, description = "The run: `{\"runId\", \"state\", \"attempts\", \"result\", \"error\", \"undecidedActions\", \"lastEventId\", …}`", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    Ok(Json(view(&visible(&state, &caller, &id)?)))
}

/// `POST /api/runs/claim`
#[utoipa::path(post, path = "/api/runs/claim", operation_id = "runs_claim", tag = "runs", request_body = ClaimIn, responses((status = 200, description = "`{\"run\": {…}, \"claim\", \"leaseMs\"}`: the oldest queued run of the bot, now leased to the caller", body = Object), (status = 204, description = "No run came within `waitMs`"), (status = 403, description = "not this bot's runtime", body = ErrorBody)), security(("bearer" = [])))]
pub async fn claim(State(state): State<AppState>, auth: Auth, body: Body<ClaimIn>) -> Result<Response, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(c) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let bot_id = match (c.bot_id, &caller.bot) {
        (Some(b), _) => b,
        (None, Some(bot)) => bot.id.clone(),
        (None, None) => return Err(ApiError::invalid("a member's runtime names the botId")),
    };
    check_id(&bot_id, "bot", "botId")?;
    let wait = Duration::from_millis(c.wait_ms.unwrap_or(20_000).min(MAX_CLAIM_WAIT_MS));
    let lease = lease_ms(c.lease_ms);
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = state.cluster.state().subscribe();
    let mut first = true;
    loop {
        // Proposed when a run is queued (and once at first, so a wrong bot or lease is told at
        // once); otherwise the claim waits for the store to change.
        let queued = state.cluster.state().read(|s| s.runs.has_queued(&bot_id));
        if queued || first {
            first = false;
            let claim = new_id("clm");
            let cmd = Command::RunClaim {
                by: caller.token.id.clone(),
                bot_id: bot_id.clone(),
                claim: claim.clone(),
                lease_ms: lease,
            };
            if let Some(id) = propose(&state, cmd).await? {
                let r = visible_after_write(&state, &caller, &id).await?;
                return Ok(Json(json!({"run": view(&r), "claim": claim, "leaseMs": lease})).into_response());
            }
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(ApiError::new(ErrorKind::Unavailable, "the node is stopping")),
            Err(_) => return Ok(StatusCode::NO_CONTENT.into_response()),
        }
    }
}

/// `POST /api/runs/:id/lease`
#[utoipa::path(post, path = "/api/runs/{id}/lease", operation_id = "runs_lease", tag = "runs", params(("id" = String, Path)), request_body = LeaseIn, responses((status = 200, description = "`{\"leaseExpiresAt\"}`", body = Object), (status = 409, description = "the lease was lost (the run went back to the queue, needs a decision, or ended)", body = ErrorBody)), security(("bearer" = [])))]
pub async fn renew(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<LeaseIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(l) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let cmd = Command::RunRenew {
        by: caller.token.id.clone(),
        run_id: id.clone(),
        claim: l.claim,
        lease_ms: lease_ms(l.lease_ms),
    };
    propose(&state, cmd).await?;
    let r = visible_after_write(&state, &caller, &id).await?;
    Ok(Json(json!({"leaseExpiresAt": r.lease.map(|l| l.expires_at)})))
}

/// `POST /api/runs/:id/events`
#[utoipa::path(post, path = "/api/runs/{id}/events", operation_id = "runs_post_event", tag = "runs", params(("id" = String, Path)), request_body = EventIn, responses((status = 201, description = "`{\"seq\"}`", body = Object), (status = 409, description = "the lease was lost, or the run's events are full (coalesce partials)", body = ErrorBody)), security(("bearer" = [])))]
pub async fn post_event(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<EventIn>,
) -> Result<Response, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(e) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let cmd = Command::RunEvent { by: caller.token.id.clone(), run_id: id, claim: e.claim, kind: e.kind, data: e.data };
    let seq = propose(&state, cmd).await?.and_then(|s| s.parse::<u64>().ok());
    Ok((StatusCode::CREATED, Json(json!({"seq": seq}))).into_response())
}

/// `POST /api/runs/:id/finish`
#[utoipa::path(post, path = "/api/runs/{id}/finish", operation_id = "runs_finish", tag = "runs", params(("id" = String, Path)), request_body = FinishIn, responses((status = 200, description = "The ended run", body = Object), (status = 409, description = "the lease was lost, or the run ended already", body = ErrorBody)), security(("bearer" = [])))]
pub async fn finish(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<FinishIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(f) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let succeeded = match f.outcome.as_str() {
        "succeeded" => true,
        "failed" => false,
        _ => return Err(ApiError::invalid("outcome is succeeded or failed")),
    };
    let cmd = Command::RunFinish {
        by: caller.token.id.clone(),
        run_id: id.clone(),
        claim: f.claim,
        succeeded,
        result: f.result,
        error: f.error,
    };
    propose(&state, cmd).await?;
    let r = visible_after_write(&state, &caller, &id).await?;
    let mut out = view(&r);
    // The end of the task: the run ended whatever its Computer's pause answers, which is told.
    if let (AfterRun::Pause, Some(computer)) = (r.after_run, f.computer_id) {
        out["afterRun"] = match super::computers::pause_after_run(&state, &caller, &computer, &id).await {
            Ok(receipt) => json!({"pause": receipt}),
            Err(e) => json!({"pause": null, "error": {"kind": e.kind.as_str(), "message": e.message}}),
        };
    }
    Ok(Json(out))
}

/// `POST /api/runs/:id/cancel`
#[utoipa::path(post, path = "/api/runs/{id}/cancel", operation_id = "runs_cancel", tag = "runs", params(("id" = String, Path)), responses((status = 200, description = "The cancelled run", body = Object), (status = 409, description = "it ended already", body = ErrorBody)), security(("bearer" = [])))]
pub async fn cancel(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    propose(&state, Command::RunCancel { by: caller.token.id.clone(), run_id: id.clone() }).await?;
    Ok(Json(view(&visible_after_write(&state, &caller, &id).await?)))
}

/// `POST /api/runs/:id/decision`
#[utoipa::path(post, path = "/api/runs/{id}/decision", operation_id = "runs_decide", tag = "runs", params(("id" = String, Path)), request_body = RunDecisionIn, responses((status = 200, description = "The decided run", body = Object), (status = 409, description = "it does not need a decision, or its actions are undecided", body = ErrorBody)), security(("bearer" = [])))]
pub async fn decide(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<RunDecisionIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(d) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let requeue = match d.decision.as_str() {
        "requeue" => true,
        "fail" => false,
        _ => return Err(ApiError::invalid("decision is requeue or fail")),
    };
    propose(&state, Command::RunDecide { by: caller.token.id.clone(), run_id: id.clone(), requeue }).await?;
    Ok(Json(view(&visible_after_write(&state, &caller, &id).await?)))
}

fn sse_event(e: &RunEvent) -> SseEvent {
    let mut data = serde_json::Map::new();
    data.insert(e.kind.clone(), e.data.clone());
    data.insert("at".into(), e.at.into());
    SseEvent::default().id(e.seq.to_string()).event(e.kind.clone()).data(Value::Object(data).to_string())
}

/// `GET /api/runs/:id/events`
#[utoipa::path(get, path = "/api/runs/{id}/events", operation_id = "runs_events", tag = "runs", params(("id" = String, Path), EventsQuery, ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event")), responses((status = 200, description = "`{\"events\": [{\"seq\", \"kind\", \"data\", \"at\"}], \"state\"}`, or with `Accept: text/event-stream` SSE (`id: seq`, `event: partial`, `data: {\"partial\": …}`) that ends after the `final` event", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn events(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let caller = auth.current(&state).await?;
    let Query(q) = q.map_err(|e| ApiError::invalid(e.body_text()))?;
    let last = super::util::last_event_id(&headers, "an event's seq")?;
    let after = last.or(q.after).unwrap_or(0);
    let run = visible(&state, &caller, &id)?;
    let sse = headers.get("accept").and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/event-stream"));
    if !sse {
        let rows = run.events_after(after, usize::MAX);
        return Ok(Json(json!({"events": rows, "state": run.state.name()})).into_response());
    }
    drop(run);
    let node = state.cluster.id().to_string();
    let changes = state.cluster.state().subscribe();
    let queue = std::collections::VecDeque::<RunEvent>::new();
    let stream = futures::stream::unfold(
        (state, auth, id, changes, after, queue),
        |(state, auth, id, mut changes, cursor, mut queue)| async move {
            loop {
                if let Some(e) = queue.pop_front() {
                    let ev = sse_event(&e);
                    return Some((Ok::<_, Infallible>(ev), (state, auth, id, changes, e.seq, queue)));
                }
                // Rights are re-checked before each read: a revoked token, or a run gone by
                // retention, ends the stream; so does an ended run once its `final` was sent.
                let (rows, finished) = state.cluster.state().read(|s| {
                    let caller = s.caller_by_hash(auth.hash()).ok()?;
                    let r = s.runs.runs.get(&id).filter(|r| s.may_see_run(&caller, r))?;
                    Some((r.events_after(cursor, 100).to_vec(), r.state.finished()))
                })?;
                if rows.is_empty() {
                    if finished {
                        return None;
                    }
                    changes.changed().await.ok()?;
                    continue;
                }
                queue.extend(rows);
            }
        },
    );
    // The stream names the node serving it, so a client behind a load balancer can tell where
    // it is (and an operator which node to look at).
    Ok((
        [(axum::http::HeaderName::from_static(SERVED_BY), node)],
        Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))),
    )
        .into_response())
}
