//! `computer-agent`: the program on every Computer. It dials the cluster over one WebSocket
//! (`/v1/agent/link`), proves itself with its machine credential, and then serves the node's
//! gRPC calls (sessions, files) over that link, multiplexed by HTTP/2.
//!
//! - [`pairing`]: trading a one-time pairing code for a machine credential, kept in the state dir.
//! - [`pool`]: a warm sandbox's wait for an identity (`/v1/agent/pool`): the assignment (its
//!   pairing code, its sessions' environment), kept across restarts.
//! - [`link`]: the link loop: dial, authenticate, serve, reconnect with jittered backoff.
//! - [`sessions`]: processes (with or without a PTY) and their bounded output buffers; they keep
//!   running and keep their output while the link is down.
//! - [`users`]: the accounts calls run as (`user` by default in a sandbox, `root` on request),
//!   and running a call's file work on a thread holding only its account's rights.
//! - [`egress`]: the egress gateway of a sandbox's network namespace (`computer-agent
//!   egress-gateway`): the filter rules, a transparent proxy deciding connections by the policy,
//!   and its control socket.
//! - [`desktop`]: the display the agent owns (or a paired machine's, opted in): screenshots
//!   and input actions, one caller at a time.
//! - [`browser`]: Chromium over CDP on a pipe: browser sessions, snapshots with self-checking
//!   refs, element tools, uploads checked before they reach the page.
//! - [`files`]: file and directory calls.
//! - [`layout`]: the owners and modes of the agent's state dir and of the workspace.
//! - [`nofollow`]: walking a tree another account owns without following its symlinks.
//! - [`runtime_load`]: loading a runtime archive into a protected root, verified and published
//!   durably (`computer-agent load-runtime`).
//! - [`service`]: the gRPC service, refusing any link generation but the current one.
//! - [`tls`]: `https`/`wss` with the server verified (system roots, or `--ca`); plain `http` only
//!   to loopback or with `--insecure`.

#![warn(missing_docs)]

pub mod browser;
pub mod desktop;
pub mod egress;
pub mod files;
pub mod layout;
pub mod link;
pub mod mcp;
pub mod nofollow;
pub mod output;
pub mod pairing;
pub mod pool;
pub mod ports;
pub mod runtime_load;
pub mod service;
pub mod sessions;
pub mod tls;
pub mod users;
