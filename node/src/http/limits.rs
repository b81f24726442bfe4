//! The limit middlewares of the HTTP edge (the rate limiters are `crate::limits`):
//! - unauthenticated calls (pairing, the agent link's hello) per source, every call with a token
//!   per token. A refused call is answered `429 rate_limited` with `Retry-After` before it
//!   reaches its handler, so it writes nothing;
//! - per group of routes, the largest body and the call's deadline ([`RouteLimits`], [`bounded`]).
//!
//! The source is the connection's peer, or, when the peer is a configured load balancer
//! (`--trusted-proxy`), the nearest address in `X-Forwarded-For` that is not one.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;
use computerd_proto::deadline::CallKind;
use governor::clock::Clock;
use governor::clock::DefaultClock;

use super::ApiError;
use super::AppState;
pub use crate::limits::Limits;

fn limited(wait: Duration, what: &str) -> Response {
    let secs = wait.as_secs().max(1);
    let mut r =
        ApiError::new(ErrorKind::RateLimited, format!("too many {what}; try again in {secs} s")).into_response();
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        r.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
    }
    r
}

/// The per-source limit of unauthenticated routes.
pub async fn per_source(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let (Some(l), Some(ip)) = (&state.limits.by_source, state.limits.source_of(&req))
        && let Err(not_until) = l.check_key(&ip)
    {
        tracing::debug!(%ip, path = %req.uri().path(), "unauthenticated call rate-limited");
        return limited(
            not_until.wait_time_from(DefaultClock::default().now()),
            "unauthenticated calls from this source",
        );
    }
    next.run(req).await
}

/// The per-token limit of every call that carries a bearer token.
pub async fn per_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(l) = &state.limits.by_token
        && let Some(secret) = req.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok())
    {
        let key = computerd_raft::sm::hash_secret(secret);
        if let Err(not_until) = l.check_key(&key) {
            return limited(not_until.wait_time_from(DefaultClock::default().now()), "calls with this token");
        }
    }
    next.run(req).await
}

/// Runs [`Limits::forget_idle`] every minute until `stop`.
pub async fn run_forget(limits: Arc<Limits>, mut stop: tokio::sync::watch::Receiver<bool>) {
    while computerd_actors::tick(Duration::from_secs(60), &mut stop).await {
        limits.forget_idle();
    }
}

/// What one group of routes may take: the largest body, and how long the call may run before it
/// is answered `504 deadline_exceeded` (`None`: a stream, bounded by idle timeouts only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteLimits {
    /// The largest body, in bytes.
    pub body: usize,
    /// The call's deadline.
    pub deadline: Option<Duration>,
}

/// Control calls (identity, grants, providers, lifecycle commands, executions): small JSON
/// bodies, answered within 30 s (a lifecycle command answers its receipt, never its work).
pub const CONTROL: RouteLimits = RouteLimits { body: 256 << 10, deadline: Some(Duration::from_secs(30)) };
/// Session calls: a command or input up to 1 MiB; the call yields after its `yieldTimeMs` (at most
/// 30 s), which the owner enforces exactly, plus the margin of its hops.
pub const SESSION: RouteLimits = RouteLimits { body: 1 << 20, deadline: Some(CallKind::Session.deadline()) };
/// File calls: up to 16 MiB of content (base64 in JSON is a third more), streamed.
pub const FILE: RouteLimits =
    RouteLimits { body: super::files::MAX_FILE * 4 / 3 + (64 << 10), deadline: Some(CallKind::File.deadline()) };
/// Blobs: up to 1 GiB streamed in or out, 10 minutes at most.
pub const BLOB: RouteLimits =
    RouteLimits { body: crate::blobs::MAX_BLOB as usize, deadline: Some(Duration::from_secs(600)) };
/// Tool calls (install, discover, call, switch, revoke): arguments up to 1 MiB.
pub const TOOL: RouteLimits = RouteLimits { body: 1 << 20, deadline: Some(CallKind::Tool.deadline()) };
/// Pairing, unauthenticated: a code is a few bytes.
pub const PAIRING: RouteLimits = RouteLimits { body: 4 << 10, deadline: Some(Duration::from_secs(30)) };
/// Streams (the agent link, the event stream): no body, no deadline.
pub const STREAM: RouteLimits = RouteLimits { body: 4 << 10, deadline: None };

/// Applies a group's [`RouteLimits`]: a declared length over the limit is refused before any of
/// the body is read (`413 too_large`), a body without one is cut off at the limit (its handler
/// then answers 413), and a call past its deadline is answered `504 deadline_exceeded`.
pub async fn bounded(State(limits): State<RouteLimits>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.body as u64) {
        return ApiError::new(
            ErrorKind::TooLarge,
            format!("the body is larger than {} bytes, the most this route takes", limits.body),
        )
        .into_response();
    }
    let req = req.map(|b| axum::body::Body::new(http_body_util::Limited::new(b, limits.body)));
    let Some(deadline) = limits.deadline else {
        return next.run(req).await;
    };
    match tokio::time::timeout(deadline, next.run(req)).await {
        Ok(r) => r,
        Err(_) => ApiError::new(
            ErrorKind::DeadlineExceeded,
            format!(
                "no answer within {} s; a write may still take effect (retry a lifecycle command with its commandKey)",
                deadline.as_secs()
            ),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::routing::post;
    use tower::ServiceExt;

    use super::*;

    fn app(limits: RouteLimits) -> Router {
        Router::new()
            .route("/echo", post(|b: axum::body::Bytes| async move { b.len().to_string() }))
            .route("/hang", post(std::future::pending::<&'static str>))
            .layer(axum::middleware::from_fn_with_state(limits, bounded))
    }

    async fn kind_of(r: Response) -> (u16, String) {
        let status = r.status().as_u16();
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        (status, v["error"]["kind"].as_str().unwrap_or_default().to_string())
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_unread() {
        let limits = RouteLimits { body: 10, deadline: None };
        let req = axum::http::Request::post("/echo")
            .header("content-length", "11")
            .body(axum::body::Body::from("01234567890"))
            .expect("request");
        let r = app(limits).oneshot(req).await.expect("answer");
        assert_eq!(kind_of(r).await, (413, "too_large".to_string()));
        let ok = axum::http::Request::post("/echo").body(axum::body::Body::from("0123456789")).expect("request");
        let r = app(limits).oneshot(ok).await.expect("answer");
        assert_eq!(r.status(), 200, "a body at the limit is taken");
    }

    #[tokio::test]
    async fn a_body_without_a_length_is_cut_at_the_limit() {
        let limits = RouteLimits { body: 10, deadline: None };
        let chunks = futures::stream::iter(vec![
            Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"012345")),
            Ok(bytes::Bytes::from_static(b"6789ab")),
        ]);
        let req = axum::http::Request::post("/echo").body(axum::body::Body::from_stream(chunks)).expect("request");
        let r = app(limits).oneshot(req).await.expect("answer");
        assert_eq!(r.status(), 413, "the extractor sees the cut body");
    }

    #[tokio::test]
    async fn a_call_past_its_deadline_is_answered_504() {
        let limits = RouteLimits { body: 10, deadline: Some(Duration::from_millis(100)) };
        let req = axum::http::Request::post("/hang").body(axum::body::Body::empty()).expect("request");
        let started = std::time::Instant::now();
        let r = app(limits).oneshot(req).await.expect("answer");
        assert_eq!(kind_of(r).await, (504, "deadline_exceeded".to_string()));
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }
}
