//! [`LinkChannel`]: the node's gRPC channel to one agent over one epoch of its link (see
//! [`crate::mux`]), and no more than that: one hyper HTTP/2 client connection on the epoch's
//! byte stream, whose `SendRequest` handle is the tower service the generated `AgentClient` calls.
//!
//! An epoch is one connection that is never redialled (when it ends, the next call opens a new
//! epoch), so tonic's `Channel` carries nothing it needs and costs what it must not: a buffer
//! task with its request queue, a reconnecting service and a boxed service stack. Here a call
//! goes straight to the connection's own dispatch queue.
//!
//! [`open`] makes the handshake (it writes the preface and needs no answer) and answers the
//! channel and the [`Connection`] future, which the caller drives: it ends when the epoch does,
//! or when every clone of the channel is gone and its streams are done.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::task::Poll;

use hyper::client::conn::http2;
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use tonic::body::Body;

use crate::mux::EpochIo;

/// The connection of a [`LinkChannel`]: poll it to completion for the channel to work.
pub type Connection = http2::Connection<TokioIo<EpochIo>, Body, TokioExecutor>;

/// A gRPC channel over one HTTP/2 connection (cheap to clone: clones share the connection).
#[derive(Clone, Debug)]
pub struct LinkChannel {
    send: http2::SendRequest<Body>,
}

impl LinkChannel {
    /// True once its connection ended: calls on it fail, a new epoch is needed.
    pub fn is_closed(&self) -> bool {
        self.send.is_closed()
    }
}

/// The HTTP/2 receive window of a stream over a link (and of every gRPC stream between nodes):
/// larger than HTTP/2's default 64 KiB, so a 64 KiB answer passes without a window update.
pub const STREAM_WINDOW: u32 = 1 << 20;
/// The HTTP/2 receive window of a whole connection.
pub const CONNECTION_WINDOW: u32 = 4 << 20;
/// The largest HTTP/2 frame either end of a link takes: a file's 256 KiB chunk crosses the
/// WebSocket as one DATA frame in one mux frame, not sixteen of HTTP/2's default 16 KiB.
pub const MAX_FRAME: u32 = 256 << 10;

/// Opens HTTP/2 over an epoch as its client.
pub async fn open(io: EpochIo) -> Result<(LinkChannel, Connection), hyper::Error> {
    let (send, conn) = http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .handshake(TokioIo::new(io))
        .await?;
    Ok((LinkChannel { send }, conn))
}

impl tower_service::Service<http::Request<Body>> for LinkChannel {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.send.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        Box::pin(self.send.send_request(req))
    }
}
