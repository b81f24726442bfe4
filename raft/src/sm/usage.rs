//! Usage: run spans per Computer. A span opens on a confirmed create or resume and closes on a
//! confirmed pause or delete (or a vanished sandbox); an unknown pause or delete flags the open
//! span instead. The provider bills; the store only records.

use serde::Deserialize;
use serde::Serialize;

use super::state::State;

/// How a run span ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpanEnd {
    /// A confirmed pause.
    Pause,
    /// A confirmed delete.
    Delete,
    /// A failure.
    Failure,
}

/// A time span in which a sandbox ran (the provider bills it; we only record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageSpan {
    /// Unix ms.
    pub start: u64,
    /// Unix ms, once ended.
    pub end: Option<u64>,
    /// How it ended.
    pub ended_by: Option<SpanEnd>,
    /// A pause or delete of unknown outcome touched this span: it is open but uncertain.
    pub outcome_unknown: bool,
}

impl State {
    /// Opens a run span at `at`, unless one is open already.
    pub(crate) fn open_span(&mut self, computer_id: &str, at: u64, outcome_unknown: bool) {
        let spans = self.usage.entry(computer_id.to_string()).or_default();
        if spans.last().is_some_and(|s| s.end.is_none()) {
            return;
        }
        spans.push(UsageSpan { start: at, end: None, ended_by: None, outcome_unknown });
    }

    /// Closes the open run span, if any (never before its start).
    pub(crate) fn close_span(&mut self, computer_id: &str, at: u64, how: SpanEnd) {
        if let Some(s) = self.usage.get_mut(computer_id).and_then(|v| v.last_mut()).filter(|s| s.end.is_none()) {
            s.end = Some(at.max(s.start));
            s.ended_by = Some(how);
            s.outcome_unknown = false;
        }
    }

    /// Marks the open run span, if any, as touched by an outcome unknown (or clears the mark).
    pub(crate) fn flag_span(&mut self, computer_id: &str, flag: bool) {
        if let Some(s) = self.usage.get_mut(computer_id).and_then(|v| v.last_mut()).filter(|s| s.end.is_none()) {
            s.outcome_unknown = flag;
        }
    }
}
