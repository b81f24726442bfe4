//! The vault (issue 41): each member's secrets, write-only. The store keeps a secret's value
//! sealed only (AEAD under the cluster's data key, sealed by the node before it proposes; see
//! the node's `vault`), never in clear: not in the log, not in a snapshot. Its metadata (name,
//! kind, origins, times) is readable by its member. A bot uses a secret only through a grant
//! that names it (`Grant::secrets`), and only to have the agent type it (`fill_secret`).
//!
//! Bounded: at most [`MAX_SECRETS_PER_MEMBER`] per member (members are never removed, and are
//! themselves capped), a sealed value of at most [`MAX_SEALED`] bytes, [`MAX_ORIGINS`] origins.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::Serialize;

use super::Caller;
use super::Reject;
use super::RejectKind;
use super::State;

/// The most secrets one member keeps.
pub const MAX_SECRETS_PER_MEMBER: usize = 256;
/// The most origins a secret names.
pub const MAX_ORIGINS: usize = 16;
/// The most bytes of a sealed value (a value is at most 4 KiB in clear).
pub const MAX_SEALED: usize = 8 * 1024;
/// The most secrets one grant names.
pub const MAX_GRANT_SECRETS: usize = 32;

/// What a secret holds, which decides the fields it may fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretKind {
    /// A password (or a username): password and username fields.
    Password,
    /// A TOTP seed (RFC 6238, base32): one-time-code fields, with the current code.
    Totp,
    /// Any text: text fields of the secret's origins.
    Text,
}

impl SecretKind {
    /// Its name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Password => "password",
            Self::Totp => "totp",
            Self::Text => "text",
        }
    }
}

/// A vault entry. `sealed` is the value under the data key (`v1.<key id>.<base64>`); the
/// store checks its shape and size only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Secret {
    /// The member whose vault holds it.
    pub owner: String,
    /// Its name, unique in the vault.
    pub name: String,
    /// What it holds.
    pub kind: SecretKind,
    /// The origins (`https://host[:port]`) whose pages may receive it.
    pub origins: Vec<String>,
    /// Unix ms.
    pub created_at: u64,
    /// Unix ms of the last `PUT`.
    pub updated_at: u64,
    /// Unix ms of the last fill.
    #[serde(default)]
    pub last_used_at: Option<u64>,
    /// The sealed value.
    pub sealed: String,
}

/// The vaults: member id → name → secret.
pub type Vaults = BTreeMap<String, BTreeMap<String, Secret>>;

fn invalid(m: impl Into<String>) -> Reject {
    Reject::new(RejectKind::Invalid, m)
}

/// Checks an origin as the vault keeps it: `http(s)://host[:port]`, lowercase, no path.
pub fn check_origin(o: &str) -> Result<(), Reject> {
    let rest = o.strip_prefix("https://").or_else(|| o.strip_prefix("http://"));
    let ok = rest.is_some_and(|h| {
        !h.is_empty()
            && h.len() <= 253 + 6
            && h.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-:[]".contains(&b))
    });
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "origin {o:?} is not an origin: a scheme (https or http), a lowercase host and an optional port, no path (`https://site-a.example`)"
        )))
    }
}

/// Checks a sealed value's shape and size (the node made it; the store never opens it).
fn check_sealed(sealed: &str) -> Result<(), Reject> {
    if sealed.len() > MAX_SEALED || !sealed.starts_with("v1.") || sealed.split('.').count() != 3 {
        return Err(invalid("the sealed value is malformed"));
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), Reject> {
    computerd_proto::browser::check_secret_name(name).map_err(invalid)
}

/// Only a member with a token that may write and is not limited to some Computers changes a
/// vault.
fn vault_writer(caller: &Caller) -> Result<&str, Reject> {
    if caller.bot.is_some() {
        return Err(Reject::new(RejectKind::Forbidden, "a bot cannot change a vault: its member puts secrets"));
    }
    caller.check_writable()?;
    if caller.token.computers.is_some() {
        return Err(Reject::new(RejectKind::Forbidden, "a token limited to some Computers cannot change the vault"));
    }
    Ok(&caller.member.id)
}

impl State {
    /// `PutSecret`: makes or replaces a secret of the caller's vault.
    pub(crate) fn put_secret(
        &mut self,
        by: &str,
        name: &str,
        kind: SecretKind,
        origins: &[String],
        sealed: &str,
        at_ms: u64,
    ) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let owner = vault_writer(&caller)?.to_string();
        check_name(name)?;
        if origins.is_empty() || origins.len() > MAX_ORIGINS {
            return Err(invalid(format!("origins names 1 to {MAX_ORIGINS} origins the secret may be filled on")));
        }
        origins.iter().try_for_each(|o| check_origin(o))?;
        check_sealed(sealed)?;
        let vault = self.secrets.entry(owner.clone()).or_default();
        if vault.len() >= MAX_SECRETS_PER_MEMBER && !vault.contains_key(name) {
            return Err(super::identity::full(format!(
                "a vault holds at most {MAX_SECRETS_PER_MEMBER} secrets: delete one first"
            )));
        }
        let created_at = vault.get(name).map_or(at_ms, |s| s.created_at);
        let mut origins = origins.to_vec();
        origins.sort();
        origins.dedup();
        vault.insert(
            name.to_string(),
            Secret {
                owner,
                name: name.to_string(),
                kind,
                origins,
                created_at,
                updated_at: at_ms,
                last_used_at: None,
                sealed: sealed.to_string(),
            },
        );
        Ok(())
    }

    /// `DeleteSecret`: removes a secret of the caller's vault (grants that name it then fill
    /// nothing with that name).
    pub(crate) fn delete_secret(&mut self, by: &str, name: &str) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let owner = vault_writer(&caller)?.to_string();
        let vault = self.secrets.get_mut(&owner);
        if vault.and_then(|v| v.remove(name)).is_none() {
            return Err(Reject::new(RejectKind::NotFound, format!("no secret named {name:?} in your vault")));
        }
        if self.secrets.get(&owner).is_some_and(BTreeMap::is_empty) {
            self.secrets.remove(&owner);
        }
        Ok(())
    }

    /// `TouchSecret`: notes a fill's time (never earlier than one noted).
    pub(crate) fn touch_secret(&mut self, owner: &str, name: &str, at_ms: u64) -> Result<(), Reject> {
        let s = self
            .secrets
            .get_mut(owner)
            .and_then(|v| v.get_mut(name))
            .ok_or_else(|| Reject::new(RejectKind::NotFound, "no such secret"))?;
        s.last_used_at = Some(s.last_used_at.map_or(at_ms, |t| t.max(at_ms)));
        Ok(())
    }

    /// Checks the secrets a member names in a grant: each in the member's vault.
    pub(crate) fn check_grant_secrets(&self, member_id: &str, names: &[String]) -> Result<(), Reject> {
        if names.len() > MAX_GRANT_SECRETS {
            return Err(invalid(format!("a grant names at most {MAX_GRANT_SECRETS} secrets")));
        }
        for n in names {
            check_name(n)?;
            if self.secret(member_id, n).is_none() {
                return Err(Reject::new(
                    RejectKind::NotFound,
                    format!("no secret named {n:?} in your vault: PUT /v1/secrets/{n} first"),
                ));
            }
        }
        Ok(())
    }

    /// A secret of `member_id`'s vault.
    pub fn secret(&self, member_id: &str, name: &str) -> Option<&Secret> {
        self.secrets.get(member_id).and_then(|v| v.get(name))
    }

    /// The caller's own secrets (metadata and sealed value; the API shows the metadata only).
    pub fn vault_of(&self, member_id: &str) -> impl Iterator<Item = &Secret> + '_ {
        self.secrets.get(member_id).into_iter().flat_map(BTreeMap::values)
    }

    /// The secret `caller` may have typed on this Computer, or why not: a member, one of its
    /// own on a Computer it may operate; a bot, one its grant there names, from the vault of
    /// the member who named it. Checked on every fill, on the node that serves it.
    pub fn secret_for_fill(&self, caller: &Caller, computer_id: &str, name: &str) -> Result<&Secret, Reject> {
        self.check_operate(caller, computer_id)?;
        let owner = match &caller.bot {
            None => caller.member.id.as_str(),
            Some(bot) => {
                let grant = self.grant(computer_id, &bot.id);
                match grant.filter(|g| g.secrets.iter().any(|s| s == name)) {
                    Some(g) => g.secrets_from.as_deref().unwrap_or(g.granted_by.as_str()),
                    None => {
                        return Err(Reject::new(
                            RejectKind::Forbidden,
                            format!(
                                "the grant of {} on this Computer names no secret {name:?}: its member adds it with PUT /v1/computers/{computer_id}/bots/{} {{\"secrets\": [...]}}",
                                bot.id, bot.id
                            ),
                        ));
                    }
                }
            }
        };
        self.secret(owner, name)
            .ok_or_else(|| Reject::new(RejectKind::NotFound, format!("no secret named {name:?} in the vault")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::testing::OWNER;
    use crate::sm::testing::ok;
    use crate::sm::testing::rejected;
    use crate::sm::testing::world;

    fn put(name: &str, origins: &[&str]) -> Command {
        Command::PutSecret {
            by: OWNER.into(),
            name: name.into(),
            kind: SecretKind::Password,
            origins: origins.iter().map(|o| o.to_string()).collect(),
            sealed: "v1.0011aabb.AAAA".into(),
            at_ms: 5,
        }
    }

    /// Issue 41, item 1: a member's vault keeps sealed values only, bounded; a bot cannot
    /// write it; a grant names secrets of its member's vault, and only those fill.
    #[test]
    fn i41_1_the_vault_is_a_members_its_grants_name_secrets_and_bots_use_only_those() {
        let mut s = world();
        ok(s.apply(&put("site-a", &["https://site-a.example"])));
        assert_eq!(s.vault_of("mem_o").map(|x| x.name.as_str()).collect::<Vec<_>>(), vec!["site-a"]);
        ok(s.apply(&put("site-a", &["https://site-a.example"])));
        for (cmd, kind) in [
            (put("Bad Name", &["https://a.example"]), RejectKind::Invalid),
            (put("x", &[]), RejectKind::Invalid),
            (put("x", &["https://a.example/path"]), RejectKind::Invalid),
            (put("x", &["ftp://a.example"]), RejectKind::Invalid),
        ] {
            assert_eq!(rejected(s.apply(&cmd)).kind, kind, "{cmd:?}");
        }
        let mut bad = put("x", &["https://a.example"]);
        if let Command::PutSecret { sealed, .. } = &mut bad {
            *sealed = "the clear value".into();
        }
        assert_eq!(rejected(s.apply(&bad)).kind, RejectKind::Invalid, "only a sealed value is kept");
        let mut by_bot = put("x", &["https://a.example"]);
        if let Command::PutSecret { by, .. } = &mut by_bot {
            *by = "tok_bot".into();
        }
        assert_eq!(rejected(s.apply(&by_bot)).kind, RejectKind::Forbidden);

        // A Computer, a grant without secrets: the bot may not fill; the member may.
        let c = "cmp_1".to_string();
        s.insert_computer(crate::sm::testing::computer(&c, "mem_o", crate::sm::model::Source::Paired));
        let grant = |secrets: Option<Vec<String>>| Command::PutGrant {
            by: OWNER.into(),
            computer_id: c.clone(),
            bot_id: "bot_1".into(),
            at_ms: 6,
            allow_root: None,
            paths: None,
            desktop_control: None,
            secrets,
        };
        ok(s.apply(&grant(None)));
        let bot = s.caller_by_token_id("tok_bot").unwrap();
        let member = s.caller_by_token_id(OWNER).unwrap();
        assert_eq!(s.secret_for_fill(&bot, &c, "site-a").unwrap_err().kind, RejectKind::Forbidden);
        assert_eq!(s.secret_for_fill(&member, &c, "site-a").unwrap().name, "site-a");
        assert_eq!(
            rejected(s.apply(&grant(Some(vec!["nope".into()])))).kind,
            RejectKind::NotFound,
            "a grant names secrets of the vault only"
        );
        assert!(s.grant(&c, "bot_1").unwrap().secrets.is_empty(), "a refused grant changed nothing");
        ok(s.apply(&grant(Some(vec!["site-a".into()]))));
        assert_eq!(grant(Some(vec![])).since(), 4);
        assert_eq!(grant(None).since(), 1);
        assert_eq!(s.secret_for_fill(&bot, &c, "site-a").unwrap().owner, "mem_o");
        // A PUT of the grant without `secrets` keeps them; `[]` removes them.
        ok(s.apply(&grant(None)));
        assert!(s.secret_for_fill(&bot, &c, "site-a").is_ok());
        ok(s.apply(&grant(Some(vec![]))));
        assert_eq!(s.secret_for_fill(&bot, &c, "site-a").unwrap_err().kind, RejectKind::Forbidden);
        ok(s.apply(&grant(Some(vec!["site-a".into()]))));
        // Revoked grant: no fill.
        ok(s.apply(&Command::DeleteGrant { by: OWNER.into(), computer_id: c.clone(), bot_id: "bot_1".into() }));
        assert!(s.secret_for_fill(&bot, &c, "site-a").is_err());

        // Last used; delete.
        ok(s.apply(&Command::TouchSecret { owner: "mem_o".into(), name: "site-a".into(), at_ms: 9 }));
        ok(s.apply(&Command::TouchSecret { owner: "mem_o".into(), name: "site-a".into(), at_ms: 7 }));
        assert_eq!(s.secrets["mem_o"]["site-a"].last_used_at, Some(9));
        ok(s.apply(&Command::DeleteSecret { by: OWNER.into(), name: "site-a".into() }));
        assert_eq!(
            rejected(s.apply(&Command::DeleteSecret { by: OWNER.into(), name: "site-a".into() })).kind,
            RejectKind::NotFound
        );
        assert!(s.secrets.is_empty(), "an empty vault is not kept");
        assert_eq!(put("a", &["https://a.example"]).since(), 4);
    }

    #[test]
    fn i41_1_a_vault_is_bounded() {
        let mut s = world();
        for i in 0..MAX_SECRETS_PER_MEMBER {
            ok(s.apply(&put(&format!("s{i}"), &["https://a.example"])));
        }
        assert_eq!(rejected(s.apply(&put("one-more", &["https://a.example"]))).kind, RejectKind::Conflict);
        ok(s.apply(&put("s0", &["https://b.example"])));
    }
}
