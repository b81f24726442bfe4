//! MCP tool packages for a bot, on a Computer it may use (SPEC §6, seed 000):
//!
//! - `POST /api/bots/{botId}/tools/install` `{artifactPath, manifest, computerId?, operationId?}`:
//!   the binding is recorded first (admission `installing`), then the agent installs it inside
//!   the Computer (digest, strict unpack, its own UID/HOME) and discovers its tools; the answer
//!   is `{bindingId, tools}` or 422 `package_rejected` with the installer's `reason`. An install
//!   is made once: the same `operationId` (or, without one, the same package, version and
//!   digest) answers the live binding it made, and a binding still `installing` is asked of the
//!   agent again under its id; another body under that `operationId` is `IdempotencyKeyReused`.
//! - `GET /api/bots/{botId}/tools`: the bot's bindings.
//! - `POST …/tools/{bindingId}/discover`: reads the tool schemas again.
//! - `POST …/tools/{bindingId}/call` `{operationId, tool, arguments}`: journaled in the store before
//!   it is sent; the same id and payload answer the original result, another payload is refused,
//!   and a call whose answer was lost is reported unknown, never redone.
//! - `DELETE …/tools/{bindingId}`: revoke: admission closes in the store first, then the agent
//!   closes the binding and kills its processes; `drained: false` says the drain is unconfirmed.
//! - `POST …/tools/computer_mcp` `{"action": "list" | "discover" | "call", ...}`: the
//!   model-facing tool, over the same paths.
//!
//! Rights are the bot's on the Computer ([`computerd_raft::sm::State::check_tool_use`]: the
//! caller acts for the bot, its token allows the Computer and writes, it may operate the
//! Computer, the bot holds a grant there). They are checked on the node that took the call at
//! its replica's read (to refuse early), in the store at each commit, and for every agent
//! request at a current read on the node that serves it: the one holding the Computer's agent
//! link, here or where the request is relayed
//! ([`computerd_raft::sm::State::check_tool_request`]). A node whose replica lags still relays. Removing a grant (or archiving the
//! bot) closes the bot's bindings in the store in the same commit; [`super::tool_drain`] then
//! drains them on the agent.

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use computerd_proto::ErrorKind;
use computerd_proto::mcp::McpRequest;
use computerd_raft::sm::BindingState;
use computerd_raft::sm::Caller;
use computerd_raft::sm::Command;
use computerd_raft::sm::HeldResult;
use computerd_raft::sm::Operation;
use computerd_raft::sm::OperationState;
use computerd_raft::sm::ToolBinding;
use computerd_raft::sm::operation_key;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::calls::agent_for;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::tool_drain::drain;
use super::tool_drain::mark_drained;
use super::tool_drain::reply_of;
use super::util::Body;
use super::util::check_id;
use super::util::propose;
use crate::ids::new_id;
use crate::ids::now_ms;

/// `POST …/tools/install` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InstallIn {
    artifact_path: String,
    #[schema(value_type = Object)]
    manifest: Value,
    computer_id: Option<String>,
    #[serde(default)]
    reauthorize: bool,
    /// The caller's id of this install: a retry with it answers the same binding; another body
    /// under it is refused (`IdempotencyKeyReused`). Without it, an install of the same package,
    /// version and digest for the bot on the Computer answers the binding it has.
    #[serde(default)]
    operation_id: Option<String>,
}

/// `POST …/call` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CallIn {
    operation_id: String,
    tool: String,
    #[serde(default)]
    #[schema(value_type = Object)]
    arguments: serde_json::Map<String, Value>,
}

/// `POST …/switch` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SwitchIn {
    operation_id: String,
    version: String,
}

/// `POST …/computer_mcp` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelToolIn {
    action: String,
    binding_id: Option<String>,
    operation_id: Option<String>,
    tool: Option<String>,
    #[serde(default)]
    #[schema(value_type = Object)]
    arguments: serde_json::Map<String, Value>,
}

fn binding_view(b: &ToolBinding) -> Value {
    json!({
        "bindingId": b.id, "botId": b.bot_id, "computerId": b.computer_id, "packageId": b.package_id,
        "version": b.version, "sha256": b.sha256, "state": b.state, "tools": b.tools, "error": b.error,
        "sharedUid": b.shared_uid,
    })
}

/// The Computer a bot's package goes on: the one named, or the only one the bot may use.
fn computer_for(state: &AppState, caller: &Caller, bot_id: &str, named: Option<String>) -> Result<String, ApiError> {
    if let Some(id) = named {
        return Ok(id);
    }
    // The bot's grants, from their index (never a walk of every grant); two usable ones are
    // enough to answer.
    let usable: Vec<String> = state.cluster.state().read(|s| {
        s.granted_to(bot_id).filter(|c| s.check_tool_use(caller, bot_id, c).is_ok()).take(2).cloned().collect()
    });
    match usable.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(ApiError::invalid("the bot may use no computer: name one with computerId")),
        _ => Err(ApiError::invalid("the bot may use several computers: name one with computerId")),
    }
}

/// One MCP request to the agent of `computer`, wherever its link is: `Ok(result)` or the
/// agent's refusal (reason, message); a refusal of the request (rights, admission) or a failure
/// to reach the agent is the outer error ([`not_sent`] tells them apart).
async fn agent_mcp(
    state: &AppState,
    caller: &Caller,
    computer: &str,
    request: McpRequest,
) -> Result<Result<Value, (String, String)>, ApiError> {
    reply_of(agent_mcp_reply(state, caller, computer, request).await?)
}

/// The agent's whole answer to `request` on `computer` (both its result and its refusal:
/// a switch's refusal says in its result what was done), once rights and admission hold.
async fn agent_mcp_reply(
    state: &AppState,
    caller: &Caller,
    computer: &str,
    request: McpRequest,
) -> Result<computerd_proto::mcp::McpReply, ApiError> {
    // The rights and the binding's admission: here, at this replica's read (a refusal only
    // once a current read confirms it: this replica may not have applied the caller's own
    // last write yet); then at a current read on the node that serves the request: here when
    // the link is here (below), else on the node holding the link when the request is relayed
    // there. A node behind the leader still relays (it is not the one that decides).
    let check = |s: &computerd_raft::sm::State| s.check_tool_request(Some(caller), computer, &request);
    if state.cluster.state().read(check).is_err() {
        state.cluster.read_barrier().await?;
        state.cluster.state().read(check)?;
    }
    let local = async {
        state.cluster.read_barrier().await?;
        state.cluster.state().read(|s| s.check_tool_request(Some(caller), computer, &request))?;
        agent_for(state, caller, computer, true).await
    };
    state.owners.mcp(computer, &request, &caller.token.id, local).await
}

/// True for an error that says the request was refused before it reached the agent (rights,
/// admission), as opposed to one whose effect is unknown.
fn not_sent(e: &ApiError) -> bool {
    matches!(
        e.kind,
        ErrorKind::Forbidden
            | ErrorKind::NotFound
            | ErrorKind::Unauthorized
            | ErrorKind::Conflict
            | ErrorKind::InvalidRequest
    )
}

fn rejected(reason: String, message: String) -> ApiError {
    let mut e = ApiError::new(ErrorKind::PackageRejected, format!("{reason}: {message}"));
    e.reason = Some(reason);
    e
}

/// `POST /api/bots/{botId}/tools/install`
#[utoipa::path(post, path = "/api/bots/{bot}/tools/install", operation_id = "tools_install", tag = "tools", params(("bot" = String, Path)), request_body = InstallIn, responses((status = 201, description = "`{\"bindingId\", \"tools\", \"sharedUid\"}`", body = Object), (status = 422, body = ErrorBody), (status = 403, body = ErrorBody)), security(("bearer" = [])))]
pub async fn install(
    State(state): State<AppState>,
    auth: Auth,
    Path(bot_id): Path<String>,
    body: Body<InstallIn>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    // A current read: the Computer is chosen from the bot's grants, which may have been given
    // through another node a moment ago.
    let caller = auth.current(&state).await?;
    let Json(b) = body?;
    check_id(&bot_id, "bot", "botId").map_err(|_| ApiError::not_found("no such bot"))?;
    state.cluster.state().read(|s| s.tool_bot(&caller, &bot_id))?;
    let m = &b.manifest;
    let (Some(pkg), Some(version), Some(sha)) = (m["id"].as_str(), m["version"].as_str(), m["sha256"].as_str()) else {
        return Err(rejected("bad_manifest".into(), "the manifest needs id, version and sha256".into()));
    };
    if b.operation_id.as_ref().is_some_and(|o| o.is_empty() || o.len() > 200) {
        return Err(ApiError::invalid("operationId is 1 to 200 bytes"));
    }
    let computer = computer_for(&state, &caller, &bot_id, b.computer_id.clone())?;
    state.cluster.state().read(|s| s.check_tool_use(&caller, &bot_id, &computer))?;
    // What makes a retry the same install, and (under an operationId) what it asked for.
    let (install_key, request_hash) = match &b.operation_id {
        Some(op) => {
            let request = json!({
                "computerId": computer,
                "artifactPath": b.artifact_path,
                "manifest": b.manifest,
                "reauthorize": b.reauthorize,
            });
            (format!("op:{op}"), Some(hex::encode(sha2::Sha256::digest(request.to_string().as_bytes()))))
        }
        None => (format!("pkg:{pkg}\n{version}\n{sha}"), None),
    };
    // A revoked package comes back only through `reauthorize`, with the same version and digest,
    // as a new binding (new UID and state) once the old runtime is confirmed stopped; the old
    // binding id stays revoked for good.
    let revoked: Vec<ToolBinding> = state.cluster.state().read(|s| {
        s.bindings_of(&bot_id, &computer)
            .filter(|x| x.package_id == pkg && x.state == BindingState::Revoked)
            .cloned()
            .collect()
    });
    match (b.reauthorize, revoked.iter().find(|x| x.version == version && x.sha256 == sha)) {
        (false, _) if !revoked.is_empty() => {
            let mut e = ApiError::new(
                ErrorKind::Conflict,
                "this package was revoked for the bot: install it again with \"reauthorize\": true",
            );
            e.reason = Some("revoked".into());
            return Err(e);
        }
        (true, None) => {
            return Err(rejected(
                "nothing_to_reauthorize".into(),
                "reauthorize needs a revoked binding of the same package, version and digest".into(),
            ));
        }
        (true, Some(old)) => {
            // The old runtime must be confirmed stopped (draining again is harmless).
            let drained = drain(&state, &caller.token.id, &computer, std::slice::from_ref(&old.id)).await;
            if drained.is_empty() {
                let mut e = ApiError::new(ErrorKind::Conflict, "the old binding's processes are not confirmed stopped");
                e.reason = Some("drain_incomplete".into());
                return Err(e);
            }
        }
        (false, _) => {}
    }
    let binding = ToolBinding {
        id: new_id("mcb"),
        bot_id: bot_id.clone(),
        computer_id: computer.clone(),
        package_id: pkg.to_string(),
        version: version.to_string(),
        sha256: sha.to_string(),
        state: BindingState::Installing,
        tools: Value::Null,
        error: None,
        created_at: now_ms(),
        shared_uid: false,
        install_key: Some(install_key),
        request_hash,
    };
    let id = propose(&state, Command::BindingReserve { by: caller.token.id.clone(), binding: binding.clone() })
        .await?
        .unwrap_or(binding.id.clone());
    if id != binding.id {
        // The same install again: a ready binding is answered as it is; one still installing
        // (its first answer lost, or in flight) is asked of the agent again, which answers what
        // it has for that binding id.
        let seen = state.cluster.state().read(|s| s.tool_bindings.get(&id).cloned());
        if let Some(seen) = seen.filter(|x| x.state == BindingState::Ready) {
            let body = json!({"bindingId": id, "tools": seen.tools, "sharedUid": seen.shared_uid, "replayed": true});
            return Ok((StatusCode::OK, Json(body)));
        }
    }
    let request = McpRequest::Install {
        binding_id: id.clone(),
        bot_id: bot_id.clone(),
        artifact_path: b.artifact_path,
        manifest: b.manifest.clone(),
    };
    let answer = agent_mcp(&state, &caller, &computer, request).await;
    let (ready, tools, error) = match &answer {
        Ok(Ok(r)) => (true, r["tools"].clone(), None),
        Ok(Err((reason, message))) => (false, Value::Null, Some(json!({"reason": reason, "message": message}))),
        // Refused before the agent: the binding is no one's; it goes like a failed install.
        Err(e) if not_sent(e) => (false, Value::Null, Some(json!({"reason": "refused", "message": e.message}))),
        // Unknown: the binding stays `installing` (a revoke closes it).
        Err(_) => (false, Value::Null, None),
    };
    // Fail closed: anything but an explicit `false` from the agent is a shared UID.
    let shared_uid = matches!(&answer, Ok(Ok(r)) if r["sharedUid"] != false);
    if answer.as_ref().is_ok() || answer.as_ref().is_err_and(not_sent) {
        // A failed install leaves no binding (the store removes it; the agent undid its part).
        let settle = Command::BindingSettle { binding_id: id.clone(), ready, tools: tools.clone(), error, shared_uid };
        match propose(&state, settle).await {
            Ok(_) => {}
            Err(e) if ready => {
                // Closed while it installed (its grant removed, say): the agent's part is
                // drained and removed (the owner sends that only for a closed binding), and the
                // install is refused.
                drain(&state, &caller.token.id, &computer, std::slice::from_ref(&id)).await;
                return Err(e);
            }
            // A failed install on a binding closed meanwhile: the answer below says why.
            Err(_) => {}
        }
    }
    match answer {
        Ok(Ok(_)) => Ok((StatusCode::CREATED, Json(json!({"bindingId": id, "tools": tools, "sharedUid": shared_uid})))),
        Ok(Err((reason, message))) => Err(rejected(reason, message)),
        Err(e) => Err(e),
    }
}

/// `GET /api/bots/{botId}/tools`
#[utoipa::path(get, path = "/api/bots/{bot}/tools", operation_id = "tools_list", tag = "tools", params(("bot" = String, Path)), responses((status = 200, description = "`{\"bindings\": [...]}`", body = Object)), security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
    Path(bot_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let rows = state.cluster.state().read(|s| {
        s.tool_bot(&caller, &bot_id)?;
        Ok::<_, computerd_raft::sm::Reject>(
            listed(s, &caller, &bot_id)
                .filter(|b| b.state != BindingState::Failed)
                .map(binding_view)
                .collect::<Vec<_>>(),
        )
    })?;
    Ok(Json(json!({"bindings": rows})))
}

/// The bot's bindings a list shows the caller: those on Computers its token allows and it may
/// see (a bot: those it holds a grant on), from the index.
fn listed<'a>(
    s: &'a computerd_raft::sm::State,
    caller: &'a Caller,
    bot_id: &'a str,
) -> impl Iterator<Item = &'a ToolBinding> + 'a {
    s.bindings_of_bot(bot_id).filter(|b| s.computers.get(&b.computer_id).is_some_and(|c| s.can_see(caller, c)))
}

fn ready_binding(state: &AppState, caller: &Caller, bot_id: &str, id: &str) -> Result<ToolBinding, ApiError> {
    state
        .cluster
        .state()
        .read(|s| {
            s.tool_bot(caller, bot_id)?;
            let b = s.tool_bindings.get(id).filter(|b| b.bot_id == bot_id);
            let b = b.ok_or_else(|| {
                computerd_raft::sm::Reject::new(computerd_raft::sm::RejectKind::NotFound, "no such binding")
            })?;
            s.check_tool_use(caller, bot_id, &b.computer_id)?;
            if b.state != BindingState::Ready {
                return Err(computerd_raft::sm::Reject::new(
                    computerd_raft::sm::RejectKind::Forbidden,
                    format!("the binding is {:?}: not callable", b.state).to_lowercase(),
                ));
            }
            Ok(b.clone())
        })
        .map_err(ApiError::from)
}

async fn do_discover(state: &AppState, caller: &Caller, bot_id: &str, id: &str) -> Result<Value, ApiError> {
    let b = ready_binding(state, caller, bot_id, id)?;
    match agent_mcp(state, caller, &b.computer_id, McpRequest::Discover { binding_id: id.to_string() }).await? {
        Ok(tools) => {
            let cmd = Command::BindingSettle {
                binding_id: id.to_string(),
                ready: true,
                tools: tools.clone(),
                error: None,
                shared_uid: false,
            };
            propose(state, cmd).await?;
            Ok(json!({"bindingId": id, "tools": tools}))
        }
        Err((reason, message)) => Err(rejected(reason, message)),
    }
}

/// `POST /api/bots/{botId}/tools/{bindingId}/discover`
#[utoipa::path(post, path = "/api/bots/{bot}/tools/{binding}/discover", operation_id = "tools_discover", tag = "tools", params(("bot" = String, Path), ("binding" = String, Path)), responses((status = 200, body = Object), (status = 403, body = ErrorBody)), security(("bearer" = [])))]
pub async fn discover(
    State(state): State<AppState>,
    auth: Auth,
    Path((bot_id, id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    do_discover(&state, &caller, &bot_id, &id).await.map(Json)
}

async fn do_call(state: &AppState, caller: &Caller, bot_id: &str, id: &str, c: CallIn) -> Result<Value, ApiError> {
    if c.operation_id.is_empty() || c.operation_id.len() > 200 {
        return Err(ApiError::invalid("operationId must be 1 to 200 characters"));
    }
    let payload = json!({"binding": id, "tool": c.tool, "arguments": c.arguments});
    let hash = hex::encode(sha2::Sha256::digest(payload.to_string().as_bytes()));
    let op = Operation {
        operation_id: c.operation_id.clone(),
        bot_id: bot_id.to_string(),
        binding_id: id.to_string(),
        payload_hash: hash,
        state: OperationState::Running,
        result: None,
        started_at: now_ms(),
        held: None,
    };
    let key = operation_key(bot_id, &c.operation_id);
    // The agent keeps the answer under this name; the journal gets its digest.
    let name = hex::encode(sha2::Sha256::digest(key.as_bytes()));
    let begun = propose(state, Command::OperationBegin { by: caller.token.id.clone(), operation: op }).await?;
    match begun.as_deref() {
        Some("new") => {}
        Some("done") => {
            state.cluster.read_barrier().await?;
            let op = state.cluster.state().read(|s| s.operations.get(&key).cloned());
            let op = op.ok_or_else(|| ApiError::new(ErrorKind::Expired, "the operation's record has expired"))?;
            let r = match (op.result, op.held) {
                (_, Some(held)) => replay(state, caller, &op.binding_id, &name, &held).await?,
                (r, None) => r.unwrap_or(Value::Null),
            };
            return Ok(json!({"operationId": c.operation_id, "replayed": true, "result": r}));
        }
        other => {
            let mut e = ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "operation {} is {}: its effect is unknown and it is not done again",
                    c.operation_id,
                    other.unwrap_or("unknown")
                ),
            );
            e.reason = Some("outcome_unknown".into());
            return Err(e);
        }
    }
    // New: the store let it in (the binding is ready and the caller may use its Computer).
    let computer = state.cluster.state().read(|s| s.tool_bindings.get(id).map(|b| b.computer_id.clone()));
    let computer = computer.ok_or_else(|| ApiError::not_found("no such binding"))?;
    let request = McpRequest::Call {
        binding_id: id.to_string(),
        tool: c.tool.clone(),
        arguments: c.arguments.clone(),
        operation: Some(name),
    };
    match agent_mcp(state, caller, &computer, request).await {
        Ok(answer) => {
            let result = match &answer {
                Ok(r) => json!({"ok": r}),
                Err((reason, message)) => json!({"error": {"reason": reason, "message": message}}),
            };
            // The answer stays with the agent; the journal keeps what identifies it.
            let held = held_of(&result);
            propose(state, Command::OperationFinish { key, result: None, held: Some(held) }).await?;
            match answer {
                Ok(r) => Ok(json!({"operationId": c.operation_id, "replayed": false, "result": {"ok": r}})),
                Err((reason, message)) => Err(rejected(reason, message)),
            }
        }
        Err(e) if not_sent(&e) => {
            // Refused before the agent (the rights or the binding changed since the journal
            // let it in): not sent, and recorded so.
            let message: String = e.message.chars().take(1000).collect();
            let refusal = json!({"error": {"reason": e.kind.as_str(), "message": message}});
            let _ = propose(state, Command::OperationFinish { key, result: Some(refusal), held: None }).await;
            Err(e)
        }
        Err(e) => {
            // Sent (or maybe sent) without an answer: unknown, and never redone.
            let _ = propose(state, Command::OperationFinish { key, result: None, held: None }).await;
            Err(e)
        }
    }
}

/// The digest and size of an answer as the journal records it.
fn held_of(answer: &Value) -> HeldResult {
    let bytes = answer.to_string();
    HeldResult { sha256: hex::encode(sha2::Sha256::digest(bytes.as_bytes())), size: bytes.len() as u64 }
}

/// A done call's answer, read back from the agent that keeps it and checked against the
/// journal's digest. Gone (past the agent's retention, evicted): `expired`, and the call is not
/// run again.
async fn replay(
    state: &AppState,
    caller: &Caller,
    binding: &str,
    name: &str,
    held: &HeldResult,
) -> Result<Value, ApiError> {
    let computer = state.cluster.state().read(|s| s.tool_bindings.get(binding).map(|b| b.computer_id.clone()));
    let expired = |why: &str| {
        let mut e = ApiError::new(
            ErrorKind::Expired,
            format!("the original result has expired ({why}); the call is not run again"),
        );
        e.reason = Some("result_expired".into());
        e
    };
    let computer = computer.ok_or_else(|| expired("its binding is gone"))?;
    let request = McpRequest::Result { binding_id: binding.to_string(), operation: name.to_string() };
    match agent_mcp(state, caller, &computer, request).await? {
        Ok(kept) => {
            let answer = kept["reply"].clone();
            if held_of(&answer) != *held {
                let mut e = ApiError::new(ErrorKind::Internal, "the kept result does not match the journal's digest");
                e.reason = Some("result_mismatch".into());
                return Err(e);
            }
            Ok(answer)
        }
        Err((reason, _)) if reason == "result_expired" => Err(expired("the Computer no longer keeps it")),
        Err((reason, message)) => Err(rejected(reason, message)),
    }
}

/// `POST /api/bots/{botId}/tools/{bindingId}/call`
#[utoipa::path(post, path = "/api/bots/{bot}/tools/{binding}/call", operation_id = "tools_call", tag = "tools", params(("bot" = String, Path), ("binding" = String, Path)), request_body = CallIn, responses((status = 200, description = "`{\"operationId\", \"replayed\", \"result\"}`", body = Object), (status = 409, description = "outcome_unknown", body = ErrorBody), (status = 410, description = "result_expired", body = ErrorBody), (status = 422, body = ErrorBody)), security(("bearer" = [])))]
pub async fn call(
    State(state): State<AppState>,
    auth: Auth,
    Path((bot_id, id)): Path<(String, String)>,
    body: Body<CallIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(c) = body?;
    do_call(&state, &caller, &bot_id, &id, c).await.map(Json)
}

/// `POST /api/bots/{botId}/tools/{bindingId}/switch` `{operationId, version}`: moves the binding
/// to another installed version of its package, keeping its UID and state. The store reserves the
/// switch durably first (closing the participants to new calls); the agent retires the source,
/// re-verifies the target's bytes, repoints the binding, writes a protected receipt and
/// discovers the schemas; the store then commits version, readiness and schemas in one step (and
/// revokes the bot's binding that was already at the target, once drained). The store follows
/// what the agent says it did: not switched and still at the source is 422 (the binding opens
/// again); anything else that is not done (switched but discovery failed) is `409
/// switch_pending`, and the binding stays closed. Retrying with the same operation id replays the
/// receipt, or carries a pending switch on (the agent decides from its receipt whether it may,
/// after checking the bytes again). A switch cancelled by a revoke answers `409 cancelling` until
/// every participant is drained, then `409 cancelled`.
#[utoipa::path(post, path = "/api/bots/{bot}/tools/{binding}/switch", operation_id = "tools_switch", tag = "tools", params(("bot" = String, Path), ("binding" = String, Path)), request_body = SwitchIn, responses((status = 200, body = Object), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)), security(("bearer" = [])))]
pub async fn switch(
    State(state): State<AppState>,
    auth: Auth,
    Path((bot_id, id)): Path<(String, String)>,
    body: Body<SwitchIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(w) = body?;
    if w.operation_id.is_empty()
        || w.operation_id.len() > 100
        || !w.operation_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(ApiError::invalid("operationId must be 1 to 100 of letters, digits, - and _"));
    }
    let sw = computerd_raft::sm::Switch {
        operation_id: w.operation_id.clone(),
        bot_id: bot_id.clone(),
        binding_id: id.clone(),
        from_version: String::new(),
        to_version: w.version.clone(),
        target_binding: None,
        state: computerd_raft::sm::SwitchState::Reserved,
        receipt: None,
        reserved_at: now_ms(),
        generation: 0,
        drained: Vec::new(),
        note: None,
    };
    let key = operation_key(&bot_id, &w.operation_id);
    let seen = propose(&state, Command::SwitchReserve { by: caller.token.id.clone(), switch: sw }).await?;
    state.cluster.read_barrier().await?;
    let stored = state.cluster.state().read(|s| s.switches.get(&key).cloned());
    let stored = stored.ok_or_else(|| ApiError::not_found("no such switch"))?;
    match seen.as_deref() {
        Some("done") => {
            return Ok(Json(
                json!({"operationId": w.operation_id, "bindingId": id, "replayed": true, "receipt": stored.receipt}),
            ));
        }
        Some("reserved") => {}
        Some("cancelling") => {
            let mut e = ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "the switch was cancelled (a participant was revoked); waiting for the runtime of {} to be confirmed stopped",
                    stored.undrained().join(", ")
                ),
            );
            e.reason = Some("cancelling".into());
            return Err(e);
        }
        other => {
            let mut e = ApiError::new(ErrorKind::Conflict, format!("the switch is {}", other.unwrap_or("unknown")));
            e.reason = other.map(str::to_string);
            return Err(e);
        }
    }
    let (computer, generation) = state.cluster.state().read(|s| {
        let computer = s.tool_bindings.get(&id).map(|b| b.computer_id.clone());
        let generation = computer.as_ref().and_then(|c| s.computers.get(c)).map_or(0, |c| c.link_generation);
        (computer, generation)
    });
    let computer = computer.ok_or_else(|| ApiError::not_found("no such binding"))?;
    // (The bot's binding already at the target is closed to calls since the reserve; the
    // commit revokes it, and it is drained after that, like any revoked binding.)
    let request = McpRequest::Switch {
        binding_id: id.clone(),
        operation_id: w.operation_id.clone(),
        from_version: stored.from_version.clone(),
        version: w.version.clone(),
    };
    // A lost answer leaves the switch reserved: sending the same operation again carries it on.
    // The store follows what the agent says it did, under the link the switch was sent on
    // (`generation`, read before sending: an answer that crossed a relink settles nothing).
    let reply = agent_mcp_reply(&state, &caller, &computer, request).await?;
    match switch_outcome(reply, &stored.from_version) {
        SwitchOutcome::Switched(receipt) => {
            let settle =
                Command::SwitchSettle { key, receipt: receipt.clone(), ok: true, generation: Some(generation) };
            propose(&state, settle).await?;
            let mut target_drained = None;
            if let Some(target) = &stored.target_binding {
                let drained = drain(&state, &caller.token.id, &computer, std::slice::from_ref(target)).await;
                target_drained = Some(!drained.is_empty());
            }
            Ok(Json(json!({
                "operationId": w.operation_id, "bindingId": id, "replayed": false, "receipt": receipt,
                "targetDrained": target_drained,
            })))
        }
        SwitchOutcome::NotSwitched(reason, message) => {
            let refusal = json!({"reason": reason, "message": message});
            let settle = Command::SwitchSettle { key, receipt: refusal, ok: false, generation: Some(generation) };
            propose(&state, settle).await?;
            Err(rejected(reason, message))
        }
        SwitchOutcome::Pending(note) => {
            propose(&state, Command::SwitchHold { key, note: note.clone(), generation }).await?;
            let switched = note["switched"] == true;
            let then = if switched {
                "send the same operationId again to finish it"
            } else {
                "revoke the binding and install it again"
            };
            let at = note["version"].as_str().unwrap_or("no version");
            let mut e = ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "the switch is pending: the binding is at {at} ({}: {}); {then}",
                    note["reason"].as_str().unwrap_or(""),
                    note["message"].as_str().unwrap_or("")
                ),
            );
            e.reason = Some("switch_pending".into());
            Err(e)
        }
    }
}

/// What an agent's answer to a switch says was done.
enum SwitchOutcome {
    /// Switched, and the schemas discovered: the receipt.
    Switched(Value),
    /// Not switched, and the binding is still at the source version: why (reason, message).
    NotSwitched(String, String),
    /// Anything else (switched but not ready; neither at the source nor at the target; an
    /// answer that does not say): the switch stays pending, with this note.
    Pending(Value),
}

fn switch_outcome(reply: computerd_proto::mcp::McpReply, from: &str) -> SwitchOutcome {
    match (reply.result, reply.error) {
        (Some(r), None) if !r.is_null() => SwitchOutcome::Switched(r),
        (done, Some(e)) => {
            let done = done.unwrap_or(Value::Null);
            if done["switched"] == false && done["version"] == from {
                SwitchOutcome::NotSwitched(e.reason, e.message)
            } else {
                SwitchOutcome::Pending(json!({
                    "reason": e.reason, "message": e.message,
                    "switched": done["switched"], "version": done["version"],
                }))
            }
        }
        (_, None) => SwitchOutcome::Pending(json!({
            "reason": "unknown", "message": "the agent answered neither a result nor a refusal",
            "switched": null, "version": null,
        })),
    }
}

/// `DELETE /api/bots/{botId}/tools/{bindingId}`: revoke. Revoking a participant of a pending
/// switch cancels it and drains every participant: `complete` only once all are confirmed
/// stopped, and `notDrained` names those that are not.
#[utoipa::path(delete, path = "/api/bots/{bot}/tools/{binding}", operation_id = "tools_revoke", tag = "tools", params(("bot" = String, Path), ("binding" = String, Path)), responses((status = 200, body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn revoke(
    State(state): State<AppState>,
    auth: Auth,
    Path((bot_id, id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let computer = state.cluster.state().read(|s| {
        s.tool_bot(&caller, &bot_id)?;
        let b = s.tool_bindings.get(&id).filter(|b| b.bot_id == bot_id).ok_or_else(|| {
            computerd_raft::sm::Reject::new(computerd_raft::sm::RejectKind::NotFound, "no such binding")
        })?;
        // The token's limits and the right to operate the Computer (not the bot's grant: a
        // revoke only takes rights away).
        s.check_operate(&caller, &b.computer_id)?;
        Ok::<_, computerd_raft::sm::Reject>(b.computer_id.clone())
    })?;
    // Admission closes first: from here on no new call is let through (nor through any other
    // participant of a switch it takes part in: the switch is cancelling).
    propose(&state, Command::BindingRevoke { by: caller.token.id.clone(), binding_id: id.clone() }).await?;
    // The other participants of a switch this revoke cancelled: each is drained too, and the
    // switch ends once every one is confirmed stopped.
    state.cluster.read_barrier().await?;
    let others: Vec<String> =
        state.cluster.state().read(|s| s.cancelling_with(&id)).into_iter().filter(|p| *p != id).collect();
    // Then the agent drains it (a paused Computer is resumed for that, with the caller's rights),
    // and once nothing of its UID is left removes its HOME, private copy and unused packages.
    let drained = match agent_mcp(&state, &caller, &computer, McpRequest::Revoke { binding_id: id.clone() }).await {
        Ok(Ok(r)) => r["drained"].as_bool().unwrap_or(false),
        _ => false,
    };
    if drained {
        mark_drained(&state, &id).await;
    }
    // (The answer names those not confirmed stopped.)
    let others_drained = drain(&state, &caller.token.id, &computer, &others).await;
    let mut not_drained: Vec<String> = others.into_iter().filter(|p| !others_drained.contains(p)).collect();
    if !drained {
        not_drained.insert(0, id.clone());
    }
    Ok(Json(json!({
        "bindingId": id, "revoked": true, "drained": drained, "complete": not_drained.is_empty(),
        "notDrained": not_drained,
    })))
}

/// `POST /api/bots/{botId}/tools/computer_mcp`: the model-facing tool.
#[utoipa::path(post, path = "/api/bots/{bot}/tools/computer_mcp", operation_id = "tools_computer_mcp", tag = "tools", params(("bot" = String, Path)), request_body = ModelToolIn, responses((status = 200, body = Object), (status = 403, body = ErrorBody)), security(("bearer" = [])))]
pub async fn model_tool(
    State(state): State<AppState>,
    auth: Auth,
    Path(bot_id): Path<String>,
    body: Body<ModelToolIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(t) = body?;
    let need = |v: Option<String>, what: &str| v.ok_or_else(|| ApiError::invalid(format!("{what} is required")));
    match t.action.as_str() {
        "list" => {
            let rows = state.cluster.state().read(|s| {
                s.tool_bot(&caller, &bot_id)?;
                Ok::<_, computerd_raft::sm::Reject>(
                    listed(s, &caller, &bot_id)
                        .filter(|b| b.state == BindingState::Ready && s.has_grant(&b.computer_id, &bot_id))
                        .map(|b| json!({"bindingId": b.id, "packageId": b.package_id, "version": b.version, "tools": b.tools, "sharedUid": b.shared_uid}))
                        .collect::<Vec<_>>(),
                )
            })?;
            Ok(Json(json!({"bindings": rows})))
        }
        "discover" => {
            let id = need(t.binding_id, "bindingId")?;
            do_discover(&state, &caller, &bot_id, &id).await.map(Json)
        }
        "call" => {
            let id = need(t.binding_id, "bindingId")?;
            let c = CallIn {
                operation_id: t.operation_id.unwrap_or_else(|| new_id("op")),
                tool: need(t.tool, "tool")?,
                arguments: t.arguments,
            };
            do_call(&state, &caller, &bot_id, &id, c).await.map(Json)
        }
        other => Err(ApiError::invalid(format!("unknown action {other:?}: list, discover or call"))),
    }
}
