//! Mutual TLS between nodes, always on.
//!
//! The first node of a cluster makes the cluster's CA at bootstrap; every node holds a node
//! certificate signed by it, which names the cluster (O) and the node (CN `node-<id>`), and
//! presents it both as a server and as a client. Files, in `DIR/tls/`:
//!
//! ```text
//! ca.crt     the cluster CA's certificate
//! ca.key     its key, 0600: voters only (the first node at bootstrap, the others once promoted)
//! node.pem   this node's certificate and its key, 0600 (one file, replaced in one rename)
//! ```
//!
//! - A joining node without a certificate enrolls ([`enroll_client_config`]): it dials a member
//!   over TLS checking the server against the CA hash of its join secret (as kubeadm's
//!   discovery hash does), presents the secret once with a CSR, and gets a certificate.
//! - Every other gRPC call needs a client certificate of this CA ([`RequireNode`]); handlers
//!   read the caller's node id from [`PeerIdentity`].
//! - Certificates renew themselves at half-life ([`Pki::renew_due`]); new handshakes use the new
//!   one at once (the resolvers read the current certificate).
//! - A removed node's certificates are revoked ([`Revocations`], kept in the store): a handshake
//!   presenting one is refused, and its open connections are closed ([`incoming`]).

mod certs;
mod io;
mod verify;

use std::collections::BTreeMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::RwLock;
use std::time::Duration;

pub use certs::CertError;
pub use certs::Csr;
pub use certs::edge_cert;
pub use certs::expiry_and_names;
pub use certs::identity_of;
pub use certs::new_edge_ca;
pub use certs::now_secs;
pub use certs::write_public;
pub use certs::write_secret;
pub use io::Connector;
pub use io::NodeStream;
pub use io::RequireNode;
pub use io::incoming;
use rustls::sign::CertifiedKey;
use sha2::Digest;
use tokio::sync::watch;

use crate::NodeId;

/// The name every node certificate carries, which clients verify (the CA is the cluster's own,
/// so a certificate it signed is a node of this cluster).
pub const SERVER_NAME: &str = "computerd-node";

/// How long a node certificate lasts by default.
pub const VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);

/// Revoked node certificates: per node id, every certificate issued at or before this unix
/// second is refused (a node that rejoins later gets a newer one).
pub type Revocations = BTreeMap<NodeId, u64>;

/// The verified identity of a gRPC caller, as the handshake established it (a request
/// extension of every call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerIdentity {
    /// The node its certificate names (`None`: it presented none, which only enrolling allows).
    pub node_id: Option<NodeId>,
    /// Where the connection comes from (enrolling without a certificate is limited per source).
    pub addr: Option<std::net::SocketAddr>,
}

/// The node's certificates and the cluster's CA.
pub struct Pki {
    dir: PathBuf,
    node_id: NodeId,
    cluster_id: String,
    ca_pem: String,
    ca_der: rustls::pki_types::CertificateDer<'static>,
    ca_key: RwLock<Option<String>>,
    current: RwLock<Current>,
    validity: Duration,
    revoked: watch::Sender<Revocations>,
}

/// The node certificate in use.
struct Current {
    key: Arc<CertifiedKey>,
    /// When it was issued and when it ends (unix seconds).
    not_before: u64,
    not_after: u64,
}

fn io_err(path: &Path, e: std::io::Error) -> CertError {
    CertError::Io(format!("{}: {e}", path.display()))
}

impl Pki {
    /// Makes the cluster's CA and this node's certificate (the first node, at bootstrap).
    pub fn bootstrap(dir: &Path, cluster_id: &str, node_id: NodeId, validity: Duration) -> Result<Pki, CertError> {
        let (ca_pem, ca_key) = certs::new_ca(cluster_id)?;
        let csr = Csr::new()?;
        let cert = certs::sign(&ca_pem, &ca_key, cluster_id, node_id, &csr.pem, validity)?;
        certs::write_files(dir, Some(&ca_pem), Some(&ca_key), &cert, &csr.key_pem)?;
        Self::load(dir, node_id, validity)?.ok_or_else(|| CertError::Io("the files just written are gone".into()))
    }

    /// Stores what enrolling answered (`ca_pem`, a certificate for this node's `csr`).
    pub fn install(
        dir: &Path,
        node_id: NodeId,
        ca_pem: &str,
        cert_pem: &str,
        csr: &Csr,
        validity: Duration,
    ) -> Result<Pki, CertError> {
        certs::write_files(dir, Some(ca_pem), None, cert_pem, &csr.key_pem)?;
        Self::load(dir, node_id, validity)?.ok_or_else(|| CertError::Io("the files just written are gone".into()))
    }

    /// The certificates in `dir`, if it holds any. A certificate of another node is refused.
    pub fn load(dir: &Path, node_id: NodeId, validity: Duration) -> Result<Option<Pki>, CertError> {
        let read = |name: &str| {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(s) => Ok(Some(s)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io_err(&path, e)),
            }
        };
        let (Some(ca_pem), Some(node_pem)) = (read("ca.crt")?, read("node.pem")?) else {
            return Ok(None);
        };
        let (cert_pem, key_pem) = (node_pem.as_str(), node_pem.as_str());
        let ca_key = read("ca.key")?;
        let ca_der = certs::der_of(&ca_pem)?;
        let (key, id) = certs::certified_key(cert_pem, key_pem, &ca_der)?;
        if id.node_id != node_id {
            return Err(CertError::Invalid(format!(
                "{}: the certificate is node {}'s, not node {node_id}'s",
                dir.display(),
                id.node_id
            )));
        }
        let current = Current { key, not_before: id.not_before, not_after: id.not_after };
        Ok(Some(Pki {
            dir: dir.to_path_buf(),
            node_id,
            cluster_id: id.cluster_id,
            ca_pem,
            ca_der,
            ca_key: RwLock::new(ca_key),
            current: RwLock::new(current),
            validity,
            revoked: watch::Sender::new(Revocations::new()),
        }))
    }

    /// The cluster the certificates belong to.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The CA's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The SHA-256 of the CA's certificate, hex: what a join secret carries.
    pub fn ca_hash(&self) -> String {
        hex::encode(sha2::Sha256::digest(self.ca_der.as_ref()))
    }

    /// True when this node holds the CA's key (it can sign certificates).
    pub fn signs(&self) -> bool {
        self.ca_key.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The CA's key (PEM), for a new voter.
    pub fn ca_key_pem(&self) -> Option<String> {
        self.ca_key.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stores the CA's key received at promotion (checked against the CA's certificate).
    pub fn set_ca_key(&self, pem: &str) -> Result<(), CertError> {
        certs::check_ca_key(&self.ca_pem, pem)?;
        certs::write_secret(&self.dir.join("ca.key"), pem)?;
        *self.ca_key.write().unwrap_or_else(|p| p.into_inner()) = Some(pem.to_string());
        Ok(())
    }

    /// Signs a certificate for `node_id` from its CSR (PEM). Needs the CA's key.
    pub fn sign(&self, node_id: NodeId, csr_pem: &str) -> Result<String, CertError> {
        let key = self.ca_key_pem().ok_or_else(|| CertError::Invalid("this node does not hold the CA's key".into()))?;
        certs::sign(&self.ca_pem, &key, &self.cluster_id, node_id, csr_pem, self.validity)
    }

    /// True once the certificate in use is past half its life.
    pub fn renew_due(&self) -> bool {
        let c = self.current.read().unwrap_or_else(|p| p.into_inner());
        certs::now_secs() >= c.not_before + (c.not_after.saturating_sub(c.not_before)) / 2
    }

    /// When the certificate in use ends (unix seconds).
    pub fn not_after(&self) -> u64 {
        self.current.read().unwrap_or_else(|p| p.into_inner()).not_after
    }

    /// Puts a new certificate (for `csr`) in use, and in the files.
    pub fn renew_with(&self, cert_pem: &str, csr: &Csr) -> Result<(), CertError> {
        let (key, id) = certs::certified_key(cert_pem, &csr.key_pem, &self.ca_der)?;
        if id.node_id != self.node_id {
            return Err(CertError::Invalid(format!("a certificate for node {}, not {}", id.node_id, self.node_id)));
        }
        certs::write_files(&self.dir, None, None, cert_pem, &csr.key_pem)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) =
            Current { key, not_before: id.not_before, not_after: id.not_after };
        Ok(())
    }

    /// Renews the certificate here, with the CA's key.
    pub fn renew_here(&self) -> Result<(), CertError> {
        let csr = Csr::new()?;
        let cert = self.sign(self.node_id, &csr.pem)?;
        self.renew_with(&cert, &csr)
    }

    /// Sets the revoked certificates (from the store).
    pub fn set_revocations(&self, revoked: Revocations) {
        self.revoked.send_if_modified(|r| {
            let changed = *r != revoked;
            *r = revoked;
            changed
        });
    }

    /// True when a certificate of `node_id` issued at `not_before` is revoked.
    pub fn is_revoked(&self, node_id: NodeId, not_before: u64) -> bool {
        self.revoked.borrow().get(&node_id).is_some_and(|before| not_before <= *before)
    }

    fn current_key(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).key.clone()
    }

    /// The TLS config of this node's gRPC server: its certificate (the current one at each
    /// handshake), client certificates of this CA verified and checked against revocations,
    /// and none accepted for enrolling.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, CertError> {
        verify::server_config(self.clone())
    }

    /// The TLS config of this node's calls to other nodes: its certificate as the client, the
    /// server verified as a node of this CA.
    pub fn client_config(self: &Arc<Self>) -> Result<Arc<rustls::ClientConfig>, CertError> {
        verify::client_config(self.clone())
    }
}

/// A status's message with the errors under it (a TLS failure is deep in a transport error).
pub fn status_chain(s: &tonic::Status) -> String {
    let mut out = s.message().to_string();
    let mut next = std::error::Error::source(s);
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}

/// True when a call failed because the peer's certificate is not of this cluster's CA.
pub fn is_foreign_peer(s: &tonic::Status) -> bool {
    let chain = status_chain(s);
    chain.contains("UnknownIssuer") || chain.contains("join secret names")
}

/// The TLS config of an enrolling node, which has no certificate yet: the server must present a
/// chain whose CA certificate has the SHA-256 `ca_hash` (from the join secret).
pub fn enroll_client_config(ca_hash: &str) -> Result<Arc<rustls::ClientConfig>, CertError> {
    verify::enroll_config(ca_hash, None)
}

/// Like [`enroll_client_config`], presenting `identity`'s node certificate as the client (the
/// security tests present one of another CA this way, to show the server refuses it).
pub fn pinned_client_config(ca_hash: &str, identity: Arc<Pki>) -> Result<Arc<rustls::ClientConfig>, CertError> {
    verify::enroll_config(ca_hash, Some(identity))
}

/// A join secret as given to a joining node: `cdj1.<CA hash>.<secret>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinSecret {
    /// The SHA-256 of the cluster CA's certificate, hex.
    pub ca_hash: String,
    /// The secret itself (the store keeps its hash only).
    pub secret: String,
}

impl JoinSecret {
    /// A new secret for a cluster whose CA has `ca_hash`.
    pub fn new(ca_hash: &str) -> Self {
        Self { ca_hash: ca_hash.to_string(), secret: hex::encode(rand::random::<[u8; 32]>()) }
    }

    /// Parses `cdj1.<hash>.<secret>` (surrounding white space ignored).
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut parts = s.trim().split('.');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("cdj1"), Some(h), Some(secret), None)
                if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) && secret.len() >= 32 =>
            {
                Ok(Self { ca_hash: h.to_ascii_lowercase(), secret: secret.to_string() })
            }
            _ => Err("a join secret has the form cdj1.<64 hex digits>.<secret>".into()),
        }
    }

    /// Its text form.
    pub fn encode(&self) -> String {
        format!("cdj1.{}.{}", self.ca_hash, self.secret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_secrets_round_trip_and_bad_ones_are_refused() {
        let s = JoinSecret::new(&"ab".repeat(32));
        assert_eq!(JoinSecret::parse(&format!(" {}\n", s.encode())), Ok(s.clone()));
        assert!(JoinSecret::parse("cdj1.zz.secret").is_err());
        assert!(JoinSecret::parse(&format!("cdj2.{}.{}", s.ca_hash, s.secret)).is_err());
        assert!(JoinSecret::parse(&format!("cdj1.{}.short", s.ca_hash)).is_err());
    }

    #[test]
    fn a_bootstrapped_ca_signs_nodes_and_files_load_back() {
        let dir = tempfile::tempdir().expect("dir");
        let one = Pki::bootstrap(dir.path(), "cls_test", 1, Duration::from_secs(3600)).expect("bootstrap");
        assert!(one.signs());
        assert_eq!(one.cluster_id(), "cls_test");
        let csr = Csr::new().expect("csr");
        let cert = one.sign(2, &csr.pem).expect("sign");
        let two_dir = tempfile::tempdir().expect("dir");
        let two = Pki::install(two_dir.path(), 2, one.ca_pem(), &cert, &csr, VALIDITY).expect("install");
        assert!(!two.signs());
        assert_eq!(two.ca_hash(), one.ca_hash());
        // Another node's files are refused.
        assert!(Pki::load(two_dir.path(), 3, VALIDITY).is_err());
        // The CA's key is checked before it is kept.
        let other = tempfile::tempdir().expect("dir");
        let stranger = Pki::bootstrap(other.path(), "cls_other", 1, VALIDITY).expect("other ca");
        assert!(two.set_ca_key(&stranger.ca_key_pem().expect("key")).is_err());
        two.set_ca_key(&one.ca_key_pem().expect("key")).expect("the right key");
        assert!(two.signs());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(two_dir.path().join("ca.key")).expect("ca.key").permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        // Revocation by issue time.
        let id = identity_of(&certs::der_of(&cert).expect("der")).expect("identity");
        assert_eq!((id.node_id, id.cluster_id.as_str()), (2, "cls_test"));
        assert!(!one.is_revoked(2, id.not_before));
        one.set_revocations(Revocations::from([(2, id.not_before)]));
        assert!(one.is_revoked(2, id.not_before));
        assert!(!one.is_revoked(2, id.not_before + 1));
    }

    /// One handshake of `client` calling `server` over an in-memory pipe: Ok, or the client's error.
    async fn handshake(client: &Arc<Pki>, server: &Arc<Pki>) -> Result<(), String> {
        let (a, b) = tokio::io::duplex(1 << 16);
        let acceptor = tokio_rustls::TlsAcceptor::from(server.server_config().expect("server config"));
        let connector = tokio_rustls::TlsConnector::from(client.client_config().expect("client config"));
        let serving = tokio::spawn(async move { acceptor.accept(b).await.map(drop) });
        let r = connector.connect(verify::server_name(), a).await.map(drop).map_err(|e| e.to_string());
        let _ = serving.await;
        r
    }

    #[tokio::test]
    async fn a_node_does_not_call_a_revoked_node() {
        let dir = tempfile::tempdir().expect("dir");
        let one = Arc::new(Pki::bootstrap(&dir.path().join("1"), "cls_test", 1, VALIDITY).expect("bootstrap"));
        let csr = Csr::new().expect("csr");
        let cert = one.sign(2, &csr.pem).expect("sign");
        let two =
            Arc::new(Pki::install(&dir.path().join("2"), 2, one.ca_pem(), &cert, &csr, VALIDITY).expect("install"));
        handshake(&one, &two).await.expect("node 1 calls node 2");
        let id = identity_of(&certs::der_of(&cert).expect("der")).expect("identity");
        one.set_revocations(Revocations::from([(2, id.not_before)]));
        let refused = handshake(&one, &two).await.expect_err("node 2 is revoked");
        assert!(refused.contains("revoked"), "{refused}");
        // A server of another cluster is refused too, even with a valid chain of its own CA.
        let other = Arc::new(Pki::bootstrap(&dir.path().join("o"), "cls_other", 3, VALIDITY).expect("other"));
        assert!(handshake(&one, &other).await.is_err());
    }
}
