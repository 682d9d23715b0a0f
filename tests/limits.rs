//! Broker-wide limits Kafka has: idle connections (`connections.max.idle.ms`),
//! memory for requests being received (`queued.max.request.bytes`), and a
//! bound on topics auto-created by one Metadata request.
//!
//! Goal: a slow or silent connection is closed once idle, however it trickles
//! bytes; many connections declaring large requests wait for room in the
//! request memory pool instead of growing memory, and proceed once room is
//! back; one Metadata request naming a thousand unknown topics creates a
//! bounded number; ordinary librdkafka clients keep working throughout.
//! Method: in-process brokers with small limits, raw Kafka protocol over TCP
//! for the hostile clients, librdkafka for the ordinary ones; the pool's
//! reserved-bytes figure is read from the broker state.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::RawConn;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LEADER_NOT_AVAILABLE: i16 = 5;

/// Waits for the broker to close `conn`, writing one byte every `trickle` if
/// given (a request arriving byte by byte). Returns how long the close took
/// from `since`; panics if it has not happened by `deadline`.
async fn closed_after(conn: &mut RawConn, since: Instant, trickle: Option<Duration>, deadline: Duration) -> Duration {
    let mut tick = tokio::time::interval(trickle.unwrap_or(Duration::from_secs(3600)));
    tick.tick().await;
    let mut buf = [0u8; 64];
    loop {
        let left = deadline.checked_sub(since.elapsed()).unwrap_or_else(|| {
            panic!("the broker did not close the connection within {deadline:?}");
        });
        tokio::select! {
            read = conn.stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => return since.elapsed(),
                Ok(n) => panic!("unexpected {n} bytes from the broker"),
            },
            _ = tick.tick(), if trickle.is_some() => {
                if conn.stream.write_all(&[0x7f]).await.is_err() {
                    return since.elapsed();
                }
            }
            _ = tokio::time::sleep(left) => {}
        }
    }
}

/// connections.max.idle.ms=300: a request trickling in byte by byte and a
/// silent connection are both closed after about 300 ms, a connection that
/// keeps sending requests is not, and a librdkafka producer and consumer
/// work across the closes of their idle connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_even_when_a_request_trickles_in() {
    let broker = common::start_broker(&["connections.max.idle.ms=300"]).await;
    let bootstrap = broker.bootstrap();
    common::create_topic(&bootstrap, "data", 1, &[]).await;
    let idle = Duration::from_millis(300);
    let deadline = Duration::from_secs(5);

    // A 1000-byte request whose bytes arrive one every 50 ms (it would take 50 s).
    // The clock starts before connecting: the broker may accept and start its
    // idle timer before this task resumes from the connect.
    let started = Instant::now();
    let mut trickle = RawConn::connect(broker.addr()).await;
    trickle.stream.write_all(&1000i32.to_be_bytes()).await.unwrap();
    let took = closed_after(&mut trickle, started, Some(Duration::from_millis(50)), deadline).await;
    assert!(took >= idle, "closed after {took:?}, before connections.max.idle.ms");

    // A connection that never sends anything.
    let started = Instant::now();
    let mut silent = RawConn::connect(broker.addr()).await;
    let took = closed_after(&mut silent, started, None, deadline).await;
    assert!(took >= idle, "closed after {took:?}, before connections.max.idle.ms");

    // A connection with a request every 100 ms stays open well past 300 ms.
    let mut busy = RawConn::connect(broker.addr()).await;
    let request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("strand-test"))
        .with_client_software_version(StrBytes::from_static_str("1"));
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    for _ in 0..15 {
        tick.tick().await;
        assert_eq!(busy.call(&request, 3).await.error_code, 0);
    }

    // librdkafka reconnects transparently after the broker closed its idle connections.
    let producer: rdkafka::producer::FutureProducer = common::producer_config(&bootstrap).create().unwrap();
    let send = |value: &'static [u8]| {
        let record = rdkafka::producer::FutureRecord::<(), [u8]>::to("data").partition(0).payload(value);
        producer.send(record, Duration::from_secs(20))
    };
    let first = send(b"before idle").await.unwrap_or_else(|(e, _)| panic!("{e}"));
    // A connection opened after that delivery is closed only once 300 ms
    // have passed, so by then the producer's connections have idled out too.
    let mut witness = RawConn::connect(broker.addr()).await;
    closed_after(&mut witness, Instant::now(), None, deadline).await;
    let second = send(b"after idle").await.unwrap_or_else(|(e, _)| panic!("{e}"));
    assert_eq!(second.offset, first.offset + 1);
    let mut consumer = common::consumer_config(&bootstrap);
    consumer.set("fetch.wait.max.ms", "1000"); // long polls outlast the idle limit
    let got = tokio::task::spawn_blocking(move || {
        common::consume_blocking(consumer, "data", 0, 0, 2, Duration::from_secs(20))
    })
    .await
    .unwrap();
    assert_eq!(got, vec![(0, b"before idle".to_vec()), (1, b"after idle".to_vec())]);
    drop(busy);
    broker.shutdown().await;
}

fn produce_request(topic: &str, records: Vec<u8>) -> ProduceRequest {
    ProduceRequest::default().with_acks(-1).with_timeout_ms(10_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_string(topic.to_string())))
        .with_partition_data(vec![PartitionProduceData::default()
            .with_index(0)
            .with_records(Some(Bytes::from(records)))])])
}

/// queued.max.request.bytes=1 MiB: of eight connections each declaring a
/// 512 KiB request (and sending only its first bytes), two get room and six
/// wait without reading; the reserved bytes never pass the bound. A normal
/// producer waits behind them and completes once they close, and a request
/// larger than the whole pool still goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_memory_is_bounded_by_queued_max_request_bytes() {
    const POOL: usize = 1 << 20;
    let broker = common::start_broker(&[
        "queued.max.request.bytes=1048576",
        "socket.request.max.bytes=8388608",
        "message.max.bytes=4194304",
    ])
    .await;
    let bootstrap = broker.bootstrap();
    common::create_topic(&bootstrap, "data", 1, &[]).await;
    let pool = broker.handle.state().request_pool().clone();
    assert_eq!(pool.capacity(), POOL);

    let mut stuck = Vec::new();
    for _ in 0..8 {
        let mut c = RawConn::connect(broker.addr()).await;
        c.stream.write_all(&(512i32 << 10).to_be_bytes()).await.unwrap();
        c.stream.write_all(&[0u8; 100]).await.unwrap();
        stuck.push(c);
    }
    common::wait_for(
        "two 512 KiB requests reserved, six waiting",
        Duration::from_secs(10),
        Duration::from_millis(10),
        || {
            let (reserved, waiting) = (pool.reserved_bytes(), pool.waiting());
            assert!(reserved <= POOL, "{reserved} bytes reserved, above the {POOL}-byte pool");
            async move { (reserved == POOL && waiting == 6).then_some(()) }
        },
    )
    .await;

    // An ordinary producer's requests queue behind them...
    let producer = tokio::spawn({
        let bootstrap = bootstrap.clone();
        async move { common::produce_one(&bootstrap, "data", 0, b"after the flood").await }
    });
    common::wait_for(
        "the producer's request waiting for room",
        Duration::from_secs(10),
        Duration::from_millis(10),
        || {
            let waiting = pool.waiting();
            async move { (waiting >= 7).then_some(()) }
        },
    )
    .await;
    assert!(pool.reserved_bytes() <= POOL);
    assert!(!producer.is_finished(), "the producer got through a full pool");
    // ...and completes once the flood goes away.
    drop(stuck);
    let (_, offset) =
        tokio::time::timeout(Duration::from_secs(30), producer).await.expect("produce completes").unwrap();
    assert_eq!(offset, 0);
    common::wait_for("the pool drained", Duration::from_secs(10), Duration::from_millis(10), || {
        let reserved = pool.reserved_bytes();
        async move { (reserved == 0).then_some(()) }
    })
    .await;

    // A 2 MiB request, twice the pool, is read and handled.
    let value = vec![0x5au8; 2 << 20];
    let batch = strand_storage::batch::build_test_batch(0, 1_700_000_000_000, &[&value]);
    let mut c = RawConn::connect(broker.addr()).await;
    let resp = c.call(&produce_request("data", batch), 9).await;
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!((p.error_code, p.base_offset), (0, 1));
    let got = common::consume(&bootstrap, "data", 0, 0, 2, Duration::from_secs(20)).await;
    assert_eq!(got[0].1, b"after the flood");
    assert!(got[1].1 == value, "the large record reads back intact");
    drop(c);
    broker.shutdown().await;
}

async fn auto_create(conn: &mut RawConn, names: &[String]) -> Vec<(String, i16)> {
    let topics = names
        .iter()
        .map(|n| MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(n.clone())))))
        .collect();
    let req = MetadataRequest::default().with_topics(Some(topics)).with_allow_auto_topic_creation(true);
    let resp = conn.call(&req, 12).await;
    resp.topics.iter().map(|t| (t.name.as_ref().unwrap().0.to_string(), t.error_code)).collect()
}

/// One Metadata request naming 1,000 unknown topics creates at most
/// AUTO_CREATE_TOPICS_PER_REQUEST of them (the first, in request order) and
/// answers the rest LEADER_NOT_AVAILABLE; a retry creates the next batch;
/// a librdkafka producer still auto-creates its topic as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_auto_creation_is_bounded_per_request() {
    let bound = strand::api::metadata::AUTO_CREATE_TOPICS_PER_REQUEST;
    let broker = common::start_broker(&[]).await;
    let names: Vec<String> = (0..1000).map(|i| format!("many-{i:04}")).collect();
    let created = |broker: &common::TestBroker| {
        broker.handle.state().replicas.topics().by_name.keys().filter(|n| n.starts_with("many-")).count()
    };
    let mut conn = RawConn::connect(broker.addr()).await;

    let answers = auto_create(&mut conn, &names).await;
    assert_eq!(answers.len(), names.len());
    for (i, (name, code)) in answers.iter().enumerate() {
        assert_eq!(name, &names[i]);
        let expected = if i < bound { 0 } else { LEADER_NOT_AVAILABLE };
        assert_eq!(*code, expected, "{name} (topic {i} of the request)");
    }
    assert_eq!(created(&broker), bound);

    let answers = auto_create(&mut conn, &names).await;
    assert_eq!(answers.iter().filter(|(_, c)| *c == 0).count(), 2 * bound, "existing topics plus the next batch");
    assert_eq!(created(&broker), 2 * bound);
    let dirs = std::fs::read_dir(broker.log_dir()).unwrap().flatten();
    assert_eq!(dirs.filter(|e| e.file_name().to_string_lossy().starts_with("many-")).count(), 2 * bound);

    // Ordinary clients: a producer auto-creating a new topic, and a round trip.
    let bootstrap = broker.bootstrap();
    let (partition, offset) = common::produce_one(&bootstrap, "fresh", 0, b"auto-created").await;
    let got = common::consume(&bootstrap, "fresh", partition, offset, 1, Duration::from_secs(20)).await;
    assert_eq!(got, vec![(offset, b"auto-created".to_vec())]);
    drop(conn);
    broker.shutdown().await;
}
