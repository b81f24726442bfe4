//! One path to a Computer's owner: the node holding the Computer's agent link.
//!
//! Every call on a Computer (sessions, files, tools, and later ports, desktop, browser, copies)
//! is accepted by any node and must run where the agent's link is. [`Owners`] answers "where is
//! this Computer's link, and give me a client to it", with one rule for each step:
//!
//! - **Lookup** ([`Owners::locate`]): the link held here wins; otherwise the replicated
//!   directory (the Computer's `link_node`). A directory that names nobody, or names this node
//!   while the link is not here, may lag behind a link just recorded: the node catches up to the
//!   leader's commit (a read barrier) and looks once more.
//! - **Stale view** ([`Owners::reach`]): a node that does not hold the link answers
//!   [`ErrorKind::NotOwner`] with the owner it knows (`x-computerd-owner`); the sender goes once
//!   to the node named, and no further. A `NotOwner` that names nobody else means no other node
//!   holds it, and the call runs here (it waits for a resuming Computer, or answers that the
//!   agent is not connected).
//! - **Deadline** ([`CallKind`]): the owner has [`ACCEPT`] to take a routed call (answer its
//!   stream's headers), then the call has its kind's bound plus [`MARGIN`], on both ends; the
//!   same bounds apply to a call on a link held here.
//! - **Errors** ([`CallError::from_status`]): answers of agents and peers carry their
//!   [`ErrorKind`] in `x-computerd-kind`; the kind decides, never the message's text.
//!
//! [`forward`] is the sending end of routed HTTP calls (sessions, files), [`relay`] of MCP
//! requests; [`serve`] is the receiving end of both (the `Routing` gRPC service). [`blobs`]
//! moves blob bytes between nodes (a second copy of each upload, a read on a node without one).

pub mod blobs;
pub mod forward;
pub mod relay;
pub mod serve;

use std::sync::Arc;
use std::time::Duration;

use computerd_actors::link::Agent;
use computerd_actors::link::LinkRegistry;
use computerd_proto::ErrorKind;
use computerd_proto::OWNER;
use computerd_proto::cluster::routing_client::RoutingClient;
use computerd_raft::NodeId;
use computerd_raft::cluster::Cluster;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::Source;
use tonic::Status;
use tonic::Streaming;
use tonic::transport::Channel;

/// How long a call waits for the agent of a Computer that is resuming or starting.
pub const LINK_WAIT: Duration = Duration::from_secs(30);
/// The largest message on a route (a body chunk).
pub const MAX_ROUTE_MESSAGE: usize = 8 << 20;

pub use computerd_proto::deadline::ACCEPT;
pub use computerd_proto::deadline::CallKind;
pub use computerd_proto::deadline::MARGIN;

/// The Computer a path is about, and the rest of the path (`/v1/computers/{id}/{rest}`).
pub fn computer_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/v1/computers/")?;
    let rest = rest.split('?').next().unwrap_or_default();
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    (!id.is_empty()).then_some((id, tail))
}

/// The kind of a routed HTTP call, by its path (`/v1/computers/{id}/sessions…` or files).
pub fn kind_of_path(path: &str) -> CallKind {
    let rest = computer_path(path).map(|(_, rest)| rest).unwrap_or_default();
    if rest.starts_with("sessions") { CallKind::Session } else { CallKind::File }
}

/// The Computer a path is about.
pub fn computer_of(path: &str) -> Option<&str> {
    computer_path(path).map(|(id, _)| id)
}

/// An error of a call on a Computer: its kind and a message safe to show the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// The kind (and so the HTTP status).
    pub kind: ErrorKind,
    /// For the caller.
    pub message: String,
}

impl CallError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }

    /// A tunnel the agent did not open: its refusal as if a call had answered it (no kind: the
    /// link ended, or no answer came).
    pub fn from_refused(r: computerd_proto::mux::Refused) -> Self {
        match ErrorKind::parse(&r.kind) {
            Some(kind) => Self::from_status(kind.status(r.message)),
            None => Self::new(ErrorKind::Unavailable, r.message),
        }
    }

    /// The one mapping of an agent's or a peer's answer to the caller's error. The kind the
    /// answer carries decides; a status without one comes from the transport (the link or a
    /// connection failed) and is logged.
    pub fn from_status(s: Status) -> Self {
        match ErrorKind::of(&s) {
            Some(ErrorKind::StaleLink) => {
                Self::new(ErrorKind::Unavailable, "the computer's link was replaced; try again")
            }
            Some(ErrorKind::NotOwner) => Self::new(ErrorKind::Unavailable, "the computer's link moved; try again"),
            Some(ErrorKind::Internal) => {
                tracing::warn!(message = %s.message(), "agent call failed");
                Self::new(
                    ErrorKind::ComputerExecutionFailed,
                    format!("the call on the computer failed: {}", s.message()),
                )
            }
            Some(kind) => Self::new(kind, s.message()),
            None if s.code() == tonic::Code::DeadlineExceeded => {
                Self::new(ErrorKind::DeadlineExceeded, "the call on the computer did not end within its deadline")
            }
            None => {
                tracing::warn!(code = ?s.code(), message = %s.message(), "agent call failed");
                Self::new(ErrorKind::ComputerExecutionFailed, "the call on the computer failed")
            }
        }
    }

    /// The status that carries this error to another node or actor (read back by
    /// [`CallError::from_status`]).
    pub fn into_status(self) -> Status {
        self.kind.status(self.message)
    }

    fn deadline(node: NodeId, what: &str, after: Duration) -> Self {
        Self::new(
            ErrorKind::DeadlineExceeded,
            format!("node {node}, which holds the computer's link, did not {what} within {after:?}"),
        )
    }

    fn unreachable(node: NodeId, why: impl std::fmt::Display) -> Self {
        tracing::warn!(node, error = %why, "routing to the link's node failed");
        Self::new(
            ErrorKind::ComputerExecutionFailed,
            format!("node {node}, which holds the computer's link, did not answer"),
        )
    }
}

/// Where a Computer's link is.
pub enum Place {
    /// On this node.
    Here(computerd_actors::link::Link),
    /// On another node, as this node's directory says.
    At(NodeId),
    /// On no node that this node knows of.
    Nowhere,
}

/// A routed call that its owner took.
pub struct Reached<T> {
    /// The owner's answer.
    pub value: T,
    /// The node that took it.
    pub node: NodeId,
    /// How many times a stale view sent it on (0 or 1).
    pub reroutes: u32,
    /// When the whole call must have ended.
    pub deadline: tokio::time::Instant,
}

/// Why a routed call was not taken.
pub enum Miss {
    /// No other node holds the link: run the call here.
    Nobody,
    /// It failed; the caller gets this error.
    Failed(CallError),
}

/// The owner path (cheap to clone).
#[derive(Clone)]
pub struct Owners {
    cluster: Cluster,
    links: Arc<LinkRegistry>,
    counts: Arc<Counts>,
}

/// What the owner path did on this node since it started (`/v1/health`'s `routing`).
#[derive(Default, Debug)]
pub struct Counts {
    /// Calls sent to another node (each once, whatever followed).
    pub routed: std::sync::atomic::AtomicU64,
    /// Calls sent on once more, because the first node named another owner (a stale view).
    pub rerouted: std::sync::atomic::AtomicU64,
    /// Calls whose owner did not take them, or finish them, in time.
    pub timed_out: std::sync::atomic::AtomicU64,
}

impl Owners {
    /// The owner path of this node's store and links.
    pub fn new(cluster: Cluster, links: Arc<LinkRegistry>) -> Self {
        Self { cluster, links, counts: Arc::default() }
    }

    /// What the owner path did on this node.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    fn directory(&self, computer: &str) -> Option<NodeId> {
        self.cluster.state().read(|s| s.computers.get(computer).and_then(|c| c.link_node))
    }

    /// The node holding the Computer's link as this node sees it now, without waiting for a
    /// current read: a hint for the balancer (a stale one costs a hop, never a wrong answer).
    pub fn link_node_hint(&self, computer: &str) -> Option<NodeId> {
        if self.links.get(computer).is_some() {
            return Some(self.cluster.id());
        }
        self.directory(computer)
    }

    /// Where the Computer's link is: here, on the node the directory names, or nowhere known.
    pub async fn locate(&self, computer: &str) -> Place {
        if let Some(l) = self.links.get(computer) {
            return Place::Here(l);
        }
        let me = self.cluster.id();
        let mut owner = self.directory(computer);
        if owner.is_none_or(|n| n == me) && self.cluster.read_barrier().await.is_ok() {
            // This replica may lag behind the link's commit: look again once it is current.
            if let Some(l) = self.links.get(computer) {
                return Place::Here(l);
            }
            owner = self.directory(computer);
        }
        match owner {
            Some(n) if n != me => Place::At(n),
            _ => Place::Nowhere,
        }
    }

    /// The answer of a node asked to run a call whose link it does not hold: `NotOwner`, naming
    /// the owner it knows after the lookup rule (if another node).
    pub async fn not_owner(&self, computer: &str) -> Status {
        let mut status = ErrorKind::NotOwner.status("this node does not hold the computer's link");
        if let Place::At(n) = self.locate(computer).await
            && let Ok(v) = n.to_string().parse()
        {
            status.metadata_mut().insert(OWNER, v);
        }
        status
    }

    /// Opens a routed call on `first` (the owner named by [`Owners::locate`]) with `open`, which
    /// is given a client and the call's deadline and answers once the owner took the call (its
    /// stream's headers). A `NotOwner` naming another node sends it there, once.
    pub async fn reach<X, F>(
        &self,
        first: NodeId,
        kind: CallKind,
        mut open: impl FnMut(RoutingClient<Channel>, Duration) -> F,
    ) -> Result<Reached<Streaming<X>>, Miss>
    where
        F: Future<Output = Result<tonic::Response<Streaming<X>>, Status>>,
    {
        let me = self.cluster.id();
        use std::sync::atomic::Ordering::Relaxed;
        let deadline = tokio::time::Instant::now() + kind.deadline();
        let mut target = first;
        self.counts.routed.fetch_add(1, Relaxed);
        for reroutes in 0..2 {
            let addr = self.cluster.view().members.into_iter().find(|m| m.id == target).map(|m| m.addr.grpc);
            // A node the membership no longer has holds no link.
            let Some(addr) = addr else { return Err(Miss::Nobody) };
            let channel =
                self.cluster.channels().channel(&addr).map_err(|e| Miss::Failed(CallError::unreachable(target, e)))?;
            let client = RoutingClient::new(channel)
                .max_decoding_message_size(MAX_ROUTE_MESSAGE + 4096)
                .max_encoding_message_size(MAX_ROUTE_MESSAGE + 4096);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(ACCEPT, open(client, left)).await {
                Ok(Ok(r)) => return Ok(Reached { value: r.into_inner(), node: target, reroutes, deadline }),
                Ok(Err(s)) if ErrorKind::of(&s) == Some(ErrorKind::NotOwner) => {
                    let current: Option<NodeId> = s.metadata().get(OWNER).and_then(|v| v.to_str().ok()?.parse().ok());
                    match current {
                        Some(n) if reroutes == 0 && n != me && n != target => {
                            tracing::debug!(stale = target, current = n, "routing directory was stale; once more");
                            self.counts.rerouted.fetch_add(1, Relaxed);
                            target = n;
                        }
                        _ => return Err(Miss::Nobody),
                    }
                }
                Ok(Err(s)) if ErrorKind::of(&s).is_some() => return Err(Miss::Failed(CallError::from_status(s))),
                Ok(Err(s)) => return Err(Miss::Failed(CallError::unreachable(target, s))),
                Err(_) => {
                    self.counts.timed_out.fetch_add(1, Relaxed);
                    return Err(Miss::Failed(CallError::deadline(target, "take the call", ACCEPT)));
                }
            }
        }
        Err(Miss::Nobody)
    }

    /// Waits (at most `within`) until every member node has applied what is committed now: a
    /// read barrier here and on each other node (`Routing.CatchUp`). A node that does not answer
    /// in time is left out (one that cannot reach the leader cannot confirm anything either);
    /// answers how many did.
    pub async fn catch_up_all(&self, within: Duration) -> usize {
        let me = self.cluster.id();
        let others = self.cluster.view().members.into_iter().filter(|m| m.id != me).map(|m| m.addr.grpc);
        let calls = others.filter_map(|addr| self.cluster.channels().channel(&addr).ok()).map(|ch| async move {
            let mut client = RoutingClient::new(ch);
            let call = client.catch_up(computerd_proto::cluster::Empty {});
            matches!(tokio::time::timeout(within, call).await, Ok(Ok(_)))
        });
        let here = async { tokio::time::timeout(within, self.cluster.read_barrier()).await.is_ok_and(|r| r.is_ok()) };
        let (here, there) = tokio::join!(here, futures::future::join_all(calls));
        usize::from(here) + there.into_iter().filter(|ok| *ok).count()
    }

    /// A client of the Computer's agent over its link on this node. A Computer whose agent is
    /// expected (starting, or running: just resumed, or its agent between two connections) is
    /// waited for up to [`LINK_WAIT`].
    pub async fn agent(&self, computer: &str) -> Result<Agent, CallError> {
        let link = self.link(computer).await?;
        link.client().await.map_err(|_| self.not_linked(computer))
    }

    /// The Computer's link on this node, waited for as [`Owners::agent`] does.
    pub async fn link(&self, computer: &str) -> Result<computerd_actors::link::Link, CallError> {
        let link = match self.links.get(computer) {
            Some(l) => Some(l),
            None if self.expects_agent(computer) => self.wait_link(computer).await,
            None => None,
        };
        link.ok_or_else(|| self.not_linked(computer))
    }

    /// Waits up to [`LINK_WAIT`] for the Computer's link to come up here; gives up early when
    /// the directory shows it up on another node (the caller answers that it moved).
    async fn wait_link(&self, computer: &str) -> Option<computerd_actors::link::Link> {
        let deadline = tokio::time::Instant::now() + LINK_WAIT;
        let me = self.cluster.id();
        loop {
            let step = (tokio::time::Instant::now() + Duration::from_millis(200)).min(deadline);
            if let Some(l) = self.links.wait(computer, step).await {
                return Some(l);
            }
            if self.directory(computer).is_some_and(|n| n != me) || tokio::time::Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// True while the Computer runs our agent and is starting or running: its link is expected.
    /// An own machine is `running` once its link's `LinkUp` is committed, a moment before the
    /// link is registered here: its link is expected then too.
    fn expects_agent(&self, computer: &str) -> bool {
        self.cluster.state().read(|s| {
            s.computers.get(computer).is_some_and(|c| match c.state {
                ComputerState::Starting => s.runs_agent(computer),
                ComputerState::Running => s.runs_agent(computer) || matches!(c.source, Source::Paired),
                _ => false,
            })
        })
    }

    fn not_linked(&self, computer: &str) -> CallError {
        match self.directory(computer) {
            Some(n) if n != self.cluster.id() => CallError::new(
                ErrorKind::Unavailable,
                format!("the computer's link moved to node {n} during the call; try again"),
            ),
            _ => CallError::new(ErrorKind::ComputerExecutionFailed, "the computer's agent is not connected"),
        }
    }
}

#[async_trait::async_trait]
impl computerd_actors::session::AgentSource for Owners {
    async fn agent(&self, computer_id: &str) -> Result<Agent, Status> {
        Owners::agent(self, computer_id).await.map_err(CallError::into_status)
    }
}

/// Ends `stream` with an error once `deadline` passes (the owner stopped answering mid-call).
pub fn until<S, T>(
    stream: S,
    deadline: tokio::time::Instant,
    node: NodeId,
) -> futures::stream::BoxStream<'static, Result<T, CallError>>
where
    S: futures::Stream<Item = Result<T, Status>> + Send + Unpin + 'static,
    T: Send + 'static,
{
    use futures::StreamExt;
    futures::stream::unfold((stream, false), move |(mut stream, done)| async move {
        if done {
            return None;
        }
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(item))) => Some((Ok(item), (stream, false))),
            // An error with a kind is the owner's answer; one without is the connection failing.
            Ok(Some(Err(s))) if ErrorKind::of(&s).is_some() => Some((Err(CallError::from_status(s)), (stream, true))),
            Ok(Some(Err(s))) => Some((Err(CallError::unreachable(node, s)), (stream, true))),
            Ok(None) => None,
            Err(_) => {
                let late = CallError::new(
                    ErrorKind::DeadlineExceeded,
                    format!("node {node}, which holds the computer's link, did not finish the call by its deadline"),
                );
                Some((Err(late), (stream, true)))
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_computer_and_kind() {
        assert_eq!(computer_of("/v1/computers/cmp_1/sessions"), Some("cmp_1"));
        assert_eq!(computer_of("/v1/computers/cmp_1/files?path=a/b"), Some("cmp_1"));
        assert_eq!(computer_of("/v1/computers/cmp_1?x=1"), Some("cmp_1"));
        assert_eq!(computer_of("/v1/computers/"), None);
        assert_eq!(computer_of("/v1/members"), None);
        assert_eq!(kind_of_path("/v1/computers/c/sessions/cse_1/input"), CallKind::Session);
        assert_eq!(kind_of_path("/v1/computers/c/files?path=sessions"), CallKind::File);
        assert_eq!(kind_of_path("/v1/computers/c/directory?path=."), CallKind::File);
        assert!(CallKind::Session.deadline() > Duration::from_secs(30));
    }

    #[test]
    fn answers_map_by_their_kind_never_their_text() {
        let stale = CallError::from_status(ErrorKind::StaleLink.status("anything at all"));
        assert_eq!(stale.kind, ErrorKind::Unavailable);
        let gone = CallError::from_status(ErrorKind::NotFound.status("no such session"));
        assert_eq!(gone, CallError::new(ErrorKind::NotFound, "no such session"));
        // The old agent's text for a stale generation, without a kind, is a transport-level failure.
        let text = CallError::from_status(Status::failed_precondition("stale link generation Some(1); current is 2"));
        assert_eq!(text.kind, ErrorKind::ComputerExecutionFailed);
        let late = CallError::from_status(Status::deadline_exceeded("timeout expired"));
        assert_eq!(late.kind, ErrorKind::DeadlineExceeded);
        let back = CallError::new(ErrorKind::TooLarge, "big").into_status();
        assert_eq!(CallError::from_status(back), CallError::new(ErrorKind::TooLarge, "big"));
    }
}
