//! Placement of lifecycle work: which node drives a Computer's executions.
//!
//! The store holds the set of live nodes ([`State::live_nodes`]), which only the leader changes
//! ([`Command::SetLiveNodes`], from its replication acknowledgements). The owner of a Computer is
//! a pure function of that set: rendezvous hashing ([`State::placement`]), so every replica at the
//! same applied index names the same node, a Computer moves only when its node leaves the set (or
//! comes back), and adding a node moves about 1/N of the Computers.
//!
//! The rule is enforced where it matters, at commit:
//! - a claim names its node and is refused unless that node owns the Computer;
//! - a dispatch is refused when the Computer moved after the claim (nothing was sent);
//! - a call already dispatched may still report its answer (the claim fences it, not the owner);
//! - `MarkUnknown` is accepted from the claim's own node (it lost the call in a restart), or from
//!   the owner when the claiming node is no longer live.
//!
//! An empty set (a store from before placement, or the first instants of a cluster) places
//! nothing: the leader drives, as the driver's fallback.

use super::response::Reject;
use super::response::RejectKind;
use super::state::State;

/// A stable 64-bit FNV-1a hash (the same on every build and platform).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff; // separator, so ("ab","c") and ("a","bc") differ
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The rendezvous score of a node for a key: the highest score owns the key.
fn score(key: &str, node: u64) -> u64 {
    // A final avalanche step, so that neighbouring node ids spread evenly.
    let mut x = fnv1a(&[key.as_bytes(), &node.to_be_bytes()]);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

impl State {
    /// The live node that drives `computer_id`'s executions; `None` while no node is recorded
    /// live (then the leader drives).
    pub fn placement(&self, computer_id: &str) -> Option<u64> {
        self.live_nodes.iter().copied().max_by_key(|n| (score(computer_id, *n), *n))
    }

    /// The leader records the nodes it hears from.
    pub(crate) fn set_live_nodes(&mut self, nodes: &[u64]) -> Result<(), Reject> {
        if nodes.is_empty() {
            return Err(Reject::new(RejectKind::Invalid, "the live set holds at least the leader"));
        }
        self.live_nodes = nodes.iter().copied().collect();
        Ok(())
    }

    /// The owner of `computer_id` when it is placed on a node other than `node`.
    fn other_owner(&self, computer_id: &str, node: Option<u64>) -> Option<(u64, u64)> {
        match (node, self.placement(computer_id)) {
            (Some(n), Some(owner)) if n != owner => Some((n, owner)),
            _ => None,
        }
    }

    /// Refuses a claim from a node that does not own the execution's Computer.
    pub(crate) fn check_claim_node(&self, computer_id: &str, node: Option<u64>) -> Result<(), Reject> {
        match self.other_owner(computer_id, node) {
            Some((n, owner)) => Err(Reject::new(
                RejectKind::Conflict,
                format!("node {n} does not drive {computer_id}; node {owner} does"),
            )),
            None => Ok(()),
        }
    }

    /// Refuses the dispatch of a claim whose node no longer owns the Computer.
    pub(crate) fn check_dispatch_node(&self, computer_id: &str, claim_node: Option<u64>) -> Result<(), Reject> {
        match self.other_owner(computer_id, claim_node) {
            Some((n, owner)) => Err(Reject::new(
                RejectKind::Conflict,
                format!("{computer_id} moved to node {owner} after node {n} claimed it; nothing was sent"),
            )),
            None => Ok(()),
        }
    }

    /// Whether `node` may declare a dispatched call of `claim_node` unknown.
    pub(crate) fn check_unknown_node(
        &self,
        computer_id: &str,
        claim_node: Option<u64>,
        node: Option<u64>,
    ) -> Result<(), Reject> {
        let (Some(n), Some(claimer)) = (node, claim_node) else { return Ok(()) };
        if n == claimer {
            return Ok(()); // the claiming node lost its own call (it restarted)
        }
        if self.live_nodes.contains(&claimer) {
            return Err(Reject::new(RejectKind::Conflict, format!("node {claimer}, which sent the call, is live")));
        }
        if self.placement(computer_id) != Some(n) {
            return Err(Reject::new(RejectKind::Conflict, format!("node {n} does not drive {computer_id}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn with_nodes(nodes: &[u64]) -> State {
        let mut s = State::default();
        s.set_live_nodes(nodes).expect("set");
        s
    }

    #[test]
    fn no_live_set_places_nothing() {
        assert_eq!(State::default().placement("cmp_a"), None);
        assert!(State::default().set_live_nodes(&[]).is_err(), "an empty set is refused");
    }

    #[test]
    fn placement_is_deterministic_and_spread() {
        let s = with_nodes(&[1, 2, 3]);
        let again = with_nodes(&[3, 1, 2]);
        let mut per_node: HashMap<u64, usize> = HashMap::new();
        for i in 0..3000 {
            let id = format!("cmp_{i:06}");
            let owner = s.placement(&id).expect("an owner");
            assert_eq!(again.placement(&id), Some(owner), "the order of the set does not matter");
            *per_node.entry(owner).or_default() += 1;
        }
        for n in [1, 2, 3] {
            let share = per_node.get(&n).copied().unwrap_or(0);
            assert!((700..=1300).contains(&share), "node {n} owns {share} of 3000: {per_node:?}");
        }
    }

    #[test]
    fn only_the_dead_nodes_computers_move() {
        let before = with_nodes(&[1, 2, 3]);
        let after = with_nodes(&[1, 3]);
        let mut moved = 0;
        for i in 0..2000 {
            let id = format!("cmp_{i:06}");
            let (b, a) = (before.placement(&id), after.placement(&id));
            if b == Some(2) {
                moved += 1;
                assert!(matches!(a, Some(1) | Some(3)));
            } else {
                assert_eq!(a, b, "{id} moved although its node stayed");
            }
        }
        assert!(moved > 0);
        // And they come back when the node does.
        let back = with_nodes(&[1, 2, 3]);
        for i in 0..2000 {
            let id = format!("cmp_{i:06}");
            assert_eq!(back.placement(&id), before.placement(&id));
        }
    }

    #[test]
    fn fencing_rules() {
        let s = with_nodes(&[1, 2, 3]);
        let id = "cmp_fence";
        let owner = s.placement(id).expect("owner");
        let other = [1, 2, 3].into_iter().find(|n| *n != owner).expect("other");
        assert!(s.check_claim_node(id, Some(owner)).is_ok());
        assert!(s.check_claim_node(id, Some(other)).is_err());
        assert!(s.check_claim_node(id, None).is_ok(), "an unplaced claim (old log entries) passes");
        assert!(s.check_dispatch_node(id, Some(other)).is_err());
        // The claimer may always declare its own call lost; others only once it is dead.
        assert!(s.check_unknown_node(id, Some(other), Some(other)).is_ok());
        assert!(s.check_unknown_node(id, Some(other), Some(owner)).is_err(), "the claimer is live");
        let dead = with_nodes(&[owner]);
        assert!(dead.check_unknown_node(id, Some(other), Some(owner)).is_ok());
    }
}
