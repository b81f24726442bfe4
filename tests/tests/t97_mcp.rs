//! The bot tools over MCP (`/mcp`, streamable HTTP), against a real node and a real
//! `computer-agent`, with the official MCP Python SDK (PyPI `mcp`, installed by `.ci/run`) as the
//! client (`tests/fixtures/mcp_client.py`): it lists the tools, runs `python3 -c 'print(42)'`,
//! starts a 5 s command and receives its `computer_session` notice when it ends, types into a
//! Python REPL in a terminal, and sees the API's refusals as tool errors with their kinds. With
//! the real Docker engine, a bot creates its own sandbox with a desktop over MCP, runs a command
//! in it, sees its screen as MCP image content, writes, edits (a non-unique `old` is refused),
//! reads by range, lists and deletes files, hands a file out as a blob and back, serves a port
//! whose address a person approves (the test fetches it, then the bot closes it), asks for a
//! desktop link that is content for the person, and destroys the sandbox.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::agent::wait_state;
use computerd_tests::docker::Containers;
use computerd_tests::docker::DESKTOP_IMAGE;
use computerd_tests::docker::IMAGE;
use computerd_tests::docker::containers_of;
use computerd_tests::docker::docker_provider;
use computerd_tests::docker::ensure_desktop_image;
use computerd_tests::docker::inspect;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use tokio::io::AsyncBufReadExt;
use tokio::io::AsyncWriteExt;
use tokio::io::BufReader;

#[tokio::test]
async fn t10_an_mcp_client_lists_runs_and_hears_a_command_end() {
    let c = TestCluster::start(1).await;
    let (id, code) = paired_computer(&c, "mcp").await;
    let state = c.dir.path().join("agent");
    let log = c.dir.path().join("agent.log");
    let _agent = AgentProc::spawn_with(&c.url(1, ""), &state, Some(&code), &log, &[]);
    wait_state(&c, &id, "running").await;
    let (other, _) = paired_computer(&c, "no-grant").await;
    let (s, bot) = c.call(Method::POST, 1, "/v1/bots", &c.token, Some(json!({"name": "mcpbot"}))).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    // The test agent runs as root, so its sessions do: the bot is allowed root there.
    let grant = format!("/v1/computers/{id}/bots/{bot}");
    let (s, v) = c.call(Method::PUT, 1, &grant, &c.token, Some(json!({"allowRoot": true}))).await;
    assert_eq!(s, 200, "{v}");
    let bot_token = c.mint(json!({"botId": bot})).await;

    // Without a valid token, /mcp answers nothing but the API's 401.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
        "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let (s, v) = c.call(Method::POST, 1, "/mcp", "not-a-token", Some(init)).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (401, Some("unauthorized")), "{v}");

    let begun = std::time::Instant::now();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mcp_client.py");
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .args([c.url(1, "/mcp"), id.clone(), other.clone()])
        .env("BOT_TOKEN", &bot_token)
        .output()
        .await
        .expect("python3 runs (the MCP SDK is installed by .ci/run)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("the MCP client took {:?}:\n{stderr}", begun.elapsed());
    assert!(out.status.success(), "the MCP client failed: {stderr}");
    // The SDK ends its session with a DELETE on the way out and says so when the answer is not
    // 200 or 204.
    assert!(!stderr.contains("Session termination failed"), "the session's end was refused: {stderr}");
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stderr}"));

    assert_eq!(seen["server"], "computerd", "{seen}");
    let tools: Vec<&str> = seen["tools"].as_array().expect("tools").iter().filter_map(Value::as_str).collect();
    let (s, v) = c.call(Method::GET, 1, "/v1/tools", &bot_token, None).await;
    assert_eq!(s, 200, "{v}");
    let listed: Vec<&str> = v["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(tools, listed, "the same tools as GET /v1/tools");
    assert_eq!(seen["schemasAreObjects"], true);
    assert_eq!(seen["listed"], json!([id]), "only the Computer it holds a grant on: {seen}");
    assert_eq!(seen["print42"]["isError"], false, "{seen}");
    assert_eq!(seen["print42"]["answer"]["output"], "42\n", "{seen}");

    let long = &seen["long"];
    assert_eq!(long["running"], true, "still running after 250 ms: {seen}");
    let session = long["session"].as_str().expect("a session id");
    let notices = seen["notices"].as_array().expect("notices");
    assert_eq!(notices.len(), 1, "one notice per session: {seen}");
    assert_eq!(
        notices[0],
        json!({"kind": "computer_session", "computerId": id, "session": session, "exitCode": 3, "signal": null}),
        "{seen}"
    );
    assert!(seen["repl"].as_str().is_some_and(|o| o.replace('\r', "").contains("\n2")), "{seen}");

    assert_eq!(seen["noGrant"]["isError"], true, "{seen}");
    assert_eq!(seen["noGrant"]["body"]["error"]["kind"], "forbidden", "{seen}");
    assert_eq!(seen["badId"]["isError"], true, "{seen}");
    assert!(seen["badId"]["body"].as_str().is_some_and(|b| b.contains("invalid_request")), "{seen}");
    assert!(seen["noSuchTool"].as_str().is_some_and(|e| e.contains("no_such_tool")), "{seen}");

    // The same end is an event of /v1/events, for clients without MCP.
    let (s, v) = c.call(Method::GET, 1, "/v1/events", &bot_token, None).await;
    assert_eq!(s, 200, "{v}");
    let ends = v["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["type"] == "computer_session" && e["data"]["sessionId"] == session)
        .count();
    assert_eq!(ends, 1, "{v}");

    // Every Python program of README.md and docs/bots.md runs as written.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut programs = 0;
    for doc in ["README.md", "docs/bots.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        for program in text.split("```python\n").skip(1).filter_map(|rest| rest.split("```").next()) {
            programs += 1;
            let out = tokio::process::Command::new("python3")
                .args(["-c", program])
                .env("COMPUTERD_URL", c.url(1, ""))
                .env("BOT_TOKEN", &bot_token)
                .env("COMPUTER_ID", &id)
                .output()
                .await
                .expect("python3 runs");
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "the program of {doc} failed:\n{program}\n{said}");
            assert!(said.contains(r#""output":"42\n""#), "the program of {doc} ran print(42): {said}");
        }
    }
    assert_eq!(programs, 2, "README.md and docs/bots.md each hold one program");
}

/// A bot, through the MCP Python SDK only, creates a sandbox with a desktop at the Docker provider
/// (`openbot_computers_create` with `desktop` and a `reason`, allowed for it by a capability
/// rule), waits until it and its desktop run (polling `openbot_computers_list`), runs
/// `python3 -c 'print(42)'` in it, takes a screenshot that comes as MCP image content (a PNG of
/// the display's size), and releases it with `destroy`: the container that ran it is gone.
#[tokio::test]
async fn t20_a_bot_creates_uses_and_destroys_a_desktop_sandbox_over_mcp() {
    ensure_desktop_image();
    let c = TestCluster::start(1).await;
    let templates = json!({"templates": {
        "default": {"image": IMAGE, "cpus": 1.0, "memoryMb": 512, "pids": 256},
        "desktop": {"image": DESKTOP_IMAGE, "cpus": 1.0, "memoryMb": 1024, "pids": 512},
    }});
    let provider = docker_provider(&c, templates).await;
    let (s, bot) = c.call(Method::POST, 1, "/v1/bots", &c.token, Some(json!({"name": "mcp-sandboxer"}))).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    // A bot's create and delete ask a person by default: this bot may create at this provider
    // and delete (what it made) without asking; everything else keeps the default rules.
    let rules = json!({"rules": [
        {"capability": "computers.create", "effect": "allow", "bot": bot, "provider": provider},
        {"capability": "computers.delete", "effect": "allow", "bot": bot},
        {"actor": "member", "effect": "allow"},
        {"actor": "bot", "effect": "ask"},
    ]});
    let (s, v) = c.call(Method::PUT, 1, "/v1/capability-rules", &c.token, Some(rules)).await;
    assert_eq!(s, 200, "{v}");
    let bot_token = c.mint(json!({"botId": bot})).await;

    // The port the bot serves in its sandbox (the test's sandboxes share the host's network).
    let port = computerd_tests::free_port();
    let mut fetched = None;
    let begun = std::time::Instant::now();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mcp_client.py");
    let mut client = tokio::process::Command::new("python3")
        .arg(&script)
        .args(["sandbox", &c.url(1, "/mcp"), &provider, &port.to_string()])
        .env("BOT_TOKEN", &bot_token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs (the MCP SDK is installed by .ci/run)");
    let mut stdin = client.stdin.take().expect("stdin");
    let mut lines = BufReader::new(client.stdout.take().expect("stdout")).lines();
    let mut cleanup = Containers::default();
    let mut container = None;
    let mut display = (Value::Null, Value::Null);
    let seen: Value = tokio::time::timeout(Duration::from_secs(300), async {
        loop {
            let line = lines.next_line().await.expect("the client's stdout").expect("the client's summary");
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
            if v.get("approval").is_some() {
                // The bot's port waits for a person: the member approves it, and the address
                // answers the bot's server.
                let approval = v["approval"].as_str().unwrap_or_else(|| panic!("an approval id: {v}"));
                let url = v["url"].as_str().unwrap_or_else(|| panic!("an address: {v}")).to_string();
                let decide = json!({"decision": "approve"});
                let (s, a) =
                    c.call(Method::POST, 1, &format!("/v1/approvals/{approval}"), &c.token, Some(decide)).await;
                assert_eq!(s, 200, "{a}");
                let host = url.strip_prefix("http://").and_then(|r| r.split(['/', ':']).next()).expect("host");
                let node = c.nodes[&1].http.clone();
                let listing = wait_for("the bot's port to answer through its address", Duration::from_secs(30), || {
                    let (c, host, node) = (&c, host.to_string(), node.clone());
                    async move {
                        let r = c.http.get(format!("http://{node}/")).header("host", host).send().await.ok()?;
                        (r.status() == 200).then_some(r.text().await.ok()?)
                    }
                })
                .await;
                fetched = Some((url, listing));
                stdin.write_all(b"go\n").await.expect("to the client's stdin");
                stdin.flush().await.expect("flush");
                continue;
            }
            let Some(id) = v.get("running").and_then(Value::as_str) else { return v };
            // While the bot holds it: the sandbox is one running container of the desktop image.
            cleanup.track(id);
            let list = containers_of(id);
            assert_eq!(list.len(), 1, "exactly one container for {id}");
            assert_eq!(inspect(&list[0], "{{.Config.Image}}"), DESKTOP_IMAGE);
            assert_eq!(inspect(&list[0], "{{.State.Running}}"), "true");
            // The display's size, as its agent reports it.
            let (s, d) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/desktop"), &c.token, None).await;
            assert_eq!(s, 200, "{d}");
            display = (d["width"].clone(), d["height"].clone());
            container = Some((id.to_string(), list[0].clone()));
            stdin.write_all(b"release\n").await.expect("to the client's stdin");
            stdin.flush().await.expect("flush");
        }
    })
    .await
    .expect("the MCP client is done within 5 minutes");
    let status = client.wait().await.expect("the client's exit");
    eprintln!("the MCP client took {:?}", begun.elapsed());
    assert!(status.success(), "the MCP client failed: {seen}");

    assert_eq!(seen["create"]["isError"], false, "{seen}");
    let created = &seen["create"]["answer"];
    assert_eq!((created["kind"].as_str(), created["approvalId"].as_str()), (Some("create"), None), "{seen}");
    let id = created["resource"]["id"].as_str().expect("the new Computer's id");
    let states = seen["states"].as_array().expect("the states seen");
    assert_eq!(states.last(), Some(&json!(["running", "running"])), "{seen}");
    assert_eq!(display, (json!(1280), json!(800)), "the sandbox's display");
    let (id_seen, container) = container.expect("the client said when its sandbox ran");
    assert_eq!(id_seen, id);

    assert_eq!(seen["print42"]["isError"], false, "{seen}");
    assert_eq!(seen["print42"]["answer"]["output"], "42\n", "{seen}");

    let shot = &seen["screenshot"];
    assert_eq!(shot["isError"], false, "{seen}");
    assert_eq!(shot["content"], json!(["image", "text"]), "the image, then the rest of the answer: {seen}");
    assert_eq!(shot["mimeType"], "image/png", "{seen}");
    assert_eq!(shot["png"], json!([display.0, display.1]), "a PNG of the display's size: {seen}");
    assert_eq!((shot["answer"]["width"].clone(), shot["answer"]["height"].clone()), display, "{seen}");
    assert!(shot["answer"].get("data").is_none(), "the image only once, as image content: {seen}");

    // Files: written, edited (a non-unique and a missing `old` change nothing), read whole and
    // by range, listed, out as a blob and back in, deleted.
    let ok = |k: &str| {
        assert_eq!(seen[k]["isError"], false, "{k}: {}", seen[k]);
        seen[k]["answer"].clone()
    };
    let refused = |k: &str| {
        assert_eq!(seen[k]["isError"], true, "{k}: {}", seen[k]);
        seen[k]["answer"]["error"].clone()
    };
    ok("write");
    let e = refused("editTwice");
    assert!(
        e["kind"] == "invalid_request" && e["message"].as_str().unwrap_or_default().contains("occurs 2 times"),
        "{e}"
    );
    let e = refused("editMissing");
    assert!(
        e["kind"] == "invalid_request" && e["message"].as_str().unwrap_or_default().contains("does not occur"),
        "{e}"
    );
    assert_eq!(ok("edit")["size"], 12);
    assert_eq!(ok("read")["content"], "x = 1\ny = 2\n", "the edit changed only its own text");
    let range = ok("readRange");
    assert_eq!(
        (range["content"].as_str(), range["offset"].as_u64(), range["totalSize"].as_u64()),
        (Some("y ="), Some(6), Some(12))
    );
    let names: Vec<&str> = seen["list"]["answer"]["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["todo.txt"], "{seen}");
    let blob = ok("fromBox");
    let sha = blob["sha256"].as_str().expect("sha256").to_string();
    assert_eq!(ok("toBox")["sha256"].as_str(), Some(sha.as_str()));
    assert_eq!(ok("readCopy")["content"], "x = 1\ny = 2\n");
    // The person gets the file from the blob the bot made.
    let (s, got) = c
        .call(
            Method::GET,
            1,
            &format!("/api/blobs/{}/info", blob["blobId"].as_str().unwrap_or_default()),
            &c.token,
            None,
        )
        .await;
    assert_eq!((s, got["sha256"].as_str()), (200, Some(sha.as_str())), "{got}");
    assert_eq!(ok("delete"), json!({"done": true}));
    assert_eq!(refused("readDeleted")["kind"], "not_found");

    // The port: awaiting a person's approval, then open; its address served the bot's server;
    // closed, it answers no more.
    assert_eq!(seen["expose"]["answer"]["state"], "awaiting_approval", "{seen}");
    let (url, listing) = fetched.expect("the client asked for the port's approval");
    assert!(listing.contains("Directory listing"), "the sandbox's http.server: {listing}");
    assert_eq!(ok("ports")["ports"][0]["state"], "open", "{seen}");
    assert_eq!(ok("close"), json!({"done": true}));
    let host = url.strip_prefix("http://").and_then(|r| r.split(['/', ':']).next()).expect("host");
    let r = c.http.get(c.url(1, "/")).header("host", host).send().await.expect("request");
    assert_eq!(r.status().as_u16(), 404, "a closed address answers nothing");

    // The desktop link is content for the person; the rest of the answer is the model's.
    let blocks = seen["stream"]["blocks"].as_array().expect("blocks");
    assert_eq!(seen["stream"]["isError"], false, "{seen}");
    assert_eq!(
        (blocks[0]["audience"].clone(), blocks[1]["audience"].clone()),
        (json!(["user"]), json!(["assistant"])),
        "{seen}"
    );
    let link = blocks[0]["text"].as_str().expect("the link");
    assert!(link.starts_with(&c.url(1, &format!("/v1/computers/{id}/desktop/view?ticket="))), "{link}");
    assert!(!blocks[1]["text"].as_str().unwrap_or_default().contains("ticket"), "the model's part has no ticket");
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
        .get(link)
        .send()
        .await
        .expect("the link");
    assert_eq!(r.status().as_u16(), 303, "the ticket opens the view once");

    let release = &seen["release"];
    assert_eq!(release["isError"], false, "{seen}");
    assert_eq!((release["answer"]["kind"].as_str(), release["answer"]["approvalId"].as_str()), (Some("delete"), None));
    wait_for("the Computer to be deleted", Duration::from_secs(60), || async {
        let (s, _) = c.call(Method::GET, 1, &format!("/v1/computers/{id}"), &c.token, None).await;
        (s == 404).then_some(())
    })
    .await;
    assert!(containers_of(id).is_empty(), "the container is gone");
    let inspected =
        std::process::Command::new("docker").args(["inspect", &container]).output().expect("docker inspect");
    assert!(!inspected.status.success(), "docker knows no container {container} any more");
}
