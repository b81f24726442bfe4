//! etcd clusters (1 or 3 members) as child processes on free loopback ports, for comparison.
//!
//! Every member gets its own data dir in a temp dir and the default (durable) settings: etcd
//! fsyncs its WAL before it acknowledges a write. The processes are killed when the
//! [`EtcdCluster`] drops, including while a panic unwinds.

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
use anyhow::bail;
use serde_json::Value;
use serde_json::json;
use tokio::time::Instant;

use crate::base64;

/// How long a cluster may take to elect a leader and accept a write.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One etcd member process.
pub struct EtcdMember {
    /// `--name`.
    pub name: String,
    /// `http://127.0.0.1:port`, the client URL (gRPC and the v3 JSON gateway).
    pub client_url: String,
    child: Option<Child>,
    log: PathBuf,
}

/// A running etcd cluster in a temporary directory.
pub struct EtcdCluster {
    /// Members in start order.
    pub members: Vec<EtcdMember>,
    /// Holds the data dirs and logs; deleted after `Drop` has killed the processes.
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts an `n`-member cluster with `bin` and waits until every member reports healthy and
    /// accepts a put.
    pub async fn start(bin: &Path, n: usize, http: &reqwest::Client) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("computerd-bench-etcd-").tempdir().context("temp dir")?;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let token = format!("bench-{}-{nanos}-{n}", std::process::id());
        let ports: Vec<(u16, u16)> =
            (0..n).map(|_| (computerd_tests::free_port(), computerd_tests::free_port())).collect();
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{}=http://127.0.0.1:{peer}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster { members: Vec::new(), dir };
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("m{}", i + 1);
            let data = cluster.dir.path().join(&name);
            let log = cluster.dir.path().join(format!("{name}.log"));
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
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
                .args(["--logger", "zap"])
                .stdin(Stdio::null())
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err))
                .spawn()
                .with_context(|| format!("spawn {}", bin.display()))?;
            cluster.members.push(EtcdMember { name, client_url, child: Some(child), log });
        }
        cluster.wait_ready(http).await?;
        Ok(cluster)
    }

    /// Polls until every member answers `/health` with `"true"` and accepts a put; fails early
    /// when a member exits.
    async fn wait_ready(&mut self, http: &reqwest::Client) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.check_running()?;
            let err = match self.probe(http).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                bail!("etcd did not become ready in {START_TIMEOUT:?}: {err:#}\n{}", self.log_tails(20));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn probe(&self, http: &reqwest::Client) -> Result<()> {
        for m in &self.members {
            let h: Value = http
                .get(format!("{}/health", m.client_url))
                .timeout(Duration::from_secs(2))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            if h["health"] != "true" {
                bail!("{} is not healthy yet: {h}", m.name);
            }
            let body = json!({"key": base64::encode(b"bench/ready"), "value": base64::encode(m.name.as_bytes())});
            http.post(format!("{}/v3/kv/put", m.client_url))
                .timeout(Duration::from_secs(5))
                .json(&body)
                .send()
                .await?
                .error_for_status()
                .with_context(|| format!("put through {}", m.name))?;
        }
        Ok(())
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
    pub async fn leader_url(&self, http: &reqwest::Client) -> Result<String> {
        for m in &self.members {
            let s: Value = http
                .post(format!("{}/v3/maintenance/status", m.client_url))
                .timeout(Duration::from_secs(5))
                .json(&json!({}))
                .send()
                .await?
                .error_for_status()?
                .json()
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
