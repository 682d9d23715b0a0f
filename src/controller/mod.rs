//! The metadata quorum (KRaft's role): a raft-rs group whose log is the
//! cluster metadata.
//!
//! - [`store`]: what the quorum needs from durable storage ([`store::RaftLogStore`]).
//! - [`disk`]: the raft log, hard state and snapshots on disk, checksummed.
//! - [`node`]: the Ready-contract core around `raft::RawNode`; it does no
//!   network I/O and touches disk only through [`store::RaftLogStore`], so
//!   the deterministic simulation (`tests/quorum_sim.rs`) runs the same code.

pub mod disk;
pub mod store;
