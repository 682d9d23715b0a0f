//! InitProducerId for idempotent producers.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

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
