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
//! Two more paths bound what any proxy could do here: **a one-hop relay** in this process (each
//! read of the source's socket one WebSocket message to the viewer, nothing else: no ticket, no
//! link, no agent, no filter), once with tokio-tungstenite (as the node's WebSockets are; reads
//! of 64 KiB: with 1 MiB it was several times slower, as tungstenite moves what a socket did
//! not take to the front of its buffer after each write) and once with frames written by hand
//! (reads of 1 MiB, the header before the payload in the read buffer, one write, no copy).
//! computerd's path has every part of a relay and more, so its throughput cannot exceed the
//! faster relay's.
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
    println!(
        "computerd/websockify throughput from x11vnc: {:.2}x (at the median frame {:.2}x)",
        real.ratio(),
        real.median_ratio()
    );
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
    println!(
        "computerd/websockify throughput from the synthetic source: {:.2}x (at the median frame {:.2}x; goal >= 2x)",
        synthetic.ratio(),
        synthetic.median_ratio()
    );
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
    relay: Vec<Duration>,
    hand: Vec<Duration>,
}

impl Figures {
    fn mbps(&self, v: &[Duration]) -> f64 {
        (self.bytes as f64 * v.len() as f64) / v.iter().sum::<Duration>().as_secs_f64() / 1e6
    }

    fn ratio(&self) -> f64 {
        self.mbps(&self.ours) / self.mbps(&self.base)
    }

    fn relay_ratio(&self) -> f64 {
        self.mbps(&self.relay) / self.mbps(&self.base)
    }

    fn hand_ratio(&self) -> f64 {
        self.mbps(&self.hand) / self.mbps(&self.base)
    }

    /// computerd's throughput against websockify's at the median frame: unlike the means, not
    /// moved by one stalled frame (as websockify shows from x11vnc with four viewers).
    fn median_ratio(&self) -> f64 {
        at(&self.base, 0.5) / at(&self.ours, 0.5)
    }

    fn print(&self, source: &str) {
        println!(
            "stream-bench from {source}: {} full raw frames of {}x{} ({} bytes) each way, in turn",
            self.frames, self.width, self.height, self.bytes
        );
        println!("{:<44} {:>10} {:>14} {:>14}", "", "MB/s", "p50 ms/frame", "p99 ms/frame");
        let rows = [
            ("computerd (node -> link -> agent -> source)", &self.ours),
            ("websockify (host -> the source's socket)", &self.base),
            ("one-hop relay, tokio-tungstenite", &self.relay),
            ("one-hop relay, frames by hand", &self.hand),
        ];
        for (name, v) in rows {
            println!("{name:<44} {:>10.1} {:>14.2} {:>14.2}", self.mbps(v), at(v, 0.5), at(v, 0.99));
        }
        println!(
            "against websockify: computerd {:.2}x, relay (tungstenite) {:.2}x, relay (by hand) {:.2}x; \
             computerd at the median frame {:.2}x",
            self.ratio(),
            self.relay_ratio(),
            self.hand_ratio(),
            self.median_ratio()
        );
    }
}

/// The `q` quantile of `v`, in milliseconds.
fn at(v: &[Duration], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e3
}

/// Reads `frames` full frames (after 5 not counted) through computerd's stream and through
/// websockify on this host, in turn, from the Computer's VNC server as it is now.
async fn phase(c: &TestCluster, id: &str, container: &str, frames: usize) -> Result<Figures> {
    let ws_url = c.url(1, &format!("/v1/computers/{id}/desktop/websockify")).replacen("http", "ws", 1);
    // The first stream (re)starts the Computer's VNC server: a stream that ends before the
    // handshake (the server not listening yet) is opened again, with a new ticket.
    let until = Instant::now() + Duration::from_secs(20);
    let mut ours = loop {
        let (url, ck) = (ws_url.clone(), cookie(c, id).await?);
        match tokio::spawn(async move { Viewer::connect(&url, &ck).await }).await {
            Ok(Ok(v)) => break v,
            _ if Instant::now() < until => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(Err(e)) => bail!("the stream did not open: {e:?}"),
            Err(e) => bail!("the stream did not open: {e}"),
        }
    };
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
    let relay_addr = relay(socket.clone()).await?;
    let mut third =
        Viewer::connect(&format!("ws://{relay_addr}/"), "none").await.map_err(|e| anyhow::anyhow!("relay: {e:?}"))?;
    let hand_addr = hand_relay(socket.clone()).await?;
    let mut fourth =
        Viewer::connect(&format!("ws://{hand_addr}/"), "none").await.map_err(|e| anyhow::anyhow!("relay: {e:?}"))?;
    let (ours_w, ours_h) = (ours.width, ours.height);
    let bytes = u64::from(ours.width) * u64::from(ours.height) * 4;
    let (mut a, mut b, mut r, mut h) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..frames + 5 {
        let t = Instant::now();
        let p = ours.update().await;
        let ours_t = t.elapsed();
        let t = Instant::now();
        let q = base.update().await;
        let base_t = t.elapsed();
        let t = Instant::now();
        let x = third.update().await;
        let relay_t = t.elapsed();
        let t = Instant::now();
        let y = fourth.update().await;
        let hand_t = t.elapsed();
        if [p, q, x, y].iter().any(|n| n * 4 != bytes) {
            bail!("a partial frame: {p}, {q}, {x} and {y} pixels");
        }
        if i >= 5 {
            a.push(ours_t);
            b.push(base_t);
            r.push(relay_t);
            h.push(hand_t);
        }
    }
    ours.close().await;
    base.close().await;
    third.close().await;
    fourth.close().await;
    Ok(Figures { frames, width: ours_w, height: ours_h, bytes, ours: a, base: b, relay: r, hand: h })
}

/// The one-hop relay: a WebSocket listener on a free port of this host whose one connection is
/// joined to the source's socket (64 KiB reads, each one message; the viewer's messages written
/// through as they come).
async fn relay(socket: String) -> Result<String> {
    use futures::SinkExt;
    use futures::StreamExt;
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;
    use tokio_tungstenite::tungstenite::Message;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        let Ok((tcp, _)) = listener.accept().await else { return };
        let _ = tcp.set_nodelay(true);
        // (The callback's error type is tungstenite's, large as it is.)
        #[allow(clippy::result_large_err)]
        let pick = |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
                    mut resp: tokio_tungstenite::tungstenite::handshake::server::Response| {
            if req.headers().contains_key("sec-websocket-protocol") {
                resp.headers_mut().insert("sec-websocket-protocol", "binary".parse().expect("a header value"));
            }
            Ok(resp)
        };
        let (Ok(ws), Ok(unix)) =
            (tokio_tungstenite::accept_hdr_async(tcp, pick).await, tokio::net::UnixStream::connect(&socket).await)
        else {
            return;
        };
        let (mut to_viewer, mut from_viewer) = ws.split();
        let (mut from_source, mut to_source) = unix.into_split();
        let down = async move {
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = from_source.read(&mut buf).await {
                if n == 0 || to_viewer.send(Message::Binary(bytes::Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                    break;
                }
            }
        };
        let up = async move {
            while let Some(Ok(m)) = from_viewer.next().await {
                if let Message::Binary(b) = m
                    && to_source.write_all(&b).await.is_err()
                {
                    break;
                }
            }
        };
        tokio::join!(down, up);
    });
    Ok(addr)
}

/// The one-hop relay with frames by hand: the upgrade answered from the request's key, each read
/// of the source (1 MiB at most) sent as one binary frame whose header sits just before it in
/// the buffer (one write, no copy), and the viewer's masked frames unmasked to the source.
async fn hand_relay(socket: String) -> Result<String> {
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        let Ok((mut tcp, _)) = listener.accept().await else { return };
        let _ = tcp.set_nodelay(true);
        // The upgrade request, to its blank line (a WebSocket client sends nothing more before
        // it is answered).
        let mut head = Vec::new();
        let mut b = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match tcp.read(&mut b).await {
                Ok(n) if n > 0 && head.len() < 16 * 1024 => head.extend_from_slice(&b[..n]),
                _ => return,
            }
        }
        let text = String::from_utf8_lossy(&head).to_string();
        let key = text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case("sec-websocket-key").then(|| v.trim().to_string())
        });
        let Some(key) = key else { return };
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: binary\r\n\r\n"
        );
        let Ok(unix) = tokio::net::UnixStream::connect(&socket).await else { return };
        if tcp.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
        let (mut from_viewer, mut to_viewer) = tcp.into_split();
        let (mut from_source, mut to_source) = unix.into_split();
        let down = async move {
            let mut buf = vec![0u8; 10 + (1 << 20)];
            loop {
                let n = match from_source.read(&mut buf[10..]).await {
                    Ok(n) if n > 0 => n,
                    _ => break,
                };
                let start = if n < 126 {
                    buf[9] = n as u8;
                    8
                } else if n < 65536 {
                    buf[7] = 126;
                    buf[8..10].copy_from_slice(&(n as u16).to_be_bytes());
                    6
                } else {
                    buf[1] = 127;
                    buf[2..10].copy_from_slice(&(n as u64).to_be_bytes());
                    0
                };
                buf[start] = 0x82;
                if to_viewer.write_all(&buf[start..10 + n]).await.is_err() {
                    break;
                }
            }
        };
        let up = async move {
            loop {
                let mut h = [0u8; 2];
                if from_viewer.read_exact(&mut h).await.is_err() {
                    break;
                }
                let mut len = u64::from(h[1] & 0x7f);
                if len == 126 {
                    let mut e = [0u8; 2];
                    if from_viewer.read_exact(&mut e).await.is_err() {
                        break;
                    }
                    len = u64::from(u16::from_be_bytes(e));
                } else if len == 127 {
                    let mut e = [0u8; 8];
                    if from_viewer.read_exact(&mut e).await.is_err() {
                        break;
                    }
                    len = u64::from_be_bytes(e);
                }
                let mut mask = [0u8; 4];
                if h[1] & 0x80 != 0 && from_viewer.read_exact(&mut mask).await.is_err() {
                    break;
                }
                if len > 1 << 20 {
                    break;
                }
                let mut p = vec![0u8; len as usize];
                if from_viewer.read_exact(&mut p).await.is_err() {
                    break;
                }
                for (i, b) in p.iter_mut().enumerate() {
                    *b ^= mask[i % 4];
                }
                match h[0] & 0x0f {
                    0x8 => break,
                    0x0 | 0x2 if to_source.write_all(&p).await.is_err() => break,
                    _ => {}
                }
            }
        };
        tokio::join!(down, up);
    });
    Ok(addr)
}
