//! What the quorum core needs from durable storage.
//!
//! `raft::Storage` gives raft-rs read access (entries, terms, hard state,
//! snapshot). [`RaftLogStore`] adds the writes the Ready loop makes. Writes
//! are buffered until [`RaftLogStore::sync`]: only what a `sync` returned
//! `Ok` for survives a crash. The disk store ([`super::disk::DiskStore`])
//! fsyncs there; the simulation's store drops unsynced writes on a crash.

use raft::eraftpb::{Entry, HardState, Snapshot};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("I/O error on {path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
    /// Bytes that should be intact are not (before the commit point, or a
    /// snapshot or hard-state file). Start-up refuses, naming the place.
    #[error("{path} is damaged at byte {offset}: {reason}")]
    Corrupt { path: std::path::PathBuf, offset: u64, reason: String },
    #[error("raft storage: {0}")]
    Raft(String),
}

pub trait RaftLogStore: raft::Storage {
    /// Appends entries, first removing any entries at or after
    /// `entries[0].index` (a new leader overwriting an uncommitted suffix).
    /// `entries[0].index` is at most `last_index() + 1`.
    fn append(&mut self, entries: &[Entry]) -> Result<(), StoreError>;

    /// Records the hard state (term, vote, commit).
    fn set_hard_state(&mut self, hs: &HardState) -> Result<(), StoreError>;

    /// Records only a new commit index (a light ready's `commit_index`).
    fn set_commit(&mut self, commit: u64) -> Result<(), StoreError>;

    /// Replaces the log with a snapshot received from the leader: entries up
    /// to and including the snapshot's index are dropped (all entries, if
    /// the snapshot's term disagrees with ours at its index), the
    /// snapshot's conf state becomes ours, and the commit rises to its index.
    fn apply_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), StoreError>;

    /// Takes a snapshot of our own applied state: `data` is the state
    /// machine as of `index` (which must be applied, so committed), and
    /// entries up to `index` are dropped from the log.
    fn create_snapshot(&mut self, index: u64, data: Vec<u8>) -> Result<(), StoreError>;

    /// Makes every write above durable. Until it returns `Ok`, a crash may
    /// lose any of them (but never an earlier synced one).
    fn sync(&mut self) -> Result<(), StoreError>;

    /// Bytes of entries held since the last snapshot (snapshot policy).
    fn bytes_since_snapshot(&self) -> u64;
}
