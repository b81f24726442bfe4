//! The agent's routes: pairing (`POST /v1/agent/pair`, the code is the credential) and the link
//! (`GET /v1/agent/link`, a WebSocket), and a pooled sandbox's wait for its identity
//! (`GET /v1/agent/pool`, a WebSocket).

use axum::Json;
use axum::extract::State;
use axum::extract::WebSocketUpgrade;
use axum::response::Response;
use computerd_proto::ErrorKind;
use computerd_raft::sm::Command;
use computerd_raft::sm::hash_secret;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::Body;
use super::util::propose;
use crate::ids::now_ms;

/// `POST /v1/agent/pair` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PairIn {
    code: String,
}

/// `POST /v1/agent/pair`: trades a one-time pairing code for a machine credential (answered
/// once; only its hash is stored).
#[utoipa::path(post, path = "/v1/agent/pair", operation_id = "agent_pair", tag = "agent", request_body = PairIn, responses((status = 200, description = "`{\"computerId\", \"credential\"}` (answered once)", body = Object), (status = 401, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn pair(State(state): State<AppState>, body: Body<PairIn>) -> Result<Json<Value>, ApiError> {
    let Json(b) = body?;
    let code = b.code.trim().to_ascii_uppercase();
    if code.is_empty() || code.len() > 32 {
        return Err(ApiError::new(ErrorKind::Unauthorized, "the pairing code is not valid"));
    }
    let credential = format!("cda_{}", hex::encode(rand::random::<[u8; 32]>()));
    let cmd = Command::RedeemPairing { code, credential_hash: hash_secret(&credential), at_ms: now_ms() };
    let computer_id =
        propose(&state, cmd).await?.ok_or_else(|| ApiError::new(ErrorKind::Internal, "the store named no computer"))?;
    Ok(Json(json!({ "computerId": computer_id, "credential": credential })))
}

/// `GET /v1/agent/link`: upgrades to the agent's WebSocket.
#[utoipa::path(get, path = "/v1/agent/link", operation_id = "agent_link", tag = "agent", responses((status = 101, description = "WebSocket upgrade; the first message is `{\"computerId\", \"credential\"}`")))]
pub async fn link(State(state): State<AppState>, ws: WebSocketUpgrade) -> Response {
    // Small read buffers: an idle link should cost little memory (the default is 128 KiB).
    ws.max_message_size(1 << 20)
        .read_buffer_size(4 * 1024)
        .on_upgrade(move |socket| crate::link_handshake::handle(state, socket))
}

/// `GET /v1/agent/pool`: upgrades to a pooled agent's wait for its identity.
#[utoipa::path(get, path = "/v1/agent/pool", operation_id = "agent_pool", tag = "agent", responses((status = 101, description = "WebSocket upgrade; the first message is `{\"poolId\", \"token\", \"protocol\"}`, the one answer `{\"computerId\", \"pairingCode\", \"env\", \"firstUid\"}` once a create claims the sandbox, or `{\"error\"}`")))]
pub async fn pool(State(state): State<AppState>, ws: WebSocketUpgrade) -> Response {
    ws.max_message_size(4096).read_buffer_size(4 * 1024).on_upgrade(move |socket| crate::pool::wait(state, socket))
}
