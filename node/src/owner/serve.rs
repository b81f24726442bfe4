//! The receiving end of routed calls: the `Routing` gRPC service runs a call forwarded by
//! another node ([`super::forward`] is the sending end) through this node's own HTTP router, so
//! it is authenticated and authorized here again, exactly as if it had arrived directly, and asks
//! this node's agent link for a relayed MCP request ([`super::relay`]).
//!
//! Ownership is checked on the head, before any of the body is read: a node that does not hold
//! the Computer's link answers `NotOwner` ([`Owners::not_owner`]), and the sender sends the whole
//! call there instead. A call taken is answered its stream's headers at once, and runs under its
//! kind's deadline ([`super::CallKind`]).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::OnceLock;

use axum::body::Body;
use computerd_proto::ErrorKind;
use computerd_proto::cluster::BlobChunk;
use computerd_proto::cluster::BlobStored;
use computerd_proto::cluster::BlobWant;
use computerd_proto::cluster::McpRelay;
use computerd_proto::cluster::McpRelayReply;
use computerd_proto::cluster::RouteChunk;
use computerd_proto::cluster::RouteHead;
use computerd_proto::cluster::TunnelChunk;
use computerd_proto::cluster::routing_server::Routing;
use computerd_proto::cluster::routing_server::RoutingServer;
use computerd_proto::mcp::McpRequest;
use computerd_raft::tls::PeerIdentity;
use futures::Stream;
use futures::StreamExt;
use tonic::Request;
use tonic::Response;
use tonic::Status;
use tonic::Streaming;
use tower::ServiceExt;

use super::MAX_ROUTE_MESSAGE;
use super::Owners;
use super::computer_of;
use super::forward::Route;
use crate::state::AppState;

/// Marks a request that another node routed here: it runs here, never sent on (a request
/// extension, so no client can claim it).
#[derive(Debug, Clone, Copy)]
pub struct Routed;

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

    /// The router and state for a call from a member of the cluster: a node certificate of
    /// this cluster is not enough (a node that enrolled and never joined, or was removed, holds
    /// one until it expires), as for the cluster service's own calls.
    fn serving<T>(&self, req: &Request<T>) -> Result<(axum::Router, AppState), Status> {
        let Some((router, state)) = self.inner.get().cloned() else {
            return Err(ErrorKind::Unavailable.status("this node is still starting"));
        };
        let from = req.extensions().get::<PeerIdentity>().and_then(|p| p.node_id);
        if from.and_then(|n| state.cluster.role_of(n)).is_none() {
            tracing::warn!(caller = ?from, "a routed call from a node that is not a member was refused");
            return Err(Status::permission_denied(format!(
                "routed calls are for members only; node {from:?} is not one"
            )));
        }
        Ok((router, state))
    }

    /// The gRPC service.
    pub fn server(self) -> RoutingServer<RouteTarget> {
        RoutingServer::new(self)
            .max_decoding_message_size(MAX_ROUTE_MESSAGE + 4096)
            .max_encoding_message_size(MAX_ROUTE_MESSAGE + 4096)
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<RouteChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Routing for RouteTarget {
    type ForwardStream = ReplyStream;
    type RelayMcpStream = Pin<Box<dyn Stream<Item = Result<McpRelayReply, Status>> + Send>>;
    type TunnelStream = Pin<Box<dyn Stream<Item = Result<TunnelChunk, Status>> + Send>>;
    type BlobFetchStream = Pin<Box<dyn Stream<Item = Result<BlobChunk, Status>> + Send>>;

    async fn blob_push(&self, req: Request<Streaming<BlobChunk>>) -> Result<Response<BlobStored>, Status> {
        let (_, state) = self.serving(&req)?;
        Ok(Response::new(super::blobs::take_copy(&state, req.into_inner()).await?))
    }

    async fn blob_fetch(&self, req: Request<BlobWant>) -> Result<Response<Self::BlobFetchStream>, Status> {
        let (_, state) = self.serving(&req)?;
        let stream = super::blobs::serve_copy(&state, req.into_inner()).await?;
        Ok(Response::new(Box::pin(super::blobs::as_chunks(stream))))
    }

    async fn catch_up(
        &self,
        req: Request<computerd_proto::cluster::Empty>,
    ) -> Result<Response<computerd_proto::cluster::Empty>, Status> {
        let (_, state) = self.serving(&req)?;
        state.cluster.read_barrier().await.map_err(|e| ErrorKind::Unavailable.status(e.to_string()))?;
        Ok(Response::new(computerd_proto::cluster::Empty {}))
    }

    /// A person's desktop stream, opened here for another node that took its WebSocket: the
    /// first chunk names the Computer and carries the stream's cookie, which is checked here
    /// (where it was minted), with the caller's rights, before the agent is asked.
    async fn tunnel(&self, req: Request<Streaming<TunnelChunk>>) -> Result<Response<Self::TunnelStream>, Status> {
        let (_, state) = self.serving(&req)?;
        let mut incoming = req.into_inner();
        let first =
            incoming.message().await?.ok_or_else(|| ErrorKind::InvalidRequest.status("a tunnel opens first"))?;
        let computer = first.computer_id.clone();
        if state.links.get(&computer).is_none() {
            return Err(state.owners.not_owner(&computer).await);
        }
        let opening: crate::tunnel::Opening = serde_json::from_str(&first.open_json)
            .map_err(|e| ErrorKind::InvalidRequest.status(format!("bad tunnel: {e}")))?;
        let (mut to_computer, from_computer) =
            crate::tunnel::open_here(&state, &computer, &opening).await.map_err(|e| e.into_status())?;
        tokio::spawn(async move {
            use futures::SinkExt;
            while let Some(Ok(chunk)) = incoming.next().await {
                if to_computer.send(chunk.data).await.is_err() {
                    break;
                }
            }
        });
        let out = from_computer
            .map(move |data| Ok(TunnelChunk { computer_id: String::new(), open_json: String::new(), data }));
        Ok(Response::new(Box::pin(out)))
    }

    async fn relay_mcp(&self, req: Request<McpRelay>) -> Result<Response<Self::RelayMcpStream>, Status> {
        let (_, state) = self.serving(&req)?;
        let r = req.into_inner();
        let owners: &Owners = &state.owners;
        if state.links.get(&r.computer_id).is_none() {
            return Err(owners.not_owner(&r.computer_id).await);
        }
        // Taken: the headers go at once; the agent's answer follows as the one message. The
        // caller's rights are checked here again, at a current read of this node's replica.
        let call = async move {
            let request: McpRequest = serde_json::from_str(&r.json)
                .map_err(|e| ErrorKind::InvalidRequest.status(format!("not an MCP request: {e}")))?;
            state.cluster.read_barrier().await.map_err(|e| ErrorKind::Unavailable.status(e.to_string()))?;
            state
                .cluster
                .state()
                .read(|s| {
                    let caller = s.caller_by_token_id(&r.token_id).ok();
                    s.check_tool_request(caller.as_ref(), &r.computer_id, &request)
                })
                .map_err(|e| e.error_kind().status(e.message))?;
            let mut agent = state.owners.agent(&r.computer_id).await.map_err(|e| e.into_status())?;
            Ok(McpRelayReply { json: super::relay::ask_agent(&mut agent, r.json).await? })
        };
        Ok(Response::new(Box::pin(futures::stream::once(call))))
    }

    async fn forward(&self, req: Request<Streaming<RouteChunk>>) -> Result<Response<ReplyStream>, Status> {
        let (router, state) = self.serving(&req)?;
        let mut incoming = req.into_inner();
        let head = incoming
            .message()
            .await?
            .and_then(|c| c.head)
            .ok_or_else(|| ErrorKind::InvalidRequest.status("a routed call starts with its head"))?;
        let computer =
            computer_of(&head.path).ok_or_else(|| ErrorKind::InvalidRequest.status("not a call on a computer"))?;
        if state.links.get(computer).is_none() {
            return Err(state.owners.not_owner(computer).await);
        }
        let deadline = tokio::time::Instant::now() + super::kind_of_path(&head.path).deadline();
        let route = Route::of_path(&head.path);
        let mut builder = axum::http::Request::builder().method(head.method.as_str()).uri(head.path.as_str());
        // Only what the route's allowlist names, whatever the sender put in.
        for (k, v) in super::forward::unpack(&head.headers, route.request_headers()) {
            builder = builder.header(k, v);
        }
        let body = Body::from_stream(incoming.map(|c| {
            c.map(|c| bytes::Bytes::from(c.body)).map_err(|s| std::io::Error::other(s.message().to_string()))
        }));
        // Routed: runs here (an extension, which no client can set; the edge also drops the
        // header from clients).
        let request = builder
            .extension(Routed)
            .body(body)
            .map_err(|e| ErrorKind::InvalidRequest.status(format!("bad routed call: {e}")))?;
        // Answer the head at once: the sender holds the body back until it sees that the call
        // was accepted, so the router runs in its own task and feeds the reply stream.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RouteChunk, Status>>(4);
        tokio::spawn(async move {
            let response = match tokio::time::timeout_at(deadline, router.oneshot(request)).await {
                Ok(Ok(r)) => r,
                Ok(Err(never)) => match never {},
                Err(_) => {
                    let _ =
                        tx.send(Err(ErrorKind::DeadlineExceeded.status("the call did not end by its deadline"))).await;
                    return;
                }
            };
            let status = response.status().as_u16() as u32;
            let headers = super::forward::pack(response.headers(), route.answer_headers());
            let first = RouteChunk {
                head: Some(RouteHead { method: String::new(), path: String::new(), headers, status }),
                body: Vec::new(),
            };
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            let mut frames = response.into_body().into_data_stream();
            loop {
                let frame = match tokio::time::timeout_at(deadline, frames.next()).await {
                    Ok(Some(frame)) => frame,
                    Ok(None) => return,
                    Err(_) => {
                        let _ = tx
                            .send(Err(ErrorKind::DeadlineExceeded.status("the answer was cut at its deadline")))
                            .await;
                        return;
                    }
                };
                match frame {
                    Ok(bytes) => {
                        for c in bytes.chunks(MAX_ROUTE_MESSAGE) {
                            if tx.send(Ok(RouteChunk { head: None, body: c.to_vec() })).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx
                            .send(Err(ErrorKind::ComputerExecutionFailed.status(format!("the answer was cut: {e}"))))
                            .await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}
