//! The rate-limit middlewares of the HTTP edge (the limiters are `crate::limits`): unauthenticated calls (pairing, the
//! agent link's hello) per source, every call with a token per token. A refused call is answered
//! `429 rate_limited` with `Retry-After` before it reaches its handler, so it writes nothing.
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
