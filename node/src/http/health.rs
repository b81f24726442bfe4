//! `GET /v1/health` (no auth) and cluster membership administration.

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::Value;
use serde_json::json;

use computerd_raft::sm::Command;
use serde::Deserialize;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
#[allow(unused_imports)]
use super::schemas::ReceiptDoc;
use super::util::propose;

/// The node's view of the cluster; 503 while the node is out of touch with a quorum (cut off
/// by a partition, or its quorum is gone), so a load balancer stops sending it calls it could
/// not commit.
#[utoipa::path(get, path = "/v1/health", operation_id = "health_health", tag = "cluster", responses((status = 200, description = "This node's view of the cluster", body = Object), (status = 503, description = "The same view, from a node out of touch with a quorum", body = Object)))]
pub async fn health(State(state): State<AppState>, headers: axum::http::HeaderMap) -> (StatusCode, Json<Value>) {
    use std::sync::atomic::Ordering::Relaxed;
    let counts = state.owners.counts();
    let contact = state.cluster.quorum_contact();
    let v = state.cluster.view();
    let status = if contact { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    // Without an owner's or admin's token: liveness only (no addresses). The local replica
    // decides who the caller is: this must answer on a node cut off from its quorum too.
    let admin = Auth::from_headers(&headers).is_some_and(|a| {
        state.cluster.state().read(|s| s.caller_by_hash(a.hash())).is_ok_and(|c| c.check_admin_read().is_ok())
    });
    if !admin {
        let body = json!({
            "nodeId": v.node_id,
            "status": if contact { "ok" } else { "unavailable" },
            "quorumContact": contact,
            "leaderId": v.leader_id,
        });
        return (status, Json(body));
    }
    let members: Vec<Value> = v
        .members
        .iter()
        .map(|m| json!({"id": m.id, "http": m.addr.http, "grpc": m.addr.grpc, "voter": m.voter}))
        .collect();
    let body = Json(json!({
        "nodeId": v.node_id,
        "quorumContact": contact,
        "leaderId": v.leader_id,
        "term": v.term,
        "lastApplied": v.last_applied,
        "snapshotIndex": v.snapshot,
        "purgedIndex": v.purged,
        "members": members,
        // The nodes lifecycle work is placed over (recorded by the leader).
        "liveNodes": state.cluster.state().read(|s| s.live_nodes.iter().copied().collect::<Vec<u64>>()),
        // The agent links this node holds, and how many of them hold an HTTP/2 connection now
        // (one is opened when a call needs it; an idle link holds none).
        "agentLinks": {"linked": state.links.len(), "connected": state.links.connected()},
        // Calls this node sent to the node holding a Computer's link: all of them, those a stale
        // view sent on once more, and those whose owner did not take them in time.
        "routing": {
            "routed": counts.routed.load(Relaxed),
            "rerouted": counts.rerouted.load(Relaxed),
            "timedOut": counts.timed_out.load(Relaxed),
        },
    }));
    (status, body)
}

/// `DELETE /v1/cluster/nodes/:id`: removes a node from the membership (owner/admin). The id is
/// recorded as removed first (it never enrols again, with any join secret), then the node leaves
/// the membership, then all its certificates are revoked. A node removed already has its
/// revocation committed again (a DELETE whose revocation was lost is retried so).
#[utoipa::path(delete, path = "/v1/cluster/nodes/{id}", operation_id = "health_remove_node", tag = "cluster", params(("id" = u64, Path, description = "Node id")), responses((status = 204, description = "Removed"), (status = 404, description = "Not a member", body = ErrorBody), (status = 409, description = "The store keeps no more removed ids", body = ErrorBody)), security(("bearer" = [])))]
pub async fn remove_node(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let caller = auth.current(&state).await?;
    caller.check_admin_write()?;
    let id: u64 = id.parse().map_err(|_| ApiError::invalid("a node id is a number"))?;
    let member = state.cluster.view().members.iter().any(|m| m.id == id);
    let removed = state.cluster.state().read(|s| s.join.removed(id));
    if !member && !removed {
        return Err(ApiError::not_found(format!("node {id} is not a member")));
    }
    let by = caller.token.id.clone();
    if member {
        // Refused from now on: enrolling as this id (so no new certificate reaches it while it
        // leaves, nor after). Its certificate still works until it has left.
        propose(&state, Command::RevokeNode { by: by.clone(), node_id: id, before_secs: 0 }).await?;
        state.cluster.leave(id).await.map_err(|e| match e {
            computerd_raft::cluster::ClusterError::Invalid(m) => ApiError::not_found(m),
            other => other.into(),
        })?;
    }
    // Every certificate of the node is refused from now on, whenever it was issued (a signer
    // whose clock runs ahead cannot have dated one past a cutoff: the id never gets a new one),
    // and its open connections are closed.
    propose(&state, Command::RevokeNode { by, node_id: id, before_secs: u64::MAX }).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/cluster/join-token` body.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JoinTokenIn {
    /// A single-use secret that expires after this many seconds; without it, the cluster's
    /// reusable secret is rotated (the old one stops working).
    ttl_secs: Option<u64>,
    /// With `ttlSecs`: the only node id that may enrol with the secret. A live member's id (a
    /// member whose data dir was lost) enrols again only with such a secret.
    node_id: Option<u64>,
}

/// `POST /v1/cluster/join-tokens` (owner/admin): a join secret for new nodes, answered once (the
/// store keeps its hash). With `ttlSecs` (1 s to 7 days), a single-use secret with that expiry;
/// without, a new reusable secret replacing the cluster's (also rewritten to `DIR/join.token`
/// where this node has one). With `nodeId` too, the single-use secret is for that node id only
/// (a removed id is refused: it never joins again).
#[utoipa::path(post, path = "/v1/cluster/join-tokens", operation_id = "health_join_token", tag = "cluster", request_body(content = Object, description = "{\"ttlSecs\"?, \"nodeId\"?}"), responses((status = 201, description = "{joinToken, singleUse, expiresAtMs}", body = Object), (status = 403, description = "Not an owner or admin", body = ErrorBody)), security(("bearer" = [])))]
pub async fn join_token(
    State(state): State<AppState>,
    auth: Auth,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.current(&state).await?;
    caller.check_admin_write()?;
    let b: JoinTokenIn = if body.iter().all(u8::is_ascii_whitespace) {
        JoinTokenIn::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("bad body: {e}")))?
    };
    let secret = computerd_raft::tls::JoinSecret::new(&state.pki.ca_hash());
    let hash = computerd_raft::sm::hash_secret(&secret.secret);
    let by = caller.token.id.clone();
    let expires = match b.ttl_secs {
        Some(ttl) if (1..=7 * 24 * 3600).contains(&ttl) => {
            let now = crate::ids::now_ms();
            let expires_at_ms = now + ttl * 1000;
            let node_id = b.node_id;
            propose(&state, Command::MintJoinToken { by, hash, node_id, expires_at_ms, at_ms: now }).await?;
            Some(expires_at_ms)
        }
        Some(_) => return Err(ApiError::invalid("ttlSecs must be 1 to 604800")),
        None if b.node_id.is_some() => return Err(ApiError::invalid("nodeId goes with ttlSecs (a single-use secret)")),
        None => {
            propose(&state, Command::SetJoinSecret { by, hash }).await?;
            if let Some(dir) = &state.join_token_file
                && dir.exists()
            {
                let _ = crate::datadir::write_secret_file(dir, &secret.encode());
            }
            None
        }
    };
    Ok((
        StatusCode::CREATED,
        Json(json!({"joinToken": secret.encode(), "singleUse": expires.is_some(), "expiresAtMs": expires})),
    ))
}
