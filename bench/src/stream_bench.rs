//! stream-bench: a person's desktop stream, full-screen raw frames (1280x800, 4 MB each) from
//! the same x11vnc in a real Docker desktop sandbox, read two ways in turn:
//!
//! - **computerd**: the stream's WebSocket on the node (ticket, cookie), the tunnel through the
//!   agent's link, the agent's RFB filter, x11vnc's socket;
//! - **websockify** (Debian's, the baseline): on this host, straight to the same x11vnc socket
//!   (reached as root through `/proc/<x11vnc>/root`), with no link and no filter.
//!
//! Each frame is a non-incremental FramebufferUpdateRequest of the whole screen, read to its
//! last byte (the scripted RFB client of the tests). The goal: computerd's throughput at least
//! 2x websockify's.
//!
//! ```text
//! cargo build --release -p computerd-node -p computer-agent -p computerd-bench --bin computerd --bin computer-agent --bin stream-bench &&
//!   target/release/stream-bench
//! ```
//!
//! `BENCH_FRAMES` (default 60; 20 with `BENCH_QUICK=1`) frames each way, after 5 of each not
//! counted; `COMPUTERD_BIN` and `AGENT_BIN` as in the other benches. Needs root, Docker and
//! websockify (apt-get install websockify).

use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::sandbox;
use computerd_bench::sandbox::call;
use computerd_bench::settings;
use computerd_tests::TestCluster;
use computerd_tests::docker::DESKTOP_IMAGE;
use computerd_tests::rfb::Viewer;
use serde_json::json;

fn main() -> Result<()> {
    sandbox::main(run)
}

async fn run(agent: std::path::PathBuf) -> Result<()> {
    let frames: usize = std::env::var("BENCH_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if settings::quick() { 20 } else { 60 });
    computerd_tests::docker::ensure_desktop_image();
    let c = TestCluster::start(1).await;
    let id = sandbox::create(&c, &agent, DESKTOP_IMAGE, 1024, true).await?;
    let result = measure(&c, &id, frames).await;
    sandbox::remove(&c, &id).await;
    result
}

/// A stream's cookie: a view ticket redeemed.
async fn cookie(c: &TestCluster, id: &str) -> Result<String> {
    let v =
        call(c, reqwest::Method::POST, &format!("/v1/computers/{id}/desktop/stream"), Some(json!({"mode": "view"})))
            .await?;
    let url = v["url"].as_str().context("url")?;
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    let r = http.get(url).send().await?;
    let set = r.headers().get("set-cookie").and_then(|v| v.to_str().ok()).context("no cookie")?;
    let value = set.split(';').next().and_then(|kv| kv.split_once('=')).map(|(_, v)| v.to_string());
    value.context("a cookie value")
}

struct Websockify(std::process::Child);

impl Drop for Websockify {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn measure(c: &TestCluster, id: &str, frames: usize) -> Result<()> {
    computerd_tests::agent::wait_state(c, id, "running").await;
    // The first stream starts x11vnc in the Computer.
    let ws_url = c.url(1, &format!("/v1/computers/{id}/desktop/websockify")).replacen("http", "ws", 1);
    let mut ours = Viewer::connect(&ws_url, &cookie(c, id).await?).await.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    // The same x11vnc's socket, from this host.
    let container = computerd_tests::docker::containers_of(id).into_iter().next().context("the container")?;
    let out = std::process::Command::new("docker").args(["top", &container, "-eo", "pid,args"]).output()?;
    let top = String::from_utf8_lossy(&out.stdout).to_string();
    let pid = top
        .lines()
        .find(|l| l.contains("x11vnc") && l.contains("vnc.sock"))
        .and_then(|l| l.split_whitespace().next())
        .context("x11vnc in the container")?
        .to_string();
    let socket = format!("/proc/{pid}/root/run/computerd-desktop/vnc.sock");
    let port = computerd_tests::free_port();
    let child = std::process::Command::new("websockify")
        .arg(format!("--unix-target={socket}"))
        .arg(format!("127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("websockify (apt-get install websockify)")?;
    let _websockify = Websockify(child);
    let base_url = format!("ws://127.0.0.1:{port}/");
    let until = Instant::now() + Duration::from_secs(20);
    let mut base = loop {
        match Viewer::connect(&base_url, "none").await {
            Ok(v) => break v,
            Err(_) if Instant::now() < until => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => bail!("websockify did not answer: {e:?}"),
        }
    };
    let bytes = u64::from(ours.width) * u64::from(ours.height) * 4;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for i in 0..frames + 5 {
        let t = Instant::now();
        let p = ours.update().await;
        let ours_t = t.elapsed();
        let t = Instant::now();
        let q = base.update().await;
        let base_t = t.elapsed();
        if p * 4 != bytes || q * 4 != bytes {
            bail!("a partial frame: {p} and {q} pixels");
        }
        if i >= 5 {
            a.push(ours_t);
            b.push(base_t);
        }
    }
    let mbps = |v: &[Duration]| (bytes as f64 * v.len() as f64) / v.iter().sum::<Duration>().as_secs_f64() / 1e6;
    let p50 = |v: &mut Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let (ours_mbps, base_mbps) = (mbps(&a), mbps(&b));
    println!(
        "stream-bench: {frames} full raw frames of {}x{} ({bytes} bytes) each way, in turn",
        ours.width, ours.height
    );
    println!("{:<44} {:>10} {:>12}", "", "MB/s", "p50 ms/frame");
    println!("{:<44} {:>10.1} {:>12.2}", "computerd (node -> link -> agent -> x11vnc)", ours_mbps, p50(&mut a));
    println!("{:<44} {:>10.1} {:>12.2}", "websockify (host -> x11vnc socket)", base_mbps, p50(&mut b));
    println!("computerd/websockify throughput: {:.2}x (goal >= 2x)", ours_mbps / base_mbps);
    ours.close().await;
    base.close().await;
    Ok(())
}
