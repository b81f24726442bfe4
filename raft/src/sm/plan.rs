//! The idle-pause plan, shared by all nodes through the store: per running provider Computer
//! with a `pauseAfter`, its last-work mark, its deadline and a version that changes with every
//! new mark. Nodes report work in batches ([`Command::ReportWork`]) and a call about to reach a
//! Computer near its deadline marks it at once ([`Command::WorkNow`]); the leader's scheduler
//! asks for a pause of a Computer whose deadline passed ([`Command::PlanPause`]), which becomes
//! an ordinary stored execution whose command key is derived from the plan version: asking
//! twice (a restart, a new leader) finds the same execution and never pauses twice.
//!
//! Time is the cluster's clock only (`State::clock`, the leader's stamps on the log entries):
//! a mark's time is the stamp minus the age the reporting node measured, so a node whose wall
//! clock lags or runs ahead moves no deadline.
//!
//! An idle pause never freezes work: its dispatch re-checks, at the commit point, that the plan
//! is still at the version it was scheduled at and its deadline passed, and is cancelled
//! (nothing sent) otherwise; a [`Command::WorkNow`] cancels one not yet dispatched. A pause that
//! fails moves its deadline back by a growing delay, so it is not asked for again at every tick
//! and cannot crowd out other Computers.
//!
//! An entry exists exactly while the Computer is `running` (entered and left in
//! `set_computer_state`); `due` indexes entries by deadline, so a scheduler tick costs the
//! number of due entries, not the size of the plan.
//!
//! [`Command::ReportWork`]: super::Command::ReportWork
//! [`Command::WorkNow`]: super::Command::WorkNow
//! [`Command::PlanPause`]: super::Command::PlanPause

use std::collections::BTreeSet;

use serde::Deserialize;
use serde::Serialize;

use super::model::ComputerState;
use super::model::Execution;
use super::model::ExecutionError;
use super::model::ExecutionKind;
use super::model::ExecutionState;
use super::model::Requester;
use super::model::Source;
use super::response::Reject;
use super::response::RejectKind;
use super::state::State;

/// The requester of executions the cluster starts by itself (idle pauses).
pub const SYSTEM: &str = "system";

/// The error kind of an idle pause cancelled before it was sent.
pub const CANCELLED: &str = "cancelled";

/// The delay after a first failed idle pause before it is asked for again; it doubles with
/// each further failure, up to [`PAUSE_RETRY_MAX_MS`].
pub const PAUSE_RETRY_FIRST_MS: u64 = 10_000;
/// The longest delay between two idle pauses of a Computer whose pauses fail.
pub const PAUSE_RETRY_MAX_MS: u64 = 15 * 60 * 1000;

/// One planned Computer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanEntry {
    /// The last time work was seen, unix ms.
    pub last_work: u64,
    /// When it pauses without more work, unix ms.
    pub deadline: u64,
    /// Changes with every mark; names the pause execution.
    pub version: u64,
    /// Idle pauses that failed since the Computer started running.
    #[serde(default)]
    pub failures: u32,
}

/// The command key of the idle pause of `computer_id` at plan `version`.
pub fn pause_key(computer_id: &str, version: u64) -> String {
    format!("idle-pause:{computer_id}:{version}")
}

/// How long after its `failures`-th failed idle pause a Computer is asked to pause again.
pub fn retry_after_ms(failures: u32) -> u64 {
    let doublings = failures.saturating_sub(1).min(20);
    PAUSE_RETRY_FIRST_MS.saturating_mul(1 << doublings).min(PAUSE_RETRY_MAX_MS)
}

/// The message of a dispatch refused because the idle pause was cancelled.
const CANCELLED_DISPATCH: &str = "the idle pause was cancelled: work was seen since it was scheduled; nothing was sent";

/// Whether `exe` is an idle pause the cluster started.
pub fn is_idle_pause(exe: &Execution) -> bool {
    exe.kind == ExecutionKind::Pause && exe.requester.token_id == SYSTEM
}

/// The refusal a dispatch of a cancelled idle pause answers (every time it is asked).
pub(crate) fn cancelled_dispatch() -> Reject {
    Reject::new(RejectKind::Conflict, CANCELLED_DISPATCH)
}

impl State {
    /// The time plan changes are read against: the cluster's clock once entries are stamped;
    /// before that (logs of older builds), the command's own time.
    fn plan_now(&self, at: u64) -> u64 {
        if self.clock > 0 { self.clock } else { at }
    }

    /// Enters a Computer that started running into the plan (if it can pause by itself).
    pub(crate) fn plan_enter(&mut self, computer_id: &str, at: u64) {
        let at = self.plan_now(at);
        let Some(c) = self.computers.get(computer_id) else { return };
        let Some(after) = c.pause_after else { return };
        if c.source == Source::Paired {
            return;
        }
        self.plan_leave(computer_id);
        let entry = PlanEntry {
            last_work: at,
            deadline: at.saturating_add(after.saturating_mul(1000)),
            version: 1,
            failures: 0,
        };
        self.plan_due.insert((entry.deadline, computer_id.to_string()));
        self.plan.insert(computer_id.to_string(), entry);
    }

    /// Takes a Computer out of the plan.
    pub(crate) fn plan_leave(&mut self, computer_id: &str) {
        if let Some(e) = self.plan.remove(computer_id) {
            self.plan_due.remove(&(e.deadline, computer_id.to_string()));
        }
    }

    /// Work was seen on `id` at `at`: a later mark moves its deadline and its version. Older
    /// marks, and Computers not in the plan, change nothing.
    fn mark(&mut self, id: &str, at: u64) {
        let Some(after) = self.computers.get(id).and_then(|c| c.pause_after) else { return };
        let Some(e) = self.plan.get_mut(id) else { return };
        if at <= e.last_work {
            return;
        }
        let old = e.deadline;
        e.last_work = at;
        e.deadline = at.saturating_add(after.saturating_mul(1000));
        e.version += 1;
        let new = e.deadline;
        self.plan_due.remove(&(old, id.to_string()));
        self.plan_due.insert((new, id.to_string()));
    }

    /// Work was seen on these Computers at these times, by the reporting nodes' wall clocks
    /// (entries of older builds). Once the log is stamped, no mark is believed past the
    /// cluster's clock.
    pub(crate) fn report_activity(&mut self, marks: &[(String, u64)]) {
        for (id, at) in marks {
            let at = if self.clock > 0 { (*at).min(self.clock) } else { *at };
            self.mark(id, at);
        }
    }

    /// Work was seen on these Computers this many ms before the entry was stamped.
    pub(crate) fn report_work(&mut self, ages: &[(String, u64)]) {
        for (id, age) in ages {
            self.mark(id, self.clock.saturating_sub(*age));
        }
    }

    /// A call is about to reach the Computer: marks it now; cancels an idle pause not yet
    /// sent; refuses (naming it) while a pause that was sent holds the Computer, and while it is
    /// paused, so the call waits and resumes it.
    pub(crate) fn work_now(&mut self, computer_id: &str) -> Result<(), Reject> {
        let c = self.computers.get(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        let active = c.active_execution.as_ref().and_then(|e| self.executions.get(e));
        if let Some(exe) = active.filter(|e| e.kind == ExecutionKind::Pause && e.dispatched_at.is_some()) {
            return Err(Reject {
                kind: RejectKind::ComputerConflict,
                message: format!("pause {} of this computer was sent: wait for it, then resume", exe.id),
                execution_id: Some(exe.id.clone()),
            });
        }
        if c.state == ComputerState::Paused {
            return Err(Reject::new(RejectKind::Conflict, "the computer is paused"));
        }
        let cancel = active.filter(|e| is_idle_pause(e) && e.is_open()).map(|e| e.id.clone());
        let now = self.clock;
        if let Some(exe) = cancel {
            self.cancel_idle_pause(&exe, "a call came before the pause was sent", now);
        }
        self.mark(computer_id, now);
        Ok(())
    }

    /// The Computers whose deadline is at or before `now`, with the plan version seen, at most
    /// `limit` of them.
    pub fn plan_due(&self, now: u64, limit: usize) -> Vec<(String, u64)> {
        self.plan_due
            .range(..(now.saturating_add(1), String::new()))
            .filter_map(|(_, id)| {
                let c = self.computers.get(id)?;
                let version = self.plan.get(id)?.version;
                c.active_execution.is_none().then(|| (id.clone(), version))
            })
            .take(limit)
            .collect()
    }

    /// The first deadline after `now`, if any (the scheduler wakes for it).
    pub fn plan_next(&self, now: u64) -> Option<u64> {
        self.plan_due.range((now.saturating_add(1), String::new())..).next().map(|(d, _)| *d)
    }

    /// Stores the idle pause of a Computer whose deadline passed at plan `version`. Answers the
    /// execution id; the same (Computer, version) answers the same execution.
    pub(crate) fn plan_pause(
        &mut self,
        computer_id: &str,
        version: u64,
        execution_id: &str,
        at: u64,
    ) -> Result<String, Reject> {
        let key = pause_key(computer_id, version);
        let scope = format!("{SYSTEM}\n{key}");
        if let Some(existing) = self.execution_keys.get(&scope) {
            return Ok(existing.clone());
        }
        let entry = self
            .plan
            .get(computer_id)
            .copied()
            .ok_or_else(|| Reject::new(RejectKind::Conflict, "the computer is not in the idle plan"))?;
        if entry.version != version {
            return Err(Reject::new(RejectKind::Conflict, "work was seen since: the plan moved on"));
        }
        if entry.deadline > self.plan_now(at) {
            return Err(Reject::new(RejectKind::Conflict, "the deadline has not passed"));
        }
        let c = self.computers.get(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        if c.state != ComputerState::Running {
            return Err(Reject::new(RejectKind::Conflict, "the computer is not running"));
        }
        if let Some(active) = &c.active_execution {
            return Err(Reject {
                kind: RejectKind::ComputerConflict,
                message: format!("execution {active} is still running on this computer"),
                execution_id: Some(active.clone()),
            });
        }
        if self.executions.contains_key(execution_id) {
            return Err(Reject::new(RejectKind::Conflict, "execution id collision"));
        }
        let mut exe = Execution::pending(
            execution_id,
            &key,
            &format!("idle-pause:{version}"),
            ExecutionKind::Pause,
            computer_id,
            at,
        );
        exe.requester = Requester { token_id: SYSTEM.into(), member_id: SYSTEM.into(), bot_id: None };
        exe.plan_version = Some(version);
        if let Some(c) = self.computers.get_mut(computer_id) {
            c.active_execution = Some(exe.id.clone());
        }
        self.execution_keys.insert(scope, exe.id.clone());
        self.executions.insert(exe.id.clone(), exe);
        self.index_execution(execution_id);
        self.push_event(
            at,
            "IdlePauseScheduled",
            computer_id,
            Some(execution_id),
            serde_json::json!({"planVersion": version, "lastWork": entry.last_work}),
        );
        Ok(execution_id.to_string())
    }

    /// Whether the idle pause `exe` may still be sent at `at`: the plan is at the version it
    /// was scheduled at, and that version's deadline passed by the cluster's clock.
    pub(crate) fn idle_pause_current(&self, exe: &Execution, at: u64) -> bool {
        let now = self.plan_now(at);
        self.plan.get(&exe.computer_id).is_some_and(|e| exe.plan_version == Some(e.version) && e.deadline <= now)
    }

    /// Ends an idle pause that was not sent: failed with the error kind [`CANCELLED`], the
    /// Computer free. An entry still at the pause's version (one scheduled before versions were
    /// recorded) moves on, so the next pause is a new execution.
    pub(crate) fn cancel_idle_pause(&mut self, exe_id: &str, why: &str, at: u64) {
        let Some(e) = self.executions.get_mut(exe_id) else { return };
        e.state = ExecutionState::Failed;
        e.finished_at = Some(at);
        e.error = Some(ExecutionError { kind: CANCELLED.into(), message: why.to_string() });
        let (computer_id, version) = (e.computer_id.clone(), e.plan_version);
        self.index_execution(exe_id);
        if let Some(c) = self.computers.get_mut(&computer_id)
            && c.active_execution.as_deref() == Some(exe_id)
        {
            c.active_execution = None;
        }
        if let Some(p) = self.plan.get_mut(&computer_id)
            && version.is_none_or(|v| v == p.version)
        {
            p.version += 1;
        }
        self.push_event(
            at,
            "ExecutionFinished",
            &computer_id,
            Some(exe_id),
            serde_json::json!({"kind": ExecutionKind::Pause, "state": "failed", "error": CANCELLED}),
        );
        self.push_event(at, "IdlePauseCancelled", &computer_id, Some(exe_id), serde_json::json!({"reason": why}));
    }

    /// An idle pause failed (the Computer still runs): its next one waits a growing delay, at a
    /// new version, so the scheduler does not ask for it again at every tick.
    pub(crate) fn idle_pause_failed(&mut self, computer_id: &str, at: u64) {
        let now = self.plan_now(at);
        let Some(e) = self.plan.get_mut(computer_id) else { return };
        let old = e.deadline;
        e.failures = e.failures.saturating_add(1);
        e.deadline = old.max(now.saturating_add(retry_after_ms(e.failures)));
        e.version += 1;
        let new = e.deadline;
        self.plan_due.remove(&(old, computer_id.to_string()));
        self.plan_due.insert((new, computer_id.to_string()));
    }
}

/// The deadline index: (deadline, computer id).
pub type DueIndex = BTreeSet<(u64, String)>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::Outcome;
    use crate::sm::Request;
    use crate::sm::Response;
    use crate::sm::model::Computer;
    use crate::sm::testing::ok;
    use crate::sm::testing::rejected;

    fn computer(id: &str, after: Option<u64>) -> Computer {
        Computer {
            id: id.into(),
            name: "c".into(),
            owner: "mem_o".into(),
            shared: false,
            source: Source::Provider { provider: "cpp_1".into(), template: None },
            desktop: false,
            pause_after: after,
            state: ComputerState::Starting,
            sandbox: Some("sbx".into()),
            active_execution: None,
            created_at: 1,
            agent_credential: None,
            link_generation: 0,
            link_node: None,
            desktop_view: None,
            env: Default::default(),
            resources: None,
            metadata: Default::default(),
            egress: None,
            egress_denied_through: 0,
            egress_revision: 0,
            pooled: false,
        }
    }

    fn running(after: Option<u64>, at: u64) -> State {
        let mut s = State::default();
        add_running(&mut s, "cmp_1", after, at);
        s
    }

    fn add_running(s: &mut State, id: &str, after: Option<u64>, at: u64) {
        s.computers.insert(id.into(), computer(id, after));
        s.set_computer_state(id, ComputerState::Running, at);
    }

    /// Applies `cmd` as the leader stamped it at `ms`.
    fn at(s: &mut State, ms: u64, cmd: Command) -> Response {
        s.apply_request(&Request::new(cmd).stamped(ms))
    }

    fn plan_pause(id: &str, version: u64, exe: &str) -> Command {
        // The proposer's own time is far off: only the stamp counts.
        Command::PlanPause { computer_id: id.into(), version, execution_id: exe.into(), at_ms: 1 }
    }

    fn claim(exe: &str) -> Command {
        Command::ClaimExecution { execution_id: exe.into(), claim: "clm".into(), node: None, at_ms: 1 }
    }

    fn dispatch(exe: &str) -> Command {
        Command::DispatchExecution { execution_id: exe.into(), claim: "clm".into(), at_ms: 1 }
    }

    fn finish(exe: &str, outcome: Outcome) -> Command {
        Command::FinishExecution { execution_id: exe.into(), claim: "clm".into(), outcome, at_ms: 1 }
    }

    fn not_sent() -> Outcome {
        Outcome::Failed { error: ExecutionError { kind: "not_sent".into(), message: "docker is down".into() } }
    }

    /// A stamped world: `cmp_1` running since 1_000 with `pauseAfter: 10`.
    fn stamped() -> State {
        let mut s = State { clock: 1_000, ..State::default() };
        add_running(&mut s, "cmp_1", Some(10), 1);
        s
    }

    #[test]
    fn a_running_computer_is_planned_and_work_moves_its_deadline() {
        let mut s = running(Some(10), 1_000);
        assert_eq!(s.plan["cmp_1"], PlanEntry { last_work: 1_000, deadline: 11_000, version: 1, failures: 0 });
        assert!(s.plan_due(10_999, 10).is_empty());
        assert_eq!(s.plan_due(11_000, 10), vec![("cmp_1".to_string(), 1)]);
        s.report_activity(&[("cmp_1".into(), 5_000), ("cmp_nope".into(), 9_000)]);
        assert_eq!(s.plan["cmp_1"], PlanEntry { last_work: 5_000, deadline: 15_000, version: 2, failures: 0 });
        s.report_activity(&[("cmp_1".into(), 4_000)]);
        assert_eq!(s.plan["cmp_1"].version, 2, "an older mark changes nothing");
        assert!(s.plan_due(14_999, 10).is_empty());
        assert_eq!(s.plan_due.len(), 1, "the index holds one entry per planned computer");
        s.set_computer_state("cmp_1", ComputerState::Paused, 20_000);
        assert!(s.plan.is_empty() && s.plan_due.is_empty());
        assert!(running(None, 1_000).plan.is_empty(), "pauseAfter null is never planned");
    }

    #[test]
    fn one_pause_per_plan_version() {
        let mut s = running(Some(10), 1_000);
        let early = s.plan_pause("cmp_1", 1, "exe_a", 10_999);
        assert_eq!(early.map_err(|r| r.kind), Err(RejectKind::Conflict));
        let stale = s.plan_pause("cmp_1", 7, "exe_a", 11_000);
        assert_eq!(stale.map_err(|r| r.kind), Err(RejectKind::Conflict));
        assert!(s.executions.is_empty(), "a refusal stores nothing");
        assert_eq!(s.plan_pause("cmp_1", 1, "exe_a", 11_000).ok().as_deref(), Some("exe_a"));
        assert_eq!(s.plan_pause("cmp_1", 1, "exe_b", 12_000).ok().as_deref(), Some("exe_a"), "asked again: same");
        assert_eq!(s.executions.len(), 1);
        let exe = &s.executions["exe_a"];
        assert_eq!(
            (exe.kind, exe.state, exe.command_key.as_str()),
            (ExecutionKind::Pause, ExecutionState::Pending, "idle-pause:cmp_1:1")
        );
        assert_eq!(s.computers["cmp_1"].active_execution.as_deref(), Some("exe_a"));
        assert!(s.plan_due(20_000, 10).is_empty(), "a computer with a running execution is not due");
    }

    #[test]
    fn the_plan_reads_only_the_leaders_stamps() {
        let mut s = stamped();
        assert_eq!(s.plan["cmp_1"].deadline, 11_000, "entered at the cluster's clock, not the command's time");
        // A node whose clock runs ahead cannot keep the computer awake past the leader's now.
        ok(at(&mut s, 2_000, Command::ReportActivity { marks: vec![("cmp_1".into(), 900_000)] }));
        assert_eq!(s.plan["cmp_1"].last_work, 2_000);
        // Ages: dated by the stamp.
        ok(at(&mut s, 5_000, Command::ReportWork { ages: vec![("cmp_1".into(), 1_500)] }));
        assert_eq!((s.plan["cmp_1"].last_work, s.plan["cmp_1"].deadline), (3_500, 13_500));
        // Entries may append out of stamp order, and a new leader's clock may lag: time stays.
        ok(at(&mut s, 4_000, Command::ReportWork { ages: vec![("cmp_1".into(), 0)] }));
        assert_eq!((s.clock, s.plan["cmp_1"].last_work), (5_000, 5_000), "the clock never goes back");
        // PlanPause is judged against the stamp, whatever the proposer's at_ms.
        let early = rejected(at(&mut s, 14_999, plan_pause("cmp_1", 4, "exe_a")));
        assert_eq!(early.message, "the deadline has not passed");
        let late = Command::PlanPause {
            computer_id: "cmp_1".into(),
            version: 4,
            execution_id: "exe_a".into(),
            at_ms: 1 << 50,
        };
        assert_eq!(rejected(at(&mut s, 14_999, late)).message, "the deadline has not passed");
        assert_eq!(ok(at(&mut s, 15_000, plan_pause("cmp_1", 4, "exe_a"))).as_deref(), Some("exe_a"));
        // Replayed on another replica: the same state.
        let mut t = stamped();
        let log = [
            (2_000, Command::ReportActivity { marks: vec![("cmp_1".into(), 900_000)] }),
            (5_000, Command::ReportWork { ages: vec![("cmp_1".into(), 1_500)] }),
            (4_000, Command::ReportWork { ages: vec![("cmp_1".into(), 0)] }),
            (15_000, plan_pause("cmp_1", 4, "exe_a")),
        ];
        for (ms, cmd) in log {
            at(&mut t, ms, cmd);
        }
        assert_eq!(t.plan, s.plan);
        assert_eq!(t.executions, s.executions);
    }

    #[test]
    fn a_stale_idle_pause_is_cancelled_at_dispatch_and_nothing_is_sent() {
        let mut s = stamped();
        ok(at(&mut s, 11_000, plan_pause("cmp_1", 1, "exe_a")));
        ok(at(&mut s, 11_001, claim("exe_a")));
        // Work reported after the pause was scheduled (it was in flight).
        ok(at(&mut s, 11_050, Command::ReportWork { ages: vec![("cmp_1".into(), 60)] }));
        let r = rejected(at(&mut s, 11_100, dispatch("exe_a")));
        assert_eq!(r.kind, RejectKind::Conflict);
        let e = &s.executions["exe_a"];
        assert_eq!((e.state, e.dispatched_at), (ExecutionState::Failed, None), "nothing was sent");
        assert_eq!(e.error.as_ref().map(|e| e.kind.as_str()), Some(CANCELLED));
        assert_eq!(s.computers["cmp_1"].active_execution, None, "the computer is free");
        assert_eq!(s.computers["cmp_1"].state, ComputerState::Running);
        assert_eq!(s.plan["cmp_1"].deadline, 20_990, "the new deadline stands");
        assert!(s.events.iter().any(|e| e.kind == "IdlePauseCancelled"));
        // Asked again (a lost answer): the same refusal, nothing changes.
        let before = s.clone();
        assert_eq!(rejected(at(&mut s, 11_200, dispatch("exe_a"))), r);
        assert_eq!(s.executions, before.executions);
        // The next pause is a new execution at the new version.
        let v = s.plan["cmp_1"].version;
        assert_eq!(ok(at(&mut s, 20_990, plan_pause("cmp_1", v, "exe_b"))).as_deref(), Some("exe_b"));
        ok(at(&mut s, 20_991, claim("exe_b")));
        ok(at(&mut s, 20_992, dispatch("exe_b")));
        assert_eq!(s.executions["exe_b"].dispatched_at, Some(1), "a current pause is sent");
    }

    #[test]
    fn work_now_cancels_a_pending_idle_pause_and_waits_for_a_sent_one() {
        let mut s = stamped();
        ok(at(&mut s, 11_000, plan_pause("cmp_1", 1, "exe_a")));
        ok(at(&mut s, 11_010, Command::WorkNow { computer_id: "cmp_1".into() }));
        assert_eq!(s.executions["exe_a"].error.as_ref().map(|e| e.kind.as_str()), Some(CANCELLED));
        assert_eq!(s.computers["cmp_1"].active_execution, None);
        assert_eq!(s.plan["cmp_1"].deadline, 21_010);
        // The driver, claiming or dispatching it now, is refused: nothing is sent.
        assert!(matches!(at(&mut s, 11_020, claim("exe_a")), Response::Rejected(_)));
        assert!(s.plan_due(20_000, 10).is_empty());

        let v = s.plan["cmp_1"].version;
        ok(at(&mut s, 21_010, plan_pause("cmp_1", v, "exe_b")));
        ok(at(&mut s, 21_011, claim("exe_b")));
        ok(at(&mut s, 21_012, dispatch("exe_b")));
        let before = s.clone();
        let r = rejected(at(&mut s, 21_013, Command::WorkNow { computer_id: "cmp_1".into() }));
        assert_eq!((r.kind, r.execution_id.as_deref()), (RejectKind::ComputerConflict, Some("exe_b")));
        assert_eq!(s.plan, before.plan, "a refusal changes nothing");
        ok(at(&mut s, 21_500, finish("exe_b", Outcome::Succeeded { sandbox: None })));
        assert_eq!(s.computers["cmp_1"].state, ComputerState::Paused);
        let r = rejected(at(&mut s, 21_600, Command::WorkNow { computer_id: "cmp_1".into() }));
        assert_eq!(r.kind, RejectKind::Conflict, "paused: the call resumes it first");
    }

    #[test]
    fn a_failed_idle_pause_backs_off_and_never_starves_the_others() {
        let mut s = stamped();
        ok(at(&mut s, 11_000, plan_pause("cmp_1", 1, "exe_0")));
        ok(at(&mut s, 11_001, claim("exe_0")));
        ok(at(&mut s, 11_002, dispatch("exe_0")));
        ok(at(&mut s, 11_003, finish("exe_0", not_sent())));
        let e = s.plan["cmp_1"];
        assert_eq!((e.failures, e.version, e.deadline), (1, 2, 11_003 + PAUSE_RETRY_FIRST_MS));
        assert!(s.plan_due(11_003 + PAUSE_RETRY_FIRST_MS - 1, 10).is_empty(), "not asked again at once");
        // It fails 300 times: each retry waits longer, up to the cap.
        let mut waits = Vec::new();
        for i in 1..300 {
            let (version, deadline) = (s.plan["cmp_1"].version, s.plan["cmp_1"].deadline);
            let exe = format!("exe_{i}");
            ok(at(&mut s, deadline, plan_pause("cmp_1", version, &exe)));
            ok(at(&mut s, deadline, claim(&exe)));
            ok(at(&mut s, deadline, dispatch(&exe)));
            ok(at(&mut s, deadline, finish(&exe, not_sent())));
            waits.push(s.plan["cmp_1"].deadline - deadline);
        }
        assert_eq!(s.plan["cmp_1"].failures, 300);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]), "the delay only grows");
        assert_eq!(waits.last().copied(), Some(PAUSE_RETRY_MAX_MS));
        assert_eq!(s.plan_due.len(), 1, "one index entry per planned computer");

        // 300 computers whose pauses fail, and one healthy one due at the same time: the
        // scheduler's next pass (256 at most) finds the healthy one.
        let mut s = State { clock: 1_000, ..State::default() };
        for i in 0..300 {
            add_running(&mut s, &format!("cmp_f{i:03}"), Some(1), 1);
        }
        for i in 0..300 {
            let (id, exe) = (format!("cmp_f{i:03}"), format!("exe_f{i:03}"));
            ok(at(&mut s, 2_000, plan_pause(&id, 1, &exe)));
            ok(at(&mut s, 2_000, claim(&exe)));
            ok(at(&mut s, 2_000, dispatch(&exe)));
            ok(at(&mut s, 2_000, finish(&exe, not_sent())));
        }
        s.clock = 2_000;
        add_running(&mut s, "cmp_ok", Some(1), 1);
        let due = s.plan_due(3_000, 256);
        assert_eq!(due, vec![("cmp_ok".to_string(), 1)], "only the healthy one is due");
        assert_eq!(s.plan_next(3_000), Some(2_000 + PAUSE_RETRY_FIRST_MS));
    }

    #[test]
    fn retry_delays_double_up_to_the_cap() {
        assert_eq!(retry_after_ms(1), PAUSE_RETRY_FIRST_MS);
        assert_eq!(retry_after_ms(2), 2 * PAUSE_RETRY_FIRST_MS);
        assert_eq!(retry_after_ms(4), 8 * PAUSE_RETRY_FIRST_MS);
        assert_eq!(retry_after_ms(300), PAUSE_RETRY_MAX_MS);
        assert_eq!(retry_after_ms(u32::MAX), PAUSE_RETRY_MAX_MS);
    }
}
