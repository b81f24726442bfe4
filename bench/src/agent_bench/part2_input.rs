//! Parts 2a and 2c: input to a running session against the same on a raw child's pipes.

use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::api::Api;
use computerd_bench::api::MIN_YIELD_MS;
use computerd_bench::api::expect_exit;
use computerd_bench::report::Pair;
use computerd_bench::report::Recorder;
use computerd_bench::report::Window;
use computerd_bench::report::excerpt;
use computerd_bench::workload::Timing;
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

use crate::ERROR_PAUSE;
use crate::SETTLE_BOUND;
use crate::part1_sessions::bash;

/// Sessions started together before their inputs are timed one by one (part 2a).
const BATCH: usize = 8;
/// The longest `yieldTimeMs` the API takes; an input to `head -n 1` answers as soon as it exits.
const MAX_YIELD_MS: u32 = 30_000;
/// What the commands of parts 2a and 2c print once their shell has started, so that neither
/// side times the start (a login shell takes a while: it reads the profile).
const READY: &str = "ready\n";
/// `head -n 1` once ready: it ends after echoing one line.
const HEAD_READY: &str = "echo ready; head -n 1";
/// `cat` once ready.
const CAT_READY: &str = "echo ready; cat";
/// Samples of part 2c (each API call takes the 250 ms yield).
pub const CAT_SAMPLES: usize = 8;

/// Part 2a: input `x\n` to `head -n 1` until it exits. Sessions and raw children are started
/// in batches and waited for until ready (untimed), then their inputs are timed one by one.
pub async fn part_input_round_trip(api: &Api, computer: &str, timing: Timing) -> Pair {
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
pub async fn part_cat_yield(api: &Api, computer: &str, samples: usize) -> Result<Pair> {
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
