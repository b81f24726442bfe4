//! The warm pool: a sandbox started ahead of any create, its agent waiting for an identity.
//!
//! The agent dials `/v1/agent/pool` (a WebSocket at the link's server), says
//! `{"poolId", "token", "protocol"}`, and reads until the node, once the sandbox is claimed,
//! answers with one text message: the assignment
//! `{"computerId", "pairingCode", "env": {NAME: value}, "firstUid": n | null}`, or a refusal
//! `{"error": "…"}`. A socket that cannot be opened or drops before an answer is dialled again
//! (100 ms doubling up to 5 s, forever: a pooled sandbox may wait hours). The token is never
//! logged.
//!
//! What the assignment gives beyond the pairing code (the sessions' environment, the first UID
//! of the tool bindings) is kept in the state dir (`pool-env.json`, mode 0600), so an agent
//! restarted after its claim keeps it ([`save_claim`], [`load_claim`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use futures::SinkExt;
use futures::StreamExt;
use serde::Deserialize;
use serde::Serialize;
use tokio_tungstenite::tungstenite::Message;

/// The largest message the node may answer (bytes).
pub const MAX_ASSIGNMENT: usize = 64 << 10;
/// The most environment variables an assignment may carry.
pub const MAX_ENV: usize = 256;
/// The agent's own settings; no assignment may set one for the sessions.
const RESERVED_PREFIX: &str = "COMPUTER_AGENT_";
/// How often the agent pings a waiting socket (so that one whose node went away errors).
const KEEPALIVE: Duration = Duration::from_secs(30);
/// A socket that was up this long starts the next dial from the shortest backoff again.
const STEADY: Duration = Duration::from_secs(5);
/// The file (in the state dir) keeping what a claim gave.
const CLAIM_FILE: &str = "pool-env.json";

/// What the node gives a claimed sandbox.
#[derive(Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The Computer this sandbox becomes.
    pub computer_id: String,
    /// The one-time pairing code to pair with.
    pub pairing_code: String,
    /// The environment every session of the Computer gets.
    pub env: BTreeMap<String, String>,
    /// The first UID of the tool bindings (`None`: the agent's own setting).
    pub first_uid: Option<u32>,
}

// By hand: the pairing code is a secret.
impl std::fmt::Debug for Assignment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assignment")
            .field("computer_id", &self.computer_id)
            .field("pairing_code", &"<secret>")
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("first_uid", &self.first_uid)
            .finish()
    }
}

/// The WebSocket URL of the pool for an `http(s)://` server URL.
pub fn pool_url(server: &str) -> String {
    // The link's URL (`ws(s)://…/v1/agent/link`) with the pool's path.
    let link = crate::link::link_url(server);
    let base = link.strip_suffix("/v1/agent/link").unwrap_or(&link);
    format!("{base}/v1/agent/pool")
}

/// Peer text, fit to print: control characters escaped, at most 300 characters.
fn shown(text: &str) -> String {
    let mut out: String = text.chars().take(300).flat_map(char::escape_debug).collect();
    if text.chars().nth(300).is_some() {
        out.push('…');
    }
    out
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default)]
    error: Option<serde_json::Value>,
    #[serde(default)]
    computer_id: Option<String>,
    #[serde(default)]
    pairing_code: Option<String>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    first_uid: Option<u32>,
}

/// Why an environment variable may not be given to the sessions, if it may not.
fn env_refusal(name: &str, value: &str) -> Option<String> {
    if name.is_empty() {
        Some("an empty environment variable name".into())
    } else if name.contains(['=', '\0']) {
        Some(format!("the environment variable name {:?} has '=' or NUL", shown(name)))
    } else if name.starts_with(RESERVED_PREFIX) {
        Some(format!("the environment variable {} is the agent's own ({RESERVED_PREFIX}*)", shown(name)))
    } else if value.contains('\0') {
        Some(format!("the environment variable {} has a NUL in its value", shown(name)))
    } else {
        None
    }
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    if env.len() > MAX_ENV {
        return Err(format!("{} environment variables (at most {MAX_ENV})", env.len()));
    }
    match env.iter().find_map(|(k, v)| env_refusal(k, v)) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

/// The node's answer: the assignment, or why there is none (a refusal, or an answer that is not
/// a well-formed assignment, which is taken as one).
pub fn parse_assignment(text: &str) -> Result<Assignment, String> {
    if text.len() > MAX_ASSIGNMENT {
        return Err(format!("the pool's answer is {} bytes (at most {MAX_ASSIGNMENT})", text.len()));
    }
    let wire: Wire = serde_json::from_str(text)
        .map_err(|e| format!("the pool's answer is not an assignment: {}", shown(&e.to_string())))?;
    if let Some(error) = wire.error {
        let why = match &error {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        return Err(format!("refused by the pool: {}", shown(&why)));
    }
    let computer_id = wire.computer_id.filter(|c| !c.is_empty()).ok_or("the assignment has no computerId")?;
    let pairing_code = wire.pairing_code.filter(|c| !c.is_empty()).ok_or("the assignment has no pairingCode")?;
    let env = wire.env.unwrap_or_default();
    check_env(&env).map_err(|why| format!("the assignment is refused: {why}"))?;
    Ok(Assignment { computer_id, pairing_code, env, first_uid: wire.first_uid })
}

/// How one socket to the pool ended.
enum Attempt {
    /// The node answered the assignment.
    Assigned(Assignment),
    /// The node refused (or answered something that is not an assignment): final.
    Refused(String),
    /// No socket, or it dropped before an answer (`up`: how long it was open).
    Dropped { why: String, up: Option<Duration> },
}

/// Waits in the pool as `pool_id` until the node hands this sandbox an identity: the
/// assignment, or why the node refused (final). Dials again, forever, while the node cannot be
/// reached or the socket drops.
pub async fn wait(dial: &crate::tls::Dial, pool_id: &str, token: &str) -> Result<Assignment, String> {
    let first = Duration::from_millis(100);
    let mut backoff = first;
    loop {
        match wait_once(dial, pool_id, token).await {
            Attempt::Assigned(a) => return Ok(a),
            Attempt::Refused(why) => return Err(why),
            Attempt::Dropped { why, up } => {
                tracing::warn!(error = %why, pool_id, "waiting in the pool: no socket; dialling again");
                if up.is_some_and(|u| u >= STEADY) {
                    backoff = first;
                }
            }
        }
        let jitter = rand::random::<u64>() % (backoff.as_millis() as u64 / 2 + 1);
        tokio::time::sleep(backoff + Duration::from_millis(jitter)).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn wait_once(dial: &crate::tls::Dial, pool_id: &str, token: &str) -> Attempt {
    use tokio_tungstenite::tungstenite::Error as WsError;
    let dropped = |why: String, up: Option<Duration>| Attempt::Dropped { why, up };
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_ASSIGNMENT))
        .max_frame_size(Some(MAX_ASSIGNMENT));
    let connector = dial.tls.clone().map(tokio_tungstenite::Connector::Rustls);
    let mut ws =
        match tokio_tungstenite::connect_async_tls_with_config(pool_url(&dial.server), Some(config), true, connector)
            .await
        {
            Ok((ws, _)) => ws,
            Err(e) => return dropped(e.to_string(), None),
        };
    let opened = tokio::time::Instant::now();
    let hello = serde_json::json!({
        "poolId": pool_id,
        "token": token,
        "protocol": computerd_proto::LINK_PROTOCOL,
    });
    if let Err(e) = ws.send(Message::Text(hello.to_string().into())).await {
        return dropped(e.to_string(), Some(opened.elapsed()));
    }
    // A write now and then: a socket whose node went away then errors instead of waiting forever.
    let mut keepalive = tokio::time::interval_at(opened + KEEPALIVE, KEEPALIVE);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = ws.next() => match msg {
                Some(Ok(Message::Text(t))) => {
                    return match parse_assignment(t.as_str()) {
                        Ok(a) => Attempt::Assigned(a),
                        Err(why) => Attempt::Refused(why),
                    };
                }
                Some(Ok(Message::Binary(b))) => {
                    return Attempt::Refused(format!("the pool answered a binary message ({} bytes)", b.len()));
                }
                // Pings are answered by the socket as it reads; pongs and raw frames say nothing.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Close(frame))) => {
                    let why = frame.map(|f| format!("closed: {} {}", f.code, shown(&f.reason))).unwrap_or("closed".into());
                    return dropped(why, Some(opened.elapsed()));
                }
                Some(Err(WsError::Capacity(e))) => {
                    return Attempt::Refused(format!("the pool's answer is too large: {e}"));
                }
                Some(Err(e)) => return dropped(e.to_string(), Some(opened.elapsed())),
                None => return dropped("closed".into(), Some(opened.elapsed())),
            },
            _ = keepalive.tick() => {
                if let Err(e) = ws.send(Message::Ping(Default::default())).await {
                    return dropped(e.to_string(), Some(opened.elapsed()));
                }
            }
        }
    }
}

/// What a claim gave beyond the pairing code, kept for an agent restarted after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    /// The environment every session of the Computer gets.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The first UID of the tool bindings, when the assignment named one.
    #[serde(default)]
    pub first_uid: Option<u32>,
}

impl From<&Assignment> for Claim {
    fn from(a: &Assignment) -> Claim {
        Claim { env: a.env.clone(), first_uid: a.first_uid }
    }
}

/// Keeps `claim` in the state dir (`pool-env.json`, mode 0600, replaced whole).
pub fn save_claim(state: &Path, claim: &Claim) -> Result<(), String> {
    let path = state.join(CLAIM_FILE);
    let tmp = state.join(format!("{CLAIM_FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(state)?;
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(&serde_json::to_vec(claim)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(state)?.sync_all()
    };
    write().map_err(|e| format!("cannot keep the pool's assignment in {}: {e}", path.display()))
}

/// The claim kept in the state dir (`None`: this agent was not claimed from a pool).
pub fn load_claim(state: &Path) -> Result<Option<Claim>, String> {
    let path = state.join(CLAIM_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let claim: Claim = serde_json::from_slice(&bytes).map_err(|e| format!("{} is corrupt: {e}", path.display()))?;
    check_env(&claim.env).map_err(|why| format!("{}: {why}", path.display()))?;
    Ok(Some(claim))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn good() -> serde_json::Value {
        serde_json::json!({
            "computerId": "cmp_0123",
            "pairingCode": "code-1",
            "env": {"GREETING": "hello", "PATH_EXTRA": "/opt/x"},
            "firstUid": 123456,
        })
    }

    #[test]
    fn an_assignment_is_parsed() {
        let a = parse_assignment(&good().to_string()).expect("good");
        assert_eq!(a.computer_id, "cmp_0123");
        assert_eq!(a.pairing_code, "code-1");
        assert_eq!(a.env.get("GREETING").map(String::as_str), Some("hello"));
        assert_eq!(a.env.len(), 2);
        assert_eq!(a.first_uid, Some(123456));
        assert!(!format!("{a:?}").contains("code-1"), "the pairing code is not shown");
        let mut plain = good();
        plain["firstUid"] = serde_json::Value::Null;
        plain["env"] = serde_json::json!({});
        let a = parse_assignment(&plain.to_string()).expect("no first uid");
        assert_eq!((a.first_uid, a.env.len()), (None, 0));
    }

    #[test]
    fn a_refusal_is_an_error_with_its_reason() {
        let why = parse_assignment(r#"{"error": "unknown pool id"}"#).expect_err("refused");
        assert!(why.contains("unknown pool id"), "{why}");
        let why = parse_assignment(r#"{"error": "bad\u001b[31m token"}"#).expect_err("refused");
        assert!(!why.contains('\u{1b}'), "control characters are escaped: {why}");
        let mut both = good();
        both["error"] = serde_json::json!("no");
        assert!(parse_assignment(&both.to_string()).is_err(), "an error wins");
    }

    #[test]
    fn too_many_env_names_are_refused() {
        let mut a = good();
        let env: serde_json::Map<String, serde_json::Value> =
            (0..=MAX_ENV).map(|i| (format!("V{i}"), serde_json::json!("x"))).collect();
        a["env"] = serde_json::Value::Object(env);
        let why = parse_assignment(&a.to_string()).expect_err("too many");
        assert!(why.contains("257 environment variables"), "{why}");
        let env: serde_json::Map<String, serde_json::Value> =
            (0..MAX_ENV).map(|i| (format!("V{i}"), serde_json::json!("x"))).collect();
        a["env"] = serde_json::Value::Object(env);
        assert_eq!(parse_assignment(&a.to_string()).expect("256").env.len(), MAX_ENV);
    }

    #[test]
    fn the_agents_own_settings_and_malformed_names_are_refused() {
        for (name, value) in [
            ("COMPUTER_AGENT_SERVER", "x"),
            ("COMPUTER_AGENT_", "x"),
            ("", "x"),
            ("A=B", "x"),
            ("A\0", "x"),
            ("A", "x\0"),
        ] {
            let mut a = good();
            a["env"] = serde_json::json!({ name: value });
            assert!(parse_assignment(&a.to_string()).is_err(), "{name:?}={value:?}");
        }
    }

    #[test]
    fn bad_json_and_oversized_or_incomplete_answers_are_refused() {
        for text in ["", "not json", "{", "[]", "null", r#"{"computerId": 3}"#, r#"{"env": {"A": 1}}"#] {
            assert!(parse_assignment(text).is_err(), "{text:?}");
        }
        let mut a = good();
        a.as_object_mut().expect("object").remove("pairingCode");
        assert!(parse_assignment(&a.to_string()).expect_err("no code").contains("pairingCode"));
        let mut a = good();
        a["firstUid"] = serde_json::json!(-1);
        assert!(parse_assignment(&a.to_string()).is_err(), "a negative uid");
        let mut a = good();
        a["env"]["BIG"] = serde_json::json!("x".repeat(MAX_ASSIGNMENT));
        assert!(parse_assignment(&a.to_string()).expect_err("too large").contains("at most"));
    }

    #[test]
    fn the_url_is_the_links_server() {
        assert_eq!(pool_url("https://c.example:8443/"), "wss://c.example:8443/v1/agent/pool");
        assert_eq!(pool_url("http://127.0.0.1:1"), "ws://127.0.0.1:1/v1/agent/pool");
    }

    #[test]
    fn a_claim_is_kept_privately_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(load_claim(dir.path()).expect("none"), None);
        let claim = Claim { env: BTreeMap::from([("A".into(), "1".into())]), first_uid: Some(200000) };
        save_claim(dir.path(), &claim).expect("save");
        let meta = std::fs::metadata(dir.path().join(CLAIM_FILE)).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(load_claim(dir.path()).expect("load"), Some(claim));
        std::fs::write(dir.path().join(CLAIM_FILE), r#"{"env": {"COMPUTER_AGENT_PAIR": "x"}}"#).expect("write");
        assert!(load_claim(dir.path()).is_err(), "a reserved name is refused on load too");
        std::fs::write(dir.path().join(CLAIM_FILE), "{").expect("write");
        assert!(load_claim(dir.path()).is_err());
    }

    type Server = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

    async fn listen() -> (TcpListener, crate::tls::Dial) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let dial = crate::tls::dial(&format!("http://{addr}"), None, false).expect("dial");
        (listener, dial)
    }

    /// Accepts one socket on the pool's path and reads its hello.
    #[allow(clippy::result_large_err)] // the handshake callback's type
    async fn accept(listener: &TcpListener) -> (Server, serde_json::Value) {
        let (tcp, _) = listener.accept().await.expect("accept");
        let path = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let seen = path.clone();
        use tokio_tungstenite::tungstenite::handshake::server::ErrorResponse;
        use tokio_tungstenite::tungstenite::handshake::server::Request;
        use tokio_tungstenite::tungstenite::handshake::server::Response;
        let callback = move |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
            *seen.lock().unwrap_or_else(|p| p.into_inner()) = req.uri().path().to_string();
            Ok(resp)
        };
        let mut ws = tokio_tungstenite::accept_hdr_async(tcp, callback).await.expect("handshake");
        assert_eq!(*path.lock().unwrap_or_else(|p| p.into_inner()), "/v1/agent/pool");
        let hello = match ws.next().await {
            Some(Ok(Message::Text(t))) => serde_json::from_str(t.as_str()).expect("hello is JSON"),
            other => panic!("no hello: {other:?}"),
        };
        (ws, hello)
    }

    #[tokio::test]
    async fn the_agent_says_who_it_is_and_gets_its_assignment() {
        let (listener, dial) = listen().await;
        let node = async {
            let (mut ws, hello) = accept(&listener).await;
            assert_eq!(hello["poolId"], "pool_0123abcd");
            assert_eq!(hello["token"], "s3cret");
            assert_eq!(hello["protocol"], computerd_proto::LINK_PROTOCOL);
            // A ping while it waits is answered, and the wait goes on.
            ws.send(Message::Ping(b"still there?".to_vec().into())).await.expect("ping");
            match ws.next().await {
                Some(Ok(Message::Pong(p))) => assert_eq!(&p[..], b"still there?"),
                other => panic!("no pong: {other:?}"),
            }
            ws.send(Message::Text(good().to_string().into())).await.expect("assign");
            // The agent is done with the socket once it has its answer.
            while let Some(Ok(_)) = ws.next().await {}
        };
        let (assigned, ()) = tokio::join!(wait(&dial, "pool_0123abcd", "s3cret"), node);
        let a = assigned.expect("assigned");
        assert_eq!(
            (a.computer_id.as_str(), a.pairing_code.as_str(), a.first_uid),
            ("cmp_0123", "code-1", Some(123456))
        );
        assert_eq!(a.env.get("PATH_EXTRA").map(String::as_str), Some("/opt/x"));
    }

    #[tokio::test]
    async fn a_dropped_socket_is_dialled_again_until_the_assignment() {
        let (listener, dial) = listen().await;
        let node = async {
            let (ws, hello) = accept(&listener).await;
            assert_eq!(hello["poolId"], "pool_x");
            drop(ws); // gone before an assignment
            let (mut ws, hello) = accept(&listener).await;
            assert_eq!((hello["poolId"].as_str(), hello["token"].as_str()), (Some("pool_x"), Some("t")));
            ws.send(Message::Text(good().to_string().into())).await.expect("assign");
            while let Some(Ok(_)) = ws.next().await {}
        };
        let (assigned, ()) = tokio::join!(wait(&dial, "pool_x", "t"), node);
        assert_eq!(assigned.expect("assigned").computer_id, "cmp_0123");
    }

    #[tokio::test]
    async fn a_refusal_ends_the_wait() {
        let (listener, dial) = listen().await;
        let node = async {
            let (mut ws, _) = accept(&listener).await;
            ws.send(Message::Text(r#"{"error": "wrong token"}"#.into())).await.expect("refuse");
            while let Some(Ok(_)) = ws.next().await {}
        };
        let (refused, ()) = tokio::join!(wait(&dial, "pool_x", "bad"), node);
        assert!(refused.expect_err("refused").contains("wrong token"));
    }

    #[tokio::test]
    async fn an_oversized_answer_is_a_refusal() {
        let (listener, dial) = listen().await;
        let node = async {
            let (mut ws, _) = accept(&listener).await;
            let mut a = good();
            a["env"]["BIG"] = serde_json::json!("x".repeat(MAX_ASSIGNMENT));
            let _ = ws.send(Message::Text(a.to_string().into())).await;
            while let Some(Ok(_)) = ws.next().await {}
        };
        let (refused, ()) = tokio::join!(wait(&dial, "pool_x", "t"), node);
        assert!(refused.expect_err("refused").contains("too large"));
    }
}
