//! Fetch from a follower (the request names a replica id): the leader reads
//! up to its log end offset rather than the high watermark, records each
//! follower's fetch offset as its progress (which moves the high watermark
//! and may add it back to the ISR), answers a diverging log with the epoch
//! and offset to truncate to (KIP-320), and long-polls on appends rather
//! than on the high watermark. No fetch sessions: a follower asks for all
//! its partitions every time.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::select_all;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::{EpochEndOffset, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use tokio::time::Instant;
use uuid::Uuid;

use super::response::FileRecords;
use super::{error, str_bytes, RequestContext};
use crate::replica::state::Effect;
use crate::replica::throttle::Throttles;
use crate::replica::Partition;

const MAX_WAIT_MS_CAP: i32 = 60_000;

struct Asked {
    topic_id: Uuid,
    topic_name: String,
    index: i32,
    partition: Result<Arc<Partition>, i16>,
    fetch_offset: i64,
    log_start_offset: i64,
    last_fetched_epoch: i32,
    current_leader_epoch: i32,
    max_bytes: i32,
    /// The replica's copy is throttled here (leader.replication.throttled.*).
    throttled: bool,
}

struct Answer {
    code: i16,
    records: Bytes,
    high_watermark: i64,
    last_stable_offset: i64,
    log_start_offset: i64,
    diverging: Option<(i32, i64)>,
    effects: Vec<Effect>,
}

pub async fn handle(
    ctx: &RequestContext,
    req: FetchRequest,
    replica: i32,
    broker_epoch: i64,
) -> (FetchResponse, FileRecords) {
    let uses_ids = ctx.version >= 13;
    let throttles = ctx.state.replication().map(|r| r.throttles());
    let mut asked = Vec::new();
    for t in &req.topics {
        let topic = if uses_ids {
            ctx.state.replicas.topic_by_id(&t.topic_id)
        } else {
            ctx.state.replicas.topic(t.topic.0.as_str())
        };
        for p in &t.partitions {
            let partition = match &topic {
                None if uses_ids => Err(ResponseError::UnknownTopicId.code()),
                None => Err(ResponseError::UnknownTopicOrPartition.code()),
                Some(topic) => topic.partition(p.partition).cloned().ok_or(ResponseError::NotLeaderOrFollower.code()),
            };
            let topic_id = topic.as_ref().map_or(t.topic_id, |t| t.id);
            asked.push(Asked {
                topic_id,
                topic_name: topic.as_ref().map_or_else(|| t.topic.0.to_string(), |t| t.name.clone()),
                index: p.partition,
                partition,
                fetch_offset: p.fetch_offset,
                log_start_offset: if ctx.version >= 5 { p.log_start_offset } else { -1 },
                last_fetched_epoch: if ctx.version >= 12 { p.last_fetched_epoch } else { -1 },
                current_leader_epoch: if ctx.version >= 9 { p.current_leader_epoch } else { -1 },
                max_bytes: p.partition_max_bytes,
                throttled: throttles.is_some_and(|th| th.leader_throttles(&topic_id, p.partition, replica)),
            });
        }
    }
    let response_max_bytes = (req.max_bytes.max(0) as usize).min(ctx.state.config().fetch_max_bytes.max(1 << 20));
    let min_bytes = req.min_bytes.max(0) as usize;
    let deadline = Instant::now() + Duration::from_millis(req.max_wait_ms.clamp(0, MAX_WAIT_MS_CAP) as u64);
    let mut shutdown = ctx.shutdown.clone();
    let (answers, files) = loop {
        let mut watchers: Vec<_> =
            asked.iter().filter_map(|a| a.partition.as_ref().ok()).map(|p| p.subscribe_log_end()).collect();
        for w in &mut watchers {
            w.borrow_and_update();
        }
        let (answers, files) = read_all(&asked, replica, broker_epoch, response_max_bytes, throttles);
        let bytes: usize = answers.iter().map(|a| a.records.len()).sum();
        let done = bytes >= min_bytes.max(1)
            || answers.iter().any(|a| a.code != 0 || a.diverging.is_some() || !a.effects.is_empty())
            || watchers.is_empty()
            || Instant::now() >= deadline
            || *shutdown.borrow();
        if done {
            break (answers, files);
        }
        let changed = select_all(watchers.iter_mut().map(|w| Box::pin(w.changed())));
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shutdown.changed() => {}
        }
    };
    let mut responses: Vec<FetchableTopicResponse> = Vec::new();
    for (a, answer) in asked.iter().zip(answers) {
        if let (Ok(p), Some(replication)) = (&a.partition, ctx.state.replication()) {
            replication.carry_out(a.topic_id, p, answer.effects);
        }
        let mut data = PartitionData::default()
            .with_partition_index(a.index)
            .with_error_code(answer.code)
            .with_high_watermark(answer.high_watermark)
            .with_last_stable_offset(answer.last_stable_offset)
            .with_log_start_offset(answer.log_start_offset)
            .with_preferred_read_replica(BrokerId(-1))
            .with_records(Some(answer.records));
        if let Some((epoch, end_offset)) = answer.diverging {
            data = data.with_diverging_epoch(EpochEndOffset::default().with_epoch(epoch).with_end_offset(end_offset));
        }
        let same = responses.last().is_some_and(|t| {
            if uses_ids {
                t.topic_id == a.topic_id
            } else {
                t.topic.0.as_str() == a.topic_name
            }
        });
        if !same {
            let t = if uses_ids {
                FetchableTopicResponse::default().with_topic_id(a.topic_id)
            } else {
                FetchableTopicResponse::default().with_topic(TopicName(str_bytes(&a.topic_name)))
            };
            responses.push(t);
        }
        responses.last_mut().expect("pushed above").partitions.push(data);
    }
    let response = FetchResponse::default().with_error_code(0).with_session_id(0).with_responses(responses);
    (response, files)
}

fn read_all(
    asked: &[Asked],
    replica: i32,
    broker_epoch: i64,
    response_max_bytes: usize,
    throttles: Option<&Throttles>,
) -> (Vec<Answer>, FileRecords) {
    let now = crate::util::now_ms();
    let instant = std::time::Instant::now();
    let quota_used_up = throttles.is_some_and(|t| asked.iter().any(|a| a.throttled) && t.leader.exceeded(instant));
    let mut remaining = response_max_bytes;
    let mut files = FileRecords::default();
    let answers = asked
        .iter()
        .map(|a| {
            let failed = |code: i16, p: Option<&Arc<Partition>>| {
                let offsets = p.and_then(|p| p.offsets().ok());
                Answer {
                    code,
                    records: Bytes::new(),
                    high_watermark: offsets.map_or(-1, |o| o.high_watermark),
                    last_stable_offset: offsets.map_or(-1, |o| o.last_stable_offset),
                    log_start_offset: offsets.map_or(-1, |o| o.log_start_offset),
                    diverging: None,
                    effects: Vec::new(),
                }
            };
            let p = match &a.partition {
                Ok(p) => p,
                Err(code) => return failed(*code, None),
            };
            let max_bytes = (a.max_bytes.max(0) as usize).min(remaining);
            let read = p.read_for_follower(
                replica,
                broker_epoch,
                a.fetch_offset,
                a.log_start_offset,
                a.last_fetched_epoch,
                a.current_leader_epoch,
                max_bytes,
                a.throttled && quota_used_up,
                now,
            );
            match read {
                Ok(r) => {
                    let records = match files.add(r.info.slices) {
                        Ok(placeholder) => placeholder,
                        Err(slices) => {
                            let mut bytes = Vec::with_capacity(r.info.bytes);
                            for slice in &slices {
                                if let Err(e) = slice.read_into(&mut bytes) {
                                    return failed(error::storage_code(&e), Some(p));
                                }
                            }
                            Bytes::from(bytes)
                        }
                    };
                    remaining = remaining.saturating_sub(records.len());
                    if let (true, Some(t)) = (a.throttled, throttles) {
                        t.leader.record(records.len(), instant);
                    }
                    Answer {
                        code: 0,
                        records,
                        high_watermark: r.offsets.high_watermark,
                        last_stable_offset: r.offsets.last_stable_offset,
                        log_start_offset: r.offsets.log_start_offset,
                        diverging: r.diverging,
                        effects: r.effects,
                    }
                }
                Err(e) => failed(error::partition_code(&e), Some(p)),
            }
        })
        .collect();
    (answers, files)
}
