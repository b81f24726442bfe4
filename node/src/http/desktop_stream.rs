//! A person's stream of a Computer's desktop (noVNC in the browser):
//!
//! 1. `POST …/desktop/stream {"mode": "view"|"control"}` (a bearer token; on the link's node)
//!    answers `{"url"}` with a single-use ticket valid 60 s ([`crate::desktop_streams`]). The
//!    stream is always a person's: a bot asks for its member, and `control` only when its grant
//!    has `desktopControl`; the lease then names the member (`person:member:…`), never the bot.
//! 2. `GET …/desktop/view?ticket=` (routed to the link's node) redeems it once for an HttpOnly
//!    cookie bound to that one stream (path `/v1/computers/{id}/desktop`) and redirects to noVNC's
//!    page, `…/desktop/view/vnc.html`, whose assets load with the cookie.
//! 3. `GET …/desktop/websockify` (the WebSocket, on any node) opens the stream's tunnel
//!    ([`crate::tunnel`]): on the link's node directly, else through `Routing.Tunnel` to it; the link's node checks
//!    the cookie (once: it opens one stream), the caller's rights again, and asks the agent, which
//!    filters the viewer's input by mode and lease. No VNC port is open outside the Computer and
//!    no password travels.

use std::path::Path;

use axum::Json;
use axum::extract::Path as UrlPath;
use axum::extract::Query;
use axum::extract::State;
use axum::extract::WebSocketUpgrade;
use axum::extract::ws::Message;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;
use computerd_raft::sm::Source;
use futures::FutureExt;
use futures::SinkExt;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::calls::agent_for;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::Body;
use crate::desktop_streams::Grant;
use crate::desktop_streams::Mode;

/// The cookie's name.
pub const COOKIE: &str = "computerd_stream";

/// `POST …/desktop/stream` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamIn {
    /// `view` (watch only) or `control` (watch and use: takes the input lease).
    #[schema(value_type = String)]
    mode: Mode,
}

/// `POST /v1/computers/:id/desktop/stream`
#[utoipa::path(post, path = "/v1/computers/{id}/desktop/stream", operation_id = "desktop_stream", tag = "desktop", params(("id" = String, Path)), request_body = StreamIn, responses((status = 200, description = "`{\"url\", \"mode\", \"expiresInSecs\"}`: the URL carries a single-use ticket", body = Object), (status = 403, description = "`Forbidden`: a bot asked for `control` and its grant does not allow `desktopControl`", body = ErrorBody), (status = 422, description = "`ComputerUnsupported`: no desktop, or a paired machine", body = ErrorBody)), security(("bearer" = [])))]
pub async fn stream(
    State(state): State<AppState>,
    auth: Auth,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    body: Body<StreamIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let Json(b) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    state.cluster.state().read(|s| {
        let c = s.visible_computer(&caller, &id)?;
        match c.source {
            Source::Paired => {
                Err(ApiError::new(ErrorKind::ComputerUnsupported, "a paired machine has no desktop stream"))
            }
            Source::Provider { .. } if !c.desktop => Err(ApiError::new(
                ErrorKind::ComputerUnsupported,
                "this computer was created without a desktop (create one with \"desktop\": true)",
            )),
            Source::Provider { .. } => Ok(()),
        }
    })?;
    // A bot asks for a stream for its member, a person: `view` as any caller who sees the
    // Computer, `control` only when its grant allows it (checked again when the stream opens).
    if b.mode == Mode::Control {
        state.cluster.state().read(|s| s.may_control_desktop(&caller, &id))?;
    }
    // On the link's node (resumed first if paused), where the stream will be opened.
    agent_for(&state, &caller, &id, b.mode == Mode::Control).await?;
    let grant =
        Grant { computer: id.clone(), mode: b.mode, token_id: caller.token.id.clone(), holder: holder_of(&caller) };
    let ticket = state
        .streams
        .mint(grant)
        .ok_or_else(|| ApiError::new(ErrorKind::RateLimited, "too many desktop stream tickets are outstanding"))?;
    let url = format!("{}/v1/computers/{id}/desktop/view?ticket={ticket}", origin(&headers));
    let secs = crate::desktop_streams::TICKET_TTL.as_secs();
    Ok(Json(json!({"url": url, "mode": b.mode, "expiresInSecs": secs})))
}

/// The person a stream's lease names: the member, whether they asked or their bot did (a bot
/// never holds the desktop as a person).
fn holder_of(caller: &computerd_raft::sm::Caller) -> String {
    format!("person:member:{}", caller.member.id)
}

/// `scheme://host` of the request, as its client addressed it.
fn origin(headers: &HeaderMap) -> String {
    let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    let host = get("x-forwarded-host").or_else(|| get("host")).unwrap_or("localhost");
    let scheme = get("x-forwarded-proto").unwrap_or("http");
    format!("{scheme}://{host}")
}

fn cookie_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// `?ticket=`
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TicketQuery {
    ticket: String,
}

fn bad_ticket() -> ApiError {
    ApiError::new(ErrorKind::Unauthorized, "the ticket is unknown, used or expired: ask for a new stream URL")
}

/// `GET /v1/computers/:id/desktop/view?ticket=`
#[utoipa::path(get, path = "/v1/computers/{id}/desktop/view", operation_id = "desktop_view", tag = "desktop", params(("id" = String, Path), ("ticket" = String, Query, description = "The single-use ticket of a stream URL")), responses((status = 303, description = "Sets the stream's cookie and goes to noVNC's page"), (status = 401, body = ErrorBody)))]
pub async fn view(
    State(state): State<AppState>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    q: Result<Query<TicketQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Ok(Query(q)) = q else { return Err(bad_ticket()) };
    let cookie = state.streams.redeem(&id, &q.ticket).ok_or_else(bad_ticket)?;
    let base = format!("/v1/computers/{id}/desktop");
    let secure = if origin(&headers).starts_with("https:") { "; Secure" } else { "" };
    let set = format!(
        "{COOKIE}={cookie}; Path={base}; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        crate::desktop_streams::COOKIE_TTL.as_secs()
    );
    let page = format!("{base}/view/vnc.html?autoconnect=1&reconnect=0&resize=scale&path={}/websockify", &base[1..]);
    Ok((StatusCode::SEE_OTHER, [(header::LOCATION, page), (header::SET_COOKIE, set)]).into_response())
}

/// `GET /v1/computers/:id/desktop/view/{file}`: noVNC's page and assets, for the stream's cookie.
#[utoipa::path(get, path = "/v1/computers/{id}/desktop/view/{file}", operation_id = "desktop_asset", tag = "desktop", params(("id" = String, Path), ("file" = String, Path)), responses((status = 200, description = "A file of noVNC"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn asset(
    State(state): State<AppState>,
    UrlPath((id, file)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let ok = cookie_of(&headers).is_some_and(|c| state.streams.valid(&id, &c));
    if !ok {
        return Err(ApiError::new(
            ErrorKind::Unauthorized,
            "no stream cookie for this computer: open the stream URL again",
        ));
    }
    let bytes = read_asset(&state.novnc_dir, &file).await?;
    let mime = match file.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript",
        Some("css") => "text/css",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    };
    Ok(([(header::CONTENT_TYPE, mime), (header::CACHE_CONTROL, "no-store")], bytes).into_response())
}

/// A file under noVNC's directory: no `..`, no hidden parts, nothing outside it after links.
async fn read_asset(dir: &Path, file: &str) -> Result<Vec<u8>, ApiError> {
    let parts_ok = !file.is_empty()
        && file.split('/').all(|p| !p.is_empty() && !p.starts_with('.') && !p.contains('\\'))
        && file.len() < 256;
    let missing = || ApiError::not_found("no such file of noVNC");
    if !parts_ok {
        return Err(missing());
    }
    let root = tokio::fs::canonicalize(dir).await.map_err(|_| {
        ApiError::new(
            ErrorKind::Unavailable,
            format!("noVNC is not installed on this node ({}: apt-get install novnc, or --novnc-dir)", dir.display()),
        )
    })?;
    let path = tokio::fs::canonicalize(root.join(file)).await.map_err(|_| missing())?;
    if !path.starts_with(&root) {
        return Err(missing());
    }
    let meta = tokio::fs::metadata(&path).await.map_err(|_| missing())?;
    if !meta.is_file() || meta.len() > 8 << 20 {
        return Err(missing());
    }
    tokio::fs::read(&path).await.map_err(|_| missing())
}

/// The largest WebSocket message of a stream to its viewer.
const VIEWER_MESSAGE: usize = 64 * 1024;

/// `GET /v1/computers/:id/desktop/websockify`: the stream's WebSocket (binary RFB), on any node.
#[utoipa::path(get, path = "/v1/computers/{id}/desktop/websockify", operation_id = "desktop_websocket", tag = "desktop", params(("id" = String, Path)), responses((status = 101, description = "The stream (RFB over WebSocket), for the stream's cookie"), (status = 401, body = ErrorBody), (status = 409, description = "`InputBusy`: another person controls the desktop", body = ErrorBody)))]
pub async fn websocket(
    State(state): State<AppState>,
    UrlPath(id): UrlPath<String>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let cookie = cookie_of(&headers)
        .ok_or_else(|| ApiError::new(ErrorKind::Unauthorized, "no stream cookie: open the stream URL first"))?;
    let (mut to_computer, mut from_computer) =
        crate::tunnel::open_anywhere(&state, &id, &crate::tunnel::Opening::Stream { cookie })
            .await
            .map_err(ApiError::from)?;
    Ok(ws.protocols(["binary"]).on_upgrade(move |socket| async move {
        let (mut out, mut inp) = socket.split();
        let up = async move {
            while let Some(Ok(m)) = inp.next().await {
                let data = match m {
                    Message::Binary(b) => b,
                    Message::Close(_) => break,
                    _ => continue,
                };
                if to_computer.send(data).await.is_err() {
                    break;
                }
            }
        };
        let down = async move {
            // What has come is written together, with one flush (a frame is many messages), in
            // messages of at most 64 KiB: tungstenite moves what a socket did not take to the
            // front of its buffer after each write, so a big message costs more than its size.
            let feed = async |out: &mut futures::stream::SplitSink<_, Message>, mut data: bytes::Bytes| {
                while !data.is_empty() {
                    let piece = data.split_to(data.len().min(VIEWER_MESSAGE));
                    out.feed(Message::Binary(piece)).await?;
                }
                Ok::<(), axum::Error>(())
            };
            'stream: while let Some(data) = from_computer.next().await {
                if feed(&mut out, data).await.is_err() {
                    break;
                }
                while let Some(more) = from_computer.next().now_or_never() {
                    let Some(data) = more else { break 'stream };
                    if feed(&mut out, data).await.is_err() {
                        break 'stream;
                    }
                }
                if out.flush().await.is_err() {
                    break;
                }
            }
            let _ = out.close().await;
        };
        tokio::select! { _ = up => {}, _ = down => {} }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_and_origins_are_read_from_the_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, "a=1; computerd_stream=abc; b=2".parse().expect("header"));
        h.insert(header::HOST, "node:8080".parse().expect("header"));
        assert_eq!(cookie_of(&h).as_deref(), Some("abc"));
        assert_eq!(origin(&h), "http://node:8080");
        h.insert("x-forwarded-proto", "https".parse().expect("header"));
        h.insert("x-forwarded-host", "lb.example".parse().expect("header"));
        assert_eq!(origin(&h), "https://lb.example");
        assert_eq!(cookie_of(&HeaderMap::new()), None);
    }

    #[tokio::test]
    async fn assets_stay_inside_novnc() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(dir.path().join("vnc.html"), "page").expect("write");
        std::fs::create_dir(dir.path().join("app")).expect("mkdir");
        std::fs::write(dir.path().join("app/ui.js"), "js").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("out")).expect("link");
        assert_eq!(read_asset(dir.path(), "vnc.html").await.ok(), Some(b"page".to_vec()));
        assert_eq!(read_asset(dir.path(), "app/ui.js").await.ok(), Some(b"js".to_vec()));
        for bad in ["../etc/passwd", "out", "app/../../x", ".hidden", "", "app//ui.js"] {
            assert!(read_asset(dir.path(), bad).await.is_err(), "{bad}");
        }
        let none = read_asset(Path::new("/nonexistent-novnc"), "vnc.html").await.expect_err("not installed");
        assert_eq!(none.kind, ErrorKind::Unavailable);
    }
}
