//! The store's retention (`GET/PUT /v1/retention`): how long finished executions (their
//! receipts and command keys) and decided approvals are kept before they are compacted
//! (`computerd_raft::sm::Retention`).

use axum::Json;
use axum::extract::State;
use computerd_raft::sm::Command;
use computerd_raft::sm::DEFAULT_RETENTION_MS;
use computerd_raft::sm::MAX_RETENTION_MS;
use computerd_raft::sm::MIN_RETENTION_MS;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::Body;
use super::util::propose;

fn view(ms: Option<u64>) -> Value {
    json!({"retentionMs": ms.unwrap_or(DEFAULT_RETENTION_MS), "default": ms.is_none()})
}

/// `GET /v1/retention` (owner/admin)
#[utoipa::path(get, path = "/v1/retention", operation_id = "retention_get", tag = "retention", responses((status = 200, description = "`{\"retentionMs\": n, \"default\": bool}`", body = Object), (status = 403, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.current(&state).await?.check_admin_read()?;
    Ok(Json(view(state.cluster.state().read(|s| s.retention.ms))))
}

/// `PUT /v1/retention` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetentionIn {
    /// How long finished executions and decided approvals are kept, ms (1 hour to 400 days).
    retention_ms: u64,
}

/// `PUT /v1/retention` (owner/admin): sets the retention. Records already past the new
/// retention are compacted from then on, a few with each write to the store.
#[utoipa::path(put, path = "/v1/retention", operation_id = "retention_put", tag = "retention", request_body = RetentionIn, responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)), security(("bearer" = [])))]
pub async fn put(State(state): State<AppState>, auth: Auth, body: Body<RetentionIn>) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    caller.check_admin_write()?;
    let Json(b) = body?;
    if !(MIN_RETENTION_MS..=MAX_RETENTION_MS).contains(&b.retention_ms) {
        return Err(ApiError::invalid(format!(
            "retentionMs must be {MIN_RETENTION_MS}..={MAX_RETENTION_MS} (1 hour to 400 days)"
        )));
    }
    propose(&state, Command::SetRetention { by: caller.token.id.clone(), ms: b.retention_ms }).await?;
    Ok(Json(view(Some(b.retention_ms))))
}
