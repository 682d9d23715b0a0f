//! Topic creation is all or nothing.
//!
//! Goal: a CreateTopics that fails part way leaves no partition directory and
//! no topic behind, answers with a Kafka error code and a message, does not
//! disturb other topics, and after a restart the broker finds no unknown
//! directories and the topic can be created. A create whose open files would
//! not fit under RLIMIT_NOFILE is refused up front (INVALID_PARTITIONS, with a
//! message naming the limit) instead of failing half way; Metadata
//! auto-creation stays within the same room.
//! Method: the real `strand` binary as a child process (its stderr is the
//! start-up log, and its file-descriptor limit can be set), driven with raw
//! CreateTopics/Metadata requests and librdkafka.

mod common;

use std::path::Path;
use std::time::Duration;

use common::child::ChildBroker;
use common::RawConn;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{CreateTopicsRequest, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_PARTITIONS: i16 = 37;
const KAFKA_STORAGE_ERROR: i16 = 56;

/// The start-up warning for a directory that belongs to no topic.
const UNKNOWN_DIR_WARNING: &str = "not a partition of any known topic";

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// CreateTopics v7 of one topic: (error code, error message).
async fn create(conn: &mut RawConn, name: &str, partitions: i32) -> (i16, String) {
    let req = CreateTopicsRequest::default().with_timeout_ms(30_000).with_topics(vec![CreatableTopic::default()
        .with_name(topic_name(name))
        .with_num_partitions(partitions)
        .with_replication_factor(1)]);
    let resp = conn.call(&req, 7).await;
    assert_eq!(resp.topics.len(), 1);
    let t = &resp.topics[0];
    (t.error_code, t.error_message.as_ref().map(|m| m.to_string()).unwrap_or_default())
}

/// Metadata v12 for `names`, auto-creating them if `auto`.
async fn metadata(conn: &mut RawConn, names: &[String], auto: bool) -> MetadataResponse {
    let topics = names.iter().map(|n| MetadataRequestTopic::default().with_name(Some(topic_name(n)))).collect();
    conn.call(&MetadataRequest::default().with_topics(Some(topics)).with_allow_auto_topic_creation(auto), 12).await
}

/// Directories `<topic>-<n>` in the log directory.
fn partition_dirs(log_dir: &Path, topic: &str) -> Vec<String> {
    let prefix = format!("{topic}-");
    let mut dirs: Vec<String> = std::fs::read_dir(log_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.strip_prefix(&prefix).is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
        .collect();
    dirs.sort();
    dirs
}

fn metadata_file_names(log_dir: &Path, topic: &str) -> bool {
    let text = std::fs::read_to_string(log_dir.join("strand-metadata.json")).unwrap();
    text.contains(&format!("\"{topic}\""))
}

async fn connect(broker: &ChildBroker) -> RawConn {
    RawConn::connect(broker.bootstrap().parse().unwrap()).await
}

/// A create that fails at one partition (a regular file sits where its
/// directory would go) removes every directory it made, reports
/// KAFKA_STORAGE_ERROR naming the path, leaves other topics working, and
/// leaves nothing for the next start to complain about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_create_leaves_nothing_and_can_be_retried() {
    let tmp = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(tmp.path());
    broker.start();
    let bootstrap = broker.bootstrap();
    common::create_topic(&bootstrap, "other", 2, &[]).await;
    let (_, first) = common::produce_one(&bootstrap, "other", 1, b"before").await;

    let blocker = broker.partition_dir("wide", 37);
    std::fs::write(&blocker, b"in the way").unwrap();
    let mut conn = connect(&broker).await;
    let (code, message) = create(&mut conn, "wide", 64).await;
    assert_eq!(code, KAFKA_STORAGE_ERROR, "message: {message}");
    assert!(message.contains("wide-37"), "the message names the unusable path: {message}");
    assert_eq!(
        partition_dirs(&broker.log_dir(), "wide"),
        Vec::<String>::new(),
        "directories left by the failed create"
    );
    assert_eq!(std::fs::read(&blocker).unwrap(), b"in the way", "what was there before is left alone");
    assert!(!metadata_file_names(&broker.log_dir(), "wide"), "the failed topic is not in the metadata file");
    let md = metadata(&mut conn, &["wide".into()], false).await;
    assert_eq!(md.topics[0].error_code, UNKNOWN_TOPIC_OR_PARTITION, "the failed topic does not exist");

    // Other topics are untouched, on the same connection and through librdkafka.
    let md = metadata(&mut conn, &["other".into()], false).await;
    assert_eq!((md.topics[0].error_code, md.topics[0].partitions.len()), (0, 2));
    let (_, second) = common::produce_one(&bootstrap, "other", 1, b"after").await;
    assert_eq!(second, first + 1);
    let got = common::consume(&bootstrap, "other", 1, first, 2, Duration::from_secs(20)).await;
    assert_eq!(got, vec![(first, b"before".to_vec()), (second, b"after".to_vec())]);
    drop(conn);

    // A restart finds no directory it does not know.
    broker.stop();
    broker.start();
    let stderr = broker.stderr();
    assert!(!stderr.contains(UNKNOWN_DIR_WARNING), "unknown directories at start-up:\n{stderr}");
    assert!(stderr.contains("strand started"));

    // With the obstacle gone the same create succeeds, and the topic works.
    std::fs::remove_file(&blocker).unwrap();
    common::create_topic(&broker.bootstrap(), "wide", 64, &[]).await;
    assert_eq!(partition_dirs(&broker.log_dir(), "wide").len(), 64);
    let (p, offset) = common::produce_one(&broker.bootstrap(), "wide", 37, b"in partition 37").await;
    assert_eq!((p, offset), (37, 0));
    let got = common::consume(&broker.bootstrap(), "other", 1, first, 2, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 2, "the other topic survived the restart");
    broker.stop();
}

/// A create that would not fit under RLIMIT_NOFILE is refused before any
/// partition is made; auto-creation from Metadata requests naming many
/// unknown topics stops at the same room, and the broker stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_beyond_the_fd_limit_is_refused_up_front() {
    let tmp = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(tmp.path()).with_nofile_limit(1024);
    broker.start();
    let mut conn = connect(&broker).await;

    let (code, message) = create(&mut conn, "wide", 1000).await;
    assert_eq!(code, INVALID_PARTITIONS, "message: {message}");
    assert!(message.contains("RLIMIT_NOFILE") && message.contains("1024"), "the message names the limit: {message}");
    assert_eq!(partition_dirs(&broker.log_dir(), "wide"), Vec::<String>::new());
    let md = metadata(&mut conn, &["wide".into()], false).await;
    assert_eq!(md.topics[0].error_code, UNKNOWN_TOPIC_OR_PARTITION);

    // What fits is still created, and works.
    let (code, message) = create(&mut conn, "narrow", 8).await;
    assert_eq!(code, 0, "message: {message}");
    let bootstrap = broker.bootstrap();
    let (_, offset) = common::produce_one(&bootstrap, "narrow", 3, b"fits").await;

    // Auto-creation: ask for unknown topics until the broker says they do not fit.
    let names: Vec<String> = (0..1000).map(|i| format!("auto-{i}")).collect();
    let mut refused = Vec::new();
    for _ in 0..60 {
        let md = metadata(&mut conn, &names, true).await;
        refused = md
            .topics
            .iter()
            .filter(|t| t.error_code == INVALID_PARTITIONS)
            .map(|t| t.name.as_ref().unwrap().0.to_string())
            .collect();
        if !refused.is_empty() {
            break;
        }
    }
    assert!(!refused.is_empty(), "auto-creation of 1000 topics fitted under 1024 descriptors");
    for name in &refused {
        assert_eq!(partition_dirs(&broker.log_dir(), name), Vec::<String>::new(), "{name} refused yet made");
    }
    // Still room for clients: a fresh connection and librdkafka round trip.
    let mut fresh = connect(&broker).await;
    let md = metadata(&mut fresh, &["narrow".into()], false).await;
    assert_eq!(md.topics[0].error_code, 0);
    let (_, next) = common::produce_one(&bootstrap, "narrow", 3, b"still fits").await;
    let got = common::consume(&bootstrap, "narrow", 3, offset, 2, Duration::from_secs(20)).await;
    assert_eq!(got, vec![(offset, b"fits".to_vec()), (next, b"still fits".to_vec())]);
    broker.stop();
}

/// FDS_PER_PARTITION is what a new partition really keeps open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fds_per_partition() {
    let tmp = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(tmp.path());
    broker.start();
    let mut conn = connect(&broker).await;
    let before = broker.open_fds();
    let (code, message) = create(&mut conn, "measured", 200).await;
    assert_eq!(code, 0, "message: {message}");
    let after = broker.open_fds();
    let per_partition = (after - before).div_ceil(200) as u64;
    println!("{before} -> {after} open descriptors for 200 partitions");
    assert_eq!(per_partition, 1, "one descriptor per new partition");
    assert!(per_partition <= strand::replica::fd_room::FDS_PER_PARTITION);
    broker.stop();
}
