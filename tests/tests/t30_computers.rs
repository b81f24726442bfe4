//! The Computers API against real clusters: lifecycle, idempotency, unknown outcomes, node loss
//! during a provider call, conflicts, rights, capabilities, events and usage.

use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

fn kind(v: &Value) -> &str {
    v["error"]["kind"].as_str().unwrap_or("<none>")
}

fn s(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_else(|| panic!("no {k} in {v}")).to_string()
}

async fn provider(c: &TestCluster, faults: Value) -> String {
    let body = json!({"kind": "fake", "name": format!("p-{}", rand::random::<u32>()), "config": {"faults": faults, "timeoutMs": 3000, "apiKey": "hunter2"}});
    let (st, v) = c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await;
    assert_eq!(st, 201, "{v}");
    assert!(
        v["config"].get("apiKey").is_none() && v["secretFields"] == json!(["apiKey"]),
        "credentials are write-only: {v}"
    );
    s(&v, "id")
}

fn create_body(key: &str, provider: &str) -> Value {
    json!({"commandKey": key, "name": "box", "source": {"_tag": "Provider", "provider": provider, "template": null}})
}

async fn create(c: &TestCluster, node: u64, token: &str, key: &str, provider: &str) -> (u16, Value) {
    c.call(Method::POST, node, "/v1/computers", token, Some(create_body(key, provider))).await
}

/// Create -> running -> pause -> paused -> resume -> running -> delete -> gone; each step one
/// provider call; usage spans match; credentials never come back.
#[tokio::test]
async fn t10_lifecycle_and_usage() {
    let c = TestCluster::start_fake(1).await;
    let p = provider(&c, json!({})).await;
    let (st, r) = create(&c, 1, &c.token, "create-1", &p).await;
    assert_eq!(st, 202, "{r}");
    assert_eq!((r["kind"].as_str(), r["resource"]["type"].as_str()), (Some("create"), Some("computer")));
    let id = r["resource"]["id"].as_str().expect("computer id").to_string();
    let done = c.settle(1, &s(&r, "executionId"), &c.token).await;
    assert_eq!(done["state"], "succeeded");
    let (_, comp) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(comp["state"], "running");
    assert_eq!(comp["pauseAfter"], 600);
    for (step, key, want) in [("pause", "p-1", "paused"), ("resume", "r-1", "running")] {
        let (st, r) = c
            .call(Method::POST, 1, &format!("/v1/computers/{id}/{step}"), &c.token, Some(json!({"commandKey": key})))
            .await;
        assert_eq!(st, 202, "{r}");
        assert_eq!(c.settle(1, &s(&r, "executionId"), &c.token).await["state"], "succeeded");
        let (_, comp) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        assert_eq!(comp["state"], want);
    }
    let (st, r) =
        c.call(Method::DELETE, 1, &format!("/v1/computers/{id}"), &c.token, Some(json!({"commandKey": "d-1"}))).await;
    assert_eq!(st, 202, "{r}");
    assert_eq!(c.settle(1, &s(&r, "executionId"), &c.token).await["state"], "succeeded");
    let (st, _) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(st, 404);
    let ops: Vec<String> = c.journal(&p).iter().map(|l| s(l, "op")).collect();
    assert_eq!(ops, ["create", "pause", "resume", "delete"]);
    let (_, u) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/usage"), &c.token, None).await;
    let spans = u["spans"].as_array().expect("spans");
    assert_eq!(spans.len(), 2, "{u}");
    assert_eq!((spans[0]["endedBy"].as_str(), spans[1]["endedBy"].as_str()), (Some("pause"), Some("delete")));
    assert!(spans.iter().all(|s| s["outcomeUnknown"] == false && s["end"].as_u64() >= s["start"].as_u64()));
    let log = std::fs::read_to_string(&c.nodes[&1].log).expect("log");
    assert!(!log.contains("hunter2"), "a credential reached the log");
}

/// Same key + same body replays the receipt (also while it runs); same key + other body is
/// 422; bad JSON, unknown fields and out-of-range pauseAfter are 400 and store nothing.
#[tokio::test]
async fn t20_idempotency_and_bad_input() {
    let c = TestCluster::start_fake(1).await;
    let p = provider(&c, json!({"create": "slow:1500"})).await;
    let (st, first) = create(&c, 1, &c.token, "same", &p).await;
    assert_eq!(st, 202);
    let (st, again) = create(&c, 1, &c.token, "same", &p).await;
    assert_eq!(st, 202);
    assert_eq!(again["executionId"], first["executionId"], "a retry while it runs gets the same receipt");
    let mut other = create_body("same", &p);
    other["name"] = json!("another");
    let (st, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(other)).await;
    assert_eq!((st, kind(&v)), (422, "IdempotencyKeyReused"));
    c.settle(1, &s(&first, "executionId"), &c.token).await;
    let (_, again) = create(&c, 1, &c.token, "same", &p).await;
    assert_eq!(
        (again["executionId"].clone(), again["state"].as_str()),
        (first["executionId"].clone(), Some("succeeded"))
    );

    let bad: Vec<Value> = vec![
        json!({"name": "x", "source": {"_tag": "Provider", "provider": p}}),
        json!({"commandKey": "b1", "source": {"_tag": "Provider", "provider": p}, "permissions": []}),
        json!({"commandKey": "b2", "source": {"_tag": "Provider", "provider": p}, "pauseAfter": 0}),
        json!({"commandKey": "b3", "source": {"_tag": "Provider", "provider": p}, "pauseAfter": 99_999_999}),
        json!({"commandKey": "b4", "source": {"_tag": "Provider", "provider": p}, "pauseAfter": "soon"}),
        json!({"commandKey": "b5", "source": {"_tag": "Moon"}}),
        json!({"commandKey": "", "source": {"_tag": "Paired"}}),
    ];
    for b in bad {
        let (st, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(b.clone())).await;
        assert_eq!((st, kind(&v)), (400, "invalid_request"), "{b}");
    }
    let raw = c
        .req(Method::POST, 1, "/v1/computers", &c.token)
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .expect("send");
    assert_eq!(raw.status().as_u16(), 400);
    let (_, list) = c.call(Method::GET, 1, "/v1/computers", &c.token, None).await;
    assert_eq!(list["computers"].as_array().map(Vec::len), Some(1), "bad input stored nothing");
    // pauseAfter: null means never.
    let mut never = create_body("never", &p);
    never["pauseAfter"] = Value::Null;
    let (_, r) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(never)).await;
    // Lists come a page at a time, in id order.
    let (s, page) = c.call(Method::GET, 1, "/v1/computers?limit=1", &c.token, None).await;
    assert_eq!((s, page["computers"].as_array().map(Vec::len)), (200, Some(1)), "{page}");
    let next = page["nextAfter"].as_str().expect("a next page").to_string();
    assert_eq!(page["computers"][0]["id"], next.as_str());
    let (s, rest) = c.call(Method::GET, 1, &format!("/v1/computers?limit=1&after={next}"), &c.token, None).await;
    assert_eq!(
        (s, rest["computers"].as_array().map(Vec::len), &rest["nextAfter"]),
        (200, Some(1), &Value::Null),
        "{rest}"
    );
    assert!(rest["computers"][0]["id"].as_str() > Some(next.as_str()));
    for bad in ["limit=0", "limit=1001", "limit=x", "other=1"] {
        let (s, v) = c.call(Method::GET, 1, &format!("/v1/computers?{bad}"), &c.token, None).await;
        assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{bad}: {v}");
    }
    let (_, comp) = c
        .call(Method::GET, 1, &format!("/v1/computers/{}", r["resource"]["id"].as_str().expect("id")), &c.token, None)
        .await;
    assert_eq!(comp["pauseAfter"], Value::Null);
}

/// Identical creates sent at once through two different nodes make one execution, one
/// Computer and one provider call.
#[tokio::test]
async fn t30_concurrent_identical_creates_through_two_nodes() {
    let c = TestCluster::start_fake(3).await;
    let p = provider(&c, json!({})).await;
    let (a, b) = tokio::join!(create(&c, 2, &c.token, "twin", &p), create(&c, 3, &c.token, "twin", &p));
    assert_eq!((a.0, b.0), (202, 202));
    assert_eq!(a.1["executionId"], b.1["executionId"]);
    assert_eq!(a.1["resource"]["id"], b.1["resource"]["id"]);
    c.settle(1, &s(&a.1, "executionId"), &c.token).await;
    let (_, list) = c.call(Method::GET, 2, "/v1/computers", &c.token, None).await;
    assert_eq!(list["computers"].as_array().map(Vec::len), Some(1));
    assert_eq!(c.journal(&p).len(), 1, "exactly one provider call");
}

/// A lost provider answer: `outcome_unknown`, a DecisionNeeded event, exactly one provider call,
/// the Computer held until a member decides; a bot may not decide.
#[tokio::test]
async fn t40_lost_answer_needs_a_decision() {
    let c = TestCluster::start_fake(1).await;
    let p = provider(&c, json!({"create": "lost"})).await;
    let (_, r) = create(&c, 1, &c.token, "lost-1", &p).await;
    let exe = s(&r, "executionId");
    let done = c.settle(1, &exe, &c.token).await;
    assert_eq!(done["state"], "outcome_unknown", "{done}");
    let (_, ev) = c.call(Method::GET, 1, "/v1/events?after=0", &c.token, None).await;
    let needed: Vec<&Value> =
        ev["events"].as_array().expect("events").iter().filter(|e| e["type"] == "DecisionNeeded").collect();
    assert_eq!(needed.len(), 1);
    assert_eq!(needed[0]["executionId"], exe.as_str());
    assert_eq!(c.journal(&p).len(), 1);
    let id = r["resource"]["id"].as_str().expect("id").to_string();
    let (st, v) =
        c.call(Method::DELETE, 1, &format!("/v1/computers/{id}"), &c.token, Some(json!({"commandKey": "d"}))).await;
    assert_eq!((st, kind(&v)), (409, "ComputerConflict"));
    assert_eq!(v["error"]["executionId"], exe.as_str());
    let (st, v) = c
        .call(
            Method::POST,
            1,
            &format!("/v1/executions/{exe}/decision"),
            &c.token,
            Some(json!({"outcome": "maybe", "reason": "x"})),
        )
        .await;
    assert_eq!((st, kind(&v)), (400, "invalid_request"));
    let (st, v) = c
        .call(
            Method::POST,
            1,
            &format!("/v1/executions/{exe}/decision"),
            &c.token,
            Some(json!({"outcome": "succeeded", "reason": "the sandbox is there"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!((v["state"].as_str(), v["decision"]["outcome"].as_str()), (Some("succeeded"), Some("succeeded")));
    let (_, comp) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(comp["state"], "running");
    // The Computer's next command runs after anything its actor would have re-sent: once it has
    // settled, the provider saw the create once, then the delete.
    let (st, v) =
        c.call(Method::DELETE, 1, &format!("/v1/computers/{id}"), &c.token, Some(json!({"commandKey": "d2"}))).await;
    assert_eq!(st, 202, "{v}");
    assert_eq!(c.settle(1, &s(&v, "executionId"), &c.token).await["state"], "succeeded");
    let ops: Vec<String> = c.journal(&p).iter().map(|l| s(l, "op")).collect();
    assert_eq!(ops, ["create", "delete"], "nothing was re-sent");
}

/// SIGKILL of the node driving a provider call: once it is declared dead, the Computer's new
/// owner marks the call `outcome_unknown` and never sends it again.
#[tokio::test]
async fn t50_node_kill_during_a_provider_call() {
    let mut c = TestCluster::start_fake(3).await;
    let p = provider(&c, json!({"create": "hang"})).await;
    let (st, r) = create(&c, 1, &c.token, "kill-1", &p).await;
    assert_eq!(st, 202);
    let exe = s(&r, "executionId");
    wait_for("the call to reach the provider", Duration::from_secs(20), || async {
        (c.journal(&p).len() == 1).then_some(())
    })
    .await;
    let (_, running) = c.call(Method::GET, 1, &format!("/v1/executions/{exe}"), &c.token, None).await;
    let driver = running["driverNode"].as_u64().unwrap_or_else(|| panic!("no driver node: {running}"));
    let via = (1..=3).find(|i| *i != driver).expect("another node");
    c.kill(driver);
    let done = c.settle(via, &exe, &c.token).await;
    assert_eq!(done["state"], "outcome_unknown", "{done}");
    assert!(done["error"]["message"].as_str().is_some_and(|m| m.contains("node driving this call stopped")), "{done}");
    // Give a (wrong) re-send every chance to show: the node comes back (the Computer may move
    // back to it) and everything settles again.
    c.spawn(driver);
    c.wait_voters(3).await;
    let (_, again) = c.call(Method::GET, via, &format!("/v1/executions/{exe}"), &c.token, None).await;
    assert_eq!(again["state"], "outcome_unknown");
    assert_eq!(c.journal(&p).len(), 1, "a dispatched call is never sent twice");
}

/// A Computer actor that crashes during a provider call never loses its execution: the call was
/// dispatched, so it ends `outcome_unknown` (not re-sent, not stuck `running`); the driver and
/// the other Computers' actors go on, and the crashed Computer gets a fresh actor for its next
/// command.
#[tokio::test]
async fn t52_an_actor_crash_during_a_provider_call() {
    let c = TestCluster::start_fake(1).await;
    let ok = provider(&c, json!({})).await;
    let crashing = provider(&c, json!({"create": "panic"})).await;
    let (_, r) = create(&c, 1, &c.token, "steady-1", &ok).await;
    assert_eq!(c.settle(1, &s(&r, "executionId"), &c.token).await["state"], "succeeded");
    let steady = s(&r["resource"], "id");

    let (st, r) = create(&c, 1, &c.token, "crash-1", &crashing).await;
    assert_eq!(st, 202, "{r}");
    let exe = s(&r, "executionId");
    let crashed = s(&r["resource"], "id");
    let done = c.settle(1, &exe, &c.token).await;
    assert_eq!(done["state"], "outcome_unknown", "{done}");
    let log = std::fs::read_to_string(&c.nodes[&1].log).expect("log");
    let logged = |l: &&str| l.contains("computer actor failed") && l.contains(&crashed) && l.contains("injected");
    assert!(log.lines().any(|l| logged(&l)), "the crash is not logged with its Computer and error");

    // The driver goes on: the other Computer's pause and delete run.
    for (method, path, key) in [
        (Method::POST, format!("/v1/computers/{steady}/pause"), "steady-p"),
        (Method::DELETE, format!("/v1/computers/{steady}"), "steady-d"),
    ] {
        let (st, r) = c.call(method, 1, &path, &c.token, Some(json!({"commandKey": key}))).await;
        assert_eq!(st, 202, "{r}");
        assert_eq!(c.settle(1, &s(&r, "executionId"), &c.token).await["state"], "succeeded");
    }
    // The crashed Computer, once decided, runs its next command in a fresh actor.
    let (st, v) = c
        .call(
            Method::POST,
            1,
            &format!("/v1/executions/{exe}/decision"),
            &c.token,
            Some(json!({"outcome": "failed", "reason": "no sandbox"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let (st, r) = c
        .call(Method::DELETE, 1, &format!("/v1/computers/{crashed}"), &c.token, Some(json!({"commandKey": "crash-d"})))
        .await;
    assert_eq!(st, 202, "{r}");
    assert_eq!(c.settle(1, &s(&r, "executionId"), &c.token).await["state"], "succeeded");
    let ops: Vec<String> = c.journal(&crashing).iter().map(|l| s(l, "op")).collect();
    assert_eq!(ops, ["create", "delete"], "the crashed create was sent once, never again");
}

/// Lifecycle work is placed over the live nodes: Computers spread over the three nodes, each
/// execution is driven by its Computer's node, the Computers of a SIGKILLed node move to the
/// others (and their commands run there), and they come back when the node does.
#[tokio::test]
async fn t55_lifecycle_work_is_placed_over_live_nodes() {
    let mut c = TestCluster::start_fake(3).await;
    let p = provider(&c, json!({})).await;
    let mut placed: Vec<(String, u64)> = Vec::new();
    for i in 0..12 {
        let (st, r) = create(&c, 1 + i % 3, &c.token, &format!("place-{i}"), &p).await;
        assert_eq!(st, 202, "{r}");
        let done = c.settle(1, &s(&r, "executionId"), &c.token).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        let computer = s(&done["resource"], "id");
        let (_, v) = c.call(Method::GET, 2, &format!("/v1/computers/{computer}"), &c.token, None).await;
        let node = v["driverNode"].as_u64().unwrap_or_else(|| panic!("not placed: {v}"));
        assert_eq!(done["driverNode"].as_u64(), Some(node), "the execution ran on its Computer's node");
        placed.push((computer, node));
    }
    let nodes: std::collections::BTreeSet<u64> = placed.iter().map(|(_, n)| *n).collect();
    assert!(nodes.len() >= 2, "12 Computers all on one node: {placed:?}");

    // Kill a node that owns some; its Computers move to live nodes and their pauses run there.
    let victim = placed[0].1;
    let others: Vec<u64> = (1..=3).filter(|n| *n != victim).collect();
    c.kill(victim);
    let moved: Vec<&String> = placed.iter().filter(|(_, n)| *n == victim).map(|(id, _)| id).collect();
    for id in &moved {
        let (st, r) = c
            .call(
                Method::POST,
                others[0],
                &format!("/v1/computers/{id}/pause"),
                &c.token,
                Some(json!({"commandKey": format!("pause-{id}")})),
            )
            .await;
        assert_eq!(st, 202, "{r}");
        let done = c.settle(others[0], &s(&r, "executionId"), &c.token).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        let by = done["driverNode"].as_u64().expect("driven");
        assert!(others.contains(&by), "the pause of {id} ran on node {by}, which is dead");
    }
    // The others stayed where they were.
    for (id, node) in placed.iter().filter(|(_, n)| *n != victim) {
        let (_, v) = c.call(Method::GET, others[0], &format!("/v1/computers/{id}"), &c.token, None).await;
        assert_eq!(v["driverNode"].as_u64(), Some(*node), "{id} moved although its node lives");
    }
    // Back again: the victim's Computers return to it.
    c.spawn(victim);
    c.wait_voters(3).await;
    let id = moved[0].clone();
    wait_for("the Computer to return to its node", Duration::from_secs(20), || async {
        let (_, v) = c.call(Method::GET, others[0], &format!("/v1/computers/{id}"), &c.token, None).await;
        (v["driverNode"].as_u64() == Some(victim)).then_some(())
    })
    .await;
}

/// A pause while a delete runs is `ComputerConflict` naming the delete; a stop on an unknown
/// pause marks the Computer failed.
#[tokio::test]
async fn t60_conflicts_and_stop() {
    let c = TestCluster::start_fake(1).await;
    let p = provider(&c, json!({"delete": "slow:2000", "pause": "lost"})).await;
    let (_, r) = create(&c, 1, &c.token, "c1", &p).await;
    c.settle(1, &s(&r, "executionId"), &c.token).await;
    let id = r["resource"]["id"].as_str().expect("id").to_string();
    let (_, r2) = create(&c, 1, &c.token, "c2", &p).await;
    c.settle(1, &s(&r2, "executionId"), &c.token).await;
    let id2 = r2["resource"]["id"].as_str().expect("id").to_string();

    let (_, del) =
        c.call(Method::DELETE, 1, &format!("/v1/computers/{id}"), &c.token, Some(json!({"commandKey": "d1"}))).await;
    let (st, v) = c
        .call(Method::POST, 1, &format!("/v1/computers/{id}/pause"), &c.token, Some(json!({"commandKey": "p1"})))
        .await;
    assert_eq!((st, kind(&v)), (409, "ComputerConflict"));
    assert_eq!(v["error"]["executionId"], del["executionId"]);
    assert!(v["error"]["errorId"].as_str().is_some());

    let (_, pause) = c
        .call(Method::POST, 1, &format!("/v1/computers/{id2}/pause"), &c.token, Some(json!({"commandKey": "p2"})))
        .await;
    assert_eq!(c.settle(1, &s(&pause, "executionId"), &c.token).await["state"], "outcome_unknown");
    let (_, u) = c.call(Method::GET, 1, &format!("/v1/computers/{id2}/usage"), &c.token, None).await;
    assert_eq!((u["spans"][0]["end"].clone(), u["spans"][0]["outcomeUnknown"].clone()), (Value::Null, json!(true)));
    let (st, comp) = c.call(Method::POST, 1, &format!("/v1/computers/{id2}/stop"), &c.token, None).await;
    assert_eq!(st, 200, "{comp}");
    assert_eq!((comp["state"].as_str(), comp["activeExecution"].clone()), (Some("failed"), Value::Null));
}

/// Bots see only granted Computers (404 otherwise in lists and reads of others' Computers);
/// grants enable them; a revoked grant makes the next call `forbidden` with an error id and the
/// command never reaches the provider; archiving a bot ends its rights.
#[tokio::test]
async fn t70_bot_rights() {
    let c = TestCluster::start_fake(1).await;
    let p = provider(&c, json!({})).await;
    let (_, r) = create(&c, 1, &c.token, "c1", &p).await;
    c.settle(1, &s(&r, "executionId"), &c.token).await;
    let id = r["resource"]["id"].as_str().expect("id").to_string();
    let (_, bot) = c.call(Method::POST, 1, "/v1/bots", &c.token, Some(json!({"name": "b"}))).await;
    let bot_id = s(&bot, "id");
    let bt = c.mint(json!({"botId": bot_id})).await;

    let (_, list) = c.call(Method::GET, 1, "/v1/computers", &bt, None).await;
    assert_eq!(list["computers"], json!([]));
    let (st, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &bt, None).await;
    assert_eq!((st, kind(&v)), (403, "forbidden"), "its own member's computer: known, not allowed");
    let (st, _) = c.call(Method::GET, 1, "/v1/computers/cmp_doesnotexist", &bt, None).await;
    assert_eq!(st, 404);

    let (st, g) = c.call(Method::PUT, 1, &format!("/v1/computers/{id}/bots/{bot_id}"), &c.token, None).await;
    assert_eq!(st, 200, "{g}");
    let (_, list) = c.call(Method::GET, 1, "/v1/computers", &bt, None).await;
    assert_eq!(list["computers"].as_array().map(Vec::len), Some(1));
    let (st, r) =
        c.call(Method::POST, 1, &format!("/v1/computers/{id}/pause"), &bt, Some(json!({"commandKey": "bp"}))).await;
    assert_eq!(st, 202, "{r}");
    c.settle(1, &s(&r, "executionId"), &bt).await;
    let calls = c.journal(&p).len();

    let (st, _) = c.call(Method::DELETE, 1, &format!("/v1/computers/{id}/bots/{bot_id}"), &c.token, None).await;
    assert_eq!(st, 204);
    let (st, v) =
        c.call(Method::POST, 1, &format!("/v1/computers/{id}/resume"), &bt, Some(json!({"commandKey": "br"}))).await;
    assert_eq!((st, kind(&v)), (403, "forbidden"));
    assert!(v["error"]["errorId"].as_str().is_some_and(|e| e.starts_with("err_")));
    assert_eq!(c.journal(&p).len(), calls, "nothing reached the provider");

    // A member token limited to another computer sees nothing of this one.
    let limited = c.mint(json!({"computers": ["cmp_other"]})).await;
    let (st, _) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &limited, None).await;
    assert_eq!(st, 404);
    let (st, v) = create(&c, 1, &limited, "lim", &p).await;
    assert_eq!((st, kind(&v)), (403, "forbidden"));

    c.call(Method::PUT, 1, &format!("/v1/computers/{id}/bots/{bot_id}"), &c.token, None).await;
    let (st, _) = c.call(Method::POST, 1, &format!("/v1/bots/{bot_id}/archive"), &c.token, None).await;
    assert_eq!(st, 200);
    let (_, grants) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/bots"), &c.token, None).await;
    assert_eq!(grants["grants"], json!([]), "archiving ended the grant");
}

/// Capabilities: rules deny or allow; a bot's create is parked for approval and runs once a
/// member approves; with no rule deciding, the action does not run and says why.
#[tokio::test]
async fn t80_capabilities_and_approvals() {
    let c = TestCluster::start_fake(1).await;
    let p = provider(&c, json!({})).await;
    let (_, bot) = c.call(Method::POST, 1, "/v1/bots", &c.token, Some(json!({"name": "b"}))).await;
    let bot_id = s(&bot, "id");
    let bt = c.mint(json!({"botId": bot_id})).await;

    let (st, r) = create(&c, 1, &bt, "bot-create", &p).await;
    assert_eq!(st, 202, "{r}");
    assert_eq!(r["state"], "pending");
    let approval = s(&r, "approvalId");
    let (_, list) = c.call(Method::GET, 1, "/v1/approvals", &c.token, None).await;
    assert_eq!(list["approvals"][0]["id"], approval.as_str());
    assert!(c.journal(&p).is_empty(), "nothing runs before the approval");
    let (st, a) =
        c.call(Method::POST, 1, &format!("/v1/approvals/{approval}"), &bt, Some(json!({"decision": "approve"}))).await;
    assert_eq!(st, 404, "a bot cannot approve its own request: {a}");
    let (st, a) = c
        .call(Method::POST, 1, &format!("/v1/approvals/{approval}"), &c.token, Some(json!({"decision": "approve"})))
        .await;
    assert_eq!((st, a["state"].as_str()), (200, Some("approved")));
    assert_eq!(c.settle(1, &s(&r, "executionId"), &bt).await["state"], "succeeded");
    let (_, mine) = c.call(Method::GET, 1, "/v1/computers", &bt, None).await;
    assert_eq!(mine["computers"].as_array().map(Vec::len), Some(1), "the creating bot may use it");

    let deny =
        json!({"rules": [{"capability": "computers.create", "effect": "deny", "provider": p}, {"effect": "allow"}]});
    let (st, _) = c.call(Method::PUT, 1, "/v1/capability-rules", &c.token, Some(deny)).await;
    assert_eq!(st, 200);
    let (st, v) = create(&c, 1, &c.token, "denied", &p).await;
    assert_eq!((st, kind(&v)), (403, "forbidden"));
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("denied")));
    let (st, _) = c.call(Method::PUT, 1, "/v1/capability-rules", &c.token, Some(json!({"rules": []}))).await;
    assert_eq!(st, 200);
    let (st, v) = create(&c, 1, &c.token, "undecided", &p).await;
    assert_eq!((st, kind(&v)), (403, "forbidden"));
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("no rule decides")));
    let (_, all) = c.call(Method::GET, 1, "/v1/computers", &c.token, None).await;
    assert_eq!(all["computers"].as_array().map(Vec::len), Some(1), "refused creates stored nothing");
    let (st, _) = c.call(Method::PUT, 1, "/v1/capability-rules", &bt, Some(json!({"rules": []}))).await;
    assert_eq!(st, 403);
}

/// A paired Computer: its create succeeds with a one-time pairing code for its creator; own
/// machines never pause (`ComputerUnsupported`).
#[tokio::test]
async fn t90_paired_computer() {
    let c = TestCluster::start_fake(1).await;
    let (st, r) = c
        .call(
            Method::POST,
            1,
            "/v1/computers",
            &c.token,
            Some(json!({"commandKey": "pair", "source": {"_tag": "Paired"}})),
        )
        .await;
    assert_eq!(st, 202, "{r}");
    let done = c.settle(1, &s(&r, "executionId"), &c.token).await;
    assert_eq!(done["state"], "succeeded");
    let code = s(&done, "pairingCode");
    assert_eq!(code.len(), 11);
    let id = r["resource"]["id"].as_str().expect("id").to_string();
    let (_, comp) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!((comp["state"].as_str(), comp["pauseAfter"].clone()), (Some("offline"), Value::Null));
    let (st, v) = c
        .call(Method::POST, 1, &format!("/v1/computers/{id}/pause"), &c.token, Some(json!({"commandKey": "pp"})))
        .await;
    assert_eq!((st, kind(&v)), (422, "ComputerUnsupported"));
    // Another member (an admin) sees the receipt but not the code.
    let (_, admin) =
        c.call(Method::POST, 1, "/v1/members", &c.token, Some(json!({"name": "ad", "role": "admin"}))).await;
    let at = c.mint(json!({"memberId": admin["id"]})).await;
    let (_, seen) = c.call(Method::GET, 1, &format!("/v1/executions/{}", s(&r, "executionId")), &at, None).await;
    assert_eq!(seen["state"], "succeeded");
    assert!(seen.get("pairingCode").is_none());
}

/// The event stream (SSE) delivers lifecycle events as they happen.
#[tokio::test]
async fn t95_event_stream() {
    let c = TestCluster::start_fake(1).await;
    let p = provider(&c, json!({})).await;
    let mut resp = c
        .req(Method::GET, 1, "/v1/events?after=0", &c.token)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status().as_u16(), 200);
    let (_, r) = create(&c, 1, &c.token, "sse", &p).await;
    let exe = s(&r, "executionId");
    let mut text = String::new();
    let got = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(chunk) = resp.chunk().await.expect("chunk") {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains("event: ExecutionFinished") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(got, Ok(true), "{text}");
    assert!(text.contains("event: ExecutionStarted") && text.contains(&exe));
    // Issue 37, item 11: `Last-Event-ID` resumes after that event, in JSON and on a stream.
    let (_, all) = c.call(Method::GET, 1, "/v1/events?after=0", &c.token, None).await;
    let seqs: Vec<u64> = all["events"].as_array().expect("events").iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert!(seqs.len() >= 2, "{all}");
    let r = c.req(Method::GET, 1, "/v1/events?after=0", &c.token).header("last-event-id", seqs[0].to_string());
    let resumed: Value = r.send().await.expect("get").json().await.expect("json");
    let after: Vec<u64> =
        resumed["events"].as_array().expect("events").iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(after, seqs[1..], "{resumed}");
    assert!(resumed.get("gap").is_none(), "nothing was dropped: {resumed}");
    let mut resp = c
        .req(Method::GET, 1, "/v1/events?after=0", &c.token)
        .header("accept", "text/event-stream")
        .header("last-event-id", seqs[seqs.len() - 2].to_string())
        .send()
        .await
        .expect("stream");
    let mut text = String::new();
    let last = format!("id: {}", seqs[seqs.len() - 1]);
    let got = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(chunk) = resp.chunk().await.expect("chunk") {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains(&last) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(got, Ok(true), "{text}");
    let ids: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("id: ")).collect();
    assert_eq!(ids, [seqs[seqs.len() - 1].to_string()], "only the event after the one resumed from: {text}");
    let bad = c.req(Method::GET, 1, "/v1/events", &c.token).header("last-event-id", "x").send().await.expect("get");
    assert_eq!(bad.status().as_u16(), 400);
}

/// Every event the owner sees, oldest first (all pages).
async fn all_events(c: &TestCluster) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let (st, v) = c.call(Method::GET, 1, &format!("/v1/events?after={after}&limit=1000"), &c.token, None).await;
        assert_eq!(st, 200, "{v}");
        let page = v["events"].as_array().cloned().unwrap_or_default();
        if page.is_empty() {
            return out;
        }
        after = page.last().and_then(|e| e["seq"].as_u64()).expect("seq");
        out.extend(page);
    }
}

/// 300 Computers whose idle pauses fail (the provider cannot be reached: `not_sent`) do not
/// delay another Computer's idle pause: a failed pause waits a growing delay before it is asked
/// for again, so the failing ones never fill the scheduler's pass (256 a tick) ahead of it.
#[tokio::test]
async fn t97_failing_idle_pauses_never_delay_others() {
    let c = TestCluster::start_fake(1).await;
    let failing = provider(&c, json!({"pause": "not_sent"})).await;
    let healthy = provider(&c, json!({})).await;
    let body = |key: String, p: &str| {
        json!({"commandKey": key, "name": "idle", "pauseAfter": 1,
               "source": {"_tag": "Provider", "provider": p, "template": null}})
    };
    let mut ids = Vec::new();
    for chunk in (0..300).collect::<Vec<_>>().chunks(25) {
        let calls = chunk
            .iter()
            .map(|i| c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body(format!("f{i}"), &failing))));
        for (st, r) in futures::future::join_all(calls).await {
            assert_eq!(st, 202, "{r}");
            ids.push(s(&r["resource"], "id"));
        }
    }
    // Every one of them fails its idle pause at least once.
    let failed = wait_for("300 failed idle pauses", Duration::from_secs(120), || async {
        let events = all_events(&c).await;
        let failed: std::collections::HashSet<String> = events
            .iter()
            .filter(|e| {
                e["type"] == "ExecutionFinished" && e["data"]["kind"] == "pause" && e["data"]["state"] == "failed"
            })
            .filter_map(|e| e["computerId"].as_str().map(String::from))
            .collect();
        (failed.len() == 300).then_some(failed)
    })
    .await;
    assert!(ids.iter().all(|id| failed.contains(id)));
    for id in ids.iter().take(5) {
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        assert_eq!(v["state"], "running", "a failed pause leaves it running: {v}");
    }

    let (st, r) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body("ok".into(), &healthy))).await;
    assert_eq!(st, 202, "{r}");
    let id = s(&r["resource"], "id");
    let running = wait_for("the healthy computer to run", Duration::from_secs(20), || async {
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        (v["state"] == "running").then(|| v["idlePauseAt"].as_u64().expect("idlePauseAt"))
    })
    .await;
    let started = std::time::Instant::now();
    wait_for("the healthy computer's idle pause", Duration::from_secs(10), || async {
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        (v["state"] == "paused").then_some(())
    })
    .await;
    let late = started.elapsed();
    println!("healthy computer paused {late:?} after it ran (deadline {running}), behind 300 failing ones");
    assert!(late < Duration::from_secs(5), "paused {late:?} after it ran, with pauseAfter 1 s");
    // The failing ones were not asked again at every tick: after a failure, the next pause of
    // the same Computer waits (10 s after a first failure, doubling).
    // Retries do happen (the check below would pass without any): wait for some.
    let events = wait_for("failed idle pauses to be retried", Duration::from_secs(60), || async {
        let events = all_events(&c).await;
        let mut failed: std::collections::HashSet<String> = Default::default();
        let retried = events.iter().any(|e| {
            let id = e["computerId"].as_str().unwrap_or_default().to_string();
            if e["type"] == "ExecutionFinished" && e["data"]["kind"] == "pause" && e["data"]["state"] == "failed" {
                failed.insert(id);
                false
            } else {
                e["type"] == "IdlePauseScheduled" && failed.contains(&id)
            }
        });
        retried.then_some(events)
    })
    .await;
    let mut last_failure: std::collections::HashMap<&str, u64> = Default::default();
    let mut retries = 0;
    for e in &events {
        let (Some(id), Some(at)) = (e["computerId"].as_str(), e["at"].as_u64()) else { continue };
        if e["type"] == "ExecutionFinished" && e["data"]["kind"] == "pause" && e["data"]["state"] == "failed" {
            last_failure.insert(id, at);
        } else if e["type"] == "IdlePauseScheduled"
            && let Some(failed) = last_failure.get(id)
        {
            retries += 1;
            assert!(at >= failed + 9_900, "{id} was asked to pause again {} ms after a failure", at - failed);
        }
    }
    assert!(retries > 0, "no failed pause was retried");
    println!("{} failed idle pauses, {retries} retried after their delay", last_failure.len());
    let ops: Vec<String> = c.journal(&healthy).iter().map(|l| s(l, "op")).collect();
    assert_eq!(ops, ["create", "pause"]);
}

/// `COMPUTERD_LOG_FORMAT=json`: every line the node logs is one JSON object, and an execution's
/// lines carry its ids as fields (from its span), so an operator can select them.
#[tokio::test]
async fn t95_logs_as_json_carry_the_ids() {
    let mut c = TestCluster::start_fake(1).await;
    assert_eq!(c.terminate(1).await, Some(0));
    c.env.push(("COMPUTERD_LOG_FORMAT".into(), "json".into()));
    let log = c.nodes[&1].log.clone();
    let before = std::fs::read_to_string(&log).expect("log").len();
    c.spawn(1);
    c.wait_voters(1).await;
    let p = provider(&c, json!({})).await;
    let (st, r) = create(&c, 1, &c.token, "json-logs", &p).await;
    assert_eq!(st, 202, "{r}");
    let (exe, id) = (s(&r, "executionId"), r["resource"]["id"].as_str().expect("computer id").to_string());
    assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded");
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<Value> = text[before..]
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty(), "{text}");
    assert!(lines.iter().all(|l| l["level"].is_string() && l["timestamp"].is_string() && l["message"].is_string()));
    let of_it: Vec<&Value> =
        lines.iter().filter(|l| l["span"]["execution_id"] == exe && l["span"]["computer_id"] == id).collect();
    assert!(!of_it.is_empty(), "no line carries the execution's ids: {text}");

    // Anything else is refused at start.
    let (code, out) = c.run_to_exit_with(1, &[], &[("COMPUTERD_LOG_FORMAT", "yaml")]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("text or json"), "{out}");
}

/// Issue 40, item 4: a recreate whose answer is lost is `outcome_unknown` like any other
/// execution (sent once, never again), holds the Computer until a person decides, and a decision
/// that it succeeded runs it (this provider starts no agent to wait for) with the new template.
#[tokio::test]
async fn i40_4_a_lost_recreate_answer_is_unknown_and_never_resent() {
    let c = TestCluster::start_fake(1).await;
    let p = provider(&c, json!({"recreate": "lost"})).await;
    let (_, r) = create(&c, 1, &c.token, "rl-create", &p).await;
    assert_eq!(c.settle(1, &s(&r, "executionId"), &c.token).await["state"], "succeeded");
    let id = r["resource"]["id"].as_str().expect("id").to_string();
    let path = format!("/v1/computers/{id}/recreate");
    let (st, v) = c.call(Method::POST, 1, &path, &c.token, Some(json!({"commandKey": "rl", "template": "x" }))).await;
    assert_eq!(st, 202, "{v}");
    let exe = s(&v, "executionId");
    let done = c.settle(1, &exe, &c.token).await;
    assert_eq!((done["state"].as_str(), done["kind"].as_str()), (Some("outcome_unknown"), Some("recreate")), "{done}");
    let (st, v) = c.call(Method::POST, 1, &path, &c.token, Some(json!({"commandKey": "rl-2"}))).await;
    assert_eq!(
        (st, kind(&v), v["error"]["executionId"].as_str()),
        (409, "ComputerConflict", Some(exe.as_str())),
        "{v}"
    );
    let decision = json!({"outcome": "succeeded", "reason": "the new container runs"});
    let (st, v) = c.call(Method::POST, 1, &format!("/v1/executions/{exe}/decision"), &c.token, Some(decision)).await;
    assert_eq!(st, 200, "{v}");
    let (_, comp) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!((comp["state"].as_str(), comp["source"]["template"].as_str()), (Some("running"), Some("x")), "{comp}");
    let ops: Vec<String> = c.journal(&p).iter().map(|l| s(l, "op")).collect();
    assert_eq!(ops, ["create", "recreate"], "sent once: {ops:?}");
}
