//! Broker-wide limits Kafka has: a bound on topics auto-created by one
//! Metadata request.
//!
//! Goal: one Metadata request naming a thousand unknown topics creates a
//! bounded number; ordinary librdkafka clients keep working.
//! Method: an in-process broker, raw Kafka protocol over TCP for the
//! request naming many topics, librdkafka for the ordinary clients.

mod common;

use std::time::Duration;

use common::RawConn;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

const LEADER_NOT_AVAILABLE: i16 = 5;

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
