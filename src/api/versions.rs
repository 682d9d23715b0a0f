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
    (ApiKey::Metadata, 0, 13),
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
    (ApiKey::DescribeProducers, 0, 0),
];

/// The supported range for `key`, if it is served at all.
pub fn supported_range(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED.iter().find(|(k, _, _)| *k == key).map(|(_, lo, hi)| (*lo, *hi))
}

pub fn is_supported(key: ApiKey, version: i16) -> bool {
    supported_range(key).is_some_and(|(lo, hi)| version >= lo && version <= hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::Message;

    /// Every advertised range must be one the codec can encode and decode.
    #[test]
    fn advertised_ranges_are_within_the_codec() {
        for (key, lo, hi) in SUPPORTED {
            let codec = key.valid_versions();
            assert!(*lo >= codec.min && *hi <= codec.max, "{key:?} {lo}..{hi} outside {codec}");
        }
        assert_eq!(ApiVersionsRequest::VERSIONS.max, 4);
    }
}
