//! The actors a node places: one per Computer, command session, MCP binding and agent link.
//!
//! Nothing lives here yet: the foundation has no per-resource actors. The Computers API brings
//! `ComputerActor` (ractor), one file per actor, each with its messages, state and pure decision
//! functions (see `STYLE.md`).

#![warn(missing_docs)]
