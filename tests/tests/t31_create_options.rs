//! What people expect at create (issue 39, item 5): `env` for every session, `resources`
//! within the template's ceilings, and `metadata`, a filter of the list. A Docker sandbox
//! created with all three; bad input refused with the field named and nothing made; and the
//! E2B and Daytona fakes get the env and metadata in their create, while E2B and Daytona refuse
//! `resources` (their template or snapshot fixes the size).

use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::wait_state;
use computerd_tests::docker::Containers;
use computerd_tests::docker::containers_of;
use computerd_tests::docker::docker_provider;
use computerd_tests::docker::inspect;
use computerd_tests::fakes::FakeService;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// `POST /v1/computers`, waiting out the moment after a node's start when it has not yet
/// recorded the store version it speaks (a create with options is a version-2 command).
async fn post(c: &TestCluster, body: Value) -> (u16, Value) {
    wait_for("the create to be taken", Duration::from_secs(30), || async {
        let (st, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body.clone())).await;
        let early = st == 409 && v["error"]["message"].as_str().is_some_and(|m| m.contains("store version"));
        (!early).then_some((st, v))
    })
    .await
}

fn body(provider: &str, key: &str, extra: Value) -> Value {
    let mut b = json!({
        "commandKey": key, "name": key,
        "source": {"_tag": "Provider", "provider": provider, "template": null},
        "pauseAfter": null,
    });
    if let (Some(b), Some(extra)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(extra.clone());
    }
    b
}

async fn ids(c: &TestCluster, query: &str) -> Vec<String> {
    let (st, v) = c.call(Method::GET, 1, &format!("/v1/computers{query}"), &c.token, None).await;
    assert_eq!(st, 200, "{v}");
    v["computers"].as_array().expect("computers").iter().filter_map(|c| c["id"].as_str().map(str::to_string)).collect()
}

#[tokio::test]
async fn i39_5_a_docker_sandbox_with_env_resources_and_metadata() {
    let c = TestCluster::start(1).await;
    // The default template: 1 CPU and 512 MiB, the ceilings.
    let provider = docker_provider(&c, json!({})).await;
    let mut cleanup = Containers::default();

    // Bad input: 400 naming the field, and nothing made.
    let many: serde_json::Map<String, Value> = (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    let bad = [
        (json!({"env": {"1BAD": "x"}}), "env"),
        (json!({"env": {"BAD-NAME": "x"}}), "env"),
        (json!({"env": {"COMPUTER_AGENT_X": "x"}}), "COMPUTER_AGENT_"),
        (json!({"env": {"BIG": "x".repeat(4097)}}), "env"),
        (json!({"metadata": many}), "metadata"),
        (json!({"metadata": {"bad key": "v"}}), "metadata"),
        (json!({"metadata": {"k": "v".repeat(257)}}), "metadata"),
        (json!({"resources": {"cpus": 2}}), "resources.cpus"),
        (json!({"resources": {"memoryMb": 4096}}), "resources.memoryMb"),
        (json!({"resources": {"cpus": 0}}), "resources.cpus"),
        (json!({"resources": {"gpus": 1}}), "gpus"),
    ];
    let before = ids(&c, "").await;
    for (i, (extra, names)) in bad.iter().enumerate() {
        let (st, v) = post(&c, body(&provider, &format!("bad-{i}"), extra.clone())).await;
        assert_eq!((st, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{extra}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(names), "{extra}: the message names {names}: {msg}");
    }
    let (st, v) = post(&c, body(&provider, "bad-ceiling", json!({"resources": {"cpus": 1.5}}))).await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("ceiling of 1 CPUs")), "the ceiling named: {v}");
    let paired = json!({"commandKey": "bad-paired", "source": {"_tag": "Paired"}, "env": {"A": "b"}});
    let (st, v) = post(&c, paired).await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("env")), "{v}");
    assert_eq!(ids(&c, "").await, before, "no refused create was stored");

    // The sandbox.
    let extra = json!({
        "env": {"GREETING": "hello from env", "EMPTY": ""},
        "resources": {"cpus": 0.5, "memoryMb": 256},
        "metadata": {"team": "a", "ticket": "T-1"},
    });
    let (st, v) = post(&c, body(&provider, "opts", extra)).await;
    assert_eq!(st, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&id);
    let exe = v["executionId"].as_str().expect("execution").to_string();
    assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded");
    wait_state(&c, &id, "running").await;

    let run = json!({"command": "echo \"$GREETING\"; env | grep -c COMPUTER_AGENT_ || true", "yieldTimeMs": 20000});
    let (st, r) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(run)).await;
    assert_eq!(st, 200, "{r}");
    let out = r["output"].as_str().unwrap_or_default();
    assert_eq!(out.lines().collect::<Vec<_>>(), ["hello from env", "0"], "the env, not the agent's settings: {r}");

    let container = containers_of(&id).into_iter().next().expect("a container");
    assert_eq!(inspect(&container, "{{.HostConfig.NanoCpus}}"), "500000000");
    assert_eq!(inspect(&container, "{{.HostConfig.Memory}}"), (256u64 << 20).to_string());

    let (st, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["env"], json!({"GREETING": "hello from env", "EMPTY": ""}), "{v}");
    assert_eq!(v["resources"], json!({"cpus": 0.5, "memoryMb": 256}), "{v}");
    assert_eq!(v["metadata"], json!({"team": "a", "ticket": "T-1"}), "{v}");

    // The list's filter: every pair must match.
    assert_eq!(ids(&c, "?metadata.team=a").await, [id.as_str()]);
    assert_eq!(ids(&c, "?metadata.team=a&metadata.ticket=T-1").await, [id.as_str()]);
    assert!(ids(&c, "?metadata.team=b").await.is_empty());
    assert!(ids(&c, "?metadata.team=a&metadata.ticket=T-2").await.is_empty());
    let (_, v) = c.call(Method::GET, 1, "/v1/computers?metadata.team=a", &c.token, None).await;
    assert_eq!((v["computers"][0]["metadata"]["team"].as_str(), &v["nextAfter"]), (Some("a"), &Value::Null), "{v}");
    let (st, v) = c.call(Method::GET, 1, "/v1/computers?metadata.bad%20key=a", &c.token, None).await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = c.call(Method::GET, 1, "/v1/computers?colour=a", &c.token, None).await;
    assert_eq!(st, 400, "{v}");

    // No container was made for a refused create (each would carry its command key).
    for key in (0..bad.len()).map(|i| format!("bad-{i}")).chain(["bad-ceiling".to_string()]) {
        let out = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label=computerd.command-key={key}")])
            .output()
            .expect("docker ps");
        assert!(out.stdout.trim_ascii().is_empty(), "a container for {key}");
    }
    assert_eq!(ids(&c, "").await.len(), before.len() + 1);
}

/// The E2B and Daytona fakes get the create's env and metadata (E2B: `envVars` and `metadata`;
/// Daytona: `env` and `labels`); both refuse `resources` at create, with nothing stored.
#[tokio::test]
async fn i39_5_env_and_metadata_reach_e2b_and_daytona() {
    const KEY: &str = "e2b_test_key_0123456789abcdef";
    let c = TestCluster::start(1).await;
    for kind in ["e2b", "daytona"] {
        let fake = FakeService::start(kind, KEY);
        let timeout = if kind == "daytona" { 60000 } else { 30000 };
        let config = json!({"serverUrl": c.url(1, ""), "endpoint": fake.url, "apiKey": KEY, "timeoutMs": timeout});
        let (st, v) = c
            .call(
                Method::POST,
                1,
                "/v1/computer-providers",
                &c.token,
                Some(json!({"kind": kind, "name": kind, "config": config})),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        let provider = v["id"].as_str().expect("provider").to_string();

        let before = ids(&c, "").await;
        let sized = json!({"resources": {"cpus": 1}});
        let (st, v) = post(&c, body(&provider, &format!("{kind}-sized"), sized)).await;
        assert_eq!(st, 400, "{kind}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("resources") && msg.contains("fixed"), "{kind}: {msg}");
        assert_eq!(ids(&c, "").await, before, "{kind}: nothing stored");

        let extra = json!({"env": {"GREETING": "hi"}, "metadata": {"team": kind}});
        let (st, v) = post(&c, body(&provider, &format!("{kind}-opts"), extra)).await;
        assert_eq!(st, 202, "{v}");
        let id = v["resource"]["id"].as_str().expect("id").to_string();
        let exe = v["executionId"].as_str().expect("execution").to_string();
        assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded", "{kind}");
        let journal = fake.journal().await;
        let create = journal.iter().find(|e| e["effect"] == "create").expect("a create in the journal");
        let (env, meta) = match kind {
            "e2b" => (&create["envVars"], &create["metadata"]),
            _ => (&create["env"], &create["labels"]),
        };
        assert_eq!(env["GREETING"], "hi", "{kind}: {create}");
        assert!(env["COMPUTER_AGENT_PAIR"].is_string(), "{kind}: the agent's settings too: {create}");
        assert_eq!(
            (meta["team"].as_str(), meta["computerd.computer"].as_str()),
            (Some(kind), Some(id.as_str())),
            "{create}"
        );
        assert!(journal.iter().all(|e| e["invalid"].is_null()), "{kind}: every request follows the API");
        assert_eq!(ids(&c, &format!("?metadata.team={kind}")).await, [id.as_str()]);
        // Deleted, so the fake's sandbox goes.
        let del = json!({"commandKey": format!("{kind}-delete")});
        let (st, v) = c.call(Method::DELETE, 1, &format!("/v1/computers/{id}"), &c.token, Some(del)).await;
        assert_eq!(st, 202, "{v}");
        let exe = v["executionId"].as_str().expect("execution").to_string();
        c.settle(1, &exe, &c.token).await;
    }
}
