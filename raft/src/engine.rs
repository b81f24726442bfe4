//! The small storage interface the Raft log and state machine stand on.
//!
//! Callers (the log store and the state-machine store) only speak [`KvEngine`]; the engine under
//! it (sled today) can be swapped for another ordered key-value store without touching them.
//! Every method is blocking and may be called from any thread.

use std::io;
use std::path::Path;

/// A key space inside the engine, one per kind of data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// Small named values: the vote, the committed and purged log ids.
    Meta,
    /// Raft log entries keyed by big-endian index.
    Log,
    /// The latest state-machine snapshot.
    Snapshot,
}

/// One change inside an atomic batch.
#[derive(Debug, Clone)]
pub enum BatchOp {
    /// Set `key` to `value`.
    Put(Vec<u8>, Vec<u8>),
    /// Remove `key` (no error when absent).
    Delete(Vec<u8>),
}

/// An ordered key-value engine with durable flush.
///
/// Contract: writes are visible to reads at once; they are durable only after [`KvEngine::flush`]
/// returns, and a flush makes every write that returned before it durable, in order.
pub trait KvEngine: Send + Sync + 'static {
    /// Reads one key.
    fn get(&self, space: Space, key: &[u8]) -> io::Result<Option<Vec<u8>>>;
    /// Applies `ops` atomically: after a crash either all or none are present.
    fn write_batch(&self, space: Space, ops: Vec<BatchOp>) -> io::Result<()>;
    /// Removes every key in `[from, to)`.
    fn remove_range(&self, space: Space, from: &[u8], to: &[u8]) -> io::Result<()>;
    /// Reads up to `limit` pairs with keys in `[from, to)`, in key order.
    fn scan(&self, space: Space, from: &[u8], to: &[u8], limit: usize) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>>;
    /// The pair with the greatest key, if any.
    fn last(&self, space: Space) -> io::Result<Option<(Vec<u8>, Vec<u8>)>>;
    /// Makes every write so far durable (fsync).
    fn flush(&self) -> io::Result<()>;
}

/// [`KvEngine`] on sled: one tree per [`Space`].
pub struct SledEngine {
    db: sled::Db,
    meta: sled::Tree,
    log: sled::Tree,
    snapshot: sled::Tree,
}

impl SledEngine {
    /// Opens (or creates) the engine in `dir`.
    pub fn open(dir: &Path) -> io::Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            .mode(sled::Mode::HighThroughput)
            // We flush explicitly where durability is required; no background flusher needed.
            .flush_every_ms(None)
            .open()
            .map_err(sled_err)?;
        Ok(Self {
            meta: db.open_tree("meta").map_err(sled_err)?,
            log: db.open_tree("log").map_err(sled_err)?,
            snapshot: db.open_tree("snapshot").map_err(sled_err)?,
            db,
        })
    }

    fn tree(&self, space: Space) -> &sled::Tree {
        match space {
            Space::Meta => &self.meta,
            Space::Log => &self.log,
            Space::Snapshot => &self.snapshot,
        }
    }
}

fn sled_err(e: sled::Error) -> io::Error {
    match e {
        sled::Error::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

impl KvEngine for SledEngine {
    fn get(&self, space: Space, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        Ok(self.tree(space).get(key).map_err(sled_err)?.map(|v| v.to_vec()))
    }

    fn write_batch(&self, space: Space, ops: Vec<BatchOp>) -> io::Result<()> {
        let mut batch = sled::Batch::default();
        for op in ops {
            match op {
                BatchOp::Put(k, v) => batch.insert(k, v),
                BatchOp::Delete(k) => batch.remove(k),
            }
        }
        self.tree(space).apply_batch(batch).map_err(sled_err)
    }

    fn remove_range(&self, space: Space, from: &[u8], to: &[u8]) -> io::Result<()> {
        let tree = self.tree(space);
        let mut batch = sled::Batch::default();
        for item in tree.range(from..to) {
            let (k, _) = item.map_err(sled_err)?;
            batch.remove(k);
        }
        tree.apply_batch(batch).map_err(sled_err)
    }

    fn scan(&self, space: Space, from: &[u8], to: &[u8], limit: usize) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        for item in self.tree(space).range(from..to).take(limit) {
            let (k, v) = item.map_err(sled_err)?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    fn last(&self, space: Space) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        Ok(self.tree(space).last().map_err(sled_err)?.map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    fn flush(&self) -> io::Result<()> {
        self.db.flush().map_err(sled_err).map(|_| ())
    }
}

/// Opens the engine in `dir`, waiting up to 30 s for its lock. sled lets go of its file lock
/// shortly after the last handle is dropped (a background thread finishes with it), so a test that
/// reopens in the same process waits for the lock to be free. A node reopens only in a new process.
#[cfg(test)]
pub(crate) fn open_when_free(dir: &Path) -> SledEngine {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match SledEngine::open(dir) {
            Ok(e) => return e,
            Err(e) if e.to_string().contains("could not acquire lock") && std::time::Instant::now() < deadline => {
                std::thread::yield_now();
            }
            Err(e) => panic!("open the engine: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_scan_range_and_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let e = SledEngine::open(dir.path()).expect("open");
            let ops = (0u64..10).map(|i| BatchOp::Put(i.to_be_bytes().to_vec(), vec![i as u8])).collect();
            e.write_batch(Space::Log, ops).expect("batch");
            e.remove_range(Space::Log, &3u64.to_be_bytes(), &5u64.to_be_bytes()).expect("range");
            e.flush().expect("flush");
        }
        let e = open_when_free(dir.path());
        let all = e.scan(Space::Log, &0u64.to_be_bytes(), &u64::MAX.to_be_bytes(), 100).expect("scan");
        let keys: Vec<u8> = all.iter().map(|(_, v)| v[0]).collect();
        assert_eq!(keys, vec![0, 1, 2, 5, 6, 7, 8, 9]);
        assert_eq!(e.last(Space::Log).expect("last").map(|(_, v)| v), Some(vec![9]));
        assert_eq!(e.get(Space::Meta, b"nothing").expect("get"), None);
    }
}
