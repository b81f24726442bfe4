//! Lifecycle executions: submit (idempotent by command key), claim, dispatch (rights re-checked
//! at the commit point, recorded before the provider call), finish, unknown outcomes, decisions,
//! stop, and the Computer state changes they make. The usage spans and events they leave are
//! written through `usage.rs` and `events.rs`; links and pairing are in `link.rs`.

use serde::Deserialize;
use serde::Serialize;

use super::access::MAX_PENDING_APPROVALS_PER_MEMBER;
use super::identity::Role;
use super::model::Capability;
use super::model::Computer;
use super::model::ComputerState;
use super::model::Decision;
use super::model::Effect;
use super::model::Execution;
use super::model::ExecutionError;
use super::model::ExecutionKind;
use super::model::ExecutionState;
use super::model::ProviderKind;
use super::model::Source;
use super::response::Reject;
use super::response::RejectKind;
use super::state::State;
use super::usage::SpanEnd;

/// The most refused connections one `EgressDenied` report samples.
pub const MAX_DENIED_SAMPLE: usize = 8;

/// What a provider call ended with, as reported by the driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The provider confirmed; for a create, its sandbox reference.
    Succeeded {
        /// The sandbox reference (create).
        sandbox: Option<String>,
    },
    /// Nothing was done: failed before sending, or the provider refused.
    Failed {
        /// Why.
        error: ExecutionError,
    },
    /// Sent, but the answer was lost or timed out.
    Unknown {
        /// What happened.
        reason: String,
    },
}

/// A submitted lifecycle command, as the proposer prepared it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submit {
    /// The caller's token id.
    pub by: String,
    /// The execution (pending), with its key and body hash.
    pub execution: Execution,
    /// For a create: the new Computer.
    pub computer: Option<Computer>,
    /// The id to use if a decider asks for an approval.
    pub approval_id: String,
    /// The bot's reason, if any.
    pub reason: Option<String>,
    /// Unix ms.
    pub at_ms: u64,
}

impl State {
    pub(crate) fn set_computer_state(&mut self, id: &str, state: ComputerState, at: u64) {
        let Some(c) = self.computers.get_mut(id) else { return };
        if c.state == state {
            return;
        }
        let from = c.state;
        c.state = state;
        if (from == ComputerState::Deleted) != (state == ComputerState::Deleted) {
            let owner = c.owner.clone();
            self.count_live_computer(&owner, state != ComputerState::Deleted);
        }
        if state == ComputerState::Running {
            self.plan_enter(id, at);
        } else if from == ComputerState::Running {
            self.plan_leave(id);
        }
        self.push_event(at, "ComputerStateChanged", id, None, serde_json::json!({"from": from, "to": state}));
    }

    /// Whether a new Computer's sandbox shares a kernel with other Computers' sandboxes and runs
    /// our agent's tool bindings there (the docker provider), so it needs a binding-UID range.
    fn shares_kernel(&self, c: &Computer) -> bool {
        match &c.source {
            Source::Provider { provider, .. } => {
                self.providers.get(provider).is_some_and(|p| p.kind == ProviderKind::Docker)
            }
            Source::Paired => false,
        }
    }

    /// The idempotency scope of a caller: its bot, or its member.
    pub(crate) fn key_scope(bot: Option<&str>, member: &str, key: &str) -> String {
        format!("{}\n{key}", bot.unwrap_or(member))
    }

    /// Stores a lifecycle command. Answers the execution id: the new one, or the existing one for a
    /// retry with the same key and body.
    pub(crate) fn submit(&mut self, s: &Submit) -> Result<String, Reject> {
        let caller = self.caller_by_token_id(&s.by)?;
        let exe = &s.execution;
        let scope = Self::key_scope(caller.bot.as_ref().map(|b| b.id.as_str()), &caller.member.id, &exe.command_key);
        if let Some(existing) = self.execution_keys.get(&scope).and_then(|id| self.executions.get(id)) {
            return if existing.body_hash == exe.body_hash {
                Ok(existing.id.clone())
            } else {
                Err(Reject::new(RejectKind::IdempotencyKeyReused, "this commandKey was used with another request"))
            };
        }
        if self.executions.contains_key(&exe.id) {
            return Err(Reject::new(RejectKind::Conflict, "execution id collision"));
        }
        caller.check_writable()?;
        let effect = match exe.kind {
            ExecutionKind::Create => {
                let c =
                    s.computer.as_ref().ok_or_else(|| Reject::new(RejectKind::Invalid, "a create needs a computer"))?;
                if c.id != exe.computer_id || self.computers.contains_key(&c.id) {
                    return Err(Reject::new(RejectKind::Invalid, "computer id mismatch or collision"));
                }
                if caller.token.computers.is_some() {
                    return Err(Reject::new(RejectKind::Forbidden, "a token limited to computers cannot create one"));
                }
                if c.shared && (caller.bot.is_some() || caller.member.role < Role::Admin) {
                    return Err(Reject::new(
                        RejectKind::Forbidden,
                        "only an owner or admin may create a shared computer",
                    ));
                }
                if c.owner != caller.member.id {
                    return Err(Reject::new(RejectKind::Invalid, "a computer belongs to its creator's member"));
                }
                self.check_computer_room(&c.owner)?;
                match &c.source {
                    Source::Provider { provider, .. } => {
                        if !self.providers.contains_key(provider) {
                            return Err(Reject::new(RejectKind::NotFound, "no such provider"));
                        }
                        self.decide_capability(&caller, Capability::Create, provider)?
                    }
                    Source::Paired => {
                        if caller.bot.is_some() {
                            return Err(Reject::new(RejectKind::Invalid, "a bot creates provider sandboxes only"));
                        }
                        Effect::Allow
                    }
                }
            }
            kind => {
                let c = self.visible_computer(&caller, &exe.computer_id)?.clone();
                if let Some(active) = &c.active_execution {
                    return Err(Reject {
                        kind: RejectKind::ComputerConflict,
                        message: format!("execution {active} is still running on this computer"),
                        execution_id: Some(active.clone()),
                    });
                }
                let paired = c.source == Source::Paired;
                match kind {
                    ExecutionKind::Pause | ExecutionKind::Resume if paired => {
                        return Err(Reject::new(RejectKind::Unsupported, "own machines never pause"));
                    }
                    ExecutionKind::Pause if c.state != ComputerState::Running => {
                        return Err(Reject::new(
                            RejectKind::Conflict,
                            format!("the computer is {:?}, not running", c.state).to_lowercase(),
                        ));
                    }
                    ExecutionKind::Resume if c.state != ComputerState::Paused => {
                        return Err(Reject::new(
                            RejectKind::Conflict,
                            format!("the computer is {:?}, not paused", c.state).to_lowercase(),
                        ));
                    }
                    ExecutionKind::Delete => self.decide_capability(&caller, Capability::Delete, &c.id)?,
                    ExecutionKind::Recreate => {
                        self.check_recreate(&c)?;
                        Effect::Allow
                    }
                    _ => Effect::Allow,
                }
            }
        };
        // A request that would wait on an approval is refused here, before any change, when its
        // member's requests hold the most pending ones already.
        if effect == Effect::Ask {
            self.check_approval_room_within(&caller, MAX_PENDING_APPROVALS_PER_MEMBER)?;
        }
        // A sandbox on a shared kernel needs its own binding-UID range: refused here, before any
        // change, when none is free.
        let uid_range = s.computer.as_ref().filter(|c| self.shares_kernel(c));
        if uid_range.is_some() {
            self.uid_ranges.check_free()?;
        }
        let mut exe = exe.clone();
        exe.state = ExecutionState::Pending;
        exe.requester = caller.requester();
        exe.approval = None;
        // The create route gives every create a pairing code (it reads its own node's state,
        // which may not hold yet a provider just registered through another node): only a
        // Computer whose agent pairs keeps it.
        if let Some(Source::Provider { provider, .. }) = s.computer.as_ref().map(|c| &c.source)
            && !self.providers.get(provider).is_some_and(|p| p.kind.runs_agent())
        {
            exe.pairing_code = None;
            exe.pairing_expires_at = None;
        }
        if let Some(c) = &s.computer {
            let mut c = c.clone();
            c.state = ComputerState::Starting;
            c.active_execution = Some(exe.id.clone());
            c.sandbox = None;
            if uid_range.is_some() {
                self.uid_ranges.allocate(&c.id)?;
            }
            self.insert_computer(c);
            if let Some(bot) = &caller.bot {
                self.insert_grant(&exe.computer_id, &bot.id, &caller.member.id, s.at_ms);
            }
        } else if let Some(c) = self.computers.get_mut(&exe.computer_id) {
            c.active_execution = Some(exe.id.clone());
        }
        let id = exe.id.clone();
        let computer_id = exe.computer_id.clone();
        self.execution_keys.insert(scope, id.clone());
        let cap = if exe.kind == ExecutionKind::Create { Capability::Create } else { Capability::Delete };
        let target = match (&exe.kind, s.computer.as_ref().map(|c| &c.source)) {
            (ExecutionKind::Create, Some(Source::Provider { provider, .. })) => provider.clone(),
            _ => computer_id.clone(),
        };
        self.executions.insert(id.clone(), exe);
        self.index_execution(&id);
        if effect == Effect::Ask {
            if let Some(e) = self.executions.get_mut(&id) {
                e.approval = Some(s.approval_id.clone());
            }
            self.open_approval(&s.approval_id, cap, &target, &caller, Some(&id), s.reason.as_deref(), s.at_ms);
        }
        Ok(id)
    }

    /// Whether Computer `c` may be recreated: a sandbox of a provider that keeps the tool runtime
    /// apart from the sandbox (Docker's runtime volume), not deleted, with no tool switch under
    /// way (a switch's bindings change inside the runtime the recreate carries over).
    fn check_recreate(&self, c: &Computer) -> Result<(), Reject> {
        let provider = match &c.source {
            Source::Paired => {
                return Err(Reject::new(
                    RejectKind::Unsupported,
                    "an own machine is not recreated: its agent and files are its owner's",
                ));
            }
            Source::Provider { provider, .. } => self.providers.get(provider),
        };
        if !provider.is_some_and(|p| matches!(p.kind, ProviderKind::Docker | ProviderKind::Fake)) {
            return Err(Reject::new(
                RejectKind::Unsupported,
                "recreate needs a provider that keeps the tool runtime apart from the sandbox (docker)",
            ));
        }
        if c.state == ComputerState::Deleted {
            return Err(Reject::new(RejectKind::Conflict, "the computer is deleted"));
        }
        let mut bindings = self.binding_index.by_computer.get(&c.id).into_iter().flatten();
        if let Some((binding, key)) =
            bindings.find_map(|b| self.binding_index.pending_switch.get(b).map(|k| (b.clone(), k.clone())))
        {
            return Err(Reject::new(
                RejectKind::ComputerConflict,
                format!("tool switch {key:?} of binding {binding} is pending on this computer: let it end first"),
            ));
        }
        Ok(())
    }

    /// Whether a pending execution may be claimed now (its approval, if any, was granted).
    pub fn claimable(&self, exe: &Execution) -> bool {
        exe.state == ExecutionState::Pending
            && exe.approval.as_ref().is_none_or(|a| self.approvals.get(a).is_some_and(|a| a.state == "approved"))
    }

    /// A driver claims a pending execution, or takes over one whose call was never dispatched.
    pub(crate) fn claim(&mut self, exe_id: &str, claim: &str, node: Option<u64>, at: u64) -> Result<(), Reject> {
        let exe = self.executions.get(exe_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such execution"))?;
        let takeover = exe.state == ExecutionState::Running && exe.dispatched_at.is_none();
        if !(self.claimable(exe) || takeover) {
            return Err(Reject::new(RejectKind::Conflict, "the execution cannot be claimed"));
        }
        self.check_claim_node(&exe.computer_id, node)?;
        let computer_id = exe.computer_id.clone();
        let kind = exe.kind;
        if let Some(e) = self.executions.get_mut(exe_id) {
            e.state = ExecutionState::Running;
            e.claim = Some(claim.to_string());
            e.claim_node = node;
        }
        self.index_execution(exe_id);
        if !takeover {
            self.push_event(at, "ExecutionStarted", &computer_id, Some(exe_id), serde_json::json!({"kind": kind}));
        }
        Ok(())
    }

    /// Records that the provider call is about to be sent, after re-checking the requester's
    /// current rights. Without rights the execution fails and nothing is sent. An idle pause is
    /// re-checked against the plan instead: stale (work seen since it was scheduled), it is
    /// cancelled and nothing is sent.
    ///
    /// Idempotent for its claimant: a dispatch repeated with the claim that made it (its answer
    /// was lost) answers as the first did, and changes nothing.
    pub(crate) fn dispatch(&mut self, exe_id: &str, claim: &str, at: u64) -> Result<(), Reject> {
        let exe =
            self.executions.get(exe_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such execution"))?.clone();
        if exe.claim.as_deref() == Some(claim) {
            if exe.dispatched_at.is_some() {
                return Ok(());
            }
            if let Some(refusal) = exe.error.as_ref().and_then(dispatch_refusal).filter(|_| !exe.is_open()) {
                return Err(refusal);
            }
        }
        if exe.state != ExecutionState::Running || exe.claim.as_deref() != Some(claim) || exe.dispatched_at.is_some() {
            return Err(Reject::new(RejectKind::Conflict, "stale claim"));
        }
        self.check_dispatch_node(&exe.computer_id, exe.claim_node)?;
        // The cluster's own idle pauses need no member's right, but must still be due.
        if super::plan::is_idle_pause(&exe) {
            if !self.idle_pause_current(&exe, at) {
                self.cancel_idle_pause(exe_id, "work was seen since the pause was scheduled", at);
                return Err(super::plan::cancelled_dispatch());
            }
            if let Some(e) = self.executions.get_mut(exe_id) {
                e.dispatched_at = Some(at);
            }
            return Ok(());
        }
        let rights = self.caller_by_token_id(&exe.requester.token_id).and_then(|caller| {
            caller.check_writable()?;
            if exe.kind == ExecutionKind::Create {
                // The Computer is new: the creator's right to it is its own token's.
                return Ok(());
            }
            self.check_operate(&caller, &exe.computer_id)
        });
        if let Err(r) = rights {
            let err = ExecutionError {
                kind: "forbidden".into(),
                message: format!("the requester lost the right: {}", r.message),
            };
            self.finish_failed(exe_id, err, at);
            return Err(forbidden_dispatch());
        }
        if let Some(e) = self.executions.get_mut(exe_id) {
            e.dispatched_at = Some(at);
        }
        Ok(())
    }

    /// The driver reports the provider's answer (or its loss).
    pub(crate) fn finish(&mut self, exe_id: &str, claim: &str, outcome: &Outcome, at: u64) -> Result<(), Reject> {
        let exe =
            self.executions.get(exe_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such execution"))?.clone();
        if exe.claim.as_deref() != Some(claim) {
            return Err(Reject::new(RejectKind::Conflict, "stale claim"));
        }
        match (exe.state, outcome) {
            (ExecutionState::Running, Outcome::Succeeded { sandbox }) => {
                self.finish_succeeded(exe_id, sandbox.clone(), at);
                Ok(())
            }
            (ExecutionState::Running, Outcome::Failed { error }) => {
                self.finish_failed(exe_id, error.clone(), at);
                Ok(())
            }
            (ExecutionState::Running, Outcome::Unknown { reason }) => {
                self.mark_unknown_now(exe_id, reason, at);
                Ok(())
            }
            // A late answer after the outcome was declared unknown: keep it as evidence; a create
            // keeps its sandbox reference and its usage record. The state waits for a decision.
            (ExecutionState::OutcomeUnknown, Outcome::Succeeded { sandbox }) => {
                if let Some(e) = self.executions.get_mut(exe_id) {
                    e.late_answer =
                        Some(format!("succeeded{}", sandbox.as_ref().map(|s| format!(" ({s})")).unwrap_or_default()));
                }
                if matches!(exe.kind, ExecutionKind::Create | ExecutionKind::Recreate) {
                    if let Some(c) = self.computers.get_mut(&exe.computer_id) {
                        c.sandbox = sandbox.clone();
                    }
                    self.open_span(&exe.computer_id, exe.dispatched_at.unwrap_or(at), true);
                }
                Ok(())
            }
            (ExecutionState::OutcomeUnknown, Outcome::Failed { error }) => {
                if let Some(e) = self.executions.get_mut(exe_id) {
                    e.late_answer = Some(format!("failed: {}", error.message));
                }
                Ok(())
            }
            _ => Err(Reject::new(RejectKind::Conflict, "the execution already finished")),
        }
    }

    /// A driver taking over declares a dispatched, unanswered call unknown (never re-sends it).
    pub(crate) fn mark_unknown(
        &mut self,
        exe_id: &str,
        seen_claim: &str,
        node: Option<u64>,
        reason: &str,
        at: u64,
    ) -> Result<(), Reject> {
        let exe = self.executions.get(exe_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such execution"))?;
        if exe.state != ExecutionState::Running
            || exe.dispatched_at.is_none()
            || exe.claim.as_deref() != Some(seen_claim)
        {
            return Err(Reject::new(RejectKind::Conflict, "not a dispatched, running execution"));
        }
        self.check_unknown_node(&exe.computer_id, exe.claim_node, node)?;
        self.mark_unknown_now(exe_id, reason, at);
        Ok(())
    }

    fn mark_unknown_now(&mut self, exe_id: &str, reason: &str, at: u64) {
        let Some(e) = self.executions.get_mut(exe_id) else { return };
        e.state = ExecutionState::OutcomeUnknown;
        e.error = Some(ExecutionError { kind: "outcome_unknown".into(), message: reason.to_string() });
        let (computer_id, kind) = (e.computer_id.clone(), e.kind);
        self.index_execution(exe_id);
        if matches!(kind, ExecutionKind::Pause | ExecutionKind::Delete) {
            self.flag_span(&computer_id, true);
        }
        self.push_event(
            at,
            "DecisionNeeded",
            &computer_id,
            Some(exe_id),
            serde_json::json!({"kind": kind, "reason": reason}),
        );
    }

    pub(crate) fn finish_succeeded(&mut self, exe_id: &str, sandbox: Option<String>, at: u64) {
        let Some(e) = self.executions.get_mut(exe_id) else { return };
        e.state = ExecutionState::Succeeded;
        e.finished_at = Some(at);
        let (computer_id, kind, started) = (e.computer_id.clone(), e.kind, e.dispatched_at.unwrap_or(at));
        let (template, redeemed) = (e.template.clone(), e.pairing_code.is_none());
        self.index_execution(exe_id);
        let paired = self.computers.get(&computer_id).is_some_and(|c| c.source == Source::Paired);
        if let Some(c) = self.computers.get_mut(&computer_id) {
            c.active_execution = None;
            if sandbox.is_some() {
                c.sandbox = sandbox;
            }
        }
        self.push_event(
            at,
            "ExecutionFinished",
            &computer_id,
            Some(exe_id),
            serde_json::json!({"kind": kind, "state": "succeeded"}),
        );
        match kind {
            ExecutionKind::Create if paired => self.set_computer_state(&computer_id, ComputerState::Offline, at),
            ExecutionKind::Create => {
                self.open_span(&computer_id, started, false);
                // A sandbox that runs our agent is `starting` until its link is up.
                let waits = self.runs_agent(&computer_id)
                    && self.computers.get(&computer_id).is_some_and(|c| c.link_node.is_none());
                let to = if waits { ComputerState::Starting } else { ComputerState::Running };
                self.set_computer_state(&computer_id, to, at);
            }
            ExecutionKind::Resume => {
                self.open_span(&computer_id, at, false);
                self.set_computer_state(&computer_id, ComputerState::Running, at);
            }
            ExecutionKind::Pause => {
                self.close_span(&computer_id, started, SpanEnd::Pause);
                self.set_computer_state(&computer_id, ComputerState::Paused, at);
            }
            ExecutionKind::Recreate => {
                // The new sandbox's agent pairs with the recreate's code (which ends the old
                // agent's link and credential, see `redeem_pairing`): linked already, the
                // Computer runs; else it starts until the link is up. The old sandbox is gone, so
                // a link not yet made by the new agent is the old one's, and over.
                if let Some(c) = self.computers.get_mut(&computer_id) {
                    if !redeemed {
                        c.link_node = None;
                    }
                    if let (Some(t), Source::Provider { template, .. }) = (template, &mut c.source) {
                        *template = Some(t);
                    }
                }
                // (A provider that starts no agent of ours has no link to wait for.)
                let linked = !self.runs_agent(&computer_id)
                    || (redeemed && self.computers.get(&computer_id).is_some_and(|c| c.link_node.is_some()));
                self.open_span(&computer_id, started, false);
                let to = if linked { ComputerState::Running } else { ComputerState::Starting };
                self.set_computer_state(&computer_id, to, at);
            }
            ExecutionKind::Delete => {
                self.close_span(&computer_id, started, SpanEnd::Delete);
                self.set_computer_state(&computer_id, ComputerState::Deleted, at);
                self.remove_grants_on(&computer_id);
                self.uid_ranges.release(&computer_id);
                self.drop_computer_bindings(&computer_id);
                self.ports.remove_computer(&computer_id);
            }
        }
    }

    pub(crate) fn finish_failed(&mut self, exe_id: &str, error: ExecutionError, at: u64) {
        let Some(e) = self.executions.get_mut(exe_id) else { return };
        e.state = ExecutionState::Failed;
        e.finished_at = Some(at);
        let failure = error.kind.clone();
        e.error = Some(error);
        let (computer_id, kind, idle) = (e.computer_id.clone(), e.kind, super::plan::is_idle_pause(e));
        self.index_execution(exe_id);
        if let Some(c) = self.computers.get_mut(&computer_id) {
            c.active_execution = None;
        }
        self.flag_span(&computer_id, false);
        self.push_event(
            at,
            "ExecutionFinished",
            &computer_id,
            Some(exe_id),
            serde_json::json!({"kind": kind, "state": "failed"}),
        );
        if kind == ExecutionKind::Create {
            // The Computer stays, failed, so its receipt and history remain readable.
            self.set_computer_state(&computer_id, ComputerState::Failed, at);
        }
        // A recreate that failed after the old sandbox was stopped (any failure but one that
        // sent nothing, or was refused before the stop) leaves it stopped and kept: the Computer
        // is failed, and a new recreate may try again.
        if kind == ExecutionKind::Recreate
            && !matches!(failure.as_str(), "not_sent" | "provider_rejected" | "forbidden")
        {
            self.close_span(&computer_id, at, SpanEnd::Failure);
            self.set_computer_state(&computer_id, ComputerState::Failed, at);
        }
        if idle {
            self.idle_pause_failed(&computer_id, at);
        }
    }

    /// A member with write rights resolves an unknown outcome.
    pub(crate) fn decide(
        &mut self,
        by: &str,
        exe_id: &str,
        outcome: ExecutionState,
        reason: &str,
        at: u64,
    ) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let exe =
            self.executions.get(exe_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such execution"))?.clone();
        self.visible_computer(&caller, &exe.computer_id)
            .map_err(|_| Reject::new(RejectKind::NotFound, "no such execution"))?;
        if caller.bot.is_some() {
            return Err(Reject::new(RejectKind::Forbidden, "only a member decides an unknown outcome"));
        }
        caller.check_writable()?;
        if exe.state != ExecutionState::OutcomeUnknown {
            return Err(Reject::new(RejectKind::Conflict, "the execution's outcome is not unknown"));
        }
        let decision = Decision { outcome, reason: reason.to_string(), by: caller.member.id.clone(), at };
        if let Some(e) = self.executions.get_mut(exe_id) {
            e.decision = Some(decision);
            e.state = ExecutionState::Running; // finish_* move it on from here
        }
        match outcome {
            ExecutionState::Succeeded => {
                let sandbox = if exe.kind == ExecutionKind::Create {
                    self.computers.get(&exe.computer_id).and_then(|c| c.sandbox.clone())
                } else {
                    None
                };
                // A recreate decided succeeded left a new sandbox whose reference was never
                // answered: the old one's is forgotten, and the provider's naming finds the new.
                if exe.kind == ExecutionKind::Recreate
                    && exe.late_answer.is_none()
                    && let Some(c) = self.computers.get_mut(&exe.computer_id)
                {
                    c.sandbox = None;
                }
                self.finish_succeeded(exe_id, sandbox, at);
            }
            _ => {
                let err = ExecutionError { kind: "decided_failed".into(), message: reason.to_string() };
                self.finish_failed(exe_id, err, at);
            }
        }
        Ok(())
    }

    /// The provider no longer holds the sandbox of a live Computer with no execution under way,
    /// or holds it ended (`reason`): the Computer is failed, its run span closed, and the event
    /// says why.
    pub(crate) fn sandbox_vanished(&mut self, computer_id: &str, reason: Option<&str>, at: u64) -> Result<(), Reject> {
        let c = self.computers.get(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        let live = matches!(c.state, ComputerState::Running | ComputerState::Paused | ComputerState::Starting);
        if !live || c.active_execution.is_some() || c.source == Source::Paired {
            return Err(Reject::new(RejectKind::Conflict, "the computer is not in a state to check"));
        }
        let sandbox = c.sandbox.clone();
        self.close_span(computer_id, at, SpanEnd::Failure);
        let mut data = serde_json::json!({"sandbox": sandbox});
        if let Some(reason) = reason {
            data["reason"] = serde_json::json!(reason);
        }
        self.push_event(at, "SandboxVanished", computer_id, None, data);
        self.set_computer_state(computer_id, ComputerState::Failed, at);
        Ok(())
    }

    /// The provider paused (or stopped) a running Computer's sandbox on its own (E2B's auto-pause
    /// after a keep-alive failed; a Daytona sandbox stopped by its runner): the Computer follows,
    /// `paused`, with a `SandboxPausedByProvider` event and its usage span ended as for a pause we
    /// asked for. Only a running provider Computer with no execution under way (a pause of ours
    /// in flight is not one behind our back).
    pub(crate) fn sandbox_paused_by_provider(
        &mut self,
        computer_id: &str,
        provider_state: &str,
        at: u64,
    ) -> Result<(), Reject> {
        let c = self.computers.get(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        if c.state != ComputerState::Running || c.active_execution.is_some() || c.source == Source::Paired {
            return Err(Reject::new(RejectKind::Conflict, "the computer is not running with no execution under way"));
        }
        let sandbox = c.sandbox.clone();
        self.close_span(computer_id, at, SpanEnd::Pause);
        self.push_event(
            at,
            "SandboxPausedByProvider",
            computer_id,
            None,
            serde_json::json!({"sandbox": sandbox, "providerState": provider_state}),
        );
        self.set_computer_state(computer_id, ComputerState::Paused, at);
        Ok(())
    }

    /// `RequestEgress`: a bot that may operate a provider Computer asks for its egress policy to
    /// become `policy`. The capability `computers.egress` decides: a denial is refused, an ask
    /// parks the policy in a pending approval (a member's approval applies it), and an allow is
    /// refused here because the route sets it directly then.
    pub(crate) fn request_egress(
        &mut self,
        by: &str,
        computer_id: &str,
        policy: &computerd_proto::egress::EgressPolicy,
        approval_id: &str,
        reason: Option<&str>,
        at: u64,
    ) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        if caller.bot.is_none() {
            return Err(Reject::new(RejectKind::Invalid, "a member sets egress with PUT; only a bot asks"));
        }
        self.check_operate(&caller, computer_id)?;
        let c = self.computers.get(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        if c.source == Source::Paired {
            return Err(Reject::new(
                RejectKind::Invalid,
                "an own machine's egress is its own: egress applies to provider sandboxes",
            ));
        }
        policy.compile().map_err(|e| Reject::new(RejectKind::Invalid, e))?;
        match self.decide_capability(&caller, Capability::Egress, computer_id)? {
            Effect::Ask => {}
            _ => {
                return Err(Reject::new(
                    RejectKind::Conflict,
                    "a rule lets this bot set egress without asking: PUT sets it",
                ));
            }
        }
        self.check_approval_room_within(&caller, MAX_PENDING_APPROVALS_PER_MEMBER)?;
        self.open_approval(approval_id, Capability::Egress, computer_id, &caller, None, reason, at);
        if let Some(a) = self.approvals.get_mut(approval_id) {
            a.egress = Some(policy.clone());
        }
        Ok(())
    }

    /// `SetEgress`: a member who may use a provider Computer sets where its sandbox may connect
    /// (the route has had the provider apply it first). A bot cannot unless a rule lets it
    /// without asking: it asks, through the `computers.egress` capability (`RequestEgress`).
    pub(crate) fn set_egress(
        &mut self,
        by: &str,
        computer_id: &str,
        policy: Option<&computerd_proto::egress::EgressPolicy>,
        revision: Option<u64>,
        at: u64,
    ) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let c = self.visible_computer(&caller, computer_id)?;
        let next = c.egress_revision + 1;
        if revision.is_some_and(|r| r != next) {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("the computer's egress changed meanwhile (its revision is now {})", c.egress_revision),
            ));
        }
        // A bot sets it only where a rule lets it without asking (`computers.egress: allow`).
        if caller.bot.is_some() && self.decide_capability(&caller, Capability::Egress, computer_id)? != Effect::Allow {
            return Err(Reject::new(RejectKind::Forbidden, "only a member may set a computer's egress; a bot asks"));
        }
        caller.check_writable()?;
        if c.source == Source::Paired {
            return Err(Reject::new(
                RejectKind::Invalid,
                "an own machine's egress is its own: egress applies to provider sandboxes",
            ));
        }
        if let Some(p) = policy {
            p.compile().map_err(|e| Reject::new(RejectKind::Invalid, e))?;
        }
        if let Some(c) = self.computers.get_mut(computer_id) {
            c.egress = policy.cloned();
            c.egress_revision = next;
        }
        let data = serde_json::json!({"policy": policy, "by": caller.member.id, "revision": next});
        self.push_event(at, "EgressSet", computer_id, None, data);
        Ok(())
    }

    /// `EgressDenied`: connections the Computer's egress gateway refused, up to `through` (the
    /// gateway's clock). Recorded as one `EgressDenied` event with the count and a sample (only
    /// the sample's denials after the last recorded time), unless nothing in it is newer than
    /// what was recorded (a repeat, or an old leader's late report): then nothing changes.
    pub(crate) fn egress_denied(
        &mut self,
        computer_id: &str,
        count: u64,
        sample: &[computerd_proto::egress::Denied],
        through: u64,
        at: u64,
    ) -> Result<(), Reject> {
        let c =
            self.computers.get_mut(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        if sample.len() > MAX_DENIED_SAMPLE || count < sample.len() as u64 || count == 0 {
            return Err(Reject::new(
                RejectKind::Invalid,
                format!(
                    "a denial report counts at least one refusal and its samples, of which it has at most {MAX_DENIED_SAMPLE}"
                ),
            ));
        }
        let since = c.egress_denied_through;
        if through <= since {
            return Ok(());
        }
        c.egress_denied_through = through;
        let sample: Vec<_> = sample.iter().filter(|d| d.at > since && d.at <= through).collect();
        let data = serde_json::json!({"count": count, "sample": sample, "through": through});
        self.push_event(at, "EgressDenied", computer_id, None, data);
        Ok(())
    }

    /// Stop on an unknown-outcome pause: the Computer becomes `failed` (the sandbox may still run).
    pub(crate) fn stop(&mut self, by: &str, computer_id: &str, at: u64) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let c = self.visible_computer(&caller, computer_id)?.clone();
        if caller.bot.is_some() {
            return Err(Reject::new(RejectKind::Forbidden, "only a member may stop a computer"));
        }
        caller.check_writable()?;
        let exe = c.active_execution.as_ref().and_then(|e| self.executions.get(e)).cloned();
        let Some(exe) = exe.filter(|e| e.kind == ExecutionKind::Pause && e.state == ExecutionState::OutcomeUnknown)
        else {
            return Err(Reject::new(RejectKind::Conflict, "stop applies to a pause of unknown outcome"));
        };
        if let Some(e) = self.executions.get_mut(&exe.id) {
            e.state = ExecutionState::Failed;
            e.finished_at = Some(at);
            e.decision = Some(Decision {
                outcome: ExecutionState::Failed,
                reason: "stopped: the computer is marked failed; the sandbox may still run".into(),
                by: caller.member.id.clone(),
                at,
            });
        }
        self.index_execution(&exe.id);
        if let Some(c) = self.computers.get_mut(computer_id) {
            c.active_execution = None;
        }
        // The span stays open and flagged: a stop does not prove the sandbox is idle.
        self.push_event(
            at,
            "ExecutionFinished",
            computer_id,
            Some(&exe.id),
            serde_json::json!({"kind": "pause", "state": "stopped"}),
        );
        self.set_computer_state(computer_id, ComputerState::Failed, at);
        Ok(())
    }
}

/// The refusal of a dispatch whose requester lost the right (every time it is asked).
fn forbidden_dispatch() -> Reject {
    Reject::new(RejectKind::Forbidden, "the requester lost the right; nothing was sent")
}

/// The refusal a dispatch answered when it ended the execution itself, by the error it left.
fn dispatch_refusal(error: &ExecutionError) -> Option<Reject> {
    match error.kind.as_str() {
        "forbidden" => Some(forbidden_dispatch()),
        super::plan::CANCELLED => Some(super::plan::cancelled_dispatch()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
