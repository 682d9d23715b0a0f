//! ElectLeaders (`kafka-leader-election`, `Admin.electLeaders`): preferred
//! or unclean leader elections, decided by the active controller
//! ([`crate::controller::core`]) and answered once committed and applied
//! here. A single node leads every partition it has with its only replica,
//! so no election is ever needed there.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::{error, RequestContext};
use crate::controller::core::{ElectionError, ElectionResult, ElectionType, Reply, Request};

pub async fn handle(ctx: &RequestContext, req: ElectLeadersRequest) -> ElectLeadersResponse {
    let named: Option<Vec<(String, i32)>> = req
        .topic_partitions
        .as_ref()
        .map(|topics| topics.iter().flat_map(|t| t.partitions.iter().map(|p| (t.topic.0.to_string(), *p))).collect());
    // Version 0 has no election type: it is a preferred election.
    let election = match req.election_type {
        _ if ctx.version == 0 => ElectionType::Preferred,
        0 => ElectionType::Preferred,
        1 => ElectionType::Unclean,
        other => {
            let message = format!("unknown election type {other} (0 is PREFERRED, 1 is UNCLEAN)");
            return refused(ctx, named.as_deref(), ResponseError::InvalidRequest.code(), message);
        }
    };
    let results = match ctx.state.cluster() {
        None => single_node(ctx, named.as_deref()),
        Some(cluster) => match cluster.submit(Request::ElectLeaders { election, partitions: named.clone() }).await {
            Ok(Reply::LeadersElected(results)) => results,
            Ok(Reply::Error(e)) => {
                let (code, message) = error::controller_reply_code(&e);
                return refused(ctx, named.as_deref(), code, message);
            }
            Ok(other) => {
                let message = format!("the controller answered {other:?}");
                return refused(ctx, named.as_deref(), ResponseError::UnknownServerError.code(), message);
            }
            Err(e) => {
                let (code, message) = error::controller_code(&e);
                return refused(ctx, named.as_deref(), code, message);
            }
        },
    };
    ElectLeadersResponse::default().with_error_code(error::NONE).with_replica_election_results(grouped(
        results.into_iter().map(|r| {
            let (code, message) = match &r.outcome {
                Ok(()) => (error::NONE, None),
                Err(e) => (error::election_code(e), Some(e.to_string())),
            };
            (r.topic, r.partition, code, message)
        }),
    ))
}

/// A single node's answer: each named partition it has needs no election
/// (its only replica leads it); for all partitions the answer is empty,
/// as Kafka leaves out those whose election is not needed.
fn single_node(ctx: &RequestContext, named: Option<&[(String, i32)]>) -> Vec<ElectionResult> {
    named
        .unwrap_or_default()
        .iter()
        .map(|(topic, partition)| {
            let outcome = if ctx.state.replicas.partition(topic, *partition).is_some() {
                Err(ElectionError::ElectionNotNeeded)
            } else {
                Err(ElectionError::UnknownTopicOrPartition(topic.clone(), *partition))
            };
            ElectionResult { topic: topic.clone(), partition: *partition, outcome }
        })
        .collect()
}

/// The whole request refused with `code`: at the top level (version 1 on)
/// and for every partition named.
fn refused(ctx: &RequestContext, named: Option<&[(String, i32)]>, code: i16, message: String) -> ElectLeadersResponse {
    let partitions = named.unwrap_or_default().iter().map(|(t, p)| (t.clone(), *p, code, Some(message.clone())));
    let response = ElectLeadersResponse::default().with_replica_election_results(grouped(partitions));
    if ctx.version >= 1 {
        response.with_error_code(code)
    } else {
        response
    }
}

/// Per-partition outcomes grouped by topic, in the order topics first appear.
fn grouped(partitions: impl Iterator<Item = (String, i32, i16, Option<String>)>) -> Vec<ReplicaElectionResult> {
    let mut out: Vec<ReplicaElectionResult> = Vec::new();
    for (topic, partition, code, message) in partitions {
        let result = PartitionResult::default()
            .with_partition_id(partition)
            .with_error_code(code)
            .with_error_message(message.map(StrBytes::from_string));
        match out.iter_mut().find(|r| r.topic.0.as_str() == topic) {
            Some(r) => r.partition_result.push(result),
            None => out.push(
                ReplicaElectionResult::default()
                    .with_topic(TopicName(StrBytes::from_string(topic)))
                    .with_partition_result(vec![result]),
            ),
        }
    }
    out
}
