//! The Docker CLI, the sandbox image, and the clean-up of every container the bench made.

use std::collections::HashSet;
use std::path::Path;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;

/// The sandbox image.
pub const IMAGE: &str = computerd_tests::docker::IMAGE;
/// Where the image keeps the agent (the provider mounts `agentBinary` over it).
pub const AGENT_PATH: &str = "/usr/local/bin/computer-agent";
/// The agent's state dir in a sandbox, as the provider sets it.
pub const AGENT_STATE: &str = "/var/lib/computer-agent";
/// The label the provider puts on a Computer's container.
pub const LABEL_COMPUTER: &str = "computerd.computer";
/// The label of the baseline containers (its value names the run).
pub const LABEL_BENCH: &str = "computerd.bench";
/// The template's limits, given to the provider and to `docker run` alike.
pub const CPUS: f64 = 1.0;
pub const MEMORY_MB: u64 = 512;
pub const PIDS: u64 = 256;

/// Runs the Docker CLI; answers its trimmed stdout, or an error with its stderr.
pub async fn docker<S: AsRef<str>>(args: &[S]) -> Result<String> {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    let out = tokio::process::Command::new("docker")
        .args(&args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("run the docker CLI")?;
    if !out.status.success() {
        bail!(
            "docker {}: {}: {}",
            args.first().copied().unwrap_or_default(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The same call, blocking (for the clean-up in `Drop`).
pub fn docker_blocking(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new("docker")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .context("run the docker CLI")?;
    if !out.status.success() {
        bail!("docker {}: {}: {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Makes sure the sandbox image exists and is the current script's: builds it with
/// `deploy/build-sandbox-image.sh` and this agent when it is missing or its
/// `computerd.build-script` label is not the script's SHA-256 (under the lock the tests use).
/// Answers the image id.
pub async fn ensure_image(agent: &Path) -> Result<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().context("workspace root")?;
    let script = root.join("deploy/build-sandbox-image.sh");
    let lock = format!("/tmp/computerd-image-{}.lock", IMAGE.replace([':', '/'], "-"));
    let check = r#"[ "$(docker image inspect -f '{{index .Config.Labels "computerd.build-script"}}' "$2" 2>/dev/null)" = "$(sha256sum -- "$1" | cut -d ' ' -f 1)" ] || { echo "building $2 with $1" >&2; "$1" --agent "$3" --tag "$2"; }"#;
    let out = tokio::process::Command::new("flock")
        .arg(&lock)
        .args(["bash", "-c", check, "ensure-image"])
        .arg(&script)
        .arg(IMAGE)
        .arg(agent)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("run {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "building {IMAGE} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    docker(&["image", "inspect", "-f", "{{.Id}}", IMAGE]).await.context("the image after its build")
}

/// The container of a Computer (by the provider's label).
pub async fn container_of(computer: &str) -> Result<String> {
    let out = docker(&["ps", "-aq", "--no-trunc", "--filter", &format!("label={LABEL_COMPUTER}={computer}")]).await?;
    let ids: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    match ids.as_slice() {
        [one] => Ok(one.to_string()),
        _ => bail!("computer {computer} has {} containers, not one", ids.len()),
    }
}

/// Whether the container is frozen, per `docker inspect`.
pub async fn is_paused(container: &str) -> Result<bool> {
    Ok(docker(&["inspect", "-f", "{{.State.Paused}}", container]).await? == "true")
}

/// Removes, when dropped (also on error or Ctrl-C), every container of the Computers it was
/// told about and every baseline container of this run.
pub struct Cleanup {
    /// The value of [`LABEL_BENCH`] on this run's baseline containers.
    pub run: String,
    computers: Vec<String>,
    /// Providers whose pooled sandboxes go too.
    pub pools: Vec<String>,
    done: bool,
}

impl Cleanup {
    pub fn new() -> Self {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Cleanup {
            run: format!("{}-{}", std::process::id(), now.as_millis()),
            computers: Vec::new(),
            pools: Vec::new(),
            done: false,
        }
    }

    pub fn track(&mut self, computer: &str) {
        self.computers.push(computer.to_string());
    }

    /// Removes the containers; answers how many were removed and any errors.
    pub fn remove_all(&mut self) -> (usize, Vec<String>) {
        self.done = true;
        let mut errors = Vec::new();
        let mut ids = Vec::new();
        match docker_blocking(&["ps", "-aq", "--no-trunc", "--filter", &format!("label={LABEL_BENCH}={}", self.run)]) {
            Ok(out) => ids.extend(out.lines().filter(|l| !l.is_empty()).map(String::from)),
            Err(e) => errors.push(format!("{e:#}")),
        }
        let mine: HashSet<&str> = self.computers.iter().map(String::as_str).collect();
        let format = format!("{{{{.ID}}}} {{{{.Label \"{LABEL_COMPUTER}\"}}}}");
        match docker_blocking(&[
            "ps",
            "-a",
            "--no-trunc",
            "--filter",
            &format!("label={LABEL_COMPUTER}"),
            "--format",
            &format,
        ]) {
            Ok(out) => ids.extend(out.lines().filter_map(|l| {
                let (id, computer) = l.split_once(' ')?;
                mine.contains(computer).then(|| id.to_string())
            })),
            Err(e) => errors.push(format!("{e:#}")),
        }
        for provider in &self.pools {
            let filter = format!("label=computerd.pool-provider={provider}");
            match docker_blocking(&["ps", "-aq", "--no-trunc", "--filter", &filter]) {
                Ok(out) => ids.extend(out.lines().filter(|l| !l.is_empty()).map(String::from)),
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        let mut removed = 0;
        for id in &ids {
            match docker_blocking(&["rm", "-f", "-v", id]) {
                Ok(_) => removed += 1,
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        // The pooled sandboxes' runtime volumes (a Computer's goes with its delete).
        for provider in &self.pools {
            let filter = format!("label=computerd.pool-provider={provider}");
            if let Ok(out) = docker_blocking(&["volume", "ls", "-q", "--filter", &filter]) {
                for v in out.lines().filter(|l| !l.is_empty()) {
                    if let Err(e) = docker_blocking(&["volume", "rm", "-f", v]) {
                        errors.push(format!("{e:#}"));
                    }
                }
            }
        }
        (removed, errors)
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (removed, errors) = self.remove_all();
        eprintln!("clean-up: removed {removed} containers");
        for e in errors {
            eprintln!("clean-up: {e}");
        }
    }
}
