//! One Docker sandbox on a test cluster, for the benches that measure a path to a Computer
//! (port-bench, stream-bench): the docker provider (host network, the release agent mounted),
//! one Computer created and, at the end, deleted with its container.

use std::path::Path;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_tests::TestCluster;
use serde_json::Value;
use serde_json::json;

/// A call on node 1 with the owner token; anything but 2xx is an error.
pub async fn call(c: &TestCluster, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
    let (s, v) = c.call(method, 1, path, &c.token, body).await;
    if !(200..300).contains(&s) {
        bail!("{path}: HTTP {s}: {v}");
    }
    Ok(v)
}

/// Registers the docker provider with `image` as its default template and creates one Computer
/// (with a desktop if `desktop`); answers its id (not yet running).
pub async fn create(c: &TestCluster, agent: &Path, image: &str, memory_mb: u32, desktop: bool) -> Result<String> {
    let config = json!({
        "serverUrl": c.url(1, ""),
        "network": "host",
        "agentBinary": agent.to_string_lossy(),
        "templates": {"default": {"image": image, "cpus": 1.0, "memoryMb": memory_mb, "pids": 512}},
    });
    let body = json!({"kind": "docker", "name": "d", "config": config});
    let v = call(c, reqwest::Method::POST, "/v1/computer-providers", Some(body)).await?;
    let provider = v["id"].as_str().context("provider id")?.to_string();
    let body = json!({"commandKey": "bench", "name": "bench", "desktop": desktop, "source": {"_tag": "Provider", "provider": provider}});
    let v = call(c, reqwest::Method::POST, "/v1/computers", Some(body)).await?;
    v["resource"]["id"].as_str().map(String::from).context("computer id")
}

/// Deletes the Computer, and removes its container whatever the delete answered.
pub async fn remove(c: &TestCluster, id: &str) {
    let _ =
        call(c, reqwest::Method::DELETE, &format!("/v1/computers/{id}"), Some(json!({"commandKey": "bench-d"}))).await;
    for container in computerd_tests::docker::containers_of(id) {
        let _ = std::process::Command::new("docker").args(["rm", "-f", &container]).output();
    }
}

/// Runs `bench` with the release agent's path on a runtime whose harness uses the release
/// `computerd` (see [`crate::settings`]).
pub fn main<F, Fut>(bench: F) -> Result<()>
where
    F: FnOnce(std::path::PathBuf) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let computerd = crate::settings::computerd_bin()?;
    let agent = crate::settings::agent_bin()?;
    // SAFETY: called first thing in `main`: nothing else runs yet.
    let rt = unsafe { crate::settings::runtime_for(&computerd)? };
    rt.block_on(bench(agent))
}
