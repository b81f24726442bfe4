//! The link: dial `/v1/agent/link` over WebSocket, authenticate, learn the link generation, then
//! serve the agent's gRPC service over the connection until it drops; reconnect with jittered
//! exponential backoff. Sessions live on across reconnects.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use computerd_proto::agent::agent_server::AgentServer;
use computerd_proto::wsio::MessageIo;
use futures::SinkExt;
use futures::StreamExt;
use tokio_tungstenite::tungstenite::Message;

use crate::pairing::Credential;
use crate::service::AgentService;

/// The WebSocket URL of the link for an `http(s)://` server URL.
pub fn link_url(server: &str) -> String {
    let base = server.trim_end_matches('/');
    let ws = if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        base.to_string()
    };
    format!("{ws}/v1/agent/link")
}

/// Runs the link forever.
pub async fn run(server: String, cred: Credential, svc: AgentService) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match connect_once(&server, &cred, &svc).await {
            Ok(()) => {
                tracing::info!("link closed; reconnecting");
                backoff = Duration::from_millis(100);
            }
            Err(e) => tracing::warn!(error = %e, "link failed"),
        }
        let jitter = rand::random::<u64>() % (backoff.as_millis() as u64 / 2 + 1);
        tokio::time::sleep(backoff + Duration::from_millis(jitter)).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn connect_once(server: &str, cred: &Credential, svc: &AgentService) -> Result<(), String> {
    // TCP_NODELAY: a small answer written in pieces must not wait for the node's delayed ACK
    // (Nagle cost ~40 ms per call before).
    let (ws, _) =
        tokio_tungstenite::connect_async_with_config(link_url(server), None, true).await.map_err(|e| e.to_string())?;
    let (mut tx, mut rx) = ws.split();
    let hello = serde_json::json!({ "computerId": cred.computer_id, "credential": cred.credential });
    tx.send(Message::Text(hello.to_string().into())).await.map_err(|e| e.to_string())?;
    let welcome = match tokio::time::timeout(Duration::from_secs(30), rx.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => t.to_string(),
        other => return Err(format!("no welcome from the server: {other:?}")),
    };
    let v: serde_json::Value = serde_json::from_str(&welcome).map_err(|e| format!("bad welcome: {e}"))?;
    let generation = v["generation"].as_u64().ok_or_else(|| format!("refused: {}", v["error"]))?;
    svc.generation.store(generation, Ordering::SeqCst);
    tracing::info!(generation, computer_id = %cred.computer_id, "link up");
    serve(tx, rx, svc.clone()).await
}

/// The WebSocket of a link.
pub type LinkSocket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Serves the agent's gRPC service over an authenticated link (after the welcome) until the
/// connection ends: HTTP/2 over the WebSocket's binary messages.
pub async fn serve(
    tx: futures::stream::SplitSink<LinkSocket, Message>,
    rx: futures::stream::SplitStream<LinkSocket>,
    svc: AgentService,
) -> Result<(), String> {
    let rx = rx.filter_map(|m| async move {
        match m {
            Ok(Message::Binary(b)) => Some(Ok(b)),
            Ok(_) => None,
            Err(e) => Some(Err(std::io::Error::other(e.to_string()))),
        }
    });
    let tx = tx
        .sink_map_err(|e| std::io::Error::other(e.to_string()))
        .with(|b: Bytes| async move { Ok::<_, std::io::Error>(Message::Binary(b)) });
    let mut io = MessageIo::new(Box::pin(rx), Box::pin(tx));
    let closed = io.close_signal();
    // One connection: the incoming stream never ends by itself; the link ends when the
    // connection (and so the stream) is dropped.
    let incoming = futures::stream::iter([Ok::<_, std::io::Error>(io)]).chain(futures::stream::pending());
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(5)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(AgentServer::new(svc).max_decoding_message_size(8 << 20))
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = closed.await;
        })
        .await
        .map_err(|e| e.to_string())
}
