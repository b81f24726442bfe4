//! How the agent reaches the cluster: `https://` (pairing) and `wss://` (the link) with the
//! server verified against the system's roots, or against a private CA pinned with `--ca` (or
//! `--ca-pem`, the CA's PEM itself, which is how the Docker provider hands it over); plain
//! `http://` only to a loopback address, or with `--insecure` (the credential and the sessions'
//! contents would cross the network in clear).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

/// A private CA to pin: a file, or the PEM text itself.
#[derive(Clone, Copy, Debug)]
pub enum Ca<'a> {
    /// `--ca FILE`.
    File(&'a Path),
    /// `--ca-pem PEM`.
    Pem(&'a str),
}

impl Ca<'_> {
    fn label(&self) -> String {
        match self {
            Ca::File(p) => format!("--ca {}", p.display()),
            Ca::Pem(_) => "--ca-pem".to_string(),
        }
    }

    fn pem(&self) -> Result<Vec<u8>, String> {
        match self {
            Ca::File(p) => std::fs::read(p).map_err(|e| format!("{}: {e}", self.label())),
            Ca::Pem(text) => Ok(text.as_bytes().to_vec()),
        }
    }
}

/// The server and the TLS to reach it with.
#[derive(Clone)]
pub struct Dial {
    /// `http(s)://host:port`.
    pub server: String,
    /// For an `https://` server.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

fn loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The dial of `server`, or why it is refused (before anything is sent).
pub fn dial(server: &str, ca: Option<Ca<'_>>, insecure: bool) -> Result<Dial, String> {
    let server = server.trim_end_matches('/').to_string();
    if let Some(rest) = server.strip_prefix("https://") {
        let mut roots = rustls::RootCertStore::empty();
        match ca {
            Some(ca) => {
                use rustls::pki_types::CertificateDer;
                use rustls::pki_types::pem::PemObject;
                let label = ca.label();
                for cert in CertificateDer::pem_slice_iter(&ca.pem()?) {
                    let cert = cert.map_err(|e| format!("{label}: not PEM certificates: {e}"))?;
                    roots.add(cert).map_err(|e| format!("{label}: {e}"))?;
                }
                if roots.is_empty() {
                    return Err(format!("{label}: no certificate"));
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
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
        // WebSocket upgrades are HTTP/1.1.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let _ = rest;
        return Ok(Dial { server, tls: Some(Arc::new(config)) });
    }
    let Some(rest) = server.strip_prefix("http://") else {
        return Err(format!("--server {server}: give an https:// (or, to a loopback address, http://) URL"));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => authority,
    };
    if !loopback(host) && !insecure {
        return Err(format!(
            "refusing plain http:// to {host}: the credential and the sessions would cross the network in clear; \
             use https:// (--ca FILE to pin a private CA), or --insecure"
        ));
    }
    Ok(Dial { server, tls: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_to_loopback_unless_insecure() {
        assert!(dial("http://127.0.0.1:8080", None, false).is_ok());
        assert!(dial("http://[::1]:8080/", None, false).is_ok());
        assert!(dial("http://localhost:8080", None, false).is_ok());
        let refused = dial("http://172.17.0.1:8080", None, false).err().unwrap_or_default();
        assert!(refused.contains("refusing plain http:// to 172.17.0.1"), "{refused}");
        assert!(dial("http://172.17.0.1:8080", None, true).is_ok_and(|d| d.tls.is_none()));
        assert!(dial("https://example.org", None, false).is_ok_and(|d| d.tls.is_some()));
        assert!(dial("ftp://x", None, true).is_err());
        assert!(dial("https://x", Some(Ca::File(Path::new("/nonexistent/ca.pem"))), false).is_err());
        let empty = dial("https://x", Some(Ca::Pem("not a certificate")), false).err().unwrap_or_default();
        assert!(empty.contains("--ca-pem: no certificate"), "{empty}");
    }
}
