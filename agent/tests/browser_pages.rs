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
