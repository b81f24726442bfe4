//! A local CA for the HTTP edge, kept in a directory, and the server certificates it signs:
//! `computerd edge-cert` makes a load balancer's at set-up (deploy/), and `computerd dev` the
//! one of its HTTPS/WSS listener on the Docker bridge, which its sandboxes' agents pin.
//!
//! Files in the directory:
//! - `ca.crt` (0644): what clients pin (the agent's `--ca`, curl's `--cacert`);
//! - `ca.key` (0600): never leaves the directory;
//! - `edge.crt` (0644): the server certificate, then the CA (the chain `--tls-cert` serves);
//! - `edge.key` (0600): its key (`--tls-key`);
//! - `edge.pem` (0600): chain and key in one file (HAProxy's `crt`).
//!
//! The CA is made once and kept. The server certificate is made again when its names change or
//! less than a third of its validity is left; otherwise the files are left as they are.

use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

use computerd_raft::tls;

/// The edge's files, and the CA's PEM.
#[derive(Debug, Clone)]
pub struct EdgeFiles {
    /// `ca.crt`.
    pub ca: PathBuf,
    /// `edge.crt`.
    pub cert: PathBuf,
    /// `edge.key`.
    pub key: PathBuf,
    /// `edge.pem`.
    pub bundle: PathBuf,
    /// The CA certificate (PEM).
    pub ca_pem: String,
    /// Whether the server certificate was made now (else the kept one still fits).
    pub made: bool,
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Makes (or keeps) the CA in `dir` and a server certificate for `names` lasting `validity`.
pub fn ensure(dir: &Path, names: &[String], validity: Duration) -> Result<EdgeFiles, String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(|e| at(&e))?;
    let (ca, ca_key) = (dir.join("ca.crt"), dir.join("ca.key"));
    let (ca_pem, ca_key_pem) = match (read(&ca), read(&ca_key)) {
        (Some(c), Some(k)) => (c, k),
        (None, None) => {
            let (c, k) = tls::new_edge_ca("computerd local edge CA").map_err(|e| at(&e))?;
            tls::write_secret(&ca_key, &k).map_err(|e| at(&e))?;
            tls::write_public(&ca, &c).map_err(|e| at(&e))?;
            (c, k)
        }
        _ => return Err(format!("{}: ca.crt and ca.key must both be there, or neither", dir.display())),
    };
    let files = EdgeFiles {
        ca,
        cert: dir.join("edge.crt"),
        key: dir.join("edge.key"),
        bundle: dir.join("edge.pem"),
        ca_pem: ca_pem.clone(),
        made: false,
    };
    let mut wanted: Vec<String> = names.to_vec();
    wanted.sort();
    wanted.dedup();
    let fits = read(&files.cert).and_then(|pem| tls::expiry_and_names(&pem)).is_some_and(|(not_after, mut have)| {
        have.sort();
        have.dedup();
        have == wanted && not_after > tls::now_secs() + validity.as_secs() / 3
    });
    if fits && files.key.exists() && files.bundle.exists() {
        return Ok(files);
    }
    let (cert, key) = tls::edge_cert(&ca_pem, &ca_key_pem, names, validity).map_err(|e| at(&e))?;
    let chain = format!("{}\n{}", cert.trim_end(), ca_pem);
    // The key first, so a certificate on disk always has its key beside it.
    tls::write_secret(&files.key, &key).map_err(|e| at(&e))?;
    tls::write_secret(&files.bundle, &format!("{}\n{}", chain.trim_end(), key)).map_err(|e| at(&e))?;
    tls::write_public(&files.cert, &chain).map_err(|e| at(&e))?;
    Ok(EdgeFiles { made: true, ..files })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_kept_and_the_certificate_follows_its_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let names = vec!["172.17.0.1".to_string(), "localhost".to_string()];
        let first = ensure(dir.path(), &names, Duration::from_secs(86_400)).expect("first");
        assert!(first.made);
        let mode =
            |p: &Path| std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).expect("meta").permissions());
        assert_eq!(mode(&dir.path().join("ca.key")) & 0o777, 0o600);
        assert_eq!(mode(&first.key) & 0o777, 0o600);
        assert_eq!(mode(&first.bundle) & 0o777, 0o600);
        let (_, sans) = tls::expiry_and_names(&read(&first.cert).expect("cert")).expect("parse");
        assert_eq!(sans, names, "an IP and a DNS name, each a SAN");
        let again = ensure(dir.path(), &names, Duration::from_secs(86_400)).expect("again");
        assert!(!again.made, "a fitting certificate is kept");
        let other = ensure(dir.path(), &["10.0.0.1".to_string()], Duration::from_secs(86_400)).expect("other");
        assert!(other.made, "new names, a new certificate");
        assert_eq!(other.ca_pem, first.ca_pem, "the same CA");
        // The served chain verifies against the CA for its name.
        let cfg = crate::edge::tls_config(&other.cert, &other.key);
        assert!(cfg.is_ok(), "{:?}", cfg.err());
        std::fs::remove_file(dir.path().join("ca.key")).expect("rm");
        assert!(ensure(dir.path(), &names, Duration::from_secs(60)).is_err(), "a CA without its key is refused");
    }
}
