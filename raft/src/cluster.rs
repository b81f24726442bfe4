//! What a node uses of the replicated store: propose a command (forwarded to the leader),
//! a linearizable read barrier, membership changes, and the current view of the cluster.
//!
//! Every command must be idempotent (creates carry their ids, changes are set-to-value): when a
//! forwarded proposal's answer is lost, the proposal is sent again, and applying it twice must
//! change nothing the second time.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use computerd_proto::cluster::Empty;
use computerd_proto::cluster::JoinRequest;
use openraft::ChangeMembers;
use openraft::Config;
use openraft::ReadPolicy;
use openraft::SnapshotPolicy;
use openraft::errors::ClientWriteError;
use openraft::errors::RaftError;
use openraft::type_config::async_runtime::WatchReceiver;
use serde::Deserialize;
use serde::Serialize;
use tokio::time::Instant;

use crate::NodeAddr;
use crate::NodeId;
use crate::Raft;
use crate::network::Channels;
use crate::network::NetworkFactory;
use crate::network::decode;
use crate::network::encode;
use crate::sm::Request;
use crate::sm::Response;
use crate::store;
use crate::store::StateReader;

/// How long a write may wait for a leader before the caller is told to retry.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a linearizable read may wait.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a join may take (the new node may need a snapshot).
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause between attempts when no leader is known or the known one moved.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Why the store could not serve a call.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No leader or no quorum right now; the call may be retried later.
    #[error("the cluster is unavailable: {0}")]
    Unavailable(String),
    /// The call itself is wrong (e.g. an unknown node).
    #[error("invalid: {0}")]
    Invalid(String),
    /// The local Raft node has stopped.
    #[error("the store has stopped: {0}")]
    Fatal(String),
}

/// Raft timing and log-compaction knobs.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Heartbeat interval, ms.
    pub heartbeat_ms: u64,
    /// Minimum election timeout, ms (the maximum is twice this).
    pub election_min_ms: u64,
    /// Build a snapshot every this many log entries.
    pub snapshot_every: u64,
    /// Log entries kept behind the snapshot for slow followers.
    pub keep_logs: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        // Compaction as etcd does by default (--snapshot-count, --snapshot-catchup-entries).
        // Elections: 300-600 ms (a follower's vote lease is the maximum). Pre-vote keeps a slow
        // follower whose timer fires from deposing a live leader, so the timeouts can be short.
        Self { heartbeat_ms: 100, election_min_ms: 300, snapshot_every: 100_000, keep_logs: 5_000 }
    }
}

/// The answer of a proposal forwarded to a node that may no longer lead.
#[derive(Debug, Serialize, Deserialize)]
pub enum ProposeReply {
    /// Applied; the state machine's response.
    Applied(Response),
    /// This node does not lead; the leader it knows, if any.
    NotLeader(Option<(NodeId, NodeAddr)>),
}

/// The answer of a read-index request.
#[derive(Debug, Serialize, Deserialize)]
pub enum ReadIndexReply {
    /// Confirmed by a quorum: a read is current once this index is applied.
    Index(Option<u64>),
    /// This node does not lead; the leader it knows, if any.
    NotLeader(Option<(NodeId, NodeAddr)>),
}

/// A node's view of one cluster member.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberView {
    /// Node id.
    pub id: NodeId,
    /// Addresses.
    pub addr: NodeAddr,
    /// Voter or learner.
    pub voter: bool,
}

/// A snapshot of the node's Raft metrics, for health and tests.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterView {
    /// This node.
    pub node_id: NodeId,
    /// The leader this node knows.
    pub leader_id: Option<NodeId>,
    /// Current term.
    pub term: u64,
    /// Last applied log index.
    pub last_applied: Option<u64>,
    /// Index of the latest snapshot.
    pub snapshot: Option<u64>,
    /// Index up to which the log was purged.
    pub purged: Option<u64>,
    /// Members of the current membership.
    pub members: Vec<MemberView>,
}

struct Inner {
    id: NodeId,
    /// False while a fresh node waits for its join to be accepted: it refuses Raft RPCs so the
    /// leader does not see its empty log before it allowed the reversion.
    accepting: std::sync::atomic::AtomicBool,
    raft: Raft,
    reader: StateReader,
    channels: Channels,
    /// When this process started: the epoch of `leader_contact_ms`.
    started: Instant,
    /// Ms after `started` of the last append (or heartbeat) accepted from a current leader;
    /// 0 = never.
    leader_contact_ms: std::sync::atomic::AtomicU64,
    /// How long a node may go without quorum contact before it steps aside.
    contact_window: Duration,
}

/// A node's handle on the replicated store. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl Cluster {
    /// Opens the store in `dir` and starts the Raft node (not yet serving RPCs: add
    /// [`crate::service::Service`] to a gRPC server); `channels` reach the peers.
    pub async fn start(id: NodeId, dir: &Path, tuning: &Tuning, channels: Channels) -> Result<Cluster, ClusterError> {
        let (log, sm) = store::open(dir).map_err(|e| ClusterError::Fatal(format!("cannot open the store: {e}")))?;
        let reader = sm.reader();
        let config = Config {
            cluster_name: "computerd".into(),
            heartbeat_interval: tuning.heartbeat_ms,
            election_timeout_min: tuning.election_min_ms,
            election_timeout_max: tuning.election_min_ms * 2,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(tuning.snapshot_every),
            max_in_snapshot_log_to_keep: tuning.keep_logs,
            // A follower whose timer fires first asks before it bumps its term: a node cut off
            // by a partition cannot disrupt the leader when it comes back, and after a leader
            // crash the candidates do not split the vote by each taking a new term while the
            // others still hold the dead leader's lease.
            enable_pre_vote: Some(true),
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(|e| ClusterError::Invalid(e.to_string()))?);
        let raft = Raft::new(id, config, NetworkFactory::new(channels.clone()), log, sm)
            .await
            .map_err(|e| ClusterError::Fatal(e.to_string()))?;
        let accepting = std::sync::atomic::AtomicBool::new(true);
        // Five minimum election timeouts (2 s by default): longer than an election after a leader
        // crash takes, so a healthy follower never steps aside while a new leader is chosen.
        let contact_window = Duration::from_millis(tuning.election_min_ms * 5);
        let (started, leader_contact_ms) = (Instant::now(), std::sync::atomic::AtomicU64::new(0));
        let inner = Inner { id, accepting, raft, reader, channels, started, leader_contact_ms, contact_window };
        Ok(Cluster { inner: Arc::new(inner) })
    }

    /// Opens or closes this node to Raft RPCs (closed while a fresh node joins).
    pub fn set_accepting(&self, on: bool) {
        self.inner.accepting.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Refuses Raft RPCs while this node is closed to them.
    pub fn check_accepting(&self) -> Result<(), tonic::Status> {
        if self.inner.accepting.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err(tonic::Status::unavailable("this node is joining"))
        }
    }

    /// The Raft handle.
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    /// Read access to the applied state (call [`Cluster::read_barrier`] first for a current read).
    pub fn state(&self) -> &StateReader {
        &self.inner.reader
    }

    /// Channels to peers, shared with the node's own forwarding.
    pub fn channels(&self) -> &Channels {
        &self.inner.channels
    }

    /// True once this node has a membership (bootstrapped or joined).
    pub async fn is_initialized(&self) -> Result<bool, ClusterError> {
        self.raft().is_initialized().await.map_err(|e| ClusterError::Fatal(e.to_string()))
    }

    /// Makes this node a one-node cluster.
    pub async fn initialize(&self, addr: NodeAddr) -> Result<(), ClusterError> {
        let members = std::collections::BTreeMap::from([(self.id(), addr)]);
        self.raft().initialize(members).await.map_err(|e| ClusterError::Fatal(e.to_string()))
    }

    /// The current view from this node's Raft metrics.
    pub fn view(&self) -> ClusterView {
        let m = self.raft().metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, addr)| MemberView { id: *id, addr: addr.clone(), voter: voters.contains(id) })
            .collect();
        ClusterView {
            node_id: self.id(),
            leader_id: m.current_leader,
            term: m.current_term,
            last_applied: m.last_applied.map(|l| l.index),
            snapshot: m.snapshot.map(|l| l.index),
            purged: m.purged.map(|l| l.index),
            members,
        }
    }

    /// On the leader: for each other member, how long since it last acknowledged a heartbeat or
    /// an append (`None`: never, in this term). `None` on a node that does not lead.
    pub fn peer_silence(&self) -> Option<std::collections::BTreeMap<NodeId, Option<Duration>>> {
        let m = self.raft().metrics().borrow_watched().clone();
        let acks = m.heartbeat?;
        Some(
            acks.into_iter()
                .filter(|(id, _)| *id != self.id())
                .map(|(id, at)| (id, at.map(|t| openraft::Instant::elapsed(&*t))))
                .collect(),
        )
    }

    /// Records that a current leader's append or heartbeat was accepted.
    pub fn note_leader_contact(&self) {
        let ms = (self.inner.started.elapsed().as_millis() as u64).max(1);
        self.inner.leader_contact_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether this node is in touch with a quorum: a leader acknowledged by a quorum, or a
    /// follower that heard from its leader, within five minimum election timeouts (a single-voter
    /// cluster's leader always is). A node out of touch is cut off (a partition, or a dead
    /// quorum): it cannot commit anything, so it should not take calls or hold links.
    pub fn quorum_contact(&self) -> bool {
        let m = self.raft().metrics().borrow_watched().clone();
        let window = self.inner.contact_window;
        if m.current_leader == Some(self.id()) {
            let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
            if voters == [self.id()] {
                return true;
            }
            return m.last_quorum_acked.is_some_and(|t| openraft::Instant::elapsed(&*t) < window);
        }
        let at = self.inner.leader_contact_ms.load(std::sync::atomic::Ordering::Relaxed);
        at != 0 && self.inner.started.elapsed().saturating_sub(Duration::from_millis(at)) < window
    }

    /// The leader this node knows, with its addresses.
    pub fn leader(&self) -> Option<(NodeId, NodeAddr)> {
        let m = self.raft().metrics().borrow_watched().clone();
        let id = m.current_leader?;
        let addr = m.membership_config.membership().get_node(&id)?.clone();
        Some((id, addr))
    }

    async fn wait_for_leader(&self, deadline: Instant) -> Result<(), ClusterError> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.raft()
            .wait(Some(left))
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await
            .map(|_| ())
            .map_err(|e| ClusterError::Unavailable(format!("no leader: {e}")))
    }

    /// Returns when this node no longer sees `leader` as the leader (it was deposed, or it went
    /// quiet past the election timeout), so a call waiting on it can be sent to the next one.
    async fn leader_moved_from(&self, leader: NodeId) {
        let mut metrics = self.raft().metrics();
        loop {
            if metrics.borrow_and_update().current_leader != Some(leader) {
                return;
            }
            if metrics.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Proposes a command and waits until it is applied; any node may call it.
    pub async fn propose(&self, req: Request) -> Result<Response, ClusterError> {
        let deadline = Instant::now() + WRITE_TIMEOUT;
        let payload = encode(&req).map_err(|e| ClusterError::Invalid(e.to_string()))?;
        loop {
            if Instant::now() >= deadline {
                return Err(ClusterError::Unavailable("no leader accepted the write in time".into()));
            }
            let leader = match self.leader() {
                Some(l) => l,
                None => {
                    self.wait_for_leader(deadline).await?;
                    continue;
                }
            };
            let reply = if leader.0 == self.id() {
                // A leader cut off from its quorum commits nothing, and may not learn that it was
                // deposed until the partition heals: give up at the deadline too (the write may
                // still apply, as after a lost forward).
                match tokio::time::timeout_at(deadline, self.propose_local(req.clone())).await {
                    Ok(reply) => reply?,
                    Err(_) => return Err(ClusterError::Unavailable("the write was not committed in time".into())),
                }
            } else {
                let mut client =
                    self.channels().get(&leader.1.grpc).map_err(|e| ClusterError::Invalid(e.to_string()))?;
                let mut r = tonic::Request::new(payload.clone());
                r.set_timeout(deadline.saturating_duration_since(Instant::now()));
                // A leader that stops answering (stopped, cut off) is replaced after the election
                // timeout: then send to the new one rather than wait out the whole deadline.
                let answer = tokio::select! {
                    a = client.propose(r) => a,
                    () = self.leader_moved_from(leader.0) => {
                        tracing::debug!(leader = leader.0, "the leader changed during a forwarded write; retrying");
                        continue;
                    }
                };
                match answer {
                    Ok(resp) => decode(resp.get_ref()).map_err(|e| ClusterError::Fatal(e.to_string()))?,
                    Err(status) => {
                        // The answer may be lost after the command applied; commands are
                        // idempotent, so sending it again is safe.
                        tracing::debug!(leader = leader.0, %status, "forwarded write failed; retrying");
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue;
                    }
                }
            };
            match reply {
                ProposeReply::Applied(r) => return Ok(r),
                ProposeReply::NotLeader(_) => tokio::time::sleep(RETRY_PAUSE).await,
            }
        }
    }

    /// Proposes on this node only; answers [`ProposeReply::NotLeader`] when it does not lead.
    pub async fn propose_local(&self, req: Request) -> Result<ProposeReply, ClusterError> {
        match self.raft().client_write(req).await {
            Ok(resp) => Ok(ProposeReply::Applied(resp.data)),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))
            | Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(f))) => {
                Ok(ProposeReply::NotLeader(f.leader_id.zip(f.leader_node)))
            }
            Err(RaftError::APIError(e)) => Err(ClusterError::Invalid(e.to_string())),
            Err(RaftError::Fatal(e)) => Err(ClusterError::Fatal(e.to_string())),
        }
    }

    /// Returns once this node's state machine reflects every write acknowledged before the call
    /// (a quorum-confirmed read index, never a lease).
    pub async fn read_barrier(&self) -> Result<(), ClusterError> {
        let deadline = Instant::now() + READ_TIMEOUT;
        loop {
            if Instant::now() >= deadline {
                return Err(ClusterError::Unavailable("no quorum confirmed the read in time".into()));
            }
            let Some(leader) = self.leader() else {
                self.wait_for_leader(deadline).await?;
                continue;
            };
            let reply = if leader.0 == self.id() {
                self.read_index_local().await?
            } else {
                let mut client =
                    self.channels().get(&leader.1.grpc).map_err(|e| ClusterError::Invalid(e.to_string()))?;
                let mut r = tonic::Request::new(Empty {});
                r.set_timeout(deadline.saturating_duration_since(Instant::now()));
                let answer = tokio::select! {
                    a = client.read_index(r) => a,
                    () = self.leader_moved_from(leader.0) => continue,
                };
                match answer {
                    Ok(resp) => decode(resp.get_ref()).map_err(|e| ClusterError::Fatal(e.to_string()))?,
                    Err(status) => {
                        tracing::debug!(leader = leader.0, %status, "read index failed; retrying");
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue;
                    }
                }
            };
            match reply {
                ReadIndexReply::Index(index) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    return self
                        .raft()
                        .wait(Some(left))
                        .applied_index_at_least(index, "read barrier")
                        .await
                        .map(|_| ())
                        .map_err(|e| ClusterError::Unavailable(format!("not caught up: {e}")));
                }
                ReadIndexReply::NotLeader(_) => tokio::time::sleep(RETRY_PAUSE).await,
            }
        }
    }

    /// On the leader: a quorum-confirmed read index.
    pub async fn read_index_local(&self) -> Result<ReadIndexReply, ClusterError> {
        let fut = self.raft().get_read_log_id(ReadPolicy::ReadIndex);
        match tokio::time::timeout(READ_TIMEOUT, fut).await {
            Err(_) => Err(ClusterError::Unavailable("no quorum confirmed the read in time".into())),
            Ok(Ok((read_log_id, _applied))) => Ok(ReadIndexReply::Index(Some(read_log_id.log_id().index))),
            Ok(Err(RaftError::APIError(openraft::errors::LinearizableReadError::ForwardToLeader(f)))) => {
                Ok(ReadIndexReply::NotLeader(f.leader_id.zip(f.leader_node)))
            }
            Ok(Err(RaftError::APIError(e))) => Err(ClusterError::Unavailable(e.to_string())),
            Ok(Err(RaftError::Fatal(e))) => Err(ClusterError::Fatal(e.to_string())),
        }
    }

    /// Adds a node as a voter (through the leader): learner first, then voter once caught up.
    /// Idempotent; a known node with new addresses gets them updated. Answers the cluster id.
    pub async fn join(&self, node_id: NodeId, addr: NodeAddr) -> Result<String, ClusterError> {
        let Some(leader) = self.leader() else {
            self.wait_for_leader(Instant::now() + READ_TIMEOUT).await?;
            return Err(ClusterError::Unavailable("no leader yet; retry the join".into()));
        };
        if leader.0 != self.id() {
            let mut client = self.channels().get(&leader.1.grpc).map_err(|e| ClusterError::Invalid(e.to_string()))?;
            let mut r = tonic::Request::new(JoinRequest {
                node_id,
                http_addr: addr.http,
                grpc_addr: addr.grpc,
                check_only: false,
                fresh: false,
            });
            r.set_timeout(JOIN_TIMEOUT);
            let reply = client.join(r).await.map_err(|s| ClusterError::Unavailable(s.message().to_string()))?;
            return Ok(reply.into_inner().cluster_id);
        }
        let cluster_id = self
            .state()
            .read(|s| s.cluster_id.clone())
            .ok_or_else(|| ClusterError::Unavailable("the cluster is not bootstrapped yet".into()))?;
        let view = self.view();
        let known = view.members.iter().find(|m| m.id == node_id);
        let change = |e: RaftError<crate::TypeConfig, ClientWriteError<crate::TypeConfig>>| match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => ClusterError::Unavailable(e.to_string()),
            RaftError::APIError(e) => ClusterError::Invalid(e.to_string()),
            RaftError::Fatal(e) => ClusterError::Fatal(e.to_string()),
        };
        match known {
            Some(m) if m.addr != addr => {
                let nodes = std::collections::BTreeMap::from([(node_id, addr.clone())]);
                self.raft().change_membership(ChangeMembers::SetNodes(nodes), true).await.map_err(change)?;
            }
            Some(_) => {}
            None => {
                self.raft().add_learner(node_id, addr.clone(), true).await.map_err(change)?;
            }
        }
        if !known.is_some_and(|m| m.voter) {
            let ids = std::collections::BTreeSet::from([node_id]);
            self.raft().change_membership(ChangeMembers::AddVoterIds(ids), true).await.map_err(change)?;
        }
        tracing::info!(node_id, %addr, "node is a voter with these addresses");
        Ok(cluster_id)
    }

    /// The cluster id, read after a linearizable barrier.
    pub async fn cluster_id(&self) -> Result<String, ClusterError> {
        self.read_barrier().await?;
        self.state()
            .read(|s| s.cluster_id.clone())
            .ok_or_else(|| ClusterError::Unavailable("the cluster is not bootstrapped yet".into()))
    }

    /// Asks the member at `grpc_addr` to add this node, or (with `check_only`) only for its cluster id.
    pub async fn join_through(
        &self,
        grpc_addr: &str,
        addr: &NodeAddr,
        check_only: bool,
        fresh: bool,
    ) -> Result<String, ClusterError> {
        let mut client = self.channels().get(grpc_addr).map_err(|e| ClusterError::Invalid(e.to_string()))?;
        let mut r = tonic::Request::new(JoinRequest {
            node_id: self.id(),
            http_addr: addr.http.clone(),
            grpc_addr: addr.grpc.clone(),
            check_only,
            fresh,
        });
        r.set_timeout(JOIN_TIMEOUT);
        let reply = client.join(r).await.map_err(|s| ClusterError::Unavailable(s.message().to_string()))?;
        Ok(reply.into_inner().cluster_id)
    }

    /// Before a node with an empty store opens itself to Raft RPCs: if its id is already a member
    /// (its data was lost), the leader lets its log revert once, so it is replicated anew
    /// (through a snapshot when the log was purged) instead of being taken for a bug.
    pub async fn allow_revert(&self, node_id: NodeId) -> Result<(), ClusterError> {
        let Some(leader) = self.leader() else {
            return Err(ClusterError::Unavailable("no leader".into()));
        };
        if leader.0 != self.id() {
            let r = node_request(node_id, true, true, READ_TIMEOUT);
            self.client_of(&leader.1)?.join(r).await.map_err(|s| ClusterError::Unavailable(s.message().to_string()))?;
            return Ok(());
        }
        if !self.view().members.iter().any(|m| m.id == node_id) {
            return Ok(());
        }
        match self.raft().trigger().allow_next_revert(&node_id, true).await {
            Ok(Ok(())) => {
                tracing::warn!(node_id, "a member rejoins with an empty store; replicating it anew");
                Ok(())
            }
            Ok(Err(e)) => Err(ClusterError::Invalid(e.to_string())),
            Err(e) => Err(ClusterError::Fatal(e.to_string())),
        }
    }

    /// The gRPC client of another member.
    fn client_of(
        &self,
        addr: &NodeAddr,
    ) -> Result<
        computerd_proto::cluster::cluster_service_client::ClusterServiceClient<tonic::transport::Channel>,
        ClusterError,
    > {
        self.channels().get(&addr.grpc).map_err(|e| ClusterError::Invalid(e.to_string()))
    }

    /// Removes a node from the membership (through the leader).
    pub async fn leave(&self, node_id: NodeId) -> Result<(), ClusterError> {
        let Some(leader) = self.leader() else {
            return Err(ClusterError::Unavailable("no leader".into()));
        };
        if leader.0 != self.id() {
            let r = node_request(node_id, false, false, JOIN_TIMEOUT);
            self.client_of(&leader.1)?
                .leave(r)
                .await
                .map_err(|s| ClusterError::Unavailable(s.message().to_string()))?;
            return Ok(());
        }
        let view = self.view();
        let Some(m) = view.members.iter().find(|m| m.id == node_id) else {
            return Err(ClusterError::Invalid(format!("node {node_id} is not a member")));
        };
        let ids = std::collections::BTreeSet::from([node_id]);
        let res = if m.voter {
            self.raft().change_membership(ChangeMembers::RemoveVoters(ids), false).await
        } else {
            self.raft().change_membership(ChangeMembers::RemoveNodes(ids), false).await
        };
        res.map_err(|e| ClusterError::Unavailable(e.to_string()))?;
        tracing::info!(node_id, "node removed");
        Ok(())
    }

    /// Stops the Raft node.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft().shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}

/// A membership request about `node_id` without addresses, with a deadline.
fn node_request(node_id: NodeId, check_only: bool, fresh: bool, timeout: Duration) -> tonic::Request<JoinRequest> {
    let mut r = tonic::Request::new(JoinRequest {
        node_id,
        http_addr: String::new(),
        grpc_addr: String::new(),
        check_only,
        fresh,
    });
    r.set_timeout(timeout);
    r
}
