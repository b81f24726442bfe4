//! The store's version gate, for rolling upgrades. Each build speaks the store commands of one
//! version ([`STORE_VERSION`]); each node records what it speaks when it starts
//! ([`super::Command::NodeSpeaks`]). A command introduced at a later version
//! ([`super::Command::since`]) is never appended until every member of the membership speaks
//! it: a node of an older build cannot read it, so appending it early would stop that node.
//! The leader checks this before it appends (`cluster::leader`); apply does not, since a
//! command it decoded is one this build speaks. There is no downgrade past a version whose
//! commands were used.

use super::Command;
use super::State;

/// The store version of this build. (The `upgrade-probe` feature builds a node one version
/// ahead, with one more command, for the rolling-upgrade test.)
pub const STORE_VERSION: u32 = if cfg!(feature = "upgrade-probe") { 2 } else { 1 };

impl Command {
    /// The store version that introduced this command.
    pub fn since(&self) -> u32 {
        match self {
            #[cfg(feature = "upgrade-probe")]
            Command::UpgradeProbe { .. } => 2,
            _ => 1,
        }
    }
}

impl State {
    /// The store version node `id` last said it speaks (1 for a node that never said: every
    /// build before the gate speaks version 1).
    pub fn speaks(&self, id: u64) -> u32 {
        self.node_versions.get(&id).copied().unwrap_or(1)
    }

    /// Of `members`, those that do not speak store version `version` (in order).
    pub fn behind(&self, members: impl IntoIterator<Item = u64>, version: u32) -> Vec<u64> {
        members.into_iter().filter(|id| self.speaks(*id) < version).collect()
    }

    pub(crate) fn node_speaks(&mut self, node_id: u64, version: u32) {
        if version <= 1 {
            self.node_versions.remove(&node_id);
        } else {
            self.node_versions.insert(node_id, version);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_speaks_version_1_until_it_says_otherwise_and_a_removed_one_is_forgotten() {
        let mut s = State::default();
        assert_eq!((s.speaks(1), s.behind([1, 2, 3], 2)), (1, vec![1, 2, 3]));
        s.apply(&Command::NodeSpeaks { node_id: 2, version: 2 });
        s.apply(&Command::NodeSpeaks { node_id: 3, version: 2 });
        assert_eq!(s.behind([1, 2, 3], 2), vec![1]);
        assert!(s.behind([1, 2, 3], 1).is_empty());
        s.apply(&Command::NodeSpeaks { node_id: 3, version: 1 });
        assert_eq!((s.behind([2, 3], 2), s.node_versions.len()), (vec![3], 1), "a downgrade says so too");
        assert_eq!(Command::NodeSpeaks { node_id: 1, version: 1 }.since(), 1);
    }
}
