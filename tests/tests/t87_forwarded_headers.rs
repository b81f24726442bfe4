//! Issue 36, items 8 and 9: a call sent to a node that does not hold the Computer's link is
//! forwarded to the node that does with the headers its route needs, and its answer comes back
//! with the headers the route answers with; a client cannot claim that a call was forwarded.
//!
//! - Session calls: `Last-Event-ID` resumes an output stream through any node.
//! - Desktop calls: the stream URL names the host the client addressed; the ticket is redeemed
//!   through any node for its `Set-Cookie` (with `Secure` behind a balancer that says
//!   `X-Forwarded-Proto: https`) and `Location`; noVNC's page loads with the `Cookie`; a
//!   screenshot's bytes keep their `X-Width` and `X-Height`.
//! - `x-computerd-forwarded` from a client is dropped at the edge: the call is still forwarded.

use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::agent::wait_state;
use computerd_tests::docker::Containers;
use computerd_tests::docker::DESKTOP_IMAGE;
use computerd_tests::docker::IMAGE;
use computerd_tests::docker::docker_provider;
use computerd_tests::docker::ensure_desktop_image;
use computerd_tests::sse::Sse;
use computerd_tests::wait::wait_for;
use reqwest::Method;
use serde_json::json;

/// A 2-node cluster with a paired Computer whose agent is linked to node 1; answers the cluster,
/// the Computer's id and the agent (kept alive by the caller).
async fn paired_on_node_1(dir_name: &str) -> (TestCluster, String, AgentProc) {
    let c = TestCluster::start(2).await;
    let (id, code) = paired_computer(&c, dir_name).await;
    let workspace = c.dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).expect("workspace");
    let state = c.dir.path().join("agent");
    let log = c.dir.path().join("agent.log");
    let workdir = workspace.to_string_lossy().into_owned();
    let agent = AgentProc::spawn_with(&c.url(1, ""), &state, Some(&code), &log, &["--workdir", &workdir]);
    linked_to(&c, &id, 1).await;
    (c, id, agent)
}

/// Waits until node 2 (at a current read) names `owner` as the holder of the link.
async fn linked_to(c: &TestCluster, id: &str, owner: u64) {
    let path = format!("/v1/computers/{id}");
    wait_for(&format!("the link on node {owner}"), Duration::from_secs(60), || async {
        let (_, v) = c.call(Method::GET, 2, &path, &c.token, None).await;
        (v["state"] == "running" && v["linkNode"] == owner).then_some(())
    })
    .await;
}

fn served_by(r: &reqwest::Response) -> Option<u64> {
    r.headers().get("x-computerd-served-by").and_then(|v| v.to_str().ok()?.parse().ok())
}

/// Item 8: a session's output stream, resumed with `Last-Event-ID` through the node without the
/// link, starts after that offset (the header reaches the owner).
#[tokio::test]
async fn i36_8_last_event_id_reaches_the_owner() {
    let (c, id, _agent) = paired_on_node_1("i36-8-sse").await;
    let body = json!({"command": "printf abcdef", "yieldTimeMs": 5000});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(body)).await;
    assert_eq!((s, v["output"].as_str()), (200, Some("abcdef")), "{v}");
    let sid = v["sessionId"].as_str().expect("session id");
    let url = c.url(2, &format!("/v1/computers/{id}/sessions/{sid}/output"));
    let mut sse = Sse::open(&url, &c.token, Some(3)).await;
    assert_eq!(sse.node, Some(1), "forwarded to the link's node");
    let (offset, kind, data) = sse.next().await.expect("an event");
    assert_eq!((kind.as_str(), offset), ("output", 6), "{data}");
    assert_eq!(data["output"], "def", "the stream resumes after offset 3: {data}");
    let (_, kind, data) = sse.next().await.expect("the end");
    assert_eq!(kind, "end", "{data}");
}

/// Item 9: a client's `x-computerd-forwarded` does not make the node without the link run the
/// call itself (it would wait for a link that is elsewhere): the edge drops it, and the call is
/// forwarded and answered by the owner.
#[tokio::test]
async fn i36_9_a_client_cannot_claim_a_call_was_forwarded() {
    let (c, id, _agent) = paired_on_node_1("i36-9").await;
    for header in ["x-computerd-forwarded", "X-Computerd-Forwarded"] {
        let r = c
            .req(Method::GET, 2, &format!("/v1/computers/{id}/sessions"), &c.token)
            .header(header, "1")
            .timeout(Duration::from_secs(15))
            .send()
            .await
            .expect("an answer within 15 s (the node without the link waits 30 s for it)");
        assert_eq!(served_by(&r), Some(1), "{header}: forwarded to the link's node: {:?}", r.headers());
        assert_eq!(r.status().as_u16(), 200, "{header}");
    }
    // On the owner the header changes nothing either.
    let r = c
        .req(Method::GET, 1, &format!("/v1/computers/{id}/sessions"), &c.token)
        .header("x-computerd-forwarded", "1")
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 200);
}

/// Item 8: a desktop stream asked for and redeemed through the node without the link: the URL
/// names that node's host; the redemption's `303` keeps its `Location` and its `Set-Cookie`
/// (with `Secure`, the balancer saying `X-Forwarded-Proto: https`); the page loads with the
/// cookie through that node; a screenshot's bytes keep their size headers.
#[tokio::test]
async fn i36_8_a_desktop_stream_redeemed_through_a_node_without_the_link() {
    ensure_desktop_image();
    let c = TestCluster::start(2).await;
    let templates = json!({"templates": {
        "default": {"image": IMAGE, "cpus": 1.0, "memoryMb": 512, "pids": 256},
        "desktop": {"image": DESKTOP_IMAGE, "cpus": 1.0, "memoryMb": 1024, "pids": 512},
    }});
    // The sandboxes' agents dial node 1: it holds the link.
    let provider = docker_provider(&c, templates).await;
    let mut cleanup = Containers::default();
    let body = json!({"commandKey": "i36-8-desk", "name": "desk", "desktop": true, "source": {"_tag": "Provider", "provider": provider}});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&id);
    wait_state(&c, &id, "running").await;
    linked_to(&c, &id, 1).await;
    wait_for("the desktop to run", Duration::from_secs(60), || async {
        let (_, d) = c.call(Method::GET, 2, &format!("/v1/computers/{id}/desktop"), &c.token, None).await;
        (d["state"] == "running").then_some(())
    })
    .await;
    let node2 = c.nodes[&2].http.clone();

    // A screenshot's bytes, through node 2: the size headers come back.
    let r = c
        .req(Method::POST, 2, &format!("/v1/computers/{id}/desktop/screenshot"), &c.token)
        .header("accept", "image/png")
        .json(&json!({}))
        .send()
        .await
        .expect("screenshot");
    assert_eq!((r.status().as_u16(), served_by(&r)), (200, Some(1)));
    let header = |r: &reqwest::Response, h: &str| r.headers().get(h).and_then(|v| v.to_str().ok()).map(String::from);
    assert_eq!(header(&r, "content-type").as_deref(), Some("image/png"));
    let width = header(&r, "x-width").and_then(|w| w.parse::<u32>().ok());
    assert!(width.is_some_and(|w| w > 0), "X-Width comes back: {:?}", r.headers());
    assert!(header(&r, "x-height").is_some(), "X-Height comes back: {:?}", r.headers());

    // The stream URL, asked for through node 2, names the host the client addressed.
    let (s, v) = c
        .call(Method::POST, 2, &format!("/v1/computers/{id}/desktop/stream"), &c.token, Some(json!({"mode": "view"})))
        .await;
    assert_eq!(s, 200, "{v}");
    let url = v["url"].as_str().expect("url").to_string();
    assert!(url.starts_with(&format!("http://{node2}/v1/computers/{id}/desktop/view?ticket=")), "{url}");

    // Redeemed through node 2 behind a balancer that ended TLS.
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let r = http.get(&url).header("x-forwarded-proto", "https").send().await.expect("redeem");
    assert_eq!((r.status().as_u16(), served_by(&r)), (303, Some(1)), "{:?}", r.headers());
    let set = header(&r, "set-cookie").expect("the stream's cookie comes back");
    assert!(set.contains("HttpOnly") && set.contains(&format!("Path=/v1/computers/{id}/desktop")), "{set}");
    assert!(set.contains("; Secure"), "Secure behind https: {set}");
    let page = header(&r, "location").expect("the redirect's Location comes back");
    assert!(page.starts_with(&format!("/v1/computers/{id}/desktop/view/vnc.html")), "{page}");
    let cookie = set.split(';').next().expect("name=value").to_string();

    // noVNC's page, through node 2: with the cookie, and not without it.
    let page_url = c.url(2, page.split('?').next().unwrap_or_default());
    let without = http.get(&page_url).send().await.expect("page");
    assert_eq!(without.status().as_u16(), 401);
    let with = http.get(&page_url).header("cookie", format!("other=1; {cookie}")).send().await.expect("page");
    assert_eq!((with.status().as_u16(), served_by(&with)), (200, Some(1)), "the Cookie reaches the owner");
    assert_eq!(header(&with, "cache-control").as_deref(), Some("no-store"));
}
