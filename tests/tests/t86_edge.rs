//! The HTTP edge's limits, against a real node: a client that sends its headers too slowly is cut
//! off; pairing attempts from one source are rate-limited before they reach the store; a token
//! over its rate gets `429 rate_limited` with `Retry-After`; `/v1/health` without a token answers
//! liveness only; a wrong method gets the JSON error; a body over its route's limit is refused
//! with `413 too_large` and writes nothing; behind a balancer speaking the PROXY protocol, the
//! client it names is counted; HTTPS serves with the given certificate,
//! and an agent pairs and links over HTTPS/WSS with the CA pinned; an agent refuses plain HTTP to
//! a non-loopback server.

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
    // The limit lets the allowance through: a limiter that refused everything would pass the
    // bound above.
    assert!(reached >= 5, "only {reached} of the 10 allowed attempts reached the handler");
    assert_eq!(limited + reached, 1000);
    assert!(after - before <= 10, "the log grew by {} entries", after - before);
    eprintln!("1000 attempts: {reached} reached the handler, {limited} limited; log +{}", after - before);
}

/// A token over its rate (5 a second, bursts of 10) gets `429 rate_limited` with `Retry-After`.
#[tokio::test]
async fn t30_a_token_over_its_rate_is_told_when_to_come_back() {
    let c = TestCluster::start_with(1, &["--token-per-sec", "5"]).await;
    // A token of its own: the harness's calls spent some of the owner token's budget.
    let token = c.mint(json!({"name": "quick"})).await;
    let (mut limited, mut through) = (None, 0);
    for _ in 0..100 {
        let r = c.req(Method::GET, 1, "/v1/members", &token).send().await.expect("send");
        if r.status() == 429 {
            limited = Some(r);
            break;
        }
        assert_eq!(r.status(), 200);
        through += 1;
    }
    let r = limited.expect("a 429 within 100 quick calls");
    // The burst of 10 goes through first (a limiter that refused at once would pass the rest).
    assert!(through >= 10, "only {through} calls went through before the first 429");
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

/// A control call's body over 256 KiB, and a pairing body over 4 KiB, are refused `413
/// too_large` whether they declare their length or not, and nothing reaches the store; a session
/// command of 300 KiB is taken by its route (1 MiB).
#[tokio::test]
async fn t45_bodies_over_their_route_limit() {
    let c = TestCluster::start(1).await;
    let applied = || async { c.health(1).await.expect("health")["lastApplied"].as_u64().expect("lastApplied") };
    let before = applied().await;
    let big = json!({"name": "x".repeat(300 << 10)});
    let (s, v) = c.call(Method::POST, 1, "/v1/bots", &c.token, Some(big.clone())).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (413, Some("too_large")), "{v}");
    // The same without a declared length (chunked): cut off at the limit.
    let mut tcp = tokio::net::TcpStream::connect(&c.nodes[&1].http).await.expect("connect");
    let body = big.to_string();
    let head = format!(
        "POST /v1/bots HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n",
        c.token,
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.expect("head");
    // The node may answer and close before taking the whole body.
    let _ = tcp.write_all(body.as_bytes()).await;
    let _ = tcp.write_all(b"\r\n0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let r =
        c.http.post(c.url(1, "/v1/agent/pair")).json(&json!({"code": "x".repeat(5000)})).send().await.expect("send");
    assert_eq!(r.status(), 413);
    assert_eq!(applied().await, before, "nothing was written");
    let session = json!({"command": "x".repeat(300 << 10)});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers/cmp_none/sessions", &c.token, Some(session)).await;
    assert_ne!(s, 413, "a session route takes 300 KiB: {v}");
}

/// One pairing attempt on a new connection from 127.0.0.77 (the trusted balancer), after `proxy`
/// bytes: the answer's status line, or "" when the connection was closed unanswered.
async fn through_balancer(addr: &str, proxy: &[u8]) -> String {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.77:0".parse().expect("addr")).expect("bind the balancer's address");
    let mut tcp = socket.connect(addr.parse().expect("node addr")).await.expect("connect");
    let body = r#"{"code":"NOTACODE"}"#;
    let req = format!(
        "POST /v1/agent/pair HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tcp.write_all(proxy).await;
    let _ = tcp.write_all(req.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_string()
}

/// A PROXY v2 header (PROXY command, TCP over IPv4) naming `client`.
fn proxy_v2(client: [u8; 4], port: u16) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend([0x21, 0x11, 0, 12]);
    h.extend(client);
    h.extend([127, 0, 0, 1]);
    h.extend(port.to_be_bytes());
    h.extend(8080u16.to_be_bytes());
    h
}

/// `--proxy-protocol`: a trusted balancer's connections start with a PROXY header (v1 or v2), and
/// the client it names is what the per-source limit counts; its connection without one is closed
/// unanswered; anyone else is counted by their own address.
#[tokio::test]
async fn t47_the_proxy_protocol_names_the_client() {
    let c = TestCluster::start_with(
        1,
        &["--unauthenticated-per-min", "3", "--trusted-proxy", "127.0.0.77", "--proxy-protocol"],
    )
    .await;
    let addr = c.nodes[&1].http.clone();
    let v1 = |ip: &str| format!("PROXY TCP4 {ip} 127.0.0.1 40000 8080\r\n").into_bytes();
    for i in 0..3 {
        let status = through_balancer(&addr, &v1("10.1.2.3")).await;
        assert!(status.starts_with("HTTP/1.1 4") && !status.contains("429"), "attempt {i}: {status}");
    }
    assert!(through_balancer(&addr, &v1("10.1.2.3")).await.contains("429"), "10.1.2.3 used its 3");
    assert!(through_balancer(&addr, &proxy_v2([10, 1, 2, 3], 40001)).await.contains("429"), "v2 names it too");
    let other = through_balancer(&addr, &proxy_v2([10, 1, 2, 4], 40002)).await;
    assert!(other.starts_with("HTTP/1.1 4") && !other.contains("429"), "10.1.2.4 has its own: {other}");
    assert_eq!(through_balancer(&addr, b"").await, "", "the balancer's connection without a header is closed");
    assert_eq!(through_balancer(&addr, b"PROXY TCP4 nonsense\r\n").await, "", "a bad header too");
    // A client that is not the balancer is counted by its own address, header or not.
    let r = c.http.post(c.url(1, "/v1/agent/pair")).json(&json!({"code": "NOTACODE"})).send().await.expect("send");
    assert_ne!(r.status(), 429, "127.0.0.1 has its own budget");
}

/// `--tls-cert`/`--tls-key`: the API is served over TLS with that certificate (a client that
/// trusts its CA gets `/v1/health`), and plain HTTP on the same port gets no answer.
#[tokio::test]
async fn t50_https_with_the_given_certificate() {
    let dir = tempfile::tempdir().expect("dir");
    let ca_hash = edge_certs(dir.path());
    let (http, _token, mut node) = tls_node(dir.path()).await;
    let config = computerd_raft::tls::enroll_client_config(&ca_hash).expect("client config");
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

/// A CA, and a certificate it signed for 127.0.0.1 and `computerd-node` with its CA in the chain:
/// files `edge.crt`, `edge.key`, `ca.pem` in `dir`; answers the CA's SHA-256.
fn edge_certs(dir: &std::path::Path) -> String {
    use rcgen::BasicConstraints;
    use rcgen::CertificateParams;
    use rcgen::IsCa;
    use rcgen::Issuer;
    use rcgen::KeyPair;
    use sha2::Digest;
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("key");
    let params = CertificateParams::new(vec!["127.0.0.1".to_string(), "computerd-node".to_string()]).expect("params");
    let cert = params.signed_by(&key, &issuer).expect("cert");
    std::fs::write(dir.join("edge.crt"), format!("{}{}", cert.pem(), ca.pem())).expect("cert");
    std::fs::write(dir.join("edge.key"), key.serialize_pem()).expect("key");
    std::fs::write(dir.join("ca.pem"), ca.pem()).expect("ca");
    hex::encode(sha2::Sha256::digest(ca.der().as_ref()))
}

/// One node serving HTTPS with `dir`'s `edge.crt`/`edge.key` (started by hand: the harness speaks
/// plain HTTP), once it bootstrapped: its address, the owner token, the process.
async fn tls_node(dir: &std::path::Path) -> (String, String, std::process::Child) {
    let (http, grpc) =
        (format!("127.0.0.1:{}", computerd_tests::free_port()), format!("127.0.0.1:{}", computerd_tests::free_port()));
    let data = dir.join("node");
    let node = std::process::Command::new(computerd_tests::computerd_bin())
        .args(["serve", "--node-id", "1", "--http", &http, "--grpc", &grpc, "--data"])
        .arg(&data)
        .arg("--tls-cert")
        .arg(dir.join("edge.crt"))
        .arg("--tls-key")
        .arg(dir.join("edge.key"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("computerd");
    let token_file = data.join("admin.token");
    let token = computerd_tests::wait_for("the node to bootstrap", Duration::from_secs(60), || async {
        std::fs::read_to_string(&token_file).ok().filter(|t| t.ends_with('\n'))
    })
    .await;
    (http, token.trim().to_string(), node)
}

/// One HTTP/1.1 call over TLS to `addr`, trusting the CA with `ca_hash`: status and JSON body.
async fn https(
    addr: &str,
    ca_hash: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let config = computerd_raft::tls::enroll_client_config(ca_hash).expect("client config");
    let mut config = (*config).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("computerd-node").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("TLS handshake");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: computerd-node\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(req.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let json = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    // The body may be chunked: take the JSON object inside.
    let json = json.find('{').and_then(|i| json.rfind('}').map(|j| &json[i..=j])).unwrap_or("null");
    (status, serde_json::from_str(json).unwrap_or(serde_json::Value::Null))
}

/// An agent given `--server https://… --ca CA` pairs over HTTPS and links over WSS to a node
/// serving TLS; an agent told plain http:// to a non-loopback server refuses before sending.
#[tokio::test]
async fn t60_an_agent_links_over_wss_with_a_pinned_ca() {
    let dir = tempfile::tempdir().expect("dir");
    let hash = edge_certs(dir.path());
    let ca = dir.path().join("ca.pem");
    let (http, token, mut node) = tls_node(dir.path()).await;
    let port = http.rsplit_once(':').map(|(_, p)| p.to_string()).expect("port");
    let body = json!({"commandKey": "wss", "name": "wss", "source": {"_tag": "Paired"}});
    let (s, r) = https(&http, &hash, "POST", "/v1/computers", &token, Some(body)).await;
    assert_eq!(s, 202, "{r}");
    let (exe, id) =
        (r["executionId"].as_str().expect("exe").to_string(), r["resource"]["id"].as_str().expect("id").to_string());
    let code = computerd_tests::wait_for("the pairing code", Duration::from_secs(30), || async {
        let (_, e) = https(&http, &hash, "GET", &format!("/v1/executions/{exe}"), &token, None).await;
        e["pairingCode"].as_str().map(String::from)
    })
    .await;
    let state = dir.path().join("agent");
    let mut agent = std::process::Command::new(computerd_tests::agent::agent_bin());
    computerd_tests::agent::own_home(&mut agent, &state);
    let mut agent = agent
        .args(["--server", &format!("https://127.0.0.1:{port}"), "--pair", &code, "--state"])
        .arg(&state)
        .arg("--ca")
        .arg(&ca)
        .stderr(std::fs::File::create(dir.path().join("agent.log")).expect("log"))
        .spawn()
        .expect("agent");
    computerd_tests::wait_for("the agent's link over WSS", Duration::from_secs(30), || async {
        let (_, v) = https(&http, &hash, "GET", &format!("/v1/computers/{id}"), &token, None).await;
        (v["state"] == "running").then_some(())
    })
    .await;
    let (s, v) = https(
        &http,
        &hash,
        "POST",
        &format!("/v1/computers/{id}/sessions"),
        &token,
        Some(json!({"command": "echo over-wss"})),
    )
    .await;
    // `bash -lc` reads the machine's login scripts first, and they may print before the command
    // does (this machine's pyenv prints "cannot rehash" when two shells start at once): the
    // command's own output is what follows its first line, checked whole.
    let output = v["output"].as_str().unwrap_or_default();
    assert_eq!((s, output.find("over-wss").map(|i| &output[i..])), (200, Some("over-wss\n")), "{v}");
    let _ = agent.kill();
    let _ = agent.wait();
    let _ = node.kill();
    let _ = node.wait();

    let out = std::process::Command::new(computerd_tests::agent::agent_bin())
        .args(["--server", "http://computerd.example.invalid:8080", "--state"])
        .arg(dir.path().join("agent2"))
        .output()
        .expect("agent");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("refusing plain http://"), "{err}");
}

/// The organization's caps (`/v1/limits`): an owner lowers the live bots per member, a create
/// past it is refused `409 conflict` and stores nothing, archiving one frees a place; a value out
/// of range is `400` and changes nothing; a member who is not an admin may not set them.
#[tokio::test]
async fn t55_limits_bound_creates_and_only_an_admin_sets_them() {
    let c = TestCluster::start(1).await;
    let (s, v) = c.call(Method::GET, 1, "/v1/limits", &c.token, None).await;
    assert_eq!((s, v["liveBotsPerMember"].as_u64(), v["bots"].as_u64()), (200, Some(1_000), Some(100_000)), "{v}");
    let (s, v) = c.call(Method::GET, 1, "/v1/bots", &c.token, None).await;
    assert_eq!(s, 200, "{v}");
    let live = v["bots"].as_array().map(|b| b.iter().filter(|b| b["archivedAt"].is_null()).count()).unwrap_or(0) as u64;
    let (s, v) = c.call(Method::PUT, 1, "/v1/limits", &c.token, Some(json!({"liveBotsPerMember": live + 1}))).await;
    assert_eq!((s, v["liveBotsPerMember"].as_u64(), v["bots"].as_u64()), (200, Some(live + 1), Some(100_000)), "{v}");
    let (s, first) = c.create_bot(1, "within").await.expect("create");
    assert_eq!(s, 201, "{first}");
    let (s, v) = c.create_bot(1, "past-the-cap").await.expect("create");
    assert_eq!((s, v["error"]["kind"].as_str()), (409, Some("conflict")), "{v}");
    let (_, v) = c.call(Method::GET, 1, "/v1/bots", &c.token, None).await;
    let names: Vec<&str> = v["bots"].as_array().expect("bots").iter().filter_map(|b| b["name"].as_str()).collect();
    assert!(!names.contains(&"past-the-cap"), "a refused create stores nothing: {names:?}");
    let archive = format!("/v1/bots/{}/archive", first["id"].as_str().expect("id"));
    assert_eq!(c.call(Method::POST, 1, &archive, &c.token, None).await.0, 200);
    assert_eq!(c.create_bot(1, "after-archiving").await.expect("create").0, 201);

    // The list pages in id order: one bot a page reads the same bots as one page of all.
    let (_, all) = c.call(Method::GET, 1, "/v1/bots", &c.token, None).await;
    let all: Vec<&str> = all["bots"].as_array().expect("bots").iter().filter_map(|b| b["id"].as_str()).collect();
    assert!(all.len() >= 2, "{all:?}");
    let (mut paged, mut after) = (Vec::new(), None::<String>);
    loop {
        let path = after.as_ref().map_or("/v1/bots?limit=1".to_string(), |a| format!("/v1/bots?limit=1&after={a}"));
        let (s, v) = c.call(Method::GET, 1, &path, &c.token, None).await;
        assert_eq!(s, 200, "{v}");
        paged.extend(v["bots"].as_array().expect("bots").iter().filter_map(|b| b["id"].as_str().map(String::from)));
        match v["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => break,
        }
        assert!(paged.len() <= all.len(), "paging ends");
    }
    assert_eq!(paged, all);
    let (s, v) = c.call(Method::GET, 1, "/v1/bots?limit=0", &c.token, None).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");

    for bad in [json!({"bots": 0}), json!({"liveComputersPerMember": 100_001}), json!({"liveBots": 5})] {
        let (s, v) = c.call(Method::PUT, 1, "/v1/limits", &c.token, Some(bad.clone())).await;
        assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{bad}: {v}");
    }
    let (_, v) = c.call(Method::GET, 1, "/v1/limits", &c.token, None).await;
    assert_eq!(v["liveBotsPerMember"].as_u64(), Some(live + 1), "refused settings changed nothing: {v}");

    let (_, m) = c.call(Method::POST, 1, "/v1/members", &c.token, Some(json!({"name": "mia"}))).await;
    let mia = m["id"].as_str().expect("member id");
    let (_, t) = c.call(Method::POST, 1, "/v1/tokens", &c.token, Some(json!({"name": "mia", "memberId": mia}))).await;
    let mia_secret = t["secret"].as_str().expect("secret");
    let (s, v) = c.call(Method::PUT, 1, "/v1/limits", mia_secret, Some(json!({"bots": 1_000_000}))).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "{v}");
}
