//! Response frames whose record bytes stay in the segment files.
//!
//! A fetch response is mostly record bytes that already sit, byte for byte, in
//! segment files. Instead of reading them into memory and copying them into the
//! encoded frame, the fetch handler puts a *placeholder* into each partition's
//! `records`: a `Bytes` of the right length pointing into [`placeholder`], a
//! large read-only anonymous mapping that is never written and never read
//! (address space only: no memory, no commit charge). [`FileRecords`] maps
//! placeholder offsets back to the file slices they stand for; every partition
//! of a response gets its own offset range.
//!
//! The response is then encoded through [`ResponseBuf`], a `ByteBufMut` that
//! copies ordinary writes into a `BytesMut` but, when the encoder hands it a
//! slice inside the placeholder region (records are written with one
//! `put_slice` after their length prefix), records where in the byte stream
//! the file bytes belong instead of copying them. The result is a [`Response`]:
//! the encoded bytes plus the file regions to splice in between, which the
//! connection's writer sends with `sendfile(2)`.
//!
//! Every other response is a plain `BytesMut` with no file regions, encoded and
//! written exactly as before.

use std::ops::Range;
use std::sync::OnceLock;

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;
use strand_storage::FileSlice;

/// Size of the placeholder address range. A response frame's size is an
/// `i32`, so no response can carry more record bytes than this; anything that
/// does not fit is copied instead (see [`FileRecords::add`]).
const PLACEHOLDER_BYTES: usize = 1 << 31;

/// The placeholder region, reserved on first use; `None` if the reservation
/// failed (fetches then copy records as they used to).
///
/// It is mapped `PROT_READ` (not `PROT_NONE`) so that the `&'static [u8]` is a
/// valid reference: the compiler may assume a reference's memory is readable.
/// Nothing reads it; if something did, it would see zeros from the kernel's
/// shared zero page, still costing no memory.
pub fn placeholder() -> Option<&'static [u8]> {
    static REGION: OnceLock<Option<&'static [u8]>> = OnceLock::new();
    *REGION.get_or_init(|| {
        // SAFETY: an anonymous private read-only mapping with no file descriptor;
        // the result is checked below and the mapping is never unmapped.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PLACEHOLDER_BYTES,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            tracing::warn!(error = %e, "cannot reserve the fetch placeholder region; fetches will copy records");
            return None;
        }
        // SAFETY: the mapping is PLACEHOLDER_BYTES long, readable, zero-filled,
        // never written (read-only) and lives for the rest of the process.
        Some(unsafe { std::slice::from_raw_parts(ptr as *const u8, PLACEHOLDER_BYTES) })
    })
}

/// A response ready for the connection's writer: a whole frame (size prefix
/// included) made of `bytes` with `files` spliced in.
#[derive(Debug)]
pub struct Response {
    pub bytes: BytesMut,
    /// In order of `at`; several regions may share an `at` (one partition's
    /// records spanning segments).
    pub files: Vec<FileRegion>,
}

impl Response {
    /// A response that is all in memory.
    pub fn bytes(bytes: BytesMut) -> Response {
        Response { bytes, files: Vec::new() }
    }

    /// Total frame length on the wire.
    pub fn len(&self) -> usize {
        self.bytes.len() + self.files.iter().map(|f| f.slice.len).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// File bytes that go on the wire right before `bytes[at]`.
#[derive(Debug, Clone)]
pub struct FileRegion {
    pub at: usize,
    pub slice: FileSlice,
}

/// The file slices a response's placeholders stand for, laid out back to back
/// from the start of the placeholder region.
#[derive(Debug, Default)]
pub struct FileRecords {
    /// Non-empty slices, in placeholder order.
    slices: Vec<FileSlice>,
    /// Placeholder offset of each slice.
    starts: Vec<usize>,
    /// Placeholder bytes handed out.
    len: usize,
}

impl FileRecords {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Returns a placeholder standing for `slices` (in order), or gives the
    /// slices back if the placeholder region is unavailable or full, in which
    /// case the caller copies them.
    pub fn add(&mut self, slices: Vec<FileSlice>) -> Result<Bytes, Vec<FileSlice>> {
        let len: usize = slices.iter().map(|s| s.len).sum();
        if len == 0 {
            return Ok(Bytes::new());
        }
        let Some(region) = placeholder() else { return Err(slices) };
        let start = self.len;
        if len > region.len() - start {
            return Err(slices);
        }
        for s in slices.into_iter().filter(|s| s.len > 0) {
            self.starts.push(self.len);
            self.len += s.len;
            self.slices.push(s);
        }
        Ok(Bytes::from_static(&region[start..start + len]))
    }

    /// Appends the file regions for placeholder bytes `range` to `out`, all at
    /// `at`; false if the range was not handed out by [`add`](Self::add).
    fn resolve(&self, range: Range<usize>, at: usize, out: &mut Vec<FileRegion>) -> bool {
        if range.end > self.len {
            return false;
        }
        // Last slice starting at or before range.start (slices are non-empty and contiguous).
        let mut i = self.starts.partition_point(|&s| s <= range.start) - 1;
        let mut pos = range.start;
        while pos < range.end {
            let s = &self.slices[i];
            let skip = pos - self.starts[i];
            let n = (s.len - skip).min(range.end - pos);
            out.push(FileRegion {
                at,
                slice: FileSlice {
                    file: s.file.clone(),
                    path: s.path.clone(),
                    position: s.position + skip as u64,
                    len: n,
                },
            });
            pos += n;
            i += 1;
        }
        true
    }
}

/// The encoding buffer for responses that may hold placeholders.
///
/// Offsets (`offset`, `seek`, `range`, which the kafka-protocol encoders use
/// for gaps filled in later) are logical: they count file regions at their
/// full length, so they are the offsets of the frame as it goes on the wire.
/// A `range` may lie anywhere except across file bytes (which cannot be
/// written); no encoder asks for that.
pub struct ResponseBuf<'a> {
    bytes: BytesMut,
    regions: Vec<FileRegion>,
    /// Sum of `regions` lengths.
    file_bytes: usize,
    records: &'a FileRecords,
    /// Address range of the placeholder region (empty if none).
    placeholder: Range<usize>,
    /// A placeholder slice that `records` does not know was written.
    unmapped: bool,
}

impl<'a> ResponseBuf<'a> {
    pub fn new(records: &'a FileRecords) -> ResponseBuf<'a> {
        let placeholder = match placeholder() {
            Some(p) => {
                let base = p.as_ptr() as usize;
                base..base + p.len()
            }
            None => 0..0,
        };
        ResponseBuf {
            bytes: BytesMut::with_capacity(256),
            regions: Vec::new(),
            file_bytes: 0,
            records,
            placeholder,
            unmapped: false,
        }
    }

    /// The encoded response, or an error if a placeholder could not be mapped
    /// back to file bytes (a bug: the frame would carry garbage).
    pub fn finish(self) -> Result<Response, String> {
        if self.unmapped {
            return Err("a records placeholder does not map to any file slice".to_string());
        }
        Ok(Response { bytes: self.bytes, files: self.regions })
    }

    /// Physical `bytes` range of logical range `r`.
    fn physical(&self, r: Range<usize>) -> Range<usize> {
        let mut before = 0;
        for region in &self.regions {
            let start = region.at + before;
            if r.end <= start {
                break;
            }
            let end = start + region.slice.len;
            assert!(r.start >= end, "range {r:?} overlaps file bytes at {start}..{end} of a response");
            before += region.slice.len;
        }
        r.start - before..r.end - before
    }
}

// SAFETY: the buffer methods forward to the inner `BytesMut`, which upholds the contract.
unsafe impl BufMut for ResponseBuf<'_> {
    fn remaining_mut(&self) -> usize {
        self.bytes.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller's guarantee (cnt bytes of chunk_mut initialised) is passed on.
        unsafe { self.bytes.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.bytes.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        let addr = src.as_ptr() as usize;
        if src.is_empty() || !self.placeholder.contains(&addr) {
            self.bytes.put_slice(src);
            return;
        }
        let start = addr - self.placeholder.start;
        if self.records.resolve(start..start + src.len(), self.bytes.len(), &mut self.regions) {
            self.file_bytes += src.len();
        } else {
            self.unmapped = true;
        }
    }

    fn put<T: Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        // Chunk by chunk through put_slice, so a placeholder is never copied.
        while src.has_remaining() {
            let chunk = src.chunk();
            let n = chunk.len();
            self.put_slice(chunk);
            src.advance(n);
        }
    }

    fn put_bytes(&mut self, val: u8, cnt: usize) {
        self.bytes.put_bytes(val, cnt);
    }
}

impl ByteBufMut for ResponseBuf<'_> {
    fn offset(&self) -> usize {
        self.bytes.len() + self.file_bytes
    }

    /// Like `BytesMut`'s: zero-extends or truncates (file regions included).
    fn seek(&mut self, offset: usize) {
        let current = self.offset();
        if offset >= current {
            self.bytes.put_bytes(0, offset - current);
            return;
        }
        while let Some(last) = self.regions.last_mut() {
            let start = last.at + self.file_bytes - last.slice.len;
            if offset >= start + last.slice.len {
                break;
            }
            if offset > start {
                let keep = offset - start;
                self.file_bytes -= last.slice.len - keep;
                last.slice.len = keep;
                break;
            }
            self.file_bytes -= last.slice.len;
            self.regions.pop();
        }
        self.bytes.truncate(offset - self.file_bytes);
    }

    fn range(&mut self, r: Range<usize>) -> &mut [u8] {
        let r = self.physical(r);
        &mut self.bytes[r]
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    use std::path::PathBuf;
    use std::sync::Arc;

    use indexmap::IndexMap;
    use kafka_protocol::messages::fetch_response::{
        AbortedTransaction, EpochEndOffset, FetchableTopicResponse, PartitionData,
    };
    use kafka_protocol::messages::{ApiKey, BrokerId, FetchResponse, ProducerId, ResponseKind, TopicName};
    use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

    use super::*;
    use crate::api::{encode, Outcome};

    /// A temp file holding `content`, as a slice of `range`.
    fn slice_of(dir: &tempfile::TempDir, name: &str, content: &[u8], range: Range<usize>) -> FileSlice {
        let path = dir.path().join(name);
        File::create(&path).unwrap().write_all(content).unwrap();
        FileSlice {
            file: Arc::new(File::open(&path).unwrap()),
            path: Arc::new(PathBuf::from(&path)),
            position: range.start as u64,
            len: range.len(),
        }
    }

    fn read(slice: &FileSlice) -> Vec<u8> {
        let mut v = vec![0; slice.len];
        slice.file.read_exact_at(&mut v, slice.position).unwrap();
        v
    }

    /// The frame as it goes on the wire.
    fn reassemble(r: &Response) -> Vec<u8> {
        let mut out = Vec::new();
        let mut written = 0;
        for f in &r.files {
            out.extend_from_slice(&r.bytes[written..f.at]);
            out.extend_from_slice(&read(&f.slice));
            written = f.at;
        }
        out.extend_from_slice(&r.bytes[written..]);
        out
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn partition(index: i32, records: Bytes, version: i16) -> PartitionData {
        let data = PartitionData::default();
        // A tagged field after the records in flexible versions.
        let data = if version >= 12 && index == 0 {
            data.with_diverging_epoch(EpochEndOffset::default().with_epoch(3).with_end_offset(40))
        } else {
            data
        };
        data.with_partition_index(index)
            .with_high_watermark(100 + index as i64)
            .with_last_stable_offset(90 + index as i64)
            .with_log_start_offset(if version >= 5 { 3 } else { -1 })
            .with_aborted_transactions(Some(vec![AbortedTransaction::default()
                .with_producer_id(ProducerId(7))
                .with_first_offset(11)]))
            .with_preferred_read_replica(BrokerId(-1))
            .with_records(Some(records))
    }

    fn response(version: i16, p0: Bytes, p1: Bytes) -> ResponseKind {
        let topic = FetchableTopicResponse::default()
            .with_topic(TopicName(crate::api::str_bytes("orders")))
            .with_partitions(vec![partition(0, p0, version), partition(1, p1, version)]);
        let topic = if version >= 13 {
            topic.with_topic(Default::default()).with_topic_id(uuid::Uuid::from_u128(5))
        } else {
            topic
        };
        let session_id = if version >= 7 { 42 } else { 0 };
        ResponseKind::Fetch(FetchResponse::default().with_session_id(session_id).with_responses(vec![topic]))
    }

    fn respond(outcome: Outcome) -> Response {
        match outcome {
            Outcome::Respond(r) => r,
            Outcome::NoResponse => panic!("no response"),
            Outcome::Close(reason) => panic!("closed: {reason}"),
            Outcome::Deferred(_) => panic!("deferred"),
        }
    }

    /// Goal: a fetch response whose records are placeholders, encoded through
    /// `ResponseBuf` and reassembled with the file bytes, is byte for byte the
    /// response encoded with the records in memory, for every Fetch version
    /// (non-flexible v4-v11 and flexible v12+), with partition 0 spanning two
    /// files (two segments) and partition 1 a slice in the middle of a file.
    #[test]
    fn placeholders_reassemble_to_the_in_memory_encoding() {
        let dir = tempfile::tempdir().unwrap();
        let seg_a = pattern(5000, 1);
        let seg_b = pattern(3000, 2);
        let seg_c = pattern(9000, 3);
        let p0 = vec![slice_of(&dir, "a.log", &seg_a, 1000..5000), slice_of(&dir, "b.log", &seg_b, 0..3000)];
        let p1 = vec![slice_of(&dir, "c.log", &seg_c, 2000..8500)];
        let p0_bytes: Vec<u8> = p0.iter().flat_map(read).collect();
        let p1_bytes: Vec<u8> = p1.iter().flat_map(read).collect();
        for version in 4..=17 {
            let header_version = ApiKey::Fetch.response_header_version(version);
            let expected = respond(encode(
                9,
                header_version,
                ApiKey::Fetch,
                version,
                &response(version, Bytes::from(p0_bytes.clone()), Bytes::from(p1_bytes.clone())),
                None,
            ));
            assert!(expected.files.is_empty());

            let mut files = FileRecords::default();
            let h0 = files.add(p0.clone()).unwrap();
            let h1 = files.add(p1.clone()).unwrap();
            assert_eq!((h0.len(), h1.len()), (p0_bytes.len(), p1_bytes.len()));
            let placeholder_response = response(version, h0, h1);
            let got = respond(encode(9, header_version, ApiKey::Fetch, version, &placeholder_response, Some(&files)));
            assert_eq!(got.files.len(), 3, "v{version}: one region per slice");
            assert_eq!(got.files[0].at, got.files[1].at, "v{version}: partition 0's two slices are adjacent");
            assert_eq!(got.bytes.len() + p0_bytes.len() + p1_bytes.len(), expected.bytes.len());
            assert_eq!(got.len(), expected.len());
            assert_eq!(reassemble(&got), &expected.bytes[..], "v{version}: reassembled frame");
        }
    }

    /// Goal: gaps filled in after file bytes (the record batch encoder's
    /// length and CRC) land at the right place: offsets count file bytes.
    #[test]
    fn gaps_after_file_regions_are_filled_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let slice = slice_of(&dir, "a.log", &pattern(700, 4), 100..700);
        let mut files = FileRecords::default();
        let holder = files.add(vec![slice.clone()]).unwrap();
        let record = Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp: 1_700_000_000_000,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from_static(b"value")),
            headers: IndexMap::new(),
        };
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        let write = |buf: &mut dyn FnMut(&[u8])| {
            buf(b"head");
            buf(&holder);
            buf(b"mid");
        };

        let file_bytes = read(&slice);
        let mut expected = BytesMut::new();
        write(&mut |s| expected.put_slice(if s.as_ptr() == holder.as_ptr() { &file_bytes } else { s }));
        RecordBatchEncoder::encode(&mut expected, [&record], &options).unwrap();

        let mut buf = ResponseBuf::new(&files);
        write(&mut |s| buf.put_slice(s));
        assert_eq!(buf.offset(), 4 + 600 + 3);
        RecordBatchEncoder::encode(&mut buf, [&record], &options).unwrap();
        let got = buf.finish().unwrap();
        assert_eq!(got.files.len(), 1);
        assert_eq!(got.files[0].at, 4);
        assert_eq!(reassemble(&got), &expected[..]);
    }

    /// Goal: seek behaves like `BytesMut`'s (zero-extend, truncate) across
    /// file regions, and range addresses the bytes after them.
    #[test]
    fn seek_and_range_use_wire_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let a = slice_of(&dir, "a.log", &pattern(100, 5), 0..100);
        let b = slice_of(&dir, "b.log", &pattern(50, 6), 0..50);
        let mut files = FileRecords::default();
        let ha = files.add(vec![a]).unwrap();
        let hb = files.add(vec![b]).unwrap();
        let mut buf = ResponseBuf::new(&files);
        buf.put_slice(b"xy");
        buf.put(ha.clone());
        buf.put_slice(b"z");
        buf.put_slice(&hb);
        assert_eq!(buf.offset(), 2 + 100 + 1 + 50);
        buf.seek(160);
        assert_eq!(buf.offset(), 160);
        buf.range(153..160).copy_from_slice(b"1234567");
        buf.range(102..103).copy_from_slice(b"Z");
        assert_eq!(&buf.bytes[..], b"xyZ1234567");
        // Truncate into the second region, then before the first one.
        buf.seek(120);
        assert_eq!((buf.offset(), buf.regions.len(), buf.regions[1].slice.len), (120, 2, 17));
        buf.seek(1);
        assert_eq!((buf.offset(), buf.regions.len(), &buf.bytes[..]), (1, 0, &b"x"[..]));
        // Placeholders out of what was handed out are refused, not sent.
        let region = placeholder().unwrap();
        buf.put_slice(&region[150..160]);
        assert!(buf.finish().is_err());
    }

    /// Goal: placeholders are handed out until the region is full; what does
    /// not fit is given back for copying, and smaller records still fit after.
    #[test]
    fn a_full_placeholder_region_gives_the_slices_back() {
        let dir = tempfile::tempdir().unwrap();
        let base = slice_of(&dir, "a.log", b"x", 0..1);
        let sized = |len: usize| FileSlice { len, ..base.clone() };
        let mut files = FileRecords::default();
        assert!(files.add(vec![sized(PLACEHOLDER_BYTES - 10)]).is_ok());
        let refused = files.add(vec![sized(6), sized(5)]).unwrap_err();
        assert_eq!(refused.len(), 2);
        let last = files.add(vec![sized(4), sized(0), sized(6)]).unwrap();
        assert_eq!(last.len(), 10);
        assert_eq!(last.as_ptr() as usize - placeholder().unwrap().as_ptr() as usize, PLACEHOLDER_BYTES - 10);
        assert_eq!(files.add(vec![]).unwrap().len(), 0);
        assert!(files.add(vec![sized(1)]).is_err());
    }

    #[test]
    #[should_panic(expected = "overlaps file bytes")]
    fn range_over_file_bytes_is_a_bug() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = FileRecords::default();
        let h = files.add(vec![slice_of(&dir, "a.log", &pattern(10, 7), 0..10)]).unwrap();
        let mut buf = ResponseBuf::new(&files);
        buf.put_slice(b"ab");
        buf.put_slice(&h);
        buf.put_slice(b"cd");
        let _ = buf.range(1..4);
    }
}
