//! Delegations: which bot gave which bot work (SPEC §3).
//!
//! A child bot may acquire a Computer on which the bot that gave it work (its parent) holds a
//! grant. The relation is recorded either when the child is created with a parent, or by a
//! delegation the parent (or its member) makes later, and the parent can end it. A delegation
//! grants nothing by itself: the child still asks (`Acquire`), and the decider chain decides,
//! with the delegation as one of its inputs (an `Ask` becomes an `Allow` when the parent holds a
//! grant on the Computer; a `Deny` stays a `Deny`). A grant acquired through a delegation names
//! it (`via`), and ends with it, and when the parent's own grant on that Computer ends.
//!
//! Bounded: at most [`MAX_DELEGATIONS`] live delegations per parent; an ended one is removed.

use super::identity::Role;
use super::model::Delegation;
use super::response::Reject;
use super::response::RejectKind;
use super::state::Caller;
use super::state::State;

/// The most live delegations one bot may have given.
pub const MAX_DELEGATIONS: usize = 64;

impl State {
    /// May `caller` give or end `parent`'s delegations? The parent bot itself (a writable
    /// token), its member, or an admin.
    fn check_delegator(&self, caller: &Caller, parent: &str) -> Result<(), Reject> {
        caller.check_writable()?;
        let bot = self.bots.get(parent).filter(|b| b.archived_at.is_none());
        let bot = bot.ok_or_else(|| Reject::new(RejectKind::NotFound, "no such bot"))?;
        let allowed = match &caller.bot {
            Some(b) => b.id == parent,
            None => {
                caller.token.computers.is_none()
                    && (caller.member.id == bot.member_id || caller.member.role >= Role::Admin)
            }
        };
        if !allowed {
            return Err(Reject::new(
                RejectKind::Forbidden,
                "only the bot itself, its member or an admin may give or end its delegations",
            ));
        }
        Ok(())
    }

    /// Records that `d.parent_bot_id` gave `d.child_bot_id` work. Idempotent on the id.
    pub(crate) fn delegate(&mut self, by: &str, d: &Delegation) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        self.check_delegator(&caller, &d.parent_bot_id)?;
        if let Some(existing) = self.delegations.by_id.get(&d.id) {
            return if existing == d {
                Ok(())
            } else {
                Err(Reject::new(RejectKind::Conflict, "a different delegation with this id exists"))
            };
        }
        self.check_new_delegation(d)?;
        self.delegations.insert(d.clone());
        Ok(())
    }

    /// The checks of a new delegation that do not depend on who asks.
    pub(crate) fn check_new_delegation(&self, d: &Delegation) -> Result<(), Reject> {
        let parent = self.bots.get(&d.parent_bot_id).filter(|b| b.archived_at.is_none());
        let parent = parent.ok_or_else(|| Reject::new(RejectKind::NotFound, "no such parent bot"))?;
        let child = self.bots.get(&d.child_bot_id).filter(|b| b.archived_at.is_none());
        let child = child.ok_or_else(|| Reject::new(RejectKind::NotFound, "no such child bot"))?;
        if parent.id == child.id {
            return Err(Reject::new(RejectKind::Invalid, "a bot cannot delegate to itself"));
        }
        if parent.member_id != child.member_id {
            return Err(Reject::new(RejectKind::Invalid, "a bot delegates only to a bot of its own member"));
        }
        if let Some(live) = self.delegations.of(&d.parent_bot_id).find(|x| x.child_bot_id == d.child_bot_id) {
            return Err(Reject::new(RejectKind::Conflict, format!("already delegated ({})", live.id)));
        }
        let given = self.delegations.of(&d.parent_bot_id).filter(|x| x.parent_bot_id == d.parent_bot_id).count();
        if given >= MAX_DELEGATIONS {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("a bot gives at most {MAX_DELEGATIONS} delegations; end one first"),
            ));
        }
        Ok(())
    }

    /// Inserts a checked delegation (a bot created with a parent).
    pub(crate) fn insert_delegation(&mut self, d: Delegation) {
        self.delegations.insert(d);
    }

    /// Ends a delegation, and every grant acquired through it.
    pub(crate) fn end_delegation(&mut self, by: &str, id: &str) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let d = self.delegations.by_id.get(id).cloned();
        let d = d.ok_or_else(|| Reject::new(RejectKind::NotFound, "no such delegation"))?;
        self.check_delegator(&caller, &d.parent_bot_id)?;
        self.drop_delegation(id);
        Ok(())
    }

    /// Removes a delegation and the grants acquired through it.
    pub(crate) fn drop_delegation(&mut self, id: &str) {
        let Some(d) = self.delegations.remove(id) else { return };
        let through: Vec<String> = self
            .granted_to(&d.child_bot_id)
            .filter(|c| self.grant(c, &d.child_bot_id).is_some_and(|g| g.via.as_deref() == Some(id)))
            .cloned()
            .collect();
        for computer in through {
            self.end_grant(&computer, &d.child_bot_id);
        }
    }

    /// Ends every delegation `bot` gave or received (it is archived).
    pub(crate) fn drop_delegations_of(&mut self, bot: &str) {
        let ids: Vec<String> = self.delegations.of(bot).map(|d| d.id.clone()).collect();
        for id in ids {
            self.drop_delegation(&id);
        }
    }

    /// The delegation through which `child` may acquire `computer`: one from a parent holding a
    /// grant there.
    pub(crate) fn delegation_for(&self, child: &str, computer: &str) -> Option<String> {
        self.delegations
            .of(child)
            .find(|d| d.child_bot_id == child && self.has_grant(computer, &d.parent_bot_id))
            .map(|d| d.id.clone())
    }

    /// Removes `bot`'s grant on `computer`, its tool bindings there, and the grants acquired
    /// there through delegations `bot` gave (down the chain).
    pub(crate) fn end_grant(&mut self, computer: &str, bot: &str) {
        if !self.has_grant(computer, bot) {
            return;
        }
        self.remove_grant(computer, bot);
        self.close_bot_bindings(computer, bot);
        let children: Vec<(String, String)> = self
            .delegations
            .of(bot)
            .filter(|d| d.parent_bot_id == bot)
            .map(|d| (d.id.clone(), d.child_bot_id.clone()))
            .collect();
        for (id, child) in children {
            if self.grant(computer, &child).is_some_and(|g| g.via.as_deref() == Some(id.as_str())) {
                self.end_grant(computer, &child);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::identity::Bot;
    use crate::sm::identity::Principal;
    use crate::sm::model::Source;
    use crate::sm::testing::*;

    fn bot(s: &mut State, id: &str, parent: Option<&str>) {
        let b = Bot { id: id.into(), name: id.into(), member_id: "mem_o".into(), created_at: 1, archived_at: None };
        ok(s.apply(&Command::CreateBot { by: OWNER.into(), bot: b, parent: parent.map(String::from) }));
        let tok = format!("tok_{id}");
        ok(s.apply(&Command::CreateToken { by: OWNER.into(), token: token(&tok, Principal::Bot(id.into())) }));
    }

    fn acquire(s: &mut State, bot: &str, computer: &str) -> crate::sm::Response {
        s.apply(&Command::Acquire {
            by: format!("tok_{bot}"),
            computer_id: computer.into(),
            approval_id: format!("apr_{bot}"),
            reason: None,
            at_ms: 5,
        })
    }

    fn world_with_computer() -> State {
        let mut s = world();
        s.computers.insert("cmp_1".into(), computer("cmp_1", "mem_o", Source::Paired));
        s.reindex_computers();
        ok(s.apply(&Command::PutGrant {
            by: OWNER.into(),
            computer_id: "cmp_1".into(),
            bot_id: "bot_1".into(),
            at_ms: 2,
            allow_root: None,
            desktop_control: None,
            secrets: None,
            paths: None,
        }));
        s
    }

    #[test]
    fn a_child_acquires_what_its_parent_holds_and_loses_it_with_the_delegation() {
        let mut s = world_with_computer();
        bot(&mut s, "bot_child", Some("bot_1"));
        bot(&mut s, "bot_stranger", None);
        // The stranger asks (an approval); the child gets it at once, through the delegation.
        assert_eq!(ok(acquire(&mut s, "bot_stranger", "cmp_1")), Some("apr_bot_stranger".into()));
        assert_eq!(ok(acquire(&mut s, "bot_child", "cmp_1")), None);
        let via = s.grant("cmp_1", "bot_child").and_then(|g| g.via.clone());
        assert_eq!(via.as_deref(), Some("dlg_bot_child"));
        // A grandchild through the child; the parent's grant ending ends both, down the chain.
        bot(&mut s, "bot_grandchild", Some("bot_child"));
        assert_eq!(ok(acquire(&mut s, "bot_grandchild", "cmp_1")), None);
        ok(s.apply(&Command::DeleteGrant { by: OWNER.into(), computer_id: "cmp_1".into(), bot_id: "bot_1".into() }));
        assert!(!s.has_grant("cmp_1", "bot_child") && !s.has_grant("cmp_1", "bot_grandchild"));
        // Without the parent's grant, the child asks like anyone.
        assert_eq!(ok(acquire(&mut s, "bot_child", "cmp_1")), Some("apr_bot_child".into()));
    }

    #[test]
    fn ending_a_delegation_ends_only_what_was_acquired_through_it() {
        let mut s = world_with_computer();
        bot(&mut s, "bot_c", None);
        let d = Delegation {
            id: "dlg_x".into(),
            parent_bot_id: "bot_1".into(),
            child_bot_id: "bot_c".into(),
            made_by: "bot_1".into(),
            created_at: 3,
        };
        // Only the parent (or its member, or an admin) delegates; not the child.
        let r = rejected(s.apply(&Command::Delegate { by: "tok_bot_c".into(), delegation: d.clone() }));
        assert_eq!(r.kind, RejectKind::Forbidden);
        assert_eq!(ok(s.apply(&Command::Delegate { by: "tok_bot".into(), delegation: d.clone() })), None);
        assert_eq!(ok(s.apply(&Command::Delegate { by: "tok_bot".into(), delegation: d.clone() })), None, "idempotent");
        let twice = Delegation { id: "dlg_y".into(), ..d.clone() };
        assert_eq!(
            rejected(s.apply(&Command::Delegate { by: "tok_bot".into(), delegation: twice })).kind,
            RejectKind::Conflict
        );
        assert_eq!(ok(acquire(&mut s, "bot_c", "cmp_1")), None);
        // A second Computer granted to the child directly stays when the delegation ends.
        s.computers.insert("cmp_2".into(), computer("cmp_2", "mem_o", Source::Paired));
        s.reindex_computers();
        ok(s.apply(&Command::PutGrant {
            by: OWNER.into(),
            computer_id: "cmp_2".into(),
            bot_id: "bot_c".into(),
            at_ms: 4,
            allow_root: None,
            desktop_control: None,
            secrets: None,
            paths: None,
        }));
        let r = rejected(s.apply(&Command::EndDelegation { by: "tok_bot_c".into(), delegation_id: "dlg_x".into() }));
        assert_eq!(r.kind, RejectKind::Forbidden, "the child cannot end it");
        assert_eq!(ok(s.apply(&Command::EndDelegation { by: "tok_bot".into(), delegation_id: "dlg_x".into() })), None);
        assert!(!s.has_grant("cmp_1", "bot_c"), "acquired through it: gone");
        assert!(s.has_grant("cmp_2", "bot_c"), "granted by a member: kept");
        assert!(s.delegations.by_id.is_empty() && s.delegations.by_bot.is_empty());
        let r = rejected(s.apply(&Command::EndDelegation { by: "tok_bot".into(), delegation_id: "dlg_x".into() }));
        assert_eq!(r.kind, RejectKind::NotFound);
    }

    #[test]
    fn a_rule_that_denies_still_denies_and_bad_delegations_change_nothing() {
        let mut s = world_with_computer();
        bot(&mut s, "bot_c", Some("bot_1"));
        let deny = crate::sm::model::Rule {
            capability: Some(crate::sm::model::Capability::Acquire),
            effect: crate::sm::model::Effect::Deny,
            actor: None,
            member: None,
            bot: Some("bot_c".into()),
            provider: None,
            computer: None,
        };
        let mut rules = vec![deny];
        rules.extend(crate::sm::default_rules());
        ok(s.apply(&Command::SetRules { by: OWNER.into(), rules }));
        assert_eq!(rejected(acquire(&mut s, "bot_c", "cmp_1")).kind, RejectKind::Forbidden);
        let before = s.delegations.clone();
        let to_self = Delegation {
            id: "dlg_s".into(),
            parent_bot_id: "bot_1".into(),
            child_bot_id: "bot_1".into(),
            made_by: "mem_o".into(),
            created_at: 3,
        };
        assert_eq!(
            rejected(s.apply(&Command::Delegate { by: OWNER.into(), delegation: to_self })).kind,
            RejectKind::Invalid
        );
        let b = Bot {
            id: "bot_orphan".into(),
            name: "o".into(),
            member_id: "mem_o".into(),
            created_at: 1,
            archived_at: None,
        };
        let r = rejected(s.apply(&Command::CreateBot { by: OWNER.into(), bot: b, parent: Some("bot_nope".into()) }));
        assert_eq!(r.kind, RejectKind::NotFound);
        assert!(!s.bots.contains_key("bot_orphan"), "a refused create adds no bot");
        assert_eq!(s.delegations, before);
        // Archiving the parent ends its delegations.
        ok(s.apply(&Command::ArchiveBot { by: OWNER.into(), bot_id: "bot_1".into(), at_ms: 9 }));
        assert!(s.delegations.by_id.is_empty());
    }
}
