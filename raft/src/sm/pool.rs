//! Warm pools (store version 7): sandboxes made ahead of any create, each recorded with the
//! hash of the token its agent waits with, and claimed by at most one create.
//!
//! A pool entry is added once its sandbox runs (`PoolAdd`), becomes ready when its agent waits
//! (`PoolReady`, the token checked), and is claimed by a create in one command (`PoolClaim`):
//! the claim re-checks the create's rights as a dispatch does, and finishes the create with the
//! pooled sandbox, so no provider call is in doubt and no sandbox is claimed twice. The
//! leader's pool keeper removes an entry (`PoolRemove`) once its claimant linked or is gone, or
//! when its sandbox never became ready. Entries are bounded per provider and in all.

use serde::Deserialize;
use serde::Serialize;

use super::model::ComputerState;
use super::model::ExecutionKind;
use super::model::ExecutionState;
use super::model::ProviderKind;
use super::model::Source;
use super::response::Reject;
use super::response::RejectKind;
use super::state::State;

/// The most pool entries one provider has (ready, starting and claimed ones together).
pub const MAX_POOL_ENTRIES_PER_PROVIDER: usize = 32;
/// The most pool entries in all.
pub const MAX_POOL_ENTRIES: usize = 256;

/// One pooled sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolEntry {
    /// `pool_…`
    pub id: String,
    /// The provider that made it.
    pub provider: String,
    /// The template key it serves.
    pub key: String,
    /// The provider's reference.
    pub sandbox: String,
    /// Hex SHA-256 of the token its agent waits with (never the secret).
    pub token_hash: String,
    /// Unix ms.
    pub created_at: u64,
    /// When its agent first waited (Unix ms): only ready entries are claimed.
    #[serde(default)]
    pub ready_at: Option<u64>,
    /// The Computer that claimed it.
    #[serde(default)]
    pub claimed_by: Option<String>,
    /// The create execution that claimed it (its pairing code is the agent's).
    #[serde(default)]
    pub claim_execution: Option<String>,
}

fn invalid(message: &str) -> Reject {
    Reject::new(RejectKind::Invalid, message)
}

impl State {
    /// The pool entries of `provider`.
    pub fn pool_of<'a>(&'a self, provider: &'a str) -> impl Iterator<Item = &'a PoolEntry> + 'a {
        self.pool.values().filter(move |e| e.provider == provider)
    }

    pub(crate) fn pool_add(&mut self, entry: &PoolEntry) -> Result<(), Reject> {
        let docker = self.providers.get(&entry.provider).is_some_and(|p| p.kind == ProviderKind::Docker);
        if !docker {
            return Err(invalid("a pool belongs to a docker provider"));
        }
        let fits = |s: &str, max: usize| !s.is_empty() && s.len() <= max;
        if !(entry.id.starts_with("pool_")
            && fits(&entry.id, 64)
            && fits(&entry.key, 128)
            && fits(&entry.sandbox, 256)
            && entry.token_hash.len() == 64)
        {
            return Err(invalid("a pool entry needs an id (pool_…), a key, a sandbox and a token hash"));
        }
        if entry.ready_at.is_some() || entry.claimed_by.is_some() || entry.claim_execution.is_some() {
            return Err(invalid("a pool entry starts unready and unclaimed"));
        }
        if self.pool.contains_key(&entry.id) {
            return Err(Reject::new(RejectKind::Conflict, "the pool entry exists"));
        }
        if self.pool.len() >= MAX_POOL_ENTRIES || self.pool_of(&entry.provider).count() >= MAX_POOL_ENTRIES_PER_PROVIDER
        {
            return Err(Reject::new(RejectKind::Conflict, "the provider's pool is full"));
        }
        self.pool.insert(entry.id.clone(), entry.clone());
        Ok(())
    }

    /// The agent of pool entry `id` waits, showing its token.
    pub(crate) fn pool_ready(&mut self, id: &str, token_hash: &str, at: u64) -> Result<(), Reject> {
        let refused = || Reject::new(RejectKind::Unauthorized, "the pool token is not valid");
        let e = self.pool.get_mut(id).ok_or_else(refused)?;
        if e.token_hash != token_hash {
            return Err(refused());
        }
        if e.ready_at.is_none() {
            e.ready_at = Some(at);
        }
        Ok(())
    }

    /// A create claims a ready sandbox of pool `key`: dispatched (its rights re-checked) and
    /// finished with that sandbox at once. Answers the pool entry's id; no ready sandbox (a
    /// miss) is `NotFound` and changes nothing.
    pub(crate) fn pool_claim(&mut self, exe_id: &str, claim: &str, key: &str, at: u64) -> Result<String, Reject> {
        let exe =
            self.executions.get(exe_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such execution"))?.clone();
        if exe.kind != ExecutionKind::Create
            || exe.state != ExecutionState::Running
            || exe.claim.as_deref() != Some(claim)
            || exe.dispatched_at.is_some()
        {
            return Err(Reject::new(RejectKind::Conflict, "stale claim"));
        }
        let provider = match self.computers.get(&exe.computer_id).map(|c| &c.source) {
            Some(Source::Provider { provider, .. }) => provider.clone(),
            _ => return Err(invalid("only a provider's sandbox comes from a pool")),
        };
        let entry = self
            .pool_of(&provider)
            .find(|e| e.key == key && e.ready_at.is_some() && e.claimed_by.is_none())
            .map(|e| (e.id.clone(), e.sandbox.clone()))
            .ok_or_else(|| Reject::new(RejectKind::NotFound, "no ready sandbox in the pool"))?;
        // The dispatch's own checks (rights, placement); a refusal there fails the execution.
        self.dispatch(exe_id, claim, at)?;
        let (id, sandbox) = entry;
        if let Some(e) = self.pool.get_mut(&id) {
            e.claimed_by = Some(exe.computer_id.clone());
            e.claim_execution = Some(exe_id.to_string());
        }
        if let Some(c) = self.computers.get_mut(&exe.computer_id) {
            c.pooled = true;
        }
        self.finish_succeeded(exe_id, Some(sandbox), at);
        Ok(id)
    }

    /// The pool keeper removes an entry: claimed, once its Computer linked or is gone; else
    /// one whose sandbox is gone or never became ready.
    pub(crate) fn pool_remove(&mut self, id: &str) -> Result<(), Reject> {
        let e = self.pool.get(id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such pool entry"))?;
        if let Some(c) = &e.claimed_by {
            let settled = self
                .computers
                .get(c)
                .is_none_or(|c| c.state == ComputerState::Deleted || c.link_generation > 0 || c.sandbox.is_none());
            // The agent may still pair with the claim's code (not redeemed, not expired).
            let clock = self.clock;
            let open = e
                .claim_execution
                .as_ref()
                .and_then(|x| self.executions.get(x))
                .is_some_and(|x| x.pairing_code.is_some() && x.pairing_expires_at.is_some_and(|t| t > clock));
            if !settled && open {
                return Err(Reject::new(RejectKind::Conflict, "the claimant's agent has not linked yet"));
            }
        }
        self.pool.remove(id);
        Ok(())
    }

    /// What the agent of pool entry `id` is to become, once claimed: (Computer id, pairing code).
    pub fn pool_assignment(&self, id: &str) -> Option<(String, Option<String>)> {
        let e = self.pool.get(id)?;
        let computer = e.claimed_by.clone()?;
        let code = e.claim_execution.as_ref().and_then(|x| self.executions.get(x)).and_then(|x| x.pairing_code.clone());
        Some((computer, code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::Execution;
    use crate::sm::Provider;
    use crate::sm::Submit;
    use crate::sm::hash_secret;
    use crate::sm::testing;
    use crate::sm::testing::ok;
    use crate::sm::testing::rejected;

    /// `testing::world` with the docker provider `cpp_d`.
    fn world() -> State {
        let mut s = testing::world();
        let provider = Provider {
            id: "cpp_d".into(),
            kind: ProviderKind::Docker,
            name: "d".into(),
            config: Default::default(),
            secrets: Default::default(),
            created_by: "mem_o".into(),
            created_at: 1,
        };
        ok(s.apply(&Command::CreateProvider { by: testing::OWNER.into(), provider }));
        s
    }

    fn entry(id: &str, provider: &str) -> PoolEntry {
        PoolEntry {
            id: id.into(),
            provider: provider.into(),
            key: "default".into(),
            sandbox: format!("sbx-{id}"),
            token_hash: hash_secret(&format!("token-{id}")),
            created_at: 1,
            ready_at: None,
            claimed_by: None,
            claim_execution: None,
        }
    }

    /// Submits and claims the create of `computer` (with a pairing code); answers its execution.
    fn claimed_create(s: &mut State, computer: &str) -> String {
        let source = Source::Provider { provider: "cpp_d".into(), template: None };
        let mut exe = Execution::pending(&format!("exe_{computer}"), computer, "h", ExecutionKind::Create, computer, 1);
        exe.pairing_code = Some(format!("code-{computer}"));
        exe.pairing_expires_at = Some(1_000_000);
        let submit = Command::SubmitExecution(Box::new(Submit {
            by: testing::OWNER.into(),
            execution: exe,
            computer: Some(testing::computer(computer, "mem_o", source)),
            approval_id: format!("apr_{computer}"),
            reason: None,
            at_ms: 1,
        }));
        let id = ok(s.apply(&submit)).unwrap_or_default();
        ok(s.apply(&Command::ClaimExecution { execution_id: id.clone(), claim: "k".into(), node: None, at_ms: 2 }));
        id
    }

    fn claim(exe: &str) -> Command {
        Command::PoolClaim { execution_id: exe.into(), claim: "k".into(), key: "default".into(), at_ms: 3 }
    }

    /// Issue 42, item 1: a create claims a ready pooled sandbox in one command, which finishes
    /// it with that sandbox; no sandbox is claimed twice, a miss changes nothing, and the entry
    /// stays until the claimant's agent linked.
    #[test]
    fn i42_a_ready_pooled_sandbox_is_claimed_once() {
        let mut s = world();
        ok(s.apply(&Command::PoolAdd { entry: entry("pool_1", "cpp_d") }));
        let a = claimed_create(&mut s, "cmp_a");
        let before = s.clone();
        let miss = rejected(s.apply(&claim(&a)));
        assert_eq!(miss.kind, RejectKind::NotFound, "an unready sandbox is not claimed");
        assert_eq!(s, before, "a miss changes nothing");
        let wrong = Command::PoolReady { pool_id: "pool_1".into(), token_hash: hash_secret("guess"), at_ms: 2 };
        assert_eq!(rejected(s.apply(&wrong)).kind, RejectKind::Unauthorized);
        let ready = Command::PoolReady { pool_id: "pool_1".into(), token_hash: hash_secret("token-pool_1"), at_ms: 2 };
        ok(s.apply(&ready));

        assert_eq!(ok(s.apply(&claim(&a))).as_deref(), Some("pool_1"));
        let (exe, c) = (&s.executions[&a], &s.computers["cmp_a"]);
        assert_eq!((exe.state, exe.dispatched_at), (ExecutionState::Succeeded, Some(3)));
        assert_eq!((c.sandbox.as_deref(), c.pooled, c.state), (Some("sbx-pool_1"), true, ComputerState::Starting));
        assert_eq!(s.pool_assignment("pool_1"), Some(("cmp_a".into(), Some("code-cmp_a".into()))));
        assert_eq!(rejected(s.apply(&claim(&a))).kind, RejectKind::Conflict, "a finished create claims nothing");

        let b = claimed_create(&mut s, "cmp_b");
        assert_eq!(rejected(s.apply(&claim(&b))).kind, RejectKind::NotFound, "the one sandbox is taken");
        assert_eq!(s.executions[&b].dispatched_at, None, "the miss left the create to be made cold");

        let early = Command::PoolRemove { pool_id: "pool_1".into() };
        assert_eq!(rejected(s.apply(&early)).kind, RejectKind::Conflict, "the agent has not paired yet");
        ok(s.apply(&Command::RedeemPairing {
            code: "code-cmp_a".into(),
            credential_hash: hash_secret("cred"),
            at_ms: 4,
        }));
        let up =
            Command::LinkUp { computer_id: "cmp_a".into(), credential_hash: hash_secret("cred"), node_id: 1, at_ms: 5 };
        ok(s.apply(&up));
        assert_eq!(s.computers["cmp_a"].state, ComputerState::Running);
        ok(s.apply(&Command::PoolRemove { pool_id: "pool_1".into() }));
        assert!(s.pool.is_empty());
    }

    /// Pools are bounded per provider, belong to docker providers, and are store version 7.
    #[test]
    fn i42_pools_are_bounded_and_version_7() {
        let mut s = world();
        let fake = rejected(s.apply(&Command::PoolAdd { entry: entry("pool_f", "cpp_1") }));
        assert_eq!(fake.kind, RejectKind::Invalid, "{fake:?}");
        let mut bad = entry("pool_x", "cpp_d");
        bad.ready_at = Some(1);
        assert_eq!(rejected(s.apply(&Command::PoolAdd { entry: bad })).kind, RejectKind::Invalid);
        for i in 0..MAX_POOL_ENTRIES_PER_PROVIDER {
            ok(s.apply(&Command::PoolAdd { entry: entry(&format!("pool_{i}"), "cpp_d") }));
        }
        let full = rejected(s.apply(&Command::PoolAdd { entry: entry("pool_over", "cpp_d") }));
        assert_eq!((full.kind, s.pool.len()), (RejectKind::Conflict, MAX_POOL_ENTRIES_PER_PROVIDER));
        assert_eq!(rejected(s.apply(&Command::PoolAdd { entry: entry("pool_0", "cpp_d") })).kind, RejectKind::Conflict);
        ok(s.apply(&Command::PoolRemove { pool_id: "pool_0".into() }));
        assert_eq!(s.pool.len(), MAX_POOL_ENTRIES_PER_PROVIDER - 1, "an unclaimed entry goes at once");
        assert_eq!(Command::PoolRemove { pool_id: "pool_0".into() }.since(), 7);
        assert_eq!(claim("exe").since(), 7);
    }
}
