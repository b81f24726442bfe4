//! Snapshot files beside the engine, and the engine's pointer to the current one.
//!
//! A snapshot file is `DIR/snapshot-<index:020>-<nanos:020>.snap`: one header line,
//! `CDSNAP1 sha256=<64 hex digits> len=<payload bytes>\n`, then the payload (the JSON of the state
//! machine's `SnapshotFile`). The checksum covers the payload. Followers receive the same bytes,
//! header included, and check them before they store them. A file without the header that
//! starts with `{` is a payload alone, as written before the header existed: it is read as it is
//! (there is nothing to check it against), and the next snapshot is written with a header.
//!
//! The engine's key `current_ref` (space `Snapshot`) names the current file and its meta. Storing
//! a snapshot ([`Snapshots::store`]) holds one lock from the check to the clean-up, so a build
//! (which openraft runs in a spawned task) and an install never interleave:
//! 1. a snapshot whose last log id is not past the current one's is dropped: nothing is written
//!    and the pointer stays (the pointer only moves forward);
//! 2. the file is written as `NAME.tmp` and fsynced, renamed to `NAME`, and the directory fsynced;
//! 3. the pointer is written and the engine flushed;
//! 4. only then are the other `snapshot-*` files removed, never the one the pointer names.
//!
//! A crash anywhere leaves the pointer on a complete file: the previous one up to step 3, the new
//! one after. Files left behind are removed at the next start, once the current one verified. A
//! current snapshot that does not verify stops the start ([`DamagedSnapshot`]); it is never
//! replaced by an older file, since the log behind it is purged.

use std::fs;
use std::io;
use std::io::Read;
use std::io::Write;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;

use serde::Deserialize;
use serde::Serialize;
use sha2::Digest;
use sha2::Sha256;

use super::invalid_data;
use crate::engine::BatchOp;
use crate::engine::KvEngine;
use crate::engine::Space;
use crate::typ::LogId;
use crate::typ::SnapshotMeta;

/// The engine key naming the current snapshot file and its meta. The snapshot itself is a file
/// beside the engine: bulk data never goes through the engine, whose flushes the log waits on.
const KEY_SNAPSHOT_REF: &[u8] = b"current_ref";
/// The first word of a snapshot file's header line.
const MAGIC: &str = "CDSNAP1";
/// The header line is at most this long.
const MAX_HEADER: usize = 128;
/// The names of snapshot files (and of their `.tmp` files while written).
const PREFIX: &str = "snapshot-";
/// A discarded snapshot is renamed with this prefix: kept for a post-mortem, out of every clean-up.
const DISCARDED_PREFIX: &str = "discarded-";

/// What the engine records of the current snapshot.
#[derive(Serialize, Deserialize)]
struct SnapshotRef {
    /// The file name in the snapshot directory.
    file: String,
    /// Its meta, so reading it does not decode the whole state.
    meta: SnapshotMeta,
}

/// The current snapshot cannot be used, so the store does not open: an older snapshot cannot
/// stand in for it, because the log entries between the two were purged.
#[derive(Debug, thiserror::Error)]
#[error(
    "snapshot file {}: {reason}; the log behind it is purged, so no older snapshot can replace it: restart \
     with --reinstall-snapshot and --join <a member> to rebuild this node's store on that member's snapshot",
    path.display()
)]
pub struct DamagedSnapshot {
    /// The file (or, when the engine's record of it is unreadable, the snapshot directory).
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// A [`DamagedSnapshot`] as an I/O error (what opening the store answers).
pub(super) fn damaged(path: &Path, reason: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, DamagedSnapshot { path: path.to_path_buf(), reason })
}

/// True when `e` is a [`DamagedSnapshot`].
pub fn is_damaged(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<DamagedSnapshot>())
}

/// A snapshot file's bytes (header and payload) for `payload`.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let header = format!("{MAGIC} sha256={} len={}\n", hex::encode(Sha256::digest(payload)), payload.len());
    let mut bytes = Vec::with_capacity(header.len() + payload.len());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// The payload of a snapshot file's bytes, checked against its header; the reason otherwise.
pub fn payload(bytes: &[u8]) -> Result<&[u8], String> {
    if bytes.first() == Some(&b'{') {
        return Ok(bytes); // Written before the header existed.
    }
    let Some(nl) = bytes.iter().take(MAX_HEADER).position(|b| *b == b'\n') else {
        return Err(format!("no checksum header (a first line `{MAGIC} sha256=… len=…`)"));
    };
    let header = String::from_utf8_lossy(&bytes[..nl]);
    let body = &bytes[nl + 1..];
    let mut words = header.split(' ');
    let (Some(MAGIC), Some(sum), Some(len), None) = (
        words.next(),
        words.next().and_then(|w| w.strip_prefix("sha256=")),
        words.next().and_then(|w| w.strip_prefix("len=")).and_then(|l| l.parse::<usize>().ok()),
        words.next(),
    ) else {
        return Err(format!("unreadable checksum header {header:?}"));
    };
    if body.len() != len {
        return Err(format!("checksum header says {len} payload bytes, the file holds {}", body.len()));
    }
    let actual = hex::encode(Sha256::digest(body));
    if actual != sum {
        return Err(format!("checksum mismatch: the header says sha256 {sum}, the payload has {actual}"));
    }
    Ok(body)
}

/// What [`Snapshots::store`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// The snapshot is the current one now.
    Current,
    /// The current snapshot is as new or newer; nothing was written, the pointer stayed.
    Stale {
        /// The current snapshot's last log id.
        current: Option<LogId>,
    },
}

/// The snapshot files of a store and the engine's pointer to the current one.
pub struct Snapshots {
    engine: Arc<dyn KvEngine>,
    dir: PathBuf,
    /// Held from the staleness check to the clean-up of a store, and while the current file is
    /// opened for reading, so no store interleaves with another and no file is removed between
    /// reading the pointer and opening what it names.
    lock: Mutex<()>,
}

impl Snapshots {
    /// The snapshots in `dir` (created if missing) pointed to by `engine`.
    pub fn new(engine: Arc<dyn KvEngine>, dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        Ok(Self { engine, dir: dir.to_path_buf(), lock: Mutex::new(()) })
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read_ref(&self) -> io::Result<Option<SnapshotRef>> {
        match self.engine.get(Space::Snapshot, KEY_SNAPSHOT_REF)? {
            Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                damaged(&self.dir, format!("the engine's record of the current snapshot is unreadable: {e}"))
            }),
            None => Ok(None),
        }
    }

    fn open_current(&self) -> io::Result<Option<(SnapshotRef, PathBuf, fs::File)>> {
        let Some(r) = self.read_ref()? else { return Ok(None) };
        let path = self.dir.join(&r.file);
        match fs::File::open(&path) {
            Ok(f) => Ok(Some((r, path, f))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(damaged(&path, "the file the store points to is missing".into()))
            }
            Err(e) => Err(io::Error::new(e.kind(), format!("snapshot file {}: {e}", path.display()))),
        }
    }

    /// The current snapshot's meta and bytes (header included), checked against the checksum.
    pub fn current(&self) -> io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
        // Opened under the lock; read after it (an open file outlives its removal).
        let Some((r, path, mut f)) = ({
            let _g = self.lock();
            self.open_current()?
        }) else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)
            .map_err(|e| io::Error::new(e.kind(), format!("snapshot file {}: {e}", path.display())))?;
        payload(&bytes).map_err(|why| damaged(&path, why))?;
        Ok(Some((r.meta, bytes)))
    }

    /// Reads and checks the current snapshot and hands its meta and payload to `decode`; a file
    /// that is missing, fails its checksum, or that `decode` refuses (its reason) is a
    /// [`DamagedSnapshot`]. Reads only: nothing on disk changes.
    pub fn load<T>(&self, decode: impl FnOnce(&SnapshotMeta, &[u8]) -> Result<T, String>) -> io::Result<Option<T>> {
        let _g = self.lock();
        let Some((r, path, mut f)) = self.open_current()? else { return Ok(None) };
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)
            .map_err(|e| io::Error::new(e.kind(), format!("snapshot file {}: {e}", path.display())))?;
        let payload = payload(&bytes).map_err(|why| damaged(&path, why))?;
        decode(&r.meta, payload).map(Some).map_err(|why| damaged(&path, why))
    }

    /// Removes every `snapshot-*` file but the current one (what a crash left behind): once the
    /// store opened, never while it may still refuse to.
    pub fn remove_leftovers(&self) -> io::Result<()> {
        let _g = self.lock();
        let current = self.read_ref()?.map(|r| r.file);
        self.remove_others(current.as_deref());
        Ok(())
    }

    /// The file the pointer names, if any (not read, not checked).
    pub fn current_path(&self) -> io::Result<Option<PathBuf>> {
        let _g = self.lock();
        Ok(self.read_ref()?.map(|r| self.dir.join(r.file)))
    }

    /// Stores `bytes` (a whole file: see [`encode`]) as the snapshot `meta`, durably, unless the
    /// current snapshot is as new (see the module doc for the steps).
    pub fn store(&self, meta: &SnapshotMeta, bytes: &[u8]) -> io::Result<Stored> {
        let _g = self.lock();
        if let Some(current) = self.read_ref()?
            && meta.last_log_id <= current.meta.last_log_id
        {
            return Ok(Stored::Stale { current: current.meta.last_log_id });
        }
        self.write_current(meta, bytes)?;
        Ok(Stored::Current)
    }

    /// Makes `bytes` the current snapshot `meta` whatever the pointer names (a reinstall, which
    /// replaces a damaged snapshot: see `reinstall`), with the steps of [`Snapshots::store`].
    pub(super) fn replace(&self, meta: &SnapshotMeta, bytes: &[u8]) -> io::Result<()> {
        let _g = self.lock();
        self.write_current(meta, bytes)
    }

    /// Writes the file, moves the pointer (flushed), then removes the other snapshot files.
    fn write_current(&self, meta: &SnapshotMeta, bytes: &[u8]) -> io::Result<()> {
        let index = meta.last_log_id.map(|l| l.index).unwrap_or(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let name = format!("{PREFIX}{index:020}-{nanos:020}.snap");
        let (tmp, path) = (self.dir.join(format!("{name}.tmp")), self.dir.join(&name));
        if let Err(e) = self.write_file(&tmp, &path, bytes) {
            // Not pointed to: safe to remove.
            let _ = fs::remove_file(&tmp);
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        // From here on the pointer may name either file, so neither is removed on an error.
        let r = serde_json::to_vec(&SnapshotRef { file: name.clone(), meta: meta.clone() }).map_err(invalid_data)?;
        self.engine.write_batch(Space::Snapshot, vec![BatchOp::Put(KEY_SNAPSHOT_REF.to_vec(), r)])?;
        self.engine.flush()?;
        self.remove_others(Some(&name));
        Ok(())
    }

    fn write_file(&self, tmp: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut f = fs::File::create(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(tmp, path)?;
        fs::File::open(&self.dir)?.sync_all()
    }

    /// Removes the `snapshot-*` files other than `keep`. Their removal need not be durable: one
    /// that comes back after a crash is removed at the next start.
    fn remove_others(&self, keep: Option<&str>) {
        let Ok(entries) = fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(PREFIX)
                && Some(name.as_ref()) != keep
                && let Err(e) = fs::remove_file(entry.path())
            {
                tracing::warn!(file = %entry.path().display(), error = %e, "cannot remove an old snapshot file");
            }
        }
    }

    /// Moves the current snapshot's file aside as `discarded-NAME` (kept for a post-mortem; a
    /// reinstall replaces it). The pointer stays: until it is moved, the store refuses to open,
    /// since the file it names is missing. Answers the file's new path, if there was a file.
    pub(super) fn discard_current(&self) -> io::Result<Option<PathBuf>> {
        let _g = self.lock();
        // The pointer's record may be what is damaged: then there is no file name to move.
        let file = match self.engine.get(Space::Snapshot, KEY_SNAPSHOT_REF)? {
            Some(b) => serde_json::from_slice::<SnapshotRef>(&b).ok().map(|r| r.file),
            None => None,
        };
        let Some(file) = file else { return Ok(None) };
        let to = self.dir.join(format!("{DISCARDED_PREFIX}{file}"));
        match fs::rename(self.dir.join(&file), &to) {
            Ok(()) => {
                fs::File::open(&self.dir)?.sync_all()?;
                Ok(Some(to))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload comes back out of its file bytes; legacy files (no header) are read as they are.
    #[test]
    fn encode_then_payload() {
        let bytes = encode(br#"{"a":1}"#);
        assert!(bytes.starts_with(b"CDSNAP1 sha256="));
        assert_eq!(payload(&bytes), Ok(&br#"{"a":1}"#[..]));
        assert_eq!(payload(br#"{"legacy":true}"#), Ok(&br#"{"legacy":true}"#[..]));
    }

    /// A flipped payload byte, a truncated file, and a missing header are all refused.
    #[test]
    fn damage_is_refused() {
        let mut bytes = encode(br#"{"a":1}"#);
        let last = bytes.len() - 2;
        bytes[last] ^= 0x01;
        assert!(payload(&bytes).expect_err("flipped").contains("checksum mismatch"));
        let bytes = encode(br#"{"a":1}"#);
        assert!(payload(&bytes[..bytes.len() - 1]).expect_err("truncated").contains("checksum header says 7"));
        assert!(payload(b"garbage").expect_err("no header").contains("no checksum header"));
        assert!(payload(b"CDSNAP1 md5=00 len=1\nx").expect_err("bad header").contains("unreadable checksum header"));
    }
}
