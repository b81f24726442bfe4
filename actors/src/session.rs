//! `SessionActor`: one per command session known to this node. Its mailbox runs the calls of one
//! session in order; it keeps the output offset delivered, so a call after a link cut reads from
//! there (complete, ordered output). The process itself lives in the agent, which also checks the
//! session's owner. The actor stops when the session's end was answered (or the agent no longer
//! knows it), and leaves the registry then.
//!
//! Sent to by: the HTTP session routes (through [`SessionRegistry`]), once they checked the
//! caller's rights. Resolves the Computer's current link itself, for each call, through the
//! node's owner path ([`AgentSource`]), and speaks gRPC to that agent under the call's deadline.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;

use computerd_proto::agent::Resize;
use computerd_proto::agent::SessionInput;
use computerd_proto::agent::SessionRef;
use computerd_proto::agent::SessionReply;
use computerd_proto::agent::StartSession;
use ractor::Actor;
use ractor::ActorProcessingErr;
use ractor::ActorRef;
use ractor::RpcReplyPort;
use tonic::Status;

use computerd_proto::ErrorKind;
use computerd_proto::deadline;

use crate::link::Agent;

/// Where a session actor gets a client of its Computer's agent: the node's owner path, which
/// knows where the link is and waits for one that is expected. Errors carry their kind
/// (`ErrorKind::status`).
#[async_trait::async_trait]
pub trait AgentSource: Send + Sync + 'static {
    /// A client of the Computer's agent over its link on this node.
    async fn agent(&self, computer_id: &str) -> Result<Agent, Status>;
}

/// The actor behaviour.
pub struct SessionActor;

/// What a session actor starts with.
pub struct SessionArgs {
    /// The session.
    pub session_id: String,
    /// Its Computer.
    pub computer_id: String,
    /// Where it leaves when it stops.
    pub registry: Arc<SessionRegistry>,
}

/// Messages of a session actor.
pub enum SessionMessage {
    /// Starts the command.
    Start(StartSession, RpcReplyPort<Result<SessionReply, Status>>),
    /// Sends input (the actor fills in the offset), answers new output.
    Input(SessionInput, RpcReplyPort<Result<SessionReply, Status>>),
    /// Resizes the terminal.
    Resize(Resize, RpcReplyPort<Result<(), Status>>),
    /// Kills the process group, answers the last output.
    Kill(SessionRef, RpcReplyPort<Result<SessionReply, Status>>),
}

/// The state of a session actor.
pub struct SessionState {
    args: SessionArgs,
    /// The owner path, for the link of each call.
    source: Arc<dyn AgentSource>,
    /// The output offset delivered so far (`None`: the agent's own cursor).
    offset: Option<u64>,
}

impl Actor for SessionActor {
    type Msg = SessionMessage;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        _me: ActorRef<SessionMessage>,
        args: SessionArgs,
    ) -> Result<SessionState, ActorProcessingErr> {
        let source = args.registry.source.clone();
        Ok(SessionState { args, source, offset: None })
    }

    async fn handle(
        &self,
        me: ActorRef<SessionMessage>,
        msg: SessionMessage,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SessionMessage::Start(req, reply) => {
                let bound = deadline::session_call(req.yield_ms);
                let r = state.call(bound, |mut a| async move { a.start(req).await }).await;
                state.after(&me, &r);
                let _ = reply.send(r);
            }
            SessionMessage::Input(mut req, reply) => {
                // A caller that names an offset (to read again after a lost answer) is served from
                // there; otherwise from what this actor delivered last.
                req.from_offset = req.from_offset.or(state.offset);
                let bound = deadline::session_call(req.yield_ms);
                let r = state.call(bound, |mut a| async move { a.input(req).await }).await;
                state.after(&me, &r);
                let _ = reply.send(r);
            }
            SessionMessage::Resize(req, reply) => {
                let bound = deadline::session_call(0);
                let r = state.call(bound, |mut a| async move { a.resize_terminal(req).await }).await.map(|_| ());
                if r.as_ref().is_err_and(gone) {
                    me.stop(None);
                }
                let _ = reply.send(r);
            }
            SessionMessage::Kill(req, reply) => {
                let bound = deadline::session_call(0);
                let r = state.call(bound, |mut a| async move { a.kill(req).await }).await;
                if r.as_ref().is_ok() || r.as_ref().is_err_and(gone) {
                    me.stop(None);
                }
                let _ = reply.send(r);
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _me: ActorRef<SessionMessage>,
        state: &mut SessionState,
    ) -> Result<(), ActorProcessingErr> {
        state.args.registry.remove(&state.args.session_id);
        Ok(())
    }
}

/// True when the agent no longer knows the session.
fn gone(s: &Status) -> bool {
    ErrorKind::of(s) == Some(ErrorKind::NotFound)
}

impl SessionState {
    /// One call on the agent of the Computer's current link, under `bound`.
    async fn call<T, F>(&self, bound: std::time::Duration, f: impl FnOnce(Agent) -> F) -> Result<T, Status>
    where
        F: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let agent = self.source.agent(&self.args.computer_id).await?;
        match tokio::time::timeout(bound, f(agent)).await {
            Ok(r) => r.map(|r| r.into_inner()),
            Err(_) => Err(ErrorKind::DeadlineExceeded.status("the session call did not end within its deadline")),
        }
    }

    fn after(&mut self, me: &ActorRef<SessionMessage>, r: &Result<SessionReply, Status>) {
        match r {
            Ok(reply) => {
                self.offset = Some(reply.offset);
                if !reply.running {
                    me.stop(None);
                }
            }
            Err(s) if matches!(ErrorKind::of(s), Some(ErrorKind::NotFound | ErrorKind::Conflict)) => me.stop(None),
            Err(_) => {}
        }
    }
}

/// One registered session.
#[derive(Clone)]
pub struct SessionHandle {
    /// The Computer it runs on.
    pub computer_id: String,
    /// The bot or member that started it.
    pub owner: String,
    /// Its actor.
    pub actor: ActorRef<SessionMessage>,
}

/// The sessions this node has actors for.
pub struct SessionRegistry {
    inner: Mutex<HashMap<String, SessionHandle>>,
    /// Where the actors get their links.
    source: Arc<dyn AgentSource>,
}

impl SessionRegistry {
    /// A registry whose actors get their links from `source`.
    pub fn new(source: Arc<dyn AgentSource>) -> Self {
        Self { inner: Mutex::default(), source }
    }

    /// The session's actor, started if this node has none yet (a new session, or one whose link
    /// moved here).
    pub async fn get_or_start(
        self: &Arc<Self>,
        session_id: &str,
        computer_id: &str,
        owner: &str,
    ) -> Result<SessionHandle, ractor::SpawnErr> {
        if let Some(h) = self.inner.lock().unwrap_or_else(|p| p.into_inner()).get(session_id) {
            return Ok(h.clone());
        }
        let args = SessionArgs {
            session_id: session_id.to_string(),
            computer_id: computer_id.to_string(),
            registry: self.clone(),
        };
        let (actor, _) = Actor::spawn(None, SessionActor, args).await?;
        let handle = SessionHandle { computer_id: computer_id.to_string(), owner: owner.to_string(), actor };
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(session_id) {
            // Another call started one meanwhile: use it, stop ours.
            Some(h) => {
                handle.actor.stop(None);
                Ok(h.clone())
            }
            None => {
                map.insert(session_id.to_string(), handle.clone());
                Ok(handle)
            }
        }
    }

    fn remove(&self, session_id: &str) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).remove(session_id);
    }

    /// How many sessions have actors here.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
