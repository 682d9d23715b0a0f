//! `server.properties` parsing into a typed [`BrokerConfig`].
//!
//! The format is Java's properties format as Kafka uses it: `key=value` (or
//! `key: value`), `#` and `!` comments, blank lines. Keys keep Kafka's names
//! and defaults. An unknown key is logged and ignored; an invalid value
//! refuses start-up with an error naming the key and the line.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use strand_storage::LogConfig;

/// A config error that names what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{origin}: invalid value {value:?} for {key}: {reason}")]
    Invalid { origin: String, key: String, value: String, reason: String },
    #[error("{origin}: cannot parse line {line:?}: expected key=value")]
    Syntax { origin: String, line: String },
    #[error("invalid override {0:?}: expected key=value")]
    Override(String),
}

/// One listener, e.g. `PLAINTEXT://127.0.0.1:9092`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    pub host: String,
    pub port: u16,
}

impl Listener {
    fn parse(text: &str) -> Result<Listener, String> {
        let (name, rest) = text.split_once("://").ok_or("expected NAME://host:port")?;
        let (host, port) = rest.rsplit_once(':').ok_or("expected NAME://host:port")?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port.parse().map_err(|_| format!("bad port {port:?}"))?;
        if name.is_empty() {
            return Err("listener name is empty".into());
        }
        Ok(Listener { name: name.to_string(), host: host.to_string(), port })
    }

    /// Address to bind; an empty host means all interfaces.
    pub fn bind_addr(&self) -> Result<SocketAddr, String> {
        let host = if self.host.is_empty() { "0.0.0.0" } else { &self.host };
        let host = if host == "localhost" { "127.0.0.1" } else { host };
        format!("{host}:{}", self.port)
            .parse()
            .or_else(|_| format!("[{host}]:{}", self.port).parse())
            .map_err(|_| format!("cannot bind to host {host:?} (give an IP address)"))
    }
}

/// The broker's settings. Field names follow Kafka's keys; units come last.
/// The scrubber: re-reads cold segments (every sealed segment, and the part
/// of the active one written before this process opened it) and checks each
/// batch's CRC-32C and offsets, at a bounded read rate; a damaged partition
/// is taken offline (KAFKA_STORAGE_ERROR) rather than served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubConfig {
    /// `log.scrub.enable` (true).
    pub enable: bool,
    /// `log.scrub.bytes.per.second` (16 MiB/s): the scrubber's read rate.
    pub bytes_per_second: u64,
    /// `log.scrub.interval.ms` (7 days): a segment is verified again this
    /// long after its last verification. Segments found on disk at start-up
    /// and not verified by recovery are verified first.
    pub interval_ms: i64,
}

impl Default for ScrubConfig {
    fn default() -> Self {
        ScrubConfig { enable: true, bytes_per_second: 16 << 20, interval_ms: 7 * 24 * 3600 * 1000 }
    }
}

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub node_id: i32,
    /// Listeners the broker binds (PLAINTEXT only).
    pub listeners: Vec<Listener>,
    /// Listeners given to clients in Metadata; defaults to `listeners`.
    pub advertised_listeners: Vec<Listener>,
    pub log_dir: PathBuf,
    pub num_partitions: i32,
    pub default_replication_factor: i16,
    pub auto_create_topics_enable: bool,
    pub delete_topic_enable: bool,
    /// Defaults for every topic's log (`log.*` keys).
    pub log: LogConfig,
    pub log_cleanup_policy: String,
    pub min_insync_replicas: i32,
    /// `unclean.leader.election.enable` (false): whether a partition whose
    /// whole ISR is gone is given to a replica outside it (losing data).
    pub unclean_leader_election_enable: bool,
    pub log_retention_check_interval_ms: u64,
    /// `log.flush.offset.checkpoint.interval.ms`: how often unflushed data is
    /// fsynced in the background and the recovery point persisted, so a
    /// crash recovers only what came after.
    pub log_flush_offset_checkpoint_interval_ms: u64,
    /// `log.scrub.*`: the background verifier of cold segments.
    pub scrub: ScrubConfig,
    pub socket_request_max_bytes: usize,
    /// `replica.lag.time.max.ms`: a follower not caught up for this long leaves the ISR.
    pub replica_lag_time_max_ms: u64,
    /// `connections.max.idle.ms`: a connection with no complete request for
    /// this long (and none being handled or answered) is closed. `None` (-1): never.
    pub connections_max_idle_ms: Option<u64>,
    /// `queued.max.request.bytes`: bytes of requests being received or handled,
    /// across all connections, before connections stop reading. `None` (-1): no bound.
    pub queued_max_request_bytes: Option<usize>,
    pub max_connections: usize,
    /// Tokio worker threads; `num.io.threads` in Kafka terms. 0 = one per core.
    pub num_io_threads: usize,
    /// Largest number of fetch sessions cached (`max.incremental.fetch.session.cache.slots`).
    pub fetch_session_cache_slots: usize,
    /// Upper bound on a fetch response, whatever the client asks (`fetch.max.bytes`).
    pub fetch_max_bytes: usize,
    /// `producer.id.expiration.ms`: idle producers' state is dropped after this.
    pub producer_id_expiration_ms: i64,
    /// Consumer group coordinator settings.
    pub group: GroupSettings,
    /// Log cleaner (compaction) settings.
    pub cleaner: CleanerSettings,
    /// Transaction coordinator settings.
    pub txn: crate::txn::TxnSettings,
    /// Where each key came from, for DescribeConfigs.
    pub explicit_keys: BTreeMap<String, String>,
    /// KRaft-style cluster keys; `None` without `controller.quorum.voters`
    /// (the single node).
    pub quorum: Option<QuorumSettings>,
    /// `broker.rack`, for rack-aware placement.
    pub rack: Option<String>,
}

/// A node's role (`process.roles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessRoles {
    pub broker: bool,
    pub controller: bool,
}

/// A voter of the metadata quorum (`controller.quorum.voters`: `id@host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Voter {
    pub id: i32,
    pub host: String,
    pub port: u16,
}

/// The cluster keys, with Kafka's names and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumSettings {
    pub roles: ProcessRoles,
    pub voters: Vec<Voter>,
    /// The listener named by `controller.listener.names` (controllers bind it).
    pub controller_listener: Option<Listener>,
    /// `inter.broker.listener.name` (default: the first listener).
    pub inter_broker_listener_name: String,
    /// `broker.heartbeat.interval.ms` (2000).
    pub heartbeat_interval_ms: u64,
    /// `broker.session.timeout.ms` (9000).
    pub session_timeout_ms: u64,
    /// `metadata.log.dir` (default: the first log directory).
    pub metadata_log_dir: PathBuf,
    /// `leader.imbalance.check.interval.seconds` (300) in ms while
    /// `auto.leader.rebalance.enable` (true); `None` when that is false.
    pub leader_rebalance_interval_ms: Option<u64>,
    /// `unclean.leader.election.enable`, for the controller (see
    /// [`BrokerConfig::unclean_leader_election_enable`]).
    pub unclean_leader_election: bool,
    /// `min.insync.replicas`, for the controller's eligible leader replicas.
    pub min_insync_replicas: i32,
    /// Seeds the controller's ids (topic ids, hence placement) so a test
    /// run repeats; not a server.properties key (random when `None`).
    pub seed: Option<u64>,
}

impl QuorumSettings {
    /// `process.roles=controller`: a voter that serves no clients.
    pub fn is_controller_only(&self) -> bool {
        self.roles.controller && !self.roles.broker
    }

    /// How soon after a broker's connection to the controller breaks it is
    /// fenced if it stays silent: one heartbeat interval and a second more
    /// (a live broker reconnects with its next heartbeat), when that is
    /// shorter than the session; otherwise only the session counts.
    pub fn connection_loss_grace_ms(&self) -> Option<u64> {
        let grace = self.heartbeat_interval_ms + 1000;
        (grace < self.session_timeout_ms).then_some(grace)
    }

    /// A single combined node that is the only voter: today's single node.
    pub fn is_single_node(&self, node_id: i32) -> bool {
        self.roles.broker && self.roles.controller && self.voters.len() == 1 && self.voters[0].id == node_id
    }
}

/// Group coordinator settings, with Kafka's keys and defaults.
#[derive(Debug, Clone)]
pub struct GroupSettings {
    /// `offsets.topic.num.partitions`: partitions of `__consumer_offsets` (fixed once created).
    pub offsets_topic_num_partitions: i32,
    /// `offsets.topic.segment.bytes`.
    pub offsets_topic_segment_bytes: u64,
    /// `offsets.topic.replication.factor` in a cluster, at most the brokers
    /// registered when the topic is created (a single node keeps one copy).
    pub offsets_topic_replication_factor: i16,
    /// `offsets.retention.minutes`, in ms: how long an empty group's offsets are kept.
    pub offsets_retention_ms: i64,
    /// `offsets.retention.check.interval.ms`.
    pub offsets_retention_check_interval_ms: u64,
    /// `offset.metadata.max.bytes`: longest commit metadata string.
    pub offset_metadata_max_bytes: usize,
    /// `group.min.session.timeout.ms` / `group.max.session.timeout.ms`.
    pub min_session_timeout_ms: i32,
    pub max_session_timeout_ms: i32,
    /// `group.max.size`: members per group.
    pub max_size: usize,
    /// `group.initial.rebalance.delay.ms`: wait for more members when an empty group first rebalances.
    pub initial_rebalance_delay_ms: i32,
    /// `group.max.count` (Strand): groups per broker, a bound Kafka lacks.
    pub max_count: usize,
}

impl Default for GroupSettings {
    fn default() -> Self {
        GroupSettings {
            offsets_topic_num_partitions: 50,
            offsets_topic_segment_bytes: 104_857_600,
            offsets_topic_replication_factor: 3,
            offsets_retention_ms: 7 * 24 * 3600 * 1000,
            offsets_retention_check_interval_ms: 600_000,
            offset_metadata_max_bytes: 4096,
            min_session_timeout_ms: 6000,
            max_session_timeout_ms: 1_800_000,
            max_size: 10_000,
            initial_rebalance_delay_ms: 3000,
            max_count: 100_000,
        }
    }
}

/// Log cleaner settings (Kafka's `log.cleaner.*`).
#[derive(Debug, Clone)]
pub struct CleanerSettings {
    /// `log.cleaner.enable`.
    pub enable: bool,
    /// `log.cleaner.backoff.ms`: pause between cleaning passes.
    pub backoff_ms: u64,
    /// `log.cleaner.min.cleanable.ratio`, in per mille.
    pub min_cleanable_ratio_per_mille: u32,
    /// `log.cleaner.delete.retention.ms`: how long tombstones survive cleaning.
    pub delete_retention_ms: i64,
}

impl Default for CleanerSettings {
    fn default() -> Self {
        CleanerSettings {
            enable: true,
            backoff_ms: 15_000,
            min_cleanable_ratio_per_mille: 500,
            delete_retention_ms: 86_400_000,
        }
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        let listener = Listener { name: "PLAINTEXT".into(), host: "127.0.0.1".into(), port: 9092 };
        BrokerConfig {
            node_id: 1,
            listeners: vec![listener.clone()],
            advertised_listeners: vec![listener],
            log_dir: PathBuf::from("./data"),
            num_partitions: 1,
            default_replication_factor: 1,
            auto_create_topics_enable: true,
            delete_topic_enable: true,
            log: LogConfig::default(),
            log_cleanup_policy: "delete".into(),
            min_insync_replicas: 1,
            unclean_leader_election_enable: false,
            log_retention_check_interval_ms: 300_000,
            log_flush_offset_checkpoint_interval_ms: 60_000,
            scrub: ScrubConfig::default(),
            socket_request_max_bytes: 104_857_600,
            replica_lag_time_max_ms: 30_000,
            connections_max_idle_ms: Some(600_000),
            // Kafka's default is -1 (no bound); one largest-possible request
            // (socket.request.max.bytes' default) keeps memory bounded out of the box.
            queued_max_request_bytes: Some(104_857_600),
            max_connections: 10_000,
            num_io_threads: 0,
            fetch_session_cache_slots: 1000,
            fetch_max_bytes: 57_671_680,
            producer_id_expiration_ms: 86_400_000,
            group: GroupSettings::default(),
            cleaner: CleanerSettings::default(),
            txn: crate::txn::TxnSettings::default(),
            explicit_keys: BTreeMap::new(),
            quorum: None,
            rack: None,
        }
    }
}

/// Keys Kafka users commonly set that Strand accepts but has no use for yet
/// (KRaft quorum wiring of a single node, share groups).
/// They are logged at info level instead of as unknown.
const ACCEPTED_UNUSED_KEYS: &[&str] = &[
    "controller.quorum.bootstrap.servers",
    "listener.security.protocol.map",
    "num.network.threads",
    "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes",
    "num.recovery.threads.per.data.dir",
    "share.coordinator.state.topic.replication.factor",
    "share.coordinator.state.topic.min.isr",
    // Only Kafka's ZooKeeper controller gated automatic preferred-leader
    // elections on this ratio; KRaft's (and Strand's) has none.
    "leader.imbalance.per.broker.percentage",
];

impl BrokerConfig {
    /// Reads a properties file and applies `overrides` (each `key=value`) on top.
    pub fn load(path: &Path, overrides: &[String]) -> Result<BrokerConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Self::from_properties(&text, &path.display().to_string(), overrides)
    }

    /// Parses properties text; `origin` names the source in errors.
    pub fn from_properties(text: &str, origin: &str, overrides: &[String]) -> Result<BrokerConfig, ConfigError> {
        let mut entries: Vec<(String, String, String)> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let split = line.find(['=', ':']).ok_or_else(|| ConfigError::Syntax {
                origin: format!("{origin} line {}", index + 1),
                line: line.to_string(),
            })?;
            let key = line[..split].trim().to_string();
            let value = line[split + 1..].trim().to_string();
            entries.push((key, value, format!("{origin} line {}", index + 1)));
        }
        for o in overrides {
            let (k, v) = o.split_once('=').ok_or_else(|| ConfigError::Override(o.clone()))?;
            entries.push((k.trim().to_string(), v.trim().to_string(), format!("--override {o}")));
        }
        let mut config = BrokerConfig::default();
        let mut advertised_set = false;
        let mut flush_ms_set = false;
        let mut roll_ms_set = false;
        let mut retention_set_by: u8 = 0; // 3 = ms, 2 = minutes, 1 = hours: the finest unit wins
        let mut controller_listener_names: Vec<String> = Vec::new();
        let mut roles: Option<(ProcessRoles, String)> = None;
        let mut voters: Option<(Vec<Voter>, String)> = None;
        let mut inter_broker_listener_name: Option<String> = None;
        let mut heartbeat_interval_ms = 2000;
        let mut session_timeout_ms = 9000;
        let mut auto_leader_rebalance = true;
        let mut leader_imbalance_check_interval_ms: u64 = 300_000;
        let mut metadata_log_dir: Option<PathBuf> = None;
        for (key, value, at) in &entries {
            let invalid = |reason: String| ConfigError::Invalid {
                origin: at.clone(),
                key: key.clone(),
                value: value.clone(),
                reason,
            };
            config.explicit_keys.insert(key.clone(), value.clone());
            match key.as_str() {
                "node.id" | "broker.id" => {
                    config.node_id = parse_int(value, 0, i32::MAX as i64).map_err(invalid)? as i32
                }
                "listeners" => config.listeners = parse_listeners(value).map_err(invalid)?,
                "advertised.listeners" => {
                    config.advertised_listeners = parse_listeners(value).map_err(invalid)?;
                    advertised_set = true;
                }
                "log.dirs" | "log.dir" => {
                    let dirs: Vec<&str> = value.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
                    match dirs.as_slice() {
                        [one] => config.log_dir = PathBuf::from(one),
                        [] => return Err(invalid("no directory given".into())),
                        _ => return Err(invalid("only one log directory is supported".into())),
                    }
                }
                "num.partitions" => config.num_partitions = parse_int(value, 1, 100_000).map_err(invalid)? as i32,
                "default.replication.factor" => {
                    config.default_replication_factor = parse_int(value, 1, i16::MAX as i64).map_err(invalid)? as i16
                }
                "auto.create.topics.enable" => config.auto_create_topics_enable = parse_bool(value).map_err(invalid)?,
                "delete.topic.enable" => config.delete_topic_enable = parse_bool(value).map_err(invalid)?,
                "log.segment.bytes" => {
                    config.log.segment_bytes = parse_int(value, 14, i32::MAX as i64).map_err(invalid)? as u64
                }
                "log.roll.ms" => {
                    config.log.roll_ms = parse_int(value, 1, i64::MAX).map_err(invalid)?;
                    roll_ms_set = true;
                }
                "log.roll.hours" if !roll_ms_set => {
                    config.log.roll_ms = parse_int(value, 1, i32::MAX as i64).map_err(invalid)? * 3_600_000
                }
                "log.roll.hours" => {}
                "log.retention.ms" => {
                    config.log.retention_ms = parse_int(value, -1, i64::MAX).map_err(invalid)?;
                    retention_set_by = 3;
                }
                "log.retention.minutes" if retention_set_by < 3 => {
                    config.log.retention_ms = scale(parse_int(value, -1, i32::MAX as i64).map_err(invalid)?, 60_000);
                    retention_set_by = 2;
                }
                "log.retention.hours" if retention_set_by < 2 => {
                    config.log.retention_ms = scale(parse_int(value, -1, i32::MAX as i64).map_err(invalid)?, 3_600_000);
                    retention_set_by = 1;
                }
                "log.retention.minutes" | "log.retention.hours" => {}
                "log.retention.bytes" => {
                    config.log.retention_bytes = parse_int(value, -1, i64::MAX).map_err(invalid)?
                }
                "log.index.interval.bytes" => {
                    config.log.index_interval_bytes = parse_int(value, 0, i32::MAX as i64).map_err(invalid)? as u32
                }
                "log.index.size.max.bytes" => {
                    config.log.index_max_bytes = parse_int(value, 4096, i32::MAX as i64).map_err(invalid)? as u32
                }
                "log.flush.interval.messages" => {
                    config.log.flush_interval_messages = parse_int(value, 1, i64::MAX).map_err(invalid)? as u64
                }
                "log.flush.interval.ms" => {
                    config.log.flush_interval_ms = parse_int(value, 0, i64::MAX).map_err(invalid)?;
                    flush_ms_set = true;
                }
                "log.flush.scheduler.interval.ms" if !flush_ms_set => {
                    config.log.flush_interval_ms = parse_int(value, 0, i64::MAX).map_err(invalid)?
                }
                "log.flush.scheduler.interval.ms" => {}
                "log.flush.offset.checkpoint.interval.ms" => {
                    config.log_flush_offset_checkpoint_interval_ms =
                        parse_int(value, 1, i64::MAX).map_err(invalid)? as u64
                }
                "log.scrub.enable" => config.scrub.enable = parse_bool(value).map_err(invalid)?,
                "log.scrub.bytes.per.second" => {
                    config.scrub.bytes_per_second = parse_int(value, 1, i64::MAX).map_err(invalid)? as u64
                }
                "log.scrub.interval.ms" => config.scrub.interval_ms = parse_int(value, 1, i64::MAX).map_err(invalid)?,
                "log.retention.check.interval.ms" => {
                    config.log_retention_check_interval_ms = parse_int(value, 1, i64::MAX).map_err(invalid)? as u64
                }
                "log.cleanup.policy" => config.log_cleanup_policy = parse_cleanup_policy(value).map_err(invalid)?,
                "message.max.bytes" => {
                    config.log.max_batch_bytes = parse_int(value, 0, i32::MAX as i64).map_err(invalid)? as usize
                }
                "min.insync.replicas" => {
                    config.min_insync_replicas = parse_int(value, 1, i32::MAX as i64).map_err(invalid)? as i32
                }
                "unclean.leader.election.enable" => {
                    config.unclean_leader_election_enable = parse_bool(value).map_err(invalid)?
                }
                "socket.request.max.bytes" => {
                    config.socket_request_max_bytes = parse_int(value, 1024, i32::MAX as i64).map_err(invalid)? as usize
                }
                "replica.lag.time.max.ms" => {
                    config.replica_lag_time_max_ms = parse_int(value, 1, i64::from(i32::MAX)).map_err(invalid)? as u64
                }
                "connections.max.idle.ms" => {
                    config.connections_max_idle_ms = parse_positive_or_off(value).map_err(invalid)?.map(|v| v as u64)
                }
                "queued.max.request.bytes" => {
                    config.queued_max_request_bytes = parse_positive_or_off(value).map_err(invalid)?.map(|v| v as usize)
                }
                "max.connections" => {
                    config.max_connections = parse_int(value, 1, i32::MAX as i64).map_err(invalid)? as usize
                }
                "num.io.threads" => config.num_io_threads = parse_int(value, 1, 1024).map_err(invalid)? as usize,
                "max.incremental.fetch.session.cache.slots" => {
                    config.fetch_session_cache_slots = parse_int(value, 0, i32::MAX as i64).map_err(invalid)? as usize
                }
                "fetch.max.bytes" => {
                    config.fetch_max_bytes = parse_int(value, 1024, i32::MAX as i64).map_err(invalid)? as usize
                }
                "offsets.topic.num.partitions" => {
                    config.group.offsets_topic_num_partitions = parse_int(value, 1, 10_000).map_err(invalid)? as i32
                }
                "offsets.topic.segment.bytes" => {
                    config.group.offsets_topic_segment_bytes =
                        parse_int(value, 14, i32::MAX as i64).map_err(invalid)? as u64
                }
                "offsets.topic.replication.factor" => {
                    config.group.offsets_topic_replication_factor =
                        parse_int(value, 1, i16::MAX as i64).map_err(invalid)? as i16
                }
                "transaction.state.log.replication.factor" => {
                    config.txn.replication_factor = parse_int(value, 1, i16::MAX as i64).map_err(invalid)? as i16
                }
                "transaction.state.log.min.isr" => {
                    config.txn.min_isr = parse_int(value, 1, i16::MAX as i64).map_err(invalid)? as i32
                }
                "transaction.state.log.segment.bytes" => {
                    config.txn.segment_bytes = parse_int(value, 14, i32::MAX as i64).map_err(invalid)? as u64
                }
                "offsets.retention.minutes" => {
                    config.group.offsets_retention_ms = parse_int(value, 1, i32::MAX as i64).map_err(invalid)? * 60_000
                }
                "offsets.retention.check.interval.ms" => {
                    config.group.offsets_retention_check_interval_ms =
                        parse_int(value, 1, i64::MAX).map_err(invalid)? as u64
                }
                "offset.metadata.max.bytes" => {
                    config.group.offset_metadata_max_bytes =
                        parse_int(value, 0, i32::MAX as i64).map_err(invalid)? as usize
                }
                "group.min.session.timeout.ms" => {
                    config.group.min_session_timeout_ms = parse_int(value, 1, i32::MAX as i64).map_err(invalid)? as i32
                }
                "group.max.session.timeout.ms" => {
                    config.group.max_session_timeout_ms = parse_int(value, 1, i32::MAX as i64).map_err(invalid)? as i32
                }
                "group.max.size" => {
                    config.group.max_size = parse_int(value, 1, i32::MAX as i64).map_err(invalid)? as usize
                }
                "group.initial.rebalance.delay.ms" => {
                    config.group.initial_rebalance_delay_ms =
                        parse_int(value, 0, i32::MAX as i64).map_err(invalid)? as i32
                }
                "group.max.count" => {
                    config.group.max_count = parse_int(value, 1, i32::MAX as i64).map_err(invalid)? as usize
                }
                "transaction.state.log.num.partitions" => {
                    config.txn.num_partitions = parse_int(value, 1, 10_000).map_err(invalid)? as i32
                }
                "transaction.max.timeout.ms" => {
                    config.txn.max_timeout_ms = parse_int(value, 1, i32::MAX as i64).map_err(invalid)? as i32
                }
                "transaction.abort.timed.out.transaction.cleanup.interval.ms" => {
                    config.txn.abort_check_interval_ms = parse_int(value, 1, i64::MAX).map_err(invalid)? as u64
                }
                "transactional.id.expiration.ms" => {
                    config.txn.id_expiration_ms = parse_int(value, 1, i64::MAX).map_err(invalid)?
                }
                "producer.id.expiration.ms" => {
                    config.producer_id_expiration_ms = parse_int(value, 1, i64::MAX).map_err(invalid)?
                }
                "log.cleaner.enable" => config.cleaner.enable = parse_bool(value).map_err(invalid)?,
                "log.cleaner.backoff.ms" => {
                    config.cleaner.backoff_ms = parse_int(value, 1, i64::MAX).map_err(invalid)? as u64
                }
                "log.cleaner.min.cleanable.ratio" => {
                    let ratio: f64 = value.trim().parse().map_err(|_| invalid("not a number".into()))?;
                    if !(0.0..=1.0).contains(&ratio) {
                        return Err(invalid("must be between 0 and 1".into()));
                    }
                    config.cleaner.min_cleanable_ratio_per_mille = (ratio * 1000.0).round() as u32;
                }
                "log.cleaner.delete.retention.ms" => {
                    config.cleaner.delete_retention_ms = parse_int(value, 0, i64::MAX).map_err(invalid)?
                }
                // A KRaft combined node lists its controller listener in `listeners`;
                // Strand has no separate controller endpoint, so it is not bound.
                "controller.listener.names" => {
                    controller_listener_names =
                        value.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
                }
                "process.roles" => roles = Some((parse_roles(value).map_err(invalid)?, at.clone())),
                "controller.quorum.voters" => voters = Some((parse_voters(value).map_err(invalid)?, at.clone())),
                "inter.broker.listener.name" => inter_broker_listener_name = Some(value.clone()),
                "broker.heartbeat.interval.ms" => {
                    heartbeat_interval_ms = parse_int(value, 10, i32::MAX as i64).map_err(invalid)? as u64
                }
                "broker.session.timeout.ms" => {
                    session_timeout_ms = parse_int(value, 10, i32::MAX as i64).map_err(invalid)? as u64
                }
                "metadata.log.dir" => metadata_log_dir = Some(PathBuf::from(value)),
                "auto.leader.rebalance.enable" => auto_leader_rebalance = parse_bool(value).map_err(invalid)?,
                "leader.imbalance.check.interval.seconds" => {
                    leader_imbalance_check_interval_ms =
                        parse_int(value, 1, i32::MAX as i64).map_err(invalid)? as u64 * 1000
                }
                "broker.rack" => config.rack = Some(value.clone()).filter(|r| !r.is_empty()),
                k if ACCEPTED_UNUSED_KEYS.contains(&k) => {
                    tracing::info!(key = k, origin = %at, "config key accepted but not used by Strand");
                }
                k => tracing::warn!(key = k, origin = %at, "unknown config key ignored"),
            }
        }
        let controller_listener =
            config.listeners.iter().find(|l| controller_listener_names.contains(&l.name)).cloned();
        let invalid_at = |at: &str, key: &str, value: String, reason: String| ConfigError::Invalid {
            origin: at.to_string(),
            key: key.to_string(),
            value,
            reason,
        };
        if let Some((voters, voters_at)) = voters {
            let (roles, _) = roles.ok_or_else(|| {
                invalid_at(
                    &voters_at,
                    "process.roles",
                    String::new(),
                    "a node with controller.quorum.voters must say its process.roles \
                     (broker, controller, or broker,controller)"
                        .into(),
                )
            })?;
            let voters_text = || voters.iter().map(|v| format!("{}@{}:{}", v.id, v.host, v.port)).collect::<Vec<_>>();
            if !roles.controller && voters.iter().any(|v| v.id == config.node_id) {
                return Err(invalid_at(
                    &voters_at,
                    "controller.quorum.voters",
                    voters_text().join(","),
                    format!(
                        "this node (node.id={}) is a voter, so process.roles must include controller \
                         (broker-only nodes are not voters)",
                        config.node_id
                    ),
                ));
            }
            if roles.controller {
                if !voters.iter().any(|v| v.id == config.node_id) {
                    return Err(invalid_at(
                        &voters_at,
                        "controller.quorum.voters",
                        voters_text().join(","),
                        format!("this node (node.id={}) is a controller but not one of the voters", config.node_id),
                    ));
                }
                if controller_listener.is_none() {
                    return Err(invalid_at(
                        origin,
                        "controller.listener.names",
                        controller_listener_names.join(","),
                        "a controller needs a listener named in controller.listener.names among `listeners` \
                         (e.g. listeners=PLAINTEXT://:9092,CONTROLLER://:9093 and controller.listener.names=CONTROLLER)"
                            .into(),
                    ));
                }
            }
            if heartbeat_interval_ms >= session_timeout_ms {
                return Err(invalid_at(
                    origin,
                    "broker.heartbeat.interval.ms",
                    heartbeat_interval_ms.to_string(),
                    format!("must be below broker.session.timeout.ms ({session_timeout_ms})"),
                ));
            }
            let data_listeners: Vec<&Listener> =
                config.listeners.iter().filter(|l| !controller_listener_names.contains(&l.name)).collect();
            let inter = match inter_broker_listener_name {
                Some(name) if data_listeners.iter().any(|l| l.name == name) => name,
                Some(name) => {
                    return Err(invalid_at(
                        origin,
                        "inter.broker.listener.name",
                        name,
                        "names no broker listener in `listeners`".into(),
                    ))
                }
                None => data_listeners.first().map(|l| l.name.clone()).unwrap_or_default(),
            };
            config.quorum = Some(QuorumSettings {
                roles,
                voters,
                controller_listener: controller_listener.clone(),
                inter_broker_listener_name: inter,
                heartbeat_interval_ms,
                session_timeout_ms,
                metadata_log_dir: metadata_log_dir.unwrap_or_else(|| config.log_dir.clone()),
                leader_rebalance_interval_ms: auto_leader_rebalance.then_some(leader_imbalance_check_interval_ms),
                unclean_leader_election: config.unclean_leader_election_enable,
                min_insync_replicas: config.min_insync_replicas,
                seed: None,
            });
        } else if let Some((r, at)) = roles {
            if !(r.broker && r.controller) {
                return Err(invalid_at(
                    &at,
                    "process.roles",
                    format!("{r:?}"),
                    "a node without controller.quorum.voters is a single combined node (broker,controller)".into(),
                ));
            }
        }
        config.listeners.retain(|l| !controller_listener_names.contains(&l.name));
        config.advertised_listeners.retain(|l| !controller_listener_names.contains(&l.name));
        if !advertised_set {
            config.advertised_listeners = config
                .listeners
                .iter()
                .map(|l| {
                    let host =
                        if l.host.is_empty() || l.host == "0.0.0.0" { "localhost".into() } else { l.host.clone() };
                    Listener { host, ..l.clone() }
                })
                .collect();
        }
        config.validate(origin)?;
        Ok(config)
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid = |key: &str, value: String, reason: &str| ConfigError::Invalid {
            origin: origin.to_string(),
            key: key.to_string(),
            value,
            reason: reason.to_string(),
        };
        if self.group.min_session_timeout_ms > self.group.max_session_timeout_ms {
            return Err(invalid(
                "group.min.session.timeout.ms",
                self.group.min_session_timeout_ms.to_string(),
                "must not exceed group.max.session.timeout.ms",
            ));
        }
        let controller_only = self.quorum.as_ref().is_some_and(|q| q.roles.controller && !q.roles.broker);
        if self.listeners.is_empty() && !controller_only {
            return Err(invalid("listeners", String::new(), "at least one listener is required"));
        }
        for l in &self.listeners {
            l.bind_addr().map_err(|r| invalid("listeners", format!("{}://{}:{}", l.name, l.host, l.port), &r))?;
        }
        if self.advertised_listeners.iter().any(|a| !self.listeners.iter().any(|l| l.name == a.name)) {
            return Err(invalid(
                "advertised.listeners",
                format!("{:?}", self.advertised_listeners.iter().map(|l| &l.name).collect::<Vec<_>>()),
                "every advertised listener must name a listener in `listeners`",
            ));
        }
        Ok(())
    }

    /// The advertised listener clients are told about for connections that
    /// arrived on listener `name` (Kafka answers with the same listener name).
    pub fn advertised_for(&self, name: &str) -> &Listener {
        self.advertised_listeners.iter().find(|l| l.name == name).unwrap_or(&self.advertised_listeners[0])
    }
}

fn scale(v: i64, factor: i64) -> i64 {
    if v < 0 {
        -1
    } else {
        v.saturating_mul(factor)
    }
}

fn parse_roles(value: &str) -> Result<ProcessRoles, String> {
    let mut roles = ProcessRoles { broker: false, controller: false };
    for part in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match part {
            "broker" => roles.broker = true,
            "controller" => roles.controller = true,
            other => return Err(format!("unknown role {other:?} (broker, controller)")),
        }
    }
    if !roles.broker && !roles.controller {
        return Err("no role given".into());
    }
    Ok(roles)
}

fn parse_voters(value: &str) -> Result<Vec<Voter>, String> {
    let mut out: Vec<Voter> = Vec::new();
    for part in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = part.split_once('@').ok_or_else(|| format!("{part:?}: expected id@host:port"))?;
        let id = parse_int(id, 0, i32::MAX as i64).map_err(|e| format!("{part:?}: node id {e}"))? as i32;
        let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("{part:?}: expected id@host:port"))?;
        let port: u16 = port.parse().map_err(|_| format!("{part:?}: bad port {port:?}"))?;
        if out.iter().any(|v| v.id == id) {
            return Err(format!("node id {id} appears twice"));
        }
        if out.iter().any(|v| v.host == host && v.port == port) {
            return Err(format!("{host}:{port} is given to two voters"));
        }
        out.push(Voter { id, host: host.trim_matches(['[', ']']).to_string(), port });
    }
    if out.is_empty() {
        return Err("no voter given".into());
    }
    Ok(out)
}

fn parse_listeners(value: &str) -> Result<Vec<Listener>, String> {
    let mut out = Vec::new();
    for part in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let l = Listener::parse(part)?;
        if out.iter().any(|o: &Listener| o.name == l.name) {
            return Err(format!("listener name {} appears twice", l.name));
        }
        if l.name == "SSL" || l.name.starts_with("SASL") {
            return Err(format!("{} is not supported; only plaintext listeners are", l.name));
        }
        out.push(l);
    }
    if out.is_empty() {
        return Err("no listener given".into());
    }
    Ok(out)
}

/// Parses a Kafka integer setting within `[min, max]`.
pub fn parse_int(value: &str, min: i64, max: i64) -> Result<i64, String> {
    let v: i64 = value.trim().parse().map_err(|_| "not an integer".to_string())?;
    if v < min || v > max {
        return Err(format!("must be between {min} and {max}"));
    }
    Ok(v)
}

/// A positive integer, or -1 for "off" (Kafka's spelling for no limit).
pub fn parse_positive_or_off(value: &str) -> Result<Option<i64>, String> {
    match parse_int(value, -1, i64::MAX) {
        Ok(-1) => Ok(None),
        Ok(0) => Err("must be positive, or -1 for no limit".into()),
        Ok(v) => Ok(Some(v)),
        Err(_) => Err(format!("must be between 1 and {}, or -1 for no limit", i64::MAX)),
    }
}

pub fn parse_bool(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("must be true or false".into()),
    }
}

/// `cleanup.policy`: a list of `delete` and/or `compact`.
pub fn parse_cleanup_policy(value: &str) -> Result<String, String> {
    let mut parts: Vec<&str> = value.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if parts.is_empty() || parts.iter().any(|p| *p != "delete" && *p != "compact") {
        return Err("must be a list of delete and/or compact".into());
    }
    parts.sort();
    parts.dedup();
    Ok(parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kafka_style_file_with_overrides() {
        let text = "# comment\nnode.id=3\nlisteners=PLAINTEXT://127.0.0.1:9093\nlog.dirs=/tmp/x\n\
                    log.retention.hours=1\nlog.segment.bytes: 1048576\nsomething.unknown=1\n";
        let c = BrokerConfig::from_properties(text, "t", &["num.partitions=4".into()]).unwrap();
        assert_eq!(c.node_id, 3);
        assert_eq!(c.listeners[0].port, 9093);
        assert_eq!(c.advertised_listeners[0].host, "127.0.0.1");
        assert_eq!(c.log.retention_ms, 3_600_000);
        assert_eq!(c.log.segment_bytes, 1_048_576);
        assert_eq!(c.num_partitions, 4);
        assert_eq!(c.log_dir, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn invalid_value_names_key_and_line() {
        let err = BrokerConfig::from_properties("node.id=1\nnum.partitions=zero\n", "server.properties", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.properties line 2"), "{err}");
        assert!(err.contains("num.partitions"), "{err}");
    }

    #[test]
    fn connection_limits_parse_with_kafka_spellings() {
        let c = BrokerConfig::default();
        assert_eq!((c.connections_max_idle_ms, c.queued_max_request_bytes), (Some(600_000), Some(104_857_600)));
        let c = BrokerConfig::from_properties("connections.max.idle.ms=300\nqueued.max.request.bytes=-1\n", "t", &[])
            .unwrap();
        assert_eq!((c.connections_max_idle_ms, c.queued_max_request_bytes), (Some(300), None));
        for bad in ["connections.max.idle.ms=0", "queued.max.request.bytes=lots", "queued.max.request.bytes=-2"] {
            let err = BrokerConfig::from_properties(bad, "server.properties", &[]).unwrap_err().to_string();
            let key = bad.split('=').next().unwrap();
            assert!(err.contains(key) && err.contains("line 1"), "{err}");
        }
    }

    #[test]
    fn finest_retention_unit_wins_whatever_the_order() {
        let c = BrokerConfig::from_properties("log.retention.ms=5\nlog.retention.hours=1\n", "t", &[]).unwrap();
        assert_eq!(c.log.retention_ms, 5);
    }

    #[test]
    fn kraft_combined_node_file_is_accepted_without_its_controller_listener() {
        let text = "process.roles=broker,controller\nnode.id=1\ncontroller.quorum.voters=1@localhost:9093\n\
                    listeners=PLAINTEXT://:9092,CONTROLLER://:9093\ncontroller.listener.names=CONTROLLER\n\
                    advertised.listeners=PLAINTEXT://localhost:9092\n";
        let c = BrokerConfig::from_properties(text, "t", &[]).unwrap();
        assert_eq!(c.listeners.len(), 1);
        assert_eq!(c.listeners[0].name, "PLAINTEXT");
        assert_eq!(c.advertised_listeners[0].host, "localhost");
    }

    #[test]
    fn quorum_keys_are_parsed_and_bad_ones_named() {
        let base = "process.roles=broker,controller\nnode.id=2\n\
                    listeners=PLAINTEXT://127.0.0.1:9192,CONTROLLER://127.0.0.1:9193\n\
                    controller.listener.names=CONTROLLER\n";
        let ok = format!("{base}controller.quorum.voters=1@127.0.0.1:9093,2@127.0.0.1:9193,3@127.0.0.1:9293\n");
        let c = BrokerConfig::from_properties(&ok, "t", &[]).unwrap();
        let q = c.quorum.unwrap();
        assert_eq!(q.voters.len(), 3);
        assert_eq!(q.controller_listener.as_ref().unwrap().port, 9193);
        assert_eq!(q.inter_broker_listener_name, "PLAINTEXT");
        assert_eq!((q.heartbeat_interval_ms, q.session_timeout_ms), (2000, 9000));
        assert!(!q.roles.broker || !q.is_single_node(2));
        let err = |text: &str| BrokerConfig::from_properties(text, "t", &[]).unwrap_err().to_string();
        let e = err(&format!("{base}controller.quorum.voters=1@h:1,3@h:3\n"));
        assert!(e.contains("controller.quorum.voters") && e.contains("node.id=2"), "{e}");
        let e = err(&format!("{base}controller.quorum.voters=1@h:1,1@h:2\n"));
        assert!(e.contains("appears twice"), "{e}");
        let e =
            err("process.roles=controller\nnode.id=1\ncontroller.quorum.voters=1@h:1\nlisteners=PLAINTEXT://:9092\n");
        assert!(e.contains("controller.listener.names"), "{e}");
        let e = err("node.id=1\ncontroller.quorum.voters=1@h:1\n");
        assert!(e.contains("process.roles"), "{e}");
        let e = err("process.roles=broker\n");
        assert!(e.contains("process.roles"), "{e}");
        let e = err(&format!("{ok}broker.heartbeat.interval.ms=9000\n"));
        assert!(e.contains("broker.heartbeat.interval.ms"), "{e}");
    }

    #[test]
    fn refuses_tls_listeners_and_bad_lines() {
        assert!(BrokerConfig::from_properties("listeners=SSL://127.0.0.1:9093\n", "t", &[]).is_err());
        assert!(BrokerConfig::from_properties("just-a-word\n", "t", &[]).is_err());
        assert!(BrokerConfig::from_properties("", "t", &["nonsense".into()]).is_err());
    }
}
