//! The calls on the node that the docker provider's Computers need: register the provider,
//! create, wait for a state, pause or resume, delete.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::api::Api;
use computerd_bench::report::excerpt;
use reqwest::StatusCode;
use serde_json::Value;
use serde_json::json;

use crate::POLL_EVERY;
use crate::SETTLE_BOUND;
use crate::docker::CPUS;
use crate::docker::IMAGE;
use crate::docker::MEMORY_MB;
use crate::docker::PIDS;

/// Registers the docker provider, with a warm pool of `pool` sandboxes of its default template
/// (0: none); answers its id.
pub async fn docker_provider(api: &Api, agent: &Path, pool: u32) -> Result<String> {
    let mut config = json!({
        "serverUrl": api.base,
        "network": "host",
        "agentBinary": agent.to_string_lossy(),
        "templates": {"default": {"image": IMAGE, "cpus": CPUS, "memoryMb": MEMORY_MB, "pids": PIDS}},
    });
    if pool > 0 {
        config["pool"] = json!({"default": {"size": pool}});
    }
    let name = if pool > 0 { "docker-pooled" } else { "docker" };
    let body = json!({"kind": "docker", "name": name, "config": config});
    let v = api.post("/v1/computer-providers", body, StatusCode::CREATED).await.context("register the provider")?;
    v["id"].as_str().map(String::from).with_context(|| format!("no provider id in {}", excerpt(&v)))
}

/// `POST /v1/computers` of the docker provider; answers the Computer's id.
pub async fn create(api: &Api, provider: &str, key: &str) -> Result<String> {
    let body = json!({
        "commandKey": key, "name": key,
        "source": {"_tag": "Provider", "provider": provider, "template": null},
        "pauseAfter": null,
    });
    let v = api.post("/v1/computers", body, StatusCode::ACCEPTED).await.context("create")?;
    v["resource"]["id"].as_str().map(String::from).with_context(|| format!("no resource id in {}", excerpt(&v)))
}

/// The Computer's state; `None` once it is gone (404).
pub async fn state(api: &Api, id: &str) -> Result<Option<String>> {
    let resp = api.http.get(api.url(&format!("/v1/computers/{id}"))).bearer_auth(&api.token).send().await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    match status {
        StatusCode::NOT_FOUND => Ok(None),
        StatusCode::OK => {
            let v: Value = serde_json::from_slice(&body).context("the answer is not JSON")?;
            let state = v["state"].as_str().with_context(|| format!("no state in {}", excerpt(&v)))?;
            Ok(Some(state.to_string()))
        }
        _ => bail!("HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)])),
    }
}

/// Polls the Computer every [`POLL_EVERY`] until it is `want`; `failed` or a timeout is an
/// error.
pub async fn wait_state(api: &Api, id: &str, want: &str) -> Result<()> {
    let deadline = Instant::now() + SETTLE_BOUND;
    loop {
        let state = state(api, id).await.with_context(|| format!("read computer {id}"))?;
        match state.as_deref() {
            Some(s) if s == want => return Ok(()),
            Some("failed") => bail!("computer {id} failed while waiting for {want}"),
            None => bail!("computer {id} is gone while waiting for {want}"),
            _ if Instant::now() >= deadline => {
                bail!("computer {id} is not {want} after {SETTLE_BOUND:?}: {state:?}")
            }
            _ => tokio::time::sleep(POLL_EVERY).await,
        }
    }
}

/// `POST /v1/computers/:id/<what>` with a fresh command key (pause, resume).
pub async fn lifecycle(api: &Api, id: &str, what: &str, key: &str) -> Result<()> {
    api.post(&format!("/v1/computers/{id}/{what}"), json!({"commandKey": key}), StatusCode::ACCEPTED)
        .await
        .with_context(|| format!("{what} computer {id}"))?;
    Ok(())
}

/// Deletes the Computer and waits until it is gone. A create whose agent linked before its
/// execution finished still holds the Computer for a moment (409): asked again then.
pub async fn delete(api: &Api, id: &str, key: &str) -> Result<()> {
    let deadline = Instant::now() + SETTLE_BOUND;
    loop {
        let req = api.http.delete(api.url(&format!("/v1/computers/{id}"))).bearer_auth(&api.token);
        let resp = req.json(&json!({"commandKey": key})).send().await.with_context(|| format!("delete {id}"))?;
        let status = resp.status();
        let body = resp.bytes().await.with_context(|| format!("delete {id}"))?;
        match status {
            StatusCode::ACCEPTED => break,
            StatusCode::CONFLICT if Instant::now() < deadline => tokio::time::sleep(POLL_EVERY * 10).await,
            _ => bail!("delete {id}: HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)])),
        }
    }
    loop {
        if state(api, id).await.with_context(|| format!("read computer {id}"))?.is_none() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("computer {id} is not deleted after {SETTLE_BOUND:?}");
        }
        tokio::time::sleep(POLL_EVERY * 4).await;
    }
}
