//! Identity records: the organization, members, bots and API tokens.

use serde::Deserialize;
use serde::Serialize;
use sha2::Digest;

/// The organization that owns everything in a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Organization {
    /// `org_…`
    pub id: String,
    /// Display name.
    pub name: String,
    /// Unix ms.
    pub created_at: u64,
}

/// A member's role in the organization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// May use what is granted; no identity administration.
    Member,
    /// Administers members, bots and tokens.
    Admin,
    /// Everything an admin may, plus creating owners.
    Owner,
}

/// A person in the organization.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// `mem_…`
    pub id: String,
    /// Display name.
    pub name: String,
    /// Optional e-mail, unique in the organization.
    pub email: Option<String>,
    /// Role.
    pub role: Role,
    /// Unix ms.
    pub created_at: u64,
}

/// A bot: it belongs to a member and acts with bot tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bot {
    /// `bot_…`
    pub id: String,
    /// Display name.
    pub name: String,
    /// The member the bot belongs to.
    pub member_id: String,
    /// Unix ms.
    pub created_at: u64,
    /// Unix ms of archiving; an archived bot has no rights and its tokens stop working.
    pub archived_at: Option<u64>,
}

/// Who a token speaks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "id", rename_all = "lowercase")]
pub enum Principal {
    /// A member (`mem_…`).
    Member(String),
    /// A bot (`bot_…`).
    Bot(String),
}

/// An API token. The secret is never stored: only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Token {
    /// `tok_…`
    pub id: String,
    /// Display name.
    pub name: String,
    /// Hex SHA-256 of the secret.
    pub hash: String,
    /// Who the token acts for.
    pub principal: Principal,
    /// A read-only token may only read.
    pub read_only: bool,
    /// When set, the token may only touch these Computers (and nothing organization-wide).
    pub computers: Option<Vec<String>>,
    /// Unix ms.
    pub created_at: u64,
    /// Unix ms of revocation.
    pub revoked_at: Option<u64>,
}

/// The hex SHA-256 of a token secret, as stored.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(sha2::Sha256::digest(secret.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_sha256_hex() {
        assert_eq!(hash_secret("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
