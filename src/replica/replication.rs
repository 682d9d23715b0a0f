//! The replication driver: the thin async side of [`super::state`]. It
//! applies each metadata image's partition registrations to the hosted
//! partitions, starts and stops followers' fetchers as roles change, sends
//! the leaders' ISR changes to the controller (AlterPartition, one in
//! flight per partition) and runs the periodic lagging-follower check.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use uuid::Uuid;

use super::fetcher::Fetchers;
use super::partition::Partition;
use super::state::{isr_answer, Effect, IsrAnswer, IsrProposal};
use super::throttle::Throttles;
use super::ReplicaManager;
use crate::cluster::ClusterNode;
use crate::controller::core::Request;
use crate::metadata::image::{ClusterImage, LeaderRecoveryState};

pub struct Replication {
    node: Arc<ClusterNode>,
    replicas: Arc<ReplicaManager>,
    fetchers: Arc<Fetchers>,
    /// Replication throttles (`kafka-reassign-partitions --throttle`),
    /// shared with the fetchers and the leader's replica-fetch handler.
    throttles: Arc<Throttles>,
    /// replica.lag.time.max.ms
    lag_max_ms: i64,
}

impl Replication {
    pub fn new(
        node: Arc<ClusterNode>,
        replicas: Arc<ReplicaManager>,
        listener: &str,
        lag_max_ms: i64,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Replication> {
        let throttles = Arc::new(Throttles::new(node.node_id));
        let fetchers = Fetchers::new(node.clone(), listener, throttles.clone(), shutdown);
        Arc::new(Replication { node, replicas, fetchers, throttles, lag_max_ms })
    }

    pub fn throttles(&self) -> &Throttles {
        &self.throttles
    }

    /// Applies `image`'s registrations to every hosted partition (after the
    /// publisher has opened and removed logs for it).
    pub fn apply_image(&self, image: &ClusterImage) {
        self.throttles.apply_image(image);
        let now = crate::util::now_ms();
        let topics = self.replicas.topics();
        for local in topics.by_name.values() {
            let Some(t) = image.topics.get(&local.id) else { continue };
            for p in &local.partitions {
                let Some(registration) = t.partitions.get(&p.index) else { continue };
                match p.apply_registration(registration, now) {
                    Ok(effects) => self.carry_out(local.id, p, effects),
                    Err(e) => {
                        tracing::warn!(topic = %local.name, partition = p.index, error = %e, "cannot apply the partition's registration")
                    }
                }
            }
        }
        self.fetchers.retain(|id, partition| {
            topics.by_id.get(id).and_then(|t| t.partition(partition.index)).is_some_and(|p| Arc::ptr_eq(p, partition))
        });
    }

    /// Carries out what a partition's step asked for.
    pub fn carry_out(&self, topic_id: Uuid, partition: &Arc<Partition>, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::BecameFollower { leader, leader_epoch } => {
                    tracing::info!(topic = %partition.topic, partition = partition.index, leader, leader_epoch, "following");
                    self.fetchers.follow(topic_id, partition.clone(), leader, leader_epoch);
                }
                Effect::BecameLeader { leader_epoch, start_offset } => {
                    tracing::info!(topic = %partition.topic, partition = partition.index, leader_epoch, start_offset, "leading");
                    self.fetchers.unfollow(topic_id, partition.index);
                }
                Effect::BecameOffline => self.fetchers.unfollow(topic_id, partition.index),
                Effect::AlterIsr(proposal) => {
                    tokio::spawn(alter_isr(self.node.clone(), topic_id, partition.clone(), proposal));
                }
                // Published by the partition itself.
                Effect::HighWatermark(_) => {}
            }
        }
    }

    /// Every `replica.lag.time.max.ms / 2` (as Kafka's isr-expiration task),
    /// followers that stopped catching up leave the ISRs this broker leads.
    pub async fn check_lagging(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let every = Duration::from_millis((self.lag_max_ms / 2).max(10) as u64);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = crate::server::listener::wait_shutdown(&mut shutdown) => return,
                _ = tick.tick() => {}
            }
            let now = crate::util::now_ms();
            for topic in self.replicas.topics().by_name.values() {
                for p in &topic.partitions {
                    let effects = p.shrink_isr_if_lagging(now, self.lag_max_ms);
                    self.carry_out(topic.id, p, effects);
                }
            }
        }
    }
}

/// Sends one ISR change to the controller and gives the partition the
/// answer; one left unanswered is sent again, after a pause, for as long as
/// it is still the partition's pending change.
async fn alter_isr(node: Arc<ClusterNode>, topic_id: Uuid, partition: Arc<Partition>, proposal: IsrProposal) {
    let request = Request::AlterPartition {
        broker_id: node.node_id,
        broker_epoch: node.broker_epoch(),
        topic_id,
        partition: partition.index,
        leader_epoch: proposal.leader_epoch,
        partition_epoch: proposal.partition_epoch,
        new_isr: proposal.isr.clone(),
        // As Kafka's brokers: a leader takes leadership as recovered, so
        // its first ISR change ends an unclean election's RECOVERING state.
        leader_recovery_state: LeaderRecoveryState::Recovered,
    };
    tracing::info!(topic = %partition.topic, partition = partition.index, isr = ?proposal.isr, "proposing an ISR change");
    loop {
        let reply = match node.submit(request.clone()).await {
            Ok(reply) => Some(reply),
            Err(e) => {
                tracing::warn!(topic = %partition.topic, partition = partition.index, error = %e, "ISR change not sent");
                None
            }
        };
        let answer = isr_answer(node.node_id, reply.as_ref());
        if answer != IsrAnswer::Retry && !matches!(answer, IsrAnswer::Committed { .. }) {
            tracing::info!(topic = %partition.topic, partition = partition.index, reply = ?reply, ?answer, "ISR change not made");
        }
        // A refusal is proposed again by the next fetch or check, after a
        // pause, so a controller that refuses is not asked in a loop.
        if matches!(answer, IsrAnswer::Refused | IsrAnswer::Retry) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if answer == IsrAnswer::Retry {
            if partition.isr_change_pending(&proposal) {
                continue;
            }
            return;
        }
        let rest = partition.isr_change_done(&proposal, answer);
        debug_assert!(rest.iter().all(|e| matches!(e, Effect::HighWatermark(_))));
        return;
    }
}
