//! Routing of calls on a Computer to the node that owns it (holds its agent link): a session or
//! file call that reaches another node is forwarded over gRPC (`Routing.Forward`, streamed both
//! ways) to the owner named in the replicated directory (the Computer's `link_node`), which
//! authenticates and authorizes it again (`crate::routing`). A stale directory entry is answered
//! `NotOwner{current}` before any of the body is sent; the call then goes once to the node
//! named, and callers never see it. The request body is held back until the owner accepted the
//! head, so a redirected call still has all of it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use axum::body::Body;
use axum::extract::Request;
use axum::extract::State;
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;
use computerd_proto::cluster::RouteChunk;
use computerd_proto::cluster::RouteHead;
use computerd_proto::cluster::routing_client::RoutingClient;
use futures::StreamExt;

use super::ApiError;
use super::AppState;
use crate::routing::FORWARDED;
use crate::routing::MAX_ROUTE_MESSAGE;
use crate::routing::OWNER;
use crate::routing::computer_of;

/// Headers a routed call carries.
const PASSED: [axum::http::HeaderName; 3] =
    [axum::http::header::AUTHORIZATION, axum::http::header::CONTENT_TYPE, axum::http::header::ACCEPT];

/// Forwards the request when another node holds the Computer's link; runs it here otherwise.
pub async fn to_link_owner(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(id) = computer_of(req.uri().path()).map(String::from) else { return next.run(req).await };
    if req.headers().contains_key(FORWARDED) || state.links.get(&id).is_some() {
        return next.run(req).await;
    }
    let read = || state.cluster.state().read(|s| s.computers.get(&id).and_then(|c| c.link_node));
    let mut owner = read();
    if owner.is_none() && state.cluster.read_barrier().await.is_ok() {
        // This replica may lag behind the link's commit: look again once it is current.
        owner = read();
    }
    let Some(owner) = owner.filter(|n| *n != state.cluster.id()) else { return next.run(req).await };
    let (parts, body) = req.into_parts();
    let body = Arc::new(Mutex::new(Some(body)));
    let mut target = owner;
    for attempt in 0..2 {
        match forward(&state, target, &parts, body.clone()).await {
            Ok(r) => return r,
            Err(Routed::NotOwner(Some(current))) if attempt == 0 && current != state.cluster.id() => {
                tracing::debug!(computer_id = %id, stale = target, current, "routing directory was stale; retrying once");
                target = current;
            }
            Err(Routed::NotOwner(_)) => break,
            Err(Routed::Failed(e)) => return e.into_response(),
        }
    }
    // No other node holds it: run the call here (it answers that the agent is not connected, or
    // waits for it when the Computer is resuming).
    let body = body.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or_else(Body::empty);
    next.run(Request::from_parts(parts, body)).await
}

enum Routed {
    NotOwner(Option<u64>),
    Failed(ApiError),
}

fn unreachable_owner(node: u64, why: impl std::fmt::Display) -> Routed {
    tracing::warn!(node, error = %why, "forwarding to the link's node failed");
    Routed::Failed(ApiError::new(
        ErrorKind::ComputerExecutionFailed,
        "the node holding the computer's link did not answer",
    ))
}

async fn forward(
    state: &AppState,
    node: u64,
    parts: &axum::http::request::Parts,
    body: Arc<Mutex<Option<Body>>>,
) -> Result<Response, Routed> {
    let addr = state
        .cluster
        .view()
        .members
        .into_iter()
        .find(|m| m.id == node)
        .map(|m| m.addr.grpc)
        .ok_or(Routed::NotOwner(None))?;
    let channel = state.cluster.channels().channel(&addr).map_err(|e| unreachable_owner(node, e))?;
    let mut client = RoutingClient::new(channel)
        .max_decoding_message_size(MAX_ROUTE_MESSAGE + 4096)
        .max_encoding_message_size(MAX_ROUTE_MESSAGE + 4096);
    let mut headers = HashMap::new();
    for h in PASSED {
        if let Some(v) = parts.headers.get(&h).and_then(|v| v.to_str().ok()) {
            headers.insert(h.as_str().to_string(), v.to_string());
        }
    }
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_string();
    let head = RouteChunk {
        head: Some(RouteHead { method: parts.method.as_str().to_string(), path, headers, status: 0 }),
        body: Vec::new(),
    };
    // The body follows the head only once the owner accepted it (its answer's head arrived).
    let (accepted_tx, accepted_rx) = tokio::sync::oneshot::channel::<()>();
    let held = body.clone();
    let rest = futures::stream::once(accepted_rx).flat_map(move |accepted| {
        let body = if accepted.is_ok() { held.lock().unwrap_or_else(|p| p.into_inner()).take() } else { None };
        let frames = futures::stream::iter(body.map(|b| b.into_data_stream())).flatten();
        // A cut request body ends the stream early; the owner's handler sees a short body.
        frames.take_while(|f| std::future::ready(f.is_ok())).flat_map(|f| {
            let bytes = f.unwrap_or_default();
            futures::stream::iter(
                bytes
                    .chunks(MAX_ROUTE_MESSAGE)
                    .map(|c| RouteChunk { head: None, body: c.to_vec() })
                    .collect::<Vec<_>>(),
            )
        })
    });
    let outgoing = futures::stream::once(async { head }).chain(rest);
    let mut replies = match client.forward(outgoing).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == tonic::Code::FailedPrecondition => {
            let current = s.metadata().get(OWNER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
            return Err(Routed::NotOwner(current));
        }
        Err(s) => return Err(unreachable_owner(node, s)),
    };
    let _ = accepted_tx.send(());
    let first = match replies.message().await {
        Ok(Some(c)) => c.head.ok_or_else(|| unreachable_owner(node, "an answer without a head"))?,
        Ok(None) => return Err(unreachable_owner(node, "an empty answer")),
        Err(s) => return Err(unreachable_owner(node, s)),
    };
    let status = axum::http::StatusCode::from_u16(first.status as u16)
        .map_err(|_| unreachable_owner(node, format!("a bad status {}", first.status)))?;
    let stream =
        replies.map(|c| c.map(|c| bytes::Bytes::from(c.body)).map_err(|s| std::io::Error::other(s.to_string())));
    let mut out = Response::new(Body::from_stream(stream));
    *out.status_mut() = status;
    if let Some(ct) = first.headers.get("content-type").and_then(|v| v.parse().ok()) {
        out.headers_mut().insert(axum::http::header::CONTENT_TYPE, ct);
    }
    Ok(out)
}
