//! Crash safety of the real `strand` binary.
//!
//! Goal: a record acknowledged with acks=all survives a kill -9 at its
//! offset; a torn or garbage tail left by a crash is cut at the last intact
//! batch and never served; damage to data behind the recovery point (which
//! was fsynced) refuses start-up, naming the file and byte.
//!
//! Method: the binary runs as a child process on a free port with its data in
//! a temporary directory (stderr captured to a file per start). librdkafka
//! produces and consumes (check.crcs=true; any consumer error fails the
//! test). Segment files are edited between runs. Storage behaviour this
//! relies on (storage/src/recovery.rs, log.rs): after a crash every segment
//! from the one holding the recovery point is re-read and cut at the first
//! bad batch; the recovery point moves on open, on explicit flushes, to the
//! active segment's base when housekeeping flushes rolled segments, and to
//! the log end on clean close, so the active segment's tail is always after
//! it; after a clean close only the active segment's tail is checked.

mod common;

use common::child::ChildBroker;

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::producer::{FutureProducer, FutureRecord};

/// A batch as laid out in a segment file.
#[derive(Debug, Clone, Copy)]
struct BatchPos {
    position: u64,
    bytes: u64,
    base_offset: i64,
    last_offset: i64,
}

/// Walks the record batches of a segment file (headers only; stops at the first that does not fit).
fn batches(file: &Path) -> Vec<BatchPos> {
    let data = std::fs::read(file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 61 <= data.len() {
        let base_offset = i64::from_be_bytes(data[pos..pos + 8].try_into().unwrap());
        let length = i32::from_be_bytes(data[pos + 8..pos + 12].try_into().unwrap());
        let delta = i32::from_be_bytes(data[pos + 23..pos + 27].try_into().unwrap());
        let bytes = 12 + length as usize;
        if length < 49 || pos + bytes > data.len() {
            break;
        }
        out.push(BatchPos {
            position: pos as u64,
            bytes: bytes as u64,
            base_offset,
            last_offset: base_offset + delta as i64,
        });
        pos += bytes;
    }
    out
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files
}

/// (recovery point, clean flag) from the storage checkpoint file (storage/src/checkpoint.rs layout).
fn read_checkpoint(dir: &Path) -> (i64, bool) {
    let b = std::fs::read(dir.join("checkpoint")).expect("checkpoint file");
    assert_eq!(&b[0..4], b"SCKP");
    (i64::from_be_bytes(b[7..15].try_into().unwrap()), b[6] & 1 == 1)
}

type Acked = Vec<(i32, i64, Vec<u8>)>;

/// Produces `count` records to partition 0 of `topic` and waits for every acknowledgement.
async fn produce_all(bootstrap: &str, topic: &str, count: usize, tag: &str) -> Acked {
    let producer: FutureProducer =
        common::producer_config(bootstrap).set("batch.size", "4096").set("linger.ms", "2").create().expect("producer");
    let mut pending = Vec::with_capacity(count);
    for i in 0..count {
        let value = format!("{tag}-{i:07}-{}", "v".repeat(60)).into_bytes();
        let record = FutureRecord::<(), [u8]>::to(topic).partition(0).payload(&value);
        let fut = producer.send_result(record).map_err(|(e, _)| e).expect("enqueue");
        pending.push((value, fut));
    }
    let mut acked = Vec::with_capacity(count);
    for (value, fut) in pending {
        let d = fut.await.expect("delivery").unwrap_or_else(|(e, _)| panic!("produce {tag}: {e}"));
        acked.push((d.partition, d.offset, value));
    }
    acked
}

/// Every acknowledged record is at its offset with its value; offsets from
/// the log start are contiguous up to the high watermark; the consumer sees
/// no errors. Returns the high watermark.
async fn verify_partition(bootstrap: &str, topic: &str, partition: i32, acked: &Acked) -> i64 {
    let (low, high) = common::watermarks(bootstrap, topic, partition).await;
    assert_eq!(low, 0, "log start offset");
    let got = common::consume(bootstrap, topic, partition, 0, high as usize, Duration::from_secs(60)).await;
    for (i, (offset, _)) in got.iter().enumerate() {
        assert_eq!(*offset, i as i64, "contiguous offsets in {topic}-{partition}");
    }
    for (p, offset, value) in acked.iter().filter(|(p, _, _)| *p == partition) {
        assert!(*offset < high, "acknowledged {topic}-{p}@{offset} is missing (high watermark {high})");
        assert_eq!(&got[*offset as usize].1, value, "value of acknowledged {topic}-{p}@{offset}");
    }
    high
}

/// kill -9 in the middle of an acks=all stream: after restart every
/// acknowledged record is at its offset, nothing corrupt is served, offsets
/// are contiguous, and new records continue right after the old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_survive_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(tmp.path());
    broker.start();
    let bootstrap = broker.bootstrap();
    let topic = "stream";
    let partitions = 3;
    common::create_topic(&bootstrap, topic, partitions, &[("segment.bytes", "262144")]).await;

    let seed = common::seed("acknowledged_records_survive_kill_9");
    let mut rng = common::Rng::new(seed);
    let producer: FutureProducer = common::producer_config(&bootstrap)
        .set("message.timeout.ms", "5000")
        .set("queue.buffering.max.messages", "200000")
        .set("batch.size", "16384")
        .create()
        .expect("producer");
    let acked: Arc<Mutex<Acked>> = Arc::default();
    let acked_count = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let collector = {
        let (acked, acked_count, failed) = (acked.clone(), acked_count.clone(), failed.clone());
        tokio::spawn(async move {
            while let Some((value, fut)) = rx.recv().await {
                let fut: rdkafka::producer::DeliveryFuture = fut;
                match fut.await {
                    Ok(Ok(d)) => {
                        acked.lock().unwrap().push((d.partition, d.offset, value));
                        acked_count.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        })
    };
    // Kill after a seeded number of acknowledgements, then keep sending for a while.
    let kill_after = 20_000 + rng.below(20_000) as usize;
    println!("killing after {kill_after} acknowledged records");
    let killed = AtomicBool::new(false);
    let mut sent_after_kill = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut i = 0u64;
    while sent_after_kill < 2_000 {
        assert!(
            Instant::now() < deadline,
            "only {} acknowledged before the deadline",
            acked_count.load(Ordering::SeqCst)
        );
        let mut value = format!("{i:09}:").into_bytes();
        let pad = 20 + rng.below(200) as usize;
        value.extend((0..pad).map(|_| b'a' + rng.below(26) as u8));
        let record = FutureRecord::<(), [u8]>::to(topic).partition((i % partitions as u64) as i32).payload(&value);
        match producer.send_result(record) {
            Ok(fut) => {
                tx.send((value, fut)).await.unwrap();
                i += 1;
            }
            Err((e, _)) => {
                // Local queue full: let deliveries drain.
                assert!(
                    matches!(
                        e,
                        rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull)
                    ),
                    "{e}"
                );
                tokio::task::yield_now().await;
                continue;
            }
        }
        if killed.load(Ordering::SeqCst) {
            sent_after_kill += 1;
        } else if acked_count.load(Ordering::SeqCst) >= kill_after {
            broker.kill();
            killed.store(true, Ordering::SeqCst);
        }
    }
    drop(tx);
    collector.await.unwrap();
    drop(producer);
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    println!("sent {i}, acknowledged {}, failed {}", acked.len(), failed.load(Ordering::SeqCst));
    assert!(acked.len() >= kill_after);
    assert!(failed.load(Ordering::SeqCst) > 0, "some records were in flight at the kill");

    broker.start();
    let bootstrap = broker.bootstrap();
    assert!(broker.stderr().contains("unclean shutdown: recovering"), "stderr:\n{}", broker.stderr());
    for p in 0..partitions {
        let high = verify_partition(&bootstrap, topic, p, &acked).await;
        // Every record served is one that was sent, intact (index prefix parses, padding is letters).
        let got = common::consume(&bootstrap, topic, p, 0, high as usize, Duration::from_secs(60)).await;
        for (offset, v) in &got {
            let s = std::str::from_utf8(v).unwrap_or_else(|_| panic!("{topic}-{p}@{offset}: not UTF-8"));
            let (n, pad) = s.split_once(':').unwrap_or_else(|| panic!("{topic}-{p}@{offset}: {s:?}"));
            let n: u64 = n.parse().unwrap();
            assert!(n < i && n % partitions as u64 == p as u64, "{topic}-{p}@{offset}: record {n}");
            assert!(pad.bytes().all(|b| b.is_ascii_lowercase()), "{topic}-{p}@{offset}: padding");
        }
        let (_, offset) = common::produce_one(&bootstrap, topic, p, b"after restart").await;
        assert_eq!(offset, high, "new records continue at the old log end offset");
    }
    broker.stop();
}

/// After a crash, a last segment cut short by a few bytes is truncated to
/// its last whole batch; a tail of garbage is cut off. The broker starts,
/// logs the truncation, serves everything before it without error, and new
/// records get the next offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_or_garbage_tail_after_crash_is_truncated() {
    let seed = common::seed("torn_or_garbage_tail_after_crash_is_truncated");
    let mut rng = common::Rng::new(seed);
    for case in ["torn", "garbage"] {
        let tmp = tempfile::tempdir().unwrap();
        let mut broker = ChildBroker::new(tmp.path());
        broker.start();
        let topic = "tail";
        common::create_topic(&broker.bootstrap(), topic, 1, &[("segment.bytes", "65536")]).await;
        let count = 3000;
        let acked = produce_all(&broker.bootstrap(), topic, count, case).await;
        broker.kill();

        let dir = broker.partition_dir(topic, 0);
        let (recovery_point, clean) = read_checkpoint(&dir);
        assert!(!clean, "checkpoint after a crash says unclean");
        let files = segment_files(&dir);
        assert!(files.len() > 1, "several segments");
        let last = files.last().unwrap().clone();
        let in_last = batches(&last);
        let last_batch = *in_last.last().expect("batches in the last segment");
        let size = std::fs::metadata(&last).unwrap().len();
        assert_eq!(last_batch.position + last_batch.bytes, size, "the segment ends with a whole batch");
        assert_eq!(last_batch.last_offset, count as i64 - 1);
        // Housekeeping may have moved the recovery point to the active segment's base; the tail is after it.
        assert!(recovery_point <= last_batch.base_offset, "recovery point {recovery_point} is past the last batch");
        let (expected_end, expected_size) = if case == "torn" {
            let cut = 1 + rng.below(last_batch.bytes.min(40) - 1);
            println!("{case}: cutting {cut} bytes off {}", last.display());
            OpenOptions::new().write(true).open(&last).unwrap().set_len(size - cut).unwrap();
            (last_batch.base_offset, last_batch.position)
        } else {
            let mut garbage = vec![0u8; 1 + rng.below(300) as usize];
            rng.fill(&mut garbage);
            println!("{case}: appending {} random bytes to {}", garbage.len(), last.display());
            OpenOptions::new().append(true).open(&last).unwrap().write_all(&garbage).unwrap();
            (count as i64, size)
        };

        broker.start();
        let bootstrap = broker.bootstrap();
        let stderr = broker.stderr();
        assert!(stderr.contains("unclean shutdown: recovering"), "{case}: stderr:\n{stderr}");
        assert!(stderr.contains("truncating the log after a torn or corrupt batch"), "{case}: stderr:\n{stderr}");
        assert_eq!(
            std::fs::metadata(&last).unwrap().len(),
            expected_size,
            "{case}: the segment is cut exactly after its last intact batch"
        );
        let (low, high) = common::watermarks(&bootstrap, topic, 0).await;
        assert_eq!((low, high), (0, expected_end), "{case}: log end offset after recovery");
        let kept: Acked = acked.iter().filter(|(_, o, _)| *o < expected_end).cloned().collect();
        verify_partition(&bootstrap, topic, 0, &kept).await;
        let after = produce_all(&bootstrap, topic, 10, "after").await;
        let offsets: Vec<i64> = after.iter().map(|(_, o, _)| *o).collect();
        assert_eq!(offsets, (expected_end..expected_end + 10).collect::<Vec<_>>(), "{case}: offsets continue");
        let mut all = kept;
        all.extend(after);
        assert_eq!(verify_partition(&bootstrap, topic, 0, &all).await, expected_end + 10);
        broker.stop();
    }
}

/// After a clean shutdown everything is behind the recovery point: garbage
/// appended to the active segment is cut off (nothing flushed is lost), but a
/// last segment cut short has lost flushed data, so start-up is refused with
/// a non-zero exit naming the file and byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_tail_after_clean_shutdown() {
    // Garbage after a clean shutdown: start, nothing lost.
    let tmp = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(tmp.path());
    broker.start();
    let topic = "clean";
    common::create_topic(&broker.bootstrap(), topic, 1, &[("segment.bytes", "65536")]).await;
    let count = 2000;
    let acked = produce_all(&broker.bootstrap(), topic, count, "clean").await;
    broker.stop();
    let dir = broker.partition_dir(topic, 0);
    assert_eq!(read_checkpoint(&dir), (count as i64, true));
    let last = segment_files(&dir).last().unwrap().clone();
    let size = std::fs::metadata(&last).unwrap().len();
    OpenOptions::new().append(true).open(&last).unwrap().write_all(&[0xa5; 77]).unwrap();
    broker.start();
    assert!(
        broker.stderr().contains("truncating the log after a torn or corrupt batch"),
        "stderr:\n{}",
        broker.stderr()
    );
    assert_eq!(std::fs::metadata(&last).unwrap().len(), size);
    assert_eq!(verify_partition(&broker.bootstrap(), topic, 0, &acked).await, count as i64);
    broker.stop();

    // A flushed batch cut short: refuse to start, name the file and the byte.
    let last_batch = *batches(&last).last().unwrap();
    OpenOptions::new().write(true).open(&last).unwrap().set_len(size - 5).unwrap();
    broker.spawn();
    let status = broker.wait_exit(Duration::from_secs(60));
    let stderr = broker.stderr();
    assert!(!status.success(), "start-up must fail; stderr:\n{stderr}");
    assert!(stderr.contains("corrupt data behind the recovery point"), "stderr:\n{stderr}");
    assert!(stderr.contains(&last.display().to_string()), "names the file; stderr:\n{stderr}");
    assert!(stderr.contains(&format!("at byte {}", last_batch.position)), "names the byte; stderr:\n{stderr}");
    // Nothing was modified by the refused start.
    assert_eq!(std::fs::metadata(&last).unwrap().len(), size - 5);
}

/// A flipped byte in flushed data (behind the recovery point) of a
/// multi-segment log refuses start-up after a crash with a non-zero exit,
/// naming the file and the byte of the bad batch, and deletes nothing.
///
/// Only the segment holding the recovery point and later ones are re-read
/// after a crash; older sealed segments are trusted without a scan (as in
/// Kafka), so the damage is put in the segment holding the recovery point:
/// a clean stop makes the recovery point the log end offset, a restart keeps
/// it there, and a kill -9 before anything new is appended leaves it inside
/// the last segment, with that segment's earlier batches behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_byte_behind_recovery_point_refuses_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(tmp.path());
    broker.start();
    let topic = "flushed";
    common::create_topic(&broker.bootstrap(), topic, 1, &[("segment.bytes", "65536")]).await;
    let first = produce_all(&broker.bootstrap(), topic, 3000, "first").await;
    // A clean stop flushes everything: the recovery point is the log end offset.
    broker.stop();
    let dir = broker.partition_dir(topic, 0);
    assert_eq!(read_checkpoint(&dir), (3000, true));
    // Restart (the checkpoint is marked unclean while running), then crash.
    broker.start();
    assert_eq!(common::watermarks(&broker.bootstrap(), topic, 0).await, (0, 3000));
    broker.kill();
    let (recovery_point, clean) = read_checkpoint(&dir);
    assert_eq!((recovery_point, clean), (3000, false));
    let files = segment_files(&dir);
    assert!(files.len() >= 3, "a multi-segment log: {files:?}");
    let holding_rp = files.last().unwrap().clone();
    let first_batch = batches(&holding_rp)[0];
    assert!(first_batch.base_offset > 0 && first_batch.base_offset < recovery_point);

    // Flip a byte inside the value of a batch in the middle of that segment, wholly below the recovery point.
    let in_segment: Vec<BatchPos> =
        batches(&holding_rp).into_iter().filter(|b| b.last_offset < recovery_point).collect();
    let victim = in_segment[in_segment.len() / 2];
    let at = victim.position + victim.bytes - 10;
    let mut data = std::fs::read(&holding_rp).unwrap();
    data[at as usize] ^= 0xff;
    std::fs::write(&holding_rp, &data).unwrap();
    println!(
        "flipped byte {at} of {} (batch at byte {}, offsets {}..={})",
        holding_rp.display(),
        victim.position,
        victim.base_offset,
        victim.last_offset
    );

    broker.spawn();
    let status = broker.wait_exit(Duration::from_secs(60));
    let stderr = broker.stderr();
    assert!(!status.success(), "start-up must fail; stderr:\n{stderr}");
    assert!(stderr.contains("corrupt data behind the recovery point 3000"), "stderr:\n{stderr}");
    assert!(stderr.contains(&holding_rp.display().to_string()), "names the file; stderr:\n{stderr}");
    assert!(stderr.contains(&format!("at byte {}", victim.position)), "names the batch's byte; stderr:\n{stderr}");
    // Nothing was dropped by the refused start: every segment is still there, full length.
    assert_eq!(segment_files(&dir), files);
    assert_eq!(std::fs::read(&holding_rp).unwrap().len(), data.len());

    // Repairing the byte lets it start with everything acknowledged intact.
    data[at as usize] ^= 0xff;
    std::fs::write(&holding_rp, &data).unwrap();
    broker.start();
    assert_eq!(verify_partition(&broker.bootstrap(), topic, 0, &first).await, 3000);
    broker.stop();
}

/// CRC-32 (IEEE), as the storage checkpoint uses (crc32fast in the broker).
fn crc32_ieee(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// Rewrites the checkpoint as a crash before any flush leaves it: unclean,
/// recovery point `recovery_point` (storage/src/checkpoint.rs, version 2).
fn write_unclean_checkpoint(dir: &Path, recovery_point: i64) {
    let mut b = std::fs::read(dir.join("checkpoint")).expect("checkpoint file");
    assert_eq!((&b[0..4], b.len()), (&b"SCKP"[..], 35));
    b[6] = 0;
    b[7..15].copy_from_slice(&recovery_point.to_be_bytes());
    let crc = crc32_ieee(&b[..31]);
    b[31..35].copy_from_slice(&crc.to_be_bytes());
    std::fs::write(dir.join("checkpoint"), b).unwrap();
}

/// Runs `strand --repair-log dir [--truncate]`; returns (exit code, stdout).
fn repair_log(dir: &Path, truncate: bool) -> (i32, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_strand"));
    cmd.arg("--repair-log").arg(dir);
    if truncate {
        cmd.arg("--truncate");
    }
    let out = cmd.output().expect("run strand --repair-log");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Consumes `topic`-0 from 0 with librdkafka's default check.crcs=false (what
/// most applications run) until the broker has logged that the partition is
/// offline and `expected` records have arrived; then polls one more second to
/// see that nothing else arrives. Returns what was delivered.
fn consume_until_offline(broker: &ChildBroker, topic: &str, expected: usize) -> Vec<(i64, Vec<u8>)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = common::base_config(&broker.bootstrap())
        .set("group.id", "damage")
        .set("enable.auto.commit", "false")
        .set("check.crcs", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(0)).unwrap();
    consumer.assign(&tpl).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut settle: Option<Instant> = None;
    loop {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            got.push((m.offset(), m.payload().unwrap_or_default().to_vec()));
        }
        if settle.is_none() && got.len() >= expected && broker.stderr().contains("partition taken offline") {
            settle = Some(Instant::now() + Duration::from_secs(1));
        }
        if settle.is_some_and(|s| Instant::now() >= s) {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {expected} records, offline logged: {}; stderr:\n{}",
            got.len(),
            broker.stderr().contains("partition taken offline"),
            broker.stderr()
        );
    }
}

/// Damage in a sealed segment after a clean shutdown (not re-read at
/// start-up) is never served: a flipped byte inside a record, or in a
/// batch's base offset (outside the CRC). A fetch that reaches it, or the
/// background scrubber without any fetch, takes the partition offline with a
/// log line naming the file and the repair command; librdkafka with
/// check.crcs=false receives exactly the records before the damaged segment,
/// each as produced. `strand --repair-log` reports the damage and changes
/// nothing; with `--truncate` it cuts there, and the broker serves every
/// record below the cut and takes new ones after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_in_a_sealed_segment_is_never_served() {
    for (case, scrub, header_byte) in [
        ("record byte, fetch", false, false),
        ("base offset, fetch", false, true),
        ("record byte, scrubber", true, false),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let mut broker = ChildBroker::new(tmp.path()).with_properties(&[if scrub {
            "log.scrub.enable=true"
        } else {
            "log.scrub.enable=false"
        }]);
        broker.start();
        let topic = "sealed";
        common::create_topic(&broker.bootstrap(), topic, 1, &[("segment.bytes", "65536")]).await;
        let acked = produce_all(&broker.bootstrap(), topic, 3000, "sealed").await;
        broker.stop();
        let dir = broker.partition_dir(topic, 0);
        let files = segment_files(&dir);
        assert!(files.len() >= 3, "{case}: several segments: {files:?}");
        let victim_file = files[1].clone();
        let segment_batches = batches(&victim_file);
        let victim = segment_batches[segment_batches.len() / 2];
        let at = if header_byte { victim.position + 1 } else { victim.position + victim.bytes - 10 };
        let mut data = std::fs::read(&victim_file).unwrap();
        data[at as usize] ^= 0x5a;
        std::fs::write(&victim_file, &data).unwrap();
        println!("{case}: flipped byte {at} of {}", victim_file.display());

        broker.start();
        let first_damaged = segment_batches[0].base_offset as usize;
        if scrub {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !broker.stderr().contains("partition taken offline") {
                assert!(Instant::now() < deadline, "{case}: scrubber found nothing; stderr:\n{}", broker.stderr());
                std::thread::sleep(Duration::from_millis(50));
            }
        } else {
            let got = consume_until_offline(&broker, topic, first_damaged);
            assert_eq!(got.len(), first_damaged, "{case}: exactly the records before the damaged segment");
            for (offset, value) in &got {
                assert_eq!(value, &acked[*offset as usize].2, "{case}: record {offset} as produced");
            }
        }
        // Metadata shows the partition without a leader, its replica offline.
        let consumer: rdkafka::consumer::BaseConsumer = common::consumer_config(&broker.bootstrap()).create().unwrap();
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
        let p = &md.topics()[0].partitions()[0];
        assert_eq!((p.leader(), p.isr().len()), (-1, 0), "{case}: offline partition in Metadata");
        drop(consumer);
        let stderr = broker.stderr();
        assert!(stderr.contains(&victim_file.display().to_string()), "{case}: names the file; stderr:\n{stderr}");
        assert!(stderr.contains("--repair-log"), "{case}: says how to repair; stderr:\n{stderr}");
        broker.stop();

        let (code, out) = repair_log(&dir, false);
        assert_eq!(code, 1, "{case}: damage reported: {out}");
        assert!(out.contains(&victim_file.display().to_string()) && out.contains("nothing changed"), "{out}");
        assert_eq!(segment_files(&dir), files, "{case}: a report changes nothing");
        let (code, out) = repair_log(&dir, true);
        assert_eq!(code, 0, "{case}: {out}");
        broker.start();
        let (low, high) = common::watermarks(&broker.bootstrap(), topic, 0).await;
        assert_eq!(low, 0);
        assert!(high >= first_damaged as i64 && high <= victim.base_offset, "{case}: cut at {high}");
        let kept: Acked = acked.iter().filter(|(_, o, _)| *o < high).cloned().collect();
        verify_partition(&broker.bootstrap(), topic, 0, &kept).await;
        let more = produce_all(&broker.bootstrap(), topic, 10, "after").await;
        assert_eq!(more[0].1, high, "{case}: new records follow the cut");
        broker.stop();
    }
}

/// After kill -9 with the recovery point behind several unflushed segments,
/// damage in one that is not the last is not a torn tail: start-up exits
/// non-zero naming the file and byte, and the later, intact segments (which
/// hold acknowledged records) are all still on disk; `--repair-log
/// --truncate` then cuts there on purpose and the broker starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_before_the_last_unflushed_segment_refuses_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(tmp.path());
    broker.start();
    let topic = "unflushed";
    common::create_topic(&broker.bootstrap(), topic, 1, &[("segment.bytes", "65536")]).await;
    let acked = produce_all(&broker.bootstrap(), topic, 3000, "unflushed").await;
    broker.kill();
    let dir = broker.partition_dir(topic, 0);
    // As if the crash came before housekeeping flushed anything.
    write_unclean_checkpoint(&dir, 0);
    let files = segment_files(&dir);
    assert!(files.len() >= 4, "several segments: {files:?}");
    let victim_file = files[1].clone();
    let victim = batches(&victim_file)[3];
    let mut data = std::fs::read(&victim_file).unwrap();
    data[(victim.position + victim.bytes - 10) as usize] ^= 0xff;
    std::fs::write(&victim_file, &data).unwrap();
    let sizes: Vec<u64> = files.iter().map(|f| std::fs::metadata(f).unwrap().len()).collect();

    broker.spawn();
    let status = broker.wait_exit(Duration::from_secs(60));
    let stderr = broker.stderr();
    assert!(!status.success(), "start-up must fail; stderr:\n{stderr}");
    assert!(stderr.contains("not a torn tail"), "stderr:\n{stderr}");
    assert!(stderr.contains(&victim_file.display().to_string()), "names the file; stderr:\n{stderr}");
    assert!(stderr.contains(&format!("at byte {}", victim.position)), "names the byte; stderr:\n{stderr}");
    assert_eq!(segment_files(&dir), files, "no segment deleted");
    let after: Vec<u64> = files.iter().map(|f| std::fs::metadata(f).unwrap().len()).collect();
    assert_eq!(after, sizes, "no segment cut");

    let (code, out) = repair_log(&dir, true);
    assert_eq!(code, 0, "{out}");
    broker.start();
    let (_, high) = common::watermarks(&broker.bootstrap(), topic, 0).await;
    assert_eq!(high, victim.base_offset, "cut at the damaged batch");
    let kept: Acked = acked.iter().filter(|(_, o, _)| *o < high).cloned().collect();
    verify_partition(&broker.bootstrap(), topic, 0, &kept).await;
    broker.stop();
}
