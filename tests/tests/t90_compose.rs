//! `deploy/compose.yaml` for real: images built locally by `deploy/build-node-images.sh` (no
//! registry), three nodes and HAProxy started by docker-compose. HAProxy terminates TLS with the
//! certificate the `certs` service made, and every call here is HTTPS pinning that CA: the
//! cluster forms, takes writes through the balancer, and keeps taking them when the leader's
//! container is killed. Plain HTTP gets no answer, and a client cannot spoof its address to the
//! nodes' per-source limit through the balancer.

use std::process::Command;
use std::time::Duration;

use computerd_tests::computerd_bin;
use computerd_tests::tls::Https;
use computerd_tests::wait_for;
use serde_json::json;

struct Project {
    name: String,
    file: std::path::PathBuf,
    /// The first three octets of the project's network (the balancer is `.10`).
    subnet: String,
}

impl Project {
    fn compose(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker-compose")
            .args(["-p", &self.name, "-f"])
            .arg(&self.file)
            .args(args)
            // Docker picks the balancer's host port when it binds it (`port` below reads it):
            // a port chosen here first could be taken by another test before Docker binds it.
            .env("COMPUTERD_LB_PORT", "0")
            .env("COMPUTERD_SUBNET_PREFIX", &self.subnet)
            .output()
            .expect("run docker-compose")
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = self.compose(&["down", "-v", "-t", "1"]);
    }
}

#[tokio::test]
async fn t10_compose_cluster_over_tls_survives_a_killed_leader() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("root").to_path_buf();
    let bin = computerd_bin();
    let out = Command::new(root.join("deploy/build-node-images.sh")).arg("--bin").arg(&bin).output().expect("build");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let project = Project {
        name: format!("cdt{}", std::process::id()),
        file: root.join("deploy/compose.yaml"),
        subnet: format!("172.29.{}", 100 + std::process::id() % 150),
    };
    let up = project.compose(&["up", "-d"]);
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let published = project.compose(&["port", "lb", "8443"]);
    let published = String::from_utf8_lossy(&published.stdout).to_string();
    let port: u16 = published
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the balancer's published port, from `docker-compose port`: {published:?}"));
    let read = |service: &'static str, file: &'static str| {
        let project = &project;
        move || async move {
            let out = project.compose(&["exec", "-T", service, "cat", file]);
            let t = String::from_utf8_lossy(&out.stdout).to_string();
            (out.status.success() && !t.trim().is_empty()).then_some(t)
        }
    };
    let token = wait_for("the owner token", Duration::from_secs(30), read("node1", "/data/admin.token")).await;
    let token = token.trim().to_string();
    let ca = wait_for("the edge's CA", Duration::from_secs(30), read("lb", "/edge/ca.crt")).await;
    let lb = Https::pinned(&format!("127.0.0.1:{port}"), "localhost", &ca);
    // The whole view needs the owner's token (without one, health answers liveness only).
    let health = || async { lb.call("GET", "/v1/health", Some(&token), None).await.ok().map(|(_, v)| v) };
    let leader = wait_for("three voters behind the balancer, over HTTPS", Duration::from_secs(60), || async {
        let h = health().await?;
        let voters = h["members"].as_array()?.iter().filter(|m| m["voter"] == true).count();
        (voters == 3).then(|| h["leaderId"].as_u64()).flatten()
    })
    .await;
    let write = |name: &'static str| {
        let (lb, token) = (lb.clone(), token.clone());
        move || {
            let (lb, token) = (lb.clone(), token.clone());
            async move {
                let (s, _) = lb.call("POST", "/v1/bots", Some(&token), Some(json!({"name": name}))).await.ok()?;
                (s == 201).then_some(())
            }
        }
    };
    assert!(write("before")().await.is_some(), "a write through the balancer");
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/v1/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err() || !plain.expect("answer").status().is_success(), "plain HTTP gets no health");

    // The balancer replaces a client's X-Forwarded-For with the client's address, which the nodes
    // trust from it alone. Each node allows 10 pairing attempts a minute per source, so of 40
    // attempts from one client, each claiming another address, at most 30 get past the 3 nodes.
    let mut statuses = Vec::new();
    for i in 0..40 {
        let spoof = format!("10.9.8.{i}");
        let headers = [("x-forwarded-for", spoof.as_str())];
        let s = lb.call_with("POST", "/v1/agent/pair", &headers, json!({"code": "NOTACODE"})).await;
        statuses.push(s.map(|(s, _)| s).unwrap_or(0));
    }
    assert!(!statuses.contains(&0), "every attempt is answered: {statuses:?}");
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert!(limited >= 10, "spoofed addresses do not escape the per-source limit: {statuses:?}");

    let killed = project.compose(&["kill", &format!("node{leader}")]);
    assert!(killed.status.success(), "{}", String::from_utf8_lossy(&killed.stderr));
    wait_for("writes after the leader's container was killed", Duration::from_secs(30), write("after")).await;
    // The balancer may still send a probe to the killed container before its own health check
    // marks it down, so one probe can fail; the surviving nodes must name a new leader.
    let new_leader = wait_for("a node naming a leader after the kill", Duration::from_secs(30), || async {
        health().await?["leaderId"].as_u64()
    })
    .await;
    assert_ne!(new_leader, leader, "a new leader");
}
