//! Log compaction scenarios. Goal: after `clean`, every key's latest value
//! is at its original offset, older versions and expired tombstones are gone,
//! reads work from every offset, the log start/end offsets are unchanged,
//! and all of it survives a clean reopen, a crash and a crash mid-clean.
//! Method: many versions of a few keys over many small segments, written as
//! uncompressed, gzip and zstd batches with kafka-protocol's encoder; a
//! reference map of the latest value per key. Reference: Kafka's LogCleaner
//! and the "Log Compaction" docs; storage/src/cleaner.rs.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use strand_storage::batch;
use strand_storage::AppendOrigin;
use strand_storage::{Log, LogConfig};

const DAY: i64 = 24 * 3600 * 1000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 2048,
        index_interval_bytes: 200,
        retention_ms: -1,
        cleanup_delete: false,
        cleanup_compact: true,
        ..LogConfig::default()
    }
}

fn record(key: Option<&str>, value: Option<&str>, offset: i64, ts: i64) -> Record {
    Record {
        transactional: false,
        delete_horizon: false,
        control: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: -1,
        timestamp: ts,
        key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
        value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
        headers: IndexMap::new(),
    }
}

fn encode(records: &[Record], compression: Compression) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, records, &RecordEncodeOptions { version: 2, compression }).unwrap();
    buf.to_vec()
}

/// (offset, key, value) of every record readable from `from`.
fn read_records(log: &Log, from: i64) -> Vec<(i64, Option<String>, Option<String>)> {
    let info = log.read(from, usize::MAX, i64::MAX, true).unwrap();
    let mut bytes = Vec::new();
    for s in &info.slices {
        s.read_into(&mut bytes).unwrap();
    }
    batch::validate_all(&bytes, AppendOrigin::Coordinator).unwrap();
    let mut buf = Bytes::from(bytes);
    let mut out = Vec::new();
    for set in RecordBatchDecoder::decode_all(&mut buf).unwrap() {
        for r in set.records {
            let s = |b: Option<Bytes>| b.map(|b| String::from_utf8(b.to_vec()).unwrap());
            out.push((r.offset, s(r.key), s(r.value)));
        }
    }
    out
}

type Latest = BTreeMap<String, (i64, Option<String>)>;

/// Appends `rounds` rounds over `keys` keys: each round one batch per codec
/// (of several records), every 7th record a tombstone; returns key → latest.
fn fill(log: &mut Log, rounds: usize, keys: usize, ts: i64, latest: &mut Latest) {
    let codecs = [Compression::None, Compression::Gzip, Compression::Zstd, Compression::Lz4, Compression::Snappy];
    let mut n = 0usize;
    for round in 0..rounds {
        let compression = codecs[round % codecs.len()];
        let records: Vec<Record> = (0..4)
            .map(|i| {
                n += 1;
                let key = format!("key-{}", (n * 7 + i) % keys);
                let value = (!n.is_multiple_of(7)).then(|| format!("value-{round}-{i}-{}", "x".repeat(n % 40)));
                record(Some(&key), value.as_deref(), i as i64, ts)
            })
            .collect();
        let mut b = encode(&records, compression);
        let info = log.append(&mut b, 1, AppendOrigin::Client, ts).unwrap();
        for (i, r) in records.iter().enumerate() {
            let key = String::from_utf8(r.key.clone().unwrap().to_vec()).unwrap();
            let value = r.value.as_ref().map(|v| String::from_utf8(v.to_vec()).unwrap());
            latest.insert(key, (info.base_offset + i as i64, value));
        }
    }
    // Deletes of three keys, as the last word on them.
    let tombstones: Vec<Record> = (0..3).map(|i| record(Some(&format!("key-{i}")), None, i, ts)).collect();
    let info = log.append(&mut encode(&tombstones, Compression::Gzip), 1, AppendOrigin::Client, ts).unwrap();
    for i in 0..3 {
        latest.insert(format!("key-{i}"), (info.base_offset + i, None));
    }
}

/// Checks the log against `latest`: sealed part exactly the latest version
/// of each key (tombstones only if `tombstones`), active part untouched.
fn check(log: &Log, latest: &Latest, tombstones: bool, end: i64) {
    assert_eq!(log.log_end_offset(), end);
    let all = read_records(log, 0);
    let mut seen: BTreeMap<String, (i64, Option<String>)> = BTreeMap::new();
    for (offset, key, value) in &all {
        seen.insert(key.clone().unwrap(), (*offset, value.clone()));
    }
    for (key, want) in latest {
        match seen.get(key) {
            Some(got) => assert_eq!(got, want, "key {key}"),
            None => assert!(!tombstones && want.1.is_none(), "key {key} missing, latest {want:?}"),
        }
    }
    // Every offset reads: from the batch holding it or the next one.
    for offset in 0..end {
        let got = read_records(log, offset);
        let want: Vec<_> = all.iter().filter(|r| r.0 >= offset).cloned().collect();
        let trimmed: Vec<_> = got.iter().filter(|r| r.0 >= offset).cloned().collect();
        assert_eq!(trimmed, want, "read from {offset}");
        assert!(got.first().is_none_or(|r| r.0 <= offset || all.iter().all(|a| a.0 < offset || a.0 >= r.0)));
    }
}

fn cleaned_leftovers(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let n = e.as_ref().unwrap().file_name().to_string_lossy().into_owned();
            n.ends_with(".cleaned") || n.ends_with(".swap")
        })
        .count()
}

#[test]
fn compaction_keeps_latest_per_key_and_expires_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    let mut latest = Latest::new();
    fill(&mut log, 150, 12, 1_000, &mut latest);
    log.roll(1_000).unwrap();
    let end = log.log_end_offset();
    let (size, segments) = (log.size_bytes(), log.segment_count());
    assert!(segments > 10, "{segments} segments");

    let stats = log.clean(2_000, false).unwrap();
    assert!(stats.segments_cleaned >= segments - 1, "{stats:?}");
    assert!(stats.records_removed > 500, "{stats:?}");
    assert!(log.size_bytes() < size / 5, "{} of {size} bytes", log.size_bytes());
    assert!(log.segment_count() < segments);
    assert_eq!(log.log_start_offset(), 0);
    check(&log, &latest, true, end);
    assert_eq!(read_records(&log, 0).iter().filter(|r| r.2.is_none()).count(), 3, "tombstones kept for now");
    assert_eq!(log.cleaner_offset(), end);
    // Nothing dirty: a second pass does nothing unless forced, and forced changes nothing.
    assert_eq!(log.clean(3_000, false).unwrap().segments_cleaned, 0);
    assert_eq!(log.clean(3_000, true).unwrap().records_removed, 0);

    // Clean reopen keeps it; then tombstones expire after delete_retention_ms.
    log.close().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    check(&log, &latest, true, end);
    let stats = log.clean(1_000 + DAY + 1, true).unwrap();
    assert!(stats.records_removed > 0, "{stats:?}");
    check(&log, &latest, false, end);
    assert!(read_records(&log, 0).iter().all(|r| r.2.is_some()), "a tombstone survived");

    // More data on top, then a crash (no close) after another clean.
    fill(&mut log, 40, 12, 2 * DAY, &mut latest);
    log.roll(2 * DAY).unwrap();
    let end = log.log_end_offset();
    log.clean(2 * DAY, true).unwrap();
    check(&log, &latest, false, end);
    drop(log);
    let log = Log::open(dir.path(), config(), 2 * DAY).unwrap();
    check(&log, &latest, false, end);
    assert_eq!(cleaned_leftovers(dir.path()), 0);
    // lookup_timestamp over gaps.
    assert!(log.lookup_timestamp(0).unwrap().is_some());
    assert!(log.lookup_max_timestamp().unwrap().is_some());
}

#[test]
fn dirty_ratio_lag_and_policy_gate_cleaning() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), LogConfig { cleanup_compact: false, ..config() }, 0).unwrap();
    let mut latest = Latest::new();
    fill(&mut log, 60, 5, 1_000, &mut latest);
    assert_eq!(log.clean(2_000, true).unwrap(), Default::default(), "not a compacted log");
    log.set_config(LogConfig { min_compaction_lag_ms: 10_000, ..config() });
    assert_eq!(log.clean(2_000, true).unwrap().segments_cleaned, 0, "all too young");
    log.set_config(config());
    assert!(log.clean(2_000, false).unwrap().segments_cleaned > 0);
    // Retention does nothing without cleanup.policy=delete.
    log.set_config(LogConfig { retention_bytes: 0, retention_ms: 0, ..config() });
    assert_eq!(log.enforce_retention(10 * DAY, i64::MAX).unwrap(), 0);
}

#[test]
fn crash_mid_clean_and_discarded_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Log::open(dir.path(), config(), 0).unwrap();
    let mut latest = Latest::new();
    fill(&mut log, 80, 6, 1_000, &mut latest);
    log.roll(1_000).unwrap();
    let end = log.log_end_offset();
    let before = read_records(&log, 0);

    // A job whose segments are truncated away meanwhile is discarded.
    let job = log.prepare_clean(2_000, true).unwrap();
    let cleaned = job.run().unwrap();
    assert!(cleaned_leftovers(dir.path()) > 0);
    log.truncate_to(end - 30).unwrap();
    assert_eq!(log.install_clean(cleaned).unwrap().segments_cleaned, 0);
    assert_eq!(cleaned_leftovers(dir.path()), 0);
    let kept: Vec<_> = before.iter().filter(|r| r.0 < log.log_end_offset()).cloned().collect();
    assert_eq!(read_records(&log, 0), kept);

    // Crash with .cleaned files written but not swapped: the old data stays.
    let job = log.prepare_clean(2_000, true).unwrap();
    let cleaned = job.run().unwrap();
    std::mem::forget(cleaned);
    assert!(cleaned_leftovers(dir.path()) > 0);
    drop(log);
    let log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(cleaned_leftovers(dir.path()), 0);
    assert_eq!(read_records(&log, 0), kept);

    // Crash after the commit point (.log.swap present): the swap completes.
    let job = log.prepare_clean(2_000, true).unwrap();
    let cleaned = job.run().unwrap();
    let first = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".log.cleaned"))
        .min()
        .unwrap();
    let stem = first.trim_end_matches(".log.cleaned").to_string();
    for suffix in ["index", "timeindex", "log"] {
        std::fs::rename(
            dir.path().join(format!("{stem}.{suffix}.cleaned")),
            dir.path().join(format!("{stem}.{suffix}.swap")),
        )
        .unwrap();
    }
    std::mem::forget(cleaned);
    let end = log.log_end_offset();
    drop(log);
    let log = Log::open(dir.path(), config(), 0).unwrap();
    assert_eq!(log.log_end_offset(), end);
    assert!(dir.path().join(format!("{stem}.log")).exists());
    // Every key's latest version is still readable at its offset.
    let all = read_records(&log, 0);
    let mut seen = BTreeMap::new();
    for r in &all {
        seen.insert(r.1.clone(), (r.0, r.2.clone()));
    }
    let mut want = BTreeMap::new();
    for r in &kept {
        want.insert(r.1.clone(), (r.0, r.2.clone()));
    }
    assert_eq!(seen, want);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
}

#[test]
fn keyless_records_are_detected() {
    let keyed = encode(&[record(Some("a"), Some("1"), 0, 5), record(Some("b"), None, 1, 5)], Compression::Gzip);
    let keyless = encode(&[record(Some("a"), Some("1"), 0, 5), record(None, Some("2"), 1, 5)], Compression::Zstd);
    assert!(batch::all_records_have_keys(&keyed).unwrap());
    assert!(!batch::all_records_have_keys(&keyless).unwrap());
    assert!(!batch::all_records_have_keys(&[keyed.clone(), keyless].concat()).unwrap());
    let mut bad = keyed.clone();
    let at = bad.len() - 3;
    bad[at] ^= 0xff;
    assert!(batch::all_records_have_keys(&bad).is_err());
}
