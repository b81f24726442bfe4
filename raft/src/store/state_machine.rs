//! The state machine on the engine: the [`State`] lives in memory; snapshots of it are written
//! to the engine (flushed) and the log is replayed on top of the latest one at start.

use std::fs;
use std::io;
use std::io::Write;
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
use crate::TypeConfig;
use crate::engine::BatchOp;
use crate::engine::KvEngine;
use crate::engine::Space;
use crate::sm::Response;
use crate::sm::State;
use crate::typ::LogId;
use crate::typ::Snapshot;
use crate::typ::SnapshotMeta;
use crate::typ::StoredMembership;

/// The engine key naming the current snapshot file and its meta. The snapshot itself is a file
/// beside the engine: bulk data never goes through the engine, whose flushes the log waits on.
const KEY_SNAPSHOT_REF: &[u8] = b"current_ref";

/// What the engine records of the current snapshot.
#[derive(Serialize, Deserialize)]
struct SnapshotRef {
    /// The file name in the snapshot directory.
    file: String,
    /// Its meta, so reading it does not decode the whole state.
    meta: SnapshotMeta,
}
/// The format of a stored snapshot; bump when [`SnapshotFile`] changes shape.
const SNAPSHOT_FORMAT: u32 = 1;

/// What the state machine holds besides the application state.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    last_membership: StoredMembership,
    state: State,
}

/// A snapshot as stored in the engine and sent to followers.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    format: u32,
    meta: SnapshotMeta,
    /// The state machine as of `meta.last_log_id`.
    applied: Applied,
}

struct Shared {
    applied: RwLock<Applied>,
    engine: Arc<dyn KvEngine>,
    /// Where snapshot files live.
    dir: PathBuf,
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

    /// A receiver that changes whenever the state machine applies something.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.applied_tx.subscribe()
    }
}

impl StateMachineStore {
    /// Loads the latest stored snapshot, if any; snapshot files live in `dir`.
    pub fn load(engine: Arc<dyn KvEngine>, dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let mut applied = Applied::default();
        if let Some(r) = read_ref(engine.as_ref())? {
            let bytes = fs::read(dir.join(&r.file))
                .map_err(|e| io::Error::new(e.kind(), format!("snapshot file {}: {e}", r.file)))?;
            applied = decode_file(&bytes)?.applied;
        }
        Ok(Self {
            shared: Arc::new(Shared {
                applied: RwLock::new(applied),
                engine,
                dir: dir.to_path_buf(),
                snapshots_built: AtomicU64::new(0),
                applied_tx: tokio::sync::watch::Sender::new(0),
            }),
        })
    }

    /// A read handle for the node.
    pub fn reader(&self) -> StateReader {
        StateReader { shared: self.shared.clone() }
    }

    /// Stores a snapshot file durably; answers its bytes (what followers receive).
    fn store_file(&self, file: &SnapshotFile) -> io::Result<Vec<u8>> {
        let bytes = serde_json::to_vec(file).map_err(invalid_data)?;
        self.store_bytes(&file.meta, bytes)
    }

    /// Writes the file (fsync, rename, fsync dir), then points the engine at it (flushed), then
    /// removes older files. A crash at any point leaves the previous snapshot intact.
    fn store_bytes(&self, meta: &SnapshotMeta, bytes: Vec<u8>) -> io::Result<Vec<u8>> {
        let dir = &self.shared.dir;
        let index = meta.last_log_id.map(|l| l.index).unwrap_or(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let name = format!("snapshot-{index:020}-{nanos}.json");
        let tmp = dir.join(format!("{name}.tmp"));
        {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
        }
        fs::rename(&tmp, dir.join(&name))?;
        fs::File::open(dir)?.sync_all()?;
        let r = serde_json::to_vec(&SnapshotRef { file: name.clone(), meta: meta.clone() }).map_err(invalid_data)?;
        self.shared.engine.write_batch(Space::Snapshot, vec![BatchOp::Put(KEY_SNAPSHOT_REF.to_vec(), r)])?;
        self.shared.engine.flush()?;
        for entry in fs::read_dir(dir)?.flatten() {
            let n = entry.file_name();
            if n.to_string_lossy().starts_with("snapshot-") && n.to_string_lossy() != name.as_str() {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(bytes)
    }
}

fn read_ref(engine: &dyn KvEngine) -> io::Result<Option<SnapshotRef>> {
    match engine.get(Space::Snapshot, KEY_SNAPSHOT_REF)? {
        Some(b) => Ok(Some(serde_json::from_slice(&b).map_err(invalid_data)?)),
        None => Ok(None),
    }
}

fn decode_file(bytes: &[u8]) -> io::Result<SnapshotFile> {
    let file: SnapshotFile = serde_json::from_slice(bytes).map_err(invalid_data)?;
    if file.format != SNAPSHOT_FORMAT {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("unknown snapshot format {}", file.format)));
    }
    Ok(file)
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        // Only a clone happens under the lock; applies wait for nothing slower than that.
        // Serializing and flushing run on a blocking thread.
        let applied = self.shared.applied.read().unwrap_or_else(|p| p.into_inner()).clone();
        self.shared.snapshots_built.fetch_add(1, Ordering::Relaxed);
        let meta = SnapshotMeta { last_log_id: applied.last_applied, last_membership: applied.last_membership.clone() };
        let this = self.clone();
        let file_meta = meta.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            this.store_file(&SnapshotFile { format: SNAPSHOT_FORMAT, meta: file_meta, applied })
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
                    EntryPayload::Normal(req) => a.state.apply(req.command()),
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
        // Decode and store on a blocking thread; the bytes are stored as received (same format).
        let applied = tokio::task::spawn_blocking(move || {
            let file = decode_file(&snapshot)?;
            if file.applied.last_applied != want || file.meta.last_log_id != want {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "snapshot data does not match its meta"));
            }
            this.store_bytes(&file.meta, snapshot)?;
            Ok::<_, io::Error>(file.applied)
        })
        .await
        .map_err(io::Error::other)??;
        *self.shared.applied.write().unwrap_or_else(|p| p.into_inner()) = applied;
        self.shared.applied_tx.send_replace(meta.last_log_id.map(|l| l.index).unwrap_or(0));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let Some(r) = read_ref(self.shared.engine.as_ref())? else { return Ok(None) };
        let path = self.shared.dir.join(&r.file);
        let bytes = tokio::task::spawn_blocking(move || fs::read(path)).await.map_err(io::Error::other)??;
        Ok(Some(Snapshot { meta: r.meta, snapshot: bytes }))
    }
}
