//! Snapshot safety: builds racing installs, damaged files, reinstalls, and a failed pointer
//! flush, driven through the storage API on a real sled engine that is closed and reopened.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use openraft::RaftLogReader;
use openraft::RaftSnapshotBuilder;
use openraft::storage::RaftLogStorage;
use openraft::storage::RaftStateMachine;
use openraft::testing::blank_ent;
use openraft::testing::log_id;

use super::*;
use crate::TypeConfig;
use crate::engine::BatchOp;
use crate::engine::Space;
use crate::typ::LogId;
use crate::typ::Vote;

fn id(index: u64) -> LogId {
    log_id::<TypeConfig>(1, 1, index)
}

/// A store on its own engine, and that engine, so the test can wait for it to be released.
struct Opened {
    log: LogStore,
    sm: StateMachineStore,
    engine: Arc<dyn KvEngine>,
}

/// Opens the engine in `dir`, waiting for the lock a dropped handle still holds.
fn engine_at(dir: &Path) -> Arc<dyn KvEngine> {
    Arc::new(crate::engine::open_when_free(&dir.join("engine")))
}

fn open_at(dir: &Path) -> std::io::Result<Opened> {
    let engine = engine_at(dir);
    let (log, sm) = open_on(engine.clone(), &dir.join("snapshots"))?;
    Ok(Opened { log, sm, engine })
}

/// Drops the store and waits until the engine is released by every thread (the log's flusher
/// and purger end when the store is dropped), so sled can be opened again.
fn close(o: Opened) {
    let weak = Arc::downgrade(&o.engine);
    drop(o);
    let deadline = Instant::now() + Duration::from_secs(30);
    while weak.strong_count() > 0 {
        assert!(Instant::now() < deadline, "the engine is still held 30 s after the store was dropped");
        std::thread::yield_now();
    }
}

/// Releases `engine` (after a refused open, nothing else holds it).
fn release(engine: Arc<dyn KvEngine>) {
    let weak = Arc::downgrade(&engine);
    drop(engine);
    assert_eq!(weak.strong_count(), 0, "a refused open left the engine held");
}

async fn apply_blank(sm: &mut StateMachineStore, from: u64, to: u64) {
    let entries: Vec<_> = (from..=to).map(|i| Ok((blank_ent::<TypeConfig>(1, 1, i), None))).collect();
    sm.apply(futures::stream::iter(entries)).await.expect("apply");
}

fn snapshot_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir.join("snapshots"))
        .expect("read the snapshot dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snapshot-"))
        .collect();
    names.sort();
    names
}

/// Every file in `dir` with its bytes.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fs::read_dir(dir).expect("read dir").flatten().map(|e| (e.path(), fs::read(e.path()).expect("read file"))).collect()
}

/// Every key and value the engine holds, by space.
fn contents(engine: &dyn KvEngine) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for space in [Space::Meta, Space::Log, Space::Snapshot] {
        out.extend(engine.scan(space, &[], &[0xff; 32], usize::MAX).expect("scan"));
    }
    out
}

/// The store's current snapshot, checked as a restart would: the pointer names an existing
/// file, the only `snapshot-*` file there is, whose checksum verifies and whose meta is the
/// pointer's. Answers its last log id.
async fn check_current(dir: &Path, o: &mut Opened) -> Option<LogId> {
    let path = o.sm.current_snapshot_path().expect("read the pointer")?;
    let bytes = fs::read(&path).unwrap_or_else(|e| panic!("the pointer names {}: {e}", path.display()));
    snapshots::payload(&bytes).unwrap_or_else(|why| panic!("{}: {why}", path.display()));
    let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
    assert_eq!(snapshot_files(dir), vec![name], "the current snapshot is the only snapshot file");
    let current = o.sm.get_current_snapshot().await.expect("read the current snapshot").expect("a snapshot");
    assert_eq!(current.snapshot, bytes);
    current.meta.last_log_id
}

/// A snapshot build and an install race, 200 times, with the store reopened in between: after
/// every race and every reopen the pointer names the newest of the two (never an older one), an
/// existing file whose checksum verifies, and its last log id never goes backwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_and_install_race_and_the_pointer_only_moves_forward() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut prev: Option<LogId> = None;
    let mut base = 0u64;
    for round in 0..200u64 {
        let mut o = open_at(dir.path()).expect("the store opens");
        let current = check_current(dir.path(), &mut o).await;
        assert!(current >= prev, "round {round}: the snapshot went back from {prev:?} to {current:?}");
        assert_eq!(current, prev, "round {round}: the reopened store lost the last snapshot");
        let (applied, _) = o.sm.applied_state().await.expect("applied");
        assert_eq!(applied, current, "round {round}: the state machine restarts from its snapshot");

        // The build sees base+10 (unless the install got there first); the install is either
        // past it or behind it, in turns.
        apply_blank(&mut o.sm, base + 1, base + 10).await;
        let install_at = if round % 2 == 0 { base + 20 } else { base + 5 };
        let (meta, bytes) = state_machine::snapshot_at(id(install_at));
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let (mut builder, b1) = (o.sm.get_snapshot_builder().await, barrier.clone());
        let build = tokio::spawn(async move {
            b1.wait().await;
            builder.build_snapshot().await
        });
        let (mut sm, b2) = (o.sm.clone(), barrier.clone());
        let install = tokio::spawn(async move {
            b2.wait().await;
            sm.install_snapshot(&meta, bytes).await
        });
        let built = build.await.expect("build task").expect("the build succeeds");
        install.await.expect("install task").expect("the install succeeds");

        let want = built.meta.last_log_id.max(Some(id(install_at)));
        let now = check_current(dir.path(), &mut o).await;
        assert_eq!(now, want, "round {round}: built {:?}, installed {install_at}", built.meta.last_log_id);
        prev = now;
        base = now.map_or(0, |l| l.index);
        close(o);
    }
}

/// A build that finishes after a newer install is dropped: the pointer keeps the install, and
/// no file of the build is left.
#[tokio::test]
async fn a_build_older_than_the_installed_snapshot_is_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut o = open_at(dir.path()).expect("open");
    apply_blank(&mut o.sm, 1, 10).await;
    let mut builder = o.sm.get_snapshot_builder().await; // the build's view: index 10
    let (meta, bytes) = state_machine::snapshot_at(id(20));
    o.sm.install_snapshot(&meta, bytes).await.expect("install");
    let built = builder.build_snapshot().await.expect("build");
    drop(builder);
    // The builder shares the state machine, so it sees the install: either way nothing older.
    assert!(built.meta.last_log_id <= Some(id(20)));
    assert_eq!(check_current(dir.path(), &mut o).await, Some(id(20)));

    // An older build stored directly (as one that cloned the state before the install would).
    let (old_meta, old_bytes) = state_machine::snapshot_at(id(10));
    let snaps = snapshots::Snapshots::new(o.engine.clone(), &dir.path().join("snapshots")).expect("snapshots");
    assert_eq!(snaps.store(&old_meta, &old_bytes).expect("store"), snapshots::Stored::Stale { current: Some(id(20)) });
    drop(snaps);
    assert_eq!(check_current(dir.path(), &mut o).await, Some(id(20)));
    close(o);
}

/// A snapshot file with one flipped byte: the store refuses to open, naming the file and
/// "checksum", and the refusal changes nothing on disk: the snapshot directory is byte for byte
/// the same, and so is everything the engine holds (sled's own files change when it opens,
/// before the store reads anything). After a reopen it refuses the same way.
#[tokio::test]
async fn a_damaged_snapshot_refuses_the_open_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut o = open_at(dir.path()).expect("open");
    apply_blank(&mut o.sm, 1, 10).await;
    o.sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
    let path = o.sm.current_snapshot_path().expect("pointer").expect("a snapshot");
    close(o);

    let mut bytes = fs::read(&path).expect("read");
    let at = bytes.len() - 3; // inside the JSON payload
    bytes[at] ^= 0x20;
    fs::write(&path, &bytes).expect("flip a byte");
    let before = files(&dir.path().join("snapshots"));
    assert_eq!(before.len(), 1);

    for _ in 0..2 {
        let engine = engine_at(dir.path());
        let held = contents(engine.as_ref());
        let err =
            open_on(engine.clone(), &dir.path().join("snapshots")).err().expect("a damaged snapshot refuses the open");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "the error names the file: {msg}");
        assert!(msg.contains("checksum"), "the error says why: {msg}");
        assert!(msg.contains("--reinstall-snapshot"), "the error names the way out: {msg}");
        let inner = err.get_ref().and_then(|e| e.downcast_ref::<DamagedSnapshot>()).expect("a DamagedSnapshot");
        assert_eq!(inner.path, path);
        assert!(contents(engine.as_ref()) == held, "the refusal changed what the engine holds");
        release(engine);
        assert!(files(&dir.path().join("snapshots")) == before, "the refusal changed the snapshot directory");
    }
}

/// A snapshot that ends before the purged log (what the old race left behind) is refused too.
#[tokio::test]
async fn a_snapshot_behind_the_purged_log_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut o = open_at(dir.path()).expect("open");
    apply_blank(&mut o.sm, 1, 10).await;
    o.sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
    o.log.purge(id(30)).await.expect("purge");
    o.engine.flush().expect("flush");
    close(o);
    let leftover = dir.path().join("snapshots").join("snapshot-00000000000000000030-0.snap.tmp");
    fs::write(&leftover, b"a build cut short").expect("leftover");
    let engine = engine_at(dir.path());
    let err = open_on(engine.clone(), &dir.path().join("snapshots"))
        .err()
        .expect("a gap between the snapshot and the log refuses the open");
    assert!(is_damaged(&err));
    assert!(err.to_string().contains("purged up to"), "{err}");
    assert!(leftover.exists(), "a refused open removes nothing");
    release(engine);
}

/// Files a crash left behind (a `.tmp`, an older snapshot) are removed once the store opens.
#[tokio::test]
async fn leftover_snapshot_files_are_removed_once_the_store_opens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut o = open_at(dir.path()).expect("open");
    apply_blank(&mut o.sm, 1, 10).await;
    o.sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
    close(o);
    let snaps = dir.path().join("snapshots");
    fs::write(snaps.join("snapshot-00000000000000000005-0.snap"), b"older").expect("older");
    fs::write(snaps.join("snapshot-00000000000000000020-0.snap.tmp"), b"cut short").expect("tmp");
    fs::write(snaps.join("discarded-snapshot-00000000000000000001-0.snap"), b"kept").expect("discarded");
    assert_eq!(snapshot_files(dir.path()).len(), 3);
    let mut o = open_at(dir.path()).expect("open");
    assert_eq!(check_current(dir.path(), &mut o).await, Some(id(10)));
    assert!(snaps.join("discarded-snapshot-00000000000000000001-0.snap").exists(), "a discarded file stays");
    close(o);
}

/// A store as a follower leaves it: vote 3/2, entries 1..=30 (term 1), committed 30, a snapshot
/// at 10 whose file then gets one flipped byte, the log purged up to 8. Answers the damaged
/// file's path and bytes.
async fn damaged_store(dir: &Path) -> (PathBuf, Vec<u8>) {
    let mut o = open_at(dir).expect("open");
    o.log.save_vote(&Vote::new(3, 2)).await.expect("vote");
    let entries: Vec<_> = (1..=30).map(|i| blank_ent::<TypeConfig>(1, 1, i)).collect();
    let puts = entries
        .iter()
        .map(|e| BatchOp::Put(e.log_id.index.to_be_bytes().to_vec(), serde_json::to_vec(e).expect("encode")))
        .collect();
    o.engine.write_batch(Space::Log, puts).expect("append");
    o.log.save_committed(Some(id(30))).await.expect("committed");
    apply_blank(&mut o.sm, 1, 10).await;
    o.sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
    o.log.purge(id(8)).await.expect("purge");
    o.engine.flush().expect("flush");
    let path = o.sm.current_snapshot_path().expect("pointer").expect("a snapshot");
    close(o);
    let mut bytes = fs::read(&path).expect("read");
    let at = bytes.len() - 3;
    bytes[at] ^= 0x20;
    fs::write(&path, &bytes).expect("flip a byte");
    (path, bytes)
}

/// The indexes of the log entries the store holds.
async fn log_indexes(log: &mut LogStore) -> Vec<u64> {
    log.try_get_log_entries(0..1000).await.expect("entries").iter().map(|e| e.log_id.index).collect()
}

/// `--reinstall-snapshot` on a damaged store: the member is asked for a snapshot reaching the
/// purged log (8); its snapshot (20) becomes the current one, the damaged file is kept aside,
/// the log keeps its entries after 20 and its vote and committed id, and the store then opens
/// without the flag: nothing the node held went backwards.
#[tokio::test]
async fn reinstall_rebuilds_a_damaged_store_on_a_members_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, bytes) = damaged_store(dir.path()).await;
    let engine = engine_at(dir.path());
    let asked = Arc::new(std::sync::Mutex::new(None));
    let seen = asked.clone();
    let (mut log, mut sm) = open_or_reinstall_on(engine.clone(), &dir.path().join("snapshots"), |min| async move {
        *seen.lock().expect("lock") = Some(min);
        Ok(state_machine::snapshot_at(id(20)))
    })
    .await
    .expect("the reinstall opens the store");
    assert_eq!(*asked.lock().expect("lock"), Some(8), "the member is asked to reach the purged log");
    let name = path.file_name().expect("name").to_string_lossy().into_owned();
    let discarded = dir.path().join("snapshots").join(format!("discarded-{name}"));
    assert_eq!(fs::read(&discarded).expect("the damaged file is kept aside"), bytes);
    assert_eq!(sm.applied_state().await.expect("applied").0, Some(id(20)));
    let st = log.get_log_state().await.expect("log state");
    assert_eq!((st.last_purged_log_id, st.last_log_id), (Some(id(20)), Some(id(30))));
    assert_eq!(log_indexes(&mut log).await, (21..=30).collect::<Vec<_>>(), "the entries after 20 stay");
    assert_eq!(log.read_vote().await.expect("vote"), Some(Vote::new(3, 2)), "the vote stays");
    assert_eq!(log.read_committed().await.expect("committed"), Some(id(30)));
    close(Opened { log, sm, engine });

    let mut o = open_at(dir.path()).expect("an ordinary open after the reinstall");
    assert_eq!(check_current(dir.path(), &mut o).await, Some(id(20)));
    assert!(discarded.exists(), "a discarded file outlives the clean-up");
    close(o);
}

/// When the entry at the member snapshot's index is another one (an uncommitted entry of this
/// node that a later leader replaced), it and every entry after it go.
#[tokio::test]
async fn reinstall_drops_a_replaced_log_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    damaged_store(dir.path()).await;
    let engine = engine_at(dir.path());
    let theirs = log_id::<TypeConfig>(2, 3, 20);
    let (log, sm) = open_or_reinstall_on(engine.clone(), &dir.path().join("snapshots"), |_| async move {
        Ok(state_machine::snapshot_at(theirs))
    })
    .await
    .expect("reinstall");
    let mut o = Opened { log, sm, engine };
    let st = o.log.get_log_state().await.expect("log state");
    assert_eq!((st.last_purged_log_id, st.last_log_id), (Some(theirs), Some(theirs)));
    assert!(log_indexes(&mut o.log).await.is_empty(), "the replaced tail is gone");
    assert_eq!(o.log.read_vote().await.expect("vote"), Some(Vote::new(3, 2)), "the vote stays");
    assert_eq!(o.log.read_committed().await.expect("committed"), Some(theirs), "no committed id past the log");
    close(o);
}

/// A member snapshot that ends before the purged log cannot rebuild the store: the reinstall
/// fails saying so and changes nothing, and the store still refuses to open.
#[tokio::test]
async fn reinstall_refuses_a_snapshot_behind_the_purged_log() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, bytes) = damaged_store(dir.path()).await;
    let before = files(&dir.path().join("snapshots"));
    let engine = engine_at(dir.path());
    let held = contents(engine.as_ref());
    let err = open_or_reinstall_on(engine.clone(), &dir.path().join("snapshots"), |_| async {
        Ok(state_machine::snapshot_at(id(5)))
    })
    .await
    .err()
    .expect("a snapshot behind the purged log is refused");
    assert!(err.to_string().contains("before this node's purged log"), "{err}");
    assert!(contents(engine.as_ref()) == held, "the refused reinstall changed the engine");
    assert!(files(&dir.path().join("snapshots")) == before, "the refused reinstall changed the snapshot directory");
    assert_eq!(fs::read(&path).expect("still there"), bytes);
    let err = open_on(engine.clone(), &dir.path().join("snapshots")).err().expect("still refused");
    assert!(is_damaged(&err), "{err}");
    release(engine);
}

/// A reinstall cut short after any durable step leaves a store that refuses to open and that a
/// second reinstall rebuilds.
#[tokio::test]
async fn a_reinstall_cut_short_refuses_then_reinstalls() {
    let dir = tempfile::tempdir().expect("tempdir");
    damaged_store(dir.path()).await;
    let snap_dir = dir.path().join("snapshots");
    // Steps 1 and 2 of a reinstall on a snapshot at 20, then a crash.
    let engine = engine_at(dir.path());
    snapshots::Snapshots::new(engine.clone(), &snap_dir).expect("snapshots").discard_current().expect("discard");
    let err = open_on(engine.clone(), &snap_dir).err().expect("refused after step 1");
    assert!(err.to_string().contains("missing"), "{err}");
    log_store::rebase_on(engine.as_ref(), id(20)).expect("rebase");
    let err = open_on(engine.clone(), &snap_dir).err().expect("refused after step 2");
    assert!(is_damaged(&err), "{err}");
    let (log, sm) = open_or_reinstall_on(engine.clone(), &snap_dir, |min| async move {
        assert_eq!(min, 20, "the purge mark moved to the snapshot being installed");
        Ok(state_machine::snapshot_at(id(25)))
    })
    .await
    .expect("a second reinstall");
    close(Opened { log, sm, engine });
    let mut o = open_at(dir.path()).expect("open");
    assert_eq!(check_current(dir.path(), &mut o).await, Some(id(25)));
    assert_eq!(log_indexes(&mut o.log).await, (26..=30).collect::<Vec<_>>());
    close(o);
}

/// A healthy store is kept by `--reinstall-snapshot`: no member is asked.
#[tokio::test]
async fn reinstall_keeps_a_healthy_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut o = open_at(dir.path()).expect("open");
    apply_blank(&mut o.sm, 1, 10).await;
    o.sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
    close(o);
    let engine = engine_at(dir.path());
    let (log, sm) = open_or_reinstall_on(engine.clone(), &dir.path().join("snapshots"), |_| async {
        Err(std::io::Error::other("a healthy store asks no member"))
    })
    .await
    .expect("open");
    let mut o = Opened { log, sm, engine };
    assert_eq!(check_current(dir.path(), &mut o).await, Some(id(10)));
    close(o);
}

/// An engine whose flush fails on demand.
struct FailingFlush {
    inner: Arc<dyn KvEngine>,
    fail: AtomicBool,
}

impl KvEngine for FailingFlush {
    fn get(&self, space: Space, key: &[u8]) -> std::io::Result<Option<Vec<u8>>> {
        self.inner.get(space, key)
    }
    fn write_batch(&self, space: Space, ops: Vec<BatchOp>) -> std::io::Result<()> {
        self.inner.write_batch(space, ops)
    }
    fn remove_range(&self, space: Space, from: &[u8], to: &[u8]) -> std::io::Result<()> {
        self.inner.remove_range(space, from, to)
    }
    fn scan(&self, space: Space, from: &[u8], to: &[u8], limit: usize) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.scan(space, from, to, limit)
    }
    fn last(&self, space: Space) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.inner.last(space)
    }
    fn flush(&self) -> std::io::Result<()> {
        if self.fail.load(Ordering::SeqCst) { Err(std::io::Error::other("flush failed")) } else { self.inner.flush() }
    }
}

/// When the pointer's flush fails, the previous snapshot file is not removed (nor the new one:
/// the pointer may name either), and the store opens again on a verified file.
#[tokio::test]
async fn a_failed_pointer_flush_removes_no_snapshot_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Arc::new(FailingFlush { inner: engine_at(dir.path()), fail: AtomicBool::new(false) });
    let snap_dir = dir.path().join("snapshots");
    let (log, mut sm) = open_on(engine.clone(), &snap_dir).expect("open");
    apply_blank(&mut sm, 1, 10).await;
    sm.get_snapshot_builder().await.build_snapshot().await.expect("build");
    let first = snapshot_files(dir.path());
    assert_eq!(first.len(), 1);

    engine.fail.store(true, Ordering::SeqCst);
    apply_blank(&mut sm, 11, 20).await;
    sm.get_snapshot_builder().await.build_snapshot().await.expect_err("the flush fails");
    let after = snapshot_files(dir.path());
    assert_eq!(after.len(), 2, "both files are kept: {after:?}");
    assert!(after.contains(&first[0]), "the previous snapshot file is kept");

    engine.fail.store(false, Ordering::SeqCst);
    drop((log, sm));
    let (log, sm) = open_on(engine.clone(), &snap_dir).expect("reopen");
    let mut o = Opened { log, sm, engine };
    let current = check_current(dir.path(), &mut o).await;
    assert!(current == Some(id(10)) || current == Some(id(20)), "{current:?}");
    drop(o);
}
