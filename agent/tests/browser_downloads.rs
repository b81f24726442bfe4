//! Downloads against real Chromium (through the session's wire guard) and the small site of
//! `tests/fixtures/web/pages.py`: a link with `download`, an answer with `Content-Disposition:
//! attachment` (by a click, a key and a navigation) are saved under `<workspace>/Downloads/` as
//! files of the browser's account (never root), named, and reported with the SHA-256 of the
//! server's bytes; a name already there gets ` (1)`; a download past the cap is cancelled and
//! refused, nothing of it left; a symlink put where the directory goes is refused, never
//! followed. Needs root, python3 and chromium.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde_json::Value;
use serde_json::json;
use sha2::Digest;

mod common;
use common::*;

/// `GET path` on the site, read directly: the body's bytes.
fn get(site: &Site, path: &str) -> Vec<u8> {
    use std::io::Read;
    use std::io::Write;
    let addr = site.url.trim_start_matches("http://");
    let mut c = std::net::TcpStream::connect(addr).expect("the site");
    write!(c, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("ask");
    let mut got = Vec::new();
    c.read_to_end(&mut got).expect("read");
    let at = got.windows(4).position(|w| w == b"\r\n\r\n").expect("a head");
    got.split_off(at + 4)
}

/// The names in a directory, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .expect("the directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

/// The answer's one download.
fn one(answer: &Value) -> Value {
    let list = answer["downloads"].as_array().unwrap_or_else(|| panic!("no downloads in {answer}"));
    assert_eq!(list.len(), 1, "{answer}");
    list[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_are_saved_named_hashed_and_capped() {
    let t = tempfile::tempdir().expect("tmp");
    let b = browser(t.path());
    let s = site("web/pages.py", &t.path().join("site"));
    let account = computer_agent::desktop::xserver::desktop_account().expect("the browser's account");
    assert_ne!(account.uid, 0);
    let dir = t.path().join("workspace/Downloads");
    let opened =
        call(&b, json!({"op": "open", "args": {"profile": "downloads", "url": format!("{}/downloads", s.url)}})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let report = find(&snap, "link", "Download the report");
    let invoice = find(&snap, "link", "Get the invoice");
    let click = |r: &str| json!({"op": "click", "args": {"session": sid, "ref": r}});

    // A link with `download`: the click waits for it; the file is the server's bytes, the
    // browser's account's, readable; its SHA-256 is the server's bytes'.
    let server = get(&s, "/bytes/report.bin");
    assert!(server.len() > 300 * 1024, "{}", server.len());
    let got = call(&b, click(&report)).await;
    let d = one(&got);
    let want_path = dir.join("report.bin");
    assert_eq!(d["name"], "report.bin", "{got}");
    assert_eq!(d["path"], want_path.display().to_string(), "{got}");
    assert_eq!(d["size"].as_u64(), Some(server.len() as u64), "{got}");
    assert_eq!(d["sha256"], hex::encode(sha2::Sha256::digest(&server)), "{got}");
    assert_eq!(got["outcome"]["navigated"], false, "the page stays: {got}");
    assert_eq!(std::fs::read(&want_path).expect("the file"), server);
    let m = std::fs::symlink_metadata(&want_path).expect("stat");
    assert!(m.is_file());
    assert_eq!((m.uid(), m.mode() & 0o777), (account.uid, 0o644), "the browser's account's, readable");
    let dm = std::fs::symlink_metadata(&dir).expect("stat");
    let ws = std::fs::metadata(t.path().join("workspace")).expect("stat");
    assert!(dm.is_dir() && dm.uid() == ws.uid() && dm.mode() & 0o777 == 0o755, "the workspace owner's");

    // Again: the name is taken, so ` (1)`; the first file is untouched.
    let got = call(&b, click(&report)).await;
    assert_eq!(one(&got)["name"], "report (1).bin", "{got}");
    assert_eq!(std::fs::read(dir.join("report (1).bin")).expect("the file"), server);

    // An answer with `Content-Disposition: attachment`: by a click, the page stays.
    let got = call(&b, click(&invoice)).await;
    let d = one(&got);
    assert_eq!(d["name"], "invoice 2024.csv", "{got}");
    assert_eq!(d["sha256"], hex::encode(sha2::Sha256::digest(b"id,amount\n1,42\n")), "{got}");
    assert_eq!(got["outcome"]["state"], "done", "{got}");
    assert_eq!(std::fs::read(dir.join("invoice 2024.csv")).expect("the file"), b"id,amount\n1,42\n");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid}})).await;
    assert_eq!(snap["url"], format!("{}/downloads", s.url), "{snap}");

    // By a navigation.
    let got =
        call(&b, json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/attachment", s.url)}})).await;
    assert_eq!(one(&got)["name"], "invoice 2024 (1).csv", "{got}");
    assert!(got.get("error").is_none() && got["timedOut"] == false, "{got}");

    // By a key: on the page afresh, Tab to the first link, Enter.
    call(&b, json!({"op": "navigate", "args": {"session": sid, "url": format!("{}/downloads", s.url)}})).await;
    call(&b, json!({"op": "press", "args": {"session": sid, "keys": "Tab"}})).await;
    let got = call(&b, json!({"op": "press", "args": {"session": sid, "keys": "Enter"}})).await;
    assert_eq!(one(&got)["name"], "report (2).bin", "{got}");
    let snap = call(&b, json!({"op": "snapshot", "args": {"session": sid, "format": "json"}})).await;
    let (report, big, chunked) = (
        find(&snap, "link", "Download the report"),
        find(&snap, "link", "Get the big file"),
        find(&snap, "link", "Get the chunked file"),
    );

    // Still running when the answer goes (the click waits 300 ms; the server takes 1.3 s):
    // `inProgress`; once it has ended, the next acting tool's answer tells how, once.
    let got = call(&b, json!({"op": "click", "args": {"session": sid, "ref": big, "timeoutMs": 300}})).await;
    let d = one(&got);
    assert_eq!((&d["name"], &d["state"]), (&json!("big.bin"), &json!("inProgress")), "{got}");
    assert!(d["received"].as_u64().is_some_and(|r| r < 4 * 1024 * 1024), "{got}");
    assert!(d["total"] == json!(4 * 1024 * 1024) || d["total"].is_null(), "{got}");
    let hover = json!({"op": "hover", "args": {"session": sid, "ref": report}});
    let until = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let got = loop {
        let got = call(&b, hover.clone()).await;
        if got.get("downloads").is_some() {
            break got;
        }
        assert!(std::time::Instant::now() < until, "never reported as ended: {got}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let d = one(&got);
    assert_eq!((&d["name"], d["size"].as_u64()), (&json!("big.bin"), Some(4 * 1024 * 1024)), "{got}");
    assert_eq!(std::fs::metadata(dir.join("big.bin")).expect("the file").len(), 4 * 1024 * 1024);
    let got = call(&b, hover).await;
    assert!(got.get("downloads").is_none(), "listed once: {got}");

    // Past the cap: by the length its answer announces, and by the bytes a chunked one passes.
    // Cancelled, refused with the reason, nothing of it left.
    b.set_download_cap(1024 * 1024);
    let got = call(&b, click(&big)).await;
    let d = one(&got);
    assert_eq!(d["name"], "big.bin", "{got}");
    assert!(d["refused"].as_str().is_some_and(|r| r.contains("announced") && r.contains("1048576")), "{got}");
    let got = call(&b, click(&chunked)).await;
    let d = one(&got);
    assert_eq!(d["name"], "chunked.bin", "{got}");
    assert!(d["refused"].as_str().is_some_and(|r| r.contains("passed the 1048576-byte cap")), "{got}");
    let want =
        ["big.bin", "invoice 2024 (1).csv", "invoice 2024.csv", "report (1).bin", "report (2).bin", "report.bin"];
    assert_eq!(names(&dir), want, "only the saved files: no partial file, no GUID");
    // The browser's own directory (where it saves) keeps nothing of them either.
    let stage = t.path().join("browser/downloads").join(&sid);
    assert!(names(&stage).is_empty(), "left in the browser's directory: {:?}", names(&stage));
    // The transfers stopped: after longer than one takes whole (1.3 s), the server wrote less
    // than one file's 4 MiB for the two (beside the whole one above).
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let served: u64 = String::from_utf8_lossy(&get(&s, "/big-served")).parse().expect("a count");
    let served = served.saturating_sub(4 * 1024 * 1024);
    assert!(served < 4 * 1024 * 1024, "the server wrote {served} bytes of the two");
    b.set_download_cap(computer_agent::browser::download::MAX_DOWNLOAD);

    // A symlink where the directory goes (the workspace is another account's): refused, never
    // followed, even to a directory the browser's account could write.
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("mkdir");
    std::os::unix::fs::chown(&elsewhere, Some(account.uid), Some(account.gid)).expect("chown");
    std::fs::rename(&dir, t.path().join("workspace/Downloads.old")).expect("mv");
    std::os::unix::fs::symlink(&elsewhere, &dir).expect("symlink");
    let got = call(&b, click(&report)).await;
    let d = one(&got);
    assert!(d["refused"].as_str().is_some_and(|r| r.contains("Downloads cannot be used")), "{got}");
    assert!(names(&elsewhere).is_empty(), "nothing was left through the link: {:?}", names(&elsewhere));
    assert!(std::fs::symlink_metadata(&dir).expect("lstat").file_type().is_symlink());
    assert!(names(&stage).is_empty(), "left in the browser's directory: {:?}", names(&stage));

    // Closed: the browser's directory for the session goes.
    call(&b, json!({"op": "close", "args": {"session": sid}})).await;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while stage.exists() {
        assert!(std::time::Instant::now() < until, "{} is still there", stage.display());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
