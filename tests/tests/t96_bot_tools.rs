//! The bot tools over HTTP (`GET /v1/tools`, `POST /v1/tools/call`), against a real node and a
//! real `computer-agent`: listed in OpenAI's and Anthropic's formats; a bot runs
//! `python3 -c 'print(42)'` and types into a Python REPL on a Computer it holds a grant on; the
//! API's errors pass through with their kinds (no grant, a bad id, a member calling a bot's tool).

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::agent::wait_state;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

const TOOLS: [&str; 9] = [
    "openbot_computers_list",
    "openbot_computers_acquire",
    "openbot_computers_create",
    "openbot_computers_release",
    "openbot_computer_exec",
    "openbot_computer_write_stdin",
    "openbot_computer_screenshot",
    "openbot_computer_desktop_actions",
    "computer_mcp",
];

async fn call(c: &TestCluster, token: &str, name: &str, arguments: Value) -> (u16, Value) {
    c.call(Method::POST, 1, "/v1/tools/call", token, Some(json!({"name": name, "arguments": arguments}))).await
}

#[tokio::test]
async fn t10_listed_in_two_formats_and_run_with_the_apis_rules() {
    let c = TestCluster::start(1).await;
    let (id, code) = paired_computer(&c, "bot-tools").await;
    let state = c.dir.path().join("agent");
    let log = c.dir.path().join("agent.log");
    let _agent = AgentProc::spawn_with(&c.url(1, ""), &state, Some(&code), &log, &[]);
    wait_state(&c, &id, "running").await;
    let (other, _) = paired_computer(&c, "no-grant").await;
    let (s, bot) = c.call(Method::POST, 1, "/v1/bots", &c.token, Some(json!({"name": "toolbot"}))).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    // The test agent runs as root, so its sessions do: the bot is allowed root there.
    let grant = format!("/v1/computers/{id}/bots/{bot}");
    let (s, v) = c.call(Method::PUT, 1, &grant, &c.token, Some(json!({"allowRoot": true}))).await;
    assert_eq!(s, 200, "{v}");
    let bot_token = c.mint(json!({"botId": bot})).await;

    // Listed once, in each vendor's shape.
    let (s, v) = c.call(Method::GET, 1, "/v1/tools?format=openai", &bot_token, None).await;
    assert_eq!(s, 200, "{v}");
    let names: Vec<&str> =
        v["tools"].as_array().expect("tools").iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    assert_eq!(names, TOOLS);
    assert!(
        v["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .all(|t| t["type"] == "function" && t["function"]["parameters"]["type"] == "object")
    );
    let (s, v) = c.call(Method::GET, 1, "/v1/tools?format=anthropic", &bot_token, None).await;
    assert_eq!(s, 200, "{v}");
    assert!(
        v["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .all(|t| t["input_schema"]["type"] == "object" && t["name"].is_string())
    );
    let (s, v) = c.call(Method::GET, 1, "/v1/tools?format=xml", &bot_token, None).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
    let (s, _) = c.call(Method::GET, 1, "/v1/tools", "not-a-token", None).await;
    assert_eq!(s, 401);

    // The bot sees its Computer, and runs a command on it.
    let (s, v) = call(&c, &bot_token, "openbot_computers_list", json!({})).await;
    assert_eq!(s, 200, "{v}");
    let listed: Vec<&str> =
        v["result"]["computers"].as_array().expect("computers").iter().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(listed, [id.as_str()], "only the Computer it holds a grant on: {v}");
    let (s, v) =
        call(&c, &bot_token, "openbot_computer_exec", json!({"computerId": id, "command": "python3 -c 'print(42)'"}))
            .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["result"]["output"], "42\n", "{v}");

    // A REPL in a terminal: the session goes on after its wait, and stdin reaches it.
    let args = json!({"computerId": id, "command": "python3 -q", "tty": true, "yieldTimeMs": 1000});
    let (s, v) = call(&c, &bot_token, "openbot_computer_exec", args).await;
    assert_eq!(s, 200, "{v}");
    let session = v["result"]["session"].as_str().expect("a running session").to_string();
    let args = json!({"computerId": id, "session": session, "chars": "1+1\n", "yieldTimeMs": 2000});
    let (s, v) = call(&c, &bot_token, "openbot_computer_write_stdin", args).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["result"]["output"].as_str().is_some_and(|o| o.contains('2')), "{v}");
    let args = json!({"computerId": id, "session": session, "chars": "exit()\n", "yieldTimeMs": 2000});
    call(&c, &bot_token, "openbot_computer_write_stdin", args).await;

    // The API's rules and errors, unchanged.
    let (s, v) = call(&c, &bot_token, "openbot_computer_exec", json!({"computerId": other, "command": "id"})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "no grant there: {v}");
    let (s, v) =
        call(&c, &bot_token, "openbot_computer_exec", json!({"computerId": "cmp_x/../../v1/tokens", "command": "id"}))
            .await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
    let (s, v) = call(&c, &bot_token, "openbot_nothing", json!({})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (404, Some("not_found")), "{v}");
    let (s, v) = call(&c, &c.token, "computer_mcp", json!({"action": "list"})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "a bot's tool: {v}");
    let (s, v) = call(&c, &bot_token, "openbot_computers_list", json!([1])).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
}
