//! The sandbox watch: on the leader, every few seconds, asks each provider that can list its
//! sandboxes which ones it holds, and reports a Computer whose sandbox vanished (deleted behind
//! the cluster's back, or lost by the provider) or ended (a Docker container that exited: its
//! agent died at start, or the engine restarted) instead of hiding it: `SandboxVanished` marks it
//! `failed` and closes its run span, with the provider's state as the reason when it ended. One list call per provider per pass, whatever the number of
//! Computers. It also reports a running Computer whose sandbox the provider paused or stopped on
//! its own (E2B's auto-pause, a Daytona runner's stop): `SandboxPausedByProvider` makes it
//! `paused` and ends its usage span, as a pause we asked for does. Computers with an execution
//! under way are skipped (a create, pause or delete in flight is neither), and so are those whose
//! pooled sandbox the pool keeper has not named for them yet; the store checks the first again
//! when it applies the report.

use std::collections::HashMap;
use std::time::Duration;

use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::Request;
use computerd_raft::sm::Source;
use tokio::sync::watch;

use crate::factory::ProviderFactory;
use crate::now_ms;

/// Runs the watch every `every` until `stop`.
pub async fn run_sandbox_watch(
    cluster: Cluster,
    providers: ProviderFactory,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    while crate::tick(every, &mut stop).await {
        if cluster.view().leader_id == Some(cluster.id()) {
            pass(&cluster, &providers).await;
        }
    }
}

/// One pass over every provider; answers how many vanished or paused sandboxes were reported.
pub async fn pass(cluster: &Cluster, providers: &ProviderFactory) -> usize {
    // Per provider: its record and the Computers that should have a live sandbox there.
    let watched = cluster.state().read(|s| {
        type Watched = (computerd_raft::sm::Provider, Vec<(String, ComputerState)>);
        let mut by_provider: HashMap<String, Watched> = HashMap::new();
        // A pooled sandbox claimed moments ago may not carry its Computer's name yet (the provider
        // lists it under its pool's): its Computer is watched once the pool keeper has named it
        // and forgotten the entry.
        let naming: std::collections::HashSet<&str> = s.pool.values().filter_map(|e| e.claimed_by.as_deref()).collect();
        for c in s.computers.values() {
            let Source::Provider { provider, .. } = &c.source else { continue };
            let live = matches!(c.state, ComputerState::Running | ComputerState::Paused | ComputerState::Starting);
            if !live || c.active_execution.is_some() || c.sandbox.is_none() || naming.contains(c.id.as_str()) {
                continue;
            }
            if let Some(p) = s.providers.get(provider) {
                let e = by_provider.entry(provider.clone()).or_insert_with(|| (p.clone(), Vec::new()));
                e.1.push((c.id.clone(), c.state));
            }
        }
        by_provider
    });
    let mut reported = 0;
    for (_, (record, computers)) in watched {
        let (adapter, timeout) = providers.build(&record);
        let held = match tokio::time::timeout(timeout, adapter.list()).await {
            Ok(Ok(Some(held))) => held,
            Ok(Ok(None)) => continue,
            Ok(Err(e)) => {
                tracing::debug!(provider = %record.id, error = %e, "cannot list sandboxes");
                continue;
            }
            Err(_) => continue,
        };
        for (id, state) in computers {
            let cmd = match held.get(&id) {
                None => {
                    tracing::warn!(computer_id = %id, provider = %record.id, "the computer's sandbox vanished");
                    Command::SandboxVanished { computer_id: id, at_ms: now_ms(), reason: None }
                }
                Some(info) if adapter.ended_state(&info.state) => {
                    tracing::warn!(computer_id = %id, provider = %record.id, state = %info.state, "the computer's sandbox ended on its own");
                    let reason = format!("the sandbox ended on its own (provider state {:?})", info.state);
                    Command::SandboxVanished { computer_id: id, at_ms: now_ms(), reason: Some(reason) }
                }
                Some(info) if state == ComputerState::Running && adapter.paused_state(&info.state) => {
                    tracing::warn!(computer_id = %id, provider = %record.id, state = %info.state, "the provider paused the computer's sandbox on its own");
                    Command::SandboxPausedByProvider {
                        computer_id: id,
                        provider_state: info.state.clone(),
                        at_ms: now_ms(),
                    }
                }
                Some(_) => continue,
            };
            if cluster.propose(Request::new(cmd)).await.is_ok() {
                reported += 1;
            }
        }
    }
    reported
}
