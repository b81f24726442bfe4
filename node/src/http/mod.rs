//! The HTTP API (axum): routes, the error body every route answers with, and authentication.

mod agent;
mod approvals;
mod auth;
mod backup;
mod blobs;
mod bot_tools;
mod browser;
mod calls;
mod computers;
mod copies;
mod delegations;
mod desktop;
mod desktop_stream;
mod egress;
mod error;
mod events;
mod executions;
mod files;
mod forward;
mod grants;
mod health;
mod identity;
mod limits;
mod mcp;
pub(crate) mod metrics;
mod openapi;
mod org_limits;
mod port_proxy;
mod ports;
mod providers;
mod retention;
mod runs;
mod schemas;
mod secrets;
mod sessions;
mod tool_drain;
mod tools;
#[cfg(feature = "upgrade-probe")]
mod upgrade_probe;
mod util;

pub use auth::Auth;
pub use error::ApiError;
pub use limits::Limits;
pub use limits::run_forget as run_limits_upkeep;

pub use crate::state::AppState;

use axum::Router;

/// Builds a group of routes from `METHOD "path" => handler` lines, and answers it with the
/// group's (method, path) pairs: the router is made from the same lines as [`ROUTES`] lists, so
/// the router-vs-OpenAPI test compares the document with what is really served.
macro_rules! group {
    ($($method:ident $path:literal => $handler:path),* $(,)?) => {{
        let mut r = Router::new();
        $( r = r.route($path, axum::routing::$method($handler)); )*
        (r, [$((stringify!($method), $path)),*])
    }};
}

/// A route as (method, path).
pub type RoutePair = (&'static str, &'static str);

/// Every route of the API as (method, path), in the router's groups (see [`router`]).
pub fn routes() -> Vec<RoutePair> {
    let mut all = Vec::new();
    groups(&mut |pairs: &[RoutePair]| all.extend_from_slice(pairs));
    all
}

/// The route groups of the router (each gets its bounds in [`router`]).
struct Groups {
    control: Router<AppState>,
    tools: Router<AppState>,
    sessions: Router<AppState>,
    files: Router<AppState>,
    desktop: Router<AppState>,
    browser: Router<AppState>,
    blobs: Router<AppState>,
    viewer: Router<AppState>,
    viewer_socket: Router<AppState>,
    ports: Router<AppState>,
    pairing: Router<AppState>,
    link: Router<AppState>,
    streams: Router<AppState>,
}

/// Makes the route groups; `seen` is told the pairs of each.
fn groups(seen: &mut dyn FnMut(&[RoutePair])) -> Groups {
    let (control, pairs) = group! {
        get "/v1/health" => health::health,
        get "/metrics" => metrics::scrape,
        get "/v1/openapi.json" => openapi::openapi_json,
        post "/v1/members" => identity::create_member,
        get "/v1/members" => identity::list_members,
        post "/v1/bots" => identity::create_bot,
        get "/v1/bots" => identity::list_bots,
        post "/v1/bots/{id}/archive" => identity::archive_bot,
        post "/v1/tokens" => identity::create_token,
        get "/v1/tokens" => identity::list_tokens,
        delete "/v1/tokens/{id}" => identity::revoke_token,
        delete "/v1/cluster/nodes/{id}" => health::remove_node,
        post "/v1/cluster/join-tokens" => health::join_token,
        get "/v1/admin/backup" => backup::backup,
        post "/v1/computer-providers" => providers::create,
        get "/v1/computer-providers" => providers::list,
        post "/v1/computers" => computers::create,
        get "/v1/computers" => computers::list,
        get "/v1/computers/{id}" => computers::get,
        delete "/v1/computers/{id}" => computers::delete,
        post "/v1/computers/{id}/pause" => computers::pause,
        post "/v1/computers/{id}/resume" => computers::resume,
        post "/v1/computers/{id}/recreate" => computers::recreate,
        post "/v1/computers/{id}/stop" => computers::stop,
        get "/v1/computers/{id}/usage" => computers::usage,
        get "/v1/computers/{id}/sandbox" => computers::sandbox,
        put "/v1/computers/{id}/egress" => egress::put,
        get "/v1/computers/{id}/egress" => egress::get,
        post "/v1/computers/{id}/acquire" => computers::acquire,
        post "/v1/computers/{id}/release" => computers::release,
        post "/v1/bots/{bot}/delegations" => delegations::create,
        get "/v1/bots/{bot}/delegations" => delegations::list,
        delete "/v1/bots/{bot}/delegations/{delegation}" => delegations::end,
        get "/v1/computers/{id}/bots" => grants::list,
        put "/v1/computers/{id}/bots/{bot}" => grants::put,
        get "/v1/computers/{id}/bots/{bot}" => grants::get,
        delete "/v1/computers/{id}/bots/{bot}" => grants::delete,
        get "/v1/secrets" => secrets::list,
        put "/v1/secrets/{name}" => secrets::put,
        get "/v1/secrets/{name}" => secrets::get,
        delete "/v1/secrets/{name}" => secrets::delete,
        get "/v1/executions/{id}" => executions::get,
        post "/v1/executions/{id}/decision" => executions::decide,
        get "/v1/approvals" => approvals::list,
        post "/v1/approvals/{id}" => approvals::decide,
        get "/v1/capability-rules" => approvals::get_rules,
        put "/v1/capability-rules" => approvals::put_rules,
        get "/v1/retention" => retention::get,
        put "/v1/retention" => retention::put,
        get "/v1/limits" => org_limits::get,
        put "/v1/limits" => org_limits::put,
        get "/v1/tools" => bot_tools::list,
        get "/v1/blob-limits" => blobs::limits,
        put "/v1/blob-limits" => blobs::set_limits,
        get "/api/blobs/{id}/info" => blobs::info,
        post "/api/turn" => runs::turn,
        post "/api/runs/claim" => runs::claim,
        get "/api/runs/{id}" => runs::get,
        post "/api/runs/{id}/lease" => runs::renew,
        post "/api/runs/{id}/events" => runs::post_event,
        post "/api/runs/{id}/finish" => runs::finish,
        post "/api/runs/{id}/cancel" => runs::cancel,
        post "/api/runs/{id}/decision" => runs::decide,
        get "/v1/computers/{id}/browser/actions/{action}" => browser::action,
        post "/v1/computers/{id}/browser/actions/{action}/decision" => browser::decide,
    };
    seen(&pairs);
    let (tools, pairs) = group! {
        get "/api/bots/{bot}/tools" => tools::list,
        post "/api/bots/{bot}/tools/install" => tools::install,
        post "/api/bots/{bot}/tools/computer_mcp" => tools::model_tool,
        delete "/api/bots/{bot}/tools/{binding}" => tools::revoke,
        post "/api/bots/{bot}/tools/{binding}/discover" => tools::discover,
        post "/api/bots/{bot}/tools/{binding}/call" => tools::call,
        post "/api/bots/{bot}/tools/{binding}/switch" => tools::switch,
        post "/v1/tools/call" => bot_tools::call,
    };
    seen(&pairs);
    let (sessions, pairs) = group! {
        post "/v1/computers/{id}/sessions" => sessions::start,
        get "/v1/computers/{id}/sessions" => sessions::list,
        get "/v1/computers/{id}/sessions/{sid}" => sessions::get,
        delete "/v1/computers/{id}/sessions/{sid}" => sessions::stop,
        post "/v1/computers/{id}/sessions/{sid}/input" => sessions::input,
        post "/v1/computers/{id}/sessions/{sid}/resize" => sessions::resize,
        get "/v1/computers/{id}/sessions/{sid}/output" => sessions::output,
    };
    seen(&pairs);
    let (files, pairs) = group! {
        get "/v1/computers/{id}/files" => files::read,
        put "/v1/computers/{id}/files" => files::write,
        delete "/v1/computers/{id}/files" => files::remove,
        post "/v1/computers/{id}/files/edit" => files::edit,
        get "/v1/computers/{id}/directory" => files::directory,
        post "/v1/computers/{id}/copy-to-box" => copies::to_box,
        post "/v1/computers/{id}/copy-from-box" => copies::from_box,
    };
    seen(&pairs);
    let (desktop, pairs) = group! {
        get "/v1/computers/{id}/desktop" => desktop::status,
        post "/v1/computers/{id}/desktop/screenshot" => desktop::screenshot,
        post "/v1/computers/{id}/desktop/actions" => desktop::actions,
        post "/v1/computers/{id}/desktop/release" => desktop::release,
        post "/v1/computers/{id}/desktop/stream" => desktop_stream::stream,
    };
    seen(&pairs);
    let (browser, pairs) = group! {
        post "/v1/computers/{id}/browser/sessions" => browser::open,
        get "/v1/computers/{id}/browser/sessions" => browser::list,
        delete "/v1/computers/{id}/browser/sessions/{session}" => browser::close,
        post "/v1/computers/{id}/browser/navigate" => browser::navigate,
        post "/v1/computers/{id}/browser/snapshot" => browser::snapshot,
        post "/v1/computers/{id}/browser/click" => browser::click,
        post "/v1/computers/{id}/browser/hover" => browser::hover,
        post "/v1/computers/{id}/browser/type" => browser::type_text,
        post "/v1/computers/{id}/browser/press" => browser::press,
        post "/v1/computers/{id}/browser/select" => browser::select,
        post "/v1/computers/{id}/browser/upload" => browser::upload,
        post "/v1/computers/{id}/browser/screenshot" => browser::screenshot,
        post "/v1/computers/{id}/browser/evidence" => browser::evidence,
        post "/v1/computers/{id}/browser/session_status" => browser::session_status,
        post "/v1/computers/{id}/browser/dialog" => browser::dialog,
        post "/v1/computers/{id}/browser/fill_secret" => browser::fill_secret,
    };
    seen(&pairs);
    // Blobs: the raw bytes stream in and out (their own bound, not axum's default).
    let (blobs, pairs) = group! {
        post "/api/blobs" => blobs::put,
        get "/api/blobs/{id}" => blobs::get,
    };
    seen(&pairs);
    // A person's stream: the ticket's redemption and noVNC's files, on the link's node (where
    // the ticket and the cookie are); the WebSocket on any node (it tunnels to the link's node).
    let (viewer, pairs) = group! {
        get "/v1/computers/{id}/desktop/view" => desktop_stream::view,
        get "/v1/computers/{id}/desktop/view/{*file}" => desktop_stream::asset,
    };
    seen(&pairs);
    let (viewer_socket, pairs) = group! {
        get "/v1/computers/{id}/desktop/websockify" => desktop_stream::websocket,
    };
    seen(&pairs);
    // Public port addresses: records in the store, on any node.
    let (ports, pairs) = group! {
        get "/v1/computers/{id}/ports" => ports::list,
        put "/v1/computers/{id}/ports/{port}" => ports::put,
        get "/v1/computers/{id}/ports/{port}" => ports::get,
        delete "/v1/computers/{id}/ports/{port}" => ports::delete,
    };
    seen(&pairs);
    let (pairing, pairs) = group! { post "/v1/agent/pair" => agent::pair };
    seen(&pairs);
    let (link, pairs) = group! { get "/v1/agent/link" => agent::link, get "/v1/agent/pool" => agent::pool };
    seen(&pairs);
    seen(&mcp::ROUTES);
    let (streams, pairs) = group! {
        get "/v1/events" => events::events,
        get "/api/runs/{id}/events" => runs::events,
    };
    seen(&pairs);
    Groups {
        control,
        tools,
        sessions,
        files,
        desktop,
        browser,
        blobs,
        viewer,
        viewer_socket,
        ports,
        pairing,
        link,
        streams,
    }
}

/// The API router. Routes come in groups, each with its body limit and deadline
/// ([`limits::RouteLimits`]).
pub fn router(state: AppState) -> Router {
    use axum::middleware::from_fn_with_state;
    let bounded = |l: limits::RouteLimits| from_fn_with_state(l, limits::bounded);
    let g = groups(&mut |_| {});
    #[cfg(feature = "upgrade-probe")]
    let g = Groups { control: g.control.route("/v1/admin/upgrade-probe", upgrade_probe::routes()), ..g };
    let control = g.control.layer(bounded(limits::CONTROL));
    let tools = g.tools.layer(bounded(limits::TOOL));
    // Calls on a Computer's agent run on the node holding its link.
    let sessions =
        g.sessions.layer(from_fn_with_state(state.clone(), forward::to_link_owner)).layer(bounded(limits::SESSION));
    // Files bring their own bound on the content (`limits::FILE`), not axum's default.
    let files = g
        .files
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(from_fn_with_state(state.clone(), forward::to_link_owner))
        .layer(bounded(limits::FILE));
    // Desktop calls, like sessions: on the link's node, with a session call's bounds.
    let desktop =
        g.desktop.layer(from_fn_with_state(state.clone(), forward::to_link_owner)).layer(bounded(limits::SESSION));
    // Browser tools: on the link's node; a tool waits for a page up to 60 s (`timeoutMs`).
    let browser =
        g.browser.layer(from_fn_with_state(state.clone(), forward::to_link_owner)).layer(bounded(limits::TOOL));
    let blobs = g.blobs.layer(axum::extract::DefaultBodyLimit::disable()).layer(bounded(limits::BLOB));
    let viewer =
        g.viewer.layer(from_fn_with_state(state.clone(), forward::to_link_owner)).layer(bounded(limits::CONTROL));
    let viewer_socket = g.viewer_socket.layer(bounded(limits::STREAM));
    let ports = g.ports.layer(bounded(limits::CONTROL));
    let pairing =
        g.pairing.layer(from_fn_with_state(state.clone(), limits::per_source)).layer(bounded(limits::PAIRING));
    let link = g.link.layer(from_fn_with_state(state.clone(), limits::per_source)).layer(bounded(limits::STREAM));
    let streams = g.streams.layer(bounded(limits::STREAM));
    // MCP: one service for its three methods; a session's stream lives as long as a stream.
    let mcp = Router::new()
        .route_service("/mcp", mcp::service(state.clone()))
        .layer(from_fn_with_state(state.clone(), mcp::authenticated))
        .layer(bounded(limits::STREAM));
    let api = Router::new()
        .merge(control)
        .merge(tools)
        .merge(sessions)
        .merge(files)
        .merge(desktop)
        .merge(browser)
        .merge(blobs)
        .merge(viewer)
        .merge(viewer_socket)
        .merge(ports)
        .merge(pairing)
        .merge(link)
        .merge(streams)
        .merge(mcp)
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(computerd_proto::ErrorKind::MethodNotAllowed, "this route does not take that method")
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), limits::per_token))
        // Outside the rate limits, so refused calls count too; a router's layer wraps each route,
        // so the route's pattern is known to it.
        .layer(axum::middleware::from_fn(metrics::count_requests))
        .with_state(state.clone());
    // A request to a public port address (by its `Host`) never reaches the API's routes.
    Router::new().fallback_service(api).layer(from_fn_with_state(state, port_proxy::by_host))
}
