//! Part 3: pause + resume through the API against `docker pause` + `docker unpause`.

use std::time::Duration;
use std::time::Instant;

use anyhow::Result;
use anyhow::bail;
use computerd_bench::api::Api;
use computerd_bench::report::Pair;
use computerd_bench::report::Recorder;

use crate::ERROR_PAUSE;
use crate::computers::lifecycle;
use crate::computers::wait_state;
use crate::docker::docker;
use crate::docker::is_paused;

/// Part 3 results: the pair (pause + resume) and each half.
pub struct PauseResults {
    pub total: Pair,
    pub pause: Pair,
    pub resume: Pair,
}

/// Part 3: pause + resume through the API against `docker pause` + `docker unpause`.
pub async fn part_pause(
    api: &Api,
    computer: &str,
    container: &str,
    raw_container: &str,
    samples: usize,
    start: usize,
) -> PauseResults {
    let mut recs: [Recorder; 6] = Default::default();
    let [api_total, api_pause, api_resume, raw_total, raw_pause, raw_resume] = &mut recs;
    for i in start..start + samples {
        let raw_op = async {
            let t0 = Instant::now();
            docker(&["pause", raw_container]).await?;
            let paused = t0.elapsed();
            if !is_paused(raw_container).await? {
                bail!("docker pause answered but the container is not paused");
            }
            let t1 = Instant::now();
            docker(&["unpause", raw_container]).await?;
            Ok((paused, t1.elapsed()))
        };
        split(raw_op.await, raw_total, raw_pause, raw_resume).await;
        let api_op = async {
            let t0 = Instant::now();
            lifecycle(api, computer, "pause", &format!("pause-{i}")).await?;
            wait_state(api, computer, "paused").await?;
            let paused = t0.elapsed();
            if !is_paused(container).await? {
                bail!("the Computer is paused but its container is not");
            }
            let t1 = Instant::now();
            lifecycle(api, computer, "resume", &format!("resume-{i}")).await?;
            wait_state(api, computer, "running").await?;
            Ok((paused, t1.elapsed()))
        };
        split(api_op.await, api_total, api_pause, api_resume).await;
    }
    let [api_total, api_pause, api_resume, raw_total, raw_pause, raw_resume] = &recs;
    PauseResults {
        total: Pair {
            part: "3",
            api: api_total.summary("API  pause -> paused, resume -> running"),
            raw: raw_total.summary("raw  docker pause + docker unpause"),
        },
        pause: Pair {
            part: "3p",
            api: api_pause.summary("API  POST pause -> paused"),
            raw: raw_pause.summary("raw  docker pause"),
        },
        resume: Pair {
            part: "3r",
            api: api_resume.summary("API  POST resume -> running"),
            raw: raw_resume.summary("raw  docker unpause"),
        },
    }
}

/// Records a (pause, resume) outcome in its three recorders.
pub async fn split(r: Result<(Duration, Duration)>, total: &mut Recorder, pause: &mut Recorder, resume: &mut Recorder) {
    match r {
        Ok((p, u)) => {
            total.ok(p + u);
            pause.ok(p);
            resume.ok(u);
        }
        Err(e) => total.record(Err(e), ERROR_PAUSE).await,
    }
}
