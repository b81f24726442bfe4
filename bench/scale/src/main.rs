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
//! their snapshot copies fit in 24 GiB. A node's join time needs a running cluster with this
//! state, which this bench does not build; it reports the decode time a join starts with.
//!
//! `cargo run --release -p computerd-scale-bench -- [--fraction F]` (F scales both sizes, to try
//! it quickly; the default 1 is the size).

use std::time::Duration;
use std::time::Instant;

use computerd_raft::sm::BindingState;
use computerd_raft::sm::Bot;
use computerd_raft::sm::Command;
use computerd_raft::sm::Computer;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::Execution;
use computerd_raft::sm::ExecutionKind;
use computerd_raft::sm::Member;
use computerd_raft::sm::Organization;
use computerd_raft::sm::Outcome;
use computerd_raft::sm::Principal;
use computerd_raft::sm::Provider;
use computerd_raft::sm::ProviderKind;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::Role;
use computerd_raft::sm::Source;
use computerd_raft::sm::State;
use computerd_raft::sm::Submit;
use computerd_raft::sm::Token;
use computerd_raft::sm::ToolBinding;
use computerd_raft::sm::hash_secret;

const OWNER: &str = "tok_owner";
const BOT_TOKEN: &str = "tok_bot";
const BOT: &str = "bot_1";
const PROVIDER: &str = "cpp_1";
/// Bindings per Computer that carries them (the store's cap is 64).
const BINDINGS_PER_COMPUTER: usize = 50;
/// Commands of the measured mix, per size.
const MEASURED: usize = 20_000;

#[derive(Debug, Clone, Copy)]
struct Size {
    computers: usize,
    executions: usize,
    bindings: usize,
}

/// A state being built, with the cluster's clock it stamps entries with.
struct World {
    s: State,
    clock: u64,
    n: u64,
}

impl World {
    fn new() -> Self {
        let mut w = World { s: State::default(), clock: 1_800_000_000_000, n: 0 };
        let owner = Member { id: "mem_o".into(), name: "o".into(), email: None, role: Role::Owner, created_at: 1 };
        w.must(Command::Bootstrap {
            cluster_id: "c".into(),
            org: Organization { id: "org".into(), name: "o".into(), created_at: 1 },
            owner,
            token: token(OWNER, Principal::Member("mem_o".into())),
            join_secret_hash: None,
        });
        let provider = Provider {
            id: PROVIDER.into(),
            kind: ProviderKind::Fake,
            name: "p".into(),
            config: Default::default(),
            secrets: Default::default(),
            created_by: "mem_o".into(),
            created_at: 1,
        };
        w.must(Command::CreateProvider { by: OWNER.into(), provider });
        let bot = Bot { id: BOT.into(), name: "b".into(), member_id: "mem_o".into(), created_at: 1, archived_at: None };
        w.must(Command::CreateBot { by: OWNER.into(), bot, parent: None });
        w.must(Command::CreateToken { by: OWNER.into(), token: token(BOT_TOKEN, Principal::Bot(BOT.into())) });
        w
    }

    fn apply(&mut self, cmd: Command) -> Response {
        self.clock += 1;
        self.s.apply_request(&Request::new(cmd).stamped(self.clock))
    }

    /// Applies a command that must succeed; answers the id it named.
    fn must(&mut self, cmd: Command) -> Option<String> {
        let name = cmd.name();
        match self.apply(cmd) {
            Response::Ok => None,
            Response::Id(id) => Some(id),
            Response::Rejected(r) => panic!("{name} refused while building the state: {r:?}"),
        }
    }

    fn next(&mut self) -> u64 {
        self.n += 1;
        self.n
    }

    fn submit(&mut self, kind: ExecutionKind, computer: &str) -> Command {
        let n = self.next();
        let exe = Execution::pending(&format!("exe_{n:012}"), &format!("key-{n}"), "body", kind, computer, self.clock);
        let c = (kind == ExecutionKind::Create).then(|| Computer {
            id: computer.into(),
            name: computer.into(),
            owner: "mem_o".into(),
            shared: false,
            source: Source::Provider { provider: PROVIDER.into(), template: None },
            desktop: false,
            pause_after: Some(600),
            state: ComputerState::Starting,
            sandbox: None,
            active_execution: None,
            created_at: self.clock,
            agent_credential: None,
            link_generation: 0,
            link_node: None,
            desktop_view: None,
        });
        Command::SubmitExecution(Box::new(Submit {
            by: OWNER.into(),
            execution: exe,
            computer: c,
            approval_id: format!("apr_{n:012}"),
            reason: None,
            at_ms: self.clock,
        }))
    }

    /// The steps of one execution after its submit.
    fn steps(&self, exe: &str) -> [Command; 3] {
        let at_ms = self.clock;
        [
            Command::ClaimExecution { execution_id: exe.into(), claim: "k".into(), node: None, at_ms },
            Command::DispatchExecution { execution_id: exe.into(), claim: "k".into(), at_ms },
            Command::FinishExecution {
                execution_id: exe.into(),
                claim: "k".into(),
                outcome: Outcome::Succeeded { sandbox: Some(format!("sbx-{exe}")) },
                at_ms,
            },
        ]
    }

    /// Submits and runs one execution to success.
    fn run(&mut self, kind: ExecutionKind, computer: &str) {
        let cmd = self.submit(kind, computer);
        let exe = self.must(cmd).expect("an execution id");
        for step in self.steps(&exe) {
            self.must(step);
        }
    }

    fn binding(&mut self, computer: &str) -> ToolBinding {
        let n = self.next();
        ToolBinding {
            id: format!("bnd_{n:012}"),
            bot_id: BOT.into(),
            computer_id: computer.into(),
            package_id: format!("pkg-{}", n % 97),
            version: "1.0.0".into(),
            sha256: format!("{n:064x}"),
            state: BindingState::Installing,
            tools: serde_json::Value::Null,
            error: None,
            created_at: self.clock,
            shared_uid: false,
        }
    }
}

fn token(id: &str, principal: Principal) -> Token {
    Token {
        id: id.into(),
        name: id.into(),
        hash: hash_secret(id),
        principal,
        read_only: false,
        computers: None,
        created_at: 1,
        revoked_at: None,
    }
}

fn computer_id(i: usize) -> String {
    format!("cmp_{i:08}")
}

/// The resident set of this process, bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn build(size: Size) -> World {
    let mut w = World::new();
    for i in 0..size.computers {
        w.run(ExecutionKind::Create, &computer_id(i));
    }
    // Pause/resume pairs, spread over the Computers, until the executions are there (an even
    // count leaves every Computer running, so every one keeps its plan entry).
    let mut left = size.executions.saturating_sub(size.computers);
    let mut i = 0;
    while left >= 2 {
        let c = computer_id(i % size.computers);
        w.run(ExecutionKind::Pause, &c);
        w.run(ExecutionKind::Resume, &c);
        left -= 2;
        i += 1;
    }
    let carriers = size.bindings.div_ceil(BINDINGS_PER_COMPUTER);
    for k in 0..carriers {
        let c = computer_id(k);
        w.must(Command::PutGrant {
            by: OWNER.into(),
            computer_id: c.clone(),
            bot_id: BOT.into(),
            at_ms: w.clock,
            allow_root: None,
            paths: None,
        });
        for _ in 0..BINDINGS_PER_COMPUTER.min(size.bindings - k * BINDINGS_PER_COMPUTER) {
            let b = w.binding(&c);
            let id = b.id.clone();
            w.must(Command::BindingReserve { by: BOT_TOKEN.into(), binding: b });
            w.must(Command::BindingSettle {
                binding_id: id,
                ready: true,
                tools: serde_json::json!([{"name": "echo"}]),
                error: None,
                shared_uid: false,
            });
        }
    }
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
    fn timed(times: &mut Vec<Duration>, w: &mut World, cmd: Command) -> Response {
        let t = Instant::now();
        let r = w.apply(cmd);
        times.push(t.elapsed());
        r
    }
    let mut round = 0usize;
    // Bindings installed by the mix go on a Computer of their own, below the store's cap.
    let spare = computer_id(size.computers - 1);
    w.must(Command::PutGrant {
        by: OWNER.into(),
        computer_id: spare.clone(),
        bot_id: BOT.into(),
        at_ms: w.clock,
        allow_root: None,
        paths: None,
    });
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
                owner: "mem_o".into(),
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
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    (at(0.50), at(0.99), times[times.len() - 1])
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
fn in_child(size: Size) -> Report {
    let exe = std::env::current_exe().expect("this program");
    let out = std::process::Command::new(exe)
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
    let full = Size {
        computers: (100_000.0 * fraction) as usize,
        executions: (1_000_000.0 * fraction) as usize,
        bindings: (10_000.0 * fraction) as usize,
    };
    let tenth = Size { computers: full.computers / 10, executions: full.executions / 10, bindings: full.bindings / 10 };
    println!("scale-bench: the state machine at {tenth:?} (baseline) and {full:?}");
    let mut rows = Vec::new();
    for (name, size) in [("tenth", tenth), ("full", full)] {
        let r = in_child(size);
        println!(
            "{name:>5}: {} executions, {} plan entries, {} bindings; built in {:.1?}; state {:.0} MiB RSS; \
             apply p50 {:.1?} p99 {:.1?} max {:.1?}; snapshot {:.0} MiB, built in {:.2?}, decoded and indexed in {:.2?}",
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
    let (a, b) = (&rows[0], &rows[1]);
    let ratio = |x: Duration, y: Duration| y.as_secs_f64() / x.as_secs_f64().max(1e-9);
    println!(
        "full / tenth: apply p50 {:.2}x, p99 {:.2}x (goal at most 2x); snapshot {:.1}x; decode {:.1}x; RSS {:.1}x",
        ratio(a.p50, b.p50),
        ratio(a.p99, b.p99),
        b.snapshot_bytes as f64 / a.snapshot_bytes.max(1) as f64,
        ratio(a.snapshot_decode, b.snapshot_decode),
        b.rss as f64 / a.rss.max(1) as f64,
    );
    // Three nodes, each with its state and two snapshot copies (the current file and one being
    // built or received), plus the serialized bytes of a build in flight.
    let three = 3.0 * (b.rss as f64 + 3.0 * b.snapshot_bytes as f64) / (1u64 << 30) as f64;
    println!("three nodes at full size need about {three:.1} GiB (goal: fit in 24 GiB)");
}
