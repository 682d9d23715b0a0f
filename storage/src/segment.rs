//! One segment: `<base offset>.log` with its `.index` and `.timeindex`.
//!
//! The active segment owns a writer (a plain `File` opened for append); every
//! segment has a shared read handle (`Arc<File>`) used for positioned reads,
//! so readers never need the writer and a fetch can finish reading a segment
//! that retention has just deleted.

use std::fs::{File, OpenOptions};
use std::io::{IoSlice, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use crate::batch::{self, HEADER_BYTES};
use crate::error::{Result, StorageError};
use crate::offset_index::{OffsetEntry, OffsetIndex};
use crate::time_index::{TimeEntry, TimeIndex};
use crate::txn_index::{TxnIndex, TxnIndexEntry, TXN_INDEX_SUFFIX};

pub(crate) const LOG_SUFFIX: &str = "log";
pub(crate) const INDEX_SUFFIX: &str = "index";
pub(crate) const TIME_INDEX_SUFFIX: &str = "timeindex";

/// Bytes read at a time when walking a segment's batches in full.
const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// `<20-digit zero-padded base offset>.<suffix>`.
pub(crate) fn file_name(base_offset: i64, suffix: &str) -> String {
    format!("{base_offset:020}.{suffix}")
}

impl WalkEnd {
    /// The walk's stop as damage in `file` (the walk already bounds every
    /// batch by the segment's end, so its error is the whole story).
    fn damage(self, file: &Path) -> Result<()> {
        match self.error {
            None => Ok(()),
            Some(reason) => {
                Err(StorageError::DamagedSegment { file: file.to_path_buf(), position: self.position, reason })
            }
        }
    }
}

/// The header fields of one batch the log needs, copied out of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchMeta {
    /// Byte position in the segment file (or in an append buffer).
    pub position: u64,
    pub base_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
    pub total_bytes: u64,
}

/// Where a walk over a segment's batches stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WalkEnd {
    /// End of the last good batch.
    pub position: u64,
    /// Offset after the last good batch.
    pub next_offset: i64,
    /// Why the walk stopped before the end of the file, if it did.
    pub error: Option<String>,
}

#[derive(Debug)]
pub(crate) struct Segment {
    base_offset: i64,
    log_path: Arc<PathBuf>,
    reader: Arc<File>,
    /// The active segment's handle for appends: the same descriptor as
    /// `reader` (opened read + append), so a segment costs one descriptor.
    writer: Option<Arc<File>>,
    size_bytes: u64,
    next_offset: i64,
    offset_index: OffsetIndex,
    time_index: TimeIndex,
    max_timestamp: i64,
    /// Base offset of the first batch holding `max_timestamp`.
    offset_of_max_timestamp: i64,
    bytes_since_index_entry: u64,
    /// maxTimestamp of the segment's first batch: what `roll_ms` is measured from.
    first_batch_max_timestamp: Option<i64>,
    /// When this process created or opened the segment: the `roll_ms` base
    /// when the first batch carries no timestamp.
    created_ms: i64,
    /// Whether both index files looked well formed when opened.
    indexes_ok: bool,
    /// Aborted transactions whose ABORT marker is in this segment.
    txn_index: TxnIndex,
    /// Bytes `[verified_end, trusted_from)` hold batches this process has
    /// not checked: written before it opened the segment and not re-read by
    /// recovery. A fetch checks them before serving them (CRC-32C, offsets)
    /// and the scrubber verifies them in the background; anything this
    /// process appended was validated on the way in.
    trusted_from: u64,
    verified_end: AtomicU64,
    /// When the scrubber (or a validating recovery) last checked the whole
    /// segment; 0 for never.
    scrubbed_ms: AtomicI64,
}

fn open_reader(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| StorageError::io(path, e))
}

impl Segment {
    /// Creates a new, empty active segment starting at `base_offset`.
    pub fn create(dir: &Path, base_offset: i64, index_max_bytes: u32, now_ms: i64) -> Result<Segment> {
        Segment::create_with_suffix(dir, base_offset, index_max_bytes, now_ms, "")
    }

    /// [`Segment::create`] with `extra` (e.g. `.cleaned`) after each file name.
    pub fn create_with_suffix(
        dir: &Path,
        base_offset: i64,
        index_max_bytes: u32,
        now_ms: i64,
        extra: &str,
    ) -> Result<Segment> {
        let log_path = dir.join(file_name(base_offset, LOG_SUFFIX) + extra);
        let writer = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| StorageError::io(&log_path, e))?;
        let len = writer.metadata().map_err(|e| StorageError::io(&log_path, e))?.len();
        if len != 0 {
            return Err(StorageError::CorruptFile {
                file: log_path,
                reason: format!("new segment file already holds {len} bytes"),
            });
        }
        let mut segment = Segment::open_with_suffix(dir, base_offset, now_ms, extra)?;
        segment.offset_index.reset()?;
        segment.time_index.reset()?;
        segment.reader = Arc::new(writer);
        segment.writer = Some(Arc::clone(&segment.reader));
        segment.indexes_ok = true;
        segment.trusted_from = 0;
        segment.scrubbed_ms = AtomicI64::new(now_ms);
        segment.offset_index.preallocate(index_max_bytes)?;
        segment.time_index.preallocate(index_max_bytes)?;
        Ok(segment)
    }

    /// Opens an existing segment's files. Until recovery or the caller sets
    /// it, `next_offset` is the base offset.
    pub fn open(dir: &Path, base_offset: i64, now_ms: i64) -> Result<Segment> {
        Segment::open_with_suffix(dir, base_offset, now_ms, "")
    }

    fn open_with_suffix(dir: &Path, base_offset: i64, now_ms: i64, extra: &str) -> Result<Segment> {
        let log_path = dir.join(file_name(base_offset, LOG_SUFFIX) + extra);
        let reader = open_reader(&log_path)?;
        let size_bytes = reader.metadata().map_err(|e| StorageError::io(&log_path, e))?.len();
        let (offset_index, offset_ok) = OffsetIndex::open(&dir.join(file_name(base_offset, INDEX_SUFFIX) + extra))?;
        let (time_index, time_ok) = TimeIndex::open(&dir.join(file_name(base_offset, TIME_INDEX_SUFFIX) + extra))?;
        let txn_index = TxnIndex::open(dir.join(file_name(base_offset, TXN_INDEX_SUFFIX) + extra))?;
        let mut segment = Segment {
            base_offset,
            log_path: Arc::new(log_path),
            reader: Arc::new(reader),
            writer: None,
            size_bytes,
            next_offset: base_offset,
            offset_index,
            time_index,
            max_timestamp: -1,
            offset_of_max_timestamp: base_offset,
            bytes_since_index_entry: 0,
            first_batch_max_timestamp: None,
            created_ms: now_ms,
            indexes_ok: offset_ok && time_ok,
            txn_index,
            trusted_from: size_bytes,
            verified_end: AtomicU64::new(0),
            scrubbed_ms: AtomicI64::new(0),
        };
        if let Some(last) = segment.time_index.last() {
            segment.max_timestamp = last.timestamp;
            segment.offset_of_max_timestamp = base_offset + last.relative_offset as i64;
        }
        Ok(segment)
    }

    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    pub fn is_empty(&self) -> bool {
        self.size_bytes == 0
    }
    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }
    pub fn offset_of_max_timestamp(&self) -> i64 {
        self.offset_of_max_timestamp
    }
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
    pub fn is_active(&self) -> bool {
        self.writer.is_some()
    }
    pub fn indexes_full(&self) -> bool {
        self.offset_index.is_full() || self.time_index.is_full()
    }

    /// How long the segment has been collecting data, for `roll_ms`, Kafka
    /// style: the incoming batches' max timestamp minus the segment's first
    /// batch's maxTimestamp (so replaying old data does not roll on every
    /// append), or, when the first batch has no timestamp, `now_ms` minus the
    /// time this process created or opened the segment.
    pub fn age_ms(&self, now_ms: i64, incoming_max_timestamp: i64) -> i64 {
        match self.first_batch_max_timestamp {
            Some(ts) if ts >= 0 => incoming_max_timestamp.saturating_sub(ts),
            _ => now_ms.saturating_sub(self.created_ms),
        }
    }

    /// Sets what recovery learned without scanning (a sealed segment's end is
    /// the next segment's base offset).
    pub fn set_next_offset(&mut self, next_offset: i64) {
        self.next_offset = next_offset;
    }

    /// Whether the index files looked well formed and fit this segment's data.
    pub fn indexes_valid(&self) -> bool {
        let relative_end = (self.next_offset - self.base_offset).max(0) as u64;
        self.indexes_ok
            && self.offset_index.fits(self.size_bytes, relative_end)
            && self.time_index.fits(relative_end)
            && (self.size_bytes > 0 || (self.offset_index.len() == 0 && self.time_index.len() == 0))
    }

    /// The offset `offset` relative to the base, if it fits an index entry.
    fn relative(&self, offset: i64) -> Option<u32> {
        u32::try_from(offset.checked_sub(self.base_offset)?).ok()
    }

    /// Whether appending `bytes` more bytes ending at `last_offset` would
    /// overflow the u32 positions or i32 relative offsets of the indexes.
    pub fn would_overflow(&self, bytes: u64, last_offset: i64) -> bool {
        self.size_bytes + bytes > u32::MAX as u64 || last_offset.saturating_sub(self.base_offset) > i32::MAX as i64
    }

    /// Makes this the active segment: opens the writer, preallocates the indexes.
    pub fn activate(&mut self, index_max_bytes: u32) -> Result<()> {
        if self.writer.is_none() {
            let writer = OpenOptions::new()
                .read(true)
                .append(true)
                .open(&*self.log_path)
                .map_err(|e| StorageError::io(&*self.log_path, e))?;
            // One descriptor for both: the read-only one goes (slices that
            // hold it keep it open until they are sent).
            self.reader = Arc::new(writer);
            self.writer = Some(Arc::clone(&self.reader));
        }
        self.offset_index.preallocate(index_max_bytes)?;
        self.time_index.preallocate(index_max_bytes)?;
        if self.first_batch_max_timestamp.is_none() && self.size_bytes > 0 {
            self.first_batch_max_timestamp = Some(self.read_header(0)?.max_timestamp);
        }
        Ok(())
    }

    /// Stops being the active segment: records the final time index entry (so
    /// the last entry is the max timestamp), trims the indexes, drops the writer.
    pub fn seal(&mut self) -> Result<()> {
        if self.size_bytes > 0 {
            if let Some(rel) = self.relative(self.offset_of_max_timestamp) {
                let entry = TimeEntry { timestamp: self.max_timestamp, relative_offset: rel };
                self.time_index.maybe_append(entry, true);
            }
        }
        self.offset_index.trim()?;
        self.time_index.trim()?;
        self.writer = None;
        Ok(())
    }

    /// Reads and checks the header of the batch at `position`.
    pub fn read_header(&self, position: u64) -> Result<BatchMeta> {
        let corrupt = |reason: String| StorageError::CorruptFile { file: self.log_path.to_path_buf(), reason };
        if position + HEADER_BYTES as u64 > self.size_bytes {
            return Err(corrupt(format!("batch header at byte {position} runs past the end of the file")));
        }
        let mut head = [0u8; HEADER_BYTES];
        self.reader.read_exact_at(&mut head, position).map_err(|e| StorageError::io(&*self.log_path, e))?;
        let (header, total) = batch::parse_header(&head, position as usize).map_err(|e| corrupt(e.to_string()))?;
        if position + total as u64 > self.size_bytes || header.last_offset_delta() < 0 {
            return Err(corrupt(format!("batch at byte {position} runs past the end of the file")));
        }
        Ok(BatchMeta {
            position,
            base_offset: header.base_offset(),
            last_offset: header.base_offset().saturating_add(header.last_offset_delta() as i64),
            max_timestamp: header.max_timestamp(),
            total_bytes: total as u64,
        })
    }

    /// Reads `len` bytes at `position` into a new buffer.
    pub fn read_bytes(&self, position: u64, len: u64) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len as usize];
        self.reader.read_exact_at(&mut buf, position).map_err(|e| StorageError::io(&*self.log_path, e))?;
        Ok(buf)
    }

    /// Where to start scanning for `offset`: the indexed batch at or before it.
    fn index_start(&self, offset: i64) -> u64 {
        let rel = match self.relative(offset) {
            Some(rel) => rel,
            None if offset < self.base_offset => return 0,
            None => u32::MAX,
        };
        self.offset_index.lookup(rel).map_or(0, |e| e.position as u64)
    }

    /// The first batch whose last offset is `>= offset` (the one holding it,
    /// or the next), by an index look-up and a walk over headers.
    pub fn find_batch(&self, offset: i64) -> Result<Option<BatchMeta>> {
        self.find_batch_from(self.index_start(offset), |m| m.last_offset >= offset)
    }

    /// The offset after the last batch that ends at or before byte `position`
    /// (the base offset if none): where the log ends once cut at `position`,
    /// which with compaction gaps can be below the next batch's base offset.
    pub fn end_before(&self, position: u64) -> Result<i64> {
        let mut end = self.base_offset;
        let mut at = 0;
        while at < position.min(self.size_bytes) {
            let meta = self.read_header(at)?;
            end = meta.last_offset + 1;
            at += meta.total_bytes;
        }
        Ok(end)
    }

    /// Calls `f(position, header)` for every batch from the one holding
    /// `from_offset` (or the next) to the end, reading only headers (through
    /// a small window, so neither the records nor large batches are read).
    pub fn for_each_header_from(
        &self,
        from_offset: i64,
        f: &mut dyn FnMut(u64, &batch::BatchHeader<'_>) -> Result<()>,
    ) -> Result<()> {
        const WINDOW: u64 = 64 * 1024;
        let Some(first) = self.find_batch(from_offset)? else { return Ok(()) };
        let corrupt = |reason: String| StorageError::CorruptFile { file: self.log_path.to_path_buf(), reason };
        let mut buf = Vec::new();
        let mut buf_start = 0u64;
        let mut position = first.position;
        while position < self.size_bytes {
            if position + HEADER_BYTES as u64 > self.size_bytes {
                return Err(corrupt(format!("batch header at byte {position} runs past the end of the file")));
            }
            if position < buf_start || position + HEADER_BYTES as u64 > buf_start + buf.len() as u64 {
                let want = WINDOW.min(self.size_bytes - position) as usize;
                buf.resize(want, 0);
                self.reader.read_exact_at(&mut buf, position).map_err(|e| StorageError::io(&*self.log_path, e))?;
                buf_start = position;
            }
            let at = (position - buf_start) as usize;
            let (header, total) = batch::parse_header(&buf[at..at + HEADER_BYTES], position as usize)
                .map_err(|e| corrupt(e.to_string()))?;
            if position + total as u64 > self.size_bytes {
                return Err(corrupt(format!("batch at byte {position} runs past the end of the file")));
            }
            f(position, &header)?;
            position += total as u64;
        }
        Ok(())
    }

    /// Walks headers from `position` to the first batch matching `pred`.
    pub fn find_batch_from(&self, mut position: u64, pred: impl Fn(&BatchMeta) -> bool) -> Result<Option<BatchMeta>> {
        while position < self.size_bytes {
            let meta = self.read_header(position)?;
            if pred(&meta) {
                return Ok(Some(meta));
            }
            position += meta.total_bytes;
        }
        Ok(None)
    }

    /// The first batch with maxTimestamp `>= timestamp` and last offset `>= min_offset`.
    pub fn find_timestamp(&self, timestamp: i64, min_offset: i64) -> Result<Option<BatchMeta>> {
        let start = match self.time_index.lookup_below(timestamp) {
            Some(e) => self.index_start(self.base_offset + e.relative_offset as i64),
            None => 0,
        };
        self.find_batch_from(start, |m| m.max_timestamp >= timestamp && m.last_offset >= min_offset)
    }

    /// Appends validated batches (already stamped with offsets) with one
    /// write; `metas` positions are relative to `buf`.
    pub fn append(&mut self, buf: &[u8], metas: &[BatchMeta], index_interval_bytes: u32) -> Result<()> {
        self.append_vectored(&mut [IoSlice::new(buf)], metas, index_interval_bytes)
    }

    /// Appends the concatenation of `parts` (whole batches) with vectored
    /// writes, normally one `writev`; `metas` positions are relative to the
    /// start of that concatenation.
    pub fn append_vectored(
        &mut self,
        parts: &mut [IoSlice<'_>],
        metas: &[BatchMeta],
        index_interval_bytes: u32,
    ) -> Result<()> {
        let mut writer: &File = self.writer.as_deref().expect("append to a sealed segment");
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut rest = parts;
        while !rest.is_empty() {
            let written = match writer.write_vectored(rest) {
                Ok(0) => Err(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                Ok(n) => Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            match written {
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) => {
                    // Nothing may be left half written: cut back to the old end.
                    let _ = writer.set_len(self.size_bytes);
                    return Err(StorageError::io(&*self.log_path, e));
                }
            }
        }
        let start = self.size_bytes;
        self.size_bytes += len as u64;
        for meta in metas {
            let meta = BatchMeta { position: start + meta.position, ..*meta };
            self.index_batch(&meta, index_interval_bytes);
        }
        Ok(())
    }

    /// Updates the max timestamp, the next offset and the sparse indexes for
    /// a batch that is now in the file.
    fn index_batch(&mut self, meta: &BatchMeta, index_interval_bytes: u32) {
        if self.first_batch_max_timestamp.is_none() {
            self.first_batch_max_timestamp = Some(meta.max_timestamp);
        }
        if meta.max_timestamp > self.max_timestamp {
            self.max_timestamp = meta.max_timestamp;
            self.offset_of_max_timestamp = meta.base_offset;
        }
        if self.bytes_since_index_entry >= index_interval_bytes as u64 && meta.position > 0 {
            if let (Some(rel), Ok(position)) = (self.relative(meta.base_offset), u32::try_from(meta.position)) {
                if !self.offset_index.is_full() {
                    self.offset_index.append(OffsetEntry { relative_offset: rel, position });
                }
            }
            if let Some(rel) = self.relative(self.offset_of_max_timestamp) {
                let entry = TimeEntry { timestamp: self.max_timestamp, relative_offset: rel };
                self.time_index.maybe_append(entry, false);
            }
            self.bytes_since_index_entry = 0;
        }
        self.bytes_since_index_entry += meta.total_bytes;
        self.next_offset = meta.last_offset + 1;
    }

    /// Walks the batches from the start of the file, rebuilding the indexes,
    /// max timestamp and next offset; with `validate` each batch's CRC-32C is
    /// checked. Stops at the first bad batch without changing the file.
    /// Batches must end below `limit` (the next segment's base; `i64::MAX` when unknown).
    pub fn rebuild(
        &mut self,
        validate: bool,
        index_max_bytes: u32,
        index_interval_bytes: u32,
        limit: i64,
    ) -> Result<WalkEnd> {
        self.rebuild_indexes(validate, index_max_bytes, index_interval_bytes, limit, false)
    }

    /// [`Segment::rebuild`] that leaves a sealed segment's indexes at their
    /// preallocated size when `keep_unsealed`: recovery's last segment, which
    /// the log activates next (trimming then preallocating again cost two
    /// file truncations per index, a few milliseconds per partition).
    pub fn rebuild_indexes(
        &mut self,
        validate: bool,
        index_max_bytes: u32,
        index_interval_bytes: u32,
        limit: i64,
        keep_unsealed: bool,
    ) -> Result<WalkEnd> {
        self.offset_index.reset()?;
        self.time_index.reset()?;
        self.offset_index.preallocate(index_max_bytes)?;
        self.time_index.preallocate(index_max_bytes)?;
        self.max_timestamp = -1;
        self.offset_of_max_timestamp = self.base_offset;
        self.bytes_since_index_entry = 0;
        self.first_batch_max_timestamp = None;
        self.next_offset = self.base_offset;
        let (reader, path) = (Arc::clone(&self.reader), Arc::clone(&self.log_path));
        let end = walk(&reader, &path, self.size_bytes, 0, self.base_offset, validate, false, limit, &mut |m| {
            self.index_batch(m, index_interval_bytes)
        })?;
        if validate {
            // Everything up to where the walk stopped was checked, CRCs included.
            self.verified_end.fetch_max(end.position, Ordering::Relaxed);
            if end.error.is_none() {
                self.scrubbed_ms.store(self.created_ms, Ordering::Relaxed);
            }
        }
        self.indexes_ok = true;
        if !self.is_active() && !keep_unsealed {
            self.seal()?;
        }
        Ok(end)
    }

    /// Checks the tail of a cleanly closed segment: from its last index entry
    /// every batch must validate and the last must end exactly at the end of
    /// the file. On success the max timestamp and next offset are updated.
    pub fn verify_tail(&mut self) -> Result<bool> {
        let (position, offset, exact) = match self.offset_index.last() {
            Some(e) => (e.position as u64, self.base_offset + e.relative_offset as i64, true),
            None => (0, self.base_offset, false),
        };
        let mut max = (self.max_timestamp, self.offset_of_max_timestamp);
        let mut first_ts = None;
        let end =
            walk(&self.reader, &self.log_path, self.size_bytes, position, offset, true, exact, i64::MAX, &mut |m| {
                if m.position == 0 {
                    first_ts = Some(m.max_timestamp);
                }
                if m.max_timestamp > max.0 {
                    max = (m.max_timestamp, m.base_offset);
                }
            })?;
        if end.error.is_some() {
            return Ok(false);
        }
        self.trusted_from = self.trusted_from.min(position);
        (self.max_timestamp, self.offset_of_max_timestamp) = max;
        self.next_offset = end.next_offset;
        self.bytes_since_index_entry = self.size_bytes - position;
        if first_ts.is_some() {
            self.first_batch_max_timestamp = first_ts;
        }
        Ok(true)
    }

    /// Cuts the file at `position` (a batch boundary) and rebuilds the indexes
    /// from the batch headers that remain.
    pub fn truncate_to(&mut self, position: u64, index_max_bytes: u32, index_interval_bytes: u32) -> Result<()> {
        assert!(position <= self.size_bytes);
        let writer = self.writer.as_ref().expect("truncate a sealed segment");
        writer.set_len(position).map_err(|e| StorageError::io(&*self.log_path, e))?;
        self.size_bytes = position;
        self.trusted_from = self.trusted_from.min(position);
        let end = self.rebuild(false, index_max_bytes, index_interval_bytes, i64::MAX)?;
        self.txn_index.truncate_to(self.next_offset)?;
        match end.error {
            None => Ok(()),
            Some(reason) => Err(StorageError::CorruptFile { file: self.log_path.to_path_buf(), reason }),
        }
    }

    /// Cuts the file at `position` after a recovery walk that stopped there
    /// (the indexes already end before it).
    pub fn truncate_file(&mut self, position: u64) -> Result<()> {
        let file =
            OpenOptions::new().write(true).open(&*self.log_path).map_err(|e| StorageError::io(&*self.log_path, e))?;
        file.set_len(position).map_err(|e| StorageError::io(&*self.log_path, e))?;
        self.size_bytes = position;
        self.trusted_from = self.trusted_from.min(position);
        self.offset_index.truncate_to_position(position);
        if let Some(rel) = self.relative(self.next_offset) {
            self.time_index.truncate_to_offset(rel);
        }
        if position == 0 {
            self.first_batch_max_timestamp = None;
        }
        self.txn_index.truncate_to(self.next_offset)
    }

    /// fsyncs the log file and the indexes.
    pub fn flush(&self) -> Result<()> {
        self.reader.sync_all().map_err(|e| StorageError::io(&*self.log_path, e))?;
        self.offset_index.flush()?;
        self.time_index.flush()?;
        self.txn_index.flush()
    }

    /// The bytes this process has not checked yet, if any (see `trusted_from`).
    pub fn unverified(&self) -> Option<(u64, u64)> {
        let start = self.verified_end.load(Ordering::Relaxed);
        let end = self.trusted_from.min(self.size_bytes);
        (start < end).then_some((start, end))
    }

    /// When the whole segment was last verified (0: never).
    pub fn scrubbed_ms(&self) -> i64 {
        self.scrubbed_ms.load(Ordering::Relaxed)
    }

    /// The index entry at or before `offset`: (byte position, offset of the
    /// batch there), or the start of the segment. A check that starts here
    /// knows the first batch's offset from the index, not from the header.
    fn index_anchor(&self, offset: i64) -> (u64, i64, bool) {
        match self.relative(offset).and_then(|rel| self.offset_index.lookup(rel)) {
            Some(e) => (e.position as u64, self.base_offset + e.relative_offset as i64, true),
            None => (0, self.base_offset, false),
        }
    }

    /// Checks the batches a read serves from byte `start` (a batch boundary
    /// found for `offset`) to `end` where they overlap bytes not verified yet:
    /// every batch's framing and CRC-32C, offsets increasing from the index
    /// entry at or before `offset` and ending at or before `limit` (the next
    /// segment's base, or the log end). A verified prefix grows as it goes.
    pub fn check_served(&self, offset: i64, start: u64, end: u64, limit: i64) -> Result<()> {
        let Some((from, to)) = self.unverified() else { return Ok(()) };
        if end <= from || start >= to {
            return Ok(());
        }
        let (anchor, expected, exact) = self.index_anchor(offset);
        let anchor = if anchor <= start { anchor } else { 0 };
        let (expected, exact) = if anchor == 0 && !exact { (self.base_offset, false) } else { (expected, exact) };
        let walked = walk(&self.reader, &self.log_path, end, anchor, expected, true, exact, limit, &mut |_| {})?;
        self.damage_or_verified(anchor, walked, end)
    }

    /// A scrub of the whole segment (or of the part before `trusted_from`
    /// when active): the same checks as [`Segment::check_served`], without
    /// the log's lock (sealed bytes never change), pausing through `pace`
    /// after each batch so the read rate stays bounded.
    pub fn scrub_job(&self, limit: i64) -> ScrubJob {
        let end = if self.is_active() { self.trusted_from.min(self.size_bytes) } else { self.size_bytes };
        ScrubJob {
            reader: Arc::clone(&self.reader),
            path: Arc::clone(&self.log_path),
            base_offset: self.base_offset,
            end,
            limit,
        }
    }

    /// Records a scrub's success; `false` if the job was for other bytes.
    pub fn finish_scrub(&self, job: &ScrubJob, now_ms: i64) -> bool {
        if !Arc::ptr_eq(&job.reader, &self.reader) {
            return false;
        }
        self.verified_end.fetch_max(job.end, Ordering::Relaxed);
        self.scrubbed_ms.store(now_ms, Ordering::Relaxed);
        true
    }

    fn damage_or_verified(&self, anchor: u64, walked: WalkEnd, end: u64) -> Result<()> {
        walked.damage(&self.log_path)?;
        if anchor <= self.verified_end.load(Ordering::Relaxed) {
            self.verified_end.fetch_max(end, Ordering::Relaxed);
        }
        Ok(())
    }

    /// fsyncs the transaction index alone (after a rebuild).
    pub fn flush_txn_index(&self) -> Result<()> {
        self.txn_index.flush()
    }

    /// The aborted transactions whose marker is in this segment, in marker order.
    pub fn aborted_txns(&self) -> &[TxnIndexEntry] {
        self.txn_index.entries()
    }

    /// Records an aborted transaction whose marker is in this segment.
    pub fn append_aborted_txn(&mut self, entry: TxnIndexEntry) -> Result<()> {
        self.txn_index.append(entry)
    }

    /// Creates the (possibly empty) transaction index file: cleaned segments
    /// always have one so the swap can rename it.
    pub fn ensure_txn_index_file(&mut self) -> Result<()> {
        self.txn_index.ensure_file()
    }

    /// Forgets the transaction index before it is rebuilt by a replay.
    pub fn reset_txn_index(&mut self) -> Result<()> {
        self.txn_index.reset()
    }

    /// The read handle, shared with file slices.
    pub fn reader(&self) -> (&Arc<File>, &Arc<PathBuf>) {
        (&self.reader, &self.log_path)
    }

    /// Removes the segment's files: the log first, so a crash part way leaves
    /// only orphan index files, which open() removes.
    pub fn delete_files(&self) -> Result<()> {
        for path in [&*self.log_path, self.offset_index.path(), self.time_index.path(), self.txn_index.path()] {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(path, e)),
            }
        }
        Ok(())
    }
}

/// A scrub of one segment, run without the log's lock (see [`Segment::scrub_job`]).
#[derive(Debug)]
pub struct ScrubJob {
    reader: Arc<File>,
    path: Arc<PathBuf>,
    base_offset: i64,
    end: u64,
    limit: i64,
}

impl ScrubJob {
    pub fn bytes(&self) -> u64 {
        self.end
    }
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Verifies every batch (framing, CRC-32C, offsets in order and below
    /// the segment's end), calling `pace(bytes)` after each batch so the
    /// caller can bound the read rate or stop (by returning false; the
    /// result is then `Ok(false)`).
    pub fn run(&self, pace: &mut dyn FnMut(u64) -> bool) -> Result<bool> {
        let mut stopped = false;
        let walked =
            walk(&self.reader, &self.path, self.end, 0, self.base_offset, true, false, self.limit, &mut |m| {
                if !stopped && !pace(m.total_bytes) {
                    stopped = true;
                }
            })?;
        if stopped {
            return Ok(false);
        }
        walked.damage(&self.path)?;
        Ok(true)
    }
}

/// Reads a file through a window of whole chunks, for walking batches.
struct ChunkReader<'a> {
    file: &'a File,
    path: &'a Path,
    start: u64,
    buf: Vec<u8>,
}

impl ChunkReader<'_> {
    /// `len` bytes at `position`; the caller checked they are inside a file of `size` bytes.
    fn get(&mut self, position: u64, len: usize, size: u64) -> Result<&[u8]> {
        let end = position + len as u64;
        debug_assert!(end <= size);
        if position < self.start || end > self.start + self.buf.len() as u64 {
            let want = (len.max(SCAN_CHUNK_BYTES) as u64).min(size - position) as usize;
            self.buf.resize(want, 0);
            self.file.read_exact_at(&mut self.buf, position).map_err(|e| StorageError::io(self.path, e))?;
            self.start = position;
        }
        let at = (position - self.start) as usize;
        Ok(&self.buf[at..at + len])
    }
}

/// Walks the batches of a file of `size` bytes from `position`, expecting
/// increasing, non-overlapping offsets from `expected_offset` on (with
/// `exact_first` the first batch must start exactly there) and below
/// `limit` (where the next segment starts; `i64::MAX` when unknown). Calls
/// `f` for each good batch and stops at the first torn, corrupt or
/// out-of-order one. A batch that starts past the expected offset (a gap,
/// as compaction leaves) followed by one that goes back is the damaged one
/// (its base offset is outside the CRC): the walk stops at it, and `f` is
/// only called for a gapped batch once the next one confirms it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk(
    file: &File,
    path: &Path,
    size: u64,
    mut position: u64,
    expected_offset: i64,
    validate: bool,
    exact_first: bool,
    limit: i64,
    f: &mut dyn FnMut(&BatchMeta),
) -> Result<WalkEnd> {
    let mut reader = ChunkReader { file, path, start: 0, buf: Vec::new() };
    let mut next_offset = expected_offset;
    let mut first = true;
    // The last batch, if it started past the expected offset, and the offset expected before it.
    let mut gapped: Option<(BatchMeta, i64)> = None;
    let error = loop {
        if position >= size {
            break None;
        }
        let remaining = size - position;
        if remaining < HEADER_BYTES as u64 {
            break Some(format!("torn batch header at byte {position}: {remaining} bytes left"));
        }
        let head = reader.get(position, HEADER_BYTES, size)?;
        let (header, total) = match batch::parse_header(head, position as usize) {
            Ok(h) => h,
            Err(e) => break Some(e.to_string()),
        };
        if total as u64 > remaining {
            break Some(format!("torn batch at byte {position}: {total} bytes, {remaining} left"));
        }
        let meta = BatchMeta {
            position,
            base_offset: header.base_offset(),
            last_offset: header.base_offset().saturating_add(header.last_offset_delta() as i64),
            max_timestamp: header.max_timestamp(),
            total_bytes: total as u64,
        };
        if validate {
            if let Err(e) = batch::validate(reader.get(position, total, size)?, position as usize) {
                break Some(e.to_string());
            }
        }
        // Offsets increase and batches never overlap. The log cleaner leaves
        // gaps (removed batches), so a batch may start after the previous
        // one's end; `exact_first` demands the first batch start exactly at
        // `expected_offset` (a walk resuming at an indexed batch).
        let in_order =
            if first && exact_first { meta.base_offset == next_offset } else { meta.base_offset >= next_offset };
        if !in_order || meta.last_offset < meta.base_offset || meta.last_offset >= limit {
            if let Some((g, before)) = gapped.take().filter(|_| !in_order) {
                // The gap was the damage: stop before the batch that made it.
                return Ok(WalkEnd {
                    position: g.position,
                    next_offset: before,
                    error: Some(format!(
                        "batch at byte {} claims offsets {}..={} after offset {before}, but the next batch starts at {}",
                        g.position, g.base_offset, g.last_offset, meta.base_offset
                    )),
                });
            }
            let bound =
                if meta.last_offset >= limit { format!(" (the segment ends at {limit})") } else { String::new() };
            break Some(format!(
                "batch at byte {position} has offsets {}..={}, expected {next_offset}{bound}",
                meta.base_offset, meta.last_offset
            ));
        }
        if let Some((g, _)) = gapped.take() {
            f(&g);
        }
        if meta.base_offset > next_offset {
            gapped = Some((meta, next_offset));
        } else {
            f(&meta);
        }
        next_offset = meta.last_offset + 1;
        position += meta.total_bytes;
        first = false;
    };
    if let Some((g, _)) = gapped {
        f(&g);
    }
    Ok(WalkEnd { position, next_offset, error })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{build_test_batch, set_base_offset};

    fn batches(base: i64, count: usize) -> (Vec<u8>, Vec<BatchMeta>) {
        let mut buf = Vec::new();
        let mut metas = Vec::new();
        let mut offset = base;
        for i in 0..count {
            let mut b = build_test_batch(0, 1_000 + i as i64, &[&[7u8; 100], &[8u8; 50]]);
            set_base_offset(&mut b, offset);
            metas.push(BatchMeta {
                position: buf.len() as u64,
                base_offset: offset,
                last_offset: offset + 1,
                max_timestamp: 1_000 + i as i64,
                total_bytes: b.len() as u64,
            });
            buf.extend_from_slice(&b);
            offset += 2;
        }
        (buf, metas)
    }

    #[test]
    fn append_find_and_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        let mut seg = Segment::create(dir.path(), 100, 1024, 0).unwrap();
        let (buf, metas) = batches(100, 20);
        seg.append(&buf, &metas, 500).unwrap();
        assert_eq!(seg.next_offset(), 140);
        assert_eq!(seg.max_timestamp(), 1_019);
        assert_eq!(seg.offset_of_max_timestamp(), 138);
        assert!(seg.offset_index.len() > 2);
        for offset in 100..140 {
            let m = seg.find_batch(offset).unwrap().unwrap();
            assert!(m.base_offset <= offset && offset <= m.last_offset);
        }
        assert_eq!(seg.find_batch(140).unwrap(), None);
        assert_eq!(seg.find_timestamp(1_005, 0).unwrap().unwrap().base_offset, 110);
        assert_eq!(seg.find_timestamp(1_005, 120).unwrap().unwrap().base_offset, 120);
        let entries = seg.offset_index.len();
        let end = seg.rebuild(true, 1024, 500, i64::MAX).unwrap();
        assert_eq!(end, WalkEnd { position: buf.len() as u64, next_offset: 140, error: None });
        assert_eq!(seg.offset_index.len(), entries);
        seg.seal().unwrap();
        assert_eq!(seg.time_index.last().unwrap().timestamp, 1_019);
    }

    #[test]
    fn sealed_segment_reopens_with_max_timestamp_and_valid_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut seg = Segment::create(dir.path(), 0, 1024, 0).unwrap();
        let (buf, metas) = batches(0, 10);
        seg.append(&buf, &metas, 300).unwrap();
        seg.seal().unwrap();
        drop(seg);
        let mut seg = Segment::open(dir.path(), 0, 0).unwrap();
        assert_eq!(seg.max_timestamp(), 1_009);
        seg.set_next_offset(20);
        assert!(seg.indexes_valid());
        assert!(seg.verify_tail().unwrap());
        assert_eq!(seg.next_offset(), 20);
    }

    #[test]
    fn truncation_and_corrupt_walk() {
        let dir = tempfile::tempdir().unwrap();
        let mut seg = Segment::create(dir.path(), 0, 1024, 0).unwrap();
        let (buf, metas) = batches(0, 10);
        seg.append(&buf, &metas, 300).unwrap();
        seg.truncate_to(metas[5].position, 1024, 300).unwrap();
        assert_eq!(seg.next_offset(), 10);
        assert_eq!(seg.max_timestamp(), 1_004);
        assert_eq!(seg.find_batch(10).unwrap(), None);
        // Garble a byte of batch 3: a validating walk stops there.
        let file = OpenOptions::new().write(true).open(seg.log_path()).unwrap();
        file.write_all_at(&[0xff], metas[3].position + 70).unwrap();
        let end = seg.rebuild(true, 1024, 300, i64::MAX).unwrap();
        assert_eq!(end.position, metas[3].position);
        assert_eq!(end.next_offset, 6);
        assert!(end.error.unwrap().contains("CRC"));
        assert!(!seg.verify_tail().unwrap());
    }
}
