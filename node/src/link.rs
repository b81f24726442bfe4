//! Agent links held by this node: the WebSocket handler of `/v1/agent/link` and the registry of
//! live links (one per Computer, the newest generation wins).
//!
//! A link: the agent sends `{"computerId","credential"}`; the node commits `LinkUp` (a new
//! generation) and answers `{"generation"}`; then the node speaks gRPC to the agent over the same
//! WebSocket (HTTP/2 over binary messages). Every call carries the generation; the agent refuses
//! others. A link is watched with pings; when it ends, `LinkDown` is committed for its generation
//! only, and the registry entry is removed only if it is still that generation, so closing an
//! old link never unregisters a newer one.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::ws::Message;
use axum::extract::ws::WebSocket;
use computerd_proto::LINK_GENERATION;
use computerd_proto::agent::Nothing;
use computerd_proto::agent::agent_client::AgentClient;
use computerd_proto::wsio::MessageIo;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::hash_secret;
use futures::SinkExt;
use futures::StreamExt;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::transport::Endpoint;

use crate::http::AppState;
use crate::ids::now_ms;

/// Adds the link generation to every call.
#[derive(Clone)]
pub struct Generation(pub u64);

impl Interceptor for Generation {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert(LINK_GENERATION, self.0.into());
        Ok(req)
    }
}

/// A gRPC client of one agent over its link.
pub type Agent = AgentClient<InterceptedService<Channel, Generation>>;

/// One live link.
#[derive(Clone)]
pub struct Link {
    /// Its generation.
    pub generation: u64,
    /// The agent.
    pub client: Agent,
}

/// The links this node holds, by Computer id.
#[derive(Default)]
pub struct LinkRegistry {
    inner: Mutex<HashMap<String, Link>>,
}

impl LinkRegistry {
    /// The live link of a Computer on this node.
    pub fn get(&self, computer_id: &str) -> Option<Link> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).get(computer_id).cloned()
    }

    fn insert(&self, computer_id: &str, link: Link) {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(computer_id).is_none_or(|l| l.generation < link.generation) {
            map.insert(computer_id.to_string(), link);
        }
    }

    fn current(&self, computer_id: &str) -> Option<u64> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).get(computer_id).map(|l| l.generation)
    }

    /// Removes the entry only if it is still `generation`.
    fn remove_if(&self, computer_id: &str, generation: u64) {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(computer_id).is_some_and(|l| l.generation == generation) {
            map.remove(computer_id);
        }
    }

    /// How many links this node holds.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

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
    let generation = match state.cluster.propose(Request::new(cmd)).await {
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
    let slot = Arc::new(Mutex::new(Some(MessageIo::new(Box::pin(rx), Box::pin(tx)))));
    let connector = tower::service_fn(move |_uri: http::Uri| {
        let io = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        async move { io.map(hyper_util::rt::TokioIo::new).ok_or_else(|| std::io::Error::other("the link is closed")) }
    });
    let channel = Endpoint::from_static("http://agent.link")
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .connect_with_connector(connector)
        .await;
    let channel = match channel {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(computer_id = %computer_id, error = %e, "cannot open the agent channel");
            return link_down(&state, &computer_id, generation).await;
        }
    };
    let client = AgentClient::with_interceptor(channel, Generation(generation))
        .max_decoding_message_size(8 << 20)
        .max_encoding_message_size(8 << 20);
    state.links.insert(&computer_id, Link { generation, client: client.clone() });
    tracing::info!(computer_id = %computer_id, generation, "agent linked");
    let watcher = tokio::spawn(watch_sessions(state.clone(), computer_id.clone(), generation, client.clone()));
    // Watch the link: a failed ping or a newer generation ends it.
    let mut pinger = client;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if state.links.current(&computer_id) != Some(generation) {
            tracing::info!(computer_id = %computer_id, generation, "link replaced by a newer one");
            break;
        }
        let mut req = tonic::Request::new(Nothing {});
        req.set_timeout(Duration::from_secs(5));
        if let Err(s) = pinger.ping(req).await {
            tracing::info!(computer_id = %computer_id, generation, status = %s, "agent link lost");
            break;
        }
    }
    watcher.abort();
    link_down(&state, &computer_id, generation).await;
}

/// Turns the agent's reports of commands that ended after their wait into `computer_session`
/// events.
async fn watch_sessions(state: AppState, computer_id: String, generation: u64, mut client: Agent) {
    let Ok(stream) = client.watch_sessions(Nothing {}).await else { return };
    let mut stream = stream.into_inner();
    while let Some(Ok(e)) = stream.next().await {
        let cmd = Command::SessionEnded {
            computer_id: computer_id.clone(),
            generation,
            session_id: e.session_id,
            owner: e.owner,
            exit_code: e.exit_code,
            signal: e.signal,
            at_ms: now_ms(),
        };
        if let Err(err) = state.cluster.propose(Request::new(cmd)).await {
            tracing::warn!(computer_id = %computer_id, error = %err, "could not record a session's end");
        }
    }
}

async fn link_down(state: &AppState, computer_id: &str, generation: u64) {
    state.links.remove_if(computer_id, generation);
    let cmd = Command::LinkDown { computer_id: computer_id.to_string(), generation, at_ms: now_ms() };
    if let Err(e) = state.cluster.propose(Request::new(cmd)).await {
        tracing::warn!(computer_id = %computer_id, error = %e, "could not record the link's end");
    }
}
