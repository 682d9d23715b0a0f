//! What the group and transaction coordinators share: a handle to a shard
//! task (its request channel and whether it has loaded its partition) and the
//! fan-out that lists every loaded shard's entries.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use tokio::sync::{mpsc, oneshot};

use crate::replica::Partition;

/// How long a coordinator waits for its records to reach the in-sync
/// replicas before it gives up on an answer (Kafka's
/// `offsets.commit.timeout.ms` default).
pub const REPLICATION_TIMEOUT: Duration = Duration::from_millis(5000);

/// A coordinator shard task, addressed by its command type `C`, and the
/// internal partition it owns.
pub struct ShardHandle<C> {
    pub tx: mpsc::Sender<C>,
    pub loaded: Arc<AtomicBool>,
    pub partition: Arc<Partition>,
    /// The partition's leader epoch when the shard loaded it: a shard of an
    /// earlier leadership is replaced, since another leader may have written
    /// in between.
    pub leader_epoch: i32,
}

impl<C> Clone for ShardHandle<C> {
    fn clone(&self) -> Self {
        ShardHandle {
            tx: self.tx.clone(),
            loaded: self.loaded.clone(),
            partition: self.partition.clone(),
            leader_epoch: self.leader_epoch,
        }
    }
}

impl<C> ShardHandle<C> {
    pub fn new(tx: mpsc::Sender<C>, loaded: Arc<AtomicBool>, partition: Arc<Partition>) -> Self {
        let leader_epoch = partition.leader_epoch();
        ShardHandle { tx, loaded, partition, leader_epoch }
    }

    /// Whether this shard serves `partition` in its current leadership.
    pub fn serves(&self, partition: &Arc<Partition>) -> bool {
        Arc::ptr_eq(&self.partition, partition) && self.leader_epoch == partition.leader_epoch()
    }

    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Sends the command `make` builds and returns the shard's answer once
    /// every record in the partition when it answered is committed: an
    /// answer never rests on a record a new leader may not have (Kafka's
    /// coordinators hold responses until the high watermark passes their
    /// writes). Reads wait too, for the writes they saw. Immediate on a
    /// single node, whose high watermark is its log end.
    pub async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> C) -> Result<T, i16> {
        let not_available = ResponseError::CoordinatorNotAvailable.code();
        let epoch = self.leader_epoch;
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).await.map_err(|_| not_available)?;
        let answer = rx.await.map_err(|_| not_available)?;
        let deadline = tokio::time::Instant::now() + REPLICATION_TIMEOUT;
        match self.partition.wait_log_end_replicated(epoch, deadline).await {
            Ok(()) => Ok(answer),
            Err(e) => {
                tracing::warn!(
                    topic = %self.partition.topic, partition = self.partition.index, error = %e,
                    "coordinator answer withheld: its records are not committed"
                );
                Err(crate::api::error::coordinator_write_code(&e))
            }
        }
    }
}

/// The partitions of an internal topic that the newest metadata image says
/// this broker leads, noted before their logs are opened and their shards
/// started (opening fifty partitions takes a while): a request for one of
/// them meanwhile gets COORDINATOR_LOAD_IN_PROGRESS, which clients retry in
/// place, rather than NOT_COORDINATOR from a broker that FindCoordinator
/// (answered elsewhere from a newer image) just named.
#[derive(Debug, Default, Clone)]
pub struct Incoming {
    pub partition_count: i32,
    pub partitions: std::collections::HashSet<i32>,
}

/// The shard owning `key`, or the error that tells the client where it
/// stands: COORDINATOR_NOT_AVAILABLE before the topic exists here,
/// COORDINATOR_LOAD_IN_PROGRESS for a partition about to be led here,
/// NOT_COORDINATOR for one led elsewhere.
pub fn pick<C>(shards: &[Option<ShardHandle<C>>], incoming: &Incoming, key: &str) -> Result<ShardHandle<C>, i16> {
    let count = if shards.is_empty() { incoming.partition_count } else { shards.len() as i32 };
    if count <= 0 {
        return Err(ResponseError::CoordinatorNotAvailable.code());
    }
    let p = crate::group::records::partition_for(key, count);
    match shards.get(p as usize).cloned().flatten() {
        Some(shard) => Ok(shard),
        None if incoming.partition_count == count && incoming.partitions.contains(&p) => {
            Err(ResponseError::CoordinatorLoadInProgress.code())
        }
        None => Err(ResponseError::NotCoordinator.code()),
    }
}

/// How long a request for a coordinator partition that is being loaded
/// here waits for it before answering COORDINATOR_LOAD_IN_PROGRESS: clients
/// retry that error only a few times (librdkafka fails a synchronous offset
/// commit on it), and loading a freshly led partition takes moments.
pub const LOAD_WAIT: Duration = Duration::from_secs(5);

/// The shard `pick` names once it has loaded, waiting up to [`LOAD_WAIT`]
/// while the partition is incoming or loading; other errors at once.
pub async fn loaded<C>(pick: impl Fn() -> Result<ShardHandle<C>, i16>) -> Result<ShardHandle<C>, i16> {
    let load_in_progress = ResponseError::CoordinatorLoadInProgress.code();
    let deadline = tokio::time::Instant::now() + LOAD_WAIT;
    loop {
        let picked = pick().and_then(|s| if s.is_loaded() { Ok(s) } else { Err(load_in_progress) });
        match picked {
            // Loading sets a flag and hosting swaps a table: nothing to wait
            // on but time, so check again shortly.
            Err(code) if code == load_in_progress && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            picked => return picked,
        }
    }
}

/// Asks every loaded shard for its list (`make` builds the request) and joins
/// the answers. The error is COORDINATOR_LOAD_IN_PROGRESS if a shard is still
/// loading (its entries are then missing), else 0.
pub async fn list_all<C, T>(shards: &[ShardHandle<C>], make: impl Fn(oneshot::Sender<Vec<T>>) -> C) -> (i16, Vec<T>) {
    let mut out = Vec::new();
    let mut error = 0;
    for shard in shards {
        if !shard.is_loaded() {
            error = ResponseError::CoordinatorLoadInProgress.code();
            continue;
        }
        let (tx, rx) = oneshot::channel();
        if shard.tx.send(make(tx)).await.is_ok() {
            if let Ok(list) = rx.await {
                out.extend(list);
            }
        }
    }
    (error, out)
}
