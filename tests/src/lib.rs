//! The cluster harness: starts real `computerd` processes on free loopback ports, waits on
//! predicates (never fixed sleeps), and injects faults (SIGKILL, SIGSTOP, restart, wipe).
//!
//! Used by the integration tests in `tests/tests/` and by the benchmarks in `bench/`.

pub mod agent;
pub mod browser;
pub mod chromium;
pub mod cluster;
pub mod ctl;
pub mod dev;
pub mod docker;
pub mod fakes;
pub mod lb;
pub mod linearizability;
pub mod netfault;
pub mod rfb;
pub mod sse;
pub mod tls;
pub mod tools;
pub mod uids;
pub mod wait;

pub use cluster::Node;
pub use cluster::TestCluster;
pub use cluster::computerd_bin;
pub use cluster::free_port;
pub use cluster::free_port_on;
pub use wait::wait_for;
