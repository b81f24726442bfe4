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

use std::collections::HashSet;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computer_agent::pairing::Credential;
use computerd_bench::api::Api;
use computerd_bench::api::MIN_YIELD_MS;
use computerd_bench::api::expect_exit;
use computerd_bench::link_client;
use computerd_bench::report;
use computerd_bench::report::Pair;
use computerd_bench::report::Recorder;
use computerd_bench::report::SummaryTable;
use computerd_bench::report::Window;
use computerd_bench::report::call_json;
use computerd_bench::report::excerpt;
use computerd_bench::report::keep_sample;
use computerd_bench::report::loadavg;
use computerd_bench::report::log_tail;
use computerd_bench::report::panics;
use computerd_bench::report::spawn_agent;
use computerd_bench::report::write_json;
use computerd_bench::settings;
use computerd_bench::workload::Timing;
use computerd_tests::TestCluster;
use futures::StreamExt;
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;

/// Sessions started together before their inputs are timed one by one (part 2a).
const BATCH: usize = 8;
/// The longest; an input to `head -n 1` answers as soon as it exits.
const MAX_YIELD_MS: u32 = 30_000;
/// What the commands of parts 2a and 2c print once their shell has started, so that neither
/// side times the start (a login shell takes a while: it reads the profile).
const READY: &str = "ready\n";
/// `head -n 1` once ready: it ends after echoing one line.
const HEAD_READY: &str = "echo ready; head -n 1";
/// `cat` once ready.
const CAT_READY: &str = "echo ready; cat";
/// Samples of part 2c (each API call takes the 250 ms yield).
const CAT_SAMPLES: usize = 8;
/// The file of part 3: the API's largest.
const FILE_BYTES: usize = 16 << 20;
/// Computers paired at once (part 4).
const PAIR_CONCURRENCY: usize = 32;
/// Failed pairings after which the rest are skipped: the node stopped making progress (each
/// failure may have waited [`SETTLE_BOUND`]), and part 4 goes on with what was paired.
const PAIR_GIVE_UP: usize = PAIR_CONCURRENCY;
/// Links opened at once (part 4).
const LINK_CONCURRENCY: usize = 64;
/// Plain WebSocket connections opened at once (part 4's baseline).
const PLAIN_CONCURRENCY: usize = 256;
/// Idle wait of the plain WebSocket baseline (nothing happens on its connections).
const PLAIN_IDLE: Duration = Duration::from_secs(3);
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

/// The table of parts 1 to 3.
const TABLE: SummaryTable = SummaryTable { op_width: 50, n_width: 6, decimals: 3 };

/// Part 4 on the node.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct LinkMemory {
    /// Computers asked for.
    links: usize,
    /// Paired (credentials obtained).
    paired: usize,
    pair_errors: u64,
    pair_secs: f64,
    /// Links opened (welcome received).
    opened: usize,
    /// Opened in the first half.
    opened_first_half: usize,
    open_errors: u64,
    open_secs: f64,
    error_samples: Vec<String>,
    node_rss_before_kib: u64,
    node_rss_half_kib: u64,
    node_rss_after_kib: u64,
    /// (after − before) ÷ opened.
    kib_per_link: f64,
    /// (after − half) ÷ links opened in the second half.
    kib_per_link_second_half: f64,
    /// Node CPU over the final idle wait, percent of one core.
    node_idle_cpu_percent: f64,
    idle_secs: f64,
    /// Links still served by this process at the end of the idle wait.
    alive_at_end: usize,
    /// Why some links ended early (a few).
    ended_samples: Vec<String>,
    /// The paired Computers the API lists as `running` at the end (None: the list failed).
    running_at_end: Option<usize>,
    /// This process's memory per link (the client side, with 4 KiB WebSocket buffers).
    bench_kib_per_link: f64,
}

/// Part 4's baseline.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct PlainMemory {
    conns: usize,
    opened: usize,
    errors: u64,
    error_samples: Vec<String>,
    rss_before_kib: u64,
    rss_after_kib: u64,
    kib_per_conn: f64,
}

// ---------------------------------------------------------------------------------------------
// The API.

/// Creates a paired Computer; answers its id and pairing code once its execution succeeded.
async fn paired_computer(api: &Api, key: &str) -> Result<(String, String)> {
    api.paired_computer(key, "bench", POLL_EVERY).await
}

/// Trades a pairing code for a machine credential, as the agent does.
async fn redeem(api: &Api, code: &str) -> Result<Credential> {
    let req = api.http.post(api.url("/v1/agent/pair")).json(&json!({"code": code}));
    let v = call_json(req, StatusCode::OK).await.context("redeem the pairing code")?;
    let field = |k: &str| v[k].as_str().map(String::from).with_context(|| format!("no {k} in the pairing answer"));
    Ok(Credential { computer_id: field("computerId")?, credential: field("credential")? })
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

/// Starts `command` (which prints [`READY`] first) in a session and reads its output with the
/// shortest yield until it printed [`READY`]; answers the session id.
async fn start_ready(api: &Api, computer: &str, command: &str) -> Result<String> {
    let body = json!({"command": command, "yieldTimeMs": MIN_YIELD_MS});
    let mut v = api.post(&format!("/v1/computers/{computer}/sessions"), body, StatusCode::OK).await?;
    let sid = match (v["running"].as_bool(), v["session"].as_str()) {
        (Some(true), Some(sid)) => sid.to_string(),
        _ => bail!("`{command}` should still run: {}", excerpt(&v)),
    };
    let mut out = String::new();
    let deadline = Instant::now() + SETTLE_BOUND;
    loop {
        out.push_str(v["output"].as_str().unwrap_or_default());
        if out == READY {
            return Ok(sid);
        }
        if out.len() > READY.len() || v["running"] != true || Instant::now() >= deadline {
            bail!("`{command}` printed {out:?}, not {READY:?}: {}", excerpt(&v));
        }
        v = api.input(computer, &sid, "", MIN_YIELD_MS).await?;
    }
}

// ---------------------------------------------------------------------------------------------
// Raw baselines.

/// `bash -lc <command>` as the agent spawns it: pipes, its own process group.
fn bash(command: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-lc")
        .arg(command)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    cmd
}

/// Spawns `bash -lc <command>`, reads its output to EOF and waits; its stdout must be `want`.
async fn raw_command(command: &str, want: &[u8]) -> Result<Duration> {
    let t0 = Instant::now();
    let out = bash(command).spawn().context("spawn bash")?.wait_with_output().await.context("wait for bash")?;
    let d = t0.elapsed();
    if !out.status.success() || out.stdout != want {
        bail!("raw `{command}`: {} with stdout {:?}", out.status, String::from_utf8_lossy(&out.stdout));
    }
    Ok(d)
}

/// A raw child that printed [`READY`], with its pipes.
struct Ready {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::process::ChildStdout,
}

/// Spawns `bash -lc <command>` and reads its stdout until it printed [`READY`].
async fn spawn_ready(command: &str) -> Result<Ready> {
    let mut child = bash(command).spawn().context("spawn bash")?;
    let stdin = child.stdin.take().context("no stdin")?;
    let mut stdout = child.stdout.take().context("no stdout")?;
    let mut first = vec![0u8; READY.len()];
    tokio::time::timeout(SETTLE_BOUND, stdout.read_exact(&mut first))
        .await
        .context("the raw child did not start")?
        .context("read the raw child's output")?;
    if first != READY.as_bytes() {
        bail!("`{command}` printed {:?}, not {READY:?}", String::from_utf8_lossy(&first));
    }
    Ok(Ready { child, stdin, stdout })
}

/// Writes `x\n` to a ready `head -n 1` child (stdin kept open, as the agent does), reads its
/// output to EOF and waits.
async fn raw_line(mut r: Ready) -> Result<Duration> {
    let t0 = Instant::now();
    r.stdin.write_all(b"x\n").await.context("write")?;
    r.stdin.flush().await.context("flush")?;
    let mut out = Vec::new();
    r.stdout.read_to_end(&mut out).await.context("read")?;
    let status = r.child.wait().await.context("wait")?;
    let d = t0.elapsed();
    if !status.success() || out != b"x\n" {
        bail!("raw `head -n 1`: {status} with stdout {:?}", String::from_utf8_lossy(&out));
    }
    Ok(d)
}

/// `cat <path>` through a pipe: spawn, read to EOF, wait; the bytes must be `want`.
async fn raw_cat(path: &Path, want: &[u8]) -> Result<Duration> {
    let t0 = Instant::now();
    let out = tokio::process::Command::new("cat")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("spawn cat")?
        .wait_with_output()
        .await
        .context("wait for cat")?;
    let d = t0.elapsed();
    if !out.status.success() || out.stdout != want {
        bail!("raw cat: {} with {} bytes", out.status, out.stdout.len());
    }
    Ok(d)
}

// ---------------------------------------------------------------------------------------------
// Parts.

/// Parts 1 and 2b, interleaved: sessions `true` and `echo x` against raw `bash -lc`.
async fn part_start_to_exit(api: &Api, computer: &str, timing: Timing) -> (Pair, Pair) {
    let w = Window::start(timing);
    let [mut raw_true, mut api_true, mut raw_echo, mut api_echo] = [(); 4].map(|()| Recorder::in_window(w));
    while !w.done() {
        raw_true.record(raw_command("true", b"").await, ERROR_PAUSE).await;
        api_true.record(api.session_exit(computer, "true", "").await, ERROR_PAUSE).await;
        raw_echo.record(raw_command("echo x", b"x\n").await, ERROR_PAUSE).await;
        api_echo.record(api.session_exit(computer, "echo x", "x\n").await, ERROR_PAUSE).await;
    }
    (
        Pair {
            part: "1",
            api: api_true.summary("API  session `true`, start to exit"),
            raw: raw_true.summary("raw  bash -lc true: spawn, read, wait"),
        },
        Pair {
            part: "2b",
            api: api_echo.summary("API  session `echo x`, start to exit"),
            raw: raw_echo.summary("raw  bash -lc 'echo x': spawn, read, wait"),
        },
    )
}

/// Part 2a: input `x\n` to `head -n 1` until it exits. Sessions and raw children are started
/// in batches and waited for until ready (untimed), then their inputs are timed one by one.
async fn part_input_round_trip(api: &Api, computer: &str, timing: Timing) -> Pair {
    let w = Window::start(timing);
    let (mut raw, mut via_api) = (Recorder::in_window(w), Recorder::in_window(w));
    while !w.done() {
        let kids = futures::future::join_all((0..BATCH).map(|_| spawn_ready(HEAD_READY))).await;
        for k in kids {
            match k {
                Ok(k) => raw.record(raw_line(k).await, ERROR_PAUSE).await,
                Err(e) => {
                    raw.add(Err(e));
                }
            }
        }
        let starts = futures::future::join_all((0..BATCH).map(|_| start_ready(api, computer, HEAD_READY))).await;
        for s in starts {
            match s {
                Ok(sid) => {
                    let op = async {
                        let t0 = Instant::now();
                        let v = api.input(computer, &sid, "x\\n", MAX_YIELD_MS).await?;
                        let d = t0.elapsed();
                        expect_exit(&v, "x\n")?;
                        Ok(d)
                    };
                    via_api.record(op.await, ERROR_PAUSE).await;
                }
                Err(e) => {
                    via_api.add(Err(e.context("start a session")));
                }
            }
        }
    }
    Pair {
        part: "2a",
        api: via_api.summary("API  input \"x\\n\" to `head -n 1`, until exit"),
        raw: raw.summary("raw  write x\\n to head -n 1, read to EOF, wait"),
    }
}

/// Part 2c: input to an open `cat` session with the shortest yield, a few times.
async fn part_cat_yield(api: &Api, computer: &str, samples: usize) -> Result<Pair> {
    let sid = start_ready(api, computer, CAT_READY).await.context("start a `cat` session")?;
    let Ready { child, mut stdin, mut stdout } = spawn_ready(CAT_READY).await.context("a raw cat")?;
    let w = Window::unbounded();
    let (mut raw, mut via_api) = (Recorder::in_window(w), Recorder::in_window(w));
    for _ in 0..samples {
        let op = async {
            let t0 = Instant::now();
            stdin.write_all(b"x\n").await?;
            stdin.flush().await?;
            let mut back = [0u8; 2];
            stdout.read_exact(&mut back).await?;
            let d = t0.elapsed();
            if &back != b"x\n" {
                bail!("raw cat answered {back:?}");
            }
            Ok(d)
        };
        raw.record(op.await, ERROR_PAUSE).await;
        via_api.record(api.cat_echo(computer, &sid).await, ERROR_PAUSE).await;
    }
    drop(child);
    api.stop_cat_session(computer, &sid).await;
    Ok(Pair {
        part: "2c",
        api: via_api.summary("API  input \"x\\n\" to `cat`, yieldTimeMs 250"),
        raw: raw.summary("raw  write x\\n to cat, read it back"),
    })
}

/// Part 3: a 16 MiB file read through the API against `cat` through a pipe.
async fn part_file_read(api: &Api, computer: &str, dir: &Path, timing: Timing) -> Result<Pair> {
    let path = dir.join("bench-16MiB.bin");
    let data: Vec<u8> = (0..FILE_BYTES as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&path, &data).with_context(|| format!("write {}", path.display()))?;
    let w = Window::start(timing);
    let (mut raw, mut via_api) = (Recorder::in_window(w), Recorder::in_window(w));
    while !w.done() {
        raw.record(raw_cat(&path, &data).await, ERROR_PAUSE).await;
        via_api.record(api.read_file(computer, &path, &data).await, ERROR_PAUSE).await;
    }
    Ok(Pair {
        part: "3",
        api: via_api.summary("API  GET files 16 MiB raw body, to last byte"),
        raw: raw.summary("raw  cat 16 MiB file | pipe: spawn, read, wait"),
    })
}

/// Pairs one Computer for part 4.
async fn pair_one(api: &Api, i: usize, failed: &AtomicUsize) -> Result<Credential> {
    if failed.load(Ordering::Relaxed) >= PAIR_GIVE_UP {
        bail!("skipped: {PAIR_GIVE_UP} pairings failed before");
    }
    let r = async {
        let (_, code) = paired_computer(api, &format!("link-bench-{i}")).await?;
        redeem(api, &code).await
    }
    .await;
    if r.is_err() {
        failed.fetch_add(1, Ordering::Relaxed);
    }
    r
}

/// Opens a link for each credential, `LINK_CONCURRENCY` at a time.
async fn open_links(ws_url: &str, creds: &[Credential], m: &mut LinkMemory) -> Vec<JoinHandle<String>> {
    let results: Vec<Result<JoinHandle<String>>> = futures::stream::iter(creds)
        .map(|c| link_client::open_link(ws_url, c))
        .buffer_unordered(LINK_CONCURRENCY)
        .collect()
        .await;
    let mut handles = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(h) => handles.push(h),
            Err(e) => {
                m.open_errors += 1;
                keep_sample(&mut m.error_samples, format!("open a link: {e:#}"));
            }
        }
    }
    handles
}

/// Part 4 on the node: pair, open links in two halves, measure the node's memory.
async fn part_links(api: &Api, node_pid: u32, links: usize, idle: Duration) -> Result<LinkMemory> {
    let mut m = LinkMemory { links, idle_secs: idle.as_secs_f64(), ..LinkMemory::default() };
    eprintln!("part 4: pairing {links} Computers ({PAIR_CONCURRENCY} at a time)");
    let t0 = Instant::now();
    let (done, failed) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let results: Vec<Result<Credential>> = futures::stream::iter(0..links)
        .map(|i| pair_one(api, i, &failed))
        .buffer_unordered(PAIR_CONCURRENCY)
        .inspect(|_| {
            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_multiple_of(1000) {
                let f = failed.load(Ordering::Relaxed);
                eprintln!("  {n} done ({f} failed) after {:.1} s", t0.elapsed().as_secs_f64());
            }
        })
        .collect()
        .await;
    m.pair_secs = t0.elapsed().as_secs_f64();
    let mut creds = Vec::with_capacity(links);
    for r in results {
        match r {
            Ok(c) => creds.push(c),
            Err(e) => {
                m.pair_errors += 1;
                keep_sample(&mut m.error_samples, format!("pair: {e:#}"));
            }
        }
    }
    m.paired = creds.len();
    if creds.len() < 2 {
        bail!("only {} Computers paired: {:?}", creds.len(), m.error_samples);
    }
    eprintln!("  {} paired in {:.1} s ({} errors)", creds.len(), m.pair_secs, m.pair_errors);

    // Let the pairing's work drain before the first reading.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let me = std::process::id();
    m.node_rss_before_kib = link_client::rss_kib(node_pid)?;
    let bench_before = link_client::rss_kib(me)?;
    let ws_url = format!("{}/v1/agent/link", api.base.replacen("http://", "ws://", 1));
    let half = creds.len() / 2;
    eprintln!("  opening {half} links ({LINK_CONCURRENCY} at a time)");
    let t0 = Instant::now();
    let mut handles = open_links(&ws_url, &creds[..half], &mut m).await;
    let first_half = t0.elapsed();
    m.opened_first_half = handles.len();
    tokio::time::sleep(idle / 2).await;
    m.node_rss_half_kib = link_client::rss_kib(node_pid)?;
    eprintln!("  opening {} more", creds.len() - half);
    let t1 = Instant::now();
    handles.extend(open_links(&ws_url, &creds[half..], &mut m).await);
    m.open_secs = (first_half + t1.elapsed()).as_secs_f64();
    m.opened = handles.len();
    eprintln!("  {} links up ({} errors); idle for {:.1} s", m.opened, m.open_errors, idle.as_secs_f64());

    let cpu0 = link_client::cpu_secs(node_pid)?;
    let idle_start = Instant::now();
    tokio::time::sleep(idle).await;
    let cpu1 = link_client::cpu_secs(node_pid)?;
    m.node_idle_cpu_percent = (cpu1 - cpu0) / idle_start.elapsed().as_secs_f64() * 100.0;
    m.node_rss_after_kib = link_client::rss_kib(node_pid)?;
    let bench_after = link_client::rss_kib(me)?;
    m.alive_at_end = handles.iter().filter(|h| !h.is_finished()).count();

    let opened = m.opened.max(1) as f64;
    m.kib_per_link = m.node_rss_after_kib.saturating_sub(m.node_rss_before_kib) as f64 / opened;
    let second = (m.opened - m.opened_first_half).max(1) as f64;
    m.kib_per_link_second_half = m.node_rss_after_kib as f64 / second - m.node_rss_half_kib as f64 / second;
    m.bench_kib_per_link = bench_after.saturating_sub(bench_before) as f64 / opened;

    // Check through the API that the links were up the whole time (an unanswered ping ends a link).
    let ids: HashSet<&str> = creds.iter().map(|c| c.computer_id.as_str()).collect();
    let list = api.http.get(api.url("/v1/computers")).bearer_auth(&api.token).timeout(Duration::from_secs(60));
    match call_json(list, StatusCode::OK).await {
        Ok(v) => {
            let rows = v["computers"].as_array().map(Vec::as_slice).unwrap_or_default();
            m.running_at_end = Some(
                rows.iter()
                    .filter(|r| r["id"].as_str().is_some_and(|id| ids.contains(id)) && r["state"] == "running")
                    .count(),
            );
        }
        Err(e) => m.error_samples.push(format!("list the Computers: {e:#}")),
    }
    for h in handles {
        if h.is_finished() {
            let why = h.await.unwrap_or_else(|e| format!("the link task failed: {e}"));
            keep_sample(&mut m.ended_samples, why);
        } else {
            h.abort();
        }
    }
    Ok(m)
}

/// Part 4's baseline: idle plain WebSocket connections to an echo server process.
async fn part_plain(conns: usize) -> Result<PlainMemory> {
    let exe = std::env::current_exe().context("this binary's path")?;
    let server = link_client::EchoServer::start(&exe).await?;
    let pid = server.pid()?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut p = PlainMemory { conns, rss_before_kib: link_client::rss_kib(pid)?, ..PlainMemory::default() };
    let results: Vec<Result<link_client::PlainConn>> = futures::stream::iter(0..conns)
        .map(|_| link_client::open_plain(&server.url))
        .buffer_unordered(PLAIN_CONCURRENCY)
        .collect()
        .await;
    let mut held = Vec::with_capacity(conns);
    for r in results {
        match r {
            Ok(c) => held.push(c),
            Err(e) => {
                p.errors += 1;
                keep_sample(&mut p.error_samples, format!("{e:#}"));
            }
        }
    }
    p.opened = held.len();
    tokio::time::sleep(PLAIN_IDLE).await;
    p.rss_after_kib = link_client::rss_kib(pid)?;
    p.kib_per_conn = p.rss_after_kib.saturating_sub(p.rss_before_kib) as f64 / p.opened.max(1) as f64;
    drop(held);
    drop(server);
    Ok(p)
}

// ---------------------------------------------------------------------------------------------
// The run.

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
        let mut line = format!(
            "  {:<3} {:<32} p50 {:>8.2}x ({:+.2} ms)  p99 {:>8.2}x",
            p.part,
            label,
            p.p50_ratio(),
            p.p50_diff_ms(),
            p.p99_ratio()
        );
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
