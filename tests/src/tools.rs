//! MCP tool packages for tests: the stdlib-only Python MCP server of
//! `agent/tests/fixtures/mcp_fixture_server.py`, packed as tar.gz into a Computer's workspace.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use serde_json::json;
use sha2::Digest;

/// A packed fixture server in a workspace.
pub struct Package {
    /// The archive, relative to the workspace.
    pub artifact: String,
    /// Its SHA-256, hex.
    pub digest: String,
}

/// Packs `server.py` (the fixture, or `source` when given) from a fresh folder `dir` into
/// `workspace/uploads/<name>`, the usual way: `tar -C dir -czf <archive> .` (so the archive
/// starts with the `./` root entry).
pub fn pack(dir: &Path, workspace: &Path, name: &str, source: Option<&str>) -> Package {
    std::fs::create_dir_all(dir).expect("package dir");
    std::fs::create_dir_all(workspace.join("uploads")).expect("workspace");
    match source {
        Some(text) => std::fs::write(dir.join("server.py"), text).expect("server"),
        None => {
            std::fs::copy(fixture(), dir.join("server.py")).expect("fixture");
        }
    }
    let archive = workspace.join("uploads").join(name);
    let out = Command::new("tar").arg("-C").arg(dir).arg("-czf").arg(&archive).arg(".").output().expect("tar");
    assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
    let digest = hex::encode(sha2::Sha256::digest(std::fs::read(&archive).expect("archive")));
    Package { artifact: format!("uploads/{name}"), digest }
}

/// The fixture server's source.
pub fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/fixtures/mcp_fixture_server.py")
}

/// The manifest of the fixture package at `version` with `digest`.
pub fn manifest(version: &str, digest: &str) -> Value {
    json!({"id": "example.mcp.server", "version": version, "sha256": digest,
           "entrypoint": ["python3", "./server.py"], "share_immutable_package": true})
}
