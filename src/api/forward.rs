//! Admin requests in a multi-node cluster: checked here, then forwarded to
//! the active controller (wherever it runs) and answered once the record is
//! committed and this broker has applied it, so a Metadata request that
//! follows sees the change.

use std::collections::HashSet;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::{error, str_bytes, RequestContext};
use crate::controller::core::{Reply, Request};
use crate::metadata::placement;
use crate::replica::{validate_topic_name, ReplicaManager, TopicError};

/// A refusal: (Kafka error code, message).
type Refusal = (i16, String);

fn topic_refusal(e: TopicError) -> Refusal {
    (error::topic_code(&e), e.to_string())
}

/// What a controller request came back as, as a refusal.
fn refusal(outcome: Result<Reply, crate::controller::driver::DriverError>) -> Result<Reply, Refusal> {
    match outcome {
        Ok(Reply::Error(e)) => Err(error::controller_reply_code(&e)),
        Ok(reply) => Ok(reply),
        Err(e) => Err(error::controller_code(&e)),
    }
}

pub async fn create_topics(ctx: &RequestContext, req: CreateTopicsRequest) -> CreateTopicsResponse {
    let mut seen = HashSet::new();
    let duplicates: HashSet<String> =
        req.topics.iter().filter(|t| !seen.insert(t.name.0.to_string())).map(|t| t.name.0.to_string()).collect();
    let mut results = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let result = CreatableTopicResult::default().with_name(t.name.clone()).with_topic_config_error_code(0);
        let outcome = if duplicates.contains(t.name.0.as_str()) {
            Err((ResponseError::InvalidRequest.code(), "topic appears more than once in the request".to_string()))
        } else {
            create_one(ctx, t, req.validate_only).await
        };
        results.push(match outcome {
            Ok((id, partitions, overrides)) => {
                let mut r = result
                    .with_error_code(0)
                    .with_topic_id(id)
                    .with_num_partitions(partitions)
                    .with_replication_factor(1);
                if ctx.version >= 5 {
                    r = r.with_configs(Some(super::admin::described_configs(ctx, &overrides)));
                }
                r
            }
            Err((code, message)) => result
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(message)))
                .with_num_partitions(-1)
                .with_replication_factor(-1),
        });
    }
    CreateTopicsResponse::default().with_topics(results)
}

async fn create_one(
    ctx: &RequestContext,
    t: &kafka_protocol::messages::create_topics_request::CreatableTopic,
    validate_only: bool,
) -> Result<(Uuid, i32, std::collections::BTreeMap<String, String>), Refusal> {
    let config = ctx.state.config();
    let cluster = ctx.state.cluster().expect("forwarding runs in a cluster");
    let name = t.name.0.as_str();
    validate_topic_name(name).map_err(topic_refusal)?;
    let manual = super::admin::manual_assignment(t).map_err(topic_refusal)?;
    if let Some(assignment) = &manual {
        // Checked here against this broker's image for validate_only and an
        // early answer; the controller checks again against its own.
        let image = cluster.image();
        placement::check_assignment(assignment, None, |b| image.brokers.contains_key(&b))
            .map_err(|e| topic_refusal(TopicError::InvalidReplicaAssignment(e.to_string())))?;
    }
    let (partitions, replication_factor) = match &manual {
        Some(assignment) => (assignment.len() as i32, assignment[0].len() as i16),
        None => (
            if t.num_partitions == -1 { config.num_partitions } else { t.num_partitions },
            if t.replication_factor == -1 { config.default_replication_factor } else { t.replication_factor },
        ),
    };
    if partitions <= 0 {
        return Err(topic_refusal(TopicError::InvalidPartitions(format!(
            "number of partitions must be positive, got {partitions}"
        ))));
    }
    let live = cluster.image().active_brokers().count();
    if manual.is_none() && (replication_factor <= 0 || replication_factor as usize > live) {
        return Err(topic_refusal(TopicError::InvalidReplicationFactor(format!(
            "replication factor {replication_factor} is not between 1 and the {live} available brokers"
        ))));
    }
    let configs: Vec<(String, Option<String>)> =
        t.configs.iter().map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string()))).collect();
    let overrides = ReplicaManager::validate_configs(&configs).map_err(topic_refusal)?;
    {
        let image = cluster.image();
        if image.topic(name).is_some() {
            return Err(topic_refusal(TopicError::AlreadyExists(name.to_string())));
        }
        if let Some(existing) = image.topic_ids.keys().find(|e| e.replace('.', "_") == name.replace('.', "_")) {
            return Err(topic_refusal(TopicError::InvalidName(format!(
                "{name} collides with existing topic {existing} ('.' and '_' collide)"
            ))));
        }
    }
    if validate_only {
        return Ok((Uuid::nil(), partitions, overrides));
    }
    let request = Request::CreateTopic {
        name: name.to_string(),
        partitions,
        replication_factor,
        configs: overrides.clone(),
        assignment: manual,
    };
    match refusal(cluster.submit(request).await)? {
        Reply::TopicCreated { id } => Ok((id, partitions, overrides)),
        other => Err((ResponseError::UnknownServerError.code(), format!("unexpected controller reply {other:?}"))),
    }
}

pub async fn delete_topics(ctx: &RequestContext, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let cluster = ctx.state.cluster().expect("forwarding runs in a cluster");
    let targets: Vec<(Option<String>, Uuid)> = if ctx.version >= 6 {
        req.topics.iter().map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id)).collect()
    } else {
        req.topic_names.iter().map(|n| (Some(n.0.to_string()), Uuid::nil())).collect()
    };
    let mut responses = Vec::with_capacity(targets.len());
    for (name, id) in targets {
        let image = cluster.image();
        let resolved: Result<(String, Uuid), Refusal> = match (&name, id) {
            (_, id) if id != Uuid::nil() => {
                image.topics.get(&id).map(|t| (t.name.clone(), t.id)).ok_or(topic_refusal(TopicError::UnknownId(id)))
            }
            (Some(n), _) => image
                .topic(n)
                .map(|t| (t.name.clone(), t.id))
                .ok_or_else(|| topic_refusal(TopicError::Unknown(n.clone()))),
            (None, _) => Err(topic_refusal(TopicError::InvalidRequest("neither a topic name nor a topic id".into()))),
        };
        let outcome = match resolved {
            Err(e) => Err(e),
            Ok((n, _)) if n.starts_with("__") => {
                Err(topic_refusal(TopicError::InvalidRequest(format!("internal topic {n} cannot be deleted"))))
            }
            Ok(_) if !ctx.state.config().delete_topic_enable => Err(topic_refusal(TopicError::DeletionDisabled)),
            Ok((n, topic_id)) => {
                refusal(cluster.submit(Request::DeleteTopic { name: n.clone() }).await).map(|_| (n, topic_id))
            }
        };
        let base = DeletableTopicResult::default();
        responses.push(match outcome {
            Ok((n, deleted_id)) => {
                base.with_name(Some(TopicName(str_bytes(&n)))).with_topic_id(deleted_id).with_error_code(0)
            }
            Err((code, message)) => base
                .with_name(name.map(|n| TopicName(StrBytes::from_string(n))))
                .with_topic_id(id)
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(message))),
        });
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

pub async fn create_partitions(ctx: &RequestContext, req: CreatePartitionsRequest) -> CreatePartitionsResponse {
    use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
    let cluster = ctx.state.cluster().expect("forwarding runs in a cluster");
    let mut results = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let name = t.name.0.to_string();
        let outcome: Result<(), Refusal> = async {
            let assignment: Option<Vec<Vec<i32>>> =
                t.assignments.as_ref().map(|a| a.iter().map(|p| p.broker_ids.iter().map(|b| b.0).collect()).collect());
            let (current, factor) = match cluster.image().topic(&name) {
                Some(topic) => {
                    (topic.partitions.len() as i32, topic.partitions.values().next().map_or(1, |p| p.replicas.len()))
                }
                None => return Err(topic_refusal(TopicError::Unknown(name.clone()))),
            };
            if t.count <= current {
                return Err(topic_refusal(TopicError::InvalidPartitions(format!(
                    "topic {name} has {current} partitions; partitions can only be added"
                ))));
            }
            if let Some(assignment) = &assignment {
                let invalid = |m: String| topic_refusal(TopicError::InvalidReplicaAssignment(m));
                if assignment.len() as i32 != t.count - current {
                    return Err(invalid(format!(
                        "{} new partitions need {} assignments, got {}",
                        name,
                        t.count - current,
                        assignment.len()
                    )));
                }
                let image = cluster.image();
                placement::check_assignment(assignment, Some(factor), |b| image.brokers.contains_key(&b))
                    .map_err(|e| invalid(e.to_string()))?;
            }
            if req.validate_only {
                return Ok(());
            }
            let request = Request::CreatePartitions { name: name.clone(), count: t.count, assignment };
            refusal(cluster.submit(request).await).map(|_| ())
        }
        .await;
        let base = CreatePartitionsTopicResult::default().with_name(t.name);
        results.push(match outcome {
            Ok(()) => base.with_error_code(0),
            Err((code, message)) => base.with_error_code(code).with_error_message(Some(StrBytes::from_string(message))),
        });
    }
    CreatePartitionsResponse::default().with_results(results)
}

/// Admin requests a cluster does not serve yet, answered with this message
/// and INVALID_REQUEST rather than changing only this broker.
pub const NOT_IN_CLUSTER_YET: &str =
    "not supported by this build in a multi-node cluster yet (single node only); see the README's feature table";
