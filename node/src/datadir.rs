//! The node's data directory: who it belongs to, and the files it holds.
//!
//! ```text
//! DIR/node.json     {"format":1,"nodeId":N,"clusterId":"…"|null}  written first, checked on every start
//! DIR/store/        the Raft log and state machine (sled)
//! DIR/admin.token   the first owner token, mode 0600 (bootstrap node only)
//! DIR/join.token    the cluster's join secret, mode 0600 (bootstrap node only)
//! DIR/tls/          the cluster CA and this node's certificate (`computerd_raft::tls`)
//! ```
//! A directory that cannot be read, that holds something else, or that belongs to another
//! node or cluster stops the node with a clear message. It is never silently re-initialised.

use std::fs;
use std::io;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::path::PathBuf;

use serde::Deserialize;
use serde::Serialize;

const FORMAT: u32 = 1;
const NODE_FILE: &str = "node.json";

/// Why a data directory was refused.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// The directory or a file in it cannot be read or written.
    #[error("data dir {path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The directory holds files but no node file: it is not ours.
    #[error("data dir {0} is not empty and is not a computerd data dir; refusing to initialise it")]
    Foreign(PathBuf),
    /// The node file cannot be parsed.
    #[error("data dir {0}: node.json is corrupt or of an unknown format")]
    Corrupt(PathBuf),
    /// The directory belongs to another node id.
    #[error("data dir {path} belongs to node {found}, not node {wanted}")]
    OtherNode {
        /// The path.
        path: PathBuf,
        /// The id stored.
        found: u64,
        /// The id asked for.
        wanted: u64,
    },
}

/// The contents of `node.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFile {
    /// Layout version.
    pub format: u32,
    /// The node id this directory belongs to.
    pub node_id: u64,
    /// The cluster this node is part of, once known.
    pub cluster_id: Option<String>,
}

/// An opened, validated data directory.
#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
    /// What `node.json` says.
    pub node: NodeFile,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DataDirError + '_ {
    move |source| DataDirError::Io { path: path.to_path_buf(), source }
}

impl DataDir {
    /// Opens `root` for node `node_id`, creating it (mode 0700) when missing or empty.
    pub fn open(root: &Path, node_id: u64) -> Result<Self, DataDirError> {
        if !root.exists() {
            fs::create_dir_all(root).map_err(io_err(root))?;
            fs::set_permissions(root, fs::Permissions::from_mode(0o700)).map_err(io_err(root))?;
        }
        let file = root.join(NODE_FILE);
        let entries: Vec<_> =
            fs::read_dir(root).map_err(io_err(root))?.collect::<Result<_, _>>().map_err(io_err(root))?;
        let node = match fs::read(&file) {
            Ok(bytes) => {
                let node: NodeFile =
                    serde_json::from_slice(&bytes).map_err(|_| DataDirError::Corrupt(root.to_path_buf()))?;
                if node.format != FORMAT {
                    return Err(DataDirError::Corrupt(root.to_path_buf()));
                }
                if node.node_id != node_id {
                    return Err(DataDirError::OtherNode {
                        path: root.to_path_buf(),
                        found: node.node_id,
                        wanted: node_id,
                    });
                }
                node
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !entries.is_empty() {
                    return Err(DataDirError::Foreign(root.to_path_buf()));
                }
                let node = NodeFile { format: FORMAT, node_id, cluster_id: None };
                write_atomic(&file, &serde_json::to_vec_pretty(&node).map_err(|e| io_err(&file)(e.into()))?, 0o600)?;
                node
            }
            Err(e) => return Err(io_err(&file)(e)),
        };
        Ok(Self { root: root.to_path_buf(), node })
    }

    /// Where this node's blob store keeps blob bytes.
    pub fn blobs_dir(&self) -> PathBuf {
        self.root.join("blobs")
    }

    /// Where the Raft store lives.
    pub fn store_dir(&self) -> PathBuf {
        self.root.join("store")
    }

    /// Where the bootstrap owner token is written.
    pub fn admin_token_path(&self) -> PathBuf {
        self.root.join("admin.token")
    }

    /// Records the cluster id (once known) durably.
    pub fn set_cluster_id(&mut self, cluster_id: &str) -> Result<(), DataDirError> {
        self.node.cluster_id = Some(cluster_id.to_string());
        let file = self.root.join(NODE_FILE);
        let bytes = serde_json::to_vec_pretty(&self.node).map_err(|e| io_err(&file)(e.into()))?;
        write_atomic(&file, &bytes, 0o600)
    }

    /// Where the node's certificates are.
    pub fn tls_dir(&self) -> PathBuf {
        self.root.join("tls")
    }

    /// Where the cluster's join secret is written (bootstrap node).
    pub fn join_token_path(&self) -> PathBuf {
        self.root.join("join.token")
    }

    /// Writes the join secret with mode 0600.
    pub fn write_join_token(&self, secret: &str) -> Result<(), DataDirError> {
        write_atomic(&self.join_token_path(), format!("{secret}\n").as_bytes(), 0o600)
    }

    /// Writes the owner token secret with mode 0600 (never readable by others, even briefly).
    pub fn write_admin_token(&self, secret: &str) -> Result<(), DataDirError> {
        write_atomic(&self.admin_token_path(), format!("{secret}\n").as_bytes(), 0o600)
    }
}

/// Writes a secret (a line) to `path` with mode 0600, atomically.
pub fn write_secret_file(path: &Path, text: &str) -> Result<(), DataDirError> {
    write_atomic(path, format!("{text}\n").as_bytes(), 0o600)
}

/// Writes `path` through a temporary file, fsync and rename, created with `mode`.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), DataDirError> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(io_err(&tmp))?;
    f.write_all(bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    fs::rename(&tmp, path).map_err(io_err(path))?;
    if let Some(dir) = path.parent() {
        fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_dir_is_claimed_and_reopened() {
        let t = tempfile::tempdir().expect("tempdir");
        let root = t.path().join("d");
        let mut d = DataDir::open(&root, 3).expect("open");
        assert_eq!(d.node.cluster_id, None);
        d.set_cluster_id("c").expect("set");
        let again = DataDir::open(&root, 3).expect("reopen");
        assert_eq!(again.node.cluster_id.as_deref(), Some("c"));
        let mode = fs::metadata(root.join(NODE_FILE)).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn foreign_other_node_and_corrupt_dirs_are_refused() {
        let t = tempfile::tempdir().expect("tempdir");
        fs::write(t.path().join("something"), b"x").expect("write");
        assert!(matches!(DataDir::open(t.path(), 1), Err(DataDirError::Foreign(_))));

        let t2 = tempfile::tempdir().expect("tempdir");
        DataDir::open(t2.path(), 1).expect("open");
        assert!(matches!(DataDir::open(t2.path(), 2), Err(DataDirError::OtherNode { found: 1, wanted: 2, .. })));

        fs::write(t2.path().join(NODE_FILE), b"{not json").expect("write");
        assert!(matches!(DataDir::open(t2.path(), 1), Err(DataDirError::Corrupt(_))));
        // Nothing was re-initialised.
        assert_eq!(fs::read(t2.path().join(NODE_FILE)).expect("read"), b"{not json");
    }
}
