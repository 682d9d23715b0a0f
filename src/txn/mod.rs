//! The transaction coordinator (KIP-98, KIP-447, KIP-890 part 1).
//!
//! Like the group coordinator, one shard task per `__transaction_state`
//! partition owns the transactional ids that hash to it. Every state change is
//! written to that partition before it is acted on; at start-up a shard
//! replays its partition and finishes any transaction that was preparing to
//! commit or abort when the broker stopped. Markers are written to the data
//! partitions directly (a single node is the leader of all of them) and to
//! `__consumer_offsets` through the group coordinator, which then makes the
//! transaction's offsets visible or drops them.
//!
//! In a cluster, `__transaction_state` is a topic of the metadata image
//! spread over the brokers; each broker runs the shards of the partitions it
//! hosts ([`TxnCoordinator::host`]) and answers NOT_COORDINATOR for the
//! others. Markers for partitions led elsewhere go to their leader as
//! WriteTxnMarkers ([`MarkerWriter`]), at the coordinator epoch of the
//! shard's partition (its leader epoch), and partitions led elsewhere verify
//! transactional batches with the coordinator by AddPartitionsToTxn
//! verify-only.

pub mod records;
mod shard;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use strand_storage::AppendOrigin;

use kafka_protocol::error::ResponseError;
use tokio::sync::{mpsc, oneshot, watch};

use crate::shard::ShardHandle;

use crate::group::GroupCoordinator;
use crate::replica::{ReplicaManager, TopicError};
pub use shard::Command;

pub const TXN_TOPIC: &str = "__transaction_state";
const SHARD_QUEUE_MAX: usize = 1024;

/// Transaction coordinator settings, with Kafka's keys and defaults.
#[derive(Debug, Clone)]
pub struct TxnSettings {
    /// `transaction.state.log.num.partitions`.
    pub num_partitions: i32,
    /// `transaction.state.log.segment.bytes`.
    pub segment_bytes: u64,
    /// `transaction.state.log.replication.factor` in a cluster, at most the
    /// brokers registered when the topic is created.
    pub replication_factor: i16,
    /// `transaction.state.log.min.isr`: the topic's `min.insync.replicas`.
    pub min_isr: i32,
    /// `transaction.max.timeout.ms`: larger client timeouts are refused.
    pub max_timeout_ms: i32,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`.
    pub abort_check_interval_ms: u64,
    /// `transactional.id.expiration.ms`: idle transactional ids are forgotten.
    pub id_expiration_ms: i64,
}

impl Default for TxnSettings {
    fn default() -> Self {
        TxnSettings {
            num_partitions: 50,
            segment_bytes: 104_857_600,
            replication_factor: 3,
            min_isr: 2,
            max_timeout_ms: 900_000,
            abort_check_interval_ms: 10_000,
            id_expiration_ms: 7 * 24 * 3600 * 1000,
        }
    }
}

/// The partitions each producer has added to its open transaction, shared
/// with the produce path, which refuses a transactional batch for a partition
/// that was not added (KIP-890 part 1).
/// A producer's epoch and the (topic, partition)s in its open transaction.
type OpenTxn = (i16, HashSet<(String, i32)>);

#[derive(Debug, Default)]
pub struct OpenTransactions {
    by_producer: RwLock<HashMap<i64, OpenTxn>>,
}

impl OpenTransactions {
    pub fn set(&self, producer_id: i64, epoch: i16, partitions: HashSet<(String, i32)>) {
        self.by_producer.write().unwrap_or_else(|e| e.into_inner()).insert(producer_id, (epoch, partitions));
    }

    /// The transaction ended (or the producer was fenced at `epoch`): no partition is
    /// open, but the epoch is remembered so a zombie's late batch is told it is fenced.
    pub fn close(&self, producer_id: i64, epoch: i16) {
        self.by_producer.write().unwrap_or_else(|e| e.into_inner()).insert(producer_id, (epoch, HashSet::new()));
    }

    /// Forgets a producer (its transactional id expired).
    pub fn forget(&self, producer_id: i64) {
        self.by_producer.write().unwrap_or_else(|e| e.into_inner()).remove(&producer_id);
    }

    /// Ok if `producer_id` at `epoch` has `topic`/`partition` in its open transaction.
    pub fn verify(&self, producer_id: i64, epoch: i16, topic: &str, partition: i32) -> Result<(), i16> {
        let map = self.by_producer.read().unwrap_or_else(|e| e.into_inner());
        match map.get(&producer_id) {
            Some((e, _)) if epoch < *e => Err(ResponseError::InvalidProducerEpoch.code()),
            Some((e, parts)) if epoch == *e && parts.contains(&(topic.to_string(), partition)) => Ok(()),
            _ => Err(ResponseError::InvalidTxnState.code()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct DescribedTxn {
    pub error: i16,
    pub transactional_id: String,
    pub state: String,
    pub timeout_ms: i32,
    pub start_ms: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub partitions: Vec<(String, Vec<i32>)>,
}

#[derive(Debug, Clone)]
pub struct ListedTxn {
    pub transactional_id: String,
    pub producer_id: i64,
    pub state: String,
    pub start_ms: i64,
}

/// Writes one COMMIT/ABORT marker for `producer_id` to `topic`/`partition`.
/// `__consumer_offsets` partitions go through the group coordinator, which
/// owns them and applies or drops the transaction's offsets. A partition that
/// no longer exists has nothing to mark. Used by the coordinator's second
/// phase and by WriteTxnMarkers.
pub async fn write_local_marker(
    replicas: &ReplicaManager,
    groups: &GroupCoordinator,
    marker: (&str, i32),
    producer_id: i64,
    epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
) -> Result<(), i16> {
    let (topic, partition) = marker;
    if topic == crate::group::OFFSETS_TOPIC {
        return groups.complete_txn(partition, producer_id, epoch, commit).await;
    }
    let Some(target) = replicas.topic(topic).and_then(|t| t.partition(partition).cloned()) else {
        return Ok(());
    };
    let now = crate::util::now_ms();
    let batch = strand_storage::batch::build_control_batch(producer_id, epoch, commit, coordinator_epoch, now);
    // Kafka writes markers with acks=all: the transaction completes only
    // once every partition's in-sync replicas hold its marker, so a new
    // leader never lacks one and no partition's LSO stays behind it.
    let written = match target.append_at_epoch(&batch, AppendOrigin::Coordinator, now) {
        Ok((info, leader_epoch)) => {
            let deadline = tokio::time::Instant::now() + crate::shard::REPLICATION_TIMEOUT;
            target.wait_replicated(info.last_offset, leader_epoch, deadline).await
        }
        Err(e) => Err(e),
    };
    match written {
        Ok(()) | Err(crate::replica::PartitionError::Gone) => Ok(()),
        Err(e) => {
            tracing::error!(topic, partition, error = %e, "transaction marker failed");
            Err(crate::api::error::partition_code(&e))
        }
    }
}

/// Writes transaction markers wherever the partitions are: this broker's
/// logs (and group coordinator), or in a cluster the partition's leader.
#[derive(Clone)]
pub struct MarkerWriter {
    pub replicas: Arc<ReplicaManager>,
    pub groups: Arc<GroupCoordinator>,
    pub cluster: Option<Arc<crate::cluster::ClusterNode>>,
}

/// How long a marker waits for its partition's leader (a fenced broker
/// leaves its partitions without one until it returns).
const MARKER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Partitions a transaction's markers could not be written to, each with
/// the Kafka error code of the last try.
pub type Unmarked = Vec<((String, i32), i16)>;

impl MarkerWriter {
    /// A producer id never handed out before: from the cluster's blocks in a
    /// cluster, this broker's own otherwise.
    pub async fn allocate_producer_id(&self) -> Result<i64, String> {
        match &self.cluster {
            Some(c) => c.allocate_producer_id().await.map_err(|e| e.to_string()),
            None => self.replicas.allocate_producer_id().map_err(|e| e.to_string()),
        }
    }

    /// Writes the COMMIT/ABORT markers of one transaction to all its
    /// `partitions`: the ones led here directly, the others as one
    /// WriteTxnMarkers request per leading broker, all brokers at once.
    /// Partitions that move or have no leader are retried until
    /// [`MARKER_DEADLINE`]; a marker is never reported done unwritten.
    /// Returns the partitions that could not be marked, with why.
    pub async fn write_all(
        &self,
        partitions: &[(String, i32)],
        producer_id: i64,
        epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
    ) -> Result<(), Unmarked> {
        let mut failed = Vec::new();
        let local = |tp: &(String, i32)| {
            let tp = tp.clone();
            async move {
                let r = write_local_marker(
                    &self.replicas,
                    &self.groups,
                    (&tp.0, tp.1),
                    producer_id,
                    epoch,
                    commit,
                    coordinator_epoch,
                )
                .await;
                (tp, r)
            }
        };
        let Some(cluster) = &self.cluster else {
            for tp in partitions {
                if let (tp, Err(code)) = local(tp).await {
                    failed.push((tp, code));
                }
            }
            return if failed.is_empty() { Ok(()) } else { Err(failed) };
        };
        let deadline = tokio::time::Instant::now() + MARKER_DEADLINE;
        let mut pending = partitions.to_vec();
        loop {
            let mut images = cluster.image_watch();
            let mut by_leader: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
            let mut retry = Vec::new();
            for tp in pending.drain(..) {
                match cluster.leadership(&tp.0, tp.1) {
                    crate::cluster::Leadership::Here { .. } => match local(&tp).await {
                        (tp, Err(code)) if marker_retriable(code) => retry.push(tp),
                        (tp, Err(code)) => failed.push((tp, code)),
                        (_, Ok(())) => {}
                    },
                    // Deleted: nothing to mark, as on a single node.
                    crate::cluster::Leadership::Unknown => {}
                    crate::cluster::Leadership::Elsewhere { leader, .. } if leader >= 0 => {
                        by_leader.entry(leader).or_default().push(tp)
                    }
                    crate::cluster::Leadership::Elsewhere { .. } => retry.push(tp),
                }
            }
            let sends = by_leader.into_iter().map(|(leader, tps)| async move {
                let sent = send_markers(cluster, leader, &tps, producer_id, epoch, commit, coordinator_epoch).await;
                (leader, tps, sent)
            });
            for (leader, tps, sent) in futures_util::future::join_all(sends).await {
                match sent {
                    Ok(codes) => {
                        for (tp, code) in tps.into_iter().zip(codes) {
                            match code {
                                0 => {}
                                c if marker_retriable(c) => retry.push(tp),
                                c => failed.push((tp, c)),
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(leader, partitions = tps.len(), error = %e, "transaction markers not delivered; retrying");
                        retry.extend(tps);
                    }
                }
            }
            if retry.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::error!(partitions = ?retry, "transaction markers: no leader took them in time");
                failed.extend(retry.into_iter().map(|tp| (tp, ResponseError::CoordinatorNotAvailable.code())));
                break;
            }
            pending = retry;
            // Wait for partitions to move, or a short while.
            let _ = tokio::time::timeout(std::time::Duration::from_millis(200), images.changed()).await;
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed)
        }
    }
}

/// Marker failures worth another try before [`MARKER_DEADLINE`]: the
/// partition moved, its leader (or group coordinator) has not loaded it yet, or its in-sync
/// replicas did not take the marker in time (it may be written twice then,
/// which is harmless: a marker with no open transaction closes nothing).
fn marker_retriable(code: i16) -> bool {
    [
        ResponseError::NotLeaderOrFollower,
        ResponseError::UnknownTopicOrPartition,
        ResponseError::NotEnoughReplicas,
        ResponseError::NotEnoughReplicasAfterAppend,
        ResponseError::RequestTimedOut,
        // `__consumer_offsets` partitions, marked through their coordinator.
        ResponseError::NotCoordinator,
        ResponseError::CoordinatorNotAvailable,
        ResponseError::CoordinatorLoadInProgress,
    ]
    .iter()
    .any(|e| e.code() == code)
}

/// One transaction's markers for the partitions `leader` leads, as one
/// WriteTxnMarkers request: an error code per partition, in `partitions`'
/// order.
async fn send_markers(
    cluster: &crate::cluster::ClusterNode,
    leader: i32,
    partitions: &[(String, i32)],
    producer_id: i64,
    epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
) -> Result<Vec<i16>, crate::cluster::peers::PeerError> {
    use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
    use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (topic, partition) in partitions {
        topics.entry(topic).or_default().push(*partition);
    }
    let req = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(epoch)
        .with_transaction_result(commit)
        .with_coordinator_epoch(coordinator_epoch)
        .with_topics(
            topics
                .into_iter()
                .map(|(name, indexes)| {
                    WritableTxnMarkerTopic::default()
                        .with_name(TopicName(kafka_protocol::protocol::StrBytes::from_string(name.to_string())))
                        .with_partition_indexes(indexes)
                })
                .collect(),
        )]);
    let resp = cluster.peers().call(&cluster.image(), leader, &req, 1).await?;
    let code_of = |topic: &str, partition: i32| {
        resp.markers
            .iter()
            .flat_map(|m| m.topics.iter())
            .filter(|t| t.name.as_str() == topic)
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .map_or(ResponseError::UnknownServerError.code(), |p| p.error_code)
    };
    Ok(partitions.iter().map(|(t, p)| code_of(t, *p)).collect())
}

pub struct TxnCoordinator {
    /// One slot per `__transaction_state` partition: the shard where this
    /// broker coordinates it. Empty until the topic exists.
    shards: RwLock<Vec<Option<ShardHandle<Command>>>>,
    /// Partitions the image says this broker now leads, shards not yet started.
    incoming: RwLock<crate::shard::Incoming>,
    pub open: Arc<OpenTransactions>,
    pub settings: TxnSettings,
    markers: MarkerWriter,
    shutdown: watch::Receiver<bool>,
}

impl TxnCoordinator {
    /// Creates `__transaction_state` if needed and starts one shard per partition.
    pub fn start(
        replicas: Arc<ReplicaManager>,
        groups: Arc<GroupCoordinator>,
        settings: TxnSettings,
        shutdown: watch::Receiver<bool>,
    ) -> Result<TxnCoordinator, TopicError> {
        let topic = match replicas.topic(TXN_TOPIC) {
            Some(t) => t,
            None => {
                let mut configs = std::collections::BTreeMap::new();
                configs.insert("cleanup.policy".to_string(), "compact".to_string());
                configs.insert("segment.bytes".to_string(), settings.segment_bytes.to_string());
                replicas.create_topic(TXN_TOPIC, settings.num_partitions, 1, configs, false)?
            }
        };
        let coordinator = TxnCoordinator::empty(
            MarkerWriter { replicas: replicas.clone(), groups, cluster: None },
            settings,
            shutdown,
        );
        coordinator.host(&topic.partitions, topic.partition_count);
        Ok(coordinator)
    }

    /// A coordinator with no shards yet (a cluster node before
    /// `__transaction_state` exists): requests get COORDINATOR_NOT_AVAILABLE.
    pub fn empty(markers: MarkerWriter, settings: TxnSettings, shutdown: watch::Receiver<bool>) -> TxnCoordinator {
        TxnCoordinator {
            shards: RwLock::new(Vec::new()),
            incoming: RwLock::new(Default::default()),
            open: Arc::new(OpenTransactions::default()),
            settings,
            markers,
            shutdown,
        }
    }

    /// Runs the shards of `hosted` (partitions of a `partition_count`-partition
    /// `__transaction_state`) and stops those of partitions no longer hosted.
    pub fn host(&self, hosted: &[Arc<crate::replica::Partition>], partition_count: i32) {
        let mut shards = self.shards.write().unwrap_or_else(|e| e.into_inner());
        shards.resize_with(partition_count.max(0) as usize, || None);
        let wanted: HashSet<i32> = hosted.iter().map(|p| p.index).collect();
        for (i, slot) in shards.iter_mut().enumerate() {
            if slot.is_some() && !wanted.contains(&(i as i32)) {
                *slot = None;
                tracing::info!(partition = i, "transaction coordinator shard unloaded");
            }
        }
        for partition in hosted {
            let Some(slot) = shards.get_mut(partition.index as usize) else { continue };
            if slot.as_ref().is_some_and(|s| s.serves(partition)) {
                continue;
            }
            let (tx, rx) = mpsc::channel(SHARD_QUEUE_MAX);
            let loaded = Arc::new(AtomicBool::new(false));
            let shard = shard::Shard::new(
                partition.clone(),
                self.markers.clone(),
                self.open.clone(),
                self.settings.clone(),
                loaded.clone(),
            );
            tokio::spawn(shard.run(rx, self.shutdown.clone()));
            *slot = Some(ShardHandle::new(tx, loaded, partition.clone()));
        }
    }

    /// Whether `__transaction_state` exists here (its partition count is known).
    pub fn is_available(&self) -> bool {
        !self.shards.read().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// The shard for `transactional_id`, or the error [`crate::shard::pick`] gives.
    fn shard(&self, transactional_id: &str) -> Result<ShardHandle<Command>, i16> {
        let shards = self.shards.read().unwrap_or_else(|e| e.into_inner());
        let incoming = self.incoming.read().unwrap_or_else(|e| e.into_inner());
        crate::shard::pick(&shards, &incoming, transactional_id)
    }

    /// Notes the partitions (of a `partition_count`-partition topic) the
    /// newest image says this broker leads, before [`Self::host`] runs them.
    pub fn expect_leading(&self, partition_count: i32, partitions: std::collections::HashSet<i32>) {
        *self.incoming.write().unwrap_or_else(|e| e.into_inner()) =
            crate::shard::Incoming { partition_count, partitions };
    }

    /// Whether this broker coordinates `transactional_id`.
    pub fn coordinates(&self, transactional_id: &str) -> bool {
        self.shard(transactional_id).is_ok()
    }

    fn hosted(&self) -> Vec<ShardHandle<Command>> {
        self.shards.read().unwrap_or_else(|e| e.into_inner()).iter().flatten().cloned().collect()
    }

    pub fn all_loaded(&self) -> bool {
        self.hosted().iter().all(|s| s.is_loaded())
    }

    pub fn markers(&self) -> &MarkerWriter {
        &self.markers
    }

    async fn ask<T>(&self, id: &str, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, i16> {
        crate::shard::loaded(|| self.shard(id)).await?.ask(make).await
    }

    /// InitProducerId with a transactional id: (error, producer id, epoch).
    pub async fn init_producer_id(&self, id: &str, timeout_ms: i32, producer_id: i64, epoch: i16) -> (i16, i64, i16) {
        match self
            .ask(id, |tx| Command::InitProducerId { id: id.to_string(), timeout_ms, producer_id, epoch, reply: tx })
            .await
        {
            Ok(r) => r,
            Err(code) => (code, -1, -1),
        }
    }

    /// AddPartitionsToTxn (or its verify-only form): per-partition errors.
    pub async fn add_partitions(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: Vec<(String, Vec<i32>)>,
        verify_only: bool,
    ) -> Vec<(String, i32, i16)> {
        let all: Vec<(String, i32)> =
            partitions.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p))).collect();
        let reply = self
            .ask(id, |tx| Command::AddPartitions {
                id: id.to_string(),
                producer_id,
                epoch,
                partitions: all.clone(),
                verify_only,
                reply: tx,
            })
            .await;
        match reply {
            Ok(r) => r,
            Err(code) => all.into_iter().map(|(t, p)| (t, p, code)).collect(),
        }
    }

    pub async fn end_txn(&self, id: &str, producer_id: i64, epoch: i16, commit: bool) -> i16 {
        self.ask(id, |tx| Command::EndTxn { id: id.to_string(), producer_id, epoch, commit, reply: tx })
            .await
            .unwrap_or_else(|code| code)
    }

    pub async fn describe(&self, id: &str) -> DescribedTxn {
        match self.ask(id, |tx| Command::Describe(id.to_string(), tx)).await {
            Ok(d) => d,
            Err(code) => DescribedTxn {
                error: code,
                transactional_id: id.to_string(),
                state: String::new(),
                timeout_ms: 0,
                start_ms: -1,
                producer_id: -1,
                producer_epoch: -1,
                partitions: Vec::new(),
            },
        }
    }

    /// Every transaction of every loaded shard; COORDINATOR_LOAD_IN_PROGRESS if any is loading.
    pub async fn list(&self) -> (i16, Vec<ListedTxn>) {
        crate::shard::list_all(&self.hosted(), Command::List).await
    }
}
