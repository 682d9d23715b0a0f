//! How nodes that are not voters (broker-only nodes) follow the metadata
//! log: they fetch committed records from a controller over the CONTROLLER
//! listener (a [`super::transport::Purpose::Metadata`] connection) instead
//! of joining raft, so the voters' raft state never depends on a broker.
//!
//! Every voter keeps the batches it applied recently ([`MetadataFeed`]); a
//! fetch names the offset the follower's image is at and gets the batches
//! after it, or the whole image when the feed no longer reaches back that
//! far (a new or long-gone broker). Committed entries are final, so any
//! voter may answer; followers prefer the leader, which also reports them as
//! observers in DescribeQuorum.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::describe::{wall_clock_ms, ReplicaDescription};
use super::driver::QuorumView;
use super::transport;
use crate::metadata::image::ClusterImage;
use crate::metadata::records::RecordBatch;

/// Batches kept for followers; one further behind gets the image.
const FEED_BATCHES: usize = 4096;

/// The longest a fetch waits for something new.
pub const MAX_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FetchMetadata {
    /// The offset the follower's image is at.
    pub after: u64,
    /// How long to wait when there is nothing newer (capped at [`MAX_WAIT`]).
    pub wait_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetadataUpdate {
    /// Who leads the quorum and in which term, as the answering voter knows.
    pub leader: Option<i32>,
    pub term: u64,
    /// The offset the follower's image is at once it applied this update.
    pub through: u64,
    /// The whole image, when the batches since `after` are no longer kept.
    pub image: Option<ClusterImage>,
    /// Batches after `after` up to `through`, in order, with their offsets.
    pub batches: Vec<(u64, RecordBatch)>,
}

impl MetadataUpdate {
    /// Applies the update to a follower's image.
    pub fn apply_to(self, image: &mut ClusterImage) {
        if let Some(whole) = self.image {
            *image = whole;
        }
        for (offset, batch) in &self.batches {
            if *offset > image.offset {
                image.apply(*offset, batch);
            }
        }
        image.advance_to(self.through);
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Every batch with an offset above this is in `batches`.
    start: u64,
    batches: VecDeque<(u64, RecordBatch)>,
}

/// The recently applied batches of one voter, and who fetches them.
#[derive(Debug, Default)]
pub struct MetadataFeed {
    inner: Mutex<Inner>,
    /// Followers that fetched from this voter: node id -> progress.
    observers: Mutex<BTreeMap<i32, ReplicaDescription>>,
}

impl MetadataFeed {
    pub fn new(start: u64) -> Arc<MetadataFeed> {
        let feed = MetadataFeed::default();
        feed.lock().start = start;
        Arc::new(feed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The image was replaced at `offset` (a snapshot): older batches are gone.
    pub fn reset(&self, offset: u64) {
        let mut inner = self.lock();
        inner.batches.clear();
        inner.start = offset;
    }

    pub fn push(&self, offset: u64, batch: RecordBatch) {
        let mut inner = self.lock();
        inner.batches.push_back((offset, batch));
        while inner.batches.len() > FEED_BATCHES {
            if let Some((evicted, _)) = inner.batches.pop_front() {
                inner.start = evicted;
            }
        }
    }

    /// The batches in `(after, through]`, or `None` if some are no longer kept.
    pub fn since(&self, after: u64, through: u64) -> Option<Vec<(u64, RecordBatch)>> {
        let inner = self.lock();
        if after < inner.start {
            return None;
        }
        Some(inner.batches.iter().filter(|(o, _)| *o > after && *o <= through).cloned().collect())
    }

    /// What the follower `node_id` has, as it said in its fetch.
    fn fetched(&self, node_id: i32, offset: u64, caught_up: bool) {
        let now = wall_clock_ms();
        let mut observers = self.observers.lock().unwrap_or_else(|e| e.into_inner());
        let entry = observers.entry(node_id).or_insert(ReplicaDescription {
            replica_id: node_id,
            log_end_offset: -1,
            last_fetch_ms: -1,
            last_caught_up_ms: -1,
        });
        entry.log_end_offset = offset as i64 + 1;
        entry.last_fetch_ms = now;
        if caught_up {
            entry.last_caught_up_ms = now;
        }
    }

    /// Followers heard from within `within` (for DescribeQuorum).
    pub fn observers(&self, within: Duration) -> Vec<ReplicaDescription> {
        let oldest = wall_clock_ms() - within.as_millis() as i64;
        let observers = self.observers.lock().unwrap_or_else(|e| e.into_inner());
        observers.values().filter(|o| o.last_fetch_ms >= oldest).cloned().collect()
    }
}

/// Answers one follower's fetches, in order, until it goes away.
pub async fn serve(
    mut stream: TcpStream,
    from: i32,
    feed: Arc<MetadataFeed>,
    mut images: watch::Receiver<Arc<ClusterImage>>,
    view: watch::Receiver<QuorumView>,
) {
    while let Ok(frame) = transport::read_frame(&mut stream).await {
        let fetch: FetchMetadata = match serde_json::from_slice(&frame) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(peer = from, error = %e, "malformed metadata fetch; closing");
                return;
            }
        };
        let wait = Duration::from_millis(fetch.wait_ms).min(MAX_WAIT);
        if let Ok(Err(_)) = tokio::time::timeout(wait, images.wait_for(|i| i.offset > fetch.after)).await {
            // The controller is gone: what it last knew is no news to serve.
            return;
        }
        let image = images.borrow().clone();
        feed.fetched(from, fetch.after, fetch.after >= image.offset);
        let v = *view.borrow();
        let through = image.offset.max(fetch.after);
        let update = match feed.since(fetch.after, through) {
            Some(batches) => MetadataUpdate { leader: v.leader, term: v.term, through, image: None, batches },
            None => MetadataUpdate {
                leader: v.leader,
                term: v.term,
                through: image.offset,
                image: Some((*image).clone()),
                batches: Vec::new(),
            },
        };
        let body = serde_json::to_vec(&update).expect("updates serialise");
        if transport::write_frame(&mut stream, &body).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::records::MetadataRecord;

    fn batch(name: &str) -> RecordBatch {
        RecordBatch {
            proposal: uuid::Uuid::new_v4(),
            records: vec![MetadataRecord::ClusterId { cluster_id: name.to_string() }],
        }
    }

    #[test]
    fn the_feed_serves_what_it_holds_and_says_when_it_does_not() {
        let feed = MetadataFeed::new(10);
        feed.push(11, batch("a"));
        feed.push(13, batch("b"));
        assert_eq!(feed.since(10, 13).unwrap().len(), 2);
        assert_eq!(feed.since(11, 13).unwrap().iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![13]);
        assert_eq!(feed.since(11, 12).unwrap().len(), 0, "nothing past `through`");
        assert!(feed.since(9, 13).is_none(), "offset 10 is not kept");
        for o in 0..FEED_BATCHES as u64 {
            feed.push(14 + o, batch("c"));
        }
        assert!(feed.since(12, 20).is_none(), "evicted");
        feed.reset(5000);
        assert!(feed.since(4999, 6000).is_none());
        assert_eq!(feed.since(5000, 6000).unwrap().len(), 0);
    }
}
