//! The runner: one MCP session per call, under the binding's own UID, with no resident server.
//! It starts the package's stdio server with a real MCP client (rmcp), runs `tools/list` or
//! `tools/call` under a deadline, and afterwards kills every process of that UID (a
//! double-forked, `setsid` child too), reporting whether the drain was confirmed.
//!
//! Limits per server (set after dropping to the UID, before exec): address space (256 MiB by
//! default), processes of the UID (32), open descriptors (256), `no_new_privs`, its own session
//! and process group. The environment is cleared but for `PATH`, `HOME` (the binding's private
//! state directory) and `LANG`.

use std::path::PathBuf;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::transport::TokioChildProcess;
use serde_json::Value;

/// What a server runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLimits {
    /// The whole MCP session (start, initialize, the request, and the end).
    pub deadline: Duration,
    /// RLIMIT_AS, bytes.
    pub address_space: u64,
    /// RLIMIT_NPROC: processes of the UID.
    pub processes: u64,
    /// RLIMIT_NOFILE.
    pub descriptors: u64,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits { deadline: Duration::from_secs(45), address_space: 256 << 20, processes: 32, descriptors: 256 }
    }
}

/// One binding's server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    /// The package's code (read-only to the UID).
    pub code: PathBuf,
    /// The entrypoint: an interpreter or `./file`, then arguments.
    pub entrypoint: Vec<String>,
    /// The binding's UID and GID.
    pub uid: u32,
    /// The binding's GID.
    pub gid: u32,
    /// The binding's private HOME and state.
    pub home: PathBuf,
    /// Limits.
    pub limits: RunLimits,
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The server could not be started.
    #[error("the server did not start: {0}")]
    Spawn(String),
    /// The MCP session failed (the server exited, spoke something else, or refused).
    #[error("MCP: {0}")]
    Protocol(String),
    /// The deadline passed; the server was killed.
    #[error("the call did not finish within {0:?}")]
    Deadline(Duration),
}

/// What the end of a run found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    /// Every process of the UID is gone.
    pub confirmed: bool,
    /// How many were killed.
    pub killed: usize,
}

/// The tools of the server: `tools/list` (every page).
pub async fn discover(spec: &ServerSpec) -> (Result<Value, RunError>, Drain) {
    run(spec, |client| async move {
        let tools = client.list_all_tools().await.map_err(|e| RunError::Protocol(e.to_string()))?;
        serde_json::to_value(tools).map_err(|e| RunError::Protocol(e.to_string()))
    })
    .await
}

/// `tools/call`: answers the MCP result (content, isError, structuredContent) as JSON.
pub async fn call(
    spec: &ServerSpec,
    tool: &str,
    arguments: serde_json::Map<String, Value>,
) -> (Result<Value, RunError>, Drain) {
    let params = serde_json::json!({"name": tool, "arguments": arguments});
    run(spec, |client| async move {
        let params = serde_json::from_value(params).map_err(|e| RunError::Protocol(e.to_string()))?;
        let result = client.call_tool(params).await.map_err(|e| RunError::Protocol(e.to_string()))?;
        serde_json::to_value(result).map_err(|e| RunError::Protocol(e.to_string()))
    })
    .await
}

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

async fn run<F, Fut>(spec: &ServerSpec, f: F) -> (Result<Value, RunError>, Drain)
where
    F: FnOnce(std::sync::Arc<Client>) -> Fut,
    Fut: std::future::Future<Output = Result<Value, RunError>>,
{
    let limits = spec.limits.clone();
    let session = async {
        let cmd = command(spec)?;
        let transport = TokioChildProcess::builder(cmd)
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(|(t, _)| t)
            .map_err(|e| RunError::Spawn(e.to_string()))?;
        let client = ().serve(transport).await.map_err(|e| RunError::Protocol(e.to_string()))?;
        let client = std::sync::Arc::new(client);
        let out = f(client.clone()).await;
        if let Ok(c) = std::sync::Arc::try_unwrap(client) {
            let _ = c.cancel().await;
        }
        out
    };
    let result = match tokio::time::timeout(limits.deadline, session).await {
        Ok(r) => r,
        Err(_) => Err(RunError::Deadline(limits.deadline)),
    };
    // No resident instance: whatever the server left behind goes, whoever its parent is now.
    let drain = kill_uid(spec.uid).await;
    (result, drain)
}

fn command(spec: &ServerSpec) -> Result<tokio::process::Command, RunError> {
    let (program, args) = spec.entrypoint.split_first().ok_or_else(|| RunError::Spawn("no entrypoint".into()))?;
    let program = match program.strip_prefix("./") {
        Some(rel) => spec.code.join(rel),
        None => PathBuf::from(program),
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(&spec.code)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &spec.home)
        .env("LANG", "C.UTF-8")
        .uid(spec.uid)
        .gid(spec.gid)
        .kill_on_drop(true);
    let l = spec.limits.clone();
    // SAFETY: only async-signal-safe calls between fork and exec; these run after the UID change.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let set = |res, v: u64| {
                let r = libc::rlimit { rlim_cur: v, rlim_max: v };
                if libc::setrlimit(res, &r) != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
            };
            set(libc::RLIMIT_AS, l.address_space)?;
            set(libc::RLIMIT_NPROC, l.processes)?;
            set(libc::RLIMIT_NOFILE, l.descriptors)?;
            set(libc::RLIMIT_CORE, 0)?;
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(cmd)
}

/// The live (not zombie) processes of `uid`. The owner of `/proc/<pid>` is the process's
/// effective UID, which for a binding's processes is also the real one (they cannot change it):
/// one `stat` per process, and the status file only for the matches.
fn pids_of(uid: u32) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if e.metadata().ok().map(|m| m.uid()) != Some(uid) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        // A zombie holds nothing; its parent (or init) reaps it.
        if status.lines().any(|l| l.starts_with("State:") && l.contains("Z (zombie)")) {
            continue;
        }
        out.push(pid);
    }
    out
}

/// Kills every process of `uid` until none is left (bounded); a fork racing the kills is caught
/// by the next round.
pub async fn kill_uid(uid: u32) -> Drain {
    if uid == 0 {
        return Drain { confirmed: false, killed: 0 };
    }
    let mut killed = 0;
    // Between rounds, a short wait that grows: a killed process is gone within microseconds, a
    // fork racing the kills is caught by a later round. About 2 s in all before giving up.
    let mut pause = Duration::from_micros(100);
    for _ in 0..40 {
        let pids = pids_of(uid);
        if pids.is_empty() {
            return Drain { confirmed: true, killed };
        }
        for pid in pids {
            // SAFETY: a plain syscall.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
    Drain { confirmed: pids_of(uid).is_empty(), killed }
}
