//! Exactly once on the wire (issue 38, item 1), against real Chromium and a keep-alive site
//! (`tests/fixtures/wire_site.py`): a recorded click on a form's submit whose answer the site
//! loses (it counts the POST, then closes the connection) is counted once, its outcome is
//! `unknown`, and its answer lists the POST as `no answer`; loading another page afterwards
//! brings no second POST. A recorded click answered normally is counted once more, `done`, and
//! lists the POST with its status. With the wire guard, each request reached the site on a
//! connection of its own.
//!
//! `COMPUTERD_BROWSER_WIRE=off` (read by this test only) opens the browser without its wire
//! guard, to show what it prevents: Chromium sends the lost POST again by itself on a new
//! connection, and the test fails. Needs root, python3 and chromium (installed by `.ci/run`).

use computer_agent::browser::Browser;
use serde_json::Value;
use serde_json::json;

mod common;
use common::*;

impl Site {
    /// The site's state; it writes it before it answers (or drops) a request.
    fn state(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.state.join("state.json")).unwrap_or_default())
            .unwrap_or(Value::Null)
    }
    fn posts(&self) -> u64 {
        self.state()["posts"].as_u64().unwrap_or(u64::MAX)
    }
    /// The POSTs the site saw, with their connection and how-manieth request on it they were.
    fn post_log(&self) -> Vec<Value> {
        self.state()["requests"].as_array().into_iter().flatten().filter(|r| r["method"] == "POST").cloned().collect()
    }
}

/// Whether the answer lists `method url` with `field` = `value`.
fn listed(answer: &Value, method: &str, url: &str, field: &str, value: Value) -> bool {
    answer["requests"]
        .as_array()
        .is_some_and(|a| a.iter().any(|r| r["method"] == method && r["url"] == url && r[field] == value))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_never_sent_again() {
    assert!(nix::unistd::geteuid().is_root(), "this test runs Chromium as the desktop account: run it as root");
    let t = tempfile::tempdir().expect("tmp");
    std::fs::set_permissions(t.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let workspace = t.path().join("workspace");
    std::fs::create_dir_all(&workspace).expect("workspace");
    let s = site("wire_site.py", &t.path().join("site"));
    let account = computer_agent::desktop::xserver::desktop_account().expect("an account for the browser");
    let b = Browser::new(chromium(), account, t.path().join("browser"), workspace, None);
    let guarded = std::env::var("COMPUTERD_BROWSER_WIRE").map_or(true, |v| v != "off");
    if !guarded {
        eprintln!("COMPUTERD_BROWSER_WIRE=off: the browser runs WITHOUT its wire guard");
        b.set_wire_guard(false);
    }

    // The form, loaded over keep-alive connections with its subresources.
    let opened = call(&b, json!({"op": "open", "args": {"profile": "wire", "url": format!("{}/", s.url)}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    assert_eq!(opened["tabs"][0]["title"], "Form", "{opened}");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let send = find(&snap, "button", "Send");
    let submit = format!("{}/submit", s.url);

    // The answer lost: counted once, unknown, and listed as such.
    std::fs::write(s.state.join("control.json"), r#"{"lose": 1}"#).expect("control");
    let lost = call(&b, json!({"op": "click", "args": {"session": sid, "ref": send, "actionId": "wire-lost-1"}})).await;
    eprintln!("the click whose answer was lost answered: {lost}");
    eprintln!("the site's POSTs: {:?}", s.post_log());
    assert_eq!(s.posts(), 1, "the site counted the POST once: {lost}");
    assert_eq!(lost["outcome"]["state"], "unknown", "{lost}");
    assert!(listed(&lost, "POST", &submit, "result", json!("no answer")), "{lost}");
    assert_eq!(lost["requestsTruncated"], false, "{lost}");
    // Another page of the site, loaded: a re-sent POST would have come before it.
    let nav = call(&b, json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/other", s.url)}})).await;
    assert_eq!((nav["loaded"].as_bool(), nav["title"].as_str()), (Some(true), Some("Other")), "{nav}");
    assert_eq!(s.posts(), 1, "no POST was sent again; the site's POSTs: {:?}", s.post_log());

    // Answered: counted once more, done, the POST listed with its status.
    let nav = call(&b, json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/", s.url)}})).await;
    assert_eq!(nav["title"], "Form", "{nav}");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let send = find(&snap, "button", "Send");
    let sent = call(&b, json!({"op": "click", "args": {"session": sid, "ref": send, "actionId": "wire-sent-1"}})).await;
    eprintln!("the click answered normally answered: {sent}");
    assert_eq!(s.posts(), 2, "{sent}");
    assert_eq!(sent["outcome"]["state"], "done", "{sent}");
    assert_eq!(sent["outcome"]["status"], 200, "after the 303, /done: {sent}");
    assert!(listed(&sent, "POST", &submit, "status", json!(303)), "{sent}");
    assert!(listed(&sent, "GET", &format!("{}/done", s.url), "status", json!(200)), "{sent}");

    // Without an actionId nothing is listed.
    let plain = call(&b, json!({"op": "press", "args": {"session": sid, "keys": "Tab"}})).await;
    assert!(plain.get("requests").is_none(), "{plain}");

    // The per-request fault switches: a form, a script's fetch() and an upload, each once.
    if guarded {
        let doc = t.path().join("workspace").join("doc.pdf");
        std::fs::write(&doc, b"%PDF-1.4\n% a document uploaded over plain HTTP, kept alive\n").expect("doc");
        h1_faults_once(&b, &sid, &s.url, &s, &doc).await;
    }

    // Each request reached the site on a new connection: the proxy never reuses one.
    let all = s.state()["requests"].clone();
    assert!(all.as_array().is_some_and(|a| a.iter().all(|r| r["nth"] == 1)), "{all}");
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
}
