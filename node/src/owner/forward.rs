//! The sending end of a routed HTTP call (sessions, files): the call's head goes to the owner over
//! `Routing.Forward`, then its body, streamed; the answer's head and body stream back. The body is
//! held back until the owner took the head, so a call sent on once (a stale view) still has all
//! of it, and so does a call that runs here after all.
//!
//! A forwarded answer names the node that served it (`x-computerd-served-by`) and how many times
//! a stale view sent it on (`x-computerd-reroutes`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use axum::body::Body;
use axum::http::HeaderValue;
use axum::http::request::Parts;
use axum::response::Response;
use computerd_proto::cluster::RouteChunk;
use computerd_proto::cluster::RouteHead;
use computerd_raft::NodeId;
use futures::StreamExt;

use super::CallError;
use super::MAX_ROUTE_MESSAGE;
use super::Miss;
use super::Owners;

/// Headers a routed call carries.
const PASSED: [axum::http::HeaderName; 3] =
    [axum::http::header::AUTHORIZATION, axum::http::header::CONTENT_TYPE, axum::http::header::ACCEPT];

/// The node that served a forwarded call.
pub const SERVED_BY: &str = "x-computerd-served-by";
/// How many times a stale view sent a forwarded call on.
pub const REROUTES: &str = "x-computerd-reroutes";

/// A request body that is sent at most once, to whichever node takes the call (or kept for this
/// node when none does).
pub type HeldBody = Arc<Mutex<Option<Body>>>;

/// Takes what is left of a held body.
pub fn take(body: &HeldBody) -> Body {
    body.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or_else(Body::empty)
}

/// Forwards the call to `owner` (following one stale view).
pub async fn forward(owners: &Owners, owner: NodeId, parts: &Parts, body: HeldBody) -> Result<Response, Miss> {
    let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_string();
    let kind = super::kind_of_path(&path);
    let mut headers = HashMap::new();
    for h in PASSED {
        if let Some(v) = parts.headers.get(&h).and_then(|v| v.to_str().ok()) {
            headers.insert(h.as_str().to_string(), v.to_string());
        }
    }
    let head = RouteHead { method: parts.method.as_str().to_string(), path, headers, status: 0 };
    // Each attempt tells the body to follow once its head was taken.
    let accepted: Arc<Mutex<Option<tokio::sync::oneshot::Sender<()>>>> = Arc::default();
    let reached = owners
        .reach(owner, kind, |mut client, deadline| {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            *accepted.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
            let first = RouteChunk { head: Some(head.clone()), body: Vec::new() };
            let mut req =
                tonic::Request::new(futures::stream::once(async { first }).chain(held_body(rx, body.clone())));
            req.set_timeout(deadline);
            async move { client.forward(req).await }
        })
        .await?;
    if let Some(tx) = accepted.lock().unwrap_or_else(|p| p.into_inner()).take() {
        let _ = tx.send(());
    }
    let node = reached.node;
    let mut replies = super::until(reached.value, reached.deadline, node);
    let first = match replies.next().await {
        Some(Ok(c)) => c.head.ok_or_else(|| CallError::unreachable(node, "an answer without a head")),
        Some(Err(e)) => Err(e),
        None => Err(CallError::unreachable(node, "an empty answer")),
    }
    .map_err(Miss::Failed)?;
    let status = axum::http::StatusCode::from_u16(first.status as u16)
        .map_err(|_| Miss::Failed(CallError::unreachable(node, format!("a bad status {}", first.status))))?;
    let stream = replies.map(|c| match c {
        Ok(c) => Ok(bytes::Bytes::from(c.body)),
        Err(e) => Err(std::io::Error::other(e.message)),
    });
    let mut out = Response::new(Body::from_stream(stream));
    *out.status_mut() = status;
    if let Some(ct) = first.headers.get("content-type").and_then(|v| v.parse().ok()) {
        out.headers_mut().insert(axum::http::header::CONTENT_TYPE, ct);
    }
    out.headers_mut().insert(SERVED_BY, HeaderValue::from(node));
    out.headers_mut().insert(REROUTES, HeaderValue::from(reached.reroutes));
    Ok(out)
}

/// The body's chunks, sent once `accepted` fires (never for an attempt that was not taken).
fn held_body(
    accepted: tokio::sync::oneshot::Receiver<()>,
    held: HeldBody,
) -> impl futures::Stream<Item = RouteChunk> + Send + 'static {
    futures::stream::once(accepted).flat_map(move |accepted| {
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
    })
}
