//! Making and reading certificates (rcgen to make, x509-parser to read), and their files.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rcgen::BasicConstraints;
use rcgen::CertificateParams;
use rcgen::CertificateSigningRequestParams;
use rcgen::DistinguishedName;
use rcgen::DnType;
use rcgen::ExtendedKeyUsagePurpose;
use rcgen::IsCa;
use rcgen::Issuer;
use rcgen::KeyPair;
use rcgen::KeyUsagePurpose;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;
use rustls::sign::CertifiedKey;

use super::SERVER_NAME;
use crate::NodeId;

/// Why certificates could not be made, read or used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CertError {
    /// A file could not be read or written.
    #[error("certificate files: {0}")]
    Io(String),
    /// A certificate, key or request is not what it must be.
    #[error("certificate: {0}")]
    Invalid(String),
}

fn invalid(e: impl std::fmt::Display) -> CertError {
    CertError::Invalid(e.to_string())
}

/// Now, in unix seconds.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A key pair and its certificate signing request.
pub struct Csr {
    /// The request (PEM).
    pub pem: String,
    /// The private key (PEM): never leaves the node.
    pub key_pem: String,
}

impl Csr {
    /// A new ECDSA P-256 key and a request for it.
    pub fn new() -> Result<Csr, CertError> {
        let key = KeyPair::generate().map_err(invalid)?;
        let params = CertificateParams::new(Vec::<String>::new()).map_err(invalid)?;
        let csr = params.serialize_request(&key).map_err(invalid)?;
        Ok(Csr { pem: csr.pem().map_err(invalid)?, key_pem: key.serialize_pem() })
    }
}

/// A new CA for `cluster_id`: its certificate and key (PEM). It lasts 10 years; node
/// certificates are what renew.
pub fn new_ca(cluster_id: &str) -> Result<(String, String), CertError> {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("computerd cluster CA {cluster_id}"));
    dn.push(DnType::OrganizationName, cluster_id);
    self_signed_ca(dn)
}

/// A self-signed CA named `dn`, signing end certificates only, for 10 years (PEM).
fn self_signed_ca(dn: DistinguishedName) -> Result<(String, String), CertError> {
    let key = KeyPair::generate().map_err(invalid)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(invalid)?;
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(3650);
    let cert = params.self_signed(&key).map_err(invalid)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A new CA for an HTTP edge (not a cluster's: it signs no node certificate), named `name`, for
/// 10 years: its certificate and key (PEM).
pub fn new_edge_ca(name: &str) -> Result<(String, String), CertError> {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    self_signed_ca(dn)
}

/// A server certificate of an HTTP edge for `names` (DNS names, or IP addresses, each a SAN),
/// signed by the CA `ca_pem`/`ca_key_pem`: the certificate and its new key (PEM).
pub fn edge_cert(
    ca_pem: &str,
    ca_key_pem: &str,
    names: &[String],
    validity: Duration,
) -> Result<(String, String), CertError> {
    if names.is_empty() {
        return Err(invalid("an edge certificate needs at least one name"));
    }
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(invalid)?;
    let issuer = Issuer::from_ca_cert_pem(ca_pem, ca_key).map_err(invalid)?;
    let key = KeyPair::generate().map_err(invalid)?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(invalid)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, names[0].clone());
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::try_from(validity).map_err(invalid)?;
    params.serial_number = Some(rand::random::<[u8; 16]>().to_vec().into());
    let cert = params.signed_by(&key, &issuer).map_err(invalid)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The unix second a certificate (PEM) stops being valid, and its SANs' names.
pub fn expiry_and_names(pem: &str) -> Option<(u64, Vec<String>)> {
    let der = der_of(pem).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                x509_parser::extensions::GeneralName::DNSName(d) => names.push(d.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(b) => match b.len() {
                    4 => names.push(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).ok()?).to_string()),
                    16 => names.push(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).ok()?).to_string()),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Some((cert.validity().not_after.timestamp().max(0) as u64, names))
}

/// Signs a certificate for `node_id` of `cluster_id` from a CSR: the node's identity comes from
/// the signer, never from the request.
pub fn sign(
    ca_pem: &str,
    ca_key_pem: &str,
    cluster_id: &str,
    node_id: NodeId,
    csr_pem: &str,
    validity: Duration,
) -> Result<String, CertError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(invalid)?;
    let issuer = Issuer::from_ca_cert_pem(ca_pem, ca_key).map_err(invalid)?;
    let mut csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| invalid(format!("bad CSR: {e}")))?;
    let mut params = CertificateParams::new(vec![SERVER_NAME.to_string()]).map_err(invalid)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("node-{node_id}"));
    dn.push(DnType::OrganizationName, cluster_id);
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now;
    params.not_after = now + time::Duration::try_from(validity).map_err(invalid)?;
    params.serial_number = Some(rand::random::<[u8; 16]>().to_vec().into());
    csr.params = params;
    Ok(csr.signed_by(&issuer).map_err(invalid)?.pem())
}

/// The DER of the first certificate in `pem`.
pub fn der_of(pem: &str) -> Result<CertificateDer<'static>, CertError> {
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| invalid(format!("not a PEM certificate: {e}")))
}

/// What a node certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// CN `node-<id>`.
    pub node_id: NodeId,
    /// O.
    pub cluster_id: String,
    /// Validity, unix seconds.
    pub not_before: u64,
    /// Validity, unix seconds.
    pub not_after: u64,
}

/// Reads a node certificate's identity (`None`: not a node certificate).
pub fn identity_of(der: &CertificateDer<'_>) -> Option<Identity> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let subject = cert.subject();
    let cn = subject.iter_common_name().next()?.as_str().ok()?;
    let node_id = cn.strip_prefix("node-")?.parse().ok()?;
    let cluster_id = subject.iter_organization().next()?.as_str().ok()?.to_string();
    let v = cert.validity();
    Some(Identity {
        node_id,
        cluster_id,
        not_before: v.not_before.timestamp().max(0) as u64,
        not_after: v.not_after.timestamp().max(0) as u64,
    })
}

/// The rustls key of a certificate and its key (PEM), with the CA certificate in the chain (an
/// enrolling node checks the CA's hash), and the certificate's identity.
pub fn certified_key(
    cert_pem: &str,
    key_pem: &str,
    ca_der: &CertificateDer<'static>,
) -> Result<(Arc<CertifiedKey>, Identity), CertError> {
    let cert = der_of(cert_pem)?;
    let id = identity_of(&cert).ok_or_else(|| invalid("not a node certificate (CN node-<id>, O <cluster>)"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| invalid(format!("not a PEM key: {e}")))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(invalid)?;
    Ok((Arc::new(CertifiedKey::new(vec![cert, ca_der.clone()], signer)), id))
}

/// Checks that `key_pem` is the key of the CA certificate `ca_pem`.
pub fn check_ca_key(ca_pem: &str, key_pem: &str) -> Result<(), CertError> {
    let key = KeyPair::from_pem(key_pem).map_err(invalid)?;
    let der = der_of(ca_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).map_err(invalid)?;
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return Err(invalid("the key is not the cluster CA's"));
    }
    Ok(())
}

/// Writes a file readable by everyone (0644: a certificate), atomically.
pub fn write_public(path: &Path, contents: &str) -> Result<(), CertError> {
    write_file(path, contents, 0o644)
}

/// Writes a file readable by its owner only (0600), atomically (temp file, fsync, rename).
pub fn write_secret(path: &Path, contents: &str) -> Result<(), CertError> {
    write_file(path, contents, 0o600)
}

fn write_file(path: &Path, contents: &str, mode: u32) -> Result<(), CertError> {
    let tmp = path.with_extension("tmp");
    let io = |e: std::io::Error| CertError::Io(format!("{}: {e}", path.display()));
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp).map_err(io)?;
    f.write_all(contents.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Writes the certificate files that are given (keys 0600), in `dir` (made 0700): `ca.crt`,
/// `ca.key`, and `node.pem` (this node's certificate and key).
pub fn write_files(
    dir: &Path,
    ca_pem: Option<&str>,
    ca_key_pem: Option<&str>,
    cert_pem: &str,
    key_pem: &str,
) -> Result<(), CertError> {
    std::fs::create_dir_all(dir).map_err(|e| CertError::Io(format!("{}: {e}", dir.display())))?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(|e| CertError::Io(format!("{}: {e}", dir.display())))?;
    if let Some(ca) = ca_pem {
        write_file(&dir.join("ca.crt"), ca, 0o644)?;
    }
    if let Some(k) = ca_key_pem {
        write_secret(&dir.join("ca.key"), k)?;
    }
    // The certificate and its key in one file, replaced in one rename: a crash never leaves a
    // certificate beside another's key.
    write_secret(&dir.join("node.pem"), &format!("{}\n{}", cert_pem.trim_end(), key_pem))
}
