//! Draining tool bindings the store already closed (a revoke, a removed grant, an archived bot,
//! the target of a switch) on their Computer's agent, wherever its link is. Kept apart from
//! `tools` so the grant and identity routes use it without importing the tool routes.

use computerd_proto::mcp::McpRequest;
use computerd_raft::sm::BindingState;
use computerd_raft::sm::ToolBinding;
use serde_json::Value;

use super::ApiError;
use super::AppState;

/// An agent's MCP reply: `Ok(result)` or its refusal (reason, message).
pub fn reply_of(reply: computerd_proto::mcp::McpReply) -> Result<Result<Value, (String, String)>, ApiError> {
    match (reply.result, reply.error) {
        (Some(r), None) if !r.is_null() => Ok(Ok(r)),
        (_, Some(e)) => Ok(Err((e.reason, e.message))),
        (_, None) => Ok(Err(("unknown".into(), "the agent answered neither a result nor a refusal".into()))),
    }
}

/// Drains bindings the store already closed (a revoke, a removed grant, an archived bot, the
/// target of a switch): each is revoked on the agent, which kills its UID's tasks and, once
/// none is left, removes its files. Not gated on the caller's rights on the Computer (closing
/// only takes rights away; the owner checks that the store closed each one) and never resumes a
/// paused Computer. Answers the bindings confirmed drained.
pub async fn drain(state: &AppState, token_id: &str, computer: &str, ids: &[String]) -> Vec<String> {
    let mut drained = Vec::new();
    for id in ids {
        let request = McpRequest::Revoke { binding_id: id.clone() };
        let local = async { state.owners.agent(computer).await.map_err(ApiError::from) };
        match state.owners.mcp(computer, &request, token_id, local).await.and_then(reply_of) {
            Ok(Ok(r)) if r["drained"] == true => {
                mark_drained(state, id).await;
                drained.push(id.clone());
            }
            Ok(Ok(r)) => {
                tracing::warn!(computer, binding = %id, answer = %r, "a closed binding's drain is unconfirmed")
            }
            Ok(Err((reason, message))) => {
                tracing::warn!(computer, binding = %id, %reason, %message, "the agent refused a closed binding's drain")
            }
            Err(e) => tracing::warn!(computer, binding = %id, error = %e.message, "a closed binding was not drained"),
        }
    }
    drained
}

/// Tells the store that a closed binding's runtime is confirmed stopped (a cancelling switch it
/// took part in ends once all its participants are). A failure is logged: the switch then stays
/// cancelling until a later drain of the binding is reported.
pub async fn mark_drained(state: &AppState, id: &str) {
    let report = computerd_raft::sm::Command::BindingDrained { binding_id: id.to_string() };
    if let Err(e) = super::util::propose(state, report).await {
        tracing::warn!(binding = %id, error = %e.message, "a binding's drain was not recorded");
    }
}

/// The bot's bindings not yet closed, on one Computer or all, at a current read: what a grant's
/// removal (or the bot's archive) is about to close.
pub async fn open_bindings(
    state: &AppState,
    bot_id: &str,
    computer: Option<&str>,
) -> Result<Vec<(String, String)>, ApiError> {
    state.cluster.read_barrier().await?;
    Ok(state.cluster.state().read(|s| {
        let open = |b: &&ToolBinding| b.state != BindingState::Revoked;
        let rows = |b: &ToolBinding| (b.computer_id.clone(), b.id.clone());
        match computer {
            Some(c) => s.bindings_of(bot_id, c).filter(open).map(rows).collect(),
            None => s.bindings_of_bot(bot_id).filter(open).map(rows).collect(),
        }
    }))
}

/// After a grant's removal (or the bot's archive) committed: drains the bindings it closed, in
/// the background (the agent may be slow or away; the store already refuses them).
pub fn drain_closed(state: &AppState, token_id: &str, closed: Vec<(String, String)>) {
    if closed.is_empty() {
        return;
    }
    let (state, token_id) = (state.clone(), token_id.to_string());
    tokio::spawn(async move {
        let mut by_computer: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (c, id) in closed {
            by_computer.entry(c).or_default().push(id);
        }
        for (c, ids) in by_computer {
            drain(&state, &token_id, &c, &ids).await;
        }
    });
}
