//! Turns and runs in the state machine: idempotent turns, leases fenced by their claim and
//! judged by the cluster's clock, bounded events, the lost runtime (requeued, or needing a
//! decision when an action may have had its effect), retention.

use serde_json::json;

use super::super::Command;
use super::super::Request;
use super::super::Response;
use super::super::model::ActionState;
use super::super::model::BrowserAction;
use super::super::run_model::*;
use super::super::state::State;
use super::super::testing::OWNER;
use super::super::testing::ok;
use super::super::testing::rejected;
use super::super::testing::world;
use crate::sm::response::RejectKind;

fn run(id: &str, turn: &str, text: &str) -> Run {
    Run {
        id: id.into(),
        member_id: "mem_o".into(),
        bot_id: "bot_1".into(),
        started_by_bot: false,
        client_turn_id: turn.into(),
        text: text.into(),
        attachments: vec![],
        after_run: AfterRun::KeepWarm,
        state: RunState::Queued,
        lease: None,
        attempts: 0,
        created_at: 0,
        updated_at: 0,
        finished_at: None,
        result: None,
        error: None,
        undecided_actions: vec![],
        events: vec![],
        event_bytes: 0,
    }
}

/// Applies `cmd` stamped at cluster ms `at`.
fn at(s: &mut State, at: u64, cmd: Command) -> Response {
    s.apply_request(&Request::new(cmd).stamped(at))
}

fn claim(s: &mut State, when: u64, claim: &str, lease_ms: u64) -> Option<String> {
    let cmd = Command::RunClaim { by: "tok_bot".into(), bot_id: "bot_1".into(), claim: claim.into(), lease_ms };
    ok(at(s, when, cmd))
}

fn event(s: &mut State, when: u64, claim: &str, data: serde_json::Value) -> Response {
    let cmd = Command::RunEvent {
        by: "tok_bot".into(),
        run_id: "run_1".into(),
        claim: claim.into(),
        kind: "partial".into(),
        data,
    };
    at(s, when, cmd)
}

fn started() -> State {
    let mut s = world();
    let id = ok(at(&mut s, 1_000, Command::RunStart { by: OWNER.into(), run: run("run_1", "t1", "upload it") }));
    assert_eq!(id.as_deref(), Some("run_1"));
    s
}

#[test]
fn a_turn_is_idempotent_on_its_client_turn_id() {
    let mut s = started();
    let again = ok(at(&mut s, 1_100, Command::RunStart { by: OWNER.into(), run: run("run_2", "t1", "upload it") }));
    assert_eq!(again.as_deref(), Some("run_1"), "the same turn answers the same run");
    assert_eq!(s.runs.runs.len(), 1);
    let other = rejected(at(&mut s, 1_200, Command::RunStart { by: OWNER.into(), run: run("run_3", "t1", "other") }));
    assert_eq!(other.kind, RejectKind::IdempotencyKeyReused);
    // A bot may not start a turn in its member's name, nor for another bot.
    let mut r = run("run_4", "t2", "x");
    let bad = rejected(at(&mut s, 1_300, Command::RunStart { by: "tok_bot".into(), run: r.clone() }));
    assert_eq!(bad.kind, RejectKind::Forbidden);
    r.started_by_bot = true;
    ok(at(&mut s, 1_300, Command::RunStart { by: "tok_bot".into(), run: r }));
    // A missing blob is refused, and nothing is recorded.
    let mut r = run("run_5", "t3", "x");
    r.attachments.push(Attachment { name: "a".into(), mime_type: "x/y".into(), size: 1, blob_id: "blb_no".into() });
    assert_eq!(rejected(at(&mut s, 1_400, Command::RunStart { by: OWNER.into(), run: r })).kind, RejectKind::NotFound);
    assert!(!s.runs.runs.contains_key("run_5"));
}

#[test]
fn a_claim_holds_the_run_and_fences_out_other_attempts() {
    let mut s = started();
    assert_eq!(claim(&mut s, 2_000, "c1", 5_000).as_deref(), Some("run_1"));
    assert_eq!(claim(&mut s, 2_001, "c2", 5_000), None, "nothing else is queued");
    assert_eq!(s.runs.runs["run_1"].state, RunState::Running);
    assert_eq!(ok(event(&mut s, 2_100, "c1", json!("Hel"))).as_deref(), Some("3"));
    assert_eq!(rejected(event(&mut s, 2_200, "c2", json!("x"))).kind, RejectKind::Conflict);
    let finish = Command::RunFinish {
        by: "tok_bot".into(),
        run_id: "run_1".into(),
        claim: "c1".into(),
        succeeded: true,
        result: Some(json!({"url": "u"})),
        error: None,
    };
    ok(at(&mut s, 2_300, finish.clone()));
    let r = &s.runs.runs["run_1"];
    assert_eq!((r.state, r.finished_at), (RunState::Succeeded, Some(2_300)));
    let kinds: Vec<&str> = r.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["state", "state", "partial", "final"]);
    assert_eq!(r.events_after(2, 10).iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
    assert!(r.events_after(9, 10).is_empty());
    assert_eq!(rejected(at(&mut s, 2_400, finish)).kind, RejectKind::Conflict, "ended once");
}

#[test]
fn a_lapsed_lease_requeues_the_run_by_the_cluster_clock() {
    let mut s = started();
    claim(&mut s, 2_000, "c1", 5_000);
    // Before the lapse, renewing keeps it; the clock is the leader's stamp, not a node's.
    let renew =
        |c: &str| Command::RunRenew { by: "tok_bot".into(), run_id: "run_1".into(), claim: c.into(), lease_ms: 5_000 };
    ok(at(&mut s, 6_000, renew("c1")));
    assert_eq!(s.runs.next_expiry(), Some(11_000));
    ok(at(&mut s, 10_999, Command::RunsTick));
    assert_eq!(s.runs.runs["run_1"].state, RunState::Running);
    ok(at(&mut s, 11_000, Command::RunsTick));
    let r = &s.runs.runs["run_1"];
    assert_eq!((r.state, r.lease.is_none(), r.attempts), (RunState::Queued, true, 1));
    assert_eq!(rejected(at(&mut s, 11_001, renew("c1"))).kind, RejectKind::Conflict, "the old attempt is fenced");
    assert_eq!(claim(&mut s, 12_000, "c2", 5_000).as_deref(), Some("run_1"));
    assert_eq!(s.runs.runs["run_1"].attempts, 2);
}

#[test]
fn a_lost_runtime_with_a_dispatching_action_needs_a_decision() {
    let mut s = started();
    claim(&mut s, 2_000, "c1", 5_000);
    let action = BrowserAction {
        action_id: "up-1".into(),
        computer_id: "cmp_1".into(),
        member_id: "mem_o".into(),
        bot_id: Some("bot_1".into()),
        tool: "upload".into(),
        request: json!({}),
        run_id: Some("run_1".into()),
        run_claim: Some("c1".into()),
        intent: Some("upload report.pdf".into()),
        evidence: Some(json!({"previousDocumentIds": [1, 2]})),
        state: ActionState::Dispatching,
        claim: "a".into(),
        created_at: 2_100,
        dispatched_at: Some(2_100),
        lapses_at: None,
        settled_at: None,
        result: None,
        error: None,
        decided_by: None,
        evidence_blobs: vec![],
    };
    let key = action.key();
    s.note_run_action("run_1", &key);
    s.browser_actions.insert(key.clone(), action);
    ok(at(&mut s, 7_000, Command::RunsTick));
    let r = &s.runs.runs["run_1"];
    assert_eq!(r.state, RunState::NeedsDecision);
    assert_eq!(r.undecided_actions, std::slice::from_ref(&key));
    assert_eq!(claim(&mut s, 7_100, "c2", 5_000), None, "never claimed again blindly");
    let requeue = Command::RunDecide { by: OWNER.into(), run_id: "run_1".into(), requeue: true };
    assert_eq!(rejected(at(&mut s, 7_200, requeue.clone())).kind, RejectKind::Conflict, "decide the action first");
    let by_bot = Command::RunDecide { by: "tok_bot".into(), run_id: "run_1".into(), requeue: false };
    assert_eq!(rejected(at(&mut s, 7_200, by_bot)).kind, RejectKind::Forbidden);
    if let Some(a) = s.browser_actions.get_mut(&key) {
        a.state = ActionState::Done;
    }
    ok(at(&mut s, 7_300, requeue));
    assert_eq!(s.runs.runs["run_1"].state, RunState::Queued);
}

#[test]
fn events_are_bounded_and_the_final_one_always_fits() {
    let mut s = started();
    claim(&mut s, 2_000, "c1", 600_000);
    let mut accepted = 0;
    let refused = loop {
        match event(&mut s, 3_000, "c1", json!("x".repeat(100))) {
            Response::Id(_) => accepted += 1,
            other => break rejected(other),
        }
        assert!(accepted <= MAX_RUN_EVENTS, "unbounded");
    };
    assert_eq!(refused.kind, RejectKind::Conflict);
    assert_eq!(accepted, MAX_RUN_EVENTS - RESERVED_EVENTS - 2, "two state events came first");
    let big = event(&mut s, 3_000, "c1", json!("y".repeat(MAX_EVENT_BYTES)));
    assert_eq!(rejected(big).kind, RejectKind::Invalid);
    let finish = Command::RunFinish {
        by: "tok_bot".into(),
        run_id: "run_1".into(),
        claim: "c1".into(),
        succeeded: false,
        result: None,
        error: Some("too chatty".into()),
    };
    ok(at(&mut s, 3_100, finish));
    let r = &s.runs.runs["run_1"];
    assert!(r.events.len() <= MAX_RUN_EVENTS && r.event_bytes <= MAX_RUN_EVENT_BYTES);
    assert_eq!(r.events.last().map(|e| e.kind.as_str()), Some("final"));
}

#[test]
fn finished_runs_and_their_turn_ids_go_after_the_retention() {
    let mut s = started();
    ok(at(&mut s, 2_000, Command::RunCancel { by: OWNER.into(), run_id: "run_1".into() }));
    assert_eq!(s.runs.runs["run_1"].state, RunState::Cancelled);
    let later = 2_000 + super::super::retention::RUN_RETENTION_MS;
    ok(at(&mut s, later - 1, Command::RunsTick));
    assert!(s.runs.runs.contains_key("run_1"));
    ok(at(&mut s, later, Command::RunsTick));
    assert!(s.runs.runs.is_empty() && s.runs.turns.is_empty());
    // The turn id is free again: a new run.
    let id = ok(at(&mut s, later + 1, Command::RunStart { by: OWNER.into(), run: run("run_9", "t1", "upload it") }));
    assert_eq!(id.as_deref(), Some("run_9"));
    // A snapshot's load rebuilds the same indexes.
    let mut copy: State = serde_json::from_value(serde_json::to_value(&s).expect("ser")).expect("de");
    copy.reindex_executions();
    assert_eq!(copy.runs.index, s.runs.index);
}

/// Issue 37, item 1: an action of a run is recorded and marked dispatching only while its
/// claim holds the run's lease. Runtime A prepared an action, its lease lapsed and B claimed
/// the run: A can neither dispatch it nor record another (`LeaseLost`); B takes it over.
#[test]
fn i37_1_a_runs_action_needs_its_claim_to_hold_the_lease() {
    let mut s = started();
    s.computers
        .insert("cmp_1".into(), super::super::testing::computer("cmp_1", "mem_o", super::super::model::Source::Paired));
    claim(&mut s, 2_000, "c1", 5_000);
    let act = |id: &str, run_claim: &str, attempt: &str| BrowserAction {
        action_id: id.into(),
        computer_id: "cmp_1".into(),
        member_id: "mem_o".into(),
        bot_id: None,
        tool: "click".into(),
        request: json!({"ref": "e1"}),
        run_id: Some("run_1".into()),
        run_claim: Some(run_claim.into()),
        intent: None,
        evidence: None,
        state: ActionState::Prepared,
        claim: attempt.into(),
        created_at: 0,
        dispatched_at: None,
        lapses_at: None,
        settled_at: None,
        result: None,
        error: None,
        decided_by: None,
        evidence_blobs: vec![],
    };
    let prepare = |a: BrowserAction| Command::ActionPrepare { by: OWNER.into(), action: a };
    let dispatch = |key: &str, attempt: &str| Command::ActionDispatch {
        key: key.into(),
        claim: attempt.into(),
        at_ms: 0,
        deadline_ms: 1_000,
    };
    // A claim that never held the run records nothing.
    assert_eq!(rejected(at(&mut s, 2_100, prepare(act("x-1", "c9", "a0")))).kind, RejectKind::LeaseLost);
    assert!(!s.browser_actions.keys().any(|k| k.ends_with("x-1")));
    let a = act("up-1", "c1", "a1");
    let key = a.key();
    assert_eq!(ok(at(&mut s, 2_100, prepare(a))).as_deref(), Some("new"));
    // A's lease lapses; B claims the run.
    ok(at(&mut s, 7_000, Command::RunsTick));
    assert_eq!(s.runs.runs["run_1"].state, RunState::Queued);
    assert_eq!(claim(&mut s, 7_100, "c2", 5_000).as_deref(), Some("run_1"));
    // A is fenced out of both steps; its prepared record stays prepared, nothing sent.
    assert_eq!(rejected(at(&mut s, 7_200, dispatch(&key, "a1"))).kind, RejectKind::LeaseLost);
    assert_eq!(s.browser_actions[&key].state, ActionState::Prepared);
    assert_eq!(rejected(at(&mut s, 7_200, prepare(act("up-2", "c1", "a2")))).kind, RejectKind::LeaseLost);
    // B, holding the lease, takes the prepared record over and sends it.
    assert_eq!(ok(at(&mut s, 7_300, prepare(act("up-1", "c2", "b1")))).as_deref(), Some("new"));
    assert_eq!(at(&mut s, 7_300, dispatch(&key, "b1")), Response::Ok);
    assert_eq!(s.browser_actions[&key].state, ActionState::Dispatching);
}
