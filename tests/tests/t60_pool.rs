//! Warm pools (issue 42, item 1) on the real Docker engine: pooled sandboxes made ahead of any
//! create, each claimed once by a create of its template and never returned; the pool refills;
//! a node killed between a claim and the agent's link leaves the Computer one sandbox and no
//! pooled container unnamed.

use std::process::Command;
use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::wait_state;
use computerd_tests::docker::Containers;
use computerd_tests::docker::docker_provider;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// Removes, when dropped, the pooled containers and volumes of one provider.
struct Pooled(String);

impl Drop for Pooled {
    fn drop(&mut self) {
        let filter = format!("label=computerd.pool-provider={}", self.0);
        for c in lines(&["ps", "-aq", "--filter", &filter]) {
            let _ = Command::new("docker").args(["rm", "-f", "-v", &c]).output();
        }
        for v in lines(&["volume", "ls", "-q", "--filter", &filter]) {
            let _ = Command::new("docker").args(["volume", "rm", "-f", &v]).output();
        }
    }
}

fn lines(args: &[&str]) -> Vec<String> {
    let out = Command::new("docker").args(args).output().expect("docker");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
}

/// The names of provider `provider`'s pooled containers (claimed ones carry their Computer's).
fn pooled_names(provider: &str) -> Vec<String> {
    let filter = format!("label=computerd.pool-provider={provider}");
    let mut names = lines(&["ps", "-a", "--filter", &filter, "--format", "{{.Names}}"]);
    names.sort();
    names
}

/// The leader's `computerd_pool_ready` of the default template (node 1 leads a one-node cluster).
async fn ready(c: &TestCluster, provider: &str) -> Option<u64> {
    let text = c.http.get(c.url(1, "/metrics")).bearer_auth(&c.token).send().await.ok()?.text().await.ok()?;
    let want = format!("computerd_pool_ready{{provider=\"{provider}\",key=\"default\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&want)).and_then(|v| v.trim().parse::<f64>().ok()).map(|v| v as u64)
}

/// Waits until the pool has `n` ready sandboxes (the gauge, set by the keeper's passes, and as
/// many unclaimed pooled containers).
async fn wait_ready(c: &TestCluster, provider: &str, n: u64) {
    wait_for(&format!("{n} ready pooled sandboxes"), Duration::from_secs(120), || async {
        let unclaimed = pooled_names(provider).iter().filter(|n| n.starts_with("computerd-pool-")).count();
        (unclaimed as u64 == n && ready(c, provider).await == Some(n)).then_some(())
    })
    .await;
}

async fn create(c: &TestCluster, provider: &str, key: &str) -> (String, String) {
    let body = json!({
        "commandKey": key, "name": key,
        "source": {"_tag": "Provider", "provider": provider, "template": null},
        "env": {"GREETING": format!("hello from {key}")},
    });
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    (v["resource"]["id"].as_str().expect("id").to_string(), v["executionId"].as_str().expect("exe").to_string())
}

async fn receipt(c: &TestCluster, exe: &str) -> Value {
    wait_for("the create to finish", Duration::from_secs(60), || async {
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/executions/{exe}"), &c.token, None).await;
        (v["state"] == "succeeded").then_some(v)
    })
    .await
}

async fn run(c: &TestCluster, id: &str, command: &str) -> Value {
    let body = json!({"command": command, "yieldTimeMs": 10_000});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(body)).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// A pool of 2 serves 2 creates as `pooled`, with the create's env in their sessions and their
/// sandboxes named for them; a third create at the same moment is made cold; the pool refills.
#[tokio::test]
async fn t60_pool_serves_two_creates_then_a_cold_one_and_refills() {
    let c = TestCluster::start(1).await;
    let provider = docker_provider(&c, json!({"pool": {"default": {"size": 2}}})).await;
    let _pooled = Pooled(provider.clone());
    let mut cleanup = Containers::default();
    wait_ready(&c, &provider, 2).await;
    assert_eq!(pooled_names(&provider).len(), 2, "two pooled containers");
    let (_, v) = c.call(Method::GET, 1, "/v1/computer-providers", &c.token, None).await;
    let listed = v["providers"].as_array().and_then(|ps| ps.iter().find(|p| p["id"] == provider.as_str()).cloned());
    assert_eq!(
        listed.map(|p| p["pool"].clone()),
        Some(json!({"default": {"ready": 2, "starting": 0, "claimed": 0}})),
        "the providers' list shows the pool"
    );

    let (a, b, cold) =
        tokio::join!(create(&c, &provider, "pool-a"), create(&c, &provider, "pool-b"), create(&c, &provider, "pool-c"));
    for (id, _) in [&a, &b, &cold] {
        cleanup.track(id);
    }
    let mut pooled = Vec::new();
    for (id, exe) in [&a, &b, &cold] {
        let r = receipt(&c, exe).await;
        let v = wait_state(&c, id, "running").await;
        assert_eq!(v["pooled"], r["pooled"], "the receipt and the Computer agree: {r} {v}");
        let out = run(&c, id, "echo $GREETING; id -un").await;
        let key = v["name"].as_str().unwrap_or_default();
        assert_eq!(out["output"], format!("hello from {key}\nuser\n"), "the create's env, as the image's user: {out}");
        if r["pooled"] == true {
            pooled.push(id.clone());
        }
    }
    assert_eq!(pooled.len(), 2, "two of the three creates came from the pool");
    let names = pooled_names(&provider);
    for id in &pooled {
        assert!(names.contains(&format!("computerd-{id}")), "a claimed sandbox carries its Computer's name: {names:?}");
    }
    // Refilled: two more, ready, named as the pool's.
    wait_ready(&c, &provider, 2).await;
    let names = pooled_names(&provider);
    assert_eq!(names.iter().filter(|n| n.starts_with("computerd-pool-")).count(), 2, "{names:?}");
}

/// A node SIGKILLed after a create claimed a pooled sandbox and before its agent linked (the
/// sandbox is frozen meanwhile): after the restart the Computer runs on that one sandbox, which
/// carries its name, and no pooled container is left that no entry names.
#[tokio::test]
async fn t60_pool_claim_survives_a_kill_before_the_link() {
    let mut c = TestCluster::start(1).await;
    let provider = docker_provider(&c, json!({"pool": {"default": {"size": 1}}})).await;
    let _pooled = Pooled(provider.clone());
    let mut cleanup = Containers::default();
    wait_ready(&c, &provider, 1).await;
    let names = pooled_names(&provider);
    assert_eq!(names.len(), 1, "{names:?}");
    let pooled_name = names[0].clone();
    // By id: the claim renames it.
    let frozen = lines(&["ps", "-aq", "--no-trunc", "--filter", &format!("name=^{pooled_name}$")]).concat();
    assert!(!frozen.is_empty(), "{pooled_name} has an id");
    let out = Command::new("docker").args(["pause", &frozen]).output().expect("docker pause");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let (id, exe) = create(&c, &provider, "pool-kill").await;
    cleanup.track(&id);
    let r = receipt(&c, &exe).await;
    assert_eq!(r["pooled"], true, "{r}");
    c.kill(1);
    c.spawn(1);
    wait_for("node 1 to serve again", Duration::from_secs(60), || async { c.health(1).await.map(|_| ()) }).await;
    let out = Command::new("docker").args(["unpause", &frozen]).output().expect("docker unpause");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let v = wait_state(&c, &id, "running").await;
    assert_eq!(v["pooled"], true, "{v}");
    let out = run(&c, &id, "echo $GREETING").await;
    assert_eq!(out["output"], "hello from pool-kill\n", "{out}");
    // One sandbox, named for the Computer; the pool refills with one of its own.
    wait_ready(&c, &provider, 1).await;
    let names = pooled_names(&provider);
    let mine: Vec<_> = names.iter().filter(|n| **n == format!("computerd-{id}")).collect();
    assert_eq!(mine.len(), 1, "{names:?}");
    let unclaimed: Vec<_> = names.iter().filter(|n| n.starts_with("computerd-pool-")).collect();
    assert_eq!(unclaimed.len(), 1, "only the refill is unclaimed: {names:?}");
    assert_ne!(unclaimed[0], &pooled_name, "the claimed sandbox left the pool's names");
    let sandbox = v["sandboxId"].as_str().unwrap_or_default().to_string();
    let named = Command::new("docker").args(["inspect", "-f", "{{.Name}}", &sandbox]).output().expect("inspect");
    assert_eq!(String::from_utf8_lossy(&named.stdout).trim(), format!("/computerd-{id}"));
    assert!(frozen.starts_with(&sandbox), "the Computer runs on the sandbox it claimed: {frozen} {sandbox}");
}
