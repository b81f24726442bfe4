//! What every call on a Computer's agent does first, on the node that serves it: the caller's
//! rights, checked at a current read, and a paused Computer resumed (with the caller's rights);
//! then the agent's client from the owner path ([`crate::owner::Owners::agent`]).
//!
//! An idle pause never freezes a call's work: near the Computer's deadline, or while an idle
//! pause of it is pending, the call marks its work in the store before it is let through
//! ([`computerd_actors::idle::Activity::before_call`]); a pending idle pause is then cancelled,
//! and a pause already sent is waited for and the Computer resumed.

use computerd_actors::idle::Gate;
use computerd_actors::link::Agent;
use computerd_proto::ErrorKind;
use computerd_raft::sm::Caller;
use computerd_raft::sm::ExecutionState;

use super::ApiError;
use super::AppState;

/// How long a call waits for a pause that was sent, and the resume after it.
const PAUSE_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Lets the call in: `write` calls need the right to operate the Computer, reads the right to
/// see it. A paused Computer is resumed first (a read needs no write right for that: the resume
/// is the caller's, with the rights the store re-checks); a pause being sent is waited for,
/// then resumed. Marks the Computer busy.
pub async fn admit(state: &AppState, caller: &Caller, computer_id: &str, write: bool) -> Result<(), ApiError> {
    let deadline = tokio::time::Instant::now() + PAUSE_WAIT;
    loop {
        state.cluster.state().read(|s| {
            if write {
                s.check_operate(caller, computer_id).map(|_| ())
            } else {
                s.visible_computer(caller, computer_id).map(|_| ())
            }
        })?;
        match state.activity.before_call(&state.cluster, computer_id).await? {
            Gate::Go => return Ok(()),
            Gate::Paused => super::computers::resume_for_call(state, caller, computer_id).await?,
            Gate::Wait(exe) => wait_ended(state, &exe, deadline).await?,
            Gate::Retry => state.cluster.read_barrier().await?,
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::new(ErrorKind::Unavailable, "the computer is still pausing or resuming"));
        }
    }
}

/// Waits until the pause `exe` (sent) has ended; its unknown outcome is the call's error (a
/// member decides it).
async fn wait_ended(state: &AppState, exe: &str, deadline: tokio::time::Instant) -> Result<(), ApiError> {
    let mut applied = state.cluster.state().subscribe();
    loop {
        match state.cluster.state().read(|s| s.executions.get(exe).map(|e| e.state)) {
            None | Some(ExecutionState::Succeeded | ExecutionState::Failed) => return Ok(()),
            Some(ExecutionState::OutcomeUnknown) => {
                let mut e = ApiError::new(
                    ErrorKind::ComputerConflict,
                    "a pause of this computer has an unknown outcome: a member decides it first",
                );
                e.execution_id = Some(exe.to_string());
                return Err(e);
            }
            Some(ExecutionState::Pending | ExecutionState::Running) => {}
        }
        if tokio::time::timeout_at(deadline, applied.changed()).await.is_err() {
            let mut e = ApiError::new(ErrorKind::Unavailable, "the computer is still pausing");
            e.execution_id = Some(exe.to_string());
            return Err(e);
        }
    }
}

/// [`admit`], then a client of the Computer's agent on this node.
pub async fn agent_for(state: &AppState, caller: &Caller, computer_id: &str, write: bool) -> Result<Agent, ApiError> {
    admit(state, caller, computer_id, write).await?;
    Ok(state.owners.agent(computer_id).await?)
}

/// The Computer's link on this node (for a tunnel), after the same checks as [`agent_for`].
pub async fn link_for(
    state: &AppState,
    caller: &Caller,
    computer_id: &str,
    write: bool,
) -> Result<computerd_actors::link::Link, ApiError> {
    admit(state, caller, computer_id, write).await?;
    Ok(state.owners.link(computer_id).await?)
}

/// Who a session or file call runs as on the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// `""` (the Computer's default account: `user` in a sandbox) or `"root"`.
    pub user: String,
    /// The caller may act as root: a member with a token that may write, or a bot whose grant
    /// on the Computer says `allowRoot` (the agent refuses anything that would run as root
    /// without it, its default account included).
    pub root_allowed: bool,
}

/// Parses a call's `user` (`"user"`, the default, or `"root"`), before anything else is done.
pub fn parse_user(user: Option<&str>) -> Result<&'static str, ApiError> {
    match user {
        None | Some("user") => Ok(""),
        Some("root") => Ok("root"),
        Some(_) => Err(ApiError::invalid("user must be \"user\" or \"root\"")),
    }
}

/// The caller's right to act as root on the Computer, checked at the current state on the node
/// serving the call: `"root"` without it is `forbidden`.
pub fn run_as(state: &AppState, caller: &Caller, computer_id: &str, user: &str) -> Result<RunAs, ApiError> {
    let root_allowed = state.cluster.state().read(|s| s.may_be_root(caller, computer_id));
    if user == "root" && !root_allowed {
        return Err(ApiError::new(
            ErrorKind::Forbidden,
            "running as root needs a member's token that may write, or a bot whose grant on this computer allows root",
        ));
    }
    Ok(RunAs { user: user.to_string(), root_allowed })
}

/// Where a caller may read files from on a Computer, for the agent's `within` check: a bot on a
/// paired machine reads only under the paths its grant names (checked by the agent on the opened
/// file's real path, so a symlink does not lead out), and is refused when the grant names none;
/// a member, and any caller on a sandbox, reads anywhere (empty: no bound).
pub fn read_roots(state: &AppState, caller: &Caller, computer_id: &str) -> Result<Vec<String>, ApiError> {
    let Some(bot) = &caller.bot else { return Ok(Vec::new()) };
    let (paired, paths) = state.cluster.state().read(|s| {
        let paired = s.computers.get(computer_id).is_some_and(|c| c.source == computerd_raft::sm::Source::Paired);
        let paths = s.grants.get(computer_id).and_then(|g| g.get(&bot.id)).map(|g| g.paths.clone()).unwrap_or_default();
        (paired, paths)
    });
    match (paired, paths) {
        (true, paths) if paths.is_empty() => Err(ApiError::new(
            ErrorKind::Forbidden,
            "on a paired machine a bot reads only from the paths its grant names, and this grant names none",
        )),
        (true, paths) => Ok(paths),
        (false, _) => Ok(Vec::new()),
    }
}
