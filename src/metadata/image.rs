//! The cluster metadata image: the state the metadata log's records build.
//!
//! Its version is the offset (raft index) of the last entry applied, so two
//! nodes at the same offset hold the same image, and a broker can say "I have
//! applied at least offset N" (admin requests wait for that before they
//! answer). Applying is deterministic and never fails: a record whose
//! expectation no longer holds is ignored, with the reason returned, the same
//! way on every node.
//!
//! The image is also what a snapshot holds ([`ClusterImage::encode`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::records::{ConfigResource, Endpoint, MetadataRecord, RecordBatch};

/// No leader: the partition is offline.
pub const NO_LEADER: i32 = -1;

/// Whether a partition's leader came from an unclean election and has not
/// yet said it recovered (Kafka's KIP-704). An unclean leader starts
/// RECOVERING, alone in the ISR; its first ISR change says RECOVERED, and
/// until then the ISR cannot grow, so no follower is counted in sync with
/// a log that may still be missing what the old ISR held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaderRecoveryState {
    #[default]
    Recovered,
    Recovering,
}

impl LeaderRecoveryState {
    pub fn is_recovered(&self) -> bool {
        *self == LeaderRecoveryState::Recovered
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    pub id: i32,
    pub incarnation_id: Uuid,
    /// The offset of the registration record.
    pub epoch: i64,
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
    /// Registered brokers start fenced and are unfenced once caught up.
    pub fenced: bool,
    pub in_controlled_shutdown: bool,
}

impl BrokerRegistration {
    /// May lead partitions: unfenced and not shutting down.
    pub fn is_active(&self) -> bool {
        !self.fenced && !self.in_controlled_shutdown
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRegistration {
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub leader: i32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    /// Replicas an ongoing reassignment is adding (listed in `replicas`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adding_replicas: Vec<i32>,
    /// Replicas an ongoing reassignment is removing (listed in `replicas`,
    /// after the target's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removing_replicas: Vec<i32>,
    /// Eligible leader replicas (KIP-966): replicas out of the ISR that
    /// still hold everything committed, because they left it while the ISR
    /// was below `min.insync.replicas` (the high watermark stood still from
    /// then on). When the ISR is empty, one of them may lead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elr: Vec<i32>,
    /// The last leader of a partition left with neither ISR nor ELR: the
    /// replica elected (as an unclean election) if nothing better returns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_known_elr: Vec<i32>,
    /// RECOVERING after an unclean election until the leader's first ISR
    /// change (KIP-704).
    #[serde(default, skip_serializing_if = "LeaderRecoveryState::is_recovered")]
    pub leader_recovery_state: LeaderRecoveryState,
}

impl PartitionRegistration {
    /// A new partition's registration: these replicas, ISR and leader, at
    /// epoch 0, no reassignment or eligible replicas.
    pub fn new(replicas: &[i32], isr: &[i32], leader: i32) -> PartitionRegistration {
        PartitionRegistration {
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            leader,
            leader_epoch: 0,
            partition_epoch: 0,
            adding_replicas: vec![],
            removing_replicas: vec![],
            elr: vec![],
            last_known_elr: vec![],
            leader_recovery_state: LeaderRecoveryState::Recovered,
        }
    }

    /// Whether a reassignment is under way.
    pub fn is_reassigning(&self) -> bool {
        !self.adding_replicas.is_empty() || !self.removing_replicas.is_empty()
    }

    /// The replicas the partition will have once its reassignment is done
    /// (all of them when none is under way), in order.
    pub fn target_replicas(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|r| !self.removing_replicas.contains(r)).collect()
    }

    /// The replicas it had before its reassignment began, in order.
    pub fn original_replicas(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|r| !self.adding_replicas.contains(r)).collect()
    }

    /// What every partition in an image holds: distinct replicas, an ISR
    /// of distinct replicas, empty only while there is no leader (with ELR
    /// the last member leaves too, into the ELR), a leader in the ISR or
    /// none, and eligible leader replicas that are replicas outside the ISR.
    pub fn check(&self) -> Result<(), &'static str> {
        if has_duplicates(&self.replicas) {
            return Err("a replica is listed twice");
        }
        if self.isr.is_empty() && self.leader != NO_LEADER {
            return Err("the ISR is empty under a leader");
        }
        if has_duplicates(&self.elr) || !self.elr.iter().all(|r| self.replicas.contains(r)) {
            return Err("an eligible leader replica is listed twice or is not a replica");
        }
        if self.elr.iter().any(|r| self.isr.contains(r)) {
            return Err("an eligible leader replica is in the ISR");
        }
        if has_duplicates(&self.last_known_elr) {
            return Err("a last known eligible leader replica is listed twice");
        }
        if has_duplicates(&self.isr) {
            return Err("an ISR member is listed twice");
        }
        if !self.leader_recovery_state.is_recovered() && self.isr.len() > 1 {
            return Err("the ISR grew while the leader was still recovering");
        }
        if !self.isr.iter().all(|r| self.replicas.contains(r)) {
            return Err("an ISR member is not a replica");
        }
        if self.leader != NO_LEADER && !self.isr.contains(&self.leader) {
            return Err("the leader is not in the ISR");
        }
        let listed = |v: &[i32]| !has_duplicates(v) && v.iter().all(|r| self.replicas.contains(r));
        if !listed(&self.adding_replicas) || !listed(&self.removing_replicas) {
            return Err("a replica being added or removed is not a replica");
        }
        if self.adding_replicas.iter().any(|r| self.removing_replicas.contains(r)) {
            return Err("a replica is being both added and removed");
        }
        if self.removing_replicas.len() >= self.replicas.len() {
            return Err("a reassignment removes every replica");
        }
        Ok(())
    }
}

fn has_duplicates(ids: &[i32]) -> bool {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).any(|w| w[0] == w[1])
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicImage {
    pub name: String,
    pub id: Uuid,
    pub partitions: BTreeMap<i32, PartitionRegistration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterImage {
    /// Offset of the last entry applied (0: nothing yet).
    pub offset: u64,
    pub cluster_id: Option<String>,
    pub brokers: BTreeMap<i32, BrokerRegistration>,
    pub topic_ids: BTreeMap<String, Uuid>,
    pub topics: BTreeMap<Uuid, TopicImage>,
    pub topic_configs: BTreeMap<String, BTreeMap<String, String>>,
    pub broker_configs: BTreeMap<i32, BTreeMap<String, String>>,
    pub broker_default_configs: BTreeMap<String, String>,
    /// The first producer id not yet handed to any broker.
    pub next_producer_id: i64,
    pub features: BTreeMap<String, i16>,
}

/// What applying one record did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Changed,
    /// Nothing changed (a retried record, or its expectation failed).
    Ignored(&'static str),
}

impl ClusterImage {
    pub fn topic(&self, name: &str) -> Option<&TopicImage> {
        self.topic_ids.get(name).and_then(|id| self.topics.get(id))
    }

    pub fn partition(&self, name: &str, partition: i32) -> Option<&PartitionRegistration> {
        self.topic(name).and_then(|t| t.partitions.get(&partition))
    }

    /// Brokers that may be given replicas and leadership.
    pub fn active_brokers(&self) -> impl Iterator<Item = &BrokerRegistration> {
        self.brokers.values().filter(|b| b.is_active())
    }

    /// Applies one committed entry's records at `offset`.
    pub fn apply(&mut self, offset: u64, batch: &RecordBatch) -> Vec<Applied> {
        debug_assert!(offset > self.offset, "entry {offset} applied at image {}", self.offset);
        let out = batch.records.iter().map(|r| self.apply_record(offset, r)).collect();
        self.offset = offset;
        self.check_invariants();
        out
    }

    /// An entry with no records (the leader's no-op at the start of a term).
    pub fn advance_to(&mut self, offset: u64) {
        self.offset = self.offset.max(offset);
    }

    fn apply_record(&mut self, offset: u64, record: &MetadataRecord) -> Applied {
        use Applied::*;
        match record {
            MetadataRecord::ClusterId { cluster_id } => match &self.cluster_id {
                Some(_) => Ignored("the cluster id is already set"),
                None => {
                    self.cluster_id = Some(cluster_id.clone());
                    Changed
                }
            },
            MetadataRecord::RegisterBroker { broker_id, incarnation_id, endpoints, rack } => {
                if self.brokers.get(broker_id).is_some_and(|b| b.incarnation_id == *incarnation_id) {
                    return Ignored("this incarnation is already registered");
                }
                self.brokers.insert(
                    *broker_id,
                    BrokerRegistration {
                        id: *broker_id,
                        incarnation_id: *incarnation_id,
                        epoch: offset as i64,
                        endpoints: endpoints.clone(),
                        rack: rack.clone(),
                        fenced: true,
                        in_controlled_shutdown: false,
                    },
                );
                Changed
            }
            MetadataRecord::FenceBroker { broker_id, epoch } => match self.broker_at(*broker_id, *epoch) {
                Some(b) if !b.fenced => {
                    b.fenced = true;
                    b.in_controlled_shutdown = false;
                    Changed
                }
                Some(_) => Ignored("already fenced"),
                None => Ignored("no broker with that epoch"),
            },
            MetadataRecord::UnfenceBroker { broker_id, epoch } => match self.broker_at(*broker_id, *epoch) {
                Some(b) if b.fenced => {
                    b.fenced = false;
                    Changed
                }
                Some(_) => Ignored("already unfenced"),
                None => Ignored("no broker with that epoch"),
            },
            MetadataRecord::BeginControlledShutdown { broker_id, epoch } => match self.broker_at(*broker_id, *epoch) {
                Some(b) if !b.in_controlled_shutdown => {
                    b.in_controlled_shutdown = true;
                    Changed
                }
                Some(_) => Ignored("already shutting down"),
                None => Ignored("no broker with that epoch"),
            },
            MetadataRecord::Topic { name, id } => match self.topic_ids.get(name) {
                Some(existing) if existing == id => Ignored("topic exists"),
                Some(_) => Ignored("another topic holds this name"),
                None if self.topics.contains_key(id) => Ignored("topic id in use"),
                None => {
                    self.topic_ids.insert(name.clone(), *id);
                    self.topics.insert(*id, TopicImage { name: name.clone(), id: *id, partitions: BTreeMap::new() });
                    Changed
                }
            },
            MetadataRecord::Partition { topic_id, partition, replicas, isr, leader, leader_epoch } => {
                let Some(topic) = self.topics.get_mut(topic_id) else { return Ignored("no such topic") };
                if topic.partitions.contains_key(partition) {
                    return Ignored("partition exists");
                }
                if isr.is_empty() {
                    return Ignored("the ISR is empty");
                }
                let new = PartitionRegistration {
                    replicas: replicas.clone(),
                    isr: isr.clone(),
                    leader: *leader,
                    leader_epoch: *leader_epoch,
                    partition_epoch: 0,
                    adding_replicas: Vec::new(),
                    removing_replicas: Vec::new(),
                    elr: Vec::new(),
                    last_known_elr: Vec::new(),
                    leader_recovery_state: LeaderRecoveryState::Recovered,
                };
                if let Err(why) = new.check() {
                    return Ignored(why);
                }
                topic.partitions.insert(*partition, new);
                Changed
            }
            MetadataRecord::PartitionChange {
                topic_id,
                partition,
                expected_partition_epoch,
                leader,
                isr,
                assignment,
                elr,
                last_known_elr,
                leader_recovery_state,
            } => {
                let Some(p) = self.topics.get_mut(topic_id).and_then(|t| t.partitions.get_mut(partition)) else {
                    return Ignored("no such partition");
                };
                if p.partition_epoch != *expected_partition_epoch {
                    return Ignored("partition epoch moved on");
                }
                let mut new = p.clone();
                if let Some(a) = assignment {
                    new.replicas = a.replicas.clone();
                    new.adding_replicas = a.adding.clone();
                    new.removing_replicas = a.removing.clone();
                }
                if let Some(isr) = isr {
                    new.isr = isr.clone();
                }
                if let Some(elr) = elr {
                    new.elr = elr.clone();
                }
                if let Some(lke) = last_known_elr {
                    new.last_known_elr = lke.clone();
                }
                if let Some(state) = leader_recovery_state {
                    new.leader_recovery_state = *state;
                }
                if let Some(leader) = leader {
                    if *leader != new.leader {
                        new.leader = *leader;
                        new.leader_epoch += 1;
                    }
                }
                new.partition_epoch += 1;
                if let Err(why) = new.check() {
                    return Ignored(why);
                }
                *p = new;
                Changed
            }
            MetadataRecord::RemoveTopic { id } => match self.topics.remove(id) {
                Some(t) => {
                    self.topic_ids.remove(&t.name);
                    self.topic_configs.remove(&t.name);
                    Changed
                }
                None => Ignored("no such topic"),
            },
            MetadataRecord::Config { resource, name, value } => {
                let map = match resource {
                    ConfigResource::Topic(t) => self.topic_configs.entry(t.clone()).or_default(),
                    ConfigResource::Broker(b) => self.broker_configs.entry(*b).or_default(),
                    ConfigResource::BrokerDefault => &mut self.broker_default_configs,
                };
                let changed = match value {
                    Some(v) => map.insert(name.clone(), v.clone()).as_ref() != Some(v),
                    None => map.remove(name).is_some(),
                };
                if changed {
                    Changed
                } else {
                    Ignored("config already so")
                }
            }
            MetadataRecord::ProducerIds { start, size, .. } => {
                if *start != self.next_producer_id || *size <= 0 {
                    return Ignored("block is not the next free one");
                }
                self.next_producer_id = start + size;
                Changed
            }
            MetadataRecord::FeatureLevel { name, level } => {
                if self.features.insert(name.clone(), *level) == Some(*level) {
                    Ignored("feature already at that level")
                } else {
                    Changed
                }
            }
        }
    }

    fn broker_at(&mut self, id: i32, epoch: i64) -> Option<&mut BrokerRegistration> {
        self.brokers.get_mut(&id).filter(|b| b.epoch == epoch)
    }

    /// Topics are indexed by name, and every partition holds
    /// [`PartitionRegistration::check`]. Apply ignores records that would
    /// break these, so a failure here is a bug in apply, not bad input.
    fn check_invariants(&self) {
        if cfg!(debug_assertions) {
            for t in self.topics.values() {
                assert_eq!(self.topic_ids.get(&t.name), Some(&t.id), "topic {} indexed by name", t.name);
                for (i, p) in &t.partitions {
                    if let Err(why) = p.check() {
                        panic!("{}-{i}: {why}: {p:?}", t.name);
                    }
                }
            }
        }
    }

    /// The image as a snapshot's data.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("the image serialises")
    }

    pub fn decode(bytes: &[u8]) -> Result<ClusterImage, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("metadata snapshot does not decode: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(records: Vec<MetadataRecord>) -> RecordBatch {
        RecordBatch { proposal: Uuid::new_v4(), records }
    }

    fn register(id: i32) -> MetadataRecord {
        MetadataRecord::RegisterBroker {
            broker_id: id,
            incarnation_id: Uuid::from_u128(id as u128),
            endpoints: vec![Endpoint { name: "PLAINTEXT".into(), host: "127.0.0.1".into(), port: 9000 + id as u16 }],
            rack: None,
        }
    }

    #[test]
    fn every_record_applied_twice_changes_nothing_the_second_time() {
        let topic = Uuid::from_u128(77);
        let records = vec![
            MetadataRecord::ClusterId { cluster_id: "c".into() },
            register(1),
            MetadataRecord::Topic { name: "t".into(), id: topic },
            MetadataRecord::Partition {
                topic_id: topic,
                partition: 0,
                replicas: vec![1],
                isr: vec![1],
                leader: 1,
                leader_epoch: 0,
            },
            MetadataRecord::PartitionChange {
                topic_id: topic,
                partition: 0,
                expected_partition_epoch: 0,
                leader: Some(NO_LEADER),
                isr: None,
                assignment: None,
                elr: None,
                last_known_elr: None,
                leader_recovery_state: None,
            },
            MetadataRecord::Config {
                resource: ConfigResource::Topic("t".into()),
                name: "retention.ms".into(),
                value: Some("5".into()),
            },
            MetadataRecord::ProducerIds { broker_id: 1, start: 0, size: 1000 },
            MetadataRecord::FeatureLevel { name: "metadata.version".into(), level: 27 },
        ];
        let mut image = ClusterImage::default();
        let mut offset = 0;
        for r in &records {
            offset += 1;
            assert_eq!(image.apply(offset, &batch(vec![r.clone()])), vec![Applied::Changed], "{r:?}");
            let before = image.clone();
            offset += 1;
            let again = image.apply(offset, &batch(vec![r.clone()]));
            assert!(matches!(again[0], Applied::Ignored(_)), "{r:?} applied twice: {again:?}");
            assert_eq!(ClusterImage { offset: before.offset, ..image.clone() }, before, "{r:?}");
        }
        let p = image.partition("t", 0).unwrap();
        assert_eq!((p.leader, p.leader_epoch, p.partition_epoch), (NO_LEADER, 1, 1));
        assert_eq!(image.next_producer_id, 1000);
        assert_eq!(image.brokers[&1].epoch, 3, "the broker epoch is the registration's offset");
    }

    #[test]
    fn fencing_names_the_epoch_and_a_reregistration_gets_a_new_one() {
        let mut image = ClusterImage::default();
        image.apply(1, &batch(vec![register(1)]));
        assert!(image.brokers[&1].fenced, "registered brokers start fenced");
        image.apply(2, &batch(vec![MetadataRecord::UnfenceBroker { broker_id: 1, epoch: 1 }]));
        assert!(image.brokers[&1].is_active());
        // A restart: new incarnation, new epoch; fencing the old epoch does nothing.
        let mut again = register(1);
        if let MetadataRecord::RegisterBroker { incarnation_id, .. } = &mut again {
            *incarnation_id = Uuid::from_u128(99);
        }
        image.apply(3, &batch(vec![again]));
        assert_eq!(image.brokers[&1].epoch, 3);
        let out = image.apply(4, &batch(vec![MetadataRecord::FenceBroker { broker_id: 1, epoch: 1 }]));
        assert_eq!(out, vec![Applied::Ignored("no broker with that epoch")]);
    }

    #[test]
    fn a_name_held_by_another_topic_id_is_not_taken_and_removal_frees_it() {
        let mut image = ClusterImage::default();
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        image.apply(1, &batch(vec![MetadataRecord::Topic { name: "t".into(), id: a }]));
        let out = image.apply(2, &batch(vec![MetadataRecord::Topic { name: "t".into(), id: b }]));
        assert_eq!(out, vec![Applied::Ignored("another topic holds this name")]);
        image.apply(3, &batch(vec![MetadataRecord::RemoveTopic { id: a }]));
        image.apply(4, &batch(vec![MetadataRecord::Topic { name: "t".into(), id: b }]));
        assert_eq!(image.topic("t").unwrap().id, b);
    }

    #[test]
    fn partition_records_that_would_break_an_invariant_are_ignored() {
        let topic = Uuid::from_u128(5);
        let mut image = ClusterImage::default();
        image.apply(1, &batch(vec![MetadataRecord::Topic { name: "t".into(), id: topic }]));
        let partition = |replicas: Vec<i32>, isr: Vec<i32>, leader| MetadataRecord::Partition {
            topic_id: topic,
            partition: 0,
            replicas,
            isr,
            leader,
            leader_epoch: 0,
        };
        for (bad, why) in [
            (partition(vec![1, 1], vec![1], 1), "a replica is listed twice"),
            (partition(vec![1, 2], vec![], NO_LEADER), "the ISR is empty"),
            (partition(vec![1, 2], vec![1, 1], 1), "an ISR member is listed twice"),
            (partition(vec![1, 2], vec![1, 3], 1), "an ISR member is not a replica"),
            (partition(vec![1, 2], vec![2], 1), "the leader is not in the ISR"),
        ] {
            assert_eq!(image.apply(image.offset + 1, &batch(vec![bad])), vec![Applied::Ignored(why)]);
        }
        assert!(image.topic("t").unwrap().partitions.is_empty());
        image.apply(image.offset + 1, &batch(vec![partition(vec![1, 2, 3], vec![1, 2, 3], 1)]));
        let change = |isr: Option<Vec<i32>>, leader| MetadataRecord::PartitionChange {
            topic_id: topic,
            partition: 0,
            expected_partition_epoch: 0,
            leader,
            isr,
            assignment: None,
            elr: None,
            last_known_elr: None,
            leader_recovery_state: None,
        };
        for (bad, why) in [
            (change(Some(vec![]), None), "the ISR is empty under a leader"),
            (change(Some(vec![2, 2]), Some(2)), "an ISR member is listed twice"),
            (change(Some(vec![2, 3]), None), "the leader is not in the ISR"),
            (change(None, Some(4)), "the leader is not in the ISR"),
        ] {
            assert_eq!(image.apply(image.offset + 1, &batch(vec![bad])), vec![Applied::Ignored(why)]);
        }
        let p = image.partition("t", 0).unwrap();
        assert_eq!((p.leader, p.leader_epoch, p.partition_epoch), (1, 0, 0), "nothing applied");
        // A shrink and a new leader in one change: both epochs move once.
        image.apply(image.offset + 1, &batch(vec![change(Some(vec![2, 3]), Some(2))]));
        let p = image.partition("t", 0).unwrap();
        assert_eq!((p.isr.as_slice(), p.leader, p.leader_epoch, p.partition_epoch), (&[2, 3][..], 2, 1, 1));
        // A recovering leader (KIP-704) is alone in the ISR until it recovers.
        let with = |record: MetadataRecord, epoch: i32, state: Option<LeaderRecoveryState>| match record {
            MetadataRecord::PartitionChange {
                topic_id,
                partition,
                leader,
                isr,
                assignment,
                elr,
                last_known_elr,
                ..
            } => MetadataRecord::PartitionChange {
                topic_id,
                partition,
                expected_partition_epoch: epoch,
                leader,
                isr,
                assignment,
                elr,
                last_known_elr,
                leader_recovery_state: state,
            },
            other => other,
        };
        let recovering = |isr: Vec<i32>, epoch, state| with(change(Some(isr), None), epoch, Some(state));
        let grow_recovering = recovering(vec![2, 3], 1, LeaderRecoveryState::Recovering);
        let why = "the ISR grew while the leader was still recovering";
        assert_eq!(image.apply(image.offset + 1, &batch(vec![grow_recovering])), vec![Applied::Ignored(why)]);
        image.apply(image.offset + 1, &batch(vec![recovering(vec![2], 1, LeaderRecoveryState::Recovering)]));
        let p = image.partition("t", 0).unwrap();
        assert_eq!((p.isr.as_slice(), p.leader_recovery_state), (&[2][..], LeaderRecoveryState::Recovering));
        // Absent means unchanged.
        image.apply(image.offset + 1, &batch(vec![with(change(None, Some(2)), 2, None)]));
        assert_eq!(image.partition("t", 0).unwrap().leader_recovery_state, LeaderRecoveryState::Recovering);
        image.apply(image.offset + 1, &batch(vec![recovering(vec![2, 3], 3, LeaderRecoveryState::Recovered)]));
        let p = image.partition("t", 0).unwrap();
        assert_eq!((p.isr.as_slice(), p.leader_recovery_state), (&[2, 3][..], LeaderRecoveryState::Recovered));
    }

    #[test]
    fn snapshot_round_trips() {
        let mut image = ClusterImage::default();
        image.apply(1, &batch(vec![register(3), MetadataRecord::ClusterId { cluster_id: "x".into() }]));
        image.apply(
            2,
            &batch(vec![MetadataRecord::Config {
                resource: ConfigResource::Broker(3),
                name: "log.retention.ms".into(),
                value: Some("1".into()),
            }]),
        );
        assert_eq!(ClusterImage::decode(&image.encode()).unwrap(), image);
    }
}
