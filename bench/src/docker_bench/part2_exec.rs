//! Part 2: a command in the sandbox through the API against `docker exec`.

use std::time::Instant;

use anyhow::bail;
use computerd_bench::api::Api;
use computerd_bench::report::Pair;
use computerd_bench::report::Recorder;
use computerd_bench::report::Summary;
use computerd_bench::report::excerpt;
use reqwest::StatusCode;
use serde_json::json;

use crate::ERROR_PAUSE;
use crate::docker::docker;

/// Part 2 results, with the Docker CLI's floor.
pub struct ExecResults {
    pub pair: Pair,
    pub cli_floor: Summary,
}

/// Part 2: a session `true` against `docker exec` of `bash -lc true` in the same container, after
/// one warm-up round (not counted). Each round also times `docker inspect` of the container: one
/// trivial engine request, the floor of every Docker CLI call in the baselines.
pub async fn part_exec(api: &Api, computer: &str, container: &str, samples: usize) -> ExecResults {
    let path = format!("/v1/computers/{computer}/sessions");
    let (mut via_api, mut raw, mut floor) = (Recorder::default(), Recorder::default(), Recorder::default());
    for round in 0..=samples {
        if round == 1 {
            // Round 0 was the warm-up.
            (via_api, raw, floor) = (Recorder::default(), Recorder::default(), Recorder::default());
        }
        let t0 = Instant::now();
        let r = docker(&["exec", container, "bash", "-lc", "true"]).await.map(|_| t0.elapsed());
        raw.record(r, ERROR_PAUSE).await;
        let op = async {
            let t0 = Instant::now();
            let v = api.post(&path, json!({"command": "true", "yieldTimeMs": 10_000}), StatusCode::OK).await?;
            let d = t0.elapsed();
            if v["running"] != false || v["exitCode"] != 0 {
                bail!("expected `true` to exit 0: {}", excerpt(&v));
            }
            Ok(d)
        };
        via_api.record(op.await, ERROR_PAUSE).await;
        let t0 = Instant::now();
        let r = docker(&["inspect", "-f", "{{.State.Running}}", container]).await.map(|_| t0.elapsed());
        floor.record(r, ERROR_PAUSE).await;
    }
    ExecResults {
        pair: Pair {
            part: "2",
            api: via_api.summary("API  session `true`, start to exit"),
            raw: raw.summary("raw  docker exec CONTAINER bash -lc true"),
        },
        cli_floor: floor.summary("raw  docker inspect CONTAINER (the CLI's floor)"),
    }
}
