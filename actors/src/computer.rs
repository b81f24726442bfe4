//! `ComputerActor`: drives the lifecycle executions of one Computer, one at a time.
//!
//! Owns nothing durable: every step is a command in the replicated store. The driver
//! ([`crate::driver`]) sends it [`ComputerMessage::Run`] for executions it may claim. A run is:
//! claim (fences out other drivers) → dispatch (rights re-checked at commit; recorded before
//! the call; a lost answer is asked again with the same claim, never given up to a takeover that
//! would declare a call unknown that was never sent) → one provider call under a deadline →
//! finish. It never re-sends a dispatched call.

use std::time::Duration;

use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::ExecutionError;
use computerd_raft::sm::ExecutionKind;
use computerd_raft::sm::Outcome;
use computerd_raft::sm::ProviderKind;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::Source;
use ractor::Actor;
use ractor::ActorProcessingErr;
use ractor::ActorRef;
use tracing::Instrument;

use crate::factory::ProviderFactory;
use crate::now_ms;
use crate::provider::CreateSpec;
use crate::provider::ProviderError;

/// Executions this process has handed to a Computer actor and not yet seen end, each with its
/// Computer (so a crashed actor's executions can be released). Shared with the actors, which
/// remove an execution when its run ends.
pub type Inflight = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>;

/// How long a dispatch mark, or a finished call's answer, is retried into the store before
/// giving up (for an answer, a taking-over driver then declares it unknown).
const FINISH_PATIENCE: Duration = Duration::from_secs(60);

/// The actor behaviour (no config of its own).
pub struct ComputerActor;

/// What a Computer actor is started with.
pub struct ComputerArgs {
    /// The Computer.
    pub computer_id: String,
    /// The store.
    pub cluster: Cluster,
    /// Builds provider adapters.
    pub providers: ProviderFactory,
    /// Executions this process drives now (shared with the driver, which must not re-send them,
    /// and releases them if this actor crashes).
    pub inflight: Inflight,
}

/// Messages of a Computer actor.
pub enum ComputerMessage {
    /// Claim and run this execution to its end (no-op if it cannot be claimed).
    Run(String),
}

/// The state of a Computer actor.
pub struct ComputerActorState {
    args: ComputerArgs,
}

impl Actor for ComputerActor {
    type Msg = ComputerMessage;
    type State = ComputerActorState;
    type Arguments = ComputerArgs;

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        args: ComputerArgs,
    ) -> Result<ComputerActorState, ActorProcessingErr> {
        Ok(ComputerActorState { args })
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: ComputerMessage,
        state: &mut ComputerActorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ComputerMessage::Run(exe) => {
                // The span is attached to the future (never an `enter` guard held across awaits).
                let span = tracing::info_span!("execution", execution_id = %exe, computer_id = %state.args.computer_id);
                state.handle_run(&exe).instrument(span).await;
                state.args.inflight.lock().unwrap_or_else(|p| p.into_inner()).remove(&exe);
            }
        }
        Ok(())
    }
}

/// What a provider call ended with, as the store records it: `answer` is the provider's answer
/// (`None`: none came within `timeout`, so the call may have had its effect). Only an answer
/// that proves nothing happened fails the execution; a lost or late one leaves it unknown.
fn outcome(answer: Option<Result<Option<String>, ProviderError>>, timeout: Duration) -> Outcome {
    match answer {
        Some(Ok(sandbox)) => Outcome::Succeeded { sandbox },
        Some(Err(ProviderError::NotSent(m))) => {
            Outcome::Failed { error: ExecutionError { kind: "not_sent".into(), message: m } }
        }
        Some(Err(ProviderError::Rejected(m))) => {
            Outcome::Failed { error: ExecutionError { kind: "provider_rejected".into(), message: m } }
        }
        Some(Err(ProviderError::Refused { kind, message })) => {
            Outcome::Failed { error: ExecutionError { kind, message } }
        }
        Some(Err(ProviderError::Lost(m))) => Outcome::Unknown { reason: m },
        None => Outcome::Unknown { reason: format!("no answer within {timeout:?}") },
    }
}

/// The provider label of a call's metrics.
fn provider_name(kind: Option<ProviderKind>) -> &'static str {
    match kind {
        Some(ProviderKind::Docker) => "docker",
        Some(ProviderKind::E2b) => "e2b",
        Some(ProviderKind::Daytona) => "daytona",
        Some(ProviderKind::Fake) => "fake",
        None => "none",
    }
}

/// The call label of a provider call's metrics.
fn call_name(kind: ExecutionKind) -> &'static str {
    match kind {
        ExecutionKind::Create => "create",
        ExecutionKind::Pause => "pause",
        ExecutionKind::Resume => "resume",
        ExecutionKind::Delete => "delete",
        ExecutionKind::Recreate => "recreate",
    }
}

/// What a pool claim answered.
enum PoolAnswer {
    /// The create took this pool entry's sandbox and is finished.
    Claimed(String),
    /// No ready sandbox: the create is made cold.
    Miss,
    /// Refused (a stale claim, lost rights) or unanswered: this run ends here.
    Refused,
}

/// What a create or recreate of execution `exe` asks of the provider.
fn create_spec(
    exe: &computerd_raft::sm::Execution,
    computer: &computerd_raft::sm::Computer,
    first_uid: Option<u32>,
) -> CreateSpec {
    let (template, desktop) = match &computer.source {
        Source::Provider { template, .. } => (exe.template.clone().or_else(|| template.clone()), computer.desktop),
        Source::Paired => (None, false),
    };
    CreateSpec {
        computer_id: computer.id.clone(),
        command_key: exe.command_key.clone(),
        template,
        desktop,
        pairing_code: exe.pairing_code.clone(),
        first_uid,
        env: computer.env.clone(),
        resources: computer.resources,
        metadata: computer.metadata.clone(),
        egress: computer.egress.clone(),
    }
}

/// The deadline of a recreate's provider call (at least): a migration loads and verifies up to
/// 8 GiB and 100,000 files.
pub const RECREATE_DEADLINE: Duration = Duration::from_secs(20 * 60);

fn new_claim() -> String {
    format!("clm_{}", hex::encode(rand::random::<[u8; 12]>()))
}

impl ComputerActorState {
    async fn propose(&self, cmd: Command) -> Option<Response> {
        match self.args.cluster.propose(Request::new(cmd)).await {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(computer_id = %self.args.computer_id, error = %e, "store unavailable");
                None
            }
        }
    }

    async fn handle_run(&mut self, exe_id: &str) {
        let claim = new_claim();
        let claimed = Command::ClaimExecution {
            execution_id: exe_id.into(),
            claim: claim.clone(),
            node: Some(self.args.cluster.id()),
            at_ms: now_ms(),
        };
        if !matches!(self.propose(claimed).await, Some(Response::Ok)) {
            return;
        }
        let snapshot = self.args.cluster.state().read(|s| {
            let exe = s.executions.get(exe_id)?.clone();
            let computer = s.computers.get(&exe.computer_id)?.clone();
            let provider = match &computer.source {
                Source::Provider { provider, .. } => s.providers.get(provider).cloned(),
                Source::Paired => None,
            };
            let first_uid = s.uid_ranges.first_uid(&computer.id);
            Some((exe, computer, provider, first_uid))
        });
        let Some((exe, computer, provider, first_uid)) = snapshot else { return };

        // A provider sandbox needs an adapter; failing to build one is a failure before sending.
        let adapter = match (&computer.source, &provider) {
            (Source::Paired, _) => None,
            (Source::Provider { .. }, Some(p)) => Some(self.args.providers.build(p)),
            (Source::Provider { .. }, None) => {
                let error = ExecutionError { kind: "not_sent".into(), message: "the provider no longer exists".into() };
                self.finish(exe_id, &claim, Outcome::Failed { error }).await;
                return;
            }
        };
        // A create its provider's warm pool can serve claims a ready sandbox there: one store
        // command dispatches and finishes it, so nothing is sent and nothing is in doubt.
        if exe.kind == ExecutionKind::Create
            && let Some((adapter, _)) = &adapter
        {
            let spec = create_spec(&exe, &computer, first_uid);
            if let Some(key) = adapter.pool_key(&spec) {
                let provider = provider.as_ref().map(|p| p.id.clone()).unwrap_or_default();
                match self.pool_claim(exe_id, &claim, &key).await {
                    PoolAnswer::Claimed(pool_id) => {
                        metrics::counter!("computerd_pool_claims_total", "provider" => provider, "key" => key)
                            .increment(1);
                        let sandbox =
                            self.args.cluster.state().read(|s| s.computers.get(&computer.id)?.sandbox.clone());
                        tracing::info!(pool_id = %pool_id, "the create claimed a pooled sandbox");
                        // Its Computer's name (the pool keeper names it too if this fails).
                        if let Some(sandbox) = sandbox
                            && let Err(e) = adapter.pool_claimed(&sandbox, &computer.id).await
                        {
                            tracing::warn!(pool_id = %pool_id, error = %e, "the claimed sandbox keeps its pool name for now");
                        }
                        return;
                    }
                    PoolAnswer::Miss => {
                        metrics::counter!("computerd_pool_misses_total", "provider" => provider, "key" => key)
                            .increment(1);
                    }
                    PoolAnswer::Refused => return,
                }
            }
        }
        match self.dispatch(exe_id, &claim).await {
            Some(true) => {}
            Some(false) => return,
            None => {
                // Whether the mark was recorded is not known, but nothing was sent: the execution
                // fails as not sent (never left dispatched for a takeover to declare unknown).
                let message = "the dispatch could not be recorded in time; nothing was sent".into();
                let error = ExecutionError { kind: "not_sent".into(), message };
                self.finish(exe_id, &claim, Outcome::Failed { error }).await;
                return;
            }
        }

        let outcome = match adapter {
            // Own machines: nothing to call; the pairing code was stored with the execution.
            None => Outcome::Succeeded { sandbox: None },
            Some((adapter, timeout)) => {
                let recorded = computer.sandbox.clone().or_else(|| adapter.reference_of(&computer.id));
                let call = async {
                    // A create whose answer was lost and then decided succeeded recorded no
                    // reference: find the sandbox by its labels first (a read, which changes
                    // nothing; failing it, nothing was sent).
                    let sandbox = match (&recorded, exe.kind) {
                        (Some(s), _) => s.clone(),
                        (None, ExecutionKind::Create) => String::new(),
                        (None, _) => match adapter.inspect(&computer.id).await {
                            Ok(Some(info)) => info.sandbox,
                            Ok(None) => String::new(),
                            Err(e) => {
                                return Err(ProviderError::NotSent(format!("finding the sandbox by its labels: {e}")));
                            }
                        },
                    };
                    let spec = || create_spec(&exe, &computer, first_uid);
                    match exe.kind {
                        ExecutionKind::Create => adapter.create(&spec()).await.map(Some),
                        ExecutionKind::Recreate => adapter.recreate(&sandbox, &spec()).await.map(Some),
                        ExecutionKind::Pause => adapter.pause(&sandbox, &exe.command_key).await.map(|()| None),
                        ExecutionKind::Resume => adapter.resume(&sandbox, &exe.command_key).await.map(|()| None),
                        ExecutionKind::Delete => {
                            adapter.delete_computer(&sandbox, &computer.id, &exe.command_key).await.map(|()| None)
                        }
                    }
                };
                let started = std::time::Instant::now();
                // A recreate may move a runtime of gigabytes first (the provider's own requests
                // keep their deadline; the migration's stream has its own).
                let timeout =
                    if exe.kind == ExecutionKind::Recreate { timeout.max(RECREATE_DEADLINE) } else { timeout };
                let answer = tokio::time::timeout(timeout, call).await.ok();
                let result = match &answer {
                    Some(Ok(_)) => "ok",
                    Some(Err(ProviderError::NotSent(_))) => "not_sent",
                    Some(Err(ProviderError::Rejected(_) | ProviderError::Refused { .. })) => "rejected",
                    Some(Err(ProviderError::Lost(_))) => "lost",
                    None => "timeout",
                };
                metrics::histogram!(
                    "computerd_provider_call_seconds",
                    "provider" => provider_name(provider.as_ref().map(|p| p.kind)),
                    "call" => call_name(exe.kind),
                    "result" => result,
                )
                .record(started.elapsed().as_secs_f64());
                outcome(answer, timeout)
            }
        };
        tracing::info!(outcome = ?outcome, "provider call ended");
        self.finish(exe_id, &claim, outcome).await;
    }

    /// Claims a ready sandbox of pool `key` for create `exe_id` (a lost answer is asked again
    /// with the same claim: the store answers a repeat as stale, and the execution's state
    /// then tells whether the first was taken).
    async fn pool_claim(&self, exe_id: &str, claim: &str, key: &str) -> PoolAnswer {
        let cmd =
            Command::PoolClaim { execution_id: exe_id.into(), claim: claim.into(), key: key.into(), at_ms: now_ms() };
        match self.propose(cmd).await {
            Some(Response::Id(pool_id)) => PoolAnswer::Claimed(pool_id),
            Some(Response::Rejected(r)) if r.kind == computerd_raft::sm::RejectKind::NotFound => PoolAnswer::Miss,
            Some(Response::Rejected(r)) => {
                tracing::info!(reason = %r.message, "the pool claim was refused");
                PoolAnswer::Refused
            }
            // No answer: whether it was taken shows in the store; a takeover settles the rest
            // (a claimed create is finished; an unclaimed one is still undispatched).
            Some(Response::Ok) | None => PoolAnswer::Refused,
        }
    }

    /// Records the dispatch mark before the call is sent; answers whether to send it (`None`:
    /// no answer in time). A lost answer is asked again with the same claim, which the store
    /// answers as it did the first time (a dispatch is idempotent for its claimant).
    async fn dispatch(&self, exe_id: &str, claim: &str) -> Option<bool> {
        let deadline = tokio::time::Instant::now() + FINISH_PATIENCE;
        loop {
            let cmd = Command::DispatchExecution { execution_id: exe_id.into(), claim: claim.into(), at_ms: now_ms() };
            match self.propose(cmd).await {
                Some(Response::Rejected(r)) => {
                    tracing::info!(reason = %r.message, "not dispatched");
                    return Some(false);
                }
                Some(_) => return Some(true),
                None if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None => return None,
            }
        }
    }

    /// Records the outcome, retrying while the store is unavailable (finishing twice is refused
    /// harmlessly by the claim check).
    async fn finish(&self, exe_id: &str, claim: &str, outcome: Outcome) {
        let deadline = tokio::time::Instant::now() + FINISH_PATIENCE;
        loop {
            let cmd = Command::FinishExecution {
                execution_id: exe_id.into(),
                claim: claim.into(),
                outcome: outcome.clone(),
                at_ms: now_ms(),
            };
            match self.propose(cmd).await {
                Some(Response::Rejected(r)) => tracing::info!(reason = %r.message, "finish refused"),
                Some(_) => {}
                None if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                None => tracing::warn!("could not record the outcome; a takeover will declare it unknown"),
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(3);

    fn failed(kind: &str, message: &str) -> Outcome {
        Outcome::Failed { error: ExecutionError { kind: kind.into(), message: message.into() } }
    }

    #[test]
    fn an_answer_succeeds_with_its_sandbox() {
        assert_eq!(outcome(Some(Ok(Some("sbx".into()))), T), Outcome::Succeeded { sandbox: Some("sbx".into()) });
        assert_eq!(outcome(Some(Ok(None)), T), Outcome::Succeeded { sandbox: None });
    }

    #[test]
    fn nothing_sent_or_refused_fails() {
        assert_eq!(outcome(Some(Err(ProviderError::NotSent("down".into()))), T), failed("not_sent", "down"));
        assert_eq!(outcome(Some(Err(ProviderError::Rejected("no".into()))), T), failed("provider_rejected", "no"));
    }

    #[test]
    fn a_lost_or_late_answer_is_unknown() {
        assert_eq!(
            outcome(Some(Err(ProviderError::Lost("reset".into()))), T),
            Outcome::Unknown { reason: "reset".into() }
        );
        assert_eq!(outcome(None, T), Outcome::Unknown { reason: "no answer within 3s".into() });
    }
}
