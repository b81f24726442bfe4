//! The docker provider against the real Docker engine: sandboxes whose `computer-agent` dials
//! the cluster, pause that keeps processes, a call that resumes a paused sandbox, delete that
//! really removes the container, usage spans, the shared idle-pause plan, and what a sandbox on
//! the provider's own network may reach (`i36_4b`: the host but for its agents' port, private and
//! link-local ranges but for those its template opens).

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
    let v = wait_state(&c, &id, "running").await;
    // Issue 39: a sandbox is no paired machine, though its agent has a credential.
    assert_eq!(v["paired"], false, "{v}");
    // A lifecycle call without its body says what it needs.
    let (s, e) = c.call(Method::DELETE, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(s, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap_or_default().contains("commandKey"), "{e}");
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
/// closed as a failure. So is a container that exited (killed here; an agent that dies at start
/// does the same), with the reason, instead of staying `running` (or `starting`) with no agent.
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

    let id = create(&c, &provider, "ended", Value::Null).await;
    cleanup.track(&id);
    wait_state(&c, &id, "running").await;
    let container = containers_of(&id).pop().expect("container");
    let out = std::process::Command::new("docker").args(["kill", &container]).output().expect("docker kill");
    assert!(out.status.success());
    wait_state(&c, &id, "failed").await;
    let (_, v) = c.call(Method::GET, 1, "/v1/events?limit=1000", &c.token, None).await;
    let ended = v["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["type"] == "SandboxVanished" && e["computerId"] == id.as_str()).cloned());
    let reason = ended.as_ref().and_then(|e| e["data"]["reason"].as_str()).unwrap_or_default();
    assert!(reason.contains("\"exited\""), "the event says the sandbox exited: {ended:?}");
    assert_eq!(containers_of(&id).len(), 1, "the exited container is kept for a look (until the Computer is deleted)");
}

// Issue 36, item 4b: a sandbox on the provider's own network reaches neither the host (but for
// the port its agents dial) nor the private and link-local ranges, unless its template opens
// them. Every target here is on this machine: a listener of the test's own, the host's
// addresses, and a network namespace with a veth pair (10.254.36.0/24, and 169.254.169.254 routed
// into it for packets from the sandbox bridges only).

mod i36_4b {
    use std::io::Read;
    use std::io::Write;
    use std::net::SocketAddr;
    use std::process::Command;
    use std::time::Duration;

    use computerd_tests::dev::Dev;
    use computerd_tests::docker::Containers;
    use computerd_tests::docker::IMAGE;
    use computerd_tests::docker::containers_of;
    use computerd_tests::docker::inspect;
    use computerd_tests::wait_for;
    use reqwest::Method;
    use serde_json::Value;
    use serde_json::json;

    /// Runs a command; its stdout; panics with its stderr when it fails.
    fn sh(args: &[&str]) -> String {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command, ignoring failure (clean-up of what may not be there).
    fn quiet(args: &[&str]) {
        let _ = Command::new(args[0]).args(&args[1..]).output();
    }

    /// From inside `container`: opens a TCP connection to `ip:port` (5 s) and reads up to 5 bytes
    /// when `read`: what it read (or `open`), else `blocked <errno>`.
    fn probe(container: &str, ip: &str, port: u16, read: bool) -> String {
        let code = format!(
            "import errno, socket\n\
             try:\n    c = socket.create_connection(('{ip}', {port}), timeout=5)\n\
             \x20   print(c.recv(5).decode() if {read} else 'open')\n\
             except OSError as e:\n    print('blocked', errno.errorcode.get(e.errno, type(e).__name__))\n",
            read = if read { "True" } else { "False" },
        );
        let out = Command::new("docker").args(["exec", container, "python3", "-c", &code]).output().expect("exec");
        assert!(out.status.success(), "probe in {container}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A listener on the host, on every address, that answers `hello` to each connection.
    fn host_listener() -> u16 {
        let l = std::net::TcpListener::bind("0.0.0.0:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let _ = c.write_all(b"hello");
            }
        });
        port
    }

    /// What the host itself reads from `ip:port` (the target is really there).
    fn host_reads(ip: &str, port: u16) -> String {
        let addr = SocketAddr::new(ip.parse().expect("ip"), port);
        let mut c = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("the host cannot reach {addr}: {e}"));
        c.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut s = String::new();
        let _ = c.read_to_string(&mut s);
        s
    }

    async fn create(dev: &Dev, provider: &str, key: &str, template: Option<&str>, cleanup: &mut Containers) -> String {
        let body = json!({"commandKey": key, "name": key,
            "source": {"_tag": "Provider", "provider": provider, "template": template}});
        let (s, v) = dev.call(Method::POST, "/v1/computers", Some(body)).await;
        assert_eq!(s, 202, "{v}");
        let id = v["resource"]["id"].as_str().expect("id").to_string();
        cleanup.track(&id);
        wait_for("the sandbox's agent to link", Duration::from_secs(90), || async {
            let (_, c) = dev.call(Method::GET, &format!("/v1/computers/{id}"), None).await;
            (c["state"] == "running").then_some(())
        })
        .await;
        containers_of(&id).pop().expect("the container")
    }

    /// The host and port of dev's sandbox URL (`https://<gateway>:<port>`).
    fn gateway_and_port(provider: &Value) -> (String, u16) {
        let url = provider["config"]["serverUrl"].as_str().expect("serverUrl");
        let hostport = url.trim_start_matches("https://");
        let (h, p) = hostport.rsplit_once(':').expect("port");
        (h.to_string(), p.parse().expect("port"))
    }

    /// The container's bridge and gateway on its one network.
    fn bridge_of(container: &str) -> (String, String) {
        let net = inspect(container, "{{range .NetworkSettings.Networks}}{{.NetworkID}}{{end}}");
        let gw = inspect(container, "{{range .NetworkSettings.Networks}}{{.Gateway}}{{end}}");
        assert!(net.len() >= 12 && !gw.is_empty(), "{net} {gw}");
        (format!("br-{}", &net[..12]), gw)
    }

    #[tokio::test]
    async fn i36_4b_a_sandbox_reaches_no_host_port_but_its_agents() {
        let dev = Dev::start().await;
        assert!(!dev.docker_line.contains("off"), "Docker is here: {}", dev.docker_line);
        let provider = dev.docker_provider().await;
        let (gateway, agent_port) = gateway_and_port(&provider);
        let id = provider["id"].as_str().expect("id").to_string();
        let mut cleanup = Containers::default();
        // The agent links through the gateway: the agents' port stays open.
        let sandbox = create(&dev, &id, "i36-host", None, &mut cleanup).await;
        assert_eq!(probe(&sandbox, &gateway, agent_port, false), "open", "the agents' port on the gateway");

        // Every other port of the host, on the gateway and on the host's other addresses.
        let port = host_listener();
        let mut targets = vec![gateway.clone()];
        for line in sh(&["ip", "-4", "-o", "addr", "show", "scope", "global"]).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let (Some(ifname), Some(addr)) = (words.get(1), words.get(3)) else { continue };
            let ip = addr.split('/').next().unwrap_or_default();
            // Only interfaces no concurrent test adds or removes.
            if ["br-", "veth", "cdi36"].iter().any(|p| ifname.starts_with(p)) || ip == gateway {
                continue;
            }
            targets.push(ip.to_string());
        }
        assert!(targets.len() >= 2, "the gateway and another host address: {targets:?}");
        for ip in &targets {
            assert_eq!(host_reads(ip, port), "hello", "the listener answers on {ip}");
            let got = probe(&sandbox, ip, port, true);
            assert!(got.starts_with("blocked"), "the sandbox reached the host's port {port} on {ip}: {got}");
        }

        // Rules flushed behind the node's back come back by themselves (the sandbox watch's
        // pass refills them; so does a node's first pass after a restart).
        let (bridge, _) = bridge_of(&sandbox);
        let chain = format!("COMPUTERD-I-{bridge}");
        let jump = ["-i", bridge.as_str(), "-j", chain.as_str()];
        sh(&[&["iptables", "-w", "-D", "INPUT"][..], &jump[..]].concat());
        sh(&["iptables", "-w", "-F", &chain]);
        wait_for("the rules to be refilled", Duration::from_secs(60), || async {
            let back = Command::new("iptables").args([&["-w", "-C", "INPUT"][..], &jump[..]].concat()).output();
            let rules = sh(&["iptables", "-w", "-S", &chain]);
            // This node's own pass puts its agents' port back: another node on the same network
            // may refill the chain first, keeping only the ports it still found there.
            let port_back = rules.lines().any(|l| l.contains(&format!("--dport {agent_port} ")));
            (back.is_ok_and(|o| o.status.success()) && rules.contains("REJECT") && port_back).then_some(())
        })
        .await;
        let got = probe(&sandbox, &gateway, port, true);
        assert!(got.starts_with("blocked"), "after the refill: {got}");
        assert_eq!(probe(&sandbox, &gateway, agent_port, false), "open", "the agents' port after the refill");
    }

    /// The namespace `cdi36-4b` with 10.254.36.2 and .3 on a veth pair from the host
    /// (10.254.36.1), and 169.254.169.254 on its loopback, routed there only for packets from
    /// the bridges given to [`Lan::route_metadata`]. A listener in it answers `hello` on every
    /// address. Removed on drop (left-overs of an earlier run first).
    struct Lan {
        listener: std::process::Child,
        port: u16,
        bridges: Vec<String>,
    }

    const NS: &str = "cdi36-4b";
    const HOST_IF: &str = "cdi36h";
    const NS_IF: &str = "cdi36n";
    const TABLE: &str = "3604";

    impl Lan {
        fn start() -> Lan {
            Lan::remove(&[]);
            let taken = sh(&["ip", "-4", "route", "show", "match", "10.254.36.2"]);
            assert!(taken.lines().all(|l| l.starts_with("default")), "10.254.36.0/24 is in use here: {taken}");
            sh(&["ip", "netns", "add", NS]);
            sh(&["ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF]);
            sh(&["ip", "link", "set", NS_IF, "netns", NS]);
            sh(&["ip", "addr", "add", "10.254.36.1/24", "dev", HOST_IF]);
            sh(&["ip", "link", "set", HOST_IF, "up"]);
            let inside = |args: &[&str]| sh(&[&["ip", "netns", "exec", NS][..], args].concat());
            inside(&["ip", "addr", "add", "10.254.36.2/24", "dev", NS_IF]);
            inside(&["ip", "addr", "add", "10.254.36.3/24", "dev", NS_IF]);
            inside(&["ip", "link", "set", NS_IF, "up"]);
            inside(&["ip", "link", "set", "lo", "up"]);
            inside(&["ip", "addr", "add", "169.254.169.254/32", "dev", "lo"]);
            inside(&["ip", "route", "add", "default", "via", "10.254.36.1"]);
            sh(&["ip", "route", "add", "169.254.169.254/32", "via", "10.254.36.2", "dev", HOST_IF, "table", TABLE]);
            let server = "import socket, sys\n\
                          s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(16)\n\
                          print(s.getsockname()[1], flush=True)\n\
                          while True:\n    c, _ = s.accept(); c.sendall(b'hello'); c.close()\n";
            let mut listener = Command::new("ip")
                .args(["netns", "exec", NS, "python3", "-c", server])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("the listener");
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(listener.stdout.take().expect("stdout")),
                &mut line,
            )
            .expect("its port");
            let port = line.trim().parse().unwrap_or_else(|_| panic!("no port: {line:?}"));
            Lan { listener, port, bridges: Vec::new() }
        }

        /// Sends 169.254.169.254 from `bridge` into the namespace (the host's own stays as it was).
        fn route_metadata(&mut self, bridge: &str) {
            sh(&["ip", "rule", "add", "iif", bridge, "to", "169.254.169.254/32", "lookup", TABLE, "pref", TABLE]);
            self.bridges.push(bridge.to_string());
        }

        fn remove(bridges: &[String]) {
            for b in bridges {
                quiet(&["ip", "rule", "del", "iif", b, "to", "169.254.169.254/32", "lookup", TABLE, "pref", TABLE]);
            }
            quiet(&["ip", "route", "flush", "table", TABLE]);
            quiet(&["ip", "link", "del", HOST_IF]);
            quiet(&["ip", "netns", "del", NS]);
        }
    }

    impl Drop for Lan {
        fn drop(&mut self) {
            let _ = self.listener.kill();
            let _ = self.listener.wait();
            Lan::remove(&self.bridges);
        }
    }

    /// Removes the template's network (after its containers) and its egress chains on drop.
    struct TemplateNetwork(Option<(String, String)>, Containers);

    impl Drop for TemplateNetwork {
        fn drop(&mut self) {
            drop(std::mem::take(&mut self.1));
            if let Some((network, bridge)) = self.0.take() {
                quiet(&["docker", "network", "rm", &network]);
                for (chain, from) in [("COMPUTERD-I-", "INPUT"), ("COMPUTERD-F-", "DOCKER-USER")] {
                    let chain = format!("{chain}{bridge}");
                    quiet(&["iptables", "-w", "-D", from, "-i", &bridge, "-j", &chain]);
                    quiet(&["iptables", "-w", "-F", &chain]);
                    quiet(&["iptables", "-w", "-X", &chain]);
                }
            }
        }
    }

    /// Secure by default: a node that cannot install the egress rules (here: no `iptables` on
    /// its PATH) refuses a docker provider on its own networks, saying why and what to do; the
    /// operator may say they enforce egress themselves, or name a network of theirs.
    #[tokio::test]
    async fn i36_4b_a_node_that_cannot_install_the_rules_refuses_the_provider() {
        // The registrations that pass check their template's image: the default one is there.
        computerd_tests::docker::ensure_sandbox_image();
        let mut c = computerd_tests::TestCluster::start(1).await;
        let empty = c.dir.path().join("no-tools");
        std::fs::create_dir_all(&empty).expect("dir");
        c.kill(1);
        c.env.push(("PATH".into(), empty.to_string_lossy().into_owned()));
        c.spawn(1);
        wait_for("node 1 to answer again", Duration::from_secs(60), || async {
            let r = c.req(Method::GET, 1, "/v1/computer-providers", &c.token).send().await.ok()?;
            (r.status() == 200).then_some(())
        })
        .await;
        let register = |name: &str, extra: Value| {
            let mut config = json!({"serverUrl": c.url(1, "")});
            for (k, v) in extra.as_object().cloned().unwrap_or_default() {
                config[k] = v;
            }
            json!({"kind": "docker", "name": name, "config": config})
        };
        let (s, v) =
            c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(register("own", json!({})))).await;
        assert_eq!(s, 400, "no rules, no provider: {v}");
        let text = v.to_string();
        assert!(["iptables", "root", "egress", "operator"].iter().all(|w| text.contains(w)), "{text}");
        let body = register("operator", json!({"egress": "operator"}));
        let (s, v) = c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await;
        assert_eq!(s, 201, "the operator enforces egress: {v}");
        let body = register("named", json!({"network": "host"}));
        let (s, v) = c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await;
        assert_eq!(s, 201, "a network of the operator's: {v}");
        let body = register("bad", json!({"egress": "nobody"}));
        let (s, v) = c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await;
        assert_eq!(s, 400, "{v}");
    }

    #[tokio::test]
    async fn i36_4b_private_and_link_local_targets_are_closed_unless_the_template_opens_them() {
        let dev = Dev::start().await;
        assert!(!dev.docker_line.contains("off"), "Docker is here: {}", dev.docker_line);
        let mut lan = Lan::start();
        let port = lan.port;
        for ip in ["10.254.36.2", "10.254.36.3"] {
            assert_eq!(host_reads(ip, port), "hello", "the listener answers on {ip}");
        }
        // A provider like dev's, with a template that opens one address of the LAN and the
        // metadata address.
        let mine = dev.docker_provider().await;
        let mut config = mine["config"].clone();
        let bad = json!({"default": {"image": IMAGE, "allowPrivate": ["10.254.36.2/24"]}});
        config["templates"] = bad;
        let body = json!({"kind": "docker", "name": "lan-bad", "config": config.clone()});
        let (s, v) = dev.call(Method::POST, "/v1/computer-providers", Some(body)).await;
        assert_eq!(s, 400, "{v}");
        assert!(v.to_string().contains("host bits"), "the error names the problem: {v}");
        config["templates"] = json!({
            "default": {"image": IMAGE, "memoryMb": 512, "pids": 256},
            "lan": {"image": IMAGE, "memoryMb": 512, "pids": 256,
                    "allowPrivate": ["10.254.36.2/32", "169.254.169.254/32"]},
        });
        let body = json!({"kind": "docker", "name": "lan", "config": config});
        let (s, v) = dev.call(Method::POST, "/v1/computer-providers", Some(body)).await;
        assert_eq!(s, 201, "a template may open private ranges: {v}");
        let provider = v["id"].as_str().expect("id").to_string();

        let mut net = TemplateNetwork(None, Containers::default());
        let closed = create(&dev, &provider, "i36-closed", None, &mut net.1).await;
        let open = create(&dev, &provider, "i36-open", Some("lan"), &mut net.1).await;
        let (closed_bridge, _) = bridge_of(&closed);
        let (open_bridge, open_gateway) = bridge_of(&open);
        assert_ne!(closed_bridge, open_bridge, "the template's sandboxes have a network of their own");
        let open_net = inspect(&open, "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}");
        assert!(open_net.starts_with("computerd-sandboxes-"), "{open_net}");
        net.0 = Some((open_net, open_bridge.clone()));
        lan.route_metadata(&closed_bridge);
        lan.route_metadata(&open_bridge);

        // By default: no private address, no metadata address.
        for ip in ["10.254.36.2", "10.254.36.3", "169.254.169.254"] {
            let got = probe(&closed, ip, port, true);
            assert!(got.starts_with("blocked"), "a default sandbox reached {ip}: {got}");
        }
        // The template opens what it names, and only that; the host stays closed to it.
        assert_eq!(probe(&open, "10.254.36.2", port, true), "hello", "the opened address");
        assert_eq!(probe(&open, "169.254.169.254", port, true), "hello", "the opened metadata address");
        let got = probe(&open, "10.254.36.3", port, true);
        assert!(got.starts_with("blocked"), "an address the template does not name: {got}");
        let host_port = host_listener();
        assert_eq!(host_reads(&open_gateway, host_port), "hello");
        let got = probe(&open, &open_gateway, host_port, true);
        assert!(got.starts_with("blocked"), "the host through the template network's gateway: {got}");
    }
}
