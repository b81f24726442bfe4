//! Every kind of element a person clicks, by ref, in real Chromium (issue 38, item 2), on the
//! element corpus (`tests/fixtures/web/elements.html`, served over HTTP/1.1 with keep-alive by
//! `elements.py`): text fields (labelled, aria-labelled), a textarea and a `contenteditable`;
//! checkboxes and radios, directly and through their label when the input itself is visually
//! hidden; a `<select>`, an ARIA listbox and a combobox; buttons, a hover, a link; a button in an
//! open shadow root; a button at the bottom of a scrolling container; a button under a sticky
//! header. Each effect is read back from the page's server (the page reports what it saw). A real
//! cover is refused, naming what covers the target, and nothing reaches it. Needs root, python3
//! and chromium (installed by `.ci/run`): it fails without them.

use std::time::Duration;
use std::time::Instant;

use computer_agent::browser::Browser;
use computerd_proto::ErrorKind;
use serde_json::Value;
use serde_json::json;

mod common;
use common::*;

/// The ref of the first element with `role` and `name` in the tab's snapshot now.
async fn find_now(b: &Browser, session: &str, role: &str, name: &str) -> String {
    eprintln!("the {role} {name:?}");
    let snap = call(b, json!({"op": "snapshot", "args": {"session": session, "format": "json"}})).await;
    find(&snap, role, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_element_by_ref() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let s = site("web/elements.py", &t.path().join("site"));
    let opened = call(&b, json!({"op": "open", "args": {"url": format!("{}/", s.url)}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    assert_eq!(opened["tabs"][0]["title"], "Elements", "{opened}");

    let click = |r: String| {
        let (b, sid) = (&b, sid.clone());
        async move { call(b, json!({"op": "click", "args": {"session": sid, "ref": r}})).await }
    };
    let type_in = |r: String, text: &'static str| {
        let (b, sid) = (&b, sid.clone());
        async move { call(b, json!({"op": "type", "args": {"session": sid, "ref": r, "text": text}})).await }
    };

    // First, while the page opens scrolled so that this button sits under the sticky header:
    // it counts as visible, yet its centre is the header's; it is scrolled to the middle.
    click(find_now(&b, &sid, "button", "Under the header").await).await;
    s.wait("under-header", json!(true));

    // Text fields: a labelled input, an aria-labelled one, a textarea, a contenteditable; each
    // is clicked first (the most common action there is), then typed into.
    for (role, name, el, text) in [
        ("textbox", "User", "user", "alice"),
        ("textbox", "Search", "search", "shoes"),
        ("textbox", "Notes", "notes", "a note"),
        ("textbox", "Editor", "editor", "rich text"),
    ] {
        let r = find_now(&b, &sid, role, name).await;
        click(r.clone()).await;
        type_in(r, text).await;
        s.wait(el, json!(text));
    }

    // Checkboxes and radios: the input itself, and one visually hidden behind its label.
    click(find_now(&b, &sid, "checkbox", "I agree").await).await;
    s.wait("agree", json!(true));
    click(find_now(&b, &sid, "checkbox", "Newsletter").await).await;
    s.wait("news", json!(true));
    click(find_now(&b, &sid, "radio", "Small").await).await;
    s.wait("size", json!("small"));
    click(find_now(&b, &sid, "radio", "Large").await).await;
    s.wait("size", json!("large"));

    // A select, an ARIA listbox, a combobox with its suggestions.
    let colour = find_now(&b, &sid, "combobox", "Colour").await;
    call(&b, json!({"op": "select", "args": {"session": sid, "ref": colour, "values": ["green"]}})).await;
    s.wait("colour", json!("green"));
    click(find_now(&b, &sid, "option", "Pear").await).await;
    s.wait("fruit", json!("Pear"));
    let city = find_now(&b, &sid, "combobox", "City").await;
    type_in(city, "L").await;
    click(find_now(&b, &sid, "option", "London").await).await;
    s.wait("city", json!("London"));

    // Buttons: plain, hovered, in an open shadow root, at the bottom of a scrolling container.
    click(find_now(&b, &sid, "button", "Plain button").await).await;
    s.wait("plain", json!(true));
    let hover = find_now(&b, &sid, "button", "Hover me").await;
    call(&b, json!({"op": "hover", "args": {"session": sid, "ref": hover}})).await;
    s.wait("hover", json!(true));
    click(find_now(&b, &sid, "button", "Shadow button").await).await;
    s.wait("shadow", json!(true));
    click(find_now(&b, &sid, "button", "Deep button").await).await;
    s.wait("deep", json!(true));

    // A button whose click opens a file chooser (its input hidden): `upload` with the button's
    // ref intercepts the chooser and sets the file. A plain button opens none: the click went
    // out, so the outcome is `unknown` (what the click did is the page's), and no file is set.
    let workspace = t.path().join("workspace");
    std::fs::write(workspace.join("note.txt"), b"hello").expect("a file to upload");
    let note = workspace.join("note.txt").display().to_string();
    let attach = find_now(&b, &sid, "button", "Attach a file").await;
    let up = call(&b, json!({"op": "upload", "args": {"session": sid, "ref": attach, "paths": [note]}})).await;
    assert_eq!(
        (up["accepted"].clone(), up["readBack"].clone()),
        (json!(true), json!([{"name": "note.txt", "size": 5}])),
        "{up}"
    );
    s.wait("attach", json!("note.txt:5"));
    let plain = find_now(&b, &sid, "button", "Plain button").await;
    let up = call(&b, json!({"op": "upload", "args": {"session": sid, "ref": plain, "paths": [note]}})).await;
    assert_eq!((up["accepted"].clone(), up["outcome"]["state"].clone()), (json!(false), json!("unknown")), "{up}");
    assert!(up["outcome"]["error"].as_str().is_some_and(|e| e.contains("opened no file chooser")), "{up}");

    // A real cover is refused, naming it, and nothing reaches the button.
    let covered = find_now(&b, &sid, "button", "Covered button").await;
    match b.call(op(json!({"op": "click", "args": {"session": sid, "ref": covered}})), CALLER).await {
        Ok(a) => panic!("a covered button was clicked: {}", a.json),
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e:?}");
            assert!(e.message.contains("dialog \"Cookie banner\" covers"), "names the cover: {}", e.message);
        }
    }
    // A link: it leaves the page.
    let link = find_now(&b, &sid, "link", "Go to linked").await;
    let clicked = click(link).await;
    assert_eq!(clicked["outcome"]["navigated"], true, "{clicked}");
    s.wait("link", Value::Null);
    assert!(!s.events().iter().any(|e| e["el"] == "covered"), "the covered button saw nothing");

    // A link to a new tab: the session lists it with its opener, and a tool can target it.
    let first = opened["tabs"][0]["tab"].as_str().expect("the first tab").to_string();
    call(&b, json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/", s.url)}})).await;
    click(find_now(&b, &sid, "link", "Open in a new tab").await).await;
    // The new tab opens on its own time: looked for until it is listed and shows its page.
    let until = Instant::now() + Duration::from_secs(10);
    let popup = loop {
        let listed = call(&b, json!({"op": "list"})).await;
        let tabs = listed["sessions"][0]["tabs"].as_array().cloned().unwrap_or_default();
        if let Some(t) = tabs.iter().find(|t| t["opener"] == first.as_str() && t["title"] == "Linked") {
            break t["tab"].as_str().expect("its id").to_string();
        }
        assert!(Instant::now() < until, "no tab opened from {first} shows its page: {listed}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "tab": popup, "format": "json"}})).await;
    assert!(snap["text"].as_str().is_some_and(|t| t.contains("Linked")), "the new tab's page: {snap}");
    let nav = call(
        &b,
        json!({"op": "navigate", "args": {"session": sid, "tab": popup, "url": format!("{}/linked?again=1", s.url)}}),
    )
    .await;
    assert_eq!(nav["status"], 200, "a tool acts on the new tab: {nav}");
}
