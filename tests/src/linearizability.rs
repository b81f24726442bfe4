//! A linearizability checker for histories of lifecycle executions, and the recorder of such
//! histories.
//!
//! Shape: a [`History`] records operations (invocation time, and completion time with the answer,
//! or none when the answer was lost); [`check`] partitions them per object (one command key) and
//! searches each partition depth-first for a linearization, as Wing & Gong's algorithm with the
//! memo of Lowe and Porcupine: at each step only a minimal operation may go next (none of the
//! operations not yet placed completed before it was invoked), the [`Model`] must accept it, and
//! every (set of operations placed, model state) reached is remembered so it is never explored
//! twice. An operation whose answer was lost completes at +infinity: it may have taken effect at
//! any time after its invocation, or (placed last) not at all, and any answer is accepted.
//!
//! The model of one command key ([`Lifecycle`]): absent, or (execution id, stage). A submit
//! creates the execution (`pending`) when absent, else answers the existing one; either way it
//! reports a stage, read after a barrier. A read answers the current stage. Stages move on by
//! themselves (the driver) and only forward: `pending → running → outcome_unknown`, any of those
//! `→ succeeded | failed`, nothing after `succeeded` or `failed`; so an observed stage is legal
//! iff it is reachable from the last one, which becomes the state. A read answering 404 is legal
//! only while the key has no execution (or one with another id); a refused submit (4xx: nothing
//! stored) only while the key has none.

use std::collections::BTreeMap;
use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Instant;

/// A sequential specification: which states may follow an operation with its answer.
pub trait Model {
    /// The state of one object.
    type State: Clone + Eq + Hash;
    /// What was asked.
    type Input;
    /// What was answered.
    type Output;
    /// The state before any operation.
    fn init(&self) -> Self::State;
    /// The states that may follow `input` answered `output` (`None`: the answer was lost, any is
    /// fine) in `state`; empty when the answer is impossible there.
    fn step(&self, state: &Self::State, input: &Self::Input, output: Option<&Self::Output>) -> Vec<Self::State>;
}

/// One operation of a history.
#[derive(Debug, Clone)]
pub struct Operation<I, O> {
    /// The object it acts on (operations on different objects never constrain each other).
    pub object: String,
    /// When it was invoked (µs since the history began).
    pub invoke: u64,
    /// When it completed and what it answered; `None` when the answer was lost.
    pub end: Option<(u64, O)>,
    /// What was asked.
    pub input: I,
}

impl<I, O> Operation<I, O> {
    fn end_time(&self) -> u64 {
        self.end.as_ref().map_or(u64::MAX, |(t, _)| *t)
    }
}

/// The result of a check.
#[derive(Debug)]
pub struct Verdict<I, O> {
    /// Operations checked.
    pub operations: usize,
    /// Objects (partitions) checked.
    pub objects: usize,
    /// The objects with no linearization, with their operations in invocation order.
    pub illegal: Vec<(String, Vec<Operation<I, O>>)>,
    /// Objects whose search gave up (more than [`SEARCH_BUDGET`] states), undecided.
    pub undecided: Vec<String>,
}

/// The most states one object's search may explore before it gives up.
pub const SEARCH_BUDGET: usize = 2_000_000;

/// Checks every object of `history` against `model`.
pub fn check<M: Model>(model: &M, history: &[Operation<M::Input, M::Output>]) -> Verdict<M::Input, M::Output>
where
    M::Input: Clone,
    M::Output: Clone,
{
    type Ops<'a, M> = Vec<&'a Operation<<M as Model>::Input, <M as Model>::Output>>;
    let mut objects: BTreeMap<&str, Ops<M>> = BTreeMap::new();
    for op in history {
        objects.entry(op.object.as_str()).or_default().push(op);
    }
    let mut verdict =
        Verdict { operations: history.len(), objects: objects.len(), illegal: Vec::new(), undecided: Vec::new() };
    for (object, mut ops) in objects {
        ops.sort_by_key(|o| o.invoke);
        match Search::new(model, &ops).run() {
            Some(true) => {}
            Some(false) => verdict.illegal.push((object.to_string(), ops.into_iter().cloned().collect())),
            None => verdict.undecided.push(object.to_string()),
        }
    }
    verdict
}

/// A set of operation indices.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn flip(&mut self, i: usize) {
        self.0[i / 64] ^= 1 << (i % 64);
    }
}

/// The depth-first search over one object's operations.
struct Search<'a, M: Model> {
    model: &'a M,
    ops: &'a [&'a Operation<M::Input, M::Output>],
    seen: HashSet<(Bits, M::State)>,
}

impl<'a, M: Model> Search<'a, M> {
    fn new(model: &'a M, ops: &'a [&'a Operation<M::Input, M::Output>]) -> Self {
        Search { model, ops, seen: HashSet::new() }
    }

    /// `Some(linearizable)`, or `None` when the budget ran out.
    fn run(mut self) -> Option<bool> {
        let mut done = Bits::new(self.ops.len());
        let init = self.model.init();
        self.place(&mut done, &init, self.ops.len())
    }

    /// Tries each minimal operation not yet placed as the next one.
    fn place(&mut self, done: &mut Bits, state: &M::State, left: usize) -> Option<bool> {
        if left == 0 {
            return Some(true);
        }
        let open = || (0..self.ops.len()).filter(|i| !done.has(*i));
        // An operation is minimal when no open one completed before it was invoked.
        let first_end = open().map(|i| self.ops[i].end_time()).min().unwrap_or(u64::MAX);
        let minimal: Vec<usize> = open().filter(|i| self.ops[*i].invoke <= first_end).collect();
        for i in minimal {
            let op = self.ops[i];
            for next in self.model.step(state, &op.input, op.end.as_ref().map(|(_, o)| o)) {
                done.flip(i);
                if self.seen.len() >= SEARCH_BUDGET {
                    return None;
                }
                if self.seen.insert((done.clone(), next.clone())) && self.place(done, &next, left - 1)? {
                    return Some(true);
                }
                done.flip(i);
            }
        }
        Some(false)
    }
}

/// An execution's stage, as receipts name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Stored, not claimed.
    Pending,
    /// Claimed by a driver.
    Running,
    /// Sent, answer lost: waits for a decision.
    OutcomeUnknown,
    /// Done.
    Succeeded,
    /// Failed.
    Failed,
}

impl Stage {
    /// The stage of a receipt's `state`.
    pub fn parse(s: &str) -> Option<Stage> {
        Some(match s {
            "pending" => Stage::Pending,
            "running" => Stage::Running,
            "outcome_unknown" => Stage::OutcomeUnknown,
            "succeeded" => Stage::Succeeded,
            "failed" => Stage::Failed,
            _ => return None,
        })
    }

    /// Whether an execution at `self` may later be seen at `to` (itself included).
    pub fn reaches(self, to: Stage) -> bool {
        use Stage::*;
        self == to
            || match self {
                Pending => true,
                Running => matches!(to, OutcomeUnknown | Succeeded | Failed),
                OutcomeUnknown => matches!(to, Succeeded | Failed),
                Succeeded | Failed => false,
            }
    }

    /// Whether nothing follows it.
    pub fn is_final(self) -> bool {
        matches!(self, Stage::Succeeded | Stage::Failed)
    }
}

/// A lifecycle operation on one command key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// `POST` of a lifecycle command with the key (create, pause, delete).
    Submit,
    /// `GET /v1/executions/:id`.
    Read(String),
}

/// A lifecycle operation's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A receipt: the execution and its stage (202 to a submit, 200 to a read).
    Execution(String, Stage),
    /// 404 to a read.
    NotFound,
    /// A submit refused with nothing stored (a 4xx: the Computer's state, a reused key).
    Refused,
}

/// What one command key holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyState {
    /// No execution yet.
    Absent,
    /// An execution (its id is `None` while only a submit whose answer was lost made it) at the
    /// last stage observed.
    Exists(Option<String>, Stage),
}

/// The model of one command key (see the module doc).
pub struct Lifecycle;

impl Model for Lifecycle {
    type State = KeyState;
    type Input = Input;
    type Output = Output;

    fn init(&self) -> KeyState {
        KeyState::Absent
    }

    fn step(&self, state: &KeyState, input: &Input, output: Option<&Output>) -> Vec<KeyState> {
        use KeyState::*;
        // Is `(id, stage)` what this key may show now? Then it is the new state.
        let observe = |id: &str, stage: Stage| match state {
            Absent => None,
            Exists(known, last) => (known.as_deref().is_none_or(|k| k == id) && last.reaches(stage))
                .then(|| Exists(Some(id.to_string()), stage)),
        };
        let next = match (input, output) {
            (Input::Submit, None) => Some(match state {
                Absent => Exists(None, Stage::Pending),
                s => s.clone(),
            }),
            (Input::Submit, Some(Output::Execution(id, stage))) => match state {
                Absent => Some(Exists(Some(id.clone()), *stage)),
                _ => observe(id, *stage),
            },
            (Input::Submit, Some(Output::Refused | Output::NotFound)) => (*state == Absent).then_some(Absent),
            (Input::Read(_), None) => Some(state.clone()),
            (Input::Read(asked), Some(Output::Execution(id, stage))) => {
                (asked == id).then(|| observe(id, *stage)).flatten()
            }
            // An execution made by a lost submit may or may not be the one asked for: allowed.
            (Input::Read(asked), Some(Output::NotFound | Output::Refused)) => match state {
                Exists(Some(id), _) if id == asked => None,
                s => Some(s.clone()),
            },
        };
        next.into_iter().collect()
    }
}

/// A lifecycle history being recorded by concurrent clients.
pub struct History {
    start: Instant,
    ops: Mutex<Vec<Operation<Input, Output>>>,
}

impl Default for History {
    fn default() -> Self {
        History { start: Instant::now(), ops: Mutex::new(Vec::new()) }
    }
}

impl History {
    /// Now, in µs since the history began: take it before sending a request.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// Records an operation invoked at `invoke` whose answer, if any, arrived just now.
    pub fn record(&self, object: &str, input: Input, invoke: u64, output: Option<Output>) {
        let end = output.map(|o| (self.now(), o));
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).push(Operation {
            object: object.to_string(),
            invoke,
            end,
            input,
        });
    }

    /// The operations recorded so far.
    pub fn operations(&self) -> Vec<Operation<Input, Output>> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl fmt::Display for Operation<Input, Output> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |us: u64| us as f64 / 1000.0;
        let what = match &self.input {
            Input::Submit => "submit".to_string(),
            Input::Read(id) => format!("read {id}"),
        };
        match &self.end {
            Some((t, o)) => write!(f, "[{:.1} ms, {:.1} ms] {what} -> {o:?}", ms(self.invoke), ms(*t)),
            None => write!(f, "[{:.1} ms, lost] {what}", ms(self.invoke)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operation on object `k` over `[a, b]` (b = None: the answer was lost).
    fn op(a: u64, b: Option<u64>, input: Input, output: Option<Output>) -> Operation<Input, Output> {
        Operation { object: "k".into(), invoke: a, end: b.zip(output), input }
    }
    fn submit(a: u64, b: u64, id: &str, s: Stage) -> Operation<Input, Output> {
        op(a, Some(b), Input::Submit, Some(Output::Execution(id.into(), s)))
    }
    fn read(a: u64, b: u64, id: &str, s: Stage) -> Operation<Input, Output> {
        op(a, Some(b), Input::Read(id.into()), Some(Output::Execution(id.into(), s)))
    }
    fn read_404(a: u64, b: u64, id: &str) -> Operation<Input, Output> {
        op(a, Some(b), Input::Read(id.into()), Some(Output::NotFound))
    }
    fn lost_submit(a: u64) -> Operation<Input, Output> {
        op(a, None, Input::Submit, None)
    }
    fn linearizable(h: &[Operation<Input, Output>]) -> bool {
        let v = check(&Lifecycle, h);
        assert!(v.undecided.is_empty());
        v.illegal.is_empty()
    }
    use Stage::*;

    #[test]
    fn stages_only_move_forward() {
        assert!(Pending.reaches(Succeeded) && Running.reaches(OutcomeUnknown) && OutcomeUnknown.reaches(Failed));
        assert!(!Running.reaches(Pending) && !Succeeded.reaches(Failed) && !OutcomeUnknown.reaches(Running));
        assert!(Succeeded.reaches(Succeeded));
    }

    #[test]
    fn sequential_progress_passes() {
        let h = [
            submit(0, 10, "x", Pending),
            read(20, 30, "x", Running),
            read(40, 50, "x", Succeeded),
            read(60, 70, "x", Succeeded),
        ];
        assert!(linearizable(&h));
    }

    #[test]
    fn concurrent_submits_of_one_key_pass() {
        // Two clients, one key: both answered x, at stages that agree with some order.
        let h = [submit(0, 100, "x", Running), submit(5, 50, "x", Pending), read(110, 120, "x", Succeeded)];
        assert!(linearizable(&h));
    }

    #[test]
    fn overlapping_reads_may_see_either_stage() {
        // The read seeing `pending` overlaps the one seeing `succeeded`: it goes first.
        let h = [submit(0, 10, "x", Pending), read(20, 100, "x", Pending), read(30, 40, "x", Succeeded)];
        assert!(linearizable(&h));
    }

    #[test]
    fn a_lost_submit_and_its_retry_pass() {
        let h = [lost_submit(0), submit(50, 60, "x", Running), read(70, 80, "x", Succeeded)];
        assert!(linearizable(&h));
        // The lost one never took effect: also fine (placed last).
        let h = [lost_submit(0), read_404(10, 20, "x"), submit(50, 60, "x", Pending)];
        assert!(linearizable(&h));
    }

    #[test]
    fn a_404_concurrent_with_the_create_passes() {
        let h = [submit(0, 100, "x", Pending), read_404(10, 20, "x"), read(110, 120, "x", Running)];
        assert!(linearizable(&h));
    }

    #[test]
    fn a_refusal_before_any_execution_passes() {
        let h = [op(0, Some(10), Input::Submit, Some(Output::Refused)), submit(20, 30, "x", Pending)];
        assert!(linearizable(&h));
    }

    #[test]
    fn a_stage_seen_after_a_later_one_fails() {
        // A read sees `pending` after another read finished seeing `succeeded`.
        let h = [submit(0, 10, "x", Pending), read(20, 30, "x", Succeeded), read(40, 50, "x", Pending)];
        assert!(!linearizable(&h));
    }

    #[test]
    fn a_submit_answering_an_older_stage_fails() {
        let h = [submit(0, 10, "x", Running), submit(20, 30, "x", Pending)];
        assert!(!linearizable(&h));
    }

    #[test]
    fn two_execution_ids_for_one_key_fail() {
        assert!(!linearizable(&[submit(0, 10, "x", Pending), submit(20, 30, "y", Pending)]));
        // Concurrent submits too: whichever goes first, the other must answer its id.
        assert!(!linearizable(&[submit(0, 30, "x", Pending), submit(5, 25, "y", Pending)]));
    }

    #[test]
    fn a_404_after_an_acknowledged_create_fails() {
        let h = [submit(0, 10, "x", Pending), read_404(20, 30, "x")];
        assert!(!linearizable(&h));
        // Even after a lost submit and its retry.
        let h = [lost_submit(0), submit(5, 10, "x", Pending), read_404(20, 30, "x")];
        assert!(!linearizable(&h));
    }

    #[test]
    fn a_refusal_after_an_acknowledged_create_fails() {
        let h = [submit(0, 10, "x", Pending), op(20, Some(30), Input::Submit, Some(Output::Refused))];
        assert!(!linearizable(&h));
    }

    #[test]
    fn both_final_stages_fail() {
        let h = [submit(0, 10, "x", Pending), read(20, 30, "x", Succeeded), read(40, 50, "x", Failed)];
        assert!(!linearizable(&h));
    }

    #[test]
    fn objects_are_checked_apart() {
        let mut bad = [submit(0, 10, "x", Succeeded), read(20, 30, "x", Running)];
        for o in &mut bad {
            o.object = "bad".into();
        }
        let mut h = vec![submit(0, 10, "z", Pending), read(20, 30, "z", Running)];
        h.extend(bad);
        let v = check(&Lifecycle, &h);
        assert_eq!((v.operations, v.objects), (4, 2));
        assert_eq!(v.illegal.len(), 1);
        assert_eq!(v.illegal[0].0, "bad");
    }

    #[test]
    fn many_concurrent_reads() {
        // 15 overlapping reads of one key, then one after them all.
        let mut h = vec![submit(0, 10, "x", Pending)];
        for i in 0..15 {
            let s = [Pending, Running, Succeeded][i % 3];
            h.push(read(20 + i as u64, 1_000, "x", s));
        }
        h.push(read(2_000, 2_010, "x", Running));
        assert!(!linearizable(&h), "a read after all of them saw running after one saw succeeded");
        h.pop();
        assert!(linearizable(&h));
    }
}
