//! Requests to a public port address (`Host: <port>-<label>.<public domain>`), on any node: the
//! label's hash is looked up in the store; the exposer's rights are checked (a paused Computer
//! is resumed with them, as a stored execution); then one tunnel through the owner's agent link
//! to `127.0.0.1:<port>` carries the request as HTTP/1.1: streaming bodies both ways, server-sent
//! events, and WebSocket (any `Upgrade`) connections. The node holding the link checks the
//! address again at a current read before it opens the tunnel, so an address ended by `DELETE`
//! is refused by every node at once; a request on a kept connection (the node's pool) is checked
//! at a current read by the node serving it, so a node whose replica lags refuses it too. A
//! service's cookies lose their `Domain` (each stays on its own address). The label never
//! reaches a log.
//!
//! Every answer names the node holding the link in [`LINK_NODE`], so a balancer can send the
//! address's next requests straight there (`deploy/haproxy.cfg` learns it per address in a
//! stick table): a node without the link would otherwise add a hop to every request. A
//! service's own header of that name is dropped.

use std::pin::Pin;
use std::task::Context;
use std::task::Poll;

use axum::extract::Request;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::HeaderName;
use axum::http::HeaderValue;
use axum::http::StatusCode;
use axum::http::header;
use axum::middleware::Next;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;
use computerd_raft::sm::PortResolved;
use futures::Stream;
use futures::stream::BoxStream;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncRead;
use tokio::io::AsyncWrite;
use tokio::io::ReadBuf;

use super::ApiError;
use super::AppState;
use crate::tunnel::Opening;

/// The response header that names the node holding the Computer's link (its id).
pub const LINK_NODE: &str = "x-computerd-link-node";

/// Serves the request when its `Host` is a public port address; any other goes to the API.
pub async fn by_host(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).or_else(|| req.uri().host());
    let Some((port, label)) = host.and_then(|h| state.public_domain.match_host(h)) else {
        return next.run(req).await;
    };
    match proxy(&state, port, &label, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn proxy(state: &AppState, port: u16, label: &str, mut req: Request) -> Result<Response, ApiError> {
    let hash = computerd_raft::sm::hash_secret(label);
    let mut resolved = state.cluster.state().read(|s| s.resolve_port(&hash, port));
    if resolved == PortResolved::Gone {
        // This replica may not have applied the exposure yet.
        state.cluster.read_barrier().await?;
        resolved = state.cluster.state().read(|s| s.resolve_port(&hash, port));
    }
    let (exposure, exposer) = match resolved {
        PortResolved::Open(e, c) => (e, c),
        PortResolved::AwaitingApproval => return Err(crate::tunnel::awaiting().into()),
        PortResolved::Gone => return Err(crate::tunnel::no_address().into()),
    };
    let computer = exposure.computer_id;
    // The request is anonymous: a paused Computer resumes with the exposer's rights.
    super::calls::admit(state, &exposer, &computer, true).await?;
    let upgrade = wants_upgrade(req.headers());
    let from_client = upgrade.then(|| hyper::upgrade::on(&mut req));
    let peer = crate::edge::peer_of(&req).map(|p| p.ip());
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    parts.uri = path.parse().map_err(|_| ApiError::invalid("bad request target"))?;
    // The service speaks HTTP/1.1 whatever the client spoke to the node.
    parts.version = axum::http::Version::HTTP_11;
    strip_hop_headers(&mut parts.headers, upgrade);
    if let Some(ip) = peer {
        let forwarded = match parts.headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(before) => format!("{before}, {ip}"),
            None => ip.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&forwarded) {
            parts.headers.insert(HeaderName::from_static("x-forwarded-for"), v);
        }
    }
    if !parts.headers.contains_key("x-forwarded-proto") {
        let proto = HeaderValue::from_static(state.public_domain.scheme());
        parts.headers.insert(HeaderName::from_static("x-forwarded-proto"), proto);
    }
    state.activity.touch(&computer);
    // A kept connection if one is ready (a request it could not take, the service having
    // closed it, goes on a new one); else a new tunnel.
    let pooled = if upgrade { None } else { state.port_pool.take(&hash) };
    let reused = pooled.is_some();
    if reused {
        // A new connection is checked by the link's node at a current read when its tunnel
        // opens; a kept one is checked here, at a current read too, request by request: a
        // replica that lags behind a `DELETE` (or a revoked right) must not serve on it.
        state.cluster.read_barrier().await?;
        match state.cluster.state().read(|s| s.resolve_port(&hash, port)) {
            PortResolved::Open(e, _) if e.computer_id == computer => {}
            PortResolved::AwaitingApproval => return Err(crate::tunnel::awaiting().into()),
            _ => return Err(crate::tunnel::no_address().into()),
        }
    }
    let mut sender = match pooled {
        Some(s) => s,
        None => connect(state, &computer, port, &hash).await?,
    };
    let mut resp = match sender.try_send_request(Request::from_parts(parts, body)).await {
        Ok(r) => r,
        Err(mut e) => match e.take_message() {
            Some(req) if reused => {
                sender = connect(state, &computer, port, &hash).await?;
                sender.send_request(req).await.map_err(|e| bad_gateway(port, &e))?
            }
            _ => return Err(bad_gateway(port, &e.into_error())),
        },
    };
    if !upgrade {
        state.port_pool.put(&hash, sender);
    }
    let headers = resp.headers_mut();
    headers.remove(LINK_NODE);
    if let Some(node) = state.owners.link_node_hint(&computer) {
        headers.insert(HeaderName::from_static(LINK_NODE), HeaderValue::from(node));
    }
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(from_client) = from_client
    {
        let to_service = hyper::upgrade::on(&mut resp);
        let (activity, id) = (state.activity.clone(), computer.clone());
        let ended = ended(state, &hash, port);
        tokio::spawn(async move {
            let (Ok(client), Ok(service)) = (from_client.await, to_service.await) else { return };
            let (mut client, mut service) = (TokioIo::new(client), TokioIo::new(service));
            // An open connection is work: the Computer is not idle while it lasts.
            let copy = tokio::io::copy_bidirectional(&mut client, &mut service);
            tokio::pin!(copy);
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(30));
            tokio::pin!(ended);
            loop {
                tokio::select! {
                    _ = &mut copy => break,
                    // The address ended: the connection ends with it (both sides dropped).
                    _ = &mut ended => break,
                    _ = tick.tick() => activity.touch(&id),
                }
            }
        });
        return Ok(resp.map(axum::body::Body::new));
    }
    strip_hop_headers(resp.headers_mut(), false);
    strip_cookie_domains(resp.headers_mut());
    // Our side of the connection is HTTP/1.1 whatever the service answered with (Python's
    // http.server says HTTP/1.0).
    *resp.version_mut() = axum::http::Version::HTTP_11;
    if resp.headers().contains_key(header::CONTENT_LENGTH) {
        return Ok(resp.map(axum::body::Body::new));
    }
    // A streamed answer (server-sent events, chunked) ends when its address does.
    use futures::StreamExt;
    use http_body_util::BodyExt;
    let ended = ended(state, &hash, port);
    Ok(resp.map(|b| axum::body::Body::from_stream(b.into_data_stream().take_until(ended))))
}

/// Resolves once the address no longer serves at this node's replica: ended, its Computer
/// deleted, or its exposer's right gone.
fn ended(state: &AppState, hash: &str, port: u16) -> impl std::future::Future<Output = ()> + Send + 'static {
    let reader = state.cluster.state().clone();
    let hash = hash.to_string();
    async move {
        let mut applied = reader.subscribe();
        loop {
            if !matches!(reader.read(|s| s.resolve_port(&hash, port)), PortResolved::Open(..)) {
                return;
            }
            if applied.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

/// A new connection to the port: a tunnel (here or through the link's node), HTTP/1.1 over it.
async fn connect(state: &AppState, computer: &str, port: u16, hash: &str) -> Result<crate::ports::Sender, ApiError> {
    let opening = Opening::Port { port, label_hash: hash.to_string() };
    let pipe = match crate::tunnel::open_anywhere(state, computer, &opening).await {
        // Just resumed, its link came up on another node while this one waited: once more.
        Err(e) if e.kind == ErrorKind::Unavailable => crate::tunnel::open_anywhere(state, computer, &opening).await?,
        other => other?,
    };
    let io = TokioIo::new(PipeIo { tx: pipe.0, rx: pipe.1, pending: bytes::Bytes::new() });
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, axum::body::Body>(io)
        .await
        .map_err(|e| bad_gateway(port, &e))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "a port connection ended");
        }
    });
    Ok(sender)
}

fn bad_gateway(port: u16, e: &hyper::Error) -> ApiError {
    ApiError::new(
        ErrorKind::ComputerExecutionFailed,
        format!("the service on port {port} did not answer over HTTP/1.1: {e}"),
    )
}

/// `Connection: upgrade` with an `Upgrade` header.
fn wants_upgrade(h: &HeaderMap) -> bool {
    h.contains_key(header::UPGRADE)
        && h.get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Drops the hop-by-hop headers (RFC 9110 §7.6.1), and those `Connection` names; an upgrade
/// keeps `Connection: upgrade` and `Upgrade`.
fn strip_hop_headers(h: &mut HeaderMap, upgrade: bool) {
    let named: Vec<String> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty() && t != "upgrade")
        .collect();
    for n in named {
        h.remove(n.as_str());
    }
    for n in [
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
    ] {
        h.remove(n);
    }
    h.remove(header::CONNECTION);
    if upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        h.remove(header::UPGRADE);
    }
}

/// Drops the `Domain` attribute of every cookie a service sets: each is then host-only, for
/// its own address, and never reaches the other addresses under the public domain (nor the
/// domain itself). A value that is not a cookie is left as it is.
fn strip_cookie_domains(h: &mut HeaderMap) {
    let cookies: Vec<HeaderValue> = h.get_all(header::SET_COOKIE).iter().map(without_domain).collect();
    if cookies.is_empty() {
        return;
    }
    h.remove(header::SET_COOKIE);
    for c in cookies {
        h.append(header::SET_COOKIE, c);
    }
}

/// A `Set-Cookie` value without its `Domain` attributes (the first part, `name=value`, stays
/// whatever its name).
fn without_domain(v: &HeaderValue) -> HeaderValue {
    let bytes = v.as_bytes();
    let mut parts = bytes.split(|b| *b == b';');
    let mut out = parts.next().unwrap_or_default().to_vec();
    let mut dropped = false;
    for attr in parts {
        let name = attr.split(|b| *b == b'=').next().unwrap_or_default().trim_ascii();
        if name.eq_ignore_ascii_case(b"domain") {
            dropped = true;
            continue;
        }
        out.push(b';');
        out.extend_from_slice(attr);
    }
    if !dropped {
        return v.clone();
    }
    // Made of the bytes of a valid value, less some: valid too (kept as it was otherwise).
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| v.clone())
}

/// A tunnel as a byte stream for hyper.
struct PipeIo {
    tx: Pin<Box<dyn futures::Sink<bytes::Bytes, Error = std::io::Error> + Send>>,
    rx: BoxStream<'static, bytes::Bytes>,
    pending: bytes::Bytes,
}

impl AsyncRead for PipeIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let me = &mut *self;
        while me.pending.is_empty() {
            match Pin::new(&mut me.rx).poll_next(cx) {
                Poll::Ready(Some(data)) => me.pending = data,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = buf.remaining().min(me.pending.len());
        buf.put_slice(&me.pending.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for PipeIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        std::task::ready!(self.tx.as_mut().poll_ready(cx))?;
        // At most 256 KiB per message of the tunnel.
        let n = data.len().min(256 * 1024);
        self.tx.as_mut().start_send(bytes::Bytes::copy_from_slice(&data[..n]))?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.tx.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.tx.as_mut().poll_close(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 36, item 10: no cookie keeps a `Domain`, whatever its case or spacing; the rest of
    /// each, and a cookie named `Domain`, stay.
    #[test]
    fn i36_10_cookies_lose_their_domain() {
        let mut h = HeaderMap::new();
        for c in [
            "a=1; Domain=example.com; Path=/; HttpOnly",
            "b=2; path=/; domain=.EXAMPLE.com ; Secure",
            "c=3; Path=/",
            "d=x;Domain=example.com",
            "Domain=name; Path=/; DOMAIN",
        ] {
            h.append(header::SET_COOKIE, c.parse().expect("v"));
        }
        h.insert("x-app", "kept".parse().expect("v"));
        strip_cookie_domains(&mut h);
        let got: Vec<&str> = h.get_all(header::SET_COOKIE).iter().filter_map(|v| v.to_str().ok()).collect();
        assert_eq!(got, ["a=1; Path=/; HttpOnly", "b=2; path=/; Secure", "c=3; Path=/", "d=x", "Domain=name; Path=/"]);
        assert_eq!(h["x-app"], "kept");
    }

    #[test]
    fn hop_headers_go_and_upgrades_keep_theirs() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, x-secret, Upgrade".parse().expect("v"));
        h.insert("x-secret", "1".parse().expect("v"));
        h.insert("keep-alive", "timeout=5".parse().expect("v"));
        h.insert(header::UPGRADE, "websocket".parse().expect("v"));
        h.insert("x-app", "kept".parse().expect("v"));
        assert!(wants_upgrade(&h));
        let mut plain = h.clone();
        strip_hop_headers(&mut plain, false);
        assert_eq!(plain.len(), 1, "{plain:?}");
        assert_eq!(plain["x-app"], "kept");
        strip_hop_headers(&mut h, true);
        assert_eq!(h[header::CONNECTION], "upgrade");
        assert_eq!(h[header::UPGRADE], "websocket");
        assert!(!h.contains_key("x-secret") && !h.contains_key("keep-alive"));
        assert!(!wants_upgrade(&HeaderMap::new()));
    }
}
