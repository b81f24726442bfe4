//! `computerd dev` as a new user runs it, with the local Docker engine: it pairs this machine,
//! serves its Docker sandboxes over WSS on the sandbox network's gateway with a local CA, and
//! registers the `local docker` provider carrying that CA. A sandbox made through that provider
//! links with the CA pinned (no `--insecure`), and a command runs in it. A tool package installs
//! and runs on the paired machine (dev lays out its data dir so a binding's UID reaches the
//! agent's runtime). Stopped, dev leaves its sandboxes running; `computerd dev --down` removes
//! them, and only them (not a container of another data dir, nor any other container).

use std::time::Duration;

use computerd_tests::computerd_bin;
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
    let dir = &dev.dir;
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        let dev = &dev;
        async move { dev.call(method, &path, body).await }
    };
    let p = dev.docker_provider().await;
    let url = p["config"]["serverUrl"].as_str().expect("serverUrl");
    assert!(url.starts_with("https://") && !url.contains("127.0.0.1"), "on the bridge, over TLS: {url}");
    let ca = std::fs::read_to_string(data.join("node/edge-tls/ca.crt")).expect("the local CA");
    assert_eq!(p["config"]["caCert"], ca.as_str(), "the provider hands the agents dev's CA");
    let provider = p["id"].as_str().expect("id").to_string();
    // Issue 39: the create it prints carries a key of its own each time (the same key again
    // would answer the first receipt and make nothing).
    assert!(dev.create_line.contains("\"commandKey\":\"create_"), "{}", dev.create_line);

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

    // A tool package on the paired machine `local` (its workspace is the agent's HOME).
    let (_, list) = call(reqwest::Method::GET, "/v1/computers".into(), None).await;
    let local = list["computers"].as_array().into_iter().flatten().find(|c| c["name"] == "local").cloned();
    let local = local.and_then(|c| c["id"].as_str().map(String::from)).unwrap_or_else(|| panic!("{list}"));
    let workspace = data.with_extension("home");
    let pkg = computerd_tests::tools::pack(&dir.path().join("pkg"), &workspace, "server.tar.gz", None);
    let (s, bot) = call(reqwest::Method::POST, "/v1/bots".into(), Some(json!({"name": "devbot"}))).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    let (s, v) = call(reqwest::Method::PUT, format!("/v1/computers/{local}/bots/{bot}"), None).await;
    assert_eq!(s, 200, "{v}");
    let body = json!({"artifactPath": pkg.artifact, "manifest": computerd_tests::tools::manifest("1.0.0", &pkg.digest), "computerId": local});
    let (s, v) = call(reqwest::Method::POST, format!("/api/bots/{bot}/tools/install"), Some(body)).await;
    assert_eq!(s, 201, "a tool installs on a fresh dev: {v}");
    let binding = v["bindingId"].as_str().expect("binding").to_string();
    let body = json!({"operationId": "op-1", "tool": "echo", "arguments": {"text": "hi"}});
    let (s, v) = call(reqwest::Method::POST, format!("/api/bots/{bot}/tools/{binding}/call"), Some(body)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["result"]["ok"]["content"][0]["text"], "hi", "{v}");
    // dev's layout: the node's files are its alone, the data dir only lets bindings pass.
    let mode = |p: &std::path::Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).expect("meta").permissions()) & 0o7777
    };
    assert_eq!((mode(&data), mode(&data.join("node"))), (0o711, 0o700));

    // Issue 39: Ctrl-C stops dev cleanly, with no error logged.
    let mut dev = dev;
    let log = dev.interrupt();
    assert!(!log.contains("ERROR"), "a clean stop logs no error:\n{log}");

    // Issue 39: the sandbox outlives dev (by design: the next dev finds it again) ...
    assert_eq!(containers_of(&id), vec![container.clone()], "stopping dev leaves its sandbox");
    // ... and `computerd dev --down` removes it, and nothing else: not a container carrying the
    // provider's label for another Computer, nor one whose agent pins another data dir's CA.
    let other_ca = "-----BEGIN CERTIFICATE-----\nanother data dir's CA\n-----END CERTIFICATE-----\n";
    let mut others = Vec::new();
    for (n, env) in [("none", "X=1".to_string()), ("other-ca", format!("COMPUTER_AGENT_CA_PEM={other_ca}"))] {
        let label = format!("cmp_t65-{n}-{}", std::process::id());
        cleanup.track(&label);
        let out = std::process::Command::new("docker")
            .args(["run", "-d", "--label", &format!("computerd.computer={label}"), "-e", &env])
            .args([computerd_tests::docker::IMAGE, "sleep", "600"])
            .output()
            .expect("docker run");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        others.push(label);
    }
    let down = |what: &str| {
        let out = std::process::Command::new(computerd_bin())
            .args(["dev", "--down", "--data"])
            .arg(&data)
            .env("COMPUTERD_LOG", "warn")
            .output()
            .expect("computerd dev --down");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{what}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    let text = down("the first --down");
    assert!(text.contains(&format!("removed the sandbox of {id}")), "{text}");
    assert!(text.lines().last() == Some("removed 1 sandbox"), "one line each, then the count: {text}");
    assert_eq!(containers_of(&id), Vec::<String>::new(), "the sandbox is gone");
    for label in &others {
        assert_eq!(containers_of(label).len(), 1, "{label} is not dev's: left alone");
    }
    let text = down("the second --down");
    assert_eq!(text.trim(), "removed 0 sandboxes", "nothing left to remove");
}
