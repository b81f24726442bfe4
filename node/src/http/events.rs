//! `GET /v1/events?after=<cursor>`: lifecycle events the caller may see, as JSON or (with
//! `Accept: text/event-stream`) as a server-sent event stream that follows new events.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::Query;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::response::sse::Event as SseEvent;
use axum::response::sse::KeepAlive;
use axum::response::sse::Sse;
use computerd_raft::sm::Caller;
use computerd_raft::sm::Event;
use computerd_raft::sm::State as StoreState;
use serde::Deserialize;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
#[allow(unused_imports)]
use super::schemas::ReceiptDoc;

/// Query of `GET /v1/events`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    after: Option<u64>,
    limit: Option<usize>,
}

fn visible(s: &StoreState, caller: &Caller, after: u64, limit: usize) -> (Vec<Event>, u64) {
    let mut out = Vec::new();
    let mut cursor = after;
    for e in s.events_after(after) {
        cursor = e.seq;
        if s.computers.get(&e.computer_id).is_some_and(|c| s.could_see(caller, c)) {
            out.push(e.clone());
            if out.len() >= limit {
                break;
            }
        }
    }
    (out, cursor.max(after))
}

/// `GET /v1/events`
#[utoipa::path(get, path = "/v1/events", operation_id = "events_events", tag = "events", params(("after" = Option<u64>, Query, description = "Cursor"), ("limit" = Option<usize>, Query)), responses((status = 200, description = "`{\"events\": [...], \"cursor\": n}`, or with `Accept: text/event-stream` a stream of them", body = Object)), security(("bearer" = [])))]
pub async fn events(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let caller = auth.current(&state).await?;
    let Query(q) = q.map_err(|e| ApiError::invalid(e.body_text()))?;
    let after = q.after.unwrap_or(0);
    let limit = q.limit.unwrap_or(1000).clamp(1, 1000);
    let sse = headers.get("accept").and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/event-stream"));
    if !sse {
        let (rows, cursor) = state.cluster.state().read(|s| visible(s, &caller, after, limit));
        return Ok(Json(json!({ "events": rows, "cursor": cursor })).into_response());
    }
    let changes = state.cluster.state().subscribe();
    let stream = futures::stream::unfold(
        (state, auth, changes, after, Vec::<Event>::new()),
        |(state, auth, mut changes, cursor, mut queue)| async move {
            loop {
                if !queue.is_empty() {
                    let e = queue.remove(0);
                    let data = serde_json::to_string(&e).unwrap_or_default();
                    let ev = SseEvent::default().id(e.seq.to_string()).event(e.kind.clone()).data(data);
                    return Some((Ok::<_, Infallible>(ev), (state, auth, changes, cursor, queue)));
                }
                // Rights are re-checked before each read: a revoked token ends the stream.
                let caller = state.cluster.state().read(|s| s.caller_by_hash(auth.hash())).ok()?;
                let (rows, next) = state.cluster.state().read(|s| visible(s, &caller, cursor, 1000));
                if rows.is_empty() {
                    changes.changed().await.ok()?;
                    let _ = next;
                    continue;
                }
                queue = rows;
                let cursor = next;
                return Some((
                    Ok(SseEvent::default().comment(format!("cursor {cursor}"))),
                    (state, auth, changes, cursor, queue),
                ));
            }
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response())
}
