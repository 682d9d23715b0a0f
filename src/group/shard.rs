//! One coordinator shard: the groups of one `__consumer_offsets` partition,
//! owned by a single task.
//!
//! Every state change that must survive a restart (a generation's assignment,
//! a group becoming empty, committed or deleted offsets) is appended to the
//! partition before the requester is answered. Deadlines (sessions, rebalance
//! and sync timeouts, pending member ids) are kept in a heap of wake-ups that
//! is checked lazily: a wake-up only re-examines its group.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use strand_storage::batch;
use strand_storage::AppendOrigin;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::records::{self, GroupValue, MemberValue, OffsetValue, RecordKey};
use super::state::{Group, GroupState, Member, OffsetEntry};
use super::*;
use crate::config::GroupSettings;
use crate::replica::{Partition, PartitionError, ReplicaManager};
use crate::util::now_ms;

/// Per-partition results of OffsetDelete: (topic, partition, error code).
pub type OffsetDeleteResults = Vec<(String, i32, i16)>;
/// Offsets to expire in one group, and whether the group goes with them.
type Expiry = (String, Vec<(String, i32)>, bool);

pub enum Command {
    Join(JoinRequest, oneshot::Sender<JoinResponse>),
    Sync(SyncRequest, oneshot::Sender<SyncResponse>),
    Heartbeat(HeartbeatRequest, oneshot::Sender<i16>),
    Leave(LeaveRequest, oneshot::Sender<LeaveResponse>),
    Commit(CommitRequest, oneshot::Sender<Vec<i16>>),
    FetchOffsets(String, Option<Vec<(String, Vec<i32>)>>, bool, oneshot::Sender<Result<Vec<CommittedOffset>, i16>>),
    TxnCommit(TxnCommitRequest, oneshot::Sender<Vec<i16>>),
    CompleteTxn { producer_id: i64, epoch: i16, commit: bool, reply: oneshot::Sender<Result<(), i16>> },
    Describe(String, oneshot::Sender<DescribedGroup>),
    List(oneshot::Sender<Vec<ListedGroup>>),
    DeleteGroup(String, oneshot::Sender<i16>),
    DeleteOffsets(String, Vec<(String, Vec<i32>)>, oneshot::Sender<Result<OffsetDeleteResults, i16>>),
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

pub struct Shard {
    partition: Arc<Partition>,
    replicas: Arc<ReplicaManager>,
    settings: GroupSettings,
    loaded: Arc<AtomicBool>,
    groups: HashMap<String, Group>,
    /// Offsets written inside open transactions, by producer id: visible on commit.
    pending_txn: HashMap<i64, HashMap<(String, String, i32), OffsetEntry>>,
    /// Wake-ups: (when, group id). Stale entries are harmless.
    timers: BinaryHeap<Reverse<(Instant, String)>>,
}

impl Shard {
    pub fn new(
        partition: Arc<Partition>,
        replicas: Arc<ReplicaManager>,
        settings: GroupSettings,
        loaded: Arc<AtomicBool>,
    ) -> Self {
        Shard {
            partition,
            replicas,
            settings,
            loaded,
            groups: HashMap::new(),
            pending_txn: HashMap::new(),
            timers: BinaryHeap::new(),
        }
    }

    pub async fn run(mut self, mut rx: mpsc::Receiver<Command>, mut shutdown: watch::Receiver<bool>) {
        let started = std::time::Instant::now();
        let partition = self.partition.clone();
        let loaded = tokio::task::spawn_blocking(move || load(&partition)).await;
        match loaded {
            Ok(Ok((groups, pending_txn, records))) => {
                self.pending_txn = pending_txn;
                let now = Instant::now();
                for (id, mut group) in groups {
                    // Loaded members have no live session yet: give them one to rejoin or heartbeat.
                    for m in group.members.values_mut() {
                        m.session_deadline = now + Duration::from_millis(m.session_timeout_ms.max(0) as u64);
                        self.timers.push(Reverse((m.session_deadline, id.clone())));
                    }
                    self.groups.insert(id, group);
                }
                if records > 0 {
                    tracing::info!(
                        partition = self.partition.index,
                        groups = self.groups.len(),
                        records,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "group coordinator shard loaded"
                    );
                }
            }
            Ok(Err(e)) => {
                // Serving with half the state would hand out wrong offsets; stay unloaded.
                tracing::error!(partition = self.partition.index, error = %e, "cannot load __consumer_offsets partition");
                return;
            }
            Err(e) => {
                tracing::error!(partition = self.partition.index, error = %e, "group load panicked");
                return;
            }
        }
        self.loaded.store(true, Ordering::Release);
        let retention_every = Duration::from_millis(self.settings.offsets_retention_check_interval_ms);
        let mut next_retention = Instant::now() + retention_every;
        loop {
            let next_timer =
                self.timers.peek().map(|Reverse((at, _))| *at).unwrap_or(next_retention).min(next_retention);
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => self.handle(cmd),
                    None => break,
                },
                _ = tokio::time::sleep_until(next_timer) => {}
                _ = crate::server::listener::wait_shutdown(&mut shutdown) => break,
            }
            let now = Instant::now();
            self.fire_timers(now);
            if now >= next_retention {
                self.expire_offsets();
                next_retention = now + retention_every;
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Join(req, reply) => self.join(req, reply),
            Command::Sync(req, reply) => self.sync(req, reply),
            Command::Heartbeat(req, reply) => {
                let _ = reply.send(self.heartbeat(req));
            }
            Command::Leave(req, reply) => {
                let _ = reply.send(self.leave(req));
            }
            Command::Commit(req, reply) => {
                let _ = reply.send(self.commit(req));
            }
            Command::FetchOffsets(group, partitions, require_stable, reply) => {
                let mut offsets = self.fetch_offsets(&group, partitions);
                if require_stable {
                    for o in &mut offsets {
                        let key = (group.clone(), o.topic.clone(), o.partition);
                        if self.pending_txn.values().any(|p| p.contains_key(&key)) {
                            o.error = code(ResponseError::UnstableOffsetCommit);
                        }
                    }
                }
                let _ = reply.send(Ok(offsets));
            }
            Command::TxnCommit(req, reply) => {
                let _ = reply.send(self.txn_commit(req));
            }
            Command::CompleteTxn { producer_id, epoch, commit, reply } => {
                let _ = reply.send(self.complete_txn(producer_id, epoch, commit));
            }
            Command::Describe(group, reply) => {
                let _ = reply.send(self.describe(&group));
            }
            Command::List(reply) => {
                let _ = reply.send(
                    self.groups
                        .values()
                        .filter(|g| g.state != GroupState::Dead)
                        .map(|g| ListedGroup {
                            group_id: g.id.clone(),
                            protocol_type: g.protocol_type.clone().unwrap_or_default(),
                            state: g.state.name().to_string(),
                        })
                        .collect(),
                );
            }
            Command::DeleteGroup(group, reply) => {
                let _ = reply.send(self.delete_group(&group));
            }
            Command::DeleteOffsets(group, partitions, reply) => {
                let _ = reply.send(self.delete_offsets(&group, partitions));
            }
        }
    }

    fn schedule(&mut self, group: &str, at: Instant) {
        self.timers.push(Reverse((at, group.to_string())));
    }

    // ---- JoinGroup -------------------------------------------------------

    fn join(&mut self, req: JoinRequest, reply: oneshot::Sender<JoinResponse>) {
        let fail = |code: i16| JoinResponse::error(code, &req.member_id);
        if req.group_id.is_empty() {
            let _ = reply.send(fail(code(ResponseError::InvalidGroupId)));
            return;
        }
        if req.session_timeout_ms < self.settings.min_session_timeout_ms
            || req.session_timeout_ms > self.settings.max_session_timeout_ms
        {
            let _ = reply.send(fail(code(ResponseError::InvalidSessionTimeout)));
            return;
        }
        if req.protocol_type.is_empty() || req.protocols.is_empty() {
            let _ = reply.send(fail(code(ResponseError::InconsistentGroupProtocol)));
            return;
        }
        if !self.groups.contains_key(&req.group_id) {
            if !req.member_id.is_empty() {
                let _ = reply.send(fail(code(ResponseError::UnknownMemberId)));
                return;
            }
            if self.groups.len() >= self.settings.max_count {
                let _ = reply.send(fail(code(ResponseError::CoordinatorNotAvailable)));
                return;
            }
            self.groups.insert(req.group_id.clone(), Group::new(&req.group_id, now_ms()));
        }
        let group = self.groups.get_mut(&req.group_id).expect("inserted above");
        if group.state == GroupState::Dead {
            let _ = reply.send(fail(code(ResponseError::CoordinatorNotAvailable)));
            return;
        }
        if !group.supports(&req.protocol_type, &req.protocols) {
            let _ = reply.send(fail(code(ResponseError::InconsistentGroupProtocol)));
            return;
        }
        if req.member_id.is_empty() {
            let new_id = format!("{}-{}", req.client_id, uuid::Uuid::new_v4());
            if let Some(instance) = req.group_instance_id.clone() {
                if let Some(old_id) = group.static_members.get(&instance).cloned() {
                    self.replace_static_member(req, old_id, new_id, reply);
                    return;
                }
                if group.members.len() >= self.settings.max_size {
                    let _ = reply.send(fail(code(ResponseError::GroupMaxSizeReached)));
                    return;
                }
                self.add_member_and_rebalance(req, new_id, reply);
                return;
            }
            if group.members.len() + group.pending_members.len() >= self.settings.max_size {
                let _ = reply.send(fail(code(ResponseError::GroupMaxSizeReached)));
                return;
            }
            if req.require_known_member_id {
                // KIP-394: hand out the id first so a retried join cannot leave a ghost member.
                let deadline = Instant::now() + Duration::from_millis(req.session_timeout_ms as u64);
                group.pending_members.insert(new_id.clone(), deadline);
                let gid = req.group_id.clone();
                self.schedule(&gid, deadline);
                let _ = reply.send(JoinResponse::error(code(ResponseError::MemberIdRequired), &new_id));
                return;
            }
            self.add_member_and_rebalance(req, new_id, reply);
            return;
        }
        // A known (or pending) member id.
        if let Some(instance) = &req.group_instance_id {
            if let Some(current) = group.static_members.get(instance) {
                if *current != req.member_id {
                    let _ = reply.send(fail(code(ResponseError::FencedInstanceId)));
                    return;
                }
            }
        }
        if group.pending_members.remove(&req.member_id).is_some() {
            let member_id = req.member_id.clone();
            self.add_member_and_rebalance(req, member_id, reply);
            return;
        }
        if !group.members.contains_key(&req.member_id) {
            let _ = reply.send(fail(code(ResponseError::UnknownMemberId)));
            return;
        }
        let member = &group.members[&req.member_id];
        let is_leader = group.leader.as_deref() == Some(req.member_id.as_str());
        let unchanged = member.matches(&req.protocols);
        match group.state {
            GroupState::PreparingRebalance => self.update_member_and_rebalance(req, reply),
            GroupState::CompletingRebalance if unchanged => {
                let resp = group.join_response_for(&req.member_id, false);
                let _ = reply.send(resp);
            }
            GroupState::Stable if unchanged && !is_leader => {
                let resp = group.join_response_for(&req.member_id, false);
                let _ = reply.send(resp);
            }
            GroupState::CompletingRebalance | GroupState::Stable => self.update_member_and_rebalance(req, reply),
            GroupState::Empty | GroupState::Dead => {
                let _ = reply.send(fail(code(ResponseError::UnknownMemberId)));
            }
        }
    }

    fn add_member_and_rebalance(&mut self, req: JoinRequest, member_id: String, reply: oneshot::Sender<JoinResponse>) {
        let group = self.groups.get_mut(&req.group_id).expect("caller checked");
        let member = Member {
            id: member_id.clone(),
            group_instance_id: req.group_instance_id.clone(),
            client_id: req.client_id,
            client_host: req.client_host,
            session_timeout_ms: req.session_timeout_ms,
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            protocols: req.protocols,
            assignment: Bytes::new(),
            join_waiter: Some(reply),
            sync_waiter: None,
            session_deadline: Instant::now() + Duration::from_millis(req.session_timeout_ms as u64),
        };
        if group.members.is_empty() {
            group.protocol_type = Some(req.protocol_type);
        }
        if group.leader.is_none() {
            group.leader = Some(member_id.clone());
        }
        if let Some(instance) = &member.group_instance_id {
            group.static_members.insert(instance.clone(), member_id.clone());
        }
        group.members.insert(member_id, member);
        // A new member during the initial delay extends it, up to the rebalance timeout.
        if group.state == GroupState::PreparingRebalance {
            if let (Some(not_before), Some(deadline)) = (group.join_not_before, group.rebalance_deadline) {
                let extended = (Instant::now()
                    + Duration::from_millis(self.settings.initial_rebalance_delay_ms as u64))
                .min(deadline);
                if extended > not_before {
                    group.join_not_before = Some(extended);
                }
            }
        }
        let gid = req.group_id;
        self.maybe_prepare_rebalance(&gid);
        self.try_complete_join(&gid);
    }

    fn update_member_and_rebalance(&mut self, req: JoinRequest, reply: oneshot::Sender<JoinResponse>) {
        let group = self.groups.get_mut(&req.group_id).expect("caller checked");
        let member = group.members.get_mut(&req.member_id).expect("caller checked");
        member.protocols = req.protocols;
        member.session_timeout_ms = req.session_timeout_ms;
        member.rebalance_timeout_ms = req.rebalance_timeout_ms;
        if let Some(old) = member.join_waiter.replace(reply) {
            // A member re-sending JoinGroup supersedes its earlier wait.
            let _ = old.send(JoinResponse::error(code(ResponseError::UnknownMemberId), &req.member_id));
        }
        let gid = req.group_id;
        self.maybe_prepare_rebalance(&gid);
        self.try_complete_join(&gid);
    }

    /// KIP-345: a static member rejoining with an empty member id takes over
    /// its old identity; in a stable group whose protocol stays the same it gets
    /// its old assignment back without a rebalance.
    fn replace_static_member(
        &mut self,
        req: JoinRequest,
        old_id: String,
        new_id: String,
        reply: oneshot::Sender<JoinResponse>,
    ) {
        let gid = req.group_id.clone();
        let group = self.groups.get_mut(&gid).expect("caller checked");
        let Some(mut member) = group.members.shift_remove(&old_id) else {
            group.static_members.remove(req.group_instance_id.as_deref().unwrap_or_default());
            self.add_member_and_rebalance(req, new_id, reply);
            return;
        };
        // Fence the old incarnation: anything it was waiting for is refused.
        if let Some(w) = member.join_waiter.take() {
            let _ = w.send(JoinResponse::error(code(ResponseError::FencedInstanceId), &old_id));
        }
        if let Some(w) = member.sync_waiter.take() {
            let _ = w.send(SyncResponse::error(code(ResponseError::FencedInstanceId)));
        }
        member.protocols = req.protocols.clone();
        member.id = new_id.clone();
        member.client_id = req.client_id.clone();
        member.client_host = req.client_host.clone();
        member.session_timeout_ms = req.session_timeout_ms;
        member.rebalance_timeout_ms = req.rebalance_timeout_ms;
        member.session_deadline = Instant::now() + Duration::from_millis(req.session_timeout_ms as u64);
        group.members.insert(new_id.clone(), member);
        if let Some(instance) = &req.group_instance_id {
            group.static_members.insert(instance.clone(), new_id.clone());
        }
        if group.leader.as_deref() == Some(old_id.as_str()) {
            group.leader = Some(new_id.clone());
        }
        if group.pending_sync.remove(&old_id) {
            group.pending_sync.insert(new_id.clone());
        }
        match group.state {
            GroupState::Stable => {
                let current = group.protocol.clone();
                if group.select_protocol() == current {
                    // Persist the new member id so a restart remembers who holds the assignment.
                    let value = group_value(group);
                    let resp = if req.supports_skip_assignment || group.leader.as_deref() != Some(new_id.as_str()) {
                        group.join_response_for(&new_id, true)
                    } else {
                        // Before v9 a replaced static leader is answered as a follower
                        // (the old id as leader, no members): it keeps its assignment
                        // through SyncGroup instead of computing a new one.
                        JoinResponse {
                            leader: old_id.clone(),
                            members: Vec::new(),
                            ..group.join_response_for(&new_id, false)
                        }
                    };
                    if let Err(e) =
                        self.append(vec![(records::encode_key(&RecordKey::Group { group: gid.clone() }), Some(value))])
                    {
                        let _ = reply.send(JoinResponse::error(e, &new_id));
                        return;
                    }
                    let _ = reply.send(resp);
                    self.schedule_session(&gid, &new_id);
                } else {
                    // Its protocols changed the group's choice: everyone rebalances.
                    let group = self.groups.get_mut(&gid).expect("present");
                    group.members.get_mut(&new_id).expect("present").join_waiter = Some(reply);
                    self.prepare_rebalance(&gid);
                }
            }
            GroupState::CompletingRebalance => {
                // The leader may be assigning to the old id: start over.
                group.members.get_mut(&new_id).expect("present").join_waiter = Some(reply);
                self.prepare_rebalance(&gid);
            }
            GroupState::PreparingRebalance => {
                group.members.get_mut(&new_id).expect("present").join_waiter = Some(reply);
                self.try_complete_join(&gid);
            }
            GroupState::Empty | GroupState::Dead => {
                group.members.get_mut(&new_id).expect("present").join_waiter = Some(reply);
                self.maybe_prepare_rebalance(&gid);
                self.try_complete_join(&gid);
            }
        }
    }

    fn schedule_session(&mut self, gid: &str, member_id: &str) {
        if let Some(at) = self.groups.get(gid).and_then(|g| g.members.get(member_id)).map(|m| m.session_deadline) {
            self.schedule(gid, at);
        }
    }

    fn maybe_prepare_rebalance(&mut self, gid: &str) {
        let Some(group) = self.groups.get(gid) else { return };
        if matches!(group.state, GroupState::Stable | GroupState::CompletingRebalance | GroupState::Empty) {
            self.prepare_rebalance(gid);
        }
    }

    fn prepare_rebalance(&mut self, gid: &str) {
        let delay_ms = self.settings.initial_rebalance_delay_ms;
        let Some(group) = self.groups.get_mut(gid) else { return };
        if group.state == GroupState::CompletingRebalance {
            // Assignments of the abandoned generation are void; waiting followers rejoin.
            for m in group.members.values_mut() {
                m.assignment = Bytes::new();
                if let Some(w) = m.sync_waiter.take() {
                    let _ = w.send(SyncResponse::error(code(ResponseError::RebalanceInProgress)));
                }
            }
        }
        let now = Instant::now();
        let was_empty = group.state == GroupState::Empty;
        let deadline = now + Duration::from_millis(group.max_rebalance_timeout_ms().max(0) as u64);
        group.rebalance_deadline = Some(deadline);
        group.join_not_before = if was_empty && delay_ms > 0 {
            Some((now + Duration::from_millis(delay_ms as u64)).min(deadline))
        } else {
            None
        };
        group.pending_sync.clear();
        group.sync_deadline = None;
        group.transition(GroupState::PreparingRebalance, now_ms());
        tracing::debug!(group = gid, generation = group.generation, "preparing rebalance");
        self.schedule(gid, deadline);
        if let Some(nb) = self.groups[gid].join_not_before {
            self.schedule(gid, nb);
        }
    }

    fn try_complete_join(&mut self, gid: &str) {
        let now = Instant::now();
        let Some(group) = self.groups.get(gid) else { return };
        if group.state != GroupState::PreparingRebalance {
            return;
        }
        let delay_over = group.join_not_before.is_none_or(|nb| now >= nb);
        let timed_out = group.rebalance_deadline.is_some_and(|d| now >= d);
        if (group.all_members_joined() && delay_over) || timed_out {
            self.complete_join(gid);
        }
    }

    fn complete_join(&mut self, gid: &str) {
        let now = Instant::now();
        let group = self.groups.get_mut(gid).expect("caller checked");
        // Members that did not rejoin in time are out.
        let missing: Vec<String> =
            group.members.values().filter(|m| m.join_waiter.is_none()).map(|m| m.id.clone()).collect();
        for id in missing {
            remove_member(group, &id);
        }
        group.rebalance_deadline = None;
        group.join_not_before = None;
        group.generation += 1;
        if group.members.is_empty() {
            group.protocol = None;
            group.protocol_type = None;
            group.leader = None;
            group.transition(GroupState::Empty, now_ms());
            let value = group_value(group);
            let _ = self.append(vec![(records::encode_key(&RecordKey::Group { group: gid.to_string() }), Some(value))]);
            return;
        }
        group.protocol = group.select_protocol();
        if group.leader.as_ref().is_none_or(|l| !group.members.contains_key(l)) {
            group.leader = group.members.keys().next().cloned();
        }
        group.transition(GroupState::CompletingRebalance, now_ms());
        let sync_timeout = Duration::from_millis(group.max_rebalance_timeout_ms().max(0) as u64);
        group.sync_deadline = Some(now + sync_timeout);
        group.pending_sync = group.members.keys().cloned().collect();
        let ids: Vec<String> = group.members.keys().cloned().collect();
        let mut sessions = Vec::new();
        for id in &ids {
            let resp = group.join_response_for(id, false);
            let m = group.members.get_mut(id).expect("listed");
            m.session_deadline = now + Duration::from_millis(m.session_timeout_ms as u64);
            sessions.push(m.session_deadline);
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(resp);
            }
        }
        tracing::debug!(group = gid, generation = group.generation, members = ids.len(), "join phase complete");
        let sync_deadline = now + sync_timeout;
        self.schedule(gid, sync_deadline);
        for at in sessions {
            self.schedule(gid, at);
        }
    }

    // ---- SyncGroup -------------------------------------------------------

    fn validate_member(group: &Group, member_id: &str, instance: Option<&String>) -> Result<(), i16> {
        if let Some(instance) = instance {
            if let Some(current) = group.static_members.get(instance) {
                if current != member_id {
                    return Err(code(ResponseError::FencedInstanceId));
                }
            }
        }
        if !group.members.contains_key(member_id) {
            return Err(code(ResponseError::UnknownMemberId));
        }
        Ok(())
    }

    fn sync(&mut self, req: SyncRequest, reply: oneshot::Sender<SyncResponse>) {
        let gid = req.group_id.clone();
        let Some(group) = self.groups.get_mut(&gid) else {
            let _ = reply.send(SyncResponse::error(code(ResponseError::UnknownMemberId)));
            return;
        };
        if group.state == GroupState::Dead {
            let _ = reply.send(SyncResponse::error(code(ResponseError::CoordinatorNotAvailable)));
            return;
        }
        if let Err(e) = Self::validate_member(group, &req.member_id, req.group_instance_id.as_ref()) {
            let _ = reply.send(SyncResponse::error(e));
            return;
        }
        if req.generation != group.generation {
            let _ = reply.send(SyncResponse::error(code(ResponseError::IllegalGeneration)));
            return;
        }
        if req.protocol_type.as_ref().is_some_and(|t| group.protocol_type.as_ref() != Some(t))
            || req.protocol_name.as_ref().is_some_and(|p| group.protocol.as_ref() != Some(p))
        {
            let _ = reply.send(SyncResponse::error(code(ResponseError::InconsistentGroupProtocol)));
            return;
        }
        let now = Instant::now();
        let session_deadline;
        {
            let m = group.members.get_mut(&req.member_id).expect("validated");
            m.session_deadline = now + Duration::from_millis(m.session_timeout_ms as u64);
            session_deadline = m.session_deadline;
        }
        group.pending_sync.remove(&req.member_id);
        match group.state {
            GroupState::Empty => {
                let _ = reply.send(SyncResponse::error(code(ResponseError::UnknownMemberId)));
            }
            GroupState::PreparingRebalance => {
                let _ = reply.send(SyncResponse::error(code(ResponseError::RebalanceInProgress)));
            }
            GroupState::Stable => {
                let m = &group.members[&req.member_id];
                let _ = reply.send(SyncResponse {
                    error: 0,
                    protocol_type: group.protocol_type.clone(),
                    protocol_name: group.protocol.clone(),
                    assignment: m.assignment.clone(),
                });
            }
            GroupState::CompletingRebalance => {
                group.members.get_mut(&req.member_id).expect("validated").sync_waiter = Some(reply);
                if group.leader.as_deref() == Some(req.member_id.as_str()) {
                    let assignments: HashMap<String, Bytes> = req.assignments.into_iter().collect();
                    for m in group.members.values_mut() {
                        m.assignment = assignments.get(&m.id).cloned().unwrap_or_default();
                    }
                    let value = group_value(group);
                    let result =
                        self.append(vec![(records::encode_key(&RecordKey::Group { group: gid.clone() }), Some(value))]);
                    let group = self.groups.get_mut(&gid).expect("present");
                    match result {
                        Ok(()) => {
                            group.transition(GroupState::Stable, now_ms());
                            let (pt, pn) = (group.protocol_type.clone(), group.protocol.clone());
                            for m in group.members.values_mut() {
                                if let Some(w) = m.sync_waiter.take() {
                                    let _ = w.send(SyncResponse {
                                        error: 0,
                                        protocol_type: pt.clone(),
                                        protocol_name: pn.clone(),
                                        assignment: m.assignment.clone(),
                                    });
                                }
                            }
                            tracing::debug!(group = %gid, generation = group.generation, "group stable");
                        }
                        Err(e) => {
                            for m in group.members.values_mut() {
                                m.assignment = Bytes::new();
                                if let Some(w) = m.sync_waiter.take() {
                                    let _ = w.send(SyncResponse::error(e));
                                }
                            }
                            self.prepare_rebalance(&gid);
                        }
                    }
                }
            }
            GroupState::Dead => unreachable!("checked above"),
        }
        self.schedule(&gid, session_deadline);
    }

    // ---- Heartbeat and LeaveGroup -----------------------------------------

    fn heartbeat(&mut self, req: HeartbeatRequest) -> i16 {
        let Some(group) = self.groups.get_mut(&req.group_id) else {
            return code(ResponseError::UnknownMemberId);
        };
        if group.state == GroupState::Dead {
            return code(ResponseError::CoordinatorNotAvailable);
        }
        if let Err(e) = Self::validate_member(group, &req.member_id, req.group_instance_id.as_ref()) {
            return e;
        }
        if req.generation != group.generation {
            return code(ResponseError::IllegalGeneration);
        }
        let m = group.members.get_mut(&req.member_id).expect("validated");
        m.session_deadline = Instant::now() + Duration::from_millis(m.session_timeout_ms as u64);
        let at = m.session_deadline;
        let result = match group.state {
            GroupState::PreparingRebalance => code(ResponseError::RebalanceInProgress),
            GroupState::Empty => code(ResponseError::UnknownMemberId),
            _ => 0,
        };
        let gid = req.group_id.clone();
        self.schedule(&gid, at);
        result
    }

    fn leave(&mut self, req: LeaveRequest) -> LeaveResponse {
        let gid = req.group_id.clone();
        let Some(group) = self.groups.get_mut(&gid) else {
            return LeaveResponse { error: code(ResponseError::UnknownMemberId), members: Vec::new() };
        };
        if group.state == GroupState::Dead {
            return LeaveResponse { error: code(ResponseError::CoordinatorNotAvailable), members: Vec::new() };
        }
        let mut results = Vec::new();
        let mut removed_any = false;
        for (member_id, instance) in req.members {
            let error = match &instance {
                Some(inst) => match group.static_members.get(inst).cloned() {
                    None => code(ResponseError::UnknownMemberId),
                    // An empty member id with an instance id removes that static member (admin removal).
                    Some(current) if member_id.is_empty() || current == member_id => {
                        remove_member(group, &current);
                        removed_any = true;
                        0
                    }
                    Some(_) => code(ResponseError::FencedInstanceId),
                },
                None => {
                    if group.pending_members.remove(&member_id).is_some() {
                        0
                    } else if group.members.contains_key(&member_id) {
                        remove_member(group, &member_id);
                        removed_any = true;
                        0
                    } else {
                        code(ResponseError::UnknownMemberId)
                    }
                }
            };
            results.push((member_id, instance, error));
        }
        if removed_any {
            let state = self.groups[&gid].state;
            match state {
                GroupState::Stable | GroupState::CompletingRebalance => self.prepare_rebalance(&gid),
                _ => {}
            }
            self.try_complete_join(&gid);
        } else {
            self.try_complete_join(&gid);
        }
        LeaveResponse { error: 0, members: results }
    }

    // ---- Timers ------------------------------------------------------------

    fn fire_timers(&mut self, now: Instant) {
        let mut due = HashSet::new();
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            let Reverse((_, gid)) = self.timers.pop().expect("peeked");
            due.insert(gid);
        }
        for gid in due {
            self.expire_group(&gid, now);
        }
    }

    /// Applies every deadline of one group that has passed.
    fn expire_group(&mut self, gid: &str, now: Instant) {
        let Some(group) = self.groups.get_mut(gid) else { return };
        group.pending_members.retain(|_, deadline| *deadline > now);
        // Sessions: members waiting in join or sync are kept alive.
        let expired: Vec<String> = group
            .members
            .values()
            .filter(|m| m.join_waiter.is_none() && m.sync_waiter.is_none() && m.session_deadline <= now)
            .map(|m| m.id.clone())
            .collect();
        for id in &expired {
            tracing::info!(group = gid, member = %id, "member session expired");
            remove_member(group, id);
        }
        // Sync timeout: members that never synced this generation are removed.
        let mut sync_expired = false;
        if group.sync_deadline.is_some_and(|d| d <= now) {
            group.sync_deadline = None;
            if matches!(group.state, GroupState::CompletingRebalance | GroupState::Stable)
                && !group.pending_sync.is_empty()
            {
                let lagging: Vec<String> = group.pending_sync.drain().collect();
                for id in &lagging {
                    tracing::info!(group = gid, member = %id, "member did not sync in time");
                    remove_member(group, id);
                }
                sync_expired = true;
            }
        }
        let state = group.state;
        if !expired.is_empty() || sync_expired {
            match state {
                GroupState::Stable | GroupState::CompletingRebalance => self.prepare_rebalance(gid),
                GroupState::Empty => {
                    let group = self.groups.get_mut(gid).expect("present");
                    group.transition(GroupState::Empty, now_ms());
                }
                _ => {}
            }
        }
        self.try_complete_join(gid);
        // Re-arm for the next session deadline of this group.
        if let Some(next) = self.groups.get(gid).and_then(|g| g.members.values().map(|m| m.session_deadline).min()) {
            if next > now {
                self.schedule(gid, next);
            }
        }
    }

    // ---- Offsets -----------------------------------------------------------

    fn commit(&mut self, req: CommitRequest) -> Vec<i16> {
        let n = req.offsets.len();
        let gid = req.group_id.clone();
        if gid.is_empty() {
            return vec![code(ResponseError::InvalidGroupId); n];
        }
        match self.groups.get_mut(&gid) {
            None => {
                if req.generation >= 0 {
                    return vec![code(ResponseError::IllegalGeneration); n];
                }
                if self.groups.len() >= self.settings.max_count {
                    return vec![code(ResponseError::CoordinatorNotAvailable); n];
                }
                // Offsets-only ("simple") use of a group: it exists from its first commit.
                self.groups.insert(gid.clone(), Group::new(&gid, now_ms()));
            }
            Some(group) => {
                if group.state == GroupState::Dead {
                    return vec![code(ResponseError::CoordinatorNotAvailable); n];
                }
                let simple = req.generation < 0 && group.state == GroupState::Empty;
                if !simple {
                    if let Err(e) = Self::validate_member(group, &req.member_id, req.group_instance_id.as_ref()) {
                        return vec![e; n];
                    }
                    if req.generation != group.generation {
                        return vec![code(ResponseError::IllegalGeneration); n];
                    }
                    if group.state == GroupState::CompletingRebalance {
                        return vec![code(ResponseError::RebalanceInProgress); n];
                    }
                    let m = group.members.get_mut(&req.member_id).expect("validated");
                    m.session_deadline = Instant::now() + Duration::from_millis(m.session_timeout_ms as u64);
                }
            }
        }
        let now = now_ms();
        let mut errors = vec![0i16; n];
        let mut records = Vec::new();
        let mut accepted = Vec::new();
        for (i, o) in req.offsets.iter().enumerate() {
            let metadata = o.metadata.clone().unwrap_or_default();
            if metadata.len() > self.settings.offset_metadata_max_bytes {
                errors[i] = code(ResponseError::OffsetMetadataTooLarge);
                continue;
            }
            if !self.replicas.partition_exists(&o.topic, o.partition) {
                errors[i] = code(ResponseError::UnknownTopicOrPartition);
                continue;
            }
            let key = RecordKey::Offset { group: gid.clone(), topic: o.topic.clone(), partition: o.partition };
            let value = OffsetValue { offset: o.offset, leader_epoch: o.leader_epoch, metadata, commit_timestamp: now };
            records.push((records::encode_key(&key), Some(records::encode_offset_value(&value))));
            accepted.push((i, value));
        }
        if records.is_empty() {
            return errors;
        }
        if let Err(e) = self.append(records) {
            for (i, _) in &accepted {
                errors[*i] = e;
            }
            return errors;
        }
        let group = self.groups.get_mut(&gid).expect("present");
        for (i, v) in accepted {
            let o = &req.offsets[i];
            group.offsets.insert(
                (o.topic.clone(), o.partition),
                OffsetEntry {
                    offset: v.offset,
                    leader_epoch: v.leader_epoch,
                    metadata: v.metadata,
                    commit_timestamp_ms: now,
                },
            );
        }
        errors
    }

    /// TxnOffsetCommit: validated like a commit (KIP-447: generation and member
    /// when given), written as a transactional batch of the producer, visible
    /// only when the transaction commits.
    fn txn_commit(&mut self, req: TxnCommitRequest) -> Vec<i16> {
        let n = req.offsets.len();
        let gid = req.group_id.clone();
        if gid.is_empty() {
            return vec![code(ResponseError::InvalidGroupId); n];
        }
        if let Some(group) = self.groups.get(&gid) {
            if group.state == GroupState::Dead {
                return vec![code(ResponseError::CoordinatorNotAvailable); n];
            }
            let checks_member = !req.member_id.is_empty() || req.generation >= 0;
            if checks_member {
                if let Err(e) = Self::validate_member(group, &req.member_id, req.group_instance_id.as_ref()) {
                    return vec![e; n];
                }
                if req.generation != group.generation {
                    return vec![code(ResponseError::IllegalGeneration); n];
                }
            }
        } else if !req.member_id.is_empty() || req.generation >= 0 {
            return vec![code(ResponseError::IllegalGeneration); n];
        }
        let now = now_ms();
        let mut errors = vec![0i16; n];
        let mut entries = Vec::new();
        let mut accepted = Vec::new();
        for (i, o) in req.offsets.iter().enumerate() {
            let metadata = o.metadata.clone().unwrap_or_default();
            if metadata.len() > self.settings.offset_metadata_max_bytes {
                errors[i] = code(ResponseError::OffsetMetadataTooLarge);
                continue;
            }
            if !self.replicas.partition_exists(&o.topic, o.partition) {
                errors[i] = code(ResponseError::UnknownTopicOrPartition);
                continue;
            }
            let key = RecordKey::Offset { group: gid.clone(), topic: o.topic.clone(), partition: o.partition };
            let value = OffsetValue { offset: o.offset, leader_epoch: o.leader_epoch, metadata, commit_timestamp: now };
            entries.push((records::encode_key(&key), Some(records::encode_offset_value(&value))));
            accepted.push((i, value));
        }
        if entries.is_empty() {
            return errors;
        }
        if let Err(e) = self.append_as(entries, Some((req.producer_id, req.producer_epoch))) {
            for (i, _) in &accepted {
                errors[*i] = e;
            }
            return errors;
        }
        let pending = self.pending_txn.entry(req.producer_id).or_default();
        for (i, v) in accepted {
            let o = &req.offsets[i];
            pending.insert(
                (gid.clone(), o.topic.clone(), o.partition),
                OffsetEntry {
                    offset: v.offset,
                    leader_epoch: v.leader_epoch,
                    metadata: v.metadata,
                    commit_timestamp_ms: now,
                },
            );
        }
        errors
    }

    /// Writes the producer's COMMIT/ABORT marker to this partition and applies
    /// or drops the offsets it committed inside the transaction.
    fn complete_txn(&mut self, producer_id: i64, epoch: i16, commit: bool) -> Result<(), i16> {
        let marker = batch::build_control_batch(producer_id, epoch, commit, 0, now_ms());
        if let Err(e) = self.partition.append(&marker, AppendOrigin::Coordinator, now_ms()) {
            tracing::error!(partition = self.partition.index, error = %e, "cannot write a transaction marker");
            return Err(crate::api::error::partition_code(&e));
        }
        let pending = self.pending_txn.remove(&producer_id).unwrap_or_default();
        if commit {
            apply_pending(&mut self.groups, pending);
        }
        Ok(())
    }

    fn fetch_offsets(&self, gid: &str, partitions: Option<Vec<(String, Vec<i32>)>>) -> Vec<CommittedOffset> {
        let group = self.groups.get(gid);
        let entry = |topic: &str, partition: i32| {
            let found = group.and_then(|g| g.offsets.get(&(topic.to_string(), partition)));
            match found {
                Some(e) => CommittedOffset {
                    topic: topic.to_string(),
                    partition,
                    offset: e.offset,
                    leader_epoch: e.leader_epoch,
                    metadata: e.metadata.clone(),
                    error: 0,
                },
                None => CommittedOffset {
                    topic: topic.to_string(),
                    partition,
                    offset: -1,
                    leader_epoch: -1,
                    metadata: String::new(),
                    error: 0,
                },
            }
        };
        match partitions {
            Some(list) => list.iter().flat_map(|(t, ps)| ps.iter().map(move |p| entry(t, *p))).collect(),
            None => {
                let mut all: Vec<CommittedOffset> =
                    group.map(|g| g.offsets.keys().map(|(t, p)| entry(t, *p)).collect()).unwrap_or_default();
                all.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
                all
            }
        }
    }

    fn describe(&self, gid: &str) -> DescribedGroup {
        let Some(group) = self.groups.get(gid) else {
            return DescribedGroup {
                error: code(ResponseError::GroupIdNotFound),
                group_id: gid.to_string(),
                state: "Dead".into(),
                ..Default::default()
            };
        };
        let protocol = group.protocol.clone().unwrap_or_default();
        let stable = group.state == GroupState::Stable;
        DescribedGroup {
            error: 0,
            group_id: gid.to_string(),
            state: group.state.name().to_string(),
            protocol_type: group.protocol_type.clone().unwrap_or_default(),
            protocol: if stable { protocol.clone() } else { String::new() },
            members: group
                .members
                .values()
                .map(|m| DescribedMember {
                    member_id: m.id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: m.metadata_for(&protocol),
                    assignment: if stable { m.assignment.clone() } else { Bytes::new() },
                })
                .collect(),
        }
    }

    fn delete_group(&mut self, gid: &str) -> i16 {
        let Some(group) = self.groups.get(gid) else {
            return code(ResponseError::GroupIdNotFound);
        };
        match group.state {
            GroupState::Dead => return code(ResponseError::GroupIdNotFound),
            GroupState::Empty => {}
            _ => return code(ResponseError::NonEmptyGroup),
        }
        let mut tombstones = vec![(records::encode_key(&RecordKey::Group { group: gid.to_string() }), None)];
        for (t, p) in group.offsets.keys() {
            tombstones.push((
                records::encode_key(&RecordKey::Offset { group: gid.to_string(), topic: t.clone(), partition: *p }),
                None,
            ));
        }
        if let Err(e) = self.append(tombstones) {
            return e;
        }
        self.groups.remove(gid);
        0
    }

    fn delete_offsets(
        &mut self,
        gid: &str,
        partitions: Vec<(String, Vec<i32>)>,
    ) -> Result<Vec<(String, i32, i16)>, i16> {
        let Some(group) = self.groups.get(gid) else {
            return Err(code(ResponseError::GroupIdNotFound));
        };
        if group.state == GroupState::Dead {
            return Err(code(ResponseError::GroupIdNotFound));
        }
        let subscribed = if group.state == GroupState::Empty { None } else { group.subscribed_topics() };
        let mut results = Vec::new();
        let mut tombstones = Vec::new();
        let mut removed = Vec::new();
        for (topic, ps) in partitions {
            for p in ps {
                if subscribed.as_ref().is_some_and(|s| s.contains(&topic)) {
                    results.push((topic.clone(), p, code(ResponseError::GroupSubscribedToTopic)));
                    continue;
                }
                if group.offsets.contains_key(&(topic.clone(), p)) {
                    tombstones.push((
                        records::encode_key(&RecordKey::Offset {
                            group: gid.to_string(),
                            topic: topic.clone(),
                            partition: p,
                        }),
                        None,
                    ));
                    removed.push((topic.clone(), p));
                }
                results.push((topic.clone(), p, 0));
            }
        }
        if !tombstones.is_empty() {
            self.append(tombstones)?;
            let group = self.groups.get_mut(gid).expect("present");
            for k in removed {
                group.offsets.remove(&k);
            }
        }
        Ok(results)
    }

    /// Kafka 2.1+ expiry: an empty group's offsets expire `offsets.retention.minutes`
    /// after it became empty; an offsets-only group's offsets expire that long after
    /// their commit. A group left with neither members nor offsets is removed.
    fn expire_offsets(&mut self) {
        let now = now_ms();
        let retention = self.settings.offsets_retention_ms;
        let mut tombstones = Vec::new();
        let mut changes: Vec<Expiry> = Vec::new();
        for group in self.groups.values() {
            if group.state != GroupState::Empty {
                continue;
            }
            let expired: Vec<(String, i32)> = group
                .offsets
                .iter()
                .filter(|(_, e)| {
                    let since = if group.protocol_type.is_some() || group.generation > 0 {
                        group.state_since_ms
                    } else {
                        e.commit_timestamp_ms
                    };
                    now.saturating_sub(since) >= retention
                })
                .map(|(k, _)| k.clone())
                .collect();
            let remove_group = expired.len() == group.offsets.len();
            if expired.is_empty() && !remove_group {
                continue;
            }
            for (t, p) in &expired {
                tombstones.push((
                    records::encode_key(&RecordKey::Offset {
                        group: group.id.clone(),
                        topic: t.clone(),
                        partition: *p,
                    }),
                    None,
                ));
            }
            if remove_group {
                tombstones.push((records::encode_key(&RecordKey::Group { group: group.id.clone() }), None));
            }
            changes.push((group.id.clone(), expired, remove_group));
        }
        if tombstones.is_empty() {
            return;
        }
        if let Err(e) = self.append(tombstones) {
            tracing::warn!(partition = self.partition.index, error = e, "offset expiry could not be written");
            return;
        }
        for (gid, expired, remove_group) in changes {
            tracing::info!(group = %gid, offsets = expired.len(), "offsets expired");
            if remove_group {
                self.groups.remove(&gid);
            } else if let Some(g) = self.groups.get_mut(&gid) {
                for k in expired {
                    g.offsets.remove(&k);
                }
            }
        }
    }

    /// Appends records (key, value or tombstone) as one uncompressed batch.
    fn append(&self, entries: Vec<(Bytes, Option<Bytes>)>) -> Result<(), i16> {
        self.append_as(entries, None)
    }

    /// Appends one batch; with a producer (id, epoch) it is a transactional batch
    /// of that producer, written without a sequence as coordinators write.
    fn append_as(&self, entries: Vec<(Bytes, Option<Bytes>)>, producer: Option<(i64, i16)>) -> Result<(), i16> {
        let now = now_ms();
        let (producer_id, producer_epoch) = producer.unwrap_or((-1, -1));
        let records: Vec<Record> = entries
            .into_iter()
            .enumerate()
            .map(|(i, (key, value))| Record {
                transactional: producer.is_some(),
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id,
                producer_epoch,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: -1,
                timestamp: now,
                key: Some(key),
                value,
                headers: Default::default(),
            })
            .collect();
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        if RecordBatchEncoder::encode(&mut buf, records.iter(), &options).is_err() {
            return Err(code(ResponseError::UnknownServerError));
        }
        match self.partition.append(&buf, AppendOrigin::Coordinator, now) {
            Ok(_) => Ok(()),
            Err(PartitionError::Storage(strand_storage::StorageError::BatchTooLarge { .. })) => {
                Err(code(ResponseError::InvalidCommitOffsetSize))
            }
            Err(e) => {
                tracing::error!(partition = self.partition.index, error = %e, "cannot append to __consumer_offsets");
                Err(code(ResponseError::CoordinatorNotAvailable))
            }
        }
    }
}

fn remove_member(group: &mut Group, member_id: &str) {
    let Some(mut m) = group.members.shift_remove(member_id) else { return };
    if let Some(w) = m.join_waiter.take() {
        let _ = w.send(JoinResponse::error(code(ResponseError::UnknownMemberId), member_id));
    }
    if let Some(w) = m.sync_waiter.take() {
        let _ = w.send(SyncResponse::error(code(ResponseError::UnknownMemberId)));
    }
    if let Some(instance) = &m.group_instance_id {
        if group.static_members.get(instance).map(String::as_str) == Some(member_id) {
            group.static_members.remove(instance);
        }
    }
    group.pending_sync.remove(member_id);
    if group.leader.as_deref() == Some(member_id) {
        group.leader = group.members.keys().next().cloned();
    }
}

fn group_value(group: &Group) -> Bytes {
    let protocol = group.protocol.clone().unwrap_or_default();
    records::encode_group_value(&GroupValue {
        protocol_type: group.protocol_type.clone().unwrap_or_default(),
        generation: group.generation,
        protocol: group.protocol.clone(),
        leader: group.leader.clone(),
        current_state_timestamp: group.state_since_ms,
        members: group
            .members
            .values()
            .map(|m| MemberValue {
                member_id: m.id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                session_timeout_ms: m.session_timeout_ms,
                subscription: m.metadata_for(&protocol),
                assignment: m.assignment.clone(),
            })
            .collect(),
    })
}

/// Rebuilds the groups of one partition by reading it from start to end.
/// Returns the groups and how many records were read.
type PendingTxnOffsets = HashMap<i64, HashMap<(String, String, i32), OffsetEntry>>;

/// Makes a committed transaction's offsets visible in their groups.
fn apply_pending(groups: &mut HashMap<String, Group>, pending: HashMap<(String, String, i32), OffsetEntry>) {
    for ((gid, topic, partition), entry) in pending {
        let g = groups.entry(gid.clone()).or_insert_with(|| Group::new(&gid, entry.commit_timestamp_ms));
        g.offsets.insert((topic, partition), entry);
    }
}

fn load(partition: &Partition) -> Result<(HashMap<String, Group>, PendingTxnOffsets, u64), String> {
    let mut groups: HashMap<String, Group> = HashMap::new();
    let mut pending: PendingTxnOffsets = HashMap::new();
    let offsets = partition.offsets().map_err(|e| e.to_string())?;
    let mut position = offsets.log_start_offset;
    let mut records_read = 0u64;
    let mut buf = Vec::new();
    while position < offsets.log_end_offset {
        let info = partition.read_to_log_end(position, 4 << 20).map_err(|e| e.to_string())?;
        if info.slices.is_empty() {
            break;
        }
        buf.clear();
        for s in &info.slices {
            s.read_into(&mut buf).map_err(|e| e.to_string())?;
        }
        for (at, header, total) in batch::iter(&buf) {
            position = header.last_offset() + 1;
            if header.is_control() {
                // A transaction's outcome: its offsets become visible or are dropped.
                if let Ok(Some(marker)) = batch::parse_end_txn_marker(&buf[at..at + total], at) {
                    let done = pending.remove(&header.producer_id()).unwrap_or_default();
                    if marker.commit {
                        apply_pending(&mut groups, done);
                    }
                }
                continue;
            }
            let mut bytes = Bytes::copy_from_slice(&buf[at..at + total]);
            let set = RecordBatchDecoder::decode(&mut bytes)
                .map_err(|e| format!("undecodable batch at offset {}: {e}", header.base_offset()))?;
            for r in set.records {
                records_read += 1;
                if header.is_transactional() {
                    // Pending until the transaction's marker (later in this log) decides.
                    if let (Some(Ok(RecordKey::Offset { group, topic, partition })), Some(v)) =
                        (r.key.as_deref().map(records::decode_key), r.value.as_deref())
                    {
                        if let Ok(v) = records::decode_offset_value(v) {
                            pending.entry(header.producer_id()).or_default().insert(
                                (group, topic, partition),
                                OffsetEntry {
                                    offset: v.offset,
                                    leader_epoch: v.leader_epoch,
                                    metadata: v.metadata,
                                    commit_timestamp_ms: v.commit_timestamp,
                                },
                            );
                        }
                    }
                    continue;
                }
                apply_record(&mut groups, r.key.as_deref(), r.value.as_deref());
            }
        }
    }
    // Groups whose metadata was never written but that have offsets are offsets-only groups.
    groups.retain(|_, g| g.state != GroupState::Dead);
    Ok((groups, pending, records_read))
}

fn apply_record(groups: &mut HashMap<String, Group>, key: Option<&[u8]>, value: Option<&[u8]>) {
    let Some(key) = key else { return };
    let key = match records::decode_key(key) {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(error = %e, "skipping unreadable __consumer_offsets key");
            return;
        }
    };
    let gid = key.group().to_string();
    match (key, value) {
        (RecordKey::Offset { topic, partition, .. }, Some(v)) => match records::decode_offset_value(v) {
            Ok(v) => {
                let g = groups.entry(gid.clone()).or_insert_with(|| Group::new(&gid, v.commit_timestamp));
                g.offsets.insert(
                    (topic, partition),
                    OffsetEntry {
                        offset: v.offset,
                        leader_epoch: v.leader_epoch,
                        metadata: v.metadata,
                        commit_timestamp_ms: v.commit_timestamp,
                    },
                );
            }
            Err(e) => tracing::warn!(group = %gid, error = %e, "skipping unreadable offset commit"),
        },
        (RecordKey::Offset { topic, partition, .. }, None) => {
            if let Some(g) = groups.get_mut(&gid) {
                g.offsets.remove(&(topic, partition));
                if g.offsets.is_empty() && g.members.is_empty() && g.protocol_type.is_none() {
                    groups.remove(&gid);
                }
            }
        }
        (RecordKey::Group { .. }, Some(v)) => match records::decode_group_value(v) {
            Ok(v) => {
                let g = groups.entry(gid.clone()).or_insert_with(|| Group::new(&gid, v.current_state_timestamp));
                g.generation = v.generation;
                g.protocol_type = if v.protocol_type.is_empty() { None } else { Some(v.protocol_type) };
                g.protocol = v.protocol;
                g.leader = v.leader;
                g.state_since_ms = v.current_state_timestamp;
                g.members.clear();
                g.static_members.clear();
                let protocol = g.protocol.clone().unwrap_or_default();
                for m in v.members {
                    if let Some(inst) = &m.group_instance_id {
                        g.static_members.insert(inst.clone(), m.member_id.clone());
                    }
                    g.members.insert(
                        m.member_id.clone(),
                        Member {
                            id: m.member_id,
                            group_instance_id: m.group_instance_id,
                            client_id: m.client_id,
                            client_host: m.client_host,
                            session_timeout_ms: m.session_timeout_ms,
                            rebalance_timeout_ms: m.rebalance_timeout_ms,
                            protocols: vec![(protocol.clone(), m.subscription)],
                            assignment: m.assignment,
                            join_waiter: None,
                            sync_waiter: None,
                            session_deadline: Instant::now(),
                        },
                    );
                }
                g.state = if g.members.is_empty() { GroupState::Empty } else { GroupState::Stable };
            }
            Err(e) => tracing::warn!(group = %gid, error = %e, "skipping unreadable group metadata"),
        },
        (RecordKey::Group { .. }, None) => {
            groups.remove(&gid);
        }
    }
}
