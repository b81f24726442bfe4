//! Headless Chromium (Debian's) driven over the DevTools protocol, to look at a page as a
//! person's browser shows it: open a URL, then take screenshots until one satisfies a predicate.

use std::path::Path;
use std::time::Duration;

use futures::SinkExt;
use futures::StreamExt;
use serde_json::Value;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

/// A headless Chromium with its own profile, killed when dropped.
pub struct Chromium {
    child: tokio::process::Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Chromium {
    /// Starts one (`apt-get install chromium`), its window `width` x `height`.
    pub async fn start(width: u32, height: u32) -> Chromium {
        let profile = tempfile::tempdir().expect("profile dir");
        let port = crate::cluster::free_port();
        let child = tokio::process::Command::new("chromium")
            .args(["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"])
            .arg(format!("--window-size={width},{height}"))
            .arg(format!("--remote-debugging-port={port}"))
            .arg("--remote-debugging-address=127.0.0.1")
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium runs (apt-get install chromium)");
        Chromium { child, port, _profile: profile }
    }

    /// Opens `url` in the first tab, then takes a screenshot (PNG) every 250 ms until `done`
    /// says yes to one, for up to `within`; answers the last one and whether it satisfied `done`.
    pub async fn shoot_until(
        &mut self,
        url: &str,
        within: Duration,
        mut done: impl FnMut(&[u8]) -> bool,
    ) -> (Vec<u8>, bool) {
        let list = format!("http://127.0.0.1:{}/json/list", self.port);
        let ws_url = crate::wait::wait_for("chromium's DevTools", Duration::from_secs(30), || {
            let list = list.clone();
            async move {
                let v: Value = reqwest::get(&list).await.ok()?.json().await.ok()?;
                v.as_array()?.iter().find(|t| t["type"] == "page")?["webSocketDebuggerUrl"].as_str().map(String::from)
            }
        })
        .await;
        let (mut ws, _) = tokio_tungstenite::connect_async(ws_url.as_str()).await.expect("DevTools WebSocket");
        let mut next_id = 0u64;
        let mut call = async |ws: &mut tokio_tungstenite::WebSocketStream<_>, method: &str, params: Value| -> Value {
            next_id += 1;
            let id = next_id;
            let msg = json!({"id": id, "method": method, "params": params}).to_string();
            ws.send(Message::Text(msg.into())).await.expect("send to DevTools");
            loop {
                match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
                    Ok(Some(Ok(Message::Text(t)))) => {
                        let v: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
                        if v["id"] == id {
                            return v;
                        }
                    }
                    Ok(Some(Ok(_))) => {}
                    other => panic!("DevTools went away during {method}: {other:?}"),
                }
            }
        };
        let nav = call(&mut ws, "Page.navigate", json!({"url": url})).await;
        assert!(nav.get("error").is_none(), "{nav}");
        let until = tokio::time::Instant::now() + within;
        loop {
            let shot = call(&mut ws, "Page.captureScreenshot", json!({"format": "png"})).await;
            let data = shot["result"]["data"].as_str().unwrap_or_default();
            use base64::Engine;
            let png = base64::engine::general_purpose::STANDARD.decode(data).unwrap_or_default();
            let ok = !png.is_empty() && done(&png);
            if ok || tokio::time::Instant::now() >= until {
                return (png, ok);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Writes a PNG next to nothing else: a helper for saving a screenshot under `docs/`.
    pub fn save(png: &[u8], path: &Path) {
        std::fs::write(path, png).expect("save the screenshot");
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
