//! Idempotent producers across broker crashes.
//!
//! Goal: with `enable.idempotence=true`, librdkafka's retries after a broker
//! kill -9 and restart neither duplicate nor lose records, and each
//! partition keeps the send order (KIP-98).
//! Method: the `strand` binary as a child process (restarted on the same
//! port); a librdkafka producer streams numbered records to 3 partitions
//! while the broker is SIGKILLed twice mid-stream and restarted; every
//! record must be acknowledged, and a consumer must then read each
//! partition's records exactly once, in send order, with no gaps. The
//! broker's duplicate detection must survive the crash (producer state is
//! rebuilt from snapshots and the log tail).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::child::ChildBroker;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};

const RECORDS: usize = 30_000;
const PARTITIONS: i32 = 3;
const TOPIC: &str = "idem";

#[derive(Default)]
struct Acks {
    delivered: AtomicUsize,
    errors: Mutex<Vec<String>>,
}

struct Ctx(Arc<Acks>);
impl ClientContext for Ctx {}
impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.0.delivered.fetch_add(1, Ordering::SeqCst);
            }
            Err((e, _)) => self.0.errors.lock().unwrap().push(e.to_string()),
        }
    }
}

fn wait_delivered(acks: &Acks, at_least: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while acks.delivered.load(Ordering::SeqCst) < at_least {
        assert!(acks.errors.lock().unwrap().is_empty(), "delivery errors: {:?}", acks.errors.lock().unwrap());
        assert!(Instant::now() < deadline, "only {} records acknowledged", acks.delivered.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn idempotent_producer_survives_broker_kills_without_duplicates_or_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(dir.path());
    broker.start();
    let bootstrap = broker.bootstrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(common::create_topic(&bootstrap, TOPIC, PARTITIONS, &[]));

    let acks = Arc::new(Acks::default());
    let producer: Arc<ThreadedProducer<Ctx>> = Arc::new(
        ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "2")
            .set("message.timeout.ms", "120000")
            .set("retry.backoff.ms", "50")
            .set("reconnect.backoff.ms", "50")
            .set("reconnect.backoff.max.ms", "200")
            .create_with_context(Ctx(acks.clone()))
            .unwrap(),
    );
    let sent = Arc::new(AtomicUsize::new(0));
    let sender = {
        let sent = sent.clone();
        let producer = producer.clone();
        std::thread::spawn(move || {
            for i in 0..RECORDS {
                let value = i.to_string();
                let mut record =
                    BaseRecord::to(TOPIC).partition((i % PARTITIONS as usize) as i32).key(&value).payload(&value);
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((_, r)) => {
                            record = r;
                            producer.poll(Duration::from_millis(5));
                        }
                    }
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Two crashes while records are in flight.
    for at in [RECORDS / 4, RECORDS / 2] {
        wait_delivered(&acks, at);
        broker.kill();
        broker.start();
    }
    sender.join().unwrap();
    producer.flush(Duration::from_secs(120)).expect("flush");
    assert!(acks.errors.lock().unwrap().is_empty(), "delivery errors: {:?}", acks.errors.lock().unwrap());
    assert_eq!(acks.delivered.load(Ordering::SeqCst), RECORDS, "every record acknowledged");

    // Each partition holds exactly its records, once, in send order.
    let consumer: BaseConsumer =
        common::consumer_config(&bootstrap).set("enable.partition.eof", "false").create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut next: Vec<usize> = (0..PARTITIONS as usize).collect();
    let mut count = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while count < RECORDS {
        assert!(Instant::now() < deadline, "consumed {count} of {RECORDS}");
        let Some(m) = consumer.poll(Duration::from_millis(200)) else { continue };
        let m = m.expect("consumer error");
        let i: usize = std::str::from_utf8(m.payload().unwrap()).unwrap().parse().unwrap();
        let p = m.partition() as usize;
        assert_eq!(i, next[p], "partition {p}: expected record {} next, got {i} (duplicate or gap)", next[p]);
        next[p] += PARTITIONS as usize;
        count += 1;
    }
    for p in 0..PARTITIONS {
        let (lo, hi) = consumer.fetch_watermarks(TOPIC, p, Duration::from_secs(10)).unwrap();
        assert_eq!(hi - lo, (RECORDS / PARTITIONS as usize) as i64, "partition {p} holds no extra records");
    }
    drop(consumer);
    drop(producer);
    broker.stop();
}

/// Goal: the broker-side rules of KIP-98 on the wire: a retried batch gets its
/// original offset and is not written twice; a sequence gap is
/// OUT_OF_ORDER_SEQUENCE_NUMBER (45); an older epoch is INVALID_PRODUCER_EPOCH
/// (47); neither writes anything. Producer ids from InitProducerId are unique.
/// Method: raw InitProducerId and Produce v9 requests with batches built by
/// the storage crate's helpers; the log end offset is checked after each step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_gaps_and_stale_epochs_on_the_wire() {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{InitProducerIdRequest, ProduceRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use strand_storage::batch::build_producer_batch;

    let broker = common::start_broker(&[]).await;
    common::create_topic(&broker.bootstrap(), "wire", 1, &[]).await;
    let mut conn = common::RawConn::connect(broker.addr()).await;
    let idempotent =
        || InitProducerIdRequest::default().with_transactional_id(None).with_transaction_timeout_ms(60_000);
    let init = conn.call(&idempotent(), 4).await;
    assert_eq!(init.error_code, 0);
    let other = conn.call(&idempotent(), 4).await;
    assert_ne!(init.producer_id, other.producer_id, "producer ids are unique");
    let pid = init.producer_id.0;
    // Producer state expires by the batches' timestamps (producer.id.expiration.ms), so use real ones.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;

    let produce = |batch: Vec<u8>| {
        ProduceRequest::default().with_acks(-1).with_timeout_ms(5000).with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("wire")))
            .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(batch.into()))])])
    };
    let result = |r: &kafka_protocol::messages::ProduceResponse| {
        let p = &r.responses[0].partition_responses[0];
        (p.error_code, p.base_offset)
    };
    let first = build_producer_batch(pid, 0, 0, false, now, &[b"a", b"b"]);
    assert_eq!(result(&conn.call(&produce(first.clone()), 9).await), (0, 0));
    let second = build_producer_batch(pid, 0, 2, false, now + 1, &[b"c"]);
    assert_eq!(result(&conn.call(&produce(second.clone()), 9).await), (0, 2));
    // Retries of both: original offsets, nothing appended.
    assert_eq!(result(&conn.call(&produce(first), 9).await), (0, 0));
    // The retry of an older batch must not pull the high watermark back to
    // its end: record 2 stays visible.
    assert_eq!(common::watermarks(&broker.bootstrap(), "wire", 0).await, (0, 3), "high watermark after a retry");
    let got = common::consume(&broker.bootstrap(), "wire", 0, 2, 1, std::time::Duration::from_secs(20)).await;
    assert_eq!(got, vec![(2, b"c".to_vec())], "the record after the retried batch is readable");
    assert_eq!(result(&conn.call(&produce(second), 9).await), (0, 2));
    assert_eq!(common::watermarks(&broker.bootstrap(), "wire", 0).await, (0, 3));
    // A gap in the sequence.
    let gap = build_producer_batch(pid, 0, 10, false, now + 2, &[b"d"]);
    assert_eq!(result(&conn.call(&produce(gap), 9).await).0, 45);
    // A new epoch starts at sequence 0; then the old epoch is fenced.
    let bumped = build_producer_batch(pid, 1, 0, false, now + 3, &[b"e"]);
    assert_eq!(result(&conn.call(&produce(bumped), 9).await), (0, 3));
    let stale = build_producer_batch(pid, 0, 3, false, now + 4, &[b"f"]);
    assert_eq!(result(&conn.call(&produce(stale), 9).await).0, 47);
    assert_eq!(common::watermarks(&broker.bootstrap(), "wire", 0).await, (0, 4), "refused batches wrote nothing");

    // DescribeProducers shows the producer's current epoch and last sequence.
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    let described = conn
        .call(
            &kafka_protocol::messages::DescribeProducersRequest::default().with_topics(vec![TopicRequest::default()
                .with_name(TopicName(StrBytes::from_static_str("wire")))
                .with_partition_indexes(vec![0])]),
            0,
        )
        .await;
    let p = &described.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    let state: Vec<(i64, i32, i32, i64)> = p
        .active_producers
        .iter()
        .map(|s| (s.producer_id.0, s.producer_epoch, s.last_sequence, s.current_txn_start_offset))
        .collect();
    assert_eq!(state, vec![(pid, 1, 0, -1)]);

    // Duplicate detection survives a clean restart.
    let dir = broker.shutdown().await;
    let broker = common::start_broker_in(dir, &[]).await;
    let mut conn = common::RawConn::connect(broker.addr()).await;
    let retry = build_producer_batch(pid, 1, 0, false, now + 3, &[b"e"]);
    assert_eq!(result(&conn.call(&produce(retry), 9).await), (0, 3));
    assert_eq!(common::watermarks(&broker.bootstrap(), "wire", 0).await, (0, 4));
    broker.shutdown().await;
}
