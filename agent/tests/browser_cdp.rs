//! The browser against real Chromium on this machine (run by the agent's own code as the
//! desktop account, over a CDP pipe) and the test site (`tests/fixtures/browser_site.py`):
//! signing in by refs; a ref after navigation and a ref of an element re-rendered by script are
//! `StaleRef` and reach nothing; every bad upload path is refused with its reason before CDP;
//! `report.pdf` is set on a hidden file input reached through its label (name and size read
//! back, and the site's own upload counted); a lost answer to a submit leaves the outcome
//! `unknown` while the site counted it; a snapshot trimmed by `maxElements` and one of a subtree
//! (`root`: only what is inside, its refs usable, a hidden file input inside it listed through its
//! label); select, hover, type with submit, press, screenshots;
//! `session_status` on a signed-in and a signed-out profile. Needs root, python3 and chromium
//! (installed by `.ci/run`): it fails without them.

use std::time::Duration;
use std::time::Instant;

use computer_agent::browser::Browser;
use computerd_proto::ErrorKind;
use serde_json::Value;
use serde_json::json;

mod common;
use common::*;

impl Site {
    fn state(&self) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.state.join("state.json")).unwrap_or_default())
            .unwrap_or(Value::Null)
    }
    /// Waits until project `p` has counted `n` uploads.
    fn wait_uploads(&self, p: &str, n: u64) {
        let until = Instant::now() + Duration::from_secs(20);
        while self.state()["uploads"][p].as_u64() != Some(n) {
            assert!(Instant::now() < until, "project {p} counted {:?} uploads, not {n}", self.state()["uploads"][p]);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

async fn snapshot(b: &Browser, session: &str) -> Value {
    call(b, json!({"op": "snapshot", "args": {"session": session, "format": "json"}})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_browser_on_the_test_site() {
    assert!(nix::unistd::geteuid().is_root(), "this test runs Chromium as the desktop account: run it as root");
    let t = tempfile::tempdir().expect("tmp");
    std::fs::set_permissions(t.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let workspace = t.path().join("workspace");
    std::fs::create_dir_all(&workspace).expect("workspace");
    let s = site("browser_site.py", &t.path().join("site"));
    let account = computer_agent::desktop::xserver::desktop_account().expect("an account for the browser");
    let b = Browser::new(chromium(), account, t.path().join("browser"), workspace.clone(), None);

    // Sign in, by refs.
    let opened = call(&b, json!({"op": "open", "args": {"profile": "alice", "url": format!("{}/login", s.url)}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    assert_eq!(opened["tabs"][0]["title"], "Sign in", "{opened}");
    assert_eq!(opened["tabs"][0]["status"], 200);
    let snap = snapshot(&b, &sid).await;
    let user = find(&snap, "textbox", "Username");
    let pass = find(&snap, "textbox", "Password");
    let sign_in = find(&snap, "button", "Sign in");
    call(&b, json!({"op": "type", "args": {"session": sid, "ref": user, "text": "alice"}})).await;
    call(&b, json!({"op": "type", "args": {"session": sid, "ref": pass, "text": "wonderland"}})).await;
    let clicked = call(&b, json!({"op": "click", "args": {"session": sid, "ref": sign_in}})).await;
    assert_eq!(clicked["outcome"]["state"], "done", "{clicked}");
    assert_eq!(clicked["outcome"]["navigated"], true);
    assert_eq!(clicked["outcome"]["status"], 200, "after the 303, /projects");
    assert_eq!(s.state()["logins"], 1);

    // A ref from before the navigation is stale, and reaches nothing.
    let (kind, why) = refused(&b, json!({"op": "click", "args": {"session": sid, "ref": sign_in}})).await;
    assert_eq!(kind, ErrorKind::StaleRef, "{why}");
    let snap = snapshot(&b, &sid).await;
    assert_eq!(snap["title"], "Projects");
    let (kind, why) = refused(&b, json!({"op": "click", "args": {"session": sid, "ref": user}})).await;
    assert_eq!(kind, ErrorKind::StaleRef, "a ref of an older snapshot: {why}");
    let project_b = find(&snap, "link", "Project B");
    let clicked = call(&b, json!({"op": "click", "args": {"session": sid, "ref": project_b}})).await;
    assert_eq!(clicked["outcome"]["state"], "done", "{clicked}");

    // Uploads: every bad path is refused before CDP.
    let snap = snapshot(&b, &sid).await;
    assert_eq!(snap["title"], "Project B documents");
    let hidden = find(&snap, "file input", "Upload document");
    const REPORT: &[u8] = b"%PDF-1.4\n% the quarterly report\n";
    std::fs::write(workspace.join("report.pdf"), REPORT).expect("report");
    std::fs::write(workspace.join("empty.pdf"), b"").expect("empty");
    std::fs::write(workspace.join("big.bin"), vec![7u8; 17 * 1024 * 1024]).expect("big");
    std::fs::write(t.path().join("outside.txt"), b"secret").expect("outside");
    std::os::unix::fs::symlink(t.path().join("outside.txt"), workspace.join("link.txt")).expect("symlink");
    let w = |n: &str| workspace.join(n).display().to_string();
    for (path, reason) in [
        (t.path().join("outside.txt").display().to_string(), "outside"),
        (w("link.txt"), "outside"),
        (w("empty.pdf"), "empty"),
        (w("big.bin"), "over the"),
        (w("missing.pdf"), "No such file"),
        ("report.pdf".to_string(), "absolute"),
    ] {
        let (kind, why) =
            refused(&b, json!({"op": "upload", "args": {"session": sid, "ref": hidden, "paths": [path]}})).await;
        assert_eq!(kind, ErrorKind::InvalidRequest, "{path}: {why}");
        assert!(why.contains(reason), "{path}: {why}");
    }
    s.wait_uploads("b", 0);

    // report.pdf through the hidden input behind its label: read back, and the site's script
    // uploads it on change.
    let up =
        call(&b, json!({"op": "upload", "args": {"session": sid, "ref": hidden, "paths": [w("report.pdf")]}})).await;
    assert_eq!(up["accepted"], true, "{up}");
    assert_eq!(up["readBack"], json!([{"name": "report.pdf", "size": REPORT.len()}]));
    assert_eq!(up["files"][0]["sha256"], hex_sha256(REPORT));
    assert_eq!(up["files"][0]["artifact"], Value::Null);
    s.wait_uploads("b", 1);
    assert_eq!(s.state()["documents"]["b"][0]["sha256"], up["files"][0]["sha256"]);

    // The visible form, with the answer lost: the outcome is unknown, the site counted it.
    std::fs::write(s.state.join("control.json"), r#"{"mode": "lose"}"#).expect("control");
    let snap = snapshot(&b, &sid).await;
    let visible = find(&snap, "button", "Choose file");
    let up =
        call(&b, json!({"op": "upload", "args": {"session": sid, "ref": visible, "paths": [w("report.pdf")]}})).await;
    assert_eq!(up["accepted"], true, "{up}");
    let submit = find(&snap, "button", "Upload");
    let clicked = call(&b, json!({"op": "click", "args": {"session": sid, "ref": submit}})).await;
    assert_eq!(clicked["outcome"]["state"], "unknown", "{clicked}");
    s.wait_uploads("b", 2);
    std::fs::remove_file(s.state.join("control.json")).expect("control");

    // Trimmed snapshots: `maxElements` lists at most that many and says so; a subtree (`root`)
    // lists only what is inside its root, its refs reach elements inside, and a hidden file
    // input inside it is listed through its label.
    let docs = format!("{}/projects/b/documents", s.url);
    let nav = call(&b, json!({"op": "navigate", "args": {"session": sid, "url": docs}})).await;
    assert_eq!(nav["title"], "Project B documents", "{nav}");
    let few = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json", "maxElements": 5}})).await;
    let few_n = few["elements"].as_array().map(Vec::len);
    assert!(few_n.is_some_and(|n| (1..=5).contains(&n)), "at most 5 elements: {few}");
    assert_eq!(few["text"].as_str().map(|t| t.lines().count()), few_n, "{few}");
    assert_eq!(few["truncated"], true, "{few}");
    let full = snapshot(&b, &sid).await;
    assert_eq!(full["truncated"], false, "{full}");
    let full_n = full["elements"].as_array().map_or(0, Vec::len);
    assert!(full_n > 5, "the untrimmed snapshot lists more than 5: {full}");
    let outside = find(&full, "link", "Projects");
    let sub = call(
        &b,
        json!({"op": "snapshot", "args": {"session": sid, "format": "json", "root": find(&full, "form", "Upload form")}}),
    )
    .await;
    assert_eq!(sub["truncated"], false, "{sub}");
    let listed: Vec<(String, String)> = sub["elements"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| (e["role"].as_str().unwrap_or_default().into(), e["name"].as_str().unwrap_or_default().into()))
        .collect();
    let has = |role: &str, name: &str| listed.iter().any(|(r, n)| r == role && n == name);
    assert!(has("form", "Upload form") && has("button", "Choose file") && has("button", "Upload"), "{listed:?}");
    assert!(!has("link", "Projects") && !has("heading", "Upload"), "only the form's subtree: {listed:?}");
    assert!(!listed.iter().any(|(r, _)| r == "file input"), "the hidden input is outside the form: {listed:?}");
    assert!(listed.len() < full_n, "{listed:?}");
    let (kind, why) = refused(&b, json!({"op": "click", "args": {"session": sid, "ref": outside}})).await;
    assert_eq!(kind, ErrorKind::StaleRef, "a ref of the page's snapshot, not the subtree's: {why}");
    let up = call(
        &b,
        json!({"op": "upload", "args": {"session": sid, "ref": find(&sub, "button", "Choose file"), "paths": [w("report.pdf")]}}),
    )
    .await;
    assert_eq!(up["accepted"], true, "the subtree's ref is the form's file input: {up}");
    assert_eq!(up["readBack"], json!([{"name": "report.pdf", "size": REPORT.len()}]), "{up}");
    let full = snapshot(&b, &sid).await;
    let group = find(&full, "group", "Quick upload");
    let sub = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json", "root": group}})).await;
    let in_group: Vec<&Value> = sub["elements"].as_array().into_iter().flatten().collect();
    assert!(
        in_group
            .iter()
            .any(|e| e["role"] == "file input" && e["name"] == "Upload document" && e["states"] == json!(["hidden"])),
        "the hidden file input inside the subtree, by its label:\n{}",
        sub["text"]
    );
    assert!(!in_group.iter().any(|e| e["name"] == "Choose file" || e["name"] == "Projects"), "{}", sub["text"]);
    let hidden = find(&sub, "file input", "Upload document");
    let up =
        call(&b, json!({"op": "upload", "args": {"session": sid, "ref": hidden, "paths": [w("report.pdf")]}})).await;
    assert_eq!(up["accepted"], true, "{up}");
    s.wait_uploads("b", 3);

    // Widgets: a re-rendered element's ref is stale; select, hover, type + submit, press.
    let nav = call(&b, json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/widgets", s.url)}})).await;
    assert_eq!((nav["status"].as_u64(), nav["title"].as_str()), (Some(200), Some("Widgets")), "{nav}");
    let snap = snapshot(&b, &sid).await;
    let target = find(&snap, "button", "Target");
    let replace = find(&snap, "button", "Replace target");
    call(&b, json!({"op": "click", "args": {"session": sid, "ref": target}})).await;
    call(&b, json!({"op": "click", "args": {"session": sid, "ref": replace}})).await;
    let (kind, why) = refused(&b, json!({"op": "click", "args": {"session": sid, "ref": target}})).await;
    assert_eq!(kind, ErrorKind::StaleRef, "{why}");
    assert!(why.contains("removed or replaced"), "{why}");
    let snap = snapshot(&b, &sid).await;
    assert!(
        snap["text"].as_str().unwrap_or_default().contains("text \"1\""),
        "one click counted, not two:\n{}",
        snap["text"]
    );
    let color = find(&snap, "combobox", "Color");
    let sel = call(&b, json!({"op": "select", "args": {"session": sid, "ref": color, "values": ["Green"]}})).await;
    assert_eq!(sel["selected"], json!(["green"]));
    let (kind, _) =
        refused(&b, json!({"op": "select", "args": {"session": sid, "ref": color, "values": ["purple"]}})).await;
    assert_eq!(kind, ErrorKind::InvalidRequest);
    call(&b, json!({"op": "hover", "args": {"session": sid, "ref": find(&snap, "region", "Hover me")}})).await;
    let snap2 = snapshot(&b, &sid).await;
    assert!(snap2["text"].as_str().unwrap_or_default().contains("text \"yes\""), "hovered:\n{}", snap2["text"]);
    let search = find(&snap2, "textbox", "Search");
    let typed =
        call(&b, json!({"op": "type", "args": {"session": sid, "ref": search, "text": "größe <b>", "submit": true}}))
            .await;
    assert_eq!(typed["outcome"]["navigated"], true, "{typed}");
    let listed = call(&b, json!({"op": "list"})).await;
    assert_eq!(listed["sessions"][0]["tabs"][0]["title"], "Search: größe <b>", "{listed}");
    let pressed = call(&b, json!({"op": "press", "args": {"session": sid, "keys": "Tab"}})).await;
    assert_eq!(pressed["outcome"]["navigated"], false, "{pressed}");

    // Screenshots: PNG of the viewport, JPEG of the whole page.
    let shot = b.call(op(json!({"op": "screenshot", "args": {"session": sid}})), CALLER).await.expect("shot");
    assert_eq!(&shot.image[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(shot.json["size"].as_u64(), Some(shot.image.len() as u64));
    let shot = b.call(op(json!({"op": "screenshot", "args": {"session": sid, "fullPage": true, "format": "jpeg", "quality": 70}})), CALLER).await.expect("shot");
    assert_eq!(&shot.image[..2], &[0xff, 0xd8]);

    // Session status: signed in here; a second profile is signed out.
    let probes = json!({"signedInSelector": "#who", "account": "alice", "projectUrl": format!("{}/projects/b/documents", s.url)});
    let st =
        call(&b, json!({"op": "session_status", "args": {"session": sid, "origin": s.url, "probes": probes}})).await;
    assert_eq!(
        (st["signedIn"].as_bool(), st["accountMatches"].as_bool(), st["projectAccessible"].as_bool()),
        (Some(true), Some(true), Some(true)),
        "{st}"
    );
    assert!(!st.to_string().contains("sid="), "no cookie value leaves: {st}");
    let other = call(&b, json!({"op": "open", "args": {"profile": "nobody-signed-in"}})).await;
    let sid2 = other["session"].as_str().expect("session").to_string();
    let st =
        call(&b, json!({"op": "session_status", "args": {"session": sid2, "origin": s.url, "probes": probes}})).await;
    assert_eq!(
        (st["signedIn"].as_bool(), st["accountMatches"].as_bool(), st["projectAccessible"].as_bool()),
        (Some(false), Some(false), Some(false)),
        "{st}"
    );
    let (kind, _) = refused(&b, json!({"op": "open", "args": {"profile": "alice"}})).await;
    assert_eq!(kind, ErrorKind::Conflict, "a profile in use");

    // Closed sessions are gone; a new one is never taken for them.
    for id in [&sid, &sid2] {
        call(&b, json!({"op": "close", "args": {"session": id}})).await;
    }
    let (kind, _) = refused(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert_eq!(kind, ErrorKind::NotFound);
}

fn hex_sha256(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}
