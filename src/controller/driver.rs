//! The thin async driver that runs one controller: a [`QuorumNode`] over a
//! [`DiskStore`], the [`ControllerCore`], and the CONTROLLER listener.
//!
//! One thread owns the raft node, the store and the core, and takes every
//! input from one channel: clock ticks, raft messages from peers, requests,
//! unreachable-peer reports. After each input it runs the Ready contract
//! ([`QuorumNode::handle_ready`], which fsyncs), applies committed entries to
//! the core's image, answers requests whose batch committed, publishes the
//! image, and hands messages to one sender task per peer. Disk writes
//! block only that thread, never a tokio worker.
//!
//! A request reaching a node that is not the active controller gets
//! [`DriverError::NotController`] naming the leader it knows;
//! [`Controller::submit`] follows that hint, forwarding the request over
//! the CONTROLLER listener (a [`Purpose::Requests`] connection) to the
//! leader, and answers once this node has applied the reply's offset too. A proposal
//! raft drops is retried on every tick until it is appended or its
//! deadline passes; one appended but lost to a leader change is answered
//! with `NotController`, and the caller retries (records are idempotent).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::eraftpb::{Message, MessageType};
use raft::StateRole;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

use super::client::ControllerClient;
use super::core::{ControllerCore, CoreSettings, Effect, Input as CoreInput, Reply, Request, RequestId};
use super::describe::{wall_clock_ms, FollowerContact, QuorumDescription, ReplicaDescription};
use super::disk::DiskStore;
use super::feed::MetadataFeed;
use super::node::{is_app_data, LeaderChange, ProposeError, QuorumConfig, QuorumNode};
use super::store::StoreError;
use super::transport::{self, Hello, Purpose};
use crate::config::Voter;
use crate::metadata::image::ClusterImage;
use crate::metadata::records::{MetadataRecord, RecordBatch};

#[derive(Debug, Clone)]
pub struct DriverSettings {
    pub node_id: i32,
    pub voters: Vec<Voter>,
    pub metadata_log_dir: PathBuf,
    pub session_timeout_ms: u64,
    /// See [`CoreSettings::connection_loss_grace_ms`].
    pub connection_loss_grace_ms: Option<u64>,
    /// See [`CoreSettings::leader_rebalance_interval_ms`].
    pub leader_rebalance_interval_ms: Option<u64>,
    /// See [`CoreSettings::unclean_leader_election`].
    pub unclean_leader_election: bool,
    /// See [`CoreSettings::min_insync_replicas`].
    pub min_insync_replicas: i32,
    /// Raft's logical clock.
    pub tick: Duration,
    pub quorum: QuorumConfig,
    /// Snapshot once the log since the last one holds this many bytes.
    pub snapshot_bytes: u64,
    /// How long a dropped proposal is retried before the request fails.
    pub propose_timeout: Duration,
    /// The cluster id this node's data directory belongs to (its
    /// `meta.properties`), if it has one: named in the handshake before the
    /// metadata log has it, and a log of another cluster stops the node.
    pub expected_cluster_id: Option<String>,
    /// Seeds the controller core's ids (see [`CoreSettings::seed`]); random
    /// unless a test fixes it.
    pub seed: u64,
}

impl DriverSettings {
    pub fn new(node_id: i32, voters: Vec<Voter>, metadata_log_dir: PathBuf) -> DriverSettings {
        DriverSettings {
            node_id,
            voters,
            metadata_log_dir,
            session_timeout_ms: 9000,
            connection_loss_grace_ms: Some(3000),
            leader_rebalance_interval_ms: Some(300_000),
            unclean_leader_election: false,
            min_insync_replicas: 1,
            tick: Duration::from_millis(50),
            quorum: QuorumConfig::default(),
            snapshot_bytes: 16 << 20,
            propose_timeout: Duration::from_secs(5),
            expected_cluster_id: None,
            seed: uuid::Uuid::new_v4().as_u64_pair().0,
        }
    }
}

/// A core's settings: its seed is the node's, with the node id, the term and
/// the image offset it starts from mixed in, so every core a cluster ever
/// makes draws different ids (a node leading twice, or two nodes sharing
/// the configured seed), while a run repeats from the same seed.
fn core_settings(settings: &DriverSettings, term: u64, offset: u64) -> CoreSettings {
    let mut h = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&(settings.seed, settings.node_id, term, offset), &mut h);
    CoreSettings {
        session_timeout_ms: settings.session_timeout_ms,
        connection_loss_grace_ms: settings.connection_loss_grace_ms,
        leader_rebalance_interval_ms: settings.leader_rebalance_interval_ms,
        unclean_leader_election: settings.unclean_leader_election,
        min_insync_replicas: settings.min_insync_replicas,
        seed: std::hash::Hasher::finish(&h),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum DriverError {
    #[error("not the active controller (it is {leader:?})")]
    NotController { leader: Option<i32> },
    #[error("no active controller could be reached: {0}")]
    Unreachable(String),
    #[error("the proposal was not accepted before its deadline")]
    Timeout,
    #[error("the controller has stopped")]
    Stopped,
}

#[derive(Debug, thiserror::Error)]
pub enum DriverStartError {
    #[error("metadata log: {0}")]
    Store(#[from] StoreError),
    #[error("metadata quorum: {0}")]
    Node(#[from] super::node::NodeError),
    #[error("metadata snapshot in {dir}: {reason}")]
    Snapshot { dir: PathBuf, reason: String },
}

/// Who leads the quorum, as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuorumView {
    pub leader: Option<i32>,
    pub term: u64,
    pub is_leader: bool,
}

enum Input {
    Tick,
    Raft(Box<Message>),
    Unreachable(u64),
    /// A connection of this node id broke (see [`CoreInput::ConnectionLost`]).
    ConnectionLost(i32),
    Request(Request, oneshot::Sender<Answer>),
    Stop,
}

pub(crate) use super::client::Answer;

/// A running controller.
pub struct Controller {
    inputs: mpsc::UnboundedSender<Input>,
    image: watch::Receiver<Arc<ClusterImage>>,
    view: watch::Receiver<QuorumView>,
    /// Why the controller stopped on its own (a metadata log it cannot
    /// write, another cluster's log), once it has.
    fatal: watch::Receiver<Option<String>>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The tasks writing to each peer: on stop they get to write what is
    /// queued (a leader's last commit index) before they go.
    peer_tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    node_id: i32,
    voters: Vec<Voter>,
    /// Forwards requests to the leader when it is another voter.
    client: ControllerClient,
}

impl Controller {
    /// Opens the metadata log (recovering it), then serves the quorum on
    /// `listener` (the bound CONTROLLER listener).
    pub async fn start(settings: DriverSettings, listener: TcpListener) -> Result<Controller, DriverStartError> {
        let ids: Vec<u64> = settings.voters.iter().map(|v| v.id as u64).collect();
        let dir = settings.metadata_log_dir.clone();
        let store = tokio::task::spawn_blocking(move || DiskStore::initial(&dir, &ids))
            .await
            .expect("metadata log open does not panic")?;
        let snapshot = raft::Storage::snapshot(&store, 0, 0).map_err(|e| StoreError::Raft(e.to_string()))?;
        let applied = snapshot.get_metadata().index;
        let image = if snapshot.data.is_empty() {
            ClusterImage::default()
        } else {
            let mut image = ClusterImage::decode(&snapshot.data)
                .map_err(|reason| DriverStartError::Snapshot { dir: settings.metadata_log_dir.clone(), reason })?;
            image.offset = applied;
            image
        };
        let node = QuorumNode::new(settings.node_id as u64, store, settings.quorum.clone(), applied)?;
        let (inputs, rx) = mpsc::unbounded_channel();
        let (image_tx, image_rx) = watch::channel(Arc::new(image.clone()));
        let (view_tx, view_rx) = watch::channel(QuorumView { leader: None, term: 0, is_leader: false });
        let (fatal_tx, fatal_rx) = watch::channel(None);
        let feed = MetadataFeed::new(applied);
        let voters_text = transport::canonical_voters(&settings.voters);
        let (node_id, voters, voters_copy) = (settings.node_id, settings.voters.clone(), voters_text.clone());

        let mut tasks = Vec::new();
        let mut peer_tasks = Vec::new();
        let mut peers = HashMap::new();
        for v in settings.voters.iter().filter(|v| v.id != settings.node_id) {
            let (tx, peer_rx) = mpsc::channel(1024);
            peers.insert(v.id as u64, tx);
            peer_tasks.push(tokio::spawn(send_to_peer(
                v.clone(),
                hello_source(
                    settings.node_id,
                    voters_text.clone(),
                    image_rx.clone(),
                    settings.expected_cluster_id.clone(),
                ),
                peer_rx,
                inputs.clone(),
            )));
        }
        tasks.push(tokio::spawn(accept_peers(
            listener,
            settings.voters.clone(),
            hello_source(settings.node_id, voters_text, image_rx.clone(), settings.expected_cluster_id.clone()),
            inputs.clone(),
            Followers { feed: feed.clone(), images: image_rx.clone(), view: view_rx.clone() },
        )));
        let ticker = inputs.clone();
        let tick = settings.tick;
        tasks.push(tokio::spawn(async move {
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                if ticker.send(Input::Tick).is_err() {
                    return;
                }
            }
        }));
        let core = ControllerCore::new(core_settings(&settings, 0, image.offset), image);
        let mut run = Run {
            settings,
            node,
            core,
            peers,
            image_tx,
            view_tx,
            waiting: HashMap::new(),
            retry: Vec::new(),
            next_request: 0,
            started: Instant::now(),
            contact: HashMap::new(),
            fatal_tx,
            feed,
        };
        let thread = std::thread::Builder::new()
            .name("strand-controller".into())
            .spawn(move || run.run(rx))
            .expect("controller thread starts");
        let client_images = image_rx.clone();
        Ok(Controller {
            inputs,
            image: image_rx,
            view: view_rx,
            fatal: fatal_rx,
            thread: std::sync::Mutex::new(Some(thread)),
            tasks: std::sync::Mutex::new(tasks),
            peer_tasks: std::sync::Mutex::new(peer_tasks),
            node_id,
            voters: voters.clone(),
            client: ControllerClient::new(node_id, voters, voters_copy, client_images),
        })
    }

    /// Asks this node's controller; answered once the request's records are
    /// committed and applied here (or at once if nothing needed changing).
    pub async fn request(&self, request: Request) -> Result<Reply, DriverError> {
        self.request_here(request).await.map(|(reply, _)| reply)
    }

    async fn request_here(&self, request: Request) -> Answer {
        let (tx, rx) = oneshot::channel();
        self.inputs.send(Input::Request(request, tx)).map_err(|_| DriverError::Stopped)?;
        rx.await.unwrap_or(Err(DriverError::Stopped))
    }

    /// Asks the active controller, wherever it is: here, or forwarded to the
    /// leader over the CONTROLLER listener. Retries while there is no leader
    /// or it moves, until `timeout`; answers once this node's image has
    /// applied the reply's offset, so a Metadata request that follows sees
    /// the change. Safe to retry: every record applies idempotently.
    pub async fn submit(&self, request: Request, timeout: Duration) -> Result<Reply, DriverError> {
        let ask = |leader: i32| -> futures_util::future::BoxFuture<'_, Answer> {
            let request = request.clone();
            Box::pin(async move {
                if leader == self.node_id {
                    self.request_here(request).await
                } else {
                    self.client.forward(leader, &request).await
                }
            })
        };
        super::client::submit(&self.image, &self.view, &self.voters, timeout, ask).await
    }

    /// The image as of the last entry applied here.
    pub fn image(&self) -> watch::Receiver<Arc<ClusterImage>> {
        self.image.clone()
    }

    pub fn view(&self) -> watch::Receiver<QuorumView> {
        self.view.clone()
    }

    /// Resolves when the controller stopped on its own, with why; the
    /// process cannot serve as a cluster node after that.
    pub async fn failed(&self) -> String {
        let mut fatal = self.fatal.clone();
        let reason = fatal.wait_for(|f| f.is_some()).await.map(|f| f.clone().unwrap_or_default());
        match reason {
            Ok(reason) => reason,
            // The driver is gone without saying why: it was stopped.
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops the node; everything acknowledged is already durable.
    ///
    /// A leader first tells its followers how far the log is committed
    /// (what it acknowledged last may be known committed only to it; if
    /// the followers then lack a majority they could not learn it), and
    /// the messages already queued for peers get [`PEER_DRAIN`] to go out.
    pub async fn stop(&self) {
        let _ = self.inputs.send(Input::Stop);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        // The thread is gone and with it the peers' queues' senders: each
        // peer task ends once it wrote what is queued.
        let mut peer_tasks = std::mem::take(&mut *self.peer_tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let drained = futures_util::future::join_all(peer_tasks.iter_mut());
        let _ = tokio::time::timeout(PEER_DRAIN, drained).await;
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        // A finished handle must not be polled again.
        let unfinished = peer_tasks.into_iter().filter(|t| !t.is_finished());
        for t in tasks.into_iter().chain(unfinished) {
            t.abort();
            // Awaited so the listener is closed when `stop` returns.
            let _ = t.await;
        }
    }

    pub fn node_id(&self) -> i32 {
        self.node_id
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.inputs.send(Input::Stop);
        for t in self.tasks.get_mut().unwrap_or_else(|e| e.into_inner()).iter() {
            t.abort();
        }
        for t in self.peer_tasks.get_mut().unwrap_or_else(|e| e.into_inner()).iter() {
            t.abort();
        }
    }
}

/// Our hello, with the cluster id as currently known.
fn hello_source(
    node_id: i32,
    voters: String,
    image: watch::Receiver<Arc<ClusterImage>>,
    expected_cluster_id: Option<String>,
) -> impl Fn() -> Hello + Send + Clone + 'static {
    move || Hello {
        node_id,
        voters: voters.clone(),
        cluster_id: image.borrow().cluster_id.clone().or_else(|| expected_cluster_id.clone()),
        purpose: Purpose::Raft,
    }
}

struct Run {
    settings: DriverSettings,
    node: QuorumNode<DiskStore>,
    core: ControllerCore,
    peers: HashMap<u64, mpsc::Sender<Message>>,
    image_tx: watch::Sender<Arc<ClusterImage>>,
    view_tx: watch::Sender<QuorumView>,
    /// Requests proposed (or answered by core effects later), by core request id.
    waiting: HashMap<RequestId, oneshot::Sender<Answer>>,
    /// Batches raft dropped, retried each tick until their deadline.
    retry: Vec<(RecordBatch, Instant, Option<RequestId>)>,
    next_request: RequestId,
    started: Instant,
    /// Followers' last responses, for DescribeQuorum (kept while leader).
    contact: HashMap<u64, FollowerContact>,
    fatal_tx: watch::Sender<Option<String>>,
    /// Recently applied batches, for broker-only nodes following the log.
    feed: Arc<MetadataFeed>,
}

impl Run {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn run(&mut self, mut rx: mpsc::UnboundedReceiver<Input>) {
        while let Some(input) = rx.blocking_recv() {
            match input {
                Input::Stop => {
                    if self.node.is_leader() {
                        self.node.ping();
                        let _ = self.ready();
                    }
                    break;
                }
                Input::Tick => {
                    self.node.tick();
                    if self.node.is_leader() {
                        let effects = self.core.step(CoreInput::Tick { now_ms: self.now_ms() });
                        self.effects(effects, None);
                        self.retry_dropped();
                    }
                }
                Input::Raft(msg) => {
                    let from = msg.from;
                    let is_response = matches!(
                        msg.get_msg_type(),
                        MessageType::MsgAppendResponse | MessageType::MsgHeartbeatResponse
                    );
                    // Errors mean raft ignored the message (e.g. from a stale peer).
                    let _ = self.node.step(*msg);
                    if is_response && self.node.is_leader() {
                        let caught_up = self.node.matched(from).is_some_and(|m| m >= self.node.last_index());
                        self.contact.entry(from).or_default().heard(wall_clock_ms(), caught_up);
                    }
                }
                Input::Unreachable(id) => self.node.report_unreachable(id),
                Input::ConnectionLost(broker_id) => {
                    if self.node.is_leader() {
                        let effects = self.core.step(CoreInput::ConnectionLost { broker_id, now_ms: self.now_ms() });
                        self.effects(effects, None);
                    }
                }
                Input::Request(request, reply) => self.request(request, reply),
            }
            if let Err(e) = self.ready() {
                // The metadata log cannot be written: stop rather than run on
                // with state raft believes durable but is not.
                tracing::error!(error = %e, "metadata log write failed; the controller stops");
                self.fatal_tx.send_replace(Some(format!("metadata log write failed: {e}")));
                break;
            }
            if let Some(reason) = self.foreign_cluster() {
                tracing::error!("{reason}; the controller stops");
                self.fatal_tx.send_replace(Some(reason));
                break;
            }
        }
        for (_, w) in self.waiting.drain() {
            let _ = w.send(Err(DriverError::Stopped));
        }
    }

    fn request(&mut self, request: Request, reply: oneshot::Sender<Answer>) {
        if !self.node.is_leader() {
            let leader = self.node.leader_id().map(|l| l as i32);
            let _ = reply.send(Err(DriverError::NotController { leader }));
            return;
        }
        if request == Request::DescribeQuorum {
            let _ = reply.send(Ok((Reply::Quorum(self.describe_quorum()), self.core.image().offset)));
            return;
        }
        self.next_request += 1;
        let id = self.next_request;
        self.waiting.insert(id, reply);
        let effects = self.core.step(CoreInput::Request { id, request, now_ms: self.now_ms() });
        self.effects(effects, Some(id));
    }

    fn effects(&mut self, effects: Vec<Effect>, _for_request: Option<RequestId>) {
        for effect in effects {
            match effect {
                Effect::Reply { id, reply } => {
                    if let Some(w) = self.waiting.remove(&id) {
                        let _ = w.send(Ok((reply, self.core.image().offset)));
                    }
                }
                Effect::Propose(batch) => {
                    let deadline = Instant::now() + self.settings.propose_timeout;
                    self.propose(batch, deadline, _for_request);
                }
            }
        }
    }

    fn propose(&mut self, batch: RecordBatch, deadline: Instant, request: Option<RequestId>) {
        match self.node.propose(batch.encode()) {
            Ok(()) => {}
            Err(ProposeError::Dropped) => self.retry.push((batch, deadline, request)),
            Err(ProposeError::NotLeader { leader }) => {
                if let Some(w) = request.and_then(|id| self.waiting.remove(&id)) {
                    let _ = w.send(Err(DriverError::NotController { leader: leader.map(|l| l as i32) }));
                }
            }
        }
    }

    fn retry_dropped(&mut self) {
        let now = Instant::now();
        for (batch, deadline, request) in std::mem::take(&mut self.retry) {
            if now >= deadline {
                if let Some(w) = request.and_then(|id| self.waiting.remove(&id)) {
                    let _ = w.send(Err(DriverError::Timeout));
                }
                continue;
            }
            self.propose(batch, deadline, request);
        }
    }

    fn ready(&mut self) -> Result<(), StoreError> {
        while self.node.has_ready() {
            let out = self.node.handle_ready()?;
            if let Some(snap) = &out.snapshot {
                match ClusterImage::decode(&snap.data) {
                    Ok(mut image) => {
                        image.offset = snap.get_metadata().index;
                        self.feed.reset(image.offset);
                        self.core = ControllerCore::new(self.core_settings(image.offset), image);
                    }
                    Err(reason) => {
                        return Err(StoreError::Raft(format!("snapshot from the leader: {reason}")));
                    }
                }
            }
            let mut changed = out.snapshot.is_some();
            for e in &out.committed {
                if is_app_data(e) {
                    match RecordBatch::decode(e.index, &e.data) {
                        Ok(batch) => {
                            self.feed.push(e.index, batch.clone());
                            let effects = self.core.step(CoreInput::Committed { offset: e.index, batch });
                            self.effects(effects, None);
                        }
                        Err(err) => {
                            // Every node holds the same bytes: skipping is the same everywhere.
                            tracing::error!(error = %err, "undecodable metadata entry skipped");
                            self.core.advance_to(e.index);
                        }
                    }
                } else {
                    self.core.advance_to(e.index);
                }
                changed = true;
            }
            if let Some(index) = out.applied_through() {
                self.node.advance_applied(index);
            }
            if changed {
                self.image_tx.send_replace(Arc::new(self.core.image().clone()));
            }
            if let Some(change) = out.leader_changed {
                self.leader_changed(change);
            }
            for msg in out.messages {
                self.send(msg);
            }
            let core = &self.core;
            self.node.maybe_snapshot(self.settings.snapshot_bytes, || core.image().encode())?;
        }
        Ok(())
    }

    /// The metadata log names a cluster other than the one this node's data
    /// directory belongs to.
    fn foreign_cluster(&self) -> Option<String> {
        let expected = self.settings.expected_cluster_id.as_ref()?;
        let found = self.core.image().cluster_id.as_ref()?;
        (found != expected).then(|| {
            format!(
                "the data directory of node {} belongs to cluster {expected}, but the metadata log in {} is cluster \
                 {found}",
                self.settings.node_id,
                self.settings.metadata_log_dir.display()
            )
        })
    }

    /// The quorum as this leader sees it (see [`super::describe`]).
    fn describe_quorum(&self) -> QuorumDescription {
        let now = wall_clock_ms();
        let me = self.node.id();
        let voters = self
            .settings
            .voters
            .iter()
            .map(|v| {
                let id = v.id as u64;
                let end = |index: u64| index as i64 + 1;
                if id == me {
                    return ReplicaDescription {
                        replica_id: v.id,
                        log_end_offset: end(self.node.last_index()),
                        last_fetch_ms: now,
                        last_caught_up_ms: now,
                    };
                }
                let contact = self.contact.get(&id).copied().unwrap_or_default();
                ReplicaDescription {
                    replica_id: v.id,
                    // raft-rs knows a follower's match index once it answered.
                    log_end_offset: self.node.matched(id).filter(|m| *m > 0).map_or(-1, end),
                    last_fetch_ms: contact.last_fetch_ms.unwrap_or(-1),
                    last_caught_up_ms: contact.last_caught_up_ms.unwrap_or(-1),
                }
            })
            .collect();
        QuorumDescription {
            leader_id: me as i32,
            leader_epoch: self.node.term() as i32,
            high_watermark: self.node.commit_index() as i64 + 1,
            voters,
            // Broker-only nodes that fetched from this leader within a session timeout.
            observers: self.feed.observers(Duration::from_millis(self.settings.session_timeout_ms)),
        }
    }

    /// Settings for a new core at this node's current term and `offset`.
    fn core_settings(&self, offset: u64) -> CoreSettings {
        core_settings(&self.settings, self.node.term(), offset)
    }

    fn leader_changed(&mut self, change: LeaderChange) {
        let is_leader = change.role == StateRole::Leader;
        self.view_tx.send_replace(QuorumView { leader: change.leader.map(|l| l as i32), term: change.term, is_leader });
        tracing::info!(node = self.settings.node_id, leader = ?change.leader, term = change.term, "metadata quorum leader");
        // Whatever this node was waiting for as leader is now someone else's.
        let leader = change.leader.map(|l| l as i32);
        for (_, w) in self.waiting.drain() {
            let _ = w.send(Err(DriverError::NotController { leader }));
        }
        self.retry.clear();
        self.contact.clear();
        if is_leader {
            // A new active controller: fresh broker sessions, decisions from
            // the committed image.
            let image = self.core.image().clone();
            self.core = ControllerCore::new(self.core_settings(image.offset), image);
            // The first leader of a new cluster creates its id and the
            // feature levels it runs at (also added to a cluster created
            // before they were recorded).
            let mut records = Vec::new();
            if self.core.image().cluster_id.is_none() {
                records.push(MetadataRecord::ClusterId { cluster_id: crate::metadata::new_cluster_id() });
            }
            for (name, level) in crate::api::versions::FEATURES {
                if !self.core.image().features.contains_key(name) {
                    records.push(MetadataRecord::FeatureLevel { name: name.into(), level });
                }
            }
            if !records.is_empty() {
                let batch = RecordBatch { proposal: uuid::Uuid::new_v4(), records };
                self.propose(batch, Instant::now() + self.settings.propose_timeout, None);
            }
        }
    }

    fn send(&mut self, msg: Message) {
        let to = msg.to;
        let is_snapshot = msg.get_msg_type() == MessageType::MsgSnapshot;
        let delivered = match self.peers.get(&to) {
            Some(tx) => tx.try_send(msg).is_ok(),
            None => false,
        };
        if !delivered {
            self.node.report_unreachable(to);
        }
        if is_snapshot {
            self.node.report_snapshot(to, delivered);
        }
    }
}

/// Longest a stopping node waits for its queued peer messages to go out.
const PEER_DRAIN: Duration = Duration::from_millis(500);

/// Keeps one connection to a peer open and writes the messages for it.
async fn send_to_peer(
    peer: Voter,
    hello: impl Fn() -> Hello,
    mut messages: mpsc::Receiver<Message>,
    inputs: mpsc::UnboundedSender<Input>,
) {
    let addr = format!("{}:{}", peer.host, peer.port);
    let mut backoff = Duration::from_millis(50);
    loop {
        let mut stream = match TcpStream::connect(&addr).await {
            Ok(s) => s,
            Err(e) => {
                // Drop what queued meanwhile: raft resends from its progress.
                while messages.try_recv().is_ok() {}
                let _ = inputs.send(Input::Unreachable(peer.id as u64));
                // Nothing listens where the peer was: its process is gone
                // (a timeout says less; the network may be slow).
                if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    let _ = inputs.send(Input::ConnectionLost(peer.id));
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match transport::connect_handshake(&mut stream, &hello()).await {
            Ok(_) => backoff = Duration::from_millis(50),
            Err(e) => {
                tracing::error!(peer = peer.id, %addr, error = %e, "controller peer refused the connection");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        }
        loop {
            let Some(msg) = messages.recv().await else { return };
            let bytes = match msg.write_to_bytes() {
                Ok(b) => b,
                Err(_) => continue,
            };
            if transport::write_frame(&mut stream, &bytes).await.is_err() {
                let _ = inputs.send(Input::Unreachable(peer.id as u64));
                let _ = inputs.send(Input::ConnectionLost(peer.id));
                break;
            }
        }
    }
}

/// Accepts peers' connections on the CONTROLLER listener.
/// What a voter serves broker-only nodes from.
#[derive(Clone)]
struct Followers {
    feed: Arc<MetadataFeed>,
    images: watch::Receiver<Arc<ClusterImage>>,
    view: watch::Receiver<QuorumView>,
}

async fn accept_peers(
    listener: TcpListener,
    voters: Vec<Voter>,
    hello: impl Fn() -> Hello + Send + Clone + 'static,
    inputs: mpsc::UnboundedSender<Input>,
    followers: Followers,
) {
    // Every connection's task lives in this set, so stopping the node (which
    // aborts this task) ends them all: none goes on answering for a stopped
    // controller.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let Ok((mut stream, from)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let voters = voters.clone();
        let hello = hello.clone();
        let inputs = inputs.clone();
        let followers = followers.clone();
        connections.spawn(async move {
            let peer = match transport::accept_handshake(&mut stream, &hello(), &voters).await {
                Ok(h) => h,
                Err(e) => {
                    tracing::error!(%from, error = %e, "controller connection refused");
                    return;
                }
            };
            match peer.purpose {
                Purpose::Requests => return serve_requests(stream, peer.node_id, inputs).await,
                Purpose::Metadata => {
                    let Followers { feed, images, view } = followers;
                    return super::feed::serve(stream, peer.node_id, feed, images, view).await;
                }
                Purpose::Raft => {}
            }
            while let Ok(frame) = transport::read_frame(&mut stream).await {
                match Message::parse_from_bytes(&frame) {
                    // Only messages from the peer that said hello.
                    Ok(m) if m.from == peer.node_id as u64 => {
                        if inputs.send(Input::Raft(Box::new(m))).is_err() {
                            return;
                        }
                    }
                    _ => {
                        tracing::warn!(peer = peer.node_id, "malformed controller frame; closing");
                        return;
                    }
                }
            }
        });
    }
}

/// Answers a broker's requests (registration, heartbeats, forwarded admin
/// requests), one at a time in order, as this node's controller answers
/// them; a node that is not the leader says so and the broker re-routes.
async fn serve_requests(stream: TcpStream, from: i32, inputs: mpsc::UnboundedSender<Input>) {
    answer_requests(stream, from, &inputs).await;
    // However it ended, the broker is no longer connected here: the active
    // controller shortens its session (the broker reconnects and heartbeats
    // well within the grace if it is alive).
    let _ = inputs.send(Input::ConnectionLost(from));
}

async fn answer_requests(mut stream: TcpStream, from: i32, inputs: &mpsc::UnboundedSender<Input>) {
    while let Ok(frame) = transport::read_frame(&mut stream).await {
        let answer: Answer = match serde_json::from_slice::<Request>(&frame) {
            Ok(request) => {
                let (tx, rx) = oneshot::channel();
                if inputs.send(Input::Request(request, tx)).is_err() {
                    return;
                }
                rx.await.unwrap_or(Err(DriverError::Stopped))
            }
            Err(e) => {
                tracing::warn!(peer = from, error = %e, "malformed controller request; closing");
                return;
            }
        };
        let body = serde_json::to_vec(&answer).expect("answers serialise");
        if transport::write_frame(&mut stream, &body).await.is_err() {
            return;
        }
    }
}
