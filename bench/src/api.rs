//! Calls on a computerd node with the owner token, as agent-bench, docker-bench and cluster-bench
//! make them.

use std::path::Path;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;

use crate::report::call_json;
use crate::report::excerpt;

/// The shortest `yieldTimeMs` the API takes.
pub const MIN_YIELD_MS: u32 = 250;
/// Longest wait for a pairing execution to succeed.
const SETTLE_BOUND: Duration = Duration::from_secs(60);

/// Calls on the node at `base` with the owner token.
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
}

impl Api {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn post(&self, path: &str, body: Value, expected: StatusCode) -> Result<Value> {
        call_json(self.http.post(self.url(path)).bearer_auth(&self.token).json(&body), expected).await
    }

    pub async fn get(&self, path: &str) -> Result<Value> {
        call_json(self.http.get(self.url(path)).bearer_auth(&self.token), StatusCode::OK).await
    }

    /// Creates a paired Computer named `name` with the command key `key`; answers its id and
    /// pairing code once its execution succeeded (polled every `poll`).
    pub async fn paired_computer(&self, key: &str, name: &str, poll: Duration) -> Result<(String, String)> {
        let body = json!({"commandKey": key, "name": name, "source": {"_tag": "Paired"}});
        let r = self.post("/v1/computers", body, StatusCode::ACCEPTED).await.context("create a paired Computer")?;
        let exe = r["executionId"].as_str().with_context(|| format!("no executionId in {}", excerpt(&r)))?;
        let id = r["resource"]["id"].as_str().with_context(|| format!("no resource id in {}", excerpt(&r)))?;
        let deadline = Instant::now() + SETTLE_BOUND;
        loop {
            let v = self.get(&format!("/v1/executions/{exe}")).await.context("poll the execution")?;
            match v["state"].as_str() {
                Some("pending") | Some("running") if Instant::now() < deadline => tokio::time::sleep(poll).await,
                Some("succeeded") => {
                    let code =
                        v["pairingCode"].as_str().with_context(|| format!("no pairing code in {}", excerpt(&v)))?;
                    return Ok((id.to_string(), code.to_string()));
                }
                _ => bail!("execution {exe} did not succeed: {}", excerpt(&v)),
            }
        }
    }

    /// `POST …/sessions {"command": command}` (the default yield), timed to the answer, which
    /// must be the command's successful end with exactly `output`.
    pub async fn session_exit(&self, computer: &str, command: &str, output: &str) -> Result<Duration> {
        let path = format!("/v1/computers/{computer}/sessions");
        let t0 = Instant::now();
        let v = self.post(&path, json!({"command": command}), StatusCode::OK).await?;
        let d = t0.elapsed();
        expect_exit(&v, output)?;
        Ok(d)
    }

    /// `POST …/sessions/:sid/input`.
    pub async fn input(&self, computer: &str, sid: &str, chars: &str, yield_ms: u32) -> Result<Value> {
        let body = json!({"chars": chars, "yieldTimeMs": yield_ms});
        self.post(&format!("/v1/computers/{computer}/sessions/{sid}/input"), body, StatusCode::OK).await
    }

    /// Input `x\n` with the shortest yield to a running `cat` session, timed to the answer, which
    /// must be `cat` still running and echoing the line.
    pub async fn cat_echo(&self, computer: &str, sid: &str) -> Result<Duration> {
        let t0 = Instant::now();
        let v = self.input(computer, sid, "x\\n", MIN_YIELD_MS).await?;
        let d = t0.elapsed();
        if v["running"] != true || v["output"] != "x\n" {
            bail!("expected `cat` to run and echo x: {}", excerpt(&v));
        }
        Ok(d)
    }

    /// Ends a `cat` session, with a warning on stderr when that fails.
    pub async fn stop_cat_session(&self, computer: &str, sid: &str) {
        let url = self.url(&format!("/v1/computers/{computer}/sessions/{sid}"));
        if let Err(e) = call_json(self.http.delete(url).bearer_auth(&self.token), StatusCode::OK).await {
            eprintln!("warning: could not stop the `cat` session: {e:#}");
        }
    }

    /// `GET …/files?path=` with `Accept: application/octet-stream`, timed from the request to the
    /// last byte of the answer; the body must then be `want` (untimed).
    pub async fn read_file(&self, computer: &str, path: &Path, want: &[u8]) -> Result<Duration> {
        let mut url = reqwest::Url::parse(&self.url(&format!("/v1/computers/{computer}/files"))).context("file URL")?;
        url.query_pairs_mut().append_pair("path", &path.to_string_lossy());
        let t0 = Instant::now();
        let resp =
            self.http.get(url).bearer_auth(&self.token).header("accept", "application/octet-stream").send().await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        let d = t0.elapsed();
        if status != StatusCode::OK {
            bail!("HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)]));
        }
        if body != want {
            bail!("the file read back differs ({} bytes)", body.len());
        }
        Ok(d)
    }
}

/// A session answer must be the command's successful end with exactly `output`.
pub fn expect_exit(v: &Value, output: &str) -> Result<()> {
    if v["running"] == false && v["exitCode"] == 0 && v["output"] == output {
        Ok(())
    } else {
        bail!("expected exit 0 with output {output:?}: {}", excerpt(v))
    }
}
