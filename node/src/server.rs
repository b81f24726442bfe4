//! Node start-up and shutdown, as straight-line steps:
//!
//! 1. open and check the data dir, and have the node's certificates (`pki.rs`);
//! 2. open the store and start Raft;
//! 3. serve gRPC (mutual TLS);
//! 4. bootstrap, join, or resume;
//! 5. serve HTTP;
//! 6. on the shutdown signal, stop HTTP, Raft and gRPC, in that order.

use std::future::Future;
use std::time::Duration;

use computerd_actors::driver::run_driver;
use computerd_actors::factory::ProviderFactory;
use computerd_raft::NodeAddr;
use computerd_raft::cluster::Cluster;
use computerd_raft::cluster::ClusterError;
use computerd_raft::network::Channels;
use computerd_raft::service::Service;
use computerd_raft::sm::Command;
use computerd_raft::sm::Member;
use computerd_raft::sm::Organization;
use computerd_raft::sm::Principal;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::Role;
use computerd_raft::sm::Token;
use computerd_raft::sm::hash_secret;
use computerd_raft::tls::JoinSecret;
use computerd_raft::tls::Pki;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::ServeConfig;
use crate::datadir::DataDir;
use crate::http;
use crate::ids::new_id;
use crate::ids::new_secret;
use crate::ids::now_ms;

/// How long a joining node keeps trying to reach the cluster.
const JOIN_PATIENCE: Duration = Duration::from_secs(60);

pub use crate::error::NodeError;

/// The listeners a node serves on, bound by the caller.
pub struct Listeners {
    /// The HTTP API.
    pub http: TcpListener,
    /// Node-to-node gRPC.
    pub grpc: TcpListener,
    /// More HTTPS listeners of the same API, each with its own certificate (`computerd dev`'s
    /// on the Docker bridge, for its sandboxes).
    pub extra_https: Vec<(TcpListener, std::sync::Arc<rustls::ServerConfig>)>,
}

/// Binds the configured addresses and runs the node until `shutdown` completes.
pub async fn serve(cfg: ServeConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), NodeError> {
    let bind = |addr: String| async move {
        TcpListener::bind(&addr).await.map_err(|source| NodeError::Listen { addr, source })
    };
    let listeners =
        Listeners { http: bind(cfg.http.clone()).await?, grpc: bind(cfg.grpc.clone()).await?, extra_https: Vec::new() };
    run(cfg, listeners, shutdown).await
}

/// Completes on SIGTERM or SIGINT. The handlers are installed when this is called, not when the
/// future is first polled: a signal that arrives while the node starts is not the default
/// (killing) action. Call it inside the runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::SignalKind;
    use tokio::signal::unix::signal;
    let handlers = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
            }
            _ => std::future::pending::<()>().await,
        }
        tracing::info!("shutdown signal received");
    }
}

/// A duration in seconds given as `flag`, which must be positive.
fn positive_secs(secs: f64, flag: &str) -> Result<Duration, NodeError> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| NodeError::Config(format!("{flag} must be a positive number")))
}

/// Runs a node on the given listeners until `shutdown` completes.
pub async fn run(
    cfg: ServeConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let watch_every = positive_secs(cfg.sandbox_watch_secs, "--sandbox-watch-secs")?;
    let http_port = listeners.http.local_addr().map(|a| a.port()).unwrap_or(80);
    let public_domain = cfg.public_domain.clone().unwrap_or_else(|| format!("localhost:{http_port}"));
    let public_domain = crate::ports::PublicDomain::parse(&public_domain).map_err(NodeError::Config)?;
    let linger = positive_secs(cfg.link_linger_secs, "--link-linger-secs")?;
    // 1. The data dir.
    let mut dir = DataDir::open(&cfg.data, cfg.node_id)?;
    let local = |l: &TcpListener, what: &str| {
        l.local_addr().map(|a| a.to_string()).map_err(|source| NodeError::Listen { addr: what.to_string(), source })
    };
    let addr = NodeAddr {
        http: cfg.advertise_http.clone().map_or_else(|| local(&listeners.http, "http"), Ok)?,
        grpc: cfg.advertise_grpc.clone().map_or_else(|| local(&listeners.grpc, "grpc"), Ok)?,
    };

    //    The certificates: this node's, made (first node) or enrolled (a joining node).
    let pki = crate::pki::certificates(&cfg, &dir).await?;

    // 2. The store, and the channels to peers (mutual TLS, from the peer source address, if one
    //    is set).
    check_peer_source(cfg.peer_source_ip)?;
    let client_tls = pki.client_config().map_err(|e| NodeError::Config(e.to_string()))?;
    let channels = Channels::new(client_tls, cfg.peer_source_ip);
    //    A damaged current snapshot refuses the start, naming the file, unless
    //    --reinstall-snapshot: then the store is rebuilt on the --join member's snapshot first.
    let reinstall_from = cfg.join.as_deref().filter(|_| cfg.reinstall_snapshot);
    let cluster = Cluster::start(cfg.node_id, &dir.store_dir(), &cfg.tuning(), channels, reinstall_from).await?;

    // 3. gRPC, so peers can reach this node while it joins. A node with an empty store that is
    //    told to join refuses Raft RPCs until the leader expects its empty log.
    if cfg.join.is_some() && !cluster.is_initialized().await? {
        cluster.set_accepting(false);
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    // Calls routed from other nodes run through this node's HTTP router, once it exists (step 5).
    let route_target = crate::owner::serve::RouteTarget::default();
    let grpc = {
        let mut stop = stop_rx.clone();
        let incoming =
            computerd_raft::tls::incoming(listeners.grpc, pki.clone()).map_err(|e| NodeError::Config(e.to_string()))?;
        tokio::spawn(
            tonic::transport::Server::builder()
                .initial_stream_window_size(computerd_raft::STREAM_WINDOW)
                .initial_connection_window_size(computerd_raft::CONNECTION_WINDOW)
                .layer(computerd_raft::tls::RequireNode)
                .add_service(Service::server(cluster.clone(), pki.clone()))
                .add_service(route_target.clone().server())
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stop.wait_for(|s| *s).await;
                }),
        )
    };

    // 4. Bootstrap, join or resume.
    if let Err(e) = membership(&cfg, &mut dir, &cluster, &addr, &pki).await {
        let _ = stop_tx.send(true);
        cluster.shutdown().await;
        let _ = grpc.await;
        return Err(e);
    }
    tracing::info!(node_id = cfg.node_id, %addr, "node serving");
    announce_store_version(&cluster);

    // 5. The execution driver (drives the Computers placed on this node), the leader's record of
    //    the live nodes they are placed over, and HTTP. A member silent for three minimum
    //    election timeouts is dead to placement.
    let providers = ProviderFactory { fake_dir: cfg.fake_provider_dir.clone() };
    let driver = tokio::spawn(run_driver(cluster.clone(), providers.clone(), stop_rx.clone()));
    let liveness = tokio::spawn(computerd_actors::liveness::run_liveness(
        cluster.clone(),
        Duration::from_millis(cfg.tuning().heartbeat_ms.max(50)),
        Duration::from_millis(cfg.tuning().election_min_ms * 3),
        stop_rx.clone(),
    ));
    // Idle pause: this node's work marks, reported in batches; the scheduler acts while leading.
    let activity: std::sync::Arc<computerd_actors::idle::Activity> = Default::default();
    let tick = Duration::from_secs(1);
    let reporter =
        tokio::spawn(computerd_actors::idle::run_reporter(activity.clone(), cluster.clone(), tick, stop_rx.clone()));
    let scheduler = tokio::spawn(computerd_actors::idle::run_scheduler(cluster.clone(), tick, stop_rx.clone()));
    let watch = tokio::spawn(computerd_actors::sandbox_watch::run_sandbox_watch(
        cluster.clone(),
        providers.clone(),
        watch_every,
        stop_rx.clone(),
    ));
    // Connections refused by sandboxes' egress gateways, as events, by the leader.
    let egress_watch = tokio::spawn(computerd_actors::egress_watch::run_egress_watch(
        cluster.clone(),
        providers.clone(),
        stop_rx.clone(),
    ));
    // Warm pools kept at their sizes, by the leader.
    let pool_keeper = tokio::spawn(computerd_actors::pool_keeper::run_pool_keeper(
        cluster.clone(),
        providers.clone(),
        stop_rx.clone(),
    ));
    // Providers' own expiry (E2B's timeout) kept ahead of running Computers, by the leader.
    let keep_alive = tokio::spawn(computerd_actors::keep_alive::run_keep_alive(
        cluster.clone(),
        providers.clone(),
        Duration::from_secs(5),
        stop_rx.clone(),
    ));
    let links = std::sync::Arc::new(computerd_actors::link::LinkRegistry::with_linger(linger));
    let links_at_stop = links.clone();
    let owners = crate::owner::Owners::new(cluster.clone(), links.clone());
    // Certificates while running: revocations from the store, the CA's key for a new voter,
    // renewal at half-life.
    let revocations = tokio::spawn(crate::pki::run_revocations(cluster.clone(), pki.clone(), stop_rx.clone()));
    let upkeep_every = Duration::from_secs((cfg.cert_validity_secs / 20).clamp(1, 60));
    let upkeep = tokio::spawn(crate::pki::run_upkeep(cluster.clone(), pki.clone(), upkeep_every, stop_rx.clone()));
    let app_state_limits = std::sync::Arc::new(http::Limits::new(
        cfg.unauthenticated_per_min,
        cfg.token_per_sec,
        cfg.trusted_proxies.clone(),
    ));
    let local_blobs: std::sync::Arc<dyn crate::blobs::BlobStore> = if cfg.blob_store == "local" {
        std::sync::Arc::new(
            crate::blobs::LocalBlobs::new(dir.blobs_dir())
                .map_err(|e| NodeError::Config(format!("the blob store: {e}")))?,
        )
    } else {
        std::sync::Arc::new(
            crate::blobs_s3::S3Blobs::from_url(&cfg.blob_store, dir.blobs_dir().join(".s3-upload"))
                .map_err(|e| NodeError::Config(format!("the blob store: {e}")))?,
        )
    };
    // Bytes of blobs the store no longer names (past their retention) are deleted.
    let blob_gc = {
        let (blobs, cluster, mut stop) = (local_blobs.clone(), cluster.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(600));
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                // A shared store is swept by the leader alone.
                if blobs.shared() && cluster.view().leader_id != Some(cluster.id()) {
                    continue;
                }
                let c = cluster.clone();
                let keep: crate::blobs::Keep =
                    std::sync::Arc::new(move |id| c.state().read(|s| s.blobs.contains_key(id)));
                let removed = blobs.collect(Duration::from_secs(3600), keep).await;
                if removed > 0 {
                    tracing::info!(removed, "blob bytes past their retention deleted");
                }
            }
        })
    };
    // Lapsed run leases expire when an entry moves the cluster's clock past them: the leader
    // proposes a tick when one is due (an idle cluster applies nothing else).
    let lease_ticks = {
        let (cluster, mut stop) = (cluster.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(500));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                let leader = cluster.view().leader_id == Some(cluster.id());
                let due = cluster.state().read(|s| s.runs.next_expiry()).is_some_and(|at| at <= crate::ids::now_ms());
                if leader && due {
                    let tick = computerd_raft::sm::Request::new(computerd_raft::sm::Command::RunsTick);
                    if let Err(e) = cluster.propose(tick).await {
                        tracing::debug!(error = %e, "the run lease tick was not applied");
                    }
                }
            }
        })
    };
    let metrics_token = match &cfg.metrics_token_file {
        Some(path) => Some(crate::http::metrics::token_hash_from(path).map_err(NodeError::Config)?),
        None => None,
    };
    crate::http::metrics::handle();
    let app_state = crate::state::AppState {
        blobs: local_blobs.clone(),
        cluster: cluster.clone(),
        fake_providers: cfg.fake_provider_dir.is_some(),
        links,
        owners: owners.clone(),
        sessions: std::sync::Arc::new(computerd_actors::session::SessionRegistry::new(std::sync::Arc::new(owners))),
        activity,
        providers,
        pki: pki.clone(),
        join_token_file: Some(dir.join_token_path()),
        limits: app_state_limits.clone(),
        streams: std::sync::Arc::default(),
        novnc_dir: cfg.novnc_dir.clone(),
        public_domain: std::sync::Arc::new(public_domain),
        port_pool: std::sync::Arc::default(),
        metrics_token,
    };
    // A node cut off from its quorum sheds its agent links, so they move to the majority.
    let shedder = tokio::spawn(computerd_actors::link::run_shedder(
        cluster.clone(),
        app_state.links.clone(),
        Duration::from_millis(500),
        stop_rx.clone(),
    ));
    let app = http::router(app_state.clone());
    route_target.set(app.clone(), app_state);
    let edge = crate::edge::Edge {
        tls: match (&cfg.tls_cert, &cfg.tls_key) {
            (Some(cert), Some(key)) => Some(crate::edge::tls_config(cert, key).map_err(NodeError::Config)?),
            _ => None,
        },
        max_connections: cfg.max_connections.max(1),
        header_timeout: Duration::from_secs(cfg.header_timeout_secs.max(1)),
        proxy_protocol_from: std::sync::Arc::new(if cfg.proxy_protocol {
            cfg.trusted_proxies.clone()
        } else {
            Vec::new()
        }),
    };
    let extra: Vec<_> = listeners
        .extra_https
        .into_iter()
        .map(|(l, tls)| {
            let edge = crate::edge::Edge { tls: Some(tls), ..edge.clone() };
            tokio::spawn(crate::edge::serve(l, app.clone(), edge, stop_rx.clone()))
        })
        .collect();
    let http = tokio::spawn(crate::edge::serve(listeners.http, app, edge, stop_rx.clone()));
    let limits_upkeep = tokio::spawn(http::run_limits_upkeep(app_state_limits, stop_rx.clone()));

    // 6. Shutdown.
    shutdown.await;
    let _ = stop_tx.send(true);
    let http_result = http.await;
    for e in extra {
        let _ = e.await;
    }
    let _ = limits_upkeep.await;
    let _ = driver.await;
    let _ = liveness.await;
    let _ = shedder.await;
    let _ = blob_gc.await;
    let _ = lease_ticks.await;
    let _ = reporter.await;
    let _ = scheduler.await;
    let _ = watch.await;
    let _ = keep_alive.await;
    let _ = egress_watch.await;
    let _ = pool_keeper.await;
    let _ = revocations.await;
    let _ = upkeep.await;
    // The agents' links end, and record their ends, while the store still runs.
    links_at_stop.shed_and_settle(Duration::from_secs(3)).await;
    cluster.shutdown().await;
    let grpc_result = grpc.await;
    tracing::info!(node_id = cfg.node_id, "node stopped");
    match (http_result, grpc_result) {
        (Ok(()), Ok(Ok(()))) => Ok(()),
        (h, g) => Err(NodeError::Server(format!("http: {h:?}, grpc: {g:?}"))),
    }
}

/// `--peer-source-ip` must be an address of this host: binding a socket to it proves it, where a
/// wrong one would only show as unreachable peers.
fn check_peer_source(ip: Option<std::net::IpAddr>) -> Result<(), NodeError> {
    let Some(ip) = ip else { return Ok(()) };
    std::net::TcpListener::bind((ip, 0))
        .map(drop)
        .map_err(|e| NodeError::Config(format!("--peer-source-ip {ip} is not an address of this host: {e}")))
}

/// Step 4: a fresh node bootstraps (no `--join`) or joins; a known node resumes.
async fn membership(
    cfg: &ServeConfig,
    dir: &mut DataDir,
    cluster: &Cluster,
    addr: &NodeAddr,
    pki: &Pki,
) -> Result<(), NodeError> {
    let initialized = cluster.is_initialized().await?;
    // `computerd restore`: the backup is read and checked before anything is written.
    let restoring = match &cfg.restore_from {
        Some(_) if cfg.join.is_some() => {
            return Err(NodeError::Config("restore starts a new cluster: it takes no --join".into()));
        }
        Some(_) if let Some(ours) = &dir.node.cluster_id => {
            return Err(NodeError::Config(format!(
                "the data dir already holds cluster {ours}: restore needs an empty one (start this one with serve)"
            )));
        }
        Some(path) => Some(read_backup(path)?),
        None => None,
    };
    match (&cfg.join, initialized) {
        (None, false) => {
            if dir.node.cluster_id.is_some() {
                return Err(NodeError::Bootstrap(
                    "the data dir belongs to a cluster but its store is empty; start it with --join".into(),
                ));
            }
            cluster.initialize(addr.clone()).await?;
            match restoring {
                Some(backup) => restore(dir, cluster, pki, cfg.join_token_out.as_deref(), backup).await,
                None => bootstrap(dir, cluster, pki, cfg.join_token_out.as_deref()).await,
            }
        }
        (None, true) => {
            // Resume. A crash between initialize and bootstrap leaves an unbootstrapped store.
            if dir.node.cluster_id.is_none() && cluster.view().members.len() == 1 {
                return match restoring {
                    Some(backup) => restore(dir, cluster, pki, cfg.join_token_out.as_deref(), backup).await,
                    None => bootstrap(dir, cluster, pki, cfg.join_token_out.as_deref()).await,
                };
            }
            check_recovered_cluster(dir, cluster).await?;
            refresh_own_address(cluster, addr);
            Ok(())
        }
        (Some(join), initialized) => {
            // First only ask: which cluster, and (for an empty store) let the leader expect an
            // empty log from this id. Raft RPCs stay refused until then (see `run`).
            let fresh = !initialized;
            if dir.node.cluster_id.is_some() || fresh {
                let theirs = match with_patience(|| cluster.join_through(join, addr, true, fresh)).await {
                    Err(NodeError::Cluster(ClusterError::Invalid(why))) if let Some(ours) = &dir.node.cluster_id => {
                        return Err(NodeError::Config(format!("the data dir belongs to cluster {ours}, but {why}")));
                    }
                    other => other?,
                };
                if let Some(ours) = dir.node.cluster_id.clone()
                    && theirs != ours
                {
                    return Err(NodeError::OtherCluster { ours, theirs, join: join.clone() });
                }
            }
            cluster.set_accepting(true);
            // Joining is idempotent: a member keeps its place and gets its new addresses.
            let cluster_id = with_patience(|| cluster.join_through(join, addr, false, false)).await?;
            if dir.node.cluster_id.as_deref() != Some(cluster_id.as_str()) {
                dir.set_cluster_id(&cluster_id)?;
            }
            Ok(())
        }
    }
}

/// Records the store version this build speaks (`sm::versions`), in the background (the cluster
/// may need this very node for its quorum), when the store does not say it already.
fn announce_store_version(cluster: &Cluster) {
    let (id, version) = (cluster.id(), computerd_raft::sm::STORE_VERSION);
    let cluster = cluster.clone();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + JOIN_PATIENCE;
        loop {
            if cluster.read_barrier().await.is_ok() && cluster.state().read(|s| s.speaks(id)) == version {
                return;
            }
            match cluster.propose(Request::new(Command::NodeSpeaks { node_id: id, version })).await {
                Ok(_) => {
                    tracing::info!(version, "store version recorded");
                    return;
                }
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::info!(error = %e, "store version not recorded yet; retrying");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the store version was not recorded: commands of this version wait");
                    return;
                }
            }
        }
    });
}

/// Retries a call to another member while it is not reachable yet (it may be starting too).
async fn with_patience<F, Fut>(mut call: F) -> Result<String, NodeError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<String, ClusterError>>,
{
    let deadline = tokio::time::Instant::now() + JOIN_PATIENCE;
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(ClusterError::Unavailable(m)) if tokio::time::Instant::now() < deadline => {
                tracing::info!(reason = %m, "cluster not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A node restarted on other addresses updates them in the membership, in the background: the
/// cluster may need this very node to regain a quorum, so start-up must not wait for it.
fn refresh_own_address(cluster: &Cluster, addr: &NodeAddr) {
    let stored = cluster.view().members.into_iter().find(|m| m.id == cluster.id()).map(|m| m.addr);
    if stored.as_ref() == Some(addr) {
        return;
    }
    let (cluster, addr) = (cluster.clone(), addr.clone());
    tokio::spawn(async move {
        match with_patience(|| cluster.join(cluster.id(), addr.clone())).await {
            Ok(_) => tracing::info!(%addr, "own address updated in the membership"),
            Err(e) => tracing::warn!(error = %e, "could not update own address in the membership"),
        }
    });
}

/// A restarted node checks that its store and its data dir agree on the cluster.
async fn check_recovered_cluster(dir: &mut DataDir, cluster: &Cluster) -> Result<(), NodeError> {
    let _ = cluster.raft().wait_for_recovery(Some(Duration::from_secs(10))).await;
    let stored = cluster.state().read(|s| s.cluster_id.clone());
    match (stored, dir.node.cluster_id.clone()) {
        (Some(s), Some(d)) if s != d => {
            Err(NodeError::OtherCluster { ours: d, theirs: s, join: "its own store".into() })
        }
        (Some(s), None) => Ok(dir.set_cluster_id(&s)?),
        _ => Ok(()),
    }
}

/// Reads and checks a backup file (`computerd restore --from`).
fn read_backup(path: &std::path::Path) -> Result<computerd_raft::sm::backup::Backup, NodeError> {
    let bytes = std::fs::read(path).map_err(|e| NodeError::Config(format!("--from {}: {e}", path.display())))?;
    computerd_raft::sm::backup::decode(&bytes).map_err(|e| NodeError::Config(format!("--from {}: {e}", path.display())))
}

/// Starts a new cluster from a backup: its records as they were (the same organization, members,
/// bots and tokens: the owner token of the old cluster works here), a new cluster id and CA, and
/// a new join secret (written as for a bootstrap). No new owner token is made.
async fn restore(
    dir: &mut DataDir,
    cluster: &Cluster,
    pki: &Pki,
    join_out: Option<&std::path::Path>,
    backup: computerd_raft::sm::backup::Backup,
) -> Result<(), NodeError> {
    let cluster_id = pki.cluster_id().to_string();
    let join = JoinSecret::new(&pki.ca_hash());
    dir.write_join_token(&join.encode())?;
    if let Some(out) = join_out {
        crate::datadir::write_secret_file(out, &join.encode())?;
    }
    let state_json =
        serde_json::to_string(&backup.state).map_err(|e| NodeError::Bootstrap(format!("the backup's records: {e}")))?;
    let cmd =
        Command::Restore { cluster_id: cluster_id.clone(), state_json, join_secret_hash: hash_secret(&join.secret) };
    match cluster.propose(Request::new(cmd)).await? {
        Response::Ok | Response::Id(_) => {}
        Response::Rejected(r) => return Err(NodeError::Bootstrap(r.message)),
    }
    dir.set_cluster_id(&cluster_id)?;
    // The entry that carried the records is folded into a snapshot, which is what nodes that
    // join later receive.
    if let Err(e) = cluster.raft().trigger().snapshot().await {
        tracing::warn!(error = %e, "no snapshot after the restore");
    }
    tracing::info!(
        cluster_id = %cluster_id,
        from_cluster = %backup.cluster_id.unwrap_or_default(),
        from_index = backup.applied_index,
        computers = backup.state.computers.len(),
        blobs = backup.blobs.len(),
        join = %dir.join_token_path().display(),
        "cluster restored from a backup; its tokens work here, and the join secret is new"
    );
    Ok(())
}

/// Creates the organization, the first owner and the owner token (written to `admin.token`).
async fn bootstrap(
    dir: &mut DataDir,
    cluster: &Cluster,
    pki: &Pki,
    join_out: Option<&std::path::Path>,
) -> Result<(), NodeError> {
    // The cluster id was chosen with the CA (its certificates name it).
    let cluster_id = pki.cluster_id().to_string();
    let now = now_ms();
    let owner = Member { id: new_id("mem"), name: "owner".into(), email: None, role: Role::Owner, created_at: now };
    let secret = new_secret();
    let token = Token {
        id: new_id("tok"),
        name: "bootstrap owner token".into(),
        hash: hash_secret(&secret),
        principal: Principal::Member(owner.id.clone()),
        read_only: false,
        computers: None,
        created_at: now,
        revoked_at: None,
    };
    let org = Organization { id: new_id("org"), name: "default".into(), created_at: now };
    // The join secret, then the owner token: files first (if we crash before the commands apply,
    // the next start writes new ones); a harness that waits for admin.token finds both.
    let join = JoinSecret::new(&pki.ca_hash());
    dir.write_join_token(&join.encode())?;
    if let Some(out) = join_out {
        crate::datadir::write_secret_file(out, &join.encode())?;
    }
    dir.write_admin_token(&secret)?;
    let join_secret_hash = Some(hash_secret(&join.secret));
    let cmd = Command::Bootstrap { cluster_id: cluster_id.clone(), org, owner, token, join_secret_hash };
    match cluster.propose(Request::new(cmd)).await? {
        Response::Ok | Response::Id(_) => {}
        Response::Rejected(r) => return Err(NodeError::Bootstrap(r.message)),
    }
    dir.set_cluster_id(&cluster_id)?;
    tracing::info!(cluster_id = %cluster_id, path = %dir.admin_token_path().display(), join = %dir.join_token_path().display(), "cluster bootstrapped; owner token and join secret written");
    Ok(())
}
