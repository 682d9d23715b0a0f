//! Produce: validate each partition's batches once (header + CRC-32C, no
//! record decoding), assign offsets, append the client's bytes.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{
    LeaderIdAndEpoch, NodeEndpoint, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{BrokerId, ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;
use strand_storage::batch;
use strand_storage::AppendOrigin;
use uuid::Uuid;

use std::collections::HashMap;

use super::routing::{self, NotServed};
use super::{error, str_bytes, RequestContext};
use crate::replica::{Partition, PartitionError, Topic};
use crate::util::now_ms;
use std::sync::Arc;

pub enum ProduceOutcome {
    Respond(ProduceResponse),
    /// acks=all with partitions whose high watermark has not reached the
    /// batch yet: the response once it has (or the wait ended otherwise).
    Deferred(futures_util::future::BoxFuture<'static, ProduceResponse>),
    NoResponse,
    /// acks=0 with an error: Kafka closes the connection so the client notices.
    Close(String),
}

struct PartitionResult {
    index: i32,
    error_code: i16,
    message: Option<String>,
    base_offset: i64,
    log_start_offset: i64,
    /// KIP-951: the leader to try instead (id, epoch).
    leader: Option<(i32, i32)>,
    /// acks=all: the partition, the last offset its high watermark must
    /// pass, and the leader epoch it was appended at.
    wait: Option<(Arc<Partition>, i64, i32)>,
}

impl PartitionResult {
    fn error(index: i32, error_code: i16, message: Option<String>) -> Self {
        PartitionResult { index, error_code, message, base_offset: -1, log_start_offset: -1, leader: None, wait: None }
    }

    fn not_served(index: i32, n: NotServed) -> Self {
        PartitionResult { leader: n.leader, ..Self::error(index, n.code, None) }
    }
}

/// An acks=all partition waiting for its replicas: (topic position,
/// partition position in the response, partition, last offset, leader epoch).
type Wait = (usize, usize, Arc<Partition>, i64, i32);

/// Produce v10+ carries the current leader of a NOT_LEADER_OR_FOLLOWER partition (KIP-951).
const CURRENT_LEADER_VERSION: i16 = 10;

/// In a cluster, when this broker does not coordinate the request's
/// transactional id: the coordinator's verdict for every partition carrying
/// a transactional batch, asked once for the whole request (KIP-890 part 1).
async fn verify_remotely(ctx: &RequestContext, req: &ProduceRequest) -> Option<HashMap<(String, i32), i16>> {
    let id = req.transactional_id.as_ref()?.0.as_str();
    if ctx.state.cluster().is_none() || ctx.state.txns().coordinates(id) {
        return None;
    }
    let mut producer: Option<(i64, i16)> = None;
    let mut partitions = Vec::new();
    for td in &req.topic_data {
        let name = if ctx.version >= 13 {
            match ctx.state.replicas.topic_by_id(&td.topic_id) {
                Some(t) => t.name.clone(),
                None => routing::topic_name_for_id(&ctx.state, &td.topic_id).unwrap_or_default(),
            }
        } else {
            td.name.0.to_string()
        };
        for pd in &td.partition_data {
            let Some(records) = pd.records.as_ref() else { continue };
            let Ok((header, _)) = batch::peek_header(records, 0) else { continue };
            if header.is_transactional() && !header.is_control() {
                let this = (header.producer_id(), header.producer_epoch());
                if *producer.get_or_insert(this) == this {
                    partitions.push((name.clone(), pd.index));
                }
            }
        }
    }
    let (producer_id, epoch) = producer?;
    let codes = match super::txn::verify_in_txn(&ctx.state, Some(id), producer_id, epoch, &partitions).await {
        Ok(codes) => codes,
        Err(e) => {
            // Retriable for producers: they send the batch again.
            tracing::warn!(transactional_id = id, error = %e.0, "cannot verify transactional batches");
            vec![ResponseError::NotEnoughReplicas.code(); partitions.len()]
        }
    };
    Some(partitions.into_iter().zip(codes).collect())
}

pub async fn handle(ctx: &RequestContext, req: ProduceRequest) -> ProduceOutcome {
    let acks = req.acks;
    let verified = verify_remotely(ctx, &req).await;
    let mut responses = Vec::with_capacity(req.topic_data.len());
    let mut first_error: Option<String> = None;
    let mut leaders_named = Vec::new();
    // acks=all: (topic position, partition position, partition, last offset, leader epoch).
    let mut waits: Vec<Wait> = Vec::new();
    for topic_data in req.topic_data {
        // v13+ names topics by id (KIP-516), earlier versions by name.
        let topic: Option<std::sync::Arc<Topic>> = if ctx.version >= 13 {
            ctx.state.replicas.topic_by_id(&topic_data.topic_id)
        } else {
            ctx.state.replicas.topic(topic_data.name.0.as_str())
        };
        let unknown_code =
            if ctx.version >= 13 { ResponseError::UnknownTopicId } else { ResponseError::UnknownTopicOrPartition }
                .code();
        // The name the cluster routes by (none for an id nobody knows).
        let route_name: Option<String> = match &topic {
            Some(t) => Some(t.name.clone()),
            None if ctx.version >= 13 => routing::topic_name_for_id(&ctx.state, &topic_data.topic_id),
            None => Some(topic_data.name.0.to_string()),
        };
        let mut partition_results = Vec::with_capacity(topic_data.partition_data.len());
        for pd in topic_data.partition_data {
            let result = if !(-1..=1).contains(&acks) {
                PartitionResult::error(
                    pd.index,
                    ResponseError::InvalidRequiredAcks.code(),
                    Some(format!("acks={acks} is not 0, 1 or -1")),
                )
            } else if let Some(Err(n)) = route_name.as_deref().map(|name| routing::check(&ctx.state, name, pd.index)) {
                PartitionResult::not_served(pd.index, n)
            } else {
                match &topic {
                    None => PartitionResult::error(pd.index, unknown_code, None),
                    Some(t) => produce_partition(ctx.state.txns(), verified.as_ref(), t, pd.index, pd.records, acks),
                }
            };
            if result.error_code != 0 && first_error.is_none() {
                first_error = Some(format!(
                    "{} partition {}: {}",
                    topic_data.name.0.as_str(),
                    result.index,
                    result.message.clone().unwrap_or_else(|| format!("error code {}", result.error_code))
                ));
            }
            partition_results.push(result);
        }
        let partition_responses = partition_results
            .into_iter()
            .enumerate()
            .map(|(at, mut r)| {
                if let Some((p, last, epoch)) = r.wait.take() {
                    waits.push((responses.len(), at, p, last, epoch));
                }
                let mut response = PartitionProduceResponse::default()
                    .with_index(r.index)
                    .with_error_code(r.error_code)
                    .with_base_offset(r.base_offset)
                    .with_log_append_time_ms(-1)
                    .with_log_start_offset(r.log_start_offset)
                    .with_error_message(r.message.map(StrBytes::from_string));
                if let Some((leader, epoch)) = r.leader.filter(|_| ctx.version >= CURRENT_LEADER_VERSION) {
                    leaders_named.push(leader);
                    response = response.with_current_leader(
                        LeaderIdAndEpoch::default().with_leader_id(BrokerId(leader)).with_leader_epoch(epoch),
                    );
                }
                response
            })
            .collect();
        let mut resp = TopicProduceResponse::default().with_partition_responses(partition_responses);
        if ctx.version >= 13 {
            resp = resp.with_topic_id(topic_data.topic_id);
        } else {
            resp = resp.with_name(topic_data.name).with_topic_id(Uuid::nil());
        }
        responses.push(resp);
    }
    if acks == 0 {
        return match first_error {
            Some(e) => ProduceOutcome::Close(format!("acks=0 produce failed: {e}")),
            None => ProduceOutcome::NoResponse,
        };
    }
    let node_endpoints = routing::endpoints(&ctx.state, &ctx.listener, &leaders_named)
        .into_iter()
        .map(|(id, host, port, rack)| {
            NodeEndpoint::default()
                .with_node_id(BrokerId(id))
                .with_host(str_bytes(&host))
                .with_port(port as i32)
                .with_rack(rack.as_deref().map(str_bytes))
        })
        .collect();
    let response = ProduceResponse::default().with_responses(responses).with_node_endpoints(node_endpoints);
    // Partitions whose high watermark already covers the batch (every one
    // on a single node) need no wait.
    waits.retain(|(_, _, p, last, epoch)| !matches!(p.replicated(*last, *epoch), Ok(true)));
    if waits.is_empty() {
        return ProduceOutcome::Respond(response);
    }
    let timeout = std::time::Duration::from_millis(req.timeout_ms.max(0) as u64);
    ProduceOutcome::Deferred(Box::pin(wait_replicated(response, waits, timeout)))
}

/// Waits until each partition's high watermark passes its batch (acks=all),
/// the ISR falls below min.insync.replicas (NOT_ENOUGH_REPLICAS_AFTER_APPEND),
/// leadership moves (NOT_LEADER_OR_FOLLOWER) or the request's timeout
/// passes (REQUEST_TIMED_OUT); the batches stay in the log either way, as
/// in Kafka, and a retry is answered from the producer state.
async fn wait_replicated(
    mut response: ProduceResponse,
    waits: Vec<Wait>,
    timeout: std::time::Duration,
) -> ProduceResponse {
    let deadline = tokio::time::Instant::now() + timeout;
    for (t, at, partition, last, epoch) in waits {
        let code = match partition.wait_replicated(last, epoch, deadline).await {
            Ok(()) => 0,
            Err(e) => error::partition_code(&e),
        };
        if code != 0 {
            let r = &mut response.responses[t].partition_responses[at];
            r.error_code = code;
            r.base_offset = -1;
        }
    }
    response
}

fn produce_partition(
    txns: &crate::txn::TxnCoordinator,
    verified: Option<&HashMap<(String, i32), i16>>,
    topic: &Topic,
    index: i32,
    records: Option<bytes::Bytes>,
    acks: i16,
) -> PartitionResult {
    let Some(partition) = topic.partition(index) else {
        return PartitionResult::error(index, ResponseError::UnknownTopicOrPartition.code(), None);
    };
    if topic.internal {
        // Internal topics are written by their coordinators only, as in Kafka.
        return PartitionResult::error(
            index,
            ResponseError::InvalidTopicException.code(),
            Some(format!("cannot produce to internal topic {}", topic.name)),
        );
    }
    let records = match records {
        Some(r) if !r.is_empty() => r,
        _ => {
            return PartitionResult::error(index, ResponseError::InvalidRecord.code(), Some("no record batches".into()))
        }
    };
    // Control batches are written by the transaction coordinator only, and
    // transactional batches need it too, which this broker does not have yet.
    let mut position = 0;
    while position < records.len() {
        match batch::peek_header(&records[position..], position) {
            Ok((header, total)) => {
                if header.is_control() {
                    return PartitionResult::error(
                        index,
                        ResponseError::InvalidRecord.code(),
                        Some("clients may not produce control batches".into()),
                    );
                }
                if header.producer_id() >= 0 && header.base_sequence() < 0 {
                    return PartitionResult::error(
                        index,
                        ResponseError::InvalidRecord.code(),
                        Some("a batch with a producer id needs a sequence number".into()),
                    );
                }
                if header.is_transactional() {
                    // KIP-890 part 1: the partition must be in the producer's open transaction.
                    // Until the coordinator has loaded that is unknown: ask the client to retry.
                    let verdict = match verified {
                        // The coordinator is another broker: its answer, asked above.
                        Some(map) => match map.get(&(topic.name.clone(), index)) {
                            Some(0) => Ok(()),
                            Some(code) => Err(*code),
                            None => Err(ResponseError::InvalidTxnState.code()),
                        },
                        None => {
                            if !txns.all_loaded() {
                                return PartitionResult::error(index, ResponseError::NotLeaderOrFollower.code(), None);
                            }
                            txns.open.verify(header.producer_id(), header.producer_epoch(), &topic.name, index)
                        }
                    };
                    if let Err(code) = verdict {
                        return PartitionResult::error(
                            index,
                            code,
                            Some("transactional batch for a partition not added to an open transaction".into()),
                        );
                    }
                }
                position += total;
            }
            Err(e) => return PartitionResult::error(index, error::batch_code(&e), Some(e.to_string())),
        }
    }
    if partition.is_compacted() {
        // Compaction keeps the latest record per key; a record without one cannot be kept.
        match batch::all_records_have_keys(&records) {
            Ok(true) => {}
            Ok(false) => {
                return PartitionResult::error(
                    index,
                    ResponseError::InvalidRecord.code(),
                    Some("compacted topic cannot accept a record without a key".into()),
                )
            }
            Err(e) => return PartitionResult::error(index, error::batch_code(&e), Some(e.to_string())),
        }
    }
    if acks == -1 {
        if let Some((isr, required)) = partition.under_min_isr() {
            return PartitionResult::error(
                index,
                ResponseError::NotEnoughReplicas.code(),
                Some(format!(
                    "{isr} in-sync replica(s), fewer than {required} (min.insync.replicas={})",
                    partition.min_insync_replicas()
                )),
            );
        }
    }
    // The request's bytes go to the file as they are: the log writes each
    // batch's offset-stamped header prefix from a small copy (no record copy).
    match partition.append_at_epoch(&records, AppendOrigin::Client, now_ms()) {
        // A retried batch already in the log: its original offsets, no error (KIP-98).
        Ok((info, epoch)) => PartitionResult {
            index,
            error_code: 0,
            message: None,
            base_offset: info.base_offset,
            log_start_offset: info.log_start_offset,
            leader: None,
            wait: (acks == -1).then(|| (partition.clone(), info.last_offset, epoch)),
        },
        Err(e) => {
            if let PartitionError::Storage(s) = &e {
                tracing::debug!(topic = %topic.name, partition = index, error = %s, "produce refused");
            }
            PartitionResult::error(index, error::partition_code(&e), Some(e.to_string()))
        }
    }
}
