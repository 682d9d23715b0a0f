//! The replica manager: every topic and partition this broker hosts, the
//! persisted metadata behind them, and the admin operations that change them.
//!
//! Topics are kept in a copy-on-write map (`RwLock<Arc<TopicMap>>`): the
//! produce and fetch paths take a cheap snapshot and never wait on an admin
//! operation doing file I/O. Admin operations are serialised by the metadata
//! store's mutex, write the metadata file, then publish a new map.

pub mod fd_room;
pub mod fetcher;
pub mod hw_checkpoint;
pub mod partition;
pub mod replication;
pub mod state;
pub mod throttle;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use strand_storage::{Log, StorageError};
use uuid::Uuid;

use crate::config::BrokerConfig;
use crate::metadata::{MetadataError, MetadataStore, TopicRecord};
use crate::topic_config::{self, DynamicBrokerConfigs, EffectiveTopicConfig};
pub use partition::{Partition, PartitionError, PartitionOffsets};

/// A topic and its partitions.
#[derive(Debug)]
pub struct Topic {
    pub name: String,
    pub id: Uuid,
    pub internal: bool,
    pub configs: BTreeMap<String, String>,
    /// The partitions hosted here, sorted by index: all of them on a single
    /// node, those the controller placed on this broker in a cluster.
    pub partitions: Vec<Arc<Partition>>,
    /// How many partitions the topic has (hosted here or not).
    pub partition_count: i32,
}

impl Topic {
    /// Partition `index`, if it is hosted here (negative and out-of-range indexes never are).
    pub fn partition(&self, index: i32) -> Option<&Arc<Partition>> {
        let i = usize::try_from(index).ok()?;
        match self.partitions.get(i) {
            // A single node hosts every partition: the index is the position.
            Some(p) if p.index == index => Some(p),
            _ => self.partitions.binary_search_by_key(&index, |p| p.index).ok().map(|i| &self.partitions[i]),
        }
    }
}

#[derive(Debug, Default)]
pub struct TopicMap {
    pub by_name: HashMap<String, Arc<Topic>>,
    pub by_id: HashMap<Uuid, Arc<Topic>>,
}

impl TopicMap {
    fn insert(&mut self, topic: Arc<Topic>) {
        self.by_id.insert(topic.id, topic.clone());
        self.by_name.insert(topic.name.clone(), topic);
    }
    fn remove(&mut self, name: &str) -> Option<Arc<Topic>> {
        let t = self.by_name.remove(name)?;
        self.by_id.remove(&t.id);
        Some(t)
    }
}

/// Why an admin operation on topics was refused.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("topic {0} already exists")]
    AlreadyExists(String),
    #[error("topic {0} does not exist")]
    Unknown(String),
    #[error("topic id {0} does not exist")]
    UnknownId(Uuid),
    #[error("invalid topic name: {0}")]
    InvalidName(String),
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidReplicaAssignment(String),
    #[error("{0}")]
    InvalidConfig(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("topic deletion is disabled (delete.topic.enable=false)")]
    DeletionDisabled,
    #[error("the number of partitions would exceed {0}")]
    TooManyPartitions(usize),
    #[error(
        "{partitions} new partitions need about {needed} file descriptors, but {open} of this process's \
         {limit} (RLIMIT_NOFILE, `ulimit -n`) are open and {headroom} are kept free: room for {fit} more \
         partitions; raise the file-descriptor limit or create fewer partitions"
    )]
    FileDescriptorLimit { partitions: usize, needed: u64, open: u64, limit: u64, headroom: u64, fit: u64 },
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

/// Bound on partitions one broker hosts; every partition holds open files and maps.
pub const PARTITIONS_MAX: usize = 100_000;

/// Kafka's topic name rules: 1..=249 chars of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), TopicError> {
    if name.is_empty() || name == "." || name == ".." {
        return Err(TopicError::InvalidName(format!("{name:?} is not allowed")));
    }
    if name.len() > 249 {
        return Err(TopicError::InvalidName(format!("{} characters is longer than 249", name.len())));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(TopicError::InvalidName(format!("{name:?} contains {c:?}; only [a-zA-Z0-9._-] are allowed")));
    }
    Ok(())
}

/// Producer ids are reserved in blocks whose end is persisted before any id
/// of the block is handed out, so no id is ever reused, even after a crash.
const PRODUCER_ID_BLOCK_SIZE: i64 = 1000;

pub struct ReplicaManager {
    pub config: BrokerConfig,
    pub cluster_id: String,
    store: Mutex<MetadataStore>,
    /// (next producer id, end of the reserved block).
    producer_ids: Mutex<(i64, i64)>,
    topics: RwLock<Arc<TopicMap>>,
    dynamic: RwLock<DynamicBrokerConfigs>,
    /// In a cluster: every topic of the cluster with its partition count
    /// (hosted here or not), as of the last image applied.
    catalog: RwLock<Option<Arc<HashMap<String, i32>>>>,
    /// Whether the previous run of this broker stopped cleanly (its logs
    /// closed and flushed): a replica that crashed may have lost its
    /// unflushed tail, and the controller must not elect it from the
    /// eligible leader replicas (KIP-966).
    pub previous_clean_shutdown: bool,
}

/// Written after every log is closed on a clean stop and removed at start
/// (Kafka's `.kafka_cleanshutdown`).
pub const CLEAN_SHUTDOWN_FILE: &str = ".strand_cleanshutdown";

fn now_ms() -> i64 {
    crate::util::now_ms()
}

/// Threads that open one topic's partition logs side by side.
const OPEN_THREADS: usize = 8;

impl ReplicaManager {
    /// Loads metadata and opens (recovering as needed) every partition log.
    pub fn open(config: BrokerConfig) -> Result<ReplicaManager, TopicError> {
        let store = MetadataStore::open(&config.log_dir, config.node_id)?;
        let marker = config.log_dir.join(CLEAN_SHUTDOWN_FILE);
        let previous_clean_shutdown = marker.exists();
        if previous_clean_shutdown {
            // Gone before anything is written: a crash from now on is unclean.
            std::fs::remove_file(&marker)
                .and_then(|()| std::fs::File::open(&config.log_dir)?.sync_all())
                .map_err(|source| StorageError::Io { path: marker.clone(), source })?;
        }
        let dynamic = DynamicBrokerConfigs {
            cluster_default: store.image.broker_configs_cluster_default.clone(),
            this_broker: store.image.broker_configs_this_broker.clone(),
        };
        let mut map = TopicMap::default();
        let started = std::time::Instant::now();
        let checkpointed = hw_checkpoint::read(&config.log_dir);
        for (name, record) in &store.image.topics {
            let topic = Self::open_topic(&config, &dynamic, name, record, &checkpointed)?;
            map.insert(Arc::new(topic));
        }
        Self::remove_stale_dirs(&config.log_dir, &map);
        tracing::info!(topics = map.by_name.len(), elapsed_ms = started.elapsed().as_millis() as u64, "logs loaded");
        let block_end = store.image.producer_id_block_end;
        Ok(ReplicaManager {
            producer_ids: Mutex::new((block_end, block_end)),
            cluster_id: store.image.cluster_id.clone(),
            config,
            store: Mutex::new(store),
            topics: RwLock::new(Arc::new(map)),
            dynamic: RwLock::new(dynamic),
            catalog: RwLock::new(None),
            previous_clean_shutdown,
        })
    }

    fn partition_dir(config: &BrokerConfig, topic: &str, partition: i32) -> PathBuf {
        config.log_dir.join(format!("{topic}-{partition}"))
    }

    /// Opens partitions `first..record.partitions` of a topic (all of them for a new or loaded topic).
    fn open_partitions(
        config: &BrokerConfig,
        effective: &EffectiveTopicConfig,
        name: &str,
        first: i32,
        count: i32,
    ) -> Result<Vec<Arc<Partition>>, TopicError> {
        let open = |p: i32| -> Result<Arc<Partition>, TopicError> {
            let log = Log::open(Self::partition_dir(config, name, p), effective.log.clone(), now_ms())?;
            Ok(Arc::new(Partition::new(name, p, log, effective.min_insync_replicas)))
        };
        let n = (count - first).max(0) as usize;
        if n <= 1 {
            return (first..count).map(open).collect();
        }
        // Opening a log is mostly waiting for fsyncs (new files, the
        // checkpoint): a few threads overlap those waits, which is what makes
        // creating the 50-partition internal topics (and start-up) fast.
        let next = std::sync::atomic::AtomicI32::new(first);
        // After a failure the result is an error whatever the rest do: stop opening.
        let failed = std::sync::atomic::AtomicBool::new(false);
        let mut opened: Vec<(i32, Result<Arc<Partition>, TopicError>)> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..n.min(OPEN_THREADS))
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let p = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if p >= count || failed.load(std::sync::atomic::Ordering::Relaxed) {
                                return done;
                            }
                            let result = open(p);
                            if result.is_err() {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                            }
                            done.push((p, result));
                        }
                    })
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
        });
        opened.sort_by_key(|(p, _)| *p);
        if failed.into_inner() {
            // Workers stopped early, so indexes may be missing: report the first failure.
            let error = opened.into_iter().find_map(|(_, r)| r.err());
            return Err(error.expect("a failed open left its error"));
        }
        opened.into_iter().map(|(_, r)| r).collect()
    }

    /// Creates the logs of new partitions `first..count`, all or nothing: on
    /// failure every partition directory this call made is removed again.
    /// Returns the partitions and those directories (to remove if a later
    /// step of the operation fails).
    fn create_partition_logs(
        config: &BrokerConfig,
        effective: &EffectiveTopicConfig,
        name: &str,
        first: i32,
        count: i32,
    ) -> Result<(Vec<Arc<Partition>>, Vec<PathBuf>), TopicError> {
        // Only directories that do not exist yet are ours to remove: something
        // already at a partition's path (a stale directory, a stray file) is left alone.
        let made: Vec<PathBuf> = (first..count)
            .map(|p| Self::partition_dir(config, name, p))
            .filter(|dir| dir.symlink_metadata().is_err())
            .collect();
        match Self::open_partitions(config, effective, name, first, count) {
            // The logs opened before the failure are closed by now (dropped).
            Err(e) => {
                tracing::warn!(topic = name, first, count, error = %e, "cannot create partitions; removing what was made");
                Self::remove_dirs(&made);
                Err(e)
            }
            Ok(partitions) => Ok((partitions, made)),
        }
    }

    /// Removes directories a failed create made (their logs must be closed).
    fn remove_dirs(dirs: &[PathBuf]) {
        for dir in dirs {
            match std::fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot remove directory of a failed create")
                }
            }
        }
    }

    /// Refuses `partitions` new partitions up front when their open files
    /// would not fit under RLIMIT_NOFILE.
    fn check_fd_room(partitions: usize) -> Result<(), TopicError> {
        let Some(room) = fd_room::FdRoom::current() else { return Ok(()) };
        let fit = room.partitions_that_fit();
        if partitions as u64 <= fit {
            return Ok(());
        }
        Err(TopicError::FileDescriptorLimit {
            partitions,
            needed: partitions as u64 * fd_room::FDS_PER_PARTITION,
            open: room.open,
            limit: room.limit,
            headroom: fd_room::HEADROOM,
            fit,
        })
    }

    fn open_topic(
        config: &BrokerConfig,
        dynamic: &DynamicBrokerConfigs,
        name: &str,
        record: &TopicRecord,
        checkpointed: &HashMap<(String, i32), i64>,
    ) -> Result<Topic, TopicError> {
        let effective = topic_config::effective(config, dynamic, &record.configs);
        let partitions = match &record.hosted {
            None => Self::open_partitions(config, &effective, name, 0, record.partitions)?,
            Some(hosted) => Self::open_hosted(config, &effective, name, hosted, checkpointed)?,
        };
        Ok(Topic {
            name: name.to_string(),
            id: record.id,
            internal: record.internal,
            configs: record.configs.clone(),
            partitions,
            partition_count: record.partitions,
        })
    }

    /// Removes partition directories left behind by an interrupted topic deletion.
    fn remove_stale_dirs(log_dir: &std::path::Path, map: &TopicMap) {
        let Ok(entries) = std::fs::read_dir(log_dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if !entry.path().is_dir() {
                continue;
            }
            let hosted = name
                .rsplit_once('-')
                .and_then(|(t, p)| p.parse::<i32>().ok().map(|p| (t, p)))
                .is_some_and(|(t, p)| map.by_name.get(t).is_some_and(|topic| topic.partition(p).is_some()));
            if name.ends_with(".deleting") {
                if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                    tracing::warn!(dir = %entry.path().display(), error = %e, "cannot remove deleted partition directory");
                }
            } else if !hosted {
                tracing::warn!(dir = %entry.path().display(), "directory in log.dirs is not a partition of any known topic; left alone");
            }
        }
    }

    /// Records the cluster's topics and partition counts (from the image).
    pub fn set_catalog(&self, catalog: HashMap<String, i32>) {
        *self.catalog.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(catalog));
    }

    /// Whether this broker is a cluster node (the image has been applied).
    pub fn in_cluster(&self) -> bool {
        self.catalog.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Whether the partition exists: anywhere in the cluster, or here on a single node.
    pub fn partition_exists(&self, topic: &str, partition: i32) -> bool {
        let catalog = self.catalog.read().unwrap_or_else(|e| e.into_inner()).clone();
        match catalog {
            Some(c) => c.get(topic).is_some_and(|n| partition >= 0 && partition < *n),
            None => self.partition(topic, partition).is_some(),
        }
    }

    /// Topics created by a single-node broker (not placed by a cluster's controller).
    pub fn single_node_topics(&self) -> Vec<String> {
        let store = self.lock_store();
        store.image.topics.iter().filter(|(_, r)| r.hosted.is_none()).map(|(n, _)| n.clone()).collect()
    }

    pub fn topics(&self) -> Arc<TopicMap> {
        self.topics.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn topic(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics().by_name.get(name).cloned()
    }

    pub fn topic_by_id(&self, id: &Uuid) -> Option<Arc<Topic>> {
        self.topics().by_id.get(id).cloned()
    }

    pub fn partition(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        let t = self.topic(topic)?;
        t.partition(index).cloned()
    }

    pub fn dynamic_configs(&self) -> DynamicBrokerConfigs {
        self.dynamic.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn publish(&self, f: impl FnOnce(&mut TopicMap)) {
        let mut guard = self.topics.write().unwrap_or_else(|e| e.into_inner());
        let mut next = TopicMap { by_name: guard.by_name.clone(), by_id: guard.by_id.clone() };
        f(&mut next);
        *guard = Arc::new(next);
    }

    fn lock_store(&self) -> std::sync::MutexGuard<'_, MetadataStore> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn total_partitions(&self) -> usize {
        self.topics().by_name.values().map(|t| t.partitions.len()).sum()
    }

    /// Validates topic config overrides, returning them normalised.
    pub fn validate_configs(configs: &[(String, Option<String>)]) -> Result<BTreeMap<String, String>, TopicError> {
        let mut out = BTreeMap::new();
        for (k, v) in configs {
            let v = v.as_deref().ok_or_else(|| TopicError::InvalidConfig(format!("null value for {k}")))?;
            let norm = topic_config::validate_topic_value(k, v)
                .map_err(|e| TopicError::InvalidConfig(format!("{k}={v}: {e}")))?;
            out.insert(k.clone(), norm);
        }
        Ok(out)
    }

    /// Creates a topic. `validate_only` checks everything and changes nothing.
    pub fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<Arc<Topic>, TopicError> {
        validate_topic_name(name)?;
        let partitions = if partitions == -1 { self.config.num_partitions } else { partitions };
        let replication_factor =
            if replication_factor == -1 { self.config.default_replication_factor } else { replication_factor };
        if partitions <= 0 {
            return Err(TopicError::InvalidPartitions(format!(
                "number of partitions must be positive, got {partitions}"
            )));
        }
        if replication_factor <= 0 {
            return Err(TopicError::InvalidReplicationFactor(format!(
                "replication factor must be positive, got {replication_factor}"
            )));
        }
        if replication_factor > 1 {
            return Err(TopicError::InvalidReplicationFactor(format!(
                "replication factor {replication_factor} is larger than the 1 available broker"
            )));
        }
        let mut store = self.lock_store();
        if store.image.topics.contains_key(name) {
            return Err(TopicError::AlreadyExists(name.to_string()));
        }
        if let Some(existing) = store.image.topics.keys().find(|t| t.replace('.', "_") == name.replace('.', "_")) {
            return Err(TopicError::InvalidName(format!(
                "{name} collides with existing topic {existing} ('.' and '_' collide)"
            )));
        }
        if self.total_partitions() + partitions as usize > PARTITIONS_MAX {
            return Err(TopicError::TooManyPartitions(PARTITIONS_MAX));
        }
        Self::check_fd_room(partitions as usize)?;
        let record =
            TopicRecord { id: Uuid::new_v4(), partitions, configs, internal: name.starts_with("__"), hosted: None };
        if validate_only {
            return Ok(Arc::new(Topic {
                name: name.into(),
                id: record.id,
                internal: record.internal,
                configs: record.configs,
                partitions: Vec::new(),
                partition_count: partitions,
            }));
        }
        let effective = topic_config::effective(&self.config, &self.dynamic_configs(), &record.configs);
        let (opened, made) = Self::create_partition_logs(&self.config, &effective, name, 0, partitions)?;
        let topic = Arc::new(Topic {
            name: name.to_string(),
            id: record.id,
            internal: record.internal,
            configs: record.configs.clone(),
            partitions: opened,
            partition_count: partitions,
        });
        store.image.topics.insert(name.to_string(), record);
        if let Err(e) = store.save() {
            store.image.topics.remove(name);
            drop(topic); // closes the logs: nothing else holds the unpublished topic
            Self::remove_dirs(&made);
            return Err(e.into());
        }
        self.publish(|m| m.insert(topic.clone()));
        tracing::info!(topic = name, partitions, "topic created");
        Ok(topic)
    }

    /// Deletes a topic and its logs.
    pub fn delete_topic(&self, name: &str) -> Result<Uuid, TopicError> {
        if !self.config.delete_topic_enable {
            return Err(TopicError::DeletionDisabled);
        }
        self.remove_topic(name)
    }

    /// Makes this broker host exactly `hosted` of topic `name` (id `id`,
    /// `count` partitions) with these config overrides, as the cluster's
    /// metadata image says: opens (creating) the partitions newly placed
    /// here, removes those placed elsewhere, and replaces a local topic of
    /// the same name but another id (a deleted and recreated topic never
    /// sees the old data). A no-op when nothing differs.
    pub fn host_topic(
        &self,
        name: &str,
        id: Uuid,
        count: i32,
        hosted: &[i32],
        configs: &BTreeMap<String, String>,
    ) -> Result<(), TopicError> {
        let current = self.topic(name);
        if let Some(t) = current.as_ref().filter(|t| t.id != id) {
            tracing::info!(topic = name, old_id = %t.id, new_id = %id, "topic recreated in the cluster; removing the old one");
            self.remove_topic(name)?;
            return self.host_topic(name, id, count, hosted, configs);
        }
        let mut wanted: Vec<i32> = hosted.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        let have: Vec<i32> =
            current.as_ref().map(|t| t.partitions.iter().map(|p| p.index).collect()).unwrap_or_default();
        let same_configs = current.as_ref().is_some_and(|t| &t.configs == configs);
        if have == wanted && same_configs && current.as_ref().is_some_and(|t| t.partition_count == count) {
            return Ok(());
        }
        let mut store = self.lock_store();
        let record = TopicRecord {
            id,
            partitions: count,
            configs: configs.clone(),
            internal: name.starts_with("__"),
            hosted: Some(wanted.clone()),
        };
        let effective = topic_config::effective(&self.config, &self.dynamic_configs(), configs);
        let new: Vec<i32> = wanted.iter().copied().filter(|p| !have.contains(p)).collect();
        Self::check_fd_room(new.len())?;
        let opened = Self::open_hosted(&self.config, &effective, name, &new, &HashMap::new())?;
        let previous = store.image.topics.insert(name.to_string(), record);
        if let Err(e) = store.save() {
            match previous {
                Some(r) => store.image.topics.insert(name.to_string(), r),
                None => store.image.topics.remove(name),
            };
            return Err(e.into());
        }
        let mut partitions: Vec<Arc<Partition>> = Vec::with_capacity(wanted.len());
        let mut dropped = Vec::new();
        for p in current.iter().flat_map(|t| t.partitions.iter()) {
            if wanted.contains(&p.index) {
                partitions.push(p.clone());
            } else {
                dropped.push(p.clone());
            }
        }
        partitions.extend(opened);
        partitions.sort_by_key(|p| p.index);
        let topic = Arc::new(Topic {
            name: name.to_string(),
            id,
            internal: name.starts_with("__"),
            configs: configs.clone(),
            partitions,
            partition_count: count,
        });
        if !same_configs {
            self.apply_configs(&topic)?;
        }
        self.publish(|m| m.insert(topic));
        drop(store);
        for p in dropped {
            if let Err(e) = p.delete() {
                tracing::warn!(topic = name, partition = p.index, error = %e, "cannot remove partition directory");
            }
        }
        tracing::info!(topic = name, %id, partitions = count, hosted = ?wanted, "hosting partitions");
        Ok(())
    }

    /// Opens (creating where new) the listed partitions of a topic, sorted by index.
    fn open_hosted(
        config: &BrokerConfig,
        effective: &EffectiveTopicConfig,
        name: &str,
        hosted: &[i32],
        checkpointed: &HashMap<(String, i32), i64>,
    ) -> Result<Vec<Arc<Partition>>, TopicError> {
        let mut sorted = hosted.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        sorted
            .into_iter()
            .map(|p| {
                let log = Log::open(Self::partition_dir(config, name, p), effective.log.clone(), now_ms())?;
                let hw = checkpointed.get(&(name.to_string(), p)).copied().unwrap_or(0);
                Ok(Arc::new(Partition::new_replica(name, p, log, effective.min_insync_replicas, config.node_id, hw)))
            })
            .collect()
    }

    /// Writes every cluster partition's high watermark to
    /// `replication-offset-checkpoint` (periodically and at shutdown).
    pub fn checkpoint_high_watermarks(&self) {
        let mut entries = Vec::new();
        for topic in self.topics().by_name.values() {
            for p in &topic.partitions {
                entries.push((topic.name.clone(), p.index, p.high_watermark()));
            }
        }
        entries.sort();
        if let Err(e) = hw_checkpoint::write(&self.config.log_dir, &entries) {
            tracing::warn!(dir = %self.config.log_dir.display(), error = %e, "cannot write the high-watermark checkpoint");
        }
    }

    /// Removes a topic and its local logs (a deletion, or a topic the
    /// cluster no longer places here).
    pub fn remove_topic(&self, name: &str) -> Result<Uuid, TopicError> {
        let mut store = self.lock_store();
        let record = store.image.topics.remove(name).ok_or_else(|| TopicError::Unknown(name.to_string()))?;
        store.save()?;
        let mut removed = None;
        self.publish(|m| removed = m.remove(name));
        if let Some(topic) = removed {
            for p in &topic.partitions {
                if let Err(e) = p.delete() {
                    tracing::warn!(topic = name, partition = p.index, error = %e, "cannot remove partition directory");
                }
            }
        }
        tracing::info!(topic = name, "topic deleted");
        Ok(record.id)
    }

    /// Grows a topic to `count` partitions.
    pub fn create_partitions(&self, name: &str, count: i32, validate_only: bool) -> Result<(), TopicError> {
        let mut store = self.lock_store();
        let record = store.image.topics.get(name).cloned().ok_or_else(|| TopicError::Unknown(name.to_string()))?;
        if count < record.partitions {
            return Err(TopicError::InvalidPartitions(format!(
                "topic {name} has {} partitions; partitions can only be added",
                record.partitions
            )));
        }
        if count == record.partitions {
            return Err(TopicError::InvalidPartitions(format!("topic {name} already has {count} partitions")));
        }
        if self.total_partitions() + (count - record.partitions) as usize > PARTITIONS_MAX {
            return Err(TopicError::TooManyPartitions(PARTITIONS_MAX));
        }
        Self::check_fd_room((count - record.partitions) as usize)?;
        if validate_only {
            return Ok(());
        }
        let current = self.topic(name).ok_or_else(|| TopicError::Unknown(name.to_string()))?;
        let effective = topic_config::effective(&self.config, &self.dynamic_configs(), &record.configs);
        let (added, made) = Self::create_partition_logs(&self.config, &effective, name, record.partitions, count)?;
        let new_record = TopicRecord { partitions: count, ..record.clone() };
        store.image.topics.insert(name.to_string(), new_record);
        if let Err(e) = store.save() {
            store.image.topics.insert(name.to_string(), record);
            drop(added);
            Self::remove_dirs(&made);
            return Err(e.into());
        }
        let mut partitions = current.partitions.clone();
        partitions.extend(added);
        let topic = Arc::new(Topic {
            name: current.name.clone(),
            id: current.id,
            internal: current.internal,
            configs: current.configs.clone(),
            partitions,
            partition_count: count,
        });
        self.publish(|m| m.insert(topic));
        tracing::info!(topic = name, partitions = count, "partitions added");
        Ok(())
    }

    /// Replaces a topic's config overrides (already validated).
    pub fn set_topic_configs(&self, name: &str, configs: BTreeMap<String, String>) -> Result<(), TopicError> {
        let mut store = self.lock_store();
        let record = store.image.topics.get_mut(name).ok_or_else(|| TopicError::Unknown(name.to_string()))?;
        let previous = std::mem::replace(&mut record.configs, configs.clone());
        if let Err(e) = store.save() {
            if let Some(r) = store.image.topics.get_mut(name) {
                r.configs = previous;
            }
            return Err(e.into());
        }
        let current = self.topic(name).ok_or_else(|| TopicError::Unknown(name.to_string()))?;
        let topic = Arc::new(Topic {
            name: current.name.clone(),
            id: current.id,
            internal: current.internal,
            configs,
            partitions: current.partitions.clone(),
            partition_count: current.partition_count,
        });
        self.apply_configs(&topic)?;
        self.publish(|m| m.insert(topic));
        Ok(())
    }

    /// Replaces the dynamic broker configs (already validated) and reapplies every topic's settings.
    pub fn set_dynamic_broker_configs(
        &self,
        cluster_default: bool,
        configs: BTreeMap<String, String>,
    ) -> Result<(), TopicError> {
        let mut store = self.lock_store();
        {
            let mut dynamic = self.dynamic.write().unwrap_or_else(|e| e.into_inner());
            if cluster_default {
                store.image.broker_configs_cluster_default = configs.clone();
                dynamic.cluster_default = configs;
            } else {
                store.image.broker_configs_this_broker = configs.clone();
                dynamic.this_broker = configs;
            }
        }
        store.save()?;
        for topic in self.topics().by_name.values() {
            self.apply_configs(topic)?;
        }
        Ok(())
    }

    fn apply_configs(&self, topic: &Topic) -> Result<(), TopicError> {
        let effective = topic_config::effective(&self.config, &self.dynamic_configs(), &topic.configs);
        for p in &topic.partitions {
            // Gone or offline: nothing to configure; only storage errors matter.
            if let Err(PartitionError::Storage(e)) = p.set_config(effective.log.clone(), effective.min_insync_replicas)
            {
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// A producer id never handed out before (InitProducerId).
    pub fn allocate_producer_id(&self) -> Result<i64, TopicError> {
        let mut ids = self.producer_ids.lock().unwrap_or_else(|e| e.into_inner());
        if ids.0 >= ids.1 {
            let mut store = self.lock_store();
            let end = ids.0 + PRODUCER_ID_BLOCK_SIZE;
            store.image.producer_id_block_end = end;
            store.save()?;
            ids.1 = end;
        }
        let id = ids.0;
        ids.0 += 1;
        Ok(id)
    }

    /// One scrubbing pass: every partition verifies the cold segments that
    /// are due, reading at most `scrub.bytes_per_second` (paced by sleeping
    /// on this blocking thread). Stops early when `stop` turns true. Returns
    /// the bytes verified.
    pub fn scrub(&self, scrub: &crate::config::ScrubConfig, stop: &dyn Fn() -> bool) -> u64 {
        let started = std::time::Instant::now();
        let mut total = 0u64;
        let rate = scrub.bytes_per_second.max(1) as f64;
        let mut pace = |bytes: u64| {
            total += bytes;
            loop {
                if stop() {
                    return false;
                }
                let ahead = total as f64 / rate - started.elapsed().as_secs_f64();
                if ahead <= 0.0 {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_secs_f64(ahead.min(0.1)));
            }
        };
        let mut verified = 0;
        for topic in self.topics().by_name.values() {
            for p in &topic.partitions {
                // Each partition until nothing of it is due, then the next.
                loop {
                    if stop() {
                        return verified;
                    }
                    match p.scrub(now_ms(), scrub.interval_ms, &mut pace) {
                        Ok(0) => break,
                        Ok(bytes) => verified += bytes,
                        Err(PartitionError::Storage(e)) => {
                            tracing::warn!(topic = %topic.name, partition = p.index, error = %e, "scrub failed");
                            break;
                        }
                        Err(_) => break,
                    }
                }
            }
        }
        verified
    }

    /// Periodic flush and retention over every partition; with `checkpoint`,
    /// unflushed data is fsynced and the recovery points persisted.
    pub fn maintain(&self, retention: bool, checkpoint: bool) {
        let now = now_ms();
        for topic in self.topics().by_name.values() {
            for p in &topic.partitions {
                if let Err(PartitionError::Storage(e)) = p.maintain(now, retention, checkpoint) {
                    tracing::error!(topic = %topic.name, partition = p.index, error = %e, "log maintenance failed");
                }
            }
        }
    }

    /// One cleaning pass over every compacted partition that is dirty enough.
    pub fn clean_compacted(&self) {
        let now = now_ms();
        for topic in self.topics().by_name.values() {
            for p in &topic.partitions {
                if !p.is_compacted() {
                    continue;
                }
                match p.clean(now, false) {
                    Ok(Some(stats)) if stats.segments_cleaned > 0 => tracing::info!(
                        topic = %topic.name,
                        partition = p.index,
                        segments = stats.segments_cleaned,
                        bytes_before = stats.bytes_before,
                        bytes_after = stats.bytes_after,
                        records_removed = stats.records_removed,
                        "compacted"
                    ),
                    Err(PartitionError::Storage(e)) => {
                        tracing::error!(topic = %topic.name, partition = p.index, error = %e, "compaction failed")
                    }
                    Ok(_) | Err(_) => {}
                }
            }
        }
    }

    /// Flushes and closes every log (clean shutdown).
    pub fn close(&self) {
        if self.in_cluster() {
            self.checkpoint_high_watermarks();
        }
        let mut clean = true;
        for topic in self.topics().by_name.values() {
            for p in &topic.partitions {
                if let Err(e) = p.close() {
                    clean = false;
                    tracing::error!(topic = %topic.name, partition = p.index, error = %e, "log close failed");
                }
            }
        }
        if clean {
            let marker = self.config.log_dir.join(CLEAN_SHUTDOWN_FILE);
            let written = std::fs::File::create(&marker)
                .and_then(|f| f.sync_all())
                .and_then(|()| std::fs::File::open(&self.config.log_dir)?.sync_all());
            if let Err(e) = written {
                tracing::warn!(file = %marker.display(), error = %e, "cannot record the clean shutdown");
            }
        }
    }
}
