//! Hostile and malformed input on the wire.
//!
//! Goal: no byte sequence a client sends can crash the broker, wedge it, or
//! corrupt a log. Bad framing and undecodable requests close that one
//! connection; well-formed requests with bad contents get Kafka error codes.
//!
//! Method: an in-process broker (socket.request.max.bytes=1 MiB, topic
//! auto-creation off) is driven with raw frames over a tokio TcpStream,
//! built with the `kafka-protocol` crate or by hand. After every case a
//! second connection opened before the case must still answer a Metadata
//! request, a fresh librdkafka producer and consumer must round-trip a
//! record, and no broker task may have panicked (a panic hook counts panics
//! on tokio worker threads).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use common::{RawConn, Rng, TestBroker};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, ListOffsetsRequest, MetadataRequest, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, StrBytes};

const TOPIC: &str = "data";
const ALIVE: &str = "alive";
const UNSUPPORTED_VERSION: i16 = 35;
const CORRUPT_MESSAGE: i16 = 2;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

static WORKER_PANICS: AtomicUsize = AtomicUsize::new(0);
static HOOK: Once = Once::new();

/// Counts panics on tokio worker threads (where connection tasks run); test
/// threads' own assertion failures are not counted.
fn install_panic_counter() {
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().name().is_some_and(|n| n.starts_with("tokio-runtime-worker")) {
                WORKER_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            default(info);
        }));
    });
}

struct Fixture {
    broker: TestBroker,
    /// Opened before the case runs; must keep working after it.
    sentinel: RawConn,
}

impl Fixture {
    async fn new() -> Fixture {
        install_panic_counter();
        let broker =
            common::start_broker(&["socket.request.max.bytes=1048576", "auto.create.topics.enable=false"]).await;
        common::create_topic(&broker.bootstrap(), TOPIC, 1, &[]).await;
        common::create_topic(&broker.bootstrap(), ALIVE, 1, &[]).await;
        let sentinel = RawConn::connect(broker.addr()).await;
        Fixture { broker, sentinel }
    }

    async fn conn(&self) -> RawConn {
        RawConn::connect(self.broker.addr()).await
    }

    /// The broker is alive and well after `case`.
    async fn check_alive(&mut self, case: &str) {
        assert_eq!(WORKER_PANICS.load(Ordering::SeqCst), 0, "{case}: a broker task panicked");
        let req = MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_static_str(ALIVE))))
        ]));
        let resp = self.sentinel.call(&req, 12).await;
        assert_eq!(resp.topics.len(), 1, "{case}: sentinel Metadata");
        assert_eq!(resp.topics[0].error_code, 0, "{case}: sentinel Metadata error");
        let bootstrap = self.broker.bootstrap();
        let value = format!("alive after {case}");
        let (partition, offset) = common::produce_one(&bootstrap, ALIVE, 0, value.as_bytes()).await;
        let got = common::consume(&bootstrap, ALIVE, partition, offset, 1, Duration::from_secs(20)).await;
        assert_eq!(got[0], (offset, value.into_bytes()), "{case}: rdkafka round trip");
    }

    async fn finish(mut self, case: &str) {
        self.check_alive(case).await;
        self.broker.handle.shutdown().await;
    }
}

/// A request header v1 written by hand (any api key, any version).
fn header_v1(api_key: i16, version: i16, correlation_id: i32) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_i16(api_key);
    b.put_i16(version);
    b.put_i32(correlation_id);
    let client = b"strand-raw-test";
    b.put_i16(client.len() as i16);
    b.put_slice(client);
    b
}

fn produce_request(topic: &str, partition: i32, records: Vec<u8>) -> ProduceRequest {
    ProduceRequest::default().with_acks(-1).with_timeout_ms(10_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_string(topic.to_string())))
        .with_partition_data(vec![PartitionProduceData::default()
            .with_index(partition)
            .with_records(Some(Bytes::from(records)))])])
}

/// (error code, base offset) of the single partition in a produce response.
async fn produce(conn: &mut RawConn, version: i16, topic: &str, partition: i32, records: Vec<u8>) -> (i16, i64) {
    let resp = conn.call(&produce_request(topic, partition, records), version).await;
    assert_eq!(resp.responses.len(), 1);
    let p = &resp.responses[0].partition_responses;
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].index, partition);
    (p[0].error_code, p[0].base_offset)
}

/// ListOffsets latest (the log end offset) of `topic`-0.
async fn latest_offset(conn: &mut RawConn, topic: &str) -> i64 {
    let req = ListOffsetsRequest::default().with_replica_id((-1).into()).with_topics(vec![ListOffsetsTopic::default()
        .with_name(TopicName(StrBytes::from_string(topic.to_string())))
        .with_partitions(vec![ListOffsetsPartition::default().with_partition_index(0).with_timestamp(-1)])]);
    let resp = conn.call(&req, 7).await;
    let p = &resp.topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "ListOffsets error");
    p.offset
}

/// (a) Random bytes. Pure noise (then end of stream) must end in a closed
/// connection; frames with a plausible header (a served API at a served
/// version) and a random body must be answered or closed, never crash or hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_close_the_connection() {
    let f = Fixture::new().await;
    let seed = common::seed("random_bytes_close_the_connection");
    let mut rng = Rng::new(seed);
    for round in 0..16 {
        // Pure noise, then the client half-closes: whatever the broker made of
        // it, it must close its side (bad size, truncated frame or bad request).
        let mut noise = vec![0u8; 1 + rng.below(4096) as usize];
        rng.fill(&mut noise);
        let mut c = f.conn().await;
        use tokio::io::AsyncWriteExt;
        // The broker may close before reading everything; a failed write is fine.
        let _ = c.stream.write_all(&noise).await;
        let _ = c.stream.shutdown().await;
        read_until_closed(&mut c, &format!("noise round {round} (seed {seed})")).await;
    }
    let served: &[(i16, i16, i16)] =
        &[(0, 3, 13), (1, 4, 17), (2, 1, 10), (3, 0, 13), (18, 0, 4), (19, 2, 7), (21, 0, 2), (32, 1, 4)];
    for round in 0..48 {
        let (key, lo, hi) = served[rng.below(served.len() as u64) as usize];
        let version = lo + rng.below((hi - lo + 1) as u64) as i16;
        let api_key = ApiKey::try_from(key).unwrap();
        let correlation_id = 1000 + round;
        let mut body = BytesMut::new();
        let header = kafka_protocol::messages::RequestHeader::default()
            .with_request_api_key(key)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("noise")));
        use kafka_protocol::protocol::Encodable;
        header.encode(&mut body, api_key.request_header_version(version)).unwrap();
        let mut noise = vec![0u8; rng.below(512) as usize];
        rng.fill(&mut noise);
        body.put_slice(&noise);
        let mut c = f.conn().await;
        c.write_frame(&body).await.expect("write");
        let what = format!("{api_key:?} v{version} with {} random body bytes (seed {seed})", noise.len());
        // Either a response with our correlation id, or a close.
        match c.read_frame().await {
            Ok(frame) => {
                assert!(frame.len() >= 4, "{what}: short response");
                let id = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
                assert_eq!(id, correlation_id, "{what}: response correlation id");
            }
            Err(e) => assert!(
                matches!(e.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset),
                "{what}: neither answered nor closed: {e}"
            ),
        }
    }
    f.finish("random bytes").await;
}

/// Reads and discards until the broker closes (bounded by RAW_TIMEOUT per read).
async fn read_until_closed(c: &mut RawConn, what: &str) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout(common::RAW_TIMEOUT, c.stream.read(&mut buf)).await {
            Err(_) => panic!("{what}: the broker did not close the connection"),
            Ok(Ok(0)) => return,
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return,
        }
    }
}

/// (b) A length prefix above socket.request.max.bytes (1 MiB here), and a
/// negative one, close the connection before any body is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_length_prefix_closes_the_connection() {
    let mut f = Fixture::new().await;
    for size in [1i32 << 30, 1_048_577, i32::MAX, -1, i32::MIN] {
        let mut c = f.conn().await;
        use tokio::io::AsyncWriteExt;
        c.stream.write_all(&size.to_be_bytes()).await.unwrap();
        // A few body bytes, far fewer than claimed: the broker must not wait for the rest.
        let _ = c.stream.write_all(&header_v1(3, 12, 1)).await;
        c.expect_closed(&format!("length prefix {size}")).await;
        f.check_alive(&format!("length prefix {size}")).await;
    }
    // Exactly at the limit is accepted as a frame, then fails to decode as a
    // request: 0x7f7f7f7f topics of 32639-byte names run out of bytes.
    let mut c = f.conn().await;
    let mut body = header_v1(3, 4, 1);
    body.resize(1_048_576, 0x7f);
    c.write_frame(&body).await.unwrap();
    c.expect_closed("1 MiB frame of a garbage Metadata request").await;
    f.finish("oversized length prefix").await;
}

/// (c) An API key Kafka does not define closes the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_api_key_closes_the_connection() {
    let mut f = Fixture::new().await;
    for key in [999i16, -1, i16::MAX] {
        let mut c = f.conn().await;
        c.write_frame(&header_v1(key, 0, 7)).await.unwrap();
        c.expect_closed(&format!("api key {key}")).await;
        f.check_alive(&format!("api key {key}")).await;
    }
    // A key Kafka defines but Strand does not serve yet (InitProducerId = 22) closes too.
    let mut c = f.conn().await;
    c.write_frame(&header_v1(22, 4, 7)).await.unwrap();
    c.expect_closed("InitProducerId").await;
    f.finish("unknown api key").await;
}

/// (d) KIP-511: ApiVersions at a version the broker does not know gets a v0
/// response with UNSUPPORTED_VERSION and the broker's version table; the
/// connection stays usable for a retry at a supported version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_versions_unsupported_version_answers_v0() {
    let f = Fixture::new().await;
    let mut c = f.conn().await;
    // A newer client sends header v2 (flexible) with an empty tagged-field section and a body we cannot know.
    let mut body = header_v1(18, 99, 4242);
    body.put_u8(0); // header tagged fields
    body.put_slice(&[0x07, b'c', b'l', b'i', b'e', b'n', b't', 0x02, b'1', 0x00]);
    c.write_frame(&body).await.unwrap();
    let mut frame = c.read_frame().await.expect("a response to ApiVersions v99");
    let header = kafka_protocol::messages::ResponseHeader::decode(&mut frame, 0).unwrap();
    assert_eq!(header.correlation_id, 4242);
    let resp = ApiVersionsResponse::decode(&mut frame, 0).expect("v0 ApiVersionsResponse");
    assert_eq!(resp.error_code, UNSUPPORTED_VERSION);
    let produce = resp.api_keys.iter().find(|k| k.api_key == 0).expect("Produce listed");
    assert!(produce.min_version <= produce.max_version);
    let av = resp.api_keys.iter().find(|k| k.api_key == 18).expect("ApiVersions listed");
    assert_eq!(av.min_version, 0);
    assert!(av.max_version >= 3);
    // The client retries at the highest version both know, on the same connection.
    let retry = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("strand-test"))
        .with_client_software_version(StrBytes::from_static_str("1"));
    let ok = c.call(&retry, av.max_version).await;
    assert_eq!(ok.error_code, 0);
    assert_eq!(ok.api_keys.len(), resp.api_keys.len());
    f.finish("ApiVersions v99").await;
}

/// (e) Another API at a version outside the advertised range closes the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_version_of_other_api_closes_the_connection() {
    let mut f = Fixture::new().await;
    for (key, version) in [(0i16, 1i16), (0, 99), (1, 0), (3, -1), (2, 0)] {
        let mut c = f.conn().await;
        let mut body = header_v1(key, version, 9);
        body.put_slice(&[0, 0, 0, 0, 0, 0]);
        c.write_frame(&body).await.unwrap();
        c.expect_closed(&format!("api key {key} v{version}")).await;
        f.check_alive(&format!("api key {key} v{version}")).await;
    }
    f.finish("unsupported version").await;
}

/// (f) A batch with a wrong CRC-32C gets CORRUPT_MESSAGE and nothing is
/// appended, also when it follows a valid batch in the same request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_crc_is_corrupt_message_and_appends_nothing() {
    let f = Fixture::new().await;
    let mut c = f.conn().await;
    let good = strand_storage::batch::build_test_batch(0, 1_700_000_000_000, &[b"one", b"two", b"three"]);
    let (code, base) = produce(&mut c, 8, TOPIC, 0, good.clone()).await;
    assert_eq!((code, base), (0, 0), "a valid batch is appended");
    let end = latest_offset(&mut c, TOPIC).await;
    assert_eq!(end, 3);

    let mut bad = good.clone();
    let last = bad.len() - 2;
    bad[last] ^= 0x40; // inside the last record's value, covered by the CRC
    for version in [3i16, 8, 9, 12] {
        let (code, _) = produce(&mut c, version, TOPIC, 0, bad.clone()).await;
        assert_eq!(code, CORRUPT_MESSAGE, "Produce v{version} with a bad CRC");
        assert_eq!(latest_offset(&mut c, TOPIC).await, end, "nothing appended (v{version})");
    }
    // The CRC field itself wrong.
    let mut bad_field = good.clone();
    bad_field[17] ^= 0x01;
    let (code, _) = produce(&mut c, 9, TOPIC, 0, bad_field).await;
    assert_eq!(code, CORRUPT_MESSAGE, "wrong CRC field");
    // A valid batch followed by a corrupt one: the whole partition's data is refused.
    let mut two = good.clone();
    two.extend_from_slice(&bad);
    let (code, _) = produce(&mut c, 9, TOPIC, 0, two).await;
    assert_eq!(code, CORRUPT_MESSAGE, "valid + corrupt batch");
    assert_eq!(latest_offset(&mut c, TOPIC).await, end, "nothing appended from a partly corrupt request");
    // The same connection still produces.
    let (code, base) = produce(&mut c, 9, TOPIC, 0, good).await;
    assert_eq!((code, base), (0, 3));
    // And consumers read exactly the good records, uncorrupted.
    let got = common::consume(&f.broker.bootstrap(), TOPIC, 0, 0, 6, Duration::from_secs(20)).await;
    let values: Vec<&[u8]> = got.iter().map(|(_, v)| v.as_slice()).collect();
    assert_eq!(values, [b"one".as_slice(), b"two", b"three", b"one", b"two", b"three"]);
    f.finish("bad CRC").await;
}

/// (g) With auto-creation off, Produce to an unknown topic, or to a partition
/// the topic does not have, is UNKNOWN_TOPIC_OR_PARTITION.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topic_and_partition() {
    let f = Fixture::new().await;
    let mut c = f.conn().await;
    let batch = strand_storage::batch::build_test_batch(0, 1_700_000_000_000, &[b"x"]);
    for version in [3i16, 9, 12] {
        let (code, _) = produce(&mut c, version, "no-such-topic", 0, batch.clone()).await;
        assert_eq!(code, UNKNOWN_TOPIC_OR_PARTITION, "unknown topic, Produce v{version}");
        for partition in [1, 7, -1, i32::MAX] {
            let (code, _) = produce(&mut c, version, TOPIC, partition, batch.clone()).await;
            assert_eq!(code, UNKNOWN_TOPIC_OR_PARTITION, "partition {partition}, Produce v{version}");
        }
    }
    // Nothing was created or appended.
    let md = c
        .call(
            &MetadataRequest::default()
                .with_topics(Some(vec![MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("no-such-topic"))))]))
                .with_allow_auto_topic_creation(true),
            12,
        )
        .await;
    assert_eq!(md.topics[0].error_code, UNKNOWN_TOPIC_OR_PARTITION, "topic not auto-created");
    assert_eq!(latest_offset(&mut c, TOPIC).await, 0);
    f.finish("unknown topic/partition").await;
}

/// (h) A valid header followed by a truncated or garbage body closes the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_header_bad_body_closes_the_connection() {
    let mut f = Fixture::new().await;
    let good_produce = RawConn::encode_request(
        &produce_request(TOPIC, 0, strand_storage::batch::build_test_batch(0, 1_700_000_000_000, &[b"value"])),
        9,
        5,
    );
    let good_metadata = RawConn::encode_request(
        &MetadataRequest::default().with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_static_str(TOPIC))))
        ])),
        4,
        6,
    );
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for cut in [good_produce.len() - 1, good_produce.len() - 40, 30] {
        cases.push((format!("Produce v9 cut to {cut} of {} bytes", good_produce.len()), good_produce[..cut].to_vec()));
    }
    cases.push(("Metadata v4 cut in the topics array".into(), good_metadata[..good_metadata.len() - 3].to_vec()));
    let mut garbage = header_v1(3, 4, 6).to_vec();
    garbage.extend_from_slice(&[0, 0, 0, 1, 0x7f, 0xff]); // one topic whose name claims 32767 bytes
    cases.push(("Metadata v4 with an over-long topic name".into(), garbage));
    let mut bad_client_id = BytesMut::new();
    bad_client_id.put_i16(3);
    bad_client_id.put_i16(4);
    bad_client_id.put_i32(6);
    bad_client_id.put_i16(1000); // client id claims 1000 bytes, frame ends
    bad_client_id.put_slice(b"abc");
    cases.push(("header whose client id runs past the frame".into(), bad_client_id.to_vec()));
    let mut invalid_utf8 = header_v1(3, 4, 6).to_vec();
    invalid_utf8.extend_from_slice(&[0, 0, 0, 1, 0, 2, 0xff, 0xfe, 1]);
    cases.push(("Metadata v4 with a non-UTF-8 topic name".into(), invalid_utf8));
    cases.push(("frame shorter than a header".into(), vec![0, 3, 0]));
    cases.push(("empty frame".into(), vec![]));
    for (what, body) in cases {
        let mut c = f.conn().await;
        c.write_frame(&body).await.unwrap();
        c.expect_closed(&what).await;
        f.check_alive(&what).await;
    }
    // A complete frame followed by a connection that ends mid-frame: the first is answered.
    let mut c = f.conn().await;
    c.write_frame(&good_metadata).await.unwrap();
    use tokio::io::AsyncWriteExt;
    c.stream.write_all(&100i32.to_be_bytes()).await.unwrap();
    c.stream.write_all(&good_metadata[..20]).await.unwrap();
    c.stream.shutdown().await.unwrap();
    let frame = c.read_frame().await.expect("the complete request is answered");
    assert_eq!(i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]), 6);
    c.expect_closed("connection ending mid-frame").await;
    assert_eq!(latest_offset(&mut f.sentinel, TOPIC).await, 0, "no partial produce appended");
    f.finish("bad body").await;
}

/// (i) Array lengths claiming billions of elements (the codec pre-sizes its
/// Vec from them) close the connection instead of aborting the process on
/// allocation failure (src/alloc_guard.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_array_length_closes_the_connection() {
    let mut f = Fixture::new().await;
    for count in [2_000_000_000i32, i32::MAX, 50_000_000, 1_000_000] {
        // Metadata v4 (classic encoding): topics array length, then one short name.
        let mut body = header_v1(3, 4, 11);
        body.put_i32(count);
        body.put_i16(1);
        body.put_u8(b'a');
        body.put_u8(1); // allow_auto_topic_creation
        let mut c = f.conn().await;
        c.write_frame(&body).await.unwrap();
        c.expect_closed(&format!("Metadata v4 claiming {count} topics")).await;
        f.check_alive(&format!("Metadata v4 claiming {count} topics")).await;

        // Metadata v12 (flexible): compact array length is count + 1 as an unsigned varint.
        let mut body = header_v1(3, 12, 12);
        body.put_u8(0); // header tagged fields
        let mut n = count as u32 as u64 + 1;
        while n >= 0x80 {
            body.put_u8((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        body.put_u8(n as u8);
        body.put_slice(&[0u8; 16]);
        let mut c = f.conn().await;
        c.write_frame(&body).await.unwrap();
        c.expect_closed(&format!("Metadata v12 claiming {count} topics")).await;
        f.check_alive(&format!("Metadata v12 claiming {count} topics")).await;

        // Produce v8: topic_data array claiming `count` topics.
        let mut body = header_v1(0, 8, 13);
        body.put_i16(-1); // transactional id: null
        body.put_i16(-1); // acks
        body.put_i32(1000); // timeout
        body.put_i32(count);
        let mut c = f.conn().await;
        c.write_frame(&body).await.unwrap();
        c.expect_closed(&format!("Produce v8 claiming {count} topics")).await;
        f.check_alive(&format!("Produce v8 claiming {count} topics")).await;
    }
    f.finish("huge array length").await;
}

/// Rewrites the CRC-32C of a batch after a test changed its header or records.
fn fix_crc(batch: &mut [u8]) {
    let end = (12 + i32::from_be_bytes(batch[8..12].try_into().unwrap()) as usize).min(batch.len());
    let crc = crc32c::crc32c(&batch[21..end]);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}

fn set_i32(batch: &mut [u8], at: usize, v: i32) {
    batch[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// A one-record batch whose record says offset delta `offset_delta`.
fn batch_with_offset_deltas(deltas: &[u8]) -> Vec<u8> {
    let values: Vec<&[u8]> = deltas.iter().map(|_| b"v".as_slice()).collect();
    let mut b = strand_storage::batch::build_test_batch(0, 1_700_000_000_000, &values);
    // Each record is: len(1) attrs(1) ts delta(1) offset delta(1) key(1) value len(1) value(1) headers(1).
    for (i, &d) in deltas.iter().enumerate() {
        b[61 + i * 8 + 3] = d * 2; // zigzag
    }
    fix_crc(&mut b);
    b
}

/// (j) Batches whose header or records are inconsistent are refused as Kafka's
/// LogValidator refuses them (INVALID_RECORD, 87), all with a correct CRC, and
/// nothing is written: a record count other than lastOffsetDelta + 1 (the
/// absurd lastOffsetDelta = 2^31 - 1 that used to move the log end by 2^31
/// and roll a segment per request), offset deltas that skip, records that
/// overrun or underfill the batch, a maxTimestamp no record has, and a
/// compressed batch claiming more records than its bytes can hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inconsistent_batches_are_invalid_record_and_write_nothing() {
    use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
    const INVALID_RECORD: i16 = 87;
    let f = Fixture::new().await;
    let mut c = f.conn().await;
    let good = strand_storage::batch::build_test_batch(0, 1_700_000_000_000, &[b"one", b"two", b"three"]);
    assert_eq!(produce(&mut c, 9, TOPIC, 0, good.clone()).await, (0, 0));

    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut absurd = strand_storage::batch::build_test_batch(0, 1_700_000_000_000, &[b"x"]);
    set_i32(&mut absurd, 23, i32::MAX);
    fix_crc(&mut absurd);
    cases.push(("lastOffsetDelta 2^31-1 with one record", absurd.clone()));
    let mut gap = good.clone();
    set_i32(&mut gap, 23, 5);
    fix_crc(&mut gap);
    cases.push(("3 records, lastOffsetDelta 5", gap));
    let mut fewer = good.clone();
    set_i32(&mut fewer, 57, 2);
    fix_crc(&mut fewer);
    cases.push(("recordCount 2 for 3 records", fewer));
    let mut zero = good.clone();
    set_i32(&mut zero, 57, 0);
    set_i32(&mut zero, 23, -1);
    fix_crc(&mut zero);
    cases.push(("no records, lastOffsetDelta -1", zero));
    cases.push(("offset deltas 0, 2, 3", batch_with_offset_deltas(&[0, 2, 3])));
    cases.push(("offset deltas 0, 1, 1", batch_with_offset_deltas(&[0, 1, 1])));
    let mut overrun = strand_storage::batch::build_test_batch(0, 1_700_000_000_000, &[b"v"]);
    overrun[61] = 40; // record length 20 (zigzag), the batch has 7 bytes after it
    fix_crc(&mut overrun);
    cases.push(("record length past the batch", overrun));
    let mut trailing = strand_storage::batch::build_test_batch(0, 1_700_000_000_000, &[b"v"]);
    trailing.extend_from_slice(&[0, 0, 0]);
    let len = trailing.len() as i32 - 12;
    set_i32(&mut trailing, 8, len);
    fix_crc(&mut trailing);
    cases.push(("bytes after the last record", trailing));
    let mut max_ts = good.clone();
    max_ts[35..43].copy_from_slice(&1_800_000_000_000i64.to_be_bytes());
    fix_crc(&mut max_ts);
    cases.push(("maxTimestamp above every record", max_ts));
    // A gzip batch of 2 records claiming 2^31 - 1.
    let record = |offset: i64| Record {
        transactional: false,
        delete_horizon: false,
        control: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: -1,
        timestamp: 1_700_000_000_000,
        key: None,
        value: Some(Bytes::from_static(b"compressed")),
        headers: Default::default(),
    };
    let mut gz = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut gz,
        &[record(0), record(1)],
        &RecordEncodeOptions { version: 2, compression: Compression::Gzip },
    )
    .unwrap();
    let gz_good = gz.to_vec();
    let mut gz_bomb = gz_good.clone();
    set_i32(&mut gz_bomb, 23, i32::MAX - 1);
    set_i32(&mut gz_bomb, 57, i32::MAX);
    fix_crc(&mut gz_bomb);
    cases.push(("gzip batch claiming 2^31-1 records", gz_bomb));

    for (case, batch) in cases {
        let (code, _) = produce(&mut c, 9, TOPIC, 0, batch.clone()).await;
        assert_eq!(code, INVALID_RECORD, "{case}");
        // Also when it follows a valid batch in the same request.
        let (code, _) = produce(&mut c, 9, TOPIC, 0, [good.clone(), batch].concat()).await;
        assert_eq!(code, INVALID_RECORD, "valid batch + {case}");
        assert_eq!(latest_offset(&mut c, TOPIC).await, 3, "nothing appended: {case}");
    }
    // The probe that exhausted file descriptors: hundreds of absurd batches
    // roll no segment and move no offset.
    for _ in 0..600 {
        assert_eq!(produce(&mut c, 9, TOPIC, 0, absurd.clone()).await.0, INVALID_RECORD);
    }
    let segments = std::fs::read_dir(f.broker.partition_dir(TOPIC, 0))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".log"))
        .count();
    assert_eq!(segments, 1, "no segment rolled");
    // A consistent compressed batch is accepted and lands at the next offset.
    assert_eq!(produce(&mut c, 9, TOPIC, 0, gz_good).await, (0, 3));
    let got = common::consume(&f.broker.bootstrap(), TOPIC, 0, 0, 5, Duration::from_secs(20)).await;
    let values: Vec<&[u8]> = got.iter().map(|(_, v)| v.as_slice()).collect();
    assert_eq!(values, [b"one".as_slice(), b"two", b"three", b"compressed", b"compressed"]);
    f.finish("inconsistent batches").await;
}
