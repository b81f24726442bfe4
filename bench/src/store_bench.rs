//! `store-bench`: durable write throughput and p50/p99 latency of the computerd store against
//! etcd, on the same machine in the same run.
//!
//! For 1 and 3 nodes and 1 and 64 concurrent writers it measures:
//!
//! - computerd: `POST /v1/bots` (a Raft-replicated, fsynced write that answers 201) on real
//!   `computerd` processes started by [`computerd_tests::TestCluster`];
//! - etcd: `POST /v3/kv/put` of a fresh key on etcd's v3 JSON gateway, 1 or 3 members on
//!   loopback with default (durable) settings, with peer and client TLS (certificates from a
//!   throwaway CA made in the run, see [`etcd`]), as computerd's nodes speak mutual TLS to each
//!   other. computerd's HTTP API stays plain HTTP on loopback, as the harness starts it.
//!
//! Both use an HTTP/1.1 JSON client with the same settings (reqwest for computerd; for etcd's
//! HTTPS, hyper-util's pooled client over rustls, see [`computerd_bench::https`]) and the same
//! closed-loop writers (see [`workload`]),
//! sending round robin across all nodes (like clients behind a load balancer) and, on 3 nodes,
//! also to the leader only. It prints a table, the ours/etcd ratios and whether the goal holds:
//! at 64 writers on 3 nodes, at least etcd's throughput and no worse p99.
//!
//! Run it against the release binary:
//!
//! ```text
//! cargo build --release -p computerd-node --bin computerd &&
//!   COMPUTERD_BIN=target/release/computerd cargo run --release -p computerd-bench --bin store-bench
//! ```
//!
//! Without `COMPUTERD_BIN` it uses `<target dir>/release/computerd` when that exists (it does not
//! rebuild it), else the harness default (a debug build; numbers then mean little).
//!
//! Environment:
//!
//! - `BENCH_SECS`: measured seconds per cell (default 10; 2 with `BENCH_QUICK=1`);
//! - `BENCH_WARMUP_SECS`: unmeasured warm-up per cell (default 1; 0.5 with `BENCH_QUICK=1`);
//! - `BENCH_WRITERS`, `BENCH_NODES`: comma-separated lists (default `1,64` and `1,3`);
//! - `ETCD_BIN`: the etcd binary (default `/usr/bin/etcd`, from Debian's `etcd-server`);
//! - `BENCH_JSON`: also write the results as JSON to this path.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::etcd;
use computerd_bench::etcd::EtcdCluster;
use computerd_bench::report;
use computerd_bench::report::write_json;
use computerd_bench::settings;
use computerd_bench::workload;
use computerd_bench::workload::Op;
use computerd_bench::workload::Stats;
use computerd_bench::workload::Target;
use computerd_bench::workload::Timing;
use computerd_tests::TestCluster;
use serde::Serialize;
use serde_json::json;

/// The cell the goal is about.
const GOAL_NODES: u64 = 3;
const GOAL_WRITERS: usize = 64;
const GOAL_TARGET: &str = ROUND_ROBIN;

const ROUND_ROBIN: &str = "round-robin";
const LEADER: &str = "leader";
const OURS: &str = "computerd";
const ETCD: &str = "etcd";

struct Config {
    timing: Timing,
    quick: bool,
    writers: Vec<usize>,
    nodes: Vec<u64>,
    computerd_bin: PathBuf,
    etcd_bin: PathBuf,
    json_out: Option<PathBuf>,
}

/// One measured cell.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Cell {
    system: &'static str,
    nodes: u64,
    target: &'static str,
    writers: usize,
    #[serde(flatten)]
    stats: Stats,
}

/// ours ÷ etcd for one (nodes, target, writers).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Ratio {
    nodes: u64,
    target: &'static str,
    writers: usize,
    /// Throughput ratio; above 1 is better for us.
    throughput: f64,
    /// p99 latency ratio; below 1 is better for us.
    p99: f64,
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
        let nodes = settings::env_list("BENCH_NODES")?.unwrap_or_else(|| vec![1, 3]);
        if writers.contains(&0) || nodes.contains(&0) {
            bail!("BENCH_WRITERS and BENCH_NODES must be positive");
        }
        let etcd_bin = match std::env::var_os("ETCD_BIN") {
            Some(p) => PathBuf::from(p),
            None => PathBuf::from("/usr/bin/etcd"),
        };
        Ok(Config {
            timing,
            quick,
            writers,
            nodes: nodes.into_iter().map(|n| n as u64).collect(),
            computerd_bin: settings::computerd_bin()?,
            etcd_bin,
            json_out: settings::json_out(),
        })
    }
}

async fn bench(cfg: Config) -> Result<()> {
    let etcd_version = etcd::version(&cfg.etcd_bin).with_context(|| {
        format!(
            "etcd is needed for the comparison (`apt-get install etcd-server`, or set ETCD_BIN); tried {}",
            cfg.etcd_bin.display()
        )
    })?;
    let cores = report::cores();
    let header = format!(
        "store-bench: durable writes, {:.1} s measured + {:.1} s warm-up per cell{}\n\
         computerd: {}\netcd: {} ({})\ncores: {cores}",
        cfg.timing.measure.as_secs_f64(),
        cfg.timing.warmup.as_secs_f64(),
        if cfg.quick { " (quick mode)" } else { "" },
        cfg.computerd_bin.display(),
        cfg.etcd_bin.display(),
        etcd_version,
    );
    eprintln!("{header}");

    let http = settings::http_client()?;
    let mut cells = Vec::new();
    let mut seq = 0usize;
    let mut run_cell =
        async |system: &'static str, nodes: u64, target_kind: &'static str, target: &Arc<Target>, writers: usize| {
            seq += 1;
            let tag = format!("{}{nodes}{}w{writers}c{seq}", &system[..1], &target_kind[..1]);
            let stats = workload::run(&http, target.clone(), writers, cfg.timing, &tag).await;
            let cell = Cell { system, nodes, target: target_kind, writers, stats };
            eprintln!("  {}", row(&cell));
            cells.push(cell);
        };

    for &nodes in &cfg.nodes {
        eprintln!("starting computerd with {nodes} node(s)");
        let c = TestCluster::start(nodes).await;
        // Every write is a new bot: the caps go up to their ceilings (1,000,000 bots).
        c.raise_limits().await;
        let op = || Op::CreateBot { token: c.token.clone() };
        let all = Arc::new(Target { urls: c.nodes.keys().map(|&id| c.url(id, "/v1/bots")).collect(), op: op() });
        for &w in &cfg.writers {
            run_cell(OURS, nodes, ROUND_ROBIN, &all, w).await;
        }
        if nodes > 1 {
            let leader = c.leader().await;
            let one = Arc::new(Target { urls: vec![c.url(leader, "/v1/bots")], op: op() });
            for &w in &cfg.writers {
                run_cell(OURS, nodes, LEADER, &one, w).await;
            }
        }
        drop(c);

        eprintln!("starting etcd with {nodes} member(s)");
        let e = EtcdCluster::start(&cfg.etcd_bin, nodes as usize).await?;
        let put = |base: &str| format!("{base}/v3/kv/put");
        let op = || Op::EtcdPut { client: e.client.clone() };
        let all = Arc::new(Target { urls: e.members.iter().map(|m| put(&m.client_url)).collect(), op: op() });
        for &w in &cfg.writers {
            run_cell(ETCD, nodes, ROUND_ROBIN, &all, w).await;
        }
        if nodes > 1 {
            let one = Arc::new(Target { urls: vec![put(&e.leader_url().await?)], op: op() });
            for &w in &cfg.writers {
                run_cell(ETCD, nodes, LEADER, &one, w).await;
            }
        }
        drop(e);
    }

    let ratios = ratios(&cells);
    let goal = ratios.iter().find(|r| r.nodes == GOAL_NODES && r.writers == GOAL_WRITERS && r.target == GOAL_TARGET);
    let goal_met = goal.map(|r| r.throughput >= 1.0 && r.p99 <= 1.0);

    println!("{header}\n");
    println!("{}", table_header());
    for c in &cells {
        println!("{}", row(c));
    }
    for c in &cells {
        c.stats.print_errors(&format!("{} {} node(s) {} {} writer(s)", c.system, c.nodes, c.target, c.writers));
    }
    println!("\nours/etcd (throughput: >1 is better for us; p99: <1 is better for us)");
    for r in &ratios {
        println!(
            "  {} node(s), {:>2} writer(s), {:<11}  throughput {:>6.2}x   p99 {:>6.2}x",
            r.nodes, r.writers, r.target, r.throughput, r.p99
        );
    }
    let goal_line = match (goal, goal_met) {
        (Some(r), Some(met)) => format!(
            "goal ({GOAL_NODES} nodes, {GOAL_WRITERS} writers, {GOAL_TARGET}: throughput ratio >= 1 and p99 ratio <= 1): {} \
             (throughput {:.2}x, p99 {:.2}x)",
            if met { "MET" } else { "NOT MET" },
            r.throughput,
            r.p99
        ),
        _ => format!("goal ({GOAL_NODES} nodes, {GOAL_WRITERS} writers, {GOAL_TARGET}): not measured in this run"),
    };
    println!("\n{goal_line}");

    if let Some(path) = &cfg.json_out {
        let doc = json!({
            "config": {
                "measureSecs": cfg.timing.measure.as_secs_f64(),
                "warmupSecs": cfg.timing.warmup.as_secs_f64(),
                "quick": cfg.quick,
                "writers": cfg.writers,
                "nodes": cfg.nodes,
                "computerdBin": cfg.computerd_bin.display().to_string(),
                "etcdBin": cfg.etcd_bin.display().to_string(),
                "etcdVersion": etcd_version,
                "cores": cores,
            },
            "cells": cells,
            "ratios": ratios,
            "goal": {
                "nodes": GOAL_NODES,
                "writers": GOAL_WRITERS,
                "target": GOAL_TARGET,
                "throughputRatio": goal.map(|r| r.throughput),
                "p99Ratio": goal.map(|r| r.p99),
                "met": goal_met,
            },
        });
        write_json(path, &doc)?;
    }
    Ok(())
}

/// ours ÷ etcd for every (nodes, target, writers) measured for both.
fn ratios(cells: &[Cell]) -> Vec<Ratio> {
    cells
        .iter()
        .filter(|o| o.system == OURS)
        .filter_map(|o| {
            let e = cells
                .iter()
                .find(|e| e.system == ETCD && e.nodes == o.nodes && e.target == o.target && e.writers == o.writers)?;
            Some(Ratio {
                nodes: o.nodes,
                target: o.target,
                writers: o.writers,
                throughput: o.stats.ops_per_sec / e.stats.ops_per_sec,
                p99: o.stats.p99_ms / e.stats.p99_ms,
            })
        })
        .collect()
}

fn table_header() -> String {
    format!("{:<10} {:>5}  {:<11} {:>7} {}", "system", "nodes", "target", "writers", Stats::headings())
}

fn row(c: &Cell) -> String {
    format!("{:<10} {:>5}  {:<11} {:>7} {}", c.system, c.nodes, c.target, c.writers, c.stats.columns())
}
