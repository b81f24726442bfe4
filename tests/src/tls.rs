//! gRPC channels to test nodes, as a node (with a node's own certificate from its data dir) or
//! as a stranger (no certificate, or one of another CA), for the tests of the cluster's mutual
//! TLS; and an HTTPS client that pins a CA, for the tests of the HTTP edge (the workspace's
//! reqwest has no TLS).

use std::sync::Arc;

use computerd_raft::tls::Pki;
use tonic::transport::Channel;

use crate::TestCluster;

/// Node `id`'s certificates, from its data dir.
pub fn pki_of(c: &TestCluster, id: u64) -> Arc<Pki> {
    let dir = c.nodes[&id].data.join("tls");
    Arc::new(Pki::load(&dir, id, computerd_raft::tls::VALIDITY).expect("certificates").expect("a node certificate"))
}

/// A channel to node `to` presenting node `as_node`'s certificate.
pub fn channel_as(c: &TestCluster, as_node: u64, to: u64) -> Channel {
    let config = pki_of(c, as_node).client_config().expect("client config");
    computerd_raft::network::one_off_channel(&c.nodes[&to].grpc, config).expect("channel")
}

/// A channel to node `to` that checks the server against the cluster's CA hash, presenting
/// `identity`'s certificate (`None`: no certificate at all).
pub fn channel_with(c: &TestCluster, to: u64, identity: Option<Arc<Pki>>) -> Channel {
    let hash = pki_of(c, 1).ca_hash();
    let config = match identity {
        Some(p) => computerd_raft::tls::pinned_client_config(&hash, p),
        None => computerd_raft::tls::enroll_client_config(&hash),
    }
    .expect("client config");
    computerd_raft::network::one_off_channel(&c.nodes[&to].grpc, config).expect("channel")
}

/// A node certificate of another cluster's CA, made in `dir`.
pub fn stranger(dir: &std::path::Path, id: u64) -> Arc<Pki> {
    Arc::new(Pki::bootstrap(dir, "cls_stranger", id, computerd_raft::tls::VALIDITY).expect("another CA"))
}

/// HTTP/1.1 calls over TLS to one address, trusting only the CA given, for a server name.
#[derive(Clone)]
pub struct Https {
    addr: String,
    name: rustls::pki_types::ServerName<'static>,
    connector: tokio_rustls::TlsConnector,
}

impl Https {
    /// Calls `addr` (host:port), checking its certificate names `name` and chains to `ca_pem`.
    pub fn pinned(addr: &str, name: &str, ca_pem: &str) -> Https {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.expect("a PEM certificate")).expect("a CA certificate");
        }
        assert!(!roots.is_empty(), "no CA certificate in {ca_pem:?}");
        let mut config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Https {
            addr: addr.to_string(),
            name: rustls::pki_types::ServerName::try_from(name.to_string()).expect("server name"),
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        }
    }

    /// One call on a new connection: status and JSON body (`Null` when not JSON), or why it
    /// failed (connection, handshake, or a timeout of 15 s).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> Result<(u16, serde_json::Value), String> {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
        self.send(method, path, &headers, body).await
    }

    /// A call with these headers and a JSON body.
    pub async fn call_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: serde_json::Value,
    ) -> Result<(u16, serde_json::Value), String> {
        self.send(method, path, headers, Some(body)).await
    }

    async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<serde_json::Value>,
    ) -> Result<(u16, serde_json::Value), String> {
        let fut = async {
            use http_body_util::BodyExt;
            let tcp = tokio::net::TcpStream::connect(&self.addr).await.map_err(|e| format!("connect: {e}"))?;
            let tls = self.connector.connect(self.name.clone(), tcp).await.map_err(|e| format!("TLS: {e}"))?;
            let io = hyper_util::rt::TokioIo::new(tls);
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            let mut req = http::Request::builder().method(method).uri(path).header("host", self.name.to_str().as_ref());
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            let bytes = match body {
                Some(b) => {
                    req = req.header("content-type", "application/json");
                    b.to_string().into_bytes()
                }
                None => Vec::new(),
            };
            let req = req.body(http_body_util::Full::new(bytes::Bytes::from(bytes))).map_err(|e| e.to_string())?;
            let r = sender.send_request(req).await.map_err(|e| e.to_string())?;
            let status = r.status().as_u16();
            let body = r.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok((status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null)))
        };
        tokio::time::timeout(std::time::Duration::from_secs(15), fut).await.map_err(|_| "timed out".to_string())?
    }
}
