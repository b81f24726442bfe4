//! A computerd node: configuration, the data directory, start-up as straight-line steps, and
//! the HTTP API. The binary only parses flags and calls [`serve`]; tests call [`run`] with their
//! own listeners and shutdown signal.

#![warn(missing_docs)]

pub mod backup;
pub mod blobs;
pub mod blobs_s3;
pub mod bot_tools;
pub mod cli;
pub mod config;
pub mod datadir;
pub mod desktop_streams;
mod dev;
mod edge;
pub mod edge_ca;
mod error;
pub mod http;
pub mod ids;
mod limits;
pub mod link_handshake;
pub mod owner;
mod pki;
pub mod pool;
pub mod ports;
mod server;
pub mod state;
pub mod tunnel;
pub mod vault;

pub use dev::dev;
pub use error::NodeError;
pub use server::Listeners;
pub use server::run;
pub use server::serve;
pub use server::shutdown_signal;
