//! Real `computerd` node processes for tests and benchmarks.
//!
//! Addresses: each cluster gets its own loopback block `127.B.C.0` (B.C from the process id and
//! a counter, so concurrent test processes differ); node `id` listens for HTTP and gRPC on
//! `127.B.C.(10+id)`, on free ports, and dials its peers from that address
//! (`--peer-source-ip`), so [`crate::netfault`] can cut node-to-node traffic while clients on
//! 127.0.0.1 still reach every node.

use std::collections::BTreeMap;
use std::fs;
use std::net::IpAddr;
use std::net::Ipv4Addr;
use std::net::TcpListener;
use std::path::Path;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde_json::Value;
use serde_json::json;

use crate::wait::wait_for;

/// The `computerd` binary, built once per test process (a no-op when it is up to date).
pub fn computerd_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var("COMPUTERD_BIN") {
        Ok(p) => PathBuf::from(p),
        Err(_) => build_bin("computerd-node", "computerd"),
    })
    .clone()
}

/// Builds `bin` of the workspace's `package` (debug; a no-op when it is up to date) and answers
/// its path.
pub fn build_bin(package: &str, bin: &str) -> PathBuf {
    build_bin_with(package, bin, &[])
}

/// [`build_bin`] with cargo `features` of the package (only `bin` is linked: the package's
/// other binaries stay as they are).
pub fn build_bin_with(package: &str, bin: &str, features: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut args = vec!["build", "-q", "-p", package, "--bin", bin];
    let features = features.join(",");
    if !features.is_empty() {
        args.extend(["--features", features.as_str()]);
    }
    let status = Command::new(cargo).args(&args).current_dir(&root).status().expect("run cargo build");
    assert!(status.success(), "building {bin} failed");
    let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| root.join("target"));
    target.join("debug").join(bin)
}

/// A free loopback port (bound, read, released).
pub fn free_port() -> u16 {
    free_port_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// A free port on `ip` (bound, read, released), drawn at random below the kernel's ephemeral
/// range. A port the kernel hands out for `bind(0)` is one it may hand out again at once: to an
/// outgoing connection, or to a wildcard listener of another test (Docker's published ports, a
/// Chromium) that then holds it on every address before the node binds it. Below the range only
/// an explicit choice takes a port, and each cluster chooses on its own loopback address.
pub fn free_port_on(ip: IpAddr) -> u16 {
    let lo = ephemeral_floor();
    for _ in 0..10_000 {
        let port = rand::random_range(10_000..lo);
        if TcpListener::bind((ip, port)).is_ok() {
            return port;
        }
    }
    panic!("no free port on {ip} in 10000..{lo}")
}

/// The lowest port of the kernel's ephemeral range (32768 unless configured), at least 20000.
fn ephemeral_floor() -> u16 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32768)
        .max(20_000)
}

/// Test clients share one address and call much faster than people: the edge's rate limits are
/// lifted unless a test sets them itself.
fn lifted_limits(flags: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (flag, value) in [("--unauthenticated-per-min", "0"), ("--token-per-sec", "0")] {
        if !flags.iter().any(|f| f == flag) {
            out.extend([flag.to_string(), value.to_string()]);
        }
    }
    out
}

/// This cluster's loopback block `127.B.C.0`, B in 1..=254 (never 127.0.x.x, the clients').
fn cluster_block() -> [u8; 3] {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 16;
    let k = std::process::id().wrapping_mul(16).wrapping_add(n) % (254 * 256);
    [127, 1 + (k / 256) as u8, (k % 256) as u8]
}

/// One node process and what it needs to be restarted the same way.
pub struct Node {
    /// Node id.
    pub id: u64,
    /// Its data dir.
    pub data: PathBuf,
    /// Its own loopback address: it listens there and dials its peers from there.
    pub ip: IpAddr,
    /// `ip:port` of the HTTP API.
    pub http: String,
    /// `ip:port` of gRPC.
    pub grpc: String,
    /// The running process, if any.
    pub child: Option<Child>,
    /// Where its stderr goes.
    pub log: PathBuf,
    /// The member it joins through (None for the bootstrap node).
    pub join: Option<String>,
    /// The binary it runs, when not [`computerd_bin`] (a newer build, in an upgrade).
    pub bin: Option<PathBuf>,
}

/// A cluster of real node processes in a temporary directory.
pub struct TestCluster {
    /// The temp dir holding data dirs and logs.
    pub dir: tempfile::TempDir,
    /// Nodes by id.
    pub nodes: BTreeMap<u64, Node>,
    /// HTTP client.
    pub http: reqwest::Client,
    /// The owner token written by the bootstrap node.
    pub token: String,
    /// Extra flags for every node.
    pub flags: Vec<String>,
    /// Extra environment for nodes started from now on.
    pub env: Vec<(String, String)>,
    /// The cluster's loopback block (see the module doc).
    block: [u8; 3],
}

impl TestCluster {
    /// Starts `n` nodes: node 1 bootstraps, the others join through node 1; waits until all are
    /// voters.
    pub async fn start(n: u64) -> Self {
        Self::start_with(n, &[]).await
    }

    /// Like [`TestCluster::start`], with the fake provider enabled on every node (journals in
    /// [`TestCluster::fake_dir`]).
    pub async fn start_fake(n: u64) -> Self {
        Self::start_fake_with(n, &[]).await
    }

    /// Like [`TestCluster::start_fake`], with extra `computerd serve` flags for every node.
    pub async fn start_fake_with(n: u64, flags: &[&str]) -> Self {
        let dir = tempfile::Builder::new().prefix("computerd-test-").tempdir().expect("tempdir");
        let fake = dir.path().join("fake");
        fs::create_dir_all(&fake).expect("fake dir");
        let mut all = vec!["--fake-provider-dir".to_string(), fake.to_string_lossy().into_owned()];
        all.extend(flags.iter().map(|f| f.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        Self::start_in(dir, n, &all).await
    }

    /// Where fake providers keep their journals.
    pub fn fake_dir(&self) -> PathBuf {
        self.dir.path().join("fake")
    }

    /// The journal lines of a fake provider: one per effect that reached it.
    pub fn journal(&self, provider_id: &str) -> Vec<Value> {
        let text = fs::read_to_string(self.fake_dir().join(format!("{provider_id}.jsonl"))).unwrap_or_default();
        // Only whole lines: a line without its newline is being written right now.
        text.split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| serde_json::from_str(l.trim_end()).expect("journal line"))
            .collect()
    }

    /// Like [`TestCluster::start`], with extra `computerd serve` flags for every node.
    pub async fn start_with(n: u64, flags: &[&str]) -> Self {
        let dir = tempfile::Builder::new().prefix("computerd-test-").tempdir().expect("tempdir");
        Self::start_in(dir, n, flags).await
    }

    async fn start_in(dir: tempfile::TempDir, n: u64, flags: &[&str]) -> Self {
        // Others may pass through (not list) the test's directory, as through a person's home:
        // agents keep their state under it, and a tool binding's UID must reach its runtime
        // there. Each node's data dir is 0700 itself.
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).expect("chmod");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            // Shorter than any node's idle limit (its header timeout, 1 s in the shortest test),
            // so a pooled connection is never one the node just closed.
            .pool_idle_timeout(Duration::from_millis(800))
            .build()
            .expect("client");
        let mut c = TestCluster {
            dir,
            nodes: BTreeMap::new(),
            http,
            token: String::new(),
            flags: flags.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            block: cluster_block(),
        };
        c.add_node(1, None);
        c.spawn(1);
        let token_path = c.nodes[&1].data.join("admin.token");
        let mut first = c.nodes.get_mut(&1).and_then(|n| n.child.take()).expect("node 1 runs");
        let log = c.nodes[&1].log.clone();
        let token = wait_for("the admin token", Duration::from_secs(60), || {
            let p = token_path.clone();
            // A node that stopped (say, its port was taken) will never write it: say so now.
            if let Ok(Some(status)) = first.try_wait() {
                panic!("node 1 stopped at start ({status}): {}", fs::read_to_string(&log).unwrap_or_default());
            }
            async move { fs::read_to_string(&p).ok().filter(|t| t.ends_with('\n')) }
        })
        .await;
        c.nodes.get_mut(&1).expect("node 1").child = Some(first);
        c.token = token.trim().to_string();
        let first_grpc = c.nodes[&1].grpc.clone();
        for id in 2..=n {
            c.add_node(id, Some(first_grpc.clone()));
            c.spawn(id);
        }
        c.wait_voters(n as usize).await;
        // Placement settled: every node sees all n nodes live, so work placed from now on stays put.
        c.wait_live(n as usize).await;
        c
    }

    /// Adds node `id` (not started) that joins through `join` (`None`: it bootstraps).
    pub fn add_node(&mut self, id: u64, join: Option<String>) {
        let data = self.dir.path().join(format!("node{id}"));
        let log = self.dir.path().join(format!("node{id}.log"));
        let [a, b, c] = self.block;
        let ip = IpAddr::V4(Ipv4Addr::new(a, b, c, u8::try_from(10 + id).expect("node ids up to 245")));
        let node = Node {
            id,
            data,
            ip,
            http: format!("{ip}:{}", free_port_on(ip)),
            grpc: format!("{ip}:{}", free_port_on(ip)),
            child: None,
            log,
            join,
            bin: None,
        };
        self.nodes.insert(id, node);
    }

    /// Adds and starts a new node that joins through `via`.
    pub async fn join_new(&mut self, id: u64, via: u64) {
        let grpc = self.nodes[&via].grpc.clone();
        self.add_node(id, Some(grpc));
        self.spawn(id);
    }

    /// Starts (or restarts) node `id` with its data dir and ports.
    pub fn spawn(&mut self, id: u64) {
        self.spawn_with(id, &[]);
    }

    /// Like [`TestCluster::spawn`], with extra flags for this start only.
    pub fn spawn_with(&mut self, id: u64, extra: &[&str]) {
        let mut flags = self.flags.clone();
        flags.extend(extra.iter().map(|f| f.to_string()));
        let node = self.nodes.get_mut(&id).expect("known node");
        assert!(node.child.is_none(), "node {id} already runs");
        let log = fs::OpenOptions::new().create(true).append(true).open(&node.log).expect("log file");
        let mut cmd = Command::new(node.bin.clone().unwrap_or_else(computerd_bin));
        cmd.arg("serve")
            .args(["--node-id", &id.to_string()])
            .arg("--data")
            .arg(&node.data)
            .args(["--http", &node.http, "--grpc", &node.grpc])
            .args(["--peer-source-ip", &node.ip.to_string()])
            .args(&flags)
            .args(lifted_limits(&flags))
            .env("COMPUTERD_LOG", std::env::var("COMPUTERD_LOG").unwrap_or_else(|_| "info,openraft=warn".into()))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        if let Some(j) = &node.join {
            // The first node's join secret (a node that has its certificate ignores it).
            let secret = self.dir.path().join("node1").join("join.token");
            cmd.args(["--join", j]).arg("--join-token-file").arg(secret);
        }
        node.child = Some(cmd.spawn().expect("spawn computerd"));
    }

    /// Runs `computerd serve` for node `id` to completion (for start-up refusals); answers the exit
    /// code and what it printed.
    pub fn run_to_exit(&self, id: u64, extra: &[&str]) -> (i32, String) {
        self.run_to_exit_with(id, extra, &[])
    }

    /// Like [`TestCluster::run_to_exit`], with extra environment.
    pub fn run_to_exit_with(&self, id: u64, extra: &[&str], env: &[(&str, &str)]) -> (i32, String) {
        let node = &self.nodes[&id];
        let out = Command::new(computerd_bin())
            .arg("serve")
            .args(["--node-id", &id.to_string()])
            .arg("--data")
            .arg(&node.data)
            .args(["--http", &node.http, "--grpc", &node.grpc])
            .args(["--peer-source-ip", &node.ip.to_string()])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("run computerd");
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// Sends `sig` to node `id`.
    pub fn signal(&self, id: u64, sig: Signal) {
        let child = self.nodes[&id].child.as_ref().expect("node runs");
        kill(Pid::from_raw(child.id() as i32), sig).expect("signal");
    }

    /// SIGKILLs node `id` and reaps it.
    pub fn kill(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).expect("known node");
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERMs node `id` and answers its exit code.
    pub async fn terminate(&mut self, id: u64) -> Option<i32> {
        self.signal(id, Signal::SIGTERM);
        let mut child = self.nodes.get_mut(&id).and_then(|n| n.child.take()).expect("node runs");
        let status = wait_for("the node to exit", Duration::from_secs(30), || {
            let s = child.try_wait().expect("try_wait");
            async move { s }
        })
        .await;
        status.code()
    }

    /// Deletes node `id`'s data dir (the node must be stopped).
    pub fn wipe(&mut self, id: u64) {
        let node = &self.nodes[&id];
        assert!(node.child.is_none(), "stop node {id} before wiping it");
        fs::remove_dir_all(&node.data).expect("wipe");
    }

    /// Ids of the nodes that run.
    pub fn alive(&self) -> Vec<u64> {
        self.nodes.values().filter(|n| n.child.is_some()).map(|n| n.id).collect()
    }

    /// `http://…/path` on node `id`.
    pub fn url(&self, id: u64, path: &str) -> String {
        format!("http://{}{}", self.nodes[&id].http, path)
    }

    /// `GET /v1/health` of node `id`, if it answers.
    pub async fn health(&self, id: u64) -> Option<Value> {
        // With the owner's token: the whole view (without one, liveness only).
        let mut r = self.http.get(self.url(id, "/v1/health")).timeout(Duration::from_secs(2));
        if !self.token.is_empty() {
            r = r.bearer_auth(&self.token);
        }
        let r = r.send().await.ok()?;
        r.json().await.ok()
    }

    /// Waits until every running node knows `n` voters and the same leader.
    pub async fn wait_voters(&self, n: usize) -> u64 {
        wait_for(&format!("{n} voters and one leader"), Duration::from_secs(60), || async move {
            let mut leader = None;
            for id in self.alive() {
                let h = self.health(id).await?;
                let voters = h["members"].as_array()?.iter().filter(|m| m["voter"] == true).count();
                let l = h["leaderId"].as_u64()?;
                if voters != n || leader.is_some_and(|x| x != l) {
                    return None;
                }
                leader = Some(l);
            }
            leader
        })
        .await
    }

    /// Waits until every running node's store names `n` live nodes (the set lifecycle work is
    /// placed over).
    pub async fn wait_live(&self, n: usize) {
        wait_for(&format!("{n} live nodes"), Duration::from_secs(60), || async move {
            for id in self.alive() {
                if self.health(id).await?["liveNodes"].as_array()?.len() != n {
                    return None;
                }
            }
            Some(())
        })
        .await
    }

    /// Waits until the running nodes agree on a leader that runs; answers it.
    pub async fn leader(&self) -> u64 {
        wait_for("a leader all running nodes agree on", Duration::from_secs(30), || async move {
            let alive = self.alive();
            let mut leader = None;
            for id in &alive {
                let l = self.health(*id).await?["leaderId"].as_u64()?;
                if !alive.contains(&l) || leader.is_some_and(|x| x != l) {
                    return None;
                }
                leader = Some(l);
            }
            leader
        })
        .await
    }

    /// Waits until node `id` has applied at least `index`.
    pub async fn wait_applied(&self, id: u64, index: u64) {
        wait_for(&format!("node {id} to apply {index}"), Duration::from_secs(60), || async move {
            (self.health(id).await?["lastApplied"].as_u64()? >= index).then_some(())
        })
        .await
    }

    /// An authenticated request builder on node `id`.
    pub fn req(&self, method: reqwest::Method, id: u64, path: &str, token: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(id, path)).bearer_auth(token)
    }

    /// `POST /v1/bots` on node `id` with the owner token; answers status and body.
    pub async fn create_bot(&self, id: u64, name: &str) -> Result<(u16, Value), reqwest::Error> {
        let r =
            self.req(reqwest::Method::POST, id, "/v1/bots", &self.token).json(&json!({"name": name})).send().await?;
        let status = r.status().as_u16();
        Ok((status, r.json().await.unwrap_or(Value::Null)))
    }

    /// Raises the organization's bot and Computer caps to their ceilings (`PUT /v1/limits`), for
    /// load that creates bots or Computers as its writes (a benchmark, a chaos run) and would
    /// otherwise meet the default caps (1,000 live bots per member, 100,000 in all).
    pub async fn raise_limits(&self) {
        use computerd_raft::sm::CEILING_BOTS;
        use computerd_raft::sm::CEILING_LIVE_COMPUTERS_PER_MEMBER;
        let ceilings = json!({
            "liveBotsPerMember": CEILING_BOTS,
            "bots": CEILING_BOTS,
            "liveComputersPerMember": CEILING_LIVE_COMPUTERS_PER_MEMBER,
        });
        let leader = self.leader().await;
        let (status, v) = self.call(reqwest::Method::PUT, leader, "/v1/limits", &self.token, Some(ceilings)).await;
        assert_eq!(status, 200, "raising the limits: {v}");
    }

    /// The bot ids listed by node `id` (a linearizable read).
    pub async fn bot_ids(&self, id: u64) -> Option<Vec<String>> {
        let r = self.req(reqwest::Method::GET, id, "/v1/bots", &self.token).send().await.ok()?;
        if !r.status().is_success() {
            return None;
        }
        let v: Value = r.json().await.ok()?;
        Some(v["bots"].as_array()?.iter().filter_map(|b| b["id"].as_str().map(String::from)).collect())
    }

    /// Any API call on node `id`; answers status and JSON body (Null when none).
    pub async fn call(
        &self,
        method: reqwest::Method,
        id: u64,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut r = self.req(method, id, path, token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.expect("send");
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Mints a token (owner) for a member or bot: `{"botId": …}` / `{"memberId": …}` plus options.
    pub async fn mint(&self, spec: Value) -> String {
        let mut body = json!({"name": "t"});
        if let (Some(b), Some(spec)) = (body.as_object_mut(), spec.as_object()) {
            b.extend(spec.clone());
        }
        let (s, v) = self.call(reqwest::Method::POST, 1, "/v1/tokens", &self.token, Some(body)).await;
        assert_eq!(s, 201, "{v}");
        v["secret"].as_str().expect("secret").to_string()
    }

    /// Waits until an execution leaves `pending`/`running`; answers its receipt.
    pub async fn settle(&self, id: u64, execution: &str, token: &str) -> Value {
        let path = format!("/v1/executions/{execution}");
        wait_for(&format!("execution {execution} to settle"), Duration::from_secs(30), || {
            let path = path.clone();
            async move {
                let (s, v) = self.call(reqwest::Method::GET, id, &path, token, None).await;
                (s == 200 && !matches!(v["state"].as_str(), Some("pending") | Some("running"))).then_some(v)
            }
        })
        .await
    }

    /// The last lines of node `id`'s log.
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let text = fs::read_to_string(&self.nodes[&id].log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        if std::thread::panicking() {
            for id in &ids {
                let text = fs::read_to_string(&self.nodes[id].log).unwrap_or_default();
                let panics: Vec<&str> = text.lines().filter(|l| l.contains("panicked at")).take(3).collect();
                eprintln!("---- node {id} panics ----\n{}", panics.join("\n"));
                eprintln!("---- node {id} log tail ----\n{}", self.log_tail(*id, 40));
            }
        }
        for id in ids {
            if let Some(n) = self.nodes.get(&id)
                && let Some(c) = &n.child
            {
                // Resume a stopped process so the kill is delivered.
                let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGCONT);
            }
            self.kill(id);
        }
        // COMPUTERD_TEST_KEEP=1 keeps the cluster's directory (node logs, data) to look at.
        if std::env::var_os("COMPUTERD_TEST_KEEP").is_some()
            && let Ok(empty) = tempfile::tempdir()
        {
            let kept = std::mem::replace(&mut self.dir, empty).keep();
            eprintln!("COMPUTERD_TEST_KEEP: the cluster's directory is kept at {}", kept.display());
        }
    }
}
