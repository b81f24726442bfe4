//! `exec-bench`: how many lifecycle executions computerd accepts per second and how fast it
//! answers with their receipt, against the store's raw replicated write, on the same cluster in
//! the same run.
//!
//! On 3 real `computerd` nodes (started by [`computerd_tests::TestCluster::start_fake`], with the
//! fault-injecting fake provider enabled) and one fake provider that answers at once (no faults),
//! closed-loop writers (1 and 64; see [`workload`]) send round robin over the 3 nodes:
//!
//! - **raw write** (the baseline): `POST /v1/bots`, a plain replicated write that answers 201;
//! - **execution**: `POST /v1/computers` with a fresh `commandKey`. It answers 202 with the
//!   execution receipt once the execution is stored; the leader's driver then runs it in the
//!   background (claim, provider call, result: more replicated writes).
//!
//! All raw-write cells run first, on a store holding only the provider, then the execution
//! cells. After every execution cell the bench waits, bounded, until every Computer the cell
//! created has left `starting`, polling `GET /v1/computers` on a follower, and reports how long
//! after the measured window that took and how many did not end `running` (their create did not
//! succeed). It prints a table, these settle lines and the ratios execution ÷ raw write for
//! throughput and for p50/p99 latency.
//!
//! ```text
//! cargo build --release -p computerd-node --bin computerd -p computerd-bench &&
//!   COMPUTERD_BIN=target/release/computerd target/release/exec-bench
//! ```
//!
//! Environment: `BENCH_SECS`, `BENCH_WARMUP_SECS`, `BENCH_QUICK`, `BENCH_WRITERS`, `BENCH_JSON`
//! and `COMPUTERD_BIN` as in store-bench (see [`settings`]), and `BENCH_SETTLE_SECS`: the longest
//! wait, after a cell's measured window, for its executions to settle (default 60; 20 with
//! `BENCH_QUICK=1`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::report;
use computerd_bench::report::call_json;
use computerd_bench::report::write_json;
use computerd_bench::settings;
use computerd_bench::workload;
use computerd_bench::workload::Op;
use computerd_bench::workload::Stats;
use computerd_bench::workload::Target;
use computerd_bench::workload::Timing;
use computerd_tests::TestCluster;
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::Value;
use serde_json::json;

/// Cluster size.
const NODES: u64 = 3;
/// Shortest pause between two settle polls.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// A settle poll may list thousands of Computers; give it more than the writers' timeout.
const POLL_TIMEOUT: Duration = Duration::from_secs(30);
/// Not-succeeded Computers described in the report, per cell.
const FAILURE_SAMPLES: usize = 3;

const RAW: &str = "raw-write";
const EXEC: &str = "execution";

struct Config {
    timing: Timing,
    quick: bool,
    writers: Vec<usize>,
    settle_bound: Duration,
    computerd_bin: PathBuf,
    json_out: Option<PathBuf>,
}

/// One measured cell.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Cell {
    /// [`RAW`] or [`EXEC`].
    op: &'static str,
    writers: usize,
    #[serde(flatten)]
    stats: Stats,
    /// Execution cells only.
    settle: Option<Settle>,
    /// Nodes found stopped after a cell with errors, with how they exited and their last log lines.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stopped_nodes: Vec<String>,
}

/// How the executions created by one cell ended, seen after its measured window.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct Settle {
    /// Computers the cell created (warm-up, window, and requests that completed after it).
    created: u64,
    /// Seconds from the end of the measured window to the end of the first poll.
    first_poll_after_secs: f64,
    /// Still `starting` at the first poll: the driver's backlog when the writers stopped.
    pending_at_first_poll: u64,
    /// Seconds from the end of the measured window to the end of the first poll that found none
    /// `starting` (an upper bound); `None` if the wait hit its bound first.
    settled_after_secs: Option<f64>,
    /// Seconds from the end of the measured window to the end of the last poll that still found
    /// some `starting` (a lower bound of the settle time); `None` if none did.
    last_pending_after_secs: Option<f64>,
    /// `running`: the create execution succeeded.
    succeeded: u64,
    /// Still `starting` when the wait ended.
    pending: u64,
    /// `failed`.
    failed: u64,
    /// Any other state.
    other: u64,
    /// Successful polls.
    polls: u64,
    /// Failed polls.
    poll_errors: u64,
    /// A few poll errors and not-succeeded executions.
    samples: Vec<String>,
}

/// execution ÷ raw write for one writer count.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Ratio {
    writers: usize,
    /// Executions accepted per second ÷ raw writes per second.
    throughput: f64,
    /// Receipt p50 ÷ raw write p50.
    p50: f64,
    /// Receipt p99 ÷ raw write p99.
    p99: f64,
}

/// One row of `GET /v1/computers`.
struct ComputerRow {
    id: String,
    state: String,
    active_execution: Option<String>,
}

fn main() -> Result<()> {
    let cfg = Config::from_env()?;
    // SAFETY: single-threaded here: the runtime's threads start with it.
    let rt = unsafe { settings::runtime_for(&cfg.computerd_bin) }?;
    rt.block_on(bench(cfg))
}

impl Config {
    fn from_env() -> Result<Self> {
        let quick = settings::quick();
        let timing = settings::timing(quick)?;
        let writers = settings::env_list("BENCH_WRITERS")?.unwrap_or_else(|| vec![1, 64]);
        if writers.contains(&0) {
            bail!("BENCH_WRITERS must be positive");
        }
        let settle = settings::env_f64("BENCH_SETTLE_SECS")?.unwrap_or(if quick { 20.0 } else { 60.0 });
        if !(settle >= 0.0 && settle.is_finite()) {
            bail!("BENCH_SETTLE_SECS must be >= 0");
        }
        Ok(Config {
            timing,
            quick,
            writers,
            settle_bound: Duration::from_secs_f64(settle),
            computerd_bin: settings::computerd_bin()?,
            json_out: settings::json_out(),
        })
    }
}

async fn bench(cfg: Config) -> Result<()> {
    let cores = report::cores();
    let header = format!(
        "exec-bench: lifecycle executions (POST /v1/computers, fake provider, no faults) vs raw writes \
         (POST /v1/bots)\n{NODES} nodes, round robin, {:.1} s measured + {:.1} s warm-up per cell, settle wait \
         <= {:.0} s{}\ncomputerd: {}\ncores: {cores}",
        cfg.timing.measure.as_secs_f64(),
        cfg.timing.warmup.as_secs_f64(),
        cfg.settle_bound.as_secs_f64(),
        if cfg.quick { " (quick mode)" } else { "" },
        cfg.computerd_bin.display(),
    );
    eprintln!("{header}");

    let http = settings::http_client()?;
    eprintln!("starting computerd with {NODES} nodes (fake provider enabled)");
    let mut c = TestCluster::start_fake(NODES).await;
    // The writers create bots and Computers as fast as they are answered.
    c.raise_limits().await;
    let provider = create_provider(&http, &c.url(1, "/v1/computer-providers"), &c.token).await?;
    let leader = c.leader().await;
    let observer = c.nodes.keys().copied().find(|&id| id != leader).context("a follower")?;
    let list_url = c.url(observer, "/v1/computers");
    eprintln!("provider {provider}; leader node {leader}; settle polls on node {observer}");

    let urls = |path: &str| c.nodes.keys().map(|&id| c.url(id, path)).collect::<Vec<_>>();
    let raw = Arc::new(Target { urls: urls("/v1/bots"), op: Op::CreateBot { token: c.token.clone() } });
    let exec = Arc::new(Target {
        urls: urls("/v1/computers"),
        op: Op::CreateComputer { token: c.token.clone(), provider: provider.clone() },
    });

    let mut cells = Vec::new();
    let mut seq = 0usize;
    for &w in &cfg.writers {
        seq += 1;
        let stats = workload::run(&http, raw.clone(), w, cfg.timing, &format!("rw{w}c{seq}")).await;
        let stopped_nodes = if stats.errors > 0 { stopped_nodes(&mut c) } else { Vec::new() };
        let cell = Cell { op: RAW, writers: w, stats, settle: None, stopped_nodes };
        eprintln!("  {}", row(&cell));
        cells.push(cell);
    }
    for &w in &cfg.writers {
        seq += 1;
        let before = list_computers(&http, &list_url, &c.token).await;
        let started = Instant::now();
        let stats = workload::run(&http, exec.clone(), w, cfg.timing, &format!("xw{w}c{seq}")).await;
        let window_end = started + cfg.timing.warmup + cfg.timing.measure;
        let stopped_nodes = if stats.errors > 0 { stopped_nodes(&mut c) } else { Vec::new() };
        let cell = Cell { op: EXEC, writers: w, stats, settle: None, stopped_nodes };
        eprintln!("  {}", row(&cell));
        let s = match before {
            Ok(rows) => {
                let before: HashSet<String> = rows.into_iter().map(|r| r.id).collect();
                settle(&http, &list_url, &c.token, &before, window_end, cfg.settle_bound).await
            }
            Err(e) => Settle {
                samples: vec![format!("not measured: listing the Computers before the cell failed: {e:#}")],
                ..Settle::default()
            },
        };
        eprintln!("    {}", settle_line(&s));
        cells.push(Cell { settle: Some(s), ..cell });
    }
    drop(c);

    let ratios = ratios(&cells);
    println!("{header}\n");
    println!("{}", table_header());
    for c in &cells {
        println!("{}", row(c));
    }
    for c in cells.iter().filter(|c| !c.stats.error_samples.is_empty()) {
        c.stats.print_errors(&format!("{} {} writer(s)", c.op, c.writers));
        for s in &c.stopped_nodes {
            println!("    {s}");
        }
    }
    println!(
        "\nsettling after the measured window (created = Computers the cell created; polled GET /v1/computers on \
         node {observer}):"
    );
    for c in &cells {
        if let Some(s) = &c.settle {
            println!("  {:>2} writer(s): {}", c.writers, settle_line(s));
            for m in &s.samples {
                println!("      {m}");
            }
        }
    }
    println!("\nexecution / raw write (throughput: 1 = as many as plain writes; latency: 1 = as fast)");
    for r in &ratios {
        println!(
            "  {:>2} writer(s): throughput {:>5.2}x   p50 {:>5.2}x   p99 {:>5.2}x",
            r.writers, r.throughput, r.p50, r.p99
        );
    }

    if let Some(path) = &cfg.json_out {
        let doc = json!({
            "config": {
                "nodes": NODES,
                "measureSecs": cfg.timing.measure.as_secs_f64(),
                "warmupSecs": cfg.timing.warmup.as_secs_f64(),
                "settleBoundSecs": cfg.settle_bound.as_secs_f64(),
                "quick": cfg.quick,
                "writers": cfg.writers,
                "computerdBin": cfg.computerd_bin.display().to_string(),
                "cores": cores,
            },
            "cells": cells,
            "ratios": ratios,
        });
        write_json(path, &doc)?;
    }
    Ok(())
}

/// The nodes whose process no longer runs: how each exited and its last log lines.
fn stopped_nodes(c: &mut TestCluster) -> Vec<String> {
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    let mut out = Vec::new();
    for id in ids {
        let exited = c.nodes.get_mut(&id).and_then(|n| n.child.as_mut()).map(|child| child.try_wait());
        let what = match exited {
            Some(Ok(None)) => continue,
            Some(Ok(Some(status))) => format!("exited ({status})"),
            Some(Err(e)) => format!("cannot be checked: {e}"),
            None => "was not running".to_string(),
        };
        out.push(format!("node {id} {what}; its log ends:\n{}", c.log_tail(id, 5)));
    }
    out
}

/// Creates a fake provider with no faults (every call answers at once); answers its id.
async fn create_provider(http: &reqwest::Client, url: &str, token: &str) -> Result<String> {
    let body = json!({"kind": "fake", "name": "bench", "config": {}});
    let v = call_json(http.post(url).bearer_auth(token).json(&body), StatusCode::CREATED)
        .await
        .context("create the fake provider")?;
    Ok(v.get("id").and_then(Value::as_str).context("the provider has no id")?.to_string())
}

/// Every Computer the owner sees (a linearizable read on the node behind `url`).
async fn list_computers(http: &reqwest::Client, url: &str, token: &str) -> Result<Vec<ComputerRow>> {
    let v = call_json(http.get(url).bearer_auth(token).timeout(POLL_TIMEOUT), StatusCode::OK).await?;
    let rows = v.get("computers").and_then(Value::as_array).context("no computers array in the list")?;
    rows.iter()
        .map(|r| {
            let field = |k: &str| r.get(k).and_then(Value::as_str).map(String::from);
            Ok(ComputerRow {
                id: field("id").context("a Computer without id")?,
                state: field("state").context("a Computer without state")?,
                active_execution: field("activeExecution"),
            })
        })
        .collect()
}

/// Waits until none of the Computers created since `before` is `starting`, or until `bound`
/// after `window_end`; then counts their states and describes a few that did not succeed.
async fn settle(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    before: &HashSet<String>,
    window_end: Instant,
    bound: Duration,
) -> Settle {
    let deadline = window_end + bound;
    let mut s = Settle::default();
    let mut last: Vec<ComputerRow> = Vec::new();
    loop {
        let t0 = Instant::now();
        match list_computers(http, url, token).await {
            Ok(rows) => {
                let after = window_end.elapsed().as_secs_f64();
                last = rows.into_iter().filter(|r| !before.contains(&r.id)).collect();
                let pending = last.iter().filter(|r| r.state == "starting").count() as u64;
                s.polls += 1;
                if s.polls == 1 {
                    s.first_poll_after_secs = after;
                    s.pending_at_first_poll = pending;
                }
                if pending == 0 {
                    s.settled_after_secs = Some(after);
                    break;
                }
                s.last_pending_after_secs = Some(after);
            }
            Err(e) => {
                s.poll_errors += 1;
                if s.samples.len() < FAILURE_SAMPLES {
                    s.samples.push(format!("poll failed: {e:#}"));
                }
            }
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        // Listing thousands of Computers costs the observer CPU: keep polls to a fifth of the time.
        let pause = POLL_EVERY.max(t0.elapsed() * 4).min(deadline - now);
        tokio::time::sleep(pause).await;
    }
    s.created = last.len() as u64;
    for r in &last {
        match r.state.as_str() {
            "running" => s.succeeded += 1,
            "starting" => s.pending += 1,
            "failed" => s.failed += 1,
            _ => s.other += 1,
        }
    }
    for r in last.iter().filter(|r| r.state != "running").take(FAILURE_SAMPLES) {
        s.samples.push(describe(http, url, token, r).await);
    }
    s
}

/// One not-succeeded Computer, with its active execution's state and error when it has one.
async fn describe(http: &reqwest::Client, list_url: &str, token: &str, r: &ComputerRow) -> String {
    let Some(exe) = &r.active_execution else {
        return format!("computer {} is {} (no active execution)", r.id, r.state);
    };
    let url = list_url.replace("/v1/computers", &format!("/v1/executions/{exe}"));
    match call_json(http.get(&url).bearer_auth(token), StatusCode::OK).await {
        Ok(v) => format!(
            "computer {} is {}; execution {exe} is {}: {}",
            r.id,
            r.state,
            v.get("state").and_then(Value::as_str).unwrap_or("?"),
            v.get("error").map_or_else(|| "null".to_string(), Value::to_string),
        ),
        Err(e) => format!("computer {} is {}; execution {exe}: {e:#}", r.id, r.state),
    }
}

fn settle_line(s: &Settle) -> String {
    let outcome = match (s.settled_after_secs, s.last_pending_after_secs) {
        (Some(t), Some(p)) => format!("all settled {p:.2} to {t:.2} s after the window ({} poll(s))", s.polls),
        (Some(t), None) => format!("all settled by {t:.2} s after the window ({} poll(s))", s.polls),
        (None, _) => format!("NOT all settled within the bound: {} still starting ({} poll(s))", s.pending, s.polls),
    };
    let errors = if s.poll_errors > 0 { format!("; {} poll errors", s.poll_errors) } else { String::new() };
    format!(
        "{} created; {} still starting at the first poll ({:.2} s after the window); {outcome}; \
         not succeeded: {} (failed {}, other {}, starting {}){errors}",
        s.created,
        s.pending_at_first_poll,
        s.first_poll_after_secs,
        s.created - s.succeeded,
        s.failed,
        s.other,
        s.pending,
    )
}

/// execution ÷ raw write for every writer count measured for both.
fn ratios(cells: &[Cell]) -> Vec<Ratio> {
    cells
        .iter()
        .filter(|x| x.op == EXEC)
        .filter_map(|x| {
            let r = cells.iter().find(|r| r.op == RAW && r.writers == x.writers)?;
            Some(Ratio {
                writers: x.writers,
                throughput: x.stats.ops_per_sec / r.stats.ops_per_sec,
                p50: x.stats.p50_ms / r.stats.p50_ms,
                p99: x.stats.p99_ms / r.stats.p99_ms,
            })
        })
        .collect()
}

fn table_header() -> String {
    format!("{:<10} {:<18} {:>7} {}", "op", "request", "writers", Stats::headings())
}

fn row(c: &Cell) -> String {
    let request = if c.op == EXEC { "POST /v1/computers" } else { "POST /v1/bots" };
    format!("{:<10} {:<18} {:>7} {}", c.op, request, c.writers, c.stats.columns())
}
