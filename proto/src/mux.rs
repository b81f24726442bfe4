//! The link multiplexer: what crosses an agent's one WebSocket after the welcome.
//!
//! An idle link must cost the node little (the goal is at most 32 KiB per idle link at 10 000
//! links), and an HTTP/2 connection alone costs more than that (h2 keeps a 16 KiB write buffer
//! and an 8 KiB read buffer for its whole life, hyper a request queue and tasks). So HTTP/2 runs
//! on a link only while it is used: the node opens an HTTP/2 connection (an *epoch*) when a call
//! needs one, keeps it while calls come, and lets it end after a while without calls; an idle
//! link is the WebSocket and its task, nothing more. What an idle link needs is carried by
//! frames of this module: the agent's session reports, and WebSocket pings for liveness.
//!
//! Every binary message is one frame, its first byte its kind:
//!
//! | kind | layout | meaning |
//! |---|---|---|
//! | [`KIND_H2`] | kind, epoch (u32 BE), bytes | bytes of the HTTP/2 connection `epoch` |
//! | [`KIND_CLOSE`] | kind, epoch (u32 BE) | the sender's side of `epoch` ended |
//! | [`KIND_REPORT`] | kind, a protobuf `SessionEnded` | a report of the agent's sessions |
//! | 3 to 8 | kind, tunnel (u32 BE), … | byte tunnels, outside HTTP/2 ([`tunnel`]) |
//!
//! The node is the HTTP/2 client and numbers epochs upwards; the agent serves a new epoch when
//! its first bytes come (an epoch number it has not seen, above the last one), and never
//! revives a closed one. Either side ends an epoch by sending `KIND_CLOSE` when its HTTP/2
//! connection ends; the other then sees the end of the stream.
//!
//! [`Mux`] drives one WebSocket in its owner's task: it writes queued frames and the epochs'
//! bytes (with backpressure: an epoch's writes wait while the WebSocket is full), and reads
//! frames, handing bytes to their epochs and answering the events ([`Event`]) its owner acts on.
//! [`EpochIo`] is one epoch's byte stream, on which hyper (node) or tonic (agent) runs HTTP/2.
//! [`TunnelIo`] is one tunnel's (a port's connection, a desktop stream), with flow control of its
//! own: the mux never waits on a tunnel's reader.

pub mod tunnel;

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::Context;
use std::task::Poll;
use std::time::Instant;

use bytes::Buf;
use bytes::BufMut;
use bytes::Bytes;
use bytes::BytesMut;
use futures::Sink;
use futures::Stream;
use futures::channel::mpsc;
use tokio::io::AsyncRead;
use tokio::io::AsyncWrite;
use tokio::io::ReadBuf;
use tunnel::After;
pub use tunnel::Incoming;
pub use tunnel::Opening;
pub use tunnel::Refused;
pub use tunnel::TunnelEnd;
pub use tunnel::TunnelIo;
pub use tunnel::TunnelReader;
pub use tunnel::TunnelWriter;

/// Bytes of an HTTP/2 connection.
pub const KIND_H2: u8 = 0;
/// The end of one side of an HTTP/2 connection.
pub const KIND_CLOSE: u8 = 1;
/// A session report of the agent.
pub const KIND_REPORT: u8 = 2;

/// The largest write of an epoch that goes in one frame.
const MAX_CHUNK: usize = 256 * 1024;
/// Frames an epoch may have waiting for the WebSocket before its writes wait.
const EPOCH_QUEUE: usize = 8;

/// A message read from the WebSocket, as the mux sees it.
#[derive(Debug)]
pub enum WsIn {
    /// A binary message: a frame.
    Binary(Bytes),
    /// Anything else (ping, pong, text): a sign of life only.
    Other,
}

/// A message to write to the WebSocket.
#[derive(Debug)]
pub enum WsOut {
    /// A frame.
    Binary(Bytes),
    /// A ping (the peer answers it with a pong).
    Ping,
}

/// A WebSocket, as the mux drives it: each side adapts its own WebSocket type.
pub trait Transport: Stream<Item = io::Result<WsIn>> + Sink<WsOut, Error = io::Error> + Unpin + Send {}
impl<T: Stream<Item = io::Result<WsIn>> + Sink<WsOut, Error = io::Error> + Unpin + Send> Transport for T {}

/// A WebSocket of any library as a [`Transport`]: its messages are mapped to and from the mux's
/// with two functions (binary messages are frames; the rest are signs of life).
pub struct Adapter<S, M> {
    inner: S,
    read: fn(M) -> WsIn,
    write: fn(WsOut) -> M,
}

impl<S, M> Adapter<S, M> {
    /// Wraps `inner`.
    pub fn new(inner: S, read: fn(M) -> WsIn, write: fn(WsOut) -> M) -> Self {
        Self { inner, read, write }
    }
}

impl<S, M, E> Stream for Adapter<S, M>
where
    S: Stream<Item = Result<M, E>> + Unpin,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Item = io::Result<WsIn>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let read = self.read;
        Pin::new(&mut self.inner).poll_next(cx).map(|m| m.map(|m| m.map(read).map_err(io::Error::other)))
    }
}

impl<S, M, E> Sink<WsOut> for Adapter<S, M>
where
    S: Sink<M, Error = E> + Unpin,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Error = io::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_ready(cx).map_err(io::Error::other)
    }

    fn start_send(mut self: Pin<&mut Self>, item: WsOut) -> io::Result<()> {
        let m = (self.write)(item);
        Pin::new(&mut self.inner).start_send(m).map_err(io::Error::other)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx).map_err(io::Error::other)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx).map_err(io::Error::other)
    }
}

/// An [`Adapter`] for a WebSocket whose message type `$message` has `Binary(Bytes)` and
/// `Ping(Bytes)` variants, as axum's and tungstenite's do: `ws_adapter!(socket, Message)`.
#[macro_export]
macro_rules! ws_adapter {
    ($ws:expr, $message:ident) => {
        $crate::mux::Adapter::new(
            $ws,
            |m| match m {
                $message::Binary(b) => $crate::mux::WsIn::Binary(b),
                _ => $crate::mux::WsIn::Other,
            },
            |o| match o {
                $crate::mux::WsOut::Binary(b) => $message::Binary(b),
                $crate::mux::WsOut::Ping => $message::Ping(Default::default()),
            },
        )
    };
}

/// Which side of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The node: opens epochs ([`epoch`] + [`Mux::attach`]).
    Client,
    /// The agent: serves the epochs the node opens ([`Event::Accepted`]).
    Server,
}

/// What the owner of a [`Mux`] is told.
#[derive(Debug)]
pub enum Event {
    /// A report frame's payload (a protobuf `SessionEnded`).
    Report(Bytes),
    /// The node opened an epoch: serve HTTP/2 on it (agent side only).
    Accepted(EpochIo),
    /// The node opened a tunnel: accept or refuse it (agent side only).
    Tunnel(Incoming),
    /// The WebSocket ended or failed; the link is over.
    Ended(io::Error),
}

/// The mux's end of one epoch.
#[derive(Debug)]
pub struct EpochEnd {
    id: u32,
    /// The epoch's incoming bytes, to its connection.
    to_conn: mpsc::UnboundedSender<Bytes>,
    /// Frames its connection wrote (already framed).
    from_conn: mpsc::Receiver<Bytes>,
}

/// Makes the two ends of epoch `id`: the mux's ([`Mux::attach`]) and the connection's.
pub fn epoch(id: u32) -> (EpochEnd, EpochIo) {
    let (to_conn, rx) = mpsc::unbounded();
    let (tx, from_conn) = mpsc::channel(EPOCH_QUEUE);
    (EpochEnd { id, to_conn, from_conn }, EpochIo { id, rx, tx, pending: Bytes::new() })
}

/// One WebSocket of a link, multiplexed (see the module's text).
pub struct Mux<T> {
    ws: T,
    role: Role,
    epochs: Vec<EpochEnd>,
    tunnels: Vec<TunnelEnd>,
    /// Frames of the owner (reports, closes, pings), written before the epochs' bytes.
    queued: VecDeque<WsOut>,
    /// The highest epoch served (agent side only): lower or equal numbers are never served again.
    highest: u32,
    /// The highest tunnel opened (agent side only), likewise.
    highest_tunnel: u32,
    /// Whose frame goes next when epochs and tunnels both have some: they take turns.
    tunnels_next: bool,
    last_rx: Instant,
}

impl<T: Transport> Mux<T> {
    /// Takes over a WebSocket (after the welcome).
    pub fn new(ws: T, role: Role) -> Self {
        Self {
            ws,
            role,
            epochs: Vec::new(),
            tunnels: Vec::new(),
            queued: VecDeque::new(),
            highest: 0,
            highest_tunnel: 0,
            tunnels_next: false,
            last_rx: Instant::now(),
        }
    }

    /// When the peer was last heard from (any message, pongs included).
    pub fn last_rx(&self) -> Instant {
        self.last_rx
    }

    /// How many epochs are open.
    pub fn epochs(&self) -> usize {
        self.epochs.len()
    }

    /// Adds an epoch this side opened (node side).
    pub fn attach(&mut self, end: EpochEnd) {
        self.epochs.push(end);
    }

    /// How many tunnels are open.
    pub fn tunnels(&self) -> usize {
        self.tunnels.len()
    }

    /// Adds a tunnel this side opened ([`tunnel::open`], node side); its first frame asks the
    /// agent to open it.
    pub fn attach_tunnel(&mut self, end: TunnelEnd) {
        self.tunnels.push(end);
    }

    /// Queues a ping.
    pub fn ping(&mut self) {
        self.queued.push_back(WsOut::Ping);
    }

    /// Queues a report (a protobuf `SessionEnded`).
    pub fn report(&mut self, payload: &[u8]) {
        let mut b = BytesMut::with_capacity(1 + payload.len());
        b.put_u8(KIND_REPORT);
        b.put_slice(payload);
        self.queued.push_back(WsOut::Binary(b.freeze()));
    }

    /// The payloads of the reports queued but not written yet (for a link that ended, so that
    /// its owner can keep them for the next link).
    pub fn take_unsent_reports(&mut self) -> Vec<Bytes> {
        self.queued
            .drain(..)
            .filter_map(|o| match o {
                WsOut::Binary(mut b) if b.first() == Some(&KIND_REPORT) => {
                    b.advance(1);
                    Some(b)
                }
                _ => None,
            })
            .collect()
    }

    /// Drives the WebSocket until there is something to tell. Cancel-safe: nothing is lost when
    /// the future is dropped before it answers.
    pub async fn next(&mut self) -> Event {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// Writes what it can, then reads until an event or until nothing is ready.
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        if let Err(e) = self.poll_write(cx) {
            return Poll::Ready(Event::Ended(e));
        }
        loop {
            let frame = match Pin::new(&mut self.ws).poll_next(cx) {
                Poll::Pending => {
                    // Frames the reading queued (a tunnel's reset) go out now.
                    if !self.queued.is_empty()
                        && let Err(e) = self.poll_write(cx)
                    {
                        return Poll::Ready(Event::Ended(e));
                    }
                    return Poll::Pending;
                }
                Poll::Ready(None) => return Poll::Ready(Event::Ended(io::ErrorKind::UnexpectedEof.into())),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Event::Ended(e)),
                Poll::Ready(Some(Ok(WsIn::Other))) => {
                    self.last_rx = Instant::now();
                    continue;
                }
                Poll::Ready(Some(Ok(WsIn::Binary(b)))) => {
                    self.last_rx = Instant::now();
                    b
                }
            };
            if let Some(event) = self.on_frame(frame) {
                return Poll::Ready(event);
            }
        }
    }

    /// One frame read. A malformed frame is dropped (the agent's bytes are never trusted).
    fn on_frame(&mut self, mut frame: Bytes) -> Option<Event> {
        if frame.is_empty() {
            return None;
        }
        let kind = frame.get_u8();
        if kind == KIND_REPORT {
            return Some(Event::Report(frame));
        }
        if (tunnel::KIND_TUN_OPEN..=tunnel::KIND_TUN_RESET).contains(&kind) {
            return self.on_tunnel_frame(kind, frame);
        }
        if frame.len() < 4 || (kind != KIND_H2 && kind != KIND_CLOSE) {
            return None;
        }
        let id = frame.get_u32();
        let at = self.epochs.iter().position(|e| e.id == id);
        match (kind, at) {
            (KIND_CLOSE, Some(i)) => {
                // The peer's side ended: the connection reads its end; nothing more is sent.
                self.epochs.swap_remove(i);
                None
            }
            (KIND_H2, Some(i)) => {
                // A connection that is gone leaves its bytes unread; its end is seen on writes.
                let _ = self.epochs[i].to_conn.unbounded_send(frame);
                None
            }
            (KIND_H2, None) if self.role == Role::Server && id > self.highest => {
                self.highest = id;
                let (end, io) = epoch(id);
                let _ = end.to_conn.unbounded_send(frame);
                self.epochs.push(end);
                Some(Event::Accepted(io))
            }
            _ => None, // a closed or unknown epoch
        }
    }

    /// One frame of a tunnel (after its kind).
    fn on_tunnel_frame(&mut self, kind: u8, mut frame: Bytes) -> Option<Event> {
        if frame.len() < 4 {
            return None;
        }
        let id = frame.get_u32();
        let Some(i) = self.tunnels.iter().position(|t| t.id == id) else {
            if kind != tunnel::KIND_TUN_OPEN || self.role != Role::Server || id <= self.highest_tunnel {
                return None; // a tunnel that ended (its last frames may still come), or junk
            }
            self.highest_tunnel = id;
            if self.tunnels.len() >= tunnel::MAX_TUNNELS {
                let why = format!(
                    r#"{{"kind":"unavailable","message":"this link carries {} tunnels already"}}"#,
                    self.tunnels.len()
                );
                self.queued.push_back(WsOut::Binary(tunnel::frame(tunnel::KIND_TUN_RESET, id, why.as_bytes())));
                return None;
            }
            let (end, io) = tunnel::ends(id, None);
            self.tunnels.push(end);
            return Some(Event::Tunnel(Incoming::new(frame, io)));
        };
        match self.tunnels[i].on_frame(kind, frame) {
            After::Keep => {}
            After::Remove => {
                self.tunnels.swap_remove(i);
            }
            After::Reset => {
                self.tunnels.swap_remove(i);
                self.queued.push_back(WsOut::Binary(tunnel::frame(tunnel::KIND_TUN_RESET, id, &[])));
            }
        }
        None
    }

    /// Writes the queued frames, then the epochs' bytes, while the WebSocket takes them; an
    /// epoch whose connection ended is closed here (after its last bytes).
    fn poll_write(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            match Pin::new(&mut self.ws).poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Ok(()),
            }
            let next = match self.queued.pop_front() {
                Some(q) => Some(q),
                None if self.tunnels_next => self.poll_tunnels(cx).or_else(|| self.poll_epochs(cx)),
                None => self.poll_epochs(cx).or_else(|| self.poll_tunnels(cx)),
            };
            let Some(out) = next else {
                break;
            };
            self.tunnels_next = !self.tunnels_next;
            Pin::new(&mut self.ws).start_send(out)?;
        }
        match Pin::new(&mut self.ws).poll_flush(cx) {
            Poll::Ready(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// The next frame an epoch wrote; an epoch whose connection ended is removed and its close
    /// queued (and answered as the next frame).
    fn poll_epochs(&mut self, cx: &mut Context<'_>) -> Option<WsOut> {
        let mut i = 0;
        while i < self.epochs.len() {
            match Pin::new(&mut self.epochs[i].from_conn).poll_next(cx) {
                Poll::Ready(Some(b)) => return Some(WsOut::Binary(b)),
                Poll::Ready(None) => {
                    return Some(WsOut::Binary(epoch_frame(KIND_CLOSE, self.epochs.swap_remove(i).id, &[])));
                }
                Poll::Pending => i += 1,
            }
        }
        None
    }

    /// The next frame a tunnel's side made; a tunnel over once it is sent is removed.
    fn poll_tunnels(&mut self, cx: &mut Context<'_>) -> Option<WsOut> {
        for i in 0..self.tunnels.len() {
            if let Poll::Ready(Some((b, over))) = self.tunnels[i].poll_frame(cx) {
                if over {
                    self.tunnels.swap_remove(i);
                }
                return Some(WsOut::Binary(b));
            }
        }
        None
    }
}

/// A frame of epoch `id`: its kind, its number, then `payload`.
fn epoch_frame(kind: u8, id: u32, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(kind);
    b.put_u32(id);
    b.put_slice(payload);
    b.freeze()
}

/// One epoch's byte stream (an HTTP/2 connection runs on it). Reads end when the peer closed the
/// epoch or the link ended; writes fail once the link ended. Dropping it (or shutting it down)
/// closes the epoch.
#[derive(Debug)]
pub struct EpochIo {
    id: u32,
    rx: mpsc::UnboundedReceiver<Bytes>,
    tx: mpsc::Sender<Bytes>,
    pending: Bytes,
}

impl EpochIo {
    /// Its number.
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl AsyncRead for EpochIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                let chunk = self.pending.split_to(n);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut self.rx).poll_next(cx) {
                Poll::Ready(Some(b)) => self.pending = b,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

fn link_gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the link ended")
}

impl AsyncWrite for EpochIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.tx.poll_ready(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) => return Poll::Ready(Err(link_gone())),
            Poll::Pending => return Poll::Pending,
        }
        let n = buf.len().min(MAX_CHUNK);
        let frame = epoch_frame(KIND_H2, self.id, &buf[..n]);
        match self.tx.start_send(frame) {
            Ok(()) => Poll::Ready(Ok(n)),
            Err(_) => Poll::Ready(Err(link_gone())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Written frames are the mux's to send; it flushes the WebSocket as it writes.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tx.close_channel();
        Poll::Ready(Ok(()))
    }
}

impl tonic::transport::server::Connected for EpochIo {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// Lets glibc keep freed memory for the next allocations instead of giving it back to the
/// kernel at once; the node and the agent call it first thing. By default glibc returns the top
/// of a heap once 128 KiB of it is free, and maps anything from 128 KiB on by itself: a link's
/// frames, allocated and freed one per message, then cost page faults and zeroed pages on every
/// message (a tenth of the node's and the agent's time in stream-bench's profile). Memory is
/// still returned past 32 MiB free.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt with integer arguments only; it sets two of glibc's malloc parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 32 << 20);
    }
}

#[cfg(test)]
mod tests {
    use futures::SinkExt;
    use futures::StreamExt;
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// One end of an in-memory WebSocket: binary messages only.
    struct Pipe {
        rx: mpsc::Receiver<Bytes>,
        tx: mpsc::Sender<Bytes>,
    }

    impl Stream for Pipe {
        type Item = io::Result<WsIn>;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Pin::new(&mut self.rx).poll_next(cx).map(|m| m.map(|b| Ok(WsIn::Binary(b))))
        }
    }

    impl Sink<WsOut> for Pipe {
        type Error = io::Error;
        fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.tx.poll_ready(cx).map_err(io::Error::other)
        }
        fn start_send(mut self: Pin<&mut Self>, item: WsOut) -> io::Result<()> {
            match item {
                WsOut::Binary(b) => self.tx.start_send(b).map_err(io::Error::other),
                WsOut::Ping => Ok(()),
            }
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.tx).poll_flush(cx).map_err(io::Error::other)
        }
        fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.tx).poll_close(cx).map_err(io::Error::other)
        }
    }

    fn pipes() -> (Pipe, Pipe) {
        let (a_tx, b_rx) = mpsc::channel(2);
        let (b_tx, a_rx) = mpsc::channel(2);
        (Pipe { rx: a_rx, tx: a_tx }, Pipe { rx: b_rx, tx: b_tx })
    }

    /// What the test hands a driven mux.
    enum Attach {
        Epoch(EpochEnd),
        Tunnel(TunnelEnd),
        /// Asks how many tunnels it holds.
        Count(futures::channel::oneshot::Sender<usize>),
    }

    /// Drives a mux in a task; answers the events it tells, and a handle to queue reports.
    fn drive(
        mut mux: Mux<Pipe>,
        mut attach: mpsc::UnboundedReceiver<Attach>,
        mut reports: mpsc::UnboundedReceiver<Vec<u8>>,
    ) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    e = mux.next() => {
                        let ended = matches!(e, Event::Ended(_));
                        let _ = tx.unbounded_send(e);
                        if ended { return; }
                    }
                    Some(end) = attach.next() => match end {
                        Attach::Epoch(e) => mux.attach(e),
                        Attach::Tunnel(t) => mux.attach_tunnel(t),
                        Attach::Count(tx) => { let _ = tx.send(mux.tunnels()); }
                    },
                    Some(r) = reports.next() => mux.report(&r),
                }
            }
        });
        rx
    }

    #[tokio::test]
    async fn epochs_carry_bytes_both_ways_in_order_and_close() {
        let (a, b) = pipes();
        let (attach_tx, attach_rx) = mpsc::unbounded();
        let (_r1, r1) = mpsc::unbounded();
        let (r2_tx, r2) = mpsc::unbounded();
        let _client = drive(Mux::new(a, Role::Client), attach_rx, r1);
        let (_a2, a2) = mpsc::unbounded();
        let mut server = drive(Mux::new(b, Role::Server), a2, r2);
        let data: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        for id in [1, 2] {
            let (end, mut io) = epoch(id);
            attach_tx.unbounded_send(Attach::Epoch(end)).expect("attach");
            let sent = data.clone();
            let writer = tokio::spawn(async move {
                io.write_all(&sent).await.expect("write");
                let mut back = Vec::new();
                io.read_to_end(&mut back).await.expect("read back");
                back
            });
            let Some(Event::Accepted(mut served)) = server.next().await else { panic!("no epoch {id}") };
            assert_eq!(served.id(), id);
            let mut got = vec![0; data.len()];
            served.read_exact(&mut got).await.expect("read");
            assert_eq!(got, data);
            served.write_all(b"done").await.expect("answer");
            drop(served); // closes the epoch: the client reads its end
            assert_eq!(writer.await.expect("writer"), b"done");
        }
        r2_tx.unbounded_send(b"report".to_vec()).expect("report");
    }

    #[tokio::test]
    async fn reports_cross_and_malformed_or_stale_frames_are_dropped() {
        let (a, mut b) = pipes();
        let (_at, attach_rx) = mpsc::unbounded();
        let (_r, r) = mpsc::unbounded();
        let mut server = drive(Mux::new(a, Role::Server), attach_rx, r);
        for junk in [&b""[..], &[9, 1, 2][..], &[KIND_H2, 0, 0][..], &[KIND_CLOSE, 0, 0, 0, 7][..]] {
            b.tx.send(Bytes::copy_from_slice(junk)).await.expect("send");
        }
        b.tx.send(Bytes::from_static(&[KIND_H2, 0, 0, 0, 5, b'x'])).await.expect("send");
        let Some(Event::Accepted(io)) = server.next().await else { panic!("epoch 5 not served") };
        assert_eq!(io.id(), 5);
        // A lower epoch after 5 is never served.
        b.tx.send(Bytes::from_static(&[KIND_H2, 0, 0, 0, 3, b'y'])).await.expect("send");
        b.tx.send(Bytes::from_static(&[KIND_REPORT, 1, 2, 3])).await.expect("send");
        let Some(Event::Report(r)) = server.next().await else { panic!("no report") };
        assert_eq!(&r[..], &[1, 2, 3]);
        drop(b);
        assert!(matches!(server.next().await, Some(Event::Ended(_))));
    }

    /// Two muxes joined by a pipe, each driven in a task: the node's handle, the agent's
    /// handle and the agent's events.
    fn linked() -> (mpsc::UnboundedSender<Attach>, mpsc::UnboundedSender<Attach>, mpsc::UnboundedReceiver<Event>) {
        let (a, b) = pipes();
        let (node, node_rx) = mpsc::unbounded();
        let (agent, agent_rx) = mpsc::unbounded();
        let (_r1, r1) = mpsc::unbounded();
        let (_r2, r2) = mpsc::unbounded();
        let _events = drive(Mux::new(a, Role::Client), node_rx, r1);
        let events = drive(Mux::new(b, Role::Server), agent_rx, r2);
        (node, agent, events)
    }

    async fn count(side: &mpsc::UnboundedSender<Attach>) -> usize {
        let (tx, rx) = futures::channel::oneshot::channel();
        side.unbounded_send(Attach::Count(tx)).expect("count");
        rx.await.expect("counted")
    }

    async fn open(
        node: &mpsc::UnboundedSender<Attach>,
        events: &mut mpsc::UnboundedReceiver<Event>,
        id: u32,
    ) -> (TunnelIo, TunnelIo) {
        let (end, opening) = tunnel::open(id, br#"{"target":"test"}"#);
        node.unbounded_send(Attach::Tunnel(end)).expect("attach");
        let Some(Event::Tunnel(incoming)) = events.next().await else { panic!("tunnel {id} not opened") };
        assert_eq!((incoming.id(), &incoming.open[..]), (id, &br#"{"target":"test"}"#[..]));
        let served = incoming.accept();
        (opening.answer().await.expect("accepted"), served)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test]
    async fn tunnels_carry_bytes_both_ways_past_the_window_then_end() {
        let (node, agent, mut events) = linked();
        let (io, served) = open(&node, &mut events, 1).await;
        // The agent's side echoes, then ends its side.
        tokio::spawn(async move {
            let (mut r, mut w) = served.split();
            tokio::io::copy(&mut r, &mut w).await.expect("echo");
            w.shutdown().await.expect("end");
        });
        let data = pattern(5 * tunnel::WINDOW as usize + 12_345);
        let (mut r, mut w) = io.split();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&sent).await.expect("write");
            w.shutdown().await.expect("end");
        });
        let mut back = Vec::new();
        r.read_to_end(&mut back).await.expect("read back");
        assert!(back == data, "{} bytes back of {}", back.len(), data.len());
        writer.await.expect("writer");
        // Both sides ended: neither mux keeps the tunnel.
        assert_eq!((count(&node).await, count(&agent).await), (0, 0));
    }

    #[tokio::test]
    async fn a_refused_tunnel_says_why_and_is_gone() {
        let (node, agent, mut events) = linked();
        let (end, opening) = tunnel::open(7, b"{}");
        node.unbounded_send(Attach::Tunnel(end)).expect("attach");
        let Some(Event::Tunnel(incoming)) = events.next().await else { panic!("not opened") };
        incoming.refuse("computer_unsupported", "no desktop here");
        let refused = opening.answer().await.expect_err("refused");
        assert_eq!(refused, Refused { kind: "computer_unsupported".into(), message: "no desktop here".into() });
        assert_eq!((count(&node).await, count(&agent).await), (0, 0));
    }

    #[tokio::test]
    async fn a_slow_reader_holds_back_only_its_own_tunnel() {
        let (node, _agent, mut events) = linked();
        let (slow, mut slow_served) = open(&node, &mut events, 1).await;
        let (fast, fast_served) = open(&node, &mut events, 2).await;
        let big = pattern(tunnel::WINDOW as usize + 100_000);
        let sent = big.clone();
        let (_slow_r, mut slow_w) = slow.split();
        let blocked = tokio::spawn(async move { slow_w.write_all(&sent).await.map(|()| slow_w) });
        // Tunnel 2 goes on while nobody reads tunnel 1.
        tokio::spawn(async move {
            let (mut r, mut w) = fast_served.split();
            tokio::io::copy(&mut r, &mut w).await.expect("echo");
            w.shutdown().await.expect("end");
        });
        let (mut r, mut w) = fast.split();
        let small = pattern(300_000);
        w.write_all(&small).await.expect("write");
        w.shutdown().await.expect("end");
        let mut back = Vec::new();
        r.read_to_end(&mut back).await.expect("read");
        assert!(back == small);
        // Tunnel 1's writer cannot be done: more than a window is unread.
        assert!(!blocked.is_finished());
        let mut got = vec![0; big.len()];
        slow_served.read_exact(&mut got).await.expect("read the slow tunnel");
        assert!(got == big);
        blocked.await.expect("writer").expect("the writer went on once read");
    }

    #[tokio::test]
    async fn a_peer_past_the_window_is_reset_and_stray_frames_are_dropped() {
        let (a, mut b) = pipes();
        let (_at, attach_rx) = mpsc::unbounded();
        let (_r, r) = mpsc::unbounded();
        let mut events = drive(Mux::new(a, Role::Server), attach_rx, r);
        let send = |b: &mut Pipe, kind: u8, id: u32, payload: &[u8]| {
            let f = tunnel::frame(kind, id, payload);
            let mut tx = b.tx.clone();
            async move { tx.send(f).await.expect("send") }
        };
        // Data and ends of tunnels never opened, and a too short frame, are dropped.
        send(&mut b, tunnel::KIND_TUN_DATA, 3, b"x").await;
        send(&mut b, tunnel::KIND_TUN_END, 3, b"").await;
        b.tx.send(Bytes::from_static(&[tunnel::KIND_TUN_OPEN, 0, 0])).await.expect("send");
        send(&mut b, tunnel::KIND_TUN_OPEN, 5, b"{}").await;
        let Some(Event::Tunnel(incoming)) = events.next().await else { panic!("tunnel 5 not opened") };
        assert_eq!(incoming.id(), 5);
        let served = incoming.accept();
        assert_eq!(b.rx.next().await.expect("accept"), tunnel::frame(tunnel::KIND_TUN_ACCEPT, 5, b""));
        // A lower number is never opened again.
        send(&mut b, tunnel::KIND_TUN_OPEN, 4, b"{}").await;
        let chunk = vec![1u8; 256 * 1024];
        for _ in 0..tunnel::WINDOW / chunk.len() as u64 {
            send(&mut b, tunnel::KIND_TUN_DATA, 5, &chunk).await;
        }
        send(&mut b, tunnel::KIND_TUN_DATA, 5, b"!").await; // one byte past the window
        assert_eq!(b.rx.next().await.expect("reset"), tunnel::frame(tunnel::KIND_TUN_RESET, 5, b""));
        // The reader gets what came within the window, then learns of the reset.
        let (mut r, _w) = served.split();
        let mut got = Vec::new();
        let e = r.read_to_end(&mut got).await.expect_err("reset");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        assert_eq!(got.len() as u64, tunnel::WINDOW);
    }

    #[tokio::test]
    async fn a_tunnel_fails_both_ways_when_its_link_ends() {
        let (a, mut b) = pipes();
        let (node, node_rx) = mpsc::unbounded();
        let (_r, r) = mpsc::unbounded();
        let mut events = drive(Mux::new(a, Role::Client), node_rx, r);
        let (end, opening) = tunnel::open(1, b"{}");
        node.unbounded_send(Attach::Tunnel(end)).expect("attach");
        assert_eq!(b.rx.next().await.expect("open"), tunnel::frame(tunnel::KIND_TUN_OPEN, 1, b"{}"));
        b.tx.send(tunnel::frame(tunnel::KIND_TUN_ACCEPT, 1, b"")).await.expect("accept");
        let (mut r, mut w) = opening.answer().await.expect("accepted").split();
        // More than the window and the pipe hold: the writer waits, then fails with the link.
        let writer = tokio::spawn(async move { w.write_all(&pattern(2 * tunnel::WINDOW as usize)).await });
        drop(b);
        assert!(matches!(events.next().await, Some(Event::Ended(_))));
        assert_eq!(writer.await.expect("writer").expect_err("link gone").kind(), io::ErrorKind::BrokenPipe);
        let mut got = Vec::new();
        assert_eq!(r.read_to_end(&mut got).await.expect_err("link gone").kind(), io::ErrorKind::ConnectionReset);
    }

    #[tokio::test]
    async fn an_answer_written_before_a_reader_drops_arrives_before_the_reset() {
        let (node, agent, mut events) = linked();
        let (io, served) = open(&node, &mut events, 1).await;
        let (mut r, mut w) = io.split();
        // The node keeps sending; the agent answers early, ends its side and stops reading.
        let sender = tokio::spawn(async move {
            let chunk = pattern(64 * 1024);
            loop {
                if let Err(e) = w.write_all(&chunk).await {
                    return e.kind();
                }
            }
        });
        let (served_r, mut served_w) = served.split();
        served_w.write_all(b"{\"error\":\"no room\"}").await.expect("answer");
        served_w.shutdown().await.expect("end");
        drop(served_r);
        let mut answer = Vec::new();
        r.read_to_end(&mut answer).await.expect("the answer, then the end");
        assert_eq!(answer, b"{\"error\":\"no room\"}");
        assert_eq!(sender.await.expect("sender"), io::ErrorKind::BrokenPipe);
        assert_eq!((count(&node).await, count(&agent).await), (0, 0));
    }

    #[tokio::test]
    async fn bytes_that_cross_a_readers_drop_never_cost_the_answer() {
        // The agent's side answers, ends and drops its reader while the pipe to the node is full;
        // the node's bytes already on their way arrive after the drop. The answer still goes out
        // first, then the end, then the reset.
        let (a, mut b) = pipes();
        let (_at, attach_rx) = mpsc::unbounded();
        let (_r, r) = mpsc::unbounded();
        let mut events = drive(Mux::new(a, Role::Server), attach_rx, r);
        b.tx.send(tunnel::frame(tunnel::KIND_TUN_OPEN, 1, b"{}")).await.expect("open");
        let Some(Event::Tunnel(incoming)) = events.next().await else { panic!("tunnel 1 not opened") };
        let (served_r, mut served_w) = incoming.accept().split();
        // The node reads nothing yet: these fill the pipe, so the answer waits in the mux.
        let filler = vec![7u8; 1024];
        for _ in 0..4 {
            served_w.write_all(&filler).await.expect("filler");
        }
        served_w.write_all(b"{\"error\":\"a directory\"}").await.expect("answer");
        served_w.shutdown().await.expect("end");
        drop(served_r);
        b.tx.send(tunnel::frame(tunnel::KIND_TUN_DATA, 1, b"late bytes")).await.expect("data");
        let mut frames = Vec::new();
        while let Some(f) = b.rx.next().await {
            let done = f.first() == Some(&tunnel::KIND_TUN_RESET);
            frames.push(f);
            if done {
                break;
            }
        }
        let answer = tunnel::frame(tunnel::KIND_TUN_DATA, 1, b"{\"error\":\"a directory\"}");
        let at = frames.iter().position(|f| *f == answer).expect("the answer went out");
        assert_eq!(frames[0], tunnel::frame(tunnel::KIND_TUN_ACCEPT, 1, b""));
        assert_eq!(frames[at + 1], tunnel::frame(tunnel::KIND_TUN_END, 1, b""));
        assert_eq!(frames[at + 2], tunnel::frame(tunnel::KIND_TUN_RESET, 1, b""));
        assert_eq!(frames.len(), at + 3);
    }
}
