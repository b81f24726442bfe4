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

use computerd_raft::NodeId;
use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::ExecutionState;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::State;
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
#[derive(Debug, Default, PartialEq, Eq)]
struct Pass {
    /// (execution, Computer) to claim and run here.
    run: Vec<(String, String)>,
    /// (execution, claim) of dispatched calls to declare unknown.
    lost: Vec<(String, String)>,
    /// Computers whose actors can stop (deleted or gone).
    done: Vec<String>,
}

/// What node `me` should do at one applied state `s`, given the leader it knows, the executions
/// in flight in this process and the Computers it has actors for. Pure: the rules of the module
/// doc, and nothing else.
fn survey<'a>(
    s: &State,
    me: NodeId,
    leader: Option<NodeId>,
    inflight: &HashSet<String>,
    actors: impl Iterator<Item = &'a String>,
) -> Pass {
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
    pass.done =
        actors.filter(|c| s.computers.get(*c).is_none_or(|c| c.state == ComputerState::Deleted)).cloned().collect();
    pass
}

/// Runs the driver until `stop` turns true.
pub async fn run_driver(cluster: Cluster, providers: ProviderFactory, mut stop: watch::Receiver<bool>) {
    let mut applied = cluster.state().subscribe();
    let inflight: Inflight = Arc::default();
    let mut actors: HashMap<String, ActorRef<ComputerMessage>> = HashMap::new();
    loop {
        let leader = cluster.view().leader_id;
        let now_inflight = inflight.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let pass = cluster.state().read(|s| survey(s, cluster.id(), leader, &now_inflight, actors.keys()));
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

#[cfg(test)]
mod tests {
    use computerd_raft::sm::Computer;
    use computerd_raft::sm::Execution;
    use computerd_raft::sm::ExecutionKind;
    use computerd_raft::sm::Source;

    use super::*;

    /// A node that is not in the live set (it died).
    const DEAD: NodeId = 9;

    fn computer(id: &str, state: ComputerState) -> Computer {
        Computer {
            id: id.into(),
            name: id.into(),
            owner: "mem_o".into(),
            shared: false,
            source: Source::Provider { provider: "cpp_1".into(), template: None },
            desktop: false,
            pause_after: None,
            state,
            sandbox: Some("sbx".into()),
            active_execution: Some("exe_a".into()),
            created_at: 1,
            agent_credential: None,
            link_generation: 0,
            link_node: None,
        }
    }

    /// Live nodes `live`, the running Computer `cmp_a` and its pause `exe_a`, as `edit` leaves it.
    fn world(live: &[NodeId], edit: impl FnOnce(&mut Execution)) -> State {
        let mut s = State::default();
        s.live_nodes = live.iter().copied().collect();
        s.computers.insert("cmp_a".into(), computer("cmp_a", ComputerState::Running));
        let mut e = Execution::pending("exe_a", "k", "h", ExecutionKind::Pause, "cmp_a", 1);
        edit(&mut e);
        s.executions.insert(e.id.clone(), e);
        s
    }

    /// Claimed by `node`, and dispatched or not.
    fn claimed(node: Option<NodeId>, dispatched: bool) -> impl FnOnce(&mut Execution) {
        move |e| {
            e.state = ExecutionState::Running;
            e.claim = Some("clm_1".into());
            e.claim_node = node;
            e.dispatched_at = dispatched.then_some(5);
        }
    }

    /// The owner of `cmp_a` and another live node.
    fn owner_and_other(s: &State) -> (NodeId, NodeId) {
        let owner = s.placement("cmp_a").expect("placed");
        (owner, s.live_nodes.iter().copied().find(|n| *n != owner).expect("another node"))
    }

    fn pass(s: &State, me: NodeId, leader: Option<NodeId>, inflight: &[&str]) -> Pass {
        let inflight = inflight.iter().map(|e| e.to_string()).collect();
        survey(s, me, leader, &inflight, std::iter::empty())
    }

    fn run() -> Pass {
        Pass { run: vec![("exe_a".into(), "cmp_a".into())], ..Pass::default() }
    }

    fn lost() -> Pass {
        Pass { lost: vec![("exe_a".into(), "clm_1".into())], ..Pass::default() }
    }

    #[test]
    fn a_claimable_execution_runs_on_its_owner_only() {
        let s = world(&[1, 2, 3], |_| {});
        let (owner, other) = owner_and_other(&s);
        assert_eq!(pass(&s, owner, Some(other), &[]), run());
        assert_eq!(pass(&s, other, Some(other), &[]), Pass::default(), "not on a non-owner, even the leader");
        // Claimed but never dispatched (its driver died before sending): claimed again.
        let s = world(&[1, 2, 3], claimed(Some(DEAD), false));
        assert_eq!(pass(&s, owner, None, &[]), run());
        assert_eq!(pass(&s, other, None, &[]), Pass::default());
        // Waiting for an approval nobody gave: not claimable.
        let s = world(&[1, 2, 3], |e| e.approval = Some("apr_1".into()));
        assert_eq!(pass(&s, owner, None, &[]), Pass::default());
    }

    #[test]
    fn without_a_live_set_the_leader_drives() {
        let s = world(&[], |_| {});
        assert_eq!(pass(&s, 1, Some(1), &[]), run());
        assert_eq!(pass(&s, 2, Some(1), &[]), Pass::default());
        assert_eq!(pass(&s, 1, None, &[]), Pass::default(), "no leader known: nobody");
    }

    #[test]
    fn an_execution_in_flight_here_is_skipped() {
        let s = world(&[1, 2, 3], |_| {});
        let (owner, _) = owner_and_other(&s);
        assert_eq!(pass(&s, owner, None, &["exe_a"]), Pass::default());
        let s = world(&[1, 2, 3], claimed(Some(owner), true));
        assert_eq!(pass(&s, owner, None, &["exe_a"]), Pass::default(), "its call is still under way");
    }

    #[test]
    fn my_dispatched_call_not_in_flight_is_lost() {
        let s = world(&[1, 2, 3], |_| {});
        let (owner, other) = owner_and_other(&s);
        let s = world(&[1, 2, 3], claimed(Some(owner), true));
        assert_eq!(pass(&s, owner, None, &[]), lost(), "never run again");
        // Also once the Computer has moved away from the node that sent the call.
        let s = world(&[1, 2, 3], claimed(Some(other), true));
        assert_eq!(pass(&s, other, None, &[]), lost());
    }

    #[test]
    fn a_dead_senders_call_is_lost_only_on_the_owner() {
        let s = world(&[1, 2, 3], claimed(Some(DEAD), true));
        let (owner, other) = owner_and_other(&s);
        assert_eq!(pass(&s, owner, None, &[]), lost());
        assert_eq!(pass(&s, other, Some(other), &[]), Pass::default(), "not on a non-owner, even the leader");
        // A live sender still has it: nobody else declares it lost.
        let s = world(&[1, 2, 3], claimed(Some(other), true));
        assert_eq!(pass(&s, owner, None, &[]), Pass::default());
    }

    #[test]
    fn a_claim_from_before_placement_is_settled_by_the_leader() {
        let s = world(&[1, 2, 3], claimed(None, true));
        let (owner, other) = owner_and_other(&s);
        assert_eq!(pass(&s, other, Some(other), &[]), lost());
        assert_eq!(pass(&s, owner, Some(other), &[]), Pass::default(), "the owner is not the leader");
    }

    #[test]
    fn a_finished_execution_needs_nothing() {
        let s = world(&[1, 2, 3], |e| {
            claimed(Some(DEAD), true)(e);
            e.state = ExecutionState::Succeeded;
        });
        let (owner, _) = owner_and_other(&s);
        assert_eq!(pass(&s, owner, Some(owner), &[]), Pass::default());
    }

    #[test]
    fn actors_of_deleted_or_gone_computers_are_done() {
        let mut s = world(&[1, 2, 3], |e| e.state = ExecutionState::Succeeded);
        s.computers.insert("cmp_d".into(), computer("cmp_d", ComputerState::Deleted));
        s.computers.insert("cmp_p".into(), computer("cmp_p", ComputerState::Paused));
        let actors: Vec<String> = ["cmp_a", "cmp_d", "cmp_p", "cmp_x"].map(String::from).into();
        let p = survey(&s, 1, Some(1), &HashSet::new(), actors.iter());
        assert_eq!(p.done, ["cmp_d", "cmp_x"]);
    }
}
