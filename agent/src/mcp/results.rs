//! Kept answers of tool calls (`RUNTIME/results/`, root's or the agent's alone, 0700).
//!
//! The store journals a tool call's state and its answer's SHA-256 and size; the answer's
//! bytes stay here, under the call's journal name (64 hex digits, chosen by the node), so
//! they outlive any node and never enter the replicated log. A replay of the call reads them
//! back ([`ResultStore::get`]) and the node checks them against the journal's digest.
//!
//! Bounded: an answer past [`ResultLimits::max_bytes_each`] is not kept; at most
//! [`ResultLimits::max_files`] answers and [`ResultLimits::max_bytes`] bytes in all, the oldest
//! evicted first; and none older than [`ResultLimits::retention`]. A replay of an answer that
//! is gone is answered `result_expired`: the call is never run again.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;
use std::time::SystemTime;

/// The bounds of the kept answers.
#[derive(Debug, Clone, Copy)]
pub struct ResultLimits {
    /// How long an answer is kept.
    pub retention: Duration,
    /// The largest answer kept.
    pub max_bytes_each: u64,
    /// All kept answers together.
    pub max_bytes: u64,
    /// How many answers are kept.
    pub max_files: usize,
}

impl Default for ResultLimits {
    fn default() -> Self {
        ResultLimits {
            retention: Duration::from_secs(7 * 24 * 3600),
            max_bytes_each: 8 << 20,
            max_bytes: 256 << 20,
            max_files: 10_000,
        }
    }
}

/// The kept answers under one directory.
#[derive(Debug, Clone)]
pub struct ResultStore {
    dir: PathBuf,
    limits: ResultLimits,
}

/// True for a journal name: 64 lowercase hex digits.
pub fn is_name(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl ResultStore {
    /// The store in `dir` (made 0700 when first written).
    pub fn new(dir: PathBuf, limits: ResultLimits) -> Self {
        ResultStore { dir, limits }
    }

    /// Keeps `bytes` as the answer named `name` (a name seen before keeps its first answer),
    /// then evicts what is past the bounds. Errors say why it was not kept.
    pub fn put(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let invalid = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, m.to_string());
        if !is_name(name) {
            return Err(invalid("a result name is 64 hex digits"));
        }
        if bytes.len() as u64 > self.limits.max_bytes_each {
            return Err(invalid("the answer is over the size of a kept result"));
        }
        std::fs::create_dir_all(&self.dir)?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))?;
        let path = self.dir.join(name);
        if path.exists() {
            return Ok(());
        }
        let tmp = self.dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, bytes)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        self.evict();
        Ok(())
    }

    /// The answer named `name`, unless it is gone (expired, evicted, never kept).
    pub fn get(&self, name: &str) -> Option<Vec<u8>> {
        if !is_name(name) {
            return None;
        }
        let path = self.dir.join(name);
        let age = std::fs::metadata(&path).ok()?.modified().ok()?.elapsed().unwrap_or_default();
        if age >= self.limits.retention {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        std::fs::read(path).ok()
    }

    /// Removes answers past the retention, then the oldest until the count and size fit.
    fn evict(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let now = SystemTime::now();
        let mut kept: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            let at = meta.modified().unwrap_or(now);
            let name = e.file_name();
            let name = name.to_string_lossy();
            if !is_name(&name) {
                continue; // a write in progress, or not ours
            }
            if now.duration_since(at).unwrap_or_default() >= self.limits.retention {
                let _ = std::fs::remove_file(e.path());
            } else {
                kept.push((at, meta.len(), e.path()));
            }
        }
        kept.sort();
        let mut total: u64 = kept.iter().map(|(_, n, _)| n).sum();
        let mut count = kept.len();
        for (_, n, path) in kept {
            if count <= self.limits.max_files && total <= self.limits.max_bytes {
                break;
            }
            if std::fs::remove_file(path).is_ok() {
                count -= 1;
                total -= n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: u8) -> String {
        format!("{n:064x}")
    }

    #[test]
    fn answers_are_kept_once_bounded_and_expire() {
        let dir = tempfile::tempdir().expect("dir");
        let limits =
            ResultLimits { retention: Duration::from_secs(3600), max_bytes_each: 10, max_bytes: 25, max_files: 3 };
        let store = ResultStore::new(dir.path().join("results"), limits);
        store.put(&name(1), b"first").expect("put");
        store.put(&name(1), b"second").expect("a name keeps its first answer");
        assert_eq!(store.get(&name(1)).as_deref(), Some(&b"first"[..]));
        assert!(store.put(&name(2), b"eleven byte").is_err(), "over the size of one");
        assert!(store.get(&name(2)).is_none());
        assert!(store.put("../../etc/passwd", b"x").is_err() && store.get("../x").is_none(), "names only");
        // Count: the oldest goes first.
        for n in 3..=5 {
            store.put(&name(n), b"0123456789").expect("put");
        }
        assert!(store.get(&name(1)).is_none(), "the oldest was evicted");
        let mode = std::fs::metadata(dir.path().join("results")).expect("dir").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Size: three of ten bytes are over 25.
        let left = (3..=5).filter(|n| store.get(&name(*n)).is_some()).count();
        assert_eq!(left, 2, "the total size is bounded");
        // Retention.
        let gone = ResultStore::new(dir.path().join("results"), ResultLimits { retention: Duration::ZERO, ..limits });
        assert!(gone.get(&name(5)).is_none(), "past the retention an answer is gone");
    }
}
