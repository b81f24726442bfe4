//! Both ends of a snapshot reinstall (`computerd serve --reinstall-snapshot`): a node whose
//! current snapshot is damaged fetches a member's snapshot before its Raft node starts, and the
//! member serves its own (building a newer one when it ends too early). The store side is
//! `store::open_or_reinstall`.

use std::io;
use std::time::Duration;

use computerd_proto::cluster::FetchSnapshotRequest;
use futures::StreamExt;
use openraft::type_config::async_runtime::WatchReceiver;
use tokio::time::Instant;

use super::Cluster;
use super::ClusterError;
use crate::network::Channels;
use crate::typ::Snapshot;
use crate::typ::SnapshotMeta;

/// How long a member takes at most to have a snapshot reaching the index asked for.
const SERVE_PATIENCE: Duration = Duration::from_secs(30);
/// How long the fetching node tries (the member may be starting, or building a snapshot).
const FETCH_PATIENCE: Duration = Duration::from_secs(90);
/// The largest snapshot a node accepts (as for a leader's).
const MAX_SNAPSHOT: usize = 1 << 30;

impl Cluster {
    /// This node's current snapshot once it reaches `min_index`: when it ends before, a build is
    /// triggered as soon as the applied log reaches `min_index`, and the call waits for it (at
    /// most [`SERVE_PATIENCE`]).
    pub async fn snapshot_reaching(&self, min_index: u64) -> Result<Snapshot, ClusterError> {
        let deadline = Instant::now() + SERVE_PATIENCE;
        let mut triggered = false;
        loop {
            let current = self.raft().get_snapshot().await.map_err(|e| ClusterError::Fatal(e.to_string()))?;
            let reached = current.as_ref().and_then(|s| s.meta.last_log_id).map(|l| l.index);
            if let Some(s) = current
                && reached.is_some_and(|i| i >= min_index)
            {
                return Ok(s);
            }
            let applied = self.raft().metrics().borrow_watched().last_applied.map(|l| l.index);
            if !triggered && applied.is_some_and(|a| a >= min_index) {
                // The build covers what is applied, so it reaches `min_index`.
                self.raft().trigger().snapshot().await.map_err(|e| ClusterError::Fatal(e.to_string()))?;
                triggered = true;
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Unavailable(format!(
                    "no snapshot reaching index {min_index} here yet (the current one ends at {reached:?}, applied \
                     {applied:?})"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Fetches the snapshot of the member at `grpc_addr`, reaching `min_index`, retrying while the
/// member is unavailable (at most [`FETCH_PATIENCE`]). The bytes are checked by the store.
pub(super) async fn fetch_snapshot(
    channels: &Channels,
    grpc_addr: &str,
    min_index: u64,
) -> io::Result<(SnapshotMeta, Vec<u8>)> {
    let deadline = Instant::now() + FETCH_PATIENCE;
    loop {
        match fetch_once(channels, grpc_addr, min_index).await {
            Ok(got) => return Ok(got),
            Err(s)
                if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded)
                    && Instant::now() < deadline =>
            {
                tracing::warn!(member = grpc_addr, error = %crate::tls::status_chain(&s), "fetching a snapshot; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(s) => {
                return Err(io::Error::other(format!(
                    "cannot fetch a snapshot from the member at {grpc_addr}: {}",
                    crate::tls::status_chain(&s)
                )));
            }
        }
    }
}

async fn fetch_once(
    channels: &Channels,
    grpc_addr: &str,
    min_index: u64,
) -> Result<(SnapshotMeta, Vec<u8>), tonic::Status> {
    let mut client = channels.get(grpc_addr).map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
    let mut req = tonic::Request::new(FetchSnapshotRequest { min_index });
    req.set_timeout(SERVE_PATIENCE + Duration::from_secs(30));
    let mut stream = client.fetch_snapshot(req).await?.into_inner();
    let first = stream.next().await.ok_or_else(|| tonic::Status::data_loss("empty snapshot stream"))??;
    let meta: SnapshotMeta = serde_json::from_slice(&first.meta)
        .map_err(|e| tonic::Status::data_loss(format!("unreadable snapshot meta: {e}")))?;
    let mut data = first.data;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if data.len() + chunk.data.len() > MAX_SNAPSHOT {
            return Err(tonic::Status::resource_exhausted("snapshot too large"));
        }
        data.extend_from_slice(&chunk.data);
    }
    Ok((meta, data))
}
