//! Command-line configuration. Every flag has a `COMPUTERD_*` environment equivalent.
//!
//! Peer source address: by default the kernel chooses where a node's connections to its peers
//! start from. `--peer-source-ip` names a local IP instead (usually the one of `--grpc`) for
//! every node-to-node connection (Raft, forwarded writes and reads, routed calls, joins), so
//! firewall rules can tell a node's peer traffic from its clients' (the chaos suite partitions
//! nodes on loopback this way, each node on its own 127.x.y.z).

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Args;
use clap::Parser;
use clap::Subcommand;
use computerd_raft::cluster::Tuning;

/// The computerd control-plane node.
#[derive(Debug, Parser)]
#[command(name = "computerd", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
// Parsed once per process: the size of a variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a cluster node.
    Serve(ServeConfig),
    /// Run one node with a local data dir for trying computerd out; prints the URL and token.
    Dev(DevConfig),
    /// Make (or keep) a local CA in a directory and a server certificate for the HTTP edge (a
    /// load balancer's, at set-up): DIR/ca.crt, edge.crt, edge.key, and edge.pem for HAProxy.
    EdgeCert(EdgeCertConfig),
    /// Write a backup of a running cluster's store (every record, and the blobs' list) to a
    /// file, with an owner's token.
    Backup(BackupConfig),
    /// Start the first node of a new cluster from a backup, in an empty data dir (then run it
    /// with `serve`, and join more nodes as usual). The flags are `serve`'s.
    Restore(RestoreConfig),
}

/// `computerd backup`.
#[derive(Debug, Clone, Args)]
pub struct BackupConfig {
    /// A node's (or the load balancer's) base URL.
    #[arg(long, env = "COMPUTERD_URL")]
    pub url: String,
    /// A file holding an owner's token (never the token itself on the command line).
    #[arg(long, env = "COMPUTERD_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// The file to write (0600; replaced atomically).
    #[arg(long)]
    pub out: PathBuf,
    /// A CA certificate (PEM) to trust for an `https://` URL.
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
}

/// `computerd restore`.
#[derive(Debug, Clone, Args)]
pub struct RestoreConfig {
    /// The backup file (`computerd backup`).
    #[arg(long)]
    pub from: PathBuf,
    /// The node's settings, as for `serve`.
    #[command(flatten)]
    pub serve: ServeConfig,
}

/// `computerd edge-cert`.
#[derive(Debug, Clone, Args)]
pub struct EdgeCertConfig {
    /// The directory of the CA and the certificate (made if missing).
    #[arg(long)]
    pub dir: PathBuf,
    /// A DNS name or IP address the certificate is for (repeatable; the first is its CN).
    #[arg(long = "name", required = true)]
    pub names: Vec<String>,
    /// How long the certificate lasts, in days (made again when less than a third is left).
    #[arg(long, default_value_t = 397)]
    pub days: u64,
}

/// `computerd dev`.
#[derive(Debug, Clone, Args)]
pub struct DevConfig {
    /// The data directory: the node's data in DATA/node (0700), this machine's agent in
    /// DATA/agent (its credential and tool runtime); DATA itself lets tool bindings pass (0711).
    #[arg(long, env = "COMPUTERD_DATA", default_value = "computerd-data")]
    pub data: PathBuf,
    /// Run this machine's tool bindings under the agent's own UID when dev does not run as root
    /// (it cannot give them UIDs of their own; they are marked `sharedUid`). Without it, tool
    /// installs on `local` are refused unless dev runs as root.
    #[arg(long, env = "COMPUTERD_SHARED_UID_BINDINGS")]
    pub shared_uid_bindings: bool,
    /// Address of the HTTP API.
    #[arg(long, env = "COMPUTERD_HTTP", default_value = "127.0.0.1:8080")]
    pub http: String,
    /// Address of the node-to-node gRPC service (nobody else needs it in dev).
    #[arg(long, env = "COMPUTERD_GRPC", default_value = "127.0.0.1:0")]
    pub grpc: String,
    /// Where the Docker sandboxes' agents dial: HTTPS/WSS with a certificate of a local CA
    /// (DATA/node/edge-tls/ca.crt), which the registered `local docker` provider hands to them.
    /// Default: the host's address on Docker's bridge, with the port of `--http`; `off`: no
    /// Docker sandboxes.
    #[arg(long, env = "COMPUTERD_SANDBOX_HTTP")]
    pub sandbox_http: Option<String>,
    /// Remove the Docker sandboxes that dev with this data dir made (they keep running when dev
    /// stops, and the next dev finds them again), then exit without serving. They are the
    /// containers whose agents pin this data dir's local CA (DATA/node/edge-tls/ca.crt); no
    /// other container is touched. Their Computers turn `failed` at the next start.
    #[arg(long)]
    pub down: bool,
}

impl DevConfig {
    /// The one-node serve configuration this stands for.
    pub fn serve_config(&self) -> ServeConfig {
        let t = Tuning::default();
        ServeConfig {
            node_id: 1,
            data: self.data.join("node"),
            http: self.http.clone(),
            grpc: self.grpc.clone(),
            advertise_http: None,
            advertise_grpc: None,
            join: None,
            join_token_file: None,
            join_token: None,
            join_token_out: None,
            tls_cert: None,
            tls_key: None,
            max_connections: 10_000,
            header_timeout_secs: 10,
            unauthenticated_per_min: 10,
            token_per_sec: 200,
            trusted_proxies: Vec::new(),
            proxy_protocol: false,
            cert_validity_secs: 90 * 24 * 3600,
            heartbeat_ms: t.heartbeat_ms,
            election_ms: t.election_min_ms,
            snapshot_every: t.snapshot_every,
            keep_logs: t.keep_logs,
            fake_provider_dir: None,
            novnc_dir: PathBuf::from("/usr/share/novnc"),
            public_domain: None,
            sandbox_watch_secs: 10.0,
            link_linger_secs: 15.0,
            peer_source_ip: None,
            reinstall_snapshot: false,
            blob_store: "local".into(),
            metrics_token_file: None,
            restore_from: None,
        }
    }
}

/// `computerd serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Set by `computerd restore`: the backup a fresh store starts from.
    #[arg(skip)]
    pub restore_from: Option<PathBuf>,
    /// This node's id in the cluster, stable across restarts.
    #[arg(long, env = "COMPUTERD_NODE_ID")]
    pub node_id: u64,
    /// The data directory (created if missing; never re-initialised if it holds something else).
    #[arg(long, env = "COMPUTERD_DATA")]
    pub data: PathBuf,
    /// Address of the HTTP API.
    #[arg(long, env = "COMPUTERD_HTTP", default_value = "127.0.0.1:8080")]
    pub http: String,
    /// Address of the node-to-node gRPC service.
    #[arg(long, env = "COMPUTERD_GRPC", default_value = "127.0.0.1:9090")]
    pub grpc: String,
    /// The HTTP address other nodes and clients use for this node (default: the bound one).
    #[arg(long, env = "COMPUTERD_ADVERTISE_HTTP")]
    pub advertise_http: Option<String>,
    /// The gRPC address other nodes use for this node (default: the bound one).
    #[arg(long, env = "COMPUTERD_ADVERTISE_GRPC")]
    pub advertise_grpc: Option<String>,
    /// The gRPC address of any member to join; without it, the first start bootstraps a cluster.
    #[arg(long, env = "COMPUTERD_JOIN")]
    pub join: Option<String>,
    /// A file holding the cluster's join secret (`cdj1.…`, see `DIR/join.token` on the first
    /// node), for a node without a certificate yet; a node that has one ignores it.
    #[arg(long, env = "COMPUTERD_JOIN_TOKEN_FILE")]
    pub join_token_file: Option<PathBuf>,
    /// The first node also writes the join secret here (e.g. a volume the other nodes mount).
    #[arg(long, env = "COMPUTERD_JOIN_TOKEN_OUT")]
    pub join_token_out: Option<PathBuf>,
    /// The join secret itself (instead of a file).
    #[arg(long, env = "COMPUTERD_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// How long node certificates last (seconds); they renew themselves at half-life.
    #[arg(long, env = "COMPUTERD_CERT_VALIDITY_SECS", default_value_t = 90 * 24 * 3600)]
    pub cert_validity_secs: u64,
    /// Serve HTTPS and WSS with this certificate chain (PEM); needs `--tls-key`.
    #[arg(long, env = "COMPUTERD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The key of `--tls-cert` (PEM).
    #[arg(long, env = "COMPUTERD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The most HTTP connections open at once; one more is closed at accept.
    #[arg(long, env = "COMPUTERD_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,
    /// How long a client has for its TLS handshake and each request's headers (seconds).
    #[arg(long, env = "COMPUTERD_HEADER_TIMEOUT_SECS", default_value_t = 10)]
    pub header_timeout_secs: u64,
    /// Unauthenticated calls (pairing, the agent link's hello) per minute and source (0: no limit).
    #[arg(long, env = "COMPUTERD_UNAUTHENTICATED_PER_MIN", default_value_t = 10)]
    pub unauthenticated_per_min: u32,
    /// Calls per second and token (0: no limit), with bursts of twice that.
    #[arg(long, env = "COMPUTERD_TOKEN_PER_SEC", default_value_t = 200)]
    pub token_per_sec: u32,
    /// A load balancer's address: calls from it are counted against the client it names in
    /// `X-Forwarded-For` (repeatable). Calls from anyone else are counted against their own address.
    #[arg(long = "trusted-proxy", env = "COMPUTERD_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<IpAddr>,
    /// Connections from a `--trusted-proxy` start with a PROXY protocol header (v1 or v2; HAProxy's
    /// `send-proxy-v2`, for a balancer that passes TLS through): the client it names is counted.
    #[arg(long, env = "COMPUTERD_PROXY_PROTOCOL", requires = "trusted_proxies")]
    pub proxy_protocol: bool,
    /// Raft heartbeat interval in ms.
    #[arg(long, env = "COMPUTERD_HEARTBEAT_MS", default_value_t = Tuning::default().heartbeat_ms)]
    pub heartbeat_ms: u64,
    /// Minimum Raft election timeout in ms (the maximum is twice this).
    #[arg(long, env = "COMPUTERD_ELECTION_MS", default_value_t = Tuning::default().election_min_ms)]
    pub election_ms: u64,
    /// Build a snapshot every this many log entries.
    #[arg(long, env = "COMPUTERD_SNAPSHOT_EVERY", default_value_t = Tuning::default().snapshot_every)]
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot for slow followers.
    #[arg(long, env = "COMPUTERD_KEEP_LOGS", default_value_t = Tuning::default().keep_logs)]
    pub keep_logs: u64,
    /// Enables the fault-injecting `fake` provider kind, journaling its effects in this directory
    /// (for tests; every node of a cluster needs the same directory).
    #[arg(long, env = "COMPUTERD_FAKE_PROVIDER_DIR")]
    pub fake_provider_dir: Option<PathBuf>,
    /// noVNC's files, served to people's desktop streams (Debian's `novnc` package).
    #[arg(long, env = "COMPUTERD_NOVNC_DIR", default_value = "/usr/share/novnc")]
    pub novnc_dir: PathBuf,
    /// The wildcard domain of public port addresses (`https://<port>-<label>.DOMAIN/`, its
    /// certificate held by the load balancer). `localhost[:PORT]` gives plain `http://` addresses
    /// (for dev). Default: `localhost:<this node's HTTP port>`.
    #[arg(long, env = "COMPUTERD_PUBLIC_DOMAIN")]
    pub public_domain: Option<String>,
    /// How often the leader checks that the sandboxes of running and paused Computers still
    /// exist at their provider (seconds).
    #[arg(long, env = "COMPUTERD_SANDBOX_WATCH_SECS", default_value_t = 10.0)]
    pub sandbox_watch_secs: f64,
    /// How long an agent link keeps an HTTP/2 connection open after its last call (seconds);
    /// an idle link holds none.
    #[arg(long, env = "COMPUTERD_LINK_LINGER_SECS", default_value_t = 15.0)]
    pub link_linger_secs: f64,
    /// The local IP every connection to a peer starts from (default: the kernel chooses). It
    /// must be an address of this host that reaches the peers; checked at start-up.
    #[arg(long, env = "COMPUTERD_PEER_SOURCE_IP")]
    pub peer_source_ip: Option<IpAddr>,
    /// On a node whose current snapshot is damaged (it refuses to start and names the file):
    /// fetch the `--join` member's snapshot (reaching this node's purged log), move the damaged
    /// file aside (`discarded-*`) and rebuild the store on it before Raft starts; the vote and the
    /// log after that snapshot stay. Needs `--join`. A healthy snapshot is kept: the flag then
    /// does nothing.
    #[arg(long, env = "COMPUTERD_REINSTALL_SNAPSHOT", requires = "join")]
    pub reinstall_snapshot: bool,
    /// Where blob bytes go: `local` (this node's data dir; in a cluster each blob also goes to
    /// a second node before its upload is answered) or `s3://bucket[/prefix]?endpoint=URL&region=R`
    /// (an S3-compatible store every node reaches; credentials from `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`). Every node of a cluster names the same store.
    #[arg(long, env = "COMPUTERD_BLOB_STORE", default_value = "local")]
    pub blob_store: String,
    /// A file holding the token (at least 16 characters) that Prometheus presents to read
    /// `GET /metrics`; owners' and admins' tokens read it too.
    #[arg(long, env = "COMPUTERD_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<std::path::PathBuf>,
}

impl ServeConfig {
    /// The Raft tuning given on the command line.
    pub fn tuning(&self) -> Tuning {
        Tuning {
            heartbeat_ms: self.heartbeat_ms,
            election_min_ms: self.election_ms,
            snapshot_every: self.snapshot_every,
            keep_logs: self.keep_logs,
        }
    }
}
