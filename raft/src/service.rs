//! The node-to-node gRPC server: Raft RPCs, plus the calls a node forwards to the leader
//! (propose, read index, join, leave).

use computerd_proto::cluster::Empty;
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
use crate::cluster::Cluster;
use crate::cluster::ClusterError;
use crate::network::MAX_MESSAGE;
use crate::network::decode;
use crate::network::encode;
use crate::typ::Snapshot;
use crate::typ::SnapshotMeta;
use crate::typ::Vote;

/// The largest snapshot a node accepts.
const MAX_SNAPSHOT: usize = 1 << 30;

/// The tonic service of one node.
pub struct Service {
    cluster: Cluster,
}

impl Service {
    /// The service, ready to be added to a tonic server.
    pub fn server(cluster: Cluster) -> ClusterServiceServer<Service> {
        ClusterServiceServer::new(Service { cluster })
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
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
        let rpc = decode(req.get_ref()).map_err(bad_request)?;
        let resp = self.cluster.raft().append_entries(rpc).await.map_err(internal)?;
        if resp.is_success() || resp.is_conflict() {
            self.cluster.note_leader_contact(); // not a deposed leader's: that one gets HigherVote
        }
        Ok(tonic::Response::new(encode(&resp).map_err(internal)?))
    }

    async fn vote(&self, req: Request<Payload>) -> Result<tonic::Response<Payload>, Status> {
        self.cluster.check_accepting()?;
        let rpc = decode(req.get_ref()).map_err(bad_request)?;
        let resp = self.cluster.raft().vote(rpc).await.map_err(internal)?;
        Ok(tonic::Response::new(encode(&resp).map_err(internal)?))
    }

    async fn pre_vote(&self, req: Request<Payload>) -> Result<tonic::Response<Payload>, Status> {
        self.cluster.check_accepting()?;
        let rpc = decode(req.get_ref()).map_err(bad_request)?;
        let resp = self.cluster.raft().pre_vote(rpc).await.map_err(internal)?;
        Ok(tonic::Response::new(encode(&resp).map_err(internal)?))
    }

    async fn install_snapshot(
        &self,
        req: Request<Streaming<SnapshotChunk>>,
    ) -> Result<tonic::Response<Payload>, Status> {
        self.cluster.check_accepting()?;
        let mut stream = req.into_inner();
        let first = stream.next().await.ok_or_else(|| Status::invalid_argument("empty snapshot stream"))??;
        let (vote, meta): (Vote, SnapshotMeta) = serde_json::from_slice(&first.meta).map_err(bad_request)?;
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
        let r = req.into_inner();
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
}
