//! `mcp-bench`: the cost of one MCP tool call through computerd's runner against the same server
//! called by a bare MCP client, in the same run.
//!
//! - **computerd**: `Tools::handle(Call)` on an installed binding, exactly as the agent serves it:
//!   re-verify the package's files (tree digest), start the stdio server under the binding's UID
//!   with its limits (setsid, RLIMIT_AS/NPROC/NOFILE, no_new_privs), MCP `initialize`,
//!   `tools/call echo`, close, then kill every process of the UID and confirm none is left.
//! - **bare**: rmcp's client starting the same interpreter on `server.py` (the same file) as a
//!   plain child with the same small environment, the same `initialize` and `tools/call`, then
//!   closing the session (its clean-up).
//!
//! Both start a fresh server per call (no resident instance), alternate, and are timed from the
//! request to the result. The server is the stdlib-only fixture of the agent's tests. Needs root
//! (bindings get their own UIDs). Goal: p50 ratio at most 1.1.
//!
//! ```text
//! cargo build --release -p computerd-bench --bin mcp-bench && target/release/mcp-bench
//! ```
//!
//! Environment: `BENCH_SAMPLES` (default 40; 10 with `BENCH_QUICK=1`).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computer_agent::mcp::bindings::McpRequest;
use computer_agent::mcp::bindings::Tools;
use computer_agent::mcp::runner::RunLimits;
use computerd_bench::report::Recorder;
use computerd_bench::report::Summary;
use computerd_bench::settings;
use rmcp::ServiceExt;
use serde_json::json;
use sha2::Digest;

/// The p50 goal of computerd ÷ bare.
const GOAL: f64 = 1.1;

async fn bare_call(server: &std::path::Path) -> Result<Duration> {
    let t0 = Instant::now();
    // The same interpreter the runner finds (its PATH), and the same small environment: only the
    // UID, the limits, the checks and the clean-up differ.
    let python = ["/usr/local/bin/python3", "/usr/bin/python3", "/bin/python3"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .context("no python3 on the runner's PATH")?;
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(server)
        .current_dir(server.parent().context("server dir")?)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", server.parent().context("server dir")?)
        .env("LANG", "C.UTF-8");
    let transport = rmcp::transport::TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(|(t, _)| t)
        .context("spawn the bare server")?;
    let client = ().serve(transport).await.context("initialize")?;
    let params = serde_json::from_value(json!({"name": "echo", "arguments": {"text": "x"}}))?;
    let r = client.call_tool(params).await.context("call")?;
    // A bare client's clean-up: close the session (the server exits on end of input).
    let _ = client.cancel().await;
    let d = t0.elapsed();
    if serde_json::to_value(&r)?["content"][0]["text"] != "x" {
        bail!("the bare call answered {r:?}");
    }
    Ok(d)
}

async fn ours(tools: &Tools, binding: &str) -> Result<Duration> {
    let t0 = Instant::now();
    let req = McpRequest::Call {
        binding_id: binding.into(),
        tool: "echo".into(),
        arguments: json!({"text": "x"}).as_object().cloned().unwrap_or_default(),
        operation: None,
    };
    let reply = tools.handle(req).await;
    let d = t0.elapsed();
    match reply.result {
        Some(r) if r["content"][0]["text"] == "x" => Ok(d),
        _ => bail!("the computerd call answered {reply:?}"),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    if nix::unistd::geteuid().as_raw() != 0 {
        bail!("mcp-bench needs root: each binding runs under its own UID");
    }
    let samples = settings::env_count("BENCH_SAMPLES")?.unwrap_or(if settings::quick() { 10 } else { 40 });
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/fixtures/mcp_fixture_server.py");
    let pkg = dir.path().join("pkg");
    std::fs::create_dir_all(&pkg)?;
    std::fs::copy(&fixture, pkg.join("server.py")).context("the fixture server")?;
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let archive = workspace.join("server.tar.gz");
    let tar =
        std::process::Command::new("tar").arg("-C").arg(&pkg).arg("-czf").arg(&archive).arg("server.py").status()?;
    if !tar.success() {
        bail!("tar failed");
    }
    let digest = hex::encode(sha2::Sha256::digest(std::fs::read(&archive)?));
    let tools = Tools::new(dir.path().join("runtime"), workspace.clone(), RunLimits::default(), 230_000);
    let install = McpRequest::Install {
        binding_id: "mcb_bench".into(),
        bot_id: "bot_bench".into(),
        artifact_path: "server.tar.gz".into(),
        manifest: json!({"id": "bench.echo", "version": "1.0.0", "sha256": digest,
            "entrypoint": ["python3", "./server.py"], "share_immutable_package": true}),
    };
    let installed = tools.handle(install).await;
    if installed.result.is_none() {
        bail!("install failed: {installed:?}");
    }
    // Warm-up (page cache, Python's bytecode), not counted.
    ours(&tools, "mcb_bench").await?;
    bare_call(&pkg.join("server.py")).await?;
    let (mut a, mut b) = (Recorder::default(), Recorder::default());
    for _ in 0..samples {
        a.ok(ours(&tools, "mcb_bench").await?);
        b.ok(bare_call(&pkg.join("server.py")).await?);
    }
    let a = a.summary("computerd: verify files + server under its UID and limits + kill the UID");
    let b = b.summary("bare: rmcp client + the same python3 server.py as a plain child");
    println!(
        "mcp-bench: one MCP tool call (start server, initialize, tools/call echo, end), {samples} samples each, alternating"
    );
    println!("{:<70} {:>9} {:>9} {:>9}", "op", "p50 ms", "p99 ms", "max ms");
    let row = |s: &Summary| println!("{:<70} {:>9.2} {:>9.2} {:>9.2}", s.op, s.p50_ms, s.p99_ms, s.max_ms);
    row(&a);
    row(&b);
    let (ratio, ratio99) = (a.p50_ratio(&b), a.p99_ratio(&b));
    println!(
        "ratio computerd ÷ bare: p50 {ratio:.3}x ({:+.2} ms), p99 {ratio99:.3}x; goal p50 <= {GOAL}: {}",
        a.p50_diff_ms(&b),
        if ratio <= GOAL { "goal met" } else { "goal missed" }
    );
    let drained = tools.handle(McpRequest::Revoke { binding_id: "mcb_bench".into() }).await;
    if drained.result.as_ref().and_then(|r| r["drained"].as_bool()) != Some(true) {
        bail!("the binding did not drain: {drained:?}");
    }
    Ok(())
}
