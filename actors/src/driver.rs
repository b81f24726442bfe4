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
//! The driver wakes on every applied change of the store, on a short tick (leadership changes
//! do not show up as applied entries on followers) and when one of its actors stops. Each pass
//! decides in a pure function (`survey`) over the applied state's open executions (the store's
//! index of pending and running ones: a pass costs the work under way, never the history), the
//! executions in flight here and the actors it runs; the loop only carries the decisions out.
//!
//! Supervision: every Computer actor is spawned linked to one supervisor actor
//! (`ComputerSupervisor`), which forwards each child's exit to the driver loop. A crashed actor
//! (a panic or an error out of its handler) loses nothing: the loop forgets it and releases its
//! executions from the in-flight set (`release`), so the next pass settles them by the rules
//! above: an undispatched one is claimed again by a fresh actor, a dispatched one is declared
//! unknown (never re-sent). The Computer's next execution starts a fresh actor. Only the loop
//! spawns, stops and forgets actors, so an exit never races a respawn.

use std::collections::HashMap;
use std::sync::MutexGuard;
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
use ractor::ActorId;
use ractor::ActorProcessingErr;
use ractor::ActorRef;
use ractor::SupervisionEvent;
use tokio::sync::mpsc;
use tokio::sync::watch;

use crate::computer::ComputerActor;
use crate::computer::ComputerArgs;
use crate::computer::ComputerMessage;
use crate::computer::Inflight;
use crate::factory::ProviderFactory;

fn lock(inflight: &Inflight) -> MutexGuard<'_, HashMap<String, String>> {
    inflight.lock().unwrap_or_else(|p| p.into_inner())
}

/// The supervisor of this node's Computer actors, each spawned linked to it. It holds nothing
/// but where to report: it forwards every child's exit to the driver loop, which decides what
/// the exit releases.
struct ComputerSupervisor;

/// The supervisor takes no messages, only supervision events.
enum SupervisorMessage {}

/// A Computer actor that stopped, as its supervisor saw it.
struct Exit {
    /// The stopped actor.
    actor: ActorId,
    /// Why it failed (a panic or an error out of its handler); `None`: it stopped cleanly.
    error: Option<String>,
}

impl Actor for ComputerSupervisor {
    type Msg = SupervisorMessage;
    type State = mpsc::UnboundedSender<Exit>;
    type Arguments = mpsc::UnboundedSender<Exit>;

    async fn pre_start(
        &self,
        _me: ActorRef<Self::Msg>,
        exits: mpsc::UnboundedSender<Exit>,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(exits)
    }

    async fn handle(
        &self,
        _me: ActorRef<Self::Msg>,
        msg: SupervisorMessage,
        _exits: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {}
    }

    /// The children are the Computer actors; their exits go to the driver loop.
    async fn handle_supervisor_evt(
        &self,
        _me: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        exits: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let exit = match event {
            SupervisionEvent::ActorFailed(child, e) => Exit { actor: child.get_id(), error: Some(e.to_string()) },
            SupervisionEvent::ActorTerminated(child, _, _) => Exit { actor: child.get_id(), error: None },
            // Nothing to track when a child starts; no process group is joined.
            SupervisionEvent::ActorStarted(_) | SupervisionEvent::ProcessGroupChanged(_) => return Ok(()),
        };
        // A send fails only once the driver loop has ended (shutdown): nothing is left to release.
        let _ = exits.send(exit);
        Ok(())
    }
}

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
    inflight: &HashMap<String, String>,
    actors: impl Iterator<Item = &'a String>,
) -> Pass {
    let owner = |computer: &str| s.placement(computer).or(leader);
    let mut pass = Pass::default();
    // Only pending and running executions (the index): finished ones never need the driver.
    for e in s.open_executions() {
        if inflight.contains_key(&e.id) {
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

/// Forgets the executions in flight on `computer`'s actor, which is gone; answers them.
fn release(inflight: &mut HashMap<String, String>, computer: &str) -> Vec<String> {
    let mut gone = Vec::new();
    inflight.retain(|exe, c| {
        let keep = c != computer;
        if !keep {
            gone.push(exe.clone());
        }
        keep
    });
    gone.sort();
    gone
}

/// The Computer actors of this node, by Computer, and what they drive.
struct Actors {
    by_computer: HashMap<String, ActorRef<ComputerMessage>>,
    inflight: Inflight,
}

impl Actors {
    /// `computer`'s actor is gone (it crashed, or stopped unasked): forgets it and releases its
    /// executions, so the next pass settles them.
    fn lost(&mut self, computer: &str, error: Option<&str>) {
        self.by_computer.remove(computer);
        let executions = release(&mut lock(&self.inflight), computer);
        let error = error.unwrap_or("stopped without being asked");
        tracing::warn!(
            computer_id = %computer,
            error = %error,
            ?executions,
            "computer actor failed; its executions are settled again"
        );
    }

    /// An actor exited: if it is still its Computer's actor, it is lost. (One the driver stopped
    /// was forgotten when it was stopped.)
    fn exited(&mut self, exit: Exit) {
        let computer = self.by_computer.iter().find(|(_, a)| a.get_id() == exit.actor).map(|(c, _)| c.clone());
        if let Some(computer) = computer {
            self.lost(&computer, exit.error.as_deref());
        }
    }
}

/// Runs the driver until `stop` turns true.
pub async fn run_driver(cluster: Cluster, providers: ProviderFactory, mut stop: watch::Receiver<bool>) {
    let (exits_tx, mut exits) = mpsc::unbounded_channel();
    let supervisor = match Actor::spawn(None, ComputerSupervisor, exits_tx).await {
        Ok((s, _)) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the computer actors' supervisor: no lifecycle work runs here");
            return;
        }
    };
    let mut applied = cluster.state().subscribe();
    let mut actors = Actors { by_computer: HashMap::new(), inflight: Inflight::default() };
    loop {
        let leader = cluster.view().leader_id;
        let inflight = lock(&actors.inflight).clone();
        let pass = cluster.state().read(|s| survey(s, cluster.id(), leader, &inflight, actors.by_computer.keys()));
        for (exe, claim) in pass.lost {
            settle_lost(&cluster, &exe, claim).await;
        }
        for computer in pass.done {
            if let Some(a) = actors.by_computer.remove(&computer) {
                a.stop(None);
            }
        }
        for (exe, computer) in pass.run {
            {
                let mut inflight = lock(&actors.inflight);
                if inflight.contains_key(&exe) {
                    continue;
                }
                inflight.insert(exe.clone(), computer.clone());
            }
            let actor = match actors.by_computer.get(&computer) {
                Some(a) => a.clone(),
                None => {
                    let args = ComputerArgs {
                        computer_id: computer.clone(),
                        cluster: cluster.clone(),
                        providers: providers.clone(),
                        inflight: actors.inflight.clone(),
                    };
                    match Actor::spawn_linked(None, ComputerActor, args, supervisor.get_cell()).await {
                        Ok((a, _)) => {
                            actors.by_computer.insert(computer.clone(), a.clone());
                            a
                        }
                        Err(e) => {
                            tracing::warn!(computer_id = %computer, error = %e, "cannot start a computer actor");
                            lock(&actors.inflight).remove(&exe);
                            continue;
                        }
                    }
                }
            };
            if let Err(e) = actor.send_message(ComputerMessage::Run(exe.clone())) {
                // It stopped before its exit reached us: the same as a crash.
                actors.lost(&computer, Some(&e.to_string()));
            }
        }
        tokio::select! {
            _ = applied.changed() => {}
            Some(exit) = exits.recv() => {
                actors.exited(exit);
                while let Ok(exit) = exits.try_recv() {
                    actors.exited(exit);
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    for a in actors.by_computer.values() {
        a.stop(None);
    }
    supervisor.stop(None);
}

/// Declares a dispatched call whose sender is gone unknown (the store re-checks who may; a call
/// whose answer was recorded meanwhile is refused harmlessly).
async fn settle_lost(cluster: &Cluster, exe: &str, claim: String) {
    let cmd = Command::MarkUnknown {
        execution_id: exe.to_string(),
        claim,
        node: Some(cluster.id()),
        reason: "the node driving this call stopped (or its Computer actor crashed) before its answer was recorded"
            .into(),
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
            desktop_view: None,
            env: Default::default(),
            resources: None,
            metadata: Default::default(),
            egress: None,
            egress_denied_through: 0,
            egress_revision: 0,
            pooled: false,
        }
    }

    /// Live nodes `live`, the running Computer `cmp_a` and its pause `exe_a`, as `edit` leaves it.
    fn world(live: &[NodeId], edit: impl FnOnce(&mut Execution)) -> State {
        let mut s = State { live_nodes: live.iter().copied().collect(), ..State::default() };
        s.computers.insert("cmp_a".into(), computer("cmp_a", ComputerState::Running));
        let mut e = Execution::pending("exe_a", "k", "h", ExecutionKind::Pause, "cmp_a", 1);
        edit(&mut e);
        s.executions.insert(e.id.clone(), e);
        s.reindex_executions();
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
        let inflight = inflight.iter().map(|e| (e.to_string(), "cmp_a".to_string())).collect();
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
    fn a_crashed_actors_executions_are_released_and_settled_again() {
        let mut inflight: HashMap<String, String> =
            [("exe_a", "cmp_a"), ("exe_b", "cmp_b"), ("exe_c", "cmp_a")].map(|(e, c)| (e.into(), c.into())).into();
        assert_eq!(release(&mut inflight, "cmp_a"), ["exe_a", "exe_c"]);
        assert_eq!(inflight, HashMap::from([("exe_b".into(), "cmp_b".into())]), "other actors' executions stay");
        // What the next pass does with a released execution, on its owner.
        let s = world(&[1, 2, 3], |_| {});
        let (owner, _) = owner_and_other(&s);
        let s = world(&[1, 2, 3], claimed(Some(owner), true));
        assert_eq!(survey(&s, owner, None, &inflight, std::iter::empty()), lost(), "dispatched: unknown");
        let s = world(&[1, 2, 3], claimed(Some(owner), false));
        assert_eq!(survey(&s, owner, None, &inflight, std::iter::empty()), run(), "undispatched: run again");
    }

    #[test]
    fn actors_of_deleted_or_gone_computers_are_done() {
        let mut s = world(&[1, 2, 3], |e| e.state = ExecutionState::Succeeded);
        s.computers.insert("cmp_d".into(), computer("cmp_d", ComputerState::Deleted));
        s.computers.insert("cmp_p".into(), computer("cmp_p", ComputerState::Paused));
        let actors: Vec<String> = ["cmp_a", "cmp_d", "cmp_p", "cmp_x"].map(String::from).into();
        let p = survey(&s, 1, Some(1), &HashMap::new(), actors.iter());
        assert_eq!(p.done, ["cmp_d", "cmp_x"]);
    }
}
