//! Scenario tests for producer state: idempotent producers (duplicates,
//! sequence and epoch errors), transactions (LSO, markers, the aborted
//! transaction index), and their survival across close, crash, roll,
//! truncation and cleaning. Reference: storage/src/producer_state.rs.

use std::path::Path;

use strand_storage::batch::{build_control_batch, build_producer_batch};
use strand_storage::AppendOrigin;
use strand_storage::{AbortedTxn, Log, LogConfig, ProducerError, StorageError};

fn config() -> LogConfig {
    LogConfig { segment_bytes: 2048, index_interval_bytes: 256, retention_ms: -1, ..LogConfig::default() }
}

fn read_all(log: &Log) -> Vec<u8> {
    let info = log.read(log.log_start_offset(), usize::MAX, i64::MAX, true).unwrap();
    let mut out = Vec::new();
    for s in &info.slices {
        s.read_into(&mut out).unwrap();
    }
    out
}

/// Appends a batch of `n` records of producer `pid`; returns (base, last) offsets.
fn produce(
    log: &mut Log,
    pid: i64,
    epoch: i16,
    seq: i32,
    n: usize,
    txn: bool,
) -> Result<(i64, i64, bool), StorageError> {
    let values: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; 100]).collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    let mut b = build_producer_batch(pid, epoch, seq, txn, 1_000 + seq as i64, &refs);
    let info = log.append(&mut b, 0, AppendOrigin::Client, 1_000)?;
    Ok((info.base_offset, info.last_offset, info.duplicate))
}

fn marker(log: &mut Log, pid: i64, epoch: i16, commit: bool, coordinator_epoch: i32) -> Result<i64, StorageError> {
    let mut b = build_control_batch(pid, epoch, commit, coordinator_epoch, 2_000);
    Ok(log.append(&mut b, 0, AppendOrigin::Client, 2_000)?.base_offset)
}

fn snapshots(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".snapshot"))
        .collect();
    v.sort();
    v
}

/// Goal: retries answer with the original offsets and write nothing; gaps
/// and stale epochs are refused and write nothing.
#[test]
fn idempotent_appends_duplicates_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(produce(&mut log, 7, 0, 0, 3, false).unwrap(), (0, 2, false));
    assert_eq!(produce(&mut log, 7, 0, 3, 2, false).unwrap(), (3, 4, false));
    let size = log.size_bytes();
    let bytes = read_all(&log);
    assert_eq!(produce(&mut log, 7, 0, 0, 3, false).unwrap(), (0, 2, true));
    assert_eq!(produce(&mut log, 7, 0, 3, 2, false).unwrap(), (3, 4, true));
    let err = produce(&mut log, 7, 0, 6, 1, false).unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::Producer(ProducerError::OutOfOrderSequence { producer_id: 7, expected: 5, got: 6 })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("producer 7") && err.to_string().contains("expected 5"), "{err}");
    let err = produce(&mut log, 7, 1, 5, 1, false).unwrap_err();
    assert!(matches!(err, StorageError::Producer(ProducerError::OutOfOrderSequence { expected: 0, got: 5, .. })));
    assert_eq!(produce(&mut log, 7, 1, 0, 1, false).unwrap(), (5, 5, false));
    let err = produce(&mut log, 7, 0, 5, 1, false).unwrap_err();
    assert!(
        matches!(err, StorageError::Producer(ProducerError::InvalidProducerEpoch { epoch: 0, current_epoch: 1, .. })),
        "{err}"
    );
    // A request with a good batch and a bad one writes nothing.
    let mut good = build_producer_batch(8, 0, 0, false, 1, &[b"a"]);
    let bad = build_producer_batch(7, 1, 9, false, 1, &[b"b"]);
    good.extend_from_slice(&bad);
    assert!(matches!(log.append(&mut good, 0, AppendOrigin::Client, 0), Err(StorageError::Producer(_))));
    assert_eq!(log.log_end_offset(), 6);
    assert!(log.producers().iter().all(|p| p.producer_id != 8));
    assert_eq!(&read_all(&log)[..bytes.len()], &bytes[..]);
    assert!(log.size_bytes() > size, "only the epoch-1 batch was added");
    let p = log.producers();
    assert_eq!(p.len(), 1);
    assert_eq!(
        (p[0].producer_id, p[0].producer_epoch, p[0].last_sequence, p[0].current_txn_start_offset),
        (7, 1, 0, -1)
    );
}

/// Goal: duplicate detection survives a clean close, a crash (drop without
/// close) and rolls: the state comes from a snapshot plus a replay.
#[test]
fn duplicates_detected_after_close_crash_and_roll() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    let mut offsets = Vec::new();
    for i in 0..30 {
        offsets.push(produce(&mut log, 1, 0, i * 2, 2, false).unwrap());
    }
    assert!(log.segment_count() > 3, "rolled");
    assert!(!snapshots(dir.path()).is_empty(), "a snapshot per roll");
    // Snapshots at or above the recovery point's segment are kept for unclean recovery; once
    // flushed, a roll keeps the newest two.
    log.flush().unwrap();
    log.roll(0).unwrap();
    assert_eq!(snapshots(dir.path()).len(), 2, "old snapshots pruned: {:?}", snapshots(dir.path()));
    log.close().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    for (i, &(base, last, _)) in offsets.iter().enumerate().skip(25) {
        assert_eq!(produce(&mut log, 1, 0, i as i32 * 2, 2, false).unwrap(), (base, last, true));
    }
    assert!(produce(&mut log, 1, 0, 10, 2, false).is_err(), "older than the last 5: out of order");
    // Crash: the snapshot at the active segment's base plus a replay of its batches.
    for i in 30..40 {
        offsets.push(produce(&mut log, 1, 0, i * 2, 2, false).unwrap());
    }
    let end = log.log_end_offset();
    drop(log);
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(log.log_end_offset(), end);
    assert_eq!(produce(&mut log, 1, 0, 78, 2, false).unwrap(), (offsets[39].0, offsets[39].1, true));
    assert_eq!(produce(&mut log, 1, 0, 70, 2, false).unwrap(), (offsets[35].0, offsets[35].1, true));
    assert!(!produce(&mut log, 1, 0, 80, 1, false).unwrap().2);
    // A crash with every snapshot gone: a replay from the log start.
    drop(log);
    for name in snapshots(dir.path()) {
        std::fs::remove_file(dir.path().join(name)).unwrap();
    }
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    assert!(produce(&mut log, 1, 0, 80, 1, false).unwrap().2);
    assert!(!produce(&mut log, 1, 0, 81, 1, false).unwrap().2);
    // A corrupt newest snapshot is skipped with a warning, not a refusal.
    log.close().unwrap();
    let names = snapshots(dir.path());
    let newest = dir.path().join(names.last().unwrap());
    let mut bytes = std::fs::read(&newest).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(&newest, &bytes).unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    assert!(produce(&mut log, 1, 0, 81, 1, false).unwrap().2);
    assert!(!produce(&mut log, 1, 0, 82, 1, false).unwrap().2);
}

/// Goal: an open transaction holds the LSO; COMMIT and ABORT markers close
/// it; aborted transactions are found for any overlapping fetch range, after
/// a reopen, and after a crash that lost the index file (rebuilt by recovery).
#[test]
fn transactions_lso_and_aborted_index() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    produce(&mut log, 1, 0, 0, 2, false).unwrap(); // 0..=1 idempotent
    assert_eq!(log.last_stable_offset(2), 2);
    produce(&mut log, 2, 0, 0, 2, true).unwrap(); // 2..=3 txn of 2
    produce(&mut log, 3, 0, 0, 1, true).unwrap(); // 4 txn of 3
    assert_eq!(log.last_stable_offset(5), 2);
    assert_eq!(log.last_stable_offset(1), 1, "capped by the high watermark");
    let err = produce(&mut log, 2, 0, 2, 1, false).unwrap_err();
    assert!(matches!(err, StorageError::Producer(ProducerError::InvalidTxnState { producer_id: 2, .. })), "{err}");
    produce(&mut log, 2, 0, 2, 1, true).unwrap(); // 5
    assert_eq!(marker(&mut log, 2, 0, true, 0).unwrap(), 6); // COMMIT [2, 6]
    assert_eq!(log.last_stable_offset(100), 4);
    assert_eq!(marker(&mut log, 3, 0, false, 0).unwrap(), 7); // ABORT [4, 7]
    assert_eq!(log.last_stable_offset(100), 100);
    produce(&mut log, 2, 0, 3, 3, true).unwrap(); // 8..=10
    assert_eq!(marker(&mut log, 2, 0, false, 0).unwrap(), 11); // ABORT [8, 11]
    let err = marker(&mut log, 2, 0, false, -1).unwrap_err();
    assert!(matches!(err, StorageError::Producer(ProducerError::CoordinatorFenced { .. })), "{err}");
    // Many more transactions so entries spread over segments.
    let mut expected = vec![
        AbortedTxn { producer_id: 3, first_offset: 4, last_offset: 7 },
        AbortedTxn { producer_id: 2, first_offset: 8, last_offset: 11 },
    ];
    for i in 0..20 {
        let (first, _, _) = produce(&mut log, 3, 0, 1 + i * 4, 4, true).unwrap();
        let abort = i % 2 == 0;
        let at = marker(&mut log, 3, 0, !abort, 0).unwrap();
        if abort {
            expected.push(AbortedTxn { producer_id: 3, first_offset: first, last_offset: at });
        }
    }
    assert!(log.segment_count() > 2);
    let end = log.log_end_offset();
    let check = |log: &Log| {
        assert_eq!(log.aborted_transactions(0, end), expected);
        assert_eq!(log.aborted_transactions(0, 4), vec![]);
        assert_eq!(log.aborted_transactions(0, 5), expected[..1].to_vec());
        assert_eq!(log.aborted_transactions(7, 8), expected[..1].to_vec());
        assert_eq!(log.aborted_transactions(8, 9), expected[1..2].to_vec());
        assert_eq!(log.aborted_transactions(12, end), expected[2..].to_vec());
        let mid = expected[5];
        assert_eq!(log.aborted_transactions(mid.first_offset + 1, mid.first_offset + 2), vec![mid]);
        assert_eq!(log.last_stable_offset(end), end);
    };
    check(&log);
    log.close().unwrap();
    assert!(std::fs::read_dir(dir.path()).unwrap().any(|e| e
        .unwrap()
        .path()
        .extension()
        .is_some_and(|x| x == "txnindex")));
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    check(&log);
    // An open transaction is in the snapshot: it still holds the LSO after a reopen.
    let (open_first, _, _) = produce(&mut log, 9, 0, 0, 1, true).unwrap();
    log.close().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(log.last_stable_offset(i64::MAX), open_first);
    assert_eq!(log.producers().iter().find(|p| p.producer_id == 9).unwrap().current_txn_start_offset, open_first);
    let at = marker(&mut log, 9, 0, false, 1).unwrap();
    expected.push(AbortedTxn { producer_id: 9, first_offset: open_first, last_offset: at });
    assert_eq!(log.last_stable_offset(i64::MAX), i64::MAX);
    // Crash, and the active segment's index file is lost: recovery rescans
    // the segment and the replay rebuilds it.
    let end = log.log_end_offset();
    drop(log);
    let active = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txnindex"))
        .max()
        .unwrap();
    std::fs::remove_file(&active).unwrap();
    let log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(log.aborted_transactions(0, end), expected);
}

/// Goal: truncation rebuilds the producer state and the transaction index
/// as of the new end: a truncated batch may be written again, a truncated
/// abort is forgotten and its transaction is open again.
#[test]
fn truncation_rebuilds_producer_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    for i in 0..20 {
        produce(&mut log, 1, 0, i, 1, false).unwrap();
    }
    let (txn_first, _, _) = produce(&mut log, 2, 0, 0, 2, true).unwrap();
    let abort_at = marker(&mut log, 2, 0, false, 0).unwrap();
    assert_eq!(log.aborted_transactions(0, abort_at + 1).len(), 1);
    log.truncate_to(abort_at).unwrap();
    assert_eq!(log.aborted_transactions(0, abort_at + 1), vec![]);
    assert_eq!(log.last_stable_offset(i64::MAX), txn_first);
    log.truncate_to(15).unwrap();
    assert_eq!(log.last_stable_offset(i64::MAX), i64::MAX);
    assert!(log.producers().iter().all(|p| p.producer_id != 2));
    assert_eq!(produce(&mut log, 1, 0, 15, 1, false).unwrap(), (15, 15, false), "no longer a duplicate");
    assert_eq!(produce(&mut log, 1, 0, 14, 1, false).unwrap(), (14, 14, true));
    assert!(snapshots(dir.path()).iter().all(|n| n[..20].parse::<i64>().unwrap() <= 16));
    log.close().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(produce(&mut log, 1, 0, 15, 1, false).unwrap(), (15, 15, true));
    // Truncation below the log start empties the state.
    log.delete_records(10).unwrap();
    log.truncate_to(5).unwrap();
    assert!(log.producers().is_empty());
    assert_eq!(produce(&mut log, 1, 0, 42, 1, false).unwrap(), (5, 5, false), "unknown again");
}

/// Goal: producers are forgotten after `producer_id_expiration_ms` unless
/// they have an open transaction, and are then accepted with any sequence.
#[test]
fn expiry() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { producer_id_expiration_ms: 10_000, ..config() };
    let mut log = Log::open(dir.path(), cfg.clone(), 0).unwrap();
    produce(&mut log, 1, 0, 0, 1, false).unwrap(); // timestamp 1000
    produce(&mut log, 2, 0, 0, 1, true).unwrap();
    assert_eq!(log.expire_producers(5_000), 0);
    assert_eq!(log.expire_producers(11_000), 1);
    assert_eq!(log.producers().iter().map(|p| p.producer_id).collect::<Vec<_>>(), vec![2]);
    assert!(!produce(&mut log, 1, 0, 9, 1, false).unwrap().2);
    log.close().unwrap();
    // Expired producers in the snapshot are dropped at open (Kafka does the same).
    let log = Log::open(dir.path(), cfg, 100_000).unwrap();
    assert_eq!(log.producers().iter().map(|p| p.producer_id).collect::<Vec<_>>(), vec![2]);
}

/// Goal: compaction keeps aborted transactions (their batches stay whole
/// and the cleaned segment keeps the index entries).
#[test]
fn cleaning_keeps_aborted_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { cleanup_compact: true, cleanup_delete: false, ..config() };
    let mut log = Log::open(dir.path(), cfg.clone(), 0).unwrap();
    let mut expected = Vec::new();
    for i in 0..12 {
        let (first, _, _) = produce(&mut log, 5, 0, i * 3, 3, true).unwrap();
        let at = marker(&mut log, 5, 0, i % 3 != 0, 0).unwrap();
        if i % 3 == 0 {
            expected.push(AbortedTxn { producer_id: 5, first_offset: first, last_offset: at });
        }
    }
    log.roll(3_000).unwrap();
    let end = log.log_end_offset();
    assert_eq!(log.aborted_transactions(0, end), expected);
    let stats = log.clean(3_000, true).unwrap();
    assert!(stats.segments_cleaned > 0);
    assert_eq!(log.aborted_transactions(0, end), expected);
    log.close().unwrap();
    let log = Log::open(dir.path(), cfg, 0).unwrap();
    assert_eq!(log.aborted_transactions(0, end), expected);
}
