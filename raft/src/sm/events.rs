//! The bounded event log: lifecycle events, oldest first, each with a strictly increasing
//! `seq` that readers use as their cursor (`GET /v1/events?after=`).

use serde::Deserialize;
use serde::Serialize;

use super::state::Caller;
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

    /// One page of the events after `after` that `caller` may see (at most `limit`), the cursor
    /// past every event looked at (seen or not, so a caller who sees none of the new ones does
    /// not look at them again), and the first event still held when events after `after` were
    /// dropped from the bounded log (a gap the caller is told of).
    pub fn events_page(&self, caller: &Caller, after: u64, limit: usize) -> EventsPage {
        let gap = self.events.front().map(|e| e.seq).filter(|first| after.saturating_add(1) < *first);
        let mut events = Vec::new();
        let mut cursor = after;
        for e in self.events_after(after) {
            cursor = e.seq;
            if self.computers.get(&e.computer_id).is_some_and(|c| self.could_see(caller, c)) {
                events.push(e.clone());
                if events.len() >= limit {
                    break;
                }
            }
        }
        EventsPage { events, cursor: cursor.max(after), gap }
    }
}

/// What [`State::events_page`] answers.
#[derive(Debug, Clone, PartialEq)]
pub struct EventsPage {
    /// The events the caller may see, oldest first.
    pub events: Vec<Event>,
    /// Where the next page starts.
    pub cursor: u64,
    /// The first event still held, when some after the cursor asked for were dropped.
    pub gap: Option<u64>,
}

/// The session a `computer_session` event records the end of.
pub(crate) fn ended_session(e: &Event) -> Option<&str> {
    (e.kind == "computer_session").then(|| e.data["sessionId"].as_str()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::testing::OWNER;
    use crate::sm::testing::computer;
    use crate::sm::testing::world;

    /// Issue 37, item 11: a page's cursor moves past events the caller cannot see, and a cursor
    /// from before the oldest event held is told of the gap (the first id still held).
    #[test]
    fn i37_11_the_cursor_passes_unseen_events_and_a_gap_is_told() {
        let mut s = world();
        for id in ["cmp_seen", "cmp_hidden"] {
            s.computers.insert(id.into(), computer(id, "mem_o", crate::sm::model::Source::Paired));
        }
        let owner = s.caller_by_token_id(OWNER).expect("owner");
        let bot = s.caller_by_token_id("tok_bot").expect("bot");
        for i in 0..10 {
            s.push_event(i, "ComputerStateChanged", "cmp_hidden", None, serde_json::json!({}));
        }
        // The bot sees none of them: its cursor still moves to the last one looked at.
        let page = s.events_page(&bot, 0, 1000);
        assert_eq!((page.events.len(), page.cursor, page.gap), (0, 10, None));
        let page = s.events_page(&owner, 0, 3);
        assert_eq!((page.events.len(), page.cursor), (3, 3));
        // Past the log's bound the oldest go: a cursor before them hears of the gap.
        for i in 0..EVENT_LOG_LEN as u64 {
            s.push_event(i, "ComputerStateChanged", "cmp_seen", None, serde_json::json!({}));
        }
        let first = s.events.front().map(|e| e.seq).expect("events");
        assert_eq!(first, 11);
        let page = s.events_page(&owner, 3, 2);
        assert_eq!(page.gap, Some(first));
        assert_eq!(page.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [11, 12]);
        assert_eq!(page.cursor, 12);
        // From the event before the first held, nothing is missing.
        assert_eq!(s.events_page(&owner, first - 1, 1).gap, None);
    }
}
