//! An HTTPS client with a client certificate, for store-bench's etcd: hyper-util's pooled
//! client (the one reqwest is built on) over tokio-rustls with the ring provider, trusting one
//! CA only.
//!
//! The workspace's reqwest has no TLS feature, on purpose: its rustls features either bring
//! aws-lc-rs or (`rustls-no-provider`) make every reqwest client in the workspace need an
//! installed crypto provider. So this client does what the bench's reqwest client does
//! ([`crate::settings::http_client`]: HTTP/1.1, kept-alive connections, up to 256 idle per host,
//! `TCP_NODELAY`, no proxy, a 10 s timeout per request), over TLS.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context as TaskContext;
use std::task::Poll;
use std::time::Duration;

use anyhow::Context;
use anyhow::Result;
use anyhow::anyhow;
use bytes::Bytes;
use http::StatusCode;
use http::Uri;
use http_body_util::BodyExt;
use http_body_util::Full;
use hyper::rt::Read;
use hyper::rt::Write;
use hyper_util::client::legacy::connect::Connected;
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use hyper_util::rt::TokioTimer;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use tokio::net::TcpStream;

use crate::certs::CertFiles;

/// Per request, unless the call gives its own (as the bench's reqwest client).
const TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled HTTPS/1.1 client; cheap to clone (clones share the pool).
#[derive(Clone)]
pub struct Client {
    /// Behind an `Arc`: hyper-util's client is cheap to clone but some 300 bytes.
    inner: Arc<hyper_util::client::legacy::Client<TlsConnector, Full<Bytes>>>,
}

impl Client {
    /// A client that trusts only the CA in `ca` (PEM) and presents `identity`.
    pub fn new(ca: &std::path::Path, identity: &CertFiles) -> Result<Client> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).with_context(|| format!("read {}", ca.display()))? {
            roots.add(cert.context("CA certificate")?).context("trust the CA")?;
        }
        let chain = CertificateDer::pem_file_iter(&identity.cert)
            .with_context(|| format!("read {}", identity.cert.display()))?
            .collect::<Result<Vec<_>, _>>()
            .context("client certificate")?;
        let key =
            PrivateKeyDer::from_pem_file(&identity.key).with_context(|| format!("read {}", identity.key.display()))?;
        // The ring provider explicitly, as everywhere in the workspace: nothing is installed
        // process-wide. No ALPN: etcd's server offers h2, and without ALPN both sides speak
        // HTTP/1.1, the protocol of the bench's other client.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .context("client certificate and key")?;
        let connector = TlsConnector { tls: tokio_rustls::TlsConnector::from(Arc::new(config)) };
        let inner = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(256)
            .pool_timer(TokioTimer::new())
            .build(connector);
        Ok(Client { inner: Arc::new(inner) })
    }

    /// `GET url`: the status and the whole body.
    pub async fn get(&self, url: &str, timeout: Option<Duration>) -> Result<(StatusCode, Bytes)> {
        let req = http::Request::get(url).body(Full::default()).with_context(|| format!("GET {url}"))?;
        self.send(req, url, timeout).await
    }

    /// `POST url` with `body` as JSON: the status and the whole body.
    pub async fn post_json(
        &self,
        url: &str,
        body: &serde_json::Value,
        timeout: Option<Duration>,
    ) -> Result<(StatusCode, Bytes)> {
        let bytes = serde_json::to_vec(body).context("encode JSON")?;
        let req = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .with_context(|| format!("POST {url}"))?;
        self.send(req, url, timeout).await
    }

    /// Sends `req` and reads its body to the end (so the connection goes back to the pool).
    async fn send(
        &self,
        req: http::Request<Full<Bytes>>,
        url: &str,
        timeout: Option<Duration>,
    ) -> Result<(StatusCode, Bytes)> {
        let call = async {
            let resp = self.inner.request(req).await.map_err(|e| anyhow!("{url}: {}", chain(&e)))?;
            let status = resp.status();
            let body = resp.into_body().collect().await.with_context(|| format!("body of {url}"))?.to_bytes();
            Ok((status, body))
        };
        let timeout = timeout.unwrap_or(TIMEOUT);
        tokio::time::timeout(timeout, call).await.map_err(|_| anyhow!("{url}: no answer within {timeout:?}"))?
    }
}

/// `e` and its sources, `: `-separated (hyper-util's errors say little on their own).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!(": {s}"));
        source = s.source();
    }
    out
}

/// Dials `https://host:port` over TCP (`TCP_NODELAY`) and does the TLS handshake.
#[derive(Clone)]
struct TlsConnector {
    tls: tokio_rustls::TlsConnector,
}

impl tower_service::Service<Uri> for TlsConnector {
    type Response = TlsIo;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TlsIo>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move {
            if uri.scheme() != Some(&http::uri::Scheme::HTTPS) {
                return Err(io::Error::other(format!("{uri}: not an https:// URL")));
            }
            let host = uri.host().ok_or_else(|| io::Error::other(format!("{uri}: no host")))?;
            let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let name = ServerName::try_from(host).map_err(io::Error::other)?;
            Ok(TlsIo(TokioIo::new(tls.connect(name, tcp).await?)))
        })
    }
}

/// A TLS connection as hyper's IO (and hyper-util's pooled [`Connection`]).
struct TlsIo(TokioIo<tokio_rustls::client::TlsStream<TcpStream>>);

impl Connection for TlsIo {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl Read for TlsIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl Write for TlsIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::certs::Ca;

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// A one-shot TLS server on loopback with `server`'s certificate that requires a client
    /// certificate of `ca`, reads one request head and answers `200 ok`; it returns the request
    /// head, or the handshake's error.
    async fn serve_once(ca: &Ca, server: &CertFiles) -> (u16, tokio::task::JoinHandle<Result<String, String>>) {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(&ca.cert).expect("ca")).expect("root");
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .expect("verifier");
        let chain = vec![CertificateDer::from_pem_file(&server.cert).expect("cert")];
        let key = PrivateKeyDer::from_pem_file(&server.key).expect("key");
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.map_err(|e| e.to_string())?;
            let mut tls = acceptor.accept(tcp).await.map_err(|e| e.to_string())?;
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = tls.read(&mut buf).await.map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err("closed before the request".into());
                }
                head.extend_from_slice(&buf[..n]);
            }
            tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.map_err(|e| e.to_string())?;
            tls.flush().await.map_err(|e| e.to_string())?;
            Ok(String::from_utf8_lossy(&head).into_owned())
        });
        (port, task)
    }

    #[tokio::test]
    async fn speaks_https_with_a_client_certificate_of_the_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::new(dir.path(), "test CA").expect("ca");
        let server = ca.member("m1", &[]).expect("member");
        let client = Client::new(&ca.cert, &ca.client("client").expect("client cert")).expect("client");
        let (port, task) = serve_once(&ca, &server).await;
        let (status, body) = client
            .post_json(&format!("https://127.0.0.1:{port}/v3/kv/put"), &serde_json::json!({}), None)
            .await
            .expect("request");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&body[..], b"ok");
        let head = task.await.expect("server task").expect("server side");
        assert!(head.starts_with("POST /v3/kv/put HTTP/1.1\r\n"), "{head}");
        assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
    }

    #[tokio::test]
    async fn refuses_a_server_of_another_ca_and_plain_http() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ours = Ca::new(dir.path(), "our CA").expect("ca");
        let other_dir = dir.path().join("other");
        std::fs::create_dir(&other_dir).expect("mkdir");
        let other = Ca::new(&other_dir, "other CA").expect("other ca");
        let client = Client::new(&ours.cert, &ours.client("client").expect("client cert")).expect("client");
        let (port, task) = serve_once(&other, &other.member("m1", &[]).expect("member")).await;
        let err = client.get(&format!("https://127.0.0.1:{port}/health"), None).await.expect_err("must refuse");
        assert!(format!("{err:#}").contains("certificate"), "{err:#}");
        let _ = task.await;
        let err = client.get(&format!("http://127.0.0.1:{port}/health"), None).await.expect_err("must refuse");
        assert!(format!("{err:#}").contains("not an https:// URL"), "{err:#}");
    }
}
