//! The fuzz corpus (`fuzz/corpus/<target>/`) as a regression test on
//! stable Rust: every input is handed to its target's entry point in
//! `strand::fuzz`, as `cargo fuzz` does, and nothing may panic, on the test
//! thread or on any broker thread. Seeds are written by
//! `cargo test --test fuzz_corpus -- --ignored write_seed_corpus`; inputs the
//! fuzzer found interesting, and every malformed input a test or the fuzzer
//! caught, are added beside them.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::RawConn;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const TARGETS: [&str; 5] = ["request", "record_batches", "config", "controller_frame", "coordinator_records"];

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join("corpus").join(target)
}

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir(target))
        .unwrap_or_else(|e| panic!("{}: {e}", corpus_dir(target).display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

static PANICS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn every_corpus_input_is_handled_without_a_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default(info);
    }));
    let broker = strand::fuzz::RequestTarget::new();
    for target in TARGETS {
        let inputs = inputs(target);
        assert!(inputs.len() >= 3, "{target}: a corpus of at least three seeds");
        for (path, data) in &inputs {
            match target {
                "request" => broker.request(data),
                "record_batches" => strand::fuzz::record_batches(data),
                "config" => strand::fuzz::config(data),
                "controller_frame" => strand::fuzz::controller_frame(data),
                _ => strand::fuzz::coordinator_records(data),
            }
            assert_eq!(PANICS.load(Ordering::SeqCst), 0, "{target}: {} panicked", path.display());
        }
        println!("{target}: {} inputs", inputs.len());
    }
    drop(broker);
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a broker thread panicked");
}

fn name(s: &'static str) -> StrBytes {
    StrBytes::from_static_str(s)
}

/// A valid uncompressed v2 batch of `values`, base offset 0.
fn batch(values: &[&[u8]]) -> Vec<u8> {
    strand_storage::batch::build_test_batch(0, 1_700_000_000_000, values)
}

fn produce(topic: &'static str, records: Vec<u8>) -> ProduceRequest {
    ProduceRequest::default().with_acks(-1).with_timeout_ms(1000).with_topic_data(vec![
        produce_request::TopicProduceData::default().with_name(TopicName(name(topic))).with_partition_data(vec![
            produce_request::PartitionProduceData::default().with_index(0).with_records(Some(records.into())),
        ]),
    ])
}

/// Writes the seeds: one valid request of each kind a client sends first
/// (at versions the broker supports), batches, configs and controller
/// frames. Run by hand; the files are committed.
#[test]
#[ignore]
fn write_seed_corpus() {
    let write = |target: &str, file: &str, bytes: &[u8]| {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(file), bytes).unwrap();
    };
    let topic = || {
        create_topics_request::CreatableTopic::default()
            .with_name(TopicName(name("fuzz")))
            .with_num_partitions(1)
            .with_replication_factor(1)
    };
    let requests: Vec<(&str, bytes::BytesMut)> = vec![
        ("api_versions_v3", RawConn::encode_request(&ApiVersionsRequest::default(), 3, 1)),
        ("metadata_v12", RawConn::encode_request(&MetadataRequest::default().with_topics(None), 12, 2)),
        ("create_topics_v7", RawConn::encode_request(&CreateTopicsRequest::default().with_topics(vec![topic()]), 7, 3)),
        ("produce_v9", RawConn::encode_request(&produce("fuzz", batch(&[b"a", b"bc"])), 9, 4)),
        (
            "fetch_v12",
            RawConn::encode_request(
                &FetchRequest::default().with_max_wait_ms(10).with_topics(vec![fetch_request::FetchTopic::default()
                    .with_topic(TopicName(name("fuzz")))
                    .with_partitions(
                        vec![fetch_request::FetchPartition::default().with_partition_max_bytes(1 << 20)],
                    )]),
                12,
                5,
            ),
        ),
        (
            "list_offsets_v7",
            RawConn::encode_request(
                &ListOffsetsRequest::default().with_topics(vec![list_offsets_request::ListOffsetsTopic::default()
                    .with_name(TopicName(name("fuzz")))
                    .with_partitions(vec![list_offsets_request::ListOffsetsPartition::default().with_timestamp(-1)])]),
                7,
                6,
            ),
        ),
        (
            "find_coordinator_v4",
            RawConn::encode_request(&FindCoordinatorRequest::default().with_coordinator_keys(vec![name("g")]), 4, 7),
        ),
        (
            "init_producer_id_v4",
            RawConn::encode_request(&InitProducerIdRequest::default().with_transaction_timeout_ms(60000), 4, 8),
        ),
        (
            "join_group_v9",
            RawConn::encode_request(
                &JoinGroupRequest::default()
                    .with_group_id(GroupId(name("g")))
                    .with_session_timeout_ms(6000)
                    .with_rebalance_timeout_ms(100)
                    .with_protocol_type(name("consumer"))
                    .with_protocols(vec![
                        join_group_request::JoinGroupRequestProtocol::default().with_name(name("range"))
                    ]),
                9,
                9,
            ),
        ),
        (
            "offset_commit_v8",
            RawConn::encode_request(
                &OffsetCommitRequest::default().with_group_id(GroupId(name("g"))).with_topics(vec![
                    offset_commit_request::OffsetCommitRequestTopic::default()
                        .with_name(TopicName(name("fuzz")))
                        .with_partitions(vec![
                            offset_commit_request::OffsetCommitRequestPartition::default().with_committed_offset(1)
                        ]),
                ]),
                8,
                10,
            ),
        ),
        (
            "describe_configs_v4",
            RawConn::encode_request(
                &DescribeConfigsRequest::default().with_resources(vec![
                    describe_configs_request::DescribeConfigsResource::default()
                        .with_resource_type(2)
                        .with_resource_name(name("fuzz")),
                ]),
                4,
                11,
            ),
        ),
        (
            "delete_topics_v6",
            RawConn::encode_request(
                &DeleteTopicsRequest::default().with_topics(vec![
                    delete_topics_request::DeleteTopicState::default().with_name(Some(TopicName(name("fuzz"))))
                ]),
                6,
                12,
            ),
        ),
    ];
    for (file, bytes) in &requests {
        write("request", file, bytes);
    }

    write("record_batches", "one_record", &batch(&[b"x"]));
    write("record_batches", "three_records", &batch(&[b"a", b"", b"a longer value"]));
    let mut two = batch(&[b"a"]);
    two.extend(batch(&[b"b", b"c"]));
    write("record_batches", "two_batches", &two);
    let marker = strand_storage::batch::build_control_batch(1000, 0, true, 0, 1_700_000_000_000);
    write("record_batches", "commit_marker", &marker);

    // The malformed batches tests/bad_input.rs sends (refused before they
    // touch the log), as regressions here too.
    let mut bad_crc = batch(&[b"x"]);
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0xff;
    write("record_batches", "bad_crc", &bad_crc);
    let mut wrong_count = batch(&[b"a", b"b"]);
    wrong_count[57..61].copy_from_slice(&3i32.to_be_bytes());
    write("record_batches", "record_count_past_last_offset_delta", &wrong_count);
    let mut short = batch(&[b"a", b"b"]);
    short.truncate(short.len() - 3);
    write("record_batches", "cut_short", &short);

    write("config", "default", include_bytes!("../config/server.properties"));
    write("config", "cluster", b"node.id=1\nprocess.roles=broker,controller\ncontroller.quorum.voters=1@127.0.0.1:9093\nlisteners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093\ncontroller.listener.names=CONTROLLER\nlog.dirs=/tmp/x\n");
    write("config", "bad_values", b"log.segment.bytes=lots\nnum.partitions=-1\n");

    let hello = strand::controller::transport::Hello {
        node_id: 1,
        voters: "1@127.0.0.1:9093".into(),
        cluster_id: Some("c".into()),
        purpose: Default::default(),
    };
    write("controller_frame", "hello", &serde_json::to_vec(&hello).unwrap());
    let mut message = raft::eraftpb::Message::default();
    message.set_msg_type(raft::eraftpb::MessageType::MsgHeartbeat);
    message.from = 1;
    message.to = 2;
    message.term = 3;
    write("controller_frame", "raft_heartbeat", &protobuf::Message::write_to_bytes(&message).unwrap());
    write("controller_frame", "json_object", b"{\"Heartbeat\":{\"broker_id\":1}}");

    let key = strand::group::records::RecordKey::Offset { group: "g".into(), topic: "t".into(), partition: 0 };
    write("coordinator_records", "offset_key", &strand::group::records::encode_key(&key));
    write("coordinator_records", "txn_key", &strand::txn::records::encode_key("id"));
    write("coordinator_records", "short", &[0, 1, 0]);
}
