//! An in-process cluster of combined broker+controller nodes on loopback.
//! Every node's client and CONTROLLER listeners are bound before any node
//! starts (the voters list needs their ports) and handed to the broker
//! bound, so no port is released and re-bound in between. A stopped node
//! restarts on the same ports with its data.

use std::path::PathBuf;
use std::time::Duration;

use tokio::net::TcpListener;

pub struct ClusterNode {
    pub id: i32,
    /// A voter (combined broker+controller) or a broker-only node.
    pub voter: bool,
    pub dir: PathBuf,
    pub client_port: u16,
    pub controller_port: u16,
    pub handle: Option<strand::BrokerHandle>,
}

pub struct TestCluster {
    pub nodes: Vec<ClusterNode>,
    voters: String,
    extra: Vec<String>,
    _root: tempfile::TempDir,
}

impl TestCluster {
    /// Starts `n` nodes (ids 1..=n) with short heartbeat and session
    /// timeouts; `extra` are `key=value` lines for every node.
    pub async fn start(n: i32, extra: &[&str]) -> TestCluster {
        Self::start_mixed(n, 0, extra).await
    }

    /// `voters` combined broker+controller nodes (ids 1..=voters), then
    /// `brokers` broker-only nodes (the next ids), which follow the log
    /// from the voters.
    pub async fn start_mixed(voters: i32, brokers: i32, extra: &[&str]) -> TestCluster {
        let n = voters + brokers;
        let root = tempfile::tempdir().expect("tempdir");
        let mut bound = Vec::new();
        for id in 1..=n {
            let client = TcpListener::bind("127.0.0.1:0").await.expect("bind client listener");
            let controller = TcpListener::bind("127.0.0.1:0").await.expect("bind controller listener");
            bound.push((id, client, controller));
        }
        let voter_count = voters;
        let voters = bound
            .iter()
            .filter(|(id, _, _)| *id <= voter_count)
            .map(|(id, _, c)| format!("{id}@127.0.0.1:{}", c.local_addr().unwrap().port()))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = TestCluster {
            nodes: Vec::new(),
            voters,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            _root: root,
        };
        let mut listeners = Vec::new();
        for (id, client, controller) in bound {
            let dir = cluster._root.path().join(format!("node-{id}"));
            cluster.nodes.push(ClusterNode {
                id,
                voter: id <= voter_count,
                dir,
                client_port: client.local_addr().unwrap().port(),
                controller_port: controller.local_addr().unwrap().port(),
                handle: None,
            });
            listeners.push((client, controller));
        }
        // Start all at once: a quorum needs a majority before anyone can register.
        let starts = listeners.into_iter().enumerate().map(|(i, (client, controller))| {
            let config = cluster.config(i);
            // A broker-only node binds no CONTROLLER listener.
            let mut prebound = vec![("PLAINTEXT".to_string(), client)];
            if cluster.nodes[i].voter {
                prebound.push(("CONTROLLER".to_string(), controller));
            }
            async move { strand::Broker::start_with_listeners(config, prebound).await.expect("cluster node starts") }
        });
        let handles = futures_util::future::join_all(starts).await;
        for (node, handle) in cluster.nodes.iter_mut().zip(handles) {
            node.handle = Some(handle);
        }
        cluster
    }

    pub fn config(&self, i: usize) -> strand::BrokerConfig {
        let node = &self.nodes[i];
        let (roles, listeners) = if node.voter {
            (
                "broker,controller",
                format!("PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}", node.client_port, node.controller_port),
            )
        } else {
            ("broker", format!("PLAINTEXT://127.0.0.1:{}", node.client_port))
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
        strand::BrokerConfig::from_properties(&text, "cluster test", &[]).expect("cluster config parses")
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

    pub fn running(&self) -> Vec<i32> {
        self.nodes.iter().filter(|n| n.handle.is_some()).map(|n| n.id).collect()
    }

    /// The active controller as the running nodes agree on it.
    pub fn active_controller(&self) -> Option<i32> {
        let views: Vec<Option<i32>> =
            self.running().iter().map(|id| self.state(*id).cluster().unwrap().quorum().leader).collect();
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
        let handle = self.nodes[(id - 1) as usize].handle.take().expect("node is running");
        handle.shutdown().await;
    }

    /// Restarts a stopped node on its ports with its data.
    pub async fn restart(&mut self, id: i32) {
        let i = (id - 1) as usize;
        assert!(self.nodes[i].handle.is_none(), "node {id} is running");
        let config = self.config(i);
        let handle = strand::Broker::start(config).await.expect("cluster node restarts");
        self.nodes[i].handle = Some(handle);
    }

    /// Restarts several stopped nodes at once (a quorum needs a majority).
    pub async fn restart_all(&mut self, ids: &[i32]) {
        let configs: Vec<(usize, strand::BrokerConfig)> =
            ids.iter().map(|id| ((id - 1) as usize, self.config((id - 1) as usize))).collect();
        let starts = configs
            .into_iter()
            .map(|(i, config)| async move { (i, strand::Broker::start(config).await.expect("cluster node restarts")) });
        for (i, handle) in futures_util::future::join_all(starts).await {
            self.nodes[i].handle = Some(handle);
        }
    }

    pub async fn shutdown(mut self) {
        let stops = self.nodes.iter_mut().filter_map(|n| n.handle.take()).map(|h| h.shutdown());
        futures_util::future::join_all(stops).await;
    }
}
