//! Fetch: whole batches straight from segment files (file slices, never
//! decoded, sent with `sendfile` through records placeholders: see
//! [`super::response`]), bounded by partition and response byte limits, with
//! the max_wait_ms/min_bytes long poll woken by appends, and incremental fetch
//! sessions (KIP-227).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::select_all;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, LeaderIdAndEpoch, NodeEndpoint, PartitionData,
};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, ProducerId, TopicName};
use tokio::time::Instant;
use uuid::Uuid;

use super::fetch_session::{CachedPartition, PartitionKey, SessionError, SessionPlan, TopicKey};
use super::response::FileRecords;
use super::{error, str_bytes, RequestContext};
use crate::replica::{Partition, PartitionOffsets};

/// Upper bound on a long poll whatever the client asks, so a hostile max_wait_ms
/// cannot pin a connection forever.
const MAX_WAIT_MS_CAP: i32 = 5 * 60 * 1000;

struct Target {
    key: PartitionKey,
    cached: CachedPartition,
    topic_name: String,
    topic_id: Uuid,
    partition: Result<Arc<Partition>, i16>,
    /// KIP-951: the leader to try instead (id, epoch), for NOT_LEADER_OR_FOLLOWER.
    leader: Option<(i32, i32)>,
}

/// Fetch v16+ carries the current leader of a NOT_LEADER_OR_FOLLOWER partition (KIP-951).
const CURRENT_LEADER_VERSION: i16 = 16;

struct PartitionResult {
    error_code: i16,
    offsets: Option<PartitionOffsets>,
    /// A placeholder for file slices (see `FileRecords`), or bytes read into memory.
    records: Bytes,
    aborted: Vec<strand_storage::AbortedTxn>,
}

/// The response, and the file slices its records placeholders stand for
/// (the response must be encoded with them: see [`super::response`]).
pub async fn handle(ctx: &RequestContext, req: FetchRequest) -> (FetchResponse, FileRecords) {
    // A follower's fetch names its broker id (in ReplicaState from v15).
    let (replica, broker_epoch) = if ctx.version >= 15 {
        (req.replica_state.replica_id.0, req.replica_state.replica_epoch)
    } else {
        (req.replica_id.0, -1)
    };
    if replica >= 0 {
        return super::replica_fetch::handle(ctx, req, replica, broker_epoch).await;
    }
    let uses_ids = ctx.version >= 13;
    let read_committed = req.isolation_level == 1;
    let topic_key =
        |name: &TopicName, id: Uuid| if uses_ids { TopicKey::Id(id) } else { TopicKey::Name(name.0.to_string()) };
    let mut requested = Vec::new();
    // KIP-320: the leader epoch the consumer believes current, checked against ours.
    let mut epochs = std::collections::HashMap::new();
    for t in &req.topics {
        let key = topic_key(&t.topic, t.topic_id);
        for p in &t.partitions {
            if ctx.version >= 9 && p.current_leader_epoch >= 0 {
                epochs.insert((key.clone(), p.partition), p.current_leader_epoch);
            }
            requested.push(((key.clone(), p.partition), CachedPartition::new(p.fetch_offset, p.partition_max_bytes)));
        }
    }
    let mut forgotten = Vec::new();
    for t in &req.forgotten_topics_data {
        let key = topic_key(&t.topic, t.topic_id);
        forgotten.extend(t.partitions.iter().map(|p| (key.clone(), *p)));
    }
    let plan = ctx.state.lock_fetch_sessions().plan(req.session_id, req.session_epoch, &requested, &forgotten);
    let (session_id, incremental, partitions) = match plan {
        Ok(SessionPlan::Sessionless) => (0, false, requested),
        Ok(SessionPlan::Full { id }) => (id, false, requested),
        Ok(SessionPlan::Incremental { id, partitions }) => (id, true, partitions),
        Err(e) => {
            let code = match e {
                SessionError::NotFound => ResponseError::FetchSessionIdNotFound,
                SessionError::InvalidEpoch => ResponseError::InvalidFetchSessionEpoch,
            };
            return (FetchResponse::default().with_error_code(code.code()).with_session_id(0), FileRecords::default());
        }
    };

    let targets: Vec<Target> = partitions
        .into_iter()
        .map(|(key, cached)| {
            let epoch = epochs.get(&key).copied().unwrap_or(-1);
            let mut target = resolve(ctx, key, cached, uses_ids);
            if let Ok(p) = &target.partition {
                if let Err(e) = p.check_leader_epoch(epoch) {
                    target.partition = Err(error::partition_code(&e));
                }
            }
            target
        })
        .collect();
    let response_max_bytes = (req.max_bytes.max(0) as usize).min(ctx.state.config().fetch_max_bytes);
    let min_bytes = req.min_bytes.max(0) as usize;
    let deadline = Instant::now() + Duration::from_millis(req.max_wait_ms.clamp(0, MAX_WAIT_MS_CAP) as u64);
    let mut shutdown = ctx.shutdown.clone();

    let (results, files) = loop {
        // Subscribe before reading so an append between the read and the wait is not missed.
        let mut watchers: Vec<_> =
            targets.iter().filter_map(|t| t.partition.as_ref().ok()).map(|p| p.subscribe()).collect();
        for w in &mut watchers {
            w.borrow_and_update();
        }
        let (results, files) = read_all(&targets, response_max_bytes, read_committed);
        let bytes: usize = results.iter().map(|r| r.records.len()).sum();
        let any_error = results.iter().any(|r| r.error_code != 0);
        if bytes >= min_bytes || any_error || watchers.is_empty() || Instant::now() >= deadline || *shutdown.borrow() {
            break (results, files);
        }
        let changed = select_all(watchers.iter_mut().map(|w| Box::pin(w.changed())));
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.changed() => {}
        }
    };

    // Build the response, grouping consecutive partitions of one topic.
    let mut responses: Vec<FetchableTopicResponse> = Vec::new();
    let mut leaders_named = Vec::new();
    let mut sessions = ctx.state.lock_fetch_sessions();
    for (target, result) in targets.iter().zip(results) {
        let offsets = result.offsets.unwrap_or(PartitionOffsets {
            log_start_offset: -1,
            high_watermark: -1,
            last_stable_offset: -1,
            log_end_offset: -1,
        });
        let had_data = !result.records.is_empty();
        if incremental {
            let c = &target.cached;
            let changed = had_data
                || result.error_code != 0
                || offsets.high_watermark != c.high_watermark
                || offsets.last_stable_offset != c.last_stable_offset
                || offsets.log_start_offset != c.log_start_offset;
            if !changed {
                continue;
            }
        }
        if session_id != 0 {
            sessions.record_sent(
                session_id,
                &target.key,
                offsets.high_watermark,
                offsets.last_stable_offset,
                offsets.log_start_offset,
                had_data,
            );
        }
        let data = PartitionData::default()
            .with_partition_index(target.key.1)
            .with_error_code(result.error_code)
            .with_high_watermark(offsets.high_watermark)
            .with_last_stable_offset(offsets.last_stable_offset)
            .with_log_start_offset(offsets.log_start_offset)
            .with_aborted_transactions(if read_committed {
                Some(
                    result
                        .aborted
                        .iter()
                        .map(|a| {
                            AbortedTransaction::default()
                                .with_producer_id(ProducerId(a.producer_id))
                                .with_first_offset(a.first_offset)
                        })
                        .collect(),
                )
            } else {
                None
            })
            .with_preferred_read_replica(BrokerId(-1))
            .with_records(Some(result.records));
        let data = match target.leader.filter(|_| ctx.version >= CURRENT_LEADER_VERSION) {
            Some((leader, epoch)) => {
                leaders_named.push(leader);
                data.with_current_leader(
                    LeaderIdAndEpoch::default().with_leader_id(BrokerId(leader)).with_leader_epoch(epoch),
                )
            }
            None => data,
        };
        let same_topic = responses.last().is_some_and(|last| {
            if uses_ids {
                last.topic_id == target.topic_id && target.topic_id != Uuid::nil()
            } else {
                last.topic.0.as_str() == target.topic_name
            }
        });
        if !same_topic {
            let mut t = FetchableTopicResponse::default();
            if uses_ids {
                t = t.with_topic_id(target.topic_id);
            } else {
                t = t.with_topic(TopicName(str_bytes(&target.topic_name)));
            }
            responses.push(t);
        }
        responses.last_mut().expect("pushed above").partitions.push(data);
    }
    drop(sessions);
    let node_endpoints = super::routing::endpoints(&ctx.state, &ctx.listener, &leaders_named)
        .into_iter()
        .map(|(id, host, port, rack)| {
            NodeEndpoint::default()
                .with_node_id(BrokerId(id))
                .with_host(str_bytes(&host))
                .with_port(port as i32)
                .with_rack(rack.as_deref().map(str_bytes))
        })
        .collect();
    let response = FetchResponse::default()
        .with_error_code(0)
        .with_session_id(session_id)
        .with_responses(responses)
        .with_node_endpoints(node_endpoints);
    (response, files)
}

fn resolve(ctx: &RequestContext, key: PartitionKey, cached: CachedPartition, uses_ids: bool) -> Target {
    let replicas = &ctx.state.replicas;
    let (topic, name, id) = match &key.0 {
        TopicKey::Id(id) => {
            let t = replicas.topic_by_id(id);
            let name = match &t {
                Some(t) => t.name.clone(),
                None => super::routing::topic_name_for_id(&ctx.state, id).unwrap_or_default(),
            };
            (t, name, *id)
        }
        TopicKey::Name(n) => {
            let t = replicas.topic(n);
            let id = t.as_ref().map(|t| t.id).unwrap_or(Uuid::nil());
            (t, n.clone(), id)
        }
    };
    let unknown = if uses_ids { ResponseError::UnknownTopicId } else { ResponseError::UnknownTopicOrPartition }.code();
    let routed = if name.is_empty() { Ok(()) } else { super::routing::check(&ctx.state, &name, key.1) };
    let (partition, leader) = match (routed, topic) {
        (Err(n), _) => (Err(n.code), n.leader),
        (Ok(()), None) => (Err(unknown), None),
        (Ok(()), Some(t)) => (t.partition(key.1).cloned().ok_or(ResponseError::UnknownTopicOrPartition.code()), None),
    };
    Target { key, cached, topic_name: name, topic_id: id, partition, leader }
}

/// Reads every target in order within the response byte budget. The first
/// partition with data may exceed the budget by one batch, as in Kafka, so a
/// consumer always makes progress. Records stay in their files (placeholders
/// registered in the returned `FileRecords`) unless the placeholder region is
/// full, in which case they are read into memory.
fn read_all(
    targets: &[Target],
    response_max_bytes: usize,
    read_committed: bool,
) -> (Vec<PartitionResult>, FileRecords) {
    let mut remaining = response_max_bytes;
    let mut total = 0usize;
    let mut files = FileRecords::default();
    let results = targets
        .iter()
        .map(|t| {
            let partition = match &t.partition {
                Ok(p) => p,
                Err(code) => return PartitionResult { error_code: *code, offsets: None, records: Bytes::new(), aborted: Vec::new() },
            };
            let max_bytes = (t.cached.max_bytes.max(0) as usize).min(remaining);
            let min_one = total == 0;
            match partition.read(t.cached.fetch_offset, max_bytes, read_committed, min_one) {
                Ok((info, offsets, aborted)) => {
                    let records = match files.add(info.slices) {
                        Ok(placeholder) => placeholder,
                        Err(slices) => {
                            let mut records = Vec::with_capacity(info.bytes);
                            for slice in &slices {
                                if let Err(e) = slice.read_into(&mut records) {
                                    tracing::error!(topic = %t.topic_name, partition = t.key.1, error = %e, "segment read failed");
                                    return PartitionResult {
                                        error_code: error::storage_code(&e),
                                        offsets: Some(offsets),
                                        records: Bytes::new(),
                                        aborted: Vec::new(),
                                    };
                                }
                            }
                            Bytes::from(records)
                        }
                    };
                    remaining = remaining.saturating_sub(records.len());
                    total += records.len();
                    PartitionResult { error_code: 0, offsets: Some(offsets), records, aborted }
                }
                Err(e) => {
                    let offsets = partition.offsets().ok();
                    PartitionResult { error_code: error::partition_code(&e), offsets, records: Bytes::new(), aborted: Vec::new() }
                }
            }
        })
        .collect();
    (results, files)
}
