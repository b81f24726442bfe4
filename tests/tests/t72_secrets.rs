//! Issue 41, items 1 and 2: secrets the model never sees. A member puts two secrets in the
//! vault (the site's username and password, for the site's origin) and names them in a bot's
//! grant; the bot signs in to the test site in a real desktop sandbox (Chromium driven by the
//! agent) with `fill_secret`, by name only. Shown:
//!
//! - `GET /v1/secrets` and the grant answer metadata, never a value; a bot has no vault;
//! - a bot whose grant names no secret is refused; so is a secret for another origin, and a
//!   password on a search box or a note field; a revoked grant stops the next fill;
//! - the site signed alice in; the action record names the secret, never its value;
//! - the username shows masked in later snapshots (`[secret "…"]`);
//! - the password is in nothing the bot received, in no node's log or data dir (the store's
//!   log and snapshots: sealed values only), and not in the agent's log.

use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::browser::desktop_computer;
use computerd_tests::browser::find;
use computerd_tests::browser::start_site;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// The site's password (`browser_site.py`'s account alice / wonderland).
const PASSWORD: &str = "wonderland";

struct Bot<'a> {
    c: &'a TestCluster,
    id: String,
    token: String,
    /// Every answer the bot received, as text.
    seen: std::cell::RefCell<Vec<String>>,
}

impl Bot<'_> {
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let (s, v) = self.c.call(method, 1, path, &self.token, body).await;
        self.seen.borrow_mut().push(v.to_string());
        (s, v)
    }
    async fn post(&self, tool: &str, body: Value) -> (u16, Value) {
        self.call(Method::POST, &format!("/v1/computers/{}/browser/{tool}", self.id), Some(body)).await
    }
    async fn tool(&self, tool: &str, body: Value) -> Value {
        let (s, v) = self.post(tool, body.clone()).await;
        assert_eq!(s, 200, "{tool} {body}: {v}");
        v
    }
}

/// Files under `dir` whose bytes hold `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(p);
            } else if t.is_file()
                && let Ok(bytes) = std::fs::read(&p)
                && bytes.windows(needle.len()).any(|w| w == needle)
            {
                hits.push(p.display().to_string());
            }
        }
    }
    hits
}

#[tokio::test]
async fn i41_a_bot_signs_in_with_secrets_it_never_sees() {
    let c = TestCluster::start(1).await;
    let (id, _cleanup) = desktop_computer(&c, "vault").await;
    let site = start_site(&c, &id).await;

    // The member's vault: write-only.
    let put = |name: &str, body: Value| {
        let (c, name) = (&c, name.to_string());
        async move { c.call(Method::PUT, 1, &format!("/v1/secrets/{name}"), &c.token, Some(body)).await }
    };
    let (s, v) = put("site-a", json!({"value": PASSWORD, "origins": [site], "kind": "password"})).await;
    assert_eq!((s, v["name"].as_str(), v["kind"].as_str()), (200, Some("site-a"), Some("password")), "{v}");
    assert!(!v.to_string().contains(PASSWORD), "{v}");
    let (s, v) = put("site-a-user", json!({"value": "alice", "origins": [site]})).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = put("elsewhere", json!({"value": "not-for-here", "origins": ["https://other.example"]})).await;
    assert_eq!(s, 200, "{v}");
    for (body, why) in [
        (json!({"value": "abc", "origins": [site]}), "too short"),
        (json!({"value": PASSWORD, "origins": []}), "no origin"),
        (json!({"value": PASSWORD, "origins": [format!("{site}/login")]}), "a path"),
        (json!({"value": "GEZDGNBV!", "origins": [site], "kind": "totp"}), "not base32"),
        (json!({"value": PASSWORD, "origins": [site], "kind": "pin"}), "no such kind"),
    ] {
        let (s, v) = put("bad", body).await;
        assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{why}: {v}");
        assert!(!v.to_string().contains(PASSWORD), "an error never echoes the value: {v}");
    }
    let (s, v) = put("Bad Name", json!({"value": PASSWORD, "origins": [site]})).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = c.call(Method::GET, 1, "/v1/secrets", &c.token, None).await;
    assert_eq!(s, 200, "{v}");
    let names: Vec<&str> =
        v["secrets"].as_array().expect("secrets").iter().filter_map(|x| x["name"].as_str()).collect();
    assert_eq!(names, ["elsewhere", "site-a", "site-a-user"], "{v}");
    assert!(!v.to_string().contains(PASSWORD) && !v.to_string().contains("alice"), "metadata only: {v}");

    // A bot, granted the Computer without secrets.
    let bot_id = c.create_bot(1, "signer").await.expect("bot").1["id"].as_str().expect("bot id").to_string();
    let grant = |body: Value| {
        let (c, path) = (&c, format!("/v1/computers/{id}/bots/{bot_id}"));
        async move { c.call(Method::PUT, 1, &path, &c.token, Some(body)).await }
    };
    let (s, v) = grant(json!({})).await;
    assert_eq!(s, 200, "{v}");
    let bot = Bot { c: &c, id: id.clone(), token: c.mint(json!({"botId": bot_id})).await, seen: Default::default() };
    let (s, v) = bot.call(Method::GET, "/v1/secrets", None).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "a bot has no vault: {v}");
    let (s, v) =
        bot.call(Method::PUT, "/v1/secrets/mine", Some(json!({"value": "bot-secret", "origins": [site]}))).await;
    assert_eq!(s, 403, "{v}");

    let opened = bot.tool("sessions", json!({"profile": "site-a", "url": format!("{site}/login")})).await;
    let sid = opened["session"].as_str().expect("session").to_string();
    let snap = bot.tool("snapshot", json!({"session": sid, "format": "json"})).await;
    let (user, pass) = (find(&snap, "textbox", "Username"), find(&snap, "textbox", "Password"));
    let (s, v) = bot.post("fill_secret", json!({"session": sid, "ref": pass, "secret": "site-a"})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "the grant names no secret: {v}");
    let (s, v) = grant(json!({"secrets": ["nope"]})).await;
    assert_eq!(s, 404, "a grant names secrets of the vault only: {v}");
    let (s, v) = grant(json!({"secrets": ["site-a", "site-a-user", "elsewhere"]})).await;
    assert_eq!((s, v["secrets"].as_array().map(Vec::len)), (200, Some(3)), "{v}");
    assert!(!v.to_string().contains(PASSWORD), "{v}");

    // A caller's own `fill` is refused; a secret for another origin is refused.
    let forged = json!({"session": sid, "ref": pass, "secret": "site-a", "fill": {"kind": "text", "origins": [site], "value": "forged-value"}});
    let (s, v) = bot.post("fill_secret", forged).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = bot.post("fill_secret", json!({"session": sid, "ref": pass, "secret": "elsewhere"})).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "another origin: {v}");

    // Signed in by name only.
    let filled = bot.tool("fill_secret", json!({"session": sid, "ref": user, "secret": "site-a-user"})).await;
    assert_eq!(filled["filled"], "site-a-user", "{filled}");
    let filled = bot
        .tool(
            "fill_secret",
            json!({"session": sid, "ref": pass, "secret": "site-a", "actionId": "pw-1", "intent": "the password of site A"}),
        )
        .await;
    assert_eq!(
        (filled["filled"].as_str(), filled["action"]["state"].as_str()),
        (Some("site-a"), Some("done")),
        "{filled}"
    );
    assert_eq!(filled["action"]["request"]["secret"], "site-a", "the record names the secret: {filled}");
    let snap = bot.tool("snapshot", json!({"session": sid, "format": "json"})).await;
    assert!(
        snap["text"].as_str().unwrap_or_default().contains(r#""[filled from secret \"site-a-user\"]""#),
        "the filled field shows what filled it: {}",
        snap["text"]
    );
    let clicked = bot
        .tool("click", json!({"session": sid, "ref": find(&snap, "button", "Sign in"), "actionId": "login-1"}))
        .await;
    assert_eq!(clicked["outcome"]["state"], "done", "{clicked}");
    let status = bot
        .tool(
            "session_status",
            json!({"session": sid, "origin": site, "probes": {"signedInSelector": "#who", "account": "alice"}}),
        )
        .await;
    assert_eq!(status["signedIn"], true, "the site signed alice in with the vault's password: {status}");
    let home = bot.tool("navigate", json!({"session": sid, "url": format!("{site}/")})).await;
    assert_eq!(home["status"], 200, "{home}");
    let snap = bot.tool("snapshot", json!({"session": sid})).await;
    let text = snap["text"].as_str().unwrap_or_default();
    assert!(
        (text.contains(r#"[secret \"site-a-user\"]"#) || text.contains(r#"[secret "site-a-user"]"#))
            && !text.contains("alice"),
        "the page shows the username; the bot sees it masked:\n{text}"
    );
    let (s, v) = c.call(Method::GET, 1, "/v1/secrets/site-a", &c.token, None).await;
    assert!(s == 200 && v["lastUsedAt"].as_u64().is_some(), "its last use is noted: {v}");

    // A password on fields that are not sign-in fields: refused, nothing typed.
    bot.tool("navigate", json!({"session": sid, "url": format!("{site}/widgets")})).await;
    let snap = bot.tool("snapshot", json!({"session": sid, "format": "json"})).await;
    for (role, name) in [("searchbox", "Search"), ("textbox", "Note")] {
        let Some(r) = snap["elements"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["name"] == name && (e["role"] == role || e["role"] == "textbox")))
            .and_then(|e| e["ref"].as_str())
        else {
            panic!("no {name} field:\n{}", snap["text"]);
        };
        let (s, v) = bot.post("fill_secret", json!({"session": sid, "ref": r, "secret": "site-a"})).await;
        assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{name}: {v}");
    }
    let after = bot.tool("snapshot", json!({"session": sid})).await;
    assert!(!after["text"].as_str().unwrap_or_default().contains("[filled"), "nothing typed: {}", after["text"]);

    // The grant's secrets removed, then the grant revoked: the next fill is refused.
    bot.tool("navigate", json!({"session": sid, "url": format!("{site}/login")})).await;
    let snap = bot.tool("snapshot", json!({"session": sid, "format": "json"})).await;
    let pass = find(&snap, "textbox", "Password");
    let (s, v) = grant(json!({"secrets": []})).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = bot.post("fill_secret", json!({"session": sid, "ref": pass, "secret": "site-a"})).await;
    assert_eq!(s, 403, "{v}");
    let (s, v) = grant(json!({"secrets": ["site-a"]})).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = c.call(Method::DELETE, 1, &format!("/v1/computers/{id}/bots/{bot_id}"), &c.token, None).await;
    assert_eq!(s, 204, "{v}");
    let (s, v) = bot.post("fill_secret", json!({"session": sid, "ref": pass, "secret": "site-a"})).await;
    assert!(s == 403 || s == 404, "a revoked grant fills nothing: {s} {v}");

    // The store's whole state, as a backup holds it: the secret is there, sealed only.
    let backup =
        reqwest::Client::new().get(c.url(1, "/v1/admin/backup")).bearer_auth(&c.token).send().await.expect("backup");
    assert_eq!(backup.status(), 200);
    let backup = backup.bytes().await.expect("backup bytes");
    let holds = |needle: &[u8]| backup.windows(needle.len()).any(|w| w == needle);
    assert!(holds(b"site-a-user") && holds(b"\"sealed\""), "the backup holds the vault's records");
    assert!(!holds(PASSWORD.as_bytes()) && !holds(b"alice"), "a backup holds sealed values only");

    // The password: in nothing the bot received, no node log or data dir, not the agent's log.
    let seen = bot.seen.borrow().join("\n");
    assert!(!seen.contains(PASSWORD), "the bot received the password");
    assert_eq!(files_holding(c.dir.path(), PASSWORD.as_bytes()), Vec::<String>::new(), "node logs and data dirs");
    let logs =
        std::process::Command::new("docker").args(["logs", &format!("computerd-{id}")]).output().expect("docker logs");
    assert!(logs.status.success(), "docker logs: {}", String::from_utf8_lossy(&logs.stderr));
    let all = [logs.stdout, logs.stderr].concat();
    assert!(!all.is_empty(), "the agent logs to the container's output");
    assert!(!all.windows(PASSWORD.len()).any(|w| w == PASSWORD.as_bytes()), "the agent's log holds the password");
}

/// A voter that joined a moment ago has not fetched the CA's key yet (its upkeep does that on
/// its own schedule); it fetches it when the vault first needs it, so every voter seals at once.
#[tokio::test]
async fn i41_every_voter_seals_from_the_start() {
    let c = TestCluster::start(3).await;
    for node in [3u64, 2, 1] {
        let body = json!({"value": format!("value-of-{node}"), "origins": ["https://site.example"]});
        // A node just started may not have recorded the store version it speaks yet: the vault
        // (version 4) waits for every node's (a refusal that changes nothing), then succeeds.
        let (s, v) = wait_for("every node to speak the vault's store version", Duration::from_secs(30), || async {
            let (s, v) =
                c.call(Method::PUT, node, &format!("/v1/secrets/from-{node}"), &c.token, Some(body.clone())).await;
            let early =
                s == 409 && v["error"]["message"].as_str().is_some_and(|m| m.contains("not spoken by every node"));
            (!early).then_some((s, v))
        })
        .await;
        assert_eq!(s, 200, "node {node}: {v}");
    }
    let (s, v) = c.call(Method::GET, 2, "/v1/secrets", &c.token, None).await;
    assert_eq!((s, v["secrets"].as_array().map(Vec::len)), (200, Some(3)), "{v}");
}
