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
//!    1, its agent stopped), then in front of a fresh 1-node cluster; the same client, closed-loop workers and windows for both. Read: `GET
//!    /v1/computers/:id` (any node answers it after a read barrier). Write: `POST /v1/bots`
//!    (a replicated write; the store-bench workload runner, [`workload::run`]). No goal: the
//!    ratio 3 nodes ÷ 1 node is reported as it is.
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

use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::report::ERROR_SAMPLES;
use computerd_bench::report::call_json;
use computerd_bench::report::excerpt;
use computerd_bench::report::loadavg;
use computerd_bench::report::panics;
use computerd_bench::report::spawn_agent;
use computerd_bench::settings;
use computerd_bench::workload;
use computerd_bench::workload::Op;
use computerd_bench::workload::Stats;
use computerd_bench::workload::Target;
use computerd_bench::workload::Timing;
use computerd_bench::workload::percentile_ms;
use computerd_tests::TestCluster;
use computerd_tests::agent::paired_computer;
use computerd_tests::lb::Haproxy;
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::Value;
use serde_json::json;

/// Untimed rounds before part 1's samples (connections, the agent's first spawns).
const WARMUP_ROUNDS: usize = 10;
/// Samples per node of part 1's `cat` input check (each takes the 250 ms yield).
const CAT_SAMPLES: usize = 5;
/// Bytes of part 1's small file.
const FILE_SMALL: usize = 64;
/// The shortest `yieldTimeMs` the API takes.
const MIN_YIELD_MS: u32 = 250;
/// Longest wait for the agent to link.
const LINK_BOUND: Duration = Duration::from_secs(60);
/// Pause between two polls.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// Pause after a failed request, so a broken part does not spin.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

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
    // The harness reads COMPUTERD_BIN when it first starts a node; set it before any other thread
    // exists.
    // SAFETY: single-threaded here: the tokio runtime is built below.
    unsafe { std::env::set_var("COMPUTERD_BIN", &cfg.computerd_bin) };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")?;
    rt.block_on(bench(cfg))
}

// ---------------------------------------------------------------------------------------------
// Samples.

/// The outcomes of one kind of operation (a fixed number of samples: all count).
#[derive(Default)]
struct Recorder {
    us: Vec<u64>,
    errors: u64,
    samples: Vec<String>,
}

impl Recorder {
    async fn add(&mut self, r: Result<Duration>) {
        match r {
            Ok(d) => self.us.push(d.as_micros() as u64),
            Err(e) => {
                self.errors += 1;
                let msg = format!("{e:#}");
                if self.samples.len() < ERROR_SAMPLES && !self.samples.contains(&msg) {
                    self.samples.push(msg);
                }
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }

    fn summary(&self, op: String) -> Summary {
        let mut us = self.us.clone();
        us.sort_unstable();
        Summary {
            op,
            n: us.len(),
            p50_ms: percentile_ms(&us, 0.50),
            p99_ms: percentile_ms(&us, 0.99),
            max_ms: us.last().map_or(f64::NAN, |&u| u as f64 / 1000.0),
            errors: self.errors,
            error_samples: self.samples.clone(),
        }
    }
}

/// Latencies of one kind of operation.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    op: String,
    n: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    errors: u64,
    error_samples: Vec<String>,
}

/// One operation sent to the owner and to a non-owner.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Routed {
    what: &'static str,
    owner: Summary,
    non_owner: Summary,
}

impl Routed {
    fn p50_ratio(&self) -> f64 {
        self.non_owner.p50_ms / self.owner.p50_ms
    }
    fn p99_ratio(&self) -> f64 {
        self.non_owner.p99_ms / self.owner.p99_ms
    }
    fn p50_diff_ms(&self) -> f64 {
        self.non_owner.p50_ms - self.owner.p50_ms
    }
}

/// Part 1's result.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Part1 {
    leader: u64,
    owner: u64,
    non_owner: u64,
    session: Routed,
    /// The small file read.
    file: Routed,
    /// The `cat` input check (the yield floor); None when it failed.
    cat: Option<Routed>,
    cat_error: Option<String>,
    /// `linkNode` after the samples (the link must not have moved).
    link_node_after: Option<u64>,
}

/// One cell of part 2.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Cell {
    nodes: u64,
    op: &'static str,
    writers: usize,
    stats: Stats,
}

// ---------------------------------------------------------------------------------------------
// Calls.

/// `POST url` with `body` and the token; answers the time to the whole answer and the answer.
async fn post_timed(http: &reqwest::Client, token: &str, url: &str, body: &Value) -> Result<(Duration, Value)> {
    let t0 = Instant::now();
    let v = call_json(http.post(url).bearer_auth(token).json(body), StatusCode::OK).await?;
    Ok((t0.elapsed(), v))
}

/// `POST …/sessions {"command":"true"}` on `base`; must answer the exit.
async fn session_true(http: &reqwest::Client, token: &str, base: &str, computer: &str) -> Result<Duration> {
    let url = format!("{base}/v1/computers/{computer}/sessions");
    let (d, v) = post_timed(http, token, &url, &json!({"command": "true"})).await?;
    if v["running"] != false || v["exitCode"] != 0 || v["output"] != "" {
        bail!("expected `true` to exit 0 without output: {}", excerpt(&v));
    }
    Ok(d)
}

/// `GET …/files?path=` of a small file as the raw body on `base`; must answer `want`.
async fn file_read(
    http: &reqwest::Client,
    token: &str,
    base: &str,
    computer: &str,
    path: &Path,
    want: &[u8],
) -> Result<Duration> {
    let mut url = reqwest::Url::parse(&format!("{base}/v1/computers/{computer}/files")).context("file URL")?;
    url.query_pairs_mut().append_pair("path", &path.to_string_lossy());
    let t0 = Instant::now();
    let resp = http.get(url).bearer_auth(token).header("accept", "application/octet-stream").send().await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    let d = t0.elapsed();
    if status != StatusCode::OK {
        bail!("HTTP {status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)]));
    }
    if body != want {
        bail!("the file read back differs ({} bytes)", body.len());
    }
    Ok(d)
}

/// `linkNode` of the Computer, read on `base`.
async fn link_node(http: &reqwest::Client, token: &str, base: &str, computer: &str) -> Result<Option<u64>> {
    let v = call_json(http.get(format!("{base}/v1/computers/{computer}")).bearer_auth(token), StatusCode::OK).await?;
    Ok(if v["state"] == "running" { v["linkNode"].as_u64() } else { None })
}

// ---------------------------------------------------------------------------------------------
// Part 1.

async fn part_routing(c: &TestCluster, http: &reqwest::Client, agent_bin: &Path, samples: usize) -> Result<Part1> {
    let leader = c.leader().await;
    let followers: Vec<u64> = c.nodes.keys().copied().filter(|id| *id != leader).collect();
    let (owner, non_owner) = match followers.as_slice() {
        [x, y, ..] => (*x, *y),
        _ => bail!("expected two followers, the leader is {leader} of {:?}", c.nodes.keys().collect::<Vec<_>>()),
    };
    let (computer, code) = paired_computer(c, "bench-routing").await;
    let owner_base = c.url(owner, "");
    let other_base = c.url(non_owner, "");
    let agent_log = c.dir.path().join("agent.log");
    let _agent = spawn_agent(agent_bin, &owner_base, &code, c.dir.path(), &agent_log)?;
    let deadline = Instant::now() + LINK_BOUND;
    loop {
        // Both nodes must see the link on X (so Y routes it without a barrier or a redirect).
        let on_owner = link_node(http, &c.token, &owner_base, &computer).await.ok().flatten();
        let on_other = link_node(http, &c.token, &other_base, &computer).await.ok().flatten();
        if on_owner == Some(owner) && on_other == Some(owner) {
            break;
        }
        if Instant::now() >= deadline {
            let tail = std::fs::read_to_string(&agent_log).unwrap_or_default();
            bail!(
                "the agent did not link to node {owner} (node {owner} sees {on_owner:?}, node {non_owner} sees \
                 {on_other:?}); its log: {}",
                tail.lines().rev().take(10).collect::<Vec<_>>().join(" | ")
            );
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    eprintln!("  linked to node {owner}; non-owner node {non_owner}; leader node {leader}");

    for _ in 0..WARMUP_ROUNDS {
        let _ = session_true(http, &c.token, &owner_base, &computer).await;
        let _ = session_true(http, &c.token, &other_base, &computer).await;
    }
    let (mut on_owner, mut via_other) = (Recorder::default(), Recorder::default());
    for i in 0..samples {
        // Alternate which goes first, so neither always follows the other.
        if i % 2 == 0 {
            on_owner.add(session_true(http, &c.token, &owner_base, &computer).await).await;
            via_other.add(session_true(http, &c.token, &other_base, &computer).await).await;
        } else {
            via_other.add(session_true(http, &c.token, &other_base, &computer).await).await;
            on_owner.add(session_true(http, &c.token, &owner_base, &computer).await).await;
        }
    }
    let session = Routed {
        what: "session `true`, start to exit",
        owner: on_owner.summary(format!("to node {owner} (owner)")),
        non_owner: via_other.summary(format!("to node {non_owner}, routed to {owner}")),
    };

    eprintln!("  a 64-byte file read, {samples} each");
    let file_path = c.dir.path().join("bench-64B.txt");
    let data: Vec<u8> = (0..FILE_SMALL).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(&file_path, &data).with_context(|| format!("write {}", file_path.display()))?;
    let (to_owner, to_other) = (owner_base.as_str(), other_base.as_str());
    let read = |on_owner: bool| {
        file_read(http, &c.token, if on_owner { to_owner } else { to_other }, &computer, &file_path, &data)
    };
    for _ in 0..WARMUP_ROUNDS {
        let _ = read(true).await;
        let _ = read(false).await;
    }
    let (mut on_owner, mut via_other) = (Recorder::default(), Recorder::default());
    for i in 0..samples {
        if i % 2 == 0 {
            on_owner.add(read(true).await).await;
            via_other.add(read(false).await).await;
        } else {
            via_other.add(read(false).await).await;
            on_owner.add(read(true).await).await;
        }
    }
    let file = Routed {
        what: "GET files (64 bytes, raw body)",
        owner: on_owner.summary(format!("to node {owner} (owner)")),
        non_owner: via_other.summary(format!("to node {non_owner}, routed to {owner}")),
    };

    eprintln!("  input to an open `cat` session ({CAT_SAMPLES} each)");
    let (cat, cat_error) = match cat_check(http, &c.token, &owner_base, &other_base, &computer, owner, non_owner).await
    {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let link_node_after = link_node(http, &c.token, &owner_base, &computer).await.ok().flatten();
    Ok(Part1 { leader, owner, non_owner, session, file, cat, cat_error, link_node_after })
}

/// Input `x\n` with the shortest yield to an open `cat` session, on the owner and routed.
async fn cat_check(
    http: &reqwest::Client,
    token: &str,
    owner_base: &str,
    other_base: &str,
    computer: &str,
    owner: u64,
    non_owner: u64,
) -> Result<Routed> {
    let start = format!("{owner_base}/v1/computers/{computer}/sessions");
    let (_, v) = post_timed(http, token, &start, &json!({"command": "cat", "yieldTimeMs": MIN_YIELD_MS})).await?;
    let sid = match (v["running"].as_bool(), v["session"].as_str()) {
        (Some(true), Some(sid)) => sid.to_string(),
        _ => bail!("`cat` should still run: {}", excerpt(&v)),
    };
    let input = |base: &str| {
        let url = format!("{base}/v1/computers/{computer}/sessions/{sid}/input");
        async move {
            let (d, v) = post_timed(http, token, &url, &json!({"chars": "x\\n", "yieldTimeMs": MIN_YIELD_MS})).await?;
            if v["running"] != true || v["output"] != "x\n" {
                bail!("expected `cat` to run and echo x: {}", excerpt(&v));
            }
            Ok(d)
        }
    };
    let (mut on_owner, mut via_other) = (Recorder::default(), Recorder::default());
    for _ in 0..CAT_SAMPLES {
        on_owner.add(input(owner_base).await).await;
        via_other.add(input(other_base).await).await;
    }
    let stop = http.delete(format!("{owner_base}/v1/computers/{computer}/sessions/{sid}")).bearer_auth(token);
    if let Err(e) = call_json(stop, StatusCode::OK).await {
        eprintln!("warning: could not stop the `cat` session: {e:#}");
    }
    Ok(Routed {
        what: "input \"x\\n\" to `cat`, yieldTimeMs 250",
        owner: on_owner.summary(format!("to node {owner} (owner)")),
        non_owner: via_other.summary(format!("to node {non_owner}, routed to {owner}")),
    })
}

// ---------------------------------------------------------------------------------------------
// Part 2.

/// Closed-loop readers: `GET url` with the token, one at a time each, as [`workload::run`] does
/// for writes (a request counts when it completes inside the window; only 200 is a success).
async fn read_loop(http: &reqwest::Client, token: &str, url: &str, readers: usize, timing: Timing) -> Stats {
    let start = Instant::now();
    let warm_end = start + timing.warmup;
    let end = warm_end + timing.measure;
    let tasks: Vec<_> = (0..readers)
        .map(|_| {
            let (http, token, url) = (http.clone(), token.to_string(), url.to_string());
            tokio::spawn(async move {
                let (mut us, mut errors, mut warmup_errors, mut samples) = (Vec::new(), 0u64, 0u64, Vec::new());
                loop {
                    let t0 = Instant::now();
                    if t0 >= end {
                        return (us, errors, warmup_errors, samples);
                    }
                    let r = call_json(http.get(&url).bearer_auth(&token), StatusCode::OK).await;
                    let t1 = Instant::now();
                    let counted = t1 >= warm_end && t1 <= end;
                    match r {
                        Ok(_) if counted => us.push((t1 - t0).as_micros() as u64),
                        Ok(_) => {}
                        Err(e) => {
                            if counted {
                                errors += 1;
                            } else if t1 < warm_end {
                                warmup_errors += 1;
                            }
                            let msg = format!("{e:#}");
                            if samples.len() < ERROR_SAMPLES && !samples.contains(&msg) {
                                samples.push(msg);
                            }
                            tokio::time::sleep(ERROR_PAUSE).await;
                        }
                    }
                }
            })
        })
        .collect();
    let (mut lat, mut errors, mut warmup_errors, mut error_samples) = (Vec::new(), 0, 0, Vec::<String>::new());
    for t in tasks {
        match t.await {
            Ok((us, e, we, s)) => {
                lat.extend(us);
                errors += e;
                warmup_errors += we;
                for m in s {
                    if error_samples.len() < ERROR_SAMPLES && !error_samples.contains(&m) {
                        error_samples.push(m);
                    }
                }
            }
            Err(e) => {
                errors += 1;
                error_samples.push(format!("reader task failed: {e}"));
            }
        }
    }
    lat.sort_unstable();
    let secs = timing.measure.as_secs_f64();
    Stats {
        ops: lat.len() as u64,
        secs,
        ops_per_sec: lat.len() as f64 / secs,
        p50_ms: percentile_ms(&lat, 0.50),
        p99_ms: percentile_ms(&lat, 0.99),
        max_ms: lat.last().map_or(f64::NAN, |&us| us as f64 / 1000.0),
        errors,
        warmup_errors,
        error_samples,
    }
}

/// Part 2 on one cluster behind HAProxy: the read cells, then the write cells.
async fn part_lb(c: &TestCluster, http: &reqwest::Client, writers: &[usize], timing: Timing) -> Result<Vec<Cell>> {
    let nodes = c.nodes.len() as u64;
    let backends: Vec<String> = c.nodes.values().map(|n| n.http.clone()).collect();
    let lb = Haproxy::start(c.dir.path(), &backends).await;
    // Every backend must be up in HAProxy before the first cell (its checks run every 250 ms).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (computer, _) = paired_computer(c, &format!("bench-read-{nodes}")).await;
    let mut cells = Vec::new();
    for &w in writers {
        eprintln!("  {nodes} node(s): GET /v1/computers/:id, {w} readers");
        let stats = read_loop(http, &c.token, &lb.url(&format!("/v1/computers/{computer}")), w, timing).await;
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

// ---------------------------------------------------------------------------------------------
// The run.

fn print_summary(part: &str, s: &Summary) {
    println!(
        "{:<4} {:<44} {:>5} {:>9.3} {:>9.3} {:>9.3} {:>6}",
        part, s.op, s.n, s.p50_ms, s.p99_ms, s.max_ms, s.errors
    );
}

fn print_errors(what: &str, s: &Summary) {
    if !s.error_samples.is_empty() {
        println!("errors in {what} {} ({}), e.g.:", s.op, s.errors);
        for e in &s.error_samples {
            println!("    {e}");
        }
    }
}

async fn bench(cfg: Config) -> Result<()> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
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
    eprintln!("part 1: session `true` on the link's owner vs through another node");
    let p1 = part_routing(&c3, &http, &cfg.agent_bin, cfg.samples).await;
    eprintln!("part 2: 3 nodes behind HAProxy");
    let cells3 = part_lb(&c3, &http, &cfg.writers, cfg.timing).await;
    let mut node_panics = panics(&c3);
    drop(c3);

    eprintln!("starting computerd (1 node)");
    let c1 = TestCluster::start(1).await;
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
            println!(
                "{:<4} {:<44} {:>5} {:>9} {:>9} {:>9} {:>6}",
                "part", "op", "n", "p50 ms", "p99 ms", "max ms", "errors"
            );
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
                print_errors("part 1", &r.owner);
                print_errors("part 1", &r.non_owner);
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
    println!(
        "{:<5} {:>5} {:>7} {:>10} {:>9} {:>9} {:>9} {:>7}",
        "op", "nodes", "workers", "ops/s", "p50 ms", "p99 ms", "max ms", "errors"
    );
    for op in ["read", "write"] {
        for c in cells.iter().filter(|c| c.op == op) {
            println!(
                "{:<5} {:>5} {:>7} {:>10.1} {:>9.2} {:>9.2} {:>9.2} {:>7}",
                c.op,
                c.nodes,
                c.writers,
                c.stats.ops_per_sec,
                c.stats.p50_ms,
                c.stats.p99_ms,
                c.stats.max_ms,
                c.stats.errors
            );
        }
    }
    println!("read = GET /v1/computers/:id (read barrier, then the local state); write = POST /v1/bots (Raft quorum)");
    for c in cells.iter().filter(|c| !c.stats.error_samples.is_empty()) {
        println!(
            "errors in {} {} node(s) {} worker(s) ({} measured, {} in warm-up), e.g.:",
            c.op, c.nodes, c.writers, c.stats.errors, c.stats.warmup_errors
        );
        for s in &c.stats.error_samples {
            println!("    {s}");
        }
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
        let met = r.p50_ratio() <= GOAL_ROUTED_P50_RATIO;
        routed_ratio = Some(r.p50_ratio());
        println!(
            "  1  session `true`, non-owner ÷ owner: p50 {:.3}x ({:+.2} ms)  p99 {:.3}x  goal p50 <= {GOAL_ROUTED_P50_RATIO}: {}",
            r.p50_ratio(),
            r.p50_diff_ms(),
            r.p99_ratio(),
            if met { "met" } else { "MISSED" }
        );
        let f = &p.file;
        println!(
            "  1b file read (64 B), non-owner ÷ owner: p50 {:.3}x ({:+.2} ms)  p99 {:.3}x  (no goal: the route without a shell)",
            f.p50_ratio(),
            f.p50_diff_ms(),
            f.p99_ratio()
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
        let text = serde_json::to_string_pretty(&doc).context("encode JSON")?;
        std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
