//! The fake E2B and Daytona services (`tests/fakes/*_fake.py`): each follows its service's
//! published routes, status codes and bodies, validates requests against the published models,
//! journals every request, and runs its "sandboxes" as Docker containers with our agent. This
//! module starts one, reads its journal, arms its faults, and removes its containers when
//! dropped.

use std::io::BufRead;
use std::io::BufReader;
use std::path::PathBuf;
use std::process::Child;
use std::process::Command;
use std::process::Stdio;

use serde_json::Value;

use crate::agent::agent_bin;
use crate::docker::IMAGE;
use crate::docker::ensure_sandbox_image;

/// The template (E2B) or snapshot (Daytona) name the fakes map to the sandbox image.
pub const TEMPLATE: &str = "computerd-agent";

/// A running fake service.
pub struct FakeService {
    child: Child,
    /// `http://127.0.0.1:port`
    pub url: String,
    /// Labels every container it makes (`computerd.fake=<label>`).
    pub label: String,
    /// The service (`e2b` or `daytona`).
    pub kind: &'static str,
    _dir: tempfile::TempDir,
}

fn fakes_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fakes")
}

impl FakeService {
    /// Starts the fake of `kind` (`e2b` or `daytona`) that accepts `api_key`.
    pub fn start(kind: &'static str, api_key: &str) -> FakeService {
        ensure_sandbox_image();
        let dir = tempfile::tempdir().expect("tempdir");
        let label = format!("{kind}-{}", hex::encode(rand::random::<[u8; 6]>()));
        let script = fakes_dir().join(format!("{kind}_fake.py"));
        let mut child = Command::new("python3")
            .arg(&script)
            .arg("--journal")
            .arg(dir.path().join("journal.jsonl"))
            .args(["--api-key", api_key, "--run-label", &label, "--agent-binary"])
            .arg(agent_bin())
            .args(["--template", &format!("{TEMPLATE}={IMAGE}")])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", script.display()));
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read the fake's first line");
        let url = line
            .trim()
            .strip_prefix("LISTENING ")
            .unwrap_or_else(|| panic!("the {kind} fake did not start (python3 with the SDKs installed?): {line:?}"))
            .to_string();
        FakeService { child, url, label, kind, _dir: dir }
    }

    /// Every request it received, in order.
    pub async fn journal(&self) -> Vec<Value> {
        let v: Value = reqwest::get(format!("{}/_fake/journal", self.url))
            .await
            .expect("journal")
            .json()
            .await
            .expect("journal json");
        v.as_array().cloned().unwrap_or_default()
    }

    /// The journal's lines with an effect, as `(effect, sandboxId)`.
    pub async fn effects(&self) -> Vec<(String, String)> {
        self.journal()
            .await
            .iter()
            .filter_map(|e| {
                Some((e["effect"].as_str()?.to_string(), e["sandboxId"].as_str().unwrap_or_default().to_string()))
            })
            .collect()
    }

    /// Arms a fault (`{"method", "path", "fault", "status"?, "delayMs"?, "times"?}`).
    pub async fn fault(&self, spec: Value) {
        let r = reqwest::Client::new()
            .post(format!("{}/_fake/faults", self.url))
            .json(&spec)
            .send()
            .await
            .expect("arm a fault");
        assert_eq!(r.status(), 204, "arming {spec}");
    }

    /// Adds `count` running sandboxes that are records only (no container), each labelled with a
    /// Computer of its own: enough of them make a list span pages.
    pub async fn seed(&self, count: usize) {
        let r = reqwest::Client::new()
            .post(format!("{}/_fake/seed", self.url))
            .json(&serde_json::json!({"count": count}))
            .send()
            .await
            .expect("seed");
        assert_eq!(r.status(), 204, "seeding {count}");
    }

    /// The list requests it answered, each as the offset its page started at (0 for the first
    /// page; decoded from E2B's `nextToken` or Daytona's `cursor`).
    pub async fn list_pages(&self) -> Vec<usize> {
        use base64::Engine;
        let list = if self.kind == "e2b" { "/v2/sandboxes" } else { "/sandbox" };
        let token = if self.kind == "e2b" { "nextToken=" } else { "cursor=" };
        self.journal()
            .await
            .iter()
            .filter(|e| e["method"] == "GET" && e["path"].as_str().is_some_and(|p| p.ends_with(list)))
            .filter(|e| !e["query"].as_str().unwrap_or_default().contains("labels="))
            .map(|e| {
                let q = e["query"].as_str().unwrap_or_default();
                q.split('&')
                    .find_map(|kv| kv.strip_prefix(token))
                    .map(|t| {
                        let t = t.replace("%3D", "=");
                        let raw = base64::engine::general_purpose::URL_SAFE.decode(t.as_bytes()).expect("a token");
                        String::from_utf8_lossy(&raw).parse::<usize>().expect("an offset")
                    })
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Drives the fake with the service's official Python SDK (`tests/fakes/<kind>_sdk_check.py`);
    /// answers its exit status and output.
    pub fn sdk_check(&self, api_key: &str) -> (bool, String) {
        let out = Command::new("python3")
            .arg(fakes_dir().join(format!("{}_sdk_check.py", self.kind)))
            .args(["--url", &self.url, "--api-key", api_key, "--template", TEMPLATE])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .expect("run the SDK check");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    /// The ids of the containers this fake made (running or not).
    pub fn containers(&self) -> Vec<String> {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--no-trunc", "--filter", &format!("label=computerd.fake={}", self.label)])
            .output()
            .expect("docker ps");
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
    }

    /// The container of a sandbox id.
    pub fn container_of(&self, sandbox: &str) -> Option<String> {
        let out = Command::new("docker")
            .args(["ps", "-aq", "--no-trunc", "--filter", &format!("label=computerd.fake.sandbox={sandbox}")])
            .output()
            .expect("docker ps");
        String::from_utf8_lossy(&out.stdout).lines().next().map(str::to_string)
    }
}

impl Drop for FakeService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for c in self.containers() {
            let _ = Command::new("docker").args(["rm", "-f", "-v", &c]).output();
        }
    }
}
