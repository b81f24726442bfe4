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
    let url = format!("{}/v1/agent/pair", dial.server);
    let mut client = reqwest::Client::builder();
    if let Some(tls) = &dial.tls {
        client = client.use_preconfigured_tls((**tls).clone());
    }
    let client = client.build().map_err(|e| PairError::Unreachable(e.to_string()))?;
    let resp = client
        .post(&url)
        .json(&serde_json::json!({ "code": code }))
        .send()
        .await
        .map_err(|e| PairError::Unreachable(e.to_string()))?;
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or(serde_json::Value::Null);
    if !status.is_success() {
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
