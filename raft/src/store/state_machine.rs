//! The state machine on the engine: the [`State`] lives in memory; snapshots of it are files
//! beside the engine (see [`super::snapshots`] for their format and the order of durable steps),
//! and the log is replayed on top of the latest one at start.

use std::io;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use futures::Stream;
use futures::TryStreamExt;
use openraft::EntryPayload;
use openraft::OptionalSend;
use openraft::RaftSnapshotBuilder;
use openraft::storage::EntryResponder;
use openraft::storage::RaftStateMachine;
use serde::Deserialize;
use serde::Serialize;

use super::invalid_data;
use super::snapshots;
use super::snapshots::Snapshots;
use super::snapshots::Stored;
use crate::TypeConfig;
use crate::engine::KvEngine;
use crate::sm::Response;
use crate::sm::State;
use crate::typ::LogId;
use crate::typ::Snapshot;
use crate::typ::SnapshotMeta;
use crate::typ::StoredMembership;

/// The format of a stored snapshot's payload; bump when [`SnapshotFile`] changes shape.
const SNAPSHOT_FORMAT: u32 = 1;

/// What the state machine holds besides the application state.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    state: State,
}

/// A snapshot's payload as stored and sent to followers (inside the checksummed file).
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    format: u32,
    meta: SnapshotMeta,
    /// The state machine as of `meta.last_log_id`.
    applied: Applied,
}

struct Shared {
    applied: RwLock<Applied>,
    /// The snapshot files and the engine's pointer to the current one.
    snapshots: Snapshots,
    /// How many snapshots this process built (observability and tests).
    snapshots_built: AtomicU64,
    /// The last applied index, for whoever waits on state changes (drivers, event streams).
    applied_tx: tokio::sync::watch::Sender<u64>,
}

/// The state machine handed to openraft. Clones share the state.
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<Shared>,
}

/// A read handle on the applied state for the rest of the node.
#[derive(Clone)]
pub struct StateReader {
    shared: Arc<Shared>,
}

impl StateReader {
    /// Runs `f` on the state as applied now (not necessarily current: see the cluster's
    /// linearizable read for that).
    pub fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        let guard = self.shared.applied.read().unwrap_or_else(|p| p.into_inner());
        f(&guard.state)
    }

    /// Runs `f` on the state as applied now and the index of the last entry applied to it (0
    /// before any).
    pub fn read_at<T>(&self, f: impl FnOnce(&State, u64) -> T) -> T {
        let guard = self.shared.applied.read().unwrap_or_else(|p| p.into_inner());
        f(&guard.state, guard.last_applied.map_or(0, |l| l.index))
    }

    /// A receiver that changes whenever the state machine applies something.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.applied_tx.subscribe()
    }
}

impl StateMachineStore {
    /// Loads the current snapshot, if any, from `dir`. A current snapshot that is missing, fails
    /// its checksum or does not decode stops the load with a
    /// [`DamagedSnapshot`](super::DamagedSnapshot) naming the file, and changes nothing on disk.
    pub fn load(engine: Arc<dyn KvEngine>, dir: &Path) -> io::Result<Self> {
        let snapshots = Snapshots::new(engine, dir)?;
        let applied = snapshots
            .load(|meta, payload| {
                let file = decode_payload(payload).map_err(|e| e.to_string())?;
                if file.meta.last_log_id != meta.last_log_id || file.applied.last_applied != meta.last_log_id {
                    return Err("its content does not match the engine's record of it".to_string());
                }
                Ok(file.applied)
            })?
            .unwrap_or_default();
        Ok(Self {
            shared: Arc::new(Shared {
                applied: RwLock::new(applied),
                snapshots,
                snapshots_built: AtomicU64::new(0),
                applied_tx: tokio::sync::watch::Sender::new(0),
            }),
        })
    }

    /// A read handle for the node.
    pub fn reader(&self) -> StateReader {
        StateReader { shared: self.shared.clone() }
    }

    /// The last log id applied (at open: the current snapshot's).
    pub(super) fn last_applied(&self) -> Option<LogId> {
        self.shared.applied.read().unwrap_or_else(|p| p.into_inner()).last_applied
    }

    /// Removes the snapshot files other than the current one (left by a crash).
    pub(super) fn remove_leftover_snapshots(&self) -> io::Result<()> {
        self.shared.snapshots.remove_leftovers()
    }

    /// The file of the current snapshot, as the engine names it (not read, not checked).
    pub fn current_snapshot_path(&self) -> io::Result<Option<PathBuf>> {
        self.shared.snapshots.current_path()
    }
}

/// The bytes a leader would send for an empty state applied up to `last` (for tests).
#[cfg(test)]
pub(super) fn snapshot_at(last: LogId) -> (SnapshotMeta, Vec<u8>) {
    let applied = Applied { last_applied: Some(last), ..Default::default() };
    let meta = SnapshotMeta { last_log_id: Some(last), last_membership: StoredMembership::default() };
    let file = SnapshotFile { format: SNAPSHOT_FORMAT, meta: meta.clone(), applied };
    (meta, snapshots::encode(&serde_json::to_vec(&file).expect("encode a snapshot")))
}

/// Checks a snapshot received for `meta` (its checksum, its decoding, its meta) and answers the
/// file to store: the received bytes under a header of their own (the same bytes when the sender
/// sent one).
pub(super) fn check_received(meta: &SnapshotMeta, snapshot: Vec<u8>) -> io::Result<Vec<u8>> {
    check_received_file(meta.last_log_id, snapshot).map(|(bytes, _)| bytes)
}

fn check_received_file(want: Option<LogId>, snapshot: Vec<u8>) -> io::Result<(Vec<u8>, SnapshotFile)> {
    let (file, legacy) = {
        let payload = snapshots::payload(&snapshot)
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, format!("received snapshot refused: {why}")))?;
        (decode_payload(payload)?, payload.len() == snapshot.len())
    };
    if file.applied.last_applied != want || file.meta.last_log_id != want {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "snapshot data does not match its meta"));
    }
    Ok((if legacy { snapshots::encode(&snapshot) } else { snapshot }, file))
}

fn decode_payload(bytes: &[u8]) -> io::Result<SnapshotFile> {
    let mut file: SnapshotFile = serde_json::from_slice(bytes).map_err(invalid_data)?;
    // (Derived indexes are rebuilt from the records: a snapshot may predate one.)
    file.applied.state.reindex_all();
    if file.format != SNAPSHOT_FORMAT {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown snapshot format {}", file.format)));
    }
    Ok(file)
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        // Only a clone happens under the lock; applies wait for nothing slower than that.
        // Serializing and storing run on a blocking thread.
        let applied = self.shared.applied.read().unwrap_or_else(|p| p.into_inner()).clone();
        self.shared.snapshots_built.fetch_add(1, Ordering::Relaxed);
        let meta = SnapshotMeta { last_log_id: applied.last_applied, last_membership: applied.last_membership.clone() };
        let this = self.clone();
        let file_meta = meta.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            let file = SnapshotFile { format: SNAPSHOT_FORMAT, meta: file_meta, applied };
            let bytes = snapshots::encode(&serde_json::to_vec(&file).map_err(invalid_data)?);
            if let Stored::Stale { current } = this.shared.snapshots.store(&file.meta, &bytes)? {
                // An install overtook this build: openraft ignores a built snapshot that is not
                // past its current one, so answering it is harmless; it is just not stored.
                tracing::info!(built = ?file.meta.last_log_id, ?current, "snapshot build dropped: not newer than the current snapshot");
            }
            Ok::<_, io::Error>(bytes)
        })
        .await
        .map_err(io::Error::other)??;
        Ok(Snapshot { meta, snapshot: bytes })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let a = self.shared.applied.read().unwrap_or_else(|p| p.into_inner());
        Ok((a.last_applied, a.last_membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let index = entry.log_id.index;
            let response = {
                let mut a = self.shared.applied.write().unwrap_or_else(|p| p.into_inner());
                a.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => Response::Ok,
                    EntryPayload::Normal(req) => a.state.apply_request(&req),
                    EntryPayload::Membership(mem) => {
                        a.last_membership = StoredMembership::new(Some(entry.log_id), mem);
                        Response::Ok
                    }
                }
            };
            if let Some(responder) = responder {
                responder.send(response);
            }
            self.shared.applied_tx.send_replace(index);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Vec<u8>) -> Result<(), io::Error> {
        let this = self.clone();
        let want = meta.last_log_id;
        // Check, decode and store on a blocking thread; the file is the received payload under a
        // header of its own (the same bytes when the leader sent one).
        let applied = tokio::task::spawn_blocking(move || {
            let (bytes, file) = check_received_file(want, snapshot)?;
            if let Stored::Stale { current } = this.shared.snapshots.store(&file.meta, &bytes)? {
                // openraft installs only past its committed log id, so this is not expected; the
                // pointer still never moves back. The state is replaced as openraft asks: the log
                // after `want` is applied on top of it, and a restart resumes from `current`.
                tracing::warn!(installed = ?want, ?current, "installed snapshot not newer than the current one: kept the current file");
            }
            Ok::<_, io::Error>(file.applied)
        })
        .await
        .map_err(io::Error::other)??;
        *self.shared.applied.write().unwrap_or_else(|p| p.into_inner()) = applied;
        self.shared.applied_tx.send_replace(meta.last_log_id.map(|l| l.index).unwrap_or(0));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let this = self.clone();
        let current =
            tokio::task::spawn_blocking(move || this.shared.snapshots.current()).await.map_err(io::Error::other)??;
        Ok(current.map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}
