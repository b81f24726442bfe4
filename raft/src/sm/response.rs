//! What applying a command answers: [`Response`], and the refusal [`Reject`] every area's
//! transitions return.

use serde::Deserialize;
use serde::Serialize;

/// Why a command was refused when it applied. A refused command changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectKind {
    /// The caller's token is unknown, revoked, or its holder is gone.
    Unauthorized,
    /// The caller lacks the right.
    Forbidden,
    /// A referenced object does not exist.
    NotFound,
    /// The command conflicts with the state (duplicate, already done differently).
    Conflict,
    /// The command is invalid for this state.
    Invalid,
    /// The command key was used with another request.
    IdempotencyKeyReused,
    /// Another lifecycle execution holds the Computer.
    ComputerConflict,
    /// The Computer's source cannot do this.
    Unsupported,
    /// A run's action names a claim that no longer holds the run's lease.
    LeaseLost,
}

/// A refusal with a message safe to show the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reject {
    /// The kind.
    pub kind: RejectKind,
    /// A message for the caller.
    pub message: String,
    /// For a conflict: the execution that holds the Computer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
}

impl Reject {
    /// A refusal of this kind.
    pub fn new(kind: RejectKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), execution_id: None }
    }

    /// The API's error kind of this refusal (and so its HTTP status and gRPC code).
    pub fn error_kind(&self) -> computerd_proto::ErrorKind {
        use computerd_proto::ErrorKind;
        match self.kind {
            RejectKind::Unauthorized => ErrorKind::Unauthorized,
            RejectKind::Forbidden => ErrorKind::Forbidden,
            RejectKind::NotFound => ErrorKind::NotFound,
            RejectKind::Conflict => ErrorKind::Conflict,
            RejectKind::Invalid => ErrorKind::InvalidRequest,
            RejectKind::IdempotencyKeyReused => ErrorKind::IdempotencyKeyReused,
            RejectKind::ComputerConflict => ErrorKind::ComputerConflict,
            RejectKind::Unsupported => ErrorKind::ComputerUnsupported,
            RejectKind::LeaseLost => ErrorKind::LeaseLost,
        }
    }
}

/// What applying a command answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The command applied (or had already applied: commands are idempotent by id).
    Ok,
    /// The command applied and names a record (the execution of a submit, the approval of an
    /// acquire that waits for one).
    Id(String),
    /// The command was refused and changed nothing.
    Rejected(Reject),
}
