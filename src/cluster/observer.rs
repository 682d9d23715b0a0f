//! A broker-only node's view of the metadata log: it is not a voter, so it
//! follows the log by fetching committed batches from a voter (the leader
//! when known) over the CONTROLLER listener ([`crate::controller::feed`])
//! and sends its requests to the active controller like any broker.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::config::Voter;
use crate::controller::client::{self, ControllerClient};
use crate::controller::core::{Reply, Request};
use crate::controller::driver::{DriverError, QuorumView};
use crate::controller::feed::{FetchMetadata, MetadataUpdate, MAX_WAIT};
use crate::controller::transport::{self, Hello, Purpose};
use crate::metadata::image::ClusterImage;

/// How long one fetch waits for news before asking again.
const FETCH_WAIT: Duration = Duration::from_millis(500);

pub struct MetadataObserver {
    node_id: i32,
    voters: Vec<Voter>,
    image: watch::Receiver<Arc<ClusterImage>>,
    view: watch::Receiver<QuorumView>,
    fatal: watch::Receiver<Option<String>>,
    client: ControllerClient,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl MetadataObserver {
    /// Starts following the log; `expected_cluster_id` is the one this
    /// node's data directory belongs to, if it has one.
    pub fn start(node_id: i32, voters: Vec<Voter>, expected_cluster_id: Option<String>) -> MetadataObserver {
        let (image_tx, image) = watch::channel(Arc::new(ClusterImage::default()));
        let (view_tx, view) = watch::channel(QuorumView { leader: None, term: 0, is_leader: false });
        let (fatal_tx, fatal) = watch::channel(None);
        let voters_text = transport::canonical_voters(&voters);
        let follower = Follower {
            node_id,
            voters: voters.clone(),
            voters_text: voters_text.clone(),
            expected_cluster_id,
            image_tx,
            view_tx,
            fatal_tx,
        };
        let task = tokio::spawn(follower.run());
        MetadataObserver {
            node_id,
            voters: voters.clone(),
            client: ControllerClient::new(node_id, voters, voters_text, image.clone()),
            image,
            view,
            fatal,
            task: std::sync::Mutex::new(Some(task)),
        }
    }

    pub fn image(&self) -> watch::Receiver<Arc<ClusterImage>> {
        self.image.clone()
    }

    pub fn view(&self) -> watch::Receiver<QuorumView> {
        self.view.clone()
    }

    /// Asks the active controller; answers once this node's image has
    /// applied the reply's offset.
    pub async fn submit(&self, request: Request, timeout: Duration) -> Result<Reply, DriverError> {
        let ask = |leader: i32| -> futures_util::future::BoxFuture<'_, client::Answer> {
            let request = request.clone();
            Box::pin(async move { self.client.forward(leader, &request).await })
        };
        client::submit(&self.image, &self.view, &self.voters, timeout, ask).await
    }

    /// Resolves when the node cannot follow this cluster's log (it is
    /// another cluster's), with why.
    pub async fn failed(&self) -> String {
        let mut fatal = self.fatal.clone();
        let reason = fatal.wait_for(|f| f.is_some()).await.map(|f| f.clone().unwrap_or_default());
        match reason {
            Ok(reason) => reason,
            Err(_) => std::future::pending().await,
        }
    }

    pub async fn stop(&self) {
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
    }

    pub fn node_id(&self) -> i32 {
        self.node_id
    }
}

struct Follower {
    node_id: i32,
    voters: Vec<Voter>,
    voters_text: String,
    expected_cluster_id: Option<String>,
    image_tx: watch::Sender<Arc<ClusterImage>>,
    view_tx: watch::Sender<QuorumView>,
    fatal_tx: watch::Sender<Option<String>>,
}

impl Follower {
    async fn run(self) {
        let mut next = 0usize;
        let mut target: Option<i32> = None;
        let mut backoff = Duration::from_millis(50);
        loop {
            let id = target.unwrap_or_else(|| {
                next += 1;
                self.voters[next % self.voters.len()].id
            });
            match self.follow(id).await {
                // The voter named another leader: follow that one.
                Ok(leader) => {
                    target = Some(leader);
                    backoff = Duration::from_millis(50);
                }
                Err(Stop(reason)) => {
                    tracing::error!(node = self.node_id, "{reason}; this broker stops following the metadata log");
                    self.fatal_tx.send_replace(Some(reason));
                    return;
                }
                Err(Retry(e)) => {
                    tracing::debug!(node = self.node_id, voter = id, error = %e, "metadata fetch failed; trying another voter");
                    target = None;
                    // A leader we cannot reach is not one to send requests to.
                    self.view_tx.send_if_modified(|v| {
                        let unreachable_leader = v.leader == Some(id);
                        if unreachable_leader {
                            v.leader = None;
                        }
                        unreachable_leader
                    });
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// Fetches from voter `id` until it fails or names another leader.
    async fn follow(&self, id: i32) -> Result<i32, FollowError> {
        let voter = self.voters.iter().find(|v| v.id == id).expect("a voter");
        let addr = format!("{}:{}", voter.host, voter.port);
        let mut stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(&addr))
            .await
            .map_err(|_| Retry(format!("{addr}: connect timed out")))?
            .map_err(|e| Retry(format!("{addr}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let hello = Hello {
            node_id: self.node_id,
            voters: self.voters_text.clone(),
            cluster_id: self.image_tx.borrow().cluster_id.clone().or_else(|| self.expected_cluster_id.clone()),
            purpose: Purpose::Metadata,
        };
        transport::connect_handshake(&mut stream, &hello).await.map_err(|e| Retry(format!("{addr}: {e}")))?;
        loop {
            let after = self.image_tx.borrow().offset;
            let fetch = FetchMetadata { after, wait_ms: FETCH_WAIT.as_millis() as u64 };
            let exchanged = async {
                transport::write_frame(&mut stream, &serde_json::to_vec(&fetch).expect("fetches serialise")).await?;
                transport::read_frame(&mut stream).await
            };
            let frame = tokio::time::timeout(MAX_WAIT + Duration::from_secs(2), exchanged)
                .await
                .map_err(|_| Retry(format!("{addr}: no answer to a metadata fetch")))?
                .map_err(|e| Retry(format!("{addr}: {e}")))?;
            let update: MetadataUpdate =
                serde_json::from_slice(&frame).map_err(|e| Retry(format!("{addr}: malformed update: {e}")))?;
            let (leader, term) = (update.leader, update.term);
            if update.image.is_some() || !update.batches.is_empty() || update.through > after {
                let mut image = (**self.image_tx.borrow()).clone();
                update.apply_to(&mut image);
                if let (Some(expected), Some(found)) = (&self.expected_cluster_id, &image.cluster_id) {
                    if expected != found {
                        return Err(Stop(format!(
                            "the data directory of node {} belongs to cluster {expected}, but the metadata quorum is \
                             cluster {found}",
                            self.node_id
                        )));
                    }
                }
                self.image_tx.send_replace(Arc::new(image));
            }
            let view = QuorumView { leader, term, is_leader: false };
            if *self.view_tx.borrow() != view {
                self.view_tx.send_replace(view);
            }
            if let Some(l) = leader.filter(|l| *l != id) {
                return Ok(l);
            }
        }
    }
}

enum FollowError {
    /// Try again, perhaps elsewhere.
    Retry(String),
    /// The node must not go on.
    Stop(String),
}
use FollowError::{Retry, Stop};
