//! Transactions (issue 4: KIP-98, KIP-360, KIP-447, KIP-890 part 1) judged by
//! librdkafka and by raw requests.
//!
//! Goal: a transaction is all or nothing for read_committed consumers, across
//! aborts, zombie producers, a processor killed mid-transaction, broker kills
//! and transaction timeouts; control records never reach applications; the
//! coordinator's APIs answer bad requests with Kafka's error codes and change
//! nothing; ListTransactions / DescribeTransactions show what is going on.
//!
//! Method: an in-process broker per test (the `strand` binary as a child
//! process where the broker itself is killed) with
//! `transaction.state.log.num.partitions=5`, `offsets.topic.num.partitions=5`,
//! fast group settings and `transaction.abort.timed.out.transaction.cleanup.interval.ms=100`;
//! librdkafka transactional producers (`init_transactions`,
//! `begin_transaction`, `send_offsets_to_transaction`, `commit_transaction`,
//! `abort_transaction`) and consumers with `isolation.level` read_committed or
//! read_uncommitted; the consume-transform-produce processor runs in a child
//! process (this test binary re-executed with `STRAND_TXN_CHILD_BOOTSTRAP`
//! set) so that it can be SIGKILLed mid-transaction. Raw requests use the
//! kafka-protocol crate at versions the broker advertises. Every wait is a
//! deadline-bounded poll of a condition; a consumer reads "everything" only
//! after ListOffsets showed that the last stable offset has reached the high
//! watermark, and then stops at end of partition (librdkafka reports EOF at
//! the last stable offset under read_committed).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::child::ChildBroker;
use common::*;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::describe_producers_request::TopicRequest;
use kafka_protocol::messages::describe_transactions_response::TransactionState as DescribedTxn;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Request, StrBytes};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::runtime::Runtime;

/// Broker overrides for every in-process test (see the module comment).
const TXN_OVERRIDES: &[&str] = &[
    "transaction.state.log.num.partitions=5",
    "offsets.topic.num.partitions=5",
    "group.initial.rebalance.delay.ms=0",
    "group.min.session.timeout.ms=1000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms=100",
];

/// How long a librdkafka transactional call may take.
const TXN_CALL: Duration = Duration::from_secs(60);

// Kafka error codes used below.
const NONE: i16 = 0;
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const NOT_COORDINATOR: i16 = 16;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const INVALID_TXN_STATE: i16 = 48;
const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
const CONCURRENT_TRANSACTIONS: i16 = 51;
const PRODUCER_FENCED: i16 = 90;
const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;

/// Errors a client retries while the coordinator loads or finishes a transaction.
fn retriable(code: i16) -> bool {
    matches!(code, COORDINATOR_LOAD_IN_PROGRESS | COORDINATOR_NOT_AVAILABLE | NOT_COORDINATOR | CONCURRENT_TRANSACTIONS)
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn tname(v: &str) -> TopicName {
    TopicName(s(v))
}

fn txn_id(v: &str) -> TransactionalId {
    TransactionalId(s(v))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// A multi-threaded runtime (it keeps serving the in-process broker while the
/// test thread blocks in librdkafka calls) and a broker with `overrides`.
fn start(overrides: &[&str]) -> (Runtime, TestBroker) {
    let rt = Runtime::new().expect("runtime");
    let broker = rt.block_on(start_broker(overrides));
    (rt, broker)
}

// ---------------------------------------------------------------------------
// librdkafka transactional producers
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Deliveries {
    ok: AtomicUsize,
    failed: Mutex<Vec<String>>,
}

struct TxnCtx(Arc<Deliveries>);
impl ClientContext for TxnCtx {}
impl ProducerContext for TxnCtx {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.0.ok.fetch_add(1, Ordering::SeqCst);
            }
            Err((e, m)) => self.0.failed.lock().unwrap().push(format!("{}[{}]: {e}", m.topic(), m.partition())),
        }
    }
}

type TxnProducer = BaseProducer<TxnCtx>;

/// Config of a transactional producer: fast reconnects (the broker may be
/// restarted under it), librdkafka's default transaction.timeout.ms (60 s).
fn txn_config(bootstrap: &str, transactional_id: &str) -> ClientConfig {
    let mut c = base_config(bootstrap);
    c.set("transactional.id", transactional_id)
        .set("linger.ms", "5")
        .set("retry.backoff.ms", "50")
        .set("reconnect.backoff.ms", "50")
        .set("reconnect.backoff.max.ms", "200");
    c
}

fn txn_producer(config: ClientConfig) -> (TxnProducer, Arc<Deliveries>) {
    let d = Arc::new(Deliveries::default());
    let p = config.create_with_context(TxnCtx(d.clone())).expect("transactional producer");
    (p, d)
}

/// A record to produce or as read back: partition, key, value.
type Rec = (i32, String, String);

/// Sends `recs` (explicit partitions) and flushes; every one must be acknowledged.
fn send_acked(p: &TxnProducer, d: &Deliveries, topic: &str, recs: &[Rec]) {
    let before = d.ok.load(Ordering::SeqCst);
    for (partition, k, v) in recs {
        let mut record = BaseRecord::to(topic).partition(*partition).key(k.as_str()).payload(v.as_str());
        loop {
            match p.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    p.poll(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("send to {topic}[{partition}]: {e}"),
            }
        }
    }
    p.flush(Duration::from_secs(60)).expect("flush");
    let failed = d.failed.lock().unwrap();
    assert!(failed.is_empty(), "delivery failures: {failed:?}");
    assert_eq!(d.ok.load(Ordering::SeqCst) - before, recs.len(), "every record acknowledged");
}

/// `count` records named `{prefix}-{i}` over `partitions` partitions (i % partitions).
fn records(prefix: &str, count: usize, partitions: i32) -> Vec<Rec> {
    (0..count)
        .map(|i| ((i % partitions as usize) as i32, format!("{prefix}-{i:04}"), format!("{prefix}-value-{i}")))
        .collect()
}

/// `recs` grouped by partition, in send order.
fn by_partition(recs: &[Rec]) -> BTreeMap<i32, Vec<(String, String)>> {
    let mut out: BTreeMap<i32, Vec<(String, String)>> = BTreeMap::new();
    for (p, k, v) in recs {
        out.entry(*p).or_default().push((k.clone(), v.clone()));
    }
    out
}

/// Describes a failed transactional call; panics if it did not fail.
fn expect_txn_failure(what: &str, r: rdkafka::error::KafkaResult<()>) -> (RDKafkaErrorCode, bool, bool) {
    match r {
        Ok(()) => panic!("{what}: expected a failure, the call succeeded"),
        Err(KafkaError::Transaction(e)) => {
            println!(
                "{what}: {} ({:?}) fatal={} abortable={}",
                e.string(),
                e.code(),
                e.is_fatal(),
                e.txn_requires_abort()
            );
            (e.code(), e.is_fatal(), e.txn_requires_abort())
        }
        Err(e) => panic!("{what}: expected a transaction error, got {e}"),
    }
}

// ---------------------------------------------------------------------------
// Consumers
// ---------------------------------------------------------------------------

/// A record as a consumer delivered it.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    offset: i64,
    key: String,
    value: String,
}

/// Reads every partition of `topic` from the beginning until end of partition
/// (the last stable offset under read_committed) on all of them. The caller
/// must first make sure the end no longer moves (see `wait_stable`). Any
/// consumer error fails the test.
fn consume_all(bootstrap: &str, topic: &str, partitions: i32, read_committed: bool) -> BTreeMap<i32, Vec<Got>> {
    let consumer: BaseConsumer = consumer_config(bootstrap)
        .set("isolation.level", if read_committed { "read_committed" } else { "read_uncommitted" })
        .set("enable.partition.eof", "true")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).expect("assign");
    let mut out: BTreeMap<i32, Vec<Got>> = (0..partitions).map(|p| (p, Vec::new())).collect();
    let mut eof = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while eof.len() < partitions as usize {
        assert!(
            Instant::now() < deadline,
            "{topic}: end of partition on {eof:?} only after 120 s (read_committed={read_committed}); got {:?}",
            out.iter().map(|(p, v)| (p, v.len())).collect::<Vec<_>>()
        );
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(m)) => {
                let text = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
                assert!(!eof.contains(&m.partition()), "{topic}[{}]: a record after end of partition", m.partition());
                out.get_mut(&m.partition()).expect("assigned partition").push(Got {
                    offset: m.offset(),
                    key: text(m.key()),
                    value: text(m.payload()),
                });
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            Some(Err(e)) => panic!("{topic}: consumer error (read_committed={read_committed}): {e}"),
        }
    }
    out
}

/// (key, value) pairs of what a consumer read, per partition.
fn kv(got: &BTreeMap<i32, Vec<Got>>) -> BTreeMap<i32, Vec<(String, String)>> {
    got.iter().map(|(p, v)| (*p, v.iter().map(|g| (g.key.clone(), g.value.clone())).collect())).collect()
}

fn total(got: &BTreeMap<i32, Vec<Got>>) -> usize {
    got.values().map(Vec::len).sum()
}

// ---------------------------------------------------------------------------
// Raw requests
// ---------------------------------------------------------------------------

/// A raw connection that knows the versions the broker advertises.
struct RawTxn {
    conn: RawConn,
    versions: HashMap<i16, (i16, i16)>,
}

impl RawTxn {
    async fn connect(addr: SocketAddr) -> RawTxn {
        let mut conn = RawConn::connect(addr).await;
        let req = ApiVersionsRequest::default()
            .with_client_software_name(s("strand-txn-test"))
            .with_client_software_version(s("1"));
        let resp = conn.call(&req, 3).await;
        assert_eq!(resp.error_code, NONE, "ApiVersions");
        let versions = resp.api_keys.iter().map(|k| (k.api_key, (k.min_version, k.max_version))).collect();
        RawTxn { conn, versions }
    }

    /// The highest version both sides support, capped at `cap`; at least `floor`.
    fn version<R: Request>(&self, floor: i16, cap: i16) -> i16 {
        let key = ApiKey::try_from(R::KEY).expect("known key");
        let (_, max) = *self.versions.get(&R::KEY).unwrap_or_else(|| panic!("the broker does not advertise {key:?}"));
        let v = max.min(cap).min(R::VERSIONS.max);
        assert!(v >= floor, "{key:?}: the broker advertises up to v{max}, the test needs v{floor}+");
        v
    }

    fn advertises<R: Request>(&self, version: i16) -> bool {
        self.versions.get(&R::KEY).is_some_and(|(lo, hi)| *lo <= version && version <= *hi)
    }

    /// FindCoordinator(TRANSACTION): (node id, host, port), retried (bounded)
    /// while the transaction log is being created or loaded.
    async fn txn_coordinator(&mut self, id: &str) -> (i32, String, i32) {
        let v = self.version::<FindCoordinatorRequest>(1, 6);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut req = FindCoordinatorRequest::default().with_key_type(1);
            let (err, node, host, port) = if v >= 4 {
                req = req.with_coordinator_keys(vec![s(id)]);
                let resp = self.conn.call(&req, v).await;
                assert_eq!(resp.coordinators.len(), 1, "one coordinator per key");
                let c = &resp.coordinators[0];
                assert_eq!(c.key.as_str(), id);
                (c.error_code, c.node_id.0, c.host.to_string(), c.port)
            } else {
                req = req.with_key(s(id));
                let resp = self.conn.call(&req, v).await;
                (resp.error_code, resp.node_id.0, resp.host.to_string(), resp.port)
            };
            if err == NONE {
                return (node, host, port);
            }
            assert!(retriable(err), "FindCoordinator(TRANSACTION, {id}): error {err}");
            assert!(Instant::now() < deadline, "FindCoordinator(TRANSACTION, {id}): still {err} after 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// InitProducerId, retried (bounded) while retriable; returns (error, pid, epoch).
    async fn init_producer_id(&mut self, id: Option<&str>, timeout_ms: i32) -> (i16, i64, i16) {
        let v = self.version::<InitProducerIdRequest>(0, 4);
        let req = InitProducerIdRequest::default()
            .with_transactional_id(id.map(txn_id))
            .with_transaction_timeout_ms(timeout_ms);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let resp = self.conn.call(&req, v).await;
            if !retriable(resp.error_code) || Instant::now() >= deadline {
                return (resp.error_code, resp.producer_id.0, resp.producer_epoch);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// AddPartitionsToTxn (client form, v0-3) at `version`: partition → error.
    async fn add_partitions_at(
        &mut self,
        version: i16,
        id: &str,
        pid: i64,
        epoch: i16,
        topic: &str,
        partitions: &[i32],
    ) -> BTreeMap<i32, i16> {
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(txn_id(id))
            .with_v3_and_below_producer_id(ProducerId(pid))
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(tname(topic))
                .with_partitions(partitions.to_vec())]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let resp = self.conn.call(&req, version).await;
            let mut out = BTreeMap::new();
            for t in &resp.results_by_topic_v3_and_below {
                assert_eq!(t.name.0.as_str(), topic);
                for p in &t.results_by_partition {
                    out.insert(p.partition_index, p.partition_error_code);
                }
            }
            assert_eq!(out.len(), partitions.len(), "AddPartitionsToTxn: one result per partition: {out:?}");
            if out.values().any(|e| retriable(*e)) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            return out;
        }
    }

    async fn add_partitions(
        &mut self,
        id: &str,
        pid: i64,
        epoch: i16,
        topic: &str,
        partitions: &[i32],
    ) -> BTreeMap<i32, i16> {
        let v = self.version::<AddPartitionsToTxnRequest>(0, 3);
        self.add_partitions_at(v, id, pid, epoch, topic, partitions).await
    }

    /// EndTxn (v0-4), retried (bounded) while retriable; returns the error code.
    async fn end_txn(&mut self, id: &str, pid: i64, epoch: i16, commit: bool) -> i16 {
        let v = self.version::<EndTxnRequest>(0, 4);
        let req = EndTxnRequest::default()
            .with_transactional_id(txn_id(id))
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch)
            .with_committed(commit);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let err = self.conn.call(&req, v).await.error_code;
            if !retriable(err) || Instant::now() >= deadline {
                return err;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Produce v9 (acks=all) of one batch: (error, base offset).
    async fn produce(&mut self, id: Option<&str>, topic: &str, partition: i32, batch: Vec<u8>) -> (i16, i64) {
        let v = self.version::<ProduceRequest>(3, 9);
        let req = ProduceRequest::default()
            .with_transactional_id(id.map(txn_id))
            .with_acks(-1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![TopicProduceData::default().with_name(tname(topic)).with_partition_data(vec![
                PartitionProduceData::default().with_index(partition).with_records(Some(batch.into())),
            ])]);
        let resp = self.conn.call(&req, v).await;
        let p = &resp.responses[0].partition_responses[0];
        (p.error_code, p.base_offset)
    }

    /// DescribeTransactions v0 for one id.
    async fn describe(&mut self, id: &str) -> DescribedTxn {
        let req = DescribeTransactionsRequest::default().with_transactional_ids(vec![txn_id(id)]);
        let mut resp = self.conn.call(&req, 0).await;
        assert_eq!(resp.transaction_states.len(), 1, "DescribeTransactions: one result");
        let t = resp.transaction_states.remove(0);
        assert_eq!(t.transactional_id.0.as_str(), id);
        t
    }

    /// DescribeTransactions until `pred` holds (bounded).
    async fn describe_until(&mut self, id: &str, what: &str, pred: impl Fn(&DescribedTxn) -> bool) -> DescribedTxn {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let t = self.describe(id).await;
            if pred(&t) {
                return t;
            }
            assert!(Instant::now() < deadline, "{what}: after 30 s DescribeTransactions({id}) = {t:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// ListTransactions with state filters: (error, unknown filters, id → (pid, state)).
    async fn list(&mut self, states: &[&str]) -> (i16, Vec<String>, BTreeMap<String, (i64, String)>) {
        let v = self.version::<ListTransactionsRequest>(0, 1);
        let req = ListTransactionsRequest::default().with_state_filters(states.iter().map(|x| s(x)).collect());
        let resp = self.conn.call(&req, v).await;
        let unknown = resp.unknown_state_filters.iter().map(|x| x.to_string()).collect();
        let txns = resp
            .transaction_states
            .iter()
            .map(|t| (t.transactional_id.0.to_string(), (t.producer_id.0, t.transaction_state.to_string())))
            .collect();
        (resp.error_code, unknown, txns)
    }

    /// DescribeProducers v0 of one partition: pid → current transaction start offset.
    async fn producers(&mut self, topic: &str, partition: i32) -> BTreeMap<i64, i64> {
        let req = DescribeProducersRequest::default()
            .with_topics(vec![TopicRequest::default().with_name(tname(topic)).with_partition_indexes(vec![partition])]);
        let resp = self.conn.call(&req, 0).await;
        let p = &resp.topics[0].partitions[0];
        assert_eq!(p.error_code, NONE, "DescribeProducers {topic}[{partition}]");
        p.active_producers.iter().map(|s| (s.producer_id.0, s.current_txn_start_offset)).collect()
    }

    /// ListOffsets latest of every partition under `isolation` (0 uncommitted, 1 committed).
    async fn latest(&mut self, topic: &str, partitions: i32, isolation: i8) -> BTreeMap<i32, i64> {
        let v = self.version::<ListOffsetsRequest>(2, 7);
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(isolation)
            .with_topics(vec![ListOffsetsTopic::default().with_name(tname(topic)).with_partitions(
                (0..partitions)
                    .map(|p| ListOffsetsPartition::default().with_partition_index(p).with_timestamp(-1))
                    .collect(),
            )]);
        let resp = self.conn.call(&req, v).await;
        let mut out = BTreeMap::new();
        for t in &resp.topics {
            for p in &t.partitions {
                assert_eq!(p.error_code, NONE, "ListOffsets {topic}[{}] isolation {isolation}", p.partition_index);
                out.insert(p.partition_index, p.offset);
            }
        }
        assert_eq!(out.len(), partitions as usize);
        out
    }

    /// (last stable offsets, high watermarks).
    async fn lso_hw(&mut self, topic: &str, partitions: i32) -> (BTreeMap<i32, i64>, BTreeMap<i32, i64>) {
        let lso = self.latest(topic, partitions, 1).await;
        let hw = self.latest(topic, partitions, 0).await;
        (lso, hw)
    }

    /// Committed offsets of `group` (OffsetFetch v1-7), retried while the coordinator loads.
    async fn committed(&mut self, group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
        let v = self.version::<OffsetFetchRequest>(1, 7);
        let req = OffsetFetchRequest::default().with_group_id(GroupId(s(group))).with_topics(Some(vec![
            OffsetFetchRequestTopic::default()
                .with_name(tname(topic))
                .with_partition_indexes((0..partitions).collect()),
        ]));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let resp = self.conn.call(&req, v).await;
            let mut out = BTreeMap::new();
            let mut errors = vec![resp.error_code];
            for t in &resp.topics {
                for p in &t.partitions {
                    errors.push(p.error_code);
                    out.insert(p.partition_index, p.committed_offset);
                }
            }
            if errors.iter().any(|e| retriable(*e)) {
                assert!(Instant::now() < deadline, "OffsetFetch {group}: coordinator still loading after 30 s");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            assert!(errors.iter().all(|e| *e == NONE), "OffsetFetch {group}: errors {errors:?}");
            return out;
        }
    }
}

/// Waits (bounded) until the last stable offset of every partition of `topic`
/// equals its high watermark; returns the high watermarks.
async fn wait_stable(addr: SocketAddr, topic: &str, partitions: i32, timeout: Duration) -> BTreeMap<i32, i64> {
    let mut raw = RawTxn::connect(addr).await;
    let deadline = Instant::now() + timeout;
    loop {
        let (lso, hw) = raw.lso_hw(topic, partitions).await;
        if lso == hw {
            return hw;
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: the last stable offset did not reach the high watermark within {timeout:?}: lso {lso:?}, hw {hw:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// High watermark of each partition as a read_committed librdkafka consumer
/// sees it (its watermark query is a ListOffsets under read_committed).
fn committed_watermarks(bootstrap: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer =
        consumer_config(bootstrap).set("isolation.level", "read_committed").create().expect("consumer");
    (0..partitions)
        .map(|p| (p, consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).expect("fetch_watermarks").1))
        .collect()
}

// ---------------------------------------------------------------------------
// Test 1: commit, abort, commit
// ---------------------------------------------------------------------------

/// Goal: on one transactional producer, a committed, an aborted and another
/// committed transaction: a read_committed consumer sees exactly the
/// committed records (keys, values, per-partition order), a read_uncommitted
/// consumer sees all of them, and no control record reaches the application:
/// offsets have gaps exactly where the COMMIT/ABORT markers sit.
/// Method: 3 transactions of 20 records over 2 partitions (acknowledged before
/// the commit or abort, so the aborted records really are in the log); while
/// the second is open, ListOffsets under read_committed (raw and through a
/// read_committed librdkafka consumer) returns its first offset; afterwards
/// each partition holds 10 + marker + 10 + marker + 10 + marker = 33 offsets.
#[test]
fn commit_abort_commit_read_committed_sees_only_committed() {
    const TOPIC: &str = "txn-cac";
    let (rt, broker) = start(TXN_OVERRIDES);
    let bootstrap = broker.bootstrap();
    rt.block_on(create_topic(&bootstrap, TOPIC, 2, &[]));
    let (producer, d) = txn_producer(txn_config(&bootstrap, "cac-producer"));
    producer.init_transactions(TXN_CALL).expect("init_transactions");

    let rounds = [("a", true), ("b", false), ("c", true)];
    let mut sent = BTreeMap::new();
    for (name, commit) in rounds {
        producer.begin_transaction().expect("begin_transaction");
        let recs = records(name, 20, 2);
        send_acked(&producer, &d, TOPIC, &recs);
        if name == "b" {
            // Open transaction: the LSO is its first offset (after a's 10 records and marker).
            let (lso, hw) = rt.block_on(async { RawTxn::connect(broker.addr()).await.lso_hw(TOPIC, 2).await });
            assert_eq!(lso, BTreeMap::from([(0, 11), (1, 11)]), "LSO while b is open (hw {hw:?})");
            assert_eq!(hw, BTreeMap::from([(0, 21), (1, 21)]), "high watermark while b is open");
            assert_eq!(committed_watermarks(&bootstrap, TOPIC, 2), lso, "read_committed consumer watermarks");
        }
        if commit {
            producer.commit_transaction(TXN_CALL).expect("commit_transaction");
        } else {
            producer.abort_transaction(TXN_CALL).expect("abort_transaction");
        }
        sent.insert(name, by_partition(&recs));
    }

    let hw = rt.block_on(wait_stable(broker.addr(), TOPIC, 2, Duration::from_secs(30)));
    assert_eq!(hw, BTreeMap::from([(0, 33), (1, 33)]), "30 records and 3 markers per partition");
    assert_eq!(committed_watermarks(&bootstrap, TOPIC, 2), hw, "read_committed watermarks once all is decided");

    // Expected (offset, key, value) per partition: each round's 10 records then its marker.
    let expect = |names: &[&str]| -> BTreeMap<i32, Vec<Got>> {
        (0..2)
            .map(|p| {
                let mut v = Vec::new();
                for (round, (name, _)) in rounds.iter().enumerate() {
                    if !names.contains(name) {
                        continue;
                    }
                    for (i, (k, val)) in sent[name][&p].iter().enumerate() {
                        v.push(Got { offset: (round * 11 + i) as i64, key: k.clone(), value: val.clone() });
                    }
                }
                (p, v)
            })
            .collect()
    };
    let rc = consume_all(&bootstrap, TOPIC, 2, true);
    assert_eq!(rc, expect(&["a", "c"]), "read_committed sees exactly a and c, in order, at their offsets");
    let ru = consume_all(&bootstrap, TOPIC, 2, false);
    assert_eq!(ru, expect(&["a", "b", "c"]), "read_uncommitted sees a, b and c, in order, at their offsets");
    assert_eq!(total(&ru), 60, "no control record reaches the application (66 offsets, 60 records)");
    for (p, got) in &ru {
        let offsets: BTreeSet<i64> = got.iter().map(|g| g.offset).collect();
        let gaps: Vec<i64> = (0..hw[p]).filter(|o| !offsets.contains(o)).collect();
        assert_eq!(gaps, vec![10, 21, 32], "partition {p}: the gaps are the three markers");
    }
    assert!(d.failed.lock().unwrap().is_empty());
    drop(producer);
    rt.block_on(broker.shutdown());
}

// ---------------------------------------------------------------------------
// Test 2: zombie fencing
// ---------------------------------------------------------------------------

/// Goal: a second producer with the same transactional.id fences the first
/// (KIP-98 zombie fencing): the first one's open transaction is aborted, its
/// later writes and its commit fail with a fatal (fenced) error and write
/// nothing, while the new producer's transaction commits normally.
/// Method: A begins, sends 20 acknowledged records over 2 partitions; B calls
/// init_transactions with the same id; the LSO must then reach the high
/// watermark (A's transaction aborted, ABORT markers written) while B has no
/// transaction yet; A sends one more record and commits: fails, fatally; B
/// commits 20 records; a read_committed consumer sees exactly B's records; the
/// log holds A's 20, 2 ABORT markers, B's 20, 2 COMMIT markers and nothing else.
#[test]
fn second_producer_with_same_id_fences_the_first() {
    const TOPIC: &str = "txn-fence";
    const ID: &str = "fence-id";
    let (rt, broker) = start(TXN_OVERRIDES);
    let bootstrap = broker.bootstrap();
    rt.block_on(create_topic(&bootstrap, TOPIC, 2, &[]));

    let (a, da) = txn_producer(txn_config(&bootstrap, ID));
    a.init_transactions(TXN_CALL).expect("A init_transactions");
    a.begin_transaction().expect("A begin_transaction");
    let a_recs = records("a", 20, 2);
    send_acked(&a, &da, TOPIC, &a_recs);
    let (lso, _) = rt.block_on(async { RawTxn::connect(broker.addr()).await.lso_hw(TOPIC, 2).await });
    assert_eq!(lso, BTreeMap::from([(0, 0), (1, 0)]), "A's transaction is open");

    let (b, db) = txn_producer(txn_config(&bootstrap, ID));
    b.init_transactions(TXN_CALL).expect("B init_transactions");
    let hw = rt.block_on(wait_stable(broker.addr(), TOPIC, 2, Duration::from_secs(30)));
    assert_eq!(hw, BTreeMap::from([(0, 11), (1, 11)]), "A's 10 records and an ABORT marker per partition");

    // The zombie: a late write and a commit.
    let late = BaseRecord::to(TOPIC).partition(0).key("a-late").payload("a-late");
    let sent_late = a.send(late).map_err(|(e, _)| e);
    println!("A's late send: {sent_late:?}");
    let (code, fatal, _) =
        expect_txn_failure("A commit_transaction after being fenced", a.commit_transaction(TXN_CALL));
    let fatal_error = a.client().fatal_error();
    println!("A fatal error: {fatal_error:?}");
    assert!(
        fatal || fatal_error.is_some(),
        "a fenced producer's commit is a fatal error (got {code:?}, fatal_error {fatal_error:?})"
    );
    drop(a);

    b.begin_transaction().expect("B begin_transaction");
    let b_recs = records("b", 20, 2);
    send_acked(&b, &db, TOPIC, &b_recs);
    b.commit_transaction(TXN_CALL).expect("B commit_transaction");

    let hw = rt.block_on(wait_stable(broker.addr(), TOPIC, 2, Duration::from_secs(30)));
    assert_eq!(hw, BTreeMap::from([(0, 22), (1, 22)]), "A's late record was never written");
    let rc = consume_all(&bootstrap, TOPIC, 2, true);
    assert_eq!(kv(&rc), by_partition(&b_recs), "read_committed sees exactly B's records, in order");
    let ru = consume_all(&bootstrap, TOPIC, 2, false);
    let mut all = a_recs.clone();
    all.extend(b_recs.iter().cloned());
    assert_eq!(kv(&ru), by_partition(&all), "the log holds A's aborted records then B's");
    drop(b);
    rt.block_on(broker.shutdown());
}

// ---------------------------------------------------------------------------
// Test 3: consume-transform-produce, processor killed mid-transaction
// ---------------------------------------------------------------------------

const CHILD_ENV: &str = "STRAND_TXN_CHILD_BOOTSTRAP";
const CTP_IN: &str = "ctp-in";
const CTP_OUT: &str = "ctp-out";
const CTP_GROUP: &str = "ctp-group";
const CTP_TXN_ID: &str = "ctp-processor";
const CTP_BATCH: usize = 50;

fn ctp_key(i: usize) -> String {
    format!("k{i:05}")
}

fn ctp_value(i: usize) -> String {
    format!("v{i}-{}", "x".repeat(i % 7))
}

fn ctp_transform(value: &str) -> String {
    format!("out:{value}")
}

/// The processor's transaction bookkeeping, shared with its rebalance callback.
#[derive(Default)]
struct ProcState {
    open: bool,
    in_txn: usize,
    next: BTreeMap<i32, i64>,
    committed_txns: usize,
    committed_records: usize,
}

struct ProcCtx {
    producer: Arc<BaseProducer>,
    state: Arc<Mutex<ProcState>>,
}
impl ClientContext for ProcCtx {}
impl ConsumerContext for ProcCtx {
    fn pre_rebalance(&self, _c: &BaseConsumer<Self>, r: &Rebalance<'_>) {
        if let Rebalance::Revoke(_) = r {
            // Records of a revoked partition are re-read by its next owner from
            // the committed offset: an open transaction must not commit them.
            let mut st = self.state.lock().unwrap();
            if st.open {
                self.producer.abort_transaction(TXN_CALL).expect("abort on revoke");
                st.open = false;
                st.in_txn = 0;
                println!("TXNCHILD REVOKE-ABORT");
            }
            st.next.clear();
        }
    }
}

/// Sends the consumed offsets to the transaction and commits it.
fn proc_commit(producer: &BaseProducer, consumer: &BaseConsumer<ProcCtx>, st: &mut ProcState) {
    let mut tpl = TopicPartitionList::new();
    for (p, o) in &st.next {
        tpl.add_partition_offset(CTP_IN, *p, Offset::Offset(*o)).unwrap();
    }
    let gm = consumer.group_metadata().expect("consumer group metadata");
    producer.send_offsets_to_transaction(&tpl, &gm, TXN_CALL).expect("send_offsets_to_transaction");
    producer.commit_transaction(TXN_CALL).expect("commit_transaction");
    st.open = false;
    st.committed_txns += 1;
    st.committed_records += st.in_txn;
    st.in_txn = 0;
    println!("TXNCHILD COMMITTED {} {}", st.committed_txns, st.committed_records);
}

/// Not a test on its own: the consume-transform-produce processor that test 3
/// runs in a child process (this binary re-executed with
/// `STRAND_TXN_CHILD_BOOTSTRAP` set). It consumes `ctp-in` in group
/// `ctp-group` with read_committed, writes `out:<value>` with the same key to
/// the same partition of `ctp-out` in transactions of 50 records (or fewer
/// when a poll comes back empty) with its offsets
/// (`send_offsets_to_transaction`). With `STRAND_TXN_CHILD_PARK=n`, after n
/// committed transactions it sends 25 records of the next one, flushes them
/// and parks (polls only, never commits), printing `TXNCHILD PARKED 25`.
/// Prints `TXNCHILD COMMITTED <transactions> <records>` after each commit.
/// It exits when its stdin closes, so it never outlives a parent that died.
#[test]
fn txn_child_processor() {
    let Ok(bootstrap) = std::env::var(CHILD_ENV) else { return };
    // The parent holds our stdin open; when it goes away (even killed), so do we.
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        std::process::exit(3);
    });
    let park: Option<usize> = std::env::var("STRAND_TXN_CHILD_PARK").ok().and_then(|v| v.parse().ok());
    let producer: Arc<BaseProducer> =
        Arc::new(txn_config(&bootstrap, CTP_TXN_ID).create().expect("processor producer"));
    producer.init_transactions(TXN_CALL).expect("processor init_transactions");
    println!("TXNCHILD READY");
    let state = Arc::new(Mutex::new(ProcState::default()));
    let consumer: BaseConsumer<ProcCtx> = base_config(&bootstrap)
        .set("group.id", CTP_GROUP)
        .set("client.id", "ctp-processor")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("max.partition.fetch.bytes", "1024")
        .create_with_context(ProcCtx { producer: producer.clone(), state: state.clone() })
        .expect("processor consumer");
    consumer.subscribe(&[CTP_IN]).expect("subscribe");
    loop {
        let msg = consumer.poll(Duration::from_millis(100));
        let mut st = state.lock().unwrap();
        match msg {
            Some(Ok(m)) => {
                if !st.open {
                    producer.begin_transaction().expect("begin_transaction");
                    st.open = true;
                }
                let key = m.key().unwrap_or_default().to_vec();
                let value = ctp_transform(&String::from_utf8_lossy(m.payload().unwrap_or_default()));
                let mut record = BaseRecord::to(CTP_OUT).partition(m.partition()).key(&key).payload(&value);
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                            record = r;
                            producer.poll(Duration::from_millis(10));
                        }
                        Err((e, _)) => panic!("processor send: {e}"),
                    }
                }
                st.next.insert(m.partition(), m.offset() + 1);
                st.in_txn += 1;
                if park.is_some_and(|n| st.committed_txns >= n) && st.in_txn >= CTP_BATCH / 2 {
                    producer.flush(TXN_CALL).expect("flush before parking");
                    println!("TXNCHILD PARKED {}", st.in_txn);
                    drop(st);
                    loop {
                        let _ = consumer.poll(Duration::from_millis(100));
                    }
                }
                if st.in_txn >= CTP_BATCH {
                    proc_commit(&producer, &consumer, &mut st);
                }
            }
            None => {
                if st.open {
                    proc_commit(&producer, &consumer, &mut st);
                }
            }
            Some(Err(e)) => eprintln!("processor consumer error: {e}"),
        }
    }
}

/// What the parent learned from a processor's stdout.
#[derive(Default, Debug)]
struct ProcView {
    ready: bool,
    committed_txns: usize,
    committed_records: usize,
    parked: Option<usize>,
    revoke_aborts: usize,
}

fn spawn_processor(bootstrap: &str, park: Option<usize>) -> (Child, Arc<Mutex<ProcView>>) {
    let exe = std::env::current_exe().expect("test binary path");
    let mut cmd = Command::new(exe);
    cmd.args(["txn_child_processor", "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, bootstrap)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(n) = park {
        cmd.env("STRAND_TXN_CHILD_PARK", n.to_string());
    }
    let mut child = cmd.spawn().expect("spawn the processor");
    let view = Arc::new(Mutex::new(ProcView::default()));
    let (v, out) = (view.clone(), child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            // The harness may print "test txn_child_processor ... " before our first line.
            let Some(at) = line.find("TXNCHILD ") else { continue };
            let rest = &line[at + "TXNCHILD ".len()..];
            let words: Vec<&str> = rest.split(' ').collect();
            let mut v = v.lock().unwrap();
            match words.as_slice() {
                ["READY"] => v.ready = true,
                ["COMMITTED", t, r] => {
                    v.committed_txns = t.parse().unwrap();
                    v.committed_records = r.parse().unwrap();
                }
                ["PARKED", n] => v.parked = Some(n.parse().unwrap()),
                ["REVOKE-ABORT"] => v.revoke_aborts += 1,
                _ => {}
            }
        }
    });
    (child, view)
}

/// Waits (bounded) for `pred` on a processor's view; fails early if it exits.
fn wait_view(child: &mut Child, view: &Mutex<ProcView>, what: &str, pred: impl Fn(&ProcView) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if pred(&view.lock().unwrap()) {
            return;
        }
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the processor exited ({status}) before {what}; view {:?}", view.lock().unwrap());
        }
        assert!(Instant::now() < deadline, "{what}: not within 120 s; view {:?}", view.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Goal: consume-transform-produce is exactly once across a processor crash
/// (KIP-98 + KIP-447): the read_committed output holds the transform of
/// every input record exactly once, in input order per partition, and the
/// group's committed offsets end at the input's log end; offsets sent to a
/// transaction become visible to the group only when it commits.
/// Method: 2,000 keyed records over 3 input partitions; a processor (child
/// process, see `txn_child_processor`) commits 6 transactions, then sends 25
/// records of a 7th and parks with it open; the parent checks that the
/// output's LSO is held back by it and that the group's committed offsets sum
/// to exactly the records of the committed transactions, then SIGKILLs it. A
/// new processor with the same transactional.id and group (its
/// init_transactions aborts the zombie's transaction) finishes the input;
/// once the group's committed offsets equal the input's log end it is killed
/// too and the output is read under both isolation levels.
#[test]
fn consume_transform_produce_exactly_once_across_processor_kill() {
    const RECORDS: usize = 2000;
    let (rt, broker) = start(TXN_OVERRIDES);
    let bootstrap = broker.bootstrap();
    rt.block_on(create_topic(&bootstrap, CTP_IN, 3, &[]));
    rt.block_on(create_topic(&bootstrap, CTP_OUT, 3, &[]));

    // The input, produced plainly; keys spread by librdkafka's partitioner.
    let input: Vec<Rec> = {
        // Small batches, so that the processor's fetches (and transactions) mix partitions.
        let producer: BaseProducer =
            producer_config(&bootstrap).set("batch.num.messages", "20").create().expect("input producer");
        for i in 0..RECORDS {
            let (k, v) = (ctp_key(i), ctp_value(i));
            let mut record = BaseRecord::to(CTP_IN).key(&k).payload(&v);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        record = r;
                        producer.poll(Duration::from_millis(10));
                    }
                    Err((e, _)) => panic!("input send {i}: {e}"),
                }
            }
        }
        producer.flush(Duration::from_secs(60)).expect("input flush");
        let got = consume_all(&bootstrap, CTP_IN, 3, false);
        got.iter().flat_map(|(p, v)| v.iter().map(move |g| (*p, g.key.clone(), g.value.clone()))).collect()
    };
    assert_eq!(input.len(), RECORDS, "the whole input was written");
    let in_ends = rt.block_on(async { RawTxn::connect(broker.addr()).await.latest(CTP_IN, 3, 0).await });
    println!("input per partition: {in_ends:?}");

    // The first processor: 6 transactions, then one left open.
    let (mut first, view) = spawn_processor(&bootstrap, Some(6));
    wait_view(&mut first, &view, "the first processor to park mid-transaction", |v| v.parked.is_some());
    let committed_records = view.lock().unwrap().committed_records;
    let (lso, hw, committed) = rt.block_on(async {
        let mut raw = RawTxn::connect(broker.addr()).await;
        let (lso, hw) = raw.lso_hw(CTP_OUT, 3).await;
        (lso, hw, raw.committed(CTP_GROUP, CTP_IN, 3).await)
    });
    println!("parked: {:?}; output lso {lso:?} hw {hw:?}; group committed {committed:?}", view.lock().unwrap());
    assert_ne!(lso, hw, "the parked processor's transaction holds the output's LSO back");
    assert_eq!(
        committed.values().filter(|o| **o > 0).sum::<i64>(),
        committed_records as i64,
        "the group's offsets are those of the committed transactions only (not of the open one)"
    );
    first.kill().expect("SIGKILL the first processor");
    first.wait().expect("reap the first processor");

    // The second processor takes over with the same transactional.id and group.
    let (mut second, view2) = spawn_processor(&bootstrap, None);
    wait_view(&mut second, &view2, "the second processor to initialise", |v| v.ready);
    let deadline = Instant::now() + Duration::from_secs(180);
    rt.block_on(async {
        let mut raw = RawTxn::connect(broker.addr()).await;
        loop {
            let committed = raw.committed(CTP_GROUP, CTP_IN, 3).await;
            if committed == in_ends {
                return;
            }
            if let Some(status) = second.try_wait().expect("try_wait") {
                panic!("the second processor exited ({status}); view {:?}", view2.lock().unwrap());
            }
            assert!(
                Instant::now() < deadline,
                "the group's committed offsets {committed:?} did not reach the input's end {in_ends:?}; view {:?}",
                view2.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    println!("second processor: {:?}", view2.lock().unwrap());
    second.kill().expect("SIGKILL the second processor");
    second.wait().expect("reap the second processor");

    // Exactly once, in input order per partition.
    rt.block_on(wait_stable(broker.addr(), CTP_OUT, 3, Duration::from_secs(30)));
    let expected: BTreeMap<i32, Vec<(String, String)>> =
        by_partition(&input.iter().map(|(p, k, v)| (*p, k.clone(), ctp_transform(v))).collect::<Vec<_>>());
    let rc = consume_all(&bootstrap, CTP_OUT, 3, true);
    let got = kv(&rc);
    for p in 0..3 {
        let (want, have) = (&expected[&p], &got[&p]);
        if want != have {
            let mut counts: HashMap<&String, usize> = HashMap::new();
            for (k, _) in have {
                *counts.entry(k).or_default() += 1;
            }
            let dupes = counts.values().filter(|n| **n > 1).count();
            let missing = want.iter().filter(|(k, _)| !counts.contains_key(k)).count();
            panic!(
                "output partition {p}: {} records, want {}; {dupes} keys duplicated, {missing} missing; first \
                 difference at index {:?}",
                have.len(),
                want.len(),
                want.iter().zip(have.iter()).position(|(a, b)| a != b)
            );
        }
    }
    assert_eq!(total(&rc), RECORDS, "every input's transform exactly once");
    let ru = consume_all(&bootstrap, CTP_OUT, 3, false);
    println!("output: {} committed records, {} in the log (aborted included)", total(&rc), total(&ru));
    assert!(
        total(&ru) >= RECORDS + 25,
        "the zombie's 25 aborted records are in the log ({} records) but hidden from read_committed",
        total(&ru)
    );
    let committed = rt.block_on(async { RawTxn::connect(broker.addr()).await.committed(CTP_GROUP, CTP_IN, 3).await });
    assert_eq!(committed, in_ends, "the group's committed offsets are the input's log end");
    rt.block_on(broker.shutdown());
}

// ---------------------------------------------------------------------------
// Test 4: broker killed mid-transaction / right after a commit
// ---------------------------------------------------------------------------

fn child_addr(broker: &ChildBroker) -> SocketAddr {
    broker.bootstrap().parse().expect("child broker address")
}

/// Goal: after a kill -9 of the broker the coordinator rebuilds its state
/// from `__transaction_state`; an open transaction is then completed or
/// aborted, never half-visible, and the LSO moves past it.
/// Method: the `strand` binary as a child process. P1 and P2 (two
/// transactional ids) each send 30 acknowledged records over 3 partitions in
/// an open transaction; the broker is SIGKILLed and restarted on the same
/// port. P1 then commits (Kafka keeps an Ongoing transaction across a
/// coordinator restart, so this is expected to succeed; if the broker chose
/// to abort it, the commit fails and P1 aborts). P2 is dropped without ending
/// its transaction; P3 with P2's id calls init_transactions, which must
/// abort P2's transaction, then commits 30 records. The LSO must reach the
/// high watermark; a read_committed consumer sees all of P1's records or
/// none (as its commit said), none of P2's and all of P3's, in order.
#[test]
fn broker_killed_mid_transaction_nothing_half_visible() {
    const TOPIC: &str = "txn-restart";
    let dir = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(dir.path());
    broker.start();
    let bootstrap = broker.bootstrap();
    let rt = Runtime::new().unwrap();
    rt.block_on(create_topic(&bootstrap, TOPIC, 3, &[]));

    let (p1, d1) = txn_producer(txn_config(&bootstrap, "restart-one"));
    let (p2, d2) = txn_producer(txn_config(&bootstrap, "restart-two"));
    p1.init_transactions(TXN_CALL).expect("P1 init_transactions");
    p2.init_transactions(TXN_CALL).expect("P2 init_transactions");
    p1.begin_transaction().expect("P1 begin_transaction");
    p2.begin_transaction().expect("P2 begin_transaction");
    let (r1, r2) = (records("one", 30, 3), records("two", 30, 3));
    send_acked(&p1, &d1, TOPIC, &r1);
    send_acked(&p2, &d2, TOPIC, &r2);

    broker.kill();
    broker.start();

    let committed = match p1.commit_transaction(TXN_CALL) {
        Ok(()) => true,
        Err(e) => {
            println!("P1's commit after the restart failed: {e}; aborting");
            p1.abort_transaction(TXN_CALL).expect("P1 abort_transaction after a failed commit");
            false
        }
    };
    println!("P1's transaction after the broker restart: {}", if committed { "committed" } else { "aborted" });
    drop(p1);
    drop(p2);
    let (p3, d3) = txn_producer(txn_config(&bootstrap, "restart-two"));
    p3.init_transactions(TXN_CALL).expect("P3 init_transactions (fences P2, aborts its transaction)");
    p3.begin_transaction().expect("P3 begin_transaction");
    let r3 = records("three", 30, 3);
    send_acked(&p3, &d3, TOPIC, &r3);
    p3.commit_transaction(TXN_CALL).expect("P3 commit_transaction");

    let hw = rt.block_on(wait_stable(child_addr(&broker), TOPIC, 3, Duration::from_secs(60)));
    println!("high watermarks {hw:?}");
    let rc = consume_all(&bootstrap, TOPIC, 3, true);
    let got = kv(&rc);
    // P1's and P2's records interleave in the log; compare per source, in order.
    let only = |prefix: &str| -> BTreeMap<i32, Vec<(String, String)>> {
        got.iter()
            .map(|(p, v)| (*p, v.iter().filter(|(k, _)| k.starts_with(prefix)).cloned().collect::<Vec<_>>()))
            .filter(|(_, v)| !v.is_empty())
            .collect()
    };
    assert_eq!(only("two-"), BTreeMap::new(), "none of P2's aborted records is visible");
    assert_eq!(only("three-"), by_partition(&r3), "all of P3's records, in order");
    if committed {
        assert_eq!(only("one-"), by_partition(&r1), "all of P1's committed records, in order");
    } else {
        assert_eq!(only("one-"), BTreeMap::new(), "none of P1's aborted records");
    }
    assert_eq!(
        total(&rc),
        r3.len() + if committed { r1.len() } else { 0 },
        "read_committed sees nothing else: {got:?}"
    );
    let ru = consume_all(&bootstrap, TOPIC, 3, false);
    assert_eq!(total(&ru), 90, "the log holds P1's, P2's and P3's records once each");
    drop(p3);
    broker.stop();
}

/// Goal: a commit that returned to the client is durable: the broker killed
/// right after `commit_transaction` returned completes it after the restart
/// (the coordinator finishes PrepareCommit from its log), and the producer
/// carries on with a new transaction.
/// Method: the `strand` binary as a child process; a producer commits 30
/// records over 3 partitions, the broker is SIGKILLed immediately and
/// restarted; the LSO must reach the high watermark and a read_committed
/// consumer must see all 30; the same producer then commits 30 more, and all
/// 60 are visible, in order.
#[test]
fn broker_killed_after_commit_returned_transaction_visible() {
    const TOPIC: &str = "txn-restart-commit";
    let dir = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(dir.path());
    broker.start();
    let bootstrap = broker.bootstrap();
    let rt = Runtime::new().unwrap();
    rt.block_on(create_topic(&bootstrap, TOPIC, 3, &[]));

    let (p, d) = txn_producer(txn_config(&bootstrap, "restart-committed"));
    p.init_transactions(TXN_CALL).expect("init_transactions");
    p.begin_transaction().expect("begin_transaction");
    let first = records("first", 30, 3);
    send_acked(&p, &d, TOPIC, &first);
    p.commit_transaction(TXN_CALL).expect("commit_transaction");
    broker.kill();
    broker.start();

    rt.block_on(wait_stable(child_addr(&broker), TOPIC, 3, Duration::from_secs(60)));
    let rc = consume_all(&bootstrap, TOPIC, 3, true);
    assert_eq!(kv(&rc), by_partition(&first), "the committed transaction is visible after the restart");

    p.begin_transaction().expect("begin_transaction after the restart");
    let second = records("second", 30, 3);
    send_acked(&p, &d, TOPIC, &second);
    p.commit_transaction(TXN_CALL).expect("commit_transaction after the restart");
    rt.block_on(wait_stable(child_addr(&broker), TOPIC, 3, Duration::from_secs(60)));
    let rc = consume_all(&bootstrap, TOPIC, 3, true);
    let mut all = first.clone();
    all.extend(second.iter().cloned());
    assert_eq!(kv(&rc), by_partition(&all), "both transactions visible, in order");
    drop(p);
    broker.stop();
}

// ---------------------------------------------------------------------------
// Test 5: transaction timeout
// ---------------------------------------------------------------------------

/// Goal: a transaction left open past its `transaction.timeout.ms` is aborted
/// by the coordinator (not before the timeout); the LSO then moves on to the
/// high watermark, read_committed consumers never see its records, the
/// transaction is CompleteAbort, and the producer's later commit fails.
/// Method: broker override
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms=100`; a
/// producer with `transaction.timeout.ms=2000` sends 20 acknowledged records
/// over 2 partitions and does nothing more; ListOffsets under read_committed
/// (raw, and as a read_committed consumer's watermarks) is polled until it
/// reaches the high watermark; then the commit is attempted; then another
/// producer commits one record per partition and a read_committed consumer
/// reads everything: only those two records.
#[test]
fn timed_out_transaction_is_aborted_by_the_coordinator() {
    const TOPIC: &str = "txn-timeout";
    const ID: &str = "timeout-id";
    let (rt, broker) = start(TXN_OVERRIDES);
    let bootstrap = broker.bootstrap();
    rt.block_on(create_topic(&bootstrap, TOPIC, 2, &[]));

    let mut config = txn_config(&bootstrap, ID);
    config.set("transaction.timeout.ms", "2000").set("socket.timeout.ms", "2000");
    let (p, d) = txn_producer(config);
    p.init_transactions(TXN_CALL).expect("init_transactions");
    let began = Instant::now();
    p.begin_transaction().expect("begin_transaction");
    let recs = records("late", 20, 2);
    send_acked(&p, &d, TOPIC, &recs);
    let mut raw = rt.block_on(RawTxn::connect(broker.addr()));
    let (lso, hw) = rt.block_on(raw.lso_hw(TOPIC, 2));
    assert_eq!(lso, BTreeMap::from([(0, 0), (1, 0)]), "the open transaction holds the LSO at its first offset");
    assert_eq!(hw, BTreeMap::from([(0, 10), (1, 10)]));
    let open = rt.block_on(raw.describe(ID));
    assert_eq!((open.error_code, open.transaction_state.as_str()), (NONE, "Ongoing"), "{open:?}");
    assert_eq!(open.transaction_timeout_ms, 2000);

    let hw = rt.block_on(wait_stable(broker.addr(), TOPIC, 2, Duration::from_secs(30)));
    let aborted_after = began.elapsed();
    println!("the coordinator aborted the timed-out transaction after {aborted_after:?}");
    assert!(aborted_after >= Duration::from_millis(1900), "aborted before its timeout: {aborted_after:?}");
    assert_eq!(hw, BTreeMap::from([(0, 11), (1, 11)]), "10 records and an ABORT marker per partition");
    assert_eq!(committed_watermarks(&bootstrap, TOPIC, 2), hw, "read_committed consumer watermarks reach the end");
    let after = rt.block_on(raw.describe_until(ID, "the timed-out transaction to be CompleteAbort", |t| {
        t.transaction_state.as_str() == "CompleteAbort"
    }));
    assert!(after.topics.is_empty(), "a completed transaction has no partitions: {after:?}");

    expect_txn_failure("commit after the coordinator aborted on timeout", p.commit_transaction(TXN_CALL));
    drop(p);
    let still = rt.block_on(raw.describe(ID));
    assert_eq!(still.transaction_state.as_str(), "CompleteAbort", "the failed commit changed nothing: {still:?}");

    let (q, dq) = txn_producer(txn_config(&bootstrap, "timeout-after"));
    q.init_transactions(TXN_CALL).expect("init_transactions");
    q.begin_transaction().expect("begin_transaction");
    let after_recs = records("after", 2, 2);
    send_acked(&q, &dq, TOPIC, &after_recs);
    q.commit_transaction(TXN_CALL).expect("commit_transaction");
    rt.block_on(wait_stable(broker.addr(), TOPIC, 2, Duration::from_secs(30)));
    let rc = consume_all(&bootstrap, TOPIC, 2, true);
    assert_eq!(kv(&rc), by_partition(&after_recs), "read_committed never sees the timed-out records");
    let ru = consume_all(&bootstrap, TOPIC, 2, false);
    assert_eq!(total(&ru), 22, "the timed-out records are in the log, only hidden");
    drop(q);
    rt.block_on(broker.shutdown());
}

// ---------------------------------------------------------------------------
// Test 6: bad input on the wire
// ---------------------------------------------------------------------------

/// Goal: the coordinator and the partition leaders answer bad transactional
/// requests with Kafka's error codes, and each changes nothing:
/// EndTxn for an unknown transactional id → INVALID_PRODUCER_ID_MAPPING (49);
/// AddPartitionsToTxn with a stale epoch → PRODUCER_FENCED (90) from v2,
/// INVALID_PRODUCER_EPOCH (47) below v2 (KIP-588); a transactional batch for
/// a partition not added to the transaction → INVALID_TXN_STATE (48)
/// (KIP-890 part 1), nothing written; InitProducerId with a transaction
/// timeout above `transaction.max.timeout.ms` (or negative) →
/// INVALID_TRANSACTION_TIMEOUT (50), no state created.
/// Method: raw requests (kafka-protocol) against a broker with
/// `transaction.max.timeout.ms=60000`; high watermarks and
/// DescribeTransactions are checked after each refusal; Produce v9 batches
/// are built with `strand_storage::batch::build_producer_batch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_transactional_requests_get_kafka_errors_and_change_nothing() {
    use strand_storage::batch::build_producer_batch;
    const TOPIC: &str = "txn-bad";
    let mut overrides = TXN_OVERRIDES.to_vec();
    overrides.push("transaction.max.timeout.ms=60000");
    let broker = start_broker(&overrides).await;
    create_topic(&broker.bootstrap(), TOPIC, 2, &[]).await;
    let mut raw = RawTxn::connect(broker.addr()).await;
    let (node, host, port) = raw.txn_coordinator("bad-unknown").await;
    assert_eq!((node, host.as_str(), port), (1, "127.0.0.1", broker.addr().port() as i32), "this node coordinates");

    // EndTxn for a transactional id that never called InitProducerId.
    assert_eq!(raw.end_txn("bad-unknown", 4242, 0, true).await, INVALID_PRODUCER_ID_MAPPING, "EndTxn commit");
    assert_eq!(raw.end_txn("bad-unknown", 4242, 0, false).await, INVALID_PRODUCER_ID_MAPPING, "EndTxn abort");
    assert_eq!(raw.describe("bad-unknown").await.error_code, TRANSACTIONAL_ID_NOT_FOUND, "no state was created");

    // A stale epoch: the second InitProducerId bumps it.
    let (err, pid, epoch) = raw.init_producer_id(Some("bad-stale"), 30_000).await;
    assert_eq!(err, NONE, "InitProducerId");
    let (err, pid2, epoch2) = raw.init_producer_id(Some("bad-stale"), 30_000).await;
    assert_eq!(err, NONE, "second InitProducerId");
    assert_eq!((pid2, epoch2), (pid, epoch + 1), "the same producer id with the epoch bumped");
    let v = raw.version::<AddPartitionsToTxnRequest>(2, 3);
    let stale = raw.add_partitions_at(v, "bad-stale", pid, epoch, TOPIC, &[0, 1]).await;
    assert_eq!(stale, BTreeMap::from([(0, PRODUCER_FENCED), (1, PRODUCER_FENCED)]), "AddPartitionsToTxn v{v}");
    if raw.advertises::<AddPartitionsToTxnRequest>(1) {
        let old = raw.add_partitions_at(1, "bad-stale", pid, epoch, TOPIC, &[0]).await;
        assert_eq!(old, BTreeMap::from([(0, INVALID_PRODUCER_EPOCH)]), "AddPartitionsToTxn v1 (before KIP-588)");
    }
    let t = raw.describe("bad-stale").await;
    assert_eq!(
        (t.error_code, t.transaction_state.as_str(), t.producer_id.0, t.producer_epoch),
        (NONE, "Empty", pid, epoch + 1),
        "the fenced AddPartitionsToTxn changed nothing: {t:?}"
    );
    assert!(t.topics.is_empty(), "no partition was added: {t:?}");
    // The current epoch still works.
    let ok = raw.add_partitions("bad-stale", pid, epoch + 1, TOPIC, &[0]).await;
    assert_eq!(ok, BTreeMap::from([(0, NONE)]), "AddPartitionsToTxn with the current epoch");
    assert_eq!(raw.end_txn("bad-stale", pid, epoch + 1, false).await, NONE, "EndTxn abort of an empty transaction");

    // A transactional batch for a partition that is not in the transaction.
    let (err, pid, epoch) = raw.init_producer_id(Some("bad-produce"), 30_000).await;
    assert_eq!(err, NONE, "InitProducerId");
    let before = raw.latest(TOPIC, 2, 0).await;
    let batch = |seq: i32, v: &[u8]| build_producer_batch(pid, epoch, seq, true, now_ms(), &[v, v]);
    let (err, _) = raw.produce(Some("bad-produce"), TOPIC, 0, batch(0, b"no-txn")).await;
    assert_eq!(err, INVALID_TXN_STATE, "transactional Produce with no transaction at all");
    assert_eq!(raw.latest(TOPIC, 2, 0).await, before, "nothing written");
    assert_eq!(raw.add_partitions("bad-produce", pid, epoch, TOPIC, &[0]).await, BTreeMap::from([(0, NONE)]));
    let (err, _) = raw.produce(Some("bad-produce"), TOPIC, 1, batch(0, b"not-added")).await;
    assert_eq!(err, INVALID_TXN_STATE, "transactional Produce to a partition not added to the transaction");
    assert_eq!(raw.latest(TOPIC, 2, 0).await, before, "nothing written");
    let (err, base) = raw.produce(Some("bad-produce"), TOPIC, 0, batch(0, b"added")).await;
    assert_eq!((err, base), (NONE, before[&0]), "transactional Produce to the added partition");
    let (lso, now) = raw.lso_hw(TOPIC, 2).await;
    assert_eq!(lso[&0], before[&0], "the open transaction holds partition 0's LSO");
    assert_eq!(now[&1], before[&1], "partition 1 untouched");
    assert_eq!(raw.end_txn("bad-produce", pid, epoch, false).await, NONE, "EndTxn abort");
    let stable = wait_stable(broker.addr(), TOPIC, 2, Duration::from_secs(30)).await;
    assert_eq!(stable, BTreeMap::from([(0, before[&0] + 3), (1, before[&1])]), "2 records and an ABORT marker");

    // Transaction timeouts outside (0, transaction.max.timeout.ms].
    for bad in [60_001, -1] {
        let (err, _, _) = raw.init_producer_id(Some("bad-timeout"), bad).await;
        assert_eq!(err, INVALID_TRANSACTION_TIMEOUT, "InitProducerId with transaction_timeout_ms={bad}");
    }
    assert_eq!(raw.describe("bad-timeout").await.error_code, TRANSACTIONAL_ID_NOT_FOUND, "no state was created");
    let (err, _, _) = raw.init_producer_id(Some("bad-timeout"), 60_000).await;
    assert_eq!(err, NONE, "InitProducerId with transaction_timeout_ms = transaction.max.timeout.ms");
    assert_eq!(raw.latest(TOPIC, 2, 0).await, stable, "no refused request wrote anything");
    broker.shutdown().await;
}

// ---------------------------------------------------------------------------
// Test 7: ListTransactions / DescribeTransactions
// ---------------------------------------------------------------------------

/// Goal: ListTransactions and DescribeTransactions show an open transaction
/// as Ongoing with its partitions, producer id, epoch, timeout and start
/// time, and then CompleteCommit with no partitions after the commit;
/// DescribeProducers shows the partition's open transaction start offset;
/// unknown ids and state filters are reported.
/// Method: a librdkafka transactional producer sends to partitions 0 and 2
/// of a 3-partition topic (acknowledged); raw requests are made while the
/// transaction is open and again (polled, bounded) after the commit returned.
#[test]
fn list_and_describe_transactions_follow_a_transaction() {
    const TOPIC: &str = "txn-describe";
    const ID: &str = "describe-id";
    let (rt, broker) = start(TXN_OVERRIDES);
    let bootstrap = broker.bootstrap();
    rt.block_on(create_topic(&bootstrap, TOPIC, 3, &[]));
    let mut raw = rt.block_on(RawTxn::connect(broker.addr()));
    let (node, _, port) = rt.block_on(raw.txn_coordinator(ID));
    assert_eq!((node, port), (1, broker.addr().port() as i32), "FindCoordinator(TRANSACTION) → this node");

    let (p, d) = txn_producer(txn_config(&bootstrap, ID));
    p.init_transactions(TXN_CALL).expect("init_transactions");
    let t = rt.block_on(raw.describe(ID));
    assert_eq!((t.error_code, t.transaction_state.as_str()), (NONE, "Empty"), "after InitProducerId: {t:?}");
    let before_begin = now_ms();
    p.begin_transaction().expect("begin_transaction");
    let recs: Vec<Rec> = vec![(0, "k0".into(), "v0".into()), (2, "k2".into(), "v2".into())];
    send_acked(&p, &d, TOPIC, &recs);

    let t = rt.block_on(raw.describe(ID));
    println!("open: {t:?}");
    assert_eq!((t.error_code, t.transaction_state.as_str()), (NONE, "Ongoing"));
    let topics: Vec<(String, BTreeSet<i32>)> =
        t.topics.iter().map(|x| (x.topic.0.to_string(), x.partitions.iter().copied().collect())).collect();
    assert_eq!(topics, vec![(TOPIC.to_string(), BTreeSet::from([0, 2]))], "the transaction's partitions");
    assert_eq!(t.transaction_timeout_ms, 60_000, "librdkafka's default transaction.timeout.ms");
    assert!(t.producer_id.0 >= 0 && t.producer_epoch >= 0, "{t:?}");
    assert!(
        t.transaction_start_time_ms >= before_begin - 1000 && t.transaction_start_time_ms <= now_ms() + 1000,
        "start time {} (began at {before_begin})",
        t.transaction_start_time_ms
    );
    let pid = t.producer_id.0;
    let (err, unknown, all) = rt.block_on(raw.list(&[]));
    assert_eq!((err, unknown.len()), (NONE, 0));
    assert_eq!(all.get(ID), Some(&(pid, "Ongoing".to_string())), "ListTransactions: {all:?}");
    let (_, _, ongoing) = rt.block_on(raw.list(&["Ongoing"]));
    assert!(ongoing.contains_key(ID), "state filter Ongoing: {ongoing:?}");
    let (_, unknown, done) = rt.block_on(raw.list(&["CompleteCommit", "NoSuchState"]));
    assert!(!done.contains_key(ID), "state filter CompleteCommit: {done:?}");
    assert_eq!(unknown, vec!["NoSuchState".to_string()], "unknown state filters are reported");
    for (partition, start) in [(0, Some(0)), (1, None), (2, Some(0))] {
        let producers = rt.block_on(raw.producers(TOPIC, partition));
        assert_eq!(producers.get(&pid).copied(), start, "DescribeProducers {TOPIC}[{partition}]: {producers:?}");
    }

    p.commit_transaction(TXN_CALL).expect("commit_transaction");
    let t =
        rt.block_on(raw.describe_until(ID, "CompleteCommit after the commit", |t| {
            t.transaction_state.as_str() == "CompleteCommit"
        }));
    assert!(t.topics.is_empty(), "a completed transaction lists no partitions: {t:?}");
    assert_eq!(t.producer_id.0, pid);
    let (_, _, done) = rt.block_on(raw.list(&["CompleteCommit"]));
    assert_eq!(done.get(ID), Some(&(pid, "CompleteCommit".to_string())), "ListTransactions: {done:?}");
    for partition in [0, 2] {
        let producers = rt.block_on(raw.producers(TOPIC, partition));
        assert_eq!(producers.get(&pid).copied(), Some(-1), "no open transaction on {partition}: {producers:?}");
    }
    let unknown = rt.block_on(raw.describe("no-such-transactional-id"));
    assert_eq!(unknown.error_code, TRANSACTIONAL_ID_NOT_FOUND, "DescribeTransactions of an unknown id");
    drop(p);
    rt.block_on(broker.shutdown());
}
