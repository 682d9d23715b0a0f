//! The sparse offset index (`.index`): 8-byte entries, like Kafka's, of
//! (offset relative to the segment's base offset: u32, file position: u32),
//! big endian. An entry is added for the batch that starts after at least
//! `index_interval_bytes` of log since the previous entry, so a look-up gives a
//! position at most about one interval before the wanted batch. Position 0 is
//! never indexed: the segment start needs no entry.

use std::path::Path;

use crate::error::Result;
use crate::index_file::IndexFile;

pub(crate) const ENTRY_BYTES: usize = 8;

/// One entry: a batch starting `relative_offset` after the segment's base
/// offset sits at byte `position` of the `.log` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

#[derive(Debug)]
pub(crate) struct OffsetIndex {
    file: IndexFile,
}

impl OffsetIndex {
    /// Opens the index at `path`; the flag says whether its contents are
    /// well formed (whole entries, offsets and positions strictly increasing).
    pub fn open(path: &Path) -> Result<(OffsetIndex, bool)> {
        let (file, whole) = IndexFile::open(path, ENTRY_BYTES)?;
        let index = OffsetIndex { file };
        let ok = whole && index.is_monotonic();
        Ok((index, ok))
    }

    fn is_monotonic(&self) -> bool {
        let mut prev: Option<OffsetEntry> = None;
        for i in 0..self.len() {
            let e = self.entry(i);
            let ordered = match prev {
                None => e.position > 0,
                Some(p) => e.relative_offset > p.relative_offset && e.position > p.position,
            };
            if !ordered {
                return false;
            }
            prev = Some(e);
        }
        true
    }

    /// Whether every entry lies inside a log of `log_bytes` bytes and below
    /// `relative_end` (the segment's next offset, relative).
    pub fn fits(&self, log_bytes: u64, relative_end: u64) -> bool {
        match self.last() {
            None => true,
            Some(e) => (e.position as u64) < log_bytes && (e.relative_offset as u64) < relative_end,
        }
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }
    pub fn len(&self) -> usize {
        self.file.len()
    }
    pub fn is_full(&self) -> bool {
        self.file.len() >= self.file.capacity()
    }
    pub fn entry(&self, i: usize) -> OffsetEntry {
        let b = self.file.entry(i);
        OffsetEntry {
            relative_offset: u32::from_be_bytes(b[0..4].try_into().expect("4 bytes")),
            position: u32::from_be_bytes(b[4..8].try_into().expect("4 bytes")),
        }
    }
    pub fn last(&self) -> Option<OffsetEntry> {
        self.len().checked_sub(1).map(|i| self.entry(i))
    }

    /// The last entry whose relative offset is `<= relative_offset`.
    pub fn lookup(&self, relative_offset: u32) -> Option<OffsetEntry> {
        // Number of entries with offset <= target; entries are sorted.
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.entry(mid).relative_offset <= relative_offset {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1).map(|i| self.entry(i))
    }

    /// Appends an entry; the caller checks `is_full` first.
    pub fn append(&mut self, entry: OffsetEntry) {
        if let Some(last) = self.last() {
            assert!(entry.relative_offset > last.relative_offset && entry.position > last.position);
        }
        assert!(entry.position > 0);
        let mut b = [0u8; ENTRY_BYTES];
        b[0..4].copy_from_slice(&entry.relative_offset.to_be_bytes());
        b[4..8].copy_from_slice(&entry.position.to_be_bytes());
        self.file.push(&b);
    }

    /// Drops every entry at or past byte `position` of the log.
    pub fn truncate_to_position(&mut self, position: u64) {
        let keep = (0..self.len()).take_while(|&i| (self.entry(i).position as u64) < position).count();
        self.file.truncate(keep);
    }

    /// Forgets every entry (the file is emptied; see `IndexFile::clear`).
    pub fn reset(&mut self) -> Result<()> {
        self.file.clear()
    }

    /// Preallocates room for `max_bytes` of entries (an active segment).
    pub fn preallocate(&mut self, max_bytes: u32) -> Result<()> {
        let capacity = (max_bytes as usize / ENTRY_BYTES).max(2).max(self.len());
        self.file.resize(capacity)
    }

    /// Shrinks the file to the entries in use (a sealed segment).
    pub fn trim(&mut self) -> Result<()> {
        self.file.resize(self.len())
    }

    pub fn flush(&self) -> Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(relative_offset: u32, position: u32) -> OffsetEntry {
        OffsetEntry { relative_offset, position }
    }

    #[test]
    fn lookup_finds_largest_entry_not_above() {
        let dir = tempfile::tempdir().unwrap();
        let (mut idx, ok) = OffsetIndex::open(&dir.path().join("0.index")).unwrap();
        assert!(!ok, "a new file is not trusted");
        idx.preallocate(64).unwrap();
        assert_eq!(idx.lookup(5), None);
        idx.append(e(10, 100));
        idx.append(e(20, 250));
        idx.append(e(30, 400));
        assert_eq!(idx.lookup(9), None);
        assert_eq!(idx.lookup(10), Some(e(10, 100)));
        assert_eq!(idx.lookup(29), Some(e(20, 250)));
        assert_eq!(idx.lookup(1000), Some(e(30, 400)));
        idx.truncate_to_position(250);
        assert_eq!(idx.len(), 1);
        assert!(idx.fits(101, 11));
        assert!(!idx.fits(100, 11));
    }

    #[test]
    fn full_after_capacity_and_trimmed_file_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.index");
        let (mut idx, _) = OffsetIndex::open(&path).unwrap();
        idx.preallocate(20).unwrap(); // rounds down to 2 entries
        idx.append(e(1, 10));
        assert!(!idx.is_full());
        idx.append(e(2, 20));
        assert!(idx.is_full());
        idx.trim().unwrap();
        drop(idx);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 16);
        let (idx, ok) = OffsetIndex::open(&path).unwrap();
        assert!(ok);
        assert_eq!(idx.last(), Some(e(2, 20)));
    }

    #[test]
    fn preallocated_leftover_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.index");
        let (mut idx, _) = OffsetIndex::open(&path).unwrap();
        idx.preallocate(80).unwrap();
        idx.append(e(1, 10));
        drop(idx); // a crash: never trimmed
        let (_, ok) = OffsetIndex::open(&path).unwrap();
        assert!(!ok);
        // Out-of-order entries are refused too.
        let mut bytes = Vec::new();
        for (o, p) in [(5u32, 50u32), (4, 60)] {
            bytes.extend_from_slice(&o.to_be_bytes());
            bytes.extend_from_slice(&p.to_be_bytes());
        }
        std::fs::write(&path, bytes).unwrap();
        assert!(!OffsetIndex::open(&path).unwrap().1);
    }
}
