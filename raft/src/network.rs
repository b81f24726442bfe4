//! The Raft network client: one reused tonic channel per peer, a deadline on every call.
//!
//! Every node-to-node connection (Raft, forwarding, routing, joins) starts from these channels,
//! so a node given a peer source address (`--peer-source-ip`) opens all of them from it.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use computerd_proto::cluster::Payload;
use computerd_proto::cluster::SnapshotChunk;
use computerd_proto::cluster::cluster_service_client::ClusterServiceClient;
use openraft::AnyError;
use openraft::RaftNetworkFactory;
use openraft::errors::NetworkError;
use openraft::errors::RPCError;
use openraft::errors::ReplicationClosed;
use openraft::errors::StreamingError;
use openraft::errors::Unreachable;
use openraft::network::RPCOption;
use openraft::network::v2::RaftNetworkV2;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::SnapshotResponse;
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;
use tonic::transport::Endpoint;

use crate::NodeAddr;
use crate::NodeId;
use crate::TypeConfig;
use crate::typ::Snapshot;
use crate::typ::Vote;

/// The size of one snapshot chunk on the wire.
pub(crate) const SNAPSHOT_CHUNK: usize = 1 << 20;
/// The largest message a node accepts (snapshots are chunked below this).
pub const MAX_MESSAGE: usize = 64 << 20;

/// Channels to peers, shared by the Raft network and the node's forwarding calls. Every one is
/// mutual TLS with the node's certificate ([`crate::tls`]).
#[derive(Clone)]
pub struct Channels {
    inner: Arc<Mutex<HashMap<String, Channel>>>,
    /// Dials peers: from the node's source address, then TLS.
    connector: crate::tls::Connector,
}

impl Channels {
    /// Channels over TLS with `config`, whose connections start from `source` (`None`: the
    /// kernel chooses).
    pub fn new(config: Arc<rustls::ClientConfig>, source: Option<IpAddr>) -> Self {
        Self { inner: Default::default(), connector: crate::tls::Connector::new(config, source) }
    }

    /// The channel to `addr` (`host:port`), created lazily once and reused; it reconnects by itself.
    pub fn get(&self, addr: &str) -> Result<ClusterServiceClient<Channel>, tonic::transport::Error> {
        Ok(ClusterServiceClient::new(self.channel(addr)?)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE))
    }

    /// The raw channel to `addr`, for other services on the same peer (routing).
    pub fn channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let channel = match map.get(addr) {
            Some(c) => c.clone(),
            None => {
                let c = endpoint(addr)?.connect_with_connector_lazy(self.connector.clone());
                map.insert(addr.to_string(), c.clone());
                c
            }
        };
        Ok(channel)
    }
}

/// The settings of every channel to a peer: a short connect timeout, HTTP/2 keep-alive.
fn endpoint(addr: &str) -> Result<Endpoint, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        // Streams carry bulk data (snapshots, file calls, tunnels): HTTP/2's default window
        // (64 KiB) would stop a 64 KiB answer for a window update on every hop.
        .initial_stream_window_size(crate::STREAM_WINDOW)
        .initial_connection_window_size(crate::CONNECTION_WINDOW))
}

/// A channel to `addr` that is not kept: an enrolling node's one call, with its own TLS config.
pub fn one_off_channel(addr: &str, config: Arc<rustls::ClientConfig>) -> Result<Channel, tonic::transport::Error> {
    Ok(endpoint(addr)?.connect_with_connector_lazy(crate::tls::Connector::new(config, None)))
}

/// Creates a [`PeerClient`] per target for openraft.
#[derive(Clone)]
pub struct NetworkFactory {
    channels: Channels,
}

impl NetworkFactory {
    /// A factory over the node's shared channels.
    pub fn new(channels: Channels) -> Self {
        Self { channels }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddr) -> PeerClient {
        PeerClient { target, addr: node.grpc.clone(), channels: self.channels.clone() }
    }
}

/// The Raft RPCs to one peer.
pub struct PeerClient {
    target: NodeId,
    addr: String,
    channels: Channels,
}

/// Encodes a message as the JSON payload of the wire protocol.
pub fn encode<T: Serialize>(v: &T) -> Result<Payload, serde_json::Error> {
    Ok(Payload { data: serde_json::to_vec(v)? })
}

/// Decodes a JSON payload.
pub fn decode<T: DeserializeOwned>(p: &Payload) -> Result<T, serde_json::Error> {
    serde_json::from_slice(&p.data)
}

fn status_to_rpc(target: NodeId, s: tonic::Status) -> RPCError<TypeConfig> {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            tracing::debug!(target, code = ?s.code(), "peer unreachable");
            RPCError::Unreachable(Unreachable::new(&s))
        }
        _ => RPCError::Network(NetworkError::new(&s)),
    }
}

fn bad_data(e: impl std::error::Error + 'static) -> RPCError<TypeConfig> {
    RPCError::Network(NetworkError::new(&e))
}

impl PeerClient {
    fn client(&self) -> Result<ClusterServiceClient<Channel>, RPCError<TypeConfig>> {
        self.channels.get(&self.addr).map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))
    }

    fn request<T>(msg: T, ttl: Duration) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(ttl);
        req
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let payload = encode(&rpc).map_err(bad_data)?;
        let resp = self
            .client()?
            .append_entries(Self::request(payload, option.hard_ttl()))
            .await
            .map_err(|s| status_to_rpc(self.target, s))?;
        decode(resp.get_ref()).map_err(bad_data)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let payload = encode(&rpc).map_err(bad_data)?;
        let resp = self
            .client()?
            .vote(Self::request(payload, option.hard_ttl()))
            .await
            .map_err(|s| status_to_rpc(self.target, s))?;
        decode(resp.get_ref()).map_err(bad_data)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let payload = encode(&rpc).map_err(bad_data)?;
        let resp = self
            .client()?
            .pre_vote(Self::request(payload, option.hard_ttl()))
            .await
            .map_err(|s| status_to_rpc(self.target, s))?;
        decode(resp.get_ref()).map_err(bad_data)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let meta =
            serde_json::to_vec(&(&vote, &snapshot.meta)).map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        let mut chunks = vec![SnapshotChunk { meta, data: Vec::new() }];
        chunks.extend(
            snapshot.snapshot.chunks(SNAPSHOT_CHUNK).map(|c| SnapshotChunk { meta: Vec::new(), data: c.to_vec() }),
        );
        let mut client = self.client().map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        // A snapshot may be large: allow it several heartbeats' worth of time.
        let ttl = option.hard_ttl().max(Duration::from_secs(30));
        let resp = client.install_snapshot(Self::request(futures::stream::iter(chunks), ttl)).await.map_err(|s| {
            match status_to_rpc(self.target, s) {
                RPCError::Unreachable(u) => StreamingError::Unreachable(u),
                RPCError::Network(n) => StreamingError::Network(n),
                other => StreamingError::Network(NetworkError::new(&AnyError::error(other.to_string()))),
            }
        })?;
        decode(resp.get_ref()).map_err(|e| StreamingError::Network(NetworkError::new(&e)))
    }
}
