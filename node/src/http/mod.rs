//! The HTTP API (axum): routes, the error body every route answers with, and authentication.

mod agent;
mod approvals;
mod auth;
mod calls;
mod computers;
mod error;
mod events;
mod executions;
mod files;
mod forward;
mod grants;
mod health;
mod identity;
mod limits;
mod openapi;
mod providers;
mod retention;
mod schemas;
mod sessions;
mod tool_drain;
mod tools;
mod util;

pub use auth::Auth;
pub use error::ApiError;
pub use limits::Limits;
pub use limits::run_forget as run_limits_upkeep;

pub use crate::state::AppState;

use axum::Router;
use axum::routing::delete;
use axum::routing::get;
use axum::routing::post;
use axum::routing::put;

/// The API router. Routes come in groups, each with its body limit and deadline
/// ([`limits::RouteLimits`]).
pub fn router(state: AppState) -> Router {
    use axum::middleware::from_fn_with_state;
    let bounded = |l: limits::RouteLimits| from_fn_with_state(l, limits::bounded);
    let control = Router::new()
        .route("/v1/health", get(health::health))
        .route("/v1/openapi.json", get(openapi::openapi_json))
        .route("/v1/members", post(identity::create_member).get(identity::list_members))
        .route("/v1/bots", post(identity::create_bot).get(identity::list_bots))
        .route("/v1/bots/{id}/archive", post(identity::archive_bot))
        .route("/v1/tokens", post(identity::create_token).get(identity::list_tokens))
        .route("/v1/tokens/{id}", delete(identity::revoke_token))
        .route("/v1/cluster/nodes/{id}", delete(health::remove_node))
        .route("/v1/cluster/join-tokens", post(health::join_token))
        .route("/v1/computer-providers", post(providers::create).get(providers::list))
        .route("/v1/computers", post(computers::create).get(computers::list))
        .route("/v1/computers/{id}", get(computers::get).delete(computers::delete))
        .route("/v1/computers/{id}/pause", post(computers::pause))
        .route("/v1/computers/{id}/resume", post(computers::resume))
        .route("/v1/computers/{id}/stop", post(computers::stop))
        .route("/v1/computers/{id}/usage", get(computers::usage))
        .route("/v1/computers/{id}/sandbox", get(computers::sandbox))
        .route("/v1/computers/{id}/acquire", post(computers::acquire))
        .route("/v1/computers/{id}/release", post(computers::release))
        .route("/v1/computers/{id}/bots", get(grants::list))
        .route("/v1/computers/{id}/bots/{bot}", put(grants::put).get(grants::get).delete(grants::delete))
        .route("/v1/executions/{id}", get(executions::get))
        .route("/v1/executions/{id}/decision", post(executions::decide))
        .route("/v1/approvals", get(approvals::list))
        .route("/v1/approvals/{id}", post(approvals::decide))
        .route("/v1/capability-rules", get(approvals::get_rules).put(approvals::put_rules))
        .route("/v1/retention", get(retention::get).put(retention::put))
        .layer(bounded(limits::CONTROL));
    let tools = Router::new()
        .route("/api/bots/{bot}/tools", get(tools::list))
        .route("/api/bots/{bot}/tools/install", post(tools::install))
        .route("/api/bots/{bot}/tools/computer_mcp", post(tools::model_tool))
        .route("/api/bots/{bot}/tools/{binding}", delete(tools::revoke))
        .route("/api/bots/{bot}/tools/{binding}/discover", post(tools::discover))
        .route("/api/bots/{bot}/tools/{binding}/call", post(tools::call))
        .route("/api/bots/{bot}/tools/{binding}/switch", post(tools::switch))
        .layer(bounded(limits::TOOL));
    // Calls on a Computer's agent run on the node holding its link.
    let sessions = Router::new()
        .route("/v1/computers/{id}/sessions", post(sessions::start))
        .route("/v1/computers/{id}/sessions/{sid}", delete(sessions::stop))
        .route("/v1/computers/{id}/sessions/{sid}/input", post(sessions::input))
        .route("/v1/computers/{id}/sessions/{sid}/resize", post(sessions::resize))
        .layer(from_fn_with_state(state.clone(), forward::to_link_owner))
        .layer(bounded(limits::SESSION));
    let files = Router::new()
        .route(
            "/v1/computers/{id}/files",
            get(files::read).put(files::write).delete(files::remove).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/v1/computers/{id}/directory", get(files::directory))
        .layer(from_fn_with_state(state.clone(), forward::to_link_owner))
        .layer(bounded(limits::FILE));
    let pairing = Router::new()
        .route("/v1/agent/pair", post(agent::pair))
        .layer(from_fn_with_state(state.clone(), limits::per_source))
        .layer(bounded(limits::PAIRING));
    let streams = Router::new()
        .route("/v1/agent/link", get(agent::link).layer(from_fn_with_state(state.clone(), limits::per_source)))
        .route("/v1/events", get(events::events))
        .layer(bounded(limits::STREAM));
    Router::new()
        .merge(control)
        .merge(tools)
        .merge(sessions)
        .merge(files)
        .merge(pairing)
        .merge(streams)
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(computerd_proto::ErrorKind::MethodNotAllowed, "this route does not take that method")
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), limits::per_token))
        .with_state(state)
}
