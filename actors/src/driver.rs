//! The execution driver: on the leader, hands claimable executions to their Computer actors and,
//! on taking over, settles what a previous driver left: a dispatched, unanswered call becomes
//! `outcome_unknown` (never re-sent); an undispatched one is claimed again.
//!
//! Placement today: the leader drives every execution (a deterministic owner that moves when a
//! node dies). It wakes on every applied change of the store and on a short tick (leadership
//! changes do not show up as applied entries on followers).

use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::ExecutionState;
use computerd_raft::sm::Request;
use ractor::Actor;
use ractor::ActorRef;
use tokio::sync::watch;

use crate::computer::ComputerActor;
use crate::computer::ComputerArgs;
use crate::computer::ComputerMessage;
use crate::factory::ProviderFactory;

/// Runs the driver until `stop` turns true.
pub async fn run_driver(cluster: Cluster, providers: ProviderFactory, mut stop: watch::Receiver<bool>) {
    let mut applied = cluster.state().subscribe();
    let inflight: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut actors: HashMap<String, ActorRef<ComputerMessage>> = HashMap::new();
    let mut led_term: Option<u64> = None;
    loop {
        let view = cluster.view();
        if view.leader_id == Some(cluster.id()) {
            if led_term != Some(view.term) {
                takeover(&cluster, &inflight).await;
                led_term = Some(view.term);
            }
            let work: Vec<(String, String)> = cluster.state().read(|s| {
                s.executions
                    .values()
                    .filter(|e| s.claimable(e) || (e.state == ExecutionState::Running && e.dispatched_at.is_none()))
                    .map(|e| (e.id.clone(), e.computer_id.clone()))
                    .collect()
            });
            for (exe, computer) in work {
                if !inflight.lock().unwrap_or_else(|p| p.into_inner()).insert(exe.clone()) {
                    continue;
                }
                let actor = match actors.get(&computer) {
                    Some(a) => a.clone(),
                    None => {
                        let args = ComputerArgs {
                            computer_id: computer.clone(),
                            cluster: cluster.clone(),
                            providers: providers.clone(),
                            inflight: inflight.clone(),
                        };
                        match Actor::spawn(None, ComputerActor, args).await {
                            Ok((a, _)) => {
                                actors.insert(computer.clone(), a.clone());
                                a
                            }
                            Err(e) => {
                                tracing::warn!(computer_id = %computer, error = %e, "cannot start a computer actor");
                                inflight.lock().unwrap_or_else(|p| p.into_inner()).remove(&exe);
                                continue;
                            }
                        }
                    }
                };
                if actor.send_message(ComputerMessage::Run(exe.clone())).is_err() {
                    actors.remove(&computer);
                    inflight.lock().unwrap_or_else(|p| p.into_inner()).remove(&exe);
                }
            }
        } else {
            led_term = None;
        }
        tokio::select! {
            _ = applied.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    for (_, a) in actors {
        a.stop(None);
    }
}

/// Settles the executions a previous driver left running.
async fn takeover(cluster: &Cluster, inflight: &Arc<Mutex<HashSet<String>>>) {
    let left: Vec<(String, String)> = cluster.state().read(|s| {
        s.executions
            .values()
            .filter(|e| e.state == ExecutionState::Running && e.dispatched_at.is_some())
            .filter_map(|e| Some((e.id.clone(), e.claim.clone()?)))
            .collect()
    });
    for (exe, claim) in left {
        if inflight.lock().unwrap_or_else(|p| p.into_inner()).contains(&exe) {
            continue; // this process still drives it
        }
        tracing::warn!(execution_id = %exe, "driver lost during a provider call: outcome unknown");
        let cmd = Command::MarkUnknown {
            execution_id: exe.clone(),
            claim,
            reason: "the node driving this call stopped before its answer was recorded".into(),
            at_ms: crate::now_ms(),
        };
        if let Err(e) = cluster.propose(Request::new(cmd)).await {
            tracing::warn!(execution_id = %exe, error = %e, "could not mark unknown");
        }
    }
}
