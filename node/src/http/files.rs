//! Files on a Computer: `GET/PUT/DELETE /v1/computers/:id/files?path=` and
//! `GET /v1/computers/:id/directory?path=`. Contents travel as `utf8` text or `base64`; at most
//! 16 MiB, streamed to and from the agent in chunks.

use axum::Json;
use axum::extract::Path;
use axum::extract::Query;
use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine;
use computerd_proto::ErrorKind;
use computerd_proto::agent::FileChunk;
use computerd_proto::agent::FilePath;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::sessions::agent_error;
use super::sessions::agent_for;
use super::util::Body;

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
}

/// `?path=&encoding=`
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    path: String,
    #[serde(default)]
    encoding: Encoding,
}

/// `?path=`
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    path: String,
}

type Q<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;

fn query<T>(q: Q<T>) -> Result<T, ApiError> {
    q.map(|Query(q)| q).map_err(|e| ApiError::invalid(e.body_text()))
}

/// `GET /v1/computers/:id/files?path=&encoding=`
pub async fn read(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    q: Q<FileQuery>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let q = query(q)?;
    let mut agent = agent_for(&state, &caller, &id, false).await?;
    let mut stream = agent.read_file(FilePath { path: q.path.clone() }).await.map_err(agent_error)?.into_inner();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(agent_error)?;
        if bytes.len() + chunk.data.len() > MAX_FILE {
            return Err(ApiError::new(ErrorKind::TooLarge, "the file is larger than 16 MiB"));
        }
        bytes.extend_from_slice(&chunk.data);
    }
    let size = bytes.len();
    let content = match q.encoding {
        Encoding::Utf8 => String::from_utf8(bytes)
            .map_err(|_| ApiError::invalid("the file is not valid UTF-8; read it with encoding=base64"))?,
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(&bytes),
    };
    let encoding = if q.encoding == Encoding::Utf8 { "utf8" } else { "base64" };
    Ok(Json(json!({ "path": q.path, "encoding": encoding, "size": size, "content": content })))
}

/// `PUT …/files` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteIn {
    content: String,
    #[serde(default)]
    encoding: Encoding,
}

/// `PUT /v1/computers/:id/files?path=`: writes the whole file (atomically, by rename).
pub async fn write(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    q: Q<PathQuery>,
    body: Body<WriteIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let q = query(q)?;
    let Json(b) = body?;
    let bytes = match b.encoding {
        Encoding::Utf8 => b.content.into_bytes(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(b.content.as_bytes())
            .map_err(|_| ApiError::invalid("content is not valid base64"))?,
    };
    if bytes.len() > MAX_FILE {
        return Err(ApiError::new(ErrorKind::TooLarge, "a file is at most 16 MiB"));
    }
    let mut agent = agent_for(&state, &caller, &id, true).await?;
    let path = q.path.clone();
    let mut chunks: Vec<FileChunk> =
        bytes.chunks(CHUNK).map(|c| FileChunk { path: String::new(), data: c.to_vec() }).collect();
    match chunks.first_mut() {
        Some(first) => first.path = path.clone(),
        None => chunks.push(FileChunk { path: path.clone(), data: Vec::new() }),
    }
    let info = agent.write_file(futures::stream::iter(chunks)).await.map_err(agent_error)?.into_inner();
    Ok(Json(json!({ "path": path, "size": info.size, "mode": info.mode, "mtime": info.mtime })))
}

/// `DELETE /v1/computers/:id/files?path=`
pub async fn remove(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    q: Q<PathQuery>,
) -> Result<StatusCode, ApiError> {
    let caller = auth.current(&state).await?;
    let q = query(q)?;
    let mut agent = agent_for(&state, &caller, &id, true).await?;
    agent.remove_file(FilePath { path: q.path }).await.map_err(agent_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/computers/:id/directory?path=`
pub async fn directory(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    q: Q<PathQuery>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let q = query(q)?;
    let mut agent = agent_for(&state, &caller, &id, false).await?;
    let list = agent.list_directory(FilePath { path: q.path.clone() }).await.map_err(agent_error)?.into_inner();
    let entries: Vec<Value> = list
        .entries
        .into_iter()
        .map(|e| json!({"name": e.name, "type": e.kind, "size": e.size, "mode": e.mode, "mtime": e.mtime}))
        .collect();
    Ok(Json(json!({ "path": q.path, "entries": entries })))
}
