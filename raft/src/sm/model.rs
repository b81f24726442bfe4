//! Records of the Computers API: providers, Computers, lifecycle executions, grants, capability
//! rules, approvals and delegations (usage spans are in `usage.rs`, events in `events.rs`).

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;

/// The kinds of sandbox provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// The Docker engine of the host.
    Docker,
    /// E2B.
    E2b,
    /// Daytona.
    Daytona,
    /// A provider that only exists in tests, with injectable faults (enabled per node by flag).
    Fake,
}

impl ProviderKind {
    /// Whether this kind's sandboxes run our `computer-agent`, started by the adapter at create
    /// with a one-time pairing code (the fake kind's sandboxes exist only in a journal).
    pub fn runs_agent(self) -> bool {
        matches!(self, ProviderKind::Docker | ProviderKind::E2b | ProviderKind::Daytona)
    }

    /// What a pause keeps: `memory` (files, memory and running processes: Docker's freeze,
    /// E2B's pause) or `files` (files only: Daytona's stop ends every process).
    pub fn pause_keeps(self) -> &'static str {
        match self {
            ProviderKind::Daytona => "files",
            ProviderKind::Docker | ProviderKind::E2b | ProviderKind::Fake => "memory",
        }
    }
}

/// A configured provider. `secrets` are write-only: stored, given to the adapter, never shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provider {
    /// `cpp_…`
    pub id: String,
    /// The kind.
    pub kind: ProviderKind,
    /// Display name.
    pub name: String,
    /// Config fields that may be shown.
    pub config: BTreeMap<String, serde_json::Value>,
    /// Credential fields: never answered, never logged.
    pub secrets: BTreeMap<String, serde_json::Value>,
    /// The member who added it.
    pub created_by: String,
    /// Unix ms.
    pub created_at: u64,
}

/// Where a Computer runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "_tag")]
pub enum Source {
    /// A sandbox at a provider.
    Provider {
        /// `cpp_…`
        provider: String,
        /// A provider image/template name, if any.
        template: Option<String>,
    },
    /// The user's own machine, paired once.
    Paired,
}

/// A Computer's state as users see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputerState {
    /// Being created.
    Starting,
    /// Up.
    Running,
    /// Paused at the provider.
    Paused,
    /// An own machine that is not connected.
    Offline,
    /// Failed; see its executions.
    Failed,
    /// Deleted (kept as a tombstone for usage and receipts; hidden from the API).
    Deleted,
}

/// A Computer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Computer {
    /// `cmp_…`
    pub id: String,
    /// Display name.
    pub name: String,
    /// The member who owns it (the bot's member when a bot created it).
    pub owner: String,
    /// Owned by the organization: every member may use it.
    pub shared: bool,
    /// Where it runs.
    pub source: Source,
    /// Screenshots, mouse, keyboard.
    pub desktop: bool,
    /// Seconds without work before an idle pause; `None` = never.
    pub pause_after: Option<u64>,
    /// State.
    pub state: ComputerState,
    /// The provider's reference to the sandbox, once known.
    pub sandbox: Option<String>,
    /// The lifecycle execution that holds the Computer (pending, running or of unknown outcome).
    pub active_execution: Option<String>,
    /// Unix ms.
    pub created_at: u64,
    /// Hex SHA-256 of the agent's machine credential, once paired (never the secret).
    #[serde(default)]
    pub agent_credential: Option<String>,
    /// The generation of the current agent link (0: never linked). Each new link increments it;
    /// frames of an older generation are refused.
    #[serde(default)]
    pub link_generation: u64,
    /// The node holding the current link, if linked.
    #[serde(default)]
    pub link_node: Option<u64>,
    /// Its desktop as its agent last reported it (a sandbox's own, or a paired machine's that
    /// its owner opted in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desktop_view: Option<DesktopView>,
    /// Environment variables set for every session of the Computer (a provider sandbox's, at
    /// create). Checked by the create route; absent from records that have none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The CPUs and memory the create asked for, within the template's ceilings (a provider
    /// sandbox's; `None`: the template's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// The creator's string labels (at most 32), a filter of the Computers' list; passed to the
    /// provider where it has a place for them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Where its sandbox may connect (a provider sandbox's; `None`: anywhere the provider lets
    /// it). A docker sandbox created with one sits behind an egress gateway, so the policy can
    /// change while it runs (`SetEgress`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<computerd_proto::egress::EgressPolicy>,
    /// The time (the gateway's clock, Unix ms) of the latest refused connection recorded as an
    /// `EgressDenied` event: the egress watch resumes after it, and a report not past it is old.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_denied_through: u64,
    /// How many times its egress policy was set after create (`SetEgress`): the docker gateway
    /// keeps the revision in force and ignores older ones, so racing changes end at the stored one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_revision: u64,
    /// Whether its sandbox came from a warm pool (store version 7).
    #[serde(default, skip_serializing_if = "is_false")]
    pub pooled: bool,
}

impl Computer {
    /// Whether the create carries any of `env`, `resources` or `metadata` (store version 2:
    /// an older build would drop them, see `sm::versions`).
    pub fn has_create_options(&self) -> bool {
        !self.env.is_empty() || self.resources.is_some() || !self.metadata.is_empty()
    }
}

/// The CPUs and memory a create asks for (each absent: the template's).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// CPUs (fractions allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Memory in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
}

/// A Computer's desktop as its agent reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesktopView {
    /// `:N`.
    pub display: String,
    /// Pixels, once the agent has reached the display.
    pub width: Option<u32>,
    /// Pixels.
    pub height: Option<u32>,
    /// `starting`, `running` or `failed`.
    pub state: String,
}

/// The lifecycle commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionKind {
    /// Create the sandbox (or a pairing code).
    Create,
    /// Pause.
    Pause,
    /// Resume.
    Resume,
    /// Delete the sandbox and the Computer.
    Delete,
    /// Replace the sandbox (a new container, perhaps of a newer image), keeping the Computer's
    /// tool runtime (store version 3).
    Recreate,
}

/// An execution's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionState {
    /// Stored; not started (or waiting for an approval).
    Pending,
    /// A driver claimed it.
    Running,
    /// Done.
    Succeeded,
    /// Failed; the error says why.
    Failed,
    /// The provider call was sent and its answer lost: a person decides.
    OutcomeUnknown,
}

/// Who asked for something, as of the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Requester {
    /// The token used.
    pub token_id: String,
    /// The member (the bot's member for a bot).
    pub member_id: String,
    /// The bot, if a bot asked.
    pub bot_id: Option<String>,
}

/// Why an execution failed, safe to show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionError {
    /// An error kind (`forbidden`, `provider_rejected`, `not_sent`, ...).
    pub kind: String,
    /// Message.
    pub message: String,
}

/// A human decision on an unknown outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// What the person found at the provider.
    pub outcome: ExecutionState,
    /// Why.
    pub reason: String,
    /// Member who decided.
    pub by: String,
    /// Unix ms.
    pub at: u64,
}

/// A lifecycle execution: one command on one Computer, keyed by its command key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Execution {
    /// `exe_…`
    pub id: String,
    /// The caller's idempotency key.
    pub command_key: String,
    /// Hex SHA-256 of the normalized request, to tell a retry from a reuse of the key.
    pub body_hash: String,
    /// Which command.
    pub kind: ExecutionKind,
    /// The Computer.
    pub computer_id: String,
    /// State.
    pub state: ExecutionState,
    /// Who asked.
    pub requester: Requester,
    /// The approval it waits for, if a decider asked a person.
    pub approval: Option<String>,
    /// The claim of the driver that runs it (fences out a deposed driver).
    pub claim: Option<String>,
    /// The node that made the claim (`None` for claims from before placement).
    #[serde(default)]
    pub claim_node: Option<u64>,
    /// Set when the provider call is about to be sent: a driver that takes over never re-sends.
    pub dispatched_at: Option<u64>,
    /// Why it failed.
    pub error: Option<ExecutionError>,
    /// The decision on an unknown outcome.
    pub decision: Option<Decision>,
    /// An answer that arrived after the outcome was declared unknown (kept as evidence).
    pub late_answer: Option<String>,
    /// For a paired create: the one-time pairing code (cleared when redeemed or expired).
    pub pairing_code: Option<String>,
    /// When the pairing code expires, unix ms.
    pub pairing_expires_at: Option<u64>,
    /// Unix ms.
    pub created_at: u64,
    /// Unix ms.
    pub finished_at: Option<u64>,
    /// For an idle pause: the plan version it was scheduled at (its dispatch re-checks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_version: Option<u64>,
    /// For a recreate: the template the new sandbox is made from (`None`: the Computer's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

impl Execution {
    /// A pending execution with no requester yet (the store fills it in at submit).
    pub fn pending(
        id: &str,
        command_key: &str,
        body_hash: &str,
        kind: ExecutionKind,
        computer_id: &str,
        at: u64,
    ) -> Self {
        Execution {
            id: id.to_string(),
            command_key: command_key.to_string(),
            body_hash: body_hash.to_string(),
            kind,
            computer_id: computer_id.to_string(),
            state: ExecutionState::Pending,
            requester: Requester { token_id: String::new(), member_id: String::new(), bot_id: None },
            approval: None,
            claim: None,
            claim_node: None,
            dispatched_at: None,
            error: None,
            decision: None,
            late_answer: None,
            pairing_code: None,
            pairing_expires_at: None,
            created_at: at,
            finished_at: None,
            plan_version: None,
            template: None,
        }
    }
}

impl Execution {
    /// Pending, running or of unknown outcome: it still holds its Computer.
    pub fn is_open(&self) -> bool {
        matches!(self.state, ExecutionState::Pending | ExecutionState::Running | ExecutionState::OutcomeUnknown)
    }
}

/// A bot's right to use a Computer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// The Computer.
    pub computer_id: String,
    /// The bot.
    pub bot_id: String,
    /// The member who granted (or approved an acquire).
    pub granted_by: String,
    /// Unix ms.
    pub created_at: u64,
    /// The bot may run sessions and file calls as root (`"user": "root"`): member-level trust,
    /// since root can read the agent's own state. Only a member sets it.
    #[serde(default)]
    pub allow_root: bool,
    /// On a paired machine: the absolute paths (files or directories) the bot may copy files
    /// from (`copy-from-box`); none, nothing. Checked by the agent on the opened file's real path,
    /// so a symlink does not lead out. Only a member sets them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// The bot may ask for a `control` stream of the desktop for its member (held in the
    /// member's name, as a person, once a browser opens it). Only a member sets it.
    #[serde(default)]
    pub desktop_control: bool,
    /// The delegation (`dlg_…`) the bot acquired this grant through: it ends with it, and with
    /// the parent's own grant on the Computer. `None` for a grant a member gave or approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// The secrets (by name) the bot may have filled on this Computer (`fill_secret`), from
    /// the vault of `secrets_from`. Only a member sets them; none by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// The member whose vault `secrets` name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_from: Option<String>,
}

/// The four capabilities decided by the decider chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Capability {
    /// Create a sandbox (target: provider id).
    #[serde(rename = "computers.create")]
    Create,
    /// Get the right to use an existing Computer (target: computer id).
    #[serde(rename = "computers.acquire")]
    Acquire,
    /// Delete a Computer (target: computer id).
    #[serde(rename = "computers.delete")]
    Delete,
    /// Give a port a public address (target: computer id).
    #[serde(rename = "computers.expose")]
    Expose,
    /// Change where a Computer's sandbox may connect (target: computer id; store version 5).
    #[serde(rename = "computers.egress")]
    Egress,
}

/// What a rule decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// Run.
    Allow,
    /// Refuse.
    Deny,
    /// Park as a pending approval for a member.
    Ask,
}

/// Who a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActorKind {
    /// Members acting with member tokens.
    Member,
    /// Bots acting with bot tokens.
    Bot,
}

/// A configured rule; the first rule that matches decides. Unset fields match anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    /// The capability, or `None` for all four.
    pub capability: Option<Capability>,
    /// The decision.
    pub effect: Effect,
    /// Members or bots.
    pub actor: Option<ActorKind>,
    /// One member (`mem_…`), matching members and bots of that member.
    pub member: Option<String>,
    /// One bot.
    pub bot: Option<String>,
    /// One provider (target of `computers.create`).
    pub provider: Option<String>,
    /// One Computer (target of the other three).
    pub computer: Option<String>,
}

/// A request parked by an `ask` decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    /// `apr_…`
    pub id: String,
    /// What is asked.
    pub capability: Capability,
    /// The provider or Computer id.
    pub target: String,
    /// Who asked.
    pub requester: Requester,
    /// The execution waiting for it (create/delete), if any.
    pub execution_id: Option<String>,
    /// `pending`, `approved` or `rejected`.
    pub state: String,
    /// The member who decided.
    pub decided_by: Option<String>,
    /// When it was decided, unix ms (its retention counts from then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<u64>,
    /// Why the bot asked (`reason` of the tool call), if given.
    pub reason: Option<String>,
    /// Unix ms.
    pub created_at: u64,
    /// The egress policy a bot asked for (`computers.egress`), applied when a member approves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<computerd_proto::egress::EgressPolicy>,
}

/// One exposed port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Exposure {
    /// The Computer.
    pub computer_id: String,
    /// The port inside it (`127.0.0.1:<port>`).
    pub port: u16,
    /// `http` (HTTP/1.1, streaming bodies, server-sent events, WebSocket upgrades).
    pub protocol: String,
    /// The SHA-256 (hex) of the address's label.
    pub label_hash: String,
    /// The token that exposed it: its rights are checked again at every request, and a paused
    /// Computer is resumed with them.
    pub token_id: String,
    /// The member behind that token.
    pub member_id: String,
    /// The bot, when a bot exposed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bot_id: Option<String>,
    /// The approval it waits for (`computers.expose` asked): it answers nothing until approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
    /// Unix ms.
    pub created_at: u64,
}

/// The exposures (`ports`) by label hash, and each Computer's ports: derived from the records,
/// never serialized, rebuilt when a snapshot loads ([`Ports::reindex`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ports {
    /// Exposure by label hash: a request's address is found in one lookup.
    pub by_label: BTreeMap<String, Exposure>,
    /// Computer id → port → label hash.
    #[serde(skip)]
    pub by_computer: BTreeMap<String, BTreeMap<u16, String>>,
}

impl Ports {
    /// Rebuilds each Computer's ports from the exposures.
    pub fn reindex(&mut self) {
        let mut by_computer: BTreeMap<String, BTreeMap<u16, String>> = BTreeMap::new();
        for (hash, e) in &self.by_label {
            by_computer.entry(e.computer_id.clone()).or_default().insert(e.port, hash.clone());
        }
        self.by_computer = by_computer;
    }

    /// The exposures of one Computer, by port.
    pub fn of(&self, computer_id: &str) -> Vec<&Exposure> {
        self.by_computer
            .get(computer_id)
            .map(|m| m.values().filter_map(|h| self.by_label.get(h)).collect())
            .unwrap_or_default()
    }

    pub(crate) fn remove(&mut self, computer_id: &str, port: u16) -> Option<Exposure> {
        let ports = self.by_computer.get_mut(computer_id)?;
        let hash = ports.remove(&port)?;
        if ports.is_empty() {
            self.by_computer.remove(computer_id);
        }
        self.by_label.remove(&hash)
    }

    /// Removes every exposure of a Computer (it was deleted).
    pub(crate) fn remove_computer(&mut self, computer_id: &str) {
        for hash in self.by_computer.remove(computer_id).unwrap_or_default().into_values() {
            self.by_label.remove(&hash);
        }
    }
}

// Browser action records (`actions`).

/// Where an action stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionState {
    /// Recorded; nothing sent.
    Prepared,
    /// Being sent (the mark is written before the CDP call).
    Dispatching,
    /// It happened.
    Done,
    /// It was sent and failed.
    Failed,
    /// It was sent; its answer was lost or late: it may have happened.
    Unknown,
}

impl ActionState {
    /// Settled: it will not change any more.
    pub fn settled(self) -> bool {
        matches!(self, Self::Done | Self::Failed)
    }
}

/// One action record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BrowserAction {
    /// The caller's id.
    pub action_id: String,
    /// Computer id.
    pub computer_id: String,
    /// The member who acts (or whose bot does).
    pub member_id: String,
    /// The bot, when a bot acts.
    #[serde(default)]
    pub bot_id: Option<String>,
    /// `click`, `type`, `press`, `select`, `upload`.
    pub tool: String,
    /// The tool's request (the attempt last prepared).
    pub request: Value,
    /// The run it belongs to.
    #[serde(default)]
    pub run_id: Option<String>,
    /// The claim of the run's attempt that acts: it must hold the run's lease when the action
    /// is recorded and when it is marked dispatching.
    #[serde(default)]
    pub run_claim: Option<String>,
    /// What it is meant to do.
    #[serde(default)]
    pub intent: Option<String>,
    /// What the caller knew (kept with an unknown record too).
    #[serde(default)]
    pub evidence: Option<Value>,
    /// Where it stands.
    pub state: ActionState,
    /// The attempt that may move it (fences out any other).
    pub claim: String,
    /// Unix ms.
    pub created_at: u64,
    /// When it was marked dispatching.
    #[serde(default)]
    pub dispatched_at: Option<u64>,
    /// Cluster ms past which a `dispatching` record may lapse to `unknown`: the cluster's clock
    /// at the dispatch mark, plus the call's deadline and the margin.
    #[serde(default)]
    pub lapses_at: Option<u64>,
    /// When it settled (done or failed).
    #[serde(default)]
    pub settled_at: Option<u64>,
    /// The tool's answer (bounded).
    #[serde(default)]
    pub result: Option<Value>,
    /// Why it failed, or why its outcome is unknown.
    #[serde(default)]
    pub error: Option<String>,
    /// The member who decided an unknown outcome.
    #[serde(default)]
    pub decided_by: Option<String>,
    /// Blobs saved as its evidence (screenshots), at most [`MAX_EVIDENCE_BLOBS`].
    #[serde(default)]
    pub evidence_blobs: Vec<String>,
}

/// Evidence blobs one action record names.
pub const MAX_EVIDENCE_BLOBS: usize = 16;

/// The key of a record: the Computer, who acts, and the action id (one caller's id never
/// reaches another's record).
pub fn action_key(computer_id: &str, member_id: &str, bot_id: Option<&str>, action_id: &str) -> String {
    format!(
        "{computer_id}\n{}\n{action_id}",
        bot_id.map_or_else(|| format!("member:{member_id}"), |b| format!("bot:{b}"))
    )
}

impl BrowserAction {
    /// Its key.
    pub fn key(&self) -> String {
        action_key(&self.computer_id, &self.member_id, self.bot_id.as_deref(), &self.action_id)
    }
}

// Blobs and artifacts (`blobs`).

/// The default retention after the last reference: 30 days.
pub const DEFAULT_BLOB_RETENTION_MS: u64 = 30 * 24 * 3600 * 1000;
/// The default quota of one member: 10 GiB.
pub const DEFAULT_BLOB_QUOTA: u64 = 10 << 30;

/// The organization's blob limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlobLimits {
    /// How long a blob is kept after its last reference, ms (`None`: 30 days).
    #[serde(default)]
    pub retention_ms: Option<u64>,
    /// How many bytes of blobs one member (with their bots) may hold (`None`: 10 GiB).
    #[serde(default)]
    pub quota_bytes: Option<u64>,
}

impl BlobLimits {
    /// The retention in force.
    pub fn retention(&self) -> u64 {
        self.retention_ms.unwrap_or(DEFAULT_BLOB_RETENTION_MS)
    }
    /// The quota in force.
    pub fn quota(&self) -> u64 {
        self.quota_bytes.unwrap_or(DEFAULT_BLOB_QUOTA)
    }
}

/// One blob's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Blob {
    /// `blb_…`.
    pub id: String,
    /// The member who uploaded it (or whose bot did): their quota counts it.
    pub member_id: String,
    /// The bot that uploaded it.
    #[serde(default)]
    pub bot_id: Option<String>,
    /// Its file name.
    pub name: String,
    /// Its media type.
    pub mime_type: String,
    /// Bytes.
    pub size: u64,
    /// SHA-256, hex.
    pub sha256: String,
    /// Unix ms.
    pub created_at: u64,
    /// When it was last referenced (its retention counts from here).
    pub last_ref_at: u64,
    /// The nodes whose blob stores hold its bytes (empty: a shared store, such as S3).
    #[serde(default)]
    pub nodes: Vec<u64>,
}

/// A file put in a Computer by a checked copy (`copy-to-box`): later steps name it, not its
/// path. Kept as long as blobs are (after its copy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// `art_…`.
    pub id: String,
    /// The Computer.
    pub computer_id: String,
    /// Where it is in the Computer.
    pub path: String,
    /// Bytes, as the agent counted them.
    pub size: u64,
    /// SHA-256 (hex), as the agent computed it.
    pub sha256: String,
    /// The blob it was copied from (empty: a file the Computer holds, such as one a browser
    /// upload set on a page).
    pub blob_id: String,
    /// Who copied it.
    pub member_id: String,
    /// The bot that copied it.
    #[serde(default)]
    pub bot_id: Option<String>,
    /// Unix ms.
    pub created_at: u64,
}

/// A parent bot's delegation to a child bot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Delegation {
    /// `dlg_…`
    pub id: String,
    /// The bot that gave the work.
    pub parent_bot_id: String,
    /// The bot that does it.
    pub child_bot_id: String,
    /// Who made it: the parent bot, or a member (`mem_…`).
    pub made_by: String,
    /// Unix ms.
    pub created_at: u64,
}

/// The live delegations, by id and by bot (both directions).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegations {
    /// By id.
    pub by_id: BTreeMap<String, Delegation>,
    /// bot id -> ids of the delegations it gave or received.
    pub by_bot: BTreeMap<String, BTreeSet<String>>,
}

impl Delegations {
    /// The live delegations `bot` gave or received.
    pub fn of<'a>(&'a self, bot: &str) -> impl Iterator<Item = &'a Delegation> + 'a {
        self.by_bot.get(bot).into_iter().flatten().filter_map(|id| self.by_id.get(id))
    }

    pub(crate) fn insert(&mut self, d: Delegation) {
        self.by_bot.entry(d.parent_bot_id.clone()).or_default().insert(d.id.clone());
        self.by_bot.entry(d.child_bot_id.clone()).or_default().insert(d.id.clone());
        self.by_id.insert(d.id.clone(), d);
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<Delegation> {
        let d = self.by_id.remove(id)?;
        for bot in [&d.parent_bot_id, &d.child_bot_id] {
            if let Some(ids) = self.by_bot.get_mut(bot) {
                ids.remove(id);
                if ids.is_empty() {
                    self.by_bot.remove(bot);
                }
            }
        }
        Some(d)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}
