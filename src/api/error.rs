//! The one place internal errors become Kafka error codes.

use kafka_protocol::error::ResponseError;
use strand_storage::batch::BatchError;
use strand_storage::{ProducerError, StorageError};

use crate::replica::{PartitionError, TopicError};

pub fn code(e: ResponseError) -> i16 {
    e.code()
}

pub const NONE: i16 = 0;

pub fn storage_code(e: &StorageError) -> i16 {
    let r = match e {
        StorageError::InvalidBatch(b) => return batch_code(b),
        StorageError::Producer(p) => return producer_code(p),
        StorageError::BatchTooLarge { .. } => ResponseError::MessageTooLarge,
        StorageError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        StorageError::Io { .. } => ResponseError::KafkaStorageError,
        StorageError::CorruptBehindRecoveryPoint { .. }
        | StorageError::DamagedSegment { .. }
        | StorageError::CorruptFile { .. } => ResponseError::KafkaStorageError,
        #[allow(unreachable_patterns)]
        _ => ResponseError::UnknownServerError,
    };
    r.code()
}

/// A bad CRC or framing is a corrupt message (retriable: the client re-sends
/// intact bytes); wrong magic or inconsistent offsets are invalid records.
pub fn batch_code(e: &BatchError) -> i16 {
    match e {
        BatchError::CrcMismatch { .. } | BatchError::Truncated { .. } | BatchError::LengthTooSmall { .. } => {
            ResponseError::CorruptMessage.code()
        }
        BatchError::UnsupportedMagic { .. }
        | BatchError::InvalidOffsets { .. }
        | BatchError::UnknownCompression { .. }
        | BatchError::InvalidRecords { .. } => ResponseError::InvalidRecord.code(),
    }
}

/// Producer-state refusals: what Kafka answers for each (KIP-98, KIP-360, 2.7+).
pub fn producer_code(e: &ProducerError) -> i16 {
    let r = match e {
        ProducerError::InvalidProducerEpoch { .. } => ResponseError::InvalidProducerEpoch,
        ProducerError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
        ProducerError::InvalidTxnState { .. } => ResponseError::InvalidTxnState,
        ProducerError::CoordinatorFenced { .. } => ResponseError::TransactionCoordinatorFenced,
    };
    r.code()
}

pub fn partition_code(e: &PartitionError) -> i16 {
    match e {
        PartitionError::Gone => ResponseError::UnknownTopicOrPartition.code(),
        PartitionError::NotLeader => ResponseError::NotLeaderOrFollower.code(),
        PartitionError::UnderMinIsr { .. } => ResponseError::NotEnoughReplicasAfterAppend.code(),
        PartitionError::TimedOut => ResponseError::RequestTimedOut.code(),
        PartitionError::FencedLeaderEpoch { .. } => ResponseError::FencedLeaderEpoch.code(),
        PartitionError::UnknownLeaderEpoch { .. } => ResponseError::UnknownLeaderEpoch.code(),
        PartitionError::Offline(_) => ResponseError::KafkaStorageError.code(),
        PartitionError::Storage(s) => storage_code(s),
    }
}

/// A coordinator's write to its internal partition that did not become
/// committed, as Kafka's coordinators answer it: a moved leadership sends
/// the client to find the new coordinator (NOT_COORDINATOR); too few
/// replicas, a timeout or a storage failure leave it retrying this one
/// (COORDINATOR_NOT_AVAILABLE).
pub fn coordinator_write_code(e: &PartitionError) -> i16 {
    match e {
        PartitionError::NotLeader | PartitionError::Gone => ResponseError::NotCoordinator.code(),
        _ => ResponseError::CoordinatorNotAvailable.code(),
    }
}

pub fn topic_code(e: &TopicError) -> i16 {
    let r = match e {
        TopicError::AlreadyExists(_) => ResponseError::TopicAlreadyExists,
        TopicError::Unknown(_) => ResponseError::UnknownTopicOrPartition,
        TopicError::UnknownId(_) => ResponseError::UnknownTopicId,
        TopicError::InvalidName(_) => ResponseError::InvalidTopicException,
        TopicError::InvalidPartitions(_) | TopicError::TooManyPartitions(_) => ResponseError::InvalidPartitions,
        // Like PARTITIONS_MAX, a bound on the partitions this broker can host;
        // not retriable (it lasts until the limit is raised or topics go).
        TopicError::FileDescriptorLimit { .. } => ResponseError::InvalidPartitions,
        TopicError::InvalidReplicationFactor(_) => ResponseError::InvalidReplicationFactor,
        TopicError::InvalidReplicaAssignment(_) => ResponseError::InvalidReplicaAssignment,
        TopicError::InvalidConfig(_) => ResponseError::InvalidConfig,
        TopicError::InvalidRequest(_) => ResponseError::InvalidRequest,
        TopicError::DeletionDisabled => ResponseError::TopicDeletionDisabled,
        TopicError::Storage(s) => return storage_code(s),
        TopicError::Metadata(_) => ResponseError::KafkaStorageError,
    };
    r.code()
}

/// A partition another broker leads (or none does, for now).
pub fn not_leader_code() -> i16 {
    ResponseError::NotLeaderOrFollower.code()
}

pub fn unknown_partition_code() -> i16 {
    ResponseError::UnknownTopicOrPartition.code()
}

/// What a broker tells a client when the controller refused or could not
/// be reached: (code, message).
pub fn controller_code(e: &crate::controller::driver::DriverError) -> (i16, String) {
    use crate::controller::driver::DriverError;
    let r = match e {
        DriverError::NotController { .. } | DriverError::Unreachable(_) | DriverError::Stopped => {
            ResponseError::NotController
        }
        DriverError::Timeout => ResponseError::RequestTimedOut,
    };
    (r.code(), e.to_string())
}

/// Why one partition's leader election did not happen.
pub fn election_code(e: &crate::controller::core::ElectionError) -> i16 {
    use crate::controller::core::ElectionError;
    let r = match e {
        ElectionError::UnknownTopicOrPartition(..) => ResponseError::UnknownTopicOrPartition,
        ElectionError::ElectionNotNeeded => ResponseError::ElectionNotNeeded,
        ElectionError::PreferredLeaderNotAvailable { .. } => ResponseError::PreferredLeaderNotAvailable,
        ElectionError::EligibleLeadersNotAvailable { .. } => ResponseError::EligibleLeadersNotAvailable,
        // As an overtaken controller request: retriable.
        ElectionError::Overtaken => ResponseError::RequestTimedOut,
    };
    r.code()
}

/// One partition's refused reassignment step.
pub fn reassignment_code(e: &crate::controller::reassignment::ReassignmentError) -> i16 {
    use crate::controller::reassignment::ReassignmentError;
    let r = match e {
        ReassignmentError::UnknownTopicOrPartition(..) => ResponseError::UnknownTopicOrPartition,
        ReassignmentError::InvalidAssignment { .. } | ReassignmentError::CannotRevert { .. } => {
            ResponseError::InvalidReplicaAssignment
        }
        ReassignmentError::ReplicationFactorChange { .. } => ResponseError::InvalidReplicationFactor,
        ReassignmentError::NoReassignmentInProgress => ResponseError::NoReassignmentInProgress,
        // As an overtaken controller request: retriable.
        ReassignmentError::Overtaken => ResponseError::RequestTimedOut,
    };
    r.code()
}

/// A controller's refusal of a request: (code, message).
pub fn controller_reply_code(e: &crate::controller::core::ControllerError) -> (i16, String) {
    use crate::controller::core::ControllerError;
    let r = match e {
        ControllerError::StaleBrokerEpoch(_) => ResponseError::StaleBrokerEpoch,
        ControllerError::TopicExists(_) => ResponseError::TopicAlreadyExists,
        ControllerError::UnknownTopic(_) => ResponseError::UnknownTopicOrPartition,
        ControllerError::Placement(crate::metadata::placement::PlacementError::InvalidAssignment(_)) => {
            ResponseError::InvalidReplicaAssignment
        }
        ControllerError::Placement(_) => ResponseError::InvalidReplicationFactor,
        ControllerError::InvalidPartitions(_) | ControllerError::PartitionsCanOnlyGrow { .. } => {
            ResponseError::InvalidPartitions
        }
        ControllerError::Conflict => ResponseError::RequestTimedOut,
        ControllerError::UnknownTopicId(_) => ResponseError::UnknownTopicId,
        ControllerError::UnknownPartition { .. } => ResponseError::UnknownTopicOrPartition,
        // Kafka: the requester saw epochs this controller has not, so it is
        // no longer the active one; the broker looks for the new one.
        ControllerError::EpochsAhead { .. } => ResponseError::NotController,
        ControllerError::FencedLeaderEpoch { .. } => ResponseError::FencedLeaderEpoch,
        // Kafka answers INVALID_REQUEST (not NOT_LEADER_OR_FOLLOWER) to an
        // AlterPartition from a broker that does not lead at that epoch.
        ControllerError::NotLeader { .. } | ControllerError::InvalidIsr { .. } => ResponseError::InvalidRequest,
        ControllerError::StalePartitionEpoch { .. } => ResponseError::InvalidUpdateVersion,
        ControllerError::IneligibleReplica { .. } => ResponseError::IneligibleReplica,
        ControllerError::NotForCore(_) => ResponseError::UnknownServerError,
    };
    (r.code(), e.to_string())
}
