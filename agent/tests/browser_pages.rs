//! Navigation outcomes and dialogs against real Chromium (through the session's wire guard) and
//! a small local site (`tests/fixtures/web/pages.py`): a redirect chain answers its final URL
//! and status; a 404 and a 500 are loads with their status; a page that never answers past
//! `timeoutMs` is `timedOut`; a name that does not resolve and a refused port fail
//! `NavigationFailed`, naming the net error and the host. Needs root, python3 and chromium.

use std::time::Duration;
use std::time::Instant;

use computerd_proto::ErrorKind;
use serde_json::json;

mod common;
use common::*;

/// A port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn navigation_outcomes_are_explicit() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let s = site("web/pages.py", &t.path().join("site"));
    let opened = call(&b, json!({"op": "open", "args": {"profile": "pages"}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    let go = |url: String, timeout: Option<u64>| {
        let mut args = json!({"session": sid, "url": url});
        if let Some(t) = timeout {
            args["timeoutMs"] = json!(t);
        }
        json!({"op": "navigate", "args": args})
    };

    // A redirect chain (302, then 301): the final URL and its status.
    let got = call(&b, go(format!("{}/redirect", s.url), None)).await;
    assert_eq!(got["url"], format!("{}/final", s.url), "{got}");
    assert_eq!((got["status"].as_u64(), &got["loaded"], &got["redirected"]), (Some(200), &json!(true), &json!(true)));
    assert_eq!(got["title"], "Final", "{got}");
    assert_eq!(got["timedOut"], false, "{got}");
    let got = call(&b, go(format!("{}/final", s.url), None)).await;
    assert_eq!(got["redirected"], false, "no redirect: {got}");

    // The site's 4xx and 5xx are its answers: loaded, with their status.
    for (path, status, title) in [("/missing", 404, "Not here"), ("/broken", 500, "Broken")] {
        let got = call(&b, go(format!("{}{path}", s.url), None)).await;
        assert_eq!((got["loaded"].clone(), got["status"].as_u64()), (json!(true), Some(status)), "{path}: {got}");
        assert_eq!(got["title"], title, "{path}: {got}");
        assert!(got.get("error").is_none(), "{path}: {got}");
    }

    // A page that never answers: timed out at about timeoutMs, not an error.
    let began = Instant::now();
    let got = call(&b, go(format!("{}/hang", s.url), Some(1000))).await;
    let took = began.elapsed();
    assert_eq!((got["loaded"].clone(), got["timedOut"].clone()), (json!(false), json!(true)), "{got}");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "took {took:?}: {got}");

    // No server answered: NavigationFailed, naming the net error and the host.
    let (kind, why) = refused(&b, go("http://nonexistent.invalid/".into(), None)).await;
    assert_eq!(kind, ErrorKind::NavigationFailed, "{why}");
    assert!(why.contains("ERR_NAME_NOT_RESOLVED") && why.contains("nonexistent.invalid"), "{why}");
    let port = closed_port();
    let (kind, why) = refused(&b, go(format!("http://127.0.0.1:{port}/"), None)).await;
    assert_eq!(kind, ErrorKind::NavigationFailed, "{why}");
    assert!(why.contains("ERR_CONNECTION_REFUSED") && why.contains(&format!("127.0.0.1:{port}")), "{why}");

    // The tab still works after them.
    let got = call(&b, go(format!("{}/final", s.url), None)).await;
    assert_eq!((got["loaded"].clone(), got["status"].as_u64()), (json!(true), Some(200)), "{got}");
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
}

/// The site's `/answers` (what the page's handler reported), read directly.
fn answers(site: &Site) -> String {
    use std::io::Read;
    use std::io::Write;
    let addr = site.url.trim_start_matches("http://");
    let mut c = std::net::TcpStream::connect(addr).expect("the site");
    write!(c, "GET /answers HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("ask");
    let mut got = String::new();
    c.read_to_string(&mut got).expect("read");
    got.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialog_never_blocks_a_tool() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let s = site("web/pages.py", &t.path().join("site"));
    let opened =
        call(&b, json!({"op": "open", "args": {"profile": "dialogs", "url": format!("{}/dialog", s.url)}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let delete = find(&snap, "button", "Delete");
    assert!(snap.get("dialog").is_none(), "{snap}");

    // The click's handler asks confirm(): the click answers at once, with the dialog.
    let began = Instant::now();
    let clicked = call(&b, json!({"op": "click", "args": {"session": sid, "ref": delete}})).await;
    let took = began.elapsed();
    assert!(took < Duration::from_secs(3), "the click took {took:?}: {clicked}");
    assert_eq!(clicked["dialog"], json!({"type": "confirm", "message": "Delete the report?"}), "{clicked}");
    assert_eq!(clicked["outcome"]["state"], "done", "{clicked}");

    // The snapshot shows it; an input is refused while it is open (nothing sent).
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert_eq!(snap["dialog"]["type"], "confirm", "{snap}");
    assert!(snap["text"].as_str().is_some_and(|t| t.contains("Delete the report?")), "{snap}");
    let began = Instant::now();
    let (kind, why) = refused(&b, json!({"op": "press", "args": {"session": sid, "keys": "Enter"}})).await;
    assert_eq!(kind, ErrorKind::Conflict, "{why}");
    assert!(why.contains("confirm") && began.elapsed() < Duration::from_secs(3), "{why}");
    assert_eq!(answers(&s), "", "the handler has not gone on");

    // Accepted: the handler sees `true`, and tells the page and the server.
    let done = call(&b, json!({"op": "dialog", "args": {"session": sid, "accept": true}})).await;
    assert_eq!(done["answered"]["message"], "Delete the report?", "{done}");
    assert!(done.get("dialog").is_none(), "no dialog left: {done}");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert!(snap.get("dialog").is_none(), "{snap}");
    assert!(snap["text"].as_str().is_some_and(|t| t.contains("confirmed: true")), "{snap}");
    let until = Instant::now() + Duration::from_secs(10);
    while answers(&s) != "ok=true" {
        assert!(Instant::now() < until, "the server heard {:?}", answers(&s));
        std::thread::sleep(Duration::from_millis(20));
    }

    // Nothing left to answer.
    let (kind, why) = refused(&b, json!({"op": "dialog", "args": {"session": sid, "accept": false}})).await;
    assert_eq!(kind, ErrorKind::NotFound, "{why}");
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
}

/// Waits (up to 10 s) until the site's `/answers` is `want`.
fn answers_become(site: &Site, want: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while answers(site) != want {
        assert!(Instant::now() < until, "the server heard {:?}, not {want:?}", answers(site));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_popup_is_a_tab_of_the_session_with_its_opener() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let s = site("web/pages.py", &t.path().join("site"));
    let opened =
        call(&b, json!({"op": "open", "args": {"profile": "popups", "url": format!("{}/popup", s.url)}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    let first = opened["tabs"][0]["tab"].as_str().expect("the first tab").to_string();
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let open_help = find(&snap, "button", "Open the help");

    // The button's handler calls window.open(): a second tab, listed with its opener.
    call(&b, json!({"op": "click", "args": {"session": sid, "ref": open_help}})).await;
    let child_url = format!("{}/popup-child", s.url);
    let until = Instant::now() + Duration::from_secs(10);
    let popup = loop {
        let listed = call(&b, json!({"op": "list"})).await;
        let tabs = listed["sessions"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["session"] == sid.as_str()))
            .map(|x| x["tabs"].clone())
            .unwrap_or_default();
        if let Some(p) = tabs.as_array().and_then(|a| a.iter().find(|x| x["url"] == child_url.as_str())) {
            assert_eq!(tabs.as_array().map(Vec::len), Some(2), "{listed}");
            assert_eq!(p["opener"], first.as_str(), "the popup names the tab it was opened from: {listed}");
            let opener_tab = tabs.as_array().and_then(|a| a.iter().find(|x| x["tab"] == first.as_str()));
            assert_eq!(opener_tab.map(|x| x["opener"].clone()), Some(json!(null)), "{listed}");
            break p["tab"].as_str().expect("its id").to_string();
        }
        assert!(Instant::now() < until, "no popup listed: {listed}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // With two tabs, a tool names one.
    let (kind, why) = refused(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert_eq!(kind, ErrorKind::InvalidRequest, "{why}");
    assert!(why.contains("2 tabs"), "{why}");

    // A tool acts on the popup by its id; the opener is left as it was.
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "tab": popup, "format": "json"}})).await;
    assert_eq!(snap["title"], "Help", "{snap}");
    let done = find(&snap, "button", "Done");
    let clicked = call(&b, json!({"op": "click", "args": {"session": sid, "tab": popup, "ref": done}})).await;
    assert_eq!(clicked["tab"], popup.as_str(), "{clicked}");
    answers_become(&s, "popup=done");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "tab": popup}})).await;
    assert!(snap["text"].as_str().is_some_and(|t| t.contains("done")), "{snap}");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "tab": first}})).await;
    assert_eq!(snap["title"], "Popup opener", "{snap}");
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_gets_the_text_it_is_answered_with() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let s = site("web/pages.py", &t.path().join("site"));
    let opened =
        call(&b, json!({"op": "open", "args": {"profile": "prompts", "url": format!("{}/prompt", s.url)}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let rename = find(&snap, "button", "Rename");

    // The click answers at once with the prompt and its default.
    let clicked = call(&b, json!({"op": "click", "args": {"session": sid, "ref": rename}})).await;
    let want = json!({"type": "prompt", "message": "New name?", "defaultPrompt": "draft"});
    assert_eq!(clicked["dialog"], want, "{clicked}");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert!(snap["text"].as_str().is_some_and(|t| t.contains("[default=\"draft\"]")), "{snap}");

    // Accepted with a text: the page gets that text.
    let done = call(&b, json!({"op": "dialog", "args": {"session": sid, "accept": true, "text": "Q3 report"}})).await;
    assert_eq!(done["answered"], want, "{done}");
    answers_become(&s, "name=Q3%20report");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert!(snap["text"].as_str().is_some_and(|t| t.contains("name: Q3 report")), "{snap}");

    // Dismissed: the page gets null.
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let rename = find(&snap, "button", "Rename");
    call(&b, json!({"op": "click", "args": {"session": sid, "ref": rename}})).await;
    call(&b, json!({"op": "dialog", "args": {"session": sid, "accept": false}})).await;
    answers_become(&s, "name=Q3%20report\nname=null");
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_beforeunload_dialog_holds_the_navigation_until_answered() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let s = site("web/pages.py", &t.path().join("site"));
    let leave = format!("{}/leave", s.url);
    let opened = call(&b, json!({"op": "open", "args": {"profile": "leaving", "url": leave}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let edit = find(&snap, "button", "Edit");
    // A user gesture first: a page that was never interacted with may not ask.
    call(&b, json!({"op": "click", "args": {"session": sid, "ref": edit}})).await;
    let go = json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/final", s.url)}});

    // Leaving asks: the navigation answers at once with the dialog, not loaded.
    let began = Instant::now();
    let got = call(&b, go.clone()).await;
    assert!(began.elapsed() < Duration::from_secs(5), "{got}");
    assert_eq!(got["dialog"]["type"], "beforeunload", "{got}");
    assert_eq!(got["loaded"], false, "{got}");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert_eq!(snap["dialog"]["type"], "beforeunload", "{snap}");
    let (kind, why) = refused(&b, go.clone()).await;
    assert_eq!(kind, ErrorKind::Conflict, "{why}");

    // Dismissed: the page stays, its state kept.
    let done = call(&b, json!({"op": "dialog", "args": {"session": sid, "accept": false}})).await;
    assert_eq!(done["outcome"]["navigated"], false, "{done}");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert!(snap.get("dialog").is_none(), "{snap}");
    assert_eq!(snap["url"], leave.as_str(), "{snap}");
    assert!(snap["text"].as_str().is_some_and(|t| t.contains("unsaved")), "{snap}");

    // Asked again and accepted: the navigation goes on.
    let got = call(&b, go.clone()).await;
    assert_eq!(got["dialog"]["type"], "beforeunload", "{got}");
    let done = call(&b, json!({"op": "dialog", "args": {"session": sid, "accept": true}})).await;
    assert_eq!(done["outcome"]["navigated"], true, "{done}");
    assert_eq!(done["outcome"]["state"], "done", "{done}");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert_eq!(
        (snap["url"].clone(), snap["title"].clone()),
        (json!(format!("{}/final", s.url)), json!("Final")),
        "{snap}"
    );
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
}
