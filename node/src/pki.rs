//! The node's certificates at start-up and while it runs (`computerd_raft::tls` holds the
//! mechanics):
//!
//! - a node whose data dir has certificates uses them (a join secret given again is ignored);
//! - the first node (no `--join`) makes the cluster's CA and its own certificate;
//! - a joining node without one enrolls through the member it joins, with the join secret
//!   (`--join-token-file` or `COMPUTERD_JOIN_TOKEN`): the member is checked against the CA hash
//!   the secret carries, and a wrong or used secret, or a node id the cluster refuses (a member's,
//!   a removed node's), stops the node with a clear message;
//! - while running: the revocations in the store reach the TLS layer; a voter without the CA's
//!   key fetches it; the certificate renews itself at half-life.

use std::sync::Arc;
use std::time::Duration;

use computerd_proto::cluster::Empty;
use computerd_proto::cluster::EnrollRequest;
use computerd_proto::cluster::cluster_service_client::ClusterServiceClient;
use computerd_raft::cluster::Cluster;
use computerd_raft::network::one_off_channel;
use computerd_raft::tls::Csr;
use computerd_raft::tls::JoinSecret;
use computerd_raft::tls::Pki;
use computerd_raft::tls::enroll_client_config;
use tokio::sync::watch;

use crate::config::ServeConfig;
use crate::datadir::DataDir;
use crate::error::NodeError;
use crate::ids::new_id;

/// How long an enrolling node keeps trying to reach the member it joins through.
const ENROLL_PATIENCE: Duration = Duration::from_secs(60);

fn cert_error(e: computerd_raft::tls::CertError) -> NodeError {
    NodeError::Config(e.to_string())
}

/// The join secret given on the command line, if any.
async fn given_secret(cfg: &ServeConfig) -> Result<Option<JoinSecret>, NodeError> {
    let text = match (&cfg.join_token, &cfg.join_token_file) {
        (Some(t), _) => t.clone(),
        (None, Some(path)) => read_when_there(path).await?,
        (None, None) => return Ok(None),
    };
    JoinSecret::parse(&text).map(Some).map_err(NodeError::Config)
}

/// Reads the join secret's file, waiting up to a minute for it to appear (the first node of a
/// cluster started at the same time writes it).
async fn read_when_there(path: &std::path::Path) -> Result<String, NodeError> {
    let deadline = std::time::Instant::now() + ENROLL_PATIENCE;
    loop {
        match std::fs::read_to_string(path) {
            Ok(t) if !t.trim().is_empty() => return Ok(t),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(NodeError::Config(format!("--join-token-file {}: {e}", path.display())));
            }
            _ if std::time::Instant::now() >= deadline => {
                return Err(NodeError::Config(format!(
                    "--join-token-file {}: not there after a minute",
                    path.display()
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The node's certificates: loaded, made (first node) or enrolled (joining node).
pub async fn certificates(cfg: &ServeConfig, dir: &DataDir) -> Result<Arc<Pki>, NodeError> {
    let validity = Duration::from_secs(cfg.cert_validity_secs.max(4));
    if let Some(pki) = Pki::load(&dir.tls_dir(), cfg.node_id, validity).map_err(cert_error)? {
        if let Some(ours) = &dir.node.cluster_id
            && ours != pki.cluster_id()
        {
            return Err(NodeError::Config(format!(
                "the certificates in {} are of cluster {}, the data dir of cluster {ours}",
                dir.tls_dir().display(),
                pki.cluster_id()
            )));
        }
        if cfg.join.is_some() && given_secret(cfg).await?.is_some() {
            tracing::info!("this node has its certificate; the join secret given is not used");
        }
        return Ok(Arc::new(pki));
    }
    let Some(join) = &cfg.join else {
        // The first node (or one from before certificates): it makes the cluster's CA.
        let cluster_id = dir.node.cluster_id.clone().unwrap_or_else(|| new_id("cls"));
        let pki = Pki::bootstrap(&dir.tls_dir(), &cluster_id, cfg.node_id, validity).map_err(cert_error)?;
        tracing::info!(cluster_id = %cluster_id, "made the cluster's CA and this node's certificate");
        return Ok(Arc::new(pki));
    };
    let secret = given_secret(cfg).await?.ok_or_else(|| {
        NodeError::Config(
            "this node has no certificate yet: give the cluster's join secret with --join-token-file \
             (the first node wrote it to DIR/join.token) or COMPUTERD_JOIN_TOKEN"
                .into(),
        )
    })?;
    let pki = enroll(join, &secret, cfg.node_id, validity, dir).await?;
    tracing::info!(cluster_id = %pki.cluster_id(), via = %join, "enrolled: this node has its certificate");
    Ok(Arc::new(pki))
}

/// Asks the member at `join` for a certificate, with the join secret.
async fn enroll(
    join: &str,
    secret: &JoinSecret,
    node_id: u64,
    validity: Duration,
    dir: &DataDir,
) -> Result<Pki, NodeError> {
    let csr = Csr::new().map_err(cert_error)?;
    let config = enroll_client_config(&secret.ca_hash).map_err(cert_error)?;
    let channel = one_off_channel(join, config).map_err(|e| NodeError::Config(format!("--join {join}: {e}")))?;
    let mut client = ClusterServiceClient::new(channel);
    let deadline = tokio::time::Instant::now() + ENROLL_PATIENCE;
    let reply = loop {
        let mut req =
            tonic::Request::new(EnrollRequest { node_id, secret: secret.secret.clone(), csr_pem: csr.pem.clone() });
        req.set_timeout(Duration::from_secs(15));
        match client.enroll(req).await {
            Ok(r) => break r.into_inner(),
            // A wrong or used secret, a bad request, a removed or member's node id: final.
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unauthenticated | tonic::Code::InvalidArgument | tonic::Code::PermissionDenied
                ) =>
            {
                return Err(NodeError::Config(format!("the cluster refused this node's join: {}", s.message())));
            }
            Err(s) => {
                let why = computerd_raft::tls::status_chain(&s);
                if computerd_raft::tls::is_foreign_peer(&s) {
                    return Err(NodeError::Config(format!(
                        "the member at {join} is not of the cluster the join secret names (its CA differs)"
                    )));
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(NodeError::Config(format!("cannot enroll through {join}: {why}")));
                }
                tracing::info!(reason = %why, "cannot enroll yet; retrying");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    if let Some(ours) = &dir.node.cluster_id
        && *ours != reply.cluster_id
    {
        return Err(NodeError::OtherCluster { ours: ours.clone(), theirs: reply.cluster_id, join: join.to_string() });
    }
    Pki::install(&dir.tls_dir(), node_id, &reply.ca_pem, &reply.cert_pem, &csr, validity).map_err(cert_error)
}

/// Keeps the TLS layer's revocations equal to the store's, on every applied change.
pub async fn run_revocations(cluster: Cluster, pki: Arc<Pki>, mut stop: watch::Receiver<bool>) {
    let mut applied = cluster.state().subscribe();
    loop {
        pki.set_revocations(cluster.state().read(|s| s.join.revoked.clone()));
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// A voter without the CA's key fetches it from the leader; every node renews its certificate
/// at half-life (here with the CA's key, or through the leader with its current certificate).
pub async fn run_upkeep(cluster: Cluster, pki: Arc<Pki>, every: Duration, mut stop: watch::Receiver<bool>) {
    while computerd_actors::tick(every, &mut stop).await {
        if let Err(e) = ca_key_now(&cluster, &pki).await {
            tracing::debug!(error = %e, "cannot fetch the CA's key yet");
        }
        let view = cluster.view();
        let leader = view.leader_id.and_then(|l| view.members.iter().find(|m| m.id == l)).map(|m| m.addr.grpc.clone());
        if pki.renew_due() {
            let renewed = if pki.signs() {
                pki.renew_here().map_err(|e| e.to_string())
            } else if let Some(addr) = &leader {
                renew_through(&cluster, &pki, addr).await
            } else {
                Err("no leader to renew through".into())
            };
            match renewed {
                Ok(()) => tracing::info!(not_after = pki.not_after(), "renewed this node's certificate"),
                Err(e) => tracing::warn!(error = %e, "cannot renew this node's certificate yet"),
            }
        }
    }
}

/// Makes sure this node holds the CA's key when it is a voter: fetched from the leader now if it
/// does not yet (the upkeep does it on its own schedule; the vault needs it at once). A node
/// that is not a voter never gets it.
pub(crate) async fn ca_key_now(cluster: &Cluster, pki: &Pki) -> Result<(), String> {
    if pki.signs() {
        return Ok(());
    }
    let view = cluster.view();
    if !view.members.iter().any(|m| m.id == cluster.id() && m.voter) {
        return Err("this node is not a voter".into());
    }
    let leader = view.leader_id.and_then(|l| view.members.iter().find(|m| m.id == l)).map(|m| m.addr.grpc.clone());
    let Some(addr) = leader.filter(|_| view.leader_id != Some(cluster.id())) else {
        return Err("no other leader to fetch the CA's key from".into());
    };
    let pem = fetch_ca_key(cluster, &addr).await?;
    match pki.set_ca_key(&pem) {
        Ok(()) => {
            tracing::info!("this voter now holds the CA's key");
            Ok(())
        }
        Err(e) => {
            tracing::warn!(error = %e, "the CA's key received is not the cluster's");
            Err(e.to_string())
        }
    }
}

async fn fetch_ca_key(cluster: &Cluster, addr: &str) -> Result<String, String> {
    let mut client = cluster.channels().get(addr).map_err(|e| e.to_string())?;
    let mut req = tonic::Request::new(Empty {});
    req.set_timeout(Duration::from_secs(5));
    Ok(client.fetch_ca_key(req).await.map_err(|s| s.message().to_string())?.into_inner().pem)
}

async fn renew_through(cluster: &Cluster, pki: &Pki, addr: &str) -> Result<(), String> {
    let csr = Csr::new().map_err(|e| e.to_string())?;
    let mut client = cluster.channels().get(addr).map_err(|e| e.to_string())?;
    let mut req =
        tonic::Request::new(EnrollRequest { node_id: cluster.id(), secret: String::new(), csr_pem: csr.pem.clone() });
    req.set_timeout(Duration::from_secs(10));
    let reply = client.enroll(req).await.map_err(|s| s.message().to_string())?.into_inner();
    pki.renew_with(&reply.cert_pem, &csr).map_err(|e| e.to_string())
}
