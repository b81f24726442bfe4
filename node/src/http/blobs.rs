//! Blobs: `POST /api/blobs?sha=<hex>` takes the raw body and checks its SHA-256 (and length,
//! when declared) while it streams; `GET /api/blobs/:id` answers the bytes, `GET …/info` the
//! record. `GET`/`PUT /v1/blob-limits`: the quota per member and the retention after the last
//! reference. The bytes live in the node's blob store ([`crate::blobs`]), the records in the
//! replicated store.

use axum::Json;
use axum::extract::Path;
use axum::extract::Query;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;
use computerd_raft::sm::Blob;
use computerd_raft::sm::BlobLimits;
use computerd_raft::sm::Command;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::Body;
use super::util::propose;
use crate::blobs::PutError;
use crate::ids::new_id;
use crate::ids::now_ms;

/// `POST /api/blobs` query.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PutQuery {
    /// The body's SHA-256, hex.
    sha: String,
    /// Its file name (default `blob`).
    name: Option<String>,
    /// Its media type (default: the request's `Content-Type`, else `application/octet-stream`).
    #[serde(rename = "mimeType")]
    mime_type: Option<String>,
}

fn view(b: &Blob) -> Value {
    json!({
        "blobId": b.id,
        "name": b.name,
        "mimeType": b.mime_type,
        "size": b.size,
        "sha256": b.sha256,
        "by": {"memberId": b.member_id, "botId": b.bot_id},
        "createdAt": b.created_at,
        "lastReferencedAt": b.last_ref_at,
        "nodes": b.nodes,
    })
}

fn check_name(n: &str) -> Result<(), ApiError> {
    if n.is_empty() || n.len() > 255 || n == "." || n == ".." || n.contains('/') || n.chars().any(char::is_control) {
        return Err(ApiError::invalid("name is a file name of 1 to 255 bytes, without `/`"));
    }
    Ok(())
}

fn check_mime(m: &str) -> Result<(), ApiError> {
    let ok = m.len() <= 127
        && m.split_once('/').is_some_and(|(a, b)| {
            let token =
                |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&c));
            token(a) && token(b)
        });
    if !ok {
        return Err(ApiError::invalid("mimeType is a media type such as application/pdf"));
    }
    Ok(())
}

/// `POST /api/blobs`
#[utoipa::path(post, path = "/api/blobs", operation_id = "blobs_put", tag = "blobs", params(PutQuery), request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The raw bytes (at most 1 GiB); `Content-Length`, when sent, is checked too"), responses((status = 200, description = "`{\"blobId\", \"size\", \"sha256\", \"name\", \"mimeType\"}`", body = Object), (status = 409, description = "`conflict`: over the quota", body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, description = "`DigestMismatch`: the bytes are not what was declared; nothing was stored", body = ErrorBody), (status = 503, description = "`unavailable`: in a cluster, no second node took a copy; nothing was stored", body = ErrorBody)), security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    auth: Auth,
    Query(q): Query<PutQuery>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let sha = q.sha.to_ascii_lowercase();
    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::invalid("sha is the body's SHA-256: 64 hex digits"));
    }
    let name = q.name.unwrap_or_else(|| "blob".into());
    check_name(&name)?;
    let from_header = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_string())
        .filter(|m| !m.is_empty());
    let mime = q.mime_type.or(from_header).unwrap_or_else(|| "application/octet-stream".into());
    check_mime(&mime)?;
    let size = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if size.is_some_and(|s| s > crate::blobs::MAX_BLOB) {
        return Err(ApiError::new(ErrorKind::TooLarge, "a blob is at most 1 GiB"));
    }
    // Over the quota already: refused before any byte is stored (the store checks again).
    let (used, quota) = state
        .cluster
        .state()
        .read(|s| (s.exec_index.blob_bytes.get(&caller.member.id).copied().unwrap_or(0), s.blob_limits.quota()));
    if used.saturating_add(size.unwrap_or(0)) > quota {
        return Err(ApiError::new(
            ErrorKind::Conflict,
            format!("over the blob quota: {used} of {quota} bytes are used"),
        ));
    }
    let id = new_id("blb");
    let stream = body.into_data_stream().map(|c| c.map_err(|e| e.to_string()));
    let stored = match state.blobs.put(&id, Some(&sha), size, Box::pin(stream)).await {
        Ok(s) => s,
        Err(PutError::Mismatch(why)) => {
            return Err(ApiError::new(ErrorKind::DigestMismatch, format!("{why}; nothing was stored")));
        }
        Err(PutError::TooLarge) => return Err(ApiError::new(ErrorKind::TooLarge, "a blob is at most 1 GiB")),
        Err(PutError::Body(why)) => return Err(ApiError::invalid(format!("the body stopped: {why}"))),
        Err(PutError::Io(why)) => {
            tracing::error!(error = %why, "the blob store failed");
            return Err(ApiError::new(ErrorKind::Internal, "the blob store failed"));
        }
    };
    let blob = record(&state, &caller, id, name, mime, stored).await?;
    Ok(Json(view(&blob)))
}

/// Records blob bytes just stored on this node, once a second node holds a checked copy too
/// (in a cluster; [`crate::owner::blobs::second_copy`]). Nothing is recorded, and this node's
/// copy goes, when either fails (a peer's copy unrecorded is collected after an hour).
pub(crate) async fn record(
    state: &AppState,
    caller: &computerd_raft::sm::Caller,
    id: String,
    name: String,
    mime: String,
    stored: crate::blobs::Stored,
) -> Result<Blob, ApiError> {
    let nodes = match crate::owner::blobs::second_copy(state, &id, &stored.sha256, stored.size).await {
        Ok(nodes) => nodes,
        Err(e) => {
            state.blobs.remove(&id).await;
            return Err(ApiError::new(
                ErrorKind::Unavailable,
                format!("no second node took a copy, so nothing was stored ({})", e.0),
            ));
        }
    };
    let now = now_ms();
    let blob = Blob {
        id: id.clone(),
        member_id: caller.member.id.clone(),
        bot_id: caller.bot.as_ref().map(|b| b.id.clone()),
        name,
        mime_type: mime,
        size: stored.size,
        sha256: stored.sha256,
        created_at: now,
        last_ref_at: now,
        nodes,
    };
    if let Err(e) = propose(state, Command::BlobPut { by: caller.token.id.clone(), blob: blob.clone() }).await {
        state.blobs.remove(&id).await;
        return Err(e);
    }
    Ok(blob)
}

/// Stores `bytes` (made on this node: a screenshot) as a blob of `caller`'s: the bytes in this
/// node's blob store, the record in the replicated store (the bytes go again if it is refused).
pub async fn store_bytes(
    state: &AppState,
    caller: &computerd_raft::sm::Caller,
    name: &str,
    mime: &str,
    bytes: Vec<u8>,
) -> Result<Blob, ApiError> {
    use sha2::Digest;
    let id = new_id("blb");
    let sha = hex::encode(sha2::Sha256::digest(&bytes));
    let size = bytes.len() as u64;
    let body = futures::stream::once(async move { Ok::<_, String>(bytes::Bytes::from(bytes)) });
    let stored = state.blobs.put(&id, Some(&sha), Some(size), Box::pin(body)).await.map_err(|e| {
        tracing::error!(error = ?e, "the blob store failed");
        ApiError::new(ErrorKind::Internal, "the blob store failed")
    })?;
    record(state, caller, id, name.to_string(), mime.to_string(), stored).await
}

fn readable(state: &AppState, caller: &computerd_raft::sm::Caller, id: &str) -> Result<Blob, ApiError> {
    state.cluster.state().read(|s| {
        s.blobs
            .get(id)
            .filter(|b| s.may_read_blob(caller, b))
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, "no such blob"))
    })
}

/// `GET /api/blobs/:id/info`
#[utoipa::path(get, path = "/api/blobs/{id}/info", operation_id = "blobs_info", tag = "blobs", params(("id" = String, Path)), responses((status = 200, description = "`{\"blobId\", \"name\", \"mimeType\", \"size\", \"sha256\", \"by\", \"createdAt\", \"lastReferencedAt\", \"nodes\"}`: `nodes` are the nodes holding its bytes", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn info(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    Ok(Json(view(&readable(&state, &caller, &id)?)))
}

/// `GET /api/blobs/:id`
#[utoipa::path(get, path = "/api/blobs/{id}", operation_id = "blobs_get", tag = "blobs", params(("id" = String, Path)), responses((status = 200, description = "The bytes, with the blob's `Content-Type`, and its SHA-256 in `X-Sha256`", content_type = "application/octet-stream"), (status = 404, body = ErrorBody), (status = 503, description = "`unavailable`: no node holding the bytes answered", body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Response, ApiError> {
    let caller = auth.current(&state).await?;
    let b = readable(&state, &caller, &id)?;
    // Here, or streamed from a node that holds the bytes.
    let stream = crate::owner::blobs::open(&state, &b).await.map_err(|(kind, why)| ApiError::new(kind, why))?;
    let disposition = format!("attachment; filename*=UTF-8''{}", percent(&b.name));
    Ok((
        [
            (header::CONTENT_TYPE, b.mime_type.clone()),
            (header::CONTENT_LENGTH, b.size.to_string()),
            (header::CONTENT_DISPOSITION, disposition),
            (header::HeaderName::from_static("x-sha256"), b.sha256.clone()),
        ],
        axum::body::Body::from_stream(stream),
    )
        .into_response())
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `GET /v1/blob-limits`
#[utoipa::path(get, path = "/v1/blob-limits", operation_id = "blob_limits_get", tag = "blobs", responses((status = 200, description = "`{\"retentionMs\", \"quotaBytes\"}` in force", body = Object)), security(("bearer" = [])))]
pub async fn limits(State(state): State<AppState>, auth: Auth) -> Result<Json<Value>, ApiError> {
    auth.current(&state).await?;
    let l = state.cluster.state().read(|s| s.blob_limits);
    Ok(Json(json!({"retentionMs": l.retention(), "quotaBytes": l.quota()})))
}

/// `PUT /v1/blob-limits` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitsIn {
    /// How long a blob is kept after its last reference (1 hour to 400 days).
    retention_ms: Option<u64>,
    /// Bytes of blobs per member (with their bots).
    quota_bytes: Option<u64>,
}

/// `PUT /v1/blob-limits`
#[utoipa::path(put, path = "/v1/blob-limits", operation_id = "blob_limits_put", tag = "blobs", request_body = LimitsIn, responses((status = 200, description = "The limits in force", body = Object), (status = 403, body = ErrorBody)), security(("bearer" = [])))]
pub async fn set_limits(
    State(state): State<AppState>,
    auth: Auth,
    body: Body<LimitsIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let limits = BlobLimits { retention_ms: b.retention_ms, quota_bytes: b.quota_bytes };
    propose(&state, Command::SetBlobLimits { by: caller.token.id.clone(), limits }).await?;
    Ok(Json(json!({"retentionMs": limits.retention(), "quotaBytes": limits.quota()})))
}
