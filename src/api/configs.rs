//! DescribeConfigs and IncrementalAlterConfigs for topics and the broker.

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::{error, str_bytes, RequestContext};
use crate::replica::TopicError;
use crate::topic_config::{self, ConfigSource, ConfigType, DynamicBrokerConfigs, TOPIC_CONFIGS};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// One described config before it is put on the wire.
struct Entry {
    name: String,
    value: String,
    source: ConfigSource,
    read_only: bool,
    config_type: ConfigType,
    doc: &'static str,
    synonyms: Vec<(String, String, ConfigSource)>,
}

/// Static broker settings reported by DescribeConfigs (read-only).
fn static_broker_entries(ctx: &RequestContext) -> Vec<Entry> {
    let c = ctx.state.config();
    let join = |ls: &[crate::config::Listener]| {
        ls.iter().map(|l| format!("{}://{}:{}", l.name, l.host, l.port)).collect::<Vec<_>>().join(",")
    };
    let items: Vec<(&str, String, ConfigType)> = vec![
        ("node.id", c.node_id.to_string(), ConfigType::Int),
        ("listeners", join(&c.listeners), ConfigType::String),
        ("advertised.listeners", join(&c.advertised_listeners), ConfigType::String),
        ("log.dirs", c.log_dir.display().to_string(), ConfigType::String),
        ("num.partitions", c.num_partitions.to_string(), ConfigType::Int),
        ("default.replication.factor", c.default_replication_factor.to_string(), ConfigType::Int),
        ("auto.create.topics.enable", c.auto_create_topics_enable.to_string(), ConfigType::Boolean),
        ("delete.topic.enable", c.delete_topic_enable.to_string(), ConfigType::Boolean),
        ("socket.request.max.bytes", c.socket_request_max_bytes.to_string(), ConfigType::Int),
        ("max.connections", c.max_connections.to_string(), ConfigType::Int),
        ("connections.max.idle.ms", c.connections_max_idle_ms.map_or(-1, |v| v as i64).to_string(), ConfigType::Long),
        ("queued.max.request.bytes", c.queued_max_request_bytes.map_or(-1, |v| v as i64).to_string(), ConfigType::Long),
        ("log.retention.check.interval.ms", c.log_retention_check_interval_ms.to_string(), ConfigType::Long),
        (
            "log.flush.offset.checkpoint.interval.ms",
            c.log_flush_offset_checkpoint_interval_ms.to_string(),
            ConfigType::Int,
        ),
        ("log.scrub.enable", c.scrub.enable.to_string(), ConfigType::Boolean),
        ("log.scrub.bytes.per.second", c.scrub.bytes_per_second.to_string(), ConfigType::Long),
        ("log.scrub.interval.ms", c.scrub.interval_ms.to_string(), ConfigType::Long),
        ("fetch.max.bytes", c.fetch_max_bytes.to_string(), ConfigType::Int),
    ];
    items
        .into_iter()
        .map(|(name, value, config_type)| Entry {
            source: if c.explicit_keys.contains_key(name) { ConfigSource::StaticBroker } else { ConfigSource::Default },
            name: name.to_string(),
            value,
            read_only: true,
            config_type,
            doc: "",
            synonyms: Vec::new(),
        })
        .collect()
}

fn broker_synonyms(
    ctx: &RequestContext,
    dynamic: &DynamicBrokerConfigs,
    synonym: &str,
) -> Vec<(String, String, ConfigSource)> {
    let mut out = Vec::new();
    if let Some(v) = dynamic.this_broker.get(synonym) {
        out.push((synonym.to_string(), v.clone(), ConfigSource::DynamicBroker));
    }
    if let Some(v) = dynamic.cluster_default.get(synonym) {
        out.push((synonym.to_string(), v.clone(), ConfigSource::DynamicDefaultBroker));
    }
    let (v, s) = topic_config::broker_value(ctx.state.config(), &DynamicBrokerConfigs::default(), synonym);
    out.push((synonym.to_string(), v, s));
    out
}

fn topic_entries(ctx: &RequestContext, overrides: &BTreeMap<String, String>) -> Vec<Entry> {
    let dynamic = ctx.state.replicas.dynamic_configs();
    TOPIC_CONFIGS
        .iter()
        .map(|key| {
            let (value, source) = topic_config::topic_value(ctx.state.config(), &dynamic, overrides, key);
            let mut synonyms = Vec::new();
            if let Some(v) = overrides.get(key.name) {
                synonyms.push((key.name.to_string(), v.clone(), ConfigSource::DynamicTopic));
            }
            synonyms.extend(broker_synonyms(ctx, &dynamic, key.broker_synonym));
            Entry {
                name: key.name.to_string(),
                value,
                source,
                read_only: false,
                config_type: key.config_type,
                doc: key.doc,
                synonyms,
            }
        })
        .chain(topic_config::THROTTLED_REPLICAS_KEYS.iter().map(|name| {
            let set = overrides.get(*name);
            Entry {
                name: name.to_string(),
                value: set.cloned().unwrap_or_default(),
                source: if set.is_some() { ConfigSource::DynamicTopic } else { ConfigSource::Default },
                read_only: false,
                config_type: ConfigType::List,
                doc: "replicas of this topic whose replication is throttled: * or partition:broker pairs",
                synonyms: set
                    .map(|v| vec![(name.to_string(), v.clone(), ConfigSource::DynamicTopic)])
                    .unwrap_or_default(),
            }
        }))
        .collect()
}

fn broker_entries(ctx: &RequestContext) -> Vec<Entry> {
    let dynamic = ctx.state.replicas.dynamic_configs();
    let mut entries = static_broker_entries(ctx);
    for name in topic_config::THROTTLE_RATE_KEYS {
        let mut synonyms = broker_synonyms(ctx, &dynamic, name);
        // The last synonym is the static value: for these, none (Kafka's Long.MAX_VALUE).
        synonyms.pop();
        synonyms.push((name.to_string(), crate::replica::throttle::UNLIMITED.to_string(), ConfigSource::Default));
        let (value, source) = (synonyms[0].1.clone(), synonyms[0].2);
        entries.push(Entry {
            name: name.to_string(),
            value,
            source,
            read_only: false,
            config_type: ConfigType::Long,
            doc: "bytes per second of throttled replication (kafka-reassign-partitions --throttle)",
            synonyms,
        });
    }
    for key in TOPIC_CONFIGS {
        let (value, source) = topic_config::broker_value(ctx.state.config(), &dynamic, key.broker_synonym);
        entries.push(Entry {
            name: key.broker_synonym.to_string(),
            value,
            source,
            read_only: !topic_config::is_dynamic_broker_key(key.broker_synonym),
            config_type: key.config_type,
            doc: key.doc,
            synonyms: broker_synonyms(ctx, &dynamic, key.broker_synonym),
        });
    }
    entries
}

pub fn describe(ctx: &RequestContext, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let node = ctx.state.config().node_id.to_string();
    let results = req
        .resources
        .into_iter()
        .map(|r| {
            let name = r.resource_name.to_string();
            let base = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let entries = match r.resource_type {
                RESOURCE_TOPIC => {
                    // In a cluster the image holds every topic's overrides, hosted here or not.
                    let overrides = match ctx.state.cluster() {
                        Some(c) => {
                            let image = c.image();
                            image.topic(&name).map(|_| image.topic_configs.get(&name).cloned().unwrap_or_default())
                        }
                        None => ctx.state.replicas.topic(&name).map(|t| t.configs.clone()),
                    };
                    match overrides {
                        Some(o) => Ok(topic_entries(ctx, &o)),
                        None => Err((ResponseError::UnknownTopicOrPartition, format!("topic {name} does not exist"))),
                    }
                }
                RESOURCE_BROKER if name.is_empty() || name == node => Ok(broker_entries(ctx)),
                RESOURCE_BROKER => Err((ResponseError::InvalidRequest, format!("this is broker {node}, not {name}"))),
                other => Err((ResponseError::InvalidRequest, format!("resource type {other} is not supported"))),
            };
            match entries {
                Err((code, msg)) => {
                    base.with_error_code(code.code()).with_error_message(Some(StrBytes::from_string(msg)))
                }
                Ok(entries) => {
                    let wanted: Option<Vec<String>> =
                        r.configuration_keys.map(|k| k.iter().map(|s| s.to_string()).collect());
                    let configs = entries
                        .into_iter()
                        .filter(|e| wanted.as_ref().is_none_or(|w| w.contains(&e.name)))
                        .map(|e| {
                            let synonyms = if req.include_synonyms {
                                e.synonyms
                                    .iter()
                                    .map(|(n, v, s)| {
                                        DescribeConfigsSynonym::default()
                                            .with_name(str_bytes(n))
                                            .with_value(Some(str_bytes(v)))
                                            .with_source(*s as i8)
                                    })
                                    .collect()
                            } else {
                                Vec::new()
                            };
                            DescribeConfigsResourceResult::default()
                                .with_name(StrBytes::from_string(e.name))
                                .with_value(Some(StrBytes::from_string(e.value)))
                                .with_read_only(e.read_only)
                                .with_config_source(e.source as i8)
                                .with_is_sensitive(false)
                                .with_synonyms(synonyms)
                                .with_config_type(e.config_type as i8)
                                .with_documentation(if req.include_documentation {
                                    Some(str_bytes(e.doc))
                                } else {
                                    None
                                })
                        })
                        .collect();
                    base.with_error_code(0).with_configs(configs)
                }
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// Applies one resource's operations to `current`, returning the new overrides.
fn apply_ops(
    current: &BTreeMap<String, String>,
    ops: &[incremental_alter_configs_request::AlterableConfig],
    validate: impl Fn(&str, &str) -> Result<String, String>,
    is_list: impl Fn(&str) -> bool,
) -> Result<BTreeMap<String, String>, String> {
    let is_known = |name: &str| {
        topic_config::topic_key(name).is_some()
            || topic_config::is_dynamic_broker_key(name)
            || topic_config::THROTTLED_REPLICAS_KEYS.contains(&name)
            || topic_config::THROTTLE_RATE_KEYS.contains(&name)
            || topic_config::REFUSED_THROTTLE_KEYS.contains(&name)
    };
    let mut next = current.clone();
    let mut seen = std::collections::HashSet::new();
    for op in ops {
        let name = op.name.to_string();
        if !seen.insert(name.clone()) {
            return Err(format!("{name} appears more than once"));
        }
        let value = op.value.as_ref().map(|v| v.to_string());
        match op.config_operation {
            _ if op.config_operation != OP_DELETE && topic_config::REFUSED_THROTTLE_KEYS.contains(&name.as_str()) => {
                return Err(format!(
                    "{name}: Strand keeps one log directory per broker and moves no replica between directories"
                ));
            }
            OP_SET => {
                let v = value.ok_or_else(|| format!("SET of {name} needs a value"))?;
                next.insert(name.clone(), validate(&name, &v)?);
            }
            OP_DELETE => {
                if !is_known(&name) {
                    return Err(format!("unknown config {name}"));
                }
                next.remove(&name);
            }
            OP_APPEND | OP_SUBTRACT => {
                if !is_list(&name) {
                    return Err(format!("{name} is not a list; APPEND and SUBTRACT apply only to lists"));
                }
                let v = value.ok_or_else(|| format!("operation on {name} needs a value"))?;
                let existing = next.get(&name).cloned().unwrap_or_default();
                let mut items: Vec<String> =
                    existing.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect();
                for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    if op.config_operation == OP_APPEND {
                        if !items.iter().any(|i| i == item) {
                            items.push(item.to_string());
                        }
                    } else {
                        items.retain(|i| i != item);
                    }
                }
                if items.is_empty() {
                    next.remove(&name);
                } else {
                    next.insert(name.clone(), validate(&name, &items.join(","))?);
                }
            }
            other => return Err(format!("unknown config operation {other}")),
        }
    }
    Ok(next)
}

/// Validates one broker dynamic config key and value.
fn validate_broker_value(k: &str, v: &str) -> Result<String, String> {
    if topic_config::THROTTLE_RATE_KEYS.contains(&k) {
        return crate::replica::throttle::parse_rate(v).map(|r| r.to_string());
    }
    if !topic_config::is_dynamic_broker_key(k) {
        return Err(format!("unknown or read-only broker config {k}; dynamic ones are the log.* topic defaults and the replication throttle rates"));
    }
    let topic_key = TOPIC_CONFIGS.iter().find(|t| t.broker_synonym == k).expect("dynamic keys are synonyms");
    topic_config::validate_topic_value(topic_key.name, v)
}

/// The resource an alter request names.
enum Target {
    Topic(String),
    /// Dynamic broker configs: the cluster-wide default (`None`, the
    /// resource name `""`) or one broker's.
    Broker(Option<i32>),
}

/// A planned change: the resource, its current overrides, the new ones.
type Planned = (Target, BTreeMap<String, String>, BTreeMap<String, String>);

/// Resolves the resource and computes its new override set with `next`
/// (given the current overrides and the key validator for that kind of
/// resource). Current overrides come from this broker on a single node and
/// from the metadata image in a cluster.
fn plan(
    ctx: &RequestContext,
    resource_type: i8,
    name: &str,
    next: impl Fn(
        &BTreeMap<String, String>,
        &dyn Fn(&str, &str) -> Result<String, String>,
    ) -> Result<BTreeMap<String, String>, String>,
) -> Result<Planned, (i16, String)> {
    let node = ctx.state.config().node_id;
    let target = match resource_type {
        RESOURCE_TOPIC => Target::Topic(name.to_string()),
        RESOURCE_BROKER if name.is_empty() => Target::Broker(None),
        RESOURCE_BROKER => match name.parse::<i32>() {
            Ok(id) if id == node || ctx.state.cluster().is_some_and(|c| c.image().brokers.contains_key(&id)) => {
                Target::Broker(Some(id))
            }
            _ => return Err((ResponseError::InvalidRequest.code(), format!("this is broker {node}, not {name}"))),
        },
        other => return Err((ResponseError::InvalidRequest.code(), format!("resource type {other} is not supported"))),
    };
    let image = ctx.state.cluster().map(|c| c.image());
    let current: BTreeMap<String, String> = match (&target, &image) {
        (Target::Topic(topic), None) => {
            ctx.state.replicas.topic(topic).map(|t| t.configs.clone()).ok_or_else(|| {
                (ResponseError::UnknownTopicOrPartition.code(), format!("topic {topic} does not exist"))
            })?
        }
        (Target::Topic(topic), Some(image)) => match image.topic(topic) {
            Some(_) => image.topic_configs.get(topic).cloned().unwrap_or_default(),
            None => {
                return Err((ResponseError::UnknownTopicOrPartition.code(), format!("topic {topic} does not exist")))
            }
        },
        (Target::Broker(id), None) => {
            let dynamic = ctx.state.replicas.dynamic_configs();
            if id.is_none() {
                dynamic.cluster_default
            } else {
                dynamic.this_broker
            }
        }
        (Target::Broker(None), Some(image)) => image.broker_default_configs.clone(),
        (Target::Broker(Some(id)), Some(image)) => image.broker_configs.get(id).cloned().unwrap_or_default(),
    };
    let validate: &dyn Fn(&str, &str) -> Result<String, String> = match target {
        Target::Topic(_) => &topic_config::validate_topic_value,
        Target::Broker(_) => &validate_broker_value,
    };
    let overrides = next(&current, validate).map_err(|m| (ResponseError::InvalidConfig.code(), m))?;
    Ok((target, current, overrides))
}

/// Stores a resource's new overrides: on this broker (single node), or
/// through the active controller as config records (cluster), answered
/// once this broker has applied them.
async fn store(
    ctx: &RequestContext,
    target: Target,
    current: BTreeMap<String, String>,
    overrides: BTreeMap<String, String>,
) -> Result<(), (i16, String)> {
    let stored = |r: Result<(), TopicError>| r.map_err(|e| (error::topic_code(&e), e.to_string()));
    let Some(cluster) = ctx.state.cluster() else {
        return match target {
            Target::Topic(topic) => stored(ctx.state.replicas.set_topic_configs(&topic, overrides)),
            Target::Broker(id) => stored(ctx.state.replicas.set_dynamic_broker_configs(id.is_none(), overrides)),
        };
    };
    let mut changes: Vec<(String, Option<String>)> =
        current.keys().filter(|k| !overrides.contains_key(*k)).map(|k| (k.clone(), None)).collect();
    changes.extend(
        overrides.iter().filter(|(k, v)| current.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), Some(v.clone()))),
    );
    let resource = match target {
        Target::Topic(topic) => crate::metadata::records::ConfigResource::Topic(topic),
        Target::Broker(None) => crate::metadata::records::ConfigResource::BrokerDefault,
        Target::Broker(Some(id)) => crate::metadata::records::ConfigResource::Broker(id),
    };
    match cluster.submit(crate::controller::core::Request::AlterConfigs { resource, changes }).await {
        Ok(crate::controller::core::Reply::Error(e)) => Err(error::controller_reply_code(&e)),
        Ok(_) => Ok(()),
        Err(e) => Err(error::controller_code(&e)),
    }
}

/// AlterConfigs (the pre-KIP-339 form): each resource's overrides are replaced
/// by exactly the given set.
pub async fn alter(ctx: &RequestContext, req: AlterConfigsRequest) -> AlterConfigsResponse {
    let mut responses = Vec::with_capacity(req.resources.len());
    for r in req.resources {
        let pairs: Vec<(String, Option<String>)> =
            r.configs.iter().map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string()))).collect();
        let replace_all = |_current: &BTreeMap<String, String>,
                           validate: &dyn Fn(&str, &str) -> Result<String, String>| {
            let mut out = BTreeMap::new();
            for (k, v) in &pairs {
                let v = v.as_deref().ok_or_else(|| format!("null value for {k}"))?;
                out.insert(k.clone(), validate(k, v)?);
            }
            Ok(out)
        };
        let outcome = match plan(ctx, r.resource_type, r.resource_name.as_str(), replace_all) {
            Ok(_) if req.validate_only => Ok(()),
            Ok((target, current, overrides)) => store(ctx, target, current, overrides).await,
            Err(e) => Err(e),
        };
        let base = alter_configs_response::AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name);
        responses.push(match outcome {
            Ok(()) => base.with_error_code(0),
            Err((code, msg)) => base.with_error_code(code).with_error_message(Some(StrBytes::from_string(msg))),
        });
    }
    AlterConfigsResponse::default().with_responses(responses)
}

/// IncrementalAlterConfigs (KIP-339): set, delete, append and subtract per key.
pub async fn incremental_alter(
    ctx: &RequestContext,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut responses = Vec::with_capacity(req.resources.len());
    for r in req.resources {
        let is_list = |k: &str| {
            k == "cleanup.policy" || k == "log.cleanup.policy" || topic_config::THROTTLED_REPLICAS_KEYS.contains(&k)
        };
        let ops = |current: &BTreeMap<String, String>, validate: &dyn Fn(&str, &str) -> Result<String, String>| {
            apply_ops(current, &r.configs, validate, is_list)
        };
        let outcome = match plan(ctx, r.resource_type, r.resource_name.as_str(), ops) {
            Ok(_) if req.validate_only => Ok(()),
            Ok((target, current, overrides)) => store(ctx, target, current, overrides).await,
            Err(e) => Err(e),
        };
        let base = AlterConfigsResourceResponse::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name);
        responses.push(match outcome {
            Ok(()) => base.with_error_code(0),
            Err((code, msg)) => base.with_error_code(code).with_error_message(Some(StrBytes::from_string(msg))),
        });
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}
