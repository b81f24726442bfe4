//! openraft's storage traits implemented on a [`KvEngine`](crate::engine::KvEngine).

mod log_store;
mod state_machine;

pub use log_store::LogStore;
pub use state_machine::StateMachineStore;
pub use state_machine::StateReader;

use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::engine::KvEngine;
use crate::engine::SledEngine;

/// Opens the log store and state machine of a node from its engine directory.
pub fn open(dir: &Path) -> io::Result<(LogStore, StateMachineStore)> {
    let engine: Arc<dyn KvEngine> = Arc::new(SledEngine::open(&dir.join("engine"))?);
    open_on(engine, &dir.join("snapshots"))
}

/// Opens both stores on an already opened engine, with snapshot files in `snapshot_dir`.
pub fn open_on(engine: Arc<dyn KvEngine>, snapshot_dir: &Path) -> io::Result<(LogStore, StateMachineStore)> {
    let log = LogStore::new(engine.clone());
    let sm = StateMachineStore::load(engine, snapshot_dir)?;
    Ok((log, sm))
}

fn invalid_data(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

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
