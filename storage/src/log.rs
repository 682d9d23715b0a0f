//! The partition log: an ordered set of segments with one writer.
//!
//! API CONTRACT (the broker is written against exactly this surface).
//!
//! Offsets by name: the log end offset (everything appended, visible to
//! reads) and the recovery point (everything fsynced; recovery after a crash
//! starts there and refuses to drop anything below it). The log start offset
//! is the first offset readable. The checkpoint file persists the recovery
//! point and log start offset; it is rewritten on every flush, on
//! `delete_records`, retention and truncation, and on open (marked unclean)
//! and close (marked clean).
//!
//! Producer state (see `producer_state`): `append` validates every batch
//! with a producer id against it (headers only, one map look-up per batch);
//! a retried batch is answered with its original offsets (`AppendInfo::
//! duplicate`) and writes nothing; a refused batch refuses the whole append
//! (`StorageError::Producer`). ABORT markers of non-empty transactions go to
//! the active segment's `.txnindex`. Snapshots `<offset>.snapshot` are
//! written at every roll and on close; open and truncation load the newest
//! usable one and replay batch headers from its offset.
//!
//! Replication: `append_replicated` writes a leader's batches as they are
//! (offsets and leader epochs kept). The leader epoch cache (see
//! `leader_epoch`, file `leader-epoch-checkpoint`) records the first offset
//! of every epoch: `append`/`append_shared` record their `leader_epoch`,
//! `append_replicated` each batch's, `assign_epoch` a new leader's; it is
//! written before the batches of a new epoch, cut by truncation, moved by
//! `delete_records` and retention, and checked against the log at open
//! (rebuilt from batch headers if the file is missing or unreadable).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::IoSlice;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::{info, warn};

use crate::batch::{self, AppendOrigin, BatchError};
use crate::checkpoint::Checkpoint;
use crate::cleaner::{self, CleanJob, CleanStats, CleanedSegments, Source};
use crate::error::{Result, StorageError};
use crate::leader_epoch::{EpochEntry, LeaderEpochCache};
use crate::producer_state::{self, BatchKind, Pending, ProducerBatch, ProducerStateManager};
use crate::recovery::{self, RepairCut};
use crate::segment::{BatchMeta, ScrubJob, Segment};

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
    /// `cleanup.policy` / `log.cleanup.policy` contains `delete` (default `delete`):
    /// time and size retention (`retention.ms`, `retention.bytes`) apply only then.
    pub cleanup_delete: bool,
    /// `cleanup.policy` contains `compact`: [`Log::clean`] compacts the log.
    pub cleanup_compact: bool,
    /// `delete.retention.ms` / `log.cleaner.delete.retention.ms` (1 day): how long
    /// tombstones survive compaction, measured from their batch's maxTimestamp.
    pub delete_retention_ms: i64,
    /// `min.cleanable.dirty.ratio` / `log.cleaner.min.cleanable.ratio` (0.5), in
    /// thousandths (500) so the config stays `Eq`: clean when dirty bytes / bytes
    /// of the cleanable sealed segments reaches it.
    pub min_cleanable_dirty_ratio_permille: u32,
    /// `min.compaction.lag.ms` / `log.cleaner.min.compaction.lag.ms` (0): segments
    /// holding a batch younger than this are not compacted yet.
    pub min_compaction_lag_ms: i64,
    /// `producer.id.expiration.ms` (1 day): [`Log::expire_producers`] forgets a
    /// producer with no open transaction whose last write is this old.
    pub producer_id_expiration_ms: i64,
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
            cleanup_delete: true,
            cleanup_compact: false,
            delete_retention_ms: 24 * 3600 * 1000,
            min_cleanable_dirty_ratio_permille: 500,
            min_compaction_lag_ms: 0,
            producer_id_expiration_ms: 86_400_000,
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
    /// A batch of the append was a retry of one of its producer's last 5
    /// batches: nothing was written, and `base_offset`, `last_offset` and
    /// `max_timestamp` are the original batch's (`record_count` is 0).
    pub duplicate: bool,
}

/// An aborted transaction (from the `.txnindex` files), for read_committed fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// Offset of the ABORT marker.
    pub last_offset: i64,
}

/// One producer's state, for DescribeProducers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerInfo {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// Last sequence of its last batch; -1 if none is remembered.
    pub last_sequence: i32,
    /// maxTimestamp of its last batch (or the timestamp of its last marker).
    pub last_timestamp: i64,
    pub coordinator_epoch: i32,
    /// First offset of its open transaction; -1 if none.
    pub current_txn_start_offset: i64,
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
        let start = out.len();
        out.resize(start + self.len, 0);
        if let Err(e) = self.file.read_exact_at(&mut out[start..], self.position) {
            out.truncate(start);
            return Err(StorageError::io(self.path.as_path(), e));
        }
        Ok(())
    }
}

/// A background flush: the log files to fsync and the offset they cover
/// (see [`Log::flush_plan`]).
#[derive(Debug)]
pub struct FlushPlan {
    target: i64,
    files: Vec<(Arc<File>, Arc<PathBuf>)>,
}

impl FlushPlan {
    /// fsyncs the plan's files (without the log's lock).
    pub fn sync(&self) -> Result<()> {
        for (file, path) in &self.files {
            file.sync_data().map_err(|e| StorageError::io(path.as_path(), e))?;
        }
        Ok(())
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

/// One partition's log. `Send + Sync`: the broker keeps it in a mutex.
#[derive(Debug)]
pub struct Log {
    dir: PathBuf,
    config: LogConfig,
    /// By base offset; the last one is the active segment and holds the writer.
    segments: BTreeMap<i64, Segment>,
    log_start_offset: i64,
    recovery_point: i64,
    /// The log cleaner's first dirty offset (persisted in the checkpoint).
    cleaner_offset: i64,
    messages_since_flush: u64,
    last_flush_ms: i64,
    /// Idempotent and transactional producers (see `producer_state`).
    producers: ProducerStateManager,
    /// First offset of each leader epoch (see `leader_epoch`), persisted on every change.
    epochs: LeaderEpochCache,
}

/// The producer state's view of one batch of an append (`position` only
/// describes errors): an unreadable transaction marker refuses the append.
fn producer_batch(
    header: &batch::BatchHeader<'_>,
    bytes: &[u8],
    position: usize,
    first_offset: i64,
    last_offset: i64,
) -> Result<ProducerBatch> {
    let kind = if header.is_control() {
        match batch::parse_end_txn_marker(bytes, position)? {
            Some(marker) => BatchKind::Marker(marker),
            None => BatchKind::OtherControl,
        }
    } else {
        BatchKind::Data { transactional: header.is_transactional() }
    };
    Ok(ProducerBatch {
        producer_id: header.producer_id(),
        epoch: header.producer_epoch(),
        base_sequence: header.base_sequence(),
        last_offset_delta: header.last_offset_delta(),
        first_offset,
        last_offset,
        max_timestamp: header.max_timestamp(),
        kind,
    })
}

impl Log {
    /// Opens (creating if needed) the log in `dir`, recovering from the
    /// recovery point if the last shutdown was not clean.
    pub fn open(dir: impl AsRef<Path>, config: LogConfig, now_ms: i64) -> Result<Log> {
        Log::open_with(dir.as_ref(), config, now_ms, recovery::Mode::Open).map(|(log, _)| log)
    }

    /// Opens the log in `dir` after re-reading every segment, cutting it at
    /// the first damaged batch wherever it is (later segments are deleted):
    /// the operator's way past a start-up refused for damage. Returns what
    /// was cut, if anything.
    pub fn repair(dir: impl AsRef<Path>, config: LogConfig, now_ms: i64) -> Result<(Log, Option<RepairCut>)> {
        Log::open_with(dir.as_ref(), config, now_ms, recovery::Mode::Repair)
    }

    fn open_with(dir: &Path, config: LogConfig, now_ms: i64, mode: recovery::Mode) -> Result<(Log, Option<RepairCut>)> {
        let dir = dir.to_path_buf();
        let mut recovered = recovery::recover(&dir, &config, now_ms, mode)?;
        let cut = recovered.cut.take();
        let mut log = Log {
            dir,
            config,
            segments: recovered.segments,
            log_start_offset: recovered.log_start_offset,
            recovery_point: recovered.recovery_point,
            cleaner_offset: recovered.cleaner_offset,
            messages_since_flush: 0,
            last_flush_ms: now_ms,
            producers: ProducerStateManager::default(),
            epochs: LeaderEpochCache::default(),
        };
        let index_max_bytes = log.config.index_max_bytes;
        log.active_mut().activate(index_max_bytes)?;
        log.load_producer_state(Some(now_ms), recovered.rescanned_from)?;
        log.load_epochs()?;
        // Recovered data may only be in the page cache: make it durable
        // before calling it flushed, and mark the log open (unclean) so a
        // crash from now on is detected. Neither costs an fsync when there is
        // nothing new (a log reopened after kill -9 with everything flushed,
        // or an empty one): restart then costs what was written since the
        // last flush, not a constant per partition.
        if log.log_end_offset() > log.recovery_point {
            log.sync_from_recovery_point()?;
            log.recovery_point = log.log_end_offset();
        }
        if recovered.checkpoint != Some(log.checkpoint(false)) {
            log.write_checkpoint(false)?;
        }
        info!(
            dir = %log.dir.display(),
            log_start_offset = log.log_start_offset,
            log_end_offset = log.log_end_offset(),
            segments = log.segments.len(),
            producers = log.producers.len(),
            "opened log"
        );
        Ok((log, cut))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn config(&self) -> &LogConfig {
        &self.config
    }
    /// Applies new settings (from a config change); takes effect on the next append/roll/retention.
    pub fn set_config(&mut self, config: LogConfig) {
        self.config = config;
    }
    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }
    pub fn log_end_offset(&self) -> i64 {
        self.active().next_offset()
    }
    pub fn recovery_point(&self) -> i64 {
        self.recovery_point
    }
    /// The log cleaner's first dirty offset: compaction has seen everything below it.
    pub fn cleaner_offset(&self) -> i64 {
        self.cleaner_offset
    }
    /// Bytes of all segment files.
    pub fn size_bytes(&self) -> u64 {
        self.segments.values().map(Segment::size_bytes).sum()
    }
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    fn active(&self) -> &Segment {
        self.segments.values().next_back().expect("a log always has an active segment")
    }
    fn active_mut(&mut self) -> &mut Segment {
        self.segments.values_mut().next_back().expect("a log always has an active segment")
    }

    fn checkpoint(&self, clean_shutdown: bool) -> Checkpoint {
        Checkpoint {
            recovery_point: self.recovery_point,
            log_start_offset: self.log_start_offset,
            cleaner_offset: self.cleaner_offset,
            clean_shutdown,
        }
    }

    fn write_checkpoint(&self, clean_shutdown: bool) -> Result<()> {
        self.checkpoint(clean_shutdown).write(&self.dir)
    }

    fn out_of_range(&self, offset: i64) -> StorageError {
        StorageError::OffsetOutOfRange {
            offset,
            log_start_offset: self.log_start_offset,
            log_end_offset: self.log_end_offset(),
        }
    }

    /// Validates every batch in `batches`, assigns offsets from the log end offset,
    /// stamps `leader_epoch`, and appends the bytes to the active segment (rolling
    /// first when size, time or index limits require). On any error nothing is written.
    /// Appends `batches` (one or more whole v2 batches) and stamps them in
    /// place with their offsets and `leader_epoch`, as they are in the log.
    pub fn append(
        &mut self,
        batches: &mut [u8],
        leader_epoch: i32,
        origin: AppendOrigin,
        now_ms: i64,
    ) -> Result<AppendInfo> {
        let info = self.append_shared(batches, leader_epoch, origin, now_ms)?;
        if !info.duplicate {
            let mut offset = info.base_offset;
            let starts: Vec<(usize, i32)> =
                batch::iter(batches).map(|(position, header, _)| (position, header.last_offset_delta())).collect();
            for (position, last_offset_delta) in starts {
                let last = offset + last_offset_delta as i64;
                batch::set_base_offset(&mut batches[position..], offset);
                batch::set_partition_leader_epoch(&mut batches[position..], leader_epoch);
                offset = last + 1;
            }
        }
        Ok(info)
    }

    /// Appends `batches` without changing them: the base offsets and leader
    /// epoch go into the file through small patched copies of each batch's
    /// first bytes (a vectored write), so a request buffer shared with other
    /// readers can be written as it is, with no copy of the records.
    /// `origin` says which checks the batches get (see [`AppendOrigin`]).
    pub fn append_shared(
        &mut self,
        batches: &[u8],
        leader_epoch: i32,
        origin: AppendOrigin,
        now_ms: i64,
    ) -> Result<AppendInfo> {
        if batches.len() > self.config.max_batch_bytes {
            return Err(StorageError::BatchTooLarge { size: batches.len(), max: self.config.max_batch_bytes });
        }
        if batches.is_empty() {
            return Err(StorageError::InvalidBatch(BatchError::Truncated { position: 0 }));
        }
        let info = batch::validate_all(batches, origin)?;
        let base_offset = self.log_end_offset();
        let mut metas = Vec::with_capacity(info.batch_count);
        let mut offset = base_offset;
        let mut pending = Pending::default();
        for (position, header, total) in batch::iter(batches) {
            let last_offset = offset + header.last_offset_delta() as i64;
            metas.push(BatchMeta {
                position: position as u64,
                base_offset: offset,
                last_offset,
                max_timestamp: header.max_timestamp(),
                total_bytes: total as u64,
            });
            if header.producer_id() >= 0 {
                let b = producer_batch(&header, &batches[position..position + total], position, offset, last_offset)?;
                if let Some(original) = self.producers.stage(&mut pending, &b, true)? {
                    // Kafka: a retried batch answers the whole append with its original offsets.
                    return Ok(AppendInfo {
                        base_offset: original.first_offset,
                        last_offset: original.last_offset,
                        max_timestamp: original.max_timestamp,
                        log_start_offset: self.log_start_offset,
                        record_count: 0,
                        duplicate: true,
                    });
                }
            }
            offset = last_offset + 1;
        }
        assert_eq!(metas.len(), info.batch_count, "validate_all and iter disagree");
        let last_offset = offset - 1;
        let prefixes: Vec<[u8; batch::PATCHED_PREFIX_BYTES]> = metas
            .iter()
            .map(|m| batch::patched_prefix(&batches[m.position as usize..], m.base_offset, leader_epoch))
            .collect();
        let mut parts = Vec::with_capacity(metas.len() * 2);
        for (meta, prefix) in metas.iter().zip(&prefixes) {
            let (start, end) = (meta.position as usize, (meta.position + meta.total_bytes) as usize);
            parts.push(IoSlice::new(prefix));
            parts.push(IoSlice::new(&batches[start + batch::PATCHED_PREFIX_BYTES..end]));
        }
        if leader_epoch >= 0 && self.epochs.latest_epoch() != Some(leader_epoch) {
            self.assign_epochs(&[(leader_epoch, base_offset)])?;
        }
        self.write_batches(&mut parts, &metas, &info, pending, now_ms)?;
        Ok(AppendInfo {
            base_offset,
            last_offset,
            max_timestamp: info.max_timestamp,
            log_start_offset: self.log_start_offset,
            record_count: info.record_count,
            duplicate: false,
        })
    }

    /// Appends batches replicated from the leader (the records of a Fetch
    /// response), as Kafka's `appendAsFollower`: their offsets and partition
    /// leader epochs were assigned by the leader and are written exactly as
    /// given, so the follower's log holds the leader's bytes.
    ///
    /// Checks: framing and CRC-32C of every batch (as for
    /// [`AppendOrigin::Coordinator`]: the client checks were the leader's);
    /// the first batch starts at or after the log end offset (a compacted
    /// leader leaves gaps; below it is
    /// [`StorageError::NonMonotonicReplicaOffset`]: truncate first), later
    /// batches after the previous one
    /// ([`StorageError::ReplicaOffsetsOutOfOrder`]); leader epochs (those
    /// `>= 0`) never decrease, across the batches and from the log's latest
    /// epoch ([`StorageError::LeaderEpochRegression`]). On any error nothing
    /// is written. `max_batch_bytes` does not apply (Kafka's followers ignore
    /// the record size limit: the leader accepted the batches).
    ///
    /// The producer state is replayed from the headers without validation
    /// (the leader validated), markers complete transactions and ABORTs go
    /// to the transaction index as on the leader, so the last stable offset
    /// and aborted transactions match; each new epoch is recorded at its
    /// first batch. An empty `batches` (a fetch with nothing new) is a no-op
    /// answered with `base_offset` = log end offset, `last_offset` one below
    /// and no records.
    pub fn append_replicated(&mut self, batches: &[u8], now_ms: i64) -> Result<AppendInfo> {
        let log_end_offset = self.log_end_offset();
        if batches.is_empty() {
            return Ok(AppendInfo {
                base_offset: log_end_offset,
                last_offset: log_end_offset - 1,
                max_timestamp: -1,
                log_start_offset: self.log_start_offset,
                record_count: 0,
                duplicate: false,
            });
        }
        let info = batch::validate_all(batches, AppendOrigin::Coordinator)?;
        let mut metas: Vec<BatchMeta> = Vec::with_capacity(info.batch_count);
        let mut pending = Pending::default();
        let mut new_epochs = Vec::new();
        let mut latest_epoch = self.epochs.latest_epoch();
        let mut next = log_end_offset;
        for (position, header, total) in batch::iter(batches) {
            let base_offset = header.base_offset();
            if base_offset < next {
                return Err(match metas.last() {
                    None => StorageError::NonMonotonicReplicaOffset { base_offset, log_end_offset },
                    Some(previous) => StorageError::ReplicaOffsetsOutOfOrder {
                        position,
                        base_offset,
                        previous_last_offset: previous.last_offset,
                    },
                });
            }
            let delta = header.last_offset_delta();
            // The log end offset after the batch must still be an offset.
            if base_offset.checked_add(delta as i64 + 1).is_none() {
                return Err(StorageError::InvalidBatch(BatchError::InvalidOffsets {
                    position,
                    record_count: header.record_count(),
                    last_offset_delta: delta,
                }));
            }
            let last_offset = base_offset + delta as i64;
            let epoch = header.partition_leader_epoch();
            if epoch >= 0 {
                match latest_epoch {
                    Some(latest) if epoch < latest => {
                        return Err(StorageError::LeaderEpochRegression { base_offset, epoch, latest_epoch: latest });
                    }
                    Some(latest) if epoch == latest => {}
                    _ => {
                        new_epochs.push((epoch, base_offset));
                        latest_epoch = Some(epoch);
                    }
                }
            }
            metas.push(BatchMeta {
                position: position as u64,
                base_offset,
                last_offset,
                max_timestamp: header.max_timestamp(),
                total_bytes: total as u64,
            });
            if header.producer_id() >= 0 {
                let b =
                    producer_batch(&header, &batches[position..position + total], position, base_offset, last_offset)?;
                // The leader validated sequences and epochs: replay, as recovery does.
                self.producers.stage(&mut pending, &b, false)?;
            }
            next = last_offset + 1;
        }
        assert_eq!(metas.len(), info.batch_count, "validate_all and iter disagree");
        self.assign_epochs(&new_epochs)?;
        self.write_batches(&mut [IoSlice::new(batches)], &metas, &info, pending, now_ms)?;
        Ok(AppendInfo {
            base_offset: metas[0].base_offset,
            last_offset: next - 1,
            max_timestamp: info.max_timestamp,
            log_start_offset: self.log_start_offset,
            record_count: info.record_count,
            duplicate: false,
        })
    }

    /// What both append paths do once the batches are validated and their
    /// producer state staged: roll first when size, time, index limits or
    /// the indexes' relative offsets require (the new segment starts at the
    /// first batch, which on a replica may be past the log end), write the
    /// batches, apply the staged producer state (ABORT markers go to the
    /// transaction index), and flush per `flush_interval_messages`.
    fn write_batches(
        &mut self,
        parts: &mut [IoSlice<'_>],
        metas: &[BatchMeta],
        info: &batch::BatchesInfo,
        pending: Pending,
        now_ms: i64,
    ) -> Result<()> {
        let (Some(first), Some(last)) = (metas.first(), metas.last()) else { return Ok(()) };
        let (first_offset, last_offset) = (first.base_offset, last.last_offset);
        let active = self.active();
        let len = info.bytes as u64;
        let overflow = active.would_overflow(len, last_offset);
        if !active.is_empty()
            && (active.size_bytes() + len > self.config.segment_bytes
                || active.age_ms(now_ms, info.max_timestamp) > self.config.roll_ms
                || active.indexes_full()
                || overflow)
        {
            self.roll_at(first_offset, now_ms)?;
        } else if active.is_empty() && overflow && active.base_offset() < first_offset {
            // Only a replica's gap gets here: an empty segment cannot index
            // offsets that far past its base, so it is sealed empty.
            self.roll_at(first_offset, now_ms)?;
        }
        let interval = self.config.index_interval_bytes;
        self.active_mut().append_vectored(parts, metas, interval)?;
        debug_assert_eq!(self.log_end_offset(), last_offset + 1);
        if !pending.is_empty() {
            for aborted in self.producers.commit(pending) {
                self.active_mut().append_aborted_txn(aborted)?;
            }
        }

        self.messages_since_flush = self.messages_since_flush.saturating_add(info.record_count as u64);
        if self.messages_since_flush >= self.config.flush_interval_messages {
            self.flush()?;
            self.last_flush_ms = now_ms;
        }
        Ok(())
    }

    /// Records new leader epochs (`(epoch, start offset)` in order) and
    /// persists them before any batch of theirs is written, so the file
    /// never misses an epoch the log holds. If the write fails the cache is
    /// left as it was.
    fn assign_epochs(&mut self, entries: &[(i32, i64)]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut next = self.epochs.clone();
        let mut changed = false;
        for &(epoch, start_offset) in entries {
            changed |= next.assign(epoch, start_offset);
        }
        if changed {
            next.write(&self.dir)?;
            info!(dir = %self.dir.display(), entries = ?next.entries(), "leader epochs changed");
            self.epochs = next;
        }
        Ok(())
    }

    /// Persists the leader epoch cache after a truncation `changed` it.
    fn write_epochs_if(&self, changed: bool) -> Result<()> {
        if changed {
            self.epochs.write(&self.dir)?;
        }
        Ok(())
    }

    /// The latest leader epoch that wrote to the log (or was assigned by
    /// [`Log::assign_epoch`]); `None` before any.
    pub fn latest_epoch(&self) -> Option<i32> {
        self.epochs.latest_epoch()
    }

    /// The first offset of `epoch`, if the log has it.
    pub fn epoch_start_offset(&self, epoch: i32) -> Option<i64> {
        self.epochs.epoch_start_offset(epoch)
    }

    /// Every `(epoch, start offset)` entry, oldest first.
    pub fn epoch_entries(&self) -> &[EpochEntry] {
        self.epochs.entries()
    }

    /// The OffsetForLeaderEpoch answer `(epoch, end offset)` for `epoch`, as
    /// Kafka's `LeaderEpochFileCache.endOffsetFor` (see
    /// [`LeaderEpochCache::end_offset_for`]); `(-1, -1)` when undefined.
    pub fn end_offset_for_epoch(&self, epoch: i32) -> (i32, i64) {
        self.epochs.end_offset_for(epoch, self.log_end_offset())
    }

    /// Records that `epoch` starts at `start_offset` and persists it: a new
    /// leader records `(epoch, log end offset)` before accepting writes, so
    /// followers asking for the previous epoch's end get it even before the
    /// first append. Lower or repeated epochs change nothing (see
    /// [`LeaderEpochCache::assign`]); `start_offset` must be within
    /// `[log start offset, log end offset]`.
    pub fn assign_epoch(&mut self, epoch: i32, start_offset: i64) -> Result<()> {
        if start_offset < self.log_start_offset || start_offset > self.log_end_offset() {
            return Err(self.out_of_range(start_offset));
        }
        self.assign_epochs(&[(epoch, start_offset)])
    }

    /// Whole batches from the one containing `offset`, excluding batches whose base
    /// offset is `>= max_offset`, up to `max_bytes` (the first batch is returned even
    /// if larger when `min_one`).
    pub fn read(&self, offset: i64, max_bytes: usize, max_offset: i64, min_one: bool) -> Result<ReadInfo> {
        let log_end_offset = self.log_end_offset();
        if offset < self.log_start_offset || offset > log_end_offset {
            return Err(self.out_of_range(offset));
        }
        let mut info = ReadInfo::default();
        if offset == log_end_offset || offset >= max_offset {
            return Ok(info);
        }
        let max_bytes = max_bytes as u64;
        let mut total = 0u64;
        let (&first_base, _) = self.segments.range(..=offset).next_back().expect("offset >= first base offset");
        for segment in self.segments.range(first_base..).map(|(_, s)| s) {
            let start = if segment.base_offset() == first_base {
                match segment.find_batch(offset)? {
                    Some(meta) => meta.position,
                    None => continue,
                }
            } else {
                0
            };
            let mut end = start;
            let mut done = false;
            if segment.next_offset() <= max_offset && total + (segment.size_bytes() - start) <= max_bytes {
                // The rest of the segment fits: no need to read its headers.
                end = segment.size_bytes();
            } else {
                while end < segment.size_bytes() {
                    let meta = segment.read_header(end)?;
                    let first_batch = total == 0 && end == start;
                    if meta.base_offset >= max_offset
                        || (total + (end - start) + meta.total_bytes > max_bytes && !(min_one && first_batch))
                    {
                        done = true;
                        break;
                    }
                    end += meta.total_bytes;
                }
            }
            if end > start {
                // Bytes this process has not checked yet (from before it
                // opened the segment) are verified before they are served.
                // Damage past the first slice ends the read before it: what
                // came before is served, and the next read starting there fails.
                let from = if segment.base_offset() == first_base { offset } else { segment.base_offset() };
                if let Err(e) = segment.check_served(from, start, end, segment.next_offset()) {
                    if info.slices.is_empty() {
                        return Err(e);
                    }
                    break;
                }
                let (file, path) = segment.reader();
                info.slices.push(FileSlice {
                    file: Arc::clone(file),
                    path: Arc::clone(path),
                    position: start,
                    len: (end - start) as usize,
                });
                total += end - start;
            }
            if done {
                break;
            }
        }
        info.bytes = total as usize;
        Ok(info)
    }

    /// fsyncs everything appended and advances the recovery point.
    pub fn flush(&mut self) -> Result<()> {
        let log_end_offset = self.log_end_offset();
        if self.recovery_point >= log_end_offset {
            return Ok(());
        }
        self.sync_from_recovery_point()?;
        self.recovery_point = log_end_offset;
        self.messages_since_flush = 0;
        self.write_checkpoint(false)
    }

    /// fsyncs the segments that may hold data past the recovery point: the
    /// one holding it and every later one.
    fn sync_from_recovery_point(&self) -> Result<()> {
        let from = self.segments.range(..=self.recovery_point).next_back().map_or(i64::MIN, |(&b, _)| b);
        for segment in self.segments.range(from..).map(|(_, s)| s) {
            segment.flush()?;
        }
        Ok(())
    }

    /// The files of the sealed segments that `flush_rolled_segments` would
    /// fsync. The caller may fsync them first without holding the log (a
    /// rolled 1 GiB segment can take a second to write back), so appends are
    /// not stalled; `flush_rolled_segments` then finds them clean.
    pub fn rolled_segment_files(&self) -> Vec<Arc<File>> {
        let active_base = self.active().base_offset();
        if self.recovery_point >= active_base {
            return Vec::new();
        }
        let from = self.segments.range(..=self.recovery_point).next_back().map_or(i64::MIN, |(&b, _)| b);
        self.segments.range(from..active_base).map(|(_, s)| Arc::clone(s.reader().0)).collect()
    }

    /// fsyncs the segments that are no longer active and advances the recovery
    /// point to the active segment's base offset, as Kafka does after a roll.
    /// Without this the recovery point would only move on explicit flushes and
    /// a crash would rescan everything appended since start-up. The caller runs
    /// it off the request path (the broker's housekeeping task); rolled
    /// segments have usually been written back by the OS already, so it is cheap.
    pub fn flush_rolled_segments(&mut self) -> Result<bool> {
        let active_base = self.active().base_offset();
        if self.recovery_point >= active_base {
            return Ok(false);
        }
        let from = self.segments.range(..=self.recovery_point).next_back().map_or(i64::MIN, |(&b, _)| b);
        for segment in self.segments.range(from..active_base).map(|(_, s)| s) {
            segment.flush()?;
        }
        self.recovery_point = active_base;
        self.write_checkpoint(false)?;
        Ok(true)
    }

    /// What a background flush must fsync so the recovery point can move to
    /// the log end offset as it is now: the log files of the segments from
    /// the one holding the recovery point on. `None` when everything is
    /// flushed. The caller runs [`FlushPlan::sync`] without holding the log
    /// (appends go on meanwhile), then [`Log::complete_flush`].
    pub fn flush_plan(&self) -> Option<FlushPlan> {
        let target = self.log_end_offset();
        if self.recovery_point >= target {
            return None;
        }
        let from = self.segments.range(..=self.recovery_point).next_back().map_or(i64::MIN, |(&b, _)| b);
        let files =
            self.segments.range(from..).map(|(_, s)| (Arc::clone(s.reader().0), Arc::clone(s.reader().1))).collect();
        Some(FlushPlan { target, files })
    }

    /// Advances the recovery point to a synced plan's target and persists it.
    /// Everything below the target was in the files the plan fsynced.
    pub fn complete_flush(&mut self, plan: FlushPlan) -> Result<bool> {
        if plan.target <= self.recovery_point || plan.target > self.log_end_offset() {
            return Ok(false);
        }
        self.recovery_point = plan.target;
        self.write_checkpoint(false)?;
        Ok(true)
    }

    /// Flushes if `flush_interval_ms` has passed since the last flush and there is unflushed data.
    pub fn flush_if_due(&mut self, now_ms: i64) -> Result<bool> {
        if self.recovery_point >= self.log_end_offset()
            || now_ms.saturating_sub(self.last_flush_ms) < self.config.flush_interval_ms
        {
            return Ok(false);
        }
        self.flush()?;
        self.last_flush_ms = now_ms;
        Ok(true)
    }

    /// Starts a new active segment at the log end offset (no-op if the active one is empty).
    pub fn roll(&mut self, now_ms: i64) -> Result<()> {
        if self.active().is_empty() {
            return Ok(());
        }
        self.roll_at(self.log_end_offset(), now_ms)
    }

    /// Seals the active segment and starts a new one at `base_offset` (at or
    /// past the log end offset: a replica's next batch may start later).
    fn roll_at(&mut self, base_offset: i64, now_ms: i64) -> Result<()> {
        let segment = Segment::create(&self.dir, base_offset, self.config.index_max_bytes, now_ms)?;
        if let Err(e) = self.active_mut().seal() {
            let _ = segment.delete_files();
            return Err(e);
        }
        let old = self.active();
        info!(
            segment = %old.log_path().display(),
            size_bytes = old.size_bytes(),
            new_base_offset = base_offset,
            "rolled segment"
        );
        self.segments.insert(base_offset, segment);
        // Producer state as of the new segment's base: recovery replays from here.
        producer_state::write_snapshot(&self.dir, base_offset, &self.producers)?;
        self.prune_snapshots()
    }

    /// Deletes producer snapshots that can no longer be used: those below
    /// the first segment's base (their replay would need deleted data), and
    /// all but the newest two unless at or above the base of the segment
    /// holding the recovery point (where unclean recovery replays from). If
    /// none is left, one is written at the log end offset.
    fn prune_snapshots(&mut self) -> Result<()> {
        let snapshots = producer_state::list_snapshots(&self.dir)?;
        let first_base = *self.segments.keys().next().expect("a log always has a segment");
        let keep_from = self.segments.range(..=self.recovery_point).next_back().map_or(first_base, |(&b, _)| b);
        let n = snapshots.len();
        let mut kept = 0;
        for (i, &offset) in snapshots.iter().enumerate() {
            let newest_two = i + 2 >= n;
            if offset < first_base || (!newest_two && offset < keep_from) {
                producer_state::delete_snapshot(&self.dir, offset)?;
            } else {
                kept += 1;
            }
        }
        if kept == 0 {
            producer_state::write_snapshot(&self.dir, self.log_end_offset(), &self.producers)?;
        }
        Ok(())
    }

    /// Loads the leader epoch cache at open: the file if it reads, else
    /// rebuilt from every batch header (a missing file: a log from before
    /// the cache existed; a damaged one: warned about). Then it is cut to
    /// the log as recovered: before the log start (a crash during
    /// delete_records or retention) and at or past the log end (a torn tail
    /// cut by recovery, a crash after the cache was written but before its
    /// batch, or during a truncation, an epoch assigned without data).
    /// Written back when that changed it.
    fn load_epochs(&mut self) -> Result<()> {
        let (mut cache, mut changed) = match LeaderEpochCache::read(&self.dir)? {
            Some(Ok(cache)) => (cache, false),
            found => {
                if let Some(Err(reason)) = found {
                    warn!(
                        file = %self.dir.join(crate::leader_epoch::FILE_NAME).display(),
                        reason,
                        "rebuilding an unreadable leader epoch checkpoint from the log"
                    );
                }
                (self.epochs_from_headers()?, true)
            }
        };
        // Start first: an entry moved to a log start that is also the log
        // end claims no data and goes, as one rebuilt from headers would.
        changed |= cache.truncate_from_start(self.log_start_offset);
        changed |= cache.truncate_from_end(self.log_end_offset());
        self.epochs = cache;
        self.write_epochs_if(changed)
    }

    /// The leader epoch cache as the batches say: every batch header's
    /// partition leader epoch at its base offset (headers only).
    fn epochs_from_headers(&self) -> Result<LeaderEpochCache> {
        let mut cache = LeaderEpochCache::default();
        let mut batches = 0u64;
        for segment in self.segments.values() {
            segment.for_each_header_from(i64::MIN, &mut |_, h| {
                cache.assign(h.partition_leader_epoch(), h.base_offset());
                batches += 1;
                Ok(())
            })?;
        }
        info!(dir = %self.dir.display(), batches, entries = cache.entries().len(), "rebuilt leader epochs from batch headers");
        Ok(cache)
    }

    /// Rebuilds the producer state: the newest readable snapshot at or below
    /// the log end offset (or, when `rebuild_txn_from` is set, at or below
    /// it), then a replay of batch headers from its offset (no snapshot: from
    /// the log start offset). Snapshots above the log end are deleted,
    /// corrupt ones skipped and deleted with a warning. With `now_ms`,
    /// expired producers of the snapshot are dropped (Kafka does so on load).
    /// With `rebuild_txn_from`, the transaction indexes of the segments from
    /// that base on are rebuilt by the replay.
    fn load_producer_state(&mut self, now_ms: Option<i64>, rebuild_txn_from: Option<i64>) -> Result<()> {
        let log_end = self.log_end_offset();
        let snapshots = producer_state::list_snapshots(&self.dir)?;
        for &offset in snapshots.iter().filter(|&&o| o > log_end) {
            info!(dir = %self.dir.display(), offset, log_end, "deleting producer snapshot above the log end");
            producer_state::delete_snapshot(&self.dir, offset)?;
        }
        let limit = rebuild_txn_from.map_or(log_end, |r| r.min(log_end));
        let mut loaded = None;
        for &offset in snapshots.iter().rev().filter(|&&o| o <= limit) {
            match producer_state::read_snapshot(&self.dir, offset) {
                Ok(state) => {
                    loaded = Some((offset, state));
                    break;
                }
                Err(reason) => {
                    warn!(
                        file = %producer_state::snapshot_path(&self.dir, offset).display(),
                        reason,
                        "skipping and deleting a corrupt producer snapshot"
                    );
                    producer_state::delete_snapshot(&self.dir, offset)?;
                }
            }
        }
        let (from, mut state) = match loaded {
            Some((offset, state)) => (offset, state),
            None => (self.log_start_offset, ProducerStateManager::default()),
        };
        if let Some(now_ms) = now_ms {
            state.expire(now_ms, self.config.producer_id_expiration_ms);
        }
        self.producers = state;
        let rebuild_from = rebuild_txn_from.unwrap_or(i64::MAX);
        if rebuild_txn_from.is_some() {
            for segment in self.segments.range_mut(rebuild_from..).map(|(_, s)| s) {
                segment.reset_txn_index()?;
            }
        }
        self.replay(from, rebuild_from)?;
        if rebuild_txn_from.is_some() {
            // Only the rebuilt transaction indexes: the log data is synced by
            // the caller when there is any past the recovery point.
            for segment in self.segments.range(rebuild_from..).map(|(_, s)| s) {
                segment.flush_txn_index()?;
            }
        }
        Ok(())
    }

    /// Applies the producer batches from `from` to the log end to the
    /// producer state, reading batch headers only (and the one record of
    /// each control batch). Aborted transactions whose marker is at or after
    /// `rebuild_txn_from` are added to their segment's transaction index.
    fn replay(&mut self, from: i64, rebuild_txn_from: i64) -> Result<()> {
        let first = self.segments.range(..=from).next_back().map_or(i64::MIN, |(&b, _)| b);
        let bases: Vec<i64> = self.segments.range(first..).map(|(&b, _)| b).collect();
        let mut replayed = 0u64;
        for base in bases {
            let Log { segments, producers, .. } = self;
            let segment = &segments[&base];
            let mut aborted = Vec::new();
            segment.for_each_header_from(from, &mut |position, h| {
                if h.producer_id() < 0 || h.last_offset() < from {
                    return Ok(());
                }
                let kind = if h.is_control() {
                    let bytes = segment.read_bytes(position, h.total_bytes() as u64)?;
                    match batch::parse_end_txn_marker(&bytes, position as usize) {
                        Ok(Some(marker)) => BatchKind::Marker(marker),
                        Ok(None) => BatchKind::OtherControl,
                        Err(e) => {
                            warn!(file = %segment.log_path().display(), position, error = %e, "unreadable control record");
                            BatchKind::OtherControl
                        }
                    }
                } else {
                    BatchKind::Data { transactional: h.is_transactional() }
                };
                let b = ProducerBatch {
                    producer_id: h.producer_id(),
                    epoch: h.producer_epoch(),
                    base_sequence: h.base_sequence(),
                    last_offset_delta: h.last_offset_delta(),
                    first_offset: h.base_offset(),
                    last_offset: h.last_offset(),
                    max_timestamp: h.max_timestamp(),
                    kind,
                };
                let mut pending = Pending::default();
                let staged = producers.stage(&mut pending, &b, false);
                debug_assert!(matches!(staged, Ok(None)), "a replay validates nothing");
                aborted.extend(producers.commit(pending).into_iter().filter(|e| e.last_offset >= rebuild_txn_from));
                replayed += 1;
                Ok(())
            })?;
            let segment = self.segments.get_mut(&base).expect("listed above");
            for entry in aborted {
                segment.append_aborted_txn(entry)?;
            }
        }
        if replayed > 0 {
            info!(dir = %self.dir.display(), from, batches = replayed, "replayed producer batches");
        }
        Ok(())
    }

    /// Removes every batch at or after `offset` (whole batches only), and
    /// the leader epochs starting there. At or past the log end no batch
    /// goes, but an epoch assigned at `offset` without data still does, so
    /// a follower truncating to its leader's answer can take the leader's
    /// epochs from there.
    pub fn truncate_to(&mut self, offset: i64) -> Result<()> {
        let log_end_offset = self.log_end_offset();
        if offset >= log_end_offset {
            let changed = self.epochs.truncate_from_end(offset);
            return self.write_epochs_if(changed);
        }
        if offset < self.log_start_offset {
            return self.truncate_fully_and_start_at(offset);
        }
        let (&base, segment) = self.segments.range(..=offset).next_back().expect("offset >= log start offset");
        let position = match segment.find_batch(offset)? {
            Some(meta) => meta.position,
            None => segment.size_bytes(),
        };
        // With compaction gaps the new end is the end of the last batch kept.
        let new_end = segment.end_before(position)?;
        // Persist the lowered recovery point first: a crash part way must not
        // find the log ending below its recovery point.
        self.recovery_point = self.recovery_point.min(new_end);
        self.log_start_offset = self.log_start_offset.min(new_end);
        self.cleaner_offset = self.cleaner_offset.min(new_end);
        self.write_checkpoint(false)?;
        let later: Vec<i64> = self.segments.range(base + 1..).map(|(&b, _)| b).collect();
        for b in later.into_iter().rev() {
            let gone = self.segments.remove(&b).expect("listed above");
            info!(segment = %gone.log_path().display(), "deleting segment for truncation");
            gone.delete_files()?;
        }
        let (index_max_bytes, interval) = (self.config.index_max_bytes, self.config.index_interval_bytes);
        let segment = self.active_mut();
        segment.activate(index_max_bytes)?;
        info!(segment = %segment.log_path().display(), position, offset, "truncating log");
        segment.truncate_to(position, index_max_bytes, interval)?;
        let end = self.log_end_offset();
        self.recovery_point = self.recovery_point.min(end);
        self.log_start_offset = self.log_start_offset.min(end);
        self.cleaner_offset = self.cleaner_offset.min(end);
        // Producer state as of the new end: newest snapshot at or below it, then replay.
        self.load_producer_state(None, None)?;
        let changed = self.epochs.truncate_from_end(end);
        self.write_epochs_if(changed)
    }

    /// Deletes every segment and starts an empty log at `offset`, with no
    /// producer state and no leader epochs: for a replica whose fetch
    /// position is out of the leader's range (the leader's log start moved
    /// past this log's end). `offset` must not be negative.
    pub fn truncate_fully_and_start_at(&mut self, offset: i64) -> Result<()> {
        if offset < 0 {
            return Err(self.out_of_range(offset));
        }
        self.recovery_point = offset;
        self.log_start_offset = offset;
        self.cleaner_offset = offset;
        while let Some((_, gone)) = self.segments.pop_last() {
            info!(segment = %gone.log_path().display(), "deleting segment for full truncation");
            gone.delete_files()?;
        }
        let segment = Segment::create(&self.dir, offset, self.config.index_max_bytes, 0)?;
        self.segments.insert(offset, segment);
        self.producers.clear();
        for snapshot in producer_state::list_snapshots(&self.dir)? {
            producer_state::delete_snapshot(&self.dir, snapshot)?;
        }
        self.write_checkpoint(false)?;
        let changed = self.epochs.clear();
        self.write_epochs_if(changed)
    }

    /// Drops the leader epochs wholly before the log start offset (after it moved).
    fn epochs_from_log_start(&mut self) -> Result<()> {
        let changed = self.epochs.truncate_from_start(self.log_start_offset);
        self.write_epochs_if(changed)
    }

    /// Advances the log start offset to `offset` (which must be <= log end offset)
    /// and deletes segments entirely below it. Returns the new log start offset.
    pub fn delete_records(&mut self, offset: i64) -> Result<i64> {
        if offset < self.log_start_offset || offset > self.log_end_offset() {
            return Err(self.out_of_range(offset));
        }
        if offset == self.log_start_offset {
            return Ok(offset);
        }
        self.log_start_offset = offset;
        self.write_checkpoint(false)?;
        self.epochs_from_log_start()?;
        let below =
            self.segments.values().take(self.segments.len() - 1).take_while(|s| s.next_offset() <= offset).count();
        self.delete_oldest(below, "log start offset")?;
        Ok(self.log_start_offset)
    }

    /// Deletes the `count` oldest segments (never the active one), advancing
    /// the log start offset past them; the checkpoint is written first.
    fn delete_oldest(&mut self, count: usize, reason: &str) -> Result<usize> {
        let count = count.min(self.segments.len() - 1);
        if count == 0 {
            return Ok(0);
        }
        let new_first = *self.segments.keys().nth(count).expect("count < len");
        self.log_start_offset = self.log_start_offset.max(new_first);
        self.recovery_point = self.recovery_point.max(self.log_start_offset);
        self.write_checkpoint(false)?;
        self.epochs_from_log_start()?;
        for _ in 0..count {
            let (_, gone) = self.segments.pop_first().expect("count < len");
            info!(
                segment = %gone.log_path().display(),
                size_bytes = gone.size_bytes(),
                max_timestamp = gone.max_timestamp(),
                reason,
                "deleting segment"
            );
            gone.delete_files()?;
        }
        self.prune_snapshots()?;
        Ok(count)
    }

    /// Deletes whole segments past `retention_ms` or beyond `retention_bytes`,
    /// only those wholly below `high_watermark` (as Kafka: retention never
    /// moves the log start offset past what every in-sync replica holds, so
    /// a follower is never asked to fetch from beyond the leader's start and
    /// an acknowledged-but-unreplicated tail is never the cut point).
    /// Returns how many segments were deleted.
    pub fn enforce_retention(&mut self, now_ms: i64, high_watermark: i64) -> Result<usize> {
        let mut deleted = 0;
        if self.config.cleanup_delete && self.config.retention_ms >= 0 {
            // Kafka: a segment expires when its largest timestamp is older
            // than retention.ms; deletion stops at the first one that is not.
            let expired = self
                .segments
                .values()
                .take_while(|s| {
                    // An empty sealed segment (left by compaction) does not stop deletion.
                    s.next_offset() <= high_watermark
                        && ((s.is_empty() && !s.is_active())
                            || (!s.is_empty() && now_ms.saturating_sub(s.max_timestamp()) > self.config.retention_ms))
                })
                .count();
            if expired == self.segments.len() {
                self.roll(now_ms)?;
            }
            deleted += self.delete_oldest(expired, "retention.ms")?;
        }
        if self.config.cleanup_delete && self.config.retention_bytes >= 0 {
            let mut excess = self.size_bytes() as i64 - self.config.retention_bytes;
            let over = self
                .segments
                .values()
                .take(self.segments.len() - 1)
                .take_while(|s| {
                    let fits = s.next_offset() <= high_watermark && excess - s.size_bytes() as i64 >= 0;
                    if fits {
                        excess -= s.size_bytes() as i64;
                    }
                    fits
                })
                .count();
            deleted += self.delete_oldest(over, "retention.bytes")?;
        }
        let below = self
            .segments
            .values()
            .take(self.segments.len() - 1)
            .take_while(|s| s.next_offset() <= self.log_start_offset)
            .count();
        deleted += self.delete_oldest(below, "log start offset")?;
        Ok(deleted)
    }

    /// Compacts the log (see the `cleaner` module docs): [`Log::prepare_clean`],
    /// [`CleanJob::run`] and [`Log::install_clean`] in one call. Does nothing
    /// unless `cleanup_compact`, and, without `force`, unless the dirty ratio
    /// reaches `min_cleanable_dirty_ratio_permille`.
    pub fn clean(&mut self, now_ms: i64, force: bool) -> Result<CleanStats> {
        match self.prepare_clean(now_ms, force) {
            Some(job) => {
                let cleaned = job.run()?;
                self.install_clean(cleaned)
            }
            None => Ok(CleanStats::default()),
        }
    }

    /// The cleaning pass due now, if any: the sealed segments below the first
    /// uncleanable offset (the active segment's base, or the base of the first
    /// segment with a batch younger than `min_compaction_lag_ms`), with shared
    /// read handles, so the job can run without the log's lock.
    pub fn prepare_clean(&self, now_ms: i64, force: bool) -> Option<CleanJob> {
        if !self.config.cleanup_compact {
            return None;
        }
        let active_base = self.active().base_offset();
        let mut clean_end = active_base;
        if self.config.min_compaction_lag_ms > 0 {
            let lag_limit = now_ms.saturating_sub(self.config.min_compaction_lag_ms);
            if let Some(young) = self.segments.values().find(|s| !s.is_empty() && s.max_timestamp() > lag_limit) {
                clean_end = clean_end.min(young.base_offset());
            }
        }
        let bases: Vec<i64> = self.segments.range(..clean_end).map(|(&b, _)| b).collect();
        let sources: Vec<Source> = bases
            .iter()
            .map(|&base| {
                let segment = &self.segments[&base];
                let next = self.segments.range(base + 1..).next().map(|(&b, _)| b).expect("below the active segment");
                let (file, path) = segment.reader();
                Source {
                    base,
                    next,
                    file: Arc::clone(file),
                    path: Arc::clone(path),
                    size: segment.size_bytes(),
                    aborted: segment.aborted_txns().to_vec(),
                }
            })
            .collect();
        let total: u64 = sources.iter().map(|s| s.size).sum();
        let first_dirty = self.cleaner_offset.max(self.log_start_offset);
        let dirty: u64 = sources.iter().filter(|s| s.next > first_dirty).map(|s| s.size).sum();
        if sources.is_empty() || total == 0 {
            return None;
        }
        if !force && (dirty == 0 || dirty * 1000 < self.config.min_cleanable_dirty_ratio_permille as u64 * total) {
            return None;
        }
        Some(CleanJob {
            dir: self.dir.clone(),
            sources,
            first_dirty,
            clean_end,
            now_ms,
            delete_retention_ms: self.config.delete_retention_ms,
            segment_bytes: self.config.segment_bytes,
            index_interval_bytes: self.config.index_interval_bytes,
            index_max_bytes: self.config.index_max_bytes,
        })
    }

    /// Swaps a finished job's cleaned segments in for the ones it read and
    /// advances the cleaner offset. If any segment it replaces is gone or
    /// changed (retention, truncation or delete_records ran meanwhile), the
    /// result is discarded and nothing changes (all-zero stats).
    pub fn install_clean(&mut self, cleaned: CleanedSegments) -> Result<CleanStats> {
        let still_there = cleaned.groups.iter().all(|g| {
            let present: Vec<i64> = self.segments.range(g.base..g.next).map(|(&b, _)| b).collect();
            present.len() == g.sources.len()
                && g.sources.iter().all(|src| {
                    self.segments.get(&src.base).is_some_and(|s| {
                        !s.is_active() && Arc::ptr_eq(s.reader().0, &src.file) && s.size_bytes() == src.size
                    })
                })
                && self.segments.contains_key(&g.next)
        });
        if !still_there {
            info!(dir = %self.dir.display(), "discarding a cleaning pass: its segments changed meanwhile");
            return Ok(CleanStats::default());
        }
        let now_ms = self.last_flush_ms;
        for g in &cleaned.groups {
            cleaner::swap_in(&self.dir, g.base)?;
            // The first old segment's files were renamed over; delete the rest.
            self.segments.remove(&g.base);
            for src in &g.sources[1..] {
                let old = self.segments.remove(&src.base).expect("checked above");
                old.delete_files()?;
            }
            let mut segment = Segment::open(&self.dir, g.base, now_ms)?;
            segment.set_next_offset(g.next);
            if !segment.indexes_valid() {
                segment.rebuild(false, self.config.index_max_bytes, self.config.index_interval_bytes, i64::MAX)?;
                segment.set_next_offset(g.next);
            }
            self.segments.insert(g.base, segment);
        }
        crate::checkpoint::sync_dir(&self.dir)?;
        self.cleaner_offset = self.cleaner_offset.max(cleaned.clean_end);
        // Every segment below clean_end was rewritten and fsynced, so those
        // offsets are durable now. Without this, recovery after a crash would
        // take damage in a cleaned segment past the old recovery point for a
        // torn tail, and the batch before it may end below that recovery
        // point (compaction gaps), which recovery reports as lost flushed data.
        self.recovery_point = self.recovery_point.max(cleaned.clean_end);
        self.write_checkpoint(false)?;
        let stats = cleaned.stats;
        info!(
            dir = %self.dir.display(),
            segments = stats.segments_cleaned,
            bytes_before = stats.bytes_before,
            bytes_after = stats.bytes_after,
            records_removed = stats.records_removed,
            "cleaned log"
        );
        Ok(stats)
    }

    /// The segment the scrubber should verify next, if one is due: never
    /// verified first (data found on disk at start-up), then the one verified
    /// longest ago, once `interval_ms` has passed. Sealed segments are
    /// verified whole, the active one only in the part written before this
    /// process opened it. The job runs without the log's lock.
    pub fn scrub_next(&self, now_ms: i64, interval_ms: i64) -> Option<(i64, ScrubJob)> {
        self.segments
            .values()
            .filter(|s| !s.is_empty() && (!s.is_active() || s.unverified().is_some()))
            .filter(|s| now_ms.saturating_sub(s.scrubbed_ms()) >= interval_ms || s.scrubbed_ms() == 0)
            .min_by_key(|s| s.scrubbed_ms())
            .map(|s| (s.base_offset(), s.scrub_job(s.next_offset())))
    }

    /// Records a successful scrub of the segment at `base`; false (nothing
    /// recorded) if that segment has been replaced meanwhile.
    pub fn finish_scrub(&self, base: i64, job: &ScrubJob, now_ms: i64) -> bool {
        self.segments.get(&base).is_some_and(|segment| segment.finish_scrub(job, now_ms))
    }

    /// The batch holding the first record with timestamp >= `timestamp`.
    pub fn lookup_timestamp(&self, timestamp: i64) -> Result<Option<TimestampLookup>> {
        for segment in self.segments.values() {
            if segment.max_timestamp() < timestamp || segment.next_offset() <= self.log_start_offset {
                continue;
            }
            if let Some(meta) = segment.find_timestamp(timestamp, self.log_start_offset)? {
                let batch = segment.read_bytes(meta.position, meta.total_bytes)?;
                return Ok(Some(TimestampLookup { batch }));
            }
        }
        Ok(None)
    }

    /// The batch holding the largest timestamp in the log.
    pub fn lookup_max_timestamp(&self) -> Result<Option<TimestampLookup>> {
        let mut best: Option<&Segment> = None;
        for segment in self.segments.values().filter(|s| !s.is_empty()) {
            if best.is_none_or(|b| segment.max_timestamp() > b.max_timestamp()) {
                best = Some(segment);
            }
        }
        let Some(segment) = best else { return Ok(None) };
        match segment.find_batch(segment.offset_of_max_timestamp())? {
            Some(meta) => Ok(Some(TimestampLookup { batch: segment.read_bytes(meta.position, meta.total_bytes)? })),
            None => Ok(None),
        }
    }

    /// The last stable offset: the first offset of the oldest open
    /// transaction, capped by `high_watermark`. A read_committed fetch serves
    /// offsets below it.
    pub fn last_stable_offset(&self, high_watermark: i64) -> i64 {
        self.producers.first_unstable_offset().map_or(high_watermark, |first| first.min(high_watermark))
    }

    /// Every aborted transaction whose offsets `[first_offset, last_offset]`
    /// overlap `[start_offset, upper_offset)`, in marker order: what a
    /// read_committed Fetch returns with the batches it serves from
    /// `start_offset` up to `upper_offset`. Kafka's search: from the segment
    /// holding `start_offset` onwards, stopping at the first entry whose last
    /// stable offset reaches `upper_offset` (no transaction overlapping the
    /// range can have ended later).
    pub fn aborted_transactions(&self, start_offset: i64, upper_offset: i64) -> Vec<AbortedTxn> {
        let mut out = Vec::new();
        let first = self.segments.range(..=start_offset).next_back().map_or(i64::MIN, |(&b, _)| b);
        for segment in self.segments.range(first..).map(|(_, s)| s) {
            for e in segment.aborted_txns() {
                if e.last_offset >= start_offset && e.first_offset < upper_offset {
                    out.push(AbortedTxn {
                        producer_id: e.producer_id,
                        first_offset: e.first_offset,
                        last_offset: e.last_offset,
                    });
                }
                if e.last_stable_offset >= upper_offset {
                    return out;
                }
            }
        }
        out
    }

    /// Every producer's state (DescribeProducers), by producer id.
    pub fn producers(&self) -> Vec<ProducerInfo> {
        let mut out: Vec<ProducerInfo> = self
            .producers
            .iter()
            .map(|(producer_id, e)| ProducerInfo {
                producer_id,
                producer_epoch: e.producer_epoch,
                last_sequence: e.last_seq(),
                last_timestamp: e.last_timestamp,
                coordinator_epoch: e.coordinator_epoch,
                current_txn_start_offset: e.current_txn_first_offset.unwrap_or(-1),
            })
            .collect();
        out.sort_unstable_by_key(|p| p.producer_id);
        out
    }

    /// Forgets producers with no open transaction whose last write is at
    /// least `producer_id_expiration_ms` before `now_ms` (Kafka's
    /// `producer.id.expiration.ms` check, run periodically by the broker).
    /// Their next batch is accepted with any sequence. Returns how many.
    pub fn expire_producers(&mut self, now_ms: i64) -> usize {
        let expired = self.producers.expire(now_ms, self.config.producer_id_expiration_ms);
        if expired > 0 {
            info!(dir = %self.dir.display(), expired, "expired producer ids");
        }
        expired
    }

    /// Flushes, trims indexes and records a clean shutdown.
    pub fn close(mut self) -> Result<()> {
        self.flush()?;
        let active = self.active_mut();
        active.seal()?;
        active.flush()?;
        producer_state::write_snapshot(&self.dir, self.log_end_offset(), &self.producers)?;
        self.prune_snapshots()?;
        self.write_checkpoint(true)?;
        info!(dir = %self.dir.display(), log_end_offset = self.log_end_offset(), "closed log");
        Ok(())
    }

    /// Removes the log and its directory.
    pub fn delete(self) -> Result<()> {
        let dir = self.dir.clone();
        drop(self);
        std::fs::remove_dir_all(&dir).map_err(|e| StorageError::io(dir, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::build_test_batch;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn log_is_send_and_sync() {
        assert_send_sync::<Log>();
    }

    fn config() -> LogConfig {
        LogConfig { segment_bytes: 2048, index_interval_bytes: 256, index_max_bytes: 4096, ..LogConfig::default() }
    }

    fn append_n(log: &mut Log, n: usize, ts: i64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for i in 0..n {
            let mut b = build_test_batch(0, ts + i as i64, &[&[i as u8; 100], &[1u8; 20]]);
            log.append(&mut b, 3, AppendOrigin::Client, ts + i as i64).unwrap();
            out.push(b);
        }
        out
    }

    fn read_all(log: &Log, from: i64) -> Vec<u8> {
        let info = log.read(from, usize::MAX, i64::MAX, true).unwrap();
        let mut out = Vec::new();
        for s in &info.slices {
            s.read_into(&mut out).unwrap();
        }
        assert_eq!(out.len(), info.bytes);
        out
    }

    #[test]
    fn rolled_segments_are_flushed_and_the_recovery_point_follows() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        assert!(!log.flush_rolled_segments().unwrap(), "nothing rolled yet");
        append_n(&mut log, 40, 1_000);
        assert!(log.segment_count() > 2);
        let active_base = *log.segments.keys().next_back().unwrap();
        assert!(log.recovery_point() < active_base);
        assert!(log.flush_rolled_segments().unwrap());
        assert_eq!(log.recovery_point(), active_base);
        // The checkpoint carries it: a crash (drop without close) recovers from there.
        drop(log);
        let cp = Checkpoint::read(dir.path()).unwrap().unwrap();
        assert_eq!(cp.recovery_point, active_base);
    }

    #[test]
    fn cleaning_advances_the_recovery_point_over_what_it_rewrote() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), LogConfig { cleanup_compact: true, ..config() }, 0).unwrap();
        append_n(&mut log, 40, 1_000);
        log.roll(2_000).unwrap();
        let active_base = *log.segments.keys().next_back().unwrap();
        assert!(log.recovery_point() < active_base, "nothing flushed yet");
        log.clean(2_000, true).unwrap();
        assert_eq!(log.recovery_point(), active_base);
        drop(log);
        let cp = Checkpoint::read(dir.path()).unwrap().unwrap();
        assert_eq!(cp.recovery_point, active_base);
    }

    #[test]
    fn append_read_roll_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (0, 0));
        let batches = append_n(&mut log, 40, 1_000);
        assert_eq!(log.log_end_offset(), 80);
        assert!(log.segment_count() > 3);
        let all: Vec<u8> = batches.concat();
        assert_eq!(read_all(&log, 0), all);
        assert_eq!(read_all(&log, 41), batches[20..].concat());
        let one = log.read(10, 1, i64::MAX, true).unwrap();
        assert_eq!(one.bytes, batches[5].len());
        assert_eq!(log.read(10, 1, i64::MAX, false).unwrap().bytes, 0);
        assert_eq!(log.read(10, usize::MAX, 14, false).unwrap().bytes, batches[5].len() * 2);
        assert_eq!(log.read(80, 100, i64::MAX, true).unwrap().bytes, 0);
        assert!(matches!(log.read(81, 100, i64::MAX, true), Err(StorageError::OffsetOutOfRange { .. })));
        let ts = log.lookup_timestamp(1_007).unwrap().unwrap();
        assert_eq!(ts.batch, batches[7]);
        assert_eq!(log.lookup_max_timestamp().unwrap().unwrap().batch, batches[39]);
        log.close().unwrap();
        let log = Log::open(dir.path(), config(), 0).unwrap();
        assert_eq!(log.log_end_offset(), 80);
        assert_eq!(read_all(&log, 0), all);
        assert_eq!(log.lookup_timestamp(1_020).unwrap().unwrap().batch, batches[20]);
        assert_eq!(log.lookup_max_timestamp().unwrap().unwrap().batch, batches[39]);
    }

    #[test]
    fn invalid_or_oversized_appends_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), LogConfig { max_batch_bytes: 200, ..config() }, 0).unwrap();
        let mut big = build_test_batch(0, 0, &[&[0u8; 300]]);
        assert!(matches!(log.append(&mut big, 0, AppendOrigin::Client, 0), Err(StorageError::BatchTooLarge { .. })));
        let mut good = build_test_batch(0, 0, &[b"x"]);
        let mut bad = build_test_batch(0, 0, &[b"y"]);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let mut both = [good.clone(), bad].concat();
        assert!(matches!(log.append(&mut both, 0, AppendOrigin::Client, 0), Err(StorageError::InvalidBatch(_))));
        assert_eq!(log.size_bytes(), 0);
        let info = log.append(&mut good, 0, AppendOrigin::Client, 0).unwrap();
        assert_eq!((info.base_offset, info.last_offset, info.record_count), (0, 0, 1));
    }

    #[test]
    fn truncate_delete_records_and_retention() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        let batches = append_n(&mut log, 40, 1_000);
        log.truncate_to(51).unwrap(); // inside batch 50..=51
        assert_eq!(log.log_end_offset(), 50);
        assert_eq!(read_all(&log, 0), batches[..25].concat());
        assert_eq!(log.delete_records(31).unwrap(), 31);
        assert!(matches!(log.read(30, 100, i64::MAX, true), Err(StorageError::OffsetOutOfRange { .. })));
        assert_eq!(read_all(&log, 31), batches[15..25].concat());
        assert!(log.segments.keys().next().copied().unwrap() <= 31);
        let mut retained = log.config().clone();
        retained.retention_bytes = 0;
        log.set_config(retained);
        log.enforce_retention(2_000, i64::MAX).unwrap();
        assert_eq!(log.segment_count(), 1);
        assert_eq!(log.log_start_offset(), *log.segments.keys().next().unwrap());
    }

    #[test]
    fn retention_stops_at_the_high_watermark() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        append_n(&mut log, 40, 1_000); // two records a batch, several segments
        let bases: Vec<i64> = log.segments.keys().copied().collect();
        assert!(bases.len() >= 4, "{bases:?}");
        let mut retained = log.config().clone();
        retained.retention_ms = 0; // everything has expired
        log.set_config(retained);
        // The high watermark inside the third segment: the first two go, no more.
        let hw = bases[2] + 1;
        assert_eq!(log.enforce_retention(1_000_000, hw).unwrap(), 2);
        assert_eq!(log.log_start_offset(), bases[2]);
        assert_eq!(log.enforce_retention(1_000_000, hw).unwrap(), 0);
        // Once it covers everything, the log rolls and all the old data goes.
        let end = log.log_end_offset();
        assert!(log.enforce_retention(1_000_000, end).unwrap() >= 1);
        assert_eq!((log.log_start_offset(), log.log_end_offset(), log.segment_count()), (end, end, 1));
    }

    /// One batch of `n` 50-byte records appended as leader at `epoch`; its bytes as stored.
    fn append_at(log: &mut Log, epoch: i32, n: usize, ts: i64) -> Vec<u8> {
        let values: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 50]).collect();
        let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
        let mut b = build_test_batch(0, ts, &refs);
        log.append(&mut b, epoch, AppendOrigin::Client, ts).unwrap();
        b
    }

    fn epochs(log: &Log) -> Vec<(i32, i64)> {
        log.epoch_entries().iter().map(|e| (e.epoch, e.start_offset)).collect()
    }

    fn epoch_file(dir: &Path) -> String {
        std::fs::read_to_string(dir.join(crate::leader_epoch::FILE_NAME)).unwrap()
    }

    /// Every file of a log directory but the checkpoint (which the flush history decides), by name.
    fn dir_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
            .filter(|(name, _)| name != crate::checkpoint::FILE_NAME)
            .collect()
    }

    #[test]
    fn leader_epochs_are_recorded_persisted_and_rebuilt() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        assert_eq!((log.latest_epoch(), log.end_offset_for_epoch(0)), (None, (-1, -1)));
        assert_eq!(epoch_file(dir.path()), "0\n0\n", "written at creation");
        for (i, epoch) in [0, 0, 3, 3, 5].into_iter().enumerate() {
            append_at(&mut log, epoch, 2, 1_000 + i as i64);
        }
        assert_eq!(log.log_end_offset(), 10);
        assert_eq!(epochs(&log), [(0, 0), (3, 4), (5, 8)]);
        assert_eq!(
            (log.latest_epoch(), log.epoch_start_offset(3), log.epoch_start_offset(4)),
            (Some(5), Some(4), None)
        );
        assert_eq!(log.end_offset_for_epoch(0), (0, 4));
        assert_eq!(log.end_offset_for_epoch(2), (0, 4), "between epochs");
        assert_eq!(log.end_offset_for_epoch(3), (3, 8));
        assert_eq!(log.end_offset_for_epoch(4), (3, 8));
        assert_eq!(log.end_offset_for_epoch(5), (5, 10), "the latest epoch ends at the log end");
        assert_eq!(log.end_offset_for_epoch(6), (-1, -1), "above the latest");
        assert_eq!(log.end_offset_for_epoch(-1), (-1, -1));
        assert_eq!(epoch_file(dir.path()), "0\n3\n0 0\n3 4\n5 8\n");

        // A new leader records its epoch at the log end before any append, durably.
        log.assign_epoch(7, 10).unwrap();
        assert_eq!(epoch_file(dir.path()), "0\n4\n0 0\n3 4\n5 8\n7 10\n");
        assert_eq!(log.end_offset_for_epoch(5), (5, 10));
        assert!(matches!(log.assign_epoch(8, 11), Err(StorageError::OffsetOutOfRange { .. })));
        append_at(&mut log, 7, 2, 2_000);
        assert_eq!(epochs(&log), [(0, 0), (3, 4), (5, 8), (7, 10)]);

        log.close().unwrap();
        let log = Log::open(dir.path(), config(), 0).unwrap();
        assert_eq!(epochs(&log), [(0, 0), (3, 4), (5, 8), (7, 10)], "kept across a restart");
        drop(log);
        // Missing or unreadable: rebuilt from the batch headers and rewritten.
        for damage in [None, Some("0\n7\nnonsense")] {
            let path = dir.path().join(crate::leader_epoch::FILE_NAME);
            match damage {
                None => std::fs::remove_file(&path).unwrap(),
                Some(text) => std::fs::write(&path, text).unwrap(),
            }
            let log = Log::open(dir.path(), config(), 0).unwrap();
            assert_eq!(epochs(&log), [(0, 0), (3, 4), (5, 8), (7, 10)], "{damage:?}");
            assert_eq!(epoch_file(dir.path()), "0\n4\n0 0\n3 4\n5 8\n7 10\n");
            drop(log);
        }
    }

    #[test]
    fn truncation_delete_records_and_retention_cut_the_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        for (i, epoch) in [1, 1, 2, 4, 4, 4, 6].into_iter().enumerate() {
            append_at(&mut log, epoch, 10, 1_000 + i as i64);
        }
        assert!(log.segment_count() > 2);
        assert_eq!(epochs(&log), [(1, 0), (2, 20), (4, 30), (6, 60)]);
        log.truncate_to(65).unwrap(); // inside epoch 6's only batch
        assert_eq!(log.log_end_offset(), 60);
        assert_eq!(epochs(&log), [(1, 0), (2, 20), (4, 30)]);
        // At the log end no batch goes, but an epoch assigned there without data does.
        log.assign_epoch(5, 60).unwrap();
        log.truncate_to(61).unwrap();
        assert_eq!(log.latest_epoch(), Some(5));
        log.truncate_to(60).unwrap();
        assert_eq!(epochs(&log), [(1, 0), (2, 20), (4, 30)]);
        assert_eq!(log.delete_records(25).unwrap(), 25);
        assert_eq!(epochs(&log), [(2, 25), (4, 30)], "the first kept epoch starts at the log start");
        assert_eq!(epoch_file(dir.path()), "0\n2\n2 25\n4 30\n");
        log.set_config(LogConfig { retention_bytes: 0, ..config() });
        log.enforce_retention(2_000, i64::MAX).unwrap();
        let start = log.log_start_offset();
        assert!(start > 30);
        assert_eq!(epochs(&log), [(4, start)]);
        log.truncate_fully_and_start_at(500).unwrap();
        assert_eq!((log.log_start_offset(), log.log_end_offset(), log.latest_epoch()), (500, 500, None));
        assert_eq!(epoch_file(dir.path()), "0\n0\n");
        assert!(matches!(log.truncate_fully_and_start_at(-1), Err(StorageError::OffsetOutOfRange { .. })));
        log.close().unwrap();
        let log = Log::open(dir.path(), config(), 0).unwrap();
        assert_eq!((log.log_start_offset(), log.latest_epoch()), (500, None));
    }

    #[test]
    fn a_torn_tail_takes_its_epoch_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        append_at(&mut log, 2, 3, 1_000);
        log.flush().unwrap();
        append_at(&mut log, 3, 3, 1_001);
        assert_eq!(epochs(&log), [(2, 0), (3, 3)]);
        let path = log.active().log_path().to_path_buf();
        drop(log); // a crash
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        file.set_len(len - 5).unwrap();
        let log = Log::open(dir.path(), config(), 0).unwrap();
        assert_eq!(log.log_end_offset(), 3);
        assert_eq!(epochs(&log), [(2, 0)]);
        assert_eq!(epoch_file(dir.path()), "0\n1\n2 0\n");
    }

    /// A leader's workload: plain, idempotent and transactional batches (an
    /// aborted and a committed transaction, one left open), a two-batch
    /// append, and epoch changes. Returns the client's batches (before the
    /// log stamped them) and the stored bytes of each append.
    fn leader_workload(log: &mut Log) -> Vec<(Vec<u8>, Vec<u8>)> {
        use crate::batch::{build_control_batch, build_producer_batch};
        let mut out = Vec::new();
        let mut push = |log: &mut Log, b: Vec<u8>, epoch: i32, origin: AppendOrigin| {
            let mut stored = b.clone();
            log.append(&mut stored, epoch, origin, 1_000).unwrap();
            out.push((b, stored));
        };
        let v = [7u8; 90];
        push(log, build_test_batch(0, 1_000, &[&v, &v]), 0, AppendOrigin::Client);
        push(log, build_producer_batch(7, 0, 0, false, 1_001, &[&v, &v, &v]), 0, AppendOrigin::Client);
        push(log, build_producer_batch(9, 0, 0, true, 1_002, &[&v]), 0, AppendOrigin::Client);
        push(log, build_producer_batch(7, 0, 3, false, 1_003, &[&v]), 2, AppendOrigin::Client);
        push(log, build_producer_batch(11, 0, 0, true, 1_004, &[&v, &v]), 2, AppendOrigin::Client);
        push(log, build_producer_batch(9, 0, 1, true, 1_005, &[&v]), 2, AppendOrigin::Client);
        push(log, build_control_batch(9, 0, false, 1, 1_006), 2, AppendOrigin::Coordinator);
        let two = [build_test_batch(0, 1_007, &[&v]), build_producer_batch(7, 0, 4, false, 1_007, &[&v, &v])].concat();
        push(log, two, 4, AppendOrigin::Client);
        push(log, build_control_batch(11, 0, true, 1, 1_008), 4, AppendOrigin::Coordinator);
        for i in 0..12 {
            push(
                log,
                build_producer_batch(7, 0, 6 + 2 * i, false, 1_010 + i as i64, &[&v, &v]),
                4,
                AppendOrigin::Client,
            );
        }
        push(log, build_producer_batch(13, 0, 0, true, 1_030, &[&v]), 6, AppendOrigin::Client);
        out
    }

    #[test]
    fn a_follower_replicating_the_leader_ends_identical() {
        let (leader_dir, follower_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut leader = Log::open(leader_dir.path(), config(), 0).unwrap();
        let mut follower = Log::open(follower_dir.path(), config(), 0).unwrap();
        let appends = leader_workload(&mut leader);
        for (_, stored) in &appends {
            let info = follower.append_replicated(stored, 1_000).unwrap();
            assert_eq!(info.last_offset + 1, follower.log_end_offset());
        }
        assert!(leader.segment_count() > 2, "rolled on both");
        assert_eq!(follower.log_end_offset(), leader.log_end_offset());
        assert_eq!(read_all(&follower, 0), read_all(&leader, 0));
        assert_eq!(epochs(&follower), epochs(&leader));
        assert_eq!(epochs(&leader), [(0, 0), (2, 6), (4, 11), (6, 39)]);
        let leo = leader.log_end_offset();
        assert_eq!(follower.last_stable_offset(leo), leader.last_stable_offset(leo));
        assert!(leader.last_stable_offset(leo) < leo, "a transaction is open");
        assert_eq!(follower.aborted_transactions(0, leo), leader.aborted_transactions(0, leo));
        assert_eq!(leader.aborted_transactions(0, leo).len(), 1);
        assert_eq!(follower.producers(), leader.producers());
        // Nothing new from the leader: a no-op.
        let none = follower.append_replicated(&[], 2_000).unwrap();
        assert_eq!((none.base_offset, none.last_offset, none.record_count), (leo, leo - 1, 0));
        // Byte for byte the same directory, segments, indexes, snapshots and epochs included.
        let (leader_files, follower_files) = (dir_files(leader_dir.path()), dir_files(follower_dir.path()));
        assert_eq!(leader_files.keys().collect::<Vec<_>>(), follower_files.keys().collect::<Vec<_>>());
        assert!(leader_files == follower_files, "directories differ");

        // Promoted, the follower knows the idempotent producer's last batches.
        follower.assign_epoch(8, leo).unwrap();
        let (retry, stored) = &appends[appends.len() - 2];
        let info = follower.append_shared(retry, 8, AppendOrigin::Client, 3_000).unwrap();
        let (h, _) = batch::peek_header(stored, 0).unwrap();
        assert!(info.duplicate);
        assert_eq!((info.base_offset, info.last_offset), (h.base_offset(), h.last_offset()));
        assert_eq!(follower.log_end_offset(), leo);
        follower.close().unwrap();
        let follower = Log::open(follower_dir.path(), config(), 0).unwrap();
        assert_eq!(follower.producers(), leader.producers());
        assert_eq!(follower.aborted_transactions(0, leo), leader.aborted_transactions(0, leo));
    }

    #[test]
    fn replicated_appends_out_of_order_or_below_the_epoch_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        let stamped = |base: i64, epoch: i32, n: usize| {
            let values: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 20]).collect();
            let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
            let mut b = build_test_batch(base, 1_000, &refs);
            batch::set_partition_leader_epoch(&mut b, epoch);
            b
        };
        log.append_replicated(&[stamped(0, 3, 2), stamped(2, 3, 2)].concat(), 1_000).unwrap();
        assert_eq!((log.log_end_offset(), epochs(&log)), (4, vec![(3, 0)]));
        let (size, file) = (log.size_bytes(), epoch_file(dir.path()));
        let check_nothing_written = |log: &Log| {
            assert_eq!((log.size_bytes(), log.log_end_offset(), epochs(log)), (size, 4, vec![(3, 0)]));
            assert_eq!(epoch_file(dir.path()), file);
        };
        let err = log.append_replicated(&stamped(3, 3, 1), 1_000).unwrap_err();
        assert!(matches!(err, StorageError::NonMonotonicReplicaOffset { base_offset: 3, log_end_offset: 4 }), "{err}");
        check_nothing_written(&log);
        let err = log.append_replicated(&[stamped(4, 5, 2), stamped(5, 5, 1)].concat(), 1_000).unwrap_err();
        assert!(
            matches!(err, StorageError::ReplicaOffsetsOutOfOrder { base_offset: 5, previous_last_offset: 5, .. }),
            "{err}"
        );
        check_nothing_written(&log);
        let err = log.append_replicated(&stamped(4, 2, 1), 1_000).unwrap_err();
        assert!(matches!(err, StorageError::LeaderEpochRegression { epoch: 2, latest_epoch: 3, .. }), "{err}");
        check_nothing_written(&log);
        let err = log.append_replicated(&[stamped(4, 6, 1), stamped(5, 5, 1)].concat(), 1_000).unwrap_err();
        assert!(matches!(err, StorageError::LeaderEpochRegression { epoch: 5, latest_epoch: 6, .. }), "{err}");
        check_nothing_written(&log);
        let mut bad = stamped(4, 4, 1);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let err = log.append_replicated(&bad, 1_000).unwrap_err();
        assert!(matches!(err, StorageError::InvalidBatch(BatchError::CrcMismatch { .. })), "{err}");
        check_nothing_written(&log);

        // A compacted leader's gap is kept; batches without an epoch record none.
        let info = log.append_replicated(&[stamped(10, -1, 2), stamped(12, 4, 1)].concat(), 1_000).unwrap();
        assert_eq!((info.base_offset, info.last_offset, info.record_count), (10, 12, 3));
        assert_eq!((log.log_end_offset(), epochs(&log)), (13, vec![(3, 0), (4, 12)]));
        assert_eq!(batch::peek_header(&read_all(&log, 11), 0).unwrap().0.base_offset(), 10);
        // A gap wider than a segment's relative offsets: the empty segment is sealed as it is.
        log.roll(1_000).unwrap();
        let far = 13 + i32::MAX as i64 + 10;
        log.append_replicated(&stamped(far, 4, 1), 1_000).unwrap();
        assert_eq!(log.log_end_offset(), far + 1);
        assert_eq!(*log.segments.keys().next_back().unwrap(), far);
        log.close().unwrap();
        let log = Log::open(dir.path(), config(), 0).unwrap();
        assert_eq!((log.log_end_offset(), epochs(&log)), (far + 1, vec![(3, 0), (4, 12)]));
        assert_eq!(read_all(&log, far), stamped(far, 4, 1));
    }

    /// Kafka's truncation on a leader change: the follower asks the new
    /// leader where its own latest epoch ends, truncates there, and
    /// replicates the new leader's epoch from that offset.
    #[test]
    fn a_diverged_follower_truncates_to_the_new_leader_and_reappends() {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let open = |i: usize| Log::open(dirs[i].path(), config(), 0).unwrap();
        let (mut old_leader, mut new_leader, mut follower) = (open(0), open(1), open(2));
        let mut shared = Vec::new();
        for i in 0..10 {
            shared.push(append_at(&mut old_leader, 0, 3, 1_000 + i));
        }
        for b in &shared {
            new_leader.append_replicated(b, 1_000).unwrap();
            follower.append_replicated(b, 1_000).unwrap();
        }
        // Epoch 1 wrote to the old leader and the follower only.
        for i in 0..4 {
            let b = append_at(&mut old_leader, 1, 2, 2_000 + i);
            follower.append_replicated(&b, 2_000).unwrap();
        }
        let a = new_leader.log_end_offset();
        new_leader.assign_epoch(2, a).unwrap();
        let mut fresh = Vec::new();
        for i in 0..20 {
            fresh.push(append_at(&mut new_leader, 2, 1, 3_000 + i));
        }
        let asked = follower.latest_epoch().unwrap();
        assert_eq!(asked, 1);
        let (epoch, end) = new_leader.end_offset_for_epoch(asked);
        assert_eq!((epoch, end), (0, a));
        // The follower's end of the epoch the leader answered with bounds the truncation.
        let end = end.min(follower.end_offset_for_epoch(epoch).1);
        follower.truncate_to(end).unwrap();
        assert_eq!((follower.log_end_offset(), epochs(&follower)), (a, vec![(0, 0)]));
        for b in &fresh {
            follower.append_replicated(b, 3_000).unwrap();
        }
        assert_eq!(epochs(&follower), epochs(&new_leader));
        assert_eq!(epochs(&follower), [(0, 0), (2, a)]);
        assert_eq!(read_all(&follower, 0), read_all(&new_leader, 0));
        let segment_files =
            |log: &Log| dir_files(log.dir()).into_iter().filter(|(n, _)| n.ends_with(".log")).collect::<Vec<_>>();
        assert!(segment_files(&follower) == segment_files(&new_leader), "segment files differ");
    }
}
