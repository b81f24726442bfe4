//! Tool runtimes that outlive their container (issue 40), against the real Docker engine: a
//! sandbox made from a template that keeps its tool runtime in its writable layer (as sandboxes
//! made before runtime volumes did) gets two tool packages, each binding writes state into its
//! HOME and makes a call. `recreate` onto the default template migrates the runtime into the
//! Computer's runtime volume (stop, the engine's archive streamed into `computer-agent
//! load-runtime` in a loader container, publish, a new container, the old one removed); the
//! same binding ids then answer with their kept state, a finished call replays its answer, and
//! the container is new. A second recreate (the runtime already in the volume) keeps them again.
//! Delete removes the volume. An own machine is no recreate target.

use std::time::Duration;

use base64::Engine;
use computerd_tests::TestCluster;
use computerd_tests::docker::Containers;
use computerd_tests::docker::IMAGE;
use computerd_tests::docker::containers_of;
use computerd_tests::docker::docker_provider;
use computerd_tests::docker::inspect;
use computerd_tests::tools;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

fn volume_exists(name: &str) -> bool {
    std::process::Command::new("docker")
        .args(["volume", "inspect", name])
        .output()
        .expect("docker volume inspect")
        .status
        .success()
}

/// Waits for an execution to end; answers its receipt.
async fn settled(c: &TestCluster, exe: &str) -> Value {
    wait_for(&format!("execution {exe} to end"), Duration::from_secs(120), || async {
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/executions/{exe}"), &c.token, None).await;
        (v["state"] != "pending" && v["state"] != "running").then_some(v)
    })
    .await
}

async fn running(c: &TestCluster, id: &str) {
    wait_for(&format!("{id} to run"), Duration::from_secs(90), || async {
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        (v["state"] == "running").then_some(())
    })
    .await;
}

/// The one container of a Computer (its sandbox), once any other is gone.
async fn only_container(id: &str) -> String {
    wait_for("the Computer's one container", Duration::from_secs(30), || async {
        let mut all = containers_of(id);
        (all.len() == 1).then(|| all.pop()).flatten()
    })
    .await
}

/// A running sandbox of the `legacy` template (its runtime in its writable layer).
async fn legacy_sandbox(c: &TestCluster, provider: &str, key: &str) -> String {
    let body = json!({"commandKey": key, "name": key,
        "source": {"_tag": "Provider", "provider": provider, "template": "legacy"}});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    running(c, &id).await;
    id
}

/// A bot granted Computer `id`, and the fixture package uploaded into its workspace.
async fn bot_and_package(c: &TestCluster, id: &str, name: &str) -> (String, tools::Package) {
    let (s, bot) = c.call(Method::POST, 1, "/v1/bots", &c.token, Some(json!({"name": name}))).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    let (s, v) = c.call(Method::PUT, 1, &format!("/v1/computers/{id}/bots/{bot}"), &c.token, None).await;
    assert_eq!(s, 200, "{v}");
    let local = c.dir.path().join("local-workspace");
    let pkg = tools::pack(&c.dir.path().join("pkg"), &local, "server.tar.gz", None);
    let content =
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(local.join(&pkg.artifact)).expect("pkg"));
    let path = format!("/v1/computers/{id}/files?path={}", pkg.artifact);
    let (s, v) = c.call(Method::PUT, 1, &path, &c.token, Some(json!({"content": content, "encoding": "base64"}))).await;
    assert_eq!(s, 200, "{v}");
    (bot, pkg)
}

#[tokio::test]
async fn i40_a_recreate_migrates_the_runtime_then_keeps_it_and_the_bindings_answer_with_their_state() {
    let c = TestCluster::start(1).await;
    let templates = json!({"templates": {
        "default": {"image": IMAGE, "cpus": 1.0, "memoryMb": 512, "pids": 256},
        "legacy": {"image": IMAGE, "cpus": 1.0, "memoryMb": 512, "pids": 256, "runtimeVolume": false},
    }});
    let provider = docker_provider(&c, templates).await;
    let mut cleanup = Containers::default();
    let id = legacy_sandbox(&c, &provider, "rc-create").await;
    cleanup.track(&id);
    let volume = format!("computerd-runtime-{id}");
    let first = only_container(&id).await;
    assert_eq!(inspect(&first, "{{len .Mounts}}"), "1", "a legacy sandbox has no runtime volume (the agent only)");
    assert!(!volume_exists(&volume));

    // Two tool packages (the fixture server, and the same under another package id), uploaded
    // into the sandbox's workspace, installed by a bot.
    let (bot, pkg) = bot_and_package(&c, &id, "rcbot").await;
    let mut bindings = Vec::new();
    for package in ["example.mcp.server", "example.mcp.second"] {
        let mut manifest = tools::manifest("1.0.0", &pkg.digest);
        manifest["id"] = json!(package);
        let body = json!({"artifactPath": pkg.artifact, "manifest": manifest, "computerId": id});
        let (s, v) = c.call(Method::POST, 1, &format!("/api/bots/{bot}/tools/install"), &c.token, Some(body)).await;
        assert_eq!(s, 201, "{package}: {v}");
        bindings.push(v["bindingId"].as_str().expect("binding").to_string());
    }
    let call = |binding: String, op: String, tool: &'static str, arguments: Value| {
        let c = &c;
        let bot = bot.clone();
        async move {
            let body = json!({"operationId": op, "tool": tool, "arguments": arguments});
            let (s, v) =
                c.call(Method::POST, 1, &format!("/api/bots/{bot}/tools/{binding}/call"), &c.token, Some(body)).await;
            assert_eq!(s, 200, "{binding} {op}: {v}");
            v
        }
    };
    let mut homes = Vec::new();
    let mut echoes = Vec::new();
    for (i, b) in bindings.iter().enumerate() {
        let v = call(b.clone(), format!("state-{i}"), "write_state", json!({"text": format!("kept by {b}")})).await;
        assert_eq!(v["result"]["ok"]["content"][0]["text"], "written", "{v}");
        let v = call(b.clone(), format!("who-{i}"), "whoami", json!({})).await;
        let who = v["result"]["ok"]["content"][0]["text"].as_str().expect("whoami").to_string();
        homes.push(who.split_once(' ').expect("uid home").1.to_string());
        echoes.push(call(b.clone(), format!("echo-{i}"), "echo", json!({"text": format!("hello {i}")})).await);
    }

    // What a binding finds after a recreate: its state file, its finished call replayed.
    let check_kept = |round: &'static str| {
        let (bindings, homes, echoes) = (bindings.clone(), homes.clone(), echoes.clone());
        let call = &call;
        async move {
            for (i, b) in bindings.iter().enumerate() {
                let path = format!("{}/state.txt", homes[i]);
                let v = call(b.clone(), format!("{round}-read-{i}"), "read_file", json!({"path": path})).await;
                assert_eq!(v["result"]["ok"]["content"][0]["text"], format!("kept by {b}"), "{round}: {v}");
                let v = call(b.clone(), format!("echo-{i}"), "echo", json!({"text": format!("hello {i}")})).await;
                assert_eq!((&v["replayed"], &v["result"]), (&json!(true), &echoes[i]["result"]), "{round}: {v}");
            }
        }
    };

    // The migration.
    let recreate = |key: &'static str, template: Option<&'static str>| {
        let c = &c;
        let id = id.clone();
        async move {
            let mut body = json!({"commandKey": key});
            if let Some(t) = template {
                body["template"] = json!(t);
            }
            c.call(Method::POST, 1, &format!("/v1/computers/{id}/recreate"), &c.token, Some(body)).await
        }
    };
    let (s, v) = recreate("rc-migrate", Some("default")).await;
    assert_eq!(s, 202, "{v}");
    assert_eq!((v["kind"].as_str(), v["template"].as_str()), (Some("recreate"), Some("default")), "{v}");
    let (s, again) = recreate("rc-migrate", None).await;
    assert_eq!((s, again["error"]["kind"].as_str()), (422, Some("IdempotencyKeyReused")), "{again}");
    let exe = v["executionId"].as_str().expect("execution").to_string();
    let done = settled(&c, &exe).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    running(&c, &id).await;
    let second = only_container(&id).await;
    assert_ne!(second, first, "a new container");
    let mounts = inspect(&second, "{{range .Mounts}}{{.Name}} {{.Destination}};{{end}}");
    assert!(mounts.contains(&format!("{volume} /var/lib/computer-agent/runtime")), "{mounts}");
    let (_, computer) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(computer["source"]["template"], "default", "the Computer keeps the new template: {computer}");
    check_kept("migrated").await;

    // A recreate of a Computer whose runtime is in its volume already: no migration, kept again.
    let (s, v) = recreate("rc-again", None).await;
    assert_eq!(s, 202, "{v}");
    let done = settled(&c, v["executionId"].as_str().expect("execution")).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    running(&c, &id).await;
    let third = only_container(&id).await;
    assert_ne!(third, second);
    check_kept("recreated").await;
    let v = call(bindings[0].clone(), "after".into(), "echo", json!({"text": "new"})).await;
    assert_eq!(v["result"]["ok"]["content"][0]["text"], "new", "{v}");

    // An own machine is no recreate target.
    let body = json!({"commandKey": "own", "name": "own", "source": {"_tag": "Paired"}});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let own = v["resource"]["id"].as_str().expect("id").to_string();
    settled(&c, v["executionId"].as_str().expect("execution")).await;
    let (s, v) = c
        .call(Method::POST, 1, &format!("/v1/computers/{own}/recreate"), &c.token, Some(json!({"commandKey": "r"})))
        .await;
    assert_eq!((s, v["error"]["kind"].as_str()), (422, Some("ComputerUnsupported")), "{v}");

    // Delete removes the sandbox and its runtime volume.
    let (s, v) = c
        .call(Method::DELETE, 1, &format!("/v1/computers/{id}"), &c.token, Some(json!({"commandKey": "rc-del"})))
        .await;
    assert_eq!(s, 202, "{v}");
    let done = settled(&c, v["executionId"].as_str().expect("execution")).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(containers_of(&id).is_empty(), "no container left");
    assert!(!volume_exists(&volume), "the runtime volume goes with the Computer");
}

/// Recreates Computer `id` onto the default template; answers the execution.
async fn recreate_to(c: &TestCluster, id: &str, key: &str) -> String {
    let body = json!({"commandKey": key, "template": "default"});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/recreate"), &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    v["executionId"].as_str().expect("execution").to_string()
}

/// A legacy sandbox with one bound tool package and its state, for the fault test.
async fn legacy_with_a_binding(c: &TestCluster, provider: &str) -> (String, String, String) {
    let id = legacy_sandbox(c, provider, "f-create").await;
    let (bot, pkg) = bot_and_package(c, &id, "fbot").await;
    let body =
        json!({"artifactPath": pkg.artifact, "manifest": tools::manifest("1.0.0", &pkg.digest), "computerId": id});
    let (s, v) = c.call(Method::POST, 1, &format!("/api/bots/{bot}/tools/install"), &c.token, Some(body)).await;
    assert_eq!(s, 201, "{v}");
    let binding = v["bindingId"].as_str().expect("binding").to_string();
    let body = json!({"operationId": "state", "tool": "write_state", "arguments": {"text": "survives"}});
    let (s, v) = c.call(Method::POST, 1, &format!("/api/bots/{bot}/tools/{binding}/call"), &c.token, Some(body)).await;
    assert_eq!(s, 200, "{v}");
    (id, bot, binding)
}

/// Issue 40, items 3 and 4: a runtime volume that fills up stops the migration before publish,
/// with the reason; a loader killed between two publish steps fails the recreate too. Each time
/// the old container stays, stopped, the Computer is failed with the execution's error, and the
/// next recreate completes (the second finishing the killed loader's journaled publish), with
/// the binding's state kept.
#[tokio::test]
async fn i40_4_a_full_volume_or_a_killed_loader_keeps_the_old_sandbox_and_the_next_try_completes() {
    let mut c = TestCluster::start(1).await;
    let templates = json!({"templates": {
        "default": {"image": IMAGE, "cpus": 1.0, "memoryMb": 512, "pids": 256},
        "legacy": {"image": IMAGE, "cpus": 1.0, "memoryMb": 512, "pids": 256, "runtimeVolume": false},
    }});
    let provider = docker_provider(&c, templates).await;
    let mut cleanup = Containers::default();
    let (id, bot, binding) = legacy_with_a_binding(&c, &provider).await;
    cleanup.track(&id);
    let old = only_container(&id).await;
    let volume = format!("computerd-runtime-{id}");
    let kept_stopped = |what: &str| {
        assert_eq!(containers_of(&id), vec![old.clone()], "{what}: the old container alone is kept");
        assert_eq!(inspect(&old, "{{.State.Status}}"), "exited", "{what}: stopped");
    };

    // A volume of 16 KiB (tmpfs) that the engine answers when the adapter asks for the volume.
    let out = std::process::Command::new("docker")
        .args(["volume", "create", "--driver", "local", "--opt", "type=tmpfs", "--opt", "device=tmpfs"])
        .args(["--opt", "o=size=16k,mode=0755", &volume])
        .output()
        .expect("docker volume create");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let exe = recreate_to(&c, &id, "full").await;
    let done = settled(&c, &exe).await;
    assert_eq!(
        (done["state"].as_str(), done["error"]["kind"].as_str()),
        (Some("failed"), Some("recreate_failed")),
        "{done}"
    );
    let message = done["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("No space left on device") && message.contains("kept, stopped"), "{message}");
    let (_, computer) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(computer["state"], "failed", "{computer}");
    kept_stopped("a full volume");
    let rm = std::process::Command::new("docker").args(["volume", "rm", &volume]).output().expect("docker volume rm");
    assert!(rm.status.success(), "{}", String::from_utf8_lossy(&rm.stderr));

    // The loader paused after publishing its names, then killed there.
    c.kill(1);
    c.env.push(("COMPUTERD_LOAD_PAUSE_AT".into(), "moved".into()));
    c.spawn(1);
    c.wait_live(1).await;
    let exe = recreate_to(&c, &id, "killed").await;
    let loader = format!("computerd-load-{}", &old[..12]);
    wait_for("the loader to pause after moving", Duration::from_secs(60), || async {
        let out = std::process::Command::new("docker").args(["logs", &loader]).output().ok()?;
        String::from_utf8_lossy(&out.stderr).contains("paused at moved").then_some(())
    })
    .await;
    let killed = std::process::Command::new("docker").args(["kill", &loader]).output().expect("docker kill");
    assert!(killed.status.success(), "{}", String::from_utf8_lossy(&killed.stderr));
    let done = settled(&c, &exe).await;
    assert_eq!(
        (done["state"].as_str(), done["error"]["kind"].as_str()),
        (Some("failed"), Some("recreate_failed")),
        "{done}"
    );
    kept_stopped("a killed loader");

    c.kill(1);
    c.env.clear();
    c.spawn(1);
    c.wait_live(1).await;
    let exe = recreate_to(&c, &id, "again").await;
    let done = settled(&c, &exe).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(c.log_tail(1, 400).contains(r#""resumed":true"#), "the journaled publish was finished, not redone");
    running(&c, &id).await;
    assert_ne!(only_container(&id).await, old);
    let (_, who) = c
        .call(
            Method::POST,
            1,
            &format!("/api/bots/{bot}/tools/{binding}/call"),
            &c.token,
            Some(json!({"operationId": "who", "tool": "whoami", "arguments": {}})),
        )
        .await;
    let home = who["result"]["ok"]["content"][0]["text"]
        .as_str()
        .expect("whoami")
        .split_once(' ')
        .expect("home")
        .1
        .to_string();
    let body = json!({"operationId": "read", "tool": "read_file", "arguments": {"path": format!("{home}/state.txt")}});
    let (s, v) = c.call(Method::POST, 1, &format!("/api/bots/{bot}/tools/{binding}/call"), &c.token, Some(body)).await;
    assert_eq!((s, v["result"]["ok"]["content"][0]["text"].as_str()), (200, Some("survives")), "{v}");
}
