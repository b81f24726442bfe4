//! What every HTTP handler and the routing service share: the store, the links held here, the
//! owner path to the links held elsewhere, and this node's session actors and work marks.

use std::sync::Arc;

use computerd_actors::factory::ProviderFactory;
use computerd_actors::idle::Activity;
use computerd_actors::link::LinkRegistry;
use computerd_actors::session::SessionRegistry;
use computerd_raft::cluster::Cluster;

use crate::owner::Owners;

/// What every handler gets.
#[derive(Clone)]
pub struct AppState {
    /// The replicated store.
    pub cluster: Cluster,
    /// Whether this node accepts fake (test) providers.
    pub fake_providers: bool,
    /// Agent links held by this node.
    pub links: Arc<LinkRegistry>,
    /// Where each Computer's link is, and clients to it (here or on its node).
    pub owners: Owners,
    /// Command sessions with actors on this node.
    pub sessions: Arc<SessionRegistry>,
    /// Builds provider adapters (for inspections).
    pub providers: ProviderFactory,
    /// Work seen on this node, reported to the idle-pause plan in batches.
    pub activity: Arc<Activity>,
    /// The node's certificates and the cluster's CA (join secrets name the CA's hash).
    pub pki: Arc<computerd_raft::tls::Pki>,
    /// The edge's rate limits.
    pub limits: Arc<crate::limits::Limits>,
    /// People's desktop streams: tickets and cookies minted here.
    pub streams: Arc<crate::desktop_streams::Streams>,
    /// noVNC's files (Debian's `novnc` package: `/usr/share/novnc`).
    pub novnc_dir: std::path::PathBuf,
    /// Where public port addresses live (`--public-domain`).
    pub public_domain: Arc<crate::ports::PublicDomain>,
    /// Idle connections to exposed ports, for the next request to the same address.
    pub port_pool: Arc<crate::ports::PortPool>,
    /// Where blob bytes are kept (this node's disk).
    pub blobs: Arc<dyn crate::blobs::BlobStore>,
    /// This node's `DIR/join.token` (rewritten when the reusable secret is rotated here).
    pub join_token_file: Option<std::path::PathBuf>,
    /// The hash of the token that may read `/metrics` (`--metrics-token-file`), besides owners
    /// and admins.
    pub metrics_token: Option<String>,
}
