//! `/mcp`: the bot tools over MCP (streamable HTTP, rmcp's server side, stateful sessions), for
//! bots whose framework speaks MCP. The same registry as `GET /v1/tools` ([`crate::bot_tools`]);
//! a call runs exactly as `POST /v1/tools/call` does (`bot_tools::run`): as the API request it
//! becomes, with the `Authorization` of the MCP request that carries it, so rights are checked
//! on every call, on this node.
//!
//! Every request to `/mcp` needs a valid token (the layer in `http::router`). A command still
//! running when its call answers is watched: when it ends, the MCP session that started it gets
//! a `notifications/message` whose data is `{"kind": "computer_session", "computerId",
//! "session", "exitCode", "signal"}` (the same end is the `computer_session` event of
//! `GET /v1/events`).
//!
//! MCP's logging (`notifications/message`) is deprecated by SEP-2577 in the newest protocol
//! version, whose subscriptions do not carry it yet; the clients of today's versions (2025-xx)
//! receive it, so it is used here, marked `allow(deprecated)`.
//!
//! An MCP session lives on the node that opened it: behind a load balancer, keep a session's
//! requests on one node (HAProxy: `stick store-response res.hdr(mcp-session-id)` and
//! `stick match req.hdr(mcp-session-id)`).

#![allow(deprecated)] // MCP logging: see above

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use computerd_proto::ErrorKind;
use rmcp::ErrorData;
use rmcp::RoleServer;
use rmcp::ServerHandler;
use rmcp::model::Annotations;
use rmcp::model::CallToolRequestParams;
use rmcp::model::CallToolResponse;
use rmcp::model::CallToolResult;
use rmcp::model::ContentBlock;
use rmcp::model::Implementation;
use rmcp::model::ListToolsResult;
use rmcp::model::LoggingLevel;
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::PaginatedRequestParams;
use rmcp::model::Role;
use rmcp::model::ServerCapabilities;
use rmcp::model::ServerConfig;
use rmcp::model::TextContent;
use rmcp::model::Tool;
use rmcp::service::Peer;
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::bot_tools::Origin;
#[allow(unused_imports)]
use super::schemas::ErrorBody;

/// A watched command is given up after this long (its end is still an event of `/v1/events`).
const WATCH_AT_MOST: Duration = Duration::from_secs(24 * 3600);
/// How often a watcher looks whether its MCP session is gone.
const PEER_CHECK: Duration = Duration::from_secs(30);
/// Commands watched at once per MCP session.
const MAX_WATCHED: usize = 256;

/// The routes of `/mcp`, for the router-vs-OpenAPI test (they are one service, not handlers).
pub(crate) const ROUTES: [super::RoutePair; 3] = [("post", "/mcp"), ("get", "/mcp"), ("delete", "/mcp")];

/// `POST /mcp`: a JSON-RPC message of MCP (documentation only: the service answers it).
#[utoipa::path(post, path = "/mcp", operation_id = "mcp_post", tag = "mcp", request_body(content = Object, description = "A JSON-RPC message of MCP's streamable HTTP transport (`initialize`, `tools/list`, `tools/call`, …); later messages carry `Mcp-Session-Id`"), responses((status = 200, description = "The JSON-RPC answer, as JSON or as a server-sent event stream", body = Object), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
#[allow(dead_code)]
fn mcp_post() {}

/// `GET /mcp`: the session's stream of server messages (notifications such as
/// `computer_session`).
#[utoipa::path(get, path = "/mcp", operation_id = "mcp_get", tag = "mcp", responses((status = 200, description = "A server-sent event stream of the MCP session's notifications"), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
#[allow(dead_code)]
fn mcp_get() {}

/// `DELETE /mcp`: ends the MCP session named by `Mcp-Session-Id`.
#[utoipa::path(delete, path = "/mcp", operation_id = "mcp_delete", tag = "mcp", responses((status = 204, description = "The session is ended"), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
#[allow(dead_code)]
fn mcp_delete() {}

/// Lets only callers with a valid token reach `/mcp` (each tool call is then checked again,
/// with its own request's token).
pub(crate) async fn authenticated(
    axum::extract::State(state): axum::extract::State<AppState>,
    auth: Auth,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<axum::response::Response, ApiError> {
    auth.for_write(&state).await?;
    let ending = req.method() == axum::http::Method::DELETE;
    let mut answer = next.run(req).await;
    // rmcp answers an ended session 202; MCP clients (the Python SDK among them) take only 200 or
    // 204 as success for a DELETE, so the end is answered 204.
    if ending && answer.status() == axum::http::StatusCode::ACCEPTED {
        *answer.status_mut() = axum::http::StatusCode::NO_CONTENT;
        *answer.body_mut() = axum::body::Body::empty();
    }
    Ok(answer)
}

/// The `/mcp` service.
pub(crate) fn service(state: AppState) -> StreamableHttpService<McpTools, LocalSessionManager> {
    // Every request carries a bearer token (checked before it gets here), which a browser on
    // another site cannot send: the DNS-rebinding guard on `Host` would only refuse the cluster's
    // own names behind a load balancer.
    let config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    StreamableHttpService::new(
        move || Ok(McpTools { state: state.clone(), watched: Arc::default() }),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// One MCP session's handler.
#[derive(Clone)]
pub(crate) struct McpTools {
    state: AppState,
    /// The sessions whose end this MCP session is told of.
    watched: Arc<Mutex<HashSet<String>>>,
}

impl ServerHandler for McpTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_logging().build())
            .with_server_info(Implementation::new("computerd", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Tools for the Computers this bot may use: list, acquire or create one, run commands, type into \
                 them, see and use its desktop, and call the MCP servers installed on it. A command still running \
                 when its call answers is reported by a notifications/message with kind computer_session when it \
                 ends.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = crate::bot_tools::registry()
            .iter()
            .map(|t| {
                let schema = match (t.parameters)() {
                    Value::Object(o) => o,
                    _ => serde_json::Map::new(),
                };
                Tool::new(t.name, t.description, Arc::new(schema))
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let parts = context
            .extensions
            .get::<axum::http::request::Parts>()
            .ok_or_else(|| ErrorData::internal_error("the call's HTTP request is not known", None))?;
        let origin = Origin::of(&parts.headers, &parts.extensions);
        // The caller of this very request (its token may differ from the session's first).
        let caller = match Auth::from_headers(&parts.headers) {
            Some(auth) => auth.for_write(&self.state).await,
            None => Err(ApiError::new(ErrorKind::Unauthorized, "a bearer token is needed")),
        };
        let caller = match caller {
            Ok(c) => c,
            Err(e) => return Ok(refused(&error_body(&e))),
        };
        let bot = caller.bot.as_ref().map(|b| b.id.clone());
        let arguments = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let computer = arguments.get("computerId").and_then(Value::as_str).map(str::to_string);
        let (_, status, result) =
            match super::bot_tools::run(&self.state, &origin, bot.as_deref(), &request.name, arguments).await {
                Ok(r) => r,
                Err(e) if e.kind == ErrorKind::NotFound => {
                    return Err(ErrorData::invalid_params(e.message, None));
                }
                Err(e) => return Ok(refused(&error_body(&e))),
            };
        if !status.is_success() {
            return Ok(refused(&result));
        }
        if let (Some(computer), Some(session), true) =
            (computer, result.get("session").and_then(Value::as_str), result["running"] == json!(true))
        {
            self.watch(context.peer.clone(), computer, session.to_string());
        }
        if request.name == "openbot_computer_desktop_stream" {
            return Ok(for_the_person(result).into());
        }
        Ok(answered(result).into())
    }
}

/// A desktop stream's answer: its link is content for the person (`audience: ["user"]`, for a
/// chat to show), the rest for the model.
fn for_the_person(mut result: Value) -> CallToolResult {
    let url = result.as_object_mut().and_then(|o| o.remove("url"));
    let Some(url) = url.as_ref().and_then(Value::as_str) else { return answered(result) };
    let audience = |role| Annotations::default().with_audience(vec![role]);
    let link = TextContent::new(url).with_annotations(audience(Role::User));
    result["note"] = json!("the link was given to the person (content for the user): ask them to open it");
    let rest = TextContent::new(result.to_string()).with_annotations(audience(Role::Assistant));
    CallToolResult::success(vec![ContentBlock::Text(link), ContentBlock::Text(rest)])
}

impl McpTools {
    /// Tells `peer` when session `session` of `computer` ends (once per session).
    fn watch(&self, peer: Peer<RoleServer>, computer: String, session: String) {
        {
            let mut watched = self.watched.lock().unwrap_or_else(|p| p.into_inner());
            if watched.len() >= MAX_WATCHED || !watched.insert(session.clone()) {
                return;
            }
        }
        let state = self.state.clone();
        let watched = self.watched.clone();
        tokio::spawn(async move {
            let ended = tokio::time::timeout(WATCH_AT_MOST, ended(&state, &peer, &session)).await;
            if let Ok(Some(end)) = ended {
                let data = json!({
                    "kind": "computer_session",
                    "computerId": computer,
                    "session": session,
                    "exitCode": end["exitCode"],
                    "signal": end["signal"],
                });
                let mut note = LoggingMessageNotificationParam::new(LoggingLevel::Info, data);
                note.logger = Some("computerd".into());
                if let Err(e) = peer.notify_logging_message(note).await {
                    tracing::debug!(%session, error = %e, "an MCP session was gone before its command ended");
                }
            }
            watched.lock().unwrap_or_else(|p| p.into_inner()).remove(&session);
        });
    }
}

/// Waits for the end of `session` in the store's events; `None` once `peer` is gone.
async fn ended(state: &AppState, peer: &Peer<RoleServer>, session: &str) -> Option<Value> {
    let mut changes = state.cluster.state().subscribe();
    loop {
        if let Some(data) = state.cluster.state().read(|s| s.session_end(session).map(|e| e.data.clone())) {
            return Some(data);
        }
        if peer.is_transport_closed() {
            return None;
        }
        if let Ok(Err(_)) = tokio::time::timeout(PEER_CHECK, changes.changed()).await {
            return None;
        }
    }
}

/// A refusal as the model sees it: the API's error body (kind, message), as a tool error.
fn refused(body: &Value) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(body.to_string())]).into()
}

/// The body the API answers for `e`.
fn error_body(e: &ApiError) -> Value {
    json!({"error": {"kind": e.kind.as_str(), "message": e.message}})
}

/// The base64 image and its media type in an answer: a screenshot's own (`data`, `mimeType`),
/// or the one after desktop actions (`screenshot`).
fn image_of(result: &Value) -> Option<(&str, &str)> {
    fn data(v: &Value) -> Option<(&str, &str)> {
        v.get("data")
            .and_then(Value::as_str)
            .zip(v.get("mimeType").and_then(Value::as_str).filter(|m| m.starts_with("image/")))
    }
    data(result).or_else(|| result.get("screenshot").and_then(data))
}

/// A tool's answer: a screenshot as image content (with the rest of the answer as text),
/// anything else as its JSON, also as structured content.
fn answered(result: Value) -> CallToolResult {
    if let Some((data, mime)) = image_of(&result) {
        let image = ContentBlock::image(data.to_string(), mime.to_string());
        let mut rest = result.clone();
        if let Some(o) = rest.as_object_mut() {
            o.remove("data");
            if let Some(s) = o.get_mut("screenshot").and_then(Value::as_object_mut) {
                s.remove("data");
            }
        }
        return CallToolResult::success(vec![image, ContentBlock::text(rest.to_string())]);
    }
    let mut r = CallToolResult::success(vec![ContentBlock::text(result.to_string())]);
    if result.is_object() {
        r.structured_content = Some(result);
    }
    r
}
