//! Derived indexes over executions and events, so that no apply or request path scans them.
//!
//! - **Open executions** (pending or running): what the driver acts on. Finished executions
//!   (nearly all of them, with time) are never visited by its passes.
//! - **Pairing codes** of executions whose code is not yet redeemed: the unauthenticated pairing
//!   route finds its execution in O(log n).
//! - **Executions per Computer**: a deleted Computer's history (who asked for what) without a
//!   walk over every execution.
//! - **Ended sessions** in the event window: a repeated session-end report is recognized in
//!   O(log n), and the entry leaves with its event.
//!
//! None of it is serialized: a snapshot holds the records, and [`State::reindex_executions`]
//! rebuilds the indexes when one loads. Each change to an execution's state, code or existence
//! goes through [`State::index_execution`] (or [`State::unindex_execution`]), and each event push
//! or drop through `events.rs`, so the indexes always equal what a scan would find.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use super::events::Event;
use super::model::Execution;
use super::model::ExecutionState;
use super::state::State;

/// See the module doc.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecIndex {
    /// Ids of executions that are pending or running.
    pub open: BTreeSet<String>,
    /// (pairing code, execution id) for executions holding an unredeemed code. A pair, not a
    /// map: two executions may (very rarely) draw the same code, and both stay findable.
    pub pairing: BTreeSet<(String, String)>,
    /// computer id -> ids of its executions.
    pub by_computer: BTreeMap<String, BTreeSet<String>>,
    /// session id -> seq of its `computer_session` event, while that event is in the window.
    pub session_ends: BTreeMap<String, u64>,
    /// (finished at, id) of succeeded and failed executions, oldest first (`retention`).
    pub finished: BTreeSet<(u64, String)>,
    /// (decided at, id) of decided approvals, oldest first (`retention`).
    pub decided_approvals: BTreeSet<(u64, String)>,
    /// member id -> how many approvals its requests (its own or its bots') hold pending, for
    /// [`super::access::MAX_PENDING_APPROVALS_PER_MEMBER`].
    pub pending_approvals: BTreeMap<String, usize>,
    /// (started at, journal key) of journaled tool calls, oldest first (`retention`).
    pub operations: BTreeSet<(u64, String)>,
    /// (reserved at, journal key) of version switches that carry their time (`retention`).
    pub switches: BTreeSet<(u64, String)>,
    /// computer id -> how many of its browser actions are unsettled (`actions`).
    pub open_actions: BTreeMap<String, usize>,
    /// (settled at, key) of settled browser actions, oldest first (`actions`).
    pub settled_actions: BTreeSet<(u64, String)>,
    /// member id -> bytes of their blobs (`blobs`).
    pub blob_bytes: BTreeMap<String, u64>,
    /// (last referenced at, id) of blobs, oldest first (`blobs`).
    pub blob_expiry: BTreeSet<(u64, String)>,
    /// (copied at, id) of artifacts, oldest first (`blobs`).
    pub artifact_expiry: BTreeSet<(u64, String)>,
}

/// When a succeeded or failed execution finished (an unknown outcome has not finished).
fn finished_at(e: &Execution) -> Option<u64> {
    matches!(e.state, ExecutionState::Succeeded | ExecutionState::Failed)
        .then_some(e.finished_at.unwrap_or(e.created_at))
}

/// True for an execution the driver may still act on.
fn is_open(e: &Execution) -> bool {
    matches!(e.state, ExecutionState::Pending | ExecutionState::Running)
}

impl ExecIndex {
    fn add(&mut self, e: &Execution) {
        if is_open(e) {
            self.open.insert(e.id.clone());
        } else {
            self.open.remove(&e.id);
        }
        if let Some(code) = &e.pairing_code {
            self.pairing.insert((code.clone(), e.id.clone()));
        }
        self.by_computer.entry(e.computer_id.clone()).or_default().insert(e.id.clone());
        if let Some(at) = finished_at(e) {
            self.finished.insert((at, e.id.clone()));
        }
    }

    fn remove(&mut self, e: &Execution) {
        self.open.remove(&e.id);
        if let Some(at) = finished_at(e) {
            self.finished.remove(&(at, e.id.clone()));
        }
        if let Some(code) = &e.pairing_code {
            self.pairing.remove(&(code.clone(), e.id.clone()));
        }
        if let Some(ids) = self.by_computer.get_mut(&e.computer_id) {
            ids.remove(&e.id);
            if ids.is_empty() {
                self.by_computer.remove(&e.computer_id);
            }
        }
    }
}

impl State {
    /// Rebuilds [`ExecIndex`] from the records (when a snapshot loads), and with it the run
    /// indexes and the identity index (`identity_index`), which a snapshot's loader rebuilds
    /// through this call.
    pub fn reindex_executions(&mut self) {
        self.reindex_identity();
        let mut index = ExecIndex::default();
        for e in self.executions.values() {
            index.add(e);
        }
        for (key, sw) in self.switches.iter().filter(|(_, sw)| sw.reserved_at > 0) {
            index.switches.insert((sw.reserved_at, key.clone()));
        }
        for (key, op) in &self.operations {
            index.operations.insert((op.started_at, key.clone()));
        }
        self.runs.reindex();
        for (key, a) in &self.browser_actions {
            if let Some(run) = a.run_id.as_ref().filter(|r| self.runs.runs.contains_key(*r)) {
                self.runs.index.actions.entry(run.clone()).or_default().insert(key.clone());
            }
            match a.settled_at {
                Some(at) if a.state.settled() => {
                    index.settled_actions.insert((at, key.clone()));
                }
                _ => *index.open_actions.entry(a.computer_id.clone()).or_default() += 1,
            }
        }
        for a in self.artifacts.values() {
            index.artifact_expiry.insert((a.created_at, a.id.clone()));
        }
        for b in self.blobs.values() {
            *index.blob_bytes.entry(b.member_id.clone()).or_default() += b.size;
            index.blob_expiry.insert((b.last_ref_at, b.id.clone()));
        }
        for a in self.approvals.values() {
            if a.state == "pending" {
                *index.pending_approvals.entry(a.requester.member_id.clone()).or_default() += 1;
            } else {
                index.decided_approvals.insert((a.decided_at.unwrap_or(a.created_at), a.id.clone()));
            }
        }
        for e in &self.events {
            if let Some(session) = super::events::ended_session(e) {
                index.session_ends.insert(session.to_string(), e.seq);
            }
        }
        self.exec_index = index;
    }

    /// Brings the indexes up to date with execution `id` after a change to its state or code
    /// (or its insertion). A code is only ever cleared through [`State::clear_pairing_code`].
    pub(crate) fn index_execution(&mut self, id: &str) {
        if let Some(e) = self.executions.get(id) {
            self.exec_index.add(e);
        }
    }

    /// Removes execution `id` from the records and the indexes.
    pub(crate) fn unindex_execution(&mut self, id: &str) -> Option<Execution> {
        let e = self.executions.remove(id)?;
        self.exec_index.remove(&e);
        Some(e)
    }

    /// Clears execution `id`'s pairing code (redeemed), in the record and the index.
    pub(crate) fn clear_pairing_code(&mut self, id: &str) {
        if let Some(e) = self.executions.get_mut(id)
            && let Some(code) = e.pairing_code.take()
        {
            self.exec_index.pairing.remove(&(code, id.to_string()));
        }
    }

    /// The pending and running executions, in id order.
    pub fn open_executions(&self) -> impl Iterator<Item = &Execution> + '_ {
        self.exec_index.open.iter().filter_map(|id| self.executions.get(id))
    }

    /// The executions holding pairing code `code`.
    pub fn executions_with_code<'a>(&'a self, code: &'a str) -> impl Iterator<Item = &'a Execution> + 'a {
        self.exec_index
            .pairing
            .range((code.to_string(), String::new())..)
            .take_while(move |(c, _)| c == code)
            .filter_map(|(_, id)| self.executions.get(id))
    }

    /// The executions of Computer `computer_id`, in id order.
    pub fn executions_of(&self, computer_id: &str) -> impl Iterator<Item = &Execution> + '_ {
        self.exec_index.by_computer.get(computer_id).into_iter().flatten().filter_map(|id| self.executions.get(id))
    }

    /// Whether the end of session `session_id` is recorded in the event window.
    pub fn session_end_seen(&self, session_id: &str) -> bool {
        self.exec_index.session_ends.contains_key(session_id)
    }

    /// The `computer_session` event recording the end of session `session_id`, while it is in
    /// the event window (found by its seq, not by a walk).
    pub fn session_end(&self, session_id: &str) -> Option<&Event> {
        let seq = *self.exec_index.session_ends.get(session_id)?;
        self.events_after(seq.saturating_sub(1)).next().filter(|e| e.seq == seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::model::ExecutionKind;

    fn exe(id: &str, computer: &str, state: ExecutionState, code: Option<&str>) -> Execution {
        let mut e = Execution::pending(id, "k", "h", ExecutionKind::Create, computer, 1);
        e.state = state;
        e.pairing_code = code.map(String::from);
        e
    }

    /// What a scan of the records finds, to compare the maintained index with.
    fn scanned(s: &State) -> ExecIndex {
        let mut t = s.clone();
        t.reindex_executions();
        t.exec_index
    }

    #[test]
    fn the_index_follows_every_change_and_equals_a_rebuild() {
        let mut s = State::default();
        for (id, c, st, code) in [
            ("e1", "c1", ExecutionState::Pending, Some("AAAAA-BBBBB")),
            ("e2", "c1", ExecutionState::Running, None),
            ("e3", "c2", ExecutionState::Succeeded, Some("AAAAA-BBBBB")),
            ("e4", "c3", ExecutionState::Failed, None),
        ] {
            s.executions.insert(id.into(), exe(id, c, st, code));
            s.index_execution(id);
        }
        assert_eq!(s.exec_index, scanned(&s));
        let open: Vec<&str> = s.open_executions().map(|e| e.id.as_str()).collect();
        assert_eq!(open, ["e1", "e2"]);
        let coded: Vec<&str> = s.executions_with_code("AAAAA-BBBBB").map(|e| e.id.as_str()).collect();
        assert_eq!(coded, ["e1", "e3"], "both executions of a shared code are found");
        assert_eq!(s.executions_with_code("AAAAA-BBBBC").count(), 0);
        assert_eq!(s.executions_with_code("AAAAA").count(), 0, "a prefix finds nothing");

        // A state change, a redeemed code and a removal each show at once.
        if let Some(e) = s.executions.get_mut("e2") {
            e.state = ExecutionState::OutcomeUnknown;
        }
        s.index_execution("e2");
        s.clear_pairing_code("e1");
        assert!(s.unindex_execution("e4").is_some());
        assert_eq!(s.exec_index, scanned(&s));
        assert_eq!(s.open_executions().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["e1"]);
        assert_eq!(s.executions_with_code("AAAAA-BBBBB").map(|e| e.id.as_str()).collect::<Vec<_>>(), ["e3"]);
        assert_eq!(s.executions_of("c1").count(), 2);
        assert_eq!(s.executions_of("c3").count(), 0);
        assert!(!s.exec_index.by_computer.contains_key("c3"), "an emptied Computer leaves the index");
    }

    #[test]
    fn session_ends_leave_with_their_events() {
        let mut s = State::default();
        let end = |sid: &str| serde_json::json!({"sessionId": sid, "owner": "o", "exitCode": 0, "signal": null});
        s.push_event(1, "computer_session", "c1", None, end("s-first"));
        assert!(s.session_end_seen("s-first"));
        for i in 0..crate::sm::EVENT_LOG_LEN {
            s.push_event(2, "ComputerStateChanged", "c1", None, serde_json::json!({"i": i}));
        }
        assert!(!s.session_end_seen("s-first"), "its event left the window");
        s.push_event(3, "computer_session", "c1", None, end("s-second"));
        assert!(s.session_end_seen("s-second"));
        assert_eq!(s.exec_index, scanned(&s));
        assert_eq!(s.exec_index.session_ends.len(), 1);
    }
}
