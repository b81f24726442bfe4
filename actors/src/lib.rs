//! The actors a node places, and the provider adapters they call.
//!
//! - [`computer`]: `ComputerActor`, one per Computer with work, drives its lifecycle executions.
//! - [`link`]: the lifecycle of each agent link held by this node (in the link's own task, not an
//!   actor: an idle link must cost little memory), and the link registry.
//! - [`session`]: `SessionActor`, one per command session, running its calls in order.
//! - [`idle`]: the node side of idle pause: work seen, reported in batches; the leader's scheduler.
//! - [`sandbox_watch`]: the leader's check that running and paused sandboxes still exist.
//! - [`driver`]: on every node, hands the claimable executions of the Computers placed on it to
//!   their Computer actors; settles calls whose sender is gone.
//! - [`liveness`]: the leader's record of the live nodes, over which the store places Computers.
//! - [`provider`]: the adapter contract (no retries, no self-resume, precise failure kinds);
//!   [`docker`] drives the local Docker engine; [`fake`] is the fault-injecting adapter for tests;
//!   [`factory`] builds adapters.

#![warn(missing_docs)]

pub mod computer;
pub mod daytona;
pub mod docker;
pub mod driver;
pub mod e2b;
pub mod egress;
pub mod egress_watch;
pub mod factory;
pub mod fake;
pub mod http_call;
pub mod idle;
pub mod keep_alive;
pub mod link;
pub mod liveness;
pub mod pool_keeper;
pub mod provider;
pub mod sandbox_watch;
pub mod session;

/// Now, in unix ms (times in commands are chosen by the proposer, never in apply).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Waits `every`; answers false once `stop` turns true instead (for periodic background tasks).
pub async fn tick(every: std::time::Duration, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(every) => true,
        _ = stop.wait_for(|s| *s) => false,
    }
}
