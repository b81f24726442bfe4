//! The HTTP API (axum): routes, the error body every route answers with, and authentication.

mod auth;
mod error;
mod health;
mod identity;

pub use auth::Auth;
pub use error::ApiError;

use axum::Router;
use axum::routing::delete;
use axum::routing::get;
use axum::routing::post;
use computerd_raft::cluster::Cluster;

/// What every handler gets.
#[derive(Clone)]
pub struct AppState {
    /// The replicated store.
    pub cluster: Cluster,
}

/// The API router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/health", get(health::health))
        .route(
            "/v1/members",
            post(identity::create_member).get(identity::list_members),
        )
        .route(
            "/v1/bots",
            post(identity::create_bot).get(identity::list_bots),
        )
        .route("/v1/bots/{id}/archive", post(identity::archive_bot))
        .route(
            "/v1/tokens",
            post(identity::create_token).get(identity::list_tokens),
        )
        .route("/v1/tokens/{id}", delete(identity::revoke_token))
        .route("/v1/cluster/nodes/{id}", delete(health::remove_node))
        .fallback(|| async { ApiError::not_found("no such route") })
        .with_state(state)
}
