//! Copies with checks between blobs and a Computer: `POST …/copy-to-box {"blobId", "path"}`
//! streams a blob through the agent's link into the Computer, where the agent checks its length
//! and SHA-256 before the file is put in place (a mismatch leaves nothing), and records an
//! artifact that later steps name; `POST …/copy-from-box {"path"}` makes a blob of a
//! Computer's file. Both run as the Computer's `user` (or `root`, with the right), on the node
//! holding the link, like file calls.

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use computerd_proto::ErrorKind;
use computerd_proto::agent::FilePath;
use computerd_raft::sm::Artifact;
use computerd_raft::sm::Command;
use futures::SinkExt;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;

use super::ApiError;
use super::AppState;
use super::Auth;
use super::calls::agent_for;
use super::calls::parse_user;
use super::calls::run_as;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
use super::util::Body;
use super::util::propose;
use crate::ids::new_id;
use crate::ids::now_ms;
use crate::owner::CallError;

/// A copy is at most this large (the agent's file bound).
const MAX_COPY: u64 = 16 << 20;

/// `POST …/copy-to-box` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToBoxIn {
    /// The blob.
    blob_id: String,
    /// Where it goes (relative paths start at the workspace).
    path: String,
    /// `user` (the default) or `root`.
    #[serde(default)]
    user: Option<String>,
}

/// `POST …/copy-from-box` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FromBoxIn {
    /// The file.
    path: String,
    /// The blob's media type (default `application/octet-stream`).
    #[serde(default)]
    mime_type: Option<String>,
    /// `user` (the default) or `root`.
    #[serde(default)]
    user: Option<String>,
}

fn agent_error(s: tonic::Status) -> ApiError {
    CallError::from_status(s).into()
}

/// What the agent says it wrote.
struct Written {
    size: u64,
    sha256: String,
}

/// `POST /v1/computers/:id/copy-to-box`
#[utoipa::path(post, path = "/v1/computers/{id}/copy-to-box", operation_id = "copy_to_box", tag = "files", params(("id" = String, Path)), request_body = ToBoxIn, responses((status = 200, description = "The artifact: `{\"artifactId\", \"path\", \"size\", \"sha256\", \"blobId\"}`, as the agent counted and hashed it", body = Object), (status = 404, description = "no such blob (or not the caller's)", body = ErrorBody), (status = 422, description = "`DigestMismatch`: what arrived is not the blob; nothing was put in place", body = ErrorBody)), security(("bearer" = [])))]
pub async fn to_box(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<ToBoxIn>,
) -> Result<Json<Value>, ApiError> {
    // The rights at a current read: a replica that lags behind a revocation refuses the copy.
    let caller = auth.current(&state).await?;
    let Json(req) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let blob = state.cluster.state().read(|s| {
        s.blobs
            .get(&req.blob_id)
            .filter(|b| s.may_read_blob(&caller, b))
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorKind::NotFound, "no such blob"))
    })?;
    if blob.size > MAX_COPY {
        return Err(ApiError::new(ErrorKind::TooLarge, "a copy is at most 16 MiB"));
    }
    let who = run_as(&state, &caller, &id, parse_user(req.user.as_deref())?)?;
    // The bytes stream from here, or from a node that holds them, straight into the link; the
    // agent counts and hashes what arrives and puts nothing in place unless it is the blob.
    let bytes = crate::owner::blobs::open(&state, &blob).await.map_err(|(kind, why)| ApiError::new(kind, why))?;
    // A tunnel of the link carries the bytes (no gRPC message or HTTP/2 stream per chunk); the
    // agent answers once it has the file, or why not.
    let open = json!({
        "target": "write",
        "path": req.path,
        "user": who.user,
        "rootAllowed": who.root_allowed,
        "expectSize": blob.size,
        "expectSha256": blob.sha256,
    });
    let link = super::calls::link_for(&state, &caller, &id, true).await?;
    let io = link.tunnel(open.to_string().as_bytes()).await.map_err(|r| ApiError::from(CallError::from_refused(r)))?;
    let (from, mut to) = io.split();
    let send = async move {
        let mut bytes = bytes;
        while let Some(next) = bytes.next().await {
            let Ok(data) = next else {
                // The agent must not take a short file for the blob: the tunnel is reset.
                to.abort();
                return Err(());
            };
            if to.send(data).await.is_err() {
                return Ok(()); // the agent answered early: its answer says why
            }
        }
        let _ = to.close().await;
        Ok(())
    };
    let answer = async move {
        let mut answer = Vec::new();
        let mut from = from;
        while let Some(b) = from.next().await {
            if answer.len() + b.len() > 64 * 1024 {
                return None;
            }
            answer.extend_from_slice(&b);
        }
        from.ended_cleanly().then_some(answer)
    };
    let (sent, answer) = tokio::join!(send, answer);
    if sent.is_err() {
        return Err(ApiError::new(ErrorKind::Unavailable, "the blob's bytes were cut: the copy was stopped"));
    }
    let answer: Value = answer
        .and_then(|a| serde_json::from_slice(&a).ok())
        .ok_or_else(|| ApiError::new(ErrorKind::Unavailable, "the computer's link ended during the copy"))?;
    if let Some(e) = answer.get("error") {
        let kind = e["kind"].as_str().and_then(ErrorKind::parse).unwrap_or(ErrorKind::Internal);
        return Err(agent_error(kind.status(e["message"].as_str().unwrap_or(""))));
    }
    let written = Written {
        size: answer["size"].as_u64().unwrap_or(u64::MAX),
        sha256: answer["sha256"].as_str().unwrap_or("").to_string(),
    };
    if written.sha256 != blob.sha256 || written.size != blob.size {
        return Err(ApiError::new(ErrorKind::DigestMismatch, "the agent put a file that is not the blob"));
    }
    let artifact = Artifact {
        id: new_id("art"),
        computer_id: id.clone(),
        path: req.path.clone(),
        size: written.size,
        sha256: written.sha256,
        blob_id: blob.id.clone(),
        member_id: caller.member.id.clone(),
        bot_id: caller.bot.as_ref().map(|b| b.id.clone()),
        created_at: now_ms(),
    };
    propose(&state, Command::ArtifactPut { by: caller.token.id.clone(), artifact: artifact.clone() }).await?;
    Ok(Json(json!({
        "artifactId": artifact.id,
        "computerId": id,
        "path": artifact.path,
        "size": artifact.size,
        "sha256": artifact.sha256,
        "blobId": artifact.blob_id,
    })))
}

/// `POST /v1/computers/:id/copy-from-box`
#[utoipa::path(post, path = "/v1/computers/{id}/copy-from-box", operation_id = "copy_from_box", tag = "files", params(("id" = String, Path)), request_body = FromBoxIn, responses((status = 200, description = "The blob: `{\"blobId\", \"name\", \"mimeType\", \"size\", \"sha256\"}`", body = Object), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody)), security(("bearer" = [])))]
pub async fn from_box(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<FromBoxIn>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let Json(req) = body.map_err(|e| ApiError::invalid(e.body_text()))?;
    let mime = req.mime_type.clone().unwrap_or_else(|| "application/octet-stream".into());
    let name = req.path.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("file").to_string();
    let who = run_as(&state, &caller, &id, parse_user(req.user.as_deref())?)?;
    let mut agent = agent_for(&state, &caller, &id, false).await?;
    // A bot on a paired machine copies only from the paths its grant names.
    let within = super::calls::read_roots(&state, &caller, &id)?;
    let path = FilePath {
        path: req.path.clone(),
        user: who.user.clone(),
        root_allowed: who.root_allowed,
        within,
        ..Default::default()
    };
    let stream = agent.read_file(path).await.map_err(agent_error)?.into_inner();
    let blob_id = new_id("blb");
    let body = stream.map(|c| c.map(|c| c.data).map_err(|s| s.message().to_string()));
    let stored = state.blobs.put(&blob_id, None, None, Box::pin(body)).await.map_err(|e| match e {
        crate::blobs::PutError::TooLarge => ApiError::new(ErrorKind::TooLarge, "a blob is at most 1 GiB"),
        crate::blobs::PutError::Body(why) => {
            ApiError::new(ErrorKind::ComputerExecutionFailed, format!("the read stopped: {why}"))
        }
        other => {
            tracing::error!(error = ?other, "the blob store failed");
            ApiError::new(ErrorKind::Internal, "the blob store failed")
        }
    })?;
    // Recorded once a second node holds a copy too, as an upload is.
    let blob = super::blobs::record(&state, &caller, blob_id, name, mime, stored).await?;
    Ok(Json(
        json!({"blobId": blob.id, "name": blob.name, "mimeType": blob.mime_type, "size": blob.size, "sha256": blob.sha256}),
    ))
}
