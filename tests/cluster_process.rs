//! Three real `strand` processes as a cluster of combined broker+controller
//! nodes, used through librdkafka bootstrapped from one node only: a topic
//! spread over all three takes acks=all writes and reads them back; a
//! broker killed with -9 is fenced after its session timeout (its
//! partitions then have no leader) and on restart leads them again with
//! every acknowledged value; the active controller killed with -9 is
//! replaced and the survivors commit a CreateTopics; all three killed and
//! restarted keep their topics, data and cluster id. The figures printed
//! ("cluster figures: ...") are for docs/BENCHMARKS.md.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::child_cluster::ChildCluster;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};

const SESSION_TIMEOUT_MS: u64 = 3000;
const READY: Duration = Duration::from_secs(20);
const PARTITIONS: i32 = 6;
const PER_PARTITION: usize = 50;

/// (partition, offset) -> value, for every acknowledged record of a topic.
type Acked = BTreeMap<(i32, i64), Vec<u8>>;

async fn create_topic(bootstrap: &str, name: &str, partitions: i32) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = common::admin_config(bootstrap).create().expect("admin client");
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin.create_topics([&topic], &opts).await.map_err(|e| e.to_string())?;
    results.into_iter().next().unwrap().map(|_| ()).map_err(|(_, e)| format!("{e:?}"))
}

/// Produces `per_partition` values to every partition (acks=all) through a
/// producer bootstrapped from one node; returns what was acknowledged.
async fn produce(bootstrap: &str, topic: &str, partitions: i32, per_partition: usize, tag: &str) -> Acked {
    let producer: FutureProducer = common::producer_config(bootstrap).create().expect("producer");
    let mut pending = Vec::new();
    for p in 0..partitions {
        for i in 0..per_partition {
            let value = format!("{tag}-{topic}-{p}-{i}").into_bytes();
            let record = FutureRecord::<(), [u8]>::to(topic).partition(p).payload(&value);
            let delivery = producer.send_result(record).map_err(|(e, _)| e).expect("enqueue");
            pending.push((value, delivery));
        }
    }
    let mut acked = Acked::new();
    for (value, delivery) in pending {
        let d = delivery.await.expect("delivery").unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));
        acked.insert((d.partition, d.offset), value);
    }
    acked
}

/// Reads every partition of `topic` back from offset 0 (assigned consumers
/// bootstrapped from one node) and checks every acknowledged value is at its
/// offset.
async fn verify(bootstrap: &str, topic: &str, partitions: i32, acked: &Acked) {
    for p in 0..partitions {
        let expected: Vec<(&i64, &Vec<u8>)> =
            acked.range((p, i64::MIN)..=(p, i64::MAX)).map(|((_, o), v)| (o, v)).collect();
        let Some((last, _)) = expected.last() else { continue };
        let got = common::consume(bootstrap, topic, p, 0, **last as usize + 1, Duration::from_secs(20)).await;
        let by_offset: BTreeMap<i64, &Vec<u8>> = got.iter().map(|(o, v)| (*o, v)).collect();
        for (offset, value) in expected {
            assert_eq!(by_offset.get(offset), Some(&value), "acknowledged {topic}-{p}@{offset}");
        }
    }
}

/// Leader of every partition of `topic` as node `from` answers Metadata.
async fn leaders(cluster: &ChildCluster, from: i32, topic: &str) -> Result<BTreeMap<i32, i32>, String> {
    let md = cluster.metadata(from, Some(&[topic])).await?;
    let t = md.topics.first().ok_or("no topic in the response")?;
    Ok(t.partitions.iter().map(|p| (p.partition_index, p.leader_id.0)).collect())
}

use common::until;

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_crash_fail_over_and_restart() {
    let started = Instant::now();
    let session = format!("broker.session.timeout.ms={SESSION_TIMEOUT_MS}");
    let mut cluster = ChildCluster::start(3, &[&session], READY).await;
    let startup = started.elapsed();
    let rss: Vec<String> = [1, 2, 3].iter().map(|id| mib(cluster.rss_kib(*id))).collect();
    let boot = cluster.bootstrap(1);
    let first = cluster.metadata(1, Some(&[])).await.expect("Metadata");
    let cluster_id = first.cluster_id.as_ref().map(|c| c.to_string()).expect("a cluster id");
    assert!(!cluster_id.is_empty());

    // a. Six partitions over the three brokers; acks=all to each; all read back.
    create_topic(&boot, "spread", PARTITIONS).await.expect("create spread");
    let mut acked = produce(&boot, "spread", PARTITIONS, PER_PARTITION, "a").await;
    assert_eq!(acked.len(), PARTITIONS as usize * PER_PARTITION);
    verify(&boot, "spread", PARTITIONS, &acked).await;
    let placement = leaders(&cluster, 2, "spread").await.unwrap();
    assert_eq!(placement.values().copied().collect::<BTreeSet<_>>(), BTreeSet::from([1, 2, 3]), "{placement:?}");

    // b. kill -9 of a broker that is not the active controller: fenced after
    // its session timeout, its partitions leaderless; back on restart.
    let controller = cluster.wait_ready(READY).await;
    let victim = [1, 2, 3].into_iter().find(|b| *b != controller).unwrap();
    let survivor = [1, 2, 3].into_iter().find(|b| *b != victim).unwrap();
    let victims: Vec<i32> = placement.iter().filter(|(_, l)| **l == victim).map(|(p, _)| *p).collect();
    assert!(!victims.is_empty());
    cluster.kill(victim);
    let (c, victims_ref) = (&cluster, &victims);
    let fencing =
        until("the killed broker to be fenced", Duration::from_millis(SESSION_TIMEOUT_MS + 7000), || async move {
            let Ok(md) = c.metadata(survivor, Some(&["spread"])).await else { return false };
            let gone = md.brokers.iter().all(|b| b.node_id.0 != victim);
            let offline = md.topics[0]
                .partitions
                .iter()
                .filter(|p| victims_ref.contains(&p.partition_index))
                .all(|p| p.leader_id.0 == -1);
            gone && offline
        })
        .await;
    // The survivors' own partitions stay led while it is gone.
    let during = leaders(&cluster, survivor, "spread").await.unwrap();
    for (p, leader) in &placement {
        if *leader != victim {
            assert_eq!(during[p], *leader, "partition {p} of a survivor");
        }
    }
    let restarted = Instant::now();
    cluster.restart(&[victim]).await;
    cluster.wait_ready(READY).await;
    let (c, victims_ref) = (&cluster, &victims);
    until("the restarted broker to lead its partitions again", READY, || async move {
        let seen_by_survivor = leaders(c, survivor, "spread").await;
        let seen_by_itself = leaders(c, victim, "spread").await;
        [seen_by_survivor, seen_by_itself]
            .iter()
            .all(|l| l.as_ref().is_ok_and(|l| victims_ref.iter().all(|p| l.get(p) == Some(&victim))))
    })
    .await;
    let rejoin = restarted.elapsed();
    verify(&cluster.bootstrap(victim), "spread", PARTITIONS, &acked).await;

    // c. kill -9 of the active controller: the survivors elect another and
    // commit a CreateTopics.
    let controller = cluster.wait_ready(READY).await;
    let survivors: Vec<i32> = [1, 2, 3].into_iter().filter(|b| *b != controller).collect();
    cluster.kill(controller);
    let killed = Instant::now();
    let (c, survivors_ref) = (&cluster, &survivors);
    let new_controller = until("the survivors to agree on a new controller", READY, || async move {
        let mut seen = BTreeSet::new();
        for s in survivors_ref {
            match c.metadata(*s, Some(&[])).await {
                Ok(md) => seen.insert(md.controller_id.0),
                Err(_) => return false,
            };
        }
        seen.len() == 1 && seen.iter().all(|id| survivors_ref.contains(id))
    })
    .await;
    let mut attempts = 0;
    until("a CreateTopics through a survivor to commit", READY, || {
        attempts += 1;
        let bootstrap = cluster.bootstrap(survivors[0]);
        let retry = attempts > 1;
        async move {
            match create_topic(&bootstrap, "after-failover", 2).await {
                Ok(()) => true,
                // An earlier attempt timed out on the client but committed.
                Err(e) if retry && e.contains("TopicAlreadyExists") => true,
                Err(e) => {
                    eprintln!("CreateTopics after failover: {e}");
                    false
                }
            }
        }
    })
    .await;
    let failover = killed.elapsed();
    // The new controller committed the topic before the killed one's
    // session expired, so it may have placed a partition on it (as Kafka
    // would: a broker counts as alive until fenced): produce once it is back.
    cluster.restart(&[controller]).await;
    cluster.wait_ready(READY).await;
    let c = &cluster;
    until("every partition led again", READY, || async move {
        let spread = leaders(c, controller, "spread").await;
        let other = leaders(c, controller, "after-failover").await;
        spread.is_ok_and(|l| l.len() == 6 && l.values().all(|x| *x >= 0))
            && other.is_ok_and(|l| l.len() == 2 && l.values().all(|x| *x >= 0))
    })
    .await;
    let after = produce(&cluster.bootstrap(survivors[1]), "after-failover", 2, 10, "c").await;
    acked.extend(produce(&boot, "spread", PARTITIONS, 5, "c").await);

    // d. kill -9 of all three; restarted together they keep topics, data and cluster id.
    for id in [1, 2, 3] {
        cluster.kill(id);
    }
    let full = Instant::now();
    cluster.restart(&[1, 2, 3]).await;
    cluster.wait_ready(READY).await;
    let c = &cluster;
    until("every partition led after the full restart", READY, || async move {
        let spread = leaders(c, 3, "spread").await;
        let other = leaders(c, 3, "after-failover").await;
        [spread, other].iter().all(|l| l.as_ref().is_ok_and(|l| !l.is_empty() && l.values().all(|x| *x >= 0)))
    })
    .await;
    let full_restart = full.elapsed();
    let md = cluster.metadata(2, None).await.expect("Metadata");
    assert_eq!(md.cluster_id.as_ref().map(|c| c.to_string()), Some(cluster_id), "cluster id after the full restart");
    let names: BTreeSet<String> =
        md.topics.iter().filter(|t| !t.is_internal).filter_map(|t| t.name.as_ref().map(|n| n.0.to_string())).collect();
    assert_eq!(names, BTreeSet::from(["after-failover".to_string(), "spread".to_string()]));
    verify(&cluster.bootstrap(2), "spread", PARTITIONS, &acked).await;
    verify(&cluster.bootstrap(2), "after-failover", 2, &after).await;
    for id in [1, 2, 3] {
        cluster.terminate(id);
    }

    // e. Figures.
    println!(
        "cluster figures: start-up to all brokers unfenced {} ms, broker fencing {} ms (session timeout \
         {SESSION_TIMEOUT_MS} ms), restarted broker leading again {} ms, controller failover to a new controller \
         {} ms and to committed CreateTopics {} ms ({attempts} attempt(s)), full kill -9 restart to every partition \
         led {} ms, RSS per node {} MiB idle, test total {:.1} s",
        startup.as_millis(),
        fencing.as_millis(),
        rejoin.as_millis(),
        new_controller.as_millis(),
        failover.as_millis(),
        full_restart.as_millis(),
        rss.join("/"),
        started.elapsed().as_secs_f64()
    );
}

/// CreateTopics through one broker, answered once committed and applied
/// there: how long until the other two brokers' Metadata show the topic.
async fn propagation(cluster: &ChildCluster, name: &str, partitions: i32) -> (Duration, Duration) {
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::{CreateTopicsRequest, TopicName};
    let mut conn = common::RawConn::connect(cluster.node(1).addr()).await;
    let req = CreateTopicsRequest::default().with_timeout_ms(60_000).with_topics(vec![CreatableTopic::default()
        .with_name(TopicName(kafka_protocol::protocol::StrBytes::from_string(name.to_string())))
        .with_num_partitions(partitions)
        .with_replication_factor(1)]);
    let sent = Instant::now();
    let resp = conn.call(&req, 7).await;
    let created = sent.elapsed();
    assert_eq!(resp.topics[0].error_code, 0, "CreateTopics {name}: {:?}", resp.topics[0].error_message);
    let replied = Instant::now();
    for id in [2, 3] {
        loop {
            let md = cluster.metadata(id, Some(&[name])).await.expect("Metadata");
            let t = &md.topics[0];
            if t.error_code == 0
                && t.partitions.len() == partitions as usize
                && t.partitions.iter().all(|p| p.leader_id.0 >= 0)
            {
                break;
            }
            assert!(replied.elapsed() < Duration::from_secs(30), "{name} not on broker {id}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    (created, replied.elapsed())
}

/// Figures for docs/BENCHMARKS.md: metadata propagation (a committed topic
/// seen by every broker) and the time to create 1,000 partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metadata_propagation_and_a_thousand_partitions() {
    let mut cluster = ChildCluster::start(3, &[], READY).await;
    let mut lags = Vec::new();
    for i in 0..20 {
        let (_, lag) = propagation(&cluster, &format!("prop-{i}"), 1).await;
        lags.push(lag);
    }
    lags.sort();
    let sent_thousand = Instant::now();
    let (created, lag) = propagation(&cluster, "thousand", 1000).await;
    // Every partition is served: its leader lists offsets for it.
    let boot = cluster.bootstrap(2);
    let produced = produce(&boot, "thousand", 1000, 1, "t").await;
    let writable = sent_thousand.elapsed();
    assert_eq!(produced.len(), 1000);
    let rss: Vec<String> = [1, 2, 3].iter().map(|id| mib(cluster.rss_kib(*id))).collect();
    for id in [1, 2, 3] {
        cluster.terminate(id);
    }
    println!(
        "cluster figures: metadata propagation (CreateTopics answered on broker 1 to the topic in the other two \
         brokers' Metadata) median {} us, max {} us over {} topics; 1,000 partitions: CreateTopics answered in {} ms, \
         on every broker {} ms later, one record acknowledged by each partition's leader {} ms after the request; \
         RSS per node {} MiB with 1,000 partitions",
        lags[lags.len() / 2].as_micros(),
        lags[lags.len() - 1].as_micros(),
        lags.len(),
        created.as_millis(),
        lag.as_millis(),
        writable.as_millis(),
        rss.join("/"),
    );
}

/// Against a cluster started by hand with `config/cluster/run.sh`:
/// `cargo test --test cluster_process -- --ignored local_cluster_smoke`
/// (`STRAND_BOOTSTRAP` overrides 127.0.0.1:9092). Creates a topic of three
/// partitions unless it exists, produces to each and reads everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs config/cluster/run.sh running"]
async fn local_cluster_smoke() {
    let bootstrap = std::env::var("STRAND_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into());
    match create_topic(&bootstrap, "smoke", 3).await {
        Ok(()) => {}
        Err(e) if e.contains("TopicAlreadyExists") => {}
        Err(e) => panic!("create smoke: {e}"),
    }
    let acked = produce(&bootstrap, "smoke", 3, 10, "smoke").await;
    verify(&bootstrap, "smoke", 3, &acked).await;
    println!("local cluster: {} values produced to smoke and read back through {bootstrap}", acked.len());
}
