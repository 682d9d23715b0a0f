//! The KRaft-style cluster keys: a one-voter combined node is today's single
//! node; a controller-only node and a broker-only node run as real
//! processes; misconfigurations are refused by name. Larger clusters of
//! every kind of node: tests/cluster.rs.

mod common;

use common::*;

#[tokio::test]
async fn a_kafka_style_single_voter_node_serves_clients() {
    // The CONTROLLER port is bound here, before the voters name it.
    let controller = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let controller_port = controller.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let overrides = [
        "process.roles=broker,controller".to_string(),
        format!("controller.quorum.voters=1@127.0.0.1:{controller_port}"),
        format!("listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:{controller_port}"),
        "controller.listener.names=CONTROLLER".to_string(),
    ];
    let text = properties(&dir.path().join("data"), 0);
    let config = strand::BrokerConfig::from_properties(&text, "test", &overrides).expect("test config parses");
    let handle = strand::Broker::start_with_listeners(config, vec![("CONTROLLER".into(), controller)])
        .await
        .expect("broker starts");
    let broker = TestBroker { handle, dir };
    let (partition, offset) = produce_one(&broker.bootstrap(), "kraft-single", 0, b"hello").await;
    assert_eq!((partition, offset), (0, 0));
    broker.shutdown().await;
}

/// `Broker` is the node that serves clients: given a controller-only
/// configuration it refuses, pointing at `ControllerNode`, and writes nothing.
#[tokio::test]
async fn a_broker_refuses_a_controller_only_configuration_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("data");
    // Never bound: the broker refuses before it listens.
    let port = 9;
    let text = format!(
        "{}process.roles=controller\ncontroller.quorum.voters=1@127.0.0.1:{port},3@127.0.0.1:2,4@127.0.0.1:3\n\
         listeners=CONTROLLER://127.0.0.1:{port}\ncontroller.listener.names=CONTROLLER\n",
        properties(&log_dir, 0)
    );
    let config = strand::BrokerConfig::from_properties(&text, "test", &[]).expect("the keys parse");
    assert!(config.quorum.as_ref().unwrap().is_controller_only());
    let err = match strand::Broker::start(config).await {
        Ok(_) => panic!("a broker started as a controller-only node"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("process.roles=controller") && err.contains("ControllerNode"), "{err}");
    assert!(!log_dir.exists(), "start-up wrote {}", log_dir.display());
}

/// Two real processes: a controller-only node (the only voter; it binds
/// nothing but its CONTROLLER listener) and a broker-only node following
/// it. A client produces and reads back through the broker, the
/// controller's directory holds meta.properties with both ids, and both
/// stop on SIGTERM with status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_only_and_broker_only_processes_serve_a_client() {
    let dir = tempfile::tempdir().unwrap();
    let reserved = common::ports::ReservedPort::new();
    let controller_port = reserved.port();
    let voters = format!("controller.quorum.voters=1@127.0.0.1:{controller_port}");
    let mut controller = common::child::ChildBroker::new(&dir.path().join("controller"))
        .with_listener("CONTROLLER", reserved)
        .with_properties(&[
            "process.roles=controller",
            &voters,
            &format!("listeners=CONTROLLER://127.0.0.1:{controller_port}"),
            "controller.listener.names=CONTROLLER",
        ]);
    std::fs::create_dir_all(dir.path().join("controller")).unwrap();
    controller.start();
    let mut broker = common::child::ChildBroker::new(&dir.path().join("broker")).with_properties(&[
        "node.id=2",
        "process.roles=broker",
        &voters,
        "controller.listener.names=CONTROLLER",
        "broker.heartbeat.interval.ms=300",
        "broker.session.timeout.ms=3000",
    ]);
    std::fs::create_dir_all(dir.path().join("broker")).unwrap();
    broker.start();
    let (partition, offset) = produce_one(&broker.bootstrap(), "split-roles", 0, b"through a broker-only node").await;
    assert_eq!((partition, offset), (0, 0));
    let read = consume(&broker.bootstrap(), "split-roles", 0, 0, 1, std::time::Duration::from_secs(20)).await;
    assert_eq!(read, vec![(0, b"through a broker-only node".to_vec())]);
    let meta = std::fs::read_to_string(controller.log_dir().join("meta.properties")).unwrap();
    assert!(meta.contains("node.id=1\ncluster.id="), "{meta}");
    assert!(broker.partition_dir("split-roles", 0).is_dir(), "the partition lives on the broker");
    assert!(!controller.log_dir().join("split-roles-0").exists(), "and not on the controller");
    broker.stop();
    controller.stop();
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
