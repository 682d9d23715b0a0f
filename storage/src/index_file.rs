//! A memory-mapped file of fixed-size entries: the storage shared by the
//! offset index and the time index.
//!
//! While a segment is active the file is preallocated to its capacity and only
//! the first `entries` entries mean anything; when the segment is sealed (roll,
//! close) the file is trimmed to exactly `entries * entry_bytes`. An index file
//! whose length is not a whole number of entries, or that was left
//! preallocated by a crash, is never trusted: recovery rebuilds it.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use crate::error::{Result, StorageError};

/// The file is opened only while it is mapped, resized or synced: a mapping
/// stays valid without its descriptor, so an index holds none (a partition
/// costs one descriptor per segment, for its log file).
#[derive(Debug)]
pub(crate) struct IndexFile {
    path: PathBuf,
    /// `None` when the mapped length is zero (mapping nothing is not portable).
    mmap: Option<MmapMut>,
    entry_bytes: usize,
    entries: usize,
    capacity: usize,
}

impl IndexFile {
    /// Opens (creating if missing) `path` and maps it as it is. Returns the
    /// file and whether it existed with a whole number of entries; when it did
    /// not, the file is reset to empty.
    pub fn open(path: &Path, entry_bytes: usize) -> Result<(IndexFile, bool)> {
        assert!(entry_bytes > 0);
        // A missing index is not an empty one: it has to be rebuilt.
        let existed = path.try_exists().map_err(|e| StorageError::io(path, e))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| StorageError::io(path, e))?;
        let len = file.metadata().map_err(|e| StorageError::io(path, e))?.len();
        let whole = existed && len % entry_bytes as u64 == 0 && len <= u32::MAX as u64;
        let mut index = IndexFile { path: path.to_path_buf(), mmap: None, entry_bytes, entries: 0, capacity: 0 };
        if whole {
            let entries = (len / entry_bytes as u64) as usize;
            index.map(&file, entries)?;
            index.entries = entries;
        } else {
            index.resize(0)?;
        }
        Ok((index, whole))
    }

    fn reopen(&self) -> Result<File> {
        OpenOptions::new().read(true).write(true).open(&self.path).map_err(|e| StorageError::io(&self.path, e))
    }

    fn map(&mut self, file: &File, capacity: usize) -> Result<()> {
        self.mmap = None;
        self.capacity = capacity;
        if capacity > 0 {
            // SAFETY: the file is private to this log directory and only this
            // process maps or changes it; its length is `capacity` entries.
            let mmap = unsafe { MmapMut::map_mut(file) }.map_err(|e| StorageError::io(&self.path, e))?;
            if mmap.len() != capacity * self.entry_bytes {
                return Err(StorageError::CorruptFile {
                    file: self.path.clone(),
                    reason: format!("mapped {} bytes, expected {}", mmap.len(), capacity * self.entry_bytes),
                });
            }
            // Index look-ups are binary searches: no read-ahead. Without
            // this the first touch of a preallocated (sparse) 10 MiB index
            // read ahead and zero-filled megabytes of it, which made
            // reopening a hundred crashed partitions take half a second.
            mmap.advise(memmap2::Advice::Random).map_err(|e| StorageError::io(&self.path, e))?;
            self.mmap = Some(mmap);
        }
        Ok(())
    }

    /// Sets the file's capacity in entries (preallocating or trimming), keeping
    /// the entries that still fit.
    pub fn resize(&mut self, capacity: usize) -> Result<()> {
        // No msync first: unmapping a shared mapping keeps its dirty pages in
        // the page cache, and durability is `flush`'s job. (A synchronous
        // write-back here made reopening a crashed log write its whole
        // preallocated index: seconds per hundred partitions.)
        if capacity > 0 && capacity == self.capacity && self.mmap.is_some() {
            self.entries = self.entries.min(capacity);
            return Ok(());
        }
        self.mmap = None;
        let file = self.reopen()?;
        file.set_len((capacity * self.entry_bytes) as u64).map_err(|e| StorageError::io(&self.path, e))?;
        self.entries = self.entries.min(capacity);
        self.map(&file, capacity)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn len(&self) -> usize {
        self.entries
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    pub fn entry(&self, i: usize) -> &[u8] {
        assert!(i < self.entries);
        let m = self.mmap.as_ref().expect("entries imply a mapping");
        &m[i * self.entry_bytes..(i + 1) * self.entry_bytes]
    }

    /// Appends one entry; the caller checks there is room.
    pub fn push(&mut self, entry: &[u8]) {
        assert_eq!(entry.len(), self.entry_bytes);
        assert!(self.entries < self.capacity, "index {} is full", self.path.display());
        let at = self.entries * self.entry_bytes;
        let m = self.mmap.as_mut().expect("capacity implies a mapping");
        m[at..at + self.entry_bytes].copy_from_slice(entry);
        self.entries += 1;
    }

    /// Forgets entries from `n` on, zeroing them so a preallocated file never
    /// shows stale entries.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.entries {
            return;
        }
        let m = self.mmap.as_mut().expect("entries imply a mapping");
        m[n * self.entry_bytes..self.entries * self.entry_bytes].fill(0);
        self.entries = n;
    }

    /// Forgets every entry, zeroing only the entries in use. After a crash a
    /// preallocated index looks like `capacity` entries; the ones really
    /// written are a prefix of non-zero entries (appends are sequential and
    /// truncation zeroes what it drops), found by a binary search, so a
    /// rebuild dirties what was written and no more, and costs no syscall.
    pub fn clear(&mut self) -> Result<()> {
        if let Some(m) = self.mmap.as_mut() {
            let width = self.entry_bytes;
            let zero = |i: usize| m[i * width..(i + 1) * width].iter().all(|&b| b == 0);
            let (mut lo, mut hi) = (0, self.entries);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if zero(mid) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            m[..lo * width].fill(0);
        }
        self.entries = 0;
        Ok(())
    }

    /// Writes the mapped entries and the file length to disk.
    pub fn flush(&self) -> Result<()> {
        if let Some(m) = &self.mmap {
            m.flush().map_err(|e| StorageError::io(&self.path, e))?;
        }
        self.reopen()?.sync_all().map_err(|e| StorageError::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preallocate_push_trim_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.index");
        let (mut f, ok) = IndexFile::open(&path, 4).unwrap();
        assert!(!ok, "a new file is not trusted");
        assert_eq!(f.len(), 0);
        f.resize(10).unwrap();
        f.push(&[1, 2, 3, 4]);
        f.push(&[5, 6, 7, 8]);
        f.truncate(1);
        f.push(&[9, 9, 9, 9]);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 40);
        f.resize(f.len()).unwrap();
        drop(f);
        let (f, ok) = IndexFile::open(&path, 4).unwrap();
        assert!(ok);
        assert_eq!(f.len(), 2);
        assert_eq!(f.entry(1), &[9, 9, 9, 9]);
    }

    #[test]
    fn ragged_length_is_reported_and_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.index");
        std::fs::write(&path, [0u8; 7]).unwrap();
        let (f, ok) = IndexFile::open(&path, 4).unwrap();
        assert!(!ok);
        assert_eq!(f.len(), 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }
}
