//! Child bots (SPEC §3), through the API of a real node: a bot created with a parent, or given
//! work by a delegation, acquires at once a Computer its parent holds a grant on, where any
//! other bot must wait for a member's approval; the grant names the delegation; only the parent
//! (or its member) ends the delegation, and that ends what was acquired through it; the
//! parent's own grant ending ends its child's too.

use computerd_tests::TestCluster;
use computerd_tests::agent::paired_computer;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

async fn bot(c: &TestCluster, name: &str, parent: Option<&str>) -> (String, String) {
    let mut body = json!({"name": name});
    if let Some(p) = parent {
        body["parentBotId"] = p.into();
    }
    let (s, v) = c.call(Method::POST, 1, "/v1/bots", &c.token, Some(body)).await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().expect("bot id").to_string();
    let token = c.mint(json!({"botId": id})).await;
    (id, token)
}

async fn acquire(c: &TestCluster, computer: &str, token: &str) -> (u16, Value) {
    c.call(Method::POST, 1, &format!("/v1/computers/{computer}/acquire"), token, Some(json!({}))).await
}

#[tokio::test]
async fn t10_a_child_bot_acquires_its_parents_computer_until_the_delegation_ends() {
    let c = TestCluster::start(1).await;
    let (computer, _) = paired_computer(&c, "deleg").await;
    let (parent, parent_token) = bot(&c, "parent", None).await;
    let grant = |bot: &str| format!("/v1/computers/{computer}/bots/{bot}");
    let (s, v) = c.call(Method::PUT, 1, &grant(&parent), &c.token, Some(json!({}))).await;
    assert_eq!(s, 200, "{v}");

    // A child created with its parent acquires at once; the grant names the delegation.
    let (child, child_token) = bot(&c, "child", Some(&parent)).await;
    let (s, v) = acquire(&c, &computer, &child_token).await;
    assert_eq!((s, &v["granted"]), (200, &json!(true)), "{v}");
    let (s, g) = c.call(Method::GET, 1, &grant(&child), &c.token, None).await;
    assert_eq!((s, g["via"].as_str()), (200, Some(format!("dlg_{child}").as_str())), "{g}");
    // Any other bot of the member asks for an approval.
    let (_, stranger_token) = bot(&c, "stranger", None).await;
    let (s, v) = acquire(&c, &computer, &stranger_token).await;
    assert_eq!((s, &v["state"]), (202, &json!("pending")), "{v}");

    // A delegation the parent makes later works the same way.
    let (late, late_token) = bot(&c, "late", None).await;
    let path = format!("/v1/bots/{parent}/delegations");
    let (s, v) = c.call(Method::POST, 1, &path, &late_token, Some(json!({"childBotId": late}))).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "a bot does not delegate for another: {v}");
    let (s, v) = c.call(Method::POST, 1, &path, &parent_token, Some(json!({"childBotId": "nope"}))).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");
    let (s, d) = c.call(Method::POST, 1, &path, &parent_token, Some(json!({"childBotId": late}))).await;
    assert_eq!(s, 201, "{d}");
    let dlg = d["id"].as_str().expect("delegation id").to_string();
    let (s, v) = c.call(Method::POST, 1, &path, &parent_token, Some(json!({"childBotId": late}))).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (409, Some("conflict")), "one live delegation per pair: {v}");
    let (s, v) = acquire(&c, &computer, &late_token).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = c.call(Method::GET, 1, &path, &parent_token, None).await;
    assert_eq!((s, v["delegations"].as_array().map(Vec::len)), (200, Some(2)), "{v}");
    let (s, _) = c.call(Method::GET, 1, &path, &stranger_token, None).await;
    assert_eq!(s, 404, "another bot does not see them");

    // The child cannot end it; the parent can, and the child's grant through it ends.
    let one = format!("{path}/{dlg}");
    let (s, v) = c.call(Method::DELETE, 1, &one, &late_token, None).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (403, Some("forbidden")), "{v}");
    let (s, v) = c.call(Method::DELETE, 1, &one, &parent_token, None).await;
    assert_eq!((s, &v["ended"]), (200, &json!(dlg)), "{v}");
    let (s, _) = c.call(Method::GET, 1, &grant(&late), &c.token, None).await;
    assert_eq!(s, 404, "the grant acquired through it ended");
    let (s, v) = acquire(&c, &computer, &late_token).await;
    assert_eq!(s, 202, "without the delegation it asks again: {v}");
    let (s, _) = c.call(Method::DELETE, 1, &one, &parent_token, None).await;
    assert_eq!(s, 404, "ended once");

    // The parent losing its grant ends the child's.
    let (s, v) = c.call(Method::DELETE, 1, &grant(&parent), &c.token, None).await;
    assert!(s == 200 || s == 204, "{s} {v}");
    let (s, _) = c.call(Method::GET, 1, &grant(&child), &c.token, None).await;
    assert_eq!(s, 404, "the child's grant ended with its parent's");
    let (s, v) = acquire(&c, &computer, &child_token).await;
    assert_eq!(s, 202, "and it now asks like any bot: {v}");
}
