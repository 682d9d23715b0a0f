//! Consumer group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups,
//! DeleteGroups, OffsetDelete. Translation between the wire and
//! [`crate::group`]; the state machine lives there.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::{str_bytes, RequestContext};
use crate::group::{self, CommittedOffset, OffsetToCommit};

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

fn opt_str(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|s| s.to_string())
}

fn client_host(ctx: &RequestContext) -> String {
    format!("/{}", ctx.peer.ip())
}

fn client_id(ctx: &RequestContext) -> String {
    ctx.header.client_id.as_ref().map(|s| s.to_string()).unwrap_or_default()
}

pub async fn find_coordinator(ctx: &RequestContext, req: FindCoordinatorRequest) -> FindCoordinatorResponse {
    if ctx.version < 4 {
        let answer = locate(ctx, req.key_type, req.key.as_str()).await;
        let (error, message, (node, host, port)) = flatten(answer);
        return FindCoordinatorResponse::default()
            .with_error_code(error)
            .with_error_message(message.map(StrBytes::from_string))
            .with_node_id(BrokerId(node))
            .with_host(str_bytes(&host))
            .with_port(port);
    }
    let mut coordinators = Vec::with_capacity(req.coordinator_keys.len());
    for key in &req.coordinator_keys {
        let (error, message, (node, host, port)) = flatten(locate(ctx, req.key_type, key.as_str()).await);
        coordinators.push(
            Coordinator::default()
                .with_key(key.clone())
                .with_node_id(BrokerId(node))
                .with_host(str_bytes(&host))
                .with_port(port)
                .with_error_code(error)
                .with_error_message(message.map(StrBytes::from_string)),
        );
    }
    FindCoordinatorResponse::default().with_coordinators(coordinators)
}

type Located = Result<(i32, String, i32), (i16, Option<String>)>;

fn flatten(answer: Located) -> (i16, Option<String>, (i32, String, i32)) {
    match answer {
        Ok(endpoint) => (0, None, endpoint),
        Err((code, message)) => (code, message, (-1, String::new(), -1)),
    }
}

/// The broker coordinating `key`: this one on a single node; in a cluster,
/// the leader of the `__consumer_offsets` partition the group hashes to
/// (the topic is created on first use, as Kafka does).
async fn locate(ctx: &RequestContext, key_type: i8, key: &str) -> Located {
    match key_type {
        KEY_TYPE_GROUP if key.is_empty() => {
            return Err((ResponseError::InvalidRequest.code(), Some("empty group id".into())))
        }
        KEY_TYPE_TRANSACTION if key.is_empty() => {
            return Err((ResponseError::InvalidRequest.code(), Some("empty transactional id".into())))
        }
        KEY_TYPE_GROUP | KEY_TYPE_TRANSACTION => {}
        other => {
            return Err((ResponseError::InvalidRequest.code(), Some(format!("key type {other} is not supported"))))
        }
    }
    let Some(cluster) = ctx.state.cluster() else {
        let advertised = ctx.state.config().advertised_for(&ctx.listener);
        return Ok((ctx.state.config().node_id, advertised.host.clone(), advertised.port as i32));
    };
    let topic = if key_type == KEY_TYPE_TRANSACTION { crate::txn::TXN_TOPIC } else { group::OFFSETS_TOPIC };
    let count = cluster
        .ensure_internal_topic(ctx.state.config(), topic)
        .await
        .map_err(|e| (ResponseError::CoordinatorNotAvailable.code(), Some(e)))?;
    let partition = group::records::partition_for(key, count);
    let leader = cluster.leadership(topic, partition);
    let leader = match leader {
        crate::cluster::Leadership::Here { .. } => ctx.state.config().node_id,
        crate::cluster::Leadership::Elsewhere { leader, .. } if leader >= 0 => leader,
        _ => {
            return Err((
                ResponseError::CoordinatorNotAvailable.code(),
                Some(format!("{topic}-{partition} has no leader")),
            ))
        }
    };
    match super::routing::endpoints(&ctx.state, &ctx.listener, &[leader]).into_iter().next() {
        Some((id, host, port, _)) => Ok((id, host, port as i32)),
        None => Err((ResponseError::CoordinatorNotAvailable.code(), Some(format!("broker {leader} has no endpoint")))),
    }
}

pub async fn join_group(ctx: &RequestContext, req: JoinGroupRequest) -> JoinGroupResponse {
    let v = ctx.version;
    let request = group::JoinRequest {
        group_id: req.group_id.0.to_string(),
        member_id: req.member_id.to_string(),
        group_instance_id: opt_str(&req.group_instance_id),
        client_id: client_id(ctx),
        client_host: client_host(ctx),
        session_timeout_ms: req.session_timeout_ms,
        // v0 has no rebalance timeout; Kafka uses the session timeout.
        rebalance_timeout_ms: if v >= 1 { req.rebalance_timeout_ms } else { req.session_timeout_ms },
        protocol_type: req.protocol_type.to_string(),
        protocols: req.protocols.iter().map(|p| (p.name.to_string(), p.metadata.clone())).collect(),
        require_known_member_id: v >= 4,
        supports_skip_assignment: v >= 9,
    };
    let r = ctx.state.groups().join(request).await;
    JoinGroupResponse::default()
        .with_error_code(r.error)
        .with_generation_id(r.generation)
        .with_protocol_type(r.protocol_type.map(StrBytes::from_string))
        // Before v7 the protocol name is not nullable.
        .with_protocol_name(Some(StrBytes::from_string(r.protocol_name.unwrap_or_default())))
        .with_leader(StrBytes::from_string(r.leader))
        .with_skip_assignment(r.skip_assignment)
        .with_member_id(StrBytes::from_string(r.member_id))
        .with_members(
            r.members
                .into_iter()
                .map(|m| {
                    JoinGroupResponseMember::default()
                        .with_member_id(StrBytes::from_string(m.member_id))
                        .with_group_instance_id(m.group_instance_id.map(StrBytes::from_string))
                        .with_metadata(m.metadata)
                })
                .collect(),
        )
}

pub async fn sync_group(ctx: &RequestContext, req: SyncGroupRequest) -> SyncGroupResponse {
    let request = group::SyncRequest {
        group_id: req.group_id.0.to_string(),
        generation: req.generation_id,
        member_id: req.member_id.to_string(),
        group_instance_id: opt_str(&req.group_instance_id),
        protocol_type: opt_str(&req.protocol_type),
        protocol_name: opt_str(&req.protocol_name),
        assignments: req.assignments.iter().map(|a| (a.member_id.to_string(), a.assignment.clone())).collect(),
    };
    let r = ctx.state.groups().sync(request).await;
    SyncGroupResponse::default()
        .with_error_code(r.error)
        .with_protocol_type(r.protocol_type.map(StrBytes::from_string))
        .with_protocol_name(r.protocol_name.map(StrBytes::from_string))
        .with_assignment(r.assignment)
}

pub async fn heartbeat(ctx: &RequestContext, req: HeartbeatRequest) -> HeartbeatResponse {
    let request = group::HeartbeatRequest {
        group_id: req.group_id.0.to_string(),
        generation: req.generation_id,
        member_id: req.member_id.to_string(),
        group_instance_id: opt_str(&req.group_instance_id),
    };
    HeartbeatResponse::default().with_error_code(ctx.state.groups().heartbeat(request).await)
}

pub async fn leave_group(ctx: &RequestContext, req: LeaveGroupRequest) -> LeaveGroupResponse {
    let members: Vec<(String, Option<String>)> = if ctx.version >= 3 {
        req.members.iter().map(|m| (m.member_id.to_string(), opt_str(&m.group_instance_id))).collect()
    } else {
        vec![(req.member_id.to_string(), None)]
    };
    let r = ctx.state.groups().leave(group::LeaveRequest { group_id: req.group_id.0.to_string(), members }).await;
    if ctx.version < 3 {
        // One member, one error: it is the top-level error.
        let error = if r.error != 0 { r.error } else { r.members.first().map(|m| m.2).unwrap_or(0) };
        return LeaveGroupResponse::default().with_error_code(error);
    }
    LeaveGroupResponse::default().with_error_code(r.error).with_members(
        r.members
            .into_iter()
            .map(|(id, instance, error)| {
                MemberResponse::default()
                    .with_member_id(StrBytes::from_string(id))
                    .with_group_instance_id(instance.map(StrBytes::from_string))
                    .with_error_code(error)
            })
            .collect(),
    )
}

pub async fn offset_commit(ctx: &RequestContext, req: OffsetCommitRequest) -> OffsetCommitResponse {
    let mut offsets = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            offsets.push(OffsetToCommit {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: if ctx.version >= 6 { p.committed_leader_epoch } else { -1 },
                metadata: opt_str(&p.committed_metadata),
            });
        }
    }
    let errors = ctx
        .state
        .groups()
        .commit(group::CommitRequest {
            group_id: req.group_id.0.to_string(),
            generation: req.generation_id_or_member_epoch,
            member_id: req.member_id.to_string(),
            group_instance_id: opt_str(&req.group_instance_id),
            offsets,
        })
        .await;
    let mut errors = errors.into_iter();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            OffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        OffsetCommitResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(errors.next().unwrap_or(0))
                    })
                    .collect(),
            )
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

/// Groups committed offsets by topic, keeping first-seen order.
fn by_topic(offsets: Vec<CommittedOffset>) -> Vec<(String, Vec<CommittedOffset>)> {
    let mut out: Vec<(String, Vec<CommittedOffset>)> = Vec::new();
    for o in offsets {
        match out.iter_mut().find(|(t, _)| *t == o.topic) {
            Some((_, list)) => list.push(o),
            None => out.push((o.topic.clone(), vec![o])),
        }
    }
    out
}

pub async fn offset_fetch(ctx: &RequestContext, req: OffsetFetchRequest) -> OffsetFetchResponse {
    let coordinator = ctx.state.groups();
    if ctx.version >= 8 {
        let mut groups = Vec::new();
        for g in &req.groups {
            let partitions = g
                .topics
                .as_ref()
                .map(|ts| ts.iter().map(|t| (t.name.0.to_string(), t.partition_indexes.clone())).collect());
            let group = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
            groups.push(match coordinator.fetch_offsets(g.group_id.0.as_str(), partitions, req.require_stable).await {
                Err(code) => group.with_error_code(code),
                Ok(offsets) => group.with_error_code(0).with_topics(
                    by_topic(offsets)
                        .into_iter()
                        .map(|(topic, list)| {
                            OffsetFetchResponseTopics::default()
                                .with_name(TopicName(StrBytes::from_string(topic)))
                                .with_partitions(
                                    list.into_iter()
                                        .map(|o| {
                                            OffsetFetchResponsePartitions::default()
                                                .with_partition_index(o.partition)
                                                .with_committed_offset(o.offset)
                                                .with_committed_leader_epoch(o.leader_epoch)
                                                .with_metadata(Some(StrBytes::from_string(o.metadata)))
                                                .with_error_code(o.error)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                ),
            });
        }
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let partitions: Option<Vec<(String, Vec<i32>)>> =
        req.topics.as_ref().map(|ts| ts.iter().map(|t| (t.name.0.to_string(), t.partition_indexes.clone())).collect());
    match coordinator
        .fetch_offsets(req.group_id.0.as_str(), partitions.clone(), ctx.version >= 7 && req.require_stable)
        .await
    {
        // v1 has no top-level error code: the error goes on every requested partition.
        Err(code) if ctx.version < 2 => OffsetFetchResponse::default().with_topics(
            partitions
                .unwrap_or_default()
                .into_iter()
                .map(|(topic, ps)| {
                    OffsetFetchResponseTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic)))
                        .with_partitions(
                            ps.into_iter()
                                .map(|p| {
                                    OffsetFetchResponsePartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(-1)
                                        .with_metadata(Some(str_bytes("")))
                                        .with_error_code(code)
                                })
                                .collect(),
                        )
                })
                .collect(),
        ),
        Err(code) => OffsetFetchResponse::default().with_error_code(code),
        Ok(offsets) => OffsetFetchResponse::default().with_error_code(0).with_topics(
            by_topic(offsets)
                .into_iter()
                .map(|(topic, list)| {
                    OffsetFetchResponseTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic)))
                        .with_partitions(
                            list.into_iter()
                                .map(|o| {
                                    OffsetFetchResponsePartition::default()
                                        .with_partition_index(o.partition)
                                        .with_committed_offset(o.offset)
                                        .with_committed_leader_epoch(o.leader_epoch)
                                        .with_metadata(Some(StrBytes::from_string(o.metadata)))
                                        .with_error_code(o.error)
                                })
                                .collect(),
                        )
                })
                .collect(),
        ),
    }
}

pub async fn list_groups(ctx: &RequestContext, req: ListGroupsRequest) -> ListGroupsResponse {
    let (error, groups) = ctx.state.groups().list().await;
    let states: Vec<String> = req.states_filter.iter().map(|s| s.to_string().to_ascii_lowercase()).collect();
    let types: Vec<String> = req.types_filter.iter().map(|s| s.to_string().to_ascii_lowercase()).collect();
    let mut listed: Vec<ListedGroup> = groups
        .into_iter()
        .filter(|g| states.is_empty() || states.contains(&g.state.to_ascii_lowercase()))
        .filter(|_| types.is_empty() || types.iter().any(|t| t == "classic"))
        .map(|g| {
            ListedGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(g.group_id)))
                .with_protocol_type(StrBytes::from_string(g.protocol_type))
                .with_group_state(StrBytes::from_string(g.state))
                .with_group_type(str_bytes("classic"))
        })
        .collect();
    listed.sort_by(|a, b| a.group_id.0.as_str().cmp(b.group_id.0.as_str()));
    ListGroupsResponse::default().with_error_code(error).with_groups(listed)
}

pub async fn describe_groups(ctx: &RequestContext, req: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let mut groups = Vec::new();
    for id in &req.groups {
        let d = ctx.state.groups().describe(id.0.as_str()).await;
        // Before v6 an unknown group is described as Dead with no error.
        let not_found = d.error == ResponseError::GroupIdNotFound.code();
        let error = if not_found && ctx.version < 6 { 0 } else { d.error };
        groups.push(
            DescribedGroup::default()
                .with_error_code(error)
                .with_error_message(if error != 0 && ctx.version >= 6 {
                    Some(str_bytes("group does not exist"))
                } else {
                    None
                })
                .with_group_id(id.clone())
                .with_group_state(StrBytes::from_string(if d.state.is_empty() { "Dead".into() } else { d.state }))
                .with_protocol_type(StrBytes::from_string(d.protocol_type))
                .with_protocol_data(StrBytes::from_string(d.protocol))
                .with_members(
                    d.members
                        .into_iter()
                        .map(|m| {
                            DescribedGroupMember::default()
                                .with_member_id(StrBytes::from_string(m.member_id))
                                .with_group_instance_id(m.group_instance_id.map(StrBytes::from_string))
                                .with_client_id(StrBytes::from_string(m.client_id))
                                .with_client_host(StrBytes::from_string(m.client_host))
                                .with_member_metadata(m.metadata)
                                .with_member_assignment(m.assignment)
                        })
                        .collect(),
                )
                .with_authorized_operations(i32::MIN),
        );
    }
    DescribeGroupsResponse::default().with_groups(groups)
}

pub async fn delete_groups(ctx: &RequestContext, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut results = Vec::new();
    for id in &req.groups_names {
        let error = ctx.state.groups().delete_group(id.0.as_str()).await;
        results.push(
            delete_groups_response::DeletableGroupResult::default().with_group_id(id.clone()).with_error_code(error),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

pub async fn offset_delete(ctx: &RequestContext, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let partitions: Vec<(String, Vec<i32>)> = req
        .topics
        .iter()
        .map(|t| (t.name.0.to_string(), t.partitions.iter().map(|p| p.partition_index).collect()))
        .collect();
    match ctx.state.groups().delete_offsets(req.group_id.0.as_str(), partitions).await {
        Err(code) => OffsetDeleteResponse::default().with_error_code(code),
        Ok(results) => {
            let mut topics: Vec<OffsetDeleteResponseTopic> = Vec::new();
            for (topic, partition, error) in results {
                let p = OffsetDeleteResponsePartition::default().with_partition_index(partition).with_error_code(error);
                match topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
                    Some(t) => t.partitions.push(p),
                    None => topics.push(
                        OffsetDeleteResponseTopic::default()
                            .with_name(TopicName(StrBytes::from_string(topic)))
                            .with_partitions(vec![p]),
                    ),
                }
            }
            OffsetDeleteResponse::default().with_error_code(0).with_topics(topics)
        }
    }
}
