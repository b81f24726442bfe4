//! Turns and runs (SPEC §7): a member (or a bot, for itself) starts a turn, idempotent on its
//! `clientTurnId`; the bot's runtime, outside computerd, claims the run with a lease that it
//! renews, posts its events and ends it. Time is the cluster's clock (leader stamps), so every
//! replica judges a lease the same way.
//!
//! A lease that lapses is expired a few per applied entry (the soonest first, through
//! [`RunIndex::leases`]; a node proposes a tick when one is due and nothing else is applied).
//! The run goes back to `queued`, unless one of its action records is `dispatching` or
//! `unknown`: then it may have had an effect outside, so the run becomes `needs_decision` with
//! those records named, and waits for a person. A run is never run twice blindly.
//!
//! Bounded: at most [`MAX_OPEN_RUNS_PER_MEMBER`] unfinished runs per member; per run at most
//! [`MAX_RUN_EVENTS`] events and [`MAX_RUN_EVENT_BYTES`] bytes of them; at most
//! [`MAX_ATTEMPTS`] claims. Finished runs (with their turn ids) are kept
//! `retention::RUN_RETENTION_MS` after they finished, then compacted a few per entry.

use serde_json::Value;
use serde_json::json;

use super::model::ActionState;
use super::response::Reject;
use super::response::RejectKind;
use super::run_model::*;
use super::state::Caller;
use super::state::State;

fn not_found() -> Reject {
    Reject::new(RejectKind::NotFound, "no such run")
}

impl State {
    /// May `caller` see run `r`: the member whose bot works it, or that bot.
    pub fn may_see_run(&self, caller: &Caller, r: &Run) -> bool {
        match &caller.bot {
            Some(bot) => bot.id == r.bot_id,
            None => caller.member.id == r.member_id,
        }
    }

    /// Starts a turn: a new queued run, or the run this caller's `client_turn_id` already names
    /// (then the request must be the same). Answers the run id.
    pub(crate) fn run_start(&mut self, by: &str, run: &Run) -> Result<String, Reject> {
        let caller = self.caller_by_token_id(by)?;
        caller.check_writable()?;
        let bot = self.bots.get(&run.bot_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such bot"))?;
        match &caller.bot {
            Some(b) if b.id != run.bot_id => {
                return Err(Reject::new(RejectKind::Forbidden, "a bot starts turns for itself only"));
            }
            None if bot.member_id != caller.member.id => {
                return Err(Reject::new(RejectKind::Forbidden, "a member starts turns for their own bots"));
            }
            _ => {}
        }
        if bot.archived_at.is_some() {
            return Err(Reject::new(RejectKind::Conflict, "the bot is archived"));
        }
        if run.member_id != caller.member.id || run.started_by_bot != caller.bot.is_some() {
            return Err(Reject::new(RejectKind::Forbidden, "a turn is recorded in its caller's name"));
        }
        let scope =
            RunBook::turn_scope(&caller.member.id, caller.bot.as_ref().map(|b| b.id.as_str()), &run.client_turn_id);
        if let Some(id) = self.runs.turns.get(&scope) {
            let seen = self.runs.runs.get(id).ok_or_else(not_found)?;
            let same = seen.text == run.text
                && seen.attachments == run.attachments
                && seen.bot_id == run.bot_id
                && seen.after_run == run.after_run;
            return if same {
                Ok(id.clone())
            } else {
                Err(Reject::new(
                    RejectKind::IdempotencyKeyReused,
                    "this clientTurnId started another turn (other text, files or bot)",
                ))
            };
        }
        if run.text.len() > MAX_TURN_TEXT || run.attachments.len() > MAX_ATTACHMENTS {
            return Err(Reject::new(
                RejectKind::Invalid,
                format!("a turn has at most {MAX_TURN_TEXT} bytes of text and {MAX_ATTACHMENTS} attachments"),
            ));
        }
        for a in &run.attachments {
            let blob = self
                .blobs
                .get(&a.blob_id)
                .ok_or_else(|| Reject::new(RejectKind::NotFound, format!("no such blob {}", a.blob_id)))?;
            if !self.may_read_blob(&caller, blob) {
                return Err(Reject::new(RejectKind::NotFound, format!("no such blob {}", a.blob_id)));
            }
            if blob.size != a.size {
                return Err(Reject::new(
                    RejectKind::Invalid,
                    format!("attachment {} says {} bytes; its blob has {}", a.name, a.size, blob.size),
                ));
            }
        }
        let open = self.runs.index.open.get(&caller.member.id).copied().unwrap_or(0);
        if open >= MAX_OPEN_RUNS_PER_MEMBER {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("{MAX_OPEN_RUNS_PER_MEMBER} runs of this member's bots are unfinished"),
            ));
        }
        if self.runs.runs.contains_key(&run.id) {
            return Err(Reject::new(RejectKind::Conflict, "that run id is taken"));
        }
        let now = self.clock;
        // A blob's retention counts from the latest run referencing it.
        for a in &run.attachments {
            self.touch_blob(&a.blob_id, now);
        }
        let mut r = run.clone();
        r.state = RunState::Queued;
        r.lease = None;
        r.attempts = 0;
        r.created_at = now;
        r.updated_at = now;
        r.finished_at = None;
        r.result = None;
        r.error = None;
        r.undecided_actions.clear();
        r.events.clear();
        r.event_bytes = 0;
        push_event(&mut r, "state", json!({"state": "queued"}), now);
        self.runs.index.add(&r);
        self.runs.turns.insert(scope, r.id.clone());
        self.runs.runs.insert(r.id.clone(), r);
        Ok(run.id.clone())
    }

    /// A runtime claims the oldest queued run of `bot_id` under `claim`, leased `lease_ms`.
    /// Answers the run id, or `None` when there is none.
    pub(crate) fn run_claim(
        &mut self,
        by: &str,
        bot_id: &str,
        claim: &str,
        lease_ms: u64,
    ) -> Result<Option<String>, Reject> {
        let caller = self.caller_by_token_id(by)?;
        caller.check_writable()?;
        self.check_runtime(&caller, bot_id)?;
        check_lease_ms(lease_ms)?;
        let Some((_, id)) = self.runs.index.queued.get(bot_id).and_then(|q| q.first()).cloned() else {
            return Ok(None);
        };
        let now = self.clock;
        let token_id = caller.token.id.clone();
        self.runs.update(&id, |r| {
            r.state = RunState::Running;
            r.attempts += 1;
            r.updated_at = now;
            r.lease = Some(Lease { claim: claim.to_string(), token_id, expires_at: now + lease_ms });
            push_event(r, "state", json!({"state": "running", "attempt": r.attempts}), now);
        });
        Ok(Some(id))
    }

    /// The caller may run `bot_id`'s runs: the bot itself, or the member it belongs to.
    fn check_runtime(&self, caller: &Caller, bot_id: &str) -> Result<(), Reject> {
        let bot = self.bots.get(bot_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such bot"))?;
        let allowed = match &caller.bot {
            Some(b) => b.id == bot.id,
            None => bot.member_id == caller.member.id,
        };
        if allowed { Ok(()) } else { Err(Reject::new(RejectKind::Forbidden, "not this bot's runtime")) }
    }

    /// The run `id`, held by the attempt `claim` whose lease has not lapsed.
    fn held(&self, by: &str, id: &str, claim: &str) -> Result<&Run, Reject> {
        let caller = self.caller_by_token_id(by)?;
        let r = self.runs.runs.get(id).filter(|r| self.may_see_run(&caller, r)).ok_or_else(not_found)?;
        match &r.lease {
            Some(l) if l.claim == claim && r.state == RunState::Running && l.expires_at > self.clock => Ok(r),
            _ => Err(Reject::new(
                RejectKind::Conflict,
                format!(
                    "this attempt does not hold the run (it is {}): its lease was lost or it ended",
                    r.state.name()
                ),
            )),
        }
    }

    /// Renews the lease of the attempt holding the run.
    pub(crate) fn run_renew(&mut self, by: &str, id: &str, claim: &str, lease_ms: u64) -> Result<(), Reject> {
        check_lease_ms(lease_ms)?;
        self.held(by, id, claim)?;
        let until = self.clock + lease_ms;
        self.runs.update(id, |r| {
            if let Some(l) = &mut r.lease {
                l.expires_at = l.expires_at.max(until);
            }
        });
        Ok(())
    }

    /// The runtime posts an event (`partial` or `activity`). Answers its seq.
    pub(crate) fn run_event(
        &mut self,
        by: &str,
        id: &str,
        claim: &str,
        kind: &str,
        data: &Value,
    ) -> Result<String, Reject> {
        if !matches!(kind, "partial" | "activity") {
            return Err(Reject::new(RejectKind::Invalid, "a runtime's events are partial or activity"));
        }
        let r = self.held(by, id, claim)?;
        let size = data.to_string().len();
        if size > MAX_EVENT_BYTES {
            return Err(Reject::new(RejectKind::Invalid, format!("an event is at most {MAX_EVENT_BYTES} bytes")));
        }
        if r.events.len() + RESERVED_EVENTS >= MAX_RUN_EVENTS || r.event_bytes + size > RUNTIME_EVENT_BYTES {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!(
                    "this run's events are full ({} events, {} bytes): coalesce partials, and end the run",
                    r.events.len(),
                    r.event_bytes
                ),
            ));
        }
        let now = self.clock;
        let seq = self.runs.update(id, |r| push_event(r, kind, data.clone(), now)).ok_or_else(not_found)?;
        Ok(seq.to_string())
    }

    /// The runtime ends the run: succeeded with a result, or failed with an error; a `final`
    /// event carries both.
    pub(crate) fn run_finish(
        &mut self,
        by: &str,
        id: &str,
        claim: &str,
        succeeded: bool,
        result: Option<&Value>,
        error: Option<&str>,
    ) -> Result<(), Reject> {
        self.held(by, id, claim)?;
        let size = result.map(|v| v.to_string().len()).unwrap_or(0);
        if size > MAX_EVENT_BYTES {
            return Err(Reject::new(RejectKind::Invalid, format!("a result is at most {MAX_EVENT_BYTES} bytes")));
        }
        let error: Option<String> = error.map(|e| e.chars().take(1024).collect());
        let state = if succeeded { RunState::Succeeded } else { RunState::Failed };
        let now = self.clock;
        self.runs.update(id, |r| {
            r.state = state;
            r.lease = None;
            r.result = result.cloned();
            r.error = error.clone();
            r.updated_at = now;
            r.finished_at = Some(now);
            push_event(r, "final", json!({"state": state.name(), "result": result, "error": error}), now);
        });
        Ok(())
    }

    /// A member cancels an unfinished run (its runtime's next call is refused).
    pub(crate) fn run_cancel(&mut self, by: &str, id: &str) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        caller.check_writable()?;
        let r = self.runs.runs.get(id).filter(|r| self.may_see_run(&caller, r)).ok_or_else(not_found)?;
        if caller.bot.is_some() {
            return Err(Reject::new(RejectKind::Forbidden, "a person cancels a run; its runtime ends it as failed"));
        }
        if r.state.finished() {
            return Err(Reject::new(RejectKind::Conflict, format!("the run is {} already", r.state.name())));
        }
        let now = self.clock;
        self.runs.update(id, |r| {
            r.state = RunState::Cancelled;
            r.lease = None;
            r.error = Some("cancelled".into());
            r.updated_at = now;
            r.finished_at = Some(now);
            push_event(r, "final", json!({"state": "cancelled"}), now);
        });
        Ok(())
    }

    /// A person decides a run that needs it: back to the queue (the undecided actions having
    /// been decided first), or failed.
    pub(crate) fn run_decide(&mut self, by: &str, id: &str, requeue: bool) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        caller.check_writable()?;
        if caller.bot.is_some() {
            return Err(Reject::new(RejectKind::Forbidden, "a person decides a run, not a bot"));
        }
        let r = self.runs.runs.get(id).filter(|r| self.may_see_run(&caller, r)).ok_or_else(not_found)?;
        if r.state != RunState::NeedsDecision {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("the run is {}: only a run that needs a decision is decided", r.state.name()),
            ));
        }
        if requeue && r.attempts >= MAX_ATTEMPTS {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("the run was claimed {MAX_ATTEMPTS} times: fail it, and start a new turn"),
            ));
        }
        if requeue {
            let undecided: Vec<&String> = r
                .undecided_actions
                .iter()
                .filter(|k| {
                    self.browser_actions
                        .get(*k)
                        .is_some_and(|a| matches!(a.state, ActionState::Dispatching | ActionState::Unknown))
                })
                .collect();
            if !undecided.is_empty() {
                return Err(Reject::new(
                    RejectKind::Conflict,
                    format!("decide its actions first (done or failed): {undecided:?}"),
                ));
            }
        }
        let now = self.clock;
        self.runs.update(id, |r| {
            r.updated_at = now;
            if requeue {
                r.state = RunState::Queued;
                r.error = None;
                push_event(r, "state", json!({"state": "queued", "decidedBy": caller.member.id}), now);
            } else {
                r.state = RunState::Failed;
                r.finished_at = Some(now);
                let error = "a person failed it after its runtime was lost";
                r.error = Some(error.into());
                push_event(r, "final", json!({"state": "failed", "error": error, "decidedBy": caller.member.id}), now);
            }
        });
        Ok(())
    }

    /// Expires lapsed leases by the cluster's clock, a bounded batch (see the module doc).
    pub(crate) fn expire_leases(&mut self) {
        let now = self.clock;
        let due: Vec<String> = self
            .runs
            .index
            .leases
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(super::retention::COMPACT_PER_ENTRY)
            .map(|(_, id)| id.clone())
            .collect();
        for id in due {
            let undecided: Vec<String> = self
                .runs
                .index
                .actions
                .get(&id)
                .into_iter()
                .flatten()
                .filter(|k| {
                    self.browser_actions
                        .get(*k)
                        .is_some_and(|a| matches!(a.state, ActionState::Dispatching | ActionState::Unknown))
                })
                .cloned()
                .collect();
            self.runs.update(&id, |r| {
                r.lease = None;
                r.updated_at = now;
                if !undecided.is_empty() {
                    r.state = RunState::NeedsDecision;
                    r.error = Some("its runtime was lost while an action may have had its effect".into());
                    r.undecided_actions = undecided.clone();
                    push_event(r, "state", json!({"state": "needs_decision", "actions": undecided}), now);
                } else if r.attempts >= MAX_ATTEMPTS {
                    r.state = RunState::Failed;
                    r.finished_at = Some(now);
                    let error = format!("its runtime was lost {MAX_ATTEMPTS} times");
                    push_event(r, "final", json!({"state": "failed", "error": error}), now);
                    r.error = Some(error);
                } else {
                    r.state = RunState::Queued;
                    push_event(r, "state", json!({"state": "queued", "leaseLost": true}), now);
                }
            });
        }
    }

    /// Forgets a finished run past its retention, with its turn id.
    pub(crate) fn compact_run(&mut self, id: &str) {
        let Some(r) = self.runs.runs.remove(id) else { return };
        self.runs.index.remove(&r);
        self.runs.index.actions.remove(id);
        let scope = RunBook::turn_scope(&r.member_id, r.started_by_bot.then_some(r.bot_id.as_str()), &r.client_turn_id);
        if self.runs.turns.get(&scope).is_some_and(|named| named == id) {
            self.runs.turns.remove(&scope);
        }
    }

    /// Notes that action record `key` belongs to run `run_id` (see [`RunIndex::actions`]).
    pub(crate) fn note_run_action(&mut self, run_id: &str, key: &str) {
        if self.runs.runs.contains_key(run_id) {
            self.runs.index.actions.entry(run_id.to_string()).or_default().insert(key.to_string());
        }
    }
}

/// Appends an event (the caller checked the caps of a runtime's events). Answers its seq.
fn push_event(r: &mut Run, kind: &str, data: Value, at: u64) -> u64 {
    let seq = r.last_seq() + 1;
    r.event_bytes += data.to_string().len();
    r.events.push(RunEvent { seq, kind: kind.to_string(), data, at });
    seq
}

fn check_lease_ms(ms: u64) -> Result<(), Reject> {
    if (MIN_LEASE_MS..=MAX_LEASE_MS).contains(&ms) {
        Ok(())
    } else {
        Err(Reject::new(RejectKind::Invalid, format!("a lease lasts {MIN_LEASE_MS} to {MAX_LEASE_MS} ms")))
    }
}

#[cfg(test)]
#[path = "runs_tests.rs"]
mod tests;
