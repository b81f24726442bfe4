//! Public port addresses: a Computer's port given an address `<port>-<label>.<public domain>`,
//! where the label is a bearer capability (anyone with the address may use it). The store keeps
//! only the label's SHA-256, so its snapshots and logs hold no usable address.
//!
//! Exposing is the `computers.expose` capability: a rule allows it, refuses it, or parks it as an
//! approval, in which case the exposure is recorded but answers nothing until a member approves.
//! Bounded: at most [`MAX_PORTS`] exposures per Computer; a deleted Computer's go with it.

use super::access::MAX_PENDING_APPROVALS_PER_MEMBER;
use super::model::Capability;
use super::model::ComputerState;
use super::model::Effect;
use super::model::Exposure;
use super::model::Source;
use super::response::Reject;
use super::response::RejectKind;
use super::state::Caller;
use super::state::State;

/// Exposures one Computer may have.
pub const MAX_PORTS: usize = 32;

/// How a request's address stands.
#[allow(clippy::large_enum_variant)] // answered once per request and matched at once, never stored
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// Serve it: the exposure, and its exposer as a live caller who may still operate it.
    Open(Exposure, Caller),
    /// The exposure waits for a member's approval.
    AwaitingApproval,
    /// No such address (never exposed, ended, Computer deleted, or its exposer lost the right).
    Gone,
}

impl State {
    /// Exposes `port` of a Computer under a new label (its hash here): replaces the port's
    /// previous address, if any (a second `PUT` is a new address; the old one ends at once).
    /// Answers the approval id when the decider asked for one.
    #[allow(clippy::too_many_arguments)] // one record's fields
    pub(crate) fn expose_port(
        &mut self,
        by: &str,
        computer_id: &str,
        port: u16,
        protocol: &str,
        label_hash: &str,
        approval_id: &str,
        at_ms: u64,
    ) -> Result<Option<String>, Reject> {
        let caller = self.caller_by_token_id(by)?;
        self.check_operate(&caller, computer_id)?;
        if port == 0 {
            return Err(Reject::new(RejectKind::Invalid, "a port is 1 to 65535"));
        }
        if protocol != "http" {
            return Err(Reject::new(RejectKind::Invalid, "the protocol is \"http\""));
        }
        let c = self.computers.get(computer_id).ok_or_else(|| Reject::new(RejectKind::NotFound, "no such computer"))?;
        if c.source == Source::Paired {
            return Err(Reject::new(
                RejectKind::Unsupported,
                "a paired machine's ports are never given a public address",
            ));
        }
        if label_hash.len() != 64 || self.ports.by_label.contains_key(label_hash) {
            return Err(Reject::new(RejectKind::Conflict, "that label is taken: choose another"));
        }
        let existing = self.ports.by_computer.get(computer_id);
        if existing.is_some_and(|m| m.len() >= MAX_PORTS && !m.contains_key(&port)) {
            return Err(Reject::new(
                RejectKind::Conflict,
                format!("a computer has at most {MAX_PORTS} exposed ports: end one first"),
            ));
        }
        let effect = self.decide_capability(&caller, Capability::Expose, computer_id)?;
        let approval = match effect {
            Effect::Allow => None,
            Effect::Ask => Some(approval_id.to_string()),
            Effect::Deny => return Err(Reject::new(RejectKind::Forbidden, "computers.expose is denied by a rule")),
        };
        if approval.is_some() {
            self.check_approval_room_within(&caller, MAX_PENDING_APPROVALS_PER_MEMBER)?;
        }
        self.ports.remove(computer_id, port);
        if let Some(a) = &approval {
            self.open_approval(a, Capability::Expose, computer_id, &caller, None, None, at_ms);
        }
        let e = Exposure {
            computer_id: computer_id.to_string(),
            port,
            protocol: protocol.to_string(),
            label_hash: label_hash.to_string(),
            token_id: by.to_string(),
            member_id: caller.member.id.clone(),
            bot_id: caller.bot.as_ref().map(|b| b.id.clone()),
            approval_id: approval.clone(),
            created_at: at_ms,
        };
        self.ports.by_computer.entry(computer_id.to_string()).or_default().insert(port, label_hash.to_string());
        self.ports.by_label.insert(label_hash.to_string(), e);
        self.push_event(
            at_ms,
            "PortExposed",
            computer_id,
            None,
            serde_json::json!({"port": port, "approvalId": approval}),
        );
        Ok(approval)
    }

    /// Ends the address of `port` (idempotent: an unexposed port is fine).
    pub(crate) fn unexpose_port(&mut self, by: &str, computer_id: &str, port: u16, at_ms: u64) -> Result<(), Reject> {
        let caller = self.caller_by_token_id(by)?;
        self.check_operate(&caller, computer_id)?;
        if self.ports.remove(computer_id, port).is_some() {
            self.push_event(at_ms, "PortClosed", computer_id, None, serde_json::json!({"port": port}));
        }
        Ok(())
    }

    /// An approval of `computers.expose` was decided: the exposure opens, or is removed.
    pub(crate) fn expose_decided(&mut self, computer_id: &str, approval_id: &str, approve: bool) {
        let port = self
            .ports
            .of(computer_id)
            .into_iter()
            .find(|e| e.approval_id.as_deref() == Some(approval_id))
            .map(|e| (e.port, e.label_hash.clone()));
        let Some((port, hash)) = port else { return };
        if approve {
            if let Some(e) = self.ports.by_label.get_mut(&hash) {
                e.approval_id = None;
            }
        } else {
            self.ports.remove(computer_id, port);
        }
    }

    /// What a request to the address with this label hash reaches, at this state.
    pub fn resolve_port(&self, label_hash: &str, port: u16) -> Resolved {
        let Some(e) = self.ports.by_label.get(label_hash) else { return Resolved::Gone };
        if e.port != port {
            return Resolved::Gone;
        }
        let live = self.computers.get(&e.computer_id).is_some_and(|c| c.state != ComputerState::Deleted);
        let Ok(caller) = self.caller_by_token_id(&e.token_id) else { return Resolved::Gone };
        if !live || self.check_operate(&caller, &e.computer_id).is_err() {
            return Resolved::Gone;
        }
        if e.approval_id.is_some() {
            return Resolved::AwaitingApproval;
        }
        Resolved::Open(e.clone(), caller)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm::Command;
    use crate::sm::Response;
    use crate::sm::identity::Member;
    use crate::sm::identity::Principal;
    use crate::sm::identity::Role;
    use crate::sm::lifecycle::Outcome;
    use crate::sm::lifecycle::Submit;
    use crate::sm::model::Computer;
    use crate::sm::model::Execution;
    use crate::sm::model::ExecutionKind;
    use crate::sm::testing::OWNER;
    use crate::sm::testing::ok;
    use crate::sm::testing::rejected;
    use crate::sm::testing::token;

    const OTHER: &str = "tok_other";
    const BOT: &str = "tok_bot";

    fn hash(n: u8) -> String {
        format!("{n:064x}")
    }

    fn computer(id: &str, source: Source) -> Computer {
        crate::sm::testing::computer(id, "mem_o", source)
    }

    fn lifecycle(s: &mut State, kind: ExecutionKind, key: &str, c: Option<Computer>) {
        let exe = Execution::pending(&format!("exe_{key}"), key, "b", kind, "cmp_1", 1);
        let submit = Submit {
            by: OWNER.into(),
            execution: exe,
            computer: c,
            approval_id: format!("apr_{key}"),
            reason: None,
            at_ms: 10,
        };
        let id = ok(s.apply(&Command::SubmitExecution(Box::new(submit)))).expect("execution");
        ok(s.apply(&Command::ClaimExecution { execution_id: id.clone(), claim: "k".into(), node: None, at_ms: 20 }));
        ok(s.apply(&Command::DispatchExecution { execution_id: id.clone(), claim: "k".into(), at_ms: 30 }));
        let outcome = Outcome::Succeeded { sandbox: Some("sbx".into()) };
        ok(s.apply(&Command::FinishExecution { execution_id: id, claim: "k".into(), outcome, at_ms: 40 }));
    }

    /// An owner with a running provider Computer `cmp_1`, a granted bot, another member.
    fn world() -> State {
        let mut s = crate::sm::testing::world();
        let other = Member { id: "mem_x".into(), name: "x".into(), email: None, role: Role::Member, created_at: 1 };
        ok(s.apply(&Command::CreateMember { by: OWNER.into(), member: other }));
        ok(s.apply(&Command::CreateToken { by: OWNER.into(), token: token(OTHER, Principal::Member("mem_x".into())) }));
        let source = Source::Provider { provider: "cpp_1".into(), template: None };
        lifecycle(&mut s, ExecutionKind::Create, "k1", Some(computer("cmp_1", source)));
        ok(s.apply(&Command::PutGrant {
            by: OWNER.into(),
            computer_id: "cmp_1".into(),
            bot_id: "bot_1".into(),
            at_ms: 50,
            allow_root: None,
            desktop_control: None,
            secrets: None,
            paths: None,
        }));
        s
    }

    fn expose(by: &str, c: &str, port: u16, protocol: &str, label: &str, approval: &str) -> Command {
        Command::ExposePort {
            by: by.into(),
            computer_id: c.into(),
            port,
            protocol: protocol.into(),
            label_hash: label.into(),
            approval_id: approval.into(),
            at_ms: 60,
        }
    }

    fn unexpose(c: &str, port: u16) -> Command {
        Command::UnexposePort { by: OWNER.into(), computer_id: c.into(), port, at_ms: 70 }
    }

    #[test]
    fn an_address_opens_ends_and_goes_with_its_computer() {
        let mut s = world();
        assert_eq!(s.apply(&expose(OWNER, "cmp_1", 8000, "http", &hash(1), "apr_1")), Response::Ok);
        assert!(matches!(s.resolve_port(&hash(1), 8000), Resolved::Open(ref e, _) if e.computer_id == "cmp_1"));
        assert_eq!(s.resolve_port(&hash(1), 8001), Resolved::Gone, "the label is of port 8000 only");
        assert_eq!(s.resolve_port(&hash(9), 8000), Resolved::Gone);
        // A second PUT gives a new label; the old one ends.
        ok(s.apply(&expose(OWNER, "cmp_1", 8000, "http", &hash(2), "apr_2")));
        assert_eq!(s.resolve_port(&hash(1), 8000), Resolved::Gone);
        assert_eq!(s.ports.of("cmp_1").len(), 1);
        ok(s.apply(&unexpose("cmp_1", 8000)));
        assert_eq!(s.resolve_port(&hash(2), 8000), Resolved::Gone);
        ok(s.apply(&unexpose("cmp_1", 8000)));
        ok(s.apply(&expose(OWNER, "cmp_1", 9000, "http", &hash(3), "apr_3")));
        lifecycle(&mut s, ExecutionKind::Delete, "k2", None);
        assert_eq!(s.resolve_port(&hash(3), 9000), Resolved::Gone);
        assert!(s.ports.by_label.is_empty() && s.ports.by_computer.is_empty(), "a deleted computer keeps none");
    }

    #[test]
    fn refusals_change_nothing() {
        let mut s = world();
        s.computers.insert("cmp_p".into(), computer("cmp_p", Source::Paired));
        let before = s.clone();
        let mut kind = |c: Command| rejected(s.apply(&c)).kind;
        assert_eq!(kind(expose(OWNER, "cmp_1", 0, "http", &hash(1), "a")), RejectKind::Invalid);
        assert_eq!(kind(expose(OWNER, "cmp_1", 80, "tcp", &hash(1), "a")), RejectKind::Invalid);
        assert_eq!(kind(expose(OWNER, "cmp_1", 80, "http", "short", "a")), RejectKind::Conflict);
        assert_eq!(kind(expose(OTHER, "cmp_1", 80, "http", &hash(1), "a")), RejectKind::NotFound);
        assert_eq!(kind(expose(OWNER, "cmp_p", 80, "http", &hash(1), "a")), RejectKind::Unsupported);
        assert_eq!(kind(expose(OWNER, "cmp_9", 80, "http", &hash(1), "a")), RejectKind::NotFound);
        assert_eq!(s, before);
        for p in 1..=MAX_PORTS as u16 {
            ok(s.apply(&expose(OWNER, "cmp_1", p, "http", &hash(p as u8), "a")));
        }
        let full = s.clone();
        assert_eq!(rejected(s.apply(&expose(OWNER, "cmp_1", 999, "http", &hash(200), "a"))).kind, RejectKind::Conflict);
        assert_eq!(
            rejected(s.apply(&expose(OWNER, "cmp_1", 1, "http", &hash(2), "a"))).kind,
            RejectKind::Conflict,
            "a label in use"
        );
        assert_eq!(s, full);
        ok(s.apply(&expose(OWNER, "cmp_1", 1, "http", &hash(201), "a")));
        assert_eq!(s.ports.of("cmp_1").len(), MAX_PORTS, "a port of the full set may take a new address");
    }

    #[test]
    fn a_bot_asks_and_its_address_waits_for_the_member() {
        let mut s = world();
        assert_eq!(s.apply(&expose(BOT, "cmp_1", 8000, "http", &hash(1), "apr_9")), Response::Id("apr_9".into()));
        assert_eq!(s.resolve_port(&hash(1), 8000), Resolved::AwaitingApproval);
        ok(s.apply(&Command::DecideApproval {
            by: OWNER.into(),
            approval_id: "apr_9".into(),
            approve: true,
            at_ms: 80,
        }));
        assert!(matches!(s.resolve_port(&hash(1), 8000), Resolved::Open(..)));
        // The bot loses its grant: its address answers nothing.
        ok(s.apply(&Command::DeleteGrant { by: OWNER.into(), computer_id: "cmp_1".into(), bot_id: "bot_1".into() }));
        assert_eq!(s.resolve_port(&hash(1), 8000), Resolved::Gone);
        // A rejected approval removes the exposure.
        ok(s.apply(&Command::PutGrant {
            by: OWNER.into(),
            computer_id: "cmp_1".into(),
            bot_id: "bot_1".into(),
            at_ms: 90,
            allow_root: None,
            desktop_control: None,
            secrets: None,
            paths: None,
        }));
        ok(s.apply(&expose(BOT, "cmp_1", 8001, "http", &hash(2), "apr_10")));
        ok(s.apply(&Command::DecideApproval {
            by: OWNER.into(),
            approval_id: "apr_10".into(),
            approve: false,
            at_ms: 95,
        }));
        assert_eq!(s.resolve_port(&hash(2), 8001), Resolved::Gone);
        assert!(s.ports.of("cmp_1").iter().all(|e| e.port != 8001));
    }

    #[test]
    fn each_computers_ports_are_rebuilt_from_the_exposures() {
        let mut s = world();
        ok(s.apply(&expose(OWNER, "cmp_1", 8000, "http", &hash(1), "a")));
        ok(s.apply(&expose(OWNER, "cmp_1", 9000, "http", &hash(2), "a")));
        let json = serde_json::to_string(&s.ports).expect("json");
        let mut back: crate::sm::model::Ports = serde_json::from_str(&json).expect("back");
        assert!(back.by_computer.is_empty(), "derived, not serialized");
        back.reindex();
        assert_eq!(back, s.ports);
    }
}
