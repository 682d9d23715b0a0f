//! Strand: a Kafka-compatible log broker.
//!
//! Map of the code, following a record:
//! - [`server`]: listeners and connections (framing, ordering, limits, shutdown).
//! - [`api`]: decode a request, route it to its handler (one file per API),
//!   encode the response; the only place that knows Kafka error codes
//!   ([`api::error`]) and advertised versions ([`api::versions`]).
//! - [`replica`]: the partitions this broker leads: log, leader epoch, high
//!   watermark, last stable offset; topic administration.
//! - `strand_storage` (the `storage/` crate): segment files, indexes, recovery.
//! - [`group`]: the group coordinator (membership, rebalances, committed
//!   offsets in `__consumer_offsets`).
//! - [`txn`]: the transaction coordinator (`__transaction_state`, markers,
//!   fencing, timeouts).
//! - [`metadata`]: the persisted topic registry and cluster identity.
//! - [`config`] and [`topic_config`]: `server.properties` and per-topic settings.
//! - [`shard`]: the shard handle and fan-out both coordinators use.
//! - [`verify`]: histories of what clients saw and the anomaly checker
//!   the fault-injection tests and `strand verify` run.
//! - [`broker`]: [`Broker::start`] wires it together and returns a [`BrokerHandle`];
//!   a controller-only node is a [`ControllerNode`] instead.

pub mod alloc_guard;
pub mod api;
pub mod broker;
pub mod cluster;
pub mod config;
pub mod controller;
pub mod controller_node;
pub mod fuzz;
pub mod group;
pub mod listen_fds;
pub mod metadata;
pub mod replica;
pub mod server;
pub mod shard;
pub mod topic_config;
pub mod txn;
pub mod util;
pub mod verify;

pub use broker::{Broker, BrokerHandle, StartError};
pub use config::BrokerConfig;
pub use controller_node::ControllerNode;
