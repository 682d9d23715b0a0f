//! A segment's aborted-transaction index, `<base offset>.txnindex`, in
//! Kafka's format: 34-byte entries (big endian) of version i16 = 0, producer
//! id i64, first offset i64, last offset i64 (the ABORT marker's offset) and
//! last stable offset i64 (the LSO when the transaction was aborted). An
//! entry lives in the segment holding its marker. The file is created on the
//! first entry, appended to, fsynced with the segment and rewritten only
//! when cut back. Entries are also kept in memory (a handful per segment).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::warn;

use crate::error::{Result, StorageError};

pub(crate) const TXN_INDEX_SUFFIX: &str = "txnindex";
const ENTRY_BYTES: usize = 34;
const VERSION: i16 = 0;

/// One aborted transaction as stored in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxnIndexEntry {
    pub producer_id: i64,
    pub first_offset: i64,
    /// Offset of the ABORT marker.
    pub last_offset: i64,
    pub last_stable_offset: i64,
}

impl TxnIndexEntry {
    fn encode(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[0..2].copy_from_slice(&VERSION.to_be_bytes());
        b[2..10].copy_from_slice(&self.producer_id.to_be_bytes());
        b[10..18].copy_from_slice(&self.first_offset.to_be_bytes());
        b[18..26].copy_from_slice(&self.last_offset.to_be_bytes());
        b[26..34].copy_from_slice(&self.last_stable_offset.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<TxnIndexEntry> {
        let at = |i: usize| i64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if i16::from_be_bytes([b[0], b[1]]) != VERSION {
            return None;
        }
        Some(TxnIndexEntry {
            producer_id: at(2),
            first_offset: at(10),
            last_offset: at(18),
            last_stable_offset: at(26),
        })
    }
}

#[derive(Debug)]
pub(crate) struct TxnIndex {
    path: PathBuf,
    entries: Vec<TxnIndexEntry>,
    /// Open for appending once the first entry is written.
    file: Option<File>,
    /// Bytes of the file that hold whole, good entries (a torn tail is cut
    /// before the next append).
    good_bytes: u64,
    file_bytes: u64,
    /// Written since the last fsync.
    dirty: AtomicBool,
}

impl TxnIndex {
    /// Reads the index at `path` if it exists. A torn or unreadable tail is
    /// ignored (with a warning) and cut on the next write.
    pub fn open(path: PathBuf) -> Result<TxnIndex> {
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(StorageError::io(path, e)),
        };
        let mut entries = Vec::new();
        for chunk in bytes.chunks_exact(ENTRY_BYTES) {
            match TxnIndexEntry::decode(chunk) {
                Some(e) => entries.push(e),
                None => break,
            }
        }
        let good_bytes = (entries.len() * ENTRY_BYTES) as u64;
        if good_bytes != bytes.len() as u64 {
            warn!(file = %path.display(), good_bytes, bytes = bytes.len(), "ignoring a torn or corrupt tail of a transaction index");
        }
        Ok(TxnIndex {
            path,
            entries,
            file: None,
            good_bytes,
            file_bytes: bytes.len() as u64,
            dirty: AtomicBool::new(false),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &[TxnIndexEntry] {
        &self.entries
    }

    fn writer(&mut self) -> Result<&mut File> {
        if self.file.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .map_err(|e| StorageError::io(&self.path, e))?;
            if self.file_bytes != self.good_bytes {
                file.set_len(self.good_bytes).map_err(|e| StorageError::io(&self.path, e))?;
                self.file_bytes = self.good_bytes;
            }
            self.file = Some(file);
            self.dirty.store(true, Ordering::Relaxed);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    /// Creates the file (empty) if it does not exist yet.
    pub fn ensure_file(&mut self) -> Result<()> {
        self.writer().map(|_| ())
    }

    pub fn append(&mut self, entry: TxnIndexEntry) -> Result<()> {
        let bytes = entry.encode();
        let good = self.good_bytes;
        let file = self.writer()?;
        if let Err(e) = file.write_all(&bytes) {
            let _ = file.set_len(good);
            return Err(StorageError::io(&self.path, e));
        }
        self.entries.push(entry);
        self.good_bytes += ENTRY_BYTES as u64;
        self.file_bytes = self.good_bytes;
        self.dirty.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Drops the entries whose marker is at or after `offset`.
    pub fn truncate_to(&mut self, offset: i64) -> Result<()> {
        let keep = self.entries.iter().take_while(|e| e.last_offset < offset).count();
        if keep == self.entries.len() && self.good_bytes == self.file_bytes {
            return Ok(());
        }
        self.entries.truncate(keep);
        self.good_bytes = (keep * ENTRY_BYTES) as u64;
        if self.file_bytes > 0 || self.file.is_some() {
            let good = self.good_bytes;
            let file = self.writer()?;
            file.set_len(good).map_err(|e| StorageError::io(&self.path, e))?;
            self.file_bytes = good;
            self.dirty.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Forgets every entry (before a rebuild).
    pub fn reset(&mut self) -> Result<()> {
        self.truncate_to(i64::MIN)
    }

    pub fn flush(&self) -> Result<()> {
        if self.dirty.swap(false, Ordering::Relaxed) {
            if let Some(file) = &self.file {
                if let Err(e) = file.sync_data() {
                    self.dirty.store(true, Ordering::Relaxed);
                    return Err(StorageError::io(&self.path, e));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: i64, first: i64, last: i64) -> TxnIndexEntry {
        TxnIndexEntry { producer_id: pid, first_offset: first, last_offset: last, last_stable_offset: last + 1 }
    }

    #[test]
    fn append_reopen_truncate_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.txnindex");
        let mut idx = TxnIndex::open(path.clone()).unwrap();
        assert!(idx.entries().is_empty());
        assert!(!path.exists(), "created on the first entry only");
        for i in 0..4 {
            idx.append(entry(i, i * 10, i * 10 + 5)).unwrap();
        }
        idx.flush().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * 34);
        let mut idx = TxnIndex::open(path.clone()).unwrap();
        assert_eq!(idx.entries().len(), 4);
        assert_eq!(idx.entries()[2], entry(2, 20, 25));
        idx.truncate_to(25).unwrap();
        assert_eq!(idx.entries().len(), 2);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * 34);
        // A torn append: 10 stray bytes are ignored and cut before the next entry.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[0u8; 10]).unwrap();
        drop(f);
        let mut idx = TxnIndex::open(path.clone()).unwrap();
        assert_eq!(idx.entries().len(), 2);
        idx.append(entry(9, 90, 95)).unwrap();
        let idx = TxnIndex::open(path.clone()).unwrap();
        assert_eq!(idx.entries().len(), 3);
        assert_eq!(idx.entries()[2], entry(9, 90, 95));
        // Kafka's layout: version 0, then the four i64 fields.
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[0..2], &[0, 0]);
        assert_eq!(i64::from_be_bytes(bytes[2..10].try_into().unwrap()), 0);
    }
}
