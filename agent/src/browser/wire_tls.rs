//! The wire guard's TLS: how it sees into `https://` and `wss://` to keep each request to one send.
//!
//! Chromium reaches an `https://` origin through a `CONNECT` tunnel. When the first byte in the
//! tunnel opens a TLS handshake, the guard ends TLS itself, with a certificate for the tunnel's
//! host made on the spot and signed by a key of this proxy alone ([`Tls`]): a fresh ECDSA P-256
//! key per session, made in memory and never written anywhere. The session's Chromium accepts
//! those certificates because its command line names that key's SPKI hash
//! (`--ignore-certificate-errors-spki-list`, honoured only with a `--user-data-dir`, which every
//! session has); nothing else trusts them, and only the browser's account can reach the proxy.
//! The requests inside are then forwarded like plain ones: each once, on a new upstream
//! connection, over TLS verified against the system's roots (`/etc/ssl/certs`, or `SSL_CERT_FILE`
//! / `SSL_CERT_DIR`), speaking HTTP/2 when the server offers it (ALPN) and HTTP/1.1 otherwise.
//! A certificate the guard cannot verify is a load that fails with the net error Chromium would
//! have given (`net::ERR_CERT_AUTHORITY_INVALID`, …): the guard never lowers what is checked.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::PoisonError;
use std::task::Context;
use std::task::Poll;

use base64::Engine;
use rcgen::PublicKeyData;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::PrivatePkcs8KeyDer;
use rustls::pki_types::ServerName;
use sha2::Digest;
use tokio::io::AsyncRead;
use tokio::io::AsyncWrite;
use tokio::io::ReadBuf;

/// The first byte of a TLS record carrying a handshake (a ClientHello).
pub const HANDSHAKE: u8 = 0x16;
/// At most this many hosts' certificates are kept per session (then the cache starts again).
const LEAVES_MAX: usize = 256;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// One session's TLS: the key its certificates are made with, the certificates made so far, and
/// how it reaches servers.
pub struct Tls {
    key: rcgen::KeyPair,
    /// The key's SPKI, hashed (SHA-256) and in base64: what Chromium is told to accept.
    spki: String,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    /// To servers: HTTP/2 or HTTP/1.1.
    upstream: Arc<rustls::ClientConfig>,
    /// To servers, for an upgrade (a WebSocket): HTTP/1.1 only.
    upstream_h1: Arc<rustls::ClientConfig>,
}

impl Tls {
    /// A new key, and the system's roots plus `extra` for the servers.
    pub fn new(extra: &[CertificateDer<'static>]) -> Result<Tls, String> {
        let key = rcgen::KeyPair::generate().map_err(|e| format!("cannot make the proxy's key: {e}"))?;
        let spki =
            base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(key.subject_public_key_info()));
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        for cert in extra {
            roots.add(cert.clone()).map_err(|e| format!("an extra root: {e}"))?;
        }
        let roots = Arc::new(roots);
        let client = |alpn: &[&[u8]]| -> Result<Arc<rustls::ClientConfig>, String> {
            let mut c = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
            c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Ok(Arc::new(c))
        };
        Ok(Tls {
            key,
            spki,
            leaves: Mutex::new(HashMap::new()),
            upstream: client(&[b"h2", b"http/1.1"])?,
            upstream_h1: client(&[b"http/1.1"])?,
        })
    }

    /// Chromium's flag accepting this proxy's certificates (and no others' errors).
    pub fn flag(&self) -> String {
        format!("--ignore-certificate-errors-spki-list={}", self.spki)
    }

    /// How the guard answers the browser's TLS for `host`: a certificate for it (its name, or
    /// its address), HTTP/1.1.
    pub fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        let mut leaves = self.leaves.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = leaves.get(&host) {
            return Ok(c.clone());
        }
        let mut params = rcgen::CertificateParams::new(vec![host.clone()])
            .map_err(|e| format!("no certificate can name {host}: {e}"))?;
        params.distinguished_name.push(rcgen::DnType::CommonName, host.as_str());
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "computerd wire guard");
        let cert = params.self_signed(&self.key).map_err(|e| format!("cannot sign for {host}: {e}"))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .map_err(|e| format!("a certificate for {host}: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= LEAVES_MAX {
            leaves.clear();
        }
        leaves.insert(host, config.clone());
        Ok(config)
    }

    /// A TLS connection to `host` over `tcp`; answers it and whether it speaks HTTP/2.
    pub async fn connect(
        &self,
        host: &str,
        tcp: tokio::net::TcpStream,
        upgrade: bool,
    ) -> Result<(tokio_rustls::client::TlsStream<tokio::net::TcpStream>, bool), (&'static str, String)> {
        let bare = host.trim_start_matches('[').trim_end_matches(']').to_string();
        let name = ServerName::try_from(bare).map_err(|e| ("net::ERR_INVALID_URL", format!("{host}: {e}")))?;
        let config = if upgrade { &self.upstream_h1 } else { &self.upstream };
        let tls = tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| (net_error(&e), format!("TLS with {host}: {e}")))?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        Ok((tls, h2))
    }
}

/// The net error Chromium gives for a failed TLS handshake.
fn net_error(e: &std::io::Error) -> &'static str {
    use rustls::CertificateError as C;
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(c)) => match c {
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. } => {
                "net::ERR_CERT_DATE_INVALID"
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => "net::ERR_CERT_COMMON_NAME_INVALID",
            C::Revoked => "net::ERR_CERT_REVOKED",
            C::UnknownIssuer | C::BadSignature => "net::ERR_CERT_AUTHORITY_INVALID",
            _ => "net::ERR_CERT_INVALID",
        },
        Some(_) => "net::ERR_SSL_PROTOCOL_ERROR",
        None => match e.kind() {
            std::io::ErrorKind::ConnectionReset => "net::ERR_CONNECTION_RESET",
            std::io::ErrorKind::UnexpectedEof => "net::ERR_CONNECTION_CLOSED",
            _ => "net::ERR_SSL_PROTOCOL_ERROR",
        },
    }
}

/// A stream whose first byte was already read: it is read again first.
pub struct Prefixed<T> {
    first: Option<u8>,
    inner: T,
}

impl<T> Prefixed<T> {
    /// `inner`, whose byte `first` was read from it.
    pub fn new(first: u8, inner: T) -> Self {
        Prefixed { first: Some(first), inner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if buf.remaining() > 0
            && let Some(b) = self.first.take()
        {
            buf.put_slice(&[b]);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_signs_every_host_and_the_flag_names_it() {
        let tls = Tls::new(&[]).expect("tls");
        assert!(tls.flag().starts_with("--ignore-certificate-errors-spki-list="));
        let a = tls.server_config("Example.test").expect("a name");
        let again = tls.server_config("example.test").expect("again");
        assert!(Arc::ptr_eq(&a, &again), "kept per host");
        tls.server_config("127.0.0.1").expect("an address");
        tls.server_config("[::1]").expect("an IPv6 address");
        assert_eq!(a.alpn_protocols, vec![b"http/1.1".to_vec()]);
        let other = Tls::new(&[]).expect("tls");
        assert_ne!(tls.flag(), other.flag(), "a key per session");
    }
}
