//! Bindings through the agent's own request handler ([`Tools::handle`]), as root with real UIDs
//! (CI runs as root; these fail, never skip, without it):
//!
//! - cleanup that cannot be escaped: a zombie thread-group leader's live thread and a
//!   double-forked `setsid` daemon of the binding's UID (non-dumpable too) are gone after revoke
//!   and after a switch; revoke answers `drained: true` only when nothing of the UID is left (a
//!   task frozen by the cgroup v1 freezer cannot die, and revoke says so until it is thawed);
//! - package identity: a package is (bot, id, version, full SHA-256): the same id and version
//!   with other bytes is not "already installed" (not even when the 12 digits of the digest in
//!   its directory's name are the same); a switch moves a binding only to a version its own bot
//!   installed here, whose record and bytes are still what that install published.

use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::path::PathBuf;
use std::process::Command;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;

use computer_agent::mcp::archive::Limits;
use computer_agent::mcp::bindings::McpReply;
use computer_agent::mcp::bindings::McpRequest;
use computer_agent::mcp::bindings::Tools;
use computer_agent::mcp::install;
use computer_agent::mcp::install::Manifest;
use computer_agent::mcp::runner::RunLimits;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

const PACKAGE: &str = "example.mcp.server";

struct Bed {
    root: tempfile::TempDir,
    tools: Tools,
    first_uid: u32,
}

impl Bed {
    /// A runtime and a workspace of their own; binding UIDs from `first_uid` on (distinct per
    /// test: tests run side by side).
    fn new(first_uid: u32) -> Self {
        assert_eq!(nix::unistd::geteuid().as_raw(), 0, "the bindings' tests need root (bindings get their own UIDs)");
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::create_dir_all(root.path().join("workspace/uploads")).expect("workspace");
        let tools =
            Tools::new(root.path().join("runtime"), root.path().join("workspace"), RunLimits::default(), first_uid);
        Bed { root, tools, first_uid }
    }

    fn runtime(&self) -> PathBuf {
        self.root.path().join("runtime")
    }

    /// Packs the fixture server (its echo answering `prefix` + text) as `uploads/<name>`;
    /// answers the archive's SHA-256.
    fn pack(&self, name: &str, prefix: &str) -> String {
        self.pack_with(name, prefix, "")
    }

    /// [`Bed::pack`], with Python `preamble` run first when the server starts.
    fn pack_with(&self, name: &str, prefix: &str, preamble: &str) -> String {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mcp_fixture_server.py");
        let source = std::fs::read_to_string(src).expect("fixture").replace(
            "return args.get(\"text\", \"\"), False",
            &format!("return {prefix:?} + args.get(\"text\", \"\"), False"),
        );
        let source = format!("{preamble}\n{source}");
        let dir = self.root.path().join(format!("src-{name}"));
        std::fs::create_dir_all(&dir).expect("src");
        std::fs::write(dir.join("server.py"), source).expect("server");
        let archive = self.root.path().join("workspace/uploads").join(name);
        let out = Command::new("tar").arg("-C").arg(&dir).arg("-czf").arg(&archive).arg("server.py").output();
        let out = out.expect("tar");
        assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
        hex::encode(sha2::Sha256::digest(std::fs::read(&archive).expect("archive")))
    }

    async fn install(&self, binding: &str, bot: &str, artifact: &str, version: &str, sha: &str) -> McpReply {
        let manifest = json!({"id": PACKAGE, "version": version, "sha256": sha,
                              "entrypoint": ["python3", "./server.py"], "share_immutable_package": true});
        self.tools
            .handle(McpRequest::Install {
                binding_id: binding.into(),
                bot_id: bot.into(),
                artifact_path: format!("uploads/{artifact}"),
                manifest,
            })
            .await
    }

    /// Installs and answers the binding's UID.
    async fn bind(&self, binding: &str, bot: &str, artifact: &str, version: &str, sha: &str) -> u32 {
        let r = self.install(binding, bot, artifact, version, sha).await;
        let uid = ok(&r)["uid"].as_u64().expect("uid") as u32;
        assert!(uid >= self.first_uid, "{r:?}");
        uid
    }

    async fn echo(&self, binding: &str, text: &str) -> McpReply {
        let arguments = json!({"text": text}).as_object().cloned().unwrap_or_default();
        self.tools
            .handle(McpRequest::Call { binding_id: binding.into(), tool: "echo".into(), arguments, operation: None })
            .await
    }

    async fn switch(&self, binding: &str, op: &str, from: &str, to: &str) -> McpReply {
        self.tools
            .handle(McpRequest::Switch {
                binding_id: binding.into(),
                operation_id: op.into(),
                from_version: from.into(),
                version: to.into(),
            })
            .await
    }

    async fn revoke(&self, binding: &str) -> Value {
        ok(&self.tools.handle(McpRequest::Revoke { binding_id: binding.into() }).await).clone()
    }

    /// Bot A's `mcb_a` at 1.0.0 and `mcb_b` at 1.1.0 (whose echo answers "v2:" + text); answers
    /// the two archives' digests.
    async fn two_versions(&self) -> (String, String) {
        let v1 = self.pack("v1.tar.gz", "");
        let v2 = self.pack("v2.tar.gz", "v2:");
        self.bind("mcb_a", "bot_a", "v1.tar.gz", "1.0.0", &v1).await;
        self.bind("mcb_b", "bot_a", "v2.tar.gz", "1.1.0", &v2).await;
        (v1, v2)
    }

    /// The published directory of `version` of the package (there is one per version).
    fn package_dir(&self, version: &str) -> PathBuf {
        let home = self.runtime().join("packages").join(PACKAGE);
        let dirs: Vec<PathBuf> = std::fs::read_dir(&home)
            .expect("packages")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir() && install::record(p).is_some_and(|r| r.manifest.version == version))
            .collect();
        assert_eq!(dirs.len(), 1, "one directory of {version}: {dirs:?}");
        dirs[0].clone()
    }
}

fn ok(r: &McpReply) -> &Value {
    r.result.as_ref().unwrap_or_else(|| panic!("refused: {r:?}"))
}

fn reason(r: &McpReply) -> &str {
    r.error.as_ref().map(|e| e.reason.as_str()).unwrap_or("<none>")
}

fn echoed(r: &McpReply) -> String {
    ok(r)["content"][0]["text"].as_str().unwrap_or_default().to_string()
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
            let ours = uids.split_whitespace().take(2).any(|i| i == uid.to_string());
            if ours && !state.starts_with('Z') && !state.starts_with('X') {
                out.push(format!("{}/{} {state}", p.file_name().to_string_lossy(), t.file_name().to_string_lossy()));
            }
        }
    }
    out
}

/// Spins (yielding) until `f` holds; fails after 10 s.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let started = Instant::now();
    while !f() {
        assert!(started.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// A process of `uid` whose leader called `pthread_exit` while its other thread sleeps on; the
/// thread prints "pid tid" once the leader is a zombie. With `daemon`, it is double-forked into a
/// `setsid` session of its own first (its parent gone) and made non-dumpable (its `/proc` files are
/// root's then). Answers (pid, tid) once that holds.
fn plant_zombie_leader(uid: u32, daemon: bool) -> (String, String) {
    let program = r#"
import ctypes, os, sys, threading, time
if sys.argv[1] == "daemon":
    if os.fork() != 0:
        os._exit(0)
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
pid = os.getpid()
def thread():
    while "State:\tZ" not in open(f"/proc/{pid}/task/{pid}/status").read():
        time.sleep(0.001)
    os.write(1, f"{pid} {threading.get_native_id()}".encode())
    os.close(1)
    time.sleep(1000)
threading.Thread(target=thread).start()
ctypes.CDLL(None).pthread_exit(None)
"#;
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", program, if daemon { "daemon" } else { "plain" }])
        .current_dir("/")
        .env_clear()
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut answer).expect("read");
    if daemon {
        assert!(child.wait().expect("wait").success(), "the daemon's first parent exits");
    } else {
        // The leader is our child: reaped once its whole group is gone.
        std::thread::spawn(move || child.wait());
    }
    let (pid, tid) = answer.split_once(' ').unwrap_or_else(|| panic!("pid tid: {answer:?}"));
    let (pid, tid) = (pid.to_string(), tid.to_string());
    let leader = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status")).expect("leader");
    assert!(leader.contains("State:\tZ"), "the leader is a zombie: {leader}");
    if daemon {
        let owner = std::fs::metadata(format!("/proc/{pid}/task/{tid}/status")).expect("status").uid();
        assert_eq!(owner, 0, "non-dumpable: its files are root's");
    }
    assert!(live_tasks(uid).iter().any(|t| t.starts_with(&format!("{pid}/{tid} "))), "its thread runs");
    (pid, tid)
}

/// A plain double-forked `setsid` daemon of `uid` (its parent gone, its own session); answers
/// its pid once it runs.
fn plant_daemon(uid: u32) -> String {
    let program = r#"
import os, time
if os.fork() != 0:
    os._exit(0)
os.setsid()
if os.fork() != 0:
    os._exit(0)
os.write(1, str(os.getpid()).encode())
os.close(1)
time.sleep(1000)
"#;
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", program])
        .current_dir("/")
        .env_clear()
        .uid(uid)
        .gid(uid)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut pid = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut pid).expect("read");
    assert!(child.wait().expect("wait").success());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon runs");
    let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:")).map(str::trim).unwrap_or_default();
    assert_ne!(ppid, std::process::id().to_string(), "its parent is gone");
    pid
}

fn gone(pid: &str, tid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .map(|s| s.contains("State:\tZ") || s.contains("State:\tX"))
        .unwrap_or(true)
}

#[tokio::test]
async fn revoke_kills_a_zombie_leaders_threads_and_a_setsid_daemon() {
    let bed = Bed::new(62_100);
    let sha = bed.pack("a.tar.gz", "");
    let uid = bed.bind("mcb_a", "bot_a", "a.tar.gz", "1.0.0", &sha).await;
    let (pid, tid) = plant_zombie_leader(uid, false);
    let (dpid, dtid) = plant_zombie_leader(uid, true);
    let daemon = plant_daemon(uid);
    assert!(live_tasks(uid).len() >= 3, "{:?}", live_tasks(uid));

    let v = bed.revoke("mcb_a").await;
    assert_eq!(v["drained"], true, "{v}");
    assert!(v["killed"].as_u64().unwrap_or(0) >= 3, "three thread groups were killed: {v}");
    assert!(gone(&pid, &tid), "the zombie leader's thread {pid}/{tid}");
    assert!(gone(&dpid, &dtid), "the setsid zombie leader's thread {dpid}/{dtid}");
    assert!(gone(&daemon, &daemon), "the setsid daemon {daemon}");
    assert_eq!(live_tasks(uid), Vec::<String>::new(), "nothing of the UID is alive");
}

/// A cgroup v1 freezer group: its tasks cannot run, so a SIGKILL waits until they are thawed.
struct Frozen {
    dir: PathBuf,
}

impl Frozen {
    fn new(pid: &str) -> Self {
        let root = Path::new("/sys/fs/cgroup/freezer");
        assert!(root.join("tasks").exists(), "this test needs the cgroup v1 freezer at {}", root.display());
        let dir = root.join(format!("computerd-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("freezer cgroup");
        let f = Frozen { dir };
        std::fs::write(f.dir.join("tasks"), pid).expect("join the cgroup");
        std::fs::write(f.dir.join("freezer.state"), "FROZEN").expect("freeze");
        until("the freezer", || f.state() == "FROZEN");
        f
    }

    fn state(&self) -> String {
        std::fs::read_to_string(self.dir.join("freezer.state")).unwrap_or_default().trim().to_string()
    }

    fn thaw(&self) {
        std::fs::write(self.dir.join("freezer.state"), "THAWED").expect("thaw");
        until("the thaw", || self.state() == "THAWED");
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // (On a failure: the test's own tasks are killed, and the group goes.)
        let _ = std::fs::write(self.dir.join("freezer.state"), "THAWED");
        for pid in std::fs::read_to_string(self.dir.join("tasks")).unwrap_or_default().lines() {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
        let started = Instant::now();
        while std::fs::remove_dir(&self.dir).is_err() && started.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
    }
}

#[tokio::test]
async fn revoke_is_drained_only_when_nothing_of_the_uid_is_left() {
    let bed = Bed::new(62_200);
    let sha = bed.pack("a.tar.gz", "");
    let uid = bed.bind("mcb_a", "bot_a", "a.tar.gz", "1.0.0", &sha).await;
    let daemon = plant_daemon(uid);
    let frozen = Frozen::new(&daemon);

    // Frozen, it cannot die: revoke kills it, but does not say it is drained.
    let v = bed.revoke("mcb_a").await;
    assert_eq!(v["drained"], false, "a task of the UID is left: {v}");
    assert_eq!(live_tasks(uid).len(), 1, "{:?}", live_tasks(uid));
    let r = bed.echo("mcb_a", "hi").await;
    assert_eq!(reason(&r), "revoked", "{r:?}");

    // Thawed, it dies (of the pending SIGKILL, or the next revoke's): now drained.
    frozen.thaw();
    let v = bed.revoke("mcb_a").await;
    assert_eq!(v["drained"], true, "{v}");
    assert!(gone(&daemon, &daemon));
    assert_eq!(live_tasks(uid), Vec::<String>::new());
}

#[tokio::test]
async fn a_switch_retires_a_zombie_leaders_threads() {
    let bed = Bed::new(62_300);
    let sha1 = bed.pack("v1.tar.gz", "");
    let sha2 = bed.pack("v2.tar.gz", "v2:");
    let uid = bed.bind("mcb_a", "bot_a", "v1.tar.gz", "1.0.0", &sha1).await;
    bed.bind("mcb_b", "bot_a", "v2.tar.gz", "1.1.0", &sha2).await;
    let (pid, tid) = plant_zombie_leader(uid, true);
    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(ok(&r)["version"], "1.1.0", "{r:?}");
    assert!(gone(&pid, &tid), "the thread {pid}/{tid} did not survive the switch");
    assert_eq!(live_tasks(uid), Vec::<String>::new());
    assert_eq!(echoed(&bed.echo("mcb_a", "hi").await), "v2:hi");
}

/// install's "already installed" compares the full digest: the same id and version with other
/// bytes is refused, even where the directory its digest's first 12 digits name is taken.
#[test]
fn the_same_id_and_version_with_other_bytes_is_not_already_installed() {
    assert_eq!(nix::unistd::geteuid().as_raw(), 0, "needs root");
    let bed_root = tempfile::tempdir().expect("tempdir");
    let ws = bed_root.path().join("workspace");
    std::fs::create_dir_all(&ws).expect("ws");
    let runtime = bed_root.path().join("runtime");
    let pack = |name: &str, text: &str| {
        let dir = bed_root.path().join(format!("src-{name}"));
        std::fs::create_dir_all(&dir).expect("src");
        std::fs::write(dir.join("server.py"), text).expect("server");
        let out = Command::new("tar").arg("-C").arg(&dir).arg("-czf").arg(ws.join(name)).arg("server.py").output();
        assert!(out.expect("tar").status.success());
        hex::encode(sha2::Sha256::digest(std::fs::read(ws.join(name)).expect("archive")))
    };
    let manifest = |sha: &str| Manifest {
        id: PACKAGE.into(),
        version: "1.0.0".into(),
        sha256: sha.into(),
        entrypoint: vec!["python3".into(), "./server.py".into()],
        share_immutable_package: true,
    };
    let (a, b) = (pack("a.tar.gz", "print('a')\n"), pack("b.tar.gz", "print('b')\n"));
    let lim = Limits::default();
    let first = install::install(&ws, "a.tar.gz", &manifest(&a), &runtime, &lim).expect("a installs");
    assert!(first.new);
    let again = install::install(&ws, "a.tar.gz", &manifest(&a), &runtime, &lim).expect("a again");
    assert!(!again.new && again.dir == first.dir && again.tree_digest == first.tree_digest);
    let r = install::install(&ws, "b.tar.gz", &manifest(&b), &runtime, &lim);
    assert_eq!(r.map(|i| i.dir).map_err(|e| e.reason()), Err("version_exists"));

    // A package whose digest has b's first 12 digits (48 bits) but is not b's: stand a's files
    // and record where b would be published.
    let home = runtime.join("packages").join(PACKAGE);
    let squat = home.join(format!("1.0.0-{}", &b[..12]));
    std::fs::rename(&first.dir, &squat).expect("move");
    let mut record = first.dir.as_os_str().to_owned();
    record.push(".json");
    let mut moved = squat.as_os_str().to_owned();
    moved.push(".json");
    std::fs::rename(record, &moved).expect("move the record");
    let r = install::install(&ws, "b.tar.gz", &manifest(&b), &runtime, &lim);
    assert_eq!(r.map(|i| (i.dir, i.new)).map_err(|e| e.reason()), Err("version_exists"), "not b's package");
    // a itself is still found there, by its record.
    let again = install::install(&ws, "a.tar.gz", &manifest(&a), &runtime, &lim).expect("a again");
    assert_eq!((again.dir.clone(), again.new), (squat.clone(), false));

    // Its files changed: not "already installed" either.
    std::fs::write(squat.join("server.py"), "print('changed')\n").expect("write");
    let r = install::install(&ws, "a.tar.gz", &manifest(&a), &runtime, &lim);
    assert_eq!(r.map(|i| i.dir).map_err(|e| e.reason()), Err("package_changed"));
}

#[tokio::test]
async fn another_bots_install_of_the_same_version_with_other_bytes_is_refused() {
    let bed = Bed::new(62_400);
    let mine = bed.pack("mine.tar.gz", "");
    let theirs = bed.pack("theirs.tar.gz", "theirs:");
    bed.bind("mcb_a", "bot_a", "mine.tar.gz", "1.0.0", &mine).await;
    let r = bed.install("mcb_b", "bot_b", "theirs.tar.gz", "1.0.0", &theirs).await;
    assert_eq!(reason(&r), "version_exists", "{r:?}");
    let r = bed.echo("mcb_b", "hi").await;
    assert_eq!(reason(&r), "no_binding", "{r:?}");
    // The same binding id sent again for another bot or digest is not the binding that is there.
    let r = bed.install("mcb_a", "bot_b", "mine.tar.gz", "1.0.0", &mine).await;
    assert_eq!(reason(&r), "binding_exists", "{r:?}");
    let r = bed.install("mcb_a", "bot_a", "theirs.tar.gz", "1.0.0", &theirs).await;
    assert_eq!(reason(&r), "binding_exists", "{r:?}");
    let r = bed.install("mcb_a", "bot_a", "mine.tar.gz", "1.0.0", &mine).await;
    assert!(ok(&r)["tools"].is_array(), "the install sent again is answered: {r:?}");
}

/// Bot A installs version 1.1.0 with its own code; bot B's binding at 1.0.0 cannot be switched
/// to it. Once B installs 1.1.0 itself (the same bytes, which B then vouches for), it can.
#[tokio::test]
async fn a_switch_to_a_version_another_bot_installed_is_refused() {
    let bed = Bed::new(62_500);
    let v1 = bed.pack("v1.tar.gz", "");
    let evil = bed.pack("evil.tar.gz", "a's code:");
    bed.bind("mcb_b", "bot_b", "v1.tar.gz", "1.0.0", &v1).await;
    bed.bind("mcb_a", "bot_a", "evil.tar.gz", "1.1.0", &evil).await;

    let r = bed.switch("mcb_b", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(reason(&r), "version_not_installed", "{r:?}");
    assert_eq!(echoed(&bed.echo("mcb_b", "hi").await), "hi", "b still runs its own code");
    // A version name that an installed one (of the same bot) only starts with is no version.
    bed.bind("mcb_b3", "bot_b", "v1.tar.gz", "1.2-rc1", &v1).await;
    let r = bed.switch("mcb_b", "sw-2", "1.0.0", "1.2").await;
    assert_eq!(reason(&r), "version_not_installed", "{r:?}");

    bed.bind("mcb_b2", "bot_b", "evil.tar.gz", "1.1.0", &evil).await;
    let r = bed.switch("mcb_b", "sw-3", "1.0.0", "1.1.0").await;
    assert_eq!((ok(&r)["version"].as_str(), ok(&r)["sha256"].as_str()), (Some("1.1.0"), Some(evil.as_str())));
    assert_eq!(echoed(&bed.echo("mcb_b", "hi").await), "a's code:hi");
}

/// The target's files changed since install: refused, and the binding stays where it was.
#[tokio::test]
async fn a_switch_to_changed_bytes_is_refused() {
    let bed = Bed::new(62_600);
    bed.two_versions().await;
    let target = bed.package_dir("1.1.0");
    let server = target.join("server.py");
    let original = std::fs::read(&server).expect("read");
    let mut changed = original.clone();
    changed.extend_from_slice(b"\n# changed\n");
    std::fs::write(&server, &changed).expect("write");

    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(reason(&r), "package_changed", "{r:?}");
    assert_eq!(echoed(&bed.echo("mcb_a", "hi").await), "hi", "still at 1.0.0");

    std::fs::write(&server, &original).expect("restore");
    let r = bed.switch("mcb_a", "sw-2", "1.0.0", "1.1.0").await;
    assert_eq!(ok(&r)["version"], "1.1.0", "the same bytes again: {r:?}");
}

/// The target's record rewritten (another digest, or a tree digest matching changed files): not
/// what the bot installed, so refused.
#[tokio::test]
async fn a_switch_to_a_rewritten_record_is_refused() {
    let bed = Bed::new(62_700);
    let (v1, v2) = bed.two_versions().await;
    let target = bed.package_dir("1.1.0");
    let mut record_path = target.as_os_str().to_owned();
    record_path.push(".json");
    let record_path = PathBuf::from(record_path);
    let original = std::fs::read(&record_path).expect("record");
    let mut record: Value = serde_json::from_slice(&original).expect("json");

    record["manifest"]["sha256"] = json!(v1);
    std::fs::write(&record_path, record.to_string()).expect("write");
    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(reason(&r), "package_changed", "another digest recorded: {r:?}");

    // Changed files, and a record whose tree digest says they are right.
    record["manifest"]["sha256"] = json!(v2);
    std::fs::write(target.join("server.py"), "print('replaced')\n").expect("write");
    let digest = computer_agent::mcp::bindings::tree_digest(&target).expect("digest");
    record["treeDigest"] = json!(digest);
    std::fs::write(&record_path, record.to_string()).expect("write");
    let r = bed.switch("mcb_a", "sw-2", "1.0.0", "1.1.0").await;
    assert_eq!(reason(&r), "package_changed", "the tree digest is not the one installed: {r:?}");
    assert_eq!(echoed(&bed.echo("mcb_a", "hi").await), "hi", "still at 1.0.0");
}

/// Operation ids are each bot's own: another bot's switch under the same id is another switch
/// (its receipt neither blocks nor answers this one).
#[tokio::test]
async fn switches_of_two_bots_under_one_operation_id_are_two_switches() {
    let bed = Bed::new(62_800);
    let v1 = bed.pack("v1.tar.gz", "");
    let v2 = bed.pack("v2.tar.gz", "v2:");
    for bot in ["bot_a", "bot_b"] {
        bed.bind(&format!("mcb_{bot}_1"), bot, "v1.tar.gz", "1.0.0", &v1).await;
        bed.bind(&format!("mcb_{bot}_2"), bot, "v2.tar.gz", "1.1.0", &v2).await;
    }
    let r = bed.switch("mcb_bot_a_1", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!((ok(&r)["version"].as_str(), ok(&r)["replayed"].as_bool()), (Some("1.1.0"), Some(false)), "{r:?}");
    let r = bed.switch("mcb_bot_b_1", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!((ok(&r)["version"].as_str(), ok(&r)["replayed"].as_bool()), (Some("1.1.0"), Some(false)), "{r:?}");
    assert_eq!(echoed(&bed.echo("mcb_bot_b_1", "hi").await), "v2:hi");
    let r = bed.switch("mcb_bot_a_1", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(ok(&r)["replayed"], true, "each answers its own receipt again: {r:?}");
}

/// Clean-up: a revoked binding's HOME, private copy and receipts go once it is drained, and so
/// does every package no binding uses; a revoked id stays refused; revoked bindings free their
/// slot (more install/revoke cycles than the cap, with more packages than the package cap); an
/// install whose server does not start leaves nothing.
#[tokio::test]
async fn revoked_and_failed_bindings_leave_no_files_and_free_their_slots() {
    let bed = Bed::new(62_900);
    let sha = bed.pack("a.tar.gz", "");
    let rt = bed.runtime();
    let cycles = computer_agent::mcp::bindings::MAX_BINDINGS + 1;
    assert!(cycles > install::MAX_PACKAGES);
    for i in 0..cycles {
        let id = format!("mcb_c{i}");
        let shared = i % 2 == 0;
        let manifest = json!({"id": format!("cycle.{i}"), "version": "1.0.0", "sha256": sha,
                              "entrypoint": ["python3", "./server.py"], "share_immutable_package": shared});
        let request = McpRequest::Install {
            binding_id: id.clone(),
            bot_id: "bot_a".into(),
            artifact_path: "uploads/a.tar.gz".into(),
            manifest,
        };
        let r = bed.tools.handle(request).await;
        assert!(ok(&r)["tools"].is_array(), "cycle {i}: {r:?}");
        assert!(rt.join("homes").join(&id).is_dir(), "cycle {i}: a HOME");
        assert_eq!(rt.join("private").join(&id).is_dir(), !shared, "cycle {i}: a private copy when not shared");
        assert!(rt.join("packages").join(format!("cycle.{i}")).is_dir(), "cycle {i}: the package");
        let v = bed.revoke(&id).await;
        assert_eq!(v["drained"], true, "cycle {i}: {v}");
        assert!(!rt.join("homes").join(&id).exists(), "cycle {i}: the HOME is gone");
        assert!(!rt.join("private").join(&id).exists(), "cycle {i}: the private copy is gone");
        assert!(!rt.join("packages").join(format!("cycle.{i}")).exists(), "cycle {i}: the unused package is gone");
        assert_eq!(reason(&bed.echo(&id, "hi").await), "revoked", "cycle {i}: the id stays refused");
    }
    let r = bed.install(&format!("mcb_c{}", cycles - 1), "bot_a", "a.tar.gz", "1.0.0", &sha).await;
    assert_eq!(reason(&r), "revoked", "a revoked id is not installed again: {r:?}");

    // A package still used by a live binding stays when another binding of it goes.
    bed.bind("mcb_keep", "bot_a", "a.tar.gz", "1.0.0", &sha).await;
    bed.bind("mcb_go", "bot_b", "a.tar.gz", "1.0.0", &sha).await;
    bed.revoke("mcb_go").await;
    let dir = bed.package_dir("1.0.0");
    assert!(dir.is_dir() && install::record(&dir).is_some(), "bot_a's binding still uses it");
    assert_eq!(echoed(&bed.echo("mcb_keep", "hi").await), "hi");

    // A server that does not start: refused, and nothing of the binding stays.
    let src = bed.root.path().join("src-broken");
    std::fs::create_dir_all(&src).expect("src");
    std::fs::write(src.join("server.py"), "import sys\nsys.exit(3)\n").expect("server");
    let archive = bed.root.path().join("workspace/uploads/broken.tar.gz");
    let out = Command::new("tar").arg("-C").arg(&src).arg("-czf").arg(&archive).arg("server.py").output();
    assert!(out.expect("tar").status.success());
    let broken = hex::encode(sha2::Sha256::digest(std::fs::read(&archive).expect("archive")));
    let manifest = json!({"id": "broken.server", "version": "1.0.0", "sha256": broken,
                          "entrypoint": ["python3", "./server.py"], "share_immutable_package": false});
    let request = McpRequest::Install {
        binding_id: "mcb_broken".into(),
        bot_id: "bot_a".into(),
        artifact_path: "uploads/broken.tar.gz".into(),
        manifest,
    };
    let r = bed.tools.handle(request).await;
    assert!(r.error.is_some(), "{r:?}");
    assert!(!rt.join("homes/mcb_broken").exists(), "no HOME");
    assert!(!rt.join("private/mcb_broken").exists(), "no private copy");
    assert!(!rt.join("packages/broken.server").exists(), "no package");
    assert_eq!(reason(&bed.echo("mcb_broken", "hi").await), "revoked", "no binding");
    let homes: Vec<String> = std::fs::read_dir(rt.join("homes"))
        .expect("homes")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(homes, vec!["mcb_keep".to_string()], "only the live binding has a HOME");
}

/// What a switch's refusal says was done: (switched, the version the binding is at).
fn done(r: &McpReply) -> (Option<bool>, Option<String>) {
    let v = r.result.as_ref().unwrap_or(&Value::Null);
    (v["switched"].as_bool(), v["version"].as_str().map(str::to_string))
}

/// Issue 37, item 5: the target's server fails discovery. The agent answers that it switched
/// (and at which version), never a bare failure the store would take as "not switched"; the
/// same operation sent again, once the server starts, answers the switch.
#[tokio::test]
async fn i37_5_a_switch_whose_discovery_fails_says_it_switched_and_its_retry_finishes_it() {
    let bed = Bed::new(63_000);
    let flag = bed.root.path().join("v2-may-start");
    let v1 = bed.pack("v1.tar.gz", "");
    bed.bind("mcb_a", "bot_a", "v1.tar.gz", "1.0.0", &v1).await;
    // v2 starts only once the flag exists (its install discovers it with the flag there).
    std::fs::write(&flag, "").expect("flag");
    let preamble = format!("import os, sys\nif not os.path.exists({:?}):\n    sys.exit(3)", flag.display().to_string());
    let v2 = bed.pack_with("v2.tar.gz", "v2:", &preamble);
    bed.bind("mcb_b", "bot_a", "v2.tar.gz", "1.1.0", &v2).await;
    std::fs::remove_file(&flag).expect("unflag");

    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert!(r.error.is_some(), "discovery failed: {r:?}");
    assert_eq!(done(&r), (Some(true), Some("1.1.0".into())), "it says it switched: {r:?}");

    std::fs::write(&flag, "").expect("flag");
    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!((ok(&r)["version"].as_str(), ok(&r)["replayed"].as_bool()), (Some("1.1.0"), Some(true)), "{r:?}");
    assert_eq!(echoed(&bed.echo("mcb_a", "hi").await), "v2:hi");
}

/// Issue 37, item 5: the receipt cannot be written after the registry moved. The agent puts
/// the binding back at the source and says it did not switch (the source's code still
/// answers); the same operation then switches.
#[tokio::test]
async fn i37_5_a_switch_without_its_receipt_is_undone_and_says_so() {
    let bed = Bed::new(63_100);
    bed.two_versions().await;
    // The receipt's temporary file is a directory: writing it fails after the registry moved.
    let blocker = bed.runtime().join("receipts/mcb_a/.sw-1.tmp");
    std::fs::create_dir_all(&blocker).expect("blocker");

    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(reason(&r), "runtime_failed", "{r:?}");
    assert_eq!(done(&r), (Some(false), Some("1.0.0".into())), "back at the source: {r:?}");
    assert_eq!(echoed(&bed.echo("mcb_a", "hi").await), "hi", "the source's code answers");

    std::fs::remove_dir(&blocker).expect("unblock");
    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!((ok(&r)["version"].as_str(), ok(&r)["replayed"].as_bool()), (Some("1.1.0"), Some(false)), "{r:?}");
    assert_eq!(echoed(&bed.echo("mcb_a", "hi").await), "v2:hi");
}

/// Issue 37, item 8: replaying a done switch checks the bytes again. The target's files changed
/// after the switch: the replay refuses (saying the binding is switched), where it used to answer
/// the receipt after discovering the changed code's schemas.
#[tokio::test]
async fn i37_8_a_switchs_replay_checks_the_bytes_again() {
    let bed = Bed::new(63_200);
    bed.two_versions().await;
    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(ok(&r)["replayed"], false, "{r:?}");
    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(ok(&r)["replayed"], true, "an unchanged replay answers: {r:?}");

    let server = bed.package_dir("1.1.0").join("server.py");
    let mut changed = std::fs::read(&server).expect("read");
    changed.extend_from_slice(b"\n# changed\n");
    std::fs::write(&server, &changed).expect("write");
    let r = bed.switch("mcb_a", "sw-1", "1.0.0", "1.1.0").await;
    assert_eq!(reason(&r), "package_changed", "{r:?}");
    assert_eq!(done(&r), (Some(true), Some("1.1.0".into())), "{r:?}");
}
