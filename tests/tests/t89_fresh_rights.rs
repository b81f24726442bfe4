//! Issue 37, item 9: a call that acts on a Computer checks the caller's rights at a current read
//! on the node that serves it. A grant revoked on the leader is refused at once by a node that
//! the harness cut off from the leader (its replica lags behind the revocation): the call is
//! refused while that node cannot catch up, and refused as forbidden once it has, and in
//! neither case does anything reach the Computer.

use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::agent::wait_state;
use computerd_tests::netfault::NetFault;
use computerd_tests::wait::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

/// `POST /api/blobs` on node `node`.
async fn upload(c: &TestCluster, node: u64, token: &str, body: &[u8]) -> (u16, Value) {
    let sha = hex::encode(sha2::Sha256::digest(body));
    let r = reqwest::Client::new()
        .post(c.url(node, &format!("/api/blobs?sha={sha}&name=report.pdf")))
        .bearer_auth(token)
        .body(body.to_vec())
        .send()
        .await
        .expect("upload");
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn i37_9_a_revoked_grant_is_refused_at_once_by_a_lagging_node() {
    let c = TestCluster::start(3).await;
    let leader = c.leader().await;
    let s = (1..=3).find(|n| *n != leader).expect("a follower");
    // A paired machine whose agent links to S, so S serves every call on it.
    let (id, code) = paired_computer(&c, "fresh-rights").await;
    let state = c.dir.path().join("agent-fresh");
    let _agent = AgentProc::spawn(&c.url(s, ""), &state, Some(&code), &c.dir.path().join("agent-fresh.log"));
    wait_state(&c, &id, "running").await;
    wait_for("the link on S", Duration::from_secs(30), || async {
        let (_, v) = c.call(Method::GET, leader, &format!("/v1/computers/{id}"), &c.token, None).await;
        (v["linkNode"].as_u64() == Some(s)).then_some(())
    })
    .await;
    // A bot with a grant (root allowed: this agent runs as root) copies a blob in through S.
    let bot = c.create_bot(leader, "copier").await.expect("bot").1["id"].as_str().expect("bot id").to_string();
    let grant = format!("/v1/computers/{id}/bots/{bot}");
    let (st, v) = c.call(Method::PUT, leader, &grant, &c.token, Some(json!({"allowRoot": true}))).await;
    assert!(st == 200 || st == 201, "{v}");
    let token = c.mint(json!({"name": "copier", "botId": bot})).await;
    let (st, v) = upload(&c, s, &token, b"quarterly figures\n").await;
    assert_eq!(st, 200, "{v}");
    let blob = v["blobId"].as_str().expect("blobId").to_string();
    let dir = c.dir.path().join("fresh-box");
    let copy = |name: &str| json!({"blobId": blob, "path": dir.join(name).to_string_lossy(), "user": "root"});
    let path = format!("/v1/computers/{id}/copy-to-box");
    wait_for("the grant and the blob on S", Duration::from_secs(30), || async {
        let (st, _) = c.call(Method::POST, s, &path, &token, Some(copy("before"))).await;
        (st == 200).then_some(())
    })
    .await;
    assert!(dir.join("before").exists(), "the copy before the revocation arrived");

    // S stops hearing from the leader; the member revokes the grant there.
    let net = NetFault::new().expect("iptables as root (CI runs as root with iptables installed)");
    let to_s: std::net::SocketAddr = c.nodes[&s].grpc.parse().expect("grpc address");
    net.cut_connections(c.nodes[&leader].ip, to_s).expect("cut the leader's connections to S");
    let (st, v) = c.call(Method::DELETE, leader, &grant, &c.token, None).await;
    assert!(st == 200 || st == 204, "{v}");
    let applied = |h: Option<Value>| h.and_then(|h| h["lastApplied"].as_u64()).expect("lastApplied");
    let (at_leader, at_s) = (applied(c.health(leader).await), applied(c.health(s).await));
    assert!(at_s < at_leader, "S lags behind the revocation: {at_s} < {at_leader}");

    // S cannot confirm the rights: refused, and nothing reaches the machine.
    let (st, v) = c.call(Method::POST, s, &path, &token, Some(copy("lagging"))).await;
    assert_ne!(st, 200, "a revoked grant is refused by a lagging node: {v}");
    assert!(matches!(st, 403 | 503 | 504), "{st} {v}");
    assert!(!dir.join("lagging").exists(), "nothing was copied under a revoked grant");
    net.heal().expect("heal");
    // Caught up, S refuses it as forbidden, as every node does.
    let refused = wait_for("S to refuse the copy as forbidden", Duration::from_secs(30), || async {
        let (st, v) = c.call(Method::POST, s, &path, &token, Some(copy("after"))).await;
        (st == 403 || st == 404).then_some(v)
    })
    .await;
    assert!(refused["error"]["kind"].is_string(), "{refused}");
    assert!(!dir.join("after").exists() && !dir.join("lagging").exists());
}
