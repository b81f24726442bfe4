//! Reinstalling a follower's snapshot from the leader (`computerd serve --reinstall-snapshot`).
//!
//! A damaged current snapshot cannot be mended here: the log behind it is purged, so neither an
//! older snapshot nor the log can rebuild the state. What openraft needs for the leader to send
//! its snapshot is a follower with nothing the snapshot covers: an empty state machine, no
//! snapshot, and a log with no entries, no purge mark and no committed id (with any of these
//! left, openraft's start-up would try to re-apply purged entries, or answer the leader's probes
//! with a log it no longer has). So a reinstall empties the store as a wiped node's would be,
//! but keeps the vote (a node must not vote twice in a term). In order:
//! 1. a mark in the engine (`reinstall_pending`, flushed), so that a crash at any later step
//!    finishes the clearing at the next start, with the flag or without;
//! 2. the log's entries, purge mark and committed id are removed (flushed);
//! 3. the snapshot file is renamed `discarded-NAME` and the pointer removed (flushed).
//!
//! While marked, the node must not take Raft RPCs: its leader saw it match up to some index and
//! takes an emptied log for a reverted one, which openraft refuses (it panics) unless told to
//! allow it once. So the node first asks the leader for that (as a wiped node does), then clears
//! the mark ([`Reinstall::finish`]), then accepts RPCs; the leader finds the entries it would send
//! purged, and sends its snapshot.

use std::io;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

use super::log_store;
use super::snapshots::Snapshots;
use crate::engine::BatchOp;
use crate::engine::KvEngine;
use crate::engine::Space;

/// The engine key (space `Meta`) marking a reinstall under way.
const KEY_REINSTALL: &[u8] = b"reinstall_pending";

/// A reinstall under way: the store is empty but for its vote, and waits for the leader's
/// snapshot. Until [`Reinstall::finish`] the node must accept no Raft RPC.
pub struct Reinstall {
    engine: Arc<dyn KvEngine>,
    /// Where the damaged snapshot was moved, when this start discarded one.
    pub discarded: Option<PathBuf>,
}

impl std::fmt::Debug for Reinstall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reinstall").field("discarded", &self.discarded).finish_non_exhaustive()
    }
}

impl Reinstall {
    /// The leader allows this node's log to revert: the store takes Raft RPCs again, the mark is
    /// removed (flushed).
    pub fn finish(self) -> io::Result<()> {
        self.engine.write_batch(Space::Meta, vec![BatchOp::Delete(KEY_REINSTALL.to_vec())])?;
        self.engine.flush()
    }
}

/// True when a reinstall was begun and not finished.
pub(super) fn pending(engine: &dyn KvEngine) -> io::Result<bool> {
    Ok(engine.get(Space::Meta, KEY_REINSTALL)?.is_some())
}

/// Marks the store, then empties its log and discards its snapshot (see the module doc); again
/// after a crash, since every step after the mark may be done twice.
pub(super) fn begin(engine: Arc<dyn KvEngine>, snapshot_dir: &Path) -> io::Result<Reinstall> {
    engine.write_batch(Space::Meta, vec![BatchOp::Put(KEY_REINSTALL.to_vec(), b"1".to_vec())])?;
    engine.flush()?;
    log_store::clear(engine.as_ref())?;
    let discarded = Snapshots::new(engine.clone(), snapshot_dir)?.discard()?;
    Ok(Reinstall { engine, discarded })
}
