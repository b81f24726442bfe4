//! Part 2: calls per second through HAProxy in front of a cluster (3 nodes, then 1).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use computerd_bench::workload;
use computerd_bench::workload::Op;
use computerd_bench::workload::Stats;
use computerd_bench::workload::Target;
use computerd_bench::workload::Timing;
use computerd_tests::TestCluster;
use computerd_tests::agent::paired_computer;
use computerd_tests::lb::Haproxy;
use serde::Serialize;

/// One cell of part 2.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cell {
    pub nodes: u64,
    pub op: &'static str,
    pub writers: usize,
    pub stats: Stats,
}

/// Part 2 on one cluster behind HAProxy: the read cells, then the write cells.
pub async fn part_lb(c: &TestCluster, http: &reqwest::Client, writers: &[usize], timing: Timing) -> Result<Vec<Cell>> {
    let nodes = c.nodes.len() as u64;
    let backends: Vec<String> = c.nodes.values().map(|n| n.http.clone()).collect();
    let lb = Haproxy::start(c.dir.path(), &backends).await;
    // Every backend must be up in HAProxy before the first cell (its checks run every 250 ms).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (computer, _) = paired_computer(c, &format!("bench-read-{nodes}")).await;
    let mut cells = Vec::new();
    for &w in writers {
        eprintln!("  {nodes} node(s): GET /v1/computers/:id, {w} readers");
        let url = lb.url(&format!("/v1/computers/{computer}"));
        let target = Arc::new(Target { urls: vec![url], op: Op::Read { token: c.token.clone() } });
        let stats = workload::run(http, target, w, timing, &format!("n{nodes}-r{w}")).await;
        cells.push(Cell { nodes, op: "read", writers: w, stats });
    }
    for &w in writers {
        eprintln!("  {nodes} node(s): POST /v1/bots, {w} writers");
        let target = Arc::new(Target { urls: vec![lb.url("/v1/bots")], op: Op::CreateBot { token: c.token.clone() } });
        let stats = workload::run(http, target, w, timing, &format!("n{nodes}-w{w}")).await;
        cells.push(Cell { nodes, op: "write", writers: w, stats });
    }
    Ok(cells)
}
