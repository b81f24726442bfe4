//! `AgentLinkActor`: one per live agent link on this node. It owns the link's lifecycle: it
//! registers the link (newest generation wins), watches it with a ping every 2 s, relays the
//! agent's `computer_session` reports, and when the link ends (ping failure or a newer
//! generation) unregisters it (only if still its generation) and commits `LinkDown` for its
//! generation only, so an old link never unregisters or offlines a newer one.
//!
//! Sent to by: the WebSocket handler (spawn) and its own timer. Speaks gRPC to the agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

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

/// How often a link is pinged.
const PING_EVERY: Duration = Duration::from_secs(2);

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
}

/// Messages of a link actor.
pub enum LinkMessage {
    /// Time to check the link (sent by its own timer).
    Check,
}

/// The state of a link actor.
pub struct LinkState {
    args: LinkArgs,
    watcher: tokio::task::JoinHandle<()>,
    timer: tokio::task::JoinHandle<()>,
}

impl Actor for AgentLinkActor {
    type Msg = LinkMessage;
    type State = LinkState;
    type Arguments = LinkArgs;

    async fn pre_start(&self, me: ActorRef<LinkMessage>, args: LinkArgs) -> Result<LinkState, ActorProcessingErr> {
        args.links.insert(&args.computer_id, Link { generation: args.generation, client: args.client.clone() });
        tracing::info!(computer_id = %args.computer_id, generation = args.generation, "agent linked");
        let watcher = tokio::spawn(watch_sessions(
            args.cluster.clone(),
            args.computer_id.clone(),
            args.generation,
            args.client.clone(),
        ));
        let timer = me.send_interval(PING_EVERY, || LinkMessage::Check);
        Ok(LinkState { args, watcher, timer })
    }

    async fn handle(
        &self,
        me: ActorRef<LinkMessage>,
        msg: LinkMessage,
        state: &mut LinkState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            LinkMessage::Check => state.handle_check(&me).await,
        }
        Ok(())
    }

    async fn post_stop(&self, _me: ActorRef<LinkMessage>, state: &mut LinkState) -> Result<(), ActorProcessingErr> {
        state.timer.abort();
        state.watcher.abort();
        let a = &state.args;
        a.links.remove_if(&a.computer_id, a.generation);
        let cmd = Command::LinkDown { computer_id: a.computer_id.clone(), generation: a.generation, at_ms: now_ms() };
        if let Err(e) = a.cluster.propose(Request::new(cmd)).await {
            tracing::warn!(computer_id = %a.computer_id, error = %e, "could not record the link's end");
        }
        Ok(())
    }
}

impl LinkState {
    async fn handle_check(&mut self, me: &ActorRef<LinkMessage>) {
        let a = &self.args;
        if a.links.current(&a.computer_id) != Some(a.generation) {
            tracing::info!(computer_id = %a.computer_id, generation = a.generation, "link replaced by a newer one");
            return me.stop(None);
        }
        let mut req = tonic::Request::new(Nothing {});
        req.set_timeout(Duration::from_secs(5));
        if let Err(s) = a.client.clone().ping(req).await {
            tracing::info!(computer_id = %a.computer_id, generation = a.generation, status = %s, "agent link lost");
            me.stop(None);
        }
    }
}

/// Turns the agent's reports of commands that ended after their wait into `computer_session`
/// events.
async fn watch_sessions(cluster: Cluster, computer_id: String, generation: u64, mut client: Agent) {
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
        if let Err(err) = cluster.propose(Request::new(cmd)).await {
            tracing::warn!(computer_id = %computer_id, error = %err, "could not record a session's end");
        }
    }
}
