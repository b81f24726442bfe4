//! Helpers shared by the route modules.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;

use super::ApiError;
use super::AppState;

/// A JSON body whose parse error is answered only after authentication.
pub type Body<T> = Result<Json<T>, JsonRejection>;

/// Proposes a command; a refusal becomes the matching API error. Answers the id a command names.
pub async fn propose(state: &AppState, cmd: Command) -> Result<Option<String>, ApiError> {
    match state.cluster.propose(Request::new(cmd)).await? {
        Response::Ok => Ok(None),
        Response::Id(id) => Ok(Some(id)),
        Response::Rejected(r) => Err(r.into()),
    }
}

/// A stream's `Last-Event-ID`, when sent: a number (`what` names it in the error).
pub fn last_event_id(headers: &axum::http::HeaderMap, what: &str) -> Result<Option<u64>, ApiError> {
    headers
        .get("last-event-id")
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| ApiError::invalid(format!("Last-Event-ID is {what}")))
        })
        .transpose()
}

/// A display name: 1 to 200 printable characters, trimmed.
pub fn check_name(name: &str) -> Result<String, ApiError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 200 || name.chars().any(char::is_control) {
        return Err(ApiError::invalid("name must be 1 to 200 printable characters"));
    }
    Ok(name.to_string())
}

/// An id of the form `prefix_[A-Za-z0-9_-]+`, at most 100 bytes.
pub fn check_id(id: &str, prefix: &str, what: &str) -> Result<(), ApiError> {
    if crate::ids::is_id(id, prefix) {
        Ok(())
    } else {
        Err(ApiError::invalid(format!("{what} must be an id starting with {prefix}_")))
    }
}

/// Computer `id` as `caller` may see it, with its provider's record (`None` for an own machine,
/// or a provider this node does not know yet).
pub fn with_provider(
    state: &AppState,
    caller: &computerd_raft::sm::Caller,
    id: &str,
) -> Result<(computerd_raft::sm::Computer, Option<computerd_raft::sm::Provider>), ApiError> {
    Ok(state.cluster.state().read(|s| {
        let c = s.visible_computer(caller, id)?.clone();
        let p = match &c.source {
            computerd_raft::sm::Source::Provider { provider, .. } => s.providers.get(provider).cloned(),
            computerd_raft::sm::Source::Paired => None,
        };
        Ok::<_, computerd_raft::sm::Reject>((c, p))
    })?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_are_checked() {
        assert!(check_name("  ok  ").is_ok_and(|n| n == "ok"));
        assert!(check_name("").is_err());
        assert!(check_name("a\u{7}b").is_err());
        assert!(check_name(&"x".repeat(201)).is_err());
        assert!(check_id("bot_abc", "bot", "x").is_ok());
        assert!(check_id("bot_", "bot", "x").is_err());
        assert!(check_id("mem_abc", "bot", "x").is_err());
        assert!(check_id("bot_a/b", "bot", "x").is_err());
    }
}
