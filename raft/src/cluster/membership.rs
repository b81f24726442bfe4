//! Membership changes through the leader: join (a learner first, a voter once caught up),
//! join through a given member, the one-time log revert of a wiped node, leave; the cluster id.

use std::time::Duration;

use computerd_proto::cluster::JoinRequest;
use openraft::ChangeMembers;
use openraft::errors::ClientWriteError;
use openraft::errors::RaftError;
use openraft::type_config::async_runtime::WatchReceiver;
use tokio::time::Instant;

use super::Cluster;
use super::ClusterError;
use super::JOIN_TIMEOUT;
use super::READ_TIMEOUT;
use crate::NodeAddr;
use crate::NodeId;

impl Cluster {
    /// Whether `node` is in this node's current membership: `None` when not, else whether it
    /// votes (the leader's view includes the changes it has appended).
    pub fn role_of(&self, node: NodeId) -> Option<bool> {
        let metrics = self.raft().metrics();
        let m = metrics.borrow_watched();
        let membership = m.membership_config.membership();
        membership.get_node(&node)?;
        Some(membership.voter_ids().any(|v| v == node))
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
        let reply = client.join(r).await.map_err(|s| {
            if crate::tls::is_foreign_peer(&s) {
                ClusterError::Invalid(format!(
                    "the member at {grpc_addr} is not of this node's cluster (its certificate is not signed by this \
                     cluster's CA)"
                ))
            } else {
                ClusterError::Unavailable(crate::tls::status_chain(&s))
            }
        })?;
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
    pub(super) fn client_of(
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
