//! Broker start-up and shutdown: open the logs, bind the listeners, run the
//! housekeeping task, and stop in order on request.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::api::fetch_session::FetchSessionCache;
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
}

impl BrokerState {
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
    pub async fn start(mut config: BrokerConfig) -> Result<BrokerHandle, StartError> {
        let started = Instant::now();
        if let Some(q) = config.quorum.as_ref().filter(|q| !q.is_single_node(config.node_id)) {
            // The quorum's pieces (raft log on disk, Ready-loop core, metadata
            // image, placement) exist, but brokers do not yet serve from them:
            // say so rather than run a single node the user believes is a cluster.
            return Err(StartError::Unsupported(format!(
                "controller.quorum.voters names {} voter(s) and process.roles is {}: a multi-node cluster is not \
                 served by this build yet; remove controller.quorum.voters (or list only this node, with \
                 process.roles=broker,controller) to run a single node",
                q.voters.len(),
                match (q.roles.broker, q.roles.controller) {
                    (true, true) => "broker,controller",
                    (true, false) => "broker",
                    _ => "controller",
                }
            )));
        }
        // Bind first so a port-0 listener's real port can be advertised.
        let mut bound = Vec::new();
        for l in config.listeners.clone() {
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
        let log_dir = config.log_dir.clone();
        let cfg = config.clone();
        // Log recovery is blocking file I/O.
        let replicas = tokio::task::spawn_blocking(move || ReplicaManager::open(cfg))
            .await
            .map_err(|e| StartError::Listener(format!("log loading panicked: {e}")))??;
        let replicas = Arc::new(replicas);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let groups = Arc::new(GroupCoordinator::start(replicas.clone(), config.group.clone(), shutdown_rx.clone())?);
        let txns = TxnCoordinator::start(replicas.clone(), groups.clone(), config.txn.clone(), shutdown_rx.clone())?;
        let state = Arc::new(BrokerState {
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
        if config.scrub.enable {
            tasks.spawn(scrubber(state.clone(), shutdown_rx.clone()));
        }
        if config.cleaner.enable {
            tasks.spawn(cleaner(state.clone(), shutdown_rx.clone()));
        }
        tracing::info!(
            node_id = config.node_id,
            cluster_id = %state.replicas.cluster_id,
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
        let s = state.clone();
        let _ = tokio::task::spawn_blocking(move || s.replicas.maintain(retention, checkpoint)).await;
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

    /// Graceful shutdown: stop accepting, let in-flight requests finish, then
    /// flush every log and write its checkpoint.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
        let state = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || state.replicas.close()).await;
        tracing::info!("strand stopped");
    }
}
