//! Byte tunnels on a link: a connection to a Computer's port, a person's desktop stream, a copy.
//! A tunnel's bytes travel in frames of their own, beside the HTTP/2 epochs, so a tunnel costs
//! no HTTP/2 stream, no gRPC message and no protobuf encoding: each byte is copied once into its
//! frame on the sending side and handed on as it came on the receiving side.
//!
//! | kind | layout | meaning |
//! |---|---|---|
//! | [`KIND_TUN_OPEN`] | kind, id (u32 BE), what to open (JSON) | the node opens tunnel `id` |
//! | [`KIND_TUN_ACCEPT`] | kind, id | the agent opened what was asked |
//! | [`KIND_TUN_DATA`] | kind, id, bytes | bytes, within the receiver's window |
//! | [`KIND_TUN_END`] | kind, id | the sender writes no more (a half-close) |
//! | [`KIND_TUN_CREDIT`] | kind, id, n (u32 BE) | the receiver consumed `n` more bytes |
//! | [`KIND_TUN_RESET`] | kind, id, why (JSON `{"kind", "message"}`, or nothing) | the tunnel is over, both ways |
//!
//! Flow control: each side may have at most [`WINDOW`] bytes of a tunnel unconsumed at its peer.
//! A receiver that consumed a quarter window gives it back ([`KIND_TUN_CREDIT`]); a sender with no
//! credit waits. The mux never waits on a tunnel, so one slow reader holds back only its own
//! tunnel, never the link; a peer that sends past the window has its tunnel reset (the peer's
//! bytes are never trusted).
//!
//! The node numbers tunnels upwards and the agent opens only numbers above the last it saw. A
//! tunnel ends when both sides sent [`KIND_TUN_END`], when either resets it, or with the link.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::task::Context;
use std::task::Poll;
use std::task::Waker;

use bytes::BufMut;
use bytes::Bytes;
use bytes::BytesMut;
use futures::Sink;
use futures::Stream;
use futures::channel::mpsc;
use futures::channel::oneshot;
use tokio::io::AsyncRead;
use tokio::io::AsyncWrite;
use tokio::io::ReadBuf;

/// The node opens a tunnel.
pub const KIND_TUN_OPEN: u8 = 3;
/// The agent opened what a tunnel asked for.
pub const KIND_TUN_ACCEPT: u8 = 4;
/// A tunnel's bytes.
pub const KIND_TUN_DATA: u8 = 5;
/// One side of a tunnel writes no more.
pub const KIND_TUN_END: u8 = 6;
/// Bytes the receiver consumed, for the sender to send again.
pub const KIND_TUN_CREDIT: u8 = 7;
/// A tunnel is over (or was refused).
pub const KIND_TUN_RESET: u8 = 8;

/// Bytes a side may send ahead of its peer's reading.
pub const WINDOW: u64 = 2 << 20;
/// Consumed bytes are given back once this many add up.
const CREDIT_STEP: u64 = WINDOW / 4;
/// The largest frame of a tunnel's bytes.
const MAX_DATA: usize = 1024 * 1024;
/// Frames a tunnel may have waiting for the WebSocket before its writes wait.
const QUEUE: usize = 8;
/// Tunnels a link carries at once (an agent refuses more).
pub const MAX_TUNNELS: usize = 4096;

/// A frame of tunnel `id` (its kind, its number, then `payload`).
pub(super) fn frame(kind: u8, id: u32, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(kind);
    b.put_u32(id);
    b.put_slice(payload);
    b.freeze()
}

/// Why a tunnel was refused or reset, as the reset frame carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The error kind's string form (`crate::ErrorKind::as_str`), or empty when the link ended.
    pub kind: String,
    /// What the refusing side said.
    pub message: String,
}

impl Refused {
    fn from_payload(payload: &[u8]) -> Self {
        let v: serde_json::Value = serde_json::from_slice(payload).unwrap_or_default();
        Self {
            kind: v["kind"].as_str().unwrap_or("").chars().take(64).collect(),
            message: v["message"].as_str().unwrap_or("the tunnel was reset").chars().take(1024).collect(),
        }
    }

    /// The refusal of a tunnel whose link ended.
    pub fn link_ended() -> Self {
        Self { kind: String::new(), message: "the agent's link ended".into() }
    }
}

/// What both ends of a tunnel and the mux share.
#[derive(Debug, Default)]
struct Shared {
    send: Mutex<Credit>,
    /// Bytes received and not given back yet (the peer's use of our window).
    unconsumed: AtomicU64,
    /// The peer ended its side cleanly.
    peer_ended: AtomicBool,
    /// This side's writer was cut short (reset, not ended): no end frame goes before the reset.
    aborted: AtomicBool,
}

#[derive(Debug, Default)]
struct Credit {
    /// Bytes this side may still send.
    avail: u64,
    /// The tunnel was reset or the link ended: writes fail.
    reset: bool,
    waker: Option<Waker>,
}

impl Shared {
    fn new() -> Arc<Self> {
        Arc::new(Self { send: Mutex::new(Credit { avail: WINDOW, reset: false, waker: None }), ..Default::default() })
    }

    fn credit(&self) -> std::sync::MutexGuard<'_, Credit> {
        self.send.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn grant(&self, n: u64) {
        let mut c = self.credit();
        c.avail = c.avail.saturating_add(n).min(4 * WINDOW);
        if let Some(w) = c.waker.take() {
            w.wake();
        }
    }

    fn reset(&self) {
        let mut c = self.credit();
        c.reset = true;
        if let Some(w) = c.waker.take() {
            w.wake();
        }
    }
}

/// The mux's end of one tunnel.
#[derive(Debug)]
pub struct TunnelEnd {
    pub(super) id: u32,
    /// The peer's bytes, to the reader; none once the peer ended its side.
    to_reader: Option<mpsc::UnboundedSender<Bytes>>,
    /// Frames the writer made (data, and its end when the channel closes).
    from_writer: mpsc::Receiver<Bytes>,
    /// Credits and resets of this side, written before its data.
    ctl: mpsc::UnboundedReceiver<Bytes>,
    shared: Arc<Shared>,
    /// The opener's wait for the agent's answer (node side, until it comes).
    answer: Option<oneshot::Sender<Result<(), Refused>>>,
    /// This side's end was sent.
    pub(super) sent_end: bool,
    /// This side reset the tunnel: sent once what the writer had written is.
    reset: Option<Bytes>,
}

impl Drop for TunnelEnd {
    fn drop(&mut self) {
        // Writes waiting for credit learn that none will come.
        self.shared.reset();
    }
}

/// What the mux does after a frame of a tunnel.
pub(super) enum After {
    /// Nothing more.
    Keep,
    /// The tunnel is over: remove it.
    Remove,
    /// The peer broke the tunnel's rules or its reader is gone: reset it and remove it.
    Reset,
}

impl TunnelEnd {
    /// A frame of the peer for this tunnel (its kind, and what follows the id).
    pub(super) fn on_frame(&mut self, kind: u8, payload: Bytes) -> After {
        match kind {
            KIND_TUN_ACCEPT => {
                if let Some(a) = self.answer.take() {
                    let _ = a.send(Ok(()));
                }
                After::Keep
            }
            KIND_TUN_DATA => {
                let Some(to) = &self.to_reader else { return After::Reset }; // data after its end
                if self.answer.is_some() {
                    return After::Reset; // data before the answer
                }
                let n = payload.len() as u64;
                if self.shared.unconsumed.fetch_add(n, Ordering::AcqRel) + n > WINDOW {
                    return After::Reset;
                }
                if to.unbounded_send(payload).is_err() {
                    // The reader was dropped before the peer's end: its drop queued a reset,
                    // which goes out after what the writer wrote (an answer must not be lost
                    // to bytes that were already on their way). These are dropped unread.
                    self.shared.unconsumed.fetch_sub(n, Ordering::AcqRel);
                }
                After::Keep
            }
            KIND_TUN_END => {
                self.shared.peer_ended.store(true, Ordering::Release);
                self.to_reader = None;
                if self.sent_end { After::Remove } else { After::Keep }
            }
            KIND_TUN_CREDIT => {
                if payload.len() == 4 {
                    let n = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                    self.shared.grant(u64::from(n));
                }
                After::Keep
            }
            KIND_TUN_RESET => {
                if let Some(a) = self.answer.take() {
                    let _ = a.send(Err(Refused::from_payload(&payload)));
                }
                After::Remove
            }
            _ => After::Keep,
        }
    }

    /// The next frame this side sends: its credits and resets first, then its data; the
    /// writer's end becomes an end frame. The bool says the tunnel is over once it is sent.
    pub(super) fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<(Bytes, bool)>> {
        if self.reset.is_none()
            && let Poll::Ready(Some(f)) = Pin::new(&mut self.ctl).poll_next(cx)
        {
            if f.first() != Some(&KIND_TUN_RESET) {
                return Poll::Ready(Some((f, false)));
            }
            self.reset = Some(f);
        }
        if let Some(reset) = &self.reset {
            // What the writer wrote before the reset goes first (an answer, then the reader's
            // drop: the peer reads the answer); nothing it writes after.
            if !self.sent_end {
                match Pin::new(&mut self.from_writer).poll_next(cx) {
                    Poll::Ready(Some(f)) => return Poll::Ready(Some((f, false))),
                    Poll::Ready(None) if !self.shared.aborted.load(Ordering::Acquire) => {
                        self.sent_end = true;
                        return Poll::Ready(Some((frame(KIND_TUN_END, self.id, &[]), false)));
                    }
                    _ => {}
                }
            }
            return Poll::Ready(Some((reset.clone(), true)));
        }
        if self.sent_end {
            return Poll::Pending;
        }
        match Pin::new(&mut self.from_writer).poll_next(cx) {
            Poll::Ready(Some(f)) => Poll::Ready(Some((f, false))),
            Poll::Ready(None) => {
                self.sent_end = true;
                Poll::Ready(Some((frame(KIND_TUN_END, self.id, &[]), self.to_reader.is_none())))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A tunnel being opened by the node: wait for the agent's answer with [`Opening::answer`].
#[derive(Debug)]
pub struct Opening {
    io: TunnelIo,
    answer: oneshot::Receiver<Result<(), Refused>>,
}

impl Opening {
    /// The tunnel once the agent accepted it, or why not.
    pub async fn answer(self) -> Result<TunnelIo, Refused> {
        match self.answer.await {
            Ok(Ok(())) => Ok(self.io),
            Ok(Err(r)) => Err(r),
            Err(_) => Err(Refused::link_ended()),
        }
    }
}

/// Makes tunnel `id` on the node's side: the mux's end ([`super::Mux::attach_tunnel`]), and
/// the opening whose first frame asks the agent for `open`.
pub fn open(id: u32, open: &[u8]) -> (TunnelEnd, Opening) {
    let (mut end, io) = ends(id, Some(frame(KIND_TUN_OPEN, id, open)));
    let (tx, rx) = oneshot::channel();
    end.answer = Some(tx);
    (end, Opening { io, answer: rx })
}

/// The two ends of tunnel `id`; `first` goes out before anything the writer writes.
pub(super) fn ends(id: u32, first: Option<Bytes>) -> (TunnelEnd, TunnelIo) {
    let (to_reader, rx) = mpsc::unbounded();
    let (mut tx, from_writer) = mpsc::channel(QUEUE);
    if let Some(f) = first {
        // A new channel has room for one message per sender.
        let _ = tx.try_send(f);
    }
    let (ctl_tx, ctl) = mpsc::unbounded();
    let shared = Shared::new();
    let end = TunnelEnd {
        id,
        to_reader: Some(to_reader),
        from_writer,
        ctl,
        shared: shared.clone(),
        answer: None,
        sent_end: false,
        reset: None,
    };
    let reader = TunnelReader {
        id,
        rx,
        ctl: ctl_tx.clone(),
        shared: shared.clone(),
        consumed: 0,
        pending: Bytes::new(),
        done: false,
    };
    let writer = TunnelWriter { id, tx, ctl: ctl_tx.clone(), shared, pending: Bytes::new() };
    (end, TunnelIo { reader, writer, ctl: ctl_tx })
}

/// A tunnel the node opened, as the agent receives it: accept it or refuse it.
#[derive(Debug)]
pub struct Incoming {
    /// What the node asked to open (JSON).
    pub open: Bytes,
    io: TunnelIo,
}

impl Incoming {
    pub(super) fn new(open: Bytes, io: TunnelIo) -> Self {
        Self { open, io }
    }

    /// Its number.
    pub fn id(&self) -> u32 {
        self.io.reader.id
    }

    /// Tells the node the tunnel is open; its bytes flow from now on.
    pub fn accept(self) -> TunnelIo {
        let _ = self.io.ctl.unbounded_send(frame(KIND_TUN_ACCEPT, self.io.reader.id, &[]));
        self.io
    }

    /// Tells the node why the tunnel is not opened (`kind` is an error kind's string form).
    pub fn refuse(self, kind: &str, message: &str) {
        self.io.reset(kind, message);
    }
}

/// One tunnel's byte stream, both ways. [`TunnelIo::split`] gives its halves. Dropping the reader
/// before the peer's end resets the tunnel; dropping (or closing) the writer ends this side.
#[derive(Debug)]
pub struct TunnelIo {
    reader: TunnelReader,
    writer: TunnelWriter,
    ctl: mpsc::UnboundedSender<Bytes>,
}

impl TunnelIo {
    /// The reading and the writing half.
    pub fn split(self) -> (TunnelReader, TunnelWriter) {
        (self.reader, self.writer)
    }

    /// Ends the tunnel both ways at once, telling the peer why.
    pub fn reset(mut self, kind: &str, message: &str) {
        let why = serde_json::json!({"kind": kind, "message": message}).to_string();
        self.writer.shared.aborted.store(true, Ordering::Release);
        let _ = self.ctl.unbounded_send(frame(KIND_TUN_RESET, self.reader.id, why.as_bytes()));
        self.reader.done = true; // the reset is sent: the reader's drop sends no other
    }
}

/// The reading half: the peer's bytes, as a stream of chunks or through `AsyncRead`. It ends
/// when the peer ended its side (or, for `AsyncRead` with an error, when the tunnel was reset).
#[derive(Debug)]
pub struct TunnelReader {
    id: u32,
    rx: mpsc::UnboundedReceiver<Bytes>,
    ctl: mpsc::UnboundedSender<Bytes>,
    shared: Arc<Shared>,
    /// Bytes consumed and not given back yet.
    consumed: u64,
    /// What `AsyncRead` has not handed out yet of the last chunk.
    pending: Bytes,
    /// The peer's end was read (or a reset sent): the drop sends nothing.
    done: bool,
}

impl TunnelReader {
    /// True once the peer ended its side cleanly: a reader that ended otherwise was reset (or
    /// its link ended), and what it read may be cut short.
    pub fn ended_cleanly(&self) -> bool {
        self.shared.peer_ended.load(Ordering::Acquire)
    }

    fn consume(&mut self, n: usize) {
        self.consumed += n as u64;
        if self.consumed >= CREDIT_STEP {
            // Taken off before the peer hears of it: its next bytes always fit.
            self.shared.unconsumed.fetch_sub(self.consumed, Ordering::AcqRel);
            let n = u32::try_from(self.consumed).unwrap_or(u32::MAX);
            let _ = self.ctl.unbounded_send(frame(KIND_TUN_CREDIT, self.id, &n.to_be_bytes()));
            self.consumed = 0;
        }
    }

    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        match Pin::new(&mut self.rx).poll_next(cx) {
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            other => other,
        }
    }
}

impl Drop for TunnelReader {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.ctl.unbounded_send(frame(KIND_TUN_RESET, self.id, &[]));
        }
    }
}

impl Stream for TunnelReader {
    type Item = Bytes;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let me = &mut *self;
        if !me.pending.is_empty() {
            let b = std::mem::take(&mut me.pending);
            me.consume(b.len());
            return Poll::Ready(Some(b));
        }
        let b = std::task::ready!(me.poll_chunk(cx));
        if let Some(b) = &b {
            me.consume(b.len());
        }
        Poll::Ready(b)
    }
}

impl AsyncRead for TunnelReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = &mut *self;
        while me.pending.is_empty() {
            match std::task::ready!(me.poll_chunk(cx)) {
                Some(b) => me.pending = b,
                None if !me.shared.peer_ended.load(Ordering::Acquire) => {
                    return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
                }
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = me.pending.len().min(buf.remaining());
        buf.put_slice(&me.pending.split_to(n));
        me.consume(n);
        Poll::Ready(Ok(()))
    }
}

/// The writing half: as a `Sink` of chunks or through `AsyncWrite`. Writes wait for the peer's
/// credit; they fail once the tunnel was reset or the link ended.
#[derive(Debug)]
pub struct TunnelWriter {
    id: u32,
    tx: mpsc::Sender<Bytes>,
    ctl: mpsc::UnboundedSender<Bytes>,
    shared: Arc<Shared>,
    /// A chunk given to the sink and not all framed yet.
    pending: Bytes,
}

fn broken() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the tunnel was reset or its link ended")
}

impl TunnelWriter {
    /// Ends the tunnel both ways (after what was written): the peer learns that this side's
    /// bytes were cut short, not ended.
    pub fn abort(self) {
        self.shared.aborted.store(true, Ordering::Release);
        let _ = self.ctl.unbounded_send(frame(KIND_TUN_RESET, self.id, &[]));
    }

    /// Room for one frame of at most `want` bytes: how many it may carry.
    fn poll_room(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        {
            let mut c = self.shared.credit();
            if c.reset {
                return Poll::Ready(Err(broken()));
            }
            if c.avail == 0 {
                c.waker = Some(cx.waker().clone());
                return Poll::Pending;
            }
        }
        match self.tx.poll_ready(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) => return Poll::Ready(Err(broken())),
            Poll::Pending => return Poll::Pending,
        }
        let avail = self.shared.credit().avail;
        Poll::Ready(Ok(want.min(MAX_DATA).min(usize::try_from(avail).unwrap_or(usize::MAX))))
    }

    /// Frames `data` (which fits the room just granted) and takes its credit.
    fn frame_out(&mut self, data: &[u8]) -> io::Result<()> {
        self.shared.credit().avail -= data.len() as u64;
        self.tx.start_send(frame(KIND_TUN_DATA, self.id, data)).map_err(|_| broken())
    }

    /// Ends this side once what is pending is framed (the mux then sends the end frame).
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_drain(cx))?;
        self.tx.close_channel();
        Poll::Ready(Ok(()))
    }

    /// Frames what is pending, as credit and the queue allow.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let n = std::task::ready!(self.poll_room(cx, self.pending.len()))?;
            let chunk = self.pending.split_to(n);
            self.frame_out(&chunk)?;
        }
        Poll::Ready(Ok(()))
    }
}

impl Sink<Bytes> for TunnelWriter {
    type Error = io::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_drain(cx)
    }

    fn start_send(mut self: Pin<&mut Self>, item: Bytes) -> io::Result<()> {
        self.pending = item;
        Ok(())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_drain(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_end(cx)
    }
}

impl AsyncWrite for TunnelWriter {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_drain(cx))?;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = std::task::ready!(self.poll_room(cx, buf.len()))?;
        self.frame_out(&buf[..n])?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Framed bytes are the mux's to send; it flushes the WebSocket as it writes.
        self.poll_drain(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_end(cx)
    }
}

impl AsyncRead for TunnelIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for TunnelIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.writer).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        AsyncWrite::poll_flush(Pin::new(&mut self.writer), cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_shutdown(cx)
    }
}
