//! A port of the Computer reached from its public address: one tunnel through the agent's link
//! per connection the node makes, to `127.0.0.1:<port>` here. The node has already checked the
//! address (its label, the exposer's rights) at a current read; the agent only opens the
//! connection, and only when its owner allowed ports (`--ports`: the Docker provider sets it
//! for sandboxes; a paired machine never does by default).
//!
//! The tunnel's first message is `{"target": "port", "port": N}`.

use std::time::Duration;

use computerd_proto::ErrorKind;
use futures::Stream;
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;

/// How long connecting to the port may take.
const CONNECT: Duration = Duration::from_secs(10);

/// Bytes read from the port at once.
const CHUNK: usize = 64 * 1024;

/// Connects to `127.0.0.1:<port>`, else `[::1]:<port>`.
pub async fn connect(port: u16) -> Result<tokio::net::TcpStream, (ErrorKind, String)> {
    if port == 0 {
        return Err((ErrorKind::InvalidRequest, "a port is 1 to 65535".into()));
    }
    let failed = |e: String| {
        (ErrorKind::ComputerExecutionFailed, format!("nothing answers on port {port} in the computer: {e}"))
    };
    let v4 = tokio::time::timeout(CONNECT, tokio::net::TcpStream::connect(("127.0.0.1", port))).await;
    match v4 {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e4)) => match tokio::time::timeout(CONNECT, tokio::net::TcpStream::connect(("::1", port))).await {
            Ok(Ok(s)) => Ok(s),
            _ => Err(failed(e4.to_string())),
        },
        Err(_) => Err(failed("the connection timed out".into())),
    }
}

/// Carries bytes both ways until either side ends: the node's into the socket, the socket's
/// to `to_node` (in chunks of at most 64 KiB). A half-close from the node is passed on.
pub async fn pump<I>(sock: tokio::net::TcpStream, from_node: I, to_node: futures::channel::mpsc::Sender<Vec<u8>>)
where
    I: Stream<Item = Vec<u8>> + Send + Unpin,
{
    let _ = sock.set_nodelay(true);
    let (mut rd, mut wr) = sock.into_split();
    let up = async move {
        let mut from_node = from_node;
        while let Some(data) = from_node.next().await {
            if wr.write_all(&data).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    };
    let down = async move {
        use futures::SinkExt;
        let mut to_node = to_node;
        let mut buf = vec![0u8; CHUNK];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_node.send(buf[..n].to_vec()).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    // Both directions run to their ends: a request fully sent (the node's half-close) still
    // gets its whole answer.
    tokio::join!(up, down);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_go_both_ways_and_a_closed_port_says_so() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.expect("read");
            got.reverse();
            s.write_all(&got).await.expect("write");
        });
        let sock = connect(port).await.expect("connect");
        let (tx, rx) = futures::channel::mpsc::channel(4);
        let from_node = futures::stream::iter(vec![b"ab".to_vec(), b"cd".to_vec()]);
        tokio::spawn(pump(sock, from_node, tx));
        let back: Vec<u8> = rx.collect::<Vec<_>>().await.concat();
        assert_eq!(back, b"dcba");
        // A port with nothing listening (the one just used is closed now).
        let free = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let closed = free.local_addr().expect("addr").port();
        drop(free);
        let (kind, why) = connect(closed).await.expect_err("nothing listens");
        assert_eq!(kind, ErrorKind::ComputerExecutionFailed);
        assert!(why.contains(&closed.to_string()), "{why}");
        assert_eq!(connect(0).await.expect_err("port 0").0, ErrorKind::InvalidRequest);
    }
}
