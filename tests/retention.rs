//! Retention and DeleteRecords: the log start offset advances, old segment
//! files go, and reads below the log start offset are OFFSET_OUT_OF_RANGE.
//!
//! Method: an in-process broker checking retention every 100 ms. A topic
//! with 16 KiB segments and retention.bytes of 64 KiB is filled through
//! librdkafka with small batches so many segments roll; the test waits
//! (deadline-bounded polling of ListOffsets earliest) for the log start
//! offset to move, then checks the partition directory, a raw Fetch below
//! the log start offset, an rdkafka consumer with auto.offset.reset=error,
//! and that everything from the log start offset on is intact. A second
//! test advances the log start offset with the AdminClient's DeleteRecords.

mod common;

use std::path::Path;
use std::time::Duration;

use common::RawConn;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

const OFFSET_OUT_OF_RANGE: i16 = 1;
const SEGMENT_BYTES: u64 = 16_384;
const RETENTION_BYTES: u64 = 65_536;

fn segment_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".log"))
        .collect();
    names.sort();
    names
}

/// Produces `count` records of `size` bytes (record i starts with "i:") in small batches; returns the last offset.
async fn produce_many(bootstrap: &str, topic: &str, count: usize, size: usize) -> i64 {
    let producer: FutureProducer =
        common::producer_config(bootstrap).set("batch.size", "2048").set("linger.ms", "1").create().expect("producer");
    let mut pending = Vec::with_capacity(count);
    for i in 0..count {
        let mut value = format!("{i}:").into_bytes();
        value.resize(size, b'x');
        let record = FutureRecord::<(), [u8]>::to(topic).partition(0).payload(&value);
        pending.push(producer.send_result(record).map_err(|(e, _)| e).expect("enqueue"));
    }
    let mut last = -1;
    for (i, p) in pending.into_iter().enumerate() {
        let d = p.await.expect("delivery future").unwrap_or_else(|(e, _)| panic!("record {i}: {e}"));
        assert_eq!(d.offset, i as i64, "offsets follow send order");
        last = d.offset;
    }
    last
}

/// One raw Fetch v12 of `topic`-0 at `offset`: (error code, log start offset, records bytes).
async fn raw_fetch(conn: &mut RawConn, topic: &str, offset: i64) -> (i16, i64, usize) {
    let req = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(offset)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1 << 20)])]);
    let resp = conn.call(&req, 12).await;
    assert_eq!(resp.error_code, 0, "top-level fetch error");
    let p = &resp.responses[0].partitions[0];
    (p.error_code, p.log_start_offset, p.records.as_ref().map_or(0, |r| r.len()))
}

/// An assigned consumer with auto.offset.reset=error at `offset` must report
/// an out-of-range error (and no records).
async fn consumer_sees_out_of_range(bootstrap: &str, topic: &str, offset: i64) {
    let mut config = common::consumer_config(bootstrap);
    config.set("auto.offset.reset", "error");
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create().expect("consumer");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Offset(offset)).unwrap();
        consumer.assign(&tpl).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            assert!(std::time::Instant::now() < deadline, "no out-of-range error for offset {offset}");
            match consumer.poll(Duration::from_millis(200)) {
                None => {}
                Some(Ok(m)) => {
                    panic!("read a record at offset {} from below the log start offset", rdkafka::Message::offset(&m))
                }
                Some(Err(KafkaError::MessageConsumption(
                    RDKafkaErrorCode::OffsetOutOfRange | RDKafkaErrorCode::AutoOffsetReset,
                ))) => return,
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) => panic!("unexpected consumer error: {e}"),
            }
        }
    })
    .await
    .unwrap();
}

/// retention.bytes deletes whole old segments; the log start offset moves
/// past them; reads below it are out of range; reads from it are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_bytes_deletes_old_segments() {
    let broker = common::start_broker(&["log.retention.check.interval.ms=100"]).await;
    let bootstrap = broker.bootstrap();
    let topic = "retained";
    common::create_topic(
        &bootstrap,
        topic,
        1,
        &[("segment.bytes", &SEGMENT_BYTES.to_string()), ("retention.bytes", &RETENTION_BYTES.to_string())],
    )
    .await;
    let dir = broker.partition_dir(topic, 0);
    assert_eq!(segment_files(&dir), ["00000000000000000000.log"]);

    // ~400 KiB: about 25 segments, far beyond retention.bytes.
    let (count, size) = (2000usize, 200usize);
    let last = produce_many(&bootstrap, topic, count, size).await;
    assert_eq!(last, count as i64 - 1);

    let low =
        common::wait_for("the log start offset to advance", Duration::from_secs(30), Duration::from_millis(50), || {
            let bootstrap = bootstrap.clone();
            async move {
                let (low, high) = common::watermarks(&bootstrap, topic, 0).await;
                assert_eq!(high, count as i64);
                (low > 0).then_some(low)
            }
        })
        .await;
    // Retention deletes only whole segments, so the log start offset is a segment base.
    let files =
        common::wait_for("old segment files to be deleted", Duration::from_secs(30), Duration::from_millis(50), || {
            let files = segment_files(&dir);
            async move { (!files.contains(&"00000000000000000000.log".to_string())).then_some(files) }
        })
        .await;
    let produced_bytes = (count * (size + 80)) as u64;
    assert!(
        (files.len() as u64) < produced_bytes / SEGMENT_BYTES,
        "{} segment files left of about {} produced",
        files.len(),
        produced_bytes / SEGMENT_BYTES
    );
    let low_now = common::watermarks(&bootstrap, topic, 0).await.0;
    assert!(low_now >= low);
    let first_base: i64 = files[0].trim_end_matches(".log").parse().unwrap();
    assert!(first_base <= low_now, "first segment {first_base} starts after the log start offset {low_now}");
    // What is kept is bounded by retention.bytes plus the active segment.
    let kept: u64 = files.iter().map(|f| std::fs::metadata(dir.join(f)).map_or(0, |m| m.len())).sum();
    assert!(kept <= RETENTION_BYTES + 2 * SEGMENT_BYTES, "{kept} bytes kept");
    println!("log start offset {low_now}, {} segment files, {kept} bytes kept", files.len());

    // Below the log start offset: OFFSET_OUT_OF_RANGE, raw and through librdkafka.
    let mut conn = RawConn::connect(broker.addr()).await;
    let (code, start, _) = raw_fetch(&mut conn, topic, 0).await;
    assert_eq!(code, OFFSET_OUT_OF_RANGE, "fetch at 0 below log start {low_now}");
    assert!(start >= low_now);
    let (code, _, _) = raw_fetch(&mut conn, topic, low_now - 1).await;
    assert_eq!(code, OFFSET_OUT_OF_RANGE, "fetch just below the log start offset");
    let (code, _, bytes) = raw_fetch(&mut conn, topic, start).await;
    assert_eq!(code, 0, "fetch at the log start offset");
    assert!(bytes > 0);
    consumer_sees_out_of_range(&bootstrap, topic, 0).await;

    // Everything from the log start offset to the end is intact and contiguous.
    let start = common::watermarks(&bootstrap, topic, 0).await.0;
    let n = (count as i64 - start) as usize;
    let got = common::consume(&bootstrap, topic, 0, start, n, Duration::from_secs(30)).await;
    for (i, (offset, value)) in got.iter().enumerate() {
        assert_eq!(*offset, start + i as i64, "contiguous offsets");
        assert!(value.starts_with(format!("{offset}:").as_bytes()), "value at offset {offset}");
        assert_eq!(value.len(), size);
    }
    broker.handle.shutdown().await;
}

/// DeleteRecords (AdminClient) moves the low watermark to the requested
/// offset; reads below it are out of range and the record at it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_records_advances_low_watermark() {
    let broker = common::start_broker(&["log.retention.check.interval.ms=100"]).await;
    let bootstrap = broker.bootstrap();
    let topic = "trimmed";
    common::create_topic(&bootstrap, topic, 1, &[("segment.bytes", &SEGMENT_BYTES.to_string())]).await;
    let count = 500usize;
    produce_many(&bootstrap, topic, count, 200).await;
    assert_eq!(common::watermarks(&bootstrap, topic, 0).await, (0, count as i64));
    let dir = broker.partition_dir(topic, 0);
    let before = segment_files(&dir);
    assert!(before.len() > 3, "several segments: {before:?}");

    let admin: AdminClient<DefaultClientContext> = common::admin_config(&bootstrap).create().unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for target in [40i64, 40, 333] {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Offset(target)).unwrap();
        let result = admin.delete_records(&tpl, &opts).await.expect("DeleteRecords");
        let e = result.find_partition(topic, 0).expect("partition in result");
        e.error().unwrap_or_else(|err| panic!("DeleteRecords to {target}: {err}"));
        assert_eq!(e.offset(), Offset::Offset(target), "low watermark reported");
        assert_eq!(common::watermarks(&bootstrap, topic, 0).await, (target, count as i64));
        let mut conn = RawConn::connect(broker.addr()).await;
        assert_eq!(raw_fetch(&mut conn, topic, target - 1).await.0, OFFSET_OUT_OF_RANGE);
        let got = common::consume(&bootstrap, topic, 0, target, 1, Duration::from_secs(20)).await;
        assert_eq!(got[0].0, target);
        assert!(got[0].1.starts_with(format!("{target}:").as_bytes()));
    }
    consumer_sees_out_of_range(&bootstrap, topic, 0).await;
    // Segments wholly below the new log start offset are deleted.
    let after = common::wait_for(
        "segments below the log start offset to go",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            let files = segment_files(&dir);
            async move { (!files.contains(&"00000000000000000000.log".to_string())).then_some(files) }
        },
    )
    .await;
    assert!(after.len() < before.len(), "{after:?} vs {before:?}");
    let first_base: i64 = after[0].trim_end_matches(".log").parse().unwrap();
    assert!(first_base <= 333);

    // Beyond the log end offset is refused with OFFSET_OUT_OF_RANGE.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(count as i64 + 10)).unwrap();
    let result = admin.delete_records(&tpl, &opts).await.expect("DeleteRecords");
    let e = result.find_partition(topic, 0).unwrap();
    assert!(e.error().is_err(), "DeleteRecords past the end must fail");
    assert_eq!(common::watermarks(&bootstrap, topic, 0).await, (333, count as i64));

    // The low watermark survives a restart.
    let dir_guard = broker.shutdown().await;
    let broker = common::start_broker_in(dir_guard, &[]).await;
    assert_eq!(common::watermarks(&broker.bootstrap(), topic, 0).await, (333, count as i64));
    broker.handle.shutdown().await;
}
