//! A scripted RFB (VNC) client over a WebSocket, as noVNC speaks it: the handshake (RFB 3.8,
//! security `None`), a raw-encoded framebuffer update, and key and pointer events.

use futures::SinkExt;
use futures::StreamExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A connected viewer.
pub struct Viewer {
    ws: Ws,
    buf: Vec<u8>,
    /// The screen's size from ServerInit.
    pub width: u16,
    /// The screen's size from ServerInit.
    pub height: u16,
}

/// Why a connection did not open: the HTTP status of a refused upgrade, or another failure.
#[derive(Debug)]
pub enum Refused {
    /// The server answered this status instead of switching protocols.
    Status(u16),
    /// Anything else.
    Other(String),
}

impl Viewer {
    /// Opens `url` (`ws://…/desktop/websockify`) with `cookie` and does the handshake.
    pub async fn connect(url: &str, cookie: &str) -> Result<Viewer, Refused> {
        let mut req = url.into_client_request().map_err(|e| Refused::Other(e.to_string()))?;
        req.headers_mut().insert(
            "cookie",
            format!("computerd_stream={cookie}").parse().map_err(|_| Refused::Other("cookie".into()))?,
        );
        req.headers_mut()
            .insert("sec-websocket-protocol", "binary".parse().map_err(|_| Refused::Other("proto".into()))?);
        let (ws, _) = tokio_tungstenite::connect_async(req).await.map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(r) => Refused::Status(r.status().as_u16()),
            e => Refused::Other(e.to_string()),
        })?;
        let mut v = Viewer { ws, buf: Vec::new(), width: 0, height: 0 };
        let version = v.read(12).await;
        assert!(version.starts_with(b"RFB 003."), "{version:?}");
        v.send(b"RFB 003.008\n").await;
        let n = v.read(1).await[0] as usize;
        let types = v.read(n).await;
        assert!(types.contains(&1), "security None is offered: {types:?}");
        v.send(&[1]).await;
        assert_eq!(v.read(4).await, vec![0, 0, 0, 0], "security result OK");
        v.send(&[1]).await; // ClientInit: shared
        let init = v.read(24).await;
        v.width = u16::from_be_bytes([init[0], init[1]]);
        v.height = u16::from_be_bytes([init[2], init[3]]);
        let name_len = u32::from_be_bytes([init[20], init[21], init[22], init[23]]) as usize;
        v.read(name_len).await;
        // Raw encoding only, so an update can be read without decoding anything else.
        v.send(&[2, 0, 0, 1, 0, 0, 0, 0]).await;
        Ok(v)
    }

    async fn send(&mut self, b: &[u8]) {
        self.ws.send(Message::Binary(b.to_vec().into())).await.expect("send to the stream");
    }

    async fn read(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            match tokio::time::timeout(std::time::Duration::from_secs(30), self.ws.next()).await {
                Ok(Some(Ok(Message::Binary(b)))) => self.buf.extend_from_slice(&b),
                Ok(Some(Ok(_))) => {}
                other => panic!("the stream ended while {n} bytes were awaited: {other:?}"),
            }
        }
        self.buf.drain(..n).collect()
    }

    /// Reads `n` bytes and drops them (a frame's pixels: no copy of what is not kept).
    async fn skip(&mut self, mut n: usize) {
        let k = n.min(self.buf.len());
        self.buf.drain(..k);
        n -= k;
        while n > 0 {
            match tokio::time::timeout(std::time::Duration::from_secs(30), self.ws.next()).await {
                Ok(Some(Ok(Message::Binary(b)))) if b.len() <= n => n -= b.len(),
                Ok(Some(Ok(Message::Binary(b)))) => {
                    self.buf.extend_from_slice(&b[n..]);
                    n = 0;
                }
                Ok(Some(Ok(_))) => {}
                other => panic!("the stream ended while {n} bytes were awaited: {other:?}"),
            }
        }
    }

    /// Asks for the whole screen and reads one update: answers its rectangles' total pixels.
    /// x11vnc handles a client's messages in order, so once this answers, every event sent
    /// before it was handled (or dropped).
    pub async fn update(&mut self) -> u64 {
        let (w, h) = (self.width.to_be_bytes(), self.height.to_be_bytes());
        self.send(&[3, 0, 0, 0, 0, 0, w[0], w[1], h[0], h[1]]).await;
        loop {
            let kind = self.read(1).await[0];
            match kind {
                0 => {
                    let head = self.read(3).await;
                    let rects = u16::from_be_bytes([head[1], head[2]]);
                    let mut pixels = 0u64;
                    for _ in 0..rects {
                        let r = self.read(12).await;
                        let (rw, rh) =
                            (u16::from_be_bytes([r[4], r[5]]) as usize, u16::from_be_bytes([r[6], r[7]]) as usize);
                        let enc = i32::from_be_bytes([r[8], r[9], r[10], r[11]]);
                        assert_eq!(enc, 0, "raw encoding only");
                        self.skip(rw * rh * 4).await;
                        pixels += (rw * rh) as u64;
                    }
                    return pixels;
                }
                // Bell, or a server cut text (its length follows).
                2 => {}
                3 => {
                    let head = self.read(7).await;
                    let n = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
                    self.read(n).await;
                }
                k => panic!("unexpected server message {k}"),
            }
        }
    }

    /// Presses and releases the keys of `keysyms`.
    pub async fn keys(&mut self, keysyms: &[u32]) {
        for k in keysyms {
            let b = k.to_be_bytes();
            self.send(&[4, 1, 0, 0, b[0], b[1], b[2], b[3]]).await;
            self.send(&[4, 0, 0, 0, b[0], b[1], b[2], b[3]]).await;
        }
    }

    /// Clicks the left button at (x, y).
    pub async fn click(&mut self, x: u16, y: u16) {
        let (x, y) = (x.to_be_bytes(), y.to_be_bytes());
        self.send(&[5, 1, x[0], x[1], y[0], y[1]]).await;
        self.send(&[5, 0, x[0], x[1], y[0], y[1]]).await;
    }

    /// Closes the stream.
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}
