//! Scenario tests for opening a log after crashes and damage, retention and
//! index rebuilds. Each test: goal, method; reference is storage/src/recovery.rs.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use strand_storage::batch::build_test_batch;
use strand_storage::AppendOrigin;
use strand_storage::{Log, LogConfig, StorageError};

fn config() -> LogConfig {
    LogConfig { segment_bytes: 4096, index_interval_bytes: 300, retention_ms: -1, ..LogConfig::default() }
}

/// Appends `n` batches of two records with timestamps `ts, ts+1, ...`;
/// returns each batch's bytes as stored.
fn append(log: &mut Log, n: usize, ts: i64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut b = build_test_batch(0, ts + i as i64, &[&[i as u8; 150], b"second"]);
            log.append(&mut b, 1, AppendOrigin::Client, ts + i as i64).unwrap();
            b
        })
        .collect()
}

fn read_all(log: &Log, from: i64) -> Vec<u8> {
    let info = log.read(from, usize::MAX, i64::MAX, true).unwrap();
    let mut out = Vec::new();
    for s in &info.slices {
        s.read_into(&mut out).unwrap();
    }
    out
}

fn segment_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

fn garble(path: &Path, position: u64) {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, position).unwrap();
    f.write_all_at(&[!b[0]], position).unwrap();
}

/// Goal: flushed data that is corrupt refuses the open and says where.
/// Method: flush 10 batches, append 2 more, crash, flip a byte inside batch 3
/// (behind the recovery point), reopen.
#[test]
fn corruption_behind_recovery_point_refuses_open_with_file_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 1 << 20, ..config() };
    let mut log = Log::open(dir.path(), cfg.clone(), 0).unwrap();
    let batches = append(&mut log, 10, 1_000);
    log.flush().unwrap();
    assert_eq!(log.recovery_point(), 20);
    append(&mut log, 2, 2_000);
    drop(log); // crash
    let position: u64 = batches[..3].iter().map(|b| b.len() as u64).sum();
    let file = segment_files(dir.path(), "log").remove(0);
    garble(&file, position + 40);
    let err = Log::open(dir.path(), cfg.clone(), 0).unwrap_err();
    match &err {
        StorageError::CorruptBehindRecoveryPoint { file: f, position: p, recovery_point, .. } => {
            assert_eq!(f, &file);
            assert_eq!(*p, position);
            assert_eq!(*recovery_point, 20);
        }
        other => panic!("expected a refusal, got {other}"),
    }
    let message = err.to_string();
    assert!(message.contains("00000000000000000000.log"), "{message}");
    assert!(message.contains(&format!("byte {position}")), "{message}");
    // Nothing was repaired behind the operator's back.
    assert_eq!(
        std::fs::metadata(&file).unwrap().len(),
        batches.iter().map(|b| b.len() as u64).sum::<u64>() + 2 * batches[0].len() as u64
    );
}

/// Goal: after a clean shutdown the tail check still catches flushed data
/// that went missing (the file was cut below the recovery point).
#[test]
fn clean_shutdown_with_missing_flushed_tail_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    append(&mut log, 5, 1_000);
    log.close().unwrap();
    let file = segment_files(dir.path(), "log").pop().unwrap();
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len - 10).unwrap();
    let err = Log::open(dir.path(), config(), 0).unwrap_err();
    assert!(matches!(err, StorageError::CorruptBehindRecoveryPoint { .. }), "{err}");
}

/// Goal: a torn last batch after a crash is cut off and the log continues.
/// Method: flush 5 batches, append 3, crash, chop the file in the middle of
/// the last batch, reopen, append again.
#[test]
fn truncated_tail_after_crash_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    let mut batches = append(&mut log, 5, 1_000);
    log.flush().unwrap();
    batches.extend(append(&mut log, 3, 2_000));
    let end = log.log_end_offset();
    drop(log);
    let file = segment_files(dir.path(), "log").pop().unwrap();
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(len - 20).unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(log.log_end_offset(), end - 2);
    assert_eq!(log.recovery_point(), end - 2);
    assert_eq!(read_all(&log, 0), batches[..7].concat());
    let more = append(&mut log, 1, 3_000);
    assert_eq!(read_all(&log, end - 2), more.concat());
}

/// Goal: garbage after the last batch (a crash mid-write of a new batch, or
/// junk) is cut off, after an unclean and after a clean shutdown.
#[test]
fn garbage_tail_is_repaired() {
    for clean in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        let batches = append(&mut log, 6, 1_000);
        if clean {
            log.close().unwrap();
        } else {
            drop(log);
        }
        let file = segment_files(dir.path(), "log").pop().unwrap();
        let len = std::fs::metadata(&file).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(&[0x42; 100], len).unwrap();
        drop(f);
        let log = Log::open(dir.path(), config(), 0).unwrap();
        assert_eq!(log.log_end_offset(), 12, "clean={clean}");
        assert_eq!(std::fs::metadata(&file).unwrap().len(), len);
        assert_eq!(read_all(&log, 0), batches.concat());
    }
}

/// Goal: damage in a segment that is not the last one is not a torn tail,
/// even past the recovery point: the open is refused naming the file and the
/// byte, and no later, intact segment is deleted. `Log::repair` (behind
/// `strand --repair-log --truncate`) then cuts there on purpose.
/// Method: flush 3 batches, append 60 more over several segments, crash,
/// flip a byte in the second segment, reopen; then repair and reopen.
#[test]
fn damage_in_an_earlier_unflushed_segment_refuses_open_until_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    append(&mut log, 3, 1_000);
    log.flush().unwrap();
    let batches = append(&mut log, 60, 2_000);
    assert!(log.segment_count() >= 4);
    drop(log);
    let files = segment_files(dir.path(), "log");
    garble(&files[1], 100);
    match Log::open(dir.path(), config(), 0) {
        Err(StorageError::DamagedSegment { file, position, reason }) => {
            assert_eq!(file, files[1]);
            assert_eq!(position, 0, "the first batch of the segment holds byte 100");
            assert!(reason.contains("--repair-log"), "{reason}");
        }
        other => panic!("expected DamagedSegment, got {other:?}"),
    }
    assert!(files.iter().all(|f| f.exists()), "no segment deleted by a refused open");
    // Still refused on the next try: nothing was changed.
    assert!(matches!(Log::open(dir.path(), config(), 0), Err(StorageError::DamagedSegment { .. })));

    let (log, cut) = Log::repair(dir.path(), config(), 0).unwrap();
    let cut = cut.expect("the repair cut the log");
    let base: i64 = files[1].file_stem().unwrap().to_str().unwrap().parse().unwrap();
    assert_eq!((cut.file.as_path(), cut.position, cut.offset), (files[1].as_path(), 0, base));
    assert_eq!(cut.segments_deleted, files.len() - 2);
    assert_eq!(log.log_end_offset(), base);
    assert!(!files[2].exists());
    assert!(read_all(&log, 6).starts_with(&batches[0]));
    log.close().unwrap();
    let log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(log.log_end_offset(), base);
}

/// Goal: bytes a process did not write and recovery did not re-read (sealed
/// segments after a clean shutdown) are checked before a read serves them,
/// so a flipped record byte or a flipped base offset (outside the CRC) is an
/// error, never data; the scrubber finds the same damage without a read.
/// Method: 40 batches over several segments, clean close, flip a byte in a
/// sealed segment, reopen (which succeeds: only the last segment is
/// checked after a clean shutdown), read across it, scrub.
#[test]
fn unverified_damage_is_refused_by_reads_and_found_by_the_scrubber() {
    for (what, at) in [("a record byte", 100u64), ("the base offset", 1)] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config(), 0).unwrap();
        append(&mut log, 80, 1_000);
        assert!(log.segment_count() >= 4);
        log.close().unwrap();
        let files = segment_files(dir.path(), "log");
        garble(&files[1], at);
        let log = Log::open(dir.path(), config(), 0).unwrap();
        // A read from the start serves the first segment and stops before the damaged one.
        let served = log.read(0, usize::MAX, i64::MAX, true).unwrap();
        assert_eq!(served.bytes as u64, std::fs::metadata(&files[0]).unwrap().len(), "{what}");
        let base: i64 = files[1].file_stem().unwrap().to_str().unwrap().parse().unwrap();
        match log.read(base, usize::MAX, i64::MAX, true) {
            Err(StorageError::DamagedSegment { file, .. }) => assert_eq!(file, files[1], "{what}"),
            other => panic!("{what}: expected DamagedSegment, got {other:?}"),
        }
        // The scrubber: the never-verified segments come first; the damaged one fails.
        let mut found = None;
        while let Some((base, job)) = log.scrub_next(10_000, 1_000_000) {
            match job.run(&mut |_| true) {
                Ok(done) => {
                    assert!(done);
                    assert!(log.finish_scrub(base, &job, 10_000));
                }
                Err(e) => {
                    found = Some(e);
                    break;
                }
            }
        }
        match found {
            Some(StorageError::DamagedSegment { file, .. }) => assert_eq!(file, files[1], "{what}"),
            other => panic!("{what}: the scrubber found {other:?}"),
        }
    }
}

/// Goal: a scrubbed log is served without re-checking, and the
/// scrubber is done once every segment is verified (until the interval).
#[test]
fn scrubbing_an_intact_log_verifies_every_segment_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    let batches = append(&mut log, 40, 1_000);
    log.close().unwrap();
    let log = Log::open(dir.path(), config(), 0).unwrap();
    let mut jobs = 0;
    while let Some((base, job)) = log.scrub_next(5_000, 1_000_000) {
        assert!(job.run(&mut |_| true).unwrap());
        assert!(log.finish_scrub(base, &job, 5_000));
        jobs += 1;
        assert!(jobs <= log.segment_count(), "each segment once");
    }
    // Every sealed segment, and the active one up to its last index entry
    // (a clean open checks only the tail after it).
    assert_eq!(jobs, log.segment_count());
    assert!(log.scrub_next(5_000 + 999_999, 1_000_000).is_none());
    assert!(log.scrub_next(5_000 + 1_000_000, 1_000_000).is_some(), "due again after the interval");
    assert_eq!(read_all(&log, 0), batches.concat());
}

/// Goal: retention by time and by bytes deletes whole old segments and
/// advances the log start offset; reads below it are out of range.
#[test]
fn retention_by_time_and_bytes_advances_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 1024, ..config() };
    let mut log = Log::open(dir.path(), cfg.clone(), 0).unwrap();
    append(&mut log, 30, 1_000); // timestamps 1000..1029
    append(&mut log, 30, 100_000); // timestamps 100000..100029
    let segments = log.segment_count();
    assert!(segments > 6);

    log.set_config(LogConfig { retention_ms: 50_000, ..cfg.clone() });
    let deleted = log.enforce_retention(101_000, i64::MAX).unwrap();
    assert!(deleted > 0);
    let start = log.log_start_offset();
    assert!(start > 0 && start <= 60, "start {start}");
    assert!(matches!(log.read(start - 1, 100, i64::MAX, true), Err(StorageError::OffsetOutOfRange { .. })));
    assert!(log.read(start, 100, i64::MAX, true).unwrap().bytes > 0);
    assert_eq!(log.lookup_timestamp(0).unwrap().unwrap().batch[..8], start.to_be_bytes());

    log.set_config(LogConfig { retention_bytes: 5_000, ..cfg.clone() });
    log.enforce_retention(101_000, i64::MAX).unwrap();
    assert!(log.log_start_offset() > start);
    assert!(log.size_bytes() >= 5_000 || log.segment_count() == 1);
    let size_after = log.size_bytes();
    let first_segment = segment_files(dir.path(), "log").remove(0);
    let first_size = std::fs::metadata(&first_segment).unwrap().len();
    assert!(size_after - first_size < 5_000, "deleting one more would still leave 5000 bytes");

    // Everything expired: the active segment is rolled and deleted too.
    log.set_config(LogConfig { retention_ms: 10, ..cfg.clone() });
    log.enforce_retention(1_000_000, i64::MAX).unwrap();
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.log_start_offset(), 120);
    assert_eq!(log.log_end_offset(), 120);
    log.close().unwrap();
    let log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (120, 120));
}

/// Goal: delete_records persists the new log start offset at once (even
/// through a crash) and refuses offsets outside the log.
#[test]
fn delete_records_is_persisted_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    let batches = append(&mut log, 40, 1_000);
    assert_eq!(log.delete_records(33).unwrap(), 33);
    assert!(matches!(log.delete_records(10), Err(StorageError::OffsetOutOfRange { .. })));
    assert!(matches!(log.delete_records(81), Err(StorageError::OffsetOutOfRange { .. })));
    drop(log);
    let log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(log.log_start_offset(), 33);
    assert!(matches!(log.read(32, 100, i64::MAX, true), Err(StorageError::OffsetOutOfRange { .. })));
    assert_eq!(read_all(&log, 33), batches[16..].concat());
}

/// Goal: deleted or damaged index files are rebuilt from the log, never refused.
#[test]
fn index_rebuilt_when_deleted_or_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    let batches = append(&mut log, 40, 1_000);
    log.close().unwrap();
    let indexes = segment_files(dir.path(), "index");
    let time_indexes = segment_files(dir.path(), "timeindex");
    let sizes: Vec<u64> = indexes.iter().map(|p| std::fs::metadata(p).unwrap().len()).collect();
    assert!(sizes[0] > 0);
    std::fs::remove_file(&indexes[0]).unwrap();
    std::fs::remove_file(&time_indexes[0]).unwrap();
    std::fs::write(&indexes[1], b"not an index").unwrap();
    let log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(std::fs::metadata(&indexes[0]).unwrap().len(), sizes[0]);
    assert_eq!(std::fs::metadata(&indexes[1]).unwrap().len(), sizes[1]);
    for offset in 0..80 {
        let info = log.read(offset, 1, i64::MAX, true).unwrap();
        let mut got = Vec::new();
        info.slices[0].read_into(&mut got).unwrap();
        assert_eq!(got, batches[offset as usize / 2]);
    }
    assert_eq!(log.lookup_timestamp(1_003).unwrap().unwrap().batch, batches[3]);
    assert_eq!(log.lookup_max_timestamp().unwrap().unwrap().batch, batches[39]);
}

/// Goal: a fetch that holds a slice can still read it after retention
/// deleted the segment.
#[test]
fn slices_outlive_deleted_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    let batches = append(&mut log, 30, 1_000);
    let info = log.read(0, 200, i64::MAX, true).unwrap();
    log.delete_records(log.log_end_offset()).unwrap();
    log.set_config(LogConfig { retention_bytes: 0, ..config() });
    log.enforce_retention(0, i64::MAX).unwrap();
    assert!(!segment_files(dir.path(), "log")[0].ends_with("00000000000000000000.log"));
    let mut got = Vec::new();
    info.slices[0].read_into(&mut got).unwrap();
    assert_eq!(got, batches[0]);
}

/// Goal: roll by roll_ms (measured from the first batch's timestamp) and by a full index.
#[test]
fn rolls_by_time_and_full_index() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 1 << 20, roll_ms: 1_000, ..config() };
    let mut log = Log::open(dir.path(), cfg.clone(), 0).unwrap();
    append(&mut log, 3, 10_000);
    assert_eq!(log.segment_count(), 1);
    let mut b = build_test_batch(0, 11_500, &[b"late"]);
    log.append(&mut b, 1, AppendOrigin::Client, 11_500).unwrap();
    assert_eq!(log.segment_count(), 2);

    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 1 << 20, index_interval_bytes: 0, index_max_bytes: 64, ..config() };
    let mut log = Log::open(dir.path(), cfg, 0).unwrap();
    append(&mut log, 30, 1_000);
    assert!(log.segment_count() >= 4, "{} segments", log.segment_count());
}

/// Goal: an empty directory is a new log; leftover temp files and an empty
/// active segment are fine; delete() removes the directory.
#[test]
fn empty_and_leftover_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let log = Log::open(&path, config(), 0).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset(), log.size_bytes()), (0, 0, 0));
    drop(log);
    std::fs::write(path.join("checkpoint.tmp"), b"half").unwrap();
    std::fs::write(path.join("00000000000000000099.index"), b"orphan!!").unwrap();
    let log = Log::open(&path, config(), 0).unwrap();
    assert!(!path.join("checkpoint.tmp").exists());
    assert!(!path.join("00000000000000000099.index").exists());
    assert_eq!(log.segment_count(), 1);
    log.delete().unwrap();
    assert!(!path.exists());
}

/// Goal: a corrupt checkpoint is reported, not guessed around.
#[test]
fn corrupt_checkpoint_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    append(&mut log, 2, 0);
    log.close().unwrap();
    garble(&dir.path().join("checkpoint"), 10);
    assert!(matches!(Log::open(dir.path(), config(), 0), Err(StorageError::CorruptFile { .. })));
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

/// Goal: reopening after a crash with nothing written since the last flush
/// (an idle broker killed) rewrites nothing: the checkpoint stays the same
/// file (a rewrite is a rename, a new inode), and the log is as it was. An
/// empty log likewise. Restart then costs no fsync per partition.
#[test]
fn reopen_after_a_crash_with_nothing_unflushed_rewrites_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    let batches = append(&mut log, 30, 1_000);
    log.flush().unwrap();
    drop(log); // kill -9
    let checkpoint = dir.path().join("checkpoint");
    let before = (inode(&checkpoint), std::fs::read(&checkpoint).unwrap());
    let log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!((inode(&checkpoint), std::fs::read(&checkpoint).unwrap()), before, "checkpoint untouched");
    assert_eq!(read_all(&log, 0), batches.concat());
    assert_eq!(log.recovery_point(), log.log_end_offset());
    drop(log);

    let empty = tempfile::tempdir().unwrap();
    drop(Log::open(empty.path(), config(), 0).unwrap());
    let checkpoint = empty.path().join("checkpoint");
    let before = inode(&checkpoint);
    drop(Log::open(empty.path(), config(), 0).unwrap());
    assert_eq!(inode(&checkpoint), before, "an empty log reopened after a crash: checkpoint untouched");
}

/// Goal: the background flush (log.flush.offset.checkpoint.interval.ms)
/// moves the recovery point to the log end as it was when planned, even if
/// appends came between the plan's fsync and its completion, and a crash
/// after it recovers from there.
#[test]
fn background_flush_moves_the_recovery_point_over_what_it_synced() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    append(&mut log, 30, 1_000);
    let end = log.log_end_offset();
    assert!(log.recovery_point() < end);
    let plan = log.flush_plan().expect("unflushed data");
    plan.sync().unwrap();
    append(&mut log, 3, 5_000); // appended while the plan was synced
    assert!(log.complete_flush(plan).unwrap());
    assert_eq!(log.recovery_point(), end, "not past what the plan synced");
    assert!(log.flush_plan().is_some(), "the later appends are still unflushed");
    drop(log);
    let log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(log.log_end_offset(), end + 6);
}
