//! Shared parts of the computerd benchmarks `store-bench` and `exec-bench`: the closed-loop
//! workload runner ([`workload`]), settings from the environment ([`settings`]) and, for
//! store-bench's reference, etcd clusters ([`etcd`]).

pub mod base64;
pub mod etcd;
pub mod settings;
pub mod workload;
