//! Unit tests of the lifecycle executions: commands applied to a small world, state compared.

use super::*;
use crate::sm::Command;
use crate::sm::identity::Member;
use crate::sm::identity::Principal;
use crate::sm::testing::OWNER;
use crate::sm::testing::computer as computer_record;
use crate::sm::testing::ok;
use crate::sm::testing::rejected;
use crate::sm::testing::token;
use crate::sm::testing::world;
use crate::sm::usage::UsageSpan;

fn submit(by: &str, kind: ExecutionKind, computer: &str, key: &str, body: &str) -> Command {
    let n = format!("{key}-{body}-{by}");
    let exe = Execution::pending(&format!("exe_{n}"), key, body, kind, computer, 1);
    let owner = if by == OWNER || by.starts_with("tok_bot") { "mem_o" } else { "mem_x" };
    let c = (kind == ExecutionKind::Create).then(|| Computer {
        pause_after: Some(600),
        ..computer_record(computer, owner, Source::Provider { provider: "cpp_1".into(), template: None })
    });
    Command::SubmitExecution(Box::new(Submit {
        by: by.into(),
        execution: exe,
        computer: c,
        approval_id: format!("apr_{n}"),
        reason: None,
        at_ms: 10,
    }))
}

fn run(s: &mut State, exe: &str, outcome: Outcome) {
    ok(s.apply(&Command::ClaimExecution { execution_id: exe.into(), claim: "k".into(), node: None, at_ms: 20 }));
    ok(s.apply(&Command::DispatchExecution { execution_id: exe.into(), claim: "k".into(), at_ms: 30 }));
    ok(s.apply(&Command::FinishExecution { execution_id: exe.into(), claim: "k".into(), outcome, at_ms: 40 }));
}

fn created(s: &mut State) -> String {
    let exe = ok(s.apply(&submit(OWNER, ExecutionKind::Create, "cmp_1", "k1", "a"))).expect("id");
    run(s, &exe, Outcome::Succeeded { sandbox: Some("sbx".into()) });
    exe
}

#[test]
fn same_key_same_body_replays_and_other_body_is_refused() {
    let mut s = world();
    let first = ok(s.apply(&submit(OWNER, ExecutionKind::Create, "cmp_1", "k1", "a"))).expect("id");
    let before = s.clone();
    let again = ok(s.apply(&submit(OWNER, ExecutionKind::Create, "cmp_2", "k1", "a"))).expect("id");
    assert_eq!(again, first, "a retry answers the first execution");
    assert_eq!(s, before, "a retry changes nothing");
    let r = rejected(s.apply(&submit(OWNER, ExecutionKind::Create, "cmp_3", "k1", "b")));
    assert_eq!(r.kind, RejectKind::IdempotencyKeyReused);
    assert_eq!(s, before);
}

#[test]
fn create_runs_to_running_with_an_open_span_and_events() {
    let mut s = world();
    let exe = created(&mut s);
    assert_eq!(s.executions[&exe].state, ExecutionState::Succeeded);
    let c = &s.computers["cmp_1"];
    assert_eq!(
        (c.state, c.sandbox.as_deref(), c.active_execution.as_ref()),
        (ComputerState::Running, Some("sbx"), None)
    );
    assert_eq!(s.usage["cmp_1"], vec![UsageSpan { start: 30, end: None, ended_by: None, outcome_unknown: false }]);
    let kinds: Vec<&str> = s.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, vec!["ExecutionStarted", "ExecutionFinished", "ComputerStateChanged"]);
}

#[test]
fn a_second_lifecycle_command_conflicts_with_the_running_one() {
    let mut s = world();
    created(&mut s);
    let del = ok(s.apply(&submit(OWNER, ExecutionKind::Delete, "cmp_1", "k2", "d"))).expect("id");
    let r = rejected(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", "k3", "p")));
    assert_eq!((r.kind, r.execution_id), (RejectKind::ComputerConflict, Some(del)));
}

#[test]
fn rights_are_rechecked_at_dispatch_and_nothing_is_sent_without_them() {
    let mut s = world();
    created(&mut s);
    ok(s.apply(&Command::CreateToken { by: OWNER.into(), token: token("tok_2", Principal::Member("mem_o".into())) }));
    let exe = ok(s.apply(&submit("tok_2", ExecutionKind::Pause, "cmp_1", "k2", "p"))).expect("id");
    ok(s.apply(&Command::RevokeToken { by: OWNER.into(), token_id: "tok_2".into(), at_ms: 15 }));
    ok(s.apply(&Command::ClaimExecution { execution_id: exe.clone(), claim: "k".into(), node: None, at_ms: 20 }));
    let r = rejected(s.apply(&Command::DispatchExecution { execution_id: exe.clone(), claim: "k".into(), at_ms: 30 }));
    assert_eq!(r.kind, RejectKind::Forbidden);
    let e = &s.executions[&exe];
    assert_eq!((e.state, e.dispatched_at), (ExecutionState::Failed, None));
    assert_eq!(e.error.as_ref().map(|e| e.kind.as_str()), Some("forbidden"));
    assert_eq!(s.computers["cmp_1"].state, ComputerState::Running, "the computer stays");
}

#[test]
fn placement_fences_claims_dispatches_and_takeovers() {
    let mut s = world();
    created(&mut s);
    ok(s.apply(&Command::SetLiveNodes { nodes: vec![1, 2, 3] }));
    let owner = s.placement("cmp_1").expect("placed");
    let other = [1, 2, 3].into_iter().find(|n| *n != owner).expect("another node");
    let exe = ok(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", "k2", "p"))).expect("id");
    let claim = |claim: &str, node: u64| Command::ClaimExecution {
        execution_id: exe.clone(),
        claim: claim.into(),
        node: Some(node),
        at_ms: 20,
    };
    let r = rejected(s.apply(&claim("a", other)));
    assert_eq!(r.kind, RejectKind::Conflict, "a node that does not own the Computer cannot claim");
    assert_eq!(s.executions[&exe].state, ExecutionState::Pending, "a refused claim changes nothing");
    ok(s.apply(&claim("b", owner)));
    // The owner is declared dead before it dispatched: its dispatch is refused, nothing is sent.
    let rest: Vec<u64> = [1, 2, 3].into_iter().filter(|n| *n != owner).collect();
    ok(s.apply(&Command::SetLiveNodes { nodes: rest.clone() }));
    let next = s.placement("cmp_1").expect("moved");
    assert_ne!(next, owner);
    rejected(s.apply(&Command::DispatchExecution { execution_id: exe.clone(), claim: "b".into(), at_ms: 30 }));
    assert_eq!(s.executions[&exe].dispatched_at, None);
    // The new owner takes it over and sends it; the old one coming back cannot call it lost.
    ok(s.apply(&claim("c", next)));
    ok(s.apply(&Command::DispatchExecution { execution_id: exe.clone(), claim: "c".into(), at_ms: 40 }));
    let unknown = |node: u64| Command::MarkUnknown {
        execution_id: exe.clone(),
        claim: "c".into(),
        node: Some(node),
        reason: "lost".into(),
        at_ms: 50,
    };
    let third = rest.iter().copied().find(|n| *n != next).expect("a third node");
    rejected(s.apply(&unknown(third)));
    assert_eq!(s.executions[&exe].state, ExecutionState::Running, "the sender is live: its answer may come");
    // Once the sender is dead, the Computer's new owner may declare the call unknown.
    ok(s.apply(&Command::SetLiveNodes { nodes: vec![third] }));
    ok(s.apply(&unknown(third)));
    assert_eq!(s.executions[&exe].state, ExecutionState::OutcomeUnknown);
}

#[test]
fn lost_answer_is_unknown_until_decided_and_stale_claims_are_fenced() {
    let mut s = world();
    created(&mut s);
    let exe = ok(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", "k2", "p"))).expect("id");
    ok(s.apply(&Command::ClaimExecution { execution_id: exe.clone(), claim: "old".into(), node: None, at_ms: 20 }));
    ok(s.apply(&Command::DispatchExecution { execution_id: exe.clone(), claim: "old".into(), at_ms: 30 }));
    // A takeover must not re-claim a dispatched call; it declares it unknown.
    rejected(s.apply(&Command::ClaimExecution {
        execution_id: exe.clone(),
        claim: "new".into(),
        node: None,
        at_ms: 35,
    }));
    ok(s.apply(&Command::MarkUnknown {
        execution_id: exe.clone(),
        claim: "old".into(),
        node: None,
        reason: "driver lost".into(),
        at_ms: 36,
    }));
    assert_eq!(s.executions[&exe].state, ExecutionState::OutcomeUnknown);
    assert!(s.usage["cmp_1"][0].outcome_unknown, "the span stays open, flagged");
    assert_eq!(s.events.back().map(|e| e.kind.as_str()), Some("DecisionNeeded"));
    let r = rejected(s.apply(&submit(OWNER, ExecutionKind::Delete, "cmp_1", "k3", "d")));
    assert_eq!(r.kind, RejectKind::ComputerConflict, "an unknown outcome holds the computer");
    ok(s.apply(&Command::DecideExecution {
        by: OWNER.into(),
        execution_id: exe.clone(),
        outcome: ExecutionState::Succeeded,
        reason: "the provider shows it paused".into(),
        at_ms: 50,
    }));
    assert_eq!(s.computers["cmp_1"].state, ComputerState::Paused);
    let span = &s.usage["cmp_1"][0];
    assert_eq!((span.end, span.ended_by, span.outcome_unknown), (Some(30), Some(SpanEnd::Pause), false));
}

#[test]
fn late_create_answer_keeps_the_sandbox_and_usage() {
    let mut s = world();
    let exe = ok(s.apply(&submit(OWNER, ExecutionKind::Create, "cmp_1", "k1", "a"))).expect("id");
    ok(s.apply(&Command::ClaimExecution { execution_id: exe.clone(), claim: "k".into(), node: None, at_ms: 20 }));
    ok(s.apply(&Command::DispatchExecution { execution_id: exe.clone(), claim: "k".into(), at_ms: 30 }));
    let lost = Outcome::Unknown { reason: "timeout".into() };
    ok(s.apply(&Command::FinishExecution { execution_id: exe.clone(), claim: "k".into(), outcome: lost, at_ms: 40 }));
    let late = Outcome::Succeeded { sandbox: Some("sbx-late".into()) };
    ok(s.apply(&Command::FinishExecution { execution_id: exe.clone(), claim: "k".into(), outcome: late, at_ms: 45 }));
    assert_eq!(s.executions[&exe].state, ExecutionState::OutcomeUnknown, "still waits for a person");
    assert_eq!(s.computers["cmp_1"].sandbox.as_deref(), Some("sbx-late"));
    assert_eq!(s.usage["cmp_1"].len(), 1);
}

#[test]
fn stop_on_an_unknown_pause_fails_the_computer() {
    let mut s = world();
    created(&mut s);
    let exe = ok(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", "k2", "p"))).expect("id");
    run(&mut s, &exe, Outcome::Unknown { reason: "lost".into() });
    ok(s.apply(&Command::StopComputer { by: OWNER.into(), computer_id: "cmp_1".into(), at_ms: 60 }));
    let c = &s.computers["cmp_1"];
    assert_eq!((c.state, c.active_execution.as_ref()), (ComputerState::Failed, None));
    assert!(s.usage["cmp_1"][0].outcome_unknown && s.usage["cmp_1"][0].end.is_none());
}

#[test]
fn bots_ask_and_wait_for_approval_and_see_only_granted_computers() {
    let mut s = world();
    created(&mut s);
    let bot = s.caller_by_token_id("tok_bot").expect("bot");
    assert!(!s.can_see(&bot, &s.computers["cmp_1"]));
    let exe = ok(s.apply(&submit("tok_bot", ExecutionKind::Create, "cmp_b", "kb", "x"))).expect("id");
    let e = s.executions[&exe].clone();
    let approval = e.approval.clone().expect("parked for approval");
    assert!(!s.claimable(&e));
    ok(s.apply(&Command::DecideApproval { by: OWNER.into(), approval_id: approval, approve: true, at_ms: 12 }));
    assert!(s.claimable(&s.executions[&exe]));
    assert!(s.can_see(&bot, &s.computers["cmp_b"]), "the creating bot holds a grant");
    // Acquire asks; archiving the bot ends its rights.
    let apr = ok(s.apply(&Command::Acquire {
        by: "tok_bot".into(),
        computer_id: "cmp_1".into(),
        approval_id: "apr_acq".into(),
        reason: Some("need it".into()),
        at_ms: 13,
    }));
    assert_eq!(apr.as_deref(), Some("apr_acq"));
    ok(s.apply(&Command::DecideApproval { by: OWNER.into(), approval_id: "apr_acq".into(), approve: true, at_ms: 14 }));
    assert!(s.has_grant("cmp_1", "bot_1"));
    ok(s.apply(&Command::ArchiveBot { by: OWNER.into(), bot_id: "bot_1".into(), at_ms: 15 }));
    assert!(!s.has_grant("cmp_1", "bot_1") && !s.has_grant("cmp_b", "bot_1"));
}

#[test]
fn a_repeated_dispatch_by_its_claimant_answers_as_the_first() {
    let claim = |exe: &str, c: &str| Command::ClaimExecution {
        execution_id: exe.into(),
        claim: c.into(),
        node: None,
        at_ms: 20,
    };
    let dispatch =
        |exe: &str, c: &str, at| Command::DispatchExecution { execution_id: exe.into(), claim: c.into(), at_ms: at };
    let mut s = world();
    created(&mut s);
    let exe = ok(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", "k2", "p"))).expect("id");
    ok(s.apply(&claim(&exe, "k")));
    ok(s.apply(&dispatch(&exe, "k", 30)));
    // The answer was lost; the driver asks again with its claim: the same answer, no change.
    let before = s.clone();
    ok(s.apply(&dispatch(&exe, "k", 31)));
    assert_eq!(s, before, "a repeat changes nothing (the dispatch time stays the first's)");
    assert_eq!(rejected(s.apply(&dispatch(&exe, "other", 32))).message, "stale claim", "others stay fenced");
    // The driver sends the call and finishes it; a late repeat still answers as the first did.
    ok(s.apply(&Command::FinishExecution {
        execution_id: exe.clone(),
        claim: "k".into(),
        outcome: Outcome::Succeeded { sandbox: None },
        at_ms: 40,
    }));
    let before = s.clone();
    ok(s.apply(&dispatch(&exe, "k", 41)));
    assert_eq!(s, before);

    // A first dispatch refused (the requester lost the right): refused again, the same way.
    ok(s.apply(&Command::CreateToken { by: OWNER.into(), token: token("tok_2", Principal::Member("mem_o".into())) }));
    let exe = ok(s.apply(&submit("tok_2", ExecutionKind::Resume, "cmp_1", "k3", "r"))).expect("id");
    ok(s.apply(&Command::RevokeToken { by: OWNER.into(), token_id: "tok_2".into(), at_ms: 45 }));
    ok(s.apply(&claim(&exe, "k")));
    let first = rejected(s.apply(&dispatch(&exe, "k", 50)));
    assert_eq!(first.kind, RejectKind::Forbidden);
    let before = s.clone();
    assert_eq!(rejected(s.apply(&dispatch(&exe, "k", 51))), first);
    assert_eq!(s, before);
    assert_eq!(s.executions[&exe].dispatched_at, None, "never sent");
}

/// Applies `cmd` as the leader's entry stamped `at` (the cluster's clock moves to `at`).
fn at(s: &mut State, at: u64, cmd: Command) -> crate::sm::Response {
    s.apply_request(&crate::sm::Request::new(cmd).stamped(at))
}

/// An entry that only moves the clock (a refused command: it changes nothing itself).
fn tick(s: &mut State, ms: u64) {
    at(s, ms, Command::SetRetention { by: "tok_nobody".into(), ms: 0 });
}

#[test]
fn finished_executions_and_their_keys_expire_but_an_unknown_outcome_never_does() {
    let r = crate::sm::DEFAULT_RETENTION_MS;
    let mut s = world();
    let create = created(&mut s); // finished at 40
    let pause = ok(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", "k2", "p"))).expect("id");
    run(&mut s, &pause, Outcome::Succeeded { sandbox: None });
    let resume = ok(s.apply(&submit(OWNER, ExecutionKind::Resume, "cmp_1", "k3", "r"))).expect("id");
    ok(s.apply(&Command::ClaimExecution { execution_id: resume.clone(), claim: "k".into(), node: None, at_ms: 50 }));
    ok(s.apply(&Command::DispatchExecution { execution_id: resume.clone(), claim: "k".into(), at_ms: 51 }));
    ok(s.apply(&Command::MarkUnknown {
        execution_id: resume.clone(),
        claim: "k".into(),
        node: None,
        reason: "lost".into(),
        at_ms: 52,
    }));

    // One ms short of the retention: everything stays, and the key still replays.
    tick(&mut s, 40 + r - 1);
    assert!(s.executions.contains_key(&create) && s.executions.contains_key(&pause));
    let replay = ok(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", "k2", "p"))).expect("id");
    assert_eq!(replay, pause, "within the retention the key answers the first execution");

    // Past it: the finished ones and their keys are gone; the unknown outcome and its key stay.
    tick(&mut s, 40 + r);
    assert!(!s.executions.contains_key(&create) && !s.executions.contains_key(&pause));
    assert!(s.execution_keys.values().all(|id| id != &create && id != &pause), "{:?}", s.execution_keys);
    assert_eq!(s.executions[&resume].state, ExecutionState::OutcomeUnknown);
    let mut t = s.clone();
    t.reindex_executions();
    assert_eq!(t.exec_index, s.exec_index, "the maintained indexes equal a rebuild");
    // The key is unknown now: the same request is a new command (refused here only because the
    // unknown resume still holds the Computer), not a replay of the expired pause.
    let r2 = rejected(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", "k2", "p")));
    assert_eq!(r2.kind, RejectKind::ComputerConflict, "{r2:?}");
    tick(&mut s, 40 + 50 * r);
    assert_eq!(s.executions[&resume].state, ExecutionState::OutcomeUnknown, "unresolved never expires");
    let replay = ok(s.apply(&submit(OWNER, ExecutionKind::Resume, "cmp_1", "k3", "r"))).expect("id");
    assert_eq!(replay, resume, "its key still answers it");

    // Decided, it finishes and its retention starts then.
    let decided = 40 + 50 * r;
    ok(s.apply(&Command::DecideExecution {
        by: OWNER.into(),
        execution_id: resume.clone(),
        outcome: ExecutionState::Succeeded,
        reason: "seen running".into(),
        at_ms: decided,
    }));
    tick(&mut s, decided + r - 1);
    assert!(s.executions.contains_key(&resume));
    tick(&mut s, decided + r);
    assert!(!s.executions.contains_key(&resume) && s.execution_keys.is_empty(), "{:?}", s.execution_keys);
    let fresh = ok(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", "k2", "p"))).expect("id");
    assert_eq!(s.executions[&fresh].state, ExecutionState::Pending, "the expired key made a new command");
}

#[test]
fn a_deleted_computer_goes_with_its_last_receipt_and_decided_approvals_expire() {
    let r = crate::sm::DEFAULT_RETENTION_MS;
    let mut s = world();
    created(&mut s);
    // A bot's create waits for an approval, which is decided at 12.
    let exe = ok(s.apply(&submit("tok_bot", ExecutionKind::Create, "cmp_b", "kb", "x"))).expect("id");
    let approval = s.executions[&exe].approval.clone().expect("parked");
    ok(s.apply(&Command::DecideApproval {
        by: OWNER.into(),
        approval_id: approval.clone(),
        approve: false,
        at_ms: 12,
    }));
    assert_eq!(s.approvals[&approval].decided_at, Some(12));
    let delete = ok(s.apply(&submit(OWNER, ExecutionKind::Delete, "cmp_1", "kd", "d"))).expect("id");
    run(&mut s, &delete, Outcome::Succeeded { sandbox: None });
    assert_eq!(s.computers["cmp_1"].state, ComputerState::Deleted);
    tick(&mut s, 12 + r);
    assert!(!s.approvals.contains_key(&approval), "a decided approval expires");
    assert!(s.computers.contains_key("cmp_1"), "its receipts are still kept");
    tick(&mut s, 40 + r);
    assert!(!s.computers.contains_key("cmp_1") && !s.usage.contains_key("cmp_1"), "the tombstone went last");
    assert!(s.executions.is_empty(), "{:?}", s.executions.keys().collect::<Vec<_>>());
}

#[test]
fn the_retention_is_set_by_an_admin_within_bounds_and_compaction_is_batched() {
    let mut s = world();
    let hour = crate::sm::MIN_RETENTION_MS;
    assert_eq!(rejected(s.apply(&Command::SetRetention { by: OWNER.into(), ms: hour - 1 })).kind, RejectKind::Invalid);
    assert_eq!(
        rejected(s.apply(&Command::SetRetention { by: "tok_bot".into(), ms: hour })).kind,
        RejectKind::Forbidden
    );
    ok(s.apply(&Command::SetRetention { by: OWNER.into(), ms: hour }));
    created(&mut s);
    // 40 finished pauses and resumes: one entry compacts at most COMPACT_PER_ENTRY of them.
    for i in 0..20 {
        let p = ok(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", &format!("p{i}"), "p"))).expect("id");
        run(&mut s, &p, Outcome::Succeeded { sandbox: None });
        let q = ok(s.apply(&submit(OWNER, ExecutionKind::Resume, "cmp_1", &format!("r{i}"), "r"))).expect("id");
        run(&mut s, &q, Outcome::Succeeded { sandbox: None });
    }
    assert_eq!(s.executions.len(), 41);
    tick(&mut s, 40 + hour);
    assert_eq!(s.executions.len(), 41 - crate::sm::retention::COMPACT_PER_ENTRY);
    tick(&mut s, 40 + hour);
    tick(&mut s, 40 + hour);
    assert!(s.executions.is_empty());
    assert_eq!(s.computers["cmp_1"].state, ComputerState::Running, "a live Computer stays");
}

#[test]
fn lists_come_from_the_indexes_a_page_at_a_time_and_grants_follow_the_bot() {
    let mut s = world();
    let x = Member { id: "mem_x".into(), name: "x".into(), email: None, role: Role::Member, created_at: 1 };
    ok(s.apply(&Command::CreateMember { by: OWNER.into(), member: x }));
    ok(s.apply(&Command::CreateToken { by: OWNER.into(), token: token("tok_x", Principal::Member("mem_x".into())) }));
    created(&mut s); // cmp_1, the owner's
    let e = ok(s.apply(&submit("tok_x", ExecutionKind::Create, "cmp_x1", "kx", "x"))).expect("id");
    run(&mut s, &e, Outcome::Succeeded { sandbox: None });
    let ids = |s: &State, who: &str, after: Option<&str>, limit: usize| {
        let caller = s.caller_by_token_id(who).expect("caller");
        let (rows, next) = s.computers_visible_to(&caller, after, limit);
        (rows.iter().map(|c| c.id.clone()).collect::<Vec<_>>(), next)
    };
    assert_eq!(ids(&s, OWNER, None, 10), (vec!["cmp_1".to_string(), "cmp_x1".to_string()], None), "an owner sees all");
    assert_eq!(ids(&s, OWNER, None, 1), (vec!["cmp_1".to_string()], Some("cmp_1".to_string())));
    assert_eq!(ids(&s, OWNER, Some("cmp_1"), 1), (vec!["cmp_x1".to_string()], None));
    assert_eq!(ids(&s, "tok_x", None, 10).0, ["cmp_x1"], "a member sees its own");
    assert!(ids(&s, "tok_bot", None, 10).0.is_empty(), "a bot only what it holds a grant on");
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
    assert_eq!(ids(&s, "tok_bot", None, 10).0, ["cmp_1"]);
    let mut t = s.clone();
    t.reindex_computers();
    assert_eq!(t.computer_index, s.computer_index, "the maintained index equals a rebuild");
    ok(s.apply(&Command::ArchiveBot { by: OWNER.into(), bot_id: "bot_1".into(), at_ms: 60 }));
    assert!(s.grants.is_empty() && s.computer_index.granted.is_empty(), "archiving ends every grant of the bot");
    // A deleted Computer leaves the lists at once, and the index with its last receipt.
    let d = ok(s.apply(&submit(OWNER, ExecutionKind::Delete, "cmp_x1", "kd", "d"))).expect("id");
    run(&mut s, &d, Outcome::Succeeded { sandbox: None });
    assert_eq!(ids(&s, OWNER, None, 10).0, ["cmp_1"]);
    let mut t = s.clone();
    t.reindex_computers();
    assert_eq!(t.computer_index, s.computer_index);
}

#[test]
fn lease_reports_of_the_current_link_are_events_and_older_ones_are_refused() {
    let mut s = world();
    created(&mut s);
    if let Some(c) = s.computers.get_mut("cmp_1") {
        c.link_generation = 3;
    }
    let lease = |generation: u64, holder: Option<&str>| Command::DesktopLease {
        computer_id: "cmp_1".into(),
        generation,
        holder: holder.map(String::from),
        at_ms: 50,
    };
    ok(s.apply(&lease(3, Some("bot:bot_1"))));
    ok(s.apply(&lease(3, None)));
    let holders: Vec<_> =
        s.events.iter().filter(|e| e.kind == "DesktopLeaseChanged").map(|e| e.data["holder"].clone()).collect();
    assert_eq!(holders, [serde_json::json!("bot:bot_1"), serde_json::Value::Null]);
    let before = s.clone();
    assert_eq!(rejected(s.apply(&lease(2, Some("member:mem_o")))).kind, RejectKind::Conflict);
    assert_eq!(rejected(s.apply(&lease(3, Some(&"x".repeat(201))))).kind, RejectKind::Invalid);
    assert_eq!(s, before, "refusals change nothing");
}

#[test]
fn desktop_reports_of_the_current_link_are_kept_and_bad_ones_change_nothing() {
    use crate::sm::model::DesktopView;
    let mut s = world();
    created(&mut s);
    if let Some(c) = s.computers.get_mut("cmp_1") {
        c.link_generation = 2;
    }
    let view = |display: &str, width: Option<u32>, state: &str| DesktopView {
        display: display.into(),
        width,
        height: width.map(|w| w / 2),
        state: state.into(),
    };
    let report = |generation: u64, desktop: DesktopView| Command::DesktopStatus {
        computer_id: "cmp_1".into(),
        generation,
        desktop,
    };
    ok(s.apply(&report(2, view(":99", Some(1280), "running"))));
    assert_eq!(s.computers["cmp_1"].desktop_view, Some(view(":99", Some(1280), "running")));
    let before = s.clone();
    assert_eq!(rejected(s.apply(&report(1, view(":99", None, "failed")))).kind, RejectKind::Conflict);
    for bad in [view("99", None, "running"), view(":99", None, "dancing"), view(":99", Some(0), "running")] {
        assert_eq!(rejected(s.apply(&report(2, bad))).kind, RejectKind::Invalid);
    }
    assert_eq!(s, before);
    // The record keeps it across a snapshot.
    let json = serde_json::to_string(&s.computers["cmp_1"]).expect("json");
    assert!(json.contains("\"desktop_view\"") || json.contains("\"desktopView\""), "{json}");
}

/// Issue 39, item 5: a create's options are kept in the record, and the list filtered by
/// metadata examines a bounded number of records per page, answering a cursor to go on.
#[test]
fn i39_5_options_are_kept_and_a_filtered_list_is_bounded() {
    let mut s = world();
    for (i, team) in ["a", "b", "a", "b", "b", "a"].iter().enumerate() {
        let id = format!("cmp_{i}");
        let mut c = computer_record(&id, "mem_o", Source::Provider { provider: "cpp_1".into(), template: None });
        c.metadata.insert("team".into(), team.to_string());
        c.env.insert("GREETING".into(), "hi".into());
        let exe = Execution::pending(&format!("exe_{i}"), &format!("k{i}"), "h", ExecutionKind::Create, &id, 1);
        let cmd = Command::SubmitExecution(Box::new(Submit {
            by: OWNER.into(),
            execution: exe,
            computer: Some(c),
            approval_id: format!("apr_{i}"),
            reason: None,
            at_ms: 10,
        }));
        assert_eq!(cmd.since(), 2);
        ok(s.apply(&cmd));
    }
    assert_eq!(s.computers["cmp_0"].env.get("GREETING").map(String::as_str), Some("hi"));
    let caller = s.caller_by_token_id(OWNER).expect("caller");
    let team_a = |c: &Computer| c.metadata.get("team").is_some_and(|t| t == "a");
    let page = |after: Option<&str>, limit: usize, budget: usize| {
        let (rows, next) = s.computers_visible_where(&caller, after, limit, &team_a, budget);
        (rows.iter().map(|c| c.id.clone()).collect::<Vec<_>>(), next)
    };
    assert_eq!(page(None, 10, 100), (vec!["cmp_0".into(), "cmp_2".into(), "cmp_5".into()], None));
    assert_eq!(page(None, 2, 100), (vec!["cmp_0".into(), "cmp_2".into()], Some("cmp_2".into())));
    // Two records examined per request: the pages are short, and the cursors cover every record.
    assert_eq!(page(None, 10, 2), (vec!["cmp_0".into()], Some("cmp_1".into())));
    assert_eq!(page(Some("cmp_1"), 10, 2), (vec!["cmp_2".into()], Some("cmp_3".into())));
    assert_eq!(page(Some("cmp_3"), 10, 2), (vec!["cmp_5".into()], None));
    assert_eq!(page(Some("cmp_2"), 10, 1), (vec![], Some("cmp_3".into())), "a page may be empty, with a cursor");
}

/// A recreate with a pairing code for the new sandbox's agent.
fn recreate(key: &str, template: Option<&str>) -> Command {
    let mut cmd = submit(OWNER, ExecutionKind::Recreate, "cmp_1", key, key);
    if let Command::SubmitExecution(s) = &mut cmd {
        s.execution.template = template.map(String::from);
        s.execution.pairing_code = Some(format!("CODE-{key}"));
        s.execution.pairing_expires_at = Some(1_000_000);
    }
    cmd
}

/// Issue 40, items 1, 4 and 5: a recreate is a version-3 lifecycle execution. Its new sandbox's
/// agent pairs with the recreate's code, which ends the old agent's link and credential; the
/// Computer starts until the new link is up, then runs, with the new sandbox and template. It is
/// refused for an own machine and a provider that keeps no runtime apart (ComputerUnsupported),
/// while another execution runs or a tool switch is pending (ComputerConflict, naming it); a
/// failure after the old sandbox was stopped leaves the Computer failed, one that sent nothing
/// changes nothing.
#[test]
fn i40_a_recreate_replaces_the_sandbox_and_the_agent_and_is_refused_where_it_cannot_keep_the_runtime() {
    let mut s = world();
    created(&mut s);
    // A provider whose sandboxes run our agent (the docker provider's recreate).
    s.providers.get_mut("cpp_1").expect("provider").kind = crate::sm::ProviderKind::Docker;
    s.computers.get_mut("cmp_1").expect("c").agent_credential = Some("old".into());
    let old_gen = ok(s.apply(&Command::LinkUp {
        computer_id: "cmp_1".into(),
        credential_hash: "old".into(),
        node_id: 1,
        at_ms: 42,
    }));
    assert_eq!(old_gen.as_deref(), Some("1"));
    let cmd = recreate("r1", Some("newer"));
    assert_eq!(cmd.since(), 3, "an older build cannot read a recreate");
    let exe = ok(s.apply(&cmd)).expect("id");
    let r = rejected(s.apply(&submit(OWNER, ExecutionKind::Pause, "cmp_1", "p", "p")));
    assert_eq!((r.kind, r.execution_id.as_deref()), (RejectKind::ComputerConflict, Some(exe.as_str())));
    ok(s.apply(&Command::ClaimExecution { execution_id: exe.clone(), claim: "k".into(), node: None, at_ms: 50 }));
    ok(s.apply(&Command::DispatchExecution { execution_id: exe.clone(), claim: "k".into(), at_ms: 51 }));
    // The new agent pairs before the provider's answer is recorded.
    let paired =
        ok(s.apply(&Command::RedeemPairing { code: "CODE-r1".into(), credential_hash: "new".into(), at_ms: 52 }));
    assert_eq!(paired.as_deref(), Some("cmp_1"));
    let c = &s.computers["cmp_1"];
    assert_eq!((c.state, c.link_node, c.agent_credential.as_deref()), (ComputerState::Starting, None, Some("new")));
    let refused =
        s.apply(&Command::LinkUp { computer_id: "cmp_1".into(), credential_hash: "old".into(), node_id: 1, at_ms: 53 });
    assert_eq!(rejected(refused).kind, RejectKind::Unauthorized, "the old agent's credential is over");
    let stale = s.apply(&Command::LinkDown { computer_id: "cmp_1".into(), generation: 1, at_ms: 53 });
    assert_eq!(rejected(stale).kind, RejectKind::Conflict, "the old link's end touches nothing");
    ok(s.apply(&Command::LinkUp { computer_id: "cmp_1".into(), credential_hash: "new".into(), node_id: 2, at_ms: 54 }));
    let outcome = Outcome::Succeeded { sandbox: Some("sbx2".into()) };
    ok(s.apply(&Command::FinishExecution { execution_id: exe.clone(), claim: "k".into(), outcome, at_ms: 55 }));
    let c = &s.computers["cmp_1"];
    assert_eq!((c.state, c.sandbox.as_deref(), c.link_node), (ComputerState::Running, Some("sbx2"), Some(2)));
    assert_eq!(c.source, Source::Provider { provider: "cpp_1".into(), template: Some("newer".into()) });

    // Answered before the new agent pairs: starting, and no link is the new one's yet.
    let exe = ok(s.apply(&recreate("r2", None))).expect("id");
    run(&mut s, &exe, Outcome::Succeeded { sandbox: Some("sbx3".into()) });
    let c = &s.computers["cmp_1"];
    assert_eq!((c.state, c.sandbox.as_deref(), c.link_node), (ComputerState::Starting, Some("sbx3"), None));

    // Failures: nothing sent changes nothing; after the stop, the Computer is failed.
    let before = s.computers["cmp_1"].state;
    let exe = ok(s.apply(&recreate("r3", None))).expect("id");
    let error = ExecutionError { kind: "not_sent".into(), message: "no engine".into() };
    run(&mut s, &exe, Outcome::Failed { error });
    assert_eq!(s.computers["cmp_1"].state, before);
    let exe = ok(s.apply(&recreate("r4", None))).expect("id");
    let error = ExecutionError { kind: "recreate_failed".into(), message: "the disk is full".into() };
    run(&mut s, &exe, Outcome::Failed { error });
    assert_eq!(s.computers["cmp_1"].state, ComputerState::Failed);
    // A failed Computer may be recreated again.
    let exe = ok(s.apply(&recreate("r5", None))).expect("id");
    run(&mut s, &exe, Outcome::Succeeded { sandbox: Some("sbx4".into()) });
    assert_eq!(s.computers["cmp_1"].state, ComputerState::Starting);

    // A pending tool switch on the Computer.
    s.binding_index.by_computer.entry("cmp_1".into()).or_default().insert("mcb_a".into());
    s.binding_index.pending_switch.insert("mcb_a".into(), "sw-key".into());
    let before = s.clone();
    let r = rejected(s.apply(&recreate("r6", None)));
    assert_eq!(r.kind, RejectKind::ComputerConflict);
    assert!(r.message.contains("sw-key") && r.message.contains("mcb_a"), "{}", r.message);
    assert_eq!(s, before, "a refusal changes nothing");
    s.binding_index.pending_switch.clear();

    // An own machine, and a provider that keeps nothing apart from its sandboxes.
    let mut own = computer_record("cmp_own", "mem_o", Source::Paired);
    own.state = ComputerState::Running;
    s.insert_computer(own);
    let mut cmd = recreate("r7", None);
    if let Command::SubmitExecution(sub) = &mut cmd {
        sub.execution.computer_id = "cmp_own".into();
    }
    assert_eq!(rejected(s.apply(&cmd)).kind, RejectKind::Unsupported);
    s.providers.get_mut("cpp_1").expect("provider").kind = crate::sm::ProviderKind::E2b;
    let r = rejected(s.apply(&recreate("r8", None)));
    assert!(r.kind == RejectKind::Unsupported && r.message.contains("docker"), "{r:?}");
}
