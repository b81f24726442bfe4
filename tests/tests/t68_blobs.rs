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
