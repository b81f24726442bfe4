//! Routing of calls on a Computer to the node that holds its agent link: a session or file call
//! that reaches another node is forwarded over HTTP to the owner (found in the replicated
//! directory: the Computer's `link_node`), which authenticates and authorizes it again.

use axum::body::Body;
use axum::extract::Request;
use axum::extract::State;
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;

use super::ApiError;
use super::AppState;

/// Marks a forwarded request, so it is never forwarded twice.
const FORWARDED: &str = "x-computerd-forwarded";
/// The largest body forwarded (a 16 MiB file as base64, plus JSON).
const MAX_BODY: usize = 24 << 20;

/// Forwards the request when another node holds the Computer's link; runs it here otherwise.
pub async fn to_link_owner(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let id = req.uri().path().strip_prefix("/v1/computers/").and_then(|r| r.split('/').next()).map(String::from);
    let Some(id) = id else { return next.run(req).await };
    if req.headers().contains_key(FORWARDED) || state.links.get(&id).is_some() {
        return next.run(req).await;
    }
    let read = || state.cluster.state().read(|s| s.computers.get(&id).and_then(|c| c.link_node));
    let mut owner = read();
    if owner.is_none() && state.cluster.read_barrier().await.is_ok() {
        // This replica may lag behind the link's commit: look again once it is current.
        owner = read();
    }
    let addr = owner
        .filter(|n| *n != state.cluster.id())
        .and_then(|n| state.cluster.view().members.into_iter().find(|m| m.id == n))
        .map(|m| m.addr.http);
    let Some(addr) = addr else { return next.run(req).await };
    match forward(&state, &addr, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn forward(state: &AppState, addr: &str, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError::new(ErrorKind::TooLarge, "the body is too large"))?;
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut rb =
        state.http.request(parts.method.clone(), format!("http://{addr}{path}")).header(FORWARDED, "1").body(bytes);
    for h in [axum::http::header::AUTHORIZATION, axum::http::header::CONTENT_TYPE, axum::http::header::ACCEPT] {
        if let Some(v) = parts.headers.get(&h) {
            rb = rb.header(h, v);
        }
    }
    let resp = rb.send().await.map_err(|e| {
        tracing::warn!(node = %addr, error = %e, "forwarding to the link's node failed");
        ApiError::new(ErrorKind::ComputerExecutionFailed, "the node holding the computer's link did not answer")
    })?;
    let status = resp.status();
    let content_type = resp.headers().get(axum::http::header::CONTENT_TYPE).cloned();
    let body =
        resp.bytes().await.map_err(|_| ApiError::new(ErrorKind::ComputerExecutionFailed, "the answer was cut"))?;
    let mut out = Response::new(Body::from(body));
    *out.status_mut() = status;
    if let Some(ct) = content_type {
        out.headers_mut().insert(axum::http::header::CONTENT_TYPE, ct);
    }
    Ok(out)
}
