//! The KRaft-style cluster keys: a one-voter combined node is today's single
//! node; controller-only nodes (not built yet) are refused at start-up with a
//! message naming the key, touching no data. Broker-only nodes:
//! tests/cluster.rs. Multi-node clusters of combined nodes: tests/cluster.rs.

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
async fn a_controller_only_node_is_refused_by_name_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("data");
    let port = free_port();
    let text = format!(
        "{}process.roles=controller\ncontroller.quorum.voters=1@127.0.0.1:{port},3@127.0.0.1:2,4@127.0.0.1:3\n\
         listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:{port}\ncontroller.listener.names=CONTROLLER\n",
        properties(&log_dir, 0)
    );
    let config = strand::BrokerConfig::from_properties(&text, "test", &[]).expect("the keys parse");
    assert_eq!(config.quorum.as_ref().unwrap().voters.len(), 3);
    let err = match strand::Broker::start(config).await {
        Ok(_) => panic!("a controller-only node started"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("process.roles=controller"), "{err}");
    assert!(!log_dir.exists(), "start-up wrote {}", log_dir.display());
}

#[test]
fn a_broker_only_node_listed_as_a_voter_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{}process.roles=broker\ncontroller.quorum.voters=1@127.0.0.1:1,2@127.0.0.1:2,3@127.0.0.1:3\n\
         controller.listener.names=CONTROLLER\n",
        properties(&dir.path().join("data"), 0)
    );
    let err = strand::BrokerConfig::from_properties(&text, "test", &[]).unwrap_err().to_string();
    assert!(err.contains("controller.quorum.voters") && err.contains("process.roles"), "{err}");
}
