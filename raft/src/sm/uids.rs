//! Binding-UID ranges: every Computer whose sandbox runs our agent on a shared kernel (the docker
//! provider) gets its own range of [`UID_RANGE_WIDTH`] UIDs for its tool bindings, so per-UID
//! kernel counters (RLIMIT_NPROC, a UID's signals and files) are never shared between two
//! Computers, even when several nodes drive one Docker engine: the range is allocated here, in the
//! replicated store, when the create is submitted, and freed when the Computer is deleted.
//!
//! Slot `i` is the range `UID_RANGE_BASE + (i + 1) * UID_RANGE_WIDTH ..+ UID_RANGE_WIDTH`: slot
//! numbers start one range above the agent's default first UID (200000), which paired machines
//! (and sandboxes created before ranges existed) keep using. Every range ends below 2^31, since
//! some tools still treat a UID as a signed 32-bit number; that bounds the ranges in use at once
//! to [`MAX_UID_RANGES`]. A freed slot is reused, smallest first; allocation and release are
//! O(log n) (a `BTreeSet` of freed slots and a high-water mark, no scan).

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use serde::Deserialize;
use serde::Serialize;

use super::response::Reject;
use super::response::RejectKind;

/// The agent's default first binding UID; the ranges handed out start one range above it.
pub const UID_RANGE_BASE: u32 = 200_000;
/// UIDs per Computer.
pub const UID_RANGE_WIDTH: u32 = 65_536;
/// Ranges that fit between the base and 2^31 (slot 0 starts one range above the base).
pub const MAX_UID_RANGES: u32 = ((i32::MAX as u32) - UID_RANGE_BASE) / UID_RANGE_WIDTH - 1;

/// The allocated ranges (part of [`super::State`], so of every snapshot).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UidRanges {
    /// The slot of each Computer that holds one.
    #[serde(default)]
    pub by_computer: BTreeMap<String, u32>,
    /// Slots freed by deletes, below `next`.
    #[serde(default)]
    pub free: BTreeSet<u32>,
    /// Slots `0..next` were handed out at least once.
    #[serde(default)]
    pub next: u32,
}

/// The first UID of slot `slot`.
pub fn first_uid_of(slot: u32) -> u32 {
    UID_RANGE_BASE + (slot + 1) * UID_RANGE_WIDTH
}

impl UidRanges {
    /// The first binding UID of a Computer's range, if it holds one.
    pub fn first_uid(&self, computer_id: &str) -> Option<u32> {
        self.by_computer.get(computer_id).map(|&s| first_uid_of(s))
    }

    /// Checks, changing nothing, that a range can be allocated now.
    pub fn check_free(&self) -> Result<(), Reject> {
        if self.free.is_empty() && self.next >= MAX_UID_RANGES {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!(
                    "all {MAX_UID_RANGES} binding-UID ranges are in use (one per docker Computer that is not deleted): delete one first"
                ),
            ));
        }
        Ok(())
    }

    /// Allocates a range for `computer_id` (its own when it holds one already); answers its first
    /// UID.
    pub fn allocate(&mut self, computer_id: &str) -> Result<u32, Reject> {
        if let Some(uid) = self.first_uid(computer_id) {
            return Ok(uid);
        }
        self.check_free()?;
        let slot = match self.free.pop_first() {
            Some(s) => s,
            None => {
                self.next += 1;
                self.next - 1
            }
        };
        self.by_computer.insert(computer_id.to_string(), slot);
        Ok(first_uid_of(slot))
    }

    /// Frees the range of `computer_id`, if it holds one.
    pub fn release(&mut self, computer_id: &str) {
        if let Some(slot) = self.by_computer.remove(computer_id) {
            self.free.insert(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::Computer;
    use crate::sm::ComputerState;
    use crate::sm::Execution;
    use crate::sm::ExecutionKind;
    use crate::sm::Member;
    use crate::sm::Organization;
    use crate::sm::Outcome;
    use crate::sm::Principal;
    use crate::sm::Provider;
    use crate::sm::ProviderKind;
    use crate::sm::Role;
    use crate::sm::Source;
    use crate::sm::State;
    use crate::sm::Submit;
    use crate::sm::testing::ok;
    use crate::sm::testing::rejected;
    use crate::sm::testing::token;

    const OWNER: &str = "tok_owner";

    /// An owner, a docker provider `cpp_d` and a fake one `cpp_f`.
    fn world() -> State {
        let mut s = State::default();
        let owner = Member { id: "mem_o".into(), name: "o".into(), email: None, role: Role::Owner, created_at: 1 };
        ok(s.apply(&Command::Bootstrap {
            cluster_id: "c".into(),
            org: Organization { id: "org".into(), name: "o".into(), created_at: 1 },
            owner,
            token: token(OWNER, Principal::Member("mem_o".into())),
            join_secret_hash: None,
        }));
        for (id, kind) in [("cpp_d", ProviderKind::Docker), ("cpp_f", ProviderKind::Fake)] {
            let provider = Provider {
                id: id.into(),
                kind,
                name: id.into(),
                config: Default::default(),
                secrets: Default::default(),
                created_by: "mem_o".into(),
                created_at: 1,
            };
            ok(s.apply(&Command::CreateProvider { by: OWNER.into(), provider }));
        }
        s
    }

    fn submit(kind: ExecutionKind, computer: &str, provider: &str) -> Command {
        let key = format!("{computer}-{kind:?}");
        let exe = Execution::pending(&format!("exe_{key}"), &key, "b", kind, computer, 1);
        let c = (kind == ExecutionKind::Create).then(|| Computer {
            id: computer.into(),
            name: "c".into(),
            owner: "mem_o".into(),
            shared: false,
            source: Source::Provider { provider: provider.into(), template: None },
            desktop: false,
            pause_after: None,
            state: ComputerState::Starting,
            sandbox: None,
            active_execution: None,
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
        });
        Command::SubmitExecution(Box::new(Submit {
            by: OWNER.into(),
            execution: exe,
            computer: c,
            approval_id: format!("apr_{key}"),
            reason: None,
            at_ms: 10,
        }))
    }

    fn run(s: &mut State, exe: &str) {
        let claim = || "k".to_string();
        ok(s.apply(&Command::ClaimExecution { execution_id: exe.into(), claim: claim(), node: None, at_ms: 20 }));
        ok(s.apply(&Command::DispatchExecution { execution_id: exe.into(), claim: claim(), at_ms: 30 }));
        let outcome = Outcome::Succeeded { sandbox: Some(format!("sbx-{exe}")) };
        ok(s.apply(&Command::FinishExecution { execution_id: exe.into(), claim: claim(), outcome, at_ms: 40 }));
    }

    fn create(s: &mut State, computer: &str, provider: &str) {
        let exe = ok(s.apply(&submit(ExecutionKind::Create, computer, provider))).expect("id");
        run(s, &exe);
    }

    fn delete(s: &mut State, computer: &str) {
        let exe = ok(s.apply(&submit(ExecutionKind::Delete, computer, ""))).expect("id");
        run(s, &exe);
        assert_eq!(s.computers[computer].state, ComputerState::Deleted);
    }

    #[test]
    fn docker_computers_get_their_own_ranges_freed_on_delete_and_reused() {
        let mut s = world();
        create(&mut s, "cmp_a", "cpp_d");
        create(&mut s, "cmp_b", "cpp_d");
        create(&mut s, "cmp_f", "cpp_f");
        let (a, b) = (s.uid_ranges.first_uid("cmp_a"), s.uid_ranges.first_uid("cmp_b"));
        assert_eq!((a, b), (Some(UID_RANGE_BASE + UID_RANGE_WIDTH), Some(UID_RANGE_BASE + 2 * UID_RANGE_WIDTH)));
        assert_eq!(s.uid_ranges.first_uid("cmp_f"), None, "a fake sandbox shares no kernel");
        // Above the agent's default range, which paired machines keep.
        assert!(a.expect("a") >= UID_RANGE_BASE + UID_RANGE_WIDTH);

        delete(&mut s, "cmp_a");
        assert_eq!(s.uid_ranges.first_uid("cmp_a"), None, "a delete frees the range");
        assert_eq!(s.uid_ranges.free.len(), 1);
        create(&mut s, "cmp_c", "cpp_d");
        assert_eq!(s.uid_ranges.first_uid("cmp_c"), a, "the freed range is reused");
        assert!(s.uid_ranges.free.is_empty());
        create(&mut s, "cmp_d", "cpp_d");
        assert_eq!(s.uid_ranges.first_uid("cmp_d"), Some(UID_RANGE_BASE + 3 * UID_RANGE_WIDTH), "a new one");
        // A failed create keeps its range until the Computer is deleted.
        let exe = ok(s.apply(&submit(ExecutionKind::Create, "cmp_e", "cpp_d"))).expect("id");
        assert!(s.uid_ranges.first_uid("cmp_e").is_some(), "allocated at submit, before the provider call");
        ok(s.apply(&Command::ClaimExecution { execution_id: exe.clone(), claim: "k".into(), node: None, at_ms: 20 }));
        ok(s.apply(&Command::DispatchExecution { execution_id: exe.clone(), claim: "k".into(), at_ms: 30 }));
        let error = crate::sm::ExecutionError { kind: "provider_rejected".into(), message: "no".into() };
        let outcome = Outcome::Failed { error };
        ok(s.apply(&Command::FinishExecution { execution_id: exe, claim: "k".into(), outcome, at_ms: 40 }));
        assert_eq!(s.computers["cmp_e"].state, ComputerState::Failed);
        assert!(s.uid_ranges.first_uid("cmp_e").is_some());
        delete(&mut s, "cmp_e");
        assert_eq!(s.uid_ranges.first_uid("cmp_e"), None);
    }

    #[test]
    fn the_bound_refuses_a_create_with_a_clear_error_and_changes_nothing() {
        let mut s = world();
        // Every range handed out but one.
        s.uid_ranges.next = MAX_UID_RANGES - 1;
        create(&mut s, "cmp_last", "cpp_d");
        assert_eq!(s.uid_ranges.first_uid("cmp_last"), Some(first_uid_of(MAX_UID_RANGES - 1)));
        let last_end = u64::from(first_uid_of(MAX_UID_RANGES - 1)) + u64::from(UID_RANGE_WIDTH);
        assert!(last_end <= i32::MAX as u64 + 1, "the last range ends below 2^31: {last_end}");
        let before = s.clone();
        let r = rejected(s.apply(&submit(ExecutionKind::Create, "cmp_over", "cpp_d")));
        assert_eq!(r.kind, RejectKind::Conflict);
        assert!(r.message.contains("binding-UID ranges are in use"), "{}", r.message);
        assert_eq!(s, before, "a refused create changes nothing");
        // Other providers still create.
        create(&mut s, "cmp_fake", "cpp_f");
        // A delete makes room again.
        delete(&mut s, "cmp_last");
        create(&mut s, "cmp_over", "cpp_d");
        assert_eq!(s.uid_ranges.first_uid("cmp_over"), Some(first_uid_of(MAX_UID_RANGES - 1)));
    }

    #[test]
    fn the_structure_allocates_every_slot_once_then_refuses() {
        let mut r = UidRanges::default();
        for i in 0..MAX_UID_RANGES {
            assert_eq!(r.allocate(&format!("c{i}")), Ok(first_uid_of(i)));
        }
        assert_eq!(r.allocate("c0"), Ok(first_uid_of(0)), "a holder answers its own range");
        assert_eq!(r.allocate("more").map_err(|e| e.kind), Err(RejectKind::Conflict));
        r.release("c7");
        r.release("c3");
        r.release("unknown");
        assert_eq!(r.allocate("x"), Ok(first_uid_of(3)), "smallest freed first");
        assert_eq!(r.allocate("y"), Ok(first_uid_of(7)));
        assert!(r.allocate("z").is_err());
    }

    #[test]
    fn ranges_are_in_snapshots_and_older_snapshots_load_without_them() {
        let mut s = world();
        create(&mut s, "cmp_a", "cpp_d");
        let json = serde_json::to_value(&s).expect("serialize");
        let mut back: State = serde_json::from_value(json.clone()).expect("deserialize");
        back.reindex_executions(); // as a snapshot's loader does (derived indexes)
        back.reindex_computers();
        assert_eq!(back.uid_ranges.first_uid("cmp_a"), s.uid_ranges.first_uid("cmp_a"));
        assert_eq!(back, s);
        let mut old = json;
        old.as_object_mut().expect("object").remove("uid_ranges");
        let back: State = serde_json::from_value(old).expect("an older snapshot loads");
        assert_eq!(back.uid_ranges, UidRanges::default());
    }
}
