//! The deadline rule of calls on a Computer, which both ends of a routed call and the link's
//! callers apply: the owner has [`ACCEPT`] to take a routed call (answer its stream's headers),
//! and a call has its kind's bound plus [`MARGIN`].

use std::time::Duration;

/// How long the owner has to take a routed call (to answer its stream's headers): a live owner
/// answers at once, before the call's work starts, so waiting longer only waits on a node that
/// hangs.
pub const ACCEPT: Duration = Duration::from_secs(5);
/// What a call gets past its own bound: the hops between nodes and the store's writes.
pub const MARGIN: Duration = Duration::from_secs(10);
/// The kinds of call on a Computer, each with the bound that sets its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// A session call: it yields after at most 30 s (`yieldTimeMs`).
    Session,
    /// A file or directory call: up to 16 MiB streamed.
    File,
    /// An MCP request (install, discover, call, switch, revoke): the agent bounds each server
    /// run by its own deadline (45 s by default); an install or switch runs one after its work.
    Tool,
}

impl CallKind {
    /// The call's own bound.
    pub const fn bound(self) -> Duration {
        match self {
            CallKind::Session => Duration::from_secs(30),
            CallKind::File => Duration::from_secs(120),
            CallKind::Tool => Duration::from_secs(120),
        }
    }

    /// The whole call's deadline: its bound plus the margin.
    pub const fn deadline(self) -> Duration {
        Duration::from_secs(self.bound().as_secs() + MARGIN.as_secs())
    }
}

/// The deadline of one session call that yields after `yield_ms`.
pub fn session_call(yield_ms: u32) -> Duration {
    Duration::from_millis(yield_ms as u64) + MARGIN
}
