//! MCP tool bindings and their operation journal, in the store (SPEC §6): admission lives here
//! (a binding is callable only while `ready`; revoke closes it here first, before the agent is
//! told), and every call is journaled by its operation id: the same id with the same payload
//! answers the original result (or says it is still unknown, never redoing it); the same id with
//! another payload is refused.
//!
//! Rights are those of the bot on the Computer, checked at every step: the caller may act for
//! the bot, its token allows the Computer and writes, it may operate the Computer, and the bot
//! holds a grant on it ([`State::check_tool_use`]). Removing the grant, archiving the bot or
//! deleting the Computer closes the bot's bindings there in the same commit. Bindings are
//! indexed per bot and Computer ([`BindingIndex`]); a failed install leaves no record; revoked
//! ones free their slot and are kept as tombstones (at most [`MAX_REVOKED`] per Computer, oldest
//! dropped first) for the reauthorize rule.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use computerd_proto::mcp::McpRequest;
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
/// Revoked bindings kept per Computer as tombstones (oldest dropped first).
pub const MAX_REVOKED: usize = 64;

/// The bindings by bot and Computer, by Computer, and the pending switch of each participant:
/// what apply looks up instead of scanning every binding or switch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindingIndex {
    /// bot id -> computer id -> binding ids.
    pub by_bot: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// computer id -> binding ids.
    pub by_computer: BTreeMap<String, BTreeSet<String>>,
    /// binding id -> the key of the reserved switch it takes part in.
    pub pending_switch: BTreeMap<String, String>,
    /// computer id -> its revoked bindings (tombstones) as (created at, id), oldest first: the
    /// ones trimmed past [`MAX_REVOKED`] are found without reading the Computer's bindings.
    #[serde(default)]
    pub revoked: BTreeMap<String, BTreeSet<(u64, String)>>,
    /// (bot, Computer, install key) -> the live binding it made: a retried install answers it.
    #[serde(default)]
    pub installs: BTreeMap<String, String>,
}

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
    /// It runs under the agent's own UID (a non-root agent whose owner chose shared-UID
    /// bindings), not one of its own: shown in every listing. Once set, never unset.
    #[serde(default)]
    pub shared_uid: bool,
    /// What makes a retried install the same install: `op:<operationId>`, or
    /// `pkg:<package>\n<version>\n<sha256>` when the caller named none.
    #[serde(default)]
    pub install_key: Option<String>,
    /// The SHA-256 of an install's request under an `operationId` (another body under the same
    /// id is refused).
    #[serde(default)]
    pub request_hash: Option<String>,
}

/// The install index's key of a binding: its bot, its Computer and its install key.
fn install_slot(b: &ToolBinding) -> Option<String> {
    b.install_key.as_ref().map(|k| format!("{}\n{}\n{k}", b.bot_id, b.computer_id))
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
    /// The answer, once done, when it is small and the node's own (a refusal before the
    /// agent); an agent's answer stays on the Computer ([`Operation::held`]). Older entries
    /// carry every answer here.
    pub result: Option<Value>,
    /// Unix ms.
    pub started_at: u64,
    /// The agent's answer, kept on the Computer under the call's journal name: its digest
    /// and size, to check a replay's bytes against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<HeldResult>,
}

/// A tool call's answer kept by the agent, as the journal knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldResult {
    /// Hex SHA-256 of the answer's JSON (`{"ok": …}` or `{"error": …}`, as serde_json writes it).
    pub sha256: String,
    /// Its length in bytes.
    pub size: u64,
}

/// The largest result a node puts in the journal itself (a refusal of its own); an agent's
/// answer, of any size, stays on the Computer. (Apply does not refuse larger ones: entries of
/// older nodes carry whole answers and must apply as they did.)
pub const MAX_INLINE_RESULT: usize = 4096;

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
    /// A participant was revoked; every participant is closed, and their runtimes are being
    /// drained: it ends (`cancelled`) once each one's runtime is confirmed stopped.
    Cancelling,
    /// Cancelled, and every participant's runtime confirmed stopped (or the Computer gone).
    Cancelled,
}

impl SwitchState {
    /// The name the API answers.
    pub fn name(self) -> &'static str {
        match self {
            SwitchState::Reserved => "reserved",
            SwitchState::Done => "done",
            SwitchState::Failed => "failed",
            SwitchState::Cancelling => "cancelling",
            SwitchState::Cancelled => "cancelled",
        }
    }
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
    /// When it was asked for, unix ms (its retention counts from then; 0 in records from
    /// before it was kept, which are never compacted).
    #[serde(default)]
    pub reserved_at: u64,
    /// The Computer's link generation the switch was last sent under (set by the store at the
    /// reserve, and moved on by an answer of a later link): an answer sent under an older link
    /// is not believed, and the agent of the newer one decides again from its receipt.
    #[serde(default)]
    pub generation: u64,
    /// While cancelling: the participants whose runtime is confirmed stopped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drained: Vec<String>,
    /// While reserved: the agent's last answer that left it pending (it switched, but discovery
    /// failed; or the binding is in neither state a switch may go on from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<Value>,
}

impl Switch {
    /// The bindings that take part: the one that moves, and the bot's binding already at the
    /// target, if any.
    pub fn participants(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.binding_id).chain(self.target_binding.as_ref())
    }

    /// While cancelling: the participants whose runtime is not confirmed stopped yet.
    pub fn undrained(&self) -> Vec<String> {
        self.participants().filter(|id| !self.drained.contains(id)).cloned().collect()
    }
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

    /// May `caller` use the tools of `bot_id` on this Computer: it acts for the bot
    /// ([`State::tool_bot`]), may operate the Computer (its token's `computers` limit and
    /// read-only flag included), and the bot holds a grant on it.
    pub fn check_tool_use(&self, caller: &Caller, bot_id: &str, computer_id: &str) -> Result<Bot, Reject> {
        let bot = self.tool_bot(caller, bot_id)?;
        self.check_operate(caller, computer_id)?;
        if !self.has_grant(computer_id, bot_id) {
            return Err(Reject::new(RejectKind::Forbidden, "this bot has no right to use this computer"));
        }
        Ok(bot)
    }

    /// The bot's bindings on a Computer, from the index.
    pub fn bindings_of(&self, bot_id: &str, computer_id: &str) -> impl Iterator<Item = &ToolBinding> {
        let ids = self.binding_index.by_bot.get(bot_id).and_then(|c| c.get(computer_id));
        ids.into_iter().flatten().filter_map(|id| self.tool_bindings.get(id))
    }

    /// The bot's bindings on every Computer, from the index.
    pub fn bindings_of_bot(&self, bot_id: &str) -> impl Iterator<Item = &ToolBinding> {
        let ids = self.binding_index.by_bot.get(bot_id).into_iter().flat_map(|c| c.values().flatten());
        ids.filter_map(|id| self.tool_bindings.get(id))
    }

    /// The bindings on a Computer, from the index.
    pub fn bindings_on(&self, computer_id: &str) -> impl Iterator<Item = &ToolBinding> {
        let ids = self.binding_index.by_computer.get(computer_id);
        ids.into_iter().flatten().filter_map(|id| self.tool_bindings.get(id))
    }

    /// May an MCP request for `computer_id`'s agent be sent, by `caller`, now? Checked by the
    /// node that serves the call and again by the node holding the link, each at a current read:
    /// install needs the binding `installing`, discover and call `ready`, switch `switching`,
    /// with the rights of [`State::check_tool_use`]; a drain (revoke) is sent only for a binding
    /// the store already closed (or no longer has), whoever asks.
    pub fn check_tool_request(
        &self,
        caller: Option<&Caller>,
        computer_id: &str,
        request: &McpRequest,
    ) -> Result<(), Reject> {
        let (id, want) = match request {
            McpRequest::Install { binding_id, .. } => (binding_id, BindingState::Installing),
            McpRequest::Discover { binding_id } | McpRequest::Call { binding_id, .. } => {
                (binding_id, BindingState::Ready)
            }
            // A replay reads a kept answer: the caller's rights on the binding's Computer, in
            // whatever state the binding is now.
            McpRequest::Result { binding_id, .. } => {
                let b = self.tool_bindings.get(binding_id).filter(|b| b.computer_id == computer_id);
                let b = b.ok_or_else(|| Reject::new(RejectKind::NotFound, "no such binding"))?;
                let caller = caller.ok_or_else(|| Reject::new(RejectKind::Unauthorized, "the token is not valid"))?;
                self.check_tool_use(caller, &b.bot_id, computer_id)?;
                return Ok(());
            }
            McpRequest::Switch { binding_id, .. } => (binding_id, BindingState::Switching),
            McpRequest::Revoke { binding_id } => {
                return match self.tool_bindings.get(binding_id).filter(|b| b.computer_id == computer_id) {
                    Some(b) if b.state != BindingState::Revoked => Err(Reject::new(
                        RejectKind::Conflict,
                        "the binding is not closed in the store: revoke it there first",
                    )),
                    _ => Ok(()),
                };
            }
        };
        let b = self.tool_bindings.get(id).filter(|b| b.computer_id == computer_id);
        let b = b.ok_or_else(|| Reject::new(RejectKind::NotFound, "no such binding"))?;
        if let McpRequest::Install { bot_id, .. } = request
            && *bot_id != b.bot_id
        {
            return Err(Reject::new(RejectKind::NotFound, "no such binding"));
        }
        let caller = caller.ok_or_else(|| Reject::new(RejectKind::Unauthorized, "the token is not valid"))?;
        self.check_tool_use(caller, &b.bot_id, computer_id)?;
        if b.state != want {
            return Err(Reject::new(
                RejectKind::Forbidden,
                format!("the binding is {:?}: not callable", b.state).to_lowercase(),
            ));
        }
        Ok(())
    }

    /// Rebuilds [`BindingIndex`] from the records (a snapshot from before it was kept).
    pub fn reindex_tools(&mut self) {
        let mut index = BindingIndex::default();
        for b in self.tool_bindings.values() {
            index_insert(&mut index, b);
        }
        for (key, sw) in &self.switches {
            let ids = match sw.state {
                SwitchState::Reserved => sw.participants().cloned().collect(),
                SwitchState::Cancelling => sw.undrained(),
                _ => Vec::new(),
            };
            for id in ids {
                index.pending_switch.insert(id, key.clone());
            }
        }
        self.binding_index = index;
    }

    fn insert_binding(&mut self, b: ToolBinding) {
        index_insert(&mut self.binding_index, &b);
        self.tool_bindings.insert(b.id.clone(), b);
    }

    fn remove_binding(&mut self, id: &str) {
        let Some(b) = self.tool_bindings.remove(id) else { return };
        let index = &mut self.binding_index;
        if let Some(computers) = index.by_bot.get_mut(&b.bot_id) {
            if let Some(ids) = computers.get_mut(&b.computer_id) {
                ids.remove(id);
                if ids.is_empty() {
                    computers.remove(&b.computer_id);
                }
            }
            if computers.is_empty() {
                index.by_bot.remove(&b.bot_id);
            }
        }
        if let Some(ids) = index.by_computer.get_mut(&b.computer_id) {
            ids.remove(id);
            if ids.is_empty() {
                index.by_computer.remove(&b.computer_id);
            }
        }
        if let Some(tombs) = index.revoked.get_mut(&b.computer_id) {
            tombs.remove(&(b.created_at, b.id.clone()));
            if tombs.is_empty() {
                index.revoked.remove(&b.computer_id);
            }
        }
        let pending = index.pending_switch.remove(id);
        if let Some(slot) = install_slot(&b)
            && index.installs.get(&slot).is_some_and(|x| x == id)
        {
            index.installs.remove(&slot);
        }
        // A cancelling switch's participant whose tombstone goes: its drain can no longer be
        // confirmed, so it stops holding the switch (which keeps the record of it).
        if let Some(key) = pending {
            self.participant_gone(&key, id, false);
        }
    }

    /// A participant of a cancelling switch is confirmed drained (`drained`), or is gone from
    /// the store unconfirmed: once none is left waiting, the switch is cancelled.
    fn participant_gone(&mut self, key: &str, id: &str, drained: bool) {
        let Some(sw) = self.switches.get_mut(key).filter(|sw| sw.state == SwitchState::Cancelling) else { return };
        if drained {
            if !sw.drained.iter().any(|d| d == id) {
                sw.drained.push(id.to_string());
            }
        } else {
            let note = sw.note.get_or_insert_with(|| serde_json::json!({}));
            if let Some(list) = note.as_object_mut() {
                let gone = list.entry("unconfirmed").or_insert_with(|| serde_json::json!([]));
                if let Some(a) = gone.as_array_mut() {
                    a.push(serde_json::json!(id));
                }
            }
        }
        let index = &self.binding_index.pending_switch;
        let waiting = sw.participants().any(|p| p != id && index.get(p).is_some_and(|k| k == key));
        if !waiting {
            sw.state = SwitchState::Cancelled;
        }
    }

    /// A closed binding's runtime is confirmed stopped on its agent: if it took part in a
    /// cancelling switch, that participant is drained (the switch ends once all are).
    pub(crate) fn binding_drained(&mut self, id: &str) -> Result<(), Reject> {
        if let Some(key) = self.binding_index.pending_switch.get(id).cloned()
            && self.switches.get(&key).is_some_and(|sw| sw.state == SwitchState::Cancelling)
        {
            self.binding_index.pending_switch.remove(id);
            self.participant_gone(&key, id, true);
        }
        Ok(())
    }

    /// The participants of the cancelling switch `id` takes part in that are not confirmed
    /// drained yet (empty when it takes part in none).
    pub fn cancelling_with(&self, id: &str) -> Vec<String> {
        self.binding_index
            .pending_switch
            .get(id)
            .and_then(|key| self.switches.get(key))
            .filter(|sw| sw.state == SwitchState::Cancelling)
            .map(Switch::undrained)
            .unwrap_or_default()
    }

    /// Records a binding being installed; the bot must be able to use the Computer. An install
    /// whose key names a live binding answers that binding (a retry after a lost answer, or
    /// the same package again), and makes none; under an `operationId` with another request,
    /// it is refused.
    pub(crate) fn binding_reserve(&mut self, by: &str, b: &ToolBinding) -> Result<String, Reject> {
        let caller = self.caller_by_token_id(by)?;
        self.check_tool_use(&caller, &b.bot_id, &b.computer_id)?;
        if self.tool_bindings.contains_key(&b.id) {
            return Err(Reject::new(RejectKind::Conflict, "binding id collision"));
        }
        if let Some(slot) = install_slot(b)
            && let Some(seen) = self.binding_index.installs.get(&slot).and_then(|id| self.tool_bindings.get(id))
            && seen.state != BindingState::Revoked
            // Keyed by its package, a binding switched to another version is another install.
            && (b.request_hash.is_some() || (seen.version == b.version && seen.sha256 == b.sha256))
        {
            if seen.request_hash != b.request_hash {
                return Err(Reject::new(
                    RejectKind::IdempotencyKeyReused,
                    "this operationId was used for another install: use a new one",
                ));
            }
            return Ok(seen.id.clone());
        }
        let live = self.bindings_on(&b.computer_id).filter(|x| x.state != BindingState::Revoked).count();
        if live >= MAX_BINDINGS {
            return Err(Reject::new(RejectKind::Conflict, format!("a computer keeps at most {MAX_BINDINGS} bindings")));
        }
        let mut b = b.clone();
        b.state = BindingState::Installing;
        let id = b.id.clone();
        self.insert_binding(b);
        Ok(id)
    }

    /// The agent's answer to an install (or a new discovery): ready with tools; or the install
    /// failed, and the binding is removed (a failed install leaves no binding).
    pub(crate) fn binding_settle(
        &mut self,
        id: &str,
        ready: bool,
        tools: &Value,
        _error: Option<&Value>,
        shared_uid: bool,
    ) -> Result<(), Reject> {
        let b = self.tool_bindings.get_mut(id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such binding"))?;
        b.shared_uid |= shared_uid;
        match (b.state, ready) {
            (BindingState::Installing | BindingState::Ready, true) => {
                b.state = BindingState::Ready;
                b.tools = tools.clone();
                Ok(())
            }
            (BindingState::Installing, false) => {
                self.remove_binding(id);
                Ok(())
            }
            _ => Err(Reject::new(RejectKind::Conflict, "the binding is not being installed")),
        }
    }

    /// Closes a binding's admission for good (before the agent drains it), for a caller who may
    /// act for its bot and operate its Computer (a revoke only takes rights away, so the bot's
    /// grant is not needed: its bindings may still be closed after the grant ended).
    pub(crate) fn binding_revoke(&mut self, by: &str, id: &str) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        let b = self.tool_bindings.get(id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such binding"))?;
        self.tool_bot(&caller, &b.bot_id)?;
        self.check_operate(&caller, &b.computer_id.clone())?;
        self.close_binding(id);
        Ok(())
    }

    /// Closes a binding for good. Closing a participant of a pending switch cancels the switch
    /// and closes every participant; the switch stays `cancelling` (each participant indexed to
    /// it) until every participant's runtime is confirmed drained. The Computer keeps at most
    /// [`MAX_REVOKED`] tombstones.
    fn close_binding(&mut self, id: &str) {
        let mut closing = vec![id.to_string()];
        let mut cancelling = false;
        if let Some(key) = self.binding_index.pending_switch.get(id).cloned()
            && let Some(sw) = self.switches.get_mut(&key)
        {
            if sw.state == SwitchState::Reserved {
                sw.state = SwitchState::Cancelling;
                sw.drained.clear();
                closing.extend(sw.participants().cloned());
            }
            cancelling = sw.state == SwitchState::Cancelling;
        }
        let mut computers = BTreeSet::new();
        for c in closing {
            if !cancelling {
                self.binding_index.pending_switch.remove(&c);
            }
            if let Some(b) = self.tool_bindings.get_mut(&c) {
                b.state = BindingState::Revoked;
                computers.insert(b.computer_id.clone());
                if let Some(slot) = install_slot(b)
                    && self.binding_index.installs.get(&slot).is_some_and(|x| *x == b.id)
                {
                    self.binding_index.installs.remove(&slot);
                }
                let tombs = self.binding_index.revoked.entry(b.computer_id.clone()).or_default();
                tombs.insert((b.created_at, b.id.clone()));
            }
        }
        for computer in computers {
            self.trim_tombstones(&computer);
        }
    }

    /// Removes the Computer's oldest tombstones past [`MAX_REVOKED`]: O(log n) each.
    fn trim_tombstones(&mut self, computer_id: &str) {
        while let Some(tombs) = self.binding_index.revoked.get(computer_id)
            && tombs.len() > MAX_REVOKED
            && let Some((_, id)) = tombs.first().cloned()
        {
            self.remove_binding(&id);
        }
    }

    /// The bot's grant on the Computer ended: its bindings there close in the same commit.
    pub(crate) fn close_bot_bindings(&mut self, computer_id: &str, bot_id: &str) {
        let live: Vec<String> = self
            .bindings_of(bot_id, computer_id)
            .filter(|b| b.state != BindingState::Revoked)
            .map(|b| b.id.clone())
            .collect();
        for id in live {
            self.close_binding(&id);
        }
    }

    /// The bot was archived: its bindings everywhere close.
    pub(crate) fn close_all_bot_bindings(&mut self, bot_id: &str) {
        let live: Vec<String> =
            self.bindings_of_bot(bot_id).filter(|b| b.state != BindingState::Revoked).map(|b| b.id.clone()).collect();
        for id in live {
            self.close_binding(&id);
        }
    }

    /// The Computer was deleted: its bindings go with it.
    pub(crate) fn drop_computer_bindings(&mut self, computer_id: &str) {
        let ids: Vec<String> = self.bindings_on(computer_id).map(|b| b.id.clone()).collect();
        for id in ids {
            if let Some(key) = self.binding_index.pending_switch.get(&id).cloned()
                && let Some(sw) = self.switches.get_mut(&key)
                && matches!(sw.state, SwitchState::Reserved | SwitchState::Cancelling)
            {
                // Nothing of the Computer runs any more: there is nothing left to drain.
                sw.state = SwitchState::Cancelled;
            }
            self.remove_binding(&id);
        }
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
            if let Some(b) = self.tool_bindings.get(&seen.binding_id) {
                self.check_tool_use(&caller, &sw.bot_id, &b.computer_id)?;
            }
            return Ok(seen.state.name().into());
        }
        let b = self
            .tool_bindings
            .get(&sw.binding_id)
            .filter(|b| b.bot_id == sw.bot_id)
            .ok_or_else(|| Reject::new(RejectKind::NotFound, "no such binding"))?
            .clone();
        self.check_tool_use(&caller, &sw.bot_id, &b.computer_id)?;
        if b.state != BindingState::Ready {
            return Err(Reject::new(RejectKind::Conflict, format!("the binding is {:?}", b.state).to_lowercase()));
        }
        if b.version == sw.to_version {
            return Err(Reject::new(RejectKind::Invalid, "the binding is already at that version"));
        }
        let target = self
            .bindings_of(&b.bot_id, &b.computer_id)
            .find(|t| {
                t.id != b.id
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
        sw.generation = self.computers.get(&b.computer_id).map_or(0, |c| c.link_generation);
        sw.drained.clear();
        sw.note = None;
        for id in std::iter::once(b.id.clone()).chain(target) {
            if let Some(x) = self.tool_bindings.get_mut(&id) {
                x.state = BindingState::Switching;
            }
            self.binding_index.pending_switch.insert(id, key.clone());
        }
        if sw.reserved_at > 0 {
            self.exec_index.switches.insert((sw.reserved_at, key.clone()));
        }
        self.switches.insert(key, sw);
        Ok("reserved".into())
    }

    /// The agent switched: version pointer, readiness and schemas change together; the target
    /// binding is revoked (the node drains it next). Or it said that it did not, and the
    /// binding is still at the source: the participants open again. `generation` is the
    /// Computer's link generation the answer came under (`None` in entries of older nodes):
    /// an answer of a link that has since been replaced is refused, and the switch stays
    /// pending for the agent of the current link to decide from its receipt.
    pub(crate) fn switch_settle(
        &mut self,
        key: &str,
        receipt: &Value,
        ok: bool,
        generation: Option<u64>,
    ) -> Result<(), Reject> {
        let sw = self.pending_switch_under(key, generation)?;
        for id in std::iter::once(&sw.binding_id).chain(sw.target_binding.as_ref()) {
            self.binding_index.pending_switch.remove(id);
        }
        if let Some(s) = self.switches.get_mut(key) {
            s.state = if ok { SwitchState::Done } else { SwitchState::Failed };
            s.receipt = Some(receipt.clone());
            s.generation = generation.unwrap_or(s.generation);
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
            if let Some(t) = &sw.target_binding {
                self.close_binding(t);
            }
        } else {
            for id in std::iter::once(&sw.binding_id).chain(sw.target_binding.as_ref()) {
                if let Some(x) = self.tool_bindings.get_mut(id).filter(|x| x.state == BindingState::Switching) {
                    x.state = BindingState::Ready;
                }
            }
        }
        Ok(())
    }

    /// The agent's answer leaves the switch pending (it switched but discovery failed, or the
    /// binding is in neither state a switch may go on from): the switch stays reserved, with
    /// the answer as its note and the answer's link generation as its own.
    pub(crate) fn switch_hold(&mut self, key: &str, note: &Value, generation: u64) -> Result<(), Reject> {
        self.pending_switch_under(key, Some(generation))?;
        if let Some(s) = self.switches.get_mut(key) {
            s.note = Some(note.clone());
            s.generation = generation;
        }
        Ok(())
    }

    /// The reserved switch `key`, if an answer under link `generation` may still settle it.
    fn pending_switch_under(&self, key: &str, generation: Option<u64>) -> Result<Switch, Reject> {
        let sw = self.switches.get(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such switch"))?;
        if sw.state != SwitchState::Reserved {
            return Err(Reject::new(RejectKind::Conflict, format!("the switch is {}, not pending", sw.state.name())));
        }
        if let Some(g) = generation {
            let computer = self.tool_bindings.get(&sw.binding_id).map(|b| b.computer_id.as_str());
            let now = computer.and_then(|c| self.computers.get(c)).map_or(0, |c| c.link_generation);
            if g != now {
                return Err(Reject::new(
                    RejectKind::Conflict,
                    "the Computer's agent link changed while the switch was sent: send the same operationId again",
                ));
            }
        }
        Ok(sw.clone())
    }

    /// Journals a call before it is sent. Answers `new`, or for a retry with the same payload
    /// `done` / `running` / `unknown`; another payload under the same id is refused. The
    /// caller's rights on the binding's Computer are checked first, for a retry too.
    pub(crate) fn operation_begin(&mut self, by: &str, op: &Operation) -> Result<String, Reject> {
        let caller = self.caller_by_token_id(by)?;
        self.tool_bot(&caller, &op.bot_id)?;
        let b = self
            .tool_bindings
            .get(&op.binding_id)
            .filter(|b| b.bot_id == op.bot_id)
            .ok_or_else(|| Reject::new(RejectKind::NotFound, "no such binding"))?;
        self.check_tool_use(&caller, &op.bot_id, &b.computer_id)?;
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
        if b.state != BindingState::Ready {
            return Err(Reject::new(RejectKind::Forbidden, format!("the binding is {:?}: not callable", b.state)));
        }
        let mut op = op.clone();
        op.state = OperationState::Running;
        op.result = None;
        op.held = None;
        self.exec_index.operations.insert((op.started_at, key.clone()));
        self.operations.insert(key, op);
        Ok("new".into())
    }

    /// Records a call's answer (held by the agent, or a small one of the node's own), or that
    /// it was lost.
    pub(crate) fn operation_finish(
        &mut self,
        key: &str,
        result: Option<&Value>,
        held: Option<&HeldResult>,
    ) -> Result<(), Reject> {
        let op = self.operations.get_mut(key).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such operation"))?;
        if op.state != OperationState::Running {
            return Err(Reject::new(RejectKind::Conflict, "the operation already ended"));
        }
        match (result, held) {
            (_, Some(h)) => {
                op.state = OperationState::Done;
                op.held = Some(h.clone());
            }
            (Some(r), None) => {
                op.state = OperationState::Done;
                op.result = Some(r.clone());
            }
            (None, None) => op.state = OperationState::Unknown,
        }
        Ok(())
    }
}

fn index_insert(index: &mut BindingIndex, b: &ToolBinding) {
    index.by_bot.entry(b.bot_id.clone()).or_default().entry(b.computer_id.clone()).or_default().insert(b.id.clone());
    index.by_computer.entry(b.computer_id.clone()).or_default().insert(b.id.clone());
    if b.state == BindingState::Revoked {
        index.revoked.entry(b.computer_id.clone()).or_default().insert((b.created_at, b.id.clone()));
    } else if let Some(slot) = install_slot(b) {
        index.installs.insert(slot, b.id.clone());
    }
}

#[cfg(test)]
mod tests;
