//! A link's lifecycle ([`run`], one per live agent link on this node, in the link's own task) and
//! the link registry. [`run`] registers the link (newest generation wins), relays the agent's
//! `computer_session` reports over one long-lived `WatchSessions` stream, and when the link ends
//! (that stream fails, or a newer generation registers) unregisters it (only if still its
//! generation) and commits `LinkDown` for its generation only, so an old link never unregisters
//! or offlines a newer one.
//!
//! Liveness costs no request: the HTTP/2 connection under the link sends keep-alive PING frames
//! (set by the WebSocket handler), and a dead connection or a closed WebSocket fails the
//! `WatchSessions` stream, which is the signal that the link is lost.
//!
//! Memory: an idle link is one task (the WebSocket handler's, which drives the HTTP/2
//! connection, the stream and this lifecycle together) plus hyper's connection task; it was a
//! ractor actor before, whose task, message loop and four channels cost about 40 KiB per link
//! (heaptrack, 2 000 links). Proposals are boxed so that their large futures are not part of
//! every idle link's task.
//!
//! Told by: the registry (replaced). Speaks gRPC to the agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use computerd_proto::LINK_GENERATION;
use computerd_proto::agent::Nothing;
use computerd_proto::agent::SessionEnded;
use computerd_proto::agent::agent_client::AgentClient;
use computerd_proto::channel::LinkChannel;
use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use futures::StreamExt;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;

use crate::now_ms;

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
pub type Agent = AgentClient<InterceptedService<LinkChannel, Generation>>;

/// One live link.
#[derive(Clone)]
pub struct Link {
    /// Its generation.
    pub generation: u64,
    /// The agent.
    pub client: Agent,
    /// Told when a newer generation replaces it.
    replaced: Arc<tokio::sync::Notify>,
}

/// The links this node holds, by Computer id.
#[derive(Default)]
pub struct LinkRegistry {
    inner: Mutex<HashMap<String, Link>>,
    added: tokio::sync::Notify,
}

impl LinkRegistry {
    /// The live link of a Computer on this node.
    pub fn get(&self, computer_id: &str) -> Option<Link> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).get(computer_id).cloned()
    }

    /// Registers a link unless a newer generation is already here (answers false then); the link
    /// it replaces is told to stop.
    fn insert(&self, computer_id: &str, link: Link) -> bool {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(computer_id).is_some_and(|l| l.generation >= link.generation) {
            return false;
        }
        if let Some(old) = map.insert(computer_id.to_string(), link) {
            old.replaced.notify_one();
        }
        drop(map);
        self.added.notify_waiters();
        true
    }

    /// Waits until a link of the Computer is here, or `deadline` passes.
    pub async fn wait(&self, computer_id: &str, deadline: tokio::time::Instant) -> Option<Link> {
        loop {
            let added = self.added.notified();
            if let Some(l) = self.get(computer_id) {
                return Some(l);
            }
            if tokio::time::timeout_at(deadline, added).await.is_err() {
                return self.get(computer_id);
            }
        }
    }

    /// Removes the entry only if it is still `generation`.
    fn remove_if(&self, computer_id: &str, generation: u64) {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(computer_id).is_some_and(|l| l.generation == generation) {
            map.remove(computer_id);
        }
    }

    /// Ends every link this node holds (their agents reconnect, through the balancer, to a node
    /// that can commit their new generation); answers how many.
    pub fn shed_all(&self) -> usize {
        let map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for link in map.values() {
            link.replaced.notify_one();
        }
        map.len()
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

/// What a link starts with.
pub struct LinkArgs {
    /// The Computer.
    pub computer_id: String,
    /// The committed generation of this link.
    pub generation: u64,
    /// The agent over this link.
    pub client: Agent,
    /// The link's channel (the one `client` calls through), for the `WatchSessions` stream.
    pub channel: LinkChannel,
    /// The store.
    pub cluster: Cluster,
    /// This node's links.
    pub links: Arc<LinkRegistry>,
    /// Work seen on this node (the agent's running commands).
    pub activity: Arc<crate::idle::Activity>,
}

/// Why a link ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEnd {
    /// A newer generation of the same Computer was already registered on this node.
    Stale,
    /// A newer generation of the same Computer registered on this node.
    Replaced,
    /// The `WatchSessions` stream ended: the connection is gone or the agent refused us.
    Lost,
}

/// Runs one link until it ends: registers it (newest generation wins), relays its
/// `WatchSessions` reports, and when that stream ends or a newer generation registers,
/// unregisters it (only if still its generation) and commits `LinkDown` for its generation.
/// `connection` (the link's HTTP/2 connection) is driven alongside until it ends.
pub async fn run(args: LinkArgs, connection: impl Future<Output = ()>) -> LinkEnd {
    let replaced = Arc::new(tokio::sync::Notify::new());
    let link = Link { generation: args.generation, client: args.client.clone(), replaced: replaced.clone() };
    let a = &args;
    if !a.links.insert(&a.computer_id, link) {
        tracing::info!(computer_id = %a.computer_id, generation = a.generation, "a newer link is already here");
        link_down(a).await;
        return LinkEnd::Stale; // dropping the connection closes the link
    }
    tracing::info!(computer_id = %a.computer_id, generation = a.generation, "agent linked");
    let mut connection = std::pin::pin!(connection);
    let mut connection_done = false;
    let end = {
        let mut watch =
            std::pin::pin!(watch_sessions(&a.cluster, &a.computer_id, a.generation, a.channel.clone(), &a.activity));
        loop {
            tokio::select! {
                () = &mut watch => break LinkEnd::Lost,
                () = replaced.notified() => break LinkEnd::Replaced,
                () = &mut connection, if !connection_done => connection_done = true,
            }
        }
    };
    match end {
        LinkEnd::Replaced => {
            tracing::info!(computer_id = %a.computer_id, generation = a.generation, "link told to end (a newer one replaced it, or this node shed it)")
        }
        _ => tracing::info!(computer_id = %a.computer_id, generation = a.generation, "agent link lost"),
    }
    a.activity.set_busy(&a.computer_id, false);
    a.links.remove_if(&a.computer_id, a.generation);
    link_down(a).await;
    // The connection lives on while calls still hold the client (it ends when they are done).
    drop(args);
    if !connection_done {
        connection.await;
    }
    end
}

/// Sheds this node's links while it is out of touch with a quorum (a partition): it cannot
/// commit their commands or record their sessions' ends, and their agents can reach the majority
/// even where no balancer shuts their connections. Checks every `every` until `stop`.
pub async fn run_shedder(
    cluster: Cluster,
    links: Arc<LinkRegistry>,
    every: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    while crate::tick(every, &mut stop).await {
        if !links.is_empty() && !cluster.quorum_contact() {
            let n = links.shed_all();
            tracing::warn!(links = n, "out of touch with a quorum: shedding the agent links");
        }
    }
}

/// Commits `LinkDown` for this link's generation only.
async fn link_down(a: &LinkArgs) {
    let cmd = Command::LinkDown { computer_id: a.computer_id.clone(), generation: a.generation, at_ms: now_ms() };
    if let Err(e) = Box::pin(a.cluster.propose(Request::new(cmd))).await {
        tracing::warn!(computer_id = %a.computer_id, error = %e, "could not record the link's end");
    }
}

/// The codec of the `WatchSessions` stream: the generated one with a small decode buffer. Its
/// reports are a few dozen bytes, and tonic allocates the buffer (8 KiB by default) for the whole
/// life of the stream, that is, of every idle link; it grows when a larger message comes.
#[derive(Default)]
struct ReportCodec;

impl tonic::codec::Codec for ReportCodec {
    type Encode = Nothing;
    type Decode = SessionEnded;
    type Encoder = tonic_prost::ProstEncoder<Nothing>;
    type Decoder = tonic_prost::ProstDecoder<SessionEnded>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(tonic::codec::BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(tonic::codec::BufferSettings::new(256, 32 * 1024))
    }
}

/// Turns the agent's reports of commands that ended after their wait into `computer_session`
/// events.
/// Returns when the stream ends, which means the link is gone.
async fn watch_sessions(
    cluster: &Cluster,
    computer_id: &str,
    generation: u64,
    channel: LinkChannel,
    activity: &crate::idle::Activity,
) {
    let mut grpc = tonic::client::Grpc::with_origin(
        InterceptedService::new(channel, Generation(generation)),
        tonic::codegen::http::Uri::from_static("http://agent.link"),
    );
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/computerd.agent.v1.Agent/WatchSessions");
    let started = async {
        grpc.ready().await.map_err(|e| tonic::Status::unavailable(format!("the link is not ready: {e}")))?;
        grpc.server_streaming(tonic::Request::new(Nothing {}), path, ReportCodec).await
    };
    let mut stream = match started.await {
        Ok(s) => s.into_inner(),
        Err(e) => {
            tracing::debug!(computer_id = %computer_id, status = %e, "the agent refused WatchSessions");
            return;
        }
    };
    while let Some(Ok(e)) = stream.next().await {
        activity.set_busy(computer_id, e.running > 0);
        if e.session_id.is_empty() {
            continue; // a status report only
        }
        let cmd = Command::SessionEnded {
            computer_id: computer_id.to_string(),
            generation,
            session_id: e.session_id,
            owner: e.owner,
            exit_code: e.exit_code,
            signal: e.signal,
            at_ms: now_ms(),
        };
        // Boxed: the future of a proposal is large, and would otherwise be part of every idle
        // link's task.
        if let Err(err) = Box::pin(cluster.propose(Request::new(cmd))).await {
            tracing::warn!(computer_id = %computer_id, error = %err, "could not record a session's end");
        }
    }
}
