//! The per-log checkpoint file: recovery point, log start offset and whether
//! the last shutdown was clean, checksummed with CRC-32 (IEEE, crc32fast: this
//! is our own format, not Kafka's) and replaced atomically (write a temp file,
//! fsync it, rename over the old one, fsync the directory).
//!
//! Layout (big endian, 35 bytes, version 2):
//! ```text
//! 0 magic "SCKP" | 4 version u16 = 2 | 6 flags u8 (bit 0: clean shutdown)
//! 7 recovery point i64 | 15 log start offset i64 | 23 cleaner offset i64
//! 31 crc32 u32 of bytes 0..31
//! ```
//! The cleaner offset is the log cleaner's first dirty offset (Kafka keeps it
//! in `cleaner-offset-checkpoint`): compaction has seen everything below it.
//! Version 1 (27 bytes, no cleaner offset, CRC at 23) is still read, with a
//! cleaner offset of 0.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::{Result, StorageError};

pub(crate) const FILE_NAME: &str = "checkpoint";
pub(crate) const TEMP_SUFFIX: &str = ".tmp";
const MAGIC: &[u8; 4] = b"SCKP";
const VERSION: u16 = 2;
const BODY_BYTES: usize = 31;
const FILE_BYTES: usize = BODY_BYTES + 4;
const V1_BODY_BYTES: usize = 23;
const FLAG_CLEAN: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub recovery_point: i64,
    pub log_start_offset: i64,
    /// The cleaner's first dirty offset.
    pub cleaner_offset: i64,
    pub clean_shutdown: bool,
}

impl Checkpoint {
    fn encode(&self) -> [u8; FILE_BYTES] {
        let mut b = [0u8; FILE_BYTES];
        b[0..4].copy_from_slice(MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        b[6] = if self.clean_shutdown { FLAG_CLEAN } else { 0 };
        b[7..15].copy_from_slice(&self.recovery_point.to_be_bytes());
        b[15..23].copy_from_slice(&self.log_start_offset.to_be_bytes());
        b[23..31].copy_from_slice(&self.cleaner_offset.to_be_bytes());
        let crc = crc32fast::hash(&b[..BODY_BYTES]);
        b[BODY_BYTES..].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Checkpoint, String> {
        let body = match b.len() {
            FILE_BYTES => BODY_BYTES,
            n if n == V1_BODY_BYTES + 4 => V1_BODY_BYTES,
            n => return Err(format!("length {n} bytes, expected {FILE_BYTES}")),
        };
        let stored = u32::from_be_bytes(b[body..].try_into().expect("4 bytes"));
        let computed = crc32fast::hash(&b[..body]);
        if stored != computed {
            return Err(format!("checksum {stored:#010x}, computed {computed:#010x}"));
        }
        if &b[0..4] != MAGIC {
            return Err("bad magic".to_string());
        }
        let version = u16::from_be_bytes([b[4], b[5]]);
        if !(version == VERSION && body == BODY_BYTES || version == 1 && body == V1_BODY_BYTES) {
            return Err(format!("unknown version {version} for a file of {} bytes", b.len()));
        }
        let recovery_point = i64::from_be_bytes(b[7..15].try_into().expect("8 bytes"));
        let log_start_offset = i64::from_be_bytes(b[15..23].try_into().expect("8 bytes"));
        let cleaner_offset = if version == 1 { 0 } else { i64::from_be_bytes(b[23..31].try_into().expect("8 bytes")) };
        if recovery_point < 0 || log_start_offset < 0 || cleaner_offset < 0 {
            return Err(format!("negative offsets {recovery_point}/{log_start_offset}/{cleaner_offset}"));
        }
        Ok(Checkpoint { recovery_point, log_start_offset, cleaner_offset, clean_shutdown: b[6] & FLAG_CLEAN != 0 })
    }

    /// Reads the checkpoint in `dir`; `None` if there is none.
    pub fn read(dir: &Path) -> Result<Option<Checkpoint>> {
        let path = dir.join(FILE_NAME);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StorageError::io(path, e)),
        };
        Checkpoint::decode(&bytes).map(Some).map_err(|reason| StorageError::CorruptFile { file: path, reason })
    }

    /// Atomically replaces the checkpoint in `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_atomically(dir, FILE_NAME, &self.encode())
    }
}

/// Replaces `dir/name` with `bytes` so a crash leaves the old file or the new
/// one, never a mix: write `name.tmp`, fsync it, rename it over, fsync the
/// directory. Recovery deletes a leftover `.tmp`.
pub(crate) fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let path = dir.join(name);
    let temp = dir.join(format!("{name}{TEMP_SUFFIX}"));
    let mut f = File::create(&temp).map_err(|e| StorageError::io(&temp, e))?;
    f.write_all(bytes).map_err(|e| StorageError::io(&temp, e))?;
    f.sync_all().map_err(|e| StorageError::io(&temp, e))?;
    drop(f);
    std::fs::rename(&temp, &path).map_err(|e| StorageError::io(&path, e))?;
    sync_dir(dir)
}

/// fsyncs a directory so renames, creations and deletions in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| StorageError::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_replace() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Checkpoint::read(dir.path()).unwrap(), None);
        let c = Checkpoint { recovery_point: 42, log_start_offset: 7, cleaner_offset: 5, clean_shutdown: true };
        c.write(dir.path()).unwrap();
        assert_eq!(Checkpoint::read(dir.path()).unwrap(), Some(c));
        let d = Checkpoint { recovery_point: 50, log_start_offset: 9, cleaner_offset: 0, clean_shutdown: false };
        d.write(dir.path()).unwrap();
        assert_eq!(Checkpoint::read(dir.path()).unwrap(), Some(d));
        assert!(!dir.path().join("checkpoint.tmp").exists());
    }

    #[test]
    fn corruption_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let c =
            Checkpoint { recovery_point: 1 << 40, log_start_offset: 3, cleaner_offset: 1 << 41, clean_shutdown: true };
        c.write(dir.path()).unwrap();
        let path = dir.path().join(FILE_NAME);
        let good = std::fs::read(&path).unwrap();
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            let err = Checkpoint::read(dir.path()).unwrap_err();
            assert!(matches!(err, StorageError::CorruptFile { .. }), "byte {i}: {err}");
        }
        std::fs::write(&path, &good[..10]).unwrap();
        assert!(Checkpoint::read(dir.path()).is_err());
    }

    #[test]
    fn version_1_files_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&1u16.to_be_bytes());
        b.push(FLAG_CLEAN);
        b.extend_from_slice(&42i64.to_be_bytes());
        b.extend_from_slice(&7i64.to_be_bytes());
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        std::fs::write(dir.path().join(FILE_NAME), &b).unwrap();
        let c = Checkpoint::read(dir.path()).unwrap().unwrap();
        assert_eq!(c, Checkpoint { recovery_point: 42, log_start_offset: 7, cleaner_offset: 0, clean_shutdown: true });
    }
}
