//! One HTTP/1.1 exchange with a provider's REST API, on its own connection, that says exactly
//! how far it got (the remote providers' adapters, [`crate::e2b`] and [`crate::daytona`]).
//!
//! A call is one attempt: no pool, no retry, no redirect followed (a credential only ever goes to
//! the configured endpoint). Until the connection (and its TLS handshake) is up nothing was sent:
//! a failure or the deadline there is [`ProviderError::NotSent`]. From the moment the request is
//! handed to the connection, a cut, an unreadable answer or the deadline is
//! [`ProviderError::Lost`]. An answer comes back with its status whatever it is; the adapter
//! decides what it means.
//!
//! TLS is rustls with the ring provider, trusting the system's roots (or one pinned CA); plain
//! `http://` is for tests and local fakes, and the adapters refuse it for anything but a loopback
//! address.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::Full;
use http_body_util::Limited;
use hyper_util::rt::TokioIo;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::ServerName;
use rustls::pki_types::pem::PemObject;
use tokio::net::TcpStream;

use crate::provider::ProviderError;

/// The most an answer body may hold (provider answers are small JSON documents).
const MAX_ANSWER: usize = 4 << 20;

/// A provider's API base URL, parsed and checked once.
#[derive(Clone)]
pub struct Endpoint {
    host: String,
    port: u16,
    /// The path prefix of every route (no trailing slash), e.g. `/api`.
    base: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `host[:port]` for the Host header.
    authority: String,
    /// The largest answer read.
    max_answer: usize,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.base)
    }
}

/// An answer: its status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body (at most [`MAX_ANSWER`] bytes).
    pub body: Bytes,
    /// `Retry-After`, when given in seconds.
    pub retry_after: Option<u64>,
    /// `X-Next-Token` (E2B's pagination), when given.
    pub next_token: Option<String>,
}

impl Answer {
    /// The body as JSON (an unreadable one is `Value::Null`).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The body as text for a message, cut at 300 bytes.
    pub fn excerpt(&self) -> String {
        let s = String::from_utf8_lossy(&self.body);
        let mut end = s.len().min(300);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].to_string()
    }
}

fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl Endpoint {
    /// Parses `url` (`https://host[:port][/base]`, or `http://` to a loopback address only);
    /// `ca_pem` pins a private CA instead of the system's roots. User input: every problem is
    /// named.
    pub fn parse(url: &str, ca_pem: Option<&str>) -> Result<Endpoint, String> {
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!("endpoint {url:?} must be an https:// URL"));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') || path.contains(['?', '#']) {
            return Err(format!("endpoint {url:?}: give scheme, host, optional port and path only"));
        }
        let default_port = if https { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let Some((h, after)) = v6.split_once(']') else { return Err(format!("endpoint {url:?}: bad host")) };
            match after.strip_prefix(':') {
                Some(p) => (h.to_string(), p.parse::<u16>().map_err(|_| format!("endpoint {url:?}: bad port"))?),
                None if after.is_empty() => (h.to_string(), default_port),
                None => return Err(format!("endpoint {url:?}: bad host")),
            }
        } else {
            match authority.split_once(':') {
                Some((h, p)) => (h.to_string(), p.parse::<u16>().map_err(|_| format!("endpoint {url:?}: bad port"))?),
                None => (authority.to_string(), default_port),
            }
        };
        if !https && !is_loopback(&host) {
            return Err(format!(
                "endpoint {url:?}: plain http:// would send the credential in clear; use https:// (http:// is allowed to a loopback address only)"
            ));
        }
        let tls = if https {
            let mut roots = rustls::RootCertStore::empty();
            match ca_pem {
                Some(pem) => {
                    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                        let cert = cert.map_err(|e| format!("the endpoint's CA: not PEM certificates: {e}"))?;
                        roots.add(cert).map_err(|e| format!("the endpoint's CA: {e}"))?;
                    }
                    if roots.is_empty() {
                        return Err("the endpoint's CA: no certificate".into());
                    }
                }
                None => {
                    for cert in rustls_native_certs::load_native_certs().certs {
                        // A system root rustls cannot use is skipped, as every TLS client does.
                        let _ = roots.add(cert);
                    }
                }
            }
            let mut config =
                rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Some(Arc::new(config))
        } else {
            None
        };
        Ok(Endpoint {
            host,
            port,
            base: path.trim_end_matches('/').to_string(),
            tls,
            authority: authority.to_string(),
            max_answer: MAX_ANSWER,
        })
    }

    /// Reads answers of up to `bytes` (instead of 4 MiB).
    pub fn with_max_answer(mut self, bytes: usize) -> Self {
        self.max_answer = bytes;
        self
    }

    /// Sends one request (`path` after the base, with its query) and reads the answer, within
    /// `deadline` in all.
    pub async fn call(
        &self,
        method: http::Method,
        path: &str,
        headers: &[(&str, &str)],
        json: Option<&serde_json::Value>,
        deadline: Duration,
    ) -> Result<Answer, ProviderError> {
        let until = tokio::time::Instant::now() + deadline;
        let what = format!("{method} {}{path}", self.base);
        // Connecting: nothing has been sent yet, whatever happens here.
        let sender = tokio::time::timeout_at(until, self.connect())
            .await
            .map_err(|_| ProviderError::NotSent(format!("{what}: no connection to {self:?} within {deadline:?}")))??;
        let body = match json {
            Some(v) => Bytes::from(serde_json::to_vec(v).map_err(|e| ProviderError::NotSent(e.to_string()))?),
            None => Bytes::new(),
        };
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(http::header::HOST, &self.authority)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, concat!("computerd/", env!("CARGO_PKG_VERSION")));
        if json.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| ProviderError::NotSent(format!("{what}: cannot make the request: {e}")))?;
        let mut sender = sender;
        // From here the request may have left: anything short of a whole answer is a lost one.
        let exchange = async {
            let resp = sender.send_request(req).await.map_err(|e| format!("{e}"))?;
            let status = resp.status().as_u16();
            let retry_after = resp
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let next_token = resp
                .headers()
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_string);
            let body = Limited::new(resp.into_body(), self.max_answer)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            Ok::<_, String>(Answer { status, body, retry_after, next_token })
        };
        match tokio::time::timeout_at(until, exchange).await {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(e)) => Err(ProviderError::Lost(format!("{what} was sent to {self:?}, the answer was lost: {e}"))),
            Err(_) => Err(ProviderError::Lost(format!("{what} was sent to {self:?}, no answer within {deadline:?}"))),
        }
    }

    /// A fresh connection, ready for one request.
    async fn connect(&self) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, ProviderError> {
        let not_sent = |e: String| ProviderError::NotSent(format!("cannot reach {self:?}: {e}"));
        let tcp = TcpStream::connect((self.host.as_str(), self.port)).await.map_err(|e| not_sent(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            Some(config) => {
                let name = ServerName::try_from(self.host.clone()).map_err(|e| not_sent(e.to_string()))?;
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| not_sent(format!("TLS: {e}")))?;
                self.handshake(TokioIo::new(tls)).await
            }
            None => self.handshake(TokioIo::new(tcp)).await,
        }
    }

    async fn handshake<T>(&self, io: T) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, ProviderError>
    where
        T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| ProviderError::NotSent(format!("cannot reach {self:?}: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }
}

/// A provider's sandbox reference, checked before it goes into a path: 1 to 128 ASCII letters,
/// digits and `-` (E2B's ids, Daytona's UUIDs). `service` names the provider in the error.
pub fn check_sandbox_id(service: &str, sandbox: &str) -> Result<(), ProviderError> {
    if sandbox.is_empty() || sandbox.len() > 128 || !sandbox.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(ProviderError::NotSent(format!("{sandbox:?} is not a {service} sandbox id")));
    }
    Ok(())
}

/// The deadline of one exchange inside the caller's `timeout`: a little shorter, so a call that
/// never connected can say so before the caller gives up on it.
pub fn inner_deadline(timeout: Duration) -> Duration {
    timeout.saturating_sub(Duration::from_millis(250)).max(Duration::from_millis(250))
}

/// Percent-encodes a query value or path segment (everything but unreserved characters).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_checked() {
        let e = Endpoint::parse("https://api.e2b.app", None).expect("https");
        assert_eq!((e.host.as_str(), e.port, e.base.as_str()), ("api.e2b.app", 443, ""));
        let e = Endpoint::parse("https://app.daytona.io/api/", None).expect("https with a base");
        assert_eq!((e.port, e.base.as_str()), (443, "/api"));
        let e = Endpoint::parse("http://127.0.0.1:8080", None).expect("loopback");
        assert_eq!((e.host.as_str(), e.port), ("127.0.0.1", 8080));
        assert!(Endpoint::parse("http://[::1]:9/x", None).is_ok());
        for bad in ["http://api.e2b.app", "ftp://x", "https://u:p@host", "https://h/x?k=v", "https://h:99999", ""] {
            assert!(Endpoint::parse(bad, None).is_err(), "{bad}");
        }
        assert!(Endpoint::parse("https://h", Some("not a pem")).is_err());
    }

    #[test]
    fn encoding() {
        assert_eq!(encode("computerd.computer=cmp_1&k=a b"), "computerd.computer%3Dcmp_1%26k%3Da%20b");
    }

    #[tokio::test]
    async fn nothing_listening_is_not_sent_and_a_cut_answer_is_lost() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        drop(l);
        let e = Endpoint::parse(&format!("http://127.0.0.1:{port}"), None).expect("parse");
        let r = e.call(http::Method::GET, "/x", &[], None, Duration::from_secs(5)).await;
        assert!(matches!(r, Err(ProviderError::NotSent(_))), "{r:?}");

        // A server that reads the request and hangs up without answering.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = l.local_addr().expect("addr").port();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            if let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
            }
        });
        let e = Endpoint::parse(&format!("http://127.0.0.1:{port}"), None).expect("parse");
        let body = serde_json::json!({"a": 1});
        let r = e.call(http::Method::POST, "/x", &[], Some(&body), Duration::from_secs(5)).await;
        assert!(matches!(r, Err(ProviderError::Lost(_))), "{r:?}");
    }
}
