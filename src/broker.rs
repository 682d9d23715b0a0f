//! Broker start-up and shutdown: open the logs, bind the listeners, run the
//! housekeeping task, and stop in order on request.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::api::fetch_session::FetchSessionCache;
use crate::cluster::ClusterNode;
use crate::config::BrokerConfig;
use crate::group::GroupCoordinator;
use crate::replica::{ReplicaManager, TopicError};
use crate::server::memory_pool::MemoryPool;
use crate::txn::TxnCoordinator;

/// Shared state every connection sees.
pub struct BrokerState {
    pub replicas: Arc<ReplicaManager>,
    groups: Arc<GroupCoordinator>,
    txns: TxnCoordinator,
    fetch_sessions: Mutex<FetchSessionCache>,
    /// Bytes of requests being received or handled (`queued.max.request.bytes`).
    request_pool: Arc<MemoryPool>,
    /// In a multi-node cluster: the quorum, the image and this broker's
    /// registration. `None` on a single node.
    cluster: Option<Arc<ClusterNode>>,
    /// In a cluster: followers' fetchers and the leaders' ISR changes.
    replication: Option<Arc<crate::replica::replication::Replication>>,
}

impl BrokerState {
    pub fn cluster(&self) -> Option<&Arc<ClusterNode>> {
        self.cluster.as_ref()
    }

    pub fn replication(&self) -> Option<&Arc<crate::replica::replication::Replication>> {
        self.replication.as_ref()
    }

    /// The cluster id clients see: the quorum's in a cluster (empty until
    /// the first controller has written it), the node's own otherwise.
    pub fn cluster_id(&self) -> String {
        match &self.cluster {
            Some(c) => c.image().cluster_id.clone().unwrap_or_default(),
            None => self.replicas.cluster_id.clone(),
        }
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.replicas.config
    }

    pub fn groups(&self) -> &GroupCoordinator {
        &self.groups
    }

    pub fn txns(&self) -> &TxnCoordinator {
        &self.txns
    }

    pub fn request_pool(&self) -> &Arc<MemoryPool> {
        &self.request_pool
    }

    pub fn lock_fetch_sessions(&self) -> MutexGuard<'_, FetchSessionCache> {
        self.fetch_sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the logs: {0}")]
    Logs(#[from] TopicError),
    #[error("cannot listen on {addr} ({name}): {source}")]
    Bind { name: String, addr: String, source: std::io::Error },
    #[error("invalid listener {0}")]
    Listener(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Quorum(#[from] crate::controller::driver::DriverStartError),
}

/// A running broker. Dropping it does not stop it; call [`BrokerHandle::shutdown`].
pub struct BrokerHandle {
    addrs: Vec<(String, SocketAddr)>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    state: Arc<BrokerState>,
}

pub struct Broker;

impl Broker {
    /// Opens the logs (recovering as needed), binds every listener and starts serving.
    pub async fn start(config: BrokerConfig) -> Result<BrokerHandle, StartError> {
        Self::start_with_listeners(config, Vec::new()).await
    }

    /// [`Broker::start`] with some listeners already bound (by name; the
    /// CONTROLLER listener too), as a test harness does to learn every
    /// node's ports before any node starts, without a bind-and-release race.
    pub async fn start_with_listeners(
        mut config: BrokerConfig,
        mut prebound: Vec<(String, TcpListener)>,
    ) -> Result<BrokerHandle, StartError> {
        let started = Instant::now();
        let cluster_quorum = config.quorum.clone().filter(|q| !q.is_single_node(config.node_id));
        if let Some(q) = &cluster_quorum {
            if !q.roles.broker {
                return Err(StartError::Unsupported(
                    "process.roles=controller: a controller-only node serves no clients; it runs as \
                     strand::ControllerNode (the strand binary picks it from process.roles)"
                        .into(),
                ));
            }
        }
        let mut take_prebound =
            |name: &str| prebound.iter().position(|(n, _)| n == name).map(|i| prebound.swap_remove(i).1);
        // Bind first so a port-0 listener's real port can be advertised.
        let mut bound = Vec::new();
        for l in config.listeners.clone() {
            if let Some(socket) = take_prebound(&l.name) {
                let local = socket.local_addr().map_err(|source| StartError::Bind {
                    name: l.name.clone(),
                    addr: format!("{}:{}", l.host, l.port),
                    source,
                })?;
                for a in config.advertised_listeners.iter_mut().filter(|a| a.name == l.name && a.port == 0) {
                    a.port = local.port();
                }
                bound.push((l.name.clone(), local, socket));
                continue;
            }
            let addr = l.bind_addr().map_err(StartError::Listener)?;
            let socket = TcpListener::bind(addr).await.map_err(|source| StartError::Bind {
                name: l.name.clone(),
                addr: addr.to_string(),
                source,
            })?;
            let local = socket.local_addr().map_err(|source| StartError::Bind {
                name: l.name.clone(),
                addr: addr.to_string(),
                source,
            })?;
            for a in config.advertised_listeners.iter_mut().filter(|a| a.name == l.name && a.port == 0) {
                a.port = local.port();
            }
            bound.push((l.name.clone(), local, socket));
        }
        let controller_socket =
            match cluster_quorum.as_ref().filter(|q| q.roles.controller).and_then(|q| q.controller_listener.clone()) {
                None => None,
                Some(l) => match take_prebound(&l.name) {
                    Some(socket) => Some(socket),
                    None => {
                        let addr = l.bind_addr().map_err(StartError::Listener)?;
                        Some(TcpListener::bind(addr).await.map_err(|source| StartError::Bind {
                            name: l.name.clone(),
                            addr: addr.to_string(),
                            source,
                        })?)
                    }
                },
            };
        let log_dir = config.log_dir.clone();
        let cfg = config.clone();
        // Log recovery is blocking file I/O.
        let replicas = tokio::task::spawn_blocking(move || ReplicaManager::open(cfg))
            .await
            .map_err(|e| StartError::Listener(format!("log loading panicked: {e}")))??;
        let replicas = Arc::new(replicas);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let cluster = match (&cluster_quorum, controller_socket) {
            (Some(q), socket) => {
                let leftovers = replicas.single_node_topics();
                if !leftovers.is_empty() {
                    return Err(StartError::Unsupported(format!(
                        "{} holds topics of a single-node Strand ({}); a cluster node needs a log directory that \
                         is empty or was written by a cluster node",
                        log_dir.display(),
                        leftovers.join(", ")
                    )));
                }
                let meta = crate::cluster::meta_properties::MetaProperties::open(&log_dir, config.node_id)
                    .map_err(|e| StartError::Unsupported(e.to_string()))?;
                Some(ClusterNode::start(config.node_id, q, socket, meta, log_dir.clone()).await?)
            }
            (None, _) => None,
        };
        let (groups, txns) = if cluster.is_some() {
            // The coordinators' shards start as the image places
            // `__consumer_offsets` and `__transaction_state` partitions here
            // (see cluster::publisher).
            let groups = Arc::new(GroupCoordinator::empty(replicas.clone(), config.group.clone(), shutdown_rx.clone()));
            let markers = crate::txn::MarkerWriter {
                replicas: replicas.clone(),
                groups: groups.clone(),
                cluster: cluster.clone(),
            };
            let txns = TxnCoordinator::empty(markers, config.txn.clone(), shutdown_rx.clone());
            (groups, txns)
        } else {
            let groups =
                Arc::new(GroupCoordinator::start(replicas.clone(), config.group.clone(), shutdown_rx.clone())?);
            let txns =
                TxnCoordinator::start(replicas.clone(), groups.clone(), config.txn.clone(), shutdown_rx.clone())?;
            (groups, txns)
        };
        let replication = cluster.as_ref().map(|node| {
            let listener = cluster_quorum.as_ref().map(|q| q.inter_broker_listener_name.clone()).unwrap_or_default();
            crate::replica::replication::Replication::new(
                node.clone(),
                replicas.clone(),
                &listener,
                config.replica_lag_time_max_ms as i64,
                shutdown_rx.clone(),
            )
        });
        let state = Arc::new(BrokerState {
            replication: replication.clone(),
            cluster: cluster.clone(),
            fetch_sessions: Mutex::new(FetchSessionCache::new(config.fetch_session_cache_slots)),
            request_pool: Arc::new(MemoryPool::new(config.queued_max_request_bytes)),
            groups,
            txns,
            replicas,
        });
        let permits = Arc::new(Semaphore::new(config.max_connections));
        let mut tasks = JoinSet::new();
        let mut addrs = Vec::new();
        for (name, local, socket) in bound {
            addrs.push((name.clone(), local));
            tasks.spawn(crate::server::serve(state.clone(), socket, name, shutdown_rx.clone(), permits.clone()));
        }
        tasks.spawn(housekeeping(state.clone(), shutdown_rx.clone()));
        if let Some(node) = &cluster {
            let endpoints = config
                .advertised_listeners
                .iter()
                .map(|l| crate::metadata::records::Endpoint {
                    name: l.name.clone(),
                    host: l.host.clone(),
                    port: l.port,
                })
                .collect();
            tasks.spawn(crate::cluster::publisher::run(node.clone(), state.clone()));
            if let Some(r) = &replication {
                tasks.spawn(r.clone().check_lagging(shutdown_rx.clone()));
            }
            tasks.spawn(crate::cluster::lifecycle::run(
                node.clone(),
                endpoints,
                config.rack.clone(),
                state.replicas.previous_clean_shutdown,
                shutdown_rx.clone(),
            ));
        }
        if config.scrub.enable {
            tasks.spawn(scrubber(state.clone(), shutdown_rx.clone()));
        }
        if config.cleaner.enable {
            tasks.spawn(cleaner(state.clone(), shutdown_rx.clone()));
        }
        tracing::info!(
            node_id = config.node_id,
            cluster_id = %state.cluster_id(),
            log_dir = %log_dir.display(),
            listeners = ?addrs,
            startup_ms = started.elapsed().as_millis() as u64,
            "strand started"
        );
        Ok(BrokerHandle { addrs, shutdown, tasks, state })
    }
}

/// Flushes logs whose flush interval has passed (every second) and enforces
/// retention (every `log.retention.check.interval.ms`).
async fn housekeeping(state: Arc<BrokerState>, mut shutdown: watch::Receiver<bool>) {
    let retention_every = Duration::from_millis(state.config().log_retention_check_interval_ms);
    let mut tick = tokio::time::interval(Duration::from_millis(1000).min(retention_every));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let checkpoint_every = Duration::from_millis(state.config().log_flush_offset_checkpoint_interval_ms);
    let mut last_retention = Instant::now();
    let mut last_checkpoint = Instant::now();
    let mut last_hw_checkpoint = Instant::now();
    loop {
        tokio::select! {
            _ = crate::server::listener::wait_shutdown(&mut shutdown) => return,
            _ = tick.tick() => {}
        }
        let retention = last_retention.elapsed() >= retention_every;
        if retention {
            last_retention = Instant::now();
        }
        let checkpoint = last_checkpoint.elapsed() >= checkpoint_every;
        if checkpoint {
            last_checkpoint = Instant::now();
        }
        // replica.high.watermark.checkpoint.interval.ms (Kafka's 5 s).
        let hw_checkpoint = state.cluster().is_some() && last_hw_checkpoint.elapsed() >= Duration::from_secs(5);
        if hw_checkpoint {
            last_hw_checkpoint = Instant::now();
        }
        let s = state.clone();
        let _ = tokio::task::spawn_blocking(move || {
            s.replicas.maintain(retention, checkpoint);
            if hw_checkpoint {
                s.replicas.checkpoint_high_watermarks();
            }
        })
        .await;
    }
}

/// The scrubber (`log.scrub.*`): passes over every partition's cold
/// segments on a blocking thread at a bounded read rate; when a pass finds
/// nothing due it waits a while before looking again.
async fn scrubber(state: Arc<BrokerState>, mut shutdown: watch::Receiver<bool>) {
    const IDLE: Duration = Duration::from_secs(10);
    loop {
        let s = state.clone();
        let stop = shutdown.clone();
        let verified = tokio::task::spawn_blocking(move || {
            let scrub = s.config().scrub.clone();
            s.replicas.scrub(&scrub, &|| *stop.borrow())
        })
        .await
        .unwrap_or(0);
        if verified > 0 {
            continue;
        }
        tokio::select! {
            _ = crate::server::listener::wait_shutdown(&mut shutdown) => return,
            _ = tokio::time::sleep(IDLE) => {}
        }
    }
}

/// The log cleaner: compacts `cleanup.policy=compact` partitions every
/// `log.cleaner.backoff.ms`, on a blocking thread so requests are not delayed.
async fn cleaner(state: Arc<BrokerState>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(state.config().cleaner.backoff_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = crate::server::listener::wait_shutdown(&mut shutdown) => return,
            _ = tick.tick() => {}
        }
        let s = state.clone();
        let _ = tokio::task::spawn_blocking(move || s.replicas.clean_compacted()).await;
    }
}

impl BrokerHandle {
    /// The address of the first listener.
    pub fn addr(&self) -> SocketAddr {
        self.addrs[0].1
    }

    /// `host:port` of the first listener, for a client's `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> String {
        self.addr().to_string()
    }

    pub fn state(&self) -> &Arc<BrokerState> {
        &self.state
    }

    /// Resolves when the broker cannot go on (its cluster controller
    /// stopped on its own), with why; never on a single node.
    pub async fn failed(&self) -> String {
        match self.state.cluster() {
            Some(node) => node.failed().await,
            None => std::future::pending().await,
        }
    }

    /// Graceful shutdown: stop accepting, let in-flight requests finish, then
    /// flush every log and write its checkpoint.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
        if let Some(node) = self.state.cluster() {
            node.stop().await;
        }
        let state = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || state.replicas.close()).await;
        tracing::info!("strand stopped");
    }
}
