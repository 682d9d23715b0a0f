//! A broker that is one node of a multi-node cluster: its controller (a
//! voter of the metadata quorum, in combined mode) or, on a broker-only
//! node, its follower of the metadata log ([`observer`]), the image it
//! serves from, its registration with the active controller and the
//! partitions the image places on it.
//!
//! - [`ClusterNode`]: the controller handle, the image, who leads what.
//! - [`observer`]: a broker-only node fetching the log from a voter.
//! - [`meta_properties`]: the log directory's node and cluster ids.
//! - [`lifecycle`]: registration, heartbeats, controlled shutdown.
//! - [`publisher`]: applies each new image to the local logs (the
//!   partitions placed here are opened or created, the others removed).
//!
//! On a single node none of this runs: the broker keeps its metadata in its
//! own file as before (see [`crate::metadata::store`]).

pub mod lifecycle;
pub mod meta_properties;
pub mod observer;
pub mod peers;
pub mod publisher;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use uuid::Uuid;

use crate::config::QuorumSettings;
use crate::controller::core::{Reply, Request};
use crate::controller::driver::{Controller, DriverError, DriverSettings, DriverStartError, QuorumView};
use crate::metadata::image::{ClusterImage, NO_LEADER};

/// How long a request for the controller (an admin request forwarded, a
/// registration, a producer-id block) waits for an active controller.
pub const CONTROLLER_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Who leads a partition, as this broker's image says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leadership {
    /// This broker leads it.
    Here { leader_epoch: i32 },
    /// Another broker leads it, or nobody does (`leader` is -1).
    Elsewhere { leader: i32, leader_epoch: i32 },
    /// No such partition in the image.
    Unknown,
}

/// How this node takes part in the metadata quorum.
enum Quorum {
    /// A voter: its own raft node applies the log (combined nodes).
    Voter(Controller),
    /// Not a voter (a broker-only node): it fetches the log from a voter.
    Observer(observer::MetadataObserver),
}

pub struct ClusterNode {
    pub node_id: i32,
    quorum: Quorum,
    image: watch::Receiver<Arc<ClusterImage>>,
    /// This process's registration: a new one on every start.
    pub incarnation_id: Uuid,
    /// The broker epoch the controller gave our registration (-1 before).
    broker_epoch: AtomicI64,
    pub heartbeat_interval: Duration,
    /// The producer-id block the controller gave this broker: (next, end).
    producer_ids: tokio::sync::Mutex<(i64, i64)>,
    peers: peers::Peers,
    /// The log directory's `meta.properties` (the cluster id is added once
    /// the image has one).
    meta: std::sync::Mutex<meta_properties::MetaProperties>,
    log_dir: std::path::PathBuf,
    /// Flips to true once this broker's controlled shutdown is over (done,
    /// or given up): until then the image is still applied, so the
    /// leadership it moves away is given up here too.
    controlled_shutdown_over: watch::Sender<bool>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProducerIdError {
    #[error(transparent)]
    Controller(#[from] DriverError),
    #[error("{0}")]
    Refused(crate::controller::core::ControllerError),
}

impl ClusterNode {
    /// A voter (given its bound CONTROLLER listener) opens the metadata log
    /// and joins the quorum; a broker-only node (no listener) starts
    /// following the log from the voters.
    pub async fn start(
        node_id: i32,
        quorum: &QuorumSettings,
        controller_listener: Option<TcpListener>,
        meta: meta_properties::MetaProperties,
        log_dir: std::path::PathBuf,
    ) -> Result<Arc<ClusterNode>, DriverStartError> {
        let quorum_role = match controller_listener {
            Some(listener) => {
                let mut settings = DriverSettings::new(node_id, quorum.voters.clone(), quorum.metadata_log_dir.clone());
                settings.session_timeout_ms = quorum.session_timeout_ms;
                settings.connection_loss_grace_ms = quorum.connection_loss_grace_ms();
                settings.leader_rebalance_interval_ms = quorum.leader_rebalance_interval_ms;
                settings.unclean_leader_election = quorum.unclean_leader_election;
                settings.min_insync_replicas = quorum.min_insync_replicas;
                settings.expected_cluster_id = meta.cluster_id.clone();
                if let Some(seed) = quorum.seed {
                    settings.seed = seed;
                }
                Quorum::Voter(Controller::start(settings, listener).await?)
            }
            None => Quorum::Observer(observer::MetadataObserver::start(
                node_id,
                quorum.voters.clone(),
                meta.cluster_id.clone(),
            )),
        };
        let image = match &quorum_role {
            Quorum::Voter(c) => c.image(),
            Quorum::Observer(o) => o.image(),
        };
        Ok(Arc::new(ClusterNode {
            node_id,
            quorum: quorum_role,
            image,
            incarnation_id: Uuid::new_v4(),
            broker_epoch: AtomicI64::new(-1),
            heartbeat_interval: Duration::from_millis(quorum.heartbeat_interval_ms),
            producer_ids: tokio::sync::Mutex::new((0, 0)),
            peers: peers::Peers::new(node_id, &quorum.inter_broker_listener_name),
            meta: std::sync::Mutex::new(meta),
            log_dir,
            controlled_shutdown_over: watch::Sender::new(false),
        }))
    }

    /// Records that the controlled shutdown is over (see
    /// [`Self::controlled_shutdown_over`]).
    pub fn end_controlled_shutdown(&self) {
        self.controlled_shutdown_over.send_replace(true);
    }

    /// Becomes true once the controlled shutdown is over.
    pub fn controlled_shutdown_over(&self) -> watch::Receiver<bool> {
        self.controlled_shutdown_over.subscribe()
    }

    /// Connections to the other brokers, for inter-broker requests.
    pub fn peers(&self) -> &peers::Peers {
        &self.peers
    }

    /// The image as of the last metadata record applied here.
    pub fn image(&self) -> Arc<ClusterImage> {
        self.image.borrow().clone()
    }

    pub fn image_watch(&self) -> watch::Receiver<Arc<ClusterImage>> {
        self.image.clone()
    }

    /// Who leads the quorum (the active controller), as this node sees it.
    pub fn quorum(&self) -> QuorumView {
        match &self.quorum {
            Quorum::Voter(c) => *c.view().borrow(),
            Quorum::Observer(o) => *o.view().borrow(),
        }
    }

    /// The controller id clients are told (Metadata, DescribeCluster): the
    /// active controller when it is also a live broker, else this broker, as
    /// a KRaft broker answers: clients send "controller" requests to it and
    /// it forwards them.
    pub fn controller_id_for_clients(&self) -> i32 {
        let leader = self.quorum().leader;
        let image = self.image.borrow();
        match leader {
            Some(l) if image.brokers.get(&l).is_some_and(|b| !b.fenced) => l,
            _ => self.node_id,
        }
    }

    pub fn broker_epoch(&self) -> i64 {
        self.broker_epoch.load(Ordering::Acquire)
    }

    pub(crate) fn set_broker_epoch(&self, epoch: i64) {
        self.broker_epoch.store(epoch, Ordering::Release);
    }

    /// Whether this broker may serve: registered, unfenced, not shutting down.
    pub fn is_active(&self) -> bool {
        let epoch = self.broker_epoch();
        self.image.borrow().brokers.get(&self.node_id).is_some_and(|b| b.epoch == epoch && b.is_active())
    }

    pub fn leadership(&self, topic: &str, partition: i32) -> Leadership {
        let image = self.image.borrow();
        match image.partition(topic, partition) {
            None => Leadership::Unknown,
            Some(p) if p.leader == self.node_id && p.leader != NO_LEADER => {
                Leadership::Here { leader_epoch: p.leader_epoch }
            }
            Some(p) => Leadership::Elsewhere { leader: p.leader, leader_epoch: p.leader_epoch },
        }
    }

    /// Asks the active controller (forwarding as needed) and returns once
    /// this broker's image includes the answer.
    pub async fn submit(&self, request: Request) -> Result<Reply, DriverError> {
        match &self.quorum {
            Quorum::Voter(c) => c.submit(request, CONTROLLER_REQUEST_TIMEOUT).await,
            Quorum::Observer(o) => o.submit(request, CONTROLLER_REQUEST_TIMEOUT).await,
        }
    }

    /// Creates the internal topic `name` (`__consumer_offsets` or
    /// `__transaction_state`) through the controller unless the image has
    /// it, as Kafka does on first use; returns its partition count. Its
    /// replication factor is the configured one capped at the brokers
    /// registered now (Kafka refuses instead; a two-broker test cluster
    /// still gets its coordinators), and `__transaction_state` carries
    /// `transaction.state.log.min.isr` as its `min.insync.replicas`.
    pub async fn ensure_internal_topic(&self, config: &crate::config::BrokerConfig, name: &str) -> Result<i32, String> {
        if let Some(t) = self.image().topic(name) {
            return Ok(t.partitions.len() as i32);
        }
        let (partitions, segment_bytes, wanted_rf, min_isr) = if name == crate::txn::TXN_TOPIC {
            let s = &config.txn;
            (s.num_partitions, s.segment_bytes, s.replication_factor, Some(s.min_isr))
        } else {
            let s = &config.group;
            (s.offsets_topic_num_partitions, s.offsets_topic_segment_bytes, s.offsets_topic_replication_factor, None)
        };
        let registered = self.image().brokers.len().clamp(1, i16::MAX as usize) as i16;
        let replication_factor = wanted_rf.min(registered).max(1);
        let mut configs = std::collections::BTreeMap::new();
        configs.insert("cleanup.policy".to_string(), "compact".to_string());
        configs.insert("segment.bytes".to_string(), segment_bytes.to_string());
        if let Some(min_isr) = min_isr {
            let min_isr = min_isr.min(replication_factor as i32).max(1);
            configs.insert("min.insync.replicas".to_string(), min_isr.to_string());
        }
        let request =
            Request::CreateTopic { name: name.to_string(), partitions, replication_factor, configs, assignment: None };
        match self.submit(request).await {
            Ok(Reply::TopicCreated { .. })
            | Ok(Reply::Error(crate::controller::core::ControllerError::TopicExists(_))) => {}
            Ok(Reply::Error(e)) => return Err(format!("cannot create {name}: {e}")),
            Ok(other) => return Err(format!("cannot create {name}: unexpected reply {other:?}")),
            Err(e) => return Err(format!("cannot create {name}: {e}")),
        }
        self.image()
            .topic(name)
            .map(|t| t.partitions.len() as i32)
            .ok_or_else(|| format!("{name} is not in the image yet"))
    }

    /// A producer id no broker of the cluster has handed out, from this
    /// broker's block (a new block from the controller when it runs out;
    /// blocks are committed before use, so a restart never reuses one).
    pub async fn allocate_producer_id(&self) -> Result<i64, ProducerIdError> {
        let mut ids = self.producer_ids.lock().await;
        let mut conflicts = 0;
        while ids.0 >= ids.1 {
            match self.submit(Request::AllocateProducerIds { broker_id: self.node_id }).await? {
                Reply::ProducerIds { start, size } => *ids = (start, start + size),
                // Another broker's allocation won the race: ask again.
                Reply::Error(crate::controller::core::ControllerError::Conflict) if conflicts < 10 => conflicts += 1,
                Reply::Error(e) => return Err(ProducerIdError::Refused(e)),
                other => {
                    return Err(ProducerIdError::Controller(DriverError::Unreachable(format!(
                        "unexpected controller reply {other:?}"
                    ))))
                }
            }
        }
        let id = ids.0;
        ids.0 += 1;
        Ok(id)
    }

    /// Records the image's cluster id in `meta.properties` the first time
    /// it is seen (a different one is refused by the driver and the handshake).
    pub fn record_cluster_id(&self) -> Result<(), meta_properties::MetaPropertiesError> {
        let Some(id) = self.image.borrow().cluster_id.clone() else { return Ok(()) };
        let mut meta = self.meta.lock().unwrap_or_else(|e| e.into_inner());
        if meta.cluster_id.as_deref() == Some(id.as_str()) {
            return Ok(());
        }
        meta.adopt_cluster_id(&self.log_dir, &id)
    }

    /// Resolves when this node's controller stopped on its own, with why.
    pub async fn failed(&self) -> String {
        match &self.quorum {
            Quorum::Voter(c) => c.failed().await,
            Quorum::Observer(o) => o.failed().await,
        }
    }

    /// Stops the controller (everything it acknowledged is on disk).
    pub async fn stop(&self) {
        match &self.quorum {
            Quorum::Voter(c) => c.stop().await,
            Quorum::Observer(o) => o.stop().await,
        }
    }
}
