//! join-bench: how long a new node takes to join a cluster that holds issue 15's state (100,000
//! running Computers with idle-plan entries, 1,000,000 finished executions, 10,000 bindings), and
//! the memory three such nodes take; the same at a tenth of the size in the same run, to show the
//! growth.
//!
//! For each size:
//!
//! 1. a real 1-node cluster is started ([`TestCluster`], the release `computerd`) and stopped;
//! 2. its store is seeded, offline, in a child process (`join-bench --seed`): the state is built
//!    through the state machine's commands in bulk ([`computerd_scale_bench::World::on`], as the
//!    cluster's owner), those commands are applied through the node's own store as log entries
//!    after its last one, a snapshot is built, and the log is purged up to it. So the node holds
//!    what it would after a long life whose log was compacted; through the API this would take
//!    hours on 2 cores;
//! 3. the node is started again (it loads the snapshot: its restart time is reported);
//! 4. node 2 joins through node 1, then node 3: each join is timed from the new process's start
//!    until it is a voter and has applied what the leader had applied when it started (the
//!    leader sends its snapshot: the log behind it is purged). A Computer of the seeded state is
//!    then read on the new node, so the state did arrive;
//! 5. the peak and current RSS of the three nodes are read from `/proc`.
//!
//! Goal (issue 15): a node joins a full-size cluster in under 60 s, and three nodes with their
//! snapshot copies fit in 24 GiB.
//!
//! ```text
//! cargo build --release -p computerd-node --bin computerd -p computerd-bench --bin join-bench &&
//!   target/release/join-bench [--fraction F]
//! ```
//!
//! `--fraction F` scales both sizes (default 1, the issue's size); `COMPUTERD_BIN` as in the other
//! benches.

use std::path::Path;
use std::time::Duration;
use std::time::Instant;

use anyhow::Context;
use anyhow::Result;
use anyhow::bail;
use computerd_bench::settings;
use computerd_raft::typ::Entry;
use computerd_raft::typ::LogId;
use computerd_scale_bench::Size;
use computerd_scale_bench::World;
use computerd_scale_bench::computer_id;
use computerd_scale_bench::status_kib;
use computerd_tests::TestCluster;
use openraft::EntryPayload;
use openraft::storage::RaftLogReader;
use openraft::storage::RaftLogStorage;
use openraft::storage::RaftSnapshotBuilder;
use openraft::storage::RaftStateMachine;
use serde_json::Value;
use serde_json::json;

/// Goal: a join into the full-size cluster, seconds.
const GOAL_JOIN_SECS: f64 = 60.0;
/// Goal: three nodes' memory, GiB.
const GOAL_THREE_GIB: f64 = 24.0;
/// How long a restart or a join may take before the bench gives up.
const GIVE_UP: Duration = Duration::from_secs(600);
/// Log entries applied to the store at once while seeding.
const SEED_BATCH: usize = 10_000;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut fraction = 1.0f64;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--fraction" => fraction = args.next().and_then(|v| v.parse().ok()).context("--fraction F")?,
            "--seed" => {
                // The child: join-bench --seed STORE_DIR SECRET_FILE COMPUTERS,EXECUTIONS,BINDINGS
                let (Some(store), Some(secret), Some(spec)) = (args.next(), args.next(), args.next()) else {
                    bail!("--seed STORE SECRET_FILE computers,executions,bindings");
                };
                let n: Vec<usize> = spec.split(',').filter_map(|x| x.parse().ok()).collect();
                let [computers, executions, bindings] = n[..] else {
                    bail!("--seed …: computers,executions,bindings")
                };
                let secret = std::fs::read_to_string(&secret).context("the owner token")?;
                let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
                let out =
                    rt.block_on(seed(Path::new(&store), secret.trim(), Size { computers, executions, bindings }))?;
                println!("{out}");
                return Ok(());
            }
            other => bail!("unknown argument {other} (join-bench [--fraction F])"),
        }
    }
    let bin = settings::computerd_bin()?;
    // SAFETY: main, before any thread.
    let rt = unsafe { settings::runtime_for(&bin)? };
    rt.block_on(run(fraction))
}

async fn run(fraction: f64) -> Result<()> {
    let full = Size::full(fraction);
    let tenth = Size { computers: full.computers / 10, executions: full.executions / 10, bindings: full.bindings / 10 };
    println!("join-bench: a node joining a 1-node, then 2-node cluster seeded with {tenth:?} (baseline) and {full:?}");
    let mut rows = Vec::new();
    for (name, size) in [("tenth", tenth), ("full", full)] {
        let r = one(size).await?;
        println!(
            "{name:>5}: seeded {} entries in {:.1} s (snapshot {:.0} MiB); node 1 restarted in {:.1} s; \
             node 2 joined in {:.1} s, node 3 in {:.1} s; peak RSS per node {} MiB, {:.2} GiB for the three",
            r.seed["entries"],
            r.seed["seconds"].as_f64().unwrap_or(0.0),
            r.seed["snapshotBytes"].as_f64().unwrap_or(0.0) / (1u64 << 20) as f64,
            r.restart.as_secs_f64(),
            r.joins[0].as_secs_f64(),
            r.joins[1].as_secs_f64(),
            r.peak_kib.iter().map(|k| (k / 1024).to_string()).collect::<Vec<_>>().join(" / "),
            r.peak_kib.iter().sum::<u64>() as f64 / (1u64 << 20) as f64,
        );
        rows.push(r);
    }
    let (a, b) = (&rows[0], &rows[1]);
    let worst = b.joins.iter().copied().max().unwrap_or_default().as_secs_f64();
    let three = b.peak_kib.iter().sum::<u64>() as f64 / (1u64 << 20) as f64;
    println!(
        "full / tenth: join {:.1}x, restart {:.1}x, snapshot {:.1}x",
        worst / a.joins.iter().copied().max().unwrap_or_default().as_secs_f64().max(1e-9),
        b.restart.as_secs_f64() / a.restart.as_secs_f64().max(1e-9),
        b.seed["snapshotBytes"].as_f64().unwrap_or(0.0) / a.seed["snapshotBytes"].as_f64().unwrap_or(1.0).max(1.0),
    );
    println!(
        "goals: a join at full size {worst:.1} s (goal under {GOAL_JOIN_SECS} s: {}); three nodes' peak RSS {three:.2} GiB (goal: fit in {GOAL_THREE_GIB} GiB: {})",
        if worst < GOAL_JOIN_SECS { "met" } else { "NOT met" },
        if three < GOAL_THREE_GIB { "met" } else { "NOT met" },
    );
    Ok(())
}

struct Row {
    seed: Value,
    restart: Duration,
    joins: [Duration; 2],
    peak_kib: Vec<u64>,
}

/// One size: a cluster seeded with it, restarted, joined by two nodes.
async fn one(size: Size) -> Result<Row> {
    let mut c = TestCluster::start(1).await;
    c.terminate(1).await;
    let secret = c.dir.path().join("owner.token");
    std::fs::write(&secret, &c.token)?;
    let store = c.nodes[&1].data.join("store");
    let out = std::process::Command::new(std::env::current_exe()?)
        .arg("--seed")
        .arg(&store)
        .arg(&secret)
        .arg(format!("{},{},{}", size.computers, size.executions, size.bindings))
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("run the seeding child")?;
    if !out.status.success() {
        bail!("seeding {size:?} failed");
    }
    let seed: Value = serde_json::from_slice(&out.stdout).context("the seeding child's report")?;
    let index = seed["index"].as_u64().context("the seeded index")?;

    let t = Instant::now();
    c.spawn(1);
    wait("node 1 to load the seeded state and lead", || async {
        let h = c.health(1).await?;
        (h["leaderId"] == 1 && h["lastApplied"].as_u64()? >= index).then_some(())
    })
    .await?;
    let restart = t.elapsed();

    let mut joins = [Duration::ZERO; 2];
    for (k, id) in [2u64, 3].into_iter().enumerate() {
        let target = c.health(1).await.and_then(|h| h["lastApplied"].as_u64()).context("node 1's applied index")?;
        let t = Instant::now();
        c.join_new(id, 1).await;
        wait(&format!("node {id} to join and apply {target}"), || async {
            let h = c.health(id).await?;
            let voters = h["members"].as_array()?.iter().filter(|m| m["voter"] == true).count();
            (voters == id as usize && h["lastApplied"].as_u64()? >= target).then_some(())
        })
        .await?;
        joins[k] = t.elapsed();
        // The state did arrive: a seeded Computer reads on the new node.
        let path = format!("/v1/computers/{}", computer_id(size.computers.saturating_sub(1)));
        let (status, body) = c.call(reqwest::Method::GET, id, &path, &c.token, None).await;
        if status != 200 {
            bail!("node {id} answered {status} for {path}: {body}");
        }
    }
    let peak_kib = [1u64, 2, 3]
        .iter()
        .map(|id| {
            let pid = c.nodes[id].child.as_ref().map_or(0, |ch| ch.id());
            status_kib(&format!("/proc/{pid}/status"), "VmHWM:")
        })
        .collect();
    Ok(Row { seed, restart, joins, peak_kib })
}

/// Polls `probe` every 100 ms until it answers, at most [`GIVE_UP`].
async fn wait<F, Fut>(what: &str, probe: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let start = Instant::now();
    while start.elapsed() < GIVE_UP {
        if probe().await.is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("gave up waiting {GIVE_UP:?} for {what}")
}

/// Seeds a stopped node's store with `size` (see the module's text); answers a JSON report.
async fn seed(store: &Path, secret: &str, size: Size) -> Result<Value> {
    let t = Instant::now();
    let (mut log, mut sm) = computerd_raft::store::open(store).context("open the node's store")?;
    // The state machine opens at its snapshot (if any); the log after it is applied here, as
    // openraft would at start. A node stopped cleanly has committed its whole log.
    let (applied, _) = sm.applied_state().await?;
    let state = log.get_log_state().await?;
    let committed = log.read_committed().await?;
    if state.last_log_id != committed {
        bail!("the node's log ends at {:?} but {committed:?} is committed", state.last_log_id);
    }
    let from = applied.map_or(0, |l| l.index + 1);
    let tail = log.get_log_reader().await.try_get_log_entries(from..).await?;
    sm.apply(futures::stream::iter(tail.into_iter().map(|e| Ok::<_, std::io::Error>((e, None))))).await?;
    let (last, _) = sm.applied_state().await?;
    let last = last.context("the node applied nothing")?;
    if Some(last) != committed {
        bail!("applied up to {last:?}, but {committed:?} is committed");
    }
    let state = sm.reader().read(|s| s.clone());
    // One stamp for every seeded entry (a leader never goes backwards; equal is allowed), a
    // little ahead of now: the Computers' idle deadlines are then an hour after the run starts,
    // so no idle pause runs while the bench does.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
    let mut w = World::on(state, secret, now + 1_000).map_err(anyhow::Error::msg)?;
    w.tick = 0;
    w.pause_after = 3_600;
    w.populate(size);
    let requests = w.log.take().unwrap_or_default();
    let (executions, plan, bindings) = (w.s.executions.len(), w.s.plan.len(), w.s.tool_bindings.len());
    drop(w);
    let entries = requests.len();
    let mut index = last.index;
    let mut requests = requests.into_iter();
    loop {
        let batch: Vec<_> = requests
            .by_ref()
            .take(SEED_BATCH)
            .map(|req| {
                index += 1;
                let log_id = LogId { leader_id: last.leader_id, index };
                Ok::<_, std::io::Error>((Entry { log_id, payload: EntryPayload::Normal(req) }, None))
            })
            .collect();
        if batch.is_empty() {
            break;
        }
        sm.apply(futures::stream::iter(batch)).await?;
    }
    let seeded = LogId { leader_id: last.leader_id, index };
    let applied = sm.reader().read(|s| (s.executions.len(), s.plan.len(), s.tool_bindings.len()));
    if applied != (executions, plan, bindings) {
        bail!("the store applied {applied:?}, the generator built {:?}", (executions, plan, bindings));
    }
    let snapshot = sm.get_snapshot_builder().await.build_snapshot().await?;
    if snapshot.meta.last_log_id != Some(seeded) {
        bail!("the snapshot ends at {:?}, not {seeded:?}", snapshot.meta.last_log_id);
    }
    log.save_committed(Some(seeded)).await?;
    log.purge(seeded).await?;
    // The vote saved again: the engine is flushed with it.
    if let Some(vote) = log.read_vote().await? {
        log.save_vote(&vote).await?;
    }
    Ok(json!({
        "index": index,
        "entries": entries,
        "executions": executions,
        "plan": plan,
        "bindings": bindings,
        "snapshotBytes": snapshot.snapshot.len(),
        "seconds": t.elapsed().as_secs_f64(),
    }))
}
