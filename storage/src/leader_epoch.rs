//! The leader epoch cache (Kafka's `LeaderEpochFileCache`): for every leader
//! epoch that wrote to the log, the offset of its first batch. A follower
//! asks its leader for the end of its own latest epoch (OffsetForLeaderEpoch)
//! and truncates where the two logs diverge; this cache answers that.
//!
//! Persisted as `leader-epoch-checkpoint` in the partition directory, in
//! Kafka's text format, so the file reads the same as Kafka's:
//! ```text
//! 0                  version
//! 2                  number of entries
//! 0 0                epoch start_offset
//! 3 120
//! ```
//! It is replaced atomically whenever the entries change (rare: once per
//! leader change, truncation or log start move). The cache itself is plain
//! data; the log decides when to write it.

use std::path::Path;

use tracing::warn;

use crate::checkpoint;
use crate::error::{Result, StorageError};

pub(crate) const FILE_NAME: &str = "leader-epoch-checkpoint";
const VERSION: i32 = 0;

/// Kafka's `UNDEFINED_EPOCH`: no epoch is known.
pub const UNDEFINED_EPOCH: i32 = -1;
/// Kafka's `UNDEFINED_EPOCH_OFFSET`: no end offset is known.
pub const UNDEFINED_EPOCH_OFFSET: i64 = -1;

/// The first offset written by a leader epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

/// Epochs in increasing order with non-decreasing start offsets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderEpochCache {
    entries: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.epoch)
    }

    pub fn epoch_start_offset(&self, epoch: i32) -> Option<i64> {
        self.entries.iter().find(|e| e.epoch == epoch).map(|e| e.start_offset)
    }

    /// Records that `epoch` starts at `start_offset`. Only a new, higher
    /// epoch is recorded: the latest epoch again changes nothing, a lower one
    /// (a stale leader's) is ignored with a warning, and negative values
    /// carry no epoch. Entries starting at or after `start_offset` are
    /// removed first (their epochs are lower: they wrote nothing that
    /// survives, or were assigned without data), keeping start offsets
    /// non-decreasing. Returns whether the entries changed.
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> bool {
        if epoch < 0 || start_offset < 0 {
            return false;
        }
        if let Some(latest) = self.entries.last() {
            if epoch == latest.epoch {
                return false;
            }
            if epoch < latest.epoch {
                warn!(epoch, start_offset, latest_epoch = latest.epoch, "ignoring a leader epoch below the latest");
                return false;
            }
        }
        let keep = self.entries.iter().rposition(|e| e.start_offset < start_offset).map_or(0, |i| i + 1);
        let removed = &self.entries[keep..];
        // Kafka warns only when data was written under a removed epoch.
        if removed.len() > 1 || removed.first().is_some_and(|e| e.start_offset != start_offset) {
            warn!(epoch, start_offset, removed = ?removed, "new leader epoch truncates conflicting entries");
        }
        self.entries.truncate(keep);
        self.entries.push(EpochEntry { epoch, start_offset });
        true
    }

    /// Kafka's OffsetForLeaderEpoch answer, `(epoch, end offset)`: for the
    /// latest epoch, `log_end_offset`; otherwise the largest epoch at or
    /// below `requested` and the start offset of the first epoch above it.
    /// Below every known epoch the requested epoch itself is answered with
    /// the first entry's start offset (its data is gone: the follower
    /// replicates from the leader's start, as Kafka's `endOffsetFor` does);
    /// above the latest epoch, for `UNDEFINED_EPOCH` or with no entries,
    /// `(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)`.
    pub fn end_offset_for(&self, requested: i32, log_end_offset: i64) -> (i32, i64) {
        const UNDEFINED: (i32, i64) = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET);
        if requested == UNDEFINED_EPOCH {
            return UNDEFINED;
        }
        if self.latest_epoch() == Some(requested) {
            return (requested, log_end_offset);
        }
        let Some(higher) = self.entries.iter().position(|e| e.epoch > requested) else { return UNDEFINED };
        let end = self.entries[higher].start_offset;
        match higher.checked_sub(1) {
            Some(floor) => (self.entries[floor].epoch, end),
            None => (requested, end),
        }
    }

    /// After the log is truncated to `end_offset`: removes the entries
    /// starting at or after it. Returns whether the entries changed.
    pub fn truncate_from_end(&mut self, end_offset: i64) -> bool {
        if end_offset < 0 {
            return false;
        }
        let keep = self.entries.iter().rposition(|e| e.start_offset < end_offset).map_or(0, |i| i + 1);
        let changed = keep < self.entries.len();
        self.entries.truncate(keep);
        changed
    }

    /// After the log start moves to `start_offset`: the entries starting at
    /// or before it go, except that the last of them is kept, moved to start
    /// at `start_offset` (the epoch of the first offset still in the log).
    /// Returns whether the entries changed.
    pub fn truncate_from_start(&mut self, start_offset: i64) -> bool {
        let covered = self.entries.iter().take_while(|e| e.start_offset <= start_offset).count();
        if covered == 0 || (covered == 1 && self.entries[0].start_offset == start_offset) {
            return false;
        }
        let epoch = self.entries[covered - 1].epoch;
        self.entries.drain(..covered - 1);
        self.entries[0] = EpochEntry { epoch, start_offset };
        true
    }

    /// Removes every entry. Returns whether there were any.
    pub fn clear(&mut self) -> bool {
        let changed = !self.entries.is_empty();
        self.entries.clear();
        changed
    }

    fn encode(&self) -> String {
        let mut out = format!("{VERSION}\n{}\n", self.entries.len());
        for e in &self.entries {
            out.push_str(&format!("{} {}\n", e.epoch, e.start_offset));
        }
        out
    }

    /// Parses the file's text; refuses anything the cache could not have written.
    fn decode(text: &str) -> Result<LeaderEpochCache, String> {
        let mut lines = text.lines();
        let mut next = |what: &str| lines.next().map(str::trim).ok_or_else(|| format!("missing {what}"));
        let version: i32 = next("version")?.parse().map_err(|e| format!("version: {e}"))?;
        if version != VERSION {
            return Err(format!("unknown version {version}"));
        }
        let count: usize = next("entry count")?.parse().map_err(|e| format!("entry count: {e}"))?;
        let mut cache = LeaderEpochCache::default();
        for i in 0..count {
            let line = next("entry")?;
            let mut fields = line.split_whitespace();
            let (Some(epoch), Some(offset), None) = (fields.next(), fields.next(), fields.next()) else {
                return Err(format!("entry {i}: {line:?} is not `epoch start_offset`"));
            };
            let epoch: i32 = epoch.parse().map_err(|e| format!("entry {i} epoch: {e}"))?;
            let start_offset: i64 = offset.parse().map_err(|e| format!("entry {i} start offset: {e}"))?;
            let in_order = cache.entries.last().is_none_or(|l| epoch > l.epoch && start_offset >= l.start_offset);
            if epoch < 0 || start_offset < 0 || !in_order {
                return Err(format!("entry {i}: ({epoch}, {start_offset}) out of order or negative"));
            }
            cache.entries.push(EpochEntry { epoch, start_offset });
        }
        if lines.any(|l| !l.trim().is_empty()) {
            return Err(format!("more lines than the {count} entries"));
        }
        Ok(cache)
    }

    /// Reads `dir`'s file: `None` if there is none, `Some(Err(reason))` if it
    /// cannot be understood (the caller rebuilds the cache from the log).
    pub(crate) fn read(dir: &Path) -> Result<Option<Result<LeaderEpochCache, String>>> {
        let path = dir.join(FILE_NAME);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(match String::from_utf8(bytes) {
                Ok(text) => LeaderEpochCache::decode(&text),
                Err(_) => Err("not UTF-8".to_string()),
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StorageError::io(path, e)),
        }
    }

    /// Atomically replaces `dir`'s file.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        checkpoint::write_atomically(dir, FILE_NAME, self.encode().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(entries: &[(i32, i64)]) -> LeaderEpochCache {
        LeaderEpochCache {
            entries: entries.iter().map(|&(epoch, start_offset)| EpochEntry { epoch, start_offset }).collect(),
        }
    }

    fn pairs(c: &LeaderEpochCache) -> Vec<(i32, i64)> {
        c.entries().iter().map(|e| (e.epoch, e.start_offset)).collect()
    }

    #[test]
    fn assign_appends_new_epochs_only() {
        let mut c = LeaderEpochCache::default();
        assert_eq!(c.latest_epoch(), None);
        assert!(c.assign(0, 0));
        assert!(!c.assign(0, 5), "the latest epoch again");
        assert!(c.assign(3, 10));
        assert!(!c.assign(2, 20), "a lower epoch is ignored");
        assert!(!c.assign(1, 5));
        assert!(!c.assign(-1, 30), "no epoch");
        assert!(!c.assign(7, -1));
        assert!(c.assign(5, 10), "same start offset: epoch 3 wrote nothing and is replaced");
        assert_eq!(pairs(&c), [(0, 0), (5, 10)]);
        assert!(c.assign(6, 4), "an earlier start removes the entries at or after it");
        assert_eq!(pairs(&c), [(0, 0), (6, 4)]);
        assert!(c.assign(8, 0));
        assert_eq!(pairs(&c), [(8, 0)]);
        assert_eq!((c.latest_epoch(), c.epoch_start_offset(8), c.epoch_start_offset(0)), (Some(8), Some(0), None));
    }

    #[test]
    fn end_offset_for_matches_kafka() {
        let c = cache(&[(2, 10), (4, 30), (7, 50)]);
        let leo = 80;
        assert_eq!(c.end_offset_for(7, leo), (7, leo), "latest epoch: the log end");
        assert_eq!(c.end_offset_for(4, leo), (4, 50), "a known epoch ends where the next starts");
        assert_eq!(c.end_offset_for(2, leo), (2, 30));
        assert_eq!(c.end_offset_for(5, leo), (4, 50), "between epochs: the floor epoch and the next start");
        assert_eq!(c.end_offset_for(3, leo), (2, 30));
        assert_eq!(c.end_offset_for(1, leo), (1, 10), "below the first: the first entry's start");
        assert_eq!(c.end_offset_for(0, leo), (0, 10));
        assert_eq!(c.end_offset_for(8, leo), (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET), "above the latest");
        assert_eq!(c.end_offset_for(UNDEFINED_EPOCH, leo), (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET));
        let empty = LeaderEpochCache::default();
        assert_eq!(empty.end_offset_for(0, leo), (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET));
        assert_eq!(empty.end_offset_for(3, 0), (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET));
    }

    #[test]
    fn truncate_from_end_removes_entries_at_or_after() {
        let mut c = cache(&[(2, 10), (4, 30), (7, 50)]);
        assert!(!c.truncate_from_end(51));
        assert!(!c.truncate_from_end(-1));
        assert!(c.truncate_from_end(50));
        assert_eq!(pairs(&c), [(2, 10), (4, 30)]);
        assert!(c.truncate_from_end(11));
        assert_eq!(pairs(&c), [(2, 10)]);
        assert!(c.truncate_from_end(0));
        assert!(c.is_empty());
    }

    #[test]
    fn truncate_from_start_moves_the_first_kept_entry() {
        let mut c = cache(&[(2, 10), (4, 30), (7, 50)]);
        assert!(!c.truncate_from_start(5), "before every entry");
        assert!(!c.truncate_from_start(10), "exactly the first start");
        assert!(c.truncate_from_start(20));
        assert_eq!(pairs(&c), [(2, 20), (4, 30), (7, 50)]);
        assert!(c.truncate_from_start(30));
        assert_eq!(pairs(&c), [(4, 30), (7, 50)]);
        assert!(c.truncate_from_start(60));
        assert_eq!(pairs(&c), [(7, 60)]);
        assert!(c.clear());
        assert!(!c.clear());
        assert!(!c.truncate_from_start(100));
    }

    #[test]
    fn file_round_trip_in_kafka_format() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(LeaderEpochCache::read(dir.path()).unwrap(), None);
        let c = cache(&[(0, 0), (3, 120), (5, 121)]);
        c.write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(text, "0\n3\n0 0\n3 120\n5 121\n");
        assert_eq!(LeaderEpochCache::read(dir.path()).unwrap(), Some(Ok(c)));
        assert!(!dir.path().join(format!("{FILE_NAME}.tmp")).exists());
        LeaderEpochCache::default().write(dir.path()).unwrap();
        assert_eq!(LeaderEpochCache::read(dir.path()).unwrap(), Some(Ok(LeaderEpochCache::default())));
    }

    #[test]
    fn malformed_files_are_refused() {
        for bad in [
            "",
            "1\n0\n",
            "0\n2\n0 0\n",
            "0\n1\n0 0\n3 5\n",
            "0\n1\n0\n",
            "0\n1\n0 0 0\n",
            "0\n1\nx 0\n",
            "0\n2\n3 5\n2 6\n",
            "0\n2\n2 5\n3 4\n",
            "0\n1\n-1 0\n",
            "0\nmany\n",
        ] {
            assert!(LeaderEpochCache::decode(bad).is_err(), "{bad:?}");
        }
        assert_eq!(LeaderEpochCache::decode(" 0 \n1\n 4  7 \n\n").unwrap(), cache(&[(4, 7)]));
    }
}
