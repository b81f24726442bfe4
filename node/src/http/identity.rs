//! Identity routes (owner/admin only): members, bots, API tokens.

use std::ops::Bound;

use axum::Json;
use axum::extract::Path;
use axum::extract::Query;
use axum::extract::State;
use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use computerd_raft::sm::Bot;
use computerd_raft::sm::Command;
use computerd_raft::sm::Member;
use computerd_raft::sm::Principal;
use computerd_raft::sm::Role;
use computerd_raft::sm::Token;
use computerd_raft::sm::hash_secret;
use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;
use serde_json::json;

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
use crate::ids::new_secret;
use crate::ids::now_ms;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewMember {
    name: String,
    email: Option<String>,
    #[serde(default = "default_role")]
    #[schema(value_type = String, example = "member")]
    role: Role,
}

fn default_role() -> Role {
    Role::Member
}

/// `POST /v1/members`
#[utoipa::path(post, path = "/v1/members", operation_id = "identity_create_member", tag = "identity", request_body = NewMember, responses((status = 201, description = "The member", body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)), security(("bearer" = [])))]
pub async fn create_member(
    State(state): State<AppState>,
    auth: Auth,
    body: Body<NewMember>,
) -> Result<(StatusCode, Json<Member>), ApiError> {
    let caller = auth.for_write(&state).await?;
    caller.check_admin_write()?;
    let Json(body) = body?;
    let email = match body.email.map(|e| e.trim().to_lowercase()) {
        Some(e) if e.len() > 254 || e.split('@').count() != 2 || e.starts_with('@') || e.ends_with('@') => {
            return Err(ApiError::invalid("email is not a valid address"));
        }
        other => other,
    };
    let member =
        Member { id: new_id("mem"), name: check_name(&body.name)?, email, role: body.role, created_at: now_ms() };
    propose(&state, Command::CreateMember { by: caller.token.id, member: member.clone() }).await?;
    Ok((StatusCode::CREATED, Json(member)))
}

/// `GET /v1/members`
#[utoipa::path(get, path = "/v1/members", operation_id = "identity_list_members", tag = "identity", responses((status = 200, description = "`{\"members\": [...]}`", body = Object)), security(("bearer" = [])))]
pub async fn list_members(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.current(&state).await?.check_admin_read()?;
    let members: Vec<Member> = state.cluster.state().read(|s| s.members.values().cloned().collect());
    Ok(Json(json!({ "members": members })))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewBot {
    name: String,
    member_id: Option<String>,
    /// The bot that gives this one work (of the same member): a delegation `dlg_<bot id>` is
    /// recorded with it, which the parent can end.
    parent_bot_id: Option<String>,
}

/// `POST /v1/bots`: the bot belongs to `memberId` (default: the caller).
#[utoipa::path(post, path = "/v1/bots", operation_id = "identity_create_bot", tag = "identity", request_body = NewBot, responses((status = 201, description = "The bot", body = Object), (status = 400, body = ErrorBody)), security(("bearer" = [])))]
pub async fn create_bot(
    State(state): State<AppState>,
    auth: Auth,
    body: Body<NewBot>,
) -> Result<(StatusCode, Json<Bot>), ApiError> {
    let caller = auth.for_write(&state).await?;
    caller.check_admin_write()?;
    let Json(body) = body?;
    let member_id = match body.member_id {
        Some(m) => {
            check_id(&m, "mem", "memberId")?;
            m
        }
        None => caller.member.id.clone(),
    };
    let bot =
        Bot { id: new_id("bot"), name: check_name(&body.name)?, member_id, created_at: now_ms(), archived_at: None };
    if let Some(p) = &body.parent_bot_id {
        check_id(p, "bot", "parentBotId")?;
    }
    let parent = body.parent_bot_id;
    propose(&state, Command::CreateBot { by: caller.token.id, bot: bot.clone(), parent }).await?;
    Ok((StatusCode::CREATED, Json(bot)))
}

/// Query of `GET /v1/bots`: a page after a bot id, in id order.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BotsQuery {
    /// The last bot id of the previous page (its `next`).
    after: Option<String>,
    /// At most this many bots (1 to 1,000; default 1,000).
    limit: Option<usize>,
}

/// The most bots one page of `GET /v1/bots` answers.
const BOTS_PAGE: usize = 1000;

/// `GET /v1/bots?after=&limit=`: a page of bots in id order, archived ones included; `next` is
/// the cursor of the following page, `null` on the last one.
#[utoipa::path(get, path = "/v1/bots", operation_id = "identity_list_bots", tag = "identity", params(("after" = Option<String>, Query, description = "The `next` of the previous page"), ("limit" = Option<usize>, Query, description = "1 to 1,000 (default 1,000)")), responses((status = 200, description = "`{\"bots\": [...], \"next\": id | null}`", body = Object), (status = 400, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list_bots(
    State(state): State<AppState>,
    auth: Auth,
    q: Result<Query<BotsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    auth.current(&state).await?.check_admin_read()?;
    let Query(q) = q.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limit = q.limit.unwrap_or(BOTS_PAGE);
    if !(1..=BOTS_PAGE).contains(&limit) {
        return Err(ApiError::invalid(format!("limit must be 1..={BOTS_PAGE}")));
    }
    let (bots, more): (Vec<Bot>, bool) = state.cluster.state().read(|s| {
        let from = match &q.after {
            Some(after) => s.bots.range::<str, _>((Bound::Excluded(after.as_str()), Bound::Unbounded)),
            None => s.bots.range::<str, _>(..),
        };
        let mut page: Vec<Bot> = from.map(|(_, b)| b.clone()).take(limit + 1).collect();
        let more = page.len() > limit;
        page.truncate(limit);
        (page, more)
    });
    let next = if more { bots.last().map(|b| b.id.clone()) } else { None };
    Ok(Json(json!({ "bots": bots, "next": next })))
}

/// `POST /v1/bots/:id/archive`: idempotent; answers the archived bot.
#[utoipa::path(post, path = "/v1/bots/{id}/archive", operation_id = "identity_archive_bot", tag = "identity", params(("id" = String, Path)), responses((status = 200, description = "The archived bot", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn archive_bot(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Bot>, ApiError> {
    let caller = auth.for_write(&state).await?;
    caller.check_admin_write()?;
    check_id(&id, "bot", "bot id").map_err(|_| ApiError::not_found("no such bot"))?;
    // The bot's tool bindings close with it (in the store), then drain on their agents.
    let closing = super::tool_drain::open_bindings(&state, &id, None).await?;
    propose(&state, Command::ArchiveBot { by: caller.token.id.clone(), bot_id: id.clone(), at_ms: now_ms() }).await?;
    super::tool_drain::drain_closed(&state, &caller.token.id, closing);
    state.cluster.read_barrier().await?;
    let bot = state.cluster.state().read(|s| s.bots.get(&id).cloned());
    bot.map(Json).ok_or_else(|| ApiError::not_found("no such bot"))
}

/// A token as shown to callers: never its hash.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenView {
    id: String,
    name: String,
    principal: Principal,
    read_only: bool,
    computers: Option<Vec<String>>,
    created_at: u64,
    revoked_at: Option<u64>,
}

impl From<&Token> for TokenView {
    fn from(t: &Token) -> Self {
        Self {
            id: t.id.clone(),
            name: t.name.clone(),
            principal: t.principal.clone(),
            read_only: t.read_only,
            computers: t.computers.clone(),
            created_at: t.created_at,
            revoked_at: t.revoked_at,
        }
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewToken {
    name: String,
    member_id: Option<String>,
    bot_id: Option<String>,
    #[serde(default)]
    read_only: bool,
    computers: Option<Vec<String>>,
}

/// `POST /v1/tokens`: answers the secret once; only its hash is stored.
#[utoipa::path(post, path = "/v1/tokens", operation_id = "identity_create_token", tag = "identity", request_body = NewToken, responses((status = 201, description = "`{\"token\": …, \"secret\": …}`: the secret is shown once", body = Object)), security(("bearer" = [])))]
pub async fn create_token(
    State(state): State<AppState>,
    auth: Auth,
    body: Body<NewToken>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    caller.check_admin_write()?;
    let Json(body) = body?;
    let principal = match (body.member_id, body.bot_id) {
        (Some(_), Some(_)) => return Err(ApiError::invalid("give memberId or botId, not both")),
        (Some(m), None) => {
            check_id(&m, "mem", "memberId")?;
            Principal::Member(m)
        }
        (None, Some(b)) => {
            check_id(&b, "bot", "botId")?;
            Principal::Bot(b)
        }
        (None, None) => Principal::Member(caller.member.id.clone()),
    };
    if let Some(list) = &body.computers {
        if list.len() > 1000 {
            return Err(ApiError::invalid("computers may list at most 1000 ids"));
        }
        for c in list {
            check_id(c, "cmp", "computers[]")?;
        }
    }
    let secret = new_secret();
    let token = Token {
        id: new_id("tok"),
        name: check_name(&body.name)?,
        hash: hash_secret(&secret),
        principal,
        read_only: body.read_only,
        computers: body.computers,
        created_at: now_ms(),
        revoked_at: None,
    };
    propose(&state, Command::CreateToken { by: caller.token.id, token: token.clone() }).await?;
    Ok((StatusCode::CREATED, Json(json!({ "token": TokenView::from(&token), "secret": secret }))))
}

/// `GET /v1/tokens`
#[utoipa::path(get, path = "/v1/tokens", operation_id = "identity_list_tokens", tag = "identity", responses((status = 200, description = "`{\"tokens\": [...]}` (never hashes)", body = Object)), security(("bearer" = [])))]
pub async fn list_tokens(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.current(&state).await?.check_admin_read()?;
    let tokens: Vec<TokenView> = state.cluster.state().read(|s| s.tokens.values().map(TokenView::from).collect());
    Ok(Json(json!({ "tokens": tokens })))
}

/// `DELETE /v1/tokens/:id`: idempotent; answers the revoked token.
#[utoipa::path(delete, path = "/v1/tokens/{id}", operation_id = "identity_revoke_token", tag = "identity", params(("id" = String, Path)), responses((status = 200, description = "The revoked token", body = Object)), security(("bearer" = [])))]
pub async fn revoke_token(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<TokenView>, ApiError> {
    let caller = auth.for_write(&state).await?;
    caller.check_admin_write()?;
    check_id(&id, "tok", "token id").map_err(|_| ApiError::not_found("no such token"))?;
    propose(&state, Command::RevokeToken { by: caller.token.id, token_id: id.clone(), at_ms: now_ms() }).await?;
    state.cluster.read_barrier().await?;
    let token = state.cluster.state().read(|s| s.tokens.get(&id).map(TokenView::from));
    token.map(Json).ok_or_else(|| ApiError::not_found("no such token"))
}
