//! `GET /v1/admin/backup`: the whole store as a backup file (`sm::backup`), for `computerd
//! backup`. Owner tokens only (not read-only): the file holds every record, providers'
//! write-only credentials included.

use axum::extract::State;
use axum::http::HeaderValue;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;
use computerd_raft::sm::Role;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::schemas::ErrorBody;

/// `GET /v1/admin/backup` (owner, not read-only): every record as of a linearizable read, in a
/// checksummed file (`application/octet-stream`; its first line names the format, the SHA-256
/// and the length of the rest). `computerd restore --from FILE` starts a new cluster from it.
#[utoipa::path(get, path = "/v1/admin/backup", operation_id = "admin_backup", tag = "cluster", responses((status = 200, description = "The backup file", content_type = "application/octet-stream", body = Vec<u8>), (status = 403, body = ErrorBody)), security(("bearer" = [])))]
pub async fn backup(State(state): State<AppState>, auth: Auth) -> Result<Response, ApiError> {
    let caller = auth.current(&state).await?;
    caller.check_admin_write()?;
    if caller.bot.is_some() || caller.member.role != Role::Owner {
        return Err(ApiError::new(ErrorKind::Forbidden, "only an owner's token takes a backup"));
    }
    // `current` confirmed the read: the state here is at least as new as every write acknowledged
    // before this call.
    let bytes = state
        .cluster
        .state()
        .read_at(computerd_raft::sm::backup::encode)
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("the backup could not be written: {e}")))?;
    tracing::info!(bytes = bytes.len(), by = %caller.token.id, "backup taken");
    let mut r = bytes.into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}
