//! Authentication: a bearer token is hashed and looked up in the replicated store.
//!
//! Reads that decide rights are current: the caller is resolved after a quorum-confirmed read
//! barrier. Writes resolve the caller on the local replica to refuse obvious garbage early, and
//! the state machine checks the rights again when the command applies.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use computerd_proto::ErrorKind;
use computerd_raft::sm::Caller;
use computerd_raft::sm::hash_secret;

use super::ApiError;
use super::AppState;

/// The hash of the bearer token of a request (the secret itself is dropped at once).
pub struct Auth {
    hash: String,
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &AppState) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .ok_or_else(|| ApiError::new(ErrorKind::Unauthorized, "missing Authorization: Bearer <token>"))?;
        let value = header
            .to_str()
            .map_err(|_| ApiError::new(ErrorKind::Unauthorized, "the Authorization header is not valid"))?;
        let secret = value
            .strip_prefix("Bearer ")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ApiError::new(ErrorKind::Unauthorized, "missing Authorization: Bearer <token>"))?;
        Ok(Auth { hash: hash_secret(secret) })
    }
}

impl Auth {
    /// The bearer token of `headers`, if there is a well-formed one.
    pub fn from_headers(headers: &axum::http::HeaderMap) -> Option<Auth> {
        let secret = headers.get(AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ")?.trim();
        (!secret.is_empty()).then(|| Auth { hash: hash_secret(secret) })
    }

    /// The hash of the bearer secret.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The caller as of a linearizable read: for decisions made outside the state machine.
    pub async fn current(&self, state: &AppState) -> Result<Caller, ApiError> {
        state.cluster.read_barrier().await?;
        Ok(state.cluster.state().read(|s| s.caller_by_hash(&self.hash))?)
    }

    /// The caller as this replica knows it; if it does not, as of a linearizable read (the token
    /// may be newer than this replica). The state machine re-checks when the write applies.
    pub async fn for_write(&self, state: &AppState) -> Result<Caller, ApiError> {
        match state.cluster.state().read(|s| s.caller_by_hash(&self.hash)) {
            Ok(c) => Ok(c),
            Err(_) => self.current(state).await,
        }
    }
}
