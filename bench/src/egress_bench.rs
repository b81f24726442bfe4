//! egress-bench: what a Computer's egress policy costs its sandbox's connections. The same
//! client, in the same sandbox image, fetches from the same server on this machine two ways,
//! alternating, in one run:
//!
//! - **direct**: a container on a bridge network with nothing of ours on the path, the floor;
//! - **egress**: a container sharing the network namespace of an egress gateway started as the
//!   docker provider starts it (`computer-agent egress-gateway serve`, `NET_ADMIN` and `NET_RAW`,
//!   0.5 CPU, 128 MiB), with `{"default": "deny", "allow": ["bench.test"]}`: each connection is
//!   redirected to the gateway's proxy, which reads the request's `Host`, decides, resolves the
//!   name and connects.
//!
//! Measured inside the containers by Python: a new TCP connection (`connect`), a new connection
//! carrying one small `GET` to its answer (`request`: what a client waits for), and the
//! throughput of a 256 MiB download. The goal (issue 41): at most +1 ms at p50 to connect, and no
//! change in throughput.
//!
//! ```text
//! cargo build --release -p computer-agent && cargo build --release -p computerd-bench --bin egress-bench &&
//!   target/release/egress-bench
//! ```
//!
//! Needs Docker, root, and the sandbox image (`deploy/build-sandbox-image.sh`, with iptables).
//! `BENCH_SAMPLES` (default 1000; 200 with `BENCH_QUICK=1`) connections of each kind, in five
//! alternating rounds, after 50 of each not counted; `BENCH_GATEWAY_CPUS` (default 0.5, the
//! provider's) the gateway's CPUs; `AGENT_BIN` as in the other benches.

use std::process::Command;
use std::process::Stdio;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::settings;
use computerd_tests::docker::IMAGE;
use serde_json::Value;

/// The server on this machine: `GET /` answers 2 bytes; `GET /big` 256 MiB.
const SERVER: &str = r#"
import http.server, sys, threading
CHUNK = bytes(1 << 20)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        n = 256 if self.path == "/big" else 0
        self.send_response(200)
        self.send_header("Content-Length", str(n << 20 if n else 2))
        self.end_headers()
        if n:
            for _ in range(n): self.wfile.write(CHUNK)
        else:
            self.wfile.write(b"ok")
s = http.server.ThreadingHTTPServer(("0.0.0.0", 0), H)
s.daemon_threads = True
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// The client in a container: `latency N PORT` prints `{"connect": [ms…], "request": [ms…]}`;
/// `throughput PORT` prints MB/s of one 256 MiB download.
const CLIENT: &str = r#"
import json, socket, sys, time
mode, port = sys.argv[1], int(sys.argv[-1])
def fetch(path):
    s = socket.create_connection(("bench.test", port))
    s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: bench.test\r\nConnection: close\r\n\r\n")
    n = 0
    while True:
        b = s.recv(1 << 20)
        if not b: break
        n += len(b)
    s.close()
    return n
if mode == "latency":
    out = {"connect": [], "request": []}
    for _ in range(int(sys.argv[2])):
        t0 = time.perf_counter()
        s = socket.create_connection(("bench.test", port))
        out["connect"].append((time.perf_counter() - t0) * 1000)
        s.close()
        t0 = time.perf_counter()
        fetch(b"/")
        out["request"].append((time.perf_counter() - t0) * 1000)
    print(json.dumps(out))
else:
    t0 = time.perf_counter()
    n = fetch(b"/big")
    print(json.dumps({"mbps": n / (time.perf_counter() - t0) / 1e6, "bytes": n}))
"#;

fn docker(args: &[&str]) -> Result<String> {
    let out = Command::new("docker").args(args).output().context("docker")?;
    if !out.status.success() {
        bail!("docker {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// What the run made, removed on drop.
struct Made {
    containers: Vec<String>,
    network: String,
    server: Option<std::process::Child>,
}

impl Drop for Made {
    fn drop(&mut self) {
        for c in self.containers.iter().rev() {
            let _ = Command::new("docker").args(["rm", "-f", c]).output();
        }
        let _ = Command::new("docker").args(["network", "rm", &self.network]).output();
        if let Some(s) = &mut self.server {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[i.clamp(1, v.len()) - 1]
}

fn main() -> Result<()> {
    let quick = settings::quick();
    let samples = settings::env_count("BENCH_SAMPLES")?.unwrap_or(if quick { 200 } else { 1000 });
    let agent = std::fs::canonicalize(settings::agent_bin()?).context("the agent binary")?;
    let agent = agent.to_string_lossy();
    let tag = std::process::id();
    let mut made = Made { containers: Vec::new(), network: format!("egress-bench-{tag}"), server: None };
    docker(&["network", "create", &made.network])?;
    let host = docker(&["network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", &made.network])?;

    let mut server = Command::new("python3")
        .args(["-c", SERVER])
        .stdout(Stdio::piped())
        .spawn()
        .context("python3 for the server")?;
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(server.stdout.take().context("stdout")?), &mut line)?;
    made.server = Some(server);
    let port: u16 = line.trim().parse().context("the server's port")?;

    let mount = format!("{agent}:/usr/local/bin/computer-agent:ro");
    let add_host = format!("bench.test:{host}");
    // Both containers: on the bench's network, naming the server, with no capabilities but
    // those added.
    let network = made.network.clone();
    let run = |name: &str, rest: &[&str]| -> Result<String> {
        let mut args = vec!["run", "-d", "--name", name, "--network", &network, "--add-host", &add_host];
        args.extend(["--cap-drop", "ALL"]);
        args.extend(rest);
        docker(&args)
    };
    let direct = format!("egress-bench-direct-{tag}");
    made.containers.push(direct.clone());
    run(&direct, &[IMAGE, "sleep", "infinity"])?;
    let gateway = format!("egress-bench-gateway-{tag}");
    made.containers.push(gateway.clone());
    let cpus = std::env::var("BENCH_GATEWAY_CPUS").unwrap_or_else(|_| "0.5".into());
    let config = format!(r#"COMPUTERD_EGRESS_CONFIG={{"link":[],"hosts":{{"bench.test":"{host}"}}}}"#);
    run(
        &gateway,
        &[
            "--cap-add",
            "NET_ADMIN",
            "--cap-add",
            "NET_RAW",
            "--cpus",
            &cpus,
            "--memory",
            "128m",
            "--pids-limit",
            "64",
            "--security-opt",
            "no-new-privileges",
            "-e",
            &config,
            "-v",
            &mount,
            IMAGE,
            "/usr/local/bin/computer-agent",
            "egress-gateway",
            "serve",
        ],
    )?;
    let policy = r#"{"default":"deny","allow":["bench.test"]}"#;
    docker(&["exec", &gateway, "/usr/local/bin/computer-agent", "egress-gateway", "set", policy])?;
    let behind = format!("egress-bench-egress-{tag}");
    made.containers.push(behind.clone());
    docker(&[
        "run",
        "-d",
        "--name",
        &behind,
        "--network",
        &format!("container:{gateway}"),
        "--cap-drop",
        "ALL",
        IMAGE,
        "sleep",
        "infinity",
    ])?;

    let port_s = port.to_string();
    let run = |container: &str, args: &[&str]| -> Result<Value> {
        let mut all = vec!["exec", container, "python3", "-c", CLIENT];
        all.extend_from_slice(args);
        all.push(&port_s);
        serde_json::from_str(&docker(&all)?).context("the client's answer")
    };
    // Warm-up (not counted), then five alternating rounds.
    for c in [&direct, &behind] {
        run(c, &["latency", "50"])?;
    }
    let (mut conn, mut req) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let per_round = (samples / 5).max(1).to_string();
    for _ in 0..5 {
        for (i, c) in [&direct, &behind].into_iter().enumerate() {
            let v = run(c, &["latency", &per_round])?;
            let ms = |k: &str| v[k].as_array().into_iter().flatten().filter_map(Value::as_f64).collect::<Vec<f64>>();
            conn[i].extend(ms("connect"));
            req[i].extend(ms("request"));
        }
    }
    let mut mbps = [Vec::new(), Vec::new()];
    for _ in 0..3 {
        for (i, c) in [&direct, &behind].into_iter().enumerate() {
            let v = run(c, &["throughput"])?;
            // (The count includes the answer's head.)
            if v["bytes"].as_u64().is_none_or(|n| n < 256 << 20) {
                bail!("a download came short: {v}");
            }
            mbps[i].push(v["mbps"].as_f64().unwrap_or(0.0));
        }
    }

    println!("egress-bench: {} connections of each kind, load {}", conn[0].len(), computerd_bench::report::loadavg());
    println!("{:<28} {:>10} {:>10} {:>10}", "", "direct", "egress", "egress - direct");
    for p in [50.0, 99.0] {
        for (what, v) in [("connect", &mut conn), ("request", &mut req)] {
            let (a, b) = (percentile(&mut v[0], p), percentile(&mut v[1], p));
            println!("{:<28} {a:>10.3} {b:>10.3} {:>+10.3}", format!("{what} p{p} (ms)"), b - a);
        }
    }
    let (a, b) = (percentile(&mut mbps[0], 50.0), percentile(&mut mbps[1], 50.0));
    println!("{:<28} {a:>10.0} {b:>10.0} {:>9.2}x", "throughput median (MB/s)", b / a);
    println!("goal: request p50 at most +1 ms; throughput 1.0x (no change)");
    Ok(())
}
