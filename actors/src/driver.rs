//! The execution driver, on every node: hands the claimable executions of the Computers this node
//! owns to their Computer actors, and settles dispatched calls whose sender is gone: a
//! dispatched, unanswered call becomes `outcome_unknown` (never re-sent); an undispatched one is
//! claimed again.
//!
//! Ownership is the store's placement (`State::placement`: rendezvous hashing over the live nodes
//! the leader records, see [`crate::liveness`]); while no node is recorded live, the leader
//! owns everything. A call is declared lost by the node that sent it when it is no longer in
//! flight in this process (the node restarted, or its answer could not be recorded), or by the
//! Computer's owner once the sender is no longer live. The store re-checks both rules at commit.
//!
//! The driver wakes on every applied change of the store and on a short tick (leadership
//! changes do not show up as applied entries on followers).

use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::ExecutionState;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use ractor::Actor;
use ractor::ActorRef;
use tokio::sync::watch;

use crate::computer::ComputerActor;
use crate::computer::ComputerArgs;
use crate::computer::ComputerMessage;
use crate::factory::ProviderFactory;

/// Executions this process has handed to an actor and not yet seen end.
type Inflight = Arc<Mutex<HashSet<String>>>;

/// What one pass found to do.
#[derive(Default)]
struct Pass {
    /// (execution, Computer) to claim and run here.
    run: Vec<(String, String)>,
    /// (execution, claim) of dispatched calls to declare unknown.
    lost: Vec<(String, String)>,
    /// Computers whose actors can stop (deleted or gone).
    done: Vec<String>,
}

/// Reads, at one applied index, what this node should do.
fn survey(cluster: &Cluster, inflight: &Inflight, actors: &HashMap<String, ActorRef<ComputerMessage>>) -> Pass {
    let me = cluster.id();
    let leader = cluster.view().leader_id;
    let inflight = inflight.lock().unwrap_or_else(|p| p.into_inner()).clone();
    cluster.state().read(|s| {
        let owner = |computer: &str| s.placement(computer).or(leader);
        let mut pass = Pass::default();
        for e in s.executions.values() {
            if inflight.contains(&e.id) {
                continue;
            }
            let undispatched = e.state == ExecutionState::Running && e.dispatched_at.is_none();
            if (s.claimable(e) || undispatched) && owner(&e.computer_id) == Some(me) {
                pass.run.push((e.id.clone(), e.computer_id.clone()));
            }
            let dispatched = e.state == ExecutionState::Running && e.dispatched_at.is_some();
            let Some(claim) = e.claim.clone().filter(|_| dispatched) else { continue };
            let sender_gone = match e.claim_node {
                Some(n) if n == me => true, // not in flight here: this process lost it
                Some(n) => !s.live_nodes.is_empty() && !s.live_nodes.contains(&n) && owner(&e.computer_id) == Some(me),
                // A claim from before placement: the leader settles it.
                None => leader == Some(me),
            };
            if sender_gone {
                pass.lost.push((e.id.clone(), claim));
            }
        }
        pass.done = actors
            .keys()
            .filter(|c| s.computers.get(*c).is_none_or(|c| c.state == ComputerState::Deleted))
            .cloned()
            .collect();
        pass
    })
}

/// Runs the driver until `stop` turns true.
pub async fn run_driver(cluster: Cluster, providers: ProviderFactory, mut stop: watch::Receiver<bool>) {
    let mut applied = cluster.state().subscribe();
    let inflight: Inflight = Arc::default();
    let mut actors: HashMap<String, ActorRef<ComputerMessage>> = HashMap::new();
    loop {
        let pass = survey(&cluster, &inflight, &actors);
        for (exe, claim) in pass.lost {
            settle_lost(&cluster, &exe, claim).await;
        }
        for computer in pass.done {
            if let Some(a) = actors.remove(&computer) {
                a.stop(None);
            }
        }
        for (exe, computer) in pass.run {
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

/// Declares a dispatched call whose sender is gone unknown (the store re-checks who may; a call
/// whose answer was recorded meanwhile is refused harmlessly).
async fn settle_lost(cluster: &Cluster, exe: &str, claim: String) {
    let cmd = Command::MarkUnknown {
        execution_id: exe.to_string(),
        claim,
        node: Some(cluster.id()),
        reason: "the node driving this call stopped before its answer was recorded".into(),
        at_ms: crate::now_ms(),
    };
    match cluster.propose(Request::new(cmd)).await {
        Ok(Response::Rejected(r)) => tracing::debug!(execution_id = %exe, reason = %r.message, "not declared unknown"),
        Ok(_) => tracing::warn!(execution_id = %exe, "driver lost during a provider call: outcome unknown"),
        Err(e) => tracing::warn!(execution_id = %exe, error = %e, "could not mark unknown"),
    }
}
