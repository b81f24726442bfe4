//! Who may join the cluster, and whose certificates are revoked: the reusable join secret (its
//! hash), single-use join secrets with an expiry (at most [`MAX_JOIN_TOKENS`] live; expired
//! and used ones are dropped), and per removed node the time before which its certificates
//! are refused. The node-to-node TLS layer (`crate::tls`) reads the revocations at each
//! handshake; enrolling redeems a secret here before a certificate is signed.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::Serialize;

use super::Reject;
use super::RejectKind;
use super::State;

/// The most single-use join secrets live at once.
pub const MAX_JOIN_TOKENS: usize = 64;

/// The join part of the state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinState {
    /// SHA-256 of the reusable join secret.
    pub secret_hash: Option<String>,
    /// Single-use secrets: hash -> unix ms after which it is refused.
    pub tokens: BTreeMap<String, u64>,
    /// Removed nodes: node id -> certificates issued at or before this unix second are refused.
    pub revoked: BTreeMap<u64, u64>,
}

impl State {
    pub(crate) fn set_join_secret(&mut self, by: &str, hash: &str) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        self.join.secret_hash = Some(hash.to_string());
        Ok(())
    }

    pub(crate) fn mint_join_token(
        &mut self,
        by: &str,
        hash: &str,
        expires_at_ms: u64,
        at_ms: u64,
    ) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        if self.join.tokens.contains_key(hash) {
            return Ok(()); // a replay
        }
        self.join.tokens.retain(|_, expires| *expires > at_ms);
        if self.join.tokens.len() >= MAX_JOIN_TOKENS {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("{MAX_JOIN_TOKENS} single-use join secrets are live already; use one or let them expire"),
            ));
        }
        self.join.tokens.insert(hash.to_string(), expires_at_ms);
        Ok(())
    }

    pub(crate) fn redeem_join_token(&mut self, hash: &str, node_id: u64, at_ms: u64) -> Result<(), Reject> {
        let refused = || Reject::new(RejectKind::Unauthorized, "the join secret is not valid (wrong, used or expired)");
        if self.join.secret_hash.as_deref() == Some(hash) {
            return Ok(());
        }
        match self.join.tokens.get(hash) {
            Some(expires) if *expires > at_ms => {
                self.join.tokens.remove(hash);
                tracing::debug!(node_id, "a single-use join secret was used");
                Ok(())
            }
            _ => Err(refused()),
        }
    }

    pub(crate) fn revoke_node(&mut self, by: &str, node_id: u64, before_secs: u64) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        let before = self.join.revoked.entry(node_id).or_insert(0);
        *before = (*before).max(before_secs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::identity::Member;
    use crate::sm::identity::Organization;
    use crate::sm::identity::Principal;
    use crate::sm::identity::Role;
    use crate::sm::testing::ok;
    use crate::sm::testing::rejected;
    use crate::sm::testing::token;

    fn booted() -> State {
        let mut s = State::default();
        let owner = Member { id: "mem_o".into(), name: "o".into(), email: None, role: Role::Owner, created_at: 1 };
        ok(s.apply(&Command::Bootstrap {
            cluster_id: "c".into(),
            org: Organization { id: "org".into(), name: "o".into(), created_at: 1 },
            owner,
            token: token("tok_o", Principal::Member("mem_o".into())),
            join_secret_hash: None,
        }));
        s
    }

    #[test]
    fn secrets_let_nodes_in_once_or_until_rotated_and_revocations_only_grow() {
        let mut s = booted();
        let redeem = |s: &mut State, hash: &str, at: u64| {
            s.apply(&Command::RedeemJoinToken { hash: hash.into(), node_id: 2, at_ms: at })
        };
        assert_eq!(rejected(redeem(&mut s, "h1", 1)).kind, RejectKind::Unauthorized);
        ok(s.apply(&Command::SetJoinSecret { by: "tok_o".into(), hash: "h1".into() }));
        ok(redeem(&mut s, "h1", 1));
        ok(redeem(&mut s, "h1", 2));
        ok(s.apply(&Command::SetJoinSecret { by: "tok_o".into(), hash: "h2".into() }));
        assert_eq!(rejected(redeem(&mut s, "h1", 3)).kind, RejectKind::Unauthorized, "rotated");
        let mint = |hash: &str, exp: u64| Command::MintJoinToken {
            by: "tok_o".into(),
            hash: hash.into(),
            expires_at_ms: exp,
            at_ms: 10,
        };
        ok(s.apply(&mint("once", 100)));
        ok(redeem(&mut s, "once", 50));
        assert_eq!(rejected(redeem(&mut s, "once", 51)).kind, RejectKind::Unauthorized, "used");
        ok(s.apply(&mint("late", 100)));
        assert_eq!(rejected(redeem(&mut s, "late", 100)).kind, RejectKind::Unauthorized, "expired");
        // Bounded: expired ones make room.
        for i in 0..MAX_JOIN_TOKENS - 1 {
            ok(s.apply(&mint(&format!("t{i}"), 1_000)));
        }
        assert_eq!(rejected(s.apply(&mint("full", 1_000))).kind, RejectKind::Conflict);
        let later =
            Command::MintJoinToken { by: "tok_o".into(), hash: "after".into(), expires_at_ms: 5_000, at_ms: 2_000 };
        ok(s.apply(&later));
        assert_eq!(s.join.tokens.len(), 1, "the expired ones were dropped");
        // Only admins, and revocations never move back.
        assert_eq!(
            rejected(s.apply(&Command::SetJoinSecret { by: "tok_nobody".into(), hash: "x".into() })).kind,
            RejectKind::Unauthorized
        );
        ok(s.apply(&Command::RevokeNode { by: "tok_o".into(), node_id: 3, before_secs: 50 }));
        ok(s.apply(&Command::RevokeNode { by: "tok_o".into(), node_id: 3, before_secs: 40 }));
        assert_eq!(s.join.revoked.get(&3), Some(&50));
    }
}
