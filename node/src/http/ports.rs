//! `PUT/GET/DELETE /v1/computers/:id/ports/:port` and `GET …/ports`: public addresses of a
//! Computer's ports (capability `computers.expose`). The address is answered once, by the
//! `PUT` that made it (the store keeps only its label's hash); a `PUT` again makes a new one
//! and ends the old. The requests to an address are served by [`super::port_proxy`].

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_raft::sm::Command;
use computerd_raft::sm::Exposure;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::propose;
use crate::ids::new_id;
use crate::ids::now_ms;

/// `PUT …/ports/:port` body (optional).
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortIn {
    /// `http` (the default): HTTP/1.1 with streaming bodies, server-sent events and WebSocket
    /// upgrades.
    protocol: Option<String>,
}

fn port_of(s: &str) -> Result<u16, ApiError> {
    s.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| ApiError::invalid("a port is a number from 1 to 65535"))
}

fn view(e: &Exposure) -> Value {
    json!({
        "port": e.port,
        "protocol": e.protocol,
        "state": if e.approval_id.is_some() { "awaiting_approval" } else { "open" },
        "approvalId": e.approval_id,
        "exposedBy": {"memberId": e.member_id, "botId": e.bot_id},
        "createdAt": e.created_at,
    })
}

/// `PUT /v1/computers/:id/ports/:port`
#[utoipa::path(put, path = "/v1/computers/{id}/ports/{port}", operation_id = "ports_put", tag = "ports", params(("id" = String, Path), ("port" = u16, Path)), request_body(content = PortIn, description = "Optional"), responses((status = 200, description = "`{\"port\", \"protocol\", \"url\", \"state\": \"open\"}`: the address, shown this once (anyone with it may use the port)", body = Object), (status = 202, description = "`state: awaiting_approval` with `approvalId`: the address answers once a member approves", body = Object), (status = 422, description = "`ComputerUnsupported`: a paired machine", body = ErrorBody)), security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, port)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let caller = auth.for_write(&state).await?;
    let port = port_of(&port)?;
    let b: PortIn = if body.iter().all(u8::is_ascii_whitespace) {
        PortIn::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("bad body: {e}")))?
    };
    let protocol = b.protocol.unwrap_or_else(|| "http".into());
    if protocol != "http" {
        return Err(ApiError::invalid("protocol must be \"http\""));
    }
    let label = crate::ports::new_label();
    let cmd = Command::ExposePort {
        by: caller.token.id.clone(),
        computer_id: id,
        port,
        protocol: protocol.clone(),
        label_hash: computerd_raft::sm::hash_secret(&label),
        approval_id: new_id("apr"),
        at_ms: now_ms(),
    };
    let approval = propose(&state, cmd).await?;
    let url = state.public_domain.url(port, &label);
    let mut out = json!({"port": port, "protocol": protocol, "url": url, "state": "open"});
    match approval {
        None => Ok(Json(out).into_response()),
        Some(a) => {
            out["state"] = json!("awaiting_approval");
            out["approvalId"] = json!(a);
            Ok((StatusCode::ACCEPTED, Json(out)).into_response())
        }
    }
}

/// `GET /v1/computers/:id/ports`
#[utoipa::path(get, path = "/v1/computers/{id}/ports", operation_id = "ports_list", tag = "ports", params(("id" = String, Path)), responses((status = 200, description = "`{\"ports\": [...]}`: each port's protocol, state and exposer (never its address)", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let ports = state.cluster.state().read(|s| {
        s.visible_computer(&caller, &id)?;
        Ok::<_, computerd_raft::sm::Reject>(s.ports.of(&id).into_iter().map(view).collect::<Vec<_>>())
    })?;
    Ok(Json(json!({ "ports": ports })))
}

/// `GET /v1/computers/:id/ports/:port`
#[utoipa::path(get, path = "/v1/computers/{id}/ports/{port}", operation_id = "ports_get", tag = "ports", params(("id" = String, Path), ("port" = u16, Path)), responses((status = 200, body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, port)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let port = port_of(&port)?;
    let found = state.cluster.state().read(|s| {
        s.visible_computer(&caller, &id)?;
        Ok::<_, computerd_raft::sm::Reject>(s.ports.of(&id).into_iter().find(|e| e.port == port).map(view))
    })?;
    found.map(Json).ok_or_else(|| ApiError::not_found("this port is not exposed"))
}

/// `DELETE /v1/computers/:id/ports/:port`
#[utoipa::path(delete, path = "/v1/computers/{id}/ports/{port}", operation_id = "ports_delete", tag = "ports", params(("id" = String, Path), ("port" = u16, Path)), responses((status = 204, description = "The address ended (every node refuses it from now on)"), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    auth: Auth,
    Path((id, port)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let caller = auth.for_write(&state).await?;
    let port = port_of(&port)?;
    propose(&state, Command::UnexposePort { by: caller.token.id.clone(), computer_id: id, port, at_ms: now_ms() })
        .await?;
    // Ended at once: every node has applied it before the answer (each node checks an address
    // at its own replica, request by request).
    state.owners.catch_up_all(std::time::Duration::from_secs(2)).await;
    Ok(StatusCode::NO_CONTENT)
}
