//! InitProducerId for idempotent producers, and DescribeProducers.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
use kafka_protocol::messages::{
    DescribeProducersRequest, DescribeProducersResponse, InitProducerIdRequest, InitProducerIdResponse, ProducerId,
};

use super::{error, RequestContext};

pub fn init_producer_id(ctx: &RequestContext, req: InitProducerIdRequest) -> InitProducerIdResponse {
    if req.transactional_id.is_some() {
        // Transactional producers need the transaction coordinator, which this broker does not have yet.
        return InitProducerIdResponse::default()
            .with_error_code(ResponseError::InvalidRequest.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    // Without a transactional id every call, including a KIP-360 epoch bump
    // request carrying an old id, gets a fresh producer id at epoch 0, as in Kafka.
    match ctx.state.replicas.allocate_producer_id() {
        Ok(id) => {
            InitProducerIdResponse::default().with_error_code(0).with_producer_id(ProducerId(id)).with_producer_epoch(0)
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot allocate a producer id");
            InitProducerIdResponse::default()
                .with_error_code(error::topic_code(&e))
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
