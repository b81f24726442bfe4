//! `computerd dev`'s Docker sandboxes: the node also serves HTTPS/WSS on the host's address on
//! the sandboxes' own network (its gateway on `computerd-sandboxes`, made when missing), with a
//! certificate of a local CA (DATA/node/edge-tls), and registers a `local
//! docker` provider whose config carries that CA (`caCert`), so the sandboxes' agents pin it and
//! link without `--insecure`, while the person's own calls stay plain HTTP on 127.0.0.1.

use std::net::SocketAddr;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use computerd_actors::docker::DockerConfig;
use computerd_actors::docker::DockerProvider;
use computerd_actors::provider::Provider;
use serde_json::json;
use tokio::net::TcpListener;

use crate::config::DevConfig;

/// How long the bridge certificate lasts (made again when a third is left).
const VALIDITY: Duration = Duration::from_secs(397 * 86_400);

/// Where the sandboxes dial.
pub struct Sandboxes {
    /// `https://<sandbox network gateway>:<port>`.
    pub server_url: String,
    /// The local CA (PEM), pinned by the agents.
    pub ca_pem: String,
    /// Its file, for the person's own `curl --cacert`.
    pub ca_file: PathBuf,
}

/// A bound listener, its TLS, and what the provider is told.
pub type Listening = (TcpListener, Arc<rustls::ServerConfig>, Sandboxes);

/// Binds the sandboxes' HTTPS listener. `Ok(Err(why))`: Docker sandboxes are off, and why; an
/// explicit `--sandbox-http` that cannot be served is an error.
pub async fn listen(cfg: &DevConfig, data: &Path) -> Result<Result<Listening, String>, String> {
    let http_port = cfg.http.parse::<SocketAddr>().map(|a| a.port()).unwrap_or(0);
    let (candidates, explicit) = match cfg.sandbox_http.as_deref() {
        Some("off") => return Ok(Err("turned off (--sandbox-http off)".into())),
        Some(addr) => {
            let a: SocketAddr = addr.parse().map_err(|e| format!("--sandbox-http {addr}: {e}"))?;
            (vec![a], true)
        }
        None => match computerd_actors::docker::bridge_address(None).await {
            Ok(ip) => (vec![SocketAddr::new(ip, http_port), SocketAddr::new(ip, 0)], false),
            Err(why) => return Ok(Err(why)),
        },
    };
    let ip = candidates[0].ip();
    let files = crate::edge_ca::ensure(&data.join("edge-tls"), &[ip.to_string()], VALIDITY)?;
    let tls = crate::edge::tls_config(&files.cert, &files.key)?;
    let mut last = String::new();
    for addr in candidates {
        match TcpListener::bind(addr).await {
            Ok(l) => {
                let port = l.local_addr().map_err(|e| e.to_string())?.port();
                let host = if ip.is_ipv6() { format!("[{ip}]") } else { ip.to_string() };
                let s = Sandboxes {
                    server_url: format!("https://{host}:{port}"),
                    ca_pem: files.ca_pem.clone(),
                    ca_file: files.ca.clone(),
                };
                return Ok(Ok((l, tls, s)));
            }
            Err(e) => last = format!("cannot listen on {addr}: {e}"),
        }
    }
    if explicit { Err(format!("--sandbox-http: {last}")) } else { Ok(Err(last)) }
}

/// One call on the node with the owner token: its JSON answer (whatever its status).
pub(super) async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    token: &str,
    body: Option<&serde_json::Value>,
) -> Result<serde_json::Value, String> {
    let err = |e: reqwest::Error| format!("calling the node: {e}");
    let mut req = http.request(method, url).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(b);
    }
    req.send().await.map_err(err)?.json().await.map_err(err)
}

/// The `local docker` provider of these sandboxes: the one already registered with the same
/// URL, CA and agent, else a new one. Its sandboxes run `agent` (this build's `computer-agent`,
/// mounted over the image's, so the image need not be rebuilt when the agent changes). Answers
/// its id.
pub async fn provider(base: &str, token: &str, s: &Sandboxes, agent: &Path) -> Result<String, String> {
    let agent = agent.to_string_lossy();
    let http = reqwest::Client::new();
    let url = format!("{base}/v1/computer-providers");
    let list = call(&http, reqwest::Method::GET, url.clone(), token, None).await?;
    let same = list["providers"].as_array().into_iter().flatten().find(|p| {
        let c = &p["config"];
        p["kind"] == "docker"
            && c["serverUrl"] == s.server_url.as_str()
            && c["caCert"] == s.ca_pem.as_str()
            && c["agentBinary"] == agent.as_ref()
    });
    if let Some(id) = same.and_then(|p| p["id"].as_str()) {
        return Ok(id.to_string());
    }
    let body = json!({
        "kind": "docker",
        "name": "local docker",
        "config": {"serverUrl": s.server_url, "caCert": s.ca_pem, "agentBinary": agent},
    });
    let r = call(&http, reqwest::Method::POST, url, token, Some(&body)).await?;
    r["id"].as_str().map(str::to_string).ok_or_else(|| format!("registering the provider was refused: {r}"))
}

/// `computerd dev --down`: removes the Docker sandboxes of the data dir `data` (dev's, holding
/// `node/`), printing one line per sandbox and a count. They are found by the local CA their
/// agents pin, which this data dir made (`DockerProvider::pinning`): another data dir's (or
/// cluster's) sandboxes pin another CA, and containers of anything else pin none.
pub async fn down(data: &Path) -> Result<(), String> {
    if !data.join("node").is_dir() {
        return Err(format!("{} is not a data dir of computerd dev (it has no node/)", data.display()));
    }
    let ca_file = data.join("node/edge-tls/ca.crt");
    let ca_pem = match std::fs::read_to_string(&ca_file) {
        Ok(pem) => pem,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("{} is missing: dev never served Docker sandboxes from this data dir", ca_file.display());
            println!("removed 0 sandboxes");
            return Ok(());
        }
        Err(e) => return Err(format!("cannot read {}: {e}", ca_file.display())),
    };
    // The provider's own engine client (dev registers its provider with the default socket).
    let config = serde_json::Map::from_iter([
        ("serverUrl".to_string(), json!("https://computerd-dev.invalid")),
        ("caCert".to_string(), json!(ca_pem)),
    ]);
    let config = DockerConfig::parse(&config)?;
    let docker = DockerProvider::new(config, Duration::from_secs(60));
    let mine = docker.pinning(&ca_pem).await.map_err(|e| format!("listing the sandboxes: {e}"))?;
    let (mut removed, mut failed) = (0, 0);
    for (computer, sandbox) in mine {
        let short = sandbox.sandbox.get(..12).unwrap_or(&sandbox.sandbox);
        match docker.delete_computer(&sandbox.sandbox, &computer, "").await {
            Ok(()) => {
                removed += 1;
                println!(
                    "removed the sandbox of {computer} (container {short}, was {}) and its runtime volume",
                    sandbox.state
                );
            }
            Err(e) => {
                failed += 1;
                println!("could not remove the sandbox of {computer} (container {short}): {e}");
            }
        }
    }
    let s = if removed == 1 { "" } else { "es" };
    println!("removed {removed} sandbox{s}");
    if failed > 0 {
        return Err(format!("{failed} sandbox(es) could not be removed"));
    }
    Ok(())
}
