//! Backup and restore (issue 37, item 19): `computerd backup` writes every record of a running
//! 3-node cluster (and the blobs' list) with an owner's token; `computerd restore` starts a new
//! cluster from the file in an empty data dir, whose records read back the same, under the same
//! tokens. A bot's token takes no backup; a damaged file and a data dir already in use are
//! refused with their reason.

use std::process::Command;
use std::process::Stdio;
use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::cluster::computerd_bin;
use computerd_tests::cluster::free_port;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

fn s(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_else(|| panic!("{k} in {v}")).to_string()
}

/// The records that belong to a cluster rather than to its users: set aside before comparing.
fn users_records(backup: &[u8]) -> Value {
    let end = backup.iter().position(|b| *b == b'\n').expect("header");
    let v: Value = serde_json::from_slice(&backup[end + 1..]).expect("payload");
    let mut state = v["state"].clone();
    for k in ["cluster_id", "join", "live_nodes", "clock"] {
        state.as_object_mut().expect("state").remove(k);
    }
    if let Some(computers) = state["computers"].as_object_mut() {
        for c in computers.values_mut() {
            c.as_object_mut().expect("computer").remove("linkNode");
        }
    }
    state
}

async fn backup_via_cli(url: &str, token: &str, dir: &std::path::Path, name: &str) -> Vec<u8> {
    let token_file = dir.join(format!("{name}.token"));
    std::fs::write(&token_file, format!("{token}\n")).expect("token file");
    let out_file = dir.join(name);
    let out = Command::new(computerd_bin())
        .args(["backup", "--url", url])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--out")
        .arg(&out_file)
        .output()
        .expect("run computerd backup");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert!(said.contains("2 computers") && said.contains("1 blobs"), "{said}");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&out_file).expect("backup").permissions());
    assert_eq!(mode & 0o777, 0o600, "the backup is the owner's only");
    std::fs::read(&out_file).expect("backup")
}

#[tokio::test]
async fn i37_19_a_backup_restores_into_a_new_cluster_with_every_record() {
    let c = TestCluster::start_fake(3).await;
    let body = json!({"kind": "fake", "name": "p-backup", "config": {"timeoutMs": 3000, "apiKey": "hunter2"}});
    let (st, v) = c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await;
    assert_eq!(st, 201, "{v}");
    let provider = s(&v, "id");
    let mut computers = Vec::new();
    for (node, key) in [(1, "c-1"), (2, "c-2")] {
        let body = json!({"commandKey": key, "name": key, "source": {"_tag": "Provider", "provider": provider, "template": null}});
        let (st, v) = c.call(Method::POST, node, "/v1/computers", &c.token, Some(body)).await;
        assert_eq!(st, 202, "{v}");
        assert_eq!(c.settle(node, &s(&v, "executionId"), &c.token).await["state"], "succeeded");
        computers.push(v["resource"]["id"].as_str().expect("id").to_string());
    }
    let (st, bot) = c.call(Method::POST, 2, "/v1/bots", &c.token, Some(json!({"name": "keeper"}))).await;
    assert_eq!(st, 201, "{bot}");
    let bot = s(&bot, "id");
    let (st, v) = c.call(Method::PUT, 3, &format!("/v1/computers/{}/bots/{bot}", computers[0]), &c.token, None).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) =
        c.call(Method::POST, 1, "/v1/tokens", &c.token, Some(json!({"name": "bot token", "botId": bot}))).await;
    assert_eq!(st, 201, "{v}");
    let bot_token = s(&v, "secret");
    let report = b"%PDF-1.4 the report".to_vec();
    let sha = hex::encode(sha2::Sha256::digest(&report));
    let r = reqwest::Client::new()
        .post(c.url(2, &format!("/api/blobs?sha={sha}&name=report.pdf")))
        .bearer_auth(&c.token)
        .body(report.clone())
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status(), 200, "{:?}", r.text().await);

    // Only an owner's token takes a backup.
    let (st, v) = c.call(Method::GET, 1, "/v1/admin/backup", &bot_token, None).await;
    assert_eq!((st, v["error"]["kind"].as_str()), (403, Some("forbidden")), "{v}");

    let dir = tempfile::tempdir().expect("dir");
    let original = backup_via_cli(&c.url(2, ""), &c.token, dir.path(), "cluster.backup").await;

    // A new cluster from the file.
    let data = dir.path().join("restored");
    let http = format!("127.0.0.1:{}", free_port());
    let grpc = format!("127.0.0.1:{}", free_port());
    let fake = dir.path().join("fake");
    std::fs::create_dir_all(&fake).expect("fake dir");
    let log = std::fs::File::create(dir.path().join("restored.log")).expect("log");
    let restore = |from: &std::path::Path| {
        let mut cmd = Command::new(computerd_bin());
        cmd.arg("restore")
            .arg("--from")
            .arg(from)
            .args(["--node-id", "1", "--http", &http, "--grpc", &grpc])
            .arg("--data")
            .arg(&data)
            .arg("--fake-provider-dir")
            .arg(&fake)
            .stdin(Stdio::null());
        cmd
    };
    // A damaged file is refused before anything is written.
    let mut damaged = original.clone();
    let last = damaged.len() - 3;
    damaged[last] ^= 1;
    std::fs::write(dir.path().join("damaged.backup"), &damaged).expect("write");
    let out = restore(&dir.path().join("damaged.backup")).output().expect("restore");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("checksum does not match"), "{said}");

    let mut node = restore(&dir.path().join("cluster.backup"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn restore");
    let base = format!("http://{http}");
    let client = reqwest::Client::new();
    let get = |path: &str, token: &str| {
        let (client, url, token) = (client.clone(), format!("{base}{path}"), token.to_string());
        async move {
            let r = client.get(url).bearer_auth(token).send().await.ok()?;
            let st = r.status().as_u16();
            Some((st, r.json::<Value>().await.unwrap_or(Value::Null)))
        }
    };
    let listed = wait_for("the restored node to answer", Duration::from_secs(60), || async {
        get("/v1/computers", &c.token).await.filter(|(st, _)| *st == 200)
    })
    .await;
    let ids: Vec<&str> =
        listed.1["computers"].as_array().expect("computers").iter().filter_map(|x| x["id"].as_str()).collect();
    for id in &computers {
        assert!(ids.contains(&id.as_str()), "{id} in {listed:?}");
    }
    // The same tokens work: the owner's and the bot's.
    let (st, v) = get(&format!("/v1/computers/{}", computers[0]), &bot_token).await.expect("get");
    assert_eq!(st, 200, "the bot's grant came back: {v}");
    // Every record: a backup of the new cluster holds the same records as the first.
    let again = backup_via_cli(&base, &c.token, dir.path(), "restored.backup").await;
    let (a, b) = (users_records(&original), users_records(&again));
    for (k, want) in a.as_object().expect("records") {
        assert_eq!(&b[k], want, "the restored {k} differ");
    }
    assert_eq!(a, b);

    // Restoring into a data dir already in use is refused.
    let _ = node.kill();
    let _ = node.wait();
    let out = restore(&dir.path().join("cluster.backup")).output().expect("restore");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("already holds cluster"), "{said}");
}
