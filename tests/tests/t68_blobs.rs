//! Blobs through the API on a real node: an upload whose bytes hash to the declared SHA-256 is
//! stored and read back byte for byte; a wrong digest or a short body answers `422
//! DigestMismatch` and stores nothing (the quota is untouched); the quota refuses what would
//! pass it; a bot reads its own blobs and not its member's; bad names and digests are refused.

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
    let (s, f) = c
        .call(
            Method::GET,
            1,
            &format!("/v1/computers/{id}/files?path=.agent-turn/run_1/inbox/report.pdf&encoding=base64"),
            &c.token,
            None,
        )
        .await;
    assert_eq!((s, f["size"].as_u64()), (200, Some(120_000)), "{f}");
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
