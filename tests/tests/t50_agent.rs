//! Paired machines with a real `computer-agent`: pairing, the link and its generations, command
//! sessions with real bash and PTYs, files, and a link cut mid-command.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use base64::Engine;
use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::Proxy;
use computerd_tests::agent::paired_computer;
use computerd_tests::agent::wait_state;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

fn kind(v: &Value) -> &str {
    v["error"]["kind"].as_str().unwrap_or("<none>")
}

async fn linked(c: &TestCluster, key: &str) -> (String, AgentProc) {
    let (id, code) = paired_computer(c, key).await;
    let state = c.dir.path().join(format!("agent-{key}"));
    let agent = AgentProc::spawn(&c.url(1, ""), &state, Some(&code), &c.dir.path().join(format!("agent-{key}.log")));
    wait_state(c, &id, "running").await;
    (id, agent)
}

async fn run(c: &TestCluster, id: &str, body: Value) -> (u16, Value) {
    c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(body)).await
}

async fn input(c: &TestCluster, id: &str, sid: &str, chars: &str, yield_ms: u32) -> Value {
    let body = json!({"chars": chars, "yieldTimeMs": yield_ms});
    let (s, v) =
        c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions/{sid}/input"), &c.token, Some(body)).await;
    assert_eq!(s, 200, "{v}");
    v
}

/// A wrong or used pairing code is refused with a clear message and exit code 3, storing
/// nothing; a good one stores a 0600 credential, the Computer runs while linked and is offline
/// when the agent is gone; the stored credential links again with a newer generation.
#[tokio::test]
async fn t10_pairing_and_link_state() {
    let c = TestCluster::start(1).await;
    let (id, code) = paired_computer(&c, "p1").await;
    let bad_state = c.dir.path().join("bad");
    let out = std::process::Command::new(computerd_tests::agent::agent_bin())
        .args(["--server", &c.url(1, ""), "--pair", "WRONG-CODE1", "--state"])
        .arg(&bad_state)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pairing code was refused"));
    assert!(!bad_state.join("credential.json").exists(), "nothing stored");

    let state = c.dir.path().join("agent");
    let mut agent = AgentProc::spawn(&c.url(1, ""), &state, Some(&code), &c.dir.path().join("agent.log"));
    let comp = wait_state(&c, &id, "running").await;
    let g1 = comp["linkGeneration"].as_u64().expect("generation");
    let mode = std::fs::metadata(state.join("credential.json")).expect("credential").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let again = std::process::Command::new(computerd_tests::agent::agent_bin())
        .args(["--server", &c.url(1, ""), "--pair", &code, "--state"])
        .arg(c.dir.path().join("again"))
        .output()
        .expect("run");
    assert_eq!(again.status.code(), Some(3), "a used code is refused");

    agent.kill();
    wait_state(&c, &id, "offline").await;
    let _agent = AgentProc::spawn(&c.url(1, ""), &state, None, &c.dir.path().join("agent.log"));
    let comp = wait_state(&c, &id, "running").await;
    assert!(comp["linkGeneration"].as_u64().expect("generation") > g1);
    let (s, v) =
        c.call(Method::POST, 1, &format!("/v1/computers/{id}/pause"), &c.token, Some(json!({"commandKey": "x"}))).await;
    assert_eq!((s, kind(&v)), (422, "ComputerUnsupported"), "own machines never pause");
}

/// Sessions with real bash: exit codes, env and cwd, yield bounds, a python3 REPL through a PTY
/// with Ctrl-C and Ctrl-D, 1 MiB of output as a truncated tail, multibyte characters never
/// split, and DELETE killing a child that ignores SIGHUP; a session belongs to its starter.
#[tokio::test]
async fn t20_sessions() {
    let c = TestCluster::start(1).await;
    let (id, _agent) = linked(&c, "s").await;

    let (s, v) = run(&c, &id, json!({"command": "echo $FOO; pwd; exit 7", "env": {"FOO": "bar"}, "cwd": "/tmp"})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["session"].clone(), v["exitCode"].clone(), v["running"].clone()),
        (Value::Null, json!(7), json!(false))
    );
    assert_eq!(v["output"], "bar\n/tmp\n");

    for y in [249, 30_001] {
        let (s, v) = run(&c, &id, json!({"command": "true", "yieldTimeMs": y})).await;
        assert_eq!((s, kind(&v)), (400, "invalid_request"), "yieldTimeMs {y}");
    }
    let started = std::time::Instant::now();
    let (_, v) = run(&c, &id, json!({"command": "sleep 2; echo late", "yieldTimeMs": 250})).await;
    assert!(started.elapsed() < Duration::from_millis(1500), "answered after the 0.25 s yield");
    assert_eq!(v["running"], true);
    let sid = v["session"].as_str().expect("session").to_string();
    let v = input(&c, &id, &sid, "", 30_000).await;
    assert_eq!((v["running"].clone(), v["output"].clone()), (json!(false), json!("late\n")));

    // python3 through a PTY.
    let (_, v) = run(&c, &id, json!({"command": "python3 -q", "tty": true, "yieldTimeMs": 2000})).await;
    let py = v["session"].as_str().expect("session").to_string();
    assert!(v["output"].as_str().is_some_and(|o| o.contains(">>> ")), "{v}");
    let v = input(&c, &id, &py, "6*7\\n", 1000).await;
    assert!(v["output"].as_str().is_some_and(|o| o.contains("42")), "{v}");
    let v = input(&c, &id, &py, "import time; time.sleep(60)\\n", 500).await;
    assert_eq!(v["running"], true);
    let v = input(&c, &id, &py, "\\x03", 1000).await;
    assert!(v["output"].as_str().is_some_and(|o| o.contains("KeyboardInterrupt")), "{v}");
    let (_, admin) =
        c.call(Method::POST, 1, "/v1/members", &c.token, Some(json!({"name": "ad", "role": "admin"}))).await;
    let other = c.mint(json!({"memberId": admin["id"]})).await;
    let (s, _) = c
        .call(Method::POST, 1, &format!("/v1/computers/{id}/sessions/{py}/input"), &other, Some(json!({"chars": ""})))
        .await;
    assert_eq!(s, 404, "a session belongs to its starter; an admin who sees the computer still gets 404");
    let v = input(&c, &id, &py, "\\x04", 2000).await;
    // Ctrl-D ends the REPL (CPython reports an earlier KeyboardInterrupt as SIGINT at exit).
    assert_eq!((v["running"].clone(), v["session"].clone()), (json!(false), Value::Null), "{v}");
    assert!(v["exitCode"] == 0 || v["signal"] == "SIGINT", "{v}");

    // 1 MiB of output: only the tail, truncated.
    let (_, v) = run(&c, &id, json!({"command": "head -c 1048576 /dev/zero | tr '\\0' a; echo END"})).await;
    let out = v["output"].as_str().expect("output");
    assert_eq!(v["truncated"], true);
    assert!(
        out.len() <= 65_536 && out.ends_with("aEND\n"),
        "{} bytes, ends {:?}",
        out.len(),
        &out[out.len().saturating_sub(20)..]
    );

    // Multibyte characters across a cut: never split, never replaced.
    let (_, v) =
        run(&c, &id, json!({"command": "for i in $(seq 3000); do printf '€'; done", "maxOutputBytes": 1001})).await;
    let out = v["output"].as_str().expect("output");
    assert!(out.len() <= 1001 && !out.is_empty() && out.chars().all(|ch| ch == '€'), "{out:?}");

    // DELETE kills the group, also a child that ignores SIGHUP.
    let (_, v) =
        run(&c, &id, json!({"command": "(trap '' HUP; exec sleep 1000) & echo $!; wait", "yieldTimeMs": 500})).await;
    let kid: i32 = v["output"].as_str().and_then(|o| o.trim().parse().ok()).expect("child pid");
    let sid = v["session"].as_str().expect("session").to_string();
    let (s, v) = c.call(Method::DELETE, 1, &format!("/v1/computers/{id}/sessions/{sid}"), &c.token, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["running"], false);
    wait_for("the child to be gone", Duration::from_secs(10), || async move {
        (!std::path::Path::new(&format!("/proc/{kid}")).exists()).then_some(())
    })
    .await;
}

/// Files: a 16 MiB binary round trip is byte-exact; `..`, a missing file, a directory read as a
/// file, non-UTF-8 read as `utf8` and an oversized body get the right errors.
#[tokio::test]
async fn t30_files() {
    let c = TestCluster::start(1).await;
    let (id, _agent) = linked(&c, "f").await;
    let dir = c.dir.path().join("files");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("blob.bin").to_string_lossy().into_owned();
    let data: Vec<u8> = (0..16 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
    let url = format!("/v1/computers/{id}/files?path={path}");
    let (s, v) = c.call(Method::PUT, 1, &url, &c.token, Some(json!({"content": b64, "encoding": "base64"}))).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["size"], 16 * 1024 * 1024);
    let (s, v) = c.call(Method::GET, 1, &format!("{url}&encoding=base64"), &c.token, None).await;
    assert_eq!(s, 200);
    let back = base64::engine::general_purpose::STANDARD.decode(v["content"].as_str().expect("content")).expect("b64");
    assert!(back == data, "16 MiB round trip is byte-exact");
    let (s, v) = c.call(Method::GET, 1, &url, &c.token, None).await;
    assert_eq!((s, kind(&v)), (400, "invalid_request"), "binary is not utf8");

    let (s, v) =
        c.call(Method::GET, 1, &format!("/v1/computers/{id}/files?path={}/../x", dir.display()), &c.token, None).await;
    assert_eq!((s, kind(&v)), (400, "invalid_request"));
    let (s, v) =
        c.call(Method::GET, 1, &format!("/v1/computers/{id}/files?path={}/nope", dir.display()), &c.token, None).await;
    assert_eq!((s, kind(&v)), (404, "not_found"));
    let (s, v) =
        c.call(Method::GET, 1, &format!("/v1/computers/{id}/files?path={}", dir.display()), &c.token, None).await;
    assert_eq!((s, kind(&v)), (400, "invalid_request"));
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("directory")));
    let big = base64::engine::general_purpose::STANDARD.encode(vec![1u8; 16 * 1024 * 1024 + 1]);
    let (s, _) = c
        .call(Method::PUT, 1, &format!("{url}.big"), &c.token, Some(json!({"content": big, "encoding": "base64"})))
        .await;
    assert_eq!(s, 413);
    assert!(!std::path::Path::new(&format!("{path}.big")).exists(), "nothing written");

    let (s, v) =
        c.call(Method::GET, 1, &format!("/v1/computers/{id}/directory?path={}", dir.display()), &c.token, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["entries"],
        json!([{"name": "blob.bin", "type": "file", "size": 16 * 1024 * 1024, "mode": v["entries"][0]["mode"], "mtime": v["entries"][0]["mtime"]}])
    );
    let (s, _) = c.call(Method::DELETE, 1, &url, &c.token, None).await;
    assert_eq!(s, 204);
    assert!(!std::path::Path::new(&path).exists());
}

/// Raw bodies: a 16 MiB binary written as `application/octet-stream` and read back with
/// `Accept: application/octet-stream` is byte-exact; a raw body one byte over 16 MiB is 413 and
/// leaves the old file as it was; a missing file read raw is still a JSON 404.
#[tokio::test]
async fn t35_raw_files() {
    let c = TestCluster::start(1).await;
    let (id, _agent) = linked(&c, "r").await;
    let path = c.dir.path().join("raw.bin").to_string_lossy().into_owned();
    let url = c.url(1, &format!("/v1/computers/{id}/files?path={path}"));
    let data: Vec<u8> = (0..16 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2_246_822_519) >> 11) as u8).collect();
    let put = |body: Vec<u8>| {
        c.http.put(&url).bearer_auth(&c.token).header("content-type", "application/octet-stream").body(body).send()
    };
    let r = put(data.clone()).await.expect("put");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["size"], 16 * 1024 * 1024);
    let r = c.http.get(&url).bearer_auth(&c.token).header("accept", "application/octet-stream").send().await;
    let r = r.expect("get");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/octet-stream");
    assert!(r.bytes().await.expect("body") == data, "raw round trip is byte-exact");
    let r = c.http.get(format!("{url}&encoding=raw")).bearer_auth(&c.token).send().await.expect("get");
    assert_eq!(r.bytes().await.expect("body").len(), data.len());

    let r = put(vec![7u8; 16 * 1024 * 1024 + 1]).await.expect("put");
    assert_eq!(r.status(), 413);
    assert!(std::fs::read(&path).expect("read") == data, "the old file is untouched");
    wait_for("the agent to discard its temporary file", Duration::from_secs(10), || async {
        let leftovers = std::fs::read_dir(c.dir.path())
            .expect("dir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".raw.bin.computer-agent-"))
            .count();
        (leftovers == 0).then_some(())
    })
    .await;

    let r = c
        .http
        .get(format!("{url}.missing"))
        .bearer_auth(&c.token)
        .header("accept", "application/octet-stream")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 404);
}

/// The 30 s edge of `yieldTimeMs`: a command still running after 30 s is answered `running`
/// at the 30 s mark, not before and not much after.
/// Sessions an E2B user can live with: listed, and read (running or ended) by a look that never
/// moves the offset the input calls answer from.
#[tokio::test]
async fn t36_sessions_are_listed_and_read_after_they_end() {
    let c = TestCluster::start(1).await;
    let (id, _agent) = linked(&c, "look").await;
    let get = |path: String| {
        let c = &c;
        async move { c.call(Method::GET, 1, &path, &c.token, None).await }
    };
    let (s, v) = run(&c, &id, json!({"command": "printf 'one\\n'; sleep 0.2; printf 'two\\n'"})).await;
    assert_eq!((s, &v["running"], &v["session"]), (200, &json!(false), &Value::Null), "{v}");
    let ended = v["sessionId"].as_str().expect("sessionId").to_string();
    let (s, v) = run(&c, &id, json!({"command": "sleep 0.5; echo late; sleep 30", "yieldTimeMs": 250})).await;
    assert_eq!((s, &v["running"], &v["output"]), (200, &json!(true), &json!("")), "{v}");
    let running = v["session"].as_str().expect("session").to_string();

    // Listed: the running one first, then the ended one, each with its command and state.
    let (s, v) = get(format!("/v1/computers/{id}/sessions")).await;
    assert_eq!(s, 200, "{v}");
    let listed: Vec<(&str, bool)> = v["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| (s["session"].as_str().unwrap_or(""), s["running"] == true))
        .collect();
    assert_eq!(listed, [(running.as_str(), true), (ended.as_str(), false)], "{v}");
    let done = &v["sessions"][1];
    assert_eq!((&done["exitCode"], &done["offset"], &done["tty"]), (&json!(0), &json!(8), &json!(false)), "{v}");
    assert!(done["command"].as_str().is_some_and(|c| c.starts_with("printf 'one")), "{v}");

    // The ended one reads whole, or from an offset.
    let (s, v) = get(format!("/v1/computers/{id}/sessions/{ended}")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (&v["output"], &v["running"], &v["exitCode"], &v["offset"]),
        (&json!("one\ntwo\n"), &json!(false), &json!(0), &json!(8))
    );
    let (_, v) = get(format!("/v1/computers/{id}/sessions/{ended}?fromOffset=4")).await;
    assert_eq!(v["output"], "two\n", "{v}");

    // A look waits for output, and leaves the polling offset where it was: the next input call
    // answers the same output.
    let (s, v) = get(format!("/v1/computers/{id}/sessions/{running}?yieldTimeMs=5000")).await;
    assert_eq!((s, &v["output"], &v["running"]), (200, &json!("late\n"), &json!(true)), "{v}");
    let v = input(&c, &id, &running, "", 250).await;
    assert_eq!(v["output"], "late\n", "the look moved nothing: {v}");

    // Bad input and unknown sessions: the JSON error body.
    let (s, v) = get(format!("/v1/computers/{id}/sessions/{running}?yieldTimeMs=30001")).await;
    assert_eq!((s, kind(&v)), (400, "invalid_request"), "{v}");
    let (s, v) = get(format!("/v1/computers/{id}/sessions/{running}?since=3")).await;
    assert_eq!((s, kind(&v)), (400, "invalid_request"), "{v}");
    let (s, v) = get(format!("/v1/computers/{id}/sessions/cse_nobody")).await;
    assert_eq!((s, kind(&v)), (404, "not_found"), "{v}");

    // Killed, it is listed as ended by its signal.
    let (s, _) = c.call(Method::DELETE, 1, &format!("/v1/computers/{id}/sessions/{running}"), &c.token, None).await;
    assert_eq!(s, 200);
    let (_, v) = get(format!("/v1/computers/{id}/sessions")).await;
    let killed = v["sessions"].as_array().expect("sessions").iter().find(|s| s["session"] == running.as_str()).cloned();
    assert_eq!(
        killed.map(|k| (k["running"].clone(), k["signal"].clone())),
        Some((json!(false), json!("SIGKILL"))),
        "{v}"
    );

    // The output as server-sent events: as it comes, then its end; resumed from an id (an
    // offset), it goes on from there.
    let body = json!({"command": "for i in 1 2 3; do echo $i; sleep 0.3; done; exit 4", "yieldTimeMs": 250});
    let (_, v) = run(&c, &id, body).await;
    let sid = v["sessionId"].as_str().expect("sessionId").to_string();
    let polled = v["output"].as_str().expect("output").to_string();
    let url = c.url(1, &format!("/v1/computers/{id}/sessions/{sid}/output"));
    let mut sse = computerd_tests::sse::Sse::open(&url, &c.token, None).await;
    let (mut text, mut ids, mut end) = (String::new(), Vec::new(), None);
    while let Some((offset, kind, data)) = sse.next().await {
        ids.push(offset);
        match kind.as_str() {
            "output" => text.push_str(data["output"].as_str().expect("output")),
            "end" => end = Some(data),
            other => panic!("an event {other}"),
        }
    }
    assert_eq!(text, "1\n2\n3\n");
    assert_eq!(end.map(|e| e["exitCode"].clone()), Some(json!(4)));
    assert!(ids.windows(2).all(|w| w[0] <= w[1]) && ids.last() == Some(&6), "{ids:?}");
    let mut resumed = computerd_tests::sse::Sse::open(&url, &c.token, Some(2)).await;
    let first = resumed.next().await.expect("an event");
    assert_eq!((first.1.as_str(), first.2["output"].as_str()), ("output", Some("2\n3\n")), "{first:?}");
    // The polling calls go on from where they were: together they answer the output once.
    let v = input(&c, &id, &sid, "", 250).await;
    assert_eq!(format!("{polled}{}", v["output"].as_str().unwrap_or("")), "1\n2\n3\n", "the stream moved nothing: {v}");
}

/// Issue 37, item 10: an output stream stops at once when its token is revoked. The session is
/// quiet when the token goes, and prints again 3 s later: that output never reaches the stream
/// (a look used to wait out the whole 25 s window and send what came, unchecked).
#[tokio::test]
async fn i37_10_an_output_stream_stops_at_once_on_a_revocation() {
    let c = TestCluster::start(1).await;
    let (id, _agent) = linked(&c, "revoke").await;
    let (s, v) = c.call(Method::POST, 1, "/v1/tokens", &c.token, Some(json!({"name": "watcher"}))).await;
    assert_eq!(s, 201, "{v}");
    let (tid, secret) = (v["token"]["id"].as_str().expect("id"), v["secret"].as_str().expect("secret"));
    let body = json!({"command": "echo before; sleep 3; echo after; sleep 30", "yieldTimeMs": 250});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), secret, Some(body)).await;
    assert_eq!((s, &v["running"]), (200, &json!(true)), "{v}");
    let sid = v["session"].as_str().expect("session").to_string();
    let url = c.url(1, &format!("/v1/computers/{id}/sessions/{sid}/output"));
    let mut sse = computerd_tests::sse::Sse::open(&url, secret, None).await;
    let first = sse.next().await.expect("the first output");
    assert_eq!(first.2["output"], "before\n", "{first:?}");
    let (s, v) = c.call(Method::DELETE, 1, &format!("/v1/tokens/{tid}"), &c.token, None).await;
    assert_eq!(s, 200, "{v}");
    let mut after = Vec::new();
    while let Some(ev) = sse.next().await {
        after.push(ev);
    }
    assert!(after.is_empty(), "nothing after the revocation: {after:?}");
    // The session itself goes on: the owner still reads it.
    let v = input(&c, &id, &sid, "", 5_000).await;
    assert!(v["output"].as_str().is_some_and(|o| o.contains("after")), "{v}");
}

#[tokio::test]
async fn t32_yield_30s_edge() {
    let c = TestCluster::start(1).await;
    let (id, _agent) = linked(&c, "y").await;
    let started = std::time::Instant::now();
    let resp = c
        .req(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token)
        .timeout(Duration::from_secs(60))
        .json(&json!({"command": "sleep 40", "yieldTimeMs": 30_000}))
        .send()
        .await
        .expect("send");
    let took = started.elapsed();
    let s = resp.status().as_u16();
    let v: Value = resp.json().await.expect("json");
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["running"], true);
    assert!(took >= Duration::from_secs(30) && took < Duration::from_secs(33), "answered after {took:?}");
    let sid = v["session"].as_str().expect("session");
    let (s, _) = c.call(Method::DELETE, 1, &format!("/v1/computers/{id}/sessions/{sid}"), &c.token, None).await;
    assert_eq!(s, 200);
}

/// A session no call used for the idle limit (2 s here; 30 minutes by default) is ended and its
/// process killed; a session used meanwhile stays, until it too is left alone.
#[tokio::test]
async fn t34_idle_sessions_end() {
    let c = TestCluster::start(1).await;
    let (id, code) = paired_computer(&c, "idle").await;
    let state = c.dir.path().join("agent-idle");
    let log = c.dir.path().join("agent-idle.log");
    let _agent = AgentProc::spawn_with(&c.url(1, ""), &state, Some(&code), &log, &["--session-idle-secs", "2"]);
    wait_state(&c, &id, "running").await;
    let mut sids = Vec::new();
    let mut pids = Vec::new();
    for _ in 0..2 {
        let (s, v) = run(&c, &id, json!({"command": "echo $$; exec sleep 1000", "yieldTimeMs": 250})).await;
        assert_eq!((s, v["running"].clone()), (200, json!(true)), "{v}");
        sids.push(v["session"].as_str().expect("session").to_string());
        let sid = sids.last().expect("session").clone();
        // The pid is the command's own line; this machine's login scripts may print before it,
        // and a loaded machine may take longer than the first yield to start bash.
        let mut output = v["output"].as_str().unwrap_or_default().to_string();
        let pid = |o: &str| o.lines().filter_map(|l| l.trim().parse::<u32>().ok()).next_back();
        for _ in 0..40 {
            if pid(&output).is_some() {
                break;
            }
            let url = format!("/v1/computers/{id}/sessions/{sid}/input");
            let (_, more) =
                c.call(Method::POST, 1, &url, &c.token, Some(json!({"chars": "", "yieldTimeMs": 250}))).await;
            output.push_str(more["output"].as_str().unwrap_or_default());
        }
        pids.push(pid(&output).unwrap_or_else(|| panic!("a pid in {output:?}")));
    }
    let gone = |sid: &str| {
        let url = format!("/v1/computers/{id}/sessions/{sid}/input");
        let c = &c;
        async move { c.call(Method::POST, 1, &url, &c.token, Some(json!({"chars": "", "yieldTimeMs": 250}))).await.0 }
    };
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    // Keep the second one in use until the first one's process is gone.
    wait_for("the unused session to end", Duration::from_secs(20), || async {
        assert_eq!(gone(&sids[1]).await, 200, "the session in use stays");
        (!alive(pids[0])).then_some(())
    })
    .await;
    assert_eq!(gone(&sids[0]).await, 404, "the ended session is gone");
    assert!(alive(pids[1]));
    wait_for("the second session to end once unused", Duration::from_secs(20), || async {
        (!alive(pids[1])).then_some(())
    })
    .await;
    assert_eq!(gone(&sids[1]).await, 404);
}

/// The link is cut (a proxy drops the connection) while a command prints: the command keeps
/// running in the agent, the agent reconnects, and the output read afterwards is complete and
/// in order.
#[tokio::test]
async fn t40_link_cut_mid_command() {
    let c = TestCluster::start(1).await;
    let proxy = Proxy::start(c.nodes[&1].http.clone()).await;
    let (id, code) = paired_computer(&c, "cut").await;
    let _agent = AgentProc::spawn(
        &format!("http://{}", proxy.addr),
        &c.dir.path().join("agent"),
        Some(&code),
        &c.dir.path().join("agent.log"),
    );
    let g1 = wait_state(&c, &id, "running").await["linkGeneration"].as_u64().expect("generation");
    // Half of its lines, then it waits for `go` (made by the test once the link is back), then
    // the other half: it is running, for sure, across the cut.
    let go = c.dir.path().join("go");
    let command = format!(
        "for i in $(seq 1 20); do echo line$i; done; while [ ! -e {} ]; do sleep 0.05; done; for i in $(seq 21 40); do echo line$i; done",
        go.display()
    );
    let (_, v) = run(&c, &id, json!({"command": command, "yieldTimeMs": 250})).await;
    assert_eq!(v["running"], true, "running when the link is cut: {v}");
    let sid = v["session"].as_str().expect("session").to_string();
    let mut out = v["output"].as_str().unwrap_or_default().to_string();
    proxy.cut();
    wait_for("the agent to link again", Duration::from_secs(30), || async {
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        (v["state"] == "running" && v["linkGeneration"].as_u64() > Some(g1)).then_some(())
    })
    .await;
    let v = input(&c, &id, &sid, "", 250).await;
    assert_eq!(v["running"], true, "the command outlived the cut: {v}");
    out.push_str(v["output"].as_str().unwrap_or_default());
    std::fs::write(&go, b"").expect("go");
    loop {
        let v = input(&c, &id, &sid, "", 2000).await;
        out.push_str(v["output"].as_str().unwrap_or_default());
        if v["running"] == false {
            assert_eq!(v["exitCode"], 0);
            break;
        }
    }
    let want: String = (1..=40).map(|i| format!("line{i}\n")).collect();
    assert_eq!(out, want);
}

/// A second connection with the same credential replaces the first: calls go to the new one,
/// and the old link's end (its generation) never marks the Computer offline.
#[tokio::test]
async fn t50_a_second_connection_replaces_the_first() {
    let c = TestCluster::start(1).await;
    let (id, mut first) = linked(&c, "two").await;
    let g1 = wait_state(&c, &id, "running").await["linkGeneration"].as_u64().expect("generation");
    let second = AgentProc::spawn(&c.url(1, ""), &first.state.clone(), None, &c.dir.path().join("agent-2.log"));
    wait_for("the second link", Duration::from_secs(30), || async {
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        (v["linkGeneration"].as_u64() > Some(g1)).then_some(())
    })
    .await;
    first.kill();
    let (_, v) = run(&c, &id, json!({"command": "echo $PPID"})).await;
    let parent: u32 = v["output"].as_str().and_then(|o| o.trim().parse().ok()).expect("ppid");
    assert_eq!(parent, second.child.id(), "calls reach the newest link");
    // Give the first link's teardown every chance to (wrongly) mark the Computer offline.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(v["state"], "running");
}

/// On 3 nodes, session and file calls that reach nodes without the link are routed to the node
/// that holds it, and a session started through one node continues through another.
#[tokio::test]
async fn t60_calls_are_routed_to_the_link_owner() {
    let c = TestCluster::start(3).await;
    let (id, _agent) = linked(&c, "routed").await;
    for via in [2, 3] {
        let (s, v) = c
            .call(
                Method::POST,
                via,
                &format!("/v1/computers/{id}/sessions"),
                &c.token,
                Some(json!({"command": "echo routed"})),
            )
            .await;
        assert_eq!((s, v["output"].clone()), (200, json!("routed\n")), "via node {via}: {v}");
    }
    let (_, v) = c
        .call(
            Method::POST,
            2,
            &format!("/v1/computers/{id}/sessions"),
            &c.token,
            Some(json!({"command": "cat", "yieldTimeMs": 250})),
        )
        .await;
    let sid = v["session"].as_str().expect("session").to_string();
    let (s, v) = c
        .call(
            Method::POST,
            3,
            &format!("/v1/computers/{id}/sessions/{sid}/input"),
            &c.token,
            Some(json!({"chars": "hop\\n", "yieldTimeMs": 500})),
        )
        .await;
    assert_eq!((s, v["output"].clone()), (200, json!("hop\n")), "{v}");
    let path = c.dir.path().join("routed.txt").to_string_lossy().into_owned();
    let (s, _) = c
        .call(Method::PUT, 3, &format!("/v1/computers/{id}/files?path={path}"), &c.token, Some(json!({"content": "x"})))
        .await;
    assert_eq!(s, 200);
    assert_eq!(std::fs::read_to_string(&path).expect("file"), "x");
}

/// A command that ends after its wait, while nobody waits on it, emits one `computer_session`
/// event with its exit; its output is still there for the next call.
#[tokio::test]
async fn t70_computer_session_event() {
    let c = TestCluster::start(1).await;
    let (id, _agent) = linked(&c, "ev").await;
    let (_, v) = run(&c, &id, json!({"command": "sleep 1; echo bye; exit 4", "yieldTimeMs": 250})).await;
    assert_eq!(v["running"], true);
    let sid = v["session"].as_str().expect("session").to_string();
    let ev = wait_for("a computer_session event", Duration::from_secs(20), || {
        let sid = sid.clone();
        let c = &c;
        async move {
            let (_, v) = c.call(Method::GET, 1, "/v1/events?after=0", &c.token, None).await;
            v["events"]
                .as_array()?
                .iter()
                .find(|e| e["type"] == "computer_session" && e["data"]["sessionId"] == sid.as_str())
                .cloned()
        }
    })
    .await;
    assert_eq!((ev["computerId"].as_str(), ev["data"]["exitCode"].clone()), (Some(id.as_str()), json!(4)));
    let v = input(&c, &id, &sid, "", 1000).await;
    assert_eq!(
        (v["running"].clone(), v["exitCode"].clone(), v["output"].clone()),
        (json!(false), json!(4), json!("bye\n"))
    );
    let (_, all) = c.call(Method::GET, 1, "/v1/events?after=0", &c.token, None).await;
    let n = all["events"].as_array().expect("events").iter().filter(|e| e["type"] == "computer_session").count();
    assert_eq!(n, 1, "one event per session");
}

/// A resize reaches a PTY session as SIGWINCH with the new size.
#[tokio::test]
async fn t80_resize_sends_sigwinch() {
    let c = TestCluster::start(1).await;
    let (id, _agent) = linked(&c, "rs").await;
    let cmd = "trap 'echo size $(stty size)' WINCH; echo ready; while true; do sleep 0.05; done";
    let (_, v) = run(&c, &id, json!({"command": cmd, "tty": true, "rows": 24, "cols": 80, "yieldTimeMs": 500})).await;
    assert!(v["output"].as_str().is_some_and(|o| o.contains("ready")), "{v}");
    let sid = v["session"].as_str().expect("session").to_string();
    let (s, _) = c
        .call(
            Method::POST,
            1,
            &format!("/v1/computers/{id}/sessions/{sid}/resize"),
            &c.token,
            Some(json!({"rows": 40, "cols": 120})),
        )
        .await;
    assert_eq!(s, 204);
    let v = input(&c, &id, &sid, "", 1000).await;
    assert!(v["output"].as_str().is_some_and(|o| o.contains("size 40 120")), "{v}");
    let (s, _) = c.call(Method::DELETE, 1, &format!("/v1/computers/{id}/sessions/{sid}"), &c.token, None).await;
    assert_eq!(s, 200);
}

/// An idle link holds no HTTP/2 connection: a call opens one on the link, the link lets it go
/// after its linger time (0.3 s here) once the calls on it are done, reports of the agent still
/// arrive without one, and the next call opens a new one on the same link (no new generation).
#[tokio::test]
async fn t90_an_idle_link_lets_its_connection_go() {
    let c = TestCluster::start_with(1, &["--link-linger-secs", "0.3"]).await;
    let (id, _agent) = linked(&c, "idle").await;
    let g = wait_state(&c, &id, "running").await["linkGeneration"].as_u64().expect("generation");
    let links = || async {
        let (_, v) = c.call(Method::GET, 1, "/v1/health", &c.token, None).await;
        v["agentLinks"].clone()
    };
    let connected = |want: u64| async move {
        wait_for(&format!("{want} links with a connection"), Duration::from_secs(20), || async {
            let l = links().await;
            (l["linked"] == 1 && l["connected"] == want).then_some(())
        })
        .await
    };
    // A call under way holds its connection past the linger time.
    let long = run(&c, &id, json!({"command": "sleep 3; echo done", "yieldTimeMs": 10000}));
    let (long, ()) = tokio::join!(long, connected(1));
    assert_eq!(long.1["output"], "done\n", "{}", long.1);
    connected(0).await;

    // A command that ends after its wait is reported over the idle link.
    let (_, v) = run(&c, &id, json!({"command": "sleep 1; exit 4", "yieldTimeMs": 250})).await;
    let sid = v["session"].as_str().expect("session").to_string();
    connected(0).await;
    wait_for("a computer_session event", Duration::from_secs(20), || async {
        let (_, v) = c.call(Method::GET, 1, "/v1/events?after=0", &c.token, None).await;
        v["events"]
            .as_array()?
            .iter()
            .find(|e| e["type"] == "computer_session" && e["data"]["sessionId"] == sid.as_str())
            .map(|_| ())
    })
    .await;

    let (s, v) = run(&c, &id, json!({"command": "echo again"})).await;
    assert_eq!((s, v["output"].clone()), (200, json!("again\n")), "{v}");
    let (_, comp) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(comp["linkGeneration"].as_u64(), Some(g), "the same link all along");
}
