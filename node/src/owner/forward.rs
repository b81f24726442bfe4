//! The sending end of a routed HTTP call (sessions, files): the call's head goes to the owner over
//! `Routing.Forward`, then its body, streamed; the answer's head and body stream back. The body is
//! held back until the owner took the head, so a call sent on once (a stale view) still has all
//! of it, and so does a call that runs here after all.
//!
//! A forwarded answer names the node that served it (`x-computerd-served-by`) and how many times
//! a stale view sent it on (`x-computerd-reroutes`).
//!
//! A routed call carries the request headers its route needs, and its answer the headers its
//! route answers with: an allowlist per kind of route ([`Route`]), applied by both ends. A header
//! sent more than once travels as one value, its values joined by `\n` (which no header value
//! can hold), and is split again at the other end.

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

/// The kind of a routed HTTP call, for the headers it carries each way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A call with a bearer token: sessions, files, desktop, browser.
    Api,
    /// A session's output stream (server-sent events), resumed with `Last-Event-ID`.
    Events,
    /// A person's desktop viewer: the ticket's redemption (answered with its cookie and a
    /// redirect) and noVNC's files (asked for with the cookie); no token.
    Viewer,
}

impl Route {
    /// The kind of the call to `path` (`/v1/computers/{id}/…`).
    pub fn of_path(path: &str) -> Route {
        let rest = super::computer_path(path).map(|(_, rest)| rest).unwrap_or_default();
        if rest == "desktop/view" || rest.starts_with("desktop/view/") {
            Route::Viewer
        } else if rest.starts_with("sessions/") && rest.ends_with("/output") {
            Route::Events
        } else {
            Route::Api
        }
    }

    /// The request headers the owner gets. `X-Forwarded-Host` is the client's, or else the
    /// `Host` the client addressed (so a URL the owner makes names the host the client used).
    pub fn request_headers(self) -> &'static [&'static str] {
        match self {
            Route::Api => &["authorization", "content-type", "accept", "x-forwarded-proto", "x-forwarded-host"],
            Route::Events => &["authorization", "accept", "last-event-id", "x-forwarded-proto", "x-forwarded-host"],
            Route::Viewer => &["cookie", "accept", "x-forwarded-proto", "x-forwarded-host"],
        }
    }

    /// The answer's headers the client gets.
    pub fn answer_headers(self) -> &'static [&'static str] {
        match self {
            Route::Api => &["content-type", "cache-control", "retry-after", "x-width", "x-height"],
            Route::Events => &["content-type", "cache-control"],
            Route::Viewer => &["content-type", "cache-control", "location", "set-cookie"],
        }
    }
}

/// The values of `names` in `from`, each name's values joined by `\n` (values that are not
/// visible ASCII are left out).
pub fn pack(from: &axum::http::HeaderMap, names: &[&'static str]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for name in names {
        let values: Vec<&str> = from.get_all(*name).iter().filter_map(|v| v.to_str().ok()).collect();
        if !values.is_empty() {
            out.insert(name.to_string(), values.join("\n"));
        }
    }
    out
}

/// The headers of `packed` that `names` allows, each value split again (a value that is not a
/// header value is dropped).
pub fn unpack(packed: &HashMap<String, String>, names: &[&'static str]) -> Vec<(axum::http::HeaderName, HeaderValue)> {
    let mut out = Vec::new();
    for (k, v) in packed {
        let k = k.to_ascii_lowercase();
        let Some(name) = names.iter().find(|n| **n == k) else { continue };
        for value in v.split('\n') {
            if let Ok(value) = HeaderValue::from_str(value) {
                out.push((axum::http::HeaderName::from_static(name), value));
            }
        }
    }
    out
}

/// The request headers a call of `route` carries to the owner.
fn request_head(route: Route, parts: &Parts) -> HashMap<String, String> {
    let mut headers = pack(&parts.headers, route.request_headers());
    if !headers.contains_key("x-forwarded-host") {
        let host = parts.headers.get(axum::http::header::HOST).and_then(|v| v.to_str().ok());
        if let Some(host) = host.or_else(|| parts.uri.authority().map(|a| a.as_str())) {
            headers.insert("x-forwarded-host".to_string(), host.to_string());
        }
    }
    headers
}

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
    let route = Route::of_path(&path);
    let headers = request_head(route, parts);
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
    for (name, value) in unpack(&first.headers, route.answer_headers()) {
        out.headers_mut().append(name, value);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36, item 8: each kind of route carries its own headers, both ways, several values
    /// of one header included, and nothing else.
    #[test]
    fn i36_8_each_route_carries_its_headers() {
        let id = "/v1/computers/c1";
        assert_eq!(Route::of_path(&format!("{id}/desktop/view?ticket=t")), Route::Viewer);
        assert_eq!(Route::of_path(&format!("{id}/desktop/view/vnc.html")), Route::Viewer);
        assert_eq!(Route::of_path(&format!("{id}/sessions/s1/output?fromOffset=3")), Route::Events);
        assert_eq!(Route::of_path(&format!("{id}/desktop/stream")), Route::Api);
        assert_eq!(Route::of_path(&format!("{id}/files?path=a")), Route::Api);

        let req = axum::http::Request::builder()
            .uri(format!("{id}/desktop/view/vnc.html"))
            .header("host", "node2.example:8080")
            .header("cookie", "a=1")
            .header("cookie", "computerd_stream=s")
            .header("authorization", "Bearer t")
            .header("x-forwarded-proto", "https")
            .header("x-computerd-forwarded", "1")
            .body(())
            .expect("request");
        let (parts, ()) = req.into_parts();
        let head = request_head(Route::Viewer, &parts);
        let mut keys: Vec<&str> = head.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["cookie", "x-forwarded-host", "x-forwarded-proto"], "{head:?}");
        assert_eq!(head["x-forwarded-host"], "node2.example:8080");
        let back = unpack(&head, Route::Viewer.request_headers());
        let cookies: Vec<&HeaderValue> = back.iter().filter(|(k, _)| k == "cookie").map(|(_, v)| v).collect();
        assert_eq!(cookies, ["a=1", "computerd_stream=s"]);
        // An API call carries its token and no cookie; an event stream its Last-Event-ID.
        let api = request_head(Route::Api, &parts);
        assert!(api.contains_key("authorization") && !api.contains_key("cookie"), "{api:?}");
        let mut h = axum::http::HeaderMap::new();
        h.insert("last-event-id", "42".parse().expect("v"));
        assert_eq!(pack(&h, Route::Events.request_headers())["last-event-id"], "42");
        assert!(pack(&h, Route::Api.request_headers()).is_empty());

        // Answers: a viewer's cookies (two) and redirect; an API call's image sizes.
        let mut answer = axum::http::HeaderMap::new();
        answer.append("set-cookie", "a=1; Path=/".parse().expect("v"));
        answer.append("set-cookie", "b=2; Secure".parse().expect("v"));
        answer.insert("location", "/v1/computers/c1/desktop/view/vnc.html".parse().expect("v"));
        answer.insert("x-width", "1280".parse().expect("v"));
        let packed = pack(&answer, Route::Viewer.answer_headers());
        let back = unpack(&packed, Route::Viewer.answer_headers());
        assert_eq!(back.iter().filter(|(k, _)| k == "set-cookie").count(), 2, "{back:?}");
        assert!(back.iter().any(|(k, v)| k == "location" && v == "/v1/computers/c1/desktop/view/vnc.html"));
        assert!(!back.iter().any(|(k, _)| k == "x-width"), "not a viewer's header");
        assert!(pack(&answer, Route::Api.answer_headers()).contains_key("x-width"));
        // The receiving end keeps only the allowlist, whatever the sender put in.
        let mut sent = HashMap::new();
        sent.insert("x-computerd-forwarded".to_string(), "1".to_string());
        sent.insert("Host".to_string(), "evil".to_string());
        sent.insert("Accept".to_string(), "text/html".to_string());
        let kept = unpack(&sent, Route::Api.request_headers());
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(kept[0].0, "accept");
    }
}
