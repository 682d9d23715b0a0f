//! DescribeQuorum (`kafka-metadata-quorum describe`): the metadata log's
//! leader, high watermark and voters. Any broker answers; the figures come
//! from the active controller, asked over the CONTROLLER listener as a
//! Kafka broker forwards the request.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_quorum_response::{Listener, Node, PartitionData, ReplicaState, TopicData};
use kafka_protocol::messages::{BrokerId, DescribeQuorumRequest, DescribeQuorumResponse, TopicName};

use super::{error, str_bytes, RequestContext};
use crate::controller::core::{Reply, Request};
use crate::controller::describe::ReplicaDescription;

/// The name KRaft gives its metadata log; DescribeQuorum asks for partition 0 of it.
pub const METADATA_TOPIC: &str = "__cluster_metadata";

fn replica(r: &ReplicaDescription) -> ReplicaState {
    ReplicaState::default()
        .with_replica_id(BrokerId(r.replica_id))
        .with_log_end_offset(r.log_end_offset)
        .with_last_fetch_timestamp(r.last_fetch_ms)
        .with_last_caught_up_timestamp(r.last_caught_up_ms)
}

fn failed(code: i16, message: String) -> DescribeQuorumResponse {
    DescribeQuorumResponse::default().with_error_code(code).with_error_message(Some(str_bytes(&message)))
}

pub async fn describe_quorum(ctx: &RequestContext, req: DescribeQuorumRequest) -> DescribeQuorumResponse {
    let Some(cluster) = ctx.state.cluster() else {
        // Not advertised on a single node (see `versions::CLUSTER_ONLY`).
        return failed(ResponseError::UnsupportedVersion.code(), "a single node has no metadata quorum".into());
    };
    let asks_for_metadata_log = req.topics.len() == 1
        && req.topics[0].topic_name.as_str() == METADATA_TOPIC
        && req.topics[0].partitions.len() == 1
        && req.topics[0].partitions[0].partition_index == 0;
    if !asks_for_metadata_log {
        return failed(
            ResponseError::InvalidRequest.code(),
            format!("DescribeQuorum describes one partition: {METADATA_TOPIC}-0"),
        );
    }
    let partition = match cluster.submit(Request::DescribeQuorum).await {
        Ok(Reply::Quorum(q)) => PartitionData::default()
            .with_partition_index(0)
            .with_error_code(0)
            .with_leader_id(BrokerId(q.leader_id))
            .with_leader_epoch(q.leader_epoch)
            .with_high_watermark(q.high_watermark)
            .with_current_voters(q.voters.iter().map(replica).collect())
            .with_observers(q.observers.iter().map(replica).collect()),
        Ok(Reply::Error(e)) => {
            let (code, message) = error::controller_reply_code(&e);
            return failed(code, message);
        }
        Ok(other) => return failed(ResponseError::UnknownServerError.code(), format!("unexpected reply {other:?}")),
        Err(e) => {
            let (code, message) = error::controller_code(&e);
            return failed(code, message);
        }
    };
    // v2: where each voter listens (its CONTROLLER listener).
    let config = ctx.state.config();
    let listener_name = config
        .quorum
        .as_ref()
        .and_then(|q| q.controller_listener.as_ref())
        .map_or_else(|| "CONTROLLER".to_string(), |l| l.name.clone());
    let nodes = config
        .quorum
        .iter()
        .flat_map(|q| q.voters.iter())
        .map(|v| {
            Node::default().with_node_id(BrokerId(v.id)).with_listeners(vec![Listener::default()
                .with_name(str_bytes(&listener_name))
                .with_host(str_bytes(&v.host))
                .with_port(v.port)])
        })
        .collect();
    DescribeQuorumResponse::default()
        .with_error_code(0)
        .with_topics(vec![TopicData::default()
            .with_topic_name(TopicName(str_bytes(METADATA_TOPIC)))
            .with_partitions(vec![partition])])
        .with_nodes(nodes)
}
