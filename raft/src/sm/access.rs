//! Who may see and operate a Computer, the capability decider chain, grants, approvals and
//! providers. Pure functions over [`State`].
//!
//! Bounded: at most [`MAX_GRANTS_PER_COMPUTER`] bots hold a grant on one Computer (a deleted
//! Computer's grants go with its delete), and at most [`MAX_PROVIDERS`] providers; both refused
//! as a `conflict`.

use super::identity::Role;
use super::model::ActorKind;
use super::model::Approval;
use super::model::Capability;
use super::model::Computer;
use super::model::ComputerState;
use super::model::Effect;
use super::model::ExecutionError;
use super::model::ExecutionState;
use super::model::Grant;
use super::model::Provider;
use super::model::Requester;
use super::model::Rule;
use super::response::Reject;
use super::response::RejectKind;
use super::state::Caller;
use super::state::State;

/// The most bots holding a grant on one Computer.
pub const MAX_GRANTS_PER_COMPUTER: usize = 1_000;
/// The most providers a cluster has (providers are never removed).
pub const MAX_PROVIDERS: usize = 256;

/// The most approvals the requests of one member (its own and its bots') hold pending; a
/// request that would wait on one more is refused as a conflict and changes nothing. Decided
/// approvals go with the retention.
pub const MAX_PENDING_APPROVALS_PER_MEMBER: usize = 1_000;

/// The rules in force when none were configured: members may, bots must ask.
pub fn default_rules() -> Vec<Rule> {
    let rule = |actor, effect| Rule {
        capability: None,
        effect,
        actor: Some(actor),
        member: None,
        bot: None,
        provider: None,
        computer: None,
    };
    vec![rule(ActorKind::Member, Effect::Allow), rule(ActorKind::Bot, Effect::Ask)]
}

/// The outcome of the decider chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// A rule decided.
    Effect(Effect),
    /// No rule matched: the action must not run.
    Undecided,
}

/// The first matching rule decides; none matching is [`Decided::Undecided`] (fail closed).
pub fn decide(rules: &[Rule], cap: Capability, caller: &Caller, target: &str) -> Decided {
    let is_bot = caller.bot.is_some();
    for r in rules {
        let matches = r.capability.is_none_or(|c| c == cap)
            && r.actor.is_none_or(|a| (a == ActorKind::Bot) == is_bot)
            && r.member.as_ref().is_none_or(|m| *m == caller.member.id)
            && r.bot.as_ref().is_none_or(|b| caller.bot.as_ref().is_some_and(|cb| cb.id == *b))
            && r.provider.as_ref().is_none_or(|p| cap == Capability::Create && p == target)
            && r.computer.as_ref().is_none_or(|c| cap != Capability::Create && c == target);
        if matches {
            return Decided::Effect(r.effect);
        }
    }
    Decided::Undecided
}

impl Caller {
    /// The requester record of this caller.
    pub fn requester(&self) -> Requester {
        Requester {
            token_id: self.token.id.clone(),
            member_id: self.member.id.clone(),
            bot_id: self.bot.as_ref().map(|b| b.id.clone()),
        }
    }

    /// The token may act on this Computer id at all (its `computers` limit).
    pub fn token_allows(&self, computer_id: &str) -> bool {
        self.token.computers.as_ref().is_none_or(|l| l.iter().any(|c| c == computer_id))
    }

    /// Refuses read-only tokens.
    pub fn check_writable(&self) -> Result<(), Reject> {
        if self.token.read_only { Err(Reject::new(RejectKind::Forbidden, "this token is read-only")) } else { Ok(()) }
    }
}

/// What a `PutGrant` sets besides the grant itself (`None`: left as it is).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GrantChange<'a> {
    /// Whether the bot may run calls as root.
    pub allow_root: Option<bool>,
    /// The paths a bot on a paired machine may reach.
    pub paths: Option<&'a [String]>,
    /// Whether the bot may ask for a `control` stream of the desktop for its member.
    pub desktop_control: Option<bool>,
    /// The secrets of the granting member's vault the bot may have filled there.
    pub secrets: Option<&'a [String]>,
}

impl State {
    /// The rules in force.
    pub fn rules(&self) -> Vec<Rule> {
        self.rules.clone().unwrap_or_else(default_rules)
    }

    /// A bot's grant on a Computer.
    pub fn grant(&self, computer_id: &str, bot_id: &str) -> Option<&Grant> {
        self.grants.get(computer_id).and_then(|g| g.get(bot_id))
    }

    /// Refuses a new grant of `bot_id` on a Computer that has [`MAX_GRANTS_PER_COMPUTER`]
    /// already (a bot that holds one may always have it again).
    pub(crate) fn check_grant_room(&self, computer_id: &str, bot_id: &str) -> Result<(), Reject> {
        let granted = self.grants.get(computer_id);
        if granted.is_some_and(|g| g.len() >= MAX_GRANTS_PER_COMPUTER && !g.contains_key(bot_id)) {
            return Err(super::identity::full(format!(
                "at most {MAX_GRANTS_PER_COMPUTER} bots hold a grant on a computer: remove one first"
            )));
        }
        Ok(())
    }

    /// Whether a bot holds a grant on a Computer.
    pub fn has_grant(&self, computer_id: &str, bot_id: &str) -> bool {
        self.grants.get(computer_id).is_some_and(|g| g.contains_key(bot_id))
    }

    /// May `caller` see this Computer? Checked before any row is read for lists.
    pub fn can_see(&self, caller: &Caller, c: &Computer) -> bool {
        c.state != ComputerState::Deleted && self.could_see(caller, c)
    }

    /// [`State::can_see`], also for a deleted Computer (its history: usage, events).
    pub fn could_see(&self, caller: &Caller, c: &Computer) -> bool {
        if !caller.token_allows(&c.id) {
            return false;
        }
        match &caller.bot {
            Some(bot) => self.has_grant(&c.id, &bot.id) || self.grant_history_allows(c, &bot.id),
            None => c.owner == caller.member.id || c.shared || caller.member.role >= Role::Admin,
        }
    }

    /// A bot's grant ends with a deleted Computer; its history stays visible to the bot if the
    /// bot asked for the delete.
    fn grant_history_allows(&self, c: &Computer, bot_id: &str) -> bool {
        c.state == ComputerState::Deleted
            && self.executions_of(&c.id).any(|e| e.requester.bot_id.as_deref() == Some(bot_id))
    }

    /// The Computer, if `caller` may see it; otherwise `not_found` (never `forbidden`).
    ///
    /// One exception: a bot without a grant on a Computer of its own member (or a shared one),
    /// which it may acquire and so knows of, gets `forbidden`, so a revoked bot learns why.
    pub fn visible_computer(&self, caller: &Caller, id: &str) -> Result<&Computer, Reject> {
        match self.computers.get(id) {
            Some(c) if self.can_see(caller, c) => Ok(c),
            Some(c)
                if c.state != ComputerState::Deleted
                    && caller.token_allows(id)
                    && caller.bot.as_ref().is_some_and(|b| c.owner == b.member_id || c.shared) =>
            {
                Err(Reject::new(RejectKind::Forbidden, "this bot has no right to use this computer"))
            }
            _ => Err(Reject::new(RejectKind::NotFound, "no such computer")),
        }
    }

    /// May `caller` change this Computer (lifecycle, work on it)? Read-only tokens may not.
    pub fn check_operate(&self, caller: &Caller, id: &str) -> Result<(), Reject> {
        self.visible_computer(caller, id)?;
        caller.check_writable()
    }

    /// May `caller` manage rights of `bot_id` on the Computer: a member (not a bot) who may
    /// operate the Computer and owns the bot or administers.
    fn check_grant_rights(&self, caller: &Caller, computer_id: &str, bot_id: &str) -> Result<(), Reject> {
        if caller.bot.is_some() {
            return Err(Reject::new(RejectKind::Forbidden, "bots cannot grant rights"));
        }
        self.check_operate(caller, computer_id)?;
        let bot = self.bots.get(bot_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such bot"))?;
        if bot.member_id != caller.member.id && caller.member.role < Role::Admin {
            return Err(Reject::new(RejectKind::Forbidden, "only the bot's member or an admin may change its rights"));
        }
        Ok(())
    }

    /// Grants (idempotently), and sets `allowRoot` when told: only a member may (a bot cannot
    /// grant at all, let alone itself root), checked here against the state at commit.
    pub(crate) fn put_grant(
        &mut self,
        by: &str,
        computer_id: &str,
        bot_id: &str,
        at_ms: u64,
        change: GrantChange<'_>,
    ) -> Result<(), Reject> {
        let GrantChange { allow_root, paths, desktop_control, secrets } = change;
        let caller = self.caller_by_token_id(by)?;
        self.check_grant_rights(&caller, computer_id, bot_id)?;
        if let Some(paths) = paths {
            check_grant_paths(paths)?;
        }
        if let Some(names) = secrets {
            self.check_grant_secrets(&caller.member.id, names)?;
        }
        if self.bots.get(bot_id).is_some_and(|b| b.archived_at.is_some()) {
            return Err(Reject::new(RejectKind::Invalid, "the bot is archived"));
        }
        self.check_grant_room(computer_id, bot_id)?;
        self.insert_grant(computer_id, bot_id, &caller.member.id, at_ms);
        if let Some(allow) = allow_root
            && let Some(g) = self.grants.get_mut(computer_id).and_then(|g| g.get_mut(bot_id))
        {
            g.allow_root = allow;
        }
        if let Some(paths) = paths
            && let Some(g) = self.grants.get_mut(computer_id).and_then(|g| g.get_mut(bot_id))
        {
            g.paths = paths.to_vec();
        }
        if let Some(allow) = desktop_control
            && let Some(g) = self.grants.get_mut(computer_id).and_then(|g| g.get_mut(bot_id))
        {
            g.desktop_control = allow;
        }
        if let Some(names) = secrets
            && let Some(g) = self.grants.get_mut(computer_id).and_then(|g| g.get_mut(bot_id))
        {
            let mut names = names.to_vec();
            names.sort();
            names.dedup();
            g.secrets_from = (!names.is_empty()).then(|| caller.member.id.clone());
            g.secrets = names;
        }
        Ok(())
    }

    /// May `caller` ask for a `control` stream of this Computer's desktop? A member who may
    /// operate it, or a bot (token that may write) whose grant allows it: the stream is then its
    /// member's, held as a person.
    pub fn may_control_desktop(&self, caller: &Caller, computer_id: &str) -> Result<(), Reject> {
        self.check_operate(caller, computer_id)?;
        match &caller.bot {
            None => Ok(()),
            Some(b) if self.grants.get(computer_id).and_then(|g| g.get(&b.id)).is_some_and(|g| g.desktop_control) => {
                Ok(())
            }
            Some(_) => Err(Reject::new(
                RejectKind::Forbidden,
                "a bot's control stream needs its grant to allow it: its member sets \"desktopControl\": true with PUT /v1/computers/{id}/bots/{bot}",
            )),
        }
    }

    /// May `caller` run sessions and file calls as root on this Computer? A member with a token
    /// that may write, or a bot (token that may write) whose grant allows root.
    pub fn may_be_root(&self, caller: &Caller, computer_id: &str) -> bool {
        if caller.token.read_only {
            return false;
        }
        match &caller.bot {
            None => true,
            Some(b) => self.grants.get(computer_id).and_then(|g| g.get(&b.id)).is_some_and(|g| g.allow_root),
        }
    }

    pub(crate) fn insert_grant(&mut self, computer_id: &str, bot_id: &str, by_member: &str, at_ms: u64) {
        self.insert_grant_via(computer_id, bot_id, by_member, at_ms, None);
    }

    /// A grant, acquired through the delegation `via` when set.
    pub(crate) fn insert_grant_via(
        &mut self,
        computer_id: &str,
        bot_id: &str,
        by_member: &str,
        at_ms: u64,
        via: Option<String>,
    ) {
        self.grants.entry(computer_id.to_string()).or_default().entry(bot_id.to_string()).or_insert_with(|| Grant {
            computer_id: computer_id.to_string(),
            bot_id: bot_id.to_string(),
            granted_by: by_member.to_string(),
            created_at: at_ms,
            allow_root: false,
            paths: Vec::new(),
            desktop_control: false,
            via,
            secrets: Vec::new(),
            secrets_from: None,
        });
        self.index_grant(computer_id, bot_id);
    }

    pub(crate) fn delete_grant(&mut self, by: &str, computer_id: &str, bot_id: &str) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let releasing_self = caller.bot.as_ref().is_some_and(|b| b.id == bot_id);
        if releasing_self {
            caller.check_writable()?;
            self.visible_computer(&caller, computer_id)?;
        } else {
            self.check_grant_rights(&caller, computer_id, bot_id)?;
        }
        // The bot's tool bindings there close with the grant, and so do the grants acquired there
        // through its delegations.
        self.end_grant(computer_id, bot_id);
        Ok(())
    }

    /// A bot asks for the right to use an existing Computer of its member (or a shared one).
    pub(crate) fn acquire(
        &mut self,
        by: &str,
        computer_id: &str,
        approval_id: &str,
        reason: Option<&str>,
        at_ms: u64,
    ) -> Result<Option<String>, Reject> {
        let caller = self.caller_by_token_id(by)?;
        let Some(bot) = caller.bot.clone() else {
            return Err(Reject::new(RejectKind::Invalid, "only bots acquire; members grant with PUT .../bots/:botId"));
        };
        caller.check_writable()?;
        let not_found = || Reject::new(RejectKind::NotFound, "no such computer");
        let c = self.computers.get(computer_id).ok_or_else(not_found)?;
        if c.state == ComputerState::Deleted
            || !caller.token_allows(computer_id)
            || !(c.owner == bot.member_id || c.shared)
        {
            return Err(not_found());
        }
        if self.has_grant(computer_id, &bot.id) {
            return Ok(None);
        }
        self.check_grant_room(computer_id, &bot.id)?;
        match self.decide_capability(&caller, Capability::Acquire, computer_id)? {
            Effect::Allow => {
                self.insert_grant(computer_id, &bot.id, &caller.member.id, at_ms);
                Ok(None)
            }
            // The bot that gave this one work holds a grant here: the delegation decides.
            Effect::Ask if let Some(via) = self.delegation_for(&bot.id, computer_id) => {
                self.insert_grant_via(computer_id, &bot.id, &caller.member.id, at_ms, Some(via));
                Ok(None)
            }
            Effect::Ask => {
                self.check_approval_room_within(&caller, MAX_PENDING_APPROVALS_PER_MEMBER)?;
                self.open_approval(approval_id, Capability::Acquire, computer_id, &caller, None, reason, at_ms);
                Ok(Some(approval_id.to_string()))
            }
            Effect::Deny => unreachable_deny(),
        }
    }

    /// Runs the decider chain: `Allow` or `Ask`, or a `forbidden` refusal saying why.
    pub(crate) fn decide_capability(&self, caller: &Caller, cap: Capability, target: &str) -> Result<Effect, Reject> {
        let name = serde_json::to_value(cap).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
        match decide(&self.rules(), cap, caller, target) {
            Decided::Effect(Effect::Deny) => {
                Err(Reject::new(RejectKind::Forbidden, format!("{name} is denied by a rule")))
            }
            Decided::Effect(e) => Ok(e),
            Decided::Undecided => Err(Reject::new(
                RejectKind::Forbidden,
                format!("no rule decides {name} for this caller; it does not run"),
            )),
        }
    }

    /// How many approvals the requests of `member` (its own or its bots') hold pending.
    pub fn pending_approval_count(&self, member: &str) -> usize {
        self.exec_index.pending_approvals.get(member).copied().unwrap_or(0)
    }

    /// Refuses (a conflict) a request that would park behind a new approval when the requests
    /// of `caller`'s member hold `limit` pending ones already. Called before any change.
    pub(crate) fn check_approval_room_within(&self, caller: &Caller, limit: usize) -> Result<(), Reject> {
        if self.pending_approval_count(&caller.member.id) >= limit {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("a member's requests wait on at most {limit} pending approvals: decide some first"),
            ));
        }
        Ok(())
    }

    /// Notes an approval of `member` leaving (or entering) the pending state.
    pub(crate) fn count_pending_approval(&mut self, member: &str, pending: bool) {
        let n = self.exec_index.pending_approvals.entry(member.to_string()).or_default();
        if pending {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        if *n == 0 {
            self.exec_index.pending_approvals.remove(member);
        }
    }

    #[allow(clippy::too_many_arguments)] // one record's fields; a struct would only rename them
    pub(crate) fn open_approval(
        &mut self,
        id: &str,
        capability: Capability,
        target: &str,
        caller: &Caller,
        execution_id: Option<&str>,
        reason: Option<&str>,
        at_ms: u64,
    ) {
        if let Some(old) = self.approvals.get(id).filter(|a| a.state == "pending") {
            let member = old.requester.member_id.clone();
            self.count_pending_approval(&member, false);
        }
        self.count_pending_approval(&caller.member.id, true);
        self.approvals.insert(
            id.to_string(),
            Approval {
                id: id.to_string(),
                capability,
                target: target.to_string(),
                requester: caller.requester(),
                execution_id: execution_id.map(String::from),
                state: "pending".into(),
                decided_by: None,
                decided_at: None,
                reason: reason.map(String::from),
                created_at: at_ms,
                egress: None,
            },
        );
        let computer_id = if capability == Capability::Create {
            execution_id.and_then(|e| self.executions.get(e)).map(|e| e.computer_id.clone()).unwrap_or_default()
        } else {
            target.to_string()
        };
        self.push_event(
            at_ms,
            "ApprovalRequested",
            &computer_id,
            execution_id,
            serde_json::json!({"approvalId": id, "capability": capability}),
        );
    }

    /// May `caller` decide this approval? Admins, or the member whose bot asked.
    pub fn can_decide_approval(&self, caller: &Caller, a: &Approval) -> bool {
        caller.bot.is_none()
            && !caller.token.read_only
            && caller.token.computers.is_none()
            && (caller.member.role >= Role::Admin || caller.member.id == a.requester.member_id)
    }

    pub(crate) fn decide_approval(&mut self, by: &str, id: &str, approve: bool, at_ms: u64) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let a = self.approvals.get(id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such approval"))?.clone();
        if !self.can_decide_approval(&caller, &a) {
            return Err(Reject::new(RejectKind::NotFound, "no such approval"));
        }
        let wanted = if approve { "approved" } else { "rejected" };
        if a.state != "pending" {
            return if a.state == wanted {
                Ok(())
            } else {
                Err(Reject::new(RejectKind::Conflict, format!("the approval is already {}", a.state)))
            };
        }
        if approve
            && a.capability == Capability::Acquire
            && let Some(bot) = &a.requester.bot_id
        {
            self.check_grant_room(&a.target, bot)?;
        }
        if let Some(x) = self.approvals.get_mut(id) {
            x.state = wanted.into();
            x.decided_by = Some(caller.member.id.clone());
            x.decided_at = Some(at_ms);
            self.exec_index.decided_approvals.insert((at_ms, id.to_string()));
            self.count_pending_approval(&a.requester.member_id, false);
        }
        match (approve, a.capability, &a.execution_id) {
            (_, Capability::Expose, _) => self.expose_decided(&a.target, id, approve),
            (true, Capability::Acquire, _) => {
                if let Some(bot) = &a.requester.bot_id {
                    self.insert_grant(&a.target, bot, &caller.member.id, at_ms);
                }
            }
            (false, _, Some(exe)) => {
                let err = ExecutionError { kind: "forbidden".into(), message: "the approval was rejected".into() };
                self.fail_unstarted(exe, err, at_ms);
            }
            _ => {}
        }
        Ok(())
    }

    pub(crate) fn set_rules(&mut self, by: &str, rules: &[Rule]) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        self.rules = Some(rules.to_vec());
        Ok(())
    }

    pub(crate) fn create_provider(&mut self, by: &str, p: &Provider) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        if let Some(existing) = self.providers.get(&p.id) {
            return if existing == p {
                Ok(())
            } else {
                Err(Reject::new(RejectKind::Conflict, "a different provider with this id exists"))
            };
        }
        if self.provider_by_name(&p.name).is_some() {
            return Err(Reject::new(RejectKind::Conflict, "a provider with this name exists"));
        }
        if self.providers.len() >= MAX_PROVIDERS {
            return Err(super::identity::full(format!("a cluster has at most {MAX_PROVIDERS} providers")));
        }
        self.insert_provider(p);
        Ok(())
    }

    /// Fails an execution that never reached a provider and releases its Computer.
    pub(crate) fn fail_unstarted(&mut self, exe_id: &str, err: ExecutionError, at_ms: u64) {
        let Some(exe) = self.executions.get(exe_id).cloned() else { return };
        if !matches!(exe.state, ExecutionState::Pending | ExecutionState::Running) || exe.dispatched_at.is_some() {
            return;
        }
        self.finish_failed(&exe.id, err, at_ms);
    }
}

fn unreachable_deny<T>() -> Result<T, Reject> {
    // decide_capability turns Deny into a refusal; keep a refusal here too rather than a panic.
    Err(Reject::new(RejectKind::Forbidden, "denied by a rule"))
}

/// A grant names at most 16 paths, each absolute, at most 1024 bytes, without `.` or `..`
/// components or control characters.
fn check_grant_paths(paths: &[String]) -> Result<(), Reject> {
    let bad = |why: &str| Err(Reject::new(RejectKind::Invalid, format!("paths: {why}")));
    if paths.len() > 16 {
        return bad("at most 16");
    }
    for p in paths {
        if !p.starts_with('/') || p.len() > 1024 || p.chars().any(char::is_control) {
            return bad("each is an absolute path of at most 1024 bytes");
        }
        if p.split('/').any(|c| c == "." || c == "..") {
            return bad("no `.` or `..` components");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::identity::Bot;
    use crate::sm::identity::Member;
    use crate::sm::identity::Principal;
    use crate::sm::identity::Token;

    fn caller(bot: bool) -> Caller {
        Caller {
            token: Token {
                id: "tok".into(),
                name: "t".into(),
                hash: "h".into(),
                principal: Principal::Member("mem_a".into()),
                read_only: false,
                computers: None,
                created_at: 0,
                revoked_at: None,
            },
            member: Member { id: "mem_a".into(), name: "a".into(), email: None, role: Role::Member, created_at: 0 },
            bot: bot.then(|| Bot {
                id: "bot_a".into(),
                name: "b".into(),
                member_id: "mem_a".into(),
                created_at: 0,
                archived_at: None,
            }),
        }
    }

    #[test]
    fn default_chain_allows_members_and_asks_for_bots() {
        let rules = default_rules();
        assert_eq!(decide(&rules, Capability::Create, &caller(false), "cpp_1"), Decided::Effect(Effect::Allow));
        assert_eq!(decide(&rules, Capability::Delete, &caller(true), "cmp_1"), Decided::Effect(Effect::Ask));
    }

    #[test]
    fn first_matching_rule_wins_and_no_match_is_undecided() {
        let deny_provider = Rule {
            capability: Some(Capability::Create),
            effect: Effect::Deny,
            actor: None,
            member: None,
            bot: None,
            provider: Some("cpp_x".into()),
            computer: None,
        };
        let allow_bot =
            Rule { effect: Effect::Allow, provider: None, actor: Some(ActorKind::Bot), ..deny_provider.clone() };
        let rules = vec![deny_provider, allow_bot];
        assert_eq!(decide(&rules, Capability::Create, &caller(true), "cpp_x"), Decided::Effect(Effect::Deny));
        assert_eq!(decide(&rules, Capability::Create, &caller(true), "cpp_y"), Decided::Effect(Effect::Allow));
        assert_eq!(decide(&rules, Capability::Create, &caller(false), "cpp_y"), Decided::Undecided);
        assert_eq!(decide(&rules, Capability::Delete, &caller(true), "cmp_1"), Decided::Undecided);
        assert_eq!(decide(&[], Capability::Acquire, &caller(false), "cmp_1"), Decided::Undecided);
    }
}
