//! Fetch semantics at the protocol level: the long poll, byte limits,
//! incremental fetch sessions (KIP-227), topic ids (Fetch v13+) and
//! ListOffsets by timestamp.
//!
//! Method: raw requests built with the kafka-protocol crate against an
//! in-process broker; records are produced with librdkafka.

mod common;

use std::time::Duration;

use common::*;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn fetch_partition(p: i32, offset: i64, max_bytes: i32) -> FetchPartition {
    FetchPartition::default()
        .with_partition(p)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(max_bytes)
        .with_log_start_offset(-1)
}

fn fetch(topic: FetchTopic, max_wait_ms: i32, min_bytes: i32, max_bytes: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(min_bytes)
        .with_max_bytes(max_bytes)
        .with_session_epoch(-1)
        .with_topics(vec![topic])
}

fn records_len(resp: &FetchResponse, partition: i32) -> usize {
    resp.responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == partition)
        .and_then(|p| p.records.as_ref().map(|r| r.len()))
        .unwrap_or(0)
}

fn partitions_in(resp: &FetchResponse) -> Vec<i32> {
    resp.responses.iter().flat_map(|t| t.partitions.iter().map(|p| p.partition_index)).collect()
}

/// Goal: a fetch waiting on an empty partition returns as soon as a record is
/// appended, carrying that record (not an empty response after max_wait_ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_is_woken_by_an_append() {
    let broker = start_broker(&[]).await;
    create_topic(&broker.bootstrap(), "poll", 1, &[]).await;
    let mut conn = RawConn::connect(broker.addr()).await;
    // max_wait (8 s) is below the raw connection's 10 s read timeout: an unwoken
    // poll comes back empty and fails the assertion below.
    let req = fetch(
        FetchTopic::default().with_topic(name("poll")).with_partitions(vec![fetch_partition(0, 0, 1 << 20)]),
        8_000,
        1,
        1 << 20,
    );
    let waiting = tokio::spawn(async move { conn.call(&req, 12).await });
    // The fetch must be parked before the produce for the test to mean anything;
    // producing takes a new connection and a metadata round trip, plenty of time,
    // and if it were not parked the fetch would still see the record (no false pass).
    produce_one(&broker.bootstrap(), "poll", 0, b"wake up").await;
    let resp = waiting.await.unwrap();
    assert!(records_len(&resp, 0) > 0, "the parked fetch returned the appended record");
    assert_eq!(resp.responses[0].partitions[0].high_watermark, 1);

    // Nothing to read and a short max wait: an empty, error-free answer.
    let mut conn = RawConn::connect(broker.addr()).await;
    let req = fetch(
        FetchTopic::default().with_topic(name("poll")).with_partitions(vec![fetch_partition(0, 1, 1 << 20)]),
        100,
        1,
        1 << 20,
    );
    let resp = conn.call(&req, 12).await;
    assert_eq!(resp.responses[0].partitions[0].error_code, 0);
    assert_eq!(records_len(&resp, 0), 0);
    broker.shutdown().await;
}

/// Goal: partition_max_bytes and max_bytes bound the response, but the first
/// batch is always returned so a consumer makes progress; offsets out of range
/// are reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byte_limits_and_out_of_range() {
    let broker = start_broker(&[]).await;
    create_topic(&broker.bootstrap(), "limits", 2, &[]).await;
    for i in 0..5 {
        produce_one(&broker.bootstrap(), "limits", 0, format!("record-{i}").as_bytes()).await;
        produce_one(&broker.bootstrap(), "limits", 1, format!("record-{i}").as_bytes()).await;
    }
    let mut conn = RawConn::connect(broker.addr()).await;
    let all = conn
        .call(
            &fetch(
                FetchTopic::default().with_topic(name("limits")).with_partitions(vec![fetch_partition(0, 0, 1 << 20)]),
                0,
                0,
                1 << 20,
            ),
            12,
        )
        .await;
    let whole = records_len(&all, 0);
    // One byte per partition: still exactly one whole batch.
    let one = conn
        .call(
            &fetch(
                FetchTopic::default().with_topic(name("limits")).with_partitions(vec![fetch_partition(0, 0, 1)]),
                0,
                0,
                1 << 20,
            ),
            12,
        )
        .await;
    let first = records_len(&one, 0);
    assert!(first > 0 && first * 5 == whole, "one batch of five equal batches ({first} of {whole} bytes)");
    // A response budget of one byte: the first partition gets one batch, the second nothing.
    let two = conn
        .call(
            &fetch(
                FetchTopic::default()
                    .with_topic(name("limits"))
                    .with_partitions(vec![fetch_partition(0, 0, 1 << 20), fetch_partition(1, 0, 1 << 20)]),
                0,
                0,
                1,
            ),
            12,
        )
        .await;
    assert_eq!(records_len(&two, 0), first);
    assert_eq!(records_len(&two, 1), 0);
    // Beyond the log end: OFFSET_OUT_OF_RANGE (1).
    let out = conn
        .call(
            &fetch(
                FetchTopic::default().with_topic(name("limits")).with_partitions(vec![fetch_partition(0, 99, 1 << 20)]),
                0,
                0,
                1 << 20,
            ),
            12,
        )
        .await;
    assert_eq!(out.responses[0].partitions[0].error_code, 1);
    broker.shutdown().await;
}

/// Goal: KIP-227 sessions as the Java client uses them: a full fetch opens a
/// session, incremental fetches send and receive only changes, a wrong epoch
/// or unknown session is refused, epoch -1 closes it. Also by topic id (v13).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_fetch_sessions() {
    let broker = start_broker(&[]).await;
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "sess", 2, &[]).await;
    produce_one(&bootstrap, "sess", 0, b"a").await;
    let mut conn = RawConn::connect(broker.addr()).await;

    // Topic id from Metadata, for v13 requests.
    let md = conn
        .call(
            &MetadataRequest::default()
                .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(name("sess")))])),
            12,
        )
        .await;
    let topic_id = md.topics[0].topic_id;
    assert_ne!(topic_id, Uuid::nil());

    for version in [12i16, 13] {
        let topic = || {
            if version >= 13 {
                FetchTopic::default().with_topic_id(topic_id)
            } else {
                FetchTopic::default().with_topic(name("sess"))
            }
        };
        // Full fetch opening a session.
        let open = fetch(
            topic().with_partitions(vec![fetch_partition(0, 0, 1 << 20), fetch_partition(1, 0, 1 << 20)]),
            0,
            0,
            1 << 20,
        )
        .with_session_id(0)
        .with_session_epoch(0);
        let resp = conn.call(&open, version).await;
        let session = resp.session_id;
        assert_ne!(session, 0, "v{version}: a session was created");
        assert_eq!(partitions_in(&resp), vec![0, 1], "full response lists every partition");
        if version >= 13 {
            assert_eq!(resp.responses[0].topic_id, topic_id);
        }
        let hw = |p: usize| resp.responses[0].partitions[p].high_watermark;
        let (hw0, hw1) = (hw(0), hw(1));

        // Incremental, nothing new: no partitions at all.
        let inc = |epoch: i32, parts: Vec<FetchPartition>| {
            fetch(topic().with_partitions(parts), 0, 0, 1 << 20).with_session_id(session).with_session_epoch(epoch)
        };
        // The client moves both fetch positions to the ends it has read to.
        let resp =
            conn.call(&inc(1, vec![fetch_partition(0, hw0, 1 << 20), fetch_partition(1, hw1, 1 << 20)]), version).await;
        assert_eq!(resp.error_code, 0);
        assert_eq!(partitions_in(&resp), Vec::<i32>::new(), "v{version}: unchanged partitions are left out");

        // A record lands in partition 1: only partition 1 comes back.
        produce_one(&bootstrap, "sess", 1, b"b").await;
        let resp = conn.call(&inc(2, vec![]), version).await;
        assert_eq!(partitions_in(&resp), vec![1], "v{version}: only the changed partition");
        assert!(records_len(&resp, 1) > 0);

        // Wrong epoch, unknown session.
        let resp = conn.call(&inc(7, vec![]), version).await;
        assert_eq!(resp.error_code, 71, "INVALID_FETCH_SESSION_EPOCH");
        let resp = conn.call(&inc(3, vec![]).with_session_id(session.wrapping_add(1000)), version).await;
        assert_eq!(resp.error_code, 70, "FETCH_SESSION_ID_NOT_FOUND");

        // Forgetting partition 0, then closing the session.
        let forget = if version >= 13 {
            ForgottenTopic::default().with_topic_id(topic_id).with_partitions(vec![0])
        } else {
            ForgottenTopic::default().with_topic(name("sess")).with_partitions(vec![0])
        };
        let resp = conn.call(&inc(3, vec![]).with_forgotten_topics_data(vec![forget]), version).await;
        assert_eq!(resp.error_code, 0);
        let resp = conn.call(&inc(-1, vec![fetch_partition(0, 0, 1 << 20)]), version).await;
        assert_eq!(resp.session_id, 0, "epoch -1 closes the session");
        let resp = conn.call(&inc(4, vec![]), version).await;
        assert_eq!(resp.error_code, 70, "a closed session is gone");
    }

    // An unknown topic id is UNKNOWN_TOPIC_ID (100).
    let resp = conn
        .call(
            &fetch(
                FetchTopic::default().with_topic_id(Uuid::new_v4()).with_partitions(vec![fetch_partition(0, 0, 1024)]),
                0,
                0,
                1024,
            ),
            13,
        )
        .await;
    assert_eq!(resp.responses[0].partitions[0].error_code, 100);
    broker.shutdown().await;
}

/// Goal: ListOffsets finds the exact record for a timestamp (inside a batch,
/// compressed or not), the max timestamp, earliest and latest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_by_timestamp() {
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    let broker = start_broker(&[]).await;
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "times", 1, &[]).await;
    let b = bootstrap.clone();
    tokio::task::spawn_blocking(move || {
        // One lz4 batch of records stamped 1000, 2000, 3000, then one of 5000, 4000.
        for stamps in [&[1000i64, 2000, 3000][..], &[5000, 4000][..]] {
            let producer: ThreadedProducer<_> =
                producer_config(&b).set("linger.ms", "200").set("compression.codec", "lz4").create().unwrap();
            for ts in stamps {
                producer.send(BaseRecord::<(), _>::to("times").partition(0).payload("x").timestamp(*ts)).unwrap();
            }
            producer.flush(Duration::from_secs(10)).unwrap();
        }
    })
    .await
    .unwrap();
    let mut conn = RawConn::connect(broker.addr()).await;
    let ask = |ts: i64| {
        ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![ListOffsetsTopic::default()
            .with_name(name("times"))
            .with_partitions(vec![ListOffsetsPartition::default().with_partition_index(0).with_timestamp(ts)])])
    };
    let mut results = Vec::new();
    for ts in [1500, 3000, 3500, 6000, -3, -2, -1] {
        let r = conn.call(&ask(ts), 7).await;
        let p = &r.topics[0].partitions[0];
        assert_eq!(p.error_code, 0);
        results.push((ts, p.offset, p.timestamp));
    }
    assert_eq!(
        results,
        vec![
            (1500, 1, 2000), // first record at or after 1500
            (3000, 2, 3000),
            (3500, 3, 5000), // the second batch's first record is 5000
            (6000, -1, -1),  // nothing that late
            (-3, 3, 5000),   // max timestamp
            (-2, 0, -1),     // earliest
            (-1, 5, -1),     // latest
        ]
    );
    broker.shutdown().await;
}

/// Goal: every advertised ListOffsets version answers a multi-partition
/// request with a well-formed response (v1–v3 have no leader epoch field:
/// kcat, kafkajs and aiokafka use them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_every_version() {
    let broker = start_broker(&[]).await;
    create_topic(&broker.bootstrap(), "lov", 2, &[]).await;
    produce_one(&broker.bootstrap(), "lov", 1, b"x").await;
    let mut conn = RawConn::connect(broker.addr()).await;
    for version in 1..=10i16 {
        let req =
            ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![ListOffsetsTopic::default()
                .with_name(name("lov"))
                .with_partitions(vec![
                    ListOffsetsPartition::default().with_partition_index(0).with_timestamp(-1),
                    ListOffsetsPartition::default().with_partition_index(1).with_timestamp(-1),
                    ListOffsetsPartition::default().with_partition_index(1).with_timestamp(-2),
                ])]);
        let resp = conn.call(&req, version).await;
        let offsets: Vec<(i16, i64)> = resp.topics[0].partitions.iter().map(|p| (p.error_code, p.offset)).collect();
        assert_eq!(offsets, vec![(0, 0), (0, 1), (0, 0)], "ListOffsets v{version}");
        let epochs: Vec<i32> = resp.topics[0].partitions.iter().map(|p| p.leader_epoch).collect();
        let expected = if version >= 4 { 0 } else { -1 };
        assert!(epochs.iter().all(|e| *e == expected), "ListOffsets v{version} leader epochs {epochs:?}");
    }
    broker.shutdown().await;
}

/// Goal: fetched records reach the client exactly as stored when they are sent
/// straight from the segment files (sendfile), for partitions whose records
/// span several segments: every Fetch version returns, per partition, the
/// concatenated segment files byte for byte; pipelined requests keep their
/// order around file-backed responses; librdkafka reads every record back.
/// Method: a 3-partition topic with 16 KiB segments and ~120 KiB of records
/// per partition (several batches per segment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_partition_multi_segment_records_come_from_the_files() {
    use kafka_protocol::protocol::Decodable;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    use rdkafka::{Offset, TopicPartitionList};

    const PARTITIONS: i32 = 3;
    const RECORDS: usize = 900;
    let value = |i: usize| format!("{i:05}-{}", "zero-copy ".repeat(1 + i % 60));
    let broker = start_broker(&[]).await;
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "zc", PARTITIONS, &[("segment.bytes", "16384")]).await;
    let b = bootstrap.clone();
    tokio::task::spawn_blocking(move || {
        let producer: ThreadedProducer<_> = producer_config(&b).set("batch.size", "4000").create().unwrap();
        for i in 0..RECORDS {
            let v = value(i);
            let p = (i % PARTITIONS as usize) as i32;
            producer.send(BaseRecord::<(), _>::to("zc").partition(p).payload(&v)).unwrap();
        }
        producer.flush(Duration::from_secs(30)).unwrap();
    })
    .await
    .unwrap();

    let segments = |p: i32| -> (usize, Vec<u8>) {
        let mut logs: Vec<_> = std::fs::read_dir(broker.partition_dir("zc", p))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        logs.sort();
        (logs.len(), logs.iter().flat_map(|l| std::fs::read(l).unwrap()).collect())
    };
    let stored: Vec<Vec<u8>> = (0..PARTITIONS)
        .map(|p| {
            let (count, bytes) = segments(p);
            assert!(count >= 3, "partition {p}: {count} segments, want several");
            bytes
        })
        .collect();

    let mut conn = RawConn::connect(broker.addr()).await;
    let md = conn
        .call(
            &MetadataRequest::default()
                .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(name("zc")))])),
            12,
        )
        .await;
    let topic_id = md.topics[0].topic_id;
    let all_partitions = || (0..PARTITIONS).map(|p| fetch_partition(p, 0, 1 << 20)).collect::<Vec<_>>();
    for version in 4..=17i16 {
        let topic = if version >= 13 {
            FetchTopic::default().with_topic_id(topic_id)
        } else {
            FetchTopic::default().with_topic(name("zc"))
        };
        let resp = conn.call(&fetch(topic.with_partitions(all_partitions()), 0, 0, 1 << 24), version).await;
        assert_eq!(partitions_in(&resp), vec![0, 1, 2], "v{version}");
        for p in &resp.responses[0].partitions {
            assert_eq!(p.error_code, 0, "v{version} partition {}", p.partition_index);
            let got = p.records.as_deref().unwrap_or_default();
            assert!(
                got == &stored[p.partition_index as usize][..],
                "v{version} partition {}: records differ from the segment files ({} vs {} bytes)",
                p.partition_index,
                got.len(),
                stored[p.partition_index as usize].len()
            );
        }
    }

    // Pipelined: fetch, metadata, fetch, sent before reading anything.
    let req = fetch(FetchTopic::default().with_topic(name("zc")).with_partitions(all_partitions()), 0, 0, 1 << 24);
    let metadata =
        MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(name("zc")))]));
    let ids = [conn.send(&req, 12).await, conn.send(&metadata, 12).await, conn.send(&req, 12).await];
    for (i, id) in ids.into_iter().enumerate() {
        let mut frame = conn.read_frame().await.expect("pipelined response");
        let api_key = if i == 1 { ApiKey::Metadata } else { ApiKey::Fetch };
        let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(12)).unwrap();
        assert_eq!(header.correlation_id, id, "responses in request order");
        if i == 1 {
            MetadataResponse::decode(&mut frame, 12).unwrap();
        } else {
            let resp = FetchResponse::decode(&mut frame, 12).unwrap();
            let total: usize = (0..PARTITIONS).map(|p| records_len(&resp, p)).sum();
            assert_eq!(total, stored.iter().map(Vec::len).sum::<usize>());
        }
    }

    // A real consumer over all partitions, validating CRCs.
    let b = bootstrap.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = consumer_config(&b).set("enable.partition.eof", "false").create().unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset("zc", p, Offset::Beginning).unwrap();
        }
        consumer.assign(&tpl).unwrap();
        let mut seen = vec![false; RECORDS];
        let mut count = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while count < RECORDS {
            assert!(std::time::Instant::now() < deadline, "only {count} of {RECORDS} records consumed");
            let Some(msg) = consumer.poll(Duration::from_millis(200)) else { continue };
            let msg = msg.expect("consumer error");
            let payload = std::str::from_utf8(msg.payload().unwrap()).unwrap();
            let i: usize = payload[..5].parse().unwrap();
            assert_eq!(payload, value(i));
            assert_eq!(msg.partition(), (i % PARTITIONS as usize) as i32);
            assert!(!seen[i], "record {i} twice");
            seen[i] = true;
            count += 1;
        }
    })
    .await
    .unwrap();
    broker.shutdown().await;
}
