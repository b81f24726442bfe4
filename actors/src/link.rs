//! `AgentLinkActor`: one per live agent link on this node. It owns the link's lifecycle: it
//! registers the link (newest generation wins), relays the agent's `computer_session` reports
//! over one long-lived `WatchSessions` stream, and when the link ends (that stream fails, or a
//! newer generation registers) unregisters it (only if still its generation) and commits
//! `LinkDown` for its generation only, so an old link never unregisters or offlines a newer one.
//!
//! Liveness costs no request: the HTTP/2 connection under the link sends keep-alive PING frames
//! (set by the WebSocket handler), and a dead connection or a closed WebSocket fails the
//! `WatchSessions` stream, which is the actor's signal that the link is lost.
//!
//! Sent to by: its `WatchSessions` task (lost) and the registry (replaced). Speaks gRPC to the agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use computerd_proto::LINK_GENERATION;
use computerd_proto::agent::Nothing;
use computerd_proto::agent::agent_client::AgentClient;
use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use futures::StreamExt;
use ractor::Actor;
use ractor::ActorProcessingErr;
use ractor::ActorRef;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

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
pub type Agent = AgentClient<InterceptedService<Channel, Generation>>;

/// One live link.
#[derive(Clone)]
pub struct Link {
    /// Its generation.
    pub generation: u64,
    /// The agent.
    pub client: Agent,
    /// The link's actor, told when a newer generation replaces it.
    actor: ActorRef<LinkMessage>,
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
            let _ = old.actor.cast(LinkMessage::Replaced);
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

    /// How many links this node holds.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The actor behaviour.
pub struct AgentLinkActor;

/// What a link actor starts with.
pub struct LinkArgs {
    /// The Computer.
    pub computer_id: String,
    /// The committed generation of this link.
    pub generation: u64,
    /// The agent over this link.
    pub client: Agent,
    /// The store.
    pub cluster: Cluster,
    /// This node's links.
    pub links: Arc<LinkRegistry>,
    /// Work seen on this node (the agent's running commands).
    pub activity: Arc<crate::idle::Activity>,
}

/// Messages of a link actor.
pub enum LinkMessage {
    /// A newer generation of the same Computer registered on this node.
    Replaced,
    /// The `WatchSessions` stream ended: the connection is gone or the agent refused us.
    Lost,
}

/// The state of a link actor.
pub struct LinkState {
    args: LinkArgs,
    watcher: tokio::task::JoinHandle<()>,
}

impl Actor for AgentLinkActor {
    type Msg = LinkMessage;
    type State = LinkState;
    type Arguments = LinkArgs;

    async fn pre_start(&self, me: ActorRef<LinkMessage>, args: LinkArgs) -> Result<LinkState, ActorProcessingErr> {
        let link = Link { generation: args.generation, client: args.client.clone(), actor: me.clone() };
        if !args.links.insert(&args.computer_id, link) {
            return Err(format!("a newer link of {} is already here", args.computer_id).into());
        }
        tracing::info!(computer_id = %args.computer_id, generation = args.generation, "agent linked");
        let watch = watch_sessions(
            args.cluster.clone(),
            args.computer_id.clone(),
            args.generation,
            args.client.clone(),
            args.activity.clone(),
        );
        let watcher = tokio::spawn(async move {
            watch.await;
            let _ = me.cast(LinkMessage::Lost);
        });
        Ok(LinkState { args, watcher })
    }

    async fn handle(
        &self,
        me: ActorRef<LinkMessage>,
        msg: LinkMessage,
        state: &mut LinkState,
    ) -> Result<(), ActorProcessingErr> {
        let a = &state.args;
        match msg {
            LinkMessage::Replaced => {
                tracing::info!(computer_id = %a.computer_id, generation = a.generation, "link replaced by a newer one")
            }
            LinkMessage::Lost => {
                tracing::info!(computer_id = %a.computer_id, generation = a.generation, "agent link lost")
            }
        }
        me.stop(None);
        Ok(())
    }

    async fn post_stop(&self, _me: ActorRef<LinkMessage>, state: &mut LinkState) -> Result<(), ActorProcessingErr> {
        state.watcher.abort();
        let a = &state.args;
        a.activity.set_busy(&a.computer_id, false);
        a.links.remove_if(&a.computer_id, a.generation);
        let cmd = Command::LinkDown { computer_id: a.computer_id.clone(), generation: a.generation, at_ms: now_ms() };
        if let Err(e) = a.cluster.propose(Request::new(cmd)).await {
            tracing::warn!(computer_id = %a.computer_id, error = %e, "could not record the link's end");
        }
        Ok(())
    }
}

/// Turns the agent's reports of commands that ended after their wait into `computer_session`
/// events.
/// Returns when the stream ends, which means the link is gone.
async fn watch_sessions(
    cluster: Cluster,
    computer_id: String,
    generation: u64,
    mut client: Agent,
    activity: Arc<crate::idle::Activity>,
) {
    let mut stream = match client.watch_sessions(Nothing {}).await {
        Ok(s) => s.into_inner(),
        Err(e) => {
            tracing::debug!(computer_id = %computer_id, status = %e, "the agent refused WatchSessions");
            return;
        }
    };
    while let Some(Ok(e)) = stream.next().await {
        activity.set_busy(&computer_id, e.running > 0);
        if e.session_id.is_empty() {
            continue; // a status report only
        }
        let cmd = Command::SessionEnded {
            computer_id: computer_id.clone(),
            generation,
            session_id: e.session_id,
            owner: e.owner,
            exit_code: e.exit_code,
            signal: e.signal,
            at_ms: now_ms(),
        };
        if let Err(err) = cluster.propose(Request::new(cmd)).await {
            tracing::warn!(computer_id = %computer_id, error = %err, "could not record a session's end");
        }
    }
}
