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
use crate::provider::PoolWant;
use crate::provider::Pooled;
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
    let d = decide(&entries, &wants, listed.as_deref(), now_ms());
    for e in &d.remove {
        tracing::info!(pool_id = %e.id, "removing a pooled sandbox");
        match a.adapter.delete(&e.sandbox, &e.id).await {
            Ok(()) => {
                propose(cluster, Command::PoolRemove { pool_id: e.id.clone() }).await;
            }
            Err(err) => tracing::warn!(pool_id = %e.id, error = %err, "cannot remove a pooled sandbox"),
        }
    }
    for p in &d.sweep {
        tracing::info!(pool_id = %p.pool_id, "removing a pooled sandbox no entry names");
        if let Err(err) = a.adapter.delete(&p.sandbox, &p.pool_id).await {
            tracing::warn!(pool_id = %p.pool_id, error = %err, "cannot remove a pooled sandbox");
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
    if let Some(key) = d.fill {
        a.fill = Some(tokio::spawn(fill(cluster.clone(), a.adapter.clone(), provider.clone(), key)));
    }
}

/// What one pass does about a provider's unclaimed pooled sandboxes.
#[derive(Debug, Default, PartialEq)]
struct Decision {
    /// Entries to remove with their sandboxes: not ready within [`READY_PATIENCE`], no longer
    /// running (when `listed`), or more than their key's size asks (the config shrank).
    remove: Vec<PoolEntry>,
    /// Listed sandboxes that no entry names and no claim renamed, older than
    /// [`READY_PATIENCE`] (younger ones may be a fill's, not yet recorded).
    sweep: Vec<Pooled>,
    /// The first key short of its size, to fill.
    fill: Option<String>,
}

/// Decides one pass over `entries` (the provider's, from the store), its `wants`, and its
/// sandboxes as the provider lists them (`None`: not listed this pass) at `now` (Unix ms). Pure.
fn decide(entries: &[PoolEntry], wants: &[PoolWant], listed: Option<&[Pooled]>, now: u64) -> Decision {
    let patience = READY_PATIENCE.as_millis() as u64;
    let mut d = Decision::default();
    let mut kept: HashMap<&str, u32> = HashMap::new();
    for e in entries.iter().filter(|e| e.claimed_by.is_none()) {
        let late = e.ready_at.is_none() && now.saturating_sub(e.created_at) > patience;
        let gone = listed.is_some_and(|l| !l.iter().any(|p| p.pool_id == e.id && p.running));
        let size = wants.iter().find(|w| w.key == e.key).map_or(0, |w| w.size);
        let n = kept.entry(e.key.as_str()).or_default();
        if late || gone || *n >= size {
            d.remove.push(e.clone());
        } else {
            *n += 1;
        }
    }
    if let Some(listed) = listed {
        let known: HashSet<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        d.sweep = listed
            .iter()
            .filter(|p| p.name.starts_with("computerd-pool-") && !known.contains(p.pool_id.as_str()))
            .filter(|p| now.saturating_sub(p.created_ms) > patience)
            .cloned()
            .collect();
    }
    d.fill = wants.iter().find(|w| kept.get(w.key.as_str()).copied().unwrap_or(0) < w.size).map(|w| w.key.clone());
    d
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    fn entry(id: &str, key: &str, created_at: u64, ready: bool) -> PoolEntry {
        PoolEntry {
            id: id.into(),
            provider: "cpp_d".into(),
            key: key.into(),
            sandbox: format!("sbx-{id}"),
            token_hash: "0".repeat(64),
            created_at,
            ready_at: ready.then_some(created_at + 1),
            claimed_by: None,
            claim_execution: None,
        }
    }

    fn listed(id: &str, name: &str, created_ms: u64, running: bool) -> Pooled {
        Pooled { pool_id: id.into(), sandbox: format!("sbx-{id}"), name: name.into(), created_ms, running }
    }

    fn want(key: &str, size: u32) -> PoolWant {
        PoolWant { key: key.into(), desktop: false, size }
    }

    /// Issue 42: a pool short of its size is filled; a sandbox that never waited in time, one
    /// that stopped, and one past a shrunk size are removed; a claimed one is left to its
    /// Computer.
    #[test]
    fn i42_the_keeper_fills_short_pools_and_removes_late_dead_and_surplus_sandboxes() {
        let now = 10 * MIN;
        let ready = entry("pool_a", "default", now - 1000, true);
        let d = decide(std::slice::from_ref(&ready), &[want("default", 2)], None, now);
        assert_eq!(d, Decision { fill: Some("default".into()), ..Decision::default() });

        let late = entry("pool_late", "default", now - 2 * MIN, false);
        let young = entry("pool_young", "default", now - 1000, false);
        let d = decide(&[late.clone(), young.clone()], &[want("default", 2)], None, now);
        assert_eq!(d.remove, vec![late], "an agent that never waited within a minute");
        assert_eq!(d.fill, Some("default".into()), "the young one counts; one more is wanted");

        let stopped = [listed("pool_a", "computerd-pool-pool_a", now - 1000, false)];
        let d = decide(std::slice::from_ref(&ready), &[want("default", 1)], Some(&stopped), now);
        assert_eq!((d.remove, d.fill), (vec![ready.clone()], Some("default".into())), "a stopped sandbox goes");

        let b = entry("pool_b", "default", now - 1000, true);
        let d = decide(&[ready.clone(), b.clone()], &[want("default", 1)], None, now);
        assert_eq!((d.remove, d.fill), (vec![b.clone()], None), "the size shrank to one");
        let d = decide(&[ready.clone(), b], &[], None, now);
        assert_eq!(d.remove.len(), 2, "no pool left: every unclaimed sandbox goes");

        let mut claimed = entry("pool_c", "default", now - 5 * MIN, false);
        claimed.claimed_by = Some("cmp_1".into());
        let d = decide(&[claimed], &[want("default", 1)], Some(&[]), now);
        assert_eq!((d.remove.len(), d.fill), (0, Some("default".into())), "a claimed entry is its Computer's");
    }

    /// Issue 42: pooled sandboxes no entry names (a crash between making and recording one) are
    /// swept once a minute old; claimed (renamed) ones and a fill's young one are not.
    #[test]
    fn i42_the_sweep_removes_old_pooled_sandboxes_no_entry_names() {
        let now = 10 * MIN;
        let known = entry("pool_k", "default", now - 5 * MIN, true);
        let list = [
            listed("pool_k", "computerd-pool-pool_k", now - 5 * MIN, true),
            listed("pool_orphan", "computerd-pool-pool_orphan", now - 2 * MIN, true),
            listed("pool_fresh", "computerd-pool-pool_fresh", now - 1000, true),
            listed("pool_taken", "computerd-cmp_1", now - 9 * MIN, true),
        ];
        let d = decide(&[known], &[want("default", 1)], Some(&list), now);
        assert_eq!(d.sweep.iter().map(|p| p.pool_id.as_str()).collect::<Vec<_>>(), vec!["pool_orphan"]);
        assert!(d.remove.is_empty() && d.fill.is_none(), "{d:?}");
    }
}
