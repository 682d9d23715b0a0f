//! Metadata: brokers, cluster id, controller, and topics with their
//! partitions. Unknown topics are auto-created when the broker and the
//! request both allow it.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use uuid::Uuid;

use super::{error, str_bytes, RequestContext};
use crate::replica::{validate_topic_name, Topic, TopicError};

/// Kafka's sentinel for "authorized operations not requested".
const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

/// Most topics one Metadata request auto-creates. Each creation opens files
/// and rewrites the metadata file while the request waits; one request naming
/// thousands of unknown topics must not exhaust the broker's descriptors or
/// stall it. Clients naming a few new topics never meet the bound.
pub const AUTO_CREATE_TOPICS_PER_REQUEST: usize = 100;

/// Most partitions one Metadata request auto-creates (at least one topic is
/// always created, whatever num.partitions is).
pub const AUTO_CREATE_PARTITIONS_PER_REQUEST: usize = 1000;

/// How much auto-creation one request has left.
struct AutoCreateBudget {
    topics: usize,
    partitions: usize,
}

impl AutoCreateBudget {
    fn allows(&self, partitions: usize) -> bool {
        self.topics < AUTO_CREATE_TOPICS_PER_REQUEST
            && (self.topics == 0 || self.partitions + partitions <= AUTO_CREATE_PARTITIONS_PER_REQUEST)
    }
    fn spend(&mut self, partitions: usize) {
        self.topics += 1;
        self.partitions += partitions;
    }
}

pub fn handle(ctx: &RequestContext, req: MetadataRequest) -> MetadataResponse {
    let state = &ctx.state;
    let config = state.config();
    let node = config.node_id;
    let advertised = config.advertised_for(&ctx.listener);
    let broker = MetadataResponseBroker::default()
        .with_node_id(BrokerId(node))
        .with_host(str_bytes(&advertised.host))
        .with_port(advertised.port as i32)
        .with_rack(None);
    // v0 uses an empty list for "all topics"; v1+ uses null.
    let requested = match req.topics {
        None => None,
        Some(t) if t.is_empty() && ctx.version == 0 => None,
        Some(t) => Some(t),
    };
    let topics_snapshot = state.replicas.topics();
    let mut topics = Vec::new();
    match requested {
        None => {
            let mut all: Vec<_> = topics_snapshot.by_name.values().cloned().collect();
            all.sort_by(|a, b| a.name.cmp(&b.name));
            topics.extend(all.iter().map(|t| topic_metadata(t, node)));
        }
        Some(list) => {
            // v4+ carries the flag; earlier versions always allowed auto-creation.
            let allow_auto = ctx.version < 4 || req.allow_auto_topic_creation;
            let mut budget = AutoCreateBudget { topics: 0, partitions: 0 };
            let partitions_per_topic = config.num_partitions.max(1) as usize;
            for requested in list {
                let by_id = requested.topic_id != Uuid::nil();
                match (&requested.name, by_id) {
                    (_, true) => match state.replicas.topic_by_id(&requested.topic_id) {
                        Some(t) => topics.push(topic_metadata(&t, node)),
                        None => {
                            topics.push(topic_error(None, requested.topic_id, ResponseError::UnknownTopicId.code()))
                        }
                    },
                    (Some(name), false) => {
                        let name_str = name.0.as_str();
                        if let Some(t) = state.replicas.topic(name_str) {
                            topics.push(topic_metadata(&t, node));
                            continue;
                        }
                        if let Err(e) = validate_topic_name(name_str) {
                            topics.push(topic_error(Some(name.clone()), Uuid::nil(), error::topic_code(&e)));
                            continue;
                        }
                        if allow_auto && config.auto_create_topics_enable && !name_str.starts_with("__") {
                            if !budget.allows(partitions_per_topic) {
                                // Over this request's budget: LEADER_NOT_AVAILABLE is what
                                // Kafka answers for a topic still being created, and clients
                                // (librdkafka, Java) retry Metadata on it; the retry creates
                                // the next batch. On UNKNOWN_TOPIC_OR_PARTITION librdkafka
                                // fails the topic's queued messages once
                                // topic.metadata.propagation.max.ms has passed.
                                topics.push(topic_error(
                                    Some(name.clone()),
                                    Uuid::nil(),
                                    ResponseError::LeaderNotAvailable.code(),
                                ));
                                continue;
                            }
                            match state.replicas.create_topic(name_str, -1, -1, Default::default(), false) {
                                Ok(t) => {
                                    budget.spend(t.partition_count as usize);
                                    topics.push(topic_metadata(&t, node))
                                }
                                // Lost a race with another creator: report what exists now.
                                Err(TopicError::AlreadyExists(_)) => match state.replicas.topic(name_str) {
                                    Some(t) => topics.push(topic_metadata(&t, node)),
                                    None => topics.push(topic_error(
                                        Some(name.clone()),
                                        Uuid::nil(),
                                        ResponseError::LeaderNotAvailable.code(),
                                    )),
                                },
                                Err(e) => {
                                    tracing::warn!(topic = name_str, error = %e, "auto-creation failed");
                                    topics.push(topic_error(Some(name.clone()), Uuid::nil(), error::topic_code(&e)));
                                }
                            }
                        } else {
                            topics.push(topic_error(
                                Some(name.clone()),
                                Uuid::nil(),
                                ResponseError::UnknownTopicOrPartition.code(),
                            ));
                        }
                    }
                    (None, false) => {
                        topics.push(topic_error(None, Uuid::nil(), ResponseError::InvalidRequest.code()));
                    }
                }
            }
        }
    }
    MetadataResponse::default()
        .with_brokers(vec![broker])
        .with_cluster_id(Some(str_bytes(&state.replicas.cluster_id)))
        .with_controller_id(BrokerId(node))
        .with_topics(topics)
        .with_cluster_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
}

/// Every topic this broker knows (its metadata image in a cluster), by name.
pub fn topic_names(ctx: &RequestContext) -> Vec<String> {
    let mut names: Vec<String> = match ctx.state.cluster() {
        Some(cluster) => cluster.image().topics.values().map(|t| t.name.clone()).collect(),
        None => ctx.state.replicas.topics().by_name.keys().cloned().collect(),
    };
    names.sort();
    names
}

/// Topic `name` as Metadata describes it (replicas, ISR, leader, offline
/// replicas), or `None` if there is no such topic: the one view
/// DescribeTopicPartitions answers from too.
pub fn describe_topic(ctx: &RequestContext, name: &str) -> Option<MetadataResponseTopic> {
    match ctx.state.cluster() {
        Some(cluster) => {
            let image = cluster.image();
            image.topic(name).map(|t| image_topic_metadata(&image, t))
        }
        None => ctx.state.replicas.topic(name).map(|t| topic_metadata(&t, ctx.state.config().node_id)),
    }
}

fn topic_error(name: Option<TopicName>, id: Uuid, code: i16) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_error_code(code)
        .with_name(name)
        .with_topic_id(id)
        .with_topic_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
}

fn topic_metadata(t: &Topic, node: i32) -> MetadataResponseTopic {
    let partitions = t
        .partitions
        .iter()
        .map(|p| {
            let partition = MetadataResponsePartition::default()
                .with_partition_index(p.index)
                .with_leader_epoch(p.leader_epoch())
                .with_replica_nodes(vec![BrokerId(node)]);
            if p.offline_reason().is_some() {
                // Its only replica is offline (damaged log), as Kafka reports
                // a replica on a failed log directory: no leader, so clients
                // wait instead of sending it requests.
                partition
                    .with_error_code(ResponseError::LeaderNotAvailable.code())
                    .with_leader_id(BrokerId(-1))
                    .with_isr_nodes(vec![])
                    .with_offline_replicas(vec![BrokerId(node)])
            } else {
                partition
                    .with_error_code(0)
                    .with_leader_id(BrokerId(node))
                    .with_isr_nodes(vec![BrokerId(node)])
                    .with_offline_replicas(vec![])
            }
        })
        .collect();
    MetadataResponseTopic::default()
        .with_error_code(0)
        .with_name(Some(TopicName(str_bytes(&t.name))))
        .with_topic_id(t.id)
        .with_is_internal(t.internal)
        .with_partitions(partitions)
        .with_topic_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
}

/// Metadata in a multi-node cluster: brokers, controller, topics and
/// leaders all from this broker's metadata image. Unknown topics are
/// auto-created through the active controller when allowed.
pub async fn handle_cluster(ctx: &RequestContext, req: MetadataRequest) -> MetadataResponse {
    let state = &ctx.state;
    let config = state.config();
    let Some(cluster) = state.cluster() else { return handle(ctx, req) };
    let requested = match req.topics {
        None => None,
        Some(t) if t.is_empty() && ctx.version == 0 => None,
        Some(t) => Some(t),
    };
    let mut topics = Vec::new();
    match requested {
        None => {
            let image = cluster.image();
            let mut all: Vec<_> = image.topics.values().collect();
            all.sort_by(|a, b| a.name.cmp(&b.name));
            topics.extend(all.into_iter().map(|t| image_topic_metadata(&image, t)));
        }
        Some(list) => {
            let allow_auto = ctx.version < 4 || req.allow_auto_topic_creation;
            let mut created = 0usize;
            for requested in list {
                let image = cluster.image();
                if requested.topic_id != Uuid::nil() {
                    match image.topics.get(&requested.topic_id) {
                        Some(t) => topics.push(image_topic_metadata(&image, t)),
                        None => {
                            topics.push(topic_error(None, requested.topic_id, ResponseError::UnknownTopicId.code()))
                        }
                    }
                    continue;
                }
                let Some(name) = requested.name else {
                    topics.push(topic_error(None, Uuid::nil(), ResponseError::InvalidRequest.code()));
                    continue;
                };
                let name_str = name.0.as_str();
                if let Some(t) = image.topic(name_str) {
                    topics.push(image_topic_metadata(&image, t));
                    continue;
                }
                if let Err(e) = validate_topic_name(name_str) {
                    topics.push(topic_error(Some(name.clone()), Uuid::nil(), error::topic_code(&e)));
                    continue;
                }
                let may_create = allow_auto && config.auto_create_topics_enable && !name_str.starts_with("__");
                if !may_create {
                    topics.push(topic_error(Some(name), Uuid::nil(), ResponseError::UnknownTopicOrPartition.code()));
                    continue;
                }
                if created >= AUTO_CREATE_TOPICS_PER_REQUEST {
                    // As on a single node: clients retry on LEADER_NOT_AVAILABLE.
                    topics.push(topic_error(Some(name), Uuid::nil(), ResponseError::LeaderNotAvailable.code()));
                    continue;
                }
                created += 1;
                let request = crate::controller::core::Request::CreateTopic {
                    name: name_str.to_string(),
                    partitions: config.num_partitions.max(1),
                    replication_factor: config.default_replication_factor.max(1),
                    configs: Default::default(),
                    assignment: None,
                };
                let outcome = cluster.submit(request).await;
                let image = cluster.image();
                match (outcome, image.topic(name_str)) {
                    (_, Some(t)) => topics.push(image_topic_metadata(&image, t)),
                    (Ok(crate::controller::core::Reply::Error(e)), None) => {
                        tracing::warn!(topic = name_str, error = %e, "auto-creation refused");
                        let (code, _) = error::controller_reply_code(&e);
                        topics.push(topic_error(Some(name), Uuid::nil(), code));
                    }
                    (outcome, None) => {
                        tracing::warn!(topic = name_str, outcome = ?outcome, "auto-creation did not complete");
                        topics.push(topic_error(Some(name), Uuid::nil(), ResponseError::LeaderNotAvailable.code()));
                    }
                }
            }
        }
    }
    let brokers = super::routing::live_brokers(state, &ctx.listener)
        .into_iter()
        .map(|(id, host, port, rack)| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(id))
                .with_host(str_bytes(&host))
                .with_port(port as i32)
                .with_rack(rack.as_deref().map(str_bytes))
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(str_bytes(&state.cluster_id())))
        .with_controller_id(BrokerId(cluster.controller_id_for_clients()))
        .with_topics(topics)
        .with_cluster_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
}

fn image_topic_metadata(
    image: &crate::metadata::image::ClusterImage,
    t: &crate::metadata::image::TopicImage,
) -> MetadataResponseTopic {
    let live = |id: &i32| image.brokers.get(id).is_some_and(|b| !b.fenced);
    let partitions = t
        .partitions
        .iter()
        .map(|(index, p)| {
            let offline: Vec<BrokerId> = p.replicas.iter().filter(|r| !live(r)).map(|r| BrokerId(*r)).collect();
            let code = if p.leader < 0 { ResponseError::LeaderNotAvailable.code() } else { 0 };
            MetadataResponsePartition::default()
                .with_error_code(code)
                .with_partition_index(*index)
                .with_leader_id(BrokerId(p.leader))
                .with_leader_epoch(p.leader_epoch)
                .with_replica_nodes(p.replicas.iter().map(|r| BrokerId(*r)).collect())
                .with_isr_nodes(p.isr.iter().map(|r| BrokerId(*r)).collect())
                .with_offline_replicas(offline)
        })
        .collect();
    MetadataResponseTopic::default()
        .with_error_code(0)
        .with_name(Some(TopicName(str_bytes(&t.name))))
        .with_topic_id(t.id)
        .with_is_internal(t.name.starts_with("__"))
        .with_partitions(partitions)
        .with_topic_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED)
}
