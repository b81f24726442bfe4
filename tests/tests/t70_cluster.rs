//! The cluster behind a real load balancer (HAProxy): an agent linked through it follows its
//! link to another node when the node holding it is SIGKILLed, and the command it runs keeps
//! running with its output complete and in order; writes through the balancer come back after
//! leader kills.

use std::time::Duration;
use std::time::Instant;

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::lb::Haproxy;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// One API call through the balancer; `None` on a transport error (a node just died).
async fn via(c: &TestCluster, lb: &Haproxy, method: Method, path: &str, body: Option<Value>) -> Option<(u16, Value)> {
    let mut r = c.http.request(method, lb.url(path)).bearer_auth(&c.token).timeout(Duration::from_secs(40));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.json().await.unwrap_or(Value::Null)))
}

async fn computer(c: &TestCluster, lb: &Haproxy, id: &str) -> Option<Value> {
    via(c, lb, Method::GET, &format!("/v1/computers/{id}"), None).await.map(|(_, v)| v)
}

async fn lb_for(c: &TestCluster) -> Haproxy {
    let backends: Vec<String> = c.nodes.values().map(|n| n.http.clone()).collect();
    Haproxy::start(c.dir.path(), &backends).await
}

/// SIGKILL of the node holding an agent's link: the agent reconnects through the balancer to
/// another node, the command started before keeps running, and reading it to its end through
/// the balancer gives every line, once, in order.
#[tokio::test]
async fn t10_a_link_moves_when_its_node_dies() {
    let mut c = TestCluster::start(3).await;
    let lb = lb_for(&c).await;
    let (id, code) = paired_computer(&c, "moving").await;
    let state = c.dir.path().join("agent");
    let _agent = AgentProc::spawn(&lb.url(""), &state, Some(&code), &c.dir.path().join("agent.log"));
    let first = wait_for("the agent to link", Duration::from_secs(30), || async {
        computer(&c, &lb, &id).await.filter(|v| v["state"] == "running" && v["linkNode"].is_u64())
    })
    .await;
    let holder = first["linkNode"].as_u64().expect("link node");

    let cmd = "for i in $(seq 1 80); do echo line$i; sleep 0.05; done";
    let body = json!({"command": cmd, "yieldTimeMs": 250});
    let (s, v) = via(&c, &lb, Method::POST, &format!("/v1/computers/{id}/sessions"), Some(body)).await.expect("start");
    assert_eq!((s, v["running"].clone()), (200, json!(true)), "{v}");
    let sid = v["session"].as_str().expect("session").to_string();
    let mut output = v["output"].as_str().unwrap_or_default().to_string();

    let killed_at = Instant::now();
    c.kill(holder);
    let moved = wait_for("the link to move to another node", Duration::from_secs(30), || async {
        computer(&c, &lb, &id)
            .await
            .filter(|v| v["linkNode"].as_u64().is_some_and(|n| n != holder) && v["state"] == "running")
    })
    .await;
    let link_back = killed_at.elapsed();

    // Read the rest through the balancer. A call that cannot reach the link yet fails before it
    // reads anything, so retrying it loses no output.
    let url = format!("/v1/computers/{id}/sessions/{sid}/input");
    loop {
        let body = json!({"chars": "", "yieldTimeMs": 2000});
        match via(&c, &lb, Method::POST, &url, Some(body)).await {
            Some((200, v)) => {
                output.push_str(v["output"].as_str().unwrap_or_default());
                if v["running"] == false {
                    assert_eq!(v["exitCode"], 0, "{v}");
                    break;
                }
            }
            Some((s, v)) => assert!(s == 502 || s == 503, "only 'not reachable yet' is expected: {s} {v}"),
            None => {}
        }
        assert!(killed_at.elapsed() < Duration::from_secs(60), "the command did not finish: {output}");
    }
    let expected: String = (1..=80).map(|i| format!("line{i}\n")).collect();
    // `bash -lc` reads the machine's login scripts first, and they may print before the command
    // does (see `.ci/run` on pyenv): the command's own output is what follows its first line.
    let own = output.find("line1\n").map_or(output.as_str(), |i| &output[i..]);
    assert_eq!(own, expected, "every line once, in order");
    eprintln!("link back on node {} {link_back:?} after SIGKILL of node {holder}", moved["linkNode"]);
}

/// The receiving half of routing: a node that does not hold a Computer's link answers a routed
/// call `FAILED_PRECONDITION` naming the owner it knows, before reading any body; the owner
/// itself runs it (authenticated again: a routed call without a token is refused there).
#[tokio::test]
async fn t20_a_non_owner_names_the_owner() {
    use computerd_proto::cluster::RouteChunk;
    use computerd_proto::cluster::RouteHead;
    use computerd_proto::cluster::routing_client::RoutingClient;
    let c = TestCluster::start(3).await;
    let (id, code) = paired_computer(&c, "owned").await;
    let state = c.dir.path().join("agent");
    let _agent = AgentProc::spawn(&c.url(2, ""), &state, Some(&code), &c.dir.path().join("agent.log"));
    let owner = wait_for("the link on node 2", Duration::from_secs(30), || async {
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        v["linkNode"].as_u64().filter(|n| *n == 2)
    })
    .await;
    let call = |node: u64, token: Option<String>| {
        // As node 1 would: with its node certificate (mutual TLS).
        let channel = computerd_tests::tls::channel_as(&c, 1, node);
        let id = id.clone();
        async move {
            let mut client = RoutingClient::new(channel);
            let mut headers = std::collections::HashMap::new();
            headers.insert("content-type".to_string(), "application/json".to_string());
            if let Some(t) = token {
                headers.insert("authorization".to_string(), format!("Bearer {t}"));
            }
            let head = RouteChunk {
                head: Some(RouteHead {
                    method: "POST".into(),
                    path: format!("/v1/computers/{id}/sessions"),
                    headers,
                    status: 0,
                }),
                body: Vec::new(),
            };
            let body = RouteChunk { head: None, body: br#"{"command":"echo owned"}"#.to_vec() };
            client.forward(futures::stream::iter([head, body])).await
        }
    };
    let refused = call(3, Some(c.token.clone())).await.expect_err("node 3 does not own it");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert_eq!(refused.metadata().get("x-computerd-owner").and_then(|v| v.to_str().ok()), Some("2"));

    let mut replies = call(owner, None).await.expect("the owner takes it").into_inner();
    let head = replies.message().await.expect("reply").and_then(|c| c.head).expect("head");
    assert_eq!(head.status, 401, "a routed call is authenticated again");
    let mut replies = call(owner, Some(c.token.clone())).await.expect("the owner takes it").into_inner();
    let head = replies.message().await.expect("reply").and_then(|c| c.head).expect("head");
    assert_eq!(head.status, 200);
    let mut body = Vec::new();
    while let Some(chunk) = replies.message().await.expect("body") {
        body.extend(chunk.body);
    }
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["output"], "owned\n");
}
