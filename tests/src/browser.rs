//! What the browser tests through a node share: a desktop sandbox on the local Docker engine,
//! the test site (`tests/fixtures/browser_site.py`) started inside it, and refs read from JSON
//! snapshots.

use reqwest::Method;
use serde_json::Value;
use serde_json::json;

use crate::TestCluster;
use crate::agent::wait_state;
use crate::docker::Containers;
use crate::docker::DESKTOP_IMAGE;
use crate::docker::IMAGE;
use crate::docker::docker_provider;
use crate::docker::ensure_desktop_image;

/// The test site, served in the sandbox.
pub const SITE: &str = include_str!("../fixtures/browser_site.py");

/// A running desktop sandbox named `name` (its command key too) on a docker provider of `c`;
/// its id, and the guard that removes its container.
pub async fn desktop_computer(c: &TestCluster, name: &str) -> (String, Containers) {
    ensure_desktop_image();
    let templates = json!({"templates": {
        "default": {"image": IMAGE, "cpus": 1.0, "memoryMb": 512, "pids": 256},
        "desktop": {"image": DESKTOP_IMAGE, "cpus": 1.0, "memoryMb": 1536, "pids": 1024},
    }});
    let provider = docker_provider(c, templates).await;
    let mut cleanup = Containers::default();
    let body = json!({"commandKey": name, "name": name, "desktop": true, "source": {"_tag": "Provider", "provider": provider}});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&id);
    wait_state(c, &id, "running").await;
    (id, cleanup)
}

/// Starts the test site inside the sandbox `id` (its network is the host's: port 0, told
/// back), with its state in `site/`; its base URL.
pub async fn start_site(c: &TestCluster, id: &str) -> String {
    let (s, v) = c
        .call(
            Method::PUT,
            1,
            &format!("/v1/computers/{id}/files?path=browser_site.py"),
            &c.token,
            Some(json!({"content": SITE})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let start = json!({"command": "python3 browser_site.py 0 site", "yieldTimeMs": 5000});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(start)).await;
    assert_eq!(s, 200, "{v}");
    let port: u16 = v["output"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("listening on "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("the site did not start: {v}"));
    format!("http://127.0.0.1:{port}")
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
