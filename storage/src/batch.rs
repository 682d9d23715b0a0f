//! Kafka v2 record batch headers: the only part of a batch the broker reads.
//!
//! Layout (big endian), see the Kafka protocol guide, "Record Batch":
//! ```text
//!  0 baseOffset i64 | 8 batchLength i32 | 12 partitionLeaderEpoch i32 | 16 magic i8
//! 17 crc u32 (CRC-32C of bytes 21..end) | 21 attributes i16 | 23 lastOffsetDelta i32
//! 27 baseTimestamp i64 | 35 maxTimestamp i64 | 43 producerId i64 | 51 producerEpoch i16
//! 53 baseSequence i32 | 57 recordCount i32 | 61 records...
//! ```
//! baseOffset, batchLength, partitionLeaderEpoch and magic sit outside the CRC, so
//! the broker can assign offsets and stamp the leader epoch without touching it.

use std::fmt;

/// Size of the fixed v2 batch header.
pub const HEADER_BYTES: usize = 61;
/// Bytes before the `batchLength` field's coverage starts (baseOffset + batchLength).
pub const LOG_OVERHEAD: usize = 12;
/// Smallest legal `batchLength` (a header with no records).
pub const BATCH_LENGTH_MIN: usize = HEADER_BYTES - LOG_OVERHEAD;

const OFF_BASE_OFFSET: usize = 0;
const OFF_BATCH_LENGTH: usize = 8;
const OFF_LEADER_EPOCH: usize = 12;
const OFF_MAGIC: usize = 16;
const OFF_CRC: usize = 17;
const OFF_ATTRIBUTES: usize = 21;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_BASE_TIMESTAMP: usize = 27;
const OFF_MAX_TIMESTAMP: usize = 35;
const OFF_PRODUCER_ID: usize = 43;
const OFF_PRODUCER_EPOCH: usize = 51;
const OFF_BASE_SEQUENCE: usize = 53;
const OFF_RECORD_COUNT: usize = 57;

const ATTR_COMPRESSION_MASK: i16 = 0x07;
const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;

/// Why a batch was refused. The broker maps these to Kafka error codes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// Fewer bytes than a header, or a `batchLength` that runs past the buffer.
    Truncated { position: usize },
    /// `batchLength` smaller than a header.
    LengthTooSmall { position: usize, batch_length: i32 },
    /// Not a v2 batch.
    UnsupportedMagic { position: usize, magic: i8 },
    /// Stored CRC-32C does not match the bytes.
    CrcMismatch { position: usize, stored: u32, computed: u32 },
    /// recordCount / lastOffsetDelta disagree or are negative.
    InvalidOffsets { position: usize, record_count: i32, last_offset_delta: i32 },
    /// Compression codec id outside 0..=4.
    UnknownCompression { position: usize, codec: i16 },
    /// The records inside the batch cannot be decompressed or parsed (only
    /// found where records are decoded: [`all_records_have_keys`] and the log cleaner).
    InvalidRecords { position: usize, reason: String },
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::Truncated { position } => {
                write!(f, "batch at byte {position} is truncated")
            }
            BatchError::LengthTooSmall { position, batch_length } => {
                write!(f, "batch at byte {position} has batchLength {batch_length}, below the header size")
            }
            BatchError::UnsupportedMagic { position, magic } => {
                write!(f, "batch at byte {position} has magic {magic}, only v2 is supported")
            }
            BatchError::CrcMismatch { position, stored, computed } => {
                write!(f, "batch at byte {position} has CRC-32C {stored:#010x}, computed {computed:#010x}")
            }
            BatchError::InvalidOffsets { position, record_count, last_offset_delta } => {
                write!(f, "batch at byte {position} has {record_count} records but lastOffsetDelta {last_offset_delta}")
            }
            BatchError::UnknownCompression { position, codec } => {
                write!(f, "batch at byte {position} uses unknown compression codec {codec}")
            }
            BatchError::InvalidRecords { position, reason } => {
                write!(f, "batch at byte {position} has invalid records: {reason}")
            }
        }
    }
}

impl std::error::Error for BatchError {}

/// A borrowed view of one batch's header fields.
#[derive(Debug, Clone, Copy)]
pub struct BatchHeader<'a> {
    bytes: &'a [u8],
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl<'a> BatchHeader<'a> {
    /// Wraps `bytes`, which must hold at least [`HEADER_BYTES`]; the caller has checked.
    fn new(bytes: &'a [u8]) -> Self {
        debug_assert!(bytes.len() >= HEADER_BYTES);
        BatchHeader { bytes }
    }
    pub fn base_offset(&self) -> i64 {
        be_i64(self.bytes, OFF_BASE_OFFSET)
    }
    pub fn batch_length(&self) -> i32 {
        be_i32(self.bytes, OFF_BATCH_LENGTH)
    }
    /// Whole size of the batch on disk and on the wire.
    pub fn total_bytes(&self) -> usize {
        LOG_OVERHEAD + self.batch_length() as usize
    }
    pub fn partition_leader_epoch(&self) -> i32 {
        be_i32(self.bytes, OFF_LEADER_EPOCH)
    }
    pub fn magic(&self) -> i8 {
        self.bytes[OFF_MAGIC] as i8
    }
    pub fn crc(&self) -> u32 {
        be_u32(self.bytes, OFF_CRC)
    }
    pub fn attributes(&self) -> i16 {
        be_i16(self.bytes, OFF_ATTRIBUTES)
    }
    pub fn compression_codec(&self) -> i16 {
        self.attributes() & ATTR_COMPRESSION_MASK
    }
    pub fn is_log_append_time(&self) -> bool {
        self.attributes() & ATTR_TIMESTAMP_TYPE != 0
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes() & ATTR_TRANSACTIONAL != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes() & ATTR_CONTROL != 0
    }
    pub fn last_offset_delta(&self) -> i32 {
        be_i32(self.bytes, OFF_LAST_OFFSET_DELTA)
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset() + self.last_offset_delta() as i64
    }
    pub fn base_timestamp(&self) -> i64 {
        be_i64(self.bytes, OFF_BASE_TIMESTAMP)
    }
    pub fn max_timestamp(&self) -> i64 {
        be_i64(self.bytes, OFF_MAX_TIMESTAMP)
    }
    pub fn producer_id(&self) -> i64 {
        be_i64(self.bytes, OFF_PRODUCER_ID)
    }
    pub fn producer_epoch(&self) -> i16 {
        be_i16(self.bytes, OFF_PRODUCER_EPOCH)
    }
    pub fn base_sequence(&self) -> i32 {
        be_i32(self.bytes, OFF_BASE_SEQUENCE)
    }
    pub fn record_count(&self) -> i32 {
        be_i32(self.bytes, OFF_RECORD_COUNT)
    }
}

/// Reads the header of the batch at the start of `buf` and checks its framing
/// (length and magic) but not its CRC. Returns the header and the batch's
/// total size. `position` is only used to describe errors.
pub fn peek_header(buf: &[u8], position: usize) -> Result<(BatchHeader<'_>, usize), BatchError> {
    if buf.len() < HEADER_BYTES {
        return Err(BatchError::Truncated { position });
    }
    let header = BatchHeader::new(buf);
    let batch_length = header.batch_length();
    if batch_length < BATCH_LENGTH_MIN as i32 {
        return Err(BatchError::LengthTooSmall { position, batch_length });
    }
    let total = LOG_OVERHEAD + batch_length as usize;
    if buf.len() < total {
        return Err(BatchError::Truncated { position });
    }
    if header.magic() != 2 {
        return Err(BatchError::UnsupportedMagic { position, magic: header.magic() });
    }
    Ok((BatchHeader::new(&buf[..total]), total))
}

/// Reads only the fixed header at the start of `buf` (which must hold at
/// least [`HEADER_BYTES`]; the rest of the batch need not be there) and checks
/// its length field and magic. Returns the header and the batch's total size.
/// Used to walk a segment file by positioned reads of headers alone.
pub fn parse_header(buf: &[u8], position: usize) -> Result<(BatchHeader<'_>, usize), BatchError> {
    if buf.len() < HEADER_BYTES {
        return Err(BatchError::Truncated { position });
    }
    let header = BatchHeader::new(&buf[..HEADER_BYTES]);
    let batch_length = header.batch_length();
    if batch_length < BATCH_LENGTH_MIN as i32 {
        return Err(BatchError::LengthTooSmall { position, batch_length });
    }
    if header.magic() != 2 {
        return Err(BatchError::UnsupportedMagic { position, magic: header.magic() });
    }
    Ok((header, LOG_OVERHEAD + batch_length as usize))
}

/// Fully validates one batch: framing, magic, CRC-32C, record count against
/// lastOffsetDelta, compression codec. This is the only per-batch work on the
/// produce path and in recovery; records themselves are never decoded.
pub fn validate(buf: &[u8], position: usize) -> Result<(BatchHeader<'_>, usize), BatchError> {
    let (header, total) = peek_header(buf, position)?;
    let computed = crc32c::crc32c(&buf[OFF_ATTRIBUTES..total]);
    if computed != header.crc() {
        return Err(BatchError::CrcMismatch { position, stored: header.crc(), computed });
    }
    let record_count = header.record_count();
    let last_offset_delta = header.last_offset_delta();
    // Compacted batches may have fewer records than offsets, but never more,
    // and a batch always has at least one offset. Client batches are dense.
    if record_count < 0 || last_offset_delta < 0 || record_count as i64 > last_offset_delta as i64 + 1 {
        return Err(BatchError::InvalidOffsets { position, record_count, last_offset_delta });
    }
    let codec = header.compression_codec();
    if codec > 4 {
        return Err(BatchError::UnknownCompression { position, codec });
    }
    Ok((header, total))
}

/// Who is appending, as Kafka's `AppendOrigin`: batches from clients get the
/// checks Kafka's `LogValidator` applies to producer input; batches the
/// broker's coordinators built themselves need only the framing and CRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOrigin {
    Client,
    Coordinator,
}

/// A compressed client batch may claim at most this many records per byte of
/// its compressed records section. Every record is at least 7 bytes before
/// compression and differs from the last in its offset delta, so no Kafka
/// codec gets near 2 records per byte on a valid batch; an absurd count
/// would make the batch consume billions of offsets (and roll a segment per
/// request) without being decompressed.
pub const MAX_RECORDS_PER_COMPRESSED_BYTE: i64 = 8;

/// The checks of Kafka's `LogValidator` for a batch from a producer, on a
/// batch whose framing and CRC are already good: the record count is exactly
/// `lastOffsetDelta + 1` (clients never send compaction gaps); for
/// uncompressed records, their lengths fill the batch exactly, their offset
/// deltas are 0, 1, 2, ... and the header's maxTimestamp is their largest
/// timestamp (CreateTime); for compressed ones, a count the bytes could hold.
/// Only the record framing varints are read: no record is copied.
pub fn check_client_batch(batch: &[u8], position: usize) -> Result<(), BatchError> {
    let (header, total) = peek_header(batch, position)?;
    let record_count = header.record_count();
    let last_offset_delta = header.last_offset_delta();
    if record_count <= 0 || last_offset_delta < 0 || record_count as i64 != last_offset_delta as i64 + 1 {
        return Err(BatchError::InvalidOffsets { position, record_count, last_offset_delta });
    }
    let body = &batch[HEADER_BYTES..total];
    if header.compression_codec() != 0 {
        if record_count as i64 > body.len() as i64 * MAX_RECORDS_PER_COMPRESSED_BYTE {
            return Err(BatchError::InvalidRecords {
                position,
                reason: format!("{record_count} records cannot fit {} compressed bytes", body.len()),
            });
        }
        return Ok(());
    }
    let max_delta = crate::records::check_uncompressed(body, record_count, position)?;
    if !header.is_log_append_time() {
        let max = header.base_timestamp().saturating_add(max_delta);
        if max != header.max_timestamp() {
            return Err(BatchError::InvalidRecords {
                position,
                reason: format!(
                    "maxTimestamp {} but the largest record timestamp is {max} (baseTimestamp {})",
                    header.max_timestamp(),
                    header.base_timestamp()
                ),
            });
        }
    }
    Ok(())
}

/// Summary of a run of batches, as appended or recovered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchesInfo {
    pub batch_count: usize,
    /// Sum of `lastOffsetDelta + 1` over the batches: the offsets they consume.
    pub offset_count: i64,
    pub record_count: i64,
    pub max_timestamp: i64,
    /// Position (index into the batches) of the batch holding `max_timestamp`.
    pub max_timestamp_batch: usize,
    pub bytes: usize,
}

/// Validates every batch in `buf` (which must be whole batches, nothing
/// else); client batches also get [`check_client_batch`].
pub fn validate_all(buf: &[u8], origin: AppendOrigin) -> Result<BatchesInfo, BatchError> {
    let mut info = BatchesInfo {
        batch_count: 0,
        offset_count: 0,
        record_count: 0,
        max_timestamp: -1,
        max_timestamp_batch: 0,
        bytes: buf.len(),
    };
    let mut position = 0;
    while position < buf.len() {
        let (header, total) = validate(&buf[position..], position)?;
        if origin == AppendOrigin::Client {
            check_client_batch(&buf[position..position + total], position)?;
        }
        if header.max_timestamp() > info.max_timestamp {
            info.max_timestamp = header.max_timestamp();
            info.max_timestamp_batch = info.batch_count;
        }
        info.batch_count += 1;
        info.offset_count += header.last_offset_delta() as i64 + 1;
        info.record_count += header.record_count() as i64;
        position += total;
    }
    Ok(info)
}

/// Whether every record of every batch in `batches` (whole batches, as
/// handed to `append`) has a non-null key, decompressing as needed. The
/// broker refuses keyless records on `cleanup.policy=compact` topics (Kafka:
/// INVALID_RECORD, "Compacted topic cannot accept message without key").
/// Control batches are not checked.
pub fn all_records_have_keys(batches: &[u8]) -> Result<bool, BatchError> {
    let mut position = 0;
    while position < batches.len() {
        let (header, total) = peek_header(&batches[position..], position)?;
        if !header.is_control() {
            let (_, records) = crate::records::decode(&batches[position..position + total], position)?;
            if records.iter().any(|r| r.key.is_none()) {
                return Ok(false);
            }
        }
        position += total;
    }
    Ok(true)
}

/// Writes a new base offset into the batch header at the start of `batch`.
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    batch[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Bytes at the start of a batch that the log rewrites on append (base
/// offset, batch length, partition leader epoch): outside the CRC, so the
/// rest of the batch is stored exactly as the client sent it.
pub const PATCHED_PREFIX_BYTES: usize = OFF_MAGIC;

/// The first [`PATCHED_PREFIX_BYTES`] of `batch` with the log's base offset
/// and leader epoch, for a vectored write that leaves `batch` untouched.
pub fn patched_prefix(batch: &[u8], base_offset: i64, epoch: i32) -> [u8; PATCHED_PREFIX_BYTES] {
    let mut prefix = [0u8; PATCHED_PREFIX_BYTES];
    prefix.copy_from_slice(&batch[..PATCHED_PREFIX_BYTES]);
    set_base_offset(&mut prefix, base_offset);
    set_partition_leader_epoch(&mut prefix, epoch);
    prefix
}

/// Writes the partition leader epoch into the batch header at the start of `batch`.
pub fn set_partition_leader_epoch(batch: &mut [u8], epoch: i32) {
    batch[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// Iterates `(position, header, total_bytes)` over a buffer of whole, already
/// validated batches.
pub fn iter(buf: &[u8]) -> impl Iterator<Item = (usize, BatchHeader<'_>, usize)> {
    let mut position = 0;
    std::iter::from_fn(move || {
        if position >= buf.len() {
            return None;
        }
        let (header, total) = peek_header(&buf[position..], position).ok()?;
        let item = (position, header, total);
        position += total;
        Some(item)
    })
}

/// Builds a valid uncompressed v2 batch of `count` records, each with the given
/// value, for tests and benches. Not used by the broker.
pub fn build_test_batch(base_offset: i64, timestamp: i64, values: &[&[u8]]) -> Vec<u8> {
    let records: Vec<(Option<&[u8]>, &[u8])> = values.iter().map(|v| (None, *v)).collect();
    build_batch(base_offset, timestamp, 0, -1, -1, -1, &records)
}

/// Builds a valid uncompressed v2 batch of an idempotent (or, with
/// `transactional`, transactional) producer: producer id, epoch and base
/// sequence set, one record per value (null keys), base offset 0.
pub fn build_producer_batch(
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    transactional: bool,
    timestamp: i64,
    values: &[&[u8]],
) -> Vec<u8> {
    let records: Vec<(Option<&[u8]>, &[u8])> = values.iter().map(|v| (None, *v)).collect();
    let attributes = if transactional { ATTR_TRANSACTIONAL } else { 0 };
    build_batch(0, timestamp, attributes, producer_id, producer_epoch, base_sequence, &records)
}

/// Builds a transaction marker as the coordinator writes it (WriteTxnMarkers):
/// a v2 control batch (attributes: control and transactional), producer id
/// and epoch set, base sequence -1, one record with key (version 0, type:
/// 0 ABORT / 1 COMMIT) and value (version 0, coordinator epoch). Valid
/// CRC-32C, base offset 0.
pub fn build_control_batch(
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timestamp: i64,
) -> Vec<u8> {
    let key = [0, 0, 0, u8::from(commit)];
    let mut value = [0u8; 6];
    value[2..].copy_from_slice(&coordinator_epoch.to_be_bytes());
    build_batch(
        0,
        timestamp,
        ATTR_CONTROL | ATTR_TRANSACTIONAL,
        producer_id,
        producer_epoch,
        -1,
        &[(Some(&key[..]), &value[..])],
    )
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        if z < 0x80 {
            out.push(z as u8);
            return;
        }
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

/// An uncompressed v2 batch of `records` (key, value), with CRC-32C.
fn build_batch(
    base_offset: i64,
    timestamp: i64,
    attributes: i16,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    records: &[(Option<&[u8]>, &[u8])],
) -> Vec<u8> {
    let mut body_all = Vec::new();
    for (i, (key, value)) in records.iter().enumerate() {
        let mut body = Vec::new();
        body.push(0u8); // record attributes
        put_varint(&mut body, 0); // timestamp delta
        put_varint(&mut body, i as i64); // offset delta
        match key {
            Some(k) => {
                put_varint(&mut body, k.len() as i64);
                body.extend_from_slice(k);
            }
            None => put_varint(&mut body, -1),
        }
        put_varint(&mut body, value.len() as i64);
        body.extend_from_slice(value);
        put_varint(&mut body, 0); // no headers
        put_varint(&mut body_all, body.len() as i64);
        body_all.extend_from_slice(&body);
    }
    let count = records.len().max(1) as i32;
    let mut b = Vec::with_capacity(HEADER_BYTES + body_all.len());
    b.extend_from_slice(&base_offset.to_be_bytes());
    b.extend_from_slice(&((BATCH_LENGTH_MIN + body_all.len()) as i32).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes()); // leader epoch
    b.push(2); // magic
    b.extend_from_slice(&0u32.to_be_bytes()); // crc placeholder
    b.extend_from_slice(&attributes.to_be_bytes());
    b.extend_from_slice(&(count - 1).to_be_bytes());
    b.extend_from_slice(&timestamp.to_be_bytes());
    b.extend_from_slice(&timestamp.to_be_bytes());
    b.extend_from_slice(&producer_id.to_be_bytes());
    b.extend_from_slice(&producer_epoch.to_be_bytes());
    b.extend_from_slice(&base_sequence.to_be_bytes());
    b.extend_from_slice(&(records.len() as i32).to_be_bytes());
    b.extend_from_slice(&body_all);
    let crc = crc32c::crc32c(&b[OFF_ATTRIBUTES..]);
    b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    b
}

/// Kafka's `DefaultRecordBatch.incrementSequence`: sequences wrap from
/// `i32::MAX` to 0.
pub fn increment_sequence(sequence: i32, increment: i32) -> i32 {
    if sequence > i32::MAX - increment {
        increment - (i32::MAX - sequence) - 1
    } else {
        sequence + increment
    }
}

/// An end-transaction marker (the record of a control batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndTxnMarker {
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// Reads the end-transaction marker of a whole control batch: `Ok(None)` for
/// a control batch with no records (cleaned away) or whose record is not a
/// COMMIT/ABORT marker (e.g. a KRaft control record); an error if the record
/// cannot be parsed. Only the one tiny record of a control batch is decoded.
pub fn parse_end_txn_marker(batch: &[u8], position: usize) -> Result<Option<EndTxnMarker>, BatchError> {
    let (header, _) = peek_header(batch, position)?;
    if header.record_count() == 0 {
        return Ok(None);
    }
    let (raw, recs) = crate::records::decode(batch, position)?;
    let bad = |what: &str| BatchError::InvalidRecords { position, reason: format!("control record: {what}") };
    let record = recs.first().ok_or_else(|| bad("missing"))?;
    let key = record.key.clone().map(|k| &raw[k]).ok_or_else(|| bad("null key"))?;
    if key.len() < 4 {
        return Err(bad("key shorter than 4 bytes"));
    }
    let commit = match i16::from_be_bytes([key[2], key[3]]) {
        0 => false,
        1 => true,
        _ => return Ok(None),
    };
    let value = record.value.clone().map(|v| &raw[v]).ok_or_else(|| bad("null value"))?;
    if value.len() < 6 {
        return Err(bad("end transaction marker value shorter than 6 bytes"));
    }
    let coordinator_epoch = i32::from_be_bytes(value[2..6].try_into().expect("4 bytes"));
    Ok(Some(EndTxnMarker { commit, coordinator_epoch }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_batch_validates_and_patches_without_breaking_crc() {
        let mut b = build_test_batch(0, 1_000, &[b"a", b"bc", b"def"]);
        let info = validate_all(&b, AppendOrigin::Client).unwrap();
        assert_eq!(info.batch_count, 1);
        assert_eq!(info.offset_count, 3);
        set_base_offset(&mut b, 42);
        set_partition_leader_epoch(&mut b, 7);
        let (h, total) = validate(&b, 0).unwrap();
        assert_eq!(total, b.len());
        assert_eq!(h.base_offset(), 42);
        assert_eq!(h.last_offset(), 44);
        assert_eq!(h.partition_leader_epoch(), 7);
    }

    #[test]
    fn corrupt_byte_is_a_crc_mismatch() {
        let mut b = build_test_batch(0, 1_000, &[b"hello"]);
        let last = b.len() - 1;
        b[last] ^= 0xff;
        assert!(matches!(validate(&b, 0), Err(BatchError::CrcMismatch { .. })));
    }

    #[test]
    fn short_and_overlong_lengths_are_refused() {
        let b = build_test_batch(0, 1_000, &[b"hello"]);
        assert!(matches!(validate(&b[..b.len() - 1], 0), Err(BatchError::Truncated { .. })));
        assert!(matches!(validate(&b[..10], 0), Err(BatchError::Truncated { .. })));
        let mut small = b.clone();
        small[8..12].copy_from_slice(&3i32.to_be_bytes());
        assert!(matches!(validate(&small, 0), Err(BatchError::LengthTooSmall { .. })));
    }

    #[test]
    fn producer_and_control_batches_validate() {
        let b = build_producer_batch(7, 3, 41, true, 1_000, &[b"a", b"b"]);
        let (h, _) = validate(&b, 0).unwrap();
        assert_eq!((h.producer_id(), h.producer_epoch(), h.base_sequence()), (7, 3, 41));
        assert!(h.is_transactional() && !h.is_control());
        assert!(parse_end_txn_marker(&build_test_batch(0, 0, &[b"x"]), 0).is_err());
        for commit in [false, true] {
            let c = build_control_batch(7, 4, commit, 9, 2_000);
            let (h, _) = validate(&c, 0).unwrap();
            assert!(h.is_control() && h.is_transactional());
            assert_eq!((h.producer_id(), h.producer_epoch(), h.base_sequence(), h.record_count()), (7, 4, -1, 1));
            assert_eq!(parse_end_txn_marker(&c, 0).unwrap(), Some(EndTxnMarker { commit, coordinator_epoch: 9 }));
        }
    }

    #[test]
    fn sequences_wrap_like_kafka() {
        assert_eq!(increment_sequence(5, 3), 8);
        assert_eq!(increment_sequence(i32::MAX, 1), 0);
        assert_eq!(increment_sequence(i32::MAX - 1, 3), 1);
        assert_eq!(increment_sequence(i32::MAX, 0), i32::MAX);
    }

    #[test]
    fn known_crc32c_vector() {
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a91_36aa);
    }
}
