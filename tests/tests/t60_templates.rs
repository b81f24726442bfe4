//! Templates of your own (issue 39 item 3), with the real Docker engine: the example in
//! `examples/templates/` (a Dockerfile `FROM computerd-sandbox:latest` that adds a Debian
//! package and a file) is built with `docker build`, named in a provider's `templates`, and a
//! Computer of that template has both. An image without `/workspace`, or without the agent
//! (and no `agentBinary` to mount one), or one that does not exist, is refused at registration
//! with `template_invalid` and the reason; an image that went bad after the registration fails
//! the create with `template_invalid` before any container of the Computer exists.

use std::path::Path;
use std::process::Command;

use computerd_tests::TestCluster;
use computerd_tests::agent::wait_state;
use computerd_tests::docker::Containers;
use computerd_tests::docker::IMAGE;
use computerd_tests::docker::containers_of;
use computerd_tests::docker::docker_provider;
use computerd_tests::docker::ensure_sandbox_image;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// Images this test built, removed at its end.
#[derive(Default)]
struct Images(Vec<String>);

impl Images {
    /// Builds `tag` from `dir` (a Dockerfile there, or `dockerfile` written into a fresh dir).
    fn build(&mut self, tag: &str, dir: &Path) {
        let out = Command::new("docker").args(["build", "-q", "-t", tag]).arg(dir).output().expect("docker build");
        assert!(out.status.success(), "docker build {tag}: {}", String::from_utf8_lossy(&out.stderr));
        self.0.push(tag.to_string());
    }

    fn build_from(&mut self, tag: &str, dockerfile: &str, scratch: &Path) {
        let dir = scratch.join(tag.replace([':', '/'], "-"));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("Dockerfile"), dockerfile).expect("Dockerfile");
        self.build(tag, &dir);
    }
}

impl Drop for Images {
    fn drop(&mut self) {
        for tag in &self.0 {
            let _ = Command::new("docker").args(["rmi", "-f", tag]).output();
        }
    }
}

async fn register(c: &TestCluster, name: &str, templates: Value, mount_agent: bool) -> (u16, Value) {
    let mut config = json!({"serverUrl": c.url(1, ""), "network": "host", "templates": templates});
    if mount_agent {
        config["agentBinary"] = json!(computerd_tests::agent::agent_bin().to_string_lossy());
    }
    let body = json!({"kind": "docker", "name": name, "config": config});
    c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await
}

#[tokio::test]
async fn t10_a_template_of_your_own_and_the_images_that_cannot_be_one() {
    ensure_sandbox_image();
    let c = TestCluster::start(1).await;
    let mut images = Images::default();
    let n = hex::encode(rand::random::<[u8; 4]>());
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/templates");
    let mine = format!("computerd-test-template:{n}");
    images.build(&mine, &example);

    // The example's template: its package and its file are in the sandbox.
    let templates = json!({"default": {"image": IMAGE, "memoryMb": 512, "pids": 256},
                           "mine": {"image": mine, "memoryMb": 512, "pids": 256}});
    let provider = docker_provider(&c, json!({"templates": templates})).await;
    let mut cleanup = Containers::default();
    let body = json!({"commandKey": "tpl", "name": "tpl", "source": {"_tag": "Provider", "provider": provider, "template": "mine"}});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&id);
    wait_state(&c, &id, "running").await;
    let run =
        json!({"command": "tree --version | head -c 4; echo; cat /workspace/hello.txt; id -un", "yieldTimeMs": 10_000});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(run)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["output"], "tree\nThis file came with the template.\nuser\n", "{v}");

    // Images that cannot be a sandbox are refused at registration, with the reason.
    let scratch = c.dir.path().join("images");
    let no_workspace = format!("computerd-test-no-workspace:{n}");
    images.build_from(&no_workspace, &format!("FROM {IMAGE}\nRUN rm -rf /workspace\n"), &scratch);
    let no_agent = format!("computerd-test-no-agent:{n}");
    images.build_from(&no_agent, &format!("FROM {IMAGE}\nRUN rm /usr/local/bin/computer-agent\n"), &scratch);
    let cases = [
        ("no-workspace", json!({"default": {"image": no_workspace}}), true, "/workspace"),
        ("no-agent", json!({"default": {"image": no_agent}}), false, "no agent"),
        ("missing", json!({"default": {"image": format!("computerd-test-missing:{n}")}}), true, "no such image"),
    ];
    for (name, templates, mount, why) in cases {
        let (s, v) = register(&c, name, templates, mount).await;
        assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("template_invalid")), "{name}: {v}");
        assert!(v["error"]["message"].as_str().unwrap_or_default().contains(why), "{name}: {v}");
    }
    // The agent mounted by the provider stands in for the image's own.
    let (s, v) = register(&c, "mounted", json!({"default": {"image": no_agent}}), true).await;
    assert_eq!(s, 201, "{v}");
    let (_, list) = c.call(Method::GET, 1, "/v1/computer-providers", &c.token, None).await;
    let names: Vec<&str> =
        list["providers"].as_array().expect("providers").iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(!names.iter().any(|n| ["no-workspace", "no-agent", "missing"].contains(n)), "nothing stored: {names:?}");

    // An image that went bad after the registration: the create fails before any container.
    let drifting = format!("computerd-test-drifting:{n}");
    let (s, v) =
        register(&c, "drifting", json!({"default": {"image": IMAGE}, "later": {"image": drifting}}), true).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("template_invalid")), "not built yet: {v}");
    images.build_from(&drifting, &format!("FROM {IMAGE}\n"), &scratch);
    let (s, v) =
        register(&c, "drifting", json!({"default": {"image": IMAGE}, "later": {"image": drifting}}), true).await;
    assert_eq!(s, 201, "{v}");
    let later = v["id"].as_str().expect("id").to_string();
    images.build_from(&drifting, &format!("FROM {IMAGE}\nRUN rm -rf /workspace\n"), &scratch);
    let body = json!({"commandKey": "drift", "name": "drift", "source": {"_tag": "Provider", "provider": later, "template": "later"}});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let drift = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&drift);
    let exe = v["executionId"].as_str().expect("execution").to_string();
    let done = c.settle(1, &exe, &c.token).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert_eq!(done["error"]["kind"], "template_invalid", "{done}");
    assert!(containers_of(&drift).is_empty(), "no container of the Computer was made");
}
