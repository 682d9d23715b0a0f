//! The active controller's decisions, as a core that does no I/O.
//!
//! [`ControllerCore::step`] takes one [`Input`] (a request from a broker or
//! an admin client, a clock tick, or a committed entry of the metadata log)
//! and returns [`Effect`]s: record batches to propose to the quorum and
//! replies to send. The driver proposes, waits for commits and feeds them
//! back; the simulation does the same from a seed.
//!
//! Decisions are made against the committed image. A proposal may commit
//! twice (a retry after a lost reply) or be overtaken by another; records are
//! idempotent and conditional ([`crate::metadata::records`]), and a request
//! is answered from what applying its batch actually did.
//!
//! Heartbeat times live only in the active controller's memory (as in
//! Kafka): a new active controller gives every broker a fresh session.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::eligible;
use super::reassignment::{self, ReassignmentError, ReassignmentResult, ReplicaChange};
use crate::metadata::image::{Applied, ClusterImage, LeaderRecoveryState, PartitionRegistration, NO_LEADER};
use crate::metadata::placement::{self, Candidate, PlacementError};
use crate::metadata::records::{ConfigResource, Endpoint, MetadataRecord, RecordBatch};

/// A broker's or client's request to the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Register {
        broker_id: i32,
        incarnation_id: Uuid,
        endpoints: Vec<Endpoint>,
        rack: Option<String>,
        /// Whether the broker's previous run stopped cleanly (its logs
        /// flushed; Kafka's PreviousBrokerEpoch matching): if not, it may
        /// have lost an unflushed tail and leaves every ISR and ELR.
        #[serde(default)]
        clean_shutdown: bool,
    },
    Heartbeat {
        broker_id: i32,
        epoch: i64,
        applied_offset: u64,
        want_shutdown: bool,
    },
    CreateTopic {
        name: String,
        partitions: i32,
        replication_factor: i16,
        configs: BTreeMap<String, String>,
        /// A manual assignment (each partition's replicas, partition 0
        /// first): `partitions` and `replication_factor` are then ignored.
        #[serde(default)]
        assignment: Option<Vec<Vec<i32>>>,
    },
    DeleteTopic {
        name: String,
    },
    /// Grows topic `name` to `count` partitions.
    CreatePartitions {
        name: String,
        count: i32,
        /// The new partitions' replicas (manual assignment), in order.
        #[serde(default)]
        assignment: Option<Vec<Vec<i32>>>,
    },
    /// Sets (`Some`) or removes (`None`) config keys of one resource.
    AlterConfigs {
        resource: ConfigResource,
        changes: Vec<(String, Option<String>)>,
    },
    AllocateProducerIds {
        broker_id: i32,
    },
    /// A partition leader's new ISR (Kafka's AlterPartition), at the leader
    /// and partition epochs it last saw.
    AlterPartition {
        broker_id: i32,
        broker_epoch: i64,
        topic_id: Uuid,
        partition: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        new_isr: Vec<i32>,
        /// The leader's recovery state (KIP-704): a leader elected
        /// uncleanly says RECOVERED with its first ISR change.
        #[serde(default)]
        leader_recovery_state: LeaderRecoveryState,
    },
    /// DescribeQuorum: answered by the driver, which holds the raft state;
    /// it never reaches the core's decisions.
    DescribeQuorum,
    /// Kafka's ElectLeaders: a leader election of `election` kind for the
    /// named (topic, partition)s, or for every partition when `None`.
    ElectLeaders {
        election: ElectionType,
        partitions: Option<Vec<(String, i32)>>,
    },
    /// Kafka's AlterPartitionReassignments: each named (topic, partition)
    /// reassigned to its target replicas, or its reassignment cancelled
    /// (`None`).
    AlterReassignments {
        partitions: Vec<(String, i32, Option<Vec<i32>>)>,
        allow_factor_change: bool,
    },
}

/// Kafka's ElectionType.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ElectionType {
    /// Make the first replica (the preferred one) the leader, if it is an
    /// active member of the ISR.
    Preferred,
    /// Give a partition without a leader one: an active ISR member if there
    /// is one, else (losing what only the ISR had) the first active replica.
    Unclean,
}

/// One partition's outcome of an ElectLeaders request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionResult {
    pub topic: String,
    pub partition: i32,
    pub outcome: Result<(), ElectionError>,
}

/// Why a partition's election did not happen; Kafka's per-partition codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ElectionError {
    #[error("no partition {0}-{1}")]
    UnknownTopicOrPartition(String, i32),
    #[error("the partition already has the leader that election would give it")]
    ElectionNotNeeded,
    #[error("preferred replica {preferred} is not an active member of the ISR {isr:?}")]
    PreferredLeaderNotAvailable { preferred: i32, isr: Vec<i32> },
    #[error("no replica of {replicas:?} is active")]
    EligibleLeadersNotAvailable { replicas: Vec<i32> },
    #[error("another change to the partition committed first; retry")]
    Overtaken,
}

/// A reply, sent once the request's records are committed and applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Registered {
        epoch: i64,
    },
    Heartbeat {
        fenced: bool,
        shutdown_done: bool,
    },
    TopicCreated {
        id: Uuid,
    },
    TopicDeleted,
    PartitionsCreated,
    ConfigsAltered,
    ProducerIds {
        start: i64,
        size: i64,
    },
    /// The partition's state after an AlterPartition (also when the ISR
    /// asked for was already so).
    PartitionAltered {
        leader: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        isr: Vec<i32>,
    },
    Quorum(super::describe::QuorumDescription),
    /// Every partition named (or, for all partitions, every one whose
    /// election was needed), in topic-name and partition order.
    LeadersElected(Vec<ElectionResult>),
    /// Every partition named, in request order.
    Reassigned(Vec<ReassignmentResult>),
    Error(ControllerError),
}

/// Why a request failed; mapped to a Kafka error code at the API edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ControllerError {
    #[error("broker {0} is not registered with that epoch")]
    StaleBrokerEpoch(i32),
    #[error("topic {0} already exists")]
    TopicExists(String),
    #[error("no topic {0}")]
    UnknownTopic(String),
    #[error("{0}")]
    Placement(#[from] PlacementError),
    #[error("partition count must be at least 1, got {0}")]
    InvalidPartitions(i32),
    #[error("topic {topic} has {current} partitions; partitions can only be added (asked for {requested})")]
    PartitionsCanOnlyGrow { topic: String, current: i32, requested: i32 },
    #[error("the request's records were overtaken by another change; retry")]
    Conflict,
    #[error("no topic with id {0}")]
    UnknownTopicId(Uuid),
    #[error("topic {topic_id} has no partition {partition}")]
    UnknownPartition { topic_id: Uuid, partition: i32 },
    /// The requester has seen leader/partition epochs this controller has
    /// not: this controller is behind (no longer the active one).
    #[error("epochs (leader {requested_leader_epoch}, partition {requested_partition_epoch}) are ahead of this controller's ({leader_epoch}, {partition_epoch})")]
    EpochsAhead { requested_leader_epoch: i32, requested_partition_epoch: i32, leader_epoch: i32, partition_epoch: i32 },
    #[error("leader epoch {requested} is older than the partition's {current}")]
    FencedLeaderEpoch { requested: i32, current: i32 },
    #[error("broker {broker} does not lead the partition (its leader is {leader})")]
    NotLeader { broker: i32, leader: i32 },
    #[error("partition epoch {requested} is older than the partition's {current}")]
    StalePartitionEpoch { requested: i32, current: i32 },
    #[error("invalid ISR {isr:?}: {why}")]
    InvalidIsr { isr: Vec<i32>, why: String },
    #[error("broker {broker} may not be in the ISR: {why}")]
    IneligibleReplica { broker: i32, why: String },
    #[error("{0} is answered by the controller's driver, not its core")]
    NotForCore(String),
}

pub type RequestId = u64;

/// A new partition's (replicas, ISR); the ISR's first is its leader.
type Placed = (Vec<i32>, Vec<i32>);

#[derive(Debug, Clone)]
pub enum Input {
    Request {
        id: RequestId,
        request: Request,
        now_ms: u64,
    },
    Tick {
        now_ms: u64,
    },
    Committed {
        offset: u64,
        batch: RecordBatch,
    },
    /// The driver saw a connection to or from `broker_id` break (its
    /// process gone or restarting): its session ends
    /// [`CoreSettings::connection_loss_grace_ms`] later unless it
    /// heartbeats or registers again first.
    ConnectionLost {
        broker_id: i32,
        now_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Propose(RecordBatch),
    Reply { id: RequestId, reply: Reply },
}

pub const PRODUCER_ID_BLOCK: i64 = 1000;

/// How often partitions left inconsistent by an overtaken change may be
/// repaired ([`ControllerCore::repair_partitions`]).
pub const REPAIR_INTERVAL_MS: u64 = 1000;

/// At most this many preferred-leader elections in one automatic pass (as
/// Kafka's controller): the rest follow at the next tick, not the next
/// interval, so a broker back with many partitions is not one huge batch.
pub const MAX_ELECTIONS_PER_PASS: usize = 1000;

#[derive(Debug, Clone)]
pub struct CoreSettings {
    pub session_timeout_ms: u64,
    /// How long after a broken connection (see [`Input::ConnectionLost`])
    /// a silent broker is fenced, instead of the whole session timeout: a
    /// killed broker's sockets close at once, so its partitions need not
    /// wait 9 s for new leaders. Longer than the broker's heartbeat
    /// interval, so a live broker whose connection merely dropped
    /// reconnects and heartbeats in time. `None`: only sessions fence.
    pub connection_loss_grace_ms: Option<u64>,
    /// `leader.imbalance.check.interval.seconds` in ms when
    /// `auto.leader.rebalance.enable` is on: how often partitions led by
    /// another replica than their preferred one get it back
    /// ([`ControllerCore::balance_leaders`]); `None` when off.
    pub leader_rebalance_interval_ms: Option<u64>,
    /// `unclean.leader.election.enable` of this node's server.properties:
    /// the value for topics that set none when no cluster-wide dynamic
    /// default does either.
    pub unclean_leader_election: bool,
    /// `min.insync.replicas` of this node's server.properties, for topics
    /// that set none when no cluster-wide dynamic default does either: the
    /// ISR size below which replicas leaving it stay eligible to lead.
    pub min_insync_replicas: i32,
    /// Seeds the ids the core makes up (topic ids, hence placement, and
    /// proposal ids): the core does no I/O and takes no randomness from
    /// outside, so the same seed and inputs give the same decisions. The
    /// driver gives each core a different seed (node, term, offset mixed
    /// in), so two cores never draw the same ids.
    pub seed: u64,
}

/// What a proposal not yet committed was for.
#[derive(Debug)]
enum Pending {
    /// Answer this request when it commits.
    Request { id: RequestId, request: Request },
    /// The controller's own fencing of expired sessions.
    Fence { brokers: Vec<i32> },
    /// An ElectLeaders request: `results` as decided, its records being
    /// those of the `Ok` results, in order.
    Election { id: RequestId, results: Vec<ElectionResult>, election: ElectionType },
    /// An AlterPartitionReassignments request: `results` as decided, its
    /// records those of the `Ok` results, in order.
    Reassignment { id: RequestId, results: Vec<ReassignmentResult> },
}

pub struct ControllerCore {
    settings: CoreSettings,
    /// The committed image (every committed entry, in order).
    image: ClusterImage,
    /// Last heartbeat per broker id (active controller only).
    last_heartbeat_ms: HashMap<i32, u64>,
    /// When a connection of each broker broke, if it has not heartbeated
    /// or registered since (active controller only).
    connection_lost_ms: HashMap<i32, u64>,
    /// Brokers that registered or heartbeated to this active controller.
    /// New partitions go to these: a new controller gives every broker a
    /// fresh session, so a broker that died just before the failover still
    /// counts as unfenced until that session runs out.
    heard_from: std::collections::HashSet<i32>,
    /// Proposals not yet committed, by proposal id.
    pending: BTreeMap<Uuid, Pending>,
    /// When partitions were last repaired (not tracked as pending).
    last_repair_ms: Option<u64>,
    /// When leaders were last balanced (the first tick starts the clock),
    /// and whether the last pass stopped at [`MAX_ELECTIONS_PER_PASS`].
    last_balance_ms: Option<u64>,
    balance_unfinished: bool,
    rng: fastrand::Rng,
}

impl ControllerCore {
    pub fn new(settings: CoreSettings, image: ClusterImage) -> ControllerCore {
        let rng = fastrand::Rng::with_seed(settings.seed);
        ControllerCore {
            settings,
            image,
            last_heartbeat_ms: HashMap::new(),
            connection_lost_ms: HashMap::new(),
            heard_from: Default::default(),
            pending: BTreeMap::new(),
            last_repair_ms: None,
            last_balance_ms: None,
            balance_unfinished: false,
            rng,
        }
    }

    /// A version-4 UUID from the core's seeded generator.
    fn new_id(&mut self) -> Uuid {
        uuid::Builder::from_random_bytes(self.rng.u128(..).to_le_bytes()).into_uuid()
    }

    pub fn image(&self) -> &ClusterImage {
        &self.image
    }

    /// A committed entry without records (the leader's no-op of a new term).
    pub fn advance_to(&mut self, offset: u64) {
        self.image.advance_to(offset);
    }

    pub fn step(&mut self, input: Input) -> Vec<Effect> {
        match input {
            Input::Committed { offset, batch } => self.committed(offset, batch),
            Input::Tick { now_ms } => {
                let mut effects = self.fence_expired(now_ms);
                effects.extend(self.repair_partitions(now_ms));
                effects.extend(self.balance_leaders(now_ms));
                effects
            }
            Input::Request { id, request, now_ms } => self.request(id, request, now_ms),
            Input::ConnectionLost { broker_id, now_ms } => {
                // The first break counts: the reconnect attempts that follow
                // report it again and must not push the deadline on.
                self.connection_lost_ms.entry(broker_id).or_insert(now_ms);
                Vec::new()
            }
        }
    }

    fn propose(&mut self, id: RequestId, request: Request, records: Vec<MetadataRecord>) -> Vec<Effect> {
        let batch = RecordBatch { proposal: self.new_id(), records };
        self.pending.insert(batch.proposal, Pending::Request { id, request });
        vec![Effect::Propose(batch)]
    }

    fn reply(id: RequestId, reply: Reply) -> Vec<Effect> {
        vec![Effect::Reply { id, reply }]
    }

    fn request(&mut self, id: RequestId, request: Request, now_ms: u64) -> Vec<Effect> {
        match &request {
            Request::Register { broker_id, incarnation_id, endpoints, rack, clean_shutdown } => {
                if let Some(b) = self.image.brokers.get(broker_id).filter(|b| b.incarnation_id == *incarnation_id) {
                    return Self::reply(id, Reply::Registered { epoch: b.epoch });
                }
                self.last_heartbeat_ms.insert(*broker_id, now_ms);
                self.connection_lost_ms.remove(broker_id);
                self.heard_from.insert(*broker_id);
                let mut records = vec![MetadataRecord::RegisterBroker {
                    broker_id: *broker_id,
                    incarnation_id: *incarnation_id,
                    endpoints: endpoints.clone(),
                    rack: rack.clone(),
                }];
                // A restarted broker's old incarnation leads nothing from now
                // on; after a crash it is not eligible to either.
                let unclean: &[i32] = if *clean_shutdown { &[] } else { std::slice::from_ref(broker_id) };
                if self.image.brokers.contains_key(broker_id) || !unclean.is_empty() {
                    records.extend(self.leadership_moves_away(&[*broker_id], unclean));
                }
                self.propose(id, request, records)
            }
            Request::Heartbeat { broker_id, epoch, applied_offset, want_shutdown } => {
                let Some(b) = self.image.brokers.get(broker_id).filter(|b| b.epoch == *epoch) else {
                    return Self::reply(id, Reply::Error(ControllerError::StaleBrokerEpoch(*broker_id)));
                };
                self.last_heartbeat_ms.insert(*broker_id, now_ms);
                self.connection_lost_ms.remove(broker_id);
                self.heard_from.insert(*broker_id);
                let mut records = Vec::new();
                if *want_shutdown {
                    if !b.in_controlled_shutdown {
                        records.push(MetadataRecord::BeginControlledShutdown { broker_id: *broker_id, epoch: *epoch });
                    }
                    records.extend(self.leadership_moves_away(&[*broker_id], &[]));
                } else if b.fenced && *applied_offset >= b.epoch as u64 {
                    // Caught up with the log up to its own registration: it may lead.
                    records.push(MetadataRecord::UnfenceBroker { broker_id: *broker_id, epoch: *epoch });
                    records.extend(self.leadership_returns(*broker_id));
                }
                if records.is_empty() {
                    let shutdown_done = *want_shutdown && self.leads_nothing(*broker_id);
                    return Self::reply(id, Reply::Heartbeat { fenced: b.fenced, shutdown_done });
                }
                self.propose(id, request, records)
            }
            Request::CreateTopic { name, partitions, replication_factor, configs, assignment } => {
                if self.image.topic(name).is_some() {
                    return Self::reply(id, Reply::Error(ControllerError::TopicExists(name.clone())));
                }
                let topic_id = self.new_id();
                let placed = match assignment {
                    Some(manual) => self.check_manual(manual, None),
                    None if *partitions < 1 => Err(ControllerError::InvalidPartitions(*partitions)),
                    None => self.place_automatically(topic_id, 0, *partitions, *replication_factor),
                };
                let placed = match placed {
                    Ok(p) => p,
                    Err(e) => return Self::reply(id, Reply::Error(e)),
                };
                let mut records = vec![MetadataRecord::Topic { name: name.clone(), id: topic_id }];
                records.extend(partition_records(topic_id, 0, placed));
                for (key, value) in configs {
                    records.push(MetadataRecord::Config {
                        resource: ConfigResource::Topic(name.clone()),
                        name: key.clone(),
                        value: Some(value.clone()),
                    });
                }
                self.propose(id, request, records)
            }
            Request::DeleteTopic { name } => match self.image.topic(name) {
                None => Self::reply(id, Reply::Error(ControllerError::UnknownTopic(name.clone()))),
                Some(t) => {
                    let records = vec![MetadataRecord::RemoveTopic { id: t.id }];
                    self.propose(id, request, records)
                }
            },
            Request::CreatePartitions { name, count, assignment } => {
                let Some(t) = self.image.topic(name) else {
                    return Self::reply(id, Reply::Error(ControllerError::UnknownTopic(name.clone())));
                };
                let current = t.partitions.len() as i32;
                if *count <= current {
                    let e = ControllerError::PartitionsCanOnlyGrow { topic: name.clone(), current, requested: *count };
                    return Self::reply(id, Reply::Error(e));
                }
                let factor = t.partitions.values().next().map_or(1, |p| p.replicas.len()) as i16;
                let topic_id = t.id;
                let placed = match assignment {
                    Some(manual) if manual.len() as i32 != *count - current => {
                        Err(ControllerError::Placement(PlacementError::InvalidAssignment(format!(
                            "{} new partitions need {} assignments, got {}",
                            name,
                            *count - current,
                            manual.len()
                        ))))
                    }
                    Some(manual) => self.check_manual(manual, Some(factor as usize)),
                    None => self.place_automatically(topic_id, current, *count - current, factor),
                };
                let placed = match placed {
                    Ok(p) => p,
                    Err(e) => return Self::reply(id, Reply::Error(e)),
                };
                let records = partition_records(topic_id, current, placed).collect();
                self.propose(id, request, records)
            }
            Request::AlterConfigs { resource, changes } => {
                if changes.is_empty() {
                    return Self::reply(id, Reply::ConfigsAltered);
                }
                let mut records: Vec<MetadataRecord> = changes
                    .iter()
                    .map(|(name, value)| MetadataRecord::Config {
                        resource: resource.clone(),
                        name: name.clone(),
                        value: value.clone(),
                    })
                    .collect();
                if changes.iter().any(|(name, _)| name == "min.insync.replicas") {
                    records.extend(self.elr_cleared(resource));
                }
                self.propose(id, request, records)
            }
            Request::DescribeQuorum => {
                Self::reply(id, Reply::Error(ControllerError::NotForCore("DescribeQuorum".into())))
            }
            Request::ElectLeaders { election, partitions } => self.elect_leaders(id, *election, partitions.as_deref()),
            Request::AlterReassignments { partitions, allow_factor_change } => {
                self.alter_reassignments(id, partitions, *allow_factor_change)
            }
            Request::AlterPartition {
                broker_id,
                broker_epoch,
                topic_id,
                partition,
                leader_epoch,
                partition_epoch,
                new_isr,
                leader_recovery_state,
            } => {
                let checked = self
                    .partition_led_by(*broker_id, *broker_epoch, *topic_id, *partition, *leader_epoch, *partition_epoch)
                    .and_then(|reg| self.check_new_isr(reg, new_isr).map(|()| reg))
                    .and_then(|reg| check_recovery(reg, new_isr, *leader_recovery_state).map(|()| reg));
                let reg = match checked {
                    Ok(reg) => reg,
                    Err(e) => return Self::reply(id, Reply::Error(e)),
                };
                let state = *leader_recovery_state;
                if same_members(&reg.isr, new_isr) && state == reg.leader_recovery_state {
                    return Self::reply(id, altered(reg));
                }
                if state != reg.leader_recovery_state {
                    tracing::info!(topic = %self.image.topics[topic_id].name, partition, ?state, "leader recovery state changes");
                }
                // The expansion that brings the last target replica in
                // completes a reassignment, in the same change (as Kafka).
                let mut change = reassignment::completion(reg, new_isr, |b| self.is_active(b))
                    .unwrap_or(ReplicaChange { isr: Some(new_isr.clone()), ..Default::default() });
                if change.isr.as_deref() == Some(&reg.isr[..]) {
                    change.isr = None;
                }
                change.leader_recovery_state = (state != reg.leader_recovery_state).then_some(state);
                let name = &self.image.topics[topic_id].name;
                let records = vec![change_record(*topic_id, *partition, reg, self.with_elr(name, reg, change))];
                self.propose(id, request, records)
            }
            Request::AllocateProducerIds { broker_id } => {
                // Conditional on the next free id: two racing allocations
                // cannot both apply, and the loser is told to retry.
                let start = self.image.next_producer_id;
                let records =
                    vec![MetadataRecord::ProducerIds { broker_id: *broker_id, start, size: PRODUCER_ID_BLOCK }];
                self.propose(id, request, records)
            }
        }
    }

    /// The partition an AlterPartition names, if `broker_id` (registered
    /// with `broker_epoch`) leads it at exactly these epochs. Checked in
    /// Kafka's order, with its answers: epochs ahead of ours mean this
    /// controller is behind; an older leader epoch is a fenced leader; a
    /// broker not leading at the current leader epoch is an invalid
    /// request; an older partition epoch is a stale update.
    fn partition_led_by(
        &self,
        broker_id: i32,
        broker_epoch: i64,
        topic_id: Uuid,
        partition: i32,
        leader_epoch: i32,
        partition_epoch: i32,
    ) -> Result<&PartitionRegistration, ControllerError> {
        if self.image.brokers.get(&broker_id).is_none_or(|b| b.epoch != broker_epoch) {
            return Err(ControllerError::StaleBrokerEpoch(broker_id));
        }
        let topic = self.image.topics.get(&topic_id).ok_or(ControllerError::UnknownTopicId(topic_id))?;
        let reg = topic.partitions.get(&partition).ok_or(ControllerError::UnknownPartition { topic_id, partition })?;
        if leader_epoch > reg.leader_epoch || partition_epoch > reg.partition_epoch {
            return Err(ControllerError::EpochsAhead {
                requested_leader_epoch: leader_epoch,
                requested_partition_epoch: partition_epoch,
                leader_epoch: reg.leader_epoch,
                partition_epoch: reg.partition_epoch,
            });
        }
        if leader_epoch < reg.leader_epoch {
            return Err(ControllerError::FencedLeaderEpoch { requested: leader_epoch, current: reg.leader_epoch });
        }
        if broker_id != reg.leader {
            return Err(ControllerError::NotLeader { broker: broker_id, leader: reg.leader });
        }
        if partition_epoch < reg.partition_epoch {
            return Err(ControllerError::StalePartitionEpoch {
                requested: partition_epoch,
                current: reg.partition_epoch,
            });
        }
        Ok(reg)
    }

    /// A leader's new ISR, checked as Kafka checks it: distinct replicas,
    /// the leader among them, and every member eligible (registered,
    /// unfenced, not shutting down; Kafka checks every member, not only
    /// the added ones, so a leader never re-asserts a member the
    /// controller is about to remove).
    fn check_new_isr(&self, reg: &PartitionRegistration, new_isr: &[i32]) -> Result<(), ControllerError> {
        let invalid = |why: &str| Err(ControllerError::InvalidIsr { isr: new_isr.to_vec(), why: why.into() });
        if new_isr.is_empty() {
            return invalid("it is empty");
        }
        if let Some(b) = new_isr.iter().find(|b| !reg.replicas.contains(b)) {
            return invalid(&format!("broker {b} is not a replica of {:?}", reg.replicas));
        }
        if new_isr.iter().enumerate().any(|(i, b)| new_isr[..i].contains(b)) {
            return invalid("it lists a broker twice");
        }
        if !new_isr.contains(&reg.leader) {
            return invalid(&format!("it leaves out the leader {}", reg.leader));
        }
        for &broker in new_isr {
            let why = match self.image.brokers.get(&broker) {
                None => "not registered",
                Some(b) if b.in_controlled_shutdown => "shutting down",
                Some(b) if b.fenced => "fenced",
                Some(_) => continue,
            };
            return Err(ControllerError::IneligibleReplica { broker, why: why.into() });
        }
        Ok(())
    }

    /// Brokers `leaving` (fenced, restarted or shutting down) leave every
    /// ISR they are in, and the partitions they lead get the next leader
    /// from the ISR (see [`settle`]). One conditional change per partition.
    fn leadership_moves_away(&self, leaving: &[i32], unclean_shutdown: &[i32]) -> Vec<MetadataRecord> {
        self.settle_partitions(
            |p| leaving.iter().any(|b| p.isr.contains(b) || (unclean_shutdown.contains(b) && p.elr.contains(b))),
            |b| !leaving.contains(&b) && self.is_active(b),
            unclean_shutdown,
        )
    }

    /// Offline partitions `broker`, being unfenced, may lead (it is in
    /// their ISR or ELR, or was their last leader) get a leader again (it,
    /// unless an earlier replica that may is active).
    fn leadership_returns(&self, broker: i32) -> Vec<MetadataRecord> {
        self.settle_partitions(
            |p| {
                p.leader == NO_LEADER
                    && (p.isr.contains(&broker) || p.elr.contains(&broker) || p.last_known_elr.contains(&broker))
            },
            |b| b == broker || self.is_active(b),
            &[],
        )
    }

    /// A PartitionChange for each partition `selected` that [`settle`]
    /// changes under `active`, in topic-id and partition order.
    fn settle_partitions(
        &self,
        selected: impl Fn(&PartitionRegistration) -> bool,
        active: impl Fn(i32) -> bool,
        unclean_shutdown: &[i32],
    ) -> Vec<MetadataRecord> {
        let mut out = Vec::new();
        for t in self.image.topics.values() {
            let unclean = self.unclean_leader_election(&t.name);
            let min_isr = self.min_insync_replicas(&t.name);
            for (p, reg) in t.partitions.iter().filter(|(_, reg)| selected(reg)) {
                if let Some(change) = settle(reg, &active, unclean, min_isr, unclean_shutdown) {
                    out.push(change_record(t.id, *p, reg, change));
                }
            }
        }
        out
    }

    /// The changes that clear the eligible leader replicas and last known
    /// ELR of every partition whose `min.insync.replicas` a change to
    /// `resource` sets: the topic's own, or the cluster default for topics
    /// without their own. An ELR member is known to hold everything
    /// committed only as judged under the minimum it left the ISR with, so
    /// Kafka clears them when it changes (KIP-966); a per-broker value is
    /// not the controller's.
    fn elr_cleared(&self, resource: &ConfigResource) -> Vec<MetadataRecord> {
        let affected = |name: &str| match resource {
            ConfigResource::Topic(topic) => topic == name,
            ConfigResource::BrokerDefault => {
                !self.image.topic_configs.get(name).is_some_and(|c| c.contains_key("min.insync.replicas"))
            }
            ConfigResource::Broker(_) => false,
        };
        let mut out = Vec::new();
        for t in self.image.topics.values().filter(|t| affected(&t.name)) {
            for (index, reg) in &t.partitions {
                if reg.elr.is_empty() && reg.last_known_elr.is_empty() {
                    continue;
                }
                let cleared = ReplicaChange { elr: Some(vec![]), last_known_elr: Some(vec![]), ..Default::default() };
                out.push(change_record(t.id, *index, reg, cleared));
            }
        }
        out
    }

    /// `change` (not an election) to a partition of topic `name`, with the
    /// eligible leader replicas it leaves.
    fn with_elr(&self, name: &str, reg: &PartitionRegistration, change: ReplicaChange) -> ReplicaChange {
        eligible::complete(reg, change, self.min_insync_replicas(name), &[], false)
    }

    /// `min.insync.replicas` for topic `name` (its own, else the
    /// cluster-wide dynamic default, else this node's file), at least 1.
    fn min_insync_replicas(&self, name: &str) -> usize {
        const KEY: &str = "min.insync.replicas";
        let set = self.image.topic_configs.get(name).and_then(|c| c.get(KEY));
        let value = set.or_else(|| self.image.broker_default_configs.get(KEY)).and_then(|v| v.parse::<i32>().ok());
        value.unwrap_or(self.settings.min_insync_replicas).max(1) as usize
    }

    /// `unclean.leader.election.enable` for topic `name`: its own setting,
    /// else the cluster-wide dynamic default, else this node's file.
    fn unclean_leader_election(&self, name: &str) -> bool {
        const KEY: &str = "unclean.leader.election.enable";
        let set = self.image.topic_configs.get(name).and_then(|c| c.get(KEY));
        match set.or_else(|| self.image.broker_default_configs.get(KEY)) {
            Some(value) => value == "true",
            None => self.settings.unclean_leader_election,
        }
    }

    fn is_active(&self, broker: i32) -> bool {
        self.image.brokers.get(&broker).is_some_and(|b| b.is_active())
    }

    /// Places `count` new partitions (from index `first`) over the
    /// placement candidates, starting from a broker picked by the topic id
    /// (so topics' leaders spread); every replica is in the ISR.
    fn place_automatically(
        &self,
        topic_id: Uuid,
        first: i32,
        count: i32,
        factor: i16,
    ) -> Result<Vec<Placed>, ControllerError> {
        let candidates = self.placement_candidates();
        let start = (topic_id.as_u128() % candidates.len().max(1) as u128) as usize;
        let placed = placement::place(&candidates, first, count, factor, start)?;
        Ok(placed.into_iter().map(|replicas| (replicas.clone(), replicas)).collect())
    }

    /// A manual assignment checked as Kafka's controller checks it: each
    /// partition's replicas non-empty, distinct, registered brokers, as
    /// many as every other partition's (or `factor`), at least one of them
    /// unfenced. Returns each partition's (replicas, ISR): the ISR is the
    /// unfenced replicas, its first the leader.
    fn check_manual(&self, assignment: &[Vec<i32>], factor: Option<usize>) -> Result<Vec<Placed>, ControllerError> {
        let invalid = |m: String| ControllerError::Placement(PlacementError::InvalidAssignment(m));
        placement::check_assignment(assignment, factor, |b| self.image.brokers.contains_key(&b))?;
        assignment
            .iter()
            .enumerate()
            .map(|(p, replicas)| {
                let isr: Vec<i32> = replicas
                    .iter()
                    .copied()
                    .filter(|b| self.image.brokers.get(b).is_some_and(|r| !r.fenced && !r.in_controlled_shutdown))
                    .collect();
                if isr.is_empty() {
                    return Err(invalid(format!(
                        "every broker assigned to partition {p} ({replicas:?}) is fenced or shutting down"
                    )));
                }
                Ok((replicas.clone(), isr))
            })
            .collect()
    }

    /// Unfenced brokers that have been heard from since this controller
    /// became active (all unfenced ones if none has been yet).
    fn placement_candidates(&self) -> Vec<Candidate> {
        let active: Vec<Candidate> =
            self.image.active_brokers().map(|b| Candidate { id: b.id, rack: b.rack.clone() }).collect();
        let heard: Vec<Candidate> = active.iter().filter(|c| self.heard_from.contains(&c.id)).cloned().collect();
        if heard.is_empty() {
            active
        } else {
            heard
        }
    }

    fn leads_nothing(&self, broker: i32) -> bool {
        self.image.topics.values().all(|t| t.partitions.values().all(|p| p.leader != broker))
    }

    /// Brokers whose session expired are fenced, all in one batch with
    /// the leadership and ISR changes that takes: decided together, so no
    /// partition is handed to a broker fenced at the same tick.
    fn fence_expired(&mut self, now_ms: u64) -> Vec<Effect> {
        let expired: Vec<(i32, i64)> = self
            .image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .filter(|b| {
                let last = *self.last_heartbeat_ms.entry(b.id).or_insert(now_ms);
                let session_over = now_ms.saturating_sub(last) > self.settings.session_timeout_ms;
                let connection_gone = match (self.connection_lost_ms.get(&b.id), self.settings.connection_loss_grace_ms)
                {
                    (Some(&lost), Some(grace)) => now_ms.saturating_sub(lost) > grace,
                    _ => false,
                };
                session_over || connection_gone
            })
            .map(|b| (b.id, b.epoch))
            // Don't propose the same fencing again while one is in flight.
            .filter(|(id, _)| {
                !self.pending.values().any(|p| matches!(p, Pending::Fence { brokers } if brokers.contains(id)))
            })
            .collect();
        if expired.is_empty() {
            return Vec::new();
        }
        let brokers: Vec<i32> = expired.iter().map(|(id, _)| *id).collect();
        let mut records: Vec<MetadataRecord> =
            expired.iter().map(|&(broker_id, epoch)| MetadataRecord::FenceBroker { broker_id, epoch }).collect();
        records.extend(self.leadership_moves_away(&brokers, &[]));
        let batch = RecordBatch { proposal: self.new_id(), records };
        self.pending.insert(batch.proposal, Pending::Fence { brokers });
        vec![Effect::Propose(batch)]
    }

    /// Partitions that disagree with who is active (a change for them was
    /// overtaken: a fence's ISR removal ignored after a concurrent
    /// AlterPartition, say, leaving a fenced broker in an ISR) are settled
    /// again. At most once per [`REPAIR_INTERVAL_MS`], as a proposal may
    /// be dropped; conditional records make a repeat harmless.
    fn repair_partitions(&mut self, now_ms: u64) -> Vec<Effect> {
        if self.last_repair_ms.is_some_and(|last| now_ms.saturating_sub(last) < REPAIR_INTERVAL_MS) {
            return Vec::new();
        }
        let mut records = self.settle_partitions(|_| true, |b| self.is_active(b), &[]);
        records.extend(self.completed_reassignments());
        if records.is_empty() {
            return Vec::new();
        }
        self.last_repair_ms = Some(now_ms);
        vec![Effect::Propose(RecordBatch { proposal: self.new_id(), records })]
    }

    /// Reassignments whose ISR holds every target replica but that did not
    /// complete with the change that made it so (one that put a target
    /// replica back while the leader had no active successor, say).
    fn completed_reassignments(&self) -> Vec<MetadataRecord> {
        let mut out = Vec::new();
        for t in self.image.topics.values() {
            for (p, reg) in t.partitions.iter().filter(|(_, reg)| reg.is_reassigning()) {
                if let Some(change) = reassignment::completion(reg, &reg.isr, |b| self.is_active(b)) {
                    out.push(change_record(t.id, *p, reg, self.with_elr(&t.name, reg, change)));
                }
            }
        }
        out
    }

    /// An AlterPartitionReassignments request: each partition's step
    /// decided against the committed image, the changes proposed together
    /// and answered once committed.
    fn alter_reassignments(
        &mut self,
        id: RequestId,
        partitions: &[(String, i32, Option<Vec<i32>>)],
        allow_factor_change: bool,
    ) -> Vec<Effect> {
        let mut results = Vec::with_capacity(partitions.len());
        let mut records = Vec::new();
        for (topic, partition, target) in partitions {
            let outcome = self.reassignment_change(topic, *partition, target.as_deref(), allow_factor_change);
            let outcome = outcome.map(|record| records.push(record));
            results.push(ReassignmentResult { topic: topic.clone(), partition: *partition, outcome });
        }
        if records.is_empty() {
            return Self::reply(id, Reply::Reassigned(results));
        }
        let batch = RecordBatch { proposal: self.new_id(), records };
        self.pending.insert(batch.proposal, Pending::Reassignment { id, results });
        vec![Effect::Propose(batch)]
    }

    /// The record of one partition's reassignment step: start (or replace)
    /// one to `target`, or cancel the one in progress (`None`).
    fn reassignment_change(
        &self,
        topic: &str,
        partition: i32,
        target: Option<&[i32]>,
        allow_factor_change: bool,
    ) -> Result<MetadataRecord, ReassignmentError> {
        let unknown = || ReassignmentError::UnknownTopicOrPartition(topic.to_string(), partition);
        let t = self.image.topic(topic).ok_or_else(unknown)?;
        let reg = t.partitions.get(&partition).ok_or_else(unknown)?;
        let active = |b| self.is_active(b);
        let change = match target {
            Some(target) => {
                let registered = |b| self.image.brokers.contains_key(&b);
                reassignment::start(reg, target, allow_factor_change, registered, active)?
            }
            None => reassignment::cancel(reg, active)?,
        };
        Ok(change_record(t.id, partition, reg, self.with_elr(&t.name, reg, change)))
    }

    /// An ElectLeaders request: each partition's election decided against
    /// the committed image ([`Self::election_change`]), the changes proposed
    /// together and answered once committed. For all partitions (`named`
    /// `None`) those whose election is not needed are left out, as in Kafka.
    fn elect_leaders(&mut self, id: RequestId, election: ElectionType, named: Option<&[(String, i32)]>) -> Vec<Effect> {
        let targets: Vec<(String, i32)> = match named {
            Some(named) => named.to_vec(),
            None => {
                self.image.topics.values().flat_map(|t| t.partitions.keys().map(|p| (t.name.clone(), *p))).collect()
            }
        };
        let mut results = Vec::with_capacity(targets.len());
        let mut records = Vec::new();
        for (topic, partition) in targets {
            let outcome = match self.election_change(&topic, partition, election) {
                Ok(record) => {
                    records.push(record);
                    Ok(())
                }
                Err(ElectionError::ElectionNotNeeded) if named.is_none() => continue,
                Err(e) => Err(e),
            };
            results.push(ElectionResult { topic, partition, outcome });
        }
        if named.is_none() {
            results.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        }
        if records.is_empty() {
            return Self::reply(id, Reply::LeadersElected(results));
        }
        let batch = RecordBatch { proposal: self.new_id(), records };
        self.pending.insert(batch.proposal, Pending::Election { id, results, election });
        vec![Effect::Propose(batch)]
    }

    /// The change one election makes to a partition, by Kafka's rules: a
    /// preferred election is not needed while the first replica leads and
    /// cannot happen unless it is an active ISR member; an unclean one is
    /// not needed while there is a leader, takes an active ISR member if one
    /// is left (a clean election) and otherwise the first active replica,
    /// which becomes the whole ISR (whatever only the old ISR held is lost:
    /// the operator asked for availability over it).
    fn election_change(
        &self,
        topic: &str,
        partition: i32,
        election: ElectionType,
    ) -> Result<MetadataRecord, ElectionError> {
        let unknown = || ElectionError::UnknownTopicOrPartition(topic.to_string(), partition);
        let t = self.image.topic(topic).ok_or_else(unknown)?;
        let reg = t.partitions.get(&partition).ok_or_else(unknown)?;
        let change = match election {
            ElectionType::Preferred => {
                let preferred = reg.replicas.first().copied().unwrap_or(NO_LEADER);
                if reg.leader == preferred {
                    return Err(ElectionError::ElectionNotNeeded);
                }
                if !reg.isr.contains(&preferred) || !self.is_active(preferred) {
                    return Err(ElectionError::PreferredLeaderNotAvailable { preferred, isr: reg.isr.clone() });
                }
                self.with_elr(&t.name, reg, ReplicaChange { leader: Some(preferred), ..Default::default() })
            }
            ElectionType::Unclean => {
                if reg.leader != NO_LEADER {
                    return Err(ElectionError::ElectionNotNeeded);
                }
                let min_isr = self.min_insync_replicas(&t.name);
                match settle(reg, |b| self.is_active(b), true, min_isr, &[]) {
                    Some(change) if change.leader.is_some_and(|l| l != NO_LEADER) => change,
                    _ => return Err(ElectionError::EligibleLeadersNotAvailable { replicas: reg.replicas.clone() }),
                }
            }
        };
        Ok(change_record(t.id, partition, reg, change))
    }

    /// An election's results once its batch committed: a change overtaken
    /// by another is decided again against the new image (no longer needed
    /// means the partition has the leader that was asked for).
    fn elected(
        &self,
        mut results: Vec<ElectionResult>,
        election: ElectionType,
        outcomes: &[Applied],
    ) -> Vec<ElectionResult> {
        let mut outcomes = outcomes.iter();
        for r in results.iter_mut().filter(|r| r.outcome.is_ok()) {
            if outcomes.next() == Some(&Applied::Changed) {
                continue;
            }
            r.outcome = match self.election_change(&r.topic, r.partition, election) {
                Err(ElectionError::ElectionNotNeeded) => Ok(()),
                Ok(_) => Err(ElectionError::Overtaken),
                Err(e) => Err(e),
            };
        }
        results
    }

    /// Kafka's automatic preferred-leader election, by its KRaft rule: no
    /// imbalance ratio to cross first; every partition whose preferred
    /// replica is an active ISR member but does not lead gets it back, once
    /// per `leader_rebalance_interval_ms`, at most [`MAX_ELECTIONS_PER_PASS`]
    /// at a time (the rest at the next tick). Not tracked as pending:
    /// conditional records make a repeat harmless.
    fn balance_leaders(&mut self, now_ms: u64) -> Vec<Effect> {
        let Some(interval) = self.settings.leader_rebalance_interval_ms else { return Vec::new() };
        let last = *self.last_balance_ms.get_or_insert(now_ms);
        if !self.balance_unfinished && now_ms.saturating_sub(last) < interval {
            return Vec::new();
        }
        self.last_balance_ms = Some(now_ms);
        let mut records = Vec::new();
        let mut unfinished = false;
        'topics: for t in self.image.topics.values() {
            for p in t.partitions.keys() {
                if records.len() >= MAX_ELECTIONS_PER_PASS {
                    unfinished = true;
                    break 'topics;
                }
                if let Ok(record) = self.election_change(&t.name, *p, ElectionType::Preferred) {
                    records.push(record);
                }
            }
        }
        self.balance_unfinished = unfinished;
        if records.is_empty() {
            return Vec::new();
        }
        vec![Effect::Propose(RecordBatch { proposal: self.new_id(), records })]
    }

    fn committed(&mut self, offset: u64, batch: RecordBatch) -> Vec<Effect> {
        let outcomes = self.image.apply(offset, &batch);
        let (id, request) = match self.pending.remove(&batch.proposal) {
            Some(Pending::Request { id, request }) => (id, request),
            Some(Pending::Election { id, results, election }) => {
                return Self::reply(id, Reply::LeadersElected(self.elected(results, election, &outcomes)))
            }
            Some(Pending::Reassignment { id, mut results }) => {
                // A step overtaken by another change to its partition is
                // refused (retriable) rather than decided again.
                let mut outcomes = outcomes.iter();
                for r in results.iter_mut().filter(|r| r.outcome.is_ok()) {
                    if outcomes.next() != Some(&Applied::Changed) {
                        r.outcome = Err(ReassignmentError::Overtaken);
                    }
                }
                return Self::reply(id, Reply::Reassigned(results));
            }
            _ => return Vec::new(),
        };
        let first_ok = outcomes.first().is_some_and(|o| *o == Applied::Changed);
        let reply = match &request {
            Request::Register { broker_id, .. } => match self.image.brokers.get(broker_id) {
                Some(b) => Reply::Registered { epoch: b.epoch },
                None => Reply::Error(ControllerError::Conflict),
            },
            Request::Heartbeat { broker_id, want_shutdown, .. } => {
                let fenced = self.image.brokers.get(broker_id).is_none_or(|b| b.fenced);
                Reply::Heartbeat { fenced, shutdown_done: *want_shutdown && self.leads_nothing(*broker_id) }
            }
            Request::CreateTopic { name, .. } => match self.image.topic(name) {
                Some(t) if first_ok => Reply::TopicCreated { id: t.id },
                _ => Reply::Error(ControllerError::TopicExists(name.clone())),
            },
            Request::DeleteTopic { name } => {
                if first_ok {
                    Reply::TopicDeleted
                } else {
                    Reply::Error(ControllerError::UnknownTopic(name.clone()))
                }
            }
            Request::CreatePartitions { name, count, .. } => match self.image.topic(name) {
                Some(t) if t.partitions.len() as i32 >= *count => Reply::PartitionsCreated,
                _ => Reply::Error(ControllerError::Conflict),
            },
            Request::AlterConfigs { .. } => Reply::ConfigsAltered,
            Request::DescribeQuorum => Reply::Error(ControllerError::NotForCore("DescribeQuorum".into())),
            // Proposed as Pending::Election and Pending::Reassignment, answered above.
            Request::ElectLeaders { .. } | Request::AlterReassignments { .. } => {
                Reply::Error(ControllerError::Conflict)
            }
            Request::AlterPartition { topic_id, partition, partition_epoch, .. } => {
                match self.image.topics.get(topic_id).and_then(|t| t.partitions.get(partition)) {
                    Some(reg) if first_ok => altered(reg),
                    // Another change to the partition committed first.
                    Some(reg) => Reply::Error(ControllerError::StalePartitionEpoch {
                        requested: *partition_epoch,
                        current: reg.partition_epoch,
                    }),
                    None => Reply::Error(ControllerError::UnknownTopicId(*topic_id)),
                }
            }
            Request::AllocateProducerIds { .. } => match batch.records.first() {
                Some(MetadataRecord::ProducerIds { start, size, .. }) if first_ok => {
                    Reply::ProducerIds { start: *start, size: *size }
                }
                _ => Reply::Error(ControllerError::Conflict),
            },
        };
        Self::reply(id, reply)
    }
}

/// The conditional record of `change` to partition `partition` (at
/// `reg`'s partition epoch).
fn change_record(topic_id: Uuid, partition: i32, reg: &PartitionRegistration, change: ReplicaChange) -> MetadataRecord {
    MetadataRecord::PartitionChange {
        topic_id,
        partition,
        expected_partition_epoch: reg.partition_epoch,
        leader: change.leader,
        isr: change.isr,
        assignment: change.assignment,
        elr: change.elr,
        last_known_elr: change.last_known_elr,
        leader_recovery_state: change.leader_recovery_state,
    }
}

/// Kafka's KIP-704 rules for an AlterPartition's recovery state: a leader
/// still recovering keeps the ISR to itself, and a recovered partition
/// never goes back to recovering (both INVALID_REQUEST).
fn check_recovery(
    reg: &PartitionRegistration,
    new_isr: &[i32],
    state: LeaderRecoveryState,
) -> Result<(), ControllerError> {
    let invalid = |why: &str| Err(ControllerError::InvalidIsr { isr: new_isr.to_vec(), why: why.into() });
    if state == LeaderRecoveryState::Recovering && new_isr.len() > 1 {
        return invalid("the leader is still recovering from an unclean election, so it must be alone in the ISR");
    }
    if reg.leader_recovery_state == LeaderRecoveryState::Recovered && state == LeaderRecoveryState::Recovering {
        return invalid("the partition's leader has already recovered; it cannot go back to recovering");
    }
    Ok(())
}

/// An AlterPartition's answer: the partition as it now is.
fn altered(reg: &PartitionRegistration) -> Reply {
    Reply::PartitionAltered {
        leader: reg.leader,
        leader_epoch: reg.leader_epoch,
        partition_epoch: reg.partition_epoch,
        isr: reg.isr.clone(),
    }
}

/// The same brokers, in any order: an ISR is a set.
fn same_members(a: &[i32], b: &[i32]) -> bool {
    let sorted = |v: &[i32]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v
    };
    sorted(a) == sorted(b)
}

/// The change that makes a partition agree with who is `active`, or `None`
/// if nothing changes. Inactive brokers, and those in `unclean_shutdown`
/// (restarted after a crash), leave the ISR, the last member too: it joins
/// the eligible leader replicas instead while the ISR is below `min_isr`
/// (see [`eligible`]). A leader that is inactive or out of the ISR, or no
/// leader, is replaced by the first replica, in replica order, that is an
/// active ISR member (so the preferred replica when it can), or with the
/// ISR empty an active ELR member (which becomes the ISR); failing that,
/// the partition's last known leader if it is the only one left and is
/// active, else with `unclean` (the topic's
/// `unclean.leader.election.enable`) the first active replica (both alone
/// in the ISR, as an unclean election); else none (-1, offline).
fn settle(
    reg: &PartitionRegistration,
    active: impl Fn(i32) -> bool,
    unclean: bool,
    min_isr: usize,
    unclean_shutdown: &[i32],
) -> Option<ReplicaChange> {
    let mut isr: Vec<i32> = reg.isr.iter().copied().filter(|b| active(*b) && !unclean_shutdown.contains(b)).collect();
    let elr = eligible::candidates(reg, &isr, &reg.replicas, min_isr, unclean_shutdown);
    let valid = |r: i32| eligible::may_lead(r, &isr, &elr) && active(r);
    let mut unclean_election = false;
    let mut leader = if valid(reg.leader) {
        reg.leader
    } else {
        reg.replicas.iter().copied().find(|r| valid(*r)).unwrap_or(NO_LEADER)
    };
    if leader != NO_LEADER && isr.is_empty() {
        // Elected from the ELR: it holds everything committed.
        isr = vec![leader];
    }
    if leader == NO_LEADER && isr.is_empty() && elr.is_empty() {
        let last_known = match reg.last_known_elr.as_slice() {
            [last] if active(*last) => Some(*last),
            _ if unclean => reg.replicas.iter().copied().find(|r| active(*r)),
            _ => None,
        };
        if let Some(r) = last_known {
            leader = r;
            isr = vec![r];
            unclean_election = true;
        }
    } else if leader == NO_LEADER && unclean {
        if let Some(r) = reg.replicas.iter().copied().find(|r| active(*r)) {
            leader = r;
            isr = vec![r];
            unclean_election = true;
        }
    }
    let change = ReplicaChange {
        leader: (leader != reg.leader).then_some(leader),
        isr: (isr != reg.isr).then_some(isr),
        // An unclean leader starts recovering (KIP-704).
        leader_recovery_state: (unclean_election && reg.leader_recovery_state.is_recovered())
            .then_some(LeaderRecoveryState::Recovering),
        ..Default::default()
    };
    let change = eligible::complete(reg, change, min_isr, unclean_shutdown, unclean_election);
    let changed = change.leader.is_some()
        || change.isr.is_some()
        || change.elr.is_some()
        || change.leader_recovery_state.is_some();
    (changed || change.last_known_elr.is_some()).then_some(change)
}

/// The records of new partitions `first..` of a topic, each led by the
/// first of its ISR at leader epoch 0.
fn partition_records(topic_id: Uuid, first: i32, placed: Vec<Placed>) -> impl Iterator<Item = MetadataRecord> {
    placed.into_iter().enumerate().map(move |(i, (replicas, isr))| MetadataRecord::Partition {
        topic_id,
        partition: first + i as i32,
        leader: isr[0],
        isr,
        replicas,
        leader_epoch: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits every proposal at once, in order, like a one-voter quorum.
    struct Harness {
        core: ControllerCore,
        offset: u64,
        replies: Vec<(RequestId, Reply)>,
        next_id: RequestId,
    }

    impl Harness {
        fn new() -> Harness {
            Harness::rebalancing(None)
        }

        /// With automatic preferred-leader elections every `interval_ms`.
        fn rebalancing(interval_ms: Option<u64>) -> Harness {
            let settings = CoreSettings {
                session_timeout_ms: 9000,
                connection_loss_grace_ms: Some(3000),
                leader_rebalance_interval_ms: interval_ms,
                unclean_leader_election: false,
                min_insync_replicas: 1,
                seed: 7,
            };
            Harness {
                core: ControllerCore::new(settings, ClusterImage::default()),
                offset: 0,
                replies: Vec::new(),
                next_id: 0,
            }
        }

        fn run(&mut self, input: Input) {
            let mut queue = self.core.step(input);
            while let Some(effect) = queue.pop() {
                match effect {
                    Effect::Propose(batch) => {
                        self.offset += 1;
                        queue.extend(self.core.step(Input::Committed { offset: self.offset, batch }));
                    }
                    Effect::Reply { id, reply } => self.replies.push((id, reply)),
                }
            }
        }

        fn call(&mut self, request: Request, now_ms: u64) -> Reply {
            self.next_id += 1;
            let id = self.next_id;
            self.run(Input::Request { id, request, now_ms });
            let at = self.replies.iter().position(|(i, _)| *i == id).expect("a reply");
            self.replies.remove(at).1
        }

        fn register(&mut self, broker_id: i32, now_ms: u64) -> i64 {
            self.register_after(broker_id, now_ms, true)
        }

        /// Registers a new incarnation, saying whether the last stopped
        /// cleanly, and unfences it.
        fn register_after(&mut self, broker_id: i32, now_ms: u64, clean_shutdown: bool) -> i64 {
            let r = Request::Register {
                broker_id,
                incarnation_id: Uuid::new_v4(),
                endpoints: vec![Endpoint { name: "PLAINTEXT".into(), host: "h".into(), port: 1 }],
                rack: None,
                clean_shutdown,
            };
            let Reply::Registered { epoch } = self.call(r, now_ms) else { panic!("not registered") };
            let hb = Request::Heartbeat { broker_id, epoch, applied_offset: self.offset, want_shutdown: false };
            assert_eq!(self.call(hb, now_ms), Reply::Heartbeat { fenced: false, shutdown_done: false });
            epoch
        }
    }

    fn create(h: &mut Harness, name: &str, partitions: i32, replication_factor: i16) -> Uuid {
        let r = h.call(
            Request::CreateTopic {
                name: name.into(),
                partitions,
                replication_factor,
                configs: BTreeMap::new(),
                assignment: None,
            },
            0,
        );
        let Reply::TopicCreated { id } = r else { panic!("{r:?}") };
        id
    }

    fn partition(h: &Harness, name: &str, p: i32) -> PartitionRegistration {
        h.core.image().partition(name, p).unwrap().clone()
    }

    fn heartbeat(h: &mut Harness, broker_id: i32, epoch: i64, now_ms: u64, want_shutdown: bool) -> Reply {
        let hb = Request::Heartbeat { broker_id, epoch, applied_offset: h.offset, want_shutdown };
        h.call(hb, now_ms)
    }

    /// An AlterPartition from `broker` at the partition's current epochs.
    fn alter(h: &Harness, broker: i32, name: &str, p: i32, new_isr: Vec<i32>) -> Request {
        let reg = partition(h, name, p);
        Request::AlterPartition {
            broker_id: broker,
            broker_epoch: h.core.image().brokers[&broker].epoch,
            topic_id: h.core.image().topic(name).unwrap().id,
            partition: p,
            leader_epoch: reg.leader_epoch,
            partition_epoch: reg.partition_epoch,
            new_isr,
            leader_recovery_state: LeaderRecoveryState::Recovered,
        }
    }

    /// Every broker but `silent` heartbeats each second from `from` to
    /// `to` ms, and the controller ticks.
    fn run_sessions(h: &mut Harness, epochs: &BTreeMap<i32, i64>, silent: &[i32], from: u64, to: u64) {
        for now in (from..=to).step_by(1000) {
            for (&b, &e) in epochs.iter().filter(|(b, _)| !silent.contains(b)) {
                heartbeat(h, b, e, now, false);
            }
            h.run(Input::Tick { now_ms: now });
        }
    }

    /// Three brokers and topic "r": three partitions of three replicas,
    /// each broker the preferred leader of one.
    fn rf3() -> (Harness, BTreeMap<i32, i64>) {
        let mut h = Harness::new();
        let epochs: BTreeMap<i32, i64> = (1..=3).map(|b| (b, h.register(b, 0))).collect();
        create(&mut h, "r", 3, 3);
        (h, epochs)
    }

    #[test]
    fn topics_of_three_replicas_start_with_every_replica_in_sync() {
        let (mut h, epochs) = rf3();
        let mut leaders = Vec::new();
        for p in 0..3 {
            let reg = partition(&h, "r", p);
            assert_eq!(reg.replicas.len(), 3, "{reg:?}");
            assert_eq!(reg.isr, reg.replicas, "every replica in sync");
            assert_eq!((reg.leader, reg.leader_epoch, reg.partition_epoch), (reg.replicas[0], 0, 0));
            leaders.push(reg.leader);
        }
        leaders.sort_unstable();
        assert_eq!(leaders, vec![1, 2, 3], "preferred leaders spread");
        let grow = Request::CreatePartitions { name: "r".into(), count: 5, assignment: None };
        assert_eq!(h.call(grow, 0), Reply::PartitionsCreated);
        for p in 3..5 {
            let reg = partition(&h, "r", p);
            assert_eq!((reg.replicas.len(), reg.isr.clone()), (3, reg.replicas.clone()), "{reg:?}");
        }
        // A manual assignment takes only the unfenced replicas into the ISR.
        run_sessions(&mut h, &epochs, &[3], 1000, 10_000);
        let manual = Request::CreateTopic {
            name: "m".into(),
            partitions: -1,
            replication_factor: -1,
            configs: BTreeMap::new(),
            assignment: Some(vec![vec![3, 1, 2]]),
        };
        assert!(matches!(h.call(manual, 10_000), Reply::TopicCreated { .. }));
        let reg = partition(&h, "m", 0);
        assert_eq!((reg.replicas, reg.isr, reg.leader), (vec![3, 1, 2], vec![1, 2], 1));
    }

    #[test]
    fn alter_partition_shrinks_and_expands_the_isr_bumping_the_partition_epoch() {
        let (mut h, _) = rf3();
        let reg = partition(&h, "r", 0);
        let (leader, follower) = (reg.leader, reg.replicas[1]);
        let shrunk: Vec<i32> = reg.isr.iter().copied().filter(|b| *b != follower).collect();
        let r = h.call(alter(&h, leader, "r", 0, shrunk.clone()), 0);
        assert_eq!(r, Reply::PartitionAltered { leader, leader_epoch: 0, partition_epoch: 1, isr: shrunk.clone() });
        let back = reg.isr.clone();
        let r = h.call(alter(&h, leader, "r", 0, back.clone()), 0);
        assert_eq!(r, Reply::PartitionAltered { leader, leader_epoch: 0, partition_epoch: 2, isr: back.clone() });
        // The same members in another order: answered as is, nothing proposed.
        let offset = h.offset;
        let reordered: Vec<i32> = back.iter().rev().copied().collect();
        let r = h.call(alter(&h, leader, "r", 0, reordered), 0);
        assert_eq!(r, Reply::PartitionAltered { leader, leader_epoch: 0, partition_epoch: 2, isr: back });
        assert_eq!(h.offset, offset);
    }

    #[test]
    fn alter_partition_refusals_carry_kafkas_codes() {
        use kafka_protocol::error::ResponseError as K;
        let (mut h, epochs) = rf3();
        let reg = partition(&h, "r", 0);
        let (leader, f1, f2) = (reg.leader, reg.replicas[1], reg.replicas[2]);
        let refused = |h: &mut Harness, request: Request, code: K| {
            let r = h.call(request.clone(), 0);
            let Reply::Error(e) = r else { panic!("{request:?} accepted: {r:?}") };
            assert_eq!(crate::api::error::controller_reply_code(&e).0, code.code(), "{request:?}: {e}");
        };
        let with = |mut r: Request, f: &dyn Fn(&mut Request)| {
            f(&mut r);
            r
        };
        let base = alter(&h, leader, "r", 0, vec![leader, f1]);
        let set = |field: &'static str, v: i64| {
            move |r: &mut Request| {
                let Request::AlterPartition {
                    broker_epoch, partition, leader_epoch, partition_epoch, topic_id, ..
                } = r
                else {
                    unreachable!()
                };
                match field {
                    "broker_epoch" => *broker_epoch += v,
                    "partition" => *partition = v as i32,
                    "leader_epoch" => *leader_epoch += v as i32,
                    "partition_epoch" => *partition_epoch += v as i32,
                    _ => *topic_id = Uuid::from_u128(v as u128),
                }
            }
        };
        refused(&mut h, with(base.clone(), &set("broker_epoch", 1)), K::StaleBrokerEpoch);
        refused(&mut h, with(base.clone(), &set("topic_id", 42)), K::UnknownTopicId);
        refused(&mut h, with(base.clone(), &set("partition", 9)), K::UnknownTopicOrPartition);
        refused(&mut h, with(base.clone(), &set("leader_epoch", 1)), K::NotController);
        refused(&mut h, with(base.clone(), &set("partition_epoch", 1)), K::NotController);
        refused(&mut h, with(base.clone(), &set("leader_epoch", -1)), K::FencedLeaderEpoch);
        let by_follower = alter(&h, f1, "r", 0, vec![f1, f2]);
        refused(&mut h, by_follower, K::InvalidRequest);
        for bad in [vec![], vec![f1, f2], vec![leader, 4], vec![leader, f1, f1]] {
            let bad = alter(&h, leader, "r", 0, bad);
            refused(&mut h, bad, K::InvalidRequest);
        }
        assert_eq!(partition(&h, "r", 0), reg, "no refusal changed anything");
        // After a shrink, the old partition epoch is a stale update.
        assert!(matches!(h.call(base.clone(), 0), Reply::PartitionAltered { .. }));
        refused(&mut h, base, K::InvalidUpdateVersion);
        // f2 shuts down, f1 is fenced: neither may be in an ISR.
        let Reply::Heartbeat { .. } = heartbeat(&mut h, f2, epochs[&f2], 0, true) else { panic!() };
        let add_shutting_down = alter(&h, leader, "r", 0, vec![leader, f2]);
        refused(&mut h, add_shutting_down, K::IneligibleReplica);
        let others: Vec<i32> = [f1, f2].into();
        run_sessions(&mut h, &epochs, &others, 1000, 10_000);
        assert!(h.core.image().brokers[&f1].fenced);
        let r = h.call(alter(&h, leader, "r", 0, vec![leader, f1]), 10_000);
        assert!(
            matches!(&r, Reply::Error(ControllerError::IneligibleReplica { broker, .. }) if *broker == f1),
            "{r:?}"
        );
        assert_eq!(partition(&h, "r", 0).isr, vec![leader]);
    }

    #[test]
    fn an_alter_partition_overtaken_by_another_change_is_a_stale_update() {
        let (mut h, epochs) = rf3();
        let reg = partition(&h, "r", 0);
        let (leader, f1, f2) = (reg.leader, reg.replicas[1], reg.replicas[2]);
        // Proposed, not yet committed ...
        let effects =
            h.core.step(Input::Request { id: 500, request: alter(&h, leader, "r", 0, vec![leader, f2]), now_ms: 0 });
        let [Effect::Propose(batch)] = effects.as_slice() else { panic!("{effects:?}") };
        // ... while f1's controlled shutdown changes the partition first.
        heartbeat(&mut h, f1, epochs[&f1], 0, true);
        let moved = partition(&h, "r", 0);
        assert_eq!((moved.isr.len(), moved.partition_epoch), (2, 1));
        h.offset += 1;
        let effects = h.core.step(Input::Committed { offset: h.offset, batch: batch.clone() });
        let stale = Reply::Error(ControllerError::StalePartitionEpoch { requested: 0, current: 1 });
        assert_eq!(effects, vec![Effect::Reply { id: 500, reply: stale }]);
        assert_eq!(partition(&h, "r", 0), moved, "the overtaken change was ignored");
    }

    #[test]
    fn a_lost_connection_ends_the_session_unless_the_broker_heartbeats_again() {
        let (mut h, epochs) = rf3();
        let fenced = |h: &Harness, b: i32| h.core.image().brokers[&b].fenced;
        // Broker 2's connection breaks at 1000 but it heartbeats at 2000:
        // the loss is forgotten, and it stays unfenced long after the grace.
        h.run(Input::ConnectionLost { broker_id: 2, now_ms: 1000 });
        run_sessions(&mut h, &epochs, &[], 2000, 6000);
        assert!(!fenced(&h, 2));
        // Broker 1's breaks at 6500 and it stays silent: fenced once the
        // 3 s grace is over, long before its 9 s session would end.
        h.run(Input::ConnectionLost { broker_id: 1, now_ms: 6500 });
        // Repeated reports (each reconnect attempt) keep the first time.
        h.run(Input::ConnectionLost { broker_id: 1, now_ms: 8000 });
        run_sessions(&mut h, &epochs, &[1], 7000, 9000);
        assert!(!fenced(&h, 1), "within the grace");
        run_sessions(&mut h, &epochs, &[1], 10_000, 10_000);
        assert!(fenced(&h, 1), "3.5 s after the break, 4.5 s after its last heartbeat");
        assert!((0..3).all(|p| !partition(&h, "r", p).isr.contains(&1)));
        // Without a grace only the session fences.
        let (mut h, epochs) = rf3();
        h.core.settings.connection_loss_grace_ms = None;
        h.run(Input::ConnectionLost { broker_id: 1, now_ms: 1000 });
        run_sessions(&mut h, &epochs, &[1], 1000, 9000);
        assert!(!fenced(&h, 1));
        run_sessions(&mut h, &epochs, &[1], 10_000, 10_000);
        assert!(fenced(&h, 1));
    }

    #[test]
    fn a_fenced_leader_is_succeeded_by_the_next_isr_member_and_leaves_every_isr() {
        let (mut h, epochs) = rf3();
        let before: Vec<PartitionRegistration> = (0..3).map(|p| partition(&h, "r", p)).collect();
        run_sessions(&mut h, &epochs, &[1], 1000, 10_000);
        assert!(h.core.image().brokers[&1].fenced);
        for (p, old) in before.iter().enumerate() {
            let now = partition(&h, "r", p as i32);
            assert!(!now.isr.contains(&1), "{now:?}");
            assert_eq!(now.isr.len(), 2);
            assert_eq!(now.partition_epoch, old.partition_epoch + 1, "one change per partition");
            if old.leader == 1 {
                let next = *old.replicas.iter().find(|r| **r != 1).unwrap();
                assert_eq!((now.leader, now.leader_epoch), (next, old.leader_epoch + 1), "next in replica order");
            } else {
                assert_eq!((now.leader, now.leader_epoch), (old.leader, old.leader_epoch), "follower left only");
            }
        }
        // Back and unfenced, broker 1 leads nothing until an ISR takes it again.
        assert_eq!(
            heartbeat(&mut h, 1, epochs[&1], 11_000, false),
            Reply::Heartbeat { fenced: false, shutdown_done: false }
        );
        assert!((0..3).all(|p| partition(&h, "r", p).leader != 1));
        let reg = partition(&h, "r", 0);
        let mut isr = reg.isr.clone();
        isr.push(1);
        assert!(matches!(h.call(alter(&h, reg.leader, "r", 0, isr), 11_000), Reply::PartitionAltered { .. }));
    }

    #[test]
    fn the_last_isr_member_becomes_eligible_when_all_are_fenced_and_leads_again_when_back() {
        let (mut h, epochs) = rf3();
        run_sessions(&mut h, &epochs, &[1], 1000, 10_000);
        run_sessions(&mut h, &epochs, &[1, 2], 11_000, 20_000);
        run_sessions(&mut h, &epochs, &[1, 2, 3], 21_000, 30_000);
        assert!(h.core.image().brokers.values().all(|b| b.fenced));
        for p in 0..3 {
            let reg = partition(&h, "r", p);
            let state = (reg.isr.as_slice(), reg.elr.as_slice(), reg.leader);
            assert_eq!(state, (&[][..], &[3][..], NO_LEADER), "{reg:?}");
        }
        // Broker 1 returns first: not in any ISR, so nothing comes back.
        heartbeat(&mut h, 1, epochs[&1], 31_000, false);
        assert!((0..3).all(|p| partition(&h, "r", p).leader == NO_LEADER));
        // Broker 3, the last in sync, returns and leads everything.
        heartbeat(&mut h, 3, epochs[&3], 31_000, false);
        for p in 0..3 {
            let reg = partition(&h, "r", p);
            let state = (reg.isr.as_slice(), reg.elr.as_slice(), reg.leader);
            assert_eq!(state, (&[3][..], &[][..], 3), "{reg:?}");
        }
    }

    /// The case KIP-966 is for (the replication simulation's power-loss
    /// seeds found it): the last ISR member crashed and may have lost its
    /// unflushed tail; the replica that left the ISR below min ISR still
    /// holds everything committed and must be the one to lead.
    #[test]
    fn a_replica_back_from_a_crash_does_not_lead_over_an_eligible_one() {
        for clean in [false, true] {
            let mut h = Harness::new();
            let mut epochs: BTreeMap<i32, i64> = (1..=3).map(|b| (b, h.register(b, 0))).collect();
            let create = Request::CreateTopic {
                name: "e".into(),
                partitions: -1,
                replication_factor: -1,
                configs: BTreeMap::from([("min.insync.replicas".to_string(), "2".to_string())]),
                assignment: Some(vec![vec![1, 2, 3]]),
            };
            assert!(matches!(h.call(create, 0), Reply::TopicCreated { .. }));
            let state = |h: &Harness| {
                let p = partition(h, "e", 0);
                (p.leader, p.isr, p.elr, p.last_known_elr)
            };
            run_sessions(&mut h, &epochs, &[2], 1000, 10_000);
            assert_eq!(state(&h), (1, vec![1, 3], vec![], vec![]), "at min ISR nobody is eligible");
            run_sessions(&mut h, &epochs, &[1, 2], 11_000, 20_000);
            assert_eq!(state(&h), (3, vec![3], vec![1], vec![]), "below it the leaver stays eligible");
            run_sessions(&mut h, &epochs, &[1, 2, 3], 21_000, 30_000);
            assert_eq!(state(&h), (NO_LEADER, vec![], vec![1, 3], vec![3]));
            // Broker 3 restarts.
            epochs.insert(3, h.register_after(3, 31_000, clean));
            if clean {
                assert_eq!(state(&h), (3, vec![3], vec![1], vec![]), "a clean stop keeps it eligible");
                continue;
            }
            assert_eq!(state(&h), (NO_LEADER, vec![], vec![1], vec![3]), "after a crash it is not eligible");
            // Broker 1 is back: it leads, and 3 may rejoin as a follower.
            run_sessions(&mut h, &epochs, &[2], 32_000, 32_000);
            assert_eq!(state(&h), (1, vec![1], vec![], vec![]));
            assert!(matches!(h.call(alter(&h, 1, "e", 0, vec![1, 3]), 33_000), Reply::PartitionAltered { .. }));
            assert_eq!(state(&h), (1, vec![1, 3], vec![], vec![]));
        }
    }

    /// A single replica that crashed is the last known leader and leads
    /// again when back (Kafka 4.1's choice over staying offline).
    #[test]
    fn a_lone_replica_back_from_a_crash_leads_again_as_the_last_known_leader() {
        let mut h = Harness::new();
        let mut epochs: BTreeMap<i32, i64> = (1..=2).map(|b| (b, h.register(b, 0))).collect();
        let create = Request::CreateTopic {
            name: "one".into(),
            partitions: -1,
            replication_factor: -1,
            configs: BTreeMap::new(),
            assignment: Some(vec![vec![1]]),
        };
        assert!(matches!(h.call(create, 0), Reply::TopicCreated { .. }));
        run_sessions(&mut h, &epochs, &[1], 1000, 10_000);
        let p = partition(&h, "one", 0);
        assert_eq!((p.leader, p.isr.as_slice(), p.elr.as_slice()), (NO_LEADER, &[][..], &[1][..]));
        epochs.insert(1, h.register_after(1, 11_000, false));
        let p = partition(&h, "one", 0);
        assert_eq!((p.leader, p.isr.as_slice(), p.elr.as_slice()), (1, &[1][..], &[][..]));
        assert!(p.last_known_elr.is_empty());
        // Electing the last known leader is unclean: it may have lost its
        // unflushed tail, so it starts recovering (KIP-704, as Kafka).
        assert_eq!(p.leader_recovery_state, LeaderRecoveryState::Recovering);
    }

    #[test]
    fn brokers_fenced_at_the_same_tick_are_decided_together() {
        let (mut h, epochs) = rf3();
        run_sessions(&mut h, &epochs, &[1, 2], 1000, 10_000);
        for p in 0..3 {
            let reg = partition(&h, "r", p);
            assert_eq!((reg.isr.as_slice(), reg.leader), (&[3][..], 3), "never handed to a broker fenced with it");
        }
        // Both fenced at once, broker 3 then too: it is each partition's
        // one eligible leader replica.
        run_sessions(&mut h, &epochs, &[1, 2, 3], 11_000, 20_000);
        assert!((0..3).all(|p| partition(&h, "r", p).isr.is_empty() && partition(&h, "r", p).elr == vec![3]));
    }

    #[test]
    fn controlled_shutdown_of_a_replica_says_done_only_once_it_leads_nothing() {
        let (mut h, epochs) = rf3();
        let led: Vec<i32> = (0..3).filter(|p| partition(&h, "r", *p).leader == 1).collect();
        assert_eq!(led.len(), 1);
        let p = led[0];
        // The shutdown's changes are decided, then overtaken by broker 1's own
        // AlterPartition: the change for the partition it leads is ignored.
        let shutdown =
            Request::Heartbeat { broker_id: 1, epoch: epochs[&1], applied_offset: h.offset, want_shutdown: true };
        let effects = h.core.step(Input::Request { id: 600, request: shutdown, now_ms: 0 });
        let [Effect::Propose(batch)] = effects.as_slice() else { panic!("{effects:?}") };
        let isr = partition(&h, "r", p).isr;
        let shrink: Vec<i32> = isr.iter().copied().take(2).collect();
        assert!(matches!(h.call(alter(&h, 1, "r", p, shrink), 0), Reply::PartitionAltered { .. }));
        h.offset += 1;
        let effects = h.core.step(Input::Committed { offset: h.offset, batch: batch.clone() });
        assert_eq!(
            effects,
            vec![Effect::Reply { id: 600, reply: Reply::Heartbeat { fenced: false, shutdown_done: false } }]
        );
        assert!(h.core.image().brokers[&1].in_controlled_shutdown);
        assert_eq!(partition(&h, "r", p).leader, 1, "still leads the partition whose change was overtaken");
        // The next heartbeat moves it.
        assert_eq!(
            heartbeat(&mut h, 1, epochs[&1], 100, true),
            Reply::Heartbeat { fenced: false, shutdown_done: true }
        );
        for q in 0..3 {
            let reg = partition(&h, "r", q);
            assert!(reg.leader != 1 && reg.leader != NO_LEADER && !reg.isr.contains(&1), "{reg:?}");
        }
    }

    #[test]
    fn a_restarted_broker_leaves_every_isr_when_it_registers_again() {
        let (mut h, _) = rf3();
        let before: Vec<PartitionRegistration> = (0..3).map(|p| partition(&h, "r", p)).collect();
        // A new incarnation of broker 2, caught up: it leads nothing and is in no ISR.
        h.register(2, 100);
        assert!(h.core.image().brokers[&2].is_active());
        for (p, old) in before.iter().enumerate() {
            let now = partition(&h, "r", p as i32);
            assert!(!now.isr.contains(&2) && now.leader != 2, "{now:?}");
            if old.leader == 2 {
                assert_eq!(now.leader, *old.replicas.iter().find(|r| **r != 2).unwrap());
            }
        }
    }

    #[test]
    fn a_fenced_broker_left_in_an_isr_by_an_overtaken_change_is_removed_at_a_later_tick() {
        let (mut h, epochs) = rf3();
        let reg = partition(&h, "r", 0);
        let (leader, f1, f2) = (reg.leader, reg.replicas[1], reg.replicas[2]);
        run_sessions(&mut h, &epochs, &[f1], 1000, 9000);
        // The leader drops f2, and f1's session expires, decided on the same image.
        let effects =
            h.core.step(Input::Request { id: 700, request: alter(&h, leader, "r", 0, vec![leader, f1]), now_ms: 9000 });
        let [Effect::Propose(shrink)] = effects.as_slice() else { panic!("{effects:?}") };
        for b in [leader, f2] {
            let hb =
                Request::Heartbeat { broker_id: b, epoch: epochs[&b], applied_offset: h.offset, want_shutdown: false };
            assert!(matches!(
                h.core.step(Input::Request { id: 701, request: hb, now_ms: 10_000 }).as_slice(),
                [Effect::Reply { .. }]
            ));
        }
        let effects = h.core.step(Input::Tick { now_ms: 10_000 });
        let [Effect::Propose(fence)] = effects.as_slice() else { panic!("{effects:?}") };
        for batch in [shrink, fence] {
            h.offset += 1;
            h.core.step(Input::Committed { offset: h.offset, batch: batch.clone() });
        }
        assert!(h.core.image().brokers[&f1].fenced);
        assert_eq!(partition(&h, "r", 0).isr, vec![leader, f1], "the fence's ISR change was overtaken");
        h.run(Input::Tick { now_ms: 11_000 });
        assert_eq!(partition(&h, "r", 0).isr, vec![leader]);
        // Consistent now: later ticks propose nothing.
        assert!(h.core.step(Input::Tick { now_ms: 12_000 }).is_empty());
    }

    #[test]
    fn settling_follows_the_isr_then_the_elr_then_the_last_leader_in_replica_order() {
        let reg = |replicas: Vec<i32>, isr: Vec<i32>, leader, elr: Vec<i32>, last_known_elr: Vec<i32>| {
            PartitionRegistration {
                replicas,
                isr,
                leader,
                leader_epoch: 3,
                partition_epoch: 5,
                adding_replicas: vec![],
                removing_replicas: vec![],
                elr,
                last_known_elr,
                leader_recovery_state: Default::default(),
            }
        };
        let up = |ids: &'static [i32]| move |b: i32| ids.contains(&b);
        let change = |leader: Option<i32>, isr: Option<Vec<i32>>, elr: Option<Vec<i32>>, lke: Option<Vec<i32>>| {
            Some(ReplicaChange { leader, isr, assignment: None, elr, last_known_elr: lke, leader_recovery_state: None })
        };
        let r123 = vec![1, 2, 3];
        assert_eq!(settle(&reg(r123.clone(), vec![1, 2, 3], 2, vec![], vec![]), up(&[1, 2, 3]), false, 2, &[]), None);
        // Below min ISR 2 the fenced leader stays eligible.
        assert_eq!(
            settle(&reg(r123.clone(), vec![3, 2], 3, vec![], vec![]), up(&[1, 2]), false, 2, &[]),
            change(Some(2), Some(vec![2]), Some(vec![3]), None)
        );
        // The preferred replica wins over ISR order; at min ISR nothing is eligible.
        assert_eq!(
            settle(&reg(r123.clone(), vec![3, 1, 2], 3, vec![], vec![]), up(&[1, 2]), false, 2, &[]),
            change(Some(1), Some(vec![1, 2]), None, None)
        );
        // Nobody active: the ISR empties into the ELR; then nothing changes.
        assert_eq!(
            settle(&reg(r123.clone(), vec![2, 3], 3, vec![], vec![]), up(&[]), false, 2, &[]),
            change(Some(NO_LEADER), Some(vec![]), Some(vec![2, 3]), Some(vec![3]))
        );
        let offline = reg(r123.clone(), vec![], NO_LEADER, vec![2, 3], vec![3]);
        assert_eq!(settle(&offline, up(&[]), false, 2, &[]), None);
        // An ELR member back leads, alone in the ISR; a replica outside it does not.
        assert_eq!(
            settle(&offline, up(&[3]), false, 2, &[]),
            change(Some(3), Some(vec![3]), Some(vec![2]), Some(vec![]))
        );
        assert_eq!(settle(&offline, up(&[1]), false, 2, &[]), None);
        // A leader restarted after a crash leaves ISR and ELR; the others stay eligible.
        assert_eq!(
            settle(&reg(r123.clone(), vec![3], 3, vec![1], vec![]), up(&[2]), false, 2, &[3]),
            change(Some(NO_LEADER), Some(vec![]), None, Some(vec![3]))
        );
        // With neither left, the last leader is remembered and leads when back.
        let lost = reg(r123.clone(), vec![3], 3, vec![], vec![]);
        assert_eq!(settle(&lost, up(&[]), false, 2, &[3]), change(Some(NO_LEADER), Some(vec![]), None, Some(vec![3])));
        let remembered = reg(r123.clone(), vec![], NO_LEADER, vec![], vec![3]);
        assert_eq!(settle(&remembered, up(&[1, 2]), false, 2, &[]), None);
        // Both unclean elections: the leader starts recovering (KIP-704).
        let recovering = |c: Option<ReplicaChange>| {
            c.map(|c| ReplicaChange { leader_recovery_state: Some(LeaderRecoveryState::Recovering), ..c })
        };
        assert_eq!(
            settle(&remembered, up(&[3]), false, 2, &[]),
            recovering(change(Some(3), Some(vec![3]), None, Some(vec![])))
        );
        // Unclean: the first active replica, alone in the ISR, and the ELR cleared.
        assert_eq!(
            settle(&offline, up(&[2, 1]), true, 2, &[]),
            change(Some(2), Some(vec![2]), Some(vec![3]), Some(vec![])),
            "an ELR member first"
        );
        let empty = reg(r123.clone(), vec![], NO_LEADER, vec![], vec![]);
        assert_eq!(settle(&empty, up(&[2, 1]), true, 2, &[]), recovering(change(Some(1), Some(vec![1]), None, None)));
        // Still recovering: a later election leaves the state as it is.
        let still = PartitionRegistration { leader_recovery_state: LeaderRecoveryState::Recovering, ..empty };
        assert_eq!(settle(&still, up(&[2]), true, 2, &[]), change(Some(2), Some(vec![2]), None, None));
    }

    #[test]
    fn brokers_register_unfence_and_topics_spread_over_them() {
        let mut h = Harness::new();
        for b in 1..=3 {
            h.register(b, 0);
        }
        let r = h.call(
            Request::CreateTopic {
                name: "t".into(),
                partitions: 6,
                replication_factor: 1,
                configs: BTreeMap::new(),
                assignment: None,
            },
            0,
        );
        assert!(matches!(r, Reply::TopicCreated { .. }), "{r:?}");
        let t = h.core.image().topic("t").unwrap();
        let mut per_broker = BTreeMap::new();
        for p in t.partitions.values() {
            *per_broker.entry(p.leader).or_insert(0) += 1;
        }
        assert_eq!(per_broker.values().copied().collect::<Vec<_>>(), vec![2, 2, 2]);
        let again = h.call(
            Request::CreateTopic {
                name: "t".into(),
                partitions: 1,
                replication_factor: 1,
                configs: BTreeMap::new(),
                assignment: None,
            },
            0,
        );
        assert_eq!(again, Reply::Error(ControllerError::TopicExists("t".into())));
        let too_many = h.call(
            Request::CreateTopic {
                name: "u".into(),
                partitions: 1,
                replication_factor: 4,
                configs: BTreeMap::new(),
                assignment: None,
            },
            0,
        );
        assert!(matches!(too_many, Reply::Error(ControllerError::Placement(_))), "{too_many:?}");
    }

    #[test]
    fn manual_assignments_are_checked_and_kept_as_given() {
        let mut h = Harness::new();
        for b in 1..=3 {
            h.register(b, 0);
        }
        let create = |name: &str, assignment: Vec<Vec<i32>>| Request::CreateTopic {
            name: name.into(),
            partitions: -1,
            replication_factor: -1,
            configs: BTreeMap::new(),
            assignment: Some(assignment),
        };
        let r = h.call(create("m", vec![vec![3], vec![3], vec![1]]), 0);
        assert!(matches!(r, Reply::TopicCreated { .. }), "{r:?}");
        let leaders: Vec<i32> = h.core.image().topic("m").unwrap().partitions.values().map(|p| p.leader).collect();
        assert_eq!(leaders, vec![3, 3, 1]);
        for (bad, why) in [
            (vec![vec![4]], "not registered"),
            (vec![vec![1], vec![]], "no replicas"),
            (vec![vec![1, 1]], "twice"),
            (vec![vec![1], vec![1, 2]], "every partition has 1"),
            (vec![], "no partitions"),
        ] {
            let r = h.call(create("bad", bad.clone()), 0);
            match r {
                Reply::Error(ControllerError::Placement(PlacementError::InvalidAssignment(m))) => {
                    assert!(m.contains(why), "{bad:?}: {m}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(h.core.image().topic("bad").is_none());
        // Added partitions: as many assignments as new partitions, of the topic's size.
        let grow = |count, assignment| Request::CreatePartitions { name: "m".into(), count, assignment };
        let r = h.call(grow(5, Some(vec![vec![2]])), 0);
        assert!(matches!(r, Reply::Error(ControllerError::Placement(PlacementError::InvalidAssignment(_)))), "{r:?}");
        let r = h.call(grow(4, Some(vec![vec![1, 2]])), 0);
        assert!(matches!(r, Reply::Error(ControllerError::Placement(PlacementError::InvalidAssignment(_)))), "{r:?}");
        assert_eq!(h.call(grow(5, Some(vec![vec![2], vec![2]])), 0), Reply::PartitionsCreated);
        let leaders: Vec<i32> = h.core.image().topic("m").unwrap().partitions.values().map(|p| p.leader).collect();
        assert_eq!(leaders, vec![3, 3, 1, 2, 2]);
    }

    #[test]
    fn a_new_active_controller_places_only_on_brokers_it_has_heard_from() {
        let mut h = Harness::new();
        let epochs: Vec<i64> = (1..=3).map(|b| h.register(b, 0)).collect();
        // Failover: a fresh core over the same image; broker 3 died just before.
        h.core = ControllerCore::new(
            CoreSettings {
                session_timeout_ms: 9000,
                connection_loss_grace_ms: Some(3000),
                leader_rebalance_interval_ms: None,
                unclean_leader_election: false,
                min_insync_replicas: 1,
                seed: 7,
            },
            h.core.image().clone(),
        );
        for b in [1, 2] {
            let hb = Request::Heartbeat {
                broker_id: b,
                epoch: epochs[b as usize - 1],
                applied_offset: h.offset,
                want_shutdown: false,
            };
            assert!(matches!(h.call(hb, 10), Reply::Heartbeat { fenced: false, .. }));
        }
        let create = Request::CreateTopic {
            name: "n".into(),
            partitions: 4,
            replication_factor: 1,
            configs: BTreeMap::new(),
            assignment: None,
        };
        assert!(matches!(h.call(create, 10), Reply::TopicCreated { .. }));
        let leaders: std::collections::BTreeSet<i32> =
            h.core.image().topic("n").unwrap().partitions.values().map(|p| p.leader).collect();
        assert_eq!(leaders, [1, 2].into_iter().collect(), "nothing placed on the silent broker 3");
    }

    #[test]
    fn a_silent_broker_is_fenced_with_its_partitions_offline_and_returns() {
        let mut h = Harness::new();
        let e1 = h.register(1, 0);
        let e2 = h.register(2, 0);
        h.call(
            Request::CreateTopic {
                name: "t".into(),
                partitions: 4,
                replication_factor: 1,
                configs: BTreeMap::new(),
                assignment: None,
            },
            0,
        );
        // Broker 2 keeps heartbeating; broker 1 goes silent.
        for now in (1000..=10_000).step_by(1000) {
            let hb = Request::Heartbeat { broker_id: 2, epoch: e2, applied_offset: h.offset, want_shutdown: false };
            h.call(hb, now);
            h.run(Input::Tick { now_ms: now });
        }
        let img = h.core.image();
        assert!(img.brokers[&1].fenced && !img.brokers[&2].fenced);
        let t = img.topic("t").unwrap();
        assert!(t.partitions.values().all(|p| p.leader != 1));
        assert_eq!(t.partitions.values().filter(|p| p.leader == NO_LEADER).count(), 2);
        // Broker 1 heartbeats again with its epoch, caught up: unfenced, leads again.
        let hb = Request::Heartbeat { broker_id: 1, epoch: e1, applied_offset: h.offset, want_shutdown: false };
        assert_eq!(h.call(hb, 11_000), Reply::Heartbeat { fenced: false, shutdown_done: false });
        let t = h.core.image().topic("t").unwrap();
        assert!(t.partitions.values().all(|p| p.leader != NO_LEADER));
        let stale = Request::Heartbeat { broker_id: 1, epoch: e1 + 100, applied_offset: 0, want_shutdown: false };
        assert_eq!(h.call(stale, 11_000), Reply::Error(ControllerError::StaleBrokerEpoch(1)));
    }

    #[test]
    fn controlled_shutdown_moves_leadership_before_saying_done() {
        let mut h = Harness::new();
        let e1 = h.register(1, 0);
        h.call(
            Request::CreateTopic {
                name: "t".into(),
                partitions: 2,
                replication_factor: 1,
                configs: BTreeMap::new(),
                assignment: None,
            },
            0,
        );
        let hb = Request::Heartbeat { broker_id: 1, epoch: e1, applied_offset: h.offset, want_shutdown: true };
        assert_eq!(h.call(hb, 100), Reply::Heartbeat { fenced: false, shutdown_done: true });
        assert!(h.core.image().brokers[&1].in_controlled_shutdown);
        assert!(h.core.image().topic("t").unwrap().partitions.values().all(|p| p.leader == NO_LEADER));
    }

    fn elect(election: ElectionType, partitions: Option<&[(&str, i32)]>) -> Request {
        let partitions = partitions.map(|ps| ps.iter().map(|(t, p)| (t.to_string(), *p)).collect());
        Request::ElectLeaders { election, partitions }
    }

    fn result(topic: &str, partition: i32, outcome: Result<(), ElectionError>) -> ElectionResult {
        ElectionResult { topic: topic.into(), partition, outcome }
    }

    /// Fences the preferred leader of "r"-0 (silent from 1000 to 10 000
    /// ms), returning it; another ISR member then leads the partition.
    fn fence_preferred(h: &mut Harness, epochs: &BTreeMap<i32, i64>) -> i32 {
        let preferred = partition(h, "r", 0).replicas[0];
        run_sessions(h, epochs, &[preferred], 1000, 10_000);
        let reg = partition(h, "r", 0);
        assert!(reg.leader != preferred && !reg.isr.contains(&preferred), "{reg:?}");
        preferred
    }

    /// The fenced broker heartbeats again (unfenced at 11 000 ms) and the
    /// leader of "r"-0 takes it back into the ISR.
    fn rejoin(h: &mut Harness, epochs: &BTreeMap<i32, i64>, broker: i32) {
        run_sessions(h, epochs, &[], 11_000, 11_000);
        assert!(!h.core.image().brokers[&broker].fenced);
        let reg = partition(h, "r", 0);
        let mut isr = reg.isr.clone();
        isr.push(broker);
        let request = alter(h, reg.leader, "r", 0, isr);
        assert!(matches!(h.call(request, 11_500), Reply::PartitionAltered { .. }));
    }

    #[test]
    fn preferred_elections_follow_kafkas_rules() {
        let (mut h, epochs) = rf3();
        let preferred = fence_preferred(&mut h, &epochs);
        let isr = partition(&h, "r", 0).isr;
        let offset = h.offset;
        let named: &[(&str, i32)] = &[("r", 0), ("r", 1), ("nope", 0), ("r", 7)];
        let r = h.call(elect(ElectionType::Preferred, Some(named)), 10_000);
        let expected = vec![
            result("r", 0, Err(ElectionError::PreferredLeaderNotAvailable { preferred, isr })),
            result("r", 1, Err(ElectionError::ElectionNotNeeded)),
            result("nope", 0, Err(ElectionError::UnknownTopicOrPartition("nope".into(), 0))),
            result("r", 7, Err(ElectionError::UnknownTopicOrPartition("r".into(), 7))),
        ];
        assert_eq!(r, Reply::LeadersElected(expected));
        assert_eq!(h.offset, offset, "nothing to elect, nothing proposed");

        rejoin(&mut h, &epochs, preferred);
        // Without automatic rebalancing the partition stays where it is.
        run_sessions(&mut h, &epochs, &[], 12_000, 400_000);
        let before = partition(&h, "r", 0);
        assert!(before.leader != preferred && before.isr.contains(&preferred), "{before:?}");
        // For all partitions, only those whose election was needed are named.
        let r = h.call(elect(ElectionType::Preferred, None), 400_000);
        assert_eq!(r, Reply::LeadersElected(vec![result("r", 0, Ok(()))]));
        let after = partition(&h, "r", 0);
        assert_eq!((after.leader, after.leader_epoch), (preferred, before.leader_epoch + 1));
        assert_eq!(after.isr, before.isr, "a preferred election keeps the ISR");
        assert_eq!(h.call(elect(ElectionType::Preferred, None), 400_000), Reply::LeadersElected(vec![]));
    }

    #[test]
    fn automatic_rebalancing_returns_leadership_to_the_preferred_replica_at_its_interval() {
        let mut h = Harness::rebalancing(Some(5000));
        let epochs: BTreeMap<i32, i64> = (1..=3).map(|b| (b, h.register(b, 0))).collect();
        create(&mut h, "r", 3, 3);
        let preferred = fence_preferred(&mut h, &epochs);
        rejoin(&mut h, &epochs, preferred);
        // The clock started at the first tick (1000 ms): passes at 6000,
        // 11 000, 16 000; the preferred replica rejoined at 11 500.
        run_sessions(&mut h, &epochs, &[], 12_000, 15_000);
        assert_ne!(partition(&h, "r", 0).leader, preferred, "not before the interval");
        run_sessions(&mut h, &epochs, &[], 16_000, 16_000);
        assert_eq!(partition(&h, "r", 0).leader, preferred);
        for p in 0..3 {
            let reg = partition(&h, "r", p);
            assert_eq!(reg.leader, reg.replicas[0], "{reg:?}");
        }
    }

    #[test]
    fn unclean_elections_take_a_replica_outside_the_isr_only_when_asked() {
        let mut h = Harness::new();
        let epochs: BTreeMap<i32, i64> = (1..=2).map(|b| (b, h.register(b, 0))).collect();
        for (name, replicas) in [("u", vec![1, 2]), ("v", vec![1])] {
            let create = Request::CreateTopic {
                name: name.into(),
                partitions: -1,
                replication_factor: -1,
                configs: BTreeMap::new(),
                assignment: Some(vec![replicas]),
            };
            assert!(matches!(h.call(create, 0), Reply::TopicCreated { .. }));
        }
        let request = alter(&h, 1, "u", 0, vec![1]);
        assert!(matches!(h.call(request, 0), Reply::PartitionAltered { .. }));
        let named: &[(&str, i32)] = &[("u", 0)];
        let r = h.call(elect(ElectionType::Unclean, Some(named)), 0);
        assert_eq!(r, Reply::LeadersElected(vec![result("u", 0, Err(ElectionError::ElectionNotNeeded))]));
        // Broker 1, the whole ISR, is fenced: the partition has no leader.
        run_sessions(&mut h, &epochs, &[1], 1000, 10_000);
        let reg = partition(&h, "u", 0);
        assert_eq!((reg.leader, reg.isr.clone(), reg.elr.clone()), (NO_LEADER, vec![], vec![1]));
        let r = h.call(elect(ElectionType::Preferred, Some(named)), 10_000);
        let not_available = ElectionError::PreferredLeaderNotAvailable { preferred: 1, isr: vec![] };
        assert_eq!(r, Reply::LeadersElected(vec![result("u", 0, Err(not_available))]));
        let r = h.call(elect(ElectionType::Unclean, None), 10_000);
        let none_active = ElectionError::EligibleLeadersNotAvailable { replicas: vec![1] };
        assert_eq!(r, Reply::LeadersElected(vec![result("u", 0, Ok(())), result("v", 0, Err(none_active))]));
        let reg = partition(&h, "u", 0);
        assert_eq!((reg.leader, reg.isr, reg.leader_epoch), (2, vec![2], 2));
        assert!(reg.elr.is_empty(), "an unclean election clears the ELR");
        // KIP-704: the unclean leader starts recovering, alone in the ISR.
        assert_eq!(reg.leader_recovery_state, LeaderRecoveryState::Recovering);
        heartbeat(&mut h, 1, epochs[&1], 11_000, false);
        let with_state = |h: &Harness, isr: Vec<i32>, state| {
            let mut r = alter(h, 2, "u", 0, isr);
            if let Request::AlterPartition { leader_recovery_state, .. } = &mut r {
                *leader_recovery_state = state;
            }
            r
        };
        let r = h.call(with_state(&h, vec![2, 1], LeaderRecoveryState::Recovering), 11_000);
        assert!(
            matches!(&r, Reply::Error(ControllerError::InvalidIsr { why, .. }) if why.contains("still recovering")),
            "{r:?}"
        );
        // Its first ISR change says it recovered, and the ISR grows.
        let r = h.call(with_state(&h, vec![2, 1], LeaderRecoveryState::Recovered), 11_000);
        assert!(matches!(r, Reply::PartitionAltered { .. }), "{r:?}");
        let reg = partition(&h, "u", 0);
        assert_eq!((reg.isr.as_slice(), reg.leader_recovery_state), (&[2, 1][..], LeaderRecoveryState::Recovered));
        // Recovered is final.
        let r = h.call(with_state(&h, vec![2], LeaderRecoveryState::Recovering), 11_000);
        assert!(
            matches!(&r, Reply::Error(ControllerError::InvalidIsr { why, .. }) if why.contains("already recovered")),
            "{r:?}"
        );
        assert_eq!(partition(&h, "u", 0).isr, vec![2, 1]);
    }

    #[test]
    fn unclean_leader_election_enable_elects_outside_the_isr_by_itself() {
        let mut h = Harness::new();
        let epochs: BTreeMap<i32, i64> = (1..=2).map(|b| (b, h.register(b, 0))).collect();
        for (name, unclean) in [("w", true), ("u", false)] {
            let configs = if unclean {
                BTreeMap::from([("unclean.leader.election.enable".to_string(), "true".to_string())])
            } else {
                BTreeMap::new()
            };
            let create = Request::CreateTopic {
                name: name.into(),
                partitions: -1,
                replication_factor: -1,
                configs,
                assignment: Some(vec![vec![1, 2]]),
            };
            assert!(matches!(h.call(create, 0), Reply::TopicCreated { .. }));
            let request = alter(&h, 1, name, 0, vec![1]);
            assert!(matches!(h.call(request, 0), Reply::PartitionAltered { .. }));
        }
        // Broker 1, the whole ISR of both, is fenced: "w" goes to broker 2
        // in the same batch; "u" waits offline for broker 1.
        run_sessions(&mut h, &epochs, &[1], 1000, 10_000);
        let w = partition(&h, "w", 0);
        assert_eq!((w.leader, w.isr), (2, vec![2]));
        let u = partition(&h, "u", 0);
        assert_eq!((u.leader, u.isr, u.elr), (NO_LEADER, vec![], vec![1]));
        // The cluster-wide dynamic default turns it on for "u" too, at the next repair.
        let on = Request::AlterConfigs {
            resource: ConfigResource::BrokerDefault,
            changes: vec![("unclean.leader.election.enable".into(), Some("true".into()))],
        };
        assert_eq!(h.call(on, 10_000), Reply::ConfigsAltered);
        run_sessions(&mut h, &epochs, &[1], 11_000, 12_000);
        let u = partition(&h, "u", 0);
        assert_eq!((u.leader, u.isr), (2, vec![2]));
    }

    /// KIP-966: a change of min.insync.replicas clears the ELR and the
    /// last known ELR of the partitions it applies to, and only those.
    #[test]
    fn changing_min_insync_replicas_clears_the_eligible_replicas_it_judged() {
        let mut h = Harness::new();
        let epochs: BTreeMap<i32, i64> = (1..=3).map(|b| (b, h.register(b, 0))).collect();
        for (name, own) in [("own", true), ("default", false)] {
            let configs = if own {
                BTreeMap::from([("min.insync.replicas".to_string(), "2".to_string())])
            } else {
                BTreeMap::new()
            };
            let create = Request::CreateTopic {
                name: name.into(),
                partitions: -1,
                replication_factor: -1,
                configs,
                assignment: Some(vec![vec![1, 2, 3]]),
            };
            assert!(matches!(h.call(create, 0), Reply::TopicCreated { .. }));
        }
        let defaults = Request::AlterConfigs {
            resource: ConfigResource::BrokerDefault,
            changes: vec![("min.insync.replicas".into(), Some("2".into()))],
        };
        assert_eq!(h.call(defaults, 0), Reply::ConfigsAltered);
        // Brokers 3 then 2 are fenced: 2 leaves the ISR below min ISR 2 and joins the ELR.
        run_sessions(&mut h, &epochs, &[3], 1000, 10_000);
        run_sessions(&mut h, &epochs, &[3, 2], 11_000, 20_000);
        for name in ["own", "default"] {
            let reg = partition(&h, name, 0);
            assert_eq!((reg.isr.clone(), reg.elr.clone()), (vec![1], vec![2]), "{name}: {reg:?}");
        }
        // The topic's own minimum changes: its ELR goes, the other's stays.
        let own = Request::AlterConfigs {
            resource: ConfigResource::Topic("own".into()),
            changes: vec![("min.insync.replicas".into(), Some("1".into()))],
        };
        assert_eq!(h.call(own, 20_000), Reply::ConfigsAltered);
        let (o, d) = (partition(&h, "own", 0), partition(&h, "default", 0));
        assert!(o.elr.is_empty() && o.last_known_elr.is_empty(), "{o:?}");
        assert_eq!(d.elr, vec![2], "{d:?}");
        // The cluster default changes: the topic without its own loses its ELR.
        let defaults = Request::AlterConfigs {
            resource: ConfigResource::BrokerDefault,
            changes: vec![("min.insync.replicas".into(), Some("3".into()))],
        };
        assert_eq!(h.call(defaults, 20_000), Reply::ConfigsAltered);
        let d = partition(&h, "default", 0);
        assert!(d.elr.is_empty() && d.last_known_elr.is_empty(), "{d:?}");
        // Another key leaves the ELR alone.
        run_sessions(&mut h, &epochs, &[3, 2, 1], 21_000, 30_000);
        let before = partition(&h, "default", 0);
        assert!(!before.elr.is_empty() || !before.last_known_elr.is_empty(), "{before:?}");
        let other = Request::AlterConfigs {
            resource: ConfigResource::BrokerDefault,
            changes: vec![("retention.ms".into(), Some("1000".into()))],
        };
        assert_eq!(h.call(other, 30_000), Reply::ConfigsAltered);
        assert_eq!(partition(&h, "default", 0), before);
    }

    #[test]
    fn a_reassignment_completes_with_the_alter_partition_that_brings_the_new_replica_in() {
        let mut h = Harness::new();
        for b in 1..=4 {
            h.register(b, 0);
        }
        let manual = Request::CreateTopic {
            name: "m".into(),
            partitions: -1,
            replication_factor: -1,
            configs: BTreeMap::new(),
            assignment: Some(vec![vec![1, 2, 3]]),
        };
        assert!(matches!(h.call(manual, 0), Reply::TopicCreated { .. }));
        let move_leader = Request::AlterReassignments {
            partitions: vec![("m".into(), 0, Some(vec![4, 2, 3])), ("nope".into(), 0, Some(vec![1]))],
            allow_factor_change: false,
        };
        let r = h.call(move_leader, 0);
        let Reply::Reassigned(results) = r else { panic!("{r:?}") };
        assert_eq!(results[0].outcome, Ok(()));
        assert_eq!(results[1].outcome, Err(ReassignmentError::UnknownTopicOrPartition("nope".into(), 0)));
        let reg = partition(&h, "m", 0);
        assert_eq!((reg.replicas.as_slice(), reg.adding_replicas.as_slice()), (&[4, 2, 3, 1][..], &[4][..]));
        // Broker 4 is a replica now, so the leader may add it; that completes the move.
        let r = h.call(alter(&h, 1, "m", 0, vec![1, 2, 3, 4]), 0);
        assert!(matches!(r, Reply::PartitionAltered { leader: 4, leader_epoch: 1, .. }), "{r:?}");
        let reg = partition(&h, "m", 0);
        assert_eq!((reg.replicas.as_slice(), reg.isr.as_slice(), reg.leader), (&[4, 2, 3][..], &[4, 2, 3][..], 4));
        assert!(!reg.is_reassigning());
        // A replica outside the target may not join any more.
        let r = h.call(alter(&h, 4, "m", 0, vec![4, 2, 3, 1]), 0);
        assert!(matches!(r, Reply::Error(ControllerError::InvalidIsr { .. })), "{r:?}");
    }

    #[test]
    fn producer_id_blocks_never_overlap_even_when_proposals_race() {
        let mut h = Harness::new();
        h.register(1, 0);
        let a = h.call(Request::AllocateProducerIds { broker_id: 1 }, 0);
        let b = h.call(Request::AllocateProducerIds { broker_id: 1 }, 0);
        assert_eq!(a, Reply::ProducerIds { start: 0, size: PRODUCER_ID_BLOCK });
        assert_eq!(b, Reply::ProducerIds { start: PRODUCER_ID_BLOCK, size: PRODUCER_ID_BLOCK });
        // Two proposals made against the same image: the second to commit is refused.
        let first =
            h.core.step(Input::Request { id: 90, request: Request::AllocateProducerIds { broker_id: 1 }, now_ms: 0 });
        let second =
            h.core.step(Input::Request { id: 91, request: Request::AllocateProducerIds { broker_id: 2 }, now_ms: 0 });
        let (Effect::Propose(x), Effect::Propose(y)) = (&first[0], &second[0]) else { panic!() };
        let rx = h.core.step(Input::Committed { offset: 100, batch: x.clone() });
        let ry = h.core.step(Input::Committed { offset: 101, batch: y.clone() });
        assert!(matches!(&rx[0], Effect::Reply { reply: Reply::ProducerIds { .. }, .. }));
        assert_eq!(ry, vec![Effect::Reply { id: 91, reply: Reply::Error(ControllerError::Conflict) }]);
        // A batch committed twice (a retried proposal) changes nothing the second time.
        let before = h.core.image().clone();
        assert!(h.core.step(Input::Committed { offset: 102, batch: x.clone() }).is_empty());
        assert_eq!(h.core.image().next_producer_id, before.next_producer_id);
    }
}
