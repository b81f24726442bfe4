//! The desktop against a real Xvfb on this machine (started by the agent's own code as the
//! desktop account, `nobody` here) and a real Tk window: a screenshot shows the window's pixels;
//! typed Unicode text arrives exactly in a text entry, also under a German keymap; a click lands
//! at the pixel asked; an action off the screen fails before anything is sent; another caller
//! meets `InputBusy` while the lease is held. Needs root, Xvfb and python3-tk (installed by
//! `.ci/run`): it fails without them.

use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

use computer_agent::desktop::Desktop;
use computer_agent::desktop::Scope;
use computer_agent::desktop::xserver;
use computerd_proto::ErrorKind;
use computerd_proto::desktop::DesktopOp;
use serde_json::json;

fn op(v: serde_json::Value) -> DesktopOp {
    serde_json::from_value(v).expect("a desktop op")
}

/// Waits until `path` exists with content, for up to 20 s.
fn wait_file(path: &Path) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s;
        }
        assert!(Instant::now() < until, "{} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `path` holds `want`, for up to 20 s.
fn wait_content(path: &Path, want: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let got = std::fs::read_to_string(path).ok();
        if got.as_deref() == Some(want) {
            return;
        }
        assert!(Instant::now() < until, "{} holds {got:?}, not {want:?}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Probe {
    child: std::process::Child,
    out: tempfile::TempDir,
    /// rootx rooty canvasx canvasy entryx entryy
    at: Vec<u32>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn probe(display: &xserver::Display) -> Probe {
    let out = tempfile::tempdir().expect("tmp");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/desktop_probe.py");
    let child = std::process::Command::new("/usr/bin/python3")
        .arg(script)
        .arg(out.path())
        .env("DISPLAY", format!(":{}", display.number))
        .env("XAUTHORITY", &display.authority)
        .spawn()
        .expect("/usr/bin/python3 (apt-get install python3-tk) runs");
    let ready = wait_file(&out.path().join("ready"));
    let at: Vec<u32> = ready.split_whitespace().map(|v| v.parse().expect("a number")).collect();
    assert_eq!(at.len(), 6, "{ready}");
    Probe { child, out, at }
}

#[tokio::test(flavor = "multi_thread")]
async fn screenshots_typing_clicks_and_the_lease_on_a_real_display() {
    assert_eq!(nix::unistd::geteuid().as_raw(), 0, "the desktop test needs root (the display runs as its own account)");
    let run_dir = PathBuf::from(format!("/tmp/computerd-desktop-test-{}", std::process::id()));
    let geometry = "1024x700x24".parse().expect("geometry");
    let account = xserver::desktop_account().expect("an account for the desktop");
    let display = xserver::start(geometry, account, &run_dir).await.expect("Xvfb starts (apt-get install xvfb)");
    let desktop = Desktop::new(display.clone(), Scope::Full);
    let status = desktop.call(DesktopOp::Status, "bot:a".into()).await.expect("status");
    assert_eq!(status.json["state"], "running");
    // A new desktop is not a black screen: its background is the wallpaper's colour.
    let first = desktop.call(op(json!({"screenshot": {"format": "png"}})), "bot:a".into()).await.expect("screenshot");
    let first = image::load_from_memory(&first.image).expect("a PNG").to_rgb8();
    assert_eq!(first.get_pixel(3, 3).0, xserver::WALLPAPER, "the wallpaper, from the first screenshot");
    // The cookie is the desktop account's alone.
    let meta = std::fs::metadata(&display.authority).expect("authority");
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777, 0o600);

    let p = probe(&display);
    let (cx, cy, ex, ey) = (p.at[2], p.at[3], p.at[4], p.at[5]);

    // A screenshot shows the window: its green frame and blue canvas, where Tk says they are.
    let shot = desktop.call(op(json!({"screenshot": {"format": "png"}})), "bot:a".into()).await.expect("screenshot");
    assert_eq!((shot.json["width"].as_u64(), shot.json["height"].as_u64()), (Some(1024), Some(700)));
    let img = image::load_from_memory(&shot.image).expect("a PNG").to_rgb8();
    assert_eq!(img.get_pixel(cx + 10, cy + 10).0, [0x34, 0x56, 0xcd], "the canvas's blue at its place");
    let green = img.pixels().filter(|p| p.0 == [0x12, 0xab, 0x34]).count();
    assert!(green > 20_000, "the frame's green is on the screen ({green} pixels)");
    let webp = desktop.call(op(json!({"screenshot": {"format": "webp"}})), "bot:a".into()).await.expect("webp");
    let back = image::load_from_memory(&webp.image).expect("a WebP").to_rgb8();
    assert_eq!(back.as_raw(), img.as_raw(), "WebP is lossless");
    let part = desktop
        .call(op(json!({"screenshot": {"format": "jpeg", "quality": 90, "region": {"x": cx, "y": cy, "width": 100, "height": 50}, "scale": 0.5}})), "bot:a".into())
        .await
        .expect("jpeg of a region");
    assert_eq!((part.json["width"].as_u64(), part.json["height"].as_u64()), (Some(50), Some(25)));

    // Typing Unicode into the entry, then Return: the entry's text is exactly it.
    let text = "héllo wörld €";
    let typed = desktop
        .call(
            op(json!({"actions": {"actions": [
                {"type": "click", "x": ex + 10, "y": ey + 10},
                {"type": "type", "text": text},
                {"type": "key", "keys": "Return"},
            ]}})),
            "bot:a".into(),
        )
        .await
        .expect("actions");
    assert_eq!(typed.json["results"].as_array().map(|r| r.len()), Some(3));
    assert!(!typed.image.is_empty(), "a screenshot follows the actions");
    wait_content(&p.out.path().join("typed"), text);

    // A click lands at the pixel asked.
    let (x, y) = (cx + 57, cy + 61);
    desktop
        .call(
            op(json!({"actions": {"actions": [{"type": "click", "x": x, "y": y}], "screenshot": false}})),
            "bot:a".into(),
        )
        .await
        .expect("click");
    wait_content(&p.out.path().join("clicked"), &format!("{x} {y}"));

    // Off the screen: refused before anything is sent (the click before it never happens).
    std::fs::remove_file(p.out.path().join("clicked")).expect("rm");
    let off = desktop
        .call(op(json!({"actions": {"actions": [{"type": "click", "x": x, "y": y}, {"type": "move", "x": 1024, "y": 3}]}})), "bot:a".into())
        .await
        .expect_err("off the screen");
    assert_eq!(off.kind, ErrorKind::InvalidRequest, "{off:?}");
    assert!(off.message.contains("outside"), "{off:?}");
    let unknown = desktop
        .call(op(json!({"actions": {"actions": [{"type": "click", "x": x, "y": y}, {"type": "key", "keys": "ctrl+nokey"}]}})), "bot:a".into())
        .await
        .expect_err("an unknown key");
    assert_eq!(unknown.kind, ErrorKind::InvalidRequest, "{unknown:?}");
    // (ctrl+/ selects all in a Tk entry.) Events are handled in order: once this text arrived, a click sent before it would have too.
    desktop
        .call(op(json!({"actions": {"actions": [
            {"type": "click", "x": ex + 10, "y": ey + 10}, {"type": "key", "keys": "ctrl+/"}, {"type": "key", "keys": "BackSpace"},
            {"type": "type", "text": "after\n"},
        ], "screenshot": false}})), "bot:a".into())
        .await
        .expect("after");
    wait_content(&p.out.path().join("typed"), "after");
    assert!(!p.out.path().join("clicked").exists(), "a refused call sent nothing");

    // Under a German keymap (y and z swapped, umlauts on their own keys), text still arrives.
    let layout = std::process::Command::new("setxkbmap")
        .args(["-display", &format!(":{}", display.number), "de"])
        .env("XAUTHORITY", &display.authority)
        .status()
        .expect("setxkbmap (x11-xkb-utils)");
    assert!(layout.success(), "setxkbmap de");
    let german = "zy Ärger ß @ {x} héllo wörld €";
    desktop
        .call(op(json!({"actions": {"actions": [
            {"type": "click", "x": ex + 10, "y": ey + 10}, {"type": "key", "keys": "ctrl+/"}, {"type": "key", "keys": "BackSpace"},
            {"type": "type", "text": german}, {"type": "key", "keys": "Return"},
        ], "screenshot": false}})), "bot:a".into())
        .await
        .expect("german");
    wait_content(&p.out.path().join("typed"), german);

    let st = desktop.call(DesktopOp::Status, "bot:a".into()).await.expect("status");
    assert_eq!(st.json["capture"], "mit-shm", "screenshots go through MIT-SHM: {}", st.json);
    assert_eq!((st.json["width"].as_u64(), st.json["height"].as_u64()), (Some(1024), Some(700)));

    // The lease: bot:a holds it; bot:b is told who; after a release bot:b acts.
    let busy = desktop
        .call(op(json!({"actions": {"actions": [{"type": "move", "x": 5, "y": 5}]}})), "bot:b".into())
        .await
        .expect_err("busy");
    assert_eq!(busy.kind, ErrorKind::InputBusy);
    assert!(busy.message.contains("bot:a"), "{busy:?}");
    let st = desktop.call(DesktopOp::Status, "bot:b".into()).await.expect("status");
    assert_eq!(st.json["lease"]["holder"], "bot:a");
    let not_mine = desktop.call(DesktopOp::Release, "bot:b".into()).await.expect_err("not b's");
    assert_eq!(not_mine.kind, ErrorKind::InputBusy);
    let released = desktop.call(DesktopOp::Release, "bot:a".into()).await.expect("release");
    assert_eq!(released.json["released"], true);
    desktop
        .call(
            op(json!({"actions": {"actions": [{"type": "move", "x": 5, "y": 5}], "screenshot": false}})),
            "bot:b".into(),
        )
        .await
        .expect("bot:b acts after the release");
    drop(p);
    let _ = std::fs::remove_dir_all(&run_dir);
}
