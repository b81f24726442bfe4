//! The runner: one MCP session per call, under the binding's own UID, with no resident server.
//! It starts the package's stdio server with a real MCP client (rmcp), runs `tools/list` or
//! `tools/call` under a deadline, and afterwards kills every task of that UID (a double-forked,
//! `setsid` child and the live threads of a zombie thread-group leader too: [`kill_uid`]),
//! reporting whether the drain was confirmed.
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
    /// The bindings' shared group, which alone may pass through to the runtime.
    pub group: Option<u32>,
    /// The binding runs under the agent's own UID (the owner's choice on a non-root agent): no
    /// UID change, and the drain ends the server's session instead of a UID's tasks.
    pub shared_uid: bool,
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
    let leader = std::sync::Mutex::new(None::<u32>);
    let session = async {
        let cmd = command(spec)?;
        let transport = TokioChildProcess::builder(cmd)
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(|(t, _)| t)
            .map_err(|e| RunError::Spawn(e.to_string()))?;
        // The server leads a session of its own (setsid): its id is the server's pid.
        *leader.lock().unwrap_or_else(|p| p.into_inner()) = transport.id();
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
    let drain = if spec.shared_uid {
        let sid = *leader.lock().unwrap_or_else(|p| p.into_inner());
        match sid {
            Some(sid) => kill_session(sid as i32).await,
            None => Drain { confirmed: true, killed: 0 },
        }
    } else {
        kill_uid(spec.uid).await
    };
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
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &spec.home)
        .env("LANG", "C.UTF-8")
        .kill_on_drop(true);
    let l = spec.limits.clone();
    // The binding's UID and GID with, as its only other group, the bindings' group; then its
    // code directory, entered with those rights.
    let ids = (!spec.shared_uid).then(|| {
        let mut groups = vec![spec.gid];
        groups.extend(spec.group);
        (spec.uid, spec.gid, groups)
    });
    let code = std::ffi::CString::new(spec.code.as_os_str().as_encoded_bytes())
        .map_err(|_| RunError::Spawn("the code's path has a NUL".into()))?;
    // SAFETY: only async-signal-safe calls between fork and exec (no allocation).
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((uid, gid, groups)) = &ids {
                crate::users::become_ids(*uid, *gid, groups)?;
            }
            if libc::chdir(code.as_ptr()) != 0 {
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

/// How long a drain keeps killing before it reports the UID not confirmed empty.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(3);

/// A task's state and real and effective UIDs, from its `status` file. `None` when the file has
/// neither line (it always has both).
fn task_creds(status: &[u8]) -> Option<(u8, u32, u32)> {
    let mut state = None;
    let mut uids = None;
    for line in status.split(|&b| b == b'\n') {
        if let Some(rest) = line.strip_prefix(b"State:") {
            state = rest.iter().copied().find(|b| !b.is_ascii_whitespace());
        } else if let Some(rest) = line.strip_prefix(b"Uid:") {
            let rest = std::str::from_utf8(rest).ok()?;
            let mut ids = rest.split_ascii_whitespace().map(|v| v.parse::<u32>().ok());
            uids = Some((ids.next()??, ids.next()??));
            break;
        }
    }
    let (real, effective) = uids?;
    Some((state?, real, effective))
}

/// The live tasks (threads) of `uid`, as (thread group, thread).
///
/// Every process's task list is read, zombies' too: a thread-group leader that called
/// `pthread_exit` is a zombie while its other threads run on, so the leader's state says nothing
/// about its group. Each task is judged by its own credentials: first the owner of its
/// `/proc/<pid>/task/<tid>` directory, which is the task's effective UID (the kernel keeps the
/// world-readable per-task directories the euid's even for a non-dumpable task, whose files go to
/// root), one `stat` per task; then, for those, its `status` (the `Uid:` line: real or effective
/// is `uid`, and the `State:`). Reading every task's `status` costs about 6x the `stat`s (5.8 ms
/// against 0.9 ms per scan for 180 tasks here), a drain scans at least once per call, and a
/// binding cannot make a task whose real UID is its own but whose effective one is not (it has no
/// CAP_SETUID and runs with no_new_privs, so every id it holds is its UID). A task that is a
/// zombie (`Z`) or dead (`X`) runs nothing and is not counted: its parent (or init) reaps it.
pub fn tasks_of(uid: u32) -> Vec<(i32, i32)> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return out };
    let mut buf = Vec::with_capacity(4096);
    for p in procs.flatten() {
        let Some(tgid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else { continue };
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
            if t.metadata().map(|m| m.uid()).ok() != Some(uid) {
                continue;
            }
            buf.clear();
            let read = std::fs::File::open(t.path().join("status")).and_then(|mut f| f.read_to_end(&mut buf));
            if read.is_err() {
                continue; // gone meanwhile
            }
            match task_creds(&buf) {
                Some((state, real, effective))
                    if (real == uid || effective == uid) && !matches!(state, b'Z' | b'X') =>
                {
                    out.push((tgid, tid))
                }
                _ => {}
            }
        }
    }
    out
}

/// SIGKILLs the thread group `tgid` (found with live tasks `tids` of `uid`); answers whether the
/// group signal was sent.
///
/// The group signal goes through a pidfd, so a pid reused since the scan is not hit: the pidfd
/// names one process, which is checked to still have a task of `uid` before it is signalled. A
/// process-directed SIGKILL takes the whole group down even when its leader is a zombie (a
/// `tgkill` to the zombie leader's own tid is accepted and lost, so that is never relied on).
/// Each live thread also gets its own `tgkill`, in case the group signal did not reach it.
fn kill_group(uid: u32, tgid: i32, tids: &[i32]) -> bool {
    // SAFETY: plain syscalls on integers; the descriptor is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::c_long::from(tgid), 0 as libc::c_long) } as i32;
    let sent = if fd >= 0 {
        let ours = tasks_in(tgid, uid);
        // SAFETY: as above.
        let ok = ours
            && unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    libc::c_long::from(fd),
                    libc::c_long::from(libc::SIGKILL),
                    std::ptr::null::<libc::siginfo_t>(),
                    0 as libc::c_long,
                )
            } == 0;
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        ok
    } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        // SAFETY: a plain syscall (a kernel without pidfds).
        unsafe { libc::kill(tgid, libc::SIGKILL) == 0 }
    } else {
        false // gone since the scan
    };
    for &tid in tids {
        // SAFETY: a plain syscall; tgkill reaches `tid` only while it is a thread of `tgid`.
        unsafe {
            libc::syscall(
                libc::SYS_tgkill,
                libc::c_long::from(tgid),
                libc::c_long::from(tid),
                libc::c_long::from(libc::SIGKILL),
            )
        };
    }
    sent
}

/// Whether the process `tgid` has a live task of `uid`.
fn tasks_in(tgid: i32, uid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{tgid}/task")) else { return false };
    tasks.flatten().any(|t| {
        std::fs::read(t.path().join("status"))
            .ok()
            .and_then(|s| task_creds(&s))
            .is_some_and(|(state, real, effective)| (real == uid || effective == uid) && !matches!(state, b'Z' | b'X'))
    })
}

/// Kills every process of the session `sid` (a shared-UID binding's server and whatever it
/// started without leaving its session) until none is left, for at most [`DRAIN_DEADLINE`]. The
/// agent's own process is never one of them.
pub async fn kill_session(sid: i32) -> Drain {
    let me = std::process::id() as i32;
    let deadline = std::time::Instant::now() + DRAIN_DEADLINE;
    let mut killed = std::collections::BTreeSet::new();
    let mut pause = Duration::from_micros(100);
    loop {
        let members: Vec<i32> = std::fs::read_dir("/proc")
            .map(|d| {
                d.flatten()
                    .filter_map(|p| p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
                    .filter(|&pid| pid != me && session_of(pid) == Some(sid))
                    .collect()
            })
            .unwrap_or_default();
        if members.is_empty() {
            return Drain { confirmed: true, killed: killed.len() };
        }
        if std::time::Instant::now() >= deadline {
            return Drain { confirmed: false, killed: killed.len() };
        }
        for pid in members {
            // SAFETY: a plain syscall.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed.insert(pid);
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The session id of a live process (field 6 of `/proc/<pid>/stat`); `None` for a zombie.
fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold spaces and parentheses: the fields after it start at the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    if matches!(state, "Z" | "X") {
        return None;
    }
    fields.nth(2)?.parse().ok()
}

/// Kills every task of `uid` until none is left, for at most [`DRAIN_DEADLINE`]: every thread of
/// every process whose real or effective UID is `uid`, a zombie leader's live threads and a
/// double-forked `setsid` daemon included (nothing here follows parents, sessions or groups). A
/// fork racing the kills is caught by the next round. `confirmed` only when a scan found nothing
/// of the UID alive.
pub async fn kill_uid(uid: u32) -> Drain {
    if uid == 0 {
        return Drain { confirmed: false, killed: 0 };
    }
    let deadline = std::time::Instant::now() + DRAIN_DEADLINE;
    let mut killed = std::collections::BTreeSet::new();
    // Between rounds, a short wait that grows: a killed process is gone within microseconds, a
    // fork racing the kills is caught by a later round.
    let mut pause = Duration::from_micros(100);
    loop {
        let tasks = tasks_of(uid);
        if tasks.is_empty() {
            return Drain { confirmed: true, killed: killed.len() };
        }
        if std::time::Instant::now() >= deadline {
            return Drain { confirmed: false, killed: killed.len() };
        }
        let mut groups: std::collections::BTreeMap<i32, Vec<i32>> = Default::default();
        for (tgid, tid) in tasks {
            groups.entry(tgid).or_default().push(tid);
        }
        for (tgid, tids) in groups {
            if kill_group(uid, tgid, &tids) {
                killed.insert(tgid);
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::task_creds;

    #[test]
    fn status_lines() {
        let s = b"Name:\tpython3\nUmask:\t0022\nState:\tZ (zombie)\nTgid:\t7\nUid:\t200000\t200001\t200000\t200000\n";
        assert_eq!(task_creds(s), Some((b'Z', 200000, 200001)));
        let s = b"Name:\tx\nState:\tS (sleeping)\nUid:\t0\t0\t0\t0\nGid:\t0\n";
        assert_eq!(task_creds(s), Some((b'S', 0, 0)));
        assert_eq!(task_creds(b"Name:\tx\nUid:\t1\n"), None, "a short Uid line");
        assert_eq!(task_creds(b"Name:\tx\n"), None);
    }
}
