//! The OpenAPI description of the API, generated from the route handlers and request types
//! (utoipa) and served at `GET /v1/openapi.json`.

use axum::Json;
use utoipa::Modify;
use utoipa::OpenApi;
use utoipa::openapi::security::HttpAuthScheme;
use utoipa::openapi::security::HttpBuilder;
use utoipa::openapi::security::SecurityScheme;

use super::agent;
use super::approvals;
use super::backup;
use super::blobs;
use super::bot_tools;
use super::browser;
use super::computers;
use super::copies;
use super::delegations;
use super::desktop;
use super::desktop_stream;
use super::events;
use super::executions;
use super::files;
use super::grants;
use super::health;
use super::identity;
use super::mcp;
use super::metrics;
use super::org_limits;
use super::ports;
use super::providers;
use super::retention;
use super::runs;
use super::sessions;
use super::tools;

use super::schemas::ErrorBody;
use super::schemas::ErrorDetail;
use super::schemas::ReceiptDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(title = "computerd", description = "The control plane for AI bots' computers."),
    paths(
        health::health, health::remove_node, health::join_token, backup::backup, metrics::scrape,
        identity::create_member, identity::list_members, identity::create_bot, identity::list_bots,
        identity::archive_bot, identity::create_token, identity::list_tokens, identity::revoke_token,
        providers::create, providers::list,
        computers::create, computers::list, computers::get, computers::pause, computers::resume,
        computers::delete, computers::stop, computers::usage, computers::sandbox, computers::acquire, computers::release,
        grants::put, grants::get, grants::list, grants::delete,
        delegations::create, delegations::list, delegations::end,
        executions::get, executions::decide,
        events::events,
        approvals::list, approvals::decide, approvals::get_rules, approvals::put_rules,
        retention::get, retention::put,
        org_limits::get, org_limits::put,
        bot_tools::list, bot_tools::call,
        mcp::mcp_post, mcp::mcp_get, mcp::mcp_delete,
        sessions::start, sessions::list, sessions::get, sessions::output, sessions::input, sessions::resize, sessions::stop,
        files::read, files::write, files::remove, files::edit, files::directory,
        desktop::status, desktop::screenshot, desktop::actions, desktop::release,
        copies::to_box, copies::from_box,
        blobs::put, blobs::get, blobs::info, blobs::limits, blobs::set_limits,
        runs::turn, runs::claim, runs::get, runs::renew, runs::post_event, runs::finish, runs::cancel, runs::decide, runs::events,
        browser::open, browser::list, browser::close, browser::navigate, browser::snapshot, browser::click,
        browser::hover, browser::type_text, browser::press, browser::select, browser::upload, browser::evidence, browser::screenshot,
        browser::session_status, browser::action, browser::decide,
        desktop_stream::stream, desktop_stream::view, desktop_stream::asset, desktop_stream::websocket,
        ports::put, ports::list, ports::get, ports::delete,
        agent::pair, agent::link,
        tools::install, tools::list, tools::discover, tools::call, tools::switch, tools::revoke, tools::model_tool,
    ),
    components(schemas(ErrorBody, ErrorDetail, ReceiptDoc)),
    modifiers(&BearerAuth),
)]
pub struct ApiDoc;

/// `GET /v1/openapi.json`
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The document describes exactly the routes the router serves (the router is built from
    /// the same table, `http::routes`), each operation with an id of its own.
    #[test]
    fn the_document_describes_every_route_of_the_router_and_nothing_else() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
        let mut described = BTreeSet::new();
        let mut ids = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("a path item") {
                described.insert((method.clone(), path.clone()));
                ids.push(op["operationId"].as_str().unwrap_or_default().to_string());
            }
        }
        let served: BTreeSet<(String, String)> = super::super::routes()
            .into_iter()
            .filter(|(_, p)| *p != "/v1/openapi.json") // the document itself
            // A catch-all (`{*file}`: noVNC's files) is a plain parameter in the document.
            .map(|(m, p)| (m.to_string(), p.replace("{*", "{")))
            .collect();
        let undocumented: Vec<_> = served.difference(&described).collect();
        let unserved: Vec<_> = described.difference(&served).collect();
        assert!(undocumented.is_empty(), "routes the document does not describe: {undocumented:?}");
        assert!(unserved.is_empty(), "operations the router does not serve: {unserved:?}");
        let unique: BTreeSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "operationIds repeat: {ids:?}");
        assert!(ids.iter().all(|id| !id.is_empty()), "an operation without an id: {ids:?}");
    }

    /// Every route takes its caller's token, but the health check, pairing, the agent's link
    /// (which authenticate otherwise) and the document.
    #[test]
    fn every_operation_but_the_open_ones_needs_the_bearer_token() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
        // A person's stream: its ticket (single-use), then its cookie, never a bearer token.
        let open = [
            "/v1/health",
            "/v1/agent/pair",
            "/v1/agent/link",
            "/v1/computers/{id}/desktop/view",
            "/v1/computers/{id}/desktop/view/{file}",
            "/v1/computers/{id}/desktop/websockify",
        ];
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("a path item") {
                let bearer = op["security"].as_array().is_some_and(|s| s.iter().any(|r| r.get("bearer").is_some()));
                assert_eq!(bearer, !open.contains(&path.as_str()), "{method} {path}: {op}");
            }
        }
    }
}
