//! The application state machine: what the replicated store holds and how commands change it.
//!
//! A [`Request`] is a versioned envelope around a typed [`Command`]. [`State::apply`] is a pure,
//! deterministic function of the state and the command: every id, secret hash and timestamp is
//! chosen by the proposer and carried in the command, so every replica computes the same result.
//! Rights are re-checked here, at the point of commit, against the state as it is then.

mod access;
mod actions;
mod blobs;
#[cfg(test)]
mod bounds_tests;
mod command;
mod computer_index;
mod delegation;
mod events;
mod exec_index;
mod identity;
mod identity_index;
mod join;
mod lifecycle;
mod link;
mod model;
mod placement;
mod plan;
mod ports;
mod response;
pub(crate) mod retention;
mod run_model;
mod runs;
mod state;
#[cfg(test)]
mod testing;
mod tools;
mod uids;
mod usage;

pub use access::Decided;
pub use access::MAX_GRANTS_PER_COMPUTER;
pub use access::MAX_PROVIDERS;
pub use access::decide;
pub use access::default_rules;
pub use actions::state_name as action_state_name;
pub use command::Command;
pub use command::REQUEST_VERSION;
pub use command::Request;
pub use command::Stamped;
pub use computer_index::ComputerIndex;
pub use computer_index::MAX_LIST as MAX_COMPUTER_LIST;
pub use delegation::MAX_DELEGATIONS;
pub use events::EVENT_LOG_LEN;
pub use events::Event;
pub use exec_index::ExecIndex;
pub use identity::Bot;
pub use identity::MAX_BOTS;
pub use identity::MAX_LIVE_BOTS_PER_MEMBER;
pub use identity::MAX_MEMBERS;
pub use identity::MAX_TOKENS_PER_PRINCIPAL;
pub use identity::Member;
pub use identity::Organization;
pub use identity::Principal;
pub use identity::Role;
pub use identity::Token;
pub use identity::hash_secret;
pub use identity_index::IdentityIndex;
pub use join::JoinState;
pub use join::MAX_JOIN_TOKENS;
pub use lifecycle::Outcome;
pub use lifecycle::Submit;
pub use model::*;
pub use plan::CANCELLED;
pub use plan::PAUSE_RETRY_FIRST_MS;
pub use plan::PAUSE_RETRY_MAX_MS;
pub use plan::PlanEntry;
pub use plan::SYSTEM;
pub use plan::is_idle_pause;
pub use plan::pause_key;
pub use plan::retry_after_ms;
pub use ports::MAX_PORTS;
pub use ports::Resolved as PortResolved;
pub use response::Reject;
pub use response::RejectKind;
pub use response::Response;
pub use retention::DEFAULT_RETENTION_MS;
pub use retention::MAX_RETENTION_MS;
pub use retention::MIN_RETENTION_MS;
pub use retention::Retention;
pub use run_model::*;
pub use state::Caller;
pub use state::State;
pub use tools::BindingIndex;
pub use tools::BindingState;
pub use tools::HeldResult;
pub use tools::MAX_BINDINGS;
pub use tools::MAX_INLINE_RESULT;
pub use tools::MAX_REVOKED;
pub use tools::Operation;
pub use tools::OperationState;
pub use tools::Switch;
pub use tools::SwitchState;
pub use tools::ToolBinding;
pub use tools::operation_key;
pub use uids::MAX_UID_RANGES;
pub use uids::UID_RANGE_BASE;
pub use uids::UID_RANGE_WIDTH;
pub use uids::UidRanges;
pub use usage::SpanEnd;
pub use usage::UsageSpan;
