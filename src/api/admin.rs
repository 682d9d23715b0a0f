//! Topic administration and cluster description: CreateTopics, DeleteTopics,
//! CreatePartitions, DeleteRecords, DescribeCluster.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::{error, str_bytes, RequestContext};
use crate::replica::{ReplicaManager, TopicError};
use crate::topic_config::{self, TOPIC_CONFIGS};

fn message(e: &TopicError) -> Option<StrBytes> {
    Some(StrBytes::from_string(e.to_string()))
}

pub fn create_topics(ctx: &RequestContext, req: CreateTopicsRequest) -> CreateTopicsResponse {
    let node = ctx.state.config().node_id;
    let mut seen = std::collections::HashSet::new();
    let duplicates: std::collections::HashSet<String> =
        req.topics.iter().filter(|t| !seen.insert(t.name.0.to_string())).map(|t| t.name.0.to_string()).collect();
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let result = CreatableTopicResult::default().with_name(t.name.clone()).with_topic_config_error_code(0);
            if duplicates.contains(&name) {
                return result
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(Some(str_bytes("topic appears more than once in the request")))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1);
            }
            let created = create_one(ctx, node, &t, req.validate_only);
            match created {
                Ok((id, partitions, overrides)) => {
                    let mut r = result
                        .with_error_code(0)
                        .with_topic_id(id)
                        .with_num_partitions(partitions)
                        .with_replication_factor(1);
                    if ctx.version >= 5 {
                        r = r.with_configs(Some(described_configs(ctx, &overrides)));
                    }
                    r
                }
                Err(e) => result
                    .with_error_code(error::topic_code(&e))
                    .with_error_message(message(&e))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1),
            }
        })
        .collect();
    CreateTopicsResponse::default().with_topics(topics)
}

/// A CreateTopics manual assignment as each partition's replicas in
/// partition order (`None`: the topic gives counts instead). The request
/// must not give both, and its partition indexes must be 0..n without gaps.
pub(super) fn manual_assignment(
    t: &kafka_protocol::messages::create_topics_request::CreatableTopic,
) -> Result<Option<Vec<Vec<i32>>>, TopicError> {
    if t.assignments.is_empty() {
        return Ok(None);
    }
    if t.num_partitions != -1 || t.replication_factor != -1 {
        return Err(TopicError::InvalidRequest(
            "give either assignments or num_partitions/replication_factor, not both".into(),
        ));
    }
    let mut sorted: Vec<_> = t.assignments.iter().collect();
    sorted.sort_by_key(|a| a.partition_index);
    if sorted.iter().enumerate().any(|(i, a)| a.partition_index != i as i32) {
        return Err(TopicError::InvalidReplicaAssignment("partition indexes must be 0..n without gaps".into()));
    }
    Ok(Some(sorted.iter().map(|a| a.broker_ids.iter().map(|b| b.0).collect()).collect()))
}

fn create_one(
    ctx: &RequestContext,
    node: i32,
    t: &kafka_protocol::messages::create_topics_request::CreatableTopic,
    validate_only: bool,
) -> Result<(Uuid, i32, BTreeMap<String, String>), TopicError> {
    let mut partitions = t.num_partitions;
    let mut replication_factor = t.replication_factor;
    if let Some(assignment) = manual_assignment(t)? {
        for (p, replicas) in assignment.iter().enumerate() {
            if replicas.as_slice() != [node] {
                return Err(TopicError::InvalidReplicaAssignment(format!(
                    "partition {p} is assigned to {replicas:?}; the only broker is {node}"
                )));
            }
        }
        partitions = assignment.len() as i32;
        replication_factor = 1;
    }
    let configs: Vec<(String, Option<String>)> =
        t.configs.iter().map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string()))).collect();
    let overrides = ReplicaManager::validate_configs(&configs)?;
    let topic = ctx.state.replicas.create_topic(
        t.name.0.as_str(),
        partitions,
        replication_factor,
        overrides.clone(),
        validate_only,
    )?;
    let count = if validate_only {
        if partitions == -1 {
            ctx.state.config().num_partitions
        } else {
            partitions
        }
    } else {
        topic.partition_count
    };
    Ok((topic.id, count, overrides))
}

/// Effective configs of a new topic, for CreateTopics v5+.
pub(super) fn described_configs(
    ctx: &RequestContext,
    overrides: &BTreeMap<String, String>,
) -> Vec<CreatableTopicConfigs> {
    let dynamic = ctx.state.replicas.dynamic_configs();
    TOPIC_CONFIGS
        .iter()
        .map(|key| {
            let (value, source) = topic_config::topic_value(ctx.state.config(), &dynamic, overrides, key);
            CreatableTopicConfigs::default()
                .with_name(str_bytes(key.name))
                .with_value(Some(StrBytes::from_string(value)))
                .with_read_only(false)
                .with_config_source(source as i8)
                .with_is_sensitive(false)
        })
        .collect()
}

pub fn delete_topics(ctx: &RequestContext, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
    // v6+ names topics in `topics` (by name or id); earlier versions in `topic_names`.
    let targets: Vec<(Option<String>, Uuid)> = if ctx.version >= 6 {
        req.topics.iter().map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id)).collect()
    } else {
        req.topic_names.iter().map(|n| (Some(n.0.to_string()), Uuid::nil())).collect()
    };
    let responses = targets
        .into_iter()
        .map(|(name, id)| {
            let resolved: Result<String, TopicError> = match (&name, id) {
                (_, id) if id != Uuid::nil() => {
                    ctx.state.replicas.topic_by_id(&id).map(|t| t.name.clone()).ok_or(TopicError::UnknownId(id))
                }
                (Some(n), _) => Ok(n.clone()),
                (None, _) => Err(TopicError::InvalidRequest("neither a topic name nor a topic id".into())),
            };
            let outcome = resolved.and_then(|n| {
                if ctx.state.replicas.topic(&n).is_some_and(|t| t.internal) {
                    return Err(TopicError::InvalidRequest(format!("internal topic {n} cannot be deleted")));
                }
                ctx.state.replicas.delete_topic(&n).map(|id| (n, id))
            });
            let base = DeletableTopicResult::default();
            match outcome {
                Ok((n, deleted_id)) => {
                    base.with_name(Some(TopicName(str_bytes(&n)))).with_topic_id(deleted_id).with_error_code(0)
                }
                Err(e) => base
                    .with_name(name.map(|n| TopicName(StrBytes::from_string(n))))
                    .with_topic_id(id)
                    .with_error_code(error::topic_code(&e))
                    .with_error_message(message(&e)),
            }
        })
        .collect();
    DeleteTopicsResponse::default().with_responses(responses)
}

pub fn create_partitions(ctx: &RequestContext, req: CreatePartitionsRequest) -> CreatePartitionsResponse {
    let node = ctx.state.config().node_id;
    let results = req
        .topics
        .into_iter()
        .map(|t| {
            let outcome = (|| {
                if let Some(assignments) = &t.assignments {
                    if assignments.iter().any(|a| a.broker_ids.len() != 1 || a.broker_ids[0].0 != node) {
                        return Err(TopicError::InvalidReplicaAssignment(format!("the only broker is {node}")));
                    }
                }
                ctx.state.replicas.create_partitions(t.name.0.as_str(), t.count, req.validate_only)
            })();
            let base = CreatePartitionsTopicResult::default().with_name(t.name);
            match outcome {
                Ok(()) => base.with_error_code(0),
                Err(e) => base.with_error_code(error::topic_code(&e)).with_error_message(message(&e)),
            }
        })
        .collect();
    CreatePartitionsResponse::default().with_results(results)
}

/// DeleteRecords: each partition's log is cut here at once, and the answer
/// waits (up to the request's timeout) until every live replica cut it too,
/// as Kafka's delayed DeleteRecords does: the low watermark answered is the
/// lowest log start among the leader and its followers on unfenced brokers,
/// and a partition whose followers did not get there in time is answered
/// REQUEST_TIMED_OUT with the low watermark reached.
pub async fn delete_records(ctx: &RequestContext, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(req.timeout_ms.max(0) as u64);
    let mut topics = Vec::new();
    for t in req.topics {
        let topic = ctx.state.replicas.topic(t.name.0.as_str());
        let mut waits = Vec::new();
        for p in t.partitions {
            let base = DeleteRecordsPartitionResult::default().with_partition_index(p.partition_index);
            let cut = match delete_locally(ctx, topic.as_deref(), t.name.0.as_str(), p.partition_index, p.offset) {
                Ok(cut) => cut,
                Err((code, low)) => {
                    waits.push(futures_util::future::Either::Left(std::future::ready(
                        base.with_error_code(code).with_low_watermark(low),
                    )));
                    continue;
                }
            };
            waits.push(futures_util::future::Either::Right(async move {
                let (partition, target) = cut;
                let alive = |id: i32| broker_alive(ctx, id);
                match partition.wait_low_watermark(target, alive, deadline).await {
                    Ok(low) => base.with_error_code(0).with_low_watermark(low),
                    Err(e) => {
                        let low = partition.low_watermark(alive).unwrap_or(-1);
                        base.with_error_code(error::partition_code(&e)).with_low_watermark(low)
                    }
                }
            }));
        }
        let partitions = futures_util::future::join_all(waits).await;
        topics.push(DeleteRecordsTopicResult::default().with_name(t.name).with_partitions(partitions));
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

/// Whether broker `id` counts for the low watermark: registered and not
/// fenced (Kafka's "alive broker").
fn broker_alive(ctx: &RequestContext, id: i32) -> bool {
    ctx.state.cluster().is_some_and(|node| node.image().brokers.get(&id).is_some_and(|b| !b.fenced))
}

/// Cuts partition `index` of `topic` at `offset` (-1: the high watermark)
/// here, its leader; the partition and the offset to wait for, or the
/// (error code, low watermark) to answer at once.
fn delete_locally(
    ctx: &RequestContext,
    topic: Option<&crate::replica::Topic>,
    name: &str,
    index: i32,
    offset: i64,
) -> Result<(std::sync::Arc<crate::replica::Partition>, i64), (i16, i64)> {
    if let Err(n) = super::routing::check(&ctx.state, name, index) {
        return Err((n.code, -1));
    }
    let Some(partition) = topic.and_then(|t| t.partition(index)) else {
        return Err((ResponseError::UnknownTopicOrPartition.code(), -1));
    };
    let offsets = partition.offsets().map_err(|e| (error::partition_code(&e), -1))?;
    // -1 means "up to the high watermark"; beyond it is out of range.
    let target = if offset == -1 { offsets.high_watermark } else { offset };
    if target < 0 || target > offsets.high_watermark {
        return Err((ResponseError::OffsetOutOfRange.code(), offsets.log_start_offset));
    }
    if target > offsets.log_start_offset {
        partition.delete_records(target).map_err(|e| (error::partition_code(&e), -1))?;
    }
    Ok((partition.clone(), target))
}

pub fn describe_cluster(ctx: &RequestContext, req: DescribeClusterRequest) -> DescribeClusterResponse {
    let config = ctx.state.config();
    // endpoint_type 1 = brokers; 2 = controllers, which a combined single node also is.
    if ctx.version >= 1 && req.endpoint_type != 1 && req.endpoint_type != 2 {
        return DescribeClusterResponse::default()
            .with_error_code(ResponseError::UnsupportedEndpointType.code())
            .with_endpoint_type(req.endpoint_type)
            .with_cluster_id(str_bytes(&ctx.state.replicas.cluster_id))
            .with_controller_id(BrokerId(-1));
    }
    if let Some(cluster) = ctx.state.cluster() {
        let image = cluster.image();
        let brokers: Vec<DescribeClusterBroker> = if ctx.version >= 1 && req.endpoint_type == 2 {
            // Controllers: the voters, at their CONTROLLER listener.
            config
                .quorum
                .iter()
                .flat_map(|q| q.voters.iter())
                .map(|v| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(v.id))
                        .with_host(str_bytes(&v.host))
                        .with_port(v.port as i32)
                        .with_rack(None)
                })
                .collect()
        } else {
            image
                .brokers
                .values()
                .filter_map(|b| {
                    let e = b.endpoints.iter().find(|e| e.name == ctx.listener).or(b.endpoints.first())?;
                    Some(
                        DescribeClusterBroker::default()
                            .with_broker_id(BrokerId(b.id))
                            .with_host(str_bytes(&e.host))
                            .with_port(e.port as i32)
                            .with_rack(b.rack.as_deref().map(str_bytes))
                            .with_is_fenced(b.fenced),
                    )
                })
                .collect()
        };
        return DescribeClusterResponse::default()
            .with_error_code(0)
            .with_endpoint_type(if ctx.version >= 1 { req.endpoint_type } else { 1 })
            .with_cluster_id(str_bytes(&ctx.state.cluster_id()))
            .with_controller_id(BrokerId(if ctx.version >= 1 && req.endpoint_type == 2 {
                // Controllers: the active one, whether or not it is a broker too.
                cluster.quorum().leader.unwrap_or(-1)
            } else {
                cluster.controller_id_for_clients()
            }))
            .with_brokers(brokers)
            .with_cluster_authorized_operations(i32::MIN);
    }
    let advertised = config.advertised_for(&ctx.listener);
    let broker = DescribeClusterBroker::default()
        .with_broker_id(BrokerId(config.node_id))
        .with_host(str_bytes(&advertised.host))
        .with_port(advertised.port as i32)
        .with_rack(None)
        .with_is_fenced(false);
    DescribeClusterResponse::default()
        .with_error_code(0)
        .with_endpoint_type(if ctx.version >= 1 { req.endpoint_type } else { 1 })
        .with_cluster_id(str_bytes(&ctx.state.replicas.cluster_id))
        .with_controller_id(BrokerId(config.node_id))
        .with_brokers(vec![broker])
        .with_cluster_authorized_operations(i32::MIN)
}
