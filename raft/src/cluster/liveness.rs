//! Liveness: on the leader, how long each peer has been silent (the live set placement uses); on
//! every node, whether it is in touch with a quorum (health and the shedding of agent links).

use std::time::Duration;

use openraft::type_config::async_runtime::WatchReceiver;

use super::Cluster;
use crate::NodeId;

impl Cluster {
    /// On the leader: for each other member, how long since it last acknowledged a heartbeat or
    /// an append (`None`: never, in this term). `None` on a node that does not lead.
    pub fn peer_silence(&self) -> Option<std::collections::BTreeMap<NodeId, Option<Duration>>> {
        let m = self.raft().metrics().borrow_watched().clone();
        let acks = m.heartbeat?;
        Some(
            acks.into_iter()
                .filter(|(id, _)| *id != self.id())
                .map(|(id, at)| (id, at.map(|t| openraft::Instant::elapsed(&*t))))
                .collect(),
        )
    }

    /// Records that a current leader's append or heartbeat was accepted.
    pub fn note_leader_contact(&self) {
        let ms = (self.inner.started.elapsed().as_millis() as u64).max(1);
        self.inner.leader_contact_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether this node is in touch with a quorum: a leader acknowledged by a quorum, or a
    /// follower that heard from its leader, within five minimum election timeouts (a single-voter
    /// cluster's leader always is). A node out of touch is cut off (a partition, or a dead
    /// quorum): it cannot commit anything, so it should not take calls or hold links.
    pub fn quorum_contact(&self) -> bool {
        let m = self.raft().metrics().borrow_watched().clone();
        let window = self.inner.contact_window;
        if m.current_leader == Some(self.id()) {
            let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
            if voters == [self.id()] {
                return true;
            }
            return m.last_quorum_acked.is_some_and(|t| openraft::Instant::elapsed(&*t) < window);
        }
        let at = self.inner.leader_contact_ms.load(std::sync::atomic::Ordering::Relaxed);
        at != 0 && self.inner.started.elapsed().saturating_sub(Duration::from_millis(at)) < window
    }
}
