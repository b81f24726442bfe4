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
///
/// Versions: 1, the first gated build; 2, a create's `env`, `resources` and `metadata` (a
/// Computer record of version 1 has no such fields: an older node would decode the create
/// and silently drop them, and its replica would differ); 3, the `recreate` lifecycle command
/// (an older build cannot decode its kind); 4, the vault (`PutSecret`, `DeleteSecret`,
/// `TouchSecret`, and a grant's `secrets`); 5, egress policies (`SetEgress`, `RequestEgress`
/// with the `computers.egress` capability, and a create whose Computer carries `egress`); 6,
/// the egress gateway's refused connections as events (`EgressDenied`), and revisions of a
/// Computer's egress policy (`SetEgress`'s `revision`); 7, warm pools (`PoolAdd`, `PoolReady`,
/// `PoolClaim`, `PoolRemove`, and a Computer's `pooled`).
pub const STORE_VERSION: u32 = if cfg!(feature = "upgrade-probe") { 8 } else { 7 };

/// The store version whose `SetEgress` carries a checked `revision`.
pub const EGRESS_REVISIONS: u32 = 6;

impl Command {
    /// The store version that introduced this command (or, for a command whose newer form
    /// carries fields an older build would drop, that form).
    pub fn since(&self) -> u32 {
        match self {
            #[cfg(feature = "upgrade-probe")]
            Command::UpgradeProbe { .. } => 8,
            Command::PoolAdd { .. }
            | Command::PoolReady { .. }
            | Command::PoolClaim { .. }
            | Command::PoolRemove { .. } => 7,
            Command::EgressDenied { .. } => 6,
            Command::SetEgress { revision: Some(_), .. } => EGRESS_REVISIONS,
            Command::SetEgress { .. } | Command::RequestEgress { .. } => 5,
            Command::SubmitExecution(s) if s.computer.as_ref().is_some_and(|c| c.egress.is_some()) => 5,
            Command::PutSecret { .. } | Command::DeleteSecret { .. } | Command::TouchSecret { .. } => 4,
            Command::PutGrant { secrets: Some(_), .. } => 4,
            Command::SubmitExecution(s) if s.execution.kind == super::ExecutionKind::Recreate => 3,
            Command::SubmitExecution(s) if s.computer.as_ref().is_some_and(|c| c.has_create_options()) => 2,
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

    /// Issue 39, item 5: a create is a version-2 command only when its Computer carries `env`,
    /// `resources` or `metadata`; without them it is the version-1 command it always was.
    #[test]
    fn i39_5_a_create_with_options_needs_version_2() {
        use crate::sm::Execution;
        use crate::sm::ExecutionKind;
        use crate::sm::Resources;
        use crate::sm::Source;
        use crate::sm::Submit;
        let create = |edit: &dyn Fn(&mut crate::sm::Computer)| {
            let mut c = crate::sm::testing::computer("cmp_1", "mem_o", Source::Paired);
            edit(&mut c);
            Command::SubmitExecution(Box::new(Submit {
                by: "tok".into(),
                execution: Execution::pending("exe_1", "k", "h", ExecutionKind::Create, "cmp_1", 1),
                computer: Some(c),
                approval_id: "apr_1".into(),
                reason: None,
                at_ms: 1,
            }))
        };
        assert_eq!(create(&|_| {}).since(), 1, "a plain create");
        let plain = serde_json::to_value(create(&|_| {})).expect("json");
        assert!(!plain.to_string().contains("metadata"), "a plain record serializes as before: {plain}");
        let env = create(&|c| {
            c.env.insert("GREETING".into(), "hi".into());
        });
        assert_eq!(env.since(), 2);
        assert_eq!(create(&|c| c.resources = Some(Resources { cpus: Some(0.5), memory_mb: None })).since(), 2);
        let meta = create(&|c| {
            c.metadata.insert("team".into(), "a".into());
        });
        assert_eq!(meta.since(), 2);
        let mut pause = meta.clone();
        if let Command::SubmitExecution(s) = &mut pause {
            s.computer = None;
            s.execution.kind = ExecutionKind::Pause;
        }
        assert_eq!(pause.since(), 1, "other lifecycle commands stay version 1");
        const { assert!(STORE_VERSION >= 2, "this build speaks the options") };
        let mut s = State::default();
        s.apply(&Command::NodeSpeaks { node_id: 1, version: 2 });
        assert_eq!((s.behind([1, 2], env.since()), s.behind([1], 1)), (vec![2], vec![]), "node 2 runs an older build");
    }

    /// Issue 41, item 3: an egress policy is version 5, on a create and on its own; only a member
    /// who may use the Computer sets it, and a bad policy or an own machine changes nothing.
    #[test]
    fn i41_egress_needs_version_5_and_a_member() {
        use crate::sm::Capability;
        use crate::sm::Execution;
        use crate::sm::ExecutionKind;
        use crate::sm::Source;
        use crate::sm::Submit;
        use crate::sm::testing;
        use computerd_proto::egress::DefaultAction;
        use computerd_proto::egress::EgressPolicy;
        let policy = EgressPolicy { default: DefaultAction::Deny, allow: vec!["allowed.test".into()], deny: vec![] };
        let source = Source::Provider { provider: "cpp_1".into(), template: None };
        let mut c = testing::computer("cmp_1", "mem_o", source);
        c.env.insert("A".into(), "b".into());
        c.egress = Some(policy.clone());
        let create = Command::SubmitExecution(Box::new(Submit {
            by: testing::OWNER.into(),
            execution: Execution::pending("exe_1", "k", "h", ExecutionKind::Create, "cmp_1", 1),
            computer: Some(c.clone()),
            approval_id: "apr_1".into(),
            reason: None,
            at_ms: 1,
        }));
        assert_eq!(create.since(), 5, "a create with a policy, even with version-2 options");
        let set = |by: &str, id: &str, p: &EgressPolicy| Command::SetEgress {
            by: by.into(),
            computer_id: id.into(),
            policy: Some(p.clone()),
            revision: None,
            at_ms: 9,
        };
        assert_eq!(set(testing::OWNER, "cmp_1", &policy).since(), 5);
        const { assert!(STORE_VERSION >= 5, "this build speaks egress") };

        let mut s = testing::world();
        c.egress = None;
        c.state = crate::sm::ComputerState::Running;
        s.computers.insert("cmp_1".into(), c);
        let mut paired = testing::computer("cmp_2", "mem_o", Source::Paired);
        paired.state = crate::sm::ComputerState::Running;
        s.computers.insert("cmp_2".into(), paired);
        let events = s.events.len();
        let r = testing::rejected(s.apply(&set("tok_bot", "cmp_1", &policy)));
        assert_eq!(r.kind, crate::sm::RejectKind::Forbidden, "{r:?}");
        let bad = EgressPolicy { default: DefaultAction::Deny, allow: vec!["not a name".into()], deny: vec![] };
        testing::rejected(s.apply(&set(testing::OWNER, "cmp_1", &bad)));
        testing::rejected(s.apply(&set(testing::OWNER, "cmp_2", &policy)));
        assert_eq!((s.computers["cmp_1"].egress.as_ref(), s.events.len()), (None, events), "refusals change nothing");
        testing::ok(s.apply(&set(testing::OWNER, "cmp_1", &policy)));
        assert_eq!(s.computers["cmp_1"].egress.as_ref(), Some(&policy));
        assert_eq!(s.computers["cmp_1"].egress_revision, 1, "an unchecked change (version 5) is the next revision");
        // Revisions (version 6): only the next one is taken; a change that lost a race is refused.
        let at = |revision: u64| Command::SetEgress {
            by: testing::OWNER.into(),
            computer_id: "cmp_1".into(),
            policy: Some(policy.clone()),
            revision: Some(revision),
            at_ms: 9,
        };
        assert_eq!(at(2).since(), 6);
        testing::ok(s.apply(&at(2)));
        for stale in [2, 1, 4] {
            assert_eq!(
                testing::rejected(s.apply(&at(stale))).kind,
                crate::sm::RejectKind::Conflict,
                "revision {stale}"
            );
        }
        assert_eq!(s.computers["cmp_1"].egress_revision, 2);
        assert_eq!(s.events.back().map(|e| e.data["revision"].clone()), Some(serde_json::json!(2)));
        let last = s.events.iter().last().expect("an event");
        assert_eq!((last.kind.as_str(), last.data["policy"]["allow"][0].as_str()), ("EgressSet", Some("allowed.test")));

        // A bot asks: a pending approval holds the policy; a member cannot "ask".
        let ask = |by: &str, apr: &str| Command::RequestEgress {
            by: by.into(),
            computer_id: "cmp_1".into(),
            policy: policy.clone(),
            approval_id: apr.into(),
            reason: None,
            at_ms: 10,
        };
        assert_eq!(ask("tok_bot", "apr_e").since(), 5);
        testing::rejected(s.apply(&ask("tok_bot", "apr_e")));
        testing::ok(s.apply(&Command::PutGrant {
            by: testing::OWNER.into(),
            computer_id: "cmp_1".into(),
            bot_id: "bot_1".into(),
            at_ms: 10,
            allow_root: None,
            paths: None,
            desktop_control: None,
            secrets: None,
        }));
        testing::ok(s.apply(&ask("tok_bot", "apr_e")));
        let a = &s.approvals["apr_e"];
        assert_eq!((a.state.as_str(), a.capability, a.egress.as_ref()), ("pending", Capability::Egress, Some(&policy)));
        assert_eq!(testing::rejected(s.apply(&ask(testing::OWNER, "apr_m"))).kind, crate::sm::RejectKind::Invalid);
        assert_eq!(
            testing::rejected(s.apply(&set("tok_bot", "cmp_1", &policy))).kind,
            crate::sm::RejectKind::Forbidden,
            "with the default rules a bot asks, it never sets"
        );
    }

    /// Issue 41, item 3: refused connections become one `EgressDenied` event per report, with a
    /// sample of those after the last recorded time; a repeat or an older report records nothing.
    #[test]
    fn i41_egress_denials_are_events_recorded_once() {
        use crate::sm::Source;
        use crate::sm::testing;
        use computerd_proto::egress::Denied;
        let report = |count: u64, sample: Vec<Denied>, through: u64| Command::EgressDenied {
            computer_id: "cmp_1".into(),
            count,
            sample,
            through_ms: through,
            at_ms: 50,
        };
        let d = |host: &str, at: u64| Denied::new(host, 80, at);
        assert_eq!(report(1, vec![d("a.test", 1)], 1).since(), 6);
        const { assert!(STORE_VERSION >= 6, "this build speaks denial events") };
        let mut s = testing::world();
        let source = Source::Provider { provider: "cpp_1".into(), template: None };
        s.computers.insert("cmp_1".into(), testing::computer("cmp_1", "mem_o", source));
        let events = s.events.len();
        for bad in [
            report(0, vec![], 5),
            report(1, vec![d("a.test", 4), d("b.test", 5)], 5),
            report(99, vec![d("x", 1); 9], 5),
        ] {
            assert_eq!(testing::rejected(s.apply(&bad)).kind, crate::sm::RejectKind::Invalid);
        }
        let mut gone = report(1, vec![d("a.test", 1)], 1);
        if let Command::EgressDenied { computer_id, .. } = &mut gone {
            *computer_id = "cmp_gone".into();
        }
        assert_eq!(testing::rejected(s.apply(&gone)).kind, crate::sm::RejectKind::NotFound);
        assert_eq!(s.events.len(), events, "refusals change nothing");

        testing::ok(s.apply(&report(3, vec![d("a.test", 10), d("b.test", 20)], 20)));
        let last = s.events.back().expect("an event").clone();
        assert_eq!((last.kind.as_str(), last.computer_id.as_str()), ("EgressDenied", "cmp_1"));
        assert_eq!((last.data["count"].as_u64(), last.data["through"].as_u64()), (Some(3), Some(20)));
        assert_eq!(last.data["sample"][1]["host"], "b.test");
        assert_eq!(s.computers["cmp_1"].egress_denied_through, 20);
        // The same report again (a new leader's watch read it too), or an older one: nothing.
        testing::ok(s.apply(&report(3, vec![d("a.test", 10), d("b.test", 20)], 20)));
        testing::ok(s.apply(&report(1, vec![d("c.test", 15)], 15)));
        assert_eq!(s.events.len(), events + 1);
        // A report that overlaps: only the sample past what was recorded is shown.
        testing::ok(s.apply(&report(2, vec![d("b.test", 20), d("c.test", 30)], 30)));
        let last = s.events.back().expect("an event");
        assert_eq!(last.data["sample"].as_array().map(|a| a.len()), Some(1));
        assert_eq!(last.data["sample"][0]["host"], "c.test");
    }
}
