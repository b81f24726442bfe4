//! `agent-bench`: the cost of going through computerd and the agent link, each against a
//! baseline measured in the same run on the same machine.
//!
//! One real `computerd` node (started by [`computerd_tests::TestCluster`]) and one real
//! `computer-agent` process paired with it on the same machine (part 4 starts a fresh node).
//! Parts 1 to 3 alternate one baseline operation and one API operation (so load from elsewhere
//! hits both alike), for a warm-up and a measured window each; an operation counts when it
//! completes inside the window:
//!
//! 1. **session start to exit**: `POST /v1/computers/:id/sessions {"command":"true"}` until it
//!    answers the exit, against spawning `bash -lc true` in-process with `tokio::process` the way
//!    the agent does (pipes, own process group, output read to EOF, waited). Goal: at most 2 ms
//!    over the baseline at p50.
//! 2. **input round trip**. The agent answers an input call when its yield (at least 250 ms)
//!    passes or the command ends, so on a `cat` session every call takes the yield. Measured:
//!    - 2a: `POST …/input {"chars":"x\n"}` to a session `echo ready; head -n 1` (started
//!      beforehand in batches, and read until it printed `ready`): the answer comes as soon as
//!      `head` echoed the line and exited; against writing `x\n` to a raw child of the same
//!      command (also ready), reading its output to EOF and waiting;
//!    - 2b: a session `echo x`, start to exit, against raw `bash -lc 'echo x'`;
//!    - 2c: (a few samples) input `x\n` to a ready `echo ready; cat` session with `yieldTimeMs`
//!      250, against a write and read back on a raw child's pipes: it shows the yield floor, not
//!      the link.
//! 3. **throughput**: `GET /v1/computers/:id/files?path=…` with `Accept: application/octet-stream`
//!    of a 16 MiB file (the largest the API carries, streamed over the link in 256 KiB chunks and
//!    out as the raw body), timed to the last byte of the answer, against `cat` of the same file
//!    through a pipe (spawn, read to EOF). Goal: at least half the raw pipe's bytes per second.
//! 4. **memory per idle link**: pairs `BENCH_LINKS` Computers (default 10 000), then opens as
//!    many links from this process with a minimal link client ([`link_client::open_link`]: the
//!    agent's handshake and link service: session reports, gRPC on the HTTP/2 connections the node
//!    opens, answers to the node's WebSocket pings every 5 s), half and then
//!    the other half, and reads the node's `VmRSS` before, between and after (each after an idle
//!    wait). Against a plain WebSocket echo server (tokio-tungstenite defaults, a process of its
//!    own) holding as many idle connections. Goal: at most 32 KiB per link.
//!
//! ```text
//! cargo build --release -p computerd-node --bin computerd && cargo build --release -p computer-agent &&
//!   cargo build --release -p computerd-bench && target/release/agent-bench
//! ```
//!
//! Environment: `BENCH_SECS`, `BENCH_WARMUP_SECS` (one window each for parts 1 with 2b, 2a and 3),
//! `BENCH_QUICK`, `BENCH_JSON` and `COMPUTERD_BIN` as in the other benches (see [`settings`]),
//! and `AGENT_BIN` (default `<target>/release/computer-agent`), `BENCH_LINKS` (default 10 000;
//! 1 000 when quick), `BENCH_IDLE_SECS` (the idle wait with all links up; default 10, 4 when
//! quick) and `BENCH_PARTS` (the parts to run, e.g. `4` or `1,3`: `1` is parts 1 and 2b, `2` is
//! 2a and 2c, `4` is part 4 and its baseline; default all).

mod part1_sessions;
mod part2_input;
mod part3_files;
mod part4_links;

use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::api::Api;
use computerd_bench::link_client;
use computerd_bench::report;
use computerd_bench::report::PairRatios;
use computerd_bench::report::SummaryTable;
use computerd_bench::report::loadavg;
use computerd_bench::report::log_tail;
use computerd_bench::report::panics;
use computerd_bench::report::spawn_agent;
use computerd_bench::report::write_json;
use computerd_bench::settings;
use computerd_bench::workload::Timing;
use computerd_tests::TestCluster;
use serde_json::json;

use crate::part1_sessions::part_start_to_exit;
use crate::part2_input::CAT_SAMPLES;
use crate::part2_input::part_cat_yield;
use crate::part2_input::part_input_round_trip;
use crate::part3_files::FILE_BYTES;
use crate::part3_files::part_file_read;
use crate::part4_links::part_links;
use crate::part4_links::part_plain;

/// Pause between two polls of a pairing execution.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// Longest wait for an execution to settle or the agent to link.
const SETTLE_BOUND: Duration = Duration::from_secs(60);
/// Pause after a failed operation, so a broken part does not spin.
const ERROR_PAUSE: Duration = Duration::from_millis(10);
/// Open files needed besides one per link (sockets, logs, the store).
const FD_MARGIN: u64 = 512;

/// Goal of part 1: p50 over the raw spawn, ms.
const GOAL_START_OVERHEAD_MS: f64 = 2.0;
/// Goal of part 3: API throughput ÷ raw pipe throughput.
const GOAL_THROUGHPUT_RATIO: f64 = 0.5;
/// Goal of part 4: node memory per idle link, KiB.
const GOAL_KIB_PER_LINK: f64 = 32.0;

struct Config {
    timing: Timing,
    quick: bool,
    /// Which of parts 1 to 4 run (index 0 is part 1).
    parts: [bool; 4],
    links: usize,
    idle: Duration,
    computerd_bin: PathBuf,
    agent_bin: PathBuf,
    json_out: Option<PathBuf>,
}

impl Config {
    fn from_env() -> Result<Self> {
        let quick = settings::quick();
        let links = settings::env_count("BENCH_LINKS")?.unwrap_or(if quick { 1_000 } else { 10_000 });
        if links < 2 {
            bail!("BENCH_LINKS must be at least 2");
        }
        let idle = settings::env_f64("BENCH_IDLE_SECS")?.unwrap_or(if quick { 4.0 } else { 10.0 });
        if !(idle > 0.0 && idle.is_finite()) {
            bail!("BENCH_IDLE_SECS must be > 0");
        }
        let parts = match std::env::var("BENCH_PARTS") {
            Ok(v) if !v.trim().is_empty() => {
                let mut parts = [false; 4];
                for p in v.split(',').map(str::trim) {
                    match p.parse::<usize>() {
                        Ok(n @ 1..=4) => parts[n - 1] = true,
                        _ => bail!("BENCH_PARTS: {p:?} is not one of 1, 2, 3, 4"),
                    }
                }
                parts
            }
            _ => [true; 4],
        };
        Ok(Config {
            timing: settings::timing(quick)?,
            quick,
            parts,
            links,
            idle: Duration::from_secs_f64(idle),
            computerd_bin: settings::computerd_bin()?,
            agent_bin: settings::agent_bin()?,
            json_out: settings::json_out(),
        })
    }
}

fn main() -> Result<()> {
    if std::env::var_os(link_client::ECHO_ROLE_ENV).is_some() {
        return link_client::run_echo_server();
    }
    let cfg = Config::from_env()?;
    let nofile = raise_nofile()?;
    if cfg.links as u64 + FD_MARGIN > nofile {
        bail!(
            "BENCH_LINKS={} needs about {} open files in this process and in the node, but the limit is {nofile}",
            cfg.links,
            cfg.links as u64 + FD_MARGIN
        );
    }
    // SAFETY: single-threaded here: the runtime's threads start with it.
    let rt = unsafe { settings::runtime_for(&cfg.computerd_bin) }?;
    rt.block_on(bench(cfg))
}

/// Raises this process's soft limit of open files to the hard one (the node inherits it);
/// answers the limit.
fn raise_nofile() -> Result<u64> {
    use nix::sys::resource::Resource;
    let (soft, hard) = nix::sys::resource::getrlimit(Resource::RLIMIT_NOFILE).context("getrlimit")?;
    if soft < hard {
        nix::sys::resource::setrlimit(Resource::RLIMIT_NOFILE, hard, hard).context("setrlimit")?;
    }
    Ok(hard)
}

/// The table of parts 1 to 3, and their ratio lines.
const TABLE: SummaryTable = SummaryTable { op_width: 50, n_width: 6, decimals: 3 };
const RATIOS: PairRatios = PairRatios { label_width: 32, ratio_width: 8, diff_width: 0, diff_decimals: 2 };

/// Creates a paired Computer; answers its id and pairing code once its execution succeeded.
async fn paired_computer(api: &Api, key: &str) -> Result<(String, String)> {
    api.paired_computer(key, "bench", POLL_EVERY).await
}

/// Waits until the Computer is `running` (its agent linked).
async fn wait_running(api: &Api, id: &str) -> Result<()> {
    let deadline = Instant::now() + SETTLE_BOUND;
    loop {
        let state = api.get(&format!("/v1/computers/{id}")).await.map(|v| v["state"].clone());
        if matches!(&state, Ok(s) if s == "running") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("computer {id} is not running after {SETTLE_BOUND:?}: {state:?}");
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

async fn bench(cfg: Config) -> Result<()> {
    let cores = report::cores();
    let load_start = loadavg();
    let header = format!(
        "agent-bench: sessions, input, file reads and idle links through one computerd node and its agent \
         link, each against a baseline in the same run\n1 node; {:.1} s measured + {:.1} s warm-up for each of \
         parts 1 with 2b, 2a, 3; {} links, idle {:.1} s{}{}\ncomputerd: {}\ncomputer-agent: {}\ncores: {cores}; load \
         average at start: {load_start}",
        cfg.timing.measure.as_secs_f64(),
        cfg.timing.warmup.as_secs_f64(),
        cfg.links,
        cfg.idle.as_secs_f64(),
        if cfg.quick { " (quick mode)" } else { "" },
        if cfg.parts == [true; 4] {
            String::new()
        } else {
            let on: Vec<String> = (1..=4).filter(|&n| cfg.parts[n - 1]).map(|n| n.to_string()).collect();
            format!("; only parts {} (BENCH_PARTS)", on.join(","))
        },
        cfg.computerd_bin.display(),
        cfg.agent_bin.display(),
    );
    eprintln!("{header}");

    let http = settings::http_client()?;
    let mut pairs = Vec::new();
    let mut failed = Vec::new();
    let mut node_panics = Vec::new();
    if cfg.parts[..3].iter().any(|&p| p) {
        eprintln!("starting computerd (1 node)");
        let c = TestCluster::start(1).await;
        let api = Api { http: http.clone(), base: c.url(1, ""), token: c.token.clone() };

        let (computer, code) = paired_computer(&api, "bench-agent").await.context("pair the agent's Computer")?;
        let agent_log = c.dir.path().join("agent.log");
        let agent = spawn_agent(&cfg.agent_bin, &api.base, &code, c.dir.path(), &agent_log)?;
        wait_running(&api, &computer)
            .await
            .with_context(|| format!("the agent did not link; its log ends:\n{}", log_tail(&agent_log, 10)))?;

        if cfg.parts[0] {
            eprintln!("parts 1 and 2b: sessions `true` and `echo x` vs raw bash -lc");
            let (p1, p2b) = part_start_to_exit(&api, &computer, cfg.timing).await;
            pairs.extend([p1, p2b]);
        }
        let mut results = Vec::new();
        if cfg.parts[1] {
            eprintln!("part 2a: input to `head -n 1` until exit vs a raw child");
            pairs.push(part_input_round_trip(&api, &computer, cfg.timing).await);
            eprintln!("part 2c: input to `cat` with the shortest yield vs a raw cat");
            let samples = if cfg.quick { CAT_SAMPLES / 2 } else { CAT_SAMPLES };
            results.push(("2c", part_cat_yield(&api, &computer, samples).await));
        }
        if cfg.parts[2] {
            eprintln!("part 3: 16 MiB file reads vs cat through a pipe");
            results.push(("3", part_file_read(&api, &computer, c.dir.path(), cfg.timing).await));
        }
        for (part, r) in results {
            match r {
                Ok(p) => pairs.push(p),
                Err(e) => failed.push(format!("part {part} failed: {e:#}")),
            }
        }
        drop(agent);
        node_panics.extend(panics(&c));
        drop(c);
    }

    let (mut p4, mut p4b) = (None, None);
    if cfg.parts[3] {
        // Part 4 on a fresh node, so that its memory holds nothing but the paired Computers.
        eprintln!("starting a fresh computerd (1 node) for part 4");
        let c = TestCluster::start(1).await;
        let node_pid = c.nodes.get(&1).and_then(|n| n.child.as_ref()).map(|ch| ch.id()).context("node 1's process")?;
        let api = Api { http, base: c.url(1, ""), token: c.token.clone() };
        p4 = Some(part_links(&api, node_pid, cfg.links, cfg.idle).await);
        node_panics.extend(panics(&c));
        drop(c);
        eprintln!("part 4 baseline: {} idle plain WebSocket connections to an echo server", cfg.links);
        p4b = Some(part_plain(cfg.links).await);
    }
    let load_end = loadavg();
    pairs.sort_by_key(|p| p.part);

    println!("{header}; at end: {load_end}\n");
    println!("{}", TABLE.header());
    for p in &pairs {
        for s in [&p.api, &p.raw] {
            println!("{}", TABLE.row(p.part, s));
        }
    }
    for p in &pairs {
        for s in [&p.api, &p.raw] {
            s.print_errors(p.part);
        }
    }
    for f in &failed {
        println!("{f}");
    }
    for p in &node_panics {
        println!("node log: {p}");
    }
    let mib = FILE_BYTES as f64 / (1 << 20) as f64;
    let throughput = pairs.iter().find(|p| p.part == "3").map(|p| {
        let (api, raw) = (mib / (p.api.p50_ms / 1000.0), mib / (p.raw.p50_ms / 1000.0));
        println!("3    throughput at p50: API {api:.1} MiB/s, raw pipe {raw:.1} MiB/s (file bytes)");
        (api, raw)
    });

    println!();
    match &p4 {
        None => println!("4    not run (BENCH_PARTS)"),
        Some(Ok(m)) => {
            println!(
                "4    links: {} asked, {} paired in {:.1} s ({} errors), {} opened in {:.1} s ({} errors)",
                m.links, m.paired, m.pair_secs, m.pair_errors, m.opened, m.open_secs, m.open_errors
            );
            println!(
                "4    node VmRSS: {} KiB before, {} KiB with {} links, {} KiB with {} links (after {:.1} s idle)",
                m.node_rss_before_kib,
                m.node_rss_half_kib,
                m.opened_first_half,
                m.node_rss_after_kib,
                m.opened,
                m.idle_secs
            );
            println!(
                "4    node: {:.1} KiB/link over all links, {:.1} KiB/link over the second half; {:.1}% of one core \
                 while idle (a WebSocket ping every 5 s per link)",
                m.kib_per_link, m.kib_per_link_second_half, m.node_idle_cpu_percent
            );
            let running = m.running_at_end.map_or_else(|| "unknown".to_string(), |n| n.to_string());
            println!(
                "4    at the end: {} links alive here, {running} of the paired Computers running; this process \
                 (client side): {:.1} KiB/link",
                m.alive_at_end, m.bench_kib_per_link
            );
            for s in m.error_samples.iter().chain(&m.ended_samples) {
                println!("    {s}");
            }
        }
        Some(Err(e)) => println!("part 4 failed: {e:#}"),
    }
    match &p4b {
        None => {}
        Some(Ok(p)) => {
            println!(
                "4    plain WebSocket echo server VmRSS: {} KiB before, {} KiB with {} idle connections ({} errors): \
                 {:.1} KiB/conn",
                p.rss_before_kib, p.rss_after_kib, p.opened, p.errors, p.kib_per_conn
            );
            for s in &p.error_samples {
                println!("    {s}");
            }
        }
        Some(Err(e)) => println!("part 4 baseline failed: {e:#}"),
    }

    println!(
        "\nratios, API ÷ baseline (latency: 1 = as fast as the raw operation; throughput: 1 = as fast as the pipe)"
    );
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    for p in &pairs {
        let label = match p.part {
            "1" => "session `true` start to exit",
            "2a" => "input round trip (head -n 1)",
            "2b" => "session `echo x` start to exit",
            "2c" => "input to cat, yieldTimeMs 250",
            _ => "16 MiB file read, time",
        };
        let mut line = RATIOS.line(p, label);
        match p.part {
            "1" => line.push_str(&format!(
                "  goal p50 <= +{GOAL_START_OVERHEAD_MS} ms: {}",
                verdict(p.p50_diff_ms() <= GOAL_START_OVERHEAD_MS)
            )),
            "2c" => line.push_str("  (the 250 ms yield, not the link)"),
            _ => {}
        }
        println!("{line}");
    }
    if let Some((api, raw)) = throughput {
        println!(
            "  3   16 MiB file read, throughput  {:.3} of the raw pipe  goal >= {GOAL_THROUGHPUT_RATIO}: {}",
            api / raw,
            verdict(api / raw >= GOAL_THROUGHPUT_RATIO)
        );
    }
    if let Some(Ok(m)) = &p4 {
        let plain = p4b.as_ref().and_then(|p| p.as_ref().ok()).map(|p| p.kib_per_conn);
        let vs_plain = plain.map_or_else(
            || "no baseline".to_string(),
            |k| format!("{:.2}x a plain WebSocket connection ({k:.1} KiB)", m.kib_per_link / k),
        );
        println!(
            "  4   node memory per idle link      {:.1} KiB = {vs_plain}  goal <= {GOAL_KIB_PER_LINK} KiB: {}",
            m.kib_per_link,
            verdict(m.kib_per_link <= GOAL_KIB_PER_LINK)
        );
        if m.opened != 10_000 {
            println!(
                "      measured at {} links, not 10 000; at 10 000 the same per-link cost would be {:.0} MiB",
                m.opened,
                m.kib_per_link * 10_000.0 / 1024.0
            );
        }
    }

    if let Some(path) = &cfg.json_out {
        let doc = json!({
            "config": {
                "measureSecs": cfg.timing.measure.as_secs_f64(),
                "warmupSecs": cfg.timing.warmup.as_secs_f64(),
                "quick": cfg.quick,
                "links": cfg.links,
                "idleSecs": cfg.idle.as_secs_f64(),
                "computerdBin": cfg.computerd_bin.display().to_string(),
                "agentBin": cfg.agent_bin.display().to_string(),
                "cores": cores,
                "loadStart": load_start,
                "loadEnd": load_end,
            },
            "pairs": pairs,
            "failed": failed,
            "nodePanics": node_panics,
            "throughputMiBps": throughput.map(|(api, raw)| json!({"api": api, "raw": raw})),
            "links": p4.as_ref().and_then(|p| p.as_ref().ok()),
            "plainWebSocket": p4b.as_ref().and_then(|p| p.as_ref().ok()),
        });
        write_json(path, &doc)?;
    }
    Ok(())
}
