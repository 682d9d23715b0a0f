//! ListOffsets: earliest, latest (high watermark, or last stable offset under
//! read_committed), max timestamp, and the first offset at or after a
//! timestamp via the time index.

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::records::RecordBatchDecoder;

use super::{error, RequestContext};
use crate::replica::{Partition, PartitionError};

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;
const EARLIEST_PENDING_UPLOAD: i64 = -5;
const LATEST_TIERED: i64 = -6;

pub fn handle(ctx: &RequestContext, req: ListOffsetsRequest) -> ListOffsetsResponse {
    let read_committed = req.isolation_level == 1;
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = ctx.state.replicas.topic(t.name.0.as_str());
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let base = ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
                    if let Err(n) = super::routing::check(&ctx.state, t.name.0.as_str(), p.partition_index) {
                        let base = base.with_error_code(n.code).with_timestamp(-1).with_offset(-1);
                        return match n.leader {
                            Some((_, epoch)) if ctx.version >= 4 => base.with_leader_epoch(epoch),
                            _ => base,
                        };
                    }
                    let partition = topic.as_ref().and_then(|t| t.partition(p.partition_index));
                    let Some(partition) = partition else {
                        return base
                            .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                            .with_timestamp(-1)
                            .with_offset(-1);
                    };
                    let current = if ctx.version >= 4 { p.current_leader_epoch } else { -1 };
                    let looked_up = partition
                        .check_leader_epoch(current)
                        .and_then(|()| lookup(partition, p.timestamp, read_committed));
                    match looked_up {
                        Ok((timestamp, offset)) => base
                            .with_error_code(0)
                            .with_timestamp(timestamp)
                            .with_offset(offset)
                            // The field exists from v4; earlier versions must leave it at -1.
                            .with_leader_epoch(if offset >= 0 && ctx.version >= 4 {
                                partition.leader_epoch()
                            } else {
                                -1
                            }),
                        Err(e) => base.with_error_code(error::partition_code(&e)).with_timestamp(-1).with_offset(-1),
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default().with_name(t.name).with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

/// Returns (timestamp, offset) for one partition.
fn lookup(partition: &Partition, timestamp: i64, read_committed: bool) -> Result<(i64, i64), PartitionError> {
    let offsets = partition.offsets()?;
    match timestamp {
        LATEST => Ok((-1, if read_committed { offsets.last_stable_offset } else { offsets.high_watermark })),
        // No tiered storage: everything is local and nothing is pending upload.
        EARLIEST | EARLIEST_LOCAL | EARLIEST_PENDING_UPLOAD => Ok((-1, offsets.log_start_offset)),
        LATEST_TIERED => Ok((-1, -1)),
        MAX_TIMESTAMP => match partition.lookup_max_timestamp()? {
            Some(found) => Ok(exact_record(&found.batch, |ts, best| ts > best.unwrap_or(i64::MIN)).unwrap_or((-1, -1))),
            None => Ok((-1, -1)),
        },
        t if t >= 0 => match partition.lookup_timestamp(t)? {
            // The first record of the batch at or after the timestamp, not merely the batch.
            Some(found) => Ok(exact_record(&found.batch, |ts, best| best.is_none() && ts >= t).unwrap_or((-1, -1))),
            None => Ok((-1, -1)),
        },
        _ => Err(PartitionError::Storage(strand_storage::StorageError::OffsetOutOfRange {
            offset: timestamp,
            log_start_offset: offsets.log_start_offset,
            log_end_offset: offsets.log_end_offset,
        })),
    }
}

/// Decodes one batch (decompressing if needed: a ListOffsets by timestamp is
/// rare and small, unlike produce and fetch) and picks the record `better`
/// prefers, returning (timestamp, offset).
fn exact_record(batch: &[u8], better: impl Fn(i64, Option<i64>) -> bool) -> Option<(i64, i64)> {
    let mut buf = Bytes::copy_from_slice(batch);
    let set = RecordBatchDecoder::decode(&mut buf).ok()?;
    let mut best: Option<(i64, i64)> = None;
    for r in &set.records {
        if better(r.timestamp, best.map(|b| b.0)) {
            best = Some((r.timestamp, r.offset));
        }
    }
    best
}
