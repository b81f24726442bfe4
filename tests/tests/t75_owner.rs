//! The owner path (`node/src/owner/`), for each kind of call on a Computer's agent: a session
//! call, a file call and a tool call, each sent to a node that does not hold the link.
//!
//! - A hung owner (SIGSTOP) does not hold a call past the owner's time to take it: the caller
//!   gets `504 deadline_exceeded` naming the node, within seconds.
//! - A sender whose view of the owner is stale (its replica stopped receiving the leader's
//!   appends, while the link moved) reaches the new owner with exactly one retry: the old owner
//!   answers `NotOwner` naming the new one.

use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::netfault::NetFault;
use computerd_tests::tools;
use computerd_tests::uids::UidRange;
use computerd_tests::wait_for;
use nix::sys::signal::Signal;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// A cluster with a paired Computer whose agent is linked to `owner`, a bot granted the
/// Computer with the fixture MCP package installed, and a file in the workspace.
struct World {
    c: TestCluster,
    id: String,
    bot: String,
    binding: String,
    agent: AgentProc,
    state: PathBuf,
    log: PathBuf,
    flags: Vec<String>,
    /// The leader at the start, and the followers (sorted).
    leader: u64,
    followers: Vec<u64>,
    /// The agent's binding UIDs, this test's own while it runs.
    _uids: UidRange,
}

async fn world(nodes: u64) -> World {
    let uids = UidRange::take();
    let c = TestCluster::start(nodes).await;
    let leader = c.leader().await;
    let followers: Vec<u64> = c.nodes.keys().copied().filter(|n| *n != leader).collect();
    let owner = followers[0];
    let (id, code) = paired_computer(&c, "owner").await;
    let workspace = c.dir.path().join("workspace");
    let pkg = tools::pack(&c.dir.path().join("pkg"), &workspace, "server.tar.gz", None);
    std::fs::write(workspace.join("hello.txt"), "hello from the owner\n").expect("file");
    let state = c.dir.path().join("agent");
    let log = c.dir.path().join("agent.log");
    let flags =
        vec!["--workdir".to_string(), workspace.to_string_lossy().into_owned(), "--mcp-first-uid".into(), uids.arg()];
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let agent = AgentProc::spawn_with(&c.url(owner, ""), &state, Some(&code), &log, &args);
    linked_to(&c, leader, &id, owner).await;
    let (s, bot) = c.call(Method::POST, leader, "/v1/bots", &c.token, Some(json!({"name": "ownerbot"}))).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    let (s, v) = c.call(Method::PUT, leader, &format!("/v1/computers/{id}/bots/{bot}"), &c.token, None).await;
    assert_eq!(s, 200, "{v}");
    let body =
        json!({"artifactPath": pkg.artifact, "manifest": tools::manifest("1.0.0", &pkg.digest), "computerId": id});
    let (s, v) = c.call(Method::POST, owner, &format!("/api/bots/{bot}/tools/install"), &c.token, Some(body)).await;
    assert_eq!(s, 201, "{v}");
    let binding = v["bindingId"].as_str().expect("binding").to_string();
    World { c, id, bot, binding, agent, state, log, flags, leader, followers, _uids: uids }
}

/// Waits until node `via` (at a current read) names `owner` as the holder of the link.
async fn linked_to(c: &TestCluster, via: u64, id: &str, owner: u64) {
    let path = format!("/v1/computers/{id}");
    wait_for(&format!("the link on node {owner}"), Duration::from_secs(30), || async {
        let (_, v) = c.call(Method::GET, via, &path, &c.token, None).await;
        (v["state"] == "running" && v["linkNode"] == owner).then_some(())
    })
    .await;
}

/// The three calls, as (what, method, path, body).
fn calls(w: &World, op: &str) -> Vec<(&'static str, Method, String, Option<Value>)> {
    let id = &w.id;
    vec![
        (
            "session",
            Method::POST,
            format!("/v1/computers/{id}/sessions"),
            Some(json!({"command": "echo routed", "yieldTimeMs": 5000})),
        ),
        ("file", Method::GET, format!("/v1/computers/{id}/files?path=hello.txt"), None),
        (
            "tool",
            Method::POST,
            format!("/api/bots/{}/tools/{}/call", w.bot, w.binding),
            Some(json!({"operationId": op, "tool": "echo", "arguments": {"text": "hi"}})),
        ),
    ]
}

/// A call on node `via`: status, the served-by and reroutes headers, and the JSON body.
async fn send(c: &TestCluster, via: u64, method: Method, path: &str, body: Option<Value>) -> (u16, Value, Value) {
    let mut r = c.req(method, via, path, &c.token).timeout(Duration::from_secs(60));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("send");
    let header = |h: &str| resp.headers().get(h).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let routed = json!({"servedBy": header("x-computerd-served-by"), "reroutes": header("x-computerd-reroutes")});
    let status = resp.status().as_u16();
    (status, routed, resp.json().await.unwrap_or(Value::Null))
}

async fn routing(c: &TestCluster, node: u64) -> Value {
    c.health(node).await.expect("health")["routing"].clone()
}

/// SIGSTOP of the node holding the link: a session, a file and a tool call sent to another node
/// each end by the owner's time to take a call (5 s), with an error naming the hung node, instead
/// of waiting on it: `504 deadline_exceeded` when a connection to it was open, or `502 … did
/// not answer` when a new connection's TLS handshake times out (1 s) or the channel's
/// keep-alive (5 s + 5 s) has declared the connection dead. The tool call is recorded unknown
/// and not redone.
#[tokio::test]
async fn t10_a_hung_owner_ends_each_routed_call_at_its_deadline() {
    let w = world(3).await;
    let (owner, sender) = (w.followers[0], w.followers[1]);
    let before = routing(&w.c, sender).await;
    w.c.signal(owner, Signal::SIGSTOP);
    let mut timed_out = 0;
    for (what, method, path, body) in calls(&w, "hung-1") {
        let started = Instant::now();
        let (s, _, v) = send(&w.c, sender, method, &path, body).await;
        let took = started.elapsed();
        let kind = v["error"]["kind"].as_str();
        let message = v["error"]["message"].as_str().unwrap_or_default();
        match (s, kind) {
            (504, Some("deadline_exceeded")) => timed_out += 1,
            (502, Some("ComputerExecutionFailed")) if message.ends_with("did not answer") => {}
            _ => panic!("{what}: {s} {v}"),
        }
        assert!(message.contains(&format!("node {owner}, which holds the computer's link")), "{what}: {message}");
        // The owner's 5 s to take the call, plus at most the channel's keep-alive timeout (5 s)
        // when the connection it was sent on is declared dead meanwhile (one CI run: 10.0 s).
        assert!(took < Duration::from_secs(11), "{what} ended by the owner's time to take it: {took:?}");
        eprintln!("{what}: {s} after {took:?}: {message}");
    }
    let after = routing(&w.c, sender).await;
    assert_eq!(after["timedOut"].as_u64(), before["timedOut"].as_u64().map(|n| n + timed_out), "{after}");
    w.c.signal(owner, Signal::SIGCONT);
    // The tool call's effect is unknown: sent again, it is reported so and never redone.
    let (_, _, path, body) = calls(&w, "hung-1").remove(2);
    let (s, _, v) = send(&w.c, sender, Method::POST, &path, body).await;
    assert_eq!((s, v["error"]["reason"].as_str()), (409, Some("outcome_unknown")), "{v}");
}

/// A sender with a stale view: the leader's connections to node S are cut (S's own calls to the
/// leader still pass, so S proposes but applies nothing new), then the agent's link moves from
/// node A to node B. S still names A; A answers `NotOwner` naming B, and each call reaches B
/// after exactly one retry, with B's answer.
#[tokio::test]
async fn t20_a_stale_view_reaches_the_new_owner_with_one_retry() {
    let mut w = world(4).await;
    let (a, b, s) = (w.followers[0], w.followers[1], w.followers[2]);
    // S is current before the cut: it names A.
    linked_to(&w.c, s, &w.id, a).await;
    let net = NetFault::new().expect("iptables as root (CI runs as root with iptables installed)");
    let to_s: std::net::SocketAddr = w.c.nodes[&s].grpc.parse().expect("grpc address");
    net.cut_connections(w.c.nodes[&w.leader].ip, to_s).expect("cut the leader's connections to S");

    w.agent.kill();
    let args: Vec<&str> = w.flags.iter().map(String::as_str).collect();
    w.agent = AgentProc::spawn_with(&w.c.url(b, ""), &w.state, None, &w.log, &args);
    linked_to(&w.c, b, &w.id, b).await;

    let before = routing(&w.c, s).await;
    for (what, method, path, body) in calls(&w, "stale-1") {
        let (status, routed, v) = send(&w.c, s, method, &path, body).await;
        assert_eq!(status, 200, "{what}: {v}");
        match what {
            "session" => assert_eq!(v["output"], "routed\n", "{v}"),
            "file" => assert_eq!(v["content"], "hello from the owner\n", "{v}"),
            _ => assert_eq!(v["result"]["ok"]["content"][0]["text"], "hi", "{v}"),
        }
        if what != "tool" {
            // Forwarded HTTP calls name the node that served them and the retries.
            assert_eq!(routed, json!({"servedBy": b, "reroutes": 1}), "{what}");
        }
    }
    let after = routing(&w.c, s).await;
    assert_eq!(after["rerouted"].as_u64(), before["rerouted"].as_u64().map(|n| n + 3), "one retry each: {after}");
    net.heal().expect("heal");
}
