//! What the agent's real-Chromium tests share: a Python site of `tests/fixtures/` on a free
//! port, Chromium's path, and calls to the browser.

#![allow(dead_code)]

use std::path::Path;
use std::path::PathBuf;

use computer_agent::browser::Browser;
use computerd_proto::ErrorKind;
use computerd_proto::browser::BrowserOp;
use serde_json::Value;

/// The caller the tests' browser calls come from.
pub const CALLER: &str = "bot:b1";

/// A test site: a Python script of `tests/fixtures/` serving on 127.0.0.1, stopped when dropped.
pub struct Site {
    pub child: std::process::Child,
    pub url: String,
    /// The directory the site writes what it saw into.
    pub state: PathBuf,
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `tests/fixtures/<script> 0 <state>`, which prints `listening on <port>` first.
pub fn site(script: &str, state: &Path) -> Site {
    site_with(script, state, &[], "http")
}

/// [`site`] with more arguments, served at `scheme://127.0.0.1:<port>`.
pub fn site_with(script: &str, state: &Path, args: &[&std::ffi::OsStr], scheme: &str) -> Site {
    use std::io::BufRead;
    std::fs::create_dir_all(state).expect("the site's state dir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(script);
    let mut child = std::process::Command::new("python3")
        .arg(&script)
        .arg("0")
        .arg(state)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs the site");
    let out = child.stdout.take().expect("stdout");
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line).expect("the site says its port");
    let port: u16 = line.trim().strip_prefix("listening on ").and_then(|p| p.parse().ok()).expect("a port");
    Site { child, url: format!("{scheme}://127.0.0.1:{port}"), state: state.to_path_buf() }
}

/// Chromium on this machine (`.ci/run` installs it).
pub fn chromium() -> PathBuf {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("chromium is installed (.ci/run installs it)")
}

pub fn op(v: Value) -> BrowserOp {
    serde_json::from_value(v).expect("a browser op")
}

/// A call that must answer.
pub async fn call(b: &Browser, v: Value) -> Value {
    let what = v.to_string();
    match b.call(op(v), CALLER).await {
        Ok(a) => a.json,
        Err(e) => panic!("{what}: {e:?}"),
    }
}

/// A call that must be refused: its error's kind and message.
pub async fn refused(b: &Browser, v: Value) -> (ErrorKind, String) {
    let what = v.to_string();
    match b.call(op(v), CALLER).await {
        Ok(a) => panic!("{what} answered {}", a.json),
        Err(e) => (e.kind, e.message),
    }
}

/// The ref of the first element with `role` and `name` in a JSON snapshot.
pub fn find(snap: &Value, role: &str, name: &str) -> String {
    snap["elements"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["role"] == role && e["name"] == name))
        .and_then(|e| e["ref"].as_str())
        .unwrap_or_else(|| panic!("no {role} {name:?} in:\n{}", snap["text"].as_str().unwrap_or_default()))
        .to_string()
}

/// A browser as the agent runs it, in `t` (made 0755): Chromium as the desktop account, uploads
/// from `t/workspace`, profiles under `t/browser`. Needs root.
pub fn browser(t: &Path) -> Browser {
    assert!(nix::unistd::geteuid().is_root(), "this test runs Chromium as the desktop account: run it as root");
    std::fs::set_permissions(t, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let workspace = t.join("workspace");
    std::fs::create_dir_all(&workspace).expect("workspace");
    let account = computer_agent::desktop::xserver::desktop_account().expect("an account for the browser");
    Browser::new(chromium(), account, t.join("browser"), workspace, None)
}

/// The site's counted effects (`tests/fixtures/wire_site.py`'s `state.json`, `"effects"`).
pub fn site_effects(site: &Site) -> serde_json::Map<String, Value> {
    let text = std::fs::read_to_string(site.state.join("state.json")).unwrap_or_default();
    serde_json::from_str::<Value>(&text).ok().and_then(|v| v["effects"].as_object().cloned()).unwrap_or_default()
}

/// Whether the answer lists `method url…` with `field` = `value`.
pub fn lists(answer: &Value, method: &str, url_prefix: &str, field: &str, value: &Value) -> bool {
    answer["requests"].as_array().is_some_and(|a| {
        a.iter().any(|r| {
            r["method"] == method && r["url"].as_str().is_some_and(|u| u.starts_with(url_prefix)) && &r[field] == value
        })
    })
}

/// Navigates and snapshots (JSON); the load must give `title`.
pub async fn load(b: &Browser, sid: &str, url: String, title: &str) -> Value {
    let nav = call(b, serde_json::json!({"op": "navigate", "args": {"session": sid, "url": url}})).await;
    assert_eq!((nav["loaded"].as_bool(), nav["title"].as_str()), (Some(true), Some(title)), "{nav}");
    call(b, serde_json::json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await
}

/// The exactly-once cases on `wire_site.py` at `base` (HTTP/1.1, kept alive): for its fault
/// switches `close` (the answer lost) and `slow` (the answer late), a recorded click on a form
/// POST, a `fetch()` POST the page's script makes after a recorded click, and a recorded
/// `upload` of `doc` then a recorded click that sends it. Each effect is counted once by the
/// site; the outcome is `unknown` where the answer was lost and `done` where it came.
pub async fn h1_faults_once(b: &Browser, sid: &str, base: &str, site: &Site, doc: &Path) {
    use serde_json::json;
    for f in ["close", "slow"] {
        let lost = f == "close";
        let want = if lost { "unknown" } else { "done" };
        let snap = load(b, sid, format!("{base}/form?fault={f}"), &format!("Form {f}")).await;
        let send = find(&snap, "button", "Send");
        let got =
            call(b, json!({"op": "click", "args": {"session": sid, "ref": send, "actionId": format!("form-{f}")}}))
                .await;
        assert_eq!(site_effects(site).get(&format!("submit?fault={f}")), Some(&json!(1)), "{f}: {got}");
        assert_eq!(got["outcome"]["state"], want, "{f}: {got}");
        let field = if lost { ("result", json!("no answer")) } else { ("status", json!(303)) };
        assert!(lists(&got, "POST", &format!("{base}/submit"), field.0, &field.1), "{f}: {got}");

        let snap = load(b, sid, format!("{base}/script?fault={f}"), "Script").await;
        let go = find(&snap, "button", "Send by script");
        let got =
            call(b, json!({"op": "click", "args": {"session": sid, "ref": go, "actionId": format!("fetch-{f}")}}))
                .await;
        assert_eq!(site_effects(site).get(&format!("api?fault={f}")), Some(&json!(1)), "{f}: {got}");
        assert_eq!(got["outcome"]["state"], want, "{f}: {got}");
        let field = if lost { ("result", json!("no answer")) } else { ("status", json!(200)) };
        assert!(lists(&got, "POST", &format!("{base}/api"), field.0, &field.1), "{f}: {got}");

        let snap = load(b, sid, format!("{base}/upload?fault={f}"), "Upload").await;
        let input = find(&snap, "button", "Document");
        let up = call(b, json!({"op": "upload", "args": {"session": sid, "ref": input, "paths": [doc.display().to_string()], "actionId": format!("upload-{f}")}})).await;
        assert_eq!(up["accepted"], true, "{f}: {up}");
        let send = find(&snap, "button", "Upload");
        let got =
            call(b, json!({"op": "click", "args": {"session": sid, "ref": send, "actionId": format!("store-{f}")}}))
                .await;
        assert_eq!(site_effects(site).get(&format!("store?fault={f}")), Some(&json!(1)), "{f}: {got}");
        assert_eq!(got["outcome"]["state"], want, "{f}: {got}");
    }
    // Another page loaded afterwards: a re-sent request would have come before it.
    load(b, sid, format!("{base}/other"), "Other").await;
    let effects = site_effects(site);
    assert!(effects.values().all(|n| n == &json!(1)), "every effect once: {effects:?}");
    assert_eq!(effects.get("store without its file"), None, "each upload came with its file: {effects:?}");
    assert_eq!(effects.len(), 6, "{effects:?}");
}

impl Site {
    /// What the element corpus's pages reported (`tests/fixtures/web/elements.py`'s
    /// `events.jsonl`).
    pub fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.state.join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits until the page reported `el` with `value` (the last such report counts; `null`:
    /// a link that was followed), polling the site's log (another process writes it).
    pub fn wait(&self, el: &str, value: Value) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let last = self.events().into_iter().rev().find(|e| e["el"] == el);
            if last.as_ref().is_some_and(|e| e["value"] == value || (value.is_null() && e["ev"] == "followed")) {
                return;
            }
            assert!(std::time::Instant::now() < until, "the page never reported {el} = {value} (last: {last:?})");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
