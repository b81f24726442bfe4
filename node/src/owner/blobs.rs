//! Blob bytes between nodes, for a cluster without a shared blob store: the node that took an
//! upload pushes a second copy to a live peer before it answers (`Routing.BlobPush`), and the
//! blob's record names both nodes; a call served on a node without the bytes streams them from
//! one that has them (`Routing.BlobFetch`). So a blob survives the loss of one node, and any
//! node serves it.
//!
//! Rights are the calling node's to check, on the blob's record, before it asks: these calls
//! travel only between nodes, on the cluster's authenticated channels.

use std::time::Duration;

use bytes::Bytes;
use computerd_proto::ErrorKind;
use computerd_proto::cluster::BlobChunk;
use computerd_proto::cluster::BlobStored;
use computerd_proto::cluster::BlobWant;
use computerd_proto::cluster::routing_client::RoutingClient;
use computerd_raft::NodeId;
use computerd_raft::sm::Blob;
use futures::Stream;
use futures::StreamExt;
use tonic::Status;

use super::MAX_ROUTE_MESSAGE;
use crate::blobs::PutError;
use crate::state::AppState;

/// How long a peer has to answer at all.
const CONNECT: Duration = Duration::from_secs(3);

pub use crate::blobs::ByteStream;

/// Why a second copy could not be made.
#[derive(Debug)]
pub struct NoCopy(pub String);

/// How long moving `size` bytes between two nodes may take (at least 10 MiB/s, plus a margin).
fn budget(size: u64) -> Duration {
    Duration::from_secs(10) + Duration::from_millis(size / (10 * 1024))
}

fn client(state: &AppState, node: NodeId) -> Option<RoutingClient<tonic::transport::Channel>> {
    let addr = state.cluster.view().members.into_iter().find(|m| m.id == node).map(|m| m.addr.grpc)?;
    let channel = state.cluster.channels().channel(&addr).ok()?;
    Some(
        RoutingClient::new(channel)
            .max_decoding_message_size(MAX_ROUTE_MESSAGE + 4096)
            .max_encoding_message_size(MAX_ROUTE_MESSAGE + 4096),
    )
}

/// The other member nodes, starting at one picked by the blob's id (so copies spread).
fn peers(state: &AppState, id: &str) -> Vec<NodeId> {
    let me = state.cluster.id();
    let mut others: Vec<NodeId> = state.cluster.view().members.into_iter().map(|m| m.id).filter(|n| *n != me).collect();
    others.sort_unstable();
    if !others.is_empty() {
        let start = id.bytes().fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize)) % others.len();
        others.rotate_left(start);
    }
    others
}

/// The nodes to record for a blob just stored here: this one alone on a single node, else this
/// one and a peer that took a checked copy (tried in turn). A cluster in which no peer takes
/// one refuses the upload: a blob kept on one node of several would not survive that node.
pub async fn second_copy(state: &AppState, id: &str, sha256: &str, size: u64) -> Result<Vec<NodeId>, NoCopy> {
    let me = state.cluster.id();
    if state.blobs.shared() {
        return Ok(Vec::new()); // every node reaches the same store
    }
    let others = peers(state, id);
    if others.is_empty() {
        return Ok(vec![me]);
    }
    let mut why = Vec::new();
    for node in others {
        match push(state, node, id, sha256, size).await {
            Ok(()) => return Ok(vec![me, node]),
            Err(e) => {
                tracing::warn!(blob = %id, node, error = %e, "a peer did not take a blob's second copy");
                why.push(format!("node {node}: {e}"));
            }
        }
    }
    Err(NoCopy(why.join("; ")))
}

async fn push(state: &AppState, node: NodeId, id: &str, sha256: &str, size: u64) -> Result<(), String> {
    let mut client = client(state, node).ok_or("not reachable")?;
    let bytes = state.blobs.open(id).await.map_err(|e| format!("this node's copy: {e}"))?;
    let first = BlobChunk { blob_id: id.to_string(), sha256: sha256.to_string(), size, data: Vec::new() };
    // A read error leaves its bytes out: the peer's length and digest checks refuse the copy.
    // The bytes go through a channel fed by a task: tonic's call wants a stream it may share.
    let (tx, rx) = tokio::sync::mpsc::channel::<BlobChunk>(4);
    let feed = tokio::spawn(async move {
        let mut chunks = push_stream(first, bytes);
        while let Some(c) = chunks.next().await {
            if tx.send(c).await.is_err() {
                return;
            }
        }
    });
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    req.set_timeout(budget(size));
    let stored = tokio::time::timeout(budget(size) + CONNECT, client.blob_push(req))
        .await
        .map_err(|_| "no answer in time".to_string())?
        .map_err(|s| s.message().to_string())?
        .into_inner();
    feed.abort();
    if stored.size != size || !stored.sha256.eq_ignore_ascii_case(sha256) {
        return Err(format!("it stored {} bytes hashing to {}", stored.size, stored.sha256));
    }
    Ok(())
}

/// The chunks of a push: `first`, then the bytes.
fn push_stream(first: BlobChunk, bytes: ByteStream) -> std::pin::Pin<Box<dyn Stream<Item = BlobChunk> + Send>> {
    Box::pin(futures::stream::once(futures::future::ready(first)).chain(futures::stream::unfold(bytes, next_chunk)))
}

/// The next chunk of a stream of bytes to push (a read error ends it short: the peer's length
/// check then refuses the copy).
async fn next_chunk(mut bytes: ByteStream) -> Option<(BlobChunk, ByteStream)> {
    match bytes.next().await {
        Some(Ok(b)) => Some((BlobChunk { data: b.to_vec(), ..Default::default() }, bytes)),
        _ => None,
    }
}

/// Blob `b`'s bytes: from this node's store when it holds them, else streamed from a node that
/// does (each tried in turn until one answers).
pub async fn open(state: &AppState, b: &Blob) -> Result<ByteStream, (ErrorKind, String)> {
    let me = state.cluster.id();
    if b.nodes.is_empty() || b.nodes.contains(&me) {
        return state.blobs.open(&b.id).await.map_err(|e| {
            tracing::error!(blob = %b.id, error = %e, "a recorded blob's bytes are missing");
            (ErrorKind::Internal, "the blob's bytes are missing from the blob store".to_string())
        });
    }
    let mut why = Vec::new();
    for node in b.nodes.iter().copied() {
        let Some(mut client) = client(state, node) else {
            why.push(format!("node {node} is not a member"));
            continue;
        };
        let mut req = tonic::Request::new(BlobWant { blob_id: b.id.clone() });
        req.set_timeout(budget(b.size));
        match tokio::time::timeout(CONNECT, client.blob_fetch(req)).await {
            Ok(Ok(r)) => {
                let stream = r.into_inner().map(|c| match c {
                    Ok(c) => Ok(Bytes::from(c.data)),
                    Err(s) => Err(std::io::Error::other(s.message().to_string())),
                });
                return Ok(Box::pin(stream));
            }
            Ok(Err(s)) => why.push(format!("node {node}: {}", s.message())),
            Err(_) => why.push(format!("node {node} did not answer")),
        }
    }
    tracing::warn!(blob = %b.id, nodes = ?b.nodes, why = %why.join("; "), "no node served a blob's bytes");
    Err((ErrorKind::Unavailable, format!("no node holding this blob's bytes answered ({:?})", b.nodes)))
}

/// The receiving end of `BlobPush`: the copy is stored, checked, under the blob's id.
pub async fn take_copy(state: &AppState, mut incoming: tonic::Streaming<BlobChunk>) -> Result<BlobStored, Status> {
    let first = incoming.message().await?.ok_or_else(|| ErrorKind::InvalidRequest.status("a push opens first"))?;
    if !crate::ids::is_id(&first.blob_id, "blb") {
        return Err(ErrorKind::InvalidRequest.status("not a blob id"));
    }
    let sha = first.sha256.to_ascii_lowercase();
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ErrorKind::InvalidRequest.status("a push names the blob's SHA-256"));
    }
    let head = futures::stream::once(async move { Ok::<_, String>(Bytes::from(first.data)) });
    let body = head.chain(incoming.map(|c| c.map(|c| Bytes::from(c.data)).map_err(|s| s.message().to_string())));
    match state.blobs.put(&first.blob_id, Some(&sha), Some(first.size), Box::pin(body)).await {
        Ok(s) => Ok(BlobStored { size: s.size, sha256: s.sha256 }),
        Err(PutError::Mismatch(why)) => Err(ErrorKind::DigestMismatch.status(why)),
        Err(PutError::TooLarge) => Err(ErrorKind::TooLarge.status("a blob is at most 1 GiB")),
        Err(PutError::Body(why)) => Err(ErrorKind::InvalidRequest.status(format!("the push stopped: {why}"))),
        Err(PutError::Io(why)) => {
            tracing::error!(error = %why, "the blob store failed taking a copy");
            Err(ErrorKind::Internal.status("the blob store failed"))
        }
    }
}

/// The receiving end of `BlobFetch`: this node's copy, streamed.
pub async fn serve_copy(state: &AppState, want: BlobWant) -> Result<ByteStream, Status> {
    if !crate::ids::is_id(&want.blob_id, "blb") {
        return Err(ErrorKind::InvalidRequest.status("not a blob id"));
    }
    state
        .blobs
        .open(&want.blob_id)
        .await
        .map_err(|_| ErrorKind::NotFound.status("this node holds no copy of that blob"))
}

/// A fetched stream as `BlobFetch`'s answer.
pub fn as_chunks(stream: ByteStream) -> impl Stream<Item = Result<BlobChunk, Status>> + Send {
    stream.map(|c| match c {
        Ok(b) => Ok(BlobChunk { data: b.to_vec(), ..Default::default() }),
        Err(e) => Err(ErrorKind::Internal.status(format!("this node's copy could not be read: {e}"))),
    })
}
