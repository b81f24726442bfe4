//! Issue 41, item 3: a Computer's egress policy, enforced by the docker provider's egress
//! gateway, with the real Docker engine, `computerd dev`, and Python's HTTP/1.1 server (plain
//! and behind TLS) on this machine, reached from the sandbox by local names (`allowed.test`,
//! `other.test`, the template's `hosts`) and by address.
//!
//! With `{"default": "deny", "allow": ["allowed.test"]}`: `allowed.test` answers over HTTP and
//! HTTPS; `other.test` and the bare address are refused; root in a member's root session cannot
//! undo the rules; a change takes effect within 2 s of the `PUT`, and cuts an open connection
//! to a host it now denies; the gateway counts the denials; a bot's change waits for a member's
//! approval (`computers.egress`) and takes effect with it; the agent's link keeps working
//! throughout (every step is a session call through it); a delete removes the gateway.

use std::io::BufRead;
use std::process::Command;
use std::time::Duration;
use std::time::Instant;

use computerd_tests::dev::Dev;
use computerd_tests::docker::Containers;
use computerd_tests::docker::IMAGE;
use computerd_tests::docker::containers_of;
use computerd_tests::docker::inspect;
use computerd_tests::wait_for;
use reqwest::Method;
use serde_json::Value;
use serde_json::json;

/// A Docker network of the test's own (an operator's network: the node installs no host rules
/// for it, so the sandbox reaches this machine's servers through its gateway address).
struct Network(String);

impl Drop for Network {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["network", "rm", &self.0]).output();
    }
}

/// The site's Python process, killed on drop.
struct Site(std::process::Child);

impl Drop for Site {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `command` in a session (as `user`) until it ends: its output and exit code.
async fn sh(dev: &Dev, id: &str, command: &str, user: &str) -> (String, i64) {
    let body = json!({"command": command, "yieldTimeMs": 30_000, "user": user});
    let (s, v) = dev.call(Method::POST, &format!("/v1/computers/{id}/sessions"), Some(body)).await;
    assert_eq!((s, &v["running"]), (200, &json!(false)), "{command}: {v}");
    (v["output"].as_str().unwrap_or_default().trim().to_string(), v["exitCode"].as_i64().unwrap_or(-1))
}

/// `curl` of `url` in the sandbox: the HTTP status it got, or `000` when the connection failed.
async fn curl(dev: &Dev, id: &str, url: &str) -> String {
    let cmd = format!("curl -sk --max-time 15 -o /dev/null -w '%{{http_code}}' {url}");
    sh(dev, id, &cmd, "user").await.0
}

#[tokio::test]
async fn i41_egress_by_name_through_the_gateway() {
    let dev = Dev::start().await;
    assert!(!dev.docker_line.contains("off"), "Docker is here: {}", dev.docker_line);

    let net = Network(format!("computerd-egress-test-{}", std::process::id()));
    let made = Command::new("docker").args(["network", "create", &net.0]).output().expect("docker network create");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let out = Command::new("docker")
        .args(["network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", &net.0])
        .output()
        .expect("docker network inspect");
    let host = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(host.parse::<std::net::Ipv4Addr>().is_ok(), "the network's gateway: {host:?}");

    // The site: Python's server on every address of this machine, plain and behind TLS.
    let dir = tempfile::tempdir().expect("dir");
    let cert = rcgen::generate_simple_self_signed(vec!["allowed.test".to_string(), "other.test".to_string()])
        .expect("a certificate");
    std::fs::write(dir.path().join("cert.pem"), cert.cert.pem()).expect("cert");
    std::fs::write(dir.path().join("key.pem"), cert.signing_key.serialize_pem()).expect("key");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/egress_site.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg(dir.path().join("cert.pem"))
        .arg(dir.path().join("key.pem"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 egress_site.py");
    let stdout = child.stdout.take().expect("stdout");
    let _site = Site(child);
    let mut lines = std::io::BufReader::new(stdout).lines();
    let mut port = |want: &str| -> u16 {
        let line = lines.next().expect("a line").expect("the site's ports");
        let (kind, port) = line.split_once(' ').expect("kind port");
        assert_eq!(kind, want, "{line}");
        port.parse().expect("a port")
    };
    let (http, https) = (port("http"), port("https"));

    // A provider like dev's, on the test's network, whose template names the site.
    let mut config = dev.docker_provider().await["config"].clone();
    config["network"] = json!(net.0);
    config["templates"] = json!({"default": {
        "image": IMAGE, "cpus": 1.0, "memoryMb": 512, "pids": 256,
        "hosts": {"allowed.test": host, "other.test": host},
    }});
    let body = json!({"kind": "docker", "name": "egress", "config": config});
    let (s, v) = dev.call(Method::POST, "/v1/computer-providers", Some(body)).await;
    assert_eq!(s, 201, "{v}");
    let provider = v["id"].as_str().expect("provider id").to_string();

    // A bad policy is refused before anything is made.
    let bad = json!({"commandKey": "egress-bad", "source": {"_tag": "Provider", "provider": provider},
                     "egress": {"default": "deny", "allow": ["not a name"]}});
    let (s, v) = dev.call(Method::POST, "/v1/computers", Some(bad)).await;
    assert_eq!((s, v["error"]["kind"].as_str()), (400, Some("invalid_request")), "{v}");

    let mut cleanup = Containers::default();
    let body = json!({"commandKey": "egress-1", "name": "egress", "source": {"_tag": "Provider", "provider": provider},
                      "egress": {"default": "deny", "allow": ["allowed.test"]}});
    let (s, v) = dev.call(Method::POST, "/v1/computers", Some(body)).await;
    assert_eq!(s, 202, "{v}");
    let id = v["resource"]["id"].as_str().expect("id").to_string();
    cleanup.track(&id);
    wait_for("the sandbox's agent to link", Duration::from_secs(120), || async {
        let (_, c) = dev.call(Method::GET, &format!("/v1/computers/{id}"), None).await;
        assert_ne!(c["state"], "failed", "{c}");
        (c["state"] == "running").then_some(())
    })
    .await;
    let sandbox = containers_of(&id).pop().expect("the sandbox");
    let gateway = format!("computerd-{id}-egress");
    assert_eq!(
        inspect(&sandbox, "{{.HostConfig.NetworkMode}}"),
        format!("container:{}", inspect(&gateway, "{{.Id}}")),
        "the sandbox shares the gateway's network namespace"
    );

    // By name, as the policy says; by address, refused.
    assert_eq!(curl(&dev, &id, &format!("http://allowed.test:{http}/")).await, "200");
    assert_eq!(curl(&dev, &id, &format!("https://allowed.test:{https}/")).await, "200", "TLS, by SNI");
    assert_eq!(curl(&dev, &id, &format!("http://other.test:{http}/")).await, "403");
    assert_eq!(curl(&dev, &id, &format!("https://other.test:{https}/")).await, "000");
    assert_eq!(curl(&dev, &id, &format!("http://{host}:{http}/")).await, "403", "a bare address");
    // A name the sandbox points elsewhere still goes where the gateway resolves it: an allowed
    // name cannot carry a connection to another host.
    let (answer, code) =
        sh(&dev, &id, &format!("curl -s --max-time 15 http://allowed.test:{http}/ -H 'Host: other.test'"), "user")
            .await;
    assert!(code != 0 || !answer.contains("hello"), "a Host of another name is that name's: {answer}");

    // Root cannot undo the rules.
    let (out, code) =
        sh(&dev, &id, "iptables -t nat -F; iptables -F; iptables -P OUTPUT ACCEPT; echo done", "root").await;
    assert!(out.contains("Permission denied") || out.contains("not permitted"), "{out} ({code})");
    assert_eq!(curl(&dev, &id, &format!("http://other.test:{http}/")).await, "403", "still refused after root tried");

    // A long download from allowed.test, open while the policy changes.
    let long = json!({"command": format!("curl -sN http://allowed.test:{http}/slow > /tmp/slow.txt; echo curl-ended-$?"),
                      "yieldTimeMs": 1000, "user": "user"});
    let (s, v) = dev.call(Method::POST, &format!("/v1/computers/{id}/sessions"), Some(long)).await;
    assert_eq!((s, &v["running"]), (200, &json!(true)), "{v}");
    let slow_session = v["sessionId"].as_str().expect("session id").to_string();

    // A change: other.test allowed, allowed.test no more. It holds when the PUT answers.
    let started = Instant::now();
    let put = json!({"default": "deny", "allow": ["other.test"]});
    let (s, v) = dev.call(Method::PUT, &format!("/v1/computers/{id}/egress"), Some(put)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(curl(&dev, &id, &format!("http://other.test:{http}/")).await, "200");
    assert_eq!(curl(&dev, &id, &format!("http://allowed.test:{http}/")).await, "403");
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "the change took effect in {took:?}");
    // A late change of an older revision (a racing PUT that lost) cannot undo it: the gateway
    // keeps the later one in force.
    let open = r#"{"default":"allow","allow":[],"deny":[]}"#;
    let late = Command::new("docker")
        .args(["exec", &gateway, "/usr/local/bin/computer-agent", "egress-gateway", "set", open, "0"])
        .output()
        .expect("docker exec");
    assert!(String::from_utf8_lossy(&late.stdout).contains(r#""stale":true"#), "{late:?}");
    assert_eq!(curl(&dev, &id, &format!("http://allowed.test:{http}/")).await, "403", "the later policy stayed");
    // The open download was cut.
    let ended = wait_for("the open download to be cut", Duration::from_secs(10), || async {
        let (_, v) = dev.call(Method::GET, &format!("/v1/computers/{id}/sessions/{slow_session}"), None).await;
        (v["running"] == json!(false)).then_some(v)
    })
    .await;
    let (lines, _) = sh(&dev, &id, "wc -l < /tmp/slow.txt", "user").await;
    let lines: u32 = lines.parse().unwrap_or(0);
    assert!(lines < 590, "cut well before its end ({lines} lines): {ended}");

    // The record and the gateway's counts.
    let (s, v) = dev.call(Method::GET, &format!("/v1/computers/{id}/egress"), None).await;
    assert_eq!((s, &v["policy"]["allow"]), (200, &json!(["other.test"])), "{v}");
    let e = &v["enforcement"];
    assert!(e["denied"].as_u64().unwrap_or(0) >= 4, "{v}");
    assert!(e["cut"].as_u64().unwrap_or(0) >= 1, "{v}");
    let recent: Vec<&Value> = e["recent"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
    assert!(recent.iter().any(|d| d["host"] == "other.test" && d["port"] == json!(http)), "{v}");
    let (_, c) = dev.call(Method::GET, &format!("/v1/computers/{id}"), None).await;
    assert_eq!(c["egress"]["allow"], json!(["other.test"]), "{c}");
    // The refusals are events too: the leader's watch follows the gateway's log and reports
    // each window's count with a sample.
    let denied = wait_for("the refusals as events", Duration::from_secs(20), || async {
        let (_, v) = dev.call(Method::GET, "/v1/events?limit=1000", None).await;
        let events: Vec<Value> = v["events"].as_array().cloned().unwrap_or_default();
        let denied: Vec<Value> =
            events.into_iter().filter(|e| e["type"] == "EgressDenied" && e["computerId"] == json!(id)).collect();
        let count: u64 = denied.iter().map(|e| e["data"]["count"].as_u64().unwrap_or(0)).sum();
        (count >= 4).then_some(denied)
    })
    .await;
    let samples: Vec<&Value> =
        denied.iter().flat_map(|e| e["data"]["sample"].as_array().into_iter().flatten()).collect();
    assert!(samples.iter().any(|d| d["host"] == "other.test" && d["port"] == json!(http)), "{denied:?}");
    assert!(samples.iter().any(|d| d["host"] == json!(host)), "the bare address: {denied:?}");

    // A bot asks (capability computers.egress); nothing changes until a member approves.
    let (s, bot) = dev.call(Method::POST, "/v1/bots", Some(json!({"name": "egress-bot"}))).await;
    assert_eq!(s, 201, "{bot}");
    let bot_id = bot["id"].as_str().expect("bot id").to_string();
    let (s, t) = dev.call(Method::POST, "/v1/tokens", Some(json!({"name": "b", "botId": bot_id}))).await;
    assert_eq!(s, 201, "{t}");
    let bot_token = t["secret"].as_str().expect("secret").to_string();
    let (s, g) = dev.call(Method::PUT, &format!("/v1/computers/{id}/bots/{bot_id}"), None).await;
    assert_eq!(s, 200, "{g}");
    let both = json!({"default": "deny", "allow": ["allowed.test", "other.test"]});
    let (s, v) = dev.call_as(&bot_token, Method::PUT, &format!("/v1/computers/{id}/egress"), Some(both.clone())).await;
    assert_eq!((s, &v["state"]), (202, &json!("pending")), "{v}");
    let approval = v["approvalId"].as_str().expect("approval id").to_string();
    assert_eq!(curl(&dev, &id, &format!("http://allowed.test:{http}/")).await, "403", "not before a member decides");
    let (s, v) =
        dev.call(Method::POST, &format!("/v1/approvals/{approval}"), Some(json!({"decision": "approve"}))).await;
    assert_eq!((s, &v["state"]), (200, &json!("approved")), "{v}");
    assert_eq!(curl(&dev, &id, &format!("http://allowed.test:{http}/")).await, "200", "applied on approval");
    let (_, v) = dev.call(Method::GET, &format!("/v1/computers/{id}/egress"), None).await;
    assert_eq!((&v["policy"]["default"], &v["policy"]["allow"]), (&both["default"], &both["allow"]), "{v}");

    // A delete takes the gateway with the sandbox.
    let (s, v) =
        dev.call(Method::DELETE, &format!("/v1/computers/{id}"), Some(json!({"commandKey": "egress-del"}))).await;
    assert_eq!(s, 202, "{v}");
    wait_for("the gateway to go", Duration::from_secs(60), || async {
        let out = Command::new("docker").args(["ps", "-aq", "--filter", &format!("name={gateway}")]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    })
    .await;
}
