//! The desktop of a Computer: `POST …/desktop/screenshot`, `POST …/desktop/actions`,
//! `POST …/desktop/release` and `GET …/desktop`. The request is checked here (its shape, its
//! counts and bounds) before it leaves, then again by the agent against the live screen, which
//! answers. They run on the node holding the Computer's link, like session and file calls.
//!
//! A Computer created without a desktop answers `ComputerUnsupported` here; a paired machine's
//! agent answers it too unless its owner opted in (`--desktop-display`). Actions take the
//! Computer's input lease in the caller's name (`bot:<id>` or `member:<id>`): another caller
//! meets `409 InputBusy` naming the holder.
//!
//! A screenshot is answered as JSON with the image in base64 (`data`), or as the image's bytes
//! when the request's `Accept` names only image types (`image/png`, `image/*`), with its size in
//! `X-Width` and `X-Height`.

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::Response;
use base64::Engine;
use computerd_proto::ErrorKind;
use computerd_proto::agent::DesktopCall;
use computerd_proto::desktop::ActionsRequest;
use computerd_proto::desktop::DesktopOp;
use computerd_proto::desktop::ScreenshotRequest;
use computerd_raft::sm::Caller;
use computerd_raft::sm::Source;
use serde_json::Value;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::calls::agent_for;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::Body;
use crate::owner::CallError;

/// Who acts, as the input lease names it.
pub fn actor_of(c: &Caller) -> String {
    match &c.bot {
        Some(b) => format!("bot:{}", b.id),
        None => format!("member:{}", c.member.id),
    }
}

/// A Computer created without a desktop has none (a paired machine's agent decides itself).
pub(super) fn check_has_desktop(state: &AppState, caller: &Caller, id: &str) -> Result<(), ApiError> {
    state.cluster.state().read(|s| {
        let c = s.visible_computer(caller, id)?;
        if matches!(c.source, Source::Provider { .. }) && !c.desktop {
            return Err(ApiError::new(
                ErrorKind::ComputerUnsupported,
                "this computer was created without a desktop (create one with \"desktop\": true)",
            ));
        }
        Ok(())
    })
}

/// Sends `op` to the agent; answers its JSON and image.
async fn run(
    state: &AppState,
    caller: &Caller,
    id: &str,
    op: &DesktopOp,
    write: bool,
) -> Result<(Value, Vec<u8>), ApiError> {
    check_has_desktop(state, caller, id)?;
    let json = serde_json::to_string(op).map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    let mut agent = agent_for(state, caller, id, write).await?;
    let reply = agent
        .desktop(DesktopCall { json, caller: actor_of(caller) })
        .await
        .map_err(|s| ApiError::from(CallError::from_status(s)))?
        .into_inner();
    let value: Value = serde_json::from_str(&reply.json)
        .map_err(|_| ApiError::new(ErrorKind::ComputerExecutionFailed, "the agent's desktop answer is not JSON"))?;
    Ok((value, reply.image))
}

pub(super) fn with_image(mut shot: Value, image: &[u8]) -> Value {
    shot["data"] = Value::String(base64::engine::general_purpose::STANDARD.encode(image));
    shot
}

/// Whether the caller asked for the bytes of the image (an `Accept` naming only image types).
pub(super) fn wants_bytes(headers: &HeaderMap) -> bool {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else { return false };
    let types: Vec<&str> = accept.split(',').map(|t| t.split(';').next().unwrap_or("").trim()).collect();
    !types.is_empty() && types.iter().all(|t| t.starts_with("image/"))
}

/// `POST /v1/computers/:id/desktop/screenshot`
#[utoipa::path(post, path = "/v1/computers/{id}/desktop/screenshot", operation_id = "desktop_screenshot", tag = "desktop", params(("id" = String, Path)), request_body(content = Object, description = "`{\"format\": \"png\"|\"webp\"|\"jpeg\", \"scale\"?: (0,1], \"region\"?: {x,y,width,height}, \"quality\"?: 1..100 (jpeg)}`; `{}` is a PNG of the whole screen"), responses((status = 200, description = "`{\"width\", \"height\", \"format\", \"mimeType\", \"size\", \"data\"}` (base64), or the image's bytes with `Accept: image/*`", body = Object), (status = 400, body = ErrorBody), (status = 422, description = "`ComputerUnsupported`: no desktop", body = ErrorBody)), security(("bearer" = [])))]
pub async fn screenshot(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body<ScreenshotRequest>,
) -> Result<Response, ApiError> {
    let caller = auth.current(&state).await?;
    let Json(req) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    computerd_proto::desktop::check_screenshot(&req).map_err(ApiError::invalid)?;
    let mime = req.format.mime();
    let (shot, image) = run(&state, &caller, &id, &DesktopOp::Screenshot(req), false).await?;
    if wants_bytes(&headers) {
        let dim = |k: &str| shot[k].as_u64().unwrap_or(0).to_string();
        let (w, h) = (dim("width"), dim("height"));
        return Ok((
            [
                (header::CONTENT_TYPE, mime.to_string()),
                (header::HeaderName::from_static("x-width"), w),
                (header::HeaderName::from_static("x-height"), h),
            ],
            image,
        )
            .into_response());
    }
    Ok(Json(with_image(shot, &image)).into_response())
}

/// `POST /v1/computers/:id/desktop/actions`
#[utoipa::path(post, path = "/v1/computers/{id}/desktop/actions", operation_id = "desktop_actions", tag = "desktop", params(("id" = String, Path)), request_body(content = Object, description = "`{\"actions\": [{\"type\": \"move\"|\"click\"|\"drag\"|\"scroll\"|\"type\"|\"key\"|\"wait\", ...}], \"screenshot\": true|false|{...}}`: sent in order with XTest; every coordinate is checked against the screen first"), responses((status = 200, description = "`{\"results\": [{\"index\", \"type\", \"ok\"}], \"screenshot\": {width, height, format, mimeType, data}|null}`", body = Object), (status = 400, body = ErrorBody), (status = 409, description = "`InputBusy`: someone else holds the input lease", body = ErrorBody), (status = 422, body = ErrorBody)), security(("bearer" = [])))]
pub async fn actions(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<ActionsRequest>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let Json(req) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    computerd_proto::desktop::check_actions(&req).map_err(ApiError::invalid)?;
    let (mut answer, image) = run(&state, &caller, &id, &DesktopOp::Actions(req), true).await?;
    if answer["screenshot"].is_object() {
        answer["screenshot"] = with_image(answer["screenshot"].take(), &image);
    }
    Ok(Json(answer))
}

/// `POST /v1/computers/:id/desktop/release`
#[utoipa::path(post, path = "/v1/computers/{id}/desktop/release", operation_id = "desktop_release", tag = "desktop", params(("id" = String, Path)), responses((status = 200, description = "`{\"released\": bool}`: whether the caller held the lease", body = Object), (status = 409, description = "`InputBusy`: someone else holds it", body = ErrorBody)), security(("bearer" = [])))]
pub async fn release(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    Ok(Json(run(&state, &caller, &id, &DesktopOp::Release, true).await?.0))
}

/// `GET /v1/computers/:id/desktop`
#[utoipa::path(get, path = "/v1/computers/{id}/desktop", operation_id = "desktop_status", tag = "desktop", params(("id" = String, Path)), responses((status = 200, description = "`{\"display\", \"width\", \"height\", \"state\", \"capture\", \"stream\", \"lease\": {holder, expiresInMs}|null}`", body = Object), (status = 422, body = ErrorBody)), security(("bearer" = [])))]
pub async fn status(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    Ok(Json(run(&state, &caller, &id, &DesktopOp::Status, false).await?.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_bytes_only_when_only_images_are_accepted() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::ACCEPT, v.parse().expect("header"));
            m
        };
        assert!(wants_bytes(&h("image/png")));
        assert!(wants_bytes(&h("image/*;q=0.9, image/webp")));
        assert!(!wants_bytes(&h("application/json")));
        assert!(!wants_bytes(&h("image/png, application/json")));
        assert!(!wants_bytes(&HeaderMap::new()));
    }
}
