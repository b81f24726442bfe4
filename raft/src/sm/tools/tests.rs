//! Unit tests of tool bindings in the store: rights at every step, grants closing bindings,
//! slots, clean-up and the index.

use super::*;
use crate::sm::Command;
use crate::sm::identity::Member;
use crate::sm::identity::Organization;
use crate::sm::identity::Principal;
use crate::sm::model::Computer;
use crate::sm::model::ComputerState;
use crate::sm::model::Source;
use crate::sm::testing::ok;
use crate::sm::testing::rejected;
use crate::sm::testing::token;

const OWNER: &str = "tok_owner";
const BOT: &str = "tok_bot";

fn computer(id: &str) -> Computer {
    Computer {
        id: id.into(),
        name: id.into(),
        owner: "mem_o".into(),
        shared: false,
        source: Source::Paired,
        desktop: false,
        pause_after: None,
        state: ComputerState::Running,
        sandbox: None,
        active_execution: None,
        created_at: 1,
        agent_credential: None,
        link_generation: 1,
        link_node: Some(1),
        desktop_view: None,
        env: Default::default(),
        resources: None,
        metadata: Default::default(),
        egress: None,
        egress_denied_through: 0,
        egress_revision: 0,
        pooled: false,
    }
}

/// An owner, bot_1 (with a bot token) granted on cmp_1 and cmp_2.
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
    let bot = Bot { id: "bot_1".into(), name: "b".into(), member_id: "mem_o".into(), created_at: 1, archived_at: None };
    ok(s.apply(&Command::CreateBot { by: OWNER.into(), bot, parent: None }));
    ok(s.apply(&Command::CreateToken { by: OWNER.into(), token: token(BOT, Principal::Bot("bot_1".into())) }));
    for c in ["cmp_1", "cmp_2"] {
        s.computers.insert(c.into(), computer(c));
        ok(s.apply(&Command::PutGrant {
            by: OWNER.into(),
            computer_id: c.into(),
            bot_id: "bot_1".into(),
            allow_root: None,
            desktop_control: None,
            secrets: None,
            paths: None,
            at_ms: 1,
        }));
    }
    s
}

fn binding(id: &str, computer: &str, package: &str) -> ToolBinding {
    ToolBinding {
        id: id.into(),
        bot_id: "bot_1".into(),
        computer_id: computer.into(),
        package_id: package.into(),
        version: "1.0.0".into(),
        sha256: "ab".repeat(32),
        state: BindingState::Installing,
        tools: Value::Null,
        error: None,
        shared_uid: false,
        created_at: 1,
        install_key: None,
        request_hash: None,
    }
}

fn install(s: &mut State, by: &str, id: &str, computer: &str) -> Response {
    let r = s.apply(&Command::BindingReserve { by: by.into(), binding: binding(id, computer, "pkg") });
    if matches!(r, Response::Id(_)) {
        ok(s.apply(&Command::BindingSettle {
            binding_id: id.into(),
            ready: true,
            tools: serde_json::json!([]),
            error: None,
            shared_uid: false,
        }));
    }
    r
}

fn call(id: &str, op: &str) -> Command {
    Command::OperationBegin {
        by: BOT.into(),
        operation: Operation {
            operation_id: op.into(),
            bot_id: "bot_1".into(),
            binding_id: id.into(),
            payload_hash: op.into(),
            state: OperationState::Running,
            result: None,
            started_at: 1,
            held: None,
        },
    }
}

fn limited(s: &mut State, id: &str, read_only: bool, computers: Option<Vec<String>>) {
    let mut t = token(id, Principal::Bot("bot_1".into()));
    t.read_only = read_only;
    t.computers = computers;
    ok(s.apply(&Command::CreateToken { by: OWNER.into(), token: t }));
}

fn fresh_index(s: &State) -> BindingIndex {
    let mut again = s.clone();
    again.reindex_tools();
    again.binding_index
}

use crate::sm::Response;

#[test]
fn removing_a_grant_closes_the_bots_bindings_there_and_refuses_their_use() {
    let mut s = world();
    ok(install(&mut s, BOT, "mcb_1", "cmp_1"));
    ok(install(&mut s, BOT, "mcb_2", "cmp_2"));
    assert_eq!(ok(s.apply(&call("mcb_1", "op-1"))).as_deref(), Some("new"));
    ok(s.apply(&Command::OperationFinish {
        key: operation_key("bot_1", "op-1"),
        result: Some(Value::Null),
        held: None,
    }));

    ok(s.apply(&Command::DeleteGrant { by: OWNER.into(), computer_id: "cmp_1".into(), bot_id: "bot_1".into() }));
    assert_eq!(s.tool_bindings["mcb_1"].state, BindingState::Revoked, "closed with the grant");
    assert_eq!(s.tool_bindings["mcb_2"].state, BindingState::Ready, "another computer's binding stays");
    // A new call, a replay and a new install there: refused (the bot no longer sees the computer).
    assert_eq!(rejected(s.apply(&call("mcb_1", "op-2"))).kind, RejectKind::Forbidden);
    assert_eq!(rejected(s.apply(&call("mcb_1", "op-1"))).kind, RejectKind::Forbidden);
    assert_eq!(rejected(install(&mut s, BOT, "mcb_3", "cmp_1")).kind, RejectKind::Forbidden);
    // The owner acting for the bot: it may operate the computer, but the bot has no grant.
    let r = rejected(install(&mut s, OWNER, "mcb_3", "cmp_1"));
    assert_eq!((r.kind, r.message.as_str()), (RejectKind::Forbidden, "this bot has no right to use this computer"));
    let caller = s.caller_by_token_id(OWNER).expect("owner");
    let discover = McpRequest::Discover { binding_id: "mcb_2".into() };
    assert_eq!(s.check_tool_request(Some(&caller), "cmp_2", &discover), Ok(()));
    let discover = McpRequest::Discover { binding_id: "mcb_1".into() };
    assert_eq!(s.check_tool_request(Some(&caller), "cmp_1", &discover).map_err(|r| r.kind), Err(RejectKind::Forbidden));
    // The drain of the closed binding may be sent, by anyone; a live binding's may not.
    let drain = McpRequest::Revoke { binding_id: "mcb_1".into() };
    assert_eq!(s.check_tool_request(None, "cmp_1", &drain), Ok(()));
    let drain = McpRequest::Revoke { binding_id: "mcb_2".into() };
    assert_eq!(s.check_tool_request(None, "cmp_2", &drain).map_err(|r| r.kind), Err(RejectKind::Conflict));
    assert_eq!(s.binding_index, fresh_index(&s));
}

#[test]
fn archiving_the_bot_closes_its_bindings_and_deleting_the_computer_drops_them() {
    let mut s = world();
    ok(install(&mut s, BOT, "mcb_1", "cmp_1"));
    ok(install(&mut s, BOT, "mcb_2", "cmp_2"));
    let mut other = s.clone();
    ok(s.apply(&Command::ArchiveBot { by: OWNER.into(), bot_id: "bot_1".into(), at_ms: 5 }));
    assert!(s.tool_bindings.values().all(|b| b.state == BindingState::Revoked), "{:?}", s.tool_bindings);

    other.drop_computer_bindings("cmp_1");
    assert!(!other.tool_bindings.contains_key("mcb_1"));
    assert_eq!(other.bindings_of("bot_1", "cmp_1").count(), 0);
    assert!(!other.binding_index.by_computer.contains_key("cmp_1"));
    assert_eq!(other.binding_index, fresh_index(&other));
}

#[test]
fn a_token_limited_to_other_computers_or_read_only_cannot_install_or_call() {
    let mut s = world();
    ok(install(&mut s, BOT, "mcb_1", "cmp_1"));
    limited(&mut s, "tok_other", false, Some(vec!["cmp_2".into()]));
    limited(&mut s, "tok_ro", true, None);
    for t in ["tok_other", "tok_ro"] {
        let r = s.apply(&Command::BindingReserve { by: t.into(), binding: binding("mcb_x", "cmp_1", "pkg") });
        let kind = rejected(r).kind;
        assert!(matches!(kind, RejectKind::Forbidden | RejectKind::NotFound), "{t}: {kind:?}");
        let Command::OperationBegin { operation, .. } = call("mcb_1", "op-x") else { unreachable!() };
        let r = s.apply(&Command::OperationBegin { by: t.into(), operation });
        let kind = rejected(r).kind;
        assert!(matches!(kind, RejectKind::Forbidden | RejectKind::NotFound), "{t}: {kind:?}");
        let caller = s.caller_by_token_id(t).expect("caller");
        let req = McpRequest::Call {
            binding_id: "mcb_1".into(),
            tool: "echo".into(),
            arguments: Default::default(),
            operation: None,
        };
        assert!(s.check_tool_request(Some(&caller), "cmp_1", &req).is_err(), "{t}");
    }
    // The token limited to cmp_2 may use cmp_2.
    let r = s.apply(&Command::BindingReserve { by: "tok_other".into(), binding: binding("mcb_y", "cmp_2", "pkg") });
    assert_eq!(ok(r).as_deref(), Some("mcb_y"));
    assert!(!s.tool_bindings.contains_key("mcb_x"));
}

#[test]
fn revoked_bindings_free_their_slot_and_tombstones_are_bounded() {
    let mut s = world();
    for i in 0..(MAX_BINDINGS * 3) {
        let id = format!("mcb_{i:03}");
        let mut b = binding(&id, "cmp_1", &format!("pkg{i}"));
        b.created_at = i as u64;
        ok(s.apply(&Command::BindingReserve { by: BOT.into(), binding: b }));
        ok(s.apply(&Command::BindingRevoke { by: BOT.into(), binding_id: id }));
    }
    // Still room for 64 live ones.
    for i in 0..MAX_BINDINGS {
        ok(install(&mut s, BOT, &format!("mcb_live_{i}"), "cmp_1"));
    }
    let r = rejected(install(&mut s, BOT, "mcb_one_more", "cmp_1"));
    assert_eq!(r.kind, RejectKind::Conflict);
    let revoked = s.bindings_on("cmp_1").filter(|b| b.state == BindingState::Revoked).count();
    assert_eq!(revoked, MAX_REVOKED, "tombstones are bounded");
    assert!(!s.tool_bindings.contains_key("mcb_000"), "the oldest went first");
    assert!(s.tool_bindings.contains_key(&format!("mcb_{:03}", MAX_BINDINGS * 3 - 1)));
    // Exactly the newest MAX_REVOKED are kept.
    let oldest_kept = MAX_BINDINGS * 3 - MAX_REVOKED;
    assert!(s.tool_bindings.contains_key(&format!("mcb_{oldest_kept:03}")));
    assert!(!s.tool_bindings.contains_key(&format!("mcb_{:03}", oldest_kept - 1)));
    assert_eq!(s.binding_index.revoked["cmp_1"].len(), MAX_REVOKED);
    assert_eq!(s.binding_index, fresh_index(&s));
}

#[test]
fn a_failed_install_leaves_no_binding() {
    let mut s = world();
    ok(s.apply(&Command::BindingReserve { by: BOT.into(), binding: binding("mcb_1", "cmp_1", "pkg") }));
    let error = Some(serde_json::json!({"reason": "server_did_not_start"}));
    ok(s.apply(&Command::BindingSettle {
        binding_id: "mcb_1".into(),
        ready: false,
        tools: Value::Null,
        error,
        shared_uid: false,
    }));
    assert!(s.tool_bindings.is_empty());
    assert_eq!(s.bindings_of_bot("bot_1").count(), 0);
    assert_eq!(s.binding_index, BindingIndex::default());
}

#[test]
fn a_switch_is_found_by_index_and_revoking_a_participant_cancels_it() {
    let mut s = world();
    reserved_with_target(&mut s);
    let key = operation_key("bot_1", "sw-1");
    assert_eq!(s.switches[&key].target_binding.as_deref(), Some("mcb_b"));
    assert_eq!(s.binding_index.pending_switch.get("mcb_b"), Some(&key));
    assert_eq!(s.binding_index, fresh_index(&s));
    ok(s.apply(&Command::BindingRevoke { by: BOT.into(), binding_id: "mcb_b".into() }));
    assert_eq!(s.switches[&key].state, SwitchState::Cancelling);
    assert_eq!(
        (s.tool_bindings["mcb_a"].state, s.tool_bindings["mcb_b"].state),
        (BindingState::Revoked, BindingState::Revoked)
    );
    assert_eq!(s.binding_index, fresh_index(&s));
}

/// Issue 37, item 6: revoking one participant of a pending switch closes them all, and the
/// switch is `cancelling` until every participant's runtime is confirmed drained, saying which
/// is not; the named one's drain alone does not end it. It is not compacted while cancelling.
#[test]
fn i37_6_a_cancelled_switch_ends_only_when_every_participant_is_drained() {
    let mut s = world();
    let key = reserved_with_target(&mut s);
    ok(s.apply(&Command::BindingRevoke { by: BOT.into(), binding_id: "mcb_b".into() }));
    assert_eq!(s.switches[&key].state, SwitchState::Cancelling);
    assert_eq!(s.cancelling_with("mcb_b"), vec!["mcb_a".to_string(), "mcb_b".to_string()]);
    assert_eq!(
        ok(s.apply(&Command::SwitchReserve { by: BOT.into(), switch: switch("sw-1", 1) })).as_deref(),
        Some("cancelling"),
        "the same operation answers where it stands"
    );
    ok(s.apply(&Command::BindingDrained { binding_id: "mcb_b".into() }));
    assert_eq!(s.switches[&key].state, SwitchState::Cancelling, "mcb_a's runtime is not confirmed stopped");
    assert_eq!(s.switches[&key].undrained(), vec!["mcb_a".to_string()]);
    assert_eq!(s.cancelling_with("mcb_a"), vec!["mcb_a".to_string()]);
    assert_eq!(s.binding_index, fresh_index(&s));
    let tick = |s: &mut State, at: u64| {
        s.apply_request(&crate::sm::Request::new(Command::SetRetention { by: "nobody".into(), ms: 0 }).stamped(at))
    };
    tick(&mut s, 2 + crate::sm::DEFAULT_RETENTION_MS);
    assert!(s.switches.contains_key(&key), "a cancelling switch is kept until it ends");
    // A drain report of a binding in no switch changes nothing.
    ok(s.apply(&Command::BindingDrained { binding_id: "mcb_b".into() }));
    ok(s.apply(&Command::BindingDrained { binding_id: "mcb_a".into() }));
    assert_eq!(s.switches[&key].state, SwitchState::Cancelled);
    assert!(s.binding_index.pending_switch.is_empty() && s.cancelling_with("mcb_a").is_empty());
    assert_eq!(s.binding_index, fresh_index(&s));
}

/// Issue 37, items 5 and 8: an answer that leaves the switch pending keeps the participants
/// closed and the binding at its source version in the store; an answer sent under a link that
/// has since been replaced settles nothing; an answer of the current link does.
#[test]
fn i37_5_a_pending_answer_keeps_the_switch_reserved_and_a_stale_links_answer_settles_nothing() {
    let mut s = world();
    let key = reserved_with_target(&mut s);
    assert_eq!(s.switches[&key].generation, 1, "bound to the Computer's link at the reserve");
    let note = serde_json::json!({"reason": "discovery_failed", "switched": true, "version": "1.1.0"});
    ok(s.apply(&Command::SwitchHold { key: key.clone(), note: note.clone(), generation: 1 }));
    assert_eq!((s.switches[&key].state, s.switches[&key].note.clone()), (SwitchState::Reserved, Some(note)));
    assert_eq!(
        (s.tool_bindings["mcb_a"].state, s.tool_bindings["mcb_a"].version.as_str()),
        (BindingState::Switching, "1.0.0")
    );
    // The agent relinked (generation 2): the old link's answer is not believed.
    if let Some(c) = s.computers.get_mut("cmp_1") {
        c.link_generation = 2;
    }
    let receipt = serde_json::json!({"version": "1.1.0", "sha256": "cd".repeat(32), "tools": []});
    let stale = Command::SwitchSettle { key: key.clone(), receipt: receipt.clone(), ok: true, generation: Some(1) };
    assert_eq!(rejected(s.apply(&stale)).kind, RejectKind::Conflict);
    let stale_fail =
        Command::SwitchSettle { key: key.clone(), receipt: receipt.clone(), ok: false, generation: Some(1) };
    assert_eq!(rejected(s.apply(&stale_fail)).kind, RejectKind::Conflict);
    assert_eq!(s.switches[&key].state, SwitchState::Reserved);
    ok(s.apply(&Command::SwitchSettle { key: key.clone(), receipt, ok: true, generation: Some(2) }));
    let sw = &s.switches[&key];
    assert_eq!((sw.state, sw.generation), (SwitchState::Done, 2));
    let a = &s.tool_bindings["mcb_a"];
    assert_eq!((a.state, a.version.as_str(), a.sha256.clone()), (BindingState::Ready, "1.1.0", "cd".repeat(32)));
    assert_eq!(s.tool_bindings["mcb_b"].state, BindingState::Revoked, "the target binding is revoked");
}

fn switch(op: &str, at: u64) -> Switch {
    Switch {
        operation_id: op.into(),
        bot_id: "bot_1".into(),
        binding_id: "mcb_a".into(),
        from_version: String::new(),
        to_version: "1.1.0".into(),
        target_binding: None,
        state: SwitchState::Reserved,
        receipt: None,
        reserved_at: at,
        generation: 0,
        drained: Vec::new(),
        note: None,
    }
}

/// mcb_a at 1.0.0 and mcb_b at 1.1.0 (both ready) on cmp_1; a switch of mcb_a to 1.1.0
/// reserved (mcb_b its target). Answers the switch's key.
fn reserved_with_target(s: &mut State) -> String {
    ok(install(s, BOT, "mcb_a", "cmp_1"));
    let mut b = binding("mcb_b", "cmp_1", "pkg");
    b.version = "1.1.0".into();
    ok(s.apply(&Command::BindingReserve { by: BOT.into(), binding: b }));
    ok(s.apply(&Command::BindingSettle {
        binding_id: "mcb_b".into(),
        ready: true,
        tools: Value::Null,
        error: None,
        shared_uid: false,
    }));
    assert_eq!(
        ok(s.apply(&Command::SwitchReserve { by: BOT.into(), switch: switch("sw-1", 1) })).as_deref(),
        Some("reserved")
    );
    operation_key("bot_1", "sw-1")
}

#[test]
fn a_held_answer_journals_its_digest_only_and_records_expire_with_the_retention() {
    let mut s = world();
    ok(install(&mut s, BOT, "mcb_1", "cmp_1"));
    assert_eq!(ok(s.apply(&call("mcb_1", "op-1"))).as_deref(), Some("new")); // started at 1
    let key = operation_key("bot_1", "op-1");
    let held = crate::sm::HeldResult { sha256: "ab".repeat(32), size: 12 };
    ok(s.apply(&Command::OperationFinish { key: key.clone(), result: None, held: Some(held.clone()) }));
    let op = &s.operations[&key];
    assert_eq!((op.state, op.result.clone(), op.held.clone()), (OperationState::Done, None, Some(held)));
    assert_eq!(ok(s.apply(&call("mcb_1", "op-1"))).as_deref(), Some("done"), "a replay finds it done");
    let mut again = s.clone();
    again.reindex_executions();
    assert_eq!(again.exec_index, s.exec_index);
    // Past the retention (by the cluster's clock) the record goes; the id is then a new call.
    let tick = |s: &mut State, at: u64| {
        s.apply_request(&crate::sm::Request::new(Command::SetRetention { by: "nobody".into(), ms: 0 }).stamped(at))
    };
    tick(&mut s, crate::sm::DEFAULT_RETENTION_MS);
    assert!(s.operations.contains_key(&key), "kept until its retention");
    tick(&mut s, 1 + crate::sm::DEFAULT_RETENTION_MS);
    assert!(!s.operations.contains_key(&key) && s.exec_index.operations.is_empty());
    assert_eq!(ok(s.apply(&call("mcb_1", "op-1"))).as_deref(), Some("new"));
}

#[test]
fn settled_switches_expire_with_the_retention_and_a_reserved_one_waits() {
    let mut s = world();
    ok(install(&mut s, BOT, "mcb_a", "cmp_1"));
    ok(s.apply(&Command::SwitchReserve { by: BOT.into(), switch: switch("sw-1", 5) }));
    let key = operation_key("bot_1", "sw-1");
    let tick = |s: &mut State, at: u64| {
        s.apply_request(&crate::sm::Request::new(Command::SetRetention { by: "nobody".into(), ms: 0 }).stamped(at))
    };
    tick(&mut s, 5 + crate::sm::DEFAULT_RETENTION_MS);
    assert!(s.switches.contains_key(&key), "a reserved switch stays until it settles");
    let receipt = serde_json::json!({"reason": "refused", "message": "no"});
    ok(s.apply(&Command::SwitchSettle { key: key.clone(), receipt, ok: false, generation: None }));
    tick(&mut s, 6 + crate::sm::DEFAULT_RETENTION_MS);
    assert!(!s.switches.contains_key(&key) && s.exec_index.switches.is_empty(), "settled, then expired");
}

/// Issue 37, item 7: an install is idempotent on its key. The same key and request answer the
/// live binding it made (no second binding toward the 64); another request under the same
/// `operationId` is refused; once the binding is gone (a failed install, a revoke), the key
/// installs anew.
#[test]
fn i37_7_an_install_is_idempotent_on_its_key() {
    let mut s = world();
    let keyed = |id: &str, key: &str, hash: &str| {
        let mut b = binding(id, "cmp_1", "pkg");
        b.install_key = Some(key.into());
        b.request_hash = Some(hash.into());
        b
    };
    let reserve = |s: &mut State, b: ToolBinding| s.apply(&Command::BindingReserve { by: BOT.into(), binding: b });
    assert_eq!(reserve(&mut s, keyed("mcb_1", "op:a", "h1")), Response::Id("mcb_1".into()));
    // The retry after a lost answer: the same binding, nothing new.
    assert_eq!(reserve(&mut s, keyed("mcb_2", "op:a", "h1")), Response::Id("mcb_1".into()));
    assert_eq!(s.tool_bindings.len(), 1);
    let other = rejected(reserve(&mut s, keyed("mcb_3", "op:a", "h2")));
    assert_eq!(other.kind, RejectKind::IdempotencyKeyReused);
    // Another Computer's binding under the same key is its own.
    let mut there = keyed("mcb_4", "op:a", "h1");
    there.computer_id = "cmp_2".into();
    assert_eq!(reserve(&mut s, there), Response::Id("mcb_4".into()));
    // A failed install leaves no binding: the key installs anew.
    ok(s.apply(&Command::BindingSettle {
        binding_id: "mcb_1".into(),
        ready: false,
        tools: Value::Null,
        error: None,
        shared_uid: false,
    }));
    assert_eq!(reserve(&mut s, keyed("mcb_5", "op:a", "h2")), Response::Id("mcb_5".into()));
    // A revoked one too (the index keeps live bindings only), and a reindex keeps the index.
    ok(s.apply(&Command::BindingRevoke { by: OWNER.into(), binding_id: "mcb_5".into() }));
    assert!(!s.binding_index.installs.values().any(|id| id == "mcb_5"));
    let before = s.binding_index.installs.clone();
    s.reindex_tools();
    assert_eq!(s.binding_index.installs, before);
    assert_eq!(reserve(&mut s, keyed("mcb_6", "op:a", "h1")), Response::Id("mcb_6".into()));
}
