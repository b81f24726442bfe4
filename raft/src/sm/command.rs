//! Commands of the replicated state machine and their versioned wire form.

use serde::Deserialize;
use serde::Serialize;

use super::identity::Bot;
use super::identity::Member;
use super::identity::Organization;
use super::identity::Token;

/// The version of [`Request`] this build writes. Older versions stay readable forever: a log
/// written by an older node must apply the same way on a newer one.
pub const REQUEST_VERSION: u32 = 1;

/// A command as it travels in the Raft log: a version tag plus the command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v", content = "cmd")]
pub enum Request {
    /// Version 1 of the command set.
    #[serde(rename = "1")]
    V1(Command),
}

impl Request {
    /// Wraps a command in the current version.
    pub fn new(cmd: Command) -> Self {
        Request::V1(cmd)
    }

    /// The command, upgraded to the current form.
    pub fn command(&self) -> &Command {
        match self {
            Request::V1(c) => c,
        }
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.command().name())
    }
}

/// Every change the store knows. Each carries the token it is made with (`by`), so the rights
/// are checked again when the command applies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Creates the organization, its first owner and the owner's token; only once per cluster.
    Bootstrap {
        /// The id of the cluster, fixed forever at bootstrap.
        cluster_id: String,
        /// The organization.
        org: Organization,
        /// The first owner.
        owner: Member,
        /// The owner's first token (hash only).
        token: Token,
    },
    /// Adds a member.
    CreateMember {
        /// The token id of the caller.
        by: String,
        /// The new member.
        member: Member,
    },
    /// Adds a bot that belongs to a member.
    CreateBot {
        /// The token id of the caller.
        by: String,
        /// The new bot.
        bot: Bot,
    },
    /// Archives a bot: its tokens stop working and its rights end.
    ArchiveBot {
        /// The token id of the caller.
        by: String,
        /// The bot to archive.
        bot_id: String,
        /// When (unix ms), chosen by the proposer.
        at_ms: u64,
    },
    /// Stores a new API token (its hash only).
    CreateToken {
        /// The token id of the caller.
        by: String,
        /// The token.
        token: Token,
    },
    /// Revokes a token.
    RevokeToken {
        /// The token id of the caller.
        by: String,
        /// The token to revoke.
        token_id: String,
        /// When (unix ms), chosen by the proposer.
        at_ms: u64,
    },
}

impl Command {
    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Bootstrap { .. } => "bootstrap",
            Command::CreateMember { .. } => "create_member",
            Command::CreateBot { .. } => "create_bot",
            Command::ArchiveBot { .. } => "archive_bot",
            Command::CreateToken { .. } => "create_token",
            Command::RevokeToken { .. } => "revoke_token",
        }
    }
}

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
}

/// A refusal with a message safe to show the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reject {
    /// The kind.
    pub kind: RejectKind,
    /// A message for the caller.
    pub message: String,
}

impl Reject {
    pub(crate) fn new(kind: RejectKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// What applying a command answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The command applied (or had already applied: commands are idempotent by id).
    Ok,
    /// The command was refused and changed nothing.
    Rejected(Reject),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_wire_form_is_versioned_and_stable() {
        let r = Request::new(Command::RevokeToken {
            by: "tok_a".into(),
            token_id: "tok_b".into(),
            at_ms: 7,
        });
        let json = serde_json::to_string(&r).expect("encode");
        assert_eq!(
            json,
            r#"{"v":"1","cmd":{"revoke_token":{"by":"tok_a","token_id":"tok_b","at_ms":7}}}"#
        );
        let back: Request = serde_json::from_str(&json).expect("decode");
        assert_eq!(back, r);
        assert!(serde_json::from_str::<Request>(r#"{"v":"99","cmd":{}}"#).is_err());
    }
}
