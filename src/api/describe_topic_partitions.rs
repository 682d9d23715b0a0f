//! DescribeTopicPartitions (KIP-966; what Kafka 4.1's `Admin.describeTopics`
//! and `kafka-topics --describe` use): Metadata's view of each topic's
//! partitions ([`super::metadata::describe_topic`]), paged by a partition
//! limit and a cursor as Kafka pages it.
//!
//! Topics are answered in name order: the named ones (an unknown one with
//! UNKNOWN_TOPIC_OR_PARTITION), or every topic when none is named. At most
//! `min(ResponsePartitionLimit, 2000)` partitions go in one response; when
//! more are left, `NextCursor` names the first of them and the client asks
//! again from there. Each partition carries its eligible leader replicas
//! and last known ELR from the metadata image (KIP-966; both empty on a
//! single node, which has no replicas to elect).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{BrokerId, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName};
use uuid::Uuid;

use super::{metadata, str_bytes, RequestContext};

/// Kafka's `max.request.partition.size.limit` default: the most partitions
/// one response carries whatever the request asks.
pub const MAX_PARTITIONS_PER_RESPONSE: i32 = 2000;

/// Kafka's sentinel for "authorized operations not requested".
const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

pub fn handle(ctx: &RequestContext, req: DescribeTopicPartitionsRequest) -> DescribeTopicPartitionsResponse {
    let all = req.topics.is_empty();
    let mut names: Vec<String> =
        if all { metadata::topic_names(ctx) } else { req.topics.iter().map(|t| t.name.0.to_string()).collect() };
    names.sort();
    names.dedup();
    let (start_topic, start_partition) = match &req.cursor {
        Some(c) => (Some(c.topic_name.0.to_string()), c.partition_index.max(0)),
        None => (None, 0),
    };
    if let Some(topic) = &start_topic {
        // Kafka: a cursor must point into the topics asked for.
        if !all && !names.contains(topic) {
            let error = DescribeTopicPartitionsResponseTopic::default()
                .with_error_code(ResponseError::InvalidRequest.code())
                .with_name(Some(TopicName(str_bytes(topic))))
                .with_topic_id(Uuid::nil())
                .with_topic_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED);
            return DescribeTopicPartitionsResponse::default().with_topics(vec![error]);
        }
    }
    let image = ctx.state.cluster().map(|c| c.image());
    let ids = |v: &[i32]| v.iter().map(|b| BrokerId(*b)).collect::<Vec<_>>();
    let mut budget = req.response_partition_limit.clamp(1, MAX_PARTITIONS_PER_RESPONSE) as usize;
    let mut topics = Vec::new();
    let mut next_cursor = None;
    for name in names.iter().filter(|n| start_topic.as_ref().is_none_or(|s| *n >= s)) {
        let from = if start_topic.as_deref() == Some(name.as_str()) { start_partition } else { 0 };
        let Some(described) = metadata::describe_topic(ctx, name) else {
            if budget == 0 {
                next_cursor = Some(cursor(name, 0));
                break;
            }
            topics.push(
                DescribeTopicPartitionsResponseTopic::default()
                    .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                    .with_name(Some(TopicName(str_bytes(name))))
                    .with_topic_id(Uuid::nil())
                    .with_topic_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED),
            );
            continue;
        };
        let rest: Vec<_> = described.partitions.into_iter().filter(|p| p.partition_index >= from).collect();
        if budget == 0 {
            if let Some(first) = rest.first() {
                next_cursor = Some(cursor(name, first.partition_index));
                break;
            }
        }
        let taken = rest.len().min(budget);
        budget -= taken;
        if let Some(cut) = rest.get(taken) {
            next_cursor = Some(cursor(name, cut.partition_index));
        }
        let partitions = rest
            .into_iter()
            .take(taken)
            .map(|p| {
                let reg = image.as_ref().and_then(|i| i.partition(name, p.partition_index));
                let (elr, last_known) = reg.map_or((vec![], vec![]), |r| (ids(&r.elr), ids(&r.last_known_elr)));
                DescribeTopicPartitionsResponsePartition::default()
                    .with_error_code(p.error_code)
                    .with_partition_index(p.partition_index)
                    .with_leader_id(p.leader_id)
                    .with_leader_epoch(p.leader_epoch)
                    .with_replica_nodes(p.replica_nodes)
                    .with_isr_nodes(p.isr_nodes)
                    .with_eligible_leader_replicas(Some(elr))
                    .with_last_known_elr(Some(last_known))
                    .with_offline_replicas(p.offline_replicas)
            })
            .collect();
        topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_error_code(0)
                .with_name(described.name)
                .with_topic_id(described.topic_id)
                .with_is_internal(described.is_internal)
                .with_partitions(partitions)
                .with_topic_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED),
        );
        if next_cursor.is_some() {
            break;
        }
    }
    DescribeTopicPartitionsResponse::default().with_topics(topics).with_next_cursor(next_cursor)
}

fn cursor(topic: &str, partition: i32) -> Cursor {
    Cursor::default().with_topic_name(TopicName(str_bytes(topic))).with_partition_index(partition)
}
