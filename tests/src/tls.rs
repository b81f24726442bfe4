//! gRPC channels to test nodes, as a node (with a node's own certificate from its data dir) or
//! as a stranger (no certificate, or one of another CA), for the tests of the cluster's mutual
//! TLS.

use std::sync::Arc;

use computerd_raft::tls::Pki;
use tonic::transport::Channel;

use crate::TestCluster;

/// Node `id`'s certificates, from its data dir.
pub fn pki_of(c: &TestCluster, id: u64) -> Arc<Pki> {
    let dir = c.nodes[&id].data.join("tls");
    Arc::new(Pki::load(&dir, id, computerd_raft::tls::VALIDITY).expect("certificates").expect("a node certificate"))
}

/// A channel to node `to` presenting node `as_node`'s certificate.
pub fn channel_as(c: &TestCluster, as_node: u64, to: u64) -> Channel {
    let config = pki_of(c, as_node).client_config().expect("client config");
    computerd_raft::network::one_off_channel(&c.nodes[&to].grpc, config).expect("channel")
}

/// A channel to node `to` that checks the server against the cluster's CA hash, presenting
/// `identity`'s certificate (`None`: no certificate at all).
pub fn channel_with(c: &TestCluster, to: u64, identity: Option<Arc<Pki>>) -> Channel {
    let hash = pki_of(c, 1).ca_hash();
    let config = match identity {
        Some(p) => computerd_raft::tls::pinned_client_config(&hash, p),
        None => computerd_raft::tls::enroll_client_config(&hash),
    }
    .expect("client config");
    computerd_raft::network::one_off_channel(&c.nodes[&to].grpc, config).expect("channel")
}

/// A node certificate of another cluster's CA, made in `dir`.
pub fn stranger(dir: &std::path::Path, id: u64) -> Arc<Pki> {
    Arc::new(Pki::bootstrap(dir, "cls_stranger", id, computerd_raft::tls::VALIDITY).expect("another CA"))
}
