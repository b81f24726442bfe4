//! What every call on a Computer's agent does first, on the node that serves it: the caller's
//! rights, checked at a current read, and a paused Computer resumed (with the caller's rights);
//! then the agent's client from the owner path ([`crate::owner::Owners::agent`]).

use computerd_actors::link::Agent;
use computerd_raft::sm::Caller;
use computerd_raft::sm::ComputerState;

use super::ApiError;
use super::AppState;

/// Lets the call in: `write` calls need the right to operate the Computer, reads the right to
/// see it. A paused Computer is resumed first (a read needs no write right for that: the resume
/// is the caller's, with the rights the store re-checks). Marks the Computer busy.
pub async fn admit(state: &AppState, caller: &Caller, computer_id: &str, write: bool) -> Result<(), ApiError> {
    let paused = state.cluster.state().read(|s| {
        if write {
            s.check_operate(caller, computer_id)?;
        } else {
            s.visible_computer(caller, computer_id)?;
        }
        Ok::<_, computerd_raft::sm::Reject>(
            s.computers.get(computer_id).is_some_and(|c| c.state == ComputerState::Paused),
        )
    })?;
    if paused {
        super::computers::resume_for_call(state, caller, computer_id).await?;
    }
    state.activity.touch(computer_id);
    Ok(())
}

/// [`admit`], then a client of the Computer's agent on this node.
pub async fn agent_for(state: &AppState, caller: &Caller, computer_id: &str, write: bool) -> Result<Agent, ApiError> {
    admit(state, caller, computer_id, write).await?;
    Ok(state.owners.agent(computer_id).await?)
}
