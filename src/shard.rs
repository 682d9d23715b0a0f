//! What the group and transaction coordinators share: a handle to a shard
//! task (its request channel and whether it has loaded its partition) and the
//! fan-out that lists every loaded shard's entries.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use tokio::sync::{mpsc, oneshot};

/// A coordinator shard task, addressed by its command type `C`.
pub struct ShardHandle<C> {
    pub tx: mpsc::Sender<C>,
    pub loaded: Arc<AtomicBool>,
}

impl<C> Clone for ShardHandle<C> {
    fn clone(&self) -> Self {
        ShardHandle { tx: self.tx.clone(), loaded: self.loaded.clone() }
    }
}

impl<C> ShardHandle<C> {
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
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
