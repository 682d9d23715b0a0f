//! Opening a log directory: finding its segments, checking what the last
//! shutdown left, and repairing a torn tail.
//!
//! After an unclean shutdown every batch from the segment holding the
//! recovery point to the end of the log is re-read and its CRC-32C checked;
//! the log is cut at the first torn, corrupt or out-of-order batch and later
//! segments are deleted. Offsets must increase without overlap; gaps are
//! allowed (the log cleaner removes batches). Indexes of re-read segments are rebuilt. After a
//! clean shutdown only the tail of the active segment (from its last index
//! entry) is checked. Either way, damage to data below the recovery point
//! (which was fsynced and may have been acknowledged) refuses the open and
//! names the file and byte, rather than silently dropping it. A missing,
//! malformed or untrimmed index is rebuilt from the log, never refused.

use std::collections::BTreeMap;
use std::path::Path;

use tracing::{info, warn};

use crate::checkpoint::{self, Checkpoint};
use crate::cleaner;
use crate::error::{Result, StorageError};
use crate::log::LogConfig;
use crate::segment::{Segment, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::txn_index::TXN_INDEX_SUFFIX;

/// What recovery hands to the log.
pub(crate) struct Recovered {
    /// Every segment; the last is not yet activated.
    pub segments: BTreeMap<i64, Segment>,
    pub log_start_offset: i64,
    /// The checkpoint's recovery point: data from here on may not be on disk yet.
    pub recovery_point: i64,
    /// The cleaner's first dirty offset, within the log.
    pub cleaner_offset: i64,
    /// Base of the first segment whose batches were rescanned (and possibly
    /// cut): its transaction index and the later ones' must be rebuilt.
    pub rescanned_from: Option<i64>,
    /// The checkpoint as found, so an open that changes nothing need not rewrite it.
    pub checkpoint: Option<Checkpoint>,
    /// What a repair cut.
    pub cut: Option<RepairCut>,
}

/// Parses `<20 digits>.<suffix>` into the base offset.
fn parse_name(name: &str) -> Option<(i64, &str)> {
    let (stem, suffix) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, suffix))
}

fn remove(path: &Path) -> Result<()> {
    std::fs::remove_file(path).map_err(|e| StorageError::io(path, e))
}

/// How `recover` treats damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Start-up: a torn tail of the last segment (past the recovery point)
    /// is cut; damage anywhere else refuses the open.
    Open,
    /// `strand --repair-log`: every segment is re-read and the log is cut at
    /// the first damaged batch wherever it is, later segments deleted.
    Repair,
}

/// What a repair cut, for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairCut {
    pub file: std::path::PathBuf,
    pub position: u64,
    /// The log end offset after the cut.
    pub offset: i64,
    pub reason: String,
    /// Later segments deleted.
    pub segments_deleted: usize,
}

/// The command that cuts a log at its first damaged batch, for error messages.
pub fn repair_hint(dir: &Path) -> String {
    format!(
        "stop the broker and run `strand --repair-log {}` to see the damage, then add --truncate to cut the log there (everything after it is lost)",
        dir.display()
    )
}

/// Reads every segment in `dir` without changing anything and returns the
/// first damaged batch, as a repair would find it (`strand --repair-log`
/// without `--truncate`): framing, CRC-32C, offsets in order and each
/// segment ending at or before the next one's base offset.
pub fn find_damage(dir: &Path) -> Result<Option<RepairCut>> {
    let mut bases: Vec<i64> = std::fs::read_dir(dir)
        .map_err(|e| StorageError::io(dir, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| match parse_name(&e.file_name().to_string_lossy()) {
            Some((base, LOG_SUFFIX)) => Some(base),
            _ => None,
        })
        .collect();
    bases.sort_unstable();
    for (i, &base) in bases.iter().enumerate() {
        let path = dir.join(crate::segment::file_name(base, LOG_SUFFIX));
        let file = std::fs::File::open(&path).map_err(|e| StorageError::io(&path, e))?;
        let size = file.metadata().map_err(|e| StorageError::io(&path, e))?.len();
        let next = bases.get(i + 1).copied();
        let limit = next.unwrap_or(i64::MAX);
        let end = crate::segment::walk(&file, &path, size, 0, base, true, false, limit, &mut |_| {})?;
        let reason = match (end.error, next) {
            (Some(reason), _) => reason,
            (None, Some(next)) if end.next_offset > next => {
                format!("segment ends at offset {} but the next segment starts at {next}", end.next_offset)
            }
            _ => continue,
        };
        return Ok(Some(RepairCut {
            file: path,
            position: end.position,
            offset: end.next_offset,
            reason,
            segments_deleted: bases.len() - i - 1,
        }));
    }
    Ok(None)
}

/// Opens the segments in `dir` (creating the directory and a first segment
/// if needed) and recovers them.
pub(crate) fn recover(dir: &Path, config: &LogConfig, now_ms: i64, mode: Mode) -> Result<Recovered> {
    std::fs::create_dir_all(dir).map_err(|e| StorageError::io(dir, e))?;
    cleaner::recover_swaps(dir)?;
    let checkpoint = Checkpoint::read(dir)?;
    let mut log_bases = Vec::new();
    let mut index_files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
        let entry = entry.map_err(|e| StorageError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(checkpoint::TEMP_SUFFIX) {
            // An atomic replace that never reached its rename.
            info!(file = %entry.path().display(), "removing leftover temporary file");
            remove(&entry.path())?;
            continue;
        }
        match parse_name(&name) {
            Some((base, LOG_SUFFIX)) => log_bases.push(base),
            Some((base, INDEX_SUFFIX | TIME_INDEX_SUFFIX | TXN_INDEX_SUFFIX)) => index_files.push((base, entry.path())),
            _ => {}
        }
    }
    log_bases.sort_unstable();
    for (base, path) in index_files {
        if log_bases.binary_search(&base).is_err() {
            // A segment deletion interrupted after its log file went.
            info!(file = %path.display(), "removing index file without a log file");
            remove(&path)?;
        }
    }

    let checkpoint_start = checkpoint.map_or(0, |c| c.log_start_offset);
    let repair = mode == Mode::Repair;
    // A repair checks everything and may cut below the recovery point.
    let recovery_point = if repair { 0 } else { checkpoint.map_or(0, |c| c.recovery_point) };
    let clean = !repair && checkpoint.is_some_and(|c| c.clean_shutdown);

    let mut segments = BTreeMap::new();
    if log_bases.is_empty() {
        if recovery_point > checkpoint_start {
            return Err(StorageError::CorruptBehindRecoveryPoint {
                file: dir.to_path_buf(),
                position: 0,
                recovery_point,
                reason: format!("no segment files, but offsets {checkpoint_start}..{recovery_point} were flushed"),
            });
        }
        let segment = Segment::create(dir, checkpoint_start, config.index_max_bytes, now_ms)?;
        segments.insert(checkpoint_start, segment);
        return Ok(Recovered {
            segments,
            log_start_offset: checkpoint_start,
            recovery_point,
            cleaner_offset: checkpoint_start,
            rescanned_from: None,
            checkpoint,
            cut: None,
        });
    }
    for &base in &log_bases {
        segments.insert(base, Segment::open(dir, base, now_ms)?);
    }

    let last_base = *log_bases.last().expect("not empty");
    let scan_from = if clean {
        last_base
    } else if repair {
        log_bases[0]
    } else {
        log_bases.iter().copied().filter(|&b| b <= recovery_point).max().unwrap_or(log_bases[0])
    };
    if !clean {
        info!(dir = %dir.display(), recovery_point, from_segment = scan_from, "unclean shutdown: recovering");
    }
    let mut rescanned_from = (!clean).then_some(scan_from);
    let mut cut = None;

    for (i, &base) in log_bases.iter().enumerate() {
        let next_base = log_bases.get(i + 1).copied();
        let segment = segments.get_mut(&base).expect("opened above");
        if base < scan_from {
            // Sealed and flushed: trust it if its indexes check out.
            segment.set_next_offset(next_base.expect("scan_from is a later segment"));
            if segment.indexes_valid() && !segment.is_empty() {
                continue;
            }
            info!(file = %segment.log_path().display(), "rebuilding indexes");
        } else if clean && next_base.is_none() {
            segment.set_next_offset(i64::MAX);
            if segment.indexes_valid() && segment.verify_tail()? {
                continue;
            }
            info!(file = %segment.log_path().display(), "tail check failed after clean shutdown: scanning the segment");
            rescanned_from = Some(base);
        }
        // The last segment keeps its preallocated indexes: the log activates it next.
        let (limit, last) = (next_base.unwrap_or(i64::MAX), next_base.is_none());
        let end = segment.rebuild_indexes(true, config.index_max_bytes, config.index_interval_bytes, limit, last)?;
        let problem = match (end.error, next_base) {
            (Some(reason), _) => Some(reason),
            // Compaction leaves gaps: a segment may end before the next one starts.
            (None, Some(next)) if next < end.next_offset => {
                Some(format!("segment ends at offset {} but the next segment starts at {next}", end.next_offset))
            }
            _ => None,
        };
        let Some(reason) = problem else {
            if let Some(next) = next_base {
                segment.set_next_offset(next);
            }
            continue;
        };
        if end.next_offset < recovery_point {
            return Err(StorageError::CorruptBehindRecoveryPoint {
                file: segment.log_path().to_path_buf(),
                position: end.position,
                recovery_point,
                reason: format!("{reason}; {}", repair_hint(dir)),
            });
        }
        if next_base.is_some() && !repair {
            // A crash tears only the segment being written; damage in an
            // earlier one is not a torn tail, and cutting there would delete
            // every later, intact segment.
            return Err(StorageError::DamagedSegment {
                file: segment.log_path().to_path_buf(),
                position: end.position,
                reason: format!("{reason} (not the last segment: not a torn tail); {}", repair_hint(dir)),
            });
        }
        warn!(
            file = %segment.log_path().display(),
            position = end.position,
            offset = end.next_offset,
            reason = %reason,
            "truncating the log after a torn or corrupt batch"
        );
        segment.truncate_file(end.position)?;
        rescanned_from = Some(rescanned_from.map_or(base, |r| r.min(base)));
        cut = Some(RepairCut {
            file: segment.log_path().to_path_buf(),
            position: end.position,
            offset: end.next_offset,
            reason,
            segments_deleted: log_bases.len() - i - 1,
        });
        for &later in log_bases[i + 1..].iter().rev() {
            let gone = segments.remove(&later).expect("opened above");
            warn!(file = %gone.log_path().display(), "deleting segment after the truncation point");
            gone.delete_files()?;
        }
        break;
    }

    let active = segments.values().next_back().expect("at least one segment");
    let log_end_offset = active.next_offset();
    if !repair && log_end_offset < recovery_point {
        return Err(StorageError::CorruptBehindRecoveryPoint {
            file: active.log_path().to_path_buf(),
            position: active.size_bytes(),
            recovery_point,
            reason: format!("the log ends at offset {log_end_offset}, below the recovery point"),
        });
    }
    let first_base = *segments.keys().next().expect("at least one segment");
    let log_start_offset = checkpoint_start.max(first_base).min(log_end_offset);
    let cleaner_offset = checkpoint.map_or(0, |c| c.cleaner_offset).clamp(log_start_offset, log_end_offset);
    let recovery_point = recovery_point.min(log_end_offset);
    Ok(Recovered { segments, log_start_offset, recovery_point, cleaner_offset, rescanned_from, checkpoint, cut })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_only_when_well_formed() {
        assert_eq!(parse_name("00000000000000000042.log"), Some((42, "log")));
        assert_eq!(parse_name("00000000000000000042.timeindex"), Some((42, "timeindex")));
        assert_eq!(parse_name("42.log"), None);
        assert_eq!(parse_name("checkpoint"), None);
        assert_eq!(parse_name("0000000000000000004x.log"), None);
    }
}
