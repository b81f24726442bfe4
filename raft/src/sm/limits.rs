//! Limits: the organization's caps on bots and Computers. Each has a default, and an owner or
//! admin may move it (`PUT /v1/limits`) up to a hard ceiling, so the state stays bounded whatever
//! is set. A lowered cap refuses new records past it; it removes nothing that exists.
//!
//! The caps here are the ones a busy organization outgrows (a bot per customer, a Computer per
//! job). The fixed ones (members, tokens per principal, providers, grants per Computer) are
//! constants of their modules.

use serde::Deserialize;
use serde::Serialize;

use super::response::Reject;
use super::response::RejectKind;
use super::state::State;

/// Live (not archived) bots one member has, by default.
pub const DEFAULT_LIVE_BOTS_PER_MEMBER: u64 = 1_000;
/// Bots in the cluster, archived ones included (they are never removed), by default.
pub const DEFAULT_BOTS: u64 = 100_000;
/// Not-deleted Computers one member owns, by default.
pub const DEFAULT_LIVE_COMPUTERS_PER_MEMBER: u64 = 10_000;
/// The highest bot cap that may be set (in all and per member).
pub const CEILING_BOTS: u64 = 1_000_000;
/// The highest per-member Computer cap that may be set.
pub const CEILING_LIVE_COMPUTERS_PER_MEMBER: u64 = 100_000;

/// The organization's caps; `None` is the default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Live bots per member.
    #[serde(default)]
    pub live_bots_per_member: Option<u64>,
    /// Bots in all, archived ones included.
    #[serde(default)]
    pub bots: Option<u64>,
    /// Not-deleted Computers per member.
    #[serde(default)]
    pub live_computers_per_member: Option<u64>,
}

impl Limits {
    /// The live bots per member in force.
    pub fn live_bots_per_member(&self) -> u64 {
        self.live_bots_per_member.unwrap_or(DEFAULT_LIVE_BOTS_PER_MEMBER)
    }
    /// The bots in all in force.
    pub fn bots(&self) -> u64 {
        self.bots.unwrap_or(DEFAULT_BOTS)
    }
    /// The not-deleted Computers per member in force.
    pub fn live_computers_per_member(&self) -> u64 {
        self.live_computers_per_member.unwrap_or(DEFAULT_LIVE_COMPUTERS_PER_MEMBER)
    }

    /// Checks every value is between 1 and its ceiling.
    pub fn check(&self) -> Result<(), Reject> {
        let within = |v: Option<u64>, ceiling: u64, what: &str| match v {
            Some(n) if n == 0 || n > ceiling => {
                Err(Reject::new(RejectKind::Invalid, format!("{what} must be between 1 and {ceiling}")))
            }
            _ => Ok(()),
        };
        within(self.live_bots_per_member, CEILING_BOTS, "liveBotsPerMember")?;
        within(self.bots, CEILING_BOTS, "bots")?;
        within(self.live_computers_per_member, CEILING_LIVE_COMPUTERS_PER_MEMBER, "liveComputersPerMember")
    }
}

impl State {
    /// Sets the caps (owner or admin). Fields left out go back to their defaults.
    pub(crate) fn set_limits(&mut self, by: &str, limits: &Limits) -> Result<(), Reject> {
        self.caller_by_token_id(by)?.check_admin_write()?;
        limits.check()?;
        self.limits = *limits;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::Response;
    use crate::sm::testing::*;

    fn bot_cmd(id: &str) -> Command {
        let bot = crate::sm::Bot {
            id: id.into(),
            name: id.into(),
            member_id: "mem_o".into(),
            created_at: 1,
            archived_at: None,
        };
        Command::CreateBot { by: OWNER.into(), bot, parent: None }
    }

    #[test]
    fn a_raised_cap_lets_more_bots_in_and_a_lowered_one_refuses_new_ones() {
        let mut s = world();
        let set = |n| Command::SetLimits {
            by: OWNER.into(),
            limits: Limits { live_bots_per_member: Some(n), ..Limits::default() },
        };
        ok(s.apply(&set(2)));
        let live = s.live_bot_count("mem_o") as u64;
        for i in live..2 {
            ok(s.apply(&bot_cmd(&format!("bot_l{i}"))));
        }
        let refused = rejected(s.apply(&bot_cmd("bot_over")));
        assert_eq!(refused.kind, RejectKind::Conflict, "{refused:?}");
        assert!(!s.bots.contains_key("bot_over"), "a refused create changes nothing");
        ok(s.apply(&set(3)));
        ok(s.apply(&bot_cmd("bot_over")));
        // Lowered below what exists: the bots stay, a new one is refused.
        ok(s.apply(&set(1)));
        assert!(s.bots.contains_key("bot_over"));
        assert_eq!(rejected(s.apply(&bot_cmd("bot_more"))).kind, RejectKind::Conflict);
    }

    #[test]
    fn limits_out_of_range_are_invalid_and_change_nothing() {
        let mut s = world();
        for limits in [
            Limits { bots: Some(0), ..Limits::default() },
            Limits { bots: Some(CEILING_BOTS + 1), ..Limits::default() },
            Limits { live_computers_per_member: Some(CEILING_LIVE_COMPUTERS_PER_MEMBER + 1), ..Limits::default() },
        ] {
            let r = rejected(s.apply(&Command::SetLimits { by: OWNER.into(), limits }));
            assert_eq!(r.kind, RejectKind::Invalid, "{r:?}");
            assert_eq!(s.limits, Limits::default());
        }
        assert_eq!(s.limits.bots(), DEFAULT_BOTS);
    }

    #[test]
    fn a_bot_cannot_set_limits() {
        let mut s = world();
        let r = s.apply(&Command::SetLimits { by: "tok_bot".into(), limits: Limits::default() });
        assert!(matches!(r, Response::Rejected(ref j) if j.kind == RejectKind::Forbidden), "{r:?}");
    }
}
