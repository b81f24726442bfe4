//! `GET /v1/health` (no auth) and cluster membership administration.

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
#[allow(unused_imports)]
use super::schemas::ReceiptDoc;

/// The node's view of the cluster; 503 while the node is out of touch with a quorum (cut off
/// by a partition, or its quorum is gone), so a load balancer stops sending it calls it could
/// not commit.
#[utoipa::path(get, path = "/v1/health", tag = "cluster", responses((status = 200, description = "This node's view of the cluster", body = Object), (status = 503, description = "The same view, from a node out of touch with a quorum", body = Object)))]
pub async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    use std::sync::atomic::Ordering::Relaxed;
    let counts = state.owners.counts();
    let contact = state.cluster.quorum_contact();
    let v = state.cluster.view();
    let members: Vec<Value> = v
        .members
        .iter()
        .map(|m| json!({"id": m.id, "http": m.addr.http, "grpc": m.addr.grpc, "voter": m.voter}))
        .collect();
    let status = if contact { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
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

/// `DELETE /v1/cluster/nodes/:id`: removes a node from the membership (owner/admin).
#[utoipa::path(delete, path = "/v1/cluster/nodes/{id}", tag = "cluster", params(("id" = u64, Path, description = "Node id")), responses((status = 204, description = "Removed"), (status = 404, description = "Not a member", body = ErrorBody)), security(("bearer" = [])))]
pub async fn remove_node(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    auth.current(&state).await?.check_admin_write()?;
    let id: u64 = id.parse().map_err(|_| ApiError::invalid("a node id is a number"))?;
    state.cluster.leave(id).await.map_err(|e| match e {
        computerd_raft::cluster::ClusterError::Invalid(m) => ApiError::not_found(m),
        other => other.into(),
    })?;
    Ok(StatusCode::NO_CONTENT)
}
