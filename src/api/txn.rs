//! Transaction APIs: AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
//! TxnOffsetCommit, ListTransactions, DescribeTransactions. InitProducerId
//! with a transactional id is routed here from `producer.rs`.

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState as DescribedState};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedState;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use kafka_protocol::error::ResponseError;

use super::RequestContext;

/// KIP-588 introduced PRODUCER_FENCED at these versions; older clients only
/// know INVALID_PRODUCER_EPOCH for the same condition.
fn fenced_for(version: i16, first_version_with_fenced: i16, code: i16) -> i16 {
    if code == ResponseError::ProducerFenced.code() && version < first_version_with_fenced {
        ResponseError::InvalidProducerEpoch.code()
    } else {
        code
    }
}
use crate::group::{OffsetToCommit, TxnCommitRequest, OFFSETS_TOPIC};

/// Groups (topic, partition, error) results by topic for the response.
fn topic_results(results: Vec<(String, i32, i16)>) -> Vec<AddPartitionsToTxnTopicResult> {
    let mut out: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
    for (topic, partition, error) in results {
        let p = AddPartitionsToTxnPartitionResult::default()
            .with_partition_index(partition)
            .with_partition_error_code(error);
        match out.iter_mut().find(|t| t.name.0.as_str() == topic) {
            Some(t) => t.results_by_partition.push(p),
            None => out.push(
                AddPartitionsToTxnTopicResult::default()
                    .with_name(TopicName(StrBytes::from_string(topic)))
                    .with_results_by_partition(vec![p]),
            ),
        }
    }
    out
}

pub async fn add_partitions(ctx: &RequestContext, req: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse {
    let txns = ctx.state.txns();
    let parts = |topics: &[add_partitions_to_txn_request::AddPartitionsToTxnTopic]| {
        topics.iter().map(|t| (t.name.0.to_string(), t.partitions.clone())).collect::<Vec<_>>()
    };
    if ctx.version < 4 {
        // One transaction, named at the top level (the client form).
        let results = txns
            .add_partitions(
                req.v3_and_below_transactional_id.0.as_str(),
                req.v3_and_below_producer_id.0,
                req.v3_and_below_producer_epoch,
                parts(&req.v3_and_below_topics),
                false,
            )
            .await;
        let results = results.into_iter().map(|(t, p, c)| (t, p, fenced_for(ctx.version, 2, c))).collect();
        return AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(topic_results(results));
    }
    // v4+: batched, possibly verify-only (the broker-to-broker form of KIP-890).
    let mut results_by_transaction = Vec::new();
    for t in &req.transactions {
        let results = txns
            .add_partitions(
                t.transactional_id.0.as_str(),
                t.producer_id.0,
                t.producer_epoch,
                parts(&t.topics),
                t.verify_only,
            )
            .await;
        results_by_transaction.push(
            AddPartitionsToTxnResult::default()
                .with_transactional_id(t.transactional_id.clone())
                .with_topic_results(topic_results(results)),
        );
    }
    AddPartitionsToTxnResponse::default().with_error_code(0).with_results_by_transaction(results_by_transaction)
}

/// The `__consumer_offsets` partition of `group_id`. In a cluster the
/// topic's partition count comes from the image (the topic is created on
/// first use); on a single node from the local coordinator.
async fn offsets_partition(ctx: &RequestContext, group_id: &str) -> Result<i32, i16> {
    let Some(cluster) = ctx.state.cluster() else { return Ok(ctx.state.groups().partition_for(group_id)) };
    let count = cluster
        .ensure_internal_topic(ctx.state.config(), OFFSETS_TOPIC)
        .await
        .map_err(|_| ResponseError::CoordinatorNotAvailable.code())?;
    Ok(crate::group::records::partition_for(group_id, count))
}

pub async fn add_offsets(ctx: &RequestContext, req: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse {
    // The group's offsets partition joins the transaction like any other partition.
    let partition = match offsets_partition(ctx, req.group_id.0.as_str()).await {
        Ok(p) => p,
        Err(code) => return AddOffsetsToTxnResponse::default().with_error_code(code),
    };
    let results = ctx
        .state
        .txns()
        .add_partitions(
            req.transactional_id.0.as_str(),
            req.producer_id.0,
            req.producer_epoch,
            vec![(OFFSETS_TOPIC.to_string(), vec![partition])],
            false,
        )
        .await;
    let error = results.first().map(|r| r.2).unwrap_or(0);
    AddOffsetsToTxnResponse::default().with_error_code(fenced_for(ctx.version, 2, error))
}

pub async fn end_txn(ctx: &RequestContext, req: EndTxnRequest) -> EndTxnResponse {
    let error = ctx
        .state
        .txns()
        .end_txn(req.transactional_id.0.as_str(), req.producer_id.0, req.producer_epoch, req.committed)
        .await;
    EndTxnResponse::default().with_error_code(fenced_for(ctx.version, 2, error))
}

pub async fn txn_offset_commit(ctx: &RequestContext, req: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse {
    let mut offsets = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            offsets.push(OffsetToCommit {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: if ctx.version >= 2 { p.committed_leader_epoch } else { -1 },
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            });
        }
    }
    let groups = ctx.state.groups();
    let partition = groups.partition_for(req.group_id.0.as_str());
    // The group's offsets partition must have been added (AddOffsetsToTxn) first,
    // as the transaction's coordinator (here or on another broker) knows.
    let verified = match verify_in_txn(
        &ctx.state,
        Some(req.transactional_id.0.as_str()),
        req.producer_id.0,
        req.producer_epoch,
        &[(OFFSETS_TOPIC.to_string(), partition)],
    )
    .await
    {
        Ok(codes) if codes.first() == Some(&0) => Ok(()),
        Ok(codes) => Err(codes.first().copied().unwrap_or(ResponseError::InvalidTxnState.code())),
        Err(e) => {
            tracing::warn!(error = %e.0, "cannot verify a transactional offset commit");
            Err(ResponseError::CoordinatorLoadInProgress.code())
        }
    };
    let errors = match verified {
        Err(code) => vec![code; offsets.len()],
        Ok(()) => {
            let (generation, member_id, instance) = if ctx.version >= 3 {
                (req.generation_id, req.member_id.to_string(), req.group_instance_id.as_ref().map(|s| s.to_string()))
            } else {
                (-1, String::new(), None)
            };
            groups
                .txn_commit(TxnCommitRequest {
                    group_id: req.group_id.0.to_string(),
                    producer_id: req.producer_id.0,
                    producer_epoch: req.producer_epoch,
                    generation,
                    member_id,
                    group_instance_id: instance,
                    offsets,
                })
                .await
        }
    };
    let mut errors = errors.into_iter();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            TxnOffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        TxnOffsetCommitResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(errors.next().unwrap_or(0))
                    })
                    .collect(),
            )
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}

pub async fn list_transactions(ctx: &RequestContext, req: ListTransactionsRequest) -> ListTransactionsResponse {
    const KNOWN: &[&str] = &[
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    ];
    let states: Vec<String> = req.state_filters.iter().map(|s| s.to_string()).collect();
    let unknown: Vec<StrBytes> =
        states.iter().filter(|s| !KNOWN.contains(&s.as_str())).map(|s| StrBytes::from_string(s.clone())).collect();
    let pids: Vec<i64> = req.producer_id_filters.iter().map(|p| p.0).collect();
    let now = crate::util::now_ms();
    let (error, list) = ctx.state.txns().list().await;
    let mut listed: Vec<ListedState> = list
        .into_iter()
        .filter(|t| states.is_empty() || states.contains(&t.state))
        .filter(|t| pids.is_empty() || pids.contains(&t.producer_id))
        // v1+: only transactions running longer than the filter (KIP-994).
        .filter(|t| {
            ctx.version < 1 || req.duration_filter < 0 || (t.start_ms >= 0 && now - t.start_ms >= req.duration_filter)
        })
        .map(|t| {
            ListedState::default()
                .with_transactional_id(TransactionalId(StrBytes::from_string(t.transactional_id)))
                .with_producer_id(ProducerId(t.producer_id))
                .with_transaction_state(StrBytes::from_string(t.state))
        })
        .collect();
    listed.sort_by(|a, b| a.transactional_id.0.as_str().cmp(b.transactional_id.0.as_str()));
    ListTransactionsResponse::default()
        .with_error_code(error)
        .with_unknown_state_filters(unknown)
        .with_transaction_states(listed)
}

pub async fn describe_transactions(
    ctx: &RequestContext,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut states = Vec::new();
    for id in &req.transactional_ids {
        let d = ctx.state.txns().describe(id.0.as_str()).await;
        states.push(
            DescribedState::default()
                .with_error_code(d.error)
                .with_transactional_id(id.clone())
                .with_transaction_state(StrBytes::from_string(d.state))
                .with_transaction_timeout_ms(d.timeout_ms)
                .with_transaction_start_time_ms(d.start_ms)
                .with_producer_id(ProducerId(d.producer_id))
                .with_producer_epoch(d.producer_epoch)
                .with_topics(
                    d.partitions
                        .into_iter()
                        .map(|(t, ps)| {
                            TopicData::default().with_topic(TopicName(StrBytes::from_string(t))).with_partitions(ps)
                        })
                        .collect(),
                ),
        );
    }
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

/// WriteTxnMarkers: what a coordinator asks partition leaders to do. This
/// broker's own coordinator writes its markers directly; the API serves other
/// callers (and Kafka's tools) the same way.
pub async fn write_txn_markers(ctx: &RequestContext, req: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse {
    use kafka_protocol::messages::write_txn_markers_response::{
        WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    };
    let mut markers = Vec::new();
    for m in &req.markers {
        let mut topics = Vec::new();
        for t in &m.topics {
            let mut partitions = Vec::new();
            for p in &t.partition_indexes {
                let known =
                    ctx.state.replicas.topic(t.name.0.as_str()).is_some_and(|topic| topic.partition(*p).is_some());
                let routed = super::routing::check(&ctx.state, t.name.0.as_str(), *p);
                let error = if let Err(n) = routed {
                    n.code
                } else if !known {
                    kafka_protocol::error::ResponseError::UnknownTopicOrPartition.code()
                } else {
                    crate::txn::write_local_marker(
                        &ctx.state.replicas,
                        ctx.state.groups(),
                        (t.name.0.as_str(), *p),
                        m.producer_id.0,
                        m.producer_epoch,
                        m.transaction_result,
                        m.coordinator_epoch,
                    )
                    .await
                    .err()
                    .unwrap_or(0)
                };
                partitions
                    .push(WritableTxnMarkerPartitionResult::default().with_partition_index(*p).with_error_code(error));
            }
            topics.push(WritableTxnMarkerTopicResult::default().with_name(t.name.clone()).with_partitions(partitions));
        }
        markers.push(WritableTxnMarkerResult::default().with_producer_id(m.producer_id).with_topics(topics));
    }
    WriteTxnMarkersResponse::default().with_markers(markers)
}

/// Why a transaction's coordinator could not answer a verification.
#[derive(Debug)]
pub struct VerifyUnavailable(pub String);

/// KIP-890 part 1: for each partition, whether it is in producer
/// `producer_id`/`epoch`'s open transaction (0) or the code saying why not.
/// Asked of this broker's registry when it coordinates `transactional_id`
/// (always on a single node), else of the coordinator broker with
/// AddPartitionsToTxn v4 verify-only.
pub async fn verify_in_txn(
    state: &crate::broker::BrokerState,
    transactional_id: Option<&str>,
    producer_id: i64,
    epoch: i16,
    partitions: &[(String, i32)],
) -> Result<Vec<i16>, VerifyUnavailable> {
    let local = |state: &crate::broker::BrokerState| {
        partitions
            .iter()
            .map(|(t, p)| state.txns().open.verify(producer_id, epoch, t, *p).err().unwrap_or(0))
            .collect::<Vec<_>>()
    };
    let (Some(cluster), Some(id)) = (state.cluster(), transactional_id) else { return Ok(local(state)) };
    if state.txns().coordinates(id) {
        return Ok(local(state));
    }
    let image = cluster.image();
    let Some(topic) = image.topic(crate::txn::TXN_TOPIC) else {
        return Err(VerifyUnavailable(format!("{} does not exist yet", crate::txn::TXN_TOPIC)));
    };
    let index = crate::group::records::partition_for(id, topic.partitions.len() as i32);
    let leader = topic.partitions.get(&index).map_or(-1, |p| p.leader);
    if leader < 0 || leader == cluster.node_id {
        return Err(VerifyUnavailable(format!("{}-{index} has no coordinator serving it", crate::txn::TXN_TOPIC)));
    }
    use kafka_protocol::messages::add_partitions_to_txn_request::{
        AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
    };
    let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
    for (t, p) in partitions {
        match topics.iter_mut().find(|x| x.name.0.as_str() == t) {
            Some(x) => x.partitions.push(*p),
            None => topics.push(
                AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(StrBytes::from_string(t.clone())))
                    .with_partitions(vec![*p]),
            ),
        }
    }
    let req = AddPartitionsToTxnRequest::default().with_transactions(vec![AddPartitionsToTxnTransaction::default()
        .with_transactional_id(TransactionalId(StrBytes::from_string(id.to_string())))
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(epoch)
        .with_verify_only(true)
        .with_topics(topics)]);
    let resp = cluster.peers().call(&image, leader, &req, 4).await.map_err(|e| VerifyUnavailable(e.to_string()))?;
    if resp.error_code != 0 {
        return Err(VerifyUnavailable(format!("coordinator {leader} answered error {}", resp.error_code)));
    }
    let result = resp.results_by_transaction.iter().find(|r| r.transactional_id.0.as_str() == id);
    Ok(partitions
        .iter()
        .map(|(t, p)| {
            result
                .and_then(|r| r.topic_results.iter().find(|x| x.name.0.as_str() == t))
                .and_then(|x| x.results_by_partition.iter().find(|r| r.partition_index == *p))
                .map_or(ResponseError::InvalidTxnState.code(), |r| r.partition_error_code)
        })
        .collect())
}
