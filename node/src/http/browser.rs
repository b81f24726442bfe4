//! The browser of a Computer: `…/browser/sessions` (open, list, close) and one route per tool
//! (`…/browser/navigate`, `snapshot`, `click`, `hover`, `type`, `press`, `select`, `upload`,
//! `screenshot`, `session_status`, `dialog`), served by the agent over CDP (`computer_agent::browser`),
//! on the node holding the Computer's link like session and file calls; and the action records,
//! `GET …/browser/actions/:actionId` and `POST …/browser/actions/:actionId/decision`.
//!
//! **Action records.** A `click`, `type`, `press`, `select`, `upload` or `dialog` carrying an `actionId`
//! is recorded in the store (`computerd_raft::sm::actions`): `prepared`, then `dispatching`
//! (written before the call leaves), then `done`, `failed` or `unknown`. The same id answers the
//! record and is never sent again, whatever became of the first attempt: a timeout never turns
//! into a second click. The node's checks (rights, the Computer's state and link) run before
//! the dispatch mark: a refusal there leaves the record `failed`, "not sent". A refusal that the
//! agent makes before anything reaches the page (a stale ref, the input lease, a bad path)
//! returns the record to `prepared`, so the caller may try again with a fresh ref. An action of
//! a run names the run's claim (`runClaim`), and is refused `LeaseLost` once that claim no
//! longer holds the run's lease. A `dispatching` record whose call's deadline and margin passed
//! by the cluster's clock is read as `unknown`.
//!
//! **Uploads** record an artifact per file set on the page (its length and SHA-256, as the agent
//! counted and hashed it), named in the answer (`files[].artifact`) and so in the record.

use std::time::Duration;

use axum::Json;
use axum::extract::Path;
use axum::extract::Query;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;
use computerd_proto::agent::DesktopCall;
use computerd_proto::browser::BrowserOp;
use computerd_proto::browser::DialogRequest;
use computerd_proto::browser::FillSecretRequest;
use computerd_proto::browser::NavigateRequest;
use computerd_proto::browser::OpenRequest;
use computerd_proto::browser::PressRequest;
use computerd_proto::browser::RefRequest;
use computerd_proto::browser::SecretFill;
use computerd_proto::browser::SecretText;
use computerd_proto::browser::SelectRequest;
use computerd_proto::browser::ShotRequest;
use computerd_proto::browser::SnapshotRequest;
use computerd_proto::browser::StatusRequest;
use computerd_proto::browser::TabRequest;
use computerd_proto::browser::TypeRequest;
use computerd_proto::browser::UploadRequest;
use computerd_raft::sm::ActionState;
use computerd_raft::sm::BrowserAction;
use computerd_raft::sm::Caller;
use computerd_raft::sm::Command;
use computerd_raft::sm::action_key;
use computerd_raft::sm::action_state_name;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::calls::agent_for;
use super::desktop::actor_of;
use super::desktop::check_has_desktop;
use super::desktop::wants_bytes;
use super::desktop::with_image;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::Body;
use super::util::propose;
use crate::ids::now_ms;
use crate::owner::CallError;

/// A browser tool's whole deadline (its routes' bound): an action's record lapses to
/// `unknown` only once this and the store's margin have passed by the cluster's clock.
const CALL_DEADLINE: Duration = computerd_proto::deadline::CallKind::Tool.deadline();

/// Kinds the agent answers before anything reaches the page: the record goes back to
/// `prepared`. Anything else after the dispatch mark (a lost link, a deadline, a browser that
/// stopped mid-call) leaves the outcome unknown.
fn refused_before_sending(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::StaleRef
            | ErrorKind::InputBusy
            | ErrorKind::InvalidRequest
            | ErrorKind::NotFound
            | ErrorKind::ComputerUnsupported
            | ErrorKind::TooLarge
            | ErrorKind::Conflict
    )
}

/// Sends `op` to the agent; answers its JSON and image.
async fn send(
    state: &AppState,
    caller: &Caller,
    id: &str,
    op: &BrowserOp,
    write: bool,
) -> Result<(Value, Vec<u8>), ApiError> {
    let agent = agent_for(state, caller, id, write).await?;
    send_to(agent, caller, op).await
}

/// Sends `op` to an agent the node's checks already let the caller reach.
async fn send_to(
    mut agent: computerd_actors::link::Agent,
    caller: &Caller,
    op: &BrowserOp,
) -> Result<(Value, Vec<u8>), ApiError> {
    let json = serde_json::to_string(op).map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    let reply = agent
        .browser(DesktopCall { json, caller: actor_of(caller) })
        .await
        .map_err(|s| ApiError::from(CallError::from_status(s)))?
        .into_inner();
    let value: Value = serde_json::from_str(&reply.json)
        .map_err(|_| ApiError::new(ErrorKind::ComputerExecutionFailed, "the agent's browser answer is not JSON"))?;
    Ok((value, reply.image))
}

/// `POST …/browser/evidence` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EvidenceIn {
    /// The browser session.
    session: String,
    /// The tab (default: the session's first).
    #[serde(default)]
    tab: Option<String>,
    /// The whole page, not only the viewport.
    #[serde(default)]
    full_page: bool,
    /// The action record it proves (the caller's, on this Computer).
    #[serde(default)]
    action_id: Option<String>,
}

/// `POST /v1/computers/:id/browser/evidence`
#[utoipa::path(post, path = "/v1/computers/{id}/browser/evidence", operation_id = "browser_evidence", tag = "browser", params(("id" = String, Path)), request_body = EvidenceIn, responses((status = 200, description = "`{\"blobId\", \"sha256\", \"size\", \"width\", \"height\", \"action\"?}`: a PNG screenshot saved as the caller's blob, linked from the action record when named", body = Object), (status = 404, description = "no such session, tab or action", body = ErrorBody), (status = 422, description = "`ComputerUnsupported`: no browser", body = ErrorBody)), security(("bearer" = [])))]
pub async fn evidence(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<EvidenceIn>,
) -> Result<Json<Value>, ApiError> {
    let Json(req) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    // The rights at a current read, as for every call that acts on a Computer: a grant or token
    // revoked on the leader is refused here even while this replica lags.
    let caller = auth.current(&state).await?;
    let key = match &req.action_id {
        Some(action) => {
            let key = action_key(&id, &caller.member.id, caller.bot.as_ref().map(|b| b.id.as_str()), action);
            if record(&state, &key).is_none() {
                return Err(ApiError::new(ErrorKind::NotFound, "no such action"));
            }
            Some(key)
        }
        None => None,
    };
    let shot: ShotRequest = serde_json::from_value(json!({
        "session": req.session, "tab": req.tab, "fullPage": req.full_page, "format": "png",
    }))
    .map_err(|e| ApiError::invalid(e.to_string()))?;
    let (meta, image) = tool(&state, auth, &id, BrowserOp::Screenshot(shot)).await?;
    if image.is_empty() {
        return Err(ApiError::new(ErrorKind::Internal, "the agent answered no image"));
    }
    let name = format!("evidence-{}.png", now_ms());
    let blob = super::blobs::store_bytes(&state, &caller, &name, "image/png", image).await?;
    let mut action = Value::Null;
    if let Some(key) = key {
        let cmd = Command::ActionEvidence {
            by: caller.token.id.clone(),
            key: key.clone(),
            blob_id: blob.id.clone(),
            at_ms: now_ms(),
        };
        propose(&state, cmd).await?;
        action = record(&state, &key).map(|a| view(&a)).unwrap_or(Value::Null);
    }
    Ok(Json(json!({
        "blobId": blob.id,
        "sha256": blob.sha256,
        "size": blob.size,
        "width": meta["width"],
        "height": meta["height"],
        "action": action,
    })))
}

/// A record as the API shows it.
fn view(a: &BrowserAction) -> Value {
    json!({
        "actionId": a.action_id,
        "computerId": a.computer_id,
        "tool": a.tool,
        "state": action_state_name(a.state),
        "runId": a.run_id,
        "intent": a.intent,
        "evidence": a.evidence,
        "request": a.request,
        "result": a.result,
        "error": a.error,
        "by": {"memberId": a.member_id, "botId": a.bot_id},
        "createdAt": a.created_at,
        "dispatchedAt": a.dispatched_at,
        "settledAt": a.settled_at,
        "decidedBy": a.decided_by,
        "evidenceBlobs": a.evidence_blobs,
    })
}

fn record(state: &AppState, key: &str) -> Option<BrowserAction> {
    state.cluster.state().read(|s| s.browser_actions.get(key).cloned())
}

/// Serves one tool: through an action record when it carries an `actionId`.
async fn tool(state: &AppState, auth: Auth, id: &str, op: BrowserOp) -> Result<(Value, Vec<u8>), ApiError> {
    op.check().map_err(ApiError::invalid)?;
    let write = !matches!(
        op,
        BrowserOp::Snapshot(_) | BrowserOp::Screenshot(_) | BrowserOp::List | BrowserOp::SessionStatus(_)
    );
    // The rights at a current read, for every tool: a replica that lags behind a revocation
    // does not let it through.
    let caller = auth.current(state).await?;
    check_has_desktop(state, &caller, id)?;
    // A fill_secret goes out with its secret opened here, the node that holds the link; the
    // record keeps the request as the caller sent it (the secret's name only).
    let (opened, used) = open_secret(state, &caller, id, &op).await?.unzip();
    let sent_op = opened.as_ref().unwrap_or(&op);
    let meta = op.action().filter(|m| m.action_id.is_some());
    let Some(meta) = meta else {
        let (mut json, image) = send(state, &caller, id, sent_op, write).await?;
        note_use(state, used).await;
        record_artifacts(state, &caller, id, &op, &mut json).await?;
        return Ok((json, image));
    };
    let action_id = meta.action_id.clone().unwrap_or_default();
    // Reach the agent first: a Computer that cannot be reached refuses before any record.
    agent_for(state, &caller, id, write).await?;
    let claim = crate::ids::new_id("clm");
    let mut request = serde_json::to_value(&op).map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    let mut request = request.get_mut("args").map(Value::take).unwrap_or(Value::Null);
    // Typed text may be a password: the record keeps its length, never the text.
    if let Some(text) = request.get_mut("text") {
        let n = text.as_str().map_or(0, |t| t.chars().count());
        *text = json!(format!("({n} characters, not kept)"));
    }
    let action = BrowserAction {
        action_id,
        computer_id: id.to_string(),
        member_id: caller.member.id.clone(),
        bot_id: caller.bot.as_ref().map(|b| b.id.clone()),
        tool: op.name().to_string(),
        request,
        run_id: meta.run_id.clone(),
        run_claim: meta.run_claim.clone(),
        intent: meta.intent.clone(),
        evidence: meta.evidence.clone(),
        state: ActionState::Prepared,
        claim: claim.clone(),
        created_at: now_ms(),
        dispatched_at: None,
        lapses_at: None,
        settled_at: None,
        result: None,
        error: None,
        decided_by: None,
        evidence_blobs: vec![],
    };
    let key = action.key();
    let prepared = propose(state, Command::ActionPrepare { by: caller.token.id.clone(), action }).await?;
    let replay = |state: &AppState| -> Result<(Value, Vec<u8>), ApiError> {
        let a = record(state, &key).ok_or_else(|| ApiError::new(ErrorKind::NotFound, "the action record is gone"))?;
        Ok((json!({"action": view(&a), "replayed": true}), Vec::new()))
    };
    if prepared.as_deref() != Some("new") {
        resolve_stale(state, &key).await;
        return replay(state);
    }
    // The node's checks (rights, a paused Computer's resume, the link) before the dispatch
    // mark: a refusal here sent nothing, and the record says so.
    let agent = match agent_for(state, &caller, id, write).await {
        Ok(agent) => agent,
        Err(mut e) => {
            let refuse = Command::ActionRefuse {
                key: key.clone(),
                claim: claim.clone(),
                error: e.message.clone(),
                at_ms: now_ms(),
            };
            let _ = propose(state, refuse).await;
            e.message =
                format!("{} (the action {} is failed, not sent)", e.message, meta.action_id.unwrap_or_default());
            return Err(e);
        }
    };
    let dispatch = Command::ActionDispatch {
        key: key.clone(),
        claim: claim.clone(),
        at_ms: now_ms(),
        deadline_ms: CALL_DEADLINE.as_millis() as u64,
    };
    if let Err(e) = propose(state, dispatch).await {
        // The run's lease is gone: nothing is sent, and the caller is told so.
        if e.kind == ErrorKind::LeaseLost {
            return Err(e);
        }
        // Another attempt took it between the two: answer the record, send nothing.
        return replay(state);
    }
    let sent = match send_to(agent, &caller, sent_op).await {
        Ok((mut json, image)) => match record_artifacts(state, &caller, id, &op, &mut json).await {
            Ok(()) => Ok((json, image)),
            // The page took the files: the action happened, whatever became of the records.
            Err(e) => {
                tracing::warn!(error = %e.message, "an upload's artifacts could not be recorded");
                Ok((json, image))
            }
        },
        Err(e) => Err(e),
    };
    let (finish, answer) = match sent {
        Ok((json, image)) => {
            let outcome = match json["outcome"]["state"].as_str() {
                Some("unknown") => ActionState::Unknown,
                Some("failed") => ActionState::Failed,
                _ => ActionState::Done,
            };
            let error = json["outcome"]["error"].as_str().map(String::from);
            ((outcome, Some(json.clone()), error), Ok((json, image)))
        }
        Err(e) if refused_before_sending(e.kind) => {
            // Nothing reached the page: the record goes back to prepared.
            let _ = propose(
                state,
                Command::ActionRelease { key: key.clone(), claim: claim.clone(), error: e.message.clone() },
            )
            .await;
            return Err(e);
        }
        Err(e) => ((ActionState::Unknown, None, Some(e.message.clone())), Err(e)),
    };
    if answer.is_ok() {
        note_use(state, used).await;
    }
    let (outcome, result, error) = finish;
    let finished = Command::ActionFinish { key: key.clone(), claim, state: outcome, result, error, at_ms: now_ms() };
    if let Err(e) = propose(state, finished).await {
        tracing::warn!(error = %e.message, "an action's outcome could not be recorded; it stays dispatching until it is read");
    }
    let a = record(state, &key);
    match answer {
        Ok((mut json, image)) => {
            json["action"] = a.as_ref().map(view).unwrap_or(Value::Null);
            Ok((json, image))
        }
        Err(mut e) => {
            e.message = format!(
                "{} (the action {} is {})",
                e.message,
                meta.action_id.unwrap_or_default(),
                a.map(|a| action_state_name(a.state)).unwrap_or("unknown")
            );
            Err(e)
        }
    }
}

/// A secret a fill used: (vault's member, name).
type UsedSecret = (String, String);

/// For a `fill_secret`: the op with its secret opened (the one-time code for a TOTP seed),
/// after the caller's right to it is checked on this node's current state, and the secret
/// (vault, name) to note as used. `None` for any other tool.
async fn open_secret(
    state: &AppState,
    caller: &Caller,
    id: &str,
    op: &BrowserOp,
) -> Result<Option<(BrowserOp, UsedSecret)>, ApiError> {
    let BrowserOp::FillSecret(req) = op else { return Ok(None) };
    if req.fill.is_some() {
        return Err(ApiError::invalid("`fill` is the node's: name the secret with `secret`"));
    }
    let secret = state.cluster.state().read(|s| s.secret_for_fill(caller, id, &req.secret).cloned())?;
    let key = super::secrets::data_key(state).await?;
    let kind = secret.kind.as_str();
    let clear = key.open(&secret.owner, &secret.name, kind, &secret.sealed).map_err(|e| {
        ApiError::new(ErrorKind::Internal, format!("the secret {:?} could not be opened: {e}", secret.name))
    })?;
    let value = if secret.kind == computerd_raft::sm::SecretKind::Totp {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        SecretText::new(crate::vault::totp(clear.expose(), now).map_err(|e| ApiError::new(ErrorKind::Internal, e))?)
    } else {
        clear
    };
    let mut sent = req.clone();
    sent.fill = Some(SecretFill { kind: kind.to_string(), origins: secret.origins.clone(), value });
    Ok(Some((BrowserOp::FillSecret(sent), (secret.owner, secret.name))))
}

/// Notes a secret's use (its `lastUsedAt`); a failure is logged, the fill stands.
async fn note_use(state: &AppState, used: Option<UsedSecret>) {
    let Some((owner, name)) = used else { return };
    if let Err(e) = propose(state, Command::TouchSecret { owner, name, at_ms: now_ms() }).await {
        tracing::warn!(error = %e.message, "a secret's use could not be noted");
    }
}

/// A record left `dispatching` past its lapse time by the cluster's clock (its node died
/// mid-call, or its finish was lost) becomes `unknown`; the store checks the time again.
async fn resolve_stale(state: &AppState, key: &str) {
    let lapsed = state.cluster.state().read(|s| {
        s.browser_actions
            .get(key)
            .is_some_and(|a| a.state == ActionState::Dispatching && a.lapses_at.is_some_and(|t| s.clock >= t))
    });
    if lapsed {
        let _ = propose(state, Command::ActionLapse { key: key.to_string(), at_ms: now_ms() }).await;
    }
}

/// Records an artifact for each file an upload set on the page (its path, length and SHA-256
/// as the agent counted them) and names it in the answer's `files[].artifact`.
async fn record_artifacts(
    state: &AppState,
    caller: &Caller,
    id: &str,
    op: &BrowserOp,
    json: &mut Value,
) -> Result<(), ApiError> {
    if !matches!(op, BrowserOp::Upload(_)) {
        return Ok(());
    }
    let Some(files) = json.get_mut("files").and_then(Value::as_array_mut) else { return Ok(()) };
    for f in files.iter_mut() {
        let (Some(path), Some(size), Some(sha256)) = (f["path"].as_str(), f["size"].as_u64(), f["sha256"].as_str())
        else {
            continue;
        };
        let artifact = computerd_raft::sm::Artifact {
            id: crate::ids::new_id("art"),
            computer_id: id.to_string(),
            path: path.to_string(),
            size,
            sha256: sha256.to_string(),
            blob_id: String::new(),
            member_id: caller.member.id.clone(),
            bot_id: caller.bot.as_ref().map(|b| b.id.clone()),
            created_at: now_ms(),
        };
        propose(state, Command::ArtifactPut { by: caller.token.id.clone(), artifact: artifact.clone() }).await?;
        f["artifact"] = json!(artifact.id);
    }
    Ok(())
}

fn answer(headers: &HeaderMap, (json, image): (Value, Vec<u8>)) -> Response {
    if image.is_empty() {
        return Json(json).into_response();
    }
    if wants_bytes(headers) {
        let mime = json["mimeType"].as_str().unwrap_or("image/png").to_string();
        let dim = |k: &str| json[k].as_u64().unwrap_or(0).to_string();
        let (w, h) = (dim("width"), dim("height"));
        return (
            [
                (header::CONTENT_TYPE, mime),
                (header::HeaderName::from_static("x-width"), w),
                (header::HeaderName::from_static("x-height"), h),
            ],
            image,
        )
            .into_response();
    }
    Json(with_image(json, &image)).into_response()
}

/// `POST /v1/computers/:id/browser/sessions`
#[utoipa::path(post, path = "/v1/computers/{id}/browser/sessions", operation_id = "browser_open", tag = "browser", params(("id" = String, Path)), request_body(content = Object, description = "`{\"mode\"?: \"automation\"|\"takeover\", \"profile\"?: name, \"url\"?}`: a browser (headless, or headed on the desktop) with its profile"), responses((status = 200, description = "`{\"session\", \"mode\", \"profile\", \"tabs\": [{tab, url, title}]}`", body = Object), (status = 409, description = "`conflict`: the profile is in use, or 4 sessions are open", body = ErrorBody), (status = 422, description = "`ComputerUnsupported`: no browser", body = ErrorBody)), security(("bearer" = [])))]
pub async fn open(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<OpenRequest>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(Json(tool(&state, auth, &id, BrowserOp::Open(req)).await?.0).into_response())
}

/// `GET /v1/computers/:id/browser/sessions`
#[utoipa::path(get, path = "/v1/computers/{id}/browser/sessions", operation_id = "browser_sessions", tag = "browser", params(("id" = String, Path)), responses((status = 200, description = "`{\"sessions\": [{session, mode, profile, running, tabs}]}`", body = Object)), security(("bearer" = [])))]
pub async fn list(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(Json(tool(&state, auth, &id, BrowserOp::List).await?.0).into_response())
}

/// `DELETE /v1/computers/:id/browser/sessions/:session`
#[utoipa::path(delete, path = "/v1/computers/{id}/browser/sessions/{session}", operation_id = "browser_close", tag = "browser", params(("id" = String, Path), ("session" = String, Path)), responses((status = 200, description = "`{\"session\", \"closed\": true}`", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn close(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, session)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let op = BrowserOp::Close(TabRequest { session, tab: None });
    Ok(Json(tool(&state, auth, &id, op).await?.0).into_response())
}

macro_rules! tool_route {
    ($name:ident, $path:literal, $op_id:literal, $req:ty, $variant:ident, $desc:literal, $answer:literal) => {
        #[doc = concat!("`POST ", $path, "`")]
        #[utoipa::path(post, path = $path, operation_id = $op_id, tag = "browser", params(("id" = String, Path)), request_body(content = Object, description = $desc), responses((status = 200, description = $answer, body = Object), (status = 400, body = ErrorBody), (status = 404, description = "`not_found`: no such session or tab", body = ErrorBody), (status = 409, description = "`StaleRef`: take a new snapshot; `InputBusy`: a person holds the input lease; `LeaseLost`: the action's `runClaim` no longer holds its run's lease (nothing sent); `conflict`: a dialog is open on the tab (answer it with `dialog`; nothing sent)", body = ErrorBody), (status = 422, description = "`ComputerUnsupported`: no browser", body = ErrorBody)), security(("bearer" = [])))]
        pub async fn $name(State(state): State<AppState>, auth: Auth, Path(id): Path<String>, headers: HeaderMap, body: Body<$req>) -> Result<Response, ApiError> {
            let Json(req) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
            Ok(answer(&headers, tool(&state, auth, &id, BrowserOp::$variant(req)).await?))
        }
    };
}

tool_route!(
    fill_secret,
    "/v1/computers/{id}/browser/fill_secret",
    "browser_fill_secret",
    FillSecretRequest,
    FillSecret,
    "`{\"session\", \"tab\"?, \"ref\", \"secret\", \"submit\"?, \"timeoutMs\"?, \"actionId\"?, …}`: types a vault secret into a password or username field (`password`), a one-time-code field (`totp`: the current code) or a text field (`text`) of a page of one of the secret's origins. A bot needs its grant to name the secret; a member uses its own",
    "`{\"tab\", \"ref\", \"filled\": name, \"outcome\", \"action\"?}`: never the value; from then on the session's answers, snapshots and screenshots show it masked (`[secret \"name\"]`). 403 `forbidden`: the grant names no such secret, or the page is not on one of its origins; 400: not a field of the secret's kind; 503 `unavailable`: this node holds no data key (not a voter)"
);

/// `POST /v1/computers/:id/browser/navigate`
#[utoipa::path(post, path = "/v1/computers/{id}/browser/navigate", operation_id = "browser_navigate", tag = "browser", params(("id" = String, Path)), request_body(content = Object, description = "`{\"session\", \"tab\"?, \"url\", \"timeoutMs\"?}` (http, https, about:blank)"), responses((status = 200, description = "`{\"tab\", \"url\" (the final one), \"title\", \"status\", \"loaded\", \"redirected\", \"timedOut\", \"error\"?, \"dialog\"?, \"downloads\"?}`: a site's 4xx or 5xx is a load with its status; a load not ended within `timeoutMs` is `loaded: false, timedOut: true`; an answer that is a download (`Content-Disposition: attachment`) is no error: the page stays (`loaded: false`) and `downloads` lists it (as for `click`)", body = Object), (status = 400, body = ErrorBody), (status = 404, description = "`not_found`: no such session or tab", body = ErrorBody), (status = 409, description = "`conflict`: a dialog is open on the tab (answer it with `dialog`); `InputBusy`: a person holds the input lease", body = ErrorBody), (status = 422, description = "`ComputerUnsupported`: no browser", body = ErrorBody), (status = 502, description = "`navigation_failed`: no server answered (the name did not resolve, the connection was refused or timed out): the message names the net error and the host", body = ErrorBody)), security(("bearer" = [])))]
pub async fn navigate(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body<NavigateRequest>,
) -> Result<Response, ApiError> {
    let Json(req) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    Ok(answer(&headers, tool(&state, auth, &id, BrowserOp::Navigate(req)).await?))
}
tool_route!(
    snapshot,
    "/v1/computers/{id}/browser/snapshot",
    "browser_snapshot",
    SnapshotRequest,
    Snapshot,
    "`{\"session\", \"tab\"?, \"maxElements\"?, \"root\"?: ref, \"format\"?: \"text\"|\"json\"}`",
    "`{\"tab\", \"url\", \"title\", \"refs\", \"truncated\", \"text\", \"elements\"?, \"dialog\"?}`: each element's role, name, value, states and ref (`e12`), bound to this snapshot and document; while a dialog is open, only the dialog (`{type, message, defaultPrompt?}`)"
);
tool_route!(
    click,
    "/v1/computers/{id}/browser/click",
    "browser_click",
    RefRequest,
    Click,
    "`{\"session\", \"tab\"?, \"ref\", \"timeoutMs\"?, \"actionId\"?, \"runId\"?, \"runClaim\"?, \"intent\"?, \"evidence\"?}`",
    "`{\"tab\", \"ref\", \"point\", \"outcome\": {state: done|unknown, navigated, status?, error?}, \"dialog\"?, \"downloads\"?, \"action\"?}`, or `{\"action\", \"replayed\": true}` for an actionId already sent; a dialog the click opened ends the wait at once (`dialog`: `{type, message, defaultPrompt?}`); the downloads it started are waited for within `timeoutMs` and saved in `/workspace/Downloads` (`downloads`: `[{name, path, size, sha256} | {name, refused} | {name, failed} | {name, state: \"inProgress\", received, total}]`; a download over 256 MiB is cancelled and refused)"
);
tool_route!(
    hover,
    "/v1/computers/{id}/browser/hover",
    "browser_hover",
    RefRequest,
    Hover,
    "`{\"session\", \"tab\"?, \"ref\"}`",
    "`{\"tab\", \"ref\", \"point\"}`"
);
tool_route!(
    type_text,
    "/v1/computers/{id}/browser/type",
    "browser_type",
    TypeRequest,
    Type,
    "`{\"session\", \"tab\"?, \"ref\", \"text\", \"submit\"?, \"actionId\"?, …}`: replaces the field's text",
    "`{\"tab\", \"ref\", \"typed\", \"outcome\", \"action\"?}`"
);
tool_route!(
    press,
    "/v1/computers/{id}/browser/press",
    "browser_press",
    PressRequest,
    Press,
    "`{\"session\", \"tab\"?, \"keys\": \"Enter\"|\"ctrl+l\"|…, \"actionId\"?, \"runId\"?, \"runClaim\"?, \"intent\"?, \"evidence\"?}`",
    "`{\"tab\", \"keys\", \"outcome\", \"downloads\"?, \"action\"?}`: `downloads` as for `click`"
);
tool_route!(
    select,
    "/v1/computers/{id}/browser/select",
    "browser_select",
    SelectRequest,
    Select,
    "`{\"session\", \"tab\"?, \"ref\", \"values\": [value or label], \"actionId\"?, \"runId\"?, \"runClaim\"?, \"intent\"?, \"evidence\"?}`",
    "`{\"tab\", \"ref\", \"selected\", \"action\"?}`"
);
tool_route!(
    upload,
    "/v1/computers/{id}/browser/upload",
    "browser_upload",
    UploadRequest,
    Upload,
    "`{\"session\", \"tab\"?, \"ref\", \"paths\": [absolute, under /workspace], \"actionId\"?, …}`: regular, non-empty files of at most 16 MiB, checked and hashed by the agent before the browser sees them",
    "`{\"accepted\", \"readBack\": [{name, size}], \"files\": [{path, name, size, sha256, artifact}], \"action\"?}`"
);
tool_route!(
    screenshot,
    "/v1/computers/{id}/browser/screenshot",
    "browser_screenshot",
    ShotRequest,
    Screenshot,
    "`{\"session\", \"tab\"?, \"fullPage\"?, \"ref\"?, \"format\"?: \"png\"|\"jpeg\", \"quality\"?}`",
    "`{\"width\", \"height\", \"format\", \"mimeType\", \"size\", \"data\"}` (base64), or the image's bytes with `Accept: image/*`"
);
tool_route!(
    session_status,
    "/v1/computers/{id}/browser/session_status",
    "browser_session_status",
    StatusRequest,
    SessionStatus,
    "`{\"session\", \"origin\", \"probes\": {\"page\"?, \"signedInSelector\"?|\"signedInText\"?, \"account\"?, \"projectUrl\"?}}`",
    "`{\"signedIn\", \"accountMatches\", \"projectAccessible\", \"cookies\": n}` (cookie values are never read out)"
);

tool_route!(
    dialog,
    "/v1/computers/{id}/browser/dialog",
    "browser_dialog",
    DialogRequest,
    Dialog,
    "`{\"session\", \"tab\"?, \"accept\": bool, \"text\"? (a prompt's answer), \"timeoutMs\"?, \"actionId\"?, \"runId\"?, \"runClaim\"?, \"intent\"?, \"evidence\"?}`: answers the tab's open JavaScript dialog (alert, confirm, prompt, beforeunload)",
    "`{\"tab\", \"answered\": {type, message, defaultPrompt?}, \"accepted\", \"outcome\", \"dialog\"? (one opened after), \"action\"?}`; `not_found` when no dialog is open"
);

/// Whose action a member reads or decides (`?bot=` for one of their bots').
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Whose {
    bot: Option<String>,
}

fn key_for(caller: &Caller, id: &str, action_id: &str, whose: &Whose) -> String {
    match (&caller.bot, &whose.bot) {
        (Some(b), _) => action_key(id, &caller.member.id, Some(&b.id), action_id),
        (None, Some(bot)) => action_key(id, &caller.member.id, Some(bot), action_id),
        (None, None) => action_key(id, &caller.member.id, None, action_id),
    }
}

/// `GET /v1/computers/:id/browser/actions/:actionId`
#[utoipa::path(get, path = "/v1/computers/{id}/browser/actions/{action}", operation_id = "browser_action", tag = "browser", params(("id" = String, Path), ("action" = String, Path), ("bot" = Option<String>, Query, description = "a member reading one of their bots' actions")), responses((status = 200, description = "The record: `{\"actionId\", \"tool\", \"state\": prepared|dispatching|done|failed|unknown, \"intent\", \"evidence\", \"request\", \"result\", \"error\", …}`", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn action(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, action_id)): Path<(String, String)>,
    Query(whose): Query<Whose>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    state.cluster.state().read(|s| s.visible_computer(&caller, &id).map(|_| ()))?;
    let key = key_for(&caller, &id, &action_id, &whose);
    resolve_stale(&state, &key).await;
    let a = record(&state, &key).ok_or_else(|| ApiError::new(ErrorKind::NotFound, "no such action"))?;
    Ok(Json(view(&a)))
}

/// `POST …/actions/:actionId/decision` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionIn {
    /// `done` or `failed`.
    outcome: String,
    /// The bot whose action it is (a member deciding one of their bots').
    #[serde(default)]
    bot: Option<String>,
}

/// `POST /v1/computers/:id/browser/actions/:actionId/decision`
#[utoipa::path(post, path = "/v1/computers/{id}/browser/actions/{action}/decision", operation_id = "browser_action_decide", tag = "browser", params(("id" = String, Path), ("action" = String, Path)), request_body = DecisionIn, responses((status = 200, description = "The record, settled", body = Object), (status = 403, description = "a bot decides nothing", body = ErrorBody), (status = 409, description = "the action is not unknown (a dispatching one turns unknown once its call's deadline and 30 s have passed by the cluster's clock)", body = ErrorBody)), security(("bearer" = [])))]
pub async fn decide(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, action_id)): Path<(String, String)>,
    body: Body<DecisionIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(d) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let done = match d.outcome.as_str() {
        "done" => true,
        "failed" => false,
        _ => return Err(ApiError::invalid("outcome is \"done\" or \"failed\"")),
    };
    let key = key_for(&caller, &id, &action_id, &Whose { bot: d.bot });
    propose(&state, Command::ActionDecide { by: caller.token.id.clone(), key: key.clone(), done, at_ms: now_ms() })
        .await?;
    let a = record(&state, &key).ok_or_else(|| ApiError::new(ErrorKind::NotFound, "no such action"))?;
    Ok(Json(view(&a)))
}
