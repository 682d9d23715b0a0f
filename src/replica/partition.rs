//! One partition this broker leads: its log, leader epoch, high watermark and
//! last stable offset.
//!
//! A single node is the replication-factor-1 case of the replicated design:
//! the ISR is this broker alone, so the high watermark moves to the log end
//! offset as soon as an append is written. The last stable offset equals the
//! high watermark until transactions exist.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};

use strand_storage::{
    AbortedTxn, AppendInfo, AppendOrigin, CleanStats, Log, LogConfig, ProducerInfo, ReadInfo, StorageError,
    TimestampLookup,
};
use tokio::sync::watch;

/// A partition that has been deleted (or the broker is shutting down).
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("partition is no longer hosted here")]
    Gone,
    /// Damage was found in its log (by a read or the scrubber): it serves
    /// nothing until an operator repairs it.
    #[error("partition is offline: {0}")]
    Offline(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Offsets a fetch or list-offsets response reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub log_start_offset: i64,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_end_offset: i64,
}

#[derive(Debug)]
pub struct Partition {
    pub topic: String,
    pub index: i32,
    /// Leader epoch: 0 for the single node; bumps on leadership change in a cluster.
    pub leader_epoch: i32,
    min_insync_replicas: AtomicI32,
    /// `cleanup.policy` includes compact: records must have keys.
    compacted: AtomicBool,
    /// `None` once the partition is deleted or closed.
    log: Mutex<Option<Log>>,
    /// Publishes the high watermark so long-polling fetches wake on appends.
    high_watermark: watch::Sender<i64>,
    /// Why the partition was taken offline, once damage is found.
    offline: std::sync::OnceLock<String>,
}

impl Partition {
    pub fn new(topic: &str, index: i32, log: Log, min_insync_replicas: i32) -> Partition {
        let hw = log.log_end_offset();
        let compacted = AtomicBool::new(log.config().cleanup_compact);
        Partition {
            compacted,
            topic: topic.to_string(),
            index,
            leader_epoch: 0,
            min_insync_replicas: AtomicI32::new(min_insync_replicas),
            log: Mutex::new(Some(log)),
            high_watermark: watch::Sender::new(hw),
            offline: std::sync::OnceLock::new(),
        }
    }

    /// Locks the log. A panic elsewhere while holding the lock leaves the log
    /// consistent (every storage call is all-or-nothing), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Option<Log>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_log<T>(&self, f: impl FnOnce(&mut Log) -> Result<T, StorageError>) -> Result<T, PartitionError> {
        let mut guard = self.lock();
        let log = guard.as_mut().ok_or(PartitionError::Gone)?;
        if let Some(reason) = self.offline.get() {
            return Err(PartitionError::Offline(reason.clone()));
        }
        match f(log) {
            Err(e @ StorageError::DamagedSegment { .. }) => Err(self.take_offline(&e, log.dir())),
            other => Ok(other?),
        }
    }

    /// Takes the partition offline for damage `e`: logged once, loudly, with
    /// the repair command; every later request gets KAFKA_STORAGE_ERROR.
    fn take_offline(&self, e: &StorageError, dir: &std::path::Path) -> PartitionError {
        let reason = e.to_string();
        if self.offline.set(reason.clone()).is_ok() {
            tracing::error!(
                topic = %self.topic,
                partition = self.index,
                error = %e,
                repair = %strand_storage::repair_hint(dir),
                "damaged log: partition taken offline"
            );
        }
        PartitionError::Offline(reason)
    }

    /// Why the partition is offline, if it is.
    pub fn offline_reason(&self) -> Option<&str> {
        self.offline.get().map(String::as_str)
    }

    pub fn min_insync_replicas(&self) -> i32 {
        self.min_insync_replicas.load(Ordering::Relaxed)
    }

    /// In-sync replicas: this broker alone.
    pub fn isr_size(&self) -> i32 {
        1
    }

    /// Appends client batches (validated, offsets assigned, bytes written as
    /// received) and advances the high watermark.
    /// Appends whole batches as given (the log stamps offsets into its copy
    /// of each header; `batches` itself, often a request buffer, is not changed).
    pub fn append(&self, batches: &[u8], origin: AppendOrigin, now_ms: i64) -> Result<AppendInfo, PartitionError> {
        self.with_log(|log| {
            let info = log.append_shared(batches, self.leader_epoch, origin, now_ms)?;
            // RF=1: the write is replicated to the whole ISR once it is in the
            // log. Published under the log lock, so two appends cannot publish
            // out of order; a retried batch (a duplicate) wrote nothing and
            // does not move the high watermark.
            if !info.duplicate {
                self.advance_high_watermark(log.log_end_offset());
            }
            Ok(info)
        })
    }

    /// Raises the high watermark to `hw`. It never moves backwards: a
    /// consumer that has seen an offset below it must keep seeing it.
    fn advance_high_watermark(&self, hw: i64) {
        self.high_watermark.send_if_modified(|current| {
            assert!(
                hw >= *current,
                "{}-{}: high watermark would move back from {current} to {hw}",
                self.topic,
                self.index
            );
            let moved = hw > *current;
            *current = hw;
            moved
        });
    }

    pub fn high_watermark(&self) -> i64 {
        *self.high_watermark.borrow()
    }

    pub fn offsets(&self) -> Result<PartitionOffsets, PartitionError> {
        self.with_log(|log| Ok(Self::offsets_of(log, *self.high_watermark.borrow())))
    }

    fn offsets_of(log: &Log, hw: i64) -> PartitionOffsets {
        PartitionOffsets {
            log_start_offset: log.log_start_offset(),
            high_watermark: hw,
            last_stable_offset: log.last_stable_offset(hw),
            log_end_offset: log.log_end_offset(),
        }
    }

    /// Reads whole batches from `offset`, bounded by the high watermark
    /// (read_uncommitted) or the last stable offset (read_committed, with the
    /// aborted transactions that overlap the range, for the client to skip).
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        read_committed: bool,
        min_one: bool,
    ) -> Result<(ReadInfo, PartitionOffsets, Vec<AbortedTxn>), PartitionError> {
        self.with_log(|log| {
            let offsets = Self::offsets_of(log, *self.high_watermark.borrow());
            let bound = if read_committed { offsets.last_stable_offset } else { offsets.high_watermark };
            let info = log.read(offset, max_bytes, bound, min_one)?;
            let aborted =
                if read_committed && info.bytes > 0 { log.aborted_transactions(offset, bound) } else { Vec::new() };
            Ok((info, offsets, aborted))
        })
    }

    /// Producers with state on this partition (DescribeProducers).
    pub fn producers(&self) -> Result<Vec<ProducerInfo>, PartitionError> {
        self.with_log(|log| Ok(log.producers()))
    }

    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.high_watermark.subscribe()
    }

    pub fn lookup_timestamp(&self, ts: i64) -> Result<Option<TimestampLookup>, PartitionError> {
        self.with_log(|log| log.lookup_timestamp(ts))
    }

    pub fn lookup_max_timestamp(&self) -> Result<Option<TimestampLookup>, PartitionError> {
        self.with_log(|log| log.lookup_max_timestamp())
    }

    /// Advances the log start offset (DeleteRecords). Returns the new low watermark.
    pub fn delete_records(&self, offset: i64) -> Result<i64, PartitionError> {
        self.with_log(|log| log.delete_records(offset))
    }

    pub fn is_compacted(&self) -> bool {
        self.compacted.load(Ordering::Relaxed)
    }

    /// One compaction pass if the log is compacted and dirty enough (or `force`).
    /// The expensive part (reading, building the key map, writing cleaned
    /// segments) runs without the log lock: sealed segments never change, and
    /// the install step checks that the segments it replaces are still there.
    pub fn clean(&self, now_ms: i64, force: bool) -> Result<Option<CleanStats>, PartitionError> {
        let Some(job) = self.with_log(|log| Ok(log.prepare_clean(now_ms, force)))? else { return Ok(None) };
        let cleaned = job.run()?;
        let stats = self.with_log(|log| log.install_clean(cleaned))?;
        Ok(Some(stats))
    }

    pub fn set_config(&self, log_config: LogConfig, min_insync_replicas: i32) -> Result<(), PartitionError> {
        self.min_insync_replicas.store(min_insync_replicas, Ordering::Relaxed);
        self.compacted.store(log_config.cleanup_compact, Ordering::Relaxed);
        self.with_log(|log| {
            log.set_config(log_config);
            Ok(())
        })
    }

    /// Verifies the next cold segment that is due (see `Log::scrub_next`),
    /// reading without the log's lock; `pace` is called after each batch
    /// with its size (to bound the read rate; returning false abandons the
    /// job). Returns the bytes verified, 0 when nothing was due. Damage takes
    /// the partition offline.
    pub fn scrub(
        &self,
        now_ms: i64,
        interval_ms: i64,
        pace: &mut dyn FnMut(u64) -> bool,
    ) -> Result<u64, PartitionError> {
        let Some((base, job)) = self.with_log(|log| Ok(log.scrub_next(now_ms, interval_ms)))? else { return Ok(0) };
        match job.run(pace) {
            Ok(true) => {
                // A segment replaced meanwhile counts as nothing done, so the
                // caller moves on instead of picking the same job again.
                if !self.with_log(|log| Ok(log.finish_scrub(base, &job, now_ms)))? {
                    return Ok(0);
                }
                tracing::debug!(topic = %self.topic, partition = self.index, segment = %job.path().display(), bytes = job.bytes(), "scrubbed segment");
                Ok(job.bytes())
            }
            Ok(false) => Ok(0),
            Err(e @ StorageError::DamagedSegment { .. }) => {
                // A segment deleted or replaced meanwhile (retention, compaction) is no damage.
                let mut guard = self.lock();
                let Some(log) = guard.as_mut() else { return Err(PartitionError::Gone) };
                if log.scrub_next(now_ms, interval_ms).map(|(b, _)| b) == Some(base) {
                    return Err(self.take_offline(&e, log.dir()));
                }
                Ok(0)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Periodic housekeeping: flush when due, and retention when `retention`
    /// is set; with `checkpoint`, unflushed data is fsynced (without the
    /// log's lock) and the recovery point moved over it.
    pub fn maintain(&self, now_ms: i64, retention: bool, checkpoint: bool) -> Result<(), PartitionError> {
        if checkpoint {
            if let Some(plan) = self.with_log(|log| Ok(log.flush_plan()))? {
                match plan.sync() {
                    Ok(()) => {
                        self.with_log(|log| log.complete_flush(plan))?;
                    }
                    Err(e) => {
                        tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "background fsync failed; the recovery point stays")
                    }
                }
            }
        }
        // Write back rolled segments before taking the log for the rest, so a
        // produce never waits behind the fsync of a whole segment.
        for file in self.with_log(|log| Ok(log.rolled_segment_files()))? {
            if let Err(e) = file.sync_data() {
                tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "fsync of a rolled segment failed; retried under the log lock");
            }
        }
        self.with_log(|log| {
            log.flush_if_due(now_ms)?;
            log.expire_producers(now_ms);
            log.flush_rolled_segments()?;
            if retention {
                let deleted = log.enforce_retention(now_ms)?;
                if deleted > 0 {
                    tracing::info!(topic = %self.topic, partition = self.index, deleted, log_start_offset = log.log_start_offset(), "retention deleted segments");
                }
            }
            Ok(())
        })
    }

    pub fn size_bytes(&self) -> u64 {
        self.lock().as_ref().map(|l| l.size_bytes()).unwrap_or(0)
    }

    /// Flushes and closes the log (clean shutdown).
    pub fn close(&self) -> Result<(), StorageError> {
        match self.lock().take() {
            Some(log) => log.close(),
            None => Ok(()),
        }
    }

    /// Removes the log from disk (topic deletion).
    pub fn delete(&self) -> Result<(), StorageError> {
        match self.lock().take() {
            Some(log) => log.delete(),
            None => Ok(()),
        }
    }
}
