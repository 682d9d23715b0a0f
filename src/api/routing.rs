//! Which broker serves a partition, and what a client that asked the wrong
//! one is told: NOT_LEADER_OR_FOLLOWER with the leader this broker's image
//! knows (KIP-951: the current leader and its endpoint ride along on the
//! Produce and Fetch versions that carry them, so clients re-route without
//! a Metadata round trip).
//!
//! On a single node every hosted partition is served here.

use crate::broker::BrokerState;
use crate::cluster::Leadership;

/// A partition this broker does not serve to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotServed {
    pub code: i16,
    /// (leader id, leader epoch) when the cluster has the partition; the
    /// id is -1 while nobody leads it.
    pub leader: Option<(i32, i32)>,
}

/// `Ok` when this broker serves `topic`-`partition` to clients.
pub fn check(state: &BrokerState, topic: &str, partition: i32) -> Result<(), NotServed> {
    let Some(cluster) = state.cluster() else { return Ok(()) };
    match cluster.leadership(topic, partition) {
        Leadership::Here { .. } => Ok(()),
        Leadership::Elsewhere { leader, leader_epoch } => {
            Err(NotServed { code: super::error::not_leader_code(), leader: Some((leader, leader_epoch)) })
        }
        Leadership::Unknown => Err(NotServed { code: super::error::unknown_partition_code(), leader: None }),
    }
}

/// The topic name the cluster knows for `id` (for requests naming topics
/// by id that this broker hosts none of).
pub fn topic_name_for_id(state: &BrokerState, id: &uuid::Uuid) -> Option<String> {
    state.cluster().and_then(|c| c.image().topics.get(id).map(|t| t.name.clone()))
}

/// A broker's endpoint on `listener` (for KIP-951 node endpoints): (id, host, port, rack).
pub fn endpoints(state: &BrokerState, listener: &str, ids: &[i32]) -> Vec<(i32, String, u16, Option<String>)> {
    let Some(cluster) = state.cluster() else { return Vec::new() };
    let image = cluster.image();
    let mut out = Vec::new();
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        let Some(b) = image.brokers.get(&id) else { continue };
        let endpoint = b.endpoints.iter().find(|e| e.name == listener).or(b.endpoints.first());
        if let Some(e) = endpoint {
            out.push((id, e.host.clone(), e.port, b.rack.clone()));
        }
    }
    out
}

/// The registered, unfenced brokers with their endpoint on `listener`
/// (what Metadata and DescribeCluster list): (id, host, port, rack).
pub fn live_brokers(state: &BrokerState, listener: &str) -> Vec<(i32, String, u16, Option<String>)> {
    let Some(cluster) = state.cluster() else { return Vec::new() };
    let ids: Vec<i32> = cluster.image().brokers.values().filter(|b| !b.fenced).map(|b| b.id).collect();
    endpoints(state, listener, &ids)
}
