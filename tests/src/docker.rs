//! Helpers for tests against the real Docker engine: the sandbox image (built with debootstrap
//! by `deploy/build-sandbox-image.sh` when missing or built by another version of the script), a docker provider wired to a test
//! cluster, and clean-up of the containers a test made.

use std::process::Command;

use reqwest::Method;
use serde_json::Value;
use serde_json::json;

use crate::TestCluster;
use crate::agent::agent_bin;

/// The image the tests' sandboxes run.
pub const IMAGE: &str = "computerd-sandbox:latest";

/// Makes sure the sandbox image exists and is the current script's (builds it once, under a lock
/// shared by test processes).
pub fn ensure_sandbox_image() {
    ensure_image(IMAGE, "build-sandbox-image.sh");
}

/// The image of the tests' sandboxes with a desktop.
pub const DESKTOP_IMAGE: &str = "computerd-desktop:latest";

/// Makes sure the desktop image exists: `deploy/build-desktop-image.sh` (one layer on top of
/// the sandbox image, about a minute and a half the first time), under the same kind of lock. It
/// is built again when the sandbox image it was built on is no longer the current one.
pub fn ensure_desktop_image() {
    ensure_sandbox_image();
    let base = Command::new("docker")
        .args(["image", "inspect", "-f", "{{.Id}}", IMAGE])
        .output()
        .expect("docker image inspect");
    let base = String::from_utf8_lossy(&base.stdout).trim().to_string();
    assert!(!base.is_empty(), "the sandbox image {IMAGE} exists after ensure_sandbox_image");
    ensure_image_on(DESKTOP_IMAGE, "build-desktop-image.sh", Some(&base));
}

/// The label by which a build script marks the image it built with the SHA-256 of its own text.
pub const BUILD_SCRIPT_LABEL: &str = "computerd.build-script";

/// The label by which the desktop image names the id of the sandbox image it was built on.
pub const BASE_IMAGE_LABEL: &str = "computerd.base-image";

/// Builds `tag` with `deploy/<script>` and the freshly built agent when no image has that tag,
/// or when the image's `computerd.build-script` label is not the script's current SHA-256 (it
/// was built by another version of the script).
fn ensure_image(tag: &str, script: &str) {
    ensure_image_on(tag, script, None);
}

/// [`ensure_image`]; with `base`, the image must also carry the label `computerd.base-image`
/// with that image id (the image it was built on).
fn ensure_image_on(tag: &str, script: &str, base: Option<&str>) {
    use sha2::Digest;
    let agent = agent_bin();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let script = root.join("deploy").join(script);
    let text = std::fs::read(&script).unwrap_or_else(|e| panic!("read {}: {e}", script.display()));
    let sha = hex::encode(sha2::Sha256::digest(&text));
    // Checked under the lock: another test process may be building it right now.
    let mut label = format!(r#"{{{{index .Config.Labels "{BUILD_SCRIPT_LABEL}"}}}}"#);
    let mut want = sha;
    if let Some(base) = base {
        label.push_str(&format!(r#" {{{{index .Config.Labels "{BASE_IMAGE_LABEL}"}}}}"#));
        want.push(' ');
        want.push_str(base);
    }
    let cmd = format!(
        r#"[ "$(docker image inspect -f '{label}' {tag} 2>/dev/null)" = '{want}' ] || {} --agent {} --tag {tag}"#,
        script.display(),
        agent.display()
    );
    let lock = format!("/tmp/computerd-image-{}.lock", tag.replace([':', '/'], "-"));
    let out = Command::new("flock").args([lock.as_str(), "bash", "-c", &cmd]).output().expect("run flock");
    assert!(
        out.status.success(),
        "building the image {tag} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Registers a docker provider whose sandboxes share the host network (so their agents reach
/// the test nodes on loopback) and run the freshly built agent; answers its id.
pub async fn docker_provider(c: &TestCluster, extra: Value) -> String {
    ensure_sandbox_image();
    let mut config = json!({
        "serverUrl": c.url(1, ""),
        "network": "host",
        "agentBinary": agent_bin().to_string_lossy(),
        "templates": {"default": {"image": IMAGE, "cpus": 1.0, "memoryMb": 512, "pids": 256}},
    });
    if let (Some(base), Some(more)) = (config.as_object_mut(), extra.as_object()) {
        for (k, v) in more {
            base.insert(k.clone(), v.clone());
        }
    }
    let body = json!({"kind": "docker", "name": "docker", "config": config});
    let (s, v) = c.call(Method::POST, 1, "/v1/computer-providers", &c.token, Some(body)).await;
    assert_eq!(s, 201, "{v}");
    v["id"].as_str().expect("provider id").to_string()
}

/// The ids of the containers labelled with a Computer id (running or not).
pub fn containers_of(computer_id: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--no-trunc", "--filter", &format!("label=computerd.computer={computer_id}")])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
}

/// A field of `docker inspect` of a container (a Go template such as `{{.State.Paused}}`).
pub fn inspect(container: &str, format: &str) -> String {
    let out = Command::new("docker").args(["inspect", "-f", format, container]).output().expect("docker inspect");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Removes, when dropped, every container of the Computers it was told about.
#[derive(Default)]
pub struct Containers(pub Vec<String>);

impl Containers {
    /// Also clean up this Computer's containers.
    pub fn track(&mut self, computer_id: &str) {
        self.0.push(computer_id.to_string());
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        for id in &self.0 {
            for c in containers_of(id) {
                let _ = Command::new("docker").args(["rm", "-f", "-v", &c]).output();
            }
            // Its egress gateway (after the sandbox that shares its network).
            let _ = Command::new("docker").args(["rm", "-f", &format!("computerd-{id}-egress")]).output();
            // Its runtime volume (kept by the engine apart from any container).
            let _ = Command::new("docker").args(["volume", "rm", "-f", &format!("computerd-runtime-{id}")]).output();
        }
    }
}
