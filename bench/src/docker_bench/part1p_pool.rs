//! Part 1p: create → first command from a warm pool, against `docker unpause` + `docker exec`
//! of a paused container of the same image (the closest thing Docker itself has to a sandbox
//! kept ready).

use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use computerd_bench::api::Api;
use computerd_bench::report::Pair;
use computerd_bench::report::Recorder;

use crate::ERROR_PAUSE;
use crate::POLL_EVERY;
use crate::SETTLE_BOUND;
use crate::computers::delete;
use crate::docker::CPUS;
use crate::docker::Cleanup;
use crate::docker::IMAGE;
use crate::docker::LABEL_BENCH;
use crate::docker::MEMORY_MB;
use crate::docker::PIDS;
use crate::docker::docker;
use crate::part1_create::Env;
use crate::part1_create::warn_on;

/// The pool's ready sandboxes of the default template, as the store has them.
async fn ready(api: &Api, provider: &str) -> Result<u64> {
    let v: serde_json::Value =
        api.http.get(api.url("/v1/computer-providers")).bearer_auth(&api.token).send().await?.json().await?;
    let p = v["providers"].as_array().and_then(|ps| ps.iter().find(|p| p["id"] == provider));
    Ok(p.and_then(|p| p["pool"]["default"]["ready"].as_u64()).unwrap_or(0))
}

/// Whether Computer `id`'s sandbox came from the pool.
async fn was_pooled(api: &Api, id: &str) -> Result<bool> {
    let v: serde_json::Value =
        api.http.get(api.url(&format!("/v1/computers/{id}"))).bearer_auth(&api.token).send().await?.json().await?;
    Ok(v["pooled"] == true)
}

/// Waits (untimed) until the pool has a ready sandbox again.
async fn wait_ready(api: &Api, provider: &str) -> Result<()> {
    let t0 = Instant::now();
    while ready(api, provider).await? == 0 {
        if t0.elapsed() > SETTLE_BOUND {
            anyhow::bail!("the pool did not refill within {SETTLE_BOUND:?}");
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    Ok(())
}

/// The baseline: a container of the same image and limits, sleeping, paused (untimed); then
/// `docker unpause` + `docker exec bash -lc true`, timed.
async fn raw_unpause_exec(env: &Env<'_>, key: &str) -> Result<(String, Duration)> {
    let name = format!("computerd-bench-{}-{key}", env.run);
    let label = format!("{LABEL_BENCH}={}", env.run);
    let (cpus, memory, pids) = (CPUS.to_string(), format!("{MEMORY_MB}m"), PIDS.to_string());
    let container = docker(&[
        "run",
        "-d",
        "--name",
        &name,
        "--label",
        &label,
        "--init",
        "--network",
        "host",
        "--cpus",
        &cpus,
        "--memory",
        &memory,
        "--pids-limit",
        &pids,
        "--workdir",
        "/root",
        "--entrypoint",
        "sleep",
        IMAGE,
        "infinity",
    ])
    .await?;
    docker(&["pause", &container]).await?;
    let t0 = Instant::now();
    docker(&["unpause", &container]).await?;
    docker(&["exec", &container, "bash", "-lc", "true"]).await?;
    Ok((container, t0.elapsed()))
}

/// Part 1p: `samples` rounds; each waits (untimed) for the pool to hold a ready sandbox.
pub async fn part_pool(env: &Env<'_>, pool_provider: &str, cleanup: &mut Cleanup, samples: usize) -> Pair {
    let (mut api, mut raw) = (Recorder::default(), Recorder::default());
    let pooled = Env { api: env.api, provider: pool_provider.to_string(), agent: env.agent, run: env.run.clone() };
    for i in 0..samples {
        match raw_unpause_exec(env, &format!("raw-unpause-{i}")).await {
            Ok((container, d)) => {
                raw.ok(d);
                warn_on("remove a baseline container", docker(&["rm", "-f", "-v", &container]).await);
            }
            Err(e) => raw.record(Err(e), ERROR_PAUSE).await,
        }
        if let Err(e) = wait_ready(env.api, pool_provider).await.context("the pool's refill") {
            api.record(Err(e), ERROR_PAUSE).await;
            continue;
        }
        match pooled.api_create(cleanup, &format!("pool-{i}")).await {
            Ok((id, _, d)) => {
                match pooled.api_first_command(&id).await {
                    Ok(c) => match was_pooled(env.api, &id).await {
                        Ok(true) => api.ok(d + c),
                        Ok(false) => api.record(Err(anyhow::anyhow!("the create missed the pool")), ERROR_PAUSE).await,
                        Err(e) => api.record(Err(e), ERROR_PAUSE).await,
                    },
                    Err(e) => api.record(Err(e), ERROR_PAUSE).await,
                }
                warn_on("delete a Computer", delete(env.api, &id, &format!("pool-{i}-delete")).await);
            }
            Err(e) => api.record(Err(e), ERROR_PAUSE).await,
        }
        eprintln!("  round {}/{samples} done", i + 1);
    }
    Pair {
        part: "1p",
        api: api.summary("API  POST /v1/computers (pooled) -> `true` exited"),
        raw: raw.summary("raw  docker unpause + exec bash -lc true"),
    }
}
