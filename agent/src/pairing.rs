//! Pairing: a one-time code becomes a machine credential, kept in the state dir (mode 0600).
//! The server keeps only the credential's hash.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::path::PathBuf;

use serde::Deserialize;
use serde::Serialize;

/// What the state dir keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credential {
    /// The Computer this machine is.
    pub computer_id: String,
    /// The machine credential (secret).
    pub credential: String,
}

/// Why pairing or loading failed.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    /// The server refused the code.
    #[error("the pairing code was refused: {0}")]
    Refused(String),
    /// The server could not be reached.
    #[error("cannot reach the server: {0}")]
    Unreachable(String),
    /// The state dir could not be read or written.
    #[error("state dir: {0}")]
    State(String),
    /// No credential stored and no code given.
    #[error("this machine is not paired: run with --pair CODE")]
    NotPaired,
}

fn path(state: &Path) -> PathBuf {
    state.join("credential.json")
}

/// The stored credential.
pub fn load(state: &Path) -> Result<Credential, PairError> {
    match std::fs::read(path(state)) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| PairError::State(format!("credential.json is corrupt: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(PairError::NotPaired),
        Err(e) => Err(PairError::State(e.to_string())),
    }
}

fn save(state: &Path, c: &Credential) -> Result<(), PairError> {
    std::fs::create_dir_all(state).map_err(|e| PairError::State(e.to_string()))?;
    let tmp = state.join("credential.json.tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| PairError::State(e.to_string()))?;
    let bytes = serde_json::to_vec(c).map_err(|e| PairError::State(e.to_string()))?;
    f.write_all(&bytes).and_then(|_| f.sync_all()).map_err(|e| PairError::State(e.to_string()))?;
    std::fs::rename(&tmp, path(state)).map_err(|e| PairError::State(e.to_string()))
}

/// Trades `code` for a credential at `server` and stores it. Nothing is stored on refusal.
pub async fn pair(dial: &crate::tls::Dial, code: &str, state: &Path) -> Result<Credential, PairError> {
    let (status, body) = post_json(dial, "/v1/agent/pair", &serde_json::json!({ "code": code }))
        .await
        .map_err(PairError::Unreachable)?;
    if !(200..300).contains(&status) {
        let msg = body["error"]["message"].as_str().unwrap_or("no reason given").to_string();
        return Err(PairError::Refused(format!("{status}: {msg}")));
    }
    let c = Credential {
        computer_id: body["computerId"]
            .as_str()
            .ok_or_else(|| PairError::Refused("no computerId in the answer".into()))?
            .into(),
        credential: body["credential"]
            .as_str()
            .ok_or_else(|| PairError::Refused("no credential in the answer".into()))?
            .into(),
    };
    save(state, &c)?;
    Ok(c)
}

/// One JSON POST to the server (HTTP/1.1, over TLS for an https:// server): status and body.
async fn post_json(
    dial: &crate::tls::Dial,
    path: &str,
    body: &serde_json::Value,
) -> Result<(u16, serde_json::Value), String> {
    use http_body_util::BodyExt;
    let uri: http::Uri = format!("{}{path}", dial.server).parse().map_err(|e| format!("{}: {e}", dial.server))?;
    let host = uri.host().ok_or_else(|| format!("{}: no host", dial.server))?.to_string();
    let port = uri.port_u16().unwrap_or(if dial.tls.is_some() { 443 } else { 80 });
    let authority = uri.authority().map(|a| a.to_string()).unwrap_or_else(|| host.clone());
    let bytes = serde_json::to_vec(body).map_err(|e| e.to_string())?;
    let req = http::Request::post(uri.path())
        .header(http::header::HOST, authority)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(bytes)))
        .map_err(|e| e.to_string())?;
    let call = async {
        let bare = host.trim_start_matches('[').trim_end_matches(']').to_string();
        let tcp = tokio::net::TcpStream::connect((bare.as_str(), port)).await.map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let resp = match &dial.tls {
            Some(config) => {
                let name = rustls::pki_types::ServerName::try_from(bare).map_err(|e| e.to_string())?;
                let tls = tokio_rustls::TlsConnector::from(config.clone())
                    .connect(name, tcp)
                    .await
                    .map_err(|e| e.to_string())?;
                send(hyper_util::rt::TokioIo::new(tls), req).await?
            }
            None => send(hyper_util::rt::TokioIo::new(tcp), req).await?,
        };
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok::<_, String>((status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null)))
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), call)
        .await
        .map_err(|_| "no answer within 30 s".to_string())?
}

async fn send<I>(
    io: I,
    req: http::Request<http_body_util::Full<bytes::Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.map_err(|e| e.to_string())
}
