//! The TLS transport of node-to-node gRPC: the server's incoming connections (handshakes in
//! their own tasks, each connection closed once its certificate is revoked), the client
//! connector of the channels, and the layer that lets only enrolling through without a node
//! certificate.

use std::future::Future;
use std::net::IpAddr;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::task::Poll;
use std::time::Duration;

use futures::Stream;
use tokio::io::AsyncRead;
use tokio::io::AsyncWrite;
use tokio::io::ReadBuf;
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::TlsConnector;

use super::PeerIdentity;
use super::Pki;
use super::certs::identity_of;
use super::verify::server_name;

/// How long a client has to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// The only call open to a caller without a node certificate.
pub const ENROLL_PATH: &str = "/computerd.cluster.v1.ClusterService/Enroll";

/// One accepted, authenticated connection.
pub struct NodeStream {
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    peer: PeerIdentity,
    /// Fires when the peer's certificate is revoked: the connection then fails.
    revoked: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl NodeStream {
    fn check(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        if let Some(r) = self.revoked.as_mut()
            && let Poll::Ready(Ok(())) = Pin::new(r).poll(cx)
        {
            return Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "the peer's certificate was revoked"));
        }
        Ok(())
    }
}

impl AsyncRead for NodeStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for NodeStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for NodeStream {
    type ConnectInfo = PeerIdentity;

    fn connect_info(&self) -> PeerIdentity {
        self.peer
    }
}

/// The TLS connections accepted on `listener`: each handshake runs in its own task (a slow
/// client holds up no one), and a connection whose certificate is revoked later is closed.
pub fn incoming(
    listener: TcpListener,
    pki: Arc<Pki>,
) -> Result<impl Stream<Item = Result<NodeStream, std::io::Error>> + Send + 'static, super::CertError> {
    let acceptor = TlsAcceptor::from(pki.server_config()?);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<NodeStream, std::io::Error>>(64);
    tokio::spawn(async move {
        loop {
            let (tcp, from) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a gRPC connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx, pki) = (acceptor.clone(), tx.clone(), pki.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let stream = accepted(tls, &pki);
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%from, error = %e, "a gRPC TLS handshake failed"),
                    Err(_) => tracing::debug!(%from, "a gRPC TLS handshake timed out"),
                }
            });
        }
    });
    Ok(tokio_stream_of(rx))
}

fn tokio_stream_of<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The identity of an accepted connection, and its watch for revocation.
fn accepted(tls: tokio_rustls::server::TlsStream<TcpStream>, pki: &Arc<Pki>) -> NodeStream {
    let id = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(identity_of);
    let addr = tls.get_ref().0.peer_addr().ok();
    let Some(id) = id else { return NodeStream { tls, peer: PeerIdentity { node_id: None, addr }, revoked: None } };
    let (fire, revoked) = tokio::sync::oneshot::channel();
    let mut watch = pki.revoked.subscribe();
    tokio::spawn(async move {
        let mut fire = fire;
        loop {
            if watch.borrow_and_update().get(&id.node_id).is_some_and(|before| id.not_before <= *before) {
                tracing::info!(node_id = id.node_id, "closing a connection of a revoked node");
                let _ = fire.send(());
                return;
            }
            tokio::select! {
                changed = watch.changed() => if changed.is_err() { return },
                _ = fire.closed() => return,
            }
        }
    });
    NodeStream { tls, peer: PeerIdentity { node_id: Some(id.node_id), addr }, revoked: Some(revoked) }
}

/// The connector of a node's channels: TCP from the node's source address (if set), without
/// Nagle, then TLS with `config`.
#[derive(Clone)]
pub struct Connector {
    config: Arc<rustls::ClientConfig>,
    source: Option<IpAddr>,
}

impl Connector {
    /// A connector with `config`, dialing from `source`.
    pub fn new(config: Arc<rustls::ClientConfig>, source: Option<IpAddr>) -> Self {
        Self { config, source }
    }
}

type Io = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = Io;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Io, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let (config, source) = (self.config.clone(), self.source);
        Box::pin(async move {
            let bad = || std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("not host:port: {uri}"));
            let host = uri.host().ok_or_else(bad)?.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().ok_or_else(bad)?;
            let addr: SocketAddr = match host.parse::<IpAddr>() {
                Ok(ip) => SocketAddr::new(ip, port),
                Err(_) => tokio::net::lookup_host((host, port)).await?.next().ok_or_else(bad)?,
            };
            let socket =
                if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
            if let Some(ip) = source {
                socket.bind(SocketAddr::new(ip, 0))?;
            }
            socket.set_nodelay(true)?;
            let tcp = socket.connect(addr).await?;
            let tls = TlsConnector::from(config).connect(server_name(), tcp).await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        })
    }
}

/// The layer of the node's gRPC server that refuses every call but enrolling from a caller
/// without a node certificate of this cluster (`UNAUTHENTICATED`, before the call runs).
#[derive(Clone, Copy, Default)]
pub struct RequireNode;

impl<S> tower::Layer<S> for RequireNode {
    type Service = RequireNodeService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequireNodeService { inner }
    }
}

/// See [`RequireNode`].
#[derive(Clone)]
pub struct RequireNodeService<S> {
    inner: S,
}

impl<S, B> tower_service::Service<http::Request<B>> for RequireNodeService<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let known = req.extensions().get::<PeerIdentity>().is_some_and(|p| p.node_id.is_some());
        if known || req.uri().path() == ENROLL_PATH {
            let fut = self.inner.call(req);
            return Box::pin(fut);
        }
        let status = tonic::Status::unauthenticated("this call needs a node certificate of this cluster");
        Box::pin(async move { Ok(status.into_http()) })
    }
}
