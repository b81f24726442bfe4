//! The HTTP edge: the accept loop of the API and of the agents' WebSocket.
//!
//! - At most `--max-connections` connections at once; one over the cap is closed at accept.
//! - TLS when `--tls-cert` and `--tls-key` are given (HTTPS and WSS; TLS 1.2 and 1.3, ALPN h2
//!   and http/1.1); the handshake must end within the header timeout.
//! - A request's headers must arrive within `--header-timeout-secs` (10 s), also the next
//!   request's on a kept-alive connection, so a slow or idle client cannot hold a connection.
//! - Every request carries the client's address (`ConnectInfo`), which the per-source limits
//!   read.
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
        let service = TowerToHyperService::new(app.clone().map_request(
            move |mut req: axum::extract::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req
            },
        ));
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(edge.header_timeout);
        builder.http2().timer(TokioTimer::new()).keep_alive_interval(Duration::from_secs(20));
        let watcher = graceful.watcher();
        let (acceptor, limit) = (acceptor.clone(), edge.header_timeout);
        tokio::spawn(async move {
            let _slot = slot;
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
                tracing::debug!(%peer, error = %e, "an HTTP connection ended");
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
