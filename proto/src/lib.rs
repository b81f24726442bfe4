//! Wire types shared by computerd nodes: the node-to-node gRPC protocol and the error kinds
//! that every API surface (HTTP and gRPC) maps to a status.

#![warn(missing_docs)]

pub mod browser;
pub mod channel;
pub mod deadline;
pub mod desktop;
pub mod durable;
pub mod egress;
mod error;
pub mod mcp;
pub mod mux;

pub use error::ERROR_KIND;
pub use error::ErrorKind;

/// The metadata naming the owner (the node holding the Computer's link) in a
/// [`ErrorKind::NotOwner`] answer.
pub const OWNER: &str = "x-computerd-owner";
/// The header that once marked an HTTP call a node routed to the owner. A routed call is now
/// marked by the node that takes it (a request extension); the HTTP edge drops this header from
/// every client, so none can claim that its call was routed.
pub const FORWARDED: &str = "x-computerd-forwarded";

/// The version of the link protocol (the hello, the frames of [`mux`], the agent's service, the
/// statuses' kinds) that this build speaks. A node refuses an agent that speaks another one; an
/// agent that states none is from before versions (1). 3: session and file calls name the
/// account they run as (an older agent would run them all as itself).
pub const LINK_PROTOCOL: u32 = 3;

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
