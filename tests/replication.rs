//! Replication in one process: three combined nodes, topics with three
//! replicas and min.insync.replicas=2, used through librdkafka. Followers
//! copy the leader's batches byte for byte, acks=all is answered once the
//! ISR has the batch, a stopped leader's partitions move to another ISR
//! member with nothing acknowledged lost or duplicated, acks=all is
//! refused with NOT_ENOUGH_REPLICAS when too few replicas are left, and a
//! restarted replica catches up and rejoins the ISR.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::TestCluster;
use common::*;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

const READY: Duration = Duration::from_secs(30);

async fn create_replicated(bootstrap: &str, name: &str, partitions: i32, min_isr: &str) {
    let admin: AdminClient<DefaultClientContext> = admin_config(bootstrap).create().unwrap();
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(3)).set("min.insync.replicas", min_isr);
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    let results = admin.create_topics([&topic], &opts).await.expect("create_topics");
    for r in results {
        r.expect("topic created");
    }
}

/// (leader, replicas, isr) of each partition as librdkafka's Metadata shows it.
fn partition_metadata(bootstrap: &str, topic: &str) -> BTreeMap<i32, (i32, Vec<i32>, Vec<i32>)> {
    let consumer: BaseConsumer = consumer_config(bootstrap).create().unwrap();
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let t = md.topics().iter().find(|t| t.name() == topic).expect("topic in metadata");
    t.partitions().iter().map(|p| (p.id(), (p.leader(), p.replicas().to_vec(), p.isr().to_vec()))).collect()
}

fn producer(bootstrap: &str) -> FutureProducer {
    let mut config = producer_config(bootstrap);
    config.set("enable.idempotence", "true").set("acks", "all").set("message.timeout.ms", "60000");
    config.create().unwrap()
}

/// Sends `values` to `partition`, all in flight at once; returns the offsets acknowledged.
async fn send_all(producer: &FutureProducer, topic: &str, partition: i32, values: &[String]) -> Vec<i64> {
    let sends = values.iter().map(|v| {
        let record = FutureRecord::to(topic).partition(partition).key("k").payload(v);
        producer.send(record, Duration::from_secs(60))
    });
    futures_util::future::join_all(sends)
        .await
        .into_iter()
        .map(|r| r.map(|d| d.offset).map_err(|(e, _)| e.to_string()).expect("acknowledged"))
        .collect()
}

/// Every value of `partition` from the beginning, with its offset.
fn read_partition(bootstrap: &str, topic: &str, partition: i32, expected: usize) -> Vec<(i64, String)> {
    let consumer: BaseConsumer = consumer_config(bootstrap).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning).unwrap();
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while out.len() < expected {
        assert!(std::time::Instant::now() < deadline, "read {} of {expected} values of {topic}-{partition}", out.len());
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push((m.offset(), String::from_utf8(m.payload().unwrap_or_default().to_vec()).unwrap())),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) | None => {}
            // A stopped broker of the cluster: librdkafka reports it and goes on.
            Some(Err(e))
                if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure) => {}
            Some(Err(e)) => panic!("consume error: {e}"),
        }
    }
    out
}

/// The bytes of a partition's log below `end` on broker `id`, read through
/// its segment files (whole batches: replicas must be byte-identical).
fn log_bytes(cluster: &TestCluster, id: i32, topic: &str, partition: i32, end: i64) -> Vec<u8> {
    let p = cluster.state(id).replicas.partition(topic, partition).expect("hosted");
    let (info, _, _) = p.read(0, 1 << 30, false, true).expect("readable");
    let mut bytes = Vec::new();
    for slice in &info.slices {
        slice.read_into(&mut bytes).unwrap();
    }
    // Cut at the first batch at or beyond `end`.
    let mut at = 0;
    while at + 61 <= bytes.len() {
        let base = i64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
        if base >= end {
            break;
        }
        let len = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 12 + len;
    }
    bytes.truncate(at);
    bytes
}

/// Goal: with RF 3 every replica holds the leader's batches byte for byte,
/// the ISR is all three, acks=all answers, and a stopped leader's
/// partitions carry on on another ISR member with every acknowledged
/// record kept once, in order; then the old leader comes back, catches up
/// and rejoins the ISR.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_keep_every_acknowledged_record_through_a_leader_stop() {
    let mut cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    let bootstrap = cluster.bootstrap(1);
    create_replicated(&bootstrap, "replicated", 3, "2").await;
    wait_for("every partition led with a full ISR", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "replicated");
        async move { (md.len() == 3 && md.values().all(|(l, r, i)| *l > 0 && r.len() == 3 && i.len() == 3)).then_some(md) }
    })
    .await;

    let producer = producer(&bootstrap);
    let mut expected: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for p in 0..3 {
        let values: Vec<String> = (0..200).map(|i| format!("p{p}-{i}")).collect();
        let offsets = send_all(&producer, "replicated", p, &values).await;
        assert_eq!(offsets, (0..200).collect::<Vec<i64>>(), "partition {p} offsets");
        expected.insert(p, values);
    }
    // acks=all was answered: every replica has the batches, byte for byte.
    for p in 0..3 {
        wait_for("followers to have the batches", READY, Duration::from_millis(20), || {
            let ends: Vec<(i64, i64)> = (1..=3)
                .map(|id| {
                    let o = cluster.state(id).replicas.partition("replicated", p).unwrap().offsets().unwrap();
                    (o.log_end_offset, o.high_watermark)
                })
                .collect();
            async move { ends.iter().all(|e| *e == (200, 200)).then_some(()) }
        })
        .await;
        let leader_bytes = log_bytes(&cluster, 1, "replicated", p, 200);
        assert!(!leader_bytes.is_empty());
        for id in 2..=3 {
            assert!(
                log_bytes(&cluster, id, "replicated", p, 200) == leader_bytes,
                "replica {id} of partition {p} differs"
            );
        }
    }

    // The leader of partition 0 stops; its partitions move to another ISR member.
    let md = partition_metadata(&bootstrap, "replicated");
    let old = md[&0].0;
    cluster.stop(old).await;
    let survivor = cluster.running()[0];
    let bootstrap = cluster.bootstrap(survivor);
    wait_for("partition 0 led by another ISR member", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "replicated");
        async move { md.values().all(|(l, _, isr)| *l > 0 && *l != old && !isr.contains(&old)).then_some(()) }
    })
    .await;
    let producer = self::producer(&bootstrap);
    for p in 0..3 {
        let values: Vec<String> = (200..300).map(|i| format!("p{p}-{i}")).collect();
        let offsets = send_all(&producer, "replicated", p, &values).await;
        assert_eq!(offsets, (200..300).collect::<Vec<i64>>(), "partition {p} offsets after the failover");
        expected.get_mut(&p).unwrap().extend(values);
    }
    for p in 0..3 {
        let read = read_partition(&bootstrap, "replicated", p, 300);
        let values: Vec<String> = read.iter().map(|(_, v)| v.clone()).collect();
        assert_eq!(values, expected[&p], "partition {p}: every acknowledged value once, in order");
        assert!(read.iter().enumerate().all(|(i, (o, _))| *o == i as i64));
    }

    // The old leader returns, catches up and rejoins every ISR.
    cluster.restart(old).await;
    cluster.wait_ready(READY).await;
    wait_for("the restarted replica back in every ISR", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "replicated");
        async move { md.values().all(|(_, _, isr)| isr.len() == 3).then_some(()) }
    })
    .await;
    for p in 0..3 {
        let end = cluster.state(survivor).replicas.partition("replicated", p).unwrap().high_watermark();
        assert_eq!(end, 300);
        let theirs = log_bytes(&cluster, old, "replicated", p, end);
        assert!(theirs == log_bytes(&cluster, survivor, "replicated", p, end), "restarted replica of {p} differs");
    }
    cluster.shutdown().await;
}

/// Goal: with two of three replicas stopped the ISR is one, below
/// min.insync.replicas=2: acks=all is refused with NOT_ENOUGH_REPLICAS (and
/// nothing becomes visible), acks=1 is still taken; when a replica returns
/// and rejoins, acks=all works again and the acks=1 records become visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acks_all_is_refused_below_min_insync_replicas() {
    let mut cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    create_replicated(&cluster.bootstrap(1), "guarded", 1, "2").await;
    let bootstrap = cluster.bootstrap(1);
    let leader = wait_for("a full ISR", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "guarded");
        async move { md.get(&0).filter(|(l, _, isr)| *l > 0 && isr.len() == 3).map(|(l, _, _)| *l) }
    })
    .await;
    let others: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
    for id in &others {
        cluster.stop(*id).await;
    }
    let bootstrap = cluster.bootstrap(leader);
    wait_for("the ISR down to the leader", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "guarded");
        async move { (md[&0].2 == vec![leader]).then_some(()) }
    })
    .await;
    let mut config = producer_config(&bootstrap);
    config.set("acks", "all").set("message.timeout.ms", "3000").set("retries", "0");
    let strict: FutureProducer = config.create().unwrap();
    let refused =
        strict.send(FutureRecord::to("guarded").partition(0).key("k").payload("strict"), Duration::from_secs(10)).await;
    let error = refused.expect_err("acks=all below min ISR").0;
    assert_eq!(
        error.rdkafka_error_code(),
        Some(rdkafka::types::RDKafkaErrorCode::NotEnoughReplicas),
        "refused with NOT_ENOUGH_REPLICAS: {error}"
    );
    let mut config = producer_config(&bootstrap);
    config.set("acks", "1");
    let loose: FutureProducer = config.create().unwrap();
    let d =
        loose.send(FutureRecord::to("guarded").partition(0).key("k").payload("loose"), Duration::from_secs(10)).await;
    assert_eq!(d.expect("acks=1 is taken").offset, 0);
    let p = cluster.state(leader).replicas.partition("guarded", 0).unwrap();
    assert_eq!(p.high_watermark(), 0, "below min ISR the high watermark stands still (KIP-966)");

    cluster.restart(others[0]).await;
    wait_for("the returning replica in the ISR", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "guarded");
        async move { (md[&0].2.len() == 2).then_some(()) }
    })
    .await;
    let producer = producer(&bootstrap);
    let offsets = send_all(&producer, "guarded", 0, &["after".to_string()]).await;
    assert_eq!(offsets, vec![1]);
    let read = read_partition(&bootstrap, "guarded", 0, 2);
    assert_eq!(read, vec![(0, "loose".to_string()), (1, "after".to_string())]);
    cluster.shutdown().await;
}

/// The (leader, isr) of partition `partition` of `topic` as broker `id`'s image has it.
fn image_partition(cluster: &TestCluster, id: i32, topic: &str, partition: i32) -> Option<(i32, Vec<i32>)> {
    let image = cluster.state(id).cluster().unwrap().image();
    image.partition(topic, partition).map(|p| (p.leader, p.isr.clone()))
}

/// Goal: `__consumer_offsets` and `__transaction_state` get three replicas
/// on three brokers, and the broker leading both coordinators' partitions
/// can stop in the middle of a consume-transform-produce transaction: a
/// plain offset commit made before is still there, and the transaction
/// (its records and the offsets committed in it) commits through the new
/// coordinators, which loaded its state from their replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coordinators_carry_on_when_their_leader_stops() {
    use rdkafka::consumer::CommitMode;
    use rdkafka::producer::Producer;
    let mut cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    let bootstrap = cluster.bootstrap(1);
    create_replicated(&bootstrap, "ctp-in", 2, "2").await;
    let plain = producer(&bootstrap);
    for p in 0..2 {
        let values: Vec<String> = (0..10).map(|i| format!("in-{p}-{i}")).collect();
        send_all(&plain, "ctp-in", p, &values).await;
    }

    // A plain commit of partition 1 by group "ctp" (creates __consumer_offsets).
    let group_consumer = |bootstrap: &str| -> BaseConsumer {
        let mut c = consumer_config(bootstrap);
        c.set("group.id", "ctp").set("isolation.level", "read_committed");
        c.create().unwrap()
    };
    let committer = group_consumer(&bootstrap);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("ctp-in", 1, Offset::Offset(5)).unwrap();
    tokio::task::block_in_place(|| committer.commit(&tpl, CommitMode::Sync)).expect("plain commit");

    // Another transactional id creates __transaction_state.
    let call = Duration::from_secs(60);
    let transactional = |bootstrap: &str, id: &str| -> FutureProducer {
        let mut c = producer_config(bootstrap);
        c.set("transactional.id", id).set("enable.idempotence", "true").set("message.timeout.ms", "60000");
        c.create().unwrap()
    };
    let warmup = transactional(&bootstrap, "warmup");
    tokio::task::block_in_place(|| warmup.init_transactions(call)).expect("init_transactions");
    drop(warmup);

    // Both internal topics have three replicas, all in sync.
    for topic in ["__consumer_offsets", "__transaction_state"] {
        wait_for("internal topic fully replicated", READY, Duration::from_millis(50), || {
            let t = cluster.state(1).cluster().unwrap().image().topic(topic).cloned();
            async move {
                let t = t?;
                t.partitions.values().all(|p| p.replicas.len() == 3 && p.isr.len() == 3 && p.leader > 0).then_some(())
            }
        })
        .await;
    }
    let offsets_partition = strand::group::records::partition_for("ctp", 50);
    let (coordinator, _) = image_partition(&cluster, 1, "__consumer_offsets", offsets_partition).unwrap();
    // A transactional id whose coordinator is the same broker.
    let txn_id = (0..)
        .map(|i| format!("ctp-txn-{i}"))
        .find(|id| {
            let p = strand::group::records::partition_for(id, 50);
            image_partition(&cluster, 1, "__transaction_state", p).unwrap().0 == coordinator
        })
        .unwrap();
    let survivor = (1..=3).find(|id| *id != coordinator).unwrap();
    let bootstrap = cluster.bootstrap(survivor);

    let out = transactional(&bootstrap, &txn_id);
    tokio::task::block_in_place(|| out.init_transactions(call)).expect("init_transactions");
    out.begin_transaction().unwrap();
    for i in 0..3 {
        let value = format!("out-{i}");
        out.send(FutureRecord::to("ctp-in").partition(0).key("k").payload(&value), call).await.expect("acked");
    }
    let mut positions = TopicPartitionList::new();
    positions.add_partition_offset("ctp-in", 0, Offset::Offset(10)).unwrap();
    let metadata = committer.group_metadata().unwrap();
    tokio::task::block_in_place(|| out.send_offsets_to_transaction(&positions, &metadata, call)).expect("offsets");

    // The broker coordinating both stops; the new leaders take over.
    cluster.stop(coordinator).await;
    for (topic, p) in [("__consumer_offsets", offsets_partition), ("__transaction_state", txn_partition(&txn_id))] {
        wait_for("a new coordinator", READY, Duration::from_millis(50), || {
            let now = image_partition(&cluster, survivor, topic, p);
            async move { now.filter(|(leader, _)| *leader > 0 && *leader != coordinator).map(|_| ()) }
        })
        .await;
    }
    tokio::task::block_in_place(|| out.commit_transaction(call)).expect("commit after the coordinator moved");

    // The transaction's records are visible to read_committed readers ...
    let read = read_partition(&bootstrap, "ctp-in", 0, 13);
    let values: Vec<&str> = read.iter().map(|(_, v)| v.as_str()).collect();
    assert_eq!(&values[10..], ["out-0", "out-1", "out-2"]);
    // ... and the group's offsets are the plain commit and the transaction's.
    let reader = group_consumer(&bootstrap);
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition("ctp-in", 0);
    tpl.add_partition("ctp-in", 1);
    let committed = tokio::task::block_in_place(|| reader.committed_offsets(tpl, Duration::from_secs(30))).unwrap();
    let got: Vec<(i32, Offset)> = committed.elements().iter().map(|e| (e.partition(), e.offset())).collect();
    assert_eq!(got, vec![(0, Offset::Offset(10)), (1, Offset::Offset(5))]);
    drop((plain, out, reader, metadata));
    std::mem::forget(committer);
    cluster.shutdown().await;
}

fn txn_partition(id: &str) -> i32 {
    strand::group::records::partition_for(id, 50)
}
