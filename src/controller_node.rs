//! A controller-only node (`process.roles=controller`): a voter of the
//! metadata quorum that serves no clients. It binds only its CONTROLLER
//! listener, keeps the raft log in `metadata.log.dir` (with Kafka's
//! `meta.properties` there: node id, then cluster id), and never registers
//! as a broker, so no partition is placed on it. Brokers reach it for
//! registration, heartbeats and forwarded requests as they reach any
//! controller.

use tokio::net::TcpListener;

use crate::broker::StartError;
use crate::cluster::meta_properties::MetaProperties;
use crate::config::BrokerConfig;
use crate::controller::driver::{Controller, DriverSettings, QuorumView};

pub struct ControllerNode {
    controller: Controller,
    /// Records the cluster id in meta.properties once the image has one.
    recorder: tokio::task::JoinHandle<()>,
}

impl ControllerNode {
    pub async fn start(config: BrokerConfig) -> Result<ControllerNode, StartError> {
        Self::start_with_listener(config, None).await
    }

    /// Like [`ControllerNode::start`], with the CONTROLLER listener already
    /// bound (tests bind every node's ports before any node starts).
    pub async fn start_with_listener(
        config: BrokerConfig,
        prebound: Option<TcpListener>,
    ) -> Result<ControllerNode, StartError> {
        let quorum =
            config.quorum.clone().filter(|q| q.roles.controller && !q.roles.broker).ok_or_else(|| {
                StartError::Unsupported("a controller-only node needs process.roles=controller".into())
            })?;
        let listener = match prebound {
            Some(l) => l,
            None => {
                let l = quorum.controller_listener.clone().ok_or_else(|| {
                    StartError::Listener("a controller needs the listener named in controller.listener.names".into())
                })?;
                let addr = l.bind_addr().map_err(StartError::Listener)?;
                TcpListener::bind(addr).await.map_err(|source| StartError::Bind {
                    name: l.name.clone(),
                    addr: addr.to_string(),
                    source,
                })?
            }
        };
        let dir = quorum.metadata_log_dir.clone();
        let meta = MetaProperties::open(&dir, config.node_id).map_err(|e| StartError::Unsupported(e.to_string()))?;
        let mut settings = DriverSettings::new(config.node_id, quorum.voters.clone(), dir.clone());
        settings.session_timeout_ms = quorum.session_timeout_ms;
        settings.connection_loss_grace_ms = quorum.connection_loss_grace_ms();
        settings.leader_rebalance_interval_ms = quorum.leader_rebalance_interval_ms;
        settings.unclean_leader_election = quorum.unclean_leader_election;
        settings.expected_cluster_id = meta.cluster_id.clone();
        if let Some(seed) = quorum.seed {
            settings.seed = seed;
        }
        let controller = Controller::start(settings, listener).await?;
        let mut images = controller.image();
        let recorder = tokio::spawn(async move {
            let mut meta = meta;
            // The driver refuses a log of another cluster; here the id is only recorded.
            if let Ok(image) = images.wait_for(|i| i.cluster_id.is_some()).await {
                let id = image.cluster_id.clone().unwrap_or_default();
                drop(image);
                if let Err(e) = meta.adopt_cluster_id(&dir, &id) {
                    tracing::error!(error = %e, "cannot record the cluster id in meta.properties");
                }
            }
        });
        tracing::info!(node_id = config.node_id, metadata_log_dir = %quorum.metadata_log_dir.display(), "strand started (controller only)");
        Ok(ControllerNode { controller, recorder })
    }

    pub fn controller(&self) -> &Controller {
        &self.controller
    }

    pub fn quorum(&self) -> QuorumView {
        *self.controller.view().borrow()
    }

    /// Resolves when the controller stopped on its own, with why.
    pub async fn failed(&self) -> String {
        self.controller.failed().await
    }

    /// Stops the controller; everything it acknowledged is on disk.
    pub async fn shutdown(self) {
        self.recorder.abort();
        self.controller.stop().await;
        tracing::info!("strand stopped");
    }
}
