//! The KRaft-style cluster keys: a one-voter combined node is today's single
//! node; node roles this build does not run yet (broker-only,
//! controller-only) are refused at start-up with a message naming the key,
//! touching no data. Multi-node clusters of combined nodes: tests/cluster.rs.

mod common;

use common::*;

#[tokio::test]
async fn a_kafka_style_single_voter_node_serves_clients() {
    let controller_port = free_port();
    let broker = start_broker(&[
        "process.roles=broker,controller",
        &format!("controller.quorum.voters=1@127.0.0.1:{controller_port}"),
        &format!("listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:{controller_port}"),
        "controller.listener.names=CONTROLLER",
    ])
    .await;
    let (partition, offset) = produce_one(&broker.bootstrap(), "kraft-single", 0, b"hello").await;
    assert_eq!((partition, offset), (0, 0));
    broker.shutdown().await;
}

#[tokio::test]
async fn a_broker_only_node_is_refused_by_name_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("data");
    let text = format!(
        "{}process.roles=broker\ncontroller.quorum.voters=2@127.0.0.1:1,3@127.0.0.1:2,4@127.0.0.1:3\n\
         listeners=PLAINTEXT://127.0.0.1:0\ncontroller.listener.names=CONTROLLER\n",
        properties(&log_dir, 0)
    );
    let config = strand::BrokerConfig::from_properties(&text, "test", &[]).expect("the keys parse");
    assert_eq!(config.quorum.as_ref().unwrap().voters.len(), 3);
    let err = match strand::Broker::start(config).await {
        Ok(_) => panic!("a broker-only node started"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("process.roles=broker"), "{err}");
    assert!(!log_dir.exists(), "start-up wrote {}", log_dir.display());
}
