//! The HTTP edge: the accept loop of the API and of the agents' WebSocket.
//!
//! - At most `--max-connections` connections at once; one over the cap is closed at accept.
//! - TLS when `--tls-cert` and `--tls-key` are given (HTTPS and WSS; TLS 1.2 and 1.3, ALPN h2
//!   and http/1.1); the handshake must end within the header timeout.
//! - A request's headers must arrive within `--header-timeout-secs` (10 s), also the next
//!   request's on a kept-alive connection, so a slow or idle client cannot hold a connection.
//! - Every request carries the client's address (`ConnectInfo`), which the per-source limits
//!   read. With `--proxy-protocol`, a connection from a `--trusted-proxy` must start with a PROXY
//!   protocol header (v1 or v2, HAProxy's `send-proxy`/`send-proxy-v2`, for a balancer that
//!   passes TLS through), and the client it names is the connection's address; a connection from
//!   such a balancer without a valid header is closed.
//! - A client's `x-computerd-forwarded` is dropped: no client can claim that a node routed its
//!   call (a routed call is marked by the node that takes it, with a request extension).
//! - On shutdown, connections finish their requests (at most 30 s).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use hyper_util::rt::TokioTimer;
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

/// How the edge serves.
#[derive(Clone)]
pub struct Edge {
    /// TLS, if configured.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The most connections at once.
    pub max_connections: usize,
    /// How long a client has for its TLS handshake and each request's headers.
    pub header_timeout: Duration,
    /// The balancers whose connections start with a PROXY protocol header (empty: none).
    pub proxy_protocol_from: Arc<Vec<std::net::IpAddr>>,
}

/// The longest PROXY header read: v1's is at most 107 bytes; v2's address block is kept small.
const MAX_PROXY_V2: usize = 16 + 1024;

/// Reads the PROXY protocol header a balancer starts its connection with, consuming exactly its
/// bytes: the client's address it names, or `None` for a header about the balancer itself
/// (`LOCAL`, `UNKNOWN`: its health checks).
async fn proxy_header(tcp: &mut tokio::net::TcpStream) -> Result<Option<SocketAddr>, String> {
    use ppp::PartialResult;
    use tokio::io::AsyncReadExt;
    let io = |e: std::io::Error| format!("reading the PROXY header: {e}");
    let mut head = vec![0u8; 6];
    tcp.read_exact(&mut head).await.map_err(io)?;
    if head == b"PROXY " {
        // v1: a text line; read byte by byte so nothing after it is consumed.
        while !head.ends_with(b"\r\n") {
            if head.len() >= 107 {
                return Err("a PROXY v1 header longer than 107 bytes".into());
            }
            let mut b = [0u8; 1];
            tcp.read_exact(&mut b).await.map_err(io)?;
            head.push(b[0]);
        }
        let h = ppp::v1::Header::try_from(head.as_slice()).map_err(|e| format!("a bad PROXY v1 header: {e}"))?;
        return Ok(match h.addresses {
            ppp::v1::Addresses::Tcp4(a) => Some(SocketAddr::new(a.source_address.into(), a.source_port)),
            ppp::v1::Addresses::Tcp6(a) => Some(SocketAddr::new(a.source_address.into(), a.source_port)),
            ppp::v1::Addresses::Unknown => None,
        });
    }
    if head != b"\r\n\r\n\0\r" {
        return Err("the connection does not start with a PROXY header".into());
    }
    head.resize(16, 0);
    tcp.read_exact(&mut head[6..]).await.map_err(io)?;
    let len = u16::from_be_bytes([head[14], head[15]]) as usize;
    if 16 + len > MAX_PROXY_V2 {
        return Err(format!("a PROXY v2 header of {len} bytes"));
    }
    head.resize(16 + len, 0);
    tcp.read_exact(&mut head[16..]).await.map_err(io)?;
    let parsed = ppp::v2::Header::try_from(head.as_slice());
    if parsed.is_incomplete() {
        return Err("a truncated PROXY v2 header".into());
    }
    let h = parsed.map_err(|e| format!("a bad PROXY v2 header: {e}"))?;
    if h.command == ppp::v2::Command::Local {
        return Ok(None);
    }
    Ok(match h.addresses {
        ppp::v2::Addresses::IPv4(a) => Some(SocketAddr::new(a.source_address.into(), a.source_port)),
        ppp::v2::Addresses::IPv6(a) => Some(SocketAddr::new(a.source_address.into(), a.source_port)),
        ppp::v2::Addresses::Unspecified | ppp::v2::Addresses::Unix(_) => None,
    })
}

/// The TLS config of the edge from PEM files: the certificate chain and its key.
pub fn tls_config(cert: &std::path::Path, key: &std::path::Path) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate", cert.display()));
    }
    let key =
        PrivateKeyDer::from_pem_slice(&read(key)?).map_err(|e| format!("{}: not a PEM key: {e}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the TLS certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `app` on `listener` until `stop` turns true.
pub async fn serve(listener: TcpListener, app: Router, edge: Edge, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(edge.max_connections));
    let acceptor = edge.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::pin!(stopped);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stopped => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "over the connection cap; closed");
            continue;
        };
        // No Nagle delay: back-to-back small answers (session calls) must not wait for ACKs.
        let _ = tcp.set_nodelay(true);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(edge.header_timeout);
        builder.http2().timer(TokioTimer::new()).keep_alive_interval(Duration::from_secs(20));
        let watcher = graceful.watcher();
        let (acceptor, limit, app) = (acceptor.clone(), edge.header_timeout, app.clone());
        let proxied = edge.proxy_protocol_from.contains(&peer.ip());
        tokio::spawn(async move {
            let _slot = slot;
            let mut tcp = tcp;
            let mut client = peer;
            if proxied {
                match tokio::time::timeout(limit, proxy_header(&mut tcp)).await {
                    Ok(Ok(Some(c))) => client = c,
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "closed a balancer's connection"),
                    Err(_) => return tracing::debug!(%peer, "a balancer sent no PROXY header in time"),
                }
            }
            let service = TowerToHyperService::new(app.map_request(
                move |mut req: axum::extract::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(client));
                    // Only a node marks a call as routed to it, and never with a header.
                    req.headers_mut().remove(computerd_proto::FORWARDED);
                    req
                },
            ));
            let served = match acceptor {
                Some(acceptor) => match tokio::time::timeout(limit, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
                        watcher.watch(conn.into_owned()).await
                    }
                    Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "a TLS handshake failed"),
                    Err(_) => return tracing::debug!(%peer, "a TLS handshake timed out"),
                },
                None => {
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                    watcher.watch(conn.into_owned()).await
                }
            };
            if let Err(e) = served {
                tracing::debug!(%client, error = %e, "an HTTP connection ended");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown()).await.is_err() {
        tracing::warn!("HTTP connections still open after 30 s; closing them");
    }
}

/// The client's address of a request (set by [`serve`]).
pub fn peer_of(req: &axum::extract::Request) -> Option<SocketAddr> {
    req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0)
}
