//! Computers and their lifecycle: create, list, read, pause, resume, delete, stop, usage,
//! acquire and release. Lifecycle commands answer 202 with an execution receipt.

use axum::Json;
use axum::extract::Path;
use axum::extract::Query;
use axum::extract::State;
use axum::http::StatusCode;
use computerd_raft::sm::Caller;
use computerd_raft::sm::Command;
use computerd_raft::sm::Computer;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::Execution;
use computerd_raft::sm::ExecutionKind;
use computerd_raft::sm::ExecutionState;
use computerd_raft::sm::Source;
use computerd_raft::sm::Submit;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
#[allow(unused_imports)]
use super::schemas::ReceiptDoc;
use super::util::Body;
use super::util::check_id;
use super::util::check_name;
use super::util::propose;
use crate::ids::new_id;
use crate::ids::now_ms;

/// The longest `pauseAfter` (30 days), in seconds.
const MAX_PAUSE_AFTER: u64 = 30 * 24 * 3600;
/// How long a pairing code stays valid.
const PAIRING_VALID_MS: u64 = 10 * 60 * 1000;

/// A Computer as callers see it. `driverNode` is the node its lifecycle work is placed on
/// (absent while no node is recorded live); `linkNode` the node holding its agent link;
/// `idlePauseAt` when it pauses without more work (unix ms by the cluster's clock; null when it
/// is not running or never pauses by itself).
pub fn computer_view(s: &computerd_raft::sm::State, c: &Computer) -> Value {
    let mut v = json!({
        "id": c.id,
        "name": c.name,
        "state": c.state,
        "source": c.source,
        // The desktop: null without one; its display, size and state as its agent reported them
        // (`starting` until it has).
        "desktop": match &c.desktop_view {
            Some(d) => json!(d),
            None if c.desktop => json!({"display": null, "width": null, "height": null, "state": "starting"}),
            None => Value::Null,
        },
        "pauseAfter": c.pause_after,
        "shared": c.shared,
        "owner": c.owner,
        "sandboxId": c.sandbox,
        "activeExecution": c.active_execution,
        // An own machine that redeemed its pairing code (a sandbox's agent has a credential too,
        // but it is no paired machine).
        "paired": c.source == Source::Paired && c.agent_credential.is_some(),
        "linkGeneration": c.link_generation,
        "linkNode": c.link_node,
        "driverNode": s.placement(&c.id),
        "idlePauseAt": s.plan.get(&c.id).map(|e| e.deadline),
        // What a pause keeps at this Computer's provider: `memory` (files, memory and running
        // processes) or `files` (Daytona: processes end); null for an own machine.
        "pauseKeeps": match &c.source {
            Source::Provider { provider, .. } => s.providers.get(provider).map(|p| p.kind.pause_keeps()),
            Source::Paired => None,
        },
        "createdAt": c.created_at,
    });
    if c.state == ComputerState::Starting {
        v["starting"] = starting(s, c);
    }
    v
}

/// What a `starting` Computer waits for, since when, and where to look: its create at the
/// provider, or (the create done) its agent's first link.
fn starting(s: &computerd_raft::sm::State, c: &Computer) -> Value {
    let active = c.active_execution.as_deref().and_then(|id| s.executions.get(id));
    if let Some(e) = active {
        return json!({
            "since": e.created_at,
            "waitingFor": "provider",
            "executionId": e.id,
            "detail": format!("the provider's create is {}; GET /v1/executions/{} follows it", json!(e.state).as_str().unwrap_or("under way"), e.id),
        });
    }
    let created =
        s.executions_of(&c.id).filter(|e| e.kind == ExecutionKind::Create).filter_map(|e| e.finished_at).max();
    json!({
        "since": created.unwrap_or(c.created_at),
        "waitingFor": "agent",
        "detail": "the sandbox is created, and its agent has not linked yet: it dials the provider's serverUrl, \
                   which must reach a node of this cluster (GET …/sandbox asks the provider what it holds)",
    })
}

/// The receipt of an execution; the pairing code only for its requester, once it succeeded, and
/// only for an own machine (a sandbox's agent gets its code from the provider adapter).
pub fn receipt(s: &computerd_raft::sm::State, e: &Execution, caller: &Caller, now: u64) -> Value {
    let mut v = json!({
        "executionId": e.id,
        "commandKey": e.command_key,
        "kind": e.kind,
        "state": e.state,
        "resource": {"type": "computer", "id": e.computer_id},
        "createdAt": e.created_at,
        "finishedAt": e.finished_at,
        "error": e.error,
        "decision": e.decision,
        "approvalId": e.approval,
        "lateAnswer": e.late_answer,
        "driverNode": e.claim_node,
    });
    let mine = e.requester.token_id == caller.token.id
        || (e.requester.member_id == caller.member.id && e.requester.bot_id.is_none() && caller.bot.is_none());
    let paired = s.computers.get(&e.computer_id).is_some_and(|c| c.source == Source::Paired);
    if e.state == ExecutionState::Succeeded
        && mine
        && paired
        && let (Some(code), Some(exp)) = (&e.pairing_code, e.pairing_expires_at)
        && now < exp
    {
        v["pairingCode"] = code.clone().into();
        v["pairingExpiresAt"] = exp.into();
    }
    v
}

/// A lifecycle call's body that is missing or unreadable: the error names what it must carry.
fn key_body(r: axum::extract::rejection::JsonRejection) -> ApiError {
    use axum::extract::rejection::JsonRejection;
    match r {
        JsonRejection::MissingJsonContentType(_) | JsonRejection::JsonSyntaxError(_) => ApiError::invalid(
            "this call takes a JSON body {\"commandKey\": \"...\"}: a key of your own, 1 to 200 printable characters; the same key again answers the same receipt and does nothing twice",
        ),
        other => other.into(),
    }
}

fn check_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > 200 || key.chars().any(char::is_control) {
        return Err(ApiError::invalid("commandKey must be 1 to 200 printable characters"));
    }
    Ok(())
}

fn body_hash(v: &Value) -> String {
    hex::encode(sha2::Sha256::digest(v.to_string().as_bytes()))
}

/// `source` as the API takes it.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(tag = "_tag", deny_unknown_fields)]
pub enum SourceIn {
    Provider {
        provider: String,
        #[serde(default)]
        template: Option<String>,
    },
    Paired,
}

/// `POST /v1/computers` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewComputer {
    command_key: String,
    name: Option<String>,
    source: SourceIn,
    #[serde(default)]
    desktop: bool,
    /// Absent = 600; `null` = never.
    #[serde(default = "absent")]
    #[schema(value_type = Option<u64>)]
    pause_after: Value,
    #[serde(default)]
    shared: bool,
    /// Why (bots).
    reason: Option<String>,
}

fn absent() -> Value {
    json!("absent")
}

/// Submits an execution and answers 202 with its receipt (the existing one for a retry).
async fn submit(state: &AppState, caller: &Caller, submit: Submit) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = propose(state, Command::SubmitExecution(Box::new(submit)))
        .await?
        .ok_or_else(|| ApiError::new(computerd_proto::ErrorKind::Internal, "the store named no execution"))?;
    state.cluster.read_barrier().await?;
    let now = now_ms();
    let r = state.cluster.state().read(|s| s.executions.get(&id).map(|e| receipt(s, e, caller, now)));
    let r = r.ok_or_else(|| ApiError::not_found("no such execution"))?;
    Ok((StatusCode::ACCEPTED, Json(r)))
}

fn new_execution(key: &str, hash: String, kind: ExecutionKind, computer_id: &str, now: u64) -> Execution {
    Execution::pending(&new_id("exe"), key, &hash, kind, computer_id, now)
}

/// `POST /v1/computers`
#[utoipa::path(post, path = "/v1/computers", operation_id = "computers_create", tag = "computers", request_body = NewComputer, responses((status = 202, description = "Stored; the execution receipt", body = ReceiptDoc), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 422, description = "IdempotencyKeyReused", body = ErrorBody)), security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    auth: Auth,
    body: Body<NewComputer>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body?;
    check_key(&b.command_key)?;
    let pause_after = match &b.pause_after {
        Value::String(s) if s == "absent" => Some(600),
        Value::Null => None,
        Value::Number(n) => match n.as_u64() {
            Some(s) if (1..=MAX_PAUSE_AFTER).contains(&s) => Some(s),
            _ => return Err(ApiError::invalid(format!("pauseAfter must be 1..={MAX_PAUSE_AFTER} seconds, or null"))),
        },
        _ => return Err(ApiError::invalid("pauseAfter must be a number of seconds, or null")),
    };
    let source = match b.source {
        SourceIn::Provider { provider, template } => {
            check_id(&provider, "cpp", "source.provider")?;
            if let Some(t) = &template {
                check_name(t)
                    .map_err(|_| ApiError::invalid("source.template must be 1 to 200 printable characters"))?;
            }
            Source::Provider { provider, template }
        }
        SourceIn::Paired => Source::Paired,
    };
    let name = match &b.name {
        Some(n) => check_name(n)?,
        None => "computer".to_string(),
    };
    if let Some(r) = &b.reason
        && r.len() > 2000
    {
        return Err(ApiError::invalid("reason must be at most 2000 bytes"));
    }
    let normalized = json!({
        "kind": "create", "name": name, "source": source, "desktop": b.desktop,
        "pauseAfter": pause_after, "shared": b.shared, "reason": b.reason,
    });
    let now = now_ms();
    let computer = Computer {
        id: new_id("cmp"),
        name,
        owner: caller.member.id.clone(),
        shared: b.shared,
        desktop: b.desktop,
        pause_after: if source == Source::Paired { None } else { pause_after },
        source,
        state: ComputerState::Starting,
        sandbox: None,
        active_execution: None,
        created_at: now,
        agent_credential: None,
        link_generation: 0,
        link_node: None,
        desktop_view: None,
    };
    let mut exe = new_execution(&b.command_key, body_hash(&normalized), ExecutionKind::Create, &computer.id, now);
    // An own machine pairs with a code shown to its creator; a sandbox whose provider starts our
    // agent is given its code by the adapter at create. Every create carries one: the store drops
    // it for a provider that starts no agent (this node's state may lag a new provider's record).
    exe.pairing_code = Some(pairing_code());
    exe.pairing_expires_at = Some(now + PAIRING_VALID_MS);
    let s = Submit {
        by: caller.token.id.clone(),
        execution: exe,
        computer: Some(computer),
        approval_id: new_id("apr"),
        reason: b.reason,
        at_ms: now,
    };
    submit(&state, &caller, s).await
}

/// A one-time pairing code: 10 characters of an unambiguous alphabet, grouped for reading.
fn pairing_code() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let bytes: [u8; 10] = rand::random();
    let chars: String = bytes.iter().map(|b| ALPHABET[(*b as usize) % ALPHABET.len()] as char).collect();
    format!("{}-{}", &chars[..5], &chars[5..])
}

/// `{"commandKey": …}` of pause, resume and delete.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyOnly {
    command_key: String,
}

async fn lifecycle(
    state: AppState,
    auth: Auth,
    id: String,
    kind: ExecutionKind,
    body: Body<KeyOnly>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body.map_err(key_body)?;
    check_key(&b.command_key)?;
    check_id(&id, "cmp", "computer id").map_err(|_| ApiError::not_found("no such computer"))?;
    let normalized = json!({"kind": kind, "computer": id});
    let now = now_ms();
    let exe = new_execution(&b.command_key, body_hash(&normalized), kind, &id, now);
    let s = Submit {
        by: caller.token.id.clone(),
        execution: exe,
        computer: None,
        approval_id: new_id("apr"),
        reason: None,
        at_ms: now,
    };
    submit(&state, &caller, s).await
}

/// A run's `afterRun: pause`: a pause of the Computer its runtime worked on, with the
/// runtime's own rights, keyed by the run (asked twice, it is the same execution). Answers the
/// receipt.
pub async fn pause_after_run(state: &AppState, caller: &Caller, id: &str, run_id: &str) -> Result<Value, ApiError> {
    check_id(id, "cmp", "computerId").map_err(|_| ApiError::not_found("no such computer"))?;
    let now = now_ms();
    let normalized = json!({"kind": ExecutionKind::Pause, "computer": id});
    let key = format!("after-run:{run_id}");
    let s = Submit {
        by: caller.token.id.clone(),
        execution: new_execution(&key, body_hash(&normalized), ExecutionKind::Pause, id, now),
        computer: None,
        approval_id: new_id("apr"),
        reason: Some(format!("run {run_id} ended; its afterRun is pause")),
        at_ms: now,
    };
    Ok(submit(state, caller, s).await?.1.0)
}

/// How long a call waits for the resume of a paused Computer it needs.
const AUTO_RESUME_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A call on a paused Computer resumes it first, through a stored execution with the caller's
/// own rights (SPEC §1, §4); a resume already running (another caller's) is waited for instead.
/// Answers once the execution succeeded; its failure or unknown outcome is the call's error.
pub async fn resume_for_call(state: &AppState, caller: &Caller, id: &str) -> Result<(), ApiError> {
    let now = now_ms();
    let normalized = json!({"kind": ExecutionKind::Resume, "computer": id});
    let key = format!("auto-resume:{}", new_id("key"));
    let s = Submit {
        by: caller.token.id.clone(),
        execution: new_execution(&key, body_hash(&normalized), ExecutionKind::Resume, id, now),
        computer: None,
        approval_id: new_id("apr"),
        reason: Some("a call needs the paused computer".into()),
        at_ms: now,
    };
    let exe_id = match propose(state, Command::SubmitExecution(Box::new(s))).await {
        Ok(Some(exe)) => exe,
        Ok(None) => return Err(ApiError::new(computerd_proto::ErrorKind::Internal, "the store named no execution")),
        Err(e) if e.kind == computerd_proto::ErrorKind::ComputerConflict && e.execution_id.is_some() => {
            e.execution_id.unwrap_or_default()
        }
        Err(e) => return Err(e),
    };
    tracing::info!(computer_id = %id, execution_id = %exe_id, "resuming a paused computer for a call");
    let mut applied = state.cluster.state().subscribe();
    let deadline = tokio::time::Instant::now() + AUTO_RESUME_WAIT;
    loop {
        let seen = state.cluster.state().read(|s| s.executions.get(&exe_id).map(|e| (e.state, e.error.clone())));
        match seen {
            Some((ExecutionState::Succeeded, _)) => return Ok(()),
            Some((ExecutionState::Failed | ExecutionState::OutcomeUnknown, err)) => {
                let why = err.map(|e| e.message).unwrap_or_default();
                let mut e = ApiError::new(
                    computerd_proto::ErrorKind::ComputerExecutionFailed,
                    format!("the computer is paused and resuming it did not succeed: {why}"),
                );
                e.execution_id = Some(exe_id);
                return Err(e);
            }
            _ => {}
        }
        if tokio::time::timeout_at(deadline, applied.changed()).await.is_err() {
            let mut e = ApiError::new(computerd_proto::ErrorKind::Unavailable, "the computer is still resuming");
            e.execution_id = Some(exe_id);
            return Err(e);
        }
    }
}

/// `POST /v1/computers/:id/pause`
#[utoipa::path(post, path = "/v1/computers/{id}/pause", operation_id = "computers_pause", tag = "computers", params(("id" = String, Path)), request_body = KeyOnly, responses((status = 202, body = ReceiptDoc), (status = 409, description = "ComputerConflict (names the running execution)", body = ErrorBody), (status = 422, description = "ComputerUnsupported or IdempotencyKeyReused", body = ErrorBody)), security(("bearer" = [])))]
pub async fn pause(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<KeyOnly>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    lifecycle(state, auth, id, ExecutionKind::Pause, body).await
}

/// `POST /v1/computers/:id/resume`
#[utoipa::path(post, path = "/v1/computers/{id}/resume", operation_id = "computers_resume", tag = "computers", params(("id" = String, Path)), request_body = KeyOnly, responses((status = 202, body = ReceiptDoc), (status = 409, body = ErrorBody)), security(("bearer" = [])))]
pub async fn resume(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<KeyOnly>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    lifecycle(state, auth, id, ExecutionKind::Resume, body).await
}

/// `DELETE /v1/computers/:id`
#[utoipa::path(delete, path = "/v1/computers/{id}", operation_id = "computers_delete", tag = "computers", params(("id" = String, Path)), request_body = KeyOnly, responses((status = 202, body = ReceiptDoc), (status = 409, body = ErrorBody)), security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<KeyOnly>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    lifecycle(state, auth, id, ExecutionKind::Delete, body).await
}

/// `GET /v1/computers`: only rows the caller may see are read.
#[utoipa::path(get, path = "/v1/computers", operation_id = "computers_list", tag = "computers", params(ListQuery), responses((status = 200, description = "`{\"computers\": [...], \"nextAfter\": id|null}`: only those the caller may see, a page at a time", body = Object), (status = 400, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let Query(q) = q.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = q.limit.unwrap_or(computerd_raft::sm::MAX_COMPUTER_LIST);
    if !(1..=computerd_raft::sm::MAX_COMPUTER_LIST).contains(&limit) {
        return Err(ApiError::invalid("limit must be 1..=1000"));
    }
    let (rows, next): (Vec<Value>, Option<String>) = state.cluster.state().read(|s| {
        let (rows, next) = s.computers_visible_to(&caller, q.after.as_deref(), limit);
        (rows.into_iter().map(|c| computer_view(s, c)).collect(), next)
    });
    Ok(Json(json!({ "computers": rows, "nextAfter": next })))
}

/// `GET /v1/computers` query: a page of at most `limit` (default and most: 1000) Computers in
/// id order, after the id `after` (an earlier page's `nextAfter`).
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// The most rows (1 to 1000, default 1000).
    limit: Option<usize>,
    /// The page after this id: the previous page's `nextAfter`.
    after: Option<String>,
}

/// `GET /v1/computers/:id`: 404 when the caller may not see it.
#[utoipa::path(get, path = "/v1/computers/{id}", operation_id = "computers_get", tag = "computers", params(("id" = String, Path)), responses((status = 200, body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let v = state.cluster.state().read(|s| s.visible_computer(&caller, &id).map(|c| computer_view(s, c)))?;
    Ok(Json(v))
}

/// `GET /v1/computers/:id/sandbox`: asks the provider what it holds for this Computer (found by
/// its labels, not by the stored reference), so a person can settle an unknown outcome, or see
/// that a sandbox vanished. Changes nothing.
#[utoipa::path(get, path = "/v1/computers/{id}/sandbox", operation_id = "computers_sandbox", tag = "computers", params(("id" = String, Path)), responses((status = 200, description = "`{\"found\", \"sandbox\", \"state\", \"recorded\"}`", body = Object), (status = 422, description = "An own machine has no sandbox", body = ErrorBody)), security(("bearer" = [])))]
pub async fn sandbox(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let (computer, provider) = state.cluster.state().read(|s| {
        let c = s.visible_computer(&caller, &id)?.clone();
        let p = match &c.source {
            Source::Provider { provider, .. } => s.providers.get(provider).cloned(),
            Source::Paired => None,
        };
        Ok::<_, computerd_raft::sm::Reject>((c, p))
    })?;
    let Some(provider) = provider else {
        return Err(ApiError::new(computerd_proto::ErrorKind::ComputerUnsupported, "an own machine has no sandbox"));
    };
    let (adapter, timeout) = state.providers.build(&provider);
    let found = tokio::time::timeout(timeout, adapter.inspect(&computer.id))
        .await
        .map_err(|_| ApiError::new(computerd_proto::ErrorKind::ComputerExecutionFailed, "the provider did not answer"))?
        .map_err(|e| ApiError::new(computerd_proto::ErrorKind::ComputerExecutionFailed, e.to_string()))?;
    Ok(Json(match found {
        Some(info) => {
            json!({"found": true, "sandbox": info.sandbox, "state": info.state, "recorded": computer.sandbox})
        }
        None => json!({"found": false, "recorded": computer.sandbox}),
    }))
}

/// `POST /v1/computers/:id/stop`: on a pause of unknown outcome, marks the Computer failed.
#[utoipa::path(post, path = "/v1/computers/{id}/stop", operation_id = "computers_stop", tag = "computers", params(("id" = String, Path)), responses((status = 200, description = "The Computer, now failed", body = Object), (status = 409, body = ErrorBody)), security(("bearer" = [])))]
pub async fn stop(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    propose(&state, Command::StopComputer { by: caller.token.id.clone(), computer_id: id.clone(), at_ms: now_ms() })
        .await?;
    state.cluster.read_barrier().await?;
    let v = state.cluster.state().read(|s| s.visible_computer(&caller, &id).map(|c| computer_view(s, c)))?;
    Ok(Json(v))
}

/// `GET /v1/computers/:id/usage`: run spans (also of a deleted Computer the caller could see):
/// the newest ones kept, and the older ones folded into totals (`folded`: how many, total ms).
#[utoipa::path(get, path = "/v1/computers/{id}/usage", operation_id = "computers_usage", tag = "computers", params(("id" = String, Path)), responses((status = 200, description = "`{\"spans\": [{start, end, endedBy, outcomeUnknown}], \"folded\": {spans, ms}}`: the newest 1,000 spans, and the older ones as totals", body = Object)), security(("bearer" = [])))]
pub async fn usage(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let usage = state.cluster.state().read(|s| {
        let c = s.computers.get(&id).filter(|c| s.could_see(&caller, c));
        c.map(|_| (s.usage.get(&id).cloned().unwrap_or_default(), s.folded_usage(&id)))
    });
    let (spans, folded) = usage.ok_or_else(|| ApiError::not_found("no such computer"))?;
    Ok(Json(json!({ "computerId": id, "spans": spans, "folded": folded })))
}

/// `POST /v1/computers/:id/acquire` body.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireIn {
    reason: Option<String>,
}

/// `POST /v1/computers/:id/acquire` (bots): 200 when granted, 202 with an approval id when a
/// member must approve.
#[utoipa::path(post, path = "/v1/computers/{id}/acquire", operation_id = "computers_acquire", tag = "computers", params(("id" = String, Path)), request_body = AcquireIn, responses((status = 200, description = "Granted", body = Object), (status = 202, description = "Waits for an approval", body = Object)), security(("bearer" = [])))]
pub async fn acquire(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<AcquireIn>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body?;
    let cmd = Command::Acquire {
        by: caller.token.id.clone(),
        computer_id: id.clone(),
        approval_id: new_id("apr"),
        reason: b.reason,
        at_ms: now_ms(),
    };
    match propose(&state, cmd).await? {
        None => Ok((StatusCode::OK, Json(json!({"computerId": id, "granted": true})))),
        Some(approval) => Ok((
            StatusCode::ACCEPTED,
            Json(json!({"computerId": id, "granted": false, "approvalId": approval, "state": "pending"})),
        )),
    }
}

/// `POST /v1/computers/:id/release` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseIn {
    #[serde(default)]
    destroy: bool,
    command_key: Option<String>,
}

/// `POST /v1/computers/:id/release` (bots): gives up the right; with `destroy`, deletes the
/// Computer instead (capability `computers.delete`; the grant ends with the Computer).
#[utoipa::path(post, path = "/v1/computers/{id}/release", operation_id = "computers_release", tag = "computers", params(("id" = String, Path)), request_body = ReleaseIn, responses((status = 200, body = Object), (status = 202, description = "destroy: the delete receipt", body = ReceiptDoc)), security(("bearer" = [])))]
pub async fn release(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<ReleaseIn>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body?;
    let Some(bot) = caller.bot.clone() else {
        return Err(ApiError::invalid("only bots release; members revoke with DELETE .../bots/:botId"));
    };
    if b.destroy {
        let key = b.command_key.ok_or_else(|| ApiError::invalid("destroy needs a commandKey"))?;
        return lifecycle(state, auth, id, ExecutionKind::Delete, Ok(Json(KeyOnly { command_key: key }))).await;
    }
    let closing = super::tool_drain::open_bindings(&state, &bot.id, Some(&id)).await?;
    propose(&state, Command::DeleteGrant { by: caller.token.id.clone(), computer_id: id.clone(), bot_id: bot.id })
        .await?;
    super::tool_drain::drain_closed(&state, &caller.token.id, closing);
    Ok((StatusCode::OK, Json(json!({"computerId": id, "released": true}))))
}
