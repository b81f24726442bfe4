//! The pool keeper: on the leader, keeps each provider's warm pools at the size its config asks
//! (see `computerd_raft::sm::PoolEntry` for the store's side).
//!
//! Each pass (every [`PASS_EVERY`]), per provider with a pool:
//! - **fills**: a key with fewer unclaimed sandboxes than its size gets one more, made by a task
//!   of its own, at most one at a time per provider (so a create that asks for a template with no
//!   pool waits behind at most one pooled create at the engine). The sandbox is made first and
//!   recorded after (`PoolAdd`); a failure waits [`FILL_BACKOFF`] before the next try;
//! - **names** claimed sandboxes after their Computers (a create names its own at once; this
//!   catches one whose creator stopped first), and forgets their entries once the store says
//!   they are settled (`PoolRemove`: the agent linked, or the Computer is gone);
//! - **removes** unclaimed sandboxes that are not running, never became ready within
//!   [`READY_PATIENCE`], or are more than the size asks (the config shrank);
//! - every [`SWEEP_EVERY`] while the provider has a pool or entries (the first time on a new
//!   leader's first pass), **sweeps** the provider's pooled sandboxes that no entry names and no
//!   Computer's name was given (a crash between making one and recording it), once they are
//!   [`READY_PATIENCE`] old.

use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::PoolEntry;
use computerd_raft::sm::Provider as ProviderRecord;
use computerd_raft::sm::ProviderKind;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::hash_secret;
use tokio::sync::watch;

use crate::factory::ProviderFactory;
use crate::now_ms;
use crate::provider::Provider;

/// How often the keeper looks.
pub const PASS_EVERY: Duration = Duration::from_secs(1);
/// How long a pooled sandbox's agent has to wait in the pool before the sandbox is removed.
pub const READY_PATIENCE: Duration = Duration::from_secs(60);
/// How often the pooled sandboxes no entry names are looked for.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How long a provider's fills wait after one failed.
pub const FILL_BACKOFF: Duration = Duration::from_secs(10);

/// A provider's adapter, kept while its record stays the same.
struct Adapter {
    record: ProviderRecord,
    adapter: Arc<dyn Provider>,
    /// The fill under way, if any.
    fill: Option<tokio::task::JoinHandle<bool>>,
    /// No fill before this (one failed).
    quiet_until: Option<Instant>,
    /// Claimed sandboxes already given their Computer's name.
    named: HashSet<String>,
    /// When the last sweep ran.
    swept: Option<Instant>,
}

impl Drop for Adapter {
    fn drop(&mut self) {
        if let Some(f) = self.fill.take() {
            f.abort();
        }
    }
}

/// Runs the keeper until `stop`.
pub async fn run_pool_keeper(cluster: Cluster, providers: ProviderFactory, mut stop: watch::Receiver<bool>) {
    let mut adapters: HashMap<String, Adapter> = HashMap::new();
    while crate::tick(PASS_EVERY, &mut stop).await {
        if cluster.view().leader_id != Some(cluster.id()) {
            // A new leader sweeps on its first pass.
            adapters.clear();
            continue;
        }
        let records: Vec<ProviderRecord> = cluster
            .state()
            .read(|s| s.providers.values().filter(|p| p.kind == ProviderKind::Docker).cloned().collect());
        adapters.retain(|id, a| records.iter().any(|r| &r.id == id && *r == a.record));
        for record in records {
            let a = adapters.entry(record.id.clone()).or_insert_with(|| Adapter {
                adapter: providers.build(&record).0,
                record: record.clone(),
                fill: None,
                quiet_until: None,
                named: HashSet::new(),
                swept: None,
            });
            pass(&cluster, a).await;
        }
    }
}

/// One pass over one provider.
async fn pass(cluster: &Cluster, a: &mut Adapter) {
    let provider = a.record.id.clone();
    let wants = a.adapter.pools();
    let entries: Vec<PoolEntry> = cluster.state().read(|s| s.pool_of(&provider).cloned().collect());
    // A provider with no pool and no entries has nothing to keep (a pool's leftovers are swept
    // while it has one).
    if wants.is_empty() && entries.is_empty() {
        return;
    }
    // A finished fill: a failure quiets the provider's fills for a while.
    if a.fill.as_ref().is_some_and(|f| f.is_finished())
        && let Some(f) = a.fill.take()
        && !f.await.unwrap_or(false)
    {
        a.quiet_until = Some(Instant::now() + FILL_BACKOFF);
    }

    // Claimed: named after the Computer, forgotten once settled.
    for e in entries.iter().filter(|e| e.claimed_by.is_some()) {
        let Some(computer) = &e.claimed_by else { continue };
        if !a.named.contains(&e.id) {
            match a.adapter.pool_claimed(&e.sandbox, computer).await {
                Ok(()) => {
                    a.named.insert(e.id.clone());
                }
                Err(err) => tracing::warn!(pool_id = %e.id, error = %err, "cannot name a claimed sandbox"),
            }
        }
        if a.named.contains(&e.id) && propose(cluster, Command::PoolRemove { pool_id: e.id.clone() }).await {
            a.named.remove(&e.id);
        }
    }

    // The provider's pooled sandboxes as it has them (for the sweep and the dead ones).
    let sweep = a.swept.is_none_or(|t| t.elapsed() >= SWEEP_EVERY);
    let listed = if sweep {
        // Tried again after SWEEP_EVERY either way (an engine that is down is not asked every pass).
        a.swept = Some(Instant::now());
        match a.adapter.pool_list(&provider).await {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(provider = %provider, error = %e, "cannot list the pooled sandboxes");
                None
            }
        }
    } else {
        None
    };
    let now = now_ms();
    let patience = READY_PATIENCE.as_millis() as u64;
    // Unclaimed entries to remove: not ready in time, no longer listed, or beyond the size.
    let mut remove: Vec<&PoolEntry> = Vec::new();
    let mut kept: HashMap<&str, u32> = HashMap::new();
    for e in entries.iter().filter(|e| e.claimed_by.is_none()) {
        let late = e.ready_at.is_none() && now.saturating_sub(e.created_at) > patience;
        let gone = listed.as_ref().is_some_and(|l| !l.iter().any(|p| p.pool_id == e.id && p.running));
        let size = wants.iter().find(|w| w.key == e.key).map_or(0, |w| w.size);
        let n = kept.entry(e.key.as_str()).or_default();
        if late || gone || *n >= size {
            remove.push(e);
        } else {
            *n += 1;
        }
    }
    for e in remove {
        tracing::info!(pool_id = %e.id, "removing a pooled sandbox");
        match a.adapter.delete(&e.sandbox, &e.id).await {
            Ok(()) => {
                propose(cluster, Command::PoolRemove { pool_id: e.id.clone() }).await;
            }
            Err(err) => tracing::warn!(pool_id = %e.id, error = %err, "cannot remove a pooled sandbox"),
        }
    }
    // Sandboxes no entry names, made long enough ago that no fill is still recording them.
    if let Some(listed) = &listed {
        let known: HashSet<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        for p in listed {
            let unclaimed_name = p.name.starts_with("computerd-pool-");
            if unclaimed_name && !known.contains(p.pool_id.as_str()) && now.saturating_sub(p.created_ms) > patience {
                tracing::info!(pool_id = %p.pool_id, "removing a pooled sandbox no entry names");
                if let Err(err) = a.adapter.delete(&p.sandbox, &p.pool_id).await {
                    tracing::warn!(pool_id = %p.pool_id, error = %err, "cannot remove a pooled sandbox");
                }
            }
        }
    }

    // Sizes, as the leader sees them.
    for w in &wants {
        let ready = entries.iter().filter(|e| e.key == w.key && e.claimed_by.is_none() && e.ready_at.is_some()).count();
        metrics::gauge!("computerd_pool_ready", "provider" => provider.clone(), "key" => w.key.clone())
            .set(ready as f64);
        metrics::gauge!("computerd_pool_size", "provider" => provider.clone(), "key" => w.key.clone())
            .set(w.size as f64);
    }
    // One fill at a time, for the first key short of its size.
    if a.fill.is_some() || a.quiet_until.is_some_and(|t| Instant::now() < t) {
        return;
    }
    let short = wants.iter().find(|w| kept.get(w.key.as_str()).copied().unwrap_or(0) < w.size);
    if let Some(w) = short {
        a.fill = Some(tokio::spawn(fill(cluster.clone(), a.adapter.clone(), provider.clone(), w.key.clone())));
    }
}

/// Makes one pooled sandbox of `key` and records it; answers whether it did.
async fn fill(cluster: Cluster, adapter: Arc<dyn Provider>, provider: String, key: String) -> bool {
    let id = format!("pool_{}", hex::encode(rand::random::<[u8; 12]>()));
    let token = hex::encode(rand::random::<[u8; 32]>());
    let sandbox = match adapter.pool_start(&provider, &key, &id, &token).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(provider = %provider, key = %key, error = %e, "cannot make a pooled sandbox");
            return false;
        }
    };
    let entry = PoolEntry {
        id: id.clone(),
        provider,
        key,
        sandbox: sandbox.clone(),
        token_hash: hash_secret(&token),
        created_at: now_ms(),
        ready_at: None,
        claimed_by: None,
        claim_execution: None,
    };
    if propose(&cluster, Command::PoolAdd { entry }).await {
        tracing::info!(pool_id = %id, "pooled sandbox made");
        return true;
    }
    // Not recorded: nothing may claim it, so it goes (the sweep removes it if this fails).
    if let Err(e) = adapter.delete(&sandbox, &id).await {
        tracing::warn!(pool_id = %id, error = %e, "cannot remove an unrecorded pooled sandbox");
    }
    false
}

/// Proposes `cmd`; answers whether it applied.
async fn propose(cluster: &Cluster, cmd: Command) -> bool {
    let name = cmd.name();
    match cluster.propose(Request::new(cmd)).await {
        Ok(Response::Rejected(r)) => {
            tracing::debug!(command = name, reason = %r.message, "the pool keeper's change was refused");
            false
        }
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(command = name, error = %e, "the pool keeper cannot reach the store");
            false
        }
    }
}
