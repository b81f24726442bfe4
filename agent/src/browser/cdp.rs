//! A CDP connection to a Chromium started with `--remote-debugging-pipe`: commands go to its
//! fd 3 and answers and events come from its fd 4, each message JSON ended by a NUL byte. A pipe
//! rather than `--remote-debugging-port`: a port would let anything in the Computer (a session
//! as `user`) drive the browser around the input lease, with no way to authenticate it; the
//! pipe's ends are held by the agent alone.
//!
//! One thread reads, one writes. A call waits for the answer with its id; events are published
//! on a broadcast channel (a subscriber that lags loses the oldest and is told so).

use std::collections::HashMap;
use std::io::BufRead;
use std::io::Read;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;
use serde_json::json;
use tokio::sync::broadcast;
use tokio::sync::oneshot;

/// A CDP message is at most this large (a full-page screenshot in base64 is the largest).
const MAX_MESSAGE: usize = 64 * 1024 * 1024;

/// An event: its method, parameters and the session (tab) it came from.
#[derive(Debug, Clone)]
pub struct Event {
    /// `Page.loadEventFired`, …
    pub method: String,
    /// Its parameters.
    pub params: Value,
    /// The flat session it belongs to (empty: the browser's).
    pub session: String,
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq)]
pub enum CdpError {
    /// The browser answered with an error.
    Protocol(String),
    /// The browser is gone (the pipe closed).
    Closed,
    /// No answer in time.
    Timeout,
}

impl std::fmt::Display for CdpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Protocol(m) => write!(f, "the browser refused: {m}"),
            Self::Closed => f.write_str("the browser has stopped"),
            Self::Timeout => f.write_str("the browser did not answer in time"),
        }
    }
}

type Waiters = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<Result<Value, CdpError>>>>>>;

/// One connection; clones share it.
#[derive(Clone)]
pub struct Cdp {
    out: std::sync::mpsc::Sender<Vec<u8>>,
    waiters: Waiters,
    events: broadcast::Sender<Event>,
    next: Arc<AtomicU64>,
}

impl Cdp {
    /// Serves the pipe: `to_browser` is the write end of the browser's fd 3, `from_browser` the
    /// read end of its fd 4.
    pub fn serve(to_browser: OwnedFd, from_browser: OwnedFd) -> Cdp {
        let (out, rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let waiters: Waiters = Arc::new(Mutex::new(Some(HashMap::new())));
        let (events, _) = broadcast::channel(4096);
        let mut w = std::fs::File::from(to_browser);
        std::thread::spawn(move || {
            while let Ok(msg) = rx.recv() {
                if w.write_all(&msg).is_err() {
                    break;
                }
            }
        });
        let (ws, es) = (waiters.clone(), events.clone());
        let r = std::fs::File::from(from_browser);
        std::thread::spawn(move || read_loop(r, &ws, &es));
        Cdp { out, waiters, events, next: Arc::new(AtomicU64::new(1)) }
    }

    /// Events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Whether the browser is still there.
    pub fn is_open(&self) -> bool {
        self.waiters.lock().map(|w| w.is_some()).unwrap_or(false)
    }

    /// Sends `method` (to the tab's `session`, or the browser with `None`) and waits for its
    /// answer for up to `within`.
    pub async fn call(
        &self,
        session: Option<&str>,
        method: &str,
        params: Value,
        within: Duration,
    ) -> Result<Value, CdpError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut w = self.waiters.lock().map_err(|_| CdpError::Closed)?;
            w.as_mut().ok_or(CdpError::Closed)?.insert(id, tx);
        }
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = Value::String(s.to_string());
        }
        let mut bytes = serde_json::to_vec(&msg).map_err(|e| CdpError::Protocol(e.to_string()))?;
        bytes.push(0);
        if self.out.send(bytes).is_err() {
            return Err(CdpError::Closed);
        }
        match tokio::time::timeout(within, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(CdpError::Closed),
            Err(_) => {
                if let Ok(mut w) = self.waiters.lock()
                    && let Some(w) = w.as_mut()
                {
                    w.remove(&id);
                }
                Err(CdpError::Timeout)
            }
        }
    }
}

fn read_loop(r: std::fs::File, waiters: &Waiters, events: &broadcast::Sender<Event>) {
    let mut r = std::io::BufReader::with_capacity(1 << 20, r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.by_ref().take(MAX_MESSAGE as u64 + 1).read_until(0, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if buf.last() != Some(&0) {
            // Over the bound, or the pipe ended mid-message.
            tracing::warn!(len = buf.len(), "the browser sent an oversized or cut message; closing");
            break;
        }
        buf.pop();
        let Ok(mut msg) = serde_json::from_slice::<Value>(&buf) else {
            tracing::warn!("the browser sent a message that is not JSON");
            continue;
        };
        if let Some(id) = msg.get("id").and_then(Value::as_u64) {
            let answer = match msg.get("error") {
                Some(e) => Err(CdpError::Protocol(
                    e.get("message").and_then(Value::as_str).unwrap_or("unknown error").to_string(),
                )),
                // Taken out, not cloned: a large answer (an accessibility tree) is megabytes.
                None => Ok(msg.get_mut("result").map(Value::take).unwrap_or(Value::Null)),
            };
            let waiter = waiters.lock().ok().and_then(|mut w| w.as_mut().and_then(|w| w.remove(&id)));
            if let Some(tx) = waiter {
                let _ = tx.send(answer);
            }
        } else if let Some(method) = msg.get("method").and_then(Value::as_str) {
            let method = method.to_string();
            let _ = events.send(Event {
                method,
                params: msg.get_mut("params").map(Value::take).unwrap_or(Value::Null),
                session: msg.get("sessionId").and_then(Value::as_str).unwrap_or("").to_string(),
            });
        }
    }
    // Closed: every waiter learns it, and later calls fail at once.
    if let Ok(mut w) = waiters.lock() {
        w.take();
    }
}

/// Two pipes for a browser: the parent's ends (write to it, read from it) and the child's
/// (its fd 3 and fd 4 after [`place_child_fds`]).
pub struct Pipes {
    /// The parent's write end (the browser's fd 3 reads it).
    pub to_browser: OwnedFd,
    /// The parent's read end (the browser's fd 4 writes it).
    pub from_browser: OwnedFd,
    /// The child's read end.
    pub child_in: OwnedFd,
    /// The child's write end.
    pub child_out: OwnedFd,
}

/// Makes the pipes, all close-on-exec (the child's are moved to 3 and 4 in the child only).
pub fn pipes() -> std::io::Result<Pipes> {
    let (child_in, to_browser) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    let (from_browser, child_out) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    Ok(Pipes { to_browser, from_browser, child_in, child_out })
}

/// In the child, between fork and exec: puts `child_in` at fd 3 and `child_out` at fd 4 (both
/// without close-on-exec). Async-signal-safe: only `fcntl` and `dup2`.
///
/// # Safety
/// Call only from `pre_exec`.
pub unsafe fn place_child_fds(child_in: i32, child_out: i32) -> std::io::Result<()> {
    // First above 4, so neither lands on the other's target.
    let a = unsafe { libc::fcntl(child_in, libc::F_DUPFD_CLOEXEC, 10) };
    let b = unsafe { libc::fcntl(child_out, libc::F_DUPFD_CLOEXEC, 10) };
    if a < 0 || b < 0 || unsafe { libc::dup2(a, 3) } < 0 || unsafe { libc::dup2(b, 4) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The raw fds of the child's ends (for `pre_exec`).
pub fn raw(p: &Pipes) -> (i32, i32) {
    (p.child_in.as_raw_fd(), p.child_out.as_raw_fd())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake browser on the other ends: answers each command, and sends an event first.
    #[tokio::test]
    async fn calls_get_their_answers_and_events_are_published() {
        let p = pipes().expect("pipes");
        let cdp = Cdp::serve(p.to_browser, p.from_browser);
        let mut events = cdp.subscribe();
        let (child_in, child_out) = (p.child_in, p.child_out);
        std::thread::spawn(move || {
            let mut r = std::io::BufReader::new(std::fs::File::from(child_in));
            let mut w = std::fs::File::from(child_out);
            let mut buf = Vec::new();
            while r.read_until(0, &mut buf).map(|n| n > 0).unwrap_or(false) {
                buf.pop();
                let msg: Value = serde_json::from_slice(&buf).expect("json");
                buf.clear();
                let id = msg["id"].as_u64().expect("id");
                let ev = json!({"method": "Page.loadEventFired", "params": {"n": id}, "sessionId": "s1"});
                let answer = if msg["method"] == "Bad.method" {
                    json!({"id": id, "error": {"code": -32601, "message": "not found"}})
                } else {
                    json!({"id": id, "result": {"echo": msg["params"]}})
                };
                for m in [ev, answer] {
                    let mut b = serde_json::to_vec(&m).expect("encode");
                    b.push(0);
                    w.write_all(&b).expect("write");
                }
            }
        });
        let t = Duration::from_secs(5);
        let a = cdp.call(Some("s1"), "Page.navigate", json!({"url": "x"}), t).await.expect("answer");
        assert_eq!(a["echo"]["url"], "x");
        let e = events.recv().await.expect("event");
        assert_eq!((e.method.as_str(), e.session.as_str()), ("Page.loadEventFired", "s1"));
        assert_eq!(cdp.call(None, "Bad.method", json!({}), t).await, Err(CdpError::Protocol("not found".into())));
    }

    #[tokio::test]
    async fn a_closed_browser_fails_every_call() {
        let p = pipes().expect("pipes");
        let cdp = Cdp::serve(p.to_browser, p.from_browser);
        drop(p.child_out);
        drop(p.child_in);
        let r = cdp.call(None, "Browser.getVersion", json!({}), Duration::from_secs(5)).await;
        assert!(matches!(r, Err(CdpError::Closed)), "{r:?}");
        assert!(!cdp.is_open());
    }
}
