//! openraft's storage traits implemented on a [`KvEngine`](crate::engine::KvEngine).

mod log_store;
mod reinstall;
mod snapshots;
mod state_machine;

pub use log_store::LogStore;
pub use snapshots::DamagedSnapshot;
pub use snapshots::is_damaged;
pub use state_machine::StateMachineStore;
pub use state_machine::StateReader;

use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::engine::KvEngine;
use crate::engine::SledEngine;
use crate::typ::SnapshotMeta;

/// Opens the log store and state machine of a node from its engine directory. A current
/// snapshot that does not verify, or that ends before the purged log, refuses the open with a
/// [`DamagedSnapshot`] naming the file and the reason, and changes nothing on disk.
pub fn open(dir: &Path) -> io::Result<(LogStore, StateMachineStore)> {
    let engine: Arc<dyn KvEngine> = Arc::new(SledEngine::open(&dir.join("engine"))?);
    open_on(engine, &dir.join("snapshots"))
}

/// Like [`open`], but a damaged current snapshot is replaced by a member's (see `reinstall`):
/// `fetch` is asked for a snapshot reaching the given index (the end of the purged log) and the
/// store is rebuilt on it before it opens. A healthy store opens as it is, and `fetch` is not
/// called.
pub async fn open_or_reinstall<F, Fut>(dir: &Path, fetch: F) -> io::Result<(LogStore, StateMachineStore)>
where
    F: FnOnce(u64) -> Fut,
    Fut: Future<Output = io::Result<(SnapshotMeta, Vec<u8>)>>,
{
    let engine: Arc<dyn KvEngine> = Arc::new(SledEngine::open(&dir.join("engine"))?);
    open_or_reinstall_on(engine, &dir.join("snapshots"), fetch).await
}

/// [`open_or_reinstall`] on an already opened engine, with snapshot files in `snapshot_dir`.
pub async fn open_or_reinstall_on<F, Fut>(
    engine: Arc<dyn KvEngine>,
    snapshot_dir: &Path,
    fetch: F,
) -> io::Result<(LogStore, StateMachineStore)>
where
    F: FnOnce(u64) -> Fut,
    Fut: Future<Output = io::Result<(SnapshotMeta, Vec<u8>)>>,
{
    match open_on(engine.clone(), snapshot_dir) {
        Ok(opened) => {
            tracing::info!("--reinstall-snapshot: the current snapshot verifies; it is kept");
            Ok(opened)
        }
        Err(e) if is_damaged(&e) => {
            let min = reinstall::min_index(engine.as_ref())?;
            tracing::warn!(error = %e, min_index = min, "fetching a member's snapshot to rebuild the store on");
            let (meta, bytes) = fetch(min).await?;
            let discarded = reinstall::install(&engine, snapshot_dir, &meta, bytes, min)?;
            tracing::warn!(
                snapshot = ?meta.last_log_id,
                discarded = ?discarded.as_ref().map(|p| p.display().to_string()),
                "the store is rebuilt on a member's snapshot"
            );
            open_on(engine, snapshot_dir)
        }
        Err(e) => Err(e),
    }
}

/// Opens both stores on an already opened engine, with snapshot files in `snapshot_dir`: see
/// [`open`] for what refuses it. Once it opened, snapshot files a crash left behind are removed.
pub fn open_on(engine: Arc<dyn KvEngine>, snapshot_dir: &Path) -> io::Result<(LogStore, StateMachineStore)> {
    let sm = load_checked(&engine, snapshot_dir)?;
    sm.remove_leftover_snapshots()?;
    let log = LogStore::new(engine);
    Ok((log, sm))
}

/// Loads the state machine, and checks that its snapshot reaches the purged log: a snapshot that
/// ends before the purge mark leaves a gap no replay can fill.
fn load_checked(engine: &Arc<dyn KvEngine>, snapshot_dir: &Path) -> io::Result<StateMachineStore> {
    let sm = StateMachineStore::load(engine.clone(), snapshot_dir)?;
    if let Some(purged) = log_store::last_purged(engine.as_ref())?
        && sm.last_applied().map(|l| l.index) < Some(purged.index)
    {
        let path = sm.current_snapshot_path()?.unwrap_or_else(|| snapshot_dir.to_path_buf());
        let ends = sm.last_applied().map_or_else(|| "there is no snapshot".to_string(), |l| format!("it ends at {l}"));
        return Err(snapshots::damaged(
            &path,
            format!("{ends}, but the log is purged up to {purged}: the entries between are gone"),
        ));
    }
    Ok(sm)
}

fn invalid_data(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod conformance {
    use openraft::StorageError;
    use openraft::testing::log::StoreBuilder;
    use openraft::testing::log::Suite;

    use super::*;
    use crate::TypeConfig;

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Builder {
        async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<TypeConfig>> {
            let dir = tempfile::tempdir().expect("tempdir");
            let (log, sm) = open(dir.path()).expect("open store");
            Ok((dir, log, sm))
        }
    }

    /// The sled store passes openraft's storage conformance suite.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn openraft_storage_suite() -> Result<(), StorageError<TypeConfig>> {
        Suite::test_all(Builder).await?;
        Ok(())
    }
}
