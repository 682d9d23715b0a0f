//! OffsetForLeaderEpoch (API 23): where a leader epoch ends in the leader's
//! log, answered from its leader-epoch cache — the largest epoch at or below
//! the one asked and the start offset of the next (the log end offset for
//! the current epoch). Consumers use it to detect a log truncated under
//! them (KIP-320); `current_leader_epoch` is checked as for Fetch.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};

use super::{error, routing, RequestContext};

pub fn handle(ctx: &RequestContext, req: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let name = t.topic.0.to_string();
            let topic = ctx.state.replicas.topic(&name);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let answer =
                        EpochEndOffset::default().with_partition(p.partition).with_leader_epoch(-1).with_end_offset(-1);
                    if let Err(n) = routing::check(&ctx.state, &name, p.partition) {
                        return answer.with_error_code(n.code);
                    }
                    let Some(partition) = topic.as_ref().and_then(|t| t.partition(p.partition)) else {
                        return answer.with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    };
                    match partition.end_offset_for_epoch(p.current_leader_epoch, p.leader_epoch) {
                        Ok((epoch, end)) => answer.with_leader_epoch(epoch).with_end_offset(end),
                        Err(e) => answer.with_error_code(error::partition_code(&e)),
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default().with_topic(t.topic).with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
