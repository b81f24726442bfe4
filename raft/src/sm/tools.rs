//! MCP tool bindings and their operation journal, in the store (SPEC §6): admission lives here
//! (a binding is callable only while `ready`; revoke closes it here first, before the agent is
//! told), and every call is journaled by its operation id: the same id with the same payload
//! answers the original result (or says it is still unknown, never redoing it); the same id with
//! another payload is refused.

use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;

use super::identity::Bot;
use super::identity::Role;
use super::response::Reject;
use super::response::RejectKind;
use super::state::Caller;
use super::state::State;

/// Bindings kept per Computer (revoked ones do not count).
pub const MAX_BINDINGS: usize = 64;

/// Where a binding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BindingState {
    /// Recorded; the agent is installing it.
    Installing,
    /// Callable.
    Ready,
    /// The install was refused.
    Failed,
    /// Taking part in a version switch: closed to new calls until it ends.
    Switching,
    /// Closed for good; its id never regains rights.
    Revoked,
}

/// A package bound for a bot on a Computer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolBinding {
    /// `mcb_…`
    pub id: String,
    /// The bot.
    pub bot_id: String,
    /// The Computer it runs on.
    pub computer_id: String,
    /// The package id.
    pub package_id: String,
    /// Its version.
    pub version: String,
    /// Its archive's SHA-256.
    pub sha256: String,
    /// Where it stands.
    pub state: BindingState,
    /// The MCP tool schemas last discovered.
    pub tools: Value,
    /// Why the install failed, when it did.
    pub error: Option<Value>,
    /// Unix ms.
    pub created_at: u64,
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationState {
    /// Sent (or about to be); no answer recorded.
    Running,
    /// Answered; the result is kept.
    Done,
    /// The answer was lost: the effect is unknown and the call is never redone.
    Unknown,
}

/// One journaled tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Operation {
    /// The caller's operation id.
    pub operation_id: String,
    /// The bot.
    pub bot_id: String,
    /// The binding.
    pub binding_id: String,
    /// SHA-256 of the payload (binding, tool, arguments).
    pub payload_hash: String,
    /// Where it stands.
    pub state: OperationState,
    /// The MCP result, once done.
    pub result: Option<Value>,
    /// Unix ms.
    pub started_at: u64,
}

/// Where a version switch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchState {
    /// Durably reserved; the participants are closed to new calls.
    Reserved,
    /// Committed: version pointer, readiness and schemas in one step.
    Done,
    /// The agent refused it; the participants are open again.
    Failed,
    /// A participant was revoked; every participant is closed.
    Cancelled,
}

/// A version switch of a binding, journaled by operation id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Switch {
    /// The caller's operation id.
    pub operation_id: String,
    /// The bot.
    pub bot_id: String,
    /// The binding that moves (keeps its UID and state).
    pub binding_id: String,
    /// The version it leaves.
    pub from_version: String,
    /// The version it moves to.
    pub to_version: String,
    /// The bot's binding already at the target version, drained and revoked by the switch.
    pub target_binding: Option<String>,
    /// Where it stands.
    pub state: SwitchState,
    /// The receipt once done (version, sha256, tools), or why it failed.
    pub receipt: Option<Value>,
}

/// The journal key of an operation (operation ids are scoped to their bot).
pub fn operation_key(bot_id: &str, operation_id: &str) -> String {
    format!("{bot_id}\n{operation_id}")
}

impl State {
    /// The bot a caller may act for with tools: the bot itself, or a member who owns it (or
    /// administers), with a writable token.
    pub fn tool_bot(&self, caller: &Caller, bot_id: &str) -> Result<Bot, Reject> {
        let bot = self.bots.get(bot_id).filter(|b| b.archived_at.is_none());
        let bot = bot.ok_or_else(|| Reject::new(RejectKind::NotFound, "no such bot"))?;
        let allowed = match &caller.bot {
            Some(b) => b.id == bot.id,
            None => bot.member_id == caller.member.id || caller.member.role >= Role::Admin,
        };
        if !allowed {
            return Err(Reject::new(RejectKind::NotFound, "no such bot"));
        }
        caller.check_writable()?;
        Ok(bot.clone())
    }

    /// Records a binding being installed; the bot must be able to use the Computer.
    pub(crate) fn binding_reserve(&mut self, by: &str, b: &ToolBinding) -> Result<String, Reject> {
        let caller = self.caller_by_token_id(by)?;
        self.tool_bot(&caller, &b.bot_id)?;
        self.check_operate(&caller, &b.computer_id)?;
        if self.tool_bindings.contains_key(&b.id) {
            return Err(Reject::new(RejectKind::Conflict, "binding id collision"));
        }
        let live = self
            .tool_bindings
            .values()
            .filter(|x| x.computer_id == b.computer_id && x.state != BindingState::Revoked)
            .count();
        if live >= MAX_BINDINGS {
            return Err(Reject::new(RejectKind::Conflict, format!("a computer keeps at most {MAX_BINDINGS} bindings")));
        }
        let mut b = b.clone();
        b.state = BindingState::Installing;
        self.tool_bindings.insert(b.id.clone(), b.clone());
        Ok(b.id)
    }

    /// The agent's answer to an install (or a new discovery): ready with tools, or failed.
    pub(crate) fn binding_settle(
        &mut self,
        id: &str,
        ready: bool,
        tools: &Value,
        error: Option<&Value>,
    ) -> Result<(), Reject> {
        let b = self.tool_bindings.get_mut(id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such binding"))?;
        match (b.state, ready) {
            (BindingState::Installing | BindingState::Ready, true) => {
                b.state = BindingState::Ready;
                b.tools = tools.clone();
                Ok(())
            }
            (BindingState::Installing, false) => {
                b.state = BindingState::Failed;
                b.error = error.cloned();
                Ok(())
            }
            _ => Err(Reject::new(RejectKind::Conflict, "the binding is not being installed")),
        }
    }

    /// Closes a binding's admission for good (before the agent drains it). Revoking a
    /// participant of a pending switch cancels the switch and closes every participant.
    pub(crate) fn binding_revoke(&mut self, by: &str, id: &str) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let b = self.tool_bindings.get(id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such binding"))?;
        self.tool_bot(&caller, &b.bot_id)?;
        let mut closing = vec![id.to_string()];
        for sw in self.switches.values_mut() {
            let part = sw.binding_id == id || sw.target_binding.as_deref() == Some(id);
            if sw.state == SwitchState::Reserved && part {
                sw.state = SwitchState::Cancelled;
                closing.push(sw.binding_id.clone());
                closing.extend(sw.target_binding.clone());
            }
        }
        for c in closing {
            if let Some(b) = self.tool_bindings.get_mut(&c) {
                b.state = BindingState::Revoked;
            }
        }
        Ok(())
    }

    /// Reserves a version switch (or finds the one this operation id reserved): the binding and
    /// the bot's binding already at the target close to new calls. Answers the switch's state:
    /// `reserved` (new or still pending: send it to the agent), `done`, `failed` or `cancelled`.
    pub(crate) fn switch_reserve(&mut self, by: &str, sw: &Switch) -> Result<String, Reject> {
        let caller = self.caller_by_token_id(by)?;
        self.tool_bot(&caller, &sw.bot_id)?;
        let key = operation_key(&sw.bot_id, &sw.operation_id);
        if let Some(seen) = self.switches.get(&key) {
            if seen.binding_id != sw.binding_id || seen.to_version != sw.to_version {
                return Err(Reject::new(
                    RejectKind::IdempotencyKeyReused,
                    "this operationId was used with another request",
                ));
            }
            return Ok(match seen.state {
                SwitchState::Reserved => "reserved",
                SwitchState::Done => "done",
                SwitchState::Failed => "failed",
                SwitchState::Cancelled => "cancelled",
            }
            .into());
        }
        let b = self
            .tool_bindings
            .get(&sw.binding_id)
            .filter(|b| b.bot_id == sw.bot_id)
            .ok_or_else(|| Reject::new(RejectKind::NotFound, "no such binding"))?
            .clone();
        if b.state != BindingState::Ready {
            return Err(Reject::new(RejectKind::Conflict, format!("the binding is {:?}", b.state).to_lowercase()));
        }
        if b.version == sw.to_version {
            return Err(Reject::new(RejectKind::Invalid, "the binding is already at that version"));
        }
        self.check_operate(&caller, &b.computer_id)?;
        let target = self
            .tool_bindings
            .values()
            .find(|t| {
                t.id != b.id
                    && t.bot_id == b.bot_id
                    && t.computer_id == b.computer_id
                    && t.package_id == b.package_id
                    && t.version == sw.to_version
                    && matches!(t.state, BindingState::Ready | BindingState::Installing)
            })
            .map(|t| t.id.clone());
        let mut sw = sw.clone();
        sw.from_version = b.version.clone();
        sw.target_binding = target.clone();
        sw.state = SwitchState::Reserved;
        sw.receipt = None;
        for id in std::iter::once(b.id.clone()).chain(target) {
            if let Some(x) = self.tool_bindings.get_mut(&id) {
                x.state = BindingState::Switching;
            }
        }
        self.switches.insert(key, sw);
        Ok("reserved".into())
    }

    /// The agent switched: version pointer, readiness and schemas change together; the target
    /// binding is revoked. Or it refused: the participants open again.
    pub(crate) fn switch_settle(&mut self, key: &str, receipt: &Value, ok: bool) -> Result<(), Reject> {
        let sw = self.switches.get(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such switch"))?.clone();
        if sw.state != SwitchState::Reserved {
            return Err(Reject::new(RejectKind::Conflict, "the switch is not pending"));
        }
        if ok {
            if let Some(b) = self.tool_bindings.get_mut(&sw.binding_id) {
                b.version = sw.to_version.clone();
                if let Some(sha) = receipt["sha256"].as_str() {
                    b.sha256 = sha.to_string();
                }
                b.tools = receipt["tools"].clone();
                b.state = BindingState::Ready;
            }
            if let Some(t) = sw.target_binding.as_ref().and_then(|t| self.tool_bindings.get_mut(t)) {
                t.state = BindingState::Revoked;
            }
        } else {
            for id in std::iter::once(&sw.binding_id).chain(sw.target_binding.as_ref()) {
                if let Some(x) = self.tool_bindings.get_mut(id).filter(|x| x.state == BindingState::Switching) {
                    x.state = BindingState::Ready;
                }
            }
        }
        if let Some(s) = self.switches.get_mut(key) {
            s.state = if ok { SwitchState::Done } else { SwitchState::Failed };
            s.receipt = Some(receipt.clone());
        }
        Ok(())
    }

    /// Journals a call before it is sent. Answers `new`, or for a retry with the same payload
    /// `done` / `running` / `unknown`; another payload under the same id is refused.
    pub(crate) fn operation_begin(&mut self, by: &str, op: &Operation) -> Result<String, Reject> {
        let caller = self.caller_by_token_id(by)?;
        self.tool_bot(&caller, &op.bot_id)?;
        let key = operation_key(&op.bot_id, &op.operation_id);
        if let Some(seen) = self.operations.get(&key) {
            if seen.payload_hash != op.payload_hash {
                return Err(Reject::new(
                    RejectKind::IdempotencyKeyReused,
                    "this operationId was used with another request",
                ));
            }
            let s = match seen.state {
                OperationState::Done => "done",
                OperationState::Running => "running",
                OperationState::Unknown => "unknown",
            };
            return Ok(s.into());
        }
        let b = self
            .tool_bindings
            .get(&op.binding_id)
            .filter(|b| b.bot_id == op.bot_id)
            .ok_or_else(|| Reject::new(RejectKind::NotFound, "no such binding"))?;
        if b.state != BindingState::Ready {
            return Err(Reject::new(RejectKind::Forbidden, format!("the binding is {:?}: not callable", b.state)));
        }
        self.check_operate(&caller, &b.computer_id)?;
        let mut op = op.clone();
        op.state = OperationState::Running;
        op.result = None;
        self.operations.insert(key, op);
        Ok("new".into())
    }

    /// Records a call's answer, or that it was lost.
    pub(crate) fn operation_finish(&mut self, key: &str, result: Option<&Value>) -> Result<(), Reject> {
        let op = self.operations.get_mut(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such operation"))?;
        if op.state != OperationState::Running {
            return Err(Reject::new(RejectKind::Conflict, "the operation already ended"));
        }
        match result {
            Some(r) => {
                op.state = OperationState::Done;
                op.result = Some(r.clone());
            }
            None => op.state = OperationState::Unknown,
        }
        Ok(())
    }
}
