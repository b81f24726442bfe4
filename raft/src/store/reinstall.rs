//! Rebuilding a store whose current snapshot is damaged on a member's snapshot
//! (`computerd serve --reinstall-snapshot`), before Raft starts.
//!
//! A damaged current snapshot cannot be mended from this node alone: the log behind it is purged,
//! so neither an older snapshot nor the log can rebuild the state. A member's snapshot can, when
//! it reaches the purged log: with its last log id `S` at or past the purge mark `P`, the state
//! at `S` plus this node's own log after `S` is the state this node had. So the store moves
//! *forward* to `S`, as if it had installed that snapshot from the leader:
//! - the vote stays, and so does every log entry after `S` (when the entry at `S`'s index is not
//!   `S`, it was an uncommitted entry a later leader replaced: it and every entry after it go,
//!   as a follower's truncation would do);
//! - the purge mark moves up to `S`, never down; entries up to it go.
//!
//! Nothing the node acknowledged to a leader is lost: a log id up to `S` is covered by the
//! snapshot (a committed state), one after it is still in the log. That is what openraft needs:
//! its leader sees a follower that matches at least where it did, so it needs no permission to
//! let the follower's log revert (a reverting follower races openraft's replication streams).
//!
//! The durable steps, in order, each leaving a store that either refuses to open (and is
//! reinstalled again) or opens healthy:
//! 1. the damaged file is renamed `discarded-NAME` (kept for a post-mortem); the pointer stays,
//!    so a crash here leaves a store that refuses (the file it names is missing);
//! 2. the log is rebased on `S` (flushed);
//! 3. the member's snapshot is written and the pointer moved to it (flushed), then the other
//!    `snapshot-*` files removed.

use std::io;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

use super::log_store;
use super::snapshots::Snapshots;
use super::state_machine;
use crate::engine::KvEngine;
use crate::typ::SnapshotMeta;

/// The index a member's snapshot must reach to rebuild this store on: the end of its purged log.
pub(super) fn min_index(engine: &dyn KvEngine) -> io::Result<u64> {
    Ok(log_store::last_purged(engine)?.map_or(0, |l| l.index))
}

/// Rebuilds the store on the member's snapshot `meta` and `bytes` (see the module doc), which
/// must reach `min_index`. Answers where the damaged file was moved, if there was one.
pub(super) fn install(
    engine: &Arc<dyn KvEngine>,
    snapshot_dir: &Path,
    meta: &SnapshotMeta,
    bytes: Vec<u8>,
    min_index: u64,
) -> io::Result<Option<PathBuf>> {
    let bytes = state_machine::check_received(meta, bytes)?;
    let Some(last) = meta.last_log_id else {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the member's snapshot is empty (no last log id)"));
    };
    if last.index < min_index {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the member's snapshot ends at {last}, before this node's purged log (index {min_index})"),
        ));
    }
    let snapshots = Snapshots::new(engine.clone(), snapshot_dir)?;
    let discarded = snapshots.discard_current()?;
    log_store::rebase_on(engine.as_ref(), last)?;
    snapshots.replace(meta, &bytes)?;
    Ok(discarded)
}
