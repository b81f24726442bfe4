//! A paired machine's own display, opted in by its owner (`--desktop-display N
//! --desktop-xauthority FILE`): a real Xvfb on this machine with its own cookie. Screenshots and
//! input actions work through the API, the Computer shows the display, and a person's stream is
//! refused (`ComputerUnsupported`). A paired machine that did not opt in refuses screenshots.
//! Needs Xvfb (installed by `.ci/run`): it fails without it.

use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::agent::wait_state;
use computerd_tests::wait::wait_for;
use rand::RngCore;
use reqwest::Method;
use serde_json::json;

struct Xvfb(Child);

impl Drop for Xvfb {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An X authority file with one MIT cookie for display `n` (any host).
fn authority(path: &std::path::Path, n: u32) {
    let mut cookie = [0u8; 16];
    rand::rng().fill_bytes(&mut cookie);
    let mut f = Vec::new();
    let field = |f: &mut Vec<u8>, b: &[u8]| {
        f.extend_from_slice(&u16::try_from(b.len()).expect("short").to_be_bytes());
        f.extend_from_slice(b);
    };
    f.extend_from_slice(&0xffffu16.to_be_bytes()); // FamilyWild
    field(&mut f, b"");
    field(&mut f, n.to_string().as_bytes());
    field(&mut f, b"MIT-MAGIC-COOKIE-1");
    field(&mut f, &cookie);
    std::fs::write(path, f).expect("write the authority file");
}

/// A free display number (no socket, no lock file).
fn free_display() -> u32 {
    (200..400)
        .find(|n| {
            !std::path::Path::new(&format!("/tmp/.X11-unix/X{n}")).exists()
                && !std::path::Path::new(&format!("/tmp/.X{n}-lock")).exists()
        })
        .expect("a free display number")
}

/// Width and height from a PNG's header.
fn png_size(b: &[u8]) -> (u32, u32) {
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (be(16), be(20))
}

#[tokio::test]
async fn t10_an_opted_in_display_takes_screenshots_and_actions_but_no_stream() {
    let c = TestCluster::start(1).await;
    let n = free_display();
    let auth = c.dir.path().join("Xauthority");
    authority(&auth, n);
    let xvfb = Command::new("Xvfb")
        .arg(format!(":{n}"))
        .arg("-auth")
        .arg(&auth)
        .args(["-nolisten", "tcp", "-screen", "0", "800x600x24"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("Xvfb (apt-get install xvfb)");
    let _xvfb = Xvfb(xvfb);
    let socket = format!("/tmp/.X11-unix/X{n}");
    wait_for("Xvfb's socket", Duration::from_secs(20), || {
        let socket = socket.clone();
        async move { std::path::Path::new(&socket).exists().then_some(()) }
    })
    .await;

    // The owner opts in on the agent's command line.
    let (id, code) = paired_computer(&c, "opted").await;
    let state = c.dir.path().join("agent-opted");
    let display = n.to_string();
    let auth_arg = auth.to_string_lossy().into_owned();
    let _agent = AgentProc::spawn_with(
        &c.url(1, ""),
        &state,
        Some(&code),
        &c.dir.path().join("agent-opted.log"),
        &["--desktop-display", &display, "--desktop-xauthority", &auth_arg],
    );
    wait_state(&c, &id, "running").await;

    let r = c
        .req(Method::POST, 1, &format!("/v1/computers/{id}/desktop/screenshot"), &c.token)
        .header("accept", "image/png")
        .json(&json!({"format": "png"}))
        .send()
        .await
        .expect("screenshot");
    assert_eq!(r.status(), 200);
    let png = r.bytes().await.expect("bytes");
    assert_eq!(png_size(&png), (800, 600));
    let body = json!({"actions": [{"type": "move", "x": 10, "y": 10}, {"type": "click", "x": 400, "y": 300}]});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/desktop/actions"), &c.token, Some(body)).await;
    assert_eq!((s, v["results"][1]["ok"].as_bool()), (200, Some(true)), "{v}");
    let (s, v) = c
        .call(Method::POST, 1, &format!("/v1/computers/{id}/desktop/stream"), &c.token, Some(json!({"mode": "view"})))
        .await;
    assert_eq!((s, v["error"]["kind"].as_str()), (422, Some("ComputerUnsupported")), "never a stream: {v}");
    // The Computer shows the display, with its size once the agent has seen it.
    let want = format!(":{n}");
    wait_for("the display in the computer's record", Duration::from_secs(20), || {
        let (c, id, want) = (&c, id.clone(), want.clone());
        async move {
            let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
            (v["desktop"]["display"] == want.as_str() && v["desktop"]["width"] == 800).then_some(())
        }
    })
    .await;

    // Without the opt-in: no desktop.
    let (plain, code) = paired_computer(&c, "plain").await;
    let state = c.dir.path().join("agent-plain");
    let _plain_agent = AgentProc::spawn(&c.url(1, ""), &state, Some(&code), &c.dir.path().join("agent-plain.log"));
    wait_state(&c, &plain, "running").await;
    let (s, v) =
        c.call(Method::POST, 1, &format!("/v1/computers/{plain}/desktop/screenshot"), &c.token, Some(json!({}))).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (422, Some("ComputerUnsupported")), "{v}");
    let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{plain}"), &c.token, None).await;
    assert_eq!(v["desktop"], serde_json::Value::Null, "{v}");
}
