//! The replicated store of a computerd cluster: openraft over a sled-backed log and state
//! machine, reached through our own [`engine::KvEngine`] interface, with node-to-node RPC over
//! tonic.
//!
//! - [`engine`]: the storage interface and its sled implementation.
//! - [`store`]: openraft's log storage and state machine on top of the engine.
//! - [`sm`]: the application state machine: typed, versioned commands applied by pure functions.
//! - [`network`] / [`service`]: the tonic client (one channel per peer) and server.
//! - [`cluster`]: what the node uses: propose, linearizable read, join, leave.

#![warn(missing_docs)]

pub mod cluster;

/// The HTTP/2 receive windows of node-to-node gRPC (the same as an agent link's).
pub use computerd_proto::channel::CONNECTION_WINDOW;
pub use computerd_proto::channel::STREAM_WINDOW;

pub mod engine;
pub mod network;
pub mod service;
pub mod sm;
pub mod store;
pub mod tls;

use std::fmt;

use serde::Deserialize;
use serde::Serialize;

/// A cluster member's addresses, as stored in the Raft membership.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddr {
    /// The address of the HTTP API (`host:port`).
    pub http: String,
    /// The address of the node-to-node gRPC service (`host:port`).
    pub grpc: String,
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http={} grpc={}", self.http, self.grpc)
    }
}

/// A node's id in the cluster.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// The openraft type configuration of computerd.
    pub TypeConfig:
        D = sm::Request,
        R = sm::Response,
        NodeId = NodeId,
        Node = NodeAddr,
);

/// The Raft handle of a computerd node.
pub type Raft = openraft::Raft<TypeConfig, store::StateMachineStore>;

/// Short aliases of openraft types for [`TypeConfig`].
pub mod typ {
    use super::TypeConfig;
    /// A log id.
    pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
    /// A vote.
    pub type Vote = openraft::alias::VoteOf<TypeConfig>;
    /// A log entry.
    pub type Entry = openraft::alias::EntryOf<TypeConfig>;
    /// A snapshot's meta data.
    pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
    /// A snapshot with its bytes.
    pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, Vec<u8>>;
    /// The membership as stored with its log id.
    pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
}
