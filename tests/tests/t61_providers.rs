//! The E2B and Daytona providers through a 3-node cluster, against fake services that follow
//! their published APIs (`tests/fakes/`), whose sandboxes are Docker containers running our
//! agent: create → link → exec → pause → a call resumes → delete with exactly one effect per
//! command; a lost create answer is `outcome_unknown` and the sandbox is found by its metadata or
//! labels; a 429 fails with nothing re-sent; credentials go to the configured endpoint only.
//! Each fake is also driven by its service's official Python SDK.

use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::wait_state;
use computerd_tests::fakes::FakeService;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

const KEY: &str = "e2b_test_key_0123456789abcdef";
/// The key of a second provider, whose endpoint is the other fake.
const OTHER_KEY: &str = "e2b_other_key_fedcba9876543210";

fn s(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_else(|| panic!("{k} in {v}")).to_string()
}

async fn provider(c: &TestCluster, fake: &FakeService, extra: Value) -> String {
    provider_with_key(c, fake, KEY, extra).await
}

async fn provider_with_key(c: &TestCluster, fake: &FakeService, key: &str, extra: Value) -> String {
    let timeout = if fake.kind == "daytona" { 60000 } else { 30000 };
    let mut config = json!({"serverUrl": c.url(1, ""), "endpoint": fake.url, "apiKey": key, "timeoutMs": timeout});
    if let (Some(base), Some(more)) = (config.as_object_mut(), extra.as_object()) {
        base.extend(more.clone());
    }
    let name = format!("{}-{}", fake.kind, hex::encode(rand::random::<[u8; 4]>()));
    let body = json!({"kind": fake.kind, "name": name, "config": config});
    let (st, v) = c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await;
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["secretFields"], json!(["apiKey"]), "the key is write-only: {v}");
    assert!(!v.to_string().contains(key));
    s(&v, "id")
}

async fn create(c: &TestCluster, node: u64, provider: &str, key: &str) -> (String, String) {
    let body = json!({
        "commandKey": key, "name": key,
        "source": {"_tag": "Provider", "provider": provider, "template": null},
        "pauseAfter": null,
    });
    let (st, v) = c.call(Method::POST, node, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(st, 202, "{v}");
    (v["resource"]["id"].as_str().expect("id").to_string(), s(&v, "executionId"))
}

async fn lifecycle(c: &TestCluster, node: u64, id: &str, what: &str, key: &str) -> String {
    let url = format!("/v1/computers/{id}{what}");
    let method = if what.is_empty() { Method::DELETE } else { Method::POST };
    let (st, v) = c.call(method, node, &url, &c.token, Some(json!({"commandKey": key}))).await;
    assert_eq!(st, 202, "{v}");
    s(&v, "executionId")
}

async fn run(c: &TestCluster, node: u64, id: &str, command: &str) -> Value {
    let body = json!({"command": command, "yieldTimeMs": 20000});
    let (st, v) = c.call(Method::POST, node, &format!("/v1/computers/{id}/sessions"), &c.token, Some(body)).await;
    assert_eq!(st, 200, "{v}");
    v
}

/// Lifecycle effects of the journal (not the keep-alive refreshes), as (effect, sandbox).
async fn lifecycle_effects(fake: &FakeService) -> Vec<(String, String)> {
    let keep = ["create", "pause", "resume", "kill", "stop", "start", "delete"];
    fake.effects().await.into_iter().filter(|(e, _)| keep.contains(&e.as_str())).collect()
}

/// Every request the fake saw carried the key, and none broke the published schemas.
async fn all_valid(fake: &FakeService) {
    for e in fake.journal().await {
        if e["method"] == "TIMER" {
            continue;
        }
        assert!(e["invalid"].is_null(), "a request the published API does not allow: {e}");
        assert_eq!(e["keyOk"], true, "{e}");
    }
}

/// The whole flow for one provider kind; `keeps_processes` says what its pause keeps.
async fn flow(kind: &'static str, keeps_processes: bool) {
    let fake = FakeService::start(kind, KEY);
    // Another fake at another address, the endpoint of a second provider with its own key:
    // each key goes to its own endpoint only (a fake journals a request with another key as
    // not `keyOk`).
    let elsewhere = FakeService::start(kind, OTHER_KEY);
    let c = TestCluster::start(3).await;
    let p = provider(&c, &fake, json!({})).await;
    let other = provider_with_key(&c, &elsewhere, OTHER_KEY, json!({})).await;
    let (other_id, exe) = create(&c, 3, &other, "create-elsewhere").await;
    assert_eq!(c.settle(3, &exe, &c.token).await["state"], "succeeded");

    let (id, exe) = create(&c, 2, &p, "create-1").await;
    assert_eq!(c.settle(2, &exe, &c.token).await["state"], "succeeded");
    let v = wait_state(&c, &id, "running").await;
    assert_eq!(v["pauseKeeps"], if keeps_processes { "memory" } else { "files" }, "{v}");
    let sandbox = s(&v, "sandboxId");
    assert!(fake.container_of(&sandbox).is_some(), "the sandbox {sandbox} is a container of the fake");

    // exec through another node: a file, and a process left running.
    let r = run(&c, 3, &id, "echo kept > /workspace/f.txt; nohup sleep 1000 >/dev/null 2>&1 & echo $!").await;
    assert_eq!(r["exitCode"], 0, "{r}");
    let pid = r["output"].as_str().expect("output").trim().to_string();
    assert!(pid.parse::<u32>().is_ok(), "{r}");
    if kind == "daytona" {
        let body = json!({"command": "bash", "tty": true});
        let (st, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(body)).await;
        assert_eq!((st, v["error"]["kind"].as_str()), (422, Some("ComputerUnsupported")), "{v}");
    }

    let exe = lifecycle(&c, 1, &id, "/pause", "pause-1").await;
    assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded");
    wait_state(&c, &id, "paused").await;

    // A call on the paused Computer resumes it first, then runs. An agent that restarted
    // (Daytona) may link to another node than the one the call waits on: that call answers 503
    // `unavailable` at once, before it reached any agent, and is sent again.
    let look = format!("cat /workspace/f.txt; kill -0 {pid} && echo alive || echo gone");
    let body = json!({"command": look, "yieldTimeMs": 20000});
    let path = format!("/v1/computers/{id}/sessions");
    let (st, r) = c.call(Method::POST, 3, &path, &c.token, Some(body.clone())).await;
    let r = if st == 503 && !keeps_processes {
        assert_eq!(r["error"]["kind"], "unavailable", "{r}");
        run(&c, 3, &id, &look).await
    } else {
        assert_eq!(st, 200, "{r}");
        r
    };
    let out = r["output"].as_str().unwrap_or_default().to_string();
    assert!(out.starts_with("kept\n"), "files survive the pause: {r}");
    let want = if keeps_processes { "alive" } else { "gone" };
    assert!(out.contains(want), "a process is {want} after pause and resume: {r}");

    let exe = lifecycle(&c, 2, &id, "", "delete-1").await;
    assert_eq!(c.settle(2, &exe, &c.token).await["state"], "succeeded");
    wait_for("the sandbox's container to go", Duration::from_secs(30), || async {
        fake.container_of(&sandbox).is_none().then_some(())
    })
    .await;

    let (pause, resume, delete) = if kind == "e2b" { ("pause", "resume", "kill") } else { ("stop", "start", "delete") };
    let want: Vec<(String, String)> =
        ["create", pause, resume, delete].iter().map(|e| (e.to_string(), sandbox.clone())).collect();
    assert_eq!(lifecycle_effects(&fake).await, want, "exactly one effect per command");
    all_valid(&fake).await;
    let exe = lifecycle(&c, 2, &other_id, "", "delete-elsewhere").await;
    assert_eq!(c.settle(2, &exe, &c.token).await["state"], "succeeded");
    let seen = elsewhere.journal().await;
    assert!(seen.iter().any(|e| e["effect"] == "create"), "the second provider reached its own endpoint: {seen:?}");
    all_valid(&elsewhere).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_e2b_create_exec_pause_resume_delete() {
    flow("e2b", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t11_daytona_create_exec_stop_start_delete() {
    flow("daytona", false).await;
}

/// A lost create answer: `outcome_unknown`, the sandbox found by its metadata or labels, then a
/// decision and a delete that finds it too; and a 429 that fails with nothing re-sent.
async fn lost_and_limited(kind: &'static str) {
    let fake = FakeService::start(kind, KEY);
    let c = TestCluster::start(3).await;
    let p = provider(&c, &fake, json!({})).await;
    let create_path = if kind == "e2b" { "/sandboxes" } else { "/sandbox" };

    fake.fault(json!({"method": "POST", "path": create_path, "fault": "lose_answer", "times": 1})).await;
    let (id, exe) = create(&c, 1, &p, "lost-1").await;
    let done = c.settle(1, &exe, &c.token).await;
    assert_eq!(done["state"], "outcome_unknown", "{done}");
    let made = lifecycle_effects(&fake).await;
    assert_eq!(made.len(), 1, "one create reached the service: {made:?}");
    let (st, found) = c.call(Method::GET, 3, &format!("/v1/computers/{id}/sandbox"), &c.token, None).await;
    assert_eq!(st, 200, "{found}");
    assert_eq!((found["found"].clone(), found["sandbox"].clone()), (json!(true), json!(made[0].1)), "{found}");
    let body = json!({"outcome": "succeeded", "reason": "the sandbox is listed with the Computer's metadata"});
    let (st, v) = c.call(Method::POST, 2, &format!("/v1/executions/{exe}/decision"), &c.token, Some(body)).await;
    assert_eq!(st, 200, "{v}");
    let del = lifecycle(&c, 2, &id, "", "delete-lost").await;
    assert_eq!(c.settle(2, &del, &c.token).await["state"], "succeeded");
    let effects = lifecycle_effects(&fake).await;
    assert_eq!(effects.len(), 2, "{effects:?}");
    assert_eq!(effects[1].1, made[0].1, "the delete found the sandbox by its labels: {effects:?}");

    let before = fake.journal().await.len();
    fake.fault(json!({"method": "POST", "path": create_path, "fault": "status", "status": 429, "times": 1})).await;
    let (_, exe) = create(&c, 3, &p, "limited-1").await;
    let done = c.settle(3, &exe, &c.token).await;
    assert_eq!(
        (done["state"].as_str(), done["error"]["kind"].as_str()),
        (Some("failed"), Some("provider_rate_limited"))
    );
    let after: Vec<Value> = fake.journal().await.into_iter().skip(before).filter(|e| e["method"] != "TIMER").collect();
    let creates: Vec<&Value> = after.iter().filter(|e| e["method"] == "POST" && e["path"] == create_path).collect();
    assert_eq!(creates.len(), 1, "nothing was re-sent: {after:?}");
    assert_eq!((creates[0]["status"].clone(), creates[0]["effect"].clone()), (json!(429), Value::Null));
    all_valid(&fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_e2b_a_lost_create_and_a_rate_limit() {
    lost_and_limited("e2b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t21_daytona_a_lost_create_and_a_rate_limit() {
    lost_and_limited("daytona").await;
}

/// A template that does not exist and a wrong key fail with their kinds; E2B's timeout is pushed
/// ahead while the Computer runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_refusals_and_e2b_keep_alive() {
    let fake = FakeService::start("e2b", KEY);
    let c = TestCluster::start(1).await;
    let p = provider(&c, &fake, json!({"template": "no-such-template", "sandboxTimeoutSec": 60})).await;
    let (_, exe) = create(&c, 1, &p, "missing-template").await;
    let done = c.settle(1, &exe, &c.token).await;
    assert_eq!(done["error"]["kind"], "template_not_found", "{done}");

    let body = json!({"kind": "e2b", "name": "wrong", "config": {
        "serverUrl": c.url(1, ""), "endpoint": fake.url, "apiKey": "wrong-key", "template": "computerd-agent"}});
    let (_, v) = c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await;
    let (_, exe) = create(&c, 1, &s(&v, "id"), "wrong-key").await;
    let done = c.settle(1, &exe, &c.token).await;
    assert_eq!(done["error"]["kind"], "provider_unauthorized", "{done}");

    let good = provider(&c, &fake, json!({"sandboxTimeoutSec": 60})).await;
    let (id, _) = create(&c, 1, &good, "kept-alive").await;
    let v = wait_state(&c, &id, "running").await;
    let sandbox = s(&v, "sandboxId");
    // The leader refreshes at once, then every 20 s (a third of 60 s).
    wait_for("the sandbox's timeout to be refreshed", Duration::from_secs(30), || async {
        fake.journal()
            .await
            .iter()
            .any(|e| e["path"] == format!("/sandboxes/{sandbox}/timeout") && e["status"] == 204)
            .then_some(())
    })
    .await;
    let (st, v) = c
        .call(
            Method::POST,
            1,
            "/v1/computer-providers",
            &c.token,
            Some(json!({"kind": "e2b", "name": "x",
        "config": {"serverUrl": c.url(1, ""), "endpoint": "http://api.e2b.app", "apiKey": KEY}})),
        )
        .await;
    assert_eq!(
        (st, v["error"]["kind"].as_str()),
        (400, Some("invalid_request")),
        "clear-text endpoints are refused: {v}"
    );
}

/// Issue 37, item 13: E2B answers 409 both for a sandbox already paused and for one that cannot
/// be paused in its state. The second is a pause that did not happen: the execution fails and
/// the Computer stays running; the next pause goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i37_13_an_e2b_409_that_is_not_already_paused_fails_the_pause() {
    let fake = FakeService::start("e2b", KEY);
    let c = TestCluster::start(1).await;
    let p = provider(&c, &fake, json!({})).await;
    let (id, _) = create(&c, 1, &p, "busy-pause").await;
    let v = wait_state(&c, &id, "running").await;
    let sandbox = s(&v, "sandboxId");
    let busy = format!("Sandbox '{sandbox}' cannot be paused while in 'snapshotting' state");
    fake.fault(json!({"method": "POST", "path": format!("/sandboxes/{sandbox}/pause"), "fault": "status", "status": 409, "message": busy}))
        .await;
    let exe = lifecycle(&c, 1, &id, "/pause", "busy-pause-1").await;
    let done = c.settle(1, &exe, &c.token).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(done.to_string().contains("cannot be paused while in"), "the reason is E2B's: {done}");
    let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
    assert_eq!(v["state"], "running", "{v}");
    let exe = lifecycle(&c, 1, &id, "/pause", "busy-pause-2").await;
    assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded");
    wait_state(&c, &id, "paused").await;
    let exe = lifecycle(&c, 1, &id, "", "busy-pause-del").await;
    assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded");
}

/// Issue 41, item 3: an E2B Computer's egress policy goes to E2B as its `network` (`allowOut`
/// with the cluster's host added, so the agent's link stays up; `denyOut` all), and a change is
/// `PUT /sandboxes/{id}/network`; a policy E2B would read otherwise (a name to deny) is refused
/// with `ComputerUnsupported` and sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i41_egress_goes_to_e2b_as_its_network() {
    let fake = FakeService::start("e2b", KEY);
    let c = TestCluster::start(1).await;
    let p = provider(&c, &fake, json!({})).await;
    let body = json!({
        "commandKey": "egress-e2b", "source": {"_tag": "Provider", "provider": p},
        "egress": {"default": "deny", "allow": ["pypi.org", "*.pythonhosted.org"]},
    });
    let (st, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(st, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    wait_state(&c, &id, "running").await;
    let journal = fake.journal().await;
    let made = journal.iter().find(|e| e["effect"] == "create").expect("a create");
    let url = c.url(1, "");
    let server = url.trim_start_matches("http://").rsplit_once(':').map(|(h, _)| h).expect("host:port");
    assert_eq!(
        made["network"],
        json!({"allowOut": ["pypi.org", "*.pythonhosted.org", server], "denyOut": ["0.0.0.0/0"]}),
        "{made}"
    );
    let url = format!("/v1/computers/{id}/egress");
    let bad = json!({"default": "allow", "deny": ["ads.example.com"]});
    let (st, v) = c.call(Method::PUT, 1, &url, &c.token, Some(bad)).await;
    assert_eq!((st, v["error"]["kind"].as_str()), (422, Some("ComputerUnsupported")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("ads.example.com"), "{v}");
    let change = json!({"default": "allow", "deny": ["203.0.113.0/24"]});
    let (st, v) = c.call(Method::PUT, 1, &url, &c.token, Some(change)).await;
    assert_eq!(st, 200, "{v}");
    let updates: Vec<Value> =
        fake.journal().await.into_iter().filter(|e| e["effect"] == "network").map(|e| e["network"].clone()).collect();
    assert_eq!(updates, vec![json!({"denyOut": ["203.0.113.0/24"]})], "one update, the good one");
    let (_, v) = c.call(Method::GET, 1, &url, &c.token, None).await;
    assert_eq!(v["policy"]["deny"], json!(["203.0.113.0/24"]), "{v}");
    // The sandbox's agent is still linked: a command runs.
    assert_eq!(run(&c, 1, &id, "echo linked").await["output"].as_str().map(str::trim), Some("linked"));
    all_valid(&fake).await;
    let exe = lifecycle(&c, 1, &id, "", "egress-e2b-del").await;
    assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded");
}

/// Each fake answers its service's official Python SDK as the service does.
#[test]
fn t40_the_fakes_answer_the_official_sdks() {
    for kind in ["e2b", "daytona"] {
        let fake = FakeService::start(kind, KEY);
        let (ok, out) = fake.sdk_check(KEY);
        assert!(ok, "the {kind} SDK check failed:\n{out}");
    }
}

/// `deploy/e2b/`: its Dockerfile builds (on the local sandbox image: no registry here), and its
/// start command, given an envd stand-in serving `/envs`, becomes the agent with exactly the
/// `COMPUTER_AGENT_*` settings of the create.
#[test]
fn t50_the_e2b_template_builds_and_its_start_command_reads_envd() {
    use std::process::Command;
    computerd_tests::docker::ensure_sandbox_image();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let ctx = tempfile::tempdir().expect("context");
    for f in ["e2b.Dockerfile", "start.sh"] {
        std::fs::copy(root.join("deploy/e2b").join(f), ctx.path().join(f)).expect("copy");
    }
    std::fs::copy(computerd_tests::agent::agent_bin(), ctx.path().join("computer-agent")).expect("copy the agent");
    let tag = format!("computerd-e2b-template:t61-{}", std::process::id());
    let out = Command::new("docker")
        .args(["build", "-q", "--build-arg", "BASE=computerd-sandbox:latest", "-f", "e2b.Dockerfile", "-t", &tag, "."])
        .current_dir(ctx.path())
        .output()
        .expect("docker build");
    assert!(out.status.success(), "the template builds: {}", String::from_utf8_lossy(&out.stderr));

    // envd's stand-in: GET /envs answers the create's envVars (and one more that is not ours).
    let envd = Command::new("python3")
        .args([
            "-c",
            r#"
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"COMPUTER_AGENT_SERVER": "https://cd.example.com", "COMPUTER_AGENT_PAIR": "it's a code",
                           "OTHER": "x"}).encode() if self.path == "/envs" else b"{}"
        self.send_response(200 if self.path == "/envs" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("envd stand-in");
    struct Kill(std::process::Child, String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = Command::new("docker").args(["rmi", "-f", &self.1]).output();
        }
    }
    let mut envd = Kill(envd, tag.clone());
    let mut port = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(envd.0.stdout.take().expect("stdout")), &mut port)
        .expect("port");
    // `env` in the agent's place shows what the agent would start with.
    let out = Command::new("docker")
        .args(["run", "--rm", "--network", "host"])
        .args(["-e", &format!("COMPUTERD_E2B_ENVD=http://127.0.0.1:{}", port.trim())])
        .args(["-e", "COMPUTERD_E2B_AGENT=/usr/bin/env", &tag, "/usr/local/bin/computerd-e2b-start"])
        .output()
        .expect("docker run");
    let env = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{env}{}", String::from_utf8_lossy(&out.stderr));
    assert!(env.lines().any(|l| l == "COMPUTER_AGENT_SERVER=https://cd.example.com"), "{env}");
    assert!(env.lines().any(|l| l == "COMPUTER_AGENT_PAIR=it's a code"), "values are passed as they are: {env}");
    assert!(!env.lines().any(|l| l.starts_with("OTHER=")), "only the agent's settings: {env}");
}

/// A sandbox deleted at the provider behind the cluster's back is reported (`failed`, with a
/// `SandboxVanished` event): the sandbox watch lists each provider's sandboxes page by page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t35_a_sandbox_deleted_at_the_provider_is_reported() {
    let c = TestCluster::start_with(1, &["--sandbox-watch-secs", "0.5"]).await;
    for kind in ["e2b", "daytona"] {
        let fake = FakeService::start(kind, KEY);
        let p = provider(&c, &fake, json!({})).await;
        let (id, _) = create(&c, 1, &p, &format!("vanish-{kind}")).await;
        let v = wait_state(&c, &id, "running").await;
        let sandbox = s(&v, "sandboxId");
        at_the_provider(&fake, &sandbox, Behind::Delete).await;
        wait_state(&c, &id, "failed").await;
        let (_, ev) = c.call(Method::GET, 1, "/v1/events?limit=1000", &c.token, None).await;
        let vanished = ev["events"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["type"] == "SandboxVanished" && e["computerId"] == id.as_str());
        assert!(vanished, "{kind}: {ev}");
    }
}

/// What a fake is asked for at the provider itself, behind the cluster's back.
enum Behind {
    /// Delete the sandbox.
    Delete,
    /// Pause it (E2B) or stop it (Daytona).
    Pause,
}

/// Does `what` to `sandbox` at the provider itself, with the service's own route and key.
async fn at_the_provider(fake: &FakeService, sandbox: &str, what: Behind) {
    let e2b = fake.kind == "e2b";
    let (method, path) = match (what, e2b) {
        (Behind::Delete, true) => (reqwest::Method::DELETE, format!("/sandboxes/{sandbox}")),
        (Behind::Delete, false) => (reqwest::Method::DELETE, format!("/sandbox/{sandbox}")),
        (Behind::Pause, true) => (reqwest::Method::POST, format!("/sandboxes/{sandbox}/pause")),
        (Behind::Pause, false) => (reqwest::Method::POST, format!("/sandbox/{sandbox}/stop")),
    };
    let (header, value) = if e2b { ("X-API-Key", KEY.to_string()) } else { ("Authorization", format!("Bearer {KEY}")) };
    let r = reqwest::Client::new()
        .request(method, format!("{}{path}", fake.url))
        .header(header, value)
        .send()
        .await
        .expect("a call at the provider");
    assert!(r.status().is_success(), "{path}: {}", r.status());
}

/// Issue 37, item 12: a sandbox the provider paused (E2B) or stopped (Daytona) on its own is
/// reported by the sandbox watch: the Computer becomes `paused`, with a `SandboxPausedByProvider`
/// event and its usage span ended as for a pause we asked for; a resume brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i37_12_a_sandbox_paused_behind_the_clusters_back_is_reported_paused() {
    let c = TestCluster::start_with(1, &["--sandbox-watch-secs", "0.5"]).await;
    for kind in ["e2b", "daytona"] {
        let fake = FakeService::start(kind, KEY);
        let p = provider(&c, &fake, json!({"timeoutMs": 60000})).await;
        let (id, _) = create(&c, 1, &p, &format!("behind-{kind}")).await;
        let v = wait_state(&c, &id, "running").await;
        let sandbox = s(&v, "sandboxId");
        at_the_provider(&fake, &sandbox, Behind::Pause).await;
        wait_state(&c, &id, "paused").await;
        let (_, ev) = c.call(Method::GET, 1, "/v1/events?limit=1000", &c.token, None).await;
        let seen = ev["events"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["type"] == "SandboxPausedByProvider" && e["computerId"] == id.as_str());
        assert!(seen, "{kind}: {ev}");
        let (_, u) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/usage"), &c.token, None).await;
        let spans = u["spans"].as_array().expect("spans");
        assert_eq!(spans.iter().map(|s| s["endedBy"].as_str()).collect::<Vec<_>>(), [Some("pause")], "{kind}: {u}");
        let exe = lifecycle(&c, 1, &id, "/resume", &format!("resume-{kind}")).await;
        assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded", "{kind}");
        wait_state(&c, &id, "running").await;
        let exe = lifecycle(&c, 1, &id, "", &format!("delete-{kind}")).await;
        assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded", "{kind}");
    }
}

/// Issue 37, item 14: Daytona's stop answers while the runner is still stopping the sandbox (the
/// fake's runner lags 3 s here). The pause is done only once Daytona reports `stopped`, so a
/// resume sent at once works, where it used to meet "Sandbox state change in progress".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i37_14_a_daytona_stop_is_done_only_once_the_sandbox_is_stopped() {
    let c = TestCluster::start(1).await;
    let fake = FakeService::start("daytona", KEY);
    let p = provider(&c, &fake, json!({"timeoutMs": 60000})).await;
    let (id, _) = create(&c, 1, &p, "async-stop").await;
    let v = wait_state(&c, &id, "running").await;
    let sandbox = s(&v, "sandboxId");
    fake.fault(json!({"method": "POST", "path": "/sandbox/*/stop", "fault": "lag", "delayMs": 3000})).await;
    fake.fault(json!({"method": "POST", "path": "/sandbox/*/start", "fault": "lag", "delayMs": 3000})).await;
    let exe = lifecycle(&c, 1, &id, "/pause", "pause-1").await;
    assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded");
    let r = reqwest::Client::new()
        .get(format!("{}/sandbox/{sandbox}", fake.url))
        .header("Authorization", format!("Bearer {KEY}"))
        .send()
        .await
        .expect("get");
    let now: Value = r.json().await.expect("json");
    assert_eq!(now["state"], "stopped", "the pause ended before the runner had stopped it: {now}");
    let exe = lifecycle(&c, 1, &id, "/resume", "resume-1").await;
    assert_eq!(c.settle(1, &exe, &c.token).await["state"], "succeeded");
    wait_state(&c, &id, "running").await;
    let polled =
        fake.journal().await.iter().filter(|e| e["method"] == "GET" && e["sandboxId"] == sandbox.as_str()).count();
    assert!(polled >= 2, "the adapter polled the sandbox's state: {polled}");
    all_valid(&fake).await;
}

/// Issue 37, item 15: the sandbox watch pages through each provider's whole list (the Computer's
/// sandbox is on the third page of 100, behind 250 others) and reports nothing vanished; past its
/// cap of 50 pages it reports nothing at all, not even a sandbox that did vanish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i37_15_the_sandbox_watch_pages_through_every_list_up_to_its_cap() {
    let c = TestCluster::start_with(1, &["--sandbox-watch-secs", "0.5"]).await;
    for kind in ["e2b", "daytona"] {
        let fake = FakeService::start(kind, KEY);
        let p = provider(&c, &fake, json!({"timeoutMs": 60000})).await;
        let (id, _) = create(&c, 1, &p, &format!("pages-{kind}")).await;
        let v = wait_state(&c, &id, "running").await;
        let sandbox = s(&v, "sandboxId");
        // Newer than the Computer's sandbox: listed before it (newest first).
        fake.seed(250).await;
        let passes = |at: usize| {
            let fake = &fake;
            async move { fake.list_pages().await.iter().filter(|o| **o == at).count() }
        };
        let before = passes(200).await;
        wait_for("two passes over three pages", Duration::from_secs(60), || async {
            (passes(200).await >= before + 2).then_some(())
        })
        .await;
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        assert_eq!(v["state"], "running", "{kind}: its sandbox is on the third page: {v}");

        // 5,251 sandboxes: 53 pages, past the cap of 50. A sandbox deleted now is not reported.
        fake.seed(5000).await;
        at_the_provider(&fake, &sandbox, Behind::Delete).await;
        let before = passes(4900).await;
        wait_for("two passes up to the cap", Duration::from_secs(120), || async {
            (passes(4900).await >= before + 2).then_some(())
        })
        .await;
        assert_eq!(passes(5000).await, 0, "{kind}: no page past the cap is asked for");
        let (_, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        assert_eq!(v["state"], "running", "{kind}: a capped list reports nothing: {v}");
    }
}
