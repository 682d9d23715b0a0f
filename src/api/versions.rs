//! The one place that says which API versions Strand serves.
//!
//! A version is listed only when every field it carries is handled. Clients
//! pick the highest version both sides support, so an over-claim here breaks
//! them in ways that are hard to see.

use kafka_protocol::messages::ApiKey;

/// (API, lowest version, highest version).
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 13),
    (ApiKey::Fetch, 4, 17),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::Metadata, 0, 13),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 5),
    // Transactions at the versions before KIP-890 part 2 (no epoch bump per
    // transaction): the broker advertises no transaction.version feature.
    (ApiKey::AddPartitionsToTxn, 0, 4),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 4),
    (ApiKey::TxnOffsetCommit, 0, 4),
    (ApiKey::WriteTxnMarkers, 1, 1),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DescribeCluster, 0, 2),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::DescribeProducers, 0, 0),
];

/// Served only by a node of a multi-node cluster: a single node has no
/// metadata quorum to describe.
pub const CLUSTER_ONLY: &[(ApiKey, i16, i16)] = &[(ApiKey::DescribeQuorum, 0, 2)];

/// Everything this broker serves: [`SUPPORTED`], plus [`CLUSTER_ONLY`] in a cluster.
pub fn advertised(cluster: bool) -> impl Iterator<Item = &'static (ApiKey, i16, i16)> {
    SUPPORTED.iter().chain(CLUSTER_ONLY.iter().filter(move |_| cluster))
}

/// The supported range for `key`, if it is served at all.
pub fn supported_range(key: ApiKey, cluster: bool) -> Option<(i16, i16)> {
    advertised(cluster).find(|(k, _, _)| *k == key).map(|(_, lo, hi)| (*lo, *hi))
}

pub fn is_supported(key: ApiKey, version: i16, cluster: bool) -> bool {
    supported_range(key, cluster).is_some_and(|(lo, hi)| version >= lo && version <= hi)
}

/// The `metadata.version` feature level a cluster runs at (Kafka 4.1-IV1):
/// the only level Strand implements, so it is both the supported range and
/// the finalized level.
pub const METADATA_VERSION: i16 = 27;

/// The `eligible.leader.replicas.version` feature level (KIP-966): on, as
/// in a new Kafka 4.1 cluster, and the only behaviour the controller has.
pub const ELIGIBLE_LEADER_REPLICAS_VERSION: i16 = 1;

/// Every feature a cluster finalizes, with the one level Strand implements.
pub const FEATURES: [(&str, i16); 2] =
    [("metadata.version", METADATA_VERSION), ("eligible.leader.replicas.version", ELIGIBLE_LEADER_REPLICAS_VERSION)];

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::Message;

    /// Every advertised range must be one the codec can encode and decode.
    #[test]
    fn advertised_ranges_are_within_the_codec() {
        for (key, lo, hi) in advertised(true) {
            let codec = key.valid_versions();
            assert!(*lo >= codec.min && *hi <= codec.max, "{key:?} {lo}..{hi} outside {codec}");
        }
        assert_eq!(ApiVersionsRequest::VERSIONS.max, 4);
    }

    #[test]
    fn cluster_only_apis_are_not_advertised_by_a_single_node() {
        assert!(!is_supported(ApiKey::DescribeQuorum, 2, false));
        assert!(is_supported(ApiKey::DescribeQuorum, 2, true));
        assert!(is_supported(ApiKey::Produce, 9, false));
    }
}
