//! Who may join the cluster, and whose certificates are revoked: the reusable join secret (its
//! hash), single-use join secrets with an expiry (at most [`MAX_JOIN_TOKENS`] live; expired
//! and used ones are dropped), some of them for one node id only, and per removed node the time
//! before which its certificates are refused. The node-to-node TLS layer (`crate::tls`) reads the
//! revocations at each handshake; enrolling redeems a secret here before a certificate is signed.
//!
//! A removed node id never enrols again: its revocation stays (at most [`MAX_REMOVED_NODES`]),
//! and redeeming any secret for it is refused. A live member's id enrols again (a member whose
//! data dir was lost) only with a single-use secret minted for that id; the enrolling service
//! checks membership, which lives in Raft's own state, not here.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::Serialize;

use super::Reject;
use super::RejectKind;
use super::State;

/// The most single-use join secrets live at once.
pub const MAX_JOIN_TOKENS: usize = 64;

/// The most removed node ids the store remembers. A removed id never comes back, so the record
/// is never trimmed: past this many removals, a removal is refused (give new nodes new ids and
/// remove fewer, or start a new cluster).
pub const MAX_REMOVED_NODES: usize = 1024;

/// The join part of the state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinState {
    /// SHA-256 of the reusable join secret.
    pub secret_hash: Option<String>,
    /// Single-use secrets: hash -> unix ms after which it is refused.
    pub tokens: BTreeMap<String, u64>,
    /// The single-use secrets minted for one node id: hash -> that id (a subset of `tokens`,
    /// dropped with them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub token_nodes: BTreeMap<String, u64>,
    /// Removed nodes (and nodes being removed): node id -> certificates issued at or before this
    /// unix second are refused (0 while the node is being removed: it may not enrol, its
    /// certificate still works until it has left the membership; `u64::MAX` once removed: all).
    pub revoked: BTreeMap<u64, u64>,
}

/// What a join secret presented to this replica is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinSecretKind {
    /// The cluster's reusable secret.
    Reusable,
    /// A live single-use secret, for any new node (`None`) or for that node id only.
    SingleUse(Option<u64>),
    /// Neither (wrong, used, expired, or not applied here yet).
    Unknown,
}

impl JoinState {
    /// What the secret with this hash is, at `at_ms`.
    pub fn kind_of(&self, hash: &str, at_ms: u64) -> JoinSecretKind {
        if self.secret_hash.as_deref() == Some(hash) {
            return JoinSecretKind::Reusable;
        }
        match self.tokens.get(hash) {
            Some(expires) if *expires > at_ms => JoinSecretKind::SingleUse(self.token_nodes.get(hash).copied()),
            _ => JoinSecretKind::Unknown,
        }
    }

    /// True when `node_id` was removed (or is being removed): it may never enrol again.
    pub fn removed(&self, node_id: u64) -> bool {
        self.revoked.contains_key(&node_id)
    }

    /// Drops the expired single-use secrets (at most [`MAX_JOIN_TOKENS`] to look at).
    fn drop_expired(&mut self, at_ms: u64) {
        let expired: Vec<String> = self.tokens.iter().filter(|(_, e)| **e <= at_ms).map(|(h, _)| h.clone()).collect();
        for hash in expired {
            self.tokens.remove(&hash);
            self.token_nodes.remove(&hash);
        }
    }
}

/// The refusal of an enrolment as a removed node.
fn removed_refusal(node_id: u64) -> Reject {
    Reject::new(
        RejectKind::Forbidden,
        format!(
            "node {node_id} was removed from the cluster, and a removed node id never joins again: give this node a new id"
        ),
    )
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
        node_id: Option<u64>,
        expires_at_ms: u64,
        at_ms: u64,
    ) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        if self.join.tokens.contains_key(hash) {
            return Ok(()); // a replay
        }
        if let Some(id) = node_id
            && self.join.removed(id)
        {
            return Err(Reject::new(
                RejectKind::Invalid,
                format!("node {id} was removed from the cluster, and a removed node id never joins again"),
            ));
        }
        self.join.drop_expired(at_ms);
        if self.join.tokens.len() >= MAX_JOIN_TOKENS {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("{MAX_JOIN_TOKENS} single-use join secrets are live already; use one or let them expire"),
            ));
        }
        self.join.tokens.insert(hash.to_string(), expires_at_ms);
        if let Some(id) = node_id {
            self.join.token_nodes.insert(hash.to_string(), id);
        }
        Ok(())
    }

    /// A node enrols with a secret: refused for a removed node id whatever the secret; the
    /// reusable secret is let through; a single-use one once (and only for its node id, if it was
    /// minted for one). Whether the id is a live member is the enrolling service's check.
    pub(crate) fn redeem_join_token(&mut self, hash: &str, node_id: u64, at_ms: u64) -> Result<(), Reject> {
        let refused = || Reject::new(RejectKind::Unauthorized, "the join secret is not valid (wrong, used or expired)");
        if self.join.removed(node_id) {
            return Err(removed_refusal(node_id));
        }
        match self.join.kind_of(hash, at_ms) {
            JoinSecretKind::Reusable => Ok(()),
            JoinSecretKind::SingleUse(Some(id)) if id != node_id => Err(Reject::new(
                RejectKind::Forbidden,
                format!("this single-use join secret is for node {id}, not node {node_id}"),
            )),
            JoinSecretKind::SingleUse(_) => {
                self.join.tokens.remove(hash);
                self.join.token_nodes.remove(hash);
                tracing::debug!(node_id, "a single-use join secret was used");
                Ok(())
            }
            JoinSecretKind::Unknown => Err(refused()),
        }
    }

    /// Records a node as removed (its id never enrols again), and refuses its certificates
    /// issued at or before `before_secs` (0: none yet, while it leaves the membership).
    pub(crate) fn revoke_node(&mut self, by: &str, node_id: u64, before_secs: u64) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        if !self.join.removed(node_id) && self.join.revoked.len() >= MAX_REMOVED_NODES {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("{MAX_REMOVED_NODES} node ids were removed already: the store keeps no more"),
            ));
        }
        let before = self.join.revoked.entry(node_id).or_insert(0);
        *before = (*before).max(before_secs);
        self.node_versions.remove(&node_id);
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
            node_id: None,
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
        let later = Command::MintJoinToken {
            by: "tok_o".into(),
            hash: "after".into(),
            node_id: None,
            expires_at_ms: 5_000,
            at_ms: 2_000,
        };
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

    /// Issue 36, item 2: a removed node id never enrols again, with any secret, and a secret
    /// minted for one node id lets only that id in (once); the record of removed ids is bounded.
    #[test]
    fn i36_2_removed_ids_never_enrol_and_bound_secrets_serve_their_id_only() {
        let mut s = booted();
        ok(s.apply(&Command::SetJoinSecret { by: "tok_o".into(), hash: "h".into() }));
        let redeem = |s: &mut State, hash: &str, node_id: u64| {
            s.apply(&Command::RedeemJoinToken { hash: hash.into(), node_id, at_ms: 20 })
        };
        ok(redeem(&mut s, "h", 3));
        // The removal records the id first (cutoff 0), then the cutoff.
        ok(s.apply(&Command::RevokeNode { by: "tok_o".into(), node_id: 3, before_secs: 0 }));
        assert!(s.join.removed(3));
        let r = rejected(redeem(&mut s, "h", 3));
        assert_eq!(r.kind, RejectKind::Forbidden, "{r:?}");
        assert!(r.message.contains("removed"), "{r:?}");
        ok(s.apply(&Command::RevokeNode { by: "tok_o".into(), node_id: 3, before_secs: 50 }));
        assert_eq!(rejected(redeem(&mut s, "h", 3)).kind, RejectKind::Forbidden, "still removed");
        let mint = |hash: &str, node_id: Option<u64>| Command::MintJoinToken {
            by: "tok_o".into(),
            hash: hash.into(),
            node_id,
            expires_at_ms: 100,
            at_ms: 10,
        };
        // No secret brings a removed id back, and none can be minted for it.
        ok(s.apply(&mint("any", None)));
        assert_eq!(rejected(redeem(&mut s, "any", 3)).kind, RejectKind::Forbidden);
        assert_eq!(rejected(s.apply(&mint("for3", Some(3)))).kind, RejectKind::Invalid);
        // A secret for node 2 is not node 4's, and stays for node 2; node 2 uses it once.
        ok(s.apply(&mint("for2", Some(2))));
        assert_eq!(s.join.kind_of("for2", 20), JoinSecretKind::SingleUse(Some(2)));
        assert_eq!(rejected(redeem(&mut s, "for2", 4)).kind, RejectKind::Forbidden);
        ok(redeem(&mut s, "for2", 2));
        assert_eq!(rejected(redeem(&mut s, "for2", 2)).kind, RejectKind::Unauthorized, "used");
        assert!(s.join.token_nodes.is_empty(), "dropped with its secret");
        // An expired bound secret goes with the next mint.
        ok(s.apply(&mint("late", Some(5))));
        let after = Command::MintJoinToken {
            by: "tok_o".into(),
            hash: "after".into(),
            node_id: None,
            expires_at_ms: 5_000,
            at_ms: 1_000,
        };
        ok(s.apply(&after));
        assert_eq!(s.join.tokens.len(), 1);
        assert!(s.join.token_nodes.is_empty());
        // Bounded: past MAX_REMOVED_NODES ids, a removal of a new id is refused; an id already
        // removed may be revoked again.
        for id in 100..(100 + MAX_REMOVED_NODES as u64 - 1) {
            ok(s.apply(&Command::RevokeNode { by: "tok_o".into(), node_id: id, before_secs: 1 }));
        }
        assert_eq!(s.join.revoked.len(), MAX_REMOVED_NODES);
        let more = Command::RevokeNode { by: "tok_o".into(), node_id: 7, before_secs: 1 };
        assert_eq!(rejected(s.apply(&more)).kind, RejectKind::Conflict);
        ok(s.apply(&Command::RevokeNode { by: "tok_o".into(), node_id: 3, before_secs: 60 }));
        assert_eq!(s.join.revoked.get(&3), Some(&60));
    }
}
