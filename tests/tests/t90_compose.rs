//! `deploy/compose.yaml` for real: images built locally by `deploy/build-node-images.sh` (no
//! registry), three nodes and HAProxy started by docker-compose; the cluster forms, takes writes
//! through the balancer, and keeps taking them when the leader's container is killed.

use std::process::Command;
use std::time::Duration;

use computerd_tests::computerd_bin;
use computerd_tests::free_port;
use computerd_tests::wait_for;
use serde_json::Value;
use serde_json::json;

struct Project {
    name: String,
    file: std::path::PathBuf,
    port: u16,
}

impl Project {
    fn compose(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker-compose")
            .args(["-p", &self.name, "-f"])
            .arg(&self.file)
            .args(args)
            .env("COMPUTERD_LB_PORT", self.port.to_string())
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
async fn t10_compose_cluster_survives_a_killed_leader() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("root").to_path_buf();
    let bin = computerd_bin();
    let out = Command::new(root.join("deploy/build-node-images.sh")).arg("--bin").arg(&bin).output().expect("build");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let project = Project {
        name: format!("cdt{}", std::process::id()),
        file: root.join("deploy/compose.yaml"),
        port: free_port(),
    };
    let up = project.compose(&["up", "-d"]);
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let http = reqwest::Client::new();
    let lb = format!("http://127.0.0.1:{}", project.port);
    let token = wait_for("the owner token", Duration::from_secs(30), || async {
        let out = project.compose(&["exec", "-T", "node1", "cat", "/data/admin.token"]);
        let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!t.is_empty()).then_some(t)
    })
    .await;
    // The whole view needs the owner's token (without one, health answers liveness only).
    let health = |http: reqwest::Client, lb: String| {
        let token = token.clone();
        async move {
            let r = http.get(format!("{lb}/v1/health")).bearer_auth(&token).timeout(Duration::from_secs(2)).send();
            r.await.ok()?.json::<Value>().await.ok()
        }
    };
    let leader = wait_for("three voters behind the balancer", Duration::from_secs(60), || async {
        let h = health(http.clone(), lb.clone()).await?;
        let voters = h["members"].as_array()?.iter().filter(|m| m["voter"] == true).count();
        (voters == 3).then(|| h["leaderId"].as_u64()).flatten()
    })
    .await;
    let write = |name: String| {
        let (http, lb, token) = (http.clone(), lb.clone(), token.clone());
        async move {
            let r = http
                .post(format!("{lb}/v1/bots"))
                .bearer_auth(&token)
                .json(&json!({"name": name}))
                .timeout(Duration::from_secs(15))
                .send()
                .await
                .ok()?;
            (r.status() == 201).then_some(())
        }
    };
    assert!(write("before".into()).await.is_some(), "a write through the balancer");

    let killed = project.compose(&["kill", &format!("node{leader}")]);
    assert!(killed.status.success(), "{}", String::from_utf8_lossy(&killed.stderr));
    wait_for("writes after the leader's container was killed", Duration::from_secs(30), || write("after".into())).await;
    // The balancer may still send a probe to the killed container before its own health check
    // marks it down, so one probe can fail; the surviving nodes must name a new leader.
    let new_leader = wait_for("a node naming a leader after the kill", Duration::from_secs(30), || async {
        let h = health(http.clone(), lb.clone()).await?;
        h["leaderId"].as_u64()
    })
    .await;
    assert_ne!(new_leader, leader, "a new leader");
}
