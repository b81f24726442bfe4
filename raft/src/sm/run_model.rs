//! The records of turns and runs (SPEC §7): a Run, its bounded event log, its lease, and the
//! derived indexes that let claims, lease expiry and retention find their runs without a scan.
//! The commands that move them are in `runs`.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;

/// At most this many events per run (its `partial`, `activity`, `state` and `final` events).
pub const MAX_RUN_EVENTS: usize = 1000;
/// At most this many bytes of event data per run (JSON).
pub const MAX_RUN_EVENT_BYTES: usize = 1 << 20;
/// A runtime's events (`partial`, `activity`) stop this many events short of the cap, and
/// [`RUNTIME_EVENT_BYTES`] short of the byte cap, so the run's own `state` and `final` events
/// always fit.
pub const RESERVED_EVENTS: usize = 50;
/// See [`RESERVED_EVENTS`].
pub const RUNTIME_EVENT_BYTES: usize = MAX_RUN_EVENT_BYTES - 128 * 1024;
/// One event's data is at most this large (JSON bytes).
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// A run whose lease was lost this many times fails instead of going back to the queue.
pub const MAX_ATTEMPTS: u32 = 20;
/// Unfinished runs (queued, running, needing a decision) one member's bots may have.
pub const MAX_OPEN_RUNS_PER_MEMBER: usize = 1000;
/// Attachments per turn.
pub const MAX_ATTACHMENTS: usize = 32;
/// A turn's text is at most this many bytes.
pub const MAX_TURN_TEXT: usize = 64 * 1024;
/// Leases last between these, ms (30 s when the claim does not say).
pub const MIN_LEASE_MS: u64 = 2_000;
/// See [`MIN_LEASE_MS`].
pub const MAX_LEASE_MS: u64 = 10 * 60 * 1000;
/// See [`MIN_LEASE_MS`].
pub const DEFAULT_LEASE_MS: u64 = 30_000;

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Waiting for a runtime to claim it.
    Queued,
    /// A runtime holds its lease.
    Running,
    /// Its runtime was lost while an action of the run was dispatching or unknown: a person
    /// decides (requeue or fail); it is never run again blindly.
    NeedsDecision,
    /// Ended by its runtime, with a result.
    Succeeded,
    /// Ended by its runtime or a person, with an error.
    Failed,
    /// Cancelled by a person.
    Cancelled,
}

impl RunState {
    /// True once the run ended.
    pub fn finished(self) -> bool {
        matches!(self, RunState::Succeeded | RunState::Failed | RunState::Cancelled)
    }

    /// Its name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Running => "running",
            RunState::NeedsDecision => "needs_decision",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
        }
    }
}

/// What happens to the run's Computer after it ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AfterRun {
    /// Stay running; the idle plan decides.
    #[default]
    KeepWarm,
    /// Pause it.
    Pause,
}

/// A file handed to a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Attachment {
    /// File name.
    pub name: String,
    /// Media type.
    pub mime_type: String,
    /// Bytes (checked against the blob).
    pub size: u64,
    /// The blob.
    pub blob_id: String,
}

/// One event of a run; `seq` counts from 1 and is the SSE id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEvent {
    /// Position in the run, from 1.
    pub seq: u64,
    /// `partial`, `activity`, `state` or `final`.
    pub kind: String,
    /// Its data.
    pub data: Value,
    /// Cluster ms.
    pub at: u64,
}

/// The runtime attempt holding a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The attempt's claim (fences out any other attempt).
    pub claim: String,
    /// Token id of the runtime.
    pub token_id: String,
    /// Cluster ms at which it lapses unless renewed.
    pub expires_at: u64,
}

/// A run: one turn's work by a bot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// `run_…`
    pub id: String,
    /// The member whose bot works it.
    pub member_id: String,
    /// The bot that works it.
    pub bot_id: String,
    /// Who started the turn: the member, or (`Some`) the bot itself.
    #[serde(default)]
    pub started_by_bot: bool,
    /// The caller's idempotency id.
    pub client_turn_id: String,
    /// The turn's text.
    pub text: String,
    /// Its files.
    #[serde(default)]
    pub attachments: Vec<Attachment>,
    /// After the run.
    #[serde(default)]
    pub after_run: AfterRun,
    /// Where it stands.
    pub state: RunState,
    /// The runtime attempt holding it, while running.
    #[serde(default)]
    pub lease: Option<Lease>,
    /// How many times a runtime claimed it.
    #[serde(default)]
    pub attempts: u32,
    /// Cluster ms.
    pub created_at: u64,
    /// Cluster ms of the last change of state.
    pub updated_at: u64,
    /// Cluster ms at which it ended.
    #[serde(default)]
    pub finished_at: Option<u64>,
    /// The runtime's result (a succeeded run).
    #[serde(default)]
    pub result: Option<Value>,
    /// Why it failed, was cancelled, or needs a decision.
    #[serde(default)]
    pub error: Option<String>,
    /// The keys of the action records that made it need a decision.
    #[serde(default)]
    pub undecided_actions: Vec<String>,
    /// Its events, in order (bounded: [`MAX_RUN_EVENTS`], [`MAX_RUN_EVENT_BYTES`]).
    #[serde(default)]
    pub events: Vec<RunEvent>,
    /// Bytes of `events`' data.
    #[serde(default)]
    pub event_bytes: usize,
}

impl Run {
    /// The events after `seq` (SSE's `Last-Event-ID`), at most `limit`.
    pub fn events_after(&self, seq: u64, limit: usize) -> &[RunEvent] {
        // Seqs are 1..=len, in order: the position is the seq.
        let from = usize::try_from(seq).unwrap_or(usize::MAX).min(self.events.len());
        let to = from.saturating_add(limit).min(self.events.len());
        &self.events[from..to]
    }

    /// The last event's seq (0 when none).
    pub fn last_seq(&self) -> u64 {
        self.events.len() as u64
    }
}

/// The runs, the turn ids that name them, and derived indexes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunBook {
    /// id -> run.
    #[serde(default)]
    pub runs: BTreeMap<String, Run>,
    /// turn scope (member, bot or not, client turn id) -> run id.
    #[serde(default)]
    pub turns: BTreeMap<String, String>,
    /// The derived indexes (rebuilt when a snapshot loads).
    #[serde(skip)]
    pub index: RunIndex,
}

/// Indexes over [`RunBook::runs`] and the action records of runs; never serialized.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunIndex {
    /// bot id -> (created at, run id) of its queued runs, oldest first (claims).
    pub queued: BTreeMap<String, BTreeSet<(u64, String)>>,
    /// (expires at, run id) of held leases, soonest first (expiry).
    pub leases: BTreeSet<(u64, String)>,
    /// (finished at, run id), oldest first (retention).
    pub finished: BTreeSet<(u64, String)>,
    /// member id -> how many of their bots' runs are unfinished.
    pub open: BTreeMap<String, usize>,
    /// run id -> keys of its browser action records.
    pub actions: BTreeMap<String, BTreeSet<String>>,
    /// blob id -> (bot id, run id) of the runs it is attached to (the bot may read it).
    pub attached: BTreeMap<String, BTreeSet<(String, String)>>,
}

impl RunIndex {
    /// Adds `r` as it is now.
    pub fn add(&mut self, r: &Run) {
        for a in &r.attachments {
            self.attached.entry(a.blob_id.clone()).or_default().insert((r.bot_id.clone(), r.id.clone()));
        }
        match r.state {
            RunState::Queued => {
                self.queued.entry(r.bot_id.clone()).or_default().insert((r.created_at, r.id.clone()));
            }
            RunState::Running => {
                if let Some(l) = &r.lease {
                    self.leases.insert((l.expires_at, r.id.clone()));
                }
            }
            _ => {}
        }
        if r.state.finished() {
            self.finished.insert((r.finished_at.unwrap_or(r.updated_at), r.id.clone()));
        } else {
            *self.open.entry(r.member_id.clone()).or_default() += 1;
        }
    }

    /// Removes `r` as it was.
    pub fn remove(&mut self, r: &Run) {
        for a in &r.attachments {
            if let Some(runs) = self.attached.get_mut(&a.blob_id) {
                runs.remove(&(r.bot_id.clone(), r.id.clone()));
                if runs.is_empty() {
                    self.attached.remove(&a.blob_id);
                }
            }
        }
        if let Some(q) = self.queued.get_mut(&r.bot_id) {
            q.remove(&(r.created_at, r.id.clone()));
            if q.is_empty() {
                self.queued.remove(&r.bot_id);
            }
        }
        if let Some(l) = &r.lease {
            self.leases.remove(&(l.expires_at, r.id.clone()));
        }
        if r.state.finished() {
            self.finished.remove(&(r.finished_at.unwrap_or(r.updated_at), r.id.clone()));
        } else if let Some(n) = self.open.get_mut(&r.member_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.open.remove(&r.member_id);
            }
        }
    }
}

impl RunBook {
    /// The scope of a turn id: the same id from another caller is another turn.
    pub fn turn_scope(member_id: &str, by_bot: Option<&str>, client_turn_id: &str) -> String {
        format!("{member_id}\u{1f}{}\u{1f}{client_turn_id}", by_bot.unwrap_or(""))
    }

    /// Changes run `id` through `f`, keeping the indexes true.
    pub fn update<T>(&mut self, id: &str, f: impl FnOnce(&mut Run) -> T) -> Option<T> {
        let r = self.runs.get_mut(id)?;
        self.index.remove(r);
        let out = f(r);
        self.index.add(r);
        Some(out)
    }

    /// Rebuilds the indexes of the runs (the action part is then refilled by the state, from
    /// the action records).
    pub fn reindex(&mut self) {
        let mut index = RunIndex::default();
        for r in self.runs.values() {
            index.add(r);
        }
        self.index = index;
    }

    /// The soonest lease expiry, for the node that proposes the tick.
    pub fn next_expiry(&self) -> Option<u64> {
        self.index.leases.first().map(|(at, _)| *at)
    }

    /// True when bot `bot_id` has a queued run (a claim has something to take).
    pub fn has_queued(&self, bot_id: &str) -> bool {
        self.index.queued.get(bot_id).is_some_and(|q| !q.is_empty())
    }
}
