//! Usage: run spans per Computer. A span opens on a confirmed create or resume and closes on a
//! confirmed pause or delete (or a vanished sandbox); an unknown pause or delete flags the open
//! span instead. The provider bills; the store only records.
//!
//! A Computer keeps its newest [`MAX_SPANS_PER_COMPUTER`] spans; older (closed) ones are folded
//! into its [`FoldedUsage`] (how many, and their total ms), so the totals stay exact.

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

/// The most run spans kept per Computer (the newest); older ones are folded into its
/// [`FoldedUsage`].
pub const MAX_SPANS_PER_COMPUTER: usize = 1_000;

/// The run spans of a Computer no longer kept, as totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FoldedUsage {
    /// How many spans were folded.
    pub spans: u64,
    /// Their total length, ms.
    pub ms: u64,
}

impl State {
    /// Opens a run span at `at`, unless one is open already. Past [`MAX_SPANS_PER_COMPUTER`],
    /// the oldest span (closed: only the newest may be open) is folded into the totals.
    pub(crate) fn open_span(&mut self, computer_id: &str, at: u64, outcome_unknown: bool) {
        let spans = self.usage.entry(computer_id.to_string()).or_default();
        if spans.back().is_some_and(|s| s.end.is_none()) {
            return;
        }
        spans.push_back(UsageSpan { start: at, end: None, ended_by: None, outcome_unknown });
        let mut folded = FoldedUsage::default();
        while spans.len() > MAX_SPANS_PER_COMPUTER {
            let Some(old) = spans.pop_front() else { break };
            folded.spans += 1;
            folded.ms = folded.ms.saturating_add(old.end.unwrap_or(old.start).saturating_sub(old.start));
        }
        if folded.spans > 0 {
            let total = self.usage_folded.entry(computer_id.to_string()).or_default();
            total.spans = total.spans.saturating_add(folded.spans);
            total.ms = total.ms.saturating_add(folded.ms);
        }
    }

    /// The spans of `computer_id` no longer kept, as totals (zero when none were folded).
    pub fn folded_usage(&self, computer_id: &str) -> FoldedUsage {
        self.usage_folded.get(computer_id).copied().unwrap_or_default()
    }

    /// Forgets the usage record of `computer_id` (its kept spans and its folded totals).
    pub(crate) fn remove_usage(&mut self, computer_id: &str) {
        self.usage.remove(computer_id);
        self.usage_folded.remove(computer_id);
    }

    /// Closes the open run span, if any (never before its start).
    pub(crate) fn close_span(&mut self, computer_id: &str, at: u64, how: SpanEnd) {
        if let Some(s) = self.usage.get_mut(computer_id).and_then(|v| v.back_mut()).filter(|s| s.end.is_none()) {
            s.end = Some(at.max(s.start));
            s.ended_by = Some(how);
            s.outcome_unknown = false;
        }
    }

    /// Marks the open run span, if any, as touched by an outcome unknown (or clears the mark).
    pub(crate) fn flag_span(&mut self, computer_id: &str, flag: bool) {
        if let Some(s) = self.usage.get_mut(computer_id).and_then(|v| v.back_mut()).filter(|s| s.end.is_none()) {
            s.outcome_unknown = flag;
        }
    }
}
