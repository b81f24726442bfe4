//! The package installer, run inside the Computer: read the archive from the workspace (never
//! downloaded), check its SHA-256 before decompressing anything, unpack it into a fresh staging
//! directory with the strict reader ([`super::archive`]), check the entrypoint, and only then
//! publish it by one rename to `RUNTIME/packages/<id>/<version>-<digest12>`. Any refusal names its
//! reason and removes the staging directory; published packages and everything else stay as they
//! were. It never runs pip, npm or any hook.

use std::path::Path;
use std::path::PathBuf;

use serde::Deserialize;
use sha2::Digest;

use super::archive;
use super::archive::Limits;
use super::archive::Rejection;

/// How many packages one Computer keeps.
pub const MAX_PACKAGES: usize = 32;
/// Interpreters an entrypoint may name instead of a file of the package.
pub const INTERPRETERS: [&str; 3] = ["python3", "node", "bash"];

/// A package's manifest. Unknown fields (permissions, hooks, ...) are refused.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// `example.mcp.server`: lowercase letters, digits, `.`, `-`, `_`.
    pub id: String,
    /// `1.0.0`: letters, digits, `.`, `-`, `+`.
    pub version: String,
    /// The archive's SHA-256, 64 lowercase hex digits.
    pub sha256: String,
    /// The server's command: an interpreter or a `./file` of the package, then arguments.
    pub entrypoint: Vec<String>,
    /// Whether bindings share the one read-only copy of the code.
    pub share_immutable_package: bool,
}

/// Why an install was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallError {
    /// The manifest is not acceptable.
    #[error("manifest: {0}")]
    Manifest(String),
    /// The artifact path is not a file of the workspace.
    #[error("artifactPath: {0}")]
    Artifact(String),
    /// The archive's digest is not the manifest's.
    #[error("the archive's SHA-256 is not the manifest's")]
    DigestMismatch,
    /// The archive was refused.
    #[error(transparent)]
    Archive(#[from] Rejection),
    /// The entrypoint's interpreter is not installed on this Computer.
    #[error("the interpreter {0} is not installed")]
    MissingInterpreter(String),
    /// The entrypoint names no file of the package.
    #[error("the entrypoint {0} is not a file of the package")]
    MissingEntrypoint(String),
    /// Too many packages on this Computer.
    #[error("this computer already has {MAX_PACKAGES} packages")]
    TooManyPackages,
    /// The same id and version with another digest is installed.
    #[error("{0} is already installed with another digest")]
    VersionExists(String),
    /// This package is installed, but its files are no longer what its record says.
    #[error("{0} is installed, but its files changed since")]
    PackageChanged(String),
    /// The runtime directory could not be written.
    #[error("runtime: {0}")]
    Runtime(String),
}

impl InstallError {
    /// A stable code naming the reason.
    pub fn reason(&self) -> &'static str {
        match self {
            InstallError::Manifest(_) => "bad_manifest",
            InstallError::Artifact(_) => "bad_artifact_path",
            InstallError::DigestMismatch => "digest_mismatch",
            InstallError::Archive(r) => r.reason(),
            InstallError::MissingInterpreter(_) => "missing_interpreter",
            InstallError::MissingEntrypoint(_) => "missing_entrypoint",
            InstallError::TooManyPackages => "too_many_packages",
            InstallError::VersionExists(_) => "version_exists",
            InstallError::PackageChanged(_) => "package_changed",
            InstallError::Runtime(_) => "runtime_failed",
        }
    }
}

/// A published package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// Where its files are (read-only for bindings).
    pub dir: PathBuf,
    /// Its files.
    pub files: Vec<String>,
    /// The sum of their sizes.
    pub bytes: u64,
    /// False when this exact package was already installed (nothing was changed).
    pub new: bool,
    /// The tree digest of its files ([`super::bindings::tree_digest`]), as its record says and
    /// its files were found to be.
    pub tree_digest: String,
}

/// What is published beside a package (`<dir>.json`, root-owned): its manifest and the tree
/// digest of its files.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Record {
    /// The manifest it was installed with: id, version and the archive's full SHA-256.
    pub manifest: Manifest,
    /// The tree digest of its files when it was published.
    #[serde(rename = "treeDigest")]
    pub tree_digest: String,
}

/// The record of the package published at `dir`, if it has a readable one.
pub fn record(dir: &Path) -> Option<Record> {
    let mut path = dir.as_os_str().to_owned();
    path.push(".json");
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// The packages published under `home` (`packages/<id>`): each directory, with its record when it
/// has one.
fn published(home: &Path) -> Vec<(PathBuf, Option<Record>)> {
    let Ok(entries) = std::fs::read_dir(home) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()) && !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| {
            let dir = e.path();
            let r = record(&dir);
            (dir, r)
        })
        .collect()
}

impl Manifest {
    /// Parses a manifest from JSON, naming the first problem.
    pub fn parse(v: &serde_json::Value) -> Result<Manifest, InstallError> {
        let m: Manifest = serde_json::from_value(v.clone()).map_err(|e| InstallError::Manifest(e.to_string()))?;
        let id_ok = !m.id.is_empty()
            && m.id.len() <= 100
            && m.id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-_".contains(c))
            && !m.id.starts_with('.');
        if !id_ok {
            return Err(InstallError::Manifest("id must be 1-100 of a-z 0-9 . - _".into()));
        }
        let version_ok = !m.version.is_empty()
            && m.version.len() <= 64
            && m.version.chars().all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c))
            && !m.version.starts_with('.');
        if !version_ok {
            return Err(InstallError::Manifest("version must be 1-64 of A-Z a-z 0-9 . - +".into()));
        }
        if m.sha256.len() != 64 || !m.sha256.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) {
            return Err(InstallError::Manifest("sha256 must be 64 lowercase hex digits".into()));
        }
        if m.entrypoint.is_empty() || m.entrypoint.len() > 64 || m.entrypoint.iter().any(|a| a.len() > 4096) {
            return Err(InstallError::Manifest("entrypoint must be 1-64 arguments".into()));
        }
        Ok(m)
    }
}

/// Removes a directory tree when dropped, unless kept.
struct Staging(Option<PathBuf>);

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file())).unwrap_or(false)
}

/// The bytes of the workspace's file `artifact`, read as root without following a symlink at
/// any step: each directory is opened under the one before with `O_NOFOLLOW`, then the file,
/// which must be a regular file of at most `limit` bytes. Every failure (missing, a symlink, not
/// a regular file, no permission) gives one message, so the answer tells nothing of what lies
/// where a symlink points.
fn read_artifact(workspace: &Path, artifact: &str, limit: u64) -> Result<Vec<u8>, InstallError> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    use std::os::fd::OwnedFd;
    use std::os::unix::ffi::OsStrExt;
    let refused = || InstallError::Artifact(format!("{artifact} is not a readable regular file of the workspace"));
    let open_at = |dir: &OwnedFd, name: &str, flags: libc::c_int| -> Result<OwnedFd, InstallError> {
        let name = std::ffi::CString::new(name).map_err(|_| refused())?;
        use std::os::fd::AsRawFd;
        // SAFETY: a valid directory descriptor and a NUL-terminated name; the result is checked.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(refused());
        }
        // SAFETY: a descriptor just opened, owned from here on.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let root = std::ffi::CString::new(workspace.as_os_str().as_bytes()).map_err(|_| refused())?;
    // SAFETY: a NUL-terminated path; the result is checked. The workspace itself is the agent's
    // configuration, not the caller's.
    let fd = unsafe { libc::open(root.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(refused());
    }
    // SAFETY: as above.
    let mut dir = unsafe { OwnedFd::from_raw_fd(fd) };
    let parts: Vec<&str> = artifact.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    let Some((last, dirs)) = parts.split_last() else { return Err(refused()) };
    for d in dirs {
        dir = open_at(&dir, d, libc::O_RDONLY | libc::O_DIRECTORY)?;
    }
    let file = std::fs::File::from(open_at(&dir, last, libc::O_RDONLY | libc::O_NONBLOCK)?);
    let meta = file.metadata().map_err(|_| refused())?;
    if !meta.is_file() {
        return Err(refused());
    }
    if meta.len() > limit {
        return Err(Rejection::ArchiveTooLarge(limit).into());
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|_| refused())?;
    if bytes.len() as u64 > limit {
        return Err(Rejection::ArchiveTooLarge(limit).into());
    }
    Ok(bytes)
}

/// Installs the archive at `artifact` (relative to `workspace`) as `manifest` says, under
/// `runtime` (root-owned: `runtime/staging`, `runtime/packages`).
pub fn install(
    workspace: &Path,
    artifact: &str,
    manifest: &Manifest,
    runtime: &Path,
    limits: &Limits,
) -> Result<Installed, InstallError> {
    // 1. The artifact: a regular file of the workspace, at most the archive limit.
    if artifact.is_empty() || artifact.starts_with('/') || artifact.split('/').any(|p| p == "..") {
        return Err(InstallError::Artifact("must be a path inside the workspace, without '..'".into()));
    }
    let bytes = read_artifact(workspace, artifact, limits.archive_bytes)?;
    // 2. The digest, before anything is decompressed.
    if hex::encode(sha2::Sha256::digest(&bytes)) != manifest.sha256 {
        return Err(InstallError::DigestMismatch);
    }
    // 3. The entrypoint's interpreter, when it names one.
    let program = &manifest.entrypoint[0];
    let interpreter = INTERPRETERS.contains(&program.as_str());
    if interpreter && !on_path(program) {
        return Err(InstallError::MissingInterpreter(program.clone()));
    }
    if !interpreter && !program.starts_with("./") {
        return Err(InstallError::Manifest(format!(
            "entrypoint[0] must be one of {INTERPRETERS:?} or ./a-file-of-the-package"
        )));
    }
    // 4. Already there? A package is its id, version and full digest: the same three is a no-op
    //    (once its files are found to be what its record says); the same id and version with
    //    another digest is refused. Versions are compared whole, from the records (never a
    //    directory name's prefix, nor the name's 12 digits of the digest).
    let rt = |e: std::io::Error| InstallError::Runtime(e.to_string());
    let packages = runtime.join("packages");
    let home = packages.join(&manifest.id);
    let name = format!("{}-{}", manifest.version, &manifest.sha256[..12]);
    let dest = home.join(&name);
    let what = || format!("{} {}", manifest.id, manifest.version);
    for (dir, record) in published(&home) {
        let Some(record) = record else {
            // A directory without its record (never published so): its name says its version.
            let version = dir.file_name().and_then(|n| n.to_str()).and_then(|n| n.rsplit_once('-')).map(|(v, _)| v);
            if version == Some(manifest.version.as_str()) {
                return Err(InstallError::VersionExists(what()));
            }
            continue;
        };
        if record.manifest.id != manifest.id || record.manifest.version != manifest.version {
            continue;
        }
        if record.manifest.sha256 != manifest.sha256 {
            return Err(InstallError::VersionExists(what()));
        }
        let digest = super::bindings::tree_digest(&dir).map_err(rt)?;
        if digest != record.tree_digest {
            return Err(InstallError::PackageChanged(what()));
        }
        return Ok(Installed { dir, files: Vec::new(), bytes: 0, new: false, tree_digest: digest });
    }
    if dest.exists() {
        return Err(InstallError::VersionExists(what()));
    }
    let count = std::fs::read_dir(&packages)
        .map(|ids| {
            ids.flatten()
                .filter_map(|d| std::fs::read_dir(d.path()).ok())
                .map(|v| v.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).count())
                .sum::<usize>()
        })
        .unwrap_or(0);
    if count >= MAX_PACKAGES {
        return Err(InstallError::TooManyPackages);
    }
    // 5. Unpack into a fresh staging directory (removed on any refusal).
    let staging_root = runtime.join("staging");
    std::fs::create_dir_all(&staging_root).map_err(rt)?;
    let staging_dir = staging_root.join(format!("{}-{}", manifest.id, hex::encode(rand::random::<[u8; 8]>())));
    std::fs::create_dir(&staging_dir).map_err(rt)?;
    let mut staging = Staging(Some(staging_dir.clone()));
    let out = archive::extract(&bytes, &staging_dir, limits)?;
    // 6. A `./file` entrypoint must be a file of the package, or an interpreter's script one.
    let script = if interpreter { manifest.entrypoint.get(1).filter(|a| a.starts_with("./")) } else { Some(program) };
    if let Some(script) = script {
        let rel = script.trim_start_matches("./");
        if !out.files.iter().any(|f| f == rel) {
            return Err(InstallError::MissingEntrypoint(script.clone()));
        }
    }
    // 7. Publish: the package's record (manifest and tree digest, root-owned, beside it), then one
    //    rename, after which the package is complete.
    std::fs::create_dir_all(&home).map_err(rt)?;
    let digest = super::bindings::tree_digest(&staging_dir).map_err(rt)?;
    let record = serde_json::json!({"manifest": {
        "id": manifest.id, "version": manifest.version, "sha256": manifest.sha256,
        "entrypoint": manifest.entrypoint, "share_immutable_package": manifest.share_immutable_package,
    }, "treeDigest": digest});
    let record_path = home.join(format!("{name}.json"));
    let tmp = home.join(format!(".{name}.json.tmp"));
    std::fs::write(&tmp, record.to_string()).map_err(rt)?;
    std::fs::rename(&tmp, &record_path).map_err(rt)?;
    std::fs::rename(&staging_dir, &dest).map_err(rt)?;
    staging.0 = None;
    Ok(Installed { dir: dest, files: out.files, bytes: out.bytes, new: true, tree_digest: digest })
}
