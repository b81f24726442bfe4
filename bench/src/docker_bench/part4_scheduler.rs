//! Part 4: the idle-pause scheduler's per-tick read, `State::plan_due`, against a full scan of
//! the plan, in this process.

use std::hint::black_box;
use std::time::Duration;
use std::time::Instant;

use anyhow::Result;
use anyhow::bail;
use computerd_bench::report::nearest_rank;
use computerd_raft::sm::Computer;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::PlanEntry;
use computerd_raft::sm::Source;
use computerd_raft::sm::State;
use serde::Serialize;

/// Part 4: Computers in the plan.
pub const PLANNED: usize = 100_000;
/// Part 4: how many pauses one scheduler tick asks for (`PAUSES_PER_TICK` in `actors/src/idle.rs`).
pub const PAUSES_PER_TICK: usize = 256;
/// Part 4: one sample repeats the call for at least this long and counts the mean.
const TICK_SAMPLE: Duration = Duration::from_millis(20);
/// Part 4: the planned Computers' `pauseAfter`, seconds.
const PAUSE_AFTER_SECS: u64 = 300;
/// Part 4: deadlines are this far apart (ms), in an order unrelated to the ids.
const DEADLINE_STEP_MS: u64 = 7;

/// Nearest-rank percentiles of part 4's per-call times, µs.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MicroSummary {
    pub n: usize,
    /// Calls per sample.
    pub iters: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl MicroSummary {
    fn of(mut ns: Vec<f64>, iters: u64) -> Self {
        ns.sort_by(f64::total_cmp);
        let at = |p: f64| nearest_rank(&ns, p).map_or(f64::NAN, |ns| ns / 1000.0);
        MicroSummary { n: ns.len(), iters, p50_us: at(0.50), p99_us: at(0.99), max_us: at(1.0) }
    }
}

/// Part 4 for one number of due Computers.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TickCase {
    pub planned: usize,
    pub due: usize,
    /// Computers one tick answers (at most [`PAUSES_PER_TICK`]).
    pub answered: usize,
    pub plan_due: MicroSummary,
    pub full_scan: MicroSummary,
}

impl TickCase {
    pub fn p50_ratio(&self) -> f64 {
        self.plan_due.p50_us / self.full_scan.p50_us
    }
    pub fn p99_ratio(&self) -> f64 {
        self.plan_due.p99_us / self.full_scan.p99_us
    }
}

/// A store with `n` running provider Computers in the idle-pause plan, as `set_computer_state`
/// leaves them: deadlines [`DEADLINE_STEP_MS`] apart from `base`, in an order unrelated to the
/// ids (a permutation), so the earliest deadlines are scattered over the id order. The `i`-th
/// earliest deadline is `base + i × DEADLINE_STEP_MS`.
fn planned_state(n: usize, base: u64) -> State {
    // A multiplier coprime with n makes `i -> i × m mod n` a permutation.
    let mut m = 7919 % n.max(2);
    while gcd(m, n) != 1 {
        m += 1;
    }
    let mut s = State::default();
    for i in 0..n {
        let id = format!("cmp_{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let rank = (i * m) % n;
        let deadline = base + rank as u64 * DEADLINE_STEP_MS;
        let c = Computer {
            id: id.clone(),
            name: format!("c{i}"),
            owner: "mem_bench".into(),
            shared: false,
            source: Source::Provider { provider: "cpp_bench".into(), template: None },
            desktop: false,
            pause_after: Some(PAUSE_AFTER_SECS),
            state: ComputerState::Running,
            sandbox: Some(format!("computerd-{id}")),
            active_execution: None,
            created_at: 1,
            agent_credential: None,
            link_generation: 1,
            link_node: Some(1),
            desktop_view: None,
            env: Default::default(),
            resources: None,
            metadata: Default::default(),
            egress: None,
            egress_denied_through: 0,
            egress_revision: 0,
            pooled: false,
        };
        let last_work = deadline - PAUSE_AFTER_SECS * 1000;
        s.computers.insert(id.clone(), c);
        s.plan_due.insert((deadline, id.clone()));
        s.plan.insert(id, PlanEntry { last_work, deadline, version: 1, failures: 0 });
    }
    s
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The baseline: what the scheduler would do without the deadline index: scan the whole plan
/// for deadlines at or before `now` (of Computers with no open execution) and answer the
/// `limit` earliest, in the same order as `plan_due`.
fn full_scan(s: &State, now: u64, limit: usize) -> Vec<(String, u64)> {
    let mut due: Vec<(u64, &String, u64)> = s
        .plan
        .iter()
        .filter(|(_, e)| e.deadline <= now)
        .filter(|(id, _)| s.computers.get(*id).is_some_and(|c| c.active_execution.is_none()))
        .map(|(id, e)| (e.deadline, id, e.version))
        .collect();
    if due.len() > limit {
        due.select_nth_unstable(limit);
        due.truncate(limit);
    }
    due.sort_unstable();
    due.into_iter().map(|(_, id, v)| (id.clone(), v)).collect()
}

/// Calls per sample so that one sample lasts about [`TICK_SAMPLE`].
fn calibrate(mut f: impl FnMut() -> usize) -> u64 {
    let mut iters = 1u64;
    loop {
        let t0 = Instant::now();
        for _ in 0..iters {
            black_box(f());
        }
        let took = t0.elapsed();
        if took >= TICK_SAMPLE / 4 || iters >= 1 << 30 {
            let per = took.as_secs_f64() / iters as f64;
            return ((TICK_SAMPLE.as_secs_f64() / per.max(1e-9)) as u64).max(1);
        }
        iters *= 2;
    }
}

/// One sample: the mean time of one call over `iters` calls, ns.
fn sample_ns(iters: u64, mut f: impl FnMut() -> usize) -> f64 {
    let t0 = Instant::now();
    for _ in 0..iters {
        black_box(f());
    }
    t0.elapsed().as_nanos() as f64 / iters as f64
}

/// Part 4: `plan_due` against the full scan with 0, [`PAUSES_PER_TICK`] and every Computer due.
pub fn part_scheduler(planned: usize, samples: usize) -> Result<Vec<TickCase>> {
    let base: u64 = 1_800_000_000_000;
    let t0 = Instant::now();
    let s = planned_state(planned, base);
    eprintln!("  {} planned Computers built in {:.2} s", s.plan.len(), t0.elapsed().as_secs_f64());
    let mut cases = Vec::new();
    for due in [0, PAUSES_PER_TICK, planned] {
        // The `due`-th earliest deadline is base + (due - 1) × step.
        let now = if due == 0 { base - 1 } else { base + (due as u64 - 1) * DEADLINE_STEP_MS };
        let fast = s.plan_due(now, PAUSES_PER_TICK);
        let slow = full_scan(&s, now, PAUSES_PER_TICK);
        if fast != slow {
            bail!("with {due} due, plan_due and the full scan disagree ({} vs {} answered)", fast.len(), slow.len());
        }
        if fast.len() != due.min(PAUSES_PER_TICK) {
            bail!("with {due} due, plan_due answered {}", fast.len());
        }
        let fast_iters = calibrate(|| s.plan_due(black_box(now), PAUSES_PER_TICK).len());
        let slow_iters = calibrate(|| full_scan(&s, black_box(now), PAUSES_PER_TICK).len());
        let (mut fast_ns, mut slow_ns) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
        for _ in 0..samples {
            slow_ns.push(sample_ns(slow_iters, || full_scan(&s, black_box(now), PAUSES_PER_TICK).len()));
            fast_ns.push(sample_ns(fast_iters, || s.plan_due(black_box(now), PAUSES_PER_TICK).len()));
        }
        cases.push(TickCase {
            planned,
            due,
            answered: fast.len(),
            plan_due: MicroSummary::of(fast_ns, fast_iters),
            full_scan: MicroSummary::of(slow_ns, slow_iters),
        });
    }
    Ok(cases)
}
