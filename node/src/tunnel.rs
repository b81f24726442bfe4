//! Byte tunnels to a Computer through its agent's link: a person's desktop stream, and a
//! connection to one of its ports from its public address. Opened on the node that holds the
//! link (directly, as a tunnel of the link's own frames: `computerd_proto::mux::tunnel`), or from any other node through `Routing.Tunnel` to that node, which checks
//! the opening again at a current read before it asks the agent: the desktop stream's cookie
//! and its person's rights, or the port's address and its exposer's rights.

use std::pin::Pin;

use bytes::Bytes;
use computerd_proto::ErrorKind;
use computerd_proto::cluster::TunnelChunk;
use computerd_raft::sm::PortResolved;
use futures::Sink;
use futures::SinkExt;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::Deserialize;
use serde::Serialize;
use serde_json::json;

use crate::desktop_streams::Mode;
use crate::owner::CallError;
use crate::owner::CallKind;
use crate::owner::Miss;
use crate::owner::Place;
use crate::state::AppState;

/// Bytes to the Computer's service, and bytes from it: the link's tunnel itself when the link
/// is here, a `Routing.Tunnel` call to its node otherwise.
pub type Pipe = (Pin<Box<dyn Sink<Bytes, Error = std::io::Error> + Send>>, BoxStream<'static, Bytes>);

/// What a tunnel opens (the first message of `Routing.Tunnel`, as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum Opening {
    /// A person's desktop stream, by its cookie (used once).
    Stream {
        /// The stream's cookie.
        cookie: String,
    },
    /// A port, from its public address.
    Port {
        /// The port in the Computer.
        port: u16,
        /// The SHA-256 of the address's label.
        #[serde(rename = "labelHash")]
        label_hash: String,
    },
}

/// Opens on this node (which holds the link): the opening checked at a current read, then the
/// agent's tunnel.
pub async fn open_here(state: &AppState, computer: &str, opening: &Opening) -> Result<Pipe, CallError> {
    let open = match opening {
        Opening::Stream { cookie } => {
            let refused = || CallError::new(ErrorKind::Unauthorized, "the stream's cookie is unknown, used or expired");
            let grant = state.streams.open(computer, cookie).ok_or_else(refused)?;
            barrier(state).await?;
            state
                .cluster
                .state()
                .read(|s| {
                    let caller = s.caller_by_token_id(&grant.token_id)?;
                    match grant.mode {
                        Mode::View => s.visible_computer(&caller, computer).map(|_| ()),
                        Mode::Control => s.may_control_desktop(&caller, computer),
                    }
                })
                .map_err(|e| CallError::new(e.error_kind(), e.message))?;
            json!({"target": "vnc", "mode": grant.mode, "holder": grant.holder})
        }
        Opening::Port { port, label_hash } => {
            barrier(state).await?;
            match state.cluster.state().read(|s| s.resolve_port(label_hash, *port)) {
                PortResolved::Open(e, _) if e.computer_id == computer => {}
                PortResolved::AwaitingApproval => return Err(awaiting()),
                _ => return Err(no_address()),
            }
            json!({"target": "port", "port": port})
        }
    };
    let link = state.owners.link(computer).await?;
    let open = open.to_string();
    let io = link.tunnel(open.as_bytes()).await.map_err(CallError::from_refused)?;
    let (from, to) = io.split();
    Ok((Box::pin(to), from.boxed()))
}

async fn barrier(state: &AppState) -> Result<(), CallError> {
    state.cluster.read_barrier().await.map_err(|e| CallError::new(ErrorKind::Unavailable, e.to_string()))
}

/// The answer to an address that is not (or no longer) exposed.
pub fn no_address() -> CallError {
    CallError::new(ErrorKind::NotFound, "no computer port has this address (it was never exposed, or it ended)")
}

/// The answer to an address whose `computers.expose` waits for a member.
pub fn awaiting() -> CallError {
    CallError::new(ErrorKind::Forbidden, "this address waits for a member's approval of computers.expose")
}

/// Opens wherever the link is: here, or through `Routing.Tunnel` to its node.
pub async fn open_anywhere(state: &AppState, computer: &str, opening: &Opening) -> Result<Pipe, CallError> {
    let node = match state.owners.locate(computer).await {
        Place::Here(_) | Place::Nowhere => return open_here(state, computer, opening).await,
        Place::At(n) => n,
    };
    let open = serde_json::to_string(opening).map_err(|e| CallError::new(ErrorKind::Internal, e.to_string()))?;
    let sender = std::sync::Arc::new(std::sync::Mutex::new(None));
    let keep = sender.clone();
    let reached = state
        .owners
        .reach(node, CallKind::Session, |mut client, _left| {
            let (mut tx, rx) = futures::channel::mpsc::channel::<TunnelChunk>(16);
            let first = TunnelChunk { computer_id: computer.to_string(), open_json: open.clone(), data: Bytes::new() };
            let _ = tx.try_send(first);
            if let Ok(mut s) = keep.lock() {
                *s = Some(tx);
            }
            async move { client.tunnel(rx).await }
        })
        .await;
    let from = match reached {
        Ok(r) => r.value,
        Err(Miss::Nobody) => return open_here(state, computer, opening).await,
        Err(Miss::Failed(e)) => return Err(e),
    };
    let tx =
        sender.lock().ok().and_then(|mut s| s.take()).ok_or_else(|| CallError::new(ErrorKind::Internal, "tunnel"))?;
    let id = computer.to_string();
    let to = tx
        .sink_map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the tunnel's node went away"))
        .with(move |data: Bytes| {
            futures::future::ready(Ok(TunnelChunk { computer_id: id.clone(), open_json: String::new(), data }))
        });
    let from =
        from.take_while(|m| futures::future::ready(m.is_ok())).filter_map(|m| async move { m.ok().map(|m| m.data) });
    Ok((Box::pin(to), from.boxed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openings_keep_their_wire_form() {
        let s = Opening::Stream { cookie: "c".into() };
        assert_eq!(serde_json::to_string(&s).expect("json"), r#"{"cookie":"c"}"#);
        let p = Opening::Port { port: 8000, label_hash: "h".into() };
        assert_eq!(serde_json::to_string(&p).expect("json"), r#"{"port":8000,"labelHash":"h"}"#);
        for o in [s, p] {
            let back: Opening = serde_json::from_str(&serde_json::to_string(&o).expect("json")).expect("back");
            assert_eq!(back, o);
        }
        assert!(serde_json::from_str::<Opening>(r#"{"port":70000,"labelHash":"h"}"#).is_err());
        assert!(serde_json::from_str::<Opening>(r#"{"other":1}"#).is_err());
    }
}
