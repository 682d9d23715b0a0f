//! The group coordinator: classic consumer-group membership (join, sync,
//! heartbeat, leave, static members) and committed offsets, stored in the
//! compacted internal topic `__consumer_offsets`.
//!
//! One shard per `__consumer_offsets` partition. A shard is a task that owns
//! the groups whose id hashes to its partition (as Kafka chooses it) and is
//! the only writer of that partition: requests arrive on a bounded channel,
//! are applied to the in-memory state machine in order, and are answered
//! after the records that make them durable are appended. At start-up each
//! shard rebuilds its groups and offsets from its partition before serving;
//! until then requests get COORDINATOR_LOAD_IN_PROGRESS.
//!
//! In a cluster, `__consumer_offsets` is a topic of the metadata image whose
//! partitions the controller spreads over the brokers; each broker runs the
//! shards of the partitions it hosts ([`GroupCoordinator::host`], called as
//! images are applied) and answers NOT_COORDINATOR for the others.

pub mod records;
mod shard;
mod state;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use tokio::sync::{mpsc, oneshot, watch};

use crate::shard::ShardHandle;

use crate::config::GroupSettings;
use crate::replica::{ReplicaManager, TopicError};
pub use shard::Command;

pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// Requests queued per shard before callers wait: the bound on coordinator work in flight.
const SHARD_QUEUE_MAX: usize = 1024;

#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub group_id: String,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a new dynamic member first gets MEMBER_ID_REQUIRED (KIP-394).
    pub require_known_member_id: bool,
    /// JoinGroup v9+: a rejoining static leader can be told to skip assignment (KIP-814).
    pub supports_skip_assignment: bool,
}

#[derive(Debug, Clone, Default)]
pub struct JoinMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub metadata: Bytes,
}

#[derive(Debug, Clone, Default)]
pub struct JoinResponse {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    pub members: Vec<JoinMember>,
    pub skip_assignment: bool,
}

impl JoinResponse {
    pub fn error(code: i16, member_id: &str) -> Self {
        JoinResponse { error: code, generation: -1, member_id: member_id.to_string(), ..Default::default() }
    }
}

#[derive(Debug, Clone)]
pub struct SyncRequest {
    pub group_id: String,
    pub generation: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignments: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone, Default)]
pub struct SyncResponse {
    pub error: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncResponse {
    pub fn error(code: i16) -> Self {
        SyncResponse { error: code, ..Default::default() }
    }
}

#[derive(Debug, Clone)]
pub struct HeartbeatRequest {
    pub group_id: String,
    pub generation: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct LeaveRequest {
    pub group_id: String,
    /// (member id, group instance id)
    pub members: Vec<(String, Option<String>)>,
}

#[derive(Debug, Clone, Default)]
pub struct LeaveResponse {
    pub error: i16,
    /// (member id, group instance id, error)
    pub members: Vec<(String, Option<String>, i16)>,
}

#[derive(Debug, Clone)]
pub struct OffsetToCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

#[derive(Debug, Clone)]
pub struct CommitRequest {
    pub group_id: String,
    pub generation: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub offsets: Vec<OffsetToCommit>,
}

/// TxnOffsetCommit: offsets committed inside a producer's transaction (KIP-98,
/// with the KIP-447 generation/member checks).
#[derive(Debug, Clone)]
pub struct TxnCommitRequest {
    pub group_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub generation: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub offsets: Vec<OffsetToCommit>,
}

#[derive(Debug, Clone)]
pub struct CommittedOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub error: i16,
}

#[derive(Debug, Clone, Default)]
pub struct DescribedMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

#[derive(Debug, Clone, Default)]
pub struct DescribedGroup {
    pub error: i16,
    pub group_id: String,
    pub state: String,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<DescribedMember>,
}

#[derive(Debug, Clone)]
pub struct ListedGroup {
    pub group_id: String,
    pub protocol_type: String,
    pub state: String,
}

/// Routes group requests to the shard that owns the group.
pub struct GroupCoordinator {
    /// One slot per `__consumer_offsets` partition: the shard where this
    /// broker coordinates that partition's groups. Empty until the topic
    /// exists (in a cluster, until it is created on first use).
    shards: RwLock<Vec<Option<ShardHandle<Command>>>>,
    /// Partitions the image says this broker now leads, shards not yet started.
    incoming: RwLock<crate::shard::Incoming>,
    replicas: Arc<ReplicaManager>,
    settings: GroupSettings,
    shutdown: watch::Receiver<bool>,
}

fn not_available() -> i16 {
    ResponseError::CoordinatorNotAvailable.code()
}

impl GroupCoordinator {
    /// Creates `__consumer_offsets` if needed and starts one shard per partition;
    /// each loads its groups in the background.
    pub fn start(
        replicas: Arc<ReplicaManager>,
        settings: GroupSettings,
        shutdown: watch::Receiver<bool>,
    ) -> Result<GroupCoordinator, TopicError> {
        let topic = match replicas.topic(OFFSETS_TOPIC) {
            Some(t) => t,
            None => {
                let mut configs = std::collections::BTreeMap::new();
                configs.insert("cleanup.policy".to_string(), "compact".to_string());
                configs.insert("segment.bytes".to_string(), settings.offsets_topic_segment_bytes.to_string());
                replicas.create_topic(OFFSETS_TOPIC, settings.offsets_topic_num_partitions, 1, configs, false)?
            }
        };
        let coordinator = GroupCoordinator::empty(replicas, settings, shutdown);
        coordinator.host(&topic.partitions, topic.partition_count);
        Ok(coordinator)
    }

    /// A coordinator with no shards yet (a cluster node before
    /// `__consumer_offsets` exists): requests get COORDINATOR_NOT_AVAILABLE.
    pub fn empty(
        replicas: Arc<ReplicaManager>,
        settings: GroupSettings,
        shutdown: watch::Receiver<bool>,
    ) -> GroupCoordinator {
        GroupCoordinator {
            shards: RwLock::new(Vec::new()),
            incoming: RwLock::new(Default::default()),
            replicas,
            settings,
            shutdown,
        }
    }

    /// Runs the shards of `hosted` (partitions of a `partition_count`-partition
    /// `__consumer_offsets`) and stops those of partitions no longer hosted.
    /// A shard already running for a partition keeps running while its
    /// leadership lasts; a new leader epoch reloads the partition.
    pub fn host(&self, hosted: &[Arc<crate::replica::Partition>], partition_count: i32) {
        let mut shards = self.shards.write().unwrap_or_else(|e| e.into_inner());
        shards.resize_with(partition_count.max(0) as usize, || None);
        let wanted: std::collections::HashSet<i32> = hosted.iter().map(|p| p.index).collect();
        for (i, slot) in shards.iter_mut().enumerate() {
            if slot.is_some() && !wanted.contains(&(i as i32)) {
                // Dropping the sender ends the shard's task once its queue drains.
                *slot = None;
                tracing::info!(partition = i, "group coordinator shard unloaded");
            }
        }
        for partition in hosted {
            let Some(slot) = shards.get_mut(partition.index as usize) else { continue };
            if slot.as_ref().is_some_and(|s| s.serves(partition)) {
                continue;
            }
            let (tx, rx) = mpsc::channel(SHARD_QUEUE_MAX);
            let loaded = Arc::new(AtomicBool::new(false));
            let shard =
                shard::Shard::new(partition.clone(), self.replicas.clone(), self.settings.clone(), loaded.clone());
            tokio::spawn(shard.run(rx, self.shutdown.clone()));
            *slot = Some(ShardHandle::new(tx, loaded, partition.clone()));
        }
    }

    /// The shard for `group_id`, or the error [`crate::shard::pick`] gives.
    fn shard(&self, group_id: &str) -> Result<ShardHandle<Command>, i16> {
        let shards = self.shards.read().unwrap_or_else(|e| e.into_inner());
        let incoming = self.incoming.read().unwrap_or_else(|e| e.into_inner());
        crate::shard::pick(&shards, &incoming, group_id)
    }

    /// Notes the partitions (of a `partition_count`-partition topic) the
    /// newest image says this broker leads, before [`Self::host`] runs them.
    pub fn expect_leading(&self, partition_count: i32, partitions: std::collections::HashSet<i32>) {
        *self.incoming.write().unwrap_or_else(|e| e.into_inner()) =
            crate::shard::Incoming { partition_count, partitions };
    }

    /// Whether `__consumer_offsets` exists here (its partition count is known).
    pub fn is_available(&self) -> bool {
        !self.shards.read().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    fn hosted(&self) -> Vec<ShardHandle<Command>> {
        self.shards.read().unwrap_or_else(|e| e.into_inner()).iter().flatten().cloned().collect()
    }

    pub fn all_loaded(&self) -> bool {
        self.hosted().iter().all(|s| s.is_loaded())
    }

    /// The group's shard's answer once its records are committed
    /// ([`ShardHandle::ask`]), or the error code to answer instead.
    async fn ask<T>(&self, group_id: &str, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T, i16> {
        crate::shard::loaded(|| self.shard(group_id)).await?.ask(make).await
    }

    pub async fn join(&self, req: JoinRequest) -> JoinResponse {
        let member = req.member_id.clone();
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::Join(req, tx)).await.unwrap_or_else(|code| JoinResponse::error(code, &member))
    }

    pub async fn sync(&self, req: SyncRequest) -> SyncResponse {
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::Sync(req, tx)).await.unwrap_or_else(SyncResponse::error)
    }

    pub async fn heartbeat(&self, req: HeartbeatRequest) -> i16 {
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::Heartbeat(req, tx)).await.unwrap_or_else(|code| code)
    }

    pub async fn leave(&self, req: LeaveRequest) -> LeaveResponse {
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::Leave(req, tx))
            .await
            .unwrap_or_else(|code| LeaveResponse { error: code, members: Vec::new() })
    }

    /// Returns one error code per offset, in request order.
    pub async fn commit(&self, req: CommitRequest) -> Vec<i16> {
        let n = req.offsets.len();
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::Commit(req, tx)).await.unwrap_or_else(|code| vec![code; n])
    }

    /// Committed offsets of `group_id` for `partitions` (all when `None`). With
    /// `require_stable`, partitions with offsets pending in an open transaction
    /// get UNSTABLE_OFFSET_COMMIT (KIP-447) so the consumer waits for the outcome.
    pub async fn fetch_offsets(
        &self,
        group_id: &str,
        partitions: Option<Vec<(String, Vec<i32>)>>,
        require_stable: bool,
    ) -> Result<Vec<CommittedOffset>, i16> {
        self.ask(group_id, |tx| Command::FetchOffsets(group_id.to_string(), partitions, require_stable, tx)).await?
    }

    /// The `__consumer_offsets` partition a group's offsets live in.
    pub fn partition_for(&self, group_id: &str) -> i32 {
        let count = self.shards.read().unwrap_or_else(|e| e.into_inner()).len();
        records::partition_for(group_id, count.max(1) as i32)
    }

    /// Writes offsets as part of producer `producer_id`'s transaction; one error per offset.
    pub async fn txn_commit(&self, req: TxnCommitRequest) -> Vec<i16> {
        let n = req.offsets.len();
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::TxnCommit(req, tx)).await.unwrap_or_else(|code| vec![code; n])
    }

    /// Writes the transaction marker to `__consumer_offsets` partition `partition`
    /// and makes the producer's pending offsets there visible (commit) or drops them.
    pub async fn complete_txn(&self, partition: i32, producer_id: i64, epoch: i16, commit: bool) -> Result<(), i16> {
        let shard = usize::try_from(partition)
            .ok()
            .and_then(|i| self.shards.read().unwrap_or_else(|e| e.into_inner()).get(i).cloned().flatten())
            .ok_or(not_available())?;
        shard.ask(|reply| Command::CompleteTxn { producer_id, epoch, commit, reply }).await?
    }

    pub async fn describe(&self, group_id: &str) -> DescribedGroup {
        self.ask(group_id, |tx| Command::Describe(group_id.to_string(), tx))
            .await
            .unwrap_or_else(|code| DescribedGroup { error: code, group_id: group_id.to_string(), ..Default::default() })
    }

    /// Every group of every loaded shard; the error is COORDINATOR_LOAD_IN_PROGRESS if any shard is loading.
    pub async fn list(&self) -> (i16, Vec<ListedGroup>) {
        crate::shard::list_all(&self.hosted(), Command::List).await
    }

    pub async fn delete_group(&self, group_id: &str) -> i16 {
        self.ask(group_id, |tx| Command::DeleteGroup(group_id.to_string(), tx)).await.unwrap_or_else(|code| code)
    }

    /// Deletes committed offsets; per-partition errors, or a group-level error.
    pub async fn delete_offsets(
        &self,
        group_id: &str,
        partitions: Vec<(String, Vec<i32>)>,
    ) -> Result<Vec<(String, i32, i16)>, i16> {
        self.ask(group_id, |tx| Command::DeleteOffsets(group_id.to_string(), partitions, tx)).await?
    }
}
