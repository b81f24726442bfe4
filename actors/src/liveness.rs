//! The leader's liveness keeper: it records in the store which nodes are live, and the store
//! places every Computer's lifecycle work over them (`State::placement`, rendezvous hashing).
//!
//! A member is live while it acknowledged the leader's heartbeats or appends within `dead_after`
//! (openraft's per-follower acknowledgement times); a newly elected leader gives every member
//! `dead_after` from its election before declaring it dead. The leader is always live. The set is
//! proposed only when it changes, so a quiet cluster writes nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use computerd_raft::cluster::Cluster;
use computerd_raft::sm::Command;
use computerd_raft::sm::Request;
use tokio::sync::watch;
use tokio::time::Instant;

/// Runs the keeper every `every` until `stop`.
pub async fn run_liveness(cluster: Cluster, every: Duration, dead_after: Duration, mut stop: watch::Receiver<bool>) {
    let mut led_term: Option<(u64, Instant)> = None;
    while crate::tick(every, &mut stop).await {
        let view = cluster.view();
        if view.leader_id != Some(cluster.id()) {
            led_term = None;
            continue;
        }
        let since = match led_term {
            Some((term, since)) if term == view.term => since,
            _ => {
                let now = Instant::now();
                led_term = Some((view.term, now));
                now
            }
        };
        let Some(silence) = cluster.peer_silence() else { continue };
        let members: Vec<u64> = view.members.iter().map(|m| m.id).collect();
        let live = live_set(cluster.id(), &members, &silence, since.elapsed(), dead_after);
        let stored = cluster.state().read(|s| s.live_nodes.clone());
        if live == stored {
            continue;
        }
        tracing::info!(live = ?live, was = ?stored, "live nodes changed");
        let cmd = Command::SetLiveNodes { nodes: live.into_iter().collect() };
        if let Err(e) = cluster.propose(Request::new(cmd)).await {
            tracing::warn!(error = %e, "could not record the live nodes");
        }
    }
}

/// The live members: the leader, and every member heard from within `dead_after` (or not yet
/// heard from while the leadership itself is younger than `dead_after`).
fn live_set(
    me: u64,
    members: &[u64],
    silence: &std::collections::BTreeMap<u64, Option<Duration>>,
    leading_for: Duration,
    dead_after: Duration,
) -> BTreeSet<u64> {
    members
        .iter()
        .copied()
        .filter(|n| {
            *n == me
                || match silence.get(n).copied().flatten() {
                    Some(quiet) => quiet < dead_after,
                    None => leading_for < dead_after,
                }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn live_set_rules() {
        let ms = Duration::from_millis;
        let silence: BTreeMap<u64, Option<Duration>> =
            BTreeMap::from([(2, Some(ms(100))), (3, Some(ms(5000))), (4, None)]);
        let members = [1, 2, 3, 4];
        // A young leadership gives the unheard member time; a long-silent one is dead.
        assert_eq!(live_set(1, &members, &silence, ms(200), ms(1200)), BTreeSet::from([1, 2, 4]));
        // Later, the never-heard member is dead too.
        assert_eq!(live_set(1, &members, &silence, ms(2000), ms(1200)), BTreeSet::from([1, 2]));
        // The leader is live even with no entry of its own.
        assert_eq!(live_set(1, &[1], &BTreeMap::new(), ms(0), ms(1200)), BTreeSet::from([1]));
    }
}
