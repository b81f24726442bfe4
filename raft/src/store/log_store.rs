//! The Raft log on the engine: entries keyed by big-endian index, the vote and purge marks in
//! the meta space.
//!
//! Durability: `save_vote` flushes before it returns. `append` writes, then hands the flush
//! callback to one flusher thread that flushes once for every callback waiting (group commit)
//! and only then tells openraft the entries are durable, in order.

use std::fmt::Debug;
use std::io;
use std::ops::Bound;
use std::ops::RangeBounds;
use std::sync::Arc;
use std::sync::mpsc;

use openraft::LogState;
use openraft::OptionalSend;
use openraft::RaftLogReader;
use openraft::entry::RaftEntry;
use openraft::storage::IOFlushed;
use openraft::storage::RaftLogStorage;

use super::invalid_data;
use crate::TypeConfig;
use crate::engine::BatchOp;
use crate::engine::KvEngine;
use crate::engine::Space;
use crate::typ::Entry;
use crate::typ::LogId;
use crate::typ::Vote;

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_PURGED: &[u8] = b"last_purged";

/// The log storage of one node. Cheap to clone: clones share the engine and the flusher.
#[derive(Clone)]
pub struct LogStore {
    engine: Arc<dyn KvEngine>,
    flusher: mpsc::Sender<IOFlushed<TypeConfig>>,
    /// Deletes purged entries in the background, in small batches: a snapshot purges ~100,000
    /// entries at once, and one big delete would stall the appends and flushes behind it.
    purger: mpsc::Sender<u64>,
    /// The first index not purged (reads below it answer nothing, deleted or not yet).
    first_kept: Arc<std::sync::atomic::AtomicU64>,
}

impl LogStore {
    /// Creates the log store and starts its flusher thread (it ends when the last clone drops).
    pub fn new(engine: Arc<dyn KvEngine>) -> Self {
        let (tx, rx) = mpsc::channel::<IOFlushed<TypeConfig>>();
        let e = engine.clone();
        std::thread::Builder::new()
            .name("raft-log-flush".into())
            .spawn(move || flusher(e, rx))
            .expect("spawn the log flusher thread");
        let (ptx, prx) = mpsc::channel::<u64>();
        let e = engine.clone();
        std::thread::Builder::new()
            .name("raft-log-purge".into())
            .spawn(move || purger(e, prx))
            .expect("spawn the log purger thread");
        let first_kept = engine
            .get(Space::Meta, KEY_PURGED)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice::<LogId>(&b).ok())
            .map_or(0, |l| l.index() + 1);
        Self { engine, flusher: tx, purger: ptx, first_kept: Arc::new(first_kept.into()) }
    }

    fn get_json<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> io::Result<Option<T>> {
        match self.engine.get(Space::Meta, key)? {
            Some(bytes) => Ok(Some(serde_json::from_slice(&bytes).map_err(invalid_data)?)),
            None => Ok(None),
        }
    }

    fn put_json<T: serde::Serialize>(&self, key: &[u8], value: &T) -> io::Result<()> {
        let bytes = serde_json::to_vec(value).map_err(invalid_data)?;
        self.engine.write_batch(Space::Meta, vec![BatchOp::Put(key.to_vec(), bytes)])
    }
}

/// The last purged log id recorded in `engine`.
pub(super) fn last_purged(engine: &dyn KvEngine) -> io::Result<Option<LogId>> {
    match engine.get(Space::Meta, KEY_PURGED)? {
        Some(bytes) => Ok(Some(serde_json::from_slice(&bytes).map_err(invalid_data)?)),
        None => Ok(None),
    }
}

/// Makes the log start after `snap`, the last log id of a snapshot the store is rebuilt on
/// (before any [`LogStore`] is made on `engine`; see `reinstall`): when the entry at its index is
/// not `snap` (an uncommitted entry a later leader replaced), it and every entry after it go; the
/// purge mark moves up to `snap` (never down) and the entries up to it go. The vote stays, and
/// so does the committed id unless it lay in a dropped tail (Raft never replaces a committed
/// entry, so that would be a committed id recorded wrongly): then it becomes `snap`. Flushed.
pub(super) fn rebase_on(engine: &dyn KvEngine, snap: LogId) -> io::Result<()> {
    if let Some(bytes) = engine.get(Space::Log, &index_key(snap.index()))? {
        let entry: Entry = serde_json::from_slice(&bytes).map_err(invalid_data)?;
        if entry.log_id() != snap {
            engine.remove_range(Space::Log, &index_key(snap.index()), &index_key(u64::MAX))?;
            let committed: Option<LogId> = match engine.get(Space::Meta, KEY_COMMITTED)? {
                Some(b) => serde_json::from_slice(&b).map_err(invalid_data)?,
                None => None,
            };
            if committed.is_some_and(|c| c.index() >= snap.index()) {
                let bytes = serde_json::to_vec(&Some(snap)).map_err(invalid_data)?;
                engine.write_batch(Space::Meta, vec![BatchOp::Put(KEY_COMMITTED.to_vec(), bytes)])?;
            }
        }
    }
    if last_purged(engine)?.is_none_or(|p| p < snap) {
        let bytes = serde_json::to_vec(&snap).map_err(invalid_data)?;
        engine.write_batch(Space::Meta, vec![BatchOp::Put(KEY_PURGED.to_vec(), bytes)])?;
    }
    engine.flush()?;
    engine.remove_range(Space::Log, &index_key(0), &index_key(snap.index().saturating_add(1)))?;
    engine.flush()
}

/// Flushes once for all callbacks waiting, then completes them in arrival order.
fn flusher(engine: Arc<dyn KvEngine>, rx: mpsc::Receiver<IOFlushed<TypeConfig>>) {
    while let Ok(first) = rx.recv() {
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        let res = engine.flush();
        for cb in waiting {
            cb.io_completed(match &res {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            });
        }
    }
}

/// Deletes entries up to the newest purge mark, a few thousand at a time. The deletes become
/// durable with the next flush of appends; a crash before that leaves entries below the mark,
/// which are never read and are deleted by the next purge.
fn purger(engine: Arc<dyn KvEngine>, rx: mpsc::Receiver<u64>) {
    const BATCH: u64 = 4096;
    while let Ok(first) = rx.recv() {
        let upto = rx.try_iter().fold(first, u64::max);
        loop {
            let next = match engine.scan(Space::Log, &index_key(0), &index_key(upto.saturating_add(1)), 1) {
                Ok(rows) => rows.first().and_then(|(k, _)| k.as_slice().try_into().ok()).map(u64::from_be_bytes),
                Err(e) => {
                    tracing::warn!(error = %e, "log purge scan failed");
                    None
                }
            };
            let Some(start) = next else { break };
            let end = start.saturating_add(BATCH).min(upto.saturating_add(1));
            if let Err(e) = engine.remove_range(Space::Log, &index_key(start), &index_key(end)) {
                tracing::warn!(error = %e, "log purge failed");
                break;
            }
        }
    }
}

fn index_key(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(x) => x.saturating_add(1),
            Bound::Excluded(x) => *x,
            Bound::Unbounded => u64::MAX,
        };
        let start = start.max(self.first_kept.load(std::sync::atomic::Ordering::SeqCst));
        if start >= end {
            return Ok(Vec::new());
        }
        let rows = self.engine.scan(Space::Log, &index_key(start), &index_key(end), usize::MAX)?;
        rows.into_iter().map(|(_, v)| serde_json::from_slice::<Entry>(&v).map_err(invalid_data)).collect()
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.get_json(KEY_VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged_log_id: Option<LogId> = self.get_json(KEY_PURGED)?;
        let last = match self.engine.last(Space::Log)? {
            Some((_, v)) => Some(serde_json::from_slice::<Entry>(&v).map_err(invalid_data)?.log_id()),
            None => None,
        };
        // Entries below the purge mark may not be deleted yet: the mark wins over them.
        let last_log_id = match (last, last_purged_log_id) {
            (Some(l), Some(p)) => Some(if l.index() > p.index() { l } else { p }),
            (l, p) => l.or(p),
        };
        Ok(LogState { last_log_id, last_purged_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.put_json(KEY_VOTE, vote)?;
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || engine.flush()).await.map_err(io::Error::other)?
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Not flushed on purpose: it only speeds up recovery; openraft tolerates an older value.
        self.put_json(KEY_COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.get_json::<Option<LogId>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut ops = Vec::new();
        for entry in entries {
            let bytes = serde_json::to_vec(&entry).map_err(invalid_data)?;
            ops.push(BatchOp::Put(index_key(entry.index()).to_vec(), bytes));
        }
        self.engine.write_batch(Space::Log, ops)?;
        self.flusher.send(callback).map_err(|_| io::Error::other("the log flusher has stopped"))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map(|l| l.index() + 1).unwrap_or(0);
        self.engine.remove_range(Space::Log, &index_key(from), &index_key(u64::MAX))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        // The mark first: entries below it are never read again, so deleting them can wait.
        self.put_json(KEY_PURGED, &log_id)?;
        self.first_kept.fetch_max(log_id.index() + 1, std::sync::atomic::Ordering::SeqCst);
        self.purger.send(log_id.index()).map_err(|_| io::Error::other("the log purger has stopped"))
    }
}
