//! Replication with real processes: three `strand` nodes, a topic with
//! three replicas and min.insync.replicas=2, an idempotent librdkafka
//! producer (acks=all) writing all the time, and one fault after another:
//! kill -9 of the leader of every partition in turn, then of the active
//! controller; a node frozen (SIGSTOP) and thawed; a rolling restart. After
//! each, every acknowledged record is read back at its offset, none twice,
//! in order per partition, and once everything is back every replica's log
//! holds the same batches (base offset and CRC) as the leader's.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::child_cluster::ChildCluster;
use common::until;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};

const READY: Duration = Duration::from_secs(30);
const PARTITIONS: i32 = 3;
const TOPIC: &str = "kept";

/// (partition, offset) -> value of every acknowledged record.
type Acked = Arc<Mutex<BTreeMap<(i32, i64), String>>>;

/// (leader, isr) per partition, as node `from` answers Metadata.
async fn partitions(cluster: &ChildCluster, from: i32) -> Result<BTreeMap<i32, (i32, Vec<i32>)>, String> {
    topic_partitions(cluster, from, TOPIC).await
}

/// (leader, isr) per partition of `topic`, as node `from` answers Metadata.
async fn topic_partitions(
    cluster: &ChildCluster,
    from: i32,
    topic: &str,
) -> Result<BTreeMap<i32, (i32, Vec<i32>)>, String> {
    let md = cluster.metadata(from, Some(&[topic])).await?;
    let t = md.topics.first().ok_or("no topic")?;
    Ok(t.partitions
        .iter()
        .map(|p| (p.partition_index, (p.leader_id.0, p.isr_nodes.iter().map(|b| b.0).collect())))
        .collect())
}

/// Writes `p{partition}-{n}` values to every partition, a window of sends in
/// flight, until `stop`; records what was acknowledged.
async fn produce_until(bootstrap: String, acked: Acked, stop: Arc<AtomicBool>, extra: &[(&str, &str)]) -> usize {
    let mut config = common::producer_config(&bootstrap);
    for (k, v) in extra {
        config.set(*k, *v);
    }
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "120000")
        .set("linger.ms", "2");
    let producer: FutureProducer = config.create().expect("producer");
    let mut n = 0u64;
    let mut failed = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut window = Vec::new();
        for p in 0..PARTITIONS {
            for _ in 0..20 {
                let value = format!("p{p}-{n:08}");
                n += 1;
                let record = FutureRecord::<(), str>::to(TOPIC).partition(p).payload(&value);
                match producer.send_result(record) {
                    Ok(delivery) => window.push((value, delivery)),
                    Err((e, _)) => panic!("enqueue: {e}"),
                }
            }
        }
        for (value, delivery) in window {
            match delivery.await.expect("delivery") {
                Ok(d) => {
                    let previous = acked.lock().unwrap().insert((d.partition, d.offset), value);
                    assert!(previous.is_none(), "two acknowledged values at {}@{}", d.partition, d.offset);
                }
                Err(_) => failed += 1,
            }
        }
    }
    failed
}

/// (base offset, CRC) of every batch in a partition directory's segments.
fn batches(dir: &Path) -> Vec<(i64, u32)> {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    let mut out = Vec::new();
    for log in logs {
        let bytes = std::fs::read(&log).unwrap();
        let mut at = 0;
        while at + 21 <= bytes.len() {
            let base = i64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
            let len = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
            if at + 12 + len > bytes.len() {
                break;
            }
            let crc = u32::from_be_bytes(bytes[at + 17..at + 21].try_into().unwrap());
            out.push((base, crc));
            at += 12 + len;
        }
    }
    out
}

/// A three-node cluster (`extra` lines for every node) with topic
/// [`TOPIC`]: three replicas, min.insync.replicas=2, every ISR full.
async fn cluster_with_topic(extra: &[&str]) -> ChildCluster {
    let cluster = ChildCluster::start(3, extra, READY).await;
    let admin: AdminClient<DefaultClientContext> = common::admin_config(&cluster.bootstrap(1)).create().unwrap();
    let topic = NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(3)).set("min.insync.replicas", "2");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    admin.create_topics([&topic], &opts).await.unwrap().into_iter().for_each(|r| {
        r.expect("created");
    });
    until("a full ISR everywhere", READY, || async {
        partitions(&cluster, 1).await.is_ok_and(|m| m.len() == 3 && m.values().all(|(l, isr)| *l > 0 && isr.len() == 3))
    })
    .await;
    cluster
}

/// Every acknowledged record of `acked` is read back at its offset, no value
/// twice, values in order per partition; then every replica's log holds the
/// same batches (base offset and CRC). Every node must be running.
async fn everything_acknowledged_is_kept(cluster: &ChildCluster, acked: &BTreeMap<(i32, i64), String>) {
    until("a full ISR everywhere again", READY, || async {
        partitions(cluster, 1).await.is_ok_and(|m| m.values().all(|(l, isr)| *l > 0 && isr.len() == 3))
    })
    .await;
    for p in 0..PARTITIONS {
        let expected: Vec<(i64, String)> =
            acked.range((p, i64::MIN)..=(p, i64::MAX)).map(|((_, o), v)| (*o, v.clone())).collect();
        let last = expected.last().map_or(0, |(o, _)| *o);
        let got = common::consume(&cluster.bootstrap(1), TOPIC, p, 0, last as usize + 1, Duration::from_secs(60)).await;
        let by_offset: BTreeMap<i64, String> =
            got.iter().map(|(o, v)| (*o, String::from_utf8(v.clone()).unwrap())).collect();
        for (offset, value) in &expected {
            assert_eq!(by_offset.get(offset), Some(value), "acknowledged {TOPIC}-{p}@{offset} lost");
        }
        let values: Vec<&String> = by_offset.values().collect();
        let mut sorted = values.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(values.len(), sorted.len(), "partition {p}: a value written twice");
        assert!(values == sorted, "partition {p}: values out of order");
        // Every replica's batches, compared by base offset and CRC.
        let dirs: Vec<_> = (1..=3).map(|id| cluster.node(id).log_dir().join(format!("{TOPIC}-{p}"))).collect();
        until("replicas to converge", READY, || {
            let lists: Vec<Vec<(i64, u32)>> = dirs.iter().map(|d| batches(d)).collect();
            async move { lists.windows(2).all(|w| w[0] == w[1]) }
        })
        .await;
    }
}

/// Goal: kill -9 of each partition's leader in turn, and of the active
/// controller, under an idempotent acks=all producer loses no acknowledged
/// record, duplicates none, keeps order, and leaves identical replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_every_leader_loses_nothing_acknowledged() {
    // Preferred leaders return within seconds, so the controller leads a
    // partition again by the time it is killed.
    let mut cluster = cluster_with_topic(&["leader.imbalance.check.interval.seconds=1"]).await;
    let bootstrap = cluster.bootstrap(1);
    let acked: Acked = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(produce_until(bootstrap.clone(), acked.clone(), stop.clone(), &[]));
    let count = || acked.lock().unwrap().len();
    let mut failovers = Vec::new();
    let mut victims = Vec::new();
    for p in 0..PARTITIONS {
        let before = count();
        until("records acknowledged", READY, || async { count() >= before + 300 }).await;
        let from = cluster.running()[0];
        let leader = partitions(&cluster, from).await.unwrap()[&p].0;
        victims.push(leader);
        cluster.kill(leader);
        let killed = Instant::now();
        let at_kill = count();
        // A new acknowledgement on the partition: its new leader took the write.
        let survivor = cluster.running()[0];
        until("a new leader", READY, || async {
            partitions(&cluster, survivor).await.is_ok_and(|m| m[&p].0 > 0 && m[&p].0 != leader)
        })
        .await;
        until("writes acknowledged after the kill", READY, || async { count() > at_kill + 60 }).await;
        failovers.push(killed.elapsed());
        cluster.restart(&[leader]).await;
        until("the killed node back in every ISR", READY, || async {
            partitions(&cluster, survivor).await.is_ok_and(|m| m.values().all(|(_, isr)| isr.len() == 3))
        })
        .await;
    }
    // The active controller, leading a partition too: both at once.
    let controller = cluster.wait_ready(READY).await;
    let from = cluster.running().into_iter().find(|id| *id != controller).unwrap();
    until("the controller leading a partition", READY, || async {
        partitions(&cluster, from).await.is_ok_and(|m| m.values().any(|(l, isr)| *l == controller && isr.len() == 3))
    })
    .await;
    let led: Vec<i32> = partitions(&cluster, from)
        .await
        .unwrap()
        .into_iter()
        .filter(|(_, (l, _))| *l == controller)
        .map(|(p, _)| p)
        .collect();
    let at_kill = count();
    cluster.kill(controller);
    until("new leaders for the controller's partitions", READY, || async {
        partitions(&cluster, from).await.is_ok_and(|m| led.iter().all(|p| m[p].0 > 0 && m[p].0 != controller))
    })
    .await;
    until("writes acknowledged after the controller's kill", READY, || async { count() > at_kill + 300 }).await;
    cluster.restart(&[controller]).await;
    cluster.wait_ready(READY).await;
    stop.store(true, Ordering::Relaxed);
    let failed = producer.await.expect("producer task");
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "replication figures: {} acknowledged, {failed} not, kill -9 of leaders {victims:?} to the next acknowledgement: {:?}, \
         then of the controller {controller} leading partitions {led:?}",
        acked.len(),
        failovers
    );

    everything_acknowledged_is_kept(&cluster, &acked).await;
}

/// Goal: a node frozen with SIGSTOP (a long GC pause, a hung VM) leaves
/// every ISR, by lag where it follows and by its session expiring where it
/// leads, while writes go on being acknowledged by the other two; thawed,
/// it finds itself fenced, truncates whatever it appended as a stale leader,
/// catches up and rejoins every ISR, and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_node_leaves_every_isr_and_rejoins_when_thawed() {
    let mut cluster = cluster_with_topic(&["replica.lag.time.max.ms=2000"]).await;
    let controller = cluster.wait_ready(READY).await;
    // The frozen node is not the active controller: this test is about the
    // ISR, the kill -9 test covers losing the controller.
    let frozen = (1..=3).find(|id| *id != controller).unwrap();
    let witness = controller;
    let acked: Acked = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    // Requests stuck on the frozen node give up after 5 s, not 30.
    let producer = tokio::spawn(produce_until(
        cluster.bootstrap(witness),
        acked.clone(),
        stop.clone(),
        &[("request.timeout.ms", "5000")],
    ));
    let count = || acked.lock().unwrap().len();
    until("records acknowledged", READY, || async { count() >= 300 }).await;
    let led: Vec<i32> = partitions(&cluster, witness)
        .await
        .unwrap()
        .iter()
        .filter(|(_, (l, _))| *l == frozen)
        .map(|(p, _)| *p)
        .collect();
    cluster.pause(frozen);
    let paused = Instant::now();
    let out = until("the frozen node out of every ISR, leading nothing", READY, || async {
        partitions(&cluster, witness)
            .await
            .is_ok_and(|m| m.values().all(|(l, isr)| *l != frozen && *l > 0 && !isr.contains(&frozen)))
    })
    .await;
    let at_out = count();
    until("writes acknowledged without the frozen node", READY, || async { count() > at_out + 300 }).await;
    let acknowledging = paused.elapsed();
    cluster.resume(frozen);
    let thawed = Instant::now();
    until("the thawed node back in every ISR", READY, || async {
        partitions(&cluster, witness).await.is_ok_and(|m| m.values().all(|(_, isr)| isr.contains(&frozen)))
    })
    .await;
    let rejoined = thawed.elapsed();
    let at_back = count();
    until("writes acknowledged after the thaw", READY, || async { count() > at_back + 300 }).await;
    stop.store(true, Ordering::Relaxed);
    let failed = producer.await.expect("producer task");
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "replication figures: node {frozen} (leading partitions {led:?}) frozen: out of every ISR after {out:?}, \
         writes acknowledged by the others {acknowledging:?} after the freeze, back in every ISR {rejoined:?} after \
         the thaw; {} acknowledged, {failed} not",
        acked.len()
    );
    everything_acknowledged_is_kept(&cluster, &acked).await;
}

/// Goal: a rolling restart (SIGTERM, start again, wait for a full ISR; node
/// after node) under an idempotent acks=all producer fails no write,
/// loses no acknowledged record and leaves identical replicas: each
/// node's controlled shutdown moves its leadership away first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_under_load_fails_and_loses_nothing() {
    let mut cluster = cluster_with_topic(&[]).await;
    let acked: Acked = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(produce_until(cluster.bootstrap(1), acked.clone(), stop.clone(), &[]));
    let count = || acked.lock().unwrap().len();
    let mut rounds = Vec::new();
    for id in 1..=3 {
        let before = count();
        until("records acknowledged", READY, || async { count() >= before + 300 }).await;
        let started = Instant::now();
        cluster.terminate(id);
        let at_stop = count();
        until("writes acknowledged while a node is down", READY, || async { count() > at_stop + 100 }).await;
        cluster.restart(&[id]).await;
        let witness = (1..=3).find(|other| *other != id).unwrap();
        until("the restarted node back in every ISR", READY, || async {
            partitions(&cluster, witness).await.is_ok_and(|m| m.values().all(|(l, isr)| *l > 0 && isr.len() == 3))
        })
        .await;
        rounds.push(started.elapsed());
    }
    let before = count();
    until("records acknowledged after the last restart", READY, || async { count() >= before + 300 }).await;
    stop.store(true, Ordering::Relaxed);
    let failed = producer.await.expect("producer task");
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "replication figures: rolling restart, SIGTERM to full ISR per node {rounds:?}; {} acknowledged, {failed} not",
        acked.len()
    );
    assert_eq!(failed, 0, "a write failed during the rolling restart");
    everything_acknowledged_is_kept(&cluster, &acked).await;
}

const EOS_IN: &str = "eos-in";
const EOS_OUT: &str = "eos-out";
const EOS_PARTITIONS: i32 = 2;
const EOS_GROUP: &str = "eos";
const TXN_CALL: Duration = Duration::from_secs(60);

/// What the transform loop did, for the figures line.
#[derive(Debug, Default)]
struct TransformStats {
    committed_transactions: usize,
    aborted_transactions: usize,
    new_producers: usize,
}

/// A transactional producer for `txn_id`, its transactions initialised.
fn transactional_producer(bootstrap: &str, txn_id: &str) -> rdkafka::producer::BaseProducer {
    use rdkafka::producer::Producer;
    let mut config = common::producer_config(bootstrap);
    config
        .set("transactional.id", txn_id)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "60000")
        .set("transaction.timeout.ms", "60000");
    let producer: rdkafka::producer::BaseProducer = config.create().expect("transactional producer");
    producer.init_transactions(TXN_CALL).expect("init_transactions");
    producer
}

/// The consumer's assignment reset to the group's committed offsets (the
/// start where none is committed yet): where the last committed
/// transaction left the input.
fn rewind(consumer: &rdkafka::consumer::BaseConsumer) {
    use rdkafka::consumer::Consumer;
    use rdkafka::{Offset, TopicPartitionList};
    let mut asked = TopicPartitionList::new();
    for p in 0..EOS_PARTITIONS {
        asked.add_partition(EOS_IN, p);
    }
    let committed = consumer.committed_offsets(asked, TXN_CALL).expect("committed offsets");
    let mut from = TopicPartitionList::new();
    for e in committed.elements() {
        let offset = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        from.add_partition_offset(EOS_IN, e.partition(), offset).unwrap();
    }
    consumer.assign(&from).expect("assign");
}

/// One transaction: `records` sent to the output (same partition, value
/// prefixed `out-`) and the input positions after them committed in it.
fn transform_once(
    producer: &rdkafka::producer::BaseProducer,
    consumer: &rdkafka::consumer::BaseConsumer,
    records: &[(i32, i64, String)],
) -> rdkafka::error::KafkaResult<()> {
    use rdkafka::consumer::Consumer;
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use rdkafka::producer::{BaseRecord, Producer};
    use rdkafka::{Offset, TopicPartitionList};
    producer.begin_transaction()?;
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for (partition, offset, value) in records {
        let out = format!("out-{value}");
        let mut record = BaseRecord::<(), str>::to(EOS_OUT).partition(*partition).payload(&out);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    producer.poll(Duration::from_millis(10));
                    record = r;
                }
                Err((e, _)) => return Err(e),
            }
        }
        next.insert(*partition, offset + 1);
    }
    let mut positions = TopicPartitionList::new();
    for (p, o) in &next {
        positions.add_partition_offset(EOS_IN, *p, Offset::Offset(*o)).unwrap();
    }
    let metadata = consumer.group_metadata().expect("group metadata");
    producer.send_offsets_to_transaction(&positions, &metadata, TXN_CALL)?;
    // A retriable failure of the commit is retried (the commit may already
    // be under way at the coordinator); any other goes to the caller.
    let mut attempts = 0;
    loop {
        match producer.commit_transaction(TXN_CALL) {
            Err(KafkaError::Transaction(e)) if e.is_retriable() && attempts < 10 => attempts += 1,
            other => return other,
        }
    }
}

/// Consume-transform-produce with a transactional producer and a
/// read_committed consumer of group [`EOS_GROUP`], in transactions of up
/// to 50 records, until `stop` and the input is consumed to its end. A
/// failed transaction is aborted (or, if the producer is fenced or broken,
/// a new producer fences it) and the input rewound to the committed
/// offsets, as a Kafka Streams task does.
fn transform_until(
    bootstrap: String,
    txn_id: String,
    stop: Arc<AtomicBool>,
    transformed: Arc<AtomicUsize>,
) -> TransformStats {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::producer::Producer;
    use rdkafka::Message;
    let mut config = common::consumer_config(&bootstrap);
    config.set("group.id", EOS_GROUP).set("isolation.level", "read_committed").set("enable.partition.eof", "false");
    let consumer: BaseConsumer = config.create().expect("consumer");
    let mut producer = transactional_producer(&bootstrap, &txn_id);
    let mut stats = TransformStats::default();
    rewind(&consumer);
    let mut idle_after_stop = 0;
    loop {
        let mut records = Vec::new();
        let deadline = Instant::now() + Duration::from_millis(100);
        while records.len() < 50 && Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(20)) {
                Some(Ok(m)) => {
                    let value = String::from_utf8(m.payload().unwrap_or_default().to_vec()).unwrap();
                    records.push((m.partition(), m.offset(), value));
                }
                Some(Err(e)) => eprintln!("transform: consumer error {e}"),
                None => {}
            }
        }
        if records.is_empty() {
            if stop.load(Ordering::Relaxed) {
                // Done once the committed offsets are the input's end.
                idle_after_stop += 1;
                let ends: Vec<i64> = (0..EOS_PARTITIONS)
                    .map(|p| consumer.fetch_watermarks(EOS_IN, p, TXN_CALL).expect("watermarks").1)
                    .collect();
                let positions = consumer.position().expect("position");
                let at_end = (0..EOS_PARTITIONS).all(|p| {
                    positions
                        .find_partition(EOS_IN, p)
                        .is_some_and(|e| matches!(e.offset(), rdkafka::Offset::Offset(o) if o >= ends[p as usize]))
                });
                if at_end || idle_after_stop > 600 {
                    return stats;
                }
            }
            continue;
        }
        match transform_once(&producer, &consumer, &records) {
            Ok(()) => {
                stats.committed_transactions += 1;
                transformed.fetch_add(records.len(), Ordering::Relaxed);
            }
            Err(e) => {
                eprintln!("transform: transaction failed ({e}); aborting and rewinding");
                let abortable = matches!(&e, KafkaError::Transaction(t) if !t.is_fatal());
                let mut aborted = false;
                if abortable {
                    for _ in 0..10 {
                        match producer.abort_transaction(TXN_CALL) {
                            Ok(()) => {
                                aborted = true;
                                break;
                            }
                            Err(KafkaError::Transaction(t)) if t.is_retriable() => continue,
                            Err(e) => {
                                eprintln!("transform: abort failed ({e})");
                                break;
                            }
                        }
                    }
                }
                if aborted {
                    stats.aborted_transactions += 1;
                } else {
                    // Fenced or broken: a new producer with the same id
                    // fences this one and ends its open transaction.
                    producer = transactional_producer(&bootstrap, &txn_id);
                    stats.new_producers += 1;
                }
                rewind(&consumer);
            }
        }
    }
}

/// Every value of `topic` (all partitions) as a read_committed consumer
/// sees it, reading each partition to its end.
fn read_committed_values(bootstrap: &str, topic: &str) -> Vec<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;
    use rdkafka::{Message, Offset, TopicPartitionList};
    let mut config = common::consumer_config(bootstrap);
    config.set("isolation.level", "read_committed");
    let consumer: BaseConsumer = config.create().expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..EOS_PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut values = Vec::new();
    let mut at_end = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while at_end.len() < EOS_PARTITIONS as usize {
        assert!(Instant::now() < deadline, "reading {topic} to its end");
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => values.push(String::from_utf8(m.payload().unwrap_or_default().to_vec()).unwrap()),
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF) => {}
            Some(Err(e)) => eprintln!("read {topic}: {e}"),
            None => {}
        }
    }
    values
}

/// Goal: consume-transform-produce exactly once across kill -9, one after
/// another, of the leader of an input partition, of an output partition
/// and of the transactional id's `__transaction_state` partition, while an
/// idempotent producer keeps writing the input: every input value appears
/// exactly once in the read_committed output, and the group's committed
/// offsets are the input's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_survives_kill_9_of_the_input_output_and_coordinator_leaders() {
    let mut cluster = ChildCluster::start(3, &[], READY).await;
    let bootstrap: String = (1..=3).map(|id| cluster.bootstrap(id)).collect::<Vec<_>>().join(",");
    let admin: AdminClient<DefaultClientContext> = common::admin_config(&bootstrap).create().unwrap();
    let topics: Vec<NewTopic> = [EOS_IN, EOS_OUT]
        .iter()
        .map(|t| NewTopic::new(t, EOS_PARTITIONS, TopicReplication::Fixed(3)).set("min.insync.replicas", "2"))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    for r in admin.create_topics(topics.iter(), &opts).await.unwrap() {
        r.expect("created");
    }
    let txn_id = "eos-transform".to_string();
    let txn_partition = strand::group::records::partition_for(&txn_id, 50);

    // The input: an idempotent producer writing all the time.
    let stop_input = Arc::new(AtomicBool::new(false));
    let input = {
        let (bootstrap, stop) = (bootstrap.clone(), stop_input.clone());
        tokio::spawn(async move {
            let mut config = common::producer_config(&bootstrap);
            config.set("enable.idempotence", "true").set("message.timeout.ms", "120000");
            let producer: FutureProducer = config.create().expect("producer");
            let mut n = 0u64;
            let mut failed = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut window = Vec::new();
                for _ in 0..40 {
                    let value = format!("in-{n:08}");
                    let record = FutureRecord::<(), str>::to(EOS_IN).partition((n % 2) as i32).payload(&value);
                    n += 1;
                    window.push(producer.send_result(record).map_err(|(e, _)| e).expect("enqueue"));
                }
                for delivery in window {
                    if delivery.await.expect("delivery").is_err() {
                        failed += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            failed
        })
    };
    // The transform, on a thread of its own (librdkafka's calls block).
    let stop_transform = Arc::new(AtomicBool::new(false));
    let transformed = Arc::new(AtomicUsize::new(0));
    let transform = {
        let (bootstrap, txn_id, stop, transformed) =
            (bootstrap.clone(), txn_id.clone(), stop_transform.clone(), transformed.clone());
        std::thread::spawn(move || transform_until(bootstrap, txn_id, stop, transformed))
    };
    let count = || transformed.load(Ordering::Relaxed);
    until("the transform under way", READY, || async { count() >= 200 }).await;

    let mut victims = Vec::new();
    for (topic, p) in [(EOS_IN, 0), (EOS_OUT, 1), ("__transaction_state", txn_partition)] {
        let from = cluster.running()[0];
        let leader = topic_partitions(&cluster, from, topic).await.unwrap()[&p].0;
        victims.push((topic, leader));
        let at_kill = count();
        cluster.kill(leader);
        until("transactions committed after the kill", Duration::from_secs(90), || async { count() > at_kill + 200 })
            .await;
        cluster.restart(&[leader]).await;
        let survivor = cluster.running()[0];
        for t in [EOS_IN, EOS_OUT, "__transaction_state"] {
            until("the killed node back in every ISR", READY, || async {
                topic_partitions(&cluster, survivor, t)
                    .await
                    .is_ok_and(|m| !m.is_empty() && m.values().all(|(l, isr)| *l > 0 && isr.len() == 3))
            })
            .await;
        }
    }
    stop_input.store(true, Ordering::Relaxed);
    let input_failed = input.await.expect("input producer");
    stop_transform.store(true, Ordering::Relaxed);
    let stats = tokio::task::spawn_blocking(move || transform.join().expect("transform thread")).await.unwrap();

    let (inputs, outputs, committed) = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || {
            use rdkafka::consumer::{BaseConsumer, Consumer};
            let inputs = read_committed_values(&bootstrap, EOS_IN);
            let outputs = read_committed_values(&bootstrap, EOS_OUT);
            let mut config = common::consumer_config(&bootstrap);
            config.set("group.id", EOS_GROUP).set("isolation.level", "read_committed");
            let consumer: BaseConsumer = config.create().unwrap();
            let mut tpl = rdkafka::TopicPartitionList::new();
            let mut ends = Vec::new();
            for p in 0..EOS_PARTITIONS {
                tpl.add_partition(EOS_IN, p);
                ends.push(consumer.fetch_watermarks(EOS_IN, p, TXN_CALL).unwrap().1);
            }
            let committed = consumer.committed_offsets(tpl, TXN_CALL).unwrap();
            let committed: Vec<(i64, i64)> = committed
                .elements()
                .iter()
                .map(|e| (e.offset().to_raw().unwrap_or(-1), ends[e.partition() as usize]))
                .collect();
            (inputs, outputs, committed)
        }
    })
    .await
    .unwrap();
    eprintln!(
        "replication figures: exactly once through kill -9 of the leaders of {victims:?}: {} inputs \
         ({input_failed} input writes failed), {} outputs, {stats:?}",
        inputs.len(),
        outputs.len()
    );
    let mut seen = std::collections::BTreeMap::new();
    for v in &outputs {
        *seen.entry(v.clone()).or_insert(0) += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "values in the output more than once: {twice:?}");
    let missing: Vec<_> = inputs.iter().filter(|v| !seen.contains_key(&format!("out-{v}"))).take(5).collect();
    assert!(missing.is_empty(), "inputs missing from the output: {missing:?}");
    assert_eq!(outputs.len(), inputs.len(), "an output without an input");
    for (offset, end) in committed {
        assert_eq!(offset, end, "the group's committed offset is the input's end");
    }
    assert!(stats.committed_transactions > 0);
}
