//! `GET /v1/executions/:id` and the decision on an unknown outcome.

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use computerd_raft::sm::Command;
use computerd_raft::sm::ExecutionState;
use serde::Deserialize;
use serde_json::Value;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::computers::receipt;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
#[allow(unused_imports)]
use super::schemas::ReceiptDoc;
use super::util::Body;
use super::util::propose;
use crate::ids::now_ms;

/// `GET /v1/executions/:id`: 404 unless the caller may see its Computer.
#[utoipa::path(get, path = "/v1/executions/{id}", operation_id = "executions_get", tag = "executions", params(("id" = String, Path)), responses((status = 200, body = ReceiptDoc), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let now = now_ms();
    let v = state.cluster.state().read(|s| {
        let e = s.executions.get(&id)?;
        let c = s.computers.get(&e.computer_id)?;
        s.could_see(&caller, c).then(|| receipt(s, e, &caller, now))
    });
    v.map(Json).ok_or_else(|| ApiError::not_found("no such execution"))
}

/// The outcome a person found at the provider.
#[derive(Deserialize, Clone, Copy, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DecidedOutcome {
    /// The command took effect.
    Succeeded,
    /// It did not.
    Failed,
}

/// `POST /v1/executions/:id/decision` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionIn {
    outcome: DecidedOutcome,
    reason: String,
}

/// `POST /v1/executions/:id/decision`: a member with write rights resolves an unknown outcome.
#[utoipa::path(post, path = "/v1/executions/{id}/decision", operation_id = "executions_decide", tag = "executions", params(("id" = String, Path)), request_body = DecisionIn, responses((status = 200, body = ReceiptDoc), (status = 409, description = "The outcome is not unknown", body = ErrorBody)), security(("bearer" = [])))]
pub async fn decide(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<DecisionIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body?;
    let reason = b.reason.trim().to_string();
    if reason.is_empty() || reason.len() > 2000 {
        return Err(ApiError::invalid("reason must be 1 to 2000 bytes"));
    }
    let outcome = match b.outcome {
        DecidedOutcome::Succeeded => ExecutionState::Succeeded,
        DecidedOutcome::Failed => ExecutionState::Failed,
    };
    let cmd = Command::DecideExecution {
        by: caller.token.id.clone(),
        execution_id: id.clone(),
        outcome,
        reason,
        at_ms: now_ms(),
    };
    propose(&state, cmd).await?;
    state.cluster.read_barrier().await?;
    let now = now_ms();
    let v = state.cluster.state().read(|s| s.executions.get(&id).map(|e| receipt(s, e, &caller, now)));
    v.map(Json).ok_or_else(|| ApiError::not_found("no such execution"))
}
