//! The actors a node places, and the provider adapters they call.
//!
//! - [`computer`]: `ComputerActor`, one per Computer with work, drives its lifecycle executions.
//! - [`driver`]: hands claimable executions to Computer actors on the leader; settles executions a
//!   lost driver left behind.
//! - [`provider`]: the adapter contract (no retries, no self-resume, precise failure kinds);
//!   [`fake`] is the fault-injecting adapter for tests; [`factory`] builds adapters.

#![warn(missing_docs)]

pub mod computer;
pub mod driver;
pub mod factory;
pub mod fake;
pub mod provider;
