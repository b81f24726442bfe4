//! What a node uses of the replicated store: propose a command (forwarded to the leader),
//! a linearizable read barrier, membership changes, and the current view of the cluster.
//!
//! Every command must be idempotent (creates carry their ids, changes are set-to-value): when a
//! forwarded proposal's answer is lost, the proposal is sent again, and applying it twice must
//! change nothing the second time.
//!
//! - `leader.rs`: the leader this node knows, and the calls it serves for every node: `propose`
//!   and `read_barrier`, which share one retry loop (`retry_on_leader`) until their deadline.
//! - `membership.rs`: join, leave, a wiped node's revert, the cluster id.
//! - `coalesce.rs`: read-index rounds shared by every read waiting when one begins.
//! - `liveness.rs`: the leader's view of its peers' acknowledgements, and this node's quorum
//!   contact.

mod coalesce;
mod leader;
mod liveness;
mod membership;
mod reinstall;

pub use leader::ProposeReply;
pub use leader::ReadIndexReply;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::Config;
use openraft::SnapshotPolicy;
use openraft::type_config::async_runtime::WatchReceiver;
use serde::Deserialize;
use serde::Serialize;
use tokio::time::Instant;

use crate::NodeAddr;
use crate::NodeId;
use crate::Raft;
use crate::network::Channels;
use crate::network::NetworkFactory;
use crate::store;
use crate::store::StateReader;

/// How long a write may wait for a leader before the caller is told to retry.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a linearizable read may wait.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a join may take (the new node may need a snapshot).
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);
/// The pause between attempts when no leader is known or the known one moved.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Why the store could not serve a call.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No leader or no quorum right now; the call may be retried later.
    #[error("the cluster is unavailable: {0}")]
    Unavailable(String),
    /// The call itself is wrong (e.g. an unknown node).
    #[error("invalid: {0}")]
    Invalid(String),
    /// The local Raft node has stopped.
    #[error("the store has stopped: {0}")]
    Fatal(String),
}

/// Raft timing and log-compaction knobs.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Heartbeat interval, ms.
    pub heartbeat_ms: u64,
    /// Minimum election timeout, ms (the maximum is twice this).
    pub election_min_ms: u64,
    /// Build a snapshot every this many log entries.
    pub snapshot_every: u64,
    /// Log entries kept behind the snapshot for slow followers.
    pub keep_logs: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        // Compaction as etcd does by default (--snapshot-count, --snapshot-catchup-entries).
        // Elections: 300-600 ms (a follower's vote lease is the maximum). Pre-vote keeps a slow
        // follower whose timer fires from deposing a live leader, so the timeouts can be short.
        Self { heartbeat_ms: 100, election_min_ms: 300, snapshot_every: 100_000, keep_logs: 5_000 }
    }
}

/// A node's view of one cluster member.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MemberView {
    /// Node id.
    pub id: NodeId,
    /// Addresses.
    pub addr: NodeAddr,
    /// Voter or learner.
    pub voter: bool,
}

/// A snapshot of the node's Raft metrics, for health and tests.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterView {
    /// This node.
    pub node_id: NodeId,
    /// The leader this node knows.
    pub leader_id: Option<NodeId>,
    /// Current term.
    pub term: u64,
    /// Last applied log index.
    pub last_applied: Option<u64>,
    /// The last index in this node's log.
    pub last_log: Option<u64>,
    /// The last index this node knows committed.
    pub committed: Option<u64>,
    /// Index of the latest snapshot.
    pub snapshot: Option<u64>,
    /// Index up to which the log was purged.
    pub purged: Option<u64>,
    /// Members of the current membership.
    pub members: Vec<MemberView>,
}

struct Inner {
    id: NodeId,
    /// False while a fresh node waits for its join to be accepted: it refuses Raft RPCs so the
    /// leader does not see its empty log before it allowed the reversion.
    accepting: std::sync::atomic::AtomicBool,
    raft: Raft,
    reader: StateReader,
    channels: Channels,
    /// When this process started: the epoch of `leader_contact_ms`.
    started: Instant,
    /// Ms after `started` of the last append (or heartbeat) accepted from a current leader;
    /// 0 = never.
    leader_contact_ms: std::sync::atomic::AtomicU64,
    /// How long a node may go without quorum contact before it steps aside.
    contact_window: Duration,
    /// Read-index rounds this node runs as the leader (one key).
    leader_reads: Arc<coalesce::Coalescer<(), Result<ReadIndexReply, leader::RoundError>>>,
    /// Read-index calls this node forwards, per leader asked.
    forwarded_reads: Arc<coalesce::Coalescer<NodeId, Result<ReadIndexReply, tonic::Status>>>,
    /// The last stamp this node gave an entry while leading (`leader::Cluster::stamp`).
    last_stamp: std::sync::atomic::AtomicU64,
    /// Set when the node stops: writes are refused from then on, before they reach Raft.
    stopping: std::sync::atomic::AtomicBool,
}

/// A node's handle on the replicated store. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl Cluster {
    /// Opens the store in `dir` and starts the Raft node (not yet serving RPCs: add
    /// [`crate::service::Service`] to a gRPC server); `channels` reach the peers. A damaged
    /// current snapshot refuses the start, naming the file, unless `reinstall_from` names a
    /// member (its gRPC address): then the store is rebuilt on that member's snapshot first
    /// (`--reinstall-snapshot`; see `store::open_or_reinstall`).
    pub async fn start(
        id: NodeId,
        dir: &Path,
        tuning: &Tuning,
        channels: Channels,
        reinstall_from: Option<&str>,
    ) -> Result<Cluster, ClusterError> {
        let opened = match reinstall_from {
            None => store::open(dir),
            Some(member) => {
                store::open_or_reinstall(dir, |min| reinstall::fetch_snapshot(&channels, member, min)).await
            }
        };
        let (log, sm) = opened.map_err(|e| ClusterError::Fatal(format!("cannot open the store: {e}")))?;
        let reader = sm.reader();
        let config = Config {
            cluster_name: "computerd".into(),
            heartbeat_interval: tuning.heartbeat_ms,
            election_timeout_min: tuning.election_min_ms,
            election_timeout_max: tuning.election_min_ms * 2,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(tuning.snapshot_every),
            max_in_snapshot_log_to_keep: tuning.keep_logs,
            // A follower whose timer fires first asks before it bumps its term: a node cut off
            // by a partition cannot disrupt the leader when it comes back, and after a leader
            // crash the candidates do not split the vote by each taking a new term while the
            // others still hold the dead leader's lease.
            enable_pre_vote: Some(true),
            ..Default::default()
        };
        let config = Arc::new(config.validate().map_err(|e| ClusterError::Invalid(e.to_string()))?);
        let raft = Raft::new(id, config, NetworkFactory::new(channels.clone()), log, sm)
            .await
            .map_err(|e| ClusterError::Fatal(e.to_string()))?;
        let accepting = std::sync::atomic::AtomicBool::new(true);
        // Five minimum election timeouts (2 s by default): longer than an election after a leader
        // crash takes, so a healthy follower never steps aside while a new leader is chosen.
        let contact_window = Duration::from_millis(tuning.election_min_ms * 5);
        let (started, leader_contact_ms) = (Instant::now(), std::sync::atomic::AtomicU64::new(0));
        let last_stamp = std::sync::atomic::AtomicU64::new(0);
        let inner = Inner {
            id,
            accepting,
            raft,
            reader,
            channels,
            started,
            leader_contact_ms,
            contact_window,
            leader_reads: Arc::default(),
            forwarded_reads: Arc::default(),
            last_stamp,
            stopping: std::sync::atomic::AtomicBool::new(false),
        };
        Ok(Cluster { inner: Arc::new(inner) })
    }

    /// Opens or closes this node to Raft RPCs (closed while a fresh node joins).
    pub fn set_accepting(&self, on: bool) {
        self.inner.accepting.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Refuses Raft RPCs while this node is closed to them.
    pub fn check_accepting(&self) -> Result<(), tonic::Status> {
        if self.inner.accepting.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err(tonic::Status::unavailable("this node is joining"))
        }
    }

    /// The Raft handle.
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    /// Read access to the applied state (call [`Cluster::read_barrier`] first for a current read).
    pub fn state(&self) -> &StateReader {
        &self.inner.reader
    }

    /// Channels to peers, shared with the node's own forwarding.
    pub fn channels(&self) -> &Channels {
        &self.inner.channels
    }

    /// True once this node has a membership (bootstrapped or joined).
    pub async fn is_initialized(&self) -> Result<bool, ClusterError> {
        self.raft().is_initialized().await.map_err(|e| ClusterError::Fatal(e.to_string()))
    }

    /// Makes this node a one-node cluster.
    pub async fn initialize(&self, addr: NodeAddr) -> Result<(), ClusterError> {
        let members = std::collections::BTreeMap::from([(self.id(), addr)]);
        self.raft().initialize(members).await.map_err(|e| ClusterError::Fatal(e.to_string()))
    }

    /// The current view from this node's Raft metrics.
    pub fn view(&self) -> ClusterView {
        let m = self.raft().metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, addr)| MemberView { id: *id, addr: addr.clone(), voter: voters.contains(id) })
            .collect();
        ClusterView {
            node_id: self.id(),
            leader_id: m.current_leader,
            term: m.current_term,
            last_applied: m.last_applied.map(|l| l.index),
            last_log: m.last_log_index,
            committed: m.local_committed.map(|l| l.index),
            snapshot: m.snapshot.map(|l| l.index),
            purged: m.purged.map(|l| l.index),
            members,
        }
    }

    /// Whether the node is stopping (its writes are refused).
    pub fn is_stopping(&self) -> bool {
        self.inner.stopping.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Stops the Raft node. Writes asked for from here on are refused as `Unavailable` (a task
    /// that outlives the servers, such as a link recording its end, does not reach a stopped
    /// Raft).
    pub async fn shutdown(&self) {
        self.inner.stopping.store(true, std::sync::atomic::Ordering::Release);
        if let Err(e) = self.raft().shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
    }
}
