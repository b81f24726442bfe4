//! The leader this node knows and the calls it serves for every node: a write (`propose`) and
//! a quorum-confirmed read index (`read_barrier`), forwarded over gRPC from a follower.

use computerd_proto::cluster::Empty;
use openraft::ReadPolicy;
use openraft::errors::ClientWriteError;
use openraft::errors::RaftError;
use openraft::type_config::async_runtime::WatchReceiver;
use serde::Deserialize;
use serde::Serialize;
use tokio::time::Instant;

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
}
