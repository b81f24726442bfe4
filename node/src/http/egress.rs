//! `PUT/GET /v1/computers/:id/egress`: where a Computer's sandbox may connect.
//!
//! A member who may use the Computer sets the policy; a bot asks (capability `computers.egress`:
//! by default a pending approval holding the policy, applied when a member approves it, in
//! `approvals::decide`). The provider applies it first (a docker
//! sandbox's egress gateway answers once the new rules hold and the connections they deny are
//! cut), and then it is stored. So a refused or failed change leaves both as they were. A `GET`
//! answers the stored policy and, from the gateway, what it let through, denied (with the
//! latest denials: host, port, time) and cut.

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use computerd_proto::ErrorKind;
use computerd_proto::egress::EgressPolicy;
use computerd_raft::sm::Caller;
use computerd_raft::sm::Capability;
use computerd_raft::sm::Command;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::Effect;
use computerd_raft::sm::Provider as ProviderRecord;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::Body;
use super::util::propose;
use crate::ids::new_id;
use crate::ids::now_ms;

/// An egress policy (the body of `PUT …/egress`, and `egress` of a create).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressIn {
    /// `allow` or `deny`: what a connection no entry names gets.
    #[schema(example = "deny")]
    default: String,
    /// Let through: host names (`pypi.org`), wildcards (`*.example.com`: names under it, not
    /// itself), IP addresses and CIDR ranges; at most 128. Names are matched on TLS SNI and
    /// HTTP `Host`; other protocols go by address.
    #[serde(default)]
    allow: Vec<String>,
    /// Refused, before `allow` is looked at: the same kinds of entries; at most 128.
    #[serde(default)]
    deny: Vec<String>,
}

impl EgressIn {
    /// The policy, checked (a 400 names the entry).
    pub fn policy(self) -> Result<EgressPolicy, ApiError> {
        let default = match self.default.as_str() {
            "allow" => computerd_proto::egress::DefaultAction::Allow,
            "deny" => computerd_proto::egress::DefaultAction::Deny,
            other => return Err(ApiError::invalid(format!("default must be \"allow\" or \"deny\", not {other:?}"))),
        };
        let p = EgressPolicy { default, allow: self.allow, deny: self.deny };
        p.compile().map_err(ApiError::invalid)?;
        Ok(p)
    }
}

/// Whether provider `p` can hold a Computer to `policy` (a 422 `ComputerUnsupported` if not).
pub fn check_provider(p: &ProviderRecord, policy: &EgressPolicy) -> Result<(), ApiError> {
    computerd_actors::factory::check_egress(p, policy).map_err(|e| ApiError::new(ErrorKind::ComputerUnsupported, e))
}

/// `PUT /v1/computers/:id/egress`
#[utoipa::path(put, path = "/v1/computers/{id}/egress", operation_id = "computers_egress_put", tag = "computers", params(("id" = String, Path)), request_body = EgressIn, responses((status = 200, description = "`{\"policy\"}`: applied by the provider, then stored", body = Object), (status = 202, description = "A bot's request, waiting for a member: `{\"approvalId\", \"state\": \"pending\", \"policy\"}` (capability `computers.egress`)", body = Object), (status = 400, body = ErrorBody), (status = 403, description = "A read-only token, or a rule denies the bot", body = ErrorBody), (status = 409, description = "No sandbox yet, or one created without a policy (no gateway)", body = ErrorBody), (status = 422, description = "ComputerUnsupported: an own machine, or a provider that cannot", body = ErrorBody)), security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<EgressIn>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body?;
    let policy = b.policy()?;
    if caller.bot.is_some() {
        // A bot asks, unless a rule lets it set egress without asking.
        let decided = state.cluster.state().read(|s| {
            s.visible_computer(&caller, &id)?;
            Ok::<_, computerd_raft::sm::Reject>(computerd_raft::sm::decide(
                &s.rules(),
                Capability::Egress,
                &caller,
                &id,
            ))
        })?;
        match decided {
            computerd_raft::sm::Decided::Effect(Effect::Allow) => {}
            computerd_raft::sm::Decided::Effect(Effect::Ask) => {
                let approval_id = new_id("apr");
                let cmd = Command::RequestEgress {
                    by: caller.token.id.clone(),
                    computer_id: id,
                    policy: policy.clone(),
                    approval_id: approval_id.clone(),
                    reason: None,
                    at_ms: now_ms(),
                };
                propose(&state, cmd).await?;
                let v = json!({"approvalId": approval_id, "state": "pending", "policy": policy});
                return Ok((StatusCode::ACCEPTED, Json(v)));
            }
            _ => {
                return Err(ApiError::new(
                    ErrorKind::Forbidden,
                    "computers.egress is denied to this bot: only a member sets a Computer's egress",
                ));
            }
        }
    }
    apply(&state, &caller, &id, &policy).await?;
    Ok((StatusCode::OK, Json(json!({"policy": policy}))))
}

/// Has the provider apply `policy` to Computer `id`'s sandbox, then stores it as `caller`'s
/// change: a refusal or failure of either leaves the sandbox's policy as it was (the provider's
/// is applied only when its checks pass; the store re-checks `caller`'s right).
pub async fn apply(state: &AppState, caller: &Caller, id: &str, policy: &EgressPolicy) -> Result<(), ApiError> {
    let (computer, provider) = super::util::with_provider(state, caller, id)?;
    let Some(provider) = provider else {
        return Err(ApiError::new(
            ErrorKind::ComputerUnsupported,
            "an own machine's egress is its own: egress applies to provider sandboxes",
        ));
    };
    check_provider(&provider, policy)?;
    let sandbox = match (&computer.sandbox, computer.state) {
        (Some(s), ComputerState::Running | ComputerState::Paused) if computer.active_execution.is_none() => s.clone(),
        _ => {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                "the computer's sandbox is not running or paused with no execution under way: change its egress once it is",
            ));
        }
    };
    let (adapter, timeout) = state.providers.build(&provider);
    // The revision this change makes. The gateway ignores one older than it holds; the store
    // takes it only as the next: of two racing changes the second to commit is refused, and
    // puts the first's policy back in force.
    let revision = computer.egress_revision + 1;
    let applied = tokio::time::timeout(timeout, adapter.set_egress(&sandbox, &computer.id, policy, revision))
        .await
        .map_err(|_| ApiError::new(ErrorKind::ComputerExecutionFailed, "the provider did not answer"))?;
    if let Err(e) = applied {
        return Err(match e {
            computerd_actors::provider::ProviderError::Refused { kind, message }
                if kind == computerd_actors::docker::NO_GATEWAY =>
            {
                ApiError::new(ErrorKind::Conflict, message)
            }
            computerd_actors::provider::ProviderError::Refused { kind, message }
                if kind == ErrorKind::ComputerUnsupported.as_str() =>
            {
                ApiError::new(ErrorKind::ComputerUnsupported, message)
            }
            other => ApiError::new(ErrorKind::ComputerExecutionFailed, other.to_string()),
        });
    }
    // Checked only once every node speaks the store version of revisions (during an upgrade,
    // unchecked, as before).
    let members: Vec<u64> = state.cluster.view().members.iter().map(|m| m.id).collect();
    let checked = state.cluster.state().read(|s| s.behind(members, computerd_raft::sm::EGRESS_REVISIONS).is_empty());
    let cmd = Command::SetEgress {
        by: caller.token.id.clone(),
        computer_id: id.to_string(),
        policy: Some(policy.clone()),
        revision: checked.then_some(revision),
        at_ms: now_ms(),
    };
    match state.cluster.propose(computerd_raft::sm::Request::new(cmd)).await? {
        computerd_raft::sm::Response::Rejected(r) if r.kind == computerd_raft::sm::RejectKind::Conflict && checked => {
            // Another change committed first, and this one may have reached the sandbox after
            // it: the stored policy is put back in force (at its revision, so a later change
            // already there stays).
            let stored =
                state.cluster.state().read(|s| s.computers.get(id).map(|c| (c.egress.clone(), c.egress_revision)));
            if let Some((Some(p), rev)) = stored {
                match tokio::time::timeout(timeout, adapter.set_egress(&sandbox, id, &p, rev)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(computer_id = %id, error = %e, "cannot put the stored egress policy back in force")
                    }
                    Err(_) => {
                        tracing::warn!(computer_id = %id, "the provider did not answer putting the stored egress policy back")
                    }
                }
            }
            Err(ApiError::new(
                ErrorKind::Conflict,
                format!("{}; the stored policy is in force: read it and try again", r.message),
            ))
        }
        computerd_raft::sm::Response::Rejected(r) => Err(r.into()),
        _ => Ok(()),
    }
}

/// `GET /v1/computers/:id/egress`
#[utoipa::path(get, path = "/v1/computers/{id}/egress", operation_id = "computers_egress_get", tag = "computers", params(("id" = String, Path)), responses((status = 200, description = "`{\"policy\", \"enforcement\"}`: the stored policy (null: none), and what the gateway counted (`allowed`, `denied`, `cut`, `recent`: the latest denials with host, port and time), or null", body = Object)), security(("bearer" = [])))]
pub async fn get(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let (computer, provider) = super::util::with_provider(&state, &caller, &id)?;
    let mut enforcement = Value::Null;
    if let Some(provider) = provider.filter(|_| computer.egress.is_some()) {
        let (adapter, timeout) = state.providers.build(&provider);
        match tokio::time::timeout(timeout, adapter.egress_stats(&computer.id)).await {
            Ok(Ok(Some(stats))) => enforcement = stats,
            Ok(Ok(None)) => {}
            Ok(Err(e)) => enforcement = json!({"error": e.to_string()}),
            Err(_) => enforcement = json!({"error": "the provider did not answer"}),
        }
    }
    Ok(Json(json!({"policy": computer.egress, "enforcement": enforcement})))
}
