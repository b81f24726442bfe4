//! Shared parts of the computerd benchmarks (`store-bench`, `exec-bench`, `agent-bench`,
//! `docker-bench`, `cluster-bench`, `mcp-bench`): the closed-loop workload runner
//! ([`workload`]), settings from the environment ([`settings`]), latency recording, percentiles,
//! summaries and other report helpers ([`report`]), calls on a node with the owner token
//! ([`api`]), for store-bench's reference, etcd clusters with peer and client TLS ([`etcd`]),
//! their throwaway CA ([`certs`]) and HTTPS client ([`https`]), and for agent-bench, a
//! minimal agent link client and a plain WebSocket baseline ([`link_client`]); for port-bench
//! and stream-bench, one Docker sandbox on a test cluster ([`sandbox`]).

pub mod api;
pub mod base64;
pub mod certs;
pub mod etcd;
pub mod https;
pub mod link_client;
pub mod report;
pub mod sandbox;
pub mod settings;
pub mod workload;
