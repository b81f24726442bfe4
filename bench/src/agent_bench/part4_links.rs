//! Part 4: the node's memory per idle agent link, against a plain WebSocket echo server's per
//! connection.

use std::collections::HashSet;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computer_agent::pairing::Credential;
use computerd_bench::api::Api;
use computerd_bench::link_client;
use computerd_bench::report::call_json;
use computerd_bench::report::keep_sample;
use futures::StreamExt;
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::json;
use tokio::task::JoinHandle;

use crate::paired_computer;

/// Computers paired at once (part 4).
const PAIR_CONCURRENCY: usize = 32;
/// Failed pairings after which the rest are skipped: the node stopped making progress (each
/// failure may have waited [`crate::SETTLE_BOUND`]), and part 4 goes on with what was paired.
const PAIR_GIVE_UP: usize = PAIR_CONCURRENCY;
/// Links opened at once (part 4).
const LINK_CONCURRENCY: usize = 64;
/// Plain WebSocket connections opened at once (part 4's baseline).
const PLAIN_CONCURRENCY: usize = 256;
/// Idle wait of the plain WebSocket baseline (nothing happens on its connections).
const PLAIN_IDLE: Duration = Duration::from_secs(3);

/// Part 4 on the node.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct LinkMemory {
    /// Computers asked for.
    pub links: usize,
    /// Paired (credentials obtained).
    pub paired: usize,
    pub pair_errors: u64,
    pub pair_secs: f64,
    /// Links opened (welcome received).
    pub opened: usize,
    /// Opened in the first half.
    pub opened_first_half: usize,
    pub open_errors: u64,
    pub open_secs: f64,
    pub error_samples: Vec<String>,
    pub node_rss_before_kib: u64,
    pub node_rss_half_kib: u64,
    pub node_rss_after_kib: u64,
    /// (after − before) ÷ opened.
    pub kib_per_link: f64,
    /// (after − half) ÷ links opened in the second half.
    pub kib_per_link_second_half: f64,
    /// Node CPU over the final idle wait, percent of one core.
    pub node_idle_cpu_percent: f64,
    pub idle_secs: f64,
    /// Links still served by this process at the end of the idle wait.
    pub alive_at_end: usize,
    /// Why some links ended early (a few).
    pub ended_samples: Vec<String>,
    /// The paired Computers the API lists as `running` at the end (None: the list failed).
    pub running_at_end: Option<usize>,
    /// This process's memory per link (the client side, with 4 KiB WebSocket buffers).
    pub bench_kib_per_link: f64,
}

/// Part 4's baseline.
#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PlainMemory {
    pub conns: usize,
    pub opened: usize,
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    pub kib_per_conn: f64,
}

/// Trades a pairing code for a machine credential, as the agent does.
async fn redeem(api: &Api, code: &str) -> Result<Credential> {
    let req = api.http.post(api.url("/v1/agent/pair")).json(&json!({"code": code}));
    let v = call_json(req, StatusCode::OK).await.context("redeem the pairing code")?;
    let field = |k: &str| v[k].as_str().map(String::from).with_context(|| format!("no {k} in the pairing answer"));
    Ok(Credential { computer_id: field("computerId")?, credential: field("credential")? })
}

/// Pairs one Computer for part 4.
pub async fn pair_one(api: &Api, i: usize, failed: &AtomicUsize) -> Result<Credential> {
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
pub async fn open_links(ws_url: &str, creds: &[Credential], m: &mut LinkMemory) -> Vec<JoinHandle<String>> {
    let results: Vec<Result<JoinHandle<String>>> = futures::stream::iter(creds)
        .map(|c| link_client::open_link(ws_url, c))
        .buffer_unordered(LINK_CONCURRENCY)
        .collect()
        .await;
    successes(results, &mut m.open_errors, &mut m.error_samples, "open a link: ")
}

/// The successes of `results`; each failure is counted in `errors` and a few are kept in
/// `samples`, after `what`.
fn successes<T>(results: Vec<Result<T>>, errors: &mut u64, samples: &mut Vec<String>, what: &str) -> Vec<T> {
    let mut ok = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(v) => ok.push(v),
            Err(e) => {
                *errors += 1;
                keep_sample(samples, format!("{what}{e:#}"));
            }
        }
    }
    ok
}

/// Part 4 on the node: pair, open links in two halves, measure the node's memory.
pub async fn part_links(api: &Api, node_pid: u32, links: usize, idle: Duration) -> Result<LinkMemory> {
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
    let creds = successes(results, &mut m.pair_errors, &mut m.error_samples, "pair: ");
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
pub async fn part_plain(conns: usize) -> Result<PlainMemory> {
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
    let held = successes(results, &mut p.errors, &mut p.error_samples, "");
    p.opened = held.len();
    tokio::time::sleep(PLAIN_IDLE).await;
    p.rss_after_kib = link_client::rss_kib(pid)?;
    p.kib_per_conn = p.rss_after_kib.saturating_sub(p.rss_before_kib) as f64 / p.opened.max(1) as f64;
    drop(held);
    drop(server);
    Ok(p)
}
