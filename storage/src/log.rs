//! The partition log: an ordered set of segments with one writer.
//!
//! API CONTRACT (the broker is written against exactly this surface).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::Result;

/// Per-log settings, with Kafka's names in the comments and Kafka's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// `segment.bytes` / `log.segment.bytes`: roll when the active segment would exceed this.
    pub segment_bytes: u64,
    /// `segment.ms` / `log.roll.ms`: roll when the active segment's first batch is this old.
    pub roll_ms: i64,
    /// `retention.ms` / `log.retention.ms`; negative means unlimited.
    pub retention_ms: i64,
    /// `retention.bytes` / `log.retention.bytes`; negative means unlimited.
    pub retention_bytes: i64,
    /// `index.interval.bytes` / `log.index.interval.bytes`: bytes between sparse index entries.
    pub index_interval_bytes: u32,
    /// `segment.index.bytes` / `log.index.size.max.bytes`: preallocated index size; roll when full.
    pub index_max_bytes: u32,
    /// `flush.messages` / `log.flush.interval.messages`: fsync after this many records.
    pub flush_interval_messages: u64,
    /// `flush.ms` / `log.flush.interval.ms`: fsync when the last flush is this old.
    pub flush_interval_ms: i64,
    /// `max.message.bytes` / `message.max.bytes`: largest batch accepted by `append`.
    pub max_batch_bytes: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            roll_ms: 7 * 24 * 3600 * 1000,
            retention_ms: 7 * 24 * 3600 * 1000,
            retention_bytes: -1,
            index_interval_bytes: 4096,
            index_max_bytes: 10 * 1024 * 1024,
            flush_interval_messages: u64::MAX,
            flush_interval_ms: i64::MAX,
            max_batch_bytes: 1_048_588,
        }
    }
}

/// What `append` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    /// Offset assigned to the first record of the first batch.
    pub base_offset: i64,
    /// Offset of the last record of the last batch.
    pub last_offset: i64,
    /// Largest `maxTimestamp` among the appended batches.
    pub max_timestamp: i64,
    /// Log start offset after the append.
    pub log_start_offset: i64,
    pub record_count: i64,
}

/// A byte range of a segment file holding whole batches.
#[derive(Debug, Clone)]
pub struct FileSlice {
    pub file: Arc<File>,
    pub path: Arc<PathBuf>,
    pub position: u64,
    pub len: usize,
}

impl FileSlice {
    /// Appends the slice's bytes to `out` with one positioned read.
    pub fn read_into(&self, out: &mut Vec<u8>) -> Result<()> {
        let _ = out;
        unimplemented!()
    }
}

/// What `read` found: whole batches, in offset order, as file slices.
#[derive(Debug, Clone, Default)]
pub struct ReadInfo {
    pub slices: Vec<FileSlice>,
    /// Total bytes over all slices.
    pub bytes: usize,
}

/// Answer to a timestamp look-up: the batch holding the first record at or
/// after the timestamp (or the batch holding the max timestamp), as bytes, so
/// the caller can find the exact record.
#[derive(Debug, Clone)]
pub struct TimestampLookup {
    pub batch: Vec<u8>,
}

/// One partition's log.
#[derive(Debug)]
pub struct Log {}

impl Log {
    /// Opens (creating if needed) the log in `dir`, recovering from the
    /// recovery point if the last shutdown was not clean.
    pub fn open(dir: impl AsRef<Path>, config: LogConfig, now_ms: i64) -> Result<Log> {
        let _ = (dir, config, now_ms);
        unimplemented!()
    }
    pub fn dir(&self) -> &Path {
        unimplemented!()
    }
    pub fn config(&self) -> &LogConfig {
        unimplemented!()
    }
    /// Applies new settings (from a config change); takes effect on the next append/roll/retention.
    pub fn set_config(&mut self, config: LogConfig) {
        let _ = config;
        unimplemented!()
    }
    pub fn log_start_offset(&self) -> i64 {
        unimplemented!()
    }
    pub fn log_end_offset(&self) -> i64 {
        unimplemented!()
    }
    pub fn recovery_point(&self) -> i64 {
        unimplemented!()
    }
    /// Bytes of all segment files.
    pub fn size_bytes(&self) -> u64 {
        unimplemented!()
    }
    pub fn segment_count(&self) -> usize {
        unimplemented!()
    }
    /// Validates every batch in `batches`, assigns offsets from the log end offset,
    /// stamps `leader_epoch`, and appends the bytes to the active segment (rolling
    /// first when size, time or index limits require). On any error nothing is written.
    pub fn append(&mut self, batches: &mut [u8], leader_epoch: i32, now_ms: i64) -> Result<AppendInfo> {
        let _ = (batches, leader_epoch, now_ms);
        unimplemented!()
    }
    /// Whole batches from the one containing `offset`, excluding batches whose base
    /// offset is `>= max_offset`, up to `max_bytes` (the first batch is returned even
    /// if larger when `min_one`).
    pub fn read(&self, offset: i64, max_bytes: usize, max_offset: i64, min_one: bool) -> Result<ReadInfo> {
        let _ = (offset, max_bytes, max_offset, min_one);
        unimplemented!()
    }
    /// fsyncs everything appended and advances the recovery point.
    pub fn flush(&mut self) -> Result<()> {
        unimplemented!()
    }
    /// Flushes if `flush_interval_ms` has passed since the last flush and there is unflushed data.
    pub fn flush_if_due(&mut self, now_ms: i64) -> Result<bool> {
        let _ = now_ms;
        unimplemented!()
    }
    /// Starts a new active segment at the log end offset (no-op if the active one is empty).
    pub fn roll(&mut self, now_ms: i64) -> Result<()> {
        let _ = now_ms;
        unimplemented!()
    }
    /// Removes every batch at or after `offset` (whole batches only).
    pub fn truncate_to(&mut self, offset: i64) -> Result<()> {
        let _ = offset;
        unimplemented!()
    }
    /// Advances the log start offset to `offset` (which must be <= log end offset)
    /// and deletes segments entirely below it. Returns the new log start offset.
    pub fn delete_records(&mut self, offset: i64) -> Result<i64> {
        let _ = offset;
        unimplemented!()
    }
    /// Deletes whole segments past `retention_ms` or beyond `retention_bytes`.
    /// Returns how many segments were deleted.
    pub fn enforce_retention(&mut self, now_ms: i64) -> Result<usize> {
        let _ = now_ms;
        unimplemented!()
    }
    /// The batch holding the first record with timestamp >= `timestamp`.
    pub fn lookup_timestamp(&self, timestamp: i64) -> Result<Option<TimestampLookup>> {
        let _ = timestamp;
        unimplemented!()
    }
    /// The batch holding the largest timestamp in the log.
    pub fn lookup_max_timestamp(&self) -> Result<Option<TimestampLookup>> {
        unimplemented!()
    }
    /// Flushes, trims indexes and records a clean shutdown.
    pub fn close(self) -> Result<()> {
        unimplemented!()
    }
    /// Removes the log and its directory.
    pub fn delete(self) -> Result<()> {
        unimplemented!()
    }
}
