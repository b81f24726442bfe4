//! Issue 36, item 1: a `view` stream never types. Against a real Xvfb, a real x11vnc and a Tk
//! window with the focus in its text entry, a scripted RFB client (the attacker) opens `view`
//! streams with every version string from `RFB 003.000` to `RFB 003.008`, each followed by bytes
//! crafted so that a filter reading the version as 3.7 passes, inside one SetEncodings, the keys
//! `Z` and Return that libvncserver (reading every 3.x below 3.7 as 3.3) takes as KeyEvents. The
//! desktop receives no input: the versions the filter does not take close the stream before
//! anything reaches x11vnc, and the three it takes stay in step with it. Then the second wall: a
//! client on the view server's socket itself, past the filter, sends keys in step, and they
//! reach nothing either (`-viewonly`). Needs root, Xvfb, x11vnc and python3-tk (installed by
//! `.ci/run`): it fails without them.

use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

use computer_agent::desktop::Desktop;
use computer_agent::desktop::Scope;
use computer_agent::desktop::stream::Mode;
use computer_agent::desktop::stream::Open;
use computer_agent::desktop::stream::socket_of;
use computer_agent::desktop::xserver;
use computerd_proto::desktop::DesktopOp;
use tokio::io::AsyncRead;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

fn op(v: serde_json::Value) -> DesktopOp {
    serde_json::from_value(v).expect("a desktop op")
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

/// Four blocks of 20 bytes: press and release `Z` three times, then Return, as libvncserver
/// reads them one byte ahead of a filter that took a security byte (SetEncodings with no
/// encodings, then two KeyEvents); the same bytes, read from one byte later, are one
/// SetEncodings of four encodings each.
fn crafted() -> Vec<u8> {
    let block = |sym: [u8; 4]| {
        let mut b = vec![2, 2, 0, 0, 4, 1, 0, 0];
        b.extend_from_slice(&sym);
        b.extend_from_slice(&[4, 0, 0, 0]);
        b.extend_from_slice(&sym);
        b
    };
    let z = 0x5au32.to_be_bytes();
    let mut out = Vec::new();
    for _ in 0..3 {
        out.extend(block(z));
    }
    out.extend(block(0xff0du32.to_be_bytes()));
    out
}

/// A request for one pixel, whose answer tells that x11vnc handled every message before it.
const ONE_PIXEL: [u8; 10] = [3, 0, 0, 0, 0, 0, 0, 1, 0, 1];

async fn read<R: AsyncRead + Unpin>(r: &mut R, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(20), r.read_exact(&mut b))
        .await
        .unwrap_or_else(|_| panic!("x11vnc sent no {n} bytes in 20 s"))
        .expect("the stream is open");
    b
}

/// Reads the server's side of a handshake at version 3.`minor` and then messages until the
/// answer to [`ONE_PIXEL`].
async fn until_update<R: AsyncRead + Unpin>(r: &mut R, minor: u8) {
    assert!(read(r, 12).await.starts_with(b"RFB 003."));
    if minor == 3 {
        assert_eq!(read(r, 4).await, vec![0, 0, 0, 1], "3.3: security None, chosen by the server");
    } else {
        let n = read(r, 1).await[0] as usize;
        assert!(read(r, n).await.contains(&1), "security None is offered");
        if minor == 8 {
            assert_eq!(read(r, 4).await, vec![0, 0, 0, 0], "security result OK");
        }
    }
    let init = read(r, 24).await;
    let bytes_per_pixel = usize::from(init[4] / 8);
    let name = u32::from_be_bytes([init[20], init[21], init[22], init[23]]) as usize;
    read(r, name).await;
    loop {
        match read(r, 1).await[0] {
            0 => {
                let rects = read(r, 3).await;
                for _ in 0..u16::from_be_bytes([rects[1], rects[2]]) {
                    let h = read(r, 12).await;
                    let (w, hh) =
                        (u16::from_be_bytes([h[4], h[5]]) as usize, u16::from_be_bytes([h[6], h[7]]) as usize);
                    assert_eq!(&h[8..12], &[0, 0, 0, 0], "raw encoding");
                    read(r, w * hh * bytes_per_pixel).await;
                }
                return;
            }
            2 => {}
            3 => {
                let h = read(r, 7).await;
                read(r, u32::from_be_bytes([h[3], h[4], h[5], h[6]]) as usize).await;
            }
            k => panic!("server message {k}"),
        }
    }
}

/// How a view stream at version 3.`minor` ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The filter closed it.
    Refused,
    /// x11vnc answered the request that followed the crafted bytes, in step with the client.
    InStep,
}

async fn attack(desktop: &Desktop, minor: u8) -> Outcome {
    let open = Open { target: "vnc".into(), mode: Mode::View, holder: "person:member:mem_viewer".into() };
    let sock = desktop.open_vnc(&open).await.expect("a view stream opens");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<bytes::Bytes>();
    let (to_viewer, mut from_server) = tokio::io::duplex(1 << 20);
    let d = desktop.clone();
    let pump = tokio::spawn(async move {
        d.pump(open, sock, tokio_stream::wrappers::UnboundedReceiverStream::new(rx), to_viewer).await
    });
    let mut bytes = format!("RFB 003.00{minor}\n").into_bytes();
    bytes.push(1); // 3.7 and 3.8: security None; 3.3 (and below 3.7 for libvncserver): ClientInit
    bytes.extend(crafted());
    // In step at 3.7 and 3.8, the last SetEncodings wants one byte more; at 3.3 it had none.
    if minor != 3 {
        bytes.push(0);
    }
    bytes.extend_from_slice(&ONE_PIXEL);
    tx.send(bytes.into()).expect("the pump takes bytes");
    // The pump ends with the filter's refusal (and the viewer's side then ends too), or x11vnc
    // answers, in step.
    let mut read_side = tokio::spawn(async move {
        until_update(&mut from_server, minor).await;
    });
    tokio::pin!(pump);
    let refused = |r: Result<Result<(), String>, tokio::task::JoinError>| match r {
        Ok(Err(_)) => Outcome::Refused,
        other => panic!("version 3.{minor}: the stream ended without a refusal: {other:?}"),
    };
    let outcome = tokio::select! {
        r = &mut pump => {
            read_side.abort();
            refused(r)
        }
        r = &mut read_side => match r {
            Ok(()) => Outcome::InStep,
            Err(_) => refused(pump.await),
        },
    };
    drop(tx);
    outcome
}

#[tokio::test(flavor = "multi_thread")]
async fn i36_1_a_view_stream_types_nothing_whatever_its_version() {
    assert_eq!(nix::unistd::geteuid().as_raw(), 0, "the desktop test needs root (the display runs as its own account)");
    assert!(
        std::process::Command::new("x11vnc").arg("-version").output().is_ok_and(|o| o.status.success()),
        "x11vnc runs (apt-get install x11vnc)"
    );
    let run_dir = PathBuf::from(format!("/tmp/computerd-view-test-{}", std::process::id()));
    let geometry = "800x600x24".parse().expect("geometry");
    let account = xserver::desktop_account().expect("an account for the desktop");
    let display = xserver::start(geometry, account, &run_dir).await.expect("Xvfb starts (apt-get install xvfb)");
    let desktop = Desktop::new(display.clone(), Scope::Full);

    let out = tempfile::tempdir().expect("tmp");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/desktop_probe.py");
    let mut probe = std::process::Command::new("/usr/bin/python3")
        .arg(script)
        .arg(out.path())
        .env("DISPLAY", format!(":{}", display.number))
        .env("XAUTHORITY", &display.authority)
        .spawn()
        .expect("/usr/bin/python3 (apt-get install python3-tk) runs");
    let ready = {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(s) = std::fs::read_to_string(out.path().join("ready")) {
                break s;
            }
            assert!(Instant::now() < until, "the probe window did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let at: Vec<u32> = ready.split_whitespace().map(|v| v.parse().expect("a number")).collect();
    let (ex, ey) = (at[4], at[5]);
    // The focus in the entry, and a first line through the API, which shows the entry works.
    let typed = |text: &str| {
        op(serde_json::json!({"actions": {"actions": [
            {"type": "click", "x": ex + 10, "y": ey + 10}, {"type": "key", "keys": "ctrl+/"}, {"type": "key", "keys": "BackSpace"},
            {"type": "type", "text": text}, {"type": "key", "keys": "Return"},
        ], "screenshot": false}}))
    };
    desktop.call(typed("before"), "bot:a".into()).await.expect("typing through the API");
    wait_content(&out.path().join("typed"), "before");
    desktop.call(DesktopOp::Release, "bot:a".into()).await.expect("release");

    let mut outcomes = Vec::new();
    for minor in 0..=8u8 {
        outcomes.push((minor, attack(&desktop, minor).await));
    }
    let want: Vec<(u8, Outcome)> =
        (0..=8).map(|m| (m, if [3, 7, 8].contains(&m) { Outcome::InStep } else { Outcome::Refused })).collect();
    assert_eq!(outcomes, want);

    // The second wall: past the filter, on the view server's own socket, keys in step.
    let run = display.authority.parent().expect("the desktop's directory");
    let mut raw = tokio::net::UnixStream::connect(socket_of(run, Mode::View)).await.expect("the view server's socket");
    let mut bytes = b"RFB 003.008\n\x01\x01".to_vec();
    bytes.extend_from_slice(&[2, 0, 0, 1, 0, 0, 0, 0]); // raw encoding
    for sym in [0x51u32, 0x51, 0xff0d] {
        let s = sym.to_be_bytes();
        bytes.extend_from_slice(&[4, 1, 0, 0, s[0], s[1], s[2], s[3], 4, 0, 0, 0, s[0], s[1], s[2], s[3]]);
    }
    bytes.extend_from_slice(&[5, 1, 0, 20, 0, 20, 5, 0, 0, 20, 0, 20]); // a click
    bytes.extend_from_slice(&ONE_PIXEL);
    raw.write_all(&bytes).await.expect("write");
    until_update(&mut raw, 8).await;
    drop(raw);

    // Whatever those streams sent was handled before their answers; the API's line after them
    // is the only one since the first.
    desktop.call(typed("after"), "bot:a".into()).await.expect("typing through the API");
    wait_content(&out.path().join("typed"), "after");
    let log = std::fs::read_to_string(out.path().join("typed.log")).expect("typed.log");
    assert_eq!(log, "before\nafter\n", "a view stream typed into the desktop");
    let _ = probe.kill();
    let _ = probe.wait();
    drop(desktop);
    let _ = std::fs::remove_dir_all(&run_dir);
}
