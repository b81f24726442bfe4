//! Bindings: a package installed for a bot, with its own UID, private HOME and state, kept in a
//! root-owned registry under the runtime directory (`RUNTIME/registry.json`, 0600), so a restart
//! of the agent keeps them. The node drives them through the agent's `Mcp` RPC with the JSON
//! [`McpRequest`] and answers [`McpReply`].
//!
//! Layout under the runtime directory (root-owned, apart from the task home): `packages/` (the
//! published code, read-only to bindings), `private/<binding>` (a copy readable only by the
//! binding's group, when the package is not shared), `homes/<binding>` (the binding's HOME and
//! state, 0700, owned by its UID), `staging/` (installs in progress).
//!
//! Clean-up: a revoked binding whose drain is confirmed loses its HOME, its private copy and its
//! receipts, and leaves the registry for a bounded list of revoked ids (so a late install or
//! call under that id is still refused); a failed install leaves nothing of its binding; after
//! either, every published package that no binding uses is removed with its record. Only live
//! bindings count toward [`MAX_BINDINGS`].

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

/// Live bindings kept per Computer (revoked ones do not count).
pub const MAX_BINDINGS: usize = 64;
/// Revoked binding ids remembered after their clean-up (oldest forgotten first).
pub const MAX_REVOKED_IDS: usize = 1024;
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
    /// Revoked bindings already cleaned up (drained, files removed), oldest first.
    #[serde(default)]
    revoked: std::collections::VecDeque<String>,
}

impl Registry {
    fn is_tombstone(&self, id: &str) -> bool {
        self.revoked.iter().any(|r| r == id)
    }

    fn tombstone(&mut self, id: &str) {
        if !self.is_tombstone(id) {
            self.revoked.push_back(id.to_string());
        }
        while self.revoked.len() > MAX_REVOKED_IDS {
            self.revoked.pop_front();
        }
    }
}

/// How bindings are kept apart from each other and from the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolation {
    /// Each binding has a UID of its own (the agent is root). `group` is the bindings' shared
    /// group (the first UID of the range, which no binding takes): only it, besides root, may
    /// pass through the agent's state dir and the runtime (mode 0710), so a session's account
    /// cannot even enter them.
    OwnUid {
        /// The bindings' group.
        group: u32,
    },
    /// The agent is not root and cannot give bindings UIDs of their own: installs are refused
    /// (`isolation_unavailable`).
    Unavailable,
    /// The Computer's owner chose (`--shared-uid-bindings`) to run bindings under the agent's own
    /// UID: they are marked `sharedUid`, and a drain ends the server's session, not a UID.
    SharedUid {
        /// The agent's UID.
        uid: u32,
        /// The agent's GID.
        gid: u32,
    },
}

impl Isolation {
    /// What this agent can do: its own UIDs for bindings when it runs as root (the group is
    /// `first_uid`), else shared-UID bindings when `shared` (the owner's choice), else none.
    pub fn of_agent(first_uid: u32, shared: bool) -> Isolation {
        let uid = nix::unistd::geteuid().as_raw();
        match (uid, shared) {
            (0, _) => Isolation::OwnUid { group: first_uid.max(1000) },
            (_, true) => Isolation::SharedUid { uid, gid: nix::unistd::getegid().as_raw() },
            (_, false) => Isolation::Unavailable,
        }
    }

    /// The bindings' group, when they have UIDs of their own.
    pub fn group(&self) -> Option<u32> {
        match self {
            Isolation::OwnUid { group } => Some(*group),
            _ => None,
        }
    }
}

/// The bindings of this agent.
#[derive(Clone)]
pub struct Tools {
    runtime: PathBuf,
    workspace: PathBuf,
    limits: RunLimits,
    first_uid: u32,
    isolation: Isolation,
    /// Why a binding cannot reach the runtime (the directory in the way), when it cannot: tool
    /// installs and runs are refused with it ([`Tools::check_reach`]).
    blocked: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    lock: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Kept answers of calls the node named (`results/`).
    results: super::results::ResultStore,
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
    std::os::unix::fs::chown(to, None, Some(gid))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o750))?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let dest = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_private(&e.path(), &dest, gid)?;
        } else {
            std::fs::copy(e.path(), &dest)?;
            std::os::unix::fs::chown(&dest, None, Some(gid))?;
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
    ///
    /// Isolation is this agent's ([`Isolation::of_agent`], without shared-UID bindings) until
    /// [`Tools::with_isolation`] says otherwise.
    pub fn new(runtime: PathBuf, workspace: PathBuf, limits: RunLimits, first_uid: u32) -> Self {
        let first_uid = first_uid.max(1000);
        let results = super::results::ResultStore::new(runtime.join("results"), Default::default());
        Tools {
            results,
            runtime,
            workspace,
            limits,
            first_uid,
            isolation: Isolation::of_agent(first_uid, false),
            blocked: Default::default(),
            lock: Default::default(),
        }
    }

    /// The same with the kept answers bounded by `limits`.
    pub fn with_result_limits(mut self, limits: super::results::ResultLimits) -> Self {
        self.results = super::results::ResultStore::new(self.runtime.join("results"), limits);
        self
    }

    /// The same with `isolation`.
    pub fn with_isolation(mut self, isolation: Isolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// The runtime directory, root's and the bindings' group's (0710), or the agent's alone.
    fn prepare_runtime(&self) -> std::io::Result<()> {
        crate::layout::protect(&self.runtime, self.isolation.group())
    }

    /// Checks, as a binding would be (a UID of the range with the bindings' group), that the
    /// runtime can be reached: every directory on the way must let it pass. Answers why not,
    /// naming the directory in the way, and remembers it: installs and runs are refused with it
    /// until a check finds the way open. Only for bindings with UIDs of their own.
    pub async fn check_reach(&self) -> Option<String> {
        let Isolation::OwnUid { group } = self.isolation else { return None };
        let why = match self.prepare_runtime() {
            Err(e) => Some(format!("cannot prepare the runtime {}: {e}", self.runtime.display())),
            Ok(()) => reach(&self.runtime, group).await,
        };
        *self.blocked.lock().unwrap_or_else(|p| p.into_inner()) = why.clone();
        why
    }

    fn load(&self) -> Registry {
        std::fs::read(self.runtime.join("registry.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Registry { next_uid: self.first_uid + 1, ..Registry::default() })
    }

    fn save(&self, r: &Registry) -> std::io::Result<()> {
        self.prepare_runtime()?;
        let tmp = self.runtime.join("registry.json.tmp");
        let bytes = serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, bytes)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(tmp, self.runtime.join("registry.json"))
    }

    fn spec(&self, b: &Binding, id: &str) -> ServerSpec {
        let (uid, gid, group, shared) = match self.isolation {
            Isolation::SharedUid { uid, gid } => (uid, gid, None, true),
            Isolation::OwnUid { group } => (b.uid, b.uid, Some(group), false),
            Isolation::Unavailable => (b.uid, b.uid, None, false),
        };
        ServerSpec {
            code: b.code.clone(),
            entrypoint: b.entrypoint.clone(),
            uid,
            gid,
            group,
            shared_uid: shared,
            home: self.runtime.join("homes").join(id),
            limits: self.limits.clone(),
        }
    }

    /// Refuses what this agent cannot run: without UIDs for bindings (and no shared-UID
    /// choice), or with the runtime out of a binding's reach.
    fn refusal(&self) -> Option<McpReply> {
        if self.isolation == Isolation::Unavailable {
            return Some(McpReply::fail(
                "isolation_unavailable",
                "this agent does not run as root, so it cannot give a binding a UID of its own; the \
                 computer's owner may start it with --shared-uid-bindings to run bindings under the agent's own UID",
            ));
        }
        let blocked = self.blocked.lock().unwrap_or_else(|p| p.into_inner()).clone();
        blocked.map(|why| McpReply::fail("runtime_unreachable", why))
    }

    /// Handles one request. Requests that change the registry (install, switch, revoke) run one
    /// at a time; calls and discoveries only read it, so one binding's long call holds up no other.
    pub async fn handle(&self, req: McpRequest) -> McpReply {
        let changes = !matches!(req, McpRequest::Call { .. } | McpRequest::Discover { .. } | McpRequest::Result { .. });
        let _writer = if changes { Some(self.lock.lock().await) } else { None };
        if matches!(req, McpRequest::Install { .. }) && self.isolation.group().is_some() {
            // Looked at again for each install: a way opened since start-up is taken.
            self.check_reach().await;
        }
        if !matches!(req, McpRequest::Revoke { .. } | McpRequest::Result { .. })
            && let Some(refused) = self.refusal()
        {
            return refused;
        }
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
            McpRequest::Call { binding_id, tool, arguments, operation } => {
                if operation.as_deref().is_some_and(|o| !super::results::is_name(o)) {
                    return McpReply::fail("bad_operation", "an operation name is 64 hex digits");
                }
                let reply = match self.ready(&binding_id) {
                    Ok((_, spec)) => {
                        let (r, _) = runner::call(&spec, &tool, arguments).await;
                        r.map(McpReply::ok).unwrap_or_else(|e| McpReply::fail(run_reason(&e), e.to_string()))
                    }
                    Err(e) => e,
                };
                if let Some(name) = operation {
                    self.keep(&binding_id, &name, &reply);
                }
                reply
            }
            McpRequest::Result { binding_id, operation } => self.kept(&binding_id, &operation),
            McpRequest::Switch { binding_id, operation_id, from_version, version } => {
                self.switch(&binding_id, &operation_id, &from_version, &version).await
            }
            McpRequest::Revoke { binding_id } => self.revoke(&binding_id).await,
        }
    }

    /// Keeps a call's answer for a replay, as the node journals it: `{"ok": …}` or
    /// `{"error": {"reason", "message"}}`, with the binding it was made on. An answer that
    /// cannot be kept is logged; its replay will be answered `result_expired`.
    fn keep(&self, binding_id: &str, name: &str, reply: &McpReply) {
        let answer = match (&reply.result, &reply.error) {
            (_, Some(e)) => serde_json::json!({"error": {"reason": e.reason, "message": e.message}}),
            (Some(r), None) => serde_json::json!({"ok": r}),
            (None, None) => return,
        };
        let kept = serde_json::json!({"bindingId": binding_id, "answer": answer});
        let stored = serde_json::to_vec(&kept).map_err(std::io::Error::other).and_then(|b| self.results.put(name, &b));
        if let Err(e) = stored {
            tracing::warn!(binding = %binding_id, error = %e, "a tool call's answer was not kept for replays");
        }
    }

    /// The kept answer of call `name` on `binding_id`: `{"reply": answer}`, or `result_expired`.
    fn kept(&self, binding_id: &str, name: &str) -> McpReply {
        let expired = || McpReply::fail("result_expired", "the original result has expired; the call is not run again");
        let Some(bytes) = self.results.get(name) else { return expired() };
        match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(v) if v["bindingId"] == binding_id => McpReply::ok(serde_json::json!({"reply": v["answer"]})),
            _ => expired(),
        }
    }

    /// Closes a binding for good and kills its UID's tasks; once nothing of the UID is left, its
    /// files go (HOME, private copy, receipts), its id joins the revoked list and packages no
    /// binding uses are removed. A binding this agent never had (its install may still be on the
    /// way) is recorded revoked, so that install is refused.
    async fn revoke(&self, id: &str) -> McpReply {
        if !check_id(id) {
            return McpReply::fail("bad_binding_id", "a binding id is letters, digits, _ and -");
        }
        let mut reg = self.load();
        let Some(b) = reg.bindings.get_mut(id) else {
            if reg.is_tombstone(id) {
                return McpReply::ok(serde_json::json!({"drained": true, "killed": 0}));
            }
            reg.tombstone(id);
            if let Err(e) = self.save(&reg) {
                return McpReply::fail("runtime_failed", e.to_string());
            }
            return McpReply::ok(serde_json::json!({"drained": true, "killed": 0}));
        };
        b.revoked = true;
        let uid = b.uid;
        if let Err(e) = self.save(&reg) {
            return McpReply::fail("runtime_failed", e.to_string());
        }
        // Shared-UID bindings leave nothing behind a call (each run ends its server's session);
        // their UID is the agent's and is never drained.
        let drain =
            if self.spec_shared() { runner::Drain { confirmed: true, killed: 0 } } else { runner::kill_uid(uid).await };
        if drain.confirmed {
            // Nothing of the UID runs: its files may go.
            if let Some(b) = reg.bindings.remove(id) {
                self.remove_files(id, &b);
            }
            reg.tombstone(id);
            self.collect_packages(&mut reg);
            if let Err(e) = self.save(&reg) {
                return McpReply::fail("runtime_failed", e.to_string());
            }
        }
        McpReply::ok(serde_json::json!({"drained": drain.confirmed, "killed": drain.killed}))
    }

    /// Removes a binding's own files: its HOME, its private copy of the code, its receipts.
    fn remove_files(&self, id: &str, b: &Binding) {
        let _ = std::fs::remove_dir_all(self.runtime.join("homes").join(id));
        let _ = std::fs::remove_dir_all(self.runtime.join("receipts").join(id));
        self.remove_private(&b.code);
        let _ = std::fs::remove_dir_all(self.runtime.join("private").join(id));
    }

    /// Removes `code` when it is a private copy (under `RUNTIME/private/`), never shared code.
    fn remove_private(&self, code: &Path) {
        let private = self.runtime.join("private");
        if code.parent() == Some(private.as_path()) {
            let _ = std::fs::remove_dir_all(code);
        }
    }

    /// Forgets a bot's install of a package once none of that bot's bindings uses it, and removes
    /// every published package (`packages/<id>/<dir>` and its record) that no binding uses.
    fn collect_packages(&self, reg: &mut Registry) {
        let used: std::collections::BTreeSet<(String, PathBuf)> =
            reg.bindings.values().map(|b| (b.bot.clone(), b.package.clone())).collect();
        reg.installed.retain(|p| used.contains(&(p.bot.clone(), p.dir.clone())));
        let kept: std::collections::BTreeSet<PathBuf> = reg
            .bindings
            .values()
            .map(|b| b.package.clone())
            .chain(reg.installed.iter().map(|p| p.dir.clone()))
            .collect();
        let packages = self.runtime.join("packages");
        let Ok(ids) = std::fs::read_dir(&packages) else { return };
        for home in ids.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
            let Ok(versions) = std::fs::read_dir(home.path()) else { continue };
            for v in versions.flatten() {
                let dir = v.path();
                if !v.file_type().is_ok_and(|t| t.is_dir()) || kept.contains(&dir) {
                    continue;
                }
                if std::fs::remove_dir_all(&dir).is_ok() {
                    let mut record = dir.as_os_str().to_owned();
                    record.push(".json");
                    let _ = std::fs::remove_file(record);
                }
            }
            // Empty once its last version went (a record left alone keeps it).
            let _ = std::fs::remove_dir(home.path());
        }
    }

    /// Undoes an install that failed after its binding was set up: nothing of it stays.
    async fn undo_install(&self, id: &str) {
        let mut reg = self.load();
        let Some(b) = reg.bindings.remove(id) else { return };
        // A shared UID is the agent's own: never drained (its server's session ended with it).
        let drain = if self.spec_shared() {
            runner::Drain { confirmed: true, killed: 0 }
        } else {
            runner::kill_uid(b.uid).await
        };
        if !drain.confirmed {
            // Something of the UID still runs: keep it revoked, so a revoke finishes the job.
            let mut b = b;
            b.revoked = true;
            reg.bindings.insert(id.to_string(), b);
        } else {
            self.remove_files(id, &b);
            reg.tombstone(id);
            self.collect_packages(&mut reg);
        }
        let _ = self.save(&reg);
    }

    /// The binding, re-verified: it exists, is not revoked, and its code is byte for byte what
    /// was installed.
    fn ready(&self, id: &str) -> Result<(Binding, ServerSpec), McpReply> {
        let reg = self.load();
        if reg.is_tombstone(id) {
            return Err(McpReply::fail("revoked", "the binding was revoked"));
        }
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
    /// receipt and the binding at the target (answer it again, once the bytes are checked again).
    ///
    /// Every refusal says exactly what was done, in its `result`: `{"switched", "version"}`
    /// (the version the binding is at now). The store reopens the binding at the source only on
    /// `switched: false` at the source version; anything else keeps the switch pending.
    async fn switch(&self, id: &str, op: &str, from: &str, to: &str) -> McpReply {
        let not_switched = |at: Option<&str>, reason: &str, message: String| switch_refusal(false, at, reason, message);
        if !check_id(op) {
            return not_switched(None, "bad_operation_id", "an operation id is letters, digits, _ and -".into());
        }
        let mut reg = self.load();
        let Some(b) = reg.bindings.get(id).cloned() else {
            return not_switched(None, "no_binding", "no such binding".into());
        };
        let at = Some(b.version.as_str());
        if b.revoked {
            return not_switched(at, "revoked", "the binding was revoked".into());
        }
        let receipts = self.runtime.join("receipts");
        let receipt_path = receipts.join(id).join(format!("{op}.json"));
        let read = |p: &Path| std::fs::read(p).ok().and_then(|r| serde_json::from_slice::<Value>(&r).ok());
        // (A receipt from before they were kept per binding, `RUNTIME/receipts/<op>.json`, counts
        // for its own binding only.)
        let receipt =
            read(&receipt_path).or_else(|| read(&receipts.join(format!("{op}.json"))).filter(|r| r["binding"] == id));
        match (&receipt, b.version.as_str()) {
            (Some(r), v) if v == to && r["binding"] == id => return self.replay_switch(&reg, &b, id, to, r).await,
            (None, v) if v == from => {}
            _ => {
                return not_switched(
                    at,
                    "transition_lost",
                    "the binding is neither at the source without a receipt nor at the target with one: revoke it and install again".into(),
                );
            }
        }
        let (target, manifest) = match verified_target(&reg, &b, to) {
            Ok(t) => t,
            Err((reason, message)) => return not_switched(at, reason, message),
        };
        // Retire the source: nothing of the UID runs while the code changes under it.
        let drain = if self.spec_shared() {
            runner::Drain { confirmed: true, killed: 0 }
        } else {
            runner::kill_uid(b.uid).await
        };
        if !drain.confirmed {
            return not_switched(at, "drain_incomplete", "the binding's processes did not all stop".into());
        }
        let code = if manifest.share_immutable_package {
            target.dir.clone()
        } else {
            let private = self.runtime.join("private").join(format!("{id}-{to}"));
            if let Err(e) = copy_private(&target.dir, &private, b.uid) {
                return not_switched(at, "runtime_failed", e.to_string());
            }
            private
        };
        let digest = match tree_digest(&code) {
            Ok(d) => d,
            Err(e) => return not_switched(at, "runtime_failed", e.to_string()),
        };
        let mut nb = b.clone();
        nb.package = target.dir.clone();
        nb.code = code;
        nb.entrypoint = manifest.entrypoint.clone();
        nb.version = to.to_string();
        nb.sha256 = target.sha256.clone();
        nb.tree_digest = digest;
        let before = reg.clone();
        reg.bindings.insert(id.to_string(), nb.clone());
        let receipt = serde_json::json!({"binding": id, "from": from, "to": to, "sha256": manifest.sha256});
        let prepared = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(receipts.join(id))?;
            std::fs::set_permissions(&receipts, std::fs::Permissions::from_mode(0o700))?;
            std::fs::set_permissions(receipts.join(id), std::fs::Permissions::from_mode(0o700))
        })();
        // The registry first, then the receipt: a crash between leaves "at target, no receipt",
        // which a retry refuses rather than guesses.
        if let Err(e) = prepared.and_then(|()| self.save(&reg)) {
            // What the registry says now is what the binding runs.
            let now = self.load().bindings.get(id).map(|x| x.version.clone());
            if now.as_deref() == Some(to) {
                return switch_refusal(true, Some(to), "runtime_failed", format!("switched, but: {e}"));
            }
            if b.code != nb.code {
                self.remove_private(&nb.code);
            }
            return not_switched(now.as_deref(), "runtime_failed", e.to_string());
        }
        let written = (|| -> std::io::Result<()> {
            let tmp = receipts.join(id).join(format!(".{op}.tmp"));
            std::fs::write(&tmp, receipt.to_string())?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
            std::fs::rename(tmp, &receipt_path)
        })();
        if let Err(e) = written {
            // No receipt: the binding goes back to the source, so that the switch can be asked
            // again; if even that fails, it is at the target without a receipt, and says so.
            return match self.save(&before) {
                Ok(()) => {
                    if b.code != nb.code {
                        self.remove_private(&nb.code);
                    }
                    not_switched(at, "runtime_failed", format!("the receipt was not written: {e}"))
                }
                Err(back) => switch_refusal(
                    true,
                    Some(to),
                    "runtime_failed",
                    format!("switched, but the receipt was not written ({e}) nor the switch undone ({back})"),
                ),
            };
        }
        if b.code != nb.code {
            // The source's private copy is no one's code now.
            self.remove_private(&b.code);
        }
        self.discovered(&nb, id, to, &manifest.sha256, false).await
    }

    /// The answer to a switch that already happened (its receipt, and the binding at the
    /// target): the target's bytes and the binding's code are checked again against what the
    /// install published and the manifest's digest, then its schemas discovered.
    async fn replay_switch(&self, reg: &Registry, b: &Binding, id: &str, to: &str, receipt: &Value) -> McpReply {
        let changed = |message: String| switch_refusal(true, Some(to), "package_changed", message);
        let target = match verified_target(reg, b, to) {
            Ok((target, _)) => target,
            Err((_, message)) => return changed(message),
        };
        if receipt["sha256"].as_str() != Some(target.sha256.as_str()) || b.sha256 != target.sha256 {
            return changed("the receipt's digest is not the installed target's".into());
        }
        match tree_digest(&b.code) {
            Ok(d) if d == b.tree_digest => {}
            Ok(_) => return changed("the binding's code changed since the switch".into()),
            Err(e) => return switch_refusal(true, Some(to), "package_missing", e.to_string()),
        }
        self.discovered(b, id, to, &target.sha256, true).await
    }

    /// A switched binding's schemas: the switch's answer, or a refusal that says it switched.
    async fn discovered(&self, b: &Binding, id: &str, to: &str, sha256: &str, replayed: bool) -> McpReply {
        let (tools, _) = runner::discover(&self.spec(b, id)).await;
        match tools {
            Ok(t) => {
                McpReply::ok(serde_json::json!({"tools": t, "version": to, "sha256": sha256, "replayed": replayed}))
            }
            Err(e) => switch_refusal(true, Some(to), run_reason(&e), format!("switched, but discovery failed: {e}")),
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
        if reg.is_tombstone(id) {
            return McpReply::fail("revoked", "the binding was revoked");
        }
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
            let shared = spec.shared_uid;
            return r
                .map(|t| McpReply::ok(serde_json::json!({"tools": t, "uid": spec.uid, "sharedUid": shared})))
                .unwrap_or_else(|e| McpReply::fail(run_reason(&e), e.to_string()));
        }
        if reg.bindings.values().filter(|b| !b.revoked).count() >= MAX_BINDINGS {
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
            Err(e) => {
                // (A refusal left no staging directory; nothing was published by it.)
                return McpReply::fail(e.reason(), e.to_string());
            }
        };
        // The range's first UID is the bindings' group, never a binding's.
        let uid = reg.next_uid.max(self.first_uid + 1);
        let home = self.runtime.join("homes").join(id);
        let (home_uid, home_gid) = match self.isolation {
            Isolation::SharedUid { uid, gid } => (uid, gid),
            _ => (uid, uid),
        };
        let code = if manifest.share_immutable_package {
            installed.dir.clone()
        } else {
            self.runtime.join("private").join(id)
        };
        let setup = (|| -> std::io::Result<String> {
            std::fs::create_dir_all(&home)?;
            std::os::unix::fs::chown(&home, Some(home_uid), Some(home_gid))?;
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
            for d in [self.runtime.join("packages"), self.runtime.join("homes")] {
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
            }
            if !manifest.share_immutable_package {
                let private = self.runtime.join("private");
                std::fs::create_dir_all(&private)?;
                std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755))?;
                copy_private(&installed.dir, &code, home_gid)?;
            }
            tree_digest(&code)
        })();
        let digest = match setup {
            Ok(d) => d,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&home);
                self.remove_private(&code);
                self.collect_packages(&mut reg);
                let _ = self.save(&reg);
                return McpReply::fail("runtime_failed", e.to_string());
            }
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
        let shared = self.spec_shared();
        match tools {
            Ok(t) => McpReply::ok(serde_json::json!({"tools": t, "uid": spec.uid, "sharedUid": shared})),
            Err(e) => {
                // A server that does not start (or speak MCP) is no binding: undo it all.
                self.undo_install(id).await;
                McpReply::fail(run_reason(&e), format!("the package installed, but its server failed: {e}"))
            }
        }
    }
}

impl Tools {
    fn spec_shared(&self) -> bool {
        matches!(self.isolation, Isolation::SharedUid { .. })
    }
}

/// Whether a binding (a UID of the range, with the bindings' `group`) can reach `runtime`:
/// `None`, or the directory in its way with that directory's owner and mode.
async fn reach(runtime: &Path, group: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let probe = std::sync::Arc::new(crate::users::Account {
        name: "a tool binding".into(),
        uid: group,
        gid: group,
        groups: vec![group],
        home: "/".into(),
        shell: "/bin/false".into(),
        switches: true,
    });
    let runtime = match std::path::absolute(runtime) {
        Ok(p) => p,
        Err(e) => return Some(format!("cannot resolve the runtime {}: {e}", runtime.display())),
    };
    let target = runtime.join("packages");
    let steps: Vec<PathBuf> = target.ancestors().map(Path::to_path_buf).collect::<Vec<_>>().into_iter().rev().collect();
    // The first step a binding cannot stat: its parent does not let it pass.
    let found = crate::users::run_as(&probe, move || {
        for step in steps {
            match std::fs::metadata(&step) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
                Err(e) => return Some((step, e.to_string())),
            }
        }
        None
    })
    .await;
    let (step, err) = match found {
        Ok(None) => return None,
        Ok(Some(x)) => x,
        Err(e) => return Some(format!("cannot check the way to the runtime: {e}")),
    };
    let dir = step.parent().unwrap_or(Path::new("/")).to_path_buf();
    let how = std::fs::metadata(&dir)
        .map(|m| format!(" (owner {}:{}, mode {:o})", m.uid(), m.gid(), m.mode() & 0o7777))
        .unwrap_or_default();
    Some(format!(
        "a tool binding's UID cannot reach the runtime {}: {} does not let it pass{how} ({err}); let others (or group {group}) search it, e.g. chmod o+x {}",
        runtime.display(),
        dir.display(),
        dir.display()
    ))
}

fn run_reason(e: &runner::RunError) -> &'static str {
    match e {
        runner::RunError::Spawn(_) => "server_did_not_start",
        runner::RunError::Protocol(_) => "mcp_error",
        runner::RunError::Deadline(_) => "deadline",
    }
}

/// A switch's refusal, with what was done: whether the binding switched, and the version it is
/// at now (`None`: there is no such binding).
fn switch_refusal(switched: bool, version: Option<&str>, reason: &str, message: String) -> McpReply {
    let mut r = McpReply::fail(reason, message);
    r.result = Some(serde_json::json!({"switched": switched, "version": version}));
    r
}

/// The target of a switch of `b` to `to`: a version of the binding's package that the binding's
/// bot installed on this Computer (another bot's install of the same id and version is not it),
/// whose record and bytes are still what that install published. Answers it and its manifest,
/// or why not (reason, message).
fn verified_target(
    reg: &Registry,
    b: &Binding,
    to: &str,
) -> Result<(Installed, install::Manifest), (&'static str, String)> {
    if b.bot.is_empty() || b.package_id.is_empty() {
        return Err((
            "binding_unrecorded",
            "the binding's bot and package were not recorded when it was installed: install the version for the bot"
                .into(),
        ));
    }
    let Some(target) =
        reg.installed.iter().find(|p| p.bot == b.bot && p.id == b.package_id && p.version == to).cloned()
    else {
        return Err((
            "version_not_installed",
            format!("version {to} of the package was not installed here for the binding's bot"),
        ));
    };
    let Some(record) = install::record(&target.dir) else {
        return Err(("package_missing", "the target's record is missing".into()));
    };
    let m = &record.manifest;
    if (m.id.as_str(), m.version.as_str(), m.sha256.as_str()) != (&target.id, to, &target.sha256)
        || record.tree_digest != target.tree_digest
    {
        return Err(("package_changed", "the target version's record is not what the bot installed".into()));
    }
    match tree_digest(&target.dir) {
        Ok(d) if d == target.tree_digest => Ok((target, record.manifest)),
        Ok(_) => Err(("package_changed", "the target version's files changed since install".into())),
        Err(e) => Err(("package_missing", e.to_string())),
    }
}
