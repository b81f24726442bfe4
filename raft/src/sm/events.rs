//! The bounded event log: lifecycle events, oldest first, each with a strictly increasing
//! `seq` that readers use as their cursor (`GET /v1/events?after=`).

use serde::Deserialize;
use serde::Serialize;

use super::state::State;

/// How many events the log keeps.
pub const EVENT_LOG_LEN: usize = 10_000;

/// A lifecycle event in the bounded event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Cursor: strictly increasing.
    pub seq: u64,
    /// Unix ms.
    pub at: u64,
    /// `ExecutionStarted`, `ExecutionFinished`, `DecisionNeeded`, `ComputerStateChanged`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The Computer concerned.
    pub computer_id: String,
    /// The execution concerned, if any.
    pub execution_id: Option<String>,
    /// Details.
    pub data: serde_json::Value,
}

impl State {
    /// Appends an event with the next `seq`, dropping the oldest past [`EVENT_LOG_LEN`].
    pub(crate) fn push_event(
        &mut self,
        at: u64,
        kind: &str,
        computer_id: &str,
        execution_id: Option<&str>,
        data: serde_json::Value,
    ) {
        self.next_event_seq += 1;
        let event = Event {
            seq: self.next_event_seq,
            at,
            kind: kind.to_string(),
            computer_id: computer_id.to_string(),
            execution_id: execution_id.map(String::from),
            data,
        };
        if let Some(session) = ended_session(&event) {
            self.exec_index.session_ends.insert(session.to_string(), event.seq);
        }
        self.events.push_back(event);
        while self.events.len() > EVENT_LOG_LEN {
            let Some(old) = self.events.pop_front() else { break };
            if let Some(session) = ended_session(&old)
                && self.exec_index.session_ends.get(session) == Some(&old.seq)
            {
                self.exec_index.session_ends.remove(session);
            }
        }
    }

    /// The events after cursor `after`, oldest first, found by position (seqs are consecutive
    /// in the window), not by a walk from the oldest.
    pub fn events_after(&self, after: u64) -> impl Iterator<Item = &Event> + '_ {
        let first = self.events.front().map_or(0, |e| e.seq);
        let skip = usize::try_from(after.saturating_add(1).saturating_sub(first)).unwrap_or(usize::MAX);
        self.events.range(skip.min(self.events.len())..).filter(move |e| e.seq > after)
    }
}

/// The session a `computer_session` event records the end of.
pub(crate) fn ended_session(e: &Event) -> Option<&str> {
    (e.kind == "computer_session").then(|| e.data["sessionId"].as_str()).flatten()
}
