//! Three controllers in one process, over real TCP on loopback and real
//! fsynced metadata logs: a leader is elected, brokers register and are
//! unfenced, a topic is placed over them, every node applies the same image;
//! the leader is stopped and another takes over; the stopped node restarts
//! from its own disk and catches up.

use std::sync::Arc;
use std::time::Duration;

use strand::config::Voter;
use strand::controller::core::{Reply, Request};
use strand::controller::driver::{Controller, DriverError, DriverSettings};
use strand::metadata::image::ClusterImage;
use strand::metadata::records::Endpoint;
use tokio::net::TcpListener;

const WAIT: Duration = Duration::from_secs(20);

struct Node {
    id: i32,
    dir: std::path::PathBuf,
    controller: Option<Controller>,
}

fn settings(id: i32, voters: &[Voter], dir: &std::path::Path) -> DriverSettings {
    // Production timing (50 ms tick, election after 1-2 s of silence), so the
    // failover time printed below is the real one.
    DriverSettings::new(id, voters.to_vec(), dir.to_path_buf())
}

/// Binds every node's CONTROLLER port before any node is told the voters.
async fn cluster(root: &std::path::Path, n: i32) -> (Vec<Node>, Vec<Voter>) {
    let mut listeners = Vec::new();
    let mut voters = Vec::new();
    for id in 1..=n {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        voters.push(Voter { id, host: "127.0.0.1".into(), port: l.local_addr().unwrap().port() });
        listeners.push(l);
    }
    let mut nodes = Vec::new();
    for (l, v) in listeners.into_iter().zip(&voters) {
        let dir = root.join(format!("node-{}", v.id));
        let c = Controller::start(settings(v.id, &voters, &dir), l).await.unwrap();
        nodes.push(Node { id: v.id, dir, controller: Some(c) });
    }
    (nodes, voters)
}

async fn leader(nodes: &[Node]) -> i32 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        for n in nodes {
            if let Some(c) = &n.controller {
                if c.view().borrow().is_leader {
                    return n.id;
                }
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no leader elected within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends to whichever node leads, following NotController answers.
async fn call(nodes: &[Node], request: Request) -> Reply {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let id = leader(nodes).await;
        let c = nodes.iter().find(|n| n.id == id).unwrap().controller.as_ref().unwrap();
        match c.request(request.clone()).await {
            Ok(r) => return r,
            Err(DriverError::NotController { .. }) | Err(DriverError::Timeout) => {
                assert!(tokio::time::Instant::now() < deadline, "{request:?} not answered");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{request:?}: {e}"),
        }
    }
}

async fn wait_image(c: &Controller, what: &str, ok: impl Fn(&ClusterImage) -> bool) -> Arc<ClusterImage> {
    let mut rx = c.image();
    let r = tokio::time::timeout(WAIT, async {
        loop {
            let img = rx.borrow_and_update().clone();
            if ok(&img) {
                return img;
            }
            if rx.changed().await.is_err() {
                panic!("controller stopped while waiting for {what}");
            }
        }
    })
    .await;
    r.unwrap_or_else(|_| panic!("{what} not reached within {WAIT:?}"))
}

async fn register(nodes: &[Node], broker_id: i32) -> i64 {
    let reply = call(
        nodes,
        Request::Register {
            broker_id,
            incarnation_id: uuid::Uuid::new_v4(),
            endpoints: vec![Endpoint { name: "PLAINTEXT".into(), host: "127.0.0.1".into(), port: 1 }],
            rack: None,
            clean_shutdown: true,
        },
    )
    .await;
    let Reply::Registered { epoch } = reply else { panic!("{reply:?}") };
    epoch
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_agree_fail_over_and_recover_from_disk() {
    let root = tempfile::tempdir().unwrap();
    let (mut nodes, voters) = cluster(root.path(), 3).await;
    let first = leader(&nodes).await;

    let mut epochs = Vec::new();
    for b in 1..=3 {
        epochs.push(register(&nodes, b).await);
    }
    for (b, epoch) in (1..=3).zip(&epochs) {
        let applied = nodes[0].controller.as_ref().unwrap().image().borrow().offset;
        let r = call(
            &nodes,
            Request::Heartbeat {
                broker_id: b,
                epoch: *epoch,
                applied_offset: applied.max(*epoch as u64),
                want_shutdown: false,
            },
        )
        .await;
        assert_eq!(r, Reply::Heartbeat { fenced: false, shutdown_done: false });
    }
    let r = call(
        &nodes,
        Request::CreateTopic {
            name: "t".into(),
            partitions: 6,
            replication_factor: 1,
            configs: Default::default(),
            assignment: None,
        },
    )
    .await;
    let Reply::TopicCreated { id } = r else { panic!("{r:?}") };

    // Every node applies the same image.
    let mut images = Vec::new();
    for n in &nodes {
        let c = n.controller.as_ref().unwrap();
        images.push(wait_image(c, "the topic on every node", |i| i.topic("t").is_some_and(|t| t.id == id)).await);
    }
    let leaders: std::collections::BTreeSet<i32> =
        images[0].topic("t").unwrap().partitions.values().map(|p| p.leader).collect();
    assert_eq!(leaders.len(), 3, "partitions led by all three brokers");
    let cluster_id = images[0].cluster_id.clone().expect("the first leader wrote a cluster id");
    assert!(images.iter().all(|i| i.cluster_id.as_ref() == Some(&cluster_id)));

    // Stop the leader: another is elected and takes requests.
    let idx = nodes.iter().position(|n| n.id == first).unwrap();
    let stopped = std::time::Instant::now();
    nodes[idx].controller.take().unwrap().stop().await;
    let second = leader(&nodes).await;
    assert_ne!(second, first);
    let r = call(
        &nodes,
        Request::CreateTopic {
            name: "u".into(),
            partitions: 2,
            replication_factor: 1,
            configs: Default::default(),
            assignment: None,
        },
    )
    .await;
    assert!(matches!(r, Reply::TopicCreated { .. }), "{r:?}");
    println!(
        "controller failover: leader {first} stopped, {second} elected and committed the next record in {} ms",
        stopped.elapsed().as_millis()
    );

    // The stopped node restarts from its disk and catches up with both topics.
    let l = TcpListener::bind(("127.0.0.1", voters[idx].port)).await.unwrap();
    let c = Controller::start(settings(first, &voters, &nodes[idx].dir), l).await.unwrap();
    let img = wait_image(&c, "both topics after restart", |i| i.topic("t").is_some() && i.topic("u").is_some()).await;
    assert_eq!(img.cluster_id.as_ref(), Some(&cluster_id));
    nodes[idx].controller = Some(c);

    for n in nodes.iter_mut() {
        n.controller.take().unwrap().stop().await;
    }

    // All three restart from disk: the same topics, ids and cluster id.
    let (nodes, _) = {
        let mut listeners = Vec::new();
        for v in &voters {
            listeners.push(TcpListener::bind(("127.0.0.1", v.port)).await.unwrap());
        }
        let mut again = Vec::new();
        for (l, v) in listeners.into_iter().zip(&voters) {
            let dir = root.path().join(format!("node-{}", v.id));
            let c = Controller::start(settings(v.id, &voters, &dir), l).await.unwrap();
            again.push(Node { id: v.id, dir, controller: Some(c) });
        }
        (again, ())
    };
    for n in &nodes {
        let img = wait_image(n.controller.as_ref().unwrap(), "the image after a full restart", |i| {
            i.topic("t").is_some_and(|t| t.id == id) && i.topic("u").is_some()
        })
        .await;
        assert_eq!(img.cluster_id.as_ref(), Some(&cluster_id));
    }
    leader(&nodes).await;
    for mut n in nodes {
        n.controller.take().unwrap().stop().await;
    }
}
