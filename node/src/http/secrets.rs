//! `PUT/GET/DELETE /v1/secrets/:name` and `GET /v1/secrets`: a member's vault, write-only. The
//! value goes in once and never comes out of the API: it is sealed here (`crate::vault`) before
//! it is proposed, and a `GET` answers the metadata only. Bots cannot read or change a vault;
//! a member names the secrets a bot may have filled in the bot's grant on a Computer
//! (`PUT /v1/computers/:id/bots/:bot {"secrets": [...]}`), and the bot uses them only through
//! `fill_secret`.

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use computerd_proto::ErrorKind;
use computerd_raft::sm::Command;
use computerd_raft::sm::Secret;
use computerd_raft::sm::SecretKind;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::propose;
use crate::ids::now_ms;
use crate::vault::DataKey;

/// `PUT /v1/secrets/:name` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecretIn {
    /// The value: 4 to 4,096 bytes, no control characters; for `totp`, the base32 seed.
    value: String,
    /// The origins (`https://host[:port]`, lowercase) whose pages may receive it: 1 to 16.
    origins: Vec<String>,
    /// `password` (default: password and username fields), `totp` (one-time-code fields,
    /// filled with the current code) or `text` (text fields).
    #[serde(default)]
    kind: Option<String>,
}

impl std::fmt::Debug for SecretIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretIn").field("origins", &self.origins).field("kind", &self.kind).finish_non_exhaustive()
    }
}

/// A secret as the API shows it: never its value.
pub fn view(s: &Secret) -> Value {
    json!({
        "name": s.name,
        "kind": s.kind.as_str(),
        "origins": s.origins,
        "createdAt": s.created_at,
        "updatedAt": s.updated_at,
        "lastUsedAt": s.last_used_at,
    })
}

/// A kind's name in the API.
pub fn parse_kind(kind: Option<&str>) -> Result<SecretKind, ApiError> {
    match kind {
        None | Some("password") => Ok(SecretKind::Password),
        Some("totp") => Ok(SecretKind::Totp),
        Some("text") => Ok(SecretKind::Text),
        Some(k) => Err(ApiError::invalid(format!("kind {k:?} is not one of password, totp, text"))),
    }
}

/// The data key of this node, or `503 unavailable` saying why not. A voter that has not fetched
/// the CA's key yet (just joined or promoted) fetches it now.
pub async fn data_key(state: &AppState) -> Result<DataKey, ApiError> {
    if let Err(e) = crate::pki::ca_key_now(&state.cluster, &state.pki).await {
        return Err(ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "this node holds no data key, so it cannot seal or open secrets ({e}): use a voter (see docs/secrets.md)"
            ),
        ));
    }
    DataKey::of_node(&state.pki).map_err(|e| ApiError::new(ErrorKind::Unavailable, e))
}

fn member_only(caller: &computerd_raft::sm::Caller) -> Result<(), ApiError> {
    if caller.bot.is_some() {
        return Err(ApiError::new(
            ErrorKind::Forbidden,
            "a bot has no vault: its member puts secrets and names them in the bot's grant",
        ));
    }
    Ok(())
}

/// `PUT /v1/secrets/:name`: makes or replaces a secret of the caller's vault.
#[utoipa::path(put, path = "/v1/secrets/{name}", operation_id = "secrets_put", tag = "secrets", params(("name" = String, Path, description = "1 to 64 of [a-z0-9._-]")), request_body = SecretIn, responses((status = 200, description = "The secret's metadata `{\"name\", \"kind\", \"origins\", \"createdAt\", \"updatedAt\", \"lastUsedAt\"}`: never its value", body = Object), (status = 400, body = ErrorBody), (status = 403, description = "a bot, a read-only token or one limited to Computers", body = ErrorBody), (status = 409, description = "the vault holds 256 secrets", body = ErrorBody), (status = 503, description = "`unavailable`: this node is not a voter and cannot seal", body = ErrorBody)), security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    auth: Auth,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    member_only(&caller)?;
    computerd_proto::browser::check_secret_name(&name).map_err(ApiError::invalid)?;
    // Never echo the body: it holds the value.
    let b: SecretIn = serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(format!(
            "bad body at line {} column {}: {{\"value\", \"origins\", \"kind\"?}} expected ({:?})",
            e.line(),
            e.column(),
            e.classify()
        ))
    })?;
    let kind = parse_kind(b.kind.as_deref())?;
    crate::vault::check_value(kind.as_str(), &b.value).map_err(ApiError::invalid)?;
    for o in &b.origins {
        computerd_raft::sm::check_secret_origin(o)?;
    }
    let sealed = data_key(&state)
        .await?
        .seal(&caller.member.id, &name, kind.as_str(), &b.value)
        .map_err(|e| ApiError::new(ErrorKind::Internal, e))?;
    drop(b.value);
    propose(
        &state,
        Command::PutSecret {
            by: caller.token.id.clone(),
            name: name.clone(),
            kind,
            origins: b.origins,
            sealed,
            at_ms: now_ms(),
        },
    )
    .await?;
    let s = state.cluster.state().read(|s| s.secret(&caller.member.id, &name).map(view));
    s.map(Json).ok_or_else(|| ApiError::not_found("no such secret"))
}

/// `GET /v1/secrets`: the caller's vault, metadata only.
#[utoipa::path(get, path = "/v1/secrets", operation_id = "secrets_list", tag = "secrets", responses((status = 200, description = "`{\"secrets\": [{\"name\", \"kind\", \"origins\", \"createdAt\", \"updatedAt\", \"lastUsedAt\"}]}`", body = Object), (status = 403, description = "a bot", body = ErrorBody)), security(("bearer" = [])))]
pub async fn list(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    member_only(&caller)?;
    let all: Vec<Value> = state.cluster.state().read(|s| s.vault_of(&caller.member.id).map(view).collect());
    Ok(Json(json!({ "secrets": all })))
}

/// `GET /v1/secrets/:name`: one secret's metadata.
#[utoipa::path(get, path = "/v1/secrets/{name}", operation_id = "secrets_get", tag = "secrets", params(("name" = String, Path)), responses((status = 200, description = "The metadata, never the value", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(State(state): State<AppState>, auth: Auth, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    member_only(&caller)?;
    let s = state.cluster.state().read(|s| s.secret(&caller.member.id, &name).map(view));
    s.map(Json).ok_or_else(|| ApiError::not_found(format!("no secret named {name:?} in your vault")))
}

/// `DELETE /v1/secrets/:name`
#[utoipa::path(delete, path = "/v1/secrets/{name}", operation_id = "secrets_delete", tag = "secrets", params(("name" = String, Path)), responses((status = 204, description = "Deleted: grants that name it fill nothing under that name"), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    auth: Auth,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let caller = auth.for_write(&state).await?;
    member_only(&caller)?;
    propose(&state, Command::DeleteSecret { by: caller.token.id.clone(), name }).await?;
    Ok(StatusCode::NO_CONTENT)
}
