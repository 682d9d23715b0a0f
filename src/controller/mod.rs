//! The metadata quorum (KRaft's role): a raft-rs group whose log is the
//! cluster metadata.
//!
//! - [`client`]: requests for the active controller from any node, and
//!   the loop that finds the leader.
//! - [`core`]: the active controller's decisions (registrations, heartbeats,
//!   fencing, placement, producer-id blocks) as `step(input) -> effects`.
//! - [`eligible`]: eligible leader replicas (KIP-966): who may lead a
//!   partition whose ISR emptied, as functions of its registration.
//! - [`reassignment`]: partition reassignment steps (start, complete,
//!   cancel) as functions of a partition's registration.
//! - [`store`]: what the quorum needs from durable storage ([`store::RaftLogStore`]).
//! - [`driver`]: [`driver::Controller`], the async driver: one thread owns
//!   node, store and core; peer tasks carry frames over the CONTROLLER listener.
//! - [`feed`]: committed batches for broker-only nodes, which follow the
//!   log by fetching from a voter rather than joining raft.
//! - [`transport`]: controller-to-controller frames and the handshake that
//!   refuses non-voters, a different voters list or another cluster id.
//! - [`disk`]: the raft log, hard state and snapshots on disk, checksummed.
//! - [`describe`]: what DescribeQuorum reports (leader, high watermark,
//!   each voter's progress), answered by the driver from raft's state.
//! - [`node`]: the Ready-contract core around `raft::RawNode`; it does no
//!   network I/O and touches disk only through [`store::RaftLogStore`], so
//!   the deterministic simulation (`tests/quorum_sim.rs`) runs the same code.

pub mod client;
pub mod core;
pub mod describe;
pub mod disk;
pub mod driver;
pub mod eligible;
pub mod feed;
pub mod node;
pub mod reassignment;
pub mod store;
pub mod transport;
