//! `PUT/GET/DELETE /v1/computers/:id/bots/:botId` and `GET /v1/computers/:id/bots`.

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use computerd_raft::sm::Command;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
#[allow(unused_imports)]
use super::schemas::ReceiptDoc;
use super::util::propose;
use crate::ids::now_ms;

/// `PUT …/bots/:botId` body (optional).
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrantIn {
    /// The bot may run sessions and file calls as root (`"user": "root"`). Root means
    /// member-level trust: a root session can read the agent's own state. Absent: a new grant
    /// does not allow it, an existing one keeps what it had.
    allow_root: Option<bool>,
    /// On a paired machine: the absolute paths (files or directories) the bot may copy files
    /// from with `copy-from-box` (without them, none). Absent: kept.
    paths: Option<Vec<String>>,
    /// The bot may ask for a `control` stream of the desktop for its member (the input lease is
    /// then held in the member's name, as a person, once a browser opens the stream). Absent: a
    /// new grant does not allow it, an existing one keeps what it had.
    desktop_control: Option<bool>,
    /// The secrets of the caller's vault the bot may have filled on this Computer
    /// (`fill_secret`), by name; each must be in the vault. `[]` removes them. Absent: kept.
    secrets: Option<Vec<String>>,
}

/// `PUT …/bots/:botId`: grants the bot the right to use the Computer (idempotent); the body,
/// when there is one, may set `allowRoot`. Only a member may grant (checked again at commit).
#[utoipa::path(put, path = "/v1/computers/{id}/bots/{bot}", operation_id = "grants_put", tag = "rights", params(("id" = String, Path), ("bot" = String, Path)), request_body(content = GrantIn, description = "Optional"), responses((status = 200, description = "The grant", body = Object)), security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, bot)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let b: GrantIn = if body.iter().all(u8::is_ascii_whitespace) {
        GrantIn::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("bad body: {e}")))?
    };
    let cmd = Command::PutGrant {
        by: caller.token.id.clone(),
        computer_id: id.clone(),
        bot_id: bot.clone(),
        at_ms: now_ms(),
        allow_root: b.allow_root,
        paths: b.paths,
        desktop_control: b.desktop_control,
        secrets: b.secrets,
    };
    propose(&state, cmd).await?;
    state.cluster.read_barrier().await?;
    let g = state.cluster.state().read(|s| s.grants.get(&id).and_then(|g| g.get(&bot)).cloned());
    g.map(|g| Json(json!(g))).ok_or_else(|| ApiError::not_found("no such grant"))
}

/// `GET …/bots/:botId`
#[utoipa::path(get, path = "/v1/computers/{id}/bots/{bot}", operation_id = "grants_get", tag = "rights", params(("id" = String, Path), ("bot" = String, Path)), responses((status = 200, body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, bot)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let g = state.cluster.state().read(|s| {
        s.visible_computer(&caller, &id)?;
        Ok::<_, computerd_raft::sm::Reject>(s.grants.get(&id).and_then(|g| g.get(&bot)).cloned())
    })?;
    g.map(|g| Json(json!(g))).ok_or_else(|| ApiError::not_found("no such grant"))
}

/// `GET …/bots`: the grants on a Computer.
#[utoipa::path(get, path = "/v1/computers/{id}/bots", operation_id = "grants_list", tag = "rights", params(("id" = String, Path)), responses((status = 200, description = "`{\"grants\": [...]}`", body = Object)), security(("bearer" = [])))]
pub async fn list(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let grants = state.cluster.state().read(|s| {
        s.visible_computer(&caller, &id)?;
        Ok::<_, computerd_raft::sm::Reject>(
            s.grants.get(&id).map(|g| g.values().cloned().collect::<Vec<_>>()).unwrap_or_default(),
        )
    })?;
    Ok(Json(json!({ "grants": grants })))
}

/// `DELETE …/bots/:botId`: revokes; the bot's next call is refused.
#[utoipa::path(delete, path = "/v1/computers/{id}/bots/{bot}", operation_id = "grants_delete", tag = "rights", params(("id" = String, Path), ("bot" = String, Path)), responses((status = 204, description = "Revoked")), security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, bot)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let caller = auth.for_write(&state).await?;
    // The bot's tool bindings there close with the grant (in the store, in the same commit),
    // then drain on the agent.
    let closing = super::tool_drain::open_bindings(&state, &bot, Some(&id)).await?;
    propose(&state, Command::DeleteGrant { by: caller.token.id.clone(), computer_id: id, bot_id: bot }).await?;
    super::tool_drain::drain_closed(&state, &caller.token.id, closing);
    Ok(StatusCode::NO_CONTENT)
}
