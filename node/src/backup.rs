//! `computerd backup`: fetches `GET /v1/admin/backup` from a running cluster with an owner's
//! token, checks the file, and writes it (0600, atomically). `computerd restore` is `serve`
//! with a backup to start a fresh store from (see `server::restore`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use crate::config::BackupConfig;
use crate::error::NodeError;

/// What a written backup holds, for the operator.
pub struct Written {
    /// Bytes written.
    pub bytes: usize,
    /// The cluster it came from.
    pub cluster_id: String,
    /// The last applied log index it reflects.
    pub applied_index: u64,
    /// How many Computers, bots, tokens and blobs it holds.
    pub counts: (usize, usize, usize, usize),
}

/// The largest backup read.
const MAX_BACKUP: usize = 1 << 30;
/// How long the whole exchange may take.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// Takes a backup as `cfg` says.
pub async fn run(cfg: &BackupConfig) -> Result<Written, NodeError> {
    let token = std::fs::read_to_string(&cfg.token_file)
        .map_err(|e| NodeError::Config(format!("--token-file {}: {e}", cfg.token_file.display())))?;
    let token = token.trim();
    let ca = match &cfg.ca_cert {
        Some(p) => {
            Some(std::fs::read_to_string(p).map_err(|e| NodeError::Config(format!("--ca-cert {}: {e}", p.display())))?)
        }
        None => None,
    };
    // (`http://` only to a loopback address: the token must not cross a network in clear.)
    let endpoint = computerd_actors::http_call::Endpoint::parse(&cfg.url, ca.as_deref())
        .map_err(|e| NodeError::Config(format!("--url: {e}")))?
        .with_max_answer(MAX_BACKUP);
    let bearer = format!("Bearer {token}");
    let answer = endpoint
        .call(http::Method::GET, "/v1/admin/backup", &[("Authorization", bearer.as_str())], None, DEADLINE)
        .await
        .map_err(|e| NodeError::Config(e.to_string()))?;
    let body = answer.body;
    if !(200..=299).contains(&answer.status) {
        let text = String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned();
        return Err(NodeError::Config(format!("GET /v1/admin/backup answered {}: {text}", answer.status)));
    }
    let backup = computerd_raft::sm::backup::decode(&body).map_err(NodeError::Config)?;
    let tmp = cfg.out.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &cfg.out)
    };
    write().map_err(|e| NodeError::Config(format!("writing {}: {e}", cfg.out.display())))?;
    let s = &backup.state;
    Ok(Written {
        bytes: body.len(),
        cluster_id: backup.cluster_id.unwrap_or_default(),
        applied_index: backup.applied_index,
        counts: (s.computers.len(), s.bots.len(), s.tokens.len(), backup.blobs.len()),
    })
}
