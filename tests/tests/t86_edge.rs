//! The HTTP edge's limits, against a real node: a client that sends its headers too slowly is cut
//! off; pairing attempts from one source are rate-limited before they reach the store; a token
//! over its rate gets `429 rate_limited` with `Retry-After`; `/v1/health` without a token answers
//! liveness only; a wrong method gets the JSON error; HTTPS serves with the given certificate.

use std::time::Duration;
use std::time::Instant;

use computerd_tests::TestCluster;
use reqwest::Method;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

/// Headers sent too slowly: the connection is closed at the header timeout (1 s here), and the
/// node goes on answering others.
#[tokio::test]
async fn t10_a_slow_header_client_is_cut_off() {
    let c = TestCluster::start_with(1, &["--header-timeout-secs", "1"]).await;
    let mut slow = tokio::net::TcpStream::connect(&c.nodes[&1].http).await.expect("connect");
    slow.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n").await.expect("part of the headers");
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match slow.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {} // a 408 answer may come first
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the slow client is still connected after 5 s");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(3), "cut off after {took:?}");
    assert!(c.health(1).await.is_some(), "others are still served");
}

/// 1,000 pairing attempts from one source with 10 a minute allowed: at most 10 reach the
/// handler, the rest are `429 rate_limited` with `Retry-After`, and the Raft log grows by at most
/// the 10 let through.
#[tokio::test]
async fn t20_pairing_attempts_are_rate_limited_before_the_store() {
    let c = TestCluster::start_with(1, &["--unauthenticated-per-min", "10"]).await;
    let applied = |h: serde_json::Value| h["lastApplied"].as_u64().expect("lastApplied");
    let before = applied(c.health(1).await.expect("health"));
    let (mut limited, mut reached) = (0, 0);
    for _ in 0..1000 {
        let r = c.http.post(c.url(1, "/v1/agent/pair")).json(&json!({"code": "NOTACODE"})).send().await.expect("send");
        match r.status().as_u16() {
            429 => {
                assert!(r.headers().contains_key("retry-after"), "Retry-After");
                let v: serde_json::Value = r.json().await.expect("json");
                assert_eq!(v["error"]["kind"], "rate_limited");
                limited += 1;
            }
            _ => reached += 1,
        }
    }
    let after = applied(c.health(1).await.expect("health"));
    assert!(reached <= 10, "{reached} attempts reached the handler");
    assert_eq!(limited + reached, 1000);
    assert!(after - before <= 10, "the log grew by {} entries", after - before);
    eprintln!("1000 attempts: {reached} reached the handler, {limited} limited; log +{}", after - before);
}

/// A token over its rate (5 a second, bursts of 10) gets `429 rate_limited` with `Retry-After`.
#[tokio::test]
async fn t30_a_token_over_its_rate_is_told_when_to_come_back() {
    let c = TestCluster::start_with(1, &["--token-per-sec", "5"]).await;
    let mut limited = None;
    for _ in 0..100 {
        let r = c.req(Method::GET, 1, "/v1/members", &c.token).send().await.expect("send");
        if r.status() == 429 {
            limited = Some(r);
            break;
        }
    }
    let r = limited.expect("a 429 within 100 quick calls");
    let retry: u64 = r.headers()["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!(retry >= 1);
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(v["error"]["kind"], "rate_limited", "{v}");
}

/// `/v1/health` without a token: liveness, no addresses; with the owner's token: the members. A
/// method a route does not take: `405` with the JSON error body.
#[tokio::test]
async fn t40_health_without_a_token_and_json_405() {
    let c = TestCluster::start(1).await;
    let anon: serde_json::Value =
        c.http.get(c.url(1, "/v1/health")).send().await.expect("send").json().await.expect("json");
    assert_eq!(anon["status"], "ok", "{anon}");
    assert!(anon.get("members").is_none(), "no member addresses without a token: {anon}");
    let full = c.health(1).await.expect("health");
    assert!(full["members"].as_array().is_some_and(|m| m.len() == 1), "{full}");
    let r = c.req(Method::PUT, 1, "/v1/health", &c.token).send().await.expect("send");
    assert_eq!(r.status(), 405);
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(v["error"]["kind"], "method_not_allowed", "{v}");
}

/// `--tls-cert`/`--tls-key`: the API is served over TLS with that certificate (a client that
/// trusts its CA gets `/v1/health`), and plain HTTP on the same port gets no answer.
#[tokio::test]
async fn t50_https_with_the_given_certificate() {
    let dir = tempfile::tempdir().expect("dir");
    // A CA and a certificate for "computerd-node", made with the project's own certificate code.
    let pki =
        computerd_raft::tls::Pki::bootstrap(dir.path(), "cls_edge", 1, computerd_raft::tls::VALIDITY).expect("pki");
    let pem = std::fs::read_to_string(dir.path().join("node.pem")).expect("node.pem");
    let cert = dir.path().join("edge.crt");
    let key = dir.path().join("edge.key");
    let split = pem.find("-----BEGIN PRIVATE KEY-----").expect("the key in node.pem");
    // The chain: the certificate, then its CA (the client below checks the CA's hash).
    std::fs::write(&cert, format!("{}{}", &pem[..split], pki.ca_pem())).expect("cert");
    std::fs::write(&key, &pem[split..]).expect("key");
    // One node, started by hand (the harness speaks plain HTTP).
    let (http, grpc) =
        (format!("127.0.0.1:{}", computerd_tests::free_port()), format!("127.0.0.1:{}", computerd_tests::free_port()));
    let data = dir.path().join("node");
    let mut node = std::process::Command::new(computerd_tests::computerd_bin())
        .args(["serve", "--node-id", "1", "--http", &http, "--grpc", &grpc, "--data"])
        .arg(&data)
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("computerd");
    let token = data.join("admin.token");
    computerd_tests::wait_for("the node to bootstrap", Duration::from_secs(60), || async {
        std::fs::read_to_string(&token).ok().filter(|t| t.ends_with('\n')).map(drop)
    })
    .await;
    let config = computerd_raft::tls::enroll_client_config(&pki.ca_hash()).expect("client config");
    let mut rustls_config = (*config).clone();
    rustls_config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(rustls_config));
    let tcp = tokio::net::TcpStream::connect(&http).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("computerd-node").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("TLS handshake");
    tls.write_all(b"GET /v1/health HTTP/1.1\r\nHost: computerd-node\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.expect("read");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"status\":\"ok\""), "{answer}");
    let plain =
        reqwest::Client::new().get(format!("http://{http}/v1/health")).timeout(Duration::from_secs(5)).send().await;
    assert!(plain.is_err() || !plain.expect("answer").status().is_success(), "plain HTTP gets no health");
    let _ = node.kill();
    let _ = node.wait();
}
