//! Producer state (KIP-98 idempotence and transactions, KIP-360): per log,
//! producer id → epoch, the metadata of its last 5 batches, its coordinator
//! epoch and its open transaction. The rules follow Kafka's
//! `ProducerAppendInfo` / `ProducerStateEntry` / `ProducerStateManager`:
//!
//! - an epoch below the current one is `InvalidProducerEpoch`;
//! - a new (higher) epoch must start at sequence 0, unless the producer had
//!   no epoch yet (`OutOfOrderSequence { expected: 0 }`);
//! - within an epoch a batch must follow the last one (`last_seq + 1`,
//!   wrapping to 0 after `i32::MAX`), unless the producer is unknown
//!   (expired, or never seen), which is accepted with any sequence;
//! - a batch equal (epoch, first and last sequence) to one of the last 5
//!   of the stored state is a duplicate: the append writes nothing and
//!   answers with the original offsets;
//! - a transactional batch opens a transaction (first offset = its offset);
//!   a non-transactional batch while one is open is `InvalidTxnState`;
//! - a COMMIT/ABORT marker (control batch) with an older epoch is
//!   `InvalidProducerEpoch`, with an older coordinator epoch
//!   `CoordinatorFenced`; it closes the open transaction (an ABORT of a
//!   non-empty transaction goes to the transaction index) and adopts the
//!   marker's epoch.
//!
//! Validation only uses batch headers (and the one tiny record of a control
//! batch) and one map look-up per batch. All batches of an append are
//! staged in a [`Pending`] against a copy of the touched entries; the state
//! changes only once the bytes are written (`commit`).
//!
//! Snapshots: `<20-digit offset>.snapshot` holds the whole state as of that
//! offset (our own format, CRC-32 by crc32fast):
//! ```text
//! 0 magic "SPST" | 4 version u16 = 1 | 6 offset i64 | 14 producer count u32 | 18 entries | crc32 u32
//! entry: producer id i64 | epoch i16 | coordinator epoch i32 | last timestamp i64
//!        | open transaction first offset i64 (-1: none) | batch count u8
//!        | batch count × (first seq i32 | last seq i32 | first offset i64 | last offset i64 | max timestamp i64)
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::batch::{self, EndTxnMarker};
use crate::error::{Result, StorageError};
use crate::txn_index::TxnIndexEntry;

/// How many batches per producer are remembered for duplicate detection (Kafka's `NUM_BATCHES_TO_RETAIN`).
pub const NUM_BATCHES_TO_RETAIN: usize = 5;
pub(crate) const SNAPSHOT_SUFFIX: &str = "snapshot";
const NO_EPOCH: i16 = -1;
const NO_SEQUENCE: i32 = -1;
const MAGIC: &[u8; 4] = b"SPST";
const VERSION: u16 = 1;
const HEAD_BYTES: usize = 18;
const ENTRY_FIXED_BYTES: usize = 8 + 2 + 4 + 8 + 8 + 1;
const BATCH_BYTES: usize = 4 + 4 + 8 + 8 + 8;

/// A produce or marker refused by the producer state; nothing was written.
/// The broker maps these to INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER,
/// INVALID_TXN_STATE and TRANSACTION_COORDINATOR_FENCED.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    #[error("producer {producer_id}: epoch {epoch} is older than the current epoch {current_epoch}")]
    InvalidProducerEpoch { producer_id: i64, epoch: i16, current_epoch: i16 },
    #[error("producer {producer_id}: out of order sequence number {got}, expected {expected}")]
    OutOfOrderSequence { producer_id: i64, expected: i32, got: i32 },
    #[error("producer {producer_id}: invalid transaction state: {reason}")]
    InvalidTxnState { producer_id: i64, reason: String },
    #[error(
        "producer {producer_id}: transaction marker from coordinator epoch {coordinator_epoch}, \
         fenced by coordinator epoch {current_coordinator_epoch}"
    )]
    CoordinatorFenced { producer_id: i64, coordinator_epoch: i32, current_coordinator_epoch: i32 },
}

/// One remembered batch of a producer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BatchMetadata {
    pub first_seq: i32,
    pub last_seq: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
}

/// One producer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProducerEntry {
    pub producer_epoch: i16,
    /// Oldest first; `batch_count` of them are valid.
    batches: [BatchMetadata; NUM_BATCHES_TO_RETAIN],
    batch_count: u8,
    pub last_timestamp: i64,
    pub coordinator_epoch: i32,
    pub current_txn_first_offset: Option<i64>,
}

impl ProducerEntry {
    /// Kafka's `ProducerStateEntry.empty`: no epoch, no batches.
    pub fn empty() -> Self {
        ProducerEntry {
            producer_epoch: NO_EPOCH,
            batches: [BatchMetadata::default(); NUM_BATCHES_TO_RETAIN],
            batch_count: 0,
            last_timestamp: -1,
            coordinator_epoch: -1,
            current_txn_first_offset: None,
        }
    }

    pub fn batches(&self) -> &[BatchMetadata] {
        &self.batches[..self.batch_count as usize]
    }

    pub fn last_seq(&self) -> i32 {
        self.batches().last().map_or(NO_SEQUENCE, |b| b.last_seq)
    }

    fn maybe_update_epoch(&mut self, epoch: i16) {
        if self.producer_epoch != epoch {
            self.batch_count = 0;
            self.producer_epoch = epoch;
        }
    }

    fn add_batch(&mut self, epoch: i16, meta: BatchMetadata) {
        self.maybe_update_epoch(epoch);
        self.push_batch(meta);
        self.last_timestamp = meta.max_timestamp;
    }

    fn push_batch(&mut self, meta: BatchMetadata) {
        if self.batch_count as usize == NUM_BATCHES_TO_RETAIN {
            self.batches.copy_within(1.., 0);
            self.batch_count -= 1;
        }
        self.batches[self.batch_count as usize] = meta;
        self.batch_count += 1;
    }

    /// Kafka's `findDuplicateBatch`: a remembered batch of the same epoch with the same sequence range.
    fn find_duplicate(&self, epoch: i16, first_seq: i32, last_seq: i32) -> Option<BatchMetadata> {
        if epoch != self.producer_epoch {
            return None;
        }
        self.batches().iter().find(|b| b.first_seq == first_seq && b.last_seq == last_seq).copied()
    }
}

/// What kind of batch a producer wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchKind {
    Data {
        transactional: bool,
    },
    Marker(EndTxnMarker),
    /// A control batch without a COMMIT/ABORT record (e.g. emptied by cleaning): no effect.
    OtherControl,
}

/// The header fields of one batch that producer state needs, with the offsets it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProducerBatch {
    pub producer_id: i64,
    pub epoch: i16,
    pub base_sequence: i32,
    pub last_offset_delta: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
    pub kind: BatchKind,
}

impl ProducerBatch {
    pub fn last_sequence(&self) -> i32 {
        batch::increment_sequence(self.base_sequence, self.last_offset_delta)
    }
}

/// A transaction ended by a marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompletedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    pub last_offset: i64,
    pub aborted: bool,
}

#[derive(Debug, Clone, Copy)]
struct Staged {
    producer_id: i64,
    /// The stored entry's epoch (`NO_EPOCH` when there is none): Kafka's `currentEntry.producerEpoch`.
    stored_epoch: i16,
    entry: ProducerEntry,
}

/// The producer-state effects of one append, staged until its bytes are written.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    staged: Vec<Staged>,
    /// Transactions begun: (first offset, producer id).
    started: Vec<(i64, i64)>,
    completed: Vec<CompletedTxn>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.staged.is_empty()
    }
}

fn in_sequence(last_seq: i32, next_seq: i32) -> bool {
    next_seq as i64 == last_seq as i64 + 1 || (next_seq == 0 && last_seq == i32::MAX)
}

fn next_sequence(last_seq: i32) -> i32 {
    if last_seq == i32::MAX {
        0
    } else {
        last_seq + 1
    }
}

/// All producers of one log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ProducerStateManager {
    producers: HashMap<i64, ProducerEntry>,
    /// Open transactions by first offset → producer id.
    ongoing: BTreeMap<i64, i64>,
}

impl ProducerStateManager {
    #[cfg(test)]
    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (i64, &ProducerEntry)> {
        self.producers.iter().map(|(&id, e)| (id, e))
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn clear(&mut self) {
        self.producers.clear();
        self.ongoing.clear();
    }

    /// First offset of the oldest open transaction.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.ongoing.keys().next().copied()
    }

    /// Stages `b` into `pending`. With `validate` (appends from clients and
    /// coordinators) Kafka's checks apply and a duplicate of one of the
    /// stored last 5 batches is returned as `Ok(Some(original))`; without
    /// (replay of the log at load) nothing is checked.
    pub fn stage(
        &self,
        pending: &mut Pending,
        b: &ProducerBatch,
        validate: bool,
    ) -> Result<Option<BatchMetadata>, ProducerError> {
        let producer_id = b.producer_id;
        let stored = self.producers.get(&producer_id);
        let last_seq = b.last_sequence();
        // Batches written by a coordinator on a producer's behalf (transactional
        // offset commits) carry no sequence: only the epoch is checked, as Kafka
        // does for its coordinator-origin appends. The broker refuses such
        // batches from clients.
        let coordinator_write = b.base_sequence == NO_SEQUENCE;
        if validate && !coordinator_write {
            if let (BatchKind::Data { .. }, Some(entry)) = (b.kind, stored) {
                if let Some(original) = entry.find_duplicate(b.epoch, b.base_sequence, last_seq) {
                    return Ok(Some(original));
                }
            }
        }
        let at = match pending.staged.iter().position(|s| s.producer_id == producer_id) {
            Some(at) => at,
            None => {
                pending.staged.push(Staged {
                    producer_id,
                    stored_epoch: stored.map_or(NO_EPOCH, |e| e.producer_epoch),
                    entry: stored.copied().unwrap_or_else(ProducerEntry::empty),
                });
                pending.staged.len() - 1
            }
        };
        let staged = &mut pending.staged[at];
        let entry = &mut staged.entry;
        let fenced_epoch = |entry: &ProducerEntry| ProducerError::InvalidProducerEpoch {
            producer_id,
            epoch: b.epoch,
            current_epoch: entry.producer_epoch,
        };
        match b.kind {
            BatchKind::Data { transactional } => {
                if validate {
                    if b.epoch < entry.producer_epoch {
                        return Err(fenced_epoch(entry));
                    }
                    if coordinator_write {
                        // Epoch checked above; sequences do not apply.
                    } else if b.epoch != entry.producer_epoch {
                        if b.base_sequence != 0 && entry.producer_epoch != NO_EPOCH {
                            return Err(ProducerError::OutOfOrderSequence {
                                producer_id,
                                expected: 0,
                                got: b.base_sequence,
                            });
                        }
                    } else {
                        let current_last = entry.last_seq();
                        if !(staged.stored_epoch == NO_EPOCH || in_sequence(current_last, b.base_sequence)) {
                            return Err(ProducerError::OutOfOrderSequence {
                                producer_id,
                                expected: next_sequence(current_last),
                                got: b.base_sequence,
                            });
                        }
                    }
                }
                entry.add_batch(
                    b.epoch,
                    BatchMetadata {
                        first_seq: b.base_sequence,
                        last_seq,
                        first_offset: b.first_offset,
                        last_offset: b.last_offset,
                        max_timestamp: b.max_timestamp,
                    },
                );
                match entry.current_txn_first_offset {
                    Some(first) if !transactional && validate => {
                        return Err(ProducerError::InvalidTxnState {
                            producer_id,
                            reason: format!(
                                "non-transactional batch at offset {} while the transaction begun at offset \
                                 {first} is open",
                                b.first_offset
                            ),
                        });
                    }
                    None if transactional => {
                        entry.current_txn_first_offset = Some(b.first_offset);
                        pending.started.push((b.first_offset, producer_id));
                    }
                    _ => {}
                }
            }
            BatchKind::Marker(marker) => {
                if validate {
                    if b.epoch < entry.producer_epoch {
                        return Err(fenced_epoch(entry));
                    }
                    if entry.coordinator_epoch > marker.coordinator_epoch {
                        return Err(ProducerError::CoordinatorFenced {
                            producer_id,
                            coordinator_epoch: marker.coordinator_epoch,
                            current_coordinator_epoch: entry.coordinator_epoch,
                        });
                    }
                }
                if let Some(first_offset) = entry.current_txn_first_offset {
                    pending.completed.push(CompletedTxn {
                        producer_id,
                        first_offset,
                        last_offset: b.first_offset,
                        aborted: !marker.commit,
                    });
                }
                entry.maybe_update_epoch(b.epoch);
                entry.current_txn_first_offset = None;
                entry.coordinator_epoch = marker.coordinator_epoch;
                entry.last_timestamp = b.max_timestamp;
            }
            BatchKind::OtherControl => {}
        }
        Ok(None)
    }

    /// Applies a staged append whose bytes are written. Returns the
    /// transaction index entries of the aborted transactions it completed,
    /// each with the last stable offset after it (Kafka's
    /// `lastStableOffset(completedTxn)`: the first offset of another
    /// producer's open transaction, else the marker's offset + 1).
    pub fn commit(&mut self, pending: Pending) -> Vec<TxnIndexEntry> {
        for s in pending.staged {
            self.producers.insert(s.producer_id, s.entry);
        }
        for (first, pid) in pending.started {
            self.ongoing.insert(first, pid);
        }
        let mut aborted = Vec::new();
        for c in pending.completed {
            if c.aborted {
                let lso = self
                    .ongoing
                    .iter()
                    .find(|(_, &pid)| pid != c.producer_id)
                    .map_or(c.last_offset + 1, |(&first, _)| first);
                aborted.push(TxnIndexEntry {
                    producer_id: c.producer_id,
                    first_offset: c.first_offset,
                    last_offset: c.last_offset,
                    last_stable_offset: lso,
                });
            }
            self.ongoing.remove(&c.first_offset);
        }
        aborted
    }

    /// Removes producers with no open transaction whose last write is at
    /// least `expiration_ms` old (Kafka's `isProducerExpired`). Returns how many.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| {
            e.current_txn_first_offset.is_some() || now_ms.saturating_sub(e.last_timestamp) < expiration_ms
        });
        before - self.producers.len()
    }

    pub fn encode_snapshot(&self, offset: i64) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEAD_BYTES + self.producers.len() * (ENTRY_FIXED_BYTES + 2 * BATCH_BYTES) + 4);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        let mut ids: Vec<i64> = self.producers.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let e = &self.producers[&id];
            b.extend_from_slice(&id.to_be_bytes());
            b.extend_from_slice(&e.producer_epoch.to_be_bytes());
            b.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
            b.extend_from_slice(&e.last_timestamp.to_be_bytes());
            b.extend_from_slice(&e.current_txn_first_offset.unwrap_or(-1).to_be_bytes());
            b.push(e.batch_count);
            for m in e.batches() {
                b.extend_from_slice(&m.first_seq.to_be_bytes());
                b.extend_from_slice(&m.last_seq.to_be_bytes());
                b.extend_from_slice(&m.first_offset.to_be_bytes());
                b.extend_from_slice(&m.last_offset.to_be_bytes());
                b.extend_from_slice(&m.max_timestamp.to_be_bytes());
            }
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        b
    }

    /// Parses a snapshot; returns its offset and the state.
    pub fn decode_snapshot(b: &[u8]) -> Result<(i64, ProducerStateManager), String> {
        if b.len() < HEAD_BYTES + 4 {
            return Err(format!("{} bytes, too short", b.len()));
        }
        let (body, crc) = b.split_at(b.len() - 4);
        let stored = u32::from_be_bytes(crc.try_into().expect("4 bytes"));
        let computed = crc32fast::hash(body);
        if stored != computed {
            return Err(format!("checksum {stored:#010x}, computed {computed:#010x}"));
        }
        if &body[0..4] != MAGIC {
            return Err("bad magic".to_string());
        }
        let version = u16::from_be_bytes([body[4], body[5]]);
        if version != VERSION {
            return Err(format!("unknown version {version}"));
        }
        let mut r = Reader { b: body, at: 6 };
        let offset = r.i64()?;
        let count = r.u32()?;
        let mut state = ProducerStateManager::default();
        for _ in 0..count {
            let id = r.i64()?;
            let mut e = ProducerEntry::empty();
            e.producer_epoch = r.i16()?;
            e.coordinator_epoch = r.i32()?;
            e.last_timestamp = r.i64()?;
            let txn = r.i64()?;
            e.current_txn_first_offset = (txn >= 0).then_some(txn);
            let n = r.u8()? as usize;
            if n > NUM_BATCHES_TO_RETAIN {
                return Err(format!("producer {id} has {n} batches"));
            }
            for _ in 0..n {
                let m = BatchMetadata {
                    first_seq: r.i32()?,
                    last_seq: r.i32()?,
                    first_offset: r.i64()?,
                    last_offset: r.i64()?,
                    max_timestamp: r.i64()?,
                };
                e.push_batch(m);
            }
            if let Some(first) = e.current_txn_first_offset {
                state.ongoing.insert(first, id);
            }
            state.producers.insert(id, e);
        }
        if r.at != body.len() {
            return Err(format!("{} bytes after the last entry", body.len() - r.at));
        }
        Ok((offset, state))
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let end = self.at + N;
        let bytes = self.b.get(self.at..end).ok_or_else(|| format!("truncated at byte {}", self.at))?;
        self.at = end;
        Ok(bytes.try_into().expect("N bytes"))
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }
    fn i16(&mut self) -> Result<i16, String> {
        Ok(i16::from_be_bytes(self.take()?))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(i32::from_be_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.take()?))
    }
    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_be_bytes(self.take()?))
    }
}

pub(crate) fn snapshot_path(dir: &Path, offset: i64) -> PathBuf {
    dir.join(crate::segment::file_name(offset, SNAPSHOT_SUFFIX))
}

/// Offsets of the snapshot files in `dir`, ascending.
pub(crate) fn list_snapshots(dir: &Path) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
        let entry = entry.map_err(|e| StorageError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".snapshot") else { continue };
        if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(offset) = stem.parse() {
                out.push(offset);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Writes the snapshot atomically: temp file, fsync, rename, fsync of the directory.
pub(crate) fn write_snapshot(dir: &Path, offset: i64, state: &ProducerStateManager) -> Result<()> {
    let path = snapshot_path(dir, offset);
    let temp = dir.join(format!("{offset:020}.{SNAPSHOT_SUFFIX}{}", crate::checkpoint::TEMP_SUFFIX));
    let mut f = File::create(&temp).map_err(|e| StorageError::io(&temp, e))?;
    f.write_all(&state.encode_snapshot(offset)).map_err(|e| StorageError::io(&temp, e))?;
    f.sync_all().map_err(|e| StorageError::io(&temp, e))?;
    drop(f);
    std::fs::rename(&temp, &path).map_err(|e| StorageError::io(&path, e))?;
    crate::checkpoint::sync_dir(dir)
}

/// Reads the snapshot at `offset`; `Err(reason)` if it is unreadable or corrupt.
pub(crate) fn read_snapshot(dir: &Path, offset: i64) -> Result<ProducerStateManager, String> {
    let path = snapshot_path(dir, offset);
    let bytes = std::fs::read(&path).map_err(|e| e.to_string())?;
    let (stored_offset, state) = ProducerStateManager::decode_snapshot(&bytes)?;
    if stored_offset != offset {
        return Err(format!("holds offset {stored_offset}"));
    }
    Ok(state)
}

pub(crate) fn delete_snapshot(dir: &Path, offset: i64) -> Result<()> {
    let path = snapshot_path(dir, offset);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PID: i64 = 1000;

    /// Test harness: a manager and the next offset, staging and committing one batch at a time.
    struct H {
        m: ProducerStateManager,
        next_offset: i64,
        aborted: Vec<TxnIndexEntry>,
    }

    impl H {
        fn new() -> Self {
            H { m: ProducerStateManager::default(), next_offset: 0, aborted: Vec::new() }
        }

        fn batch(&self, pid: i64, epoch: i16, seq: i32, count: i32, kind: BatchKind) -> ProducerBatch {
            ProducerBatch {
                producer_id: pid,
                epoch,
                base_sequence: seq,
                last_offset_delta: count - 1,
                first_offset: self.next_offset,
                last_offset: self.next_offset + count as i64 - 1,
                max_timestamp: 1_000 + self.next_offset,
                kind,
            }
        }

        /// Appends batches as one request: all staged, then committed unless one fails or is a duplicate.
        fn append_all(
            &mut self,
            batches: &[(i64, i16, i32, i32, BatchKind)],
        ) -> Result<Option<BatchMetadata>, ProducerError> {
            let mut pending = Pending::default();
            let mut offset = self.next_offset;
            for &(pid, epoch, seq, count, kind) in batches {
                let mut b = self.batch(pid, epoch, seq, count, kind);
                b.first_offset = offset;
                b.last_offset = offset + count as i64 - 1;
                if let Some(dup) = self.m.stage(&mut pending, &b, true)? {
                    return Ok(Some(dup));
                }
                offset = b.last_offset + 1;
            }
            self.next_offset = offset;
            self.aborted.extend(self.m.commit(pending));
            Ok(None)
        }

        fn data(&mut self, pid: i64, epoch: i16, seq: i32, count: i32) -> Result<Option<BatchMetadata>, ProducerError> {
            self.append_all(&[(pid, epoch, seq, count, BatchKind::Data { transactional: false })])
        }

        fn txn(&mut self, pid: i64, epoch: i16, seq: i32, count: i32) -> Result<Option<BatchMetadata>, ProducerError> {
            self.append_all(&[(pid, epoch, seq, count, BatchKind::Data { transactional: true })])
        }

        fn marker(&mut self, pid: i64, epoch: i16, commit: bool, coordinator_epoch: i32) -> Result<(), ProducerError> {
            let kind = BatchKind::Marker(EndTxnMarker { commit, coordinator_epoch });
            self.append_all(&[(pid, epoch, -1, 1, kind)]).map(|d| assert!(d.is_none()))
        }

        fn entry(&self, pid: i64) -> ProducerEntry {
            *self.m.get(pid).expect("known producer")
        }
    }

    fn out_of_order(expected: i32, got: i32) -> ProducerError {
        ProducerError::OutOfOrderSequence { producer_id: PID, expected, got }
    }

    #[test]
    fn in_sequence_batches_are_accepted_and_gaps_refused() {
        let mut h = H::new();
        assert_eq!(h.data(PID, 0, 0, 3), Ok(None));
        assert_eq!(h.data(PID, 0, 3, 2), Ok(None));
        assert_eq!(h.entry(PID).last_seq(), 4);
        assert_eq!(h.data(PID, 0, 6, 1), Err(out_of_order(5, 6)));
        assert_eq!(h.data(PID, 0, 4, 1), Err(out_of_order(5, 4)), "overlapping, not an exact duplicate");
        assert_eq!(h.next_offset, 5, "refused batches consumed no offsets");
        assert_eq!(h.data(PID, 0, 5, 1), Ok(None));
    }

    #[test]
    fn unknown_producer_is_accepted_with_any_sequence() {
        let mut h = H::new();
        assert_eq!(h.data(PID, 3, 42, 2), Ok(None));
        let e = h.entry(PID);
        assert_eq!((e.producer_epoch, e.last_seq()), (3, 43));
        assert_eq!(h.data(PID, 3, 45, 1), Err(out_of_order(44, 45)));
        // Kafka's quirk kept: within the request that creates it, the stored epoch is still "none".
        let mut h = H::new();
        let d = BatchKind::Data { transactional: false };
        assert_eq!(h.append_all(&[(PID, 0, 10, 1, d), (PID, 0, 20, 1, d)]), Ok(None));
    }

    #[test]
    fn sequences_wrap_after_i32_max() {
        let mut h = H::new();
        assert_eq!(h.data(PID, 0, i32::MAX - 2, 3), Ok(None));
        assert_eq!(h.entry(PID).last_seq(), i32::MAX);
        assert_eq!(h.data(PID, 0, 0, 2), Ok(None));
        assert_eq!(h.entry(PID).last_seq(), 1);
        // A batch that itself wraps: last sequence = (base + delta) mod 2^31.
        let mut h = H::new();
        assert_eq!(h.data(PID, 0, i32::MAX - 1, 4), Ok(None));
        assert_eq!(h.entry(PID).last_seq(), 1);
        assert_eq!(h.data(PID, 0, 2, 1), Ok(None));
        // A duplicate of a wrapping batch is found.
        let mut h = H::new();
        h.data(PID, 0, i32::MAX - 1, 4).unwrap();
        let dup = h.data(PID, 0, i32::MAX - 1, 4).unwrap().unwrap();
        assert_eq!((dup.first_seq, dup.last_seq, dup.first_offset, dup.last_offset), (i32::MAX - 1, 1, 0, 3));
        // i32::MAX followed by anything but 0 is out of order.
        let mut h = H::new();
        h.data(PID, 0, i32::MAX, 1).unwrap();
        assert_eq!(h.data(PID, 0, i32::MAX, 2).unwrap_err(), out_of_order(0, i32::MAX));
    }

    #[test]
    fn each_of_the_last_five_batches_is_a_duplicate_and_older_ones_are_not() {
        let mut h = H::new();
        let mut originals = Vec::new();
        for i in 0..7 {
            let first = h.next_offset;
            h.data(PID, 0, i * 2, 2).unwrap();
            originals.push((i * 2, first));
        }
        for &(seq, first) in &originals[2..] {
            let dup = h.data(PID, 0, seq, 2).unwrap().expect("duplicate");
            assert_eq!((dup.first_seq, dup.last_seq), (seq, seq + 1));
            assert_eq!((dup.first_offset, dup.last_offset), (first, first + 1));
            assert_eq!(dup.max_timestamp, 1_000 + first);
        }
        assert_eq!(h.next_offset, 14, "duplicates write nothing");
        // The sixth newest is forgotten: now just out of order.
        assert_eq!(h.data(PID, 0, 2, 2), Err(out_of_order(14, 2)));
        // Same sequences under another epoch are no duplicate (and a bump must start at 0).
        assert_eq!(h.data(PID, 1, 12, 2), Err(out_of_order(0, 12)));
        // A duplicate anywhere in a request answers the whole request.
        let d = BatchKind::Data { transactional: false };
        let dup = h.append_all(&[(PID, 0, 14, 1, d), (PID, 0, 12, 2, d)]).unwrap().unwrap();
        assert_eq!(dup.first_offset, 12);
        assert_eq!(h.next_offset, 14);
        assert_eq!(h.entry(PID).last_seq(), 13, "the request's other batch was not applied");
    }

    #[test]
    fn epochs_fence_and_bump() {
        let mut h = H::new();
        h.data(PID, 5, 0, 3).unwrap();
        assert_eq!(
            h.data(PID, 4, 3, 1),
            Err(ProducerError::InvalidProducerEpoch { producer_id: PID, epoch: 4, current_epoch: 5 })
        );
        assert_eq!(h.data(PID, 6, 1, 1), Err(out_of_order(0, 1)));
        assert_eq!(h.data(PID, 6, 0, 2), Ok(None));
        let e = h.entry(PID);
        assert_eq!((e.producer_epoch, e.batches().len(), e.last_seq()), (6, 1, 1));
        assert_eq!(
            h.data(PID, 5, 3, 1).unwrap_err(),
            ProducerError::InvalidProducerEpoch { producer_id: PID, epoch: 5, current_epoch: 6 }
        );
        // Epochs bumped within one request: later batches are checked against the new epoch.
        let d = BatchKind::Data { transactional: false };
        assert_eq!(h.append_all(&[(PID, 7, 0, 1, d), (PID, 7, 1, 1, d)]), Ok(None));
        assert_eq!(
            h.append_all(&[(PID, 8, 0, 1, d), (PID, 7, 2, 1, d)]).unwrap_err(),
            ProducerError::InvalidProducerEpoch { producer_id: PID, epoch: 7, current_epoch: 8 }
        );
        assert_eq!(h.entry(PID).producer_epoch, 7, "a refused request changes nothing");
    }

    #[test]
    fn transactions_open_close_and_hold_the_lso() {
        let mut h = H::new();
        const OTHER: i64 = 2000;
        h.data(OTHER, 0, 0, 2).unwrap(); // offsets 0..=1
        assert_eq!(h.m.first_unstable_offset(), None);
        h.txn(PID, 0, 0, 2).unwrap(); // 2..=3 opens a transaction at 2
        assert_eq!(h.entry(PID).current_txn_first_offset, Some(2));
        assert_eq!(h.m.first_unstable_offset(), Some(2));
        h.txn(PID, 0, 2, 1).unwrap(); // 4: same transaction
        assert_eq!(h.entry(PID).current_txn_first_offset, Some(2));
        let err = h.data(PID, 0, 3, 1).unwrap_err();
        assert!(matches!(err, ProducerError::InvalidTxnState { producer_id: PID, .. }), "{err}");
        h.txn(OTHER, 0, 2, 1).unwrap(); // 5: the other producer's transaction
        h.marker(PID, 0, true, 3).unwrap(); // 6: COMMIT
        assert_eq!(h.entry(PID).current_txn_first_offset, None);
        assert_eq!(h.entry(PID).coordinator_epoch, 3);
        assert_eq!(h.m.first_unstable_offset(), Some(5));
        assert!(h.aborted.is_empty(), "a commit is not indexed");
        h.txn(PID, 0, 3, 1).unwrap(); // 7: a new transaction, sequences continue
        h.marker(OTHER, 0, false, 3).unwrap(); // 8: ABORT of [5, 8]; PID's open txn at 7 is the LSO
        assert_eq!(
            h.aborted,
            vec![TxnIndexEntry { producer_id: OTHER, first_offset: 5, last_offset: 8, last_stable_offset: 7 }]
        );
        h.marker(PID, 0, false, 3).unwrap(); // 9: ABORT of [7, 9], nothing else open
        assert_eq!(
            h.aborted[1],
            TxnIndexEntry { producer_id: PID, first_offset: 7, last_offset: 9, last_stable_offset: 10 }
        );
        assert_eq!(h.m.first_unstable_offset(), None);
        // A marker without an open transaction changes the state but indexes nothing.
        h.marker(PID, 0, false, 3).unwrap();
        assert_eq!(h.aborted.len(), 2);
    }

    #[test]
    fn markers_are_fenced_by_producer_and_coordinator_epochs() {
        let mut h = H::new();
        h.txn(PID, 2, 0, 1).unwrap();
        h.marker(PID, 2, true, 5).unwrap();
        assert_eq!(
            h.marker(PID, 1, true, 5).unwrap_err(),
            ProducerError::InvalidProducerEpoch { producer_id: PID, epoch: 1, current_epoch: 2 }
        );
        assert_eq!(
            h.marker(PID, 2, false, 4).unwrap_err(),
            ProducerError::CoordinatorFenced { producer_id: PID, coordinator_epoch: 4, current_coordinator_epoch: 5 }
        );
        // A marker with a higher epoch (InitProducerId aborting for a new producer) bumps the epoch.
        h.txn(PID, 2, 1, 1).unwrap();
        h.marker(PID, 3, false, 6).unwrap();
        let e = h.entry(PID);
        assert_eq!((e.producer_epoch, e.batches().len(), e.current_txn_first_offset), (3, 0, None));
        // After a bump by marker the producer starts at sequence 0.
        assert_eq!(h.txn(PID, 3, 5, 1).unwrap_err(), out_of_order(0, 5));
        assert_eq!(h.txn(PID, 3, 0, 1), Ok(None));
        // Errors of a marker: nothing of its request applies.
        assert_eq!(h.m.first_unstable_offset(), Some(h.next_offset - 1));
    }

    #[test]
    fn replay_validates_nothing() {
        let m = ProducerStateManager::default();
        let mut h = H::new();
        h.data(PID, 5, 0, 1).unwrap();
        let mut pending = Pending::default();
        let stale = ProducerBatch {
            epoch: 1,
            base_sequence: 77,
            ..h.batch(PID, 1, 77, 1, BatchKind::Data { transactional: false })
        };
        assert_eq!(h.m.stage(&mut pending, &stale, false), Ok(None));
        assert_eq!(m.first_unstable_offset(), None);
    }

    #[test]
    fn expiry_spares_open_transactions() {
        let mut h = H::new();
        h.data(1, 0, 0, 1).unwrap(); // timestamp 1000
        h.txn(2, 0, 0, 1).unwrap(); // timestamp 1001, open
        h.data(3, 0, 0, 1).unwrap(); // timestamp 1002
        assert_eq!(h.m.expire(1_500, 1_000), 0);
        assert_eq!(h.m.expire(2_001, 1_000), 1, "1001 and 1002 are younger than 1000 ms; 1000 is exactly that old");
        assert!(h.m.get(1).is_none());
        assert_eq!(h.m.expire(10_000, 1_000), 1);
        assert!(h.m.get(2).is_some(), "open transaction kept");
        // An expired producer is unknown again: any sequence is accepted.
        assert_eq!(h.data(1, 0, 99, 1), Ok(None));
    }

    #[test]
    fn snapshots_round_trip_and_detect_corruption() {
        let mut h = H::new();
        for pid in 0..20 {
            for i in 0..(pid % 7) as i32 {
                h.data(pid, (pid % 3) as i16, i, 1).unwrap();
            }
        }
        h.txn(100, 1, 0, 2).unwrap();
        h.marker(101, 0, true, 4).unwrap();
        let bytes = h.m.encode_snapshot(h.next_offset);
        let (offset, state) = ProducerStateManager::decode_snapshot(&bytes).unwrap();
        assert_eq!(offset, h.next_offset);
        assert_eq!(state, h.m);
        assert_eq!(state.first_unstable_offset(), h.m.first_unstable_offset());
        for i in (0..bytes.len()).step_by(7) {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(ProducerStateManager::decode_snapshot(&bad).is_err(), "byte {i}");
        }
        assert!(ProducerStateManager::decode_snapshot(&bytes[..bytes.len() - 1]).is_err());
        let dir = tempfile::tempdir().unwrap();
        write_snapshot(dir.path(), 42, &h.m).unwrap();
        write_snapshot(dir.path(), 7, &ProducerStateManager::default()).unwrap();
        assert_eq!(list_snapshots(dir.path()).unwrap(), vec![7, 42]);
        assert_eq!(read_snapshot(dir.path(), 42).unwrap(), h.m);
        std::fs::copy(snapshot_path(dir.path(), 7), snapshot_path(dir.path(), 8)).unwrap();
        assert!(read_snapshot(dir.path(), 8).unwrap_err().contains("offset 7"));
        delete_snapshot(dir.path(), 42).unwrap();
        assert_eq!(list_snapshots(dir.path()).unwrap(), vec![7, 8]);
    }
}
