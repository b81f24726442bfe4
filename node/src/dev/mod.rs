//! `computerd dev`: one node with a local data dir, and this machine paired as the Computer
//! `local` by starting `computer-agent` (found next to `computerd`), laid out so that its tool
//! packages can run ([`lay_out`]). Prints the URL, the owner
//! token and a `curl` that runs `uname -a` on it. When a Docker engine is there, it also serves
//! its sandboxes over WSS with a local CA and registers the `local docker` provider
//! ([`sandboxes`]). Stopping dev stops the node and the agent; the Docker sandboxes keep running
//! (the next dev with the data dir finds them again), and `computerd dev --down` removes them.

mod sandboxes;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use serde_json::json;
use tokio::net::TcpListener;

use crate::Listeners;
use crate::NodeError;
use crate::config::DevConfig;
use crate::datadir::DataDir;
use crate::run;

fn agent_binary() -> Result<PathBuf, NodeError> {
    let exe = std::env::current_exe().map_err(|e| NodeError::Server(format!("cannot find computerd itself: {e}")))?;
    let agent = exe.with_file_name("computer-agent");
    if agent.exists() {
        Ok(agent)
    } else {
        Err(NodeError::Server(format!(
            "{} is missing: build it with `cargo build --release --workspace --bins`",
            agent.display()
        )))
    }
}

/// Creates (idempotently) the paired Computer `local` and answers its id and a fresh pairing
/// code, or `None` for the code when this machine is already paired.
async fn local_computer(base: &str, token: &str, paired: bool) -> Result<(String, Option<String>), NodeError> {
    let http = reqwest::Client::new();
    let mut key = "dev-local".to_string();
    for _ in 0..2 {
        let body = json!({"commandKey": key, "name": "local", "source": {"_tag": "Paired"}});
        let r = sandboxes::call(&http, reqwest::Method::POST, format!("{base}/v1/computers"), token, Some(&body))
            .await
            .map_err(NodeError::Server)?;
        let exe =
            r["executionId"].as_str().ok_or_else(|| NodeError::Server(format!("create refused: {r}")))?.to_string();
        let id = r["resource"]["id"].as_str().unwrap_or_default().to_string();
        let done = loop {
            let e = sandboxes::call(&http, reqwest::Method::GET, format!("{base}/v1/executions/{exe}"), token, None)
                .await
                .map_err(NodeError::Server)?;
            if e["state"] != "pending" && e["state"] != "running" {
                break e;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if paired {
            return Ok((id, None));
        }
        if let Some(code) = done["pairingCode"].as_str() {
            return Ok((id, Some(code.to_string())));
        }
        // The code of the first create was used or expired (the agent's state was lost): pair
        // a new Computer.
        key = format!("dev-local-{}", crate::ids::now_ms());
    }
    Err(NodeError::Server("could not get a pairing code".into()))
}

/// Lays out dev's data dir: DATA (0711, so a tool binding's UID may pass through it to the
/// agent's runtime without listing it), DATA/node (the node's data dir, 0700: store, keys,
/// tokens) and DATA/agent (the agent's state; the agent protects it). A data dir of the layout
/// before this one (the node's files in DATA itself) is moved into DATA/node first.
fn lay_out(data: &std::path::Path) -> Result<(), NodeError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |what: &str, e: std::io::Error| NodeError::Server(format!("{what} {}: {e}", data.display()));
    std::fs::create_dir_all(data).map_err(|e| io("cannot make", e))?;
    let node = data.join("node");
    if data.join("node.json").exists() && !node.exists() {
        std::fs::create_dir(&node).map_err(|e| io("cannot make node/ in", e))?;
        std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o700)).map_err(|e| io("cannot protect", e))?;
        for e in std::fs::read_dir(data).map_err(|e| io("cannot read", e))? {
            let e = e.map_err(|e| io("cannot read", e))?;
            let name = e.file_name();
            if name != "agent" && name != "node" {
                std::fs::rename(e.path(), node.join(&name)).map_err(|e| io("cannot move the node's files in", e))?;
            }
        }
    }
    std::fs::set_permissions(data, std::fs::Permissions::from_mode(0o711)).map_err(|e| io("cannot set the mode of", e))
}

/// Runs one node, pairs this machine, and prints how to call it.
pub async fn dev(cfg: DevConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), NodeError> {
    if cfg.down {
        return sandboxes::down(&cfg.data).await.map_err(|e| NodeError::Config(format!("dev --down: {e}")));
    }
    lay_out(&cfg.data)?;
    let serve = cfg.serve_config();
    let bind = |addr: String| async move {
        TcpListener::bind(&addr).await.map_err(|source| NodeError::Listen { addr, source })
    };
    let token_path = DataDir::open(&serve.data, serve.node_id)?.admin_token_path();
    // After the data dir is made: the local CA lives in it.
    let docker = sandboxes::listen(&cfg, &serve.data).await.map_err(NodeError::Config)?;
    let (extra_https, docker) = match docker {
        Ok((l, tls, s)) => (vec![(l, tls)], Ok(s)),
        Err(why) => (Vec::new(), Err(why)),
    };
    let listeners =
        Listeners { http: bind(serve.http.clone()).await?, grpc: bind(serve.grpc.clone()).await?, extra_https };
    let http = listeners.http.local_addr().map_err(|source| NodeError::Listen { addr: serve.http.clone(), source })?;
    let agent_state = cfg.data.join("agent");
    let agent_bin = agent_binary()?;
    let node = tokio::spawn(run(serve, listeners, shutdown));
    // The node writes the token before it serves HTTP; wait for it or for the node to stop.
    let token = loop {
        if node.is_finished() {
            return node.await.map_err(|e| NodeError::Server(e.to_string()))?;
        }
        if let Ok(t) = tokio::fs::read_to_string(&token_path).await
            && t.ends_with('\n')
        {
            break t.trim().to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let base = format!("http://{http}");
    let paired = agent_state.join("credential.json").exists();
    let (computer, code) = local_computer(&base, &token, paired).await?;
    let mut cmd = tokio::process::Command::new(&agent_bin);
    cmd.args(["--server", &base, "--state"]).arg(&agent_state).kill_on_drop(true);
    if cfg.shared_uid_bindings {
        cmd.arg("--shared-uid-bindings");
    }
    if let Some(code) = &code {
        cmd.args(["--pair", code]);
    }
    let mut agent = cmd.spawn().map_err(|e| NodeError::Server(format!("cannot start {}: {e}", agent_bin.display())))?;
    // Print once the link is up, so the printed call works at once.
    let http_client = reqwest::Client::new();
    for _ in 0..200 {
        let c: Option<Value> =
            match http_client.get(format!("{base}/v1/computers/{computer}")).bearer_auth(&token).send().await {
                Ok(r) => r.json().await.ok(),
                Err(_) => None,
            };
        if c.is_some_and(|c| c["state"] == "running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("computerd dev: one node at {base} (data: {})", cfg.data.display());
    println!("owner token (also in {}): {token}", token_path.display());
    println!("this machine is the Computer {computer} (\"local\"), linked by computer-agent");
    println!(
        "try:  curl -s -H 'Authorization: Bearer {token}' -H 'content-type: application/json' \\\n        {base}/v1/computers/{computer}/sessions -d '{{\"command\":\"uname -a\"}}'"
    );
    // The CLI is built beside this binary (the README's set-up command builds all three).
    let ctl = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("computerctl")))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "computerctl".into());
    println!(
        "or:   {ctl} login --url {base} --token-file {}\n      {ctl} exec -it {computer} bash",
        token_path.display()
    );
    let computerd = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "computerd".into());
    match docker {
        Ok(s) => match sandboxes::provider(&base, &token, &s, &agent_bin).await {
            Ok(id) => {
                println!(
                    "Docker sandboxes: provider {id} (\"local docker\"); their agents dial {} over WSS, pinning {}",
                    s.server_url,
                    s.ca_file.display()
                );
                // A fresh key each time: the same key again answers the first receipt and makes
                // nothing (a new Computer needs a new key).
                let key = crate::ids::new_id("create");
                println!(
                    "  (once: deploy/build-sandbox-image.sh; the sandboxes run this build's computer-agent)\n  \
                     curl -s -H 'Authorization: Bearer {token}' -H 'content-type: application/json' \\\n        \
                     {base}/v1/computers -d '{{\"commandKey\":\"{key}\",\"name\":\"box\",\"source\":{{\"_tag\":\"Provider\",\"provider\":\"{id}\"}}}}'\n  \
                     (each new Computer needs a commandKey of its own: the same key again answers the same receipt)"
                );
            }
            Err(why) => println!("Docker sandboxes: off ({why})"),
        },
        Err(why) => println!("Docker sandboxes: off ({why})"),
    }
    println!(
        "Ctrl-C stops the node and this machine's computer-agent; Docker sandboxes keep running (the next dev \
         with this data dir finds them again): `{computerd} dev --down --data {}` removes them",
        cfg.data.display()
    );
    let result = node.await.map_err(|e| NodeError::Server(e.to_string()))?;
    let _ = agent.kill().await;
    result
}
