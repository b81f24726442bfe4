//! `docker-bench`: what computerd's Docker provider costs, each figure against a baseline done
//! with Docker directly, measured in the same run on the same machine.
//!
//! One real `computerd` node (started by [`computerd_tests::TestCluster`]) with a `docker`
//! provider whose sandboxes share the host network and run the release `computer-agent` mounted
//! over the image's (`computerd-sandbox:latest`, built by `deploy/build-sandbox-image.sh` when
//! missing or built by another version of the script). Parts 1 to 3 alternate one baseline operation and one computerd operation, `N`
//! samples each (`BENCH_SAMPLES`, default 20; 5 with `BENCH_QUICK=1`), after one warm-up round
//! that is not counted; every "until the state is X" is a `GET /v1/computers/:id` every 5 ms:
//!
//! 1. **create → running**: `POST /v1/computers` of the docker provider until the Computer is
//!    `running` (its container started and the agent in it linked), against `docker run -d` of
//!    the same image with the same agent, command, environment, limits, init and network, whose
//!    agent pairs with a paired Computer created beforehand (untimed), until that Computer is
//!    `running`: the same container, made by the Docker CLI instead of computerd, until the same
//!    agent answers. Goal: p50 ratio at most 1.2.
//!
//!    **1c, create → first command**, in the same rounds: the same create, then a session `true`
//!    until it exits, against `docker run -d` of the same image with the same limits (sleeping,
//!    no agent) + `docker exec CONTAINER bash -lc true`. Goal: p50 ratio at most 1.0.
//!
//!    **1p, create → first command from a warm pool** (after part 3): the same create and
//!    command on a second provider of the same template with a pool of one (each round waits,
//!    untimed, until the pool is ready again), against `docker unpause` + `docker exec bash -lc
//!    true` of a paused container of the same image and limits (made and paused untimed). Goal:
//!    p50 at most 50 ms.
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

mod computers;
mod docker;
mod part1_create;
mod part1p_pool;
mod part2_exec;
mod part3_pause;
mod part4_scheduler;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::api::Api;
use computerd_bench::report;
use computerd_bench::report::PairRatios;
use computerd_bench::report::Summary;
use computerd_bench::report::SummaryTable;
use computerd_bench::report::loadavg;
use computerd_bench::report::panics;
use computerd_bench::report::write_json;
use computerd_bench::settings;
use computerd_tests::TestCluster;
use serde_json::json;

use crate::computers::docker_provider;
use crate::docker::Cleanup;
use crate::docker::IMAGE;
use crate::docker::container_of;
use crate::docker::docker;
use crate::docker::ensure_image;
use crate::part1_create::Baseline;
use crate::part1_create::Env;
use crate::part1_create::part_create;
use crate::part1p_pool::part_pool;
use crate::part2_exec::part_exec;
use crate::part3_pause::part_pause;
use crate::part4_scheduler::PAUSES_PER_TICK;
use crate::part4_scheduler::PLANNED;
use crate::part4_scheduler::part_scheduler;

/// Pause between two polls of a Computer's state.
const POLL_EVERY: Duration = Duration::from_millis(5);
/// Longest wait for a state, an execution or a delete.
const SETTLE_BOUND: Duration = Duration::from_secs(60);
/// Pause after a failed operation, so a broken part does not spin.
const ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Goal of part 1: create → running ÷ docker run → agent linked, at p50.
const GOAL_CREATE_RATIO: f64 = 1.2;
/// Part 1c's goal: create → first command at most as slow as `docker run -d` + `docker exec`.
const GOAL_FIRST_COMMAND_RATIO: f64 = 1.0;
/// Part 1p's goal: create → first command from a warm pool within 50 ms at p50.
const GOAL_POOLED_MS: f64 = 50.0;
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

/// The table of parts 1 to 3, and their ratio lines.
const TABLE: SummaryTable = SummaryTable { op_width: 52, n_width: 4, decimals: 2 };
const RATIOS: PairRatios = PairRatios { label_width: 24, ratio_width: 6, diff_width: 8, diff_decimals: 1 };

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
    let provider = docker_provider(&api, &cfg.agent_bin, 0).await?;
    // A second provider of the same template, with a warm pool of one (part 1p).
    let pool_provider = docker_provider(&api, &cfg.agent_bin, 1).await?;
    cleanup.pools.push(pool_provider.clone());
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
    eprintln!("part 1p: create -> first command from a warm pool vs docker unpause + exec");
    let p1p = part_pool(&env, &pool_provider, &mut cleanup, cfg.samples).await;
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

    let pairs = [&p1.pair, &p1.first, &p1p, &p2.pair, &p3.total, &p3.pause, &p3.resume];
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
            "1c" => "create -> first command",
            "1p" => "create -> first command, pooled",
            "2" => "command in the sandbox",
            "3" => "pause + resume",
            "3p" => "  pause",
            _ => "  resume",
        };
        let mut line = RATIOS.line(p, label);
        match p.part {
            "1" => line.push_str(&format!(
                "  goal p50 <= {GOAL_CREATE_RATIO}: {}",
                verdict(p.p50_ratio() <= GOAL_CREATE_RATIO)
            )),
            "1c" => line.push_str(&format!(
                "  goal p50 <= {GOAL_FIRST_COMMAND_RATIO}: {}",
                verdict(p.p50_ratio() <= GOAL_FIRST_COMMAND_RATIO)
            )),
            "1p" => line
                .push_str(&format!("  goal p50 <= {GOAL_POOLED_MS} ms: {}", verdict(p.api.p50_ms <= GOAL_POOLED_MS))),
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
