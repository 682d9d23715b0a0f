//! Request dispatch: decode one frame, route it to its handler, encode the
//! response. One file per API; error codes come only from [`error`], versions
//! only from [`versions`].

pub mod admin;
pub mod api_versions;
pub mod configs;
pub mod describe_topic_partitions;
pub mod elect_leaders;
pub mod error;
pub mod fetch;
pub mod fetch_session;
pub mod forward;
pub mod group;
pub mod list_offsets;
pub mod metadata;
pub mod offset_for_leader_epoch;
pub mod produce;
pub mod producer;
pub mod quorum;
pub mod reassignments;
pub mod replica_fetch;
pub mod response;
pub mod routing;
pub mod txn;
pub mod versions;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::buf::ByteBufMut;
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::sync::watch;

use crate::broker::BrokerState;
use response::{FileRecords, Response, ResponseBuf};

/// What a connection knows about itself, for handlers.
pub struct RequestContext {
    pub state: Arc<BrokerState>,
    pub listener: String,
    pub peer: SocketAddr,
    pub version: i16,
    pub header: RequestHeader,
    /// Flips to true on broker shutdown; long polls end early.
    pub shutdown: watch::Receiver<bool>,
}

/// What the connection does after a request.
pub enum Outcome {
    /// Send this frame (size prefix included; fetch responses carry file regions).
    Respond(Response),
    /// acks=0 produce: nothing is sent.
    NoResponse,
    /// Close the connection, logging the reason.
    Close(String),
    /// The response comes later (an acks=all produce waiting for its
    /// replicas): the connection goes on reading and handling requests, and
    /// writes responses in request order.
    Deferred(futures_util::future::BoxFuture<'static, Outcome>),
}

/// Handles one request frame (without its size prefix).
pub async fn handle(
    state: &Arc<BrokerState>,
    listener: &str,
    peer: SocketAddr,
    frame: Bytes,
    shutdown: &watch::Receiver<bool>,
) -> Outcome {
    // api_key (2) + api_version (2) + correlation_id (4) before anything else.
    if frame.len() < 8 {
        return Outcome::Close(format!("request of {} bytes is shorter than a request header", frame.len()));
    }
    let api_key_raw = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let Ok(api_key) = ApiKey::try_from(api_key_raw) else {
        return Outcome::Close(format!("unknown API key {api_key_raw}"));
    };
    let in_cluster = state.cluster().is_some();
    if !versions::is_supported(api_key, version, in_cluster) {
        if api_key == ApiKey::ApiVersions {
            // KIP-511: answer with v0 and UNSUPPORTED_VERSION so the client can retry with a version we list.
            let body = api_versions::unsupported_version_response(in_cluster);
            return encode(correlation_id, 0, ApiKey::ApiVersions, 0, &ResponseKind::ApiVersions(body), None);
        }
        return Outcome::Close(match versions::supported_range(api_key, in_cluster) {
            Some((lo, hi)) => format!("{api_key:?} version {version} is not supported (supported: {lo}..={hi})"),
            None => format!("{api_key:?} is not supported"),
        });
    }
    let mut body = frame;
    let header_version = api_key.request_header_version(version);
    let header = match RequestHeader::decode(&mut body, header_version) {
        Ok(h) => h,
        Err(e) => return Outcome::Close(format!("cannot decode {api_key:?} v{version} request header: {e}")),
    };
    let request = match RequestKind::decode(api_key, &mut body, version) {
        Ok(r) => r,
        Err(e) => return Outcome::Close(format!("cannot decode {api_key:?} v{version} request: {e}")),
    };
    let ctx = RequestContext {
        state: state.clone(),
        listener: listener.to_string(),
        peer,
        version,
        header,
        shutdown: shutdown.clone(),
    };
    // The file slices a fetch response's records stand for (see `response`).
    let mut files = FileRecords::default();
    let response = match request {
        RequestKind::ApiVersions(r) => ResponseKind::ApiVersions(api_versions::handle(&ctx, r)),
        RequestKind::Metadata(r) if state.cluster().is_some() => {
            ResponseKind::Metadata(metadata::handle_cluster(&ctx, r).await)
        }
        RequestKind::Metadata(r) => ResponseKind::Metadata(metadata::handle(&ctx, r)),
        RequestKind::Produce(r) => match produce::handle(&ctx, r).await {
            produce::ProduceOutcome::Respond(resp) => ResponseKind::Produce(resp),
            produce::ProduceOutcome::NoResponse => return Outcome::NoResponse,
            produce::ProduceOutcome::Close(reason) => return Outcome::Close(reason),
            produce::ProduceOutcome::Deferred(later) => {
                let header_version = api_key.response_header_version(version);
                return Outcome::Deferred(Box::pin(async move {
                    let response = ResponseKind::Produce(later.await);
                    encode(correlation_id, header_version, api_key, version, &response, None)
                }));
            }
        },
        RequestKind::Fetch(r) => {
            let (response, records) = fetch::handle(&ctx, r).await;
            files = records;
            ResponseKind::Fetch(response)
        }
        RequestKind::ListOffsets(r) => ResponseKind::ListOffsets(list_offsets::handle(&ctx, r)),
        RequestKind::OffsetForLeaderEpoch(r) => {
            ResponseKind::OffsetForLeaderEpoch(offset_for_leader_epoch::handle(&ctx, r))
        }
        RequestKind::CreateTopics(r) if state.cluster().is_some() => {
            ResponseKind::CreateTopics(forward::create_topics(&ctx, r).await)
        }
        RequestKind::CreateTopics(r) => ResponseKind::CreateTopics(admin::create_topics(&ctx, r)),
        RequestKind::DeleteTopics(r) if state.cluster().is_some() => {
            ResponseKind::DeleteTopics(forward::delete_topics(&ctx, r).await)
        }
        RequestKind::DeleteTopics(r) => ResponseKind::DeleteTopics(admin::delete_topics(&ctx, r)),
        RequestKind::CreatePartitions(r) if state.cluster().is_some() => {
            ResponseKind::CreatePartitions(forward::create_partitions(&ctx, r).await)
        }
        RequestKind::CreatePartitions(r) => ResponseKind::CreatePartitions(admin::create_partitions(&ctx, r)),
        RequestKind::ElectLeaders(r) => ResponseKind::ElectLeaders(elect_leaders::handle(&ctx, r).await),
        RequestKind::AlterPartitionReassignments(r) => {
            ResponseKind::AlterPartitionReassignments(reassignments::alter(&ctx, r).await)
        }
        RequestKind::ListPartitionReassignments(r) => {
            ResponseKind::ListPartitionReassignments(reassignments::list(&ctx, r))
        }
        RequestKind::DescribeTopicPartitions(r) => {
            ResponseKind::DescribeTopicPartitions(describe_topic_partitions::handle(&ctx, r))
        }
        RequestKind::DeleteRecords(r) => ResponseKind::DeleteRecords(admin::delete_records(&ctx, r).await),
        RequestKind::DescribeCluster(r) => ResponseKind::DescribeCluster(admin::describe_cluster(&ctx, r)),
        RequestKind::DescribeQuorum(r) => ResponseKind::DescribeQuorum(quorum::describe_quorum(&ctx, r).await),
        RequestKind::DescribeConfigs(r) => ResponseKind::DescribeConfigs(configs::describe(&ctx, r)),
        RequestKind::FindCoordinator(r) => ResponseKind::FindCoordinator(group::find_coordinator(&ctx, r).await),
        RequestKind::JoinGroup(r) => ResponseKind::JoinGroup(group::join_group(&ctx, r).await),
        RequestKind::SyncGroup(r) => ResponseKind::SyncGroup(group::sync_group(&ctx, r).await),
        RequestKind::Heartbeat(r) => ResponseKind::Heartbeat(group::heartbeat(&ctx, r).await),
        RequestKind::LeaveGroup(r) => ResponseKind::LeaveGroup(group::leave_group(&ctx, r).await),
        RequestKind::OffsetCommit(r) => ResponseKind::OffsetCommit(group::offset_commit(&ctx, r).await),
        RequestKind::OffsetFetch(r) => ResponseKind::OffsetFetch(group::offset_fetch(&ctx, r).await),
        RequestKind::ListGroups(r) => ResponseKind::ListGroups(group::list_groups(&ctx, r).await),
        RequestKind::DescribeGroups(r) => ResponseKind::DescribeGroups(group::describe_groups(&ctx, r).await),
        RequestKind::DeleteGroups(r) => ResponseKind::DeleteGroups(group::delete_groups(&ctx, r).await),
        RequestKind::OffsetDelete(r) => ResponseKind::OffsetDelete(group::offset_delete(&ctx, r).await),
        RequestKind::AddPartitionsToTxn(r) => ResponseKind::AddPartitionsToTxn(txn::add_partitions(&ctx, r).await),
        RequestKind::AddOffsetsToTxn(r) => ResponseKind::AddOffsetsToTxn(txn::add_offsets(&ctx, r).await),
        RequestKind::EndTxn(r) => ResponseKind::EndTxn(txn::end_txn(&ctx, r).await),
        RequestKind::TxnOffsetCommit(r) => ResponseKind::TxnOffsetCommit(txn::txn_offset_commit(&ctx, r).await),
        RequestKind::WriteTxnMarkers(r) => ResponseKind::WriteTxnMarkers(txn::write_txn_markers(&ctx, r).await),
        RequestKind::ListTransactions(r) => ResponseKind::ListTransactions(txn::list_transactions(&ctx, r).await),
        RequestKind::DescribeTransactions(r) => {
            ResponseKind::DescribeTransactions(txn::describe_transactions(&ctx, r).await)
        }
        RequestKind::DescribeProducers(r) => ResponseKind::DescribeProducers(producer::describe_producers(&ctx, r)),
        RequestKind::InitProducerId(r) => ResponseKind::InitProducerId(producer::init_producer_id(&ctx, r).await),
        RequestKind::AlterConfigs(r) => ResponseKind::AlterConfigs(configs::alter(&ctx, r).await),
        RequestKind::IncrementalAlterConfigs(r) => {
            ResponseKind::IncrementalAlterConfigs(configs::incremental_alter(&ctx, r).await)
        }
        other => {
            // versions::advertised and this match must agree; a mismatch is a bug, not bad input.
            return Outcome::Close(format!("no handler for {:?}", std::mem::discriminant(&other)));
        }
    };
    let response_header_version = api_key.response_header_version(version);
    let files = if files.is_empty() { None } else { Some(&files) };
    encode(correlation_id, response_header_version, api_key, version, &response, files)
}

/// Encodes a response frame: size prefix, response header, body. With
/// `files`, the body's records placeholders become file regions of the frame
/// (see [`response`]); without, the frame is one `BytesMut`.
/// Encoding our own structs fails only on a programming error (a field set
/// that does not exist at this version). A truncated frame would desynchronise
/// the client, so the connection is closed instead; debug builds fail loudly.
fn encode(
    correlation_id: i32,
    header_version: i16,
    api_key: ApiKey,
    version: i16,
    body: &ResponseKind,
    files: Option<&FileRecords>,
) -> Outcome {
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let encoded = match (files, body) {
        (None, body) => {
            let mut buf = BytesMut::with_capacity(64);
            encode_frame(&mut buf, &header, header_version, |buf| body.encode(buf, version))
                .map(|()| Response::bytes(buf))
        }
        // Only fetch responses carry records placeholders.
        (Some(files), ResponseKind::Fetch(fetch)) => {
            let mut buf = ResponseBuf::new(files);
            encode_frame(&mut buf, &header, header_version, |buf| fetch.encode(buf, version))
                .and_then(|()| buf.finish())
        }
        (Some(_), _) => Err("file regions for a response other than Fetch".to_string()),
    };
    match encoded {
        Ok(response) => Outcome::Respond(response),
        Err(e) => {
            tracing::error!(?api_key, version, error = %e, "response encoding failed");
            debug_assert!(false, "{api_key:?} v{version} response encoding failed: {e}");
            Outcome::Close(format!("internal error encoding the {api_key:?} v{version} response"))
        }
    }
}

/// Size prefix, header, then `body` into `buf`; the size counts file regions.
fn encode_frame<B: ByteBufMut, E: std::fmt::Display>(
    buf: &mut B,
    header: &ResponseHeader,
    header_version: i16,
    body: impl FnOnce(&mut B) -> Result<(), E>,
) -> Result<(), String> {
    buf.put_i32(0);
    header.encode(buf, header_version).map_err(|e| format!("{e:#}"))?;
    body(buf).map_err(|e| format!("{e:#}"))?;
    let size = (buf.offset() - 4) as i32;
    buf.range(0..4).copy_from_slice(&size.to_be_bytes());
    Ok(())
}

/// Converts a `&str` into the protocol's string type.
pub fn str_bytes(s: &str) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.to_string())
}
