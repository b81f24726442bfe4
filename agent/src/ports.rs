//! A port of the Computer reached from its public address: one tunnel through the agent's link
//! per connection the node makes, to `127.0.0.1:<port>` here. The node has already checked the
//! address (its label, the exposer's rights) at a current read; the agent only opens the
//! connection, and only when its owner allowed ports (`--ports`: the Docker provider sets it
//! for sandboxes; a paired machine never does by default).
//!
//! The tunnel's first message is `{"target": "port", "port": N}`.

use std::time::Duration;

use computerd_proto::ErrorKind;
use tokio::io::AsyncRead;
use tokio::io::AsyncWrite;

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

/// Carries bytes both ways until both sides ended: the node's into the socket, the socket's to
/// the node (read 64 KiB at a time). Each side's half-close is passed on, so a request fully sent
/// still gets its whole answer; a reset of the tunnel ends both ways.
pub async fn pump<T>(mut sock: tokio::net::TcpStream, mut tunnel: T)
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let _ = sock.set_nodelay(true);
    if let Err(e) = tokio::io::copy_bidirectional_with_sizes(&mut sock, &mut tunnel, CHUNK, CHUNK).await {
        tracing::debug!(error = %e, "a port's connection ended");
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::io::AsyncWriteExt;

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
        let (node, tunnel) = tokio::io::duplex(16);
        tokio::spawn(pump(sock, tunnel));
        let (mut from_port, mut to_port) = tokio::io::split(node);
        to_port.write_all(b"ab").await.expect("write");
        to_port.write_all(b"cd").await.expect("write");
        to_port.shutdown().await.expect("half-close");
        let mut back = Vec::new();
        from_port.read_to_end(&mut back).await.expect("read");
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
