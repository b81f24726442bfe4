//! Capability approvals (`GET/POST /v1/approvals`) and the capability rules
//! (`GET/PUT /v1/capability-rules`).

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use computerd_raft::sm::Command;
use computerd_raft::sm::Rule;
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
use super::util::Body;
use super::util::propose;
use crate::ids::now_ms;

/// `GET /v1/approvals`: those the caller may decide, and those its bot asked for.
#[utoipa::path(get, path = "/v1/approvals", operation_id = "approvals_list", tag = "capabilities", responses((status = 200, description = "`{\"approvals\": [...]}`", body = Object)), security(("bearer" = [])))]
pub async fn list(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let rows: Vec<Value> = state.cluster.state().read(|s| {
        s.approvals
            .values()
            .filter(|a| {
                s.can_decide_approval(&caller, a)
                    || (caller.bot.is_some() && a.requester.bot_id == caller.bot.as_ref().map(|b| b.id.clone()))
            })
            .map(|a| json!(a))
            .collect()
    });
    Ok(Json(json!({ "approvals": rows })))
}

/// `POST /v1/approvals/:id` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideIn {
    decision: ApprovalDecision,
}

/// Approve or reject.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalDecision {
    /// Let it run.
    Approve,
    /// Refuse it.
    Reject,
}

/// `POST /v1/approvals/:id`
#[utoipa::path(post, path = "/v1/approvals/{id}", operation_id = "approvals_decide", tag = "capabilities", params(("id" = String, Path)), request_body = DecideIn, responses((status = 200, description = "The approval", body = Object)), security(("bearer" = [])))]
pub async fn decide(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<DecideIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body?;
    let approve = b.decision == ApprovalDecision::Approve;
    // A bot's egress request: the policy is applied before the approval is recorded, so an
    // approval that could not take effect stays pending (and says why).
    let asked = state.cluster.state().read(|s| {
        s.approvals
            .get(&id)
            .filter(|a| a.state == "pending" && a.capability == computerd_raft::sm::Capability::Egress)
            .and_then(|a| a.egress.clone().map(|p| (a.target.clone(), p)))
    });
    if approve && let Some((computer, policy)) = &asked {
        caller.check_writable()?;
        super::egress::apply(&state, &caller, computer, policy).await?;
    }
    let cmd =
        Command::DecideApproval { by: caller.token.id.clone(), approval_id: id.clone(), approve, at_ms: now_ms() };
    propose(&state, cmd).await?;
    state.cluster.read_barrier().await?;
    let a = state.cluster.state().read(|s| s.approvals.get(&id).cloned());
    a.map(|a| Json(json!(a))).ok_or_else(|| ApiError::not_found("no such approval"))
}

/// `GET /v1/capability-rules` (owner/admin)
#[utoipa::path(get, path = "/v1/capability-rules", operation_id = "approvals_get_rules", tag = "capabilities", responses((status = 200, description = "`{\"rules\": [...], \"default\": bool}`", body = Object)), security(("bearer" = [])))]
pub async fn get_rules(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.current(&state).await?.check_admin_read()?;
    let (rules, custom) = state.cluster.state().read(|s| (s.rules(), s.rules.is_some()));
    Ok(Json(json!({ "rules": rules, "default": !custom })))
}

/// `PUT /v1/capability-rules` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RulesIn {
    #[schema(value_type = Vec<Object>)]
    rules: Vec<Rule>,
}

/// `PUT /v1/capability-rules` (owner/admin): replaces the rules; the first match decides.
#[utoipa::path(put, path = "/v1/capability-rules", operation_id = "approvals_put_rules", tag = "capabilities", request_body = RulesIn, responses((status = 200, body = Object)), security(("bearer" = [])))]
pub async fn put_rules(
    State(state): State<AppState>,
    auth: Auth,
    body: Body<RulesIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    caller.check_admin_write()?;
    let Json(b) = body?;
    if b.rules.len() > 1000 {
        return Err(ApiError::invalid("at most 1000 rules"));
    }
    propose(&state, Command::SetRules { by: caller.token.id.clone(), rules: b.rules.clone() }).await?;
    Ok(Json(json!({ "rules": b.rules, "default": false })))
}
