//! The WebSocket handler of `/v1/agent/link`: authenticates the agent, commits the link's
//! generation, opens gRPC over the connection (one hyper HTTP/2 client connection,
//! `computerd_proto::channel`) and runs the link's lifecycle (`computerd_actors::link::run`),
//! which watches it and records its end, in this same task.
//!
//! A link: the agent sends `{"computerId","credential"}`; the node commits `LinkUp` (a new
//! generation) and answers `{"generation"}`; then the node speaks gRPC to the agent over the same
//! WebSocket (HTTP/2 over binary messages). Every call carries the generation; the agent refuses
//! others. A link is watched with pings; when it ends, `LinkDown` is committed for its generation
//! only, and the registry entry is removed only if it is still that generation, so closing an
//! old link never unregisters a newer one.

use std::time::Duration;

use axum::extract::ws::Message;
use axum::extract::ws::WebSocket;
use computerd_actors::link::Generation;
use computerd_actors::link::LinkArgs;
use computerd_proto::agent::agent_client::AgentClient;
use computerd_proto::channel;
use computerd_proto::wsio::MessageIo;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::hash_secret;
use futures::SinkExt;
use futures::StreamExt;
use tonic::service::interceptor::InterceptedService;

use crate::http::AppState;
use crate::ids::now_ms;

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Hello {
    computer_id: String,
    credential: String,
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
        return refuse(socket, "expected {\"computerId\",\"credential\"}").await;
    };
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
    let computer_id = hello.computer_id;
    let (tx, rx) = socket.split();
    let rx = rx.filter_map(|m| async move {
        match m {
            Ok(Message::Binary(b)) => Some(Ok(b)),
            Ok(_) => None,
            Err(e) => Some(Err(std::io::Error::other(e.to_string()))),
        }
    });
    let tx = tx
        .sink_map_err(|e| std::io::Error::other(e.to_string()))
        .with(|b: bytes::Bytes| async move { Ok::<_, std::io::Error>(Message::Binary(b)) });
    let io = MessageIo::new(Box::pin(rx), Box::pin(tx));
    let settings =
        channel::Settings { keep_alive_interval: Duration::from_secs(5), keep_alive_timeout: Duration::from_secs(10) };
    let (channel, connection) = match channel::connect(io, settings).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(computer_id = %computer_id, error = %e, "cannot open the agent channel");
            return link_down(&state, &computer_id, generation).await;
        }
    };
    let client = AgentClient::with_origin(
        InterceptedService::new(channel.clone(), Generation(generation)),
        http::Uri::from_static("http://agent.link"),
    )
    .max_decoding_message_size(8 << 20)
    .max_encoding_message_size(8 << 20);
    let args = LinkArgs {
        computer_id: computer_id.clone(),
        generation,
        client,
        channel,
        cluster: state.cluster.clone(),
        links: state.links.clone(),
        activity: state.activity.clone(),
    };
    // This task runs the link's lifecycle and drives its HTTP/2 connection: it ends when the link
    // does (and any call still holding the client is done).
    let connection = async {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "the agent connection ended");
        }
    };
    computerd_actors::link::run(args, connection).await;
}

async fn link_down(state: &AppState, computer_id: &str, generation: u64) {
    let cmd = Command::LinkDown { computer_id: computer_id.to_string(), generation, at_ms: now_ms() };
    if let Err(e) = Box::pin(state.cluster.propose(Request::new(cmd))).await {
        tracing::warn!(computer_id = %computer_id, error = %e, "could not record the link's end");
    }
}
