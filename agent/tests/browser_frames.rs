//! Elements inside iframes, by ref, in real Chromium (issue 38, item 2), on the element corpus's
//! page of frames (`GET /frames` of `tests/fixtures/web/elements.py`): a form in a same-origin
//! frame (in the page's process) and in a cross-origin one (`http://localhost:PORT` inside a page
//! of `http://127.0.0.1:PORT`: another site, so an out-of-process frame). The snapshot lists each
//! frame's elements under its `<iframe>`; a text field is clicked and typed into, a `<select>`
//! set, a button hovered, and a button below the frame's fold (the frame itself below the page's)
//! clicked. Each effect is read back from the page's server. A frame under an overlay of the page
//! is covered: its button is refused, naming the cover. A ref into a frame of a page that has
//! navigated since is stale. Needs root, python3 and chromium (installed by `.ci/run`).

use std::time::Duration;
use std::time::Instant;

use computer_agent::browser::Browser;
use computerd_proto::ErrorKind;
use serde_json::Value;
use serde_json::json;

mod common;
use common::*;

async fn snapshot(b: &Browser, session: &str) -> Value {
    call(b, json!({"op": "snapshot", "args": {"session": session, "format": "json"}})).await
}

/// The ref of the first element with `role` and `name` in the tab's snapshot now.
async fn find_now(b: &Browser, session: &str, role: &str, name: &str) -> String {
    eprintln!("the {role} {name:?}");
    find(&snapshot(b, session).await, role, name)
}

/// Checks that the elements named are listed under the `<iframe>` titled `frame`: after it, one
/// level deeper or more, before the listing comes back to its level.
fn under(snap: &Value, frame: &str, names: &[&str]) {
    let text = snap["text"].as_str().unwrap_or_default();
    let elements = snap["elements"].as_array().cloned().unwrap_or_default();
    let at = elements
        .iter()
        .position(|e| e["role"] == "Iframe" && e["name"] == frame)
        .unwrap_or_else(|| panic!("no iframe {frame:?} in:\n{text}"));
    let depth = elements[at]["depth"].as_u64().unwrap_or(0);
    let inside: Vec<&Value> =
        elements[at + 1..].iter().take_while(|e| e["depth"].as_u64().is_some_and(|d| d > depth)).collect();
    for n in names {
        assert!(
            inside.iter().any(|e| e["name"] == *n && e["ref"].is_string()),
            "{n:?} is not listed with a ref under the iframe {frame:?}:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elements_inside_iframes_by_ref() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let s = site("web/elements.py", &t.path().join("site"));
    let opened = call(&b, json!({"op": "open", "args": {"url": format!("{}/frames", s.url)}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    assert_eq!(opened["tabs"][0]["title"], "Frames", "{opened}");

    // The frames load on their own time: the snapshot is taken until both forms are in it.
    let until = Instant::now() + Duration::from_secs(10);
    let snap = loop {
        let snap = snapshot(&b, &sid).await;
        let text = snap["text"].as_str().unwrap_or_default();
        if ["Send from same-origin", "Send from cross-origin", "Send from covered"].iter().all(|n| text.contains(n)) {
            break snap;
        }
        assert!(Instant::now() < until, "the frames' forms never showed in the snapshot:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    under(&snap, "Same-origin frame", &["Name in same-origin", "Size in same-origin", "Send from same-origin"]);
    under(&snap, "Cross-origin frame", &["Name in cross-origin", "Size in cross-origin", "Send from cross-origin"]);

    for who in ["same-origin", "cross-origin"] {
        // A text field: clicked, then typed into.
        let name = find_now(&b, &sid, "textbox", &format!("Name in {who}")).await;
        call(&b, json!({"op": "click", "args": {"session": sid, "ref": name}})).await;
        let text = format!("alice in {who}");
        call(&b, json!({"op": "type", "args": {"session": sid, "ref": name, "text": text}})).await;
        s.wait(&format!("{who}-name"), json!(text));
        // A select.
        let size = find_now(&b, &sid, "combobox", &format!("Size in {who}")).await;
        call(&b, json!({"op": "select", "args": {"session": sid, "ref": size, "values": ["l"]}})).await;
        s.wait(&format!("{who}-size"), json!("l"));
        // A hover.
        let hover = find_now(&b, &sid, "button", &format!("Hover in {who}")).await;
        call(&b, json!({"op": "hover", "args": {"session": sid, "ref": hover}})).await;
        s.wait(&format!("{who}-hover"), json!(true));
        // A button below the frame's fold: the frame, then the page, scrolled.
        let send = find_now(&b, &sid, "button", &format!("Send from {who}")).await;
        let clicked = call(&b, json!({"op": "click", "args": {"session": sid, "ref": send}})).await;
        s.wait(&format!("{who}-send"), json!(true));
        assert_eq!(clicked["outcome"]["state"], "done", "{clicked}");
    }

    // A frame under an overlay of the page: its button is covered, whatever its own document
    // says; nothing reaches it.
    let covered = find_now(&b, &sid, "button", "Send from covered").await;
    let (kind, message) = refused(&b, json!({"op": "click", "args": {"session": sid, "ref": covered}})).await;
    assert_eq!(kind, ErrorKind::InvalidRequest, "{message}");
    assert!(message.contains("dialog \"Frame cover\" covers"), "names the cover: {message}");

    // The page navigates: refs into its frames are stale.
    let snap = snapshot(&b, &sid).await;
    let (same, cross) =
        (find(&snap, "button", "Send from same-origin"), find(&snap, "button", "Send from cross-origin"));
    call(&b, json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/frames", s.url)}})).await;
    for r in [same, cross] {
        let (kind, message) = refused(&b, json!({"op": "click", "args": {"session": sid, "ref": r}})).await;
        assert_eq!(kind, ErrorKind::StaleRef, "{r}: {message}");
        assert!(message.contains("frame"), "{r}: {message}");
    }
    assert!(!s.events().iter().any(|e| e["el"] == "covered-send"), "the covered button saw nothing");
}
