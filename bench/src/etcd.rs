//! etcd clusters (1 or 3 members) as child processes on free loopback ports, for comparison.
//!
//! Every member gets its own data dir in a temp dir and the default (durable) settings: etcd
//! fsyncs its WAL before it acknowledges a write. Peers and clients speak TLS with client
//! certificates, as computerd's nodes do with each other: a throwaway CA in the same temp dir
//! (see [`certs`](crate::certs)) signs one certificate per member and one for the bench's
//! client ([`EtcdCluster::client`]), and every member requires a certificate of that CA from
//! its peers (`--peer-client-cert-auth`) and its clients (`--client-cert-auth`). The processes
//! are killed when the [`EtcdCluster`] drops, including while a panic unwinds.

use std::fs;
use std::path::Path;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;
use std::time::SystemTime;
use std::time::UNIX_EPOCH;

use anyhow::Context;
use anyhow::Result;
use anyhow::anyhow;
use anyhow::bail;
use serde_json::Value;
use serde_json::json;
use tokio::time::Instant;

use crate::base64;
use crate::certs::Ca;
use crate::https;

/// How long a cluster may take to elect a leader and accept a write.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One etcd member process.
pub struct EtcdMember {
    /// `--name`.
    pub name: String,
    /// `https://127.0.0.1:port`, the client URL (gRPC and the v3 JSON gateway).
    pub client_url: String,
    child: Option<Child>,
    log: PathBuf,
}

/// A running etcd cluster in a temporary directory.
pub struct EtcdCluster {
    /// Members in start order.
    pub members: Vec<EtcdMember>,
    /// An HTTPS client that trusts the cluster's CA and presents a client certificate of it.
    pub client: https::Client,
    /// Holds the data dirs, certificates and logs; deleted after `Drop` has killed the
    /// processes.
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts an `n`-member cluster with `bin` (certificates made first) and waits until every
    /// member reports healthy and accepts a put.
    pub async fn start(bin: &Path, n: usize) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("computerd-bench-etcd-").tempdir().context("temp dir")?;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let token = format!("bench-{}-{nanos}-{n}", std::process::id());
        let ports: Vec<(u16, u16)> =
            (0..n).map(|_| (computerd_tests::free_port(), computerd_tests::free_port())).collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{}=https://127.0.0.1:{peer}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let pki = dir.path().join("pki");
        fs::create_dir(&pki).with_context(|| format!("create {}", pki.display()))?;
        let ca = Ca::new(&pki, "store-bench etcd CA")?;
        let client = https::Client::new(&ca.cert, &ca.client("store-bench-client")?)?;
        let mut cluster = EtcdCluster { members: Vec::new(), client, dir };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("m{}", i + 1);
            let data = cluster.dir.path().join(&name);
            let log = cluster.dir.path().join(format!("{name}.log"));
            let client_url = format!("https://127.0.0.1:{client}");
            let peer_url = format!("https://127.0.0.1:{peer}");
            // Members listen on loopback only, which the certificate always names.
            let tls = ca.member(&name, &[])?;
            let out = fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
            let err = out.try_clone().context("clone log file handle")?;
            let child = Command::new(bin)
                .args(["--name", &name])
                .arg("--data-dir")
                .arg(&data)
                .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial_cluster, "--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", &token])
                .arg("--peer-client-cert-auth")
                .arg("--peer-trusted-ca-file")
                .arg(&ca.cert)
                .arg("--peer-cert-file")
                .arg(&tls.cert)
                .arg("--peer-key-file")
                .arg(&tls.key)
                .arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(&ca.cert)
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .args(["--logger", "zap"])
                .stdin(Stdio::null())
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err))
                .spawn()
                .with_context(|| format!("spawn {}", bin.display()))?;
            cluster.members.push(EtcdMember { name, client_url, child: Some(child), log });
        }
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    /// Polls until every member answers `/health` with `"true"` and accepts a put; fails early
    /// when a member exits.
    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.check_running()?;
            let err = match self.probe().await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                bail!("etcd did not become ready in {START_TIMEOUT:?}: {err:#}\n{}", self.log_tails(20));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn probe(&self) -> Result<()> {
        for m in &self.members {
            let h: Value = self.call(&m.client_url, "/health", None, Duration::from_secs(2)).await?;
            if h["health"] != "true" {
                bail!("{} is not healthy yet: {h}", m.name);
            }
            let body = json!({"key": base64::encode(b"bench/ready"), "value": base64::encode(m.name.as_bytes())});
            self.call(&m.client_url, "/v3/kv/put", Some(&body), Duration::from_secs(5))
                .await
                .with_context(|| format!("put through {}", m.name))?;
        }
        Ok(())
    }

    /// `GET` (no body) or `POST` (JSON `body`) `path` on `base`: the JSON answer, or an error
    /// unless it is a 2xx.
    async fn call(&self, base: &str, path: &str, body: Option<&Value>, timeout: Duration) -> Result<Value> {
        let url = format!("{base}{path}");
        let (status, bytes) = match body {
            Some(b) => self.client.post_json(&url, b, Some(timeout)).await?,
            None => self.client.get(&url, Some(timeout)).await?,
        };
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
            return Err(anyhow!("HTTP {status} from {url}: {text}"));
        }
        serde_json::from_slice(&bytes).with_context(|| format!("JSON from {url}"))
    }

    fn check_running(&mut self) -> Result<()> {
        for i in 0..self.members.len() {
            let status = match self.members[i].child.as_mut() {
                Some(c) => c.try_wait().context("try_wait on etcd")?,
                None => None,
            };
            if let Some(s) = status {
                self.members[i].child = None;
                bail!("etcd member {} exited with {s}\n{}", self.members[i].name, self.log_tails(40));
            }
        }
        Ok(())
    }

    /// The client URL of the current leader (from `/v3/maintenance/status` on every member).
    pub async fn leader_url(&self) -> Result<String> {
        for m in &self.members {
            let s = self
                .call(&m.client_url, "/v3/maintenance/status", Some(&json!({})), Duration::from_secs(5))
                .await
                .with_context(|| format!("status of {}", m.name))?;
            // The gateway encodes uint64 fields as JSON strings.
            let me = s["header"]["member_id"].as_str().context("status without header.member_id")?;
            let leader = s["leader"].as_str().context("status without leader")?;
            if me == leader {
                return Ok(m.client_url.clone());
            }
        }
        bail!("no etcd member reports itself as the leader")
    }

    /// The last `lines` lines of every member's log.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for m in &self.members {
            let text = fs::read_to_string(&m.log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!("---- etcd {} log tail ----\n", m.name));
            out.push_str(&all[all.len().saturating_sub(lines)..].join("\n"));
            out.push('\n');
        }
        out
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut c) = m.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// `etcd --version`'s first line, for the report.
pub fn version(bin: &Path) -> Result<String> {
    let out =
        Command::new(bin).arg("--version").output().with_context(|| format!("run {} --version", bin.display()))?;
    if !out.status.success() {
        bail!("{} --version failed with {}", bin.display(), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or("unknown").trim().to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject;
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::certs::CertFiles;

    /// `/usr/bin/etcd` (or `ETCD_BIN`): the test fails without it (`.ci/run` installs it).
    fn etcd_bin() -> Option<PathBuf> {
        let bin = std::env::var_os("ETCD_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"));
        assert!(bin.is_file(), "no etcd at {} (apt-get install -y etcd-server)", bin.display());
        Some(bin)
    }

    /// What the member at `url` (`https://127.0.0.1:port`) answers a raw `GET /health` on a
    /// connection with a TLS client that trusts the CA and presents `identity` (or nothing), or
    /// the error.
    async fn raw_health(ca: &Path, url: &str, identity: Option<&CertFiles>) -> Result<String> {
        let port: u16 = url.rsplit(':').next().context("port")?.parse()?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(ca)?)?;
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let config = match identity {
            Some(id) => builder.with_client_auth_cert(
                vec![CertificateDer::from_pem_file(&id.cert)?],
                PrivateKeyDer::from_pem_file(&id.key)?,
            )?,
            None => builder.with_no_client_auth(),
        };
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
        tls.write_all(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n").await?;
        let mut out = Vec::new();
        tls.read_to_end(&mut out).await?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn three_members_with_peer_and_client_tls_refuse_clients_without_a_certificate() {
        let Some(bin) = etcd_bin() else { return };
        let cluster = EtcdCluster::start(&bin, 3).await.expect("a 3-member cluster over TLS");
        let leader = cluster.leader_url().await.expect("leader");
        assert!(leader.starts_with("https://127.0.0.1:"), "{leader}");
        // With the cluster's client certificate: a put answers 200.
        let body = json!({"key": base64::encode(b"k"), "value": base64::encode(b"v")});
        let (status, _) =
            cluster.client.post_json(&format!("{leader}/v3/kv/put"), &body, None).await.expect("put over mTLS");
        assert_eq!(status, http::StatusCode::OK);
        // The same raw request with the client certificate is answered, without one it is not.
        let pki = cluster.dir.path().join("pki");
        let ca = pki.join("ca.crt");
        let id = CertFiles { cert: pki.join("store-bench-client.crt"), key: pki.join("store-bench-client.key") };
        for m in &cluster.members {
            let with = raw_health(&ca, &m.client_url, Some(&id)).await.expect("raw request with a certificate");
            assert!(with.starts_with("HTTP/1.1 200 OK"), "{}: {with}", m.name);
            if let Ok(text) = raw_health(&ca, &m.client_url, None).await {
                assert!(!text.contains("200 OK"), "{} answered without a client certificate: {text}", m.name);
            }
        }
        // Plain HTTP on the client port: no answer either.
        let port = leader.rsplit(':').next().expect("port");
        let plain = reqwest::Client::new().get(format!("http://127.0.0.1:{port}/health")).send().await;
        assert!(plain.map(|r| !r.status().is_success()).unwrap_or(true), "answered plain HTTP");
    }
}
