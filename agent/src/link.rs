//! The link: dial `/v1/agent/link` over WebSocket, authenticate, learn the link generation, then
//! serve the agent's gRPC service on the HTTP/2 connections the node opens over it, and send the
//! sessions' reports, until it drops (see `computerd_proto::mux`); reconnect with jittered
//! exponential backoff. Sessions live on across reconnects.

use std::sync::atomic::Ordering;
use std::time::Duration;

use computerd_proto::agent::SessionEnded;
use computerd_proto::agent::agent_server::AgentServer;
use computerd_proto::mux::EpochIo;
use computerd_proto::mux::Event;
use computerd_proto::mux::Mux;
use computerd_proto::mux::Role;
use futures::SinkExt;
use futures::StreamExt;
use prost::Message as _;
use tokio_tungstenite::tungstenite::Message;

use crate::pairing::Credential;
use crate::service::AgentService;
use crate::sessions::Ended;

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
pub async fn run(dial: crate::tls::Dial, cred: Credential, svc: AgentService) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match connect_once(&dial, &cred, &svc).await {
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

/// One link: answers `Ok` once it was up and then ended (for any reason), `Err` when it never
/// came up (no connection, no welcome, refused).
async fn connect_once(dial: &crate::tls::Dial, cred: &Credential, svc: &AgentService) -> Result<(), String> {
    // TCP_NODELAY: a small answer written in pieces must not wait for the node's delayed ACK
    // (Nagle cost ~40 ms per call before).
    let connector = dial.tls.clone().map(tokio_tungstenite::Connector::Rustls);
    let (mut ws, _) = tokio_tungstenite::connect_async_tls_with_config(link_url(&dial.server), None, true, connector)
        .await
        .map_err(|e| e.to_string())?;
    let hello = serde_json::json!({
        "computerId": cred.computer_id,
        "credential": cred.credential,
        "protocol": computerd_proto::LINK_PROTOCOL,
    });
    ws.send(Message::Text(hello.to_string().into())).await.map_err(|e| e.to_string())?;
    let welcome = match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => t.to_string(),
        other => return Err(format!("no welcome from the server: {other:?}")),
    };
    let v: serde_json::Value = serde_json::from_str(&welcome).map_err(|e| format!("bad welcome: {e}"))?;
    let generation = v["generation"].as_u64().ok_or_else(|| format!("refused: {}", v["error"]))?;
    svc.generation.store(generation, Ordering::SeqCst);
    tracing::info!(generation, computer_id = %cred.computer_id, "link up");
    // The link was up: however it ended, the next dial starts from the shortest backoff.
    if let Err(reason) = serve(ws, svc.clone()).await {
        tracing::info!(%reason, "the link ended");
    }
    Ok(())
}

/// The next holder of the desktop's input lease (never, without a desktop).
async fn next_holder(rx: &mut Option<tokio::sync::watch::Receiver<Option<String>>>) -> Option<String> {
    let Some(rx) = rx else { return std::future::pending().await };
    if rx.changed().await.is_err() {
        return std::future::pending().await;
    }
    rx.borrow_and_update().clone()
}

/// The WebSocket of a link.
pub type LinkSocket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How long the agent waits without a word from the node (which pings every 5 s) before it
/// takes the link for dead and dials again.
const NODE_SILENCE: Duration = Duration::from_secs(15);

/// Serves an authenticated link (after the welcome) until it ends: the agent's gRPC service on
/// every HTTP/2 connection (epoch) the node opens, the tunnels it opens (to a port, to the
/// desktop's VNC server), and the sessions' reports (a status report
/// now and whenever the number of running commands changes, and every session that ended after
/// its wait) as report frames ([`computerd_proto::mux`]).
pub async fn serve(ws: LinkSocket, svc: AgentService) -> Result<(), String> {
    let mut mux = Mux::new(computerd_proto::ws_adapter!(ws, Message), Role::Server);
    let (epochs, incoming) = futures::channel::mpsc::unbounded::<EpochIo>();
    let server = tonic::transport::Server::builder()
        .initial_stream_window_size(computerd_proto::channel::STREAM_WINDOW)
        .initial_connection_window_size(computerd_proto::channel::CONNECTION_WINDOW)
        .max_frame_size(Some(computerd_proto::channel::MAX_FRAME))
        .add_service(AgentServer::new(svc.clone()).max_decoding_message_size(8 << 20))
        .serve_with_incoming(incoming.map(Ok::<_, std::io::Error>));
    let mut server = std::pin::pin!(server);
    let sessions = svc.sessions.clone();
    let mut running = sessions.running();
    let status = |running: u32| SessionEnded { running, ..Default::default() }.encode_to_vec();
    mux.report(&status(*running.borrow_and_update()));
    let desktop = svc.desktop.clone();
    let mut lease = desktop.as_ref().map(|d| d.lease_changes());
    let mut reported_desktop = String::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ended: Result<(), String> = async {
        loop {
            tokio::select! {
                event = mux.next() => match event {
                    Event::Accepted(io) => {
                        if epochs.unbounded_send(io).is_err() {
                            return Err("the agent's server stopped".into());
                        }
                    }
                    Event::Tunnel(t) => {
                        let svc = svc.clone();
                        tokio::spawn(async move { svc.serve_tunnel(t).await });
                    }
                    Event::Report(_) => {} // the node sends none
                    Event::Ended(e) => return Err(format!("the link ended: {e}")),
                },
                ended = sessions.next_ended() => {
                    for e in ended {
                        let report = SessionEnded {
                            session_id: e.session_id,
                            owner: e.owner,
                            exit_code: e.exit_code,
                            signal: e.signal,
                            running: *running.borrow(),
                            ..Default::default()
                        };
                        mux.report(&report.encode_to_vec());
                    }
                }
                changed = running.changed() => {
                    if changed.is_err() {
                        return Err("the sessions are gone".into());
                    }
                    mux.report(&status(*running.borrow_and_update()));
                }
                holder = next_holder(&mut lease) => {
                    let report = SessionEnded {
                        running: *running.borrow(),
                        lease_report: true,
                        lease_holder: holder.unwrap_or_default(),
                        ..Default::default()
                    };
                    mux.report(&report.encode_to_vec());
                }
                r = &mut server => return Err(format!("the agent's server stopped: {r:?}")),
                _ = tick.tick() => {
                    if let Some(d) = &desktop {
                        d.expire_lease();
                        // The desktop as the Computer's record shows it, when it changed.
                        let brief = d.brief().to_string();
                        if brief != reported_desktop {
                            let report = SessionEnded {
                                running: *running.borrow(),
                                desktop_json: brief.clone(),
                                ..Default::default()
                            };
                            mux.report(&report.encode_to_vec());
                            reported_desktop = brief;
                        }
                    }
                    if mux.last_rx().elapsed() > NODE_SILENCE {
                        return Err(format!("no word from the node for {NODE_SILENCE:?}"));
                    }
                }
            }
        }
    }
    .await;
    // Reports not written yet are kept for the next link (sessions that ended stay reported).
    let unsent: Vec<Ended> = mux
        .take_unsent_reports()
        .into_iter()
        .filter_map(|r| SessionEnded::decode(r).ok())
        .filter(|r| !r.session_id.is_empty())
        .map(|r| Ended { session_id: r.session_id, owner: r.owner, exit_code: r.exit_code, signal: r.signal })
        .collect();
    sessions.requeue(unsent);
    ended
}
