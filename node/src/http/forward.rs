//! The routing middleware of the calls on a Computer's agent (sessions, files): a call whose link
//! another node holds is forwarded there ([`crate::owner::forward`]); one whose link is here, or
//! on no other node, runs here.

use std::sync::Arc;
use std::sync::Mutex;

use axum::extract::Request;
use axum::extract::State;
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::response::Response;

use super::ApiError;
use super::AppState;
use crate::owner::Miss;
use crate::owner::Place;
use crate::owner::computer_of;
use crate::owner::forward;

/// Forwards the request when another node holds the Computer's link; runs it here otherwise.
pub async fn to_link_owner(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(id) = computer_of(req.uri().path()).map(String::from) else { return next.run(req).await };
    if req.extensions().get::<crate::owner::serve::Routed>().is_some() {
        return next.run(req).await;
    }
    let Place::At(owner) = state.owners.locate(&id).await else { return next.run(req).await };
    let (parts, body) = req.into_parts();
    let body: forward::HeldBody = Arc::new(Mutex::new(Some(body)));
    match forward::forward(&state.owners, owner, &parts, body.clone()).await {
        Ok(r) => r,
        Err(Miss::Failed(e)) => ApiError::from(e).into_response(),
        // No other node holds it: run the call here (it answers that the agent is not connected,
        // or waits for it when the Computer is resuming).
        Err(Miss::Nobody) => next.run(Request::from_parts(parts, forward::take(&body))).await,
    }
}
