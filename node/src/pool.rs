//! A pooled sandbox's agent waits here for its identity (`GET /v1/agent/pool`, a WebSocket).
//!
//! The agent shows its pool id and token (`{"poolId","token","protocol"}`). The node records the
//! sandbox ready (`PoolReady`, which checks the token's hash) and waits, on the store's applied
//! changes, until a create claims it (`PoolClaim`, on whichever node runs the create). It then
//! answers once, `{"computerId","pairingCode","env","firstUid"}`, and the agent pairs with that
//! code as a cold sandbox's agent does: the credential it gets is new and bound to the Computer.
//! A refusal is `{"error"}`. The socket is pinged while it waits, so a dead agent is noticed; the
//! agent dials again when it drops.

use std::time::Duration;

use axum::extract::ws::Message;
use axum::extract::ws::WebSocket;
use computerd_proto::LINK_PROTOCOL;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::hash_secret;
use futures::SinkExt;

use crate::ids::now_ms;
use crate::state::AppState;

/// How often a waiting agent is pinged.
const PING_EVERY: Duration = Duration::from_secs(15);

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Hello {
    pool_id: String,
    token: String,
    #[serde(default)]
    protocol: Option<u32>,
}

async fn refuse(mut socket: WebSocket, why: &str) {
    let _ = socket.send(Message::Text(serde_json::json!({ "error": why }).to_string().into())).await;
    let _ = socket.close().await;
}

/// What the claim of pool entry `id` tells its agent, once claimed: `Err` when it can no longer
/// be told (the entry is gone, or its code was redeemed or never made).
fn assignment(state: &AppState, id: &str) -> Option<Result<serde_json::Value, &'static str>> {
    state.cluster.state().read(|s| {
        let Some(entry) = s.pool.get(id) else { return Some(Err("the pooled sandbox is no longer in the pool")) };
        entry.claimed_by.as_ref()?;
        let Some((computer_id, code)) = s.pool_assignment(id) else {
            return Some(Err("the pooled sandbox is no longer in the pool"));
        };
        let Some(code) = code else { return Some(Err("the claim's pairing code was used already")) };
        let env = s.computers.get(&computer_id).map(|c| c.env.clone()).unwrap_or_default();
        let first_uid = s.uid_ranges.first_uid(&computer_id);
        Some(Ok(serde_json::json!({
            "computerId": computer_id,
            "pairingCode": code,
            "env": env,
            "firstUid": first_uid,
        })))
    })
}

/// Runs one pooled agent's wait until its claim is told or the socket ends.
pub async fn wait(state: AppState, mut socket: WebSocket) {
    let hello = match tokio::time::timeout(Duration::from_secs(10), socket.recv()).await {
        Ok(Some(Ok(Message::Text(t)))) if t.len() <= 1024 => serde_json::from_str::<Hello>(t.as_str()).ok(),
        _ => None,
    };
    let Some(hello) = hello else {
        return refuse(socket, "expected {\"poolId\",\"token\",\"protocol\"}").await;
    };
    if hello.protocol.unwrap_or(1) != LINK_PROTOCOL {
        return refuse(socket, &format!("incompatible agent: this node speaks link protocol {LINK_PROTOCOL}")).await;
    }
    let cmd =
        Command::PoolReady { pool_id: hello.pool_id.clone(), token_hash: hash_secret(&hello.token), at_ms: now_ms() };
    match Box::pin(state.cluster.propose(Request::new(cmd))).await {
        Ok(Response::Rejected(r)) => {
            tracing::info!(pool_id = %hello.pool_id, "pooled agent refused");
            return refuse(socket, &r.message).await;
        }
        Ok(_) => {}
        Err(e) => return refuse(socket, &format!("the cluster is unavailable: {e}")).await,
    }
    let mut applied = state.cluster.state().subscribe();
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    loop {
        match assignment(&state, &hello.pool_id) {
            Some(Ok(told)) => {
                tracing::info!(pool_id = %hello.pool_id, computer_id = %told["computerId"], "pooled agent claimed");
                let _ = socket.send(Message::Text(told.to_string().into())).await;
                let _ = socket.close().await;
                return;
            }
            Some(Err(why)) => return refuse(socket, why).await,
            None => {}
        }
        tokio::select! {
            changed = applied.changed() => {
                if changed.is_err() {
                    return; // the node stops
                }
            }
            _ = ping.tick() => {
                if socket.send(Message::Ping(Vec::new().into())).await.is_err() {
                    return;
                }
            }
            msg = socket.recv() => match msg {
                // Pongs and anything else the agent says are ignored; a close ends the wait.
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
        }
    }
}
