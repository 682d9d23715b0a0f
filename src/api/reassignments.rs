//! AlterPartitionReassignments and ListPartitionReassignments
//! (`kafka-reassign-partitions`, `Admin.alterPartitionReassignments`):
//! reassignments are decided by the active controller
//! ([`crate::controller::reassignment`]) and answered once committed and
//! applied here; the list is read from this broker's metadata image. A
//! single node has one broker, so the only valid target is itself and no
//! reassignment is ever in progress.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::{error, RequestContext};
use crate::controller::core::{Reply, Request};
use crate::controller::reassignment::{self, ReassignmentResult};
use crate::metadata::image::PartitionRegistration;

pub async fn alter(
    ctx: &RequestContext,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let partitions: Vec<(String, i32, Option<Vec<i32>>)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                let target = p.replicas.as_ref().map(|r| r.iter().map(|b| b.0).collect());
                (t.name.0.to_string(), p.partition_index, target)
            })
        })
        .collect();
    // Version 0 has no such field: the replication factor may change.
    let allow_factor_change = ctx.version == 0 || req.allow_replication_factor_change;
    let results = match ctx.state.cluster() {
        None => single_node(ctx, &partitions, allow_factor_change),
        Some(cluster) => {
            let request = Request::AlterReassignments { partitions: partitions.clone(), allow_factor_change };
            let (code, message) = match cluster.submit(request).await {
                Ok(Reply::Reassigned(results)) => return answer(results, allow_factor_change),
                Ok(Reply::Error(e)) => error::controller_reply_code(&e),
                Ok(other) => (ResponseError::UnknownServerError.code(), format!("the controller answered {other:?}")),
                Err(e) => error::controller_code(&e),
            };
            return AlterPartitionReassignmentsResponse::default()
                .with_allow_replication_factor_change(allow_factor_change)
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(message)));
        }
    };
    answer(results, allow_factor_change)
}

/// The per-partition answers, grouped by topic in request order.
fn answer(results: Vec<ReassignmentResult>, allow_factor_change: bool) -> AlterPartitionReassignmentsResponse {
    let mut topics: Vec<ReassignableTopicResponse> = Vec::new();
    for r in results {
        let (code, message) = match &r.outcome {
            Ok(()) => (error::NONE, None),
            Err(e) => (error::reassignment_code(e), Some(StrBytes::from_string(e.to_string()))),
        };
        let partition = ReassignablePartitionResponse::default()
            .with_partition_index(r.partition)
            .with_error_code(code)
            .with_error_message(message);
        match topics.iter_mut().find(|t| t.name.0.as_str() == r.topic) {
            Some(t) => t.partitions.push(partition),
            None => topics.push(
                ReassignableTopicResponse::default()
                    .with_name(TopicName(StrBytes::from_string(r.topic)))
                    .with_partitions(vec![partition]),
            ),
        }
    }
    AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(allow_factor_change)
        .with_error_code(error::NONE)
        .with_responses(topics)
}

/// A single node's answers, by the controller's own rules applied to the
/// one-replica partitions it has (only itself is a registered broker).
fn single_node(
    ctx: &RequestContext,
    partitions: &[(String, i32, Option<Vec<i32>>)],
    allow_factor_change: bool,
) -> Vec<ReassignmentResult> {
    let me = ctx.state.config().node_id;
    partitions
        .iter()
        .map(|(topic, partition, target)| {
            let outcome = if ctx.state.replicas.partition(topic, *partition).is_none() {
                Err(reassignment::ReassignmentError::UnknownTopicOrPartition(topic.clone(), *partition))
            } else {
                let reg = PartitionRegistration::new(&[me], &[me], me);
                match target {
                    Some(target) => {
                        reassignment::start(&reg, target, allow_factor_change, |b| b == me, |b| b == me).map(|_| ())
                    }
                    None => reassignment::cancel(&reg, |b| b == me).map(|_| ()),
                }
            };
            ReassignmentResult { topic: topic.clone(), partition: *partition, outcome }
        })
        .collect()
}

pub fn list(ctx: &RequestContext, req: ListPartitionReassignmentsRequest) -> ListPartitionReassignmentsResponse {
    let Some(cluster) = ctx.state.cluster() else {
        return ListPartitionReassignmentsResponse::default().with_error_code(error::NONE);
    };
    let image = cluster.image();
    let ongoing = |p: i32, reg: &PartitionRegistration| {
        OngoingPartitionReassignment::default()
            .with_partition_index(p)
            .with_replicas(reg.replicas.iter().map(|b| BrokerId(*b)).collect())
            .with_adding_replicas(reg.adding_replicas.iter().map(|b| BrokerId(*b)).collect())
            .with_removing_replicas(reg.removing_replicas.iter().map(|b| BrokerId(*b)).collect())
    };
    let mut topics = Vec::new();
    match &req.topics {
        // Every reassignment in progress.
        None => {
            let mut named: Vec<_> = image.topics.values().collect();
            named.sort_by(|a, b| a.name.cmp(&b.name));
            for t in named {
                let partitions: Vec<_> = t
                    .partitions
                    .iter()
                    .filter(|(_, reg)| reg.is_reassigning())
                    .map(|(p, reg)| ongoing(*p, reg))
                    .collect();
                if !partitions.is_empty() {
                    topics.push(topic(&t.name, partitions));
                }
            }
        }
        // The named partitions that have one (others are left out, as in Kafka).
        Some(named) => {
            for t in named {
                let Some(image_topic) = image.topic(t.name.0.as_str()) else { continue };
                let partitions: Vec<_> = t
                    .partition_indexes
                    .iter()
                    .filter_map(|p| {
                        image_topic.partitions.get(p).filter(|reg| reg.is_reassigning()).map(|reg| ongoing(*p, reg))
                    })
                    .collect();
                if !partitions.is_empty() {
                    topics.push(topic(t.name.0.as_str(), partitions));
                }
            }
        }
    }
    ListPartitionReassignmentsResponse::default().with_error_code(error::NONE).with_topics(topics)
}

fn topic(name: &str, partitions: Vec<OngoingPartitionReassignment>) -> OngoingTopicReassignment {
    OngoingTopicReassignment::default()
        .with_name(TopicName(StrBytes::from_string(name.to_string())))
        .with_partitions(partitions)
}
