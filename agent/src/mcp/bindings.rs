//! Bindings: a package installed for a bot, with its own UID, private HOME and state, kept in a
//! root-owned registry under the runtime directory (`RUNTIME/registry.json`, 0600), so a restart
//! of the agent keeps them. The node drives them through the agent's `Mcp` RPC with the JSON
//! [`McpRequest`] and answers [`McpReply`].
//!
//! Layout under the runtime directory (root-owned, apart from the task home): `packages/` (the
//! published code, read-only to bindings), `private/<binding>` (a copy readable only by the
//! binding's group, when the package is not shared), `homes/<binding>` (the binding's HOME and
//! state, 0700, owned by its UID), `staging/` (installs in progress).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::path::PathBuf;

use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;
use sha2::Digest;

use super::archive::Limits;
use super::install;
use super::install::Manifest;
use super::runner;
use super::runner::RunLimits;
use super::runner::ServerSpec;

/// Bindings kept per Computer.
pub const MAX_BINDINGS: usize = 64;
/// The first UID given to a binding (by default; agents sharing one machine need their own
/// ranges).
pub const FIRST_UID: u32 = 200_000;
/// How many binding UIDs an agent may use from its first (the width of the ranges the store
/// hands docker sandboxes: a binding never takes a UID of the next range).
pub const UID_RANGE: u32 = 65_536;

pub use computerd_proto::mcp::McpFailure;
pub use computerd_proto::mcp::McpReply;
pub use computerd_proto::mcp::McpRequest;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Binding {
    package: PathBuf,
    code: PathBuf,
    entrypoint: Vec<String>,
    version: String,
    uid: u32,
    tree_digest: String,
    revoked: bool,
    /// The bot it was installed for (empty in a registry from before bots were recorded: such a
    /// binding is not switched).
    #[serde(default)]
    bot: String,
    /// Its package's id and the full SHA-256 of the archive it was installed (or switched) from.
    #[serde(default)]
    package_id: String,
    #[serde(default)]
    sha256: String,
}

/// A package a bot installed on this Computer: the package is (bot, id, version, full SHA-256);
/// `dir` is where its files were published and `tree_digest` what they were.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Installed {
    bot: String,
    id: String,
    version: String,
    sha256: String,
    dir: PathBuf,
    tree_digest: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Registry {
    next_uid: u32,
    bindings: BTreeMap<String, Binding>,
    /// What each bot installed here: the versions a switch may move that bot's bindings to.
    #[serde(default)]
    installed: Vec<Installed>,
}

/// The bindings of this agent.
#[derive(Clone)]
pub struct Tools {
    runtime: PathBuf,
    workspace: PathBuf,
    limits: RunLimits,
    first_uid: u32,
    lock: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// A digest of a directory tree: every file's path, mode and bytes, in order.
pub fn tree_digest(dir: &Path) -> std::io::Result<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                walk(base, &e.path(), out)?;
            } else {
                out.push(e.path().strip_prefix(base).map(Path::to_path_buf).unwrap_or_default());
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, dir, &mut files)?;
    files.sort();
    let mut h = sha2::Sha256::new();
    for f in files {
        let p = dir.join(&f);
        let meta = std::fs::symlink_metadata(&p)?;
        h.update(f.to_string_lossy().as_bytes());
        h.update([0]);
        h.update(format!("{:o}", meta.permissions().mode() & 0o7777).as_bytes());
        h.update([0]);
        h.update(std::fs::read(&p)?);
        h.update([0]);
    }
    Ok(hex::encode(h.finalize()))
}

fn copy_private(from: &Path, to: &Path, gid: u32) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    std::os::unix::fs::chown(to, Some(0), Some(gid))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o750))?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_private(&e.path(), &dest, gid)?;
        } else {
            std::fs::copy(e.path(), &dest)?;
            std::os::unix::fs::chown(&dest, Some(0), Some(gid))?;
            let exec = std::fs::metadata(e.path())?.permissions().mode() & 0o111 != 0;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(if exec { 0o750 } else { 0o640 }))?;
        }
    }
    Ok(())
}

fn check_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 100 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Tools {
    /// Bindings under `runtime`, with UIDs from `first_uid` on; archives are read from
    /// `workspace`.
    pub fn new(runtime: PathBuf, workspace: PathBuf, limits: RunLimits, first_uid: u32) -> Self {
        Tools { runtime, workspace, limits, first_uid: first_uid.max(1000), lock: Default::default() }
    }

    fn load(&self) -> Registry {
        std::fs::read(self.runtime.join("registry.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Registry { next_uid: self.first_uid, ..Registry::default() })
    }

    fn save(&self, r: &Registry) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.runtime)?;
        std::fs::set_permissions(&self.runtime, std::fs::Permissions::from_mode(0o755))?;
        let tmp = self.runtime.join("registry.json.tmp");
        let bytes = serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, bytes)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(tmp, self.runtime.join("registry.json"))
    }

    fn spec(&self, b: &Binding, id: &str) -> ServerSpec {
        ServerSpec {
            code: b.code.clone(),
            entrypoint: b.entrypoint.clone(),
            uid: b.uid,
            gid: b.uid,
            home: self.runtime.join("homes").join(id),
            limits: self.limits.clone(),
        }
    }

    /// Handles one request. Requests that change the registry (install, switch, revoke) run one
    /// at a time; calls and discoveries only read it, so one binding's long call holds up no other.
    pub async fn handle(&self, req: McpRequest) -> McpReply {
        let changes = !matches!(req, McpRequest::Call { .. } | McpRequest::Discover { .. });
        let _writer = if changes { Some(self.lock.lock().await) } else { None };
        match req {
            McpRequest::Install { binding_id, bot_id, artifact_path, manifest } => {
                self.install(&binding_id, &bot_id, &artifact_path, &manifest).await
            }
            McpRequest::Discover { binding_id } => match self.ready(&binding_id) {
                Ok((_, spec)) => {
                    let (r, _) = runner::discover(&spec).await;
                    r.map(McpReply::ok).unwrap_or_else(|e| McpReply::fail(run_reason(&e), e.to_string()))
                }
                Err(e) => e,
            },
            McpRequest::Call { binding_id, tool, arguments } => match self.ready(&binding_id) {
                Ok((_, spec)) => {
                    let (r, _) = runner::call(&spec, &tool, arguments).await;
                    r.map(McpReply::ok).unwrap_or_else(|e| McpReply::fail(run_reason(&e), e.to_string()))
                }
                Err(e) => e,
            },
            McpRequest::Switch { binding_id, operation_id, from_version, version } => {
                self.switch(&binding_id, &operation_id, &from_version, &version).await
            }
            McpRequest::Revoke { binding_id } => {
                let mut reg = self.load();
                let Some(b) = reg.bindings.get_mut(&binding_id) else {
                    return McpReply::fail("no_binding", "no such binding");
                };
                b.revoked = true;
                let uid = b.uid;
                if let Err(e) = self.save(&reg) {
                    return McpReply::fail("runtime_failed", e.to_string());
                }
                let drain = runner::kill_uid(uid).await;
                McpReply::ok(serde_json::json!({"drained": drain.confirmed, "killed": drain.killed}))
            }
        }
    }

    /// The binding, re-verified: it exists, is not revoked, and its code is byte for byte what
    /// was installed.
    fn ready(&self, id: &str) -> Result<(Binding, ServerSpec), McpReply> {
        let reg = self.load();
        let b = reg.bindings.get(id).cloned().ok_or_else(|| McpReply::fail("no_binding", "no such binding"))?;
        if b.revoked {
            return Err(McpReply::fail("revoked", "the binding was revoked"));
        }
        match tree_digest(&b.code) {
            Ok(d) if d == b.tree_digest => {}
            Ok(_) => return Err(McpReply::fail("package_changed", "the package's files changed since install")),
            Err(e) => return Err(McpReply::fail("package_missing", e.to_string())),
        }
        let spec = self.spec(&b, id);
        Ok((b, spec))
    }

    /// Switches a binding's code to another installed version of its package. A protected
    /// receipt (`RUNTIME/receipts/<binding>/<operation>.json`: operation ids are the bot's own, so
    /// another bot's use of the same id is another receipt) records that it happened; a retry proceeds
    /// only when there is no receipt and the binding is still at the source version (do it), or a
    /// receipt and the binding at the target (answer it again).
    async fn switch(&self, id: &str, op: &str, from: &str, to: &str) -> McpReply {
        if !check_id(op) {
            return McpReply::fail("bad_operation_id", "an operation id is letters, digits, _ and -");
        }
        let mut reg = self.load();
        let Some(b) = reg.bindings.get(id).cloned() else { return McpReply::fail("no_binding", "no such binding") };
        if b.revoked {
            return McpReply::fail("revoked", "the binding was revoked");
        }
        let receipts = self.runtime.join("receipts");
        let receipt_path = receipts.join(id).join(format!("{op}.json"));
        let read = |p: &Path| std::fs::read(p).ok().and_then(|r| serde_json::from_slice::<Value>(&r).ok());
        // (A receipt from before they were kept per binding, `RUNTIME/receipts/<op>.json`, counts
        // for its own binding only.)
        let receipt =
            read(&receipt_path).or_else(|| read(&receipts.join(format!("{op}.json"))).filter(|r| r["binding"] == id));
        match (&receipt, b.version.as_str()) {
            (Some(r), v) if v == to && r["binding"] == id => {
                let (tools, _) = runner::discover(&self.spec(&b, id)).await;
                return match tools {
                    Ok(t) => McpReply::ok(
                        serde_json::json!({"tools": t, "version": to, "sha256": r["sha256"], "replayed": true}),
                    ),
                    Err(e) => McpReply::fail(run_reason(&e), e.to_string()),
                };
            }
            (None, v) if v == from => {}
            _ => {
                return McpReply::fail(
                    "transition_lost",
                    "the binding is neither at the source without a receipt nor at the target with one",
                );
            }
        }
        // The target: a version of the binding's package that the binding's bot installed on this
        // Computer (another bot's install of the same id and version is not it), whose record and
        // bytes are still what that install published.
        if b.bot.is_empty() || b.package_id.is_empty() {
            return McpReply::fail(
                "binding_unrecorded",
                "the binding's bot and package were not recorded when it was installed: install the version for the bot",
            );
        }
        let Some(target) =
            reg.installed.iter().find(|p| p.bot == b.bot && p.id == b.package_id && p.version == to).cloned()
        else {
            return McpReply::fail(
                "version_not_installed",
                format!("version {to} of the package was not installed here for the binding's bot"),
            );
        };
        let Some(record) = install::record(&target.dir) else {
            return McpReply::fail("package_missing", "the target's record is missing");
        };
        let m = &record.manifest;
        if (m.id.as_str(), m.version.as_str(), m.sha256.as_str()) != (&target.id, to, &target.sha256)
            || record.tree_digest != target.tree_digest
        {
            return McpReply::fail("package_changed", "the target version's record is not what the bot installed");
        }
        match tree_digest(&target.dir) {
            Ok(d) if d == target.tree_digest => {}
            Ok(_) => return McpReply::fail("package_changed", "the target version's files changed since install"),
            Err(e) => return McpReply::fail("package_missing", e.to_string()),
        }
        let manifest = record.manifest;
        // Retire the source: nothing of the UID runs while the code changes under it.
        let drain = runner::kill_uid(b.uid).await;
        if !drain.confirmed {
            return McpReply::fail("drain_incomplete", "the binding's processes did not all stop");
        }
        let code = if manifest.share_immutable_package {
            target.dir.clone()
        } else {
            let private = self.runtime.join("private").join(format!("{id}-{to}"));
            if let Err(e) = copy_private(&target.dir, &private, b.uid) {
                return McpReply::fail("runtime_failed", e.to_string());
            }
            private
        };
        let digest = match tree_digest(&code) {
            Ok(d) => d,
            Err(e) => return McpReply::fail("runtime_failed", e.to_string()),
        };
        let mut nb = b.clone();
        nb.package = target.dir.clone();
        nb.code = code;
        nb.entrypoint = manifest.entrypoint.clone();
        nb.version = to.to_string();
        nb.sha256 = target.sha256.clone();
        nb.tree_digest = digest;
        reg.bindings.insert(id.to_string(), nb.clone());
        let receipt = serde_json::json!({"binding": id, "from": from, "to": to, "sha256": manifest.sha256});
        let written = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(receipts.join(id))?;
            std::fs::set_permissions(&receipts, std::fs::Permissions::from_mode(0o700))?;
            std::fs::set_permissions(receipts.join(id), std::fs::Permissions::from_mode(0o700))?;
            // The registry first, then the receipt: a crash between leaves "at target, no
            // receipt", which a retry refuses rather than guesses.
            self.save(&reg)?;
            let tmp = receipts.join(id).join(format!(".{op}.tmp"));
            std::fs::write(&tmp, receipt.to_string())?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
            std::fs::rename(tmp, &receipt_path)
        })();
        if let Err(e) = written {
            return McpReply::fail("runtime_failed", e.to_string());
        }
        let (tools, _) = runner::discover(&self.spec(&nb, id)).await;
        match tools {
            Ok(t) => McpReply::ok(
                serde_json::json!({"tools": t, "version": to, "sha256": manifest.sha256, "replayed": false}),
            ),
            Err(e) => McpReply::fail(run_reason(&e), format!("switched, but discovery failed: {e}")),
        }
    }

    async fn install(&self, id: &str, bot: &str, artifact: &str, manifest: &Value) -> McpReply {
        if !check_id(id) {
            return McpReply::fail("bad_binding_id", "a binding id is letters, digits, _ and -");
        }
        if !check_id(bot) {
            return McpReply::fail("bad_bot_id", "a bot id is letters, digits, _ and -");
        }
        let manifest = match Manifest::parse(manifest) {
            Ok(m) => m,
            Err(e) => return McpReply::fail(e.reason(), e.to_string()),
        };
        let mut reg = self.load();
        if let Some(b) = reg.bindings.get(id) {
            // The node sends an install again after a lost answer: answer what is there.
            if b.revoked {
                return McpReply::fail("revoked", "the binding was revoked");
            }
            let asked = (bot, manifest.id.as_str(), manifest.version.as_str(), manifest.sha256.as_str());
            if (b.bot.as_str(), b.package_id.as_str(), b.version.as_str(), b.sha256.as_str()) != asked {
                return McpReply::fail("binding_exists", "the binding exists with another bot or package");
            }
            let (_, spec) = match self.ready(id) {
                Ok(x) => x,
                Err(e) => return e,
            };
            let (r, _) = runner::discover(&spec).await;
            return r
                .map(|t| McpReply::ok(serde_json::json!({"tools": t})))
                .unwrap_or_else(|e| McpReply::fail(run_reason(&e), e.to_string()));
        }
        if reg.bindings.len() >= MAX_BINDINGS {
            return McpReply::fail("too_many_bindings", format!("this computer keeps at most {MAX_BINDINGS} bindings"));
        }
        if reg.next_uid.max(self.first_uid) >= self.first_uid.saturating_add(UID_RANGE) {
            return McpReply::fail(
                "uids_exhausted",
                format!("this computer's {UID_RANGE} binding UIDs from {} are all used", self.first_uid),
            );
        }
        let (ws, rt, m) = (self.workspace.clone(), self.runtime.clone(), manifest.clone());
        let artifact = artifact.to_string();
        let installed =
            tokio::task::spawn_blocking(move || install::install(&ws, &artifact, &m, &rt, &Limits::default()))
                .await
                .map_err(|e| install::InstallError::Runtime(e.to_string()));
        let installed = match installed.and_then(|r| r) {
            Ok(i) => i,
            Err(e) => return McpReply::fail(e.reason(), e.to_string()),
        };
        let uid = reg.next_uid.max(self.first_uid);
        let home = self.runtime.join("homes").join(id);
        let code = if manifest.share_immutable_package {
            installed.dir.clone()
        } else {
            self.runtime.join("private").join(id)
        };
        let setup = (|| -> std::io::Result<String> {
            std::fs::create_dir_all(&home)?;
            std::os::unix::fs::chown(&home, Some(uid), Some(uid))?;
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
            for d in [self.runtime.join("packages"), self.runtime.join("homes")] {
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
            }
            if !manifest.share_immutable_package {
                let private = self.runtime.join("private");
                std::fs::create_dir_all(&private)?;
                std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755))?;
                copy_private(&installed.dir, &code, uid)?;
            }
            tree_digest(&code)
        })();
        let digest = match setup {
            Ok(d) => d,
            Err(e) => return McpReply::fail("runtime_failed", e.to_string()),
        };
        let package = Installed {
            bot: bot.to_string(),
            id: manifest.id.clone(),
            version: manifest.version.clone(),
            sha256: manifest.sha256.clone(),
            dir: installed.dir.clone(),
            tree_digest: installed.tree_digest.clone(),
        };
        if !reg.installed.contains(&package) {
            reg.installed.push(package);
        }
        let b = Binding {
            package: installed.dir,
            code,
            entrypoint: manifest.entrypoint.clone(),
            version: manifest.version.clone(),
            uid,
            tree_digest: digest,
            revoked: false,
            bot: bot.to_string(),
            package_id: manifest.id.clone(),
            sha256: manifest.sha256.clone(),
        };
        let spec = self.spec(&b, id);
        reg.next_uid = uid + 1;
        reg.bindings.insert(id.to_string(), b);
        if let Err(e) = self.save(&reg) {
            return McpReply::fail("runtime_failed", e.to_string());
        }
        let (tools, _) = runner::discover(&spec).await;
        match tools {
            Ok(t) => McpReply::ok(serde_json::json!({"tools": t, "uid": uid})),
            Err(e) => McpReply::fail(run_reason(&e), format!("installed, but discovery failed: {e}")),
        }
    }
}

fn run_reason(e: &runner::RunError) -> &'static str {
    match e {
        runner::RunError::Spawn(_) => "server_did_not_start",
        runner::RunError::Protocol(_) => "mcp_error",
        runner::RunError::Deadline(_) => "deadline",
    }
}
