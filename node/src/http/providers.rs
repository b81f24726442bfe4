//! `POST/GET /v1/computer-providers`. Credentials in a provider's config are write-only.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use computerd_actors::fake::FakeProvider;
use computerd_proto::ErrorKind;
use computerd_raft::sm::Command;
use computerd_raft::sm::Provider;
use computerd_raft::sm::ProviderKind;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
#[allow(unused_imports)]
use super::schemas::ReceiptDoc;
use super::util::Body;
use super::util::check_name;
use super::util::propose;
use crate::ids::new_id;
use crate::ids::now_ms;

/// The largest config accepted, serialized.
const MAX_CONFIG: usize = 64 * 1024;

/// Config keys whose values are credentials (write-only).
fn is_secret_key(k: &str) -> bool {
    let k = k.to_ascii_lowercase();
    ["key", "token", "secret", "password", "credential", "auth"].iter().any(|w| k.contains(w))
}

/// A provider as callers see it: secrets are named, never shown.
pub fn provider_view(p: &Provider) -> Value {
    json!({
        "id": p.id,
        "kind": p.kind,
        "name": p.name,
        "config": p.config,
        "secretFields": p.secrets.keys().collect::<Vec<_>>(),
        "createdAt": p.created_at,
    })
}

/// A provider's warm pools as the store has them, per template key: sandboxes `ready` (their
/// agents wait), `starting` (made, their agents not yet waiting) and `claimed` (by a create whose
/// agent has not linked yet). An object with no keys: no pool.
fn pool_view(s: &computerd_raft::sm::State, provider: &str) -> Value {
    let mut keys = serde_json::Map::new();
    for e in s.pool_of(provider) {
        let k = keys.entry(e.key.clone()).or_insert_with(|| json!({"ready": 0, "starting": 0, "claimed": 0}));
        let field = match (&e.claimed_by, e.ready_at) {
            (Some(_), _) => "claimed",
            (None, Some(_)) => "ready",
            (None, None) => "starting",
        };
        k[field] = json!(k[field].as_u64().unwrap_or(0) + 1);
    }
    Value::Object(keys)
}

/// `POST /v1/computer-providers` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewProvider {
    #[schema(value_type = String, example = "docker")]
    kind: ProviderKind,
    name: String,
    #[serde(default)]
    #[schema(value_type = Object)]
    config: serde_json::Map<String, Value>,
}

/// `POST /v1/computer-providers` (owner/admin).
#[utoipa::path(post, path = "/v1/computer-providers", operation_id = "providers_create", tag = "providers", request_body = NewProvider, responses((status = 201, description = "The provider; credential fields are named in secretFields, never shown", body = Object), (status = 400, description = "`invalid_request`: a bad config; `template_invalid`: a Docker template's image is missing, or lacks the agent, the `user` account or `/workspace` (the reason says which)", body = ErrorBody)), security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    auth: Auth,
    body: Body<NewProvider>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    caller.check_admin_write()?;
    let Json(b) = body?;
    let name = check_name(&b.name)?;
    if serde_json::to_vec(&b.config).map(|v| v.len()).unwrap_or(usize::MAX) > MAX_CONFIG {
        return Err(ApiError::invalid("config is larger than 64 KiB"));
    }
    let (secrets, config): (BTreeMap<_, _>, BTreeMap<_, _>) = b.config.into_iter().partition(|(k, _)| is_secret_key(k));
    if b.kind == ProviderKind::Fake {
        if !state.fake_providers {
            return Err(ApiError::invalid("fake providers are disabled on this node"));
        }
        let plain: serde_json::Map<String, Value> = config.clone().into_iter().collect();
        FakeProvider::check_config(&plain).map_err(ApiError::invalid)?;
    }
    if b.kind == ProviderKind::Docker {
        let plain: serde_json::Map<String, Value> = config.clone().into_iter().collect();
        let c = computerd_actors::docker::DockerConfig::parse(&plain).map_err(ApiError::invalid)?;
        // Secure by default: sandboxes on the provider's own networks get egress rules, which
        // this node must be able to install (else the operator says they enforce egress).
        if c.node_egress() {
            tokio::task::spawn_blocking(computerd_actors::egress::check_available)
                .await
                .map_err(|e| ApiError::invalid(e.to_string()))?
                .map_err(ApiError::invalid)?;
        }
        // Each template's image can be a sandbox (it is there, with the agent, `user` and
        // /workspace). An engine out of reach now is no refusal: each create checks again.
        let docker = computerd_actors::docker::DockerProvider::new(c, std::time::Duration::from_secs(30));
        match docker.check_templates().await {
            Ok(()) => {}
            Err(computerd_actors::provider::ProviderError::Refused { kind, message })
                if kind == computerd_actors::docker::TEMPLATE_INVALID =>
            {
                return Err(ApiError::new(ErrorKind::TemplateInvalid, message));
            }
            Err(e) => tracing::warn!(error = %e, "the provider's template images could not be checked now"),
        }
    }
    if matches!(b.kind, ProviderKind::E2b | ProviderKind::Daytona) {
        let plain: serde_json::Map<String, Value> = config.clone().into_iter().collect();
        let checked = match b.kind {
            ProviderKind::E2b => computerd_actors::e2b::E2bConfig::parse(&plain).map(|_| ()),
            _ => computerd_actors::daytona::DaytonaConfig::parse(&plain).map(|_| ()),
        };
        checked.map_err(ApiError::invalid)?;
        let key = secrets.get("apiKey").and_then(Value::as_str).unwrap_or_default();
        if key.is_empty() || key.len() > 1024 || key.chars().any(char::is_control) {
            return Err(ApiError::invalid(
                "this provider needs its account's API key in config.apiKey (a string; stored write-only)",
            ));
        }
    }
    let p = Provider {
        id: new_id("cpp"),
        kind: b.kind,
        name,
        config,
        secrets,
        created_by: caller.member.id.clone(),
        created_at: now_ms(),
    };
    propose(&state, Command::CreateProvider { by: caller.token.id.clone(), provider: p.clone() }).await?;
    Ok((StatusCode::CREATED, Json(provider_view(&p))))
}

/// `GET /v1/computer-providers`: every member and bot may list them (not a token limited to
/// Computers).
#[utoipa::path(get, path = "/v1/computer-providers", operation_id = "providers_list", tag = "providers", responses((status = 200, description = "`{\"providers\": [...]}`, each with its warm pools' sandboxes per template key (`pool`: `ready`, `starting`, `claimed`)", body = Object)), security(("bearer" = [])))]
pub async fn list(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let rows: Vec<Value> = if caller.token.computers.is_some() {
        Vec::new()
    } else {
        state.cluster.state().read(|s| {
            s.providers
                .values()
                .map(|p| {
                    let mut v = provider_view(p);
                    v["pool"] = pool_view(s, &p.id);
                    v
                })
                .collect()
        })
    };
    Ok(Json(json!({ "providers": rows })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credential_fields_are_recognised() {
        for k in ["apiKey", "API_KEY", "token", "clientSecret", "password", "credentials", "authHeader"] {
            assert!(is_secret_key(k), "{k}");
        }
        for k in ["endpoint", "templates", "region", "timeoutMs"] {
            assert!(!is_secret_key(k), "{k}");
        }
    }
}
