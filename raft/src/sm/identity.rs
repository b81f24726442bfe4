//! Identity: the organization, members, bots and API tokens, and the commands that change them
//! (bootstrap, create member, create and archive bot, create and revoke token). Every change is
//! checked against the caller's rights at commit (`Caller::check_admin_write`), and a replayed
//! create with the same record is a no-op.
//!
//! Bounded (each cap refused as a `conflict`, checked in O(log n) through `identity_index`):
//! at most [`MAX_MEMBERS`] members; live bots per member and bots in all, archived ones included
//! (an archived bot stays: executions, runs, blobs and journals name it), as the organization's
//! [`Limits`](super::limits::Limits) say (1,000 and 100,000 by default); at most [`MAX_TOKENS_PER_PRINCIPAL`] live tokens per
//! member or bot. A revoked token, or a token of an archived bot, is compacted after the
//! retention (`retention`), counted from when it stopped working.

use serde::Deserialize;
use serde::Serialize;
use sha2::Digest;

use super::response::Reject;
use super::response::RejectKind;
use super::state::State;

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
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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

/// The most members an organization has (members are never removed).
pub const MAX_MEMBERS: usize = 10_000;
/// The most live (not revoked) tokens one member or bot has.
pub const MAX_TOKENS_PER_PRINCIPAL: usize = 1_000;

/// A refusal for a full collection: a conflict with the state, like every other cap.
pub(crate) fn full(message: String) -> Reject {
    Reject::new(RejectKind::Conflict, message)
}

impl State {
    pub(crate) fn bootstrap(
        &mut self,
        cluster_id: &str,
        org: &Organization,
        owner: &Member,
        token: &Token,
    ) -> Result<(), Reject> {
        if let Some(existing) = &self.cluster_id {
            // A replay of the same bootstrap is a no-op; another one is refused.
            if existing == cluster_id && self.tokens.contains_key(&token.id) {
                return Ok(());
            }
            return Err(Reject::new(RejectKind::Conflict, "the cluster is already bootstrapped"));
        }
        if owner.role != Role::Owner || token.principal != Principal::Member(owner.id.clone()) {
            return Err(Reject::new(RejectKind::Invalid, "bootstrap needs an owner and the owner's token"));
        }
        self.cluster_id = Some(cluster_id.to_string());
        self.org = Some(org.clone());
        self.insert_member(owner);
        self.insert_token(token);
        Ok(())
    }

    pub(crate) fn create_member(&mut self, by: &str, member: &Member) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        caller.check_admin_write()?;
        if member.role == Role::Owner && caller.member.role != Role::Owner {
            return Err(Reject::new(RejectKind::Forbidden, "only an owner may add an owner"));
        }
        if let Some(existing) = self.members.get(&member.id) {
            return same_or_conflict(existing == member, "member");
        }
        if let Some(email) = &member.email
            && self.member_by_email(email).is_some()
        {
            return Err(Reject::new(RejectKind::Conflict, "a member with this email exists"));
        }
        if self.members.len() >= MAX_MEMBERS {
            return Err(full(format!("an organization has at most {MAX_MEMBERS} members")));
        }
        self.insert_member(member);
        Ok(())
    }

    pub(crate) fn create_bot(&mut self, by: &str, bot: &Bot, parent: Option<&str>) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        caller.check_admin_write()?;
        if let Some(existing) = self.bots.get(&bot.id) {
            return same_or_conflict(existing == bot, "bot");
        }
        if !self.members.contains_key(&bot.member_id) {
            return Err(Reject::new(RejectKind::NotFound, "no such member"));
        }
        if bot.archived_at.is_some() {
            return Err(Reject::new(RejectKind::Invalid, "a new bot cannot be archived"));
        }
        let per_member = self.limits.live_bots_per_member();
        if self.live_bot_count(&bot.member_id) as u64 >= per_member {
            return Err(full(format!("a member has at most {per_member} live bots: archive one first")));
        }
        let max_bots = self.limits.bots();
        if self.bots.len() as u64 >= max_bots {
            return Err(full(format!("the cluster has at most {max_bots} bots, archived ones included")));
        }
        self.insert_bot(bot);
        // A bot created with a parent: the parent gave it work (a delegation it can end).
        if let Some(parent) = parent {
            let d = super::model::Delegation {
                id: format!("dlg_{}", bot.id),
                parent_bot_id: parent.to_string(),
                child_bot_id: bot.id.clone(),
                made_by: caller.member.id.clone(),
                created_at: bot.created_at,
            };
            if let Err(e) = self.check_new_delegation(&d) {
                self.uninsert_bot(&bot.id);
                return Err(e);
            }
            self.insert_delegation(d);
        }
        Ok(())
    }

    pub(crate) fn archive_bot(&mut self, by: &str, bot_id: &str, at_ms: u64) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        if !self.bots.contains_key(bot_id) {
            return Err(Reject::new(RejectKind::NotFound, "no such bot"));
        }
        self.mark_bot_archived(bot_id, at_ms);
        // Archiving ends the bot's rights (and what others acquired through its delegations);
        // the Computers stay.
        self.drop_delegations_of(bot_id);
        let granted: Vec<String> = self.granted_to(bot_id).cloned().collect();
        for computer in granted {
            self.end_grant(&computer, bot_id);
        }
        self.close_all_bot_bindings(bot_id);
        Ok(())
    }

    pub(crate) fn create_token(&mut self, by: &str, token: &Token) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        caller.check_admin_write()?;
        if let Some(existing) = self.tokens.get(&token.id) {
            return same_or_conflict(existing == token, "token");
        }
        if token.revoked_at.is_some() {
            return Err(Reject::new(RejectKind::Invalid, "a new token cannot be revoked"));
        }
        if self.token_by_hash.contains_key(&token.hash) {
            return Err(Reject::new(RejectKind::Conflict, "token secret collision"));
        }
        match &token.principal {
            Principal::Member(m) => {
                let target = self.members.get(m).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such member"))?;
                // A token acts as its member: only an owner may mint one for somebody else.
                if target.id != caller.member.id && caller.member.role != Role::Owner {
                    return Err(Reject::new(
                        RejectKind::Forbidden,
                        "only an owner may create a token for another member",
                    ));
                }
            }
            Principal::Bot(b) => {
                let bot = self.bots.get(b).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such bot"))?;
                if bot.archived_at.is_some() {
                    return Err(Reject::new(RejectKind::Invalid, "the bot is archived"));
                }
            }
        }
        if self.live_token_count(&token.principal) >= MAX_TOKENS_PER_PRINCIPAL {
            let who = match token.principal {
                Principal::Member(_) => "member",
                Principal::Bot(_) => "bot",
            };
            return Err(full(format!("a {who} has at most {MAX_TOKENS_PER_PRINCIPAL} live tokens: revoke one first")));
        }
        self.insert_token(token);
        Ok(())
    }

    pub(crate) fn revoke_token(&mut self, by: &str, token_id: &str, at_ms: u64) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        if !self.tokens.contains_key(token_id) {
            return Err(Reject::new(RejectKind::NotFound, "no such token"));
        }
        self.mark_token_revoked(token_id, at_ms);
        Ok(())
    }
}

/// A replay of a create with the same id: the same record is a no-op, another is a conflict.
fn same_or_conflict(same: bool, what: &str) -> Result<(), Reject> {
    if same {
        Ok(())
    } else {
        Err(Reject::new(RejectKind::Conflict, format!("a different {what} with this id exists")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::Response;
    use crate::sm::hash_secret;
    use crate::sm::testing::token;

    fn member(id: &str, role: Role) -> Member {
        Member { id: id.into(), name: id.into(), email: None, role, created_at: 1 }
    }

    fn booted() -> State {
        let mut s = State::default();
        let r = s.apply(&Command::Bootstrap {
            cluster_id: "c1".into(),
            org: Organization { id: "org_1".into(), name: "o".into(), created_at: 1 },
            owner: member("mem_owner", Role::Owner),
            token: token("tok_owner", Principal::Member("mem_owner".into())),
            join_secret_hash: None,
        });
        assert_eq!(r, Response::Ok);
        s
    }

    fn rejected(r: Response) -> RejectKind {
        crate::sm::testing::rejected(r).kind
    }

    #[test]
    fn bootstrap_once() {
        let mut s = booted();
        let again = Command::Bootstrap {
            cluster_id: "c2".into(),
            org: Organization { id: "org_2".into(), name: "o".into(), created_at: 1 },
            owner: member("mem_x", Role::Owner),
            token: token("tok_x", Principal::Member("mem_x".into())),
            join_secret_hash: None,
        };
        let before = s.clone();
        assert_eq!(rejected(s.apply(&again)), RejectKind::Conflict);
        assert_eq!(s, before);
    }

    #[test]
    fn admin_creates_member_and_bot_and_replay_is_idempotent() {
        let mut s = booted();
        let m = member("mem_a", Role::Admin);
        let cmd = Command::CreateMember { by: "tok_owner".into(), member: m.clone() };
        assert_eq!(s.apply(&cmd), Response::Ok);
        assert_eq!(s.apply(&cmd), Response::Ok, "replay of the same create");
        let other = Command::CreateMember { by: "tok_owner".into(), member: member("mem_a", Role::Member) };
        assert_eq!(rejected(s.apply(&other)), RejectKind::Conflict);
        assert_eq!(s.members["mem_a"], m);
    }

    #[test]
    fn member_role_cannot_administer_and_admin_cannot_add_owner() {
        let mut s = booted();
        s.apply(&Command::CreateMember { by: "tok_owner".into(), member: member("mem_m", Role::Member) });
        s.apply(&Command::CreateMember { by: "tok_owner".into(), member: member("mem_a", Role::Admin) });
        s.apply(&Command::CreateToken {
            by: "tok_owner".into(),
            token: token("tok_m", Principal::Member("mem_m".into())),
        });
        s.apply(&Command::CreateToken {
            by: "tok_owner".into(),
            token: token("tok_a", Principal::Member("mem_a".into())),
        });
        let before = s.clone();
        let by_member = Command::CreateMember { by: "tok_m".into(), member: member("mem_z", Role::Member) };
        assert_eq!(rejected(s.apply(&by_member)), RejectKind::Forbidden);
        let admin_adds_owner = Command::CreateMember { by: "tok_a".into(), member: member("mem_o2", Role::Owner) };
        assert_eq!(rejected(s.apply(&admin_adds_owner)), RejectKind::Forbidden);
        let admin_mints_for_other =
            Command::CreateToken { by: "tok_a".into(), token: token("tok_x", Principal::Member("mem_m".into())) };
        assert_eq!(rejected(s.apply(&admin_mints_for_other)), RejectKind::Forbidden);
        assert_eq!(s, before);
    }

    #[test]
    fn read_only_and_computer_limited_tokens_cannot_write_identity() {
        let mut s = booted();
        let mut ro = token("tok_ro", Principal::Member("mem_owner".into()));
        ro.read_only = true;
        let mut limited = token("tok_lim", Principal::Member("mem_owner".into()));
        limited.computers = Some(vec!["cmp_1".into()]);
        s.apply(&Command::CreateToken { by: "tok_owner".into(), token: ro });
        s.apply(&Command::CreateToken { by: "tok_owner".into(), token: limited });
        let c = s.caller_by_token_id("tok_ro").expect("caller");
        assert!(c.check_admin_read().is_ok());
        assert!(c.check_admin_write().is_err());
        let l = s.caller_by_token_id("tok_lim").expect("caller");
        assert!(l.check_admin_read().is_err());
        let cmd = Command::CreateMember { by: "tok_ro".into(), member: member("mem_z", Role::Member) };
        assert_eq!(rejected(s.apply(&cmd)), RejectKind::Forbidden);
    }

    #[test]
    fn archiving_a_bot_kills_its_tokens_and_revocation_kills_a_token() {
        let mut s = booted();
        let bot = Bot {
            id: "bot_1".into(),
            name: "b".into(),
            member_id: "mem_owner".into(),
            created_at: 1,
            archived_at: None,
        };
        assert_eq!(s.apply(&Command::CreateBot { by: "tok_owner".into(), bot, parent: None }), Response::Ok);
        assert_eq!(
            s.apply(&Command::CreateToken {
                by: "tok_owner".into(),
                token: token("tok_b", Principal::Bot("bot_1".into()))
            }),
            Response::Ok
        );
        assert!(s.caller_by_hash(&hash_secret("tok_b")).is_ok());
        assert_eq!(
            s.apply(&Command::ArchiveBot { by: "tok_owner".into(), bot_id: "bot_1".into(), at_ms: 5 }),
            Response::Ok
        );
        assert_eq!(s.caller_by_hash(&hash_secret("tok_b")).map_err(|r| r.kind), Err(RejectKind::Unauthorized));
        assert_eq!(
            s.apply(&Command::RevokeToken { by: "tok_owner".into(), token_id: "tok_owner".into(), at_ms: 6 }),
            Response::Ok
        );
        assert!(s.caller_by_token_id("tok_owner").is_err());
        // The revoked token can no longer act.
        let cmd = Command::ArchiveBot { by: "tok_owner".into(), bot_id: "bot_1".into(), at_ms: 7 };
        assert_eq!(rejected(s.apply(&cmd)), RejectKind::Unauthorized);
    }

    #[test]
    fn hash_is_sha256_hex() {
        assert_eq!(hash_secret("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
