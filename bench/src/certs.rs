//! A throwaway certificate authority for store-bench's etcd clusters, made with rcgen (ECDSA
//! P-256 keys, as computerd's own cluster CA): a CA, one certificate per etcd member (usable as
//! a server and as a client, since members dial each other and etcd's JSON gateway dials its own
//! gRPC server with the member's certificate) and one client certificate for the bench.
//!
//! The files are written into a directory the caller owns (a temp dir); keys are 0600. The
//! certificates keep rcgen's default validity: they live as long as that directory.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::path::PathBuf;

use anyhow::Context;
use anyhow::Result;
use rcgen::BasicConstraints;
use rcgen::CertificateParams;
use rcgen::DistinguishedName;
use rcgen::DnType;
use rcgen::ExtendedKeyUsagePurpose;
use rcgen::IsCa;
use rcgen::Issuer;
use rcgen::KeyPair;
use rcgen::KeyUsagePurpose;

/// The names every member certificate carries: the members listen on 127.0.0.1.
const LOOPBACK_SANS: [&str; 2] = ["127.0.0.1", "localhost"];

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PKCS#8 PEM, mode 0600).
    pub key: PathBuf,
}

/// A CA that signs certificates into one directory.
pub struct Ca {
    dir: PathBuf,
    /// The CA certificate (PEM), what the members and the client trust.
    pub cert: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// A new self-signed CA, written to `dir/ca.crt` (its key stays in memory).
    pub fn new(dir: &Path, name: &str) -> Result<Ca> {
        let key = KeyPair::generate().context("CA key")?;
        let mut params = CertificateParams::new(Vec::<String>::new()).context("CA params")?;
        params.distinguished_name = dn(name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).context("self-sign the CA")?;
        let path = dir.join("ca.crt");
        write(&path, &cert.pem(), 0o644)?;
        Ok(Ca { dir: dir.to_path_buf(), cert: path, issuer: Issuer::new(params, key) })
    }

    /// A certificate for an etcd member called `name`, for server and client use, with the
    /// loopback names and `extra_sans` (IP addresses or DNS names): `dir/<name>.crt` and `.key`.
    pub fn member(&self, name: &str, extra_sans: &[String]) -> Result<CertFiles> {
        let mut sans: Vec<String> = LOOPBACK_SANS.iter().map(|s| s.to_string()).collect();
        for s in extra_sans {
            if !sans.contains(s) {
                sans.push(s.clone());
            }
        }
        self.leaf(name, sans, vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth])
    }

    /// A client-only certificate called `name`: `dir/<name>.crt` and `.key`.
    pub fn client(&self, name: &str) -> Result<CertFiles> {
        self.leaf(name, Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth])
    }

    fn leaf(&self, name: &str, sans: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>) -> Result<CertFiles> {
        let key = KeyPair::generate().with_context(|| format!("key for {name}"))?;
        let mut params = CertificateParams::new(sans).with_context(|| format!("params for {name}"))?;
        params.distinguished_name = dn(name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages;
        let cert = params.signed_by(&key, &self.issuer).with_context(|| format!("sign {name}"))?;
        let files = CertFiles { cert: self.dir.join(format!("{name}.crt")), key: self.dir.join(format!("{name}.key")) };
        write(&files.cert, &cert.pem(), 0o644)?;
        write(&files.key, &key.serialize_pem(), 0o600)?;
        Ok(files)
    }
}

fn dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "computerd store-bench");
    dn
}

fn write(path: &Path, contents: &str, mode: u32) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    f.write_all(contents.as_bytes()).with_context(|| format!("write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::ServerName;
    use rustls::pki_types::UnixTime;
    use rustls::pki_types::pem::PemObject;

    use super::*;

    fn der(path: &Path) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(path).expect("PEM certificate")
    }

    #[test]
    fn member_certificates_verify_for_loopback_and_extra_names_and_keys_are_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::new(dir.path(), "test CA").expect("ca");
        let m = ca.member("m1", &["10.0.0.7".to_string(), "127.0.0.1".to_string()]).expect("member");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(&ca.cert)).expect("root");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .expect("verifier");
        let cert = der(&m.cert);
        for name in ["127.0.0.1", "localhost", "10.0.0.7"] {
            let name = ServerName::try_from(name).expect("name");
            verifier.verify_server_cert(&cert, &[], &name, &[], UnixTime::now()).expect("verifies");
        }
        let other = ServerName::try_from("10.0.0.8").expect("name");
        assert!(verifier.verify_server_cert(&cert, &[], &other, &[], UnixTime::now()).is_err());
        let mode = std::fs::metadata(&m.key).expect("key file").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
