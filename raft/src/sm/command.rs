//! Commands of the replicated state machine and their versioned wire form.

use serde::Deserialize;
use serde::Serialize;

use super::identity::Bot;
use super::identity::Member;
use super::identity::Organization;
use super::identity::Token;
use super::lifecycle::Outcome;
use super::lifecycle::Submit;
use super::model::ExecutionState;
use super::model::Provider;
use super::model::Rule;

/// The version of [`Request`] this build writes. Older versions stay readable forever: a log
/// written by an older node must apply the same way on a newer one.
pub const REQUEST_VERSION: u32 = 2;

/// A command as it travels in the Raft log: a version tag plus the command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "v", content = "cmd")]
pub enum Request {
    /// Version 1 of the command set: the command alone.
    #[serde(rename = "1")]
    V1(Command),
    /// Version 2: the command with the leader's clock when it appended the entry.
    #[serde(rename = "2")]
    V2(Stamped),
}

/// A command stamped by the leader that appended it ([`Request::stamped`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stamped {
    /// The leader's wall clock at append, unix ms; never below an earlier entry's stamp on that
    /// leader, nor below the stamps the store had applied when it was taken.
    pub leader_ms: u64,
    /// The command.
    pub cmd: Command,
}

impl Request {
    /// Wraps a command in the current version, not yet stamped (the leader stamps it).
    pub fn new(cmd: Command) -> Self {
        Request::V1(cmd)
    }

    /// The command, upgraded to the current form.
    pub fn command(&self) -> &Command {
        match self {
            Request::V1(c) => c,
            Request::V2(s) => &s.cmd,
        }
    }

    /// The leader's stamp, if the entry has one (entries of older logs have none).
    pub fn leader_ms(&self) -> Option<u64> {
        match self {
            Request::V1(_) => None,
            Request::V2(s) => Some(s.leader_ms),
        }
    }

    /// The same command stamped with `leader_ms` (any stamp it carried is replaced: only the
    /// appending leader's clock counts).
    pub fn stamped(self, leader_ms: u64) -> Self {
        let cmd = match self {
            Request::V1(c) => c,
            Request::V2(s) => s.cmd,
        };
        Request::V2(Stamped { leader_ms, cmd })
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.command().name())
    }
}

/// Every change the store knows. Each carries the token it is made with (`by`), so the rights
/// are checked again when the command applies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// Creates the organization, its first owner and the owner's token; only once per cluster.
    Bootstrap {
        /// The id of the cluster, fixed forever at bootstrap.
        cluster_id: String,
        /// The organization.
        org: Organization,
        /// The first owner.
        owner: Member,
        /// The owner's first token (hash only).
        token: Token,
        /// SHA-256 of the cluster's reusable join secret, set in the same step, so a node that
        /// sees the cluster bootstrapped also finds its join secret.
        #[serde(default)]
        join_secret_hash: Option<String>,
    },
    /// Adds a member.
    CreateMember {
        /// The token id of the caller.
        by: String,
        /// The new member.
        member: Member,
    },
    /// Adds a bot that belongs to a member.
    CreateBot {
        /// The token id of the caller.
        by: String,
        /// The new bot.
        bot: Bot,
        /// The bot that gives it work (a delegation `dlg_<bot id>` is recorded with it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent: Option<String>,
    },
    /// A parent bot gives a child bot work: the child may acquire the parent's Computers.
    Delegate {
        /// The token id of the caller (the parent bot, its member or an admin).
        by: String,
        /// The delegation.
        delegation: super::model::Delegation,
    },
    /// Ends a delegation and the grants acquired through it.
    EndDelegation {
        /// The token id of the caller (the parent bot, its member or an admin).
        by: String,
        /// `dlg_…`
        delegation_id: String,
    },
    /// Archives a bot: its tokens stop working and its rights end.
    ArchiveBot {
        /// The token id of the caller.
        by: String,
        /// The bot to archive.
        bot_id: String,
        /// When (unix ms), chosen by the proposer.
        at_ms: u64,
    },
    /// Stores a new API token (its hash only).
    CreateToken {
        /// The token id of the caller.
        by: String,
        /// The token.
        token: Token,
    },
    /// Revokes a token.
    RevokeToken {
        /// The token id of the caller.
        by: String,
        /// The token to revoke.
        token_id: String,
        /// When (unix ms), chosen by the proposer.
        at_ms: u64,
    },
    /// Adds a sandbox provider.
    CreateProvider {
        /// The token id of the caller.
        by: String,
        /// The provider.
        provider: Provider,
    },
    /// Stores a lifecycle command (create/pause/resume/delete), idempotent by command key.
    SubmitExecution(Box<Submit>),
    /// A driver claims a pending execution (or takes over an undispatched one).
    ClaimExecution {
        /// Execution id.
        execution_id: String,
        /// The driver's claim; later steps must carry it.
        claim: String,
        /// The claiming node, which must own the Computer (`None` in entries from before
        /// placement).
        #[serde(default)]
        node: Option<u64>,
        /// Unix ms.
        at_ms: u64,
    },
    /// Records, before the provider call, that it is being sent (rights re-checked here).
    DispatchExecution {
        /// Execution id.
        execution_id: String,
        /// The driver's claim.
        claim: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// The provider's answer (or its loss).
    FinishExecution {
        /// Execution id.
        execution_id: String,
        /// The driver's claim.
        claim: String,
        /// What happened.
        outcome: Outcome,
        /// Unix ms.
        at_ms: u64,
    },
    /// A taking-over driver declares a dispatched, unanswered call unknown.
    MarkUnknown {
        /// Execution id.
        execution_id: String,
        /// The claim the taking-over driver saw.
        claim: String,
        /// The declaring node: the claim's own node, or the owner once the claim's node is dead.
        #[serde(default)]
        node: Option<u64>,
        /// Why.
        reason: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// A member resolves an unknown outcome.
    DecideExecution {
        /// The token id of the caller.
        by: String,
        /// Execution id.
        execution_id: String,
        /// `succeeded` or `failed`.
        outcome: ExecutionState,
        /// Why.
        reason: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// Stop on an unknown-outcome pause: the Computer becomes failed.
    StopComputer {
        /// The token id of the caller.
        by: String,
        /// Computer id.
        computer_id: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// Sets (or, `None`, clears) where a Computer's sandbox may connect (store version 5). A
    /// member who may use the Computer sets it; the provider has already applied it.
    SetEgress {
        /// The token id of the caller.
        by: String,
        /// Computer id.
        computer_id: String,
        /// The policy.
        policy: Option<computerd_proto::egress::EgressPolicy>,
        /// The revision this change makes (store version 6): the Computer's current one plus
        /// one, else it is refused (another change came first; the route then puts the stored
        /// policy back in force). `None` (version 5): the next, unchecked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revision: Option<u64>,
        /// Unix ms.
        at_ms: u64,
    },
    /// Connections a Computer's egress gateway refused (store version 6), as the leader's egress
    /// watch read them: `count` of them up to `through_ms`, with a sample. Only denials after
    /// the Computer's last recorded `through_ms` are news; a report with nothing newer is a
    /// no-op (a new leader's watch resumes there, and a repeat records nothing twice).
    EgressDenied {
        /// Computer id.
        computer_id: String,
        /// How many were refused in this report (at least the sample's length).
        count: u64,
        /// Some of them (at most [`crate::sm::MAX_DENIED_SAMPLE`]).
        sample: Vec<computerd_proto::egress::Denied>,
        /// The time of the latest (the gateway's clock, Unix ms).
        through_ms: u64,
        /// Unix ms.
        at_ms: u64,
    },
    /// A pooled sandbox runs (store version 7): the pool keeper records it, unready and
    /// unclaimed.
    PoolAdd {
        /// The entry.
        entry: super::pool::PoolEntry,
    },
    /// The agent of a pooled sandbox waits, showing its token (store version 7).
    PoolReady {
        /// `pool_…`
        pool_id: String,
        /// Hex SHA-256 of the token it showed.
        token_hash: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// A create claims a ready pooled sandbox of `key` (store version 7): dispatched and
    /// finished with it at once; answers the pool entry's id. A miss changes nothing.
    PoolClaim {
        /// The create execution.
        execution_id: String,
        /// Its claim.
        claim: String,
        /// The pool key.
        key: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// The pool keeper forgets an entry (store version 7).
    PoolRemove {
        /// `pool_…`
        pool_id: String,
    },
    /// A bot asks for a Computer's egress policy to change (`computers.egress`, store version
    /// 5): it waits as an approval; a member's approval applies it (the route, then `SetEgress`).
    RequestEgress {
        /// The bot's token id.
        by: String,
        /// Computer id.
        computer_id: String,
        /// The policy asked for.
        policy: computerd_proto::egress::EgressPolicy,
        /// The approval's id.
        approval_id: String,
        /// Why (the bot's words), if given.
        reason: Option<String>,
        /// Unix ms.
        at_ms: u64,
    },
    /// Grants a bot the right to use a Computer.
    PutGrant {
        /// The token id of the caller.
        by: String,
        /// Computer id.
        computer_id: String,
        /// Bot id.
        bot_id: String,
        /// Unix ms.
        at_ms: u64,
        /// Sets whether the bot may act as root there (absent: a new grant does not, an existing
        /// one keeps what it had).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allow_root: Option<bool>,
        /// Sets the paths of a paired machine the bot may copy files from (absent: kept).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        paths: Option<Vec<String>>,
        /// Sets whether the bot may ask for a `control` stream of the desktop for its member
        /// (absent: a new grant does not allow it, an existing one keeps what it had).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        desktop_control: Option<bool>,
        /// Sets the secrets of the caller's vault the bot may have filled there (absent: kept;
        /// store version 4).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secrets: Option<Vec<String>>,
    },
    /// Makes or replaces a secret of the caller's vault (store version 4).
    PutSecret {
        /// The token id of the caller (a member's).
        by: String,
        /// The secret's name.
        name: String,
        /// What it holds.
        kind: super::SecretKind,
        /// The origins whose pages may receive it.
        origins: Vec<String>,
        /// The value sealed under the cluster's data key (never the clear value).
        sealed: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// Removes a secret of the caller's vault (store version 4).
    DeleteSecret {
        /// The token id of the caller.
        by: String,
        /// The secret's name.
        name: String,
    },
    /// Notes a secret's fill (store version 4).
    TouchSecret {
        /// The vault's member.
        owner: String,
        /// The secret's name.
        name: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// Revokes (or, by the bot itself, releases) a grant.
    DeleteGrant {
        /// The token id of the caller.
        by: String,
        /// Computer id.
        computer_id: String,
        /// Bot id.
        bot_id: String,
    },
    /// Gives a Computer's port a public address (capability `computers.expose`); answers the
    /// approval id when a decider asks for one (`ports`).
    ExposePort {
        /// The token id of the caller.
        by: String,
        /// Computer id.
        computer_id: String,
        /// The port in the Computer.
        port: u16,
        /// `http`.
        protocol: String,
        /// The SHA-256 (hex) of the address's label; the label itself is never stored.
        label_hash: String,
        /// The id to use if a decider asks for an approval.
        approval_id: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// Ends a port's public address (idempotent).
    UnexposePort {
        /// The token id of the caller.
        by: String,
        /// Computer id.
        computer_id: String,
        /// The port.
        port: u16,
        /// Unix ms.
        at_ms: u64,
    },
    /// The desktop's input lease changed hands, was released or expired (an agent's report over
    /// the link of `generation`): an event.
    DesktopLease {
        /// Computer id.
        computer_id: String,
        /// The link's generation (a report of an older link is refused).
        generation: u64,
        /// The holder now (`bot:…`, `member:…`, `person:…`), or nobody.
        holder: Option<String>,
        /// Unix ms.
        at_ms: u64,
    },
    /// Records a browser action as prepared (or takes a prepared one for a new attempt); answers
    /// `new` or the state of a record past prepared (`actions`).
    ActionPrepare {
        /// The token id of the caller.
        by: String,
        /// The record (its claim is this attempt's).
        action: super::model::BrowserAction,
    },
    /// Marks a prepared action dispatching, before it is sent.
    ActionDispatch {
        /// The record's key.
        key: String,
        /// The attempt's claim.
        claim: String,
        /// Unix ms.
        at_ms: u64,
        /// The call's deadline, ms: past it and [`super::actions::DISPATCH_MARGIN_MS`] by the
        /// cluster's clock, the record may lapse to `unknown` ([`Command::ActionLapse`]).
        #[serde(default)]
        deadline_ms: u64,
    },
    /// A prepared action that the node's own checks refused before the dispatch mark (the
    /// caller's rights, the Computer's state, its link): `failed`, "not sent".
    ActionRefuse {
        /// The record's key.
        key: String,
        /// The attempt's claim.
        claim: String,
        /// Why.
        error: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// A `dispatching` record whose call's deadline and margin have passed by the cluster's
    /// clock becomes `unknown` (the node sending it stopped, or its finish was lost).
    ActionLapse {
        /// The record's key.
        key: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// A dispatched action that the agent refused before anything reached the page: back to
    /// prepared, so a new attempt may send it.
    ActionRelease {
        /// The record's key.
        key: String,
        /// The attempt's claim.
        claim: String,
        /// Why it was refused.
        error: String,
    },
    /// How a dispatched action ended.
    ActionFinish {
        /// The record's key.
        key: String,
        /// The attempt's claim.
        claim: String,
        /// `done`, `failed` or `unknown`.
        state: super::model::ActionState,
        /// The tool's answer.
        #[serde(default)]
        result: Option<serde_json::Value>,
        /// Why it failed or is unknown.
        #[serde(default)]
        error: Option<String>,
        /// Unix ms.
        at_ms: u64,
    },
    /// Records an uploaded blob (its bytes are in the blob stores of `blob.nodes`).
    BlobPut {
        /// The token id of the caller.
        by: String,
        /// The record.
        blob: super::model::Blob,
    },
    /// Records a checked copy of a blob into a Computer.
    ArtifactPut {
        /// The token id of the caller.
        by: String,
        /// The record.
        artifact: super::model::Artifact,
    },
    /// Starts a turn: a queued run (idempotent on the caller's `client_turn_id`).
    RunStart {
        /// The token id of the caller.
        by: String,
        /// The run as asked (state, times and events are set by the store).
        run: super::run_model::Run,
    },
    /// A bot's runtime claims its oldest queued run, leased.
    RunClaim {
        /// The token id of the caller.
        by: String,
        /// The bot whose runs it takes.
        bot_id: String,
        /// The attempt's claim.
        claim: String,
        /// The lease, ms.
        lease_ms: u64,
    },
    /// Renews a run's lease.
    RunRenew {
        /// The token id of the caller.
        by: String,
        /// The run.
        run_id: String,
        /// The attempt's claim.
        claim: String,
        /// The lease from now, ms.
        lease_ms: u64,
    },
    /// A runtime's event (`partial`, `activity`).
    RunEvent {
        /// The token id of the caller.
        by: String,
        /// The run.
        run_id: String,
        /// The attempt's claim.
        claim: String,
        /// Its kind.
        kind: String,
        /// Its data.
        data: serde_json::Value,
    },
    /// A runtime ends its run.
    RunFinish {
        /// The token id of the caller.
        by: String,
        /// The run.
        run_id: String,
        /// The attempt's claim.
        claim: String,
        /// Succeeded (else failed).
        succeeded: bool,
        /// The result.
        #[serde(default)]
        result: Option<serde_json::Value>,
        /// Why it failed.
        #[serde(default)]
        error: Option<String>,
    },
    /// A member cancels a run.
    RunCancel {
        /// The token id of the caller.
        by: String,
        /// The run.
        run_id: String,
    },
    /// A person decides a run that needs it.
    RunDecide {
        /// The token id of the caller.
        by: String,
        /// The run.
        run_id: String,
        /// Back to the queue (else failed).
        requeue: bool,
    },
    /// Moves the cluster's clock (its stamp) so lapsed leases expire when nothing else is
    /// applied.
    RunsTick,
    /// Sets the blob quota and retention (owner or admin).
    SetBlobLimits {
        /// The token id of the caller.
        by: String,
        /// The limits.
        limits: super::model::BlobLimits,
    },
    /// Links a blob (a screenshot) to an action record as its evidence.
    ActionEvidence {
        /// The token id of the caller.
        by: String,
        /// The record's key.
        key: String,
        /// The blob.
        blob_id: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// A person decides an unknown action.
    ActionDecide {
        /// The token id of the caller.
        by: String,
        /// The record's key.
        key: String,
        /// Done (else failed).
        done: bool,
        /// Unix ms.
        at_ms: u64,
    },
    /// The desktop as the agent of link `generation` reports it (display, size, state).
    DesktopStatus {
        /// Computer id.
        computer_id: String,
        /// The link's generation (a report of an older link is refused).
        generation: u64,
        /// What the agent reported.
        desktop: super::model::DesktopView,
    },
    /// A bot asks for the right to use an existing Computer (capability `computers.acquire`).
    Acquire {
        /// The bot token id.
        by: String,
        /// Computer id.
        computer_id: String,
        /// The id to use if a decider asks for an approval.
        approval_id: String,
        /// The bot's reason.
        reason: Option<String>,
        /// Unix ms.
        at_ms: u64,
    },
    /// A member approves or rejects a parked request.
    DecideApproval {
        /// The token id of the caller.
        by: String,
        /// Approval id.
        approval_id: String,
        /// Approve (true) or reject.
        approve: bool,
        /// Unix ms.
        at_ms: u64,
    },
    /// Trades a one-time pairing code for a machine credential (hash only); answers the Computer.
    RedeemPairing {
        /// The code.
        code: String,
        /// Hex SHA-256 of the new credential.
        credential_hash: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// An agent authenticated on a node: a new link generation; answers it.
    LinkUp {
        /// The Computer.
        computer_id: String,
        /// Hex SHA-256 of the credential the agent showed.
        credential_hash: String,
        /// The node holding the link.
        node_id: u64,
        /// Unix ms.
        at_ms: u64,
    },
    /// A link ended; applies only if it is still the current generation.
    LinkDown {
        /// The Computer.
        computer_id: String,
        /// The generation that ended.
        generation: u64,
        /// Unix ms.
        at_ms: u64,
    },
    /// A command ended after its wait: emits a `computer_session` event (once per session).
    SessionEnded {
        /// The Computer.
        computer_id: String,
        /// The link generation that reported it (older links are not believed).
        generation: u64,
        /// The session.
        session_id: String,
        /// Who started it.
        owner: String,
        /// Exit code.
        exit_code: Option<i32>,
        /// Signal name.
        signal: Option<String>,
        /// Unix ms.
        at_ms: u64,
    },
    /// Work seen on Computers (a batch from one node): moves their idle-pause deadlines.
    ReportActivity {
        /// (Computer id, unix ms of the latest work seen).
        marks: Vec<(String, u64)>,
    },
    /// Work seen on Computers (a batch from one node), each as how long before the proposal it
    /// was seen by the reporting node's monotonic clock; the work's time is the leader's stamp
    /// minus that age, so no node's wall clock is believed.
    ReportWork {
        /// (Computer id, ms between the work and the proposal).
        ages: Vec<(String, u64)>,
    },
    /// A call is about to reach the Computer: work now, by the leader's stamp. An idle pause
    /// not yet dispatched is cancelled; a pause already dispatched is answered
    /// (`ComputerConflict` naming it), for the call to wait for it and resume.
    WorkNow {
        /// The Computer.
        computer_id: String,
    },
    /// The scheduler asks for the idle pause of a Computer whose deadline passed at this plan
    /// version: stores a pause execution (once per version). Answers the execution id.
    PlanPause {
        /// The Computer.
        computer_id: String,
        /// The plan version the scheduler saw.
        version: u64,
        /// The new execution's id.
        execution_id: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// Sets the cluster's reusable join secret (its hash): at bootstrap, and when an owner or
    /// admin rotates it.
    SetJoinSecret {
        /// The caller's token id.
        by: String,
        /// SHA-256 of the secret.
        hash: String,
    },
    /// An owner or admin mints a single-use join secret with an expiry.
    MintJoinToken {
        /// The caller's token id.
        by: String,
        /// SHA-256 of the secret.
        hash: String,
        /// The only node id that may enrol with it (absent: any new node). A live member's id
        /// enrols again only with a secret minted for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node_id: Option<u64>,
        /// Unix ms after which it is refused.
        expires_at_ms: u64,
        /// Unix ms.
        at_ms: u64,
    },
    /// A node presents a join secret to enroll: refused for a removed node id; the reusable one
    /// is let through, a single-use one once (it is removed; one minted for a node id, for that
    /// id only); anything else is refused.
    RedeemJoinToken {
        /// SHA-256 of the secret presented.
        hash: String,
        /// The node enrolling.
        node_id: u64,
        /// Unix ms.
        at_ms: u64,
    },
    /// A node is removed (an owner or admin removed it): its id never enrols again, and its
    /// certificates issued at or before `before_secs` are refused from now on (0: none yet; the
    /// removal records the id so before the node leaves the membership).
    RevokeNode {
        /// The caller's token id.
        by: String,
        /// The node.
        node_id: u64,
        /// Unix seconds.
        before_secs: u64,
    },
    /// The leader records the nodes it hears from; Computers are placed over them.
    SetLiveNodes {
        /// The live nodes (at least the leader).
        nodes: Vec<u64>,
    },
    /// The provider no longer holds the Computer's sandbox, or holds it stopped for good (a
    /// Docker container that exited): it is marked failed, not hidden.
    SandboxVanished {
        /// The Computer.
        computer_id: String,
        /// Unix ms.
        at_ms: u64,
        /// Why, when the sandbox is still there but ended (absent: it is gone). Optional, so a
        /// node of an older build applies the command as before.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Node `node_id` speaks store commands up to `version` (it says so at each start): the
    /// version gate (`sm::versions`) reads it.
    NodeSpeaks {
        /// The node.
        node_id: u64,
        /// Its build's store version.
        version: u32,
    },
    /// A command only a node of the `upgrade-probe` build speaks (store version 3), for the
    /// rolling-upgrade test: it records an event.
    #[cfg(feature = "upgrade-probe")]
    UpgradeProbe {
        /// What the event says.
        note: String,
    },
    /// A new cluster takes the records of a backup (only a store never bootstrapped; see
    /// `sm::backup`).
    Restore {
        /// The new cluster's id.
        cluster_id: String,
        /// The backup's records (the JSON of its state).
        state_json: String,
        /// SHA-256 of the new cluster's reusable join secret.
        join_secret_hash: String,
    },
    /// The provider paused (or stopped) a running Computer's sandbox on its own: it becomes
    /// `paused`, with an event and its usage span ended, as for a pause we asked for.
    SandboxPausedByProvider {
        /// The Computer.
        computer_id: String,
        /// The provider's name of the sandbox's state (`paused`, `stopped`, ...).
        provider_state: String,
        /// Unix ms.
        at_ms: u64,
    },
    /// Records an MCP binding being installed (admission: installing). Answers its id.
    BindingReserve {
        /// The caller's token id.
        by: String,
        /// The binding.
        binding: super::tools::ToolBinding,
    },
    /// The agent's answer to an install or a discovery.
    BindingSettle {
        /// The binding.
        binding_id: String,
        /// Ready (with tools) or failed.
        ready: bool,
        /// The tool schemas.
        tools: serde_json::Value,
        /// Why it failed.
        error: Option<serde_json::Value>,
        /// The agent runs it under its own UID (marks the binding for good).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        shared_uid: bool,
    },
    /// Closes a binding's admission for good.
    BindingRevoke {
        /// The caller's token id.
        by: String,
        /// The binding.
        binding_id: String,
    },
    /// Journals a tool call before it is sent. Answers `new`, `done`, `running` or `unknown`.
    OperationBegin {
        /// The caller's token id.
        by: String,
        /// The operation.
        operation: super::tools::Operation,
    },
    /// A tool call's answer: held by the agent (`held`), or a small one of the node's own
    /// (`result`); neither: its answer was lost, the effect is unknown.
    OperationFinish {
        /// The journal key.
        key: String,
        /// A result of at most 4 KiB the journal holds itself.
        result: Option<serde_json::Value>,
        /// The digest and size of the answer the agent keeps.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        held: Option<super::tools::HeldResult>,
    },
    /// Reserves a version switch of a binding. Answers `reserved`, `done`, `failed`, `cancelling` or
    /// `cancelled`.
    SwitchReserve {
        /// The caller's token id.
        by: String,
        /// The switch.
        switch: super::tools::Switch,
    },
    /// The agent's answer to a switch: commit it (`ok`) or reopen the participants (the agent
    /// said the binding is still at the source).
    SwitchSettle {
        /// The journal key.
        key: String,
        /// The receipt (version, sha256, tools) or the refusal.
        receipt: serde_json::Value,
        /// Whether it switched.
        ok: bool,
        /// The Computer's link generation the answer came under (refused once the link
        /// changed). Absent in entries of older nodes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        generation: Option<u64>,
    },
    /// The agent's answer leaves a switch pending (switched, discovery failed; or neither state a
    /// switch may go on from): it stays reserved, with the answer noted.
    SwitchHold {
        /// The journal key.
        key: String,
        /// The agent's answer.
        note: serde_json::Value,
        /// The Computer's link generation the answer came under.
        generation: u64,
    },
    /// A closed binding's runtime is confirmed stopped on its agent (a participant of a
    /// cancelling switch is then drained).
    BindingDrained {
        /// The binding.
        binding_id: String,
    },
    /// Replaces the capability rules.
    SetRules {
        /// The token id of the caller.
        by: String,
        /// The new rules, in order.
        rules: Vec<Rule>,
    },
    /// Sets how long finished executions and decided approvals are kept (`retention`).
    SetRetention {
        /// The token id of the caller.
        by: String,
        /// The retention, ms.
        ms: u64,
    },
    /// Sets the organization's caps on bots and Computers (owner or admin).
    SetLimits {
        /// The token id of the caller.
        by: String,
        /// The caps (`None`: the default).
        limits: super::limits::Limits,
    },
}

impl Command {
    /// A short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::CreateProvider { .. } => "create_provider",
            Command::SubmitExecution(_) => "submit_execution",
            Command::ClaimExecution { .. } => "claim_execution",
            Command::DispatchExecution { .. } => "dispatch_execution",
            Command::FinishExecution { .. } => "finish_execution",
            Command::MarkUnknown { .. } => "mark_unknown",
            Command::DecideExecution { .. } => "decide_execution",
            Command::StopComputer { .. } => "stop_computer",
            Command::SetEgress { .. } => "set_egress",
            Command::RequestEgress { .. } => "request_egress",
            Command::EgressDenied { .. } => "egress_denied",
            Command::PoolAdd { .. } => "pool_add",
            Command::PoolReady { .. } => "pool_ready",
            Command::PoolClaim { .. } => "pool_claim",
            Command::PoolRemove { .. } => "pool_remove",
            Command::PutGrant { .. } => "put_grant",
            Command::PutSecret { .. } => "put_secret",
            Command::DeleteSecret { .. } => "delete_secret",
            Command::TouchSecret { .. } => "touch_secret",
            Command::DeleteGrant { .. } => "delete_grant",
            Command::Acquire { .. } => "acquire",
            Command::ExposePort { .. } => "expose_port",
            Command::DesktopLease { .. } => "desktop_lease",
            Command::DesktopStatus { .. } => "desktop_status",
            Command::ActionPrepare { .. } => "action_prepare",
            Command::ActionDispatch { .. } => "action_dispatch",
            Command::ActionFinish { .. } => "action_finish",
            Command::ActionRelease { .. } => "action_release",
            Command::ActionRefuse { .. } => "action_refuse",
            Command::ActionLapse { .. } => "action_lapse",
            Command::BlobPut { .. } => "blob_put",
            Command::ArtifactPut { .. } => "artifact_put",
            Command::SetBlobLimits { .. } => "set_blob_limits",
            Command::RunStart { .. } => "run_start",
            Command::RunClaim { .. } => "run_claim",
            Command::RunRenew { .. } => "run_renew",
            Command::RunEvent { .. } => "run_event",
            Command::RunFinish { .. } => "run_finish",
            Command::RunCancel { .. } => "run_cancel",
            Command::RunDecide { .. } => "run_decide",
            Command::RunsTick => "runs_tick",
            Command::ActionEvidence { .. } => "action_evidence",
            Command::ActionDecide { .. } => "action_decide",
            Command::UnexposePort { .. } => "unexpose_port",
            Command::DecideApproval { .. } => "decide_approval",
            Command::SetRules { .. } => "set_rules",
            Command::SetRetention { .. } => "set_retention",
            Command::SetLimits { .. } => "set_limits",
            Command::RedeemPairing { .. } => "redeem_pairing",
            Command::LinkUp { .. } => "link_up",
            Command::LinkDown { .. } => "link_down",
            Command::SessionEnded { .. } => "session_ended",
            Command::ReportActivity { .. } => "report_activity",
            Command::ReportWork { .. } => "report_work",
            Command::WorkNow { .. } => "work_now",
            Command::PlanPause { .. } => "plan_pause",
            Command::SetLiveNodes { .. } => "set_live_nodes",
            Command::SetJoinSecret { .. } => "set_join_secret",
            Command::MintJoinToken { .. } => "mint_join_token",
            Command::RedeemJoinToken { .. } => "redeem_join_token",
            Command::RevokeNode { .. } => "revoke_node",
            Command::SandboxVanished { .. } => "sandbox_vanished",
            Command::SandboxPausedByProvider { .. } => "sandbox_paused_by_provider",
            Command::Restore { .. } => "restore",
            Command::NodeSpeaks { .. } => "node_speaks",
            #[cfg(feature = "upgrade-probe")]
            Command::UpgradeProbe { .. } => "upgrade_probe",
            Command::BindingReserve { .. } => "binding_reserve",
            Command::BindingSettle { .. } => "binding_settle",
            Command::BindingRevoke { .. } => "binding_revoke",
            Command::OperationBegin { .. } => "operation_begin",
            Command::OperationFinish { .. } => "operation_finish",
            Command::SwitchReserve { .. } => "switch_reserve",
            Command::SwitchSettle { .. } => "switch_settle",
            Command::SwitchHold { .. } => "switch_hold",
            Command::BindingDrained { .. } => "binding_drained",
            Command::Bootstrap { .. } => "bootstrap",
            Command::CreateMember { .. } => "create_member",
            Command::CreateBot { .. } => "create_bot",
            Command::Delegate { .. } => "delegate",
            Command::EndDelegation { .. } => "end_delegation",
            Command::ArchiveBot { .. } => "archive_bot",
            Command::CreateToken { .. } => "create_token",
            Command::RevokeToken { .. } => "revoke_token",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_wire_form_is_versioned_and_stable() {
        let r = Request::new(Command::RevokeToken { by: "tok_a".into(), token_id: "tok_b".into(), at_ms: 7 });
        let json = serde_json::to_string(&r).expect("encode");
        assert_eq!(json, r#"{"v":"1","cmd":{"revoke_token":{"by":"tok_a","token_id":"tok_b","at_ms":7}}}"#);
        let back: Request = serde_json::from_str(&json).expect("decode");
        assert_eq!(back, r);
        assert!(serde_json::from_str::<Request>(r#"{"v":"99","cmd":{}}"#).is_err());
        assert_eq!(back.leader_ms(), None, "version 1 has no stamp");
    }

    #[test]
    fn a_stamp_wraps_the_command_and_replaces_any_earlier_stamp() {
        let cmd = Command::WorkNow { computer_id: "cmp_1".into() };
        let r = Request::new(cmd.clone()).stamped(5).stamped(9);
        assert_eq!((r.leader_ms(), r.command()), (Some(9), &cmd));
        let json = serde_json::to_string(&r).expect("encode");
        assert_eq!(json, r#"{"v":"2","cmd":{"leader_ms":9,"cmd":{"work_now":{"computer_id":"cmp_1"}}}}"#);
        assert_eq!(serde_json::from_str::<Request>(&json).expect("decode"), r);
    }

    #[test]
    fn a_vanished_sandbox_without_a_reason_keeps_its_old_wire_form() {
        let old = Command::SandboxVanished { computer_id: "cmp_1".into(), at_ms: 7, reason: None };
        let json = serde_json::to_string(&old).expect("encode");
        assert_eq!(
            json, r#"{"sandbox_vanished":{"computer_id":"cmp_1","at_ms":7}}"#,
            "what older nodes wrote and read"
        );
        assert_eq!(serde_json::from_str::<Command>(&json).expect("decode"), old);
        let ended = Command::SandboxVanished { computer_id: "cmp_1".into(), at_ms: 7, reason: Some("exited".into()) };
        let json = serde_json::to_string(&ended).expect("encode");
        assert_eq!(serde_json::from_str::<Command>(&json).expect("decode"), ended);
    }
}
