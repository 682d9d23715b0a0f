//! Records inside a v2 batch: decompression, the varint record framing, and
//! re-encoding a batch that keeps only some of its records (for the log
//! cleaner). The codecs are kafka-protocol's (gzip, snappy with xerial
//! framing, LZ4 frame format, zstd), which are Kafka's.
//!
//! Record layout (Kafka protocol guide, "Record"): length varint, attributes
//! i8, timestampDelta varlong, offsetDelta varint, keyLength varint, key,
//! valueLength varint, value, header count varint, headers. A record's bytes
//! are kept verbatim when its batch is rewritten: its deltas stay right
//! because the rewritten batch keeps its base offset and base timestamp.

use std::ops::Range;

use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::compression::{Compressor, Decompressor, Gzip, Lz4, Snappy, Zstd};

use crate::batch::{self, BatchError, HEADER_BYTES};

/// One record of a decompressed records buffer, by byte ranges into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordRef {
    /// The whole record, length prefix included.
    pub bytes: Range<usize>,
    pub timestamp_delta: i64,
    pub offset_delta: i32,
    /// `None` for a null key.
    pub key: Option<Range<usize>>,
    /// False for a null value (a tombstone).
    pub has_value: bool,
    /// The value, `None` when null.
    pub value: Option<Range<usize>>,
}

fn invalid(position: usize, reason: impl Into<String>) -> BatchError {
    BatchError::InvalidRecords { position, reason: reason.into() }
}

/// Reads a zigzag varint (at most 10 bytes) at `*at`.
fn varlong(buf: &[u8], at: &mut usize) -> Option<i64> {
    let mut z = 0u64;
    for shift in (0..70).step_by(7) {
        let b = *buf.get(*at)?;
        *at += 1;
        z |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    None
}

fn varint(buf: &[u8], at: &mut usize) -> Option<i32> {
    i32::try_from(varlong(buf, at)?).ok()
}

/// A nullable byte field (varint length, -1 for null) at `*at`, within `end`.
fn bytes_field(buf: &[u8], at: &mut usize, end: usize) -> Option<Option<Range<usize>>> {
    let len = varint(buf, at)?;
    if len < 0 {
        return (len == -1).then_some(None);
    }
    let start = *at;
    *at = start.checked_add(len as usize).filter(|&e| e <= end)?;
    Some(Some(start..*at))
}

fn take<B: Buf>(b: &mut B) -> anyhow::Result<Vec<u8>> {
    Ok(b.copy_to_bytes(b.remaining()).to_vec())
}

/// The batch's records section, decompressed. `batch` is one whole batch.
pub(crate) fn records_bytes(batch: &[u8], position: usize) -> Result<Vec<u8>, BatchError> {
    let (header, total) = batch::peek_header(batch, position)?;
    let mut body = &batch[HEADER_BYTES..total];
    let fail = |e: anyhow::Error| invalid(position, format!("cannot decompress records: {e:#}"));
    match header.compression_codec() {
        0 => Ok(body.to_vec()),
        1 => Gzip::decompress(&mut body, take).map_err(fail),
        2 => Snappy::decompress(&mut body, take).map_err(fail),
        3 => Lz4::decompress(&mut body, take).map_err(fail),
        4 => Zstd::decompress(&mut body, take).map_err(fail),
        codec => Err(BatchError::UnknownCompression { position, codec }),
    }
}

/// Compresses a records section with `codec` (the batch attributes' codec id).
pub(crate) fn compress(codec: i16, raw: &[u8], position: usize) -> Result<Vec<u8>, BatchError> {
    let mut out = Vec::with_capacity(raw.len() / 2 + 64);
    let fill = |b: &mut BytesMut| {
        b.put_slice(raw);
        Ok(())
    };
    let fail = |e: anyhow::Error| invalid(position, format!("cannot compress records: {e:#}"));
    match codec {
        0 => out.extend_from_slice(raw),
        1 => Gzip::compress(&mut out, fill).map_err(fail)?,
        2 => Snappy::compress(&mut out, fill).map_err(fail)?,
        3 => Lz4::compress(&mut out, fill).map_err(fail)?,
        4 => Zstd::compress(&mut out, fill).map_err(fail)?,
        codec => return Err(BatchError::UnknownCompression { position, codec }),
    }
    Ok(out)
}

/// Splits a decompressed records section into `count` records.
pub(crate) fn parse(raw: &[u8], count: i32, position: usize) -> Result<Vec<RecordRef>, BatchError> {
    let mut out = Vec::with_capacity(count.clamp(0, 4096) as usize);
    let mut at = 0usize;
    for i in 0..count {
        let bad = |what: &str| invalid(position, format!("record {i}: {what}"));
        let start = at;
        let len = varint(raw, &mut at).filter(|&l| l > 0).ok_or_else(|| bad("bad length"))?;
        let end = at.checked_add(len as usize).filter(|&e| e <= raw.len()).ok_or_else(|| bad("runs past the batch"))?;
        at += 1; // attributes
        let timestamp_delta = varlong(raw, &mut at).ok_or_else(|| bad("bad timestamp delta"))?;
        let offset_delta = varint(raw, &mut at).ok_or_else(|| bad("bad offset delta"))?;
        let key = bytes_field(raw, &mut at, end).ok_or_else(|| bad("bad key"))?;
        let value = bytes_field(raw, &mut at, end).ok_or_else(|| bad("bad value"))?;
        if at > end {
            return Err(bad("fields run past the record"));
        }
        out.push(RecordRef {
            bytes: start..end,
            timestamp_delta,
            offset_delta,
            key,
            has_value: value.is_some(),
            value,
        });
        at = end;
    }
    if at != raw.len() {
        return Err(invalid(position, format!("{} bytes after the last of {count} records", raw.len() - at)));
    }
    Ok(out)
}

/// Checks the framing of `count` uncompressed records (a batch's records
/// section) without keeping them: each length fits, the offset deltas are
/// 0, 1, 2, ..., and the records end exactly at the end of `raw`. Returns
/// the largest timestamp delta. Reads only the varints before the key.
pub(crate) fn check_uncompressed(raw: &[u8], count: i32, position: usize) -> Result<i64, BatchError> {
    let mut at = 0usize;
    let mut max_delta = i64::MIN;
    for i in 0..count {
        let bad = |what: String| invalid(position, format!("record {i}: {what}"));
        let len = varint(raw, &mut at).filter(|&l| l > 0).ok_or_else(|| bad("bad length".into()))?;
        let end = at
            .checked_add(len as usize)
            .filter(|&e| e <= raw.len())
            .ok_or_else(|| bad("runs past the batch".into()))?;
        let mut field = at + 1; // attributes
        let timestamp_delta = varlong(raw, &mut field).ok_or_else(|| bad("bad timestamp delta".into()))?;
        let offset_delta = varint(raw, &mut field).ok_or_else(|| bad("bad offset delta".into()))?;
        if field > end {
            return Err(bad("fields run past the record".into()));
        }
        if offset_delta != i {
            return Err(bad(format!("offset delta {offset_delta}, expected {i}")));
        }
        max_delta = max_delta.max(timestamp_delta);
        at = end;
    }
    if at != raw.len() {
        return Err(invalid(position, format!("{} bytes after the last of {count} records", raw.len() - at)));
    }
    Ok(max_delta)
}

/// Decompresses and splits one whole batch.
pub(crate) fn decode(batch: &[u8], position: usize) -> Result<(Vec<u8>, Vec<RecordRef>), BatchError> {
    let (header, _) = batch::peek_header(batch, position)?;
    let count = header.record_count();
    let raw = records_bytes(batch, position)?;
    let records = parse(&raw, count, position)?;
    Ok((raw, records))
}

/// Re-encodes `original` keeping only `keep` (records of `raw`, its decoded
/// records section, in order, at least one): same base offset, leader epoch,
/// attributes, lastOffsetDelta, base timestamp, producer id/epoch and base
/// sequence; the max timestamp is recomputed from the kept records (unless
/// the batch uses LogAppendTime); recompressed with the same codec; new CRC.
pub(crate) fn rewrite(
    original: &[u8],
    raw: &[u8],
    keep: &[&RecordRef],
    position: usize,
) -> Result<Vec<u8>, BatchError> {
    let (header, _) = batch::peek_header(original, position)?;
    let mut kept = Vec::with_capacity(raw.len());
    for r in keep {
        kept.extend_from_slice(&raw[r.bytes.clone()]);
    }
    let body = compress(header.compression_codec(), &kept, position)?;
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&original[..HEADER_BYTES]);
    out.extend_from_slice(&body);
    let batch_length = i32::try_from(out.len() - batch::LOG_OVERHEAD).map_err(|_| invalid(position, "too large"))?;
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    if !header.is_log_append_time() {
        let base = header.base_timestamp();
        let max = keep.iter().map(|r| base.saturating_add(r.timestamp_delta)).max().unwrap_or(base);
        out[35..43].copy_from_slice(&max.to_be_bytes());
    }
    out[57..61].copy_from_slice(&(keep.len() as i32).to_be_bytes());
    let crc = crc32c::crc32c(&out[21..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}
