//! `computer-agent`: the program on every Computer. It dials the cluster over one WebSocket
//! (`/v1/agent/link`), proves itself with its machine credential, and then serves the node's
//! gRPC calls (sessions, files) over that link, multiplexed by HTTP/2.
//!
//! - [`pairing`]: trading a one-time pairing code for a machine credential, kept in the state dir.
//! - [`link`]: the link loop: dial, authenticate, serve, reconnect with jittered backoff.
//! - [`sessions`]: processes (with or without a PTY) and their bounded output buffers; they keep
//!   running and keep their output while the link is down.
//! - [`files`]: file and directory calls.
//! - [`service`]: the gRPC service, refusing any link generation but the current one.
//! - [`tls`]: `https`/`wss` with the server verified (system roots, or `--ca`); plain `http` only
//!   to loopback or with `--insecure`.

#![warn(missing_docs)]

pub mod files;
pub mod link;
pub mod mcp;
pub mod output;
pub mod pairing;
pub mod service;
pub mod sessions;
pub mod tls;
