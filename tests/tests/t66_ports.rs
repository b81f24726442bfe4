//! Public port addresses of a real sandbox, on a 3-node cluster behind HAProxy: a Python
//! service in the sandbox (`tests/fixtures/port_server.py`) is reached at
//! `<port>-<label>.localhost` through a node that does not hold the Computer's link and through
//! the balancer: plain answers, a 64 KiB body, a 1 MiB streamed upload, server-sent events that
//! arrive while the answer is still open, and a WebSocket echo. An unknown label, another
//! port's name and a wrong domain are refused; the list never shows the address; `DELETE`
//! ends the address on every node at once; a request to a paused Computer resumes it; a deleted
//! Computer's address answers 404.

use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::wait_state;
use computerd_tests::docker::Containers;
use computerd_tests::docker::docker_provider;
use computerd_tests::lb::Haproxy;
use computerd_tests::wait::wait_for;
use futures::SinkExt;
use futures::StreamExt;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const SERVER: &str = include_str!("../fixtures/port_server.py");

/// The host name of an address (`http://8000-<label>.localhost:1234/` → `8000-<label>.localhost`).
fn host_of(url: &str) -> String {
    let rest = url.strip_prefix("http://").expect("a dev address is plain http");
    let authority = rest.split('/').next().expect("authority");
    authority.rsplit_once(':').map_or(authority, |(h, _)| h).to_string()
}

/// A request to `addr` (a node or the balancer) for the public address `host`.
async fn get(c: &TestCluster, addr: &str, host: &str, path: &str) -> (u16, Vec<u8>) {
    let r = c.http.get(format!("http://{addr}{path}")).header("host", host).send().await.expect("request");
    let s = r.status().as_u16();
    (s, r.bytes().await.expect("body").to_vec())
}

async fn put_port(c: &TestCluster, id: &str, port: u16) -> Value {
    let (s, v) = c
        .call(Method::PUT, 2, &format!("/v1/computers/{id}/ports/{port}"), &c.token, Some(json!({"protocol": "http"})))
        .await;
    assert_eq!(s, 200, "{v}");
    v
}

#[tokio::test]
async fn t10_a_sandbox_port_through_any_node_and_the_balancer() {
    let c = TestCluster::start(3).await;
    let lb = Haproxy::start(c.dir.path(), &c.nodes.values().map(|n| n.http.clone()).collect::<Vec<_>>()).await;
    let provider = docker_provider(&c, json!({})).await;
    let mut cleanup = Containers::default();
    let body = json!({"commandKey": "ports", "name": "ports", "source": {"_tag": "Provider", "provider": provider}});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&id);
    wait_state(&c, &id, "running").await;

    // The service, on a free port of the sandbox's loopback (the test's sandboxes share the
    // host's network).
    let port = computerd_tests::free_port();
    let (s, v) = c
        .call(
            Method::PUT,
            1,
            &format!("/v1/computers/{id}/files?path=server.py"),
            &c.token,
            Some(json!({"content": SERVER})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let start = json!({"command": format!("exec python3 server.py {port} 2>server.err"), "yieldTimeMs": 300});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(start)).await;
    assert_eq!((s, &v["running"]), (200, &json!(true)), "{v}");

    // The address: shown once, a plain-http dev name under localhost.
    let v = put_port(&c, &id, port).await;
    let url = v["url"].as_str().expect("url").to_string();
    let host = host_of(&url);
    let label = host.strip_prefix(&format!("{port}-")).and_then(|h| h.strip_suffix(".localhost")).expect("name");
    assert!(label.len() == 32 && label.bytes().all(|b| b.is_ascii_hexdigit()), "{url}");
    assert_eq!(v["state"], "open", "{v}");
    let (s, list) = c.call(Method::GET, 3, &format!("/v1/computers/{id}/ports"), &c.token, None).await;
    assert_eq!(s, 200, "{list}");
    assert_eq!(list["ports"][0]["port"], port, "{list}");
    assert!(!list.to_string().contains(label), "the list never shows the address: {list}");

    // Which node holds the link; one that does not.
    let (_, cv) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    let owner = cv["linkNode"].as_u64();
    assert!(owner.is_some(), "{cv}");
    let other = c.nodes.keys().copied().find(|n| Some(*n) != owner).expect("a node without the link");
    let other_addr = c.nodes[&other].http.clone();

    // Through the node without the link (once the service listens).
    let seen = wait_for("the service to answer through its address", Duration::from_secs(30), || {
        let (c, addr, host) = (&c, other_addr.clone(), host.clone());
        async move {
            let (s, b) = get(c, &addr, &host, "/hello?x=1").await;
            (s == 200).then(|| String::from_utf8_lossy(&b).to_string())
        }
    })
    .await;
    assert!(seen.starts_with(&format!("host={host}")), "the service sees its public host: {seen}");
    assert!(seen.contains("xff=127.0.0.1") && seen.ends_with("path=/hello?x=1"), "{seen}");
    let (s, big) = get(&c, &other_addr, &host, "/big").await;
    assert_eq!(s, 200);
    assert_eq!(big, (0..64 * 1024).map(|i| (i % 251) as u8).collect::<Vec<u8>>(), "64 KiB, byte for byte");

    // Each answer names the node holding the link, so the balancer sends the address's next
    // requests there (and drops the header): after the first, every one lands on the owner.
    let r = c.http.get(format!("http://{other_addr}/hello")).header("host", &host).send().await.expect("request");
    assert_eq!(
        r.headers().get("x-computerd-link-node").and_then(|v| v.to_str().ok()),
        owner.map(|o| o.to_string()).as_deref()
    );
    let mut served = Vec::new();
    for _ in 0..7 {
        let r = c.http.get(lb.url("/hello")).header("host", &host).send().await.expect("request");
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("x-computerd-link-node").is_none(), "the balancer drops it: {:?}", r.headers());
        served.push(r.headers().get(computerd_tests::lb::SERVED_BY).and_then(|v| v.to_str().ok()).map(String::from));
    }
    let to_owner = owner.map(|o| format!("n{o}"));
    assert!(served[1..].iter().all(|s| *s == to_owner), "all but the first go to {to_owner:?}: {served:?}");

    // A 1 MiB upload, streamed in chunks (no length known up front), through the balancer.
    let chunks: Vec<Vec<u8>> = (0..16u8).map(|i| vec![i; 64 * 1024]).collect();
    let digest = hex::encode(sha2::Sha256::digest(chunks.concat()));

    let frames = chunks.into_iter().map(|c| Ok::<_, std::io::Error>(hyper::body::Frame::data(bytes::Bytes::from(c))));
    let stream = http_body_util::StreamBody::new(futures::stream::iter(frames));
    let r = c
        .http
        .post(lb.url("/upload"))
        .header("host", &host)
        .header("content-length", (1 << 20).to_string())
        .body(reqwest::Body::wrap(stream))
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.expect("text"), format!("{} {digest}", 1 << 20));

    // Server-sent events: the first arrives while the answer is still open (the service holds
    // the second until the test releases it).
    let mut sse = c.http.get(lb.url("/sse")).header("host", &host).send().await.expect("sse");
    assert_eq!(sse.headers()["content-type"], "text/event-stream");
    let mut got = String::new();
    while !got.contains("data: one\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(20), sse.chunk()).await.expect("event in time");
        got.push_str(&String::from_utf8_lossy(&chunk.expect("chunk").expect("open")));
    }
    assert!(!got.contains("two"), "{got}");
    assert_eq!(get(&c, &other_addr, &host, "/release").await.0, 200);
    while let Some(chunk) = sse.chunk().await.expect("chunk") {
        got.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert_eq!(got, "data: one\n\ndata: two\n\n");

    // A WebSocket through the balancer: text and a 100 KB binary message echoed.
    let mut req = format!("ws://{}/ws", lb.addr).into_client_request().expect("ws request");
    req.headers_mut().insert("host", host.parse().expect("host"));
    let tcp = tokio::net::TcpStream::connect(&lb.addr).await.expect("connect");
    let (mut ws, resp) = tokio_tungstenite::client_async(req, tcp).await.expect("websocket through the address");
    assert_eq!(resp.status(), 101);
    ws.send(Message::text("héllo wörld")).await.expect("send");
    let blob: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    ws.send(Message::binary(blob.clone())).await.expect("send");
    let echo = |m: Option<Result<Message, _>>| m.expect("open").expect("message");
    assert_eq!(echo(ws.next().await), Message::text("héllo wörld"));
    assert_eq!(echo(ws.next().await), Message::binary(blob));
    ws.close(None).await.expect("close");

    // Every node answers it (the balancer goes round all three).
    for n in c.nodes.values() {
        assert_eq!(get(&c, &n.http, &host, "/hello").await.0, 200, "node {}", n.id);
    }

    // Refused: an unknown label, the label with another port, another domain's name.
    let unknown = format!("{port}-{}.localhost", "0".repeat(32));
    let (s, b) = get(&c, &other_addr, &unknown, "/").await;
    let err: Value = serde_json::from_slice(&b).expect("error body");
    assert_eq!((s, err["error"]["kind"].as_str()), (404, Some("not_found")), "{err}");
    assert_eq!(get(&c, &other_addr, &format!("{}-{label}.localhost", port + 1), "/").await.0, 404);
    let (s, b) = get(&c, &other_addr, &format!("{port}-{label}.example.com"), "/v1/health").await;
    assert_eq!(s, 200, "another name is the API's: {}", String::from_utf8_lossy(&b));

    // DELETE ends it on every node at once, and the WebSocket open through it.
    let mut req = format!("ws://{}/ws", lb.addr).into_client_request().expect("ws request");
    req.headers_mut().insert("host", host.parse().expect("host"));
    let tcp = tokio::net::TcpStream::connect(&lb.addr).await.expect("connect");
    let (mut open_ws, _) = tokio_tungstenite::client_async(req, tcp).await.expect("websocket");
    open_ws.send(Message::text("before")).await.expect("send");
    assert_eq!(echo(open_ws.next().await), Message::text("before"));
    let (s, v) = c.call(Method::DELETE, 3, &format!("/v1/computers/{id}/ports/{port}"), &c.token, None).await;
    assert_eq!(s, 204, "{v}");
    for n in c.nodes.values() {
        assert_eq!(get(&c, &n.http, &host, "/hello").await.0, 404, "node {} after DELETE", n.id);
    }
    let after = tokio::time::timeout(Duration::from_secs(10), open_ws.next()).await.expect("the socket ends in time");
    assert!(!matches!(after, Some(Ok(Message::Text(_) | Message::Binary(_)))), "{after:?}");

    // A new address; the Computer paused; a request to it resumes the Computer.
    let url = put_port(&c, &id, port).await["url"].as_str().expect("url").to_string();
    let host = host_of(&url);
    let (s, v) = c
        .call(Method::POST, 1, &format!("/v1/computers/{id}/pause"), &c.token, Some(json!({"commandKey": "p1"})))
        .await;
    assert_eq!(s, 202, "{v}");
    wait_state(&c, &id, "paused").await;
    let (s, b) = get(&c, &lb.addr, &host, "/hello").await;
    assert_eq!(s, 200, "a request resumes the paused computer: {}", String::from_utf8_lossy(&b));
    let (_, cv) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(cv["state"], "running", "{cv}");

    // A deleted Computer's address answers 404.
    let (s, v) =
        c.call(Method::DELETE, 1, &format!("/v1/computers/{id}"), &c.token, Some(json!({"commandKey": "d1"}))).await;
    assert_eq!(s, 202, "{v}");
    wait_for("the computer to be deleted", Duration::from_secs(60), || async {
        (c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await.0 == 404).then_some(())
    })
    .await;
    assert_eq!(get(&c, &lb.addr, &host, "/hello").await.0, 404);
}
