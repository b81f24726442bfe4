//! Small pieces the benchmark binaries share: JSON calls, error excerpts, what a report says
//! about the machine and the nodes, and a paired `computer-agent` process.

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_tests::TestCluster;
use reqwest::StatusCode;
use serde_json::Value;

/// How many distinct error messages a report keeps per cell.
pub const ERROR_SAMPLES: usize = 3;

/// Sends `req` and answers its JSON body when the status is `expected`.
pub async fn call_json(req: reqwest::RequestBuilder, expected: StatusCode) -> Result<Value> {
    let resp = req.send().await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    if status != expected {
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        bail!("HTTP {status}: {text}");
    }
    serde_json::from_slice(&body).context("the answer is not JSON")
}

/// A JSON value for an error message, cut to 200 characters.
pub fn excerpt(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// `/proc/loadavg`'s three load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

/// The first few panics in the nodes' logs, each with the line after it (the message).
pub fn panics(c: &TestCluster) -> Vec<String> {
    let mut out = Vec::new();
    for node in c.nodes.values() {
        let text = std::fs::read_to_string(&node.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out.extend(
            lines
                .iter()
                .enumerate()
                .filter(|(_, l)| l.contains("panicked at"))
                .take(ERROR_SAMPLES)
                .map(|(i, l)| format!("node {}: {} {}", node.id, l.trim(), lines.get(i + 1).map_or("", |m| m.trim()))),
        );
    }
    out
}

/// Starts `computer-agent` at `bin`, paired with `code` against `server`, its state in
/// `dir/agent-state` and its warnings in `agent_log`; killed when the handle drops.
pub fn spawn_agent(
    bin: &std::path::Path,
    server: &str,
    code: &str,
    dir: &std::path::Path,
    agent_log: &std::path::Path,
) -> Result<tokio::process::Child> {
    let log = std::fs::File::create(agent_log).context("the agent's log")?;
    tokio::process::Command::new(bin)
        .args(["--server", server, "--pair", code, "--state"])
        .arg(dir.join("agent-state"))
        .env("COMPUTER_AGENT_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {}", bin.display()))
}
