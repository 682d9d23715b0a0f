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

pub mod records;
mod shard;

use std::collections::{HashMap, HashSet};
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
pub async fn write_marker(
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
    match target.append(&batch, AppendOrigin::Coordinator, now) {
        Ok(_) | Err(crate::replica::PartitionError::Gone) => Ok(()),
        Err(e) => {
            tracing::error!(topic, partition, error = %e, "transaction marker failed");
            Err(crate::api::error::partition_code(&e))
        }
    }
}

pub struct TxnCoordinator {
    shards: Vec<ShardHandle<Command>>,
    pub open: Arc<OpenTransactions>,
    pub settings: TxnSettings,
}

fn not_available() -> i16 {
    ResponseError::CoordinatorNotAvailable.code()
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
        let open = Arc::new(OpenTransactions::default());
        let shards = topic
            .partitions
            .iter()
            .map(|partition| {
                let (tx, rx) = mpsc::channel(SHARD_QUEUE_MAX);
                let loaded = Arc::new(AtomicBool::new(false));
                let shard = shard::Shard::new(
                    partition.clone(),
                    replicas.clone(),
                    groups.clone(),
                    open.clone(),
                    settings.clone(),
                    loaded.clone(),
                );
                tokio::spawn(shard.run(rx, shutdown.clone()));
                ShardHandle { tx, loaded }
            })
            .collect();
        Ok(TxnCoordinator { shards, open, settings })
    }

    /// A coordinator with no shards: every request gets
    /// COORDINATOR_NOT_AVAILABLE. What a multi-node cluster runs until the
    /// coordinators are placed across its brokers.
    pub fn unavailable(settings: TxnSettings) -> TxnCoordinator {
        TxnCoordinator { shards: Vec::new(), open: Arc::new(OpenTransactions::default()), settings }
    }

    /// Whether this broker coordinates any transactions at all.
    pub fn is_available(&self) -> bool {
        !self.shards.is_empty()
    }

    fn shard(&self, transactional_id: &str) -> Option<&ShardHandle<Command>> {
        if self.shards.is_empty() {
            return None;
        }
        let p = crate::group::records::partition_for(transactional_id, self.shards.len() as i32);
        self.shards.get(p as usize)
    }

    pub fn all_loaded(&self) -> bool {
        self.shards.iter().all(|s| s.is_loaded())
    }

    async fn ask<T>(&self, id: &str, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, i16> {
        let shard = self.shard(id).ok_or_else(not_available)?;
        if !shard.is_loaded() {
            return Err(ResponseError::CoordinatorLoadInProgress.code());
        }
        let (tx, rx) = oneshot::channel();
        shard.tx.send(make(tx)).await.map_err(|_| not_available())?;
        rx.await.map_err(|_| not_available())
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
        crate::shard::list_all(&self.shards, Command::List).await
    }
}
