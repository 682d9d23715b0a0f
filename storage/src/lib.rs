//! Strand's storage: a partition log kept as segment files.
//!
//! A [`Log`] is a directory of segments. Each segment is `<base offset>.log`
//! (Kafka v2 record batches, byte for byte as the client sent them, with the
//! base offset and partition leader epoch patched in), plus memory-mapped
//! sparse `.index` (offset → file position) and `.timeindex` (timestamp →
//! offset) files. A per-log checkpoint records the recovery point and the log
//! start offset. Recovery re-reads batches from the recovery point, verifies
//! each CRC-32C, truncates a torn tail and rebuilds the indexes.
//!
//! This crate is synchronous and knows nothing of sockets, tokio or Kafka error
//! codes; the broker maps [`StorageError`] to the wire.
//!
//! Modules: [`batch`] (batch header parsing and validation), `segment`,
//! `index_file` (memory-mapped entries shared by the two indexes),
//! `offset_index`, `time_index`, `txn_index` (aborted transactions),
//! [`producer_state`] (idempotent and transactional producers, snapshots),
//! [`leader_epoch`] (first offset of each leader epoch, for replication),
//! `checkpoint`, `recovery`, [`log`].

pub mod batch;
mod checkpoint;
mod cleaner;
mod error;
mod index_file;
pub mod leader_epoch;
pub mod log;
mod offset_index;
pub mod producer_state;
mod records;
mod recovery;
mod segment;
mod time_index;
mod txn_index;

pub use batch::AppendOrigin;
pub use cleaner::{CleanJob, CleanStats, CleanedSegments};
pub use error::StorageError;
pub use leader_epoch::{EpochEntry, UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET};
pub use log::{AbortedTxn, AppendInfo, FileSlice, FlushPlan, Log, LogConfig, ProducerInfo, ReadInfo, TimestampLookup};
pub use producer_state::ProducerError;
pub use recovery::{find_damage, repair_hint, RepairCut};
pub use segment::ScrubJob;
