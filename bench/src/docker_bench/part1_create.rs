//! Part 1: create → running through the API against `docker run -d` of the same container
//! until its agent links.

use std::path::Path;
use std::time::Duration;
use std::time::Instant;

use anyhow::Result;
use computerd_bench::api::Api;
use computerd_bench::report::Pair;
use computerd_bench::report::Recorder;
use computerd_bench::report::Summary;
use reqwest::StatusCode;
use serde_json::json;

use crate::ERROR_PAUSE;
use crate::POLL_EVERY;
use crate::computers::create;
use crate::computers::delete;
use crate::computers::wait_state;
use crate::docker::AGENT_PATH;
use crate::docker::AGENT_STATE;
use crate::docker::CPUS;
use crate::docker::Cleanup;
use crate::docker::IMAGE;
use crate::docker::LABEL_BENCH;
use crate::docker::MEMORY_MB;
use crate::docker::PIDS;
use crate::docker::docker;

/// A baseline sandbox: a container of the same image running the same agent, paired with a
/// paired Computer.
pub struct Baseline {
    pub container: String,
    pub computer: String,
}

/// What the bench needs to make sandboxes.
pub struct Env<'a> {
    pub api: &'a Api,
    pub provider: String,
    pub agent: &'a Path,
    pub run: String,
}

impl Env<'_> {
    /// computerd: `POST /v1/computers` until `running`. Answers the Computer (tracked for clean-up
    /// as soon as it is known) and the times to the 202 and to `running`.
    pub async fn api_create(&self, cleanup: &mut Cleanup, key: &str) -> Result<(String, Duration, Duration)> {
        let t0 = Instant::now();
        let id = create(self.api, &self.provider, key).await?;
        let accepted = t0.elapsed();
        cleanup.track(&id);
        wait_state(self.api, &id, "running").await?;
        Ok((id, accepted, t0.elapsed()))
    }

    /// The baseline: a paired Computer (untimed), then `docker run -d` of the same container the
    /// provider makes, with that Computer's pairing code, until the Computer is `running` (its
    /// agent linked). Answers it and the times to `docker run` returning and to `running`.
    pub async fn raw_create(&self, key: &str) -> Result<(Baseline, Duration, Duration)> {
        let (computer, code) = self.api.paired_computer(key, key, POLL_EVERY).await?;
        let args = [
            "run".to_string(),
            "-d".into(),
            "--name".into(),
            format!("computerd-bench-{}-{key}", self.run),
            "--label".into(),
            format!("{LABEL_BENCH}={}", self.run),
            "--init".into(),
            "--network".into(),
            "host".into(),
            "--cpus".into(),
            CPUS.to_string(),
            "--memory".into(),
            format!("{MEMORY_MB}m"),
            "--pids-limit".into(),
            PIDS.to_string(),
            "--workdir".into(),
            "/root".into(),
            "-e".into(),
            format!("COMPUTER_AGENT_SERVER={}", self.api.base),
            "-e".into(),
            format!("COMPUTER_AGENT_STATE={AGENT_STATE}"),
            "-e".into(),
            "HOME=/root".into(),
            "-e".into(),
            format!("COMPUTER_AGENT_PAIR={code}"),
            "-v".into(),
            format!("{}:{AGENT_PATH}:ro", self.agent.display()),
            IMAGE.into(),
            AGENT_PATH.into(),
        ];
        let t0 = Instant::now();
        let container = docker(&args).await?;
        let started = t0.elapsed();
        wait_state(self.api, &computer, "running").await?;
        Ok((Baseline { container, computer }, started, t0.elapsed()))
    }

    /// The first-command baseline: `docker run -d` of the same image with the same limits
    /// (sleeping: no agent is needed to exec), then `docker exec bash -lc true` in it. Answers
    /// the container and the time from the run to the command's end.
    pub async fn raw_run_exec(&self, key: &str) -> Result<(String, Duration)> {
        let name = format!("computerd-bench-{}-{key}", self.run);
        let label = format!("{LABEL_BENCH}={}", self.run);
        let (cpus, memory, pids) = (CPUS.to_string(), format!("{MEMORY_MB}m"), PIDS.to_string());
        let args = [
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
        ];
        let t0 = Instant::now();
        let container = docker(&args).await?;
        docker(&["exec", &container, "bash", "-lc", "true"]).await?;
        Ok((container, t0.elapsed()))
    }

    /// computerd's first command: a session `true` in Computer `id` until it exits.
    pub async fn api_first_command(&self, id: &str) -> Result<Duration> {
        let t0 = Instant::now();
        let path = format!("/v1/computers/{id}/sessions");
        let v = self.api.post(&path, json!({"command": "true", "yieldTimeMs": 10_000}), StatusCode::OK).await?;
        if v["running"] != false || v["exitCode"] != 0 {
            anyhow::bail!("expected `true` to exit 0: {}", computerd_bench::report::excerpt(&v));
        }
        Ok(t0.elapsed())
    }
}

/// Logs a failed untimed step (removing a sample's sandbox) and goes on.
pub fn warn_on<T>(what: &str, r: Result<T>) {
    if let Err(e) = r {
        eprintln!("warning: {what}: {e:#}");
    }
}

/// Part 1 results, with the times to the first answer.
pub struct CreateResults {
    pub pair: Pair,
    /// Create → the first command's end, against `docker run -d` + `docker exec`.
    pub first: Pair,
    pub api_accepted: Summary,
    pub raw_started: Summary,
}

/// Part 1: `samples` rounds of one baseline and one computerd create, each removed (untimed)
/// before the next.
pub async fn part_create(env: &Env<'_>, cleanup: &mut Cleanup, samples: usize) -> CreateResults {
    let (mut api, mut raw, mut accepted, mut started) =
        (Recorder::default(), Recorder::default(), Recorder::default(), Recorder::default());
    let (mut api_first, mut raw_first) = (Recorder::default(), Recorder::default());
    for i in 0..samples {
        match env.raw_create(&format!("raw-{i}")).await {
            Ok((b, s, d)) => {
                raw.ok(d);
                started.ok(s);
                warn_on("remove a baseline container", docker(&["rm", "-f", "-v", &b.container]).await);
                warn_on(
                    "delete a baseline's paired Computer",
                    delete(env.api, &b.computer, &format!("raw-{i}-delete")).await,
                );
            }
            Err(e) => raw.record(Err(e), ERROR_PAUSE).await,
        }
        match env.raw_run_exec(&format!("raw-exec-{i}")).await {
            Ok((container, d)) => {
                raw_first.ok(d);
                warn_on("remove a baseline container", docker(&["rm", "-f", "-v", &container]).await);
            }
            Err(e) => raw_first.record(Err(e), ERROR_PAUSE).await,
        }
        match env.api_create(cleanup, &format!("api-{i}")).await {
            Ok((id, a, d)) => {
                api.ok(d);
                accepted.ok(a);
                match env.api_first_command(&id).await {
                    Ok(c) => api_first.ok(d + c),
                    Err(e) => api_first.record(Err(e), ERROR_PAUSE).await,
                }
                warn_on("delete a Computer", delete(env.api, &id, &format!("api-{i}-delete")).await);
            }
            Err(e) => api.record(Err(e), ERROR_PAUSE).await,
        }
        eprintln!("  round {}/{samples} done", i + 1);
    }
    CreateResults {
        pair: Pair {
            part: "1",
            api: api.summary("API  POST /v1/computers -> running (agent linked)"),
            raw: raw.summary("raw  docker run -d same container -> agent linked"),
        },
        first: Pair {
            part: "1c",
            api: api_first.summary("API  POST /v1/computers -> `true` exited"),
            raw: raw_first.summary("raw  docker run -d + exec bash -lc true"),
        },
        api_accepted: accepted.summary("API  POST /v1/computers -> 202"),
        raw_started: started.summary("raw  docker run -d -> returned"),
    }
}
