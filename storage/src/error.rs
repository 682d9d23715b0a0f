use std::path::PathBuf;

use crate::batch::BatchError;

/// Everything that can go wrong in the storage crate.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("I/O error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A batch handed to `append` is invalid; nothing was written.
    #[error("invalid batch: {0}")]
    InvalidBatch(#[from] BatchError),
    /// The appended batches are larger than the configured maximum.
    #[error("batch of {size} bytes exceeds the maximum of {max} bytes")]
    BatchTooLarge { size: usize, max: usize },
    /// Requested offset is outside [log start offset, log end offset].
    #[error("offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange { offset: i64, log_start_offset: i64, log_end_offset: i64 },
    /// Data that was already flushed (behind the recovery point) is corrupt:
    /// start-up must stop rather than silently drop it.
    #[error("corrupt data behind the recovery point {recovery_point} in {file} at byte {position}: {reason}")]
    CorruptBehindRecoveryPoint { file: PathBuf, position: u64, recovery_point: i64, reason: String },
    /// A batch that is not part of a torn tail is damaged: a bad CRC, a
    /// header that cannot be parsed, or offsets out of order or past where
    /// the segment ends. Found at start-up in a segment that is not the last
    /// one, by a fetch reading data not yet verified, or by the scrubber.
    /// Nothing is cut automatically; `strand --repair` truncates on purpose.
    #[error("damaged batch in {file} at byte {position}: {reason}")]
    DamagedSegment { file: PathBuf, position: u64, reason: String },
    /// The producer state refused a batch (idempotence or transactions); nothing was written.
    #[error("{0}")]
    Producer(#[from] crate::producer_state::ProducerError),
    /// A replicated append (`append_replicated`) starts below the log end
    /// offset: the follower must truncate first. Nothing was written.
    #[error("replicated batch at offset {base_offset} starts below the log end offset {log_end_offset}")]
    NonMonotonicReplicaOffset { base_offset: i64, log_end_offset: i64 },
    /// A replicated append's batches are not in increasing offset order (a
    /// batch starts at or before the previous one's last offset). Nothing was written.
    #[error(
        "replicated batch at byte {position} starts at offset {base_offset}, not after offset {previous_last_offset}"
    )]
    ReplicaOffsetsOutOfOrder { position: usize, base_offset: i64, previous_last_offset: i64 },
    /// A replicated batch carries a leader epoch below an earlier batch's or
    /// the log's latest epoch. Nothing was written.
    #[error(
        "replicated batch at offset {base_offset} has leader epoch {epoch}, below the latest epoch {latest_epoch}"
    )]
    LeaderEpochRegression { base_offset: i64, epoch: i32, latest_epoch: i32 },
    /// A checkpoint or index file could not be understood.
    #[error("corrupt file {file}: {reason}")]
    CorruptFile { file: PathBuf, reason: String },
}

impl StorageError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io { path: path.into(), source }
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;
