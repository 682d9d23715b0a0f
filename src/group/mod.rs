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

pub mod records;
mod shard;
mod state;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

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
    shards: Vec<ShardHandle<Command>>,
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
        let shards = topic
            .partitions
            .iter()
            .map(|partition| {
                let (tx, rx) = mpsc::channel(SHARD_QUEUE_MAX);
                let loaded = Arc::new(AtomicBool::new(false));
                let shard = shard::Shard::new(partition.clone(), replicas.clone(), settings.clone(), loaded.clone());
                tokio::spawn(shard.run(rx, shutdown.clone()));
                ShardHandle { tx, loaded }
            })
            .collect();
        Ok(GroupCoordinator { shards })
    }

    /// A coordinator with no shards: every request gets
    /// COORDINATOR_NOT_AVAILABLE. What a multi-node cluster runs until the
    /// coordinators are placed across its brokers.
    pub fn unavailable() -> GroupCoordinator {
        GroupCoordinator { shards: Vec::new() }
    }

    fn shard(&self, group_id: &str) -> Option<&ShardHandle<Command>> {
        if self.shards.is_empty() {
            return None;
        }
        let p = records::partition_for(group_id, self.shards.len() as i32);
        self.shards.get(p as usize)
    }

    /// COORDINATOR_LOAD_IN_PROGRESS while the group's shard is still loading.
    pub fn check_loaded(&self, group_id: &str) -> Result<(), i16> {
        match self.shard(group_id) {
            None => Err(not_available()),
            Some(s) if s.is_loaded() => Ok(()),
            Some(_) => Err(ResponseError::CoordinatorLoadInProgress.code()),
        }
    }

    /// Whether this broker coordinates any groups at all.
    pub fn is_available(&self) -> bool {
        !self.shards.is_empty()
    }

    pub fn all_loaded(&self) -> bool {
        self.shards.iter().all(|s| s.is_loaded())
    }

    async fn ask<T>(&self, group_id: &str, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.shard(group_id)?.tx.send(make(tx)).await.ok()?;
        rx.await.ok()
    }

    pub async fn join(&self, req: JoinRequest) -> JoinResponse {
        let member = req.member_id.clone();
        if let Err(code) = self.check_loaded(&req.group_id) {
            return JoinResponse::error(code, &member);
        }
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::Join(req, tx))
            .await
            .unwrap_or_else(|| JoinResponse::error(not_available(), &member))
    }

    pub async fn sync(&self, req: SyncRequest) -> SyncResponse {
        if let Err(code) = self.check_loaded(&req.group_id) {
            return SyncResponse::error(code);
        }
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::Sync(req, tx)).await.unwrap_or_else(|| SyncResponse::error(not_available()))
    }

    pub async fn heartbeat(&self, req: HeartbeatRequest) -> i16 {
        if let Err(code) = self.check_loaded(&req.group_id) {
            return code;
        }
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::Heartbeat(req, tx)).await.unwrap_or_else(not_available)
    }

    pub async fn leave(&self, req: LeaveRequest) -> LeaveResponse {
        if let Err(code) = self.check_loaded(&req.group_id) {
            return LeaveResponse { error: code, members: Vec::new() };
        }
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::Leave(req, tx))
            .await
            .unwrap_or_else(|| LeaveResponse { error: not_available(), members: Vec::new() })
    }

    /// Returns one error code per offset, in request order.
    pub async fn commit(&self, req: CommitRequest) -> Vec<i16> {
        let n = req.offsets.len();
        if let Err(code) = self.check_loaded(&req.group_id) {
            return vec![code; n];
        }
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::Commit(req, tx)).await.unwrap_or_else(|| vec![not_available(); n])
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
        self.check_loaded(group_id)?;
        self.ask(group_id, |tx| Command::FetchOffsets(group_id.to_string(), partitions, require_stable, tx))
            .await
            .unwrap_or_else(|| Err(not_available()))
    }

    /// The `__consumer_offsets` partition a group's offsets live in.
    pub fn partition_for(&self, group_id: &str) -> i32 {
        records::partition_for(group_id, self.shards.len().max(1) as i32)
    }

    /// Writes offsets as part of producer `producer_id`'s transaction; one error per offset.
    pub async fn txn_commit(&self, req: TxnCommitRequest) -> Vec<i16> {
        let n = req.offsets.len();
        if let Err(code) = self.check_loaded(&req.group_id) {
            return vec![code; n];
        }
        let group = req.group_id.clone();
        self.ask(&group, |tx| Command::TxnCommit(req, tx)).await.unwrap_or_else(|| vec![not_available(); n])
    }

    /// Writes the transaction marker to `__consumer_offsets` partition `partition`
    /// and makes the producer's pending offsets there visible (commit) or drops them.
    pub async fn complete_txn(&self, partition: i32, producer_id: i64, epoch: i16, commit: bool) -> Result<(), i16> {
        let shard = usize::try_from(partition).ok().and_then(|i| self.shards.get(i)).ok_or(not_available())?;
        let (tx, rx) = oneshot::channel();
        shard
            .tx
            .send(Command::CompleteTxn { producer_id, epoch, commit, reply: tx })
            .await
            .map_err(|_| not_available())?;
        rx.await.map_err(|_| not_available())?
    }

    pub async fn describe(&self, group_id: &str) -> DescribedGroup {
        if let Err(code) = self.check_loaded(group_id) {
            return DescribedGroup { error: code, group_id: group_id.to_string(), ..Default::default() };
        }
        self.ask(group_id, |tx| Command::Describe(group_id.to_string(), tx)).await.unwrap_or_else(|| DescribedGroup {
            error: not_available(),
            group_id: group_id.to_string(),
            ..Default::default()
        })
    }

    /// Every group of every loaded shard; the error is COORDINATOR_LOAD_IN_PROGRESS if any shard is loading.
    pub async fn list(&self) -> (i16, Vec<ListedGroup>) {
        crate::shard::list_all(&self.shards, Command::List).await
    }

    pub async fn delete_group(&self, group_id: &str) -> i16 {
        if let Err(code) = self.check_loaded(group_id) {
            return code;
        }
        self.ask(group_id, |tx| Command::DeleteGroup(group_id.to_string(), tx)).await.unwrap_or_else(not_available)
    }

    /// Deletes committed offsets; per-partition errors, or a group-level error.
    pub async fn delete_offsets(
        &self,
        group_id: &str,
        partitions: Vec<(String, Vec<i32>)>,
    ) -> Result<Vec<(String, i32, i16)>, i16> {
        self.check_loaded(group_id)?;
        self.ask(group_id, |tx| Command::DeleteOffsets(group_id.to_string(), partitions, tx))
            .await
            .unwrap_or_else(|| Err(not_available()))
    }
}
