//! `cluster-bench`: what a cluster of `computerd` nodes costs and gives, each figure against a
//! baseline measured in the same run on the same machine.
//!
//! 1. **a session call through a node that does not hold the link**: a 3-node cluster (real
//!    `computerd` processes, [`computerd_tests::TestCluster`]) and one real `computer-agent`
//!    (release build) paired and linked to node X (`--server` = X's URL; checked with `GET
//!    /v1/computers/:id` → `linkNode`). X and Y are the two followers. Alternating, `N` samples
//!    each (after a few untimed warm-up rounds): `POST /v1/computers/:id/sessions
//!    {"command":"true"}` sent to X (the owner, which runs it over its link) and the same call
//!    sent to Y (which routes it over gRPC to X, `Routing.Forward`). Goal: p50 ratio
//!    non-owner ÷ owner at most 1.1. Also (no goal) a read of a 64-byte file (`GET
//!    …/files?path=`, raw body), which spawns nothing, so the route's cost is not hidden under a
//!    login shell's start. A few input calls to an open `cat` session
//!    (`yieldTimeMs` 250) on both nodes are shown too: they take the 250 ms yield (the agent
//!    answers a running command when its yield passes), so they are no ratio.
//! 2. **calls per second through a load balancer, 3 nodes against 1**: a real HAProxy
//!    ([`computerd_tests::lb::Haproxy`], round robin) in front of the 3-node cluster (after part
//!    1, its agent stopped), then in front of a fresh 1-node cluster; the same client, closed-loop
//!    workers and windows for both (the store-bench workload runner,
//!    [`computerd_bench::workload::run`]). Read: `GET /v1/computers/:id` (any node answers it
//!    after a read barrier). Write: `POST /v1/bots` (a replicated write). No goal: the ratio
//!    3 nodes ÷ 1 node is reported as it is.
//!
//! ```text
//! cargo build --release -p computerd-node --bin computerd &&
//!   cargo build --release -p computer-agent -p computerd-bench &&
//!   COMPUTERD_BIN=target/release/computerd target/release/cluster-bench
//! ```
//!
//! Environment: `BENCH_SECS`, `BENCH_WARMUP_SECS` (part 2's cells), `BENCH_QUICK`, `BENCH_JSON`,
//! `COMPUTERD_BIN`, `AGENT_BIN` as in the other benches (see [`settings`]), and `BENCH_SAMPLES`
//! (part 1's samples per side; default 200, 50 when quick) and `BENCH_WRITERS` (part 2's
//! closed-loop workers, a comma-separated list; default 64).

mod part1_routing;
mod part2_lb;

use std::path::PathBuf;

use anyhow::Result;
use anyhow::bail;
use computerd_bench::report;
use computerd_bench::report::Summary;
use computerd_bench::report::SummaryTable;
use computerd_bench::report::loadavg;
use computerd_bench::report::panics;
use computerd_bench::report::write_json;
use computerd_bench::settings;
use computerd_bench::workload::Stats;
use computerd_bench::workload::Timing;
use computerd_tests::TestCluster;
use serde_json::json;

use crate::part1_routing::part_routing;
use crate::part2_lb::part_lb;

/// Goal of part 1: non-owner p50 ÷ owner p50.
const GOAL_ROUTED_P50_RATIO: f64 = 1.1;

struct Config {
    timing: Timing,
    quick: bool,
    samples: usize,
    writers: Vec<usize>,
    computerd_bin: PathBuf,
    agent_bin: PathBuf,
    json_out: Option<PathBuf>,
}

impl Config {
    fn from_env() -> Result<Self> {
        let quick = settings::quick();
        let samples = settings::env_count("BENCH_SAMPLES")?.unwrap_or(if quick { 50 } else { 200 });
        if samples == 0 {
            bail!("BENCH_SAMPLES must be at least 1");
        }
        let writers = settings::env_list("BENCH_WRITERS")?.unwrap_or_else(|| vec![64]);
        if writers.is_empty() || writers.contains(&0) {
            bail!("BENCH_WRITERS must be counts of at least 1");
        }
        Ok(Config {
            timing: settings::timing(quick)?,
            quick,
            samples,
            writers,
            computerd_bin: settings::computerd_bin()?,
            agent_bin: settings::agent_bin()?,
            json_out: settings::json_out(),
        })
    }
}

fn main() -> Result<()> {
    let cfg = Config::from_env()?;
    // SAFETY: single-threaded here: the runtime's threads start with it.
    let rt = unsafe { settings::runtime_for(&cfg.computerd_bin) }?;
    rt.block_on(bench(cfg))
}

/// Part 1's table.
const TABLE: SummaryTable = SummaryTable { op_width: 44, n_width: 5, decimals: 3 };

fn print_summary(part: &str, s: &Summary) {
    println!("{}", TABLE.row(part, s));
}

async fn bench(cfg: Config) -> Result<()> {
    let cores = report::cores();
    let load_start = loadavg();
    let header = format!(
        "cluster-bench: a session call through a node without the link vs on its owner; calls per second \
         through HAProxy on 3 nodes vs 1 node\npart 1: 3 nodes, {} samples per side; part 2: {:?} closed-loop \
         workers, {:.1} s measured + {:.1} s warm-up per cell{}\ncomputerd: {}\ncomputer-agent: {}\ncores: {cores}; \
         load average at start: {load_start}",
        cfg.samples,
        cfg.writers,
        cfg.timing.measure.as_secs_f64(),
        cfg.timing.warmup.as_secs_f64(),
        if cfg.quick { " (quick mode)" } else { "" },
        cfg.computerd_bin.display(),
        cfg.agent_bin.display(),
    );
    eprintln!("{header}");
    let http = settings::http_client()?;

    eprintln!("starting computerd (3 nodes)");
    let c3 = TestCluster::start(3).await;
    // Part 2 writes new bots as fast as they are answered.
    c3.raise_limits().await;
    eprintln!("part 1: session `true` on the link's owner vs through another node");
    let p1 = part_routing(&c3, &http, &cfg.agent_bin, cfg.samples).await;
    eprintln!("part 2: 3 nodes behind HAProxy");
    let cells3 = part_lb(&c3, &http, &cfg.writers, cfg.timing).await;
    let mut node_panics = panics(&c3);
    drop(c3);

    eprintln!("starting computerd (1 node)");
    let c1 = TestCluster::start(1).await;
    c1.raise_limits().await;
    eprintln!("part 2: 1 node behind HAProxy");
    let cells1 = part_lb(&c1, &http, &cfg.writers, cfg.timing).await;
    node_panics.extend(panics(&c1));
    drop(c1);
    let load_end = loadavg();

    println!("{header}; at end: {load_end}\n");
    let mut failed = Vec::new();
    match &p1 {
        Ok(p) => {
            println!(
                "part 1: 3 nodes, leader node {}, the agent linked to node {} (owner), calls also sent to node {}",
                p.leader, p.owner, p.non_owner
            );
            println!("{}", TABLE.header());
            println!("1    {}", p.session.what);
            print_summary("1", &p.session.owner);
            print_summary("1", &p.session.non_owner);
            println!("1b   {}", p.file.what);
            print_summary("1b", &p.file.owner);
            print_summary("1b", &p.file.non_owner);
            if let Some(cat) = &p.cat {
                println!("1c   {} (the yield floor: shown, no ratio)", cat.what);
                print_summary("1c", &cat.owner);
                print_summary("1c", &cat.non_owner);
            }
            for r in [Some(&p.session), Some(&p.file), p.cat.as_ref()].into_iter().flatten() {
                r.owner.print_errors("part 1");
                r.non_owner.print_errors("part 1");
            }
            if let Some(e) = &p.cat_error {
                println!("the `cat` input check failed: {e}");
            }
            if p.link_node_after != Some(p.owner) {
                println!("warning: after the samples the link is on {:?}, not node {}", p.link_node_after, p.owner);
            }
        }
        Err(e) => failed.push(format!("part 1 failed: {e:#}")),
    }

    let mut cells = Vec::new();
    for (n, r) in [(1, cells1), (3, cells3)] {
        match r {
            Ok(c) => cells.extend(c),
            Err(e) => failed.push(format!("part 2 on {n} node(s) failed: {e:#}")),
        }
    }
    println!("\npart 2: through HAProxy (round robin over the nodes), closed-loop workers");
    println!("{:<5} {:>5} {:>7} {}", "op", "nodes", "workers", Stats::headings());
    for op in ["read", "write"] {
        for c in cells.iter().filter(|c| c.op == op) {
            println!("{:<5} {:>5} {:>7} {}", c.op, c.nodes, c.writers, c.stats.columns());
        }
    }
    println!("read = GET /v1/computers/:id (read barrier, then the local state); write = POST /v1/bots (Raft quorum)");
    for c in &cells {
        c.stats.print_errors(&format!("{} {} node(s) {} worker(s)", c.op, c.nodes, c.writers));
    }
    for f in &failed {
        println!("{f}");
    }
    for p in &node_panics {
        println!("node log: {p}");
    }

    println!("\nratios");
    let mut routed_ratio = None;
    if let Ok(p) = &p1 {
        let r = &p.session;
        let (p50, p99) = (r.non_owner.p50_ratio(&r.owner), r.non_owner.p99_ratio(&r.owner));
        let met = p50 <= GOAL_ROUTED_P50_RATIO;
        routed_ratio = Some(p50);
        println!(
            "  1  session `true`, non-owner ÷ owner: p50 {:.3}x ({:+.2} ms)  p99 {:.3}x  goal p50 <= {GOAL_ROUTED_P50_RATIO}: {}",
            p50,
            r.non_owner.p50_diff_ms(&r.owner),
            p99,
            if met { "met" } else { "MISSED" }
        );
        let f = &p.file;
        println!(
            "  1b file read (64 B), non-owner ÷ owner: p50 {:.3}x ({:+.2} ms)  p99 {:.3}x  (no goal: the route without a shell)",
            f.non_owner.p50_ratio(&f.owner),
            f.non_owner.p50_diff_ms(&f.owner),
            f.non_owner.p99_ratio(&f.owner)
        );
        if let Some(cat) = &p.cat {
            println!(
                "  1c input to `cat`: owner p50 {:.1} ms, non-owner p50 {:.1} ms: the 250 ms yield, not the route",
                cat.owner.p50_ms, cat.non_owner.p50_ms
            );
        }
    }
    let mut scale = Vec::new();
    for op in ["read", "write"] {
        for &w in &cfg.writers {
            let find = |n: u64| cells.iter().find(|c| c.op == op && c.nodes == n && c.writers == w);
            if let (Some(one), Some(three)) = (find(1), find(3)) {
                let r = three.stats.ops_per_sec / one.stats.ops_per_sec;
                let p99 = three.stats.p99_ms / one.stats.p99_ms;
                println!(
                    "  2  {op:<5} {w:>3} workers, 3 nodes ÷ 1 node: throughput {r:.3}x ({:.0} vs {:.0} ops/s)  p99 {p99:.3}x  (no goal)",
                    three.stats.ops_per_sec, one.stats.ops_per_sec
                );
                scale.push(json!({"op": op, "workers": w, "throughputRatio": r, "p99Ratio": p99}));
            }
        }
    }

    if let Some(path) = &cfg.json_out {
        let doc = json!({
            "config": {
                "measureSecs": cfg.timing.measure.as_secs_f64(),
                "warmupSecs": cfg.timing.warmup.as_secs_f64(),
                "quick": cfg.quick,
                "samples": cfg.samples,
                "writers": cfg.writers,
                "computerdBin": cfg.computerd_bin.display().to_string(),
                "agentBin": cfg.agent_bin.display().to_string(),
                "cores": cores,
                "loadStart": load_start,
                "loadEnd": load_end,
            },
            "routing": p1.as_ref().ok(),
            "routingP50Ratio": routed_ratio,
            "cells": cells,
            "scaling": scale,
            "failed": failed,
            "nodePanics": node_panics,
        });
        write_json(path, &doc)?;
    }
    Ok(())
}
