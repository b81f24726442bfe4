//! Retention: what the store forgets, and when.
//!
//! - A **finished execution** (succeeded or failed) is kept, with its receipt and its command
//!   key, for the organization's retention ([`DEFAULT_RETENTION_MS`], 7 days, unless an owner or
//!   admin sets another through `PUT /v1/retention`), counted from when it finished. Then it is
//!   compacted: the record and its key go, so the key answers a new request as unknown (a new
//!   command). An execution whose outcome is unknown has not finished: it and its key stay until
//!   someone decides, however long that takes.
//! - A **decided approval** is kept for the same retention from its decision.
//! - A **version switch** is kept for the same retention from when it was asked for, once it
//!   settled (a reserved one, its participants closed, stays until it does).
//! - A **journaled tool call** is kept for the same retention from its start, whatever its
//!   state; then its operation id answers a new call as a new one. (Its answer's bytes are on
//!   the Computer, kept by the agent for as long or less: a replay of a record whose bytes are
//!   gone is answered `expired`.)
//! - A **dead token** (revoked, or of an archived bot) is kept for the same retention from when
//!   it stopped working; then its record and its hash go (`identity_index`). A request with its
//!   secret is refused as before, as an unknown token.
//! - A **deleted Computer**'s tombstone (and its usage record) goes with the last of its
//!   executions, the delete's receipt.
//!
//! Time is the cluster's clock ([`State::clock`], the leader's stamps), never a node's own, so
//! every replica compacts the same records at the same entry. Each applied entry compacts at most
//! [`COMPACT_PER_ENTRY`] records of each kind, oldest first, found through ordered indexes
//! (`exec_index`): an apply never walks the state, and since every execution or decision took an
//! entry of its own, compaction keeps pace with what finishes.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde::Serialize;

use super::model::ComputerState;
use super::response::Reject;
use super::response::RejectKind;
use super::state::State;

/// The retention of finished executions and decided approvals when none is set: 7 days.
pub const DEFAULT_RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;
/// Settled browser action records are kept this long (30 days; `actions`).
pub const ACTION_RETENTION_MS: u64 = 30 * 24 * 3600 * 1000;
/// Finished runs, with their events and turn ids, are kept this long (30 days; `runs`).
pub const RUN_RETENTION_MS: u64 = 30 * 24 * 3600 * 1000;
/// The shortest retention that may be set: one hour.
pub const MIN_RETENTION_MS: u64 = 3600 * 1000;
/// The longest retention that may be set: 400 days.
pub const MAX_RETENTION_MS: u64 = 400 * 24 * 3600 * 1000;
/// At most this many records of each kind (executions, tool-call records, approvals, tokens, ...)
/// are compacted per applied entry.
pub const COMPACT_PER_ENTRY: usize = 16;

/// The organization's retention setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// How long finished executions and decided approvals are kept, ms; `None` = the default.
    pub ms: Option<u64>,
}

impl Retention {
    /// The retention in force, ms.
    pub fn effective_ms(&self) -> u64 {
        self.ms.unwrap_or(DEFAULT_RETENTION_MS)
    }
}

impl State {
    /// Sets the retention (owner or admin).
    pub(crate) fn set_retention(&mut self, by: &str, ms: u64) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        if !(MIN_RETENTION_MS..=MAX_RETENTION_MS).contains(&ms) {
            return Err(Reject::new(RejectKind::Invalid, "the retention must be between 1 hour and 400 days"));
        }
        self.retention.ms = Some(ms);
        Ok(())
    }

    /// Compacts what passed its retention by the cluster's clock, a bounded batch (see the module
    /// doc). Called after each stamped entry moved the clock.
    pub(crate) fn compact_expired(&mut self) {
        if self.clock == 0 {
            return;
        }
        let horizon = self.clock.saturating_sub(self.retention.effective_ms());
        for (_, id) in due(&self.exec_index.finished, horizon, |_| true) {
            self.compact_execution(&id);
        }
        for (at, key) in due(&self.exec_index.operations, horizon, |_| true) {
            self.operations.remove(&key);
            self.exec_index.operations.remove(&(at, key));
        }
        // A switch still reserved or cancelling (its participants closed, or not yet drained)
        // stays until it ends; the few in flight are passed over.
        let switches = &self.switches;
        let settled = |key: &str| {
            !switches.get(key).is_some_and(|sw| {
                matches!(sw.state, super::tools::SwitchState::Reserved | super::tools::SwitchState::Cancelling)
            })
        };
        for (at, key) in due(&self.exec_index.switches, horizon, settled) {
            self.switches.remove(&key);
            self.exec_index.switches.remove(&(at, key));
        }
        for (_, id) in due(&self.exec_index.decided_approvals, horizon, |_| true) {
            self.remove_approval(&id);
        }
        for (at, id) in due(&self.identity_index.dead_tokens, horizon, |_| true) {
            self.compact_token(at, &id);
        }
        let blobs_horizon = self.clock.saturating_sub(self.blob_limits.retention());
        for (at, id) in due(&self.exec_index.blob_expiry, blobs_horizon, |_| true) {
            self.compact_blob(at, &id);
        }
        for (at, id) in due(&self.exec_index.artifact_expiry, blobs_horizon, |_| true) {
            self.compact_artifact(at, &id);
        }
        let actions_horizon = self.clock.saturating_sub(ACTION_RETENTION_MS);
        for (at, key) in due(&self.exec_index.settled_actions, actions_horizon, |_| true) {
            self.compact_action(at, &key);
        }
        let runs_horizon = self.clock.saturating_sub(RUN_RETENTION_MS);
        for (_, id) in due(&self.runs.index.finished, runs_horizon, |_| true) {
            self.compact_run(&id);
        }
    }

    /// Forgets finished execution `id`: its record, its command key (when the key still names
    /// it), its decided approval, and the tombstone of its deleted Computer once no execution of
    /// it is left.
    fn compact_execution(&mut self, id: &str) {
        let Some(e) = self.unindex_execution(id) else { return };
        let scope = Self::key_scope(e.requester.bot_id.as_deref(), &e.requester.member_id, &e.command_key);
        if self.execution_keys.get(&scope).is_some_and(|named| named == id) {
            self.execution_keys.remove(&scope);
        }
        if let Some(a) = &e.approval
            && self.approvals.get(a).is_some_and(|a| a.state != "pending")
        {
            self.remove_approval(a);
        }
        let tombstone = self.computers.get(&e.computer_id).is_some_and(|c| c.state == ComputerState::Deleted);
        if tombstone && self.executions_of(&e.computer_id).next().is_none() {
            self.remove_computer(&e.computer_id);
            self.remove_usage(&e.computer_id);
            self.plan_leave(&e.computer_id);
        }
    }

    fn remove_approval(&mut self, id: &str) {
        if let Some(a) = self.approvals.remove(id) {
            if a.state == "pending" {
                self.count_pending_approval(&a.requester.member_id, false);
            }
            self.exec_index.decided_approvals.remove(&(a.decided_at.unwrap_or(a.created_at), a.id));
        }
    }
}

/// The oldest entries of an ordered (time, key) index at or before `horizon` that `take`
/// accepts, at most [`COMPACT_PER_ENTRY`].
fn due(index: &BTreeSet<(u64, String)>, horizon: u64, take: impl Fn(&str) -> bool) -> Vec<(u64, String)> {
    index
        .iter()
        .take_while(|(at, _)| *at <= horizon)
        .filter(|(_, key)| take(key))
        .take(COMPACT_PER_ENTRY)
        .cloned()
        .collect()
}
