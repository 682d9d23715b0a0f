//! Applies the metadata image to this broker's logs: every partition whose
//! replicas include this broker is opened (created when new), every local
//! partition the image no longer places here is removed, and a topic
//! recreated under a new id replaces the old one's logs.
//!
//! Removal is only safe against an image at least as new as this process's
//! own registration (an older one, replayed while the quorum catches up,
//! may lack topics that exist): the publisher waits for it before the
//! first pass.

use std::sync::Arc;

use super::ClusterNode;
use crate::broker::BrokerState;
use crate::group::OFFSETS_TOPIC;
use crate::metadata::image::ClusterImage;
use crate::replica::{ReplicaManager, TopicError};
use crate::txn::TXN_TOPIC;

/// Applies every new image until the controlled shutdown is over, and the
/// image it ended with: the shutdown's move of leadership away must reach
/// the partitions here, or acks=all produce requests waiting on them would
/// wait out their timeout instead of being answered NOT_LEADER_OR_FOLLOWER.
pub async fn run(node: Arc<ClusterNode>, state: Arc<BrokerState>) {
    let replicas = state.replicas.clone();
    let mut images = node.image_watch();
    let me = node.node_id;
    let incarnation = node.incarnation_id;
    let mut over = node.controlled_shutdown_over();
    let mut last = false;
    loop {
        let current = images.borrow_and_update().clone();
        if let Err(e) = node.record_cluster_id() {
            tracing::error!(node = me, error = %e, "cannot record the cluster id in meta.properties");
        }
        if current.brokers.get(&me).is_some_and(|b| b.incarnation_id == incarnation) {
            // Coordinators learn what they are about to lead before the
            // (slow) log opening, so they answer LOAD_IN_PROGRESS meanwhile.
            if let Some(t) = current.topic(OFFSETS_TOPIC) {
                state.groups().expect_leading(t.partitions.len() as i32, led_in_image(t, me));
            }
            if let Some(t) = current.topic(TXN_TOPIC) {
                state.txns().expect_leading(t.partitions.len() as i32, led_in_image(t, me));
            }
            let r = replicas.clone();
            let image = current.clone();
            let result = tokio::task::spawn_blocking(move || apply(&r, &image, me)).await;
            // Roles and epochs follow the image once the logs are there.
            if let Some(replication) = state.replication() {
                replication.apply_image(&current);
            }
            // Coordinator shards follow the `__consumer_offsets` partitions hosted here.
            if let Some(t) = current.topic(OFFSETS_TOPIC) {
                let hosted = led_here(&replicas, OFFSETS_TOPIC);
                state.groups().host(&hosted, t.partitions.len() as i32);
            }
            if let Some(t) = current.topic(TXN_TOPIC) {
                let hosted = led_here(&replicas, TXN_TOPIC);
                state.txns().host(&hosted, t.partitions.len() as i32);
            }
            match result {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(node = me, offset = current.offset, error = %e, "cannot apply the metadata image to the local logs")
                }
                Err(e) => tracing::error!(node = me, error = %e, "applying the metadata image panicked"),
            }
        }
        if last {
            return;
        }
        tokio::select! {
            _ = over.wait_for(|o| *o) => last = true,
            changed = images.changed() => if changed.is_err() { return },
        }
    }
}

/// The partitions of `topic` the image has this broker leading.
fn led_in_image(topic: &crate::metadata::image::TopicImage, me: i32) -> std::collections::HashSet<i32> {
    topic.partitions.iter().filter(|(_, p)| p.leader == me).map(|(i, _)| *i).collect()
}

/// The partitions of `topic` this broker leads: coordinators run there only.
fn led_here(replicas: &ReplicaManager, topic: &str) -> Vec<Arc<crate::replica::Partition>> {
    replicas.topic(topic).map(|t| t.partitions.iter().filter(|p| p.is_leader()).cloned().collect()).unwrap_or_default()
}

/// One pass: makes the local topics match what `image` places on broker `me`.
/// Every topic is tried; the first error is returned.
pub fn apply(replicas: &ReplicaManager, image: &ClusterImage, me: i32) -> Result<(), TopicError> {
    let mut first_error = None;
    replicas.set_catalog(image.topics.values().map(|t| (t.name.clone(), t.partitions.len() as i32)).collect());
    // Dynamic broker configs: the cluster default and this broker's own.
    let dynamic = replicas.dynamic_configs();
    let mine = image.broker_configs.get(&me).cloned().unwrap_or_default();
    if dynamic.cluster_default != image.broker_default_configs {
        if let Err(e) = replicas.set_dynamic_broker_configs(true, image.broker_default_configs.clone()) {
            first_error.get_or_insert(e);
        }
    }
    if dynamic.this_broker != mine {
        if let Err(e) = replicas.set_dynamic_broker_configs(false, mine) {
            first_error.get_or_insert(e);
        }
    }
    let no_configs = Default::default();
    for topic in image.topics.values() {
        let hosted: Vec<i32> =
            topic.partitions.iter().filter(|(_, p)| p.replicas.contains(&me)).map(|(index, _)| *index).collect();
        let result = if hosted.is_empty() {
            match replicas.topic(&topic.name) {
                Some(_) => replicas.remove_topic(&topic.name).map(|_| ()),
                None => Ok(()),
            }
        } else {
            let configs = image.topic_configs.get(&topic.name).unwrap_or(&no_configs);
            replicas.host_topic(&topic.name, topic.id, topic.partitions.len() as i32, &hosted, configs)
        };
        if let Err(e) = result {
            first_error.get_or_insert(e);
        }
    }
    for local in replicas.topics().by_name.values() {
        if !image.topics.contains_key(&local.id) {
            tracing::info!(topic = %local.name, id = %local.id, "topic deleted in the cluster; removing its logs");
            if let Err(e) = replicas.remove_topic(&local.name) {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}
