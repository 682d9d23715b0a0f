//! Replication with real processes: three `strand` nodes, a topic with
//! three replicas and min.insync.replicas=2, an idempotent librdkafka
//! producer (acks=all) writing all the time, and one fault after another:
//! kill -9 of the leader of every partition in turn, then of the active
//! controller; a node frozen (SIGSTOP) and thawed; a rolling restart. After
//! each, every acknowledged record is read back at its offset, none twice,
//! in order per partition, and once everything is back every replica's log
//! holds the same batches (base offset and CRC) as the leader's.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::child_cluster::ChildCluster;
use common::until;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};

const READY: Duration = Duration::from_secs(30);
const PARTITIONS: i32 = 3;
const TOPIC: &str = "kept";

/// (partition, offset) -> value of every acknowledged record.
type Acked = Arc<Mutex<BTreeMap<(i32, i64), String>>>;

/// (leader, isr) per partition, as node `from` answers Metadata.
async fn partitions(cluster: &ChildCluster, from: i32) -> Result<BTreeMap<i32, (i32, Vec<i32>)>, String> {
    let md = cluster.metadata(from, Some(&[TOPIC])).await?;
    let t = md.topics.first().ok_or("no topic")?;
    Ok(t.partitions
        .iter()
        .map(|p| (p.partition_index, (p.leader_id.0, p.isr_nodes.iter().map(|b| b.0).collect())))
        .collect())
}

/// Writes `p{partition}-{n}` values to every partition, a window of sends in
/// flight, until `stop`; records what was acknowledged.
async fn produce_until(bootstrap: String, acked: Acked, stop: Arc<AtomicBool>, extra: &[(&str, &str)]) -> usize {
    let mut config = common::producer_config(&bootstrap);
    for (k, v) in extra {
        config.set(*k, *v);
    }
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "120000")
        .set("linger.ms", "2");
    let producer: FutureProducer = config.create().expect("producer");
    let mut n = 0u64;
    let mut failed = 0;
    while !stop.load(Ordering::Relaxed) {
        let mut window = Vec::new();
        for p in 0..PARTITIONS {
            for _ in 0..20 {
                let value = format!("p{p}-{n:08}");
                n += 1;
                let record = FutureRecord::<(), str>::to(TOPIC).partition(p).payload(&value);
                match producer.send_result(record) {
                    Ok(delivery) => window.push((value, delivery)),
                    Err((e, _)) => panic!("enqueue: {e}"),
                }
            }
        }
        for (value, delivery) in window {
            match delivery.await.expect("delivery") {
                Ok(d) => {
                    let previous = acked.lock().unwrap().insert((d.partition, d.offset), value);
                    assert!(previous.is_none(), "two acknowledged values at {}@{}", d.partition, d.offset);
                }
                Err(_) => failed += 1,
            }
        }
    }
    failed
}

/// (base offset, CRC) of every batch in a partition directory's segments.
fn batches(dir: &Path) -> Vec<(i64, u32)> {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    let mut out = Vec::new();
    for log in logs {
        let bytes = std::fs::read(&log).unwrap();
        let mut at = 0;
        while at + 21 <= bytes.len() {
            let base = i64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
            let len = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
            if at + 12 + len > bytes.len() {
                break;
            }
            let crc = u32::from_be_bytes(bytes[at + 17..at + 21].try_into().unwrap());
            out.push((base, crc));
            at += 12 + len;
        }
    }
    out
}

/// A three-node cluster (`extra` lines for every node) with topic
/// [`TOPIC`]: three replicas, min.insync.replicas=2, every ISR full.
async fn cluster_with_topic(extra: &[&str]) -> ChildCluster {
    let cluster = ChildCluster::start(3, extra, READY).await;
    let admin: AdminClient<DefaultClientContext> = common::admin_config(&cluster.bootstrap(1)).create().unwrap();
    let topic = NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(3)).set("min.insync.replicas", "2");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    admin.create_topics([&topic], &opts).await.unwrap().into_iter().for_each(|r| {
        r.expect("created");
    });
    until("a full ISR everywhere", READY, || async {
        partitions(&cluster, 1).await.is_ok_and(|m| m.len() == 3 && m.values().all(|(l, isr)| *l > 0 && isr.len() == 3))
    })
    .await;
    cluster
}

/// Every acknowledged record of `acked` is read back at its offset, no value
/// twice, values in order per partition; then every replica's log holds the
/// same batches (base offset and CRC). Every node must be running.
async fn everything_acknowledged_is_kept(cluster: &ChildCluster, acked: &BTreeMap<(i32, i64), String>) {
    until("a full ISR everywhere again", READY, || async {
        partitions(cluster, 1).await.is_ok_and(|m| m.values().all(|(l, isr)| *l > 0 && isr.len() == 3))
    })
    .await;
    for p in 0..PARTITIONS {
        let expected: Vec<(i64, String)> =
            acked.range((p, i64::MIN)..=(p, i64::MAX)).map(|((_, o), v)| (*o, v.clone())).collect();
        let last = expected.last().map_or(0, |(o, _)| *o);
        let got = common::consume(&cluster.bootstrap(1), TOPIC, p, 0, last as usize + 1, Duration::from_secs(60)).await;
        let by_offset: BTreeMap<i64, String> =
            got.iter().map(|(o, v)| (*o, String::from_utf8(v.clone()).unwrap())).collect();
        for (offset, value) in &expected {
            assert_eq!(by_offset.get(offset), Some(value), "acknowledged {TOPIC}-{p}@{offset} lost");
        }
        let values: Vec<&String> = by_offset.values().collect();
        let mut sorted = values.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(values.len(), sorted.len(), "partition {p}: a value written twice");
        assert!(values == sorted, "partition {p}: values out of order");
        // Every replica's batches, compared by base offset and CRC.
        let dirs: Vec<_> = (1..=3).map(|id| cluster.node(id).log_dir().join(format!("{TOPIC}-{p}"))).collect();
        until("replicas to converge", READY, || {
            let lists: Vec<Vec<(i64, u32)>> = dirs.iter().map(|d| batches(d)).collect();
            async move { lists.windows(2).all(|w| w[0] == w[1]) }
        })
        .await;
    }
}

/// Goal: kill -9 of each partition's leader in turn, and of the active
/// controller, under an idempotent acks=all producer loses no acknowledged
/// record, duplicates none, keeps order, and leaves identical replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_every_leader_loses_nothing_acknowledged() {
    let mut cluster = cluster_with_topic(&[]).await;
    let bootstrap = cluster.bootstrap(1);
    let acked: Acked = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(produce_until(bootstrap.clone(), acked.clone(), stop.clone(), &[]));
    let count = || acked.lock().unwrap().len();
    let mut failovers = Vec::new();
    let mut victims = Vec::new();
    for p in 0..PARTITIONS {
        let before = count();
        until("records acknowledged", READY, || async { count() >= before + 300 }).await;
        let from = cluster.running()[0];
        let leader = partitions(&cluster, from).await.unwrap()[&p].0;
        victims.push(leader);
        cluster.kill(leader);
        let killed = Instant::now();
        let at_kill = count();
        // A new acknowledgement on the partition: its new leader took the write.
        let survivor = cluster.running()[0];
        until("a new leader", READY, || async {
            partitions(&cluster, survivor).await.is_ok_and(|m| m[&p].0 > 0 && m[&p].0 != leader)
        })
        .await;
        until("writes acknowledged after the kill", READY, || async { count() > at_kill + 60 }).await;
        failovers.push(killed.elapsed());
        cluster.restart(&[leader]).await;
        until("the killed node back in every ISR", READY, || async {
            partitions(&cluster, survivor).await.is_ok_and(|m| m.values().all(|(_, isr)| isr.len() == 3))
        })
        .await;
    }
    // The active controller.
    let controller = cluster.wait_ready(READY).await;
    let at_kill = count();
    cluster.kill(controller);
    until("writes acknowledged after the controller's kill", READY, || async { count() > at_kill + 300 }).await;
    cluster.restart(&[controller]).await;
    cluster.wait_ready(READY).await;
    stop.store(true, Ordering::Relaxed);
    let failed = producer.await.expect("producer task");
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "replication figures: {} acknowledged, {failed} not, kill -9 of leaders {victims:?} to the next acknowledgement: {:?}",
        acked.len(),
        failovers
    );

    everything_acknowledged_is_kept(&cluster, &acked).await;
}

/// Goal: a node frozen with SIGSTOP (a long GC pause, a hung VM) leaves
/// every ISR, by lag where it follows and by its session expiring where it
/// leads, while writes go on being acknowledged by the other two; thawed,
/// it finds itself fenced, truncates whatever it appended as a stale leader,
/// catches up and rejoins every ISR, and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_node_leaves_every_isr_and_rejoins_when_thawed() {
    let mut cluster = cluster_with_topic(&["replica.lag.time.max.ms=2000"]).await;
    let controller = cluster.wait_ready(READY).await;
    // The frozen node is not the active controller: this test is about the
    // ISR, the kill -9 test covers losing the controller.
    let frozen = (1..=3).find(|id| *id != controller).unwrap();
    let witness = controller;
    let acked: Acked = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    // Requests stuck on the frozen node give up after 5 s, not 30.
    let producer = tokio::spawn(produce_until(
        cluster.bootstrap(witness),
        acked.clone(),
        stop.clone(),
        &[("request.timeout.ms", "5000")],
    ));
    let count = || acked.lock().unwrap().len();
    until("records acknowledged", READY, || async { count() >= 300 }).await;
    let led: Vec<i32> = partitions(&cluster, witness)
        .await
        .unwrap()
        .iter()
        .filter(|(_, (l, _))| *l == frozen)
        .map(|(p, _)| *p)
        .collect();
    cluster.pause(frozen);
    let paused = Instant::now();
    let out = until("the frozen node out of every ISR, leading nothing", READY, || async {
        partitions(&cluster, witness)
            .await
            .is_ok_and(|m| m.values().all(|(l, isr)| *l != frozen && *l > 0 && !isr.contains(&frozen)))
    })
    .await;
    let at_out = count();
    until("writes acknowledged without the frozen node", READY, || async { count() > at_out + 300 }).await;
    let acknowledging = paused.elapsed();
    cluster.resume(frozen);
    let thawed = Instant::now();
    until("the thawed node back in every ISR", READY, || async {
        partitions(&cluster, witness).await.is_ok_and(|m| m.values().all(|(_, isr)| isr.contains(&frozen)))
    })
    .await;
    let rejoined = thawed.elapsed();
    let at_back = count();
    until("writes acknowledged after the thaw", READY, || async { count() > at_back + 300 }).await;
    stop.store(true, Ordering::Relaxed);
    let failed = producer.await.expect("producer task");
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "replication figures: node {frozen} (leading partitions {led:?}) frozen: out of every ISR after {out:?}, \
         writes acknowledged by the others {acknowledging:?} after the freeze, back in every ISR {rejoined:?} after \
         the thaw; {} acknowledged, {failed} not",
        acked.len()
    );
    everything_acknowledged_is_kept(&cluster, &acked).await;
}

/// Goal: a rolling restart (SIGTERM, start again, wait for a full ISR; node
/// after node) under an idempotent acks=all producer fails no write,
/// loses no acknowledged record and leaves identical replicas: each
/// node's controlled shutdown moves its leadership away first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_under_load_fails_and_loses_nothing() {
    let mut cluster = cluster_with_topic(&[]).await;
    let acked: Acked = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn(produce_until(cluster.bootstrap(1), acked.clone(), stop.clone(), &[]));
    let count = || acked.lock().unwrap().len();
    let mut rounds = Vec::new();
    for id in 1..=3 {
        let before = count();
        until("records acknowledged", READY, || async { count() >= before + 300 }).await;
        let started = Instant::now();
        cluster.terminate(id);
        let at_stop = count();
        until("writes acknowledged while a node is down", READY, || async { count() > at_stop + 100 }).await;
        cluster.restart(&[id]).await;
        let witness = (1..=3).find(|other| *other != id).unwrap();
        until("the restarted node back in every ISR", READY, || async {
            partitions(&cluster, witness).await.is_ok_and(|m| m.values().all(|(l, isr)| *l > 0 && isr.len() == 3))
        })
        .await;
        rounds.push(started.elapsed());
    }
    let before = count();
    until("records acknowledged after the last restart", READY, || async { count() >= before + 300 }).await;
    stop.store(true, Ordering::Relaxed);
    let failed = producer.await.expect("producer task");
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "replication figures: rolling restart, SIGTERM to full ISR per node {rounds:?}; {} acknowledged, {failed} not",
        acked.len()
    );
    assert_eq!(failed, 0, "a write failed during the rolling restart");
    everything_acknowledged_is_kept(&cluster, &acked).await;
}
