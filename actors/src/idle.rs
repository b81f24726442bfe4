//! Idle pause, the node side: every node notes the work it sees ([`Activity`]) and reports it to
//! the shared plan in batches ([`run_reporter`], one store write per tick for all Computers, not
//! one per call); the leader's scheduler ([`run_scheduler`]) asks for the pause of each Computer
//! whose deadline passed. The plan itself, and the one-pause-per-version rule, are in the store
//! (`computerd_raft::sm`, module `plan`).
//!
//! Work is: a session or file call (marked when the call is let through to the agent), and a
//! command still running in the sandbox (the agent reports how many run; while any does, the
//! Computer is marked busy at every tick). A call near the Computer's deadline, or while an
//! idle pause of it is pending, marks its work in the store before it is let through
//! ([`Activity::before_call`]), so a pause is either cancelled or waited for, never sent under
//! a command that just started. Marks travel as ages, dated by the leader's stamp: no node's
//! wall clock moves a deadline.

use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

use computerd_raft::cluster::Cluster;
use computerd_raft::cluster::ClusterError;
use computerd_raft::sm::Command;
use computerd_raft::sm::ComputerState;
use computerd_raft::sm::ExecutionKind;
use computerd_raft::sm::RejectKind;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use computerd_raft::sm::Source;
use tokio::sync::watch;

use crate::now_ms;

/// A call is let through with its work reported in the next batch only while this node's last
/// reported work on the Computer is this much further from the deadline; closer, it marks the
/// work in the store first ([`Activity::before_call`]). Covers the reporter's tick and the time
/// its write may take.
pub const SYNC_MARGIN: Duration = Duration::from_secs(3);

/// Work seen on this node, not yet reported, and the latest work the store holds from it.
#[derive(Default)]
pub struct Activity {
    inner: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// Work not yet reported, by Computer, at this node's monotonic clock.
    marks: HashMap<String, Instant>,
    busy: HashSet<String>,
    /// The latest work on each Computer whose mark this node saw committed.
    committed: HashMap<String, Instant>,
}

/// What a call on a Computer must do before it reaches the agent ([`Activity::before_call`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Go: the work is marked in the store, or will be by the next report, well before the
    /// Computer's deadline.
    Go,
    /// A pause of the Computer was sent: wait for this execution to end, then look again.
    Wait(String),
    /// The Computer is paused: resume it, then look again.
    Paused,
    /// The store answered from a newer state than this node's: read at a barrier, then look
    /// again.
    Retry,
}

impl Activity {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A call reached the Computer now.
    pub fn touch(&self, computer_id: &str) {
        let now = Instant::now();
        let mut s = self.seen();
        let m = s.marks.entry(computer_id.to_string()).or_insert(now);
        *m = (*m).max(now);
    }

    /// Whether commands run on the Computer (as its agent reports).
    pub fn set_busy(&self, computer_id: &str, busy: bool) {
        let mut s = self.seen();
        if busy {
            s.busy.insert(computer_id.to_string());
        } else if s.busy.remove(computer_id) {
            // Its last command just ended: that moment was still work.
            s.marks.insert(computer_id.to_string(), Instant::now());
        }
    }

    /// Takes the marks to report: every touched Computer at its latest mark, every busy one now.
    pub fn take(&self, now: Instant) -> Vec<(String, Instant)> {
        let mut s = self.seen();
        let mut out: HashMap<String, Instant> = std::mem::take(&mut s.marks);
        for id in &s.busy {
            out.insert(id.clone(), now);
        }
        let mut v: Vec<_> = out.into_iter().collect();
        v.sort();
        v
    }

    /// Puts back marks whose report failed.
    fn restore(&self, marks: Vec<(String, Instant)>) {
        let mut s = self.seen();
        for (id, at) in marks {
            let m = s.marks.entry(id).or_insert(at);
            *m = (*m).max(at);
        }
    }

    /// These marks are committed.
    fn committed(&self, marks: &[(String, Instant)]) {
        let mut s = self.seen();
        for (id, at) in marks {
            let m = s.committed.entry(id.clone()).or_insert(*at);
            *m = (*m).max(*at);
        }
    }

    /// Whether the store holds work on the Computer from this node less than `within` before
    /// `now`.
    fn fresh(&self, computer_id: &str, within: Duration, now: Instant) -> bool {
        self.seen().committed.get(computer_id).is_some_and(|w| now.saturating_duration_since(*w) < within)
    }

    /// Forgets the committed work of Computers `keep` refuses (no longer planned).
    fn prune(&self, keep: impl Fn(&str) -> bool) {
        self.seen().committed.retain(|id, _| keep(id));
    }

    /// Before a call on the Computer reaches its agent: notes the work, and says what the call
    /// must do first. A Computer that pauses by itself is marked in the store at once (one
    /// write, [`Command::WorkNow`]) when an idle pause of it is pending, or when this node's
    /// last committed work on it is within [`SYNC_MARGIN`] of its deadline; then the store's
    /// answer, at the commit point, decides: no pause was sent (any pending idle pause is
    /// cancelled, and no new one can be scheduled before the new deadline), or one was and the
    /// call waits for it. Otherwise the work goes into the next batch, which commits long before
    /// the deadline.
    pub async fn before_call(&self, cluster: &Cluster, computer_id: &str) -> Result<Gate, ClusterError> {
        let now = Instant::now();
        let look = cluster.state().read(|s| {
            let c = s.computers.get(computer_id)?;
            let active = c.active_execution.as_ref().and_then(|e| s.executions.get(e));
            let sent_pause =
                active.filter(|e| e.kind == ExecutionKind::Pause && e.dispatched_at.is_some()).map(|e| e.id.clone());
            let idle_pending = active.is_some_and(|e| computerd_raft::sm::is_idle_pause(e) && e.is_open());
            let after = c.pause_after.filter(|_| c.source != Source::Paired);
            Some((c.state, sent_pause, idle_pending, after))
        });
        let Some((state, sent_pause, idle_pending, after)) = look else {
            self.touch(computer_id);
            return Ok(Gate::Go);
        };
        if state == ComputerState::Paused {
            return Ok(Gate::Paused);
        }
        if let Some(exe) = sent_pause {
            return Ok(Gate::Wait(exe));
        }
        let Some(after) = after else {
            self.touch(computer_id);
            return Ok(Gate::Go);
        };
        let within = Duration::from_secs(after).saturating_sub(SYNC_MARGIN);
        if !idle_pending && self.fresh(computer_id, within, now) {
            self.touch(computer_id);
            return Ok(Gate::Go);
        }
        let sent = Instant::now();
        match cluster.propose(Request::new(Command::WorkNow { computer_id: computer_id.to_string() })).await? {
            Response::Rejected(r) if r.kind == RejectKind::ComputerConflict && r.execution_id.is_some() => {
                Ok(Gate::Wait(r.execution_id.unwrap_or_default()))
            }
            Response::Rejected(r) => {
                tracing::debug!(computer_id, reason = %r.message, "work not marked; looking again");
                Ok(Gate::Retry)
            }
            Response::Ok | Response::Id(_) => {
                self.committed(&[(computer_id.to_string(), sent)]);
                Ok(Gate::Go)
            }
        }
    }
}

/// Reports this node's marks every `every`, for Computers in the plan only, until `stop`. Each
/// mark travels as its age (this node's monotonic clock); the store dates it by the leader's
/// stamp.
pub async fn run_reporter(
    activity: std::sync::Arc<Activity>,
    cluster: Cluster,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    while crate::tick(every, &mut stop).await {
        let marks: Vec<(String, Instant)> = {
            let all = activity.take(Instant::now());
            cluster.state().read(|s| {
                activity.prune(|id| s.plan.contains_key(id));
                all.into_iter().filter(|(id, _)| s.plan.contains_key(id)).collect()
            })
        };
        if marks.is_empty() {
            continue;
        }
        let sent = Instant::now();
        let ages = marks
            .iter()
            .map(|(id, at)| {
                (id.clone(), u64::try_from(sent.saturating_duration_since(*at).as_millis()).unwrap_or(u64::MAX))
            })
            .collect();
        match cluster.propose(Request::new(Command::ReportWork { ages })).await {
            Ok(_) => activity.committed(&marks),
            Err(e) => {
                tracing::warn!(error = %e, "could not report activity; keeping it for the next tick");
                activity.restore(marks);
            }
        }
    }
}

/// How many pauses one tick asks for at most.
const PAUSES_PER_TICK: usize = 256;

/// On the leader, every `every`, and at the next deadline when it comes sooner: asks for the
/// idle pause of each due Computer (the store turns each into one execution per plan version;
/// the driver runs it like any other).
pub async fn run_scheduler(cluster: Cluster, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut wait = every;
    while crate::tick(wait, &mut stop).await {
        wait = every;
        if cluster.view().leader_id != Some(cluster.id()) {
            continue;
        }
        // The cluster's clock, where this leader's wall clock lags the stamps it applied.
        let now = now_ms().max(cluster.state().read(|s| s.clock));
        tick(&cluster, now).await;
        if let Some(next) = cluster.state().read(|s| s.plan_next(now)) {
            let left = Duration::from_millis(next.saturating_sub(now_ms().max(now)));
            wait = every.min(left.max(Duration::from_millis(5)));
        }
    }
}

/// One scheduler pass; answers how many pauses were asked for.
pub async fn tick(cluster: &Cluster, now: u64) -> usize {
    let due = cluster.state().read(|s| s.plan_due(now, PAUSES_PER_TICK));
    let mut asked = 0;
    for (computer_id, version) in due {
        let cmd = Command::PlanPause {
            computer_id: computer_id.clone(),
            version,
            execution_id: format!("exe_{}", hex::encode(rand::random::<[u8; 16]>())),
            at_ms: now,
        };
        match cluster.propose(Request::new(cmd)).await {
            Ok(Response::Id(exe)) => {
                asked += 1;
                tracing::info!(computer_id = %computer_id, execution_id = %exe, version, "idle pause scheduled");
            }
            Ok(Response::Rejected(r)) => {
                tracing::debug!(computer_id = %computer_id, reason = %r.message, "no idle pause")
            }
            Ok(Response::Ok) => {}
            Err(e) => {
                tracing::warn!(error = %e, "store unavailable; the scheduler tries again next tick");
                break;
            }
        }
    }
    asked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_batched_and_busy_computers_stay_marked() {
        let a = Activity::default();
        a.touch("cmp_a");
        a.touch("cmp_a");
        a.set_busy("cmp_b", true);
        let t1 = Instant::now() + Duration::from_secs(1);
        let first = a.take(t1);
        assert_eq!(first.len(), 2, "one mark per computer: {first:?}");
        assert_eq!(first[1], ("cmp_b".to_string(), t1));
        let t2 = t1 + Duration::from_secs(1);
        let second = a.take(t2);
        assert_eq!(second, vec![("cmp_b".to_string(), t2)], "busy stays marked; touches are taken once");
        a.set_busy("cmp_b", false);
        assert_eq!(a.take(t2).len(), 1, "the end of the last command is a mark");
        assert!(a.take(t2).is_empty());
        a.restore(vec![("cmp_c".into(), t1)]);
        assert_eq!(a.take(t2), vec![("cmp_c".to_string(), t1)]);
    }

    #[test]
    fn only_committed_recent_work_is_fresh() {
        let a = Activity::default();
        let t0 = Instant::now();
        let within = Duration::from_secs(7);
        assert!(!a.fresh("cmp_a", within, t0), "nothing committed from this node: not fresh");
        a.touch("cmp_a");
        assert!(!a.fresh("cmp_a", within, t0), "a mark not yet reported does not count");
        a.committed(&[("cmp_a".into(), t0)]);
        assert!(a.fresh("cmp_a", within, t0 + Duration::from_secs(6)));
        assert!(!a.fresh("cmp_a", within, t0 + Duration::from_secs(7)), "near the deadline: not fresh");
        a.committed(&[("cmp_a".into(), t0 - Duration::from_secs(1))]);
        assert!(a.fresh("cmp_a", within, t0 + Duration::from_secs(6)), "an older commit moves nothing back");
        a.prune(|id| id != "cmp_a");
        assert!(!a.fresh("cmp_a", within, t0), "pruned");
    }
}
