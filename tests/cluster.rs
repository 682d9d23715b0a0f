//! Three combined broker+controller nodes in one process, used through
//! librdkafka bootstrapped from a single node: topics are created through
//! any broker and spread over all three, every partition is served by the
//! broker the controller placed it on, a broker that does not lead a
//! partition answers NOT_LEADER_OR_FOLLOWER naming the leader (KIP-951),
//! producer ids are unique across brokers, deleted topics' data is gone
//! when the name is reused, and the cluster carries on when its active
//! controller stops and after all three restart.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use common::cluster::{Role, TestCluster};
use common::*;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    FindCoordinatorRequest, InitProducerIdRequest, MetadataRequest, ProduceRequest, TopicName,
};
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

const READY: Duration = Duration::from_secs(30);

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    admin_config(bootstrap).create().expect("admin client")
}

async fn create_topic(bootstrap: &str, name: &str, partitions: i32, rf: i32) -> Result<(), String> {
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(rf));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    let results = admin(bootstrap).create_topics([&topic], &opts).await.map_err(|e| e.to_string())?;
    results.into_iter().next().unwrap().map(|_| ()).map_err(|(_, e)| e.to_string())
}

/// Leader of each partition of `topic`, as librdkafka's Metadata shows it from `bootstrap`.
fn leaders(bootstrap: &str, topic: &str) -> (BTreeSet<i32>, BTreeMap<i32, i32>) {
    let consumer: BaseConsumer = consumer_config(bootstrap).create().unwrap();
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let brokers = md.brokers().iter().map(|b| b.id()).collect();
    let t = md.topics().iter().find(|t| t.name() == topic).expect("topic in metadata");
    (brokers, t.partitions().iter().map(|p| (p.id(), p.leader())).collect())
}

/// Produces `n` values per partition through a producer bootstrapped from one node.
async fn produce_all(bootstrap: &str, topic: &str, partitions: i32, n: usize, idempotent: bool) -> Vec<(i32, i64)> {
    let mut config = producer_config(bootstrap);
    if idempotent {
        config.set("enable.idempotence", "true");
    }
    let producer: FutureProducer = config.create().unwrap();
    let mut acked = Vec::new();
    for p in 0..partitions {
        for i in 0..n {
            let value = format!("{topic}-{p}-{i}");
            let record = FutureRecord::to(topic).partition(p).key("k").payload(&value);
            let delivery = producer.send(record, Duration::from_secs(30)).await.expect("acked");
            acked.push((delivery.partition, delivery.offset));
        }
    }
    acked
}

/// Reads every partition of `topic` from the beginning (assign mode): values by partition.
fn read_all(bootstrap: &str, topic: &str, partitions: i32, expected: usize) -> BTreeMap<i32, Vec<String>> {
    let consumer: BaseConsumer = consumer_config(bootstrap).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while out.values().map(Vec::len).sum::<usize>() < expected {
        assert!(std::time::Instant::now() < deadline, "read {out:?}, expected {expected} values");
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let v = String::from_utf8(m.payload().unwrap_or_default().to_vec()).unwrap();
                out.entry(m.partition()).or_default().push(v);
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) | None => {}
            Some(Err(e)) => panic!("consume error: {e}"),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_brokers_spread_serve_and_reroute() {
    let cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;

    // Created through node 1; the placement covers all three brokers.
    create_topic(&cluster.bootstrap(1), "spread", 6, 1).await.expect("topic created");
    let (brokers, leaders_seen) = leaders(&cluster.bootstrap(2), "spread");
    assert_eq!(brokers, BTreeSet::from([1, 2, 3]), "Metadata lists every broker");
    assert_eq!(leaders_seen.len(), 6);
    let leading: BTreeSet<i32> = leaders_seen.values().copied().collect();
    assert_eq!(leading, BTreeSet::from([1, 2, 3]), "leaders {leaders_seen:?} cover every broker");
    for (p, leader) in &leaders_seen {
        let hosted = cluster.state(*leader).replicas.partition("spread", *p).is_some();
        assert!(hosted, "partition {p} is led by {leader}, which must host its log");
        for other in [1, 2, 3].iter().filter(|b| *b != leader) {
            assert!(cluster.state(*other).replicas.partition("spread", *p).is_none());
        }
    }

    // A producer bootstrapped from node 3 only reaches every leader; a
    // consumer bootstrapped from node 1 reads everything back in order.
    let acked = produce_all(&cluster.bootstrap(3), "spread", 6, 20, false).await;
    assert_eq!(acked.len(), 120);
    let read = read_all(&cluster.bootstrap(1), "spread", 6, 120);
    for p in 0..6 {
        let expected: Vec<String> = (0..20).map(|i| format!("spread-{p}-{i}")).collect();
        assert_eq!(read.get(&p), Some(&expected), "partition {p}");
    }

    // A broker that does not lead partition 0 says so, and who does (KIP-951).
    let leader0 = leaders_seen[&0];
    let wrong = [1, 2, 3].into_iter().find(|b| *b != leader0).unwrap();
    let mut conn = RawConn::connect(cluster.addr(wrong)).await;
    let batch = strand_storage_test_batch();
    let req =
        ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(kafka_protocol::protocol::StrBytes::from_static_str("spread")))
                .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(batch))])]);
    let resp = conn.call(&req, 11).await;
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 6, "NOT_LEADER_OR_FOLLOWER from broker {wrong}");
    assert_eq!(p.current_leader.leader_id.0, leader0);
    let endpoint = resp.node_endpoints.iter().find(|e| e.node_id.0 == leader0).expect("leader's endpoint");
    assert_eq!(endpoint.port as u16, cluster.node(leader0).client_port);

    // Idempotent producers on different brokers get different producer ids.
    let mut ids = HashSet::new();
    for b in [1, 2, 3] {
        let mut conn = RawConn::connect(cluster.addr(b)).await;
        for _ in 0..3 {
            let resp = conn
                .call(
                    &InitProducerIdRequest::default().with_transactional_id(None).with_transaction_timeout_ms(60_000),
                    4,
                )
                .await;
            assert_eq!(resp.error_code, 0);
            assert!(ids.insert(resp.producer_id.0), "producer id {} handed out twice", resp.producer_id.0);
        }
    }
    let acked = produce_all(&cluster.bootstrap(2), "spread", 6, 5, true).await;
    assert_eq!(acked.len(), 30);

    // A replication factor above the live brokers is refused; up to it, taken.
    let err = create_topic(&cluster.bootstrap(2), "too-many", 1, 4).await.unwrap_err();
    assert!(err.contains("InvalidReplicationFactor") || err.contains("replication"), "{err}");
    create_topic(&cluster.bootstrap(2), "replicated", 1, 2).await.expect("two replicas on three brokers");

    describe_quorum_and_features(&cluster).await;
    describe_topic_partitions_pages(&cluster, &leaders_seen).await;
    cluster.shutdown().await;
}

/// DescribeTopicPartitions (what Kafka 4.1's `kafka-topics --describe`
/// sends) answers topics in name order, an unknown one with
/// UNKNOWN_TOPIC_OR_PARTITION, at most ResponsePartitionLimit partitions per
/// response with a cursor naming where the next starts; a cursor outside
/// the topics asked for is INVALID_REQUEST.
async fn describe_topic_partitions_pages(cluster: &TestCluster, spread_leaders: &BTreeMap<i32, i32>) {
    use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
    use kafka_protocol::messages::{DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse};
    use kafka_protocol::protocol::StrBytes;
    let name = |n: &str| TopicName(StrBytes::from_string(n.to_string()));
    let request = |cursor: Option<(&str, i32)>| {
        DescribeTopicPartitionsRequest::default()
            .with_topics(["spread", "replicated", "nope"].map(|t| TopicRequest::default().with_name(name(t))).to_vec())
            .with_response_partition_limit(4)
            .with_cursor(cursor.map(|(t, p)| Cursor::default().with_topic_name(name(t)).with_partition_index(p)))
    };
    // (topic, error, partitions as (index, leader, replicas, isr)) per topic.
    type Page = Vec<(String, i16, Vec<(i32, i32, Vec<i32>, Vec<i32>)>)>;
    let summary = |r: &DescribeTopicPartitionsResponse| -> Page {
        let ids = |v: &[kafka_protocol::messages::BrokerId]| v.iter().map(|b| b.0).collect::<Vec<i32>>();
        r.topics
            .iter()
            .map(|t| {
                let parts = t
                    .partitions
                    .iter()
                    .map(|p| (p.partition_index, p.leader_id.0, ids(&p.replica_nodes), ids(&p.isr_nodes)))
                    .collect();
                (t.name.as_ref().unwrap().0.to_string(), t.error_code, parts)
            })
            .collect()
    };
    let mut conn = RawConn::connect(cluster.addr(2)).await;
    // "replicated" was just created: wait until broker 2's image has it.
    let deadline = std::time::Instant::now() + READY;
    let first: DescribeTopicPartitionsResponse = loop {
        let r: DescribeTopicPartitionsResponse = conn.call(&request(None), 0).await;
        if r.topics.iter().filter(|t| t.error_code == 0).count() == 2 {
            break r;
        }
        assert!(std::time::Instant::now() < deadline, "broker 2 never knew both topics: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let page = summary(&first);
    let spread = |p: i32| {
        let l = spread_leaders[&p];
        (p, l, vec![l], vec![l])
    };
    assert_eq!(
        page.iter().map(|t| (t.0.as_str(), t.1)).collect::<Vec<_>>(),
        [("nope", 3), ("replicated", 0), ("spread", 0)]
    );
    let replicated = &page[1].2;
    assert_eq!((replicated.len(), replicated[0].2.len()), (1, 2), "{replicated:?}");
    assert_eq!(page[2].2, (0..3).map(spread).collect::<Vec<_>>());
    let next = first.next_cursor.as_ref().expect("a cursor: three partitions of spread are left");
    assert_eq!((next.topic_name.0.as_str(), next.partition_index), ("spread", 3));

    let second: DescribeTopicPartitionsResponse = conn.call(&request(Some(("spread", 3))), 0).await;
    let page = summary(&second);
    assert_eq!(page, vec![("spread".to_string(), 0, (3..6).map(spread).collect())]);
    assert!(second.next_cursor.is_none());

    let bad: DescribeTopicPartitionsResponse = conn.call(&request(Some(("elsewhere", 0))), 0).await;
    assert_eq!(bad.topics.iter().map(|t| t.error_code).collect::<Vec<_>>(), [42], "INVALID_REQUEST: {bad:?}");
}

/// DescribeQuorum (kafka-metadata-quorum) on a broker that is not the active
/// controller is answered with the leader's view; ApiVersions carries the
/// cluster's metadata.version and eligible.leader.replicas.version
/// (kafka-features describe).
async fn describe_quorum_and_features(cluster: &TestCluster) {
    use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
    let active = cluster.active_controller().expect("an active controller");
    let other = [1, 2, 3].into_iter().find(|b| *b != active).unwrap();
    let mut conn = RawConn::connect(cluster.addr(other)).await;
    let req = kafka_protocol::messages::DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
        .with_topic_name(TopicName(kafka_protocol::protocol::StrBytes::from_static_str("__cluster_metadata")))
        .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
    let resp = conn.call(&req, 2).await;
    assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
    let p = &resp.topics[0].partitions[0];
    assert_eq!((p.error_code, p.leader_id.0), (0, active));
    assert!(p.leader_epoch >= 1 && p.high_watermark > 1, "{p:?}");
    let ids: Vec<i32> = p.current_voters.iter().map(|v| v.replica_id.0).collect();
    assert_eq!(ids, vec![1, 2, 3]);
    let leader_end = p.current_voters.iter().find(|v| v.replica_id.0 == active).unwrap().log_end_offset;
    assert!(leader_end >= p.high_watermark, "leader end {leader_end} below HW {}", p.high_watermark);
    for v in &p.current_voters {
        // Every follower has answered the leader by now (heartbeats every tick).
        assert!(v.log_end_offset > 0 && v.log_end_offset <= leader_end, "{v:?}");
        assert!(v.last_fetch_timestamp > 0 && v.last_caught_up_timestamp > 0, "{v:?}");
    }
    assert_eq!(resp.nodes.len(), 3);
    assert!(resp.nodes.iter().all(|n| n.listeners[0].name.as_str() == "CONTROLLER"));

    // Anything but __cluster_metadata-0 is refused with a clear error.
    let bad = kafka_protocol::messages::DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
        .with_topic_name(TopicName(kafka_protocol::protocol::StrBytes::from_static_str("spread")))
        .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
    let resp = conn.call(&bad, 2).await;
    assert_eq!(resp.error_code, 42, "INVALID_REQUEST");

    let versions = conn.call(&kafka_protocol::messages::ApiVersionsRequest::default(), 3).await;
    assert!(versions.api_keys.iter().any(|k| k.api_key == 55 && k.max_version == 2), "DescribeQuorum advertised");
    let mv = versions.finalized_features.iter().find(|f| f.name.as_str() == "metadata.version").expect("finalized");
    assert_eq!((mv.min_version_level, mv.max_version_level), (27, 27));
    let elr = versions.finalized_features.iter().find(|f| f.name.as_str() == "eligible.leader.replicas.version");
    assert_eq!(elr.map(|f| (f.min_version_level, f.max_version_level)), Some((1, 1)), "ELR on (KIP-966)");
    assert!(versions.finalized_features_epoch > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_groups_are_coordinated_across_brokers() {
    let cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    create_topic(&cluster.bootstrap(1), "grouped", 6, 1).await.unwrap();
    produce_all(&cluster.bootstrap(1), "grouped", 6, 10, false).await;

    // Groups hash to `__consumer_offsets` partitions spread over the brokers.
    let mut conn = RawConn::connect(cluster.addr(2)).await;
    let keys: Vec<_> = (0..30).map(|i| kafka_protocol::protocol::StrBytes::from_string(format!("g{i}"))).collect();
    let mut coordinators = BTreeSet::new();
    let deadline = std::time::Instant::now() + READY;
    loop {
        let req = FindCoordinatorRequest::default().with_key_type(0).with_coordinator_keys(keys.clone());
        let resp = conn.call(&req, 4).await;
        if resp.coordinators.iter().all(|c| c.error_code == 0) {
            coordinators.extend(resp.coordinators.iter().map(|c| c.node_id.0));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "coordinators not found: {:?}", resp.coordinators);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(coordinators, BTreeSet::from([1, 2, 3]), "coordinators spread over every broker");

    // Two members of one group, bootstrapped from different brokers, share
    // the partitions and consume everything once; their commits are kept.
    let member = |bootstrap: String| -> BaseConsumer {
        let mut c = consumer_config(&bootstrap);
        c.set("group.id", "cluster-group")
            .set("session.timeout.ms", "6000")
            .set("enable.partition.eof", "false")
            .set("enable.auto.offset.store", "true");
        let consumer: BaseConsumer = c.create().unwrap();
        consumer.subscribe(&["grouped"]).unwrap();
        consumer
    };
    let a = member(cluster.bootstrap(1));
    let b = member(cluster.bootstrap(3));
    let mut seen: BTreeMap<(i32, i64), String> = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < 60 {
        assert!(std::time::Instant::now() < deadline, "consumed {} of 60", seen.len());
        for c in [&a, &b] {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                let v = String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
                assert!(seen.insert((m.partition(), m.offset()), v).is_none(), "a record was delivered twice");
            }
        }
    }
    for c in [&a, &b] {
        if c.assignment().unwrap().count() > 0 {
            c.commit_consumer_state(rdkafka::consumer::CommitMode::Sync).unwrap();
        }
    }
    drop(a);
    drop(b);
    let reader: BaseConsumer = {
        let mut c = consumer_config(&cluster.bootstrap(2));
        c.set("group.id", "cluster-group");
        c.create().unwrap()
    };
    let mut tpl = TopicPartitionList::new();
    for p in 0..6 {
        tpl.add_partition("grouped", p);
    }
    let committed = reader.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    for e in committed.elements() {
        assert_eq!(e.offset(), Offset::Offset(10), "committed offset of partition {}", e.partition());
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitions_and_configs_change_through_any_broker() {
    let cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    let topic = NewTopic::new("grown", 2, TopicReplication::Fixed(1)).set("retention.ms", "3600000");
    let r = admin(&cluster.bootstrap(1)).create_topics([&topic], &opts).await.unwrap();
    assert!(r[0].is_ok(), "{r:?}");

    // Grown through broker 2: the new partitions are placed and served.
    let r = admin(&cluster.bootstrap(2)).create_partitions(&[NewPartitions::new("grown", 6)], &opts).await.unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let (_, l) = leaders(&cluster.bootstrap(3), "grown");
    assert_eq!(l.len(), 6);
    assert_eq!(l.values().copied().collect::<BTreeSet<i32>>(), BTreeSet::from([1, 2, 3]), "{l:?}");
    let r = admin(&cluster.bootstrap(2)).create_partitions(&[NewPartitions::new("grown", 3)], &opts).await.unwrap();
    assert!(r[0].is_err(), "shrinking is refused: {r:?}");
    produce_all(&cluster.bootstrap(1), "grown", 6, 2, false).await;

    // Manual replica assignments: partitions go where they are asked, and
    // an assignment naming no registered broker is refused whole.
    let manual = NewTopic::new("manual", 3, TopicReplication::Variable(&[&[3], &[3], &[1]]));
    let r = admin(&cluster.bootstrap(2)).create_topics([&manual], &opts).await.unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let (_, l) = leaders(&cluster.bootstrap(1), "manual");
    assert_eq!(l, BTreeMap::from([(0, 3), (1, 3), (2, 1)]));
    let grow = NewPartitions::new("manual", 5).assign(&[&[2], &[1]]);
    let r = admin(&cluster.bootstrap(3)).create_partitions(&[grow], &opts).await.unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let (_, l) = leaders(&cluster.bootstrap(1), "manual");
    assert_eq!(l, BTreeMap::from([(0, 3), (1, 3), (2, 1), (3, 2), (4, 1)]));
    produce_all(&cluster.bootstrap(1), "manual", 5, 2, false).await;
    let missing = NewTopic::new("nowhere", 2, TopicReplication::Variable(&[&[1], &[9]]));
    let r = admin(&cluster.bootstrap(1)).create_topics([&missing], &opts).await.unwrap();
    assert!(format!("{r:?}").contains("InvalidReplicaAssignment"), "{r:?}");
    let bad_grow = NewPartitions::new("manual", 7).assign(&[&[2]]);
    let r = admin(&cluster.bootstrap(1)).create_partitions(&[bad_grow], &opts).await.unwrap();
    assert!(format!("{r:?}").contains("InvalidReplicaAssignment"), "{r:?}");

    // A topic config changed through broker 3 is described by broker 1 and
    // applied by every broker hosting the topic.
    let alter = AlterConfig::new(ResourceSpecifier::Topic("grown")).set("retention.ms", "7200000");
    let r = admin(&cluster.bootstrap(3)).alter_configs([&alter], &opts).await.unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let described = admin(&cluster.bootstrap(1))
        .describe_configs([&ResourceSpecifier::Topic("grown")], &AdminOptions::new())
        .await
        .unwrap();
    let resource = described.into_iter().next().unwrap().expect("described");
    assert_eq!(resource.get("retention.ms").and_then(|e| e.value.clone()).as_deref(), Some("7200000"));
    wait_for("the new config on every broker", READY, Duration::from_millis(20), || {
        let applied = [1, 2, 3].iter().all(|b| {
            cluster
                .state(*b)
                .replicas
                .topic("grown")
                .is_none_or(|t| t.configs.get("retention.ms").map(String::as_str) == Some("7200000"))
        });
        async move { applied.then_some(()) }
    })
    .await;
    cluster.shutdown().await;
}

/// Reads every partition from the beginning (assign mode) until `expected`
/// values arrived and every partition reached its end, at the given isolation level.
fn read_isolated(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
    committed: bool,
) -> BTreeMap<i32, Vec<String>> {
    let mut config = consumer_config(bootstrap);
    config.set("isolation.level", if committed { "read_committed" } else { "read_uncommitted" });
    let consumer: BaseConsumer = config.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    let mut eof = BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while out.values().map(Vec::len).sum::<usize>() < expected || eof.len() < partitions as usize {
        assert!(std::time::Instant::now() < deadline, "read {out:?}, expected {expected} values");
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                eof.remove(&m.partition());
                out.entry(m.partition()).or_default().push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            None => {}
            Some(Err(e)) => panic!("consume error: {e}"),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_span_partitions_led_by_every_broker() {
    use rdkafka::producer::Producer;
    let cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    create_topic(&cluster.bootstrap(1), "txn-in", 6, 1).await.unwrap();
    create_topic(&cluster.bootstrap(1), "txn-out", 3, 1).await.unwrap();
    let call = Duration::from_secs(30);

    // Commit, abort, commit: one record per partition each time, the six
    // partitions led by all three brokers, the producer bootstrapped from one.
    let producer: FutureProducer = {
        let mut c = producer_config(&cluster.bootstrap(1));
        c.set("transactional.id", "cluster-txn").set("enable.idempotence", "true");
        c.create().unwrap()
    };
    tokio::task::block_in_place(|| producer.init_transactions(call)).expect("init_transactions");
    for (round, commit) in [("c1", true), ("ab", false), ("c2", true)] {
        producer.begin_transaction().expect("begin");
        for p in 0..6 {
            let value = format!("{round}-{p}");
            let record = FutureRecord::to("txn-in").partition(p).key("k").payload(&value);
            producer.send(record, call).await.expect("acked");
        }
        if commit {
            tokio::task::block_in_place(|| producer.commit_transaction(call)).expect("commit");
        } else {
            tokio::task::block_in_place(|| producer.abort_transaction(call)).expect("abort");
        }
    }
    let committed = read_isolated(&cluster.bootstrap(2), "txn-in", 6, 12, true);
    for p in 0..6 {
        assert_eq!(committed[&p], vec![format!("c1-{p}"), format!("c2-{p}")], "read_committed, partition {p}");
    }
    let everything = read_isolated(&cluster.bootstrap(3), "txn-in", 6, 18, false);
    assert_eq!(everything.values().map(Vec::len).sum::<usize>(), 18);

    // Consume-transform-produce: offsets of "txn-in" committed in the same
    // transaction as the output, through coordinators on other brokers.
    let out: FutureProducer = {
        let mut c = producer_config(&cluster.bootstrap(3));
        c.set("transactional.id", "cluster-ctp").set("enable.idempotence", "true");
        c.create().unwrap()
    };
    tokio::task::block_in_place(|| out.init_transactions(call)).expect("init_transactions");
    let input: BaseConsumer = {
        let mut c = consumer_config(&cluster.bootstrap(2));
        c.set("group.id", "ctp-group").set("isolation.level", "read_committed").set("enable.partition.eof", "false");
        c.create().unwrap()
    };
    input.subscribe(&["txn-in"]).unwrap();
    out.begin_transaction().unwrap();
    let mut transformed = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while transformed < 12 {
        assert!(std::time::Instant::now() < deadline, "transformed {transformed} of 12");
        if let Some(Ok(m)) = input.poll(Duration::from_millis(100)) {
            let value = format!("out-{}", String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
            let record = FutureRecord::to("txn-out").partition(m.partition() % 3).key("k").payload(&value);
            out.send(record, call).await.unwrap();
            transformed += 1;
        }
    }
    let positions = input.position().unwrap();
    let metadata = input.group_metadata().unwrap();
    tokio::task::block_in_place(|| out.send_offsets_to_transaction(&positions, &metadata, call)).expect("offsets");
    tokio::task::block_in_place(|| out.commit_transaction(call)).expect("commit");
    drop(metadata);
    // Not dropped: librdkafka's destroy of this group member (after
    // send_offsets_to_transaction) did not return in about one run in two,
    // joining a broker thread (seen in gdb: rd_kafka_destroy_app); every
    // request the brokers received had been answered. Left open; see the
    // issue's progress note.
    std::mem::forget(input);
    let outputs = read_isolated(&cluster.bootstrap(1), "txn-out", 3, 12, true);
    assert_eq!(outputs.values().map(Vec::len).sum::<usize>(), 12, "{outputs:?}");
    let reader: BaseConsumer = {
        let mut c = consumer_config(&cluster.bootstrap(1));
        c.set("group.id", "ctp-group");
        c.create().unwrap()
    };
    let mut tpl = TopicPartitionList::new();
    for p in 0..6 {
        tpl.add_partition("txn-in", p);
    }
    let offsets = reader.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    for e in offsets.elements() {
        // c1 (0), marker, aborted (2), marker, c2 (4), marker (5): the consumer's
        // position is past c2, and past the last marker once it has read it.
        let offset = e.offset();
        assert!(matches!(offset, Offset::Offset(5) | Offset::Offset(6)), "txn-in-{}: {offset:?}", e.partition());
    }
    // Every client goes before the brokers it talks to.
    drop((producer, out, reader));
    cluster.shutdown().await;
}

/// Three voters and two broker-only nodes (process.roles=broker), which
/// follow the metadata log by fetching it from a voter: partitions are
/// placed on all five, clients bootstrapped from a broker-only node reach
/// every leader, transactions are coordinated wherever their partitions
/// are, DescribeQuorum lists the broker-only nodes as observers, and a
/// restarted broker-only node catches up and leads its partitions again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_only_nodes_follow_the_log_and_serve() {
    use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
    use rdkafka::producer::Producer;
    let mut cluster =
        TestCluster::start_roles(&[Role::Combined, Role::Combined, Role::Combined, Role::Broker, Role::Broker], &[])
            .await;
    cluster.wait_ready(READY).await;
    create_topic(&cluster.bootstrap(4), "mixed", 10, 1).await.expect("created through a broker-only node");
    let (brokers, placement) = leaders(&cluster.bootstrap(5), "mixed");
    assert_eq!(brokers, BTreeSet::from([1, 2, 3, 4, 5]));
    let leading: BTreeSet<i32> = placement.values().copied().collect();
    assert_eq!(leading, BTreeSet::from([1, 2, 3, 4, 5]), "{placement:?}");
    produce_all(&cluster.bootstrap(5), "mixed", 10, 5, true).await;
    let read = read_all(&cluster.bootstrap(4), "mixed", 10, 50);
    assert!(read.values().all(|v| v.len() == 5), "{read:?}");

    // A transaction over all ten partitions, its producer bootstrapped from node 4.
    let call = Duration::from_secs(30);
    let producer: FutureProducer = {
        let mut c = producer_config(&cluster.bootstrap(4));
        c.set("transactional.id", "mixed-txn").set("enable.idempotence", "true");
        c.create().unwrap()
    };
    tokio::task::block_in_place(|| producer.init_transactions(call)).expect("init_transactions");
    producer.begin_transaction().unwrap();
    for p in 0..10 {
        let value = format!("txn-{p}");
        producer.send(FutureRecord::to("mixed").partition(p).key("k").payload(&value), call).await.expect("acked");
    }
    tokio::task::block_in_place(|| producer.commit_transaction(call)).expect("commit");
    drop(producer);
    let committed = read_isolated(&cluster.bootstrap(5), "mixed", 10, 60, true);
    for p in 0..10 {
        assert_eq!(committed[&p].last(), Some(&format!("txn-{p}")), "partition {p}");
    }

    // The broker-only nodes are the quorum's observers.
    let mut conn = RawConn::connect(cluster.addr(5)).await;
    let req = kafka_protocol::messages::DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
        .with_topic_name(TopicName(kafka_protocol::protocol::StrBytes::from_static_str("__cluster_metadata")))
        .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
    let resp = conn.call(&req, 2).await;
    let q = &resp.topics[0].partitions[0];
    let voters: Vec<i32> = q.current_voters.iter().map(|v| v.replica_id.0).collect();
    let observers: BTreeSet<i32> = q.observers.iter().map(|v| v.replica_id.0).collect();
    assert_eq!((voters, observers), (vec![1, 2, 3], BTreeSet::from([4, 5])), "{q:?}");
    assert!(q.observers.iter().all(|o| o.log_end_offset > 0 && o.last_fetch_timestamp > 0), "{q:?}");

    // A broker-only node restarted with nothing of the log catches up.
    cluster.stop(4).await;
    create_topic(&cluster.bootstrap(1), "while-away", 1, 1).await.unwrap();
    cluster.restart(4).await;
    cluster.wait_ready(READY).await;
    let node4: Vec<i32> = placement.iter().filter(|(_, l)| **l == 4).map(|(p, _)| *p).collect();
    let (c, node4) = (&cluster, &node4);
    wait_for("node 4 to lead its partitions again", READY, Duration::from_millis(50), || {
        let (_, now) = leaders(&c.bootstrap(4), "mixed");
        let seen = c.state(4).cluster().unwrap().image().topic("while-away").is_some();
        async move { (seen && node4.iter().all(|p| now.get(p) == Some(&4))).then_some(()) }
    })
    .await;
    let read = read_all(&cluster.bootstrap(4), "mixed", 10, 60);
    assert_eq!(read.values().map(Vec::len).sum::<usize>(), 60);
    cluster.shutdown().await;
}

/// Kafka's isolated mode: three controller-only nodes (process.roles=
/// controller) and two broker-only nodes. Partitions go to the brokers
/// only; clients see the brokers, with a broker as the controller they
/// talk to, while DescribeCluster for controllers and DescribeQuorum name
/// the real active controller; groups and transactions work; killing the
/// active controller moves the quorum and admin requests carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controller_only_nodes_run_the_quorum_for_broker_only_nodes() {
    use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
    use rdkafka::producer::Producer;
    let roles = [Role::Controller, Role::Controller, Role::Controller, Role::Broker, Role::Broker];
    let mut cluster = TestCluster::start_roles(&roles, &[]).await;
    cluster.wait_ready(READY).await;
    create_topic(&cluster.bootstrap(4), "isolated", 4, 1).await.expect("created");
    let (brokers, placement) = leaders(&cluster.bootstrap(5), "isolated");
    assert_eq!(brokers, BTreeSet::from([4, 5]), "only brokers are listed");
    assert_eq!(placement.values().copied().collect::<BTreeSet<_>>(), BTreeSet::from([4, 5]), "{placement:?}");
    let md =
        RawConn::connect(cluster.addr(4)).await.call(&MetadataRequest::default().with_topics(Some(vec![])), 12).await;
    assert!([4, 5].contains(&md.controller_id.0), "clients are told a broker: {}", md.controller_id.0);
    let active = cluster.active_controller().expect("an active controller");
    assert!([1, 2, 3].contains(&active));
    let dc = RawConn::connect(cluster.addr(5))
        .await
        .call(&kafka_protocol::messages::DescribeClusterRequest::default().with_endpoint_type(2), 1)
        .await;
    assert_eq!(dc.controller_id.0, active);
    assert_eq!(dc.brokers.iter().map(|b| b.broker_id.0).collect::<BTreeSet<_>>(), BTreeSet::from([1, 2, 3]));
    let req = kafka_protocol::messages::DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
        .with_topic_name(TopicName(kafka_protocol::protocol::StrBytes::from_static_str("__cluster_metadata")))
        .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
    let q = RawConn::connect(cluster.addr(4)).await.call(&req, 2).await;
    let q = &q.topics[0].partitions[0];
    assert_eq!(q.leader_id.0, active);
    assert_eq!(q.observers.iter().map(|o| o.replica_id.0).collect::<BTreeSet<_>>(), BTreeSet::from([4, 5]));

    // Data, a consumer group and a transaction through the brokers.
    produce_all(&cluster.bootstrap(4), "isolated", 4, 5, true).await;
    let call = Duration::from_secs(30);
    let producer: FutureProducer = {
        let mut c = producer_config(&cluster.bootstrap(5));
        c.set("transactional.id", "isolated-txn").set("enable.idempotence", "true");
        c.create().unwrap()
    };
    tokio::task::block_in_place(|| producer.init_transactions(call)).expect("init_transactions");
    producer.begin_transaction().unwrap();
    for p in 0..4 {
        let value = format!("txn-{p}");
        producer.send(FutureRecord::to("isolated").partition(p).key("k").payload(&value), call).await.expect("acked");
    }
    tokio::task::block_in_place(|| producer.commit_transaction(call)).expect("commit");
    drop(producer);
    let committed = read_isolated(&cluster.bootstrap(4), "isolated", 4, 24, true);
    assert!((0..4).all(|p| committed[&p].len() == 6), "{committed:?}");
    let group: BaseConsumer = {
        let mut c = consumer_config(&cluster.bootstrap(5));
        c.set("group.id", "isolated-group").set("enable.partition.eof", "false");
        c.create().unwrap()
    };
    group.subscribe(&["isolated"]).unwrap();
    let mut seen = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen < 24 {
        assert!(std::time::Instant::now() < deadline, "group read {seen} of 24");
        if let Some(Ok(_)) = group.poll(Duration::from_millis(100)) {
            seen += 1;
        }
    }
    let positions = group.position().unwrap();
    group.commit(&positions, rdkafka::consumer::CommitMode::Sync).expect("commit offsets");
    // Not dropped: as with the transactional consumer above, librdkafka's
    // rd_kafka_destroy of this group consumer waited for ever on one broker
    // thread (traced: every request both brokers received was answered and
    // every connection closed first), like librdkafka issue 3954.
    std::mem::forget(group);

    // The active controller stops: another takes over and admin requests carry on.
    cluster.stop(active).await;
    create_topic(&cluster.bootstrap(4), "after-controller", 2, 1).await.expect("created after failover");
    let (_, after) = leaders(&cluster.bootstrap(5), "after-controller");
    assert!(after.values().all(|l| [4, 5].contains(l)), "{after:?}");
    let meta = std::fs::read_to_string(cluster.node(active).dir.join("data").join("meta.properties")).unwrap();
    assert!(meta.contains(&format!("node.id={active}")) && meta.contains("cluster.id="), "{meta}");
    cluster.restart(active).await;
    cluster.wait_ready(READY).await;
    cluster.shutdown().await;
}

/// A node's data directory records its node id and, once the quorum has
/// one, the cluster id (meta.properties). Started as another node.id it is
/// refused, naming both ids; holding another cluster's id, the node stops,
/// naming both clusters.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_directory_of_another_node_or_cluster_is_refused() {
    let mut cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    let cluster_id = cluster.state(1).cluster_id();
    let meta = cluster.node(3).dir.join("data").join("meta.properties");
    let expected = format!("node.id=3\ncluster.id={cluster_id}\n");
    let (m, e) = (&meta, &expected);
    wait_for("node 3 to record the cluster id", READY, Duration::from_millis(20), || async move {
        std::fs::read_to_string(m).ok().filter(|t| t.contains(e.as_str())).map(|_| ())
    })
    .await;
    cluster.stop(3).await;
    let original = std::fs::read_to_string(&meta).unwrap();

    // Another node's directory: refused at start-up, nothing served.
    std::fs::write(&meta, original.replace("node.id=3", "node.id=7")).unwrap();
    let err = match strand::Broker::start(cluster.config(2)).await {
        Ok(_) => panic!("node 3 started on node 7's directory"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("node.id=7") && err.contains("node.id=3"), "{err}");

    // Another cluster's directory: the node stops, naming both clusters.
    let other = "AAAAAAAAAAAAAAAAAAAAAA";
    std::fs::write(&meta, original.replace(&cluster_id, other)).unwrap();
    let node = strand::Broker::start(cluster.config(2)).await.expect("starts, then meets the metadata log");
    let reason = tokio::time::timeout(READY, node.failed()).await.expect("the node stops");
    assert!(reason.contains(other) && reason.contains(&cluster_id), "{reason}");
    node.shutdown().await;

    // Its own directory again: it rejoins.
    std::fs::write(&meta, &original).unwrap();
    cluster.restart(3).await;
    cluster.wait_ready(READY).await;
    cluster.shutdown().await;
}

/// The state DescribeTransactions reports for `id`, asked of `broker`.
async fn transaction_state(cluster: &TestCluster, broker: i32, id: &str) -> String {
    let mut conn = RawConn::connect(cluster.addr(broker)).await;
    let req = kafka_protocol::messages::DescribeTransactionsRequest::default().with_transactional_ids(vec![
        kafka_protocol::messages::TransactionalId(kafka_protocol::protocol::StrBytes::from_string(id.to_string())),
    ]);
    let resp = conn.call(&req, 0).await;
    let t = &resp.transaction_states[0];
    assert_eq!(t.error_code, 0, "DescribeTransactions {id} on broker {broker}");
    t.transaction_state.to_string()
}

/// The coordinator of transactional id `txn`, and a broker to stop that is
/// neither it (its shard must keep running) nor the active controller (no
/// failover in these tests).
async fn coordinator_and_another(cluster: &TestCluster, txn: &str) -> (i32, i32) {
    let mut conn = RawConn::connect(cluster.addr(1)).await;
    let found = conn
        .call(
            &FindCoordinatorRequest::default()
                .with_key(kafka_protocol::protocol::StrBytes::from_string(txn.to_string()))
                .with_key_type(1),
            3,
        )
        .await;
    assert_eq!(found.error_code, 0);
    let coordinator = found.node_id.0;
    let active = cluster.active_controller().expect("an active controller");
    let stopped = [1, 2, 3].into_iter().find(|b| *b != coordinator && *b != active).unwrap();
    println!("coordinator {coordinator}, active controller {active}, stopping broker {stopped}");
    (coordinator, stopped)
}

/// A commit whose markers cannot all be written (the broker leading one of
/// its partitions is stopped) is not reported done: the transaction stays
/// PrepareCommit, the producer's commit keeps waiting, and once the broker is
/// back the coordinator completes it by itself and the commit returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_completes_once_a_stopped_partition_leader_returns() {
    use rdkafka::producer::Producer;
    let mut cluster = TestCluster::start(3, &["transaction.abort.timed.out.transaction.cleanup.interval.ms=200"]).await;
    cluster.wait_ready(READY).await;
    create_topic(&cluster.bootstrap(1), "held", 3, 1).await.unwrap();
    let call = Duration::from_secs(30);
    let producer: FutureProducer = {
        let mut c = producer_config(&cluster.bootstrap(1));
        c.set("transactional.id", "held-txn").set("enable.idempotence", "true");
        c.create().unwrap()
    };
    tokio::task::block_in_place(|| producer.init_transactions(call)).expect("init_transactions");
    let (coordinator, stopped) = coordinator_and_another(&cluster, "held-txn").await;

    producer.begin_transaction().unwrap();
    for p in 0..3 {
        let value = format!("held-{p}");
        producer.send(FutureRecord::to("held").partition(p).key("k").payload(&value), call).await.expect("acked");
    }
    cluster.stop(stopped).await;
    let committing = producer.clone();
    let commit = tokio::task::spawn_blocking(move || committing.commit_transaction(Duration::from_secs(120)));

    // The coordinator gives up on the stopped broker's marker after its
    // deadline and leaves the transaction prepared.
    wait_for(
        "the transaction prepared, its markers not all written",
        Duration::from_secs(40),
        Duration::from_millis(200),
        || {
            let cluster = &cluster;
            async move { (transaction_state(cluster, coordinator, "held-txn").await == "PrepareCommit").then_some(()) }
        },
    )
    .await;
    assert!(!commit.is_finished(), "commit_transaction returned while a marker was unwritten");

    cluster.restart(stopped).await;
    tokio::time::timeout(Duration::from_secs(60), commit)
        .await
        .expect("commit returns once the broker is back")
        .unwrap()
        .expect("commit_transaction");
    assert_eq!(transaction_state(&cluster, coordinator, "held-txn").await, "CompleteCommit");
    let committed = read_isolated(&cluster.bootstrap(2), "held", 3, 3, true);
    for p in 0..3 {
        assert_eq!(committed[&p], vec![format!("held-{p}")], "read_committed, partition {p}");
    }
    drop(producer);
    cluster.shutdown().await;
}

/// A new producer fencing an open transaction (InitProducerId with the
/// same transactional id) while a broker leading one of its partitions is
/// stopped: the old transaction stays PrepareEpochFence (its abort marker
/// cannot be written), the new producer's init keeps being told to retry,
/// and once the broker is back the abort completes, the init returns and
/// the new producer's transaction is readable on every partition (the old
/// one no longer holds any last stable offset back).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_an_open_transaction_waits_for_its_abort_markers() {
    use rdkafka::producer::Producer;
    let mut cluster = TestCluster::start(3, &["transaction.abort.timed.out.transaction.cleanup.interval.ms=200"]).await;
    cluster.wait_ready(READY).await;
    create_topic(&cluster.bootstrap(1), "fenced", 3, 1).await.unwrap();
    let call = Duration::from_secs(30);
    let transactional = |bootstrap: &str| -> FutureProducer {
        let mut c = producer_config(bootstrap);
        c.set("transactional.id", "fence-txn").set("enable.idempotence", "true");
        c.create().unwrap()
    };
    let old = transactional(&cluster.bootstrap(1));
    tokio::task::block_in_place(|| old.init_transactions(call)).expect("init_transactions");
    let (coordinator, stopped) = coordinator_and_another(&cluster, "fence-txn").await;
    old.begin_transaction().unwrap();
    for p in 0..3 {
        let value = format!("old-{p}");
        old.send(FutureRecord::to("fenced").partition(p).key("k").payload(&value), call).await.expect("acked");
    }
    cluster.stop(stopped).await;

    // Bootstrapped from a broker that stays up.
    let new = transactional(&cluster.bootstrap(coordinator));
    let initialising = new.clone();
    let init = tokio::task::spawn_blocking(move || initialising.init_transactions(Duration::from_secs(120)));
    wait_for("the old transaction being fenced", Duration::from_secs(20), Duration::from_millis(100), || {
        let cluster = &cluster;
        async move { (transaction_state(cluster, coordinator, "fence-txn").await == "PrepareEpochFence").then_some(()) }
    })
    .await;
    // Past the coordinator's 10 s marker deadline, still fencing.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(transaction_state(&cluster, coordinator, "fence-txn").await, "PrepareEpochFence");
    assert!(!init.is_finished(), "init_transactions returned while the old transaction's marker was unwritten");

    cluster.restart(stopped).await;
    tokio::time::timeout(Duration::from_secs(60), init)
        .await
        .expect("init returns once the broker is back")
        .unwrap()
        .expect("init_transactions");
    new.begin_transaction().unwrap();
    for p in 0..3 {
        let value = format!("new-{p}");
        new.send(FutureRecord::to("fenced").partition(p).key("k").payload(&value), call).await.expect("acked");
    }
    tokio::task::block_in_place(|| new.commit_transaction(call)).expect("commit");
    let committed = read_isolated(&cluster.bootstrap(2), "fenced", 3, 3, true);
    for p in 0..3 {
        assert_eq!(committed[&p], vec![format!("new-{p}")], "read_committed, partition {p}");
    }
    drop((old, new));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_topic_recreated_under_its_name_starts_empty_on_every_broker() {
    let cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    create_topic(&cluster.bootstrap(1), "again", 3, 1).await.unwrap();
    produce_all(&cluster.bootstrap(1), "again", 3, 10, false).await;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    let deleted = admin(&cluster.bootstrap(2)).delete_topics(&["again"], &opts).await.unwrap();
    assert!(deleted[0].is_ok(), "{deleted:?}");
    // Every broker drops its partitions of the deleted topic.
    wait_for("the old logs to go", Duration::from_secs(10), Duration::from_millis(20), || {
        let gone = [1, 2, 3].iter().all(|b| cluster.state(*b).replicas.topic("again").is_none());
        async move { gone.then_some(()) }
    })
    .await;
    create_topic(&cluster.bootstrap(3), "again", 3, 1).await.unwrap();
    produce_all(&cluster.bootstrap(3), "again", 3, 1, false).await;
    let read = read_all(&cluster.bootstrap(1), "again", 3, 3);
    for p in 0..3 {
        assert_eq!(read[&p], vec![format!("again-{p}-0")], "only the new topic's record in partition {p}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cluster_survives_its_controller_stopping_and_a_full_restart() {
    let mut cluster = TestCluster::start(3, &[]).await;
    cluster.wait_ready(READY).await;
    let cluster_id = cluster.state(1).cluster_id();
    assert!(!cluster_id.is_empty());
    create_topic(&cluster.bootstrap(1), "kept", 3, 1).await.unwrap();
    produce_all(&cluster.bootstrap(1), "kept", 3, 10, false).await;

    // The active controller stops: the other two elect one and serve admin requests.
    let old = cluster.active_controller().expect("an active controller");
    cluster.stop(old).await;
    let survivor = cluster.running()[0];
    wait_for("a new active controller", READY, Duration::from_millis(20), || {
        let l = cluster.active_controller().filter(|l| *l != old);
        async move { l }
    })
    .await;
    create_topic(&cluster.bootstrap(survivor), "after-failover", 2, 1).await.expect("created after failover");
    // The stopped broker's partitions have no leader until it returns.
    let (_, kept_leaders) = leaders(&cluster.bootstrap(survivor), "kept");
    assert!(kept_leaders.values().all(|l| *l != old));
    cluster.restart(old).await;
    cluster.wait_ready(READY).await;

    // All three stop and start again: same cluster id, topics and data.
    let ids = cluster.running();
    for id in &ids {
        cluster.stop(*id).await;
    }
    cluster.restart_all(&ids).await;
    cluster.wait_ready(READY).await;
    assert_eq!(cluster.state(2).cluster_id(), cluster_id);
    wait_for("every partition led again", READY, Duration::from_millis(50), || {
        let (_, l) = leaders(&cluster.bootstrap(2), "kept");
        let (_, a) = leaders(&cluster.bootstrap(2), "after-failover");
        async move { (l.values().chain(a.values()).all(|x| *x >= 0)).then_some(()) }
    })
    .await;
    let read = read_all(&cluster.bootstrap(3), "kept", 3, 30);
    for p in 0..3 {
        let expected: Vec<String> = (0..10).map(|i| format!("kept-{p}-{i}")).collect();
        assert_eq!(read[&p], expected);
    }
    let mut conn = RawConn::connect(cluster.addr(3)).await;
    let md = conn.call(&MetadataRequest::default().with_topics(None), 12).await;
    let names: BTreeSet<String> =
        md.topics.iter().filter(|t| !t.is_internal).filter_map(|t| t.name.as_ref().map(|n| n.0.to_string())).collect();
    assert_eq!(names, BTreeSet::from(["after-failover".to_string(), "kept".to_string()]));
    cluster.shutdown().await;
}

/// One valid v2 record batch with a single record, CRC-32C computed.
fn strand_storage_test_batch() -> bytes::Bytes {
    bytes::Bytes::from(strand_storage::batch::build_test_batch(0, 1_700_000_000_000, &[b"v"]))
}
