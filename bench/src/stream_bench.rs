//! stream-bench: a person's desktop stream, full-screen raw frames (1280x800, 4 MB each) from
//! the same VNC server in a real Docker desktop sandbox, read two ways in turn:
//!
//! - **computerd**: the stream's WebSocket on the node (ticket, cookie), the byte tunnel through
//!   the agent's link, the agent's RFB filter, the server's socket;
//! - **websockify** (Debian's, the baseline): on this host, straight to the same socket (reached
//!   as root through `/proc/<server>/root`), with no link and no filter.
//!
//! Each frame is a non-incremental FramebufferUpdateRequest of the whole screen, read to its
//! last byte (the scripted RFB client of the tests). Two phases: from x11vnc (what a person
//! gets; x11vnc's own time per frame bounds both paths), then from a synthetic RFB server that
//! answers from memory (`bench/fixtures/rfb_source.py`, installed in the Computer in x11vnc's
//! place), which measures what the two paths add. The goal: computerd's throughput at least 2x
//! websockify's.
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
    let container = computerd_tests::docker::containers_of(id).into_iter().next().context("the container")?;
    // The first stream starts x11vnc in the Computer.
    let real = phase(c, id, &container, frames).await?;
    real.print("x11vnc");
    println!("computerd/websockify throughput from x11vnc: {:.2}x", real.ratio());
    // The synthetic source takes x11vnc's place: installed ahead of it in the agent's PATH, it
    // is what the agent starts once x11vnc is gone.
    let pid = source_pid(&container)?;
    let mut install = std::process::Command::new("docker")
        .args(["exec", "-i", "-u", "0", &container, "sh", "-c"])
        .arg("cat > /usr/local/bin/x11vnc && chmod 755 /usr/local/bin/x11vnc")
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        let mut stdin = install.stdin.take().context("stdin")?;
        stdin.write_all(include_bytes!("../fixtures/rfb_source.py"))?;
    }
    if !install.wait()?.success() {
        bail!("cannot install the synthetic source");
    }
    if !std::process::Command::new("kill").args(["-9", &pid]).status()?.success() {
        bail!("cannot stop x11vnc ({pid})");
    }
    let synthetic = phase(c, id, &container, frames).await?;
    synthetic.print("a synthetic RFB source (bench/fixtures/rfb_source.py)");
    println!("computerd/websockify throughput from the synthetic source: {:.2}x (goal >= 2x)", synthetic.ratio());
    Ok(())
}

/// The host pid of the Computer's VNC server (x11vnc, or the synthetic source in its place).
fn source_pid(container: &str) -> Result<String> {
    let out = std::process::Command::new("docker").args(["top", container, "-eo", "pid,args"]).output()?;
    let top = String::from_utf8_lossy(&out.stdout).to_string();
    let pid = top
        .lines()
        .find(|l| l.contains("x11vnc") && l.contains("vnc.sock"))
        .and_then(|l| l.split_whitespace().next())
        .context("a VNC server in the container")?;
    Ok(pid.to_string())
}

/// One phase's figures.
struct Figures {
    frames: usize,
    width: u16,
    height: u16,
    bytes: u64,
    ours: Vec<Duration>,
    base: Vec<Duration>,
}

impl Figures {
    fn mbps(&self, v: &[Duration]) -> f64 {
        (self.bytes as f64 * v.len() as f64) / v.iter().sum::<Duration>().as_secs_f64() / 1e6
    }

    fn ratio(&self) -> f64 {
        self.mbps(&self.ours) / self.mbps(&self.base)
    }

    fn print(&self, source: &str) {
        let p50 = |v: &[Duration]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            v[v.len() / 2].as_secs_f64() * 1e3
        };
        println!(
            "stream-bench from {source}: {} full raw frames of {}x{} ({} bytes) each way, in turn",
            self.frames, self.width, self.height, self.bytes
        );
        println!("{:<44} {:>10} {:>12}", "", "MB/s", "p50 ms/frame");
        let (ours, base) = (&self.ours, &self.base);
        println!("{:<44} {:>10.1} {:>12.2}", "computerd (node -> link -> agent -> source)", self.mbps(ours), p50(ours));
        println!("{:<44} {:>10.1} {:>12.2}", "websockify (host -> the source's socket)", self.mbps(base), p50(base));
    }
}

/// Reads `frames` full frames (after 5 not counted) through computerd's stream and through
/// websockify on this host, in turn, from the Computer's VNC server as it is now.
async fn phase(c: &TestCluster, id: &str, container: &str, frames: usize) -> Result<Figures> {
    let ws_url = c.url(1, &format!("/v1/computers/{id}/desktop/websockify")).replacen("http", "ws", 1);
    let mut ours = Viewer::connect(&ws_url, &cookie(c, id).await?).await.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    // The same server's socket, from this host.
    let pid = source_pid(container)?;
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
    let (ours_w, ours_h) = (ours.width, ours.height);
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
    ours.close().await;
    base.close().await;
    Ok(Figures { frames, width: ours_w, height: ours_h, bytes, ours: a, base: b })
}
