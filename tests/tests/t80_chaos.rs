//! The chaos suite: a cluster behind HAProxy under a workload of writers, lifecycle commands and
//! paired agents running commands, while nodes are SIGKILLed (the leader or a random one),
//! restarted, or SIGSTOPped past the election timeout. Invariants are checked by code at the
//! end; the report gives the operations, the faults, the violations (must be 0) and, per fault,
//! how long until writes through the balancer succeed again and until the links of the node's
//! agents are back.
//!
//! Size: `CHAOS_NODES` (default 3), `CHAOS_FAULTS` (default 6, CI's bounded run; the report of
//! the issue uses 20+), e.g. `CHAOS_NODES=5 CHAOS_FAULTS=24 cargo nextest run -p computerd-tests
//! --test t80_chaos --no-capture`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::lb::Haproxy;
use computerd_tests::wait_for;
use nix::sys::signal::Signal;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// The API through the balancer, cheap to clone into workload tasks.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Api {
    /// `None` on a transport error (the answer is unknown).
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Option<(u16, Value)> {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(20));
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.json().await.unwrap_or(Value::Null)))
    }
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn percentile(mut v: Vec<Duration>, p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Writers: bots with unique names; answers the names acknowledged (201).
async fn bot_writer(api: Api, w: usize, stop: Arc<AtomicBool>, tally: Arc<Tally>) -> Vec<String> {
    let mut acked = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        let name = format!("chaos-{w}-{i}");
        i += 1;
        match api.call(Method::POST, "/v1/bots", Some(json!({"name": name}))).await {
            Some((201, _)) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
                acked.push(name);
            }
            _ => {
                tally.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    acked
}

/// Lifecycle commands: creates with fresh keys; a lost answer is sent again with the same key
/// and body (the SDK's way) until it is answered. Answers (key, body, execution id).
async fn creator(api: Api, provider: String, stop: Arc<AtomicBool>, tally: Arc<Tally>) -> Vec<(String, Value, String)> {
    let mut acked = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        let key = format!("chaos-create-{i}");
        i += 1;
        let body = json!({"commandKey": key, "name": key, "source": {"_tag": "Provider", "provider": provider}});
        let started = Instant::now();
        loop {
            match api.call(Method::POST, "/v1/computers", Some(body.clone())).await {
                Some((202, v)) => {
                    tally.ok.fetch_add(1, Ordering::Relaxed);
                    let exe = v["executionId"].as_str().unwrap_or_default().to_string();
                    acked.push((key.clone(), body.clone(), exe));
                    break;
                }
                _ if started.elapsed() < Duration::from_secs(30) => {
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => break,
            }
        }
    }
    acked
}

/// A paired agent's sessions: each prints 40 numbered lines over 2 s and is read to its end
/// through the balancer, with offsets, so a read whose answer was lost is read again. Answers
/// (sessions read whole, violations).
async fn session_runner(api: Api, computer: String, k: usize, stop: Arc<AtomicBool>) -> (u64, Vec<String>) {
    let mut whole = 0;
    let mut violations = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let tag = format!("a{k}s{n}");
        let cmd = format!("for i in $(seq 1 40); do echo {tag}-$i; sleep 0.05; done");
        let body = json!({"command": cmd, "yieldTimeMs": 250, "maxOutputBytes": 1048576});
        let Some((200, v)) = api.call(Method::POST, &format!("/v1/computers/{computer}/sessions"), Some(body)).await
        else {
            // The start's answer is unknown (or the link is moving): start another one.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(sid) = v["session"].as_str().map(str::to_string) else {
            violations.push(format!("{tag}: a 2 s command ended within its 0.25 s wait: {v}"));
            continue;
        };
        let mut output = v["output"].as_str().unwrap_or_default().to_string();
        let mut offset = v["offset"].as_u64();
        let started = Instant::now();
        let url = format!("/v1/computers/{computer}/sessions/{sid}/input");
        let mut last_refusal = String::new();
        let done = loop {
            if started.elapsed() > Duration::from_secs(60) {
                break false;
            }
            let body = json!({"chars": "", "yieldTimeMs": 1000, "fromOffset": offset, "maxOutputBytes": 1048576});
            match api.call(Method::POST, &url, Some(body)).await {
                Some((200, v)) => {
                    output.push_str(v["output"].as_str().unwrap_or_default());
                    offset = v["offset"].as_u64().or(offset);
                    if v["running"] == false {
                        break true;
                    }
                }
                // Not reachable yet, or the answer was lost: read again from the same offset.
                other => {
                    last_refusal = format!("{other:?}");
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
            }
        };
        let expected: String = (1..=40).map(|i| format!("{tag}-{i}\n")).collect();
        if !done {
            violations.push(format!("{tag}: not read to its end within 60 s; last refusal: {last_refusal}"));
        } else if output != expected {
            violations.push(format!("{tag}: output differs: {output:?}"));
        } else {
            whole += 1;
        }
    }
    (whole, violations)
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    KillLeader,
    KillRandom,
    StopLeader,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t10_chaos() {
    let nodes = env_usize("CHAOS_NODES", 3) as u64;
    let faults = env_usize("CHAOS_FAULTS", 6);
    let election = std::env::var("CHAOS_ELECTION_MS").unwrap_or_else(|_| "400".into());
    let mut c = TestCluster::start_fake_with(nodes, &["--election-ms", &election]).await;
    let backends: Vec<String> = c.nodes.values().map(|n| n.http.clone()).collect();
    let lb = Haproxy::start(c.dir.path(), &backends).await;
    let api = Api { http: c.http.clone(), base: lb.url(""), token: c.token.clone() };
    let (s, p) = api
        .call(Method::POST, "/v1/computer-providers", Some(json!({"kind": "fake", "name": "f", "config": {}})))
        .await
        .expect("provider");
    assert_eq!(s, 201, "{p}");
    let provider = p["id"].as_str().expect("provider id").to_string();

    // Two paired agents, linked through the balancer.
    let mut agents = Vec::new();
    let mut computers = Vec::new();
    for k in 0..2 {
        let (id, code) = paired_computer(&c, &format!("agent-{k}")).await;
        let state = c.dir.path().join(format!("agent-{k}"));
        let log = c.dir.path().join(format!("agent-{k}.log"));
        agents.push(AgentProc::spawn(&lb.url(""), &state, Some(&code), &log));
        computers.push(id);
    }
    for id in &computers {
        wait_for("an agent to link", Duration::from_secs(30), || async {
            let (_, v) = api.call(Method::GET, &format!("/v1/computers/{id}"), None).await?;
            (v["state"] == "running").then_some(())
        })
        .await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(Tally::default());
    let creates = Arc::new(Tally::default());
    let bots: Vec<_> = (0..2).map(|w| tokio::spawn(bot_writer(api.clone(), w, stop.clone(), writes.clone()))).collect();
    let creator = tokio::spawn(creator(api.clone(), provider.clone(), stop.clone(), creates.clone()));
    let sessions: Vec<_> = computers
        .iter()
        .enumerate()
        .map(|(k, id)| tokio::spawn(session_runner(api.clone(), id.clone(), k, stop.clone())))
        .collect();

    let mut write_back = Vec::new();
    let mut link_back = Vec::new();
    let mut injected: HashMap<&'static str, usize> = HashMap::new();
    let mut violations: Vec<String> = Vec::new();
    for f in 0..faults {
        // Let the workload run between faults.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let fault = [Fault::KillLeader, Fault::KillRandom, Fault::StopLeader][f % 3];
        let leader = c.leader().await;
        let target = match fault {
            Fault::KillRandom => c.alive()[rand::random::<u32>() as usize % c.alive().len()],
            _ => leader,
        };
        // Which links live on the target.
        let mut moving = Vec::new();
        for id in &computers {
            if let Some((_, v)) = api.call(Method::GET, &format!("/v1/computers/{id}"), None).await
                && v["linkNode"].as_u64() == Some(target)
            {
                moving.push(id.clone());
            }
        }
        let t0 = Instant::now();
        match fault {
            Fault::StopLeader => c.signal(target, Signal::SIGSTOP),
            _ => c.kill(target),
        }
        *injected
            .entry(match fault {
                Fault::KillLeader => "SIGKILL leader",
                Fault::KillRandom => "SIGKILL random node",
                Fault::StopLeader => "SIGSTOP leader",
            })
            .or_default() += 1;
        // Writes through the balancer are back when a probe write is acknowledged.
        let probe = format!("chaos-probe-{f}");
        let back = wait_for("writes to come back", Duration::from_secs(30), || async {
            matches!(api.call(Method::POST, "/v1/bots", Some(json!({"name": probe}))).await, Some((201, _)))
                .then(|| t0.elapsed())
        })
        .await;
        println!("  fault {f}: {fault:?} of node {target} (leader {leader}): writes back after {back:?}");
        write_back.push(back);
        for id in &moving {
            let back = wait_for("a link to come back", Duration::from_secs(30), || async {
                let (_, v) = api.call(Method::GET, &format!("/v1/computers/{id}"), None).await?;
                (v["state"] == "running" && v["linkNode"].as_u64().is_some_and(|n| n != target)).then(|| t0.elapsed())
            })
            .await;
            link_back.push(back);
        }
        match fault {
            Fault::StopLeader => c.signal(target, Signal::SIGCONT),
            _ => c.spawn(target),
        }
        c.wait_voters(nodes as usize).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let mut acked_bots = Vec::new();
    for b in bots {
        acked_bots.extend(b.await.expect("writer"));
    }
    let acked_creates = creator.await.expect("creator");
    let mut whole_sessions = 0;
    for s in sessions {
        let (whole, v) = s.await.expect("sessions");
        whole_sessions += whole;
        violations.extend(v);
    }

    // 1. No acknowledged write is lost.
    let (_, v) = api.call(Method::GET, "/v1/bots", None).await.expect("bots");
    let present: std::collections::HashSet<&str> =
        v["bots"].as_array().map(|b| b.iter().filter_map(|b| b["name"].as_str()).collect()).unwrap_or_default();
    for name in &acked_bots {
        if !present.contains(name.as_str()) {
            violations.push(format!("acknowledged bot {name} is lost"));
        }
    }
    // 2. Every acknowledged receipt is stored, and sending it again answers the same execution.
    for (key, body, exe) in &acked_creates {
        match api.call(Method::POST, "/v1/computers", Some(body.clone())).await {
            Some((202, v)) if v["executionId"] == exe.as_str() => {}
            other => violations.push(format!("create {key}: the receipt {exe} is not answered again: {other:?}")),
        }
    }
    // 3. At most one provider effect per command key.
    let mut effects: HashMap<String, usize> = HashMap::new();
    for line in c.journal(&provider) {
        if line["op"] == "create" && line["rejected"] != true {
            *effects.entry(line["commandKey"].as_str().unwrap_or_default().to_string()).or_default() += 1;
        }
    }
    for (key, n) in &effects {
        if *n > 1 {
            violations.push(format!("command key {key} reached the provider {n} times"));
        }
    }
    // 4. Link generations only grow: no link of an older generation was accepted after a newer one.
    let (_, ev) = api.call(Method::GET, "/v1/events?limit=1000", None).await.expect("events");
    let mut last_gen: HashMap<String, u64> = HashMap::new();
    for e in ev["events"].as_array().cloned().unwrap_or_default() {
        if e["type"] == "AgentLinked" {
            let id = e["computerId"].as_str().unwrap_or_default().to_string();
            let g = e["data"]["generation"].as_u64().unwrap_or(0);
            if last_gen.get(&id).is_some_and(|prev| g <= *prev) {
                violations.push(format!("{id}: link generation {g} accepted after a newer one"));
            }
            last_gen.insert(id, g);
        }
    }

    println!("chaos report: {nodes} nodes behind HAProxy, {faults} faults");
    println!(
        "  operations: {} bot writes acknowledged ({} failed or unknown), {} creates acknowledged ({} attempts failed), {} sessions read whole",
        writes.ok.load(Ordering::Relaxed),
        writes.failed.load(Ordering::Relaxed),
        acked_creates.len(),
        creates.failed.load(Ordering::Relaxed),
        whole_sessions
    );
    println!("  faults injected: {injected:?}");
    println!(
        "  writes back after a fault: p50 {:?}, p99 {:?}, max {:?} (n={})",
        percentile(write_back.clone(), 0.5),
        percentile(write_back.clone(), 0.99),
        write_back.iter().max().copied().unwrap_or_default(),
        write_back.len()
    );
    println!(
        "  links back after their node's fault: p50 {:?}, p99 {:?}, max {:?} (n={})",
        percentile(link_back.clone(), 0.5),
        percentile(link_back.clone(), 0.99),
        link_back.iter().max().copied().unwrap_or_default(),
        link_back.len()
    );
    println!("  invariant violations: {}", violations.len());
    for v in violations.iter().take(20) {
        println!("    {v}");
    }
    assert!(whole_sessions > 0, "no session was read whole");
    assert!(violations.is_empty(), "{} invariant violations", violations.len());
    drop(agents);
}
