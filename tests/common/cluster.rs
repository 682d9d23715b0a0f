//! An in-process cluster on loopback: combined broker+controller nodes,
//! and optionally broker-only and controller-only nodes. Every node's client
//! and CONTROLLER listeners are bound before any node starts (the voters
//! list needs their ports) and handed to the node bound, so no port is
//! released and re-bound in between. A stopped node restarts on the same
//! ports with its data.
//!
//! Each cluster prints its seed ("cluster seed: N"); `STRAND_CLUSTER_SEED=N`
//! repeats it. The seed fixes what the controllers make up (topic ids,
//! hence where partitions are placed, and proposal ids); raft-rs' election
//! timeouts and the OS's ports and scheduling stay outside it.

use std::path::PathBuf;
use std::time::Duration;

use tokio::net::TcpListener;

/// What a node of the test cluster runs as (`process.roles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// broker,controller: a voter that serves clients.
    Combined,
    /// broker: follows the log from the voters.
    Broker,
    /// controller: a voter that serves no clients.
    Controller,
}

impl Role {
    pub fn is_voter(self) -> bool {
        self != Role::Broker
    }

    pub fn is_broker(self) -> bool {
        self != Role::Controller
    }
}

pub struct ClusterNode {
    pub id: i32,
    pub role: Role,
    pub dir: PathBuf,
    pub client_port: u16,
    pub controller_port: u16,
    pub handle: Option<strand::BrokerHandle>,
    /// The running node when `role` is `Controller`.
    pub controller: Option<strand::ControllerNode>,
}

impl ClusterNode {
    fn is_running(&self) -> bool {
        self.handle.is_some() || self.controller.is_some()
    }
}

pub struct TestCluster {
    pub nodes: Vec<ClusterNode>,
    voters: String,
    extra: Vec<String>,
    seed: u64,
    _root: tempfile::TempDir,
}

impl TestCluster {
    /// Starts `n` combined nodes (ids 1..=n) with short heartbeat and
    /// session timeouts; `extra` are `key=value` lines for every node.
    pub async fn start(n: i32, extra: &[&str]) -> TestCluster {
        Self::start_roles(&vec![Role::Combined; n as usize], extra).await
    }

    /// One node per entry of `roles`, ids 1.. in order.
    pub async fn start_roles(roles: &[Role], extra: &[&str]) -> TestCluster {
        let root = tempfile::tempdir().expect("tempdir");
        let mut bound = Vec::new();
        for (i, role) in roles.iter().enumerate() {
            let client = TcpListener::bind("127.0.0.1:0").await.expect("bind client listener");
            let controller = TcpListener::bind("127.0.0.1:0").await.expect("bind controller listener");
            bound.push((i as i32 + 1, *role, client, controller));
        }
        let voters = bound
            .iter()
            .filter(|(_, role, _, _)| role.is_voter())
            .map(|(id, _, _, c)| format!("{id}@127.0.0.1:{}", c.local_addr().unwrap().port()))
            .collect::<Vec<_>>()
            .join(",");
        let seed = match std::env::var("STRAND_CLUSTER_SEED") {
            Ok(s) => s.parse().expect("STRAND_CLUSTER_SEED is a u64"),
            Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
        };
        eprintln!("cluster seed: {seed} (STRAND_CLUSTER_SEED={seed} repeats it)");
        let mut cluster = TestCluster {
            nodes: Vec::new(),
            voters,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            seed,
            _root: root,
        };
        let mut listeners = Vec::new();
        for (id, role, client, controller) in bound {
            let dir = cluster._root.path().join(format!("node-{id}"));
            cluster.nodes.push(ClusterNode {
                id,
                role,
                dir,
                client_port: client.local_addr().unwrap().port(),
                controller_port: controller.local_addr().unwrap().port(),
                handle: None,
                controller: None,
            });
            listeners.push((client, controller));
        }
        // Start all at once: a quorum needs a majority before anyone can register.
        let starts = listeners.into_iter().enumerate().map(|(i, (client, controller))| {
            let config = cluster.config(i);
            let role = cluster.nodes[i].role;
            async move {
                match role {
                    Role::Controller => {
                        let node = strand::ControllerNode::start_with_listener(config, Some(controller))
                            .await
                            .expect("controller node starts");
                        (None, Some(node))
                    }
                    _ => {
                        // A broker-only node binds no CONTROLLER listener.
                        let mut prebound = vec![("PLAINTEXT".to_string(), client)];
                        if role.is_voter() {
                            prebound.push(("CONTROLLER".to_string(), controller));
                        }
                        let handle =
                            strand::Broker::start_with_listeners(config, prebound).await.expect("cluster node starts");
                        (Some(handle), None)
                    }
                }
            }
        });
        let handles = futures_util::future::join_all(starts).await;
        for (node, (handle, controller)) in cluster.nodes.iter_mut().zip(handles) {
            node.handle = handle;
            node.controller = controller;
        }
        cluster
    }

    pub fn config(&self, i: usize) -> strand::BrokerConfig {
        let node = &self.nodes[i];
        let controller = format!("CONTROLLER://127.0.0.1:{}", node.controller_port);
        let client = format!("PLAINTEXT://127.0.0.1:{}", node.client_port);
        let (roles, listeners) = match node.role {
            Role::Combined => ("broker,controller", format!("{client},{controller}")),
            Role::Broker => ("broker", client),
            Role::Controller => ("controller", controller),
        };
        let mut text = format!(
            "node.id={}\nprocess.roles={roles}\ncontroller.quorum.voters={}\n\
             listeners={listeners}\ncontroller.listener.names=CONTROLLER\n\
             log.dirs={}\nnum.partitions=1\ndefault.replication.factor=1\n\
             broker.heartbeat.interval.ms=300\nbroker.session.timeout.ms=3000\n",
            node.id,
            self.voters,
            node.dir.join("data").display()
        );
        for line in &self.extra {
            text.push_str(line);
            text.push('\n');
        }
        let mut config =
            strand::BrokerConfig::from_properties(&text, "cluster test", &[]).expect("cluster config parses");
        if let Some(q) = config.quorum.as_mut() {
            q.seed = Some(self.seed);
        }
        config
    }

    pub fn bootstrap(&self, id: i32) -> String {
        format!("127.0.0.1:{}", self.node(id).client_port)
    }

    pub fn addr(&self, id: i32) -> std::net::SocketAddr {
        self.bootstrap(id).parse().unwrap()
    }

    pub fn node(&self, id: i32) -> &ClusterNode {
        &self.nodes[(id - 1) as usize]
    }

    pub fn state(&self, id: i32) -> &std::sync::Arc<strand::broker::BrokerState> {
        self.node(id).handle.as_ref().expect("node is running").state()
    }

    /// The running brokers (combined and broker-only nodes).
    pub fn running(&self) -> Vec<i32> {
        self.nodes.iter().filter(|n| n.handle.is_some()).map(|n| n.id).collect()
    }

    /// The active controller as every running node agrees on it.
    pub fn active_controller(&self) -> Option<i32> {
        let mut views: Vec<Option<i32>> =
            self.running().iter().map(|id| self.state(*id).cluster().unwrap().quorum().leader).collect();
        views.extend(self.nodes.iter().filter_map(|n| n.controller.as_ref()).map(|c| c.quorum().leader));
        views.first().copied().flatten().filter(|l| views.iter().all(|v| *v == Some(*l)))
    }

    /// Waits until every running node sees every running node registered
    /// and unfenced, and one active controller.
    pub async fn wait_ready(&self, timeout: Duration) {
        let running = self.running();
        super::wait_for("the cluster to be ready", timeout, Duration::from_millis(20), || {
            let ok = self.active_controller().is_some()
                && running.iter().all(|id| {
                    let image = self.state(*id).cluster().unwrap().image();
                    running.iter().all(|other| image.brokers.get(other).is_some_and(|b| !b.fenced))
                        && self.state(*id).cluster().unwrap().is_active()
                });
            async move { ok.then_some(()) }
        })
        .await;
    }

    /// Graceful stop of one node (controlled shutdown, then the controller).
    pub async fn stop(&mut self, id: i32) {
        let node = &mut self.nodes[(id - 1) as usize];
        assert!(node.is_running(), "node {id} is running");
        if let Some(handle) = node.handle.take() {
            handle.shutdown().await;
        }
        if let Some(controller) = node.controller.take() {
            controller.shutdown().await;
        }
    }

    /// Restarts a stopped node on its ports with its data.
    pub async fn restart(&mut self, id: i32) {
        self.restart_all(&[id]).await;
    }

    /// Restarts several stopped nodes at once (a quorum needs a majority).
    pub async fn restart_all(&mut self, ids: &[i32]) {
        let configs: Vec<(usize, Role, strand::BrokerConfig)> = ids
            .iter()
            .map(|id| {
                let i = (id - 1) as usize;
                assert!(!self.nodes[i].is_running(), "node {id} is running");
                (i, self.nodes[i].role, self.config(i))
            })
            .collect();
        let starts = configs.into_iter().map(|(i, role, config)| async move {
            if role == Role::Controller {
                let node = strand::ControllerNode::start(config).await.expect("controller node restarts");
                (i, None, Some(node))
            } else {
                (i, Some(strand::Broker::start(config).await.expect("cluster node restarts")), None)
            }
        });
        for (i, handle, controller) in futures_util::future::join_all(starts).await {
            self.nodes[i].handle = handle;
            self.nodes[i].controller = controller;
        }
    }

    /// Stops every node: brokers first (their controlled shutdown needs the
    /// controllers), then controller-only nodes.
    pub async fn shutdown(mut self) {
        let stops = self.nodes.iter_mut().filter_map(|n| n.handle.take()).map(|h| h.shutdown());
        futures_util::future::join_all(stops).await;
        let stops = self.nodes.iter_mut().filter_map(|n| n.controller.take()).map(|c| c.shutdown());
        futures_util::future::join_all(stops).await;
    }
}
