//! The wire guard: a forward proxy of one browser session that never sends a request twice.
//!
//! Chromium sends a request again by itself when a *reused* connection closes before the answer
//! starts (it has no switch for that), a POST included: a server that took an upload and then
//! dropped the connection would count it twice while the action record said `done`. So every
//! session's Chromium goes through this proxy (`--proxy-server`, loopback included), which
//!
//! - accepts connections only from the account that runs the session's Chromium (the owner of
//!   the peer socket, read in `/proc/net/tcp{,6}`); anything else is closed and logged;
//! - sends each plain `http://` request on a NEW upstream connection (never a pooled one), once,
//!   in origin-form, without the hop-by-hop headers;
//! - always answers Chromium: when the upstream fails after the request may have been written
//!   and before a whole response head came back, with a `502` marked `x-computerd-wire:
//!   no-answer`; when nothing was sent (no connection), `502` marked `not-sent`. Chromium only
//!   re-sends when its connection closes without an answer, and this one never does that;
//! - closes Chromium's connection when a response body is cut midway (Chromium had the head: it
//!   does not re-send), and notes it `cut`;
//! - ends the TLS of a `CONNECT` tunnel (https, wss) itself ([`super::wire_tls`]) and forwards
//!   the requests inside the same way, over TLS verified against the system's roots, in HTTP/2
//!   when the server offers it; a tunnel that does not start with TLS is passed on as bytes;
//! - passes an upgrade (a WebSocket) on once its `101` came back;
//! - keeps a bounded log ([`Log`], the last [`LOG_SIZE`] requests): a sequence number, the
//!   method, the URL without its query and fragment (or the tunnel's `host:port`), and what came
//!   of it. Never a query, a header or a body: they may carry secrets.
//!
//! The proxy stops with its session.

use std::collections::BTreeSet;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::IpAddr;
use std::net::Ipv4Addr;
use std::net::Ipv6Addr;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::sync::PoisonError;
use std::task::Context;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http::HeaderName;
use http::HeaderValue;
use http::Method;
use http::Request;
use http::Response;
use http::StatusCode;
use http::Uri;
use http::header;
use http_body_util::BodyExt;
use http_body_util::Empty;
use http_body_util::Full;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::body::SizeHint;
use hyper_util::rt::TokioIo;
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::wire_tls::Prefixed;
use super::wire_tls::Tls;

/// The log keeps this many requests.
pub const LOG_SIZE: usize = 256;
/// An action's answer lists at most this many requests.
pub const WINDOW_MAX: usize = 32;
/// The header on the proxy's own answers.
pub const HEADER: &str = "x-computerd-wire";
/// On a `not-sent` answer for a server that could not be reached: the net error it stands for
/// (`net::ERR_NAME_NOT_RESOLVED`, `net::ERR_CONNECTION_REFUSED`, …) and why, as Chromium would
/// have failed the load without the proxy.
pub const ERROR_HEADER: &str = "x-computerd-wire-error";
/// How long an upstream connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A logged URL is cut to this many characters.
const MAX_URL: usize = 512;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// The ports of this process's proxies: a request to one of them is refused (a loop).
static PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

fn ports() -> MutexGuard<'static, BTreeSet<u16>> {
    PORTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What came of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Sent; no answer yet.
    Pending,
    /// Its answer's status (the head came back).
    Status(u16),
    /// It may have reached the server, whose answer was lost: the proxy answered `502`.
    NoAnswer,
    /// It never left (no connection).
    NotSent,
    /// The answer's body was cut midway: Chromium's connection was closed.
    Cut,
    /// A `CONNECT` tunnel was opened (what went through it is not seen).
    Tunnel,
}

impl Fate {
    /// Whether the server may have acted on it without the page knowing what it answered.
    pub fn lost(self) -> bool {
        matches!(self, Fate::NoAnswer | Fate::Cut)
    }
}

/// One logged request.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Its sequence number in the session (from 1).
    pub seq: u64,
    /// The method.
    pub method: String,
    /// The URL without userinfo, query and fragment (a tunnel: `host:port`).
    pub url: String,
    /// What came of it.
    pub fate: Fate,
}

impl Entry {
    /// Whether it may change something at the server: any method but `GET`, `HEAD`, `OPTIONS`
    /// and `TRACE` (a tunnel counts: what went through it is not seen).
    pub fn changes(&self) -> bool {
        !matches!(self.method.as_str(), "GET" | "HEAD" | "OPTIONS" | "TRACE")
    }

    /// `{"method", "url", "status"}` or `{"method", "url", "result"}`.
    pub fn to_json(&self) -> Value {
        let mut v = json!({"method": self.method, "url": self.url});
        let result = match self.fate {
            Fate::Status(s) => {
                v["status"] = json!(s);
                return v;
            }
            Fate::Pending => "pending",
            Fate::NoAnswer => "no answer",
            Fate::NotSent => "not sent",
            Fate::Cut => "cut",
            Fate::Tunnel => "tunnel",
        };
        v["result"] = json!(result);
        v
    }
}

/// The session's bounded log of what the proxy forwarded; clones share it.
#[derive(Clone, Default)]
pub struct Log {
    inner: Arc<LogInner>,
}

#[derive(Default)]
struct LogInner {
    ring: Mutex<Ring>,
    changed: tokio::sync::Notify,
}

#[derive(Default)]
struct Ring {
    /// The last sequence number given (0: none yet).
    last: u64,
    entries: VecDeque<Entry>,
}

impl Log {
    fn ring(&self) -> MutexGuard<'_, Ring> {
        self.inner.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes a request (pending); answers its sequence number.
    fn begin(&self, method: &str, url: String) -> u64 {
        let seq = {
            let mut r = self.ring();
            r.last += 1;
            let seq = r.last;
            if r.entries.len() >= LOG_SIZE {
                r.entries.pop_front();
            }
            r.entries.push_back(Entry { seq, method: method.to_string(), url, fate: Fate::Pending });
            seq
        };
        self.inner.changed.notify_waiters();
        seq
    }

    /// Notes what came of request `seq` (if it is still in the log).
    fn finish(&self, seq: u64, fate: Fate) {
        {
            let mut r = self.ring();
            if let Some(e) = r.entries.iter_mut().find(|e| e.seq == seq) {
                e.fate = fate;
            }
        }
        self.inner.changed.notify_waiters();
    }

    /// The sequence number the next request will have: a window's start.
    pub fn mark(&self) -> u64 {
        self.ring().last + 1
    }

    /// The requests from `mark` on, and whether some of them already left the log.
    pub fn since(&self, mark: u64) -> (Vec<Entry>, bool) {
        let r = self.ring();
        let entries: Vec<Entry> = r.entries.iter().filter(|e| e.seq >= mark).cloned().collect();
        let dropped = r.last >= mark && entries.first().is_none_or(|e| e.seq > mark);
        (entries, dropped)
    }

    /// [`Log::since`], once none of them is pending, or at `until` none that may change
    /// something ([`Entry::changes`]) is, or at `last`.
    pub async fn settled_since(
        &self,
        mark: u64,
        until: tokio::time::Instant,
        last: tokio::time::Instant,
    ) -> (Vec<Entry>, bool) {
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let got = self.since(mark);
            let pending = |e: &&Entry| e.fate == Fate::Pending;
            if !got.0.iter().any(|e| pending(&e)) {
                return got;
            }
            let deadline = if got.0.iter().filter(pending).any(Entry::changes) { last } else { until };
            if tokio::time::Instant::now() >= deadline {
                return got;
            }
            let _ = tokio::time::timeout_at(deadline, changed).await;
        }
    }
}

/// A session's proxy: listening on `127.0.0.1`, stopped when dropped (or by [`Wire::stop`]).
pub struct Wire {
    addr: SocketAddr,
    log: Log,
    stop: watch::Sender<bool>,
    tls: Arc<Tls>,
}

impl Wire {
    /// Starts a proxy that accepts connections from `uid`'s sockets only, trusting the system's
    /// roots and `extra_roots` for the servers it reaches over TLS.
    pub async fn start(uid: u32, extra_roots: &[CertificateDer<'static>]) -> std::io::Result<Wire> {
        let tls = Arc::new(Tls::new(extra_roots).map_err(std::io::Error::other)?);
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        ports().insert(addr.port());
        let (stop, stopped) = watch::channel(false);
        let log = Log::default();
        let ctx = Arc::new(Ctx { log: log.clone(), stop: stopped, tls: tls.clone() });
        tokio::spawn(accept(listener, addr, uid, ctx));
        Ok(Wire { addr, log, stop, tls })
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Its log.
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// Chromium's flags to go through it, loopback included (Chromium bypasses a proxy for
    /// loopback by default; `<-loopback>` removes that), accepting its certificates.
    pub fn flags(&self) -> [String; 3] {
        [format!("--proxy-server=http://{}", self.addr), "--proxy-bypass-list=<-loopback>".to_string(), self.tls.flag()]
    }

    /// Stops listening and ends its connections and tunnels.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.stop();
        ports().remove(&self.addr.port());
    }
}

/// Resolves when the proxy is stopped (or gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn accept(listener: TcpListener, me: SocketAddr, uid: u32, ctx: Arc<Ctx>) {
    let stop = ctx.stop.clone();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stopped(stop.clone()) => return,
            got = listener.accept() => match got {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "the wire guard cannot accept a connection");
                    // Out of descriptors, say: do not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let owner = peer_uid(peer, me).await;
        if owner != Some(uid) {
            tracing::warn!(peer = %peer, owner = ?owner, want = uid, "the wire guard refused a connection not from the browser's account");
            drop(stream);
            continue;
        }
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let stop = ctx.stop.clone();
            let service = hyper::service::service_fn(move |req| {
                let ctx = ctx.clone();
                async move { Ok::<_, Infallible>(handle(req, ctx).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::select! {
                _ = conn => {}
                _ = stopped(stop) => {}
            }
        });
    }
}

/// The uid owning the peer's socket, from `/proc/net/tcp` (then `tcp6`).
async fn peer_uid(peer: SocketAddr, me: SocketAddr) -> Option<u32> {
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = tokio::fs::read_to_string(table).await
            && let Some(uid) = socket_owner(&text, peer, me)
        {
            return Some(uid);
        }
    }
    None
}

/// In the text of `/proc/net/tcp` or `tcp6`: the uid of the established socket whose local
/// address is `peer` and whose remote address is `me` (the peer's own end of the connection).
pub fn socket_owner(table: &str, peer: SocketAddr, me: SocketAddr) -> Option<u32> {
    let canon = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (peer, me) = (canon(peer), canon(me));
    let mut found = None;
    for line in table.lines().skip(1) {
        // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || f[3] != "01" {
            continue;
        }
        let (Some(local), Some(remote)) = (proc_addr(f[1]), proc_addr(f[2])) else { continue };
        if local != peer || remote != me {
            continue;
        }
        let uid: u32 = f[7].parse().ok()?;
        // Two established sockets with one address pair cannot be; if the table says so, trust
        // neither.
        if found.is_some_and(|u| u != uid) {
            return None;
        }
        found = Some(uid);
    }
    found
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): each 32-bit word is printed as a
/// number in the host's byte order.
fn proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| ip.get(i * 8..i * 8 + 8).and_then(|w| u32::from_str_radix(w, 16).ok()).map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b)).to_canonical()
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

struct Ctx {
    log: Log,
    stop: watch::Receiver<bool>,
    tls: Arc<Tls>,
}

async fn handle(req: Request<Incoming>, ctx: Arc<Ctx>) -> Response<Body> {
    if req.method() == Method::CONNECT { tunnel(req, ctx).await } else { forward(req, &ctx, None).await }
}

/// The proxy's own answer.
fn own(status: StatusCode, mark: &'static str, text: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(text)).map_err(|e| match e {}).boxed_unsync());
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(HeaderName::from_static(HEADER), HeaderValue::from_static(mark));
    r
}

/// `host[:port]` without userinfo, IPv6 in brackets.
fn authority_of(host: &str, port: Option<u16>) -> String {
    match port {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    }
}

/// What is logged of a URL: scheme, host, port and path; never userinfo, query or fragment.
fn logged(uri: &Uri) -> String {
    let host = uri.host().unwrap_or_default();
    let mut url =
        format!("{}://{}{}", uri.scheme_str().unwrap_or("http"), authority_of(host, uri.port_u16()), uri.path());
    if url.chars().count() > MAX_URL {
        url = format!("{}…", url.chars().take(MAX_URL).collect::<String>());
    }
    url
}

/// Removes the hop-by-hop headers: `Connection` and those it names, and the fixed ones.
fn strip_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHORIZATION,
        HeaderName::from_static("keep-alive"),
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::TRANSFER_ENCODING,
    ] {
        h.remove(n);
    }
}

/// Why a server could not be reached: the net error it stands for, and the detail.
struct Unreached {
    net: &'static str,
    why: String,
}

impl std::fmt::Display for Unreached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// The proxy's `502 not-sent` for a server it could not reach, with [`ERROR_HEADER`].
fn unreached(u: &Unreached, text: String) -> Response<Body> {
    let mut r = own(StatusCode::BAD_GATEWAY, "not-sent", text);
    let v = format!("{} ({})", u.net, u.why);
    let v = HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(u.net));
    r.headers_mut().insert(HeaderName::from_static(ERROR_HEADER), v);
    r
}

/// A new connection to `host:port`; never one of this process's proxies.
async fn connect(host: &str, port: u16) -> Result<TcpStream, Unreached> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare, port))
        .await
        .map_err(|e| Unreached { net: "net::ERR_NAME_NOT_RESOLVED", why: format!("cannot resolve {host}: {e}") })?
        .collect();
    let mut why = Unreached { net: "net::ERR_NAME_NOT_RESOLVED", why: format!("{host} has no address") };
    for a in addrs {
        let ip = a.ip().to_canonical();
        if (ip.is_loopback() || ip.is_unspecified()) && ports().contains(&a.port()) {
            why = Unreached { net: "net::ERR_ACCESS_DENIED", why: format!("{a} is the browser's own proxy") };
            continue;
        }
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => {
                let net = match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => "net::ERR_CONNECTION_REFUSED",
                    std::io::ErrorKind::HostUnreachable | std::io::ErrorKind::NetworkUnreachable => {
                        "net::ERR_ADDRESS_UNREACHABLE"
                    }
                    _ => "net::ERR_CONNECTION_FAILED",
                };
                why = Unreached { net, why: format!("cannot connect to {a}: {e}") };
            }
            Err(_) => {
                why = Unreached { net: "net::ERR_CONNECTION_TIMED_OUT", why: format!("connecting to {a} timed out") }
            }
        }
    }
    Err(why)
}

/// Where a request goes.
struct Target {
    https: bool,
    /// As in a URL (an IPv6 address in brackets).
    host: String,
    port: u16,
}

/// Whether `Connection` names `token`.
fn connection_has(h: &HeaderMap, token: &str) -> bool {
    h.get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// What came of sending a request once.
#[allow(clippy::enum_variant_names)] // `NotSent` says what happened, as the provider errors do
enum Sent {
    Answer(Response<Incoming>),
    /// Nothing of it was written.
    NotSent(String),
    /// It may have reached the server.
    Lost(String),
}

/// Sends `parts` and `body` once on `io`, a new connection: in HTTP/2 when `h2` (the absolute
/// URI gives `:scheme` and `:authority`), else in HTTP/1.1 (origin-form, then `Connection:
/// close` unless it is an upgrade).
#[allow(clippy::too_many_arguments)] // one request's parts and how to send it
async fn send_once<T>(
    io: T,
    h2: bool,
    mut parts: http::request::Parts,
    body: Incoming,
    absolute: Uri,
    origin: Uri,
    upgrade: bool,
    stop: watch::Receiver<bool>,
) -> Sent
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if h2 {
        parts.headers.remove(header::HOST);
        parts.uri = absolute;
        parts.version = http::Version::HTTP_2;
        let (mut sender, conn) =
            match hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(io)).await {
                Ok(h) => h,
                Err(e) => return Sent::NotSent(format!("the HTTP/2 connection failed ({e})")),
            };
        tokio::spawn(async move {
            tokio::select! {
                _ = conn => {}
                _ = stopped(stop) => {}
            }
        });
        // Sent from here on (a GOAWAY or RST_STREAM after it is not believed: the server may
        // have acted before it said it did not).
        return match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(r) => Sent::Answer(r),
            Err(e) => Sent::Lost(e.to_string()),
        };
    }
    if !parts.headers.contains_key(header::HOST)
        && let Some(a) = absolute.authority()
        && let Ok(v) = HeaderValue::from_str(a.as_str())
    {
        parts.headers.insert(header::HOST, v);
    }
    if !upgrade {
        // One request per upstream connection.
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    parts.uri = origin;
    parts.version = http::Version::HTTP_11;
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(io)).await {
        Ok(h) => h,
        Err(e) => return Sent::NotSent(format!("the connection failed ({e})")),
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = conn.with_upgrades() => {}
            _ = stopped(stop) => {}
        }
    });
    // From here on a byte of the request may have been written: whatever happens, it is never
    // sent again, and Chromium gets an answer.
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(r) => Sent::Answer(r),
        Err(e) => Sent::Lost(e.to_string()),
    }
}

/// Forwards one request of the browser: a plain proxy request (`inside` None: absolute
/// `http://`), or one inside a tunnel whose TLS the guard ended (`inside`: its target).
async fn forward(mut req: Request<Incoming>, ctx: &Ctx, inside: Option<&Target>) -> Response<Body> {
    let uri = req.uri().clone();
    let target = match (inside, uri.scheme_str(), uri.host()) {
        (Some(t), _, _) => Target { https: t.https, host: t.host.clone(), port: t.port },
        (None, Some("http"), Some(host)) => {
            Target { https: false, host: host.to_string(), port: uri.port_u16().unwrap_or(80) }
        }
        _ => {
            return own(
                StatusCode::BAD_REQUEST,
                "not-sent",
                "This proxy takes absolute http:// requests and CONNECT; the request was not sent.\n".into(),
            );
        }
    };
    let (scheme, default_port) = if target.https { ("https", 443) } else { ("http", 80) };
    let authority = authority_of(&target.host, (target.port != default_port).then_some(target.port));
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let absolute = format!("{scheme}://{authority}{path}").parse::<Uri>();
    let log = &ctx.log;
    let seq = log.begin(req.method().as_str(), logged(absolute.as_ref().unwrap_or(&uri)));
    let (Ok(absolute), Ok(origin)) = (absolute, path.parse::<Uri>()) else {
        log.finish(seq, Fate::NotSent);
        return own(
            StatusCode::BAD_REQUEST,
            "not-sent",
            "The request's target is not valid; it was not sent.\n".into(),
        );
    };
    // An upgrade (a WebSocket) keeps its Connection and Upgrade, and is passed on after its 101.
    let upgrade = req.headers().get(header::UPGRADE).cloned().filter(|_| connection_has(req.headers(), "upgrade"));
    let browser_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let tcp = match connect(&target.host, target.port).await {
        Ok(s) => s,
        Err(why) => {
            log.finish(seq, Fate::NotSent);
            tracing::debug!(seq, why = %why, "the wire guard could not reach a server");
            return unreached(&why, format!("The server could not be reached ({why}); the request was not sent.\n"));
        }
    };
    let (mut parts, body) = req.into_parts();
    strip_hop(&mut parts.headers);
    if let Some(u) = &upgrade {
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, u.clone());
    }
    let stop = ctx.stop.clone();
    let sent = if target.https {
        match ctx.tls.connect(&target.host, tcp, upgrade.is_some()).await {
            Ok((tls, h2)) => send_once(tls, h2, parts, body, absolute, origin, upgrade.is_some(), stop).await,
            Err((net, why)) => {
                log.finish(seq, Fate::NotSent);
                let why = Unreached { net, why };
                return unreached(
                    &why,
                    format!("The server could not be reached ({why}); the request was not sent.\n"),
                );
            }
        }
    } else {
        send_once(tcp, false, parts, body, absolute, origin, upgrade.is_some(), stop).await
    };
    match sent {
        Sent::Answer(mut resp) => {
            log.finish(seq, Fate::Status(resp.status().as_u16()));
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS
                && let Some(browser_side) = browser_side
            {
                let server_side = hyper::upgrade::on(&mut resp);
                let stop = ctx.stop.clone();
                tokio::spawn(async move {
                    let (Ok(a), Ok(b)) = tokio::join!(browser_side, server_side) else { return };
                    let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                        _ = stopped(stop) => {}
                    }
                });
                let (parts, _) = resp.into_parts();
                return Response::from_parts(parts, Empty::new().map_err(|e| match e {}).boxed_unsync());
            }
            let (mut parts, body) = resp.into_parts();
            strip_hop(&mut parts.headers);
            parts.version = http::Version::HTTP_11;
            let body = Tracked { inner: body, log: log.clone(), seq }.map_err(|e| Box::new(e) as BoxError);
            Response::from_parts(parts, body.boxed_unsync())
        }
        Sent::NotSent(why) => {
            log.finish(seq, Fate::NotSent);
            own(StatusCode::BAD_GATEWAY, "not-sent", format!("{why}; the request was not sent.\n"))
        }
        Sent::Lost(e) => {
            log.finish(seq, Fate::NoAnswer);
            tracing::info!(seq, error = %e, "the wire guard got no answer to a request it sent; not sending it again");
            own(
                StatusCode::BAD_GATEWAY,
                "no-answer",
                "The server may have taken this request, and its answer was lost. It was not sent again.\n".into(),
            )
        }
    }
}

/// A `CONNECT`: answered at once; then, when the browser's first byte opens a TLS handshake, the
/// guard ends TLS and forwards the requests inside ([`intercept`]); anything else is passed on
/// as bytes ([`opaque`]).
async fn tunnel(mut req: Request<Incoming>, ctx: Arc<Ctx>) -> Response<Body> {
    let Some(host) = req.uri().host().map(String::from) else {
        return own(StatusCode::BAD_REQUEST, "not-sent", "CONNECT takes host:port.\n".into());
    };
    let port = req.uri().port_u16().unwrap_or(443);
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(up) = upgrade.await else { return };
        let mut up = TokioIo::new(up);
        let mut first = [0u8; 1];
        let read = tokio::select! {
            r = up.read(&mut first) => r,
            _ = stopped(ctx.stop.clone()) => return,
        };
        if !matches!(read, Ok(1)) {
            return;
        }
        let io = Prefixed::new(first[0], up);
        if first[0] == super::wire_tls::HANDSHAKE {
            intercept(io, Target { https: true, host, port }, ctx).await;
        } else {
            opaque(io, &host, port, &ctx).await;
        }
    });
    Response::new(Empty::new().map_err(|e| match e {}).boxed_unsync())
}

/// Ends the browser's TLS in a tunnel to `target` and serves the requests inside.
async fn intercept<T>(io: T, target: Target, ctx: Arc<Ctx>)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let config = match ctx.tls.server_config(&target.host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(host = %target.host, error = %e, "the wire guard has no certificate for a host");
            return;
        }
    };
    let stop = ctx.stop.clone();
    let tls = tokio::select! {
        t = tokio_rustls::TlsAcceptor::from(config).accept(io) => t,
        _ = stopped(stop.clone()) => return,
    };
    let tls = match tls {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(host = %target.host, error = %e, "the browser's TLS with the wire guard failed");
            return;
        }
    };
    let target = Arc::new(target);
    let service = hyper::service::service_fn(move |req| {
        let (ctx, target) = (ctx.clone(), target.clone());
        async move { Ok::<_, Infallible>(forward(req, &ctx, Some(&target)).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), service).with_upgrades();
    tokio::select! {
        _ = conn => {}
        _ = stopped(stop) => {}
    }
}

/// A tunnel that does not start with TLS (a `ws://` WebSocket, say): passed on as bytes, and
/// logged as a tunnel.
async fn opaque<T>(mut io: T, host: &str, port: u16, ctx: &Ctx)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let seq = ctx.log.begin("CONNECT", authority_of(host, Some(port)));
    let mut upstream = match connect(host, port).await {
        Ok(s) => s,
        Err(why) => {
            ctx.log.finish(seq, Fate::NotSent);
            tracing::debug!(seq, why = %why, "the wire guard could not reach a tunnel's server");
            return;
        }
    };
    ctx.log.finish(seq, Fate::Tunnel);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut io, &mut upstream) => {}
        _ = stopped(ctx.stop.clone()) => {}
    }
}

/// An upstream body, passed on; a failure midway is logged `cut` (and, as an error, makes the
/// server end Chromium's connection).
struct Tracked {
    inner: Incoming,
    log: Log,
    seq: u64,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let got = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Err(e))) = &got {
            self.log.finish(self.seq, Fate::Cut);
            tracing::info!(seq = self.seq, error = %e, "an answer's body was cut; closing the browser's connection");
        }
        got
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// A `/proc/net/tcp` of a little-endian machine: the proxy listens on 127.0.0.1:40000
    /// (0x9C40); the browser's socket 127.0.0.1:51234 (0xC822, uid 1001) is connected to it, and
    /// the proxy's accepted end (uid 0) is the mirror row; a TIME_WAIT row of the same pair
    /// (uid 0) is not taken.
    #[cfg(target_endian = "little")]
    #[test]
    fn the_peer_socket_owner_is_read_from_proc_net_tcp() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:9C40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:9C40 0100007F:C822 01 00000000:00000000 00:00000000 00000000     0        0 1002 1 0000000000000000 20 4 30 10 -1\n\
   2: 0100007F:C822 0100007F:9C40 06 00000000:00000000 03:00000ABC 00000000     0        0 0 3 0000000000000000\n\
   3: 0100007F:C822 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1001        0 1003 1 0000000000000000 20 4 30 10 -1\n";
        let me: SocketAddr = "127.0.0.1:40000".parse().expect("addr");
        let peer: SocketAddr = "127.0.0.1:51234".parse().expect("addr");
        assert_eq!(socket_owner(table, peer, me), Some(1001));
        assert_eq!(socket_owner(table, me, peer), Some(0), "the mirror row is the proxy's own end");
        let other: SocketAddr = "127.0.0.1:51235".parse().expect("addr");
        assert_eq!(socket_owner(table, other, me), None);
        assert_eq!(socket_owner("garbage\n 0: zz:zz yy 01 a b c 5\n", peer, me), None);
        // tcp6: a v4-mapped pair, and a real IPv6 loopback pair.
        let table6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0000000000000000FFFF00000100007F:C822 0000000000000000FFFF00000100007F:9C40 01 00000000:00000000 00:00000000 00000000  1001        0 1 1 0\n\
   1: 00000000000000000000000001000000:C823 00000000000000000000000001000000:9C40 01 00000000:00000000 00:00000000 00000000  1002        0 2 1 0\n";
        assert_eq!(socket_owner(table6, peer, me), Some(1001));
        let peer6: SocketAddr = "[::1]:51235".parse().expect("addr");
        let me6: SocketAddr = "[::1]:40000".parse().expect("addr");
        assert_eq!(socket_owner(table6, peer6, me6), Some(1002));
    }

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic eA=="),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("host", "example.test"),
            ("cookie", "a=b"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort();
        assert_eq!(left, vec!["cookie", "host"]);
    }

    #[test]
    fn the_log_is_bounded_and_never_holds_a_query() {
        let log = Log::default();
        let mark = log.mark();
        let uri: Uri = "http://user:pw@example.test:8080/a/b?token=secret#frag".parse().expect("uri");
        let seq = log.begin("POST", logged(&uri));
        log.finish(seq, Fate::NoAnswer);
        let (got, dropped) = log.since(mark);
        assert!(!dropped);
        assert_eq!(got[0].url, "http://example.test:8080/a/b");
        assert_eq!(
            got[0].to_json(),
            json!({"method": "POST", "url": "http://example.test:8080/a/b", "result": "no answer"})
        );
        for _ in 0..LOG_SIZE {
            log.begin("GET", "http://x/".into());
        }
        let (got, dropped) = log.since(mark);
        assert_eq!((got.len(), dropped), (LOG_SIZE, true));
        let (got, dropped) = log.since(log.mark());
        assert_eq!((got.len(), dropped), (0, false));
    }

    /// A server on 127.0.0.1 that answers each connection with `answer(request)` (None: closes
    /// without a word once the request's head is read); it counts connections.
    async fn server<F>(answer: F) -> (u16, Arc<Mutex<Vec<String>>>)
    where
        F: Fn(&str) -> Option<Vec<u8>> + Send + Sync + 'static,
    {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind");
        let port = l.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (answer, seen2) = (Arc::new(answer), seen.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let (answer, seen) = (answer.clone(), seen2.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).to_string();
                    seen.lock().expect("lock").push(head.clone());
                    if let Some(a) = answer(&head) {
                        let _ = s.write_all(&a).await;
                    }
                    let _ = s.shutdown().await;
                });
            }
        });
        (port, seen)
    }

    /// Sends `request` to the proxy on one connection; answers all it got back until EOF.
    async fn through(proxy: u16, request: &str) -> Vec<u8> {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, proxy)).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
        out
    }

    #[tokio::test]
    async fn a_request_goes_once_and_a_lost_answer_is_a_502() {
        let me = nix::unistd::geteuid().as_raw();
        let wire = Wire::start(me, &[]).await.expect("wire");
        let p = wire.port();
        // Answered: in origin-form, its Host kept, without hop-by-hop headers, on a new connection.
        let (ok, seen) =
            server(|_| Some(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello".to_vec())).await;
        let got = through(
            p,
            &format!("GET http://127.0.0.1:{ok}/x?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{ok}\r\nProxy-Connection: keep-alive\r\nConnection: close\r\n\r\n"),
        )
        .await;
        let got = String::from_utf8_lossy(&got).to_string();
        assert!(got.starts_with("HTTP/1.1 200 OK") && got.ends_with("hello"), "{got}");
        let head = seen.lock().expect("lock")[0].to_ascii_lowercase();
        assert!(head.starts_with("get /x?q=1 http/1.1\r\n"), "{head}");
        assert!(head.contains(&format!("host: 127.0.0.1:{ok}")) && !head.contains("proxy-connection"), "{head}");
        // Lost: the server reads it and closes; the proxy answers 502, and the server saw it once.
        let (lose, seen) = server(|_| None).await;
        let got = through(
            p,
            &format!("POST http://127.0.0.1:{lose}/submit HTTP/1.1\r\nHost: 127.0.0.1:{lose}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
        )
        .await;
        let got = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(got.starts_with("http/1.1 502") && got.contains("x-computerd-wire: no-answer"), "{got}");
        assert_eq!(seen.lock().expect("lock").len(), 1, "sent once");
        // Not sent: nothing listens.
        let free = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind");
        let closed = free.local_addr().expect("addr").port();
        drop(free);
        let got =
            through(p, &format!("GET http://127.0.0.1:{closed}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
                .await;
        let got = String::from_utf8_lossy(&got).to_ascii_lowercase();
        assert!(got.starts_with("http/1.1 502") && got.contains("x-computerd-wire: not-sent"), "{got}");
        assert!(got.contains("x-computerd-wire-error: net::err_connection_refused (cannot connect to"), "{got}");
        // A loop to the proxy itself is refused.
        let got =
            through(p, &format!("GET http://127.0.0.1:{p}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).await;
        assert!(String::from_utf8_lossy(&got).to_ascii_lowercase().contains("x-computerd-wire: not-sent"));
        // Cut: the head and part of the body, then the server closes; so does the proxy.
        let (cut, _) = server(|_| Some(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart".to_vec())).await;
        let got = through(p, &format!("GET http://127.0.0.1:{cut}/big HTTP/1.1\r\nHost: x\r\n\r\n")).await;
        assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200 OK"));
        let log: Vec<Value> = wire.log().since(1).0.iter().map(Entry::to_json).collect();
        assert_eq!(
            log,
            vec![
                json!({"method": "GET", "url": format!("http://127.0.0.1:{ok}/x"), "status": 200}),
                json!({"method": "POST", "url": format!("http://127.0.0.1:{lose}/submit"), "result": "no answer"}),
                json!({"method": "GET", "url": format!("http://127.0.0.1:{closed}/"), "result": "not sent"}),
                json!({"method": "GET", "url": format!("http://127.0.0.1:{p}/"), "result": "not sent"}),
                json!({"method": "GET", "url": format!("http://127.0.0.1:{cut}/big"), "result": "cut"}),
            ]
        );
    }

    #[tokio::test]
    async fn a_connection_from_another_account_is_refused() {
        let other = nix::unistd::geteuid().as_raw().wrapping_add(1);
        let wire = Wire::start(other, &[]).await.expect("wire");
        let (ok, seen) = server(|_| Some(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_vec())).await;
        let got = through(
            wire.port(),
            &format!("GET http://127.0.0.1:{ok}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
        assert!(seen.lock().expect("lock").is_empty(), "nothing was forwarded");
        assert!(wire.log().since(1).0.is_empty());
    }
}
