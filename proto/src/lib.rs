//! Wire types shared by computerd nodes: the node-to-node gRPC protocol and the error kinds
//! that every API surface (HTTP and gRPC) maps to a status.

#![warn(missing_docs)]

pub mod channel;
mod error;
pub mod mux;

pub use error::ErrorKind;

/// The metadata key carrying the link generation on every node → agent request.
pub const LINK_GENERATION: &str = "x-link-generation";

/// Generated code of `proto/agent.proto`.
#[allow(missing_docs, clippy::all)]
pub mod agent {
    tonic::include_proto!("computerd.agent.v1");
}

/// Generated code of `proto/cluster.proto`.
#[allow(missing_docs, clippy::all)]
pub mod cluster {
    tonic::include_proto!("computerd.cluster.v1");
}
