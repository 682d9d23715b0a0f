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
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use strand::metadata::image::LeaderRecoveryState;

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
    // To the log end: a follower's high watermark may lag the leader's
    // until its next fetch, but what is below `end` is in its log.
    let info = p.read_to_log_end(0, 1 << 30).expect("readable");
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

/// An ElectLeaders request, as `kafka-leader-election` sends it (v2), to
/// broker `id`: `partitions` `None` is every partition.
async fn elect_leaders(
    cluster: &TestCluster,
    id: i32,
    election_type: i8,
    partitions: Option<&[(&str, i32)]>,
) -> kafka_protocol::messages::ElectLeadersResponse {
    use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
    use kafka_protocol::messages::{ElectLeadersRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let topic_partitions = partitions.map(|ps| {
        ps.iter()
            .map(|(t, p)| {
                TopicPartitions::default()
                    .with_topic(TopicName(StrBytes::from_string(t.to_string())))
                    .with_partitions(vec![*p])
            })
            .collect()
    });
    let request = ElectLeadersRequest::default()
        .with_election_type(election_type)
        .with_timeout_ms(30_000)
        .with_topic_partitions(topic_partitions);
    RawConn::connect(cluster.addr(id)).await.call(&request, 2).await
}

/// (topic, partition) -> error code of an ElectLeaders response.
fn election_codes(response: &kafka_protocol::messages::ElectLeadersResponse) -> BTreeMap<(String, i32), i16> {
    response
        .replica_election_results
        .iter()
        .flat_map(|t| t.partition_result.iter().map(|p| ((t.topic.0.to_string(), p.partition_id), p.error_code)))
        .collect()
}

/// A replicated topic whose preferred leader of partition 0 was stopped,
/// written to elsewhere, restarted and is back in every ISR; returns that
/// broker. Partition 0 holds `p0-0` .. `p0-199`.
async fn preferred_leader_back_in_sync(cluster: &mut TestCluster, topic: &str) -> i32 {
    let bootstrap = cluster.bootstrap(1);
    create_replicated(&bootstrap, topic, 3, "2").await;
    let md = wait_for("every partition led with a full ISR", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, topic);
        async move { (md.len() == 3 && md.values().all(|(l, r, i)| *l == r[0] && i.len() == 3)).then_some(md) }
    })
    .await;
    let preferred = md[&0].0;
    let values: Vec<String> = (0..100).map(|i| format!("p0-{i}")).collect();
    assert_eq!(send_all(&producer(&bootstrap), topic, 0, &values).await, (0..100).collect::<Vec<i64>>());
    cluster.stop(preferred).await;
    let bootstrap = cluster.bootstrap(cluster.running()[0]);
    wait_for("partition 0 led by another replica", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, topic);
        async move { (md[&0].0 > 0 && md[&0].0 != preferred).then_some(()) }
    })
    .await;
    let values: Vec<String> = (100..200).map(|i| format!("p0-{i}")).collect();
    assert_eq!(send_all(&producer(&bootstrap), topic, 0, &values).await, (100..200).collect::<Vec<i64>>());
    cluster.restart(preferred).await;
    cluster.wait_ready(READY).await;
    wait_for("the restarted replica back in every ISR", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, topic);
        async move { md.values().all(|(_, _, isr)| isr.len() == 3).then_some(()) }
    })
    .await;
    preferred
}

/// Goal: with `auto.leader.rebalance.enable=false` a partition whose
/// preferred replica came back stays led by another until ElectLeaders
/// (PREFERRED, as `kafka-leader-election` sends it) moves it, with
/// Kafka's per-partition answers; librdkafka then writes to and reads from
/// the preferred leader with every record once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn elect_leaders_gives_partitions_back_to_their_preferred_replicas() {
    let mut cluster = TestCluster::start(3, &["auto.leader.rebalance.enable=false"]).await;
    cluster.wait_ready(READY).await;
    let preferred = preferred_leader_back_in_sync(&mut cluster, "elect").await;
    let other = *cluster.running().iter().find(|b| **b != preferred).unwrap();
    let bootstrap = cluster.bootstrap(other);
    let md = partition_metadata(&bootstrap, "elect");
    let moved: Vec<i32> = md.iter().filter(|(_, (l, r, _))| *l != r[0]).map(|(p, _)| *p).collect();
    assert!(moved.contains(&0), "not rebalanced by itself: {md:?}");

    // Every partition: only those whose election was needed are answered.
    let response = elect_leaders(&cluster, other, 0, None).await;
    assert_eq!(response.error_code, 0);
    let codes = election_codes(&response);
    let elected: Vec<i32> = codes
        .iter()
        .filter(|((t, _), _)| t == "elect")
        .map(|((_, p), c)| (*p, *c))
        .map(|(p, c)| {
            assert_eq!(c, 0, "partition {p}: {response:?}");
            p
        })
        .collect();
    assert_eq!(elected, moved, "{response:?}");
    wait_for("every partition led by its preferred replica", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "elect");
        async move { md.values().all(|(l, r, isr)| *l == r[0] && isr.len() == 3).then_some(()) }
    })
    .await;

    // Named partitions: not needed now (84), and unknown (3).
    let response = elect_leaders(&cluster, other, 0, Some(&[("elect", 0), ("elect", 9)])).await;
    let codes = election_codes(&response);
    assert_eq!(codes[&("elect".to_string(), 0)], 84, "ELECTION_NOT_NEEDED: {response:?}");
    assert_eq!(codes[&("elect".to_string(), 9)], 3, "UNKNOWN_TOPIC_OR_PARTITION: {response:?}");
    // An unclean election of a partition that has a leader is not needed either.
    let response = elect_leaders(&cluster, other, 1, Some(&[("elect", 0)])).await;
    assert_eq!(election_codes(&response)[&("elect".to_string(), 0)], 84, "{response:?}");

    let values: Vec<String> = (200..300).map(|i| format!("p0-{i}")).collect();
    let offsets = send_all(&producer(&cluster.bootstrap(preferred)), "elect", 0, &values).await;
    assert_eq!(offsets, (200..300).collect::<Vec<i64>>());
    let read = read_partition(&bootstrap, "elect", 0, 300);
    let expected: Vec<(i64, String)> = (0..300).map(|i| (i, format!("p0-{i}"))).collect();
    assert_eq!(read, expected, "every acknowledged record once, in order");
    cluster.shutdown().await;
}

/// Goal: with `auto.leader.rebalance.enable` (the default) and a short
/// `leader.imbalance.check.interval.seconds`, the controller gives a
/// partition back to its preferred replica once it is in sync again, by
/// itself; nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn preferred_leaders_return_by_themselves() {
    let mut cluster = TestCluster::start(3, &["leader.imbalance.check.interval.seconds=1"]).await;
    cluster.wait_ready(READY).await;
    let preferred = preferred_leader_back_in_sync(&mut cluster, "rebalanced").await;
    let bootstrap = cluster.bootstrap(preferred);
    wait_for("every partition led by its preferred replica", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "rebalanced");
        async move { md.values().all(|(l, r, _)| *l == r[0]).then_some(()) }
    })
    .await;
    let read = read_partition(&bootstrap, "rebalanced", 0, 200);
    let expected: Vec<(i64, String)> = (0..200).map(|i| (i, format!("p0-{i}"))).collect();
    assert_eq!(read, expected);
    cluster.shutdown().await;
}

/// A three-node cluster and topic `name` on replicas [1, 2] with
/// min.insync.replicas 1 and `configs`, where broker 2 stopped, broker 1
/// alone in the ISR took ten records and stopped too, and broker 2 was
/// restarted: the last ISR member is gone. Returns the cluster and a
/// bootstrap (broker 3).
async fn last_isr_member_gone(name: &str, configs: &[(&str, &str)]) -> (TestCluster, String) {
    let mut cluster = TestCluster::start(3, &["auto.leader.rebalance.enable=false"]).await;
    cluster.wait_ready(READY).await;
    let bootstrap = cluster.bootstrap(3);
    let admin: AdminClient<DefaultClientContext> = admin_config(&bootstrap).create().unwrap();
    let mut topic = NewTopic::new(name, 1, TopicReplication::Variable(&[&[1, 2]])).set("min.insync.replicas", "1");
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    for r in admin.create_topics([&topic], &opts).await.expect("create_topics") {
        r.expect("topic created");
    }
    wait_for("the ISR to be both replicas", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, name);
        async move { (md.get(&0) == Some(&(1, vec![1, 2], vec![1, 2]))).then_some(()) }
    })
    .await;
    cluster.stop(2).await;
    wait_for("broker 2 out of the ISR", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, name);
        async move { (md[&0].2 == vec![1]).then_some(()) }
    })
    .await;
    let lost: Vec<String> = (0..10).map(|i| format!("old-{i}")).collect();
    assert_eq!(send_all(&producer(&bootstrap), name, 0, &lost).await, (0..10).collect::<Vec<i64>>());
    cluster.stop(1).await;
    cluster.restart(2).await;
    (cluster, bootstrap)
}

/// (leader, ISR, leader recovery state) of partition 0 of `name` in broker
/// 3's metadata image.
fn recovery(cluster: &TestCluster, name: &str) -> Option<(i32, Vec<i32>, LeaderRecoveryState)> {
    let image = cluster.state(3).cluster().unwrap().image();
    image.partition(name, 0).map(|p| (p.leader, p.isr.clone(), p.leader_recovery_state))
}

/// After an unclean election of broker 2: it takes five records; broker 1
/// returns, cuts its ten divergent records, rejoins the ISR (the leader
/// RECOVERED by that change), and the two logs are byte-identical.
async fn new_leader_takes_writes_and_old_rejoins(cluster: &mut TestCluster, bootstrap: &str, name: &str) {
    let kept: Vec<String> = (0..5).map(|i| format!("new-{i}")).collect();
    assert_eq!(send_all(&producer(bootstrap), name, 0, &kept).await, (0..5).collect::<Vec<i64>>());
    cluster.restart(1).await;
    wait_for("broker 1 back in the ISR, the leader recovered", READY, Duration::from_millis(50), || {
        let now = recovery(cluster, name);
        async move { matches!(now, Some((2, isr, LeaderRecoveryState::Recovered)) if isr.len() == 2).then_some(()) }
    })
    .await;
    let read = read_partition(bootstrap, name, 0, 5);
    assert_eq!(read, kept.iter().enumerate().map(|(i, v)| (i as i64, v.clone())).collect::<Vec<_>>());
    let end = cluster.state(2).replicas.partition(name, 0).unwrap().high_watermark();
    assert_eq!(end, 5);
    assert!(log_bytes(cluster, 1, name, 0, end) == log_bytes(cluster, 2, name, 0, end), "logs differ");
}

/// Goal: a partition whose only ISR member is gone gets a leader only when
/// asked (ElectLeaders UNCLEAN): the first live replica, alone in the ISR
/// and RECOVERING (KIP-704), which takes writes at once; the old leader,
/// back, cuts its divergent tail where the new leader's epochs say, catches
/// up and rejoins, its log byte-identical to the new leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unclean_election_gives_a_leaderless_partition_a_live_replica() {
    let (mut cluster, bootstrap) = last_isr_member_gone("unclean", &[]).await;
    wait_for("the partition without a leader, broker 2 up", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "unclean");
        let up = cluster.state(3).cluster().unwrap().image().brokers.get(&2).is_some_and(|b| b.is_active());
        async move { (up && md[&0].0 == -1).then_some(()) }
    })
    .await;
    // A preferred election cannot help (broker 1 is gone); an unclean one can.
    let response = elect_leaders(&cluster, 3, 0, Some(&[("unclean", 0)])).await;
    assert_eq!(
        election_codes(&response)[&("unclean".to_string(), 0)],
        80,
        "PREFERRED_LEADER_NOT_AVAILABLE: {response:?}"
    );
    let response = elect_leaders(&cluster, 3, 1, Some(&[("unclean", 0)])).await;
    assert_eq!(election_codes(&response)[&("unclean".to_string(), 0)], 0, "{response:?}");
    wait_for("broker 2 leading alone", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "unclean");
        async move { (md[&0].0 == 2 && md[&0].2 == vec![2]).then_some(()) }
    })
    .await;
    assert_eq!(recovery(&cluster, "unclean"), Some((2, vec![2], LeaderRecoveryState::Recovering)));
    new_leader_takes_writes_and_old_rejoins(&mut cluster, &bootstrap, "unclean").await;
    cluster.shutdown().await;
}

/// Goal: with the topic's `unclean.leader.election.enable=true`, a partition
/// whose only ISR member is gone gets the first live replica as leader by
/// itself (no ElectLeaders call), RECOVERING (KIP-704) until the old leader
/// is back in its ISR; the records only the old leader held are lost, as
/// the operator chose, and the logs end identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unclean_leader_election_enable_elects_a_live_replica_by_itself() {
    let configs = [("unclean.leader.election.enable", "true")];
    let (mut cluster, bootstrap) = last_isr_member_gone("auto-unclean", &configs).await;
    wait_for("broker 2 leading by itself, recovering", READY, Duration::from_millis(50), || {
        let now = recovery(&cluster, "auto-unclean");
        async move { (now == Some((2, vec![2], LeaderRecoveryState::Recovering))).then_some(()) }
    })
    .await;
    new_leader_takes_writes_and_old_rejoins(&mut cluster, &bootstrap, "auto-unclean").await;
    cluster.shutdown().await;
}

/// An AlterPartitionReassignments request (v1, as Kafka 4.1's admin client
/// sends it) to broker `id`: each partition's target, or `None` to cancel.
async fn reassign(
    cluster: &TestCluster,
    id: i32,
    partitions: &[(&str, i32, Option<&[i32]>)],
) -> BTreeMap<(String, i32), i16> {
    use kafka_protocol::messages::alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
    use kafka_protocol::messages::{AlterPartitionReassignmentsRequest, BrokerId, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let topics = partitions
        .iter()
        .map(|(t, p, target)| {
            let replicas = target.map(|r| r.iter().map(|b| BrokerId(*b)).collect());
            ReassignableTopic::default().with_name(TopicName(StrBytes::from_string(t.to_string()))).with_partitions(
                vec![ReassignablePartition::default().with_partition_index(*p).with_replicas(replicas)],
            )
        })
        .collect();
    let request = AlterPartitionReassignmentsRequest::default()
        .with_timeout_ms(30_000)
        .with_allow_replication_factor_change(true)
        .with_topics(topics);
    let response: kafka_protocol::messages::AlterPartitionReassignmentsResponse =
        RawConn::connect(cluster.addr(id)).await.call(&request, 1).await;
    assert_eq!(response.error_code, 0, "{response:?}");
    response
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| ((t.name.0.to_string(), p.partition_index), p.error_code)))
        .collect()
}

/// ListPartitionReassignments of every partition, from broker `id`:
/// (topic, partition) -> (replicas, adding, removing).
async fn reassignments(cluster: &TestCluster, id: i32) -> BTreeMap<(String, i32), (Vec<i32>, Vec<i32>, Vec<i32>)> {
    use kafka_protocol::messages::ListPartitionReassignmentsRequest;
    let request = ListPartitionReassignmentsRequest::default().with_timeout_ms(30_000).with_topics(None);
    let response: kafka_protocol::messages::ListPartitionReassignmentsResponse =
        RawConn::connect(cluster.addr(id)).await.call(&request, 0).await;
    assert_eq!(response.error_code, 0, "{response:?}");
    let ids = |v: &[kafka_protocol::messages::BrokerId]| v.iter().map(|b| b.0).collect::<Vec<i32>>();
    response
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                let state = (ids(&p.replicas), ids(&p.adding_replicas), ids(&p.removing_replicas));
                ((t.name.0.to_string(), p.partition_index), state)
            })
        })
        .collect()
}

/// Goal: AlterPartitionReassignments moves a replica, the leader's, to a
/// broker that had none: the new replica catches up and joins the ISR
/// before the old one leaves (and deletes its copy), leadership moves to
/// the target, and librdkafka reads every acknowledged record once, in
/// order, and writes on. A reassignment to a stopped broker stays in
/// progress (listed, the partition led all along) until cancelled, which
/// puts the replicas back; bad targets get Kafka's codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reassignment_moves_a_replica_and_a_cancelled_one_goes_back() {
    let mut cluster = TestCluster::start(3, &["auto.leader.rebalance.enable=false"]).await;
    cluster.wait_ready(READY).await;
    let bootstrap = cluster.bootstrap(3);
    let admin: AdminClient<DefaultClientContext> = admin_config(&bootstrap).create().unwrap();
    let topic = NewTopic::new("moved", 1, TopicReplication::Variable(&[&[1, 2]])).set("min.insync.replicas", "1");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    for r in admin.create_topics([&topic], &opts).await.expect("create_topics") {
        r.expect("topic created");
    }
    wait_for("the ISR to be both replicas", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "moved");
        async move { (md.get(&0) == Some(&(1, vec![1, 2], vec![1, 2]))).then_some(()) }
    })
    .await;
    let first: Vec<String> = (0..200).map(|i| format!("v-{i}")).collect();
    assert_eq!(send_all(&producer(&bootstrap), "moved", 0, &first).await, (0..200).collect::<Vec<i64>>());

    // Move the leader's replica from broker 1 to broker 3.
    let codes = reassign(&cluster, 3, &[("moved", 0, Some(&[3, 2]))]).await;
    assert_eq!(codes[&("moved".to_string(), 0)], 0, "{codes:?}");
    let image = |cluster: &TestCluster| cluster.state(3).cluster().unwrap().image();
    wait_for("the reassignment to complete", READY, Duration::from_millis(50), || {
        let p = image(&cluster).partition("moved", 0).cloned().unwrap();
        async move { (!p.is_reassigning() && p.replicas == vec![3, 2]).then_some(()) }
    })
    .await;
    let p = image(&cluster).partition("moved", 0).cloned().unwrap();
    let mut isr = p.isr.clone();
    isr.sort_unstable();
    assert_eq!((p.leader, isr), (3, vec![2, 3]), "leadership moved to the target with both in sync: {p:?}");
    // Broker 2 applies the completing record when the metadata log reaches it.
    wait_for("broker 2 to list no reassignment", READY, Duration::from_millis(50), || async {
        reassignments(&cluster, 2).await.is_empty().then_some(())
    })
    .await;
    wait_for("broker 1 to drop its copy", READY, Duration::from_millis(50), || {
        let gone = cluster.state(1).replicas.partition("moved", 0).is_none();
        async move { gone.then_some(()) }
    })
    .await;
    let read = read_partition(&bootstrap, "moved", 0, 200);
    assert_eq!(read, first.iter().enumerate().map(|(i, v)| (i as i64, v.clone())).collect::<Vec<_>>());
    let end = cluster.state(3).replicas.partition("moved", 0).unwrap().high_watermark();
    assert_eq!(end, 200);
    assert!(log_bytes(&cluster, 3, "moved", 0, end) == log_bytes(&cluster, 2, "moved", 0, end), "logs differ");
    let more: Vec<String> = (200..250).map(|i| format!("v-{i}")).collect();
    assert_eq!(send_all(&producer(&bootstrap), "moved", 0, &more).await, (200..250).collect::<Vec<i64>>());

    // Bad requests.
    let codes =
        reassign(&cluster, 2, &[("moved", 0, Some(&[3, 9])), ("moved", 7, Some(&[3])), ("moved", 0, Some(&[]))]).await;
    assert_eq!(codes[&("moved".to_string(), 7)], 3, "UNKNOWN_TOPIC_OR_PARTITION: {codes:?}");
    assert_eq!(codes[&("moved".to_string(), 0)], 39, "INVALID_REPLICA_ASSIGNMENT: {codes:?}");
    let codes = reassign(&cluster, 2, &[("moved", 0, None)]).await;
    assert_eq!(codes[&("moved".to_string(), 0)], 85, "NO_REASSIGNMENT_IN_PROGRESS: {codes:?}");

    // A reassignment adding a stopped broker waits, listed, the partition led.
    cluster.stop(1).await;
    let codes = reassign(&cluster, 2, &[("moved", 0, Some(&[1, 3, 2]))]).await;
    assert_eq!(codes[&("moved".to_string(), 0)], 0, "{codes:?}");
    let ongoing = wait_for("broker 2 to list the reassignment", READY, Duration::from_millis(50), || async {
        let ongoing = reassignments(&cluster, 2).await;
        (!ongoing.is_empty()).then_some(ongoing)
    })
    .await;
    assert_eq!(ongoing[&("moved".to_string(), 0)], (vec![1, 3, 2], vec![1], vec![]), "{ongoing:?}");
    let during: Vec<String> = (250..260).map(|i| format!("v-{i}")).collect();
    assert_eq!(send_all(&producer(&bootstrap), "moved", 0, &during).await, (250..260).collect::<Vec<i64>>());
    assert_eq!(image(&cluster).partition("moved", 0).unwrap().leader, 3);
    let codes = reassign(&cluster, 3, &[("moved", 0, None)]).await;
    assert_eq!(codes[&("moved".to_string(), 0)], 0, "{codes:?}");
    let p = wait_for("broker 3 to apply the cancel", READY, Duration::from_millis(50), || {
        let p = image(&cluster).partition("moved", 0).cloned().unwrap();
        async move { (!p.is_reassigning()).then_some(p) }
    })
    .await;
    assert_eq!((p.replicas.as_slice(), p.leader), (&[3, 2][..], 3), "{p:?}");
    assert!(reassignments(&cluster, 3).await.is_empty());
    cluster.restart(1).await;
    cluster.wait_ready(READY).await;
    let read = read_partition(&bootstrap, "moved", 0, 260);
    assert_eq!(read.len(), 260);
    assert!(read.iter().enumerate().all(|(i, (o, v))| *o == i as i64 && *v == format!("v-{i}")));
    assert!(cluster.state(1).replicas.partition("moved", 0).is_none(), "broker 1 is not a replica after the cancel");
    cluster.shutdown().await;
}

/// (leader, ISR, ELR, last known ELR; the lists sorted) of partition 0 of `topic`, as
/// DescribeTopicPartitions (Kafka 4.1's `kafka-topics --describe`) answers
/// on broker `id`.
async fn eligible_replicas(cluster: &TestCluster, id: i32, topic: &str) -> (i32, Vec<i32>, Vec<i32>, Vec<i32>) {
    use kafka_protocol::messages::describe_topic_partitions_request::TopicRequest;
    use kafka_protocol::messages::{DescribeTopicPartitionsRequest, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let request = DescribeTopicPartitionsRequest::default()
        .with_topics(vec![TopicRequest::default().with_name(TopicName(StrBytes::from_string(topic.to_string())))])
        .with_response_partition_limit(10);
    let response = RawConn::connect(cluster.addr(id)).await.call(&request, 0).await;
    let p = &response.topics[0].partitions[0];
    // Sets, in id order.
    let ids = |v: &[kafka_protocol::messages::BrokerId]| {
        let mut ids = v.iter().map(|b| b.0).collect::<Vec<i32>>();
        ids.sort_unstable();
        ids
    };
    let list = |v: &Option<Vec<kafka_protocol::messages::BrokerId>>| ids(v.as_deref().unwrap_or_default());
    (p.leader_id.0, ids(&p.isr_nodes), list(&p.eligible_leader_replicas), list(&p.last_known_elr))
}

/// Waits until broker 5 describes partition `elr`-0 as `want`.
async fn state_is(cluster: &TestCluster, want: (i32, Vec<i32>, Vec<i32>, Vec<i32>), what: &str) {
    let got = std::sync::Mutex::new(None);
    let waited = tokio::time::timeout(READY, async {
        loop {
            let now = eligible_replicas(cluster, 5, "elr").await;
            if now == want {
                return;
            }
            *got.lock().unwrap() = Some(now);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}: want {want:?}, last {:?}", got.lock().unwrap());
}

/// Eligible leader replicas (KIP-966) through real brokers: a replica that
/// left the ISR below min.insync.replicas stays eligible and leads once the
/// ISR is empty, while the last ISR member, back from what its log
/// directory says was a crash (no clean-shutdown marker), may not, as it may
/// have lost its unflushed tail. Broker 5 holds no replica and answers the
/// checks while the others are down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_eligible_replica_leads_over_the_last_isr_member_back_from_a_crash() {
    use common::cluster::Role;
    let roles = [Role::Controller, Role::Broker, Role::Broker, Role::Broker, Role::Broker];
    let mut cluster = TestCluster::start_roles(&roles, &["auto.leader.rebalance.enable=false"]).await;
    cluster.wait_ready(READY).await;
    let bootstrap = cluster.bootstrap(5);
    let admin: AdminClient<DefaultClientContext> = admin_config(&bootstrap).create().unwrap();
    let topic = NewTopic::new("elr", 1, TopicReplication::Variable(&[&[2, 3, 4]])).set("min.insync.replicas", "2");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    for r in admin.create_topics([&topic], &opts).await.expect("create_topics") {
        r.expect("topic created");
    }
    let values: Vec<String> = (0..20).map(|i| format!("v-{i}")).collect();
    assert_eq!(send_all(&producer(&bootstrap), "elr", 0, &values).await, (0..20).collect::<Vec<i64>>());
    // 3 stops: the ISR is still at min ISR, nobody is eligible.
    cluster.stop(3).await;
    state_is(&cluster, (2, vec![2, 4], vec![], vec![]), "3 out of the ISR").await;
    // 4 stops cleanly: below min ISR it stays eligible.
    cluster.stop(4).await;
    state_is(&cluster, (2, vec![2], vec![4], vec![]), "4 eligible").await;
    // 2, the last in the ISR, stops: no leader, both eligible, 2 the last leader.
    cluster.stop(2).await;
    state_is(&cluster, (-1, vec![], vec![2, 4], vec![2]), "2 eligible too").await;
    // 2 comes back as if it had crashed: it is not eligible any more and
    // does not lead.
    let marker = cluster.config(1).log_dir.join(strand::replica::CLEAN_SHUTDOWN_FILE);
    std::fs::remove_file(&marker).expect("broker 2 wrote its clean-shutdown marker");
    cluster.restart(2).await;
    wait_for("broker 2 registered and unfenced", READY, Duration::from_millis(50), || {
        let up = cluster.state(5).cluster().unwrap().image().brokers.get(&2).is_some_and(|b| b.is_active());
        async move { up.then_some(()) }
    })
    .await;
    state_is(&cluster, (-1, vec![], vec![4], vec![2]), "2 not eligible after a crash").await;
    // 4, eligible, comes back and leads; 2 follows and rejoins; at min ISR
    // again nobody is eligible.
    cluster.restart(4).await;
    state_is(&cluster, (4, vec![2, 4], vec![], vec![]), "4 leading with 2 back in sync").await;
    let read = read_partition(&bootstrap, "elr", 0, 20);
    assert_eq!(read, values.iter().enumerate().map(|(i, v)| (i as i64, v.clone())).collect::<Vec<_>>());
    cluster.restart(3).await;
    cluster.shutdown().await;
}

/// Goal: DeleteRecords is answered once every live replica cut its log
/// (Kafka's low watermark), not when the leader alone did: right after the
/// answer every replica's log starts at the offset asked for. A replica on
/// a fenced broker does not hold the answer back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_records_waits_for_every_live_replica() {
    let mut cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    let bootstrap = cluster.bootstrap(1);
    create_replicated(&bootstrap, "trimmed", 1, "1").await;
    let leader = wait_for("a full ISR", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "trimmed");
        async move { md.get(&0).filter(|(l, _, isr)| *l > 0 && isr.len() == 3).map(|(l, _, _)| *l) }
    })
    .await;
    let bootstrap = cluster.bootstrap(leader);
    let values: Vec<String> = (0..100).map(|i| format!("v{i}")).collect();
    send_all(&producer(&bootstrap), "trimmed", 0, &values).await;
    let admin: AdminClient<DefaultClientContext> = admin_config(&bootstrap).create().unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    let log_start = |cluster: &TestCluster, id: i32| {
        cluster.state(id).replicas.partition("trimmed", 0).unwrap().offsets().unwrap().log_start_offset
    };
    let delete = |offset: i64| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("trimmed", 0, Offset::Offset(offset)).unwrap();
        let (admin, opts) = (&admin, &opts);
        async move {
            let deleted = admin.delete_records(&tpl, opts).await.expect("DeleteRecords");
            let e = &deleted.elements()[0];
            assert!(e.error().is_ok(), "DeleteRecords to {offset}: {:?}", e.error());
            e.offset()
        }
    };

    assert_eq!(delete(60).await, Offset::Offset(60), "the low watermark answered");
    for id in 1..=3 {
        assert_eq!(log_start(&cluster, id), 60, "broker {id}'s replica cut before the answer");
    }

    // A follower stops; once its broker is fenced it no longer counts.
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.stop(follower).await;
    wait_for("the stopped follower fenced", READY, Duration::from_millis(50), || {
        let fenced = cluster.state(leader).cluster().unwrap().image().brokers.get(&follower).is_none_or(|b| b.fenced);
        async move { fenced.then_some(()) }
    })
    .await;
    assert_eq!(delete(80).await, Offset::Offset(80));
    for id in (1..=3).filter(|id| *id != follower) {
        assert_eq!(log_start(&cluster, id), 80, "broker {id}'s replica cut before the answer");
    }
    // Back, it catches up with the cut.
    cluster.restart(follower).await;
    wait_for("the returning follower's log cut", READY, Duration::from_millis(50), || {
        let start = cluster.state(follower).replicas.partition("trimmed", 0).and_then(|p| p.offsets().ok());
        async move { start.filter(|o| o.log_start_offset == 80).map(|_| ()) }
    })
    .await;
    cluster.shutdown().await;
}

/// Sets the configs of `resource` to exactly `pairs` (AlterConfigs).
async fn alter_configs(bootstrap: &str, resource: ResourceSpecifier<'_>, pairs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = admin_config(bootstrap).create().unwrap();
    let mut alter = AlterConfig::new(resource);
    for (k, v) in pairs {
        alter = alter.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    for r in admin.alter_configs([&alter], &opts).await.expect("alter_configs") {
        r.unwrap_or_else(|(what, code)| panic!("altering {what:?} {pairs:?}: {code:?}"));
    }
}

/// Seconds from a stopped follower's restart to its return to the ISR,
/// after `bytes` were written without it.
async fn catch_up_seconds(cluster: &mut TestCluster, leader: i32, follower: i32, bytes: usize) -> f64 {
    let bootstrap = cluster.bootstrap(leader);
    cluster.stop(follower).await;
    wait_for("the stopped follower out of the ISR", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "throttled");
        async move { md.get(&0).filter(|(_, _, isr)| !isr.contains(&follower)).map(|_| ()) }
    })
    .await;
    let values: Vec<String> = (0..bytes / 1000).map(|i| format!("{i:0>1000}")).collect();
    send_all(&producer(&bootstrap), "throttled", 0, &values).await;
    let started = std::time::Instant::now();
    cluster.restart(follower).await;
    wait_for("the restarted follower back in the ISR", Duration::from_secs(60), Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "throttled");
        async move { md.get(&0).filter(|(_, _, isr)| isr.contains(&follower)).map(|_| ()) }
    })
    .await;
    started.elapsed().as_secs_f64()
}

/// Replication throttles as `kafka-reassign-partitions --throttle` sets
/// them: topic `*.replication.throttled.replicas` and broker
/// `*.replication.throttled.rate`. An in-sync replica is never held back
/// (acks=all goes on at 1 byte/s); a returning follower catches up no faster
/// than the leader's or its own rate allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replication_throttles_bound_a_returning_followers_catch_up() {
    let mut cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    let bootstrap = cluster.bootstrap(1);
    create_replicated(&bootstrap, "throttled", 1, "1").await;
    let leader = wait_for("a full ISR", READY, Duration::from_millis(50), || {
        let md = partition_metadata(&bootstrap, "throttled");
        async move { md.get(&0).filter(|(l, _, isr)| *l > 0 && isr.len() == 3).map(|(l, _, _)| *l) }
    })
    .await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let bootstrap = cluster.bootstrap(leader);
    let every_replica =
        [("leader.replication.throttled.replicas", "*"), ("follower.replication.throttled.replicas", "*")];
    alter_configs(&bootstrap, ResourceSpecifier::Topic("throttled"), &every_replica).await;
    for id in 1..=3 {
        let rates = [("leader.replication.throttled.rate", "1"), ("follower.replication.throttled.rate", "1")];
        alter_configs(&cluster.bootstrap(id), ResourceSpecifier::Broker(id), &rates).await;
    }
    // In sync, nothing is held back: 1 byte/s would take days.
    let values: Vec<String> = (0..200).map(|i| format!("{i:0>1000}")).collect();
    send_all(&producer(&bootstrap), "throttled", 0, &values).await;
    assert_eq!(partition_metadata(&bootstrap, "throttled")[&0].2.len(), 3, "every replica still in sync");

    // 2 MB to catch up at 400 kB/s (one second of it may go at once): 4 s at least.
    const BYTES: usize = 2_000_000;
    const RATE: &str = "400000";
    let at_least = (BYTES as f64 - 400_000.0) / 400_000.0 * 0.9;
    for id in 1..=3 {
        let rates: &[(&str, &str)] = if id == leader { &[("leader.replication.throttled.rate", RATE)] } else { &[] };
        alter_configs(&cluster.bootstrap(id), ResourceSpecifier::Broker(id), rates).await;
    }
    let leader_side = catch_up_seconds(&mut cluster, leader, follower, BYTES).await;
    assert!(leader_side >= at_least, "throttled by the leader, caught up in {leader_side:.2} s (< {at_least:.2} s)");

    for id in 1..=3 {
        let rates: &[(&str, &str)] =
            if id == follower { &[("follower.replication.throttled.rate", RATE)] } else { &[] };
        alter_configs(&cluster.bootstrap(id), ResourceSpecifier::Broker(id), rates).await;
    }
    let follower_side = catch_up_seconds(&mut cluster, leader, follower, BYTES).await;
    assert!(
        follower_side >= at_least,
        "throttled by the follower, caught up in {follower_side:.2} s (< {at_least:.2} s)"
    );

    // Throttled replicas listed by partition:broker: the follower named, not the others.
    alter_configs(
        &bootstrap,
        ResourceSpecifier::Topic("throttled"),
        &[("follower.replication.throttled.replicas", &format!("0:{follower}"))],
    )
    .await;
    let listed = catch_up_seconds(&mut cluster, leader, follower, BYTES).await;
    assert!(listed >= at_least, "listed 0:{follower}, caught up in {listed:.2} s (< {at_least:.2} s)");
    alter_configs(&bootstrap, ResourceSpecifier::Topic("throttled"), &[]).await;
    let unthrottled = catch_up_seconds(&mut cluster, leader, follower, BYTES).await;
    println!(
        "throttle figures: 2 MB caught up in {leader_side:.2} s (leader at 400 kB/s), {follower_side:.2} s \
         (follower at 400 kB/s), {listed:.2} s (listed replica), {unthrottled:.2} s (no throttle)"
    );
    cluster.shutdown().await;
}
