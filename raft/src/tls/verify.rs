//! The rustls configs of nodes: certificate resolvers that read the current certificate at each
//! handshake, the client and server verifiers that check revocations (both ends of every
//! node-to-node connection refuse a revoked node), and the enrolling node's CA-hash check.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::DistinguishedName;
use rustls::Error;
use rustls::RootCertStore;
use rustls::SignatureScheme;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::client::danger::ServerCertVerified;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::ServerName;
use rustls::pki_types::UnixTime;
use rustls::server::danger::ClientCertVerified;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;
use sha2::Digest;

use super::CertError;
use super::Pki;
use super::SERVER_NAME;
use super::certs::identity_of;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn invalid(e: impl std::fmt::Display) -> CertError {
    CertError::Invalid(e.to_string())
}

fn roots(pki: &Pki) -> Result<Arc<RootCertStore>, CertError> {
    let mut roots = RootCertStore::empty();
    roots.add(pki.ca_der.clone()).map_err(invalid)?;
    Ok(Arc::new(roots))
}

/// This node's certificate, as it is at each handshake.
#[derive(Debug)]
struct Current(Arc<Pki>);

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").field("node_id", &self.node_id).field("cluster_id", &self.cluster_id).finish()
    }
}

impl rustls::server::ResolvesServerCert for Current {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current_key())
    }
}

impl rustls::client::ResolvesClientCert for Current {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current_key())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// What both ends check of the other's chain-verified certificate: a node certificate of this
/// cluster, not revoked. `peer` says which end it is, for the log.
fn check_node(pki: &Pki, end_entity: &CertificateDer<'_>, peer: &str) -> Result<(), Error> {
    let id = identity_of(end_entity).ok_or_else(|| Error::General(format!("{peer}'s is not a node certificate")))?;
    if id.cluster_id != pki.cluster_id {
        return Err(Error::General(format!("{peer}'s certificate is of cluster {}", id.cluster_id)));
    }
    if pki.is_revoked(id.node_id, id.not_before) {
        tracing::info!(node_id = id.node_id, peer, "a revoked node certificate was refused");
        return Err(Error::General(format!("node {}'s certificate is revoked", id.node_id)));
    }
    Ok(())
}

/// Client certificates of this CA, of this cluster, not revoked; none is also let through (only
/// enrolling accepts that, see `RequireNode`).
#[derive(Debug)]
struct NodeClients {
    inner: Arc<dyn ClientCertVerifier>,
    pki: Arc<Pki>,
}

impl ClientCertVerifier for NodeClients {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.inner.verify_client_cert(end_entity, intermediates, now)?;
        check_node(&self.pki, end_entity, "a client")?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

pub(super) fn server_config(pki: Arc<Pki>) -> Result<Arc<rustls::ServerConfig>, CertError> {
    let inner = rustls::server::WebPkiClientVerifier::builder_with_provider(roots(&pki)?, provider())
        .allow_unauthenticated()
        .build()
        .map_err(invalid)?;
    let verifier = Arc::new(NodeClients { inner, pki: pki.clone() });
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(invalid)?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(Current(pki)));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Servers with a certificate of this CA, of this cluster, not revoked: a node never sends a call
/// to a removed node, even one that is still running.
#[derive(Debug)]
struct NodeServers {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    pki: Arc<Pki>,
}

impl ServerCertVerifier for NodeServers {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp, now)?;
        check_node(&self.pki, end_entity, "a server")?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

pub(super) fn client_config(pki: Arc<Pki>) -> Result<Arc<rustls::ClientConfig>, CertError> {
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(roots(&pki)?, provider())
        .build()
        .map_err(invalid)?;
    let verifier = Arc::new(NodeServers { inner, pki: pki.clone() });
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(invalid)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(Current(pki)));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A server whose chain holds a CA certificate with the expected hash, and whose certificate
/// that CA signed for [`SERVER_NAME`].
#[derive(Debug)]
struct CaHash {
    hash: String,
}

impl ServerCertVerifier for CaHash {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let ca = intermediates
            .iter()
            .find(|c| hex::encode(sha2::Sha256::digest(c.as_ref())) == self.hash)
            .ok_or_else(|| Error::General("the server's CA is not the one the join secret names".into()))?;
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned()).map_err(|e| Error::General(e.to_string()))?;
        let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| Error::General(e.to_string()))?;
        webpki.verify_server_cert(end_entity, &[], server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &provider().signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &provider().signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider().signature_verification_algorithms.supported_schemes()
    }
}

pub(super) fn enroll_config(ca_hash: &str, identity: Option<Arc<Pki>>) -> Result<Arc<rustls::ClientConfig>, CertError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(invalid)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(CaHash { hash: ca_hash.to_ascii_lowercase() }));
    let mut config = match identity {
        Some(pki) => builder.with_client_cert_resolver(Arc::new(Current(pki))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The server name clients ask for.
pub(super) fn server_name() -> ServerName<'static> {
    ServerName::try_from(SERVER_NAME).unwrap_or_else(|_| ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()))
}
