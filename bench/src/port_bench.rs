//! port-bench: what a public port address costs. A 64 KiB answer of a Python `http.server` in a
//! real Docker sandbox, fetched through HAProxy two ways, alternating, in the same run:
//!
//! - **direct**: HAProxy straight to the sandbox's `127.0.0.1:<port>` (the test sandboxes share
//!   the host's network), the baseline;
//! - **proxied**: the same HAProxy config in front of a 3-node cluster, with the address's
//!   `Host` (`<port>-<label>.localhost`): a node looks the address up, checks the exposer's
//!   rights, and tunnels the request through the owner's agent link to the port. HAProxy sends
//!   the address to the node its last answer named as holding the link
//!   (`X-Computerd-Link-Node`), as `deploy/haproxy.cfg` does.
//!
//! Each client keeps its connection to HAProxy alive. The goal: proxied p50 at most 1.5x direct.
//!
//! A third way bounds what any design could reach: **the floor**, the same HAProxy in front of
//! two byte relays in series (this binary run with `--relay-to`, each a process of its own on a
//! tokio runtime, copying 64 KiB at a time), where the node and the agent are. It does nothing
//! they must: no HTTP, no address lookup, no rights, no WebSocket, no tunnel. A proxy through a
//! node and an agent cannot be faster than it.
//!
//! ```text
//! cargo build --release -p computerd-node --bin computerd && cargo build --release -p computer-agent &&
//!   cargo build --release -p computerd-bench --bin port-bench && target/release/port-bench
//! ```
//!
//! `BENCH_SAMPLES` (default 2000; 300 with `BENCH_QUICK=1`) requests of each kind, after 100 of
//! each not counted; `COMPUTERD_BIN` and `AGENT_BIN` as in the other benches.

use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::report::percentile_ms;
use computerd_bench::sandbox;
use computerd_bench::sandbox::call;
use computerd_bench::settings;
use computerd_tests::TestCluster;
use computerd_tests::docker::IMAGE;
use computerd_tests::lb::Haproxy;
use serde_json::json;

const SERVER: &str = include_str!("../../tests/fixtures/port_server.py");

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, target] = args.as_slice()
        && flag == RELAY
    {
        return relay(target);
    }
    sandbox::main(run)
}

/// The argument that runs this binary as a byte relay (see [`relay`]).
const RELAY: &str = "--relay-to";

/// A byte relay in a process of its own, a floor for any design with two more processes on the
/// path than HAProxy's: each connection accepted (on `127.0.0.1`, a free port printed on stdout)
/// is copied both ways to `target`, 64 KiB at a time, on a tokio runtime as computerd's own,
/// with nothing else: no HTTP, no WebSocket, no tunnel, no check.
fn relay(target: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("{}", listener.local_addr()?);
        use std::io::Write;
        std::io::stdout().flush()?;
        loop {
            let (mut from, _) = listener.accept().await?;
            let target = target.to_string();
            tokio::spawn(async move {
                let Ok(mut to) = tokio::net::TcpStream::connect(&target).await else { return };
                let _ = (from.set_nodelay(true), to.set_nodelay(true));
                let _ = tokio::io::copy_bidirectional_with_sizes(&mut from, &mut to, 64 << 10, 64 << 10).await;
            });
        }
    })
}

/// A relay process ([`relay`]), killed when dropped.
struct Relay {
    child: std::process::Child,
    /// `127.0.0.1:port` it listens on.
    addr: String,
}

impl Relay {
    /// A relay process to `target`.
    fn start(target: &str) -> Result<Relay> {
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args([RELAY, target])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("start a relay")?;
        let out = child.stdout.take().context("the relay's stdout")?;
        let mut addr = String::new();
        std::io::BufReader::new(out).read_line(&mut addr)?;
        let addr = addr.trim().to_string();
        let relay = Relay { child, addr };
        if relay.addr.is_empty() {
            bail!("the relay did not start");
        }
        Ok(relay)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn run(agent: std::path::PathBuf) -> Result<()> {
    let samples: usize = std::env::var("BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if settings::quick() { 300 } else { 2000 });
    computerd_tests::docker::ensure_sandbox_image();
    let c = TestCluster::start(3).await;
    let id = sandbox::create(&c, &agent, IMAGE, 512, false).await?;
    let result = measure(&c, &id, samples).await;
    sandbox::remove(&c, &id).await;
    result
}

async fn measure(c: &TestCluster, id: &str, samples: usize) -> Result<()> {
    computerd_tests::agent::wait_state(c, id, "running").await;
    let port = computerd_tests::free_port();
    call(
        c,
        reqwest::Method::PUT,
        &format!("/v1/computers/{id}/files?path=server.py"),
        Some(json!({"content": SERVER})),
    )
    .await?;
    let start = json!({"command": format!("exec python3 server.py {port}"), "yieldTimeMs": 300});
    call(c, reqwest::Method::POST, &format!("/v1/computers/{id}/sessions"), Some(start)).await?;
    let v = call(c, reqwest::Method::PUT, &format!("/v1/computers/{id}/ports/{port}"), Some(json!({}))).await?;
    let url = v["url"].as_str().context("url")?;
    let host = url.trim_start_matches("http://").split(':').next().context("host")?.to_string();

    let dir = tempfile::tempdir()?;
    let (d1, d2) = (dir.path().join("direct"), dir.path().join("nodes"));
    std::fs::create_dir_all(&d1)?;
    std::fs::create_dir_all(&d2)?;
    let direct = Haproxy::start(&d1, &[format!("127.0.0.1:{port}")]).await;
    // The floor: two relays in series where the node and the agent are.
    let agent_side = Relay::start(&format!("127.0.0.1:{port}"))?;
    let node_side = Relay::start(&agent_side.addr)?;
    let d3 = dir.path().join("floor");
    std::fs::create_dir_all(&d3)?;
    let floor = Haproxy::start(&d3, std::slice::from_ref(&node_side.addr)).await;
    let floor_url = floor.url("/big");
    let nodes = Haproxy::start(&d2, &c.nodes.values().map(|n| n.http.clone()).collect::<Vec<_>>()).await;
    let client = || reqwest::Client::builder().pool_max_idle_per_host(1).timeout(Duration::from_secs(30)).build();
    let (a, b) = (client()?, client()?);
    let (direct_url, proxied_url) = (direct.url("/big"), nodes.url("/big"));
    let get = |cl: &reqwest::Client, url: &str, host: Option<&str>| {
        let mut r = cl.get(url);
        if let Some(h) = host {
            r = r.header("host", h);
        }
        let sent = r.send();
        async move {
            let t = Instant::now();
            let resp = sent.await?;
            let status = resp.status();
            let body = resp.bytes().await?;
            if status != 200 || body.len() != 64 * 1024 {
                bail!("HTTP {status}, {} bytes", body.len());
            }
            Ok::<_, anyhow::Error>(t.elapsed().as_micros() as u64)
        }
    };
    // The service up, both ways.
    let until = Instant::now() + Duration::from_secs(30);
    while get(&b, &proxied_url, Some(&host)).await.is_err() {
        if Instant::now() > until {
            bail!("the service did not answer through its address");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Where the time goes (shown, not the goal): straight to the node holding the link, and to
    // one that does not (no balancer in front).
    let (_, cv) = c.call(reqwest::Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    let owner = cv["linkNode"].as_u64().context("linkNode")?;
    let other = c.nodes.keys().copied().find(|n| *n != owner).context("another node")?;
    let owner_url = format!("http://{}/big", c.nodes[&owner].http);
    let other_url = format!("http://{}/big", c.nodes[&other].http);
    let straight_url = format!("http://127.0.0.1:{port}/big");
    let (oc, xc, sc, fc) = (client()?, client()?, client()?, client()?);
    let (mut d, mut p, mut o, mut x, mut s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut f = Vec::new();
    for i in 0..samples + 100 {
        let t1 = get(&a, &direct_url, None).await.context("direct")?;
        let t2 = get(&b, &proxied_url, Some(&host)).await.context("proxied")?;
        let t3 = get(&oc, &owner_url, Some(&host)).await.context("owner node")?;
        let t4 = get(&xc, &other_url, Some(&host)).await.context("other node")?;
        let t5 = get(&sc, &straight_url, None).await.context("straight")?;
        let t6 = get(&fc, &floor_url, None).await.context("relays")?;
        if i >= 100 {
            f.push(t6);
            d.push(t1);
            p.push(t2);
            o.push(t3);
            x.push(t4);
            s.push(t5);
        }
    }
    for v in [&mut d, &mut p, &mut o, &mut x, &mut s, &mut f] {
        v.sort_unstable();
    }
    println!("port-bench: GET of a 64 KiB answer, {samples} each, in turn");
    println!("{:<46} {:>9} {:>9}", "", "p50 ms", "p99 ms");
    let row =
        |name: &str, v: &[u64]| println!("{name:<46} {:>9.3} {:>9.3}", percentile_ms(v, 0.5), percentile_ms(v, 0.99));
    row("direct (HAProxy -> sandbox port)", &d);
    row("proxied (HAProxy -> node -> link -> port)", &p);
    row("  no balancer: the node holding the link", &o);
    row("  no balancer: a node without the link", &x);
    row("  no balancer: the sandbox port itself", &s);
    row("floor (HAProxy -> relay -> relay -> port)", &f);
    let ratio = percentile_ms(&p, 0.5) / percentile_ms(&d, 0.5);
    println!(
        "proxied/direct p50: {ratio:.2}x (goal <= 1.5x); p99: {:.2}x",
        percentile_ms(&p, 0.99) / percentile_ms(&d, 0.99)
    );
    println!(
        "floor/direct p50: {:.2}x (two byte relays, processes of their own, where the node and the agent are)",
        percentile_ms(&f, 0.5) / percentile_ms(&d, 0.5)
    );
    Ok(())
}
