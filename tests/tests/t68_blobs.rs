//! Blobs through the API on a real node: an upload whose bytes hash to the declared SHA-256 is
//! stored and read back byte for byte; a wrong digest or a short body answers `422
//! DigestMismatch` and stores nothing (the quota is untouched); the quota refuses what would
//! pass it; a bot reads its own blobs and not its member's; bad names and digests are refused.
//! In a cluster each blob is on two nodes before the upload is answered, every node serves it,
//! and it survives the loss of the node that took it. With an S3-compatible store (moto's
//! server) every node reaches the same bytes, which are in the bucket and not on the nodes.

use computerd_tests::TestCluster;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

async fn upload(c: &TestCluster, token: &str, query: &str, body: Vec<u8>) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(c.url(1, &format!("/api/blobs?{query}")))
        .bearer_auth(token)
        .header("content-type", "application/pdf")
        .body(body)
        .send()
        .await
        .expect("upload");
    let s = r.status().as_u16();
    (s, r.json().await.unwrap_or(Value::Null))
}

fn sha(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

#[tokio::test]
async fn t10_blobs_are_checked_as_they_stream() {
    let c = TestCluster::start(1).await;
    let report: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let (s, v) = upload(&c, &c.token, &format!("sha={}&name=report.pdf", sha(&report)), report.clone()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["size"].as_u64(), v["name"].as_str(), v["mimeType"].as_str()),
        (Some(200_000), Some("report.pdf"), Some("application/pdf")),
        "{v}"
    );
    let id = v["blobId"].as_str().expect("id").to_string();
    let r = reqwest::Client::new()
        .get(c.url(1, &format!("/api/blobs/{id}")))
        .bearer_auth(&c.token)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers().get("x-sha256").and_then(|v| v.to_str().ok()), Some(sha(&report).as_str()));
    assert_eq!(r.bytes().await.expect("bytes").to_vec(), report, "the same bytes back");

    // A wrong digest, or a body that is not the declared length: 422, nothing stored.
    let (s, v) = upload(&c, &c.token, &format!("sha={}", sha(b"something else")), report.clone()).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (422, Some("DigestMismatch")), "{v}");
    let (s, v) = upload(&c, &c.token, "sha=abc", report.clone()).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = upload(&c, &c.token, &format!("sha={}&name=a/b", sha(&report)), report.clone()).await;
    assert_eq!(s, 400, "{v}");

    // The quota: what is stored counts, refused uploads do not.
    let (s, v) = c.call(Method::PUT, 1, "/v1/blob-limits", &c.token, Some(json!({"quotaBytes": 300_000}))).await;
    assert_eq!((s, v["quotaBytes"].as_u64()), (200, Some(300_000)), "{v}");
    let small = vec![7u8; 100_000];
    let (s, v) = upload(&c, &c.token, &format!("sha={}", sha(&small)), small.clone()).await;
    assert_eq!(s, 200, "200,000 + 100,000 fit a 300,000-byte quota (the mismatch counted nothing): {v}");
    let (s, v) = upload(&c, &c.token, &format!("sha={}", sha(b"x")), b"x".to_vec()).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (409, Some("conflict")), "over the quota: {v}");

    // A bot reads its own blobs, not its member's.
    let bot = c.create_bot(1, "blob-bot").await.expect("bot").1["id"].as_str().expect("bot id").to_string();
    let bot_token = c.mint(json!({"name": "blob-bot", "botId": bot})).await;
    let (s, _) = c.call(Method::GET, 1, &format!("/api/blobs/{id}/info"), &bot_token, None).await;
    assert_eq!(s, 404, "not the bot's");
    let (s, v) = c.call(Method::PUT, 1, "/v1/blob-limits", &c.token, Some(json!({"quotaBytes": 1_000_000}))).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) =
        upload(&c, &bot_token, &format!("sha={}&name=shot.png&mimeType=image/png", sha(&small)), small.clone()).await;
    assert_eq!(s, 200, "{v}");
    let (s, info) = c
        .call(
            Method::GET,
            1,
            &format!("/api/blobs/{}/info", v["blobId"].as_str().unwrap_or_default()),
            &bot_token,
            None,
        )
        .await;
    assert_eq!(
        (s, info["mimeType"].as_str(), info["by"]["botId"].as_str()),
        (200, Some("image/png"), Some(bot.as_str())),
        "{info}"
    );
    let (s, v) = c.call(Method::PUT, 1, "/v1/blob-limits", &bot_token, Some(json!({"quotaBytes": 1}))).await;
    assert_eq!(s, 403, "a bot sets no limits: {v}");
}

/// Copies between blobs and a paired machine: into it, checked by the agent (an artifact with
/// the agent's size and digest), and out of it as a new blob of the same bytes.
#[tokio::test]
async fn t20_copies_into_and_out_of_a_computer() {
    use computerd_tests::agent::AgentProc;
    use computerd_tests::agent::paired_computer;
    use computerd_tests::agent::wait_state;
    let c = TestCluster::start(1).await;
    let (id, code) = paired_computer(&c, "copies").await;
    let state = c.dir.path().join("agent-copies");
    let _agent = AgentProc::spawn(&c.url(1, ""), &state, Some(&code), &c.dir.path().join("agent-copies.log"));
    wait_state(&c, &id, "running").await;
    let report: Vec<u8> = (0..120_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let (s, v) = upload(&c, &c.token, &format!("sha={}&name=report.pdf", sha(&report)), report.clone()).await;
    assert_eq!(s, 200, "{v}");
    let blob = v["blobId"].as_str().expect("blob").to_string();
    let to = json!({"blobId": blob, "path": ".agent-turn/run_1/inbox/report.pdf"});
    let (s, art) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/copy-to-box"), &c.token, Some(to)).await;
    assert_eq!(s, 200, "{art}");
    assert_eq!((art["size"].as_u64(), art["sha256"].as_str()), (Some(120_000), Some(sha(&report).as_str())), "{art}");
    assert!(art["artifactId"].as_str().is_some_and(|a| a.starts_with("art_")), "{art}");
    assert_eq!(inbox_report_size(&c, &id).await, (200, Some(120_000)));
    let (s, v) = c
        .call(
            Method::POST,
            1,
            &format!("/v1/computers/{id}/copy-to-box"),
            &c.token,
            Some(json!({"blobId": "blb_nope", "path": "x"})),
        )
        .await;
    assert_eq!(s, 404, "{v}");
    // The agent's refusal comes back through the copy's tunnel as its own error: a directory is
    // not overwritten by a file, and nothing else changes.
    let into_dir = json!({"blobId": blob, "path": ".agent-turn/run_1/inbox"});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/copy-to-box"), &c.token, Some(into_dir)).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("directory")), "{v}");
    assert_eq!(inbox_report_size(&c, &id).await, (200, Some(120_000)));
    let from = json!({"path": ".agent-turn/run_1/inbox/report.pdf", "mimeType": "application/pdf"});
    let (s, back) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/copy-from-box"), &c.token, Some(from)).await;
    assert_eq!(s, 200, "{back}");
    assert_eq!(
        (back["sha256"].as_str(), back["name"].as_str()),
        (Some(sha(&report).as_str()), Some("report.pdf")),
        "{back}"
    );
    assert_ne!(back["blobId"], blob.as_str(), "a new blob");
    let (s, v) = c
        .call(
            Method::POST,
            1,
            &format!("/v1/computers/{id}/copy-from-box"),
            &c.token,
            Some(json!({"path": "missing.pdf"})),
        )
        .await;
    assert_eq!(s, 404, "{v}");
}

/// The status of a read of the copied report in the Computer, and its size.
async fn inbox_report_size(c: &TestCluster, id: &str) -> (u16, Option<u64>) {
    let path = format!("/v1/computers/{id}/files?path=.agent-turn/run_1/inbox/report.pdf&encoding=base64");
    let (s, f) = c.call(Method::GET, 1, &path, &c.token, None).await;
    (s, f["size"].as_u64())
}

/// `GET /api/blobs/:id` on node `node`: the status and the bytes.
async fn read(c: &TestCluster, node: u64, token: &str, id: &str) -> (u16, Vec<u8>) {
    let r = reqwest::Client::new()
        .get(c.url(node, &format!("/api/blobs/{id}")))
        .bearer_auth(token)
        .send()
        .await
        .expect("get");
    (r.status().as_u16(), r.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
}

#[tokio::test]
async fn t30_in_a_cluster_a_blob_is_on_two_nodes_and_read_through_any() {
    let mut c = TestCluster::start(3).await;
    let report: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let r = reqwest::Client::new()
        .post(c.url(2, &format!("/api/blobs?sha={}&name=report.pdf", sha(&report))))
        .bearer_auth(&c.token)
        .body(report.clone())
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.expect("json");
    let id = v["blobId"].as_str().expect("id").to_string();
    let nodes: Vec<u64> = v["nodes"].as_array().expect("nodes").iter().filter_map(Value::as_u64).collect();
    assert_eq!((nodes.len(), nodes.first()), (2, Some(&2)), "the node that took it and one more: {v}");
    // Every node serves it, byte for byte, the one without a copy too.
    for node in 1..=3 {
        let (s, bytes) = read(&c, node, &c.token, &id).await;
        assert_eq!(s, 200, "node {node}");
        assert!(bytes == report, "node {node} served other bytes");
    }
    // The node that took it dies: the other copy serves it through both live nodes.
    c.kill(2);
    for node in [1, 3] {
        let (s, bytes) =
            computerd_tests::wait_for("a read after the loss", std::time::Duration::from_secs(30), || async {
                let got = read(&c, node, &c.token, &id).await;
                (got.0 == 200).then_some(got)
            })
            .await;
        assert_eq!((s, bytes.len()), (200, report.len()), "node {node}");
        assert!(bytes == report, "node {node} served other bytes");
    }
    // Two of three nodes left: an upload still lands on both of them.
    let small = b"%PDF-1.4\n% after the loss\n".to_vec();
    let (s, v) = computerd_tests::wait_for("an upload after the loss", std::time::Duration::from_secs(30), || async {
        let r = reqwest::Client::new()
            .post(c.url(3, &format!("/api/blobs?sha={}&name=b.pdf", sha(&small))))
            .bearer_auth(&c.token)
            .body(small.clone())
            .send()
            .await
            .ok()?;
        let s = r.status().as_u16();
        (s == 200).then_some((s, r.json::<Value>().await.ok()?))
    })
    .await;
    assert_eq!(s, 200);
    let mut nodes: Vec<u64> = v["nodes"].as_array().expect("nodes").iter().filter_map(Value::as_u64).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, [1, 3], "{v}");
}

/// moto's S3 server on a free port, killed when dropped.
struct Moto {
    endpoint: String,
    child: std::process::Child,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn moto() -> Moto {
    moto_with(None).await
}

/// Moto's server, over TLS with this certificate and key when given.
async fn moto_with(tls: Option<(&std::path::Path, &std::path::Path)>) -> Moto {
    let port = computerd_tests::free_port();
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()]);
    if let Some((cert, key)) = tls {
        cmd.arg("-c").arg(cert).arg("-k").arg(key);
    }
    let child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("moto's server (python3 -m pip install 'moto[server]')");
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = format!("{scheme}://127.0.0.1:{port}");
    let moto = Moto { endpoint, child };
    let probe = format!("127.0.0.1:{port}");
    computerd_tests::wait_for("moto to listen", std::time::Duration::from_secs(30), || async {
        tokio::net::TcpStream::connect(&probe).await.ok().map(|_| ())
    })
    .await;
    moto
}

#[tokio::test]
async fn t40_with_an_s3_store_every_node_reaches_the_same_bytes() {
    let s3 = moto().await;
    // The bucket (moto takes unsigned requests); the nodes' credentials from the environment.
    let r = reqwest::Client::new().put(format!("{}/computerd-blobs", s3.endpoint)).send().await.expect("bucket");
    assert!(r.status().is_success(), "{}", r.status());
    // SAFETY: this test's process runs only this test (nextest), before any node starts.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
    }
    let store = format!("s3://computerd-blobs/cluster-a?endpoint={}&region=us-east-1", s3.endpoint);
    let mut c = TestCluster::start_with(3, &["--blob-store", &store]).await;
    // Above 8 MiB (a multipart upload) and a small one.
    let big: Vec<u8> = (0..9_500_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let small = b"%PDF-1.4\n% small\n".to_vec();
    let mut ids = Vec::new();
    for body in [&big, &small] {
        let r = reqwest::Client::new()
            .post(c.url(1, &format!("/api/blobs?sha={}&name=r.pdf", sha(body))))
            .bearer_auth(&c.token)
            .body(body.clone())
            .send()
            .await
            .expect("upload");
        assert_eq!(r.status().as_u16(), 200);
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["nodes"], json!([]), "a shared store names no node: {v}");
        ids.push(v["blobId"].as_str().expect("id").to_string());
    }
    // The bytes are in the bucket, under the prefix, not on the nodes.
    let listing = reqwest::Client::new()
        .get(format!("{}/computerd-blobs?list-type=2&prefix=cluster-a/", s3.endpoint))
        .send()
        .await
        .expect("list")
        .text()
        .await
        .expect("text");
    for id in &ids {
        assert!(listing.contains(&format!("cluster-a/{id}")), "{id} in {listing}");
    }
    let on_disk = std::fs::read_dir(c.dir.path().join("node1/blobs"))
        .expect("node 1's blob dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("blb_"))
        .count();
    assert_eq!(on_disk, 0, "no blob file on node 1");
    // The node that took them dies; the others serve them.
    c.kill(1);
    for node in [2, 3] {
        let (s, bytes) = read(&c, node, &c.token, &ids[0]).await;
        assert_eq!((s, bytes.len()), (200, big.len()), "node {node}");
        assert!(bytes == big, "node {node} served other bytes");
        let (s, bytes) = read(&c, node, &c.token, &ids[1]).await;
        assert_eq!((s, bytes), (200, small.clone()), "node {node}");
    }
    // A wrong digest stores nothing in the bucket either.
    let r = reqwest::Client::new()
        .post(c.url(2, &format!("/api/blobs?sha={}&name=x", sha(b"other"))))
        .bearer_auth(&c.token)
        .body(small.clone())
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status().as_u16(), 422);
    let after = reqwest::Client::new()
        .get(format!("{}/computerd-blobs?list-type=2&prefix=cluster-a/", s3.endpoint))
        .send()
        .await
        .expect("list")
        .text()
        .await
        .expect("text");
    assert_eq!(after.matches("<Key>").count(), 2, "{after}");
}

/// A CA and a certificate for 127.0.0.1 in `dir` (`computerd edge-cert`): (CA, cert, key).
fn certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let out = std::process::Command::new(computerd_tests::computerd_bin())
        .args(["edge-cert", "--name", "127.0.0.1", "--dir"])
        .arg(dir)
        .output()
        .expect("computerd edge-cert");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (dir.join("ca.crt"), dir.join("edge.crt"), dir.join("edge.key"))
}

/// Sends a body-less `method` request to `url` trusting only `ca`, and answers the body (the
/// tests' reqwest has no TLS: Python's client).
fn over_tls(method: &str, url: &str, ca: &std::path::Path) -> String {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import ssl, sys, urllib.request as u; \
             r = u.urlopen(u.Request(sys.argv[2], method=sys.argv[1]), \
                           context=ssl.create_default_context(cafile=sys.argv[3])); \
             print(r.read().decode())",
        ])
        .args([method, url])
        .arg(ca)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{method} {url}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An `https://` store with a private CA (`ca=`): the node checks the store's certificate
/// against that CA alone. The same store with another CA is refused, and nothing is recorded.
#[tokio::test]
async fn t45_an_https_store_is_checked_against_its_ca() {
    let certs = tempfile::tempdir().expect("tmp");
    let (ca, cert, key) = certificate(&certs.path().join("store"));
    let (other_ca, _, _) = certificate(&certs.path().join("other"));
    let s3 = moto_with(Some((&cert, &key))).await;
    // The bucket, over TLS with the CA.
    over_tls("PUT", &format!("{}/computerd-blobs", s3.endpoint), &ca);
    // SAFETY: this test's process runs only this test (nextest), before any node starts.
    unsafe {
        std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
    }
    let store = |ca: &std::path::Path| {
        format!("s3://computerd-blobs/tls?endpoint={}&region=us-east-1&ca={}", s3.endpoint, ca.display())
    };
    let big: Vec<u8> = (0..9_000_000u32).map(|i| (i * 7 % 253) as u8).collect();
    let c = TestCluster::start_with(1, &["--blob-store", &store(&ca)]).await;
    let (status, v) = upload(&c, &c.token, &format!("sha={}&name=r.bin", sha(&big)), big.clone()).await;
    assert_eq!(status, 200, "{v}");
    let id = v["blobId"].as_str().expect("id").to_string();
    let (s, bytes) = read(&c, 1, &c.token, &id).await;
    assert_eq!((s, bytes.len()), (200, big.len()));
    assert!(bytes == big, "other bytes came back");
    drop(c);

    // Another CA: the store's certificate is not trusted, the upload fails, nothing is recorded.
    let c = TestCluster::start_with(1, &["--blob-store", &store(&other_ca)]).await;
    let small = b"not stored".to_vec();
    let (status, v) = upload(&c, &c.token, &format!("sha={}&name=x", sha(&small)), small).await;
    assert_eq!((status, v["error"]["kind"].as_str()), (500, Some("internal")), "{v}");
    let listing = over_tls("GET", &format!("{}/computerd-blobs?list-type=2&prefix=tls/", s3.endpoint), &ca);
    assert_eq!(listing.matches("<Key>").count(), 1, "only the first blob is in the bucket: {listing}");
    let log = std::fs::read_to_string(&c.nodes[&1].log).expect("log");
    assert!(log.contains("UnknownIssuer") || log.contains("invalid peer certificate"), "{log}");
}
