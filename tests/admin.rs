//! Topic administration through librdkafka's AdminClient.
//!
//! Goal: create/delete topics, add partitions, describe and alter configs and
//! delete records the way client tools do, with Kafka's error codes for bad
//! requests, and everything persisted across a restart.
//! Method: an in-process broker in a temporary directory, driven by
//! rdkafka's AdminClient and a consumer for metadata and watermarks.

use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::TopicPartitionList;
use strand::{Broker, BrokerConfig, BrokerHandle};

async fn start(dir: &std::path::Path) -> BrokerHandle {
    let props =
        format!("listeners=PLAINTEXT://127.0.0.1:0\nlog.dirs={}\nauto.create.topics.enable=false\n", dir.display());
    Broker::start(BrokerConfig::from_properties(&props, "test", &[]).unwrap()).await.unwrap()
}

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap()
}

fn partition_count(bootstrap: &str, topic: &str) -> Option<usize> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap();
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let t = &md.topics()[0];
    if t.error().is_some() {
        None
    } else {
        Some(t.partitions().len())
    }
}

async fn topic_config(admin: &AdminClient<DefaultClientContext>, topic: &str, key: &str) -> (String, String) {
    let res = admin.describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new()).await.unwrap();
    let resource = res.into_iter().next().unwrap().expect("describe ok");
    let entry = resource.get(key).unwrap_or_else(|| panic!("{key} described"));
    // ConfigSource is neither Clone nor PartialEq; compare its name.
    (entry.value.clone().unwrap_or_default(), format!("{:?}", entry.source))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_lifecycle_and_configs_through_admin_client() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let bootstrap = broker.bootstrap_servers();
    let admin = admin(&bootstrap);
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));

    // Create with an override; bad requests get Kafka's codes and create nothing.
    let good = NewTopic::new("orders", 2, TopicReplication::Fixed(1)).set("retention.ms", "3600000");
    let bad_rf = NewTopic::new("too-replicated", 1, TopicReplication::Fixed(3));
    let bad_config = NewTopic::new("bad-config", 1, TopicReplication::Fixed(1)).set("retention.ms", "soon");
    let bad_name = NewTopic::new("bad/name", 1, TopicReplication::Fixed(1));
    let results = admin.create_topics(&[good, bad_rf, bad_config, bad_name], &opts).await.unwrap();
    assert_eq!(results[0], Ok("orders".to_string()));
    assert_eq!(results[1], Err(("too-replicated".to_string(), RDKafkaErrorCode::InvalidReplicationFactor)));
    assert_eq!(results[2], Err(("bad-config".to_string(), RDKafkaErrorCode::InvalidConfig)));
    assert_eq!(results[3], Err(("bad/name".to_string(), RDKafkaErrorCode::InvalidTopic)));
    let again = admin.create_topics(&[NewTopic::new("orders", 2, TopicReplication::Fixed(1))], &opts).await.unwrap();
    assert_eq!(again[0], Err(("orders".to_string(), RDKafkaErrorCode::TopicAlreadyExists)));
    assert_eq!(partition_count(&bootstrap, "orders"), Some(2));
    assert_eq!(partition_count(&bootstrap, "too-replicated"), None);

    // Describe: the override is a topic config; the rest are defaults.
    assert_eq!(topic_config(&admin, "orders", "retention.ms").await, ("3600000".into(), "DynamicTopic".to_string()));
    assert_eq!(topic_config(&admin, "orders", "cleanup.policy").await, ("delete".into(), "Default".to_string()));

    // Alter (replaces the override set).
    let alter = AlterConfig::new(ResourceSpecifier::Topic("orders")).set("segment.bytes", "1048576");
    let r = admin.alter_configs([&alter], &opts).await.unwrap();
    assert!(r[0].is_ok(), "{:?}", r[0]);
    assert_eq!(topic_config(&admin, "orders", "segment.bytes").await, ("1048576".into(), "DynamicTopic".to_string()));
    assert_eq!(topic_config(&admin, "orders", "retention.ms").await.1, "Default".to_string());
    let bad = AlterConfig::new(ResourceSpecifier::Topic("orders")).set("no.such.config", "1");
    // rust-rdkafka reports every AlterConfigs resource as Ok whatever the broker
    // answers, so the refusal is checked by its effect: nothing changed.
    admin.alter_configs([&bad], &opts).await.unwrap();
    assert_eq!(topic_config(&admin, "orders", "segment.bytes").await.0, "1048576", "refused change altered nothing");

    // More partitions; fewer is refused.
    let r = admin.create_partitions(&[NewPartitions::new("orders", 4)], &opts).await.unwrap();
    assert_eq!(r[0], Ok("orders".to_string()));
    let r = admin.create_partitions(&[NewPartitions::new("orders", 3)], &opts).await.unwrap();
    assert_eq!(r[0], Err(("orders".to_string(), RDKafkaErrorCode::InvalidPartitions)));
    assert_eq!(partition_count(&bootstrap, "orders"), Some(4));

    // Produce ten records into partition 3 (a new one) and delete the first four.
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    for i in 0..10 {
        let v = format!("v{i}");
        producer
            .send(FutureRecord::<(), _>::to("orders").partition(3).payload(&v), Duration::from_secs(10))
            .await
            .unwrap();
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("orders", 3, rdkafka::Offset::Offset(4)).unwrap();
    let deleted = admin.delete_records(&tpl, &opts).await.unwrap();
    assert!(deleted.elements()[0].error().is_ok(), "{:?}", deleted.elements()[0].error());
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    assert_eq!(consumer.fetch_watermarks("orders", 3, Duration::from_secs(5)).unwrap(), (4, 10));

    broker.shutdown().await;

    // Everything above survives a restart.
    let broker = start(dir.path()).await;
    let bootstrap = broker.bootstrap_servers();
    let admin = self::admin(&bootstrap);
    assert_eq!(partition_count(&bootstrap, "orders"), Some(4));
    assert_eq!(topic_config(&admin, "orders", "segment.bytes").await.0, "1048576");
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    assert_eq!(consumer.fetch_watermarks("orders", 3, Duration::from_secs(5)).unwrap(), (4, 10));

    // Delete; the topic and its directories are gone, also after a restart.
    let r = admin.delete_topics(&["orders", "never-existed"], &opts).await.unwrap();
    assert_eq!(r[0], Ok("orders".to_string()));
    assert_eq!(r[1], Err(("never-existed".to_string(), RDKafkaErrorCode::UnknownTopicOrPartition)));
    assert_eq!(partition_count(&bootstrap, "orders"), None);
    assert!(!dir.path().join("orders-0").exists());
    broker.shutdown().await;
    let broker = start(dir.path()).await;
    assert_eq!(partition_count(&broker.bootstrap_servers(), "orders"), None);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_configs_are_described_and_dynamic_defaults_apply() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let bootstrap = broker.bootstrap_servers();
    let admin = admin(&bootstrap);
    let opts = AdminOptions::new();
    admin.create_topics(&[NewTopic::new("plain", 1, TopicReplication::Fixed(1))], &opts).await.unwrap();

    let res = admin.describe_configs([&ResourceSpecifier::Broker(1)], &opts).await.unwrap();
    let broker_cfg = res.into_iter().next().unwrap().unwrap();
    assert_eq!(broker_cfg.get("auto.create.topics.enable").unwrap().value.as_deref(), Some("false"));
    assert_eq!(broker_cfg.get("log.retention.ms").unwrap().value.as_deref(), Some("604800000"));

    // A dynamic broker default changes the effective value of topics without overrides.
    let alter = AlterConfig::new(ResourceSpecifier::Broker(1)).set("log.retention.ms", "120000");
    let r = admin.alter_configs([&alter], &opts).await.unwrap();
    assert!(r[0].is_ok(), "{:?}", r[0]);
    assert_eq!(topic_config(&admin, "plain", "retention.ms").await, ("120000".into(), "DynamicBroker".to_string()));
    let readonly = AlterConfig::new(ResourceSpecifier::Broker(1)).set("node.id", "7");
    // As above, the refusal is checked by its effect.
    admin.alter_configs([&readonly], &opts).await.unwrap();
    let res = admin.describe_configs([&ResourceSpecifier::Broker(1)], &opts).await.unwrap();
    let broker_cfg = res.into_iter().next().unwrap().unwrap();
    assert_eq!(broker_cfg.get("node.id").unwrap().value.as_deref(), Some("1"), "static broker config unchanged");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_below_min_insync_replicas_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let bootstrap = broker.bootstrap_servers();
    let topic = NewTopic::new("strict", 1, TopicReplication::Fixed(1)).set("min.insync.replicas", "2");
    admin(&bootstrap).create_topics(&[topic], &AdminOptions::new()).await.unwrap();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("acks", "all")
        .set("message.timeout.ms", "3000")
        .create()
        .unwrap();
    let err = producer
        .send(FutureRecord::<(), _>::to("strict").payload("x"), Duration::from_secs(10))
        .await
        .expect_err("one replica cannot satisfy min.insync.replicas=2");
    let code = err.0.rdkafka_error_code();
    assert!(
        matches!(code, Some(RDKafkaErrorCode::NotEnoughReplicas) | Some(RDKafkaErrorCode::MessageTimedOut)),
        "{:?}",
        err.0
    );
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    assert_eq!(consumer.fetch_watermarks("strict", 0, Duration::from_secs(5)).unwrap(), (0, 0), "nothing written");
    broker.shutdown().await;
}
