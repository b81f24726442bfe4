//! Computers and their lifecycle: create, list, read, pause, resume, delete, stop, usage,
//! acquire and release. Lifecycle commands answer 202 with an execution receipt.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::Path;
use axum::extract::Query;
use axum::extract::State;
use axum::http::StatusCode;
use computerd_raft::sm::Caller;
use computerd_raft::sm::Command;
use computerd_raft::sm::Computer;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::Execution;
use computerd_raft::sm::ExecutionKind;
use computerd_raft::sm::ExecutionState;
use computerd_raft::sm::Resources;
use computerd_raft::sm::Source;
use computerd_raft::sm::Submit;
use serde::Deserialize;
use serde_json::Value;
use serde_json::json;
use sha2::Digest;

use super::ApiError;
use super::AppState;
use super::Auth;
#[allow(unused_imports)]
use super::schemas::ErrorBody;
#[allow(unused_imports)]
use super::schemas::ReceiptDoc;
use super::util::Body;
use super::util::check_id;
use super::util::check_name;
use super::util::propose;
use crate::ids::new_id;
use crate::ids::now_ms;

/// The longest `pauseAfter` (30 days), in seconds.
const MAX_PAUSE_AFTER: u64 = 30 * 24 * 3600;
/// How long a pairing code stays valid.
const PAIRING_VALID_MS: u64 = 10 * 60 * 1000;

/// A Computer as callers see it. `driverNode` is the node its lifecycle work is placed on
/// (absent while no node is recorded live); `linkNode` the node holding its agent link;
/// `idlePauseAt` when it pauses without more work (unix ms by the cluster's clock; null when it
/// is not running or never pauses by itself).
pub fn computer_view(s: &computerd_raft::sm::State, c: &Computer) -> Value {
    let mut v = json!({
        "id": c.id,
        "name": c.name,
        "state": c.state,
        "source": c.source,
        // The desktop: null without one; its display, size and state as its agent reported them
        // (`starting` until it has).
        "desktop": match &c.desktop_view {
            Some(d) => json!(d),
            None if c.desktop => json!({"display": null, "width": null, "height": null, "state": "starting"}),
            None => Value::Null,
        },
        "pauseAfter": c.pause_after,
        "shared": c.shared,
        "owner": c.owner,
        "sandboxId": c.sandbox,
        "activeExecution": c.active_execution,
        // An own machine that redeemed its pairing code (a sandbox's agent has a credential too,
        // but it is no paired machine).
        "paired": c.source == Source::Paired && c.agent_credential.is_some(),
        "linkGeneration": c.link_generation,
        "linkNode": c.link_node,
        "driverNode": s.placement(&c.id),
        "idlePauseAt": s.plan.get(&c.id).map(|e| e.deadline),
        // What a pause keeps at this Computer's provider: `memory` (files, memory and running
        // processes) or `files` (Daytona: processes end); null for an own machine.
        "pauseKeeps": match &c.source {
            Source::Provider { provider, .. } => s.providers.get(provider).map(|p| p.kind.pause_keeps()),
            Source::Paired => None,
        },
        "createdAt": c.created_at,
        // What its create asked for: env for every session, resources (null: the template's)
        // and metadata.
        "env": c.env,
        "resources": c.resources,
        "metadata": c.metadata,
        "egress": c.egress,
        // Whether its sandbox came from its provider's warm pool.
        "pooled": c.pooled,
    });
    if c.state == ComputerState::Starting {
        v["starting"] = starting(s, c);
    }
    v
}

/// What a `starting` Computer waits for, since when, and where to look: its create at the
/// provider, or (the create done) its agent's first link.
fn starting(s: &computerd_raft::sm::State, c: &Computer) -> Value {
    let active = c.active_execution.as_deref().and_then(|id| s.executions.get(id));
    if let Some(e) = active {
        return json!({
            "since": e.created_at,
            "waitingFor": "provider",
            "executionId": e.id,
            "detail": format!("the provider's {} is {}; GET /v1/executions/{} follows it", json!(e.kind).as_str().unwrap_or("call"), json!(e.state).as_str().unwrap_or("under way"), e.id),
        });
    }
    let created = s
        .executions_of(&c.id)
        .filter(|e| matches!(e.kind, ExecutionKind::Create | ExecutionKind::Recreate))
        .filter_map(|e| e.finished_at)
        .max();
    json!({
        "since": created.unwrap_or(c.created_at),
        "waitingFor": "agent",
        "detail": "the sandbox is created, and its agent has not linked yet: it dials the provider's serverUrl, \
                   which must reach a node of this cluster (GET …/sandbox asks the provider what it holds)",
    })
}

/// The receipt of an execution; the pairing code only for its requester, once it succeeded, and
/// only for an own machine (a sandbox's agent gets its code from the provider adapter).
pub fn receipt(s: &computerd_raft::sm::State, e: &Execution, caller: &Caller, now: u64) -> Value {
    let mut v = json!({
        "executionId": e.id,
        "commandKey": e.command_key,
        "kind": e.kind,
        "state": e.state,
        "resource": {"type": "computer", "id": e.computer_id},
        "createdAt": e.created_at,
        "finishedAt": e.finished_at,
        "error": e.error,
        "decision": e.decision,
        "approvalId": e.approval,
        "lateAnswer": e.late_answer,
        "driverNode": e.claim_node,
    });
    if let Some(t) = &e.template {
        v["template"] = t.clone().into();
    }
    // A create served by a warm pool says so.
    if e.kind == ExecutionKind::Create && e.state == ExecutionState::Succeeded {
        v["pooled"] = s.computers.get(&e.computer_id).is_some_and(|c| c.pooled).into();
    }
    let mine = e.requester.token_id == caller.token.id
        || (e.requester.member_id == caller.member.id && e.requester.bot_id.is_none() && caller.bot.is_none());
    let paired = s.computers.get(&e.computer_id).is_some_and(|c| c.source == Source::Paired);
    if e.state == ExecutionState::Succeeded
        && mine
        && paired
        && let (Some(code), Some(exp)) = (&e.pairing_code, e.pairing_expires_at)
        && now < exp
    {
        v["pairingCode"] = code.clone().into();
        v["pairingExpiresAt"] = exp.into();
    }
    v
}

/// A lifecycle call's body that is missing or unreadable: the error names what it must carry.
fn key_body(r: axum::extract::rejection::JsonRejection) -> ApiError {
    use axum::extract::rejection::JsonRejection;
    match r {
        JsonRejection::MissingJsonContentType(_) | JsonRejection::JsonSyntaxError(_) => ApiError::invalid(
            "this call takes a JSON body {\"commandKey\": \"...\"}: a key of your own, 1 to 200 printable characters; the same key again answers the same receipt and does nothing twice",
        ),
        other => other.into(),
    }
}

fn check_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > 200 || key.chars().any(char::is_control) {
        return Err(ApiError::invalid("commandKey must be 1 to 200 printable characters"));
    }
    Ok(())
}

fn body_hash(v: &Value) -> String {
    hex::encode(sha2::Sha256::digest(v.to_string().as_bytes()))
}

/// `source` as the API takes it.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(tag = "_tag", deny_unknown_fields)]
pub enum SourceIn {
    Provider {
        provider: String,
        #[serde(default)]
        template: Option<String>,
    },
    Paired,
}

/// `POST /v1/computers` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewComputer {
    command_key: String,
    name: Option<String>,
    source: SourceIn,
    #[serde(default)]
    desktop: bool,
    /// Absent = 600; `null` = never.
    #[serde(default = "absent")]
    #[schema(value_type = Option<u64>)]
    pause_after: Value,
    #[serde(default)]
    shared: bool,
    /// Why (bots).
    reason: Option<String>,
    /// Environment variables for every session of a provider sandbox: names
    /// `[A-Za-z_][A-Za-z0-9_]*` (not `COMPUTER_AGENT_*`, the agent's own), at most 64, each
    /// value at most 4 KiB, 32 KiB in all. A paired Computer refuses it.
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    /// CPUs and memory of a provider sandbox, within the template's ceilings (docker: the
    /// template's `cpus` and `memoryMb`, also the defaults). E2B and Daytona refuse it: their
    /// template or snapshot fixes the size.
    #[serde(default)]
    resources: Option<ResourcesIn>,
    /// String labels, at most 32: keys `[A-Za-z0-9_.-]{1,64}` (not `computerd.…`), values at
    /// most 256 characters. Kept in the store, a filter of the list
    /// (`GET /v1/computers?metadata.k=v`), and passed to E2B (`metadata`) and Daytona (`labels`).
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    /// Where the sandbox may connect (docker providers with their own network; see
    /// `PUT /v1/computers/:id/egress`). A docker sandbox created with a policy sits behind an
    /// egress gateway from the start, so its policy can change while it runs; one created
    /// without cannot (`{"default": "allow"}` filters nothing and keeps that door open).
    #[serde(default)]
    egress: Option<super::egress::EgressIn>,
}

/// `resources` of a create.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResourcesIn {
    /// CPUs (fractions allowed), above 0.
    cpus: Option<f64>,
    /// Memory in MiB, at least 16.
    memory_mb: Option<u64>,
}

/// The most `env` entries of a create.
pub const MAX_ENV: usize = 64;
/// The longest `env` value, in bytes.
pub const MAX_ENV_VALUE: usize = 4 << 10;
/// The most bytes of `env`, names and values.
pub const MAX_ENV_TOTAL: usize = 32 << 10;
/// The most `metadata` entries.
pub const MAX_METADATA: usize = 32;
/// The longest `metadata` value, in characters.
pub const MAX_METADATA_VALUE: usize = 256;
/// The most records one list filtered by metadata examines: past it the page ends early, with
/// its `nextAfter`.
pub const MAX_FILTER_EXAMINED: usize = 10_000;

/// Checks a create's `env` (user input: each problem is named).
fn check_env(env: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if env.len() > MAX_ENV {
        return Err(ApiError::invalid(format!("env has {} entries: at most {MAX_ENV}", env.len())));
    }
    let mut total = 0;
    for (k, v) in env {
        let mut chars = k.chars();
        let named = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && k.len() <= 256;
        if !named {
            return Err(ApiError::invalid(format!(
                "env: {:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*, at most 256 bytes)",
                k.chars().take(64).collect::<String>()
            )));
        }
        if k.starts_with("COMPUTER_AGENT_") {
            return Err(ApiError::invalid(format!(
                "env: {k} is refused: COMPUTER_AGENT_* are the sandbox agent's own settings"
            )));
        }
        if v.len() > MAX_ENV_VALUE {
            return Err(ApiError::invalid(format!(
                "env: the value of {k} is {} bytes: at most {MAX_ENV_VALUE}",
                v.len()
            )));
        }
        if v.contains('\0') {
            return Err(ApiError::invalid(format!("env: the value of {k} holds a NUL byte")));
        }
        total += k.len() + v.len();
    }
    if total > MAX_ENV_TOTAL {
        return Err(ApiError::invalid(format!("env is {total} bytes (names and values): at most {MAX_ENV_TOTAL}")));
    }
    Ok(())
}

/// Whether `k` is a metadata key: `[A-Za-z0-9_.-]{1,64}`.
fn metadata_key(k: &str) -> bool {
    (1..=64).contains(&k.len()) && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Checks a create's `metadata` (user input: each problem is named).
fn check_metadata(m: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if m.len() > MAX_METADATA {
        return Err(ApiError::invalid(format!("metadata has {} keys: at most {MAX_METADATA}", m.len())));
    }
    for (k, v) in m {
        if !metadata_key(k) {
            return Err(ApiError::invalid(format!(
                "metadata: {:?} is not a key ([A-Za-z0-9_.-], 1 to 64 characters)",
                k.chars().take(80).collect::<String>()
            )));
        }
        if k.starts_with("computerd.") {
            return Err(ApiError::invalid(format!("metadata: {k} is refused: computerd.* keys are the cluster's own")));
        }
        if v.chars().count() > MAX_METADATA_VALUE || v.chars().any(char::is_control) {
            return Err(ApiError::invalid(format!(
                "metadata: the value of {k} must be at most {MAX_METADATA_VALUE} printable characters"
            )));
        }
    }
    Ok(())
}

/// Checks a create's `resources` in itself (the provider's ceilings are checked after).
fn check_resources(r: &ResourcesIn) -> Result<Option<Resources>, ApiError> {
    if let Some(c) = r.cpus
        && !(c.is_finite() && c > 0.0 && c <= 256.0)
    {
        return Err(ApiError::invalid("resources.cpus must be a number above 0 (at most 256)"));
    }
    if let Some(m) = r.memory_mb
        && !(16..=1 << 20).contains(&m)
    {
        return Err(ApiError::invalid("resources.memoryMb must be 16 to 1048576 (MiB)"));
    }
    Ok((r.cpus.is_some() || r.memory_mb.is_some()).then_some(Resources { cpus: r.cpus, memory_mb: r.memory_mb }))
}

fn absent() -> Value {
    json!("absent")
}

/// Submits an execution and answers 202 with its receipt (the existing one for a retry).
async fn submit(state: &AppState, caller: &Caller, submit: Submit) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = propose(state, Command::SubmitExecution(Box::new(submit)))
        .await?
        .ok_or_else(|| ApiError::new(computerd_proto::ErrorKind::Internal, "the store named no execution"))?;
    state.cluster.read_barrier().await?;
    let now = now_ms();
    let r = state.cluster.state().read(|s| s.executions.get(&id).map(|e| receipt(s, e, caller, now)));
    let r = r.ok_or_else(|| ApiError::not_found("no such execution"))?;
    Ok((StatusCode::ACCEPTED, Json(r)))
}

fn new_execution(key: &str, hash: String, kind: ExecutionKind, computer_id: &str, now: u64) -> Execution {
    Execution::pending(&new_id("exe"), key, &hash, kind, computer_id, now)
}

/// `POST /v1/computers`
#[utoipa::path(post, path = "/v1/computers", operation_id = "computers_create", tag = "computers", request_body = NewComputer, responses((status = 202, description = "Stored; the execution receipt", body = ReceiptDoc), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 422, description = "IdempotencyKeyReused", body = ErrorBody)), security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    auth: Auth,
    body: Body<NewComputer>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body?;
    check_key(&b.command_key)?;
    let pause_after = match &b.pause_after {
        Value::String(s) if s == "absent" => Some(600),
        Value::Null => None,
        Value::Number(n) => match n.as_u64() {
            Some(s) if (1..=MAX_PAUSE_AFTER).contains(&s) => Some(s),
            _ => return Err(ApiError::invalid(format!("pauseAfter must be 1..={MAX_PAUSE_AFTER} seconds, or null"))),
        },
        _ => return Err(ApiError::invalid("pauseAfter must be a number of seconds, or null")),
    };
    let source = match b.source {
        SourceIn::Provider { provider, template } => {
            check_id(&provider, "cpp", "source.provider")?;
            if let Some(t) = &template {
                check_name(t)
                    .map_err(|_| ApiError::invalid("source.template must be 1 to 200 printable characters"))?;
            }
            Source::Provider { provider, template }
        }
        SourceIn::Paired => Source::Paired,
    };
    let env = b.env.unwrap_or_default();
    check_env(&env)?;
    let metadata = b.metadata.unwrap_or_default();
    check_metadata(&metadata)?;
    let resources = match &b.resources {
        Some(r) => check_resources(r)?,
        None => None,
    };
    let egress = b.egress.map(super::egress::EgressIn::policy).transpose()?;
    match &source {
        Source::Paired if !env.is_empty() => {
            return Err(ApiError::invalid(
                "env applies to provider sandboxes: an own machine keeps its own environment",
            ));
        }
        Source::Paired if b.resources.is_some() => {
            return Err(ApiError::invalid("resources apply to provider sandboxes: an own machine has its own"));
        }
        Source::Paired if egress.is_some() => {
            return Err(ApiError::new(
                computerd_proto::ErrorKind::ComputerUnsupported,
                "an own machine's egress is its own: egress applies to provider sandboxes",
            ));
        }
        Source::Provider { provider, template } => {
            if let Some(policy) = &egress
                && let Some(p) = state.cluster.state().read(|s| s.providers.get(provider).cloned())
            {
                super::egress::check_provider(&p, policy)?;
            }
            if let Some(r) = &resources {
                // The ceilings are the provider's (its record as this node has applied it; one
                // not known here yet is refused by the store).
                let record = state.cluster.state().read(|s| s.providers.get(provider).cloned());
                if let Some(p) = record {
                    computerd_actors::factory::check_resources(&p, template.as_deref(), b.desktop, r)
                        .map_err(ApiError::invalid)?;
                }
            }
        }
        Source::Paired => {}
    }
    let name = match &b.name {
        Some(n) => check_name(n)?,
        None => "computer".to_string(),
    };
    if let Some(r) = &b.reason
        && r.len() > 2000
    {
        return Err(ApiError::invalid("reason must be at most 2000 bytes"));
    }
    let mut normalized = json!({
        "kind": "create", "name": name, "source": source, "desktop": b.desktop,
        "pauseAfter": pause_after, "shared": b.shared, "reason": b.reason,
    });
    // (Only when given, so a create without them keeps the body hash it always had.)
    if !env.is_empty() {
        normalized["env"] = json!(env);
    }
    if let Some(r) = &resources {
        normalized["resources"] = json!(r);
    }
    if !metadata.is_empty() {
        normalized["metadata"] = json!(metadata);
    }
    if let Some(p) = &egress {
        normalized["egress"] = json!(p);
    }
    let now = now_ms();
    let computer = Computer {
        id: new_id("cmp"),
        name,
        owner: caller.member.id.clone(),
        shared: b.shared,
        desktop: b.desktop,
        pause_after: if source == Source::Paired { None } else { pause_after },
        source,
        state: ComputerState::Starting,
        sandbox: None,
        active_execution: None,
        created_at: now,
        agent_credential: None,
        link_generation: 0,
        link_node: None,
        desktop_view: None,
        env,
        resources,
        metadata,
        egress,
        egress_denied_through: 0,
        egress_revision: 0,
        pooled: false,
    };
    let mut exe = new_execution(&b.command_key, body_hash(&normalized), ExecutionKind::Create, &computer.id, now);
    // An own machine pairs with a code shown to its creator; a sandbox whose provider starts our
    // agent is given its code by the adapter at create. Every create carries one: the store drops
    // it for a provider that starts no agent (this node's state may lag a new provider's record).
    exe.pairing_code = Some(pairing_code());
    exe.pairing_expires_at = Some(now + PAIRING_VALID_MS);
    let s = Submit {
        by: caller.token.id.clone(),
        execution: exe,
        computer: Some(computer),
        approval_id: new_id("apr"),
        reason: b.reason,
        at_ms: now,
    };
    submit(&state, &caller, s).await
}

/// A one-time pairing code: 10 characters of an unambiguous alphabet, grouped for reading.
fn pairing_code() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let bytes: [u8; 10] = rand::random();
    let chars: String = bytes.iter().map(|b| ALPHABET[(*b as usize) % ALPHABET.len()] as char).collect();
    format!("{}-{}", &chars[..5], &chars[5..])
}

/// `{"commandKey": …}` of pause, resume and delete.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KeyOnly {
    command_key: String,
}

async fn lifecycle(
    state: AppState,
    auth: Auth,
    id: String,
    kind: ExecutionKind,
    body: Body<KeyOnly>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body.map_err(key_body)?;
    check_key(&b.command_key)?;
    check_id(&id, "cmp", "computer id").map_err(|_| ApiError::not_found("no such computer"))?;
    let normalized = json!({"kind": kind, "computer": id});
    let exe = new_execution(&b.command_key, body_hash(&normalized), kind, &id, now_ms());
    submit_on_existing(&state, &caller, exe).await
}

/// Submits a lifecycle command on an existing Computer (no new record, no reason).
async fn submit_on_existing(
    state: &AppState,
    caller: &Caller,
    exe: Execution,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let s = Submit {
        by: caller.token.id.clone(),
        at_ms: exe.created_at,
        execution: exe,
        computer: None,
        approval_id: new_id("apr"),
        reason: None,
    };
    submit(state, caller, s).await
}

/// A run's `afterRun: pause`: a pause of the Computer its runtime worked on, with the
/// runtime's own rights, keyed by the run (asked twice, it is the same execution). Answers the
/// receipt.
pub async fn pause_after_run(state: &AppState, caller: &Caller, id: &str, run_id: &str) -> Result<Value, ApiError> {
    check_id(id, "cmp", "computerId").map_err(|_| ApiError::not_found("no such computer"))?;
    let now = now_ms();
    let normalized = json!({"kind": ExecutionKind::Pause, "computer": id});
    let key = format!("after-run:{run_id}");
    let s = Submit {
        by: caller.token.id.clone(),
        execution: new_execution(&key, body_hash(&normalized), ExecutionKind::Pause, id, now),
        computer: None,
        approval_id: new_id("apr"),
        reason: Some(format!("run {run_id} ended; its afterRun is pause")),
        at_ms: now,
    };
    Ok(submit(state, caller, s).await?.1.0)
}

/// How long a call waits for the resume of a paused Computer it needs.
const AUTO_RESUME_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A call on a paused Computer resumes it first, through a stored execution with the caller's
/// own rights (SPEC §1, §4); a resume already running (another caller's) is waited for instead.
/// Answers once the execution succeeded; its failure or unknown outcome is the call's error.
pub async fn resume_for_call(state: &AppState, caller: &Caller, id: &str) -> Result<(), ApiError> {
    let now = now_ms();
    let normalized = json!({"kind": ExecutionKind::Resume, "computer": id});
    let key = format!("auto-resume:{}", new_id("key"));
    let s = Submit {
        by: caller.token.id.clone(),
        execution: new_execution(&key, body_hash(&normalized), ExecutionKind::Resume, id, now),
        computer: None,
        approval_id: new_id("apr"),
        reason: Some("a call needs the paused computer".into()),
        at_ms: now,
    };
    let exe_id = match propose(state, Command::SubmitExecution(Box::new(s))).await {
        Ok(Some(exe)) => exe,
        Ok(None) => return Err(ApiError::new(computerd_proto::ErrorKind::Internal, "the store named no execution")),
        Err(e) if e.kind == computerd_proto::ErrorKind::ComputerConflict && e.execution_id.is_some() => {
            e.execution_id.unwrap_or_default()
        }
        Err(e) => return Err(e),
    };
    tracing::info!(computer_id = %id, execution_id = %exe_id, "resuming a paused computer for a call");
    let mut applied = state.cluster.state().subscribe();
    let deadline = tokio::time::Instant::now() + AUTO_RESUME_WAIT;
    loop {
        let seen = state.cluster.state().read(|s| s.executions.get(&exe_id).map(|e| (e.state, e.error.clone())));
        match seen {
            Some((ExecutionState::Succeeded, _)) => return Ok(()),
            Some((ExecutionState::Failed | ExecutionState::OutcomeUnknown, err)) => {
                let why = err.map(|e| e.message).unwrap_or_default();
                let mut e = ApiError::new(
                    computerd_proto::ErrorKind::ComputerExecutionFailed,
                    format!("the computer is paused and resuming it did not succeed: {why}"),
                );
                e.execution_id = Some(exe_id);
                return Err(e);
            }
            _ => {}
        }
        if tokio::time::timeout_at(deadline, applied.changed()).await.is_err() {
            let mut e = ApiError::new(computerd_proto::ErrorKind::Unavailable, "the computer is still resuming");
            e.execution_id = Some(exe_id);
            return Err(e);
        }
    }
}

/// `POST /v1/computers/:id/pause`
#[utoipa::path(post, path = "/v1/computers/{id}/pause", operation_id = "computers_pause", tag = "computers", params(("id" = String, Path)), request_body = KeyOnly, responses((status = 202, body = ReceiptDoc), (status = 409, description = "ComputerConflict (names the running execution)", body = ErrorBody), (status = 422, description = "ComputerUnsupported or IdempotencyKeyReused", body = ErrorBody)), security(("bearer" = [])))]
pub async fn pause(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<KeyOnly>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    lifecycle(state, auth, id, ExecutionKind::Pause, body).await
}

/// `POST /v1/computers/:id/resume`
#[utoipa::path(post, path = "/v1/computers/{id}/resume", operation_id = "computers_resume", tag = "computers", params(("id" = String, Path)), request_body = KeyOnly, responses((status = 202, body = ReceiptDoc), (status = 409, body = ErrorBody)), security(("bearer" = [])))]
pub async fn resume(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<KeyOnly>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    lifecycle(state, auth, id, ExecutionKind::Resume, body).await
}

/// `{"commandKey", "template"?}` of a recreate.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RecreateIn {
    command_key: String,
    /// The provider template of the new sandbox (a newer image, say); absent: the Computer's.
    #[serde(default)]
    template: Option<String>,
}

/// `POST /v1/computers/:id/recreate`
#[utoipa::path(post, path = "/v1/computers/{id}/recreate", operation_id = "computers_recreate", tag = "computers", params(("id" = String, Path)), request_body = RecreateIn, responses((status = 202, description = "A lifecycle execution: the sandbox is replaced by a new one (of `template` when given, which the Computer then keeps), and the tool runtime (installed packages, bindings and their state) carries over; a sandbox whose runtime is still in its writable layer is migrated first. Running processes and files outside the runtime are not kept. The Computer is `starting` until the new sandbox's agent links", body = ReceiptDoc), (status = 409, description = "ComputerConflict: another execution runs, or a tool switch is pending (named)", body = ErrorBody), (status = 422, description = "ComputerUnsupported (an own machine; a provider other than docker) or IdempotencyKeyReused", body = ErrorBody)), security(("bearer" = [])))]
pub async fn recreate(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<RecreateIn>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body.map_err(key_body)?;
    check_key(&b.command_key)?;
    check_id(&id, "cmp", "computer id").map_err(|_| ApiError::not_found("no such computer"))?;
    if let Some(t) = &b.template {
        check_name(t).map_err(|_| ApiError::invalid("template must be 1 to 200 printable characters"))?;
    }
    let normalized = json!({"kind": ExecutionKind::Recreate, "computer": id, "template": b.template});
    let now = now_ms();
    let mut exe = new_execution(&b.command_key, body_hash(&normalized), ExecutionKind::Recreate, &id, now);
    exe.template = b.template;
    // The new sandbox's agent pairs with a code of its own, which replaces the old agent's
    // credential when redeemed.
    exe.pairing_code = Some(pairing_code());
    exe.pairing_expires_at = Some(now + PAIRING_VALID_MS);
    submit_on_existing(&state, &caller, exe).await
}

/// `DELETE /v1/computers/:id`
#[utoipa::path(delete, path = "/v1/computers/{id}", operation_id = "computers_delete", tag = "computers", params(("id" = String, Path)), request_body = KeyOnly, responses((status = 202, body = ReceiptDoc), (status = 409, body = ErrorBody)), security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<KeyOnly>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    lifecycle(state, auth, id, ExecutionKind::Delete, body).await
}

/// `GET /v1/computers`: only rows the caller may see are read.
#[utoipa::path(get, path = "/v1/computers", operation_id = "computers_list", tag = "computers", params(ListQuery, ("metadata.{key}" = Option<String>, Query, description = "Only the Computers whose metadata has this key with this value; one or more (all must match). A filtered page examines at most 10,000 records: it may then be short, even empty, with a `nextAfter` to go on from")), responses((status = 200, description = "`{\"computers\": [...], \"nextAfter\": id|null}`: only those the caller may see, a page at a time (go on while `nextAfter` is not null)", body = Object), (status = 400, body = ErrorBody)), security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    auth: Auth,
    q: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let Query(pairs) = q.map_err(|e| ApiError::invalid(e.body_text()))?;
    let q = ListFilter::parse(pairs)?;
    let limit = q.limit.unwrap_or(computerd_raft::sm::MAX_COMPUTER_LIST);
    if !(1..=computerd_raft::sm::MAX_COMPUTER_LIST).contains(&limit) {
        return Err(ApiError::invalid("limit must be 1..=1000"));
    }
    let (rows, next): (Vec<Value>, Option<String>) = state.cluster.state().read(|s| {
        let (rows, next) = if q.metadata.is_empty() {
            s.computers_visible_to(&caller, q.after.as_deref(), limit)
        } else {
            let keep = |c: &Computer| q.metadata.iter().all(|(k, v)| c.metadata.get(k) == Some(v));
            s.computers_visible_where(&caller, q.after.as_deref(), limit, &keep, MAX_FILTER_EXAMINED)
        };
        (rows.into_iter().map(|c| computer_view(s, c)).collect(), next)
    });
    Ok(Json(json!({ "computers": rows, "nextAfter": next })))
}

/// `GET /v1/computers` query: a page of at most `limit` (default and most: 1000) Computers in
/// id order, after the id `after` (an earlier page's `nextAfter`); with `metadata.<key>=<value>`
/// (one or more), only the Computers whose metadata has all of them.
/// (The document's parameters: [`ListFilter`] reads the query.)
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct ListQuery {
    /// The most rows (1 to 1000, default 1000).
    limit: Option<usize>,
    /// The page after this id: the previous page's `nextAfter`.
    after: Option<String>,
}

/// A list's query as read: `limit`, `after`, and the metadata filters.
struct ListFilter {
    limit: Option<usize>,
    after: Option<String>,
    metadata: Vec<(String, String)>,
}

impl ListFilter {
    /// Reads the query's pairs (user input: each problem is named).
    fn parse(pairs: Vec<(String, String)>) -> Result<ListFilter, ApiError> {
        let mut q = ListFilter { limit: None, after: None, metadata: Vec::new() };
        for (k, v) in pairs {
            match k.as_str() {
                "limit" => {
                    q.limit = Some(v.parse().map_err(|_| ApiError::invalid("limit must be a number, 1..=1000"))?)
                }
                "after" => q.after = Some(v),
                _ => match k.strip_prefix("metadata.") {
                    Some(key) if metadata_key(key) => q.metadata.push((key.to_string(), v)),
                    Some(_) => {
                        return Err(ApiError::invalid(
                            "metadata.<key>: the key must be [A-Za-z0-9_.-], 1 to 64 characters",
                        ));
                    }
                    None => {
                        return Err(ApiError::invalid(format!(
                            "unknown query parameter {:?}: limit, after and metadata.<key> are taken",
                            k.chars().take(64).collect::<String>()
                        )));
                    }
                },
            }
        }
        if q.metadata.len() > MAX_METADATA {
            return Err(ApiError::invalid(format!("at most {MAX_METADATA} metadata.<key> filters")));
        }
        Ok(q)
    }
}

/// `GET /v1/computers/:id`: 404 when the caller may not see it.
#[utoipa::path(get, path = "/v1/computers/{id}", operation_id = "computers_get", tag = "computers", params(("id" = String, Path)), responses((status = 200, body = Object), (status = 404, body = ErrorBody)), security(("bearer" = [])))]
pub async fn get(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let v = state.cluster.state().read(|s| s.visible_computer(&caller, &id).map(|c| computer_view(s, c)))?;
    Ok(Json(v))
}

/// `GET /v1/computers/:id/sandbox`: asks the provider what it holds for this Computer (found by
/// its labels, not by the stored reference), so a person can settle an unknown outcome, or see
/// that a sandbox vanished. Changes nothing.
#[utoipa::path(get, path = "/v1/computers/{id}/sandbox", operation_id = "computers_sandbox", tag = "computers", params(("id" = String, Path)), responses((status = 200, description = "`{\"found\", \"sandbox\", \"state\", \"recorded\"}`", body = Object), (status = 422, description = "An own machine has no sandbox", body = ErrorBody)), security(("bearer" = [])))]
pub async fn sandbox(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let (computer, provider) = super::util::with_provider(&state, &caller, &id)?;
    let Some(provider) = provider else {
        return Err(ApiError::new(computerd_proto::ErrorKind::ComputerUnsupported, "an own machine has no sandbox"));
    };
    let (adapter, timeout) = state.providers.build(&provider);
    let found = tokio::time::timeout(timeout, adapter.inspect(&computer.id))
        .await
        .map_err(|_| ApiError::new(computerd_proto::ErrorKind::ComputerExecutionFailed, "the provider did not answer"))?
        .map_err(|e| ApiError::new(computerd_proto::ErrorKind::ComputerExecutionFailed, e.to_string()))?;
    Ok(Json(match found {
        Some(info) => {
            json!({"found": true, "sandbox": info.sandbox, "state": info.state, "recorded": computer.sandbox})
        }
        None => json!({"found": false, "recorded": computer.sandbox}),
    }))
}

/// `POST /v1/computers/:id/stop`: on a pause of unknown outcome, marks the Computer failed.
#[utoipa::path(post, path = "/v1/computers/{id}/stop", operation_id = "computers_stop", tag = "computers", params(("id" = String, Path)), responses((status = 200, description = "The Computer, now failed", body = Object), (status = 409, body = ErrorBody)), security(("bearer" = [])))]
pub async fn stop(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.for_write(&state).await?;
    propose(&state, Command::StopComputer { by: caller.token.id.clone(), computer_id: id.clone(), at_ms: now_ms() })
        .await?;
    state.cluster.read_barrier().await?;
    let v = state.cluster.state().read(|s| s.visible_computer(&caller, &id).map(|c| computer_view(s, c)))?;
    Ok(Json(v))
}

/// `GET /v1/computers/:id/usage`: run spans (also of a deleted Computer the caller could see):
/// the newest ones kept, and the older ones folded into totals (`folded`: how many, total ms).
#[utoipa::path(get, path = "/v1/computers/{id}/usage", operation_id = "computers_usage", tag = "computers", params(("id" = String, Path)), responses((status = 200, description = "`{\"spans\": [{start, end, endedBy, outcomeUnknown}], \"folded\": {spans, ms}}`: the newest 1,000 spans, and the older ones as totals", body = Object)), security(("bearer" = [])))]
pub async fn usage(State(state): State<AppState>, auth: Auth, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let caller = auth.current(&state).await?;
    let usage = state.cluster.state().read(|s| {
        let c = s.computers.get(&id).filter(|c| s.could_see(&caller, c));
        c.map(|_| (s.usage.get(&id).cloned().unwrap_or_default(), s.folded_usage(&id)))
    });
    let (spans, folded) = usage.ok_or_else(|| ApiError::not_found("no such computer"))?;
    Ok(Json(json!({ "computerId": id, "spans": spans, "folded": folded })))
}

/// `POST /v1/computers/:id/acquire` body.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireIn {
    reason: Option<String>,
}

/// `POST /v1/computers/:id/acquire` (bots): 200 when granted, 202 with an approval id when a
/// member must approve.
#[utoipa::path(post, path = "/v1/computers/{id}/acquire", operation_id = "computers_acquire", tag = "computers", params(("id" = String, Path)), request_body = AcquireIn, responses((status = 200, description = "Granted", body = Object), (status = 202, description = "Waits for an approval", body = Object)), security(("bearer" = [])))]
pub async fn acquire(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<AcquireIn>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body?;
    let cmd = Command::Acquire {
        by: caller.token.id.clone(),
        computer_id: id.clone(),
        approval_id: new_id("apr"),
        reason: b.reason,
        at_ms: now_ms(),
    };
    match propose(&state, cmd).await? {
        None => Ok((StatusCode::OK, Json(json!({"computerId": id, "granted": true})))),
        Some(approval) => Ok((
            StatusCode::ACCEPTED,
            Json(json!({"computerId": id, "granted": false, "approvalId": approval, "state": "pending"})),
        )),
    }
}

/// `POST /v1/computers/:id/release` body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseIn {
    #[serde(default)]
    destroy: bool,
    command_key: Option<String>,
}

/// `POST /v1/computers/:id/release` (bots): gives up the right; with `destroy`, deletes the
/// Computer instead (capability `computers.delete`; the grant ends with the Computer).
#[utoipa::path(post, path = "/v1/computers/{id}/release", operation_id = "computers_release", tag = "computers", params(("id" = String, Path)), request_body = ReleaseIn, responses((status = 200, body = Object), (status = 202, description = "destroy: the delete receipt", body = ReceiptDoc)), security(("bearer" = [])))]
pub async fn release(
    State(state): State<AppState>,
    auth: Auth,
    Path(id): Path<String>,
    body: Body<ReleaseIn>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = auth.for_write(&state).await?;
    let Json(b) = body?;
    let Some(bot) = caller.bot.clone() else {
        return Err(ApiError::invalid("only bots release; members revoke with DELETE .../bots/:botId"));
    };
    if b.destroy {
        let key = b.command_key.ok_or_else(|| ApiError::invalid("destroy needs a commandKey"))?;
        return lifecycle(state, auth, id, ExecutionKind::Delete, Ok(Json(KeyOnly { command_key: key }))).await;
    }
    let closing = super::tool_drain::open_bindings(&state, &bot.id, Some(&id)).await?;
    propose(&state, Command::DeleteGrant { by: caller.token.id.clone(), computer_id: id.clone(), bot_id: bot.id })
        .await?;
    super::tool_drain::drain_closed(&state, &caller.token.id, closing);
    Ok((StatusCode::OK, Json(json!({"computerId": id, "released": true}))))
}
