//! A byte stream over a message transport (a WebSocket's binary messages), so HTTP/2 (tonic) can
//! run over the agent's one link: each write is one message; reads concatenate messages.

use std::io;
use std::pin::Pin;
use std::task::Context;
use std::task::Poll;

use bytes::Bytes;
use futures::Sink;
use futures::Stream;
use tokio::io::AsyncRead;
use tokio::io::AsyncWrite;
use tokio::io::ReadBuf;

/// Incoming binary payloads; `None` ends the stream.
pub type MessageRx = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;
/// Outgoing binary payloads.
pub type MessageTx = Pin<Box<dyn Sink<Bytes, Error = io::Error> + Send>>;

/// An `AsyncRead + AsyncWrite` over a message stream and sink.
pub struct MessageIo {
    rx: MessageRx,
    tx: MessageTx,
    pending: Bytes,
    closed: Option<tokio::sync::oneshot::Sender<()>>,
}

impl MessageIo {
    /// Joins a receiving and a sending half.
    pub fn new(rx: MessageRx, tx: MessageTx) -> Self {
        Self { rx, tx, pending: Bytes::new(), closed: None }
    }

    /// A receiver that completes when this stream is dropped (its connection ended).
    pub fn close_signal(&mut self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.closed = Some(tx);
        rx
    }
}

impl Drop for MessageIo {
    fn drop(&mut self) {
        if let Some(tx) = self.closed.take() {
            let _ = tx.send(());
        }
    }
}

impl AsyncRead for MessageIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                let chunk = self.pending.split_to(n);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            match self.rx.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(b))) => self.pending = b,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl AsyncWrite for MessageIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.tx.as_mut().poll_ready(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => return Poll::Pending,
        }
        let n = buf.len().min(256 * 1024);
        self.tx.as_mut().start_send(Bytes::copy_from_slice(&buf[..n]))?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tx.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tx.as_mut().poll_close(cx)
    }
}

impl tonic::transport::server::Connected for MessageIo {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use futures::SinkExt;
    use futures::StreamExt;
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn bytes_cross_in_order_and_eof_ends_reads() {
        let (a_tx, b_rx) = futures::channel::mpsc::channel::<Bytes>(4);
        let (b_tx, a_rx) = futures::channel::mpsc::channel::<Bytes>(4);
        let io = |rx: futures::channel::mpsc::Receiver<Bytes>, tx: futures::channel::mpsc::Sender<Bytes>| {
            MessageIo::new(Box::pin(rx.map(Ok)), Box::pin(tx.sink_map_err(io::Error::other)))
        };
        let mut a = io(a_rx, a_tx);
        let mut b = io(b_rx, b_tx);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            a.write_all(&sent).await.expect("write");
            a.shutdown().await.expect("close");
        });
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.expect("read");
        writer.await.expect("writer");
        assert_eq!(got, data);
    }
}
