//! The docker provider against the real Docker engine: sandboxes whose `computer-agent` dials
//! the cluster, pause that keeps processes, a call that resumes a paused sandbox, delete that
//! really removes the container, usage spans, and the shared idle-pause plan.

use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::wait_state;
use computerd_tests::docker::Containers;
use computerd_tests::docker::containers_of;
use computerd_tests::docker::docker_provider;
use computerd_tests::docker::inspect;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

async fn create(c: &TestCluster, provider: &str, key: &str, pause_after: Value) -> String {
    create_receipt(c, provider, key, pause_after).await["resource"]["id"].as_str().expect("computer id").to_string()
}

async fn create_receipt(c: &TestCluster, provider: &str, key: &str, pause_after: Value) -> Value {
    let body = json!({
        "commandKey": key, "name": key,
        "source": {"_tag": "Provider", "provider": provider, "template": null},
        "pauseAfter": pause_after,
    });
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    v
}

async fn run(c: &TestCluster, id: &str, command: &str, yield_ms: u32) -> Value {
    let body = json!({"command": command, "yieldTimeMs": yield_ms});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(body)).await;
    assert_eq!(s, 200, "{v}");
    v
}

async fn lifecycle(c: &TestCluster, id: &str, what: &str, key: &str) {
    let url = format!("/v1/computers/{id}{what}");
    let method = if what.is_empty() { Method::DELETE } else { Method::POST };
    let (s, v) = c.call(method, 1, &url, &c.token, Some(json!({"commandKey": key}))).await;
    assert_eq!(s, 202, "{v}");
}

/// create -> running once the agent in the container links -> a command runs in the container
/// -> pause freezes it -> a command on the paused Computer resumes it first, and a process
/// started before the pause is still there -> delete removes the container; the usage spans
/// are the two running periods.
/// A sandbox whose agent cannot reach the cluster (the provider's serverUrl leads nowhere)
/// stays `starting`, and says what it waits for and since when.
#[tokio::test]
async fn t15_a_sandbox_whose_agent_never_links_says_why() {
    let c = TestCluster::start(1).await;
    // A port nothing listens on.
    let nowhere = format!("http://127.0.0.1:{}", computerd_tests::free_port());
    let provider = docker_provider(&c, json!({"serverUrl": nowhere})).await;
    let mut cleanup = Containers::default();
    let id = create(&c, &provider, "nowhere", json!(null)).await;
    cleanup.track(&id);
    let v = wait_for("the create to be done", Duration::from_secs(60), || async {
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        (v["starting"]["waitingFor"] == "agent").then_some(v)
    })
    .await;
    assert_eq!(v["state"], "starting", "{v}");
    assert!(v["starting"]["since"].as_u64().is_some_and(|t| t >= v["createdAt"].as_u64().unwrap_or(u64::MAX)), "{v}");
    assert!(v["starting"]["detail"].as_str().is_some_and(|d| d.contains("serverUrl")), "{v}");
}

#[tokio::test]
async fn t10_create_run_pause_autoresume_delete() {
    let c = TestCluster::start(1).await;
    let provider = docker_provider(&c, json!({})).await;
    let mut cleanup = Containers::default();
    let id = create(&c, &provider, "d1", Value::Null).await;
    cleanup.track(&id);
    wait_state(&c, &id, "running").await;
    let containers = containers_of(&id);
    assert_eq!(containers.len(), 1, "exactly one container");
    let container = &containers[0];
    assert_eq!(inspect(container, "{{index .Config.Labels \"computerd.command-key\"}}"), "d1");
    assert_eq!(inspect(container, "{{.HostConfig.Memory}}"), (512u64 << 20).to_string(), "the template's limit");

    let v = run(&c, &id, "cat /proc/1/comm; echo $$; exec sleep 1000", 500).await;
    assert_eq!(v["running"], true, "{v}");
    let out = v["output"].as_str().expect("output").to_string();
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("docker-init"), "the command runs in the container (its init is PID 1)");
    let pid: u32 = lines.next().and_then(|l| l.trim().parse().ok()).expect("pid");
    let sleeper = v["session"].as_str().expect("session").to_string();

    lifecycle(&c, &id, "/pause", "d1-pause").await;
    wait_state(&c, &id, "paused").await;
    assert_eq!(inspect(container, "{{.State.Paused}}"), "true", "the container is frozen");

    // A command on the paused Computer resumes it first.
    let v = run(&c, &id, &format!("kill -0 {pid} && echo alive"), 10_000).await;
    assert_eq!((v["running"].clone(), v["output"].clone()), (json!(false), json!("alive\n")), "{v}");
    assert_eq!(inspect(container, "{{.State.Paused}}"), "false");
    let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(v["state"], "running");
    let body = json!({"chars": "", "yieldTimeMs": 250});
    let url = format!("/v1/computers/{id}/sessions/{sleeper}/input");
    let (s, v) = c.call(Method::POST, 1, &url, &c.token, Some(body)).await;
    assert_eq!((s, v["running"].clone()), (200, json!(true)), "the session from before the pause lives: {v}");

    lifecycle(&c, &id, "", "d1-delete").await;
    wait_for("the delete to finish", Duration::from_secs(30), || async {
        let (s, _) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        (s == 404).then_some(())
    })
    .await;
    assert!(containers_of(&id).is_empty(), "the container is gone");

    let (s, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/usage"), &c.token, None).await;
    assert_eq!(s, 200, "{v}");
    let spans = v["spans"].as_array().expect("spans");
    let ends: Vec<&str> = spans.iter().map(|s| s["endedBy"].as_str().unwrap_or("open")).collect();
    assert_eq!(ends, ["pause", "delete"], "{v}");
    assert!(spans.iter().all(|s| s["outcomeUnknown"] == false && s["end"].as_u64() >= s["start"].as_u64()));
}

/// With `pauseAfter: 3`, an idle sandbox is paused by the plan's scheduler while one that runs
/// a command is not; that one is paused once its command has ended and 3 s passed.
#[tokio::test]
async fn t20_idle_pause_spares_running_commands() {
    let c = TestCluster::start(1).await;
    let provider = docker_provider(&c, json!({})).await;
    let mut cleanup = Containers::default();
    let idle = create(&c, &provider, "idle", json!(3)).await;
    cleanup.track(&idle);
    let busy = create(&c, &provider, "busy", json!(3)).await;
    cleanup.track(&busy);
    wait_state(&c, &idle, "running").await;
    wait_state(&c, &busy, "running").await;
    let v = run(&c, &busy, "sleep 9; echo done", 250).await;
    let sid = v["session"].as_str().expect("session").to_string();

    wait_state(&c, &idle, "paused").await;
    let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{busy}"), &c.token, None).await;
    assert_eq!(v["state"], "running", "a running command is work");
    let container = &containers_of(&idle)[0];
    assert_eq!(inspect(container, "{{.State.Paused}}"), "true");

    // The busy one's command ends after its wait; only then does it idle into a pause.
    let ended = wait_for("the busy command to end", Duration::from_secs(20), || async {
        let (_, v) = c.call(Method::GET, 1, "/v1/events?limit=1000", &c.token, None).await;
        let events = v["events"].as_array().cloned().unwrap_or_default();
        events.into_iter().find(|e| e["type"] == "computer_session" && e["data"]["sessionId"] == sid.as_str())
    })
    .await;
    let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{busy}"), &c.token, None).await;
    assert_eq!(v["state"], "running", "not paused while its command ran: {ended}");
    wait_state(&c, &busy, "paused").await;
    let (_, v) = c.call(Method::GET, 1, "/v1/events?limit=1000", &c.token, None).await;
    let scheduled: Vec<&Value> = v["events"]
        .as_array()
        .map(|e| e.iter().filter(|e| e["type"] == "IdlePauseScheduled").collect())
        .unwrap_or_default();
    assert_eq!(scheduled.len(), 2, "one idle pause each: {scheduled:?}");
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The first `computer_session` event of session `sid`, if it came yet.
async fn session_end(c: &TestCluster, sid: &str) -> Option<Value> {
    let (_, v) = c.call(Method::GET, 1, "/v1/events?limit=1000", &c.token, None).await;
    let mut after = 0;
    let mut page = v;
    loop {
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if let Some(e) = events.iter().find(|e| e["type"] == "computer_session" && e["data"]["sessionId"] == sid) {
            return Some(e.clone());
        }
        after = events.last().and_then(|e| e["seq"].as_u64())?.max(after);
        page = c.call(Method::GET, 1, &format!("/v1/events?after={after}&limit=1000"), &c.token, None).await.1;
    }
}

/// The idle-pause race: 21 commands, each started within 100 ms of the Computer's idle deadline
/// (from 100 ms before it to 100 ms after, in 10 ms steps), against a real sandbox whose agent
/// runs them. The scheduler wakes at the deadline, so it often asks for the pause first. No
/// command is frozen: a pause not yet sent is cancelled by the call, one already sent is
/// waited for and the Computer resumed before the command starts. A frozen command would never
/// end (nothing else calls the agent to resume it).
#[tokio::test]
async fn t25_commands_at_the_idle_deadline_are_never_frozen() {
    let c = TestCluster::start(1).await;
    let provider = docker_provider(&c, json!({})).await;
    let mut cleanup = Containers::default();
    let id = create(&c, &provider, "edge", json!(3)).await;
    cleanup.track(&id);
    wait_state(&c, &id, "running").await;
    let path = format!("/v1/computers/{id}");
    let mut frozen = Vec::new();
    for i in 0..21i64 {
        let offset = -100 + 10 * i;
        // Every mark of the previous command is in once the deadline is this near (marks come
        // at least every second while it runs, and within a second after it ended).
        let deadline = wait_for("the idle deadline to come near", Duration::from_secs(30), || async {
            let (_, v) = c.call(Method::GET, 1, &path, &c.token, None).await;
            match (v["state"].as_str(), v["idlePauseAt"].as_u64()) {
                (Some("running"), Some(d)) if d <= now_ms() + 500 => Some(d),
                _ => None,
            }
        })
        .await;
        // Stimulus timing, not synchronisation: the call is placed `offset` ms from the deadline.
        let at = deadline.saturating_add_signed(offset);
        tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
        let v = run(&c, &id, "sleep 0.5; echo ok", 250).await;
        let sid = v["session"].as_str().expect("session").to_string();
        let waited = std::time::Instant::now();
        let mut end = None;
        while waited.elapsed() < Duration::from_secs(10) {
            end = session_end(&c, &sid).await;
            if end.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let end = match end {
            Some(e) => e,
            None => {
                frozen.push((offset, inspect(&containers_of(&id)[0], "{{.State.Paused}}")));
                // Thaw it (a call resumes a paused Computer) so the next round can run.
                let body = json!({"chars": "", "yieldTimeMs": 2000});
                c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions/{sid}/input"), &c.token, Some(body))
                    .await;
                wait_for("the frozen command to end after a resume", Duration::from_secs(30), || session_end(&c, &sid))
                    .await
            }
        };
        assert_eq!(end["data"]["exitCode"], 0, "{end}");
    }
    let (_, v) = c.call(Method::GET, 1, "/v1/events?limit=1000", &c.token, None).await;
    let count = |kind: &str| v["events"].as_array().map_or(0, |e| e.iter().filter(|e| e["type"] == kind).count());
    let (scheduled, cancelled) = (count("IdlePauseScheduled"), count("IdlePauseCancelled"));
    let paused = v["events"]
        .as_array()
        .map_or(0, |e| e.iter().filter(|e| e["type"] == "ComputerStateChanged" && e["data"]["to"] == "paused").count());
    println!(
        "21 commands at the deadline: {scheduled} idle pauses scheduled, {cancelled} cancelled by a call, {paused} sent and resumed; frozen: {frozen:?}"
    );
    assert!(frozen.is_empty(), "commands frozen by an idle pause (offset ms, container paused): {frozen:?}");
    assert!(scheduled >= 1, "the scheduler never got there first: the race was not exercised");
}

/// A proxy of the Docker socket that passes everything through, except that once a container
/// start has been sent on a connection, the engine's answers on it are swallowed: the start
/// happens, its answer is lost.
struct LosingProxy {
    path: std::path::PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl LosingProxy {
    fn start(path: std::path::PathBuf) -> Self {
        let listener = tokio::net::UnixListener::bind(&path).expect("bind proxy socket");
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(engine) = tokio::net::UnixStream::connect("/var/run/docker.sock").await else { return };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut er, mut ew) = engine.into_split();
                    let swallow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let s = swallow.clone();
                    let up = async move {
                        use tokio::io::AsyncReadExt;
                        use tokio::io::AsyncWriteExt;
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = cr.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            let text = String::from_utf8_lossy(&buf[..n]);
                            if text.starts_with("POST") && text.lines().next().is_some_and(|l| l.contains("/start")) {
                                s.store(true, std::sync::atomic::Ordering::SeqCst);
                            }
                            if ew.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    let down = async move {
                        use tokio::io::AsyncReadExt;
                        use tokio::io::AsyncWriteExt;
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = er.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            if swallow.load(std::sync::atomic::Ordering::SeqCst) {
                                continue;
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::join!(up, down);
                });
            }
        });
        LosingProxy { path, task }
    }
}

impl Drop for LosingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The node is SIGKILLed while the engine's answer to a create is outstanding (the container was
/// made and started; the answer never came): after the restart the create is `outcome_unknown`,
/// never re-sent, so exactly one container exists; the inspection route finds it by its labels;
/// a member's decision settles the create, and the Computer can then be deleted for real.
#[tokio::test]
async fn t30_node_killed_during_create() {
    let mut c = TestCluster::start(1).await;
    let proxy = LosingProxy::start(c.dir.path().join("docker.sock"));
    let endpoint = format!("unix://{}", proxy.path.display());
    let provider = docker_provider(&c, json!({"endpoint": endpoint, "timeoutMs": 120_000})).await;
    let mut cleanup = Containers::default();
    let receipt = create_receipt(&c, &provider, "lost", Value::Null).await;
    let id = receipt["resource"]["id"].as_str().expect("computer id").to_string();
    let exe_id = receipt["executionId"].as_str().expect("execution id").to_string();
    cleanup.track(&id);
    let container = wait_for("the container to run", Duration::from_secs(30), || async {
        let list = containers_of(&id);
        (list.len() == 1 && inspect(&list[0], "{{.State.Running}}") == "true").then(|| list[0].clone())
    })
    .await;
    let (_, exe) = c.call(Method::GET, 1, &format!("/v1/executions/{exe_id}"), &c.token, None).await;
    assert_eq!(exe["state"], "running", "the answer is still outstanding: {exe}");

    c.kill(1);
    c.spawn(1);
    let exe = wait_for("the create to be declared unknown", Duration::from_secs(30), || async {
        // Connections kept from before the kill fail once: a failed send is "not yet".
        let r = c.req(Method::GET, 1, &format!("/v1/executions/{exe_id}"), &c.token).send().await.ok()?;
        let v: Value = r.json().await.ok()?;
        (v["state"] == "outcome_unknown").then_some(v)
    })
    .await;
    assert_eq!(exe["error"]["kind"], "outcome_unknown", "{exe}");
    assert_eq!(containers_of(&id), vec![container.clone()], "never re-sent: still exactly one container");

    let (s, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/sandbox"), &c.token, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["found"].clone(), v["sandbox"].clone(), v["state"].clone()),
        (json!(true), json!(container), json!("running"))
    );

    let body = json!({"outcome": "succeeded", "reason": "the container is there, found by its labels"});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/executions/{exe_id}/decision"), &c.token, Some(body)).await;
    assert_eq!((s, v["state"].clone()), (200, json!("succeeded")), "{v}");
    lifecycle(&c, &id, "", "lost-delete").await;
    wait_for("the delete to finish", Duration::from_secs(30), || async {
        let (s, _) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        (s == 404).then_some(())
    })
    .await;
    assert!(containers_of(&id).is_empty(), "the decided sandbox was deleted by its name");
}

/// A container removed behind the cluster's back is detected by the leader's sandbox watch and
/// reported: the Computer is `failed`, a `SandboxVanished` event names it, and its run span is
/// closed as a failure.
#[tokio::test]
async fn t40_a_vanished_container_is_reported() {
    let c = TestCluster::start_with(1, &["--sandbox-watch-secs", "0.5"]).await;
    let provider = docker_provider(&c, json!({})).await;
    let mut cleanup = Containers::default();
    let id = create(&c, &provider, "gone", Value::Null).await;
    cleanup.track(&id);
    wait_state(&c, &id, "running").await;
    let container = containers_of(&id).pop().expect("container");
    let out = std::process::Command::new("docker").args(["rm", "-f", &container]).output().expect("docker rm");
    assert!(out.status.success());
    wait_state(&c, &id, "failed").await;
    let (_, v) = c.call(Method::GET, 1, "/v1/events?limit=1000", &c.token, None).await;
    let vanished = v["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["type"] == "SandboxVanished" && e["computerId"] == id.as_str()).cloned());
    assert!(vanished.is_some(), "{v}");
    let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/usage"), &c.token, None).await;
    assert_eq!(v["spans"][0]["endedBy"], "failure", "{v}");
}
