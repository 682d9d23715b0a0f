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

use crate::metadata::image::{Applied, ClusterImage, NO_LEADER};
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
    /// DescribeQuorum: answered by the driver, which holds the raft state;
    /// it never reaches the core's decisions.
    DescribeQuorum,
}

/// A reply, sent once the request's records are committed and applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Registered { epoch: i64 },
    Heartbeat { fenced: bool, shutdown_done: bool },
    TopicCreated { id: Uuid },
    TopicDeleted,
    PartitionsCreated,
    ConfigsAltered,
    ProducerIds { start: i64, size: i64 },
    Quorum(super::describe::QuorumDescription),
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
    #[error("{0} is answered by the controller's driver, not its core")]
    NotForCore(String),
}

pub type RequestId = u64;

/// A new partition's (replicas, ISR); the ISR's first is its leader.
type Placed = (Vec<i32>, Vec<i32>);

#[derive(Debug, Clone)]
pub enum Input {
    Request { id: RequestId, request: Request, now_ms: u64 },
    Tick { now_ms: u64 },
    Committed { offset: u64, batch: RecordBatch },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Propose(RecordBatch),
    Reply { id: RequestId, reply: Reply },
}

pub const PRODUCER_ID_BLOCK: i64 = 1000;

#[derive(Debug, Clone)]
pub struct CoreSettings {
    pub session_timeout_ms: u64,
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
    /// The controller's own fencing of an expired session.
    Fence { broker_id: i32 },
}

pub struct ControllerCore {
    settings: CoreSettings,
    /// The committed image (every committed entry, in order).
    image: ClusterImage,
    /// Last heartbeat per broker id (active controller only).
    last_heartbeat_ms: HashMap<i32, u64>,
    /// Brokers that registered or heartbeated to this active controller.
    /// New partitions go to these: a new controller gives every broker a
    /// fresh session, so a broker that died just before the failover still
    /// counts as unfenced until that session runs out.
    heard_from: std::collections::HashSet<i32>,
    /// Proposals not yet committed, by proposal id.
    pending: BTreeMap<Uuid, Pending>,
    rng: fastrand::Rng,
}

impl ControllerCore {
    pub fn new(settings: CoreSettings, image: ClusterImage) -> ControllerCore {
        let rng = fastrand::Rng::with_seed(settings.seed);
        ControllerCore {
            settings,
            image,
            last_heartbeat_ms: HashMap::new(),
            heard_from: Default::default(),
            pending: BTreeMap::new(),
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
            Input::Tick { now_ms } => self.fence_expired(now_ms),
            Input::Request { id, request, now_ms } => self.request(id, request, now_ms),
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
            Request::Register { broker_id, incarnation_id, endpoints, rack } => {
                if let Some(b) = self.image.brokers.get(broker_id).filter(|b| b.incarnation_id == *incarnation_id) {
                    return Self::reply(id, Reply::Registered { epoch: b.epoch });
                }
                self.last_heartbeat_ms.insert(*broker_id, now_ms);
                self.heard_from.insert(*broker_id);
                let mut records = vec![MetadataRecord::RegisterBroker {
                    broker_id: *broker_id,
                    incarnation_id: *incarnation_id,
                    endpoints: endpoints.clone(),
                    rack: rack.clone(),
                }];
                // A restarted broker's old incarnation leads nothing from now on.
                if let Some(old) = self.image.brokers.get(broker_id) {
                    records.extend(self.leadership_moves_away(old.id));
                }
                self.propose(id, request, records)
            }
            Request::Heartbeat { broker_id, epoch, applied_offset, want_shutdown } => {
                let Some(b) = self.image.brokers.get(broker_id).filter(|b| b.epoch == *epoch) else {
                    return Self::reply(id, Reply::Error(ControllerError::StaleBrokerEpoch(*broker_id)));
                };
                self.last_heartbeat_ms.insert(*broker_id, now_ms);
                self.heard_from.insert(*broker_id);
                let mut records = Vec::new();
                if *want_shutdown {
                    if !b.in_controlled_shutdown {
                        records.push(MetadataRecord::BeginControlledShutdown { broker_id: *broker_id, epoch: *epoch });
                    }
                    records.extend(self.leadership_moves_away(*broker_id));
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
                let records = changes
                    .iter()
                    .map(|(name, value)| MetadataRecord::Config {
                        resource: resource.clone(),
                        name: name.clone(),
                        value: value.clone(),
                    })
                    .collect();
                self.propose(id, request, records)
            }
            Request::DescribeQuorum => {
                Self::reply(id, Reply::Error(ControllerError::NotForCore("DescribeQuorum".into())))
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

    /// Partitions `broker` leads lose their leader (RF 1: no other replica
    /// can take over; replication adds the election of another ISR member).
    fn leadership_moves_away(&self, broker: i32) -> Vec<MetadataRecord> {
        let mut out = Vec::new();
        for t in self.image.topics.values() {
            for (p, reg) in &t.partitions {
                if reg.leader == broker {
                    out.push(MetadataRecord::PartitionChange {
                        topic_id: t.id,
                        partition: *p,
                        expected_partition_epoch: reg.partition_epoch,
                        leader: Some(NO_LEADER),
                        isr: None,
                    });
                }
            }
        }
        out
    }

    /// Offline partitions whose first ISR member is `broker` get it back as leader.
    fn leadership_returns(&self, broker: i32) -> Vec<MetadataRecord> {
        let mut out = Vec::new();
        for t in self.image.topics.values() {
            for (p, reg) in &t.partitions {
                if reg.leader == NO_LEADER && reg.isr.first() == Some(&broker) {
                    out.push(MetadataRecord::PartitionChange {
                        topic_id: t.id,
                        partition: *p,
                        expected_partition_epoch: reg.partition_epoch,
                        leader: Some(broker),
                        isr: None,
                    });
                }
            }
        }
        out
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

    /// Brokers whose session expired are fenced, their partitions made
    /// offline in the same batch.
    fn fence_expired(&mut self, now_ms: u64) -> Vec<Effect> {
        let mut effects = Vec::new();
        let expired: Vec<(i32, i64)> = self
            .image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .filter(|b| {
                let last = *self.last_heartbeat_ms.entry(b.id).or_insert(now_ms);
                now_ms.saturating_sub(last) > self.settings.session_timeout_ms
            })
            .map(|b| (b.id, b.epoch))
            .collect();
        for (broker_id, epoch) in expired {
            // Don't propose the same fencing again while one is in flight.
            let in_flight =
                self.pending.values().any(|p| matches!(p, Pending::Fence { broker_id: b } if *b == broker_id));
            if in_flight {
                continue;
            }
            let mut records = vec![MetadataRecord::FenceBroker { broker_id, epoch }];
            records.extend(self.leadership_moves_away(broker_id));
            let batch = RecordBatch { proposal: self.new_id(), records };
            self.pending.insert(batch.proposal, Pending::Fence { broker_id });
            effects.push(Effect::Propose(batch));
        }
        effects
    }

    fn committed(&mut self, offset: u64, batch: RecordBatch) -> Vec<Effect> {
        let outcomes = self.image.apply(offset, &batch);
        let Some(Pending::Request { id, request }) = self.pending.remove(&batch.proposal) else { return Vec::new() };
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
            let core = ControllerCore::new(CoreSettings { session_timeout_ms: 9000, seed: 7 }, ClusterImage::default());
            Harness { core, offset: 0, replies: Vec::new(), next_id: 0 }
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
            let r = Request::Register {
                broker_id,
                incarnation_id: Uuid::new_v4(),
                endpoints: vec![Endpoint { name: "PLAINTEXT".into(), host: "h".into(), port: 1 }],
                rack: None,
            };
            let Reply::Registered { epoch } = self.call(r, now_ms) else { panic!("not registered") };
            let hb = Request::Heartbeat { broker_id, epoch, applied_offset: self.offset, want_shutdown: false };
            assert_eq!(self.call(hb, now_ms), Reply::Heartbeat { fenced: false, shutdown_done: false });
            epoch
        }
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
        h.core = ControllerCore::new(CoreSettings { session_timeout_ms: 9000, seed: 7 }, h.core.image().clone());
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
