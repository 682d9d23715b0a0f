//! Followers' fetchers: one task per leader broker, fetching every
//! partition this broker follows there in one Fetch request at a time
//! (v15, `ReplicaState` with our broker epoch; `CurrentLeaderEpoch` and
//! `LastFetchedEpoch` per partition), over a connection of its own.
//!
//! The fetch position is read from the local log on every round (its log
//! end offset and the epoch of its last batch), so the fetcher keeps no
//! state that can go stale: a truncation or a restart is simply the next
//! round's position. The leader's answer either carries batches (appended
//! as they are: [`Partition::append_replicated`]) or a diverging epoch
//! (the log is cut where the leader's differs, and the next round asks
//! again: KIP-101, KIP-279, KIP-320).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ReplicaState};
use kafka_protocol::messages::{BrokerId, FetchRequest};
use tokio::sync::{watch, Notify};
use uuid::Uuid;

use super::partition::Partition;
use super::throttle::Throttles;
use crate::cluster::peers::Peers;
use crate::cluster::ClusterNode;

/// The Fetch version followers send (the first with `ReplicaState`).
const FETCH_VERSION: i16 = 15;
/// Kafka's replica.fetch.wait.max.ms, replica.fetch.min.bytes,
/// replica.fetch.max.bytes, replica.fetch.response.max.bytes,
/// replica.fetch.backoff.ms.
const WAIT_MAX_MS: i32 = 500;
const PARTITION_MAX_BYTES: i32 = 1 << 20;
const RESPONSE_MAX_BYTES: i32 = 10 << 20;
const BACKOFF: Duration = Duration::from_millis(1000);

/// A partition followed here.
#[derive(Clone)]
struct Followed {
    leader: i32,
    leader_epoch: i32,
    topic_id: Uuid,
    partition: Arc<Partition>,
}

#[derive(Default)]
struct Inner {
    followed: HashMap<(Uuid, i32), Followed>,
    /// Leaders with a running fetcher, and how to wake it.
    running: HashMap<i32, Arc<Notify>>,
}

pub struct Fetchers {
    node: Arc<ClusterNode>,
    /// The fetchers' own connections (their long polls must not hold up
    /// other inter-broker requests).
    peers: Peers,
    inner: Mutex<Inner>,
    throttles: Arc<Throttles>,
    shutdown: watch::Receiver<bool>,
}

impl Fetchers {
    pub fn new(
        node: Arc<ClusterNode>,
        listener: &str,
        throttles: Arc<Throttles>,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Fetchers> {
        let peers = Peers::new(node.node_id, listener);
        Arc::new(Fetchers { node, peers, inner: Mutex::new(Inner::default()), throttles, shutdown })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows `partition` from `leader` at `leader_epoch` (replacing what it followed before).
    pub fn follow(self: &Arc<Self>, topic_id: Uuid, partition: Arc<Partition>, leader: i32, leader_epoch: i32) {
        let key = (topic_id, partition.index);
        let mut inner = self.lock();
        let previous = inner.followed.insert(key, Followed { leader, leader_epoch, topic_id, partition });
        if let Some(p) = previous.filter(|p| p.leader != leader) {
            if let Some(n) = inner.running.get(&p.leader) {
                n.notify_one();
            }
        }
        match inner.running.get(&leader) {
            Some(n) => n.notify_one(),
            None => {
                let notify = Arc::new(Notify::new());
                inner.running.insert(leader, notify.clone());
                tokio::spawn(self.clone().run(leader, notify));
            }
        }
    }

    /// Stops following the partition (it is led here now, offline, or gone).
    pub fn unfollow(&self, topic_id: Uuid, index: i32) {
        let mut inner = self.lock();
        if let Some(p) = inner.followed.remove(&(topic_id, index)) {
            if let Some(n) = inner.running.get(&p.leader) {
                n.notify_one();
            }
        }
    }

    /// Drops partitions whose log is no longer the one hosted (deleted topics).
    pub fn retain(&self, hosted: impl Fn(&Uuid, &Arc<Partition>) -> bool) {
        self.lock().followed.retain(|(id, _), f| hosted(id, &f.partition));
    }

    /// The partitions followed from `leader`; the fetcher ends (under the
    /// lock, so a new assignment starts a new one) when there are none.
    fn assigned(&self, leader: i32) -> Option<Vec<Followed>> {
        let mut inner = self.lock();
        let mine: Vec<Followed> = inner.followed.values().filter(|f| f.leader == leader).cloned().collect();
        if mine.is_empty() || *self.shutdown.borrow() {
            inner.running.remove(&leader);
            return None;
        }
        Some(mine)
    }

    async fn run(self: Arc<Self>, leader: i32, notify: Arc<Notify>) {
        tracing::debug!(node = self.node.node_id, leader, "replica fetcher started");
        let mut shutdown = self.shutdown.clone();
        // Partitions the leader refused, left out until the time given.
        let mut delayed: HashMap<(Uuid, i32), tokio::time::Instant> = HashMap::new();
        while let Some(assigned) = self.assigned(leader) {
            let progressed = self.round(leader, &assigned, &mut delayed).await;
            if !progressed {
                // Nothing moved (an error, or a leader not ready): back off,
                // unless the assignment changes or the broker stops.
                tokio::select! {
                    _ = tokio::time::sleep(BACKOFF) => {}
                    _ = notify.notified() => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
        tracing::debug!(node = self.node.node_id, leader, "replica fetcher stopped");
    }

    /// One fetch from `leader` for `assigned`. Returns whether any partition
    /// made progress (or the leader answered without error).
    async fn round(
        &self,
        leader: i32,
        assigned: &[Followed],
        delayed: &mut HashMap<(Uuid, i32), tokio::time::Instant>,
    ) -> bool {
        let mut topics: Vec<FetchTopic> = Vec::new();
        // (partition, fetch offset, whether its bytes count against the follower throttle)
        let mut asked: Vec<(&Followed, i64, bool)> = Vec::new();
        let started = tokio::time::Instant::now();
        delayed.retain(|_, until| *until > started);
        for f in assigned {
            if delayed.contains_key(&(f.topic_id, f.partition.index)) {
                continue;
            }
            let throttled = self.throttles.follower_throttles(&f.topic_id, f.partition.index);
            if throttled
                && !f.partition.in_isr(self.node.node_id)
                && self.throttles.follower.exceeded(started.into_std())
            {
                continue; // left out until the follower quota refills
            }
            let Ok((log_end, last_epoch, log_start)) = f.partition.fetch_position() else { continue };
            let p = FetchPartition::default()
                .with_partition(f.partition.index)
                .with_current_leader_epoch(f.leader_epoch)
                .with_fetch_offset(log_end)
                .with_last_fetched_epoch(last_epoch)
                .with_log_start_offset(log_start)
                .with_partition_max_bytes(PARTITION_MAX_BYTES);
            match topics.iter_mut().find(|t| t.topic_id == f.topic_id) {
                Some(t) => t.partitions.push(p),
                None => topics.push(FetchTopic::default().with_topic_id(f.topic_id).with_partitions(vec![p])),
            }
            asked.push((f, log_end, throttled));
        }
        if asked.is_empty() {
            return false;
        }
        let request = FetchRequest::default()
            .with_replica_state(
                ReplicaState::default()
                    .with_replica_id(BrokerId(self.node.node_id))
                    .with_replica_epoch(self.node.broker_epoch()),
            )
            .with_max_wait_ms(WAIT_MAX_MS)
            .with_min_bytes(1)
            .with_max_bytes(RESPONSE_MAX_BYTES)
            .with_isolation_level(0)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(topics);
        let image = self.node.image();
        let response = match self.peers.call(&image, leader, &request, FETCH_VERSION).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(node = self.node.node_id, leader, error = %e, "replica fetch failed");
                return false;
            }
        };
        if response.error_code != 0 {
            tracing::debug!(node = self.node.node_id, leader, code = response.error_code, "replica fetch refused");
            return false;
        }
        let now = crate::util::now_ms();
        let mut progressed = false;
        for t in response.responses {
            for pd in t.partitions {
                let Some((f, fetch_offset, throttled)) =
                    asked.iter().find(|(f, ..)| f.topic_id == t.topic_id && f.partition.index == pd.partition_index)
                else {
                    continue;
                };
                if *throttled {
                    let bytes = pd.records.as_ref().map_or(0, |r| r.len());
                    self.throttles.follower.record(bytes, std::time::Instant::now());
                }
                if self.apply(f, *fetch_offset, pd, now) {
                    progressed = true;
                } else {
                    delayed.insert((f.topic_id, f.partition.index), tokio::time::Instant::now() + BACKOFF);
                }
            }
        }
        progressed
    }

    /// Applies one partition's part of the leader's answer. Returns whether
    /// the partition moved on (or is simply caught up).
    fn apply(
        &self,
        f: &Followed,
        fetch_offset: i64,
        pd: kafka_protocol::messages::fetch_response::PartitionData,
        now: i64,
    ) -> bool {
        let p = &f.partition;
        let code = pd.error_code;
        if code == 0 {
            let d = &pd.diverging_epoch;
            if d.epoch != -1 || d.end_offset != -1 {
                return match p.truncate_diverging(d.epoch, d.end_offset) {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "cannot truncate to the leader's log");
                        false
                    }
                };
            }
            let records = pd.records.unwrap_or_default();
            return match p.append_replicated(&records, pd.high_watermark, pd.log_start_offset, now) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(topic = %p.topic, partition = p.index, fetch_offset, error = %e, "cannot append the leader's batches");
                    false
                }
            };
        }
        if code == ResponseError::OffsetOutOfRange.code() {
            // Below the leader's log start (retention, DeleteRecords) or no
            // epoch in common: start again where the leader's log starts.
            tracing::info!(topic = %p.topic, partition = p.index, fetch_offset, leader_log_start = pd.log_start_offset, "fetch offset out of range on the leader; restarting the local log at its log start");
            return match p.restart_at(pd.log_start_offset.max(0)) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(topic = %p.topic, partition = p.index, error = %e, "cannot restart the local log");
                    false
                }
            };
        }
        // NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, UNKNOWN_TOPIC_*:
        // one of us has an older image; the next image re-assigns.
        tracing::debug!(topic = %p.topic, partition = p.index, leader = f.leader, leader_epoch = f.leader_epoch, code, "leader refused the replica fetch");
        false
    }
}
