//! The state held by every replica and the pure function that changes it.

use std::collections::BTreeMap;
use std::collections::VecDeque;

use serde::Deserialize;
use serde::Serialize;

use super::command::Command;
use super::events::Event;
use super::identity::Bot;
use super::identity::Member;
use super::identity::Organization;
use super::identity::Principal;
use super::identity::Role;
use super::identity::Token;
use super::model::Approval;
use super::model::Computer;
use super::model::Execution;
use super::model::Grant;
use super::model::Provider;
use super::model::Rule;
use super::plan::DueIndex;
use super::plan::PlanEntry;
use super::response::Reject;
use super::response::RejectKind;
use super::response::Response;
use super::tools::Operation;
use super::tools::ToolBinding;
use super::usage::UsageSpan;

/// Everything the state machine holds. Serialized whole into snapshots.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Fixed at bootstrap; a data dir of another cluster is refused.
    pub cluster_id: Option<String>,
    /// The organization, once bootstrapped.
    pub org: Option<Organization>,
    /// Members by id.
    pub members: BTreeMap<String, Member>,
    /// Bots by id.
    pub bots: BTreeMap<String, Bot>,
    /// Tokens by id.
    pub tokens: BTreeMap<String, Token>,
    /// Token id by secret hash, to authenticate a call in one lookup.
    pub token_by_hash: BTreeMap<String, String>,
    /// Providers by id.
    #[serde(default)]
    pub providers: BTreeMap<String, Provider>,
    /// Computers by id (deleted ones stay as tombstones).
    #[serde(default)]
    pub computers: BTreeMap<String, Computer>,
    /// Lifecycle executions by id.
    #[serde(default)]
    pub executions: BTreeMap<String, Execution>,
    /// Execution id by idempotency scope ("principal\ncommandKey"). Keys never expire.
    #[serde(default)]
    pub execution_keys: BTreeMap<String, String>,
    /// Grants: computer id -> bot id -> grant.
    #[serde(default)]
    pub grants: BTreeMap<String, BTreeMap<String, Grant>>,
    /// Run spans by computer id.
    #[serde(default)]
    pub usage: BTreeMap<String, Vec<UsageSpan>>,
    /// The bounded event log, oldest first.
    #[serde(default)]
    pub events: VecDeque<Event>,
    /// The seq of the last event pushed.
    #[serde(default)]
    pub next_event_seq: u64,
    /// Capability rules; `None` = the built-in defaults.
    #[serde(default)]
    pub rules: Option<Vec<Rule>>,
    /// Approvals by id.
    #[serde(default)]
    pub approvals: BTreeMap<String, Approval>,
    /// The idle-pause plan: running provider Computers that pause by themselves.
    #[serde(default)]
    pub plan: BTreeMap<String, PlanEntry>,
    /// The plan by deadline.
    #[serde(default)]
    pub plan_due: DueIndex,
    /// MCP tool bindings by id.
    #[serde(default)]
    pub tool_bindings: BTreeMap<String, ToolBinding>,
    /// The tool-call journal, by "bot\noperationId".
    #[serde(default)]
    pub operations: BTreeMap<String, Operation>,
    /// Version switches of tool bindings, by "bot\noperationId".
    #[serde(default)]
    pub switches: BTreeMap<String, super::tools::Switch>,
    /// The nodes the leader hears from; Computers are placed over them (`placement`).
    #[serde(default)]
    pub live_nodes: std::collections::BTreeSet<u64>,
}

/// An authenticated caller: a live token and what it speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token used.
    pub token: Token,
    /// The member behind the token: the member itself, or the bot's member.
    pub member: Member,
    /// The bot, when the token is a bot token.
    pub bot: Option<Bot>,
}

impl Caller {
    /// True for an owner or admin acting with an unrestricted member token.
    fn may_administer(&self) -> bool {
        self.bot.is_none() && self.member.role >= Role::Admin && self.token.computers.is_none()
    }

    /// Checks the right to read identity records (owner/admin, read-only allowed).
    pub fn check_admin_read(&self) -> Result<(), Reject> {
        if self.may_administer() {
            Ok(())
        } else {
            Err(Reject::new(RejectKind::Forbidden, "only an owner or admin may do this"))
        }
    }

    /// Checks the right to change identity records (owner/admin, not read-only).
    pub fn check_admin_write(&self) -> Result<(), Reject> {
        self.check_admin_read()?;
        if self.token.read_only {
            return Err(Reject::new(RejectKind::Forbidden, "this token is read-only"));
        }
        Ok(())
    }
}

impl State {
    /// Resolves a token id to a live caller, or says why not.
    pub fn caller_by_token_id(&self, token_id: &str) -> Result<Caller, Reject> {
        let unauthorized = || Reject::new(RejectKind::Unauthorized, "the token is not valid");
        let token = self.tokens.get(token_id).ok_or_else(unauthorized)?;
        if token.revoked_at.is_some() {
            return Err(unauthorized());
        }
        let (member_id, bot) = match &token.principal {
            Principal::Member(m) => (m.as_str(), None),
            Principal::Bot(b) => {
                let bot = self.bots.get(b).ok_or_else(unauthorized)?;
                if bot.archived_at.is_some() {
                    return Err(unauthorized());
                }
                (bot.member_id.as_str(), Some(bot.clone()))
            }
        };
        let member = self.members.get(member_id).ok_or_else(unauthorized)?;
        Ok(Caller { token: token.clone(), member: member.clone(), bot })
    }

    /// Resolves a secret's hash to a live caller.
    pub fn caller_by_hash(&self, hash: &str) -> Result<Caller, Reject> {
        match self.token_by_hash.get(hash) {
            Some(id) => self.caller_by_token_id(id),
            None => Err(Reject::new(RejectKind::Unauthorized, "the token is not valid")),
        }
    }

    /// Applies one command. Pure and deterministic; a rejected command changes nothing.
    pub fn apply(&mut self, cmd: &Command) -> Response {
        // Lifecycle steps validate everything before their first change, so a refusal leaves the
        // state as it was.
        let with_id = match cmd {
            Command::SubmitExecution(s) => Some(self.submit(s).map(Some)),
            Command::Acquire { by, computer_id, approval_id, reason, at_ms } => {
                Some(self.acquire(by, computer_id, approval_id, reason.as_deref(), *at_ms))
            }
            Command::RedeemPairing { code, credential_hash, at_ms } => {
                Some(self.redeem_pairing(code, credential_hash, *at_ms).map(Some))
            }
            Command::PlanPause { computer_id, version, execution_id, at_ms } => {
                Some(self.plan_pause(computer_id, *version, execution_id, *at_ms).map(Some))
            }
            Command::BindingReserve { by, binding } => Some(self.binding_reserve(by, binding).map(Some)),
            Command::OperationBegin { by, operation } => Some(self.operation_begin(by, operation).map(Some)),
            Command::SwitchReserve { by, switch } => Some(self.switch_reserve(by, switch).map(Some)),
            Command::LinkUp { computer_id, credential_hash, node_id, at_ms } => {
                Some(self.link_up(computer_id, credential_hash, *node_id, *at_ms).map(|g| Some(g.to_string())))
            }
            _ => None,
        };
        let result = match with_id {
            Some(r) => r,
            None => self.try_apply(cmd).map(|()| None),
        };
        match result {
            Ok(None) => Response::Ok,
            Ok(Some(id)) => Response::Id(id),
            Err(r) => Response::Rejected(r),
        }
    }

    fn try_apply(&mut self, cmd: &Command) -> Result<(), Reject> {
        match cmd {
            Command::LinkDown { computer_id, generation, at_ms } => self.link_down(computer_id, *generation, *at_ms),
            Command::SandboxVanished { computer_id, at_ms } => self.sandbox_vanished(computer_id, *at_ms),
            Command::BindingSettle { binding_id, ready, tools, error } => {
                self.binding_settle(binding_id, *ready, tools, error.as_ref())
            }
            Command::BindingRevoke { by, binding_id } => self.binding_revoke(by, binding_id),
            Command::OperationFinish { key, result } => self.operation_finish(key, result.as_ref()),
            Command::SwitchSettle { key, receipt, ok } => self.switch_settle(key, receipt, *ok),
            Command::ReportActivity { marks } => {
                self.report_activity(marks);
                Ok(())
            }
            Command::SessionEnded { computer_id, generation, session_id, owner, exit_code, signal, at_ms } => {
                self.session_ended(computer_id, *generation, session_id, owner, *exit_code, signal.as_deref(), *at_ms)
            }
            Command::SubmitExecution(_)
            | Command::Acquire { .. }
            | Command::RedeemPairing { .. }
            | Command::PlanPause { .. }
            | Command::BindingReserve { .. }
            | Command::OperationBegin { .. }
            | Command::SwitchReserve { .. }
            | Command::LinkUp { .. } => Err(Reject::new(RejectKind::Invalid, "handled in apply")),
            Command::CreateProvider { by, provider } => self.create_provider(by, provider),
            Command::ClaimExecution { execution_id, claim, node, at_ms } => {
                self.claim(execution_id, claim, *node, *at_ms)
            }
            Command::SetLiveNodes { nodes } => self.set_live_nodes(nodes),
            Command::DispatchExecution { execution_id, claim, at_ms } => self.dispatch(execution_id, claim, *at_ms),
            Command::FinishExecution { execution_id, claim, outcome, at_ms } => {
                self.finish(execution_id, claim, outcome, *at_ms)
            }
            Command::MarkUnknown { execution_id, claim, node, reason, at_ms } => {
                self.mark_unknown(execution_id, claim, *node, reason, *at_ms)
            }
            Command::DecideExecution { by, execution_id, outcome, reason, at_ms } => {
                self.decide(by, execution_id, *outcome, reason, *at_ms)
            }
            Command::StopComputer { by, computer_id, at_ms } => self.stop(by, computer_id, *at_ms),
            Command::PutGrant { by, computer_id, bot_id, at_ms } => self.put_grant(by, computer_id, bot_id, *at_ms),
            Command::DeleteGrant { by, computer_id, bot_id } => self.delete_grant(by, computer_id, bot_id),
            Command::DecideApproval { by, approval_id, approve, at_ms } => {
                self.decide_approval(by, approval_id, *approve, *at_ms)
            }
            Command::SetRules { by, rules } => self.set_rules(by, rules),
            Command::Bootstrap { cluster_id, org, owner, token } => self.bootstrap(cluster_id, org, owner, token),
            Command::CreateMember { by, member } => self.create_member(by, member),
            Command::CreateBot { by, bot } => self.create_bot(by, bot),
            Command::ArchiveBot { by, bot_id, at_ms } => self.archive_bot(by, bot_id, *at_ms),
            Command::CreateToken { by, token } => self.create_token(by, token),
            Command::RevokeToken { by, token_id, at_ms } => self.revoke_token(by, token_id, *at_ms),
        }
    }

    fn bootstrap(&mut self, cluster_id: &str, org: &Organization, owner: &Member, token: &Token) -> Result<(), Reject> {
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
        self.members.insert(owner.id.clone(), owner.clone());
        self.insert_token(token);
        Ok(())
    }

    fn create_member(&mut self, by: &str, member: &Member) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        caller.check_admin_write()?;
        if member.role == Role::Owner && caller.member.role != Role::Owner {
            return Err(Reject::new(RejectKind::Forbidden, "only an owner may add an owner"));
        }
        if let Some(existing) = self.members.get(&member.id) {
            return same_or_conflict(existing == member, "member");
        }
        if let Some(email) = &member.email
            && self.members.values().any(|m| m.email.as_deref() == Some(email))
        {
            return Err(Reject::new(RejectKind::Conflict, "a member with this email exists"));
        }
        self.members.insert(member.id.clone(), member.clone());
        Ok(())
    }

    fn create_bot(&mut self, by: &str, bot: &Bot) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        if let Some(existing) = self.bots.get(&bot.id) {
            return same_or_conflict(existing == bot, "bot");
        }
        if !self.members.contains_key(&bot.member_id) {
            return Err(Reject::new(RejectKind::NotFound, "no such member"));
        }
        if bot.archived_at.is_some() {
            return Err(Reject::new(RejectKind::Invalid, "a new bot cannot be archived"));
        }
        self.bots.insert(bot.id.clone(), bot.clone());
        Ok(())
    }

    fn archive_bot(&mut self, by: &str, bot_id: &str, at_ms: u64) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        let bot = self.bots.get_mut(bot_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such bot"))?;
        if bot.archived_at.is_none() {
            bot.archived_at = Some(at_ms);
        }
        // Archiving ends the bot's rights; the Computers stay.
        for grants in self.grants.values_mut() {
            grants.remove(bot_id);
        }
        self.grants.retain(|_, g| !g.is_empty());
        Ok(())
    }

    fn create_token(&mut self, by: &str, token: &Token) -> Result<(), Reject> {
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
        self.insert_token(token);
        Ok(())
    }

    fn revoke_token(&mut self, by: &str, token_id: &str, at_ms: u64) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        let token = self.tokens.get_mut(token_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such token"))?;
        if token.revoked_at.is_none() {
            token.revoked_at = Some(at_ms);
        }
        Ok(())
    }

    fn insert_token(&mut self, token: &Token) {
        self.token_by_hash.insert(token.hash.clone(), token.id.clone());
        self.tokens.insert(token.id.clone(), token.clone());
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
    use crate::sm::hash_secret;

    fn member(id: &str, role: Role) -> Member {
        Member { id: id.into(), name: id.into(), email: None, role, created_at: 1 }
    }

    fn token(id: &str, principal: Principal) -> Token {
        Token {
            id: id.into(),
            name: id.into(),
            hash: hash_secret(id),
            principal,
            read_only: false,
            computers: None,
            created_at: 1,
            revoked_at: None,
        }
    }

    fn booted() -> State {
        let mut s = State::default();
        let r = s.apply(&Command::Bootstrap {
            cluster_id: "c1".into(),
            org: Organization { id: "org_1".into(), name: "o".into(), created_at: 1 },
            owner: member("mem_owner", Role::Owner),
            token: token("tok_owner", Principal::Member("mem_owner".into())),
        });
        assert_eq!(r, Response::Ok);
        s
    }

    fn rejected(r: Response) -> RejectKind {
        match r {
            Response::Rejected(r) => r.kind,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn bootstrap_once() {
        let mut s = booted();
        let again = Command::Bootstrap {
            cluster_id: "c2".into(),
            org: Organization { id: "org_2".into(), name: "o".into(), created_at: 1 },
            owner: member("mem_x", Role::Owner),
            token: token("tok_x", Principal::Member("mem_x".into())),
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
        assert_eq!(s.apply(&Command::CreateBot { by: "tok_owner".into(), bot }), Response::Ok);
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
}
