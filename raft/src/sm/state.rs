//! The state held by every replica and the pure function that changes it.

use std::collections::BTreeMap;
use std::collections::VecDeque;

use serde::Deserialize;
use serde::Serialize;

use super::command::Command;
use super::command::Request;
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
    /// Run spans by computer id: the newest `usage::MAX_SPANS_PER_COMPUTER` of each.
    #[serde(default)]
    pub usage: BTreeMap<String, VecDeque<UsageSpan>>,
    /// The spans no longer kept in `usage`, folded into totals, by computer id.
    #[serde(default)]
    pub usage_folded: BTreeMap<String, super::usage::FoldedUsage>,
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
    /// The tool bindings by bot and Computer (rebuilt from the records when a snapshot loads).
    #[serde(default)]
    pub binding_index: super::tools::BindingIndex,
    /// The nodes the leader hears from; Computers are placed over them (`placement`).
    #[serde(default)]
    pub live_nodes: std::collections::BTreeSet<u64>,
    /// Who may join the cluster, and which node certificates are revoked (`join`).
    #[serde(default)]
    pub join: super::join::JoinState,
    /// The cluster's clock: the greatest leader stamp applied so far, unix ms (0 before the
    /// first stamped entry). Idle-pause deadlines are read against it only.
    #[serde(default)]
    pub clock: u64,
    /// Warm pools' sandboxes by pool id (`pool`): bounded per provider and in all.
    #[serde(default)]
    pub pool: BTreeMap<String, super::pool::PoolEntry>,
    /// The binding-UID ranges of sandboxes on shared kernels (`uids`).
    #[serde(default)]
    pub uid_ranges: super::uids::UidRanges,
    /// Open executions, pairing codes, executions per Computer and ended sessions: derived,
    /// never serialized, rebuilt when a snapshot loads (`exec_index`).
    #[serde(skip)]
    pub exec_index: super::exec_index::ExecIndex,
    /// Computers by owner, the shared ones, and each bot's grants: derived, never serialized,
    /// rebuilt when a snapshot loads (`computer_index`).
    #[serde(skip)]
    pub computer_index: super::computer_index::ComputerIndex,
    /// Live tokens per principal, dead tokens by time, live bots per member, e-mails and
    /// provider names: derived, never serialized, rebuilt when a snapshot loads
    /// (`identity_index`).
    #[serde(skip)]
    pub identity_index: super::identity_index::IdentityIndex,
    /// Which bot gave which bot work (`delegation`).
    #[serde(default)]
    pub delegations: super::model::Delegations,
    /// Public port addresses (`ports`): at most `ports::MAX_PORTS` per Computer, gone with it.
    #[serde(default)]
    pub ports: super::model::Ports,
    /// How long finished executions and decided approvals are kept (`retention`).
    #[serde(default)]
    pub retention: super::retention::Retention,
    /// The organization's caps on bots and Computers (`limits`).
    #[serde(default)]
    pub limits: super::limits::Limits,
    /// Browser action records by `computer\ncaller\nactionId` (`actions`).
    #[serde(default)]
    pub browser_actions: BTreeMap<String, super::model::BrowserAction>,
    /// Blob records by id (`blobs`): the bytes are in the nodes' blob stores.
    #[serde(default)]
    pub blobs: BTreeMap<String, super::model::Blob>,
    /// Checked copies into Computers by id (`blobs`).
    #[serde(default)]
    pub artifacts: BTreeMap<String, super::model::Artifact>,
    /// The blob quota and retention (`blobs`).
    #[serde(default)]
    pub blob_limits: super::model::BlobLimits,
    /// Turns' runs and their events (`runs`).
    #[serde(default)]
    pub runs: super::run_model::RunBook,
    /// The members' vaults (`secrets`): sealed values only, at most
    /// `secrets::MAX_SECRETS_PER_MEMBER` per member.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: super::secrets::Vaults,
    /// The store version each node said it speaks (`versions`), when above 1; at most one per
    /// node id, and a removed node's goes with it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_versions: BTreeMap<u64, u32>,
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

    /// Applies one log entry: its leader stamp moves the cluster's clock forward (never back:
    /// entries of one leader may append out of stamp order, and a new leader's clock may lag),
    /// then its command applies. Pure and deterministic, like [`State::apply`].
    pub fn apply_request(&mut self, req: &Request) -> Response {
        if let Some(ms) = req.leader_ms() {
            self.clock = self.clock.max(ms);
        }
        let response = self.apply(req.command());
        self.compact_expired();
        self.expire_leases();
        response
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
            Command::ExposePort { by, computer_id, port, protocol, label_hash, approval_id, at_ms } => {
                Some(self.expose_port(by, computer_id, *port, protocol, label_hash, approval_id, *at_ms))
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
            Command::ActionPrepare { by, action } => Some(self.action_prepare(by, action).map(Some)),
            Command::RunStart { by, run } => Some(self.run_start(by, run).map(Some)),
            Command::RunClaim { by, bot_id, claim, lease_ms } => Some(self.run_claim(by, bot_id, claim, *lease_ms)),
            Command::RunEvent { by, run_id, claim, kind, data } => {
                Some(self.run_event(by, run_id, claim, kind, data).map(Some))
            }
            Command::PoolClaim { execution_id, claim, key, at_ms } => {
                Some(self.pool_claim(execution_id, claim, key, *at_ms).map(Some))
            }
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
            Command::SandboxVanished { computer_id, at_ms, reason } => {
                self.sandbox_vanished(computer_id, reason.as_deref(), *at_ms)
            }
            Command::NodeSpeaks { node_id, version } => {
                self.node_speaks(*node_id, *version);
                Ok(())
            }
            #[cfg(feature = "upgrade-probe")]
            Command::UpgradeProbe { note } => {
                let at = self.clock;
                self.push_event(at, "UpgradeProbe", "", None, serde_json::json!({"note": note}));
                Ok(())
            }
            Command::Restore { cluster_id, state_json, join_secret_hash } => {
                self.restore(cluster_id, state_json, join_secret_hash)
            }
            Command::SandboxPausedByProvider { computer_id, provider_state, at_ms } => {
                self.sandbox_paused_by_provider(computer_id, provider_state, *at_ms)
            }
            Command::BindingSettle { binding_id, ready, tools, error, shared_uid } => {
                self.binding_settle(binding_id, *ready, tools, error.as_ref(), *shared_uid)
            }
            Command::BindingRevoke { by, binding_id } => self.binding_revoke(by, binding_id),
            Command::OperationFinish { key, result, held } => {
                self.operation_finish(key, result.as_ref(), held.as_ref())
            }
            Command::SwitchSettle { key, receipt, ok, generation } => {
                self.switch_settle(key, receipt, *ok, *generation)
            }
            Command::SwitchHold { key, note, generation } => self.switch_hold(key, note, *generation),
            Command::BindingDrained { binding_id } => self.binding_drained(binding_id),
            Command::ReportActivity { marks } => {
                self.report_activity(marks);
                Ok(())
            }
            Command::ReportWork { ages } => {
                self.report_work(ages);
                Ok(())
            }
            Command::WorkNow { computer_id } => self.work_now(computer_id),
            Command::SessionEnded { computer_id, generation, session_id, owner, exit_code, signal, at_ms } => {
                self.session_ended(computer_id, *generation, session_id, owner, *exit_code, signal.as_deref(), *at_ms)
            }
            Command::SubmitExecution(_)
            | Command::Acquire { .. }
            | Command::ExposePort { .. }
            | Command::RedeemPairing { .. }
            | Command::PlanPause { .. }
            | Command::BindingReserve { .. }
            | Command::OperationBegin { .. }
            | Command::SwitchReserve { .. }
            | Command::ActionPrepare { .. }
            | Command::RunStart { .. }
            | Command::RunClaim { .. }
            | Command::RunEvent { .. }
            | Command::PoolClaim { .. }
            | Command::LinkUp { .. } => Err(Reject::new(RejectKind::Invalid, "handled in apply")),
            Command::ActionDispatch { key, claim, at_ms, deadline_ms } => {
                self.action_dispatch(key, claim, *at_ms, *deadline_ms)
            }
            Command::ActionRefuse { key, claim, error, at_ms } => self.action_refuse(key, claim, error, *at_ms),
            Command::ActionLapse { key, at_ms } => self.action_lapse(key, *at_ms),
            Command::ActionFinish { key, claim, state, result, error, at_ms } => {
                self.action_finish(key, claim, *state, result.as_ref(), error.as_deref(), *at_ms)
            }
            Command::BlobPut { by, blob } => self.blob_put(by, blob),
            Command::RunRenew { by, run_id, claim, lease_ms } => self.run_renew(by, run_id, claim, *lease_ms),
            Command::RunFinish { by, run_id, claim, succeeded, result, error } => {
                self.run_finish(by, run_id, claim, *succeeded, result.as_ref(), error.as_deref())
            }
            Command::RunCancel { by, run_id } => self.run_cancel(by, run_id),
            Command::RunDecide { by, run_id, requeue } => self.run_decide(by, run_id, *requeue),
            Command::RunsTick => Ok(()),
            Command::ActionEvidence { by, key, blob_id, at_ms } => self.action_evidence(by, key, blob_id, *at_ms),
            Command::ArtifactPut { by, artifact } => self.artifact_put(by, artifact),
            Command::SetBlobLimits { by, limits } => self.set_blob_limits(by, limits),
            Command::ActionRelease { key, claim, error } => self.action_release(key, claim, error),
            Command::ActionDecide { by, key, done, at_ms } => self.action_decide(by, key, *done, *at_ms),
            Command::CreateProvider { by, provider } => self.create_provider(by, provider),
            Command::DesktopStatus { computer_id, generation, desktop } => {
                self.desktop_status(computer_id, *generation, desktop)
            }
            Command::DesktopLease { computer_id, generation, holder, at_ms } => {
                self.desktop_lease(computer_id, *generation, holder.as_deref(), *at_ms)
            }
            Command::UnexposePort { by, computer_id, port, at_ms } => {
                self.unexpose_port(by, computer_id, *port, *at_ms)
            }
            Command::ClaimExecution { execution_id, claim, node, at_ms } => {
                self.claim(execution_id, claim, *node, *at_ms)
            }
            Command::SetLiveNodes { nodes } => self.set_live_nodes(nodes),
            Command::SetJoinSecret { by, hash } => self.set_join_secret(by, hash),
            Command::MintJoinToken { by, hash, node_id, expires_at_ms, at_ms } => {
                self.mint_join_token(by, hash, *node_id, *expires_at_ms, *at_ms)
            }
            Command::RedeemJoinToken { hash, node_id, at_ms } => self.redeem_join_token(hash, *node_id, *at_ms),
            Command::RevokeNode { by, node_id, before_secs } => self.revoke_node(by, *node_id, *before_secs),
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
            Command::SetEgress { by, computer_id, policy, revision, at_ms } => {
                self.set_egress(by, computer_id, policy.as_ref(), *revision, *at_ms)
            }
            Command::PoolAdd { entry } => self.pool_add(entry),
            Command::PoolReady { pool_id, token_hash, at_ms } => self.pool_ready(pool_id, token_hash, *at_ms),
            Command::PoolRemove { pool_id } => self.pool_remove(pool_id),
            Command::EgressDenied { computer_id, count, sample, through_ms, at_ms } => {
                self.egress_denied(computer_id, *count, sample, *through_ms, *at_ms)
            }
            Command::RequestEgress { by, computer_id, policy, approval_id, reason, at_ms } => {
                self.request_egress(by, computer_id, policy, approval_id, reason.as_deref(), *at_ms)
            }
            Command::PutGrant { by, computer_id, bot_id, at_ms, allow_root, paths, desktop_control, secrets } => {
                let change = super::access::GrantChange {
                    allow_root: *allow_root,
                    paths: paths.as_deref(),
                    desktop_control: *desktop_control,
                    secrets: secrets.as_deref(),
                };
                self.put_grant(by, computer_id, bot_id, *at_ms, change)
            }
            Command::DeleteGrant { by, computer_id, bot_id } => self.delete_grant(by, computer_id, bot_id),
            Command::PutSecret { by, name, kind, origins, sealed, at_ms } => {
                self.put_secret(by, name, *kind, origins, sealed, *at_ms)
            }
            Command::DeleteSecret { by, name } => self.delete_secret(by, name),
            Command::TouchSecret { owner, name, at_ms } => self.touch_secret(owner, name, *at_ms),
            Command::DecideApproval { by, approval_id, approve, at_ms } => {
                self.decide_approval(by, approval_id, *approve, *at_ms)
            }
            Command::SetRules { by, rules } => self.set_rules(by, rules),
            Command::SetRetention { by, ms } => self.set_retention(by, *ms),
            Command::SetLimits { by, limits } => self.set_limits(by, limits),
            Command::Bootstrap { cluster_id, org, owner, token, join_secret_hash } => {
                self.bootstrap(cluster_id, org, owner, token)?;
                if let Some(hash) = join_secret_hash
                    && self.join.secret_hash.is_none()
                {
                    self.join.secret_hash = Some(hash.clone());
                }
                Ok(())
            }
            Command::CreateMember { by, member } => self.create_member(by, member),
            Command::CreateBot { by, bot, parent } => self.create_bot(by, bot, parent.as_deref()),
            Command::Delegate { by, delegation } => self.delegate(by, delegation),
            Command::EndDelegation { by, delegation_id } => self.end_delegation(by, delegation_id),
            Command::ArchiveBot { by, bot_id, at_ms } => self.archive_bot(by, bot_id, *at_ms),
            Command::CreateToken { by, token } => self.create_token(by, token),
            Command::RevokeToken { by, token_id, at_ms } => self.revoke_token(by, token_id, *at_ms),
        }
    }
}
