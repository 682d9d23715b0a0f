//! A classic group's in-memory state: members, generation, protocol, leader,
//! and committed offsets.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use indexmap::IndexMap;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{JoinResponse, SyncResponse};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

#[derive(Debug)]
pub struct Member {
    pub id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    /// (protocol name, metadata), in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    /// Set while the member waits for the rebalance to complete.
    pub join_waiter: Option<oneshot::Sender<JoinResponse>>,
    /// Set while the member waits for the leader's assignment.
    pub sync_waiter: Option<oneshot::Sender<SyncResponse>>,
    /// Heartbeat deadline; a member waiting in join or sync is kept alive regardless.
    pub session_deadline: Instant,
}

impl Member {
    pub fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|(n, _)| n == protocol).map(|(_, m)| m.clone()).unwrap_or_default()
    }

    /// Same protocols, same metadata, same order: rejoining changes nothing.
    pub fn matches(&self, protocols: &[(String, Bytes)]) -> bool {
        self.protocols == protocols
    }
}

#[derive(Debug, Clone)]
pub struct OffsetEntry {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
}

#[derive(Debug)]
pub struct Group {
    pub id: String,
    pub state: GroupState,
    /// When the group entered its current state (wall clock, persisted; drives offset expiry).
    pub state_since_ms: i64,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    /// Members in join order: the first is the leader when the old one is gone.
    pub members: IndexMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED that have not joined yet, with their deadline.
    pub pending_members: HashMap<String, Instant>,
    /// Static membership: group.instance.id → current member id.
    pub static_members: HashMap<String, String>,
    /// Members that must still send SyncGroup in this generation.
    pub pending_sync: HashSet<String>,
    /// PreparingRebalance: the join phase ends at this deadline at the latest.
    pub rebalance_deadline: Option<Instant>,
    /// PreparingRebalance from Empty: do not complete before this (group.initial.rebalance.delay.ms).
    pub join_not_before: Option<Instant>,
    /// CompletingRebalance/Stable: members that have not synced by then are removed.
    pub sync_deadline: Option<Instant>,
    pub offsets: HashMap<(String, i32), OffsetEntry>,
}

impl Group {
    pub fn new(id: &str, now_ms: i64) -> Group {
        Group {
            id: id.to_string(),
            state: GroupState::Empty,
            state_since_ms: now_ms,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: IndexMap::new(),
            pending_members: HashMap::new(),
            static_members: HashMap::new(),
            pending_sync: HashSet::new(),
            rebalance_deadline: None,
            join_not_before: None,
            sync_deadline: None,
            offsets: HashMap::new(),
        }
    }

    pub fn transition(&mut self, state: GroupState, now_ms: i64) {
        self.state = state;
        self.state_since_ms = now_ms;
    }

    /// Protocols every member supports (the candidates for the next generation).
    pub fn candidate_protocols(&self) -> Vec<String> {
        let mut iter = self.members.values();
        let Some(first) = iter.next() else { return Vec::new() };
        let mut candidates: Vec<String> = first.protocols.iter().map(|(n, _)| n.clone()).collect();
        for m in iter {
            candidates.retain(|c| m.protocols.iter().any(|(n, _)| n == c));
        }
        candidates
    }

    /// Can a member with these protocols join? The group must be empty, or
    /// share the protocol type and at least one protocol with every member.
    pub fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && self.candidate_protocols().iter().any(|c| protocols.iter().any(|(n, _)| n == c))
    }

    /// Kafka's vote: each member votes for its most preferred candidate; most votes win
    /// (ties go to the protocol listed first by the earliest member).
    pub fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidate_protocols();
        let mut votes: IndexMap<String, usize> = candidates.iter().map(|c| (c.clone(), 0)).collect();
        for m in self.members.values() {
            if let Some((name, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(n)) {
                *votes.get_mut(name).expect("candidate") += 1;
            }
        }
        let max = votes.values().copied().max()?;
        votes.into_iter().find(|(_, v)| *v == max).map(|(n, _)| n)
    }

    pub fn all_members_joined(&self) -> bool {
        self.pending_members.is_empty() && self.members.values().all(|m| m.join_waiter.is_some())
    }

    pub fn max_rebalance_timeout_ms(&self) -> i32 {
        self.members.values().map(|m| m.rebalance_timeout_ms).max().unwrap_or(0)
    }

    /// The response a member gets when it (re)joins a completed generation.
    pub fn join_response_for(&self, member_id: &str, skip_assignment: bool) -> JoinResponse {
        let protocol = self.protocol.clone().unwrap_or_default();
        let is_leader = self.leader.as_deref() == Some(member_id);
        let members = if is_leader {
            self.members
                .values()
                .map(|m| super::JoinMember {
                    member_id: m.id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    metadata: m.metadata_for(&protocol),
                })
                .collect()
        } else {
            Vec::new()
        };
        JoinResponse {
            error: 0,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            members,
            skip_assignment: skip_assignment && is_leader,
        }
    }

    /// Topics the members subscribe to, when they speak the consumer protocol.
    pub fn subscribed_topics(&self) -> Option<HashSet<String>> {
        if self.protocol_type.as_deref() != Some("consumer") {
            return None;
        }
        let protocol = self.protocol.as_deref()?;
        let mut topics = HashSet::new();
        for m in self.members.values() {
            topics.extend(super::records::subscribed_topics(&m.metadata_for(protocol))?);
        }
        Some(topics)
    }
}
