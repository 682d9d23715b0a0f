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
use super::state::{Effect, IsrProposal};
use super::ReplicaManager;
use crate::cluster::ClusterNode;
use crate::controller::core::{Reply, Request};
use crate::metadata::image::ClusterImage;

pub struct Replication {
    node: Arc<ClusterNode>,
    replicas: Arc<ReplicaManager>,
    fetchers: Arc<Fetchers>,
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
        let fetchers = Fetchers::new(node.clone(), listener, shutdown);
        Arc::new(Replication { node, replicas, fetchers, lag_max_ms })
    }

    /// Applies `image`'s registrations to every hosted partition (after the
    /// publisher has opened and removed logs for it).
    pub fn apply_image(&self, image: &ClusterImage) {
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

/// Sends one ISR change to the controller and gives the partition the answer.
async fn alter_isr(node: Arc<ClusterNode>, topic_id: Uuid, partition: Arc<Partition>, proposal: IsrProposal) {
    let request = Request::AlterPartition {
        broker_id: node.node_id,
        broker_epoch: node.broker_epoch(),
        topic_id,
        partition: partition.index,
        leader_epoch: proposal.leader_epoch,
        partition_epoch: proposal.partition_epoch,
        new_isr: proposal.isr.clone(),
    };
    tracing::info!(topic = %partition.topic, partition = partition.index, isr = ?proposal.isr, "proposing an ISR change");
    let committed = match node.submit(request).await {
        Ok(Reply::PartitionAltered { leader, leader_epoch, partition_epoch, isr }) if leader == node.node_id => {
            Some((leader_epoch, partition_epoch, isr))
        }
        Ok(other) => {
            tracing::info!(topic = %partition.topic, partition = partition.index, reply = ?other, "ISR change not made");
            None
        }
        Err(e) => {
            tracing::warn!(topic = %partition.topic, partition = partition.index, error = %e, "ISR change not sent");
            None
        }
    };
    // Whatever the answer, the next fetch or check proposes again if needed
    // (after a pause, so a controller that refuses is not asked in a loop).
    if committed.is_none() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rest = partition.isr_change_done(&proposal, committed);
    debug_assert!(rest.iter().all(|e| matches!(e, Effect::HighWatermark(_))));
}
