//! Files on a Computer: `GET/PUT/DELETE /v1/computers/:id/files?path=`,
//! `POST /v1/computers/:id/files/edit` and `GET /v1/computers/:id/directory?path=`. A read may
//! take a range (`offset`, `length`) of a file of any size. Contents travel as `utf8` text or `base64` inside
//! JSON, or as the raw bytes of the body (`encoding=raw` or `Accept: application/octet-stream` to
//! read, `Content-Type: application/octet-stream` to write), streamed both ways without holding
//! the file. At most 16 MiB, sent to and read from the agent in chunks.

use axum::Json;
use axum::body::Body as RawBody;
use axum::extract::Path;
use axum::extract::Query;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::StatusCode;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::Response;
use base64::Engine;
use computerd_proto::ErrorKind;
use computerd_proto::agent::FileChunk;
use computerd_proto::agent::FileEdit;
use computerd_proto::agent::FilePath;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::calls::RunAs;
use super::calls::agent_for;
use super::calls::parse_user;
use super::calls::run_as;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use crate::owner::CallError;

/// The largest file.
pub const MAX_FILE: usize = 16 << 20;
const CHUNK: usize = 256 * 1024;

/// How contents are carried.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// UTF-8 text.
    #[default]
    Utf8,
    /// Base64 of the bytes.
    Base64,
    /// The bytes themselves, as the whole body (`application/octet-stream`).
    Raw,
}

const OCTETS: &str = "application/octet-stream";

fn wants_octets(headers: &HeaderMap, header: header::HeaderName) -> bool {
    headers.get(header).and_then(|v| v.to_str().ok()).is_some_and(|v| v.split(',').any(|t| t.trim() == OCTETS))
}

/// `?path=&encoding=`
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    path: String,
    #[serde(default)]
    encoding: Encoding,
    /// `user` (the default) or `root`.
    user: Option<String>,
    /// A ranged read (files of any size): from this byte.
    offset: Option<u64>,
    /// A ranged read: at most this many bytes (at most 16 MiB, the default).
    length: Option<u64>,
}

/// `?path=&user=`
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    path: String,
    /// `user` (the default) or `root`.
    user: Option<String>,
}

type Q<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;

fn query<T>(q: Q<T>) -> Result<T, ApiError> {
    q.map(|Query(q)| q).map_err(|e| ApiError::invalid(e.body_text()))
}

/// `GET /v1/computers/:id/files?path=&encoding=[&offset=&length=]`
#[utoipa::path(get, path = "/v1/computers/{id}/files", operation_id = "files_read", tag = "files", params(("id" = String, Path), ("path" = String, Query, description = "Relative paths start at the workspace"), ("encoding" = Option<String>, Query, description = "`utf8` (default), `base64` or `raw`"), ("user" = Option<String>, Query, description = "`user` (default) or `root`"), ("offset" = Option<u64>, Query, description = "A ranged read, of a file of any size: from this byte"), ("length" = Option<u64>, Query, description = "A ranged read: at most this many bytes (at most 16 MiB, the default)")), responses((status = 200, description = "`{\"path\", \"content\", \"encoding\", \"size\"}`, or the bytes with `Accept: application/octet-stream`. A ranged read adds `offset` (where `content` starts; a `utf8` range starts and ends on whole characters) and `totalSize` (the file's size); raw, the size is in `X-File-Size`", body = Object), (status = 404, body = ErrorBody), (status = 413, description = "a whole read of a file over 16 MiB (read it by ranges), or a `length` over 16 MiB", body = ErrorBody)), security(("bearer" = [])))]
pub async fn read(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Q<FileQuery>,
) -> Result<Response, ApiError> {
    let caller = auth.current(&state).await?;
    let q = query(q)?;
    if q.length.is_some_and(|n| n > MAX_FILE as u64) {
        return Err(ApiError::new(ErrorKind::TooLarge, "a ranged read is at most 16 MiB (`length`)"));
    }
    let ranged = q.offset.is_some() || q.length.is_some();
    let who = run_as(&state, &caller, &id, parse_user(q.user.as_deref())?)?;
    // A bot on a paired machine reads only under the paths its grant names, as it copies out.
    let within = super::calls::read_roots(&state, &caller, &id)?;
    let mut agent = agent_for(&state, &caller, &id, false).await?;
    let path = FilePath { within, offset: q.offset, length: q.length, ..file_path(&q.path, who) };
    let mut stream = agent
        .read_file(path)
        .await
        .map_err(|s| match agent_error(s) {
            e if e.kind == ErrorKind::TooLarge && !ranged => ApiError::new(
                ErrorKind::TooLarge,
                "the file is larger than 16 MiB: read it by ranges (`offset`, `length`)",
            ),
            e => e,
        })?
        .into_inner();
    // A ranged read's first chunk carries the file's size (an agent older than ranges sends
    // none, and would send the whole file).
    let (first, total) = if ranged {
        let first = stream.next().await.transpose().map_err(agent_error)?.unwrap_or_default();
        let total = first.total_size.ok_or_else(|| {
            ApiError::new(ErrorKind::ComputerUnsupported, "this Computer's agent is older than ranged reads: update it")
        })?;
        (Some(first), Some(total))
    } else {
        (None, None)
    };
    let stream = futures::stream::iter(first.map(Ok)).chain(stream);
    if q.encoding == Encoding::Raw || wants_octets(&headers, header::ACCEPT) {
        // The agent refused anything missing, unreadable or too large before the first byte, so the
        // status is known; a link lost midway cuts the body.
        let body = RawBody::from_stream(stream.map(|c| c.map(|c| c.data)));
        let mut r = ([(header::CONTENT_TYPE, OCTETS)], body).into_response();
        if let Some(total) = total {
            r.headers_mut().insert("x-file-size", total.into());
        }
        return Ok(r);
    }
    let mut stream = stream;
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(agent_error)?;
        if bytes.len() + chunk.data.len() > MAX_FILE {
            return Err(ApiError::new(
                ErrorKind::TooLarge,
                "the file is larger than 16 MiB: read it by ranges (`offset`, `length`)",
            ));
        }
        bytes.extend_from_slice(&chunk.data);
    }
    let (skip, content) = match q.encoding {
        Encoding::Utf8 => {
            let (skip, text) = utf8_window(&bytes, ranged)
                .ok_or_else(|| ApiError::invalid("the file is not valid UTF-8; read it with encoding=base64"))?;
            (skip, text.to_string())
        }
        _ => (0, base64::engine::general_purpose::STANDARD.encode(&bytes)),
    };
    let size = if q.encoding == Encoding::Utf8 { content.len() } else { bytes.len() };
    let encoding = if q.encoding == Encoding::Utf8 { "utf8" } else { "base64" };
    let mut answer = json!({ "path": q.path, "encoding": encoding, "size": size, "content": content });
    if let Some(total) = total {
        answer["offset"] = json!(q.offset.unwrap_or(0).min(total) + skip as u64);
        answer["totalSize"] = json!(total);
    }
    Ok(Json(answer).into_response())
}

/// The text of `bytes`: whole, or for a range, from its first whole character to its last (a
/// range may begin or end inside one); answers how many bytes were skipped at the start. `None`:
/// not UTF-8.
fn utf8_window(bytes: &[u8], ranged: bool) -> Option<(usize, &str)> {
    let skip = if ranged { bytes.iter().take(3).take_while(|b| (**b & 0xC0) == 0x80).count() } else { 0 };
    let rest = &bytes[skip..];
    match std::str::from_utf8(rest) {
        Ok(s) => Some((skip, s)),
        Err(e) if ranged && e.error_len().is_none() => {
            std::str::from_utf8(&rest[..e.valid_up_to()]).ok().map(|s| (skip, s))
        }
        Err(_) => None,
    }
}

/// `PUT …/files` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteIn {
    content: String,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    encoding: Encoding,
}

/// `PUT /v1/computers/:id/files?path=`: writes the whole file (atomically, by rename). The body
/// is JSON (`content`, `encoding`) or, with `Content-Type: application/octet-stream`, the bytes.
#[utoipa::path(put, path = "/v1/computers/{id}/files", operation_id = "files_write", tag = "files", params(("id" = String, Path), ("path" = String, Query), ("user" = Option<String>, Query)), request_body(content = WriteIn, description = "JSON, or the bytes with `Content-Type: application/octet-stream`"), responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 413, body = ErrorBody)), security(("bearer" = [])))]
pub async fn write(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Q<PathQuery>,
    body: RawBody,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let q = query(q)?;
    let who = run_as(&state, &caller, &id, parse_user(q.user.as_deref())?)?;
    let path = q.path;
    let info = if wants_octets(&headers, header::CONTENT_TYPE) {
        let mut agent = agent_for(&state, &caller, &id, true).await?;
        write_streamed(&mut agent, &path, &who, body).await?
    } else {
        let raw = axum::body::to_bytes(body, MAX_FILE * 4 / 3 + 64 * 1024)
            .await
            .map_err(|_| ApiError::new(ErrorKind::TooLarge, "a file is at most 16 MiB"))?;
        let b: WriteIn = serde_json::from_slice(&raw).map_err(|e| ApiError::invalid(format!("bad body: {e}")))?;
        let bytes = match b.encoding {
            Encoding::Utf8 => b.content.into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(b.content.as_bytes())
                .map_err(|_| ApiError::invalid("content is not valid base64"))?,
            Encoding::Raw => {
                return Err(ApiError::invalid("send raw bytes with Content-Type: application/octet-stream"));
            }
        };
        if bytes.len() > MAX_FILE {
            return Err(ApiError::new(ErrorKind::TooLarge, "a file is at most 16 MiB"));
        }
        let mut agent = agent_for(&state, &caller, &id, true).await?;
        let mut chunks: Vec<FileChunk> = bytes
            .chunks(CHUNK)
            .map(|c| FileChunk { data: bytes::Bytes::copy_from_slice(c), ..Default::default() })
            .collect();
        if chunks.is_empty() {
            chunks.push(FileChunk::default());
        }
        if let Some(first) = chunks.first_mut() {
            *first = first_chunk(&path, &who, std::mem::take(&mut first.data));
        }
        agent.write_file(futures::stream::iter(chunks)).await.map_err(agent_error)?.into_inner()
    };
    Ok(Json(json!({ "path": path, "size": info.size, "mode": info.mode, "mtime": info.mtime })))
}

/// Streams a raw body to the agent in chunks of up to `CHUNK` bytes. A body that is cut or grows
/// past 16 MiB cancels the agent's call (never a clean end of stream), so the agent discards its
/// temporary file and the old file stays.
async fn write_streamed(
    agent: &mut computerd_actors::link::Agent,
    path: &str,
    who: &RunAs,
    body: RawBody,
) -> Result<computerd_proto::agent::FileInfo, ApiError> {
    let (tx, rx) = tokio::sync::mpsc::channel::<FileChunk>(4);
    let feeder = tx.clone();
    let feed = async move {
        let mut data = body.into_data_stream();
        let mut pending: Vec<u8> = Vec::with_capacity(CHUNK);
        let mut total = 0usize;
        let mut first = true;
        let chunk = |data: Vec<u8>, first: &mut bool| {
            let data = bytes::Bytes::from(data);
            if std::mem::take(first) { first_chunk(path, who, data) } else { FileChunk { data, ..Default::default() } }
        };
        while let Some(frame) = data.next().await {
            let frame = frame.map_err(|_| ApiError::invalid("the body was cut"))?;
            total += frame.len();
            if total > MAX_FILE {
                return Err(ApiError::new(ErrorKind::TooLarge, "a file is at most 16 MiB"));
            }
            pending.extend_from_slice(&frame);
            if pending.len() >= CHUNK {
                let full = std::mem::replace(&mut pending, Vec::with_capacity(CHUNK));
                feeder.send(chunk(full, &mut first)).await.map_err(|_| gone())?;
            }
        }
        if first || !pending.is_empty() {
            feeder.send(chunk(pending, &mut first)).await.map_err(|_| gone())?;
        }
        Ok::<_, ApiError>(())
    };
    let call = agent.write_file(tokio_stream::wrappers::ReceiverStream::new(rx));
    tokio::pin!(feed);
    tokio::pin!(call);
    tokio::select! {
        answer = &mut call => return Ok(answer.map_err(agent_error)?.into_inner()),
        // On an error `call` is dropped (cancelled) before `tx`, so the agent sees a reset, not an end.
        done = &mut feed => done?,
    }
    drop(tx);
    Ok(call.await.map_err(agent_error)?.into_inner())
}

fn gone() -> ApiError {
    ApiError::new(ErrorKind::ComputerExecutionFailed, "the computer's link closed during the write")
}

/// `DELETE /v1/computers/:id/files?path=`
#[utoipa::path(delete, path = "/v1/computers/{id}/files", operation_id = "files_remove", tag = "files", params(("id" = String, Path), ("path" = String, Query), ("user" = Option<String>, Query)), responses((status = 204, description = "Removed"), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    q: Q<PathQuery>,
) -> Result<StatusCode, ApiError> {
    let caller = auth.current(&state).await?;
    let q = query(q)?;
    let who = run_as(&state, &caller, &id, parse_user(q.user.as_deref())?)?;
    let mut agent = agent_for(&state, &caller, &id, true).await?;
    agent.remove_file(file_path(&q.path, who)).await.map_err(agent_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST …/files/edit` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EditIn {
    /// The file (relative paths start at the workspace).
    path: String,
    /// The exact text to replace: it must occur exactly once.
    old: String,
    /// What replaces it (may be empty).
    new: String,
    /// `user` (the default) or `root`.
    #[serde(default)]
    user: Option<String>,
}

/// `POST /v1/computers/:id/files/edit`: replaces the one occurrence of `old` with `new`, written
/// whole by rename in the agent (mode and owner kept; at most 16 MiB).
#[utoipa::path(post, path = "/v1/computers/{id}/files/edit", operation_id = "files_edit", tag = "files", params(("id" = String, Path)), request_body = EditIn, responses((status = 200, description = "`{\"path\", \"size\", \"mode\", \"mtime\"}` of the edited file", body = Object), (status = 400, description = "`invalid_request`: `old` is empty, does not occur, or occurs more than once (the file is unchanged); a directory, a symlink or not a regular file", body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, description = "`conflict`: the file changed during the edit (unchanged by it)", body = ErrorBody), (status = 413, body = ErrorBody)), security(("bearer" = [])))]
pub async fn edit(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Result<Json<EditIn>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let Json(b) = body.map_err(|e| ApiError::invalid(format!("bad body: {}", e.body_text())))?;
    if b.old.is_empty() {
        return Err(ApiError::invalid("`old` is empty: an edit replaces some text"));
    }
    if b.old.len() + b.new.len() > MAX_FILE {
        return Err(ApiError::new(ErrorKind::TooLarge, "a file is at most 16 MiB"));
    }
    let who = run_as(&state, &caller, &id, parse_user(b.user.as_deref())?)?;
    let mut agent = agent_for(&state, &caller, &id, true).await?;
    let edit =
        FileEdit { path: b.path.clone(), user: who.user, root_allowed: who.root_allowed, old: b.old, new: b.new };
    let info = agent.edit_file(edit).await.map_err(|s| {
        if s.code() == tonic::Code::Unimplemented {
            ApiError::new(ErrorKind::ComputerUnsupported, "this Computer's agent is older than file edits: update it")
        } else {
            agent_error(s)
        }
    })?;
    let info = info.into_inner();
    Ok(Json(json!({ "path": b.path, "size": info.size, "mode": info.mode, "mtime": info.mtime })))
}

/// `GET /v1/computers/:id/directory?path=`
#[utoipa::path(get, path = "/v1/computers/{id}/directory", operation_id = "files_directory", tag = "files", params(("id" = String, Path), ("path" = String, Query), ("user" = Option<String>, Query)), responses((status = 200, description = "`{\"entries\": [...]}`", body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn directory(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    q: Q<PathQuery>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let q = query(q)?;
    let who = run_as(&state, &caller, &id, parse_user(q.user.as_deref())?)?;
    let within = super::calls::read_roots(&state, &caller, &id)?;
    let mut agent = agent_for(&state, &caller, &id, false).await?;
    let path = FilePath { within, ..file_path(&q.path, who) };
    let list = agent.list_directory(path).await.map_err(agent_error)?.into_inner();
    let entries: Vec<Value> = list
        .entries
        .into_iter()
        .map(|e| json!({"name": e.name, "type": e.kind, "size": e.size, "mode": e.mode, "mtime": e.mtime}))
        .collect();
    Ok(Json(json!({ "path": q.path, "entries": entries })))
}

fn file_path(path: &str, who: RunAs) -> FilePath {
    FilePath { path: path.to_string(), user: who.user, root_allowed: who.root_allowed, ..Default::default() }
}

/// The first chunk of a write: it names the path and who writes it.
fn first_chunk(path: &str, who: &RunAs, data: bytes::Bytes) -> FileChunk {
    FileChunk {
        path: path.to_string(),
        data,
        user: who.user.clone(),
        root_allowed: who.root_allowed,
        ..Default::default()
    }
}

/// The caller's error for an agent's answer (the owner path's one mapping).
fn agent_error(s: tonic::Status) -> ApiError {
    CallError::from_status(s).into()
}
