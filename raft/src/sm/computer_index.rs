//! Derived indexes over Computers and grants, so that listing a caller's Computers and ending a
//! bot's grants never walk every Computer: Computers by owner, the shared ones, and the
//! Computers each bot holds a grant on. Not serialized; rebuilt when a snapshot loads
//! ([`State::reindex_computers`]). Every change to `computers` or `grants` goes through the
//! helpers here.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use super::identity::Role;
use super::model::Computer;
use super::model::ComputerState;
use super::response::Reject;
use super::response::RejectKind;
use super::state::Caller;
use super::state::State;

/// See the module doc.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComputerIndex {
    /// member id -> ids of the Computers it owns.
    pub by_owner: BTreeMap<String, BTreeSet<String>>,
    /// Ids of shared Computers.
    pub shared: BTreeSet<String>,
    /// bot id -> ids of the Computers it holds a grant on.
    pub granted: BTreeMap<String, BTreeSet<String>>,
    /// member id -> how many of the Computers it owns are not deleted (`by_owner` keeps the
    /// tombstones too), for the cap of [`Limits`](super::limits::Limits).
    pub live_by_owner: BTreeMap<String, usize>,
}

/// The most Computers one list answers.
pub const MAX_LIST: usize = 1000;

impl State {
    /// Rebuilds [`ComputerIndex`] from the records.
    pub fn reindex_computers(&mut self) {
        let mut index = ComputerIndex::default();
        for c in self.computers.values() {
            index.by_owner.entry(c.owner.clone()).or_default().insert(c.id.clone());
            if c.state != ComputerState::Deleted {
                *index.live_by_owner.entry(c.owner.clone()).or_default() += 1;
            }
            if c.shared {
                index.shared.insert(c.id.clone());
            }
        }
        for (computer, bots) in &self.grants {
            for bot in bots.keys() {
                index.granted.entry(bot.clone()).or_default().insert(computer.clone());
            }
        }
        self.computer_index = index;
    }

    /// How many Computers `owner` owns that are not deleted.
    pub fn live_computer_count(&self, owner: &str) -> usize {
        self.computer_index.live_by_owner.get(owner).copied().unwrap_or(0)
    }

    /// Refuses (a conflict) a new Computer of `owner` when it owns as many live ones as the
    /// organization's limits allow.
    pub(crate) fn check_computer_room(&self, owner: &str) -> Result<(), Reject> {
        let limit = self.limits.live_computers_per_member();
        if self.live_computer_count(owner) as u64 >= limit {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("a member owns at most {limit} computers that are not deleted: delete one first"),
            ));
        }
        Ok(())
    }

    /// Notes that a Computer of `owner` stopped (`-1`) or started (`+1`) counting as live.
    pub(crate) fn count_live_computer(&mut self, owner: &str, live: bool) {
        let n = self.computer_index.live_by_owner.entry(owner.to_string()).or_default();
        if live {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
        if *n == 0 {
            self.computer_index.live_by_owner.remove(owner);
        }
    }

    /// Records a new Computer.
    pub(crate) fn insert_computer(&mut self, c: Computer) {
        if let Some(old) = self.computers.get(&c.id).filter(|o| o.state != ComputerState::Deleted) {
            let owner = old.owner.clone();
            self.count_live_computer(&owner, false);
        }
        if c.state != ComputerState::Deleted {
            self.count_live_computer(&c.owner, true);
        }
        self.computer_index.by_owner.entry(c.owner.clone()).or_default().insert(c.id.clone());
        if c.shared {
            self.computer_index.shared.insert(c.id.clone());
        }
        self.computers.insert(c.id.clone(), c);
    }

    /// Forgets a Computer's record (its grants are gone already).
    pub(crate) fn remove_computer(&mut self, id: &str) {
        let Some(c) = self.computers.remove(id) else { return };
        if c.state != ComputerState::Deleted {
            self.count_live_computer(&c.owner, false);
        }
        if let Some(ids) = self.computer_index.by_owner.get_mut(&c.owner) {
            ids.remove(id);
            if ids.is_empty() {
                self.computer_index.by_owner.remove(&c.owner);
            }
        }
        self.computer_index.shared.remove(id);
    }

    /// Notes a grant of `bot` on `computer` in the index.
    pub(crate) fn index_grant(&mut self, computer: &str, bot: &str) {
        self.computer_index.granted.entry(bot.to_string()).or_default().insert(computer.to_string());
    }

    /// Removes the grant of `bot` on `computer` (record and index).
    pub(crate) fn remove_grant(&mut self, computer: &str, bot: &str) {
        if let Some(g) = self.grants.get_mut(computer) {
            g.remove(bot);
            if g.is_empty() {
                self.grants.remove(computer);
            }
        }
        if let Some(ids) = self.computer_index.granted.get_mut(bot) {
            ids.remove(computer);
            if ids.is_empty() {
                self.computer_index.granted.remove(bot);
            }
        }
    }

    /// Removes every grant on `computer` (record and index).
    pub(crate) fn remove_grants_on(&mut self, computer: &str) {
        let bots: Vec<String> = self.grants.get(computer).map(|g| g.keys().cloned().collect()).unwrap_or_default();
        for bot in bots {
            self.remove_grant(computer, &bot);
        }
    }

    /// The Computers `bot` holds a grant on.
    pub fn granted_to(&self, bot: &str) -> impl Iterator<Item = &String> + '_ {
        self.computer_index.granted.get(bot).into_iter().flatten()
    }

    /// The Computers `caller` may see, in id order after `after`, at most `limit` (capped at
    /// [`MAX_LIST`]); and the cursor of the next page when there is one. Candidates come from
    /// the indexes (a bot: its grants; a member: its own and the shared ones; an owner or
    /// admin: all), each then checked with [`State::can_see`].
    pub fn computers_visible_to<'a>(
        &'a self,
        caller: &Caller,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<&'a Computer>, Option<String>) {
        self.computers_visible_where(caller, after, limit, &|_| true, usize::MAX)
    }

    /// [`State::computers_visible_to`], keeping only the Computers `keep` accepts, and examining
    /// at most `budget` candidates (at least 1): when the budget runs out first, the page may
    /// be short (even empty) and its cursor is the last candidate examined, so the client goes
    /// on from there and no request walks every record.
    pub fn computers_visible_where<'a>(
        &'a self,
        caller: &Caller,
        after: Option<&str>,
        limit: usize,
        keep: &dyn Fn(&Computer) -> bool,
        budget: usize,
    ) -> (Vec<&'a Computer>, Option<String>) {
        let budget = budget.max(1);
        let limit = limit.clamp(1, MAX_LIST);
        let after = after.unwrap_or_default().to_string();
        let past = |id: &&String| id.as_str() > after.as_str();
        let candidates: Box<dyn Iterator<Item = &String> + '_> = match &caller.bot {
            Some(bot) => Box::new(self.granted_to(&bot.id).filter(past)),
            None if caller.member.role >= Role::Admin => Box::new(
                self.computers
                    .range::<str, _>((std::ops::Bound::Excluded(after.as_str()), std::ops::Bound::Unbounded))
                    .map(|(id, _)| id),
            ),
            None => {
                let own = self.computer_index.by_owner.get(&caller.member.id).into_iter().flatten().filter(past);
                let shared = self.computer_index.shared.iter().filter(past);
                Box::new(merge(own, shared))
            }
        };
        let mut rows: Vec<&Computer> = Vec::new();
        let (mut examined, mut last) = (0usize, None::<&String>);
        for id in candidates {
            if examined == budget {
                return (rows, last.cloned());
            }
            examined += 1;
            last = Some(id);
            let Some(c) = self.computers.get(id) else { continue };
            if c.state == ComputerState::Deleted || !self.can_see(caller, c) || !keep(c) {
                continue;
            }
            if rows.len() == limit {
                // This one is for the next page.
                let next = rows.last().map(|c| c.id.clone());
                return (rows, next);
            }
            rows.push(c);
        }
        (rows, None)
    }
}

/// Two ascending id iterators merged into one, without repeats.
fn merge<'a>(
    a: impl Iterator<Item = &'a String> + 'a,
    b: impl Iterator<Item = &'a String> + 'a,
) -> impl Iterator<Item = &'a String> + 'a {
    let mut a = a.peekable();
    let mut b = b.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if x < y => a.next(),
        (Some(x), Some(y)) if x > y => b.next(),
        (Some(_), Some(_)) => {
            b.next();
            a.next()
        }
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}
