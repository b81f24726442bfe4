//! `POST/GET /v1/bots/:bot/delegations`, `DELETE /v1/bots/:bot/delegations/:id`: a parent bot
//! gives a child bot work (SPEC §3), so the child may acquire the Computers the parent holds a
//! grant on; ending it ends what the child acquired through it. Rights are checked again at
//! commit (`raft/src/sm/delegation.rs`).

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use computerd_raft::sm::Command;
use computerd_raft::sm::Delegation;
use computerd_raft::sm::Role;
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
use crate::ids::now_ms;

/// `POST …/delegations` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DelegateIn {
    /// The bot that is given the work (`bot_…`, of the same member).
    child_bot_id: String,
}

fn no_bot() -> ApiError {
    ApiError::not_found("no such bot")
}

/// `POST /v1/bots/:bot/delegations`: `bot` gives `childBotId` work. By the bot itself, its
/// member or an admin.
#[utoipa::path(post, path = "/v1/bots/{bot}/delegations", operation_id = "delegations_create", tag = "rights", params(("bot" = String, Path, description = "The parent bot")), request_body = DelegateIn, responses((status = 201, description = "The delegation: `{\"id\", \"parentBotId\", \"childBotId\", \"madeBy\", \"createdAt\"}`", body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, description = "`already delegated`, or the bot gives 64 already", body = ErrorBody)), security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    auth: Auth,
    Path(bot): Path<String>,
    body: Body<DelegateIn>,
) -> Result<(StatusCode, Json<Delegation>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body?;
    check_id(&bot, "bot", "bot id").map_err(|_| no_bot())?;
    check_id(&b.child_bot_id, "bot", "childBotId")?;
    let made_by = caller.bot.as_ref().map(|x| x.id.clone()).unwrap_or_else(|| caller.member.id.clone());
    let d = Delegation {
        id: new_id("dlg"),
        parent_bot_id: bot,
        child_bot_id: b.child_bot_id,
        made_by,
        created_at: now_ms(),
    };
    propose(&state, Command::Delegate { by: caller.token.id, delegation: d.clone() }).await?;
    Ok((StatusCode::CREATED, Json(d)))
}

/// `GET /v1/bots/:bot/delegations`: those `bot` gave and received. For the bot itself, its
/// member or an admin.
#[utoipa::path(get, path = "/v1/bots/{bot}/delegations", operation_id = "delegations_list", tag = "rights", params(("bot" = String, Path)), responses((status = 200, description = "`{\"delegations\": [...]}`", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list(State(state): State<AppState>, auth: Auth, Path(bot): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let found = state.cluster.state().read(|s| {
        let b = s.bots.get(&bot)?;
        let may = match &caller.bot {
            Some(me) => me.id == bot,
            None => caller.member.id == b.member_id || caller.member.role >= Role::Admin,
        };
        may.then(|| s.delegations.of(&bot).cloned().collect::<Vec<_>>())
    });
    let list = found.ok_or_else(no_bot)?;
    Ok(Json(json!({ "delegations": list })))
}

/// `DELETE /v1/bots/:bot/delegations/:id`: ends a delegation `bot` gave, and every grant the
/// child acquired through it.
#[utoipa::path(delete, path = "/v1/bots/{bot}/delegations/{delegation}", operation_id = "delegations_end", tag = "rights", params(("bot" = String, Path), ("delegation" = String, Path)), responses((status = 200, description = "`{\"ended\": id}`", body = Object), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn end(
    State(state): State<AppState>,
    auth: Auth,
    Path((bot, id)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let gave = state.cluster.state().read(|s| s.delegations.by_id.get(&id).is_some_and(|d| d.parent_bot_id == bot));
    if !gave {
        return Err(ApiError::not_found("no such delegation"));
    }
    propose(&state, Command::EndDelegation { by: caller.token.id, delegation_id: id.clone() }).await?;
    Ok(Json(json!({ "ended": id })))
}
