//! One node: bootstrap, the owner token, identity routes, errors and rights, shutdown and resume.

use std::os::unix::fs::PermissionsExt;

use computerd_tests::TestCluster;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

async fn call(c: &TestCluster, method: Method, path: &str, token: &str, body: Option<Value>) -> (u16, Value) {
    let mut r = c.req(method, 1, path, token);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("send");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn kind(v: &Value) -> &str {
    v["error"]["kind"].as_str().unwrap_or("<none>")
}

/// A first node bootstraps a one-node cluster, writes a 0600 owner token, and reports itself
/// leader in `/v1/health`.
#[tokio::test]
async fn t10_one_node_boots() {
    let c = TestCluster::start(1).await;
    let h = c.health(1).await.expect("health");
    assert_eq!(h["nodeId"], 1);
    assert_eq!(h["leaderId"], 1);
    assert!(h["term"].as_u64().expect("term") >= 1);
    assert!(h["lastApplied"].as_u64().expect("lastApplied") >= 1);
    assert_eq!(h["members"], json!([{"id": 1, "http": c.nodes[&1].http, "grpc": c.nodes[&1].grpc, "voter": true}]));
    let mode = std::fs::metadata(c.nodes[&1].data.join("admin.token")).expect("token file").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(c.token.starts_with("cdt_"));
}

/// Identity routes work for the owner; a bad token is 401, a lack of right 403 `forbidden`,
/// bad input 400, and a refused call changes nothing.
#[tokio::test]
async fn t20_identity_rights_and_errors() {
    let c = TestCluster::start(1).await;
    let owner = c.token.clone();

    let (s, v) = call(&c, Method::GET, "/v1/members", "nonsense", None).await;
    assert_eq!((s, kind(&v)), (401, "unauthorized"));
    assert!(v["error"]["errorId"].as_str().is_some_and(|e| e.starts_with("err_")));
    let (s, _) = c.http.get(c.url(1, "/v1/members")).send().await.map(|r| (r.status().as_u16(), ())).expect("send");
    assert_eq!(s, 401);

    let (s, m) = call(&c, Method::POST, "/v1/members", &owner, Some(json!({"name": "mia", "role": "member"}))).await;
    assert_eq!(s, 201, "{m}");
    let mia = m["id"].as_str().expect("id").to_string();
    assert!(mia.starts_with("mem_"));

    // Bad input: unknown field, bad role, empty name, both principals.
    for body in [json!({"name": "x", "permissions": []}), json!({"name": "x", "role": "god"}), json!({"name": "  "})] {
        let (s, v) = call(&c, Method::POST, "/v1/members", &owner, Some(body)).await;
        assert_eq!((s, kind(&v)), (400, "invalid_request"));
    }
    let (s, v) =
        call(&c, Method::POST, "/v1/tokens", &owner, Some(json!({"name": "t", "memberId": mia, "botId": "bot_x"})))
            .await;
    assert_eq!((s, kind(&v)), (400, "invalid_request"));
    let (_, list) = call(&c, Method::GET, "/v1/members", &owner, None).await;
    assert_eq!(list["members"].as_array().expect("members").len(), 2, "refused calls added nothing");

    // The owner mints a token for the member; the member may not administer.
    let (s, t) = call(&c, Method::POST, "/v1/tokens", &owner, Some(json!({"name": "mia", "memberId": mia}))).await;
    assert_eq!(s, 201, "{t}");
    let mia_secret = t["secret"].as_str().expect("secret").to_string();
    assert!(t["token"].get("hash").is_none(), "the hash is never shown");
    let (s, v) = call(&c, Method::GET, "/v1/bots", &mia_secret, None).await;
    assert_eq!((s, kind(&v)), (403, "forbidden"));
    let (s, v) = call(&c, Method::POST, "/v1/bots", &mia_secret, Some(json!({"name": "b"}))).await;
    assert_eq!((s, kind(&v)), (403, "forbidden"));

    // A read-only owner token reads but cannot write.
    let (_, ro) = call(&c, Method::POST, "/v1/tokens", &owner, Some(json!({"name": "ro", "readOnly": true}))).await;
    let ro_secret = ro["secret"].as_str().expect("secret").to_string();
    let (s, _) = call(&c, Method::GET, "/v1/members", &ro_secret, None).await;
    assert_eq!(s, 200);
    let (s, v) = call(&c, Method::POST, "/v1/bots", &ro_secret, Some(json!({"name": "b"}))).await;
    assert_eq!((s, kind(&v)), (403, "forbidden"));

    // A bot with a bot token: the bot token may not administer; archiving the bot ends it.
    let (s, bot) = call(&c, Method::POST, "/v1/bots", &owner, Some(json!({"name": "helper", "memberId": mia}))).await;
    assert_eq!(s, 201, "{bot}");
    assert_eq!(bot["memberId"], mia.as_str());
    let bot_id = bot["id"].as_str().expect("id").to_string();
    let (s, bt) = call(&c, Method::POST, "/v1/tokens", &owner, Some(json!({"name": "bt", "botId": bot_id}))).await;
    assert_eq!(s, 201, "{bt}");
    let bot_secret = bt["secret"].as_str().expect("secret").to_string();
    let (s, v) = call(&c, Method::GET, "/v1/members", &bot_secret, None).await;
    assert_eq!((s, kind(&v)), (403, "forbidden"));
    let (s, archived) = call(&c, Method::POST, &format!("/v1/bots/{bot_id}/archive"), &owner, None).await;
    assert_eq!(s, 200);
    assert!(archived["archivedAt"].as_u64().is_some());
    let (s, v) = call(&c, Method::GET, "/v1/members", &bot_secret, None).await;
    assert_eq!((s, kind(&v)), (401, "unauthorized"), "an archived bot's token is dead");
    let (s, v) = call(&c, Method::POST, "/v1/bots/bot_nope/archive", &owner, None).await;
    assert_eq!((s, kind(&v)), (404, "not_found"));

    // Revocation is immediate.
    let ro_id = ro["token"]["id"].as_str().expect("id").to_string();
    let (s, revoked) = call(&c, Method::DELETE, &format!("/v1/tokens/{ro_id}"), &owner, None).await;
    assert_eq!(s, 200);
    assert!(revoked["revokedAt"].as_u64().is_some());
    let (s, v) = call(&c, Method::GET, "/v1/members", &ro_secret, None).await;
    assert_eq!((s, kind(&v)), (401, "unauthorized"));
}

/// SIGTERM stops a node cleanly (exit 0); the same data dir resumes with its state and token.
#[tokio::test]
async fn t30_sigterm_and_resume() {
    let mut c = TestCluster::start(1).await;
    let (s, _) = c.create_bot(1, "survivor").await.expect("create");
    assert_eq!(s, 201);
    assert_eq!(c.terminate(1).await, Some(0));
    c.spawn(1);
    c.wait_voters(1).await;
    let bots =
        computerd_tests::wait_for("bots after restart", std::time::Duration::from_secs(30), || c.bot_ids(1)).await;
    assert_eq!(bots.len(), 1);
}

/// A data dir that is not ours, or that belongs to another node id, stops the node with a clear
/// message and is left untouched.
#[tokio::test]
async fn t40_foreign_data_dirs_are_refused() {
    let mut c = TestCluster::start(1).await;
    assert_eq!(c.terminate(1).await, Some(0));

    // Another node id on this dir.
    let node = &c.nodes[&1];
    let out = std::process::Command::new(computerd_tests::computerd_bin())
        .args(["serve", "--node-id", "7", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data"])
        .arg(&node.data)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("belongs to node 1, not node 7"), "{err}");

    // A non-empty directory that is not a data dir.
    let foreign = c.dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).expect("mkdir");
    std::fs::write(foreign.join("precious.txt"), b"keep me").expect("write");
    let out = std::process::Command::new(computerd_tests::computerd_bin())
        .args(["serve", "--node-id", "1", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--data"])
        .arg(&foreign)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a computerd data dir"));
    let entries: Vec<_> = std::fs::read_dir(&foreign).expect("ls").collect();
    assert_eq!(entries.len(), 1, "nothing was written into a foreign dir");

    // An unreadable node file.
    std::fs::write(node.data.join("node.json"), b"garbage").expect("write");
    let (code, err) = c.run_to_exit(1, &[]);
    assert_eq!(code, 1);
    assert!(err.contains("corrupt"), "{err}");
}
