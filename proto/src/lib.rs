//! Wire types shared by computerd nodes: the node-to-node gRPC protocol and the error kinds
//! that every API surface (HTTP and gRPC) maps to a status.

#![warn(missing_docs)]

mod error;

pub use error::ErrorKind;

/// Generated code of `proto/cluster.proto`.
#[allow(missing_docs, clippy::all)]
pub mod cluster {
    tonic::include_proto!("computerd.cluster.v1");
}
