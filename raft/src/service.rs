//! The node-to-node gRPC server: Raft RPCs, plus the calls a node forwards to the leader
//! (propose, read index, join, leave), and enrolling (certificates for joining and renewing
//! nodes, the CA's key for voters).
//!
//! Every call but `Enroll` arrives with a verified node certificate ([`crate::tls::RequireNode`]);
//! a Raft message is refused when the certificate's node is not the one the message speaks for
//! (a certificate of node 2 cannot vote or append as node 3). A certificate alone is not
//! membership: `Propose`, `Leave` and `FetchCaKey` answer voters only, `ReadIndex` and
//! `FetchSnapshot` members only (a node that enrolled but never joined, or was removed, gets
//! `PERMISSION_DENIED`).
//!
//! Enrolling with a join secret: at most [`ENROLL_BURST`] calls at once per source address (an
//! IPv6 /64 counts as one source), then one per [`ENROLL_REFILL`]; the secret's hash is checked
//! against this replica before anything is proposed (after a read barrier when this replica does
//! not know it, since it may be newer than what it applied), so a wrong secret writes nothing to
//! the log. A removed node id is refused (here and when the secret is redeemed in the log); a
//! live member's id only with a single-use secret minted for that id.

use std::net::IpAddr;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

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
use governor::DefaultKeyedRateLimiter;
use governor::Quota;
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
use crate::sm::JoinSecretKind;
use crate::sm::RejectKind;
use crate::sm::Response;
use crate::sm::hash_secret;
use crate::tls::PeerIdentity;
use crate::tls::Pki;
use crate::typ::Snapshot;
use crate::typ::SnapshotMeta;
use crate::typ::Vote;

/// The largest snapshot a node accepts.
const MAX_SNAPSHOT: usize = 1 << 30;

/// Enrolments with a join secret one source may send at once.
pub const ENROLL_BURST: u32 = 20;
/// After a burst, one more enrolment per source this often.
pub const ENROLL_REFILL: Duration = Duration::from_secs(3);
/// Past this many sources, the limiter forgets those back to a full allowance.
const ENROLL_SOURCES: usize = 4096;

/// The tonic service of one node.
pub struct Service {
    cluster: Cluster,
    pki: Arc<Pki>,
    /// Enrolments with a join secret, per source (see the module doc).
    enroll_limit: DefaultKeyedRateLimiter<IpAddr>,
}

impl Service {
    /// The service, ready to be added to a tonic server.
    pub fn server(cluster: Cluster, pki: Arc<Pki>) -> ClusterServiceServer<Service> {
        let burst = NonZeroU32::new(ENROLL_BURST).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(ENROLL_REFILL).unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN));
        let enroll_limit = DefaultKeyedRateLimiter::keyed(quota.allow_burst(burst));
        ClusterServiceServer::new(Service { cluster, pki, enroll_limit })
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// Whether `node` is in this node's current membership: `None` when not, else whether it
    /// votes (the leader's view includes the changes it has appended).
    fn role_of(&self, node: NodeId) -> Option<bool> {
        self.cluster.role_of(node)
    }

    /// Refuses a caller whose certificate does not name a voter.
    fn require_voter(&self, from: Option<NodeId>, what: &str) -> Result<(), Status> {
        match from.and_then(|n| self.role_of(n)) {
            Some(true) => Ok(()),
            _ => {
                tracing::warn!(caller = ?from, "{what} from a node that is not a voter was refused");
                Err(Status::permission_denied(format!("{what} is for voters only; node {from:?} is not one")))
            }
        }
    }

    /// Refuses a caller whose certificate does not name a member (voter or learner).
    fn require_member(&self, from: Option<NodeId>, what: &str) -> Result<(), Status> {
        if from.and_then(|n| self.role_of(n)).is_some() {
            return Ok(());
        }
        tracing::warn!(caller = ?from, "{what} from a node that is not a member was refused");
        Err(Status::permission_denied(format!("{what} is for members only; node {from:?} is not one")))
    }

    /// Counts an enrolment with a secret against its source.
    fn limit_enroll(&self, source: Option<SocketAddr>) -> Result<(), Status> {
        let Some(source) = source else { return Ok(()) };
        let key = source_key(source.ip());
        if self.enroll_limit.check_key(&key).is_err() {
            tracing::warn!(source = %key, "an enrolment over the per-source limit was refused");
            return Err(Status::resource_exhausted("too many enrolments from this address; retry later"));
        }
        if self.enroll_limit.len() > ENROLL_SOURCES {
            self.enroll_limit.retain_recent();
        }
        Ok(())
    }

    /// What the secret with `hash` is on this replica.
    fn secret_kind(&self, hash: &str) -> JoinSecretKind {
        let now = now_ms();
        self.cluster.state().read(|s| s.join.kind_of(hash, now))
    }

    /// Refuses enrolling as `node_id` with a secret of `kind`: a removed id, a live member's id
    /// (unless the secret was minted for it), another id than the secret's.
    fn check_enroll_id(&self, kind: JoinSecretKind, node_id: NodeId) -> Result<(), Status> {
        if self.cluster.state().read(|s| s.join.removed(node_id)) {
            tracing::warn!(node_id, "an enrolment as a removed node was refused");
            return Err(Status::permission_denied(format!(
                "node {node_id} was removed from the cluster, and a removed node id never joins again: give this \
                 node a new id"
            )));
        }
        match kind {
            JoinSecretKind::SingleUse(Some(id)) if id == node_id => Ok(()),
            JoinSecretKind::SingleUse(Some(id)) => Err(Status::permission_denied(format!(
                "this single-use join secret is for node {id}, not node {node_id}"
            ))),
            _ if self.role_of(node_id).is_some() => {
                tracing::warn!(node_id, "an enrolment as a live member was refused");
                Err(Status::permission_denied(format!(
                    "node {node_id} is a member of the cluster: a member whose certificate was lost enrols again only \
                     with a single-use join secret minted for its id (POST /v1/cluster/join-tokens with ttlSecs and \
                     nodeId {node_id})"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Redeems the join secret of an enrolment (see the module doc for the checks).
    async fn redeem(&self, source: Option<SocketAddr>, r: &EnrollRequest) -> Result<(), Status> {
        self.limit_enroll(source)?;
        let hash = hash_secret(&r.secret);
        let mut kind = self.secret_kind(&hash);
        if kind == JoinSecretKind::Unknown {
            // A single-use secret minted a moment ago may not be applied here yet.
            self.cluster.read_barrier().await.map_err(cluster_status)?;
            kind = self.secret_kind(&hash);
        }
        if kind == JoinSecretKind::Unknown {
            tracing::info!(node_id = r.node_id, "a join with a bad secret was refused");
            return Err(Status::unauthenticated("the join secret is not valid (wrong, used or expired)"));
        }
        self.check_enroll_id(kind, r.node_id)?;
        let cmd = Command::RedeemJoinToken { hash, node_id: r.node_id, at_ms: now_ms() };
        match self.cluster.propose(crate::sm::Request::new(cmd)).await.map_err(cluster_status)? {
            Response::Rejected(why) => {
                tracing::info!(node_id = r.node_id, reason = %why.message, "a join was refused");
                return Err(match why.kind {
                    RejectKind::Unauthorized => Status::unauthenticated(why.message),
                    RejectKind::Forbidden => Status::permission_denied(why.message),
                    _ => Status::failed_precondition(why.message),
                });
            }
            Response::Ok | Response::Id(_) => {}
        }
        // This node has applied the redeem, and every membership change before it: a member's id
        // that joined meanwhile is refused still.
        self.check_enroll_id(kind, r.node_id)
    }
}

/// The key a source counts against (enrolments here, the HTTP edge's unauthenticated calls): an
/// IPv4 address as it is (an IPv4-mapped IPv6 address as its IPv4), an IPv6 address as its /64
/// (one host is routinely given a whole /64).
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut seg = v6.segments();
                seg[4..].fill(0);
                IpAddr::V6(std::net::Ipv6Addr::from(seg))
            }
        },
        v4 => v4,
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
        self.require_voter(caller(&req), "proposing")?;
        let request = decode(req.get_ref()).map_err(bad_request)?;
        let reply = self.cluster.propose_local(request).await.map_err(cluster_status)?;
        Ok(tonic::Response::new(encode(&reply).map_err(internal)?))
    }

    async fn read_index(&self, req: Request<Empty>) -> Result<tonic::Response<Payload>, Status> {
        self.require_member(caller(&req), "a read index")?;
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
        // A removed node id never joins again (its certificate may still work for a moment while
        // its removal completes).
        if self.cluster.state().read(|s| s.join.removed(r.node_id)) {
            tracing::warn!(node_id = r.node_id, "a join of a removed node was refused");
            return Err(Status::permission_denied(format!(
                "node {} was removed from the cluster, and a removed node id never joins again",
                r.node_id
            )));
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
        self.require_voter(caller(&req), "removing a node")?;
        self.cluster.leave(req.into_inner().node_id).await.map_err(cluster_status)?;
        Ok(tonic::Response::new(Empty {}))
    }

    async fn enroll(&self, req: Request<EnrollRequest>) -> Result<tonic::Response<EnrollReply>, Status> {
        let from = caller(&req);
        let source = req.extensions().get::<PeerIdentity>().and_then(|p| p.addr);
        let r = req.into_inner();
        if !self.pki.signs() {
            return Err(Status::unavailable("this node cannot sign certificates yet; enroll through another member"));
        }
        // The join secret is set with the bootstrap itself: until that applied, wait (retry).
        if self.cluster.state().read(|s| s.cluster_id.is_none()) {
            return Err(Status::unavailable("the cluster is not bootstrapped yet"));
        }
        if r.secret.is_empty() {
            // A renewal: the caller's own certificate is the proof, and it must still be a member
            // (a removed node whose revocation has not reached this node yet gets nothing newer).
            speaks_for(from, r.node_id)?;
            if self.cluster.state().read(|s| s.join.removed(r.node_id)) {
                return Err(Status::permission_denied(format!("node {} was removed from the cluster", r.node_id)));
            }
            self.require_member(from, "renewing a certificate")?;
        } else {
            self.redeem(source, &r).await?;
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
