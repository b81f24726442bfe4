//! Helpers of the state machine's unit tests.

use super::Reject;
use super::Response;
use super::hash_secret;
use super::identity::Principal;
use super::identity::Token;

/// A live token whose secret is its id.
pub fn token(id: &str, principal: Principal) -> Token {
    Token {
        id: id.into(),
        name: id.into(),
        hash: hash_secret(id),
        principal,
        read_only: false,
        computers: None,
        created_at: 1,
        revoked_at: None,
    }
}

/// The id a command answered (panics on a refusal).
pub fn ok(r: Response) -> Option<String> {
    match r {
        Response::Ok => None,
        Response::Id(id) => Some(id),
        Response::Rejected(r) => panic!("rejected: {r:?}"),
    }
}

/// The refusal a command answered (panics otherwise).
pub fn rejected(r: Response) -> Reject {
    match r {
        Response::Rejected(r) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// The owner's token id in [`world`].
pub const OWNER: &str = "tok_owner";

/// A bootstrapped state: the owner `mem_o` (token [`OWNER`]), the fake provider `cpp_1`, and the
/// owner's bot `bot_1` with the token `tok_bot`.
pub fn world() -> super::State {
    use super::Command;
    use super::identity::Bot;
    use super::identity::Member;
    use super::identity::Organization;
    use super::identity::Role;
    use super::model::Provider;
    use super::model::ProviderKind;
    let mut s = super::State::default();
    let owner = Member { id: "mem_o".into(), name: "o".into(), email: None, role: Role::Owner, created_at: 1 };
    ok(s.apply(&Command::Bootstrap {
        cluster_id: "c".into(),
        org: Organization { id: "org".into(), name: "o".into(), created_at: 1 },
        owner,
        token: token(OWNER, Principal::Member("mem_o".into())),
        join_secret_hash: None,
    }));
    let provider = Provider {
        id: "cpp_1".into(),
        kind: ProviderKind::Fake,
        name: "p".into(),
        config: Default::default(),
        secrets: Default::default(),
        created_by: "mem_o".into(),
        created_at: 1,
    };
    ok(s.apply(&Command::CreateProvider { by: OWNER.into(), provider }));
    let bot = Bot { id: "bot_1".into(), name: "b".into(), member_id: "mem_o".into(), created_at: 1, archived_at: None };
    ok(s.apply(&Command::CreateBot { by: OWNER.into(), bot, parent: None }));
    ok(s.apply(&Command::CreateToken { by: OWNER.into(), token: token("tok_bot", Principal::Bot("bot_1".into())) }));
    s
}

/// A new Computer record of `owner` (starting, no desktop, never pausing by itself).
pub fn computer(id: &str, owner: &str, source: super::model::Source) -> super::model::Computer {
    super::model::Computer {
        id: id.into(),
        name: "c".into(),
        owner: owner.into(),
        shared: false,
        source,
        desktop: false,
        pause_after: None,
        state: super::model::ComputerState::Starting,
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
    }
}
