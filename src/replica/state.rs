//! A partition's replication state, as a core that does no I/O: its role,
//! leader epoch, partition epoch, log end offset, high watermark, ISR and
//! (on the leader) each follower's progress, with the invariants asserted
//! after every step.
//!
//! The rules are Kafka 4.1's:
//! - the high watermark is the lowest log end offset over the "maximal"
//!   ISR: the committed ISR plus a member whose addition is in flight (a
//!   pending expansion counts at once, a pending shrink only once committed);
//! - it moves only while the ISR holds at least
//!   `min(min.insync.replicas, replicas)` members (KIP-966), and never back;
//! - a follower is caught up when it fetches from at or beyond the leader's
//!   log end offset as it was at its previous fetch; one that has not been
//!   for `replica.lag.time.max.ms` leaves the ISR, and one whose log end
//!   reaches the high watermark and the current leader epoch's start offset
//!   comes back;
//! - ISR changes go to the controller one at a time (AlterPartition) and
//!   take effect when the image carries them; one the controller's answer
//!   says was overtaken stays pending until the image moves on, and one
//!   left unanswered is asked again (see [`isr_answer`]).
//!
//! [`Partition`](super::Partition) holds one of these under a lock and
//! carries out what the steps return; `tests/replication_sim.rs` drives the
//! same code from a seed.

use std::collections::BTreeMap;

use crate::controller::core::{ControllerError, Reply};
use crate::metadata::image::{PartitionRegistration, NO_LEADER};

/// What a leader makes of the controller's answer to its ISR change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsrAnswer {
    /// Adopt it ([`PartitionState::proposal_committed`]).
    Committed { leader_epoch: i32, partition_epoch: i32, isr: Vec<i32> },
    /// Another change to the partition committed, perhaps built on this
    /// one (the expansion that completed a reassignment and moved the
    /// leadership away, say). The proposal stays pending, so a member it
    /// adds still holds the high watermark back, until the image carrying
    /// that change arrives and ends it, as Kafka waits for metadata after
    /// FENCED_LEADER_EPOCH and INVALID_UPDATE_VERSION. Dropping it instead
    /// would let this leader commit, with its old ISR, records that a new
    /// leader taken from the new ISR does not have.
    Overtaken,
    /// Refused without being applied: no longer pending
    /// ([`PartitionState::proposal_failed`]), proposed again when needed.
    Refused,
    /// Unanswered (timed out, no controller reachable) or answered by a
    /// controller behind this leader: it may yet apply, so it stays pending
    /// and is asked again.
    Retry,
}

/// Kafka's reading of an AlterPartition answer to broker `me`.
pub fn isr_answer(me: i32, reply: Option<&Reply>) -> IsrAnswer {
    match reply {
        None => IsrAnswer::Retry,
        Some(Reply::PartitionAltered { leader, leader_epoch, partition_epoch, isr }) if *leader == me => {
            IsrAnswer::Committed { leader_epoch: *leader_epoch, partition_epoch: *partition_epoch, isr: isr.clone() }
        }
        Some(Reply::PartitionAltered { .. }) => IsrAnswer::Overtaken,
        Some(Reply::Error(e)) => match e {
            ControllerError::FencedLeaderEpoch { .. }
            | ControllerError::StalePartitionEpoch { .. }
            | ControllerError::NotLeader { .. }
            | ControllerError::UnknownTopicId(_)
            | ControllerError::UnknownPartition { .. } => IsrAnswer::Overtaken,
            ControllerError::EpochsAhead { .. } => IsrAnswer::Retry,
            _ => IsrAnswer::Refused,
        },
        Some(_) => IsrAnswer::Refused,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// This broker accepts writes at `leader_epoch`.
    Leader,
    /// It copies the leader's log.
    Follower { leader: i32 },
    /// Nobody leads the partition (or this broker is not a replica).
    Offline,
}

/// What the leader knows of one follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerProgress {
    /// The follower's log end offset (its last fetch offset); -1 until it fetches.
    pub log_end_offset: i64,
    /// When it was last caught up (its fetch reached the leader's log end
    /// as of its previous fetch).
    pub last_caught_up_ms: i64,
    /// The leader's log end offset and the time at its last fetch.
    last_fetch_leader_leo: i64,
    last_fetch_ms: i64,
    /// The broker epoch its fetches carried (a restarted follower is new).
    pub broker_epoch: i64,
    /// The log start offset its last fetch carried; -1 until it fetches.
    pub log_start_offset: i64,
}

impl FollowerProgress {
    /// A follower not heard from yet, counted caught up at `caught_up_ms`.
    fn unknown(caught_up_ms: i64) -> FollowerProgress {
        FollowerProgress {
            log_end_offset: -1,
            last_caught_up_ms: caught_up_ms,
            last_fetch_leader_leo: -1,
            last_fetch_ms: -1,
            broker_epoch: -1,
            log_start_offset: -1,
        }
    }
}

/// An ISR change this leader asked the controller for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrProposal {
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub isr: Vec<i32>,
}

/// What a step asks the caller to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Record (epoch, start offset) in the leader-epoch cache before any write.
    BecameLeader { leader_epoch: i32, start_offset: i64 },
    /// Fetch from `leader` (again) at `leader_epoch`; truncation is decided by
    /// the fetch's diverging-epoch answer.
    BecameFollower { leader: i32, leader_epoch: i32 },
    /// Stop fetching and refuse writes.
    BecameOffline,
    /// The high watermark moved: wake waiting produces and fetches.
    HighWatermark(i64),
    /// Send this ISR change to the controller.
    AlterIsr(IsrProposal),
}

#[derive(Debug, Clone)]
pub struct PartitionState {
    /// This broker.
    pub me: i32,
    pub role: Role,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub replicas: Vec<i32>,
    /// The ISR as committed in the metadata image.
    pub isr: Vec<i32>,
    /// An ISR change sent to the controller and not yet in the image.
    pub pending: Option<IsrProposal>,
    pub log_end_offset: i64,
    pub high_watermark: i64,
    pub min_insync_replicas: i32,
    /// The log end offset when this broker became leader at `leader_epoch`:
    /// a follower rejoins the ISR only once it has everything before it.
    pub leader_epoch_start_offset: i64,
    pub followers: BTreeMap<i32, FollowerProgress>,
}

impl PartitionState {
    /// The state of a partition just opened, before the image says who leads
    /// it. `high_watermark` is the checkpointed one (at most the log end).
    pub fn new(me: i32, log_end_offset: i64, high_watermark: i64, min_insync_replicas: i32) -> PartitionState {
        PartitionState {
            me,
            role: Role::Offline,
            leader_epoch: -1,
            partition_epoch: -1,
            replicas: vec![],
            isr: vec![],
            pending: None,
            log_end_offset,
            high_watermark: high_watermark.clamp(0, log_end_offset.max(0)),
            min_insync_replicas,
            leader_epoch_start_offset: log_end_offset,
            followers: BTreeMap::new(),
        }
    }

    /// A single node's partition: it leads at epoch 0 with itself as the ISR.
    pub fn single_node(log_end_offset: i64, min_insync_replicas: i32) -> PartitionState {
        let mut s = PartitionState::new(0, log_end_offset, log_end_offset, min_insync_replicas);
        s.role = Role::Leader;
        s.leader_epoch = 0;
        s.partition_epoch = 0;
        s.replicas = vec![0];
        s.isr = vec![0];
        s
    }

    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }

    /// The ISR the high watermark waits for: the committed ISR plus a member
    /// being added (a member being removed still counts until committed).
    pub fn maximal_isr(&self) -> Vec<i32> {
        let mut out = self.isr.clone();
        if let Some(p) = &self.pending {
            for r in &p.isr {
                if !out.contains(r) {
                    out.push(*r);
                }
            }
        }
        out
    }

    /// `min(min.insync.replicas, replicas)`: the ISR size below which the
    /// high watermark stands still (KIP-966).
    pub fn required_isr(&self) -> usize {
        (self.min_insync_replicas.max(1) as usize).min(self.replicas.len().max(1))
    }

    /// Whether acks=all writes are refused: the ISR is smaller than
    /// `min.insync.replicas` itself (as in Kafka, a topic with fewer
    /// replicas than that can never take an acks=all write).
    pub fn under_min_isr(&self) -> bool {
        self.isr.len() < self.min_insync_replicas.max(1) as usize
    }

    /// Applies the partition's registration from a new metadata image.
    pub fn apply_registration(&mut self, reg: &PartitionRegistration, now_ms: i64) -> Vec<Effect> {
        let mut effects = Vec::new();
        let hosted = reg.replicas.contains(&self.me);
        let new_role = if !hosted || reg.leader == NO_LEADER {
            Role::Offline
        } else if reg.leader == self.me {
            Role::Leader
        } else {
            Role::Follower { leader: reg.leader }
        };
        // An image older than what this partition has seen changes nothing.
        if reg.leader_epoch < self.leader_epoch
            || (reg.leader_epoch == self.leader_epoch && reg.partition_epoch < self.partition_epoch)
        {
            return effects;
        }
        let new_epoch = reg.leader_epoch != self.leader_epoch || new_role != self.role;
        self.replicas = reg.replicas.clone();
        self.isr = reg.isr.clone();
        self.partition_epoch = reg.partition_epoch;
        // A committed change (ours or the controller's) ends what was pending.
        if self.pending.as_ref().is_some_and(|p| p.partition_epoch < reg.partition_epoch || new_epoch) {
            self.pending = None;
        }
        if new_epoch {
            self.leader_epoch = reg.leader_epoch;
            self.role = new_role;
            match new_role {
                Role::Leader => {
                    self.leader_epoch_start_offset = self.log_end_offset;
                    // Kafka resets followers: LEO unknown, ISR members
                    // caught up now (they get a full lag time to fetch).
                    self.followers = self
                        .replicas
                        .iter()
                        .filter(|r| **r != self.me)
                        .map(|r| (*r, FollowerProgress::unknown(if self.isr.contains(r) { now_ms } else { -1 })))
                        .collect();
                    effects.push(Effect::BecameLeader {
                        leader_epoch: self.leader_epoch,
                        start_offset: self.log_end_offset,
                    });
                }
                Role::Follower { leader } => {
                    self.followers.clear();
                    effects.push(Effect::BecameFollower { leader, leader_epoch: self.leader_epoch });
                }
                Role::Offline => {
                    self.followers.clear();
                    effects.push(Effect::BecameOffline);
                }
            }
        } else if self.role == Role::Leader {
            // Replicas added by a reassignment need progress entries.
            for r in self.replicas.clone() {
                if r != self.me {
                    self.followers.entry(r).or_insert(FollowerProgress::unknown(-1));
                }
            }
            self.followers.retain(|r, _| reg.replicas.contains(r));
        }
        if self.role == Role::Leader {
            effects.extend(self.maybe_advance_hw());
        }
        self.check();
        effects
    }

    /// The leader appended: its log end offset is now `log_end_offset`.
    pub fn on_leader_append(&mut self, log_end_offset: i64) -> Vec<Effect> {
        debug_assert!(self.is_leader(), "append on a partition that is not led here");
        self.log_end_offset = log_end_offset;
        let effects = self.maybe_advance_hw();
        self.check();
        effects
    }

    /// A follower fetched from `fetch_offset` (its log end offset). Returns
    /// the effects: a higher watermark, an ISR expansion to propose.
    pub fn on_follower_fetch(
        &mut self,
        replica: i32,
        fetch_offset: i64,
        broker_epoch: i64,
        now_ms: i64,
    ) -> Vec<Effect> {
        let leo = self.log_end_offset;
        let Some(p) = self.followers.get_mut(&replica) else { return Vec::new() };
        if broker_epoch >= 0 {
            p.broker_epoch = broker_epoch;
        }
        if fetch_offset >= leo {
            p.last_caught_up_ms = now_ms;
        } else if p.last_fetch_leader_leo >= 0 && fetch_offset >= p.last_fetch_leader_leo {
            p.last_caught_up_ms = p.last_caught_up_ms.max(p.last_fetch_ms);
        }
        p.log_end_offset = fetch_offset.min(leo);
        p.last_fetch_leader_leo = leo;
        p.last_fetch_ms = now_ms;
        let mut effects = self.maybe_expand_isr(replica);
        effects.extend(self.maybe_advance_hw());
        self.check();
        effects
    }

    /// A follower's fetch said its log starts at `log_start_offset`; whether
    /// that moved (DeleteRecords waits on it).
    pub fn on_follower_log_start(&mut self, replica: i32, log_start_offset: i64) -> bool {
        let Some(p) = self.followers.get_mut(&replica) else { return false };
        let moved = p.log_start_offset != log_start_offset;
        p.log_start_offset = log_start_offset;
        moved
    }

    /// Kafka's low watermark: the lowest log start offset among this
    /// leader's (`leader_log_start`) and its followers' on `alive` brokers
    /// (unfenced ones). A follower that has not fetched yet holds it at -1.
    pub fn low_watermark(&self, leader_log_start: i64, alive: impl Fn(i32) -> bool) -> i64 {
        self.followers
            .iter()
            .filter(|(id, _)| **id != self.me && self.replicas.contains(id) && alive(**id))
            .map(|(_, p)| p.log_start_offset)
            .fold(leader_log_start, i64::min)
    }

    /// A follower's log end offset (the leader itself: its own).
    fn replica_leo(&self, replica: i32) -> i64 {
        if replica == self.me {
            return self.log_end_offset;
        }
        self.followers.get(&replica).map_or(-1, |p| p.log_end_offset)
    }

    fn maybe_expand_isr(&mut self, replica: i32) -> Vec<Effect> {
        if self.pending.is_some() || self.isr.contains(&replica) {
            return Vec::new();
        }
        let leo = self.replica_leo(replica);
        if leo < self.high_watermark || leo < self.leader_epoch_start_offset {
            return Vec::new();
        }
        let mut isr = self.isr.clone();
        isr.push(replica);
        isr.sort_by_key(|r| self.replicas.iter().position(|x| x == r));
        self.propose(isr)
    }

    /// Periodic check: followers not caught up for `lag_max_ms` leave the ISR.
    pub fn shrink_if_lagging(&mut self, now_ms: i64, lag_max_ms: i64) -> Vec<Effect> {
        if !self.is_leader() || self.pending.is_some() {
            return Vec::new();
        }
        let lagging: Vec<i32> = self
            .isr
            .iter()
            .copied()
            .filter(|r| *r != self.me)
            .filter(|r| self.followers.get(r).is_none_or(|p| now_ms - p.last_caught_up_ms > lag_max_ms))
            .collect();
        if lagging.is_empty() {
            return Vec::new();
        }
        let isr: Vec<i32> = self.isr.iter().copied().filter(|r| !lagging.contains(r)).collect();
        self.propose(isr)
    }

    fn propose(&mut self, isr: Vec<i32>) -> Vec<Effect> {
        let proposal = IsrProposal { leader_epoch: self.leader_epoch, partition_epoch: self.partition_epoch, isr };
        self.pending = Some(proposal.clone());
        let mut effects = vec![Effect::AlterIsr(proposal)];
        effects.extend(self.maybe_advance_hw());
        effects
    }

    /// Whether `proposal` is still the one pending (an unanswered one is
    /// asked again only while it is).
    pub fn is_pending(&self, proposal: &IsrProposal) -> bool {
        self.pending.as_ref() == Some(proposal)
    }

    /// The controller refused `proposal` without applying it: it is no
    /// longer pending, so the next check may propose again.
    pub fn proposal_failed(&mut self, proposal: &IsrProposal) {
        if self.pending.as_ref() == Some(proposal) {
            self.pending = None;
        }
    }

    /// The controller accepted an ISR change: adopt it now (the image will
    /// carry the same), unless this broker has moved on.
    pub fn proposal_committed(&mut self, leader_epoch: i32, partition_epoch: i32, isr: Vec<i32>) -> Vec<Effect> {
        if leader_epoch != self.leader_epoch || partition_epoch <= self.partition_epoch {
            return Vec::new();
        }
        self.isr = isr;
        self.partition_epoch = partition_epoch;
        self.pending = None;
        let effects = if self.is_leader() { self.maybe_advance_hw() } else { Vec::new() };
        self.check();
        effects
    }

    /// Raises the high watermark to the lowest log end offset of the maximal
    /// ISR, when the ISR is large enough.
    fn maybe_advance_hw(&mut self) -> Vec<Effect> {
        if !self.is_leader() || self.isr.len() < self.required_isr() {
            return Vec::new();
        }
        let lowest = self.maximal_isr().iter().map(|r| self.replica_leo(*r)).min().unwrap_or(self.log_end_offset);
        if lowest > self.high_watermark {
            self.high_watermark = lowest;
            vec![Effect::HighWatermark(lowest)]
        } else {
            Vec::new()
        }
    }

    /// A follower appended what it fetched and heard the leader's high
    /// watermark: its own is the lower of that and its log end.
    pub fn on_follower_progress(&mut self, log_end_offset: i64, leader_high_watermark: i64) -> Vec<Effect> {
        self.log_end_offset = log_end_offset;
        let hw = leader_high_watermark.min(log_end_offset);
        let effects = if hw > self.high_watermark {
            self.high_watermark = hw;
            vec![Effect::HighWatermark(hw)]
        } else {
            Vec::new()
        };
        self.check();
        effects
    }

    /// A follower truncated its log to `log_end_offset` (a diverging epoch).
    /// The high watermark follows only if it was above (which a clean
    /// election never causes: committed offsets are on every ISR member).
    pub fn on_truncate(&mut self, log_end_offset: i64) -> bool {
        self.log_end_offset = log_end_offset;
        let lowered = self.high_watermark > log_end_offset;
        if lowered {
            self.high_watermark = log_end_offset;
        }
        self.check();
        lowered
    }

    /// The invariants every step keeps.
    fn check(&self) {
        assert!(
            self.high_watermark <= self.log_end_offset.max(0),
            "high watermark {} above log end {}",
            self.high_watermark,
            self.log_end_offset
        );
        if self.role == Role::Leader {
            assert!(self.isr.contains(&self.me), "leader {} not in ISR {:?}", self.me, self.isr);
            assert!(self.replicas.contains(&self.me), "leader {} not a replica {:?}", self.me, self.replicas);
            for r in self.maximal_isr() {
                if r != self.me && self.replica_leo(r) >= 0 {
                    assert!(self.replica_leo(r) <= self.log_end_offset, "follower {r} ahead of the leader");
                }
            }
        }
        assert!(
            self.isr.iter().all(|r| self.replicas.contains(r)),
            "ISR {:?} outside replicas {:?}",
            self.isr,
            self.replicas
        );
    }
}

/// How a leader judges a follower's fetch position (KIP-320).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchPosition {
    /// Read from the fetch offset.
    Valid,
    /// The follower's log differs from the leader's from here: it must
    /// truncate to (epoch, end offset) before fetching again.
    Diverging { epoch: i32, end_offset: i64 },
    /// The leader has no epoch at or below the follower's last one: the
    /// follower must start again from the leader's log start.
    OutOfRange,
}

/// `leader_end_for_last_epoch` is the leader's `end_offset_for_epoch` of
/// the follower's last fetched epoch (-1 when it sent none).
pub fn check_fetch_position(
    last_fetched_epoch: i32,
    fetch_offset: i64,
    leader_end_for_last_epoch: (i32, i64),
) -> FetchPosition {
    if last_fetched_epoch < 0 {
        return FetchPosition::Valid;
    }
    let (epoch, end_offset) = leader_end_for_last_epoch;
    if epoch < 0 || end_offset < 0 {
        FetchPosition::OutOfRange
    } else if epoch < last_fetched_epoch || end_offset < fetch_offset {
        FetchPosition::Diverging { epoch, end_offset }
    } else {
        FetchPosition::Valid
    }
}

/// Where a follower cuts its log on a diverging-epoch answer (KIP-279):
/// `leader` is the leader's (epoch, end offset), `local_end_for_leader_epoch`
/// the follower's own `end_offset_for_epoch` of that epoch. If the follower
/// has the epoch, the lower of the two ends; if not, where its own older
/// epochs end (the next fetch names that older epoch: another round).
/// Never below the log start, never to the local high watermark.
pub fn truncation_offset(leader: (i32, i64), local_end_for_leader_epoch: (i32, i64), log_start_offset: i64) -> i64 {
    let (leader_epoch, leader_end) = leader;
    let (local_epoch, local_end) = local_end_for_leader_epoch;
    if leader_epoch < 0 || leader_end < 0 {
        return log_start_offset;
    }
    if local_epoch == leader_epoch {
        leader_end.min(local_end)
    } else {
        leader_end.min(local_end.max(log_start_offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(
        replicas: &[i32],
        isr: &[i32],
        leader: i32,
        leader_epoch: i32,
        partition_epoch: i32,
    ) -> PartitionRegistration {
        PartitionRegistration {
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            leader,
            leader_epoch,
            partition_epoch,
            adding_replicas: vec![],
            removing_replicas: vec![],
            elr: vec![],
            last_known_elr: vec![],
            leader_recovery_state: Default::default(),
        }
    }

    fn hw(effects: &[Effect]) -> Option<i64> {
        effects.iter().find_map(|e| match e {
            Effect::HighWatermark(h) => Some(*h),
            _ => None,
        })
    }

    fn alter(effects: &[Effect]) -> Option<IsrProposal> {
        effects.iter().find_map(|e| match e {
            Effect::AlterIsr(p) => Some(p.clone()),
            _ => None,
        })
    }

    fn leader_of_three(min_isr: i32) -> PartitionState {
        let mut s = PartitionState::new(1, 0, 0, min_isr);
        let e = s.apply_registration(&reg(&[1, 2, 3], &[1, 2, 3], 1, 0, 0), 0);
        assert_eq!(e, vec![Effect::BecameLeader { leader_epoch: 0, start_offset: 0 }]);
        s
    }

    /// Goal: the low watermark is the lowest log start among the leader and
    /// its followers on live brokers; one not fetched yet holds it at -1.
    #[test]
    fn low_watermark_is_the_lowest_live_log_start() {
        let mut s = leader_of_three(2);
        assert_eq!(s.low_watermark(50, |_| true), -1, "followers have not fetched");
        assert!(s.on_follower_log_start(2, 50));
        assert!(!s.on_follower_log_start(2, 50), "not moved");
        assert_eq!(s.low_watermark(50, |_| true), -1, "3 has not fetched");
        assert_eq!(s.low_watermark(50, |b| b != 3), 50, "3 is not alive");
        s.on_follower_log_start(3, 40);
        assert_eq!(s.low_watermark(50, |_| true), 40);
        assert_eq!(s.low_watermark(30, |_| true), 30, "the leader's own counts");
    }

    /// Goal: the high watermark is the lowest log end over the ISR, moves
    /// only as followers fetch, and never back.
    #[test]
    fn high_watermark_is_the_lowest_isr_log_end() {
        let mut s = leader_of_three(2);
        assert_eq!(hw(&s.on_leader_append(10)), None, "followers have fetched nothing yet");
        assert_eq!(hw(&s.on_follower_fetch(2, 10, 5, 1)), None, "3 has not fetched");
        assert_eq!(hw(&s.on_follower_fetch(3, 4, 6, 1)), Some(4));
        assert_eq!(hw(&s.on_follower_fetch(3, 10, 6, 2)), Some(10));
        s.on_leader_append(20);
        assert_eq!(hw(&s.on_follower_fetch(2, 15, 5, 3)), None, "3 is still at 10");
        assert_eq!(s.high_watermark, 10);
    }

    /// Goal: a lagging follower leaves the ISR (one change in flight), the
    /// pending shrink still holds the high watermark back, the committed
    /// one releases it, and below min ISR it stands still.
    #[test]
    fn lagging_follower_is_removed_and_min_isr_freezes_the_high_watermark() {
        let mut s = leader_of_three(2);
        s.on_leader_append(10);
        s.on_follower_fetch(2, 10, 5, 100);
        assert_eq!(s.high_watermark, 0, "3 never fetched");
        let e = s.shrink_if_lagging(30_001, 30_000);
        let p = alter(&e).expect("3 is dropped");
        assert_eq!(p.isr, vec![1, 2], "2 caught up at 100 stays");
        assert_eq!(s.high_watermark, 0, "a pending shrink does not count yet");
        assert!(s.shrink_if_lagging(40_000, 30_000).is_empty(), "one change in flight");
        assert_eq!(hw(&s.proposal_committed(0, 1, vec![1, 2])), Some(10));
        // Now 2 lags too: ISR {1} < min ISR 2, the high watermark stands still.
        let p = alter(&s.shrink_if_lagging(80_000, 30_000)).unwrap();
        assert_eq!(p.isr, vec![1]);
        s.proposal_committed(0, 2, vec![1]);
        assert!(s.under_min_isr());
        assert_eq!(hw(&s.on_leader_append(30)), None);
        assert_eq!(s.high_watermark, 10);
    }

    /// Goal: a follower rejoins once it reaches the high watermark and the
    /// leader epoch's start; a pending expansion counts for the high
    /// watermark at once.
    #[test]
    fn caught_up_follower_rejoins_and_counts_at_once() {
        let mut s = PartitionState::new(1, 50, 50, 1);
        s.apply_registration(&reg(&[1, 2], &[1], 1, 3, 7), 0);
        assert_eq!(s.leader_epoch_start_offset, 50);
        s.on_leader_append(60);
        assert_eq!(s.high_watermark, 60, "ISR {{1}} meets min ISR 1");
        assert_eq!(alter(&s.on_follower_fetch(2, 40, 9, 1)), None, "below the high watermark");
        let e = s.on_follower_fetch(2, 60, 9, 2);
        assert_eq!(alter(&e).unwrap().isr, vec![1, 2]);
        s.on_leader_append(70);
        assert_eq!(s.high_watermark, 60, "the pending member holds it at its log end");
        assert_eq!(hw(&s.on_follower_fetch(2, 70, 9, 3)), Some(70));
    }

    /// Goal: an older image changes nothing; a new leader epoch makes a
    /// follower, then a leader with fresh follower progress.
    #[test]
    fn roles_follow_the_image_and_old_images_are_ignored() {
        let mut s = PartitionState::new(2, 5, 5, 2);
        let e = s.apply_registration(&reg(&[1, 2, 3], &[1, 2, 3], 1, 4, 9), 0);
        assert_eq!(e, vec![Effect::BecameFollower { leader: 1, leader_epoch: 4 }]);
        assert!(s.apply_registration(&reg(&[1, 2, 3], &[1, 2, 3], 1, 3, 8), 0).is_empty());
        assert_eq!(s.leader_epoch, 4);
        s.on_follower_progress(8, 7);
        assert_eq!(s.high_watermark, 7);
        let e = s.apply_registration(&reg(&[1, 2, 3], &[2, 3], 2, 5, 10), 10);
        assert_eq!(e[0], Effect::BecameLeader { leader_epoch: 5, start_offset: 8 });
        assert_eq!(s.high_watermark, 7, "a new leader's followers have not fetched");
        let e = s.apply_registration(&reg(&[1, 2, 3], &[2, 3], NO_LEADER, 6, 11), 20);
        assert_eq!(e, vec![Effect::BecameOffline]);
    }
}
