//! The node-to-node gRPC server: Raft RPCs, plus the calls a node forwards to the leader
//! (propose, read index, join, leave), and enrolling (certificates for joining and renewing
//! nodes, the CA's key for voters).
//!
//! Every call but `Enroll` arrives with a verified node certificate ([`crate::tls::RequireNode`]);
//! a Raft message is refused when the certificate's node is not the one the message speaks for
//! (a certificate of node 2 cannot vote or append as node 3).

use std::sync::Arc;

use computerd_proto::cluster::CaKey;
use computerd_proto::cluster::Empty;
use computerd_proto::cluster::EnrollReply;
use computerd_proto::cluster::EnrollRequest;
use computerd_proto::cluster::FetchSnapshotRequest;
use computerd_proto::cluster::JoinReply;
use computerd_proto::cluster::JoinRequest;
use computerd_proto::cluster::Payload;
use computerd_proto::cluster::SnapshotChunk;
use computerd_proto::cluster::cluster_service_server::ClusterService;
use computerd_proto::cluster::cluster_service_server::ClusterServiceServer;
use futures::StreamExt;
use tonic::Request;
use tonic::Status;
use tonic::Streaming;

use crate::NodeAddr;
use crate::NodeId;
use crate::cluster::Cluster;
use crate::cluster::ClusterError;
use crate::network::MAX_MESSAGE;
use crate::network::SNAPSHOT_CHUNK;
use crate::network::decode;
use crate::network::encode;
use crate::sm::Command;
use crate::sm::Response;
use crate::sm::hash_secret;
use crate::tls::PeerIdentity;
use crate::tls::Pki;
use crate::typ::Snapshot;
use crate::typ::SnapshotMeta;
use crate::typ::Vote;

/// The largest snapshot a node accepts.
const MAX_SNAPSHOT: usize = 1 << 30;

/// The tonic service of one node.
pub struct Service {
    cluster: Cluster,
    pki: Arc<Pki>,
}

impl Service {
    /// The service, ready to be added to a tonic server.
    pub fn server(cluster: Cluster, pki: Arc<Pki>) -> ClusterServiceServer<Service> {
        ClusterServiceServer::new(Service { cluster, pki })
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }
}

/// The node the caller's certificate names.
fn caller<T>(req: &Request<T>) -> Option<NodeId> {
    req.extensions().get::<PeerIdentity>().and_then(|p| p.node_id)
}

/// Refuses a message that speaks for another node than the caller's certificate names.
fn speaks_for(caller: Option<NodeId>, claimed: NodeId) -> Result<(), Status> {
    if caller == Some(claimed) {
        Ok(())
    } else {
        tracing::warn!(?caller, claimed, "a node message speaking for another node was refused");
        Err(Status::permission_denied(format!("a certificate of node {caller:?} cannot speak for node {claimed}")))
    }
}

fn bad_request(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("cannot decode the request: {e}"))
}

fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

fn cluster_status(e: ClusterError) -> Status {
    match e {
        ClusterError::Unavailable(m) => Status::unavailable(m),
        ClusterError::Invalid(m) => Status::invalid_argument(m),
        ClusterError::Fatal(m) => Status::internal(m),
    }
}

#[tonic::async_trait]
impl ClusterService for Service {
    async fn append_entries(&self, req: Request<Payload>) -> Result<tonic::Response<Payload>, Status> {
        self.cluster.check_accepting()?;
        let rpc: openraft::raft::AppendEntriesRequest<crate::TypeConfig> =
            decode(req.get_ref()).map_err(bad_request)?;
        speaks_for(caller(&req), rpc.vote.leader_id().node_id)?;
        let resp = self.cluster.raft().append_entries(rpc).await.map_err(internal)?;
        if resp.is_success() || resp.is_conflict() {
            self.cluster.note_leader_contact(); // not a deposed leader's: that one gets HigherVote
        }
        Ok(tonic::Response::new(encode(&resp).map_err(internal)?))
    }

    async fn vote(&self, req: Request<Payload>) -> Result<tonic::Response<Payload>, Status> {
        self.cluster.check_accepting()?;
        let rpc: openraft::raft::VoteRequest<crate::TypeConfig> = decode(req.get_ref()).map_err(bad_request)?;
        speaks_for(caller(&req), rpc.vote.leader_id().node_id)?;
        let resp = self.cluster.raft().vote(rpc).await.map_err(internal)?;
        Ok(tonic::Response::new(encode(&resp).map_err(internal)?))
    }

    async fn pre_vote(&self, req: Request<Payload>) -> Result<tonic::Response<Payload>, Status> {
        self.cluster.check_accepting()?;
        let rpc: openraft::raft::VoteRequest<crate::TypeConfig> = decode(req.get_ref()).map_err(bad_request)?;
        speaks_for(caller(&req), rpc.vote.leader_id().node_id)?;
        let resp = self.cluster.raft().pre_vote(rpc).await.map_err(internal)?;
        Ok(tonic::Response::new(encode(&resp).map_err(internal)?))
    }

    async fn install_snapshot(
        &self,
        req: Request<Streaming<SnapshotChunk>>,
    ) -> Result<tonic::Response<Payload>, Status> {
        self.cluster.check_accepting()?;
        let from = caller(&req);
        let mut stream = req.into_inner();
        let first = stream.next().await.ok_or_else(|| Status::invalid_argument("empty snapshot stream"))??;
        let (vote, meta): (Vote, SnapshotMeta) = serde_json::from_slice(&first.meta).map_err(bad_request)?;
        speaks_for(from, vote.leader_id().node_id)?;
        let mut data = first.data;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if data.len() + chunk.data.len() > MAX_SNAPSHOT {
                return Err(Status::resource_exhausted("snapshot too large"));
            }
            data.extend_from_slice(&chunk.data);
        }
        let resp = self
            .cluster
            .raft()
            .install_full_snapshot(vote, Snapshot { meta, snapshot: data })
            .await
            .map_err(internal)?;
        Ok(tonic::Response::new(encode(&resp).map_err(internal)?))
    }

    async fn propose(&self, req: Request<Payload>) -> Result<tonic::Response<Payload>, Status> {
        let request = decode(req.get_ref()).map_err(bad_request)?;
        let reply = self.cluster.propose_local(request).await.map_err(cluster_status)?;
        Ok(tonic::Response::new(encode(&reply).map_err(internal)?))
    }

    async fn read_index(&self, _req: Request<Empty>) -> Result<tonic::Response<Payload>, Status> {
        let reply = self.cluster.read_index_local().await.map_err(cluster_status)?;
        Ok(tonic::Response::new(encode(&reply).map_err(internal)?))
    }

    async fn join(&self, req: Request<JoinRequest>) -> Result<tonic::Response<JoinReply>, Status> {
        // A node joins as itself; a member may pass a join on to the leader.
        let from = caller(&req);
        let r = req.into_inner();
        if from != Some(r.node_id) && !from.is_some_and(|n| self.cluster.view().members.iter().any(|m| m.id == n)) {
            return speaks_for(from, r.node_id).map(|()| tonic::Response::new(JoinReply::default()));
        }
        if r.check_only {
            let cluster_id = self.cluster.cluster_id().await.map_err(cluster_status)?;
            if r.fresh {
                self.cluster.allow_revert(r.node_id).await.map_err(cluster_status)?;
            }
            return Ok(tonic::Response::new(JoinReply { cluster_id }));
        }
        let addr = NodeAddr { http: r.http_addr, grpc: r.grpc_addr };
        let cluster_id = self.cluster.join(r.node_id, addr).await.map_err(cluster_status)?;
        Ok(tonic::Response::new(JoinReply { cluster_id }))
    }

    async fn leave(&self, req: Request<JoinRequest>) -> Result<tonic::Response<Empty>, Status> {
        self.cluster.leave(req.into_inner().node_id).await.map_err(cluster_status)?;
        Ok(tonic::Response::new(Empty {}))
    }

    async fn enroll(&self, req: Request<EnrollRequest>) -> Result<tonic::Response<EnrollReply>, Status> {
        let from = caller(&req);
        let r = req.into_inner();
        if !self.pki.signs() {
            return Err(Status::unavailable("this node cannot sign certificates yet; enroll through another member"));
        }
        // The join secret is set with the bootstrap itself: until that applied, wait (retry).
        if self.cluster.state().read(|s| s.cluster_id.is_none()) {
            return Err(Status::unavailable("the cluster is not bootstrapped yet"));
        }
        if r.secret.is_empty() {
            // A renewal: the caller's own certificate is the proof.
            speaks_for(from, r.node_id)?;
        } else {
            let cmd = Command::RedeemJoinToken { hash: hash_secret(&r.secret), node_id: r.node_id, at_ms: now_ms() };
            match self.cluster.propose(crate::sm::Request::new(cmd)).await.map_err(cluster_status)? {
                Response::Rejected(why) => {
                    tracing::info!(node_id = r.node_id, "a join with a bad secret was refused");
                    return Err(Status::unauthenticated(why.message));
                }
                Response::Ok | Response::Id(_) => {}
            }
        }
        let cert_pem = self.pki.sign(r.node_id, &r.csr_pem).map_err(|e| Status::invalid_argument(e.to_string()))?;
        tracing::info!(node_id = r.node_id, renewal = r.secret.is_empty(), "signed a node certificate");
        Ok(tonic::Response::new(EnrollReply {
            cert_pem,
            ca_pem: self.pki.ca_pem().to_string(),
            cluster_id: self.pki.cluster_id().to_string(),
        }))
    }

    async fn fetch_ca_key(&self, req: Request<Empty>) -> Result<tonic::Response<CaKey>, Status> {
        let from = caller(&req);
        let voter = from.is_some_and(|n| self.cluster.view().members.iter().any(|m| m.id == n && m.voter));
        if !voter {
            return Err(Status::permission_denied("the CA's key goes to voters only"));
        }
        let pem = self.pki.ca_key_pem().ok_or_else(|| Status::unavailable("this node does not hold the CA's key"))?;
        tracing::info!(node_id = ?from, "handed the CA's key to a voter");
        Ok(tonic::Response::new(CaKey { pem }))
    }

    type FetchSnapshotStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<SnapshotChunk, Status>> + Send>>;

    async fn fetch_snapshot(
        &self,
        req: Request<FetchSnapshotRequest>,
    ) -> Result<tonic::Response<Self::FetchSnapshotStream>, Status> {
        let from = caller(&req);
        // The whole state goes out: to members only, as a leader's snapshot would.
        let member = from.is_some_and(|n| self.cluster.view().members.iter().any(|m| m.id == n));
        if !member {
            return Err(Status::permission_denied(format!("a snapshot goes to members only, not to node {from:?}")));
        }
        let min_index = req.get_ref().min_index;
        let snapshot = self.cluster.snapshot_reaching(min_index).await.map_err(cluster_status)?;
        tracing::warn!(node_id = ?from, snapshot = ?snapshot.meta.last_log_id, "handed this node's snapshot to a member rebuilding its store");
        let meta = serde_json::to_vec(&snapshot.meta).map_err(internal)?;
        let mut chunks = vec![Ok(SnapshotChunk { meta, data: Vec::new() })];
        chunks.extend(
            snapshot.snapshot.chunks(SNAPSHOT_CHUNK).map(|c| Ok(SnapshotChunk { meta: Vec::new(), data: c.to_vec() })),
        );
        Ok(tonic::Response::new(Box::pin(futures::stream::iter(chunks))))
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
