//! The sparse time index (`.timeindex`): 12-byte entries of (timestamp: i64,
//! offset relative to the segment's base offset: u32), big endian. An entry
//! (T, o) says: no batch before the one starting at offset o has a
//! maxTimestamp above T, and the batch at o has maxTimestamp T. Entries are
//! written alongside offset index entries, only when the segment's max
//! timestamp has grown past the last entry's, plus one final entry when the
//! segment is sealed, so a sealed segment's last entry is its max timestamp.

use std::path::Path;

use crate::error::Result;
use crate::index_file::IndexFile;

pub(crate) const ENTRY_BYTES: usize = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeEntry {
    pub timestamp: i64,
    pub relative_offset: u32,
}

#[derive(Debug)]
pub(crate) struct TimeIndex {
    file: IndexFile,
}

impl TimeIndex {
    /// Opens the index at `path`; the flag says whether it is well formed
    /// (whole entries, timestamps and offsets strictly increasing).
    pub fn open(path: &Path) -> Result<(TimeIndex, bool)> {
        let (file, whole) = IndexFile::open(path, ENTRY_BYTES)?;
        let index = TimeIndex { file };
        let ok = whole
            && (1..index.len()).all(|i| {
                let (p, e) = (index.entry(i - 1), index.entry(i));
                e.timestamp > p.timestamp && e.relative_offset > p.relative_offset
            });
        Ok((index, ok))
    }

    /// Whether every entry is below `relative_end` (the segment's next offset, relative).
    pub fn fits(&self, relative_end: u64) -> bool {
        self.last().is_none_or(|e| (e.relative_offset as u64) < relative_end)
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }
    pub fn len(&self) -> usize {
        self.file.len()
    }
    /// Full one entry early: sealing a segment may add a final entry.
    pub fn is_full(&self) -> bool {
        self.file.len() + 1 >= self.file.capacity()
    }
    pub fn entry(&self, i: usize) -> TimeEntry {
        let b = self.file.entry(i);
        TimeEntry {
            timestamp: i64::from_be_bytes(b[0..8].try_into().expect("8 bytes")),
            relative_offset: u32::from_be_bytes(b[8..12].try_into().expect("4 bytes")),
        }
    }
    pub fn last(&self) -> Option<TimeEntry> {
        self.len().checked_sub(1).map(|i| self.entry(i))
    }

    /// The last entry whose timestamp is strictly below `timestamp`: every
    /// batch before its offset is below `timestamp` too, so a search may start there.
    pub fn lookup_below(&self, timestamp: i64) -> Option<TimeEntry> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.entry(mid).timestamp < timestamp {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1).map(|i| self.entry(i))
    }

    /// Appends `entry` if its timestamp is above the last entry's and there is
    /// room (`force` may use the slot kept for sealing). Returns whether it did.
    pub fn maybe_append(&mut self, entry: TimeEntry, force: bool) -> bool {
        if let Some(last) = self.last() {
            if entry.timestamp <= last.timestamp || entry.relative_offset <= last.relative_offset {
                return false;
            }
        }
        let room = if force { self.file.len() < self.file.capacity() } else { !self.is_full() };
        if !room {
            return false;
        }
        let mut b = [0u8; ENTRY_BYTES];
        b[0..8].copy_from_slice(&entry.timestamp.to_be_bytes());
        b[8..12].copy_from_slice(&entry.relative_offset.to_be_bytes());
        self.file.push(&b);
        true
    }

    /// Drops every entry at or past `relative_offset`.
    pub fn truncate_to_offset(&mut self, relative_offset: u32) {
        let keep = (0..self.len()).take_while(|&i| self.entry(i).relative_offset < relative_offset).count();
        self.file.truncate(keep);
    }

    /// Forgets every entry (the file is emptied; see `IndexFile::clear`).
    pub fn reset(&mut self) -> Result<()> {
        self.file.clear()
    }

    /// Preallocates room for `max_bytes` of entries (an active segment).
    pub fn preallocate(&mut self, max_bytes: u32) -> Result<()> {
        let capacity = (max_bytes as usize / ENTRY_BYTES).max(2).max(self.len() + 1);
        self.file.resize(capacity)
    }

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

    fn e(timestamp: i64, relative_offset: u32) -> TimeEntry {
        TimeEntry { timestamp, relative_offset }
    }

    #[test]
    fn appends_only_growing_timestamps_and_keeps_a_slot_for_sealing() {
        let dir = tempfile::tempdir().unwrap();
        let (mut idx, ok) = TimeIndex::open(&dir.path().join("0.timeindex")).unwrap();
        assert!(!ok, "a new file is not trusted");
        idx.preallocate(36).unwrap(); // 3 entries, one kept for sealing
        assert!(idx.maybe_append(e(100, 1), false));
        assert!(!idx.maybe_append(e(100, 2), false));
        assert!(!idx.maybe_append(e(90, 3), false));
        assert!(idx.maybe_append(e(200, 4), false));
        assert!(idx.is_full());
        assert!(!idx.maybe_append(e(300, 5), false));
        assert!(idx.maybe_append(e(300, 5), true));
        assert_eq!(idx.lookup_below(100), None);
        assert_eq!(idx.lookup_below(101), Some(e(100, 1)));
        assert_eq!(idx.lookup_below(1_000), Some(e(300, 5)));
        idx.truncate_to_offset(4);
        assert_eq!(idx.last(), Some(e(100, 1)));
    }

    #[test]
    fn trimmed_file_round_trips_and_disorder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.timeindex");
        let (mut idx, _) = TimeIndex::open(&path).unwrap();
        idx.preallocate(120).unwrap();
        idx.maybe_append(e(5, 1), false);
        idx.maybe_append(e(7, 9), false);
        idx.trim().unwrap();
        drop(idx);
        let (idx, ok) = TimeIndex::open(&path).unwrap();
        assert!(ok);
        assert_eq!(idx.len(), 2);
        drop(idx);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0..8].copy_from_slice(&9i64.to_be_bytes()); // timestamps no longer increase
        std::fs::write(&path, bytes).unwrap();
        assert!(!TimeIndex::open(&path).unwrap().1);
    }
}
