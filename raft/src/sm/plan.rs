//! The idle-pause plan, shared by all nodes through the store: per running provider Computer
//! with a `pauseAfter`, its last-work mark, its deadline and a version that changes with every
//! new mark. Nodes report work in batches ([`Command::ReportActivity`]); the leader's scheduler
//! asks for a pause of a Computer whose deadline passed ([`Command::PlanPause`]), which becomes an
//! ordinary stored execution whose command key is derived from the plan version: asking twice
//! (a restart, a new leader) finds the same execution and never pauses twice.
//!
//! An entry exists exactly while the Computer is `running` (entered and left in
//! `set_computer_state`); `due` indexes entries by deadline, so a scheduler tick costs the
//! number of due entries, not the size of the plan.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde::Serialize;

use super::model::ComputerState;
use super::model::Execution;
use super::model::ExecutionKind;
use super::model::Requester;
use super::model::Source;
use super::response::Reject;
use super::response::RejectKind;
use super::state::State;

/// The requester of executions the cluster starts by itself (idle pauses).
pub const SYSTEM: &str = "system";

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
}

/// The command key of the idle pause of `computer_id` at plan `version`.
pub fn pause_key(computer_id: &str, version: u64) -> String {
    format!("idle-pause:{computer_id}:{version}")
}

impl State {
    /// Enters a Computer that started running into the plan (if it can pause by itself).
    pub(crate) fn plan_enter(&mut self, computer_id: &str, at: u64) {
        let Some(c) = self.computers.get(computer_id) else { return };
        let Some(after) = c.pause_after else { return };
        if c.source == Source::Paired {
            return;
        }
        self.plan_leave(computer_id);
        let entry = PlanEntry { last_work: at, deadline: at.saturating_add(after.saturating_mul(1000)), version: 1 };
        self.plan_due.insert((entry.deadline, computer_id.to_string()));
        self.plan.insert(computer_id.to_string(), entry);
    }

    /// Takes a Computer out of the plan.
    pub(crate) fn plan_leave(&mut self, computer_id: &str) {
        if let Some(e) = self.plan.remove(computer_id) {
            self.plan_due.remove(&(e.deadline, computer_id.to_string()));
        }
    }

    /// Work was seen on these Computers at these times. Marks older than the current one, and
    /// Computers not in the plan, are ignored.
    pub(crate) fn report_activity(&mut self, marks: &[(String, u64)]) {
        for (id, at) in marks {
            let Some(after) = self.computers.get(id).and_then(|c| c.pause_after) else { continue };
            let Some(e) = self.plan.get_mut(id) else { continue };
            if *at <= e.last_work {
                continue;
            }
            let old = e.deadline;
            e.last_work = *at;
            e.deadline = at.saturating_add(after.saturating_mul(1000));
            e.version += 1;
            let new = e.deadline;
            self.plan_due.remove(&(old, id.clone()));
            self.plan_due.insert((new, id.clone()));
        }
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
        if entry.deadline > at {
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
        if let Some(c) = self.computers.get_mut(computer_id) {
            c.active_execution = Some(exe.id.clone());
        }
        self.execution_keys.insert(scope, exe.id.clone());
        self.executions.insert(exe.id.clone(), exe);
        self.push_event(
            at,
            "IdlePauseScheduled",
            computer_id,
            Some(execution_id),
            serde_json::json!({"planVersion": version, "lastWork": entry.last_work}),
        );
        Ok(execution_id.to_string())
    }
}

/// The deadline index: (deadline, computer id).
pub type DueIndex = BTreeSet<(u64, String)>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::model::Computer;
    use crate::sm::model::ExecutionState;

    fn running(after: Option<u64>, at: u64) -> State {
        let mut s = State::default();
        let c = Computer {
            id: "cmp_1".into(),
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
        };
        s.computers.insert(c.id.clone(), c);
        s.set_computer_state("cmp_1", ComputerState::Running, at);
        s
    }

    #[test]
    fn a_running_computer_is_planned_and_work_moves_its_deadline() {
        let mut s = running(Some(10), 1_000);
        assert_eq!(s.plan["cmp_1"], PlanEntry { last_work: 1_000, deadline: 11_000, version: 1 });
        assert!(s.plan_due(10_999, 10).is_empty());
        assert_eq!(s.plan_due(11_000, 10), vec![("cmp_1".to_string(), 1)]);
        s.report_activity(&[("cmp_1".into(), 5_000), ("cmp_nope".into(), 9_000)]);
        assert_eq!(s.plan["cmp_1"], PlanEntry { last_work: 5_000, deadline: 15_000, version: 2 });
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
}
