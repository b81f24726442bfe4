//! Inside the Computer, in a real sandbox container with the real agent as root: sessions and
//! file calls run as `user` (uid 1000) in `/workspace` unless a call says `"user": "root"`; as
//! `user`, neither a session nor the file API reaches the agent's credential, registry or
//! runtime, and no session sees the pairing code; root is for members and for bots whose grant
//! says `allowRoot` (which only a member sets); the file API acts with the rights of the call's
//! user: it makes parents, what it creates is the user's, an overwrite keeps the mode, and a
//! FIFO is refused.

use computerd_tests::TestCluster;
use computerd_tests::agent::wait_state;
use computerd_tests::docker::Containers;
use computerd_tests::docker::containers_of;
use computerd_tests::docker::docker_provider;
use computerd_tests::docker::inspect;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

const STATE: &str = "/var/lib/computer-agent";

async fn session(c: &TestCluster, id: &str, token: &str, command: &str, user: Option<&str>) -> (u16, Value) {
    let mut body = json!({"command": command, "yieldTimeMs": 10_000});
    if let Some(u) = user {
        body["user"] = json!(u);
    }
    c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), token, Some(body)).await
}

/// The output of a command that ends, run by `token` as `user`.
async fn out(c: &TestCluster, id: &str, token: &str, command: &str, user: Option<&str>) -> String {
    let (s, v) = session(c, id, token, command, user).await;
    assert_eq!((s, v["running"].clone()), (200, json!(false)), "{command}: {v}");
    v["output"].as_str().expect("output").to_string()
}

#[tokio::test]
async fn t10_sessions_and_files_run_as_user_and_root_is_for_members_and_allowed_bots() {
    let c = TestCluster::start(1).await;
    let provider = docker_provider(&c, json!({})).await;
    let mut cleanup = Containers::default();
    let body = json!({"commandKey": "inside", "name": "inside", "source": {"_tag": "Provider", "provider": provider}});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&id);
    wait_state(&c, &id, "running").await;
    let owner = c.token.clone();

    // `user` by default, at home in the workspace.
    let me = out(&c, &id, &owner, "id -u; id -g; pwd; echo $HOME $USER $LOGNAME", None).await;
    assert_eq!(me, "1000\n1000\n/workspace\n/home/user user user\n");
    let rel = out(&c, &id, &owner, "pwd", None).await;
    assert_eq!(rel, "/workspace\n");

    // Root, for a member who asks: it sees the agent's secret (to check nothing else does).
    assert_eq!(out(&c, &id, &owner, "id -u", Some("root")).await, "0\n");
    let credential = out(&c, &id, &owner, &format!("cat {STATE}/credential.json"), Some("root")).await;
    let secret = serde_json::from_str::<Value>(&credential).expect("credential")["credential"]
        .as_str()
        .expect("the credential's secret")
        .to_string();
    assert!(secret.len() >= 16, "{credential}");
    let agent_pid = out(&c, &id, &owner, "pgrep -o -x computer-agent", Some("root")).await.trim().to_string();
    assert!(!agent_pid.is_empty());
    // The pairing code came in the agent's environment, which not even a root session may read
    // (the agent is not dumpable, and a sandbox has no CAP_SYS_PTRACE); it is in no session's.
    let env = inspect(&containers_of(&id)[0], "{{json .Config.Env}}");
    assert!(env.contains("COMPUTER_AGENT_PAIR="), "the agent was given the code by its environment: {env}");
    let agent_env =
        out(&c, &id, &owner, &format!("tr '\\0' '\\n' < /proc/{agent_pid}/environ 2>&1; echo rc=$?"), Some("root"))
            .await;
    assert!(agent_env.contains("Permission denied") && agent_env.ends_with("rc=1\n"), "{agent_env}");
    let root_env = out(&c, &id, &owner, "tr '\\0' '\\n' < /proc/$$/environ", Some("root")).await;
    assert!(!root_env.contains("COMPUTER_AGENT_"), "{root_env}");

    // As `user`, the agent's state is out of reach, and no refusal names a secret.
    let tries = [
        format!("cat {STATE}/credential.json"),
        format!("ls {STATE}"),
        format!("ls {STATE}/runtime"),
        format!("cat {STATE}/runtime/registry.json"),
        format!("cat /proc/{agent_pid}/environ"),
    ];
    for t in &tries {
        let (s, v) = session(&c, &id, &owner, &format!("{t}; echo rc=$?"), None).await;
        let o = v["output"].as_str().unwrap_or_default();
        assert_eq!(s, 200, "{v}");
        assert!(o.contains("Permission denied") && !o.contains("rc=0"), "{t}: {o}");
        assert!(!o.contains(&secret), "{t}: {o}");
    }
    let user_env = out(&c, &id, &owner, "tr '\\0' '\\n' < /proc/$$/environ; env", None).await;
    assert!(!user_env.contains("COMPUTER_AGENT_"), "{user_env}");
    for path in [
        format!("{STATE}/credential.json"),
        format!("{STATE}/runtime/registry.json"),
        format!("{STATE}/runtime"),
        format!("/proc/{agent_pid}/environ"),
    ] {
        let (s, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/files?path={path}"), &owner, None).await;
        assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "{path}: {v}");
        assert!(!v.to_string().contains(&secret), "{v}");
    }
    for path in [STATE.to_string(), format!("{STATE}/runtime"), format!("{STATE}/runtime/packages")] {
        let (s, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/directory?path={path}"), &owner, None).await;
        assert_eq!(s, 403, "{path}: {v}");
    }
    let (s, v) = c
        .call(Method::GET, 1, &format!("/v1/computers/{id}/files?path={STATE}/credential.json&user=root"), &owner, None)
        .await;
    assert_eq!(s, 200, "a member reads it as root: {v}");

    // Files as `user`: parents made, owned by 1000, an overwrite keeps the mode, FIFOs refused.
    let files = |p: &str| format!("/v1/computers/{id}/files?path={p}");
    let (s, v) = c.call(Method::PUT, 1, &files("made/by/put.txt"), &owner, Some(json!({"content": "one"}))).await;
    assert_eq!((s, v["mode"].clone()), (200, json!(0o644)), "{v}");
    let st = out(&c, &id, &owner, "stat -c '%u:%g %a %n' made made/by made/by/put.txt", None).await;
    assert_eq!(st, "1000:1000 755 made\n1000:1000 755 made/by\n1000:1000 644 made/by/put.txt\n");
    out(&c, &id, &owner, "chmod 751 made/by/put.txt", None).await;
    let (s, v) = c.call(Method::PUT, 1, &files("made/by/put.txt"), &owner, Some(json!({"content": "two"}))).await;
    assert_eq!((s, v["mode"].clone()), (200, json!(0o751)), "{v}");
    assert_eq!(
        out(&c, &id, &owner, "stat -c '%u %a' made/by/put.txt; cat made/by/put.txt", None).await,
        "1000 751\ntwo"
    );
    let (s, v) = c.call(Method::PUT, 1, &files("/root/nope.txt"), &owner, Some(json!({"content": "x"}))).await;
    assert_eq!(s, 403, "user may not write into root's home: {v}");
    let (s, v) = c
        .call(Method::PUT, 1, &format!("{}&user=root", files("/root/yes.txt")), &owner, Some(json!({"content": "x"})))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(out(&c, &id, &owner, "stat -c '%u' /root/yes.txt", Some("root")).await, "0\n");
    out(&c, &id, &owner, "mkfifo pipe", None).await;
    let (s, v) = c.call(Method::GET, 1, &files("pipe"), &owner, None).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("FIFO"), "{v}");
    let raw =
        c.http.get(c.url(1, &format!("{}&encoding=raw", files("pipe")))).bearer_auth(&owner).send().await.expect("raw");
    assert_eq!(raw.status().as_u16(), 400, "a raw read of a FIFO is refused before any byte");
    let (s, v) = c.call(Method::PUT, 1, &files("pipe"), &owner, Some(json!({"content": "x"}))).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = c.call(Method::GET, 1, &files("/dev/zero"), &owner, None).await;
    assert_eq!(s, 400, "a device is refused: {v}");
    let (s, v) = c.call(Method::GET, 1, &format!("{}&user=admin", files("x")), &owner, None).await;
    assert_eq!(s, 400, "only user or root: {v}");

    // Bots: root only with allowRoot, which only a member sets.
    let (s, bot) = c.call(Method::POST, 1, "/v1/bots", &owner, Some(json!({"name": "rootless"}))).await;
    assert_eq!(s, 201, "{bot}");
    let bot = bot["id"].as_str().expect("bot").to_string();
    let grant = format!("/v1/computers/{id}/bots/{bot}");
    let (s, g) = c.call(Method::PUT, 1, &grant, &owner, None).await;
    assert_eq!((s, g["allowRoot"].clone()), (200, json!(false)), "{g}");
    let bot_token = c.mint(json!({"botId": bot})).await;
    assert_eq!(out(&c, &id, &bot_token, "id -u", None).await, "1000\n");
    let (s, v) = session(&c, &id, &bot_token, "id -u", Some("root")).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "{v}");
    let (s, v) = c.call(Method::GET, 1, &format!("{}&user=root", files("/etc/hostname")), &bot_token, None).await;
    assert_eq!(s, 403, "{v}");
    let (s, v) = c.call(Method::PUT, 1, &grant, &bot_token, Some(json!({"allowRoot": true}))).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "a bot cannot allow itself root: {v}");
    let (s, v) = c.call(Method::PUT, 1, &grant, &owner, Some(json!({"allowRoot": "yes"}))).await;
    assert_eq!(s, 400, "{v}");
    let (s, g) = c.call(Method::PUT, 1, &grant, &owner, Some(json!({"allowRoot": true}))).await;
    assert_eq!((s, g["allowRoot"].clone()), (200, json!(true)), "{g}");
    assert_eq!(out(&c, &id, &bot_token, "id -u", Some("root")).await, "0\n");
    // A grant given again without a body keeps it; `false` takes it back.
    let (_, g) = c.call(Method::PUT, 1, &grant, &owner, None).await;
    assert_eq!(g["allowRoot"], true, "{g}");
    let (_, g) = c.call(Method::PUT, 1, &grant, &owner, Some(json!({"allowRoot": false}))).await;
    assert_eq!(g["allowRoot"], false, "{g}");
    let (s, _) = session(&c, &id, &bot_token, "id -u", Some("root")).await;
    assert_eq!(s, 403);
    // A read-only member token is no root either.
    let ro = c.mint(json!({"readOnly": true})).await;
    let (s, v) = c.call(Method::GET, 1, &format!("{}&user=root", files("/etc/hostname")), &ro, None).await;
    assert_eq!(s, 403, "{v}");
}
