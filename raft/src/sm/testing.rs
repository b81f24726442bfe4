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
