//! The bot tools over HTTP (`GET /v1/tools`, `POST /v1/tools/call`), against a real node and a
//! real `computer-agent`: listed in OpenAI's and Anthropic's formats; a bot runs
//! `python3 -c 'print(42)'`, lists its sessions and reads their output (an ended one's, and a
//! running one's twice the same, then on until it ends), and types into a Python REPL on a
//! Computer it holds a grant on; the API's errors pass through with their kinds (no grant, a bad
//! id, a member calling a bot's tool, no such session).

use computerd_tests::TestCluster;
use computerd_tests::agent::AgentProc;
use computerd_tests::agent::paired_computer;
use computerd_tests::agent::wait_state;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

const TOOLS: [&str; 38] = [
    "openbot_computers_list",
    "openbot_computers_acquire",
    "openbot_computers_create",
    "openbot_computers_release",
    "openbot_computer_exec",
    "openbot_computer_write_stdin",
    "openbot_computer_sessions_list",
    "openbot_computer_session_read",
    "openbot_computer_session_kill",
    "openbot_computer_screenshot",
    "openbot_computer_desktop_actions",
    "openbot_computer_file_read",
    "openbot_computer_file_write",
    "openbot_computer_file_edit",
    "openbot_computer_file_list",
    "openbot_computer_file_delete",
    "openbot_computer_copy_to_box",
    "openbot_computer_copy_from_box",
    "openbot_computer_port_expose",
    "openbot_computer_port_list",
    "openbot_computer_port_close",
    "openbot_computer_desktop_stream",
    "openbot_browser_open",
    "openbot_browser_close",
    "openbot_browser_navigate",
    "openbot_browser_snapshot",
    "openbot_browser_click",
    "openbot_browser_type",
    "openbot_browser_fill_secret",
    "openbot_browser_press",
    "openbot_browser_dialog",
    "openbot_browser_select",
    "openbot_browser_hover",
    "openbot_browser_upload",
    "openbot_browser_screenshot",
    "openbot_browser_session_status",
    "openbot_browser_action",
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
    // Its own workspace, which the bot's grant names (a bot reads on a paired machine only
    // where its grant says).
    let workdir = c.dir.path().join("workspace");
    std::fs::create_dir_all(&workdir).expect("workspace");
    let workdir = workdir.display().to_string();
    let _agent = AgentProc::spawn_with(&c.url(1, ""), &state, Some(&code), &log, &["--workdir", &workdir]);
    wait_state(&c, &id, "running").await;
    let (other, _) = paired_computer(&c, "no-grant").await;
    let (s, bot) = c.call(Method::POST, 1, "/v1/bots", &c.token, Some(json!({"name": "toolbot"}))).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    // The test agent runs as root, so its sessions do: the bot is allowed root there.
    let grant = format!("/v1/computers/{id}/bots/{bot}");
    let (s, v) = c.call(Method::PUT, 1, &grant, &c.token, Some(json!({"allowRoot": true, "paths": [workdir]}))).await;
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
    let printed = v["result"]["sessionId"].as_str().expect("the ended session's id").to_string();

    // A command still running after its call: the bot finds it in its list and reads its
    // output, as often as it likes, while it runs and after it ended.
    let args = json!({"computerId": id, "command": "echo first; read x; echo \"got $x\"", "yieldTimeMs": 250});
    let (s, v) = call(&c, &bot_token, "openbot_computer_exec", args).await;
    assert_eq!((s, v["result"]["running"].clone()), (200, json!(true)), "waits for its stdin: {v}");
    let waiting = v["result"]["session"].as_str().expect("a running session").to_string();
    let (s, v) = call(&c, &bot_token, "openbot_computer_sessions_list", json!({"computerId": id})).await;
    assert_eq!(s, 200, "{v}");
    let sessions = v["result"]["sessions"].as_array().expect("sessions");
    let ids: Vec<&str> = sessions.iter().filter_map(|s| s["session"].as_str()).collect();
    assert_eq!(ids, [waiting.as_str(), printed.as_str()], "the running one first, then the ended one: {v}");
    assert_eq!(
        (sessions[0]["running"].clone(), sessions[0]["command"].clone()),
        (json!(true), json!("echo first; read x; echo \"got $x\"")),
        "{v}"
    );
    assert_eq!(
        (sessions[1]["running"].clone(), sessions[1]["exitCode"].clone(), sessions[1]["command"].clone()),
        (json!(false), json!(0), json!("python3 -c 'print(42)'")),
        "{v}"
    );
    let read = |session: &str, from: u64, yield_ms: u64| json!({"computerId": id, "sessionId": session, "fromOffset": from, "yieldTimeMs": yield_ms});
    let (s, v) = call(&c, &bot_token, "openbot_computer_session_read", read(&printed, 0, 0)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["result"]["output"].clone(), v["result"]["running"].clone(), v["result"]["exitCode"].clone()),
        (json!("42\n"), json!(false), json!(0)),
        "an ended session's output, read again: {v}"
    );
    for _ in 0..2 {
        // Twice the same: a read only looks.
        let (s, v) = call(&c, &bot_token, "openbot_computer_session_read", read(&waiting, 0, 10_000)).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            (v["result"]["output"].clone(), v["result"]["running"].clone(), v["result"]["offset"].clone()),
            (json!("first\n"), json!(true), json!(6)),
            "{v}"
        );
    }
    let args = json!({"computerId": id, "session": waiting, "chars": "hi\n", "yieldTimeMs": 250});
    let (s, v) = call(&c, &bot_token, "openbot_computer_write_stdin", args).await;
    assert_eq!(s, 200, "{v}");
    // Read on from the offset seen, until it ends.
    let (mut from, mut after, mut last) = (6, String::new(), Value::Null);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < until && last["running"] != json!(false) {
        let (s, v) = call(&c, &bot_token, "openbot_computer_session_read", read(&waiting, from, 5_000)).await;
        assert_eq!(s, 200, "{v}");
        after.push_str(v["result"]["output"].as_str().unwrap_or_default());
        from = v["result"]["offset"].as_u64().expect("offset");
        last = v["result"].clone();
    }
    assert_eq!(
        (after.as_str(), last["running"].clone(), last["exitCode"].clone(), from),
        ("got hi\n", json!(false), json!(0), 13),
        "{last}"
    );
    let (s, v) = call(&c, &bot_token, "openbot_computer_session_read", read(&waiting, 0, 0)).await;
    assert_eq!((s, v["result"]["output"].as_str()), (200, Some("first\ngot hi\n")), "all of it, after its end: {v}");
    let (s, v) = call(&c, &bot_token, "openbot_computer_session_read", read("cse_nope", 0, 0)).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (404, Some("not_found")), "{v}");
    let args = json!({"computerId": id, "sessionId": printed, "fromOffset": "0&yieldTimeMs=30000"});
    let (s, v) = call(&c, &bot_token, "openbot_computer_session_read", args).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
    let (s, v) = call(&c, &bot_token, "openbot_computer_sessions_list", json!({"computerId": other})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "no grant there: {v}");

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

    // A file over 16 MiB: a whole read says to read it by ranges, and a range reads its end.
    let make = json!({"computerId": id, "command": "truncate -s 17M big.bin && printf 'the end' >> big.bin", "yieldTimeMs": 5000});
    let (s, v) = call(&c, &bot_token, "openbot_computer_exec", make).await;
    assert_eq!((s, v["result"]["exitCode"].clone()), (200, json!(0)), "{v}");
    let (s, v) = call(&c, &bot_token, "openbot_computer_file_read", json!({"computerId": id, "path": "big.bin"})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (413, Some("too_large")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("by ranges"), "{v}");
    let big = 17u64 << 20;
    let end = json!({"computerId": id, "path": "big.bin", "offset": big, "length": 100});
    let (s, v) = call(&c, &bot_token, "openbot_computer_file_read", end).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!((v["result"]["content"].as_str(), v["result"]["totalSize"].as_u64()), (Some("the end"), Some(big + 7)));
    let (s, v) =
        call(&c, &bot_token, "openbot_computer_file_delete", json!({"computerId": id, "path": "big.bin"})).await;
    assert_eq!((s, v["result"].clone()), (200, json!({"done": true})), "{v}");
    // A command that hangs is killed.
    let hang = json!({"computerId": id, "command": "sleep 600", "yieldTimeMs": 250});
    let (s, v) = call(&c, &bot_token, "openbot_computer_exec", hang).await;
    assert_eq!((s, v["result"]["running"].clone()), (200, json!(true)), "{v}");
    let hung = v["result"]["session"].as_str().expect("a running session").to_string();
    let (s, v) =
        call(&c, &bot_token, "openbot_computer_session_kill", json!({"computerId": id, "sessionId": hung})).await;
    assert_eq!((s, v["result"]["running"].clone()), (200, json!(false)), "{v}");
}
