//! Real `computer-agent` processes paired with a test cluster, and a TCP proxy whose
//! connections a test can cut (to break a link without killing either end).

use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::net::TcpStream;

use crate::TestCluster;
use crate::wait_for;

/// The `computer-agent` binary, built once per test process.
pub fn agent_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| crate::cluster::build_bin("computer-agent", "computer-agent")).clone()
}

/// Gives a process (an agent, or `computerd dev`, which starts one) a HOME of its own beside
/// `dir`, so its sessions' login shells read none of the machine user's dotfiles.
///
/// Sessions of an agent running as root still get root's HOME from its account, so their login
/// shells do read it. On this machine kind root's `~/.bashrc` runs `pyenv init`, whose rehash
/// takes a lock file; a shell killed mid-way (tests kill sessions) leaves it behind, and every
/// later root login shell then waits 60 s on it and writes an error into its output. So while
/// a test runs, a sweeper removes a lock that no running `pyenv-rehash` holds (`.ci/run` also
/// drops one before the tests).
pub fn own_home(cmd: &mut Command, dir: &std::path::Path) {
    let home = dir.with_extension("home");
    std::fs::create_dir_all(&home).expect("the agent's HOME");
    cmd.env("HOME", home);
    sweep_stale_pyenv_lock();
}

/// Starts (once per test process) the sweeper of a stale pyenv rehash lock, see [`own_home`].
fn sweep_stale_pyenv_lock() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Some(root) = std::env::var_os("PYENV_ROOT")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")))
        else {
            return;
        };
        let lock = root.join("shims").join(".pyenv-shim");
        if !root.exists() {
            return;
        }
        let _ = std::thread::Builder::new().name("pyenv-lock-sweeper".into()).spawn(move || {
            loop {
                if lock.exists() && !rehash_running() {
                    let _ = std::fs::remove_file(&lock);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
    });
}

/// Whether any process on the machine is running `pyenv-rehash` (the lock's only holder).
fn rehash_running() -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else { return true };
    procs.filter_map(Result::ok).any(|p| {
        std::fs::read(p.path().join("cmdline"))
            .is_ok_and(|c| c.windows(b"pyenv-rehash".len()).any(|w| w == b"pyenv-rehash"))
    })
}

/// A running agent process (killed on drop).
pub struct AgentProc {
    /// The process.
    pub child: Child,
    /// Its state dir.
    pub state: PathBuf,
}

impl AgentProc {
    /// Starts an agent for `server` with `state`, pairing with `code` if given.
    pub fn spawn(server: &str, state: &std::path::Path, code: Option<&str>, log: &std::path::Path) -> AgentProc {
        Self::spawn_with(server, state, code, log, &[])
    }

    /// Like [`AgentProc::spawn`], with extra flags.
    pub fn spawn_with(
        server: &str,
        state: &std::path::Path,
        code: Option<&str>,
        log: &std::path::Path,
        extra: &[&str],
    ) -> AgentProc {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log");
        let mut cmd = Command::new(agent_bin());
        own_home(&mut cmd, state);
        cmd.args(["--server", server, "--state"])
            .arg(state)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .args(extra);
        if let Some(c) = code {
            cmd.args(["--pair", c]);
        }
        AgentProc { child: cmd.spawn().expect("spawn agent"), state: state.to_path_buf() }
    }

    /// Like [`AgentProc::spawn_with`], run as `uid` (its group the same number): an agent of a
    /// person who is not root. Its state dir is made for it.
    pub fn spawn_as(
        server: &str,
        state: &std::path::Path,
        code: Option<&str>,
        log: &std::path::Path,
        extra: &[&str],
        uid: u32,
    ) -> AgentProc {
        use std::os::unix::process::CommandExt;
        std::fs::create_dir_all(state).expect("state");
        std::os::unix::fs::chown(state, Some(uid), Some(uid)).expect("chown state");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log");
        let mut cmd = Command::new(agent_bin());
        own_home(&mut cmd, state);
        let home = state.with_extension("home");
        std::os::unix::fs::chown(&home, Some(uid), Some(uid)).expect("chown home");
        cmd.args(["--server", server, "--state"])
            .arg(state)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .args(extra)
            .uid(uid)
            .gid(uid);
        if let Some(c) = code {
            cmd.args(["--pair", c]);
        }
        AgentProc { child: cmd.spawn().expect("spawn agent"), state: state.to_path_buf() }
    }

    /// SIGKILLs it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Creates a paired Computer and answers its id and pairing code.
pub async fn paired_computer(c: &TestCluster, key: &str) -> (String, String) {
    let body = json!({"commandKey": key, "name": "local", "source": {"_tag": "Paired"}});
    let (s, r) = c.call(Method::POST, 1, "/v1/computers", &c.token, Some(body)).await;
    assert_eq!(s, 202, "{r}");
    let exe = r["executionId"].as_str().expect("execution").to_string();
    let done = c.settle(1, &exe, &c.token).await;
    let code = done["pairingCode"].as_str().expect("pairing code").to_string();
    (r["resource"]["id"].as_str().expect("id").to_string(), code)
}

/// Waits until the Computer reports `state` (and answers it).
pub async fn wait_state(c: &TestCluster, computer: &str, state: &str) -> Value {
    let path = format!("/v1/computers/{computer}");
    wait_for(&format!("{computer} to be {state}"), Duration::from_secs(30), || {
        let path = path.clone();
        async move {
            let (_, v) = c.call(Method::GET, 1, &path, &c.token, None).await;
            (v["state"] == state).then_some(v)
        }
    })
    .await
}

/// A TCP proxy on loopback to `target`; [`Proxy::cut`] drops every open connection.
pub struct Proxy {
    /// `127.0.0.1:port` to dial instead of the target.
    pub addr: String,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `target` (`host:port`).
    pub async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr").to_string();
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let c2 = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let h = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        let _ = outbound.shutdown().await;
                    }
                });
                c2.lock().expect("lock").push(h);
            }
        });
        Proxy { addr, conns, accept }
    }

    /// Drops every open connection (both ends see a reset).
    pub fn cut(&self) {
        for h in self.conns.lock().expect("lock").drain(..) {
            h.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
