//! Routing between nodes, the receiving end: the `Routing` gRPC service runs a call forwarded by
//! another node (`http/forward.rs` is the sending end) through this node's own HTTP router, so
//! it is authenticated and authorized here again, exactly as if it had arrived directly.
//!
//! Ownership is checked on the head, before any of the body is read: a node that does not hold
//! the Computer's link answers `FAILED_PRECONDITION` with `x-computerd-owner` (the owner in its
//! replica of the directory, if any), and the sender sends the whole call there instead.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::OnceLock;

use axum::body::Body;
use computerd_proto::cluster::RouteChunk;
use computerd_proto::cluster::RouteHead;
use computerd_proto::cluster::routing_server::Routing;
use computerd_proto::cluster::routing_server::RoutingServer;
use futures::Stream;
use futures::StreamExt;
use tonic::Request;
use tonic::Response;
use tonic::Status;
use tonic::Streaming;
use tower::ServiceExt;

use crate::http::AppState;

/// Marks a request that was forwarded once, so it is run where it arrives.
pub const FORWARDED: &str = "x-computerd-forwarded";
/// The metadata naming the owner in a not-owner answer.
pub const OWNER: &str = "x-computerd-owner";
/// The largest message on a route (a body chunk).
pub const MAX_ROUTE_MESSAGE: usize = 8 << 20;

/// The HTTP router and state, set once the node serves HTTP (calls before that are refused).
#[derive(Clone, Default)]
pub struct RouteTarget {
    inner: Arc<OnceLock<(axum::Router, AppState)>>,
}

impl RouteTarget {
    /// Sets the router and its state (once).
    pub fn set(&self, router: axum::Router, state: AppState) {
        let _ = self.inner.set((router, state));
    }

    /// The gRPC service.
    pub fn server(self) -> RoutingServer<RouteTarget> {
        RoutingServer::new(self)
            .max_decoding_message_size(MAX_ROUTE_MESSAGE + 4096)
            .max_encoding_message_size(MAX_ROUTE_MESSAGE + 4096)
    }
}

/// The Computer a path is about (`/v1/computers/{id}/…`).
pub fn computer_of(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/computers/").and_then(|r| r.split(['/', '?']).next()).filter(|id| !id.is_empty())
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<RouteChunk, Status>> + Send>>;

/// A not-owner answer naming the owner. When this node's applied state names none (or itself),
/// it may lag behind a link that was just recorded: it catches up to the leader's commit first.
async fn not_owner(state: &AppState, computer: &str) -> Status {
    let read = || state.cluster.state().read(|s| s.computers.get(computer).and_then(|c| c.link_node));
    let mut owner = read();
    if owner.is_none_or(|n| n == state.cluster.id()) && state.cluster.read_barrier().await.is_ok() {
        owner = read();
    }
    let mut status = Status::failed_precondition("this node does not hold the computer's link");
    if let Some(n) = owner.filter(|n| *n != state.cluster.id())
        && let Ok(v) = n.to_string().parse()
    {
        status.metadata_mut().insert(OWNER, v);
    }
    status
}

#[tonic::async_trait]
impl Routing for RouteTarget {
    type ForwardStream = ReplyStream;

    async fn relay_mcp(
        &self,
        req: Request<computerd_proto::cluster::McpRelay>,
    ) -> Result<Response<computerd_proto::cluster::McpRelayReply>, Status> {
        let Some((_, state)) = self.inner.get().cloned() else {
            return Err(Status::unavailable("this node is still starting"));
        };
        let r = req.into_inner();
        let Some(link) = state.links.get(&r.computer_id) else { return Err(not_owner(&state, &r.computer_id).await) };
        let mut agent = link.client().await?;
        let reply = agent.mcp(computerd_proto::agent::McpJson { json: r.json }).await?.into_inner();
        Ok(Response::new(computerd_proto::cluster::McpRelayReply { json: reply.json }))
    }

    async fn forward(&self, req: Request<Streaming<RouteChunk>>) -> Result<Response<ReplyStream>, Status> {
        let Some((router, state)) = self.inner.get().cloned() else {
            return Err(Status::unavailable("this node is still starting"));
        };
        let mut incoming = req.into_inner();
        let head = incoming
            .message()
            .await?
            .and_then(|c| c.head)
            .ok_or_else(|| Status::invalid_argument("a routed call starts with its head"))?;
        let computer = computer_of(&head.path).ok_or_else(|| Status::invalid_argument("not a call on a computer"))?;
        if state.links.get(computer).is_none() {
            return Err(not_owner(&state, computer).await);
        }
        let mut builder = axum::http::Request::builder().method(head.method.as_str()).uri(head.path.as_str());
        for (k, v) in &head.headers {
            builder = builder.header(k.as_str(), v.as_str());
        }
        let body = Body::from_stream(incoming.map(|c| {
            c.map(|c| bytes::Bytes::from(c.body)).map_err(|s| std::io::Error::other(s.message().to_string()))
        }));
        let request = builder
            .header(FORWARDED, "1")
            .body(body)
            .map_err(|e| Status::invalid_argument(format!("bad routed call: {e}")))?;
        // Answer the head at once: the sender holds the body back until it sees that the call
        // was accepted, so the router runs in its own task and feeds the reply stream.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RouteChunk, Status>>(4);
        tokio::spawn(async move {
            let response = match router.oneshot(request).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let status = response.status().as_u16() as u32;
            let mut headers = std::collections::HashMap::new();
            if let Some(ct) = response.headers().get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
                headers.insert("content-type".to_string(), ct.to_string());
            }
            let first = RouteChunk {
                head: Some(RouteHead { method: String::new(), path: String::new(), headers, status }),
                body: Vec::new(),
            };
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            let mut frames = response.into_body().into_data_stream();
            while let Some(frame) = frames.next().await {
                match frame {
                    Ok(bytes) => {
                        for c in bytes.chunks(MAX_ROUTE_MESSAGE) {
                            if tx.send(Ok(RouteChunk { head: None, body: c.to_vec() })).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(Status::aborted(format!("the answer was cut: {e}")))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}
