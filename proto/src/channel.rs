//! [`LinkChannel`]: the node's gRPC channel to one agent over its link, and no more than that:
//! one hyper HTTP/2 client connection on the link's byte stream ([`crate::wsio::MessageIo`]),
//! whose `SendRequest` handle is the tower service the generated `AgentClient` calls.
//!
//! A link is one connection that is never redialled (a lost link is a new link, with a new
//! generation), so tonic's `Channel` carries nothing a link needs and costs what idle links
//! must not: a buffer task with its request queue per channel, a reconnecting service and a
//! boxed service stack. Here a call goes straight to the connection's own dispatch queue.
//!
//! [`connect`] makes the handshake and answers the channel and the [`Connection`] future, which
//! the caller drives (it ends when the link ends, or when every clone of the channel is gone).

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::task::Poll;
use std::time::Duration;

use hyper::client::conn::http2;
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use hyper_util::rt::TokioTimer;
use tonic::body::Body;

use crate::wsio::MessageIo;

/// The connection of a [`LinkChannel`]: poll it to completion for the channel to work.
pub type Connection = http2::Connection<TokioIo<MessageIo>, Body, TokioExecutor>;

/// The HTTP/2 settings of a link's client side.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Interval of keep-alive PINGs (sent while idle too).
    pub keep_alive_interval: Duration,
    /// How long a PING may go unanswered before the connection is closed.
    pub keep_alive_timeout: Duration,
}

/// A gRPC channel over one HTTP/2 connection (cheap to clone: clones share the connection).
#[derive(Clone, Debug)]
pub struct LinkChannel {
    send: http2::SendRequest<Body>,
}

/// Opens HTTP/2 over `io` as its client.
pub async fn connect(io: MessageIo, settings: Settings) -> Result<(LinkChannel, Connection), hyper::Error> {
    let (send, conn) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(settings.keep_alive_interval)
        .keep_alive_timeout(settings.keep_alive_timeout)
        .keep_alive_while_idle(true)
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
