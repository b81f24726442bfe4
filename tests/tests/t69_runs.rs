//! Turns and runs through a real 3-node cluster: a member uploads a blob and starts a turn
//! (idempotent on `clientTurnId`); a bot runtime claims the run on another node, reads the
//! attached blob, posts partials and ends it; the member follows the run's SSE, drops it
//! midway and resumes on another node with `Last-Event-ID`, getting every event exactly once.
//! A lease that lapses puts the run back in the queue and fences out its old attempt; bad input
//! is refused with its kind and changes nothing. Through HAProxy, a stream whose node is killed
//! resumes on a live node with every event once.

use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::sse::Sse;
use computerd_tests::sse::follow;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

async fn post(c: &TestCluster, node: u64, path: &str, token: &str, body: Value) -> (u16, Value) {
    c.call(Method::POST, node, path, token, Some(body)).await
}

#[tokio::test]
async fn t10_a_turn_runs_once_and_its_events_resume_on_any_node() {
    let c = TestCluster::start(3).await;
    let (s, bot) = post(&c, 1, "/v1/bots", &c.token, json!({"name": "runner"})).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    let bot_token = c.mint(json!({"botId": bot})).await;

    // The member's file, as a blob.
    let report: Vec<u8> = (0..120_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let sha = hex::encode(sha2::Sha256::digest(&report));
    let r = reqwest::Client::new()
        .post(c.url(1, &format!("/api/blobs?sha={sha}&name=report.pdf&mimeType=application/pdf")))
        .bearer_auth(&c.token)
        .body(report.clone())
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status().as_u16(), 200);
    let blob: Value = r.json().await.expect("blob");
    let blob_id = blob["blobId"].as_str().expect("blobId").to_string();

    // A turn, idempotent on its clientTurnId, on another node.
    let turn = json!({
        "text": "upload report.pdf to project B and give me the link",
        "clientTurnId": "turn-1",
        "botId": bot,
        "attachments": [{"name": "report.pdf", "mimeType": "application/pdf", "size": report.len(), "blobId": blob_id}],
    });
    let (s, run) = post(&c, 2, "/api/turn", &c.token, turn.clone()).await;
    assert_eq!((s, run["state"].as_str()), (201, Some("queued")), "{run}");
    let run_id = run["runId"].as_str().expect("runId").to_string();
    let (s, again) = post(&c, 3, "/api/turn", &c.token, turn.clone()).await;
    assert_eq!((s, again["runId"].as_str()), (200, Some(run_id.as_str())), "the same turn: {again}");
    let mut other = turn.clone();
    other["text"] = json!("something else");
    let (s, v) = post(&c, 1, "/api/turn", &c.token, other).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (422, Some("IdempotencyKeyReused")), "{v}");

    // The member follows the run from its start, on node 3.
    let events = c.url(3, &format!("/api/runs/{run_id}/events"));
    let mut sse = Sse::open(&events, &c.token, None).await;

    // The runtime claims it on node 3, and reads the attached blob (its member's) on node 1.
    let (s, claimed) = post(&c, 3, "/api/runs/claim", &bot_token, json!({"waitMs": 10_000})).await;
    assert_eq!((s, claimed["run"]["runId"].as_str()), (200, Some(run_id.as_str())), "{claimed}");
    assert_eq!(claimed["run"]["state"], "running");
    let claim = claimed["claim"].as_str().expect("claim").to_string();
    let r = reqwest::Client::new()
        .get(c.url(1, &format!("/api/blobs/{blob_id}")))
        .bearer_auth(&bot_token)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status().as_u16(), 200, "the bot reads a blob attached to its run");
    assert_eq!(r.bytes().await.expect("bytes").to_vec(), report);

    // Partials through every node; the member reads up to the second one, then drops.
    for (i, node) in [1u64, 2, 3].into_iter().enumerate() {
        let body = json!({"claim": claim, "kind": "partial", "data": format!("step {i}")});
        let (s, v) = post(&c, node, &format!("/api/runs/{run_id}/events"), &bot_token, body).await;
        assert_eq!(s, 201, "{v}");
    }
    let mut seen = Vec::new();
    while let Some((seq, kind, data)) = sse.next().await {
        seen.push((seq, kind.clone()));
        if kind == "partial" && data["partial"] == "step 1" {
            break;
        }
    }
    drop(sse);
    assert_eq!(
        seen,
        [(1, "state".into()), (2, "state".into()), (3, "partial".into()), (4, "partial".into())],
        "queued, running, two partials"
    );
    let last = seen.last().map(|(seq, _)| *seq);
    let body = json!({"claim": claim, "kind": "activity", "data": {"tool": "browser.upload"}});
    assert_eq!(post(&c, 2, &format!("/api/runs/{run_id}/events"), &bot_token, body).await.0, 201);
    let result = json!({"documentId": 7, "url": "http://site/b/documents/7"});
    let body = json!({"claim": claim, "outcome": "succeeded", "result": result});
    let (s, done) = post(&c, 1, &format!("/api/runs/{run_id}/finish"), &bot_token, body.clone()).await;
    assert_eq!((s, done["state"].as_str()), (200, Some("succeeded")), "{done}");
    let (s, v) = post(&c, 1, &format!("/api/runs/{run_id}/finish"), &bot_token, body).await;
    assert_eq!(s, 409, "ended once: {v}");

    // Resumed on node 1 after the last event seen: the rest, each once, ending with `final`.
    let mut sse = Sse::open(&c.url(1, &format!("/api/runs/{run_id}/events")), &c.token, last).await;
    let mut rest = Vec::new();
    while let Some((seq, kind, data)) = sse.next().await {
        rest.push((seq, kind, data));
    }
    let seqs: Vec<u64> = rest.iter().map(|(s, _, _)| *s).collect();
    assert_eq!(seqs, [5, 6, 7], "every missed event exactly once");
    assert_eq!(rest[0].2["partial"], "step 2");
    assert_eq!(rest[1].1, "activity");
    assert_eq!((rest[2].1.as_str(), &rest[2].2["final"]["result"]), ("final", &result));
    let (s, v) = c.call(Method::GET, 2, &format!("/api/runs/{run_id}"), &c.token, None).await;
    assert_eq!((s, v["state"].as_str(), v["lastEventId"].as_u64()), (200, Some("succeeded"), Some(7)), "{v}");

    // Bad input: told why, nothing changes.
    let (s, v) = c.call(Method::GET, 1, &format!("/api/runs/{run_id}/events?after=x"), &c.token, None).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
    let r = reqwest::Client::new()
        .get(c.url(1, &format!("/api/runs/{run_id}/events")))
        .bearer_auth(&c.token)
        .header("last-event-id", "seven")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status().as_u16(), 400);
    let (s, v) = post(&c, 1, "/api/runs/claim", &c.token, json!({})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "a member names the bot: {v}");
    let (s, v) =
        post(&c, 1, "/api/turn", &c.token, json!({"text": "x", "clientTurnId": "t", "botId": bot, "x": 1})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
    let (s, v) = c.call(Method::GET, 1, "/api/runs/run_nothing", &bot_token, None).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (404, Some("not_found")), "{v}");
    let (s, _) = post(&c, 1, "/api/runs/claim", &bot_token, json!({"waitMs": 200})).await;
    assert_eq!(s, 204, "nothing queued: the long poll ends empty");
}

#[tokio::test]
async fn t20_a_lapsed_lease_requeues_the_run_and_fences_its_old_attempt() {
    let c = TestCluster::start(1).await;
    let (s, bot) = post(&c, 1, "/v1/bots", &c.token, json!({"name": "runner"})).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    let bot_token = c.mint(json!({"botId": bot})).await;
    let turn = json!({"text": "do it", "clientTurnId": "turn-2", "botId": bot, "afterRun": "pause"});
    let (s, run) = post(&c, 1, "/api/turn", &c.token, turn).await;
    assert_eq!(s, 201, "{run}");
    let run_id = run["runId"].as_str().expect("runId").to_string();

    // A member's runtime names the bot; its lease lapses (2 s, never renewed).
    let (s, claimed) = post(&c, 1, "/api/runs/claim", &c.token, json!({"botId": bot, "leaseMs": 2000})).await;
    assert_eq!(s, 200, "{claimed}");
    let old = claimed["claim"].as_str().expect("claim").to_string();
    let path = format!("/api/runs/{run_id}");
    let requeued = wait_for("the lapsed lease to requeue the run", Duration::from_secs(20), || async {
        let (_, v) = c.call(Method::GET, 1, &path, &c.token, None).await;
        (v["state"] == "queued").then_some(v)
    })
    .await;
    assert_eq!(requeued["attempts"], 1, "{requeued}");
    let (s, v) = post(&c, 1, &format!("{path}/lease"), &c.token, json!({"claim": old})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (409, Some("conflict")), "the old attempt is fenced: {v}");
    let body = json!({"claim": old, "kind": "partial", "data": "late"});
    assert_eq!(post(&c, 1, &format!("{path}/events"), &bot_token, body).await.0, 409);

    // Claimed again, then cancelled by the member: its runtime's next call is refused.
    let (s, claimed) = post(&c, 1, "/api/runs/claim", &bot_token, json!({"waitMs": 5000})).await;
    assert_eq!((s, claimed["run"]["attempts"].as_u64()), (200, Some(2)), "{claimed}");
    let new = claimed["claim"].as_str().expect("claim").to_string();
    let (s, v) = post(&c, 1, &format!("{path}/lease"), &bot_token, json!({"claim": new, "leaseMs": 60_000})).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(&c, 1, &format!("{path}/cancel"), &bot_token, json!({})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "its runtime does not cancel: {v}");
    let (s, v) = c.call(Method::POST, 1, &format!("{path}/cancel"), &c.token, None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("cancelled")), "{v}");
    let body = json!({"claim": new, "outcome": "succeeded"});
    assert_eq!(post(&c, 1, &format!("{path}/finish"), &bot_token, body).await.0, 409);
    let (s, v) = post(&c, 1, &format!("{path}/decision"), &c.token, json!({"decision": "requeue"})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (409, Some("conflict")), "only a run needing it: {v}");
}

/// The example runtime (`examples/runtime/runtime.py`) as a process, with the bot's token.
fn runtime(c: &TestCluster, token_file: &std::path::Path, computer: &str, extra: &[&str]) -> std::process::Child {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/runtime/runtime.py");
    std::process::Command::new("python3")
        .arg(script)
        .args(["--url", &c.url(1, ""), "--computer", computer, "--lease-ms", "2000", "--once", "--token-file"])
        .arg(token_file)
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the example runtime")
}

/// The first line the runtime prints.
fn first_line(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let out = child.stdout.as_mut().expect("stdout");
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line).expect("a line");
    line.trim().to_string()
}

#[tokio::test]
async fn t30_the_example_runtime_killed_mid_run_is_replaced_and_copies_once() {
    use computerd_tests::agent::AgentProc;
    use computerd_tests::agent::paired_computer;
    use computerd_tests::agent::wait_state;
    let c = TestCluster::start(1).await;
    let (computer, code) = paired_computer(&c, "runtime").await;
    let workdir = c.dir.path().join("workspace");
    std::fs::create_dir_all(&workdir).expect("workdir");
    let workdir_arg = workdir.to_string_lossy().to_string();
    let _agent = AgentProc::spawn_with(
        &c.url(1, ""),
        &c.dir.path().join("agent"),
        Some(&code),
        &c.dir.path().join("agent.log"),
        &["--workdir", &workdir_arg],
    );
    wait_state(&c, &computer, "running").await;
    let (s, bot) = post(&c, 1, "/v1/bots", &c.token, json!({"name": "runner"})).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    // The test agent runs as root, so its sessions and copies do: the bot is allowed root there.
    let grant = format!("/v1/computers/{computer}/bots/{bot}");
    let (s, v) = c.call(Method::PUT, 1, &grant, &c.token, Some(json!({"allowRoot": true}))).await;
    assert_eq!(s, 200, "{v}");
    let token_file = c.dir.path().join("bot.token");
    std::fs::write(&token_file, c.mint(json!({"botId": bot})).await).expect("token file");

    let report: Vec<u8> = (0..120_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let sha = hex::encode(sha2::Sha256::digest(&report));
    let r = reqwest::Client::new()
        .post(c.url(1, &format!("/api/blobs?sha={sha}&name=report.pdf&mimeType=application/pdf")))
        .bearer_auth(&c.token)
        .body(report.clone())
        .send()
        .await
        .expect("upload");
    let blob: Value = r.json().await.expect("blob");
    let turn = json!({
        "text": "put report.pdf in the Computer",
        "clientTurnId": "turn-3",
        "afterRun": "pause",
        "botId": bot,
        "attachments": [{"name": "report.pdf", "mimeType": "application/pdf", "size": report.len(), "blobId": blob["blobId"]}],
    });
    let (s, run) = post(&c, 1, "/api/turn", &c.token, turn).await;
    assert_eq!(s, 201, "{run}");
    let run_id = run["runId"].as_str().expect("runId").to_string();

    // The first runtime claims it, then is killed before it does anything.
    let mut first = runtime(&c, &token_file, &computer, &["--hold-at", "claim"]);
    assert_eq!(first_line(&mut first), format!("claimed {run_id} attempt 1"));
    first.kill().expect("kill -9");
    let _ = first.wait();
    // Its lease lapses; a second runtime takes the run over and ends it.
    let mut second = runtime(&c, &token_file, &computer, &[]);
    assert_eq!(first_line(&mut second), format!("claimed {run_id} attempt 2"));
    let status = tokio::task::spawn_blocking(move || second.wait_with_output()).await.expect("join").expect("wait");
    let said = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(status.status.success(), "{said}");
    // `afterRun: pause` was asked of the Computer it named; an own machine never pauses, and the
    // runtime is told so (the run ended all the same).
    assert!(said.contains(r#"afterRun {"error": {"kind": "ComputerUnsupported""#), "{said}");

    let (_, v) = c.call(Method::GET, 1, &format!("/api/runs/{run_id}"), &c.token, None).await;
    assert_eq!((v["state"].as_str(), v["attempts"].as_u64()), (Some("succeeded"), Some(2)), "{v}");
    let art = &v["result"]["artifacts"][0];
    assert_eq!(art["sha256"], sha.as_str(), "{v}");
    let placed = workdir.join(format!(".agent-turn/{run_id}/inbox/report.pdf"));
    assert_eq!(std::fs::read(&placed).expect("the copy"), report, "byte for byte in the Computer");
    // One copy: the killed runtime did nothing, its successor copied once.
    let (_, ev) = c.call(Method::GET, 1, &format!("/api/runs/{run_id}/events"), &c.token, None).await;
    let copies = ev["events"].as_array().expect("events").iter().filter(|e| e["kind"] == "activity").count();
    assert_eq!(copies, 1, "{ev}");
    let kinds: Vec<&str> = ev["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"state"));
    assert_eq!(kinds.last(), Some(&"final"));

    // Out of the paired machine: a bot copies only from the paths its grant names, checked on
    // the opened file's real path (a symlink does not lead out).
    std::fs::create_dir_all(workdir.join("outbox")).expect("outbox");
    std::fs::write(workdir.join("outbox/summary.txt"), b"the summary\n").expect("summary");
    std::fs::write(workdir.join("secret.txt"), b"not for bots\n").expect("secret");
    std::os::unix::fs::symlink("../secret.txt", workdir.join("outbox/leak")).expect("symlink");
    let bot_token = std::fs::read_to_string(c.dir.path().join("bot.token")).expect("token");
    let from_box = format!("/v1/computers/{computer}/copy-from-box");
    let (s, v) = post(&c, 1, &from_box, &bot_token, json!({"path": "outbox/summary.txt"})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "a grant without paths: {v}");
    // Reading a file is held to the same paths as copying it out.
    let read = |p: &str| format!("/v1/computers/{computer}/files?path={p}");
    let (s, v) = c.call(Method::GET, 1, &read("outbox/summary.txt"), &bot_token, None).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "a read without paths: {v}");
    let (s, v) = c.call(Method::PUT, 1, &grant, &c.token, Some(json!({"paths": ["outbox"]}))).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "paths are absolute: {v}");
    let outbox = workdir.join("outbox").to_string_lossy().to_string();
    let (s, v) = c.call(Method::PUT, 1, &grant, &c.token, Some(json!({"paths": [outbox]}))).await;
    assert_eq!((s, &v["paths"], v["allowRoot"].as_bool()), (200, &json!([outbox]), Some(true)), "{v}");
    let (s, v) = post(&c, 1, &from_box, &bot_token, json!({"path": "outbox/summary.txt"})).await;
    assert_eq!(
        (s, v["sha256"].as_str()),
        (200, Some(hex::encode(sha2::Sha256::digest(b"the summary\n")).as_str())),
        "{v}"
    );
    let (s, v) = c.call(Method::GET, 1, &read("outbox/summary.txt"), &bot_token, None).await;
    assert_eq!((s, v["content"].as_str()), (200, Some("the summary\n")), "{v}");
    // And so is listing a directory.
    let list = |p: &str| format!("/v1/computers/{computer}/directory?path={p}");
    let (s, v) = c.call(Method::GET, 1, &list("outbox"), &bot_token, None).await;
    let names: Vec<&str> =
        v["entries"].as_array().map(|e| e.iter().filter_map(|e| e["name"].as_str()).collect()).unwrap_or_default();
    assert_eq!((s, names), (200, vec!["leak", "summary.txt"]), "{v}");
    let (s, v) = c.call(Method::GET, 1, &list("."), &bot_token, None).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "the workspace itself: {v}");
    for outside in ["secret.txt", "outbox/leak"] {
        let (s, v) = post(&c, 1, &from_box, &bot_token, json!({"path": outside})).await;
        assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "{outside}: {v}");
        let (s, v) = c.call(Method::GET, 1, &read(outside), &bot_token, None).await;
        assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "read {outside}: {v}");
    }
    let (s, v) = c.call(Method::GET, 1, &read("secret.txt"), &c.token, None).await;
    assert_eq!((s, v["content"].as_str()), (200, Some("not for bots\n")), "the member reads anywhere: {v}");
    // The member copies from anywhere.
    let (s, v) = post(&c, 1, &from_box, &c.token, json!({"path": "secret.txt"})).await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test]
async fn t40_sse_through_haproxy_resumes_when_a_node_dies() {
    use computerd_tests::lb::Haproxy;
    let mut c = TestCluster::start(3).await;
    let lb = Haproxy::start(c.dir.path(), &c.nodes.values().map(|n| n.http.clone()).collect::<Vec<_>>()).await;
    let leader = c.leader().await;
    let (s, bot) = post(&c, leader, "/v1/bots", &c.token, json!({"name": "runner"})).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    let bot_token = c.mint(json!({"botId": bot})).await;
    let (s, run) =
        post(&c, leader, "/api/turn", &c.token, json!({"text": "x", "clientTurnId": "t-lb", "botId": bot})).await;
    assert_eq!(s, 201, "{run}");
    let run_id = run["runId"].as_str().expect("runId").to_string();
    let (s, claimed) =
        post(&c, leader, "/api/runs/claim", &bot_token, json!({"waitMs": 5000, "leaseMs": 60_000})).await;
    assert_eq!(s, 200, "{claimed}");
    let claim = claimed["claim"].as_str().expect("claim").to_string();
    let partial = |n: u32| json!({"claim": claim, "kind": "partial", "data": format!("p{n}")});
    let events = format!("/api/runs/{run_id}/events");
    for n in 0..2 {
        assert_eq!(post(&c, leader, &events, &bot_token, partial(n)).await.0, 201);
    }

    // Three streams opened one after the other through HAProxy's round robin: one per node.
    let url = lb.url(&events);
    let mut readers = Vec::new();
    for _ in 0..3 {
        let sse = Sse::open(&url, &c.token, None).await;
        readers.push(tokio::spawn(follow(sse, None, url.clone(), c.token.clone())));
    }
    // A follower dies (SIGKILL): the stream it served breaks and resumes on a live node.
    let victim = c.nodes.keys().copied().find(|id| *id != leader).expect("a follower");
    c.kill(victim);
    for n in 2..5 {
        assert_eq!(post(&c, leader, &events, &bot_token, partial(n)).await.0, 201);
    }
    let body = json!({"claim": claim, "outcome": "succeeded", "result": {"ok": true}});
    assert_eq!(post(&c, leader, &format!("/api/runs/{run_id}/finish"), &bot_token, body).await.0, 200);
    let mut reconnects = 0;
    for r in readers {
        let (seen, again) = r.await.expect("reader");
        let seen: Vec<u64> = seen.iter().map(|e| e.0).collect();
        assert_eq!(seen, (1..=8).collect::<Vec<u64>>(), "every event exactly once, in order");
        reconnects += again;
    }
    assert!(reconnects >= 1, "the stream on node {victim} broke and was resumed");
}
