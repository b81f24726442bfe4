//! `computerd dev` as a new user runs it, with the local Docker engine: it pairs this machine,
//! serves its Docker sandboxes over WSS on the bridge with a local CA, and registers the `local
//! docker` provider carrying that CA. A sandbox made through that provider links with the CA
//! pinned (no `--insecure`), and a command runs in it.

use std::io::BufRead;
use std::time::Duration;

use computerd_tests::docker::Containers;
use computerd_tests::docker::containers_of;
use computerd_tests::docker::ensure_sandbox_image;
use computerd_tests::docker::inspect;
use computerd_tests::wait_for;
use serde_json::Value;
use serde_json::json;

struct Dev(std::process::Child);

impl Drop for Dev {
    fn drop(&mut self) {
        // SIGTERM, so dev stops its own agent too.
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn t10_dev_serves_docker_sandboxes_over_wss_with_its_ca() {
    ensure_sandbox_image();
    let _agent = computerd_tests::agent::agent_bin(); // dev starts the agent found next to it
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    let port = computerd_tests::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut child = std::process::Command::new(computerd_tests::computerd_bin());
    computerd_tests::agent::own_home(&mut child, &data);
    let mut child = child
        .args(["dev", "--http", &format!("127.0.0.1:{port}"), "--data"])
        .arg(&data)
        .env("COMPUTERD_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("computerd dev");
    let stdout = child.stdout.take().expect("stdout");
    let _dev = Dev(child);
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut printed = Vec::new();
    let docker_line = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(l) = lines.recv().await {
            printed.push(l.clone());
            if l.starts_with("Docker sandboxes:") {
                return Some(l);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_else(|| panic!("dev printed no Docker line: {printed:#?}"));
    assert!(!docker_line.contains("off"), "Docker is here, so dev serves sandboxes: {docker_line}");
    let token = std::fs::read_to_string(data.join("admin.token")).expect("token").trim().to_string();
    let http = reqwest::Client::new();
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let (http, token, url) = (http.clone(), token.clone(), format!("{base}{path}"));
        async move {
            let mut r = http.request(method, url).bearer_auth(&token).timeout(Duration::from_secs(40));
            if let Some(b) = body {
                r = r.json(&b);
            }
            let r = r.send().await.expect("call dev");
            let s = r.status().as_u16();
            (s, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (_, list) = call(reqwest::Method::GET, "/v1/computer-providers".into(), None).await;
    let providers = list["providers"].as_array().cloned().unwrap_or_default();
    let p = providers.iter().find(|p| p["kind"] == "docker").unwrap_or_else(|| panic!("{list}"));
    let url = p["config"]["serverUrl"].as_str().expect("serverUrl");
    assert!(url.starts_with("https://") && !url.contains("127.0.0.1"), "on the bridge, over TLS: {url}");
    let ca = std::fs::read_to_string(data.join("edge-tls/ca.crt")).expect("the local CA");
    assert_eq!(p["config"]["caCert"], ca.as_str(), "the provider hands the agents dev's CA");
    let provider = p["id"].as_str().expect("id").to_string();

    let body = json!({"commandKey": "dev-box", "name": "box", "source": {"_tag": "Provider", "provider": provider}});
    let (s, v) = call(reqwest::Method::POST, "/v1/computers".into(), Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    let mut cleanup = Containers::default();
    cleanup.track(&id);
    wait_for("the sandbox's agent to link over WSS", Duration::from_secs(90), || async {
        let (_, c) = call(reqwest::Method::GET, format!("/v1/computers/{id}"), None).await;
        (c["state"] == "running").then_some(())
    })
    .await;
    let container = containers_of(&id).pop().expect("the container");
    let env = inspect(&container, "{{json .Config.Env}}");
    assert!(env.contains("COMPUTER_AGENT_CA_PEM=-----BEGIN CERTIFICATE-----"), "{env}");
    assert!(!env.contains("COMPUTER_AGENT_INSECURE"), "no --insecure: {env}");
    assert_eq!(inspect(&container, "{{.HostConfig.NetworkMode}}"), "bridge");
    let body = json!({"command": "cat /proc/1/comm", "yieldTimeMs": 10_000});
    let (s, v) = call(reqwest::Method::POST, format!("/v1/computers/{id}/sessions"), Some(body)).await;
    assert_eq!((s, v["output"].as_str()), (200, Some("docker-init\n")), "{v}");
}
