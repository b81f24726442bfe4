//! Issue 36, items 10 and 11, on public port addresses of a real sandbox:
//!
//! - A service's `Set-Cookie` loses its `Domain` attribute on the way out, so a cookie set by
//!   one address never reaches the other addresses under the public domain (each cookie is
//!   host-only); its other attributes, and every cookie, stay.
//! - Each request through an address is checked at a current read, a request on a kept-alive
//!   connection of the node's pool too: a node whose replica lags behind a `DELETE` refuses the
//!   next request instead of serving it on the connection it kept.

use std::time::Duration;

use computerd_tests::TestCluster;
use computerd_tests::agent::wait_state;
use computerd_tests::docker::Containers;
use computerd_tests::docker::docker_provider;
use computerd_tests::netfault::NetFault;
use computerd_tests::wait::wait_for;
use reqwest::Method;
use serde_json::json;

/// A service that sets cookies on `/cookies`, and notes every path it serves in `hits.log`.
const SERVER: &str = r#"
import http.server, sys

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        with open("hits.log", "a") as f:
            f.write(self.path + "\n")
        body = b"ok " + self.path.encode()
        self.send_response(200)
        if self.path == "/cookies":
            self.send_header("Set-Cookie", "a=1; Domain=localhost; Path=/; HttpOnly")
            self.send_header("Set-Cookie", "b=2; path=/; domain=.LOCALHOST ; Secure")
            self.send_header("Set-Cookie", "c=3; Path=/")
            self.send_header("Set-Cookie", "d=x;Domain=localhost")
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

/// A cluster of `n` nodes with a sandbox (its agent linked to node 1) serving [`SERVER`] on a
/// port with a public address; answers the cluster, the Computer, the port and the address's
/// host name. The caller keeps the cleanup.
async fn exposed(n: u64, key: &str, cleanup: &mut Containers) -> (TestCluster, String, u16, String) {
    let c = TestCluster::start(n).await;
    let provider = docker_provider(&c, json!({})).await;
    let body = json!({"commandKey": key, "name": key, "source": {"_tag": "Provider", "provider": provider}});
    let (s, v) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&id);
    wait_state(&c, &id, "running").await;
    let port = computerd_tests::free_port();
    let put = json!({"content": SERVER});
    let (s, v) = c.call(Method::PUT, 1, &format!("/v1/computers/{id}/files?path=server.py"), &c.token, Some(put)).await;
    assert_eq!(s, 200, "{v}");
    let start = json!({"command": format!("exec python3 server.py {port} 2>server.err"), "yieldTimeMs": 300});
    let (s, v) = c.call(Method::POST, 1, &format!("/v1/computers/{id}/sessions"), &c.token, Some(start)).await;
    assert_eq!((s, &v["running"]), (200, &json!(true)), "{v}");
    let (s, v) = c
        .call(Method::PUT, 1, &format!("/v1/computers/{id}/ports/{port}"), &c.token, Some(json!({"protocol": "http"})))
        .await;
    assert_eq!(s, 200, "{v}");
    let url = v["url"].as_str().expect("url");
    let authority = url.strip_prefix("http://").and_then(|r| r.split('/').next()).expect("a dev address");
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h).to_string();
    (c, id, port, host)
}

/// A GET of `path` at the address `host`, through the node at `addr`.
async fn get(c: &TestCluster, addr: &str, host: &str, path: &str) -> reqwest::Response {
    c.http
        .get(format!("http://{addr}{path}"))
        .header("host", host)
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("request")
}

/// Waits until the service answers through the node at `addr`.
async fn until_served(c: &TestCluster, addr: &str, host: &str) {
    wait_for("the service to answer through its address", Duration::from_secs(30), || async {
        let r = get(c, addr, host, "/ready").await;
        (r.status().as_u16() == 200).then_some(())
    })
    .await;
}

/// The paths the service has served (its `hits.log`).
async fn hits(c: &TestCluster, id: &str) -> Vec<String> {
    let (s, v) = c.call(Method::GET, 1, &format!("/v1/computers/{id}/files?path=hits.log"), &c.token, None).await;
    assert_eq!(s, 200, "{v}");
    v["content"].as_str().unwrap_or_default().lines().map(String::from).collect()
}

/// Item 10: no cookie a service sets keeps a `Domain`, whatever its case or spacing; the rest of
/// each cookie, and each cookie, stays.
#[tokio::test]
async fn i36_10_a_services_cookies_lose_their_domain() {
    let mut cleanup = Containers::default();
    let (c, _id, _port, host) = exposed(1, "i36-10", &mut cleanup).await;
    let addr = c.nodes[&1].http.clone();
    until_served(&c, &addr, &host).await;
    let r = get(&c, &addr, &host, "/cookies").await;
    assert_eq!(r.status().as_u16(), 200);
    let cookies: Vec<String> =
        r.headers().get_all("set-cookie").iter().map(|v| v.to_str().expect("ASCII cookie").to_string()).collect();
    assert_eq!(cookies.len(), 4, "every cookie stays: {cookies:?}");
    for c in &cookies {
        assert!(!c.to_ascii_lowercase().contains("domain"), "no Domain: {c}");
    }
    assert_eq!(cookies[0], "a=1; Path=/; HttpOnly");
    assert_eq!(cookies[1], "b=2; path=/; Secure");
    assert_eq!(cookies[2], "c=3; Path=/");
    assert_eq!(cookies[3], "d=x");
}

/// Item 11: a node whose replica stopped applying the leader's entries (its connections from
/// the leader cut) keeps an idle connection to the address in its pool; after `DELETE`, its
/// next request through the address is refused, and never reaches the service.
#[tokio::test]
async fn i36_11_a_lagging_node_refuses_a_deleted_address_on_a_kept_connection() {
    let mut cleanup = Containers::default();
    let (c, id, port, host) = exposed(3, "i36-11", &mut cleanup).await;
    let leader = c.leader().await;
    let (_, cv) = c.call(Method::GET, leader, &format!("/v1/computers/{id}"), &c.token, None).await;
    let owner = cv["linkNode"].as_u64().expect("the link's node");
    // A node that is not the leader, and not the owner if another is left.
    let mut others: Vec<u64> = c.nodes.keys().copied().filter(|n| *n != leader).collect();
    others.sort_by_key(|n| *n == owner);
    let s = others[0];
    let s_addr = c.nodes[&s].http.clone();
    until_served(&c, &s_addr, &host).await;
    // Served, and its connection kept by S for the next request.
    let r = get(&c, &s_addr, &host, "/before").await;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await.expect("body"), "ok /before");

    let net = NetFault::new().expect("iptables as root (CI runs as root with iptables installed)");
    let to_s: std::net::SocketAddr = c.nodes[&s].grpc.parse().expect("grpc address");
    net.cut_connections(c.nodes[&leader].ip, to_s).expect("cut the leader's connections to S");
    let (status, v) = c.call(Method::DELETE, leader, &format!("/v1/computers/{id}/ports/{port}"), &c.token, None).await;
    assert_eq!(status, 204, "{v}");
    assert_eq!(get(&c, &c.nodes[&leader].http, &host, "/leader").await.status().as_u16(), 404);
    // S has not applied the DELETE.
    let applied = |h: Option<serde_json::Value>| h.and_then(|h| h["lastApplied"].as_u64()).expect("lastApplied");
    let (at_leader, at_s) = (applied(c.health(leader).await), applied(c.health(s).await));
    assert!(at_s < at_leader, "S lags behind the DELETE: {at_s} < {at_leader}");

    let r = get(&c, &s_addr, &host, "/after").await;
    let status = r.status().as_u16();
    let body = r.text().await.unwrap_or_default();
    assert_ne!(status, 200, "a deleted address is refused by a lagging node: {body}");
    assert!(matches!(status, 404 | 503), "{status} {body}");
    net.heal().expect("heal");
    let seen = hits(&c, &id).await;
    assert!(seen.contains(&"/before".to_string()), "{seen:?}");
    assert!(!seen.contains(&"/after".to_string()), "the refused request never reached the service: {seen:?}");
    // Caught up, S answers 404 like every node.
    wait_for("S to refuse the address as gone", Duration::from_secs(30), || async {
        (get(&c, &s_addr, &host, "/later").await.status().as_u16() == 404).then_some(())
    })
    .await;
}
