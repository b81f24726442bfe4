//! `GET /v1/events?after=<cursor>`: lifecycle events the caller may see, as JSON or (with
//! `Accept: text/event-stream`) as a server-sent event stream that follows new events and
//! resumes from `Last-Event-ID`. The cursor moves past events the caller cannot see. A cursor
//! from before the oldest event the bounded log still holds is told so: `"gap": {"firstId"}`
//! in JSON, a `gap` event on the stream.

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

/// `GET /v1/events`
#[utoipa::path(get, path = "/v1/events", operation_id = "events_events", tag = "events", params(("after" = Option<u64>, Query, description = "Cursor"), ("limit" = Option<usize>, Query), ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event (wins over `after`)")), responses((status = 200, description = "`{\"events\": [...], \"cursor\": n, \"gap\"?: {\"firstId\"}}` (`gap`: events after the cursor were dropped from the bounded log; `firstId` is the oldest still held), or with `Accept: text/event-stream` a stream of them, with a `gap` event first when so", body = Object)), security(("bearer" = [])))]
pub async fn events(
    State(state): State<AppState>,
    auth: Auth,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let caller = auth.current(&state).await?;
    let Query(q) = q.map_err(|e| ApiError::invalid(e.body_text()))?;
    // A reconnecting `EventSource` sends the last id it saw; it wins over the URL's cursor.
    let after = super::util::last_event_id(&headers, "an event id")?.or(q.after).unwrap_or(0);
    let limit = q.limit.unwrap_or(1000).clamp(1, 1000);
    let sse = headers.get("accept").and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/event-stream"));
    if !sse {
        let page = state.cluster.state().read(|s| s.events_page(&caller, after, limit));
        let mut body = json!({ "events": page.events, "cursor": page.cursor });
        if let Some(first) = page.gap {
            body["gap"] = json!({ "firstId": first });
        }
        return Ok(Json(body).into_response());
    }
    let changes = state.cluster.state().subscribe();
    let stream = futures::stream::unfold(
        (state, auth, changes, after, std::collections::VecDeque::<SseEvent>::new()),
        |(state, auth, mut changes, mut cursor, mut queue)| async move {
            loop {
                if let Some(ev) = queue.pop_front() {
                    return Some((Ok::<_, Infallible>(ev), (state, auth, changes, cursor, queue)));
                }
                // Rights are re-checked before each read: a revoked token ends the stream.
                let caller = state.cluster.state().read(|s| s.caller_by_hash(auth.hash())).ok()?;
                let page = state.cluster.state().read(|s| s.events_page(&caller, cursor, 1000));
                if let Some(first) = page.gap {
                    // Its id resumes a reconnect after the gap, which is then not told again.
                    let data = json!({ "after": cursor, "firstId": first }).to_string();
                    let id = first.saturating_sub(1).to_string();
                    queue.push_back(SseEvent::default().id(id).event("gap").data(data));
                }
                for e in &page.events {
                    let data = serde_json::to_string(e).unwrap_or_default();
                    queue.push_back(SseEvent::default().id(e.seq.to_string()).event(e.kind.clone()).data(data));
                }
                // Past what was looked at, seen or not: the next read starts there.
                cursor = page.cursor;
                if queue.is_empty() {
                    changes.changed().await.ok()?;
                }
            }
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response())
}
