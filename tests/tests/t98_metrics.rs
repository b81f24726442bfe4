//! `GET /metrics` on three real nodes: who may read it (the metrics token, an owner; not a bot,
//! not an anonymous caller), that Prometheus's own text parser (PyPI `prometheus_client`) reads
//! every node's document whole, that HTTP requests are counted by route pattern (never by id)
//! and provider calls by kind, and that the leader gauge follows a killed leader.

use std::io::Write;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::wait::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

const METRICS_TOKEN: &str = "scrape-me-please-0123456789";

/// One sample: name, labels, value.
struct Sample {
    name: String,
    labels: Value,
    value: f64,
}

async fn scrape(c: &TestCluster, id: u64, token: Option<&str>) -> (u16, String, String) {
    let mut r = c.http.get(c.url(id, "/metrics"));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let resp = r.send().await.expect("scrape");
    let status = resp.status().as_u16();
    let ctype = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    (status, ctype, resp.text().await.expect("body"))
}

/// The samples of node `id`, as prometheus_client's parser reads them (it must read them all).
async fn samples(c: &TestCluster, id: u64) -> Vec<Sample> {
    let (status, ctype, text) = scrape(c, id, Some(METRICS_TOKEN)).await;
    assert_eq!(status, 200, "{text}");
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/parse_metrics.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write");
    let out = child.wait_with_output().expect("parser");
    assert!(
        out.status.success(),
        "the parser refused node {id}'s metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Vec<Value> = serde_json::from_slice(&out.stdout).expect("json");
    v.into_iter()
        .map(|s| Sample {
            name: s["name"].as_str().expect("name").to_string(),
            labels: s["labels"].clone(),
            value: s["value"].as_f64().expect("value"),
        })
        .collect()
}

/// The value of the sample `name` whose labels include `labels` (0 when there is none).
fn value(samples: &[Sample], name: &str, labels: &Value) -> f64 {
    let wanted = labels.as_object().expect("labels");
    samples
        .iter()
        .filter(|s| s.name == name && wanted.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| s.value)
        .sum()
}

#[tokio::test]
async fn t10_scraped_parsed_and_following_the_leader() {
    let secrets = tempfile::tempdir().expect("tempdir");
    let token_file = secrets.path().join("metrics.token");
    std::fs::write(&token_file, format!("{METRICS_TOKEN}\n")).expect("token file");
    let token_arg = token_file.to_string_lossy().into_owned();
    let mut c = TestCluster::start_fake_with(3, &["--metrics-token-file", &token_arg]).await;

    // Who may read it.
    let (s, _, body) = scrape(&c, 1, None).await;
    assert_eq!(s, 401, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).expect("json error")["error"]["kind"], "unauthorized");
    let (s, bot) = c.create_bot(1, "scraper").await.expect("bot");
    assert_eq!(s, 201, "{bot}");
    let bot_token = c.mint(json!({"botId": bot["id"]})).await;
    let (s, _, body) = scrape(&c, 2, Some(&bot_token)).await;
    assert_eq!(s, 403, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).expect("json error")["error"]["kind"], "forbidden");
    let (s, _, _) = scrape(&c, 3, Some(&c.token)).await;
    assert_eq!(s, 200, "an owner reads it too");

    // A provider call and the requests around it.
    let body = json!({"kind": "fake", "name": "metered", "config": {"faults": {}, "timeoutMs": 3000}});
    let (s, p) = c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await;
    assert_eq!(s, 201, "{p}");
    let create = json!({"commandKey": "m-1", "name": "box", "source": {"_tag": "Provider", "provider": p["id"], "template": null}});
    let (s, r) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(create)).await;
    assert_eq!(s, 202, "{r}");
    let exe = r["executionId"].as_str().expect("execution").to_string();
    assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded");
    let computer = r["resource"]["id"].as_str().expect("computer").to_string();
    let (s, _) = c.call(Method::GET, 1, &format!("/v1/computers/{computer}"), &c.token, None).await;
    assert_eq!(s, 200);

    let mut calls = 0.0;
    for id in 1..=3 {
        let m = samples(&c, id).await;
        calls += value(
            &m,
            "computerd_provider_call_seconds_count",
            &json!({"provider": "fake", "call": "create", "result": "ok"}),
        );
        assert!(m.iter().all(|s| !s.labels.to_string().contains(&computer)), "an id became a label on node {id}");
        if id == 1 {
            let posts = json!({"route": "/v1/computers", "method": "POST", "status": "202"});
            assert_eq!(value(&m, "computerd_http_requests_total", &posts), 1.0);
            let gets = json!({"route": "/v1/computers/{id}", "method": "GET", "status": "200"});
            assert!(value(&m, "computerd_http_requests_total", &gets) >= 1.0);
            assert!(
                value(&m, "computerd_http_request_duration_seconds_count", &json!({"route": "/v1/computers"})) >= 1.0
            );
        }
        assert_eq!(value(&m, "computerd_raft_voters", &json!({})), 3.0, "node {id}");
    }
    assert_eq!(calls, 1.0, "one create call, counted on the node that made it");

    // The leader gauge: every node names the leader, and only it says it leads.
    let leader = c.leader().await;
    let mut leading = 0.0;
    let mut term = 0.0;
    for id in 1..=3 {
        let m = samples(&c, id).await;
        assert_eq!(value(&m, "computerd_raft_leader_id", &json!({})), leader as f64, "node {id}");
        leading += value(&m, "computerd_raft_is_leader", &json!({}));
        term = value(&m, "computerd_raft_term", &json!({}));
        assert!(value(&m, "computerd_raft_last_applied_index", &json!({})) > 0.0);
    }
    assert_eq!(leading, 1.0);

    // Killed, it is followed: the survivors' gauges name the new leader, in a later term.
    c.kill(leader);
    let next = c.leader().await;
    assert_ne!(next, leader);
    let c = &c;
    for id in c.alive() {
        let m = wait_for(&format!("node {id}'s gauge to name node {next}"), Duration::from_secs(30), || async move {
            let m = samples(c, id).await;
            (value(&m, "computerd_raft_leader_id", &json!({})) == next as f64).then_some(m)
        })
        .await;
        assert!(value(&m, "computerd_raft_term", &json!({})) > term, "node {id}");
        assert_eq!(value(&m, "computerd_raft_is_leader", &json!({})), f64::from(u8::from(id == next)), "node {id}");
    }
}
