//! The OpenAPI description of the API, generated from the route handlers and request types
//! (utoipa) and served at `GET /v1/openapi.json`.

use axum::Json;
use utoipa::Modify;
use utoipa::OpenApi;
use utoipa::openapi::security::HttpAuthScheme;
use utoipa::openapi::security::HttpBuilder;
use utoipa::openapi::security::SecurityScheme;

use super::approvals;
use super::computers;
use super::events;
use super::executions;
use super::grants;
use super::health;
use super::identity;
use super::providers;
use super::retention;

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
        health::health, health::remove_node, health::join_token,
        identity::create_member, identity::list_members, identity::create_bot, identity::list_bots,
        identity::archive_bot, identity::create_token, identity::list_tokens, identity::revoke_token,
        providers::create, providers::list,
        computers::create, computers::list, computers::get, computers::pause, computers::resume,
        computers::delete, computers::stop, computers::usage, computers::sandbox, computers::acquire, computers::release,
        grants::put, grants::get, grants::list, grants::delete,
        executions::get, executions::decide,
        events::events,
        approvals::list, approvals::decide, approvals::get_rules, approvals::put_rules,
        retention::get, retention::put,
    ),
    components(schemas(ErrorBody, ErrorDetail, ReceiptDoc)),
    modifiers(&BearerAuth),
)]
pub struct ApiDoc;

/// `GET /v1/openapi.json`
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
