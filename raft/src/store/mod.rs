//! openraft's storage traits implemented on a [`KvEngine`](crate::engine::KvEngine).

mod log_store;
mod reinstall;
mod snapshots;
mod state_machine;

pub use log_store::LogStore;
pub use reinstall::Reinstall;
pub use snapshots::DamagedSnapshot;
pub use snapshots::is_damaged;
pub use state_machine::StateMachineStore;
pub use state_machine::StateReader;

use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::engine::KvEngine;
use crate::engine::SledEngine;

/// What opening a store does when its current snapshot cannot be used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnDamagedSnapshot {
    /// Refuse to open with a [`DamagedSnapshot`] naming the file and the reason; nothing on disk
    /// is changed.
    #[default]
    Refuse,
    /// Discard it and empty the store so the leader sends its snapshot (see [`Reinstall`]).
    Reinstall,
}

/// An opened store: what openraft is handed, and whether a reinstall is under way.
pub struct Store {
    /// The Raft log.
    pub log: LogStore,
    /// The state machine.
    pub sm: StateMachineStore,
    /// Set while the store waits for the leader's snapshot: the node must accept no Raft RPC
    /// before the leader allowed its log to revert and [`Reinstall::finish`] returned.
    pub reinstall: Option<Reinstall>,
}

/// Opens the log store and state machine of a node from its engine directory.
pub fn open(dir: &Path, on_damaged: OnDamagedSnapshot) -> io::Result<Store> {
    let engine: Arc<dyn KvEngine> = Arc::new(SledEngine::open(&dir.join("engine"))?);
    open_on(engine, &dir.join("snapshots"), on_damaged)
}

/// Opens both stores on an already opened engine, with snapshot files in `snapshot_dir`.
///
/// The current snapshot must verify (see [`DamagedSnapshot`]) and cover the purged log; when it
/// does not, `on_damaged` says what happens. A reinstall once begun is finished by every later
/// open until [`Reinstall::finish`], whatever `on_damaged` says.
pub fn open_on(engine: Arc<dyn KvEngine>, snapshot_dir: &Path, on_damaged: OnDamagedSnapshot) -> io::Result<Store> {
    let loaded = if reinstall::pending(engine.as_ref())? {
        tracing::warn!("a snapshot reinstall is under way: the store stays empty until the leader sends its snapshot");
        None
    } else {
        match load_checked(&engine, snapshot_dir) {
            Ok(sm) => Some(sm),
            Err(e) if on_damaged == OnDamagedSnapshot::Reinstall && is_damaged(&e) => {
                tracing::warn!(error = %e, "discarding the damaged snapshot to take the leader's");
                None
            }
            Err(e) => return Err(e),
        }
    };
    let (sm, reinstall) = match loaded {
        Some(sm) => (sm, None),
        None => {
            let r = reinstall::begin(engine.clone(), snapshot_dir)?;
            (StateMachineStore::load(engine.clone(), snapshot_dir)?, Some(r))
        }
    };
    // The store opens: files a crash left behind may go. After any clearing: the log store reads
    // its purge mark when made.
    sm.remove_leftover_snapshots()?;
    let log = LogStore::new(engine);
    Ok(Store { log, sm, reinstall })
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
            let s = open(dir.path(), OnDamagedSnapshot::Refuse).expect("open store");
            Ok((dir, s.log, s.sm))
        }
    }

    /// The sled store passes openraft's storage conformance suite.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn openraft_storage_suite() -> Result<(), StorageError<TypeConfig>> {
        Suite::test_all(Builder).await?;
        Ok(())
    }
}
