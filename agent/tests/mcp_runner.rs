//! The MCP runner against a real stdio MCP server (a stdlib-only Python fixture) under real,
//! separate UIDs: discovery and calls through rmcp; the limits (processes, descriptors, the
//! deadline); nothing of the UID survives a call (a setsid grandchild, or the live thread of a
//! zombie thread-group leader, neither); one binding cannot read another's HOME or its server's
//! environment. Needs root (as CI runs).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

use computer_agent::mcp::runner::RunError;
use computer_agent::mcp::runner::RunLimits;
use computer_agent::mcp::runner::ServerSpec;
use computer_agent::mcp::runner::call;
use computer_agent::mcp::runner::discover;
use serde_json::Value;
use serde_json::json;

struct Bed {
    root: tempfile::TempDir,
}

impl Bed {
    fn new() -> Self {
        assert_eq!(nix::unistd::geteuid().as_raw(), 0, "the runner's tests need root (bindings get their own UIDs)");
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let code = root.path().join("code");
        std::fs::create_dir(&code).expect("code");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_fixture_server.py");
        std::fs::copy(src, code.join("server.py")).expect("copy fixture");
        let shared = root.path().join("shared");
        std::fs::create_dir(&shared).expect("shared");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        Bed { root }
    }

    /// A binding: its UID (distinct per test and binding) and a private 0700 HOME it owns.
    fn binding(&self, uid: u32, limits: RunLimits) -> ServerSpec {
        let home = self.root.path().join(format!("home-{uid}"));
        std::fs::create_dir(&home).expect("home");
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        nix::unistd::chown(&home, Some(nix::unistd::Uid::from_raw(uid)), Some(nix::unistd::Gid::from_raw(uid)))
            .expect("chown");
        ServerSpec {
            code: self.root.path().join("code"),
            entrypoint: vec!["python3".into(), "./server.py".into()],
            uid,
            gid: uid,
            group: None,
            shared_uid: false,
            home,
            limits,
        }
    }

    fn shared(&self) -> PathBuf {
        self.root.path().join("shared")
    }
}

fn args(v: Value) -> serde_json::Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

fn text(v: &Value) -> String {
    v["content"][0]["text"].as_str().unwrap_or_default().to_string()
}

fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| !s.contains("Z (zombie)"))
}

/// Every live task (thread) of `uid` on the machine, as "tgid/tid State": this test's own reading
/// of `/proc`, every process's task list (zombies' included), each task's `Uid:` line.
fn live_tasks(uid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for p in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else { continue };
        for t in tasks.flatten() {
            let Ok(status) = std::fs::read_to_string(t.path().join("status")) else { continue };
            let field = |name: &str| {
                status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or_default().to_string()
            };
            let (state, uids) = (field("State:"), field("Uid:"));
            let mut ids = uids.split_whitespace().take(2);
            let ours = ids.any(|i| i == uid.to_string());
            if ours && !state.starts_with('Z') && !state.starts_with('X') {
                out.push(format!("{}/{} {state}", p.file_name().to_string_lossy(), t.file_name().to_string_lossy()));
            }
        }
    }
    out
}

/// The state letter of task `tid` of process `pid`, if it is still there.
fn task_state(pid: &str, tid: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("State:")).map(|s| s.trim().chars().take(1).collect())
}

#[tokio::test]
async fn discover_and_call_under_the_bindings_uid() {
    let bed = Bed::new();
    let spec = bed.binding(61_001, RunLimits::default());
    let (tools, drain) = discover(&spec).await;
    let tools = tools.expect("discover");
    assert!(drain.confirmed);
    let names: Vec<&str> = tools.as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"echo") && names.contains(&"fork_bomb"), "{names:?}");
    assert!(tools[0]["inputSchema"].is_object(), "schemas come along: {tools}");

    let (r, _) = call(&spec, "echo", args(json!({"text": "hello"}))).await;
    let r = r.expect("call");
    assert_eq!(text(&r), "hello");
    assert_eq!(r["isError"], false);
    let (r, _) = call(&spec, "whoami", args(json!({}))).await;
    assert_eq!(text(&r.expect("call")), format!("61001 {}", spec.home.display()));
    // State is kept between calls (no resident instance: each call is a new server).
    let (r, _) = call(&spec, "write_state", args(json!({"text": "kept"}))).await;
    assert!(r.is_ok());
    assert_eq!(std::fs::read_to_string(spec.home.join("state.txt")).expect("state"), "kept");
    let (r, _) = call(&spec, "read_file", args(json!({"path": "/nonexistent"}))).await;
    assert_eq!(r.expect("call")["isError"], true, "a tool's error is the tool's answer, not a failure");
}

#[tokio::test]
async fn a_fork_bomb_stops_at_the_process_limit_and_is_cleaned_up() {
    let bed = Bed::new();
    let spec = bed.binding(61_011, RunLimits::default());
    let (r, drain) = call(&spec, "fork_bomb", args(json!({}))).await;
    let made: u32 = text(&r.expect("call")).parse().expect("a count");
    assert!(made < 32, "at most 32 processes of the UID (the server is one): made {made}");
    assert!(made >= 16, "forks up to the limit succeed: made {made}");
    assert!(drain.confirmed && drain.killed as u32 >= made, "{drain:?}");
}

#[tokio::test]
async fn the_257th_descriptor_fails() {
    let bed = Bed::new();
    let spec = bed.binding(61_021, RunLimits::default());
    let (r, _) = call(&spec, "open_files", args(json!({}))).await;
    assert_eq!(text(&r.expect("call")), "255", "descriptors 0..=255 and no more");
}

#[tokio::test]
async fn the_deadline_kills_the_call() {
    let bed = Bed::new();
    let limits = RunLimits { deadline: Duration::from_secs(2), ..RunLimits::default() };
    let spec = bed.binding(61_031, limits);
    let started = Instant::now();
    let (r, drain) = call(&spec, "sleep", args(json!({"seconds": 30}))).await;
    assert_eq!(r.map(|_| ()), Err(RunError::Deadline(Duration::from_secs(2))));
    assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
    assert!(drain.confirmed, "{drain:?}");
}

#[tokio::test]
async fn a_setsid_grandchild_does_not_survive_the_call() {
    let bed = Bed::new();
    let spec = bed.binding(61_041, RunLimits::default());
    let (r, drain) = call(&spec, "spawn_grandchild", args(json!({}))).await;
    let pid = text(&r.expect("call"));
    assert!(pid.parse::<u32>().is_ok(), "{pid}");
    assert!(drain.confirmed, "{drain:?}");
    assert!(!alive(&pid), "the grandchild {pid} is gone");
    assert_eq!(live_tasks(61_041), Vec::<String>::new(), "nothing of the UID is alive");
}

/// A process whose leader called `pthread_exit` (a zombie) while its other thread sleeps on: the
/// thread does not survive the call.
#[tokio::test]
async fn a_zombie_leaders_live_thread_does_not_survive_the_call() {
    let bed = Bed::new();
    let spec = bed.binding(61_061, RunLimits::default());
    let (r, drain) = call(&spec, "spawn_zombie_leader", args(json!({}))).await;
    let answer = text(&r.expect("call"));
    let (pid, tid) = answer.split_once(' ').expect("pid tid");
    assert_ne!(pid, tid, "{answer}");
    assert!(drain.confirmed, "{drain:?}");
    assert!(drain.killed >= 1, "the group was killed: {drain:?}");
    assert!(matches!(task_state(pid, tid).as_deref(), None | Some("Z" | "X")), "the thread {pid}/{tid} is gone");
    assert_eq!(live_tasks(61_061), Vec::<String>::new(), "nothing of the UID is alive");
}

/// The same, double-forked into a `setsid` session of its own first (a daemon whose parent is
/// gone, whose leader is a zombie, whose thread runs on).
#[tokio::test]
async fn a_double_forked_setsid_zombie_leader_does_not_survive_the_call() {
    let bed = Bed::new();
    let spec = bed.binding(61_071, RunLimits::default());
    let (r, drain) = call(&spec, "spawn_zombie_leader", args(json!({"setsid": true}))).await;
    let answer = text(&r.expect("call"));
    let (pid, tid) = answer.split_once(' ').expect("pid tid");
    assert!(drain.confirmed, "{drain:?}");
    assert!(matches!(task_state(pid, tid).as_deref(), None | Some("Z" | "X")), "the thread {pid}/{tid} is gone");
    assert_eq!(live_tasks(61_071), Vec::<String>::new(), "nothing of the UID is alive");
}

#[tokio::test]
async fn one_binding_cannot_read_anothers_home_or_environ() {
    let bed = Bed::new();
    let a = bed.binding(61_051, RunLimits::default());
    let b = bed.binding(61_052, RunLimits::default());
    let (r, _) = call(&a, "write_state", args(json!({"text": "a's secret"}))).await;
    assert!(r.is_ok());
    let secret = a.home.join("state.txt");
    let (r, _) = call(&b, "read_file", args(json!({"path": secret}))).await;
    let r = r.expect("call");
    assert_eq!(r["isError"], true);
    assert!(text(&r).starts_with("denied"), "{r}");

    // While a's server runs, b cannot read its environment.
    let pidfile = bed.shared().join("a.pid");
    let a2 = a.clone();
    let pf = pidfile.clone();
    let running =
        tokio::spawn(async move { call(&a2, "pid_then_sleep", args(json!({"path": pf, "seconds": 4}))).await });
    let started = Instant::now();
    let pid = loop {
        if let Ok(p) = std::fs::read_to_string(&pidfile)
            && !p.is_empty()
        {
            break p;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "a's server did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (r, _) = call(&b, "read_file", args(json!({"path": format!("/proc/{pid}/environ")}))).await;
    let r = r.expect("call");
    assert_eq!(r["isError"], true, "{r}");
    let (done, _) = running.await.expect("join");
    assert!(done.is_ok());
}
