//! Keeping providers' own expiry ahead: E2B ends a sandbox at an absolute timeout, while when a
//! Computer pauses is ours (`pauseAfter`). On the leader, every few seconds, each running
//! Computer whose provider has such an expiry ([`Provider::keep_alive_every`]) gets it pushed
//! ahead ([`Provider::keep_alive`], E2B's `POST /sandboxes/{id}/timeout`) once that interval has
//! passed since its last refresh.
//!
//! Which Computers run comes from the store (a pass walks the Computers under the state's read
//! lock, as the sandbox watch does; it is a background pass of the leader, not an apply or request
//! path; an index of running Computers by provider kind would spare it). When each was last
//! refreshed is the leader's own memory: a new leader refreshes every one at its first pass, which is early, never
//! late. The interval is a third of the timeout, so two failed refreshes in a row still leave
//! the sandbox running; and E2B's sandbox is made to pause, never die, if all of them fail.
//!
//! A refresh is not a lifecycle command: it changes no state of ours, and sending it twice is
//! harmless (each sets the expiry from its own moment). It never resumes a paused sandbox.

use std::collections::HashMap;
use std::time::Duration;
use std::time::Instant;

use computerd_raft::cluster::Cluster;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::Source;
use tokio::sync::watch;

use crate::factory::ProviderFactory;

/// Runs the refreshes, looking every `every`, until `stop`.
pub async fn run_keep_alive(
    cluster: Cluster,
    providers: ProviderFactory,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut last: HashMap<String, Instant> = HashMap::new();
    while crate::tick(every, &mut stop).await {
        if cluster.view().leader_id == Some(cluster.id()) {
            pass(&cluster, &providers, &mut last).await;
        } else {
            last.clear();
        }
    }
}

/// One pass; answers how many sandboxes were refreshed.
pub async fn pass(cluster: &Cluster, providers: &ProviderFactory, last: &mut HashMap<String, Instant>) -> usize {
    // Running Computers with a sandbox, and their providers' records.
    let running = cluster.state().read(|s| {
        s.computers
            .values()
            .filter(|c| c.state == ComputerState::Running)
            .filter_map(|c| {
                let id = &c.id;
                let Source::Provider { provider, .. } = &c.source else { return None };
                let p = s.providers.get(provider)?;
                if !matches!(p.kind, computerd_raft::sm::ProviderKind::E2b) || c.active_execution.is_some() {
                    return None;
                }
                Some((id.clone(), c.sandbox.clone()?, p.clone()))
            })
            .collect::<Vec<_>>()
    });
    last.retain(|id, _| running.iter().any(|(r, _, _)| r == id));
    let mut refreshed = 0;
    for (id, sandbox, record) in running {
        let (adapter, timeout) = providers.build(&record);
        let Some(interval) = adapter.keep_alive_every() else { continue };
        if last.get(&id).is_some_and(|t| t.elapsed() < interval) {
            continue;
        }
        match tokio::time::timeout(timeout, adapter.keep_alive(&sandbox)).await {
            Ok(Ok(())) => {
                last.insert(id, Instant::now());
                refreshed += 1;
            }
            Ok(Err(e)) => {
                tracing::warn!(computer_id = %id, error = %e, "the sandbox's expiry could not be pushed ahead")
            }
            Err(_) => tracing::warn!(computer_id = %id, "the sandbox's expiry refresh had no answer in time"),
        }
    }
    refreshed
}
