//! The gateway's control socket ([`SOCKET`](super::SOCKET), mode 0600, in the gateway
//! container's own file system: the sandbox shares the network namespace, not the files, and
//! a path socket, unlike an abstract one, is not reachable through the network namespace).
//!
//! One request per connection, one JSON line each way:
//!
//! - `{"op":"set","policy":{...},"revision":r}` → `{"policy":{...},"cut":n}` once the rules are
//!   in place, the proxy uses the policy and the `n` open connections it refuses are cut;
//!   `{"stale":true}` when a policy of a later revision is in force (nothing changed); or
//!   `{"error":"..."}` (a policy that does not compile, rules that failed: nothing changed).
//! - `{"op":"stats"}` → `{"policy":{...}|null,"allowed":n,"denied":n,"cut":n,"recent":[{"host",
//!   "port","at"}...]}` (the last [`RECENT`](super::proxy::RECENT) refusals, newest last).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use computerd_proto::egress::EgressPolicy;
use serde::Deserialize;
use serde::Serialize;
use tokio::io::AsyncBufReadExt;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use tokio::net::UnixStream;

use super::proxy::Gateway;

/// The longest request line.
const MAX_REQUEST: u64 = 256 * 1024;

/// How long a client may take to send its request.
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// How long `set` and `stats` keep trying to reach a gateway that is starting.
const CONNECT_FOR: Duration = Duration::from_secs(10);

/// Between two tries.
const CONNECT_EVERY: Duration = Duration::from_millis(20);

/// How long the answer may take (a change runs `iptables-restore` and waits for its cuts).
const ANSWER_DEADLINE: Duration = Duration::from_secs(60);

/// A request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Put a policy in force.
    Set {
        /// The policy.
        policy: EgressPolicy,
        /// Its revision (the store's): an older one than the policy in force is ignored.
        #[serde(default)]
        revision: u64,
    },
    /// The policy and the counts.
    Stats,
}

/// Listens on `path` (a stale socket removed first), mode 0600.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(std::io::Error::other("something that is not a socket is there"));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Answers requests forever.
pub async fn serve(gateway: Arc<Gateway>, listener: UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(answer(gateway.clone(), stream));
            }
            Err(e) => {
                super::say(&format!("egress gateway: control accept: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One request, one answer.
async fn answer(gateway: Arc<Gateway>, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read.take(MAX_REQUEST));
    let read = tokio::time::timeout(REQUEST_DEADLINE, reader.read_line(&mut line)).await;
    #[derive(Serialize)]
    struct Set {
        policy: EgressPolicy,
        cut: usize,
    }
    let error = |e: String| serde_json::json!({ "error": e }).to_string();
    let mut out = match read {
        Ok(Ok(_)) => match serde_json::from_str::<Request>(&line) {
            Ok(Request::Set { policy, revision }) => match gateway.set(policy.clone(), revision).await {
                Ok(Some(cut)) => serde_json::to_string(&Set { policy, cut }).unwrap_or_else(|e| error(e.to_string())),
                Ok(None) => serde_json::json!({ "stale": true }).to_string(),
                Err(e) => error(e),
            },
            Ok(Request::Stats) => gateway.stats(),
            Err(e) => error(format!("not a request: {e}")),
        },
        Ok(Err(e)) => error(format!("reading the request: {e}")),
        Err(_) => error("no request in time".into()),
    };
    out.push('\n');
    let _ = write.write_all(out.as_bytes()).await;
    let _ = write.shutdown().await;
}

/// Sends `request` to the gateway at `path` and reads its answer (its JSON text, one line):
/// `Err` for an `{"error"}` answer or when the gateway cannot be reached. The socket is tried
/// every 20 ms for up to 10 s while it does not exist or refuses (the gateway is starting).
pub async fn request(path: &Path, request: &Request) -> Result<String, String> {
    let give_up = tokio::time::Instant::now() + CONNECT_FOR;
    let stream = loop {
        match UnixStream::connect(path).await {
            Ok(s) => break s,
            Err(e)
                if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused)
                    && tokio::time::Instant::now() < give_up =>
            {
                tokio::time::sleep(CONNECT_EVERY).await;
            }
            Err(e) => return Err(format!("cannot reach the gateway at {}: {e}", path.display())),
        }
    };
    let mut line = serde_json::to_string(request).map_err(|e| e.to_string())?;
    line.push('\n');
    let exchange = async {
        let mut stream = stream;
        stream.write_all(line.as_bytes()).await?;
        let mut answer = String::new();
        tokio::io::BufReader::new(stream).read_line(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = match tokio::time::timeout(ANSWER_DEADLINE, exchange).await {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return Err(format!("talking to the gateway: {e}")),
        Err(_) => return Err("the gateway did not answer in time".into()),
    };
    let value: serde_json::Value =
        serde_json::from_str(&answer).map_err(|e| format!("the gateway's answer is not JSON ({e}): {answer:?}"))?;
    match value.get("error") {
        Some(e) => Err(e.as_str().map_or_else(|| e.to_string(), str::to_string)),
        None => Ok(answer.trim_end().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_one_json_object_each() {
        let set: Request =
            serde_json::from_str(r#"{"op":"set","policy":{"default":"deny","allow":["allowed.test"]}}"#).expect("set");
        assert!(matches!(&set, Request::Set { policy, .. } if policy.allow == ["allowed.test"]));
        assert_eq!(serde_json::from_str::<Request>(r#"{"op":"stats"}"#).expect("stats"), Request::Stats);
        assert_eq!(serde_json::to_string(&Request::Stats).expect("json"), r#"{"op":"stats"}"#);
        assert!(serde_json::from_str::<Request>(r#"{"op":"set","policy":{"default":"maybe"}}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"flush"}"#).is_err());
    }

    #[tokio::test]
    async fn stats_over_the_socket_and_a_bad_policy_refused() {
        let dir = tempfile::tempdir().expect("a dir");
        let path = dir.path().join("egress.sock");
        // A stale socket is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).expect("stale"));
        let listener = bind(&path).expect("bound");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777, 0o600);
        let gateway = Arc::new(Gateway::new(super::super::Config::default(), vec![]));
        tokio::spawn(serve(gateway, listener));
        let stats = request(&path, &Request::Stats).await.expect("stats");
        let stats: serde_json::Value = serde_json::from_str(&stats).expect("JSON");
        assert_eq!(stats["policy"], serde_json::Value::Null);
        assert_eq!(stats["allowed"], 0);
        assert!(stats["recent"].as_array().is_some_and(Vec::is_empty));
        // Refused before any rule is touched (it does not compile).
        let bad = EgressPolicy { default: Default::default(), allow: vec!["not a name".into()], deny: vec![] };
        let err = request(&path, &Request::Set { policy: bad, revision: 0 }).await.expect_err("refused");
        assert!(err.contains("not a name"), "{err}");
    }

    #[tokio::test]
    async fn a_client_waits_for_a_gateway_that_is_starting() {
        let dir = tempfile::tempdir().expect("a dir");
        let path = dir.path().join("late.sock");
        let late = path.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let listener = bind(&late).expect("bound");
            serve(Arc::new(Gateway::new(super::super::Config::default(), vec![])), listener).await;
        });
        let started = std::time::Instant::now();
        let stats = request(&path, &Request::Stats).await.expect("answered once up");
        let stats: serde_json::Value = serde_json::from_str(&stats).expect("JSON");
        assert_eq!(stats["cut"], 0);
        assert!(started.elapsed() >= Duration::from_millis(300));
    }
}
