//! Records of the cluster metadata log.
//!
//! One raft entry carries one [`RecordBatch`]: the records of one controller
//! decision, applied together (a fenced broker and its partitions' leader
//! changes land in one batch, so no image ever shows one without the other).
//!
//! Every record is **idempotent**: a proposal the controller retried after a
//! timeout may commit twice, and applying it again must change nothing.
//! Records that change existing state say which state they expect (a
//! partition epoch, a broker epoch, a producer-id block start); when the
//! expectation does not hold the record is ignored, on every node alike,
//! because the log is the same everywhere.
//!
//! Encoding: JSON (serde). The metadata log is small and rarely written;
//! a readable format is worth more here than a few bytes.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A listener a broker serves on, as it registered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub name: String,
    pub host: String,
    pub port: u16,
}

/// Where a config record applies.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ConfigResource {
    Topic(String),
    /// One broker's dynamic config.
    Broker(i32),
    /// The cluster-wide broker default (`--entity-default`).
    BrokerDefault,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetadataRecord {
    /// The cluster's id, written once by the first active controller.
    ClusterId {
        cluster_id: String,
    },
    /// A broker (re)started and registered. Its broker epoch is the offset of
    /// this record. A registration with the incarnation id already held is a
    /// retry and changes nothing.
    RegisterBroker {
        broker_id: i32,
        incarnation_id: Uuid,
        endpoints: Vec<Endpoint>,
        rack: Option<String>,
    },
    /// The broker with this epoch stopped heartbeating (or shut down): it
    /// leads nothing until unfenced.
    FenceBroker {
        broker_id: i32,
        epoch: i64,
    },
    /// The broker with this epoch has caught up with the log and may lead.
    UnfenceBroker {
        broker_id: i32,
        epoch: i64,
    },
    /// The broker with this epoch asked for a controlled shutdown.
    BeginControlledShutdown {
        broker_id: i32,
        epoch: i64,
    },
    Topic {
        name: String,
        id: Uuid,
    },
    /// A new partition; ignored if the partition exists.
    Partition {
        topic_id: Uuid,
        partition: i32,
        replicas: Vec<i32>,
        isr: Vec<i32>,
        leader: i32,
        leader_epoch: i32,
    },
    /// A change of leader and/or ISR, applied only if the partition is still
    /// at `expected_partition_epoch`. A new leader bumps the leader epoch;
    /// every change bumps the partition epoch.
    PartitionChange {
        topic_id: Uuid,
        partition: i32,
        expected_partition_epoch: i32,
        leader: Option<i32>,
        isr: Option<Vec<i32>>,
        /// A new replica set (a reassignment starting, replaced, completed
        /// or cancelled); absent in records that leave it as it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        assignment: Option<Assignment>,
        /// New eligible leader replicas (KIP-966); absent when unchanged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        elr: Option<Vec<i32>>,
        /// New last known ELR (the last leader of a partition left with
        /// neither ISR nor ELR); absent when unchanged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_known_elr: Option<Vec<i32>>,
        /// A new leader recovery state (KIP-704); absent when unchanged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        leader_recovery_state: Option<super::image::LeaderRecoveryState>,
    },
    RemoveTopic {
        id: Uuid,
    },
    /// Sets (`Some`) or removes (`None`) one config key.
    Config {
        resource: ConfigResource,
        name: String,
        value: Option<String>,
    },
    /// Producer ids `[start, start + size)` go to `broker_id`; applied only if
    /// `start` is the cluster's next free id, so ids are never handed out twice.
    ProducerIds {
        broker_id: i32,
        start: i64,
        size: i64,
    },
    FeatureLevel {
        name: String,
        level: i16,
    },
}

/// A partition's replicas, with what an ongoing reassignment adds and
/// removes (both empty when none is): as Kafka's PartitionChangeRecord,
/// `replicas` is the target followed by the replicas being removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub replicas: Vec<i32>,
    pub adding: Vec<i32>,
    pub removing: Vec<i32>,
}

/// The records of one raft entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordBatch {
    /// Which proposal this is (the proposer's id for it), so a proposer can
    /// recognise its own batch when it commits, even twice.
    pub proposal: Uuid,
    pub records: Vec<MetadataRecord>,
}

#[derive(Debug, thiserror::Error)]
#[error("metadata log entry at offset {offset} does not decode: {reason}")]
pub struct DecodeError {
    pub offset: u64,
    pub reason: String,
}

impl RecordBatch {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("metadata records serialise")
    }

    pub fn decode(offset: u64, bytes: &[u8]) -> Result<RecordBatch, DecodeError> {
        serde_json::from_slice(bytes).map_err(|e| DecodeError { offset, reason: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip_and_garbage_names_its_offset() {
        let batch = RecordBatch {
            proposal: Uuid::new_v4(),
            records: vec![
                MetadataRecord::ClusterId { cluster_id: "abc".into() },
                MetadataRecord::Config {
                    resource: ConfigResource::Topic("t".into()),
                    name: "retention.ms".into(),
                    value: Some("1000".into()),
                },
            ],
        };
        assert_eq!(RecordBatch::decode(7, &batch.encode()).unwrap(), batch);
        let err = RecordBatch::decode(42, b"{nope").unwrap_err();
        assert!(err.to_string().contains("offset 42"), "{err}");
    }
}
