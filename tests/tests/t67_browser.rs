//! The browser of a real desktop sandbox (Chromium from the desktop image, driven by the agent
//! over a CDP pipe) through the API, on the test site served inside the sandbox
//! (`tests/fixtures/browser_site.py`): a bot signs in by refs; a ref after navigation is
//! `StaleRef` and leaves its action record `prepared`; `report.pdf` is set on the documents
//! page's file input (name and size read back, SHA-256 reported); a submit whose answer is lost
//! leaves its action `unknown`, and a retry with the same `actionId` answers the record and
//! makes no second upload (the site counts its uploads); a member decides the unknown action;
//! in takeover mode a person holding the desktop's input lease blocks the bot's click
//! (`InputBusy`); no cookie is readable by a session as `user`.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use computerd_tests::TestCluster;
use computerd_tests::agent::wait_state;
use computerd_tests::browser::desktop_computer;
use computerd_tests::browser::find;
use computerd_tests::browser::start_site;
use computerd_tests::rfb::Viewer;
use computerd_tests::wait::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

const REPORT: &str = "%PDF-1.4\n% quarterly report for project B\n";

struct Api<'a> {
    c: &'a TestCluster,
    id: String,
}

impl Api<'_> {
    async fn post(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        self.c.call(Method::POST, 1, &format!("/v1/computers/{}/{path}", self.id), token, Some(body)).await
    }
    async fn tool(&self, token: &str, tool: &str, body: Value) -> Value {
        let (s, v) = self.post(token, &format!("browser/{tool}"), body.clone()).await;
        assert_eq!(s, 200, "{tool} {body}: {v}");
        v
    }
    async fn file(&self, path: &str) -> Option<String> {
        let (s, v) = self
            .c
            .call(Method::GET, 1, &format!("/v1/computers/{}/files?path={path}", self.id), &self.c.token, None)
            .await;
        (s == 200).then(|| v["content"].as_str().unwrap_or_default().to_string())
    }
    async fn put_file(&self, path: &str, content: &str) {
        let (s, v) = self
            .c
            .call(
                Method::PUT,
                1,
                &format!("/v1/computers/{}/files?path={path}", self.id),
                &self.c.token,
                Some(json!({"content": content})),
            )
            .await;
        assert_eq!(s, 200, "{path}: {v}");
    }
    /// The site's upload count for project b.
    async fn uploads(&self) -> u64 {
        let state: Value =
            serde_json::from_str(&self.file("site/state.json").await.unwrap_or_default()).unwrap_or(Value::Null);
        state["uploads"]["b"].as_u64().unwrap_or(0)
    }
}

#[tokio::test]
async fn t10_a_bot_uploads_a_report_through_the_browser() {
    let c = TestCluster::start(1).await;
    let (id, _cleanup) = desktop_computer(&c, "web").await;
    let api = Api { c: &c, id: id.clone() };

    // The site, inside the sandbox.
    api.put_file("report.pdf", REPORT).await;
    let site = start_site(&c, &id).await;

    // A bot with a grant drives the browser.
    let bot = c.create_bot(1, "web-bot").await.expect("bot").1["id"].as_str().expect("bot id").to_string();
    let (s, v) = c.call(Method::PUT, 1, &format!("/v1/computers/{id}/bots/{bot}"), &c.token, Some(json!({}))).await;
    assert!(s == 200 || s == 201, "{v}");
    let bot_token = c.mint(json!({"name": "web-bot", "botId": bot})).await;
    let b = bot_token.as_str();
    let opened = api.tool(b, "sessions", json!({"profile": "site-a", "url": format!("{site}/login")})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    assert_eq!(opened["tabs"][0]["title"], "Sign in", "{opened}");
    let snap = api.tool(b, "snapshot", json!({"session": sid, "format": "json"})).await;
    // Issue 38, item 2: in automation mode too, a click on a text field lands on it.
    let clicked = api.tool(b, "click", json!({"session": sid, "ref": find(&snap, "textbox", "Username")})).await;
    assert_eq!(clicked["outcome"]["state"], "done", "{clicked}");
    let snap = api.tool(b, "snapshot", json!({"session": sid, "format": "json"})).await;
    api.tool(b, "type", json!({"session": sid, "ref": find(&snap, "textbox", "Username"), "text": "alice"})).await;
    api.tool(
        b,
        "type",
        json!({"session": sid, "ref": find(&snap, "textbox", "Password"), "text": "wonderland", "actionId": "pw-1"}),
    )
    .await;
    let sign_in = find(&snap, "button", "Sign in");
    let clicked = api
        .tool(b, "click", json!({"session": sid, "ref": sign_in, "actionId": "login-1", "intent": "sign in as alice"}))
        .await;
    assert_eq!(clicked["outcome"]["state"], "done", "{clicked}");
    assert_eq!(clicked["action"]["state"], "done", "{clicked}");

    // A ref after navigation is stale: refused before the page, its record left prepared.
    let (s, v) = api.post(b, "browser/click", json!({"session": sid, "ref": sign_in, "actionId": "stale-1"})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (409, Some("StaleRef")), "{v}");
    let (s, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/browser/actions/stale-1"), b, None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("prepared")), "{v}");
    // The same id again after sign-in answers the record: nothing is sent again.
    let again = api.tool(b, "click", json!({"session": sid, "ref": sign_in, "actionId": "login-1"})).await;
    assert_eq!((again["replayed"].as_bool(), again["action"]["state"].as_str()), (Some(true), Some("done")), "{again}");

    // Project B's documents: report.pdf on the form's file input.
    let nav = api.tool(b, "navigate", json!({"session": sid, "url": format!("{site}/projects/b/documents")})).await;
    assert_eq!((nav["status"].as_u64(), nav["title"].as_str()), (Some(200), Some("Project B documents")), "{nav}");
    let snap = api.tool(b, "snapshot", json!({"session": sid, "format": "json"})).await;
    let (s, v) = api
        .post(
            b,
            "browser/upload",
            json!({"session": sid, "ref": find(&snap, "button", "Choose file"), "paths": ["/etc/passwd"]}),
        )
        .await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
    let up = api
        .tool(b, "upload", json!({"session": sid, "ref": find(&snap, "button", "Choose file"), "paths": ["/workspace/report.pdf"], "actionId": "set-1"}))
        .await;
    assert_eq!(up["accepted"], true, "{up}");
    assert_eq!(up["readBack"], json!([{"name": "report.pdf", "size": REPORT.len()}]));
    let sha = up["files"][0]["sha256"].as_str().expect("sha").to_string();
    // Issue 37, item 4: the file is recorded as an artifact, named in the answer and the record.
    let artifact = up["files"][0]["artifact"].as_str().unwrap_or_default().to_string();
    assert!(artifact.starts_with("art_"), "an artifact for the uploaded file: {up}");
    assert_eq!(up["action"]["result"]["files"][0]["artifact"], artifact.as_str(), "{up}");
    let (s, rec) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/browser/actions/set-1"), b, None).await;
    assert_eq!((s, rec["result"]["files"][0]["artifact"].as_str()), (200, Some(artifact.as_str())), "{rec}");
    if let Ok(dir) = std::env::var("COMPUTERD_DOCS_SHOT") {
        let (s, v) = api.post(b, "browser/screenshot", json!({"session": sid})).await;
        assert_eq!(s, 200, "{v}");
        let png = STANDARD.decode(v["data"].as_str().unwrap_or_default()).expect("base64");
        std::fs::write(std::path::Path::new(&dir).join("browser-file-set.png"), png).expect("write the shot");
    }

    // The answer to the submit is lost: unknown; a retry sends nothing; the site counted one.
    api.put_file("site/control.json", r#"{"mode": "lose"}"#).await;
    let submit = json!({"session": sid, "ref": find(&snap, "button", "Upload"), "actionId": "upload-b-1", "intent": "upload report.pdf to project B", "evidence": {"fileSha": sha, "account": "alice", "projectId": "b"}});
    let clicked = api.tool(b, "click", submit.clone()).await;
    assert_eq!(clicked["outcome"]["state"], "unknown", "{clicked}");
    assert_eq!(clicked["action"]["state"], "unknown", "{clicked}");
    wait_for("the site to count the upload", Duration::from_secs(20), || async {
        (api.uploads().await == 1).then_some(())
    })
    .await;
    let again = api.tool(b, "click", submit).await;
    assert_eq!(
        (again["replayed"].as_bool(), again["action"]["state"].as_str()),
        (Some(true), Some("unknown")),
        "{again}"
    );
    assert_eq!(again["action"]["evidence"]["fileSha"], sha.as_str(), "an unknown record keeps its evidence");
    assert_eq!(api.uploads().await, 1, "no second upload");
    // A bot decides nothing; the member does.
    let (s, _) = api.post(b, "browser/actions/upload-b-1/decision", json!({"outcome": "done"})).await;
    assert_eq!(s, 403);
    let (s, v) =
        api.post(&c.token, "browser/actions/upload-b-1/decision", json!({"outcome": "done", "bot": bot})).await;
    assert_eq!((s, v["state"].as_str(), v["decidedBy"].is_string()), (200, Some("done"), true), "{v}");
    // A screenshot saved as the bot's blob, linked from the action as its evidence; the bytes
    // read back are a PNG whose digest is the one recorded.
    let (s, ev) = api.post(b, "browser/evidence", json!({"session": sid, "actionId": "upload-b-1"})).await;
    assert_eq!(s, 200, "{ev}");
    let shot = ev["blobId"].as_str().expect("blobId").to_string();
    assert_eq!(ev["action"]["evidenceBlobs"], json!([shot]), "{ev}");
    let r = reqwest::Client::new()
        .get(c.url(1, &format!("/api/blobs/{shot}")))
        .bearer_auth(b)
        .send()
        .await
        .expect("get the evidence");
    assert_eq!(r.status().as_u16(), 200);
    let bytes = r.bytes().await.expect("bytes");
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG");
    assert_eq!(hex::encode(sha2::Sha256::digest(&bytes)), ev["sha256"].as_str().unwrap_or_default());
    let (s, v) = api.post(b, "browser/evidence", json!({"session": sid, "actionId": "never-taken"})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (404, Some("not_found")), "{v}");

    // Issue 37, item 1: runtime A's lease lapses and B claims the run; A's click under its old
    // claim is refused `LeaseLost` and nothing reaches the page (the site counts no upload).
    let turn = json!({"text": "upload it again", "clientTurnId": "turn-lease", "botId": bot});
    let (s, run) = c.call(Method::POST, 1, "/api/turn", &c.token, Some(turn)).await;
    assert_eq!(s, 201, "{run}");
    let run_id = run["runId"].as_str().expect("runId").to_string();
    let (s, a) = c.call(Method::POST, 1, "/api/runs/claim", b, Some(json!({"leaseMs": 2000}))).await;
    assert_eq!(s, 200, "{a}");
    let claim_a = a["claim"].as_str().expect("claim").to_string();
    let run_path = format!("/api/runs/{run_id}");
    wait_for("A's lease to lapse and the run to be queued again", Duration::from_secs(20), || async {
        let (_, v) = c.call(Method::GET, 1, &run_path, &c.token, None).await;
        (v["state"] == "queued").then_some(())
    })
    .await;
    let (s, bee) = c.call(Method::POST, 1, "/api/runs/claim", b, Some(json!({"leaseMs": 60_000}))).await;
    assert_eq!((s, bee["run"]["runId"].as_str()), (200, Some(run_id.as_str())), "{bee}");
    let claim_b = bee["claim"].as_str().expect("claim").to_string();
    // The form holds the file again, so a click that reached the page would upload it.
    api.tool(b, "navigate", json!({"session": sid, "url": format!("{site}/projects/b/documents")})).await;
    let snap = api.tool(b, "snapshot", json!({"session": sid, "format": "json"})).await;
    let set = json!({"session": sid, "ref": find(&snap, "button", "Choose file"), "paths": ["/workspace/report.pdf"]});
    assert_eq!(api.tool(b, "upload", set).await["accepted"], true);
    let before = api.uploads().await;
    let late = json!({"session": sid, "ref": find(&snap, "button", "Upload"), "actionId": "upload-b-2", "runId": run_id, "runClaim": claim_a});
    let (s, v) = api.post(b, "browser/click", late).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (409, Some("LeaseLost")), "{v}");
    let (s, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/browser/actions/upload-b-2"), b, None).await;
    assert_eq!(s, 404, "nothing recorded under a lost lease: {v}");
    // A runId without its claim is refused as bad input; B's claim holds and may act.
    let (s, v) = api
        .post(
            b,
            "browser/click",
            json!({"session": sid, "ref": find(&snap, "button", "Upload"), "actionId": "no-claim", "runId": run_id}),
        )
        .await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
    let (s, v) = api
        .post(
            b,
            "browser/select",
            json!({"session": sid, "ref": find(&snap, "button", "Upload"), "values": ["x"], "actionId": "sel-b", "runId": run_id, "runClaim": claim_b}),
        )
        .await;
    assert_ne!(v["error"]["kind"].as_str(), Some("LeaseLost"), "B holds the lease: {s} {v}");
    assert_eq!(api.uploads().await, before, "A's click never reached the page");

    // Signed in, as the probes show it; no cookie comes back, and none is readable as `user`.
    let probes =
        json!({"signedInSelector": "#who", "account": "alice", "projectUrl": format!("{site}/projects/b/documents")});
    let st = api.tool(b, "session_status", json!({"session": sid, "origin": site, "probes": probes})).await;
    assert_eq!(
        (st["signedIn"].as_bool(), st["accountMatches"].as_bool(), st["projectAccessible"].as_bool()),
        (Some(true), Some(true), Some(true)),
        "{st}"
    );
    let (s, v) = api
        .post(
            &c.token,
            "sessions",
            json!({"command": "ls /var/lib/computerd-browser 2>&1; echo rc=$?", "yieldTimeMs": 5000}),
        )
        .await;
    assert_eq!(s, 200);
    let o = v["output"].as_str().unwrap_or_default();
    assert!(o.contains("Permission denied") && o.contains("rc=2"), "{o}");
    if let Ok(dir) = std::env::var("COMPUTERD_DOCS_SHOT") {
        let (s, v) = api.post(b, "browser/screenshot", json!({"session": sid})).await;
        assert_eq!(s, 200, "{v}");
        let png = STANDARD.decode(v["data"].as_str().unwrap_or_default()).expect("base64");
        std::fs::write(std::path::Path::new(&dir).join("browser-lost-answer.png"), png).expect("write the shot");
    }
    // A pause keeps the browser and its profile: still signed in after the resume.
    let (s, v) = c
        .call(Method::POST, 1, &format!("/v1/computers/{id}/pause"), &c.token, Some(json!({"commandKey": "p1"})))
        .await;
    assert_eq!(s, 202, "{v}");
    wait_state(&c, &id, "paused").await;
    let (s, v) = c
        .call(Method::POST, 1, &format!("/v1/computers/{id}/resume"), &c.token, Some(json!({"commandKey": "r1"})))
        .await;
    assert_eq!(s, 202, "{v}");
    wait_state(&c, &id, "running").await;
    let st = api.tool(b, "session_status", json!({"session": sid, "origin": site, "probes": probes})).await;
    assert_eq!(st["signedIn"].as_bool(), Some(true), "after a pause: {st}");
    // The typed password is not in the action records.
    let (_, rec) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/browser/actions/pw-1"), b, None).await;
    assert_eq!(rec["state"], "done", "{rec}");
    assert!(!rec.to_string().contains("wonderland"), "{rec}");
    let (s, _) = c.call(Method::DELETE, 1, &format!("/v1/computers/{id}/browser/sessions/{sid}"), b, None).await;
    assert_eq!(s, 200);

    // Takeover: headed on the desktop; a person in control blocks the bot's click.
    let opened = api
        .tool(b, "sessions", json!({"mode": "takeover", "profile": "site-a", "url": format!("{site}/widgets")}))
        .await;
    let sid = opened["session"].as_str().expect("session").to_string();
    let snap = api.tool(b, "snapshot", json!({"session": sid, "format": "json"})).await;
    let target = find(&snap, "button", "Target");
    let (s, v) = c
        .call(
            Method::POST,
            1,
            &format!("/v1/computers/{id}/desktop/stream"),
            &c.token,
            Some(json!({"mode": "control"})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let url = v["url"].as_str().expect("url").to_string();
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let r = http.get(&url).send().await.expect("redeem");
    let cookie = r
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.split(';').next())
        .and_then(|kv| kv.split_once('='))
        .map(|(_, v)| v.to_string())
        .expect("a cookie");
    let ws = c.url(1, &format!("/v1/computers/{id}/desktop/websockify")).replacen("http", "ws", 1);
    let person = Viewer::connect(&ws, &cookie).await.expect("the person connects");
    let (s, v) = api.post(b, "browser/click", json!({"session": sid, "ref": target})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (409, Some("InputBusy")), "{v}");
    person.close().await;
    let clicked = wait_for("the bot to act once the person left", Duration::from_secs(40), || async {
        let (s, v) = api.post(b, "browser/click", json!({"session": sid, "ref": target})).await;
        (s == 200).then_some(v)
    })
    .await;
    assert_eq!(clicked["outcome"]["state"], "done", "{clicked}");
    // Issue 38, item 2: a click on a plain text field (in its label, and alone with an
    // aria-label) lands on it: nothing covers it, whatever the hit test finds inside the field.
    let mut latest = snap;
    for (name, id) in [("Note", "note"), ("Search", "search")] {
        let field = find(&latest, "textbox", name);
        let (s, v) = api.post(b, "browser/click", json!({"session": sid, "ref": field})).await;
        assert_eq!(s, 200, "a click on the {name} field: {v}");
        let now = api.tool(b, "snapshot", json!({"session": sid, "format": "json"})).await;
        let text = now["text"].as_str().unwrap_or_default();
        let focused = text.lines().any(|l| l.contains(&format!("textbox \"{name}\"")) && l.contains("[focused]"));
        assert!(focused, "the {name} field has the focus:\n{text}");
        assert!(text.contains(&format!("text \"{id}\"")), "the page saw its focus event:\n{text}");
        latest = now;
    }
    if let Ok(dir) = std::env::var("COMPUTERD_DOCS_SHOT") {
        let shot = api.post(&c.token, "desktop/screenshot", json!({"format": "png"})).await.1;
        let png = STANDARD.decode(shot["data"].as_str().unwrap_or_default()).expect("base64");
        std::fs::write(std::path::Path::new(&dir).join("browser-takeover-desktop.png"), png).expect("write the shot");
    }
}
