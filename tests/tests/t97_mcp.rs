//! The bot tools over MCP (`/mcp`, streamable HTTP), against a real node and a real
//! `computer-agent`, with the official MCP Python SDK (PyPI `mcp`, installed by `.ci/run`) as the
//! client (`tests/fixtures/mcp_client.py`): it lists the tools, runs `python3 -c 'print(42)'`,
//! starts a 5 s command and receives its `computer_session` notice when it ends, types into a
//! Python REPL in a terminal, and sees the API's refusals as tool errors with their kinds.

use std::path::Path;

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::agent::wait_state;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

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
}
