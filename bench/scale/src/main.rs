//! scale-bench: the store's state machine at the size of issue 15 and at a tenth of it.
//!
//! For each size it builds the state directly through the state machine's commands in bulk (no
//! Raft, no HTTP: through the API this would take hours on 2 cores): running provider Computers
//! with idle-plan entries, finished executions (a create each, then pause/resume pairs), tool
//! bindings of a bot, and a window of events. Then it measures, at that size:
//!
//! - apply latency, p50 and p99, over a steady mix of the commands that reach the store most: a
//!   pause's submit, claim, dispatch and finish; a wrong pairing code (the unauthenticated route);
//!   a session end; work reports; a binding's install and its answer;
//! - the snapshot: its JSON size, the time to serialize it (a build) and to decode and re-index
//!   it (what a joining node does before it can apply);
//! - the memory the state takes (RSS growth of this process while it is built).
//!
//! The tenth is the baseline of the same run: the report prints full ÷ tenth for each figure.
//! Goals (issue 15): apply p99 grows at most 2x from a tenth to full size, and three nodes with
//! their snapshot copies fit in 24 GiB. A node's join time over the network, into a real cluster
//! seeded with this state, is join-bench's (`bench/src/join_bench.rs`).
//!
//! `cargo run --release -p computerd-scale-bench -- [--fraction F]` (F scales both sizes, to try
//! it quickly; the default 1 is the size).

use std::time::Duration;
use std::time::Instant;

use computerd_raft::sm::Command;
use computerd_raft::sm::ExecutionKind;
use computerd_raft::sm::Response;
use computerd_raft::sm::State;
use computerd_scale_bench::BOT_TOKEN;
use computerd_scale_bench::Size;
use computerd_scale_bench::World;
use computerd_scale_bench::computer_id;
use computerd_scale_bench::rss;

/// Commands of the measured mix, per size.
const MEASURED: usize = 20_000;

fn build(size: Size) -> World {
    let mut w = World::new();
    w.populate(size);
    w
}

#[derive(Debug, Default)]
struct Report {
    build: Duration,
    rss: u64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    snapshot_bytes: usize,
    snapshot_build: Duration,
    snapshot_decode: Duration,
    plan: usize,
    executions: usize,
    bindings: usize,
}

/// The measured mix at the state's size: each command's apply is timed alone.
fn measure(w: &mut World, size: Size) -> (Duration, Duration, Duration) {
    let mut times = Vec::with_capacity(MEASURED);
    fn timed(times: &mut Vec<(Duration, &'static str)>, w: &mut World, cmd: Command) -> Response {
        let name = cmd.name();
        let t = Instant::now();
        let r = w.apply(cmd);
        times.push((t.elapsed(), name));
        r
    }
    let mut round = 0usize;
    // Bindings installed by the mix go on a Computer of their own, below the store's cap.
    let spare = computer_id(size.computers - 1);
    w.grant(&spare);
    while times.len() < MEASURED {
        round += 1;
        // A pause and a resume on a Computer spread over the whole state: 8 applies.
        let c = computer_id((round * 7919) % size.computers);
        for kind in [ExecutionKind::Pause, ExecutionKind::Resume] {
            let cmd = w.submit(kind, &c);
            let exe = match timed(&mut times, w, cmd) {
                Response::Id(id) => id,
                other => panic!("the measured submit was refused: {other:?}"),
            };
            for step in w.steps(&exe) {
                timed(&mut times, w, step);
            }
        }
        // The unauthenticated pairing route with a wrong code.
        let at_ms = w.clock;
        timed(&mut times, w, Command::RedeemPairing { code: "WRONG-CODE1".into(), credential_hash: "h".into(), at_ms });
        // A session's end on that Computer.
        timed(
            &mut times,
            w,
            Command::SessionEnded {
                computer_id: c.clone(),
                generation: 0,
                session_id: format!("ses_{round}"),
                owner: w.member().to_string(),
                exit_code: Some(0),
                signal: None,
                at_ms,
            },
        );
        // Work on three Computers.
        let ages = (0..3).map(|k| (computer_id((round * 31 + k) % size.computers), 5)).collect();
        timed(&mut times, w, Command::ReportWork { ages });
        // A binding installed and revoked on the spare Computer (its slot is freed).
        let b = w.binding(&spare);
        let id = b.id.clone();
        timed(&mut times, w, Command::BindingReserve { by: BOT_TOKEN.into(), binding: b });
        timed(
            &mut times,
            w,
            Command::BindingSettle {
                binding_id: id.clone(),
                ready: true,
                tools: serde_json::json!([]),
                error: None,
                shared_uid: false,
            },
        );
        timed(&mut times, w, Command::BindingRevoke { by: BOT_TOKEN.into(), binding_id: id });
    }
    times.sort();
    // Which commands make the slowest percent (to stderr: the report is the child's stdout).
    let slow = &times[times.len() * 99 / 100..];
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    for (_, name) in slow {
        *kinds.entry(name).or_default() += 1;
    }
    eprintln!("  the slowest 1% of applies at {size:?}: {kinds:?}");
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)].0;
    (at(0.50), at(0.99), times[times.len() - 1].0)
}

fn one(size: Size) -> Report {
    let before = rss();
    let t = Instant::now();
    let mut w = build(size);
    let build = t.elapsed();
    let rss = rss().saturating_sub(before);
    let (p50, p99, max) = measure(&mut w, size);
    let t = Instant::now();
    let bytes = serde_json::to_vec(&w.s).expect("serialize the state");
    let snapshot_build = t.elapsed();
    let t = Instant::now();
    let mut back: State = serde_json::from_slice(&bytes).expect("decode the state");
    back.reindex_tools();
    back.reindex_executions();
    back.reindex_computers();
    let snapshot_decode = t.elapsed();
    assert_eq!(back.executions.len(), w.s.executions.len());
    Report {
        build,
        rss,
        p50,
        p99,
        max,
        snapshot_bytes: bytes.len(),
        snapshot_build,
        snapshot_decode,
        plan: w.s.plan.len(),
        executions: w.s.executions.len(),
        bindings: w.s.tool_bindings.len(),
    }
}

/// Runs one size in a child process of its own, so that its RSS is its own state's.
/// The glibc tunable that backs malloc's heap with transparent huge pages (where the kernel's
/// THP mode is `madvise`, Debian's default), as `deploy/` runs the node.
const HUGE_PAGES: &str = "glibc.malloc.hugetlb=1";

fn in_child(size: Size, huge_pages: bool) -> Report {
    let exe = std::env::current_exe().expect("this program");
    let mut cmd = std::process::Command::new(exe);
    cmd.env_remove("GLIBC_TUNABLES");
    if huge_pages {
        cmd.env("GLIBC_TUNABLES", HUGE_PAGES);
    }
    let out = cmd
        .args(["--one", &format!("{},{},{}", size.computers, size.executions, size.bindings)])
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run a size in a child");
    assert!(out.status.success(), "the child for {size:?} failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the child's report");
    let d = |k: &str| Duration::from_nanos(v[k].as_u64().unwrap_or(0));
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    Report {
        build: d("build"),
        rss: n("rss"),
        p50: d("p50"),
        p99: d("p99"),
        max: d("max"),
        snapshot_bytes: n("snapshotBytes") as usize,
        snapshot_build: d("snapshotBuild"),
        snapshot_decode: d("snapshotDecode"),
        plan: n("plan") as usize,
        executions: n("executions") as usize,
        bindings: n("bindings") as usize,
    }
}

fn main() {
    let mut fraction = 1.0f64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--fraction" => fraction = args.next().and_then(|v| v.parse().ok()).expect("--fraction F"),
            "--one" => {
                let spec = args.next().expect("--one computers,executions,bindings");
                let n: Vec<usize> = spec.split(',').filter_map(|x| x.parse().ok()).collect();
                let [computers, executions, bindings] = n[..] else { panic!("--one computers,executions,bindings") };
                let r = one(Size { computers, executions, bindings });
                let ns = |d: Duration| d.as_nanos() as u64;
                let v = serde_json::json!({
                    "build": ns(r.build), "rss": r.rss, "p50": ns(r.p50), "p99": ns(r.p99), "max": ns(r.max),
                    "snapshotBytes": r.snapshot_bytes, "snapshotBuild": ns(r.snapshot_build),
                    "snapshotDecode": ns(r.snapshot_decode), "plan": r.plan, "executions": r.executions,
                    "bindings": r.bindings,
                });
                println!("{v}");
                return;
            }
            other => panic!("unknown argument {other} (scale-bench [--fraction F])"),
        }
    }
    let full = Size::full(fraction);
    let tenth = Size { computers: full.computers / 10, executions: full.executions / 10, bindings: full.bindings / 10 };
    println!("scale-bench: the state machine at {tenth:?} (baseline) and {full:?}");
    // Each size with glibc's default heap (4 KiB pages), then with huge pages: at a million
    // records, apply's tail is the TLB misses of walking its ordered maps.
    let mut rows = Vec::new();
    for huge in [false, true] {
        for (name, size) in [("tenth", tenth), ("full", full)] {
            let r = in_child(size, huge);
            println!(
                "{name:>5}{}: {} executions, {} plan entries, {} bindings; built in {:.1?}; state {:.0} MiB RSS; \
                 apply p50 {:.1?} p99 {:.1?} max {:.1?}; snapshot {:.0} MiB, built in {:.2?}, decoded and indexed in {:.2?}",
                if huge { " (huge pages)" } else { "" },
                r.executions,
                r.plan,
                r.bindings,
                r.build,
                r.rss as f64 / (1 << 20) as f64,
                r.p50,
                r.p99,
                r.max,
                r.snapshot_bytes as f64 / (1 << 20) as f64,
                r.snapshot_build,
                r.snapshot_decode,
            );
            rows.push(r);
        }
    }
    let ratio = |x: Duration, y: Duration| y.as_secs_f64() / x.as_secs_f64().max(1e-9);
    for (pages, a, b) in [("4 KiB pages", &rows[0], &rows[1]), (HUGE_PAGES, &rows[2], &rows[3])] {
        println!(
            "full / tenth, {pages}: apply p50 {:.2}x, p99 {:.2}x (goal at most 2x); snapshot {:.1}x; decode {:.1}x; RSS {:.1}x",
            ratio(a.p50, b.p50),
            ratio(a.p99, b.p99),
            b.snapshot_bytes as f64 / a.snapshot_bytes.max(1) as f64,
            ratio(a.snapshot_decode, b.snapshot_decode),
            b.rss as f64 / a.rss.max(1) as f64,
        );
    }
    // Three nodes, each with its state and two snapshot copies (the current file and one being
    // built or received), plus the serialized bytes of a build in flight.
    let (rss, snapshot) = (rows[1].rss.max(rows[3].rss), rows[1].snapshot_bytes);
    let three = 3.0 * (rss as f64 + 3.0 * snapshot as f64) / (1u64 << 30) as f64;
    println!("three nodes at full size need about {three:.1} GiB (goal: fit in 24 GiB)");
}
