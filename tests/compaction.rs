//! Log compaction (`cleanup.policy=compact`) judged by a real client.
//!
//! Goal: a compacted topic written with many versions of few keys shrinks to
//! (about) the latest record per key once the cleaner has run; a consumer
//! reading from the beginning sees every live key with its latest value at
//! the offset the producer was acknowledged for, offsets strictly increasing
//! (gaps allowed, never rewritten); tombstoned keys vanish once
//! delete.retention.ms has passed; a keyless record is refused.
//!
//! Method: an in-process broker with a fast cleaner
//! (`log.cleaner.backoff.ms=100`, `log.cleaner.min.cleanable.ratio=0.01`); a
//! 1-partition topic with `segment.bytes=16384` and `delete.retention.ms=0`;
//! 200 versions of 20 keys and 2 tombstones written with librdkafka (acks=all),
//! then a further round of versions so the tombstones sit outside the active
//! segment. Waits are deadline-bounded polls of the partition directory and of
//! what a consumer reads.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

const TOPIC: &str = "compacted";
const KEYS: usize = 20;
const VERSIONS: usize = 200;
const DELETED: [usize; 2] = [3, 7];

fn key(k: usize) -> String {
    format!("key-{k:02}")
}

fn value(k: usize, version: usize) -> String {
    format!("{}:v{version}:{}", key(k), "p".repeat(100))
}

/// What was acknowledged at each offset: (key, value or None for a tombstone).
type Acked = BTreeMap<i64, (String, Option<String>)>;

#[derive(Default)]
struct Reports {
    ok: Mutex<Acked>,
    failed: Mutex<Vec<String>>,
}

struct Ctx(Arc<Reports>);
impl ClientContext for Ctx {}
impl ProducerContext for Ctx {
    type DeliveryOpaque = Box<(String, Option<String>)>;
    fn delivery(&self, result: &DeliveryResult<'_>, kv: Self::DeliveryOpaque) {
        match result {
            Ok(m) => {
                self.0.ok.lock().unwrap().insert(m.offset(), *kv);
            }
            Err((e, _)) => self.0.failed.lock().unwrap().push(format!("{kv:?}: {e}")),
        }
    }
}

/// Writes `records` (key, value or tombstone) in order with acks=all; returns offset → record.
fn write(bootstrap: &str, records: Vec<(String, Option<String>)>) -> Acked {
    let reports = Arc::new(Reports::default());
    let producer: ThreadedProducer<Ctx> = producer_config(bootstrap)
        .set("max.in.flight.requests.per.connection", "1")
        // Small batches: segments roll only between batches.
        .set("batch.num.messages", "10")
        .create_with_context(Ctx(reports.clone()))
        .expect("producer");
    let n = records.len();
    for (k, v) in records {
        let opaque = Box::new((k.clone(), v.clone()));
        let mut record = BaseRecord::with_opaque_to(TOPIC, opaque).key(&k).partition(0);
        if let Some(v) = &v {
            record = record.payload(v);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("send: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    let failed = reports.failed.lock().unwrap();
    assert!(failed.is_empty(), "{} deliveries failed, first {:?}", failed.len(), failed.first());
    let ok = reports.ok.lock().unwrap().clone();
    assert_eq!(ok.len(), n, "every record acknowledged at a distinct offset");
    ok
}

/// Sum of the `.log` file sizes and their count in `dir`.
fn log_files(dir: &std::path::Path) -> (u64, usize) {
    let mut total = 0;
    let mut count = 0;
    for e in std::fs::read_dir(dir).expect("partition dir").flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            total += e.metadata().map(|m| m.len()).unwrap_or(0);
            count += 1;
        }
    }
    (total, count)
}

/// Everything in partition 0 from the beginning up to the high watermark:
/// (offset, key, value or None).
fn read_all(bootstrap: &str) -> Vec<(i64, String, Option<String>)> {
    let consumer: BaseConsumer = consumer_config(bootstrap).create().expect("consumer");
    let (_, high) = consumer.fetch_watermarks(TOPIC, 0, Duration::from_secs(10)).expect("watermarks");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Beginning).unwrap();
    consumer.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if out.last().is_some_and(|(o, _, _)| *o + 1 >= high) {
            return out;
        }
        assert!(Instant::now() < deadline, "read to {high} within 30s; at {:?}", out.last().map(|r| r.0));
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => out.push((
                m.offset(),
                String::from_utf8(m.key().expect("every record has a key").to_vec()).unwrap(),
                m.payload().map(|p| String::from_utf8(p.to_vec()).unwrap()),
            )),
            Some(Err(KafkaError::PartitionEOF(_)))
                if high == 0 || out.last().is_some_and(|(o, _, _)| *o + 1 >= high) =>
            {
                return out;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => panic!("consumer error after {} records: {e}", out.len()),
        }
    }
}

/// Checks what a reader sees against what was acknowledged: each record is
/// the one acknowledged at its offset, offsets strictly increase, and every
/// live key's last record is its latest acknowledged value.
fn check_read(read: &[(i64, String, Option<String>)], acked: &Acked) -> HashMap<String, (i64, Option<String>)> {
    let mut last: HashMap<String, (i64, Option<String>)> = HashMap::new();
    let mut prev = -1;
    for (o, k, v) in read {
        assert!(*o > prev, "offsets strictly increase: {o} after {prev}");
        prev = *o;
        let (ak, av) = acked.get(o).unwrap_or_else(|| panic!("offset {o} was never acknowledged"));
        assert_eq!((k, v), (ak, av), "record at offset {o} is the one acknowledged there");
        last.insert(k.clone(), (*o, v.clone()));
    }
    // Latest acknowledged record per key.
    let mut latest: HashMap<String, (i64, Option<String>)> = HashMap::new();
    for (o, (k, v)) in acked {
        latest.insert(k.clone(), (*o, v.clone()));
    }
    for (k, (o, v)) in &latest {
        if v.is_some() {
            assert_eq!(last.get(k), Some(&(*o, v.clone())), "live key {k}: its latest value at offset {o}");
        }
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_topic_keeps_latest_value_per_key_at_its_offset() {
    let broker = start_broker(&["log.cleaner.backoff.ms=100", "log.cleaner.min.cleanable.ratio=0.01"]).await;
    let bootstrap = broker.bootstrap();
    create_topic(
        &bootstrap,
        TOPIC,
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.bytes", "16384"),
            ("delete.retention.ms", "0"),
            ("min.cleanable.dirty.ratio", "0.01"),
        ],
    )
    .await;

    // 200 rounds of 20 keys, then tombstones for 2 keys, then 20 more rounds
    // of the live keys so the tombstones are behind the active segment.
    let mut records = Vec::new();
    for version in 0..VERSIONS {
        for k in 0..KEYS {
            records.push((key(k), Some(value(k, version))));
        }
    }
    for k in DELETED {
        records.push((key(k), None));
    }
    for version in VERSIONS..VERSIONS + 20 {
        for k in (0..KEYS).filter(|k| !DELETED.contains(k)) {
            records.push((key(k), Some(value(k, version))));
        }
    }
    let total = records.len();
    let b = bootstrap.clone();
    let mut acked = tokio::task::spawn_blocking(move || write(&b, records)).await.expect("producer thread");
    let dir = broker.partition_dir(TOPIC, 0);
    // The cleaner runs while the producer writes, so the size before cleaning
    // is estimated from the payloads (a lower bound of what was appended).
    let written: u64 = acked.values().map(|(k, v)| (k.len() + v.as_ref().map_or(0, |v| v.len())) as u64).sum();
    let (size_now, segs_now) = log_files(&dir);
    println!(
        "wrote {total} records (over {written} bytes of keys and values); now {size_now} bytes in {segs_now} segments"
    );
    // Keyless records are refused (Kafka: INVALID_RECORD, or CORRUPT_MESSAGE from old brokers).
    {
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let p: FutureProducer =
            producer_config(&bootstrap).set("message.send.max.retries", "0").create().expect("producer");
        let r =
            p.send(FutureRecord::<(), str>::to(TOPIC).partition(0).payload("no key"), Duration::from_secs(20)).await;
        match r {
            Err((KafkaError::MessageProduction(code), _)) => assert!(
                matches!(code, RDKafkaErrorCode::InvalidRecord | RDKafkaErrorCode::InvalidMessage),
                "keyless record refused with {code:?}, expected INVALID_RECORD (87) or CORRUPT_MESSAGE (2)"
            ),
            other => panic!("a keyless record on a compacted topic must be refused, got {other:?}"),
        }
    }
    let (_, high) = watermarks(&bootstrap, TOPIC, 0).await;
    assert_eq!(high, total as i64, "the refused keyless records took no offsets");

    // Phase 1: the log shrinks, with no further writes.
    let t = Instant::now();
    let deadline = t + Duration::from_secs(60);
    loop {
        let (size, segs) = log_files(&dir);
        if size * 4 < written {
            println!("cleaned: {size} bytes in {segs} segments after {:?}", t.elapsed());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "log not compacted within 60s: {size} bytes for {written} written, {segs} segments"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = bootstrap.clone();
    let read = tokio::task::spawn_blocking(move || read_all(&b)).await.unwrap();
    let last = check_read(&read, &acked);
    println!("after cleaning a reader sees {} of {total} records", read.len());
    assert!(read.len() < total / 4, "compaction removed most superseded versions ({} left)", read.len());
    assert_eq!(watermarks(&bootstrap, TOPIC, 0).await.1, total as i64, "the log end offset is unchanged");
    for k in DELETED {
        if let Some((_, v)) = last.get(&key(k)) {
            assert!(v.is_none(), "a deleted key's last record is its tombstone");
        }
    }

    // Phase 2: tombstones (delete.retention.ms=0) vanish. A further pass may
    // need new dirty data; nudge with rounds of the live keys if they linger.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut nudges = 0;
    loop {
        let b = bootstrap.clone();
        let read = tokio::task::spawn_blocking(move || read_all(&b)).await.unwrap();
        check_read(&read, &acked);
        let lingering: Vec<&str> =
            read.iter().filter(|(_, k, _)| DELETED.iter().any(|d| key(*d) == *k)).map(|(_, k, _)| k.as_str()).collect();
        if lingering.is_empty() {
            println!("tombstoned keys gone after {nudges} nudge rounds; {} records readable", read.len());
            break;
        }
        assert!(Instant::now() < deadline, "deleted keys still readable after 60s ({nudges} nudges): {lingering:?}");
        if nudges < 10 {
            let round: Vec<(String, Option<String>)> = (0..KEYS)
                .filter(|k| !DELETED.contains(k))
                .flat_map(|k| (0..5).map(move |i| (key(k), Some(value(k, 1000 + i)))))
                .collect();
            let b = bootstrap.clone();
            let more = tokio::task::spawn_blocking(move || write(&b, round)).await.unwrap();
            acked.extend(more);
            nudges += 1;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Restart: the compacted log recovers with the same content.
    let b = bootstrap.clone();
    let before = tokio::task::spawn_blocking(move || read_all(&b)).await.unwrap();
    let dirpath = broker.shutdown().await;
    let broker =
        start_broker_in(dirpath, &["log.cleaner.backoff.ms=100", "log.cleaner.min.cleanable.ratio=0.01"]).await;
    let b = broker.bootstrap();
    let after = tokio::task::spawn_blocking(move || read_all(&b)).await.unwrap();
    // The cleaner may run again after the restart, but only removing records.
    check_read(&after, &acked);
    assert!(after.len() <= before.len(), "a restart brings no cleaned record back");
    broker.shutdown().await;
}
