//! The WebSocket handler of `/v1/agent/link`: authenticates the agent, commits the link's
//! generation, and runs the link's lifecycle (`computerd_actors::link::run`) on the WebSocket,
//! in this same task.
//!
//! A link: the agent sends `{"computerId","credential"}`; the node commits `LinkUp` (a new
//! generation) and answers `{"generation"}`; then the WebSocket carries the frames of
//! `computerd_proto::mux`: the HTTP/2 connections on which the node speaks gRPC to the agent
//! (opened when calls need them), and the agent's session reports. Every call carries the
//! generation; the agent refuses others. A link is watched with pings; when it ends, `LinkDown`
//! is committed for its generation only, and the registry entry is removed only if it is still
//! that generation, so closing an old link never unregisters a newer one.

use std::time::Duration;

use axum::extract::ws::Message;
use axum::extract::ws::WebSocket;
use computerd_actors::link::LinkArgs;
use computerd_proto::LINK_PROTOCOL;
use computerd_proto::mux::Mux;
use computerd_proto::mux::Role;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::hash_secret;
use futures::SinkExt;

use crate::ids::now_ms;
use crate::state::AppState;

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Hello {
    computer_id: String,
    credential: String,
    /// The link protocol the agent speaks (absent: an agent from before versions).
    #[serde(default)]
    protocol: Option<u32>,
}

/// Why an agent that speaks another link protocol is refused, naming both versions.
fn incompatible(agent: Option<u32>) -> Option<String> {
    let agent = agent.unwrap_or(1);
    (agent != LINK_PROTOCOL).then(|| {
        format!(
            "incompatible agent: this node speaks link protocol {LINK_PROTOCOL} and the agent speaks {agent}; \
             upgrade computer-agent (a sandbox gets the current agent when it is recreated)"
        )
    })
}

async fn refuse(mut socket: WebSocket, why: &str) {
    let _ = socket.send(Message::Text(serde_json::json!({ "error": why }).to_string().into())).await;
    let _ = socket.close().await;
}

/// Runs one agent link until it ends.
pub async fn handle(state: AppState, mut socket: WebSocket) {
    let hello = match tokio::time::timeout(Duration::from_secs(10), socket.recv()).await {
        Ok(Some(Ok(Message::Text(t)))) if t.len() <= 4096 => serde_json::from_str::<Hello>(t.as_str()).ok(),
        _ => None,
    };
    let Some(hello) = hello else {
        return refuse(socket, "expected {\"computerId\",\"credential\",\"protocol\"}").await;
    };
    // Refused before anything is written to the store.
    if let Some(why) = incompatible(hello.protocol) {
        tracing::info!(computer_id = %hello.computer_id, agent = ?hello.protocol, "agent link refused: incompatible");
        return refuse(socket, &why).await;
    }
    let cmd = Command::LinkUp {
        computer_id: hello.computer_id.clone(),
        credential_hash: hash_secret(&hello.credential),
        node_id: state.cluster.id(),
        at_ms: now_ms(),
    };
    // Boxed: a proposal's future is large and would otherwise stay part of this task's future.
    let generation = match Box::pin(state.cluster.propose(Request::new(cmd))).await {
        Ok(Response::Id(g)) => match g.parse::<u64>() {
            Ok(g) => g,
            Err(_) => return refuse(socket, "internal error").await,
        },
        Ok(Response::Rejected(r)) => {
            tracing::info!(computer_id = %hello.computer_id, "agent link refused");
            return refuse(socket, &r.message).await;
        }
        Ok(Response::Ok) => return refuse(socket, "internal error").await,
        Err(e) => return refuse(socket, &format!("the cluster is unavailable: {e}")).await,
    };
    if socket.send(Message::Text(serde_json::json!({ "generation": generation }).to_string().into())).await.is_err() {
        return;
    }
    let args = LinkArgs {
        computer_id: hello.computer_id,
        generation,
        cluster: state.cluster.clone(),
        links: state.links.clone(),
        activity: state.activity.clone(),
    };
    // This task runs the link's lifecycle and drives its WebSocket until the link ends.
    computerd_actors::link::run(args, Mux::new(computerd_proto::ws_adapter!(socket, Message), Role::Client)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_of_another_protocol_is_refused_with_both_versions() {
        assert_eq!(incompatible(Some(LINK_PROTOCOL)), None);
        let old = incompatible(None).unwrap_or_default();
        assert!(old.contains(&format!("protocol {LINK_PROTOCOL}")) && old.contains("speaks 1"), "{old}");
        let newer = incompatible(Some(LINK_PROTOCOL + 1)).unwrap_or_default();
        assert!(newer.contains(&format!("speaks {}", LINK_PROTOCOL + 1)), "{newer}");
    }
}
