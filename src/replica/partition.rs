//! One partition hosted here: its log and its replication state (role,
//! leader epoch, high watermark, ISR, followers' progress: see [`state`]).
//!
//! A single node is the replication-factor-1 case of the replicated design:
//! the ISR is this broker alone, so the high watermark moves to the log end
//! offset as soon as an append is written. In a cluster the leader's high
//! watermark follows its followers' fetches, and a follower's follows the
//! leader's.
//!
//! Lock order: the log, then the replication state; neither is held across
//! an `.await`.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::state::{Effect, FetchPosition, PartitionState};

use strand_storage::{
    AbortedTxn, AppendInfo, AppendOrigin, CleanStats, Log, LogConfig, ProducerInfo, ReadInfo, StorageError,
    TimestampLookup,
};
use tokio::sync::watch;

/// A partition that has been deleted (or the broker is shutting down).
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("partition is no longer hosted here")]
    Gone,
    /// Not led here (a follower, offline, or the leadership moved).
    #[error("this broker does not lead the partition")]
    NotLeader,
    /// The ISR fell below `min(min.insync.replicas, replicas)` while an
    /// acks=all write waited for it.
    #[error("{isr} in-sync replica(s), fewer than the {required} required")]
    UnderMinIsr { isr: usize, required: usize },
    /// The request names a leader epoch older than the partition's.
    #[error("leader epoch {requested} is older than the current {current}")]
    FencedLeaderEpoch { requested: i32, current: i32 },
    /// The request names a leader epoch this broker has not seen yet.
    #[error("leader epoch {requested} is newer than the current {current}")]
    UnknownLeaderEpoch { requested: i32, current: i32 },
    /// A write waited for its replicas longer than its timeout.
    #[error("the write was not replicated to the in-sync replicas in time")]
    TimedOut,
    /// Damage was found in its log (by a read or the scrubber): it serves
    /// nothing until an operator repairs it.
    #[error("partition is offline: {0}")]
    Offline(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Offsets a fetch or list-offsets response reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub log_start_offset: i64,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_end_offset: i64,
}

/// What a follower's fetch read from the leader.
#[derive(Debug)]
pub struct ReplicaRead {
    pub info: ReadInfo,
    pub offsets: PartitionOffsets,
    /// The follower's log diverges from the leader's: (epoch, end offset)
    /// to truncate to (KIP-320's DivergingEpoch); nothing is read then.
    pub diverging: Option<(i32, i64)>,
    /// What the leader must still do (ISR changes to send).
    pub effects: Vec<Effect>,
}

#[derive(Debug)]
pub struct Partition {
    pub topic: String,
    pub index: i32,
    min_insync_replicas: AtomicI32,
    /// `cleanup.policy` includes compact: records must have keys.
    compacted: AtomicBool,
    /// `None` once the partition is deleted or closed.
    log: Mutex<Option<Log>>,
    /// Role, epochs, high watermark, ISR (see [`PartitionState`]).
    state: Mutex<PartitionState>,
    /// Publishes the high watermark so consumers' long polls wake when it moves.
    high_watermark: watch::Sender<i64>,
    /// Publishes the log end offset so followers' long polls wake on appends.
    log_end: watch::Sender<i64>,
    /// Why the partition was taken offline, once damage is found.
    offline: std::sync::OnceLock<String>,
}

impl Partition {
    /// A single node's partition: led here at epoch 0, everything appended committed.
    pub fn new(topic: &str, index: i32, log: Log, min_insync_replicas: i32) -> Partition {
        let state = PartitionState::single_node(log.log_end_offset(), min_insync_replicas);
        Self::with_state(topic, index, log, min_insync_replicas, state)
    }

    /// A cluster partition: it serves nothing until the image says who leads
    /// it. `high_watermark` is the checkpointed one.
    pub fn new_replica(
        topic: &str,
        index: i32,
        log: Log,
        min_insync_replicas: i32,
        me: i32,
        high_watermark: i64,
    ) -> Partition {
        let state = PartitionState::new(me, log.log_end_offset(), high_watermark, min_insync_replicas);
        Self::with_state(topic, index, log, min_insync_replicas, state)
    }

    fn with_state(topic: &str, index: i32, log: Log, min_insync_replicas: i32, state: PartitionState) -> Partition {
        let compacted = AtomicBool::new(log.config().cleanup_compact);
        Partition {
            compacted,
            topic: topic.to_string(),
            index,
            min_insync_replicas: AtomicI32::new(min_insync_replicas),
            high_watermark: watch::Sender::new(state.high_watermark),
            log_end: watch::Sender::new(log.log_end_offset()),
            state: Mutex::new(state),
            log: Mutex::new(Some(log)),
            offline: std::sync::OnceLock::new(),
        }
    }

    fn lock_state(&self) -> MutexGuard<'_, PartitionState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the replication state (for describing it).
    pub fn replication(&self) -> PartitionState {
        self.lock_state().clone()
    }

    pub fn leader_epoch(&self) -> i32 {
        self.lock_state().leader_epoch
    }

    pub fn is_leader(&self) -> bool {
        self.lock_state().is_leader()
    }

    /// Checks a request's `current_leader_epoch` (-1: not given) against ours.
    pub fn check_leader_epoch(&self, requested: i32) -> Result<(), PartitionError> {
        let current = self.lock_state().leader_epoch;
        match requested {
            r if r < 0 || r == current => Ok(()),
            r if r < current => Err(PartitionError::FencedLeaderEpoch { requested: r, current }),
            r => Err(PartitionError::UnknownLeaderEpoch { requested: r, current }),
        }
    }

    /// Carries out the effects that are the partition's own (publishing a
    /// new high watermark) and returns the rest for the replication driver.
    fn publish(&self, effects: Vec<Effect>) -> Vec<Effect> {
        effects
            .into_iter()
            .filter(|e| match e {
                Effect::HighWatermark(hw) => {
                    self.advance_high_watermark(*hw);
                    false
                }
                _ => true,
            })
            .collect()
    }

    /// Locks the log. A panic elsewhere while holding the lock leaves the log
    /// consistent (every storage call is all-or-nothing), so poisoning is ignored.
    fn lock(&self) -> MutexGuard<'_, Option<Log>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_log<T>(&self, f: impl FnOnce(&mut Log) -> Result<T, PartitionError>) -> Result<T, PartitionError> {
        let mut guard = self.lock();
        let log = guard.as_mut().ok_or(PartitionError::Gone)?;
        if let Some(reason) = self.offline.get() {
            return Err(PartitionError::Offline(reason.clone()));
        }
        match f(log) {
            Err(PartitionError::Storage(e @ StorageError::DamagedSegment { .. })) => {
                Err(self.take_offline(&e, log.dir()))
            }
            other => other,
        }
    }

    /// Takes the partition offline for damage `e`: logged once, loudly, with
    /// the repair command; every later request gets KAFKA_STORAGE_ERROR.
    fn take_offline(&self, e: &StorageError, dir: &std::path::Path) -> PartitionError {
        let reason = e.to_string();
        if self.offline.set(reason.clone()).is_ok() {
            tracing::error!(
                topic = %self.topic,
                partition = self.index,
                error = %e,
                repair = %strand_storage::repair_hint(dir),
                "damaged log: partition taken offline"
            );
        }
        PartitionError::Offline(reason)
    }

    /// Why the partition is offline, if it is.
    pub fn offline_reason(&self) -> Option<&str> {
        self.offline.get().map(String::as_str)
    }

    pub fn min_insync_replicas(&self) -> i32 {
        self.min_insync_replicas.load(Ordering::Relaxed)
    }

    /// Whether an acks=all batch ending at `last_offset`, appended at
    /// `leader_epoch`, is committed: `Ok(true)` once the high watermark
    /// passes it while this broker still leads at that epoch (a deposed
    /// leader's high watermark says nothing about its old appends, which
    /// the new leader may have cut), `Ok(false)` while waiting.
    pub fn replicated(&self, last_offset: i64, leader_epoch: i32) -> Result<bool, PartitionError> {
        let s = self.lock_state();
        if !s.is_leader() || s.leader_epoch != leader_epoch {
            return Err(PartitionError::NotLeader);
        }
        if s.high_watermark > last_offset {
            return Ok(true);
        }
        if s.under_min_isr() {
            return Err(PartitionError::UnderMinIsr {
                isr: s.isr.len(),
                required: s.min_insync_replicas.max(1) as usize,
            });
        }
        Ok(false)
    }

    /// Waits until [`Self::replicated`] says the batch ending at
    /// `last_offset`, appended at `leader_epoch`, is committed, or fails:
    /// leadership moved ([`PartitionError::NotLeader`]), the ISR fell below
    /// min ISR, or `deadline` passed ([`PartitionError::TimedOut`]). Woken by
    /// high watermark moves and role changes, never by polling.
    pub async fn wait_replicated(
        &self,
        last_offset: i64,
        leader_epoch: i32,
        deadline: tokio::time::Instant,
    ) -> Result<(), PartitionError> {
        loop {
            let mut changed = self.subscribe();
            changed.borrow_and_update();
            if self.replicated(last_offset, leader_epoch)? {
                return Ok(());
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return Err(PartitionError::NotLeader) },
                _ = tokio::time::sleep_until(deadline) => return Err(PartitionError::TimedOut),
            }
        }
    }

    /// Waits until everything in the log when called is committed (the
    /// high watermark reaches today's log end) while this broker leads at
    /// `leader_epoch`: what a coordinator waits for before it answers, so
    /// that no answer rests on a record a new leader may not have.
    pub async fn wait_log_end_replicated(
        &self,
        leader_epoch: i32,
        deadline: tokio::time::Instant,
    ) -> Result<(), PartitionError> {
        let log_end = *self.log_end.borrow();
        if log_end <= 0 {
            return Ok(());
        }
        self.wait_replicated(log_end - 1, leader_epoch, deadline).await
    }

    /// `(ISR size, required)` when the ISR is smaller than
    /// `min(min.insync.replicas, replicas)`: acks=all writes are refused.
    pub fn under_min_isr(&self) -> Option<(usize, usize)> {
        let s = self.lock_state();
        s.under_min_isr().then(|| (s.isr.len(), s.min_insync_replicas.max(1) as usize))
    }

    /// Appends client (or coordinator) batches on the leader: validated,
    /// offsets assigned, stamped with the leader epoch, bytes written as
    /// received (the log stamps offsets into its copy of each header;
    /// `batches` itself, often a request buffer, is not changed).
    pub fn append(&self, batches: &[u8], origin: AppendOrigin, now_ms: i64) -> Result<AppendInfo, PartitionError> {
        self.append_at_epoch(batches, origin, now_ms).map(|(info, _)| info)
    }

    /// [`Self::append`], also returning the leader epoch the batches were
    /// written at (what an acks=all wait checks leadership against).
    pub fn append_at_epoch(
        &self,
        batches: &[u8],
        origin: AppendOrigin,
        now_ms: i64,
    ) -> Result<(AppendInfo, i32), PartitionError> {
        self.with_log(|log| {
            let mut state = self.lock_state();
            if !state.is_leader() {
                return Err(PartitionError::NotLeader);
            }
            let info = log.append_shared(batches, state.leader_epoch, origin, now_ms)?;
            // Published under the log lock, so two appends cannot publish out
            // of order; a retried batch (a duplicate) wrote nothing.
            if !info.duplicate {
                let leo = log.log_end_offset();
                let effects = state.on_leader_append(leo);
                drop(state);
                let rest = self.publish(effects);
                debug_assert!(rest.is_empty(), "an append asks for nothing but a high watermark: {rest:?}");
                self.log_end.send_replace(leo);
                return Ok((info, self.lock_state().leader_epoch));
            }
            let epoch = state.leader_epoch;
            Ok((info, epoch))
        })
    }

    /// Appends batches fetched from the leader as they are (offsets and
    /// leader epochs kept), then takes the leader's high watermark and log
    /// start offset as far as the local log reaches.
    pub fn append_replicated(
        &self,
        batches: &[u8],
        leader_high_watermark: i64,
        leader_log_start_offset: i64,
        now_ms: i64,
    ) -> Result<(), PartitionError> {
        self.with_log(|log| {
            if matches!(self.lock_state().role, super::state::Role::Leader) {
                return Err(PartitionError::NotLeader);
            }
            if !batches.is_empty() {
                log.append_replicated(batches, now_ms)?;
            }
            let leo = log.log_end_offset();
            if leader_log_start_offset > log.log_start_offset() && leader_log_start_offset <= leo {
                log.delete_records(leader_log_start_offset)?;
            }
            let effects = self.lock_state().on_follower_progress(leo, leader_high_watermark);
            self.publish(effects);
            self.log_end.send_replace(leo);
            Ok(())
        })
    }

    /// Cuts a follower's log where the leader's diverges: at the end of
    /// `epoch` as the leader knows it, or earlier where the local log's own
    /// copy of that epoch ends (KIP-101, KIP-279). Returns the new log end.
    pub fn truncate_diverging(&self, epoch: i32, end_offset: i64) -> Result<i64, PartitionError> {
        self.with_log(|log| {
            let local = log.end_offset_for_epoch(epoch);
            let to = super::state::truncation_offset((epoch, end_offset), local, log.log_start_offset());
            if to < log.log_end_offset() {
                tracing::info!(topic = %self.topic, partition = self.index, leader_epoch = epoch, leader_end = end_offset, to, "truncating to the leader's log");
            }
            // Also when nothing is cut (as Kafka): a leader-epoch entry this
            // replica wrote on becoming leader with nothing appended after it
            // must go, or every fetch names that epoch and diverges again.
            log.truncate_to(to)?;
            let leo = log.log_end_offset();
            let mut state = self.lock_state();
            let lowered = state.on_truncate(leo);
            drop(state);
            if lowered {
                tracing::warn!(topic = %self.topic, partition = self.index, log_end = leo, "truncated below the high watermark (an unclean leader election)");
                self.lower_high_watermark(leo);
            }
            self.log_end.send_replace(leo);
            Ok(leo)
        })
    }

    /// The leader's log is cut at `log_start_offset` beyond this follower's
    /// end (retention, DeleteRecords): the local log restarts empty there.
    pub fn restart_at(&self, log_start_offset: i64) -> Result<(), PartitionError> {
        self.with_log(|log| {
            log.truncate_fully_and_start_at(log_start_offset)?;
            if self.lock_state().on_truncate(log_start_offset) {
                self.lower_high_watermark(log_start_offset);
            }
            self.log_end.send_replace(log_start_offset);
            Ok(())
        })
    }

    /// The leader serves a follower's fetch: checks its epochs, answers a
    /// diverging log with where to truncate, else reads up to the log end
    /// and records the follower's progress (which may raise the high
    /// watermark and ask for an ISR expansion). With `hold_back` (the
    /// replica is throttled and the leader's quota used up) a follower out
    /// of the ISR gets no records this time; one in the ISR is never held back.
    #[allow(clippy::too_many_arguments)]
    pub fn read_for_follower(
        &self,
        replica: i32,
        broker_epoch: i64,
        fetch_offset: i64,
        log_start_offset: i64,
        last_fetched_epoch: i32,
        current_leader_epoch: i32,
        max_bytes: usize,
        hold_back: bool,
        now_ms: i64,
    ) -> Result<ReplicaRead, PartitionError> {
        self.check_leader_epoch(current_leader_epoch)?;
        let read = self.with_log(|log| {
            let mut state = self.lock_state();
            if !state.is_leader() {
                return Err(PartitionError::NotLeader);
            }
            if !state.replicas.contains(&replica) {
                return Err(PartitionError::NotLeader);
            }
            let leo = log.log_end_offset();
            let leader_end =
                if last_fetched_epoch >= 0 { log.end_offset_for_epoch(last_fetched_epoch) } else { (-1, -1) };
            match super::state::check_fetch_position(last_fetched_epoch, fetch_offset, leader_end) {
                FetchPosition::Valid => {}
                FetchPosition::Diverging { epoch, end_offset } => {
                    return Ok(ReplicaRead {
                        info: ReadInfo::default(),
                        offsets: Self::offsets_of(log, state.high_watermark),
                        diverging: Some((epoch, end_offset)),
                        effects: Vec::new(),
                    });
                }
                FetchPosition::OutOfRange => {
                    // Kafka answers OFFSET_OUT_OF_RANGE: the follower starts
                    // again from this log's start.
                    return Err(StorageError::OffsetOutOfRange {
                        offset: fetch_offset,
                        log_start_offset: log.log_start_offset(),
                        log_end_offset: leo,
                    }
                    .into());
                }
            }
            let info = if hold_back && !state.isr.contains(&replica) {
                ReadInfo::default()
            } else {
                log.read(fetch_offset, max_bytes, leo, true)?
            };
            let effects = state.on_follower_fetch(replica, fetch_offset, broker_epoch, now_ms);
            let log_start_moved = state.on_follower_log_start(replica, log_start_offset);
            let hw = state.high_watermark;
            drop(state);
            if log_start_moved {
                self.wake_waiters();
            }
            let effects = self.publish(effects);
            Ok(ReplicaRead { info, offsets: Self::offsets_of(log, hw), diverging: None, effects })
        })?;
        Ok(read)
    }

    /// Whether `replica` is in the committed ISR (as this broker's image has it).
    pub fn in_isr(&self, replica: i32) -> bool {
        self.lock_state().isr.contains(&replica)
    }

    /// Where a follower fetches from: (log end offset, the leader epoch of
    /// its last batch or -1, log start offset).
    pub fn fetch_position(&self) -> Result<(i64, i32, i64), PartitionError> {
        self.with_log(|log| Ok((log.log_end_offset(), log.latest_epoch().unwrap_or(-1), log.log_start_offset())))
    }

    /// Wakes whoever waits on the high watermark (acks=all produces, long
    /// polls) to look again: the role or the ISR changed.
    fn wake_waiters(&self) {
        self.high_watermark.send_modify(|_| ());
    }

    /// OffsetForLeaderEpoch: the largest epoch at or below `epoch` and where
    /// it ends in this leader's log.
    pub fn end_offset_for_epoch(&self, current_leader_epoch: i32, epoch: i32) -> Result<(i32, i64), PartitionError> {
        self.check_leader_epoch(current_leader_epoch)?;
        self.with_log(|log| {
            if !self.lock_state().is_leader() {
                return Err(PartitionError::NotLeader);
            }
            Ok(log.end_offset_for_epoch(epoch))
        })
    }

    /// Applies the partition's registration in a new image: a new role or
    /// leader epoch (a new leader records its epoch's start in the epoch
    /// cache before it takes a write). Returns what the driver must do.
    pub fn apply_registration(
        &self,
        registration: &crate::metadata::image::PartitionRegistration,
        now_ms: i64,
    ) -> Result<Vec<Effect>, PartitionError> {
        self.with_log(|log| {
            let mut state = self.lock_state();
            state.log_end_offset = log.log_end_offset();
            let effects = state.apply_registration(registration, now_ms);
            drop(state);
            for e in &effects {
                if let Effect::BecameLeader { leader_epoch, start_offset } = e {
                    log.assign_epoch(*leader_epoch, *start_offset)?;
                }
            }
            let rest = self.publish(effects);
            self.wake_waiters();
            Ok::<_, PartitionError>(rest)
        })
    }

    /// Followers not caught up for `lag_max_ms` leave the ISR.
    pub fn shrink_isr_if_lagging(&self, now_ms: i64, lag_max_ms: i64) -> Vec<Effect> {
        let effects = self.lock_state().shrink_if_lagging(now_ms, lag_max_ms);
        self.publish(effects)
    }

    /// Whether `proposal` is still this leader's pending ISR change.
    pub fn isr_change_pending(&self, proposal: &super::state::IsrProposal) -> bool {
        self.lock_state().is_pending(proposal)
    }

    /// The controller's answer to an ISR change this leader proposed
    /// (see [`super::state::IsrAnswer`]).
    pub fn isr_change_done(
        &self,
        proposal: &super::state::IsrProposal,
        answer: super::state::IsrAnswer,
    ) -> Vec<Effect> {
        use super::state::IsrAnswer;
        let mut state = self.lock_state();
        let effects = match answer {
            IsrAnswer::Committed { leader_epoch, partition_epoch, isr } => {
                state.proposal_committed(leader_epoch, partition_epoch, isr)
            }
            IsrAnswer::Refused => {
                state.proposal_failed(proposal);
                Vec::new()
            }
            IsrAnswer::Overtaken | IsrAnswer::Retry => Vec::new(),
        };
        drop(state);
        let rest = self.publish(effects);
        self.wake_waiters();
        rest
    }

    /// Publishes a higher watermark. It never moves backwards: a consumer
    /// that has seen an offset below it must keep seeing it.
    fn advance_high_watermark(&self, hw: i64) {
        self.high_watermark.send_if_modified(|current| {
            assert!(
                hw >= *current,
                "{}-{}: high watermark would move back from {current} to {hw}",
                self.topic,
                self.index
            );
            let moved = hw > *current;
            *current = hw;
            moved
        });
    }

    /// The one way a high watermark goes back: a follower of a leader
    /// elected uncleanly cut its log below it, and what was there is gone
    /// from the partition (Kafka does the same). Never on a leader.
    fn lower_high_watermark(&self, hw: i64) {
        self.high_watermark.send_if_modified(|current| {
            let lowered = hw < *current;
            *current = (*current).min(hw);
            lowered
        });
    }

    pub fn high_watermark(&self) -> i64 {
        *self.high_watermark.borrow()
    }

    pub fn offsets(&self) -> Result<PartitionOffsets, PartitionError> {
        self.with_log(|log| Ok::<_, PartitionError>(Self::offsets_of(log, *self.high_watermark.borrow())))
    }

    fn offsets_of(log: &Log, hw: i64) -> PartitionOffsets {
        PartitionOffsets {
            log_start_offset: log.log_start_offset(),
            high_watermark: hw,
            last_stable_offset: log.last_stable_offset(hw),
            log_end_offset: log.log_end_offset(),
        }
    }

    /// Reads whole batches from `offset`, bounded by the high watermark
    /// (read_uncommitted) or the last stable offset (read_committed, with the
    /// aborted transactions that overlap the range, for the client to skip).
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        read_committed: bool,
        min_one: bool,
    ) -> Result<(ReadInfo, PartitionOffsets, Vec<AbortedTxn>), PartitionError> {
        self.with_log(|log| {
            let offsets = Self::offsets_of(log, *self.high_watermark.borrow());
            let bound = if read_committed { offsets.last_stable_offset } else { offsets.high_watermark };
            let info = log.read(offset, max_bytes, bound, min_one)?;
            let aborted =
                if read_committed && info.bytes > 0 { log.aborted_transactions(offset, bound) } else { Vec::new() };
            Ok((info, offsets, aborted))
        })
    }

    /// Reads whole batches from `offset` up to the log end, committed or
    /// not: a coordinator loading the partition it now leads replays all of
    /// its log, as a new leader's log is what every follower will hold (its
    /// answers still wait for the high watermark).
    pub fn read_to_log_end(&self, offset: i64, max_bytes: usize) -> Result<ReadInfo, PartitionError> {
        self.with_log(|log| Ok(log.read(offset, max_bytes, log.log_end_offset(), true)?))
    }

    /// Producers with state on this partition (DescribeProducers).
    pub fn producers(&self) -> Result<Vec<ProducerInfo>, PartitionError> {
        self.with_log(|log| Ok::<_, PartitionError>(log.producers()))
    }

    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.high_watermark.subscribe()
    }

    /// Wakes on appends (followers' long polls).
    pub fn subscribe_log_end(&self) -> watch::Receiver<i64> {
        self.log_end.subscribe()
    }

    pub fn lookup_timestamp(&self, ts: i64) -> Result<Option<TimestampLookup>, PartitionError> {
        self.with_log(|log| Ok(log.lookup_timestamp(ts)?))
    }

    pub fn lookup_max_timestamp(&self) -> Result<Option<TimestampLookup>, PartitionError> {
        self.with_log(|log| Ok(log.lookup_max_timestamp()?))
    }

    /// Advances the log start offset (DeleteRecords). Returns the new low watermark.
    pub fn delete_records(&self, offset: i64) -> Result<i64, PartitionError> {
        self.with_log(|log| Ok(log.delete_records(offset)?))
    }

    /// The low watermark this broker, leading, knows of: the lowest log
    /// start offset among its own and its followers' on `alive` brokers.
    pub fn low_watermark(&self, alive: impl Fn(i32) -> bool) -> Result<i64, PartitionError> {
        self.with_log(|log| {
            let state = self.lock_state();
            if !state.is_leader() {
                return Err(PartitionError::NotLeader);
            }
            Ok(state.low_watermark(log.log_start_offset(), alive))
        })
    }

    /// Waits until the low watermark reaches `offset` (DeleteRecords is
    /// answered once every live replica deleted up to it, as in Kafka);
    /// the low watermark then, or [`PartitionError::TimedOut`] at `deadline`.
    /// Woken when a follower's log start moves, or the role changes.
    pub async fn wait_low_watermark(
        &self,
        offset: i64,
        alive: impl Fn(i32) -> bool,
        deadline: tokio::time::Instant,
    ) -> Result<i64, PartitionError> {
        loop {
            let mut changed = self.subscribe();
            changed.borrow_and_update();
            let low = self.low_watermark(&alive)?;
            if low >= offset {
                return Ok(low);
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return Err(PartitionError::NotLeader) },
                _ = tokio::time::sleep_until(deadline) => return Err(PartitionError::TimedOut),
            }
        }
    }

    pub fn is_compacted(&self) -> bool {
        self.compacted.load(Ordering::Relaxed)
    }

    /// One compaction pass if the log is compacted and dirty enough (or `force`).
    /// The expensive part (reading, building the key map, writing cleaned
    /// segments) runs without the log lock: sealed segments never change, and
    /// the install step checks that the segments it replaces are still there.
    pub fn clean(&self, now_ms: i64, force: bool) -> Result<Option<CleanStats>, PartitionError> {
        let Some(job) = self.with_log(|log| Ok::<_, PartitionError>(log.prepare_clean(now_ms, force)))? else {
            return Ok(None);
        };
        let cleaned = job.run()?;
        let stats = self.with_log(|log| Ok(log.install_clean(cleaned)?))?;
        Ok(Some(stats))
    }

    pub fn set_config(&self, log_config: LogConfig, min_insync_replicas: i32) -> Result<(), PartitionError> {
        self.min_insync_replicas.store(min_insync_replicas, Ordering::Relaxed);
        self.lock_state().min_insync_replicas = min_insync_replicas;
        self.compacted.store(log_config.cleanup_compact, Ordering::Relaxed);
        self.with_log(|log| {
            log.set_config(log_config);
            Ok(())
        })
    }

    /// Verifies the next cold segment that is due (see `Log::scrub_next`),
    /// reading without the log's lock; `pace` is called after each batch
    /// with its size (to bound the read rate; returning false abandons the
    /// job). Returns the bytes verified, 0 when nothing was due. Damage takes
    /// the partition offline.
    pub fn scrub(
        &self,
        now_ms: i64,
        interval_ms: i64,
        pace: &mut dyn FnMut(u64) -> bool,
    ) -> Result<u64, PartitionError> {
        let Some((base, job)) = self.with_log(|log| Ok::<_, PartitionError>(log.scrub_next(now_ms, interval_ms)))?
        else {
            return Ok(0);
        };
        match job.run(pace) {
            Ok(true) => {
                // A segment replaced meanwhile counts as nothing done, so the
                // caller moves on instead of picking the same job again.
                if !self.with_log(|log| Ok::<_, PartitionError>(log.finish_scrub(base, &job, now_ms)))? {
                    return Ok(0);
                }
                tracing::debug!(topic = %self.topic, partition = self.index, segment = %job.path().display(), bytes = job.bytes(), "scrubbed segment");
                Ok(job.bytes())
            }
            Ok(false) => Ok(0),
            Err(e @ StorageError::DamagedSegment { .. }) => {
                // A segment deleted or replaced meanwhile (retention, compaction) is no damage.
                let mut guard = self.lock();
                let Some(log) = guard.as_mut() else { return Err(PartitionError::Gone) };
                if log.scrub_next(now_ms, interval_ms).map(|(b, _)| b) == Some(base) {
                    return Err(self.take_offline(&e, log.dir()));
                }
                Ok(0)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Periodic housekeeping: flush when due, and retention when `retention`
    /// is set; with `checkpoint`, unflushed data is fsynced (without the
    /// log's lock) and the recovery point moved over it.
    pub fn maintain(&self, now_ms: i64, retention: bool, checkpoint: bool) -> Result<(), PartitionError> {
        if checkpoint {
            if let Some(plan) = self.with_log(|log| Ok::<_, PartitionError>(log.flush_plan()))? {
                match plan.sync() {
                    Ok(()) => {
                        self.with_log(|log| Ok(log.complete_flush(plan)?))?;
                    }
                    Err(e) => {
                        tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "background fsync failed; the recovery point stays")
                    }
                }
            }
        }
        // Write back rolled segments before taking the log for the rest, so a
        // produce never waits behind the fsync of a whole segment.
        for file in self.with_log(|log| Ok::<_, PartitionError>(log.rolled_segment_files()))? {
            if let Err(e) = file.sync_data() {
                tracing::warn!(topic = %self.topic, partition = self.index, error = %e, "fsync of a rolled segment failed; retried under the log lock");
            }
        }
        // Retention stops at the high watermark: a leader never cuts what a
        // follower still has to fetch, nor a follower past what is committed.
        let hw = self.high_watermark();
        self.with_log(|log| {
            log.flush_if_due(now_ms)?;
            log.expire_producers(now_ms);
            log.flush_rolled_segments()?;
            if retention {
                let deleted = log.enforce_retention(now_ms, hw)?;
                if deleted > 0 {
                    tracing::info!(topic = %self.topic, partition = self.index, deleted, log_start_offset = log.log_start_offset(), "retention deleted segments");
                }
            }
            Ok(())
        })
    }

    pub fn size_bytes(&self) -> u64 {
        self.lock().as_ref().map(|l| l.size_bytes()).unwrap_or(0)
    }

    /// Flushes and closes the log (clean shutdown).
    pub fn close(&self) -> Result<(), StorageError> {
        match self.lock().take() {
            Some(log) => log.close(),
            None => Ok(()),
        }
    }

    /// Removes the log from disk (topic deletion).
    pub fn delete(&self) -> Result<(), StorageError> {
        match self.lock().take() {
            Some(log) => log.delete(),
            None => Ok(()),
        }
    }
}
