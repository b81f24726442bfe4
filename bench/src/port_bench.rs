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
    sandbox::main(run)
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
    let (oc, xc, sc) = (client()?, client()?, client()?);
    let (mut d, mut p, mut o, mut x, mut s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..samples + 100 {
        let t1 = get(&a, &direct_url, None).await.context("direct")?;
        let t2 = get(&b, &proxied_url, Some(&host)).await.context("proxied")?;
        let t3 = get(&oc, &owner_url, Some(&host)).await.context("owner node")?;
        let t4 = get(&xc, &other_url, Some(&host)).await.context("other node")?;
        let t5 = get(&sc, &straight_url, None).await.context("straight")?;
        if i >= 100 {
            d.push(t1);
            p.push(t2);
            o.push(t3);
            x.push(t4);
            s.push(t5);
        }
    }
    for v in [&mut d, &mut p, &mut o, &mut x, &mut s] {
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
    let ratio = percentile_ms(&p, 0.5) / percentile_ms(&d, 0.5);
    println!(
        "proxied/direct p50: {ratio:.2}x (goal <= 1.5x); p99: {:.2}x",
        percentile_ms(&p, 0.99) / percentile_ms(&d, 0.99)
    );
    Ok(())
}
