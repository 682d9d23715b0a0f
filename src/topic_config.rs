//! Topic-level configs: which keys exist, their broker-level synonyms, how a
//! value is validated, and how the effective values become a storage
//! [`LogConfig`]. The one table here serves CreateTopics, DescribeConfigs and
//! IncrementalAlterConfigs.

use std::collections::BTreeMap;

use strand_storage::LogConfig;

use crate::config::{parse_cleanup_policy, parse_int, BrokerConfig};

/// Kafka's `ConfigType` values as DescribeConfigs v3+ reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Long = 5,
    Double = 6,
    List = 7,
}

/// One topic config key.
pub struct TopicConfigKey {
    pub name: &'static str,
    /// The broker key that supplies the default (`log.retention.ms` for `retention.ms`).
    pub broker_synonym: &'static str,
    pub config_type: ConfigType,
    pub doc: &'static str,
}

pub const TOPIC_CONFIGS: &[TopicConfigKey] = &[
    TopicConfigKey {
        name: "cleanup.policy",
        broker_synonym: "log.cleanup.policy",
        config_type: ConfigType::List,
        doc: "delete and/or compact",
    },
    TopicConfigKey {
        name: "compression.type",
        broker_synonym: "compression.type",
        config_type: ConfigType::String,
        doc: "only 'producer': batches are stored as the producer compressed them",
    },
    TopicConfigKey {
        name: "delete.retention.ms",
        broker_synonym: "log.cleaner.delete.retention.ms",
        config_type: ConfigType::Long,
        doc: "how long tombstones survive compaction",
    },
    TopicConfigKey {
        name: "flush.messages",
        broker_synonym: "log.flush.interval.messages",
        config_type: ConfigType::Long,
        doc: "fsync after this many records",
    },
    TopicConfigKey {
        name: "flush.ms",
        broker_synonym: "log.flush.interval.ms",
        config_type: ConfigType::Long,
        doc: "fsync when the last flush is this old",
    },
    TopicConfigKey {
        name: "index.interval.bytes",
        broker_synonym: "log.index.interval.bytes",
        config_type: ConfigType::Int,
        doc: "bytes of log between sparse index entries",
    },
    TopicConfigKey {
        name: "max.message.bytes",
        broker_synonym: "message.max.bytes",
        config_type: ConfigType::Int,
        doc: "largest record batch accepted",
    },
    TopicConfigKey {
        name: "message.timestamp.type",
        broker_synonym: "log.message.timestamp.type",
        config_type: ConfigType::String,
        doc: "only CreateTime",
    },
    TopicConfigKey {
        name: "min.cleanable.dirty.ratio",
        broker_synonym: "log.cleaner.min.cleanable.ratio",
        config_type: ConfigType::Double,
        doc: "dirty share of the log that triggers compaction",
    },
    TopicConfigKey {
        name: "min.compaction.lag.ms",
        broker_synonym: "log.cleaner.min.compaction.lag.ms",
        config_type: ConfigType::Long,
        doc: "records younger than this are not compacted",
    },
    TopicConfigKey {
        name: "min.insync.replicas",
        broker_synonym: "min.insync.replicas",
        config_type: ConfigType::Int,
        doc: "replicas that must acknowledge an acks=all produce",
    },
    TopicConfigKey {
        name: "retention.bytes",
        broker_synonym: "log.retention.bytes",
        config_type: ConfigType::Long,
        doc: "size at which old segments are deleted; -1 for none",
    },
    TopicConfigKey {
        name: "retention.ms",
        broker_synonym: "log.retention.ms",
        config_type: ConfigType::Long,
        doc: "age at which old segments are deleted; -1 for none",
    },
    TopicConfigKey {
        name: "segment.bytes",
        broker_synonym: "log.segment.bytes",
        config_type: ConfigType::Int,
        doc: "segment file size at which the log rolls",
    },
    TopicConfigKey {
        name: "segment.index.bytes",
        broker_synonym: "log.index.size.max.bytes",
        config_type: ConfigType::Int,
        doc: "preallocated size of each offset index",
    },
    TopicConfigKey {
        name: "segment.ms",
        broker_synonym: "log.roll.ms",
        config_type: ConfigType::Long,
        doc: "age at which the log rolls",
    },
    TopicConfigKey {
        name: "unclean.leader.election.enable",
        broker_synonym: "unclean.leader.election.enable",
        config_type: ConfigType::Boolean,
        doc: "give a partition whose whole ISR is gone to another replica, losing what only the ISR had",
    },
];

/// Broker keys that IncrementalAlterConfigs may change at run time (cluster
/// default or this broker): the synonyms above that feed topic defaults.
pub fn is_dynamic_broker_key(key: &str) -> bool {
    TOPIC_CONFIGS
        .iter()
        .any(|k| k.broker_synonym == key && k.name != "compression.type" && k.name != "message.timestamp.type")
}

/// Kafka keys Strand refuses to set, naming why, but lets be deleted (a
/// no-op), because `kafka-reassign-partitions --verify` deletes them all
/// when a reassignment is done, whether it set them or not: the throttle of
/// moves between a broker's log directories, which Strand does not make
/// (one log directory per broker). The replication throttles themselves
/// are supported ([`crate::replica::throttle`]).
pub const REFUSED_THROTTLE_KEYS: &[&str] = &["replica.alter.log.dirs.io.max.bytes.per.second"];

/// Topic keys of the replication throttles (`partition:broker` lists),
/// outside [`TOPIC_CONFIGS`] because no broker key is their default.
pub const THROTTLED_REPLICAS_KEYS: &[&str] =
    &[crate::replica::throttle::LEADER_REPLICAS, crate::replica::throttle::FOLLOWER_REPLICAS];

/// Broker keys of the replication throttles' rates (bytes/s, dynamic).
pub const THROTTLE_RATE_KEYS: &[&str] =
    &[crate::replica::throttle::LEADER_RATE, crate::replica::throttle::FOLLOWER_RATE];

pub fn topic_key(name: &str) -> Option<&'static TopicConfigKey> {
    TOPIC_CONFIGS.iter().find(|k| k.name == name)
}

/// Validates one topic config value; returns it normalised.
pub fn validate_topic_value(name: &str, value: &str) -> Result<String, String> {
    let v = value.trim();
    let norm = match name {
        "cleanup.policy" => parse_cleanup_policy(v)?,
        "compression.type" => {
            if v != "producer" {
                return Err("Strand stores batches as producers compressed them; only 'producer' is supported".into());
            }
            v.to_string()
        }
        "message.timestamp.type" => {
            if v != "CreateTime" {
                return Err("only CreateTime is supported".into());
            }
            v.to_string()
        }
        "flush.messages" => parse_int(v, 1, i64::MAX)?.to_string(),
        "delete.retention.ms" | "min.compaction.lag.ms" => parse_int(v, 0, i64::MAX)?.to_string(),
        "min.cleanable.dirty.ratio" => {
            let ratio: f64 = v.parse().map_err(|_| "not a number".to_string())?;
            if !(0.0..=1.0).contains(&ratio) {
                return Err("must be between 0 and 1".into());
            }
            ratio.to_string()
        }
        "flush.ms" => parse_int(v, 0, i64::MAX)?.to_string(),
        "index.interval.bytes" => parse_int(v, 0, i32::MAX as i64)?.to_string(),
        "max.message.bytes" => parse_int(v, 0, i32::MAX as i64)?.to_string(),
        "min.insync.replicas" => parse_int(v, 1, i32::MAX as i64)?.to_string(),
        "unclean.leader.election.enable" => crate::config::parse_bool(v)?.to_string(),
        k if THROTTLED_REPLICAS_KEYS.contains(&k) => {
            crate::replica::throttle::ThrottledReplicas::parse(v)?.normalised()
        }
        "retention.bytes" | "retention.ms" => parse_int(v, -1, i64::MAX)?.to_string(),
        "segment.bytes" => parse_int(v, 14, i32::MAX as i64)?.to_string(),
        "segment.index.bytes" => parse_int(v, 4096, i32::MAX as i64)?.to_string(),
        "segment.ms" => parse_int(v, 1, i64::MAX)?.to_string(),
        other => return Err(format!("unknown or unsupported topic config {other}")),
    };
    Ok(norm)
}

/// Where an effective value came from (Kafka's DescribeConfigs `ConfigSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    DynamicTopic = 1,
    DynamicBroker = 2,
    DynamicDefaultBroker = 3,
    StaticBroker = 4,
    Default = 5,
}

/// Broker-level defaults for topic configs: static file values plus dynamic
/// overrides set through IncrementalAlterConfigs.
#[derive(Debug, Clone, Default)]
pub struct DynamicBrokerConfigs {
    /// Resource name "" (cluster-wide default).
    pub cluster_default: BTreeMap<String, String>,
    /// Resource name = this node id.
    pub this_broker: BTreeMap<String, String>,
}

/// The value and source of a broker synonym, as the broker currently sees it.
pub fn broker_value(broker: &BrokerConfig, dynamic: &DynamicBrokerConfigs, synonym: &str) -> (String, ConfigSource) {
    if let Some(v) = dynamic.this_broker.get(synonym) {
        return (v.clone(), ConfigSource::DynamicBroker);
    }
    if let Some(v) = dynamic.cluster_default.get(synonym) {
        return (v.clone(), ConfigSource::DynamicDefaultBroker);
    }
    let source =
        if broker.explicit_keys.contains_key(synonym) { ConfigSource::StaticBroker } else { ConfigSource::Default };
    let l = &broker.log;
    let value = match synonym {
        "log.cleanup.policy" => broker.log_cleanup_policy.clone(),
        "compression.type" => "producer".into(),
        "log.message.timestamp.type" => "CreateTime".into(),
        "log.flush.interval.messages" => l.flush_interval_messages.min(i64::MAX as u64).to_string(),
        "log.flush.interval.ms" => l.flush_interval_ms.to_string(),
        "log.index.interval.bytes" => l.index_interval_bytes.to_string(),
        "message.max.bytes" => l.max_batch_bytes.to_string(),
        "min.insync.replicas" => broker.min_insync_replicas.to_string(),
        "unclean.leader.election.enable" => broker.unclean_leader_election_enable.to_string(),
        "log.retention.bytes" => l.retention_bytes.to_string(),
        "log.retention.ms" => l.retention_ms.to_string(),
        "log.segment.bytes" => l.segment_bytes.to_string(),
        "log.index.size.max.bytes" => l.index_max_bytes.to_string(),
        "log.roll.ms" => l.roll_ms.to_string(),
        "log.cleaner.delete.retention.ms" => broker.cleaner.delete_retention_ms.to_string(),
        "log.cleaner.min.cleanable.ratio" => (broker.cleaner.min_cleanable_ratio_per_mille as f64 / 1000.0).to_string(),
        "log.cleaner.min.compaction.lag.ms" => "0".into(),
        _ => String::new(),
    };
    (value, source)
}

/// Effective value of topic config `key` for a topic with `overrides`.
pub fn topic_value(
    broker: &BrokerConfig,
    dynamic: &DynamicBrokerConfigs,
    overrides: &BTreeMap<String, String>,
    key: &TopicConfigKey,
) -> (String, ConfigSource) {
    match overrides.get(key.name) {
        Some(v) => (v.clone(), ConfigSource::DynamicTopic),
        None => broker_value(broker, dynamic, key.broker_synonym),
    }
}

/// The effective settings of one topic, ready for the storage layer and the produce path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveTopicConfig {
    pub log: LogConfig,
    pub min_insync_replicas: i32,
    pub cleanup_policy: String,
}

pub fn effective(
    broker: &BrokerConfig,
    dynamic: &DynamicBrokerConfigs,
    overrides: &BTreeMap<String, String>,
) -> EffectiveTopicConfig {
    let get = |name: &str| {
        let key = topic_key(name).expect("known key");
        topic_value(broker, dynamic, overrides, key).0
    };
    let int = |name: &str, fallback: i64| get(name).parse::<i64>().unwrap_or(fallback);
    let d = &broker.log;
    EffectiveTopicConfig {
        log: LogConfig {
            segment_bytes: int("segment.bytes", d.segment_bytes as i64) as u64,
            roll_ms: int("segment.ms", d.roll_ms),
            retention_ms: int("retention.ms", d.retention_ms),
            retention_bytes: int("retention.bytes", d.retention_bytes),
            index_interval_bytes: int("index.interval.bytes", d.index_interval_bytes as i64) as u32,
            index_max_bytes: int("segment.index.bytes", d.index_max_bytes as i64) as u32,
            flush_interval_messages: int("flush.messages", i64::MAX) as u64,
            flush_interval_ms: int("flush.ms", d.flush_interval_ms),
            max_batch_bytes: int("max.message.bytes", d.max_batch_bytes as i64) as usize,
            cleanup_delete: get("cleanup.policy").split(',').any(|p| p == "delete"),
            cleanup_compact: get("cleanup.policy").split(',').any(|p| p == "compact"),
            delete_retention_ms: int("delete.retention.ms", broker.cleaner.delete_retention_ms),
            min_cleanable_dirty_ratio_permille: get("min.cleanable.dirty.ratio")
                .parse::<f64>()
                .map(|r| (r * 1000.0).round() as u32)
                .unwrap_or(broker.cleaner.min_cleanable_ratio_per_mille),
            min_compaction_lag_ms: int("min.compaction.lag.ms", 0),
            producer_id_expiration_ms: broker.producer_id_expiration_ms,
        },
        min_insync_replicas: int("min.insync.replicas", 1) as i32,
        cleanup_policy: get("cleanup.policy"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_override_beats_dynamic_beats_static() {
        let broker = BrokerConfig::from_properties("log.retention.ms=100\n", "t", &[]).unwrap();
        let mut dynamic = DynamicBrokerConfigs::default();
        let mut overrides = BTreeMap::new();
        assert_eq!(effective(&broker, &dynamic, &overrides).log.retention_ms, 100);
        dynamic.cluster_default.insert("log.retention.ms".into(), "200".into());
        assert_eq!(effective(&broker, &dynamic, &overrides).log.retention_ms, 200);
        overrides.insert("retention.ms".into(), "300".into());
        assert_eq!(effective(&broker, &dynamic, &overrides).log.retention_ms, 300);
    }

    #[test]
    fn validation_refuses_nonsense() {
        assert!(validate_topic_value("retention.ms", "soon").is_err());
        assert!(validate_topic_value("cleanup.policy", "shred").is_err());
        assert_eq!(validate_topic_value("cleanup.policy", "compact, delete").unwrap(), "compact,delete");
        assert!(validate_topic_value("no.such.key", "1").is_err());
    }
}
