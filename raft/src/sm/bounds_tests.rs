//! The caps on identity records, providers and grants (each refuses the one past it as a
//! `conflict` and changes nothing), the retention of dead tokens by the cluster's clock, and the
//! identity index against a rebuild. Also the caps on pending approvals per member and live
//! Computers per member, and the usage spans kept per Computer (older ones folded into totals).

use super::Command;
use super::Request;
use super::Response;
use super::access::MAX_GRANTS_PER_COMPUTER;
use super::access::MAX_PENDING_APPROVALS_PER_MEMBER;
use super::access::MAX_PROVIDERS;
use super::hash_secret;
use super::identity::Bot;
use super::identity::MAX_MEMBERS;
use super::identity::MAX_TOKENS_PER_PRINCIPAL;
use super::identity::Member;
use super::identity::Principal;
use super::identity::Role;
use super::lifecycle::Submit;
use super::limits::DEFAULT_LIVE_BOTS_PER_MEMBER;
use super::limits::DEFAULT_LIVE_COMPUTERS_PER_MEMBER;
use super::model::ComputerState;
use super::model::Execution;
use super::model::ExecutionKind;
use super::model::Provider;
use super::model::ProviderKind;
use super::model::Source;
use super::response::RejectKind;
use super::retention::COMPACT_PER_ENTRY;
use super::retention::MIN_RETENTION_MS;
use super::state::State;
use super::testing::OWNER;
use super::testing::computer;
use super::testing::ok;
use super::testing::rejected;
use super::testing::token;
use super::testing::world;
use super::usage::FoldedUsage;
use super::usage::MAX_SPANS_PER_COMPUTER;
use super::usage::SpanEnd;

fn member(id: &str, email: Option<&str>) -> Member {
    Member { id: id.into(), name: id.into(), email: email.map(String::from), role: Role::Member, created_at: 1 }
}

fn bot(id: &str, member: &str) -> Bot {
    Bot { id: id.into(), name: id.into(), member_id: member.into(), created_at: 1, archived_at: None }
}

fn provider(id: &str, name: &str) -> Provider {
    Provider {
        id: id.into(),
        kind: ProviderKind::Fake,
        name: name.into(),
        config: Default::default(),
        secrets: Default::default(),
        created_by: "mem_o".into(),
        created_at: 1,
    }
}

fn create_bot(s: &mut State, id: &str, member: &str) -> Response {
    s.apply(&Command::CreateBot { by: OWNER.into(), bot: bot(id, member), parent: None })
}

fn create_token(s: &mut State, id: &str, principal: Principal) -> Response {
    s.apply(&Command::CreateToken { by: OWNER.into(), token: token(id, principal) })
}

fn archive(s: &mut State, bot: &str, at_ms: u64) -> Response {
    s.apply(&Command::ArchiveBot { by: OWNER.into(), bot_id: bot.into(), at_ms })
}

fn put_grant(s: &mut State, computer: &str, bot: &str) -> Response {
    s.apply(&Command::PutGrant {
        by: OWNER.into(),
        computer_id: computer.into(),
        bot_id: bot.into(),
        at_ms: 2,
        allow_root: None,
        desktop_control: None,
        secrets: None,
        paths: None,
    })
}

/// Applies `cmd` as a log entry stamped at cluster ms `at` (so retention runs after it).
fn at(s: &mut State, at: u64, cmd: Command) -> Response {
    s.apply_request(&Request::new(cmd).stamped(at))
}

/// The identity index as a snapshot's loader rebuilds it.
fn rebuilt(s: &State) -> super::IdentityIndex {
    let mut t = s.clone();
    t.reindex_identity();
    t.identity_index
}

/// Applies `cmd`, which must be refused as a `conflict` naming `what`, and changes nothing.
fn refused_full(s: &mut State, cmd: Command, what: &str) {
    let before = s.clone();
    let r = rejected(s.apply(&cmd));
    assert_eq!(r.kind, RejectKind::Conflict, "{r:?}");
    assert!(r.message.contains(what), "{r:?}");
    assert_eq!(*s, before, "a refused create changes nothing");
}

#[test]
fn members_are_capped_and_emails_are_unique_through_the_index() {
    let mut s = world();
    ok(s.apply(&Command::CreateMember { by: OWNER.into(), member: member("mem_a", Some("a@x")) }));
    let twin = Command::CreateMember { by: OWNER.into(), member: member("mem_twin", Some("a@x")) };
    assert_eq!(rejected(s.apply(&twin)).kind, RejectKind::Conflict);
    for i in s.members.len()..MAX_MEMBERS {
        let email = format!("m{i}@x");
        ok(s.apply(&Command::CreateMember { by: OWNER.into(), member: member(&format!("mem_{i}"), Some(&email)) }));
    }
    assert_eq!(s.members.len(), MAX_MEMBERS);
    let one_more = Command::CreateMember { by: OWNER.into(), member: member("mem_last", None) };
    refused_full(&mut s, one_more, "members");
    // A replay of a create that applied is still a no-op at the cap.
    assert_eq!(
        s.apply(&Command::CreateMember { by: OWNER.into(), member: member("mem_a", Some("a@x")) }),
        Response::Ok
    );
    assert_eq!(s.identity_index, rebuilt(&s));
}

#[test]
fn live_bots_per_member_are_capped_and_archiving_one_frees_a_place() {
    let mut s = world(); // bot_1 of mem_o is live
    for i in s.live_bot_count("mem_o")..(DEFAULT_LIVE_BOTS_PER_MEMBER as usize) {
        ok(create_bot(&mut s, &format!("bot_n{i}"), "mem_o"));
    }
    assert_eq!(s.live_bot_count("mem_o"), (DEFAULT_LIVE_BOTS_PER_MEMBER as usize));
    let one_more = Command::CreateBot { by: OWNER.into(), bot: bot("bot_last", "mem_o"), parent: None };
    refused_full(&mut s, one_more.clone(), "live bots");
    // Another member's bots are counted apart.
    ok(s.apply(&Command::CreateMember { by: OWNER.into(), member: member("mem_b", None) }));
    ok(create_bot(&mut s, "bot_of_b", "mem_b"));
    ok(archive(&mut s, "bot_n5", 9));
    assert_eq!(s.apply(&one_more), Response::Ok, "an archived bot frees a place");
    assert_eq!(s.identity_index, rebuilt(&s));
}

#[test]
fn bots_in_all_are_capped_archived_ones_included() {
    let mut s = world(); // bot_1
    s.limits.bots = Some(3);
    assert!(s.create_bot(OWNER, &bot("bot_2", "mem_o"), None).is_ok());
    assert!(s.create_bot(OWNER, &bot("bot_3", "mem_o"), None).is_ok());
    ok(archive(&mut s, "bot_2", 5));
    let before = s.clone();
    let r = s.create_bot(OWNER, &bot("bot_4", "mem_o"), None).expect_err("full");
    assert_eq!(r.kind, RejectKind::Conflict);
    assert!(r.message.contains("archived ones included"), "{r:?}");
    assert_eq!(s, before, "a refused create changes nothing");
    assert!(s.create_bot(OWNER, &bot("bot_3", "mem_o"), None).is_ok(), "a replay at the cap");
}

#[test]
fn live_tokens_per_principal_are_capped_and_revoking_one_frees_a_place() {
    let mut s = world(); // tok_owner of mem_o, tok_bot of bot_1
    let me = Principal::Member("mem_o".into());
    for i in s.live_token_count(&me)..MAX_TOKENS_PER_PRINCIPAL {
        ok(create_token(&mut s, &format!("tok_n{i}"), me.clone()));
    }
    assert_eq!(s.live_token_count(&me), MAX_TOKENS_PER_PRINCIPAL);
    let one_more = Command::CreateToken { by: OWNER.into(), token: token("tok_last", me.clone()) };
    refused_full(&mut s, one_more.clone(), "live tokens");
    // The bot's tokens are counted apart.
    ok(create_token(&mut s, "tok_bot_2", Principal::Bot("bot_1".into())));
    ok(s.apply(&Command::RevokeToken { by: OWNER.into(), token_id: "tok_n7".into(), at_ms: 9 }));
    assert_eq!(s.apply(&one_more), Response::Ok, "a revoked token frees a place");
    assert_eq!(s.identity_index, rebuilt(&s));
}

#[test]
fn providers_are_capped_and_names_are_unique_through_the_index() {
    let mut s = world(); // cpp_1 named "p"
    let same_name = Command::CreateProvider { by: OWNER.into(), provider: provider("cpp_twin", "p") };
    assert_eq!(rejected(s.apply(&same_name)).kind, RejectKind::Conflict);
    for i in s.providers.len()..MAX_PROVIDERS {
        ok(s.apply(&Command::CreateProvider {
            by: OWNER.into(),
            provider: provider(&format!("cpp_n{i}"), &format!("p{i}")),
        }));
    }
    assert_eq!(s.providers.len(), MAX_PROVIDERS);
    let one_more = Command::CreateProvider { by: OWNER.into(), provider: provider("cpp_last", "last") };
    refused_full(&mut s, one_more, "providers");
    assert_eq!(s.identity_index, rebuilt(&s));
}

#[test]
fn grants_per_computer_are_capped_on_every_path_that_grants() {
    let mut s = world();
    let mut c = computer("cmp_1", "mem_o", Source::Paired);
    c.shared = true;
    s.computers.insert("cmp_1".into(), c);
    s.reindex_computers();
    // bot_y of another member asks while there is room: an approval waits.
    ok(s.apply(&Command::CreateMember { by: OWNER.into(), member: member("mem_b", None) }));
    for b in ["bot_x", "bot_y"] {
        ok(create_bot(&mut s, b, "mem_b"));
        ok(create_token(&mut s, &format!("tok_{b}"), Principal::Bot(b.into())));
    }
    let acquire = |bot: &str| Command::Acquire {
        by: format!("tok_{bot}"),
        computer_id: "cmp_1".into(),
        approval_id: format!("apr_{bot}"),
        reason: None,
        at_ms: 3,
    };
    assert_eq!(ok(s.apply(&acquire("bot_y"))), Some("apr_bot_y".into()));
    // Fill the Computer with mem_o's bots.
    for i in s.live_bot_count("mem_o")..(DEFAULT_LIVE_BOTS_PER_MEMBER as usize) {
        ok(create_bot(&mut s, &format!("bot_n{i}"), "mem_o"));
    }
    let mine: Vec<String> = s.bots.values().filter(|b| b.member_id == "mem_o").map(|b| b.id.clone()).collect();
    for b in mine.iter().take(MAX_GRANTS_PER_COMPUTER) {
        ok(put_grant(&mut s, "cmp_1", b));
    }
    assert_eq!(s.grants["cmp_1"].len(), MAX_GRANTS_PER_COMPUTER);
    // A member's grant, a bot's acquire, and an approval's decision are all refused.
    let put = Command::PutGrant {
        by: OWNER.into(),
        computer_id: "cmp_1".into(),
        bot_id: "bot_x".into(),
        at_ms: 4,
        allow_root: None,
        desktop_control: None,
        secrets: None,
        paths: None,
    };
    refused_full(&mut s, put, "hold a grant");
    refused_full(&mut s, acquire("bot_x"), "hold a grant");
    let approve =
        Command::DecideApproval { by: OWNER.into(), approval_id: "apr_bot_y".into(), approve: true, at_ms: 5 };
    refused_full(&mut s, approve.clone(), "hold a grant");
    assert_eq!(s.approvals["apr_bot_y"].state, "pending");
    // A bot that holds one may have it again (its rights change); removing one frees a place.
    assert_eq!(put_grant(&mut s, "cmp_1", "bot_1"), Response::Ok);
    ok(s.apply(&Command::DeleteGrant { by: OWNER.into(), computer_id: "cmp_1".into(), bot_id: "bot_1".into() }));
    assert_eq!(s.apply(&approve), Response::Ok);
    assert!(s.has_grant("cmp_1", "bot_y"));
}

#[test]
fn dead_tokens_go_after_the_retention_by_the_cluster_clock_and_not_before() {
    let mut s = world();
    let hour = MIN_RETENTION_MS;
    ok(at(&mut s, 1_000, Command::SetRetention { by: OWNER.into(), ms: hour }));
    // More dead tokens than one entry compacts: revoked at 2_000, and a bot's archived at 3_000.
    let me = Principal::Member("mem_o".into());
    let revoked: Vec<String> = (0..COMPACT_PER_ENTRY + 4).map(|i| format!("tok_r{i}")).collect();
    for id in &revoked {
        ok(at(&mut s, 1_500, Command::CreateToken { by: OWNER.into(), token: token(id, me.clone()) }));
        ok(at(&mut s, 2_000, Command::RevokeToken { by: OWNER.into(), token_id: id.clone(), at_ms: 2_000 }));
    }
    ok(at(
        &mut s,
        2_500,
        Command::CreateToken { by: OWNER.into(), token: token("tok_b2", Principal::Bot("bot_1".into())) },
    ));
    ok(at(&mut s, 3_000, Command::ArchiveBot { by: OWNER.into(), bot_id: "bot_1".into(), at_ms: 3_000 }));
    let kept = |s: &State, id: &str| s.tokens.contains_key(id) && s.token_by_hash.contains_key(&hash_secret(id));
    let gone = |s: &State, id: &str| !s.tokens.contains_key(id) && !s.token_by_hash.contains_key(&hash_secret(id));

    // One ms short of the retention: everything stays (and is refused as before).
    ok(at(&mut s, 2_000 + hour - 1, Command::RunsTick));
    assert!(revoked.iter().all(|id| kept(&s, id)));
    assert_eq!(s.caller_by_hash(&hash_secret("tok_r0")).map_err(|r| r.kind).err(), Some(RejectKind::Unauthorized));
    // At the retention: the oldest 16, then the rest at the next entry.
    ok(at(&mut s, 2_000 + hour, Command::RunsTick));
    assert_eq!(revoked.iter().filter(|id| gone(&s, id)).count(), COMPACT_PER_ENTRY);
    ok(at(&mut s, 2_000 + hour, Command::RunsTick));
    assert!(revoked.iter().all(|id| gone(&s, id)));
    assert!(kept(&s, "tok_bot") && kept(&s, "tok_b2"), "the archived bot's tokens count from its archiving");
    assert_eq!(s.caller_by_hash(&hash_secret("tok_r0")).map_err(|r| r.kind).err(), Some(RejectKind::Unauthorized));
    ok(at(&mut s, 3_000 + hour, Command::RunsTick));
    assert!(gone(&s, "tok_bot") && gone(&s, "tok_b2"));
    assert!(kept(&s, OWNER), "a live token stays");
    assert!(s.bots.contains_key("bot_1"), "an archived bot stays");
    assert_eq!(s.identity_index, rebuilt(&s));
    assert!(s.identity_index.dead_tokens.is_empty());
}

#[test]
fn the_identity_index_follows_every_change_and_equals_a_rebuild() {
    let mut s = world();
    let check = |s: &State, step: &str| assert_eq!(s.identity_index, rebuilt(s), "after {step}");
    check(&s, "bootstrap, a provider, a bot and its token");
    ok(s.apply(&Command::CreateMember { by: OWNER.into(), member: member("mem_a", Some("a@x")) }));
    check(&s, "a member");
    ok(s.apply(&Command::CreateBot { by: OWNER.into(), bot: bot("bot_c", "mem_o"), parent: Some("bot_1".into()) }));
    check(&s, "a bot with a parent");
    let orphan = Command::CreateBot { by: OWNER.into(), bot: bot("bot_o", "mem_o"), parent: Some("bot_nope".into()) };
    assert_eq!(rejected(s.apply(&orphan)).kind, RejectKind::NotFound);
    check(&s, "a bot refused after its insert");
    ok(create_token(&mut s, "tok_c", Principal::Bot("bot_c".into())));
    ok(create_token(&mut s, "tok_c2", Principal::Bot("bot_c".into())));
    ok(create_token(&mut s, "tok_a", Principal::Member("mem_a".into())));
    check(&s, "tokens");
    ok(s.apply(&Command::RevokeToken { by: OWNER.into(), token_id: "tok_c2".into(), at_ms: 4 }));
    check(&s, "a revocation");
    ok(archive(&mut s, "bot_c", 5));
    ok(archive(&mut s, "bot_c", 6));
    check(&s, "an archiving, twice");
    ok(s.apply(&Command::RevokeToken { by: OWNER.into(), token_id: "tok_c".into(), at_ms: 7 }));
    check(&s, "a revocation of an archived bot's token");
    ok(s.apply(&Command::CreateProvider { by: OWNER.into(), provider: provider("cpp_2", "second") }));
    check(&s, "a provider");
    s.compact_token(7, "tok_c");
    s.compact_token(4, "tok_c2");
    check(&s, "compactions");
    assert!(!s.identity_index.live_tokens.contains_key(&Principal::Bot("bot_c".into())));
    // A snapshot does not carry the index; its loader rebuilds the same one.
    let json = serde_json::to_value(&s).expect("serialize");
    assert!(json.get("identity_index").is_none());
    let mut back: State = serde_json::from_value(json).expect("deserialize");
    back.reindex_executions();
    back.reindex_computers();
    assert_eq!(back, s);
}

/// A create of provider Computer `computer` owned by `owner`, submitted with token `by`.
fn create(by: &str, owner: &str, computer: &str) -> Command {
    let exe = Execution::pending(
        &format!("exe_{computer}"),
        &format!("k_{computer}"),
        "b",
        ExecutionKind::Create,
        computer,
        1,
    );
    let c = super::testing::computer(computer, owner, Source::Provider { provider: "cpp_1".into(), template: None });
    Command::SubmitExecution(Box::new(Submit {
        by: by.into(),
        execution: exe,
        computer: Some(c),
        approval_id: format!("apr_{computer}"),
        reason: None,
        at_ms: 10,
    }))
}

/// The execution index (pending approvals per member included) as a snapshot's loader
/// rebuilds it.
fn rebuilt_exec(s: &State) -> super::ExecIndex {
    let mut t = s.clone();
    t.reindex_executions();
    t.exec_index
}

#[test]
fn pending_approvals_per_member_are_capped_on_the_paths_that_ask_and_deciding_one_frees_a_place() {
    let mut s = world();
    let mut c = computer("cmp_1", "mem_o", Source::Paired);
    c.shared = true;
    s.computers.insert("cmp_1".into(), c);
    let mut sandbox = computer("cmp_2", "mem_o", Source::Provider { provider: "cpp_1".into(), template: None });
    sandbox.shared = true;
    s.computers.insert("cmp_2".into(), sandbox);
    s.reindex_computers();
    ok(s.apply(&Command::CreateMember { by: OWNER.into(), member: member("mem_b", None) }));
    ok(create_bot(&mut s, "bot_y", "mem_b"));
    ok(create_token(&mut s, "tok_bot_y", Principal::Bot("bot_y".into())));
    ok(put_grant(&mut s, "cmp_2", "bot_y"));
    let acquire = |bot_token: &str, n: usize| Command::Acquire {
        by: bot_token.into(),
        computer_id: "cmp_1".into(),
        approval_id: format!("apr_{bot_token}_{n}"),
        reason: None,
        at_ms: 3,
    };
    for i in 0..MAX_PENDING_APPROVALS_PER_MEMBER {
        assert!(ok(s.apply(&acquire("tok_bot_y", i))).is_some(), "an approval waits");
    }
    assert_eq!(s.pending_approval_count("mem_b"), MAX_PENDING_APPROVALS_PER_MEMBER);
    // An acquire and a create that would wait on one more are refused, and change nothing.
    refused_full(&mut s, acquire("tok_bot_y", MAX_PENDING_APPROVALS_PER_MEMBER), "pending approvals");
    refused_full(&mut s, create("tok_bot_y", "mem_b", "cmp_b"), "pending approvals");
    let expose = Command::ExposePort {
        by: "tok_bot_y".into(),
        computer_id: "cmp_2".into(),
        port: 8000,
        protocol: "http".into(),
        label_hash: "a".repeat(64),
        approval_id: "apr_expose".into(),
        at_ms: 4,
    };
    refused_full(&mut s, expose, "pending approvals");
    // Another member's requests are counted apart.
    assert!(ok(s.apply(&acquire("tok_bot", 0))).is_some());
    assert_eq!(s.pending_approval_count("mem_o"), 1);
    // A decided approval frees a place.
    let reject =
        Command::DecideApproval { by: OWNER.into(), approval_id: "apr_tok_bot_y_0".into(), approve: false, at_ms: 5 };
    ok(s.apply(&reject));
    assert_eq!(s.pending_approval_count("mem_b"), MAX_PENDING_APPROVALS_PER_MEMBER - 1);
    assert_eq!(ok(s.apply(&create("tok_bot_y", "mem_b", "cmp_b"))), Some("exe_cmp_b".into()));
    assert_eq!(s.approvals["apr_cmp_b"].state, "pending");
    assert_eq!(s.pending_approval_count("mem_b"), MAX_PENDING_APPROVALS_PER_MEMBER);
    assert_eq!(s.exec_index, rebuilt_exec(&s));
}

#[test]
fn live_computers_per_member_are_capped_and_a_deleted_one_frees_a_place() {
    let mut s = world();
    for i in 0..(DEFAULT_LIVE_COMPUTERS_PER_MEMBER as usize) {
        let id = format!("cmp_{i:05}");
        s.computers.insert(id.clone(), computer(&id, "mem_o", Source::Paired));
    }
    s.reindex_computers();
    assert_eq!(s.live_computer_count("mem_o"), (DEFAULT_LIVE_COMPUTERS_PER_MEMBER as usize));
    refused_full(&mut s, create(OWNER, "mem_o", "cmp_last"), "computers that are not deleted");
    // Another member's Computers are counted apart.
    ok(s.apply(&Command::CreateMember { by: OWNER.into(), member: member("mem_b", None) }));
    ok(create_token(&mut s, "tok_b", Principal::Member("mem_b".into())));
    assert!(ok(s.apply(&create("tok_b", "mem_b", "cmp_of_b"))).is_some());
    assert_eq!(s.live_computer_count("mem_b"), 1);
    // A deleted one's tombstone does not count.
    s.set_computer_state("cmp_00007", ComputerState::Deleted, 20);
    assert!(s.computers.contains_key("cmp_00007"));
    assert_eq!(s.live_computer_count("mem_o"), (DEFAULT_LIVE_COMPUTERS_PER_MEMBER as usize) - 1);
    assert_eq!(ok(s.apply(&create(OWNER, "mem_o", "cmp_last"))), Some("exe_cmp_last".into()));
    assert_eq!(s.live_computer_count("mem_o"), (DEFAULT_LIVE_COMPUTERS_PER_MEMBER as usize));
    let mut t = s.clone();
    t.reindex_computers();
    assert_eq!(s.computer_index, t.computer_index);
    // Forgetting a tombstone leaves the count alone; forgetting a live one lowers it.
    s.remove_computer("cmp_00007");
    assert_eq!(s.live_computer_count("mem_o"), (DEFAULT_LIVE_COMPUTERS_PER_MEMBER as usize));
    s.remove_computer("cmp_of_b");
    assert_eq!(s.live_computer_count("mem_b"), 0);
    assert!(!s.computer_index.live_by_owner.contains_key("mem_b"));
}

#[test]
fn usage_keeps_the_newest_spans_and_folds_the_rest_into_exact_totals() {
    let mut s = world();
    let id = "cmp_u";
    let runs = 2 * MAX_SPANS_PER_COMPUTER + 500;
    let mut recorded_ms = 0;
    for i in 0..runs as u64 {
        let start = i * 100;
        let len = 1 + i % 7;
        s.open_span(id, start, false);
        s.close_span(id, start + len, SpanEnd::Pause);
        recorded_ms += len;
    }
    s.open_span(id, runs as u64 * 100, false); // an open one, the newest
    let kept = &s.usage[id];
    assert_eq!(kept.len(), MAX_SPANS_PER_COMPUTER);
    assert!(kept.back().is_some_and(|sp| sp.end.is_none()), "the open span is kept");
    let first_kept = (runs + 1 - MAX_SPANS_PER_COMPUTER) as u64;
    assert_eq!(kept.front().map(|sp| sp.start), Some(first_kept * 100), "the newest are kept");
    let folded = s.folded_usage(id);
    assert_eq!(folded.spans, first_kept);
    let kept_ms: u64 = kept.iter().filter_map(|sp| sp.end.map(|e| e - sp.start)).sum();
    assert_eq!(folded.ms + kept_ms, recorded_ms, "folded plus kept is what was recorded");
    assert_eq!(folded.spans as usize + kept.len(), runs + 1);
    // A snapshot keeps it; one written before the fold loads with nothing folded.
    let json = serde_json::to_value(&s).expect("serialize");
    let mut back: State = serde_json::from_value(json.clone()).expect("deserialize");
    back.reindex_executions();
    back.reindex_computers();
    assert_eq!(back, s);
    let mut old = json;
    if let Some(o) = old.as_object_mut() {
        o.remove("usage_folded");
    }
    let old: State = serde_json::from_value(old).expect("an old snapshot loads");
    assert_eq!(old.folded_usage(id), FoldedUsage::default());
    // The record goes whole when the tombstone goes.
    s.remove_usage(id);
    assert!(!s.usage.contains_key(id) && !s.usage_folded.contains_key(id));
}
