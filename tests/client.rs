//! Real-client round trips through librdkafka (the `rdkafka` crate).
//!
//! Goal: a Kafka client creates a topic, produces keyed records with headers
//! and explicit timestamps under every compression codec with acks=all, and
//! reads them all back intact and in order, before and after a broker restart.
//! Method: an in-process broker on 127.0.0.1:0 in a temporary directory; one
//! 3-partition topic per codec; every delivery report is recorded and every
//! consumed record is checked against what was sent at that offset.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use strand::{Broker, BrokerConfig, BrokerHandle};

const RECORDS_PER_CODEC: usize = 100_000;
const PARTITIONS: i32 = 3;
const CODECS: &[&str] = &["none", "gzip", "snappy", "lz4", "zstd"];
const BASE_TIMESTAMP_MS: i64 = 1_700_000_000_000;

async fn start(dir: &std::path::Path) -> BrokerHandle {
    let props =
        format!("listeners=PLAINTEXT://127.0.0.1:0\nlog.dirs={}\nauto.create.topics.enable=false\n", dir.display());
    let config = BrokerConfig::from_properties(&props, "test", &[]).expect("config");
    Broker::start(config).await.expect("broker starts")
}

fn key(i: usize) -> String {
    format!("key-{i}")
}

fn value(codec: &str, i: usize) -> String {
    // Repetitive enough to compress, varied enough to catch mix-ups.
    format!("{codec}:{i}:{}", "abcdefgh".repeat(1 + i % 7))
}

/// Delivery reports: record index → (partition, offset), or the error.
#[derive(Default)]
struct Deliveries {
    ok: Mutex<HashMap<usize, (i32, i64)>>,
    failed: Mutex<Vec<String>>,
}

struct RecordingContext(Arc<Deliveries>);

impl ClientContext for RecordingContext {}

impl ProducerContext for RecordingContext {
    type DeliveryOpaque = Box<usize>;
    fn delivery(&self, result: &DeliveryResult<'_>, index: Self::DeliveryOpaque) {
        match result {
            Ok(m) => {
                self.0.ok.lock().unwrap().insert(*index, (m.partition(), m.offset()));
            }
            Err((e, _)) => self.0.failed.lock().unwrap().push(format!("record {index}: {e}")),
        }
    }
}

async fn create_topic(bootstrap: &str, name: &str) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
    let topic = NewTopic::new(name, PARTITIONS, TopicReplication::Fixed(1));
    let results = admin.create_topics(&[topic], &AdminOptions::new()).await.expect("create_topics");
    for r in results {
        r.expect("topic created");
    }
}

fn produce(bootstrap: &str, topic: &str, codec: &str) -> HashMap<usize, (i32, i64)> {
    let deliveries = Arc::new(Deliveries::default());
    let producer: ThreadedProducer<RecordingContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("compression.codec", codec)
        .set("linger.ms", "5")
        .set("enable.idempotence", "false")
        .create_with_context(RecordingContext(deliveries.clone()))
        .expect("producer");
    for i in 0..RECORDS_PER_CODEC {
        let k = key(i);
        let v = value(codec, i);
        let headers = OwnedHeaders::new()
            .insert(Header { key: "index", value: Some(i.to_string().as_bytes()) })
            .insert(Header { key: "codec", value: Some(codec.as_bytes()) });
        let mut record = BaseRecord::with_opaque_to(topic, Box::new(i))
            .key(&k)
            .payload(&v)
            .headers(headers)
            .timestamp(BASE_TIMESTAMP_MS + i as i64);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((
                    rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    r,
                )) => {
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("send failed: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(120)).expect("flush");
    let failed = deliveries.failed.lock().unwrap();
    assert!(failed.is_empty(), "{} deliveries failed, first: {:?}", failed.len(), failed.first());
    let ok = deliveries.ok.lock().unwrap().clone();
    assert_eq!(ok.len(), RECORDS_PER_CODEC, "every record acknowledged");
    ok
}

/// Reads every record of `topic` from the beginning and checks each against what was sent.
fn consume_and_check(bootstrap: &str, topic: &str, codec: &str, delivered: &HashMap<usize, (i32, i64)>) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        // librdkafka needs a group id even for manual assignment; nothing is committed.
        .set("group.id", "client-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    let mut seen = vec![false; RECORDS_PER_CODEC];
    let mut last_offset: HashMap<i32, i64> = HashMap::new();
    let mut last_index: HashMap<i32, usize> = HashMap::new();
    let mut count = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    while count < RECORDS_PER_CODEC {
        assert!(Instant::now() < deadline, "{codec}: only {count} of {RECORDS_PER_CODEC} records consumed");
        let Some(msg) = consumer.poll(Duration::from_millis(500)) else { continue };
        let msg = msg.unwrap_or_else(|e| panic!("{codec}: consumer error {e}"));
        let k = std::str::from_utf8(msg.key().expect("key")).unwrap();
        let i: usize = k.strip_prefix("key-").unwrap().parse().unwrap();
        assert!(!seen[i], "{codec}: record {i} delivered twice");
        seen[i] = true;
        count += 1;
        assert_eq!(msg.payload(), Some(value(codec, i).as_bytes()), "{codec}: value of record {i}");
        assert_eq!(msg.timestamp().to_millis(), Some(BASE_TIMESTAMP_MS + i as i64), "{codec}: timestamp of record {i}");
        let headers = msg.headers().expect("headers");
        assert_eq!(headers.count(), 2);
        assert_eq!(headers.get(0).key, "index");
        assert_eq!(headers.get(0).value, Some(i.to_string().as_bytes()));
        assert_eq!(headers.get(1).value, Some(codec.as_bytes()));
        assert_eq!(delivered[&i], (msg.partition(), msg.offset()), "{codec}: record {i} at the acknowledged offset");
        // Per-partition order: offsets and send order both strictly increase.
        if let Some(prev) = last_offset.insert(msg.partition(), msg.offset()) {
            assert!(msg.offset() > prev, "{codec}: offsets go backwards in partition {}", msg.partition());
        }
        if let Some(prev) = last_index.insert(msg.partition(), i) {
            assert!(i > prev, "{codec}: record {i} after {prev} in partition {}", msg.partition());
        }
    }
}

fn watermarks(bootstrap: &str, topic: &str) -> Vec<(i64, i64)> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("consumer");
    (0..PARTITIONS).map(|p| consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).expect("watermarks")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_codec_round_trips_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let bootstrap = broker.bootstrap_servers();
    let mut produced = Vec::new();
    for codec in CODECS {
        let topic = format!("client-{codec}");
        create_topic(&bootstrap, &topic).await;
        let (b, t, c) = (bootstrap.clone(), topic.clone(), codec.to_string());
        let delivered = tokio::task::spawn_blocking(move || {
            let delivered = produce(&b, &t, &c);
            consume_and_check(&b, &t, &c, &delivered);
            delivered
        })
        .await
        .unwrap();
        let b = bootstrap.clone();
        let t = topic.clone();
        let marks = tokio::task::spawn_blocking(move || watermarks(&b, &t)).await.unwrap();
        assert_eq!(marks.iter().map(|(lo, hi)| hi - lo).sum::<i64>(), RECORDS_PER_CODEC as i64);
        produced.push((topic, codec.to_string(), delivered, marks));
    }
    broker.shutdown().await;

    // Restart on the same directory: every record and every offset is still there.
    let broker = start(dir.path()).await;
    let bootstrap = broker.bootstrap_servers();
    for (topic, codec, delivered, marks) in produced {
        let b = bootstrap.clone();
        tokio::task::spawn_blocking(move || {
            assert_eq!(watermarks(&b, &topic), marks, "{topic}: earliest and latest offsets unchanged by restart");
            consume_and_check(&b, &topic, &codec, &delivered);
        })
        .await
        .unwrap();
    }
    broker.shutdown().await;
}
