//! A cluster of real `strand` binaries: N child processes on loopback, each
//! a combined broker+controller node (ids 1..=N) with its own data
//! directory, killed (SIGKILL), stopped (SIGTERM) and restarted one by one
//! or all together. Readiness is judged through the Kafka protocol: every
//! running node answers Metadata listing every running node among its
//! (unfenced) brokers and naming the same active controller; and, so that a
//! node restarted within its old session is not taken for ready on the
//! strength of its previous registration, its stderr for this start says it
//! registered with the controller. Waits are bounded polls with deadlines.
//!
//! Ports: the harness reserves every node's client and CONTROLLER ports
//! before any node starts (see [`super::ports`]), writes them into every
//! node's `controller.quorum.voters` and `listeners`, and hands each start
//! of a node its listening sockets by file descriptor. No port is released
//! and re-bound, so none can be taken by another process, and a restarted
//! node serves on its old ports (they are its identity in the voters list).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use bytes::Buf;
use kafka_protocol::messages::{ApiKey, MetadataRequest, MetadataResponse, ResponseHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Request, StrBytes};

use super::ports::{spawn_with_listeners, ReservedPort};
use super::RawConn;

/// How long one node may take from spawn to "strand started".
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Metadata version used to watch the cluster (v12: topic ids, no
/// authorised operations).
const METADATA_VERSION: i16 = 12;

pub struct ChildNode {
    pub id: i32,
    pub dir: PathBuf,
    pub client_port: u16,
    pub controller_port: u16,
    client: ReservedPort,
    controller: ReservedPort,
    child: Option<Child>,
    starts: usize,
}

impl ChildNode {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn stderr_path(&self) -> PathBuf {
        self.dir.join(format!("stderr-{}.log", self.starts))
    }

    /// The stderr of the latest start.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The exit status if the child has exited (it is then reaped and forgotten).
    fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().expect("try_wait")?;
        self.child = None;
        Some(status)
    }
}

pub struct ChildCluster {
    pub nodes: Vec<ChildNode>,
    voters: String,
    extra: Vec<String>,
    root: tempfile::TempDir,
}

impl ChildCluster {
    /// Starts `n` nodes at once (a quorum needs a majority before anyone
    /// can register) and waits until the cluster is ready; `extra` are
    /// `key=value` lines for every node (they override the defaults: a
    /// 300 ms heartbeat and a 3000 ms session timeout).
    pub async fn start(n: i32, extra: &[&str], ready_timeout: Duration) -> ChildCluster {
        let root = tempfile::tempdir().expect("tempdir");
        let mut cluster = ChildCluster {
            nodes: Vec::new(),
            voters: String::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            root,
        };
        cluster.place(n);
        let ids: Vec<i32> = (1..=n).collect();
        for id in &ids {
            cluster.spawn(*id);
        }
        cluster.wait_started(&ids).await;
        cluster.wait_ready(ready_timeout).await;
        cluster
    }

    /// Reserves ports and makes directories for `n` nodes.
    fn place(&mut self, n: i32) {
        self.nodes = (1..=n)
            .map(|id| {
                let dir = self.root.path().join(format!("node-{id}"));
                std::fs::create_dir_all(&dir).expect("node dir");
                let (client, controller) = (ReservedPort::new(), ReservedPort::new());
                ChildNode {
                    id,
                    dir,
                    client_port: client.port(),
                    controller_port: controller.port(),
                    client,
                    controller,
                    child: None,
                    starts: 0,
                }
            })
            .collect();
        self.voters = self
            .nodes
            .iter()
            .map(|node| format!("{}@127.0.0.1:{}", node.id, node.controller_port))
            .collect::<Vec<_>>()
            .join(",");
    }

    fn properties(&self, id: i32) -> String {
        let node = self.node(id);
        let mut text = format!(
            "node.id={}\nprocess.roles=broker,controller\ncontroller.quorum.voters={}\n\
             listeners=PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}\ncontroller.listener.names=CONTROLLER\n\
             log.dirs={}\nnum.partitions=1\ndefault.replication.factor=1\n\
             broker.heartbeat.interval.ms=300\nbroker.session.timeout.ms=3000\n",
            node.id,
            self.voters,
            node.client_port,
            node.controller_port,
            node.log_dir().display()
        );
        for line in &self.extra {
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    /// Spawns node `id` (no waiting).
    fn spawn(&mut self, id: i32) {
        let properties = self.properties(id);
        let node = self.node_mut(id);
        assert!(node.child.is_none(), "node {id} is running");
        node.starts += 1;
        let config = node.dir.join("server.properties");
        std::fs::write(&config, properties).expect("write server.properties");
        let stderr = std::fs::File::create(node.stderr_path()).expect("stderr file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_strand"));
        command.arg(&config).env("RUST_LOG", "info").stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr);
        let listeners = vec![("PLAINTEXT", node.client.listener()), ("CONTROLLER", node.controller.listener())];
        let child = spawn_with_listeners(&mut command, listeners).expect("spawn strand");
        node.child = Some(child);
    }

    /// Waits (bounded) until each of `ids` has logged "strand started"; an
    /// early exit panics with the node's stderr.
    async fn wait_started(&mut self, ids: &[i32]) {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut pending: BTreeSet<i32> = ids.iter().copied().collect();
        while !pending.is_empty() {
            for id in pending.clone() {
                let node = self.node_mut(id);
                if node.stderr().contains("strand started") {
                    pending.remove(&id);
                } else if let Some(status) = node.exited() {
                    let stderr = node.stderr();
                    panic!("node {id} exited with {status} before starting; stderr:\n{stderr}");
                }
            }
            assert!(Instant::now() < deadline, "nodes {pending:?} did not start within {START_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn node(&self, id: i32) -> &ChildNode {
        &self.nodes[(id - 1) as usize]
    }

    fn node_mut(&mut self, id: i32) -> &mut ChildNode {
        &mut self.nodes[(id - 1) as usize]
    }

    pub fn bootstrap(&self, id: i32) -> String {
        format!("127.0.0.1:{}", self.node(id).client_port)
    }

    pub fn running(&self) -> Vec<i32> {
        self.nodes.iter().filter(|n| n.is_running()).map(|n| n.id).collect()
    }

    pub fn pid(&self, id: i32) -> u32 {
        self.node(id).child.as_ref().unwrap_or_else(|| panic!("node {id} is not running")).id()
    }

    /// Resident set size of node `id` in KiB (VmRSS of /proc/<pid>/status).
    pub fn rss_kib(&self, id: i32) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid(id))).expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }

    /// kill -9 of node `id`: a crash.
    pub fn kill(&mut self, id: i32) {
        let node = self.node_mut(id);
        assert!(node.is_running(), "node {id} is not running");
        kill_child(node);
    }

    /// SIGSTOP to node `id`: frozen, as in a long GC pause or a hung VM; its
    /// sockets stay open but nothing answers. Do not ask it anything until
    /// [`Self::resume`].
    pub fn pause(&mut self, id: i32) {
        let pid = self.pid(id) as libc::pid_t;
        // SAFETY: plain kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP node {id}");
    }

    /// SIGCONT to node `id`, paused before.
    pub fn resume(&mut self, id: i32) {
        let pid = self.pid(id) as libc::pid_t;
        // SAFETY: plain kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0, "SIGCONT node {id}");
    }

    /// SIGTERM to node `id`; it must exit 0 (bounded wait) after logging "strand stopped".
    pub fn terminate(&mut self, id: i32) {
        let pid = self.pid(id) as libc::pid_t;
        // SAFETY: plain kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM node {id}");
        let node = self.node_mut(id);
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = node.exited() {
                break status;
            }
            if Instant::now() >= deadline {
                kill_child(node);
                panic!("node {id} did not exit within 30 s of SIGTERM; stderr:\n{}", node.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let stderr = node.stderr();
        assert!(status.success() && stderr.contains("strand stopped"), "node {id} exited {status}; stderr:\n{stderr}");
    }

    /// Restarts the stopped nodes `ids` on their ports with their data, all
    /// at once, and waits (bounded) until each has started.
    pub async fn restart(&mut self, ids: &[i32]) {
        for id in ids {
            self.spawn(*id);
        }
        self.wait_started(ids).await;
    }

    /// Metadata (v12) from node `id`, for `topics` (`None`: every topic).
    pub async fn metadata(&self, id: i32, topics: Option<&[&str]>) -> Result<MetadataResponse, String> {
        metadata(self.node(id).addr(), topics).await
    }

    /// Waits until every running node answers Metadata listing every
    /// running node as an unfenced broker and naming one active controller
    /// (the same on all, and running), and each running node's stderr for
    /// its current start says it registered. Returns the controller's id.
    pub async fn wait_ready(&mut self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        loop {
            for node in &mut self.nodes {
                if node.is_running() {
                    if let Some(status) = node.exited() {
                        panic!("node {} exited with {status}; stderr:\n{}", node.id, node.stderr());
                    }
                }
            }
            let why = match self.ready_now().await {
                Ok(controller) => return controller,
                Err(why) => why,
            };
            if Instant::now() >= deadline {
                let stderrs: String = self
                    .running()
                    .iter()
                    .map(|id| format!("--- node {id} stderr:\n{}\n", tail(&self.node(*id).stderr(), 40)))
                    .collect();
                panic!("the cluster was not ready within {timeout:?}: {why}\n{stderrs}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn ready_now(&self) -> Result<i32, String> {
        let running = self.running();
        let mut controller = None;
        for id in &running {
            if !self.node(*id).stderr().contains("registered with the controller") {
                return Err(format!("node {id} has not registered in this start"));
            }
            let md = self.metadata(*id, Some(&[])).await.map_err(|e| format!("node {id}: {e}"))?;
            let brokers: BTreeSet<i32> = md.brokers.iter().map(|b| b.node_id.0).collect();
            if let Some(missing) = running.iter().find(|r| !brokers.contains(r)) {
                return Err(format!("node {id} lists brokers {brokers:?}, without {missing}"));
            }
            let c = md.controller_id.0;
            if !running.contains(&c) {
                return Err(format!("node {id} names controller {c}"));
            }
            if controller.is_some_and(|other| other != c) {
                return Err(format!("nodes disagree on the controller ({controller:?} and {c})"));
            }
            controller = Some(c);
        }
        controller.ok_or_else(|| "no node is running".to_string())
    }
}

impl Drop for ChildCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            kill_child(node);
        }
    }
}

fn kill_child(node: &mut ChildNode) {
    if let Some(mut child) = node.child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// One Metadata (v12) round trip to `addr` with a 5 s bound; errors as text
/// (a node that is starting or gone is not a test failure by itself).
pub async fn metadata(addr: SocketAddr, topics: Option<&[&str]>) -> Result<MetadataResponse, String> {
    let request = MetadataRequest::default().with_allow_auto_topic_creation(false).with_topics(topics.map(|names| {
        names
            .iter()
            .map(|n| {
                kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(n.to_string()))))
            })
            .collect()
    }));
    let round_trip = async {
        let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
        let mut conn = RawConn { stream, next_correlation_id: 1 };
        let body = RawConn::encode_request(&request, METADATA_VERSION, 1);
        conn.write_frame(&body).await.map_err(|e| format!("write to {addr}: {e}"))?;
        let mut frame = conn.read_frame().await.map_err(|e| format!("read from {addr}: {e}"))?;
        let api_key = ApiKey::try_from(MetadataRequest::KEY).expect("known key");
        let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(METADATA_VERSION))
            .map_err(|e| format!("response header: {e}"))?;
        if header.correlation_id != 1 {
            return Err(format!("correlation id {}", header.correlation_id));
        }
        let response =
            MetadataResponse::decode(&mut frame, METADATA_VERSION).map_err(|e| format!("Metadata response: {e}"))?;
        if frame.remaining() != 0 {
            return Err("trailing bytes after the Metadata response".into());
        }
        Ok(response)
    };
    tokio::time::timeout(Duration::from_secs(5), round_trip)
        .await
        .unwrap_or_else(|_| Err(format!("{addr}: no answer in 5 s")))
}
