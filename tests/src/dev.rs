//! `computerd dev` for tests: one real dev process in a temporary directory (its own HOME), with
//! Docker sandboxes served over WSS on the sandbox network's gateway; stopped with SIGTERM on drop
//! (so it stops its own agent too).

use std::io::BufRead;
use std::time::Duration;

use serde_json::Value;

use crate::cluster::computerd_bin;
use crate::cluster::free_port;
use crate::docker::ensure_sandbox_image;

/// A running `computerd dev`.
pub struct Dev {
    child: std::process::Child,
    /// Its data dir's parent (removed on drop).
    pub dir: tempfile::TempDir,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// The owner token.
    pub token: String,
    /// The line it printed about Docker sandboxes.
    pub docker_line: String,
    /// The line of the create `curl` it printed after it (empty when sandboxes are off).
    pub create_line: String,
    http: reqwest::Client,
}

impl Drop for Dev {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Dev {
    /// Builds the sandbox image if missing, starts dev, and waits for its Docker line.
    pub async fn start() -> Dev {
        ensure_sandbox_image();
        let _agent = crate::agent::agent_bin(); // dev starts the agent found next to it
        let dir = tempfile::tempdir().expect("dir");
        // A person's project directory lets others pass (a temporary directory is 0700).
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let data = dir.path().join("data");
        let port = free_port();
        let mut cmd = std::process::Command::new(computerd_bin());
        crate::agent::own_home(&mut cmd, &data);
        let mut child = cmd
            .args(["dev", "--http", &format!("127.0.0.1:{port}"), "--data"])
            .arg(&data)
            .env("COMPUTERD_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("dev.log")).expect("dev.log"))
            .spawn()
            .expect("computerd dev");
        let stdout = child.stdout.take().expect("stdout");
        let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        let mut dev = Dev {
            child,
            dir,
            base: format!("http://127.0.0.1:{port}"),
            token: String::new(),
            docker_line: String::new(),
            create_line: String::new(),
            http: reqwest::Client::new(),
        };
        let mut printed = Vec::new();
        let docker_line =
            next_line(&mut lines, &mut printed, Duration::from_secs(120), |l| l.starts_with("Docker sandboxes:"))
                .await
                .unwrap_or_else(|| panic!("dev printed no Docker line: {printed:#?}"));
        if !docker_line.contains("off") {
            let create =
                next_line(&mut lines, &mut printed, Duration::from_secs(10), |l| l.contains("commandKey")).await;
            dev.create_line = create.unwrap_or_default();
        }
        dev.docker_line = docker_line;
        dev.token = std::fs::read_to_string(data.join("node/admin.token")).expect("token").trim().to_string();
        dev
    }

    /// Stops it as Ctrl-C does (SIGINT), waits for it, and answers what it logged (warnings
    /// and errors).
    pub fn interrupt(&mut self) -> String {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let _ = self.child.wait();
        std::fs::read_to_string(self.dir.path().join("dev.log")).unwrap_or_default()
    }

    /// Its data dir.
    pub fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// One call with the owner token: status and JSON body (`Null` when none).
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(&self.token, method, path, body).await
    }

    /// One call with `token`: status and JSON body (`Null` when none).
    pub async fn call_as(&self, token: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(token);
        r = r.timeout(Duration::from_secs(40));
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.expect("call dev");
        let s = r.status().as_u16();
        (s, r.json::<Value>().await.unwrap_or(Value::Null))
    }

    /// The `local docker` provider dev registered.
    pub async fn docker_provider(&self) -> Value {
        let (_, list) = self.call(reqwest::Method::GET, "/v1/computer-providers", None).await;
        let providers = list["providers"].as_array().cloned().unwrap_or_default();
        providers.into_iter().find(|p| p["kind"] == "docker").unwrap_or_else(|| panic!("no docker provider: {list}"))
    }
}

/// The next line `dev` printed that `wanted` takes, within `within` (each line read is kept in
/// `printed`).
async fn next_line(
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    printed: &mut Vec<String>,
    within: Duration,
    wanted: impl Fn(&str) -> bool,
) -> Option<String> {
    let found = tokio::time::timeout(within, async {
        while let Some(l) = lines.recv().await {
            printed.push(l.clone());
            if wanted(&l) {
                return Some(l);
            }
        }
        None
    });
    found.await.ok().flatten()
}
