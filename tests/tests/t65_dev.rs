//! `computerd dev` as a new user runs it, with the local Docker engine: it pairs this machine,
//! serves its Docker sandboxes over WSS on the sandbox network's gateway with a local CA, and
//! registers the `local docker` provider carrying that CA. A sandbox made through that provider
//! links with the CA pinned (no `--insecure`), and a command runs in it.

use std::time::Duration;

use computerd_tests::dev::Dev;
use computerd_tests::docker::Containers;
use computerd_tests::docker::containers_of;
use computerd_tests::docker::inspect;
use computerd_tests::wait_for;
use serde_json::Value;
use serde_json::json;

#[tokio::test]
async fn t10_dev_serves_docker_sandboxes_over_wss_with_its_ca() {
    let dev = Dev::start().await;
    let docker_line = &dev.docker_line;
    assert!(!docker_line.contains("off"), "Docker is here, so dev serves sandboxes: {docker_line}");
    let data = dev.data();
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let dev = &dev;
        async move { dev.call(method, &path, body).await }
    };
    let p = dev.docker_provider().await;
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
    // On the provider's own network (inter-container traffic off), whose gateway dev serves on.
    let networks = inspect(&container, "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}");
    assert_eq!(networks.trim(), "computerd-sandboxes");
    let gateway = inspect(&container, "{{range .NetworkSettings.Networks}}{{.Gateway}}{{end}}");
    assert!(url.starts_with(&format!("https://{gateway}:")), "dev listens on the network's gateway: {url} {gateway}");
    let body = json!({"command": "cat /proc/1/comm", "yieldTimeMs": 10_000});
    let (s, v) = call(reqwest::Method::POST, format!("/v1/computers/{id}/sessions"), Some(body)).await;
    assert_eq!((s, v["output"].as_str()), (200, Some("docker-init\n")), "{v}");
}
