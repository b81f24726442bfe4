//! The organization's caps (`GET/PUT /v1/limits`): live bots per member, bots in all and
//! not-deleted Computers per member (`computerd_raft::sm::Limits`). Each has a default and a hard
//! ceiling; a lowered cap refuses new records past it and removes nothing.

use axum::Json;
use axum::extract::State;
use computerd_raft::sm::CEILING_BOTS;
use computerd_raft::sm::CEILING_LIVE_COMPUTERS_PER_MEMBER;
use computerd_raft::sm::Command;
use computerd_raft::sm::Limits;
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

fn view(l: &Limits) -> Value {
    json!({
        "liveBotsPerMember": l.live_bots_per_member(),
        "bots": l.bots(),
        "liveComputersPerMember": l.live_computers_per_member(),
        "ceilings": {
            "liveBotsPerMember": CEILING_BOTS,
            "bots": CEILING_BOTS,
            "liveComputersPerMember": CEILING_LIVE_COMPUTERS_PER_MEMBER,
        },
    })
}

/// `GET /v1/limits` (owner/admin)
#[utoipa::path(get, path = "/v1/limits", operation_id = "limits_get", tag = "limits", responses((status = 200, description = "`{\"liveBotsPerMember\", \"bots\", \"liveComputersPerMember\", \"ceilings\"}`: the caps in force and how high each may be set", body = Object), (status = 403, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.current(&state).await?.check_admin_read()?;
    Ok(Json(view(&state.cluster.state().read(|s| s.limits))))
}

/// `PUT /v1/limits` body: a field left out goes back to its default.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitsIn {
    /// Live (not archived) bots per member (default 1,000; 1 to 1,000,000).
    live_bots_per_member: Option<u64>,
    /// Bots in all, archived ones included (default 100,000; 1 to 1,000,000).
    bots: Option<u64>,
    /// Not-deleted Computers per member (default 10,000; 1 to 100,000).
    live_computers_per_member: Option<u64>,
}

/// `PUT /v1/limits` (owner/admin): sets the caps. Records past a lowered cap stay; new ones are
/// refused as a conflict.
#[utoipa::path(put, path = "/v1/limits", operation_id = "limits_put", tag = "limits", request_body = LimitsIn, responses((status = 200, description = "The caps in force", body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)), security(("bearer" = [])))]
pub async fn put(State(state): State<AppState>, auth: Auth, body: Body<LimitsIn>) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    caller.check_admin_write()?;
    let Json(b) = body?;
    let limits = Limits {
        live_bots_per_member: b.live_bots_per_member,
        bots: b.bots,
        live_computers_per_member: b.live_computers_per_member,
    };
    limits.check().map_err(|r| ApiError::invalid(r.message))?;
    propose(&state, Command::SetLimits { by: caller.token.id.clone(), limits }).await?;
    Ok(Json(view(&limits)))
}
