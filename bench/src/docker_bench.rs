//! `docker-bench`: what computerd's Docker provider costs, each figure against a baseline done
//! with Docker directly, measured in the same run on the same machine.
//!
//! One real `computerd` node (started by [`computerd_tests::TestCluster`]) with a `docker`
//! provider whose sandboxes share the host network and run the release `computer-agent` mounted
//! over the image's (`computerd-sandbox:latest`, built by `deploy/build-sandbox-image.sh` when
//! missing). Parts 1 to 3 alternate one baseline operation and one computerd operation, `N`
//! samples each (`BENCH_SAMPLES`, default 20; 5 with `BENCH_QUICK=1`), after one warm-up round
//! that is not counted; every "until the state is X" is a `GET /v1/computers/:id` every 5 ms:
//!
//! 1. **create → running**: `POST /v1/computers` of the docker provider until the Computer is
//!    `running` (its container started and the agent in it linked), against `docker run -d` of
//!    the same image with the same agent, command, environment, limits, init and network, whose
//!    agent pairs with a paired Computer created beforehand (untimed), until that Computer is
//!    `running`: the same container, made by the Docker CLI instead of computerd, until the same
//!    agent answers. Goal: p50 ratio at most 1.2.
//! 2. **a command in the sandbox**: `POST /v1/computers/:id/sessions {"command":"true"}` until it
//!    answers the exit, against `docker exec CONTAINER bash -lc true` (the CLI's wall time) in the
//!    same container. Goal: faster than `docker exec` (p50 ratio below 1). Each round also times
//!    `docker inspect` of the container, the floor of any Docker CLI call (shown, not a ratio).
//! 3. **pause + resume**: `POST …/pause` until `paused`, then `POST …/resume` until `running`,
//!    against `docker pause` + `docker unpause` of the baseline container of part 1 (same image,
//!    same agent, linked too). Between the two halves (untimed) both check with `docker inspect`
//!    that the container really is frozen.
//! 4. **scheduler cost per tick**, in this process: a store `State` with 100 000 running provider
//!    Computers in the idle-pause plan; the scheduler's per-tick read `State::plan_due(now, 256)`
//!    with 0, 256 and all 100 000 due, against a naive full scan of `state.plan` (deadline ≤ now,
//!    no active execution, earliest 256 first) giving the same answer.
//!
//! Every container the bench made (the Computers' `computerd.computer=<id>` and the baselines'
//! `computerd.bench=<run>`) is removed at the end, on error and on Ctrl-C.
//!
//! ```text
//! cargo build --release -p computerd-node --bin computerd && cargo build --release -p computer-agent &&
//!   cargo build --release -p computerd-bench &&
//!   COMPUTERD_BIN=target/release/computerd target/release/docker-bench
//! ```
//!
//! Environment: `BENCH_SAMPLES`, `BENCH_QUICK`, `BENCH_JSON`, `COMPUTERD_BIN` and `AGENT_BIN` (see
//! [`settings`]), and `BENCH_PLANNED` (part 4's plan size, default 100 000).

use std::collections::HashSet;
use std::hint::black_box;
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::api::Api;
use computerd_bench::report;
use computerd_bench::report::Pair;
use computerd_bench::report::Recorder;
use computerd_bench::report::Summary;
use computerd_bench::report::SummaryTable;
use computerd_bench::report::excerpt;
use computerd_bench::report::loadavg;
use computerd_bench::report::nearest_rank;
use computerd_bench::report::panics;
use computerd_bench::report::write_json;
use computerd_bench::settings;
use computerd_raft::sm::Computer;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::PlanEntry;
use computerd_raft::sm::Source;
use computerd_raft::sm::State;
use computerd_tests::TestCluster;
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::Value;
use serde_json::json;

/// The sandbox image.
const IMAGE: &str = computerd_tests::docker::IMAGE;
/// Where the image keeps the agent (the provider mounts `agentBinary` over it).
const AGENT_PATH: &str = "/usr/local/bin/computer-agent";
/// The agent's state dir in a sandbox, as the provider sets it.
const AGENT_STATE: &str = "/var/lib/computer-agent";
/// The label the provider puts on a Computer's container.
const LABEL_COMPUTER: &str = "computerd.computer";
/// The label of the baseline containers (its value names the run).
const LABEL_BENCH: &str = "computerd.bench";
/// The template's limits, given to the provider and to `docker run` alike.
const CPUS: f64 = 1.0;
const MEMORY_MB: u64 = 512;
const PIDS: u64 = 256;

/// Pause between two polls of a Computer's state.
const POLL_EVERY: Duration = Duration::from_millis(5);
/// Longest wait for a state, an execution or a delete.
const SETTLE_BOUND: Duration = Duration::from_secs(60);
/// Pause after a failed operation, so a broken part does not spin.
const ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Part 4: Computers in the plan.
const PLANNED: usize = 100_000;
/// Part 4: how many pauses one scheduler tick asks for (`PAUSES_PER_TICK` in `actors/src/idle.rs`).
const PAUSES_PER_TICK: usize = 256;
/// Part 4: one sample repeats the call for at least this long and counts the mean.
const TICK_SAMPLE: Duration = Duration::from_millis(20);
/// Part 4: the planned Computers' `pauseAfter`, seconds.
const PAUSE_AFTER_SECS: u64 = 300;
/// Part 4: deadlines are this far apart (ms), in an order unrelated to the ids.
const DEADLINE_STEP_MS: u64 = 7;

/// Goal of part 1: create → running ÷ docker run → agent linked, at p50.
const GOAL_CREATE_RATIO: f64 = 1.2;
/// Goal of part 2: session ÷ docker exec, at p50 (strictly below: faster).
const GOAL_EXEC_RATIO: f64 = 1.0;

struct Config {
    samples: usize,
    quick: bool,
    planned: usize,
    computerd_bin: PathBuf,
    agent_bin: PathBuf,
    json_out: Option<PathBuf>,
}

impl Config {
    fn from_env() -> Result<Self> {
        let quick = settings::quick();
        let samples = settings::env_count("BENCH_SAMPLES")?.unwrap_or(if quick { 5 } else { 20 });
        if samples == 0 {
            bail!("BENCH_SAMPLES must be at least 1");
        }
        let planned = settings::env_count("BENCH_PLANNED")?.unwrap_or(PLANNED);
        if planned < PAUSES_PER_TICK {
            bail!("BENCH_PLANNED must be at least {PAUSES_PER_TICK}");
        }
        Ok(Config {
            samples,
            quick,
            planned,
            computerd_bin: settings::computerd_bin()?,
            agent_bin: settings::agent_bin()?.canonicalize().context("the agent binary's absolute path")?,
            json_out: settings::json_out(),
        })
    }
}

fn main() -> Result<()> {
    let cfg = Config::from_env()?;
    // SAFETY: single-threaded here: the runtime's threads start with it.
    let rt = unsafe { settings::runtime_for(&cfg.computerd_bin) }?;
    let r = rt.block_on(async {
        // On Ctrl-C the bench's future is dropped, and with it the clean-up guard and the node.
        tokio::select! {
            r = bench(cfg) => r,
            _ = interrupted() => bail!("interrupted (the bench's containers were removed)"),
        }
    });
    // Part 4 may still run on a blocking thread after a Ctrl-C: do not wait for it.
    rt.shutdown_background();
    r
}

/// Resolves on Ctrl-C (never, if the handler cannot be installed).
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

// ---------------------------------------------------------------------------------------------
// Samples.

/// The table of parts 1 to 3.
const TABLE: SummaryTable = SummaryTable { op_width: 52, n_width: 4, decimals: 2 };

/// Nearest-rank percentiles of part 4's per-call times, µs.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MicroSummary {
    n: usize,
    /// Calls per sample.
    iters: u64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
}

impl MicroSummary {
    fn of(mut ns: Vec<f64>, iters: u64) -> Self {
        ns.sort_by(f64::total_cmp);
        let at = |p: f64| nearest_rank(&ns, p).map_or(f64::NAN, |ns| ns / 1000.0);
        MicroSummary { n: ns.len(), iters, p50_us: at(0.50), p99_us: at(0.99), max_us: at(1.0) }
    }
}

/// Part 4 for one number of due Computers.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TickCase {
    planned: usize,
    due: usize,
    /// Computers one tick answers (at most [`PAUSES_PER_TICK`]).
    answered: usize,
    plan_due: MicroSummary,
    full_scan: MicroSummary,
}

impl TickCase {
    fn p50_ratio(&self) -> f64 {
        self.plan_due.p50_us / self.full_scan.p50_us
    }
    fn p99_ratio(&self) -> f64 {
        self.plan_due.p99_us / self.full_scan.p99_us
    }
}

// ---------------------------------------------------------------------------------------------
// The API.

/// Registers the docker provider; answers its id.
async fn docker_provider(api: &Api, agent: &Path) -> Result<String> {
    let config = json!({
        "serverUrl": api.base,
        "network": "host",
        "agentBinary": agent.to_string_lossy(),
        "templates": {"default": {"image": IMAGE, "cpus": CPUS, "memoryMb": MEMORY_MB, "pids": PIDS}},
    });
    let body = json!({"kind": "docker", "name": "docker", "config": config});
    let v = api.post("/v1/computer-providers", body, StatusCode::CREATED).await.context("register the provider")?;
    v["id"].as_str().map(String::from).with_context(|| format!("no provider id in {}", excerpt(&v)))
}

/// `POST /v1/computers` of the docker provider; answers the Computer's id.
async fn create(api: &Api, provider: &str, key: &str) -> Result<String> {
    let body = json!({
        "commandKey": key, "name": key,
        "source": {"_tag": "Provider", "provider": provider, "template": null},
        "pauseAfter": null,
    });
    let v = api.post("/v1/computers", body, StatusCode::ACCEPTED).await.context("create")?;
    v["resource"]["id"].as_str().map(String::from).with_context(|| format!("no resource id in {}", excerpt(&v)))
}

/// The Computer's state; `None` once it is gone (404).
async fn state(api: &Api, id: &str) -> Result<Option<String>> {
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
async fn wait_state(api: &Api, id: &str, want: &str) -> Result<()> {
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
async fn lifecycle(api: &Api, id: &str, what: &str, key: &str) -> Result<()> {
    api.post(&format!("/v1/computers/{id}/{what}"), json!({"commandKey": key}), StatusCode::ACCEPTED)
        .await
        .with_context(|| format!("{what} computer {id}"))?;
    Ok(())
}

/// Deletes the Computer and waits until it is gone. A create whose agent linked before its
/// execution finished still holds the Computer for a moment (409): asked again then.
async fn delete(api: &Api, id: &str, key: &str) -> Result<()> {
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

// ---------------------------------------------------------------------------------------------
// Docker.

/// Runs the Docker CLI; answers its trimmed stdout, or an error with its stderr.
async fn docker<S: AsRef<str>>(args: &[S]) -> Result<String> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let out = tokio::process::Command::new("docker")
        .args(&args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("run the docker CLI")?;
    if !out.status.success() {
        bail!(
            "docker {}: {}: {}",
            args.first().copied().unwrap_or_default(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The same call, blocking (for the clean-up in `Drop`).
fn docker_blocking(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new("docker")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .context("run the docker CLI")?;
    if !out.status.success() {
        bail!("docker {}: {}: {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Makes sure the sandbox image exists: builds it with `deploy/build-sandbox-image.sh` and this
/// agent when missing (under the lock the tests use). Answers the image id.
async fn ensure_image(agent: &Path) -> Result<String> {
    if let Ok(id) = docker(&["image", "inspect", "-f", "{{.Id}}", IMAGE]).await {
        return Ok(id);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("workspace root")?;
    let script = root.join("deploy/build-sandbox-image.sh");
    eprintln!("building {IMAGE} with {}", script.display());
    let out = tokio::process::Command::new("flock")
        .arg("/tmp/computerd-sandbox-image.lock")
        .arg(&script)
        .arg("--agent")
        .arg(agent)
        .args(["--tag", IMAGE])
        .output()
        .await
        .with_context(|| format!("run {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "building {IMAGE} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    docker(&["image", "inspect", "-f", "{{.Id}}", IMAGE]).await.context("the image after its build")
}

/// The container of a Computer (by the provider's label).
async fn container_of(computer: &str) -> Result<String> {
    let out = docker(&["ps", "-aq", "--no-trunc", "--filter", &format!("label={LABEL_COMPUTER}={computer}")]).await?;
    let ids: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    match ids.as_slice() {
        [one] => Ok(one.to_string()),
        _ => bail!("computer {computer} has {} containers, not one", ids.len()),
    }
}

/// Whether the container is frozen, per `docker inspect`.
async fn is_paused(container: &str) -> Result<bool> {
    Ok(docker(&["inspect", "-f", "{{.State.Paused}}", container]).await? == "true")
}

/// Removes, when dropped (also on error or Ctrl-C), every container of the Computers it was
/// told about and every baseline container of this run.
struct Cleanup {
    /// The value of [`LABEL_BENCH`] on this run's baseline containers.
    run: String,
    computers: Vec<String>,
    done: bool,
}

impl Cleanup {
    fn new() -> Self {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Cleanup { run: format!("{}-{}", std::process::id(), now.as_millis()), computers: Vec::new(), done: false }
    }

    fn track(&mut self, computer: &str) {
        self.computers.push(computer.to_string());
    }

    /// Removes the containers; answers how many were removed and any errors.
    fn remove_all(&mut self) -> (usize, Vec<String>) {
        self.done = true;
        let mut errors = Vec::new();
        let mut ids = Vec::new();
        match docker_blocking(&["ps", "-aq", "--no-trunc", "--filter", &format!("label={LABEL_BENCH}={}", self.run)]) {
            Ok(out) => ids.extend(out.lines().filter(|l| !l.is_empty()).map(String::from)),
            Err(e) => errors.push(format!("{e:#}")),
        }
        let mine: HashSet<&str> = self.computers.iter().map(String::as_str).collect();
        let format = format!("{{{{.ID}}}} {{{{.Label \"{LABEL_COMPUTER}\"}}}}");
        match docker_blocking(&[
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            &format!("label={LABEL_COMPUTER}"),
            "--format",
            &format,
        ]) {
            Ok(out) => ids.extend(out.lines().filter_map(|l| {
                let (id, computer) = l.split_once(' ')?;
                mine.contains(computer).then(|| id.to_string())
            })),
            Err(e) => errors.push(format!("{e:#}")),
        }
        let mut removed = 0;
        for id in &ids {
            match docker_blocking(&["rm", "-f", "-v", id]) {
                Ok(_) => removed += 1,
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        (removed, errors)
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (removed, errors) = self.remove_all();
        eprintln!("clean-up: removed {removed} containers");
        for e in errors {
            eprintln!("clean-up: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Part 1: create → running.

/// A baseline sandbox: a container of the same image running the same agent, paired with a
/// paired Computer.
struct Baseline {
    container: String,
    computer: String,
}

/// What the bench needs to make sandboxes.
struct Env<'a> {
    api: &'a Api,
    provider: String,
    agent: &'a Path,
    run: String,
}

impl Env<'_> {
    /// computerd: `POST /v1/computers` until `running`. Answers the Computer (tracked for clean-up
    /// as soon as it is known) and the times to the 202 and to `running`.
    async fn api_create(&self, cleanup: &mut Cleanup, key: &str) -> Result<(String, Duration, Duration)> {
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
    async fn raw_create(&self, key: &str) -> Result<(Baseline, Duration, Duration)> {
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
}

/// Logs a failed untimed step (removing a sample's sandbox) and goes on.
fn warn_on<T>(what: &str, r: Result<T>) {
    if let Err(e) = r {
        eprintln!("warning: {what}: {e:#}");
    }
}

/// Part 1 results, with the times to the first answer.
struct CreateResults {
    pair: Pair,
    api_accepted: Summary,
    raw_started: Summary,
}

/// Part 1: `samples` rounds of one baseline and one computerd create, each removed (untimed)
/// before the next.
async fn part_create(env: &Env<'_>, cleanup: &mut Cleanup, samples: usize) -> CreateResults {
    let (mut api, mut raw, mut accepted, mut started) =
        (Recorder::default(), Recorder::default(), Recorder::default(), Recorder::default());
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
        match env.api_create(cleanup, &format!("api-{i}")).await {
            Ok((id, a, d)) => {
                api.ok(d);
                accepted.ok(a);
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
        api_accepted: accepted.summary("API  POST /v1/computers -> 202"),
        raw_started: started.summary("raw  docker run -d -> returned"),
    }
}

// ---------------------------------------------------------------------------------------------
// Parts 2 and 3.

/// Part 2 results, with the Docker CLI's floor.
struct ExecResults {
    pair: Pair,
    cli_floor: Summary,
}

/// Part 2: a session `true` against `docker exec` of `bash -lc true` in the same container, after
/// one warm-up round (not counted). Each round also times `docker inspect` of the container: one
/// trivial engine request, the floor of every Docker CLI call in the baselines.
async fn part_exec(api: &Api, computer: &str, container: &str, samples: usize) -> ExecResults {
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

/// Part 3 results: the pair (pause + resume) and each half.
struct PauseResults {
    total: Pair,
    pause: Pair,
    resume: Pair,
}

/// Part 3: pause + resume through the API against `docker pause` + `docker unpause`.
async fn part_pause(
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
async fn split(r: Result<(Duration, Duration)>, total: &mut Recorder, pause: &mut Recorder, resume: &mut Recorder) {
    match r {
        Ok((p, u)) => {
            total.ok(p + u);
            pause.ok(p);
            resume.ok(u);
        }
        Err(e) => total.record(Err(e), ERROR_PAUSE).await,
    }
}

// ---------------------------------------------------------------------------------------------
// Part 4: the scheduler's per-tick read.

/// A store with `n` running provider Computers in the idle-pause plan, as `set_computer_state`
/// leaves them: deadlines [`DEADLINE_STEP_MS`] apart from `base`, in an order unrelated to the
/// ids (a permutation), so the earliest deadlines are scattered over the id order. The `i`-th
/// earliest deadline is `base + i × DEADLINE_STEP_MS`.
fn planned_state(n: usize, base: u64) -> State {
    // A multiplier coprime with n makes `i -> i × m mod n` a permutation.
    let mut m = 7919 % n.max(2);
    while gcd(m, n) != 1 {
        m += 1;
    }
    let mut s = State::default();
    for i in 0..n {
        let id = format!("cmp_{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let rank = (i * m) % n;
        let deadline = base + rank as u64 * DEADLINE_STEP_MS;
        let c = Computer {
            id: id.clone(),
            name: format!("c{i}"),
            owner: "mem_bench".into(),
            shared: false,
            source: Source::Provider { provider: "cpp_bench".into(), template: None },
            desktop: false,
            pause_after: Some(PAUSE_AFTER_SECS),
            state: ComputerState::Running,
            sandbox: Some(format!("computerd-{id}")),
            active_execution: None,
            created_at: 1,
            agent_credential: None,
            link_generation: 1,
            link_node: Some(1),
        };
        let last_work = deadline - PAUSE_AFTER_SECS * 1000;
        s.computers.insert(id.clone(), c);
        s.plan_due.insert((deadline, id.clone()));
        s.plan.insert(id, PlanEntry { last_work, deadline, version: 1 });
    }
    s
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The baseline: what the scheduler would do without the deadline index: scan the whole plan
/// for deadlines at or before `now` (of Computers with no open execution) and answer the
/// `limit` earliest, in the same order as `plan_due`.
fn full_scan(s: &State, now: u64, limit: usize) -> Vec<(String, u64)> {
    let mut due: Vec<(u64, &String, u64)> = s
        .plan
        .iter()
        .filter(|(_, e)| e.deadline <= now)
        .filter(|(id, _)| s.computers.get(*id).is_some_and(|c| c.active_execution.is_none()))
        .map(|(id, e)| (e.deadline, id, e.version))
        .collect();
    if due.len() > limit {
        due.select_nth_unstable(limit);
        due.truncate(limit);
    }
    due.sort_unstable();
    due.into_iter().map(|(_, id, v)| (id.clone(), v)).collect()
}

/// Calls per sample so that one sample lasts about [`TICK_SAMPLE`].
fn calibrate(mut f: impl FnMut() -> usize) -> u64 {
    let mut iters = 1u64;
    loop {
        let t0 = Instant::now();
        for _ in 0..iters {
            black_box(f());
        }
        let took = t0.elapsed();
        if took >= TICK_SAMPLE / 4 || iters >= 1 << 30 {
            let per = took.as_secs_f64() / iters as f64;
            return ((TICK_SAMPLE.as_secs_f64() / per.max(1e-9)) as u64).max(1);
        }
        iters *= 2;
    }
}

/// One sample: the mean time of one call over `iters` calls, ns.
fn sample_ns(iters: u64, mut f: impl FnMut() -> usize) -> f64 {
    let t0 = Instant::now();
    for _ in 0..iters {
        black_box(f());
    }
    t0.elapsed().as_nanos() as f64 / iters as f64
}

/// Part 4: `plan_due` against the full scan with 0, [`PAUSES_PER_TICK`] and every Computer due.
fn part_scheduler(planned: usize, samples: usize) -> Result<Vec<TickCase>> {
    let base: u64 = 1_800_000_000_000;
    let t0 = Instant::now();
    let s = planned_state(planned, base);
    eprintln!("  {} planned Computers built in {:.2} s", s.plan.len(), t0.elapsed().as_secs_f64());
    let mut cases = Vec::new();
    for due in [0, PAUSES_PER_TICK, planned] {
        // The `due`-th earliest deadline is base + (due - 1) × step.
        let now = if due == 0 { base - 1 } else { base + (due as u64 - 1) * DEADLINE_STEP_MS };
        let fast = s.plan_due(now, PAUSES_PER_TICK);
        let slow = full_scan(&s, now, PAUSES_PER_TICK);
        if fast != slow {
            bail!("with {due} due, plan_due and the full scan disagree ({} vs {} answered)", fast.len(), slow.len());
        }
        if fast.len() != due.min(PAUSES_PER_TICK) {
            bail!("with {due} due, plan_due answered {}", fast.len());
        }
        let fast_iters = calibrate(|| s.plan_due(black_box(now), PAUSES_PER_TICK).len());
        let slow_iters = calibrate(|| full_scan(&s, black_box(now), PAUSES_PER_TICK).len());
        let (mut fast_ns, mut slow_ns) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
        for _ in 0..samples {
            slow_ns.push(sample_ns(slow_iters, || full_scan(&s, black_box(now), PAUSES_PER_TICK).len()));
            fast_ns.push(sample_ns(fast_iters, || s.plan_due(black_box(now), PAUSES_PER_TICK).len()));
        }
        cases.push(TickCase {
            planned,
            due,
            answered: fast.len(),
            plan_due: MicroSummary::of(fast_ns, fast_iters),
            full_scan: MicroSummary::of(slow_ns, slow_iters),
        });
    }
    Ok(cases)
}

// ---------------------------------------------------------------------------------------------
// The run.

/// Part 4's samples: cheap, so at least 20 (a p99 of 5 samples is their max).
fn tick_samples(samples: usize) -> usize {
    samples.max(20)
}

/// The sandboxes parts 2 and 3 use, made by part 1's warm-up round.
struct Sandboxes {
    /// The computerd Computer and its container.
    computer: String,
    container: String,
    /// The baseline container.
    raw: Baseline,
}

/// Part 1's warm-up round (not counted): one baseline and one computerd sandbox, kept for parts
/// 2 and 3.
async fn warm_up(env: &Env<'_>, cleanup: &mut Cleanup) -> Result<Sandboxes> {
    let (raw, _, _) = env.raw_create("raw-warm-up").await.context("the baseline's warm-up sandbox")?;
    let (computer, _, _) = env.api_create(cleanup, "api-warm-up").await.context("the warm-up Computer")?;
    let container = container_of(&computer).await?;
    Ok(Sandboxes { computer, container, raw })
}

async fn bench(cfg: Config) -> Result<()> {
    let mut cleanup = Cleanup::new();
    let cores = report::cores();
    let load_start = loadavg();
    let engine = docker(&["version", "-f", "{{.Server.Version}}"]).await.context("the Docker engine")?;
    let image = ensure_image(&cfg.agent_bin).await?;
    let header = format!(
        "docker-bench: computerd's docker provider against Docker directly, in the same run\n1 node; {} samples \
         per part after 1 warm-up round{}; state polled every {} ms; part 4: {} planned Computers, {} samples\n\
         computerd: {}\ncomputer-agent: {} (mounted into the sandboxes)\nimage: {IMAGE} ({})\nDocker engine {engine}; \
         cores: {cores}; load average at start: {load_start}",
        cfg.samples,
        if cfg.quick { " (quick mode)" } else { "" },
        POLL_EVERY.as_millis(),
        cfg.planned,
        tick_samples(cfg.samples),
        cfg.computerd_bin.display(),
        cfg.agent_bin.display(),
        image.chars().take(19).collect::<String>(),
    );
    eprintln!("{header}");

    eprintln!("starting computerd (1 node)");
    let c = TestCluster::start(1).await;
    let api = Api { http: settings::http_client()?, base: c.url(1, ""), token: c.token.clone() };
    let provider = docker_provider(&api, &cfg.agent_bin).await?;
    let env = Env { api: &api, provider, agent: &cfg.agent_bin, run: cleanup.run.clone() };

    eprintln!("part 1 warm-up: one sandbox each (kept for parts 2 and 3)");
    let boxes = warm_up(&env, &mut cleanup).await?;
    eprintln!("part 1: create -> running vs docker run -> agent linked ({} rounds)", cfg.samples);
    let p1 = part_create(&env, &mut cleanup, cfg.samples).await;
    eprintln!("part 2: session `true` vs docker exec bash -lc true");
    let p2 = part_exec(&api, &boxes.computer, &boxes.container, cfg.samples).await;
    eprintln!("part 3: pause + resume vs docker pause + unpause");
    // One warm-up round, then the measured ones.
    let _ = part_pause(&api, &boxes.computer, &boxes.container, &boxes.raw.container, 1, 0).await;
    let p3 = part_pause(&api, &boxes.computer, &boxes.container, &boxes.raw.container, cfg.samples, 1).await;
    let node_panics = panics(&c);
    drop(c);
    let (removed, cleanup_errors) = cleanup.remove_all();
    eprintln!("removed {removed} containers");

    eprintln!("part 4: scheduler tick with {} planned Computers", cfg.planned);
    let (planned, samples) = (cfg.planned, tick_samples(cfg.samples));
    let p4 = match tokio::task::spawn_blocking(move || part_scheduler(planned, samples)).await {
        Ok(r) => r,
        Err(e) => Err(anyhow::anyhow!("part 4 did not finish: {e}")),
    };
    let load_end = loadavg();

    let pairs = [&p1.pair, &p2.pair, &p3.total, &p3.pause, &p3.resume];
    // The table: each pair, with the informational rows after the pair they explain.
    let mut rows: Vec<(&str, &Summary)> = Vec::new();
    for p in pairs {
        rows.push((p.part, &p.api));
        rows.push((p.part, &p.raw));
        match p.part {
            "1" => rows.extend([("1", &p1.api_accepted), ("1", &p1.raw_started)]),
            "2" => rows.push(("2", &p2.cli_floor)),
            _ => {}
        }
    }

    println!("{header}; at end: {load_end}\n");
    println!("{}", TABLE.header());
    for (part, s) in &rows {
        println!("{}", TABLE.row(part, s));
    }
    for (part, s) in &rows {
        s.print_errors(part);
    }
    for p in &node_panics {
        println!("node log: {p}");
    }
    if cleanup_errors.is_empty() {
        println!("clean-up: removed {removed} containers (every sandbox of this run)");
    } else {
        println!("clean-up: removed {removed} containers; errors:");
        for e in &cleanup_errors {
            println!("    {e}");
        }
    }

    println!();
    match &p4 {
        Ok(cases) => {
            println!(
                "{:<4} {:<30} {:>8} {:>8} {:>10} {:>10} {:>12} {:>12}",
                "part", "scheduler tick", "due", "answered", "p50 µs", "p99 µs", "scan p50 µs", "scan p99 µs"
            );
            for t in cases {
                println!(
                    "{:<4} {:<30} {:>8} {:>8} {:>10.3} {:>10.3} {:>12.1} {:>12.1}",
                    "4",
                    format!("plan_due(now, {PAUSES_PER_TICK}), {} planned", t.planned),
                    t.due,
                    t.answered,
                    t.plan_due.p50_us,
                    t.plan_due.p99_us,
                    t.full_scan.p50_us,
                    t.full_scan.p99_us
                );
            }
        }
        Err(e) => println!("part 4 failed: {e:#}"),
    }

    println!("\nratios, computerd ÷ Docker directly (1 = as fast as the Docker CLI)");
    let verdict = |ok: bool| if ok { "goal met" } else { "goal MISSED" };
    for p in pairs {
        let label = match p.part {
            "1" => "create -> running",
            "2" => "command in the sandbox",
            "3" => "pause + resume",
            "3p" => "  pause",
            _ => "  resume",
        };
        let mut line = format!(
            "  {:<3} {:<24} p50 {:>6.2}x ({:+8.1} ms)  p99 {:>6.2}x",
            p.part,
            label,
            p.p50_ratio(),
            p.p50_diff_ms(),
            p.p99_ratio()
        );
        match p.part {
            "1" => line.push_str(&format!(
                "  goal p50 <= {GOAL_CREATE_RATIO}: {}",
                verdict(p.p50_ratio() <= GOAL_CREATE_RATIO)
            )),
            "2" => line.push_str(&format!(
                "  goal p50 < {GOAL_EXEC_RATIO} (faster than docker exec): {}",
                verdict(p.p50_ratio() < GOAL_EXEC_RATIO)
            )),
            _ => {}
        }
        println!("{line}");
    }
    if let Ok(cases) = &p4 {
        for t in cases {
            println!(
                "  4   tick, {:>6} of {} due  p50 {:>8.5}x ({:.3} µs vs {:.1} µs)  p99 {:>8.5}x",
                t.due,
                t.planned,
                t.p50_ratio(),
                t.plan_due.p50_us,
                t.full_scan.p50_us,
                t.p99_ratio()
            );
        }
    }

    if let Some(path) = &cfg.json_out {
        let doc = json!({
            "config": {
                "samples": cfg.samples,
                "quick": cfg.quick,
                "planned": cfg.planned,
                "pollMs": POLL_EVERY.as_millis() as u64,
                "computerdBin": cfg.computerd_bin.display().to_string(),
                "agentBin": cfg.agent_bin.display().to_string(),
                "image": image,
                "dockerEngine": engine,
                "cores": cores,
                "loadStart": load_start,
                "loadEnd": load_end,
            },
            "pairs": pairs,
            "createAccepted": {"api": p1.api_accepted, "raw": p1.raw_started},
            "dockerCliFloor": p2.cli_floor,
            "scheduler": p4.as_ref().ok(),
            "nodePanics": node_panics,
            "cleanup": {"removed": removed, "errors": cleanup_errors},
        });
        write_json(path, &doc)?;
    }
    Ok(())
}
