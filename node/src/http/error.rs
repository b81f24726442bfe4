//! The API error: `{"error":{"kind","message","errorId"}}` with the status of its kind. The
//! error id is logged with the cause, so an operator can find it.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use computerd_proto::ErrorKind;
use computerd_raft::cluster::ClusterError;
use computerd_raft::sm::Reject;

use crate::ids::new_id;

/// An error answered to an API caller.
#[derive(Debug)]
pub struct ApiError {
    /// The kind (and so the status).
    pub kind: ErrorKind,
    /// A message safe to show the caller.
    pub message: String,
    /// For `ComputerConflict`: the execution that holds the Computer.
    pub execution_id: Option<String>,
    /// A stable code naming why (a refused tool package's reason).
    pub reason: Option<String>,
}

impl ApiError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), execution_id: None, reason: None }
    }

    /// 400 `invalid_request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
}

impl From<crate::owner::CallError> for ApiError {
    fn from(e: crate::owner::CallError) -> Self {
        Self::new(e.kind, e.message)
    }
}

impl From<Reject> for ApiError {
    fn from(r: Reject) -> Self {
        let kind = r.error_kind();
        Self { kind, message: r.message, execution_id: r.execution_id, reason: None }
    }
}

impl From<ClusterError> for ApiError {
    fn from(e: ClusterError) -> Self {
        match e {
            ClusterError::Unavailable(m) => Self::new(ErrorKind::Unavailable, m),
            ClusterError::Invalid(m) => Self::new(ErrorKind::Internal, m),
            ClusterError::Fatal(m) => Self::new(ErrorKind::Unavailable, format!("the store has stopped: {m}")),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        if r.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            return Self::new(ErrorKind::TooLarge, "the body is larger than this route takes");
        }
        Self::invalid(format!("the body is not valid: {}", r.body_text()))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error_id = new_id("err");
        let status = StatusCode::from_u16(self.kind.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::warn!(error_id = %error_id, kind = %self.kind, message = %self.message, "request failed");
        } else {
            tracing::debug!(error_id = %error_id, kind = %self.kind, message = %self.message, "request refused");
        }
        let mut error = serde_json::json!({ "kind": self.kind.as_str(), "message": self.message, "errorId": error_id });
        if let Some(e) = self.execution_id {
            error["executionId"] = e.into();
        }
        if let Some(r) = self.reason {
            error["reason"] = r.into();
        }
        let body = serde_json::json!({ "error": error });
        (status, Json(body)).into_response()
    }
}
