//! Action records of browser tools that may change something outside the Computer (a click, a
//! submit, an upload), keyed by the caller's `actionId` (SPEC §7, seed 004).
//!
//! `prepared` (recorded, nothing sent) → `dispatching` (written before the CDP call) → `done`,
//! `failed`, or `unknown` (the answer was lost or did not come in time: the action may have had
//! its effect). Only a `prepared` record is dispatched, and only once: the dispatch mark moves
//! it under the claim of one attempt, so a retry with the same id, or two at once, answer the
//! record and never send again. A tool the agent refused before anything was sent (a stale ref,
//! the input lease) leaves it `prepared`, so the caller may try again with a fresh ref; one the
//! node's own checks refused (rights, the Computer's state, its link) is `failed`, "not sent".
//!
//! An action of a run names the claim of the run's attempt that acts: it is recorded, and
//! marked dispatching, only while that claim holds the run's lease (`LeaseLost` otherwise), so
//! an attempt whose lease lapsed sends nothing once another may hold the run.
//!
//! Only an `unknown` record is decided by a person. A `dispatching` one becomes `unknown` once
//! its call's deadline plus [`DISPATCH_MARGIN_MS`] has passed by the cluster's clock (the
//! leader's stamps, never a node's own wall clock): until then its call may still answer, and
//! its answer is what the record says. An answer that comes after the lapse, before anyone
//! decided, still settles it.
//!
//! Bounded: at most [`MAX_OPEN_PER_COMPUTER`] unsettled records per Computer; settled ones are
//! kept `retention::ACTION_RETENTION_MS` (30 days) after they settled, then compacted a few per applied entry (the
//! time-ordered index in `exec_index`, rebuilt when a snapshot loads). Unsettled ones stay until
//! settled.

use serde_json::Value;

use super::model::ActionState;
use super::model::BrowserAction;
use super::model::MAX_EVIDENCE_BLOBS;
use super::response::Reject;
use super::response::RejectKind;
use super::state::State;

/// Unsettled records one Computer may have.
pub const MAX_OPEN_PER_COMPUTER: usize = 1024;
/// A stored result is at most this large (JSON bytes); a larger one is cut to its outcome.
pub const MAX_RESULT: usize = 16 * 1024;
/// What a `dispatching` record waits past its call's deadline before it may lapse to `unknown`:
/// the node's hops and the store's writes of the call's finish.
pub const DISPATCH_MARGIN_MS: u64 = 30_000;
/// The call deadline taken when a dispatch mark names none.
pub const DEFAULT_CALL_DEADLINE_MS: u64 = 130_000;

impl State {
    /// Records an action as `prepared` (or takes a `prepared` one for a new attempt, nothing
    /// having been sent). Answers `"new"`, or the state of a record past `prepared` (which the
    /// caller answers without sending anything).
    pub(crate) fn action_prepare(&mut self, by: &str, action: &BrowserAction) -> Result<String, Reject> {
        let caller = self.caller_by_token_id(by)?;
        self.check_operate(&caller, &action.computer_id)?;
        if caller.member.id != action.member_id || caller.bot.as_ref().map(|b| &b.id) != action.bot_id.as_ref() {
            return Err(Reject::new(RejectKind::Forbidden, "an action is recorded in its caller's name"));
        }
        // An action of a run is recorded only while the run is being worked: it is what makes a
        // lost runtime's run need a decision.
        if let Some(run) = &action.run_id {
            self.runs
                .runs
                .get(run)
                .filter(|r| self.may_see_run(&caller, r))
                .ok_or_else(|| Reject::new(RejectKind::NotFound, "no such run"))?;
            self.check_run_lease(run, action.run_claim.as_deref())?;
        }
        let key = action.key();
        if let Some(seen) = self.browser_actions.get_mut(&key) {
            if seen.tool != action.tool {
                return Err(Reject::new(
                    RejectKind::IdempotencyKeyReused,
                    format!("this actionId was used for {}, not {}", seen.tool, action.tool),
                ));
            }
            if seen.state != ActionState::Prepared {
                return Ok(state_name(seen.state).into());
            }
            seen.request = action.request.clone();
            seen.claim = action.claim.clone();
            seen.run_id = action.run_id.clone();
            seen.run_claim = action.run_claim.clone();
            seen.intent = action.intent.clone();
            seen.evidence = action.evidence.clone();
            return Ok("new".into());
        }
        let open = self.exec_index.open_actions.get(&action.computer_id).copied().unwrap_or(0);
        if open >= MAX_OPEN_PER_COMPUTER {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("this computer has {MAX_OPEN_PER_COMPUTER} unsettled actions: decide the unknown ones first"),
            ));
        }
        let mut a = action.clone();
        a.state = ActionState::Prepared;
        a.dispatched_at = None;
        a.lapses_at = None;
        a.settled_at = None;
        a.result = None;
        a.error = None;
        a.decided_by = None;
        *self.exec_index.open_actions.entry(a.computer_id.clone()).or_default() += 1;
        if let Some(run) = &a.run_id {
            self.note_run_action(run, &key);
        }
        self.browser_actions.insert(key, a);
        Ok("new".into())
    }

    /// Whether `claim` holds the lease of run `run` now, by the cluster's clock.
    fn check_run_lease(&self, run: &str, claim: Option<&str>) -> Result<(), Reject> {
        let r = self.runs.runs.get(run).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such run"))?;
        match &r.lease {
            Some(l)
                if Some(l.claim.as_str()) == claim
                    && r.state == super::run_model::RunState::Running
                    && l.expires_at > self.clock =>
            {
                Ok(())
            }
            _ => Err(Reject::new(
                RejectKind::LeaseLost,
                format!(
                    "this claim does not hold the run's lease (the run is {}): its lease lapsed or the run ended; nothing was sent",
                    r.state.name()
                ),
            )),
        }
    }

    /// Marks a `prepared` record `dispatching` for the attempt holding `claim`; it may lapse to
    /// `unknown` once `deadline_ms` (the call's) and the margin have passed by the cluster's
    /// clock. An action of a run needs its claim to hold the run's lease still.
    pub(crate) fn action_dispatch(
        &mut self,
        key: &str,
        claim: &str,
        at_ms: u64,
        deadline_ms: u64,
    ) -> Result<(), Reject> {
        let a = self.browser_actions.get(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such action"))?;
        if a.state != ActionState::Prepared || a.claim != claim {
            return Err(Reject::new(RejectKind::Conflict, "another attempt holds this action, or it was sent already"));
        }
        if let Some(run) = a.run_id.clone() {
            let run_claim = a.run_claim.clone();
            self.check_run_lease(&run, run_claim.as_deref())?;
        }
        let deadline = if deadline_ms == 0 { DEFAULT_CALL_DEADLINE_MS } else { deadline_ms };
        let lapses_at = self.clock.saturating_add(deadline).saturating_add(DISPATCH_MARGIN_MS);
        let a = self.browser_actions.get_mut(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such action"))?;
        a.state = ActionState::Dispatching;
        a.dispatched_at = Some(at_ms);
        a.lapses_at = Some(lapses_at);
        Ok(())
    }

    /// A `prepared` record that the node's checks refused before its dispatch mark: `failed`,
    /// with the reason and "not sent".
    pub(crate) fn action_refuse(&mut self, key: &str, claim: &str, error: &str, at_ms: u64) -> Result<(), Reject> {
        let a = self.browser_actions.get_mut(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such action"))?;
        if a.state != ActionState::Prepared || a.claim != claim {
            return Err(Reject::new(RejectKind::Conflict, "this attempt does not hold the action"));
        }
        a.state = ActionState::Failed;
        a.error = Some(format!("not sent: {}", error.chars().take(1024).collect::<String>()));
        a.settled_at = Some(at_ms);
        self.settle_index(key, at_ms);
        Ok(())
    }

    /// A `dispatching` record past its lapse time by the cluster's clock becomes `unknown`.
    pub(crate) fn action_lapse(&mut self, key: &str, at_ms: u64) -> Result<(), Reject> {
        let clock = self.clock;
        let a = self.browser_actions.get_mut(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such action"))?;
        if a.state != ActionState::Dispatching {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("the action is {}, not dispatching", state_name(a.state)),
            ));
        }
        if a.lapses_at.is_none_or(|t| clock < t) {
            return Err(Reject::new(RejectKind::Conflict, "the action's call is still within its deadline"));
        }
        a.state = ActionState::Unknown;
        a.error = Some(format!(
            "no answer was recorded within the call's deadline (lapsed at {at_ms}): it may have happened"
        ));
        Ok(())
    }

    /// Returns a dispatched action to `prepared`: the agent refused it before anything reached
    /// the page.
    pub(crate) fn action_release(&mut self, key: &str, claim: &str, error: &str) -> Result<(), Reject> {
        let a = self.browser_actions.get_mut(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such action"))?;
        if a.state != ActionState::Dispatching || a.claim != claim {
            return Err(Reject::new(RejectKind::Conflict, "this attempt does not hold the action"));
        }
        a.state = ActionState::Prepared;
        a.dispatched_at = None;
        a.lapses_at = None;
        a.error = Some(error.chars().take(1024).collect());
        Ok(())
    }

    /// Records how a dispatched action ended (`done`, `failed`, `unknown`) for the attempt
    /// holding `claim`: while it is `dispatching`, or `unknown` and undecided (an answer that
    /// came after the record lapsed is still its outcome).
    pub(crate) fn action_finish(
        &mut self,
        key: &str,
        claim: &str,
        state: ActionState,
        result: Option<&Value>,
        error: Option<&str>,
        at_ms: u64,
    ) -> Result<(), Reject> {
        if !matches!(state, ActionState::Done | ActionState::Failed | ActionState::Unknown) {
            return Err(Reject::new(RejectKind::Invalid, "an action finishes done, failed or unknown"));
        }
        let a = self.browser_actions.get_mut(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such action"))?;
        let open = a.state == ActionState::Dispatching || (a.state == ActionState::Unknown && a.decided_by.is_none());
        if !open || a.claim != claim {
            return Err(Reject::new(RejectKind::Conflict, "this attempt does not hold the action"));
        }
        a.state = state;
        a.result = result.filter(|r| r.to_string().len() <= MAX_RESULT).cloned();
        a.error = error.map(|e| e.chars().take(1024).collect());
        if state.settled() {
            a.settled_at = Some(at_ms);
            self.settle_index(key, at_ms);
        }
        Ok(())
    }

    /// A member settles an `unknown` action as `done` or `failed` (a `dispatching` one only once
    /// it lapsed by the cluster's clock: until then its call may still answer).
    pub(crate) fn action_decide(&mut self, by: &str, key: &str, done: bool, at_ms: u64) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        if caller.bot.is_some() {
            return Err(Reject::new(RejectKind::Forbidden, "a person decides an unknown action, not a bot"));
        }
        let computer_id = self
            .browser_actions
            .get(key)
            .map(|a| a.computer_id.clone())
            .ok_or_else(|| Reject::new(RejectKind::NotFound, "no such action"))?;
        self.check_operate(&caller, &computer_id)?;
        let clock = self.clock;
        let a = self.browser_actions.get_mut(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such action"))?;
        let lapsed = a.state == ActionState::Dispatching && a.lapses_at.is_some_and(|t| clock >= t);
        if a.state == ActionState::Dispatching && !lapsed {
            return Err(Reject::new(
                RejectKind::Conflict,
                "the action is still being sent: its call may answer; only an unknown one is decided",
            ));
        }
        if a.state != ActionState::Unknown && !lapsed {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("the action is {}: only an unknown one is decided", state_name(a.state)),
            ));
        }
        a.state = if done { ActionState::Done } else { ActionState::Failed };
        a.decided_by = Some(caller.member.id.clone());
        a.settled_at = Some(at_ms);
        self.settle_index(key, at_ms);
        Ok(())
    }

    fn settle_index(&mut self, key: &str, at_ms: u64) {
        if let Some(computer) = key.split('\n').next()
            && let Some(n) = self.exec_index.open_actions.get_mut(computer)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.exec_index.open_actions.remove(computer);
            }
        }
        self.exec_index.settled_actions.insert((at_ms, key.to_string()));
    }

    /// Links blob `blob_id` to the record as its evidence (its caller's, once; at most
    /// [`MAX_EVIDENCE_BLOBS`]); the blob counts as referenced now.
    pub(crate) fn action_evidence(&mut self, by: &str, key: &str, blob_id: &str, at_ms: u64) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let a = self.browser_actions.get(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such action"))?;
        if caller.member.id != a.member_id || caller.bot.as_ref().map(|b| &b.id) != a.bot_id.as_ref() {
            return Err(Reject::new(RejectKind::NotFound, "no such action"));
        }
        let blob = self.blobs.get(blob_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such blob"))?;
        if !self.may_read_blob(&caller, blob) {
            return Err(Reject::new(RejectKind::NotFound, "no such blob"));
        }
        if a.evidence_blobs.iter().any(|b| b == blob_id) {
            return Ok(());
        }
        if a.evidence_blobs.len() >= MAX_EVIDENCE_BLOBS {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("an action names at most {MAX_EVIDENCE_BLOBS} evidence blobs"),
            ));
        }
        self.touch_blob(blob_id, at_ms);
        if let Some(a) = self.browser_actions.get_mut(key) {
            a.evidence_blobs.push(blob_id.to_string());
        }
        Ok(())
    }

    /// Forgets a settled record (retention).
    pub(crate) fn compact_action(&mut self, at: u64, key: &str) {
        self.exec_index.settled_actions.remove(&(at, key.to_string()));
        if let Some(a) = self.browser_actions.remove(key)
            && let Some(keys) = a.run_id.and_then(|r| self.runs.index.actions.get_mut(&r))
        {
            keys.remove(key);
        }
    }
}

/// A state's name in the API.
pub fn state_name(s: ActionState) -> &'static str {
    match s {
        ActionState::Prepared => "prepared",
        ActionState::Dispatching => "dispatching",
        ActionState::Done => "done",
        ActionState::Failed => "failed",
        ActionState::Unknown => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::Response;
    use crate::sm::testing::OWNER;
    use crate::sm::testing::computer;
    use crate::sm::testing::world;

    fn action(computer_id: &str, claim: &str) -> BrowserAction {
        BrowserAction {
            action_id: "upload-1".into(),
            computer_id: computer_id.into(),
            member_id: "mem_o".into(),
            bot_id: None,
            tool: "click".into(),
            request: serde_json::json!({"ref": "e3"}),
            run_id: None,
            run_claim: None,
            intent: Some("upload report.pdf to project B".into()),
            evidence: Some(serde_json::json!({"fileSha": "ab"})),
            state: ActionState::Prepared,
            claim: claim.into(),
            created_at: 10,
            dispatched_at: None,
            lapses_at: None,
            settled_at: None,
            result: None,
            error: None,
            decided_by: None,
            evidence_blobs: vec![],
        }
    }

    #[test]
    fn an_action_is_dispatched_once_and_an_unknown_one_waits_for_a_person() {
        let mut s = world();
        let c = "cmp_1".to_string();
        s.computers.insert(c.clone(), computer(&c, "mem_o", crate::sm::model::Source::Paired));
        let a = action(&c, "k1");
        let key = a.key();
        assert_eq!(
            s.apply(&Command::ActionPrepare { by: OWNER.into(), action: a.clone() }),
            Response::Id("new".into())
        );
        // A second attempt while nothing was sent takes the record over; the first is fenced.
        let mut again = a.clone();
        again.claim = "k2".into();
        assert_eq!(s.apply(&Command::ActionPrepare { by: OWNER.into(), action: again }), Response::Id("new".into()));
        assert!(matches!(
            s.apply(&Command::ActionDispatch { key: key.clone(), claim: "k1".into(), at_ms: 20, deadline_ms: 1_000 }),
            Response::Rejected(_)
        ));
        assert_eq!(
            s.apply(&Command::ActionDispatch { key: key.clone(), claim: "k2".into(), at_ms: 20, deadline_ms: 1_000 }),
            Response::Ok
        );
        // Once sent, a retry answers the record and sends nothing.
        let mut retry = a.clone();
        retry.claim = "k3".into();
        assert_eq!(
            s.apply(&Command::ActionPrepare { by: OWNER.into(), action: retry.clone() }),
            Response::Id("dispatching".into())
        );
        assert!(matches!(
            s.apply(&Command::ActionDispatch { key: key.clone(), claim: "k3".into(), at_ms: 21, deadline_ms: 1_000 }),
            Response::Rejected(_)
        ));
        let lost = Command::ActionFinish {
            key: key.clone(),
            claim: "k2".into(),
            state: ActionState::Unknown,
            result: None,
            error: Some("lost".into()),
            at_ms: 30,
        };
        assert_eq!(s.apply(&lost), Response::Ok);
        assert_eq!(
            s.apply(&Command::ActionPrepare { by: OWNER.into(), action: retry }),
            Response::Id("unknown".into())
        );
        assert_eq!(
            s.browser_actions[&key].evidence,
            Some(serde_json::json!({"fileSha": "ab"})),
            "an unknown record keeps its evidence"
        );
        assert_eq!(s.exec_index.open_actions.get(&c), Some(&1));
        // Another tool under the same id is refused.
        let mut other = a.clone();
        other.tool = "upload".into();
        assert!(
            matches!(s.apply(&Command::ActionPrepare { by: OWNER.into(), action: other }), Response::Rejected(r) if r.kind == RejectKind::IdempotencyKeyReused)
        );
        assert_eq!(
            s.apply(&Command::ActionDecide { by: OWNER.into(), key: key.clone(), done: true, at_ms: 40 }),
            Response::Ok
        );
        assert_eq!(s.browser_actions[&key].state, ActionState::Done);
        assert!(!s.exec_index.open_actions.contains_key(&c));
        assert!(matches!(
            s.apply(&Command::ActionDecide { by: OWNER.into(), key: key.clone(), done: false, at_ms: 41 }),
            Response::Rejected(_)
        ));
        // Settled records go after the retention.
        s.compact_action(40, &key);
        assert!(!s.browser_actions.contains_key(&key));
    }

    /// A world with Computer `cmp_1` of the owner.
    fn with_computer() -> (crate::sm::State, String) {
        let mut s = world();
        let c = "cmp_1".to_string();
        s.computers.insert(c.clone(), computer(&c, "mem_o", crate::sm::model::Source::Paired));
        (s, c)
    }

    fn stamped(s: &mut crate::sm::State, at: u64, cmd: Command) -> Response {
        s.apply_request(&crate::sm::Request::new(cmd).stamped(at))
    }

    /// Issue 37, item 2: a person cannot settle an action that is still being sent; it lapses
    /// to `unknown` once its call's deadline and the margin have passed by the cluster's clock
    /// (the leader's stamps), and an answer that comes later, before a decision, still settles it.
    #[test]
    fn i37_2_only_an_unknown_action_is_decided_and_dispatching_lapses_by_the_cluster_clock() {
        let (mut s, c) = with_computer();
        let a = action(&c, "k1");
        let key = a.key();
        assert_eq!(
            stamped(&mut s, 1_000, Command::ActionPrepare { by: OWNER.into(), action: a }),
            Response::Id("new".into())
        );
        let dispatch = Command::ActionDispatch { key: key.clone(), claim: "k1".into(), at_ms: 1, deadline_ms: 10_000 };
        assert_eq!(stamped(&mut s, 1_000, dispatch), Response::Ok);
        let lapses_at = 1_000 + 10_000 + DISPATCH_MARGIN_MS;
        assert_eq!(s.browser_actions[&key].lapses_at, Some(lapses_at));
        let decide = |done| Command::ActionDecide { by: OWNER.into(), key: key.clone(), done, at_ms: 5 };
        let lapse = Command::ActionLapse { key: key.clone(), at_ms: 5 };
        // A node whose own wall clock ran ahead proposes both early: the cluster's clock says no.
        for early in [decide(true), lapse.clone()] {
            let r = stamped(&mut s, lapses_at - 1, early);
            assert!(matches!(&r, Response::Rejected(r) if r.kind == RejectKind::Conflict), "{r:?}");
        }
        assert_eq!(s.browser_actions[&key].state, ActionState::Dispatching);
        // The call's answer within its deadline is what the record says.
        let mut answered = s.clone();
        let finish = |st| Command::ActionFinish {
            key: key.clone(),
            claim: "k1".into(),
            state: st,
            result: None,
            error: None,
            at_ms: 6,
        };
        assert_eq!(stamped(&mut answered, lapses_at - 1, finish(ActionState::Done)), Response::Ok);
        assert_eq!(answered.browser_actions[&key].state, ActionState::Done);
        // Past it, the record lapses to unknown; a late answer still settles it once.
        assert_eq!(stamped(&mut s, lapses_at, lapse.clone()), Response::Ok);
        assert_eq!(s.browser_actions[&key].state, ActionState::Unknown);
        let mut late = s.clone();
        assert_eq!(stamped(&mut late, lapses_at + 1, finish(ActionState::Failed)), Response::Ok);
        assert_eq!(late.browser_actions[&key].state, ActionState::Failed);
        assert!(!late.exec_index.open_actions.contains_key(&c));
        assert!(matches!(stamped(&mut late, lapses_at + 2, finish(ActionState::Done)), Response::Rejected(_)));
        // Or a person decides it, and a late answer is refused after that.
        assert_eq!(stamped(&mut s, lapses_at + 1, decide(true)), Response::Ok);
        assert_eq!(s.browser_actions[&key].state, ActionState::Done);
        assert!(matches!(stamped(&mut s, lapses_at + 2, finish(ActionState::Failed)), Response::Rejected(_)));
        assert_eq!(s.browser_actions[&key].state, ActionState::Done);
        // A dispatching record past its lapse is decided directly too.
        let (mut s, c) = with_computer();
        let a = action(&c, "k1");
        let key = a.key();
        stamped(&mut s, 1_000, Command::ActionPrepare { by: OWNER.into(), action: a });
        stamped(
            &mut s,
            1_000,
            Command::ActionDispatch { key: key.clone(), claim: "k1".into(), at_ms: 1, deadline_ms: 1 },
        );
        let decide = Command::ActionDecide { by: OWNER.into(), key: key.clone(), done: false, at_ms: 5 };
        assert_eq!(stamped(&mut s, 1_001 + DISPATCH_MARGIN_MS, decide), Response::Ok);
        assert_eq!(s.browser_actions[&key].state, ActionState::Failed);
    }

    /// Issue 37, item 3: a prepared action that the node's checks refused is `failed`, "not
    /// sent", and a retry answers that record without sending.
    #[test]
    fn i37_3_a_refusal_before_the_dispatch_mark_is_failed_not_sent() {
        let (mut s, c) = with_computer();
        let a = action(&c, "k1");
        let key = a.key();
        assert_eq!(
            s.apply(&Command::ActionPrepare { by: OWNER.into(), action: a.clone() }),
            Response::Id("new".into())
        );
        let refuse = |claim: &str| Command::ActionRefuse {
            key: key.clone(),
            claim: claim.into(),
            error: "the computer is paused".into(),
            at_ms: 20,
        };
        assert!(matches!(s.apply(&refuse("other")), Response::Rejected(_)), "only the attempt holding it");
        assert_eq!(s.apply(&refuse("k1")), Response::Ok);
        let r = &s.browser_actions[&key];
        assert_eq!((r.state, r.error.as_deref()), (ActionState::Failed, Some("not sent: the computer is paused")));
        assert!(!s.exec_index.open_actions.contains_key(&c), "settled");
        let mut retry = a;
        retry.claim = "k2".into();
        assert_eq!(s.apply(&Command::ActionPrepare { by: OWNER.into(), action: retry }), Response::Id("failed".into()));
        assert!(matches!(
            s.apply(&Command::ActionDispatch { key: key.clone(), claim: "k2".into(), at_ms: 21, deadline_ms: 1 }),
            Response::Rejected(_)
        ));
    }
}
