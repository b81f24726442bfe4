//! Settings the benchmarks read from the environment, and the HTTP client they share.
//!
//! - `BENCH_QUICK=1`: short cells, for a bounded smoke run;
//! - `BENCH_SECS` / `BENCH_WARMUP_SECS`: measured and warm-up seconds per cell (default 10 and 1;
//!   2 and 0.5 when quick);
//! - `COMPUTERD_BIN`: the `computerd` binary (see [`computerd_bin`]);
//! - `AGENT_BIN`: the `computer-agent` binary, for agent-bench (see [`agent_bin`]);
//! - `BENCH_JSON`: a path to also write the results to, as JSON.

use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;

use crate::workload::Timing;

/// Whether `BENCH_QUICK` asks for short cells.
pub fn quick() -> bool {
    std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Warm-up and measured window per cell from `BENCH_WARMUP_SECS` and `BENCH_SECS`.
pub fn timing(quick: bool) -> Result<Timing> {
    let secs = env_f64("BENCH_SECS")?.unwrap_or(if quick { 2.0 } else { 10.0 });
    let warmup = env_f64("BENCH_WARMUP_SECS")?.unwrap_or(if quick { 0.5 } else { 1.0 });
    if !(secs > 0.0 && secs.is_finite() && warmup >= 0.0 && warmup.is_finite()) {
        bail!("BENCH_SECS must be > 0 and BENCH_WARMUP_SECS >= 0");
    }
    Ok(Timing { warmup: Duration::from_secs_f64(warmup), measure: Duration::from_secs_f64(secs) })
}

/// Sets `COMPUTERD_BIN` to `computerd_bin` for the harness (which reads it when it first starts a
/// node) and builds the multi-threaded tokio runtime a bench runs on.
///
/// # Safety
///
/// It sets an environment variable, so no other thread may exist yet: call it from `main`
/// before anything starts one.
pub unsafe fn runtime_for(computerd_bin: &Path) -> Result<tokio::runtime::Runtime> {
    // SAFETY: no other thread exists (the caller's promise); the runtime's start below.
    unsafe { std::env::set_var("COMPUTERD_BIN", computerd_bin) };
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("tokio runtime")
}

/// `BENCH_JSON`, when set and not empty.
pub fn json_out() -> Option<PathBuf> {
    std::env::var_os("BENCH_JSON").filter(|p| !p.is_empty()).map(PathBuf::from)
}

/// `COMPUTERD_BIN`, else `<target>/release/computerd` if it exists (it is not rebuilt), else the
/// harness default (a debug build, with a warning: its numbers mean little).
pub fn computerd_bin() -> Result<PathBuf> {
    binary(
        "COMPUTERD_BIN",
        "computerd",
        "the harness default (a debug build), so computerd's numbers",
        "cargo build --release -p computerd-node --bin computerd",
        computerd_tests::computerd_bin,
    )
}

/// `AGENT_BIN`, else `<target>/release/computer-agent` if it exists (it is not rebuilt), else the
/// harness's agent (a debug build, with a warning).
pub fn agent_bin() -> Result<PathBuf> {
    binary(
        "AGENT_BIN",
        "computer-agent",
        "the harness's debug build of the agent, so the agent's numbers",
        "cargo build --release -p computer-agent",
        computerd_tests::agent::agent_bin,
    )
}

/// The binary `var` names, else `<target>/release/<name>` if it exists, else `fallback()` with
/// a warning that `instead` (are not representative) and how to `build` the release binary.
fn binary(var: &str, name: &str, instead: &str, build: &str, fallback: fn() -> PathBuf) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("{var}={} is not a file", p.display());
        }
        return Ok(p);
    }
    let release = release_path(name)?;
    if release.is_file() {
        return Ok(release);
    }
    eprintln!(
        "warning: {} not found; using {instead} are not representative. Build it with `{build}`.",
        release.display()
    );
    Ok(fallback())
}

/// `<target dir>/release/<name>` (`CARGO_TARGET_DIR`, else the workspace's `target`).
fn release_path(name: &str) -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("workspace root")?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    Ok(target.join("release").join(name))
}

/// A number of seconds (or any float) from `name`; `None` when unset or blank.
pub fn env_f64(name: &str) -> Result<Option<f64>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => {
            v.trim().parse().map(Some).with_context(|| format!("{name}={v:?} is not a number"))
        }
        _ => Ok(None),
    }
}

/// A count from `name`; `None` when unset or blank.
pub fn env_count(name: &str) -> Result<Option<usize>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => {
            v.trim().parse().map(Some).with_context(|| format!("{name}={v:?} is not a count"))
        }
        _ => Ok(None),
    }
}

/// A comma-separated list of counts from `name`; `None` when unset or blank.
pub fn env_list(name: &str) -> Result<Option<Vec<usize>>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .map(|s| s.trim().parse::<usize>().with_context(|| format!("{name}={v:?}: {s:?} is not a count")))
            .collect::<Result<Vec<_>>>()
            .map(Some),
        _ => Ok(None),
    }
}

/// The client every request of a bench goes through: HTTP/1.1, JSON, kept-alive connections
/// (enough idle ones for 64 writers on 3 nodes), no proxy, a 10 s timeout per request.
pub fn http_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .no_proxy()
        .build()
        .context("http client")
}
