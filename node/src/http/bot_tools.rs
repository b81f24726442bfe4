//! The bot tools over HTTP, for frameworks without MCP: `GET /v1/tools?format=openai|anthropic`
//! lists them as JSON schemas, `POST /v1/tools/call {"name", "arguments"}` runs one
//! ([`crate::bot_tools`]).
//!
//! A call becomes its API request and goes through this node's router in process, with the
//! caller's own `Authorization` and address: rights, token limits, deciders, the route group's
//! bounds and the routing to a Computer's link owner all apply exactly as to the API call.

use axum::Json;
use axum::extract::ConnectInfo;
use axum::extract::Query;
use axum::extract::Request;
use axum::extract::State;
use axum::http::HeaderValue;
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;
use tower::ServiceExt;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use crate::bot_tools::Args;

/// The largest tool call body, and the largest answer passed back.
const MAX_BODY: usize = 1 << 20;
const MAX_ANSWER: usize = 4 << 20;

/// `GET /v1/tools` query.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// `openai`, `anthropic`, or absent (`{name, description, parameters}`).
    format: Option<String>,
}

/// `GET /v1/tools?format=`: the bot tools as JSON schemas.
#[utoipa::path(get, path = "/v1/tools", operation_id = "bot_tools_list", tag = "tools", params(ListQuery), responses((status = 200, description = "`{\"tools\": [...]}` in the asked format", body = Object), (status = 400, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    auth.for_write(&state).await?;
    let Query(q) = q.map_err(|e| ApiError::invalid(e.body_text()))?;
    let tools = match q.format.as_deref() {
        None => crate::bot_tools::registry()
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "parameters": (t.parameters)()}))
            .collect(),
        Some(f) => crate::bot_tools::listed(f)
            .ok_or_else(|| ApiError::invalid("format must be openai or anthropic (or absent)"))?,
    };
    Ok(Json(json!({"tools": tools})))
}

/// `POST /v1/tools/call` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallIn {
    /// The tool's name.
    name: String,
    /// Its arguments (an object).
    #[serde(default)]
    #[schema(value_type = Object)]
    arguments: Value,
}

/// `POST /v1/tools/call {"name", "arguments"}`: runs one bot tool; answers the API's answer
/// (`{"tool", "status", "result"}`), or its error as the API gives it.
#[utoipa::path(post, path = "/v1/tools/call", operation_id = "bot_tools_call", tag = "tools", request_body = CallIn, responses((status = 200, description = "`{\"tool\", \"status\", \"result\"}`", body = Object), (status = 400, body = ErrorBody), (status = 404, description = "no such tool", body = ErrorBody)), security(("bearer" = [])))]
pub async fn call(State(state): State<AppState>, auth: Auth, req: Request) -> Result<Response, ApiError> {
    let caller = auth.for_write(&state).await?;
    let origin = Origin::of(req.headers(), req.extensions());
    let bytes = axum::body::to_bytes(req.into_body(), MAX_BODY)
        .await
        .map_err(|_| ApiError::new(ErrorKind::TooLarge, "a tool call's body is at most 1 MiB"))?;
    let b: CallIn = serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid(format!("not a tool call: {e}")))?;
    let bot = caller.bot.as_ref().map(|b| b.id.clone());
    let (tool, status, result) = run(&state, &origin, bot.as_deref(), &b.name, b.arguments).await?;
    if status.is_success() {
        Ok(Json(json!({"tool": tool.name, "status": status.as_u16(), "result": result})).into_response())
    } else {
        // The API's error, kind and all, as it answered it.
        Ok((status, Json(result)).into_response())
    }
}

/// Who made a tool call, as the API request it becomes must carry it: the caller's own
/// `Authorization`, address and forwarding header.
#[derive(Clone, Default)]
pub(crate) struct Origin {
    authorization: Option<HeaderValue>,
    forwarded: Option<HeaderValue>,
    /// `Host`, `X-Forwarded-Host` and `X-Forwarded-Proto`: where a link the answer carries (a
    /// desktop stream's) points.
    host: Vec<(&'static str, HeaderValue)>,
    peer: Option<ConnectInfo<std::net::SocketAddr>>,
}

impl Origin {
    /// The origin of the request with these headers and extensions.
    pub(crate) fn of(headers: &axum::http::HeaderMap, extensions: &axum::http::Extensions) -> Self {
        Self {
            authorization: headers.get(AUTHORIZATION).cloned(),
            forwarded: headers.get("x-forwarded-for").cloned(),
            host: ["host", "x-forwarded-host", "x-forwarded-proto"]
                .into_iter()
                .filter_map(|h| headers.get(h).map(|v| (h, v.clone())))
                .collect(),
            peer: extensions.get::<ConnectInfo<std::net::SocketAddr>>().cloned(),
        }
    }
}

/// Runs tool `name` as the API request it becomes, through this node's router in process:
/// answers the tool, the API's status and its JSON answer (an error body when not a success).
/// `bot` is the caller's bot, for the routes under `/api/bots/:botId`.
pub(crate) async fn run(
    state: &AppState,
    origin: &Origin,
    bot: Option<&str>,
    name: &str,
    arguments: Value,
) -> Result<(&'static crate::bot_tools::BotTool, StatusCode, Value), ApiError> {
    let tool = crate::bot_tools::find(name).ok_or_else(|| ApiError::not_found(format!("no tool named {name}")))?;
    let arguments = if arguments.is_null() { json!({}) } else { arguments };
    if !arguments.is_object() {
        return Err(ApiError::invalid("arguments must be an object"));
    }
    let api =
        (tool.request)(&Args(&arguments), bot).map_err(|e| ApiError::invalid(format!("{}: {}", tool.name, e.0)))?;
    let body = api.body.as_ref().map(Value::to_string).unwrap_or_default();
    let mut inner = Request::builder()
        .method(api.method)
        .uri(&api.path)
        .body(axum::body::Body::from(body))
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("cannot make the request: {e}")))?;
    let headers = inner.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(a) = &origin.authorization {
        headers.insert(AUTHORIZATION, a.clone());
    }
    if let Some(f) = &origin.forwarded {
        headers.insert("x-forwarded-for", f.clone());
    }
    for (h, v) in &origin.host {
        headers.insert(*h, v.clone());
    }
    if let Some(p) = &origin.peer {
        inner.extensions_mut().insert(*p);
    }
    let answer = match super::router(state.clone()).oneshot(inner).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let bytes = axum::body::to_bytes(answer.into_body(), MAX_ANSWER)
        .await
        .map_err(|_| ApiError::new(ErrorKind::TooLarge, "the tool's answer is over 4 MiB"))?;
    // An answer with no body (204: a file deleted, a port closed) says what happened.
    let result: Value = if bytes.is_empty() && status.is_success() {
        json!({"done": true})
    } else {
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    };
    Ok((tool, status, result))
}
