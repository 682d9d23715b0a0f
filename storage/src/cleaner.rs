//! Log compaction (Kafka's LogCleaner) for `cleanup.policy=compact` logs.
//!
//! A pass covers the sealed segments below the first uncleanable offset (the
//! active segment's base, or the first segment younger than
//! `min_compaction_lag_ms`). It builds a map key → latest offset over the
//! dirty section (from the cleaner offset kept in the checkpoint to that
//! end), then rewrites every covered segment from the log start. A record
//! survives if its key's latest offset in the map is not above its own
//! offset; records with a null key are dropped; a tombstone (null value) is
//! dropped once its batch's maxTimestamp is older than `now -
//! delete_retention_ms` (the simple pre-KIP-534 rule on timestamps: no
//! delete horizon is written into batches).
//!
//! Batches keep their base offset, leader epoch, attributes, lastOffsetDelta,
//! base timestamp and producer fields; only the kept records are re-encoded
//! (verbatim record bytes, recompressed with the batch's codec, new CRC). A
//! batch left with no records is removed. Control batches and transactional
//! batches are kept whole and do not enter the map (aborted data is not told
//! from committed yet); their segments' aborted-transaction index entries
//! are copied into the cleaned segment's `.txnindex`; a tombstone whose key also
//! appears in a transactional batch is kept, so removing it can never bring
//! an older transactional value back.
//!
//! Adjacent segments are merged while their original sizes sum to at most
//! `segment_bytes`. The expensive part ([`CleanJob::run`]) needs no `&mut
//! Log`: it reads sealed segments through their shared read handles.
//!
//! Swap protocol, per group of replaced segments with first base `b`: the
//! cleaned files are written as `<b>.{log,index,timeindex,txnindex}.cleaned` and
//! fsynced; renamed to `.swap` (indexes first, log last: the log's rename is
//! the commit point) and the directory fsynced; renamed over `<b>.*`
//! (indexes first); then the other replaced segments are deleted. On open,
//! `.cleaned` files are deleted; a `<b>.log.swap` is completed the same way
//! and old segments starting inside its offsets are deleted; `.swap` index
//! files without a log are deleted.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::info;

use crate::batch::{self, HEADER_BYTES};
use crate::checkpoint::sync_dir;
use crate::error::{Result, StorageError};
use crate::records::{self, RecordRef};
use crate::segment::{file_name, walk, BatchMeta, Segment, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::txn_index::{TxnIndexEntry, TXN_INDEX_SUFFIX};

pub(crate) const CLEANED_SUFFIX: &str = ".cleaned";
pub(crate) const SWAP_SUFFIX: &str = ".swap";
/// The log last: its rename is the commit point of a swap.
const SUFFIXES: [&str; 4] = [INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX];
/// Bytes of output collected before one write to the cleaned segment.
const WRITE_CHUNK_BYTES: usize = 1 << 20;

/// What a cleaning pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanStats {
    /// Segments replaced by cleaned ones (0 when nothing was cleaned or the result was discarded).
    pub segments_cleaned: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub records_removed: u64,
}

/// A sealed segment a job reads: sealed segments never change, and the read
/// handle stays valid even if the segment is deleted meanwhile.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub base: i64,
    /// The next segment's base offset.
    pub next: i64,
    pub file: Arc<File>,
    pub path: Arc<PathBuf>,
    pub size: u64,
    /// The segment's aborted-transaction index entries, copied into the cleaned segment.
    pub aborted: Vec<TxnIndexEntry>,
}

/// A cleaning pass prepared under the log's lock by `Log::prepare_clean`;
/// [`CleanJob::run`] does the work without it.
#[derive(Debug)]
pub struct CleanJob {
    pub(crate) dir: PathBuf,
    pub(crate) sources: Vec<Source>,
    pub(crate) first_dirty: i64,
    pub(crate) clean_end: i64,
    pub(crate) now_ms: i64,
    pub(crate) delete_retention_ms: i64,
    pub(crate) segment_bytes: u64,
    pub(crate) index_interval_bytes: u32,
    pub(crate) index_max_bytes: u32,
}

/// One cleaned segment replacing `sources`.
#[derive(Debug)]
pub(crate) struct CleanedGroup {
    pub sources: Vec<Source>,
    pub base: i64,
    pub next: i64,
}

/// The written, fsynced `.cleaned` files of a pass, for `Log::install_clean`.
/// Dropped without being installed, its files are deleted.
#[derive(Debug)]
pub struct CleanedSegments {
    pub(crate) dir: PathBuf,
    pub(crate) groups: Vec<CleanedGroup>,
    pub(crate) clean_end: i64,
    pub(crate) stats: CleanStats,
}

impl Drop for CleanedSegments {
    fn drop(&mut self) {
        for g in &self.groups {
            for suffix in SUFFIXES {
                let _ = std::fs::remove_file(self.dir.join(file_name(g.base, suffix) + CLEANED_SUFFIX));
            }
        }
    }
}

/// Calls `f(position, batch bytes)` for each batch of a sealed segment file.
fn for_each_batch(src: &Source, f: &mut dyn FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
    let corrupt = |reason: String| StorageError::CorruptFile { file: src.path.to_path_buf(), reason };
    let mut position = 0u64;
    let mut buf = Vec::new();
    while position < src.size {
        let mut head = [0u8; HEADER_BYTES];
        if position + HEADER_BYTES as u64 > src.size {
            return Err(corrupt(format!("torn batch header at byte {position}")));
        }
        src.file.read_exact_at(&mut head, position).map_err(|e| StorageError::io(&*src.path, e))?;
        let (_, total) = batch::parse_header(&head, position as usize).map_err(|e| corrupt(e.to_string()))?;
        if position + total as u64 > src.size {
            return Err(corrupt(format!("torn batch at byte {position}")));
        }
        buf.resize(total, 0);
        src.file.read_exact_at(&mut buf, position).map_err(|e| StorageError::io(&*src.path, e))?;
        f(position, &buf)?;
        position += total as u64;
    }
    Ok(())
}

fn decode(src: &Source, batch: &[u8], position: u64) -> Result<(Vec<u8>, Vec<RecordRef>)> {
    records::decode(batch, position as usize)
        .map_err(|e| StorageError::CorruptFile { file: src.path.to_path_buf(), reason: e.to_string() })
}

impl CleanJob {
    /// Builds the offset map and writes the cleaned segments (fsynced).
    pub fn run(self) -> Result<CleanedSegments> {
        // Pass 1: key → latest offset over the dirty section, and the keys of
        // transactional batches anywhere in the covered range.
        let mut latest: HashMap<Vec<u8>, i64> = HashMap::new();
        let mut txn_keys: HashSet<Vec<u8>> = HashSet::new();
        for src in &self.sources {
            for_each_batch(src, &mut |position, bytes| {
                let (header, _) = batch::peek_header(bytes, position as usize).expect("checked by for_each_batch");
                let (base, last) = (header.base_offset(), header.last_offset());
                if header.is_control() || (!header.is_transactional() && last < self.first_dirty) {
                    return Ok(());
                }
                let transactional = header.is_transactional();
                let (raw, recs) = decode(src, bytes, position)?;
                for r in &recs {
                    let Some(key) = &r.key else { continue };
                    let key = &raw[key.clone()];
                    if transactional {
                        txn_keys.insert(key.to_vec());
                    } else {
                        let offset = base + r.offset_delta as i64;
                        match latest.get_mut(key) {
                            Some(o) => *o = (*o).max(offset),
                            None => {
                                latest.insert(key.to_vec(), offset);
                            }
                        }
                    }
                }
                Ok(())
            })?;
        }

        // Pass 2: group adjacent segments and rewrite each group.
        let mut cleaned = CleanedSegments {
            dir: self.dir.clone(),
            groups: Vec::new(),
            clean_end: self.clean_end,
            stats: CleanStats::default(),
        };
        let tombstone_horizon = self.now_ms.saturating_sub(self.delete_retention_ms);
        let mut i = 0;
        while i < self.sources.len() {
            let base = self.sources[i].base;
            for suffix in SUFFIXES {
                let path = self.dir.join(file_name(base, suffix) + CLEANED_SUFFIX);
                match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(StorageError::io(path, e)),
                    _ => {}
                }
            }
            cleaned.groups.push(CleanedGroup { sources: Vec::new(), base, next: base });
            let mut out =
                Segment::create_with_suffix(&self.dir, base, self.index_max_bytes, self.now_ms, CLEANED_SUFFIX)?;
            let mut buf = Vec::new();
            let mut metas = Vec::new();
            let mut j = i;
            loop {
                let src = &self.sources[j];
                cleaned.stats.bytes_before += src.size;
                for_each_batch(src, &mut |position, bytes| {
                    let (header, total) =
                        batch::peek_header(bytes, position as usize).expect("checked by for_each_batch");
                    let kept: Option<Vec<u8>> = if header.is_control() || header.is_transactional() {
                        None
                    } else {
                        let (raw, recs) = decode(src, bytes, position)?;
                        let base_offset = header.base_offset();
                        let keep: Vec<&RecordRef> = recs
                            .iter()
                            .filter(|r| {
                                let Some(key) = &r.key else { return false };
                                let key = &raw[key.clone()];
                                let offset = base_offset + r.offset_delta as i64;
                                if latest.get(key).is_some_and(|&l| l > offset) {
                                    return false;
                                }
                                r.has_value || header.max_timestamp() >= tombstone_horizon || txn_keys.contains(key)
                            })
                            .collect();
                        cleaned.stats.records_removed += (recs.len() - keep.len()) as u64;
                        if keep.len() == recs.len() {
                            None
                        } else if keep.is_empty() {
                            return Ok(());
                        } else {
                            Some(records::rewrite(bytes, &raw, &keep, position as usize).map_err(|e| {
                                StorageError::CorruptFile { file: src.path.to_path_buf(), reason: e.to_string() }
                            })?)
                        }
                    };
                    let bytes = kept.as_deref().unwrap_or(&bytes[..total]);
                    let (h, total) = batch::peek_header(bytes, 0).expect("a whole batch");
                    metas.push(BatchMeta {
                        position: buf.len() as u64,
                        base_offset: h.base_offset(),
                        last_offset: h.last_offset(),
                        max_timestamp: h.max_timestamp(),
                        total_bytes: total as u64,
                    });
                    buf.extend_from_slice(bytes);
                    if buf.len() >= WRITE_CHUNK_BYTES {
                        out.append(&buf, &metas, self.index_interval_bytes)?;
                        buf.clear();
                        metas.clear();
                    }
                    Ok(())
                })?;
                if !buf.is_empty() {
                    out.append(&buf, &metas, self.index_interval_bytes)?;
                    buf.clear();
                    metas.clear();
                }
                j += 1;
                // Merge the next segment in while the result stays within
                // segment_bytes (its uncleaned size bounds what it adds).
                let Some(next) = self.sources.get(j) else { break };
                if out.size_bytes() + next.size > self.segment_bytes || next.next - base > i32::MAX as i64 {
                    break;
                }
            }
            // Transactional and control batches are kept whole, so every
            // aborted transaction stays as it was: keep its index entries.
            out.ensure_txn_index_file()?;
            for src in &self.sources[i..j] {
                for entry in &src.aborted {
                    out.append_aborted_txn(*entry)?;
                }
            }
            out.seal()?;
            out.flush()?;
            let group = cleaned.groups.last_mut().expect("pushed above");
            group.sources = self.sources[i..j].to_vec();
            group.next = self.sources[j - 1].next;
            cleaned.stats.bytes_after += out.size_bytes();
            cleaned.stats.segments_cleaned += j - i;
            i = j;
        }
        sync_dir(&self.dir)?;
        Ok(cleaned)
    }
}

fn rename(dir: &Path, base: i64, suffix: &str, from: &str, to: &str) -> Result<()> {
    let (a, b) = (dir.join(file_name(base, suffix) + from), dir.join(file_name(base, suffix) + to));
    std::fs::rename(&a, &b).map_err(|e| StorageError::io(a, e))
}

/// Swaps the cleaned files of the group at `base` in for its old first
/// segment (see the module docs); the caller then deletes the other old
/// segments of the group.
pub(crate) fn swap_in(dir: &Path, base: i64) -> Result<()> {
    for suffix in SUFFIXES {
        rename(dir, base, suffix, CLEANED_SUFFIX, SWAP_SUFFIX)?;
    }
    sync_dir(dir)?;
    for suffix in SUFFIXES {
        rename(dir, base, suffix, SWAP_SUFFIX, "")?;
    }
    sync_dir(dir)
}

/// On open: deletes `.cleaned` leftovers and finishes interrupted swaps.
pub(crate) fn recover_swaps(dir: &Path) -> Result<()> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
        let entry = entry.map_err(|e| StorageError::io(dir, e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    let remove = |name: &str| {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StorageError::io(path, e)),
            _ => Ok(()),
        }
    };
    let mut swapped = Vec::new();
    for name in &names {
        if name.ends_with(CLEANED_SUFFIX) {
            info!(file = %dir.join(name).display(), "removing unfinished cleaned segment file");
            remove(name)?;
        } else if let Some(stem) = name.strip_suffix(&format!(".{LOG_SUFFIX}{SWAP_SUFFIX}")) {
            if let Ok(base) = stem.parse::<i64>() {
                swapped.push(base);
            }
        }
    }
    for name in &names {
        if let Some(stem) = name.strip_suffix(SWAP_SUFFIX).and_then(|n| n.split_once('.')).map(|(s, _)| s) {
            let base: Option<i64> = stem.parse().ok();
            if !name.ends_with(CLEANED_SUFFIX) && base.is_some_and(|b| !swapped.contains(&b)) {
                info!(file = %dir.join(name).display(), "removing swap file of an uncommitted clean");
                remove(name)?;
            }
        }
    }
    for base in swapped {
        info!(dir = %dir.display(), base, "completing an interrupted cleaned segment swap");
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX] {
            if dir.join(file_name(base, suffix) + SWAP_SUFFIX).exists() {
                rename(dir, base, suffix, SWAP_SUFFIX, "")?;
            }
        }
        rename(dir, base, LOG_SUFFIX, SWAP_SUFFIX, "")?;
        // Old segments of the group starting inside the new one's offsets.
        let path = dir.join(file_name(base, LOG_SUFFIX));
        let file = File::open(&path).map_err(|e| StorageError::io(&path, e))?;
        let size = file.metadata().map_err(|e| StorageError::io(&path, e))?.len();
        let mut last = None;
        walk(&file, &path, size, 0, base, false, false, i64::MAX, &mut |m| last = Some(m.last_offset))?;
        if let Some(last) = last {
            for name in &names {
                let Some((stem, suffix)) = name.split_once('.') else { continue };
                let Ok(other) = stem.parse::<i64>() else { continue };
                if stem.len() == 20 && other > base && other <= last && SUFFIXES.contains(&suffix) {
                    info!(file = %dir.join(name).display(), "removing segment replaced by a cleaned one");
                    remove(name)?;
                }
            }
        }
        sync_dir(dir)?;
    }
    Ok(())
}
