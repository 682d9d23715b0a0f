//! Consumer groups (issue 3) judged by real clients and raw requests.
//!
//! Goal: groups of librdkafka consumers share partitions, rebalance when a
//! member dies or joins, commit offsets that survive a broker restart, static
//! members (KIP-345) come back without disturbing the others, bad requests get
//! Kafka's error codes and change nothing, and the admin APIs (ListGroups,
//! DescribeGroups, DeleteGroups) show and remove groups.
//!
//! Method: an in-process broker on 127.0.0.1:0 per test with
//! `group.initial.rebalance.delay.ms=0`, `group.min.session.timeout.ms=1000`
//! and `offsets.topic.num.partitions=5`; librdkafka consumers run on their own
//! threads (one, in the first test, in a child process killed with SIGKILL so
//! that it never sends LeaveGroup); raw requests are built with the
//! kafka-protocol crate at the highest version both the broker and the helper
//! support. Every wait is a deadline-bounded poll of a condition. Rebalance
//! times are measured and printed, never asserted.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use common::*;
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::consumer_protocol_assignment::{self, ConsumerProtocolAssignment};
use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

/// Broker overrides for every group test (see the module comment).
const GROUP_OVERRIDES: &[&str] =
    &["group.initial.rebalance.delay.ms=0", "group.min.session.timeout.ms=1000", "offsets.topic.num.partitions=5"];

// Kafka error codes used below.
const NONE: i16 = 0;
const OFFSET_METADATA_TOO_LARGE: i16 = 12;
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
const COORDINATOR_NOT_AVAILABLE: i16 = 15;
const ILLEGAL_GENERATION: i16 = 22;
const UNKNOWN_MEMBER_ID: i16 = 25;
const INVALID_SESSION_TIMEOUT: i16 = 26;
const REBALANCE_IN_PROGRESS: i16 = 27;
const NON_EMPTY_GROUP: i16 = 68;
const GROUP_ID_NOT_FOUND: i16 = 69;
const MEMBER_ID_REQUIRED: i16 = 79;
const FENCED_INSTANCE_ID: i16 = 82;

// ---------------------------------------------------------------------------
// Producing keyed records
// ---------------------------------------------------------------------------

fn record_key(i: usize) -> String {
    format!("k{i:06}")
}

fn record_value(i: usize) -> String {
    format!("value-{i}-{}", "x".repeat(i % 13))
}

#[derive(Default)]
struct Deliveries {
    ok: Mutex<HashMap<usize, (i32, i64)>>,
    failed: Mutex<Vec<String>>,
}

struct DeliveryCtx(Arc<Deliveries>);
impl ClientContext for DeliveryCtx {}
impl ProducerContext for DeliveryCtx {
    type DeliveryOpaque = Box<usize>;
    fn delivery(&self, result: &DeliveryResult<'_>, index: Self::DeliveryOpaque) {
        match result {
            Ok(m) => {
                self.0.ok.lock().unwrap().insert(*index, (m.partition(), m.offset()));
            }
            Err((e, _)) => self.0.failed.lock().unwrap().push(format!("record {index}: {e}")),
        }
    }
}

/// Produces `count` keyed records (acks=all, default partitioner) and returns
/// (partition, offset) → record index from the delivery reports.
fn produce_keyed(bootstrap: &str, topic: &str, count: usize) -> HashMap<(i32, i64), usize> {
    let deliveries = Arc::new(Deliveries::default());
    let producer: ThreadedProducer<DeliveryCtx> = producer_config(bootstrap)
        .set("queue.buffering.max.messages", "200000")
        .create_with_context(DeliveryCtx(deliveries.clone()))
        .expect("producer");
    for i in 0..count {
        let (k, v) = (record_key(i), record_value(i));
        let mut record = BaseRecord::with_opaque_to(topic, Box::new(i)).key(&k).payload(&v);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((rdkafka::error::KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => panic!("send {i}: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(120)).expect("flush");
    let failed = deliveries.failed.lock().unwrap();
    assert!(failed.is_empty(), "{} deliveries failed, first: {:?}", failed.len(), failed.first());
    let ok = deliveries.ok.lock().unwrap();
    assert_eq!(ok.len(), count, "every record acknowledged");
    ok.iter().map(|(i, po)| (*po, *i)).collect()
}

async fn produce_keyed_async(bootstrap: &str, topic: &str, count: usize) -> Arc<HashMap<(i32, i64), usize>> {
    let (b, t) = (bootstrap.to_string(), topic.to_string());
    Arc::new(tokio::task::spawn_blocking(move || produce_keyed(&b, &t, count)).await.expect("producer thread"))
}

/// Log end offset of each partition.
async fn log_ends(bootstrap: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let mut out = BTreeMap::new();
    for p in 0..partitions {
        out.insert(p, watermarks(bootstrap, topic, p).await.1);
    }
    out
}

// ---------------------------------------------------------------------------
// librdkafka group members on threads
// ---------------------------------------------------------------------------

/// What a member thread observed: rebalance callbacks, processed records, errors.
#[derive(Default)]
struct MemberState {
    assigned: Mutex<BTreeSet<i32>>,
    assigns: AtomicUsize,
    revokes: AtomicUsize,
    last_assign: Mutex<Option<Instant>>,
    rebalance_errors: Mutex<Vec<String>>,
    consumer_errors: Mutex<Vec<String>>,
    commit_errors: Mutex<Vec<String>>,
    commits: AtomicUsize,
    processed: AtomicUsize,
}

impl MemberState {
    fn assigned(&self) -> BTreeSet<i32> {
        self.assigned.lock().unwrap().clone()
    }
    fn assigned_since(&self, t: Instant) -> Option<BTreeSet<i32>> {
        let last = (*self.last_assign.lock().unwrap())?;
        (last > t).then(|| self.assigned())
    }
    fn summary(&self, name: &str) -> String {
        let errs = |m: &Mutex<Vec<String>>| {
            let v = m.lock().unwrap();
            format!("{} (first: {:?})", v.len(), v.first())
        };
        format!(
            "{name}: assigned {:?}, {} assigns, {} revokes, {} processed, {} commits, commit errors {}, \
             consumer errors {}, rebalance errors {}",
            self.assigned(),
            self.assigns.load(Ordering::SeqCst),
            self.revokes.load(Ordering::SeqCst),
            self.processed.load(Ordering::SeqCst),
            self.commits.load(Ordering::SeqCst),
            errs(&self.commit_errors),
            errs(&self.consumer_errors),
            errs(&self.rebalance_errors),
        )
    }
}

struct Tracked(Arc<MemberState>);
impl ClientContext for Tracked {}
impl ConsumerContext for Tracked {
    fn pre_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(_) => {
                self.0.revokes.fetch_add(1, Ordering::SeqCst);
                self.0.assigned.lock().unwrap().clear();
            }
            Rebalance::Error(e) => self.0.rebalance_errors.lock().unwrap().push(e.to_string()),
            Rebalance::Assign(_) => {}
        }
    }
    fn post_rebalance(&self, _c: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            *self.0.assigned.lock().unwrap() = tpl.elements().iter().map(|e| e.partition()).collect();
            *self.0.last_assign.lock().unwrap() = Some(Instant::now());
            self.0.assigns.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Consumer config for a subscribing group member: manual synchronous commits,
/// short session (the broker minimum is overridden to 1000 ms), fast heartbeats.
fn member_config(bootstrap: &str, group: &str, client_id: &str, session_ms: u32) -> ClientConfig {
    let mut c = base_config(bootstrap);
    c.set("group.id", group)
        .set("client.id", client_id)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("check.crcs", "true")
        .set("session.timeout.ms", session_ms.to_string())
        .set("heartbeat.interval.ms", "300");
    c
}

/// (partition, offset) → how many times a record was processed, across members.
type Seen = Arc<Mutex<HashMap<(i32, i64), u32>>>;

/// A member thread: subscribes, processes every record (checks its key
/// against the delivery reports), commits synchronously after every 500
/// records and whenever a poll comes back empty, until `stop`.
struct Member {
    state: Arc<MemberState>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Member {
    fn spawn(config: ClientConfig, topic: &str, seen: Seen, delivered: Arc<HashMap<(i32, i64), usize>>) -> Member {
        let state = Arc::new(MemberState::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, topic) = (state.clone(), stop.clone(), topic.to_string());
        let thread = std::thread::spawn(move || {
            let consumer: BaseConsumer<Tracked> =
                config.create_with_context(Tracked(st.clone())).expect("group consumer");
            consumer.subscribe(&[&topic]).expect("subscribe");
            member_loop(&consumer, &topic, &st, &sp, &seen, &delivered);
            // Dropping the consumer closes it (LeaveGroup for dynamic members).
        });
        Member { state, stop, thread }
    }

    /// Stops the thread and waits until its consumer is closed.
    fn stop(self) -> Arc<MemberState> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("member thread");
        self.state
    }
}

fn member_loop(
    consumer: &BaseConsumer<Tracked>,
    topic: &str,
    st: &MemberState,
    stop: &AtomicBool,
    seen: &Mutex<HashMap<(i32, i64), u32>>,
    delivered: &HashMap<(i32, i64), usize>,
) {
    let mut pending: BTreeMap<i32, i64> = BTreeMap::new();
    let mut since_commit = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let idle = match consumer.poll(Duration::from_millis(100)) {
            None => true,
            Some(Ok(m)) => {
                let (p, o) = (m.partition(), m.offset());
                let expected = delivered.get(&(p, o)).map(|i| record_key(*i));
                let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
                if key != expected {
                    st.consumer_errors.lock().unwrap().push(format!("{p}@{o}: key {key:?}, acknowledged {expected:?}"));
                }
                *seen.lock().unwrap().entry((p, o)).or_default() += 1;
                st.processed.fetch_add(1, Ordering::SeqCst);
                pending.insert(p, o + 1);
                since_commit += 1;
                false
            }
            Some(Err(e)) => {
                st.consumer_errors.lock().unwrap().push(e.to_string());
                true
            }
        };
        if pending.is_empty() || !(idle || since_commit >= 500) {
            continue;
        }
        // Only commit partitions still owned; a revoked partition's
        // uncommitted records are re-read by its new owner (at least once).
        let owned: BTreeSet<i32> =
            consumer.assignment().map(|t| t.elements().iter().map(|e| e.partition()).collect()).unwrap_or_default();
        pending.retain(|p, _| owned.contains(p));
        if pending.is_empty() {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in &pending {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*o)).expect("tpl");
        }
        match consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => {
                pending.clear();
                since_commit = 0;
                st.commits.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => st.commit_errors.lock().unwrap().push(e.to_string()),
        }
    }
}

/// Waits until every member has been assigned after `since` (if given) and the
/// members' assignments are disjoint and cover `0..partitions`. Returns them.
async fn wait_assignment(
    what: &str,
    members: &[&MemberState],
    extra: &[&dyn Fn() -> Option<BTreeSet<i32>>],
    since: Option<Instant>,
    partitions: i32,
    timeout: Duration,
) -> Vec<BTreeSet<i32>> {
    wait_for(what, timeout, Duration::from_millis(20), || {
        let mut sets = Vec::new();
        for m in members {
            let s = match since {
                Some(t) => m.assigned_since(t),
                None => (m.assigns.load(Ordering::SeqCst) > 0).then(|| m.assigned()),
            };
            sets.push(s);
        }
        for f in extra {
            sets.push(f());
        }
        let out = async move {
            let sets: Vec<BTreeSet<i32>> = sets.into_iter().collect::<Option<_>>()?;
            let total: usize = sets.iter().map(|s| s.len()).sum();
            let union: BTreeSet<i32> = sets.iter().flatten().copied().collect();
            (total == partitions as usize && union == (0..partitions).collect()).then_some(sets)
        };
        out
    })
    .await
}

// ---------------------------------------------------------------------------
// Raw protocol group client
// ---------------------------------------------------------------------------

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn gid(v: &str) -> GroupId {
    GroupId(s(v))
}

fn tname(v: &str) -> TopicName {
    TopicName(s(v))
}

/// Consumer-protocol subscription metadata for `topic` (what a Java consumer sends).
fn subscription(topic: &str) -> Bytes {
    let sub = ConsumerProtocolSubscription::default().with_topics(vec![s(topic)]);
    let mut buf = BytesMut::new();
    buf.put_i16(1);
    sub.encode(&mut buf, 1).expect("subscription encodes");
    buf.freeze()
}

fn assignment_bytes(topic: &str, partitions: &[i32]) -> Bytes {
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
        consumer_protocol_assignment::TopicPartition::default()
            .with_topic(tname(topic))
            .with_partitions(partitions.to_vec()),
    ]);
    let mut buf = BytesMut::new();
    buf.put_i16(1);
    a.encode(&mut buf, 1).expect("assignment encodes");
    buf.freeze()
}

/// Partitions in a consumer-protocol assignment.
fn decode_assignment(bytes: &[u8]) -> BTreeSet<(String, i32)> {
    let mut buf = Bytes::copy_from_slice(bytes);
    let version = bytes::Buf::get_i16(&mut buf);
    let a = ConsumerProtocolAssignment::decode(&mut buf, version.min(3)).expect("assignment decodes");
    a.assigned_partitions
        .iter()
        .flat_map(|tp| tp.partitions.iter().map(move |p| (tp.topic.0.to_string(), *p)))
        .collect()
}

/// A raw connection that negotiated API versions with the broker.
struct RawGroup {
    conn: RawConn,
    versions: HashMap<i16, i16>,
}

/// One partition's committed offset as OffsetFetch reports it.
#[derive(Debug, Clone, PartialEq)]
struct Committed {
    offset: i64,
    metadata: Option<String>,
    error: i16,
}

impl RawGroup {
    async fn connect(addr: std::net::SocketAddr) -> RawGroup {
        let mut conn = RawConn::connect(addr).await;
        let req = ApiVersionsRequest::default()
            .with_client_software_name(s("strand-group-test"))
            .with_client_software_version(s("1"));
        let resp = conn.call(&req, 3).await;
        assert_eq!(resp.error_code, NONE, "ApiVersions");
        let versions = resp.api_keys.iter().map(|k| (k.api_key, k.max_version)).collect();
        RawGroup { conn, versions }
    }

    /// The highest version both sides support, capped at `cap`; at least `floor`.
    fn version<R: Request>(&self, floor: i16, cap: i16) -> i16 {
        let key = ApiKey::try_from(R::KEY).expect("known key");
        let max = *self.versions.get(&R::KEY).unwrap_or_else(|| panic!("the broker does not advertise {key:?}"));
        let v = max.min(cap).min(R::VERSIONS.max);
        assert!(v >= floor, "{key:?}: the broker advertises up to v{max}, the test needs v{floor}+");
        v
    }

    fn advertises(&self, key: ApiKey, version: i16) -> bool {
        self.versions.get(&(key as i16)).is_some_and(|max| *max >= version)
    }

    /// FindCoordinator for a group: (error, node id, host, port).
    async fn find_coordinator(&mut self, group: &str) -> (i16, i32, String, i32) {
        let v = self.version::<FindCoordinatorRequest>(1, 6);
        let mut req = FindCoordinatorRequest::default().with_key_type(0);
        if v >= 4 {
            req = req.with_coordinator_keys(vec![s(group)]);
            let resp = self.conn.call(&req, v).await;
            assert_eq!(resp.coordinators.len(), 1, "one coordinator per key");
            let c = &resp.coordinators[0];
            assert_eq!(c.key.as_str(), group);
            (c.error_code, c.node_id.0, c.host.to_string(), c.port)
        } else {
            req = req.with_key(s(group));
            let resp = self.conn.call(&req, v).await;
            (resp.error_code, resp.node_id.0, resp.host.to_string(), resp.port)
        }
    }

    async fn join(
        &mut self,
        group: &str,
        member: &str,
        instance: Option<&str>,
        session_ms: i32,
        topic: &str,
    ) -> JoinGroupResponse {
        let v = self.version::<JoinGroupRequest>(5, 9);
        self.join_at(v, group, member, instance, session_ms, topic).await
    }

    async fn join_at(
        &mut self,
        version: i16,
        group: &str,
        member: &str,
        instance: Option<&str>,
        session_ms: i32,
        topic: &str,
    ) -> JoinGroupResponse {
        let req = join_request(group, member, instance, session_ms, topic);
        self.conn.call(&req, version).await
    }

    async fn sync(
        &mut self,
        group: &str,
        generation: i32,
        member: &str,
        instance: Option<&str>,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncGroupResponse {
        let v = self.version::<SyncGroupRequest>(3, 5);
        let req = SyncGroupRequest::default()
            .with_group_id(gid(group))
            .with_generation_id(generation)
            .with_member_id(s(member))
            .with_group_instance_id(instance.map(s))
            .with_protocol_type(Some(s("consumer")))
            .with_protocol_name(Some(s("range")))
            .with_assignments(
                assignments
                    .into_iter()
                    .map(|(m, a)| SyncGroupRequestAssignment::default().with_member_id(s(&m)).with_assignment(a))
                    .collect(),
            );
        self.conn.call(&req, v).await
    }

    async fn heartbeat(&mut self, group: &str, generation: i32, member: &str, instance: Option<&str>) -> i16 {
        let v = self.version::<HeartbeatRequest>(3, 4);
        let req = HeartbeatRequest::default()
            .with_group_id(gid(group))
            .with_generation_id(generation)
            .with_member_id(s(member))
            .with_group_instance_id(instance.map(s));
        self.conn.call(&req, v).await.error_code
    }

    /// LeaveGroup (batch form) for one member: (top-level error, member error).
    async fn leave(&mut self, group: &str, member: &str, instance: Option<&str>) -> (i16, Option<i16>) {
        let v = self.version::<LeaveGroupRequest>(3, 5);
        let req = LeaveGroupRequest::default().with_group_id(gid(group)).with_members(vec![MemberIdentity::default()
            .with_member_id(s(member))
            .with_group_instance_id(instance.map(s))]);
        let resp = self.conn.call(&req, v).await;
        (resp.error_code, resp.members.first().map(|m| m.error_code))
    }

    /// OffsetCommit for one topic; returns partition → error code.
    async fn commit(
        &mut self,
        group: &str,
        generation: i32,
        member: &str,
        instance: Option<&str>,
        topic: &str,
        offsets: &[(i32, i64, Option<&str>)],
    ) -> BTreeMap<i32, i16> {
        let v = self.version::<OffsetCommitRequest>(7, 8);
        let partitions = offsets
            .iter()
            .map(|(p, o, m)| {
                OffsetCommitRequestPartition::default()
                    .with_partition_index(*p)
                    .with_committed_offset(*o)
                    .with_committed_leader_epoch(-1)
                    .with_committed_metadata(m.map(s))
            })
            .collect();
        let req = OffsetCommitRequest::default()
            .with_group_id(gid(group))
            .with_generation_id_or_member_epoch(generation)
            .with_member_id(s(member))
            .with_group_instance_id(instance.map(s))
            .with_topics(vec![OffsetCommitRequestTopic::default().with_name(tname(topic)).with_partitions(partitions)]);
        let resp = self.conn.call(&req, v).await;
        let mut out = BTreeMap::new();
        for t in &resp.topics {
            assert_eq!(t.name.0.as_str(), topic);
            for p in &t.partitions {
                out.insert(p.partition_index, p.error_code);
            }
        }
        assert_eq!(out.len(), offsets.len(), "one result per committed partition: {out:?}");
        out
    }

    /// OffsetFetch (single-group form, v≤7): (group error, partition → committed).
    async fn fetch_offsets_once(
        &mut self,
        group: &str,
        topic: &str,
        partitions: &[i32],
    ) -> (i16, BTreeMap<i32, Committed>) {
        let v = self.version::<OffsetFetchRequest>(1, 7);
        let req = OffsetFetchRequest::default().with_group_id(gid(group)).with_topics(Some(vec![
            OffsetFetchRequestTopic::default().with_name(tname(topic)).with_partition_indexes(partitions.to_vec()),
        ]));
        let resp = self.conn.call(&req, v).await;
        let mut out = BTreeMap::new();
        for t in &resp.topics {
            for p in &t.partitions {
                out.insert(
                    p.partition_index,
                    Committed {
                        offset: p.committed_offset,
                        metadata: p.metadata.as_ref().map(|m| m.to_string()),
                        error: p.error_code,
                    },
                );
            }
        }
        (resp.error_code, out)
    }

    /// OffsetFetch, retrying (bounded) while the coordinator is loading.
    async fn fetch_offsets(&mut self, group: &str, topic: &str, partitions: &[i32]) -> BTreeMap<i32, Committed> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (err, out) = self.fetch_offsets_once(group, topic, partitions).await;
            let loading = |e: i16| e == COORDINATOR_LOAD_IN_PROGRESS || e == COORDINATOR_NOT_AVAILABLE;
            if loading(err) || out.values().any(|c| loading(c.error)) {
                assert!(Instant::now() < deadline, "OffsetFetch {group}: coordinator still loading after 30s");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            assert_eq!(err, NONE, "OffsetFetch {group}: group error");
            for (p, c) in &out {
                assert_eq!(c.error, NONE, "OffsetFetch {group} {topic}-{p}: partition error");
            }
            assert_eq!(out.len(), partitions.len(), "OffsetFetch {group}: one result per partition: {out:?}");
            return out;
        }
    }

    /// partition → committed offset (-1 when none).
    async fn committed(&mut self, group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
        let ps: Vec<i32> = (0..partitions).collect();
        self.fetch_offsets(group, topic, &ps).await.into_iter().map(|(p, c)| (p, c.offset)).collect()
    }

    async fn describe(&mut self, group: &str) -> DescribedGroup {
        let v = self.version::<DescribeGroupsRequest>(4, 6);
        let req = DescribeGroupsRequest::default().with_groups(vec![gid(group)]);
        let mut resp = self.conn.call(&req, v).await;
        assert_eq!(resp.groups.len(), 1, "DescribeGroups: one result");
        let g = resp.groups.remove(0);
        assert_eq!(g.group_id.0.as_str(), group);
        g
    }

    async fn delete_groups(&mut self, groups: &[&str]) -> BTreeMap<String, i16> {
        let v = self.version::<DeleteGroupsRequest>(0, 2);
        let req = DeleteGroupsRequest::default().with_groups_names(groups.iter().map(|g| gid(g)).collect());
        let resp = self.conn.call(&req, v).await;
        resp.results.iter().map(|r| (r.group_id.0.to_string(), r.error_code)).collect()
    }
}

/// Polls DescribeGroups until `pred` holds (bounded); returns that description.
async fn describe_until(
    raw: &mut RawGroup,
    group: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&DescribedGroup) -> bool,
) -> DescribedGroup {
    let deadline = Instant::now() + timeout;
    loop {
        let g = raw.describe(group).await;
        if pred(&g) {
            return g;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}; last: {g:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls OffsetFetch until the committed offsets equal `want` (bounded).
async fn committed_until(raw: &mut RawGroup, group: &str, topic: &str, want: &BTreeMap<i32, i64>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let got = raw.committed(group, topic, want.len() as i32).await;
        if &got == want {
            return;
        }
        assert!(Instant::now() < deadline, "committed offsets after {timeout:?}: {got:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn join_request(group: &str, member: &str, instance: Option<&str>, session_ms: i32, topic: &str) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(gid(group))
        .with_session_timeout_ms(session_ms)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(s(member))
        .with_group_instance_id(instance.map(s))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(subscription(topic))])
}

/// A dynamic raw member through the KIP-394 round trip: MEMBER_ID_REQUIRED,
/// then a join with the given id. Returns (member id, join response).
async fn join_dynamic(raw: &mut RawGroup, group: &str, session_ms: i32, topic: &str) -> (String, JoinGroupResponse) {
    let first = raw.join(group, "", None, session_ms, topic).await;
    assert_eq!(first.error_code, MEMBER_ID_REQUIRED, "JoinGroup with an empty member id (v4+)");
    let member = first.member_id.to_string();
    assert!(!member.is_empty(), "MEMBER_ID_REQUIRED carries the member id to use");
    let second = raw.join(group, &member, None, session_ms, topic).await;
    (member, second)
}

// ---------------------------------------------------------------------------
// Test 1: three members, one killed without leaving
// ---------------------------------------------------------------------------

const CHILD_ENV: &str = "STRAND_GROUP_CHILD_BOOTSTRAP";

/// Not a test on its own: the body of the consumer that test 1 runs in a child
/// process (this test binary re-executed with `STRAND_GROUP_CHILD_BOOTSTRAP`
/// set) so that it can be killed with SIGKILL and never send LeaveGroup. It
/// processes `STRAND_GROUP_CHILD_PARK_AFTER` records (committing them), then
/// "parks": keeps polling (so it takes part in rebalances and heartbeats) but
/// processes and commits nothing more. It prints `CHILD R p o` per processed
/// record (before committing it), `CHILD A p,p,..` per assignment,
/// `CHILD V` per revocation and `CHILD PARKED`.
#[test]
fn group_child_consumer() {
    let Ok(bootstrap) = std::env::var(CHILD_ENV) else { return };
    let group = std::env::var("STRAND_GROUP_CHILD_GROUP").expect("group");
    let topic = std::env::var("STRAND_GROUP_CHILD_TOPIC").expect("topic");
    let park_after: usize = std::env::var("STRAND_GROUP_CHILD_PARK_AFTER").expect("park").parse().unwrap();

    struct ChildCtx;
    impl ClientContext for ChildCtx {}
    impl ConsumerContext for ChildCtx {
        fn pre_rebalance(&self, _c: &BaseConsumer<Self>, r: &Rebalance<'_>) {
            if let Rebalance::Revoke(_) = r {
                println!("CHILD V");
            }
        }
        fn post_rebalance(&self, _c: &BaseConsumer<Self>, r: &Rebalance<'_>) {
            if let Rebalance::Assign(tpl) = r {
                let ps: Vec<String> = tpl.elements().iter().map(|e| e.partition().to_string()).collect();
                println!("CHILD A {}", ps.join(","));
            }
        }
    }
    let consumer: BaseConsumer<ChildCtx> =
        member_config(&bootstrap, &group, "child", 3000).create_with_context(ChildCtx).expect("child consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut processed = 0usize;
    let mut pending: BTreeMap<i32, i64> = BTreeMap::new();
    loop {
        let msg = consumer.poll(Duration::from_millis(100));
        if processed >= park_after {
            continue; // parked: poll only, to heartbeat and follow rebalances
        }
        let Some(Ok(m)) = msg else { continue };
        println!("CHILD R {} {}", m.partition(), m.offset());
        pending.insert(m.partition(), m.offset() + 1);
        processed += 1;
        if processed.is_multiple_of(100) || processed >= park_after {
            let mut tpl = TopicPartitionList::new();
            for (p, o) in &pending {
                tpl.add_partition_offset(&topic, *p, Offset::Offset(*o)).unwrap();
            }
            consumer.commit(&tpl, CommitMode::Sync).expect("child commit");
            pending.clear();
        }
        if processed >= park_after {
            println!("CHILD PARKED");
        }
    }
}

/// What the parent learned from the child's stdout.
#[derive(Default)]
struct ChildView {
    processed: HashSet<(i32, i64)>,
    assigned: Option<BTreeSet<i32>>,
    last_assign: Option<Instant>,
    parked: bool,
}

fn spawn_child(bootstrap: &str, group: &str, topic: &str, park_after: usize) -> (Child, Arc<Mutex<ChildView>>) {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = Command::new(exe)
        .args(["group_child_consumer", "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, bootstrap)
        .env("STRAND_GROUP_CHILD_GROUP", group)
        .env("STRAND_GROUP_CHILD_TOPIC", topic)
        .env("STRAND_GROUP_CHILD_PARK_AFTER", park_after.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child consumer");
    let view = Arc::new(Mutex::new(ChildView::default()));
    let (v, out) = (view.clone(), child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let Some(rest) = line.strip_prefix("CHILD ") else { continue };
            let mut v = v.lock().unwrap();
            let mut words = rest.split(' ');
            match words.next() {
                Some("R") => {
                    let p = words.next().and_then(|w| w.parse().ok());
                    let o = words.next().and_then(|w| w.parse().ok());
                    if let (Some(p), Some(o)) = (p, o) {
                        v.processed.insert((p, o));
                    }
                }
                Some("A") => {
                    let ps = words.next().unwrap_or("");
                    v.assigned = Some(ps.split(',').filter(|w| !w.is_empty()).map(|w| w.parse().unwrap()).collect());
                    v.last_assign = Some(Instant::now());
                }
                Some("V") => v.assigned = Some(BTreeSet::new()),
                Some("PARKED") => v.parked = true,
                _ => {}
            }
        }
    });
    (child, view)
}

/// Goal: three librdkafka consumers share a 6-partition topic holding 60k
/// keyed records; one of them dies without leaving the group; once its
/// session expires its partitions move to the two others, every record is
/// processed at least once and the committed offsets end at the log end of
/// every partition.
/// Method: the doomed member runs in a child process; it joins first, gets all
/// six partitions, processes and commits 1000 records, then only polls (stays
/// a member, processes nothing), so when the two in-process members join it
/// keeps two partitions full of uncommitted records. It is then killed with
/// SIGKILL (no LeaveGroup). Members commit synchronously after processing.
/// Prints the time a 3-member group takes to rebalance when a member joins
/// and when one dies (from the kill, so it includes the 3 s session timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_one_dies_without_leaving() {
    const TOPIC: &str = "g3";
    const GROUP: &str = "g3-group";
    const RECORDS: usize = 60_000;
    const SESSION_MS: u32 = 3000;
    let broker = start_broker(GROUP_OVERRIDES).await;
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, TOPIC, 6, &[]).await;
    let delivered = produce_keyed_async(&bootstrap, TOPIC, RECORDS).await;
    let ends = log_ends(&bootstrap, TOPIC, 6).await;
    assert_eq!(ends.values().sum::<i64>(), RECORDS as i64, "log end offsets {ends:?}");

    let (mut child, view) = spawn_child(&bootstrap, GROUP, TOPIC, 1000);
    wait_for(
        "the child member to process 1000 records and park",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || {
            let parked = view.lock().unwrap().parked;
            async move { parked.then_some(()) }
        },
    )
    .await;

    let seen: Seen = Arc::default();
    let a =
        Member::spawn(member_config(&bootstrap, GROUP, "member-a", SESSION_MS), TOPIC, seen.clone(), delivered.clone());
    let child_assigned = || view.lock().unwrap().assigned.clone();
    wait_assignment(
        "child + a to share 6 partitions",
        &[&a.state],
        &[&child_assigned],
        None,
        6,
        Duration::from_secs(60),
    )
    .await;

    // The third member joins: measure until all three hold new assignments.
    let t_join = Instant::now();
    let b =
        Member::spawn(member_config(&bootstrap, GROUP, "member-b", SESSION_MS), TOPIC, seen.clone(), delivered.clone());
    let child_assigned_since = || {
        let v = view.lock().unwrap();
        (v.last_assign? > t_join).then(|| v.assigned.clone()).flatten()
    };
    let sets = wait_assignment(
        "3 members to share 6 partitions after the third joined",
        &[&a.state, &b.state],
        &[&child_assigned_since],
        Some(t_join),
        6,
        Duration::from_secs(60),
    )
    .await;
    let join_time = t_join.elapsed();
    let child_parts = sets[2].clone();
    println!("rebalance on join (3 members): {join_time:?}; a {:?}, b {:?}, child {:?}", sets[0], sets[1], child_parts);
    assert!(!child_parts.is_empty(), "the child owns partitions when it dies");

    // Its partitions hold uncommitted records: it processed at most 1000 of 60k.
    let t_kill = Instant::now();
    child.kill().expect("SIGKILL the child member");
    child.wait().expect("reap the child");
    let sets = wait_assignment(
        "the 2 survivors to take over all 6 partitions",
        &[&a.state, &b.state],
        &[],
        Some(t_kill),
        6,
        Duration::from_secs(60),
    )
    .await;
    let death_time = t_kill.elapsed();
    println!(
        "rebalance after a member died (session.timeout.ms={SESSION_MS}): {death_time:?} from SIGKILL \
         (~{:?} after the session expired); a {:?}, b {:?}",
        death_time.saturating_sub(Duration::from_millis(SESSION_MS as u64)),
        sets[0],
        sets[1]
    );

    // Everything processed at least once and committed up to the log end.
    let mut raw = RawGroup::connect(broker.addr()).await;
    let all: HashSet<(i32, i64)> = delivered.keys().copied().collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let missing = {
            let seen = seen.lock().unwrap();
            let child_seen = &view.lock().unwrap().processed;
            all.iter().filter(|po| !seen.contains_key(po) && !child_seen.contains(po)).count()
        };
        let committed = raw.committed(GROUP, TOPIC, 6).await;
        let done = missing == 0 && committed == ends;
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 120s: {missing} records never processed; committed {committed:?}, log ends {ends:?}\n{}\n{}",
            a.state.summary("a"),
            b.state.summary("b")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (sa, sb) = (a.stop(), b.stop());
    println!("{}\n{}", sa.summary("a"), sb.summary("b"));
    for st in [&sa, &sb] {
        let errs = st.consumer_errors.lock().unwrap();
        assert!(
            errs.iter().all(|e| !e.contains("acknowledged")),
            "a record came back with another key than acknowledged: {:?}",
            errs.iter().find(|e| e.contains("acknowledged"))
        );
    }
    // The dead member's partitions were processed by the survivors after the kill.
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    for p in &child_parts {
        assert!(seen.contains_key(&(*p, ends[p] - 1)), "the last record of partition {p} processed by a survivor");
    }
    let dupes = seen.values().filter(|n| **n > 1).count();
    println!("records processed more than once by survivors: {dupes}");
    assert_eq!(raw.committed(GROUP, TOPIC, 6).await, ends, "committed offsets = log end after the members left");
}

// ---------------------------------------------------------------------------
// Test 2: committed offsets across a broker restart
// ---------------------------------------------------------------------------

/// One consumer of `group` that processes records (asserting with `check`)
/// and commits synchronously every 1000 records, until `done` says so; then
/// commits what it processed and closes. Returns the committed offsets.
fn run_single_member(
    config: ClientConfig,
    topic: &str,
    mut on_record: impl FnMut(i32, i64, &str),
    mut done: impl FnMut() -> bool,
) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer = config.create().expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let mut since = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let commit = |next: &BTreeMap<i32, i64>| {
        let mut tpl = TopicPartitionList::new();
        for (p, o) in next {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*o)).unwrap();
        }
        consumer.commit(&tpl, CommitMode::Sync)
    };
    while !done() {
        assert!(Instant::now() < deadline, "single member: not done within 120s; positions {next:?}");
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(m)) => {
                let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
                on_record(m.partition(), m.offset(), &key);
                next.insert(m.partition(), m.offset() + 1);
                since += 1;
                if since >= 1000 {
                    commit(&next).expect("periodic commit");
                    since = 0;
                }
            }
            Some(Err(e)) => println!("consumer error (tolerated): {e}"),
        }
    }
    commit(&next).expect("final commit");
    drop(consumer); // close: LeaveGroup
    next
}

/// Goal: a group resumes exactly at its committed offsets after a broker
/// restart: nothing below them is read again, nothing is skipped, every
/// remaining record is seen.
/// Method: 60k keyed records in 6 partitions; a consumer processes exactly
/// 30k of them committing synchronously, commits, closes; the broker shuts
/// down and restarts on the same directory; OffsetFetch shows the same
/// offsets; a new consumer of the group must start each partition exactly at
/// its committed offset (or 0) and read every following record in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_resumes_at_committed_offsets_after_restart() {
    const TOPIC: &str = "resume";
    const GROUP: &str = "resume-group";
    const RECORDS: usize = 60_000;
    let broker = start_broker(GROUP_OVERRIDES).await;
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, TOPIC, 6, &[]).await;
    let delivered = produce_keyed_async(&bootstrap, TOPIC, RECORDS).await;
    let ends = log_ends(&bootstrap, TOPIC, 6).await;

    let mut config = member_config(&bootstrap, GROUP, "resume-1", 6000);
    // Small fetches interleave the partitions, so run 1 stops in the middle of several.
    config.set("max.partition.fetch.bytes", "4096");
    let d = delivered.clone();
    let (committed, first_run) = tokio::task::spawn_blocking(move || {
        let mut seen: HashSet<(i32, i64)> = HashSet::new();
        let count = std::cell::Cell::new(0usize);
        let committed = run_single_member(
            config,
            TOPIC,
            |p, o, key| {
                assert_eq!(Some(key.to_string()), d.get(&(p, o)).map(|i| record_key(*i)), "key at {p}@{o}");
                assert!(seen.insert((p, o)), "run 1 read {p}@{o} twice");
                count.set(count.get() + 1);
            },
            || count.get() >= RECORDS / 2,
        );
        (committed, seen)
    })
    .await
    .expect("run 1");
    assert_eq!(first_run.len(), RECORDS / 2);
    println!("run 1 committed {committed:?} (log ends {ends:?})");

    let mut raw = RawGroup::connect(broker.addr()).await;
    let expected: BTreeMap<i32, i64> = (0..6).map(|p| (p, committed.get(&p).copied().unwrap_or(-1))).collect();
    assert_eq!(raw.committed(GROUP, TOPIC, 6).await, expected, "OffsetFetch before the restart");
    drop(raw);

    let dir = broker.shutdown().await;
    let t = Instant::now();
    let broker = start_broker_in(dir, GROUP_OVERRIDES).await;
    let bootstrap = broker.bootstrap();
    let mut raw = RawGroup::connect(broker.addr()).await;
    assert_eq!(raw.committed(GROUP, TOPIC, 6).await, expected, "OffsetFetch after the restart");
    println!("restart to committed offsets readable: {:?}", t.elapsed());
    assert_eq!(log_ends(&bootstrap, TOPIC, 6).await, ends, "log ends unchanged by the restart");

    let config = member_config(&bootstrap, GROUP, "resume-2", 6000);
    let (d, ends2, start) = (delivered.clone(), ends.clone(), expected.clone());
    let second_run = tokio::task::spawn_blocking(move || {
        let next: Mutex<BTreeMap<i32, i64>> = Mutex::new(start.iter().map(|(p, o)| (*p, (*o).max(0))).collect());
        let mut seen = HashSet::new();
        run_single_member(
            config,
            TOPIC,
            |p, o, key| {
                let mut next = next.lock().unwrap();
                let want = next[&p];
                assert!(o >= start[&p], "run 2 re-read {p}@{o}, below the committed offset {}", start[&p]);
                assert_eq!(o, want, "run 2 on partition {p}: expected offset {want} (nothing skipped), got {o}");
                assert_eq!(Some(key.to_string()), d.get(&(p, o)).map(|i| record_key(*i)), "key at {p}@{o}");
                next.insert(p, o + 1);
                seen.insert((p, o));
            },
            || {
                let next = next.lock().unwrap();
                next.iter().all(|(p, o)| *o >= ends2[p])
            },
        );
        seen
    })
    .await
    .expect("run 2");
    assert!(first_run.is_disjoint(&second_run), "no record read by both runs");
    assert_eq!(first_run.len() + second_run.len(), RECORDS, "every record read by one of the runs");
    assert_eq!(raw.committed(GROUP, TOPIC, 6).await, ends, "committed = log end after run 2");
}

// ---------------------------------------------------------------------------
// Test 3: static membership
// ---------------------------------------------------------------------------

fn static_config(bootstrap: &str, group: &str, instance: &str) -> ClientConfig {
    let mut c = member_config(bootstrap, group, instance, 10_000);
    c.set("group.instance.id", instance);
    c
}

fn member_by_instance<'a>(g: &'a DescribedGroup, instance: &str) -> &'a describe_groups_response::DescribedGroupMember {
    g.members
        .iter()
        .find(|m| m.group_instance_id.as_ref().map(|i| i.as_str()) == Some(instance))
        .unwrap_or_else(|| panic!("no member with instance id {instance} in {g:?}"))
}

/// Goal (KIP-345): a static member closed and restarted with the same
/// `group.instance.id` within its session timeout gets the same partitions
/// and the other member sees no rebalance, whether the restarted member is
/// the group leader or a follower.
/// Method: two librdkafka consumers with instance ids static-a/static-b and a
/// 10 s session; a joins first and alone, so it leads. a's consumer is closed
/// (static members send no LeaveGroup) and a new one with the same instance
/// id started; then the same for b. Rebalance callbacks are counted;
/// DescribeGroups shows the membership before and after. The "no rebalance"
/// check watches the other member's callbacks for 3 s (ten heartbeats).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_member_restart_keeps_partitions_without_rebalance() {
    const TOPIC: &str = "static";
    const GROUP: &str = "static-group";
    let broker = start_broker(GROUP_OVERRIDES).await;
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, TOPIC, 4, &[]).await;
    let delivered = produce_keyed_async(&bootstrap, TOPIC, 400).await;

    let seen: Seen = Arc::default();
    let a = Member::spawn(static_config(&bootstrap, GROUP, "static-a"), TOPIC, seen.clone(), delivered.clone());
    wait_assignment("static-a alone owns 4 partitions", &[&a.state], &[], None, 4, Duration::from_secs(60)).await;
    let b = Member::spawn(static_config(&bootstrap, GROUP, "static-b"), TOPIC, seen.clone(), delivered.clone());
    let t = Instant::now();
    let sets = wait_assignment(
        "two static members share 4 partitions",
        &[&a.state, &b.state],
        &[],
        Some(t),
        4,
        Duration::from_secs(60),
    )
    .await;
    println!("static members: a {:?}, b {:?}", sets[0], sets[1]);
    let mut raw = RawGroup::connect(broker.addr()).await;
    let g = describe_until(&mut raw, GROUP, "a Stable group of 2", Duration::from_secs(30), |g| {
        g.group_state.as_str() == "Stable" && g.members.len() == 2
    })
    .await;
    let _ = g;

    let (a, b) = restart_static_member(
        &mut raw, &bootstrap, GROUP, TOPIC, a, b, "static-a", "static-b", "leader", &seen, &delivered,
    )
    .await;
    let (b, a) = restart_static_member(
        &mut raw, &bootstrap, GROUP, TOPIC, b, a, "static-b", "static-a", "follower", &seen, &delivered,
    )
    .await;
    a.stop();
    b.stop();
}

/// Closes `member` (static, instance id `instance`) and starts it again;
/// checks it gets its partitions back and that `other` sees no rebalance.
/// Returns (the restarted member, other).
#[allow(clippy::too_many_arguments)]
async fn restart_static_member(
    raw: &mut RawGroup,
    bootstrap: &str,
    group: &str,
    topic: &str,
    member: Member,
    other: Member,
    instance: &str,
    other_instance: &str,
    role: &str,
    seen: &Seen,
    delivered: &Arc<HashMap<(i32, i64), usize>>,
) -> (Member, Member) {
    let before = raw.describe(group).await;
    assert_eq!((before.group_state.as_str(), before.members.len()), ("Stable", 2), "{before:?}");
    let member_id_before = member_by_instance(&before, instance).member_id.to_string();
    let other_id_before = member_by_instance(&before, other_instance).member_id.to_string();
    let parts = member.state.assigned();
    let other_counts = (other.state.assigns.load(Ordering::SeqCst), other.state.revokes.load(Ordering::SeqCst));

    // Close: no LeaveGroup, so the group keeps the member until its session expires.
    let t_close = Instant::now();
    member.stop();
    let g = raw.describe(group).await;
    assert_eq!(g.members.len(), 2, "a closed static member ({role}) stays in the group: {g:?}");

    let restarted = Member::spawn(static_config(bootstrap, group, instance), topic, seen.clone(), delivered.clone());
    let deadline = Instant::now() + Duration::from_secs(20);
    while restarted.state.assigns.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the restarted static {role} ({instance}) got no assignment within 20s\n{}\n{}",
            restarted.state.summary(instance),
            other.state.summary(other_instance)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let restart = t_close.elapsed();
    println!("static {role} closed and back with an assignment in {restart:?}");
    assert!(
        restart < Duration::from_secs(10),
        "the restart fits in the session timeout (else the test proves nothing)"
    );
    assert_eq!(restarted.state.assigned(), parts, "the restarted static {role} gets its old partitions");

    // Observation window: the other member sees no revoke/assign.
    let window_end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < window_end {
        assert_eq!(
            (other.state.assigns.load(Ordering::SeqCst), other.state.revokes.load(Ordering::SeqCst)),
            other_counts,
            "the other static member went through a rebalance when the {role} restarted\n{}",
            other.state.summary(other_instance)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(restarted.state.revokes.load(Ordering::SeqCst), 0, "the restarted {role} was not revoked");
    assert_eq!(restarted.state.assigns.load(Ordering::SeqCst), 1, "the restarted {role} was assigned once");
    let after = raw.describe(group).await;
    assert_eq!(after.group_state.as_str(), "Stable");
    assert_eq!(after.members.len(), 2, "{after:?}");
    assert_eq!(member_by_instance(&after, other_instance).member_id.to_string(), other_id_before, "other keeps its id");
    assert_ne!(
        member_by_instance(&after, instance).member_id.to_string(),
        member_id_before,
        "the rejoined static {role} got a new member id"
    );
    let assignment = decode_assignment(&member_by_instance(&after, instance).member_assignment);
    assert_eq!(
        assignment,
        parts.iter().map(|p| (topic.to_string(), *p)).collect(),
        "DescribeGroups shows the {role}'s old assignment"
    );
    (restarted, other)
}

/// Goal (KIP-345): a second member joining with an instance id already in use
/// replaces the first; the old member id is then fenced with
/// FENCED_INSTANCE_ID (82) on Heartbeat, SyncGroup, OffsetCommit, JoinGroup
/// and LeaveGroup, and its commit changes nothing; the new member keeps the
/// old assignment.
/// Method: raw requests for one static member, then a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_static_instance_is_fenced() {
    const TOPIC: &str = "fence";
    const GROUP: &str = "fence-group";
    const INST: Option<&str> = Some("inst-1");
    let broker = start_broker(GROUP_OVERRIDES).await;
    create_topic(&broker.bootstrap(), TOPIC, 2, &[]).await;
    let mut raw = RawGroup::connect(broker.addr()).await;
    let (err, node, host, port) = raw.find_coordinator(GROUP).await;
    assert_eq!(err, NONE, "FindCoordinator");
    assert_eq!(
        (node, host, port),
        (1, "127.0.0.1".to_string(), broker.addr().port() as i32),
        "coordinator is this broker"
    );

    let j1 = raw.join(GROUP, "", INST, 10_000, TOPIC).await;
    assert_eq!(j1.error_code, NONE, "a static member joins without the MEMBER_ID_REQUIRED round trip");
    let (m1, gen) = (j1.member_id.to_string(), j1.generation_id);
    assert_eq!(j1.leader.as_str(), m1, "the only member leads");
    let assignment = assignment_bytes(TOPIC, &[0, 1]);
    let s1 = raw.sync(GROUP, gen, &m1, INST, vec![(m1.clone(), assignment.clone())]).await;
    assert_eq!(s1.error_code, NONE, "SyncGroup");
    assert_eq!(s1.assignment, assignment, "the leader's assignment is relayed");
    assert_eq!(raw.heartbeat(GROUP, gen, &m1, INST).await, NONE);
    let c = raw.commit(GROUP, gen, &m1, INST, TOPIC, &[(0, 7, Some("m1"))]).await;
    assert_eq!(c[&0], NONE, "commit by the static member");

    // The duplicate: same instance id, empty member id, at JoinGroup v5 (what
    // librdkafka sends). Before v9 Kafka answers the replaced leader as a
    // follower: the leader id stays the old one, no member list, so the client
    // does not recompute an assignment (KIP-814 keeps this for v<9).
    let mut raw2 = RawGroup::connect(broker.addr()).await;
    let j2 = raw2.join_at(5, GROUP, "", INST, 10_000, TOPIC).await;
    assert_eq!(j2.error_code, NONE, "a duplicate static member replaces the old one");
    let m2 = j2.member_id.to_string();
    assert_ne!(m2, m1, "the replacement gets a new member id");
    assert_eq!(j2.generation_id, gen, "a static rejoin of a Stable group does not start a new generation");
    assert_eq!(j2.leader.as_str(), m1, "JoinGroup v5: a replaced static leader is answered with the old leader id");
    assert!(j2.members.is_empty(), "JoinGroup v5: no member list for a replaced static leader");

    assert_eq!(raw.heartbeat(GROUP, gen, &m1, INST).await, FENCED_INSTANCE_ID, "Heartbeat with the old member id");
    let s = raw.sync(GROUP, gen, &m1, INST, vec![]).await;
    assert_eq!(s.error_code, FENCED_INSTANCE_ID, "SyncGroup with the old member id");
    let c = raw.commit(GROUP, gen, &m1, INST, TOPIC, &[(0, 9, Some("m1-late"))]).await;
    assert_eq!(c[&0], FENCED_INSTANCE_ID, "OffsetCommit with the old member id");
    let f = raw.fetch_offsets(GROUP, TOPIC, &[0]).await;
    assert_eq!((f[&0].offset, f[&0].metadata.as_deref()), (7, Some("m1")), "the fenced commit changed nothing");
    let j = raw.join(GROUP, &m1, INST, 10_000, TOPIC).await;
    assert_eq!(j.error_code, FENCED_INSTANCE_ID, "JoinGroup with the old member id");
    let (top, member) = raw.leave(GROUP, &m1, INST).await;
    assert_eq!(top, NONE, "LeaveGroup top-level error");
    assert_eq!(member, Some(FENCED_INSTANCE_ID), "LeaveGroup of the old member id");

    // At v9 (KIP-814) the replacement is told it leads and must skip the assignment.
    let (mut raw2, m2, j2) = if raw2.advertises(ApiKey::JoinGroup, 9) {
        let mut raw3 = RawGroup::connect(broker.addr()).await;
        let j3 = raw3.join_at(9, GROUP, "", INST, 10_000, TOPIC).await;
        assert_eq!(j3.error_code, NONE, "a second replacement at v9");
        let m3 = j3.member_id.to_string();
        assert_eq!(j3.generation_id, gen);
        assert_eq!(j3.leader.as_str(), m3, "JoinGroup v9: the replacement is the leader");
        assert!(j3.skip_assignment, "JoinGroup v9: the replaced static leader skips the assignment");
        assert_eq!(j3.members.len(), 1, "JoinGroup v9: the leader gets the member list");
        assert_eq!(raw2.heartbeat(GROUP, gen, &m2, INST).await, FENCED_INSTANCE_ID, "the v5 replacement is fenced now");
        (raw3, m3, j3)
    } else {
        (raw2, m2, j2)
    };
    // The new member carries on with the old assignment.
    let s2 = raw2.sync(GROUP, j2.generation_id, &m2, INST, vec![]).await;
    assert_eq!(s2.error_code, NONE, "SyncGroup of the replacement");
    assert_eq!(s2.assignment, assignment, "the replacement gets the old member's assignment");
    assert_eq!(raw2.heartbeat(GROUP, j2.generation_id, &m2, INST).await, NONE);
    let c = raw2.commit(GROUP, j2.generation_id, &m2, INST, TOPIC, &[(0, 9, Some("m2"))]).await;
    assert_eq!(c[&0], NONE, "commit by the replacement");
    let f = raw2.fetch_offsets(GROUP, TOPIC, &[0]).await;
    assert_eq!((f[&0].offset, f[&0].metadata.as_deref()), (9, Some("m2")));
    let g = raw2.describe(GROUP).await;
    assert_eq!(g.members.len(), 1, "one member after the replacement: {g:?}");
    assert_eq!(g.members[0].member_id.as_str(), m2);
}

// ---------------------------------------------------------------------------
// Test 4: bad input
// ---------------------------------------------------------------------------

/// Goal: bad group requests get Kafka's error codes and change nothing; other
/// groups are untouched. OffsetCommit with a stale generation →
/// ILLEGAL_GENERATION (22), unknown member → UNKNOWN_MEMBER_ID (25), metadata
/// over offset.metadata.max.bytes (4096) → OFFSET_METADATA_TOO_LARGE (12) for
/// that partition only; JoinGroup v4+ with an empty member id →
/// MEMBER_ID_REQUIRED (79) with an id; a session timeout outside
/// [group.min, group.max] → INVALID_SESSION_TIMEOUT (26); DeleteGroups of an
/// active group → NON_EMPTY_GROUP (68), of an unknown group →
/// GROUP_ID_NOT_FOUND (69); Heartbeat while a rebalance is in progress →
/// REBALANCE_IN_PROGRESS (27).
/// Method: raw requests; a bystander group with offsets committed by a
/// standalone (generation -1) commit is checked at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_group_requests_get_kafka_errors_and_change_nothing() {
    const TOPIC: &str = "bad";
    const GROUP: &str = "bad-group";
    const BYSTANDER: &str = "bystander-group";
    let broker = start_broker(GROUP_OVERRIDES).await;
    create_topic(&broker.bootstrap(), TOPIC, 3, &[]).await;
    let mut raw = RawGroup::connect(broker.addr()).await;

    // A bystander: offsets committed outside any generation (standalone consumer).
    let c = raw.commit(BYSTANDER, -1, "", None, TOPIC, &[(0, 11, Some("keep")), (1, 12, Some("keep"))]).await;
    assert_eq!(c.values().copied().collect::<Vec<_>>(), vec![NONE, NONE], "standalone commit");
    let bystander = raw.fetch_offsets(BYSTANDER, TOPIC, &[0, 1, 2]).await;

    // KIP-394 and generation 1.
    let (m, j) = join_dynamic(&mut raw, GROUP, 30_000, TOPIC).await;
    assert_eq!(j.error_code, NONE, "join with the member id from MEMBER_ID_REQUIRED");
    assert_eq!(j.leader.as_str(), m);
    let gen1 = j.generation_id;
    let assignment = assignment_bytes(TOPIC, &[0, 1, 2]);
    assert_eq!(raw.sync(GROUP, gen1, &m, None, vec![(m.clone(), assignment.clone())]).await.error_code, NONE);
    let c = raw.commit(GROUP, gen1, &m, None, TOPIC, &[(0, 100, Some("first"))]).await;
    assert_eq!(c[&0], NONE);

    // The leader rejoins: generation 2.
    let j = raw.join(GROUP, &m, None, 30_000, TOPIC).await;
    assert_eq!(j.error_code, NONE);
    let gen2 = j.generation_id;
    assert!(gen2 > gen1, "a rejoin starts a new generation ({gen1} → {gen2})");
    assert_eq!(raw.sync(GROUP, gen2, &m, None, vec![(m.clone(), assignment.clone())]).await.error_code, NONE);

    let unchanged = |f: &BTreeMap<i32, Committed>, what: &str| {
        assert_eq!((f[&0].offset, f[&0].metadata.as_deref()), (100, Some("first")), "{what} changed partition 0");
    };
    // Stale generation.
    let c = raw.commit(GROUP, gen1, &m, None, TOPIC, &[(0, 200, None)]).await;
    assert_eq!(c[&0], ILLEGAL_GENERATION, "commit with generation {gen1} in generation {gen2}");
    unchanged(&raw.fetch_offsets(GROUP, TOPIC, &[0]).await, "a stale-generation commit");
    // Unknown member.
    let c = raw.commit(GROUP, gen2, "no-such-member", None, TOPIC, &[(0, 300, None)]).await;
    assert_eq!(c[&0], UNKNOWN_MEMBER_ID, "commit by an unknown member");
    unchanged(&raw.fetch_offsets(GROUP, TOPIC, &[0]).await, "an unknown member's commit");
    assert_eq!(
        raw.heartbeat(GROUP, gen2, "no-such-member", None).await,
        UNKNOWN_MEMBER_ID,
        "heartbeat, unknown member"
    );
    // Oversized metadata: that partition fails, the others (4096 bytes is the limit, inclusive) commit.
    let big = "x".repeat(4097);
    let limit = "y".repeat(4096);
    let c = raw
        .commit(GROUP, gen2, &m, None, TOPIC, &[(0, 400, Some(&big)), (1, 401, Some("ok")), (2, 402, Some(&limit))])
        .await;
    assert_eq!(c[&0], OFFSET_METADATA_TOO_LARGE, "4097 bytes of metadata");
    assert_eq!(c[&1], NONE, "a valid partition in the same request");
    assert_eq!(c[&2], NONE, "exactly offset.metadata.max.bytes of metadata");
    let f = raw.fetch_offsets(GROUP, TOPIC, &[0, 1, 2]).await;
    unchanged(&f, "an oversized-metadata commit");
    assert_eq!((f[&1].offset, f[&2].offset), (401, 402));
    assert_eq!(f[&2].metadata.as_deref(), Some(limit.as_str()));

    // Session timeouts outside [group.min.session.timeout.ms=1000, group.max.session.timeout.ms=1800000].
    for (member, session) in [("", 500), (m.as_str(), 500), ("", 1_800_001)] {
        let j = raw.join(GROUP, member, None, session, TOPIC).await;
        assert_eq!(j.error_code, INVALID_SESSION_TIMEOUT, "JoinGroup with session {session} ms, member {member:?}");
    }
    assert_eq!(raw.heartbeat(GROUP, gen2, &m, None).await, NONE, "the member is unaffected by the refused joins");

    // DeleteGroups: active group and unknown group.
    let d = raw.delete_groups(&[GROUP, "no-such-group"]).await;
    assert_eq!(d[GROUP], NON_EMPTY_GROUP, "DeleteGroups of a group with members");
    assert_eq!(d["no-such-group"], GROUP_ID_NOT_FOUND, "DeleteGroups of an unknown group");
    unchanged(&raw.fetch_offsets(GROUP, TOPIC, &[0]).await, "a refused DeleteGroups");

    // A second member's join starts a rebalance; the first member's heartbeat learns of it.
    let mut raw2 = RawGroup::connect(broker.addr()).await;
    let first = raw2.join(GROUP, "", None, 30_000, TOPIC).await;
    assert_eq!(first.error_code, MEMBER_ID_REQUIRED);
    let m2 = first.member_id.to_string();
    let pending_join = tokio::spawn(async move {
        let j = raw2.join(GROUP, &m2, None, 30_000, TOPIC).await;
        (raw2, m2, j)
    });
    describe_until(&mut raw, GROUP, "PreparingRebalance", Duration::from_secs(10), |g| {
        g.group_state.as_str() == "PreparingRebalance"
    })
    .await;
    assert_eq!(raw.heartbeat(GROUP, gen2, &m, None).await, REBALANCE_IN_PROGRESS, "heartbeat during a rebalance");
    let j = raw.join(GROUP, &m, None, 30_000, TOPIC).await;
    assert_eq!(j.error_code, NONE, "the first member rejoins");
    let (mut raw2, m2, j2) = tokio::time::timeout(Duration::from_secs(10), pending_join)
        .await
        .expect("the second member's join completes once all members rejoined")
        .expect("join task");
    assert_eq!(j2.error_code, NONE, "second member's join");
    let gen3 = j.generation_id;
    assert_eq!(j2.generation_id, gen3, "both members in the same generation");
    assert!(gen3 > gen2);
    let leader_members = if j.leader.as_str() == m { &j.members } else { &j2.members };
    assert_eq!(leader_members.len(), 2, "the leader sees both members");
    let c = raw.commit(GROUP, gen2, &m, None, TOPIC, &[(0, 500, None)]).await;
    assert_eq!(c[&0], ILLEGAL_GENERATION, "a commit from the previous generation during CompletingRebalance");
    let c = raw.commit(GROUP, gen3, &m, None, TOPIC, &[(0, 501, None)]).await;
    assert_eq!(c[&0], REBALANCE_IN_PROGRESS, "a commit of the new generation before SyncGroup (CompletingRebalance)");
    unchanged(&raw.fetch_offsets(GROUP, TOPIC, &[0]).await, "commits during CompletingRebalance");
    // Finish the rebalance so the group is Stable again.
    let leader_is_m = j.leader.as_str() == m;
    let (lead, follow) = if leader_is_m { (&mut raw, &mut raw2) } else { (&mut raw2, &mut raw) };
    let (lead_id, follow_id) = if leader_is_m { (m.clone(), m2.clone()) } else { (m2.clone(), m.clone()) };
    let follower_sync = tokio::join!(
        lead.sync(
            GROUP,
            gen3,
            &lead_id,
            None,
            vec![
                (lead_id.clone(), assignment_bytes(TOPIC, &[0, 1])),
                (follow_id.clone(), assignment_bytes(TOPIC, &[2]))
            ]
        ),
        follow.sync(GROUP, gen3, &follow_id, None, vec![])
    );
    assert_eq!(follower_sync.0.error_code, NONE, "leader sync");
    assert_eq!(follower_sync.1.error_code, NONE, "follower sync");
    assert_eq!(decode_assignment(&follower_sync.1.assignment), [(TOPIC.to_string(), 2)].into_iter().collect());

    // The bystander is untouched by all of this.
    assert_eq!(raw.fetch_offsets(BYSTANDER, TOPIC, &[0, 1, 2]).await, bystander, "bystander offsets");
    let g = raw.describe(BYSTANDER).await;
    assert_eq!((g.error_code, g.group_state.as_str(), g.members.len()), (NONE, "Empty", 0), "bystander: {g:?}");

    // OffsetFetch v8+ (several groups in one request), if advertised.
    if raw.advertises(ApiKey::OffsetFetch, 8) {
        let v = raw.version::<OffsetFetchRequest>(8, 9);
        let group = |g: &str| {
            OffsetFetchRequestGroup::default().with_group_id(gid(g)).with_topics(Some(vec![
                OffsetFetchRequestTopics::default().with_name(tname(TOPIC)).with_partition_indexes(vec![0, 1]),
            ]))
        };
        let req = OffsetFetchRequest::default().with_groups(vec![group(GROUP), group(BYSTANDER)]);
        let resp = raw.conn.call(&req, v).await;
        let got: BTreeMap<String, Vec<i64>> = resp
            .groups
            .iter()
            .map(|g| {
                assert_eq!(g.error_code, NONE, "group {}", g.group_id.0);
                (
                    g.group_id.0.to_string(),
                    g.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.committed_offset)).collect(),
                )
            })
            .collect();
        assert_eq!(got[GROUP], vec![100, 401], "multi-group OffsetFetch v{v}: {GROUP}");
        assert_eq!(got[BYSTANDER], vec![11, 12], "multi-group OffsetFetch v{v}: {BYSTANDER}");
    } else {
        println!("OffsetFetch v8+ not advertised: multi-group form not tested");
    }
}

// ---------------------------------------------------------------------------
// Test 5: ListGroups, DescribeGroups, DeleteGroups through librdkafka
// ---------------------------------------------------------------------------

/// An owned copy of what librdkafka's `fetch_group_list` reports for a group.
#[derive(Debug)]
struct GroupView {
    name: String,
    state: String,
    protocol: String,
    protocol_type: String,
    /// (member id, client id, metadata, assignment)
    members: Vec<(String, String, Vec<u8>, Vec<u8>)>,
}

fn group_list_blocking(bootstrap: &str, group: Option<&str>) -> Vec<GroupView> {
    let c: BaseConsumer = base_config(bootstrap).create().expect("client");
    let list = c.fetch_group_list(group, Duration::from_secs(10)).expect("fetch_group_list");
    list.groups()
        .iter()
        .map(|g| GroupView {
            name: g.name().to_string(),
            state: g.state().to_string(),
            protocol: g.protocol().to_string(),
            protocol_type: g.protocol_type().to_string(),
            members: g
                .members()
                .iter()
                .map(|m| {
                    (
                        m.id().to_string(),
                        m.client_id().to_string(),
                        m.metadata().unwrap_or_default().to_vec(),
                        m.assignment().unwrap_or_default().to_vec(),
                    )
                })
                .collect(),
        })
        .collect()
}

async fn group_list(bootstrap: &str, group: Option<&str>) -> Vec<GroupView> {
    let (b, g) = (bootstrap.to_string(), group.map(|g| g.to_string()));
    tokio::task::spawn_blocking(move || group_list_blocking(&b, g.as_deref())).await.expect("group list thread")
}

/// Goal: ListGroups/DescribeGroups through librdkafka show an active group as
/// Stable, protocol type "consumer", its members with their assignments;
/// DeleteGroups through the AdminClient refuses an active group, removes an
/// empty one with its committed offsets, and reports an unknown one.
/// Method: two librdkafka members consume 300 records and commit; the admin
/// calls run before and after both close (LeaveGroup).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_lists_describes_and_deletes_groups() {
    const TOPIC: &str = "admin-t";
    const GROUP: &str = "admin-group";
    let broker = start_broker(GROUP_OVERRIDES).await;
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, TOPIC, 3, &[]).await;
    let delivered = produce_keyed_async(&bootstrap, TOPIC, 300).await;
    let ends = log_ends(&bootstrap, TOPIC, 3).await;

    let seen: Seen = Arc::default();
    let a = Member::spawn(member_config(&bootstrap, GROUP, "admin-a", 6000), TOPIC, seen.clone(), delivered.clone());
    let b = Member::spawn(member_config(&bootstrap, GROUP, "admin-b", 6000), TOPIC, seen.clone(), delivered.clone());
    wait_assignment("two members share 3 partitions", &[&a.state, &b.state], &[], None, 3, Duration::from_secs(60))
        .await;
    let mut raw = RawGroup::connect(broker.addr()).await;
    committed_until(&mut raw, GROUP, TOPIC, &ends, Duration::from_secs(60)).await;

    let deadline = Instant::now() + Duration::from_secs(30);
    let g = loop {
        let list = group_list(&bootstrap, Some(GROUP)).await;
        if let Some(g) = list.into_iter().find(|g| g.name == GROUP && g.state == "Stable" && g.members.len() == 2) {
            break g;
        }
        assert!(Instant::now() < deadline, "librdkafka's DescribeGroups never showed a Stable group of 2");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(g.protocol_type, "consumer", "{g:?}");
    assert!(["range", "roundrobin"].contains(&g.protocol.as_str()), "protocol {:?}", g.protocol);
    let clients: BTreeSet<&str> = g.members.iter().map(|m| m.1.as_str()).collect();
    assert_eq!(clients, ["admin-a", "admin-b"].into_iter().collect());
    let mut assigned = BTreeSet::new();
    for (id, client, metadata, assignment) in &g.members {
        assert!(!id.is_empty(), "member id");
        assert!(!metadata.is_empty(), "member {id} metadata");
        let parts = decode_assignment(assignment);
        assert!(!parts.is_empty(), "member {client} has partitions");
        assert!(parts.iter().all(|(_, p)| assigned.insert(*p)), "assignments overlap");
    }
    assert_eq!(assigned, (0..3).collect(), "the members' assignments cover the topic");
    // ListGroups without a filter includes the group.
    let all = group_list(&bootstrap, None).await;
    assert!(all.iter().any(|g| g.name == GROUP), "ListGroups includes {GROUP}: {all:?}");

    let admin: AdminClient<DefaultClientContext> = admin_config(&bootstrap).create().expect("admin");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let r = admin.delete_groups(&[GROUP], &opts).await.expect("DeleteGroups request");
    assert_eq!(r, vec![Err((GROUP.to_string(), RDKafkaErrorCode::NonEmptyGroup))], "deleting an active group");
    assert_eq!(raw.committed(GROUP, TOPIC, 3).await, ends, "a refused delete keeps the offsets");

    a.stop();
    b.stop();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = group_list(&bootstrap, Some(GROUP)).await;
        if list.iter().any(|g| g.name == GROUP && g.state == "Empty" && g.members.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "the group is not Empty after both members left: {list:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = admin.delete_groups(&[GROUP], &opts).await.expect("DeleteGroups request");
    assert_eq!(r, vec![Ok(GROUP.to_string())], "deleting an empty group");
    assert_eq!(raw.committed(GROUP, TOPIC, 3).await, (0..3).map(|p| (p, -1)).collect(), "offsets gone with the group");
    let r = admin.delete_groups(&[GROUP], &opts).await.expect("DeleteGroups request");
    assert_eq!(r, vec![Err((GROUP.to_string(), RDKafkaErrorCode::GroupIdNotFound))], "deleting it again");
    let all = group_list(&bootstrap, None).await;
    assert!(!all.iter().any(|g| g.name == GROUP && g.state != "Dead"), "ListGroups after delete: {all:?}");
}
