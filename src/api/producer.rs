//! InitProducerId for idempotent producers, and DescribeProducers.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
use kafka_protocol::messages::{
    DescribeProducersRequest, DescribeProducersResponse, InitProducerIdRequest, InitProducerIdResponse, ProducerId,
};

use super::{error, RequestContext};

pub async fn init_producer_id(ctx: &RequestContext, req: InitProducerIdRequest) -> InitProducerIdResponse {
    if let Some(id) = &req.transactional_id {
        // v3+ carries the producer's current id and epoch (KIP-360); earlier versions -1.
        let (pid, epoch) = if ctx.version >= 3 { (req.producer_id.0, req.producer_epoch) } else { (-1, -1) };
        let (error, pid, epoch) =
            ctx.state.txns().init_producer_id(id.0.as_str(), req.transaction_timeout_ms, pid, epoch).await;
        // KIP-588: PRODUCER_FENCED from v4; older clients get INVALID_PRODUCER_EPOCH.
        let error = if error == ResponseError::ProducerFenced.code() && ctx.version < 4 {
            ResponseError::InvalidProducerEpoch.code()
        } else {
            error
        };
        return InitProducerIdResponse::default()
            .with_error_code(error)
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch);
    }
    // Without a transactional id every call, including a KIP-360 epoch bump
    // request carrying an old id, gets a fresh producer id at epoch 0, as in Kafka.
    let allocated = match ctx.state.cluster() {
        // Ids come in blocks from the controller: unique across the cluster.
        Some(cluster) => cluster.allocate_producer_id().await.map_err(|e| match e {
            crate::cluster::ProducerIdError::Controller(e) => error::controller_code(&e),
            crate::cluster::ProducerIdError::Refused(e) => error::controller_reply_code(&e),
        }),
        None => ctx.state.replicas.allocate_producer_id().map_err(|e| (error::topic_code(&e), e.to_string())),
    };
    match allocated {
        Ok(id) => {
            InitProducerIdResponse::default().with_error_code(0).with_producer_id(ProducerId(id)).with_producer_epoch(0)
        }
        Err((code, message)) => {
            tracing::error!(error = %message, "cannot allocate a producer id");
            InitProducerIdResponse::default()
                .with_error_code(code)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
        }
    }
}

/// DescribeProducers: the producer state of each requested partition.
pub fn describe_producers(ctx: &RequestContext, req: DescribeProducersRequest) -> DescribeProducersResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = ctx.state.replicas.topic(t.name.0.as_str());
            let partitions = t
                .partition_indexes
                .into_iter()
                .map(|index| {
                    let base = PartitionResponse::default().with_partition_index(index);
                    if let Err(n) = super::routing::check(&ctx.state, t.name.0.as_str(), index) {
                        return base.with_error_code(n.code);
                    }
                    let partition = topic.as_ref().and_then(|t| t.partition(index));
                    let Some(partition) = partition else {
                        return base.with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    };
                    match partition.producers() {
                        Ok(producers) => base.with_error_code(0).with_active_producers(
                            producers
                                .into_iter()
                                .map(|p| {
                                    ProducerState::default()
                                        .with_producer_id(ProducerId(p.producer_id))
                                        .with_producer_epoch(p.producer_epoch as i32)
                                        .with_last_sequence(p.last_sequence)
                                        .with_last_timestamp(p.last_timestamp)
                                        .with_coordinator_epoch(p.coordinator_epoch)
                                        .with_current_txn_start_offset(p.current_txn_start_offset)
                                })
                                .collect(),
                        ),
                        Err(e) => base.with_error_code(error::partition_code(&e)),
                    }
                })
                .collect();
            TopicResponse::default().with_name(t.name).with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
