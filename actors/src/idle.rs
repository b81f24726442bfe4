//! Idle pause, the node side: every node notes the work it sees ([`Activity`]) and reports it to
//! the shared plan in batches ([`run_reporter`], one store write per tick for all Computers, not
//! one per call); the leader's scheduler ([`run_scheduler`]) asks for the pause of each Computer
//! whose deadline passed. The plan itself, and the one-pause-per-version rule, are in the store
//! (`computerd_raft::sm`, module `plan`).
//!
//! Work is: a session or file call (marked when the call is let through to the agent), and a
//! command still running in the sandbox (the agent reports how many run; while any does, the
//! Computer is marked busy at every tick).

use std::collections::HashMap;
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use computerd_raft::sm::Response;
use tokio::sync::watch;

use crate::now_ms;

/// Work seen on this node, not yet reported.
#[derive(Default)]
pub struct Activity {
    inner: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    marks: HashMap<String, u64>,
    busy: HashSet<String>,
}

impl Activity {
    /// A call reached the Computer now.
    pub fn touch(&self, computer_id: &str) {
        let now = now_ms();
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let m = s.marks.entry(computer_id.to_string()).or_insert(now);
        *m = (*m).max(now);
    }

    /// Whether commands run on the Computer (as its agent reports).
    pub fn set_busy(&self, computer_id: &str, busy: bool) {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if busy {
            s.busy.insert(computer_id.to_string());
        } else if s.busy.remove(computer_id) {
            // Its last command just ended: that moment was still work.
            s.marks.insert(computer_id.to_string(), now_ms());
        }
    }

    /// Takes the marks to report: every touched Computer at its latest mark, every busy one now.
    pub fn take(&self, now: u64) -> Vec<(String, u64)> {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: HashMap<String, u64> = std::mem::take(&mut s.marks);
        for id in &s.busy {
            out.insert(id.clone(), now);
        }
        let mut v: Vec<_> = out.into_iter().collect();
        v.sort();
        v
    }

    /// Puts back marks whose report failed.
    fn restore(&self, marks: Vec<(String, u64)>) {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for (id, at) in marks {
            let m = s.marks.entry(id).or_insert(at);
            *m = (*m).max(at);
        }
    }
}

/// Reports this node's marks every `every`, for Computers in the plan only, until `stop`.
pub async fn run_reporter(
    activity: std::sync::Arc<Activity>,
    cluster: Cluster,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    while crate::tick(every, &mut stop).await {
        let marks: Vec<(String, u64)> = {
            let all = activity.take(now_ms());
            cluster.state().read(|s| all.into_iter().filter(|(id, _)| s.plan.contains_key(id)).collect())
        };
        if marks.is_empty() {
            continue;
        }
        if let Err(e) = cluster.propose(Request::new(Command::ReportActivity { marks: marks.clone() })).await {
            tracing::warn!(error = %e, "could not report activity; keeping it for the next tick");
            activity.restore(marks);
        }
    }
}

/// How many pauses one tick asks for at most.
const PAUSES_PER_TICK: usize = 256;

/// On the leader, every `every`: asks for the idle pause of each due Computer (the store turns
/// each into one execution per plan version; the driver runs it like any other).
pub async fn run_scheduler(cluster: Cluster, every: Duration, mut stop: watch::Receiver<bool>) {
    while crate::tick(every, &mut stop).await {
        if cluster.view().leader_id != Some(cluster.id()) {
            continue;
        }
        tick(&cluster, now_ms()).await;
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
        let first = a.take(1_000_000_000_000_000);
        assert_eq!(first.len(), 2, "one mark per computer: {first:?}");
        assert_eq!(first[1], ("cmp_b".to_string(), 1_000_000_000_000_000));
        let second = a.take(2);
        assert_eq!(second, vec![("cmp_b".to_string(), 2)], "busy stays marked; touches are taken once");
        a.set_busy("cmp_b", false);
        assert_eq!(a.take(3).len(), 1, "the end of the last command is a mark");
        assert!(a.take(4).is_empty());
        a.restore(vec![("cmp_c".into(), 7)]);
        assert_eq!(a.take(5), vec![("cmp_c".to_string(), 7)]);
    }
}
