//! The leader this node knows and the calls it serves for every node: a write (`propose`) and
//! a quorum-confirmed read index (`read_barrier`), forwarded over gRPC from a follower.

use computerd_proto::cluster::Empty;
use computerd_proto::cluster::cluster_service_client::ClusterServiceClient;
use openraft::ReadPolicy;
use openraft::errors::ClientWriteError;
use openraft::errors::RaftError;
use openraft::type_config::async_runtime::WatchReceiver;
use serde::Deserialize;
use serde::Serialize;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::Cluster;
use super::ClusterError;
use super::READ_TIMEOUT;
use super::RETRY_PAUSE;
use super::WRITE_TIMEOUT;
use crate::NodeAddr;
use crate::NodeId;
use crate::network::decode;
use crate::network::encode;
use crate::sm::Request;
use crate::sm::Response;

/// The answer of a proposal forwarded to a node that may no longer lead.
#[derive(Debug, Serialize, Deserialize)]
pub enum ProposeReply {
    /// Applied at the leader; the state machine's response and the entry's log index.
    Applied(Response, u64),
    /// This node does not lead; the leader it knows, if any.
    NotLeader(Option<(NodeId, NodeAddr)>),
}

/// The answer of a read-index request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ReadIndexReply {
    /// Confirmed by a quorum: a read is current once this index is applied.
    Index(Option<u64>),
    /// This node does not lead; the leader it knows, if any.
    NotLeader(Option<(NodeId, NodeAddr)>),
}

/// Where the leader is, for one attempt of a call it must serve.
enum Leader {
    /// This node leads.
    Here,
    /// Another node leads: its id and gRPC client.
    At(NodeId, ClusterServiceClient<Channel>),
}

/// What one attempt at the leader came to.
enum Attempt<T> {
    /// The leader answered.
    Answered(T),
    /// The node asked does not lead (any more): ask the leader again after a pause.
    NotLeader,
    /// A forwarded call failed (it may still have applied): send it again after a pause.
    Lost(tonic::Status),
}

impl Cluster {
    /// The leader this node knows, with its addresses.
    pub fn leader(&self) -> Option<(NodeId, NodeAddr)> {
        let m = self.raft().metrics().borrow_watched().clone();
        let id = m.current_leader?;
        let addr = m.membership_config.membership().get_node(&id)?.clone();
        Some((id, addr))
    }

    pub(super) async fn wait_for_leader(&self, deadline: Instant) -> Result<(), ClusterError> {
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

    /// Sends `call` to the leader until it answers or `deadline` passes: the one retry loop of
    /// [`Cluster::propose`] and [`Cluster::read_barrier`]. With no leader known it waits for one;
    /// when the node asked does not lead, or a forwarded call fails (its answer may be lost after
    /// it applied), it pauses and asks the leader again; a forward is dropped as soon as this node
    /// sees another leader, since the old one may never answer. Only for calls that may run twice:
    /// every command is idempotent, and a read index changes nothing. `what` names the call in
    /// logs; `late` is the message of the error at the deadline.
    async fn retry_on_leader<T, F, Fut>(
        &self,
        deadline: Instant,
        what: &str,
        late: &str,
        mut call: F,
    ) -> Result<T, ClusterError>
    where
        F: FnMut(Leader) -> Fut,
        Fut: Future<Output = Result<Attempt<T>, ClusterError>>,
    {
        loop {
            if Instant::now() >= deadline {
                return Err(ClusterError::Unavailable(late.into()));
            }
            let Some((leader, addr)) = self.leader() else {
                self.wait_for_leader(deadline).await?;
                continue;
            };
            let attempt = if leader == self.id() {
                call(Leader::Here).await?
            } else {
                let client = self.channels().get(&addr.grpc).map_err(|e| ClusterError::Invalid(e.to_string()))?;
                // A leader that stops answering (stopped, cut off) is replaced after the election
                // timeout: then send to the new one rather than wait out the whole deadline.
                tokio::select! {
                    a = call(Leader::At(leader, client)) => a?,
                    () = self.leader_moved_from(leader) => {
                        tracing::debug!(leader, "the leader changed during a {what}; retrying");
                        continue;
                    }
                }
            };
            match attempt {
                Attempt::Answered(answer) => return Ok(answer),
                Attempt::NotLeader => tokio::time::sleep(RETRY_PAUSE).await,
                Attempt::Lost(status) => {
                    // The answer may be lost after the call applied; commands are idempotent
                    // (and a read index changes nothing), so sending it again is safe.
                    tracing::debug!(leader, %status, "{what} failed; retrying");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }

    /// Proposes a command and waits until it is applied; any node may call it.
    pub async fn propose(&self, req: Request) -> Result<Response, ClusterError> {
        if self.is_stopping() {
            return Err(ClusterError::Unavailable("the node is stopping".into()));
        }
        // Checked here first too: a leader of an older build could not even read the command.
        if let Some(refused) = self.version_gate(&req) {
            return Ok(refused);
        }
        let deadline = Instant::now() + WRITE_TIMEOUT;
        let payload = encode(&req).map_err(|e| ClusterError::Invalid(e.to_string()))?;
        let (req, payload) = (&req, &payload);
        let late = "no leader accepted the write in time";
        let answered = self
            .retry_on_leader(deadline, "forwarded write", late, move |leader| async move {
                let reply = match leader {
                    // A leader cut off from its quorum commits nothing, and may not learn that it was
                    // deposed until the partition heals: give up at the deadline too (the write may
                    // still apply, as after a lost forward).
                    Leader::Here => match tokio::time::timeout_at(deadline, self.propose_local(req.clone())).await {
                        Ok(reply) => reply?,
                        Err(_) => return Err(ClusterError::Unavailable("the write was not committed in time".into())),
                    },
                    Leader::At(_, mut client) => {
                        let mut r = tonic::Request::new(payload.clone());
                        r.set_timeout(deadline.saturating_duration_since(Instant::now()));
                        match client.propose(r).await {
                            Ok(resp) => decode(resp.get_ref()).map_err(|e| ClusterError::Fatal(e.to_string()))?,
                            Err(status) => return Ok(Attempt::Lost(status)),
                        }
                    }
                };
                Ok(match reply {
                    ProposeReply::Applied(r, index) => Attempt::Answered((r, index)),
                    ProposeReply::NotLeader(_) => Attempt::NotLeader,
                })
            })
            .await?;
        let (response, index) = answered;
        // Read your writes on every node: the caller reads this node's state next (the record it
        // just changed), so a write forwarded to the leader answers once it is applied here too.
        // The leader sends the commit on at once; a node cut off from it since then answers at
        // the deadline anyway, since the write did apply.
        let left = deadline.saturating_duration_since(Instant::now());
        if let Err(e) = self.raft().wait(Some(left)).applied_index_at_least(Some(index), "a forwarded write").await {
            tracing::warn!(index, error = %e, "a forwarded write applied at the leader is not yet applied here");
        }
        Ok(response)
    }

    /// The stamp of an entry this node appends now: its wall clock, but never below a stamp it
    /// gave before, nor below the cluster's clock as applied here (a new leader whose clock lags
    /// the old one's does not move time back).
    pub fn stamp(&self, wall_ms: u64) -> u64 {
        next_stamp(&self.inner.last_stamp, wall_ms, self.state().read(|s| s.clock))
    }

    /// The version gate (`sm::versions`): a command of a later store version waits until every
    /// member speaks it, as this node knows the membership and the members' versions. Answers
    /// the refusal (nothing is appended), or `None` to go on.
    fn version_gate(&self, req: &Request) -> Option<Response> {
        let since = req.command().since();
        if since <= 1 {
            return None;
        }
        let members: Vec<u64> = self.view().members.iter().map(|m| m.id).collect();
        let behind = self.state().read(|s| s.behind(members, since));
        if behind.is_empty() {
            return None;
        }
        let why = format!(
            "store version {since} is not spoken by every node yet (nodes {behind:?} run an older build): finish the upgrade first"
        );
        Some(Response::Rejected(crate::sm::Reject::new(crate::sm::RejectKind::Conflict, why)))
    }

    /// Proposes on this node only; answers [`ProposeReply::NotLeader`] when it does not lead.
    /// The entry carries this node's stamp ([`Cluster::stamp`]), whatever stamp it came with: the
    /// state machine reads time from the leader's stamps only.
    pub async fn propose_local(&self, req: Request) -> Result<ProposeReply, ClusterError> {
        if let Some(refused) = self.version_gate(&req) {
            return Ok(ProposeReply::Applied(refused, 0));
        }
        let req = req.stamped(self.stamp(wall_ms()));
        match self.raft().client_write(req).await {
            Ok(resp) => Ok(ProposeReply::Applied(resp.data, resp.log_id.index())),
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
    ///
    /// Reads waiting at the same moment share one confirmation: on a follower, one forwarded
    /// read-index call to the leader; on the leader, one quorum round (`coalesce.rs`, which
    /// answers a read only from a round begun after the read arrived).
    pub async fn read_barrier(&self) -> Result<(), ClusterError> {
        let deadline = Instant::now() + READ_TIMEOUT;
        let late = "no quorum confirmed the read in time";
        let index = self
            .retry_on_leader(deadline, "read index", late, move |leader| async move {
                let reply = match leader {
                    Leader::Here => match tokio::time::timeout_at(deadline, self.read_index_local()).await {
                        Ok(reply) => reply?,
                        Err(_) => return Err(ClusterError::Unavailable(late.into())),
                    },
                    Leader::At(id, client) => match self.forwarded_read_index(id, client, deadline).await {
                        Ok(reply) => reply,
                        Err(status) => return Ok(Attempt::Lost(status)),
                    },
                };
                Ok(match reply {
                    ReadIndexReply::Index(index) => Attempt::Answered(index),
                    ReadIndexReply::NotLeader(_) => Attempt::NotLeader,
                })
            })
            .await?;
        let left = deadline.saturating_duration_since(Instant::now());
        self.raft()
            .wait(Some(left))
            .applied_index_at_least(index, "read barrier")
            .await
            .map(|_| ())
            .map_err(|e| ClusterError::Unavailable(format!("not caught up: {e}")))
    }

    /// One read-index call forwarded to the leader `id`, shared by every read of this node
    /// waiting for one when it is sent. The call is bounded by [`READ_TIMEOUT`], this read's
    /// wait by its `deadline`.
    async fn forwarded_read_index(
        &self,
        id: NodeId,
        client: ClusterServiceClient<Channel>,
        deadline: Instant,
    ) -> Result<ReadIndexReply, tonic::Status> {
        let round = move || {
            let mut client = client.clone();
            async move {
                let mut r = tonic::Request::new(Empty {});
                r.set_timeout(READ_TIMEOUT);
                let resp = client.read_index(r).await?;
                decode(resp.get_ref()).map_err(|e| tonic::Status::internal(e.to_string()))
            }
        };
        match tokio::time::timeout_at(deadline, self.inner.forwarded_reads.join(id, round)).await {
            Ok(Some(reply)) => reply,
            Ok(None) => Err(tonic::Status::unavailable("the read-index round was dropped")),
            Err(_) => Err(tonic::Status::deadline_exceeded("no read index from the leader in time")),
        }
    }

    /// On the leader: a quorum-confirmed read index, one quorum round for every read (local or
    /// forwarded) waiting when the round begins.
    pub async fn read_index_local(&self) -> Result<ReadIndexReply, ClusterError> {
        let raft = self.raft().clone();
        let round = move || {
            let raft = raft.clone();
            async move { read_index_round(&raft).await }
        };
        match self.inner.leader_reads.join((), round).await {
            Some(Ok(reply)) => Ok(reply),
            Some(Err(RoundError::Unavailable(e))) => Err(ClusterError::Unavailable(e)),
            Some(Err(RoundError::Fatal(e))) => Err(ClusterError::Fatal(e)),
            None => Err(ClusterError::Unavailable("the read-index round was dropped".into())),
        }
    }
}

/// Why a leader's read-index round failed (shared by every read of the round, hence `Clone`).
#[derive(Debug, Clone)]
pub(super) enum RoundError {
    /// No quorum in time, or the read was refused.
    Unavailable(String),
    /// Raft stopped.
    Fatal(String),
}

/// One quorum confirmation of this node's leadership, with the index a read must wait for.
async fn read_index_round(raft: &crate::Raft) -> Result<ReadIndexReply, RoundError> {
    let fut = raft.get_read_log_id(ReadPolicy::ReadIndex);
    match tokio::time::timeout(READ_TIMEOUT, fut).await {
        Err(_) => Err(RoundError::Unavailable("no quorum confirmed the read in time".into())),
        Ok(Ok((read_log_id, _applied))) => Ok(ReadIndexReply::Index(Some(read_log_id.log_id().index))),
        Ok(Err(RaftError::APIError(openraft::errors::LinearizableReadError::ForwardToLeader(f)))) => {
            Ok(ReadIndexReply::NotLeader(f.leader_id.zip(f.leader_node)))
        }
        Ok(Err(RaftError::APIError(e))) => Err(RoundError::Unavailable(e.to_string())),
        Ok(Err(RaftError::Fatal(e))) => Err(RoundError::Fatal(e.to_string())),
    }
}

/// The next stamp after `last` (which it advances) at wall clock `wall_ms`, with `clock` the
/// cluster's clock applied here: the greatest of the three, so stamps never go backwards.
fn next_stamp(last: &std::sync::atomic::AtomicU64, wall_ms: u64, clock: u64) -> u64 {
    let floor = wall_ms.max(clock);
    last.fetch_max(floor, std::sync::atomic::Ordering::SeqCst).max(floor)
}

/// This node's wall clock, unix ms.
fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn stamps_never_go_backwards() {
        let last = AtomicU64::new(0);
        assert_eq!(next_stamp(&last, 1_000, 0), 1_000);
        assert_eq!(next_stamp(&last, 900, 0), 1_000, "the wall clock stepped back: the stamp holds");
        assert_eq!(next_stamp(&last, 1_200, 0), 1_200);
        // A new leader whose clock lags the stamps it applied starts from them.
        let fresh = AtomicU64::new(0);
        assert_eq!(next_stamp(&fresh, 500, 1_200), 1_200);
        assert_eq!(next_stamp(&fresh, 600, 0), 1_200);
        let mut seen = 0;
        for wall in [5, 3_000, 2_000, 2_999, 3_001, 10] {
            let s = next_stamp(&last, wall, 0);
            assert!(s >= seen, "{s} after {seen}");
            seen = s;
        }
        assert_eq!(seen, 3_001);
    }
}
